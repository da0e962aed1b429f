//! Hooks through the real binary: `agentry up` with `[[hooks]]` in its
//! configuration, the fake model asking for calls, hooks run by the tool
//! runner in the session's sandbox.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_testkit::fake_model::{FakeModel, Reply};
use common::install::{Up, text};
use serde_json::{Value, json};

const HOOKS: &str = r#"
[[hooks]]
event = "before_tool"
matcher = "bash"
command = "if grep -q forbidden; then echo '{\"decision\": \"deny\", \"reason\": \"the word forbidden is not allowed\"}'; fi"

[[hooks]]
event = "before_tool"
matcher = "bash"
command = "sleep 30"
timeout_secs = 1

[[hooks]]
event = "before_tool"
matcher = "*"
command = "cat > /dev/null; echo '{\"decision\": \"allow\", \"reason\": \"the team allows this\"}'"

[[hooks]]
event = "after_tool"
matcher = "bash"
command = "echo \"{\\\"context\\\": \\\"checked in $(pwd) for $AGENTRY_SESSION_ID\\\"}\""

[[hooks]]
event = "turn_finished"
command = "cat > \"$AGENTRY_WORKSPACE/finished.json\""
"#;

/// The tool message the model was sent for `call_id` in request `n`.
fn tool_message(model: &FakeModel, n: usize, call_id: &str) -> String {
    let requests = model.requests();
    requests[n]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no result of {call_id} in request {n}: {}", requests[n]))
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn hooks_deny_time_out_never_lift_a_policy_deny_and_add_context() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "b1",
        "bash",
        json!({"command": "echo forbidden fruit"}),
    ));
    model.push(Reply::tool_call(
        "b2",
        "bash",
        json!({"command": "echo fine"}),
    ));
    model.push(Reply::tool_call(
        "b3",
        "bash",
        json!({"command": "sudo ls /root"}),
    ));
    model.push(Reply::text("done"));
    let (install, _up, log) = Up::start_configured(&model.base_url(), HOOKS);

    // Headless, with the policy deciding: bash is confirmed by default, and
    // only the hook's allow lets a call run without a person.
    let out = tokio::task::spawn_blocking({
        let install_cmd = install.command(&["run", "--approve", "policy", "try some commands"]);
        move || {
            let mut cmd = install_cmd;
            cmd.stdin(std::process::Stdio::null()).output().unwrap()
        }
    })
    .await
    .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {stderr}\nlog: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(stdout.trim(), "done");

    // The denying hook's reason reaches the model.
    let denied = tool_message(&model, 1, "b1");
    assert!(
        denied.contains("denied by the hook")
            && denied.contains("the word forbidden is not allowed"),
        "{denied}"
    );
    // The allowing hook skipped the confirmation; the after_tool hook's
    // context follows the output, and it ran in a fresh directory.
    let ran = tool_message(&model, 2, "b2");
    assert!(ran.starts_with("fine\n"), "{ran}");
    assert!(ran.contains("[context from the hook"), "{ran}");
    let session = install.latest_session();
    assert!(ran.contains(&format!("for {session}")), "{ran}");
    assert!(ran.contains("/.hook-"), "{ran}");
    // No hook lifts the policy's deny.
    let sudo = tool_message(&model, 3, "b3");
    assert!(sudo.starts_with("error: denied by policy"), "{sudo}");

    // Every run is in the log, the timed-out one with why it had no say.
    let log = install.events(&session);
    let runs: Vec<&Value> = log.iter().filter(|e| e["type"] == "hook_ran").collect();
    let before: Vec<&&Value> = runs
        .iter()
        .filter(|r| r["event"] == "before_tool")
        .collect();
    assert_eq!(
        before.len(),
        9,
        "three hooks for each of three calls: {runs:?}"
    );
    assert!(
        before
            .iter()
            .filter(|r| r["command"] == "sleep 30")
            .all(|r| r["error"] == "timed out after 1 s and was killed"),
        "{before:?}"
    );
    let outcome = |call: &str| {
        before
            .iter()
            .filter(|r| r["call_id"] == call)
            .filter_map(|r| r["outcome"].as_str())
            .collect::<Vec<_>>()
            .join("")
    };
    assert_eq!(outcome("b1"), "deny");
    assert_eq!(outcome("b2"), "allow");
    assert_eq!(outcome("b3"), "deny");
    assert!(
        before
            .iter()
            .any(|r| r["call_id"] == "b3" && r["decision"] == "allow"),
        "the hook's allow is recorded, and did not count"
    );
    let after: Vec<&&Value> = runs.iter().filter(|r| r["event"] == "after_tool").collect();
    assert_eq!(after.len(), 1, "only the call that ran: {after:?}");

    // The turn_finished hook got the event on its standard input.
    let finished = install
        .dir
        .path()
        .join("data/workspaces")
        .join(&session)
        .join("finished.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !finished.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let input: Value = serde_json::from_str(&std::fs::read_to_string(&finished).unwrap()).unwrap();
    assert_eq!(input["event"], "turn_finished");
    assert_eq!(input["outcome"], "completed");
    assert_eq!(input["session_id"], session.as_str());
}

#[test]
fn a_bad_hook_is_refused_at_start_naming_it() {
    let install = common::install::Install::new("http://127.0.0.1:9/v1");
    std::fs::write(
        install.dir.path().join("config/local.toml"),
        "[[hooks]]\nevent = \"before_tool\"\ncommand = \"true\"\ntimeout_secs = 0\n",
    )
    .unwrap();
    let out = install.run(&["up"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("hooks[0]") && stderr.contains("timeout_secs must be between 1 and 600"),
        "{stderr}"
    );
    std::fs::write(
        install.dir.path().join("config/local.toml"),
        "[[hooks]]\nevent = \"before_everything\"\ncommand = \"true\"\n",
    )
    .unwrap();
    let (_, stderr) = text(&install.run(&["up"]));
    assert!(stderr.contains("before_everything"), "{stderr}");
}

#[test]
fn a_hook_whose_script_the_sandbox_cannot_read_stops_the_start() {
    let install = common::install::Install::new("http://127.0.0.1:9/v1");
    // A script in the install's directory: the sandbox shows only the
    // system directories and what tool_runner.sandbox.read_only names.
    let script = install.dir.path().join("hooks/check.sh");
    std::fs::create_dir_all(script.parent().unwrap()).unwrap();
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::write(
        install.dir.path().join("config/local.toml"),
        format!(
            "[[hooks]]\nevent = \"before_tool\"\ncommand = \"sh {}\"\n",
            script.display()
        ),
    )
    .unwrap();
    let out = install.run(&["up"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("hooks[0]")
            && stderr.contains(&format!(
                "{} cannot be found or read inside the sandbox",
                script.display()
            ))
            && stderr.contains("tool_runner.sandbox.read_only"),
        "{stderr}"
    );
    // A program that is not there at all.
    std::fs::write(
        install.dir.path().join("config/local.toml"),
        "[[hooks]]\nevent = \"before_tool\"\ncommand = \"no-such-hook-program --check\"\n",
    )
    .unwrap();
    let (_, stderr) = text(&install.run(&["up"]));
    assert!(
        stderr.contains("no-such-hook-program cannot be found or read inside the sandbox"),
        "{stderr}"
    );
}
