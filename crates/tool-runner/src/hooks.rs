//! Running a hook a person configured: `bash -c command` in the session's
//! sandbox, like a bash call without network, with the event on standard
//! input and standard output and error kept apart (each capped).
//!
//! A hook starts in a fresh empty directory of its own, which is also its
//! HOME and TMPDIR and is removed afterwards: nothing the session's
//! commands wrote (a `.gitconfig`, a `json.py` next to a Python hook, a
//! `.pth` file) is where the hook looks first, so interpreters and tools
//! it starts do not pick up files the model planted. The workspace is named by
//! `$AGENTRY_WORKSPACE` for hooks that want to look at it, and Python is
//! told not to import from the working directory or user site.

use crate::Limits;
use crate::output::CappedOutput;
use crate::sandbox::Sandbox;
use crate::tools::{CallGuard, Launch, fresh_dir, sandboxed_bash};
use crate::workspace::Workspace;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Most of each of a hook's output streams that is kept.
pub const MAX_HOOK_OUTPUT: usize = 64 * 1024;
/// Longest input a hook is given.
pub const MAX_HOOK_INPUT: usize = 1024 * 1024;

/// What a hook did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookRun {
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Its standard output (capped).
    pub stdout: String,
    /// Its standard error (capped).
    pub stderr: String,
    /// It was killed at its timeout.
    pub timed_out: bool,
    /// How long it ran.
    pub duration_ms: u64,
    /// Why it could not run.
    pub error: String,
}

/// Runs `command` for the session of `workspace` with `input` on its
/// standard input, for at most `timeout`.
pub async fn run(
    sandbox: &Sandbox,
    workspace: &Workspace,
    _limits: &Limits,
    command: &str,
    input: &str,
    timeout: Duration,
) -> HookRun {
    let started = Instant::now();
    let failed = |error: String| HookRun {
        error,
        duration_ms: started.elapsed().as_millis() as u64,
        ..HookRun::default()
    };
    if command.trim().is_empty() {
        return failed("the hook's command is empty".into());
    }
    if input.len() > MAX_HOOK_INPUT {
        return failed(format!(
            "the hook's input is {} bytes, over the {MAX_HOOK_INPUT}-byte limit",
            input.len()
        ));
    }
    let dir = match fresh_dir(sandbox, workspace, ".hook-", "the hook's directory") {
        Ok(dir) => dir,
        Err(e) => return failed(e.to_string()),
    };
    let session = workspace.session_id();
    let fresh = dir.path().display().to_string();
    let launch = Launch {
        cwd: dir.path().to_path_buf(),
        read_write: vec![
            dir.path().to_path_buf(),
            workspace.root().to_path_buf(),
            workspace.tmp().to_path_buf(),
        ],
        env: vec![
            ("HOME".into(), fresh.clone()),
            ("TMPDIR".into(), fresh),
            (
                "AGENTRY_WORKSPACE".into(),
                workspace.root().display().to_string(),
            ),
            ("AGENTRY_SESSION_ID".into(), session.to_string()),
            ("PYTHONSAFEPATH".into(), "1".into()),
            ("PYTHONNOUSERSITE".into(), "1".into()),
            ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ],
        stdin: true,
    };
    let (mut cmd, mut reports) = match sandboxed_bash(sandbox, command, workspace, &launch, None) {
        Ok(made) => made,
        Err(e) => return failed(e.to_string()),
    };
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => return failed(format!("cannot start the hook: {e}")),
    };
    if let Some(reports) = &mut reports {
        reports.started();
    }
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(nix::unistd::Pid::from_raw);
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let mut guard = CallGuard {
        child: Some(child),
        group,
        helper: sandbox.helper.is_some(),
    };
    let input = input.to_string();
    let feed = tokio::spawn(async move {
        if let Some(mut stdin) = stdin {
            // A hook that does not read its input is fine.
            let _ = stdin.write_all(input.as_bytes()).await;
            let _ = stdin.shutdown().await;
        }
    });
    let read_out = tokio::spawn(read_capped(stdout));
    let read_err = tokio::spawn(read_capped(stderr));
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let status = match guard.child.as_mut() {
        Some(child) => tokio::select! {
            status = child.wait() => Some(status),
            () = &mut deadline => None,
        },
        None => None,
    };
    // Nothing the hook started outlives it.
    guard.stop().await;
    feed.abort();
    let collect = |task: tokio::task::JoinHandle<String>| async move {
        tokio::time::timeout(Duration::from_millis(500), task)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default()
    };
    let stdout = collect(read_out).await;
    let stderr = collect(read_err).await;
    let duration_ms = started.elapsed().as_millis() as u64;
    match status {
        Some(Ok(status)) => {
            let code = status.code();
            if code == Some(agentry_sandbox::SETUP_FAILED)
                && let Some(why) = reports.as_ref().and_then(|r| r.setup_failure())
            {
                return HookRun {
                    error: format!("the sandbox could not start the hook: {why}"),
                    stderr,
                    duration_ms,
                    ..HookRun::default()
                };
            }
            HookRun {
                exit_code: code,
                stdout,
                stderr,
                timed_out: false,
                duration_ms,
                error: String::new(),
            }
        }
        Some(Err(e)) => HookRun {
            error: format!("waiting for the hook failed: {e}"),
            stdout,
            stderr,
            duration_ms,
            ..HookRun::default()
        },
        None => HookRun {
            stdout,
            stderr,
            timed_out: true,
            duration_ms,
            ..HookRun::default()
        },
    }
}

/// Reads a stream to its end, keeping its head and tail within the cap.
async fn read_capped(reader: Option<impl tokio::io::AsyncRead + Unpin>) -> String {
    let Some(mut reader) = reader else {
        return String::new();
    };
    let mut capped = CappedOutput::new(MAX_HOOK_OUTPUT);
    let mut buf = vec![0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => capped.push(&buf[..n]),
        }
    }
    capped.finish().0
}
