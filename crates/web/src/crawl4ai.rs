//! The Crawl4AI backend: `POST /crawl` on the Crawl4AI REST service (a
//! browser farm that returns pages as markdown).
//!
//! - Each fetch makes up to `tries` requests, waiting `retry_base_delay`,
//!   then twice as long, and so on, between them; connection errors and 5xx
//!   answers (504 included) are retried. 401, 400, 422, a malformed answer
//!   and a client-side timeout are not (the timeout already used the page's
//!   whole time budget).
//! - A [`Breaker`] counts a fetch that failed after its retries as one
//!   failure; when open, fetches return `Unavailable("circuit open")`
//!   without touching the network. An answer saying the page itself failed
//!   (`success: false` in a 200) counts as a success for the breaker: the
//!   service works.
//! - A health check (`GET /health`) runs every 30 s once started; changes
//!   are logged. It does not move the breaker.
//!
//! The bearer token is sent as a sensitive header and never logged.

use super::breaker::{Breaker, BreakerSettings, BreakerState, BreakerStats, Clock, SystemClock};
use super::{Backend, BackendName, FetchError, FetchFuture, Page, error_chain, human_duration};
use crate::WebError;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, HeaderValue};
use serde::Deserialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The Crawl4AI backend's settings.
#[derive(Clone)]
pub struct Crawl4aiSettings {
    /// The service's base URL, e.g. `http://crawl4ai:11235`.
    pub base_url: url::Url,
    /// The bearer token, if the service wants one.
    pub token: Option<String>,
    /// Longest one request may take.
    pub timeout: Duration,
    /// Requests per fetch at most (1 = no retries).
    pub tries: u32,
    /// The wait before the first retry; doubled for each further one.
    pub retry_base_delay: Duration,
    /// The circuit breaker.
    pub breaker: BreakerSettings,
    /// How often the health check runs.
    pub health_every: Duration,
    /// Longest a health check may take.
    pub health_timeout: Duration,
    /// The breaker's clock.
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Crawl4aiSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crawl4aiSettings")
            .field("base_url", &self.base_url.as_str())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("tries", &self.tries)
            .field("retry_base_delay", &self.retry_base_delay)
            .field("breaker", &self.breaker)
            .field("health_every", &self.health_every)
            .field("health_timeout", &self.health_timeout)
            .finish()
    }
}

impl Crawl4aiSettings {
    /// Defaults for the service at `base_url`: no token, 30 s per request,
    /// 3 tries 200 ms then 400 ms apart, a breaker opening after 5 failed
    /// fetches for 5 minutes, a health check every 30 s, the system clock.
    pub fn new(base_url: url::Url) -> Crawl4aiSettings {
        Crawl4aiSettings {
            base_url,
            token: None,
            timeout: Duration::from_secs(30),
            tries: 3,
            retry_base_delay: Duration::from_millis(200),
            breaker: BreakerSettings::default(),
            health_every: Duration::from_secs(30),
            health_timeout: Duration::from_secs(5),
            clock: Arc::new(SystemClock),
        }
    }

    /// The settings from `[tool_runner.web]`; `None` when `crawl4ai_url` is
    /// empty, an error when it is not a URL.
    pub fn from_config(
        cfg: &agentry_runtime::config::WebConfig,
    ) -> Result<Option<Crawl4aiSettings>, WebError> {
        let raw = cfg.crawl4ai_url.trim();
        if raw.is_empty() {
            return Ok(None);
        }
        let base_url =
            url::Url::parse(raw).map_err(|e| format!("crawl4ai_url {raw:?} is not a URL: {e}"))?;
        let mut settings = Crawl4aiSettings::new(base_url);
        let token = cfg.crawl4ai_token.trim();
        settings.token = (!token.is_empty()).then(|| token.to_string());
        settings.timeout = Duration::from_secs(cfg.page_timeout_secs.max(1));
        Ok(Some(settings))
    }
}

