//! Anthropic's Messages API: `POST {base_url}/v1/messages` with
//! `x-api-key` and `anthropic-version`, answered with server-sent events.
//!
//! The request: system messages go to the top-level `system` blocks (the
//! first one, the configured system prompt, marked for prompt caching);
//! tools carry `input_schema` (the last one marked for caching, which caches
//! every tool before it); tool calls are `tool_use` blocks of the assistant
//! and results `tool_result` blocks of the next user message. The API wants
//! messages that alternate user / assistant and start with the user, so
//! neighbours of the same role are merged into one message of several blocks.
//!
//! The stream: `message_start` (model, input usage with cache reads and
//! writes), `content_block_start` / `content_block_delta` (`text_delta`,
//! `input_json_delta` fragments of a tool's input) / `content_block_stop`,
//! `message_delta` (stop reason, output usage), `message_stop`; `ping`s and
//! thinking blocks are ignored; an `error` event ends the stream with that
//! error (`overloaded_error` may be retried).

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::assemble::snippet;
use crate::types::decimal;
use crate::{ChatRequest, ChatStream, Completion, LlmError, Message, StreamEvent, ToolCall, Usage};

/// The API version sent in `anthropic-version`.
pub(crate) const API_VERSION: &str = "2023-06-01";

/// `max_tokens` is required by the API; this, the most every Claude model
/// allows, is sent unless `llm.extra_body` sets another.
pub(crate) const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Longest excerpt of a bad event quoted in an error message.
const SNIPPET_CHARS: usize = 200;

impl ChatRequest {
    /// The streaming request body for Anthropic's `/v1/messages`.
    pub fn to_anthropic_wire(&self, model: &str) -> Value {
        let mut system: Vec<Value> = Vec::new();
        let mut messages: Vec<(String, Vec<Value>)> = Vec::new();
        let mut push = |role: &str, block: Value| match messages.last_mut() {
            Some((last, blocks)) if last == role => blocks.push(block),
            _ => messages.push((role.to_string(), vec![block])),
        };
        for message in &self.messages {
            match message {
                Message::System { content } => {
                    if !content.is_empty() {
                        system.push(json!({"type": "text", "text": content}));
                    }
                }
                Message::User { content, images } => {
                    // Images first: Anthropic advises them before the text.
                    for image in images {
                        push(
                            "user",
                            json!({"type": "image", "source": {
                                "type": "base64",
                                "media_type": image.mime,
                                "data": image.base64(),
                            }}),
                        );
                    }
                    push("user", json!({"type": "text", "text": non_empty(content)}));
                }
                Message::Assistant {
                    content,
                    tool_calls,
                } => {
                    if !content.trim().is_empty() {
                        push("assistant", json!({"type": "text", "text": content}));
                    }
                    for call in tool_calls {
                        push(
                            "assistant",
                            json!({
                                "type": "tool_use",
                                "id": call.id,
                                "name": call.name,
                                "input": input_object(&call.arguments),
                            }),
                        );
                    }
                    if content.trim().is_empty() && tool_calls.is_empty() {
                        push("assistant", json!({"type": "text", "text": "(no answer)"}));
                    }
                }
                Message::Tool {
                    tool_call_id,
                    content,
                } => push(
                    "user",
                    json!({
                        "type": "tool_result",
                        "tool_use_id": tool_call_id,
                        "content": non_empty(content),
                    }),
                ),
            }
        }
        // The conversation starts with the person.
        if messages.first().is_none_or(|(role, _)| role != "user") {
            messages.insert(
                0,
                (
                    "user".to_string(),
                    vec![json!({"type": "text", "text": "(the conversation so far)"})],
                ),
            );
        }
        // Prompt caching: the system prompt (with the tools before it).
        if let Some(first) = system.first_mut() {
            first["cache_control"] = json!({"type": "ephemeral"});
        }
        let mut body = Map::new();
        body.insert("model".into(), json!(model));
        body.insert("max_tokens".into(), json!(DEFAULT_MAX_TOKENS));
        body.insert("stream".into(), json!(true));
        if !system.is_empty() {
            body.insert("system".into(), Value::Array(system));
        }
        body.insert(
            "messages".into(),
            Value::Array(
                messages
                    .into_iter()
                    .map(|(role, content)| json!({"role": role, "content": content}))
                    .collect(),
            ),
        );
        if !self.tools.is_empty() {
            let mut tools: Vec<Value> = self
                .tools
                .iter()
                .map(|t| {
                    json!({
                        "name": t.name,
                        "description": t.description,
                        "input_schema": t.parameters,
                    })
                })
                .collect();
            if let Some(last) = tools.last_mut() {
                last["cache_control"] = json!({"type": "ephemeral"});
            }
            body.insert("tools".into(), Value::Array(tools));
            if self.require_tool {
                body.insert("tool_choice".into(), json!({"type": "any"}));
            }
        }
        if let Some(t) = self.temperature {
            body.insert("temperature".into(), json!(decimal(t)));
        }
        Value::Object(body)
    }
}

/// The API refuses empty text blocks.
fn non_empty(text: &str) -> &str {
    if text.trim().is_empty() {
        "(empty)"
    } else {
        text
    }
}

