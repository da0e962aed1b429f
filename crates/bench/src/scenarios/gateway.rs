//! The web gateway: many pages watching one session while an answer
//! streams. What the gateway adds to each token's way (from the
//! orchestrator's stream to a page's), what a page's first load weighs,
//! and what an open stream costs the gateway.

use super::{follow, paced_reply, submit};
use crate::stack::{SERVICES, Stack};
use crate::stats::{status_kib, summary};
use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::sessions::v1 as spb;
use agentry_testkit::fake_model::FakeModel;
use eventsource_stream::Eventsource;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio_stream::StreamExt;

/// Tokens of the streamed answer.
const TOKENS: usize = 300;

/// The console's files, as a browser loads them.
const FILES: [&str; 3] = ["/", "/console.css", "/console.js"];

/// One page's live stream: when each token of the answer reached it.
async fn watch(
    http: reqwest::Client,
    url: String,
    cookie: String,
    ready: Arc<AtomicUsize>,
) -> anyhow::Result<Vec<Instant>> {
    let response = http.get(url).header("cookie", cookie).send().await?;
    anyhow::ensure!(
        response.status().is_success(),
        "the live stream answered {}",
        response.status()
    );
    let mut events = response.bytes_stream().eventsource();
    let mut arrivals = Vec::with_capacity(TOKENS);
    let mut first = true;
    while let Some(event) = events.next().await {
        let at = Instant::now();
        let event = event?;
        if first {
            ready.fetch_add(1, Ordering::SeqCst);
            first = false;
        }
        if event.event != "patch" {
            continue;
        }
        let data: Value = serde_json::from_str(&event.data)?;
        for entry in data["entries"].as_array().into_iter().flatten() {
            if entry["kind"] != "answer" {
                continue;
            }
            if let Some(more) = entry["append"].as_str() {
                arrivals.extend(more.split_whitespace().map(|_| at));
            } else if entry["streaming"] == true {
                arrivals.extend(
                    entry["text"]
                        .as_str()
                        .unwrap_or_default()
                        .split_whitespace()
                        .map(|_| at),
                );
            }
        }
        if arrivals.len() >= TOKENS {
            break;
        }
    }
    Ok(arrivals)
}

/// Logs in to the console with the client token, as a browser does; the
/// session cookie.
pub(super) async fn console_login(http: &reqwest::Client, stack: &Stack) -> anyhow::Result<String> {
    let base = &stack.urls["gateway"];
    let token = stack
        .auth
        .client_token()
        .ok_or_else(|| anyhow::anyhow!("no client token"))?
        .secret()
        .to_string();
    let login = http
        .post(format!("{base}/api/login"))
        .json(&json!({"token": token}))
        .send()
        .await?;
    anyhow::ensure!(login.status().is_success(), "login: {}", login.status());
    Ok(login
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .ok_or_else(|| anyhow::anyhow!("the login set no cookie"))?
        .to_string())
}

