//! Reminders: scheduled by the model, fired by the scheduler, delivered
//! into the session exactly once.

use crate::support::*;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::scheduler::v1 as rpb;
use agentry_proto::sessions::v1::{TurnOutcome, event::Kind};
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Service;
use agentry_testkit::fake_model::Reply;
use pretty_assertions::assert_eq;
use serde_json::json;
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;

async fn create_session(cluster: &Cluster) -> String {
    cluster
        .store()
        .await
        .unwrap()
        .create_session(agentry_proto::sessions::v1::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .id
}

fn request(session_id: &str, due: &str, message: &str) -> rpb::CreateReminderRequest {
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
async fn a_reminder_the_model_schedules_fires_into_the_session() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "r1",
        "schedule_reminder",
        json!({"message": "stand up and stretch", "due": "in 1s"}),
    ));
    cluster.model.push(Reply::text("I'll remind you."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "remind me in a second to stretch").await;
    let got = until_finished(&mut events, &turn).await;
    let result = &tool_results(&got)[0];
    assert!(!result.is_error, "{}", result.output);
    assert!(
        result.output.starts_with("scheduled reminder "),
        "{}",
        result.output
    );
    // The policy allows scheduling without asking.
    assert!(
        !got.iter()
            .any(|e| matches!(e.kind, Some(Kind::ApprovalRequested(_))))
    );

    let due = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let e = events.message().await.unwrap().unwrap();
            if let Some(Kind::ReminderDue(r)) = e.kind {
                return r;
            }
        }
    })
    .await
    .expect("the reminder fired within 10 s");
    assert_eq!(due.message, "stand up and stretch");
    assert_eq!(
        due.kind(),
        agentry_proto::sessions::v1::ReminderKind::Notify
    );
    assert!(
        due.legacy_kind.is_empty(),
        "new events carry the typed kind"
    );
    assert!(due.late_ms < 1000, "{}", due.late_ms);
    // Listed as completed.
    let listed = cluster
        .scheduler()
        .await
        .unwrap()
        .list_reminders(rpb::ListRemindersRequest {
            session_id: session.id.clone(),
            status: rpb::ReminderStatus::Completed as i32,
        })
        .await
        .unwrap()
        .into_inner()
        .reminders;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].fire_count, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_reminder_runs_a_turn_on_its_message() {
    let cluster = Cluster::start().await.unwrap();
    let session_id = create_session(&cluster).await;
    let mut client = cluster.orchestrator().await.unwrap();
    let mut events = client
        .subscribe(pb::SubscribeRequest {
            session_id: session_id.clone(),
            from_seq: 1,
            live_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    cluster.model.push(Reply::text("Time to water the plants!"));
    cluster
        .scheduler()
        .await
        .unwrap()
        .create_reminder(rpb::CreateReminderRequest {
            kind: agentry_proto::sessions::v1::ReminderKind::Task as i32,
            ..request(&session_id, "in 1s", "water the plants")
        })
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), events.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Some(Kind::ReminderDue(due)) = &first.kind else {
        panic!("expected reminder_due, got {first:?}");
    };
    assert_eq!(due.kind(), agentry_proto::sessions::v1::ReminderKind::Task);
    let turn = first.turn_id.clone();
    assert!(!turn.is_empty());
    let rest = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&rest).outcome, TurnOutcome::Completed as i32);
    assert_eq!(finished(&rest).message, "Time to water the plants!");
    let messages = cluster.model.requests()[0]["messages"].clone();
    let content = messages[1]["content"].as_str().unwrap();
    assert!(content.contains("water the plants"), "{content}");
    assert!(content.contains("[Reminder]"), "{content}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_model_lists_and_cancels_its_reminders() {
    let cluster = Cluster::start().await.unwrap();
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let reminder = cluster
        .scheduler()
        .await
        .unwrap()
        .create_reminder(request(&session.id, "in 1h", "call mum"))
        .await
        .unwrap()
        .into_inner();
    cluster
        .model
        .push(Reply::tool_call("l1", "list_reminders", json!({})));
    cluster.model.push(Reply::tool_call(
        "c1",
        "cancel_reminder",
        json!({"reminder_id": reminder.id}),
    ));
    cluster.model.push(Reply::tool_call(
        "c2",
        "cancel_reminder",
        json!({"reminder_id": "not-a-reminder"}),
    ));
    cluster.model.push(Reply::text("Cancelled."));
    let turn = send(&mut client, &session.id, "cancel my reminders").await;
    let got = until_finished(&mut events, &turn).await;
    let results = tool_results(&got);
    assert!(
        results[0].output.contains("call mum"),
        "{}",
        results[0].output
    );
    assert!(
        results[0].output.contains(&reminder.id),
        "{}",
        results[0].output
    );
    assert!(!results[1].is_error, "{}", results[1].output);
    assert!(
        results[1].output.starts_with("cancelled reminder"),
        "{}",
        results[1].output
    );
    assert!(results[2].is_error);
    assert!(
        results[2].output.contains("not found"),
        "{}",
        results[2].output
    );
    let status = cluster
        .scheduler()
        .await
        .unwrap()
        .list_reminders(rpb::ListRemindersRequest {
            session_id: session.id.clone(),
            status: rpb::ReminderStatus::Cancelled as i32,
        })
        .await
        .unwrap()
        .into_inner()
        .reminders;
    assert_eq!(status.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_reminders_are_refused_and_nothing_is_stored() {
    let cluster = Cluster::start().await.unwrap();
    let session_id = create_session(&cluster).await;
    let mut scheduler = cluster.scheduler().await.unwrap();
    let cases: Vec<(rpb::CreateReminderRequest, tonic::Code, &str)> = vec![
        (
            request(&session_id, "2020-01-01T00:00:00Z", "old"),
            tonic::Code::InvalidArgument,
            "past",
        ),
        (
            request(&session_id, "tomorrow-ish", "x"),
            tonic::Code::InvalidArgument,
            "tomorrow-ish",
        ),
        (
            request(&session_id, "2026-12-01T09:00:00", "no offset"),
            tonic::Code::InvalidArgument,
            "offset",
        ),
        (
            request(&session_id, "", "no due"),
            tonic::Code::InvalidArgument,
            "due",
        ),
        (
            rpb::CreateReminderRequest {
                recurrence: Some(rpb::Recurrence {
                    cron: "61 * * * *".into(),
                    time_zone: "UTC".into(),
                    missed: 0,
                }),
                ..request(&session_id, "", "bad cron")
            },
            tonic::Code::InvalidArgument,
            "cron",
        ),
        (
            rpb::CreateReminderRequest {
                recurrence: Some(rpb::Recurrence {
                    cron: "0 9 * * *".into(),
                    time_zone: "Mars/Olympus".into(),
                    missed: 0,
                }),
                ..request(&session_id, "", "bad zone")
            },
            tonic::Code::InvalidArgument,
            "Mars/Olympus",
        ),
        (
            request("no-such-session", "in 5m", "x"),
            tonic::Code::NotFound,
            "no-such-session",
        ),
        (
            request(&session_id, "in 5m", &"x".repeat(5000)),
            tonic::Code::InvalidArgument,
            "characters",
        ),
        (
            request(&session_id, "in 5m", "  "),
            tonic::Code::InvalidArgument,
            "empty",
        ),
        (
            rpb::CreateReminderRequest {
                kind: 0,
                ..request(&session_id, "in 5m", "kindless")
            },
            tonic::Code::InvalidArgument,
            "kind",
        ),
    ];
    for (req, code, needle) in cases {
        let err = scheduler.create_reminder(req).await.unwrap_err();
        assert_eq!(err.code(), code, "{}", err.message());
        assert!(
            err.message().contains(needle),
            "{:?} lacks {needle:?}",
            err.message()
        );
    }
    let all = scheduler
        .list_reminders(rpb::ListRemindersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .reminders;
    assert!(all.is_empty(), "{all:?}");
    let err = scheduler
        .cancel_reminder(rpb::CancelReminderRequest {
            reminder_id: "nope".into(),
            session_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
}

async fn next_due(stream: &mut tonic::Streaming<rpb::DueReminder>) -> rpb::DueReminder {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn unacknowledged_firings_are_sent_again_and_acked_ones_are_not() {
    let cluster = Cluster::start_only(&[Service::SessionStore, Service::Scheduler], |c| {
        c.scheduler.redeliver_after_secs = 1;
    })
    .await
    .unwrap();
    let session_id = create_session(&cluster).await;
    let mut scheduler = cluster.scheduler().await.unwrap();
    scheduler
        .create_reminder(request(&session_id, "in 1s", "ping"))
        .await
        .unwrap();

    let open = |scheduler: &mut rpb::scheduler_client::SchedulerClient<
        agentry_testkit::cluster::Channel,
    >| {
        let mut scheduler = scheduler.clone();
        async move {
            let (tx, rx) = tokio::sync::mpsc::channel(8);
            tx.send(rpb::StreamDueRequest {
                kind: Some(rpb::stream_due_request::Kind::Subscribe(rpb::Subscribe {
                    consumer: "test".into(),
                })),
            })
            .await
            .unwrap();
            let stream = scheduler
                .stream_due(ReceiverStream::new(rx))
                .await
                .unwrap()
                .into_inner();
            (tx, stream)
        }
    };
    let (_tx, mut stream) = open(&mut scheduler).await;
    let first = next_due(&mut stream).await;
    assert_eq!(first.reminder.as_ref().unwrap().message, "ping");
    // Not acked: the same firing comes again on the same stream...
    let again = next_due(&mut stream).await;
    assert_eq!(again.firing_id, first.firing_id);
    drop(stream);
    // ...and on a new one.
    let (tx, mut stream) = open(&mut scheduler).await;
    assert_eq!(next_due(&mut stream).await.firing_id, first.firing_id);
    tx.send(rpb::StreamDueRequest {
        kind: Some(rpb::stream_due_request::Kind::Ack(rpb::Ack {
            firing_id: first.firing_id.clone(),
        })),
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(stream);
    let (_tx, mut stream) = open(&mut scheduler).await;
    let quiet = tokio::time::timeout(Duration::from_millis(2500), stream.message()).await;
    assert!(quiet.is_err(), "an acked firing was sent again: {quiet:?}");
}
