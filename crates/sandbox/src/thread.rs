//! Confinement of the runner's own file work: the file tools (`read_file`,
//! `write_file`, `edit_file`, `list_dir`, `glob`, `grep`) do not start a
//! process, so they cannot go through the helper; instead each call runs on
//! a fresh thread that takes the session's identity and a Landlock domain
//! of its own before it touches the workspace. Linux keeps credentials and
//! Landlock domains per thread, so the rest of the runner is untouched, and
//! the thread ends with the call (nothing is ever restored).
//!
//! What the thread may do is what a command of the session may do in its
//! workspace, and no more: read and write beneath the workspace, as the
//! session's uid with no supplementary groups and no capabilities.

use crate::Ids;
use landlock::{
    ABI, Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus,
};
use std::path::PathBuf;

/// How a file-tool thread is confined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadConfinement {
    /// The only directory the thread may read and write beneath.
    pub workspace: PathBuf,
    /// The identity to take (the runner is root); `None` keeps the
    /// runner's.
    pub ids: Option<Ids>,
    /// Enforce the Landlock domain (the machine supports it); failing to
    /// enforce it then fails the call.
    pub landlock: bool,
}

/// Runs `work` on a new thread confined by `confinement` and waits for it;
/// `Err` says which layer could not be applied (and `work` did not run).
pub fn run_confined<T, F>(confinement: &ThreadConfinement, work: F) -> Result<T, String>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let confinement = confinement.clone();
    std::thread::Builder::new()
        .name("agentry-files".into())
        .spawn(move || {
            confine_current_thread(&confinement)?;
            Ok(work())
        })
        .map_err(|e| format!("cannot start a confined thread: {e}"))?
        .join()
        .map_err(|_| "the confined file operation panicked".to_string())?
}

/// Confines the calling thread for good: the Landlock rule is built first
/// (its directory is opened with the runner's rights), then the identity is
/// dropped, then the domain is enforced.
fn confine_current_thread(confinement: &ThreadConfinement) -> Result<(), String> {
    let ruleset = if confinement.landlock {
        let all = AccessFs::from_all(ABI::V6);
        let fd = PathFd::new(&confinement.workspace).map_err(|e| {
            format!(
                "landlock: cannot open {}: {e}",
                confinement.workspace.display()
            )
        })?;
        Some(
            Ruleset::default()
                .handle_access(all)
                .and_then(|r| r.create())
                .and_then(|r| r.add_rule(PathBeneath::new(fd, all)))
                .map_err(|e| format!("landlock: {e}"))?,
        )
    } else {
        None
    };
    if let Some(ids) = confinement.ids {
        drop_identity(ids)?;
    }
    if let Some(ruleset) = ruleset {
        let status = ruleset
            .restrict_self()
            .map_err(|e| format!("landlock: {e}"))?;
        if status.ruleset == RulesetStatus::NotEnforced {
            return Err("landlock: the kernel did not enforce the file rules".into());
        }
    }
    Ok(())
}

/// Takes `ids` on this thread only (raw system calls: the C library would
/// apply them to every thread of the process): no supplementary groups,
/// then the gid, then the uid, real, effective and saved alike, so the
/// thread keeps no capability and cannot take root back.
fn drop_identity(ids: Ids) -> Result<(), String> {
    use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
    let gid = rustix::fs::Gid::from_raw(ids.gid);
    let uid = rustix::fs::Uid::from_raw(ids.uid);
    let fail = |what: &str, e: rustix::io::Errno| {
        format!(
            "cannot take the session's identity (uid {}, gid {}) for file work: {what}: {e}",
            ids.uid, ids.gid
        )
    };
    set_thread_groups(&[]).map_err(|e| fail("setgroups", e))?;
    set_thread_res_gid(gid, gid, gid).map_err(|e| fail("setresgid", e))?;
    set_thread_res_uid(uid, uid, uid).map_err(|e| fail("setresuid", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    fn landlock_works() -> bool {
        let probe = ThreadConfinement {
            workspace: std::env::temp_dir(),
            ids: None,
            landlock: true,
        };
        run_confined(&probe, || ()).is_ok()
    }

    #[test]
    fn the_thread_reads_and_writes_only_beneath_the_workspace() {
        if !landlock_works() {
            eprintln!("skipped: Landlock is not available on this kernel");
            return;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        let workspace = dir.path().join("ws");
        let outside = dir.path().join("outside.txt");
        std::fs::create_dir(&workspace).expect("the workspace");
        std::fs::write(&outside, "secret").expect("a file outside");
        let confinement = ThreadConfinement {
            workspace: workspace.clone(),
            ids: None,
            landlock: true,
        };
        let (w, o) = (workspace.clone(), outside.clone());
        let result = run_confined(&confinement, move || {
            (
                std::fs::write(w.join("inside.txt"), "ok").is_ok(),
                std::fs::read(&o).is_ok(),
                std::fs::write(&o, "changed").is_ok(),
            )
        });
        assert_eq!(result, Ok((true, false, false)));
        // The calling thread is untouched.
        assert_eq!(
            std::fs::read_to_string(&outside).ok().as_deref(),
            Some("secret")
        );
    }

    #[test]
    fn as_root_the_thread_takes_the_identity_alone() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root to switch identity");
            return;
        }
        let confinement = ThreadConfinement {
            workspace: std::env::temp_dir(),
            ids: Some(Ids {
                uid: 2_345_678,
                gid: 2_345_678,
            }),
            landlock: false,
        };
        let seen = run_confined(&confinement, || {
            (
                rustix::process::geteuid().as_raw(),
                std::fs::read("/etc/shadow").is_ok(),
            )
        });
        assert_eq!(seen, Ok((2_345_678, false)));
        assert!(rustix::process::geteuid().is_root());
    }
}
