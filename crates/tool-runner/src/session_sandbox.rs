//! One sandbox per session for bash commands: the namespaces and the built
//! view are made at the session's first command (a session helper of
//! `agentry-sandbox`), and each command is sent to it and forked there.
//! See `agentry_sandbox::session` for what each command still gets of its
//! own.
//!
//! Invariants:
//! - a session's sandbox is keyed by everything its view, identity and
//!   limits depend on (the workspace, its temp dir, their identity, the
//!   configured limits); when one
//!   changes (a project opened, the workspace made again) a new one is
//!   started and the old one ends with its last command;
//! - it ends when idle for `tool_runner.sandbox.session_idle_secs`, when
//!   the session is forgotten, and with the runner (its control socket
//!   closes);
//! - a command that cannot be sent (the session's sandbox died) is sent to
//!   a new one, once.

use crate::ToolError;
use crate::sandbox::Sandbox;
use crate::workspace::Workspace;
use agentry_sandbox::{Ids, SessionSandbox};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long a session helper may take to build its view.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The sessions' sandboxes of one runner.
#[derive(Debug)]
pub struct Sessions {
    idle: Duration,
    map: Mutex<HashMap<String, Arc<Entry>>>,
    sweeper: OnceLock<()>,
}

/// What a session's sandbox was built for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    root: PathBuf,
    tmp: PathBuf,
    ids: Option<Ids>,
    /// The limits of its commands (applied before each command arrives).
    limits: agentry_sandbox::Limits,
    /// The workspace directory itself (device, inode): a workspace removed
    /// and made again is another directory, not bound in the old view.
    dir: (u64, u64),
}

#[derive(Debug)]
struct Entry {
    key: Key,
    sandbox: SessionSandbox,
    /// The session helper: kept so that it is reaped.
    _helper: tokio::process::Child,
    pid: i32,
    home: PathBuf,
    last_used: Mutex<Instant>,
    running: AtomicUsize,
}

/// A session's sandbox, held while one command runs in it.
#[derive(Debug)]
pub struct Lease {
    entry: Arc<Entry>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Ok(mut at) = self.entry.last_used.lock() {
            *at = Instant::now();
        }
        self.entry.running.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Lease {
    /// Sends one command (its spec is written on the returned socket).
    pub fn launch(&self) -> std::io::Result<agentry_sandbox::Launched> {
        self.entry.sandbox.launch()
    }

    /// The session helper's pid: every process of the session's commands
    /// is beneath it.
    pub fn helper_pid(&self) -> i32 {
        self.entry.pid
    }

    /// Where each command gets its fresh HOME.
    pub fn home(&self) -> &std::path::Path {
        &self.entry.home
    }
}

impl Sessions {
    /// Sessions' sandboxes kept `idle` after their last command; zero:
    /// none are kept (a sandbox per command).
    pub fn new(idle: Duration) -> Arc<Sessions> {
        Arc::new(Sessions {
            idle,
            map: Mutex::new(HashMap::new()),
            sweeper: OnceLock::new(),
        })
    }

    /// How long a session's sandbox is kept after its last command.
    pub fn idle(&self) -> Duration {
        self.idle
    }

    /// Whether commands go to sessions' sandboxes.
    pub fn enabled(&self) -> bool {
        !self.idle.is_zero()
    }

    /// How many sessions have a sandbox now.
    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether no session has a sandbox now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pid of the session helper of `session_id`'s sandbox, if it has
    /// one.
    pub fn helper_pid(&self, session_id: &str) -> Option<i32> {
        self.map.lock().ok()?.get(session_id).map(|e| e.pid)
    }

    /// Ends the sandbox of `session_id` (once its running commands end).
    pub fn forget(&self, session_id: &str) {
        if let Ok(mut map) = self.map.lock() {
            map.remove(session_id);
        }
    }

