//! Starting an MCP server: a stdio server's process in the session's
//! sandbox (its program found, its files readable, its stderr kept for the
//! error that says why it failed), or a streamable HTTP server's transport.

use super::conn::*;
use crate::errors::McpError;
use crate::sandbox::Sandbox;
use agentry_runtime::config::McpServerConfig;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) fn explain_start(
    error: &str,
    status: Option<String>,
    setup_failure: Option<String>,
    tail: &Mutex<Vec<String>>,
) -> String {
    if let Some(why) = setup_failure {
        return format!("the sandbox could not start it: {why}");
    }
    let tail = tail.lock().unwrap_or_else(|e| e.into_inner()).join("\n");
    let mut text = match status {
        Some(status) => format!("it exited during start-up ({status})"),
        None => format!("initialize failed: {error}"),
    };
    if !tail.is_empty() {
        text.push_str(&format!("; its last words:\n{tail}"));
    }
    text
}

pub(super) async fn keep_stderr(
    server: String,
    mut stderr: tokio::process::ChildStderr,
    tail: Arc<Mutex<Vec<String>>>,
) {
    use tokio::io::AsyncReadExt;
    // Lines are kept to their first 500 bytes however long they run.
    const KEEP: usize = 500;
    let mut buf = [0u8; 4096];
    let mut line: Vec<u8> = Vec::new();
    loop {
        let n = match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for &b in &buf[..n] {
            if b == b'\n' {
                let text = String::from_utf8_lossy(&line).into_owned();
                line.clear();
                tracing::debug!(server, "mcp server stderr: {text}");
                let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == STDERR_LINES {
                    tail.remove(0);
                }
                tail.push(text);
            } else if line.len() < KEEP {
                line.push(b);
            }
        }
    }
    if !line.is_empty() {
        let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.push(String::from_utf8_lossy(&line).into_owned());
    }
}

pub(super) fn http_transport(
    config: &McpServerConfig,
) -> Result<rmcp::transport::StreamableHttpClientTransport<reqwest::Client>, McpError> {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let mut headers = std::collections::HashMap::new();
    for (name, value) in &config.headers {
        let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| format!("header name {name:?}: {e}"))?;
        let value = reqwest::header::HeaderValue::from_str(value)
            .map_err(|e| format!("the value of header {name}: {e}"))?;
        headers.insert(name, value);
    }
    let mut transport_config =
        StreamableHttpClientTransportConfig::with_uri(config.url.trim()).custom_headers(headers);
    let token = if !config.bearer_token_env.is_empty() {
        std::env::var(&config.bearer_token_env).map_err(|_| {
            format!(
                "bearer_token_env names {:?}, which is not set in the tool runner's environment",
                config.bearer_token_env
            )
        })?
    } else {
        config.bearer_token.clone()
    };
    if !token.is_empty() {
        transport_config = transport_config.auth_header(token);
    }
    // Configured by the person: the address rules of the web tools do not
    // apply, but redirects are not followed anywhere else.
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
    Ok(rmcp::transport::StreamableHttpClientTransport::with_client(
        client,
        transport_config,
    ))
}

/// A stdio server's process (the sandbox helper and what it runs). Dropping
/// it ends the process and everything it started.
pub(super) struct ServerProcess {
    pub(super) child: Option<tokio::process::Child>,
    group: Option<nix::unistd::Pid>,
    helper: bool,
    /// The exit status, once it was waited for.
    status: Mutex<Option<String>>,
    /// The sandbox helper's report descriptor (with a helper).
    pub(super) reports: Option<agentry_sandbox::Reports>,
}

