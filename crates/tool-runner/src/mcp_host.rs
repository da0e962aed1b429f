//! The runner as the MCP servers' host, and their tools in its registry.
//!
//! [`RunnerHost`]: a session's stdio server runs in the session's place,
//! confined like its commands (the sandbox helper with the session's
//! identity, environment, limits and network rules), with network only
//! when its configuration asks and the runner can give it.
//!
//! [`Toolbox`]: the tools the servers list now. A server's word never makes
//! a call read-only: every MCP tool is changing and confirmed by default,
//! whatever its hints say (the hint is passed on for people to see).

use crate::ToolError;
use crate::sandbox::{Sandbox, Who};
use crate::tools::{Call, Running, Source, Tool, ToolOutcome, ToolSpec};
use crate::workspace::Workspace;
use agentry_mcp::{Host, Launch, Mcp, McpError, McpTool, Place};
use agentry_runtime::config::McpServerConfig;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The tool runner, as its MCP servers see it.
pub struct RunnerHost {
    /// How processes are confined.
    pub sandbox: Sandbox,
    /// Where sessions work.
    pub places: crate::projects::Places,
    /// Network for servers that ask for it.
    pub egress: Option<Arc<crate::egress::Egress>>,
}

/// Where a session's stdio servers run: its (prepared) workspace.
pub fn place_of(ws: &Workspace) -> Place {
    Place {
        session_id: ws.session_id().to_string(),
        owner: ws.owner(),
        workspace: ws.root().to_path_buf(),
        tmp: ws.tmp().to_path_buf(),
    }
}

fn who(place: &Place) -> Who<'_> {
    Who {
        session_id: &place.session_id,
        owner: place.owner,
    }
}

impl RunnerHost {
    /// Where sandbox settings are handed to the helper: beneath the
    /// workspace root, which no sandbox can read.
    fn spec_dir(&self) -> PathBuf {
        self.state_dir().join(".mcp-specs")
    }

    /// Network for a stdio server whose configuration asks for it.
    fn network(&self, config: &McpServerConfig) -> Result<Option<crate::egress::Pass>, McpError> {
        if !config.network || !config.url.is_empty() {
            return Ok(None);
        }
        let egress = self
            .egress
            .as_ref()
            .ok_or("it asks for network, but this tool runner gives none")?;
        egress
            .grant(false)
            .map(Some)
            .map_err(|why| McpError(format!("it asks for network, which cannot be given: {why}")))
    }
}

