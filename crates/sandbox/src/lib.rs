//! The OS sandbox of every process an agent tool starts.
//!
//! The tool runner never starts a tool's process itself: it starts the
//! `agentry-sandbox` helper with a [`Spec`], and the helper confines the
//! command before it runs, then supervises it as one unit. The layers, each
//! applied when the machine allows it (see [`Report`]):
//!
//! - **no terminal**: the command starts a session of its own, without a
//!   controlling terminal; `/dev/tty` is not among its devices and seccomp
//!   refuses the ioctls that type into a terminal (TIOCSTI, TIOCLINUX).
//! - **namespaces** (user when not root, pid, network, mount, IPC, UTS): the
//!   command is pid 1 of its own pid namespace, so everything it starts dies
//!   with it; its network namespace has no interface but a downed loopback,
//!   so there is no route anywhere, the services included; its root is
//!   built from only what commands need (`rootfs`: system directories
//!   read-only, the writable directories, a private `/tmp` and `/dev/shm`,
//!   its own `/proc`, five devices; no `/sys`, `/run` or home directories,
//!   so no host socket can be named).
//! - **Landlock**: reads only beneath the system directories (minus the
//!   paths named hidden: data dir, config dir, other workspaces), writes only
//!   beneath the workspace and the session's temp dir; no TCP connect or
//!   bind; no signals to, and no abstract-socket connections with, processes
//!   outside the sandbox. Ptrace of processes outside is denied by Landlock
//!   too, so `/proc/<pid>/environ` of the services stays closed even when
//!   the command runs under the same uid.
//! - **network**: off unless the call was granted it; then the command's
//!   only way out is the runner's HTTP proxy ([`ProxyRoute`]), which applies
//!   the address rules of the web tools.
//! - **seccomp**: no sockets but AF_UNIX while the network is off (and no
//!   AF_UNIX either without the built view of the namespaces layer), no
//!   ptrace, no new namespaces, no mounts, no io_uring, no kernel keyring,
//!   no BPF or perf events; 32-bit and x32 system calls are refused.
//! - **identity**: as root, commands run as an unprivileged uid of their
//!   session (or a named user), never as the runner's user; the environment
//!   is exactly [`Spec::env`], never inherited.
//! - **limits**: CPU time, address space, processes (per uid, so per
//!   session when each session has its uid), file size, open files.
//!
//! Failure semantics: the helper applies exactly the layers the spec
//! requires and fails closed (exit [`SETUP_FAILED`], and why as a
//! [`HelperReport`] on its own descriptor, [`Reports`], which the command
//! never gets, so nothing it prints or exits with passes for a sandbox
//! failure; on stderr only when started by hand) when one of them cannot be
//! applied; the
//! runner learns which layers the machine supports once, at start-up, with
//! [`probe`]. When the call ends — the command exits, the helper gets
//! SIGTERM, SIGINT or SIGHUP, or the helper's parent dies — every process the
//! command started is killed, `setsid` and double forks included.
//!
//! A leaf: the helper must start fast and small, so this crate must not
//! depend on any other Agentry crate, the async runtime or gRPC.

mod bridge;
pub mod helper;
mod landlock_rules;
mod locate;
mod rootfs;
pub mod session;
mod syscalls;
mod thread;

pub use locate::{HELPER_NAME, find_helper, running_program_embeds_helper, started_as_helper};
pub use session::{CommandSpec, Launched, SessionSandbox, Starting};
pub use thread::{ThreadConfinement, run_confined};

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The exit code of the helper when the sandbox could not be set up.
pub const SETUP_FAILED: i32 = 125;

/// The variable of the helper's environment that holds the spec when it is
/// started as `agentry-sandbox --spec-env` (how the runner passes a spec
/// that may carry secrets: a process's environment is readable only by its
/// own user, its command line by everyone).
pub const SPEC_VARIABLE: &str = "AGENTRY_SANDBOX_SPEC";

/// Makes `cmd`'s process start a new session just before it execs: it has
/// no controlling terminal, so neither it nor anything it starts can reach
/// the terminal the services run in (`/dev/tty`, TIOCSTI, signals from the
/// keyboard). Its process group is its own (the session's id).
pub fn new_session_before_exec(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure makes one system call
    // (setsid); it allocates nothing and takes no lock.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()
                .map(|_| ())
                .map_err(std::io::Error::from)
        });
    }
}

