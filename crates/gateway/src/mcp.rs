//! Agentry as an MCP server, for MCP hosts that hand it durable, sandboxed
//! work: tools that start a task (a turn of a session, new or continued),
//! read how it stands (waiting for it a while), answer the questions it
//! asks a person, cancel it, and list sessions.
//!
//! Two ways in: `agentry mcp serve` on stdin/stdout ([`serve_stdio`], the
//! orchestrator called with the person's own token), and streamable HTTP on
//! the gateway at `/mcp` ([`http_service`], a person's bearer token checked
//! by the gateway, the orchestrator called with the service token for that
//! person, like the console).

use crate::Gateway;
use crate::login::Person;
use agentry_client::view::SessionView;
use agentry_proto::orchestrator::v1::{self as pb, orchestrator_client::OrchestratorClient};
use agentry_proto::sessions::v1::{self as spb, event::Kind};
use agentry_runtime::auth::ON_BEHALF_OF;
use agentry_runtime::telemetry::TracedChannel;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

type Orchestrator = OrchestratorClient<TracedChannel>;

/// The longest a call waits for a task to end or ask something.
const MAX_WAIT_SECS: u64 = 300;

/// Serves MCP on standard input and output until the host closes them (or
/// a signal): the orchestrator is called with `client`'s own credentials.
pub async fn serve_stdio(client: Orchestrator) -> anyhow::Result<()> {
    let server = Server {
        orchestrator: client,
        own_token: true,
    };
    let running = server
        .serve(rmcp::transport::io::stdio())
        .await
        .map_err(|e| anyhow::anyhow!("the MCP host's connection failed: {e}"))?;
    tokio::select! {
        ended = running.waiting() => {
            ended.map_err(|e| anyhow::anyhow!("the MCP connection ended badly: {e}"))?;
        }
        () = agentry_runtime::shutdown_signal() => {}
    }
    Ok(())
}

