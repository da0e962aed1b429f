//! The tools: their descriptions for the model and their execution.

use crate::output::CappedOutput;
use crate::sandbox::Sandbox;
use crate::workspace::Workspace;
use crate::{Limits, ToolError};
use agentry_proto::sessions::v1::OutputStream;
pub use agentry_tool::{Registry, Running, Source, Target, Tool, ToolOutcome, ToolSpec};
use serde::Deserialize;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

/// Live output of a running call.
pub type OutputSink = mpsc::Sender<(OutputStream, String)>;

/// What the runner gives one call: the session's workspace, the caller's
/// deadline, the network pass when the call was given network, and where
/// its live output goes.
pub struct Call {
    /// The session's workspace (or project directory).
    pub workspace: Workspace,
    /// The caller's deadline, if it set one.
    pub timeout: Option<Duration>,
    /// Network access for this call (tools whose spec says `network`).
    pub network: Option<crate::egress::Pass>,
    /// Live output.
    pub sink: OutputSink,
    /// For an MCP call that asked for input: going on with the answers.
    pub resume: Option<agentry_proto::sessions::v1::McpResume>,
    /// Set by an MCP call whose server waits for a person's answers (the
    /// call is then not over; its outcome says so for the logs only).
    pub asked: Arc<std::sync::Mutex<Option<agentry_proto::sessions::v1::McpInputRequested>>>,
    /// Secrets a bash command gets in its environment (its rule matched).
    pub secret_env: Vec<(String, String)>,
}

impl Call {
    /// A call in `workspace` with no deadline or network, whose live
    /// output nobody reads.
    pub fn in_workspace(workspace: &Workspace) -> Call {
        let (sink, _) = mpsc::channel(1);
        Call {
            workspace: workspace.clone(),
            timeout: None,
            network: None,
            sink,
            resume: None,
            asked: Arc::default(),
            secret_env: Vec::new(),
        }
    }
}

impl agentry_tool::Context for Call {
    type Output = Result<ToolOutcome, ToolError>;
}

/// The runner's tools: bash, the file tools and (when set up) the web
/// tools, sorted by name; then the MCP servers' tools, as a toolbox.
pub fn registry(
    limits: &Limits,
    sandbox: &Sandbox,
    web: Option<&Arc<crate::web::Web>>,
    mcp: Option<&crate::mcp::Mcp>,
) -> Registry<Call> {
    let mut registry = Registry::new();
    let mut own: Vec<Arc<dyn Tool<Call>>> = vec![Arc::new(Bash {
        spec: bash_spec(),
        limits: limits.clone(),
        sandbox: sandbox.clone(),
    })];
    own.extend(crate::files::tools(limits, sandbox));
    if let Some(web) = web {
        own.extend(crate::web::tools::<Call>(web));
    }
    // Offered sorted by name, MCP servers' tools after.
    own.sort_by(|a, b| a.spec().name.cmp(&b.spec().name));
    for tool in own {
        // The names above are distinct constants.
        if let Err(taken) = registry.register(tool) {
            tracing::error!(error = %taken, "a tool is left out");
        }
    }
    if let Some(mcp) = mcp {
        registry.add_toolbox(Arc::new(crate::mcp_host::Toolbox::new(
            mcp.clone(),
            limits.max_output_bytes,
        )));
    }
    registry
}

/// Runs one call of `registry`'s tool `name`.
pub async fn run(
    registry: &Registry<Call>,
    name: &str,
    arguments: &str,
    call: &Call,
) -> Result<ToolOutcome, ToolError> {
    let tool = registry.get(name);
    start(registry, tool.as_deref(), name, arguments, call).await
}

/// A call of `tool` (found in `registry` under `name`) as a future: its
/// run, or why it cannot run (no such tool; network for a tool that takes
/// none).
pub fn start<'a>(
    registry: &Registry<Call>,
    tool: Option<&'a dyn Tool<Call>>,
    name: &str,
    arguments: &'a str,
    call: &'a Call,
) -> Running<'a, Result<ToolOutcome, ToolError>> {
    let refused = match tool {
        None => registry.unknown(name),
        Some(tool) if call.network.is_some() && !tool.spec().network => ToolError::InvalidRequest(
            format!("network is given to bash calls only, not to {name}"),
        ),
        Some(tool) => return tool.run(call, arguments),
    };
    Box::pin(async move { Err(refused) })
}

