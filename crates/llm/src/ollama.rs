//! Ollama's native protocol: `POST {base_url}/api/chat` answered with newline-delimited JSON.
//!
//! Every line is one object: `{"model", "created_at", "message": {"role": "assistant",
//! "content": "..", "tool_calls"?: [{"function": {"name", "arguments": {..}}}]}, "done": false}`
//! while the answer is generated, and finally `{"done": true, "done_reason": "stop",
//! "prompt_eval_count": N, "eval_count": M, ..}`. Errors are `{"error": "message"}`, as the
//! body of a non-2xx answer or as a line of the stream.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::assemble::{snippet, stream_error};
use crate::client::transport_error;
use crate::types::decimal;
use crate::{
    ChatRequest, ChatStream, Completion, LlmError, Message, StreamEvent, ToolCall, ToolDefinition,
    Usage,
};

/// Longest excerpt of a bad line quoted in an error message.
const SNIPPET_CHARS: usize = 200;

impl ChatRequest {
    /// The streaming request body sent to Ollama's `{base_url}/api/chat`.
    ///
    /// `num_ctx`, when given, asks for that context window (`options.num_ctx`).
    /// Tool-call arguments are sent as JSON objects (as Ollama expects) when they parse as one,
    /// else as the original string; a tool result names its tool in `tool_name` when an earlier
    /// assistant message holds the call it answers.
    pub fn to_ollama_wire(&self, model: &str, num_ctx: Option<u32>) -> Value {
        let mut tool_names: HashMap<&str, &str> = HashMap::new();
        let mut messages = Vec::with_capacity(self.messages.len());
        for message in &self.messages {
            let wire = match message {
                Message::System { content } => json!({"role": "system", "content": content}),
                Message::User { content, images } if images.is_empty() => {
                    json!({"role": "user", "content": content})
                }
                Message::User { content, images } => json!({
                    "role": "user",
                    "content": content,
                    "images": images.iter().map(crate::Image::base64).collect::<Vec<_>>(),
                }),
                Message::Assistant {
                    content,
                    tool_calls,
                } => {
                    let mut wire = json!({"role": "assistant", "content": content});
                    if !tool_calls.is_empty()
                        && let Value::Object(map) = &mut wire
                    {
                        for call in tool_calls {
                            tool_names.insert(&call.id, &call.name);
                        }
                        let calls: Vec<Value> = tool_calls
                            .iter()
                            .map(|call| {
                                json!({"function": {
                                    "name": call.name,
                                    "arguments": arguments_object(&call.arguments),
                                }})
                            })
                            .collect();
                        map.insert("tool_calls".into(), Value::Array(calls));
                    }
                    wire
                }
                Message::Tool {
                    tool_call_id,
                    content,
                } => {
                    let mut wire = json!({"role": "tool", "content": content});
                    if let Some(name) = tool_names.get(tool_call_id.as_str())
                        && let Value::Object(map) = &mut wire
                    {
                        map.insert("tool_name".into(), json!(name));
                    }
                    wire
                }
            };
            messages.push(wire);
        }
        let mut body = Map::new();
        body.insert("model".into(), json!(model));
        body.insert("messages".into(), Value::Array(messages));
        if !self.tools.is_empty() {
            body.insert(
                "tools".into(),
                Value::Array(self.tools.iter().map(ToolDefinition::to_wire).collect()),
            );
        }
        body.insert("stream".into(), Value::Bool(true));
        let mut options = Map::new();
        if let Some(t) = self.temperature {
            options.insert("temperature".into(), json!(decimal(t)));
        }
        if let Some(n) = num_ctx {
            options.insert("num_ctx".into(), json!(n));
        }
        if !options.is_empty() {
            body.insert("options".into(), Value::Object(options));
        }
        Value::Object(body)
    }
}

/// Our raw-JSON-text arguments as the object Ollama expects (`{}` when empty); text that is not
/// a JSON object is sent unchanged, as a string.
fn arguments_object(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return Value::Object(Map::new());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(object @ Value::Object(_)) => object,
        _ => Value::String(arguments.to_string()),
    }
}

#[derive(Debug, Deserialize)]
struct WireLine {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    message: Option<WireMessage>,
    #[serde(default)]
    done: Option<bool>,
    #[serde(default)]
    done_reason: Option<String>,
    #[serde(default)]
    prompt_eval_count: Option<u64>,
    #[serde(default)]
    eval_count: Option<u64>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Debug, Deserialize)]
struct WireToolCall {
    /// Not sent by Ollama so far; used when a server does.
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunction>,
}