impl ServerProcess {
    pub(super) fn start(
        config: &McpServerConfig,
        place: &Place,
        sandbox: &Sandbox,
        network: Option<&crate::egress::Pass>,
    ) -> Result<
        (
            ServerProcess,
            tokio::process::ChildStdout,
            tokio::process::ChildStdin,
        ),
        String,
    > {
        let cwd = match config.cwd.trim() {
            "" => place.workspace.clone(),
            dir if Path::new(dir).is_absolute() => PathBuf::from(dir),
            dir => place.workspace.join(dir),
        };
        let path_var = sandbox
            .base_env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| agentry_sandbox::DEFAULT_PATH.to_string());
        if find_program(&config.command, &path_var).is_none() {
            return Err(format!(
                "cannot find the program {:?}{}",
                config.command,
                if config.command.contains('/') {
                    String::new()
                } else {
                    format!(" on the PATH ({path_var})")
                }
            ));
        }
        let mut argv = vec![config.command.clone()];
        argv.extend(config.args.iter().cloned());
        let mut cmd = match &sandbox.helper {
            Some(helper) => {
                let mut spec =
                    sandbox.spec(place.who(), argv, &place.workspace, &place.tmp, network);
                spec.cwd = cwd.clone();
                spec.stdin = true;
                spec.env.extend(config.env.clone());
                spec.read_only.extend(own_files(config, &spec.env));
                // The server's environment may hold secrets: the spec goes
                // in a file only the runner's user reads, not on the
                // helper's command line, which every user can read.
                let file = write_spec(&place.spec_dir, &spec)?;
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
                    .envs(sandbox.environment(place.who(), &place.tmp))
                    .envs(
                        network
                            .map(crate::egress::Pass::environment)
                            .unwrap_or_default(),
                    )
                    .envs(&config.env);
                if let Some(ids) = sandbox.ids_of(place.who()) {
                    cmd.uid(ids.uid).gid(ids.gid);
                }
                cmd
            }
        };
        // A session of its own: no controlling terminal, and a process
        // group whose id is the process's.
        agentry_sandbox::new_session_before_exec(cmd.as_std_mut());
        cmd.current_dir(&cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // The helper says why it could not set the sandbox up on a
        // descriptor of its own, never in the server's stderr.
        let mut reports = match &sandbox.helper {
            Some(_) => Some(
                agentry_sandbox::Reports::attach(cmd.as_std_mut())
                    .map_err(|e| format!("cannot make the sandbox's report pipe: {e}"))?,
            ),
            None => None,
        };
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", config.command))?;
        if let Some(reports) = &mut reports {
            reports.started();
        }
        let group = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(nix::unistd::Pid::from_raw);
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err("the server's pipes could not be opened".into());
        };
        Ok((
            ServerProcess {
                child: Some(child),
                group,
                helper: sandbox.helper.is_some(),
                status: Mutex::default(),
                reports,
            },
            stdout,
            stdin,
        ))
    }

    /// The exit status, once the process ended (waits briefly).
    pub(super) async fn exit_status(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match tokio::time::timeout(Duration::from_millis(500), child.wait()).await {
            Ok(Ok(status)) => {
                let text = status.to_string();
                *self.status.lock().unwrap_or_else(|e| e.into_inner()) = Some(text.clone());
                Some(text)
            }
            _ => None,
        }
    }

    /// The exit status if the process is known to have ended.
    pub(super) fn status_now(&self) -> Option<String> {
        if let Some(status) = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Some(status);
        }
        // Without waiting: a zombie's status can be read through its pid
        // only by waiting, which needs `&mut`; /proc tells whether it ended.
        let pid = self.child.as_ref()?.id()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let state = stat.rsplit(')').next()?.split_whitespace().next()?;
        (state == "Z").then(|| "it is no longer running".to_string())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, kill, killpg};
        let Some(pgid) = self.group else { return };
        if self.helper {
            // The helper kills everything the server started, then exits.
            let _ = kill(pgid, Signal::SIGTERM);
        } else {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        // Reap it (bounded), then make sure nothing of the group is left.
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if tokio::time::timeout(Duration::from_secs(2), child.wait())
                    .await
                    .is_err()
                {
                    let _ = child.start_kill();
                }
                let _ = killpg(pgid, Signal::SIGKILL);
            });
        } else {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
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
pub(super) fn write_spec(dir: &Path, spec: &agentry_sandbox::Spec) -> Result<PathBuf, McpError> {
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
pub(super) fn find_program(command: &str, path_var: &str) -> Option<PathBuf> {
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
    pub(super) fn a_server_reads_its_program_its_virtualenv_and_its_files_only() {
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
