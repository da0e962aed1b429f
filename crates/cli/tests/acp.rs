//! `agentry acp` driven by an editor written with the official ACP Python
//! SDK (`tests/acp/editor.py`, from `scripts/protocol-clients.sh`), against
//! `agentry up` and a scripted model: a session on a project directory, a
//! confirmed call allowed through session/request_permission, streamed
//! updates, a cancelled prompt, and a second agent process that loads the
//! session and gets its whole history.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_testkit::fake_model::{FakeModel, Reply};
use common::install::{Up, project_dir, run_client};
use serde_json::{Value, json};
use std::time::Duration;

const EDITOR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/acp/editor.py");

#[tokio::test(flavor = "multi_thread")]
async fn an_acp_editor_prompts_allows_a_call_cancels_and_loads_the_session_again() {
    let Some(venv) = agentry_fakes::protocol_clients::venv() else {
        return;
    };
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "f1",
        "write_file",
        json!({"path": "notes.md", "content": "hello from the editor\n"}),
    ));
    model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "echo marker written | tee marker.txt"}),
    ));
    model.push(Reply::text("The marker is written."));
    // The second prompt's model call is slow: the editor cancels it.
    model.push(Reply::text("Too late.").delay(Duration::from_secs(60)));
    let (install, _up, root, _log) = Up::start_with_projects(&model.base_url(), "");
    let project = project_dir(&root, "notes");

    // Started as an editor or MCP host starts it, with the install's environment.
    let project_arg = project.display().to_string();
    let seen = run_client(
        &install,
        &venv,
        EDITOR,
        &[common::install::BIN, &project_arg],
    );
    assert_eq!(seen["stop_reasons"], json!(["end_turn", "cancelled"]));
    let options: Vec<String> = seen["permissions"][0]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o[0].as_str().unwrap().to_string())
        .collect();
    assert_eq!(options, ["allow-once", "allow-always", "reject-once"]);

    // The call ran in the project, once, after the editor's answer, which
    // the log records as the person's approval.
    let marker = std::fs::read_to_string(project.join("marker.txt")).unwrap();
    assert_eq!(marker, "marker written\n");
    let session = seen["session_id"].as_str().unwrap();
    let events = install.events(session);
    let decided: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "approval_decided")
        .collect();
    assert_eq!(decided.len(), 2, "{events:#?}");
    let by = decided[0]
        .get("by")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(
        !by.is_empty(),
        "the approval names its person: {:#?}",
        decided[0]
    );
    let finished: Vec<String> = events
        .iter()
        .filter(|e| e["type"] == "turn_finished")
        .map(|f| f["outcome"].to_string())
        .collect();
    assert_eq!(finished, ["\"completed\"", "\"cancelled\""]);
}