/// A tool call's arguments as the object `tool_use.input` must be: the
/// arguments when they are a JSON object, `{}` when empty, else the text
/// the model wrote, under `invalid_arguments`.
fn input_object(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return json!({});
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(object @ Value::Object(_)) => object,
        _ => json!({ "invalid_arguments": arguments }),
    }
}

/// The error of an Anthropic error object (`{"type": ..., "message": ...}`),
/// as the HTTP status its type stands for, so that overloads are retried.
pub(crate) fn api_error(error: &Value) -> LlmError {
    let kind = error["type"].as_str().unwrap_or("error");
    let message = error["message"].as_str().unwrap_or("(no message)");
    let status = match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "overloaded_error" => 529,
        "timeout_error" => 504,
        _ => 500,
    };
    LlmError::Http {
        status,
        message: format!("{kind}: {message}"),
    }
}

/// The stream of a `text/event-stream` response of `/v1/messages`.
pub(crate) fn sse_stream(
    response: reqwest::Response,
    model: &str,
    timeout: Duration,
    limits: crate::ResponseLimits,
) -> ChatStream {
    crate::sse::stream(
        response,
        Answer::new(model),
        timeout,
        limits,
        "the server closed the stream before message_stop",
    )
}

/// One content block being streamed.
enum Block {
    Text,
    ToolUse {
        id: String,
        name: String,
        input: String,
    },
    /// Thinking, or a kind not known here: not part of the answer.
    Other,
}

/// The response being assembled.
struct Answer {
    model: String,
    text: String,
    blocks: Vec<(u64, Block)>,
    calls: Vec<ToolCall>,
    stop_reason: Option<String>,
    usage: Usage,
    usage_seen: bool,
}

impl Answer {
    fn new(model: &str) -> Self {
        Answer {
            model: model.to_string(),
            text: String::new(),
            blocks: Vec::new(),
            calls: Vec::new(),
            stop_reason: None,
            usage: Usage::default(),
            usage_seen: false,
        }
    }