/// What the helper is asked to run, and how confined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// The command and its arguments; `argv[0]` is looked up in the
    /// environment's PATH.
    pub argv: Vec<String>,
    /// The working directory (the session's workspace).
    pub cwd: PathBuf,
    /// The whole environment of the command.
    pub env: Vec<(String, String)>,
    /// Directories the command may read, write and execute beneath.
    pub read_write: Vec<PathBuf>,
    /// Directories (or files) the command may read and execute beneath.
    pub read_only: Vec<PathBuf>,
    /// Paths never readable, although beneath a `read_only` directory.
    pub hidden: Vec<PathBuf>,
    /// The identity the command runs as; `None` keeps the helper's.
    pub user: Option<Ids>,
    /// Resource limits.
    pub limits: Limits,
    /// The layers to apply; each must succeed.
    pub layers: Layers,
    /// Outbound network, through the runner's proxy; `None`: no network
    /// at all (only AF_UNIX sockets can be made).
    #[serde(default)]
    pub proxy: Option<ProxyRoute>,
    /// Hand the helper's standard input to the command (a stdio server
    /// speaks over it); otherwise the command's is closed.
    #[serde(default)]
    pub stdin: bool,
    /// Print what was applied on stderr (`agentry-sandbox-report: …` lines)
    /// before the command runs; used by [`probe`].
    #[serde(default)]
    pub report: bool,
    /// The helper's own descriptor (see [`Reports`]): a set-up failure is
    /// written there, as data, instead of on stderr, so nothing the command
    /// prints can pass for one. Closed in the command.
    #[serde(default)]
    pub report_fd: Option<i32>,
    /// With namespaces: a path where the command gets a fresh, empty,
    /// private tmpfs as its HOME (a session's sandbox gives each command
    /// its own there); `None`: HOME is one of the writable directories.
    #[serde(default)]
    pub home: Option<PathBuf>,
}

/// The descriptor a helper started through [`Reports::attach`] reports on.
pub const REPORT_FD: i32 = 3;

/// One report of the helper on its descriptor: a JSON line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HelperReport {
    /// The sandbox could not be set up (the helper then exits
    /// [`SETUP_FAILED`]); the command never ran.
    SetupFailed(String),
    /// A command of a session's sandbox exited with this code.
    Exited(i32),
    /// A command of a session's sandbox was ended by this signal (SIGKILL
    /// when it was stopped).
    Signaled(i32),
}

/// The runner's end of a helper's report descriptor.
#[derive(Debug)]
pub struct Reports {
    read: std::os::fd::OwnedFd,
    write: Option<std::os::fd::OwnedFd>,
}

impl Reports {
    /// A pipe whose write end `cmd`'s process (the helper) gets as
    /// [`REPORT_FD`]; put `report_fd: Some(REPORT_FD)` in its spec.
    pub fn attach(cmd: &mut std::process::Command) -> std::io::Result<Reports> {
        use std::os::fd::AsRawFd;
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        let write = above_given(write)?;
        give_fd_as(cmd, write.as_raw_fd(), REPORT_FD);
        Ok(Reports {
            read,
            write: Some(write),
        })
    }

    /// Once the helper is started: the runner's copy of the write end
    /// goes, so that the pipe ends with the helper.
    pub fn started(&mut self) {
        self.write = None;
    }

    /// Why the sandbox could not be set up, if the helper said so (read
    /// once it has exited; never blocks).
    pub fn setup_failure(&self) -> Option<String> {
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = nix::unistd::read(&self.read, &mut buf) {
            if n == 0 || text.len() > 64 * 1024 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&text)
            .lines()
            .find_map(|line| match serde_json::from_str(line) {
                Ok(HelperReport::SetupFailed(why)) => Some(why),
                Ok(_) | Err(_) => None,
            })
    }
}

/// A copy of `fd` numbered above every descriptor the helper is given
/// ([`REPORT_FD`], the session's control descriptor), so that placing one
/// of them never overwrites another before it is placed.
pub(crate) fn above_given(fd: std::os::fd::OwnedFd) -> std::io::Result<std::os::fd::OwnedFd> {
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 10)?)
}

/// Makes `cmd`'s process get the descriptor `raw` (open in the runner,
/// close-on-exec there, numbered above the given ones: [`above_given`]) as
/// `target`, kept open across its exec.
pub(crate) fn give_fd_as(cmd: &mut std::process::Command, raw: i32, target: i32) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure makes one system call
    // (dup2: `raw` is never `target`, being above it); it allocates
    // nothing and takes no lock.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(raw, target) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// How a command with network reaches the runner's HTTP proxy, the only
