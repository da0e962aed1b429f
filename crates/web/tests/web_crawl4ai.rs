//! The Crawl4AI backend against the fake Crawl4AI server, in the chain with
//! the plain HTTP backend behind it: success, the bearer token, 401 (not
//! retried), 500/504 (retried, then the next backend), a slow answer
//! (timeout, then the next backend), a stopped service, redirects to
//! refused addresses, the health check, and the order of the chain.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod web_support;

use agentry_fakes::fake_crawl4ai::{FakeCrawl4ai, FakePage};
use agentry_tool::ToolOutcome;
use agentry_web::breaker::{BreakerState, BreakerStats};
use agentry_web::crawl4ai::{Crawl4ai, Crawl4aiSettings, Crawl4aiStats, Health};
use agentry_web::http::{HttpBackend, HttpSettings};
use agentry_web::ssrf::Guard;
use agentry_web::{Backend, BackendName, FetchError, FetchFuture, Page, Web};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use web_support::{PageServer, Reply, config};

fn settings(base: &str) -> Crawl4aiSettings {
    let mut s = Crawl4aiSettings::new(url::Url::parse(base).unwrap());
    s.timeout = Duration::from_millis(400);
    s.retry_base_delay = Duration::from_millis(5);
    s
}

fn http_backend(guard: &Arc<Guard>) -> Arc<dyn Backend> {
    Arc::new(
        HttpBackend::new(
            HttpSettings {
                timeout: Duration::from_secs(5),
                max_body_bytes: 1 << 20,
                max_redirects: 5,
            },
            guard.clone(),
        )
        .unwrap(),
    )
}

/// crawl4ai → http, with 127.0.0.1 allowlisted.
fn chain(crawl4ai: &Arc<Crawl4ai>) -> Web {
    let guard = Arc::new(Guard::new(&["127.0.0.1".to_string()]));
    Web::from_backends(vec![crawl4ai.clone(), http_backend(&guard)], guard, 5000)
}

async fn fetch(web: &Web, url: &str) -> ToolOutcome {
    web.call("web_fetch", &json!({ "url": url }).to_string())
        .await
        .unwrap()
}

fn ok(output: String) -> ToolOutcome {
    ToolOutcome {
        output,
        ..ToolOutcome::default()
    }
}

fn error(output: String) -> ToolOutcome {
    ToolOutcome {
        output,
        is_error: true,
        ..ToolOutcome::default()
    }
}

/// A page server with `/page` (served to the HTTP backend).
async fn pages() -> PageServer {
    let server = PageServer::start().await;
    server.route("/page", Reply::new(200, "text/plain", "plain http body"));
    server
}

#[tokio::test]
async fn a_page_comes_through_crawl4ai() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    let server = pages().await;
    let url = server.url("/page");
    fake.page(
        &url,
        FakePage::new("From Crawl4AI", "# Heading\n\nRendered text."),
    );
    let crawl4ai = Arc::new(Crawl4ai::new(settings(&fake.url())).unwrap());
    let web = chain(&crawl4ai);
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {url} with crawl4ai]\n# From Crawl4AI\n# Heading\n\nRendered text."
        ))
    );
    assert_eq!(fake.crawl_requests(), 1);
    assert_eq!(
        fake.crawl_bodies(),
        vec![json!({"urls": [url], "browser_config": {}, "crawler_config": {}})]
    );
    assert_eq!(fake.authorizations(), vec![None]);
    assert_eq!(server.hits("/page"), 0);
    // fit_markdown wins when the service filtered the page; the redirect is
    // reported.
    let moved = server.url("/moved");
    fake.page(
        &url,
        FakePage::new("Filtered", "raw text with menus")
            .fit("just the article")
            .redirected_to(&moved),
    );
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {moved} with crawl4ai]\n# Filtered\njust the article"
        ))
    );
    assert_eq!(
        crawl4ai.stats(),
        Crawl4aiStats {
            state: BreakerState::Closed,
            breaker: BreakerStats {
                fetches: 2,
                failures: 0,
                opens: 0,
                rejected: 0
            },
            requests: 2,
            health: Health::Unknown,
        }
    );
}

