//! Finding the helper program.
//!
//! The helper is either the dedicated `agentry-sandbox` program or a program
//! that embeds it: the `agentry` command acts as the helper when it is
//! started under the name `agentry-sandbox` (its `argv[0]`), so an install
//! of `agentry` alone has a working sandbox.

use crate::SandboxError;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The helper's file name, and the `argv[0]` it is always started with.
pub const HELPER_NAME: &str = "agentry-sandbox";

/// A program that embeds the helper, looked for when the dedicated one is
/// not installed.
const EMBEDDING_NAME: &str = "agentry";

static RUNNING_PROGRAM_EMBEDS_HELPER: AtomicBool = AtomicBool::new(false);

/// The revision of [`crate::Spec`] (with its parts): raise it with any
/// change to what the runner sends, so that a helper built before the
/// change is not taken for one that reads it. A helper also refuses a spec
/// with fields it does not know.
const SPEC_REVISION: u32 = 2;

/// What `agentry-sandbox --version` prints: a helper that prints the same
/// reads the runner's specs.
pub fn version() -> String {
    format!(
        "{HELPER_NAME} {} spec {SPEC_REVISION}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Whether `path` is a helper of this very version, owned like `exe` and
/// writable by its owner alone.
fn same_helper(path: &Path, exe: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(helper), Ok(running)) = (std::fs::metadata(path), std::fs::metadata(exe)) else {
        return false;
    };
    if helper.uid() != running.uid() || helper.mode() & 0o022 != 0 {
        return false;
    }
    std::process::Command::new(path)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .is_ok_and(|out| {
            out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == version()
        })
}

/// Whether `argv0` asks a program that embeds the helper to act as it.
pub fn started_as_helper(argv0: &std::ffi::OsStr) -> bool {
    Path::new(argv0).file_name() == Some(std::ffi::OsStr::new(HELPER_NAME))
}

/// Declares that the running program acts as the helper when started as
/// [`HELPER_NAME`] (see [`started_as_helper`]); [`find_helper`] then
/// prefers it, which keeps the helper the same version as the runner.
pub fn running_program_embeds_helper() {
    RUNNING_PROGRAM_EMBEDS_HELPER.store(true, Ordering::Relaxed);
}

/// The helper: `configured` when given; else the running program when it
/// embeds the helper; else `agentry-sandbox`, then `agentry`, next to the
/// running program or one directory up (where Cargo puts binaries when the
/// running program is a test); else `agentry-sandbox` on PATH.
pub fn find_helper(configured: Option<&Path>) -> Result<PathBuf, SandboxError> {
    if let Some(path) = configured {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(SandboxError::HelperNotFound {
                looked: path.display().to_string(),
            })
        };
    }
    let exe = std::env::current_exe().ok();
    if RUNNING_PROGRAM_EMBEDS_HELPER.load(Ordering::Relaxed)
        && let Some(exe) = &exe
    {
        // The dedicated helper installed beside it, when of the same
        // version, starts in a third of the time (a small program, not the
        // whole of `agentry`): it runs before every command.
        if let Some(beside) = exe.parent().map(|dir| dir.join(HELPER_NAME))
            && beside.is_file()
            && same_helper(&beside, exe)
        {
            return Ok(beside);
        }
        return Ok(exe.clone());
    }
    let mut looked = Vec::new();
    if let Some(exe) = &exe {
        for name in [HELPER_NAME, EMBEDDING_NAME] {
            for dir in exe.ancestors().skip(1).take(2) {
                let candidate = dir.join(name);
                if candidate.is_file() {
                    return Ok(candidate);
                }
                if name == HELPER_NAME {
                    looked.push(dir.display().to_string());
                }
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(HELPER_NAME);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
        looked.push("PATH".into());
    }
    Err(SandboxError::HelperNotFound {
        looked: looked.join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_beside_is_taken_only_of_this_version_and_safely_owned() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let script = |name: &str, says: &str, mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\necho '{says}'\n"))
                .unwrap_or_else(|e| panic!("{e}"));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .unwrap_or_else(|e| panic!("{e}"));
            path
        };
        let good = script("good", &version(), 0o755);
        assert!(same_helper(&good, &good));
        let older = script("older", &format!("{HELPER_NAME} 0.0.1 spec 0"), 0o755);
        assert!(!same_helper(&older, &good), "another version");
        let writable = script("writable", &version(), 0o777);
        assert!(!same_helper(&writable, &good), "anyone could replace it");
        assert!(!same_helper(&dir.path().join("absent"), &good));
    }

    #[test]
    fn the_helper_name_is_recognised_in_any_directory() {
        assert!(started_as_helper("agentry-sandbox".as_ref()));
        assert!(started_as_helper("/usr/local/bin/agentry-sandbox".as_ref()));
        assert!(!started_as_helper("agentry".as_ref()));
        assert!(!started_as_helper("/tmp/agentry-sandbox/agentry".as_ref()));
    }

    #[test]
    fn a_configured_helper_that_is_missing_is_an_error_naming_it() {
        match find_helper(Some(Path::new("/nonexistent/helper"))) {
            Err(err) => assert!(err.to_string().contains("/nonexistent/helper"), "{err}"),
            Ok(found) => panic!("found {}", found.display()),
        }
    }
}
