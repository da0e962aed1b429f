//! Starting an MCP server: a stdio server's process in the session's
//! sandbox (its program found, its files readable, its stderr kept for the
//! error that says why it failed), or a streamable HTTP server's transport.

use super::conn::*;
use crate::{Host, Launch, McpError};
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

/// How an HTTP server is reached: its transport settings (headers, a
/// configured bearer token) and the HTTP client.
pub(super) fn http_settings(
    config: &McpServerConfig,
) -> Result<
    (
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig,
        reqwest::Client,
    ),
    McpError,
> {
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
    if let Some(token) = configured_token(config)? {
        transport_config = transport_config.auth_header(token);
    }
    // Configured by the person: the address rules of the web tools do not
    // apply, but redirects are not followed anywhere else.
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
    Ok((transport_config, client))
}

/// The bearer token the configuration gives, if any.
pub(super) fn configured_token(config: &McpServerConfig) -> Result<Option<String>, McpError> {
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
    Ok((!token.is_empty()).then_some(token))
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
    /// What lives as long as the server (the network it was given).
    _keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl ServerProcess {
    pub(super) fn start(
        config: &McpServerConfig,
        place: &Place,
        host: &dyn Host,
    ) -> Result<
        (
            ServerProcess,
            tokio::process::ChildStdout,
            tokio::process::ChildStdin,
        ),
        McpError,
    > {
        let cwd = match config.cwd.trim() {
            "" => place.workspace.clone(),
            dir if Path::new(dir).is_absolute() => PathBuf::from(dir),
            dir => place.workspace.join(dir),
        };
        let Launch {
            mut command,
            mut reports,
            helper,
            keep,
        } = host.launch(config, place, &cwd)?;
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .map_err(|e| McpError(format!("cannot start {:?}: {e}", config.command)))?;
        if let Some(reports) = &mut reports {
            reports.started();
        }
        let group = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(nix::unistd::Pid::from_raw);
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err(McpError::from("the server's pipes could not be opened"));
        };
        Ok((
            ServerProcess {
                child: Some(child),
                group,
                helper,
                status: Mutex::default(),
                reports,
                _keep: keep,
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