#[tokio::test]
async fn the_bearer_token_is_sent_and_a_401_is_not_retried() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    fake.require_token(Some("s3cret-token"));
    let server = pages().await;
    let url = server.url("/page");
    fake.page(&url, FakePage::new("Secret", "members only"));

    let mut with_token = settings(&fake.url());
    with_token.token = Some("s3cret-token".into());
    assert!(!format!("{with_token:?}").contains("s3cret"));
    let crawl4ai = Arc::new(Crawl4ai::new(with_token).unwrap());
    assert!(!format!("{crawl4ai:?}").contains("s3cret"));
    let web = chain(&crawl4ai);
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {url} with crawl4ai]\n# Secret\nmembers only"
        ))
    );
    assert_eq!(
        fake.authorizations(),
        vec![Some("Bearer s3cret-token".to_string())]
    );

    // Without the token: one request, reported, then plain HTTP.
    let crawl4ai = Arc::new(Crawl4ai::new(settings(&fake.url())).unwrap());
    let web = chain(&crawl4ai);
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {url} with http; skipped: crawl4ai (authentication failed (HTTP 401: \
             Authentication required); check crawl4ai_token)]\nplain http body"
        ))
    );
    assert_eq!(fake.crawl_requests(), 2);
    assert_eq!(crawl4ai.stats().breaker.failures, 1);
    // A wrong token is refused the same way.
    let mut wrong = settings(&fake.url());
    wrong.token = Some("guess".into());
    let crawl4ai = Arc::new(Crawl4ai::new(wrong).unwrap());
    assert_eq!(
        crawl4ai.fetch(&url::Url::parse(&url).unwrap()).await,
        Err(FetchError::Unavailable(
            "authentication failed (HTTP 401: Authentication required); check crawl4ai_token"
                .into()
        ))
    );
    assert_eq!(fake.crawl_requests(), 3);
}

#[tokio::test]
async fn server_errors_are_retried_three_times_then_the_next_backend_serves() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    let server = pages().await;
    let url = server.url("/page");
    fake.page(&url, FakePage::new("Crawled", "crawled body"));
    let crawl4ai = Arc::new(Crawl4ai::new(settings(&fake.url())).unwrap());
    let web = chain(&crawl4ai);

    fake.fail_all(true);
    let started = Instant::now();
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {url} with http; skipped: crawl4ai (HTTP 500: Internal server error after 3 tries)]\nplain http body"
        ))
    );
    assert_eq!(fake.crawl_requests(), 3);
    assert_eq!(server.hits("/page"), 1);
    // Backoff: 5 ms then 10 ms.
    assert!(started.elapsed() >= Duration::from_millis(15));

    // Two failures, then success on the third try.
    fake.fail_all(false);
    fake.fail_next(2);
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {url} with crawl4ai]\n# Crawled\ncrawled body"
        ))
    );
    assert_eq!(fake.crawl_requests(), 6);

    // 504 (the service's own timeout) is retried too.
    fake.force_status(Some(504));
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {url} with http; skipped: crawl4ai (HTTP 504: Crawl timed out after 3 tries)]\nplain http body"
        ))
    );
    assert_eq!(fake.crawl_requests(), 9);

    // 422 (a request the service rejects) is not.
    fake.force_status(Some(422));
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {url} with http; skipped: crawl4ai (HTTP 422: Unprocessable Entity)]\nplain http body"
        ))
    );
    assert_eq!(fake.crawl_requests(), 10);
    assert_eq!(
        crawl4ai.stats().breaker,
        BreakerStats {
            fetches: 4,
            failures: 3,
            opens: 0,
            rejected: 0
        }
    );
}