#[derive(Debug, Deserialize)]
struct WireFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

/// Accumulates the state of one NDJSON response.
#[derive(Debug)]
pub(crate) struct LineAssembler {
    text: String,
    calls: Vec<ToolCall>,
    done_reason: Option<String>,
    usage: Option<Usage>,
    model: Option<String>,
    fallback_model: String,
}

/// What the driver should do after a line was handled.
#[derive(Debug, PartialEq)]
pub(crate) enum LineStep {
    /// Yield these events and keep reading.
    Continue(Vec<StreamEvent>),
    /// Yield these events; the response is complete (`"done": true`).
    Done(Vec<StreamEvent>),
}

impl LineAssembler {
    /// A fresh assembler; `fallback_model` is reported when the server names no model.
    pub(crate) fn new(fallback_model: &str) -> Self {
        LineAssembler {
            text: String::new(),
            calls: Vec::new(),
            done_reason: None,
            usage: None,
            model: None,
            fallback_model: fallback_model.to_string(),
        }
    }

    /// The sizes of the answer so far.
    pub(crate) fn sizes(&self) -> crate::limits::Sizes<'_> {
        let calls = self.calls.iter();
        crate::limits::Sizes::of(&self.text, calls.map(|c| (&*c.name, &*c.arguments)))
    }

    /// Handles one line of the stream (without its newline).
    pub(crate) fn handle(&mut self, line: &str) -> Result<LineStep, LlmError> {
        let line = line.trim();
        if line.is_empty() {
            return Ok(LineStep::Continue(Vec::new()));
        }
        let wire: WireLine = serde_json::from_str(line).map_err(|e| {
            LlmError::Malformed(format!(
                "invalid JSON line ({e}): {}",
                snippet(line, SNIPPET_CHARS)
            ))
        })?;
        if let Some(error) = wire.error {
            return Err(stream_error(&error));
        }
        if self.model.is_none() {
            self.model = wire.model.filter(|m| !m.is_empty());
        }
        let mut events = Vec::new();
        if let Some(message) = wire.message {
            if let Some(content) = message.content.filter(|c| !c.is_empty()) {
                self.text.push_str(&content);
                events.push(StreamEvent::TextDelta(content));
            }
            for call in message.tool_calls.unwrap_or_default() {
                self.add_call(call);
            }
        }
        if wire.done != Some(true) {
            return Ok(LineStep::Continue(events));
        }
        self.done_reason = wire.done_reason.filter(|r| !r.is_empty());
        if wire.prompt_eval_count.is_some() || wire.eval_count.is_some() {
            let prompt = wire.prompt_eval_count.unwrap_or(0);
            let completion = wire.eval_count.unwrap_or(0);
            self.usage = Some(Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                total_tokens: prompt + completion,
                cached_prompt_tokens: 0,
                cache_write_tokens: 0,
            });
        }
        Ok(LineStep::Done(events))
    }

    fn add_call(&mut self, call: WireToolCall) {
        let n = self.calls.len();
        let (name, arguments) = match call.function {
            Some(f) => (f.name.unwrap_or_default(), f.arguments),
            None => (String::new(), None),
        };
        let arguments = match arguments {
            Some(Value::String(s)) => s,
            Some(Value::Null) | None => "{}".to_string(),
            Some(other) => other.to_string(),
        };
        self.calls.push(ToolCall {
            id: call
                .id
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| format!("call_{n}")),
            name,
            arguments,
        });
    }

    /// The final result: finish reason "tool_calls" when the model called tools, else Ollama's
    /// `done_reason` ("stop" when it sent none).
    pub(crate) fn into_completion(self) -> Completion {
        let finish_reason = if self.calls.is_empty() {
            self.done_reason.unwrap_or_else(|| "stop".to_string())
        } else {
            "tool_calls".to_string()
        };
        Completion {
            text: self.text,
            tool_calls: self.calls,
            finish_reason,
            usage: self.usage,
            model: self.model.unwrap_or(self.fallback_model),
        }
    }
}

/// The stream of an NDJSON response.
pub(crate) fn ndjson_stream(
    response: reqwest::Response,
    model: &str,
    timeout: Duration,
    limits: crate::ResponseLimits,
) -> ChatStream {
    let driver = Driver {
        body: Box::pin(response.bytes_stream()),
        buf: Vec::new(),
        scanned: 0,
        assembler: Some(LineAssembler::new(model)),
        pending: VecDeque::new(),
        timeout,
        limits,
        done: false,
    };
    Box::pin(futures::stream::unfold(driver, |mut d| async move {
        d.next_item().await.map(|item| (item, d))
    }))
}

