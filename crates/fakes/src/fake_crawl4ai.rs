//! A fake Crawl4AI REST server (v0.9 contract) for tests, over real HTTP on
//! 127.0.0.1.
//!
//! Endpoints, as the real service answers them:
//!
//! - `GET /health` → `{"status":"ok","timestamp":<float>,"version":"0.9.5"}`
//!   (never needs a token);
//! - `POST /crawl` with `{"urls":[..1-100], "browser_config":{..},
//!   "crawler_config":{..}}` → `{"success":true,"results":[CrawlResult..],
//!   "server_processing_time_s":..}`; each result carries `url, success,
//!   status_code, error_message, redirected_url, metadata{title,..},
//!   links{internal,external}, markdown{raw_markdown, fit_markdown,
//!   markdown_with_citations, references_markdown}`. A URL with no scripted
//!   page fails (`success:false`, a navigation `error_message`); when every
//!   URL failed the answer is 500 `{"error":"Internal server error",
//!   "correlation_id":..}`;
//! - `POST /md` with `{"url":..,"f":"fit"|"raw"|"bm25","q":null,"c":"0"}` →
//!   `{"url","filter","query","cache","markdown","success":true}` (500 as
//!   above when the URL fails).
//!
//! Errors: 401 `{"detail":"Authentication required"}` when a token is
//! required ([`FakeCrawl4ai::require_token`]) and the request has no
//! matching `Authorization: Bearer` header; 422 `{"detail":[..]}` (FastAPI
//! validation shape) for a malformed body; scripted 500s and 504s.
//!
//! Pages are keyed by the exact URL string the client sends (`url::Url`
//! normalizes `http://host` to `http://host/`). Dropping the fake stops it:
//! new connections are refused.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use agentry_fakes::fake_crawl4ai::{FakeCrawl4ai, FakePage};
//! let fake = FakeCrawl4ai::start().await?;
//! fake.page("https://example.com/", FakePage::new("Example", "# Hello"));
//! // ... point a client at fake.url() ...
//! assert_eq!(fake.crawl_requests(), 0);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde_json::{Value, json};

/// The version `/health` reports.
pub const VERSION: &str = "0.9.5";

/// A scripted page.
#[derive(Clone, Debug, PartialEq)]
pub struct FakePage {
    /// `metadata.title` (`null` when `None`).
    pub title: Option<String>,
    /// `markdown.raw_markdown`.
    pub raw_markdown: String,
    /// `markdown.fit_markdown` (empty, as the real service sends it, when no
    /// content filter ran).
    pub fit_markdown: String,
    /// `status_code`.
    pub status_code: u16,
    /// `redirected_url` (the URL itself when `None`).
    pub redirected_url: Option<String>,
}

impl FakePage {
    /// A 200 page with this title and raw markdown (no fit markdown).
    pub fn new(title: &str, markdown: &str) -> FakePage {
        FakePage {
            title: Some(title.to_string()),
            raw_markdown: markdown.to_string(),
            fit_markdown: String::new(),
            status_code: 200,
            redirected_url: None,
        }
    }

    /// Sets `fit_markdown`.
    pub fn fit(mut self, markdown: &str) -> FakePage {
        self.fit_markdown = markdown.to_string();
        self
    }

    /// Sets `redirected_url`.
    pub fn redirected_to(mut self, url: &str) -> FakePage {
        self.redirected_url = Some(url.to_string());
        self
    }

    /// Sets `status_code`.
    pub fn status(mut self, code: u16) -> FakePage {
        self.status_code = code;
        self
    }

    /// No title (`metadata.title: null`).
    pub fn untitled(mut self) -> FakePage {
        self.title = None;
        self
    }
}

#[derive(Default)]
struct Inner {
    pages: HashMap<String, FakePage>,
    failing: HashMap<String, String>,
    token: Option<String>,
    fail_all: bool,
    fail_next: u32,
    status: Option<u16>,
    delay: Duration,
    unhealthy: bool,
    crawl_bodies: Vec<Value>,
    authorizations: Vec<Option<String>>,
}

