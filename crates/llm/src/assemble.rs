//! Turns the SSE `data:` payloads of a chat-completion stream into [`StreamEvent`]s.

use serde::Deserialize;
use serde_json::Value;

use crate::{Completion, LlmError, StreamEvent, ToolCall, Usage};

/// Longest excerpt of a bad chunk quoted in an error message.
const SNIPPET_CHARS: usize = 200;

/// `s` cut to at most `max` characters, with an ellipsis when something was cut.
pub(crate) fn snippet(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[derive(Debug, Deserialize)]
struct WireChunk {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Option<Vec<WireChoice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct WireChoice {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    delta: Option<WireDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
struct WireToolCallDelta {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct WireFunctionDelta {
    #[serde(default)]
    name: Option<String>,
    /// Normally a string fragment; some servers send the whole arguments object.
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    total_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<WirePromptDetails>,
}

#[derive(Debug, Deserialize)]
struct WirePromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Debug)]
struct PartialCall {
    index: u32,
    id: Option<String>,
    name: String,
    arguments: String,
}

/// What the driver should do after a payload was handled.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Keep reading; yield these events first.
    Continue(Vec<StreamEvent>),
    /// `[DONE]` arrived: the response is complete.
    Done,
}

/// Accumulates the state of one streamed response.
#[derive(Debug)]
pub(crate) struct Assembler {
    text: String,
    calls: Vec<PartialCall>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    model: Option<String>,
    fallback_model: String,
}

impl Assembler {
    /// A fresh assembler; `fallback_model` is reported when the server names no model.
    pub(crate) fn new(fallback_model: &str) -> Self {
        Assembler {
            text: String::new(),
            calls: Vec::new(),
            finish_reason: None,
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

    /// Whether a finish reason was received, i.e. the answer itself is complete.
    pub(crate) fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// Handles the `data` of one SSE event.
    pub(crate) fn handle(&mut self, data: &str) -> Result<Step, LlmError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(Step::Continue(Vec::new()));
        }
        if data == "[DONE]" {
            return Ok(Step::Done);
        }
        let chunk: WireChunk = serde_json::from_str(data).map_err(|e| {
            LlmError::Malformed(format!(
                "invalid JSON chunk ({e}): {}",
                snippet(data, SNIPPET_CHARS)
            ))
        })?;
        if let Some(error) = chunk.error {
            return Err(stream_error(&error));
        }
        if self.model.is_none() {
            self.model = chunk.model.filter(|m| !m.is_empty());
        }
        if let Some(u) = chunk.usage {
            let prompt = u.prompt_tokens.unwrap_or(0);
            let completion = u.completion_tokens.unwrap_or(0);
            self.usage = Some(Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                total_tokens: u.total_tokens.unwrap_or(prompt + completion),
                cached_prompt_tokens: u
                    .prompt_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0),
                cache_write_tokens: 0,
            });
        }
        let mut events = Vec::new();
        for choice in chunk.choices.unwrap_or_default() {
            // We never ask for n > 1; ignore any other choice.
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.delta {
                if let Some(content) = delta.content.filter(|c| !c.is_empty()) {
                    self.text.push_str(&content);
                    events.push(StreamEvent::TextDelta(content));
                }
                for call in delta.tool_calls.unwrap_or_default() {
                    self.add_call_delta(call);
                }
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish_reason = Some(reason);
            }
        }
        Ok(Step::Continue(events))
    }

    fn add_call_delta(&mut self, delta: WireToolCallDelta) {
        let id = delta.id.filter(|id| !id.is_empty());
        let index = match delta.index {
            Some(i) => i,
            // Servers that omit the index send one complete call per delta, or continue the
            // last call: a new id starts a new call, anything else continues the last one.
            None => match (&id, self.calls.last()) {
                (Some(id), Some(last)) if last.id.as_deref() == Some(id) => last.index,
                (Some(_), _) | (None, None) => {
                    self.calls.iter().map(|c| c.index + 1).max().unwrap_or(0)
                }
                (None, Some(last)) => last.index,
            },
        };
        let pos = match self.calls.iter().position(|c| c.index == index) {
            Some(pos) => pos,
            None => {
                self.calls.push(PartialCall {
                    index,
                    id: None,
                    name: String::new(),
                    arguments: String::new(),
                });
                self.calls.len() - 1
            }
        };
        let Some(call) = self.calls.get_mut(pos) else {
            return;
        };
        if call.id.is_none() {
            call.id = id;
        }
        if let Some(function) = delta.function {
            if let Some(name) = function.name.filter(|n| !n.is_empty())
                && call.name.is_empty()
            {
                call.name = name;
            }
            match function.arguments {
                Some(Value::String(fragment)) => call.arguments.push_str(&fragment),
                Some(Value::Null) | None => {}
                Some(other) => call.arguments.push_str(&other.to_string()),
            }
        }
    }

    /// The final result. `finish_reason` defaults to "tool_calls" or "stop" when the server
    /// sent `[DONE]` without one.
    pub(crate) fn into_completion(self) -> Completion {
        let mut calls = self.calls;
        calls.sort_by_key(|c| c.index);
        let tool_calls: Vec<ToolCall> = calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id.unwrap_or_else(|| format!("call_{}", c.index)),
                name: c.name,
                arguments: c.arguments,
            })
            .collect();
        let finish_reason = self.finish_reason.unwrap_or_else(|| {
            if tool_calls.is_empty() {
                "stop".to_string()
            } else {
                "tool_calls".to_string()
            }
        });
        Completion {
            text: self.text,
            tool_calls,
            finish_reason,
            usage: self.usage,
            model: self.model.unwrap_or(self.fallback_model),
        }
    }
}

