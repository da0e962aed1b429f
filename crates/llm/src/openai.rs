//! The OpenAI-compatible protocol: `POST {base_url}/chat/completions` answered with
//! server-sent events (or, by servers that ignore `"stream": true`, one JSON document).

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use serde_json::Value;

use crate::assemble::{Assembler, Step, snippet, stream_error};
use crate::client::{error_chain, transport_error};
use crate::{ChatStream, LlmError, StreamEvent};

/// The stream of a `text/event-stream` response.
pub(crate) fn sse_stream(
    response: reqwest::Response,
    model: &str,
    timeout: Duration,
) -> ChatStream {
    let driver = Driver {
        events: Box::pin(response.bytes_stream().eventsource()),
        assembler: Some(Assembler::new(model)),
        pending: VecDeque::new(),
        timeout,
        done: false,
    };
    Box::pin(futures::stream::unfold(driver, |mut d| async move {
        d.next_item().await.map(|item| (item, d))
    }))
}

/// The stream of a complete (non-streamed) `application/json` chat completion.
pub(crate) async fn whole_response(
    response: reqwest::Response,
    model: &str,
    timeout: Duration,
) -> Result<ChatStream, LlmError> {
    let body = match tokio::time::timeout(timeout, response.text()).await {
        Err(_) => return Err(LlmError::Timeout { after: timeout }),
        Ok(Err(e)) => return Err(LlmError::Truncated(error_chain(&e))),
        Ok(Ok(body)) => body,
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
    let completion = assembler.into_completion();
    items.push(Ok(StreamEvent::Completed(completion)));
    Ok(Box::pin(futures::stream::iter(items)))
}

type EventResult = Result<Event, EventStreamError<reqwest::Error>>;

/// State of an SSE [`ChatStream`] being consumed.
struct Driver {
    events: Pin<Box<dyn Stream<Item = EventResult> + Send>>,
    assembler: Option<Assembler>,
    pending: VecDeque<StreamEvent>,
    timeout: Duration,
    done: bool,
}

impl Driver {
    async fn next_item(&mut self) -> Option<Result<StreamEvent, LlmError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if self.done {
                return None;
            }
            let next = tokio::time::timeout(self.timeout, self.events.next()).await;
            let outcome = match next {
                Err(_) => self.end_early(LlmError::Timeout {
                    after: self.timeout,
                }),
                Ok(None) => self.end_early(LlmError::Truncated(
                    "the server closed the stream without a finish reason or [DONE]".into(),
                )),
                Ok(Some(Err(EventStreamError::Transport(e)))) => {
                    let err = transport_error(&e, self.timeout);
                    self.end_early(err)
                }
                Ok(Some(Err(EventStreamError::Utf8(e)))) => self.fail(LlmError::Malformed(
                    format!("stream is not valid UTF-8: {e}"),
                )),
                Ok(Some(Err(EventStreamError::Parser(e)))) => self.fail(LlmError::Malformed(
                    format!("invalid server-sent event: {e}"),
                )),
                Ok(Some(Ok(event))) => match self.assembler.as_mut().map(|a| a.handle(&event.data))
                {
                    Some(Ok(Step::Continue(events))) => {
                        self.pending.extend(events);
                        continue;
                    }
                    Some(Ok(Step::Done)) => self.complete(),
                    Some(Err(e)) => self.fail(e),
                    None => self.fail(LlmError::Malformed("stream already completed".into())),
                },
            };
            return Some(outcome);
        }
    }

    /// The stream stopped before `[DONE]`: fine if the answer was finished, else `err`.
    fn end_early(&mut self, err: LlmError) -> Result<StreamEvent, LlmError> {
        if self.assembler.as_ref().is_some_and(Assembler::finished) {
            tracing::debug!(reason = %err, "model stream ended after the finish reason but before [DONE]");
            self.complete()
        } else {
            self.fail(err)
        }
    }

    /// Marks the stream as over and releases the connection.
    fn finish(&mut self) {
        self.done = true;
        self.events = Box::pin(futures::stream::empty());
    }

    fn fail(&mut self, err: LlmError) -> Result<StreamEvent, LlmError> {
        tracing::debug!(error = %err, "model stream failed");
        self.finish();
        self.assembler = None;
        Err(err)
    }

    fn complete(&mut self) -> Result<StreamEvent, LlmError> {
        self.finish();
        match self.assembler.take() {
            Some(assembler) => {
                let completion = assembler.into_completion();
                tracing::debug!(
                    model = %completion.model,
                    finish_reason = %completion.finish_reason,
                    tool_calls = completion.tool_calls.len(),
                    usage = ?completion.usage,
                    "model stream completed"
                );
                Ok(StreamEvent::Completed(completion))
            }
            None => Err(LlmError::Malformed("stream already completed".into())),
        }
    }
}