#[derive(Default)]
struct Shared {
    inner: Mutex<Inner>,
    health: AtomicU64,
    crawl: AtomicU64,
    md: AtomicU64,
    next_id: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running fake Crawl4AI server; dropping it shuts the server down.
pub struct FakeCrawl4ai {
    server: crate::http_server::HttpServer,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FakeCrawl4ai {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeCrawl4ai")
            .field("addr", &self.server.addr)
            .finish_non_exhaustive()
    }
}

impl FakeCrawl4ai {
    /// Starts a server on an ephemeral port of 127.0.0.1.
    pub async fn start() -> anyhow::Result<FakeCrawl4ai> {
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/health", get(health))
            .route("/crawl", post(crawl))
            .route("/md", post(md))
            .fallback(not_found)
            .with_state(shared.clone());
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let server = crate::http_server::HttpServer::start(addr, app, "fake crawl4ai").await?;
        Ok(FakeCrawl4ai { server, shared })
    }

    /// The base URL: `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// Scripts the page served for `url`.
    pub fn page(&self, url: &str, page: FakePage) {
        let mut inner = self.shared.lock();
        inner.failing.remove(url);
        inner.pages.insert(url.to_string(), page);
    }

    /// Makes `url` fail with this `error_message` (an unscripted URL fails
    /// with a name-resolution error).
    pub fn fail_url(&self, url: &str, error_message: &str) {
        let mut inner = self.shared.lock();
        inner.pages.remove(url);
        inner
            .failing
            .insert(url.to_string(), error_message.to_string());
    }

    /// Requires `Authorization: Bearer <token>` on `/crawl` and `/md`
    /// (`None`: no token needed).
    pub fn require_token(&self, token: Option<&str>) {
        self.shared.lock().token = token.map(str::to_string);
    }

    /// While on, every `/crawl` and `/md` request fails as if every URL
    /// failed (500).
    pub fn fail_all(&self, on: bool) {
        self.shared.lock().fail_all = on;
    }

    /// The next `n` `/crawl` or `/md` requests fail with 500.
    pub fn fail_next(&self, n: u32) {
        self.shared.lock().fail_next = n;
    }

    /// Every `/crawl` and `/md` request is answered with this status
    /// (504: `{"detail":"Crawl timed out"}`; 500: the every-URL-failed
    /// shape; others `{"detail":<reason>}`); `None` answers normally.
    pub fn force_status(&self, status: Option<u16>) {
        self.shared.lock().status = status;
    }

    /// Waits this long before answering `/crawl` and `/md`.
    pub fn set_delay(&self, delay: Duration) {
        self.shared.lock().delay = delay;
    }

    /// Makes `/health` answer 503 `{"status":"unhealthy",..}` (or `ok`
    /// again).
    pub fn set_healthy(&self, healthy: bool) {
        self.shared.lock().unhealthy = !healthy;
    }

    /// Requests received on `/crawl`.
    pub fn crawl_requests(&self) -> u64 {
        self.shared.crawl.load(Ordering::SeqCst)
    }

    /// Requests received on `/md`.
    pub fn md_requests(&self) -> u64 {
        self.shared.md.load(Ordering::SeqCst)
    }

    /// Requests received on `/health`.
    pub fn health_requests(&self) -> u64 {
        self.shared.health.load(Ordering::SeqCst)
    }

    /// Requests received on every endpoint.
    pub fn requests(&self) -> u64 {
        self.crawl_requests() + self.md_requests() + self.health_requests()
    }

    /// The JSON bodies of the `/crawl` requests, in order (a body that is
    /// not JSON is recorded as a JSON string).
    pub fn crawl_bodies(&self) -> Vec<Value> {
        self.shared.lock().crawl_bodies.clone()
    }

    /// The `Authorization` header of every `/crawl` and `/md` request, in
    /// order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.shared.lock().authorizations.clone()
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    shared.health.fetch_add(1, Ordering::SeqCst);
    if shared.lock().unhealthy {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "unhealthy", "timestamp": now_secs(), "version": VERSION}),
        );
    }
    json_response(
        StatusCode::OK,
        &json!({"status": "ok", "timestamp": now_secs(), "version": VERSION}),
    )
}

async fn not_found() -> Response {
    json_response(StatusCode::NOT_FOUND, &json!({"detail": "Not Found"}))
}

/// What a `/crawl` or `/md` request gets before its body is looked at.
enum Gate {
    Proceed,
    Answer(Response),
}