/// Converts an `{"error": ...}` object into an [`LlmError::Http`].
pub(crate) fn stream_error(error: &Value) -> LlmError {
    let message = match error {
        Value::String(s) => s.clone(),
        Value::Object(map) => match map.get("message") {
            Some(Value::String(s)) => s.clone(),
            _ => error.to_string(),
        },
        other => other.to_string(),
    };
    let status = error
        .get("code")
        .and_then(|code| match code {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.parse::<u64>().ok(),
            _ => None,
        })
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (100..=599).contains(c))
        .unwrap_or(500);
    LlmError::Http { status, message }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn events(a: &mut Assembler, data: &str) -> Vec<StreamEvent> {
        match a.handle(data).unwrap() {
            Step::Continue(e) => e,
            Step::Done => panic!("unexpected done"),
        }
    }

    #[test]
    fn calls_without_index_are_split_by_id() {
        let mut a = Assembler::new("m");
        events(
            &mut a,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":{"x":1}}}]}}]}"#,
        );
        events(
            &mut a,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"g","arguments":"{}"}}]}}]}"#,
        );
        events(
            &mut a,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        );
        assert!(a.finished());
        let c = a.into_completion();
        assert_eq!(
            c.tool_calls,
            vec![
                ToolCall {
                    id: "a".into(),
                    name: "f".into(),
                    arguments: r#"{"x":1}"#.into()
                },
                ToolCall {
                    id: "b".into(),
                    name: "g".into(),
                    arguments: "{}".into()
                },
            ]
        );
        assert_eq!(c.model, "m");
    }

    #[test]
    fn reasoning_and_unknown_fields_are_ignored() {
        let mut a = Assembler::new("m");
        let e = events(
            &mut a,
            r#"{"model":"real","x":1,"choices":[{"index":0,"delta":{"reasoning_content":"hmm","content":""},"finish_reason":null,"logprobs":null}]}"#,
        );
        assert!(e.is_empty());
        assert_eq!(a.handle("[DONE]").unwrap(), Step::Done);
        let c = a.into_completion();
        assert_eq!(c.text, "");
        assert_eq!(c.model, "real");
        assert_eq!(c.finish_reason, "stop");
    }

    #[test]
    fn in_stream_errors_use_numeric_code() {
        let mut a = Assembler::new("m");
        let err = a
            .handle(r#"{"error":{"message":"overloaded","code":503}}"#)
            .unwrap_err();
        assert!(
            matches!(err, LlmError::Http { status: 503, ref message } if message == "overloaded")
        );
        let err = a
            .handle(r#"{"error":{"message":"bad","code":"invalid_thing"}}"#)
            .unwrap_err();
        assert!(matches!(err, LlmError::Http { status: 500, .. }));
    }

    #[test]
    fn snippet_respects_char_boundaries() {
        assert_eq!(snippet("ééé", 2), "éé…");
        assert_eq!(snippet("ab", 2), "ab");
    }
}
