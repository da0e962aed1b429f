//! How the runner confines the processes tools start: which OS layers the
//! `agentry-sandbox` helper applies (found once at start-up), the identity
//! commands run as, their environment, limits and the paths they may see.
//!
//! Invariants:
//! - commands never run as root, and never inherit the runner's
//!   environment: [`Sandbox::environment`] is an allowlist;
//! - with the OS sandbox on, every call goes through the helper with the
//!   same layers the start-up probe found; a layer that fails later makes
//!   the call fail, never run with less.

use crate::errors::SandboxCheckError;
use agentry_runtime::Config;
use agentry_sandbox::{Ids, Layers, Report, Spec};
use std::path::{Path, PathBuf};

/// Who commands run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The runner's own uid (a runner that is not root cannot switch). The
    /// sandbox's Landlock scoping keeps commands from signalling or tracing
    /// the runner.
    Runner,
    /// One named user for every session.
    User {
        /// The user's name.
        name: String,
        /// Its ids.
        ids: Ids,
    },
    /// A uid per session: `base + hash(session) % count`, gid the same.
    PerSession {
        /// The first uid.
        base: u32,
        /// How many uids.
        count: u32,
    },
}

/// Whom a command runs for: a session, and the owner of its project
/// directory when it works in one and commands switch identity.
#[derive(Debug, Clone, Copy)]
pub struct Who<'a> {
    /// The session.
    pub session_id: &'a str,
    /// The project directory's owner, whom commands then run as.
    pub owner: Option<Ids>,
}

impl<'a> Who<'a> {
    /// A session working in a scratch workspace.
    pub fn session(session_id: &'a str) -> Who<'a> {
        Who {
            session_id,
            owner: None,
        }
    }
}

impl crate::workspace::Workspace {
    /// Whom this workspace's commands run for.
    pub fn who(&self) -> Who<'_> {
        Who {
            session_id: self.session_id(),
            owner: self.owner(),
        }
    }
}

/// The confinement of commands.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// The helper; `None` when the OS sandbox is off.
    pub helper: Option<PathBuf>,
    /// The layers every call gets.
    pub layers: Layers,
    /// What the start-up probe found (None when off).
    pub report: Option<Report>,
    /// Who commands run as.
    pub identity: Identity,
    /// Resource limits.
    pub limits: agentry_sandbox::Limits,
    /// The environment every command starts from.
    pub base_env: Vec<(String, String)>,
    /// Directories commands may read.
    pub read_only: Vec<PathBuf>,
    /// Paths commands may never read (data dir, config dir, workspaces).
    pub hidden: Vec<PathBuf>,
    /// Internal hosts that calls granted network may reach.
    pub network_allow_hosts: Vec<String>,
    /// Certificates the proxy trusts besides the system's, for secrets'
    /// header rules.
    pub network_ca_file: Option<PathBuf>,
    /// The memory cap of each session's running commands together.
    pub memory: std::sync::Arc<crate::watchdog::MemoryWatch>,
    /// The sessions' sandboxes bash commands are forked in.
    pub sessions: std::sync::Arc<crate::session_sandbox::Sessions>,
}

/// The first Landlock ABI with TCP connect rules.
const LANDLOCK_NET_ABI: u32 = 4;

/// How calls granted network reach the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkRoute {
    /// A Unix socket, bridged into the call's network namespace.
    Bridge,
    /// A TCP port on the host's loopback.
    HostPort,
}