/// The streamable HTTP endpoint: stateless, every call made for the person
/// the gateway's bearer check put on the request.
pub fn http_service(
    gw: &Gateway,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    Server,
    rmcp::transport::streamable_http_server::session::never::NeverSessionManager,
> {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
    };
    let orchestrator = gw.orchestrator.clone();
    let mut config = StreamableHttpServerConfig::default();
    // The gateway checks the Host header itself (gateway.allowed_hosts).
    config.allowed_hosts = Vec::new();
    config.legacy_session_mode = false;
    config.json_response = true;
    // Open calls end when the gateway stops.
    let cancel = config.cancellation_token.clone();
    let mut stop = gw.stop.subscribe();
    tokio::spawn(async move {
        let _ = stop.changed().await;
        cancel.cancel();
    });
    StreamableHttpService::new(
        move || {
            Ok(Server {
                orchestrator: orchestrator.clone(),
                own_token: false,
            })
        },
        std::sync::Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// Lets a request to `/mcp` through with the person its bearer token names
/// (401 otherwise), for the tools to act as them.
pub async fn authorize(
    axum::extract::State(gw): axum::extract::State<Gateway>,
    axum::extract::ConnectInfo(crate::tls::ClientAddr(peer)): axum::extract::ConnectInfo<
        crate::tls::ClientAddr,
    >,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    match crate::login::bearer(&gw, request.headers(), peer.ip()) {
        Ok(person) => {
            request.extensions_mut().insert(person);
            next.run(request).await
        }
        Err(response) => *response,
    }
}

/// The MCP server: a client of the orchestrator.
#[derive(Clone)]
pub struct Server {
    orchestrator: Orchestrator,
    /// The orchestrator client carries the person's own token (stdio);
    /// else the person comes with each HTTP request.
    own_token: bool,
}

impl Server {
    /// Who a request is made for: the HTTP request's person, or (stdio)
    /// the token's own.
    fn caller(&self, context: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
        let person = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Person>())
            .map(|p| p.name.clone());
        if !self.own_token && person.is_none() {
            return Err(ErrorData::invalid_request(
                "no person: send a bearer token",
                None,
            ));
        }
        Ok(Caller {
            orchestrator: self.orchestrator.clone(),
            person,
        })
    }
}

/// Who a call is made for, and how to reach the orchestrator as them.
#[derive(Clone)]
struct Caller {
    orchestrator: Orchestrator,
    /// Named on every request (the gateway's service token acts for them).
    person: Option<String>,
}

impl Caller {
    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, String> {
        let mut request = tonic::Request::new(message);
        if let Some(person) = &self.person {
            let name = person
                .parse()
                .map_err(|_| "this person's name cannot be passed on".to_string())?;
            request.metadata_mut().insert(ON_BEHALF_OF, name);
        }
        Ok(request)
    }
}

fn schema(value: Value) -> std::sync::Arc<Map<String, Value>> {
    match value {
        Value::Object(map) => std::sync::Arc::new(map),
        _ => std::sync::Arc::new(Map::new()),
    }
}

/// The tools offered.
fn tools() -> Vec<Tool> {
    let wait = json!({
        "type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECS,
        "description": "Wait up to this many seconds for the task to end or to ask a person something (default 0: answer at once)"
    });
    vec![
        Tool::new(
            "start_task",
            "Hand a task to Agentry: a message that starts a turn of a new session (working in `project` when given) or of an existing one (`session_id`). Agentry's agent runs it with its own tools in a sandbox; calls its policy confirms wait for a person (see get_task and answer_approval). Returns the session and turn ids and how the task stands.",
            schema(json!({
                "type": "object",
                "properties": {
                    "prompt": {"type": "string", "description": "What to do"},
                    "project": {"type": "string", "description": "Absolute path of the project directory a new session works in (the services must allow it); omitted: a scratch workspace"},
                    "session_id": {"type": "string", "description": "Continue this session instead of starting a new one"},
                    "plan": {"type": "boolean", "description": "Plan mode: a step-by-step plan first, then each step"},
                    "wait_seconds": wait.clone()
                },
                "required": ["prompt"]
            })),
        ),
        Tool::new(
            "get_task",
            "How a task stands: running, input_required (with the questions waiting for a person), or ended (completed with the answer, cancelled, failed, step_limit, budget).",
            schema(json!({
                "type": "object",
                "properties": {
                    "session_id": {"type": "string"},
                    "turn_id": {"type": "string", "description": "The task's turn; omitted: the session's latest"},
                    "wait_seconds": wait
                },
                "required": ["session_id"]
            })),
        ),
        Tool::new(
            "answer_approval",
            "Answer a question a task asks a person. A call its policy confirms (get_task's questions): approve it, approve it for the rest of the session, or deny it with a reason the agent reads. A tool's MCP server asking for input (get_task's server_questions): accept with the fields in content (checked against the question's schema), decline or cancel.",
            schema(json!({
                "type": "object",
                "properties": {
                    "session_id": {"type": "string"},
                    "call_id": {"type": "string", "description": "From get_task's questions or server_questions"},
                    "decision": {"type": "string", "enum": ["approve", "approve_for_session", "deny", "accept", "decline", "cancel"]},
                    "reason": {"type": "string", "description": "For a denial: why, or what to do instead"},
                    "content": {"type": "object", "description": "For accept: the fields of the server's question (or {KEY: fields} for several)"}
                },
                "required": ["session_id", "call_id", "decision"]
            })),
        ),
        Tool::new(
            "cancel_task",
            "Stop the running turn of a session.",
            schema(json!({
                "type": "object",
                "properties": {"session_id": {"type": "string"}},
                "required": ["session_id"]
            })),
        ),
        Tool::new(
            "list_sessions",
            "Agentry's sessions, most recent first: id, name, title, where each works, whether a turn runs, what its turns cost.",
            schema(json!({
                "type": "object",
                "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 200}}
            })),
        ),
    ]
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        // The newest revision (stateless, the host's capabilities on every
        // request); hosts of earlier ones are still served.
        .with_protocol_version(rmcp::model::ProtocolVersion::LATEST)
        .with_server_info(
            Implementation::new("agentry", env!("CARGO_PKG_VERSION")).with_title("Agentry"),
        )
        .with_instructions(
            "Agentry runs tasks durably with its own sandboxed tools: start_task, then \
                 get_task (with wait_seconds) until it ends; answer_approval when it asks.",
        )
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        use rmcp::model::{DetailedTask, Task, TaskPayload, TaskStatus};
        let caller = self.caller(&context)?;
        let (session, turn) = request
            .task_id
            .split_once(':')
            .ok_or_else(|| ErrorData::invalid_params("no such task", None))?;
        let now = chrono::Utc::now().to_rfc3339();
        let stands = status(&caller, session, Some(turn), Duration::ZERO)
            .await
            .map_err(|why| ErrorData::invalid_params(why, None))?;
        let object = |v: &Value| v.as_object().cloned().unwrap_or_default();
        let (payload, said) = match stands["status"].as_str().unwrap_or_default() {
            "completed" => {
                let result = CallToolResult::structured(stands.clone());
                let result = serde_json::to_value(result).unwrap_or(Value::Null);
                (
                    TaskPayload::Completed {
                        result: object(&result),
                    },
                    None,
                )
            }
            "cancelled" => (TaskPayload::Cancelled, None),
            "failed" | "step_limit" | "budget" => (
                TaskPayload::Failed {
                    error: object(
                        &json!({"message": stands["reason"], "status": stands["status"]}),
                    ),
                },
                None,
            ),
            // A question waits for a person: answered with answer_approval.
            "input_required" => (
                TaskPayload::Working,
                Some(format!(
                    "waits for a person: answer_approval answers {}",
                    stands["questions"]
                )),
            ),
            _ => (TaskPayload::Working, None),
        };
        let mut task = Task::new(request.task_id.clone(), TaskStatus::Working, &now, &now)
            .with_poll_interval_ms(1000);
        if let Some(said) = said {
            task = task.with_status_message(said);
        }
        Ok(rmcp::model::GetTaskResult::new(DetailedTask::new(
            task, payload,
        )))
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = self.caller(&context)?;
        let session = request
            .task_id
            .split_once(':')
            .map(|(session, _)| session.to_string())
            .ok_or_else(|| ErrorData::invalid_params("no such task", None))?;
        let mut args = Map::new();
        args.insert("session_id".into(), Value::String(session));
        cancel(&caller, &Args(args))
            .await
            .map(|_| ())
            .map_err(|why| ErrorData::invalid_params(why, None))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = self.caller(&context)?;
        let args = Args(request.arguments.unwrap_or_default());
        // A host that speaks MCP's tasks extension gets start_task as a
        // task it polls (tasks/get), answered at once.
        let as_task = request.name == "start_task"
            && context
                .client_capabilities()
                .is_some_and(|caps| caps.supports_tasks());
        if as_task {
            let mut args = args;
            args.0.remove("wait_seconds");
            return Ok(match start_task(&caller, &args).await {
                Ok(started) => {
                    let id = format!(
                        "{}:{}",
                        started["session_id"].as_str().unwrap_or_default(),
                        started["turn_id"].as_str().unwrap_or_default()
                    );
                    let now = chrono::Utc::now().to_rfc3339();
                    CallToolResponse::Task(rmcp::model::CreateTaskResult::new(
                        rmcp::model::Task::new(id, rmcp::model::TaskStatus::Working, &now, &now)
                            .with_poll_interval_ms(1000),
                    ))
                }
                Err(why) => CallToolResult::error(vec![ContentBlock::text(why)]).into(),
            });
        }
        let result = match request.name.as_ref() {
            "start_task" => start_task(&caller, &args).await,
            "get_task" => get_task(&caller, &args).await,
            "answer_approval" => answer(&caller, &args).await,
            "cancel_task" => cancel(&caller, &args).await,
            "list_sessions" => list(&caller, &args).await,
            other => {
                return Err(ErrorData::invalid_params(
                    format!(
                        "no tool {other:?}; the tools are start_task, get_task, answer_approval, cancel_task, list_sessions"
                    ),
                    None,
                ));
            }
        };
        Ok(CallToolResponse::from(match result {
            Ok(value) => CallToolResult::structured(value),
            Err(why) => CallToolResult::error(vec![ContentBlock::text(why)]),
        }))
    }
}

