//! The gRPC face of the orchestrator and the registry of session actors.

use crate::actor::{Actor, Command, SessionHandle, Submitted};
use crate::cluster::Driver;
use crate::deps::Deps;
use crate::reducer::Input;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::orchestrator::v1::orchestrator_server::Orchestrator;
use agentry_proto::sessions::v1 as spb;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// The longest user message accepted, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// A session's actor, once loaded.
type SessionSlot = Arc<Mutex<Option<SessionHandle>>>;

/// The sessions a replica drives, by id.
pub(crate) type Registry = std::sync::Mutex<HashMap<String, SessionSlot>>;

/// Where a session's inputs go.
enum Route {
    /// Its actor on this replica.
    Here(SessionHandle),
    /// The replica at this URL, which drives it.
    Elsewhere(String),
}

/// The Orchestrator gRPC service.
#[derive(Clone)]
pub struct OrchestratorService {
    deps: Arc<Deps>,
    /// One slot per session, each locked on its own while the session loads.
    sessions: Arc<Registry>,
}

pub(crate) fn store_status(url: &str, status: Status) -> Status {
    match status.code() {
        tonic::Code::Unavailable => Status::unavailable(format!(
            "the session store at {url} is unavailable: {}",
            status.message()
        )),
        _ => status,
    }
}

impl OrchestratorService {
    /// A service over `deps`.
    pub fn new(deps: Arc<Deps>) -> Self {
        let sessions: Arc<Registry> = Arc::default();
        let _ = deps.registry.set(Arc::downgrade(&sessions));
        Self { deps, sessions }
    }

    /// Loads a session's actor here (recovering an interrupted turn) unless
    /// another replica drives it.
    pub(crate) async fn wake(&self, session_id: &str) -> Result<(), Status> {
        self.route(session_id).await.map(|_| ())
    }

    /// The service whose sessions `deps` serve (for the delegate tool), if
    /// it still runs.
    pub fn attached(deps: Arc<Deps>) -> Option<Self> {
        let sessions = deps.registry.get()?.upgrade()?;
        Some(Self { deps, sessions })
    }

    /// The actor of a session, loading the session from its log if needed;
    /// with several replicas, the replica that drives the session when it
    /// is not this one.
    ///
    /// Loading (reading and replaying the log) holds only that session's
    /// slot: inputs to other sessions go on meanwhile, and inputs to this
    /// one wait for it and then share the actor it started.
    async fn route(&self, session_id: &str) -> Result<Route, Status> {
        let slot = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(session_id.to_string())
            .or_default()
            .clone();
        let mut current = slot.lock().await;
        if let Some(handle) = current.as_ref()
            && !handle.commands.is_closed()
        {
            return Ok(Route::Here(handle.clone()));
        }
        let acquired = match &self.deps.cluster {
            None => Ok(0),
            // A replica just started may not have landed its first
            // heartbeat yet: an input waits a beat for it.
            Some(cluster) if !cluster.alive_within(crate::cluster::HEARTBEAT_EVERY).await => {
                Err(Err(Status::unavailable(
                    "this orchestrator replica cannot renew its heartbeat in the session store, \
                     so it drives no session now; try again, or another replica",
                )))
            }
            Some(cluster) => match cluster.acquire(&self.deps.store, session_id).await {
                Ok(Driver::Here(epoch)) => Ok(epoch),
                Ok(Driver::Elsewhere(url)) => Err(Ok(Route::Elsewhere(url))),
                Err(status) => Err(Err(store_status(&self.deps.store_url, status))),
            },
        };
        let loaded = match acquired {
            Ok(epoch) => self.load(session_id, epoch).await,
            Err(other) => {
                drop(current);
                self.forget(session_id, &slot);
                return other;
            }
        };
        match loaded {
            Ok(handle) => {
                *current = Some(handle.clone());
                Ok(Route::Here(handle))
            }
            Err(status) => {
                drop(current);
                self.forget(session_id, &slot);
                Err(status)
            }
        }
    }

