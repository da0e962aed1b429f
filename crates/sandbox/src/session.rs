//! A sandbox set up once per session: the namespaces and the built
//! file-system view are made when the session runs its first command, and
//! every later command of the session is forked from a small process that
//! already lives inside them, instead of paying for them again.
//!
//! The processes, all running the helper program:
//!
//! - the **session helper** (`agentry-sandbox --session`), the runner's
//!   child: it enters new user (when not root), pid, network, mount, IPC
//!   and UTS namespaces and forks the session's first process; when that
//!   process ends, or the helper is told to stop, every process of the
//!   session is killed;
//! - the **session's first process** (pid 1 of the session's pid
//!   namespace): it builds the view (`rootfs`) and then keeps one **spare
//!   supervisor** ready, forking a new one each time one takes a command;
//!   it ends when the runner closes the control socket (the runner dropped
//!   the session's sandbox, or died);
//! - a spare supervisor makes, before any command comes, the next
//!   command's mount and IPC namespaces (with a fresh `/tmp`, `/dev/shm`
//!   and HOME) and pid namespace, and forks the command's process into
//!   them, which confines itself completely (Landlock, limits, identity,
//!   seccomp) and waits. Then the supervisor takes one command from the
//!   control socket (three descriptors: the command's own socket, its
//!   stdout, its stderr), reads the [`CommandSpec`] from the command's
//!   socket, and hands the output descriptors and the spec to the waiting
//!   process, which execs the command. It supervises the command until it
//!   ends, writes how as a [`HelperReport`] line on the command's socket,
//!   and kills every process the command started when the runner closes
//!   its end (or half-closes it: a stop).
//!
//! What each command still gets of its own, as with a sandbox per command:
//! a pid namespace (it sees no other command of the session, nor the
//! session's processes), a mount namespace with a fresh `/tmp`,
//! `/dev/shm`, HOME and `/proc`, an IPC namespace, its own session without
//! a terminal, its own Landlock domain (so the signal and abstract-socket
//! scopes separate it from every other command), the seccomp filter, the
//! identity switch and the resource limits. What two commands of a session
//! share: the view of the file system (the same read-only system
//! directories and the same workspace and session temp dir, which they
//! share anyway) and a network namespace that holds nothing but a downed
//! loopback. Commands granted network do not come here: each gets a
//! sandbox of its own with its bridge to the proxy.

use crate::helper;
use crate::{HelperReport, SETUP_FAILED, Spec};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};
use nix::sys::wait::WaitStatus;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// The descriptor on which a session helper gets its control socket.
pub const CONTROL_FD: i32 = 4;

/// The largest command spec a supervisor reads (a long heredoc included).
const MAX_COMMAND_SPEC: u64 = 64 * 1024 * 1024;

/// What the session's first process writes on the control socket once the
/// view is built and it takes commands.
const READY: &[u8] = b"ready";

/// One command of a session: everything else (the view, the layers, the
/// identity, the network) is the session's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandSpec {
    /// The command and its arguments; `argv[0]` is looked up in PATH.
    pub argv: Vec<String>,
    /// The working directory, inside the session's view.
    pub cwd: PathBuf,
    /// The whole environment of the command.
    pub env: Vec<(String, String)>,
}

