//! The web tools (`web_fetch`, `web_crawl`): fetch a page and return it to
//! the model as markdown.
//!
//! A fetch goes through a chain of [`Backend`]s, first to last, until one
//! returns the page:
//!
//! 1. [`crawl4ai::Crawl4ai`], the Crawl4AI REST service, when
//!    `crawl4ai_url` is set (retries, a circuit breaker, a health check);
//! 2. a headless Chromium, when the runner passes one to [`Web::new`];
//! 3. [`http::HttpBackend`], a plain HTTP GET (no JavaScript).
//!
//! Every URL is checked by the SSRF [`ssrf::Guard`] before any backend sees
//! it, and so is the final URL a backend reports after redirects. The HTTP
//! backend also checks every redirect hop itself and connects only to
//! addresses the guard accepted.

pub use agentry_tool::breaker;
pub mod chromium;
pub mod crawl4ai;
pub mod http;
pub mod ssrf;

agentry_tool::sentence_error!(
    /// Why a web setting or lookup cannot be used (a backend's URL, a name
    /// that does not resolve), as a sentence for a person.
    WebError
);

use agentry_tool::{Context, Running, Tool, ToolError, ToolOutcome, ToolSpec};
use serde::Deserialize;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The kinds of backend, in their usual order in the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendName {
    /// The Crawl4AI REST service.
    Crawl4ai,
    /// Headless Chromium.
    Chromium,
    /// Plain HTTP.
    Http,
}

impl std::fmt::Display for BackendName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendName::Crawl4ai => "crawl4ai",
            BackendName::Chromium => "chromium",
            BackendName::Http => "http",
        })
    }
}

/// A fetched page.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The URL asked for.
    pub url: String,
    /// The URL the page came from, after redirects.
    pub final_url: String,
    /// The page's title, if it has one.
    pub title: Option<String>,
    /// The page's content as markdown (or the text itself for text types).
    pub markdown: String,
    /// The HTTP status, when the backend knows it.
    pub status: Option<u16>,
}

/// Why a backend did not return a page. The text is short: it is shown to
/// the model as the reason a backend was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The URL (or a redirect) leads somewhere the SSRF guard refuses. The
    /// chain stops.
    #[error("{0}")]
    Blocked(String),
    /// The backend cannot serve now (down, circuit open, not installed). The
    /// next backend is tried.
    #[error("{0}")]
    Unavailable(String),
    /// The backend could not fetch this page. The next backend is tried.
    #[error("{0}")]
    Failed(String),
    /// The content cannot be returned (not text). The chain stops.
    #[error("{0}")]
    Unsupported(String),
}

impl FetchError {
    /// Whether the next backend should be tried after this error.
    pub fn try_next(&self) -> bool {
        match self {
            FetchError::Unavailable(_) | FetchError::Failed(_) => true,
            FetchError::Blocked(_) | FetchError::Unsupported(_) => false,
        }
    }
}

/// The future a [`Backend`] returns.
pub type FetchFuture<'a> = Pin<Box<dyn Future<Output = Result<Page, FetchError>> + Send + 'a>>;

/// One way of fetching a page. Backends are tried in order by [`Web`].
///
/// A backend receives URLs the SSRF guard already accepted; a backend that
/// follows redirects itself should report the final URL in
/// [`Page::final_url`], which [`Web`] checks again.
///
/// To plug in a backend, implement this trait and put it in the chain:
/// [`Web::new`] takes the Chromium backend as `Option<Arc<dyn Backend>>`;
/// [`Web::from_backends`] takes any list.
pub trait Backend: Send + Sync {
    /// Which backend this is (used in results and logs).
    fn name(&self) -> BackendName;

    /// Fetches `url`.
    fn fetch<'a>(&'a self, url: &'a url::Url) -> FetchFuture<'a>;

    /// Starts the backend's background work (e.g. a health check), if it
    /// has any. Called once by [`Web::start_background`].
    fn start_background(self: Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        None
    }
}

/// A page and how it was fetched.
#[derive(Debug, Clone, PartialEq)]
pub struct Fetched {
    /// The page.
    pub page: Page,
    /// The backend that returned it.
    pub backend: BackendName,
    /// The backends tried before it, and why each gave no page.
    pub skipped: Vec<(BackendName, FetchError)>,
}

