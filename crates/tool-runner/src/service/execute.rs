//! What a tool call needs around it: live output capped for the
//! subscribers, the workspace's disk quota watched while it runs, the
//! project locked while a changing call runs in it, instruction files it
//! touched.

use super::*;

/// Caps the live output of one call.
pub(super) struct LiveCap {
    left: usize,
    dropped: u64,
}

impl LiveCap {
    pub(super) fn new(limit: usize) -> Self {
        LiveCap {
            left: limit,
            dropped: 0,
        }
    }

    /// The part of `text` still within the cap, if any.
    pub(super) fn admit(&mut self, mut text: String) -> Option<String> {
        if text.len() <= self.left {
            self.left -= text.len();
            return Some(text);
        }
        let mut keep = self.left;
        while !text.is_char_boundary(keep) {
            keep -= 1;
        }
        self.dropped += (text.len() - keep) as u64;
        self.left = 0;
        text.truncate(keep);
        (!text.is_empty()).then_some(text)
    }

    /// The closing note when output was held back.
    pub(super) fn note(&self) -> Option<String> {
        (self.dropped > 0).then(|| {
            format!(
                "\n[{} more bytes of live output not shown; the result keeps the head and tail]\n",
                self.dropped
            )
        })
    }
}

pub(super) fn chunk_message(
    stream: agentry_proto::sessions::v1::OutputStream,
    text: String,
) -> pb::ExecuteResponse {
    pb::ExecuteResponse {
        kind: Some(pb::execute_response::Kind::Chunk(pb::OutputChunk {
            stream: stream as i32,
            text,
        })),
    }
}

/// The workspace quota during a bash call: a command may not grow the
/// workspace past it (nor one already past it). The workspace is measured
/// at the start, every half second while the command runs, and at the end,
/// each time on a thread confined like the file tools.
pub(super) struct QuotaWatch {
    confinement: agentry_sandbox::ThreadConfinement,
    workspace: Workspace,
    quota: u64,
    /// The most the workspace may take: the quota, or more when it already
    /// took more at the start.
    allowed: u64,
}

impl QuotaWatch {
    /// A watch for a call of `tool`, when its processes may grow the
    /// workspace (bash, MCP servers) and there is a quota.
    pub(super) async fn start(
        inner: &Inner,
        tool: Option<&tools::ToolSpec>,
        workspace: &Workspace,
    ) -> Option<QuotaWatch> {
        let quota = inner.limits.workspace_bytes;
        // A project directory has no quota.
        let watched = tool.is_some_and(|spec| spec.grows_workspace);
        if quota == 0 || !watched || workspace.is_project() {
            return None;
        }
        let mut watch = QuotaWatch {
            confinement: inner.sandbox.file_confinement(workspace),
            workspace: workspace.clone(),
            quota,
            allowed: quota,
        };
        watch.allowed = watch.usage().await.unwrap_or(0).max(quota);
        Some(watch)
    }

    pub(super) async fn usage(&self) -> Option<u64> {
        let (confinement, workspace) = (self.confinement.clone(), self.workspace.clone());
        tokio::task::spawn_blocking(move || {
            agentry_sandbox::run_confined(&confinement, move || workspace.usage())
        })
        .await
        .ok()
        .and_then(Result::ok)
    }

    /// The outcome of a call stopped for outgrowing the quota, if it did.
    pub(super) async fn stopped(&self) -> Option<ToolOutcome> {
        let used = self.usage().await.filter(|used| *used > self.allowed)?;
        Some(ToolOutcome {
            output: format!(
                "[stopped: the workspace grew to {} MiB, past its quota of {} MiB \
                 (tool_runner.limits.workspace_mib); delete files to make room]",
                used / MIB,
                self.quota / MIB
            ),
            is_error: true,
            ..ToolOutcome::default()
        })
    }

    /// `done`, told when the call ended with the workspace past the quota.
    pub(super) async fn finished(&self, mut done: ToolOutcome) -> ToolOutcome {
        if let Some(used) = self.usage().await.filter(|used| *used > self.allowed) {
            done.output.push_str(&format!(
                "\n[the workspace is now {} MiB, past its quota of {} MiB \
                 (tool_runner.limits.workspace_mib): writes are refused until files are deleted]",
                used / MIB,
                self.quota / MIB
            ));
            done.is_error = true;
        }
        done
    }
}

pub(super) const MIB: u64 = 1024 * 1024;

/// The instruction files of the directories a call touched below the
/// project's root (read confined like the file tools), for tools whose
/// calls name a path.
pub(super) async fn touched_instructions(
    inner: &Inner,
    workspace: &Workspace,
    target: Option<tools::Target>,
) -> Vec<agentry_proto::sessions::v1::InstructionFile> {
    let Some(target) = target else {
        return Vec::new();
    };
    let dirs = crate::instructions::touched_dirs(&target.path, target.directory);
    if dirs.is_empty() {
        return Vec::new();
    }
    let confinement = inner.sandbox.file_confinement(workspace);
    let root = workspace.root().to_path_buf();
    tokio::task::spawn_blocking(move || {
        agentry_sandbox::run_confined(&confinement, move || {
            dirs.iter()
                .filter_map(|rel| crate::instructions::read_below(&root, rel))
                .collect()
        })
    })
    .await
    .ok()
    .and_then(Result::ok)
    .unwrap_or_default()
}

