//! Durable state: reminders, the store, idle sessions, lateness.

use super::*;

/// Reminder lateness among N pending (the scheduler's real worker over its
/// store on disk).
pub async fn reminders(pending: &[usize]) -> anyhow::Result<Value> {
    println!(
        "\n== reminders: {} falling due over {} s among N pending",
        crate::scenarios::lateness::SAMPLE,
        crate::scenarios::lateness::WINDOW.as_secs()
    );
    println!(
        "{:>10} {:>8} {:>10} {:>10} {:>10}",
        "pending", "fired", "p50 ms", "p99 ms", "max ms"
    );
    let mut runs = Vec::new();
    for &n in pending {
        let (p50, p99, max, fired) = lateness::measure(n).await?;
        println!("{n:>10} {fired:>8} {p50:>10.2} {p99:>10.2} {max:>10.2}");
        runs.push(
            json!({"pending": n, "fired": fired, "p50_ms": p50, "p99_ms": p99, "max_ms": max}),
        );
    }
    Ok(json!({"runs": runs}))
}

/// Durable appends of one small event, one writer and 16 concurrent.
pub async fn store(bin: &Path) -> anyhow::Result<Value> {
    const PER_WRITER: usize = 500;
    // The store alone: no orchestrator takes these sessions for its own.
    let stack = Stack::start_only(bin, "http://127.0.0.1:9/v1", &["session-store"]).await?;
    let channel = stack.as_service("session-store").await?;
    println!("\n== store: appends of one event, each durable (fsynced) before the answer");
    println!(
        "{:>8} {:>8} {:>12} {:>9} {:>9}",
        "writers", "appends", "appends/s", "p50 ms", "p99 ms"
    );
    let mut runs = Vec::new();
    for writers in [1usize, 16] {
        let appends = if writers == 1 {
            2 * PER_WRITER
        } else {
            PER_WRITER
        };
        let started = Instant::now();
        let tasks = (0..writers).map(|_| {
            let mut client = SessionStoreClient::new(channel.clone());
            async move {
                let session = client
                    .create_session(spb::CreateSessionRequest::default())
                    .await?
                    .into_inner();
                let mut latencies = Vec::with_capacity(appends);
                for seq in 1..=appends as u64 {
                    let t = Instant::now();
                    client
                        .append(spb::AppendRequest {
                            session_id: session.id.clone(),
                            expected_seq: seq,
                            events: vec![spb::Event {
                                kind: Some(spb::event::Kind::UserMessage(spb::UserMessage {
                                    images: Vec::new(),
                                    text: "a message of about sixty bytes, as a short chat line is"
                                        .into(),
                                    approval_mode: 0,
                                    plan: false,
                                    network: false,
                                    budget: None,
                                    compact: false,
                                })),
                                ..Default::default()
                            }],
                            lease_epoch: 0,
                            checkpoint: None,
                        })
                        .await?;
                    latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                anyhow::Ok(latencies)
            }
        });
        let mut latencies = Vec::new();
        for result in futures::future::join_all(tasks).await {
            latencies.extend(result?);
        }
        let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
        let count = latencies.len();
        let (p50, p99, _) = summary(&mut latencies);
        println!("{writers:>8} {count:>8} {rate:>12.1} {p50:>9.2} {p99:>9.2}");
        runs.push(json!({"writers": writers, "appends": count, "appends_per_sec": rate, "p50_ms": p50, "p99_ms": p99}));
    }
    Ok(json!({"runs": runs}))
}

/// Orchestrator memory per idle session: N sessions that each ran a turn.
pub async fn idle(bin: &Path, sessions: usize) -> anyhow::Result<Value> {
    let model = FakeModel::start().await?;
    model.forget_requests();
    model.set_fallback(react_model());
    let stack = Stack::start(bin, &model.base_url()).await?;
    println!("\n== idle: {sessions} sessions that each ran one turn, then idle");
    turn_run_quiet(&stack).await?;
    let pid = stack
        .pid("orchestrator")
        .ok_or_else(|| anyhow::anyhow!("no orchestrator process"))?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = crate::stats::status_kib(pid, "VmRSS").unwrap_or(0);
    let mut clients = Vec::new();
    for _ in 0..sessions.div_ceil(SESSIONS_PER_CONNECTION) {
        clients.push(stack.orchestrator().await?);
    }
    // Fifty at a time: this measures memory, not throughput.
    let mut errors = 0;
    for batch in (0..sessions).collect::<Vec<_>>().chunks(50) {
        let runs = batch
            .iter()
            .map(|&i| session_turns(clients[i / SESSIONS_PER_CONNECTION].clone(), &stack, 1));
        for result in futures::future::join_all(runs).await {
            errors += result.map(|(_, e)| e).unwrap_or(1);
        }
    }
    drop(clients);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = crate::stats::status_kib(pid, "VmRSS").unwrap_or(0);
    let per_session_kib = after.saturating_sub(before) as f64 / sessions as f64;
    println!(
        "orchestrator RSS {:.1} MiB → {:.1} MiB: {per_session_kib:.1} KiB per idle session ({errors} errors)",
        before as f64 / 1024.0,
        after as f64 / 1024.0
    );
    Ok(json!({
        "sessions": sessions, "rss_before_mib": before as f64 / 1024.0,
        "rss_after_mib": after as f64 / 1024.0, "kib_per_session": per_session_kib,
        "errors": errors,
    }))
}

pub mod lateness {
    //! How late do reminders fire? N pending reminders in a fresh scheduler
    //! store (SQLite on disk, durable writes), of which a sample falls due
    //! over a few seconds and the rest far in the future; the real firing
    //! worker runs; for each sample reminder, the time from its due time to
    //! the moment its firing was handed to delivery.

    use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
    use agentry_scheduler::schedule::MissedPolicy;
    use agentry_scheduler::store::{Kind, NewReminder, Store};
    use agentry_scheduler::{Core, Settings, SystemClock};
    use chrono::Utc;
    use std::sync::Arc;
    use std::time::Duration;

    /// Reminders that fall due during the measurement.
    pub const SAMPLE: usize = 1000;
    /// Over how long the sample falls due.
    pub const WINDOW: Duration = Duration::from_secs(5);

    /// (p50, p99, max) lateness in ms, and how many fired.
    pub async fn measure(pending: usize) -> anyhow::Result<(f64, f64, f64, usize)> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(Store::open(&dir.path().join("scheduler.db"))?);
        let now = Utc::now();
        let start = now + chrono::Duration::seconds(2);
        let sample = SAMPLE.min(pending);
        let mut reminders = Vec::with_capacity(pending);
        for i in 0..pending {
            let due = if i < sample {
                start
                    + chrono::Duration::microseconds(
                        (WINDOW.as_micros() as i64 * i as i64) / sample as i64,
                    )
            } else {
                now + chrono::Duration::days(1) + chrono::Duration::seconds(i as i64)
            };
            reminders.push(NewReminder {
                session_id: "bench".into(),
                message: format!("reminder {i}"),
                kind: Kind::Notify,
                due,
                recurrence: None,
                missed: MissedPolicy::Once,
                task: None,
            });
        }
        let store = agentry_scheduler::Backend::Sqlite(store);
        store.create_many(reminders, now).await?;
        // The worker never checks sessions; this client is never dialled.
        let sessions = SessionStoreClient::new(
            agentry_runtime::Auth::off().lazy_channel("http://127.0.0.1:9")?,
        );
        let core = Core::new(
            store,
            Arc::new(SystemClock),
            Settings::default(),
            sessions,
            "unused".into(),
        );
        let mut fired = core.subscribe_fired();
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let worker = tokio::spawn(core.clone().run_worker(stop));
        let mut lateness = Vec::with_capacity(sample);
        let deadline = tokio::time::Instant::now() + WINDOW + Duration::from_secs(10);
        while lateness.len() < sample {
            let firing = tokio::time::timeout_at(deadline, fired.recv()).await??;
            let observed = Utc::now();
            lateness.push((observed - firing.due).num_microseconds().unwrap_or(0) as f64 / 1000.0);
        }
        let _ = stop_tx.send(true);
        worker.abort();
        let (p50, p99, max) = crate::stats::summary(&mut lateness);
        Ok((p50, p99, max, sample))
    }
}
