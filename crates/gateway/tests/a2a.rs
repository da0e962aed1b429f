//! A2A 1.0 on the gateway, driven by another agent written with the
//! official A2A Python SDK (`tests/a2a/caller.py`, the `a2a-sdk` of
//! `scripts/protocol-clients.sh`), against a real cluster and a scripted
//! model: the card, a streamed task that waits for a person, the answer on
//! the task, a cancelled task, and tasks that only their person sees.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_fakes::fake_model::Reply;
use agentry_runtime::auth::Role;
use agentry_runtime::people::People;
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Service;
use serde_json::{Value, json};
use std::time::Duration;

const CALLER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/a2a/caller.py");

#[tokio::test(flavor = "multi_thread")]
async fn another_agent_runs_a_task_answers_its_question_cancels_one_and_sees_only_its_own() {
    let Some(venv) = agentry_fakes::protocol_clients::venv() else {
        return;
    };
    let mut cluster = Cluster::start().await.unwrap();
    cluster.start_service(Service::Gateway).await.unwrap();
    let file = cluster.config.people_file();
    let ann = People::add(&file, "ann", Role::Approver, "test").unwrap();
    let bob = People::add(&file, "bob", Role::Operator, "test").unwrap();
    // Every service reads the people file again within a second.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    cluster.model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "echo marker written > marker.txt"}),
    ));
    cluster.model.push(Reply::text("The marker is written."));
    cluster
        .model
        .push(Reply::text("Too late.").delay(Duration::from_secs(60)));

    let base = format!("http://{}", cluster.config.gateway.listen);
    let out = tokio::process::Command::new(venv.join("bin/python"))
        .args([CALLER, &base])
        .env("ANN_TOKEN", ann.secret())
        .env("BOB_TOKEN", bob.secret())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the caller failed:\n{stdout}\n{stderr}"
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    assert_eq!(
        seen["first"].as_array().unwrap().last().unwrap(),
        "TASK_STATE_INPUT_REQUIRED"
    );
    assert_eq!(
        seen["second"].as_array().unwrap().last().unwrap(),
        "TASK_STATE_COMPLETED"
    );

    // The session's log: Ann's message and her approval, each hers.
    let session = seen["context"].as_str().unwrap();
    let mut orchestrator = cluster.orchestrator().await.unwrap();
    let mut events = orchestrator
        .subscribe(agentry_proto::orchestrator::v1::SubscribeRequest {
            session_id: session.to_string(),
            from_seq: 1,
            live_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut decided_by = Vec::new();
    let mut finished = 0;
    while finished < 2 {
        let event = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        use agentry_proto::sessions::v1::event::Kind;
        match event.kind {
            Some(Kind::ApprovalDecided(_)) => decided_by.push(event.by.clone()),
            Some(Kind::TurnFinished(_)) => finished += 1,
            _ => {}
        }
    }
    assert_eq!(decided_by, ["ann"]);
}