    /// Forgets the slot of a session that is not loaded here (it may not
    /// exist, or another replica drives it), unless another caller has
    /// replaced it.
    fn forget(&self, session_id: &str, slot: &SessionSlot) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        // The map's reference and the caller's only: nobody else is about
        // to load into this slot.
        if sessions.get(session_id).is_some_and(|s| {
            Arc::ptr_eq(s, slot)
                && Arc::strong_count(s) == 2
                && s.try_lock().is_ok_and(|h| h.is_none())
        }) {
            sessions.remove(session_id);
        }
    }

    /// Stops a session's actor here, if it runs (the session is being
    /// deleted).
    async fn unload(&self, session_id: &str) {
        let slot = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session_id);
        if let Some(slot) = slot {
            slot.lock().await.take();
        }
    }

    /// Stops every session actor of this replica (its lease lapsed: other
    /// replicas may drive its sessions now); inputs load them again,
    /// through a new lease or to the replica that drives them.
    pub fn drop_sessions(&self) {
        let slots: Vec<SessionSlot> = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        for slot in slots {
            if let Ok(mut handle) = slot.try_lock() {
                handle.take();
            }
        }
    }

    /// A session's whole log.
    async fn read_log(&self, session_id: &str) -> Result<Vec<spb::Event>, Status> {
        self.deps.read_log(session_id).await
    }

    /// The most recently updated sessions, `limit` of them (open turns only
    /// when asked).
    async fn recent_sessions(
        &self,
        limit: u32,
        only_open_turns: bool,
    ) -> Result<Vec<spb::Session>, Status> {
        Ok(self
            .deps
            .store
            .clone()
            .list_sessions(spb::ListSessionsRequest {
                limit,
                offset: 0,
                only_open_turns,
            })
            .await
            .map_err(|s| store_status(&self.deps.store_url, s))?
            .into_inner()
            .sessions)
    }

    /// Reads a session's log, replays it and starts its actor, which
    /// appends with lease `lease_epoch` (0: no lease).
    async fn load(&self, session_id: &str, lease_epoch: u64) -> Result<SessionHandle, Status> {
        let events = self.read_log(session_id).await?;
        // A sub-agent's session runs as its agent, in its parent's
        // workspace (the id names it: only the delegate tool makes those).
        let child = if session_id.starts_with(crate::agents::TASK_PREFIX) {
            let session = self.get(session_id.to_string()).await?;
            match session.parent {
                Some(parent) => {
                    let agent = self.deps.agents.get(&parent.agent).ok_or_else(|| {
                        Status::failed_precondition(format!(
                            "session {session_id} is a task of the agent {:?}, which is no \
                             longer configured",
                            parent.agent
                        ))
                    })?;
                    let workspace = self.workspace_of(&parent.session_id).await?;
                    Some(crate::actor::Child {
                        agent,
                        workspace,
                        orphan: false,
                    })
                }
                None => None,
            }
        } else {
            None
        };
        let state = match &child {
            Some(child) => self.deps.replayed_as(&child.agent, &events),
            None => self.deps.replayed(&events),
        };
        // A task whose delegate call has ended (answered, refused, skipped
        // after a restart) does not go on by itself: it is cancelled instead
        // of recovered.
        let mut child = child;
        if let Some(child) = &mut child
            && !state.is_idle()
        {
            child.orphan = self.task_call_ended(session_id).await?;
        }
        let handle = Actor::spawn(
            session_id.to_string(),
            state,
            events.len() as u64,
            lease_epoch,
            self.deps.clone(),
            child,
        );
        Ok(handle)
    }

    /// Whether the delegate call a sub-agent's session works for has a
    /// result in its parent's log.
    async fn task_call_ended(&self, session_id: &str) -> Result<bool, Status> {
        let session = self.get(session_id.to_string()).await?;
        let Some(parent) = session.parent else {
            return Ok(false);
        };
        let log = self.read_log(&parent.session_id).await?;
        Ok(crate::agents::call_ended(
            &log,
            &parent.session_id,
            &parent.call_id,
            session_id,
        ))
    }

    /// The session whose workspace `session_id` works in: its own, or its
    /// parent's for a sub-agent's session.
    async fn workspace_of(&self, session_id: &str) -> Result<String, Status> {
        let session = self.get(session_id.to_string()).await?;
        Ok(match session.parent {
            Some(parent) => parent.session_id,
            None => session.id,
        })
    }

    /// The shared dependencies.
    pub fn deps(&self) -> &Arc<Deps> {
        &self.deps
    }

    /// Loads every session whose last turn never finished, so that each is
    /// recovered (see [`SessionState::step`] with `Interrupted`) without
    /// waiting for a client. Retries while the store is unreachable.
    pub async fn recover_open_sessions(&self) {
        let mut delay = std::time::Duration::from_millis(200);
        let sessions = loop {
            match self.deps.all_sessions(true).await {
                Ok(sessions) => break sessions,
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(5));
                }
                Err(status) => {
                    tracing::error!(error = %status.message(), "cannot list sessions to recover");
                    return;
                }
            }
        };
        for session in sessions {
            // A sub-agent's task is taken up by its delegate call (run
            // again, or ended: then the task is cancelled), not on its own.
            if session.parent.is_some() {
                continue;
            }
            if self.is_loaded(&session.id) {
                continue;
            }
            match self.route(&session.id).await {
                Ok(Route::Here(_)) => {
                    tracing::info!(session_id = %session.id, "recovering a session with an unfinished turn");
                    if self.deps.cluster.is_some() {
                        crate::metrics::session_routed(&self.deps.metrics, "taken_over");
                    }
                }
                Ok(Route::Elsewhere(_)) => {}
                Err(status) => {
                    tracing::error!(session_id = %session.id, error = %status.message(), "cannot recover session");
                }
            }
        }
    }

    /// Whether this replica has the session's actor running.
    fn is_loaded(&self, session_id: &str) -> bool {
        let slot = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(session_id)
            .cloned();
        slot.is_some_and(|slot| {
            slot.try_lock()
                .is_ok_and(|h| h.as_ref().is_some_and(|h| !h.commands.is_closed()))
        })
    }

    /// Submits one input to a session.
    pub async fn submit_input(&self, session_id: &str, input: Input) -> Result<Submitted, Status> {
        self.submit_routed(session_id, input, false).await
    }

    /// Submits one input to a session here, or to the replica that drives
    /// it (unless the input was forwarded here already).
    async fn submit_routed(
        &self,
        session_id: &str,
        input: Input,
        forwarded: bool,
    ) -> Result<Submitted, Status> {
        // One retry covers an actor that stopped (store trouble) just now.
        for _ in 0..2 {
            let handle = match self.route(session_id).await? {
                Route::Here(handle) => handle,
                Route::Elsewhere(url) => {
                    return self.forward(session_id, &url, &input, forwarded).await;
                }
            };
            let (reply, answer) = oneshot::channel();
            let command = Box::new(Command::Input {
                input: input.clone(),
                reply,
            });
            if handle.commands.send(command).await.is_err() {
                continue;
            }
            match answer.await {
                // Another replica took the session over: the actor
                // stopped; route the input again.
                Ok(Err(status)) if lease_lost(&status) => continue,
                Ok(result) => return result,
                Err(_) => continue,
            }
        }
        Err(Status::unavailable(format!(
            "session {session_id} could not take the input; the session store at {} may be down",
            self.deps.store_url
        )))
    }

    /// Sends an input to the replica at `url`, which drives the session.
    async fn forward(
        &self,
        session_id: &str,
        url: &str,
        input: &Input,
        forwarded: bool,
    ) -> Result<Submitted, Status> {
        let Some(input) = crate::cluster::forwardable(input) else {
            return Err(driven_elsewhere(session_id, url));
        };
        let response = self
            .driver(session_id, url, forwarded)?
            .submit(crate::cluster::forwarded(pb::SubmitRequest {
                session_id: session_id.to_string(),
                input: Some(input),
            }))
            .await
            .map_err(|s| driver_status(session_id, url, s))?
            .into_inner();
        Ok(Submitted {
            turn_id: response.turn_id,
            seq: response.seq,
        })
    }

    /// A client of the replica at `url`, which drives `session_id`, to pass
    /// it a request (never one that was forwarded here already).
    fn driver(
        &self,
        session_id: &str,
        url: &str,
        forwarded: bool,
    ) -> Result<
        agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient<
            agentry_runtime::telemetry::TracedChannel,
        >,
        Status,
    > {
        match (&self.deps.cluster, forwarded) {
            (Some(cluster), false) => {
                crate::metrics::session_routed(&self.deps.metrics, "forwarded");
                cluster.peer(url)
            }
            _ => Err(driven_elsewhere(session_id, url)),
        }
    }

    /// A session's events from `from_seq` on, the logged ones with the
    /// live ones (streamed text) in place.
    async fn follow(
        &self,
        session_id: String,
        from_seq: u64,
    ) -> Result<ReceiverStream<Result<spb::Event, Status>>, Status> {
        // Live events are followed first: none is missed between the log's
        // replay and them.
        let local = self.deps.live.follow(&session_id);
        let logged = self.watch(session_id.clone(), from_seq).await?;
        let (remote, nudge) = match &self.deps.cluster {
            Some(cluster) => {
                let (tx, rx) = mpsc::channel(256);
                let nudge = Arc::new(tokio::sync::Notify::new());
                tokio::spawn(crate::live::follow_driver(
                    cluster.clone(),
                    self.deps.store.clone(),
                    session_id,
                    tx,
                    nudge.clone(),
                ));
                (Some(rx), Some(nudge))
            }
            None => (None, None),
        };
        Ok(ReceiverStream::new(crate::live::merge(
            logged, local, remote, from_seq, nudge,
        )))
    }

    async fn watch(
        &self,
        session_id: String,
        from_seq: u64,
    ) -> Result<Streaming<spb::Event>, Status> {
        self.deps
            .store
            .clone()
            .watch(spb::WatchRequest {
                session_id,
                from_seq,
            })
            .await
            .map(Response::into_inner)
            .map_err(|s| store_status(&self.deps.store_url, s))
    }

    /// Creates a session; with a project directory, the runners check it
    /// first (the store never records a directory they refuse), then
    /// record it once the session exists.
    async fn create(
        &self,
        session_id: String,
        title: String,
        project_dir: String,
    ) -> Result<spb::Session, Status> {
        check_client_session_id(&session_id)?;
        let project_dir = match project_dir.trim() {
            "" => String::new(),
            dir => self.open_project(&session_id, dir, true).await?.dir,
        };
        let session = self
            .deps
            .store
            .clone()
            .create_session(spb::CreateSessionRequest {
                project_dir: project_dir.clone(),
                session_id,
                title,
                parent: None,
            })
            .await
            .map(Response::into_inner)
            .map_err(|s| store_status(&self.deps.store_url, s))?;
        if !project_dir.is_empty()
            && let Err(status) = self.open_project(&session.id, &project_dir, false).await
        {
            // Nothing is left half made: the session goes with the refusal.
            let _ = self
                .deps
                .store
                .clone()
                .delete_session(spb::DeleteSessionRequest {
                    session_id: session.id.clone(),
                })
                .await;
            return Err(status);
        }
        Ok(session)
    }

    /// Asks a runner to check (or record) a session's project directory.
    async fn open_project(
        &self,
        session_id: &str,
        dir: &str,
        check_only: bool,
    ) -> Result<agentry_proto::tools::v1::OpenProjectResponse, Status> {
        let request = agentry_proto::tools::v1::OpenProjectRequest {
            // The id may still be unknown (generated by the store): any
            // valid one does for a check.
            session_id: if session_id.is_empty() {
                "new".to_string()
            } else {
                session_id.to_string()
            },
            dir: dir.to_string(),
            check_only,
        };
        self.deps
            .runners
            .on_any(|mut client| {
                let request = request.clone();
                async move { client.open_project(request).await.map(Response::into_inner) }
            })
            .await
    }

    async fn get(&self, session_id: String) -> Result<spb::Session, Status> {
        self.deps
            .store
            .clone()
            .get_session(spb::GetSessionRequest { session_id })
            .await
            .map(Response::into_inner)
            .map_err(|s| store_status(&self.deps.store_url, s))
    }
}

