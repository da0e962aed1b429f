//! One model call: the prompt built, the request fitted to the context
//! window, streamed, and its answer (or failure) handed back to the actor.

use super::*;
use crate::errors::ModelCallError;
use agentry_llm::{ChatRequest, StreamEvent};
use futures::StreamExt;

/// What one model call needs besides the shared dependencies.
pub(super) struct ModelCall {
    /// The conversation.
    pub(super) history: Vec<Message>,
    /// The seqs each message of `history` stands for (the conversation is
    /// not compacted when they do not match it).
    pub(super) spans: Vec<(u64, u64)>,
    /// System messages for this call only (skillset, plan-mode guidance).
    pub(super) extra: Vec<String>,
    /// Offer the plan tools.
    pub(super) plan_mode: bool,
}

pub(super) async fn model_call(
    deps: Arc<Deps>,
    call: ModelCall,
    task: u64,
    tx: mpsc::Sender<Outcome>,
) {
    let tools = deps.tools().await;
    if tx
        .send((task, Input::ToolCatalog(tools.flags.clone())))
        .await
        .is_err()
    {
        return;
    }
    let prompt = crate::prompt::build(
        crate::prompt::Parts {
            system_prompt: &deps.system_prompt,
            extra: &call.extra,
            tools: &tools.definitions,
            tools_tokens: tools.tokens(&deps.tokenizer),
            plan_mode: call.plan_mode,
            native: deps.profile.native_tools,
        },
        &deps.tokenizer,
    );
    // Keep the request within the context window.
    let fitted = crate::compaction::fit(
        &deps,
        &prompt.head,
        prompt.tool_tokens,
        call.history,
        &call.spans,
    )
    .await;
    let overhead = fitted.overhead;
    let window = deps.compaction.context_window;
    if deps.compaction.enabled && fitted.tokens > window {
        let message = format!(
            "the request would take about {} tokens, more than the model's context window of \
             {window} (the system prompt, instructions and tool definitions alone take about \
             {overhead}); raise model_profiles.context_window if the model reads more",
            fitted.tokens
        );
        let _ = tx
            .send((
                task,
                Input::ModelFailed {
                    message: format!("model call not sent: {message}"),
                    retryable: false,
                },
            ))
            .await;
        return;
    }
    if fitted.truncated > 0 {
        tracing::warn!(
            messages = fitted.truncated,
            "messages shortened in this request to fit the context window"
        );
    }
    if let Some(event) = fitted.event
        && tx.send((task, Input::Compacted(event))).await.is_err()
    {
        return;
    }
    let names = prompt.names();
    let native = prompt.native;
    let mut request = prompt.request(fitted.history, deps.temperature);
    let started = Instant::now();
    let failed = |message: String, retryable: bool| {
        let span = Span::current();
        span.record("outcome", "error");
        span.record("latency_ms", started.elapsed().as_millis() as u64);
        crate::metrics::model_call_finished(&deps.metrics, "error", started.elapsed(), None);
        (
            task,
            Input::ModelFailed {
                message: format!("model call failed: {message}"),
                retryable,
            },
        )
    };
    // A tool call written as text that cannot be read gets one correction.
    let mut corrected = false;
    loop {
        let completion = match stream_once(&deps, request.clone(), task, &tx).await {
            Ok(Some(completion)) => completion,
            Ok(None) => return, // Nobody listens any more.
            Err(error) => {
                let _ = tx
                    .send(failed(error.to_string(), error.is_retryable()))
                    .await;
                return;
            }
        };
        let completion = if completion.tool_calls.is_empty() {
            match crate::prompt::read_text_calls(completion, &names, native) {
                Ok(completion) => completion,
                Err((text, error)) if !corrected => {
                    tracing::info!(%error, "asking the model to rewrite a malformed tool call");
                    corrected = true;
                    request.messages.push(Message::Assistant {
                        content: text,
                        tool_calls: Vec::new(),
                    });
                    request.messages.push(Message::User {
                        content: crate::textcalls::correction(&error),
                    });
                    continue;
                }
                Err((_, error)) => {
                    let message = format!(
                        "the model wrote a tool call that could not be read, even after being shown the format: {error}"
                    );
                    let _ = tx.send(failed(message, false)).await;
                    return;
                }
            }
        } else {
            completion
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
        tracing::debug!(
            elapsed_ms = elapsed.as_millis() as u64,
            "model call finished"
        );
        let _ = tx.send((task, Input::ModelDone(completion))).await;
        return;
    }
}

/// One streamed request: deltas go to the actor as they come; the complete
/// answer is returned (`None` when the actor is gone).
pub(super) async fn stream_once(
    deps: &Deps,
    request: ChatRequest,
    task: u64,
    tx: &mpsc::Sender<Outcome>,
) -> Result<Option<agentry_llm::Completion>, ModelCallError> {
    let mut stream = deps.llm.stream(request).await?;
    while let Some(item) = stream.next().await {
        match item {
            Ok(StreamEvent::TextDelta(text)) => {
                if tx.send((task, Input::ModelDelta(text))).await.is_err() {
                    return Ok(None);
                }
            }
            Ok(StreamEvent::Completed(completion)) => return Ok(Some(completion)),
            Err(e) => return Err(e.into()),
        }
    }
    Err(ModelCallError::Unfinished)
}