impl Host for RunnerHost {
    fn launch(
        &self,
        config: &McpServerConfig,
        place: &Place,
        cwd: &Path,
    ) -> Result<Launch, McpError> {
        let sandbox = &self.sandbox;
        let network = self.network(config)?;
        let path_var = sandbox
            .base_env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| agentry_sandbox::DEFAULT_PATH.to_string());
        if find_program(&config.command, &path_var).is_none() {
            return Err(McpError(format!(
                "cannot find the program {:?}{}",
                config.command,
                if config.command.contains('/') {
                    String::new()
                } else {
                    format!(" on the PATH ({path_var})")
                }
            )));
        }
        let mut argv = vec![config.command.clone()];
        argv.extend(config.args.iter().cloned());
        let mut cmd = match &sandbox.helper {
            Some(helper) => {
                let mut spec = sandbox.spec(
                    who(place),
                    argv,
                    &place.workspace,
                    &place.tmp,
                    network.as_ref(),
                );
                spec.cwd = cwd.to_path_buf();
                spec.stdin = true;
                spec.env.extend(config.env.clone());
                spec.read_only.extend(own_files(config, &spec.env));
                // The server's environment may hold secrets: the spec goes
                // in a file only the runner's user reads, not on the
                // helper's command line, which every user can read.
                let file = write_spec(&self.spec_dir(), &spec)?;
                let mut cmd = tokio::process::Command::new(helper);
                cmd.arg0(agentry_sandbox::HELPER_NAME)
                    .arg(format!("@{}", file.display()))
                    .env_clear();
                cmd
            }
            None => {
                let script = format!("{}exec \"$@\"", sandbox.ulimit_prefix());
                let mut cmd = tokio::process::Command::new("bash");
                cmd.arg("-c")
                    .arg(script)
                    .arg("bash")
                    .args(&argv)
                    .env_clear()
                    .envs(sandbox.environment(who(place), &place.tmp))
                    .envs(
                        network
                            .as_ref()
                            .map(crate::egress::Pass::environment)
                            .unwrap_or_default(),
                    )
                    .envs(&config.env);
                if let Some(ids) = sandbox.ids_of(who(place)) {
                    cmd.uid(ids.uid).gid(ids.gid);
                }
                cmd
            }
        };
        // A session of its own: no controlling terminal, and a process
        // group whose id is the process's.
        agentry_sandbox::new_session_before_exec(cmd.as_std_mut());
        cmd.current_dir(cwd);
        // The helper says why it could not set the sandbox up on a
        // descriptor of its own, never in the server's stderr.
        let reports = match &sandbox.helper {
            Some(_) => Some(
                agentry_sandbox::Reports::attach(cmd.as_std_mut())
                    .map_err(|e| format!("cannot make the sandbox's report pipe: {e}"))?,
            ),
            None => None,
        };
        Ok(Launch {
            command: cmd,
            reports,
            helper: sandbox.helper.is_some(),
            keep: network.map(|pass| Box::new(pass) as Box<dyn std::any::Any + Send + Sync>),
        })
    }

    fn session_place(&self, session_id: &str) -> Result<Place, McpError> {
        let ws = self
            .places
            .open(session_id)
            .map_err(|e| McpError(e.to_string()))?;
        self.sandbox
            .hand_over_workspace(&ws)
            .map_err(|e| format!("cannot prepare the workspace: {e}"))?;
        Ok(place_of(&ws))
    }

    fn catalog_place(&self, server: &str) -> Result<Place, McpError> {
        let base = self.state_dir().join(agentry_mcp::CATALOG);
        let place = Place {
            session_id: agentry_mcp::CATALOG.to_string(),
            owner: None,
            workspace: base.join(server),
            tmp: base.join(format!("{server}.tmp")),
        };
        for dir in [&base, &place.workspace, &place.tmp] {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        for dir in [&place.workspace, &place.tmp] {
            self.sandbox
                .hand_over(Who::session(agentry_mcp::CATALOG), dir)
                .map_err(|e| format!("cannot hand {} over: {e}", dir.display()))?;
        }
        // The identity must be able to pass through the base directory.
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o711));
        Ok(place)
    }

    fn state_dir(&self) -> PathBuf {
        self.places.root().join(crate::workspace::TEMP_DIRS)
    }
}

/// How a server's tool is described: it may change anything and grow the
/// workspace; what its server says of it is kept for the policy.
pub fn spec_of(server: String, listed: McpTool) -> ToolSpec {
    ToolSpec {
        source: Source::Mcp {
            server,
            read_only_hint: listed.read_only_hint,
        },
        ..ToolSpec::changing(&listed.exposed, &listed.description, listed.schema)
            .growing_workspace()
    }
}

/// The servers' tools.
pub struct Toolbox {
    mcp: Mcp,
    max_output_bytes: usize,
}

impl Toolbox {
    /// The tools of `mcp`'s servers, their output capped at
    /// `max_output_bytes`.
    pub fn new(mcp: Mcp, max_output_bytes: usize) -> Toolbox {
        Toolbox {
            mcp,
            max_output_bytes,
        }
    }

    fn tool(&self, server: String, listed: McpTool) -> Arc<dyn Tool<Call>> {
        Arc::new(ServerTool {
            spec: spec_of(server, listed),
            mcp: self.mcp.clone(),
            max_output_bytes: self.max_output_bytes,
        })
    }
}

impl agentry_tool::Toolbox<Call> for Toolbox {
    fn tools(&self) -> Vec<Arc<dyn Tool<Call>>> {
        self.mcp
            .tools()
            .into_iter()
            .map(|(server, listed)| self.tool(server, listed))
            .collect()
    }

    /// A name under a configured server is the server's to answer, also
    /// while it starts or after it dropped the tool: its call then says why.
    fn find(&self, name: &str) -> Option<Arc<dyn Tool<Call>>> {
        // Only that server's list is read: this runs for every call.
        let (server, listed) = self.mcp.lookup(name)?;
        Some(match listed {
            Some(listed) => self.tool(server, listed),
            None => self.tool(
                server,
                McpTool {
                    exposed: name.to_string(),
                    original: String::new(),
                    description: String::new(),
                    schema: serde_json::json!({"type": "object"}),
                    read_only_hint: false,
                },
            ),
        })
    }
}

/// One server tool: a call to its server, in the session's place.
struct ServerTool {
    spec: ToolSpec,
    mcp: Mcp,
    max_output_bytes: usize,
}