/// A call's arguments, read with errors that say what is wrong.
struct Args(Map<String, Value>);

impl Args {
    fn optional_text(&self, name: &str) -> Result<Option<String>, String> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
            Some(_) => Err(format!("{name} must be a string")),
        }
    }

    fn text(&self, name: &str) -> Result<String, String> {
        self.optional_text(name)?
            .ok_or_else(|| format!("{name} is required"))
    }

    fn wait(&self) -> Result<Duration, String> {
        match self.0.get("wait_seconds") {
            None | Some(Value::Null) => Ok(Duration::ZERO),
            Some(v) => match v.as_u64() {
                Some(n) if n <= MAX_WAIT_SECS => Ok(Duration::from_secs(n)),
                _ => Err(format!(
                    "wait_seconds must be a whole number from 0 to {MAX_WAIT_SECS}"
                )),
            },
        }
    }
}

fn status_text(what: &str, status: &tonic::Status) -> String {
    format!("{what}: {}", status.message())
}

async fn get_task(caller: &Caller, args: &Args) -> Result<Value, String> {
    let session_id = args.text("session_id")?;
    let turn_id = args.optional_text("turn_id")?;
    status(caller, &session_id, turn_id.as_deref(), args.wait()?).await
}

async fn start_task(caller: &Caller, args: &Args) -> Result<Value, String> {
    let prompt = args.text("prompt")?;
    let session_id = args.optional_text("session_id")?;
    let project = args.optional_text("project")?;
    let plan = args.0.get("plan").and_then(Value::as_bool).unwrap_or(false);
    let wait = args.wait()?;
    let mut orchestrator = caller.orchestrator.clone();
    let session_id = match (session_id, project) {
        (Some(_), Some(_)) => {
            return Err(
                "give session_id (to go on in a session) or project (for a new \
                        one), not both"
                    .to_string(),
            );
        }
        (Some(id), None) => id,
        (None, project) => {
            let project_dir = match project {
                Some(dir) if !PathBuf::from(&dir).is_absolute() => {
                    return Err(format!("project {dir} is not an absolute path"));
                }
                Some(dir) => dir,
                None => String::new(),
            };
            orchestrator
                .create_session(caller.request(pb::CreateSessionRequest {
                    project_dir: project_dir.clone(),
                    title: "MCP".to_string(),
                    ..Default::default()
                })?)
                .await
                .map_err(|s| {
                    status_text(&format!("cannot start a session in {project_dir:?}"), &s)
                })?
                .into_inner()
                .id
        }
    };
    let submitted = orchestrator
        .submit(caller.request(pb::SubmitRequest {
            session_id: session_id.clone(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::UserMessage(pb::UserInput {
                    text: prompt,
                    approval_mode: spb::ApprovalMode::Policy as i32,
                    plan,
                    ..Default::default()
                })),
            }),
        })?)
        .await
        .map_err(|s| status_text("the task was not taken", &s))?
        .into_inner();
    status(caller, &session_id, Some(&submitted.turn_id), wait).await
}

