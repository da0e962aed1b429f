//! The plain HTTP backend: a GET, no JavaScript. Redirects are followed by
//! hand, each hop checked by the SSRF guard; the client resolves names
//! through [`GuardedResolver`] so that it connects only to checked
//! addresses; the body is read as a stream and cut at `max_body_bytes`;
//! text is decoded with the charset the server names (or the page's
//! `<meta charset>`); HTML becomes markdown.

use super::ssrf::{Guard, GuardedResolver};
use super::{Backend, BackendName, FetchError, FetchFuture, Page, error_chain, human_duration};
use bytes::Bytes;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue, LOCATION};
use std::sync::Arc;
use std::time::Duration;

/// The HTTP backend's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// Longest a whole fetch (every hop and the body) may take.
    pub timeout: Duration,
    /// Largest body read, in bytes; the rest is cut.
    pub max_body_bytes: usize,
    /// Redirects followed at most.
    pub max_redirects: usize,
}

impl HttpSettings {
    /// The settings from `[tool_runner.web]`.
    pub fn from_config(cfg: &agentry_runtime::config::WebConfig) -> HttpSettings {
        HttpSettings {
            timeout: Duration::from_secs(cfg.http_timeout_secs.max(1)),
            max_body_bytes: cfg.max_body_bytes,
            max_redirects: cfg.max_redirects,
        }
    }
}

/// The plain HTTP backend.
#[derive(Debug)]
pub struct HttpBackend {
    settings: HttpSettings,
    guard: Arc<Guard>,
    client: reqwest::Client,
}

/// What the body is, judging by its content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Html,
    Text,
    /// No content type: decided from the body.
    Unknown,
}

const USER_AGENT: &str = concat!("agentry-web/", env!("CARGO_PKG_VERSION"));

impl HttpBackend {
    /// A backend checking every hop with `guard`.
    pub fn new(settings: HttpSettings, guard: Arc<Guard>) -> Result<HttpBackend, FetchError> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            // A proxy would resolve and connect on its own, past the guard.
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver::new(guard.clone())))
            .connect_timeout(settings.timeout)
            .user_agent(USER_AGENT)
            .build()
            .map_err(|e| {
                FetchError::Unavailable(format!(
                    "cannot build the HTTP client: {}",
                    error_chain(&e)
                ))
            })?;
        Ok(HttpBackend {
            settings,
            guard,
            client,
        })
    }

    async fn get(&self, url: &url::Url) -> Result<Page, FetchError> {
        match tokio::time::timeout(self.settings.timeout, self.get_inner(url)).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Failed(format!(
                "timed out after {}",
                human_duration(self.settings.timeout)
            ))),
        }
    }

    async fn get_inner(&self, url: &url::Url) -> Result<Page, FetchError> {
        let mut current = url.clone();
        let mut redirects = 0usize;
        let mut response = loop {
            if redirects == 0 {
                self.guard.check(&current).await?;
            }
            let response = self
                .client
                .get(current.as_str())
                .header(
                    ACCEPT,
                    "text/html,application/xhtml+xml,text/plain;q=0.9,text/*;q=0.8,application/json;q=0.8,*/*;q=0.1",
                )
                .send()
                .await
                .map_err(|e| request_error(&e))?;
            let status = response.status();
            if !status.is_redirection() {
                break response;
            }
            let Some(location) = response.headers().get(LOCATION) else {
                return Err(FetchError::Failed(format!(
                    "HTTP {} without a Location header",
                    status_text(status)
                )));
            };
            let next = location
                .to_str()
                .ok()
                .and_then(|l| current.join(l).ok())
                .ok_or_else(|| {
                    FetchError::Failed(format!("HTTP {} to an invalid location", status.as_u16()))
                })?;
            if redirects >= self.settings.max_redirects {
                return Err(FetchError::Failed(format!(
                    "too many redirects (more than {})",
                    self.settings.max_redirects
                )));
            }
            redirects += 1;
            if let Err(e) = self.guard.check(&next).await {
                return Err(match e {
                    FetchError::Blocked(m) => {
                        FetchError::Blocked(format!("redirect from {current}: {m}"))
                    }
                    FetchError::Failed(m) => {
                        FetchError::Failed(format!("redirect from {current}: {m}"))
                    }
                    other @ (FetchError::Unavailable(_) | FetchError::Unsupported(_)) => other,
                });
            }
            tracing::debug!(from = %current, to = %next, "following a redirect");
            current = next;
        };
        let status = response.status();
        if status.is_client_error() || status.is_server_error() {
            return Err(FetchError::Failed(format!("HTTP {}", status_text(status))));
        }
        let content_type = response.headers().get(CONTENT_TYPE).cloned();
        let mut kind = classify(content_type.as_ref())?;
        let mut body = Vec::new();
        let mut cut = false;
        while let Some(chunk) = response.chunk().await.map_err(|e| {
            FetchError::Failed(format!("reading the body failed: {}", error_chain(&e)))
        })? {
            let room = self.settings.max_body_bytes - body.len();
            if chunk.len() >= room {
                body.extend_from_slice(&chunk[..room]);
                cut = chunk.len() > room || response.chunk().await.ok().flatten().is_some();
                break;
            }
            body.extend_from_slice(&chunk);
        }
        if kind == Kind::Unknown {
            kind = sniff(&body)?;
        }
        let text = decode(Bytes::from(body), content_type.as_ref(), kind == Kind::Html).await;
        let (title, mut markdown) = match kind {
            Kind::Html => tokio::task::spawn_blocking(move || html_to_markdown(&text))
                .await
                .map_err(|e| FetchError::Failed(format!("converting the page failed: {e}")))??,
            Kind::Text | Kind::Unknown => (None, text),
        };
        if cut {
            markdown.push_str(&format!(
                "\n\n[body cut at {} bytes]",
                self.settings.max_body_bytes
            ));
        }
        Ok(Page {
            url: url.to_string(),
            final_url: current.to_string(),
            title,
            markdown,
            status: Some(status.as_u16()),
        })
    }
}

