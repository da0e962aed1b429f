//! The official SDKs of the protocols Agentry serves (ACP so far), as
//! `scripts/protocol-clients.sh` installs them in a virtualenv: the tests
//! drive Agentry with these implementations nobody in this project wrote.

use std::path::PathBuf;

/// The virtualenv of `scripts/protocol-clients.sh`
/// (`AGENTRY_PROTOCOL_VENV`, else `~/.cache/agentry/protocol-venv-1`), or
/// `None` with a message when it is not there; under `CI=true` its absence
/// panics, so a missing install fails the run.
pub fn venv() -> Option<PathBuf> {
    let path = match std::env::var("AGENTRY_PROTOCOL_VENV") {
        Ok(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(std::env::var("HOME").unwrap_or_default())
            .join(".cache/agentry/protocol-venv-1"),
    };
    if path.join(".agentry-stamp").is_file() && path.join("bin/python").is_file() {
        return Some(path);
    }
    let why = format!(
        "no protocol SDKs at {} (run scripts/protocol-clients.sh)",
        path.display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("skipping: {why}");
    None
}
