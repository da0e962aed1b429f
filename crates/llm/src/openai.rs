//! The OpenAI-compatible protocol: `POST {base_url}/chat/completions` answered with
//! server-sent events (or, by servers that ignore `"stream": true`, one JSON document).

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::Value;

use crate::assemble::{Assembler, Step, snippet, stream_error};
use crate::client::error_chain;
use crate::{ChatStream, LlmError, StreamEvent};

/// The stream of a `text/event-stream` response.
pub(crate) fn sse_stream(
    response: reqwest::Response,
    model: &str,
    timeout: Duration,
    limits: crate::ResponseLimits,
) -> ChatStream {
    crate::sse::stream(
        response,
        Assembler::new(model),
        timeout,
        limits,
        "the server closed the stream without a finish reason or [DONE]",
    )
}

impl crate::sse::Assemble for Assembler {
    fn event(
        &mut self,
        event: &eventsource_stream::Event,
        out: &mut VecDeque<StreamEvent>,
    ) -> Result<bool, LlmError> {
        match self.handle(&event.data)? {
            Step::Continue(events) => {
                out.extend(events);
                Ok(false)
            }
            Step::Done => Ok(true),
        }
    }

    fn finished(&self) -> bool {
        Assembler::finished(self)
    }

    fn sizes(&self) -> crate::limits::Sizes<'_> {
        Assembler::sizes(self)
    }

    fn into_completion(self) -> crate::Completion {
        Assembler::into_completion(self)
    }
}

/// The stream of a complete (non-streamed) `application/json` chat completion.
pub(crate) async fn whole_response(
    response: reqwest::Response,
    model: &str,
    timeout: Duration,
    limits: crate::ResponseLimits,
) -> Result<ChatStream, LlmError> {
    let read = crate::limits::read_body(response, limits.max_line_bytes());
    let body = match tokio::time::timeout(timeout, read).await {
        Err(_) => return Err(LlmError::Timeout { after: timeout }),
        Ok(Err(e)) => return Err(LlmError::Truncated(error_chain(&e))),
        Ok(Ok((_, true))) => return Err(limits.line_too_long()),
        Ok(Ok((body, false))) => body,
    };
    let value: Value = serde_json::from_str(&body).map_err(|e| {
        LlmError::Malformed(format!(
            "invalid JSON response ({e}): {}",
            snippet(&body, 200)
        ))
    })?;
    if let Some(error) = value.get("error") {
        return Err(stream_error(error));
    }
    // Re-shape the complete response as a single chunk: `message` becomes `delta`.
    let mut chunk = value;
    if let Some(Value::Array(choices)) = chunk.get_mut("choices") {
        for choice in choices {
            if let Some(obj) = choice.as_object_mut()
                && let Some(message) = obj.remove("message")
            {
                obj.insert("delta".into(), message);
            }
        }
    }
    let mut assembler = Assembler::new(model);
    let mut items: Vec<Result<StreamEvent, LlmError>> = Vec::new();
    match assembler.handle(&chunk.to_string())? {
        Step::Continue(events) => items.extend(events.into_iter().map(Ok)),
        Step::Done => {}
    }
    limits.check(&assembler.sizes())?;
    let completion = assembler.into_completion();
    items.push(Ok(StreamEvent::Completed(completion)));
    Ok(Box::pin(futures::stream::iter(items)))
}