/// way out it gets. The command may open TCP sockets, but Landlock lets it
/// connect to the proxy's port only, and with namespaces its network
/// namespace has nothing else on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProxyRoute {
    /// With namespaces: the helper brings up the loopback of the call's
    /// network namespace, listens on `127.0.0.1:port` there and forwards
    /// every connection to the proxy's Unix socket.
    Bridge {
        /// The proxy's Unix socket.
        socket: PathBuf,
        /// The port the command connects to, inside its namespace.
        port: u16,
    },
    /// Without namespaces: the proxy listens on the host's loopback at
    /// this port, the only TCP port Landlock lets the command connect to.
    Host {
        /// The proxy's port on 127.0.0.1.
        port: u16,
    },
}

impl ProxyRoute {
    /// The port the command connects to.
    pub fn port(&self) -> u16 {
        match self {
            ProxyRoute::Bridge { port, .. } | ProxyRoute::Host { port } => *port,
        }
    }
}

/// A uid and gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ids {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// Resource limits of one command; 0 = not limited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// CPU seconds (RLIMIT_CPU).
    pub cpu_secs: u64,
    /// Address space in MiB (RLIMIT_AS).
    pub address_space_mib: u64,
    /// Processes of the command's uid (RLIMIT_NPROC).
    pub processes: u64,
    /// Largest file written, in MiB (RLIMIT_FSIZE).
    pub file_size_mib: u64,
    /// Open files (RLIMIT_NOFILE).
    pub open_files: u64,
}

impl Limits {
    /// The limits as (resource, value) pairs, those set only.
    fn rlimits(&self) -> Vec<(nix::sys::resource::Resource, u64)> {
        use nix::sys::resource::Resource;
        let mib = |n: u64| n.saturating_mul(1024 * 1024);
        [
            (Resource::RLIMIT_CPU, self.cpu_secs),
            (Resource::RLIMIT_AS, mib(self.address_space_mib)),
            (Resource::RLIMIT_NPROC, self.processes),
            (Resource::RLIMIT_FSIZE, mib(self.file_size_mib)),
            (Resource::RLIMIT_NOFILE, self.open_files),
        ]
        .into_iter()
        .filter(|&(_, value)| value > 0)
        .collect()
    }

    /// Makes `cmd`'s process take these limits (soft and hard) just before
    /// it execs, after its identity switch: how commands are limited
    /// without the OS sandbox, with no shell in between. A limit that
    /// cannot be set fails the spawn.
    pub fn apply_before_exec(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let limits = self.rlimits();
        // SAFETY: between fork and exec the closure makes only setrlimit
        // system calls over a vector built before the fork: it allocates
        // nothing and takes no lock, so the parent's other threads cannot
        // leave it waiting on one.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                for &(resource, value) in &limits {
                    nix::sys::resource::setrlimit(resource, value, value)
                        .map_err(std::io::Error::from)?;
                }
                Ok(())
            });
        }
    }
}

/// Which layers to apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layers {
    /// pid, network, mount, IPC and UTS namespaces (and a user namespace
    /// when the helper is not root).
    pub namespaces: bool,
    /// Landlock file-system, TCP and scope rules.
    pub landlock: bool,
    /// The seccomp filter.
    pub seccomp: bool,
}

impl Layers {
    /// Every layer.
    pub const ALL: Layers = Layers {
        namespaces: true,
        landlock: true,
        seccomp: true,
    };
}

/// What the machine supports, found by running the helper once per layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// Namespaces: `Ok` or why not.
    pub namespaces: Result<(), String>,
    /// Landlock: `Ok(ABI version)` or why not.
    pub landlock: Result<u32, String>,
    /// seccomp: `Ok` or why not.
    pub seccomp: Result<(), String>,
}

impl Report {
    /// The layers that work here.
    pub fn available(&self) -> Layers {
        Layers {
            namespaces: self.namespaces.is_ok(),
            landlock: self.landlock.is_ok(),
            seccomp: self.seccomp.is_ok(),
        }
    }

