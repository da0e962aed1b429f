//! Where and how to reach a model server.

use std::fmt;
use std::time::Duration;

/// The wire protocol spoken by the model server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Provider {
    /// OpenAI-compatible `POST {base_url}/chat/completions` streamed as server-sent events
    /// (OpenAI, vLLM, llama.cpp, LM Studio, Ollama's `/v1`, ...).
    #[default]
    OpenAi,
    /// Ollama's native `POST {base_url}/api/chat` streamed as newline-delimited JSON; `base_url`
    /// is the server root, e.g. `http://localhost:11434`.
    Ollama,
    /// Anthropic's Messages API: `POST {base_url}/v1/messages` streamed as server-sent events,
    /// the key in `x-api-key`; `base_url` is the API root, e.g. `https://api.anthropic.com`.
    Anthropic,
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Provider::OpenAi => "openai",
            Provider::Ollama => "ollama",
            Provider::Anthropic => "anthropic",
        })
    }
}

/// Where and how to reach a model server.
///
/// [`ProviderConfig::new`] fills in the defaults; every field is public for overriding.
#[derive(Clone)]
pub struct ProviderConfig {
    /// The wire protocol.
    pub provider: Provider,
    /// API root (a trailing slash is tolerated). For [`Provider::OpenAi`] e.g.
    /// `http://localhost:11434/v1`, requests go to `{base_url}/chat/completions`; for
    /// [`Provider::Ollama`] the server root, e.g. `http://localhost:11434`, requests go to
    /// `{base_url}/api/chat`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer <key>` when set and non-empty.
    pub api_key: Option<String>,
    /// Model name sent with every request.
    pub model: String,
    /// Longest wait for the response headers, and for each following piece of the stream.
    pub request_timeout: Duration,
    /// Longest wait for the TCP/TLS connection.
    pub connect_timeout: Duration,
    /// How many times a failed request is repeated (0 = never). Only failures before any output
    /// reached the caller are retried: connection errors, timeouts, HTTP 408, 429 and 5xx, and
    /// streams that break before their first event.
    pub max_retries: u32,
    /// The first backoff delay; it doubles with every retry (up to 10 s), with a little jitter.
    /// A `Retry-After` header of the server takes precedence (up to 60 s).
    pub retry_base_delay: Duration,
    /// How large one response may grow.
    pub limits: crate::ResponseLimits,
}

impl ProviderConfig {
    /// Default of [`ProviderConfig::request_timeout`].
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
    /// Default of [`ProviderConfig::connect_timeout`].
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default of [`ProviderConfig::max_retries`].
    pub const DEFAULT_MAX_RETRIES: u32 = 3;
    /// Default of [`ProviderConfig::retry_base_delay`].
    pub const DEFAULT_RETRY_BASE_DELAY: Duration = Duration::from_millis(500);

    /// A configuration with no API key and the default timeouts and retries.
    pub fn new(provider: Provider, base_url: impl Into<String>, model: impl Into<String>) -> Self {
        ProviderConfig {
            provider,
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            request_timeout: Self::DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            max_retries: Self::DEFAULT_MAX_RETRIES,
            retry_base_delay: Self::DEFAULT_RETRY_BASE_DELAY,
            limits: crate::ResponseLimits::default(),
        }
    }
}

impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field(
                "api_key",
                &self.api_key.as_ref().map(|k| {
                    if k.is_empty() {
                        "<empty>"
                    } else {
                        "<redacted>"
                    }
                }),
            )
            .field("model", &self.model)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_retries", &self.max_retries)
            .field("retry_base_delay", &self.retry_base_delay)
            .field("limits", &self.limits)
            .finish()
    }
}
