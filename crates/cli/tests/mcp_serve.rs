//! `agentry mcp serve` driven by an MCP host written with the official MCP
//! Python SDK (`crates/fakes/mcp/host.py`, the `mcp` package of
//! `scripts/mcp-servers.sh`), against `agentry up` and a scripted model: it
//! lists the tools, starts a task on a project, approves the call the task
//! asks about, and reads the task's answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_testkit::fake_model::{FakeModel, Reply};
use common::install::{Up, project_dir, run_client};
use serde_json::{Value, json};

const HOST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fakes/mcp/host.py");

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_host_starts_a_task_approves_its_call_and_reads_its_answer() {
    let Some(venv) = agentry_fakes::mcp_servers::venv() else {
        return;
    };
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "echo marker written | tee marker.txt"}),
    ));
    model.push(Reply::text("The marker is written."));
    let (install, _up, root, _log) = Up::start_with_projects(&model.base_url(), "");
    let project = project_dir(&root, "tasks");

    // Started as an editor or MCP host starts it, with the install's environment.
    let project_arg = project.display().to_string();
    let seen = run_client(&install, &venv, HOST, &[common::install::BIN, &project_arg]);
    assert_eq!(seen["done"]["status"], "completed");

    // The call ran once, in the project, and the log names who approved it.
    let marker = std::fs::read_to_string(project.join("marker.txt")).unwrap();
    assert_eq!(marker, "marker written\n");
    let session = seen["started"]["session_id"].as_str().unwrap();
    let events = install.events(session);
    let decided: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "approval_decided")
        .collect();
    assert_eq!(decided.len(), 1, "{events:#?}");
    assert!(
        decided[0]["by"].as_str().is_some_and(|by| !by.is_empty()),
        "{:#?}",
        decided[0]
    );
}
