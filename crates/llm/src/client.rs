//! The HTTP client and the stream driver.

use std::collections::VecDeque;
use std::error::Error as _;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::Value;

use crate::assemble::{Assembler, Step, snippet, stream_error};
use crate::{ChatRequest, LlmError, StreamEvent};

/// Longest error body quoted in [`LlmError::Http`].
const MAX_ERROR_BODY_CHARS: usize = 2000;

/// Where and how to reach an OpenAI-compatible model server.
#[derive(Clone)]
pub struct ProviderConfig {
    /// API root, e.g. `http://localhost:11434/v1`; requests go to `{base_url}/chat/completions`
    /// (a trailing slash is tolerated).
    pub base_url: String,
    /// Sent as `Authorization: Bearer <key>` when set and non-empty.
    pub api_key: Option<String>,
    /// Model name sent with every request.
    pub model: String,
    /// Longest wait for the response headers, and for each following piece of the stream.
    pub request_timeout: Duration,
    /// Longest wait for the TCP/TLS connection.
    pub connect_timeout: Duration,
}

impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
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
            .finish()
    }
}

/// The stream of a chat completion: text deltas as they arrive, then one
/// [`StreamEvent::Completed`]. An `Err` item ends the stream.
pub type ChatStream = Pin<Box<dyn Stream<Item = Result<StreamEvent, LlmError>> + Send>>;

/// A client of one model on one OpenAI-compatible server. Cloning is cheap and shares the
/// connection pool.
#[derive(Clone)]
pub struct ChatClient {
    http: reqwest::Client,
    url: Arc<str>,
    model: Arc<str>,
    auth: Option<HeaderValue>,
    request_timeout: Duration,
}

impl fmt::Debug for ChatClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatClient")
            .field("url", &self.url)
            .field("model", &self.model)
            .field("authenticated", &self.auth.is_some())
            .field("request_timeout", &self.request_timeout)
            .finish()
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
        let url = format!("{base}/chat/completions");
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
                let mut value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
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
            url: url.into(),
            model: cfg.model.into(),
            auth,
            request_timeout: cfg.request_timeout,
        })
    }

    /// The configured model name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The full chat-completions URL requests are sent to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends `req` as a streaming request and returns once the response headers arrived.
    ///
    /// A non-2xx answer becomes [`LlmError::Http`] with the server's error message. Errors that
    /// happen later are items of the returned stream.
    ///
    /// # Errors
    ///
    /// [`LlmError::Connect`] when the server cannot be reached, [`LlmError::Timeout`] when the
    /// headers do not arrive within the request timeout, [`LlmError::Http`] for non-2xx answers.
    pub async fn stream(&self, req: ChatRequest) -> Result<ChatStream, LlmError> {
        let body = req.to_wire(&self.model);
        tracing::debug!(
            url = %self.url,
            model = %self.model,
            messages = req.messages.len(),
            tools = req.tools.len(),
            "sending chat completion request"
        );
        let mut builder = self
            .http
            .post(&*self.url)
            .header(ACCEPT, "text/event-stream")
            .json(&body);
        if let Some(auth) = &self.auth {
            builder = builder.header(AUTHORIZATION, auth.clone());
        }
        let response = match tokio::time::timeout(self.request_timeout, builder.send()).await {
            Err(_) => {
                tracing::debug!(url = %self.url, after = ?self.request_timeout, "no response headers in time");
                return Err(LlmError::Timeout {
                    after: self.request_timeout,
                });
            }
            Ok(Err(e)) => return Err(self.send_error(&e)),
            Ok(Ok(r)) => r,
        };
        let status = response.status();
        tracing::debug!(url = %self.url, status = status.as_u16(), "model server answered");
        if !status.is_success() {
            return Err(self.http_error(response).await);
        }
        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.trim_start().starts_with("application/json"));
        if is_json {
            // The server ignored "stream": true and sent one complete response.
            return self.whole_response(response).await;
        }
        let events = response.bytes_stream().eventsource();
        let driver = Driver {
            events: Box::pin(events),
            assembler: Some(Assembler::new(&self.model)),
            pending: VecDeque::new(),
            timeout: self.request_timeout,
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(
            driver,
            |mut d| async move { d.next_item().await.map(|item| (item, d)) },
        )))
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
        let body = match tokio::time::timeout(self.request_timeout, response.text()).await {
            Ok(Ok(body)) => body,
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

    async fn whole_response(&self, response: reqwest::Response) -> Result<ChatStream, LlmError> {
        let body = match tokio::time::timeout(self.request_timeout, response.text()).await {
            Err(_) => {
                return Err(LlmError::Timeout {
                    after: self.request_timeout,
                });
            }
            Ok(Err(e)) => return Err(LlmError::Truncated(error_chain(&e))),
            Ok(Ok(body)) => body,
        };
        let value: Value = serde_json::from_str(&body).map_err(|e| {
            LlmError::Malformed(format!(
                "invalid JSON response ({e}): {}",
                snippet(&body, 200)
            ))
        })?;
        if let Some(error) = value.get("error") {
            return Err(stream_error(error));
        }
        // Re-shape the complete response as a single chunk: `message` becomes `delta`.
        let mut chunk = value.clone();
        if let Some(Value::Array(choices)) = chunk.get_mut("choices") {
            for choice in choices {
                if let Some(obj) = choice.as_object_mut()
                    && let Some(message) = obj.remove("message")
                {
                    obj.insert("delta".into(), message);
                }
            }
        }
        let mut assembler = Assembler::new(&self.model);
        let mut items: Vec<Result<StreamEvent, LlmError>> = Vec::new();
        match assembler.handle(&chunk.to_string())? {
            Step::Continue(events) => items.extend(events.into_iter().map(Ok)),
            Step::Done => {}
        }
        let completion = assembler.into_completion();
        items.push(Ok(StreamEvent::Completed(completion)));
        Ok(Box::pin(futures::stream::iter(items)))
    }
}