/// What the last health check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// No check has run yet.
    Unknown,
    /// The service answered `status: ok`.
    Up {
        /// The version it reported.
        version: String,
    },
    /// The check failed.
    Down {
        /// Why.
        reason: String,
    },
}

/// The backend's counters and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crawl4aiStats {
    /// The breaker's state.
    pub state: BreakerState,
    /// The breaker's counters (fetches let through, failed fetches, opens,
    /// refusals).
    pub breaker: BreakerStats,
    /// HTTP requests sent for fetches (retries included).
    pub requests: u64,
    /// The last health check's finding.
    pub health: Health,
}

/// The Crawl4AI backend.
pub struct Crawl4ai {
    settings: Crawl4aiSettings,
    client: reqwest::Client,
    auth: Option<HeaderValue>,
    breaker: Breaker,
    requests: AtomicU64,
    health: Mutex<Health>,
}

impl std::fmt::Debug for Crawl4ai {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crawl4ai")
            .field("settings", &self.settings)
            .field("stats", &self.stats())
            .finish()
    }
}

/// How one request went.
enum Attempt {
    /// The page.
    Page(Page),
    /// The service answered that the page failed: not retried, the service
    /// works.
    PageFailed(String),
    /// Worth another try.
    Retry(FetchError),
    /// Not worth another try; the service did not work.
    Stop(FetchError),
}

#[derive(Deserialize)]
struct CrawlResponse {
    #[serde(default)]
    results: Vec<CrawlResult>,
}

#[derive(Deserialize)]
struct CrawlResult {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    success: bool,
    #[serde(default)]
    status_code: Option<u16>,
    #[serde(default)]
    error_message: Option<String>,
    #[serde(default)]
    redirected_url: Option<String>,
    #[serde(default)]
    metadata: Option<Metadata>,
    /// An object (`raw_markdown`, `fit_markdown`, ...) since 0.5; a plain
    /// string in older versions.
    #[serde(default)]
    markdown: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    title: Option<String>,
}

#[derive(Deserialize)]
struct HealthResponse {
    #[serde(default)]
    status: String,
    #[serde(default)]
    version: Option<String>,
}

impl Crawl4ai {
    /// A backend for the service in `settings`.
    pub fn new(settings: Crawl4aiSettings) -> Result<Crawl4ai, WebError> {
        match settings.base_url.scheme() {
            "http" | "https" => {}
            other => {
                return Err(WebError(format!(
                    "crawl4ai_url must be http or https, not {other}"
                )));
            }
        }
        let auth = match &settings.token {
            None => None,
            Some(token) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| "crawl4ai_token contains characters not allowed in a header")?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(settings.timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| format!("cannot build the Crawl4AI client: {}", error_chain(&e)))?;
        let breaker = Breaker::new("crawl4ai", settings.breaker, settings.clock.clone());
        Ok(Crawl4ai {
            settings,
            client,
            auth,
            breaker,
            requests: AtomicU64::new(0),
            health: Mutex::new(Health::Unknown),
        })
    }

    /// The breaker's state.
    pub fn state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// Counters, breaker state and health.
    pub fn stats(&self) -> Crawl4aiStats {
        Crawl4aiStats {
            state: self.breaker.state(),
            breaker: self.breaker.stats(),
            requests: self.requests.load(Ordering::Relaxed),
            health: self.health(),
        }
    }