/// Why the sandbox cannot be set up; the runner does not start.
#[derive(Debug, thiserror::Error)]
pub enum SandboxSetupError {
    /// The helper is missing or broken.
    #[error(transparent)]
    Helper(#[from] agentry_sandbox::SandboxError),
    /// The configuration cannot be honoured.
    #[error("{0}")]
    Config(String),
}

/// Set for every command: git reads no configuration of the machine or
/// the user (a planted `~/.gitconfig`), and runs no fsmonitor or hooks of
/// a repository the session may have planted, so the git commands the
/// policy lets run without asking run no code of the workspace's.
const GIT_HARDENING: &[(&str, &str)] = &[
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_COUNT", "2"),
    ("GIT_CONFIG_KEY_0", "core.fsmonitor"),
    ("GIT_CONFIG_VALUE_0", "false"),
    ("GIT_CONFIG_KEY_1", "core.hooksPath"),
    ("GIT_CONFIG_VALUE_1", "/dev/null"),
];

/// Variables copied from the runner's environment when set.
const INHERITED: &[&str] = &["LANG", "LC_ALL", "LC_CTYPE", "TZ"];

/// FNV-1a, for a stable session → uid mapping across runners and restarts.
fn fnv1a(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |hash, b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

impl Sandbox {
    /// No OS sandbox, commands as the runner with an allowlisted
    /// environment: for tests of other parts.
    pub fn unconfined() -> Sandbox {
        Sandbox {
            helper: None,
            layers: Layers::default(),
            report: None,
            identity: Identity::Runner,
            limits: agentry_sandbox::Limits::default(),
            base_env: base_env(&[]),
            read_only: agentry_sandbox::system_read_only(),
            hidden: Vec::new(),
            network_allow_hosts: Vec::new(),
            network_ca_file: None,
            memory: crate::watchdog::MemoryWatch::new(0),
            sessions: crate::session_sandbox::Sessions::new(std::time::Duration::ZERO),
        }
    }

    /// The sandbox the configuration asks for, probing the machine.
    pub fn from_config(config: &Config) -> Result<Sandbox, SandboxSetupError> {
        let t = &config.tool_runner;
        let root = nix::unistd::geteuid().is_root();
        let identity = if !root {
            Identity::Runner
        } else {
            match t.run_as_user.trim() {
                "" | "root" => {
                    return Err(SandboxSetupError::Config(
                        "tool_runner.run_as_user: commands never run as root; use \"session\" \
                         (a uid per session) or the name of an unprivileged user"
                            .into(),
                    ));
                }
                "session" => Identity::PerSession {
                    base: t.sandbox.session_uid_base,
                    count: t.sandbox.session_uid_count,
                },
                name => {
                    let user = nix::unistd::User::from_name(name)
                        .map_err(|e| {
                            SandboxSetupError::Config(format!("cannot look up user {name:?}: {e}"))
                        })?
                        .ok_or_else(|| {
                            SandboxSetupError::Config(format!(
                                "tool_runner.run_as_user: no user named {name:?} on this system"
                            ))
                        })?;
                    if user.uid.is_root() {
                        return Err(SandboxSetupError::Config(format!(
                            "tool_runner.run_as_user: {name:?} is root; commands never run as root"
                        )));
                    }
                    Identity::User {
                        name: user.name,
                        ids: Ids {
                            uid: user.uid.as_raw(),
                            gid: user.gid.as_raw(),
                        },
                    }
                }
            }
        };
        let workspace_root = config.workspace_root();
        let mut hidden = vec![config.data_dir(), workspace_root.clone()];
        // Token files kept outside the data dir (Compose keeps them in
        // volumes of their own).
        for token in [config.client_token_file(), config.service_token_file()] {
            hidden.extend(token.parent().map(Path::to_path_buf));
        }
        hidden.extend(config.config_dir.iter().cloned());
        let hidden = hidden
            .into_iter()
            .map(|p| p.canonicalize().unwrap_or(p))
            .collect();
        let mut read_only = agentry_sandbox::system_read_only();
        read_only.extend(t.sandbox.read_only.iter().map(PathBuf::from));
        let l = &t.limits;
        let mut sandbox = Sandbox {
            helper: None,
            layers: Layers::default(),
            report: None,
            identity,
            limits: agentry_sandbox::Limits {
                cpu_secs: l.cpu_secs,
                address_space_mib: l.address_space_mib,
                processes: l.processes,
                file_size_mib: l.file_size_mib,
                open_files: l.open_files,
            },
            base_env: base_env(&t.env_passthrough),
            read_only,
            hidden,
            network_allow_hosts: t.sandbox.network_allow_hosts.clone(),
            network_ca_file: (!t.sandbox.network_ca_file.is_empty())
                .then(|| PathBuf::from(&t.sandbox.network_ca_file)),
            memory: crate::watchdog::MemoryWatch::new(l.session_memory_mib),
            sessions: crate::session_sandbox::Sessions::new(std::time::Duration::from_secs(
                t.sandbox.session_idle_secs,
            )),
        };
        if t.sandbox.mode == "off" {
            tracing::warn!(
                "tool_runner.sandbox.mode is \"off\": commands run without namespaces, Landlock \
                 or seccomp; only their identity, environment and limits are confined"
            );
            return Ok(sandbox);
        }
        let configured = (!t.sandbox.helper.is_empty()).then(|| Path::new(&t.sandbox.helper));
        let helper = agentry_sandbox::find_helper(configured)?;
        let scratch = workspace_root.join(".tmp").join(".probe");
        std::fs::create_dir_all(&scratch).map_err(|e| {
            SandboxSetupError::Config(format!("cannot create {}: {e}", scratch.display()))
        })?;
        let probe_ids = sandbox.ids_for("probe");
        if let Some(ids) = probe_ids {
            chown(&scratch, ids).map_err(|e| {
                SandboxSetupError::Config(format!("cannot hand {} over: {e}", scratch.display()))
            })?;
        }
        let report = agentry_sandbox::probe(&helper, &scratch, probe_ids)?;
        let layers = report.available();
        if t.sandbox.mode == "require" && layers != Layers::ALL {
            return Err(SandboxSetupError::Config(format!(
                "tool_runner.sandbox.mode is \"require\" but not every layer works here: {}",
                report.lines().join("; ")
            )));
        }
        sandbox.helper = Some(helper);
        sandbox.layers = layers;
        sandbox.report = Some(report);
        Ok(sandbox)
    }

    /// Checks that commands, when they run as another user, can reach the
    /// workspace root by its path (HOME and PWD are absolute): every
    /// directory above it must let others pass (mode o+x).
    pub fn check_reachable(&self, workspace_root: &Path) -> Result<(), SandboxCheckError> {
        use std::os::unix::fs::PermissionsExt;
        if self.ids_for("check").is_none() {
            return Ok(());
        }
        let root = workspace_root
            .canonicalize()
            .unwrap_or_else(|_| workspace_root.to_path_buf());
        for dir in root.ancestors() {
            let mode = std::fs::metadata(dir)
                .map(|m| m.permissions().mode())
                .map_err(|e| format!("cannot inspect {}: {e}", dir.display()))?;
            if mode & 0o001 == 0 {
                return Err(SandboxCheckError(format!(
                    "commands run as unprivileged users but cannot reach the workspace root {}: \
                     {} is mode {:o}. Put the data directory elsewhere (AGENTRY_DATA_DIR, e.g. \
                     /var/lib/agentry, the default for root) or set tool_runner.workspace_root \
                     to a directory outside it",
                    root.display(),
                    dir.display(),
                    mode & 0o7777
                )));
            }
        }
        Ok(())
    }

    /// Lines saying how commands are confined, for logs and health.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = match &self.report {
            Some(report) => report.lines(),
            None => vec!["OS sandbox: OFF (tool_runner.sandbox.mode = \"off\")".to_string()],
        };
        lines.push(match self.memory.limit_mib() {
            0 => {
                "session memory: not capped (tool_runner.limits.session_memory_mib = 0)".to_string()
            }
            mib => format!(
                "session memory: {mib} MiB per session, enforced by a watchdog over its \
                 processes every {} ms (cgroup v2 is not used)",
                crate::watchdog::SWEEP_EVERY.as_millis()
            ),
        });
        if self.helper.is_some() && self.layers.namespaces {
            lines.push(match self.sessions.idle() {
                idle if idle.is_zero() => {
                    "session sandboxes: none (tool_runner.sandbox.session_idle_secs = 0): a new \
                     sandbox for every command"
                        .to_string()
                }
                idle => format!(
                    "session sandboxes: bash commands are forked from their session's sandbox, \
                     kept {} s after its last command",
                    idle.as_secs()
                ),
            });
        }
        lines.push(match &self.identity {
            Identity::Runner => "identity: the runner's uid (the runner is not root)".to_string(),
            Identity::User { name, ids } => format!("identity: user {name} (uid {})", ids.uid),
            Identity::PerSession { base, count } => {
                format!("identity: a uid per session ({base}..{})", base + count)
            }
        });
        lines
    }