/// Whether calls of `tool` may change files (all but the read-only
/// tools): in a project directory, such calls of two sessions take turns.
pub(super) fn changes_files(tool: Option<&tools::ToolSpec>) -> bool {
    !tool.is_some_and(|spec| spec.read_only)
}

/// Takes the lock of a project directory's changing calls, saying once on
/// the call's output which session it waits for. `None` when the caller
/// went away meanwhile, or the lock cannot be used (logged; the call then
/// runs unlocked rather than not at all).
pub(super) async fn lock_project(
    inner: &Inner,
    workspace: &Workspace,
    tx: &mpsc::Sender<Result<pb::ExecuteResponse, Status>>,
) -> Option<Option<crate::projects::DirectoryLock>> {
    let path = inner.places.lock_path(workspace.root());
    let mut told = false;
    loop {
        match crate::projects::DirectoryLock::try_take(&path, workspace.session_id()) {
            Ok(lock) => return Some(Some(lock)),
            Err(None) => return Some(None),
            Err(Some(holder)) => {
                if !told {
                    told = true;
                    let note = format!(
                        "[waiting for session {holder}: it is changing files in {}]\n",
                        workspace.root().display()
                    );
                    let chunk =
                        chunk_message(agentry_proto::sessions::v1::OutputStream::Stderr, note);
                    if tx.send(Ok(chunk)).await.is_err() {
                        return None;
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    () = tx.closed() => return None,
                }
            }
        }
    }
}

/// Runs one call and streams its output, then its result, to `tx`;
/// dropping the call (the caller went away) kills it and what it started.
pub(super) async fn run_call(
    inner: Arc<Inner>,
    req: pb::ExecuteRequest,
    workspace: Workspace,
    pass: Option<crate::egress::Pass>,
    tx: mpsc::Sender<Result<pb::ExecuteResponse, Status>>,
) {
    let call_id = req.call_id.clone();
    let tool = req.tool.clone();
    let started = Instant::now();
    tracing::debug!(call_id, tool, "tool call started");
    let found = inner.tools.get(&tool);
    let spec = found.as_ref().map(|t| t.spec());
    let _project_lock = if workspace.is_project() && changes_files(spec) {
        match lock_project(&inner, &workspace, &tx).await {
            Some(lock) => lock,
            None => {
                inner.calls.record(&tool, "cancelled");
                return;
            }
        }
    } else {
        None
    };
    let (sink, mut chunks) = mpsc::channel(64);
    // A bash command its rule matches gets the secret in its environment:
    // every such release is told in the result.
    let secret_env = if tool == "bash" {
        serde_json::from_str::<serde_json::Value>(&req.arguments_json)
            .ok()
            .and_then(|a| {
                a.get("command")
                    .and_then(|c| c.as_str())
                    .map(str::to_string)
            })
            .map(|command| inner.secrets.for_command(&command))
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let secrets_used: Vec<String> = secret_env.iter().map(|(name, _)| name.clone()).collect();
    if !secrets_used.is_empty() {
        tracing::info!(call_id, secrets = ?secrets_used, "secrets released to a command");
    }
    // Whatever a tool shows is searched for every secret's value.
    let mut redact_out = inner.secrets.stream();
    let mut redact_err = inner.secrets.stream();
    let call = tools::Call {
        workspace: workspace.clone(),
        timeout: (req.timeout_ms > 0).then(|| Duration::from_millis(req.timeout_ms)),
        network: pass,
        sink,
        resume: req.resume.clone(),
        asked: Arc::default(),
        secret_env,
    };
    let mut run = tools::start(
        &inner.tools,
        found.as_deref(),
        &req.tool,
        &req.arguments_json,
        &call,
    );
    let watch = QuotaWatch::start(&inner, spec, &workspace).await;
    // Measured at the start: the first tick is due later.
    let period = Duration::from_millis(500);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Live output is stored in the session log: like the result the
    // model sees, it is capped per call. Past the cap it is counted,
    // not sent; the result keeps the head and tail.
    let mut live = LiveCap::new(inner.limits.max_output_bytes);
    let outcome = loop {
        tokio::select! {
            Some((stream, text)) = chunks.recv() => {
                let text = match stream {
                    _ if inner.secrets.is_empty() => text,
                    agentry_proto::sessions::v1::OutputStream::Stderr => redact_err.push(&text),
                    _ => redact_out.push(&text),
                };
                if text.is_empty() {
                    continue;
                }
                let Some(text) = live.admit(text) else { continue };
                if tx.send(Ok(chunk_message(stream, text))).await.is_err() {
                    // The caller went away: dropping `run` kills the call.
                    tracing::info!(call_id, tool, "tool call cancelled by the caller");
                    inner.calls.record(&tool, "cancelled");
                    return;
                }
            }
            outcome = &mut run => break outcome,
            _ = tick.tick(), if watch.is_some() => {
                if let Some(watch) = &watch
                    && let Some(stopped) = watch.stopped().await
                {
                    tracing::info!(call_id, "a command outgrew the workspace quota");
                    break Ok(stopped);
                }
            }
            () = tx.closed() => {
                tracing::info!(call_id, tool, "tool call cancelled by the caller");
                inner.calls.record(&tool, "cancelled");
                return;
            }
        }
    };
    // Dropping the call kills it and everything it started.
    drop(run);
    // A command that finished between two measures.
    let outcome = match (&watch, outcome) {
        (Some(watch), Ok(done)) => Ok(watch.finished(done).await),
        (_, outcome) => outcome,
    };
    // Forward output produced just before the end, and what the
    // redactors held back.
    let mut last = Vec::new();
    while let Ok((stream, text)) = chunks.try_recv() {
        let text = match stream {
            _ if inner.secrets.is_empty() => text,
            agentry_proto::sessions::v1::OutputStream::Stderr => redact_err.push(&text),
            _ => redact_out.push(&text),
        };
        last.push((stream, text));
    }
    last.push((
        agentry_proto::sessions::v1::OutputStream::Stdout,
        redact_out.finish(),
    ));
    last.push((
        agentry_proto::sessions::v1::OutputStream::Stderr,
        redact_err.finish(),
    ));
    for (stream, text) in last {
        if text.is_empty() {
            continue;
        }
        let Some(text) = live.admit(text) else {
            continue;
        };
        if tx.send(Ok(chunk_message(stream, text))).await.is_err() {
            return;
        }
    }
    let network_note = call.network.as_ref().and_then(crate::egress::Pass::note);
    // Secrets the proxy added as headers are releases too.
    let mut secrets_used = secrets_used;
    for name in call
        .network
        .as_ref()
        .map(crate::egress::Pass::secrets_used)
        .unwrap_or_default()
    {
        if !secrets_used.contains(&name) {
            secrets_used.push(name);
        }
    }
    let asked = call
        .asked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    drop(call);
    if let Some(note) = live.note() {
        let _ = tx
            .send(Ok(chunk_message(
                agentry_proto::sessions::v1::OutputStream::Stderr,
                note,
            )))
            .await;
    }
    let mut outcome = outcome.unwrap_or_else(|e| ToolOutcome {
        output: e.to_string(),
        is_error: true,
        ..ToolOutcome::default()
    });
    if let Some(note) = network_note {
        if !outcome.output.is_empty() && !outcome.output.ends_with('\n') {
            outcome.output.push('\n');
        }
        outcome.output.push_str(&note);
    }
    let (redacted, shown) = if inner.secrets.is_empty() {
        (String::new(), Vec::new())
    } else {
        inner.secrets.redact(&outcome.output)
    };
    if !shown.is_empty() {
        tracing::info!(call_id, secrets = ?shown, "secret values in a tool's output were redacted");
        outcome.output = redacted;
    }
    let instructions = if workspace.is_project() && !outcome.is_error {
        let target = found.as_ref().and_then(|t| t.target(&req.arguments_json));
        touched_instructions(&inner, &workspace, target).await
    } else {
        Vec::new()
    };
    let mut result = finished(&inner, &call_id, &tool, started, outcome, instructions);
    if let Some(pb::execute_response::Kind::Result(result)) = &mut result.kind {
        result.secrets_used = secrets_used;
    }
    if let Some(mut asked) = asked
        && let Some(pb::execute_response::Kind::Result(result)) = &mut result.kind
    {
        asked.call_id = call_id;
        result.input_required = Some(asked);
    }
    let _ = tx.send(Ok(result)).await;
}

/// The call's result message, counted in the metrics.
fn finished(
    inner: &Inner,
    call_id: &str,
    tool: &str,
    started: Instant,
    outcome: ToolOutcome,
    instructions: Vec<agentry_proto::sessions::v1::InstructionFile>,
) -> pb::ExecuteResponse {
    let duration_ms = started.elapsed().as_millis() as u64;
    let outcome_name = match (outcome.timed_out, outcome.is_error) {
        (true, _) => "timeout",
        (false, true) => "error",
        (false, false) => "ok",
    };
    inner.calls.record(tool, outcome_name);
    tracing::debug!(
        call_id,
        tool,
        is_error = outcome.is_error,
        duration_ms,
        "tool call finished"
    );
    pb::ExecuteResponse {
        kind: Some(pb::execute_response::Kind::Result(pb::ExecuteResult {
            output: outcome.output,
            is_error: outcome.is_error,
            exit_code: outcome.exit_code,
            duration_ms,
            runner_id: inner.runner_id.clone(),
            truncated: outcome.truncated,
            timed_out: outcome.timed_out,
            instructions,
            input_required: None,
            secrets_used: Vec::new(),
        })),
    }
}
