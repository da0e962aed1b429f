//! The summarising model call that a compaction needs: the reducer decides
//! which messages to replace (`prompt::fit`) and asks for a summary with
//! `Effect::Summarise`; this writes it. The summary goes back to the reducer,
//! which records the `ContextCompacted` event (or, if summarising failed,
//! leaves the oldest messages out with a note).

use crate::deps::Deps;
use crate::errors::ModelCallError;
use agentry_llm::{ChatRequest, Message, StreamEvent};
use futures::StreamExt;
use std::fmt::Write as _;

pub use crate::tokens::{Tokenizer, context_window, estimate};

const SUMMARY_INSTRUCTIONS: &str = "You condense conversations between a person and an AI \
    agent that uses tools. Summarise the transcript you are given so that the agent can carry \
    on without it: the person's requests and preferences, decisions made, facts learned, files \
    and commands involved, tool results that still matter, and what remains to be done. Be \
    specific (names, paths, numbers); leave out pleasantries. Write plain text, no preamble.";

/// Asks the model for a summary of `messages`, of at most `max_tokens`
/// (counted, and the transcript fitted to the window, as `view` says).
pub async fn summarise(
    deps: &Deps,
    view: &crate::prompt::View,
    messages: &[Message],
    max_tokens: usize,
) -> Result<String, ModelCallError> {
    // The transcript must leave room in the window for the instructions
    // and the answer.
    let limit = (view.compaction.context_window / 2).max(256);
    let transcript = transcript(messages, &view.tokenizer, limit);
    let request = ChatRequest {
        messages: vec![
            Message::System {
                content: SUMMARY_INSTRUCTIONS.into(),
            },
            Message::User {
                content: format!(
                    "{transcript}\n\nSummarise the transcript above in at most {} words.",
                    (max_tokens * 2 / 3).max(50)
                ),
                images: Vec::new(),
            },
        ],
        tools: Vec::new(),
        temperature: view.temperature,
        require_tool: false,
    };
    // Counted with the other model calls (latency, tokens).
    let started = std::time::Instant::now();
    let completion = stream_summary(deps, request).await;
    let usage = completion.as_ref().ok().and_then(|c| c.usage);
    let outcome = if completion.is_ok() { "ok" } else { "error" };
    crate::metrics::model_call_finished(&deps.metrics, outcome, started.elapsed(), usage);
    let text = completion?.text.trim().to_string();
    if text.is_empty() {
        return Err(ModelCallError::EmptySummary);
    }
    Ok(clip_tokens(&text, &view.tokenizer, max_tokens))
}

async fn stream_summary(
    deps: &Deps,
    request: ChatRequest,
) -> Result<agentry_llm::Completion, ModelCallError> {
    let _turn = deps.model_turn().await;
    let mut stream = deps.llm().stream(request).await?;
    while let Some(item) = stream.next().await {
        match item? {
            StreamEvent::TextDelta(_) => {}
            StreamEvent::Completed(c) => return Ok(c),
        }
    }
    Err(ModelCallError::Unfinished)
}

/// `text` cut to about `max` tokens.
fn clip_tokens(text: &str, tokenizer: &Tokenizer, max: usize) -> String {
    if tokenizer.count(text) <= max {
        return text.to_string();
    }
    let mut chars = max * 3;
    loop {
        let cut: String = text.chars().take(chars).collect();
        if tokenizer.count(&cut) <= max || chars < 16 {
            return format!("{cut}…");
        }
        chars = chars * 3 / 4;
    }
}

/// The messages as a plain transcript of about `limit` tokens at most: long
/// messages lose their middle first.
pub fn transcript(messages: &[Message], tokenizer: &Tokenizer, limit: usize) -> String {
    let render = |m: &Message| -> String {
        match m {
            Message::System { content } => format!("(Earlier summary) {content}"),
            Message::User { content, images } if images.is_empty() => {
                format!("Person: {content}")
            }
            Message::User { content, images } => {
                format!("Person: {content}\n(with {} image(s))", images.len())
            }
            Message::Assistant {
                content,
                tool_calls,
            } => {
                let mut out = format!("Agent: {content}");
                for c in tool_calls {
                    let _ = write!(out, "\n[calls {} with {}]", c.name, c.arguments);
                }
                out
            }
            Message::Tool {
                tool_call_id,
                content,
            } => format!("[result of {tool_call_id}] {content}"),
        }
    };
    let rendered: Vec<String> = messages.iter().map(render).collect();
    let total: usize = rendered.iter().map(|r| tokenizer.count(r)).sum();
    if total <= limit {
        return rendered.join("\n\n");
    }
    // Characters per message that fit, at about three characters a token,
    // then fewer until the whole really fits.
    let mut per_message = (limit * 3 / rendered.len().max(1)).max(64);
    loop {
        let out = rendered
            .iter()
            .map(|r| elide_middle(r, per_message))
            .collect::<Vec<_>>()
            .join("\n\n");
        if per_message <= 64 || tokenizer.count(&out) <= limit {
            return out;
        }
        per_message = per_message * 2 / 3;
    }
}

fn elide_middle(text: &str, max_chars: usize) -> String {
    let count = text.chars().count();
    if count <= max_chars {
        return text.to_string();
    }
    let half = max_chars / 2;
    let head: String = text.chars().take(half).collect();
    let tail: String = text.chars().skip(count - half).collect();
    format!("{head} […{} characters left out…] {tail}", count - 2 * half)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use agentry_llm::ToolCall;

    #[test]
    fn transcripts_fit_their_limit() {
        let long = "word ".repeat(5_000);
        let messages = vec![
            Message::User {
                content: long.clone(),
                images: Vec::new(),
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "bash".into(),
                    arguments: r#"{"command":"ls"}"#.into(),
                }],
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: long,
            },
        ];
        let t = transcript(&messages, &Tokenizer::Estimate, 1_000);
        assert!(estimate(&t) <= 1_300, "{}", estimate(&t));
        assert!(t.contains("[calls bash with {\"command\":\"ls\"}]"), "{t}");
        assert!(t.contains("characters left out"), "{t}");
    }
}
