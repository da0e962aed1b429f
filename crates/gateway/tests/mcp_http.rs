//! Agentry's MCP server over streamable HTTP on the gateway (`/mcp`),
//! driven by an MCP host written with the official MCP Python SDK
//! (`crates/fakes/mcp/host.py`, the `mcp` package of
//! `scripts/mcp-servers.sh`) with a person's bearer token: the tools, a
//! task that asks about its call, the approval, the answer; the call is
//! recorded as that person's. Without a token the endpoint answers 401.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_fakes::fake_model::Reply;
use agentry_runtime::auth::Role;
use agentry_runtime::people::People;
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Service;
use serde_json::{Value, json};
use std::time::Duration;

const HOST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fakes/mcp/host.py");

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_host_over_http_runs_a_task_as_the_person_its_token_names() {
    let Some(venv) = agentry_fakes::mcp_servers::venv() else {
        return;
    };
    let mut cluster = Cluster::start().await.unwrap();
    cluster.start_service(Service::Gateway).await.unwrap();
    let file = cluster.config.people_file();
    let ann = People::add(&file, "ann", Role::Approver, "test").unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    cluster.model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "echo marker written | tee marker.txt"}),
    ));
    cluster.model.push(Reply::text("The marker is written."));
    let url = format!("http://{}/mcp", cluster.config.gateway.listen);

    let anonymous = reqwest::Client::new()
        .post(&url)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);

    let out = tokio::process::Command::new(venv.join("bin/python"))
        .args([HOST, "--http", &url])
        .env("AGENTRY_TOKEN", ann.secret())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the host failed:\n{stdout}\n{stderr}");
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    assert_eq!(seen["done"]["status"], "completed");

    // The message and the approval are Ann's.
    let session = seen["started"]["session_id"].as_str().unwrap();
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
    let mut by = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        use agentry_proto::sessions::v1::event::Kind;
        match event.kind {
            Some(Kind::UserMessage(_)) | Some(Kind::ApprovalDecided(_)) => by.push(event.by),
            Some(Kind::TurnFinished(_)) => break,
            _ => {}
        }
    }
    assert_eq!(by, ["ann", "ann"]);
}
