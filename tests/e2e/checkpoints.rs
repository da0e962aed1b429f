//! Checkpoints: an idle session's state is stored with its events every
//! `orchestrator.checkpoint_every_events`, and a session loaded again reads
//! the checkpoint and the events after it; the model sees the same
//! conversation as from the whole log. A rewind past the checkpoint makes
//! the next load read the whole log.

use crate::support::*;
use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::sessions::v1 as spb;
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Reply;
use pretty_assertions::assert_eq;
use serde_json::json;
use std::time::{Duration, Instant};

const FROM_CHECKPOINT: &str = "agentry_session_loads_total{from=\"checkpoint\"}";
const FROM_LOG: &str = "agentry_session_loads_total{from=\"log\"}";

async fn cluster() -> (Cluster, String) {
    let metrics = metrics_addr();
    let listen = metrics.clone();
    let cluster = Cluster::start_with(move |c| {
        c.orchestrator.unload_idle_secs = 1;
        c.orchestrator.checkpoint_every_events = 5;
        c.orchestrator.metrics_listen = listen;
    })
    .await
    .unwrap();
    (cluster, metrics)
}

/// Waits until the orchestrator holds no session.
async fn until_unloaded(metrics: &str) {
    let started = Instant::now();
    while metric(metrics, "agentry_sessions_loaded").await != 0.0 {
        assert!(started.elapsed() < Duration::from_secs(15), "still loaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The session's stored checkpoint and the events the store reads after it.
async fn stored_checkpoint(cluster: &Cluster, session_id: &str) -> (spb::Checkpoint, Vec<u64>) {
    let page = cluster
        .store()
        .await
        .unwrap()
        .read(spb::ReadRequest {
            session_id: session_id.into(),
            from_seq: 1,
            limit: 0,
            from_checkpoint: true,
        })
        .await
        .unwrap()
        .into_inner();
    let checkpoint = page.checkpoint.expect("the session has a checkpoint");
    (checkpoint, page.events.iter().map(|e| e.seq).collect())
}

/// The contents of the messages of the model's request `n`.
fn request_contents(cluster: &Cluster, n: usize) -> Vec<String> {
    cluster.model.requests()[n]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_loads_from_its_checkpoint_and_the_model_sees_the_same_conversation() {
    let (cluster, metrics) = cluster().await;
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    cluster
        .model
        .push(Reply::tool_call("call_1", "list_dir", json!({"path": "."})));
    cluster.model.push(Reply::text("an empty directory"));
    cluster.model.push(Reply::text("second answer"));
    converse(
        &mut client,
        &session.id,
        &mut events,
        &["look around", "and then?"],
    )
    .await;

    // Stored with the turns' last appends: at an idle point, within the log.
    let log = read_log(&mut cluster.store().await.unwrap(), &session.id).await;
    let (checkpoint, after) = stored_checkpoint(&cluster, &session.id).await;
    assert!(
        checkpoint.seq >= 5 && checkpoint.seq <= log.len() as u64,
        "{checkpoint:?}"
    );
    assert!(
        matches!(
            log[checkpoint.seq as usize - 1].kind,
            Some(spb::event::Kind::TurnFinished(_))
        ),
        "a checkpoint is after a turn's end: {:?}",
        kinds(&log)
    );
    assert_eq!(
        after,
        (checkpoint.seq + 1..=log.len() as u64).collect::<Vec<_>>()
    );

    // Unloaded, then loaded by the next message: from the checkpoint.
    until_unloaded(&metrics).await;
    cluster.model.push(Reply::text("third answer"));
    let before = counted(&metrics, FROM_CHECKPOINT).await;
    converse(&mut client, &session.id, &mut events, &["one more"]).await;
    assert_eq!(counted(&metrics, FROM_CHECKPOINT).await, before + 1.0);
    // The model's request: the whole conversation, as it was before the
    // session left memory, then the new message.
    let last = cluster.model.requests().len() - 1;
    let mut expected = request_contents(&cluster, last - 1);
    expected.push("second answer".into());
    expected.push("one more".into());
    assert_eq!(request_contents(&cluster, last), expected);
    assert!(expected.iter().any(|c| c == "look around"));
    assert!(expected.iter().any(|c| c == "an empty directory"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rewind_past_the_checkpoint_makes_the_next_load_read_the_whole_log() {
    let (cluster, metrics) = cluster().await;
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    for answer in ["first answer", "second answer", "third answer"] {
        cluster.model.push(Reply::text(answer));
    }
    converse(
        &mut client,
        &session.id,
        &mut events,
        &["one", "two", "three"],
    )
    .await;
    let (checkpoint, _) = stored_checkpoint(&cluster, &session.id).await;
    let log = read_log(&mut cluster.store().await.unwrap(), &session.id).await;
    let first_turn_end = log
        .iter()
        .find(|e| matches!(e.kind, Some(spb::event::Kind::TurnFinished(_))))
        .unwrap()
        .seq;
    assert!(checkpoint.seq > first_turn_end, "{checkpoint:?}");

    // Back to the first turn: the checkpoint no longer stands for the log.
    client
        .rewind_session(opb::RewindSessionRequest {
            session_id: session.id.clone(),
            to_turn: 1,
            conversation_only: true,
        })
        .await
        .unwrap();
    until_unloaded(&metrics).await;
    let before = counted(&metrics, FROM_LOG).await;
    cluster.model.push(Reply::text("fourth answer"));
    converse(&mut client, &session.id, &mut events, &["four"]).await;
    assert_eq!(counted(&metrics, FROM_LOG).await, before + 1.0);
    let last = cluster.model.requests().len() - 1;
    let contents = request_contents(&cluster, last);
    assert!(contents.iter().any(|c| c == "one"), "{contents:#?}");
    assert!(
        !contents.iter().any(|c| c == "two" || c == "three"),
        "the rewound turns are gone: {contents:#?}"
    );
}
