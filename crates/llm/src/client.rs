//! The HTTP client: request sending, error answers and retries.

use std::error::Error as _;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt};
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use serde_json::Value;

use crate::assemble::snippet;
use crate::retry::{
    OVERLOADED_WAIT, RETRY_WINDOW, backoff, parse_reset, parse_retry_after, should_retry,
};
use crate::{ChatRequest, LlmError, Provider, ProviderConfig, StreamEvent, ollama, openai};

/// Longest error body quoted in [`LlmError::Http`].
const MAX_ERROR_BODY_CHARS: usize = 2000;

/// Most of an error response's body that is read.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// The stream of a chat completion: text deltas as they arrive, then one
/// [`StreamEvent::Completed`]. An `Err` item ends the stream.
pub type ChatStream = Pin<Box<dyn Stream<Item = Result<StreamEvent, LlmError>> + Send>>;

/// A client of one model on one server. Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct ChatClient {
    pub(crate) http: reqwest::Client,
    pub(crate) provider: Provider,
    pub(crate) url: Arc<str>,
    pub(crate) model: Arc<str>,
    pub(crate) auth: Option<HeaderValue>,
    /// The context window asked for with each request, where the protocol
    /// has a way to (Ollama's `options.num_ctx`).
    num_ctx: Option<u32>,
    /// Keys added to every request body.
    extra_body: Option<Arc<serde_json::Map<String, Value>>>,
    request_timeout: Duration,
    max_retries: u32,
    retry_base_delay: Duration,
    limits: crate::ResponseLimits,
    headers_hook: Option<fn(&mut reqwest::header::HeaderMap)>,
}

impl fmt::Debug for ChatClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatClient")
            .field("provider", &self.provider)
            .field("url", &self.url)
            .field("model", &self.model)
            .field("authenticated", &self.auth.is_some())
            .field("request_timeout", &self.request_timeout)
            .field("max_retries", &self.max_retries)
            .field("retry_base_delay", &self.retry_base_delay)
            .field("limits", &self.limits)
            .finish()
    }
}

/// How long a failed answer asks to wait: `Retry-After` (or
/// `retry-after-ms`), else for a 429 the latest of the rate-limit reset
/// headers (OpenAI's `x-ratelimit-reset-*`, Anthropic's
/// `anthropic-ratelimit-*-reset`) whose remaining count is spent.
fn wait_hint(headers: &reqwest::header::HeaderMap, status: u16) -> Option<Duration> {
    let now = SystemTime::now();
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(wait) = text(RETRY_AFTER.as_str()).and_then(|v| parse_retry_after(v, now)) {
        return Some(wait);
    }
    if let Some(ms) = text("retry-after-ms")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
    {
        return Some(Duration::from_secs_f64(ms / 1000.0).min(crate::retry::MAX_WAIT));
    }
    if status != 429 {
        return None;
    }
    let limits = [
        (
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ),
        ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
        (
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        ),
        (
            "anthropic-ratelimit-tokens-remaining",
            "anthropic-ratelimit-tokens-reset",
        ),
        (
            "anthropic-ratelimit-input-tokens-remaining",
            "anthropic-ratelimit-input-tokens-reset",
        ),
        (
            "anthropic-ratelimit-output-tokens-remaining",
            "anthropic-ratelimit-output-tokens-reset",
        ),
    ];
    limits
        .iter()
        .filter(|(remaining, _)| text(remaining).is_none_or(|r| r.trim() == "0"))
        .filter_map(|(_, reset)| text(reset).and_then(|v| parse_reset(v, now)))
        .max()
}

/// A failed attempt, before any output reached the caller.
struct Failure {
    err: LlmError,
    /// The server's `Retry-After`, when it sent one.
    retry_after: Option<Duration>,
}

impl From<LlmError> for Failure {
    fn from(err: LlmError) -> Self {
        Failure {
            err,
            retry_after: None,
        }
    }
}

