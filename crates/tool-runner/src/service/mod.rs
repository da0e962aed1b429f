//! The gRPC face of the tool runner.

use crate::sandbox::Sandbox;
use crate::tools::{self, ToolOutcome};
use crate::workspace::Workspace;
use crate::{Limits, ToolError};
use agentry_proto::tools::v1 as pb;
use agentry_proto::tools::v1::tool_runner_server::ToolRunner;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

mod execute;

/// The ToolRunner gRPC service.
#[derive(Clone)]
pub struct ToolRunnerService {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    places: crate::projects::Places,
    limits: Limits,
    runner_id: String,
    sandbox: Sandbox,
    web: Option<Arc<crate::web::Web>>,
    egress: Option<Arc<crate::egress::Egress>>,
    mcp: Option<crate::mcp::Mcp>,
    snapshots: Option<crate::snapshots::Snapshots>,
    calls: Arc<crate::metrics::ToolCalls>,
    /// Secrets released at the point of use, redacted from every output.
    secrets: crate::secrets::Secrets,
    /// The tools, made from the fields above.
    tools: Arc<tools::Registry<tools::Call>>,
}

impl Inner {
    fn registry(&self) -> tools::Registry<tools::Call> {
        tools::registry(
            &self.limits,
            &self.sandbox,
            self.web.as_ref(),
            self.mcp.as_ref(),
        )
    }
}

impl ToolRunnerService {
    /// A runner working under `workspace_root`.
    pub fn new(workspace_root: PathBuf, limits: Limits, runner_id: String) -> Self {
        let mut inner = Inner {
            places: crate::projects::Places::scratch_only(workspace_root),
            limits,
            runner_id,
            sandbox: Sandbox::unconfined(),
            web: None,
            egress: None,
            mcp: None,
            snapshots: None,
            calls: Arc::default(),
            secrets: Default::default(),
            tools: Arc::default(),
        };
        inner.tools = Arc::new(inner.registry());
        Self {
            inner: Arc::new(inner),
        }
    }

