//! Context compaction: before a model call that would take more than a set
//! share of the model's context window, the oldest messages are replaced by
//! a summary the model writes (or, if that fails, dropped with a note).
//!
//! Nothing leaves the log: the `ContextCompacted` event names the seqs it
//! replaces, the conversation the model sees (the reducer's projection) uses
//! the summary, and the `recall` tool reads the originals back.

use crate::deps::Deps;
use agentry_llm::{ChatRequest, Message, StreamEvent};
use agentry_proto::sessions::v1 as pb;
use futures::StreamExt;
use std::fmt::Write as _;
use tracing::Instrument;

/// How tokens are counted.
#[derive(Clone, Copy)]
pub enum Tokenizer {
    /// A real byte-pair encoding (OpenAI's).
    Bpe(&'static tiktoken_rs::CoreBPE, &'static str),
    /// An estimate calibrated against the BPE encodings (see the tests).
    Estimate,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Tokens every message costs beyond its text (role and separators).
const PER_MESSAGE: usize = 4;

impl Tokenizer {
    /// The tokenizer for `model`: `configured` when set ("o200k_base",
    /// "cl100k_base", "estimate"), else the encoding known for the model
    /// name, else the estimate.
    pub fn for_model(model: &str, configured: &str) -> Tokenizer {
        use tiktoken_rs::tokenizer::Tokenizer as T;
        let kind = match configured {
            "o200k_base" => Some(T::O200kBase),
            "cl100k_base" => Some(T::Cl100kBase),
            "estimate" => None,
            _ => {
                // Served models are often named "provider/model".
                let name = model.rsplit('/').next().unwrap_or(model);
                tiktoken_rs::tokenizer::get_tokenizer(name)
            }
        };
        match kind {
            Some(T::O200kBase | T::O200kHarmony) => {
                Tokenizer::Bpe(tiktoken_rs::o200k_base_singleton(), "o200k_base")
            }
            Some(T::Cl100kBase) => {
                Tokenizer::Bpe(tiktoken_rs::cl100k_base_singleton(), "cl100k_base")
            }
            _ => Tokenizer::Estimate,
        }
    }

    /// The tokenizer's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Tokenizer::Bpe(_, name) => name,
            Tokenizer::Estimate => "estimate",
        }
    }

    /// Tokens of `text`.
    pub fn count(&self, text: &str) -> usize {
        match self {
            Tokenizer::Bpe(bpe, _) => bpe.encode_ordinary(text).len(),
            Tokenizer::Estimate => estimate(text),
        }
    }

    /// Tokens of one message as sent.
    pub fn message(&self, message: &Message) -> usize {
        PER_MESSAGE
            + match message {
                Message::System { content } | Message::User { content } => self.count(content),
                Message::Assistant {
                    content,
                    tool_calls,
                } => {
                    self.count(content)
                        + tool_calls
                            .iter()
                            .map(|c| PER_MESSAGE + self.count(&c.name) + self.count(&c.arguments))
                            .sum::<usize>()
                }
                Message::Tool {
                    tool_call_id,
                    content,
                } => self.count(tool_call_id) + self.count(content),
            }
    }
}