#[tokio::test]
async fn a_slow_answer_times_out_and_the_next_backend_serves() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    let server = pages().await;
    let url = server.url("/page");
    fake.page(&url, FakePage::new("Slow", "too late"));
    fake.set_delay(Duration::from_secs(3));
    let crawl4ai = Arc::new(Crawl4ai::new(settings(&fake.url())).unwrap());
    let web = chain(&crawl4ai);
    let started = Instant::now();
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {url} with http; skipped: crawl4ai (timed out after 400ms)]\nplain http body"
        ))
    );
    // Not retried: the timeout already used the page's time.
    assert_eq!(fake.crawl_requests(), 1);
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_stopped_service_is_skipped() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    let base = fake.url();
    drop(fake);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let server = pages().await;
    let url = server.url("/page");
    let crawl4ai = Arc::new(Crawl4ai::new(settings(&base)).unwrap());
    let web = chain(&crawl4ai);
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {url} with http; skipped: crawl4ai (cannot connect after 3 tries)]\nplain http body"
        ))
    );
    assert_eq!(crawl4ai.stats().requests, 3);
    assert_eq!(
        crawl4ai.check_health().await,
        Health::Down {
            reason: "cannot connect: Connection refused (os error 111)".into()
        }
    );
}

#[tokio::test]
async fn a_failed_page_falls_through_and_every_reason_is_listed() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    let server = pages().await;
    let url = server.url("/gone");
    fake.page(&url, FakePage::new("Not Found", "nothing").status(404));
    let crawl4ai = Arc::new(Crawl4ai::new(settings(&fake.url())).unwrap());
    let web = chain(&crawl4ai);
    assert_eq!(
        fetch(&web, &url).await,
        error(format!(
            "could not fetch {url}:\n- crawl4ai: HTTP 404\n- http: HTTP 404 Not Found"
        ))
    );
    // The service answered: not retried, and not a failure for the breaker.
    assert_eq!(fake.crawl_requests(), 1);
    assert_eq!(crawl4ai.stats().breaker.failures, 0);
}

#[tokio::test]
async fn a_redirect_to_a_refused_address_is_not_returned() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    let server = pages().await;
    let url = server.url("/page");
    fake.page(
        &url,
        FakePage::new("Metadata", "ami-id\ninstance-id")
            .redirected_to("http://169.254.169.254/latest/meta-data/"),
    );
    let crawl4ai = Arc::new(Crawl4ai::new(settings(&fake.url())).unwrap());
    let web = chain(&crawl4ai);
    assert_eq!(
        fetch(&web, &url).await,
        error(format!(
            "could not fetch {url}:\n- crawl4ai: the page redirected to a refused address: \
             refusing http://169.254.169.254/latest/meta-data/: 169.254.169.254 is the cloud \
             metadata address"
        ))
    );
    // The chain stops there.
    assert_eq!(server.hits("/page"), 0);
}

#[tokio::test]
async fn the_health_check_reports_and_does_not_move_the_breaker() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    let mut s = settings(&fake.url());
    s.health_every = Duration::from_millis(20);
    let crawl4ai = Arc::new(Crawl4ai::new(s).unwrap());
    assert_eq!(crawl4ai.health(), Health::Unknown);
    assert_eq!(
        crawl4ai.check_health().await,
        Health::Up {
            version: "0.9.5".into()
        }
    );
    fake.set_healthy(false);
    assert_eq!(
        crawl4ai.check_health().await,
        Health::Down {
            reason: "HTTP 503".into()
        }
    );
    assert_eq!(
        crawl4ai.stats(),
        Crawl4aiStats {
            state: BreakerState::Closed,
            breaker: BreakerStats::default(),
            requests: 0,
            health: Health::Down {
                reason: "HTTP 503".into()
            },
        }
    );
    fake.set_healthy(true);
    // In the background, through the chain; started once only.
    let guard = Arc::new(Guard::new(&[]));
    let web = Web::from_backends(vec![crawl4ai.clone(), http_backend(&guard)], guard, 100);
    let task = web.start_background().unwrap();
    assert!(web.start_background().is_none());
    let before = fake.health_requests();
    let deadline = Instant::now() + Duration::from_secs(5);
    while fake.health_requests() < before + 3 {
        assert!(Instant::now() < deadline, "no background health checks");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        crawl4ai.health(),
        Health::Up {
            version: "0.9.5".into()
        }
    );
    task.abort();
    assert_eq!(fake.crawl_requests(), 0);
}