impl ChatClient {
    /// Validates the configuration and builds the HTTP client (no request is made).
    ///
    /// # Errors
    ///
    /// [`LlmError::InvalidConfig`] when the base URL is not an http(s) URL, the model name is
    /// empty, a timeout is zero or the API key cannot be sent in a header.
    pub fn new(cfg: ProviderConfig) -> Result<Self, LlmError> {
        let base = cfg.base_url.trim().trim_end_matches('/');
        if base.is_empty() {
            return Err(LlmError::InvalidConfig("base_url is empty".into()));
        }
        let url = match cfg.provider {
            Provider::OpenAi => format!("{base}/chat/completions"),
            Provider::Ollama => format!("{base}/api/chat"),
            Provider::Anthropic if base.ends_with("/v1") => format!("{base}/messages"),
            Provider::Anthropic => format!("{base}/v1/messages"),
        };
        let parsed = reqwest::Url::parse(&url).map_err(|e| {
            LlmError::InvalidConfig(format!(
                "base_url '{}' is not a valid URL: {e}",
                cfg.base_url
            ))
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(LlmError::InvalidConfig(format!(
                "base_url '{}' must start with http:// or https://",
                cfg.base_url
            )));
        }
        if cfg.provider == Provider::Ollama && base.ends_with("/v1") {
            tracing::warn!(
                base_url = %cfg.base_url,
                "the ollama provider expects the server root as base_url (e.g. \
                 http://localhost:11434), not its OpenAI-compatible /v1 path"
            );
        }
        if cfg.model.trim().is_empty() {
            return Err(LlmError::InvalidConfig("model is empty".into()));
        }
        if cfg.request_timeout.is_zero() {
            return Err(LlmError::InvalidConfig(
                "request_timeout must be greater than zero".into(),
            ));
        }
        if cfg.connect_timeout.is_zero() {
            return Err(LlmError::InvalidConfig(
                "connect_timeout must be greater than zero".into(),
            ));
        }
        let auth = match cfg.api_key.as_deref().map(str::trim) {
            Some(key) if !key.is_empty() => {
                // Anthropic's API takes the key as it is, in x-api-key.
                let value = match cfg.provider {
                    Provider::Anthropic => key.to_string(),
                    Provider::OpenAi | Provider::Ollama => format!("Bearer {key}"),
                };
                let mut value = HeaderValue::from_str(&value).map_err(|_| {
                    LlmError::InvalidConfig(
                        "api_key contains characters not allowed in an HTTP header".into(),
                    )
                })?;
                value.set_sensitive(true);
                Some(value)
            }
            _ => None,
        };
        let http = reqwest::Client::builder()
            .connect_timeout(cfg.connect_timeout)
            .build()
            .map_err(|e| LlmError::InvalidConfig(format!("cannot build the HTTP client: {e}")))?;
        Ok(ChatClient {
            http,
            provider: cfg.provider,
            url: url.into(),
            model: cfg.model.into(),
            auth,
            request_timeout: cfg.request_timeout,
            max_retries: cfg.max_retries,
            retry_base_delay: cfg.retry_base_delay,
            limits: cfg.limits,
            headers_hook: None,
            num_ctx: None,
            extra_body: None,
        })
    }

    /// The configured model name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The same client asking for another model (a sub-agent's).
    pub fn with_model(mut self, model: &str) -> Self {
        self.model = model.into();
        self
    }

    /// The configured wire protocol.
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// The full URL requests are sent to (`.../chat/completions` or `.../api/chat`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Asks for a context window of `tokens` with every request, where the
    /// protocol has a way to: Ollama's native API (`options.num_ctx`), which
    /// otherwise gives the model the server's default, often a few thousand
    /// tokens, and drops the oldest part of longer prompts.
    pub fn with_context_window(mut self, tokens: u32) -> Self {
        self.num_ctx = Some(tokens);
        self
    }

    /// Adds these keys to every request body, for settings of a particular
    /// server (`max_tokens`, `top_k`, `parallel_tool_calls`, ...). A key the
    /// request has already is replaced, except `options` (Ollama), whose
    /// keys are added to the request's own.
    pub fn with_extra_body(mut self, extra: serde_json::Map<String, Value>) -> Self {
        self.extra_body = (!extra.is_empty()).then(|| Arc::new(extra));
        self
    }

    /// Adds headers to every request, e.g. W3C trace context.
    pub fn with_headers_hook(mut self, hook: fn(&mut reqwest::header::HeaderMap)) -> Self {
        self.headers_hook = Some(hook);
        self
    }

    /// Sends `req` as a streaming request and returns once the first item of the answer is
    /// available (a text delta, the completion, or an error of the stream).
    ///
    /// Failures before that point are retried up to `max_retries` times with exponential
    /// backoff (or after the server's `Retry-After`): connection errors, timeouts, HTTP 408,
    /// 429 and 5xx, and streams that break before their first event. Once an item was
    /// returned nothing is retried: later errors are items of the returned stream.
    ///
    /// # Errors
    ///
    /// The error of the last attempt: [`LlmError::Connect`] when the server cannot be reached,
    /// [`LlmError::Timeout`] when the headers do not arrive within the request timeout,
    /// [`LlmError::Http`] for non-2xx answers, [`LlmError::Malformed`] or
    /// [`LlmError::Truncated`] for a bad complete (non-streamed) answer.
    pub async fn stream(
        &self,
        req: impl std::borrow::Borrow<ChatRequest>,
    ) -> Result<ChatStream, LlmError> {
        let req = req.borrow();
        let body = match (self.provider, &self.extra_body) {
            (Provider::OpenAi, None) => req.to_wire_bytes(&self.model),
            (Provider::OpenAi, Some(extra)) => {
                serde_json::to_vec(&with_extra(req.to_wire(&self.model), extra))
            }
            (Provider::Ollama, extra) => {
                let body = req.to_ollama_wire(&self.model, self.num_ctx);
                serde_json::to_vec(&match extra {
                    Some(extra) => with_extra(body, extra),
                    None => body,
                })
            }
            (Provider::Anthropic, extra) => {
                let body = req.to_anthropic_wire(&self.model);
                serde_json::to_vec(&match extra {
                    Some(extra) => with_extra(body, extra),
                    None => body,
                })
            }
        }
        .map_err(|e| LlmError::InvalidConfig(format!("cannot serialize the request: {e}")))?;
        tracing::debug!(
            provider = %self.provider,
            url = %self.url,
            model = %self.model,
            messages = req.messages.len(),
            tools = req.tools.len(),
            "sending chat request"
        );
        let mut retry = 0u32;
        loop {
            let failure = match self.attempt(&body).await {
                Err(failure) => failure,
                Ok(mut stream) => match stream.next().await {
                    Some(Err(err)) if retry < self.max_retries && should_retry(&err) => {
                        Failure::from(err)
                    }
                    Some(first) => {
                        return Ok(Box::pin(
                            futures::stream::once(async move { first }).chain(stream),
                        ));
                    }
                    None => return Ok(stream),
                },
            };
            // A wait longer than the client sleeps through, or a rate limit
            // still there when the retries ran out: the caller decides.
            if let LlmError::Http { status, message } = &failure.err
                && matches!(*status, 429 | 503 | 529)
            {
                let hint = failure
                    .retry_after
                    .or((*status == 529).then_some(OVERLOADED_WAIT));
                if let Some(after) = hint
                    && (after > RETRY_WINDOW || retry >= self.max_retries)
                {
                    return Err(LlmError::TryLater {
                        status: *status,
                        message: message.clone(),
                        after,
                    });
                }
            }
            if retry >= self.max_retries || !should_retry(&failure.err) {
                if retry > 0 {
                    tracing::debug!(retries = retry, error = %failure.err, "model request failed after retries");
                }
                return Err(failure.err);
            }
            retry += 1;
            let delay = failure
                .retry_after
                .unwrap_or_else(|| backoff(self.retry_base_delay, retry));
            tracing::warn!(
                url = %self.url,
                retry,
                max_retries = self.max_retries,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                server_retry_after = failure.retry_after.is_some(),
                error = %failure.err,
                "model request failed; retrying"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// One request: the stream of a 2xx answer, or why there is none.
    async fn attempt(&self, body: &[u8]) -> Result<ChatStream, Failure> {
        let accept = match self.provider {
            Provider::OpenAi | Provider::Anthropic => "text/event-stream",
            Provider::Ollama => "application/x-ndjson",
        };
        let mut builder = self
            .http
            .post(&*self.url)
            .header(ACCEPT, accept)
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        builder = match (&self.auth, self.provider) {
            (Some(key), Provider::Anthropic) => builder.header("x-api-key", key.clone()),
            (Some(auth), _) => builder.header(AUTHORIZATION, auth.clone()),
            (None, _) => builder,
        };
        if self.provider == Provider::Anthropic {
            builder = builder.header("anthropic-version", crate::anthropic::API_VERSION);
        }
        if let Some(hook) = self.headers_hook {
            let mut extra = reqwest::header::HeaderMap::new();
            hook(&mut extra);
            builder = builder.headers(extra);
        }
        let response = match tokio::time::timeout(self.request_timeout, builder.send()).await {
            Err(_) => {
                tracing::debug!(url = %self.url, after = ?self.request_timeout, "no response headers in time");
                return Err(LlmError::Timeout {
                    after: self.request_timeout,
                }
                .into());
            }
            Ok(Err(e)) => return Err(self.send_error(&e).into()),
            Ok(Ok(r)) => r,
        };
        let status = response.status();
        tracing::debug!(url = %self.url, status = status.as_u16(), "model server answered");
        if !status.is_success() {
            let retry_after = wait_hint(response.headers(), status.as_u16());
            let err = self.http_error(response).await;
            return Err(Failure { err, retry_after });
        }
        match self.provider {
            Provider::Anthropic => Ok(crate::anthropic::sse_stream(
                response,
                &self.model,
                self.request_timeout,
                self.limits,
            )),
            Provider::Ollama => Ok(ollama::ndjson_stream(
                response,
                &self.model,
                self.request_timeout,
                self.limits,
            )),
            Provider::OpenAi => {
                let is_json = response
                    .headers()
                    .get(CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|ct| ct.trim_start().starts_with("application/json"));
                if is_json {
                    // The server ignored "stream": true and sent one complete response.
                    openai::whole_response(response, &self.model, self.request_timeout, self.limits)
                        .await
                        .map_err(Failure::from)
                } else {
                    Ok(openai::sse_stream(
                        response,
                        &self.model,
                        self.request_timeout,
                        self.limits,
                    ))
                }
            }
        }
    }

    fn send_error(&self, e: &reqwest::Error) -> LlmError {
        if e.is_builder() {
            return LlmError::InvalidConfig(format!(
                "cannot build the request: {}",
                error_chain(e)
            ));
        }
        if e.is_timeout() && !e.is_connect() {
            return LlmError::Timeout {
                after: self.request_timeout,
            };
        }
        let reason = connect_reason(e);
        tracing::debug!(url = %self.url, %reason, "cannot reach the model server");
        LlmError::Connect {
            url: self.url.to_string(),
            reason,
        }
    }

    async fn http_error(&self, response: reqwest::Response) -> LlmError {
        let status = response.status();
        // An error body is read only as far as an error message needs.
        let read = crate::limits::read_body(response, MAX_ERROR_BODY_BYTES);
        let body = match tokio::time::timeout(self.request_timeout, read).await {
            Ok(Ok((body, _))) => body,
            Ok(Err(e)) => {
                tracing::debug!(error = %error_chain(&e), "cannot read the error body");
                String::new()
            }
            Err(_) => String::new(),
        };
        let message = error_message(&body).unwrap_or_else(|| {
            let body = body.trim();
            if body.is_empty() {
                status
                    .canonical_reason()
                    .unwrap_or("no error message")
                    .to_string()
            } else {
                snippet(body, MAX_ERROR_BODY_CHARS)
            }
        });
        tracing::debug!(status = status.as_u16(), %message, "model server returned an error");
        LlmError::Http {
            status: status.as_u16(),
            message,
        }
    }
}

/// The error for a body stream that broke after the headers arrived.
pub(crate) fn transport_error(e: &reqwest::Error, timeout: Duration) -> LlmError {
    if e.is_timeout() {
        LlmError::Timeout { after: timeout }
    } else {
        LlmError::Truncated(format!("the connection broke: {}", error_chain(e)))
    }
}

/// The message of an OpenAI-style (or similar) JSON error body.
fn error_message(body: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    let text = |v: &Value| {
        v.as_str()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    match value.get("error") {
        Some(Value::Object(error)) => error.get("message").and_then(text),
        Some(other) => text(other),
        None => value.get("message").and_then(text),
    }
    .map(|m| snippet(&m, MAX_ERROR_BODY_CHARS))
}

/// `body` with the `extra` keys (see [`ChatClient::with_extra_body`]).
fn with_extra(mut body: Value, extra: &serde_json::Map<String, Value>) -> Value {
    if let Value::Object(map) = &mut body {
        for (key, value) in extra {
            match (map.get_mut(key), value) {
                (Some(Value::Object(own)), Value::Object(added)) if key == "options" => {
                    own.extend(added.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
                _ => {
                    map.insert(key.clone(), value.clone());
                }
            }
        }
    }
    body
}

/// A short cause for a failed connection, e.g. "connection refused".
pub(crate) fn connect_reason(e: &reqwest::Error) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return "connection refused".into(),
                std::io::ErrorKind::TimedOut => return "connection timed out".into(),
                std::io::ErrorKind::ConnectionReset => {
                    return "connection reset by the server".into();
                }
                _ => {}
            }
        }
        source = s.source();
    }
    if e.is_timeout() {
        return "connection timed out".into();
    }
    error_chain(e)
}

/// The messages of an error and its causes, without repetitions.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        let msg = err.to_string();
        if !parts.iter().any(|p| p.contains(&msg)) {
            parts.push(msg);
        }
        current = err.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(base_url: &str) -> ProviderConfig {
        let mut cfg = ProviderConfig::new(Provider::OpenAi, base_url, "m");
        cfg.api_key = Some("sk-secret".into());
        cfg
    }

    #[test]
    fn url_tolerates_trailing_slash() {
        let a = ChatClient::new(cfg("http://localhost:11434/v1/")).map(|c| c.url().to_string());
        assert_eq!(
            a.ok().as_deref(),
            Some("http://localhost:11434/v1/chat/completions")
        );
    }

    #[test]
    fn ollama_url_is_the_native_chat_endpoint() {
        let mut c = cfg("http://localhost:11434/");
        c.provider = Provider::Ollama;
        let client = ChatClient::new(c).ok();
        assert_eq!(
            client.as_ref().map(ChatClient::url),
            Some("http://localhost:11434/api/chat")
        );
        assert_eq!(
            client.as_ref().map(ChatClient::provider),
            Some(Provider::Ollama)
        );
    }

    #[test]
    fn defaults() {
        let c = ProviderConfig::new(Provider::Ollama, "http://x", "m");
        assert_eq!(c.max_retries, 3);
        assert_eq!(c.retry_base_delay, Duration::from_millis(500));
        assert_eq!(c.request_timeout, Duration::from_secs(300));
        assert_eq!(c.connect_timeout, Duration::from_secs(10));
        assert_eq!(c.api_key, None);
        assert_eq!(Provider::default(), Provider::OpenAi);
        assert_eq!(Provider::Ollama.to_string(), "ollama");
    }

    #[test]
    fn bad_configs_are_rejected() {
        assert!(matches!(
            ChatClient::new(cfg("")),
            Err(LlmError::InvalidConfig(_))
        ));
        assert!(matches!(
            ChatClient::new(cfg("ftp://x/v1")),
            Err(LlmError::InvalidConfig(_))
        ));
        assert!(matches!(
            ChatClient::new(cfg("not a url")),
            Err(LlmError::InvalidConfig(_))
        ));
        let mut c = cfg("http://x/v1");
        c.model = " ".into();
        assert!(matches!(
            ChatClient::new(c),
            Err(LlmError::InvalidConfig(_))
        ));
        let mut c = cfg("http://x/v1");
        c.api_key = Some("bad\nkey".into());
        assert!(matches!(
            ChatClient::new(c),
            Err(LlmError::InvalidConfig(_))
        ));
    }

    #[test]
    fn debug_output_never_contains_the_key() {
        let c = cfg("http://x/v1");
        assert!(!format!("{c:?}").contains("sk-secret"));
        let client = ChatClient::new(c);
        assert!(!format!("{client:?}").contains("sk-secret"));
    }

    #[test]
    fn error_messages_are_extracted() {
        assert_eq!(
            error_message(
                r#"{"error":{"message":"model 'x' not found","type":"invalid_request_error"}}"#
            )
            .as_deref(),
            Some("model 'x' not found")
        );
        assert_eq!(
            error_message(r#"{"error":"boom"}"#).as_deref(),
            Some("boom")
        );
        assert_eq!(error_message(r#"{"message":"m"}"#).as_deref(), Some("m"));
        assert_eq!(error_message("plain text"), None);
    }
}