fn bash_spec() -> ToolSpec {
    ToolSpec::changing(
        "bash",
        "Run a bash command in the session's workspace directory and return its \
            combined stdout and stderr. Standard input is closed. The command is killed \
            (with every process it started) when it exceeds its timeout.",
        serde_json::json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The bash command line to run."},
                "timeout_secs": {"type": "integer", "minimum": 1, "description": "Optional timeout in seconds."}
            },
            "required": ["command"],
            "additionalProperties": false
        }),
    )
    .with_network()
    .growing_workspace()
}

/// The shell: `bash -c` in the workspace, confined by the sandbox.
struct Bash {
    spec: ToolSpec,
    limits: Limits,
    sandbox: Sandbox,
}

impl Tool<Call> for Bash {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run<'a>(
        &'a self,
        call: &'a Call,
        arguments: &'a str,
    ) -> Running<'a, Result<ToolOutcome, ToolError>> {
        Box::pin(async move {
            let args: BashArgs = agentry_tool::arguments(&self.spec.name, arguments)?;
            if args.timeout_secs == Some(0) {
                return Err(ToolError::InvalidArguments(
                    "timeout_secs must be at least 1".into(),
                ));
            }
            let timeout = args
                .timeout_secs
                .map(Duration::from_secs)
                .or(call.timeout)
                .unwrap_or(self.limits.default_timeout)
                .min(self.limits.max_timeout);
            bash(&args.command, call, timeout, &self.limits, &self.sandbox).await
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BashArgs {
    command: String,
    #[serde(default)]
    timeout_secs: Option<u64>,
}

/// How long the output readers may drain after the process group is gone.
const PIPE_DRAIN: Duration = Duration::from_millis(500);

/// How long the sandbox helper gets to kill the command's processes after
/// SIGTERM before its whole process group is killed.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Ends a call's processes, also when the call is dropped (cancelled).
///
/// With the sandbox helper, SIGTERM asks the helper to kill every process
/// the command started (it can find those that left the process group);
/// SIGKILL of the group follows only if it does not exit in time. Without
/// it, the process group is killed at once.
pub(crate) struct CallGuard {
    pub(crate) child: Option<tokio::process::Child>,
    pub(crate) group: Option<nix::unistd::Pid>,
    pub(crate) helper: bool,
}

impl CallGuard {
    fn signal_start(&self) {
        use nix::sys::signal::{Signal, kill, killpg};
        let Some(pgid) = self.group else { return };
        // ESRCH (already gone) is the normal case after a clean exit.
        if self.helper {
            let _ = kill(pgid, Signal::SIGTERM);
        } else {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }

    /// Stops everything and waits for the helper (bounded).
    pub(crate) async fn stop(&mut self) {
        self.signal_start();
        if let Some(mut child) = self.child.take()
            && tokio::time::timeout(STOP_GRACE, child.wait())
                .await
                .is_err()
        {
            let _ = child.start_kill();
        }
        if let Some(pgid) = self.group.take() {
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if self.group.is_none() {
            return;
        }
        self.signal_start();
        let (child, group) = (self.child.take(), self.group.take());
        let finish = async move {
            if let Some(mut child) = child
                && tokio::time::timeout(STOP_GRACE, child.wait())
                    .await
                    .is_err()
            {
                let _ = child.start_kill();
            }
            if let Some(pgid) = group {
                let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(finish);
            }
            Err(_) => {
                if let Some(pgid) = group {
                    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
    }
}

async fn pump(
    mut reader: impl AsyncRead + Unpin,
    stream: OutputStream,
    sink: OutputSink,
    merged: mpsc::UnboundedSender<Vec<u8>>,
) {
    let mut buf = vec![0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let bytes = buf[..n].to_vec();
                // The sink may be gone (nobody listening to live output).
                let _ = sink
                    .send((stream, String::from_utf8_lossy(&bytes).into_owned()))
                    .await;
                let _ = merged.send(bytes);
            }
        }
    }
}

/// Where and how a sandboxed `bash -c` starts.
pub(crate) struct Launch {
    /// Its working directory.
    pub cwd: std::path::PathBuf,
    /// What it may write.
    pub read_write: Vec<std::path::PathBuf>,
    /// Variables set over the session's environment.
    pub env: Vec<(String, String)>,
    /// It reads the caller's standard input (otherwise it is closed).
    pub stdin: bool,
}

/// `bash -c command` for the session: through the sandbox helper when there
/// is one (the session's identity, confinement and limits), else directly
/// with the session's identity, environment and limits. Its process group
/// is its own; stdio is the caller's to set.
pub(crate) fn sandboxed_bash(
    sandbox: &Sandbox,
    command: &str,
    workspace: &Workspace,
    launch: &Launch,
    network: Option<&crate::egress::Pass>,
) -> Result<(tokio::process::Command, Option<agentry_sandbox::Reports>), ToolError> {
    let mut cmd = match &sandbox.helper {
        Some(helper) => {
            let argv = vec!["bash".to_string(), "-c".to_string(), command.to_string()];
            let mut spec = sandbox.spec(
                workspace.who(),
                argv,
                workspace.root(),
                workspace.tmp(),
                network,
            );
            spec.cwd = launch.cwd.clone();
            spec.read_write = launch.read_write.clone();
            for (k, v) in &launch.env {
                spec.env.retain(|(name, _)| name != k);
                spec.env.push((k.clone(), v.clone()));
            }
            spec.stdin = launch.stdin;
            let spec = serde_json::to_string(&spec)
                .map_err(|e| ToolError::Io(format!("cannot describe the sandbox: {e}")))?;
            let mut cmd = tokio::process::Command::new(helper);
            // The name under which `agentry` itself acts as the helper. The
            // spec (it may hold the proxy's credential) goes in the
            // helper's environment, never on its command line.
            cmd.arg0(agentry_sandbox::HELPER_NAME)
                .arg("--spec-env")
                .env_clear()
                .env(agentry_sandbox::SPEC_VARIABLE, spec);
            cmd
        }
        None => {
            // No OS sandbox: bash runs the command with the session's
            // identity, environment and limits (set just before exec).
            let mut cmd = tokio::process::Command::new("bash");
            cmd.arg("-c")
                .arg(command)
                .env_clear()
                .envs(sandbox.environment(workspace.who(), workspace.tmp()))
                .envs(
                    network
                        .map(crate::egress::Pass::environment)
                        .unwrap_or_default(),
                )
                .envs(launch.env.iter().cloned());
            if let Some(ids) = sandbox.ids_of(workspace.who()) {
                cmd.uid(ids.uid).gid(ids.gid);
            }
            sandbox.limits.apply_before_exec(cmd.as_std_mut());
            cmd
        }
    };
    // A session of its own: no controlling terminal, and a process group
    // whose id is the process's.
    agentry_sandbox::new_session_before_exec(cmd.as_std_mut());
    cmd.current_dir(&launch.cwd);
    // The helper says why it could not set the sandbox up on a descriptor
    // of its own, never in the command's output.
    let reports = match &sandbox.helper {
        Some(_) => Some(
            agentry_sandbox::Reports::attach(cmd.as_std_mut()).map_err(|e| {
                ToolError::Io(format!("cannot make the sandbox's report pipe: {e}"))
            })?,
        ),
        None => None,
    };
    Ok((cmd, reports))
}

/// A fresh empty directory for one command (its HOME, a hook's working
/// directory), beside the session's temp dir (reachable in the sandbox once
/// listed as writable), handed to the session's user and removed with the
/// returned guard: nothing the session wrote before (a `.gitconfig`, a
/// `.bashrc`, a `json.py`) is found in it. `what` names it in errors.
pub(crate) fn fresh_dir(
    sandbox: &Sandbox,
    workspace: &Workspace,
    prefix: &str,
    what: &str,
) -> Result<tempfile::TempDir, ToolError> {
    let parent = workspace.tmp().parent().unwrap_or(workspace.tmp());
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(parent)
        .map_err(|e| ToolError::Io(format!("cannot make {what}: {e}")))?;
    sandbox
        .hand_over(workspace.who(), dir.path())
        .map_err(|e| ToolError::Io(format!("cannot prepare {what}: {e}")))?;
    Ok(dir)
}

/// A started bash command: its output, and how to wait for it and stop it.
struct Started {
    stdout: Box<dyn AsyncRead + Unpin + Send>,
    stderr: Box<dyn AsyncRead + Unpin + Send>,
    process: Process,
    /// The process beneath which all the command's processes are, for the
    /// memory watch, and whether it is a sandbox helper (stopped with
    /// SIGTERM).
    root: Option<(i32, bool)>,
    /// The per-call HOME on disk (without a session's sandbox), removed
    /// with the call.
    _home: Option<tempfile::TempDir>,
}

/// How a started command is waited for and stopped.
enum Process {
    /// A process of the runner's: the helper, or bash without a sandbox.
    Child {
        guard: CallGuard,
        reports: Option<agentry_sandbox::Reports>,
    },
    /// A command in its session's sandbox.
    Session(SessionCall),
}

impl Process {
    /// How the command ended; `None` once it was stopped.
    async fn wait(&mut self) -> Option<std::io::Result<std::process::ExitStatus>> {
        match self {
            Process::Child { guard, .. } => match guard.child.as_mut() {
                Some(child) => Some(child.wait().await),
                None => None,
            },
            Process::Session(call) => Some(call.wait().await),
        }
    }

    /// Ends everything the command started and waits for that (bounded).
    async fn stop(&mut self) {
        match self {
            Process::Child { guard, .. } => guard.stop().await,
            Process::Session(call) => call.stop().await,
        }
    }

    /// Why the sandbox could not start the command, if that is how it
    /// ended.
    fn setup_failure(&self) -> Option<String> {
        match self {
            Process::Child { reports, .. } => reports.as_ref().and_then(|r| r.setup_failure()),
            Process::Session(call) => call.failure.clone(),
        }
    }
}

/// A command sent to its session's sandbox: the socket its supervisor
/// reports on. Dropping it (a cancelled call) stops the command.
struct SessionCall {
    reader: tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: Option<tokio::net::unix::OwnedWriteHalf>,
    /// A report line being read (kept across cancelled reads).
    line: Vec<u8>,
    /// How the command ended, once told.
    ended: Option<std::process::ExitStatus>,
    failure: Option<String>,
    /// The session's sandbox, held while the command runs.
    _lease: crate::session_sandbox::Lease,
}

impl SessionCall {
    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        use tokio::io::AsyncBufReadExt;
        if let Some(status) = self.ended {
            return Ok(status);
        }
        loop {
            // A read cancelled half-way (the caller's select took another
            // branch) left its bytes in `line`; this one goes on from them.
            let n = self.reader.read_until(b'\n', &mut self.line).await?;
            let line = std::mem::take(&mut self.line);
            let status = if n == 0 {
                // The supervisor is gone without a word: the session's
                // sandbox was ended (its memory cap, the runner dropping
                // it), which killed the command.
                ExitStatusExt::from_raw(nix::sys::signal::Signal::SIGKILL as i32)
            } else {
                match agentry_sandbox::session::parse_report(&String::from_utf8_lossy(&line)) {
                    Some(agentry_sandbox::HelperReport::Exited(code)) => {
                        ExitStatusExt::from_raw((code & 0xff) << 8)
                    }
                    Some(agentry_sandbox::HelperReport::Signaled(signal)) => {
                        ExitStatusExt::from_raw(signal & 0x7f)
                    }
                    Some(agentry_sandbox::HelperReport::SetupFailed(why)) => {
                        self.failure.get_or_insert(why);
                        ExitStatusExt::from_raw(agentry_sandbox::SETUP_FAILED << 8)
                    }
                    None => continue,
                }
            };
            self.ended = Some(status);
            return Ok(status);
        }
    }

    async fn stop(&mut self) {
        use tokio::io::AsyncWriteExt;
        if let Some(mut writer) = self.writer.take() {
            // Half-closing is the stop: the supervisor kills the command's
            // processes, reports, and closes.
            let _ = writer.shutdown().await;
        }
        if self.ended.is_none() {
            let _ = tokio::time::timeout(STOP_GRACE, self.wait()).await;
        }
    }
}

/// Starts `command` in the session's sandbox; `Ok(None)` when the session
/// has none to use (the caller starts a sandbox for the call alone).
async fn start_in_session(
    command: &str,
    call: &Call,
    sandbox: &Sandbox,
) -> Result<Option<Started>, ToolError> {
    use tokio::io::AsyncWriteExt;
    let workspace = &call.workspace;
    if !sandbox.in_session_sandbox(call.network.is_some()) {
        return Ok(None);
    }
    let sessions = sandbox.sessions.clone();
    let mut fresh = false;
    loop {
        let lease = sessions.lease(sandbox, workspace, fresh).await?;
        let mut launched = lease.launch();
        // Many commands at once can fill the control socket for a moment.
        for _ in 0..1000 {
            match &launched {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    launched = lease.launch();
                }
                _ => break,
            }
        }
        let launched = match launched {
            Ok(launched) => launched,
            // The session's sandbox is gone (killed over its memory cap,
            // or it died): a new one, once.
            Err(e) if !fresh => {
                tracing::debug!(session_id = %workspace.session_id(), "a session's sandbox is gone ({e}); starting another");
                fresh = true;
                continue;
            }
            Err(e) => {
                return Err(ToolError::Io(format!(
                    "cannot send the command to the session's sandbox: {e}"
                )));
            }
        };
        let mut env = sandbox.environment(workspace.who(), workspace.tmp());
        for (k, v) in std::iter::once(("HOME".to_string(), lease.home().display().to_string()))
            .chain(call.secret_env.iter().cloned())
        {
            env.retain(|(name, _)| *name != k);
            env.push((k, v));
        }
        let spec = agentry_sandbox::CommandSpec {
            argv: vec!["bash".into(), "-c".into(), command.to_string()],
            cwd: workspace.root().to_path_buf(),
            env,
        };
        let io = |what: &str, e: std::io::Error| {
            ToolError::Io(format!(
                "cannot start the command in the session's sandbox: {what}: {e}"
            ))
        };
        launched
            .socket
            .set_nonblocking(true)
            .map_err(|e| io("socket", e))?;
        let socket =
            tokio::net::UnixStream::from_std(launched.socket).map_err(|e| io("socket", e))?;
        let (reader, mut writer) = socket.into_split();
        let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(launched.stdout)
            .map_err(|e| io("stdout", e))?;
        let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(launched.stderr)
            .map_err(|e| io("stderr", e))?;
        writer
            .write_all(&spec.line())
            .await
            .map_err(|e| io("sending the spec", e))?;
        let root = Some((lease.helper_pid(), true));
        return Ok(Some(Started {
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            process: Process::Session(SessionCall {
                reader: tokio::io::BufReader::new(reader),
                writer: Some(writer),
                line: Vec::new(),
                ended: None,
                failure: None,
                _lease: lease,
            }),
            root,
            _home: None,
        }));
    }
}

/// Starts `command` in a sandbox of its own (the helper), or without the
/// OS sandbox.
fn start_alone(command: &str, call: &Call, sandbox: &Sandbox) -> Result<Started, ToolError> {
    let workspace = &call.workspace;
    let home = fresh_dir(sandbox, workspace, ".home-", "the command's HOME")?;
    let launch = Launch {
        cwd: workspace.root().to_path_buf(),
        read_write: vec![
            workspace.root().to_path_buf(),
            workspace.tmp().to_path_buf(),
            home.path().to_path_buf(),
        ],
        env: std::iter::once(("HOME".to_string(), home.path().display().to_string()))
            .chain(call.secret_env.iter().cloned())
            .collect(),
        stdin: false,
    };
    let (mut cmd, mut reports) =
        sandboxed_bash(sandbox, command, workspace, &launch, call.network.as_ref())?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| ToolError::Io(format!("cannot start bash: {e}")))?;
    if let Some(reports) = &mut reports {
        reports.started();
    }
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(nix::unistd::Pid::from_raw);
    let missing = || ToolError::Io("bash started without its output pipes".into());
    let stdout = child.stdout.take().ok_or_else(missing)?;
    let stderr = child.stderr.take().ok_or_else(missing)?;
    let helper = sandbox.helper.is_some();
    Ok(Started {
        stdout: Box::new(stdout),
        stderr: Box::new(stderr),
        process: Process::Child {
            guard: CallGuard {
                child: Some(child),
                group,
                helper,
            },
            reports,
        },
        root: group.map(|pid| (pid.as_raw(), helper)),
        _home: Some(home),
    })
}

async fn bash(
    command: &str,
    call: &Call,
    timeout: Duration,
    limits: &Limits,
    sandbox: &Sandbox,
) -> Result<ToolOutcome, ToolError> {
    let workspace = &call.workspace;
    let sink = call.sink.clone();
    if command.trim().is_empty() {
        return Err(ToolError::InvalidArguments(
            "command must not be empty".into(),
        ));
    }
    let session = workspace.session_id();
    let started = match start_in_session(command, call, sandbox).await? {
        Some(started) => started,
        None => start_alone(command, call, sandbox)?,
    };
    let Started {
        stdout,
        stderr,
        mut process,
        root,
        _home,
    } = started;
    let (merged_tx, mut merged_rx) = mpsc::unbounded_channel();
    let pumps = vec![
        tokio::spawn(pump(
            stdout,
            OutputStream::Stdout,
            sink.clone(),
            merged_tx.clone(),
        )),
        tokio::spawn(pump(stderr, OutputStream::Stderr, sink, merged_tx.clone())),
    ];
    drop(merged_tx);
    let watched = root.map(|(pid, helper)| sandbox.memory.watch(session, pid, helper));
    let mut output = CappedOutput::new(limits.max_output_bytes);
    let mut escaped = false;
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let waited = loop {
        tokio::select! {
            Some(bytes) = merged_rx.recv() => output.push(&bytes),
            status = process.wait() => match status {
                Some(status) => break Some(status),
                None => break None,
            },
            () = &mut deadline => break None,
        }
    };
    // Whatever happened, nothing the command started may outlive the call;
    // this also closes pipes that background processes still hold.
    process.stop().await;
    // A process that left the group may still hold the pipes open: give the
    // readers a moment to drain, then stop reading rather than wait for it.
    for mut p in pumps {
        if tokio::time::timeout(PIPE_DRAIN, &mut p).await.is_err() {
            p.abort();
            escaped = true;
        }
    }
    while let Ok(bytes) = merged_rx.try_recv() {
        output.push(&bytes);
    }
    let (mut text, truncated) = output.finish();
    if escaped {
        tracing::warn!(
            "a process started by a bash call left its process group and kept its output open"
        );
        text.push_str(
            "\n[a background process left the command's process group and kept its output open; \
             output after this point was not collected]",
        );
    }
    if let Some(watched) = watched.filter(|w| w.stopped()) {
        text.push('\n');
        text.push_str(&watched.note());
        return Ok(ToolOutcome {
            output: text,
            is_error: true,
            exit_code: None,
            truncated,
            timed_out: false,
        });
    }
    bash_outcome(waited, text, truncated, || process.setup_failure(), timeout)
}

/// What a finished (or stopped) bash command gives the model: its output
/// and exit code, the sandbox's reason when it could not start, or the
/// timeout.
fn bash_outcome(
    waited: Option<std::io::Result<std::process::ExitStatus>>,
    mut text: String,
    truncated: bool,
    setup_failure: impl FnOnce() -> Option<String>,
    timeout: Duration,
) -> Result<ToolOutcome, ToolError> {
    match waited {
        Some(Ok(status)) => {
            let code = status.code();
            if code == Some(agentry_sandbox::SETUP_FAILED)
                && let Some(why) = setup_failure()
            {
                return Err(ToolError::Io(format!(
                    "the sandbox could not start the command: {why}"
                )));
            }
            if text.is_empty() {
                text.push_str("(no output)");
            }
            let is_error = !status.success();
            if is_error {
                match code {
                    Some(c) => text.push_str(&format!("\n[exit code: {c}]")),
                    None => text.push_str("\n[killed by a signal]"),
                }
            }
            Ok(ToolOutcome {
                output: text,
                is_error,
                exit_code: code,
                truncated,
                timed_out: false,
            })
        }
        Some(Err(e)) => Err(ToolError::Io(format!("waiting for bash failed: {e}"))),
        None => {
            text.push_str(&format!(
                "\n[timed out after {}s; the command and its processes were killed]",
                timeout.as_secs_f64()
            ));
            Ok(ToolOutcome {
                output: text,
                is_error: true,
                exit_code: None,
                truncated,
                timed_out: true,
            })
        }
    }
}