    /// Takes one event; `Ok(true)` once the message is complete.
    fn handle(
        &mut self,
        event: &eventsource_stream::Event,
        out: &mut VecDeque<StreamEvent>,
    ) -> Result<bool, LlmError> {
        let data: Value = serde_json::from_str(&event.data).map_err(|e| {
            LlmError::Malformed(format!(
                "invalid JSON event ({e}): {}",
                snippet(&event.data, SNIPPET_CHARS)
            ))
        })?;
        let kind = data["type"].as_str().unwrap_or(event.event.as_str());
        match kind {
            "message_start" => {
                let message = &data["message"];
                if let Some(model) = message["model"].as_str().filter(|m| !m.is_empty()) {
                    self.model = model.to_string();
                }
                self.add_usage(&message["usage"]);
            }
            "content_block_start" => {
                let index = data["index"].as_u64().unwrap_or(self.blocks.len() as u64);
                let block = &data["content_block"];
                let block = match block["type"].as_str() {
                    Some("text") => {
                        if let Some(text) = block["text"].as_str().filter(|t| !t.is_empty()) {
                            self.text.push_str(text);
                            out.push_back(StreamEvent::TextDelta(text.to_string()));
                        }
                        Block::Text
                    }
                    Some("tool_use") => Block::ToolUse {
                        id: block["id"].as_str().unwrap_or_default().to_string(),
                        name: block["name"].as_str().unwrap_or_default().to_string(),
                        // A complete input may come with the start.
                        input: match &block["input"] {
                            Value::Object(map) if !map.is_empty() => block["input"].to_string(),
                            _ => String::new(),
                        },
                    },
                    _ => Block::Other,
                };
                self.blocks.push((index, block));
            }
            "content_block_delta" => {
                let index = data["index"].as_u64();
                let delta = &data["delta"];
                let block = self
                    .blocks
                    .iter_mut()
                    .rev()
                    .find(|(i, _)| Some(*i) == index)
                    .map(|(_, b)| b);
                match (delta["type"].as_str(), block) {
                    (Some("text_delta"), Some(Block::Text)) => {
                        if let Some(text) = delta["text"].as_str().filter(|t| !t.is_empty()) {
                            self.text.push_str(text);
                            out.push_back(StreamEvent::TextDelta(text.to_string()));
                        }
                    }
                    (Some("input_json_delta"), Some(Block::ToolUse { input, .. })) => {
                        input.push_str(delta["partial_json"].as_str().unwrap_or_default());
                    }
                    (_, None) => {
                        return Err(LlmError::Malformed(format!(
                            "a content_block_delta for block {index:?}, which was not started"
                        )));
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = data["index"].as_u64();
                if let Some(pos) = self.blocks.iter().rposition(|(i, _)| Some(*i) == index) {
                    let (_, block) = self.blocks.remove(pos);
                    if let Block::ToolUse { id, name, input } = block {
                        self.calls.push(ToolCall {
                            id,
                            name,
                            arguments: if input.is_empty() { "{}".into() } else { input },
                        });
                    }
                }
            }
            "message_delta" => {
                if let Some(reason) = data["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(reason.to_string());
                }
                self.add_usage(&data["usage"]);
            }
            "message_stop" => return Ok(true),
            "error" => return Err(api_error(&data["error"])),
            // "ping", and whatever the API adds later.
            _ => {}
        }
        Ok(false)
    }

    /// Usage figures arrive in parts: input and cache figures at the start,
    /// the output count (cumulative) at the end.
    fn add_usage(&mut self, usage: &Value) {
        let Some(usage) = usage.as_object() else {
            return;
        };
        let field = |name: &str| usage.get(name).and_then(Value::as_u64);
        let u = &mut self.usage;
        if let Some(n) = field("input_tokens") {
            u.prompt_tokens = n;
        }
        if let Some(n) = field("cache_read_input_tokens") {
            u.cached_prompt_tokens = n;
        }
        if let Some(n) = field("cache_creation_input_tokens") {
            u.cache_write_tokens = n;
        }
        if let Some(n) = field("output_tokens") {
            u.completion_tokens = n;
        }
        self.usage_seen = true;
    }

    fn complete(mut self) -> Completion {
        // Prompt tokens count the whole input: fresh, read from the cache
        // and written to it.
        let u = &mut self.usage;
        let input = u.prompt_tokens + u.cached_prompt_tokens + u.cache_write_tokens;
        u.prompt_tokens = input;
        u.total_tokens = input + u.completion_tokens;
        let finish_reason = match self.stop_reason.as_deref() {
            Some("end_turn" | "stop_sequence") | None if self.calls.is_empty() => "stop",
            Some("tool_use") | None => "tool_calls",
            Some("max_tokens") => "length",
            Some(other) => other,
        }
        .to_string();
        Completion {
            text: self.text,
            tool_calls: self.calls,
            finish_reason,
            usage: self.usage_seen.then_some(self.usage),
            model: self.model,
        }
    }
}

impl crate::sse::Assemble for Answer {
    fn event(
        &mut self,
        event: &eventsource_stream::Event,
        out: &mut VecDeque<StreamEvent>,
    ) -> Result<bool, LlmError> {
        self.handle(event, out)
    }

    fn finished(&self) -> bool {
        self.stop_reason.is_some()
    }

    fn sizes(&self) -> crate::limits::Sizes<'_> {
        let streaming = self.blocks.iter().filter_map(|(_, block)| match block {
            Block::ToolUse { name, input, .. } => Some((&**name, &**input)),
            Block::Text | Block::Other => None,
        });
        let done = self.calls.iter().map(|c| (&*c.name, &*c.arguments));
        crate::limits::Sizes::of(&self.text, done.chain(streaming))
    }

    fn into_completion(self) -> Completion {
        self.complete()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::ToolDefinition;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_request_alternates_roles_and_marks_what_is_cached() {
        let request = ChatRequest {
            tools: vec![
                ToolDefinition {
                    name: "bash".into(),
                    description: "Run a command.".into(),
                    parameters: json!({"type": "object"}),
                },
                ToolDefinition {
                    name: "read_file".into(),
                    description: "Read a file.".into(),
                    parameters: json!({"type": "object"}),
                },
            ],
            require_tool: true,
            ..ChatRequest::new(vec![
                Message::system("You are careful."),
                Message::system("Use the coding skillset."),
                Message::user("list and read"),
                Message::Assistant {
                    content: String::new(),
                    tool_calls: vec![
                        ToolCall {
                            id: "toolu_1".into(),
                            name: "bash".into(),
                            arguments: r#"{"command":"ls"}"#.into(),
                        },
                        ToolCall {
                            id: "toolu_2".into(),
                            name: "read_file".into(),
                            arguments: "not json".into(),
                        },
                    ],
                },
                Message::tool("toolu_1", "a.txt"),
                Message::tool("toolu_2", ""),
                Message::user("thanks"),
            ])
        };
        let body = request.to_anthropic_wire("claude-test");
        assert_eq!(
            body["system"],
            json!([
                {"type": "text", "text": "You are careful.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Use the coding skillset."},
            ])
        );
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "list and read"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "read_file",
                     "input": {"invalid_arguments": "not json"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "(empty)"},
                    {"type": "text", "text": "thanks"},
                ]},
            ])
        );
        assert_eq!(body["tools"][0].get("cache_control"), None);
        assert_eq!(
            body["tools"][1]["cache_control"],
            json!({"type": "ephemeral"})
        );
        assert_eq!(body["tools"][1]["input_schema"], json!({"type": "object"}));
        assert_eq!(body["tool_choice"], json!({"type": "any"}));
        assert_eq!(body["max_tokens"], DEFAULT_MAX_TOKENS);
        assert_eq!(body["stream"], true);
    }

    #[test]
    fn a_conversation_that_begins_with_the_agent_gets_a_first_user_turn() {
        let body = ChatRequest::new(vec![
            Message::system("[Summary of the earlier conversation]"),
            Message::assistant("Done."),
            Message::user("next?"),
        ])
        .to_anthropic_wire("m");
        let roles: Vec<&str> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["user", "assistant", "user"]);
    }
}
