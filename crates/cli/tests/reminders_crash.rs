//! Reminders survive crashes: the scheduler killed with SIGKILL before a
//! reminder is due still fires it after a restart, marked late; the
//! orchestrator killed while delivering leaves exactly one copy of each
//! firing in the session.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::scheduler::v1 as rpb;
use agentry_proto::sessions::v1::event::Kind;
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Service;
use common::{Log, Orchestrator, SchedulerProcess, cluster_without_orchestrator};
use std::collections::BTreeMap;
use std::time::Duration;

fn reminder(session_id: &str, due: &str, message: &str) -> rpb::CreateReminderRequest {
    rpb::CreateReminderRequest {
        session_id: session_id.into(),
        due: due.into(),
        message: message.into(),
        kind: agentry_proto::sessions::v1::ReminderKind::Notify as i32,
        recurrence: None,
        task: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scheduler_killed_before_the_due_time_fires_late_after_restart() {
    let mut cluster = Cluster::start_only(
        &[
            Service::SessionStore,
            Service::ToolRunner,
            Service::Orchestrator,
        ],
        |_| {},
    )
    .await
    .unwrap();
    let mut scheduler = SchedulerProcess::new(&mut cluster);
    scheduler.start().await;
    let session = cluster
        .orchestrator()
        .await
        .unwrap()
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut log = Log::follow(&cluster, &session.id).await;
    cluster
        .scheduler()
        .await
        .unwrap()
        .create_reminder(reminder(&session.id, "in 2s", "check the oven"))
        .await
        .unwrap();
    scheduler.kill();
    // Down past the due time.
    tokio::time::sleep(Duration::from_secs(4)).await;
    scheduler.start().await;
    let fired = log
        .until("the reminder", |k| matches!(k, Kind::ReminderDue(_)))
        .await;
    let Some(Kind::ReminderDue(due)) = fired.kind else {
        unreachable!()
    };
    assert_eq!(due.message, "check the oven");
    assert!(due.late_ms >= 1500, "late by only {} ms", due.late_ms);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_orchestrator_killed_during_delivery_leaves_exactly_one_copy() {
    let mut cluster = cluster_without_orchestrator(|c| c.scheduler.redeliver_after_secs = 1).await;
    let mut orchestrator = Orchestrator::new(&mut cluster);
    let mut client = orchestrator.start().await;
    let session = client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut log = Log::follow(&cluster, &session.id).await;
    let mut scheduler = cluster.scheduler().await.unwrap();
    const COUNT: usize = 6;
    for i in 0..COUNT {
        scheduler
            .create_reminder(reminder(&session.id, "in 1s", &format!("reminder {i}")))
            .await
            .unwrap();
    }
    // Kill it as soon as the first one is in the log: some firings are
    // stored but not yet acknowledged, others not delivered at all.
    log.until("a reminder", |k| matches!(k, Kind::ReminderDue(_)))
        .await;
    orchestrator.kill();
    orchestrator.start().await;
    for _ in 0..COUNT {
        // (the first was already seen)
        if log
            .seen
            .iter()
            .filter(|e| matches!(e.kind, Some(Kind::ReminderDue(_))))
            .count()
            >= COUNT
        {
            break;
        }
        log.until("the next reminder", |k| matches!(k, Kind::ReminderDue(_)))
            .await;
    }
    // Give redelivery a few rounds to produce duplicates, if it would.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = cluster
        .store()
        .await
        .unwrap()
        .read(agentry_proto::sessions::v1::ReadRequest {
            session_id: session.id.clone(),
            from_seq: 1,
            limit: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for e in &all {
        if let Some(Kind::ReminderDue(r)) = &e.kind {
            *copies.entry(r.firing_id.clone()).or_default() += 1;
        }
    }
    assert_eq!(copies.len(), COUNT, "{copies:?}");
    assert!(copies.values().all(|n| *n == 1), "{copies:?}");
    // And every firing was acknowledged in the end.
    let pending = scheduler
        .list_reminders(rpb::ListRemindersRequest {
            session_id: session.id.clone(),
            status: rpb::ReminderStatus::Completed as i32,
        })
        .await
        .unwrap()
        .into_inner()
        .reminders;
    assert_eq!(pending.len(), COUNT);
}