impl CommandSpec {
    /// The spec as the one line a supervisor reads.
    pub fn line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

/// The runner's end of a session's sandbox: where commands are sent.
/// Dropping it ends the session's sandbox (a command still running is
/// killed).
#[derive(Debug)]
pub struct SessionSandbox {
    control: OwnedFd,
}

/// How a session helper is started: the program to spawn, the runner's
/// end of its control socket, and its report descriptor.
#[derive(Debug)]
pub struct Starting {
    /// The session helper, ready to spawn (stdio is the caller's to set).
    pub command: std::process::Command,
    /// The control socket, usable once the helper said it is ready.
    pub sandbox: SessionSandbox,
    /// Why it could not be set up, when it exits with [`SETUP_FAILED`];
    /// call [`crate::Reports::started`] once the helper is spawned.
    pub reports: crate::Reports,
    /// The helper's end of the control socket: drop it once the helper is
    /// spawned, so that the socket closes with the helper.
    pub helper_end: OwnedFd,
}

/// The runner's end of one command sent to a session's sandbox.
#[derive(Debug)]
pub struct Launched {
    /// Where the spec is written (one line, then nothing: shutting down
    /// the writing half stops the command) and the [`HelperReport`]s are
    /// read; closing it stops the command too.
    pub socket: std::os::unix::net::UnixStream,
    /// The command's standard output.
    pub stdout: OwnedFd,
    /// The command's standard error.
    pub stderr: OwnedFd,
}

impl SessionSandbox {
    /// How to start the session helper for `spec` (its `argv`, `env`,
    /// `stdin` and `proxy` are not used: those are each command's, and
    /// commands of a session never get network; its limits apply to every
    /// command).
    pub fn starting(helper: &std::path::Path, spec: &Spec) -> std::io::Result<Starting> {
        use std::os::unix::process::CommandExt;
        let mut spec = spec.clone();
        spec.argv = vec!["true".into()];
        spec.env.clear();
        spec.report_fd = Some(crate::REPORT_FD);
        spec.proxy = None;
        spec.stdin = false;
        let text = serde_json::to_string(&spec).map_err(std::io::Error::other)?;
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let mut command = std::process::Command::new(helper);
        command
            .arg0(crate::HELPER_NAME)
            .arg("--session")
            .env_clear()
            .env(crate::SPEC_VARIABLE, text)
            .stdin(std::process::Stdio::null());
        let reports = crate::Reports::attach(&mut command)?;
        let theirs = crate::above_given(theirs)?;
        crate::give_fd_as(&mut command, theirs.as_raw_fd(), CONTROL_FD);
        Ok(Starting {
            command,
            sandbox: SessionSandbox { control: ours },
            reports,
            helper_end: theirs,
        })
    }