impl Backend for HttpBackend {
    fn name(&self) -> BackendName {
        BackendName::Http
    }

    fn fetch<'a>(&'a self, url: &'a url::Url) -> FetchFuture<'a> {
        Box::pin(self.get(url))
    }
}

fn status_text(status: reqwest::StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// A request error; one refused by the guarded resolver stays `Blocked`.
fn request_error(e: &reqwest::Error) -> FetchError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(fetch) = s.downcast_ref::<FetchError>() {
            return fetch.clone();
        }
        source = s.source();
    }
    if e.is_timeout() {
        return FetchError::Failed("timed out".into());
    }
    FetchError::Failed(error_chain(e))
}

/// The content type's kind, or `Unsupported` for anything but text.
fn classify(content_type: Option<&HeaderValue>) -> Result<Kind, FetchError> {
    let Some(value) = content_type else {
        return Ok(Kind::Unknown);
    };
    let essence = value
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "" => Ok(Kind::Unknown),
        "text/html" | "application/xhtml+xml" => Ok(Kind::Html),
        "application/json"
        | "application/xml"
        | "application/javascript"
        | "application/ecmascript"
        | "application/x-ndjson" => Ok(Kind::Text),
        e if e.starts_with("text/") || e.ends_with("+json") || e.ends_with("+xml") => {
            Ok(Kind::Text)
        }
        other => Err(FetchError::Unsupported(format!(
            "refusing {other}: not text"
        ))),
    }
}

/// The kind of a body served without a content type.
fn sniff(body: &[u8]) -> Result<Kind, FetchError> {
    let head = &body[..body.len().min(1024)];
    if head.contains(&0) {
        return Err(FetchError::Unsupported(
            "refusing a body without a content type: not text".into(),
        ));
    }
    let start = String::from_utf8_lossy(head)
        .trim_start()
        .to_ascii_lowercase();
    if start.starts_with("<!doctype html") || start.starts_with("<html") {
        Ok(Kind::Html)
    } else {
        Ok(Kind::Text)
    }
}

/// The charset an HTML page names in a `<meta>` tag near its start.
fn meta_charset(body: &[u8]) -> Option<String> {
    let head = String::from_utf8_lossy(&body[..body.len().min(2048)]).to_ascii_lowercase();
    let at = head.find("charset=")?;
    let rest = head[at + "charset=".len()..].trim_start_matches(['"', '\'', ' ']);
    let label: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':' | '.'))
        .collect();
    (!label.is_empty()).then_some(label)
}

/// Decodes the body with the charset from the Content-Type header; without
/// one, an HTML page's `<meta charset>`, else UTF-8 when the bytes are
/// UTF-8, else windows-1252 (what browsers assume for unlabelled pages).
async fn decode(body: Bytes, content_type: Option<&HeaderValue>, html: bool) -> String {
    let fallback = match (html, meta_charset(&body)) {
        (true, Some(label)) => label,
        _ if std::str::from_utf8(&body).is_ok() => "utf-8".to_string(),
        _ => "windows-1252".to_string(),
    };
    // reqwest decodes with the charset of the Content-Type header (through
    // its `charset` feature); give it the capped body in a response of its
    // own, made with the `http` crate reqwest is built on.
    let mut builder = http::Response::builder();
    if let Some(ct) = content_type {
        builder = builder.header(CONTENT_TYPE, ct.clone());
    }
    match builder.body(reqwest::Body::from(body.clone())) {
        Ok(response) => match reqwest::Response::from(response)
            .text_with_charset(&fallback)
            .await
        {
            Ok(text) => text,
            Err(_) => String::from_utf8_lossy(&body).into_owned(),
        },
        Err(_) => String::from_utf8_lossy(&body).into_owned(),
    }
}

/// The page's title and its content as markdown.
pub fn html_to_markdown(html: &str) -> Result<(Option<String>, String), FetchError> {
    let title = html_title(html);
    let converter = htmd::HtmlToMarkdown::builder()
        .skip_tags(vec![
            "head", "script", "style", "noscript", "template", "iframe", "svg", "canvas",
        ])
        .build();
    let markdown = converter
        .convert(html)
        .map_err(|e| FetchError::Failed(format!("converting the page failed: {e}")))?;
    Ok((title, markdown.trim().to_string()))
}

/// The text of the first `<title>`, whitespace collapsed, basic entities
/// decoded.
fn html_title(html: &str) -> Option<String> {
    let lower = html.to_ascii_lowercase();
    let open = lower.find("<title")?;
    let start = open + lower[open..].find('>')? + 1;
    let end = start + lower[start..].find("</title")?;
    let raw = html.get(start..end)?;
    let text = raw
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&apos;", "'")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&");
    let text = text.trim().to_string();
    (!text.is_empty()).then_some(text)
}
