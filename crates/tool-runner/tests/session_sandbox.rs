//! Bash commands forked from their session's sandbox (set up once per
//! session): what two commands of one session do not share, what happens
//! when one is stopped, and when the session's sandbox is made again or
//! ends. Run through the real `agentry-sandbox` helper (as root with a uid
//! per session, and as an ordinary user by `.ci/as-user`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sandbox_support;
use sandbox_support::{bash, confined, open, processes_with, workspace_root};

use std::time::Duration;

/// The sandbox, when this machine has the namespaces layer (the session's
/// sandbox needs it); else `None` with a visible message.
fn with_namespaces(root: &std::path::Path) -> Option<agentry_tool_runner::sandbox::Sandbox> {
    let sandbox = confined(root)?;
    if !sandbox.layers.namespaces {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the namespaces layer is not available: {:?}",
            sandbox.report
        );
        eprintln!("skipping: the namespaces layer is not available here");
        return None;
    }
    Some(sandbox)
}

/// Waits until `path` exists (a command running in the background made
/// it), 10 s at most.
async fn appears(path: &std::path::Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two commands of one session run in the same session's sandbox (one is
/// started), but each gets a fresh `/tmp`, `/dev/shm` and HOME, and files
/// in the workspace and the session's temp dir carry over as they always
/// did.
#[tokio::test(flavor = "multi_thread")]
async fn commands_share_the_workspace_but_not_tmp_or_home() {
    let root = workspace_root();
    let Some(sandbox) = with_namespaces(root.path()) else {
        return;
    };
    let ws = open(root.path(), "s1", &sandbox);
    let first = bash(
        &ws,
        &sandbox,
        "echo one > /tmp/left; echo two > /dev/shm/left; echo three > \"$HOME/left\"; \
         echo four > kept; echo five > \"$TMPDIR/kept\"; ls -A \"$HOME\"; echo $HOME",
    )
    .await;
    assert_eq!(first.exit_code, Some(0), "{}", first.output);
    let home = first.output.lines().last().unwrap().to_string();
    assert!(home.ends_with("/.home-s1"), "{home}");
    assert_eq!(sandbox.sessions.len(), 1);
    let second = bash(
        &ws,
        &sandbox,
        "ls -A /tmp /dev/shm \"$HOME\"; cat kept \"$TMPDIR/kept\"; echo $HOME",
    )
    .await;
    assert_eq!(second.exit_code, Some(0), "{}", second.output);
    assert!(!second.output.contains("left"), "{}", second.output);
    assert!(second.output.contains("four\nfive\n"), "{}", second.output);
    assert!(
        second.output.ends_with(&format!("{home}\n")),
        "{}",
        second.output
    );
    // Still one sandbox for the session; another session gets its own.
    assert_eq!(sandbox.sessions.len(), 1);
    let other = open(root.path(), "s2", &sandbox);
    let out = bash(&other, &sandbox, "cat ../s1/kept").await;
    assert_ne!(out.exit_code, Some(0), "{}", out.output);
    assert!(out.output.contains("No such file"), "{}", out.output);
    assert_eq!(sandbox.sessions.len(), 2);
}

/// Two commands of one session running at once see neither each other's
/// processes (each is pid 1 of its own pid namespace, so there is nothing
/// to signal either) nor each other's `/tmp`.
#[tokio::test(flavor = "multi_thread")]
async fn commands_running_at_once_cannot_see_each_other() {
    let root = workspace_root();
    let Some(sandbox) = with_namespaces(root.path()) else {
        return;
    };
    let ws = open(root.path(), "s1", &sandbox);
    // The first holds a process and a file in /tmp, and says so in the
    // workspace; the second looks for them.
    let holder = {
        let (ws, sandbox) = (ws.clone(), sandbox.clone());
        tokio::spawn(async move {
            bash(
                &ws,
                &sandbox,
                "echo mine > /tmp/held; sleep 4917 & echo $! > pid-of-holder; \
                 sleep 3; kill %1; echo done",
            )
            .await
        })
    };
    appears(&ws.root().join("pid-of-holder")).await;
    let looker = bash(
        &ws,
        &sandbox,
        "echo pid1 $(cat /proc/1/comm); ls /proc | grep -c '^[0-9]' ; \
         grep -l '491[7]' /proc/[0-9]*/cmdline 2>/dev/null | wc -l; \
         cat /tmp/held 2>&1 | head -1",
    )
    .await;
    let lines: Vec<&str> = looker.output.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some("pid1 bash"),
        "{}",
        looker.output
    );
    // Its own bash, and the few processes of its pipeline.
    let count: usize = lines[1].trim().parse().unwrap();
    assert!(count < 8, "{}", looker.output);
    assert_eq!(lines[2].trim(), "0", "{}", looker.output);
    assert!(lines[3].contains("No such file"), "{}", looker.output);
    let held = holder.await.unwrap();
    assert_eq!(held.output.trim_end(), "done", "{}", held.output);
    assert!(processes_with("sleep 4917").is_empty());
}

