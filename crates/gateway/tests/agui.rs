//! AG-UI on the gateway, driven as a web frontend would with the official
//! `ag-ui-protocol` types and checked by `ag-ui-validate`
//! (`tests/agui/frontend.py`, from `scripts/protocol-clients.sh`), against
//! a real cluster and a scripted model: a run that ends with an interrupt,
//! a run that resumes it to success, and a thread only its person may run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_fakes::fake_model::Reply;
use serde_json::json;

const FRONTEND: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agui/frontend.py");

#[tokio::test(flavor = "multi_thread")]
async fn a_frontend_runs_a_turn_gets_an_interrupt_and_resumes_it() {
    let Some(venv) = agentry_fakes::protocol_clients::venv() else {
        return;
    };
    let (cluster, ann, bob) = common::with_people().await;
    cluster.model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "echo marker written > marker.txt"}),
    ));
    cluster.model.push(Reply::text("The marker is written."));

    let captures = tempfile::tempdir().unwrap();
    let base = common::base(&cluster);
    let dir = captures.path().display().to_string();
    let seen = common::python(
        &venv,
        FRONTEND,
        &[&base, &dir],
        &[("ANN_TOKEN", ann.secret()), ("BOB_TOKEN", bob.secret())],
    )
    .await;
    assert_eq!(seen["run1"][0], "RUN_STARTED");
    assert_eq!(
        seen["run2"].as_array().unwrap().last().unwrap(),
        "RUN_FINISHED"
    );
    // Both streams were kept for the validator; the second carries the
    // answer the model streamed.
    let second = std::fs::read_to_string(captures.path().join("run2.sse")).unwrap();
    assert!(second.contains("The marker is written."), "{second}");
}

/// The gateway keeps at most `gateway.max_protocol_streams` protocol calls
/// open: one more is refused with 503 while they last, and taken after.
#[tokio::test(flavor = "multi_thread")]
async fn open_runs_are_bounded_and_a_place_frees_when_a_run_ends() {
    let (cluster, ann, _bob) =
        common::with_people_and(|config| config.gateway.max_protocol_streams = 1).await;
    cluster
        .model
        .push(Reply::text("slowly").delay(std::time::Duration::from_secs(2)));
    cluster.model.push(Reply::text("at once"));
    let url = format!("{}/agui", common::base(&cluster));
    let input = |run: &str| json!({"threadId": "t", "runId": run, "messages": [{"id": run, "role": "user", "content": "hi"}]});
    let http = reqwest::Client::new();
    let post = |run: &str| {
        http.post(&url)
            .bearer_auth(ann.secret())
            .json(&input(run))
            .send()
    };
    let first = post("r1").await.unwrap();
    assert_eq!(first.status(), 200);
    let busy = post("r2").await.unwrap();
    assert_eq!(busy.status(), 503);
    let body = busy.text().await.unwrap();
    assert!(body.contains("max_protocol_streams"), "{body}");
    // The first run ends; its place is free again.
    let stream = first.text().await.unwrap();
    assert!(stream.contains("RUN_FINISHED"), "{stream}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let third = post("r3").await.unwrap();
    assert_eq!(third.status(), 200);
    let stream = third.text().await.unwrap();
    assert!(stream.contains("at once"), "{stream}");
}

const ASKED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agui/asked.py");

#[tokio::test(flavor = "multi_thread")]
async fn a_question_of_an_mcp_server_is_an_interrupt_the_next_run_answers() {
    let Some(venv) = agentry_fakes::protocol_clients::venv() else {
        return;
    };
    let Some((cluster, ann, _bob, _asking)) =
        common::with_asking_server("docs", "The docs are deployed.").await
    else {
        return;
    };
    let captures = tempfile::tempdir().unwrap();
    let dir = captures.path().display().to_string();
    let seen = common::python(
        &venv,
        ASKED,
        &[&common::base(&cluster), &dir],
        &[("ANN_TOKEN", ann.secret())],
    )
    .await;
    assert_eq!(seen["call"], "d1");
    let second = std::fs::read_to_string(captures.path().join("asked2.sse")).unwrap();
    assert!(second.contains("The docs are deployed."), "{second}");
}