/// How turn `turn_id` of the session stands (the latest turn when `None`),
/// waiting up to `wait` for it to end or ask a person something.
async fn status(
    caller: &Caller,
    session_id: &str,
    turn_id: Option<&str>,
    wait: Duration,
) -> Result<Value, String> {
    let deadline = Instant::now() + wait;
    let mut orchestrator = caller.orchestrator.clone();
    let session = orchestrator
        .get_session(caller.request(pb::GetSessionRequest {
            session_id: session_id.to_string(),
        })?)
        .await
        .map_err(|s| status_text(&format!("no session {session_id}"), &s))?
        .into_inner();
    let mut events = orchestrator
        .subscribe(caller.request(pb::SubscribeRequest {
            session_id: session.id.clone(),
            from_seq: 1,
            live_only: false,
        })?)
        .await
        .map_err(|s| status_text("cannot read the session", &s))?
        .into_inner();
    let mut view = SessionView::new(&session.id, str::to_string);
    let mut ended: HashMap<String, spb::TurnFinished> = HashMap::new();
    let mut latest = String::new();
    let mut turns = std::collections::HashSet::new();
    let mut caught_up = session.event_count == 0;
    loop {
        if caught_up {
            if let Some(turn) = turn_id
                && !turns.contains(turn)
            {
                return Err(format!("session {} has no turn {turn}", session.id));
            }
            let target = turn_id.unwrap_or(&latest);
            let ended_now = ended.get(target);
            let asking = !view.questions.is_empty() || !view.inputs.is_empty();
            if ended_now.is_some() || asking || Instant::now() >= deadline {
                return Ok(describe(&session.id, target, ended_now, &view));
            }
        }
        let left = if caught_up {
            deadline.saturating_duration_since(Instant::now())
        } else {
            Duration::from_secs(30)
        };
        let event = match tokio::time::timeout(left, events.message()).await {
            Ok(Ok(Some(event))) => event,
            Ok(Ok(None)) => return Err("the session's events ended".to_string()),
            Ok(Err(s)) => return Err(status_text("lost the session's events", &s)),
            Err(_) if caught_up => continue,
            Err(_) => return Err("the session's log did not arrive in time".to_string()),
        };
        view.apply(&event);
        match &event.kind {
            Some(Kind::UserMessage(_)) if !event.turn_id.is_empty() => {
                latest = event.turn_id.clone();
                turns.insert(event.turn_id.clone());
            }
            Some(Kind::TurnFinished(f))
                if !agentry_client::relay::is_relayed(&session.id, &event) =>
            {
                ended.insert(event.turn_id.clone(), f.clone());
            }
            _ => {}
        }
        if !event.live && event.seq >= session.event_count {
            caught_up = true;
        }
    }
}