    /// Waits (blocking) up to `timeout` for the helper to say it takes
    /// commands: `Ok(true)` when it did, `Ok(false)` when the socket closed
    /// first (the helper failed: its reports say why), `Err(TimedOut)`.
    pub fn wait_ready(&self, timeout: std::time::Duration) -> std::io::Result<bool> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            let millis = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.control.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(millis)) {
                Err(nix::errno::Errno::EINTR) | Ok(0) => continue,
                Err(e) => return Err(e.into()),
                Ok(_) => {}
            }
            let mut buf = [0u8; 16];
            return match nix::sys::socket::recv(
                self.control.as_raw_fd(),
                &mut buf,
                MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(n) => Ok(n > 0 && &buf[..n] == READY),
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => continue,
                Err(e) => Err(e.into()),
            };
        }
    }

    /// Sends one command: a socket of its own and two pipes go to the
    /// session's spare supervisor, which takes it. The caller writes
    /// `command.line()` on [`Launched::socket`].
    pub fn launch(&self) -> std::io::Result<Launched> {
        let (socket, theirs) = std::os::unix::net::UnixStream::pair()?;
        let (stdout, stdout_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (stderr, stderr_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let fds = [
            theirs.as_raw_fd(),
            stdout_w.as_raw_fd(),
            stderr_w.as_raw_fd(),
        ];
        let rights = [ControlMessage::ScmRights(&fds)];
        sendmsg::<()>(
            self.control.as_raw_fd(),
            &[IoSlice::new(b"c")],
            &rights,
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
        Ok(Launched {
            socket,
            stdout,
            stderr,
        })
    }
}

/// The end of one command, as its supervisor reports it.
pub fn parse_report(line: &str) -> Option<HelperReport> {
    serde_json::from_str(line.trim()).ok()
}

/// The session helper: `agentry-sandbox --session` with the spec in its
/// environment and the control socket at [`CONTROL_FD`].
pub(crate) fn serve(spec: &Spec) -> Result<WaitStatus, String> {
    // SAFETY: CONTROL_FD is the control socket the runner gave this
    // process (checked to be open right here); it is owned from now on.
    #[allow(unsafe_code)]
    let control = unsafe {
        if libc::fcntl(CONTROL_FD, libc::F_SETFD, libc::FD_CLOEXEC) < 0 {
            return Err(format!(
                "the control descriptor {CONTROL_FD} is not open: {}",
                std::io::Error::last_os_error()
            ));
        }
        OwnedFd::from_raw_fd(CONTROL_FD)
    };
    if !spec.layers.namespaces {
        return Err("a session's sandbox needs the namespaces layer".into());
    }
    let waited = helper::block_waited_signals()?;
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| format!("cannot become a subreaper: {e}"))?;
    let root = nix::unistd::geteuid().is_root();
    if spec.user.is_some() && !root {
        return Err("a user to run as was given, but the helper is not root".into());
    }
    helper::enter_namespaces(root)?;
    // SAFETY: the helper is single-threaded, so the child may do anything
    // after fork; it never returns into the helper's code.
    #[allow(unsafe_code)]
    let first = match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let code = match first_process(spec, control) {
                Ok(()) => 0,
                Err(message) => {
                    helper::report(spec, &message);
                    SETUP_FAILED
                }
            };
            std::process::exit(code);
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => child,
        Err(e) => return Err(format!("cannot start the session's first process: {e}")),
    };
    drop(control);
    loop {
        let signal = waited.wait().map_err(|e| format!("sigwait: {e}"))?;
        if signal == Signal::SIGCHLD {
            if let Some(status) = helper::reap(first) {
                helper::kill_tree(first, true);
                return Ok(status);
            }
            continue;
        }
        let _ = nix::sys::signal::kill(first, Signal::SIGKILL);
        helper::kill_tree(first, true);
        return Ok(WaitStatus::Signaled(first, signal, false));
    }
}

/// The session's first process: builds the view, says it is ready, then
/// keeps one spare supervisor waiting for the next command (a new one as
/// soon as one takes a command), until the runner closes the control
/// socket.
fn first_process(spec: &Spec, control: OwnedFd) -> Result<(), String> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
    // Supervisors are reaped by the kernel; each restores the default.
    helper::ignore_children(true)?;
    SigSet::all()
        .thread_unblock()
        .map_err(|e| format!("cannot unblock signals: {e}"))?;
    crate::rootfs::enter(spec)?;
    let _ = nix::unistd::sethostname("agentry-sandbox");
    // A supervisor that took a command writes a byte here.
    let (taken, taken_by) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("cannot make a pipe: {e}"))?;
    fork_spare(spec, &control, &taken_by)?;
    nix::sys::socket::send(control.as_raw_fd(), READY, MsgFlags::MSG_NOSIGNAL)
        .map_err(|e| format!("cannot tell the runner the session is ready: {e}"))?;
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        // The control socket is polled for its end only: commands on it
        // are the spare's to take.
        let mut fds = [
            PollFd::new(control.as_fd(), PollFlags::empty()),
            PollFd::new(taken.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("poll: {e}")),
            Ok(_) => {}
        }
        if fds[0].any().unwrap_or(false) {
            // The runner closed its end: the session's sandbox ends (its
            // helper then kills whatever is left).
            return Ok(());
        }
        if fds[1].any().unwrap_or(false) {
            let mut bytes = [0u8; 64];
            let n = nix::unistd::read(&taken, &mut bytes).unwrap_or(0);
            for _ in 0..n {
                fork_spare(spec, &control, &taken_by)?;
            }
        }
    }
}

