//! What the MCP servers need from the tool runner that hosts them: where a
//! session's servers run, and the confined command that starts one. The
//! runner decides how a process is confined (the sandbox helper, the
//! session's identity, environment, limits and network); this crate only
//! speaks MCP to what it starts.

use crate::McpError;
use agentry_runtime::config::McpServerConfig;
use std::path::{Path, PathBuf};

/// Where a stdio server runs: the session's workspace and temp dir, as the
/// identity of `session_id`.
#[derive(Debug, Clone)]
pub struct Place {
    /// Whose identity the process takes.
    pub session_id: String,
    /// The owner of the session's project directory, whom the process then
    /// runs as (when the runner switches identity).
    pub owner: Option<agentry_sandbox::Ids>,
    /// The writable working area.
    pub workspace: PathBuf,
    /// The private temp dir.
    pub tmp: PathBuf,
}

/// A stdio server's command, ready to start: confined like every process
/// of the session, in its own session and process group, its working
/// directory set; its standard streams are the caller's to set.
pub struct Launch {
    /// The command.
    pub command: tokio::process::Command,
    /// The sandbox helper's report descriptor, when a helper starts it.
    pub reports: Option<agentry_sandbox::Reports>,
    /// The sandbox helper runs it: on SIGTERM the helper ends everything
    /// the server started, then exits.
    pub helper: bool,
    /// What must live as long as the server (the network it was given).
    pub keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// The tool runner, as the MCP servers see it.
pub trait Host: Send + Sync + 'static {
    /// The command that starts `config`'s server in `place`, working in
    /// `cwd`, with network when the server asks for it (or why it cannot).
    fn launch(
        &self,
        config: &McpServerConfig,
        place: &Place,
        cwd: &Path,
    ) -> Result<Launch, McpError>;

    /// A session's place, prepared for its identity.
    fn session_place(&self, session_id: &str) -> Result<Place, McpError>;

    /// The scratch place of the connection that lists `server`'s tools.
    fn catalog_place(&self, server: &str) -> Result<Place, McpError>;

    /// A directory private to the runners, for what the servers' state
    /// keeps across restarts (the resource subscriptions).
    fn state_dir(&self) -> PathBuf;
}
