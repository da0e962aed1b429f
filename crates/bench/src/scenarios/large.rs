//! Large numbers: a store holding many sessions (the first page of the
//! list, as `agentry sessions list` and the web console ask for it) and one
//! session with a very long log (its first turn after the orchestrator
//! restarts, when the log must be read again).

use super::{follow, submit};
use crate::stack::{SERVICES, Stack};
use crate::stats::summary;
use agentry_proto::sessions::v1 as spb;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_testkit::fake_model::{FakeModel, Fallback};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// Times each list request this many times.
const SAMPLES: usize = 50;

/// Events appended per request while the long log is written.
const APPEND_BATCH: usize = 999;

/// `sessions` stored sessions and one session of `events` events.
pub async fn large(bin: &Path, sessions: usize, events: usize) -> anyhow::Result<Value> {
    let model = FakeModel::start().await?;
    model.forget_requests();
    model.set_fallback(Fallback::Echo);
    let mut services = SERVICES.to_vec();
    services.push("gateway");
    let mut stack = Stack::start_only(bin, &model.base_url(), &services).await?;
    println!("\n== large: {sessions} stored sessions, one session of {events} events");
    let mut store = SessionStoreClient::new(stack.as_service("session-store").await?);

    // The sessions, made in the store directly (32 at a time): what is
    // measured is the list, not their creation.
    let started = Instant::now();
    let mut made = 0;
    while made < sessions {
        let batch = (sessions - made).min(32);
        let creates = (0..batch).map(|i| {
            let mut store = store.clone();
            let title = format!("session {}", made + i);
            async move {
                store
                    .create_session(spb::CreateSessionRequest {
                        title,
                        ..Default::default()
                    })
                    .await
            }
        });
        for created in futures::future::join_all(creates).await {
            created?;
        }
        made += batch;
    }
    println!(
        "{sessions} sessions stored in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The first page through the orchestrator, as the CLI asks.
    let mut client = stack.orchestrator().await?;
    let mut grpc = Vec::with_capacity(SAMPLES);
    let mut total = 0;
    for _ in 0..SAMPLES {
        let at = Instant::now();
        let page = client
            .list_sessions(spb::ListSessionsRequest::default())
            .await?
            .into_inner();
        grpc.push(at.elapsed().as_secs_f64() * 1000.0);
        total = page.total;
    }
    anyhow::ensure!(
        total >= sessions as u64,
        "the list counts {total} sessions, not {sessions}"
    );
    let (list_p50, list_p99, _) = summary(&mut grpc);
    println!("list, first page (gRPC ListSessions): p50 {list_p50:.2} ms, p99 {list_p99:.2} ms");

    // The same through the web console's API, logged in as a browser is.
    let (console_p50, console_p99) = console_list(&stack).await?;
    println!(
        "list, first page (console GET /api/sessions): p50 {console_p50:.2} ms, p99 {console_p99:.2} ms"
    );

    // One session with a long log: turns of a message, an answer and the
    // turn's end, written to the store directly.
    let long = store
        .create_session(spb::CreateSessionRequest {
            title: "a long conversation".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let started = Instant::now();
    let mut seq = 1u64;
    let mut turn = 0u64;
    while (seq as usize) <= events {
        let mut batch = Vec::with_capacity(APPEND_BATCH);
        while batch.len() + 3 <= APPEND_BATCH && (seq as usize) + batch.len() <= events {
            turn += 1;
            batch.extend(one_turn(turn));
        }
        if batch.is_empty() {
            break;
        }
        let count = batch.len() as u64;
        store
            .append(spb::AppendRequest {
                session_id: long.id.clone(),
                expected_seq: seq,
                events: batch,
                lease_epoch: 0,
                ..Default::default()
            })
            .await?;
        seq += count;
    }
    let logged = seq - 1;
    println!(
        "{logged} events ({turn} turns) written in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The orchestrator restarts: the session is no longer loaded.
    stack.restart("orchestrator").await?;
    let pid = stack.pid("orchestrator").unwrap_or_default();
    let rss_before = crate::stats::status_kib(pid, "VmRSS").unwrap_or(0);
    let mut client = stack.orchestrator().await?;
    let at = Instant::now();
    let submitted = submit(&mut client, &long.id, "and one more thing").await?;
    let started_ms = at.elapsed().as_secs_f64() * 1000.0;
    let turn_id = submitted.into_inner().turn_id;
    let mut events_stream = follow(&mut client, &long.id).await?;
    let finished_ms = loop {
        let Some(event) = tokio::time::timeout(Duration::from_secs(60), events_stream.message())
            .await
            .map_err(|_| {
                anyhow::anyhow!("the turn on the long session did not finish in 60 s")
            })??
        else {
            anyhow::bail!("the long session's events ended before its turn finished");
        };
        if event.turn_id == turn_id
            && let Some(spb::event::Kind::TurnFinished(done)) = event.kind
        {
            anyhow::ensure!(
                done.outcome == spb::TurnOutcome::Completed as i32,
                "the turn on the long session ended {}: {}",
                done.outcome,
                done.message
            );
            break at.elapsed().as_secs_f64() * 1000.0;
        }
    };
    let rss_after = crate::stats::status_kib(pid, "VmRSS").unwrap_or(0);
    println!(
        "first turn after a restart, {logged}-event session: started in {started_ms:.1} ms, \
         finished in {finished_ms:.1} ms; orchestrator RSS {:.1} → {:.1} MiB",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0
    );
    Ok(json!({
        "sessions": sessions,
        "list_p50_ms": list_p50, "list_p99_ms": list_p99,
        "console_list_p50_ms": console_p50, "console_list_p99_ms": console_p99,
        "long_session_events": logged,
        "first_turn_started_ms": started_ms, "first_turn_finished_ms": finished_ms,
        "orchestrator_rss_before_mib": rss_before as f64 / 1024.0,
        "orchestrator_rss_after_mib": rss_after as f64 / 1024.0,
    }))
}

/// One finished turn's events: the person's message, the answer, the end.
fn one_turn(n: u64) -> [spb::Event; 3] {
    let turn_id = format!("turn-{n:06}");
    let event = |kind| spb::Event {
        turn_id: turn_id.clone(),
        kind: Some(kind),
        ..Default::default()
    };
    [
        event(spb::event::Kind::UserMessage(spb::UserMessage {
            text: format!("question number {n}: what changed since the last one?"),
            approval_mode: spb::ApprovalMode::Policy as i32,
            ..Default::default()
        })),
        event(spb::event::Kind::ModelMessage(spb::ModelMessage {
            text: format!("answer number {n}: nothing much, the build is still green."),
            finish_reason: "stop".into(),
            step: 1,
            ..Default::default()
        })),
        event(spb::event::Kind::TurnFinished(spb::TurnFinished {
            outcome: spb::TurnOutcome::Completed as i32,
            message: format!("answer number {n}"),
            steps: 1,
            ..Default::default()
        })),
    ]
}

/// The console's list request timed [`SAMPLES`] times: (p50, p99) in ms.
async fn console_list(stack: &Stack) -> anyhow::Result<(f64, f64)> {
    let base = stack.urls["gateway"].clone();
    let http = reqwest::Client::new();
    let cookie = super::gateway::console_login(&http, stack).await?;
    let mut times = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let at = Instant::now();
        let response = http
            .get(format!("{base}/api/sessions"))
            .header("cookie", &cookie)
            .send()
            .await?;
        anyhow::ensure!(
            response.status().is_success(),
            "the console's list answered {}",
            response.status()
        );
        let body: Value = response.json().await?;
        times.push(at.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            body.is_object() || body.is_array(),
            "the console's list is not JSON: {body}"
        );
    }
    let (p50, p99, _) = summary(&mut times);
    Ok((p50, p99))
}