/// The one thing in the shared network namespace two commands running at
/// once could meet through, an abstract Unix socket, is closed by each
/// command's own Landlock domain (its abstract-socket scope); and the
/// shared hostname cannot be changed.
#[tokio::test(flavor = "multi_thread")]
async fn commands_cannot_meet_through_an_abstract_socket_or_the_hostname() {
    const PYTHON: &str = "/usr/bin/python3";
    let root = workspace_root();
    let Some(sandbox) = with_namespaces(root.path()) else {
        return;
    };
    let abi = sandbox
        .report
        .as_ref()
        .and_then(|r| r.landlock.as_ref().ok().copied())
        .unwrap_or(0);
    if abi < 6 || !std::path::Path::new(PYTHON).exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "needs Landlock ABI 6 (found {abi}) and {PYTHON}"
        );
        eprintln!("skipping: needs Landlock ABI 6 (found {abi}) and {PYTHON}");
        return;
    }
    let ws = open(root.path(), "s1", &sandbox);
    let listener = {
        let (ws, sandbox) = (ws.clone(), sandbox.clone());
        tokio::spawn(async move {
            bash(
                &ws,
                &sandbox,
                &format!(
                    "{PYTHON} -c '
import socket, time
s = socket.socket(socket.AF_UNIX)
s.bind(\"\\0agentry-meeting\")
s.listen(1)
open(\"listening\", \"w\").close()
s.settimeout(4)
try:
    s.accept()
    print(\"met\")
except OSError as e:
    print(\"nobody came\")
'"
                ),
            )
            .await
        })
    };
    appears(&ws.root().join("listening")).await;
    let caller = bash(
        &ws,
        &sandbox,
        &format!(
            "{PYTHON} -c '
import socket
c = socket.socket(socket.AF_UNIX)
try:
    c.connect(\"\\0agentry-meeting\")
    print(\"connected\")
except OSError as e:
    print(\"refused\", e.errno)
'; hostname elsewhere 2>&1 | head -1; hostname"
        ),
    )
    .await;
    let lines: Vec<&str> = caller.output.lines().collect();
    // EPERM from Landlock's scope: the name exists in the shared
    // namespace, but belongs to another domain.
    assert_eq!(
        lines.first().copied(),
        Some("refused 1"),
        "{}",
        caller.output
    );
    assert_eq!(
        lines.last().copied(),
        Some("agentry-sandbox"),
        "{}",
        caller.output
    );
    let listened = listener.await.unwrap();
    assert_eq!(
        listened.output.trim_end(),
        "nobody came",
        "{}",
        listened.output
    );
}

/// A command whose time runs out is stopped with everything it started,
/// including processes that left its session; the session's sandbox stays
/// and runs the next command.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_command_takes_its_processes_along_and_the_sandbox_stays() {
    let root = workspace_root();
    let Some(sandbox) = with_namespaces(root.path()) else {
        return;
    };
    let ws = open(root.path(), "s1", &sandbox);
    let out = sandbox_support::run(
        &ws,
        &sandbox,
        "bash",
        serde_json::json!({
            "command": "setsid bash -c 'sleep 5821 & disown' </dev/null >/dev/null 2>&1; \
                        (sleep 5822 &); echo started; sleep 5823",
            "timeout_secs": 1,
        }),
    )
    .await;
    assert!(out.timed_out, "{out:?}");
    assert!(out.output.starts_with("started\n"), "{}", out.output);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(processes_with("sleep 582").is_empty());
    let next = bash(&ws, &sandbox, "echo again").await;
    assert_eq!(next.output, "again\n");
    assert_eq!(sandbox.sessions.len(), 1);
}

/// A session forgotten, or its workspace made again, ends its sandbox:
/// the helper process goes, and the next command gets a new sandbox that
/// sees the new workspace.
#[tokio::test(flavor = "multi_thread")]
async fn the_sandbox_ends_with_the_session_and_follows_a_new_workspace() {
    let root = workspace_root();
    let Some(sandbox) = with_namespaces(root.path()) else {
        return;
    };
    let ws = open(root.path(), "s1", &sandbox);
    let out = bash(&ws, &sandbox, "echo old > marker; cat marker").await;
    assert_eq!(out.output, "old\n");
    let first = sandbox.sessions.helper_pid("s1").unwrap();
    // The workspace is removed and made again (a new directory).
    std::fs::remove_dir_all(ws.root()).unwrap();
    let ws = open(root.path(), "s1", &sandbox);
    std::fs::write(ws.root().join("marker"), "new\n").unwrap();
    let out = bash(&ws, &sandbox, "cat marker").await;
    assert_eq!(out.output, "new\n");
    assert_eq!(sandbox.sessions.len(), 1);
    let second = sandbox.sessions.helper_pid("s1").unwrap();
    assert_ne!(first, second);
    wait_gone(first).await;
    sandbox.sessions.forget("s1");
    assert!(sandbox.sessions.is_empty());
    wait_gone(second).await;
}

/// Waits until process `pid` has ended (gone, or a zombie not yet reaped).
async fn wait_gone(pid: i32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let ended = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat[stat.rfind(')').unwrap() + 2..].starts_with('Z'),
        };
        if ended {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the session helper {pid} did not end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An idle session's sandbox ends after `session_idle_secs`.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_session_sandbox_ends() {
    let root = workspace_root();
    let Some(mut sandbox) = with_namespaces(root.path()) else {
        return;
    };
    sandbox.sessions =
        agentry_tool_runner::session_sandbox::Sessions::new(Duration::from_millis(300));
    let ws = open(root.path(), "s1", &sandbox);
    assert_eq!(bash(&ws, &sandbox, "echo hi").await.output, "hi\n");
    assert_eq!(sandbox.sessions.len(), 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !sandbox.sessions.is_empty() {
        assert!(std::time::Instant::now() < deadline, "still kept");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(bash(&ws, &sandbox, "echo again").await.output, "again\n");
}