/// A backend with a fixed answer that counts its calls.
struct Stub {
    name: BackendName,
    answer: Result<Page, FetchError>,
    calls: AtomicUsize,
}

impl Stub {
    fn new(name: BackendName, answer: Result<Page, FetchError>) -> Arc<Stub> {
        Arc::new(Stub {
            name,
            answer,
            calls: AtomicUsize::new(0),
        })
    }
}

impl Backend for Stub {
    fn name(&self) -> BackendName {
        self.name
    }

    fn fetch<'a>(&'a self, _url: &'a url::Url) -> FetchFuture<'a> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = self.answer.clone();
        Box::pin(async move { answer })
    }
}

#[tokio::test]
async fn the_chain_runs_in_order_crawl4ai_chromium_http() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    let server = pages().await;
    let url = server.url("/page");
    let mut cfg = config(&["127.0.0.1"]);
    cfg.crawl4ai_url = fake.url();
    cfg.crawl4ai_token = "tok".into();

    // Chromium serves what Crawl4AI could not.
    let chromium = Stub::new(
        BackendName::Chromium,
        Ok(Page {
            url: url.clone(),
            final_url: url.clone(),
            title: Some("Rendered".into()),
            markdown: "by chromium".into(),
            status: None,
        }),
    );
    let web = Web::new(&cfg, Some(chromium.clone()));
    assert_eq!(
        web.backends(),
        vec![
            BackendName::Crawl4ai,
            BackendName::Chromium,
            BackendName::Http
        ]
    );
    assert!(web.crawl4ai().is_some());
    fake.force_status(Some(500));
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {url} with chromium; skipped: crawl4ai (HTTP 500: Internal server error after 3 tries)]\n# Rendered\nby chromium"
        ))
    );
    assert_eq!(
        fake.authorizations(),
        vec![Some("Bearer tok".to_string()); 3]
    );
    assert_eq!(chromium.calls.load(Ordering::SeqCst), 1);
    assert_eq!(server.hits("/page"), 0);

    // Everything before http fails: every reason is named.
    let chromium = Stub::new(
        BackendName::Chromium,
        Err(FetchError::Failed("timed out after 30s".into())),
    );
    let guard = Arc::new(Guard::new(&["127.0.0.1".to_string()]));
    let mut s = settings(&fake.url());
    s.tries = 1;
    s.breaker.failure_threshold = 1;
    let crawl4ai = Arc::new(Crawl4ai::new(s).unwrap());
    let web = Web::from_backends(
        vec![crawl4ai.clone(), chromium.clone(), http_backend(&guard)],
        guard,
        5000,
    );
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {url} with http; skipped: crawl4ai (HTTP 500: Internal server error), chromium (timed out after 30s)]\nplain http body"
        ))
    );
    // The breaker opened on that failure.
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!(
            "[fetched {url} with http; skipped: crawl4ai (circuit open), chromium (timed out after 30s)]\nplain http body"
        ))
    );
    assert_eq!(crawl4ai.state(), BreakerState::Open);

    // An unsupported answer stops the chain.
    let refusing = Stub::new(
        BackendName::Chromium,
        Err(FetchError::Unsupported(
            "refusing application/pdf: not text".into(),
        )),
    );
    let guard = Arc::new(Guard::new(&["127.0.0.1".to_string()]));
    let web = Web::from_backends(vec![refusing.clone(), http_backend(&guard)], guard, 5000);
    let hits = server.hits("/page");
    assert_eq!(
        fetch(&web, &url).await,
        error(format!(
            "could not fetch {url}:\n- chromium: refusing application/pdf: not text"
        ))
    );
    assert_eq!(server.hits("/page"), hits);

    // Without crawl4ai_url, no Crawl4AI; a bad one is left out.
    let web = Web::new(&config(&[]), None);
    assert_eq!(web.backends(), vec![BackendName::Http]);
    assert!(web.crawl4ai().is_none());
    let mut bad = config(&[]);
    bad.crawl4ai_url = "not a url".into();
    assert_eq!(Web::new(&bad, None).backends(), vec![BackendName::Http]);
}
