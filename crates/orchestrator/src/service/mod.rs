//! The sessions a replica drives ([`Sessions`]: the registry of session
//! actors) and the gRPC face of the orchestrator, which is that handle.

use crate::actor::{Actor, Command, SessionHandle, Submitted};
use crate::cluster::Driver;
use crate::deps::Deps;
use crate::reducer::Input;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::orchestrator::v1::orchestrator_server::Orchestrator;
use agentry_proto::sessions::v1 as spb;
use agentry_runtime::auth::{Principal, Role};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

mod inputs;
mod routing;

pub use inputs::new_turn_id;
use inputs::{allowed, parse_input};
use routing::driver_status;

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

/// The sessions this replica drives: one handle that the gRPC service is
/// and that the delegate tool drives sub-agents' sessions through (submit,
/// follow), as any client would. Each session's actor holds a clone (so a
/// task can start its own tasks); [`Sessions::drop_sessions`] ends them all
/// when the service stops.
#[derive(Clone)]
pub struct Sessions {
    deps: Arc<Deps>,
    settings: Arc<crate::settings::Settings>,
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

impl Sessions {
    /// A service calling the other services with `deps`, running sessions
    /// with `settings`.
    pub fn new(deps: Arc<Deps>, settings: Arc<crate::settings::Settings>) -> Self {
        Self {
            deps,
            settings,
            sessions: Arc::default(),
        }
    }

    /// Loads a session's actor here (recovering an interrupted turn) unless
    /// another replica drives it.
    pub(crate) async fn wake(&self, session_id: &str) -> Result<(), Status> {
        self.route(session_id).await.map(|_| ())
    }

    /// Makes the session a scheduled run works in (already made: fine), as
    /// `agent` when one is named.
    pub(crate) async fn create_session_for_run(
        &self,
        session_id: &str,
        title: String,
        project_dir: String,
        agent: &str,
    ) -> Result<(), Status> {
        let parent = (!agent.is_empty()).then(|| spb::SessionParent {
            session_id: String::new(),
            call_id: String::new(),
            agent: agent.to_string(),
        });
        match self
            .create_as(session_id.to_string(), title, project_dir, parent, true)
            .await
        {
            Ok(_) => Ok(()),
            Err(status) if status.code() == tonic::Code::AlreadyExists => Ok(()),
            Err(status) => Err(status),
        }
    }

    /// One session, as the store has it.
    pub(crate) async fn get_session(&self, session_id: &str) -> Result<spb::Session, Status> {
        self.get(session_id.to_string()).await
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
        self.create_as(session_id, title, project_dir, None, false)
            .await
    }