    /// One line per layer, for logs and `agentry health`.
    pub fn lines(&self) -> Vec<String> {
        let state = |r: &Result<String, String>| match r {
            Ok(what) => format!("on ({what})"),
            Err(why) => format!("OFF: {why}"),
        };
        vec![
            format!(
                "namespaces: {}",
                state(
                    &self
                        .namespaces
                        .clone()
                        .map(|()| { "pid, network, mount, ipc, uts".to_string() })
                )
            ),
            format!(
                "landlock: {}",
                state(&self.landlock.clone().map(|abi| format!("ABI {abi}")))
            ),
            format!(
                "seccomp: {}",
                state(&self.seccomp.clone().map(|()| "filter".to_string()))
            ),
        ]
    }
}

/// Why the sandbox could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The helper program was not found.
    #[error(
        "cannot find the sandbox helper {HELPER_NAME:?} or the agentry program that embeds it \
         (looked in: {looked}); build one with `cargo build -p agentry-sandbox` or \
         `cargo build -p agentry-cli`, install it next to the tool runner, or set \
         tool_runner.sandbox.helper"
    )]
    HelperNotFound {
        /// The places searched.
        looked: String,
    },
    /// Running the helper failed.
    #[error("cannot run the sandbox helper {path}: {source}")]
    Spawn {
        /// The helper.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The helper printed something that is not a report.
    #[error("the sandbox helper's probe answered {0:?}")]
    BadProbe(String),
}

/// Asks `helper` which layers this machine supports, by confining a
/// trivial command with each layer alone. `workspace` is a scratch
/// directory the probe may use as its writable directory, `user` the
/// identity commands will run as.
pub fn probe(helper: &Path, workspace: &Path, user: Option<Ids>) -> Result<Report, SandboxError> {
    let attempt = |layers: Layers| -> Result<Result<String, String>, SandboxError> {
        let spec = Spec {
            argv: vec!["true".into()],
            cwd: workspace.to_path_buf(),
            env: vec![("PATH".into(), DEFAULT_PATH.into())],
            read_write: vec![workspace.to_path_buf()],
            read_only: system_read_only(),
            hidden: Vec::new(),
            user,
            limits: Limits::default(),
            layers,
            proxy: None,
            stdin: false,
            report: true,
            report_fd: Some(REPORT_FD),
            home: None,
        };
        use std::os::unix::process::CommandExt;
        let spawn_error = |source| SandboxError::Spawn {
            path: helper.to_path_buf(),
            source,
        };
        let mut cmd = std::process::Command::new(helper);
        cmd.arg0(HELPER_NAME)
            .arg(serde_json::to_string(&spec).unwrap_or_default())
            .stdin(std::process::Stdio::null());
        let mut reports = Reports::attach(&mut cmd).map_err(spawn_error)?;
        let out = cmd.output().map_err(spawn_error)?;
        reports.started();
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return Ok(Ok(err.into_owned()));
        }
        let why = reports
            .setup_failure()
            .unwrap_or_else(|| format!("the probe exited with {}: {}", out.status, err.trim()));
        Ok(Err(why))
    };
    let none = Layers::default();
    // The helper itself must work before any layer is judged.
    if let Err(why) = attempt(none)? {
        return Err(SandboxError::BadProbe(why));
    }
    let namespaces = attempt(Layers {
        namespaces: true,
        ..none
    })?
    .map(|_| ());
    let landlock = attempt(Layers {
        landlock: true,
        ..none
    })?
    .and_then(|report| {
        report
            .lines()
            .find_map(|l| l.strip_prefix("agentry-sandbox-report: landlock ABI "))
            .and_then(|abi| abi.trim().parse::<u32>().ok())
            .ok_or_else(|| "Landlock is not enforced by this kernel".to_string())
    });
    let seccomp = attempt(Layers {
        seccomp: true,
        ..none
    })?
    .map(|_| ());
    Ok(Report {
        namespaces,
        landlock,
        seccomp,
    })
}

/// The PATH commands get when none is configured.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The system directories commands may read and execute beneath, those of
/// them that exist here. `/sys` is not one of them: it lists the host's
/// devices and holds kernel knobs no command needs.
pub fn system_read_only() -> Vec<PathBuf> {
    [
        "/usr",
        "/bin",
        "/sbin",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/etc",
        "/opt",
        "/proc",
        "/dev",
        "/run/systemd/resolve",
        "/var/lib/dpkg",
        "/var/cache/fontconfig",
        "/nix/store",
    ]
    .iter()
    .map(PathBuf::from)
    .filter(|p| p.exists())
    .collect()
}