/// State of an NDJSON [`ChatStream`] being consumed.
struct Driver<B> {
    body: std::pin::Pin<Box<dyn Stream<Item = Result<B, reqwest::Error>> + Send>>,
    /// Received bytes not yet split into lines.
    buf: Vec<u8>,
    /// How much of `buf` is known to hold no newline.
    scanned: usize,
    assembler: Option<LineAssembler>,
    pending: VecDeque<StreamEvent>,
    timeout: Duration,
    limits: crate::ResponseLimits,
    done: bool,
}

impl<B> Driver<B>
where
    B: AsRef<[u8]> + Send + 'static,
{
    async fn next_item(&mut self) -> Option<Result<StreamEvent, LlmError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if self.done {
                return None;
            }
            let line = match self.next_line().await {
                Ok(Some(line)) => line,
                Ok(None) => {
                    return Some(self.fail(LlmError::Truncated(
                        "the server closed the stream before the final message (\"done\": true)"
                            .into(),
                    )));
                }
                Err(e) => return Some(self.fail(e)),
            };
            let line = match String::from_utf8(line) {
                Ok(line) => line,
                Err(e) => {
                    return Some(self.fail(LlmError::Malformed(format!(
                        "stream is not valid UTF-8: {}",
                        e.utf8_error()
                    ))));
                }
            };
            let Some(assembler) = self.assembler.as_mut() else {
                return Some(self.fail(LlmError::Malformed("stream already completed".into())));
            };
            let handled = assembler
                .handle(&line)
                .and_then(|step| self.limits.check(&assembler.sizes()).map(|()| step));
            match handled {
                Ok(LineStep::Continue(events)) => self.pending.extend(events),
                Ok(LineStep::Done(events)) => {
                    self.pending.extend(events);
                    let completion = self.complete();
                    self.pending.push_back(completion);
                }
                Err(e) => return Some(self.fail(e)),
            }
        }
    }

    /// The next line without its newline; `None` at the end of the body.
    async fn next_line(&mut self) -> Result<Option<Vec<u8>>, LlmError> {
        loop {
            if let Some(pos) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
                let end = self.scanned + pos;
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                line.pop();
                self.scanned = 0;
                return Ok(Some(line));
            }
            self.scanned = self.buf.len();
            if self.buf.len() > self.limits.max_line_bytes() {
                return Err(self.limits.line_too_long());
            }
            match tokio::time::timeout(self.timeout, self.body.next()).await {
                Err(_) => {
                    return Err(LlmError::Timeout {
                        after: self.timeout,
                    });
                }
                Ok(None) if self.buf.is_empty() => return Ok(None),
                // The last line may lack its newline.
                Ok(None) => {
                    self.scanned = 0;
                    return Ok(Some(std::mem::take(&mut self.buf)));
                }
                Ok(Some(Err(e))) => return Err(transport_error(&e, self.timeout)),
                Ok(Some(Ok(bytes))) => self.buf.extend_from_slice(bytes.as_ref()),
            }
        }
    }

    /// Marks the stream as over and releases the connection.
    fn finish(&mut self) {
        self.done = true;
        self.buf = Vec::new();
        self.body = Box::pin(futures::stream::empty());
    }

    fn fail(&mut self, err: LlmError) -> Result<StreamEvent, LlmError> {
        tracing::debug!(error = %err, "model stream failed");
        self.finish();
        self.pending.clear();
        self.assembler = None;
        Err(err)
    }

    fn complete(&mut self) -> StreamEvent {
        self.finish();
        let completion = self
            .assembler
            .take()
            .map(LineAssembler::into_completion)
            .unwrap_or_else(|| LineAssembler::new("").into_completion());
        tracing::debug!(
            model = %completion.model,
            finish_reason = %completion.finish_reason,
            tool_calls = completion.tool_calls.len(),
            usage = ?completion.usage,
            "model stream completed"
        );
        StreamEvent::Completed(completion)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pretty_assertions::assert_eq;

    fn events(a: &mut LineAssembler, line: &str) -> Vec<StreamEvent> {
        match a.handle(line).unwrap() {
            LineStep::Continue(e) => e,
            LineStep::Done(_) => panic!("unexpected done"),
        }
    }

    #[test]
    fn arguments_become_objects_when_they_parse_as_one() {
        assert_eq!(arguments_object(r#"{"a": [1]}"#), json!({"a": [1]}));
        assert_eq!(arguments_object("  "), json!({}));
        assert_eq!(arguments_object("{broken"), json!("{broken"));
        assert_eq!(arguments_object("[1, 2]"), json!("[1, 2]"));
    }

    #[test]
    fn request_body_shape() {
        let req = ChatRequest {
            messages: vec![
                Message::user("hi"),
                Message::Assistant {
                    content: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "x".into(),
                        name: "f".into(),
                        arguments: String::new(),
                    }],
                },
                Message::tool("x", "out"),
                Message::tool("unknown", "orphan"),
            ],
            tools: vec![],
            temperature: Some(0.7),
            require_tool: false,
        };
        assert_eq!(
            req.to_ollama_wire("m", None),
            json!({
                "model": "m",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"function": {"name": "f", "arguments": {}}}
                    ]},
                    {"role": "tool", "content": "out", "tool_name": "f"},
                    {"role": "tool", "content": "orphan"},
                ],
                "stream": true,
                "options": {"temperature": 0.7},
            })
        );
    }

    #[test]
    fn a_non_streamed_answer_is_one_done_line() {
        let mut a = LineAssembler::new("m");
        let step = a
            .handle(r#"{"model":"llama3.2","created_at":"2024-07-22T20:33:28.123648Z","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_current_weather","arguments":{"format":"celsius","location":"Paris, FR"}}}]},"done_reason":"stop","done":true,"total_duration":885095291,"load_duration":3753500,"prompt_eval_count":122,"prompt_eval_duration":328493000,"eval_count":33,"eval_duration":552222000}"#)
            .unwrap();
        assert_eq!(step, LineStep::Done(vec![]));
        let c = a.into_completion();
        assert_eq!(
            c.tool_calls,
            vec![ToolCall {
                id: "call_0".into(),
                name: "get_current_weather".into(),
                arguments: r#"{"format":"celsius","location":"Paris, FR"}"#.into(),
            }]
        );
        assert_eq!(c.finish_reason, "tool_calls");
        assert_eq!(c.model, "llama3.2");
        assert_eq!(
            c.usage,
            Some(Usage {
                prompt_tokens: 122,
                completion_tokens: 33,
                total_tokens: 155,
                cached_prompt_tokens: 0,
                cache_write_tokens: 0,
            })
        );
    }

    #[test]
    fn thinking_unknown_fields_and_blank_lines_are_ignored() {
        let mut a = LineAssembler::new("m");
        assert!(events(&mut a, "   ").is_empty());
        assert!(
            events(
                &mut a,
                r#"{"model":"qwen3","message":{"role":"assistant","content":"","thinking":"hmm"},"done":false,"extra":1}"#
            )
            .is_empty()
        );
        assert_eq!(
            events(
                &mut a,
                r#"{"model":"qwen3","message":{"role":"assistant","content":"Hi"},"done":false}"#
            ),
            vec![StreamEvent::TextDelta("Hi".into())]
        );
        assert!(matches!(
            a.handle(r#"{"done":true}"#).unwrap(),
            LineStep::Done(_)
        ));
        let c = a.into_completion();
        assert_eq!(c.finish_reason, "stop");
        assert_eq!(c.usage, None);
        assert_eq!(c.text, "Hi");
    }

    #[test]
    fn server_ids_and_string_arguments_are_kept() {
        let mut a = LineAssembler::new("m");
        events(
            &mut a,
            r#"{"message":{"content":"","tool_calls":[{"id":"abc","function":{"name":"f","arguments":"{\"x\":1}"}},{"function":{"name":"g"}}]},"done":false}"#,
        );
        let c = a.into_completion();
        assert_eq!(
            c.tool_calls,
            vec![
                ToolCall {
                    id: "abc".into(),
                    name: "f".into(),
                    arguments: r#"{"x":1}"#.into()
                },
                ToolCall {
                    id: "call_1".into(),
                    name: "g".into(),
                    arguments: "{}".into()
                },
            ]
        );
    }

    #[test]
    fn error_lines_and_bad_json() {
        let mut a = LineAssembler::new("m");
        let err = a.handle(r#"{"error":"model runner crashed"}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "model server returned HTTP 500: model runner crashed"
        );
        let err = a.handle("not json").unwrap_err();
        assert!(
            matches!(&err, LlmError::Malformed(m) if m.contains("not json")),
            "{err:?}"
        );
        assert!(matches!(a.handle("[1]"), Err(LlmError::Malformed(_))));
    }
}
