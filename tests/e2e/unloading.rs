//! Sessions with nothing running are unloaded after
//! `orchestrator.unload_idle_secs` and loaded again from their log by the
//! next input: memory follows the sessions in use, and nothing about a
//! session changes.

use crate::support::*;
use agentry_proto::sessions::v1::{ApprovalDecision, ApprovalMode, TurnOutcome};
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Reply;
use pretty_assertions::assert_eq;
use serde_json::json;
use std::time::{Duration, Instant};

const LOADED: &str = "agentry_sessions_loaded";

/// Waits until the orchestrator holds `want` sessions, or fails saying
/// how many it holds.
async fn until_loaded(metrics: &str, want: f64, within: Duration) {
    let started = Instant::now();
    loop {
        let loaded = metric(metrics, LOADED).await;
        if loaded == want {
            return;
        }
        assert!(
            started.elapsed() < within,
            "{loaded} sessions loaded after {within:?}, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn cluster(unload_idle_secs: u64) -> (Cluster, String) {
    let metrics = metrics_addr();
    let listen = metrics.clone();
    let cluster = Cluster::start_with(move |c| {
        c.orchestrator.unload_idle_secs = unload_idle_secs;
        c.orchestrator.metrics_listen = listen;
    })
    .await
    .unwrap();
    (cluster, metrics)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_session_is_unloaded_and_its_next_turn_carries_on_the_conversation() {
    let (cluster, metrics) = cluster(3).await;
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    cluster.model.push(Reply::text("hello to you"));
    converse(&mut client, &session.id, &mut events, &["hello"]).await;
    assert_eq!(metric(&metrics, LOADED).await, 1.0);

    // Three seconds after its last activity, the session's actor is gone.
    until_loaded(&metrics, 0.0, Duration::from_secs(15)).await;

    // The next message loads it from the log: the model sees the whole
    // conversation, and the subscription opened before the unloading goes
    // on with the new turn's events.
    cluster
        .model
        .push(Reply::tool_call("call_1", "list_dir", json!({"path": "."})));
    cluster.model.push(Reply::text("still here"));
    let turn = send(&mut client, &session.id, "are you still there?").await;
    let received = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&received).outcome, TurnOutcome::Completed as i32);
    assert_eq!(metric(&metrics, LOADED).await, 1.0);
    let requests = cluster.model.requests();
    let contents: Vec<String> = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        contents.iter().any(|c| c == "hello")
            && contents.iter().any(|c| c == "hello to you")
            && contents.last().is_some_and(|c| c == "are you still there?"),
        "{contents:#?}"
    );

    // The log reads as one session's: gap-free, one `turn_finished` per turn.
    let log = read_log(&mut cluster.store().await.unwrap(), &session.id).await;
    let seqs: Vec<u64> = log.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=log.len() as u64).collect::<Vec<_>>());
    let ends = kinds(&log)
        .into_iter()
        .filter(|k| *k == "turn_finished")
        .count();
    assert_eq!(ends, 2, "{:#?}", kinds(&log));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_waiting_for_a_person_stays_loaded() {
    let (cluster, metrics) = cluster(1).await;
    cluster.model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "touch made.txt && echo made"}),
    ));
    cluster.model.push(Reply::text("done"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_with(
        &mut client,
        &session.id,
        "make it",
        ApprovalMode::Policy,
        false,
    )
    .await;
    let (request, _) = until_approval(&mut events).await;
    // Well past the idle time: the turn is open, so the session stays.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(metric(&metrics, LOADED).await, 1.0);
    decide(
        &mut client,
        &session.id,
        &request.call_id,
        ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap();
    let rest = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&rest).outcome, TurnOutcome::Completed as i32);
    assert_eq!(tool_results(&rest)[0].output, "made\n");
    // Then it rests, and goes.
    until_loaded(&metrics, 0.0, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_unloading_off_a_session_stays_loaded() {
    let (cluster, metrics) = cluster(0).await;
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    cluster.model.push(Reply::text("hi"));
    converse(&mut client, &session.id, &mut events, &["hello"]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(metric(&metrics, LOADED).await, 1.0);
}
