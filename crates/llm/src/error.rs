//! Errors returned by the chat client.

use std::time::Duration;

/// Everything that can go wrong while talking to a model server.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The HTTP connection could not be established (refused, DNS failure, TLS failure, connect
    /// timeout, connection reset before the response headers arrived).
    #[error("cannot reach the model server at {url}: {reason}")]
    Connect {
        /// Full URL of the request that failed.
        url: String,
        /// Human-readable cause, e.g. "connection refused".
        reason: String,
    },
    /// The server answered with a non-2xx status, or sent an error object inside the stream.
    #[error("model server returned HTTP {status}: {message}")]
    Http {
        /// HTTP status code (500 for in-stream errors without a numeric code).
        status: u16,
        /// The server's error message, or its raw (truncated) response body.
        message: String,
    },
    /// The server is rate limited or overloaded and asks to be called again
    /// later than the client waits by itself (or its retries ran out while
    /// it kept asking): the caller decides whether to wait.
    #[error("model server returned HTTP {status}: {message} (it asks to try again in {}s)", after.as_secs())]
    TryLater {
        /// HTTP status code (429, 503 or 529).
        status: u16,
        /// The server's error message.
        message: String,
        /// How long it asks to wait.
        after: Duration,
    },
    /// The server did not send anything for longer than the configured request timeout.
    #[error("model server did not respond within {after:?}")]
    Timeout {
        /// The timeout that elapsed.
        after: Duration,
    },
    /// The server sent something that is not a valid chat-completion stream.
    #[error("model server sent a malformed response: {0}")]
    Malformed(String),
    /// The stream ended (or broke) before the answer was complete (no finish reason or `[DONE]`,
    /// or no `"done": true` line from Ollama).
    #[error("model stream ended before the response was finished: {0}")]
    Truncated(String),
    /// The response grew past [`crate::ResponseLimits`]; the stream was
    /// stopped.
    #[error(
        "the model's answer was stopped because {0}; ask for a shorter answer or smaller tool \
         calls, or raise the limit in the [llm] configuration"
    )]
    TooLarge(String),
    /// The [`crate::ProviderConfig`] cannot be used.
    #[error("invalid model provider configuration: {0}")]
    InvalidConfig(String),
}

impl LlmError {
    /// Whether repeating the same request later may succeed.
    ///
    /// Connection failures, timeouts, truncated streams, rate limiting (429), request timeouts
    /// (408), conflicts (409) and server errors (5xx) are retryable; client errors, malformed
    /// responses and configuration errors are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Connect { .. } => true,
            LlmError::Http { status, .. } => matches!(*status, 408 | 409 | 425 | 429 | 500..=599),
            LlmError::Timeout { .. } => true,
            LlmError::TryLater { .. } => true,
            LlmError::Malformed(_) => false,
            LlmError::TooLarge(_) => false,
            LlmError::Truncated(_) => true,
            LlmError::InvalidConfig(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_messages_are_readable() {
        let e = LlmError::Connect {
            url: "http://127.0.0.1:1/v1/chat/completions".into(),
            reason: "connection refused".into(),
        };
        assert_eq!(
            e.to_string(),
            "cannot reach the model server at http://127.0.0.1:1/v1/chat/completions: connection refused"
        );
        let e = LlmError::Http {
            status: 404,
            message: "model 'x' not found".into(),
        };
        assert_eq!(
            e.to_string(),
            "model server returned HTTP 404: model 'x' not found"
        );
        let e = LlmError::Timeout {
            after: Duration::from_secs(30),
        };
        assert_eq!(e.to_string(), "model server did not respond within 30s");
        let e = LlmError::Truncated("connection closed".into());
        assert!(
            e.to_string()
                .starts_with("model stream ended before the response was finished")
        );
    }

    #[test]
    fn retryability() {
        let http = |status| LlmError::Http {
            status,
            message: String::new(),
        };
        assert!(http(429).is_retryable());
        assert!(http(503).is_retryable());
        assert!(!http(400).is_retryable());
        assert!(!http(404).is_retryable());
        assert!(LlmError::Truncated(String::new()).is_retryable());
        assert!(
            LlmError::Timeout {
                after: Duration::from_secs(1)
            }
            .is_retryable()
        );
        assert!(!LlmError::Malformed(String::new()).is_retryable());
        assert!(!LlmError::InvalidConfig(String::new()).is_retryable());
    }
}
