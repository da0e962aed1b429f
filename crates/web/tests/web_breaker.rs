//! The Crawl4AI circuit breaker, driven by an injected clock (no sleeps
//! for the cool-down): it opens after the 5th consecutive failed fetch
//! (retries included in one fetch), refuses without touching the network
//! while open, half-opens after 5 minutes and lets exactly one probe
//! through; a failed probe re-opens it, a successful one closes it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod web_support;

use agentry_fakes::fake_crawl4ai::{FakeCrawl4ai, FakePage};
use agentry_web::breaker::{
    Breaker, BreakerSettings, BreakerState, BreakerStats, ManualClock, Refused,
};
use agentry_web::crawl4ai::{Crawl4ai, Crawl4aiSettings};
use agentry_web::http::{HttpBackend, HttpSettings};
use agentry_web::ssrf::Guard;
use agentry_web::{Backend, FetchError, Web};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use web_support::{PageServer, Reply};

const FIVE_MINUTES: Duration = Duration::from_secs(300);

fn crawl4ai(fake: &FakeCrawl4ai, clock: &Arc<ManualClock>) -> Arc<Crawl4ai> {
    let mut s = Crawl4aiSettings::new(url::Url::parse(&fake.url()).unwrap());
    s.timeout = Duration::from_secs(2);
    s.retry_base_delay = Duration::from_millis(1);
    s.clock = clock.clone();
    Arc::new(Crawl4ai::new(s).unwrap())
}

fn stats(fetches: u64, failures: u64, opens: u64, rejected: u64) -> BreakerStats {
    BreakerStats {
        fetches,
        failures,
        opens,
        rejected,
    }
}

#[tokio::test]
async fn opens_after_five_failures_half_opens_and_closes_on_a_good_probe() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    let url = url::Url::parse("http://127.0.0.1:9/page").unwrap();
    fake.page(url.as_str(), FakePage::new("Back", "back again"));
    fake.fail_all(true);
    let clock = Arc::new(ManualClock::new());
    let backend = crawl4ai(&fake, &clock);
    let failed = Err(FetchError::Failed(
        "HTTP 500: Internal server error after 3 tries".into(),
    ));

    for i in 1..=4u64 {
        assert_eq!(backend.fetch(&url).await, failed);
        assert_eq!(backend.state(), BreakerState::Closed, "after failure {i}");
        assert_eq!(fake.crawl_requests(), 3 * i);
    }
    assert_eq!(backend.fetch(&url).await, failed);
    assert_eq!(backend.state(), BreakerState::Open);
    assert_eq!(fake.crawl_requests(), 15);
    assert_eq!(backend.stats().breaker, stats(5, 5, 1, 0));

    // Open: refused at once, no request reaches the service.
    for _ in 0..3 {
        assert_eq!(
            backend.fetch(&url).await,
            Err(FetchError::Unavailable("circuit open".into()))
        );
    }
    assert_eq!(fake.crawl_requests(), 15);
    assert_eq!(backend.stats().breaker, stats(5, 5, 1, 3));

    // Still open a second before the cool-down ends.
    clock.advance(FIVE_MINUTES - Duration::from_secs(1));
    assert_eq!(backend.state(), BreakerState::Open);
    assert_eq!(
        backend.fetch(&url).await,
        Err(FetchError::Unavailable("circuit open".into()))
    );
    assert_eq!(fake.crawl_requests(), 15);

    // Half-open: one probe (with its retries); it fails, the breaker
    // opens again for another five minutes.
    clock.advance(Duration::from_secs(1));
    assert_eq!(backend.state(), BreakerState::HalfOpen);
    assert_eq!(backend.fetch(&url).await, failed);
    assert_eq!(fake.crawl_requests(), 18);
    assert_eq!(backend.state(), BreakerState::Open);
    assert_eq!(backend.stats().breaker, stats(6, 6, 2, 4));
    assert_eq!(
        backend.fetch(&url).await,
        Err(FetchError::Unavailable("circuit open".into()))
    );
    clock.advance(FIVE_MINUTES - Duration::from_secs(1));
    assert_eq!(backend.state(), BreakerState::Open);

    // The service is back: the next probe succeeds and closes the breaker.
    fake.fail_all(false);
    clock.advance(Duration::from_secs(1));
    assert_eq!(backend.state(), BreakerState::HalfOpen);
    let page = backend.fetch(&url).await.unwrap();
    assert_eq!(page.markdown, "back again");
    assert_eq!(backend.state(), BreakerState::Closed);
    assert_eq!(fake.crawl_requests(), 19);
    assert_eq!(backend.stats().breaker, stats(7, 6, 2, 5));
    // Closed again: it takes five new failures to open it.
    fake.fail_all(true);
    for _ in 0..4 {
        assert_eq!(backend.fetch(&url).await, failed);
    }
    assert_eq!(backend.state(), BreakerState::Closed);
}

