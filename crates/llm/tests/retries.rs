//! Retries with backoff, against the testkit's fake server over real HTTP, for both protocols.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use agentry_fakes::fake_model::{FakeModel, Reply, cut, raw, text};
use agentry_llm::{LlmError, Provider, ProviderConfig, StreamEvent};
use pretty_assertions::assert_eq;
use support::{client, hello, retrying, run_err, run_ok};

const BOTH: [Provider; 2] = [Provider::OpenAi, Provider::Ollama];

#[tokio::test]
async fn server_error_then_success() {
    for provider in BOTH {
        let fake = FakeModel::start().await.unwrap();
        fake.push(Reply::error(503, "loading model"));
        fake.push(Reply::text("recovered"));
        let (deltas, completion) = run_ok(&client(retrying(&fake, provider, 3)), hello()).await;
        assert_eq!(deltas.concat(), "recovered", "{provider}");
        assert_eq!(completion.text, "recovered", "{provider}");
        assert_eq!(fake.request_count(), 2, "{provider}");
        assert_eq!(fake.pending(), 0, "{provider}");
    }
}

#[tokio::test]
async fn rate_limit_honors_retry_after() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(429, "slow down").retry_after(1));
    fake.push(Reply::text("finally"));
    let cfg = retrying(&fake, Provider::OpenAi, 3);
    assert_eq!(cfg.retry_base_delay, Duration::from_millis(10));
    let started = Instant::now();
    let (_, completion) = run_ok(&client(cfg), hello()).await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(1),
        "Retry-After: 1 must be honored, waited {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(5), "waited {elapsed:?}");
    assert_eq!(completion.text, "finally");
    assert_eq!(fake.request_count(), 2);
}

#[tokio::test]
async fn rate_limit_honors_retry_after_on_ollama() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(429, "too many requests").retry_after(1));
    fake.push(Reply::text("finally"));
    let started = Instant::now();
    let (_, completion) = run_ok(&client(retrying(&fake, Provider::Ollama, 1)), hello()).await;
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(completion.text, "finally");
    assert_eq!(fake.request_count(), 2);
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    for provider in BOTH {
        for status in [400, 401, 404, 409, 422] {
            let fake = FakeModel::start().await.unwrap();
            fake.push(Reply::error(status, "bad request"));
            fake.push(Reply::text("must not be used"));
            let err = client(retrying(&fake, provider, 3))
                .stream(hello())
                .await
                .err()
                .expect("must fail");
            assert!(
                matches!(&err, LlmError::Http { status: s, message } if *s == status && message == "bad request"),
                "{provider}: got {err:?}"
            );
            assert_eq!(fake.request_count(), 1, "{provider}: {status}");
            assert_eq!(fake.pending(), 1, "{provider}: {status}");
        }
    }
}

#[tokio::test]
async fn request_timeout_408_is_retried() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(408, "request timeout"));
    fake.push(Reply::text("ok"));
    let (_, completion) = run_ok(&client(retrying(&fake, Provider::OpenAi, 1)), hello()).await;
    assert_eq!(completion.text, "ok");
    assert_eq!(fake.request_count(), 2);
}

#[tokio::test]
async fn retries_exhausted_report_the_last_error_after_backoff() {
    for provider in BOTH {
        let fake = FakeModel::start().await.unwrap();
        fake.push(Reply::error(500, "first"));
        fake.push(Reply::error(502, "second"));
        fake.push(Reply::error(503, "third"));
        fake.push(Reply::text("never reached"));
        let mut cfg = retrying(&fake, provider, 2);
        cfg.retry_base_delay = Duration::from_millis(100);
        let started = Instant::now();
        let err = client(cfg).stream(hello()).await.err().expect("must fail");
        let elapsed = started.elapsed();
        assert!(
            matches!(&err, LlmError::Http { status: 503, message } if message == "third"),
            "{provider}: got {err:?}"
        );
        assert_eq!(fake.request_count(), 3, "{provider}: max_retries + 1");
        assert_eq!(fake.pending(), 1, "{provider}");
        // Backoff 100 ms then 200 ms, each with at most 10 % jitter.
        assert!(
            elapsed >= Duration::from_millis(270),
            "{provider}: {elapsed:?}"
        );
    }
}

#[tokio::test]
async fn zero_max_retries_never_retries() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(503, "busy"));
    fake.push(Reply::text("unused"));
    let err = client(retrying(&fake, Provider::Ollama, 0))
        .stream(hello())
        .await
        .err()
        .expect("must fail");
    assert!(matches!(err, LlmError::Http { status: 503, .. }), "{err:?}");
    assert_eq!(fake.request_count(), 1);
}

