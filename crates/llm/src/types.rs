//! Request and response types, independent of the wire format.

use serde_json::{Value, json};

/// One chat-completion request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The conversation so far, oldest first.
    pub messages: Vec<Message>,
    /// Tools the model may call; the `tools` key is omitted from the request when empty.
    pub tools: Vec<ToolDefinition>,
    /// Sampling temperature; the server default is used when `None`.
    pub temperature: Option<f32>,
    /// The model must call one of the tools (`"tool_choice": "required"`
    /// on the OpenAI-compatible wire; Ollama's native API has no such
    /// switch). Ignored without tools.
    pub require_tool: bool,
}

/// A message of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Instructions for the model.
    System {
        /// Message text.
        content: String,
    },
    /// Input from the user.
    User {
        /// Message text.
        content: String,
        /// Images sent with the text (for models that take images).
        images: Vec<Image>,
    },
    /// A previous answer of the model, possibly with tool calls.
    Assistant {
        /// Text of the answer (may be empty when the model only called tools).
        content: String,
        /// Tool calls the model made in this turn.
        tool_calls: Vec<ToolCall>,
    },
    /// The result of a tool call.
    Tool {
        /// The [`ToolCall::id`] this message answers.
        tool_call_id: String,
        /// The tool's output.
        content: String,
    },
}

/// An image in a person's message: its media type (`image/png`,
/// `image/jpeg`, `image/gif` or `image/webp`) and its bytes, shared by the
/// copies of a conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    /// The media type.
    pub mime: String,
    /// The encoded image, as read from the file.
    pub data: std::sync::Arc<[u8]>,
}

impl Image {
    /// The image as base64 text, as the model servers take it.
    pub fn base64(&self) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(&self.data)
    }

    /// The image as a `data:` URL (OpenAI's `image_url`).
    pub fn data_url(&self) -> String {
        format!("data:{};base64,{}", self.mime, self.base64())
    }
}

/// A call of a tool requested by the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Identifier chosen by the server (or `call_<index>` when it sent none).
    pub id: String,
    /// Name of the tool.
    pub name: String,
    /// Arguments as raw JSON text, exactly as assembled from the stream (may be invalid JSON).
    pub arguments: String,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    /// Name of the tool.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON schema of the arguments object.
    pub parameters: Value,
}

/// An item of a [`crate::ChatStream`].
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A piece of answer text, yielded as soon as it arrives (never empty).
    TextDelta(String),
    /// The whole response; always the last item of a successful stream.
    Completed(Completion),
}

/// The assembled result of a streamed response.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The concatenation of all text deltas.
    pub text: String,
    /// Tool calls, ordered by their stream index.
    pub tool_calls: Vec<ToolCall>,
    /// Why the model stopped: "stop", "tool_calls", "length", ...
    pub finish_reason: String,
    /// Token accounting, when the server reported it.
    pub usage: Option<Usage>,
    /// The model that answered, as reported by the server (else the configured model).
    pub model: String,
}

/// Token accounting of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Sum of both, as reported by the server.
    pub total_tokens: u64,
    /// Of the prompt's tokens, those the server read from its prompt cache
    /// (0 when it does not say).
    pub cached_prompt_tokens: u64,
    /// Of the prompt's tokens, those the server wrote to its prompt cache
    /// (Anthropic; 0 when it does not say).
    pub cache_write_tokens: u64,
}

impl Usage {
    /// Both together (two calls' tokens as one).
    pub fn plus(self, other: Usage) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens + other.prompt_tokens,
            completion_tokens: self.completion_tokens + other.completion_tokens,
            total_tokens: self.total_tokens + other.total_tokens,
            cached_prompt_tokens: self.cached_prompt_tokens + other.cached_prompt_tokens,
            cache_write_tokens: self.cache_write_tokens + other.cache_write_tokens,
        }
    }
}

impl Message {
    /// Shorthand for [`Message::System`].
    pub fn system(content: impl Into<String>) -> Self {
        Message::System {
            content: content.into(),
        }
    }

    /// Shorthand for [`Message::User`].
    pub fn user(content: impl Into<String>) -> Self {
        Message::User {
            content: content.into(),
            images: Vec::new(),
        }
    }

    /// Shorthand for an [`Message::Assistant`] without tool calls.
    pub fn assistant(content: impl Into<String>) -> Self {
        Message::Assistant {
            content: content.into(),
            tool_calls: Vec::new(),
        }
    }

    /// Shorthand for [`Message::Tool`].
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message::Tool {
            tool_call_id: tool_call_id.into(),
            content: content.into(),
        }
    }

    /// The OpenAI wire representation of this message.
    pub fn to_wire(&self) -> Value {
        match self {
            Message::System { content } => json!({"role": "system", "content": content}),
            Message::User { content, images } if images.is_empty() => {
                json!({"role": "user", "content": content})
            }
            Message::User { content, images } => {
                json!({"role": "user", "content": openai_parts(content, images)})
            }
            Message::Assistant {
                content,
                tool_calls,
            } => {
                if tool_calls.is_empty() {
                    json!({"role": "assistant", "content": content})
                } else {
                    let calls: Vec<Value> = tool_calls.iter().map(ToolCall::to_wire).collect();
                    let content = if content.is_empty() {
                        Value::Null
                    } else {
                        Value::String(content.clone())
                    };
                    json!({"role": "assistant", "content": content, "tool_calls": calls})
                }
            }
            Message::Tool {
                tool_call_id,
                content,
            } => json!({"role": "tool", "tool_call_id": tool_call_id, "content": content}),
        }
    }
}

