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

const SERVERS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/acp/servers.py");

#[tokio::test(flavor = "multi_thread")]
async fn an_editors_own_mcp_server_is_started_for_its_session_and_its_tool_answers() {
    let Some(venv) = agentry_fakes::protocol_clients::venv() else {
        return;
    };
    let Some(mcp_venv) = agentry_fakes::mcp_servers::venv() else {
        return;
    };
    let fixture = agentry_fakes::mcp_servers::Fixture::new().unwrap();
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "e1",
        "fx_tools__echo",
        json!({"text": "hi"}),
    ));
    model.push(Reply::text("It said hi."));
    // The editor's server is trusted no more than any: a rule lets its
    // echo run without a confirmation, as a person would write one.
    let (install, _up, root, _log) = Up::start_with_projects(
        &model.base_url(),
        "[policy.tools]\n\"fx_tools__echo\" = \"allow\"\n",
    );
    let project = project_dir(&root, "editor-servers");
    let python = mcp_venv.join("bin/python").display().to_string();
    let script = fixture.script().display().to_string();
    let seen = run_client(
        &install,
        &venv,
        SERVERS,
        &[
            common::install::BIN,
            &project.display().to_string(),
            &python,
            &script,
        ],
    );
    assert!(
        seen["answer"].as_str().unwrap().contains("It said hi."),
        "{seen}"
    );
    // The model was offered the editor's tool, and got its answer.
    let offered = model.requests()[0].to_string();
    assert!(offered.contains("fx_tools__echo"), "{offered}");
    let second = model.requests()[1].to_string();
    assert!(second.contains("echo: hi"), "{second}");
    // Its tools are the session's alone: the install's list lacks them.
    let (tools, _) = common::install::text(&install.run(&["tools"]));
    assert!(!tools.contains("fx_tools__echo"), "{tools}");
}