    /// Makes a session; `parent` names the agent a scheduled run works as
    /// (`own`: an id the orchestrator chose, not a client).
    async fn create_as(
        &self,
        session_id: String,
        title: String,
        project_dir: String,
        parent: Option<spb::SessionParent>,
        own: bool,
    ) -> Result<spb::Session, Status> {
        if !own {
            check_client_session_id(&session_id)?;
        }
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
                parent,
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

/// A session id a client may choose: not one of the sub-agents' tasks.
pub(crate) fn check_client_session_id(session_id: &str) -> Result<(), Status> {
    if session_id.starts_with(crate::agents::TASK_PREFIX) {
        return Err(Status::invalid_argument(
            "session ids starting with \"sub-\" are the sub-agents' tasks; choose another id",
        ));
    }
    if session_id.starts_with(crate::agents::AGENT_RUN_PREFIX) {
        return Err(Status::invalid_argument(
            "session ids starting with \"run-as-\" are scheduled runs of agents; choose another id",
        ));
    }
    Ok(())
}

pub(crate) type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Orchestrator for Sessions {
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
        let by = Principal::of(request.extensions()).cloned();
        let mut req = request.into_inner();
        // Checked where it arrives, passed on as received.
        let input = parse_input(req.input.clone(), by.as_ref())?;
        allowed(by.as_ref(), req.input.as_ref())?;
        // A message that interrupts: the running turn is cancelled first
        // (none running: nothing to cancel), then the message starts one.
        if let Some(pb::input::Kind::UserMessage(m)) =
            req.input.as_mut().and_then(|i| i.kind.as_mut())
            && m.interrupt
        {
            m.interrupt = false;
            let cancel = pb::Input {
                kind: Some(pb::input::Kind::Cancel(pb::CancelInput {
                    reason: "interrupted by a new message".into(),
                })),
            };
            match self
                .submit_routed(
                    &req.session_id,
                    crate::reducer::Input::Cancel {
                        reason: "interrupted by a new message".into(),
                    },
                    Some(&cancel),
                    forwarded,
                    by.as_ref(),
                )
                .await
            {
                Ok(_) => {}
                Err(status)
                    if agentry_runtime::reasons::reason_of(&status)
                        == agentry_runtime::reasons::Reason::NoTurnRunning => {}
                Err(status) => return Err(status),
            }
        }
        let submitted = self
            .submit_routed(
                &req.session_id,
                input,
                req.input.as_ref(),
                forwarded,
                by.as_ref(),
            )
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
        let by = Principal::of(request.extensions()).cloned();
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
                    Some(pb::chat_request::Kind::Input(received)) => {
                        match parse_input(Some(received.clone()), by.as_ref())
                            .and_then(|input| allowed(by.as_ref(), Some(&received)).map(|()| input))
                        {
                            Ok(input) => this
                                .submit_routed(
                                    &session_id,
                                    input,
                                    Some(&received),
                                    false,
                                    by.as_ref(),
                                )
                                .await
                                .map(|_| ()),
                            Err(status) => Err(status),
                        }
                    }
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
        let mut parked = Vec::new();
        for session in self.recent_sessions(limit, true).await? {
            let events = self.read_log(&session.id).await?;
            approvals.extend(crate::inbox::pending(&session, &events));
            parked.extend(crate::inbox::parked(&session, &events));
        }
        approvals.sort_by_key(|p| p.asked_at.map(|t| (t.seconds, t.nanos)));
        parked.sort_by_key(|p| p.parked_at.map(|t| (t.seconds, t.nanos)));
        Ok(Response::new(pb::ListApprovalsResponse {
            approvals,
            parked,
        }))
    }

    async fn fork_session(
        &self,
        request: Request<pb::ForkSessionRequest>,
    ) -> Result<Response<pb::ForkSessionResponse>, Status> {
        let by = Principal::of(request.extensions()).map(|p| p.name.clone());
        let request = request.into_inner();
        check_client_session_id(&request.new_session_id)?;
        // A directory is checked before anything is made, and recorded
        // once the fork exists (which goes with a refusal).
        let project_dir = match request.dir.trim() {
            "" => String::new(),
            dir => self.open_project("", dir, true).await?.dir,
        };
        let forked =
            crate::forks::fork(&self.deps, &self.settings, request, project_dir.clone(), by)
                .await?;
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

    async fn set_session_mcp_servers(
        &self,
        request: Request<pb::SetSessionMcpServersRequest>,
    ) -> Result<Response<pb::SetSessionMcpServersResponse>, Status> {
        let forwarded = crate::cluster::was_forwarded(&request);
        let by = Principal::of(request.extensions()).cloned();
        let req = request.into_inner();
        if !self.settings.session_mcp_servers {
            return Err(Status::failed_precondition(
                "sessions may not bring MCP servers of their own here (mcp.session_servers is \
                 off); the MCP servers of the configuration are offered",
            ));
        }
        // The replica that drives the session offers its tools.
        if let Route::Elsewhere(url) = self.route(&req.session_id).await? {
            return self
                .driver(&req.session_id, &url, forwarded)?
                .set_session_mcp_servers(crate::cluster::forwarded(req.clone(), by.as_ref()))
                .await
                .map_err(|s| driver_status(&req.session_id, &url, s));
        }
        let set = self
            .deps
            .runners
            .set_session_servers(agentry_proto::tools::v1::McpSessionServersRequest {
                session_id: req.session_id.clone(),
                servers: req.servers,
            })
            .await?;
        let tools = set.tools.iter().map(|t| t.name.clone()).collect();
        self.deps.set_session_tools(&req.session_id, set.tools);
        Ok(Response::new(pb::SetSessionMcpServersResponse {
            tools,
            errors: set.errors,
        }))
    }

    async fn rewind_session(
        &self,
        request: Request<pb::RewindSessionRequest>,
    ) -> Result<Response<pb::RewindSessionResponse>, Status> {
        let forwarded = crate::cluster::was_forwarded(&request);
        let by = Principal::of(request.extensions()).cloned();
        let req = request.into_inner();
        // One retry covers an actor that ended (idle, or store trouble)
        // just as the rewind reached it.
        for _ in 0..2 {
            let handle = match self.route(&req.session_id).await? {
                Route::Here(handle) => handle,
                Route::Elsewhere(url) => {
                    return self
                        .driver(&req.session_id, &url, forwarded)?
                        .rewind_session(crate::cluster::forwarded(req.clone(), by.as_ref()))
                        .await
                        .map_err(|s| driver_status(&req.session_id, &url, s));
                }
            };
            let (reply, answer) = oneshot::channel();
            let command = Box::new(Command::Rewind {
                to_turn: req.to_turn,
                with_files: !req.conversation_only,
                by: by.as_ref().map(|p| p.name.clone()),
                reply,
            });
            if handle.commands.send(command).await.is_err() {
                continue; // The actor stopped: load the session again.
            }
            // No answer: the actor ended without reading it (it answers
            // every rewind it starts, even one the store refuses).
            if let Ok(result) = answer.await {
                return result.map(Response::new);
            }
        }
        Err(Status::unavailable(
            "the session stopped during the rewind; look at it and try again",
        ))
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
                network: t.network,
            })
            .collect();
        let view = self.settings.view();
        // What the next model call is offered: asked again now.
        self.deps.forget_tools().await;
        let catalog = self.deps.tools(&self.settings.agents).await;
        // The instruction files a session started in `project_dir` gets.
        let (instructions, instructions_note) = if project_dir.trim().is_empty() {
            (Vec::new(), String::new())
        } else {
            let request = agentry_proto::tools::v1::ReadInstructionsRequest {
                session_id: String::new(),
                dir: project_dir,
            };
            match self
                .deps
                .instructions(view.own_instructions.as_deref(), request)
                .await
            {
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