/// A token estimate without a vocabulary: runs of letters cost one token
/// per four characters (rounded up), runs of digits one per three, each
/// punctuation mark one, each non-ASCII character one, and whitespace runs
/// one per line break. Calibrated against cl100k_base on prose, code, JSON
/// and shell output; it errs on the high side.
pub fn estimate(text: &str) -> usize {
    #[derive(PartialEq, Clone, Copy)]
    enum Run {
        None,
        Alpha,
        Digit,
    }
    let mut tokens = 0usize;
    let mut run = Run::None;
    let mut len = 0usize;
    let close = |run: Run, len: usize| match run {
        Run::Alpha => len.div_ceil(4),
        Run::Digit => len.div_ceil(3),
        Run::None => 0,
    };
    for c in text.chars() {
        let kind = if c.is_ascii_alphabetic() {
            Run::Alpha
        } else if c.is_ascii_digit() {
            Run::Digit
        } else {
            Run::None
        };
        if kind != run {
            tokens += close(run, len);
            run = kind;
            len = 0;
        }
        match kind {
            Run::Alpha | Run::Digit => len += 1,
            Run::None if c == '\n' => tokens += 1,
            Run::None if c.is_whitespace() => {}
            Run::None => tokens += 1,
        }
    }
    tokens + close(run, len)
}

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
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            enabled: true,
            threshold: 0.8,
            keep_last: 6,
            context_window: 32_768,
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
    if c.summary.is_empty() {
        format!(
            "[{} earlier messages ({range}) were left out to fit the context window. Use the \
             recall tool with from_seq and to_seq to read them if you need them.]",
            c.messages
        )
    } else {
        format!(
            "[Summary of the earlier conversation ({range}), written to fit the context window. \
             Use the recall tool with from_seq and to_seq to read the original events.]\n{}",
            c.summary
        )
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
    let mut s = n.saturating_sub(keep).max(1);
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

/// The outcome of fitting a conversation into the window.
pub struct Fitted {
    /// The conversation to send.
    pub history: Vec<Message>,
    /// The compaction to record, if one was made.
    pub event: Option<pb::ContextCompacted>,
    /// Messages whose text was cut (in this request only) because even the
    /// newest messages alone do not fit.
    pub truncated: usize,
}

/// Makes `history` fit the budget: summarises (or drops) the oldest
/// messages when the request would pass the threshold, then, as a last
/// resort, shortens the longest messages of this request only. `overhead` is
/// what the request costs besides the conversation (system messages, tool
/// definitions); `spans` are the seqs each message stands for.
pub async fn fit(
    deps: &Deps,
    overhead: usize,
    history: Vec<Message>,
    spans: &[(u64, u64)],
) -> Fitted {
    let settings = &deps.compaction;
    let tokenizer = deps.tokenizer;
    let budget = settings.budget();
    // A token is at least one byte (for the estimate too): a conversation
    // whose bytes fit needs no counting.
    if !settings.enabled || overhead + upper_bound(&history) <= budget {
        return Fitted {
            history,
            event: None,
            truncated: 0,
        };
    }
    let counts: Vec<usize> = history.iter().map(|m| tokenizer.message(m)).collect();
    let total = overhead + counts.iter().sum::<usize>();
    if total <= budget {
        return Fitted {
            history,
            event: None,
            truncated: 0,
        };
    }
    // Room for the summary itself.
    let reserve = (budget / 4).min(2_000);
    let room = budget.saturating_sub(overhead + reserve);
    let is_tool: Vec<bool> = history
        .iter()
        .map(|m| matches!(m, Message::Tool { .. }))
        .collect();
    let split = choose_split(&counts, &is_tool, settings.keep_last, room)
        .filter(|_| spans.len() == history.len())
        // Replacing only an earlier summary gains nothing.
        .filter(|&s| !(s == 1 && matches!(history[0], Message::System { .. })));
    let Some(split) = split else {
        let (history, truncated) = shorten(history, &tokenizer, budget.saturating_sub(overhead));
        return Fitted {
            history,
            event: None,
            truncated,
        };
    };
    let (first_seq, last_seq) = (spans[0].0, spans[split - 1].1);
    let span = tracing::info_span!("compaction", first_seq, last_seq, messages = split);
    tracing::info!(
        parent: &span,
        tokens = total,
        budget,
        tokenizer = tokenizer.name(),
        "the conversation nears the context window; summarising older messages"
    );
    let summary = summarise(deps, &history[..split], reserve)
        .instrument(span)
        .await;
    let (summary, note) = match summary {
        Ok(summary) => (summary, String::new()),
        Err(e) => {
            tracing::warn!(error = %e, "summarising failed; dropping the oldest messages instead");
            (
                String::new(),
                format!("summarising failed ({e}); the oldest messages were left out instead"),
            )
        }
    };
    let mut event = pb::ContextCompacted {
        first_seq,
        last_seq,
        summary,
        messages: split as u32,
        tokens_before: total as u64,
        tokens_after: 0,
        note,
    };
    let mut compacted = Vec::with_capacity(history.len() - split + 1);
    compacted.push(Message::System {
        content: summary_message(&event),
    });
    compacted.extend(history.into_iter().skip(split));
    let (compacted, truncated) = shorten(compacted, &tokenizer, budget.saturating_sub(overhead));
    event.tokens_after = (overhead
        + compacted
            .iter()
            .map(|m| tokenizer.message(m))
            .sum::<usize>()) as u64;
    Fitted {
        history: compacted,
        event: Some(event),
        truncated,
    }
}

/// At least as many tokens as the messages take, whatever the tokenizer.
fn upper_bound(history: &[Message]) -> usize {
    history
        .iter()
        .map(|m| {
            PER_MESSAGE
                + match m {
                    Message::System { content } | Message::User { content } => content.len(),
                    Message::Assistant {
                        content,
                        tool_calls,
                    } => {
                        content.len()
                            + tool_calls
                                .iter()
                                .map(|c| PER_MESSAGE + c.name.len() + c.arguments.len())
                                .sum::<usize>()
                    }
                    Message::Tool {
                        tool_call_id,
                        content,
                    } => tool_call_id.len() + content.len(),
                }
        })
        .sum()
}

const SUMMARY_INSTRUCTIONS: &str = "You condense conversations between a person and an AI \
    agent that uses tools. Summarise the transcript you are given so that the agent can carry \
    on without it: the person's requests and preferences, decisions made, facts learned, files \
    and commands involved, tool results that still matter, and what remains to be done. Be \
    specific (names, paths, numbers); leave out pleasantries. Write plain text, no preamble.";

/// Asks the model for a summary of `messages`, of at most `max_tokens`.
async fn summarise(deps: &Deps, messages: &[Message], max_tokens: usize) -> Result<String, String> {
    // The transcript must leave room in the window for the instructions
    // and the answer.
    let limit = (deps.compaction.context_window / 2).max(256);
    let transcript = transcript(messages, &deps.tokenizer, limit);
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
            },
        ],
        tools: Vec::new(),
        temperature: deps.temperature,
    };
    let mut stream = deps.llm.stream(request).await.map_err(|e| e.to_string())?;
    let mut completion = None;
    while let Some(item) = stream.next().await {
        match item.map_err(|e| e.to_string())? {
            StreamEvent::TextDelta(_) => {}
            StreamEvent::Completed(c) => {
                completion = Some(c);
                break;
            }
        }
    }
    let text = completion
        .ok_or("the model stream ended without a complete response")?
        .text
        .trim()
        .to_string();
    if text.is_empty() {
        return Err("the model returned an empty summary".into());
    }
    Ok(clip_tokens(&text, &deps.tokenizer, max_tokens))
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
            Message::User { content } => format!("Person: {content}"),
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
    // Characters per message that fit, at about three characters a token.
    let per_message = (limit * 3 / rendered.len().max(1)).max(200);
    rendered
        .iter()
        .map(|r| elide_middle(r, per_message))
        .collect::<Vec<_>>()
        .join("\n\n")
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