    /// The last health check's finding.
    pub fn health(&self) -> Health {
        self.health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn endpoint(&self, path: &str) -> String {
        format!(
            "{}{path}",
            self.settings.base_url.as_str().trim_end_matches('/')
        )
    }

    /// Runs one health check (`GET /health`), records and returns its
    /// finding, and logs it when it changed.
    pub async fn check_health(&self) -> Health {
        let found = match self
            .client
            .get(self.endpoint("/health"))
            .timeout(self.settings.health_timeout)
            .send()
            .await
        {
            Err(e) if e.is_connect() => Health::Down {
                reason: format!("cannot connect: {}", root_cause(&e)),
            },
            Err(e) if e.is_timeout() => Health::Down {
                reason: format!(
                    "timed out after {}",
                    human_duration(self.settings.health_timeout)
                ),
            },
            Err(e) => Health::Down {
                reason: error_chain(&e),
            },
            Ok(response) if !response.status().is_success() => Health::Down {
                reason: format!("HTTP {}", response.status().as_u16()),
            },
            Ok(response) => match response.json::<HealthResponse>().await {
                Ok(h) if h.status == "ok" => Health::Up {
                    version: h.version.unwrap_or_default(),
                },
                Ok(h) => Health::Down {
                    reason: format!("status {:?}", h.status),
                },
                Err(e) => Health::Down {
                    reason: format!("unreadable answer: {}", error_chain(&e)),
                },
            },
        };
        let previous = {
            let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *health, found.clone())
        };
        if previous != found {
            match &found {
                Health::Up { version } => {
                    tracing::info!(backend = "crawl4ai", version, "Crawl4AI is healthy");
                }
                Health::Down { reason } => {
                    tracing::info!(backend = "crawl4ai", reason, "Crawl4AI health check failed");
                }
                Health::Unknown => {}
            }
        } else if let Health::Down { reason } = &found {
            tracing::debug!(
                backend = "crawl4ai",
                reason,
                "Crawl4AI health check failed again"
            );
        }
        found
    }

    async fn crawl(&self, url: &url::Url) -> Result<Page, FetchError> {
        let permit = self.breaker.try_acquire().map_err(|refused| {
            tracing::debug!(backend = "crawl4ai", url = %url, "{refused}");
            FetchError::Unavailable(refused.to_string())
        })?;
        let tries = self.settings.tries.max(1);
        let mut delay = self.settings.retry_base_delay;
        let mut attempt = 1;
        let outcome = loop {
            match self.attempt(url).await {
                Attempt::Page(page) => break Ok(page),
                Attempt::PageFailed(reason) => break Err((FetchError::Failed(reason), true)),
                Attempt::Stop(e) => break Err((e, false)),
                Attempt::Retry(e) => {
                    if attempt >= tries {
                        let e = match e {
                            e if tries == 1 => e,
                            FetchError::Failed(m) => {
                                FetchError::Failed(format!("{m} after {tries} tries"))
                            }
                            FetchError::Unavailable(m) => {
                                FetchError::Unavailable(format!("{m} after {tries} tries"))
                            }
                            other @ (FetchError::Blocked(_) | FetchError::Unsupported(_)) => other,
                        };
                        break Err((e, false));
                    }
                    tracing::debug!(backend = "crawl4ai", url = %url, attempt, reason = %e, "retrying");
                    tokio::time::sleep(delay).await;
                    delay = delay.saturating_mul(2);
                    attempt += 1;
                }
            }
        };
        match outcome {
            Ok(page) => {
                permit.success();
                Ok(page)
            }
            Err((e, service_worked)) => {
                if service_worked {
                    permit.success();
                } else {
                    tracing::warn!(backend = "crawl4ai", url = %url, reason = %e, "Crawl4AI fetch failed");
                    permit.failure();
                }
                Err(e)
            }
        }
    }

