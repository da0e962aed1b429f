//! The real sandbox for the runner's tests.

use agentry_tool_runner::sandbox::{Identity, Sandbox};

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
        ..Sandbox::unconfined()
    })
}