/// Last resort: halves the longest message's text until the conversation
/// fits `room` tokens (the log keeps the full text). Returns how many
/// messages were shortened.
fn shorten(mut history: Vec<Message>, tokenizer: &Tokenizer, room: usize) -> (Vec<Message>, usize) {
    let mut shortened = std::collections::BTreeSet::new();
    for _ in 0..64 {
        let counts: Vec<usize> = history.iter().map(|m| tokenizer.message(m)).collect();
        if counts.iter().sum::<usize>() <= room {
            break;
        }
        let Some((i, _)) = counts.iter().enumerate().max_by_key(|(_, c)| **c) else {
            break;
        };
        let content = match &mut history[i] {
            Message::System { content }
            | Message::User { content }
            | Message::Assistant { content, .. }
            | Message::Tool { content, .. } => content,
        };
        let chars = content.chars().count();
        if chars < 64 {
            break;
        }
        let note = "[…shortened to fit the context window; the full text is in the session log…]";
        let keep = chars / 2;
        *content = format!(
            "{} {note} {}",
            content.chars().take(keep / 2).collect::<String>(),
            content.chars().skip(chars - keep / 2).collect::<String>()
        );
        shortened.insert(i);
    }
    let n = shortened.len();
    (history, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_llm::ToolCall;

    #[test]
    fn known_models_get_their_real_encoding() {
        assert_eq!(Tokenizer::for_model("gpt-4o-mini", "").name(), "o200k_base");
        assert_eq!(Tokenizer::for_model("gpt-4", "").name(), "cl100k_base");
        assert_eq!(
            Tokenizer::for_model("openai/gpt-4o", "").name(),
            "o200k_base"
        );
        assert_eq!(Tokenizer::for_model("llama3.1:8b", "").name(), "estimate");
        assert_eq!(
            Tokenizer::for_model("llama3.1:8b", "cl100k_base").name(),
            "cl100k_base"
        );
        assert_eq!(
            Tokenizer::for_model("gpt-4o", "estimate").name(),
            "estimate"
        );
        // The real encoding really counts: "hello world" is two tokens.
        assert_eq!(Tokenizer::for_model("gpt-4o", "").count("hello world"), 2);
    }

    /// The estimate stays within 0.8× and 1.6× of cl100k_base on the kinds
    /// of text a conversation holds (it should err on the high side).
    #[test]
    fn the_estimate_is_calibrated_against_a_real_encoding() {
        let bpe = Tokenizer::for_model("gpt-4", "");
        let samples = [
            include_str!("../../../README.md"),
            include_str!("../../../docs/architecture.md"),
            include_str!("reducer.rs"),
            include_str!("../../../config/default.toml"),
            r#"{"path": "src/main.rs", "content": "fn main() {\n    println!(\"hi\");\n}\n", "mode": 420}"#,
            "total 48\ndrwxr-xr-x  5 nobody nogroup 4096 Nov 23 17:47 .\n-rw-r--r--  1 nobody nogroup 1234 Nov 23 17:40 Cargo.toml\n",
        ];
        for sample in samples {
            let real = bpe.count(sample) as f64;
            let guess = estimate(sample) as f64;
            let ratio = guess / real;
            assert!(
                (0.8..=1.6).contains(&ratio),
                "estimate {guess} vs cl100k {real} (ratio {ratio:.2}) for {:.60}",
                sample
            );
        }
    }

    #[test]
    fn bytes_bound_the_tokens_of_every_tokenizer() {
        let history = vec![
            Message::User {
                content: include_str!("reducer.rs").into(),
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
    fn transcripts_fit_their_limit() {
        let long = "word ".repeat(5_000);
        let messages = vec![
            Message::User {
                content: long.clone(),
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

    #[test]
    fn shortening_is_the_last_resort() {
        let history = vec![
            Message::User {
                content: "short".into(),
            },
            Message::Tool {
                tool_call_id: "c".into(),
                content: "x ".repeat(4_000),
            },
        ];
        let (out, n) = shorten(history, &Tokenizer::Estimate, 500);
        assert_eq!(n, 1);
        let total: usize = out.iter().map(|m| Tokenizer::Estimate.message(m)).sum();
        assert!(total <= 500, "{total}");
        let Message::Tool { content, .. } = &out[1] else {
            panic!()
        };
        assert!(content.contains("shortened to fit"), "{content}");
    }
}
