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
