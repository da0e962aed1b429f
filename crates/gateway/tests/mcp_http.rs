//! Agentry's MCP server over streamable HTTP on the gateway (`/mcp`),
//! driven by an MCP host written with the official MCP Python SDK
//! (`crates/fakes/mcp/host.py`, the `mcp` package of
//! `scripts/mcp-servers.sh`) with a person's bearer token: the tools, a
//! task that asks about its call, the approval, the answer; the call is
//! recorded as that person's. Without a token the endpoint answers 401.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_fakes::fake_model::Reply;
use agentry_proto::sessions::v1::event::Kind;
use serde_json::json;

const HOST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fakes/mcp/host.py");

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_host_over_http_runs_a_task_as_the_person_its_token_names() {
    let Some(venv) = agentry_fakes::mcp_servers::venv() else {
        return;
    };
    let (cluster, ann, _bob) = common::with_people().await;
    cluster.model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "echo marker written | tee marker.txt"}),
    ));
    cluster.model.push(Reply::text("The marker is written."));
    let url = format!("{}/mcp", common::base(&cluster));

    let anonymous = reqwest::Client::new()
        .post(&url)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);

    let seen = common::python(
        &venv,
        HOST,
        &["--http", &url],
        &[("AGENTRY_TOKEN", ann.secret())],
    )
    .await;
    assert_eq!(seen["done"]["status"], "completed");

    // The message and the approval are Ann's.
    let session = seen["started"]["session_id"].as_str().unwrap();
    let by = common::senders(&cluster, session, 1, |k| {
        matches!(k, Kind::UserMessage(_) | Kind::ApprovalDecided(_))
    })
    .await;
    assert_eq!(by, ["ann", "ann"]);
}