/// Auth, delay and scripted failures, shared by `/crawl` and `/md`.
async fn gate(shared: &Shared, headers: &HeaderMap) -> Gate {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (token, delay) = {
        let mut inner = shared.lock();
        inner.authorizations.push(authorization.clone());
        (inner.token.clone(), inner.delay)
    };
    if let Some(token) = token
        && authorization.as_deref() != Some(&format!("Bearer {token}"))
    {
        return Gate::Answer(json_response(
            StatusCode::UNAUTHORIZED,
            &json!({"detail": "Authentication required"}),
        ));
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let forced = {
        let mut inner = shared.lock();
        if let Some(status) = inner.status {
            Some(status)
        } else if inner.fail_all {
            Some(500)
        } else if inner.fail_next > 0 {
            inner.fail_next -= 1;
            Some(500)
        } else {
            None
        }
    };
    match forced {
        None => Gate::Proceed,
        Some(500) => Gate::Answer(every_url_failed(shared)),
        Some(504) => Gate::Answer(json_response(
            StatusCode::GATEWAY_TIMEOUT,
            &json!({"detail": "Crawl timed out"}),
        )),
        Some(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Gate::Answer(json_response(
                status,
                &json!({"detail": status.canonical_reason().unwrap_or("Error")}),
            ))
        }
    }
}

fn every_url_failed(shared: &Shared) -> Response {
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    json_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        &json!({"error": "Internal server error", "correlation_id": format!("{id:016x}")}),
    )
}

fn validation_error(kind: &str, loc: Value, msg: &str, input: Value) -> Response {
    json_response(
        StatusCode::UNPROCESSABLE_ENTITY,
        &json!({"detail": [{"type": kind, "loc": loc, "msg": msg, "input": input}]}),
    )
}

/// A page's result object, or the failure's error message.
fn result_for(shared: &Shared, url: &str) -> Result<Value, String> {
    let inner = shared.lock();
    if let Some(page) = inner.pages.get(url) {
        let final_url = page
            .redirected_url
            .clone()
            .unwrap_or_else(|| url.to_string());
        return Ok(json!({
            "url": url,
            "html": format!("<html><body>{}</body></html>", page.raw_markdown),
            "success": true,
            "cleaned_html": page.raw_markdown,
            "media": {"images": [], "videos": [], "audios": []},
            "links": {"internal": [], "external": []},
            "downloaded_files": null,
            "js_execution_result": null,
            "screenshot": null,
            "pdf": null,
            "mhtml": null,
            "extracted_content": null,
            "metadata": {"title": page.title, "description": null, "keywords": null, "author": null},
            "error_message": "",
            "session_id": null,
            "response_headers": {"content-type": "text/html; charset=utf-8"},
            "status_code": page.status_code,
            "ssl_certificate": null,
            "dispatch_result": null,
            "redirected_url": final_url,
            "network_requests": null,
            "console_messages": null,
            "tables": [],
            "markdown": {
                "raw_markdown": page.raw_markdown,
                "markdown_with_citations": page.raw_markdown,
                "references_markdown": "",
                "fit_markdown": page.fit_markdown,
                "fit_html": "",
            },
        }));
    }
    Err(inner.failing.get(url).cloned().unwrap_or_else(|| {
        format!(
            "Unexpected error in _crawl_web at line 744 in _crawl_web: Error: Failed on navigating \
             ACS-GOTO:\nPage.goto: net::ERR_NAME_NOT_RESOLVED at {url}"
        )
    }))
}

async fn crawl(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    shared.crawl.fetch_add(1, Ordering::SeqCst);
    let started = Instant::now();
    let parsed: Result<Value, _> = serde_json::from_slice(&body);
    shared.lock().crawl_bodies.push(match &parsed {
        Ok(v) => v.clone(),
        Err(_) => Value::String(String::from_utf8_lossy(&body).into_owned()),
    });
    if let Gate::Answer(response) = gate(&shared, &headers).await {
        return response;
    }
    let Ok(request) = parsed else {
        return validation_error(
            "json_invalid",
            json!(["body", 0]),
            "JSON decode error",
            json!({}),
        );
    };
    let Some(urls) = request.get("urls") else {
        return validation_error(
            "missing",
            json!(["body", "urls"]),
            "Field required",
            request,
        );
    };
    let Some(urls) = urls.as_array() else {
        return validation_error(
            "list_type",
            json!(["body", "urls"]),
            "Input should be a valid list",
            urls.clone(),
        );
    };
    if urls.is_empty() {
        return validation_error(
            "too_short",
            json!(["body", "urls"]),
            "List should have at least 1 item after validation, not 0",
            json!([]),
        );
    }
    if urls.len() > 100 {
        return validation_error(
            "too_long",
            json!(["body", "urls"]),
            &format!(
                "List should have at most 100 items after validation, not {}",
                urls.len()
            ),
            Value::Array(urls.clone()),
        );
    }
    let mut results = Vec::new();
    let mut any_ok = false;
    for url in urls {
        let Some(url) = url.as_str() else {
            return validation_error(
                "string_type",
                json!(["body", "urls", 0]),
                "Input should be a valid string",
                url.clone(),
            );
        };
        match result_for(&shared, url) {
            Ok(result) => {
                any_ok = true;
                results.push(result);
            }
            Err(message) => results.push(json!({
                "url": url,
                "html": "",
                "success": false,
                "error_message": message,
                "status_code": null,
                "redirected_url": null,
                "metadata": {},
                "links": {"internal": [], "external": []},
                "markdown": null,
            })),
        }
    }
    if !any_ok {
        return every_url_failed(&shared);
    }
    json_response(
        StatusCode::OK,
        &json!({
            "success": true,
            "results": results,
            "server_processing_time_s": started.elapsed().as_secs_f64(),
            "server_memory_delta_mb": 0.0,
            "server_peak_memory_mb": 0.0,
        }),
    )
}

