//! Real MCP servers for tests: the reference servers from PyPI and the
//! fixture server written with the official Python SDK
//! (`crates/fakes/mcp/fixture_server.py`), as `scripts/mcp-servers.sh`
//! installs them in a virtualenv.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

/// The fixture server's source.
pub const FIXTURE: &str = include_str!("../mcp/fixture_server.py");

/// The virtualenv of `scripts/mcp-servers.sh` (`AGENTRY_MCP_VENV`, else
/// `/opt/agentry/mcp-venv-1` for root, `~/.cache/agentry/mcp-venv-1` for
/// others), or `None` with a message when it is not there; under
/// `CI=true` its absence panics, so a missing install fails the run.
pub fn venv() -> Option<PathBuf> {
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    let path = match std::env::var("AGENTRY_MCP_VENV") {
        Ok(p) if !p.is_empty() => PathBuf::from(p),
        _ if root => PathBuf::from("/opt/agentry/mcp-venv-1"),
        _ => PathBuf::from(std::env::var("HOME").unwrap_or_default())
            .join(".cache/agentry/mcp-venv-1"),
    };
    if path.join("bin/mcp-server-time").is_file() {
        return Some(path);
    }
    let why = format!(
        "no MCP servers at {} (run scripts/mcp-servers.sh)",
        path.display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("skipping: {why}");
    None
}

/// A copy of the fixture server in a directory every identity can read
/// (sandboxed servers run as other users); removed when dropped.
pub struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    /// Writes the fixture.
    pub fn new() -> std::io::Result<Fixture> {
        let dir = tempfile::tempdir()?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let fixture = Fixture { dir };
        std::fs::write(fixture.script(), FIXTURE)?;
        std::fs::set_permissions(fixture.script(), std::fs::Permissions::from_mode(0o644))?;
        Ok(fixture)
    }

    /// The script's path.
    pub fn script(&self) -> PathBuf {
        self.dir.path().join("fixture_server.py")
    }
}