/// Forks a spare supervisor (see [`spare`]).
fn fork_spare(spec: &Spec, control: &OwnedFd, taken_by: &OwnedFd) -> Result<(), String> {
    // SAFETY: this process is single-threaded, so the child may do
    // anything after fork; it never returns into the caller.
    #[allow(unsafe_code)]
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => std::process::exit(spare(spec, control, taken_by)),
        Ok(nix::unistd::ForkResult::Parent { .. }) => Ok(()),
        Err(e) => Err(format!("cannot fork a supervisor: {e}")),
    }
}

/// A spare supervisor: it makes the next command's namespaces (mount and
/// IPC, with a fresh `/tmp`, `/dev/shm` and HOME; pid) and its process,
/// confined and waiting, before any command comes; then it takes one
/// command from the control socket, tells the first process (which forks
/// the next spare), hands the command to its waiting process, and
/// supervises it. Returns its exit code.
fn spare(spec: &Spec, control: &OwnedFd, taken_by: &OwnedFd) -> i32 {
    let ready = prepare(spec);
    let Some([socket, stdout, stderr]) = take_command(control) else {
        // The runner closed the control socket: the session ends.
        return 0;
    };
    let _ = nix::unistd::write(taken_by, b"t");
    let report =
        ready.and_then(|(waiting, link)| run_command(&socket, waiting, &link, stdout, stderr));
    match report {
        Ok(report) => {
            write_report(&socket, &report);
            0
        }
        Err(message) => {
            write_report(&socket, &HelperReport::SetupFailed(message));
            SETUP_FAILED
        }
    }
}

/// Receives one command's descriptors from the control socket: its
/// socket, stdout and stderr. `None` once the socket is closed.
fn take_command(control: &OwnedFd) -> Option<[OwnedFd; 3]> {
    loop {
        let (bytes, fds) = receive_fds::<3>(control)?;
        if bytes == 0 && fds.is_empty() {
            return None;
        }
        if let Ok(fds) = <[OwnedFd; 3]>::try_from(fds) {
            return Some(fds);
        }
    }
}

/// One message of a Unix socket with up to `N` descriptors: how many
/// bytes it held, and the descriptors (owned, close-on-exec). `None` when
/// the socket failed.
fn receive_fds<const N: usize>(socket: &OwnedFd) -> Option<(usize, Vec<OwnedFd>)> {
    loop {
        let mut byte = [0u8; 1];
        let mut space = nix::cmsg_space!([RawFd; N]);
        let mut iov = [IoSliceMut::new(&mut byte)];
        let (bytes, raw) = match recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
            Ok(msg) => {
                let mut fds = Vec::new();
                for cmsg in msg.cmsgs().into_iter().flatten() {
                    if let ControlMessageOwned::ScmRights(raw) = cmsg {
                        fds.extend(raw);
                    }
                }
                (msg.bytes, fds)
            }
        };
        // SAFETY: the descriptors were just received with SCM_RIGHTS: this
        // process owns them and nothing else refers to them.
        #[allow(unsafe_code)]
        let fds = raw
            .into_iter()
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        return Some((bytes, fds));
    }
}

/// The next command's namespaces and its process, confined and waiting
/// for the command on the returned link.
fn prepare(session: &Spec) -> Result<(nix::unistd::Pid, OwnedFd), String> {
    helper::ignore_children(false)?;
    let _ = helper::block_waited_signals()?;
    let mut spec = session.clone();
    spec.read_write.extend(session.home.iter().cloned());
    crate::rootfs::refresh(&spec)?;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID)
        .map_err(|e| format!("namespaces: cannot make the command's pid namespace: {e}"))?;
    let (link, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| format!("cannot make the command's link: {e}"))?;
    // Opened before the command is confined.
    let null =
        std::fs::File::open("/dev/null").map_err(|e| format!("cannot open /dev/null: {e}"))?;
    spec.report_fd = Some(theirs.as_raw_fd());
    // SAFETY: this process is single-threaded, so the child may do
    // anything after fork; it never returns into the caller.
    #[allow(unsafe_code)]
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(link);
            let code = match helper::confine(&spec, helper::Confinement::InSession) {
                Ok(()) => wait_and_exec(&theirs, null),
                Err(message) => {
                    helper::report(&spec, &message);
                    SETUP_FAILED
                }
            };
            std::process::exit(code);
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => Ok((child, link)),
        Err(e) => Err(format!("cannot start the command's process: {e}")),
    }
}

