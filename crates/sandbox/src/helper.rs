//! The helper program, `agentry-sandbox '<spec as JSON>'` (or
//! `agentry-sandbox @<file holding the spec>`, removed once read): confines
//! one command and supervises it until it ends.
//!
//! The helper is single-threaded, which is what makes it safe to do the set
//! up between fork and exec: no other thread can hold a lock the child
//! would need. Order matters and is fixed:
//!
//! 1. the helper blocks the signals it waits for, becomes a child
//!    subreaper and asks for SIGTERM when its parent (the runner) dies;
//! 2. namespaces: `unshare` (with a user namespace mapping only its own ids
//!    when not root), then mounts made private to them;
//! 3. in the child, before exec: a new session without a controlling
//!    terminal (`setsid`); with namespaces, a mount namespace of its own
//!    whose root is built from only what commands need (`rootfs`); the
//!    Landlock ruleset built (while paths can still be opened), resource
//!    limits, the identity switch, the parent-death signal, no_new_privs,
//!    Landlock enforced, seccomp last (it refuses calls the earlier steps
//!    use);
//! 4. with network through a bridge, the helper forks the process that
//!    forwards the namespace's `127.0.0.1:<port>` to the proxy;
//! 5. the helper waits; when the command ends, or a stop signal arrives,
//!    every process the command started is killed before the helper exits
//!    with the command's status.

use crate::{SETUP_FAILED, SPEC_VARIABLE, Spec, landlock_rules, syscalls};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// Signals that stop the call.
const STOP_SIGNALS: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// How many rounds of "kill every child, reap" [`kill_tree`] makes at most.
const MAX_KILL_ROUNDS: usize = 10_000;

fn fail(message: &str) -> i32 {
    eprintln!("agentry-sandbox: {message}");
    SETUP_FAILED
}

/// A set-up failure, told on the report descriptor when the spec names
/// one (as data nothing the command prints can imitate), else on stderr.
fn fail_for(spec: &Spec, message: &str) -> i32 {
    report(spec, message);
    SETUP_FAILED
}

pub(crate) fn report(spec: &Spec, message: &str) {
    let Some(fd) = spec.report_fd else {
        eprintln!("agentry-sandbox: {message}");
        return;
    };
    let mut line = serde_json::to_string(&crate::HelperReport::SetupFailed(message.to_string()))
        .unwrap_or_default();
    line.push('\n');
    // SAFETY: the runner gave the helper this descriptor for its reports;
    // it is borrowed for one write and never closed here.
    #[allow(unsafe_code)]
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    if nix::unistd::write(borrowed, line.as_bytes()).is_err() {
        eprintln!("agentry-sandbox: {message}");
    }
}