/// Why no page came back.
#[derive(Debug, Clone, PartialEq)]
pub enum FetchFailure {
    /// The guard refused the URL before any backend was tried (or it could
    /// not be checked, e.g. its host does not resolve).
    Refused(FetchError),
    /// Every backend tried, in order, and why it gave no page. The last one
    /// may have stopped the chain (blocked redirect, unsupported content).
    Backends(Vec<(BackendName, FetchError)>),
}

/// The web tools: the backend chain, the SSRF guard and the size of the
/// text returned.
pub struct Web {
    backends: Vec<Arc<dyn Backend>>,
    guard: Arc<ssrf::Guard>,
    max_chars: usize,
    crawl4ai: Option<Arc<crawl4ai::Crawl4ai>>,
    background_started: AtomicBool,
}

impl std::fmt::Debug for Web {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Web")
            .field(
                "backends",
                &self.backends.iter().map(|b| b.name()).collect::<Vec<_>>(),
            )
            .field("guard", &self.guard)
            .field("max_chars", &self.max_chars)
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UrlArgs {
    url: String,
}

/// How long the guard may take to resolve a host before a fetch.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

impl Web {
    /// The chain from the configuration: Crawl4AI (when `crawl4ai_url` is
    /// set), then `chromium` (when given), then plain HTTP. A backend that
    /// cannot be set up (bad Crawl4AI URL) is left out with an error log.
    pub fn new(
        cfg: &agentry_runtime::config::WebConfig,
        chromium: Option<Arc<dyn Backend>>,
    ) -> Web {
        let guard = Arc::new(ssrf::Guard::new(&cfg.allow_hosts));
        let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
        let mut crawl4ai = None;
        match crawl4ai::Crawl4aiSettings::from_config(cfg) {
            Ok(None) => {}
            Ok(Some(settings)) => match crawl4ai::Crawl4ai::new(settings) {
                Ok(c) => {
                    let c = Arc::new(c);
                    crawl4ai = Some(c.clone());
                    backends.push(c);
                }
                Err(e) => tracing::error!(error = %e, "the Crawl4AI backend is left out"),
            },
            Err(e) => tracing::error!(error = %e, "the Crawl4AI backend is left out"),
        }
        if let Some(chromium) = chromium {
            backends.push(chromium);
        }
        match http::HttpBackend::new(http::HttpSettings::from_config(cfg), guard.clone()) {
            Ok(h) => backends.push(Arc::new(h)),
            Err(e) => tracing::error!(error = %e, "the HTTP backend is left out"),
        }
        tracing::info!(
            backends = %backends.iter().map(|b| b.name().to_string()).collect::<Vec<_>>().join(" → "),
            "web tools ready"
        );
        Web {
            backends,
            guard,
            max_chars: cfg.max_chars,
            crawl4ai,
            background_started: AtomicBool::new(false),
        }
    }

    /// A chain of the given backends, tried in order. `max_chars` of 0
    /// returns pages whole.
    pub fn from_backends(
        backends: Vec<Arc<dyn Backend>>,
        guard: Arc<ssrf::Guard>,
        max_chars: usize,
    ) -> Web {
        Web {
            backends,
            guard,
            max_chars,
            crawl4ai: None,
            background_started: AtomicBool::new(false),
        }
    }

    /// The backends in the order they are tried.
    pub fn backends(&self) -> Vec<BackendName> {
        self.backends.iter().map(|b| b.name()).collect()
    }

    /// The Crawl4AI backend built by [`Web::new`], for its breaker state,
    /// health and counters.
    pub fn crawl4ai(&self) -> Option<&Arc<crawl4ai::Crawl4ai>> {
        self.crawl4ai.as_ref()
    }

    /// The SSRF guard.
    pub fn guard(&self) -> &Arc<ssrf::Guard> {
        &self.guard
    }