fn describe(
    session_id: &str,
    turn_id: &str,
    ended: Option<&spb::TurnFinished>,
    view: &SessionView,
) -> Value {
    let mut out = json!({"session_id": session_id, "turn_id": turn_id});
    match ended {
        Some(f) => {
            let outcome = spb::TurnOutcome::try_from(f.outcome).unwrap_or_default();
            let status = match outcome {
                spb::TurnOutcome::Completed => "completed",
                spb::TurnOutcome::Cancelled => "cancelled",
                spb::TurnOutcome::StepLimit => "step_limit",
                spb::TurnOutcome::Budget => "budget",
                spb::TurnOutcome::Failed | spb::TurnOutcome::Unspecified => "failed",
            };
            out["status"] = json!(status);
            if outcome == spb::TurnOutcome::Completed {
                out["answer"] = json!(f.message);
            } else {
                out["reason"] = json!(f.message);
            }
        }
        None if !view.questions.is_empty() => {
            out["status"] = json!("input_required");
            out["questions"] = view
                .questions
                .iter()
                .map(|q| {
                    json!({
                        "call_id": q.call_id,
                        "tool": q.tool,
                        "arguments": serde_json::from_str::<Value>(&q.arguments_json)
                            .unwrap_or(Value::String(q.arguments_json.clone())),
                        "rule": q.matched_rule,
                        "approvers": agentry_client::text::approvers(q),
                        "outcome_unknown": q.outcome_unknown,
                    })
                })
                .collect();
        }
        None if !view.inputs.is_empty() => {
            out["status"] = json!("input_required");
            out["server_questions"] = view
                .inputs
                .iter()
                .map(|asked| {
                    json!({
                        "call_id": asked.call_id,
                        "server": asked.server,
                        "questions": asked.questions.iter().map(|q| json!({
                            "key": q.key,
                            "mode": q.mode,
                            "message": q.message,
                            "schema": serde_json::from_str::<Value>(&q.schema_json)
                                .unwrap_or(Value::Null),
                            "url": q.url,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
        }
        None if turn_id.is_empty() => out["status"] = json!("idle"),
        None => out["status"] = json!("running"),
    }
    out
}

async fn answer(caller: &Caller, args: &Args) -> Result<Value, String> {
    let session_id = args.text("session_id")?;
    let call_id = args.text("call_id")?;
    let decision = args.text("decision")?;
    if matches!(decision.as_str(), "accept" | "decline" | "cancel") {
        let content_json = match args.0.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(content) => content.to_string(),
        };
        let input = pb::McpAnswerInput {
            call_id: call_id.clone(),
            action: decision.clone(),
            content_json,
        };
        return answer_input(caller, &session_id, input).await;
    }
    let decision = match decision.as_str() {
        "approve" => spb::ApprovalDecision::Approve,
        "approve_for_session" => spb::ApprovalDecision::ApproveForSession,
        "deny" => spb::ApprovalDecision::Deny,
        other => {
            return Err(format!(
                "decision {other:?}: approve, approve_for_session or deny (a call's \
                 approval); accept, decline or cancel (an MCP server's questions)"
            ));
        }
    };
    let input = pb::ApprovalInput {
        call_id: call_id.clone(),
        decision: decision as i32,
        reason: args.optional_text("reason")?.unwrap_or_default(),
        edited_arguments_json: String::new(),
    };
    let (target, call_id_there) = agentry_client::relay::answer_to(&session_id, &input.call_id);
    let input = pb::ApprovalInput {
        call_id: call_id_there,
        ..input
    };
    caller
        .orchestrator
        .clone()
        .submit(caller.request(pb::SubmitRequest {
            session_id: target,
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::Approval(input)),
            }),
        })?)
        .await
        .map_err(|s| status_text("the answer was not taken", &s))?;
    Ok(json!({"session_id": session_id, "call_id": call_id, "answered": true}))
}

/// Answers the questions a tool's MCP server asked during a call.
async fn answer_input(
    caller: &Caller,
    session_id: &str,
    input: pb::McpAnswerInput,
) -> Result<Value, String> {
    let call_id = input.call_id.clone();
    caller
        .orchestrator
        .clone()
        .submit(caller.request(pb::SubmitRequest {
            session_id: session_id.to_string(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::McpAnswer(input)),
            }),
        })?)
        .await
        .map_err(|s| status_text("the answer was not taken", &s))?;
    Ok(json!({"session_id": session_id, "call_id": call_id, "answered": true}))
}

async fn cancel(caller: &Caller, args: &Args) -> Result<Value, String> {
    let session_id = args.text("session_id")?;
    caller
        .orchestrator
        .clone()
        .submit(caller.request(pb::SubmitRequest {
            session_id: session_id.clone(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::Cancel(pb::CancelInput {
                    reason: "cancelled by an MCP host".to_string(),
                })),
            }),
        })?)
        .await
        .map_err(|s| status_text("cannot cancel", &s))?;
    Ok(json!({"session_id": session_id, "cancelled": true}))
}

async fn list(caller: &Caller, args: &Args) -> Result<Value, String> {
    let limit = match args.0.get("limit") {
        None | Some(Value::Null) => 20,
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=200).contains(n))
            .ok_or("limit must be a whole number from 1 to 200")? as u32,
    };
    let page = caller
        .orchestrator
        .clone()
        .list_sessions(caller.request(spb::ListSessionsRequest {
            limit,
            ..Default::default()
        })?)
        .await
        .map_err(|s| status_text("cannot list sessions", &s))?
        .into_inner();
    let sessions: Vec<Value> = page
        .sessions
        .iter()
        .map(|s| {
            json!({
                "session_id": s.id,
                "name": s.name,
                "title": s.title,
                "project": s.project_dir,
                "turn_running": s.turn_open,
                "cost": s.cost,
            })
        })
        .collect();
    Ok(json!({"sessions": sessions, "total": page.total}))
}