    /// The sandbox of `workspace`'s session, started when it has none (or
    /// one built for another workspace or identity). `fresh`: start a new
    /// one even so (the current one failed).
    pub async fn lease(
        self: &Arc<Self>,
        sandbox: &Sandbox,
        workspace: &Workspace,
        fresh: bool,
    ) -> Result<Lease, ToolError> {
        use std::os::unix::fs::MetadataExt;
        let session = workspace.session_id();
        let meta = std::fs::metadata(workspace.root()).map_err(|e| {
            ToolError::Io(format!(
                "cannot open the workspace {}: {e}",
                workspace.root().display()
            ))
        })?;
        let key = Key {
            root: workspace.root().to_path_buf(),
            tmp: workspace.tmp().to_path_buf(),
            ids: sandbox.ids_of(workspace.who()),
            limits: sandbox.limits.clone(),
            dir: (meta.dev(), meta.ino()),
        };
        if !fresh
            && let Ok(map) = self.map.lock()
            && let Some(entry) = map.get(session)
            && entry.key == key
        {
            entry.running.fetch_add(1, Ordering::AcqRel);
            return Ok(Lease {
                entry: entry.clone(),
            });
        }
        let entry = Arc::new(start(sandbox, workspace, key).await?);
        entry.running.fetch_add(1, Ordering::AcqRel);
        let lease = Lease {
            entry: entry.clone(),
        };
        if let Ok(mut map) = self.map.lock() {
            // A sandbox started meanwhile by another command is replaced;
            // it ends with its commands.
            map.insert(session.to_string(), entry);
        }
        self.sweep_idle();
        Ok(lease)
    }

    /// Starts, once, the task that ends idle sandboxes.
    fn sweep_idle(self: &Arc<Self>) {
        self.sweeper.get_or_init(|| {
            let sessions: Weak<Sessions> = Arc::downgrade(self);
            let every = (self.idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(sessions) = sessions.upgrade() else {
                        return;
                    };
                    let idle = sessions.idle;
                    if let Ok(mut map) = sessions.map.lock() {
                        map.retain(|_, entry| {
                            entry.running.load(Ordering::Acquire) > 0
                                || entry
                                    .last_used
                                    .lock()
                                    .map(|at| at.elapsed() < idle)
                                    .unwrap_or(false)
                        });
                    }
                }
            });
        });
    }
}

/// Starts a session helper for `workspace` and waits until it takes
/// commands.
async fn start(sandbox: &Sandbox, workspace: &Workspace, key: Key) -> Result<Entry, ToolError> {
    let helper = sandbox
        .helper
        .as_ref()
        .ok_or_else(|| ToolError::Io("the OS sandbox is off".into()))?;
    let home = workspace
        .tmp()
        .with_file_name(format!(".home-{}", workspace.session_id()));
    let spec = sandbox.session_spec(workspace, &home);
    let starting = SessionSandbox::starting(helper, &spec)
        .map_err(|e| ToolError::Io(format!("cannot prepare the session's sandbox: {e}")))?;
    let agentry_sandbox::Starting {
        command,
        sandbox: session,
        mut reports,
        helper_end,
    } = starting;
    let mut command = tokio::process::Command::from(command);
    command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = command
        .spawn()
        .map_err(|e| ToolError::Io(format!("cannot start the session's sandbox: {e}")))?;
    drop(helper_end);
    reports.started();
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .unwrap_or_default();
    let waiting = tokio::task::spawn_blocking(move || {
        let ready = session.wait_ready(START_TIMEOUT);
        (session, ready)
    });
    let (session, ready) = waiting
        .await
        .map_err(|e| ToolError::Io(format!("waiting for the session's sandbox failed: {e}")))?;
    let outcome = match ready {
        Ok(true) => Ok(()),
        Ok(false) => Err(None),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(Some(format!(
            "it was not ready after {}s",
            START_TIMEOUT.as_secs()
        ))),
        Err(e) => Err(Some(format!("its control socket failed: {e}"))),
    };
    if let Err(why) = outcome {
        let _ = child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
        let why = reports
            .setup_failure()
            .or(why)
            .unwrap_or_else(|| "it ended before it was ready".to_string());
        return Err(ToolError::Io(format!(
            "the sandbox could not start the command: the session's sandbox: {why}"
        )));
    }
    Ok(Entry {
        key,
        sandbox: session,
        _helper: child,
        pid,
        home,
        last_used: Mutex::new(Instant::now()),
        running: AtomicUsize::new(0),
    })
}