    /// The web tools' specs, sorted by name.
    ///
    /// `web_fetch` and `web_crawl` behave the same for now (both go through
    /// the whole chain); they differ only in what the model is told, so that
    /// `web_crawl` can later grow multi-page crawling without renaming.
    pub fn specs() -> Vec<ToolSpec> {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "The http or https URL to fetch."}
            },
            "required": ["url"],
            "additionalProperties": false
        });
        vec![
            ToolSpec::reading(
                "web_crawl",
                "Load a web page the way a browser does (JavaScript runs when a \
                    browser backend is available) and return its content as markdown, with its \
                    title. Use it for pages that build their content with scripts. Long pages \
                    are cut. Internal and private network addresses are refused.",
                schema.clone(),
            ),
            ToolSpec::reading(
                "web_fetch",
                "Fetch one web page and return its content as markdown, with its \
                    title; plain-text and JSON responses come back as they are. Long pages are \
                    cut. Internal and private network addresses are refused.",
                schema,
            ),
        ]
    }

    /// One call of the web tool `tool` (its name is for errors: both
    /// fetch through the chain).
    pub async fn call(&self, tool: &str, arguments_json: &str) -> Result<ToolOutcome, ToolError> {
        let args: UrlArgs = agentry_tool::arguments(tool, arguments_json)?;
        let url = parse_url(&args.url)?;
        match self.fetch(&url).await {
            Ok(fetched) => Ok(self.render(&fetched)),
            Err(FetchFailure::Refused(e)) => Ok(ToolOutcome {
                output: e.to_string(),
                is_error: true,
                ..ToolOutcome::default()
            }),
            Err(FetchFailure::Backends(reasons)) => {
                let mut output = format!("could not fetch {url}:");
                for (backend, reason) in &reasons {
                    output.push_str(&format!("\n- {backend}: {reason}"));
                }
                Ok(ToolOutcome {
                    output,
                    is_error: true,
                    ..ToolOutcome::default()
                })
            }
        }
    }

    /// Fetches `url` through the chain.
    pub async fn fetch(&self, url: &url::Url) -> Result<Fetched, FetchFailure> {
        match tokio::time::timeout(RESOLVE_TIMEOUT, self.guard.check(url)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(FetchFailure::Refused(e)),
            Err(_) => {
                return Err(FetchFailure::Refused(FetchError::Failed(format!(
                    "cannot fetch {url}: resolving its host timed out"
                ))));
            }
        }
        let mut skipped: Vec<(BackendName, FetchError)> = Vec::new();
        for backend in &self.backends {
            let name = backend.name();
            let result = match backend.fetch(url).await {
                Ok(page) => self.check_final(name, page).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(page) => {
                    tracing::debug!(url = %url, backend = %name, skipped = skipped.len(), "page fetched");
                    return Ok(Fetched {
                        page,
                        backend: name,
                        skipped,
                    });
                }
                Err(e) => {
                    tracing::debug!(url = %url, backend = %name, reason = %e, "backend gave no page");
                    let next = e.try_next();
                    skipped.push((name, e));
                    if !next {
                        break;
                    }
                }
            }
        }
        Err(FetchFailure::Backends(skipped))
    }

    /// Checks where a backend that follows redirects on its own ended up.
    async fn check_final(&self, backend: BackendName, page: Page) -> Result<Page, FetchError> {
        if page.final_url == page.url {
            return Ok(page);
        }
        match backend {
            // The HTTP backend checks every hop itself.
            BackendName::Http => Ok(page),
            BackendName::Crawl4ai | BackendName::Chromium => {
                let Ok(final_url) = url::Url::parse(&page.final_url) else {
                    return Err(FetchError::Failed(format!(
                        "the page ended at an unreadable URL {:?}",
                        page.final_url
                    )));
                };
                match tokio::time::timeout(RESOLVE_TIMEOUT, self.guard.check(&final_url)).await {
                    Ok(Ok(())) => Ok(page),
                    Ok(Err(e)) => Err(FetchError::Blocked(format!(
                        "the page redirected to a refused address: {e}"
                    ))),
                    Err(_) => Err(FetchError::Blocked(format!(
                        "the page redirected to {final_url}, whose host could not be checked"
                    ))),
                }
            }
        }
    }

    /// The text for the model.
    fn render(&self, fetched: &Fetched) -> ToolOutcome {
        let page = &fetched.page;
        let mut output = format!("[fetched {} with {}", page.final_url, fetched.backend);
        if !fetched.skipped.is_empty() {
            output.push_str("; skipped: ");
            let skipped: Vec<String> = fetched
                .skipped
                .iter()
                .map(|(name, reason)| format!("{name} ({reason})"))
                .collect();
            output.push_str(&skipped.join(", "));
        }
        output.push_str("]\n");
        if let Some(title) = page
            .title
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            output.push_str(&format!("# {title}\n"));
        }
        let markdown = page.markdown.trim();
        let (text, truncated) = truncate_chars(markdown, self.max_chars);
        if text.is_empty() {
            output.push_str("(the page has no text)");
        } else {
            output.push_str(&text);
        }
        ToolOutcome {
            output,
            truncated,
            ..ToolOutcome::default()
        }
    }

    /// Starts the backends' background work (the Crawl4AI health check
    /// every 30 s). Call once from the runner; later calls return `None`.
    pub fn start_background(&self) -> Option<tokio::task::JoinHandle<()>> {
        if self.background_started.swap(true, Ordering::SeqCst) {
            return None;
        }
        let mut handles: Vec<_> = self
            .backends
            .iter()
            .filter_map(|b| b.clone().start_background())
            .collect();
        match handles.len() {
            0 => None,
            1 => handles.pop(),
            _ => Some(tokio::spawn(async move {
                for h in handles {
                    let _ = h.await;
                }
            })),
        }
    }
}