async fn md(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    shared.md.fetch_add(1, Ordering::SeqCst);
    if let Gate::Answer(response) = gate(&shared, &headers).await {
        return response;
    }
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return validation_error(
            "json_invalid",
            json!(["body", 0]),
            "JSON decode error",
            json!({}),
        );
    };
    let Some(url) = request
        .get("url")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return validation_error("missing", json!(["body", "url"]), "Field required", request);
    };
    let filter = request
        .get("f")
        .and_then(Value::as_str)
        .unwrap_or("fit")
        .to_string();
    if !matches!(filter.as_str(), "fit" | "raw" | "bm25" | "llm") {
        return validation_error(
            "enum",
            json!(["body", "f"]),
            "Input should be 'raw', 'fit', 'bm25' or 'llm'",
            json!(filter),
        );
    }
    let query = request.get("q").cloned().unwrap_or(Value::Null);
    let cache = request
        .get("c")
        .cloned()
        .unwrap_or_else(|| Value::String("0".into()));
    let page = shared.lock().pages.get(&url).cloned();
    let Some(page) = page else {
        return every_url_failed(&shared);
    };
    let markdown = if filter == "raw" || page.fit_markdown.is_empty() {
        page.raw_markdown
    } else {
        page.fit_markdown
    };
    json_response(
        StatusCode::OK,
        &json!({
            "url": url,
            "filter": filter,
            "query": query,
            "cache": cache,
            "markdown": markdown,
            "success": true,
        }),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One raw HTTP/1.1 request; the status and the JSON body.
    async fn call(
        fake: &FakeCrawl4ai,
        method: &str,
        path: &str,
        auth: Option<&str>,
        body: &str,
    ) -> (u16, Value) {
        let mut stream = tokio::net::TcpStream::connect(fake.addr()).await.unwrap();
        let auth = auth
            .map(|a| format!("authorization: {a}\r\n"))
            .unwrap_or_default();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status = response[9..12].parse().unwrap();
        let (_, body) = response.split_once("\r\n\r\n").unwrap();
        (status, serde_json::from_str(body).unwrap())
    }

    #[tokio::test]
    async fn health_crawl_and_md_follow_the_contract() {
        let fake = FakeCrawl4ai::start().await.unwrap();
        let (status, health) = call(&fake, "GET", "/health", None, "").await;
        assert_eq!(status, 200);
        assert_eq!(
            (health["status"].clone(), health["version"].clone()),
            (json!("ok"), json!(VERSION))
        );
        assert!(health["timestamp"].as_f64().unwrap() > 0.0);

        fake.page(
            "https://a.test/",
            FakePage::new("A", "# A\n\ntext")
                .fit("text")
                .redirected_to("https://a.test/home"),
        );
        let (status, body) = call(
            &fake,
            "POST",
            "/crawl",
            None,
            r#"{"urls":["https://a.test/","https://b.test/"],"browser_config":{},"crawler_config":{}}"#,
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(body["success"], json!(true));
        let ok = &body["results"][0];
        assert_eq!(
            (
                ok["url"].clone(),
                ok["success"].clone(),
                ok["status_code"].clone(),
                ok["redirected_url"].clone(),
                ok["metadata"]["title"].clone()
            ),
            (
                json!("https://a.test/"),
                json!(true),
                json!(200),
                json!("https://a.test/home"),
                json!("A")
            )
        );
        assert_eq!(
            ok["markdown"],
            json!({"raw_markdown": "# A\n\ntext", "markdown_with_citations": "# A\n\ntext", "references_markdown": "", "fit_markdown": "text", "fit_html": ""})
        );
        assert_eq!(ok["links"], json!({"internal": [], "external": []}));
        let failed = &body["results"][1];
        assert_eq!(
            (failed["success"].clone(), failed["markdown"].clone()),
            (json!(false), Value::Null)
        );
        assert!(
            failed["error_message"]
                .as_str()
                .unwrap()
                .contains("net::ERR_NAME_NOT_RESOLVED at https://b.test/")
        );

        // Every URL failed: 500.
        let (status, body) = call(
            &fake,
            "POST",
            "/crawl",
            None,
            r#"{"urls":["https://b.test/"]}"#,
        )
        .await;
        assert_eq!(status, 500);
        assert_eq!(body["error"], json!("Internal server error"));
        assert_eq!(body["correlation_id"].as_str().unwrap().len(), 16);

        let (status, body) = call(
            &fake,
            "POST",
            "/md",
            None,
            r#"{"url":"https://a.test/","f":"fit","q":null,"c":"0"}"#,
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(
            body,
            json!({"url": "https://a.test/", "filter": "fit", "query": null, "cache": "0", "markdown": "text", "success": true})
        );
        let (_, body) = call(
            &fake,
            "POST",
            "/md",
            None,
            r#"{"url":"https://a.test/","f":"raw"}"#,
        )
        .await;
        assert_eq!(body["markdown"], json!("# A\n\ntext"));
        assert_eq!(
            (
                fake.crawl_requests(),
                fake.md_requests(),
                fake.health_requests()
            ),
            (2, 2, 1)
        );
    }

    #[tokio::test]
    async fn errors_follow_the_contract() {
        let fake = FakeCrawl4ai::start().await.unwrap();
        let (status, body) = call(&fake, "POST", "/crawl", None, r#"{"browser_config":{}}"#).await;
        assert_eq!(status, 422);
        assert_eq!(body["detail"][0]["type"], json!("missing"));
        assert_eq!(body["detail"][0]["loc"], json!(["body", "urls"]));
        let (status, body) = call(&fake, "POST", "/crawl", None, "{not json").await;
        assert_eq!(
            (status, body["detail"][0]["type"].clone()),
            (422, json!("json_invalid"))
        );
        let (status, _) = call(&fake, "POST", "/crawl", None, r#"{"urls":[]}"#).await;
        assert_eq!(status, 422);

        fake.require_token(Some("t0k"));
        let (status, body) = call(
            &fake,
            "POST",
            "/crawl",
            None,
            r#"{"urls":["https://a.test/"]}"#,
        )
        .await;
        assert_eq!(
            (status, body),
            (401, json!({"detail": "Authentication required"}))
        );
        let (status, _) = call(
            &fake,
            "POST",
            "/md",
            Some("Bearer wrong"),
            r#"{"url":"https://a.test/"}"#,
        )
        .await;
        assert_eq!(status, 401);
        // /health needs no token.
        assert_eq!(call(&fake, "GET", "/health", None, "").await.0, 200);
        fake.page("https://a.test/", FakePage::new("A", "a"));
        let (status, _) = call(
            &fake,
            "POST",
            "/crawl",
            Some("Bearer t0k"),
            r#"{"urls":["https://a.test/"]}"#,
        )
        .await;
        assert_eq!(status, 200);

        fake.force_status(Some(504));
        let (status, body) = call(
            &fake,
            "POST",
            "/crawl",
            Some("Bearer t0k"),
            r#"{"urls":["https://a.test/"]}"#,
        )
        .await;
        assert_eq!((status, body), (504, json!({"detail": "Crawl timed out"})));
        fake.force_status(None);
        fake.fail_next(1);
        assert_eq!(
            call(
                &fake,
                "POST",
                "/crawl",
                Some("Bearer t0k"),
                r#"{"urls":["https://a.test/"]}"#
            )
            .await
            .0,
            500
        );
        assert_eq!(
            call(
                &fake,
                "POST",
                "/crawl",
                Some("Bearer t0k"),
                r#"{"urls":["https://a.test/"]}"#
            )
            .await
            .0,
            200
        );
        assert_eq!(
            call(&fake, "GET", "/nope", None, "").await,
            (404, json!({"detail": "Not Found"}))
        );
        assert_eq!(
            fake.authorizations(),
            [
                vec![None; 4],
                vec![Some("Bearer wrong".to_string())],
                vec![Some("Bearer t0k".to_string()); 4]
            ]
            .concat()
        );
    }

    #[tokio::test]
    async fn dropping_stops_the_server() {
        let fake = FakeCrawl4ai::start().await.unwrap();
        let addr = fake.addr();
        drop(fake);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
