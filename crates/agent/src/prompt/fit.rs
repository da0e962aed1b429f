//! Fitting a request to the model's context window: when the conversation
//! would take more than a set share of the window, the oldest messages are
//! to be summarised (the summarising call is an effect the actor runs), and
//! as a last resort the longest messages are shortened in this request only.
//!
//! Nothing leaves the log: the `ContextCompacted` event names the seqs it
//! replaces, the conversation the model sees (the reducer's projection) uses
//! the summary, and the `recall` tool reads the originals back.
//!
//! Pure: no I/O.

use crate::tokens::{Tokenizer, measure};
use agentry_llm::Message;
use agentry_proto::sessions::v1 as pb;

/// Compaction settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Compaction is on.
    pub enabled: bool,
    /// Compact past this share of the context window.
    pub threshold: f32,
    /// Messages always kept at the end.
    pub keep_last: usize,
    /// The model's context window, in tokens.
    pub context_window: usize,
    /// Where the window comes from, for messages (a setting, or what the
    /// model server said).
    pub window_source: String,
}

/// The built-in `agent.compaction_threshold` (a test keeps the built-in
/// settings and these equal: the core reads no configuration).
pub const DEFAULT_THRESHOLD: f32 = 0.8;
/// The built-in `agent.compaction_keep_messages`.
pub const DEFAULT_KEEP_LAST: usize = 6;

impl Default for Settings {
    /// The built-in configuration's settings, for a model of unknown
    /// context window.
    fn default() -> Self {
        Settings {
            enabled: true,
            threshold: DEFAULT_THRESHOLD,
            keep_last: DEFAULT_KEEP_LAST,
            context_window: crate::tokens::context_window("", 0),
            window_source: "the default".to_string(),
        }
    }
}

impl Settings {
    /// Tokens a request may take.
    pub fn budget(&self) -> usize {
        (self.context_window as f64 * f64::from(self.threshold)) as usize
    }
}

/// The message the model sees in place of a replaced range.
pub fn summary_message(c: &pb::ContextCompacted) -> String {
    let range = format!("events {}–{}", c.first_seq, c.last_seq);
    match (c.summary.is_empty(), c.note.is_empty()) {
        (true, _) => format!(
            "[{} earlier messages ({range}) were left out to fit the context window. Use the \
             recall tool with from_seq and to_seq to read them if you need them.]",
            c.messages
        ),
        (false, true) => format!(
            "[Summary of the earlier conversation ({range}), written to fit the context window. \
             Use the recall tool with from_seq and to_seq to read the original events.]\n{}",
            c.summary
        ),
        (false, false) => format!(
            "[Summary of the start of the earlier conversation; the messages after it (up to \
             {range}) were left out to fit the context window. Use the recall tool with \
             from_seq and to_seq to read the original events.]\n{}",
            c.summary
        ),
    }
}

/// The summary inside a message made by [`summary_message`] ("" for one
/// without a summary).
fn summary_text(message: &str) -> &str {
    match message.split_once("]\n") {
        Some((header, text)) if header.starts_with('[') => text,
        _ => "",
    }
}

/// Where to cut the conversation: the number of leading messages to
/// replace, so that the rest (at least the last message, and `keep` messages
/// when they fit) takes at most `room` tokens and does not begin with a tool
/// result whose call is replaced. `None` when no cut leaves a valid rest.
pub fn choose_split(tokens: &[usize], is_tool: &[bool], keep: usize, room: usize) -> Option<usize> {
    let n = tokens.len();
    let valid = |s: usize| s >= 1 && s < n && !is_tool[s];
    let last_valid = (1..n).rev().find(|&s| valid(s))?;
    let mut s = n.saturating_sub(keep.max(1)).max(1);
    // Keep a tool result together with the call before it.
    while s > 1 && is_tool[s] {
        s -= 1;
    }
    if !valid(s) {
        s = (s..n).find(|&s| valid(s)).unwrap_or(last_valid);
    }
    let mut kept: usize = tokens[s..].iter().sum();
    while kept > room && s < last_valid {
        kept -= tokens[s];
        s += 1;
        while s < last_valid && !valid(s) {
            kept -= tokens[s];
            s += 1;
        }
    }
    Some(s)
}

/// A summary to be written before the model is called: which messages it
/// replaces and how long it may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionJob {
    /// The leading messages of the conversation it replaces.
    pub messages: usize,
    /// The seq of the first event they stand for.
    pub first_seq: u64,
    /// The seq of the latest event they stand for.
    pub last_seq: u64,
    /// The tokens of the request before.
    pub tokens_before: usize,
    /// The most tokens the summary may take.
    pub max_tokens: usize,
}