/// The report descriptor is the helper's alone: closed when the command
/// execs.
fn keep_reports_private(spec: &Spec) -> Result<(), String> {
    if let Some(fd) = spec.report_fd {
        // SAFETY: fcntl on a descriptor number; no memory is involved.
        #[allow(unsafe_code)]
        let done = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        if done < 0 {
            return Err(format!(
                "the report descriptor {fd} is not open: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// Runs the helper with its command-line arguments (without the program
/// name) and returns the exit code; a command killed by a signal makes the
/// helper die of the same signal.
pub fn run_main(args: &[String]) -> i32 {
    let spec: Spec = match args {
        [flag] if flag == "--version" => {
            println!("{}", crate::locate::version());
            return 0;
        }
        // `@FILE`: the spec is in a file the runner wrote for this call
        // (so that secrets in its environment are not on the command line,
        // which every user can read); it is removed once read.
        [arg] if arg.starts_with('@') => {
            let path = &arg[1..];
            let text = std::fs::read_to_string(path);
            let _ = std::fs::remove_file(path);
            match text
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
            {
                Ok(spec) => spec,
                Err(e) => return fail(&format!("the spec file {path} is not valid: {e}")),
            }
        }
        // The spec is in the helper's environment (readable only by the
        // runner's own user, never on a command line).
        // A session's sandbox: the spec in the environment, the control
        // socket at its descriptor (see `session`).
        [flag] if flag == "--session" => {
            let spec: Spec = match std::env::var(SPEC_VARIABLE)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
            {
                Ok(spec) => spec,
                Err(e) => return fail(&format!("the spec in ${SPEC_VARIABLE} is not valid: {e}")),
            };
            if let Err(message) = keep_reports_private(&spec) {
                return fail(&message);
            }
            return match crate::session::serve(&spec) {
                Ok(status) => exit_like(status),
                Err(message) => fail_for(&spec, &message),
            };
        }
        [flag] if flag == "--spec-env" => match std::env::var(SPEC_VARIABLE)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        {
            Ok(spec) => spec,
            Err(e) => return fail(&format!("the spec in ${SPEC_VARIABLE} is not valid: {e}")),
        },
        [json] => match serde_json::from_str(json) {
            Ok(spec) => spec,
            Err(e) => return fail(&format!("the spec is not valid: {e}")),
        },
        _ => {
            return fail(
                "usage: agentry-sandbox '<spec as JSON>' (started by the agentry tool runner)",
            );
        }
    };
    if let Err(message) = keep_reports_private(&spec) {
        return fail(&message);
    }
    if spec.argv.is_empty() {
        return fail_for(&spec, "the spec names no command");
    }
    match supervise(&spec) {
        Ok(status) => exit_like(status),
        Err(message) => fail_for(&spec, &message),
    }
}

/// Blocks the signals the helper waits for (a child's end, the stop
/// signals) and returns them, for `sigwait` or a signalfd.
pub(crate) fn block_waited_signals() -> Result<SigSet, String> {
    let mut waited = SigSet::empty();
    waited.add(Signal::SIGCHLD);
    for s in STOP_SIGNALS {
        waited.add(s);
    }
    waited
        .thread_block()
        .map_err(|e| format!("cannot block signals: {e}"))?;
    Ok(waited)
}

/// With `ignore`, children that end are reaped by the kernel (no zombie,
/// no SIGCHLD); without, the default comes back.
pub(crate) fn ignore_children(ignore: bool) -> Result<(), String> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, sigaction};
    let action = if ignore {
        SigAction::new(SigHandler::SigIgn, SaFlags::SA_NOCLDWAIT, SigSet::empty())
    } else {
        SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty())
    };
    // SAFETY: SIG_IGN and SIG_DFL run no code of ours in a signal context.
    #[allow(unsafe_code)]
    unsafe { sigaction(Signal::SIGCHLD, &action) }
        .map(|_| ())
        .map_err(|e| format!("cannot set how children are reaped: {e}"))
}

fn supervise(spec: &Spec) -> Result<WaitStatus, String> {
    let waited = block_waited_signals()?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)
        .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| format!("cannot become a subreaper: {e}"))?;
    let root = nix::unistd::geteuid().is_root();
    if spec.user.is_some() && !root {
        return Err("a user to run as was given, but the helper is not root".into());
    }
    if spec.layers.namespaces {
        enter_namespaces(root)?;
    }
    let bridge = match &spec.proxy {
        Some(crate::ProxyRoute::Bridge { socket, port }) => {
            if !spec.layers.namespaces {
                return Err("network: a proxy bridge needs the namespaces layer".into());
            }
            Some((crate::bridge::listen(*port)?, socket.clone()))
        }
        _ => None,
    };
    let child = spawn(spec)?;
    if let Some((listener, socket)) = bridge {
        start_bridge(listener, &socket)?;
    }
    let main = Pid::from_raw(i32::try_from(child.id()).map_err(|e| e.to_string())?);
    // The Child handle is not used to wait: the helper reaps every process
    // that is reparented to it, and the command's own status comes from
    // that same loop.
    drop(child);
    loop {
        let signal = waited.wait().map_err(|e| format!("sigwait: {e}"))?;
        if signal == Signal::SIGCHLD {
            if let Some(status) = reap(main) {
                kill_tree(main, spec.layers.namespaces);
                return Ok(status);
            }
            continue;
        }
        // A stop signal: end the call.
        let _ = nix::sys::signal::kill(main, Signal::SIGKILL);
        kill_tree(main, spec.layers.namespaces);
        return Ok(WaitStatus::Signaled(main, signal, false));
    }
}