/// `watchers` pages on one session while an answer of [`TOKENS`] tokens
/// streams, one every 5 ms.
pub async fn gateway(bin: &Path, watchers: usize) -> anyhow::Result<Value> {
    let pace = Duration::from_millis(5);
    let model = FakeModel::start().await?;
    model.forget_requests();
    let mut services = SERVICES.to_vec();
    services.push("gateway");
    let stack = Stack::start_only(bin, &model.base_url(), &services).await?;
    let base = stack.urls["gateway"].clone();
    println!("\n== gateway: {watchers} pages on one session, {TOKENS} tokens streamed");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(watchers + 8)
        .build()?;

    // A page's first load: its files, and nothing from elsewhere.
    let mut bytes = 0;
    let mut external = 0;
    for path in FILES {
        let body = http
            .get(format!("{base}{path}"))
            .send()
            .await?
            .text()
            .await?;
        bytes += body.len();
        for pattern in [
            "src=\"http",
            "href=\"http",
            "url(http",
            "from \"http",
            "import(\"http",
        ] {
            external += body.matches(pattern).count();
        }
    }
    println!(
        "console's first load: {bytes} bytes in {} files, {external} references elsewhere",
        FILES.len()
    );

    let cookie = console_login(&http, &stack).await?;

    let mut client = stack.orchestrator().await?;
    let session = client
        .create_session(opb::CreateSessionRequest::default())
        .await?
        .into_inner();
    let gateway_pid = stack
        .pid("gateway")
        .ok_or_else(|| anyhow::anyhow!("no gateway process"))?;
    let rss_before = status_kib(gateway_pid, "VmRSS").unwrap_or_default();
    let ready = Arc::new(AtomicUsize::new(0));
    let url = format!("{base}/api/sessions/{}/live", session.id);
    let pages: Vec<_> = (0..watchers)
        .map(|_| {
            tokio::spawn(watch(
                http.clone(),
                url.clone(),
                cookie.clone(),
                ready.clone(),
            ))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ready.load(Ordering::SeqCst) < watchers {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {watchers} pages got their first message",
            ready.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_open = status_kib(gateway_pid, "VmRSS").unwrap_or_default();

    // The reference: the orchestrator's own stream, as the gateway reads it.
    let mut events = follow(&mut client, &session.id).await?;
    model.push(paced_reply(TOKENS, pace));
    let _ = model.take_text_sent();
    submit(&mut client, &session.id, "stream").await?;
    let mut reference = Vec::with_capacity(TOKENS);
    while let Some(event) = events.next().await {
        let at = Instant::now();
        match event?.kind {
            Some(spb::event::Kind::ModelTextDelta(d)) => {
                reference.extend(d.text.split_whitespace().map(|_| at));
            }
            Some(spb::event::Kind::TurnFinished(_)) => break,
            _ => {}
        }
    }
    let sent = model.take_text_sent();
    let mut added = Vec::with_capacity(watchers * TOKENS);
    let mut total = Vec::with_capacity(watchers * TOKENS);
    let mut short = 0;
    for page in pages {
        let arrivals = tokio::time::timeout(Duration::from_secs(30), page)
            .await
            .map_err(|_| anyhow::anyhow!("a page never got the whole answer"))???;
        if arrivals.len() < TOKENS {
            short += 1;
        }
        for (i, at) in arrivals.iter().enumerate() {
            if let Some(r) = reference.get(i) {
                added.push(at.saturating_duration_since(*r).as_secs_f64() * 1000.0);
            }
            if let Some(s) = sent.get(i) {
                total.push(at.saturating_duration_since(*s).as_secs_f64() * 1000.0);
            }
        }
    }
    anyhow::ensure!(short == 0, "{short} of {watchers} pages missed tokens");
    let (a50, a99, amax) = summary(&mut added);
    let (t50, t99, tmax) = summary(&mut total);
    let per_stream_kib = rss_open.saturating_sub(rss_before) as f64 / watchers as f64;
    println!("token delay (p50 / p99 / max ms):");
    println!("  model send → page             {t50:8.3} {t99:8.3} {tmax:8.3}");
    println!("  orchestrator stream → page    {a50:8.3} {a99:8.3} {amax:8.3}");
    println!(
        "gateway memory: {} KiB before, {} KiB with {watchers} streams open: {per_stream_kib:.1} KiB per stream",
        rss_before, rss_open
    );
    Ok(json!({
        "watchers": watchers,
        "tokens": TOKENS,
        "pace_ms": pace.as_secs_f64() * 1000.0,
        "first_load_bytes": bytes,
        "first_load_external_refs": external,
        "model_to_page_p50_ms": t50, "model_to_page_p99_ms": t99, "model_to_page_max_ms": tmax,
        "added_p50_ms": a50, "added_p99_ms": a99, "added_max_ms": amax,
        "rss_before_kib": rss_before,
        "rss_open_kib": rss_open,
        "per_stream_kib": per_stream_kib,
    }))
}