/// How a conversation goes into the request.
#[derive(Debug, Clone, PartialEq)]
pub enum Fit {
    /// Send it as it is, or with its longest messages shortened.
    Send {
        /// The conversation to send.
        history: Vec<Message>,
        /// Messages whose text was cut (in this request only) because even
        /// the newest messages alone do not fit.
        truncated: usize,
        /// The tokens of the request (an upper bound when nothing was
        /// counted).
        tokens: usize,
        /// The part of `tokens` that is not the conversation (an upper
        /// bound when nothing was counted).
        overhead: usize,
    },
    /// Summarise the oldest messages first.
    Summarise(CompactionJob),
}

/// Decides how `history` fits the budget. Besides the conversation the
/// request holds the `head` messages and tool definitions of `tool_tokens`
/// tokens; `spans` are the seqs each message stands for; the running turn
/// began with the message at `turn_start`. When the request would pass the
/// threshold, the oldest messages are to be summarised (if `may_summarise`:
/// not right after a summary); otherwise, or when no cut leaves a valid
/// rest, the longest messages are shortened.
///
/// A compaction never hurts the running turn: its user message and
/// everything after it (its tool exchange) are never summarised, and a
/// summary is only asked for when it makes the request smaller (what it
/// replaces takes more than the summary may). Shortening leaves the turn's
/// user message alone unless that message by itself takes more than half
/// the window.
#[allow(clippy::too_many_arguments)]
pub fn fit(
    settings: &Settings,
    tokenizer: Tokenizer,
    head: &[Message],
    tool_tokens: usize,
    history: &[Message],
    counts: Option<&[usize]>,
    spans: &[(u64, u64)],
    turn_start: usize,
    may_summarise: bool,
) -> Fit {
    let budget = settings.budget();
    // A token is at least one byte (for the estimate too): a request whose
    // bytes fit needs no counting (unless the counts are known already).
    let overhead = tool_tokens + upper_bound(head);
    let bound = match counts {
        Some(_) => 0,
        None => overhead + upper_bound(history),
    };
    if !settings.enabled || (counts.is_none() && bound <= budget) {
        return Fit::Send {
            history: history.to_vec(),
            truncated: 0,
            tokens: match counts {
                Some(counts) => overhead + counts.iter().sum::<usize>(),
                None => bound,
            },
            overhead,
        };
    }
    let overhead = tool_tokens + head.iter().map(|m| tokenizer.message(m)).sum::<usize>();
    let counts: Vec<usize> = match counts {
        Some(counts) if counts.len() == history.len() => counts.to_vec(),
        _ => history.iter().map(|m| tokenizer.message(m)).collect(),
    };
    let total = overhead + counts.iter().sum::<usize>();
    if total <= budget {
        return Fit::Send {
            history: history.to_vec(),
            truncated: 0,
            tokens: total,
            overhead,
        };
    }
    // Room for the summary itself.
    let reserve = (budget / 4).min(2_000);
    let room = budget.saturating_sub(overhead + reserve);
    let is_tool: Vec<bool> = history
        .iter()
        .map(|m| matches!(m, Message::Tool { .. }))
        .collect();
    // The cut falls at the running turn's user message at the latest.
    let turn_start = turn_start.min(history.len().saturating_sub(1));
    let turn_tail: usize = counts.get(turn_start + 1..).unwrap_or(&[]).iter().sum();
    let keep = settings
        .keep_last
        .saturating_sub(history.len().saturating_sub(turn_start + 1));
    let split = choose_split(
        counts.get(..=turn_start).unwrap_or(&[]),
        is_tool.get(..=turn_start).unwrap_or(&[]),
        keep,
        room.saturating_sub(turn_tail),
    )
    .filter(|_| may_summarise && spans.len() == history.len())
    // Replacing only an earlier summary gains nothing.
    .filter(|&s| !(s == 1 && matches!(history[0], Message::System { .. })))
    // A summary that may be as long as what it replaces makes nothing smaller.
    .filter(|&s| counts[..s].iter().sum::<usize>() > reserve);
    let Some(split) = split else {
        let protected =
            (counts.get(turn_start) <= Some(&(settings.context_window / 2))).then_some(turn_start);
        let (history, truncated, tokens) = shorten(
            history.to_vec(),
            &tokenizer,
            budget.saturating_sub(overhead),
            protected,
        );
        return Fit::Send {
            history,
            truncated,
            tokens: overhead + tokens,
            overhead,
        };
    };
    // Tool results sit in call order, not in the order they were recorded:
    // the range ends at the latest event of any replaced message.
    let first_seq = spans[0].0;
    let last_seq = spans[..split]
        .iter()
        .map(|s| s.1)
        .max()
        .unwrap_or(first_seq);
    Fit::Summarise(CompactionJob {
        messages: split,
        first_seq,
        last_seq,
        tokens_before: total,
        max_tokens: reserve,
    })
}

