//! Commands run confined: resource limits applied with setrlimit, an
//! unprivileged user when the runner is root, secrets kept out of their
//! environment.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_tool_runner::Limits;
use agentry_tool_runner::sandbox::{Rlimits, RunAs, Sandbox};
use agentry_tool_runner::tools::{self, ToolOutcome};
use agentry_tool_runner::workspace::Workspace;
use serde_json::json;
use std::time::Duration;

fn limits() -> Limits {
    Limits {
        default_timeout: Duration::from_secs(20),
        max_timeout: Duration::from_secs(60),
        max_output_bytes: 65536,
        max_read_bytes: 262144,
    }
}

async fn bash(ws: &Workspace, sandbox: &Sandbox, command: &str) -> ToolOutcome {
    let (sink, _rx) = tokio::sync::mpsc::channel(1024);
    let args = json!({ "command": command }).to_string();
    tools::execute("bash", &args, ws, &limits(), None, sandbox, None, sink)
        .await
        .unwrap()
}

fn nobody() -> Option<RunAs> {
    let user = nix::unistd::User::from_name("nobody").ok().flatten()?;
    Some(RunAs {
        name: user.name,
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
    })
}

#[tokio::test]
async fn resource_limits_are_applied_to_commands() {
    let root = tempfile::tempdir().unwrap();
    let ws = Workspace::open(root.path(), "s1").unwrap();
    let sandbox = Sandbox {
        rlimits: Rlimits {
            cpu_secs: 7,
            address_space_mib: 1024,
            processes: 0,
            file_size_mib: 1,
        },
        ..Sandbox::default()
    };
    let out = bash(&ws, &sandbox, "ulimit -t; ulimit -v; ulimit -f").await;
    assert_eq!(out.output, "7\n1048576\n1024\n");
    // Writing past the file-size limit fails.
    let out = bash(
        &ws,
        &sandbox,
        "head -c 3000000 /dev/zero > big.bin; echo status=$?; stat -c %s big.bin",
    )
    .await;
    assert!(
        out.output.contains("status=1") || out.output.contains("status=153"),
        "{}",
        out.output
    );
    assert!(out.output.trim_end().ends_with("1048576"), "{}", out.output);
}

#[tokio::test]
async fn commands_run_as_the_configured_user_when_the_runner_is_root() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the runner is not root, so it does not switch users");
        return;
    }
    let Some(user) = nobody() else {
        assert!(std::env::var("CI").is_err(), "user nobody is missing in CI");
        eprintln!("skipped: no user named nobody");
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let ws = Workspace::open(root.path(), "s1").unwrap();
    let sandbox = Sandbox {
        run_as: Some(user.clone()),
        ..Sandbox::default()
    };
    sandbox.hand_over(ws.root()).unwrap();
    let out = bash(&ws, &sandbox, "id -u; touch mine.txt && echo wrote").await;
    assert_eq!(out.output, format!("{}\nwrote\n", user.uid));
    // It cannot touch what root keeps to itself.
    let out = bash(&ws, &sandbox, "cat /etc/shadow").await;
    assert!(out.is_error);
    assert!(out.output.contains("Permission denied"), "{}", out.output);
    // Files the runner writes are handed over too.
    let (sink, _rx) = tokio::sync::mpsc::channel(8);
    let args = json!({"path": "dir/note.txt", "content": "hello"}).to_string();
    tools::execute(
        "write_file",
        &args,
        &ws,
        &limits(),
        None,
        &sandbox,
        None,
        sink,
    )
    .await
    .unwrap();
    let out = bash(
        &ws,
        &sandbox,
        "echo more >> dir/note.txt && cat dir/note.txt",
    )
    .await;
    assert_eq!(out.output, "hellomore\n");
}

#[tokio::test]
async fn the_environment_keeps_ordinary_variables() {
    let root = tempfile::tempdir().unwrap();
    let ws = Workspace::open(root.path(), "s1").unwrap();
    let out = bash(&ws, &Sandbox::default(), "env").await;
    assert!(out.output.contains("PATH="), "{}", out.output);
    for line in out.output.lines() {
        let name = line.split('=').next().unwrap_or("");
        assert!(
            !agentry_tool_runner::sandbox::is_secret_var(name),
            "secret-looking variable {name} reached the command"
        );
    }
}