/// A free port of 127.0.0.1 nothing listens on.
fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test]
async fn connection_refused_is_retried_then_reported() {
    let addr = closed_port();
    let mut cfg = ProviderConfig::new(Provider::OpenAi, format!("http://{addr}/v1"), "m");
    cfg.max_retries = 2;
    cfg.retry_base_delay = Duration::from_millis(50);
    let started = Instant::now();
    let err = client(cfg).stream(hello()).await.err().expect("must fail");
    let elapsed = started.elapsed();
    assert!(
        matches!(&err, LlmError::Connect { reason, .. } if reason == "connection refused"),
        "got {err:?}"
    );
    // Two backoffs (50 ms, 100 ms, minus jitter) prove the two retries happened.
    assert!(elapsed >= Duration::from_millis(135), "{elapsed:?}");
}

#[tokio::test]
async fn connection_refused_until_the_server_comes_up() {
    let addr = closed_port();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let fake = FakeModel::start_on(addr).await.unwrap();
        fake.push(Reply::text("up now"));
        let _ = tx.send(fake);
    });
    let mut cfg = ProviderConfig::new(Provider::Ollama, format!("http://{addr}"), "m");
    cfg.max_retries = 6;
    cfg.retry_base_delay = Duration::from_millis(50);
    let started = Instant::now();
    let (_, completion) = run_ok(&client(cfg), hello()).await;
    assert_eq!(completion.text, "up now");
    assert!(started.elapsed() >= Duration::from_millis(150));
    let fake = rx.await.unwrap();
    assert_eq!(
        fake.request_paths().last().map(String::as_str),
        Some("/api/chat")
    );
}

#[tokio::test]
async fn header_timeout_is_retried() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::text("too late").delay(Duration::from_secs(2)));
    fake.push(Reply::text("on time"));
    let mut cfg = retrying(&fake, Provider::OpenAi, 1);
    cfg.request_timeout = Duration::from_millis(300);
    let (_, completion) = run_ok(&client(cfg), hello()).await;
    assert_eq!(completion.text, "on time");
    assert_eq!(fake.request_count(), 2);
}

#[tokio::test]
async fn stream_cut_before_any_output_is_retried() {
    for provider in BOTH {
        let fake = FakeModel::start().await.unwrap();
        fake.push(Reply::stream(vec![cut()]));
        fake.push(Reply::text("second try"));
        let (deltas, completion) = run_ok(&client(retrying(&fake, provider, 2)), hello()).await;
        assert_eq!(deltas.concat(), "second try", "{provider}");
        assert_eq!(completion.text, "second try", "{provider}");
        assert_eq!(fake.request_count(), 2, "{provider}");
    }
}

#[tokio::test]
async fn stream_cut_after_a_text_delta_is_not_retried() {
    for provider in BOTH {
        let fake = FakeModel::start().await.unwrap();
        fake.push(Reply::stream(vec![text("partial"), cut()]));
        fake.push(Reply::text("must not be used"));
        let (deltas, err) = run_err(&client(retrying(&fake, provider, 3)), hello()).await;
        assert_eq!(deltas, vec!["partial"], "{provider}");
        assert!(
            matches!(err, LlmError::Truncated(_)),
            "{provider}: got {err:?}"
        );
        assert_eq!(fake.request_count(), 1, "{provider}");
        assert_eq!(fake.pending(), 1, "{provider}");
    }
}

#[tokio::test]
async fn cut_streams_exhausting_the_retries_end_with_truncated() {
    for provider in BOTH {
        let fake = FakeModel::start().await.unwrap();
        for _ in 0..3 {
            fake.push(Reply::stream(vec![cut()]));
        }
        let (deltas, err) = run_err(&client(retrying(&fake, provider, 2)), hello()).await;
        assert!(deltas.is_empty(), "{provider}");
        assert!(
            matches!(err, LlmError::Truncated(_)),
            "{provider}: got {err:?}"
        );
        assert_eq!(fake.request_count(), 3, "{provider}");
    }
}

#[tokio::test]
async fn error_line_before_any_output_is_retried_but_malformed_is_not() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![raw(r#"{"error":"server busy"}"#)]));
    fake.push(Reply::text("ok"));
    let ollama = client(retrying(&fake, Provider::Ollama, 2));
    let (_, completion) = run_ok(&ollama, hello()).await;
    assert_eq!(completion.text, "ok");
    assert_eq!(fake.request_count(), 2);

    fake.push(Reply::stream(vec![raw("{not json")]));
    fake.push(Reply::text("unused"));
    let (_, err) = run_err(&ollama, hello()).await;
    assert!(matches!(err, LlmError::Malformed(_)), "got {err:?}");
    assert_eq!(fake.request_count(), 3, "a malformed stream is not retried");
}

#[tokio::test]
async fn a_completion_without_text_is_returned_first_and_not_retried() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::tool_call("c1", "f", serde_json::json!({"a": 1})));
    let mut stream = client(retrying(&fake, Provider::Ollama, 3))
        .stream(hello())
        .await
        .unwrap();
    let first = futures::StreamExt::next(&mut stream)
        .await
        .unwrap()
        .unwrap();
    let StreamEvent::Completed(c) = first else {
        panic!("expected Completed, got {first:?}");
    };
    assert_eq!(c.tool_calls.len(), 1);
    assert!(futures::StreamExt::next(&mut stream).await.is_none());
    assert_eq!(fake.request_count(), 1);
}

