//! The real sandbox for the runner's tests, and running tools in it.

// Each test target uses a part of it.
#![allow(dead_code)]

use agentry_tool_runner::Limits;
use agentry_tool_runner::sandbox::{Identity, Sandbox};
use agentry_tool_runner::tools::{self, ToolOutcome};
use agentry_tool_runner::workspace::Workspace;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

/// The runner's limits for these tests.
pub fn limits() -> Limits {
    Limits {
        default_timeout: Duration::from_secs(20),
        max_timeout: Duration::from_secs(60),
        max_output_bytes: 65536,
        max_read_bytes: 262144,
        workspace_bytes: 0,
    }
}

/// A workspace root that sandboxed users can traverse.
pub fn workspace_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// The workspace of `session`, handed to the session's identity.
pub fn open(root: &std::path::Path, session: &str, sandbox: &Sandbox) -> Workspace {
    let ws = Workspace::open(root, session).unwrap();
    sandbox.hand_over_workspace(&ws).unwrap();
    ws
}

/// Runs `tool` with `args` in `ws`; a refused call is the `Err`.
pub async fn attempt(
    ws: &Workspace,
    sandbox: &Sandbox,
    tool: &str,
    args: &serde_json::Value,
) -> Result<ToolOutcome, agentry_tool_runner::ToolError> {
    let registry = tools::registry(&limits(), sandbox, None, None);
    tools::run(
        &registry,
        tool,
        &args.to_string(),
        &tools::Call::in_workspace(ws),
    )
    .await
}

/// Runs `tool` with `args` in `ws`.
pub async fn run(
    ws: &Workspace,
    sandbox: &Sandbox,
    tool: &str,
    args: serde_json::Value,
) -> ToolOutcome {
    attempt(ws, sandbox, tool, &args).await.unwrap()
}

/// Runs a bash command in `ws`.
pub async fn bash(ws: &Workspace, sandbox: &Sandbox, command: &str) -> ToolOutcome {
    run(
        ws,
        sandbox,
        "bash",
        serde_json::json!({ "command": command }),
    )
    .await
}

/// The sandbox with every layer this machine supports, or `None` (with a
/// visible message; a failure under CI) when the helper is not built.
pub fn confined(root: &std::path::Path) -> Option<Sandbox> {
    let helper = match agentry_sandbox::find_helper(None) {
        Ok(h) => h,
        Err(e) => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{e}");
            eprintln!("skipping: {e}");
            return None;
        }
    };
    let root_user = nix::unistd::geteuid().is_root();
    let identity = if root_user {
        Identity::PerSession {
            base: 2_000_000,
            count: 1_000_000,
        }
    } else {
        Identity::Runner
    };
    let scratch = root.join(".tmp/.probe");
    std::fs::create_dir_all(&scratch).unwrap();
    let probe_sandbox = Sandbox {
        identity: identity.clone(),
        ..Sandbox::unconfined()
    };
    if let Some(ids) = probe_sandbox.ids_for("probe") {
        std::os::unix::fs::lchown(&scratch, Some(ids.uid), Some(ids.gid)).unwrap();
    }
    let report = agentry_sandbox::probe(&helper, &scratch, probe_sandbox.ids_for("probe")).unwrap();
    Some(Sandbox {
        helper: Some(helper),
        layers: report.available(),
        report: Some(report),
        identity,
        hidden: vec![root.to_path_buf()],
        // Bash commands go to their session's sandbox, as configured by
        // default (`tool_runner.sandbox.session_idle_secs`).
        sessions: agentry_tool_runner::session_sandbox::Sessions::new(
            std::time::Duration::from_secs(300),
        ),
        ..Sandbox::unconfined()
    })
}

/// The command lines of live processes that hold `marker`.
pub fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(marker))
        .collect()
}