type EventResult = Result<Event, EventStreamError<reqwest::Error>>;

/// State of a [`ChatStream`] being consumed.
struct Driver {
    events: Pin<Box<dyn Stream<Item = EventResult> + Send>>,
    assembler: Option<Assembler>,
    pending: VecDeque<StreamEvent>,
    timeout: Duration,
    done: bool,
}

impl Driver {
    async fn next_item(&mut self) -> Option<Result<StreamEvent, LlmError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if self.done {
                return None;
            }
            let next = tokio::time::timeout(self.timeout, self.events.next()).await;
            let outcome = match next {
                Err(_) => self.end_early(LlmError::Timeout {
                    after: self.timeout,
                }),
                Ok(None) => self.end_early(LlmError::Truncated(
                    "the server closed the stream without a finish reason or [DONE]".into(),
                )),
                Ok(Some(Err(EventStreamError::Transport(e)))) => {
                    let err = if e.is_timeout() {
                        LlmError::Timeout {
                            after: self.timeout,
                        }
                    } else {
                        LlmError::Truncated(format!("the connection broke: {}", error_chain(&e)))
                    };
                    self.end_early(err)
                }
                Ok(Some(Err(EventStreamError::Utf8(e)))) => self.fail(LlmError::Malformed(
                    format!("stream is not valid UTF-8: {e}"),
                )),
                Ok(Some(Err(EventStreamError::Parser(e)))) => self.fail(LlmError::Malformed(
                    format!("invalid server-sent event: {e}"),
                )),
                Ok(Some(Ok(event))) => match self.assembler.as_mut().map(|a| a.handle(&event.data))
                {
                    Some(Ok(Step::Continue(events))) => {
                        self.pending.extend(events);
                        continue;
                    }
                    Some(Ok(Step::Done)) => self.complete(),
                    Some(Err(e)) => self.fail(e),
                    None => self.fail(LlmError::Malformed("stream already completed".into())),
                },
            };
            return Some(outcome);
        }
    }

    /// The stream stopped before `[DONE]`: fine if the answer was finished, else `err`.
    fn end_early(&mut self, err: LlmError) -> Result<StreamEvent, LlmError> {
        if self.assembler.as_ref().is_some_and(Assembler::finished) {
            tracing::debug!(reason = %err, "model stream ended after the finish reason but before [DONE]");
            self.complete()
        } else {
            self.fail(err)
        }
    }

    /// Marks the stream as over and releases the connection.
    fn finish(&mut self) {
        self.done = true;
        self.events = Box::pin(futures::stream::empty());
    }

    fn fail(&mut self, err: LlmError) -> Result<StreamEvent, LlmError> {
        tracing::debug!(error = %err, "model stream failed");
        self.finish();
        self.assembler = None;
        Err(err)
    }

    fn complete(&mut self) -> Result<StreamEvent, LlmError> {
        self.finish();
        match self.assembler.take() {
            Some(assembler) => {
                let completion = assembler.into_completion();
                tracing::debug!(
                    model = %completion.model,
                    finish_reason = %completion.finish_reason,
                    tool_calls = completion.tool_calls.len(),
                    usage = ?completion.usage,
                    "model stream completed"
                );
                Ok(StreamEvent::Completed(completion))
            }
            None => Err(LlmError::Malformed("stream already completed".into())),
        }
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

/// A short cause for a failed connection, e.g. "connection refused".
fn connect_reason(e: &reqwest::Error) -> String {
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
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
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
        ProviderConfig {
            base_url: base_url.into(),
            api_key: Some("sk-secret".into()),
            model: "m".into(),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
        }
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