/// The event that records a compaction: the job's summary, or, when
/// summarising failed with `failure`, the oldest messages left out (an
/// earlier summary at the start of `history` is kept).
pub fn compaction_event(
    job: &CompactionJob,
    history: &[Message],
    summary: Result<String, String>,
) -> pb::ContextCompacted {
    let (summary, note) = match summary {
        Ok(summary) => (summary, String::new()),
        Err(failure) => {
            // Only what came after an earlier summary is lost to the model
            // (and can be recalled).
            let earlier = match history.first() {
                Some(Message::System { content }) => summary_text(content).to_string(),
                _ => String::new(),
            };
            (
                earlier,
                format!(
                    "summarising failed ({failure}); the oldest messages were left out instead"
                ),
            )
        }
    };
    pb::ContextCompacted {
        first_seq: job.first_seq,
        last_seq: job.last_seq,
        summary,
        messages: job.messages as u32,
        tokens_before: job.tokens_before as u64,
        tokens_after: 0,
        note,
    }
}

/// The conversation after `compaction`: its summary message, then the
/// messages it did not replace.
pub fn compacted(compaction: &pb::ContextCompacted, history: &[Message]) -> Vec<Message> {
    let mut out = Vec::with_capacity(history.len() + 1);
    out.push(Message::System {
        content: summary_message(compaction),
    });
    out.extend(history.iter().skip(compaction.messages as usize).cloned());
    out
}

/// At least as many tokens as the messages take, whatever the tokenizer.
fn upper_bound(messages: &[Message]) -> usize {
    messages.iter().map(|m| measure(m, str::len)).sum()
}

const SHORTENED: &str =
    "[…shortened to fit the context window; the session log has the full text…]";

/// Last resort: shortens the longest messages (their text, or a tool call's
/// arguments) until the conversation fits `room` tokens, in this request
/// only (the log keeps everything); the `protected` message is left whole.
/// Returns the conversation, how many messages were shortened, and its
/// tokens.
fn shorten(
    mut history: Vec<Message>,
    tokenizer: &Tokenizer,
    room: usize,
    protected: Option<usize>,
) -> (Vec<Message>, usize, usize) {
    let mut counts: Vec<usize> = history.iter().map(|m| tokenizer.message(m)).collect();
    let mut total: usize = counts.iter().sum();
    let mut stuck = vec![false; history.len()];
    if let Some(slot) = protected.and_then(|i| stuck.get_mut(i)) {
        *slot = true;
    }
    let mut shortened = std::collections::BTreeSet::new();
    while total > room {
        let Some(i) = (0..history.len())
            .filter(|&i| !stuck[i])
            .max_by_key(|&i| counts[i])
        else {
            break;
        };
        if !shrink(&mut history[i]) {
            stuck[i] = true;
            continue;
        }
        shortened.insert(i);
        total -= counts[i];
        counts[i] = tokenizer.message(&history[i]);
        total += counts[i];
    }
    (history, shortened.len(), total)
}

