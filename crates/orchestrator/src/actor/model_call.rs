//! One model call: the reducer's request streamed, calls written as text
//! read back, and its answer (an unreadable call, or a failure) handed back
//! to the actor; and the summarising call a compaction asks for.

use super::*;
use crate::errors::ModelCallError;
use agentry_llm::{ChatRequest, StreamEvent};
use futures::StreamExt;

/// Where a model call's streamed text is shown.
pub(super) struct LiveText {
    pub session_id: String,
    pub turn_id: String,
    /// The last event decided before the call.
    pub after_seq: u64,
    /// The model to ask instead of the orchestrator's (a sub-agent's).
    pub model: Option<String>,
}

/// One model call with exactly the request the reducer decided.
pub(super) async fn model_call(
    deps: Arc<Deps>,
    request: ModelRequest,
    live: LiveText,
    task: u64,
    tx: mpsc::Sender<Outcome>,
) {
    if request.truncated > 0 {
        tracing::warn!(
            messages = request.truncated,
            "messages shortened in this request to fit the context window"
        );
    }
    let names = request.names();
    let native = request.native;
    let request = request.into_chat();
    let started = Instant::now();
    let failed = |message: String, retryable: bool| {
        let span = Span::current();
        span.record("outcome", "error");
        span.record("latency_ms", started.elapsed().as_millis() as u64);
        crate::metrics::model_call_finished(&deps.metrics, "error", started.elapsed(), None);
        Box::new((
            task,
            Input::ModelFailed {
                message: format!("model call failed: {message}"),
                retryable,
            },
        ))
    };
    let completion = match stream_once(&deps, &request, &live, &tx).await {
        Ok(Some(completion)) => completion,
        Ok(None) => return, // Nobody listens any more.
        Err(ModelCallError::Llm(agentry_llm::LlmError::TryLater {
            status,
            message,
            after,
        })) => {
            // Waiting longer than a retry: the turn parks until then.
            let span = Span::current();
            span.record("outcome", "parked");
            crate::metrics::model_call_finished(&deps.metrics, "parked", started.elapsed(), None);
            let until = std::time::SystemTime::now() + after;
            let until = until
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let parked = pb::TurnParked {
                reason: pb::ParkReason::RateLimit as i32,
                until: Some(prost_types::Timestamp {
                    seconds: until.as_secs() as i64,
                    nanos: until.subsec_nanos() as i32,
                }),
                message: format!(
                    "HTTP {status}: {}",
                    message.chars().take(300).collect::<String>()
                ),
            };
            let _ = tx
                .send(Box::new((task, Input::ModelTryLater(parked))))
                .await;
            return;
        }
        Err(error) => {
            let _ = tx
                .send(failed(error.to_string(), error.is_retryable()))
                .await;
            return;
        }
    };
    let elapsed = started.elapsed();
    let span = Span::current();
    span.record("outcome", "ok");
    span.record("latency_ms", elapsed.as_millis() as u64);
    if let Some(usage) = completion.usage {
        span.record("prompt_tokens", usage.prompt_tokens);
        span.record("completion_tokens", usage.completion_tokens);
    }
    crate::metrics::model_call_finished(&deps.metrics, "ok", elapsed, completion.usage);
    // The model answers: whatever was found wrong at start is past.
    if deps.model_problem().is_some() {
        deps.set_model_problem(None);
    }
    tracing::debug!(
        elapsed_ms = elapsed.as_millis() as u64,
        "model call finished"
    );
    // A tool call written as text that cannot be read goes back to the
    // reducer, which records it and decides the correction.
    let input = if completion.tool_calls.is_empty() {
        let usage = completion.usage;
        let new_id = || format!("text-{}", uuid::Uuid::now_v7().simple());
        match crate::prompt::read_text_calls(completion, &names, native, new_id) {
            Ok(completion) => Input::ModelDone(completion),
            Err((text, error)) => {
                tracing::info!(%error, "the model wrote a tool call that cannot be read");
                Input::ModelUnreadable { text, error, usage }
            }
        }
    } else {
        Input::ModelDone(completion)
    };
    let _ = tx.send(Box::new((task, input))).await;
}

/// One streamed request: text goes to the session's subscribers as it
/// comes (live, not logged); the complete answer is returned (`None` when
/// the actor is gone).
pub(super) async fn stream_once(
    deps: &Deps,
    request: &ChatRequest,
    live: &LiveText,
    tx: &mpsc::Sender<Outcome>,
) -> Result<Option<agentry_llm::Completion>, ModelCallError> {
    let llm = match &live.model {
        Some(model) => deps.llm().with_model(model),
        None => deps.llm(),
    };
    // Held until the answer is complete.
    let _turn = deps.model_turn().await;
    let mut stream = llm.stream(request).await?;
    while let Some(item) = stream.next().await {
        match item {
            Ok(StreamEvent::TextDelta(text)) => {
                if tx.is_closed() {
                    return Ok(None);
                }
                deps.live.publish(crate::live::text_delta(
                    &live.session_id,
                    &live.turn_id,
                    live.after_seq,
                    text,
                ));
            }
            Ok(StreamEvent::Completed(completion)) => return Ok(Some(completion)),
            Err(e) => return Err(e.into()),
        }
    }
    Err(ModelCallError::Unfinished)
}

/// Writes the summary a compaction asked for and hands it back (or why
/// there is none: the reducer then leaves the oldest messages out).
pub(super) async fn summary_call(
    deps: &Deps,
    view: &crate::prompt::View,
    job: CompactionJob,
    messages: Vec<Message>,
    task: u64,
    tx: mpsc::Sender<Outcome>,
) {
    tracing::info!(
        tokens = job.tokens_before,
        budget = view.compaction.budget(),
        tokenizer = view.tokenizer.name(),
        "the conversation nears the context window; summarising older messages"
    );
    let summary = crate::compaction::summarise(deps, view, &messages, job.max_tokens)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "summarising failed; dropping the oldest messages instead");
            e.to_string()
        });
    let _ = tx
        .send(Box::new((task, Input::Summarised { job, summary })))
        .await;
}