impl OrchestratorService {
    /// A user message with the MCP resources it mentions (`@server:uri`,
    /// for configured servers) read and attached. A mention of a server
    /// that is not configured is left as written (it may be an address);
    /// a resource that cannot be read refuses the message, saying why.
    pub async fn with_attachments(&self, session_id: &str, input: Input) -> Result<Input, Status> {
        if let Input::SetModel(name) = &input {
            self.check_model(name).await?;
            return Ok(input);
        }
        let Input::UserMessage {
            turn_id,
            text,
            approval_mode,
            plan,
            network,
            budget,
            mut images,
        } = input
        else {
            return Ok(input);
        };
        let mentions = crate::attachments::mentions(&text);
        if mentions.len() > crate::attachments::MAX_ATTACHMENTS {
            return Err(Status::invalid_argument(format!(
                "the message mentions {} resources; at most {} may be attached to one message",
                mentions.len(),
                crate::attachments::MAX_ATTACHMENTS
            )));
        }
        let mut resources = Vec::new();
        if !mentions.is_empty() {
            let servers: Vec<String> = self
                .deps
                .runners
                .list_tools()
                .await
                .map(|r| r.mcp_servers.into_iter().map(|s| s.name).collect())
                .unwrap_or_default();
            for (server, uri) in mentions {
                if !servers.contains(&server) {
                    continue;
                }
                let request = agentry_proto::tools::v1::McpReadResourceRequest {
                    session_id: session_id.to_string(),
                    server: server.clone(),
                    uri: uri.clone(),
                };
                let read = self
                    .deps
                    .runners
                    .on_any(|mut client| {
                        let request = request.clone();
                        async move {
                            client
                                .mcp_read_resource(request)
                                .await
                                .map(tonic::Response::into_inner)
                        }
                    })
                    .await
                    .map_err(|s| {
                        Status::failed_precondition(format!(
                            "cannot attach @{server}:{uri}: {}",
                            s.message()
                        ))
                    })?;
                let mut content = read.text;
                if read.truncated {
                    content.push_str("\n[cut to the tool runner's output limit]");
                }
                resources.push((server, uri, read.mime_type, content));
            }
        }
        let text = crate::attachments::attach(&text, &resources);
        let (files, mentioned) = self.attached_files(session_id, &text).await?;
        let text = crate::attachments::attach_files(&text, &files);
        images.extend(mentioned);
        check_images(&images)?;
        // The images go where the model reads them from, or nowhere.
        for image in &mut images {
            if image.mime.is_empty() {
                image.mime = agentry_runtime::images::image_type(&image.data)
                    .unwrap_or_default()
                    .to_string();
            }
        }
        if !images.is_empty() && !self.deps.view().images {
            return Err(Status::failed_precondition(format!(
                "the model {:?} is not set to take images, so the message's {} cannot be \
                 sent; if it takes images, set `llm.images = true` in the configuration, \
                 else describe the image in words",
                self.deps.llm().model(),
                if images.len() == 1 { "image" } else { "images" }
            )));
        }
        if text.len() > MAX_MESSAGE_BYTES {
            return Err(Status::invalid_argument(format!(
                "the message with its attachments is {} bytes; at most {MAX_MESSAGE_BYTES} are \
                 accepted",
                text.len()
            )));
        }
        Ok(Input::UserMessage {
            turn_id,
            text,
            approval_mode,
            plan,
            network,
            budget,
            images,
        })
    }
}

