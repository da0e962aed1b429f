//! `agentry acp`: Agentry as an agent of the Agent Client Protocol (v1) on
//! standard input and output, for editors that host agents (Zed,
//! JetBrains IDEs, Neovim's CodeCompanion, Emacs).
//!
//! A thin adapter: each ACP session is an Agentry session, driven over the
//! orchestrator's gRPC API with the person's token like the chats. One
//! follower per session folds its events into the shared
//! [`SessionView`] and sends the editor what changed ([`updates::Sent`]):
//! answers as they stream, tool calls with their status and output, the
//! plan. A call that needs a person becomes `session/request_permission`,
//! and the editor's answer an approval like any other (recorded as the
//! person's). The session is durable: an editor restarted, or a dropped
//! connection, loses nothing (`session/load` replays it all).

mod updates;

use crate::turn::{Follower, Limits, Mode, Notice, Place, notices, open_session, user_input};
use crate::{Approve, autostart};
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, AuthMethod, AuthMethodAgent, AuthenticateRequest, AuthenticateResponse,
    CancelNotification, ContentBlock, ContentChunk, EmbeddedResourceResource, Implementation,
    InitializeRequest, InitializeResponse, ListSessionsRequest, ListSessionsResponse,
    LoadSessionRequest, LoadSessionResponse, NewSessionRequest, NewSessionResponse,
    PermissionOption, PermissionOptionKind, PromptCapabilities, PromptRequest, PromptResponse,
    RequestPermissionOutcome, RequestPermissionRequest, SessionCapabilities, SessionInfo,
    SessionListCapabilities, SessionMode, SessionModeState, SessionNotification, SessionUpdate,
    SetSessionModeRequest, SetSessionModeResponse, StopReason, ToolCall, ToolCallContent,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields,
};
use agent_client_protocol::{Agent, Client, Error as AcpError, ErrorCode, Stdio};
use agentry_client::text::{approvers, images_shown, short_args};
use agentry_client::view::SessionView;
use agentry_proto::orchestrator::v1::{self as pb, orchestrator_client::OrchestratorClient};
use agentry_proto::sessions::v1::{self as spb, event::Kind};
use agentry_proto::tools::v1 as tpb;
use agentry_runtime::Config;
use agentry_runtime::telemetry::TracedChannel;
use base64::Engine as _;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;
use updates::{Sent, editor_text};

type Connection = agent_client_protocol::v1::ConnectionTo<Client>;
type Orchestrator = OrchestratorClient<TracedChannel>;

/// The auth method an editor names in `authenticate`.
const TOKEN_METHOD: &str = "agentry-token";
/// The modes a session may be in.
const DEFAULT_MODE: &str = "default";
const PLAN_MODE: &str = "plan";