/// Forks the process that forwards the namespace's proxy port to the
/// proxy's socket. It lives in the call's pid namespace, so it dies with
/// the command at the latest.
fn start_bridge(listener: std::net::TcpListener, socket: &Path) -> Result<(), String> {
    // SAFETY: the helper is single-threaded, so the child may do anything
    // after fork; it never returns into the helper's code.
    #[allow(unsafe_code)]
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
            crate::bridge::serve(listener, socket);
            std::process::exit(0);
        }
        Ok(nix::unistd::ForkResult::Parent { .. }) => Ok(()),
        Err(e) => Err(format!("network: cannot start the proxy bridge: {e}")),
    }
}

/// Reaps every exited child; returns the status of `main` once it exited.
pub(crate) fn reap(main: Pid) -> Option<WaitStatus> {
    let mut status_of_main = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return status_of_main,
            Ok(status) => {
                if status.pid() == Some(main)
                    && matches!(status, WaitStatus::Exited(..) | WaitStatus::Signaled(..))
                {
                    status_of_main = Some(status);
                }
            }
        }
    }
}

/// Kills every process the command started. In a pid namespace, killing
/// its first process kills all of them; otherwise every descendant is
/// either a child of the helper or, once its parent died, reparented to it
/// (the helper is a subreaper), so killing children until none are left
/// reaches them all, `setsid` and double forks included.
pub(crate) fn kill_tree(main: Pid, pid_namespace: bool) {
    if pid_namespace {
        let _ = nix::sys::signal::kill(main, Signal::SIGKILL);
    }
    for _ in 0..MAX_KILL_ROUNDS {
        let children = children();
        if children.is_empty() {
            break;
        }
        for pid in &children {
            let _ = nix::sys::signal::kill(*pid, Signal::SIGKILL);
        }
        for _ in &children {
            // Blocks until one of them is gone; SIGKILL cannot be ignored.
            if waitpid(None, None).is_err() {
                break;
            }
        }
    }
    // Anything already dead.
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// The helper's children, from `/proc/self/task/<tid>/children` (the helper
/// has one thread), else by scanning `/proc`.
fn children() -> Vec<Pid> {
    let me = nix::unistd::getpid();
    if let Ok(list) = std::fs::read_to_string(format!("/proc/self/task/{me}/children")) {
        return list
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .map(Pid::from_raw)
            .collect();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // The fields after the command name, which may hold spaces.
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<i32>().ok()
                })
                == Some(me.as_raw())
        })
        .map(Pid::from_raw)
        .collect()
}

pub(crate) fn enter_namespaces(root: bool) -> Result<(), String> {
    use nix::sched::CloneFlags;
    let mut flags = CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    if !root {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    nix::sched::unshare(flags).map_err(|e| {
        format!(
            "namespaces: unshare failed ({e}); {}",
            if root {
                "the runner lacks CAP_SYS_ADMIN (usual in containers)"
            } else {
                "unprivileged user namespaces are disabled here"
            }
        )
    })?;
    if !root {
        let write = |file: &str, text: String| {
            std::fs::write(format!("/proc/self/{file}"), text)
                .map_err(|e| format!("namespaces: cannot write /proc/self/{file}: {e}"))
        };
        write("setgroups", "deny".into())?;
        write("uid_map", format!("{uid} {uid} 1\n"))?;
        write("gid_map", format!("{gid} {gid} 1\n"))?;
    }
    // Mounts made from here on stay in this namespace.
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("namespaces: cannot make mounts private: {e}"))?;
    Ok(())
}

/// How the command's file-system view is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Confinement {
    /// Built for this command alone (with the namespaces layer).
    Build,
    /// The session's view, already built, with a fresh `/tmp`, `/dev/shm`
    /// and HOME made by the command's supervisor: the command mounts its
    /// own `/proc`.
    InSession,
}

fn spawn(spec: &Spec) -> Result<std::process::Child, String> {
    let mut cmd = std::process::Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd)
        .stdin(if spec.stdin {
            std::process::Stdio::inherit()
        } else {
            std::process::Stdio::null()
        });
    let spec_for_child = spec.clone();
    // SAFETY: the helper is single-threaded (it starts no thread and links
    // no runtime that does), so between fork and exec the child may
    // allocate and use any library function: no lock can be held by a
    // thread that does not exist in the child.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            confine(&spec_for_child, Confinement::Build).map_err(|message| {
                report(&spec_for_child, &message);
                std::io::Error::from_raw_os_error(libc::EPERM)
            })
        });
    }
    cmd.spawn().map_err(|e| match e.raw_os_error() {
        // The child already said why.
        Some(libc::EPERM) => "the sandbox could not be set up".to_string(),
        _ => format!("cannot run {:?}: {e}", spec.argv[0]),
    })
}