/// OpenAI's content parts for a text with images: the text, then each
/// image as a `data:` URL.
fn openai_parts(content: &str, images: &[Image]) -> Value {
    let mut parts = vec![json!({"type": "text", "text": content})];
    parts.extend(
        images
            .iter()
            .map(|image| json!({"type": "image_url", "image_url": {"url": image.data_url()}})),
    );
    Value::Array(parts)
}

impl ToolCall {
    /// The OpenAI wire representation of this call (empty arguments are sent as `{}`, which
    /// strict servers require).
    pub fn to_wire(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.wire_arguments()},
        })
    }

    /// The arguments as sent (`{}` for none).
    fn wire_arguments(&self) -> &str {
        if self.arguments.trim().is_empty() {
            "{}"
        } else {
            self.arguments.as_str()
        }
    }
}

impl ToolDefinition {
    /// The OpenAI wire representation of this tool.
    pub fn to_wire(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        })
    }
}

impl ChatRequest {
    /// A request with these messages, no tools and the default temperature.
    pub fn new(messages: Vec<Message>) -> Self {
        ChatRequest {
            messages,
            tools: Vec::new(),
            temperature: None,
            require_tool: false,
        }
    }

    /// The streaming request body sent to an OpenAI-compatible `{base_url}/chat/completions`
    /// (see [`ChatRequest::to_ollama_wire`] for Ollama's native API).
    pub fn to_wire(&self, model: &str) -> Value {
        let mut body = json!({
            "model": model,
            "messages": self.messages.iter().map(Message::to_wire).collect::<Vec<_>>(),
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Value::Object(map) = &mut body {
            if !self.tools.is_empty() {
                map.insert(
                    "tools".into(),
                    Value::Array(self.tools.iter().map(ToolDefinition::to_wire).collect()),
                );
            }
            if let Some(t) = self.temperature {
                map.insert("temperature".into(), json!(decimal(t)));
            }
            if self.require_tool && !self.tools.is_empty() {
                map.insert("tool_choice".into(), json!("required"));
            }
        }
        body
    }
}

impl ChatRequest {
    /// The bytes of [`ChatRequest::to_wire`], written straight from the
    /// messages: long histories are not copied into a JSON tree first.
    pub fn to_wire_bytes(&self, model: &str) -> serde_json::Result<Vec<u8>> {
        use serde::ser::{SerializeMap, Serializer};
        let mut out = Vec::with_capacity(256 + 128 * self.messages.len());
        let mut ser = serde_json::Serializer::new(&mut out);
        let mut map = ser.serialize_map(None)?;
        map.serialize_entry("messages", &WireMessages(&self.messages))?;
        map.serialize_entry("model", model)?;
        map.serialize_entry("stream", &true)?;
        map.serialize_entry("stream_options", &json!({"include_usage": true}))?;
        if let Some(t) = self.temperature {
            map.serialize_entry("temperature", &decimal(t))?;
        }
        if !self.tools.is_empty() {
            map.serialize_entry("tools", &WireTools(&self.tools))?;
            if self.require_tool {
                map.serialize_entry("tool_choice", "required")?;
            }
        }
        map.end()?;
        Ok(out)
    }
}

struct WireMessages<'a>(&'a [Message]);

impl serde::Serialize for WireMessages<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(WireMessage))
    }
}

struct WireMessage<'a>(&'a Message);

impl serde::Serialize for WireMessage<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        match self.0 {
            Message::System { content } => {
                map.serialize_entry("content", content)?;
                map.serialize_entry("role", "system")?;
            }
            Message::User { content, images } if images.is_empty() => {
                map.serialize_entry("content", content)?;
                map.serialize_entry("role", "user")?;
            }
            Message::User { content, images } => {
                map.serialize_entry("content", &openai_parts(content, images))?;
                map.serialize_entry("role", "user")?;
            }
            Message::Assistant {
                content,
                tool_calls,
            } if tool_calls.is_empty() => {
                map.serialize_entry("content", content)?;
                map.serialize_entry("role", "assistant")?;
            }
            Message::Assistant {
                content,
                tool_calls,
            } => {
                let content = (!content.is_empty()).then_some(content);
                map.serialize_entry("content", &content)?;
                map.serialize_entry("role", "assistant")?;
                map.serialize_entry("tool_calls", &WireCalls(tool_calls))?;
            }
            Message::Tool {
                tool_call_id,
                content,
            } => {
                map.serialize_entry("content", content)?;
                map.serialize_entry("role", "tool")?;
                map.serialize_entry("tool_call_id", tool_call_id)?;
            }
        }
        map.end()
    }
}