/// The web tools over `web`, for any host whose calls end in a
/// [`ToolOutcome`].
pub fn tools<C>(web: &Arc<Web>) -> Vec<Arc<dyn Tool<C>>>
where
    C: Context<Output = Result<ToolOutcome, ToolError>>,
{
    Web::specs()
        .into_iter()
        .map(|spec| {
            Arc::new(WebTool {
                spec,
                web: web.clone(),
            }) as Arc<dyn Tool<C>>
        })
        .collect()
}

/// One web tool: a fetch through the chain.
struct WebTool {
    spec: ToolSpec,
    web: Arc<Web>,
}

impl<C> Tool<C> for WebTool
where
    C: Context<Output = Result<ToolOutcome, ToolError>>,
{
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run<'a>(
        &'a self,
        _call: &'a C,
        arguments: &'a str,
    ) -> Running<'a, Result<ToolOutcome, ToolError>> {
        Box::pin(self.web.call(&self.spec.name, arguments))
    }
}

/// `text` cut to `max_chars` characters (0: no limit) with a marker saying
/// how many were left out, and whether it was cut.
pub fn truncate_chars(text: &str, max_chars: usize) -> (String, bool) {
    if max_chars == 0 {
        return (text.to_string(), false);
    }
    match text.char_indices().nth(max_chars) {
        None => (text.to_string(), false),
        Some((cut, _)) => {
            let rest = text[cut..].chars().count();
            (
                format!("{}\n[… truncated: {rest} more characters]", &text[..cut]),
                true,
            )
        }
    }
}

/// Parses the URL the model gave; a bare host name (`example.com/x`) is
/// taken as https.
fn parse_url(raw: &str) -> Result<url::Url, ToolError> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Err(ToolError::InvalidArguments("url must not be empty".into()));
    }
    match url::Url::parse(raw) {
        Ok(u) => Ok(u),
        Err(url::ParseError::RelativeUrlWithoutBase) => url::Url::parse(&format!("https://{raw}"))
            .map_err(|e| ToolError::InvalidArguments(format!("invalid url {raw:?}: {e}"))),
        Err(e) => Err(ToolError::InvalidArguments(format!(
            "invalid url {raw:?}: {e}"
        ))),
    }
}

/// A duration as people write it: `20s`, `1.5s`, `300ms`.
pub(crate) fn human_duration(d: Duration) -> String {
    if d.as_millis().is_multiple_of(1000) {
        format!("{}s", d.as_secs())
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// An error and its sources, joined with `: ` (reqwest's own message hides
/// the cause, e.g. "connection refused").
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}
