//! Counting tokens: a real byte-pair encoding for the models that have one
//! (OpenAI's), else an estimate calibrated against them; and the context
//! window to plan for. Pure: compaction uses it to fit a request to the
//! window.

use agentry_llm::{Message, ToolDefinition};

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

/// Texts are encoded in pieces of about this many bytes, cut after a line
/// break where there is one, so that no run of text is unboundedly long.
const BPE_CHUNK: usize = 16 * 1024;

/// `text` in pieces of at most about `size` bytes, each ending at a line
/// break when one is near, else at a character boundary.
fn chunks(text: &str, size: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        if rest.len() <= size {
            return Some(std::mem::take(&mut rest));
        }
        let mut end = size;
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        if let Some(newline) = rest[..end].rfind('\n')
            && newline >= size / 2
        {
            end = newline + 1;
        }
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

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
            Tokenizer::Bpe(bpe, _) => chunks(text, BPE_CHUNK)
                .map(|chunk| {
                    // The encoder's regex can fail on pathological input
                    // (and then panics): fall back to the estimate.
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        bpe.encode_ordinary(chunk).len()
                    }))
                    .unwrap_or_else(|_| estimate(chunk))
                })
                .sum(),
            Tokenizer::Estimate => estimate(text),
        }
    }

    /// Tokens of one message as sent.
    pub fn message(&self, message: &Message) -> usize {
        measure(message, |text| self.count(text))
    }

    /// Tokens of tool definitions as offered to the model.
    pub fn definitions(&self, definitions: &[ToolDefinition]) -> usize {
        definitions
            .iter()
            .map(|d| self.count(&d.parameters.to_string()) + self.count(&d.description) + 8)
            .sum()
    }
}

/// What one image is counted as: about what the model servers charge for
/// an image at the size they scale it down to (Anthropic: width × height /
/// 750 for at most 1.15 megapixels; OpenAI: 765 for 1024 × 1024).
pub(crate) const IMAGE_TOKENS: usize = 1600;

/// The cost of one message as sent: `cost` of each text it carries, plus
/// the framing of the message and of each tool call.
pub(crate) fn measure(message: &Message, cost: impl Fn(&str) -> usize) -> usize {
    PER_MESSAGE
        + match message {
            Message::System { content } => cost(content),
            Message::User { content, images } => cost(content) + images.len() * IMAGE_TOKENS,
            Message::Assistant {
                content,
                tool_calls,
            } => {
                cost(content)
                    + tool_calls
                        .iter()
                        .map(|c| PER_MESSAGE + cost(&c.name) + cost(&c.arguments))
                        .sum::<usize>()
            }
            Message::Tool {
                tool_call_id,
                content,
            } => cost(tool_call_id) + cost(content),
        }
}

/// A token estimate without a vocabulary: runs of letters cost one token
/// per four characters (rounded up), runs of digits one per three, runs of
/// ASCII punctuation one per three (`":"`, `{"` and `"}}` are single
/// tokens in the common encodings), each non-ASCII character one, and whitespace
/// runs one per line break. Calibrated against cl100k_base on prose, code,
/// JSON and shell output; it errs on the high side.
pub fn estimate(text: &str) -> usize {
    #[derive(PartialEq, Clone, Copy)]
    enum Run {
        None,
        Alpha,
        Digit,
        Punct,
    }
    let mut tokens = 0usize;
    let mut run = Run::None;
    let mut len = 0usize;
    let close = |run: Run, len: usize| match run {
        Run::Alpha => len.div_ceil(4),
        Run::Digit => len.div_ceil(3),
        Run::Punct => len.div_ceil(3),
        Run::None => 0,
    };
    for c in text.chars() {
        let kind = if c.is_ascii_alphabetic() {
            Run::Alpha
        } else if c.is_ascii_digit() {
            Run::Digit
        } else if c.is_ascii_punctuation() {
            Run::Punct
        } else {
            Run::None
        };
        if kind != run {
            tokens += close(run, len);
            run = kind;
            len = 0;
        }
        match kind {
            Run::Alpha | Run::Digit | Run::Punct => len += 1,
            Run::None if c == '\n' => tokens += 1,
            Run::None if c.is_whitespace() => {}
            Run::None => tokens += 1,
        }
    }
    tokens + close(run, len)
}

/// The context window to plan for: `configured` when set, else the size
/// known for the model name (OpenAI's models, Anthropic's Claude models),
/// else 32,768 tokens.
pub fn context_window(model: &str, configured: u32) -> usize {
    if configured > 0 {
        return configured as usize;
    }
    let name = model.rsplit('/').next().unwrap_or(model);
    if name.starts_with("claude-") {
        return 200_000;
    }
    tiktoken_rs::model::get_context_size(name).unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

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
            include_str!("reducer/step.rs"),
            include_str!("../../../config/default.toml"),
            r#"{"path": "src/main.rs", "content": "fn main() {\n    println!(\"hi\");\n}\n", "mode": 420}"#,
            // A tool's schema as sent, compact.
            r#"{"type":"object","properties":{"command":{"type":"string","description":"The command to run."},"timeout_secs":{"type":"integer","minimum":1}},"required":["command"],"additionalProperties":false}"#,
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
    fn long_texts_are_counted_in_pieces() {
        let bpe = Tokenizer::for_model("gpt-4o", "");
        // A very long run without a break, and many lines.
        let run = "a".repeat(200_000);
        assert!(bpe.count(&run) > 0);
        let lines = "hello world, this is a line\n".repeat(5_000);
        let whole = tiktoken_rs::o200k_base_singleton()
            .encode_ordinary(&lines)
            .len();
        assert_eq!(bpe.count(&lines), whole);
        let pieces: Vec<&str> = chunks("ab\ncd✓ef", 4).collect();
        assert_eq!(pieces.concat(), "ab\ncd✓ef");
        assert!(pieces.iter().all(|p| p.len() <= 4), "{pieces:?}");
    }

    #[test]
    fn context_windows_come_from_config_or_the_model_name() {
        assert_eq!(context_window("gpt-4o-mini", 0), 128_000);
        assert_eq!(context_window("openai/gpt-4o", 0), 128_000);
        assert_eq!(context_window("qwen2.5:7b", 0), 32_768);
        assert_eq!(context_window("claude-sonnet-4-5", 0), 200_000);
        assert_eq!(context_window("anthropic/claude-3-5-haiku", 0), 200_000);
        assert_eq!(context_window("gpt-4o", 8_192), 8_192);
    }
}