    /// Whether commands run as another user than the runner's.
    pub fn switches_identity(&self) -> bool {
        self.identity != Identity::Runner
    }

    /// The ids commands of `who` run as, when they switch: a project's
    /// owner, else the configured user or the session's own uid.
    pub fn ids_of(&self, who: Who<'_>) -> Option<Ids> {
        match (&self.identity, who.owner) {
            (Identity::Runner, _) => None,
            (_, Some(owner)) => Some(owner),
            _ => self.ids_for(who.session_id),
        }
    }

    /// The ids commands of `session_id` run as in a scratch workspace,
    /// when they switch.
    pub fn ids_for(&self, session_id: &str) -> Option<Ids> {
        match &self.identity {
            Identity::Runner => None,
            Identity::User { ids, .. } => Some(*ids),
            Identity::PerSession { base, count } => {
                let id = base + fnv1a(session_id) % count;
                Some(Ids { uid: id, gid: id })
            }
        }
    }

    /// How calls granted network reach the proxy: through a bridge into
    /// their network namespace, or the host's loopback when Landlock can
    /// hold them to the proxy's port; `Err` says why neither works.
    pub fn network_route(&self) -> Result<NetworkRoute, SandboxCheckError> {
        if self.helper.is_none() {
            // No OS sandbox: commands have the host's network anyway; the
            // proxy variables only steer HTTP clients through the checks.
            return Ok(NetworkRoute::HostPort);
        }
        if self.layers.namespaces {
            return Ok(NetworkRoute::Bridge);
        }
        let abi = self
            .report
            .as_ref()
            .and_then(|r| r.landlock.as_ref().ok().copied())
            .filter(|_| self.layers.landlock);
        match abi {
            Some(abi) if abi >= LANDLOCK_NET_ABI => Ok(NetworkRoute::HostPort),
            _ => Err(SandboxCheckError(
                "network can be confined to the proxy only with the namespaces layer or with \
                 Landlock ABI 4 or newer (TCP rules), and this machine has neither"
                    .to_string(),
            )),
        }
    }