/// Halves the longest text of a message: its content, or the arguments of
/// one of its tool calls (replaced by a note, as they must stay JSON).
/// Returns false when there is nothing left to shorten.
fn shrink(message: &mut Message) -> bool {
    if let Message::Assistant {
        content,
        tool_calls,
    } = message
        && let Some(call) = tool_calls
            .iter_mut()
            .filter(|c| c.arguments.len() > 256)
            .max_by_key(|c| c.arguments.len())
        && call.arguments.len() > content.len()
    {
        call.arguments = serde_json::json!({
            "left_out": format!(
                "{} bytes of arguments, to fit the context window; the session log has them",
                call.arguments.len()
            )
        })
        .to_string();
        return true;
    }
    let content = match message {
        Message::System { content }
        | Message::User { content, .. }
        | Message::Assistant { content, .. }
        | Message::Tool { content, .. } => content,
    };
    let (head, tail) = match content.split_once(SHORTENED) {
        Some((head, tail)) => (head.trim_end().to_string(), tail.trim_start().to_string()),
        None => {
            let chars = content.chars().count();
            (
                content.chars().take(chars / 2).collect(),
                content.chars().skip(chars / 2).collect(),
            )
        }
    };
    let (h, t) = (head.chars().count(), tail.chars().count());
    if h + t < 64 {
        return false;
    }
    let head: String = head.chars().take(h / 2).collect();
    let tail: String = tail.chars().skip(t - t / 2).collect();
    *content = format!("{head} {SHORTENED} {tail}");
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use agentry_llm::ToolCall;

    #[test]
    fn bytes_bound_the_tokens_of_every_tokenizer() {
        let history = vec![
            Message::User {
                content: include_str!("../reducer/step.rs").into(),
                images: Vec::new(),
            },
            Message::Assistant {
                content: "ok ✓ — done".into(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "bash".into(),
                    arguments: r#"{"command":"ls -la /tmp && echo 1234567"}"#.into(),
                }],
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: "日本語のテキスト and 12345 numbers\n".repeat(50),
            },
        ];
        for tokenizer in [
            Tokenizer::Estimate,
            Tokenizer::for_model("gpt-4", ""),
            Tokenizer::for_model("gpt-4o", ""),
        ] {
            let counted: usize = history.iter().map(|m| tokenizer.message(m)).sum();
            assert!(counted <= upper_bound(&history), "{tokenizer:?}");
        }
    }

    #[test]
    fn the_split_keeps_the_last_messages() {
        let tokens = [10; 10];
        let is_tool = [false; 10];
        assert_eq!(choose_split(&tokens, &is_tool, 6, 1000), Some(4));
        // Fewer messages than kept: still one replaced.
        assert_eq!(choose_split(&tokens[..4], &is_tool[..4], 6, 1000), Some(1));
        // Nothing to replace in a single message.
        assert_eq!(choose_split(&tokens[..1], &is_tool[..1], 6, 1000), None);
    }

    #[test]
    fn the_split_never_separates_a_call_from_its_result() {
        // user, assistant(call), tool, tool, assistant(call), tool, user
        let tokens = [10; 7];
        let is_tool = [false, false, true, true, false, true, false];
        // keep 4 would start at index 3 (a tool result): move back to the call.
        assert_eq!(choose_split(&tokens, &is_tool, 4, 1000), Some(1));
        // keep 2 starts at index 5 (a result): back to its call at 4.
        assert_eq!(choose_split(&tokens, &is_tool, 2, 1000), Some(4));
    }

    #[test]
    fn the_split_keeps_fewer_messages_when_the_last_ones_are_too_big() {
        let tokens = [10, 10, 10, 10, 500, 10, 10];
        let is_tool = [false, false, true, false, false, true, false];
        // The 500-token message cannot stay within 100 tokens: cut past it,
        // and past the result that belongs to it.
        assert_eq!(choose_split(&tokens, &is_tool, 6, 100), Some(6));
        // With room, the keep count rules (moved back over the result at 2).
        assert_eq!(choose_split(&tokens, &is_tool, 5, 10_000), Some(1));
    }

    #[test]
    fn the_summary_message_names_the_range() {
        let c = pb::ContextCompacted {
            first_seq: 1,
            last_seq: 40,
            summary: "The person wants a report.".into(),
            messages: 12,
            ..Default::default()
        };
        let m = summary_message(&c);
        assert!(m.contains("events 1–40"), "{m}");
        assert!(m.ends_with("The person wants a report."), "{m}");
        let dropped = summary_message(&pb::ContextCompacted {
            summary: String::new(),
            ..c
        });
        assert!(dropped.contains("12 earlier messages"), "{dropped}");
        assert!(dropped.contains("recall"), "{dropped}");
    }

    #[test]
    fn shortening_is_the_last_resort() {
        let history = vec![
            Message::User {
                content: "short".into(),
                images: Vec::new(),
            },
            Message::Tool {
                tool_call_id: "c".into(),
                content: "x ".repeat(4_000),
            },
        ];
        let (out, n, tokens) = shorten(history, &Tokenizer::Estimate, 500, None);
        assert_eq!(n, 1);
        let total: usize = out.iter().map(|m| Tokenizer::Estimate.message(m)).sum();
        assert!(total <= 500, "{total}");
        assert_eq!(tokens, total);
        let Message::Tool { content, .. } = &out[1] else {
            panic!()
        };
        assert!(content.contains("shortened to fit"), "{content}");
        assert_eq!(content.matches(SHORTENED).count(), 1, "{content}");
    }

    #[test]
    fn huge_tool_arguments_are_shortened_as_valid_json() {
        let history = vec![
            Message::User {
                content: "write it".into(),
                images: Vec::new(),
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "w".into(),
                    name: "write_file".into(),
                    arguments: serde_json::json!({"path": "a", "content": "x y ".repeat(20_000)})
                        .to_string(),
                }],
            },
        ];
        let (out, n, tokens) = shorten(history, &Tokenizer::Estimate, 300, None);
        assert_eq!(n, 1);
        assert!(tokens <= 300, "{tokens}");
        let Message::Assistant { tool_calls, .. } = &out[1] else {
            panic!()
        };
        let args: serde_json::Value = serde_json::from_str(&tool_calls[0].arguments).unwrap();
        assert!(
            args["left_out"]
                .as_str()
                .unwrap()
                .contains("bytes of arguments")
        );
    }

    #[test]
    fn an_earlier_summary_is_found_in_its_message() {
        let c = pb::ContextCompacted {
            first_seq: 1,
            last_seq: 9,
            summary: "line one\nline two".into(),
            messages: 3,
            ..Default::default()
        };
        assert_eq!(summary_text(&summary_message(&c)), "line one\nline two");
        let partial = pb::ContextCompacted {
            note: "summarising failed (x)".into(),
            ..c.clone()
        };
        let m = summary_message(&partial);
        assert!(m.contains("were left out"), "{m}");
        assert_eq!(summary_text(&m), "line one\nline two");
        let dropped = pb::ContextCompacted {
            summary: String::new(),
            ..partial
        };
        assert_eq!(summary_text(&summary_message(&dropped)), "");
    }

    #[test]
    fn a_zero_keep_count_keeps_one() {
        assert_eq!(choose_split(&[1, 1, 1], &[false; 3], 0, 100), Some(2));
    }
}