/// Serves ACP on standard input and output until the editor closes them.
/// The services are started for the editor when none answer (and stopped
/// when it goes), as for a chat.
pub async fn acp(config: &Config, network: bool) -> anyhow::Result<()> {
    let _services = autostart::ensure(config).await?;
    let state = Arc::new(State {
        config: Mutex::new(config.clone()),
        client: tokio::sync::Mutex::new(None),
        sessions: Mutex::new(HashMap::new()),
        network,
    });
    let on_new = state.clone();
    let on_load = state.clone();
    let on_prompt = state.clone();
    let on_cancel = state.clone();
    let on_mode = state.clone();
    let on_list = state.clone();
    let on_auth = state;
    let serve = Agent
        .v1()
        .name("agentry")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                responder.respond(initialize(&request))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: AuthenticateRequest, responder, _cx| {
                let state = on_auth.clone();
                tokio::spawn(async move {
                    let _ = responder.respond_with_result(state.authenticate(request).await);
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, cx| {
                let state = on_new.clone();
                tokio::spawn(async move {
                    match state.new_session(request, &cx).await {
                        Ok((response, note)) => {
                            let id = response.session_id.0.to_string();
                            let _ = responder.respond(response);
                            if let Some(note) = note {
                                say(&cx, &id, &note);
                            }
                        }
                        Err(e) => {
                            let _ = responder.respond_with_error(e);
                        }
                    }
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx| {
                let state = on_load.clone();
                tokio::spawn(async move {
                    let _ = responder.respond_with_result(state.load_session(request, &cx).await);
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, _cx| {
                let state = on_prompt.clone();
                tokio::spawn(async move {
                    let _ = responder.respond_with_result(state.prompt(request).await);
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notice: CancelNotification, _cx| {
                let state = on_cancel.clone();
                tokio::spawn(async move { state.cancel(&notice.session_id.0).await });
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: ListSessionsRequest, responder, _cx| {
                let state = on_list.clone();
                tokio::spawn(async move {
                    let _ = responder.respond_with_result(state.list_sessions(request).await);
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: SetSessionModeRequest, responder, _cx| {
                responder.respond_with_result(on_mode.set_mode(&request))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_to(Stdio::new());
    // The editor ends the agent by closing its input, or with a signal:
    // either way the services started for it stop with it.
    tokio::select! {
        served = serve => served.map_err(|e| anyhow::anyhow!("the editor's connection failed: {e}")),
        () = agentry_runtime::shutdown_signal() => Ok(()),
    }
}

fn initialize(request: &InitializeRequest) -> InitializeResponse {
    // Version 1 is the one spoken; an editor asking for a later one is
    // answered with it, and decides.
    let version = if request.protocol_version < ProtocolVersion::V1 {
        request.protocol_version
    } else {
        ProtocolVersion::V1
    };
    let token = AuthMethodAgent::new(TOKEN_METHOD, "Agentry token").description(
        "A person's token (`agentry users add NAME` prints one): set AGENTRY_TOKEN in the \
         agent's environment, or pass it as _meta.token of authenticate. Without one, the \
         token of the user the services run as is used when it can be read."
            .to_string(),
    );
    InitializeResponse::new(version)
        .agent_capabilities(
            AgentCapabilities::new()
                .load_session(true)
                .session_capabilities(
                    SessionCapabilities::new().list(SessionListCapabilities::new()),
                )
                .prompt_capabilities(PromptCapabilities::new().image(true).embedded_context(true)),
        )
        .auth_methods(vec![AuthMethod::Agent(token)])
        .agent_info(
            Implementation::new("agentry", env!("CARGO_PKG_VERSION")).title("Agentry".to_string()),
        )
}

/// An ACP error with a message (the code from the gRPC status).
fn rpc_error(what: &str, status: &tonic::Status) -> AcpError {
    let code = match status.code() {
        tonic::Code::Unauthenticated => ErrorCode::AUTH_REQUIRED,
        tonic::Code::NotFound | tonic::Code::InvalidArgument => ErrorCode::INVALID_PARAMS,
        _ => ErrorCode::INTERNAL_ERROR,
    };
    AcpError::new(code, format!("{what}: {}", status.message()))
}

fn invalid(message: impl Into<String>) -> AcpError {
    AcpError::new(ErrorCode::INVALID_PARAMS, message)
}

fn internal(message: impl Into<String>) -> AcpError {
    AcpError::new(ErrorCode::INTERNAL_ERROR, message)
}

/// Tells the editor something about the session, as a line of the agent's
/// answer (`session/update` may come at any time).
fn say(cx: &Connection, session_id: &str, text: &str) {
    let update = SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::from(format!(
        "\n\n{}\n\n",
        editor_text(text)
    ))));
    let _ = cx.send_notification(SessionNotification::new(session_id.to_string(), update));
}

fn modes(plan: bool) -> SessionModeState {
    SessionModeState::new(
        if plan { PLAN_MODE } else { DEFAULT_MODE },
        vec![
            SessionMode::new(DEFAULT_MODE, "Default").description(
                "Works on the task directly; calls the policy confirms wait for you".to_string(),
            ),
            SessionMode::new(PLAN_MODE, "Plan").description(
                "Writes a step-by-step plan first, then carries it out step by step".to_string(),
            ),
        ],
    )
}

/// The adapter's state: the connection to the orchestrator and the
/// sessions this editor opened.
struct State {
    config: Mutex<Config>,
    /// Connected and checked once; replaced by `authenticate`.
    client: tokio::sync::Mutex<Option<Orchestrator>>,
    sessions: Mutex<HashMap<String, Arc<Live>>>,
    /// Turns get outbound network for their bash commands.
    network: bool,
}

impl State {
    /// The orchestrator, connected and its answer to this token checked.
    async fn client(&self) -> Result<Orchestrator, AcpError> {
        let mut held = self.client.lock().await;
        if let Some(client) = held.as_ref() {
            return Ok(client.clone());
        }
        let config = self
            .config
            .lock()
            .map(|c| c.clone())
            .unwrap_or_else(|p| p.into_inner().clone());
        let mut client = crate::client::connect(&config)
            .await
            .map_err(|e| internal(format!("{e:#}")))?;
        client
            .list_sessions(spb::ListSessionsRequest {
                limit: 1,
                ..Default::default()
            })
            .await
            .map_err(|s| {
                let e = rpc_error("the orchestrator did not accept this agent", &s);
                if s.code() == tonic::Code::Unauthenticated {
                    AcpError::new(
                        ErrorCode::AUTH_REQUIRED,
                        format!(
                            "{}; give a person's token as AGENTRY_TOKEN in the agent's \
                             environment, or authenticate with _meta.token",
                            s.message()
                        ),
                    )
                } else {
                    e
                }
            })?;
        *held = Some(client.clone());
        Ok(client)
    }

    async fn authenticate(
        &self,
        request: AuthenticateRequest,
    ) -> Result<AuthenticateResponse, AcpError> {
        if &*request.method_id.0 != TOKEN_METHOD {
            return Err(invalid(format!(
                "unknown auth method {:?}; the method is {TOKEN_METHOD:?}",
                &*request.method_id.0
            )));
        }
        let given = request
            .meta
            .as_ref()
            .and_then(|meta| meta.get("token"))
            .and_then(|token| token.as_str())
            .map(str::to_string);
        if let Some(token) = given {
            if let Ok(mut config) = self.config.lock() {
                config.auth.token = token.trim().to_string();
            }
            *self.client.lock().await = None;
        }
        self.client().await?;
        Ok(AuthenticateResponse::new())
    }

    fn live(&self, session_id: &str) -> Result<Arc<Live>, AcpError> {
        self.sessions
            .lock()
            .ok()
            .and_then(|sessions| sessions.get(session_id).cloned())
            .ok_or_else(|| {
                invalid(format!(
                    "session {session_id} is not open here: session/new or session/load it first"
                ))
            })
    }

    /// Keeps `live` as the session's, ending the follower of an earlier
    /// load of it.
    fn keep(&self, live: Arc<Live>) {
        if let Ok(mut sessions) = self.sessions.lock()
            && let Some(old) = sessions.insert(live.id.clone(), live)
        {
            old.stop();
        }
    }

    async fn new_session(
        &self,
        request: NewSessionRequest,
        cx: &Connection,
    ) -> Result<(NewSessionResponse, Option<String>), AcpError> {
        if !request.cwd.is_absolute() {
            return Err(invalid(format!(
                "cwd {} is not an absolute path",
                request.cwd.display()
            )));
        }
        let mut client = self.client().await?;
        // The editor's directory is the session's project where the
        // services allow it; else a scratch workspace, said once.
        let place = if request.cwd.parent().is_some() {
            Place::Here(request.cwd.clone())
        } else {
            Place::Scratch
        };
        let (session, note) = open_session(&mut client, None, &place)
            .await
            .map_err(|e| internal(format!("{e:#}")))?;
        let mut notes: Vec<String> = note.into_iter().collect();
        if let Some(note) = bring_servers(&mut client, &session.id, &request.mcp_servers).await {
            notes.push(note);
        }
        let live = Live::start(
            client,
            cx.clone(),
            &session.id,
            session.event_count + 1,
            0,
            None,
        );
        self.keep(live);
        let response = NewSessionResponse::new(session.id.clone()).modes(modes(false));
        Ok((response, (!notes.is_empty()).then(|| notes.join("\n"))))
    }

    async fn load_session(
        &self,
        request: LoadSessionRequest,
        cx: &Connection,
    ) -> Result<LoadSessionResponse, AcpError> {
        let mut client = self.client().await?;
        let id = request.session_id.0.to_string();
        let brought = bring_servers(&mut client, &id, &request.mcp_servers).await;
        let session = client
            .get_session(pb::GetSessionRequest {
                session_id: id.clone(),
            })
            .await
            .map_err(|s| rpc_error(&format!("cannot load session {id}"), &s))?
            .into_inner();
        let (loaded, replayed) = oneshot::channel();
        let live = Live::start(
            client,
            cx.clone(),
            &session.id,
            1,
            session.event_count,
            Some(loaded),
        );
        let plan = live.plan.load(Ordering::Relaxed);
        self.keep(live);
        replayed
            .await
            .map_err(|_| internal(format!("lost session {id}'s events while replaying them")))?;
        if let Some(note) = brought {
            say(cx, &id, &note);
        }
        Ok(LoadSessionResponse::new().modes(modes(plan)))
    }

    /// Agentry's sessions, most recently used first, a page at a time (the
    /// cursor is where the next page starts); with `cwd`, those working
    /// in that directory. Sub-agents' task sessions are left out.
    async fn list_sessions(
        &self,
        request: ListSessionsRequest,
    ) -> Result<ListSessionsResponse, AcpError> {
        const PAGE: u32 = 50;
        let mut client = self.client().await?;
        let mut offset: u32 = match request.cursor.as_deref() {
            None | Some("") => 0,
            Some(cursor) => cursor
                .parse()
                .map_err(|_| invalid(format!("cursor {cursor:?} is not one session/list gave")))?,
        };
        let wanted = request.cwd.as_ref().map(|d| d.display().to_string());
        let mut sessions = Vec::new();
        // Filtering by directory may take several pages of the store's.
        loop {
            let page = client
                .list_sessions(spb::ListSessionsRequest {
                    limit: PAGE,
                    offset,
                    only_open_turns: false,
                })
                .await
                .map_err(|s| rpc_error("cannot list sessions", &s))?
                .into_inner();
            let got = page.sessions.len() as u32;
            offset = offset.saturating_add(got);
            for s in page.sessions {
                if s.parent.as_ref().is_some_and(|p| !p.session_id.is_empty()) {
                    continue;
                }
                if wanted.as_ref().is_some_and(|dir| *dir != s.project_dir) {
                    continue;
                }
                let title = if !s.name.is_empty() {
                    s.name.clone()
                } else if !s.title.is_empty() {
                    s.title.clone()
                } else {
                    s.preview.clone()
                };
                let updated = s
                    .updated_at
                    .as_ref()
                    .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, 0))
                    .map(|t| t.to_rfc3339());
                sessions.push(
                    SessionInfo::new(s.id.clone(), s.project_dir.clone())
                        .title(editor_text(&title))
                        .updated_at(updated),
                );
            }
            let more = got > 0 && u64::from(offset) < page.total;
            if !more || sessions.len() >= PAGE as usize {
                let next = more.then(|| offset.to_string());
                return Ok(ListSessionsResponse::new(sessions).next_cursor(next));
            }
        }
    }

    async fn prompt(&self, request: PromptRequest) -> Result<PromptResponse, AcpError> {
        let live = self.live(&request.session_id.0)?;
        let message = message(&request.prompt)?;
        let mode = Mode {
            approve: Approve::Policy,
            plan: live.plan.load(Ordering::Relaxed),
            network: self.network,
            limits: Limits::default(),
            verbose: false,
        };
        let mut input = user_input(message.text.clone(), mode);
        if let Some(pb::input::Kind::UserMessage(m)) = &mut input.kind {
            m.images = message.images.clone();
        }
        // The editor shows its prompt itself: its entry is not echoed.
        let shown = spb::UserMessage {
            text: message.text,
            images: message.images,
            ..Default::default()
        };
        let own = editor_text(&format!("{}{}", shown.text, images_shown(&shown)));
        live.expect_own(&own);
        let submitted = live
            .client
            .clone()
            .submit(pb::SubmitRequest {
                session_id: live.id.clone(),
                input: Some(input),
            })
            .await
            .map_err(|s| {
                // Not sent: a message of the same words from elsewhere is
                // shown.
                live.with(|t| t.sent.forget_own(&own));
                rpc_error("the message was not taken", &s)
            })?
            .into_inner();
        let finish = live.finished(&submitted.turn_id).await?;
        stop_reason(finish).map(PromptResponse::new)
    }

    async fn cancel(&self, session_id: &str) {
        let Ok(live) = self.live(session_id) else {
            return;
        };
        let input = pb::Input {
            kind: Some(pb::input::Kind::Cancel(pb::CancelInput {
                reason: "cancelled in the editor".to_string(),
            })),
        };
        let request = pb::SubmitRequest {
            session_id: live.id.clone(),
            input: Some(input),
        };
        if let Err(status) = live.client.clone().submit(request).await {
            eprintln!("agentry acp: cannot cancel: {}", status.message());
        }
    }

    fn set_mode(
        &self,
        request: &SetSessionModeRequest,
    ) -> Result<SetSessionModeResponse, AcpError> {
        let live = self.live(&request.session_id.0)?;
        let plan = match &*request.mode_id.0 {
            DEFAULT_MODE => false,
            PLAN_MODE => true,
            other => {
                return Err(invalid(format!(
                    "unknown mode {other:?}; the modes are {DEFAULT_MODE:?} and {PLAN_MODE:?}"
                )));
            }
        };
        live.plan.store(plan, Ordering::Relaxed);
        Ok(SetSessionModeResponse::new())
    }
}

/// Starts the MCP servers the editor passes for the session (as the
/// session, a stdio one inside its sandbox; their tools under the policy
/// like any other); what to tell the person about them, if anything.
async fn bring_servers(
    client: &mut OrchestratorClient<TracedChannel>,
    session_id: &str,
    servers: &[agent_client_protocol::v1::schema::McpServer],
) -> Option<String> {
    use agent_client_protocol::v1::schema::McpServer;
    if servers.is_empty() {
        return None;
    }
    let mut skipped = Vec::new();
    let mut wanted = Vec::new();
    for server in servers {
        match server {
            McpServer::Stdio(s) => wanted.push(tpb::McpSessionServer {
                name: server_name(&s.name),
                command: s.command.display().to_string(),
                args: s.args.clone(),
                env: s
                    .env
                    .iter()
                    .map(|e| (e.name.clone(), e.value.clone()))
                    .collect(),
                ..Default::default()
            }),
            McpServer::Http(h) => wanted.push(tpb::McpSessionServer {
                name: server_name(&h.name),
                url: h.url.clone(),
                headers: h
                    .headers
                    .iter()
                    .map(|e| (e.name.clone(), e.value.clone()))
                    .collect(),
                ..Default::default()
            }),
            McpServer::Sse(s) => skipped.push(format!(
                "{} (the old HTTP+SSE transport, which Agentry does not speak)",
                s.name
            )),
            _ => skipped.push("(a kind of server Agentry does not know)".to_string()),
        }
    }
    let mut notes = Vec::new();
    if !wanted.is_empty() {
        let names: Vec<String> = wanted.iter().map(|s| s.name.clone()).collect();
        match client
            .set_session_mcp_servers(pb::SetSessionMcpServersRequest {
                session_id: session_id.to_string(),
                servers: wanted,
            })
            .await
        {
            Ok(set) => {
                let set = set.into_inner();
                notes.push(format!(
                    "(the editor's MCP servers {}: {} tools offered{})",
                    names.join(", "),
                    set.tools.len(),
                    if set.errors.is_empty() {
                        String::new()
                    } else {
                        format!("; not started: {}", set.errors.join("; "))
                    }
                ));
            }
            Err(status) => notes.push(format!(
                "(the editor's MCP servers {} are not started: {})",
                names.join(", "),
                status.message()
            )),
        }
    }
    if !skipped.is_empty() {
        notes.push(format!("(not started: {})", skipped.join(", ")));
    }
    Some(notes.join("\n"))
}

/// An editor's name for a server as Agentry's names go (letters, digits,
/// `-`, `_`; at most 32; no `__`).
fn server_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    while out.contains("__") {
        out = out.replace("__", "_");
    }
    out.truncate(32);
    let out = out.trim_end_matches('_').to_string();
    if out.is_empty() {
        "editor".to_string()
    } else {
        out
    }
}

/// A prompt's content as an Agentry message.
#[derive(Debug, Default, PartialEq)]
struct Message {
    text: String,
    images: Vec<spb::Image>,
}

fn message(blocks: &[ContentBlock]) -> Result<Message, AcpError> {
    let mut out = Message::default();
    let mut push = |text: &str| {
        if !out.text.is_empty() && !out.text.ends_with('\n') {
            out.text.push('\n');
        }
        out.text.push_str(text);
    };
    let mut images = Vec::new();
    for block in blocks {
        match block {
            ContentBlock::Text(t) => push(&t.text),
            ContentBlock::ResourceLink(link) => push(&format!("[{}]({})", link.name, link.uri)),
            ContentBlock::Resource(resource) => match &resource.resource {
                EmbeddedResourceResource::TextResourceContents(r) => {
                    push(&format!("{}:\n```\n{}\n```", r.uri, r.text.trim_end()));
                }
                EmbeddedResourceResource::BlobResourceContents(r) => {
                    return Err(invalid(format!(
                        "{} is binary; only text resources can be sent",
                        r.uri
                    )));
                }
                _ => return Err(invalid("a kind of resource this agent does not know")),
            },
            ContentBlock::Image(image) => {
                let data = base64::engine::general_purpose::STANDARD
                    .decode(image.data.as_bytes())
                    .map_err(|e| invalid(format!("an image's data is not base64: {e}")))?;
                images.push(spb::Image {
                    path: image
                        .uri
                        .as_deref()
                        .and_then(|uri| Path::new(uri).file_name())
                        .map(|name| name.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    mime: image.mime_type.clone(),
                    data,
                });
            }
            ContentBlock::Audio(_) => {
                return Err(invalid("audio is not taken; send text or images"));
            }
            _ => return Err(invalid("a kind of content this agent does not know")),
        }
    }
    out.images = images;
    if out.text.trim().is_empty() && out.images.is_empty() {
        return Err(invalid("the prompt is empty"));
    }
    Ok(out)
}

/// How a turn ended, as its follower saw it.
#[derive(Debug, Clone)]
struct Finish {
    outcome: spb::TurnOutcome,
    /// Why the turn's last model call stopped ("stop", "length", …).
    finish_reason: String,
    /// The turn's final answer or why it ended.
    message: String,
}

fn stop_reason(finish: Finish) -> Result<StopReason, AcpError> {
    Ok(match finish.outcome {
        spb::TurnOutcome::Completed => match finish.finish_reason.as_str() {
            "length" => StopReason::MaxTokens,
            "content_filter" | "refusal" => StopReason::Refusal,
            _ => StopReason::EndTurn,
        },
        spb::TurnOutcome::Cancelled => StopReason::Cancelled,
        spb::TurnOutcome::StepLimit => StopReason::MaxTurnRequests,
        spb::TurnOutcome::Budget => StopReason::MaxTokens,
        spb::TurnOutcome::Failed | spb::TurnOutcome::Unspecified => {
            return Err(internal(format!("the turn failed: {}", finish.message)));
        }
    })
}

/// One open session: its follower's task and what the prompts wait for.
struct Live {
    id: String,
    client: Orchestrator,
    /// Plan mode for the next prompts.
    plan: AtomicBool,
    turns: Mutex<Turns>,
    follower: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Default)]
struct Turns {
    sent: Sent,
    /// Turns that ended before anyone waited for them.
    finished: HashMap<String, Finish>,
    waiting: HashMap<String, oneshot::Sender<Finish>>,
    /// The follower ended: nothing more will finish.
    gone: Option<String>,
}

impl Live {
    /// Starts following session `id` from event `from_seq`; `loaded` hears
    /// when everything up to `replay_to` was sent.
    fn start(
        client: Orchestrator,
        cx: Connection,
        id: &str,
        from_seq: u64,
        replay_to: u64,
        loaded: Option<oneshot::Sender<()>>,
    ) -> Arc<Live> {
        let live = Arc::new(Live {
            id: id.to_string(),
            client,
            plan: AtomicBool::new(false),
            turns: Mutex::new(Turns::default()),
            follower: Mutex::new(None),
        });
        let task = tokio::spawn(follow(live.clone(), cx, from_seq, replay_to, loaded));
        if let Ok(mut follower) = live.follower.lock() {
            *follower = Some(task);
        }
        live
    }

    fn stop(&self) {
        if let Ok(mut follower) = self.follower.lock()
            && let Some(task) = follower.take()
        {
            task.abort();
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Turns) -> T) -> T {
        match self.turns.lock() {
            Ok(mut turns) => f(&mut turns),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    fn expect_own(&self, text: &str) {
        self.with(|t| t.sent.expect_own(text));
    }

    /// Waits for turn `turn_id` to end.
    async fn finished(&self, turn_id: &str) -> Result<Finish, AcpError> {
        let waiting = self.with(|t| {
            if let Some(finish) = t.finished.remove(turn_id) {
                return Ok(Ok(finish));
            }
            if let Some(why) = &t.gone {
                return Err(internal(why.clone()));
            }
            let (tx, rx) = oneshot::channel();
            t.waiting.insert(turn_id.to_string(), tx);
            Ok(Err(rx))
        })?;
        match waiting {
            Ok(finish) => Ok(finish),
            Err(rx) => rx.await.map_err(|_| {
                internal(self.with(|t| t.gone.clone()).unwrap_or_else(|| {
                    "the session was loaded again; this prompt's end is told there".to_string()
                }))
            }),
        }
    }

    fn turn_ended(&self, turn_id: &str, finish: Finish) {
        self.with(|t| match t.waiting.remove(turn_id) {
            Some(tx) => {
                let _ = tx.send(finish);
            }
            None => {
                // A turn another client started: kept a while, in case a
                // prompt of this editor's is about to wait for it.
                if t.finished.len() > 64 {
                    t.finished.clear();
                }
                t.finished.insert(turn_id.to_string(), finish);
            }
        });
    }
}

/// Follows the session: sends the editor what changes, asks it about calls
/// that wait for a person, and tells waiting prompts how their turns ended.
async fn follow(
    live: Arc<Live>,
    cx: Connection,
    from_seq: u64,
    replay_to: u64,
    mut loaded: Option<oneshot::Sender<()>>,
) {
    let mut follower = Follower::from_seq(&live.client, &live.id, from_seq);
    let mut view = SessionView::new(&live.id, editor_text);
    let mut last_reason = String::new();
    let mut replaying = replay_to >= from_seq;
    if !replaying && let Some(loaded) = loaded.take() {
        let _ = loaded.send(());
    }
    loop {
        let event = match follower.next().await {
            Ok(event) => event,
            Err(e) => {
                let why = format!("lost session {}'s events: {e:#}", live.id);
                say(&cx, &live.id, &why);
                live.with(|t| {
                    t.gone = Some(why);
                    t.waiting.clear();
                });
                return;
            }
        };
        let applied = view.apply(&event);
        let updates = live.with(|t| t.sent.updates(&view));
        for update in updates {
            let _ = cx.send_notification(SessionNotification::new(live.id.clone(), update));
        }
        match &event.kind {
            Some(Kind::UserMessage(_)) => last_reason.clear(),
            Some(Kind::ModelMessage(m)) if !agentry_client::relay::is_relayed(&live.id, &event) => {
                last_reason = m.finish_reason.clone();
            }
            _ => {}
        }
        for notice in notices(&live.id, &event, applied) {
            match notice {
                Notice::Approval(request) if !replaying => ask(&live, &cx, &view, request),
                Notice::Finished { turn_id, outcome } if !replaying => {
                    let message = match &event.kind {
                        Some(Kind::TurnFinished(f)) => f.message.clone(),
                        _ => String::new(),
                    };
                    live.turn_ended(
                        &turn_id,
                        Finish {
                            outcome: spb::TurnOutcome::try_from(outcome).unwrap_or_default(),
                            finish_reason: last_reason.clone(),
                            message,
                        },
                    );
                }
                _ => {}
            }
        }
        if replaying && !event.live && event.seq >= replay_to {
            replaying = false;
            if let Some(loaded) = loaded.take() {
                let _ = loaded.send(());
            }
            // What still waits for a person is asked now.
            for request in view.questions.clone() {
                ask(&live, &cx, &view, request);
            }
        }
    }
}

/// What a waiting file call would change, as a diff (none for other calls,
/// or when it cannot be worked out).
async fn preview(live: &Live, request: &spb::ApprovalRequested) -> Option<String> {
    if !matches!(request.tool.as_str(), "write_file" | "edit_file") {
        return None;
    }
    let (session_id, call_id) = agentry_client::relay::answer_to(&live.id, &request.call_id);
    let preview = live
        .client
        .clone()
        .preview_call(pb::PreviewCallRequest {
            session_id,
            call_id,
        })
        .await
        .ok()?
        .into_inner();
    (preview.error.is_empty() && !preview.diff.trim().is_empty()).then_some(preview.diff)
}

/// The editor's choices for a question, by option id.
fn options(
    request: &spb::ApprovalRequested,
) -> Vec<(
    &'static str,
    &'static str,
    PermissionOptionKind,
    spb::ApprovalDecision,
)> {
    use PermissionOptionKind::{AllowAlways, AllowOnce, RejectOnce};
    use spb::ApprovalDecision::{Approve, ApproveForSession, Check, Deny};
    if request.outcome_unknown {
        return vec![
            ("check", "Check whether it took effect", AllowOnce, Check),
            ("run-again", "Run it again", AllowOnce, Approve),
            ("skip", "Skip it", RejectOnce, Deny),
        ];
    }
    let mut out = vec![("allow-once", "Allow once", AllowOnce, Approve)];
    // A call only named people approve is never approved ahead.
    if approvers(request).is_none() {
        out.push((
            "allow-always",
            "Allow for this session",
            AllowAlways,
            ApproveForSession,
        ));
    }
    out.push(("reject-once", "Reject", RejectOnce, Deny));
    out
}

/// Asks the editor about a call waiting for a person; its answer is
/// submitted as this person's approval.
fn ask(live: &Arc<Live>, cx: &Connection, view: &SessionView, request: spb::ApprovalRequested) {
    let title = updates::title(
        &request.tool,
        &short_args(&request.tool, &request.arguments_json),
    );
    let raw: serde_json::Value =
        serde_json::from_str(&request.arguments_json).unwrap_or(serde_json::Value::Null);
    let fields = ToolCallUpdateFields::new()
        .title(editor_text(&title))
        .kind(updates::kind(&request.tool))
        .status(ToolCallStatus::Pending)
        .raw_input(raw);
    // A sub-agent's call, relayed, has no block here: announced first.
    let known = view
        .entries
        .iter()
        .any(|e| matches!(e, agentry_client::view::Entry::Tool(b) if b.call_id == request.call_id));
    if !known {
        let call = ToolCall::new(request.call_id.clone(), editor_text(&title))
            .kind(updates::kind(&request.tool))
            .status(ToolCallStatus::Pending);
        let _ = cx.send_notification(SessionNotification::new(
            live.id.clone(),
            SessionUpdate::ToolCall(call),
        ));
    }
    let choices = options(&request);
    let offered = choices
        .iter()
        .map(|(id, name, kind, _)| PermissionOption::new(*id, *name, *kind))
        .collect();
    let live = live.clone();
    let cx = cx.clone();
    tokio::spawn(async move {
        // A file the call would change is shown as its diff.
        let mut fields = fields;
        if let Some(diff) = preview(&live, &request).await {
            fields = fields.content(vec![ToolCallContent::from(format!(
                "```diff\n{}\n```",
                editor_text(diff.trim_end())
            ))]);
        }
        let ask = RequestPermissionRequest::new(
            live.id.clone(),
            ToolCallUpdate::new(request.call_id.clone(), fields),
            offered,
        );
        let answer = match cx.send_request(ask).block_task().await {
            Ok(answer) => answer,
            Err(e) => {
                eprintln!("agentry acp: the editor did not answer a permission request: {e}");
                return;
            }
        };
        let RequestPermissionOutcome::Selected(selected) = answer.outcome else {
            // The prompt was cancelled: the turn's cancel settles the call.
            return;
        };
        let Some((_, _, _, decision)) = choices
            .iter()
            .find(|(id, ..)| *id == &*selected.option_id.0)
        else {
            eprintln!(
                "agentry acp: the editor chose {:?}, which was not offered",
                &*selected.option_id.0
            );
            return;
        };
        let input = pb::ApprovalInput {
            call_id: request.call_id.clone(),
            decision: *decision as i32,
            reason: String::new(),
            edited_arguments_json: String::new(),
        };
        let mut client = live.client.clone();
        match crate::turn::decide(&mut client, &live.id, input).await {
            Ok(()) => {}
            // Answered meanwhile elsewhere (the console, another chat).
            Err(s) if s.code() == tonic::Code::FailedPrecondition => {}
            Err(s) => {
                say(
                    &cx,
                    &live.id,
                    &format!("(the answer was not taken: {})", s.message()),
                );
            }
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use agent_client_protocol::v1::schema::{ImageContent, ResourceLink, TextContent};

    #[test]
    fn prompts_become_one_message_with_links_resources_and_images() {
        let blocks = vec![
            ContentBlock::Text(TextContent::new("Fix this")),
            ContentBlock::ResourceLink(ResourceLink::new("lib.rs", "file:///p/src/lib.rs")),
            ContentBlock::Image(
                ImageContent::new("aGVsbG8=", "image/png").uri("file:///p/shot.png".to_string()),
            ),
        ];
        let m = message(&blocks).unwrap();
        assert_eq!(m.text, "Fix this\n[lib.rs](file:///p/src/lib.rs)");
        assert_eq!(m.images.len(), 1);
        assert_eq!(m.images[0].data, b"hello");
        assert_eq!(m.images[0].path, "shot.png");
        let bad = vec![ContentBlock::Image(ImageContent::new("%%%", "image/png"))];
        assert!(message(&bad).unwrap_err().message.contains("base64"));
        assert!(message(&[]).unwrap_err().message.contains("empty"));
    }

    #[test]
    fn turn_outcomes_map_to_stop_reasons() {
        let finish = |outcome, reason: &str| Finish {
            outcome,
            finish_reason: reason.to_string(),
            message: "boom".to_string(),
        };
        use spb::TurnOutcome::*;
        assert_eq!(
            stop_reason(finish(Completed, "stop")).unwrap(),
            StopReason::EndTurn
        );
        assert_eq!(
            stop_reason(finish(Completed, "length")).unwrap(),
            StopReason::MaxTokens
        );
        assert_eq!(
            stop_reason(finish(Completed, "refusal")).unwrap(),
            StopReason::Refusal
        );
        assert_eq!(
            stop_reason(finish(Cancelled, "")).unwrap(),
            StopReason::Cancelled
        );
        assert_eq!(
            stop_reason(finish(StepLimit, "")).unwrap(),
            StopReason::MaxTurnRequests
        );
        assert_eq!(
            stop_reason(finish(Budget, "")).unwrap(),
            StopReason::MaxTokens
        );
        assert!(
            stop_reason(finish(Failed, ""))
                .unwrap_err()
                .message
                .contains("boom")
        );
    }

    #[test]
    fn restricted_calls_are_never_allowed_for_the_session() {
        let mut request = spb::ApprovalRequested {
            call_id: "c".into(),
            tool: "bash".into(),
            ..Default::default()
        };
        let ids = |r: &spb::ApprovalRequested| options(r).iter().map(|o| o.0).collect::<Vec<_>>();
        assert_eq!(ids(&request), ["allow-once", "allow-always", "reject-once"]);
        request.approvers = vec![spb::Approvers {
            any_of: vec!["role:admin".into()],
        }];
        assert_eq!(ids(&request), ["allow-once", "reject-once"]);
        request.outcome_unknown = true;
        assert_eq!(ids(&request), ["check", "run-again", "skip"]);
    }
}