    /// How the file tools of `workspace` are confined: the identity of its
    /// commands, and Landlock when commands get it.
    pub fn file_confinement(
        &self,
        workspace: &crate::workspace::Workspace,
    ) -> agentry_sandbox::ThreadConfinement {
        agentry_sandbox::ThreadConfinement {
            workspace: workspace.root().to_path_buf(),
            ids: self.ids_of(workspace.who()),
            landlock: self.helper.is_some() && self.layers.landlock,
        }
    }

    /// Gives `path` to the identity of `who`, so its commands can change
    /// it. Does not follow a symbolic link.
    pub fn hand_over(&self, who: Who<'_>, path: &Path) -> std::io::Result<()> {
        match self.ids_of(who) {
            Some(ids) => chown(path, ids),
            None => Ok(()),
        }
    }

    /// Gives a workspace and its temp dir to their session's identity. A
    /// project directory is never handed over: it keeps its owner, whom
    /// its commands run as.
    pub fn hand_over_workspace(
        &self,
        workspace: &crate::workspace::Workspace,
    ) -> std::io::Result<()> {
        if !workspace.is_project() {
            self.hand_over(workspace.who(), workspace.root())?;
        }
        self.hand_over(workspace.who(), workspace.tmp())
    }

    /// The environment of a command of `session_id`. HOME is the session's
    /// temp dir (a bash call gets a fresh one of its own), never the
    /// workspace, where the model writes files.
    pub fn environment(&self, who: Who<'_>, tmp: &Path) -> Vec<(String, String)> {
        let session_id = who.session_id;
        let mut env = self.base_env.clone();
        let user = match (&self.identity, who.owner) {
            (Identity::Runner, _) => std::env::var("USER").unwrap_or_else(|_| "agentry".into()),
            (_, Some(owner)) => user_name(owner.uid),
            (Identity::User { name, .. }, None) => name.clone(),
            (Identity::PerSession { .. }, None) => {
                format!("agentry-{}", session_id.get(..8).unwrap_or(session_id))
            }
        };
        for (k, v) in GIT_HARDENING {
            env.retain(|(name, _)| name != k);
            env.push((k.to_string(), v.to_string()));
        }
        for (k, v) in [
            ("HOME", tmp.display().to_string()),
            ("TMPDIR", tmp.display().to_string()),
            ("USER", user.clone()),
            ("LOGNAME", user),
        ] {
            env.retain(|(name, _)| name != k);
            env.push((k.to_string(), v));
        }
        env
    }

    /// The helper's spec for running `argv` in `workspace` for `session_id`,
    /// with network through the proxy when `network` is given.
    pub fn spec(
        &self,
        who: Who<'_>,
        argv: Vec<String>,
        workspace: &Path,
        tmp: &Path,
        network: Option<&crate::egress::Pass>,
    ) -> Spec {
        let mut env = self.environment(who, tmp);
        if let Some(pass) = network {
            env.extend(pass.environment());
        }
        Spec {
            argv,
            cwd: workspace.to_path_buf(),
            env,
            read_write: vec![workspace.to_path_buf(), tmp.to_path_buf()],
            read_only: self.read_only.clone(),
            hidden: self.hidden.clone(),
            user: self.ids_of(who),
            limits: self.limits.clone(),
            layers: self.layers,
            proxy: network.map(|pass| pass.route.clone()),
            stdin: false,
            report: false,
            // Every helper the runner starts reports on its descriptor.
            report_fd: Some(agentry_sandbox::REPORT_FD),
            home: None,
        }
    }
}

