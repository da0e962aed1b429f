//! One contract, two backends: the scheduler's store on SQLite and on a
//! real PostgreSQL server (started for the test as an unprivileged user);
//! and two schedulers sharing one PostgreSQL database fire each reminder
//! once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_fakes::postgres::Postgres;
use agentry_scheduler::Backend;
use agentry_scheduler::pg::PgStore;
use agentry_scheduler::schedule::{MissedPolicy, Recurrence};
use agentry_scheduler::store::{Kind, NewReminder, Status, Store, StoreError};
use chrono::{DateTime, TimeZone, Utc};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn reminder(session: &str, message: &str, due: DateTime<Utc>) -> NewReminder {
    NewReminder {
        session_id: session.into(),
        message: message.into(),
        kind: Kind::Task,
        due,
        recurrence: None,
        missed: MissedPolicy::Once,
        task: None,
    }
}

async fn the_contract(store: &Backend) {
    let now = t("2026-01-01T10:00:00Z");
    let grace = chrono::Duration::seconds(60);
    // Create, read, list.
    let a = store
        .create(
            reminder("s1", "first", now + chrono::Duration::minutes(5)),
            now,
        )
        .await
        .unwrap();
    assert_eq!(a.status, Status::Pending);
    assert_eq!(store.get(a.id.clone()).await.unwrap(), a);
    let b = store
        .create(
            reminder("s2", "second", now + chrono::Duration::minutes(1)),
            now,
        )
        .await
        .unwrap();
    let mut hourly = reminder("s1", "hourly", now + chrono::Duration::hours(1));
    hourly.recurrence = Some(Recurrence::parse("0 * * * *", "UTC").unwrap());
    let c = store.create(hourly, now).await.unwrap();
    let listed: Vec<String> = store
        .list(None, None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(
        listed,
        [b.id.clone(), a.id.clone(), c.id.clone()],
        "soonest first"
    );
    assert_eq!(store.list(Some("s1".into()), None).await.unwrap().len(), 2);
    assert_eq!(store.pending_count().await.unwrap(), 3);
    assert_eq!(
        store.next_due().await.unwrap(),
        Some(now + chrono::Duration::minutes(1))
    );
    assert!(matches!(
        store.get("nope".into()).await,
        Err(StoreError::NotFound(_))
    ));

    // Cancel: only pending ones, only by their session.
    assert!(matches!(
        store.cancel(a.id.clone(), Some("s2".into())).await,
        Err(StoreError::NotFound(_))
    ));
    let cancelled = store.cancel(a.id.clone(), Some("s1".into())).await.unwrap();
    assert_eq!(cancelled.status, Status::Cancelled);
    assert!(matches!(
        store.cancel(a.id.clone(), None).await,
        Err(StoreError::NotPending { .. })
    ));

    // Nothing is due yet; then b and c fall due.
    assert!(store.fire_due(now, grace, 100).await.unwrap().is_empty());
    let later = now + chrono::Duration::hours(1);
    let fired = store.fire_due(later, grace, 100).await.unwrap();
    let ids: HashSet<String> = fired.iter().map(|f| f.reminder.id.clone()).collect();
    assert_eq!(ids, [b.id.clone(), c.id.clone()].into());
    let once = fired.iter().find(|f| f.reminder.id == b.id).unwrap();
    assert_eq!(once.reminder.status, Status::Completed);
    assert_eq!(once.late_ms, 59 * 60 * 1000);
    let recurring = fired.iter().find(|f| f.reminder.id == c.id).unwrap();
    assert_eq!(recurring.reminder.status, Status::Pending);
    assert_eq!(
        recurring.reminder.next_due,
        Some(now + chrono::Duration::hours(2))
    );
    // Firing again at the same time fires nothing more.
    assert!(store.fire_due(later, grace, 100).await.unwrap().is_empty());

    // Delivered until acknowledged, acknowledged once.
    let unacked: HashSet<String> = store
        .unacked()
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.firing_id)
        .collect();
    assert_eq!(unacked.len(), 2);
    let first = fired[0].firing_id.clone();
    assert!(store.ack(first.clone()).await.unwrap());
    assert!(!store.ack(first.clone()).await.unwrap());
    assert!(!store.ack("unknown@1".into()).await.unwrap());
    assert_eq!(store.unacked().await.unwrap().len(), 1);

    scheduled_tasks(store, later).await;
}

