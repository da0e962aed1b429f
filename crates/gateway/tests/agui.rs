//! AG-UI on the gateway, driven as a web frontend would with the official
//! `ag-ui-protocol` types and checked by `ag-ui-validate`
//! (`tests/agui/frontend.py`, from `scripts/protocol-clients.sh`), against
//! a real cluster and a scripted model: a run that ends with an interrupt,
//! a run that resumes it to success, and a thread only its person may run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_fakes::fake_model::Reply;
use agentry_runtime::auth::Role;
use agentry_runtime::people::People;
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Service;
use serde_json::{Value, json};
use std::time::Duration;

const FRONTEND: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agui/frontend.py");

#[tokio::test(flavor = "multi_thread")]
async fn a_frontend_runs_a_turn_gets_an_interrupt_and_resumes_it() {
    let Some(venv) = agentry_fakes::protocol_clients::venv() else {
        return;
    };
    let mut cluster = Cluster::start().await.unwrap();
    cluster.start_service(Service::Gateway).await.unwrap();
    let file = cluster.config.people_file();
    let ann = People::add(&file, "ann", Role::Approver, "test").unwrap();
    let bob = People::add(&file, "bob", Role::Operator, "test").unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    cluster.model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "echo marker written > marker.txt"}),
    ));
    cluster.model.push(Reply::text("The marker is written."));

    let captures = tempfile::tempdir().unwrap();
    let base = format!("http://{}", cluster.config.gateway.listen);
    let out = tokio::process::Command::new(venv.join("bin/python"))
        .args([FRONTEND, &base, &captures.path().display().to_string()])
        .env("ANN_TOKEN", ann.secret())
        .env("BOB_TOKEN", bob.secret())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the frontend failed:\n{stdout}\n{stderr}"
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
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
