//! A chat with no services running starts them: `agentry up` as a child
//! process of its own (its own process group, its logs in a file), for as
//! long as the chat lasts. `agentry up` in another terminal keeps them
//! running instead.

use agentry_runtime::Config;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The services this process started, stopped (SIGTERM, then SIGKILL after
/// a while) when dropped.
pub struct Services {
    child: Option<Child>,
}

impl Drop for Services {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + STOP_WAIT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// How long the services get to start.
const START_WAIT: Duration = Duration::from_secs(60);
/// How long they get to stop cleanly.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// Whether the orchestrator answers (a listing of one session).
async fn answering(config: &Config) -> bool {
    let attempt = async {
        let mut client = crate::client::connect(config).await.ok()?;
        client
            .list_sessions(agentry_proto::sessions::v1::ListSessionsRequest {
                limit: 1,
                ..Default::default()
            })
            .await
            .ok()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), attempt).await,
        Ok(Some(_))
    )
}

/// Whether `url` names this machine (only then are services started here).
fn is_local(url: &str) -> bool {
    let authority = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        // An IPv6 address: up to its closing bracket.
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    matches!(host, "127.0.0.1" | "localhost" | "::1" | "")
}

/// The services for a chat: those already running, or, when none answer at
/// a local address, `agentry up` started now (said on stderr, with where
/// its logs go).
pub async fn ensure(config: &Config) -> anyhow::Result<Services> {
    if answering(config).await || !is_local(&config.orchestrator.url) {
        // Running, or elsewhere: connecting says what is wrong, if anything.
        return Ok(Services { child: None });
    }
    let logs = config.data_dir().join("logs");
    agentry_runtime::datadir::prepare_dir(&logs)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", logs.display()))?;
    let log = logs.join("up.log");
    let file = std::fs::File::create(&log)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", log.display()))?;
    eprintln!(
        "agentry: no services answer at {}; starting them for this chat (logs: {}). They stop \
         when it ends; `agentry up` in another terminal keeps them running.",
        config.orchestrator.url,
        log.display()
    );
    let exe = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("cannot find this program to start the services: {e}"))?;
    let mut command = Command::new(exe);
    command
        .arg("up")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file);
    if let Some(dir) = &config.config_dir {
        command.arg("--config-dir").arg(dir);
    }
    // Its own process group: the terminal's Ctrl+C is the chat's.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let child = command
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start `agentry up`: {e}"))?;
    let mut services = Services { child: Some(child) };
    let started = Instant::now();
    loop {
        if answering(config).await {
            return Ok(services);
        }
        if let Some(child) = services.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            services.child = None;
            anyhow::bail!(
                "`agentry up` stopped ({status}) before the services answered:\n{}",
                tail(&log, 12)
            );
        }
        if started.elapsed() > START_WAIT {
            anyhow::bail!(
                "the services did not answer within {} s; see {}",
                START_WAIT.as_secs(),
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The last `lines` lines of a file, for an error.
fn tail(path: &PathBuf, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_addresses_start_services() {
        assert!(is_local("http://127.0.0.1:7741"));
        assert!(is_local("http://localhost:7741"));
        assert!(is_local("https://[::1]:7741"));
        assert!(!is_local("http://orchestrator:7741"));
        assert!(!is_local("https://agents.example.com"));
    }
}