/// Everything the child does to itself before exec.
pub(crate) fn confine(spec: &Spec, confinement: Confinement) -> Result<(), String> {
    // A session of its own, without a controlling terminal: nothing the
    // command starts can open `/dev/tty` of the terminal the services run
    // in, type into it (TIOCSTI) or be signalled from it.
    nix::unistd::setsid().map_err(|e| format!("setsid: {e}"))?;
    let mut read_write = spec.read_write.clone();
    if confinement == Confinement::InSession {
        crate::rootfs::proc_of_command(spec)?;
    }
    if spec.layers.namespaces {
        if confinement == Confinement::Build {
            crate::rootfs::enter(spec)?;
            let _ = nix::unistd::sethostname("agentry-sandbox");
        }
        // Private to the call in the built view.
        for private in ["/tmp", "/dev/shm"] {
            if !read_write.iter().any(|p| p == Path::new(private)) {
                read_write.push(PathBuf::from(private));
            }
        }
    }
    let ruleset = if spec.layers.landlock {
        let with_mounts = Spec {
            read_write,
            ..spec.clone()
        };
        Some(landlock_rules::build(&with_mounts)?)
    } else {
        None
    };
    set_limits(&spec.limits)?;
    if let Some(ids) = spec.user {
        let gid = nix::unistd::Gid::from_raw(ids.gid);
        let uid = nix::unistd::Uid::from_raw(ids.uid);
        nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
        nix::unistd::setresgid(gid, gid, gid).map_err(|e| format!("setresgid: {e}"))?;
        nix::unistd::setresuid(uid, uid, uid).map_err(|e| format!("setresuid: {e}"))?;
    }
    // After the identity switch, which clears it.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
    // No setuid program may regain privileges, whatever layers are on.
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    if let Some(ruleset) = ruleset {
        let status = ruleset
            .restrict_self()
            .map_err(|e| format!("landlock: {e}"))?;
        match (status.ruleset, status.landlock) {
            (landlock::RulesetStatus::NotEnforced, _) => {
                return Err("landlock: not enforced by this kernel".into());
            }
            (_, landlock::LandlockStatus::Available { effective_abi, .. }) => {
                if spec.report {
                    eprintln!(
                        "agentry-sandbox-report: landlock ABI {}",
                        effective_abi as i32
                    );
                }
            }
            (_, _) => return Err("landlock: not available".into()),
        }
    }
    if spec.layers.seccomp {
        // With the built view no host socket can be named, so Unix sockets
        // stay usable; without it, none can be made at all.
        syscalls::install(syscalls::Sockets {
            network: spec.proxy.is_some(),
            unix: spec.layers.namespaces,
        })?;
    }
    Ok(())
}

fn set_limits(limits: &crate::Limits) -> Result<(), String> {
    for (resource, value) in limits.rlimits() {
        nix::sys::resource::setrlimit(resource, value, value)
            .map_err(|e| format!("cannot limit {resource:?} to {value}: {e}"))?;
    }
    Ok(())
}

/// Exits the way the command did.
fn exit_like(status: WaitStatus) -> i32 {
    match status {
        WaitStatus::Exited(_, code) => code,
        WaitStatus::Signaled(_, signal, _) => {
            // Die of the same signal, so the runner sees what the command saw.
            let mut set = SigSet::empty();
            set.add(signal);
            let _ = restore_default(signal);
            let _ = set.thread_unblock();
            let _ = nix::sys::signal::raise(signal);
            128 + signal as i32
        }
        _ => SETUP_FAILED,
    }
}

/// Restores the default action of `signal` (the helper installs none, so
/// this only matters for signals inherited as ignored).
fn restore_default(signal: Signal) -> nix::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, sigaction};
    let action = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: installing SIG_DFL runs no code of ours in a signal context.
    #[allow(unsafe_code)]
    unsafe {
        sigaction(signal, &action).map(|_| ())
    }
}