#[tokio::test]
async fn a_success_resets_the_count_and_a_401_counts_as_a_failure() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    let url = url::Url::parse("http://127.0.0.1:9/page").unwrap();
    fake.page(url.as_str(), FakePage::new("Ok", "fine"));
    let clock = Arc::new(ManualClock::new());
    let backend = crawl4ai(&fake, &clock);
    fake.fail_all(true);
    for _ in 0..4 {
        backend.fetch(&url).await.unwrap_err();
    }
    fake.fail_all(false);
    backend.fetch(&url).await.unwrap();
    fake.fail_all(true);
    for _ in 0..4 {
        backend.fetch(&url).await.unwrap_err();
    }
    assert_eq!(backend.state(), BreakerState::Closed);
    assert_eq!(backend.stats().breaker, stats(9, 8, 0, 0));

    // 401 is not retried but is a failed fetch: five of them open it.
    fake.fail_all(false);
    fake.require_token(Some("needed"));
    let before = fake.crawl_requests();
    let backend = crawl4ai(&fake, &clock);
    for _ in 0..5 {
        backend.fetch(&url).await.unwrap_err();
    }
    assert_eq!(fake.crawl_requests(), before + 5);
    assert_eq!(backend.state(), BreakerState::Open);
}

#[tokio::test]
async fn while_open_the_chain_goes_straight_to_the_next_backend() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    let server = PageServer::start().await;
    server.route("/page", Reply::new(200, "text/plain", "plain http body"));
    let url = server.url("/page");
    fake.fail_all(true);
    let clock = Arc::new(ManualClock::new());
    let backend = crawl4ai(&fake, &clock);
    let guard = Arc::new(Guard::new(&["127.0.0.1".to_string()]));
    let http = HttpBackend::new(
        HttpSettings {
            timeout: Duration::from_secs(5),
            max_body_bytes: 1024,
            max_redirects: 2,
        },
        guard.clone(),
    )
    .unwrap();
    let web = Web::from_backends(vec![backend.clone(), Arc::new(http)], guard, 5000);
    let args = json!({ "url": url }).to_string();
    for _ in 0..5 {
        let outcome = web.call("web_fetch", &args).await.unwrap();
        assert_eq!(
            outcome.output,
            format!(
                "[fetched {url} with http; skipped: crawl4ai (HTTP 500: Internal server error after 3 tries)]\nplain http body"
            )
        );
    }
    assert_eq!(fake.crawl_requests(), 15);
    let outcome = web.call("web_fetch", &args).await.unwrap();
    assert_eq!(
        outcome.output,
        format!("[fetched {url} with http; skipped: crawl4ai (circuit open)]\nplain http body")
    );
    assert_eq!(fake.crawl_requests(), 15);
    assert_eq!(server.hits("/page"), 6);
}

#[tokio::test]
async fn half_open_lets_exactly_one_probe_through() {
    let clock = Arc::new(ManualClock::new());
    let breaker = Breaker::new(
        "test",
        BreakerSettings {
            failure_threshold: 2,
            open_for: Duration::from_secs(60),
        },
        clock.clone(),
    );
    breaker.try_acquire().unwrap().failure();
    assert_eq!(breaker.state(), BreakerState::Closed);
    breaker.try_acquire().unwrap().failure();
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(breaker.try_acquire().err(), Some(Refused::Open));

    clock.advance(Duration::from_secs(60));
    let probe = breaker.try_acquire().unwrap();
    assert!(probe.is_probe());
    assert_eq!(breaker.try_acquire().err(), Some(Refused::ProbeRunning));
    assert_eq!(breaker.try_acquire().err(), Some(Refused::ProbeRunning));
    // A probe dropped without a verdict (a cancelled call) frees the slot.
    drop(probe);
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    let probe = breaker.try_acquire().unwrap();
    assert!(probe.is_probe());
    probe.success();
    assert_eq!(breaker.state(), BreakerState::Closed);
    let call = breaker.try_acquire().unwrap();
    assert!(!call.is_probe());
    call.success();
    assert_eq!(breaker.stats(), stats(5, 2, 1, 3));
    assert_eq!(Refused::Open.to_string(), "circuit open");
    assert_eq!(
        Refused::ProbeRunning.to_string(),
        "circuit half-open, a probe is running"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_while_half_open_get_one_probe() {
    let fake = FakeCrawl4ai::start().await.unwrap();
    let url = url::Url::parse("http://127.0.0.1:9/page").unwrap();
    fake.page(url.as_str(), FakePage::new("Ok", "fine"));
    fake.fail_all(true);
    let clock = Arc::new(ManualClock::new());
    let backend = crawl4ai(&fake, &clock);
    for _ in 0..5 {
        backend.fetch(&url).await.unwrap_err();
    }
    assert_eq!(backend.state(), BreakerState::Open);
    fake.fail_all(false);
    fake.set_delay(Duration::from_millis(300));
    clock.advance(FIVE_MINUTES);
    let before = fake.crawl_requests();
    let results = futures::future::join_all((0..4).map(|_| {
        let backend = backend.clone();
        let url = url.clone();
        async move { backend.fetch(&url).await }
    }))
    .await;
    let pages = results.iter().filter(|r| r.is_ok()).count();
    let refused: Vec<_> = results.iter().filter_map(|r| r.clone().err()).collect();
    assert_eq!(pages, 1);
    assert_eq!(
        refused,
        vec![FetchError::Unavailable("circuit half-open, a probe is running".into()); 3]
    );
    assert_eq!(fake.crawl_requests(), before + 1);
    assert_eq!(backend.state(), BreakerState::Closed);
}
