//! Reading a server-sent-event response into a [`ChatStream`], for the
//! protocols that stream that way (OpenAI-compatible, Anthropic): the wait
//! for each event is bounded, transport and framing errors end the stream,
//! and a stream that stops early is complete only when the answer itself
//! was (a finish reason arrived).

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};

use crate::client::transport_error;
use crate::{ChatStream, Completion, LlmError, StreamEvent};

/// How one protocol assembles an answer from its events.
pub(crate) trait Assemble: Send + 'static {
    /// Takes one event, queueing the text deltas it carries; `Ok(true)` once
    /// the stream says it is over (`[DONE]`, `message_stop`).
    fn event(&mut self, event: &Event, out: &mut VecDeque<StreamEvent>) -> Result<bool, LlmError>;

    /// The answer is complete (its finish reason arrived): a stream that
    /// stops now has lost nothing.
    fn finished(&self) -> bool;

    /// The sizes of the answer so far, held to the response limits.
    fn sizes(&self) -> crate::limits::Sizes<'_>;

    /// The assembled answer.
    fn into_completion(self) -> Completion;
}

/// The stream of a `text/event-stream` response; `early_end` says what a
/// stream that stops before the answer is complete lacked.
pub(crate) fn stream<A: Assemble>(
    response: reqwest::Response,
    assembler: A,
    timeout: Duration,
    limits: crate::ResponseLimits,
    early_end: &'static str,
) -> ChatStream {
    // The SSE parser buffers a whole event: no line may grow past the
    // limit before it is parsed.
    let (body, line_too_long) =
        crate::limits::bounded_lines(response.bytes_stream(), limits.max_line_bytes());
    let driver = Driver {
        events: Box::pin(body.eventsource()),
        assembler: Some(assembler),
        pending: VecDeque::new(),
        timeout,
        limits,
        line_too_long,
        early_end,
        done: false,
    };
    Box::pin(futures::stream::unfold(driver, |mut d| async move {
        d.next_item().await.map(|item| (item, d))
    }))
}

type EventResult = Result<Event, EventStreamError<reqwest::Error>>;

/// State of an SSE [`ChatStream`] being consumed.
struct Driver<A> {
    events: Pin<Box<dyn Stream<Item = EventResult> + Send>>,
    assembler: Option<A>,
    pending: VecDeque<StreamEvent>,
    timeout: Duration,
    limits: crate::ResponseLimits,
    /// Raised when the raw stream was cut at a line past the limit.
    line_too_long: std::sync::Arc<std::sync::atomic::AtomicBool>,
    early_end: &'static str,
    done: bool,
}

impl<A: Assemble> Driver<A> {
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
                Ok(None)
                    if self
                        .line_too_long
                        .load(std::sync::atomic::Ordering::Acquire) =>
                {
                    let err = self.limits.line_too_long();
                    self.fail(err)
                }
                Ok(None) => self.end_early(LlmError::Truncated(self.early_end.into())),
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
                Ok(Some(Ok(event))) => {
                    let handled = match self.assembler.as_mut() {
                        Some(assembler) => assembler
                            .event(&event, &mut self.pending)
                            .and_then(|done| self.limits.check(&assembler.sizes()).map(|()| done)),
                        None => Err(LlmError::Malformed("stream already completed".into())),
                    };
                    match handled {
                        Ok(false) => continue,
                        Ok(true) => self.complete(),
                        Err(e) => self.fail(e),
                    }
                }
            };
            return Some(outcome);
        }
    }

    /// The stream stopped before its end: fine if the answer was finished,
    /// else `err`.
    fn end_early(&mut self, err: LlmError) -> Result<StreamEvent, LlmError> {
        if self.assembler.as_ref().is_some_and(A::finished) {
            tracing::debug!(reason = %err, "model stream ended after the finish reason but before its end");
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
        // Text already queued belongs to an answer that will not be kept.
        self.pending.clear();
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