    fn with(self, change: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = (*self.inner).clone();
        change(&mut inner);
        inner.tools = Arc::new(inner.registry());
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The same runner letting sessions work where `places` allows (its
    /// root replaces the workspace root).
    pub fn with_places(self, places: crate::projects::Places) -> Self {
        self.with(|inner| inner.places = places)
    }

    /// The same runner confining commands with `sandbox`.
    pub fn with_sandbox(self, sandbox: Sandbox) -> Self {
        self.with(|inner| inner.sandbox = sandbox)
    }

    /// The same runner serving the web tools with `web`.
    pub fn with_web(self, web: Arc<crate::web::Web>) -> Self {
        self.with(|inner| inner.web = Some(web))
    }

    /// The same runner giving network to calls that ask for it through
    /// `egress`.
    pub fn with_egress(self, egress: Arc<crate::egress::Egress>) -> Self {
        self.with(|inner| inner.egress = Some(egress))
    }

    /// The same runner offering the tools of these MCP servers.
    pub fn with_mcp(self, mcp: crate::mcp::Mcp) -> Self {
        // Kept without configured servers too: a session may bring its own.
        self.with(|inner| inner.mcp = Some(mcp))
    }

    /// The same runner holding `secrets`: released to matching commands,
    /// redacted from every output.
    pub fn with_secrets(self, secrets: crate::secrets::Secrets) -> Self {
        self.with(|inner| inner.secrets = secrets)
    }

    /// The same runner keeping workspace snapshots in `snapshots`.
    pub fn with_snapshots(self, snapshots: crate::snapshots::Snapshots) -> Self {
        self.with(|inner| inner.snapshots = Some(snapshots))
    }

    /// The metrics page (Prometheus text).
    pub fn metrics_page(&self) -> String {
        crate::metrics::render(
            &self.inner.runner_id,
            &self.inner.calls,
            self.inner.web.as_deref(),
            self.inner.mcp.as_ref(),
        )
    }
}

/// A tool's description as ListTools gives it.
fn spec_message(s: tools::ToolSpec) -> pb::ToolSpec {
    let (mcp_server, read_only_hint) = match s.source {
        tools::Source::Own => (String::new(), false),
        tools::Source::Mcp {
            server,
            read_only_hint,
        } => (server, read_only_hint),
    };
    pb::ToolSpec {
        name: s.name,
        description: s.description,
        parameters_json_schema: s.schema.to_string(),
        read_only: s.read_only,
        parallel_safe: s.parallel_safe,
        sensitive: s.sensitive,
        mcp_server,
        read_only_hint,
        network: s.network,
    }
}

type ExecuteStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ExecuteResponse, Status>> + Send>>;
type WatchStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::McpResourceUpdate, Status>> + Send>>;

/// An unacknowledged update is sent again on a stream after this long.
const REDELIVER_AFTER: Duration = Duration::from_secs(10);

impl ToolRunnerService {
    /// A session's workspace, created and handed to the session if new.
    fn workspace(&self, session_id: &str) -> Result<Workspace, Status> {
        self.inner
            .places
            .open(session_id)
            .and_then(|ws| {
                self.inner
                    .sandbox
                    .hand_over_workspace(&ws)
                    .map_err(|e| ToolError::Io(format!("cannot prepare the workspace: {e}")))?;
                Ok(ws)
            })
            .map_err(place_status)
    }

    fn snapshots(&self) -> Result<crate::snapshots::Snapshots, Status> {
        self.inner.snapshots.clone().ok_or_else(|| {
            agentry_runtime::reasons::status(
                tonic::Code::FailedPrecondition,
                agentry_runtime::reasons::Reason::SnapshotsOff,
                "workspace snapshots are off on this tool runner (tool_runner.snapshots.enabled)",
            )
        })
    }

    fn mcp(&self) -> Result<&crate::mcp::Mcp, Status> {
        self.inner.mcp.as_ref().ok_or_else(|| {
            Status::failed_precondition("this tool runner has no MCP servers configured")
        })
    }
}

#[tonic::async_trait]
impl ToolRunner for ToolRunnerService {
    async fn list_tools(
        &self,
        request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        let session_id = request.into_inner().session_id;
        let mut tools: Vec<pb::ToolSpec> = self
            .inner
            .tools
            .specs()
            .into_iter()
            .map(spec_message)
            .collect();
        // The model is told the secrets' names (never their values).
        if let Some(note) = self.inner.secrets.describe()
            && let Some(bash) = tools.iter_mut().find(|t| t.name == "bash")
        {
            bash.description = format!("{} {note}", bash.description);
        }
        if !session_id.is_empty()
            && let Some(mcp) = &self.inner.mcp
        {
            tools.extend(
                mcp.session_tools(&session_id)
                    .into_iter()
                    .map(|(server, listed)| spec_message(crate::mcp_host::spec_of(server, listed))),
            );
        }
        let mcp_servers = self
            .inner
            .mcp
            .as_ref()
            .map(crate::mcp::Mcp::statuses)
            .unwrap_or_default();
        Ok(Response::new(pb::ListToolsResponse {
            tools,
            runner_id: self.inner.runner_id.clone(),
            sandbox: self.inner.sandbox.describe(),
            mcp_servers,
        }))
    }

    type ExecuteStream = ExecuteStream;
    type McpWatchStream = WatchStream;

    async fn snapshot(
        &self,
        request: Request<pb::SnapshotRequest>,
    ) -> Result<Response<pb::SnapshotResponse>, Status> {
        let req = request.into_inner();
        let snapshots = self.snapshots()?;
        let workspace = self.workspace(&req.session_id)?;
        let confinement = self.inner.sandbox.file_confinement(&workspace);
        let taken =
            tokio::task::spawn_blocking(move || snapshots.snapshot(&workspace, &confinement))
                .await
                .map_err(|e| Status::internal(format!("the snapshot failed: {e}")))?
                .map_err(snapshot_status)?;
        tracing::debug!(session_id = %req.session_id, snapshot = %taken.id, files = taken.files, new_bytes = taken.new_bytes, ms = taken.duration.as_millis() as u64, "workspace snapshot");
        Ok(Response::new(pb::SnapshotResponse {
            snapshot_id: taken.id,
            files: taken.files,
            bytes: taken.bytes,
            new_bytes: taken.new_bytes,
            skipped: taken.skipped,
            duration_ms: taken.duration.as_millis() as u64,
        }))
    }

    async fn restore_snapshot(
        &self,
        request: Request<pb::RestoreSnapshotRequest>,
    ) -> Result<Response<pb::RestoreSnapshotResponse>, Status> {
        let req = request.into_inner();
        let snapshots = self.snapshots()?;
        let workspace = self.workspace(&req.session_id)?;
        let confinement = self.inner.sandbox.file_confinement(&workspace);
        let id = req.snapshot_id.clone();
        let restored =
            tokio::task::spawn_blocking(move || snapshots.restore(&workspace, &confinement, &id))
                .await
                .map_err(|e| Status::internal(format!("the restore failed: {e}")))?
                .map_err(snapshot_status)?;
        tracing::info!(session_id = %req.session_id, snapshot = %req.snapshot_id, written = restored.written, deleted = restored.deleted, "workspace restored");
        Ok(Response::new(pb::RestoreSnapshotResponse {
            written: restored.written,
            deleted: restored.deleted,
            unchanged: restored.unchanged,
            bytes_written: restored.bytes_written,
            left_alone: restored.left_alone,
        }))
    }

    async fn prune_snapshots(
        &self,
        request: Request<pb::PruneSnapshotsRequest>,
    ) -> Result<Response<pb::PruneSnapshotsResponse>, Status> {
        let req = request.into_inner();
        let snapshots = self.snapshots()?;
        let options = crate::snapshots::PruneOptions {
            sessions: req
                .sessions_listed
                .then(|| req.sessions.into_iter().collect()),
            dry_run: req.dry_run,
        };
        let pruned = tokio::task::spawn_blocking(move || snapshots.prune(&options))
            .await
            .map_err(|e| Status::internal(format!("pruning failed: {e}")))?
            .map_err(snapshot_status)?;
        Ok(Response::new(prune_response(&pruned)))
    }

    async fn preview(
        &self,
        request: Request<pb::PreviewRequest>,
    ) -> Result<Response<pb::PreviewResponse>, Status> {
        let req = request.into_inner();
        let workspace = self.workspace(&req.session_id)?;
        let inner = &self.inner;
        let Some(result) = crate::files::preview(
            &req.tool,
            &req.arguments_json,
            &workspace,
            &inner.limits,
            &inner.sandbox,
        )
        .await
        else {
            return Err(Status::invalid_argument(format!(
                "{:?} has no preview; only write_file and edit_file do",
                req.tool
            )));
        };
        Ok(Response::new(match result {
            Ok(preview) => pb::PreviewResponse {
                path: preview.path,
                diff: preview.diff,
                creates: preview.creates,
                error: String::new(),
            },
            Err(e) => pb::PreviewResponse {
                error: e.to_string(),
                ..Default::default()
            },
        }))
    }

    async fn run_hook(
        &self,
        request: Request<pb::RunHookRequest>,
    ) -> Result<Response<pb::RunHookResponse>, Status> {
        let req = request.into_inner();
        let max = agentry_runtime::config::MAX_HOOK_TIMEOUT_SECS;
        if req.timeout_secs == 0 || u64::from(req.timeout_secs) > max {
            return Err(Status::invalid_argument(format!(
                "timeout_secs must be between 1 and {max}, not {}",
                req.timeout_secs
            )));
        }
        let workspace = self.workspace(&req.session_id)?;
        let run = crate::hooks::run(
            &self.inner.sandbox,
            &workspace,
            &self.inner.limits,
            &req.command,
            &req.input,
            Duration::from_secs(u64::from(req.timeout_secs)),
        )
        .await;
        Ok(Response::new(pb::RunHookResponse {
            exit_code: run.exit_code,
            stdout: run.stdout,
            stderr: run.stderr,
            timed_out: run.timed_out,
            duration_ms: run.duration_ms,
            error: run.error,
        }))
    }

    async fn open_project(
        &self,
        request: Request<pb::OpenProjectRequest>,
    ) -> Result<Response<pb::OpenProjectResponse>, Status> {
        let req = request.into_inner();
        let places = &self.inner.places;
        let dir = std::path::Path::new(&req.dir);
        let (dir, owner) = if req.check_only {
            crate::workspace::check_session_id(&req.session_id).map_err(place_status)?;
            places.check(dir).map_err(place_status)?
        } else {
            let workspace = places
                .open_project(&req.session_id, dir)
                .map_err(place_status)?;
            self.inner
                .sandbox
                .hand_over_workspace(&workspace)
                .map_err(|e| Status::internal(format!("cannot prepare the workspace: {e}")))?;
            tracing::info!(session_id = %req.session_id, dir = %workspace.root().display(), "a session works in a project directory");
            (workspace.root().to_path_buf(), workspace.owner())
        };
        let runs_as = match (self.inner.sandbox.switches_identity(), owner) {
            (false, _) => String::new(),
            (true, Some(ids)) => crate::sandbox::user_name(ids.uid),
            (true, None) => String::new(),
        };
        Ok(Response::new(pb::OpenProjectResponse {
            dir: dir.display().to_string(),
            runs_as,
        }))
    }

    async fn forget_session(
        &self,
        request: Request<pb::ForgetSessionRequest>,
    ) -> Result<Response<pb::ForgetSessionResponse>, Status> {
        let session_id = request.into_inner().session_id;
        crate::workspace::check_session_id(&session_id).map_err(place_status)?;
        self.inner.sandbox.sessions.forget(&session_id);
        let places = self.inner.places.clone();
        let removed = tokio::task::spawn_blocking(move || -> Result<bool, ToolError> {
            let root = places.root();
            // A project directory is the person's: only the record goes.
            let scratch = places.recorded(&session_id)?.is_none();
            places.forget(&session_id)?;
            let remove = |dir: std::path::PathBuf| match std::fs::remove_dir_all(&dir) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(ToolError::Io(format!(
                    "cannot remove {}: {e}",
                    dir.display()
                ))),
            };
            remove(root.join(crate::workspace::TEMP_DIRS).join(&session_id))?;
            Ok(scratch && remove(root.join(&session_id))?)
        })
        .await
        .map_err(|e| Status::internal(format!("forgetting the session failed: {e}")))?
        .map_err(place_status)?;
        Ok(Response::new(pb::ForgetSessionResponse {
            workspace_removed: removed,
        }))
    }

    async fn read_image(
        &self,
        request: Request<pb::ReadImageRequest>,
    ) -> Result<Response<pb::ReadImageResponse>, Status> {
        let req = request.into_inner();
        let workspace = self.workspace(&req.session_id)?;
        let read = crate::files::read_image(
            &req.path,
            &workspace,
            &self.inner.limits,
            &self.inner.sandbox,
        )
        .await;
        match read {
            Ok((mime, data)) => Ok(Response::new(pb::ReadImageResponse {
                mime: mime.to_string(),
                data,
            })),
            Err(e @ (ToolError::InvalidArguments(_) | ToolError::TooLarge(_))) => {
                Err(Status::invalid_argument(e.to_string()))
            }
            Err(e @ ToolError::PathOutsideWorkspace { .. }) => {
                Err(Status::permission_denied(e.to_string()))
            }
            Err(e) => Err(Status::failed_precondition(e.to_string())),
        }
    }

    async fn read_instructions(
        &self,
        request: Request<pb::ReadInstructionsRequest>,
    ) -> Result<Response<pb::ReadInstructionsResponse>, Status> {
        let req = request.into_inner();
        let places = self.inner.places.clone();
        let (root, ids) = if req.session_id.is_empty() {
            let (dir, owner) = places
                .check(std::path::Path::new(&req.dir))
                .map_err(place_status)?;
            let who = crate::sandbox::Who {
                session_id: "instructions",
                owner,
            };
            (dir, self.inner.sandbox.ids_of(who))
        } else {
            // A scratch workspace has no project instructions: answered
            // from the project record alone, nothing prepared (a fresh
            // session asks before its first model call).
            crate::workspace::check_session_id(&req.session_id).map_err(place_status)?;
            if places
                .recorded(&req.session_id)
                .map_err(place_status)?
                .is_none()
            {
                return Ok(Response::new(pb::ReadInstructionsResponse::default()));
            }
            let workspace = self.workspace(&req.session_id)?;
            if !workspace.is_project() {
                return Ok(Response::new(pb::ReadInstructionsResponse::default()));
            }
            let ids = self.inner.sandbox.ids_of(workspace.who());
            (workspace.root().to_path_buf(), ids)
        };
        // As the session's user, without Landlock: the repository's root
        // may be above the project.
        let confinement = agentry_sandbox::ThreadConfinement {
            workspace: root.clone(),
            ids,
            landlock: false,
        };
        let files = tokio::task::spawn_blocking(move || {
            agentry_sandbox::run_confined(&confinement, move || {
                let dirs = crate::instructions::project_dirs(&root, |d| places.within_roots(d));
                crate::instructions::read_dirs(&dirs)
            })
        })
        .await
        .map_err(|e| Status::internal(format!("reading instructions failed: {e}")))?
        .map_err(|e| Status::internal(format!("cannot read instructions as the session: {e}")))?;
        Ok(Response::new(pb::ReadInstructionsResponse { files }))
    }

    async fn mcp_session_servers(
        &self,
        request: Request<pb::McpSessionServersRequest>,
    ) -> Result<Response<pb::McpSessionServersResponse>, Status> {
        let req = request.into_inner();
        crate::workspace::check_session_id(&req.session_id)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        // A session's HTTP server is reached from the runner: like a page
        // the web tools fetch, it must be public unless the configuration
        // names its host ([tools.web] allow_hosts).
        let guard = self
            .inner
            .web
            .as_ref()
            .map(|web| web.guard().clone())
            .unwrap_or_default();
        for server in req.servers.iter().filter(|s| !s.url.trim().is_empty()) {
            let url = url::Url::parse(server.url.trim()).map_err(|e| {
                Status::invalid_argument(format!("MCP server {:?}: its url: {e}", server.name))
            })?;
            guard.check(&url).await.map_err(|e| {
                Status::invalid_argument(format!(
                    "MCP server {:?}: {e} (a session's own server must be at a public address, \
                     or its host listed in [tools.web] allow_hosts)",
                    server.name
                ))
            })?;
        }
        let configs = req
            .servers
            .into_iter()
            .map(|s| agentry_runtime::config::McpServerConfig {
                name: s.name,
                command: s.command,
                args: s.args,
                env: s.env.into_iter().collect(),
                url: s.url,
                headers: s.headers.into_iter().collect(),
                enabled: true,
                ..Default::default()
            })
            .collect();
        let set = self
            .mcp()?
            .set_session_servers(&req.session_id, configs)
            .await
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mut response = pb::McpSessionServersResponse::default();
        for server in set {
            match server.tools {
                Ok(listed) => response.tools.extend(
                    listed
                        .into_iter()
                        .map(|t| spec_message(crate::mcp_host::spec_of(server.name.clone(), t))),
                ),
                Err(why) => response.errors.push(format!("{}: {why}", server.name)),
            }
        }
        Ok(Response::new(response))
    }

    async fn mcp_subscribe(
        &self,
        request: Request<pb::McpSubscribeRequest>,
    ) -> Result<Response<pb::McpSubscribeResponse>, Status> {
        let req = request.into_inner();
        crate::workspace::check_session_id(&req.session_id)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let uris = self
            .mcp()?
            .subscribe(&req.session_id, &req.server, &req.uri, req.unsubscribe)
            .await
            .map_err(Status::failed_precondition)?;
        Ok(Response::new(pb::McpSubscribeResponse { uris }))
    }

    async fn mcp_read_resource(
        &self,
        request: Request<pb::McpReadResourceRequest>,
    ) -> Result<Response<pb::McpReadResourceResponse>, Status> {
        let req = request.into_inner();
        crate::workspace::check_session_id(&req.session_id)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let (text, mime_type, truncated) = self
            .mcp()?
            .read_resource(
                &req.session_id,
                &req.server,
                &req.uri,
                self.inner.limits.max_output_bytes,
            )
            .await
            .map_err(Status::failed_precondition)?;
        Ok(Response::new(pb::McpReadResourceResponse {
            text,
            mime_type,
            truncated,
        }))
    }

    async fn mcp_watch(
        &self,
        request: Request<tonic::Streaming<pb::McpWatchRequest>>,
    ) -> Result<Response<Self::McpWatchStream>, Status> {
        let mcp = self.mcp()?.clone();
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before its first message"))?;
        tracing::info!(consumer = %first.consumer, "an MCP update watcher connected");
        mcp.acknowledge(&first.acks, &first.gone);
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let mut changed = mcp.pending_changed();
            let mut sent: std::collections::HashMap<String, Instant> = Default::default();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                let pending = mcp.pending();
                sent.retain(|id, _| pending.iter().any(|u| &u.id == id));
                for update in pending {
                    if sent
                        .get(&update.id)
                        .is_some_and(|at| at.elapsed() < REDELIVER_AFTER)
                    {
                        continue;
                    }
                    sent.insert(update.id.clone(), Instant::now());
                    let message = pb::McpResourceUpdate {
                        id: update.id,
                        session_id: update.sub.session_id,
                        server: update.sub.server,
                        uri: update.sub.uri,
                        content: update.content,
                    };
                    if tx.send(Ok(message)).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(m)) => mcp.acknowledge(&m.acks, &m.gone),
                        Ok(None) | Err(_) => return,
                    },
                    result = changed.changed() => if result.is_err() { return },
                    _ = tick.tick() => {}
                    () = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn execute(
        &self,
        request: Request<pb::ExecuteRequest>,
    ) -> Result<Response<Self::ExecuteStream>, Status> {
        let req = request.into_inner();
        if req.tool.is_empty() {
            return Err(Status::invalid_argument("tool must be set"));
        }
        let workspace = self.workspace(&req.session_id)?;
        let pass = if req.network {
            let egress = self.inner.egress.as_ref().ok_or_else(|| {
                Status::failed_precondition(
                    "this call asks for network, but this tool runner gives none",
                )
            })?;
            Some(egress.grant(true).map_err(|why| {
                Status::failed_precondition(format!(
                    "this call asks for network, but this tool runner cannot give it: {why}"
                ))
            })?)
        } else {
            None
        };
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(execute::run_call(
            self.inner.clone(),
            req,
            workspace,
            pass,
            tx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The status of a failure to open a session's place.
fn place_status(error: ToolError) -> Status {
    match error {
        ToolError::InvalidRequest(m) => Status::invalid_argument(m),
        ToolError::NotAllowed(m) => agentry_runtime::reasons::status(
            tonic::Code::PermissionDenied,
            agentry_runtime::reasons::Reason::ProjectRefused,
            m,
        ),
        other => Status::internal(other.to_string()),
    }
}

/// The status of a failed snapshot operation.
fn snapshot_status(error: ToolError) -> Status {
    match error {
        ToolError::InvalidRequest(m) => Status::failed_precondition(m),
        other => Status::internal(other.to_string()),
    }
}

/// The wire form of what pruning did.
pub fn prune_response(pruned: &crate::snapshots::Pruned) -> pb::PruneSnapshotsResponse {
    pb::PruneSnapshotsResponse {
        snapshots_removed: pruned.snapshots_removed,
        snapshots_kept: pruned.snapshots_kept,
        sessions_removed: pruned.sessions_removed,
        objects_removed: pruned.objects_removed,
        bytes_freed: pruned.bytes_freed,
        bytes_kept: pruned.bytes_kept,
        unlisted_sessions: pruned.unlisted_sessions.clone(),
    }
}
