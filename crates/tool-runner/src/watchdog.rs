//! The memory cap of a session: all the processes of a session's running
//! commands together may hold at most `tool_runner.limits.session_memory_mib`
//! resident. Per-command limits (address space, processes per uid) alone
//! let one session hold hundreds of processes of 4 GiB each.
//!
//! Cgroups would account this in the kernel, but they need cgroup v2 with
//! a delegated subtree, which many hosts (and this project's CI machine,
//! with cgroup v1 controllers) do not give a service. So a watchdog does it
//! everywhere: every [`SWEEP_EVERY`], it sums the resident memory of every
//! process beneath each running command (the helper and all its
//! descendants, found through `/proc/<pid>/task/<tid>/children`), session
//! by session; a session over its cap has all its running commands
//! stopped, and each of them reports why.
//!
//! What it does not stop: memory allocated and released within one sweep,
//! and a burst faster than a sweep (the per-command address-space limit
//! still bounds each process).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How often the watchdog measures.
pub const SWEEP_EVERY: Duration = Duration::from_millis(200);

/// Most processes counted beneath one command (a fork bomb is the process
/// limit's to stop).
const MAX_PROCESSES: usize = 4096;

/// The sessions' running commands and their cap.
#[derive(Debug)]
pub struct MemoryWatch {
    limit_bytes: u64,
    calls: Mutex<HashMap<String, Vec<Watched>>>,
    next_id: AtomicU64,
    started: OnceLock<()>,
}

#[derive(Debug, Clone)]
struct Watched {
    id: u64,
    root: i32,
    helper: bool,
    stopped: Arc<AtomicBool>,
}

/// One command being watched, until dropped.
#[derive(Debug)]
pub struct WatchGuard {
    watch: Arc<MemoryWatch>,
    session: String,
    id: u64,
    stopped: Arc<AtomicBool>,
}

impl WatchGuard {
    /// Whether the watchdog stopped the command (its session was over its
    /// cap).
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// What the command's output says when it was stopped.
    pub fn note(&self) -> String {
        format!(
            "[stopped: the session's running commands held more than {} MiB of memory together \
             (tool_runner.limits.session_memory_mib)]",
            self.watch.limit_bytes / (1024 * 1024)
        )
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        if let Ok(mut calls) = self.watch.calls.lock()
            && let Some(list) = calls.get_mut(&self.session)
        {
            list.retain(|w| w.id != self.id);
            if list.is_empty() {
                calls.remove(&self.session);
            }
        }
    }
}

impl MemoryWatch {
    /// A watch with a cap of `limit_mib` per session (0: none).
    pub fn new(limit_mib: u64) -> Arc<MemoryWatch> {
        Arc::new(MemoryWatch {
            limit_bytes: limit_mib.saturating_mul(1024 * 1024),
            calls: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            started: OnceLock::new(),
        })
    }

    /// The cap, in MiB (0: none).
    pub fn limit_mib(&self) -> u64 {
        self.limit_bytes / (1024 * 1024)
    }

    /// Watches the command whose first process is `root` (the sandbox
    /// helper when `helper`, else the command itself, leading its own
    /// process group) for `session`. Starts the sweeps on first use.
    pub fn watch(self: &Arc<Self>, session: &str, root: i32, helper: bool) -> WatchGuard {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let stopped = Arc::new(AtomicBool::new(false));
        if self.limit_bytes > 0 {
            if let Ok(mut calls) = self.calls.lock() {
                calls.entry(session.to_string()).or_default().push(Watched {
                    id,
                    root,
                    helper,
                    stopped: stopped.clone(),
                });
            }
            self.started.get_or_init(|| {
                let watch = Arc::downgrade(self);
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(SWEEP_EVERY);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tick.tick().await;
                        let Some(watch) = watch.upgrade() else { return };
                        // /proc reads block: off the async threads.
                        let _ = tokio::task::spawn_blocking(move || watch.sweep()).await;
                    }
                });
            });
        }
        WatchGuard {
            watch: self.clone(),
            session: session.to_string(),
            id,
            stopped,
        }
    }

    /// Measures every session once; stops the commands of those over the
    /// cap.
    fn sweep(&self) {
        let sessions: Vec<(String, Vec<Watched>)> = match self.calls.lock() {
            Ok(calls) => calls.iter().map(|(s, l)| (s.clone(), l.clone())).collect(),
            Err(_) => return,
        };
        for (session, commands) in sessions {
            // Commands in the session's sandbox share one root (its
            // helper): each tree is counted once.
            let roots: std::collections::BTreeSet<i32> = commands.iter().map(|w| w.root).collect();
            let total: u64 = roots.into_iter().map(tree_resident_bytes).sum();
            if total <= self.limit_bytes {
                continue;
            }
            tracing::warn!(
                session_id = %session,
                resident_mib = total / (1024 * 1024),
                limit_mib = self.limit_mib(),
                "a session's commands passed their memory cap; stopping them"
            );
            for command in commands {
                command.stopped.store(true, Ordering::Release);
                let pid = nix::unistd::Pid::from_raw(command.root);
                // The helper kills everything the command started; without
                // it, the command leads its own process group.
                let _ = if command.helper {
                    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
                } else {
                    nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL)
                };
            }
        }
    }
}

/// The resident bytes of `root` and every process beneath it.
pub fn tree_resident_bytes(root: i32) -> u64 {
    let page = rustix::param::page_size() as u64;
    let mut total = 0;
    let mut stack = vec![root];
    let mut seen = 0;
    while let Some(pid) = stack.pop() {
        seen += 1;
        if seen > MAX_PROCESSES {
            break;
        }
        if let Ok(statm) = std::fs::read_to_string(format!("/proc/{pid}/statm"))
            && let Some(pages) = statm
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        {
            total += pages * page;
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
                stack.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<i32>().ok()),
                );
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_s_memory_includes_its_descendants() {
        let mut shell = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & sleep 5 & wait"])
            .spawn()
            .unwrap_or_else(|e| panic!("sh: {e}"));
        std::thread::sleep(Duration::from_millis(200));
        let root = shell.id() as i32;
        let alone = std::fs::read_to_string(format!("/proc/{root}/statm"))
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            * rustix::param::page_size() as u64;
        let tree = tree_resident_bytes(root);
        let _ = shell.kill();
        let _ = shell.wait();
        assert!(alone > 0);
        assert!(
            tree > alone,
            "{tree} <= {alone}: the sleeps were not counted"
        );
    }
}