impl Sandbox {
    /// Whether a bash command goes to its session's sandbox: the OS
    /// sandbox with namespaces, sessions' sandboxes kept, and no network
    /// (a call granted network gets a sandbox of its own, with its bridge
    /// to the proxy).
    pub fn in_session_sandbox(&self, network: bool) -> bool {
        self.helper.is_some() && self.layers.namespaces && !network && self.sessions.enabled()
    }

    /// The spec of `workspace`'s session sandbox: the view, layers and
    /// identity of its commands, and where each gets its fresh HOME.
    pub fn session_spec(&self, workspace: &crate::workspace::Workspace, home: &Path) -> Spec {
        let mut spec = self.spec(
            workspace.who(),
            vec!["true".into()],
            workspace.root(),
            workspace.tmp(),
            None,
        );
        spec.home = Some(home.to_path_buf());
        spec
    }

    /// The `ulimit` prefix that applies the limits inside the command's
    /// shell when there is no helper (bash's `ulimit` calls setrlimit).
    pub fn ulimit_prefix(&self) -> String {
        let r = &self.limits;
        let mut parts = Vec::new();
        for (flag, value) in [
            ("-t", r.cpu_secs),
            ("-v", r.address_space_mib * 1024),
            ("-u", r.processes),
            // bash counts -f in 1024-byte blocks.
            ("-f", r.file_size_mib * 1024),
            ("-n", r.open_files),
        ] {
            if value > 0 {
                parts.push(format!("{flag} {value}"));
            }
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!("ulimit {} || exit 126; ", parts.join(" "))
        }
    }
}

/// The allowlisted environment: a PATH, the locale, TERM, SHELL, and the
/// variables named in `passthrough`.
fn base_env(passthrough: &[String]) -> Vec<(String, String)> {
    let path = std::env::var("PATH")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| agentry_sandbox::DEFAULT_PATH.to_string());
    let mut env = vec![
        ("PATH".to_string(), path),
        ("TERM".to_string(), "dumb".to_string()),
        ("SHELL".to_string(), "/bin/bash".to_string()),
    ];
    for name in INHERITED
        .iter()
        .copied()
        .chain(passthrough.iter().map(String::as_str))
    {
        if let Ok(value) = std::env::var(name) {
            env.retain(|(n, _)| n != name);
            env.push((name.to_string(), value));
        }
    }
    if !env.iter().any(|(n, _)| n == "LANG") {
        env.push(("LANG".to_string(), "C.UTF-8".to_string()));
    }
    env
}

/// The name of the user with `uid` (from the password database), else
/// the number.
pub fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name)
}

fn chown(path: &Path, ids: Ids) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(ids.uid), Some(ids.gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_uids_are_stable_and_in_range() {
        let sandbox = Sandbox {
            identity: Identity::PerSession {
                base: 2_000_000,
                count: 1000,
            },
            ..Sandbox::unconfined()
        };
        let a = sandbox.ids_for("session-a").map(|i| i.uid);
        assert_eq!(a, sandbox.ids_for("session-a").map(|i| i.uid));
        assert_ne!(a, sandbox.ids_for("session-b").map(|i| i.uid));
        for s in ["x", "y", "0192-abc", ""] {
            let uid = sandbox.ids_for(s).map(|i| i.uid).unwrap_or(0);
            assert!((2_000_000..2_001_000).contains(&uid), "{uid}");
        }
    }

    #[test]
    fn the_environment_is_an_allowlist() {
        let sandbox = Sandbox {
            base_env: base_env(&["DEFINITELY_NOT_SET_ANYWHERE".into()]),
            ..Sandbox::unconfined()
        };
        let env = sandbox.environment(Who::session("s1"), Path::new("/w/.tmp/s1"));
        let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
        for name in &names {
            assert!(
                [
                    "PATH", "TERM", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME", "TMPDIR",
                    "USER", "LOGNAME"
                ]
                .contains(name)
                    || name.starts_with("GIT_CONFIG_"),
                "{name} is not on the allowlist"
            );
        }
        assert!(env.contains(&("HOME".into(), "/w/.tmp/s1".into())));
        assert!(env.contains(&("TMPDIR".into(), "/w/.tmp/s1".into())));
    }
}
