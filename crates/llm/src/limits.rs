//! How large one model response may grow. A model server is not trusted:
//! a 64 MiB tool call once grew the orchestrator past a gigabyte and an
//! event the store refused stopped a session. Every protocol's reader
//! holds a response to [`ResponseLimits`]:
//!
//! - the raw stream: no line (an SSE event's data, an NDJSON line, a whole
//!   JSON body) longer than [`ResponseLimits::max_line_bytes`] is buffered;
//! - the assembled answer: its text and all its tool calls' arguments
//!   together at most `max_response_bytes`, each call's arguments at most
//!   `max_tool_arguments_bytes`.
//!
//! Past either, the reader stops reading (the connection is dropped) and
//! the stream ends with [`LlmError::TooLarge`], which is not retried.

use crate::LlmError;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What one response may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseLimits {
    /// Text and every tool call's arguments of one response together, in
    /// bytes.
    pub max_response_bytes: usize,
    /// The arguments of one tool call, in bytes.
    pub max_tool_arguments_bytes: usize,
}

impl Default for ResponseLimits {
    fn default() -> Self {
        ResponseLimits {
            max_response_bytes: Self::DEFAULT_RESPONSE_BYTES,
            max_tool_arguments_bytes: Self::DEFAULT_TOOL_ARGUMENTS_BYTES,
        }
    }
}

/// The sizes of a response assembled so far.
pub(crate) struct Sizes<'a> {
    /// Bytes of answer text.
    pub text: usize,
    /// Each tool call's name and the bytes of its arguments.
    pub calls: Vec<(&'a str, usize)>,
}

impl<'a> Sizes<'a> {
    /// The sizes of an answer with `text` and these calls (name, arguments).
    pub(crate) fn of(text: &str, calls: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Sizes {
            text: text.len(),
            calls: calls
                .into_iter()
                .map(|(name, arguments)| (name, arguments.len()))
                .collect(),
        }
    }
}

impl ResponseLimits {
    /// Default of [`ResponseLimits::max_response_bytes`]: 1 MiB.
    pub const DEFAULT_RESPONSE_BYTES: usize = 1024 * 1024;
    /// Default of [`ResponseLimits::max_tool_arguments_bytes`]: 256 KiB.
    pub const DEFAULT_TOOL_ARGUMENTS_BYTES: usize = 256 * 1024;

    /// The longest line of the raw stream that is buffered: a whole
    /// response in one line with every character JSON-escaped (`\u00XX`,
    /// six bytes), plus room for the envelope around it.
    pub(crate) fn max_line_bytes(&self) -> usize {
        self.max_response_bytes
            .saturating_mul(6)
            .saturating_add(64 * 1024)
    }

    /// Whether a response of `sizes` is still within the limits.
    pub(crate) fn check(&self, sizes: &Sizes<'_>) -> Result<(), LlmError> {
        for (name, bytes) in &sizes.calls {
            if *bytes > self.max_tool_arguments_bytes {
                return Err(LlmError::TooLarge(format!(
                    "the arguments of its call of {name:?} passed {} bytes \
                     (llm.max_tool_arguments_bytes)",
                    self.max_tool_arguments_bytes
                )));
            }
        }
        let total = sizes
            .calls
            .iter()
            .fold(sizes.text, |sum, (_, bytes)| sum.saturating_add(*bytes));
        if total > self.max_response_bytes {
            return Err(LlmError::TooLarge(format!(
                "its text and tool calls passed {} bytes (llm.max_response_bytes)",
                self.max_response_bytes
            )));
        }
        Ok(())
    }

    /// The error for a line of the raw stream past [`Self::max_line_bytes`].
    pub(crate) fn line_too_long(&self) -> LlmError {
        LlmError::TooLarge(format!(
            "one line of its stream passed {} bytes (six times llm.max_response_bytes, for \
             JSON escapes, plus 64 KiB)",
            self.max_line_bytes()
        ))
    }
}

/// Reads `response`'s body, at most `max` bytes of it: the text (invalid
/// UTF-8 replaced) and whether more was left unread.
pub(crate) async fn read_body(
    response: reqwest::Response,
    max: usize,
) -> Result<(String, bool), reqwest::Error> {
    use futures::StreamExt;
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        let room = max - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((String::from_utf8_lossy(&body).into_owned(), true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((String::from_utf8_lossy(&body).into_owned(), false))
}

/// A byte stream that ends, raising the returned flag, once more than
/// `max` bytes arrive without a line break: a reader that buffers whole
/// lines (the SSE parser) then never holds more than that.
pub(crate) fn bounded_lines<S, B, E>(
    body: S,
    max: usize,
) -> (
    impl futures::Stream<Item = Result<B, E>> + Send + 'static,
    Arc<AtomicBool>,
)
where
    S: futures::Stream<Item = Result<B, E>> + Send + 'static,
    B: AsRef<[u8]> + Send + 'static,
    E: Send + 'static,
{
    use futures::StreamExt;
    let exceeded = Arc::new(AtomicBool::new(false));
    let flag = exceeded.clone();
    let bounded = body.scan(0usize, move |since_break, item| {
        let keep = match &item {
            Ok(bytes) => {
                let bytes = bytes.as_ref();
                match bytes.iter().rposition(|&b| b == b'\n' || b == b'\r') {
                    Some(at) => *since_break = bytes.len() - at - 1,
                    None => *since_break = since_break.saturating_add(bytes.len()),
                }
                *since_break <= max
            }
            Err(_) => true,
        };
        if !keep {
            flag.store(true, Ordering::Release);
        }
        futures::future::ready(keep.then_some(item))
    });
    (bounded, exceeded)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sizes_are_held_to_both_limits() {
        let limits = ResponseLimits {
            max_response_bytes: 100,
            max_tool_arguments_bytes: 40,
        };
        let ok = Sizes {
            text: 50,
            calls: vec![("bash", 40)],
        };
        assert!(limits.check(&ok).is_ok());
        let one_call = Sizes {
            text: 0,
            calls: vec![("bash", 41)],
        };
        let err = limits.check(&one_call).unwrap_err().to_string();
        assert!(
            err.contains("\"bash\"") && err.contains("40 bytes"),
            "{err}"
        );
        let total = Sizes {
            text: 70,
            calls: vec![("a", 20), ("b", 20)],
        };
        let err = limits.check(&total).unwrap_err().to_string();
        assert!(err.contains("max_response_bytes"), "{err}");
        assert!(!LlmError::TooLarge(String::new()).is_retryable());
    }

    #[tokio::test]
    async fn a_stream_without_line_breaks_is_cut() {
        use futures::StreamExt;
        let chunks: Vec<Result<Vec<u8>, ()>> = vec![
            Ok(b"data: a\n".to_vec()),
            Ok(vec![b'x'; 60]),
            Ok(b"\n".to_vec()),
            Ok(vec![b'y'; 60]),
            Ok(vec![b'y'; 60]),
            Ok(b"never".to_vec()),
        ];
        let (bounded, exceeded) = bounded_lines(futures::stream::iter(chunks), 100);
        let got: Vec<_> = bounded.collect().await;
        assert_eq!(got.len(), 4, "the stream ends at the second y chunk");
        assert!(exceeded.load(Ordering::Acquire));
    }
}