    async fn attempt(&self, url: &url::Url) -> Attempt {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let body = serde_json::json!({
            "urls": [url.as_str()],
            "browser_config": {},
            "crawler_config": {},
        });
        let mut request = self
            .client
            .post(self.endpoint("/crawl"))
            .timeout(self.settings.timeout)
            .json(&body);
        if let Some(auth) = &self.auth {
            request = request.header(AUTHORIZATION, auth.clone());
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() => {
                return Attempt::Stop(FetchError::Failed(format!(
                    "timed out after {}",
                    human_duration(self.settings.timeout)
                )));
            }
            Err(e) if e.is_connect() => {
                tracing::debug!(backend = "crawl4ai", error = %error_chain(&e), "cannot connect");
                return Attempt::Retry(FetchError::Unavailable("cannot connect".into()));
            }
            Err(e) => return Attempt::Retry(FetchError::Failed(error_chain(&e))),
        };
        let status = response.status();
        let text = match response.text().await {
            Ok(t) => t,
            Err(e) if e.is_timeout() => {
                return Attempt::Stop(FetchError::Failed(format!(
                    "timed out after {}",
                    human_duration(self.settings.timeout)
                )));
            }
            Err(e) => {
                return Attempt::Retry(FetchError::Failed(format!(
                    "reading the answer failed: {}",
                    error_chain(&e)
                )));
            }
        };
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Attempt::Stop(FetchError::Unavailable(format!(
                "authentication failed (HTTP {}{}); check crawl4ai_token",
                status.as_u16(),
                detail(&text).map(|d| format!(": {d}")).unwrap_or_default()
            )));
        }
        if status.is_server_error() {
            let e = FetchError::Failed(format!(
                "HTTP {}{}",
                status.as_u16(),
                detail(&text).map(|d| format!(": {d}")).unwrap_or_default()
            ));
            return Attempt::Retry(e);
        }
        if !status.is_success() {
            return Attempt::Stop(FetchError::Failed(format!(
                "HTTP {}{}",
                status.as_u16(),
                detail(&text).map(|d| format!(": {d}")).unwrap_or_default()
            )));
        }
        let parsed: CrawlResponse = match serde_json::from_str(&text) {
            Ok(p) => p,
            Err(e) => {
                return Attempt::Stop(FetchError::Failed(format!("unreadable answer: {e}")));
            }
        };
        let Some(result) = parsed.results.into_iter().next() else {
            return Attempt::Stop(FetchError::Failed("the answer has no results".into()));
        };
        if !result.success {
            let reason = result
                .error_message
                .map(|m| first_line(&m))
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| "the page failed".into());
            return Attempt::PageFailed(match result.status_code {
                Some(code) => format!("HTTP {code}: {reason}"),
                None => reason,
            });
        }
        if let Some(code) = result.status_code
            && code >= 400
        {
            return Attempt::PageFailed(format!("HTTP {code}"));
        }
        let markdown = match result.markdown {
            Some(serde_json::Value::String(s)) => s,
            Some(serde_json::Value::Object(m)) => {
                let field = |name: &str| {
                    m.get(name)
                        .and_then(|v| v.as_str())
                        .filter(|s| !s.trim().is_empty())
                        .map(str::to_string)
                };
                field("fit_markdown")
                    .or_else(|| field("raw_markdown"))
                    .unwrap_or_default()
            }
            _ => String::new(),
        };
        let requested = url.to_string();
        Attempt::Page(Page {
            final_url: result
                .redirected_url
                .filter(|u| !u.is_empty())
                .or(result.url)
                .unwrap_or_else(|| requested.clone()),
            url: requested,
            title: result
                .metadata
                .and_then(|m| m.title)
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty()),
            markdown,
            status: result.status_code,
        })
    }
}

/// The `detail` (FastAPI errors) or `error` field of an error answer.
fn detail(text: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let found = value.get("detail").or_else(|| value.get("error"))?;
    let text = match found {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut text = first_line(&text);
    if text.chars().count() > 200 {
        text = text.chars().take(200).collect::<String>() + "…";
    }
    Some(text)
}

/// The innermost cause of an error ("Connection refused (os error 111)").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

fn first_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

impl Backend for Crawl4ai {
    fn name(&self) -> BackendName {
        BackendName::Crawl4ai
    }

    fn fetch<'a>(&'a self, url: &'a url::Url) -> FetchFuture<'a> {
        Box::pin(self.crawl(url))
    }

    /// The health check, every `health_every`, for as long as the backend
    /// lives.
    fn start_background(self: Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let every = self.settings.health_every;
        let weak = Arc::downgrade(&self);
        drop(self);
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(this) = weak.upgrade() else {
                    return;
                };
                this.check_health().await;
            }
        }))
    }
}