impl OrchestratorService {
    /// Refuses a model the model server does not list (when it lists its
    /// models); the configured one (empty) is always fine.
    async fn check_model(&self, name: &str) -> Result<(), Status> {
        if name.is_empty() {
            return Ok(());
        }
        let llm = self.deps.llm();
        match llm.listed_models(std::time::Duration::from_secs(5)).await {
            Ok(Some(models))
                if !models.is_empty()
                    && !models
                        .iter()
                        .any(|m| m == name || *m == format!("{name}:latest")) =>
            {
                Err(Status::failed_precondition(format!(
                    "the model server at {} does not list {name:?}; it lists: {}",
                    llm.url(),
                    models
                        .iter()
                        .take(12)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
            // Listed, not listed by this kind of server, or unreachable
            // (the next model call says so): taken as given.
            _ => Ok(()),
        }
    }

    /// The files and listings a message mentions with `@path`, read as the
    /// session by a tool runner's read_file and list_dir: (path, is a
    /// listing, content). A mention that looks like a path and cannot be
    /// read refuses the message with the reason; another word (`@alice`)
    /// is left as written unless such a file exists.
    #[allow(clippy::type_complexity)]
    async fn attached_files(
        &self,
        session_id: &str,
        text: &str,
    ) -> Result<(Vec<(String, bool, String)>, Vec<spb::Image>), Status> {
        let mentions = crate::attachments::file_mentions(text);
        if mentions.len() > crate::attachments::MAX_ATTACHMENTS {
            return Err(Status::invalid_argument(format!(
                "the message mentions {} files; at most {} may be attached to one message",
                mentions.len(),
                crate::attachments::MAX_ATTACHMENTS
            )));
        }
        let mut files = Vec::new();
        let mut images = Vec::new();
        for (n, mention) in mentions.into_iter().enumerate() {
            if !mention.dir && crate::attachments::is_image(&mention.path) {
                images.push(self.attached_image(session_id, mention.path).await?);
                continue;
            }
            // A directory named without its `/` is listed too.
            let tools: &[&str] = if mention.dir {
                &["list_dir"]
            } else {
                &["read_file", "list_dir"]
            };
            let mut result = None;
            for tool in tools {
                let request = agentry_proto::tools::v1::ExecuteRequest {
                    call_id: format!("attach-{n}"),
                    session_id: session_id.to_string(),
                    tool: tool.to_string(),
                    arguments_json: serde_json::json!({ "path": mention.path }).to_string(),
                    timeout_ms: 0,
                    network: false,
                };
                let read = self
                    .deps
                    .runners
                    .execute(request, true, |_| async { true })
                    .await;
                let done = read.as_ref().is_ok_and(|r| !r.is_error);
                // The first tool's failure is the one to tell.
                if done || result.is_none() {
                    result = Some((*tool == "list_dir", read));
                }
                if done {
                    break;
                }
            }
            let Some((listing, result)) = result else {
                continue;
            };
            match result {
                Ok(read) if !read.is_error => {
                    files.push((mention.path, listing, read.output));
                }
                Ok(_) | Err(_) if !mention.clearly_a_path => {}
                Ok(read) => {
                    return Err(Status::failed_precondition(format!(
                        "cannot attach @{}: {} (to send the word as written, put it in \
                         quotes)",
                        mention.path, read.output
                    )));
                }
                Err(failure) => {
                    return Err(Status::unavailable(format!(
                        "cannot attach @{}: {}",
                        mention.path, failure.message
                    )));
                }
            }
        }
        Ok((files, images))
    }

    /// The image a message mentions with `@path`, read as the session by a
    /// tool runner.
    async fn attached_image(&self, session_id: &str, path: String) -> Result<spb::Image, Status> {
        if !self.deps.view().images {
            return Err(Status::failed_precondition(format!(
                "@{path} is an image, and the model {:?} is not set to take images; if it \
                 takes images, set `llm.images = true` in the configuration, else describe \
                 the image in words",
                self.deps.llm().model()
            )));
        }
        let request = agentry_proto::tools::v1::ReadImageRequest {
            session_id: session_id.to_string(),
            path: path.clone(),
        };
        let read = self
            .deps
            .runners
            .on_any(|mut client| {
                let request = request.clone();
                async move {
                    client
                        .read_image(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await
            .map_err(|s| {
                let why = format!("cannot attach @{path}: {}", s.message());
                match s.code() {
                    tonic::Code::Unavailable => Status::unavailable(why),
                    _ => Status::failed_precondition(why),
                }
            })?;
        Ok(spb::Image {
            path,
            mime: read.mime,
            data: read.data,
        })
    }
}

/// Images a client sent with a message: each of a kind the model servers
/// take (its first bytes tell; the media type given must agree), within
/// the size limits.
fn check_images(images: &[spb::Image]) -> Result<(), Status> {
    use agentry_runtime::images::{MAX_IMAGE_BYTES, MAX_MESSAGE_IMAGE_BYTES, image_type};
    if images.len() > crate::attachments::MAX_ATTACHMENTS {
        return Err(Status::invalid_argument(format!(
            "the message has {} images; at most {} may be sent with one message",
            images.len(),
            crate::attachments::MAX_ATTACHMENTS
        )));
    }
    let mut total = 0u64;
    for (n, image) in images.iter().enumerate() {
        let name = if image.path.is_empty() {
            format!("image {}", n + 1)
        } else {
            image.path.clone()
        };
        if image.data.len() as u64 > MAX_IMAGE_BYTES {
            return Err(Status::invalid_argument(format!(
                "{name} is {} bytes; an image may have at most {MAX_IMAGE_BYTES}",
                image.data.len()
            )));
        }
        match image_type(&image.data) {
            Some(kind) if image.mime.is_empty() || image.mime == kind => {}
            Some(kind) => {
                return Err(Status::invalid_argument(format!(
                    "{name} is said to be {} but is {kind}",
                    image.mime
                )));
            }
            None => {
                return Err(Status::invalid_argument(format!(
                    "{name} is not a PNG, JPEG, GIF or WebP image, the kinds model servers take"
                )));
            }
        }
        total += image.data.len() as u64;
    }
    if total > MAX_MESSAGE_IMAGE_BYTES {
        return Err(Status::invalid_argument(format!(
            "the message's images have {total} bytes in all; at most \
             {MAX_MESSAGE_IMAGE_BYTES} may be sent with one message"
        )));
    }
    Ok(())
}

/// A session id a client may choose: not one of the sub-agents' tasks.
pub(crate) fn check_client_session_id(session_id: &str) -> Result<(), Status> {
    if session_id.starts_with(crate::agents::TASK_PREFIX) {
        return Err(Status::invalid_argument(
            "session ids starting with \"sub-\" are the sub-agents' tasks; choose another id",
        ));
    }
    Ok(())
}

/// Why an input does not go to `url`, the replica driving `session_id`.
fn driven_elsewhere(session_id: &str, url: &str) -> Status {
    agentry_runtime::reasons::with_metadata(
        tonic::Code::FailedPrecondition,
        agentry_runtime::reasons::Reason::DrivenElsewhere,
        format!("session {session_id} is driven by the orchestrator at {url}"),
        std::collections::HashMap::from([("url".to_string(), url.to_string())]),
    )
}

/// A failure of the replica driving `session_id`, as the client sees it.
fn driver_status(session_id: &str, url: &str, status: Status) -> Status {
    match status.code() {
        tonic::Code::Unavailable => Status::unavailable(format!(
            "the orchestrator driving session {session_id} at {url} does not answer ({}); \
             another replica takes the session over within seconds: try again",
            status.message()
        )),
        _ => status,
    }
}

/// Whether an append was refused because another replica drives the
/// session now.
fn lease_lost(status: &Status) -> bool {
    agentry_runtime::reasons::reason_of(status) == agentry_runtime::reasons::Reason::LeaseLost
}

/// The id of a turn an input starts.
pub fn new_turn_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Checks an input from a client and turns it into the reducer's input:
/// the one type from the wire to the state machine.
fn parse_input(input: Option<pb::Input>) -> Result<Input, Status> {
    let kind = input.and_then(|i| i.kind).ok_or_else(|| {
        Status::invalid_argument("the input is empty: set user_message, approval or cancel")
    })?;
    match kind {
        pb::input::Kind::UserMessage(m) if m.compact => {
            let text = if m.text.trim().is_empty() {
                "/compact".to_string()
            } else {
                m.text.chars().take(1000).collect()
            };
            Ok(Input::Compact {
                turn_id: new_turn_id(),
                text,
            })
        }
        pb::input::Kind::UserMessage(m) => {
            if m.text.trim().is_empty() {
                return Err(Status::invalid_argument("the message is empty"));
            }
            if m.text.len() > MAX_MESSAGE_BYTES {
                return Err(Status::invalid_argument(format!(
                    "the message is {} bytes; at most {MAX_MESSAGE_BYTES} are accepted",
                    m.text.len()
                )));
            }
            check_images(&m.images)?;
            Ok(Input::UserMessage {
                turn_id: new_turn_id(),
                text: m.text,
                approval_mode: spb::ApprovalMode::try_from(m.approval_mode)
                    .unwrap_or(spb::ApprovalMode::Policy),
                plan: m.plan,
                network: m.network,
                budget: m.budget,
                images: m.images,
            })
        }
        pb::input::Kind::Cancel(c) => Ok(Input::Cancel { reason: c.reason }),
        pb::input::Kind::Model(m) => {
            let name = m.name.trim().to_string();
            if name.len() > 200 || name.chars().any(char::is_control) {
                return Err(Status::invalid_argument(
                    "a model name has at most 200 characters and no control characters",
                ));
            }
            Ok(Input::SetModel(name))
        }
        pb::input::Kind::Approval(a) => {
            if a.call_id.is_empty() {
                return Err(Status::invalid_argument("the approval names no call_id"));
            }
            let decision = spb::ApprovalDecision::try_from(a.decision).map_err(|_| {
                Status::invalid_argument(format!("unknown approval decision {}", a.decision))
            })?;
            Ok(Input::Approval {
                call_id: a.call_id,
                decision,
                reason: a.reason,
                edited_arguments_json: a.edited_arguments_json,
            })
        }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Orchestrator for OrchestratorService {
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<spb::Session>, Status> {
        let req = request.into_inner();
        Ok(Response::new(
            self.create(req.session_id, req.title, req.project_dir)
                .await?,
        ))
    }

    async fn rename_session(
        &self,
        request: Request<spb::RenameSessionRequest>,
    ) -> Result<Response<spb::Session>, Status> {
        self.deps
            .store
            .clone()
            .rename_session(request.into_inner())
            .await
            .map_err(|s| store_status(&self.deps.store_url, s))
    }

    async fn delete_session(
        &self,
        request: Request<spb::DeleteSessionRequest>,
    ) -> Result<Response<spb::DeleteSessionResponse>, Status> {
        let session_id = request.into_inner().session_id;
        let session = self.get(session_id.clone()).await?;
        if session.turn_open {
            return Err(Status::failed_precondition(format!(
                "session {session_id} has a turn open; cancel it first (Ctrl+C in its chat, \
                 or answer what it waits for in `agentry approvals`), then delete it"
            )));
        }
        // Its sub-agents' tasks go with it, first.
        let mut doomed: Vec<String> = self
            .deps
            .all_sessions(false)
            .await?
            .into_iter()
            .filter(|s| {
                s.parent
                    .as_ref()
                    .is_some_and(|p| p.session_id == session_id)
            })
            .map(|s| s.id)
            .collect();
        doomed.push(session_id);
        let mut deleted_events = 0;
        for id in doomed {
            self.unload(&id).await;
            match self
                .deps
                .store
                .clone()
                .delete_session(spb::DeleteSessionRequest {
                    session_id: id.clone(),
                })
                .await
            {
                Ok(r) => deleted_events += r.into_inner().deleted_events,
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) => return Err(store_status(&self.deps.store_url, status)),
            }
            // What the runners keep for it; a runner that cannot be reached
            // leaves a workspace behind, which is said, not fatal.
            if let Err(status) = self.deps.forget_session(&id).await {
                tracing::warn!(session_id = %id, error = %status.message(), "the session was deleted, but its workspace could not be removed");
            }
        }
        Ok(Response::new(spb::DeleteSessionResponse { deleted_events }))
    }

    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<spb::Session>, Status> {
        Ok(Response::new(
            self.get(request.into_inner().session_id).await?,
        ))
    }

    async fn list_sessions(
        &self,
        request: Request<spb::ListSessionsRequest>,
    ) -> Result<Response<spb::ListSessionsResponse>, Status> {
        self.deps
            .store
            .clone()
            .list_sessions(request.into_inner())
            .await
            .map_err(|s| store_status(&self.deps.store_url, s))
    }

    async fn submit(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        let forwarded = crate::cluster::was_forwarded(&request);
        let req = request.into_inner();
        let input = parse_input(req.input)?;
        // A forwarded input had its attachments read where it arrived.
        let input = if forwarded {
            input
        } else {
            self.with_attachments(&req.session_id, input).await?
        };
        let submitted = self
            .submit_routed(&req.session_id, input, forwarded)
            .await?;
        Ok(Response::new(pb::SubmitResponse {
            turn_id: submitted.turn_id,
            seq: submitted.seq,
        }))
    }

    type SubscribeStream = BoxStream<spb::Event>;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let req = request.into_inner();
        if req.live_only {
            let feed = self.deps.live.follow(&req.session_id);
            return Ok(Response::new(Box::pin(ReceiverStream::new(
                crate::live::live_only(feed),
            ))));
        }
        let events = self.follow(req.session_id, req.from_seq).await?;
        Ok(Response::new(Box::pin(events)))
    }

    type ChatStream = BoxStream<pb::ChatResponse>;

    async fn chat(
        &self,
        request: Request<Streaming<pb::ChatRequest>>,
    ) -> Result<Response<Self::ChatStream>, Status> {
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the chat stream closed before attaching"))?;
        let Some(pb::chat_request::Kind::Attach(attach)) = first.kind else {
            return Err(Status::invalid_argument(
                "the first message of a chat stream must be `attach`",
            ));
        };
        let session = match (attach.create, attach.session_id.is_empty()) {
            (true, true) => {
                self.create(String::new(), String::new(), attach.project_dir)
                    .await?
            }
            (true, false) => match self.get(attach.session_id.clone()).await {
                Err(status) if status.code() == tonic::Code::NotFound => {
                    self.create(attach.session_id, String::new(), attach.project_dir)
                        .await?
                }
                other => other?,
            },
            (false, _) => self.get(attach.session_id).await?,
        };
        let events = self.follow(session.id.clone(), attach.from_seq).await?;
        let (tx, rx) = mpsc::channel(256);
        let _ = tx
            .send(Ok(pb::ChatResponse {
                kind: Some(pb::chat_response::Kind::Attached(session.clone())),
            }))
            .await;
        // Forward the session's events.
        let events_tx = tx.clone();
        tokio::spawn(async move {
            let mut events = events;
            loop {
                // A client that left an idle session is noticed now, not at
                // the session's next event: its watch ends with it.
                let item = tokio::select! {
                    item = events.next() => item,
                    () = events_tx.closed() => return,
                };
                let Some(item) = item else { return };
                let message = item.map(|event| pb::ChatResponse {
                    kind: Some(pb::chat_response::Kind::Event(event)),
                });
                if events_tx.send(message).await.is_err() {
                    return;
                }
            }
        });
        // Take inputs until the client closes its side.
        let this = self.clone();
        let session_id = session.id;
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                let outcome = match message.kind {
                    Some(pb::chat_request::Kind::Input(input)) => match parse_input(Some(input)) {
                        Ok(input) => match this.with_attachments(&session_id, input).await {
                            Ok(input) => this.submit_input(&session_id, input).await.map(|_| ()),
                            Err(status) => Err(status),
                        },
                        Err(status) => Err(status),
                    },
                    Some(pb::chat_request::Kind::Attach(_)) => Err(Status::invalid_argument(
                        "this chat stream is already attached",
                    )),
                    None => Err(Status::invalid_argument("empty chat message")),
                };
                if let Err(status) = outcome {
                    let rejected = pb::ChatResponse {
                        kind: Some(pb::chat_response::Kind::Rejected(pb::InputRejected {
                            code: status.code() as i32,
                            message: status.message().to_string(),
                        })),
                    };
                    if tx.send(Ok(rejected)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        let limit = match request.into_inner().sessions {
            0 => 200,
            n => n.min(1000),
        };
        let mut approvals = Vec::new();
        for session in self.recent_sessions(limit, true).await? {
            let events = self.read_log(&session.id).await?;
            approvals.extend(crate::inbox::pending(&session, &events));
        }
        approvals.sort_by_key(|p| p.asked_at.map(|t| (t.seconds, t.nanos)));
        Ok(Response::new(pb::ListApprovalsResponse { approvals }))
    }

    async fn fork_session(
        &self,
        request: Request<pb::ForkSessionRequest>,
    ) -> Result<Response<pb::ForkSessionResponse>, Status> {
        let request = request.into_inner();
        check_client_session_id(&request.new_session_id)?;
        // A directory is checked before anything is made, and recorded
        // once the fork exists (which goes with a refusal).
        let project_dir = match request.dir.trim() {
            "" => String::new(),
            dir => self.open_project("", dir, true).await?.dir,
        };
        let forked = crate::forks::fork(&self.deps, request, project_dir.clone()).await?;
        if !project_dir.is_empty() {
            let id = forked
                .session
                .as_ref()
                .map(|s| s.id.clone())
                .unwrap_or_default();
            if let Err(status) = self.open_project(&id, &project_dir, false).await {
                let _ = self
                    .deps
                    .store
                    .clone()
                    .delete_session(spb::DeleteSessionRequest { session_id: id })
                    .await;
                return Err(status);
            }
        }
        Ok(Response::new(forked))
    }

    async fn rewind_session(
        &self,
        request: Request<pb::RewindSessionRequest>,
    ) -> Result<Response<pb::RewindSessionResponse>, Status> {
        let forwarded = crate::cluster::was_forwarded(&request);
        let req = request.into_inner();
        loop {
            let handle = match self.route(&req.session_id).await? {
                Route::Here(handle) => handle,
                Route::Elsewhere(url) => {
                    return self
                        .driver(&req.session_id, &url, forwarded)?
                        .rewind_session(crate::cluster::forwarded(req.clone()))
                        .await
                        .map_err(|s| driver_status(&req.session_id, &url, s));
                }
            };
            let (reply, answer) = oneshot::channel();
            let command = Box::new(Command::Rewind {
                to_turn: req.to_turn,
                with_files: !req.conversation_only,
                reply,
            });
            if handle.commands.send(command).await.is_err() {
                continue; // The actor stopped: load the session again.
            }
            return match answer.await {
                Ok(result) => result.map(Response::new),
                Err(_) => Err(Status::unavailable(
                    "the session stopped during the rewind; look at it and try again",
                )),
            };
        }
    }

    async fn preview_call(
        &self,
        request: Request<pb::PreviewCallRequest>,
    ) -> Result<Response<agentry_proto::tools::v1::PreviewResponse>, Status> {
        let req = request.into_inner();
        // Only a call of this session that waits for a person: the
        // preview reads the workspace, and is no way to read it with
        // arguments nobody asked about.
        let events = self.read_log(&req.session_id).await?;
        let session = spb::Session {
            id: req.session_id.clone(),
            ..Default::default()
        };
        let pending = crate::inbox::pending(&session, &events)
            .into_iter()
            .find(|p| p.call_id == req.call_id)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "no call {:?} waits for approval in session {}",
                    req.call_id, req.session_id
                ))
            })?;
        if !matches!(pending.tool.as_str(), "write_file" | "edit_file") {
            return Err(Status::invalid_argument(format!(
                "{} calls have no preview; only write_file and edit_file do",
                pending.tool
            )));
        }
        let request = agentry_proto::tools::v1::PreviewRequest {
            session_id: req.session_id,
            tool: pending.tool,
            arguments_json: pending.arguments_json,
        };
        self.deps
            .runners
            .on_any(|mut client| {
                let request = request.clone();
                async move { client.preview(request).await.map(Response::into_inner) }
            })
            .await
            .map(Response::new)
    }

    async fn prune_snapshots(
        &self,
        request: Request<pb::PruneSnapshotsRequest>,
    ) -> Result<Response<agentry_proto::tools::v1::PruneSnapshotsResponse>, Status> {
        let dry_run = request.into_inner().dry_run;
        // Every session that exists: the snapshots of the others go.
        let mut sessions: Vec<String> = self
            .deps
            .all_sessions(false)
            .await?
            .into_iter()
            .map(|s| s.id)
            .collect();
        // The listing pages by recency, so a session active meanwhile may
        // have been missed: every session the runner would drop is asked
        // about on its own first, and only those the store does not have
        // lose their snapshots.
        let prune = |sessions: Vec<String>, dry_run: bool| {
            let request = agentry_proto::tools::v1::PruneSnapshotsRequest {
                sessions,
                sessions_listed: true,
                dry_run,
            };
            async move {
                self.deps
                    .runners
                    .on_any(|mut client| {
                        let request = request.clone();
                        async move { client.prune_snapshots(request).await }
                    })
                    .await
            }
        };
        let candidates = prune(sessions.clone(), true).await?.into_inner();
        for id in candidates.unlisted_sessions {
            match self
                .deps
                .store
                .clone()
                .get_session(spb::GetSessionRequest {
                    session_id: id.clone(),
                })
                .await
            {
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Ok(_) => sessions.push(id),
                Err(status) => return Err(store_status(&self.deps.store_url, status)),
            }
        }
        prune(sessions, dry_run).await
    }

    async fn list_decisions(
        &self,
        request: Request<pb::ListDecisionsRequest>,
    ) -> Result<Response<pb::ListDecisionsResponse>, Status> {
        let limit = match request.into_inner().sessions {
            0 => 100,
            n => n.min(1000),
        };
        let sessions = self.recent_sessions(limit, false).await?;
        let mut decisions = Vec::new();
        for session in &sessions {
            let events = self.read_log(&session.id).await?;
            decisions.extend(crate::inbox::decisions(&session.id, &events));
        }
        Ok(Response::new(pb::ListDecisionsResponse {
            decisions,
            sessions: sessions.len() as u32,
        }))
    }

    async fn list_tools(
        &self,
        request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        let project_dir = request.into_inner().project_dir;
        let specs = self.deps.runners.list_tools().await.map_err(|s| {
            Status::unavailable(format!(
                "cannot list tools from the tool runner at {}: {}",
                self.deps.runners.configured,
                s.message()
            ))
        })?;
        let mcp_servers = specs.mcp_servers;
        let tools = specs
            .tools
            .into_iter()
            .map(|t| pb::ToolInfo {
                name: t.name,
                description: t.description,
                parameters_json_schema: t.parameters_json_schema,
                read_only: t.read_only,
                sensitive: t.sensitive,
                mcp_server: t.mcp_server,
                read_only_hint: t.read_only_hint,
            })
            .collect();
        let view = self.deps.view();
        // What the next model call is offered: asked again now.
        self.deps.forget_tools().await;
        let catalog = self.deps.tools().await;
        // The instruction files a session started in `project_dir` gets.
        let (instructions, instructions_note) = if project_dir.trim().is_empty() {
            (Vec::new(), String::new())
        } else {
            let request = agentry_proto::tools::v1::ReadInstructionsRequest {
                session_id: String::new(),
                dir: project_dir,
            };
            match self.deps.instructions(request).await {
                Ok(files) => (files, String::new()),
                Err(status) => (Vec::new(), status.message().to_string()),
            }
        };
        let prompt = crate::prompt::build(
            crate::prompt::Parts {
                system_prompt: &view.system_prompt,
                instructions: &instructions,
                extra: &[],
                tools: &catalog.definitions,
                tools_tokens: catalog.tokens(&view.tokenizer),
                plan_mode: false,
                native: view.native,
                lean: view.lean,
                skillset: "",
                require_tool: false,
            },
            &view.tokenizer,
        );
        let to_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Ok(Response::new(pb::ListToolsResponse {
            tools,
            context_window: to_u32(view.compaction.context_window),
            window_source: view.compaction.window_source.clone(),
            fixed_tokens: to_u32(prompt.tokens(&view.tokenizer)),
            lean: view.lean,
            mcp_servers,
            instructions: instructions
                .into_iter()
                .map(|f| agentry_proto::sessions::v1::InstructionFile {
                    text: String::new(),
                    ..f
                })
                .collect(),
            instructions_note,
            model_problem: self.deps.model_problem().unwrap_or_default(),
        }))
    }
}