#[cfg(test)]
mod turn_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use agentry_llm::ToolCall;

    fn words(n: usize) -> String {
        "word ".repeat(n)
    }

    fn settings(window: usize, keep_last: usize) -> Settings {
        Settings {
            enabled: true,
            threshold: 0.8,
            keep_last,
            context_window: window,
            window_source: "test".into(),
        }
    }

    /// An earlier turn, then the running one: its question, a call, and a
    /// large result.
    fn conversation(earlier: usize, result: usize) -> Vec<Message> {
        vec![
            Message::user(words(earlier)),
            Message::assistant(words(earlier)),
            Message::user("what is in notes.txt?"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"notes.txt"}"#.into(),
                }],
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: words(result),
            },
        ]
    }

    fn spans(n: usize) -> Vec<(u64, u64)> {
        (1..=n as u64).map(|s| (s, s)).collect()
    }

    #[test]
    fn the_running_turn_is_never_summarised() {
        // keep_last 1 would once have cut inside the running turn.
        let history = conversation(800, 1500);
        let fitted = fit(
            &settings(2048, 1),
            Tokenizer::Estimate,
            &[],
            0,
            &history,
            None,
            &spans(5),
            2,
            true,
        );
        match fitted {
            Fit::Summarise(job) => assert_eq!(job.messages, 2, "only the earlier turn"),
            other => panic!("expected a summary, got {other:?}"),
        }
    }

    #[test]
    fn a_summary_that_would_not_shrink_the_request_is_not_asked_for() {
        // The earlier turn is smaller than a summary may be: shortening the
        // tool result is all that helps, and the question stays whole.
        let history = conversation(20, 6000);
        let fitted = fit(
            &settings(4096, 1),
            Tokenizer::Estimate,
            &[],
            0,
            &history,
            None,
            &spans(5),
            2,
            true,
        );
        let Fit::Send {
            history: sent,
            truncated,
            ..
        } = fitted
        else {
            panic!("expected a send, got {fitted:?}");
        };
        assert_eq!(truncated, 1);
        assert_eq!(sent[2], history[2], "the question is whole");
        assert!(matches!(&sent[4], Message::Tool { content, .. } if content.contains(SHORTENED)));
    }

    #[test]
    fn the_question_is_shortened_only_when_it_alone_fills_half_the_window() {
        let question = vec![Message::user(words(3000))];
        let fitted = fit(
            &settings(2048, 6),
            Tokenizer::Estimate,
            &[],
            0,
            &question,
            None,
            &spans(1),
            0,
            true,
        );
        assert!(
            matches!(fitted, Fit::Send { truncated: 1, .. }),
            "{fitted:?}"
        );
        let question = vec![Message::user(words(1500))];
        let fitted = fit(
            &settings(4096, 6),
            Tokenizer::Estimate,
            &[Message::system(words(2000))],
            0,
            &question,
            None,
            &spans(1),
            0,
            true,
        );
        // Left whole: the turn then fails for want of room rather than
        // answering a question it was not shown.
        assert!(
            matches!(fitted, Fit::Send { truncated: 0, .. }),
            "{fitted:?}"
        );
    }
}