/// Tool calls as [`ToolCall::to_wire`] writes them, without building a
/// JSON tree (a long history holds many).
struct WireCalls<'a>(&'a [ToolCall]);

impl serde::Serialize for WireCalls<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Function<'a>(&'a ToolCall);
        impl serde::Serialize for Function<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(2))?;
                map.serialize_entry("arguments", self.0.wire_arguments())?;
                map.serialize_entry("name", &self.0.name)?;
                map.end()
            }
        }
        struct Call<'a>(&'a ToolCall);
        impl serde::Serialize for Call<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(3))?;
                map.serialize_entry("function", &Function(self.0))?;
                map.serialize_entry("id", &self.0.id)?;
                map.serialize_entry("type", "function")?;
                map.end()
            }
        }
        serializer.collect_seq(self.0.iter().map(Call))
    }
}

/// Tools as [`ToolDefinition::to_wire`] writes them, without copying their
/// schemas into a new JSON tree on every request.
struct WireTools<'a>(&'a [ToolDefinition]);

impl serde::Serialize for WireTools<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Function<'a>(&'a ToolDefinition);
        impl serde::Serialize for Function<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(3))?;
                map.serialize_entry("description", &self.0.description)?;
                map.serialize_entry("name", &self.0.name)?;
                map.serialize_entry("parameters", &self.0.parameters)?;
                map.end()
            }
        }
        struct Tool<'a>(&'a ToolDefinition);
        impl serde::Serialize for Tool<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(2))?;
                map.serialize_entry("function", &Function(self.0))?;
                map.serialize_entry("type", "function")?;
                map.end()
            }
        }
        serializer.collect_seq(self.0.iter().map(Tool))
    }
}

/// `t` widened through its decimal representation, so 0.7f32 becomes 0.7, not
/// 0.699999988079071.
pub(crate) fn decimal(t: f32) -> f64 {
    t.to_string().parse().unwrap_or(f64::from(t))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn wire_bytes_are_the_wire_tree() {
        let mut req = ChatRequest::new(vec![
            Message::System {
                content: "be brief".into(),
            },
            Message::user("hi \"there\"\n"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "read_file".into(),
                    arguments: String::new(),
                }],
            },
            Message::Assistant {
                content: "thinking".into(),
                tool_calls: vec![ToolCall {
                    id: "c2".into(),
                    name: "bash".into(),
                    arguments: "{\"command\":\"ls\"}".into(),
                }],
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: "ok".into(),
            },
            Message::Assistant {
                content: "done".into(),
                tool_calls: vec![],
            },
        ]);
        let bytes = req.to_wire_bytes("m").unwrap();
        let parsed: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(parsed, req.to_wire("m"));
        req.temperature = Some(0.7);
        req.tools = vec![ToolDefinition {
            name: "t".into(),
            description: "d".into(),
            parameters: json!({"type": "object"}),
        }];
        let parsed: Value = serde_json::from_slice(&req.to_wire_bytes("m").unwrap()).unwrap();
        assert_eq!(parsed, req.to_wire("m"));
    }

    #[test]
    fn temperature_is_not_widened_noisily() {
        let mut req = ChatRequest::new(vec![Message::user("hi")]);
        req.temperature = Some(0.7);
        assert_eq!(req.to_wire("m")["temperature"], json!(0.7));
    }

    #[test]
    fn assistant_with_only_tool_calls_has_null_content() {
        let m = Message::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "f".into(),
                arguments: String::new(),
            }],
        };
        assert_eq!(
            m.to_wire(),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ]})
        );
    }

    #[test]
    #[cfg(feature = "client")]
    fn images_travel_in_each_servers_own_form() {
        let image = Image {
            mime: "image/png".into(),
            data: std::sync::Arc::from(&b"\x89PNG"[..]),
        };
        let message = Message::User {
            content: "what is this?".into(),
            images: vec![image.clone()],
        };
        assert_eq!(image.base64(), "iVBORw==");
        let openai = json!({"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
        ]});
        assert_eq!(message.to_wire(), openai);
        let req = ChatRequest::new(vec![message]);
        let parsed: Value = serde_json::from_slice(&req.to_wire_bytes("m").unwrap()).unwrap();
        assert_eq!(parsed["messages"][0], openai);
        assert_eq!(
            req.to_anthropic_wire("m")["messages"][0]["content"],
            json!([
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}},
                {"type": "text", "text": "what is this?"},
            ])
        );
        assert_eq!(
            req.to_ollama_wire("m", None)["messages"][0],
            json!({"role": "user", "content": "what is this?", "images": ["iVBORw=="]})
        );
        // Without images a message stays plain text everywhere.
        let plain = ChatRequest::new(vec![Message::user("hi")]);
        assert_eq!(plain.to_wire("m")["messages"][0]["content"], json!("hi"));
        assert!(
            plain.to_ollama_wire("m", None)["messages"][0]
                .get("images")
                .is_none()
        );
    }
}