/// In the command's confined process: waits for the command on `link`
/// (its stdout and stderr, then its spec), then execs it. Returns an exit
/// code only when it cannot.
fn wait_and_exec(link: &OwnedFd, null: std::fs::File) -> i32 {
    let Some((stdout, stderr)) = receive_output(link) else {
        return 0;
    };
    let command = match read_command(link) {
        Ok(command) => command,
        Err(why) => {
            let _ = nix::unistd::write(&stderr, format!("agentry-sandbox: {why}\n").as_bytes());
            return SETUP_FAILED;
        }
    };
    let _ = nix::unistd::dup2_stdin(&null);
    let _ = nix::unistd::dup2_stdout(&stdout);
    let _ = nix::unistd::dup2_stderr(&stderr);
    drop((stdout, stderr, null));
    let fail = |what: String| {
        eprintln!("agentry-sandbox: {what}");
        127
    };
    if let Err(e) = std::env::set_current_dir(&command.cwd) {
        return fail(format!("cannot enter {}: {e}", command.cwd.display()));
    }
    let path = command
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or(crate::DEFAULT_PATH, |(_, v)| v.as_str());
    let Some(program) = find_program(&command.argv[0], path) else {
        return fail(format!("{}: command not found", command.argv[0]));
    };
    let cstring = |s: &str| std::ffi::CString::new(s).map_err(|e| e.to_string());
    let argv: Result<Vec<_>, _> = command.argv.iter().map(|a| cstring(a)).collect();
    let env: Result<Vec<_>, _> = command
        .env
        .iter()
        .map(|(k, v)| cstring(&format!("{k}={v}")))
        .collect();
    let (Ok(argv), Ok(env), Ok(program)) = (argv, env, cstring(&program.to_string_lossy())) else {
        return fail("the command holds a NUL byte".into());
    };
    let e = nix::unistd::execve(&program, &argv, &env).err();
    fail(format!("cannot run {}: {e:?}", command.argv[0]))
}

/// The stdout and stderr of the command, sent by its supervisor; `None`
/// when the supervisor went away first.
fn receive_output(link: &OwnedFd) -> Option<(OwnedFd, OwnedFd)> {
    let (_, fds) = receive_fds::<2>(link)?;
    let mut fds = fds.into_iter();
    Some((fds.next()?, fds.next()?))
}

/// `name` found in `path` the way a shell looks it up.
fn find_program(name: &str, path: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    path.split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| std::path::Path::new(dir).join(name))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

fn write_report(socket: &OwnedFd, report: &HelperReport) {
    let mut line = serde_json::to_vec(report).unwrap_or_default();
    line.push(b'\n');
    let _ = nix::sys::socket::send(socket.as_raw_fd(), &line, MsgFlags::MSG_NOSIGNAL);
}

