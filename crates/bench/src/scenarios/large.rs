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
    append_turns(&mut store, &long.id, &mut seq, &mut turn, events).await?;
    let logged = seq - 1;
    println!(
        "{logged} events ({turn} turns) written in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The orchestrator restarts: the session is no longer loaded, and the
    // log written straight to the store has no checkpoint: the whole log
    // is read.
    let whole = turn_after_restart(&mut stack, &long.id, "and one more thing").await?;
    println!(
        "first turn after a restart, {logged}-event session, no checkpoint (the whole log \
         read): started in {:.1} ms, finished in {:.1} ms; orchestrator RSS {:.1} → {:.1} MiB",
        whole.started_ms, whole.finished_ms, whole.rss_before_mib, whole.rss_after_mib
    );

    // That turn's end stored a checkpoint; then as many events as may come
    // after one before the next (`orchestrator.checkpoint_every_events`,
    // 1,000 by default, less one), and the orchestrator restarts again.
    let checkpoint = store
        .read(spb::ReadRequest {
            session_id: long.id.clone(),
            from_seq: 1,
            limit: 1,
            from_checkpoint: true,
        })
        .await?
        .into_inner()
        .checkpoint
        .ok_or_else(|| anyhow::anyhow!("the long session's turn stored no checkpoint"))?;
    let mut seq = store
        .get_session(spb::GetSessionRequest {
            session_id: long.id.clone(),
        })
        .await?
        .into_inner()
        .event_count
        + 1;
    let after_checkpoint = seq - 1 - checkpoint.seq
        + append_turns(&mut store, &long.id, &mut seq, &mut turn, APPEND_BATCH).await?;
    let resumed = turn_after_restart(&mut stack, &long.id, "and another thing").await?;
    println!(
        "first turn after a restart, {}-event session, from its checkpoint (after event {}, \
         {} bytes) and the {after_checkpoint} events after it: started in {:.1} ms, finished \
         in {:.1} ms; orchestrator RSS {:.1} → {:.1} MiB",
        seq - 1,
        checkpoint.seq,
        checkpoint.state.len(),
        resumed.started_ms,
        resumed.finished_ms,
        resumed.rss_before_mib,
        resumed.rss_after_mib
    );
    Ok(json!({
        "sessions": sessions,
        "list_p50_ms": list_p50, "list_p99_ms": list_p99,
        "console_list_p50_ms": console_p50, "console_list_p99_ms": console_p99,
        "long_session_events": logged,
        "whole_log_turn_started_ms": whole.started_ms,
        "whole_log_turn_finished_ms": whole.finished_ms,
        "orchestrator_rss_before_mib": whole.rss_before_mib,
        "orchestrator_rss_after_mib": whole.rss_after_mib,
        "checkpoint_seq": checkpoint.seq,
        "checkpoint_bytes": checkpoint.state.len(),
        "events_after_checkpoint": after_checkpoint,
        "first_turn_started_ms": resumed.started_ms,
        "first_turn_finished_ms": resumed.finished_ms,
    }))
}

/// A turn timed from its `Submit`.
struct TimedTurn {
    /// Until the `Submit` was answered (the session loaded, the message
    /// stored).
    started_ms: f64,
    /// Until its `turn_finished`.
    finished_ms: f64,
    rss_before_mib: f64,
    rss_after_mib: f64,
}

/// Restarts the orchestrator, then sends `text` to the session and times
/// its turn.
async fn turn_after_restart(
    stack: &mut Stack,
    session_id: &str,
    text: &str,
) -> anyhow::Result<TimedTurn> {
    stack.restart("orchestrator").await?;
    let pid = stack.pid("orchestrator").unwrap_or_default();
    let rss = || crate::stats::status_kib(pid, "VmRSS").unwrap_or(0) as f64 / 1024.0;
    let rss_before_mib = rss();
    let mut client = stack.orchestrator().await?;
    let at = Instant::now();
    let submitted = submit(&mut client, session_id, text).await?;
    let started_ms = at.elapsed().as_secs_f64() * 1000.0;
    let turn_id = submitted.into_inner().turn_id;
    let mut events_stream = follow(&mut client, session_id).await?;
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
    Ok(TimedTurn {
        started_ms,
        finished_ms,
        rss_before_mib,
        rss_after_mib: rss(),
    })
}

/// Appends finished turns to the session, straight to the store, from
/// `seq` on, until `events` more are written (whole turns: fewer when
/// `events` is not a multiple of three); returns how many were written.
async fn append_turns(
    store: &mut SessionStoreClient<agentry_testkit::cluster::Channel>,
    session_id: &str,
    seq: &mut u64,
    turn: &mut u64,
    events: usize,
) -> anyhow::Result<u64> {
    let mut written = 0u64;
    while (written as usize) + 3 <= events {
        let mut batch = Vec::with_capacity(APPEND_BATCH);
        while batch.len() + 3 <= APPEND_BATCH && (written as usize) + batch.len() + 3 <= events {
            *turn += 1;
            batch.extend(one_turn(*turn));
        }
        let count = batch.len() as u64;
        store
            .append(spb::AppendRequest {
                session_id: session_id.to_string(),
                expected_seq: *seq,
                events: batch,
                ..Default::default()
            })
            .await?;
        *seq += count;
        written += count;
    }
    Ok(written)
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
