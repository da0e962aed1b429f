//! How late do reminders fire? Loads N pending reminders into a fresh
//! scheduler store (SQLite on disk, durable writes), of which a sample falls
//! due over the next few seconds and the rest far in the future; runs the
//! real firing worker; and measures, for each sample reminder, the time from
//! its due time to the moment its firing was handed to delivery.
//!
//! `cargo run --release -p agentry-scheduler --example lateness -- [N...]`
//! (default: 1000 10000 100000). Prints a table of p50 / p99 / max lateness.

use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_scheduler::schedule::MissedPolicy;
use agentry_scheduler::store::{Kind, NewReminder, Store};
use agentry_scheduler::{Core, Settings, SystemClock};
use chrono::Utc;
use std::sync::Arc;
use std::time::Duration;

/// Reminders that fall due during the measurement.
const SAMPLE: usize = 1000;
/// Over how long the sample falls due.
const WINDOW: Duration = Duration::from_secs(5);

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn measure(pending: usize) -> Result<(f64, f64, f64, usize), Box<dyn std::error::Error>> {
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
        });
    }
    let loader = store.clone();
    tokio::task::spawn_blocking(move || loader.create_many(reminders, now)).await??;
    // The worker never checks sessions; the client is never dialled.
    let sessions = SessionStoreClient::new(agentry_runtime::telemetry::traced(
        tonic::transport::Endpoint::from_static("http://127.0.0.1:9").connect_lazy(),
    ));
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
    lateness.sort_by(f64::total_cmp);
    Ok((
        percentile(&lateness, 50.0),
        percentile(&lateness, 99.0),
        lateness.last().copied().unwrap_or(f64::NAN),
        sample,
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        sizes
    };
    println!(
        "reminder lateness (due time → firing handed to delivery), {SAMPLE} due over {}s",
        WINDOW.as_secs()
    );
    println!(
        "{:>10} {:>8} {:>10} {:>10} {:>10}",
        "pending", "fired", "p50 ms", "p99 ms", "max ms"
    );
    for pending in sizes {
        let (p50, p99, max, fired) = measure(pending).await?;
        println!("{pending:>10} {fired:>8} {p50:>10.2} {p99:>10.2} {max:>10.2}");
    }
    Ok(())
}