#[tokio::test]
async fn a_wait_longer_than_the_retry_window_is_handed_to_the_caller_at_once() {
    for provider in BOTH {
        let fake = FakeModel::start().await.unwrap();
        fake.push(Reply::error(429, "quota used up until the next hour").retry_after(3600));
        fake.push(Reply::text("must not be used"));
        let started = Instant::now();
        let err = client(retrying(&fake, provider, 3))
            .stream(hello())
            .await
            .err()
            .expect("must fail");
        assert!(
            matches!(&err, LlmError::TryLater { status: 429, after, message }
                if *after == Duration::from_secs(3600) && message.contains("quota")),
            "{provider}: got {err:?}"
        );
        assert!(err.is_retryable());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{provider}: it slept"
        );
        assert_eq!(fake.request_count(), 1, "{provider}");
    }
}

#[tokio::test]
async fn a_rate_limit_still_there_when_the_retries_run_out_says_how_long_to_wait() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(429, "slow down").retry_after(1));
    fake.push(Reply::error(429, "slow down").retry_after(5));
    let err = client(retrying(&fake, Provider::OpenAi, 1))
        .stream(hello())
        .await
        .err()
        .expect("must fail");
    assert!(
        matches!(&err, LlmError::TryLater { status: 429, after, .. } if *after == Duration::from_secs(5)),
        "{err:?}"
    );
    assert_eq!(fake.request_count(), 2);
}

#[tokio::test]
async fn rate_limit_reset_headers_and_overloads_give_the_wait() {
    // OpenAI's reset headers: the spent limit's reset counts.
    let fake = FakeModel::start().await.unwrap();
    fake.push(
        Reply::error(429, "rate limit reached for tokens")
            .header("x-ratelimit-remaining-requests", "12")
            .header("x-ratelimit-reset-requests", "1s")
            .header("x-ratelimit-remaining-tokens", "0")
            .header("x-ratelimit-reset-tokens", "6m0s"),
    );
    let err = client(retrying(&fake, Provider::OpenAi, 0))
        .stream(hello())
        .await
        .err()
        .expect("must fail");
    assert!(
        matches!(&err, LlmError::TryLater { after, .. } if *after == Duration::from_secs(360)),
        "{err:?}"
    );
    // Anthropic's: an RFC 3339 time.
    let fake = FakeModel::start().await.unwrap();
    let at = std::time::SystemTime::now() + Duration::from_secs(600);
    let secs = at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil(days);
    let stamp = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    );
    fake.push(
        Reply::error(429, "rate_limit_error")
            .header("anthropic-ratelimit-requests-remaining", "0")
            .header("anthropic-ratelimit-requests-reset", &stamp),
    );
    let err = client(anthropic(&fake))
        .stream(hello())
        .await
        .err()
        .expect("must fail");
    assert!(
        matches!(&err, LlmError::TryLater { after, .. }
            if *after > Duration::from_secs(590) && *after <= Duration::from_secs(600)),
        "{stamp}: {err:?}"
    );
    // An overloaded server without a hint: left alone for a while.
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(529, "Overloaded"));
    let err = client(anthropic(&fake))
        .stream(hello())
        .await
        .err()
        .expect("must fail");
    assert!(
        matches!(&err, LlmError::TryLater { status: 529, after, .. } if *after == Duration::from_secs(30)),
        "{err:?}"
    );
    // A plain 429 with no hint is the error it was.
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(429, "slow down"));
    let err = client(retrying(&fake, Provider::OpenAi, 0))
        .stream(hello())
        .await
        .err()
        .expect("must fail");
    assert!(
        matches!(&err, LlmError::Http { status: 429, .. }),
        "{err:?}"
    );
}

fn anthropic(fake: &FakeModel) -> ProviderConfig {
    let mut cfg = retrying(fake, Provider::Anthropic, 0);
    cfg.api_key = Some("sk-ant-test".into());
    cfg
}

/// Year, month, day of a day count since 1970-01-01.
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}