/// A scheduled task keeps its settings, pauses and resumes, and its runs
/// are recorded (a record of the same firing replaces the earlier one).
async fn scheduled_tasks(store: &Backend, now: DateTime<Utc>) {
    use agentry_proto::scheduler::v1::{RunState, ScheduledRun, ScheduledTask};
    let grace = chrono::Duration::seconds(60);
    let task = ScheduledTask {
        project_dir: "/srv/app".into(),
        agent: "researcher".into(),
        approval_mode: 3,
    };
    let new = NewReminder {
        session_id: String::new(),
        task: Some(task.clone()),
        recurrence: Some(Recurrence::parse("0 * * * *", "UTC").unwrap()),
        ..reminder("", "look at the build", now + chrono::Duration::minutes(10))
    };
    let created = store.create(new, now).await.unwrap();
    assert_eq!(created.task, Some(task.clone()));
    assert_eq!(
        store.get(created.id.clone()).await.unwrap().task,
        Some(task)
    );

    // Paused, it does not fire; resumed, it falls due when told.
    let paused = store
        .set_paused(created.id.clone(), true, now)
        .await
        .unwrap();
    assert_eq!(paused.status, Status::Paused);
    let long_after = now + chrono::Duration::hours(5);
    let fired = store.fire_due(long_after, grace, 100).await.unwrap();
    assert!(fired.iter().all(|f| f.reminder.id != created.id));
    assert!(matches!(
        store.set_paused(created.id.clone(), true, now).await,
        Err(StoreError::NotPending { .. })
    ));
    let resume_at = long_after + chrono::Duration::minutes(30);
    let resumed = store
        .set_paused(created.id.clone(), false, resume_at)
        .await
        .unwrap();
    assert_eq!(resumed.status, Status::Pending);
    assert_eq!(resumed.next_due, Some(resume_at));
    // Only a recurring reminder pauses.
    let once = store
        .create(
            reminder("s1", "once", now + chrono::Duration::hours(9)),
            now,
        )
        .await
        .unwrap();
    assert!(matches!(
        store.set_paused(once.id.clone(), true, now).await,
        Err(StoreError::NotRecurring(_))
    ));

    // Runs: newest first, a second record of one firing replaces it.
    let run = |due_ms: i64, state: RunState, note: &str| ScheduledRun {
        firing_id: format!("{}@{due_ms}", created.id),
        reminder_id: created.id.clone(),
        due_time: Some(prost_types::Timestamp {
            seconds: due_ms / 1000,
            nanos: 0,
        }),
        session_id: "run-session".into(),
        turn_id: "turn".into(),
        state: state as i32,
        note: note.into(),
        from_seq: 1,
        ..Default::default()
    };
    store
        .record_run(run(1_000_000, RunState::Running, ""), now)
        .await
        .unwrap();
    store
        .record_run(run(2_000_000, RunState::Skipped, "still going"), now)
        .await
        .unwrap();
    store
        .record_run(run(1_000_000, RunState::Completed, "done"), now)
        .await
        .unwrap();
    let runs = store.runs(created.id.clone(), 10).await.unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].state, RunState::Skipped as i32);
    assert_eq!(runs[0].note, "still going");
    assert_eq!(runs[1].state, RunState::Completed as i32);
    assert_eq!(runs[1].note, "done");
    assert_eq!(store.runs(created.id.clone(), 1).await.unwrap().len(), 1);
    assert!(store.runs("other".into(), 10).await.unwrap().is_empty());

    // A paused schedule can be removed.
    store
        .set_paused(created.id.clone(), true, now)
        .await
        .unwrap();
    let removed = store.cancel(created.id.clone(), None).await.unwrap();
    assert_eq!(removed.status, Status::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("scheduler.db")).unwrap();
    the_contract(&Backend::Sqlite(Arc::new(store))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_contract() {
    let Some(server) = Postgres::start() else {
        return;
    };
    let url = server.create_database("scheduler");
    let store = PgStore::connect(&url, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    the_contract(&Backend::Postgres(Arc::new(store))).await;
}

/// Two schedulers on one database, starting together (each migrates under
/// the lock), firing at the same moments: every reminder fires exactly
/// once between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_schedulers_fire_each_reminder_once() {
    let Some(server) = Postgres::start() else {
        return;
    };
    let url = server.create_database("shared");
    let (one, two) = tokio::join!(
        PgStore::connect(&url, Duration::from_secs(10)),
        PgStore::connect(&url, Duration::from_secs(10))
    );
    let (one, two) = (
        Backend::Postgres(Arc::new(one.unwrap())),
        Backend::Postgres(Arc::new(two.unwrap())),
    );
    let now = Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap();
    let reminders: Vec<NewReminder> = (0..300)
        .map(|i| reminder(&format!("s{}", i % 7), &format!("r{i}"), now))
        .collect();
    one.create_many(reminders, now - chrono::Duration::minutes(1))
        .await
        .unwrap();
    let fire = |store: Backend| {
        tokio::spawn(async move {
            let mut fired = Vec::new();
            loop {
                // Small batches, so the two interleave.
                let batch = store
                    .fire_due(now, chrono::Duration::seconds(60), 10)
                    .await
                    .unwrap();
                if batch.is_empty() {
                    return fired;
                }
                fired.extend(batch.into_iter().map(|f| f.firing_id));
            }
        })
    };
    let (a, b) = tokio::join!(fire(one.clone()), fire(two.clone()));
    let (a, b) = (a.unwrap(), b.unwrap());
    let all: HashSet<&String> = a.iter().chain(&b).collect();
    assert_eq!(a.len() + b.len(), 300, "{} + {} firings", a.len(), b.len());
    assert_eq!(all.len(), 300, "a reminder fired twice");
    assert!(
        !a.is_empty() && !b.is_empty(),
        "both schedulers took a share"
    );
    assert_eq!(two.pending_count().await.unwrap(), 0);
    assert_eq!(one.unacked().await.unwrap().len(), 300);
}