impl Tool<Call> for ServerTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run<'a>(
        &'a self,
        call: &'a Call,
        arguments: &'a str,
    ) -> Running<'a, Result<ToolOutcome, ToolError>> {
        Box::pin(async move {
            let place = place_of(&call.workspace);
            let outcome = self
                .mcp
                .call(
                    &self.spec.name,
                    arguments,
                    call.resume.as_ref(),
                    &place,
                    call.timeout,
                    self.max_output_bytes,
                    call.sink.clone(),
                )
                .await?;
            Ok(match outcome {
                agentry_mcp::Outcome::Done(done) => done,
                agentry_mcp::Outcome::NeedsInput(asked) => {
                    let server = asked.server.clone();
                    *call
                        .asked
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(asked);
                    ToolOutcome {
                        output: format!("[the MCP server {server} waits for a person's answers]"),
                        ..ToolOutcome::default()
                    }
                }
            })
        })
    }
}

/// The paths a stdio server needs to read to run, and no more: its program
/// (as named and where symbolic links lead), the root of the virtualenv it
/// belongs to (a `bin` directory whose parent holds `pyvenv.cfg`), the
/// files named by absolute arguments, and the server's `read_only`.
/// Never a whole directory because a program or a script sits in it: a
/// script's sibling files, or a home directory, are the person's to add.
pub fn own_files(config: &McpServerConfig, env: &[(String, String)]) -> Vec<PathBuf> {
    let path_var = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| agentry_sandbox::DEFAULT_PATH.to_string());
    let mut paths: Vec<PathBuf> = config.read_only.iter().map(PathBuf::from).collect();
    let with_target = |p: PathBuf| {
        let target = p.canonicalize().unwrap_or_else(|_| p.clone());
        [p, target]
    };
    if let Some(found) = find_program(&config.command, &path_var) {
        for program in with_target(found) {
            if let Some(bin) = program.parent()
                && bin.file_name().is_some_and(|n| n == "bin")
                && let Some(root) = bin.parent()
                && root.join("pyvenv.cfg").is_file()
            {
                paths.push(root.to_path_buf());
            }
            paths.push(program);
        }
    }
    for arg in &config.args {
        let p = Path::new(arg);
        if p.is_absolute() && p.is_file() {
            paths.extend(with_target(p.to_path_buf()));
        }
    }
    // Only what exists (the sandbox refuses paths it cannot open), and
    // never the root of the file system.
    paths.retain(|p| p.parent().is_some() && p.exists());
    paths.sort();
    paths.dedup();
    paths
}

/// Writes `spec` to a private file in `dir`, for the helper to read and
/// remove.
fn write_spec(dir: &Path, spec: &agentry_sandbox::Spec) -> Result<PathBuf, McpError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{}-{n}.json", std::process::id()));
    let json = serde_json::to_vec(spec).map_err(|e| format!("cannot describe the sandbox: {e}"))?;
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    file.write_all(&json)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// The program a command names: as given when it has a directory part,
/// else the first match on `path_var`.
fn find_program(command: &str, path_var: &str) -> Option<PathBuf> {
    let program = Path::new(command);
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    std::env::split_paths(path_var)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_server_reads_its_program_its_virtualenv_and_its_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let venv = home.join("venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(venv.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::write(venv.join("bin/server"), "#!/bin/sh\n").unwrap();
        let tools = home.join(".cargo/bin");
        std::fs::create_dir_all(&tools).unwrap();
        std::fs::write(tools.join("tool-server"), "").unwrap();
        std::fs::write(home.join("script.py"), "").unwrap();
        let env = vec![("PATH".to_string(), tools.display().to_string())];
        let in_venv = McpServerConfig {
            command: venv.join("bin/server").display().to_string(),
            args: vec![
                home.join("script.py").display().to_string(),
                "--flag".into(),
            ],
            ..McpServerConfig::default()
        };
        let paths = own_files(&in_venv, &env);
        assert!(paths.contains(&venv), "{paths:?}");
        assert!(paths.contains(&home.join("script.py")), "{paths:?}");
        assert!(
            !paths.contains(&home),
            "never the script's directory: {paths:?}"
        );
        // A program found on PATH outside a virtualenv: the program alone,
        // not ~/.cargo.
        let on_path = McpServerConfig {
            command: "tool-server".into(),
            ..McpServerConfig::default()
        };
        assert_eq!(own_files(&on_path, &env), vec![tools.join("tool-server")]);
        assert_eq!(
            find_program("no-such-server", &tools.display().to_string()),
            None
        );
    }
}