/// Hands the command to its waiting process and supervises it until it
/// ends or the runner stops it.
fn run_command(
    socket: &OwnedFd,
    main: nix::unistd::Pid,
    link: &OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
) -> Result<HelperReport, String> {
    let waited = helper::block_waited_signals()?;
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| format!("cannot become a subreaper: {e}"))?;
    let command = read_command(socket)?;
    if command.argv.is_empty() {
        return Err("the command spec names no command".into());
    }
    let fds = [stdout.as_raw_fd(), stderr.as_raw_fd()];
    let rights = [ControlMessage::ScmRights(&fds)];
    let handed = sendmsg::<()>(
        link.as_raw_fd(),
        &[IoSlice::new(b"c")],
        &rights,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .and_then(|_| write_all(link, &command.line()));
    drop((stdout, stderr));
    if let Err(e) = handed {
        // The waiting process is gone: it could not be confined.
        let _ = nix::sys::signal::kill(main, Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(main, None);
        return Err(
            setup_failure(link).unwrap_or_else(|| format!("the command's process is gone ({e})"))
        );
    }
    let signals = nix::sys::signalfd::SignalFd::with_flags(
        &waited,
        nix::sys::signalfd::SfdFlags::SFD_CLOEXEC | nix::sys::signalfd::SfdFlags::SFD_NONBLOCK,
    )
    .map_err(|e| format!("signalfd: {e}"))?;
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        let mut fds = [
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
            PollFd::new(socket.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("poll: {e}")),
            Ok(_) => {}
        }
        let stop = fds[1].any().unwrap_or(false);
        while let Ok(Some(info)) = signals.read_signal() {
            if info.ssi_signo == Signal::SIGCHLD as u32 {
                // Process 1 of its pid namespace: when it has ended, every
                // other process of the namespace has too.
                if let Some(status) = helper::reap(main) {
                    if matches!(status, WaitStatus::Exited(_, SETUP_FAILED))
                        && let Some(why) = setup_failure(link)
                    {
                        return Ok(HelperReport::SetupFailed(why));
                    }
                    return Ok(ended(status));
                }
            } else {
                return Ok(stopped(main));
            }
        }
        if stop {
            // The runner closed or half-closed its end (nothing else is
            // ever written after the spec): stop the command.
            return Ok(stopped(main));
        }
    }
}

/// Why the command's process could not be confined, if it said so.
fn setup_failure(link: &OwnedFd) -> Option<String> {
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = nix::sys::socket::recv(link.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
        if n == 0 || text.len() > 64 * 1024 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|line| match parse_report(line) {
            Some(HelperReport::SetupFailed(why)) => Some(why),
            _ => None,
        })
}

fn write_all(fd: &OwnedFd, mut bytes: &[u8]) -> nix::Result<()> {
    while !bytes.is_empty() {
        match nix::sys::socket::send(fd.as_raw_fd(), bytes, MsgFlags::MSG_NOSIGNAL) {
            Ok(n) => bytes = &bytes[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Kills the command, process 1 of its pid namespace, and with it every
/// process of the namespace; returns once they are all gone. (The
/// supervisor's `/proc` shows the command's namespace, not its own, so it
/// waits for the command rather than list processes.)
fn stopped(main: nix::unistd::Pid) -> HelperReport {
    let _ = nix::sys::signal::kill(main, Signal::SIGKILL);
    while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(main, None) {}
    HelperReport::Signaled(Signal::SIGKILL as i32)
}

fn ended(status: WaitStatus) -> HelperReport {
    match status {
        WaitStatus::Exited(_, code) => HelperReport::Exited(code),
        WaitStatus::Signaled(_, signal, _) => HelperReport::Signaled(signal as i32),
        other => HelperReport::SetupFailed(format!("the command ended oddly: {other:?}")),
    }
}

/// Reads the command's spec: one line.
fn read_command(socket: &OwnedFd) -> Result<CommandSpec, String> {
    let dup = socket
        .try_clone()
        .map_err(|e| format!("cannot read the command: {e}"))?;
    let mut reader = std::io::BufReader::new(std::fs::File::from(dup).take(MAX_COMMAND_SPEC));
    let mut line = Vec::new();
    reader
        .read_until(b'\n', &mut line)
        .map_err(|e| format!("cannot read the command: {e}"))?;
    if line.last() != Some(&b'\n') {
        return Err("the command spec was cut short".into());
    }
    serde_json::from_slice(&line).map_err(|e| format!("the command spec is not valid: {e}"))
}
