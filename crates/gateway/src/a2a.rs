//! A2A 1.0 over JSON-RPC: other agents hand Agentry tasks.
//!
//! The Agent Card is public at `/.well-known/agent-card.json`; calls go to
//! `POST /a2a` with a person's token as a bearer credential, and act as that
//! person (the orchestrator applies their role and records them). A task is
//! one turn of a session: its id is `SESSION:TURN`, its context the session.
//! A call waiting for a person makes the task `TASK_STATE_INPUT_REQUIRED`;
//! a message on the task answers it (from this or any client). Tasks are the
//! caller's own: another person's task is not found.
//!
//! What a task shows is read from the session's log with the shared
//! [`SessionView`] (questions waiting) and the turn's own events.

use crate::Gateway;
use crate::error::ApiError;
use crate::login::Person;
use agentry_client::relay::is_relayed;
use agentry_client::view::SessionView;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{self as spb, event::Kind};
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc;

/// Where the JSON-RPC endpoint is.
pub const RPC_PATH: &str = "/a2a";

/// JSON-RPC and A2A error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL: i64 = -32603;
const TASK_NOT_FOUND: i64 = -32001;
const TASK_NOT_CANCELABLE: i64 = -32002;
const PUSH_NOT_SUPPORTED: i64 = -32003;
const UNSUPPORTED: i64 = -32004;
const CONTENT_TYPE: i64 = -32005;
const NO_EXTENDED_CARD: i64 = -32007;

/// How long a call that waits for a task (SendMessage without
/// `returnImmediately`) waits at most.
const MAX_WAIT: Duration = Duration::from_secs(600);
/// How long reading a session's log may take.
const READ_LOG_FOR: Duration = Duration::from_secs(30);
/// How many recent sessions ListTasks looks through.
const LIST_SESSIONS: u32 = 100;

/// A refused or failed call: a JSON-RPC error.
#[derive(Debug)]
pub(crate) struct RpcError {
    pub(crate) code: i64,
    pub(crate) message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    fn params(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }

    fn not_found(task: &str) -> RpcError {
        RpcError::new(TASK_NOT_FOUND, format!("no task {task} of yours"))
    }
}

impl From<tonic::Status> for RpcError {
    fn from(status: tonic::Status) -> RpcError {
        let code = match status.code() {
            tonic::Code::InvalidArgument => INVALID_PARAMS,
            tonic::Code::NotFound => TASK_NOT_FOUND,
            tonic::Code::PermissionDenied | tonic::Code::FailedPrecondition => UNSUPPORTED,
            _ => INTERNAL,
        };
        RpcError::new(code, status.message().to_string())
    }
}

fn reply(id: &Value, result: Result<Value, RpcError>) -> Value {
    match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(e) => json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": e.code, "message": e.message}
        }),
    }
}

/// The address callers reach this gateway at, from the request.
fn base_url(gw: &Gateway, headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or("127.0.0.1");
    let scheme = if gw.secure_cookie { "https" } else { "http" };
    format!("{scheme}://{host}")
}

/// `GET /.well-known/agent-card.json`: who this agent is and how to call
/// it (public, like every agent card).
pub async fn card(State(gw): State<Gateway>, headers: HeaderMap) -> Result<Response, ApiError> {
    gw.check_host(&headers)?;
    let mut skills = vec![json!({
        "id": "agentry",
        "name": "Agentry agent",
        "description": "Works on a task in a sandboxed workspace with bash, files, the web and \
                        the MCP servers it is configured with; asks a person before anything \
                        its policy confirms (the task is then input-required).",
        "tags": ["coding", "shell", "files", "research"],
        "examples": ["Summarise the README of this project", "Find why the tests fail"]
    })];
    for (name, description) in gw.skills.iter() {
        skills.push(json!({
            "id": name,
            "name": name,
            "description": format!("{description} (a sub-agent the Agentry agent hands tasks to)"),
            "tags": ["sub-agent"]
        }));
    }
    let card = json!({
        "name": "Agentry",
        "description": "A self-hosted runtime for tool-using agents: durable sessions, a \
                        sandbox, and a person's approval for sensitive calls.",
        "supportedInterfaces": [{
            "url": format!("{}{RPC_PATH}", base_url(&gw, &headers)),
            "protocolBinding": "JSONRPC",
            "protocolVersion": "1.0"
        }],
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": true, "pushNotifications": false},
        "securitySchemes": {
            "bearer": {"httpAuthSecurityScheme": {
                "scheme": "Bearer",
                "description": "A person's token (`agentry users add NAME --role ROLE`)"
            }}
        },
        "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills
    });
    let mut response = axum::Json(card).into_response();
    // Agent cards are read by other sites' agents, not pages.
    response.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    Ok(response)
}

/// `POST /a2a`: one JSON-RPC call.
pub async fn rpc(
    State(gw): State<Gateway>,
    ConnectInfo(crate::tls::ClientAddr(peer)): ConnectInfo<crate::tls::ClientAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let person = match crate::login::bearer(&gw, &headers, peer.ip()) {
        Ok(person) => person,
        Err(response) => return *response,
    };
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            let e = RpcError::new(PARSE_ERROR, format!("the body is not JSON: {e}"));
            return axum::Json(reply(&Value::Null, Err(e))).into_response();
        }
    };
    // A notification (no id) is never answered; A2A has no notifications
    // for a server to act on.
    let Some(id) = request.get("id").cloned() else {
        return axum::http::StatusCode::NO_CONTENT.into_response();
    };
    let method = request.get("method").and_then(Value::as_str);
    let (Some(method), Some("2.0")) = (method, request.get("jsonrpc").and_then(Value::as_str))
    else {
        let e = RpcError::new(
            INVALID_REQUEST,
            "a JSON-RPC 2.0 request: {\"jsonrpc\": \"2.0\", \"id\": …, \"method\": …, \"params\": …}",
        );
        return axum::Json(reply(&id, Err(e))).into_response();
    };
    let params = request.get("params").cloned().unwrap_or_else(|| json!({}));
    // Calls that stay open take one of the gateway's places for them.
    let _slot = match method {
        "SendMessage" | "SendStreamingMessage" | "SubscribeToTask" | "CancelTask" => {
            match gw.stream_slot() {
                Ok(slot) => Some(slot),
                Err(e) => return e.into_response(),
            }
        }
        _ => None,
    };
    let result = match method {
        "SendMessage" => send_message(&gw, &person, &params).await,
        "SendStreamingMessage" => {
            return streaming(gw, person, id, params, true, _slot).await;
        }
        "SubscribeToTask" => return streaming(gw, person, id, params, false, _slot).await,
        "GetTask" => get_task(&gw, &person, &params).await,
        "ListTasks" => list_tasks(&gw, &person, &params).await,
        "CancelTask" => cancel_task(&gw, &person, &params).await,
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => Err(RpcError::new(
            PUSH_NOT_SUPPORTED,
            "push notifications are not supported: stream the task (SendStreamingMessage, \
             SubscribeToTask) or poll it (GetTask)",
        )),
        "GetExtendedAgentCard" => Err(RpcError::new(
            NO_EXTENDED_CARD,
            "there is no extended agent card; the public one says everything",
        )),
        other => Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!(
                "no method {other:?}; the methods are SendMessage, SendStreamingMessage, \
                 GetTask, ListTasks, CancelTask, SubscribeToTask"
            ),
        )),
    };
    axum::Json(reply(&id, result)).into_response()
}

/// A task id: the session and the turn.
fn split_task(id: &str) -> Result<(String, String), RpcError> {
    match id.split_once(':') {
        Some((session, turn)) if !session.is_empty() && !turn.is_empty() => {
            Ok((session.to_string(), turn.to_string()))
        }
        _ => Err(RpcError::not_found(id)),
    }
}

fn task_id(session: &str, turn: &str) -> String {
    format!("{session}:{turn}")
}

fn rfc3339(t: Option<&prost_types::Timestamp>) -> Value {
    t.and_then(|t| {
        chrono::DateTime::from_timestamp(t.seconds, t.nanos.clamp(0, 999_999_999) as u32)
    })
    .map_or(Value::Null, |t| {
        json!(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    })
}

/// One turn of a session, as a task.
#[derive(Debug, Clone, Default)]
pub(crate) struct Turn {
    pub(crate) id: String,
    pub(crate) by: String,
    pub(crate) text: String,
    pub(crate) at: Option<prost_types::Timestamp>,
    pub(crate) finished: Option<(spb::TurnFinished, Option<prost_types::Timestamp>)>,
}

/// A session's log, read: its turns and the shared view of it.
pub(crate) struct Fold {
    pub(crate) session_id: String,
    pub(crate) turns: Vec<Turn>,
    pub(crate) view: SessionView,
    /// The next seq to follow from.
    pub(crate) next_seq: u64,
    /// Each tool call's tool and arguments, by call id.
    pub(crate) calls: std::collections::HashMap<String, (String, String)>,
}

impl Fold {
    pub(crate) fn apply(&mut self, event: &spb::Event) -> agentry_client::view::Applied {
        let applied = self.view.apply(event);
        if !event.live {
            self.next_seq = self.next_seq.max(event.seq + 1);
        }
        if is_relayed(&self.session_id, event) {
            return applied;
        }
        match &event.kind {
            Some(Kind::UserMessage(m)) if !event.turn_id.is_empty() => self.turns.push(Turn {
                id: event.turn_id.clone(),
                by: event.by.clone(),
                text: m.text.clone(),
                at: event.time,
                finished: None,
            }),
            Some(Kind::ToolCallRequested(c)) => {
                self.calls.insert(
                    c.call_id.clone(),
                    (c.tool.clone(), c.arguments_json.clone()),
                );
            }
            Some(Kind::TurnFinished(f)) => {
                if let Some(turn) = self.turns.iter_mut().rev().find(|t| t.id == event.turn_id) {
                    turn.finished = Some((f.clone(), event.time));
                }
            }
            _ => {}
        }
        applied
    }

    pub(crate) fn turn(&self, id: &str) -> Option<&Turn> {
        self.turns.iter().rev().find(|t| t.id == id)
    }

    /// Whether `turn` is the one waiting for the questions in the view.
    pub(crate) fn asking(&self, turn: &Turn) -> bool {
        turn.finished.is_none()
            && (!self.view.questions.is_empty() || !self.view.inputs.is_empty())
            && self.turns.last().is_some_and(|last| last.id == turn.id)
    }
}

/// Reads session `session_id`'s log as `person`.
pub(crate) async fn fold_session(
    gw: &Gateway,
    person: &Person,
    session_id: &str,
) -> Result<Fold, RpcError> {
    let mut orchestrator = gw.orchestrator.clone();
    let session = orchestrator
        .get_session(request(
            gw,
            person,
            pb::GetSessionRequest {
                session_id: session_id.to_string(),
            },
        )?)
        .await
        .map_err(|s| match s.code() {
            tonic::Code::NotFound | tonic::Code::InvalidArgument => {
                RpcError::new(TASK_NOT_FOUND, format!("no session {session_id}"))
            }
            _ => RpcError::from(s),
        })?
        .into_inner();
    let mut fold = Fold {
        session_id: session.id.clone(),
        turns: Vec::new(),
        view: SessionView::new(&session.id, str::to_string),
        next_seq: 1,
        calls: Default::default(),
    };
    if session.event_count == 0 {
        return Ok(fold);
    }
    let mut events = orchestrator
        .subscribe(request(
            gw,
            person,
            pb::SubscribeRequest {
                session_id: session.id.clone(),
                from_seq: 1,
                live_only: false,
            },
        )?)
        .await?
        .into_inner();
    let read = async {
        while let Some(event) = events.message().await? {
            if event.live {
                continue;
            }
            let seq = event.seq;
            fold.apply(&event);
            if seq >= session.event_count {
                break;
            }
        }
        Ok::<(), tonic::Status>(())
    };
    tokio::time::timeout(READ_LOG_FOR, read)
        .await
        .map_err(|_| RpcError::new(INTERNAL, "the session's log did not arrive in time"))??;
    Ok(fold)
}

pub(crate) fn request<T>(
    gw: &Gateway,
    person: &Person,
    message: T,
) -> Result<tonic::Request<T>, RpcError> {
    gw.request(person, message)
        .map_err(|_| RpcError::new(UNSUPPORTED, "this person's name cannot be passed on"))
}

/// The caller's task `id`, with its session read.
async fn own_task(gw: &Gateway, person: &Person, id: &str) -> Result<(Fold, Turn), RpcError> {
    let (session, turn) = split_task(id)?;
    let fold = fold_session(gw, person, &session)
        .await
        .map_err(|e| match e.code {
            TASK_NOT_FOUND => RpcError::not_found(id),
            _ => e,
        })?;
    let turn = fold
        .turn(&turn)
        .filter(|t| owned(person, t))
        .cloned()
        .ok_or_else(|| RpcError::not_found(id))?;
    Ok((fold, turn))
}

pub(crate) fn owned(person: &Person, turn: &Turn) -> bool {
    turn.by == person.name
}

fn text_part(text: &str) -> Value {
    json!({"text": text})
}

fn agent_message(task: &str, context: &str, suffix: &str, parts: Vec<Value>) -> Value {
    json!({
        "messageId": format!("{task}:{suffix}"),
        "contextId": context,
        "taskId": task,
        "role": "ROLE_AGENT",
        "parts": parts
    })
}

/// What a person is asked, as an agent message: words and the questions
/// as data.
fn question_message(task: &str, context: &str, questions: &[spb::ApprovalRequested]) -> Value {
    let mut lines = Vec::new();
    let mut data = Vec::new();
    for q in questions {
        let args = agentry_client::text::short_args(&q.tool, &q.arguments_json);
        lines.push(format!("{} {args}", q.tool));
        data.push(json!({
            "callId": q.call_id,
            "tool": q.tool,
            "arguments": serde_json::from_str::<Value>(&q.arguments_json)
                .unwrap_or(Value::String(q.arguments_json.clone())),
            "rule": q.matched_rule,
            "approvers": agentry_client::text::approvers(q),
        }));
    }
    let text = format!(
        "Agentry asks before running {}. Answer with a message on this task: \"approve\", \
         \"approve for session\", or \"deny: why\" (or a data part {{\"decision\": …, \
         \"callId\": …}}).",
        lines.join("; ")
    );
    agent_message(
        task,
        context,
        "question",
        vec![text_part(&text), json!({"data": {"questions": data}})],
    )
}

/// What the MCP servers of waiting calls ask (forms to fill in, pages to
/// visit), as an agent message: words and the questions as data. The
/// servers' words are untrusted: passed on as text and data, never
/// followed.
fn input_message(task: &str, context: &str, inputs: &[spb::McpInputRequested]) -> Value {
    let mut lines = Vec::new();
    let mut data = Vec::new();
    for asked in inputs {
        for q in &asked.questions {
            lines.push(match q.mode.as_str() {
                "url" => format!("{}: {} (visit {})", q.key, q.message, q.url),
                _ => format!("{}: {}", q.key, q.message),
            });
        }
        data.push(json!({
            "callId": asked.call_id,
            "server": asked.server,
            "questions": asked.questions.iter().map(|q| json!({
                "key": q.key,
                "mode": q.mode,
                "message": q.message,
                "schema": serde_json::from_str::<Value>(&q.schema_json).unwrap_or(Value::Null),
                "url": q.url,
            })).collect::<Vec<_>>(),
        }));
    }
    let text = format!(
        "A tool's MCP server asks a person: {}. Answer with a message on this task holding a \
         data part {{\"action\": \"accept\", \"content\": {{…the fields…}}, \"callId\": …}} \
         (\"decline\" or \"cancel\" to refuse; a page to visit is accepted once visited).",
        lines.join("; ")
    );
    agent_message(
        task,
        context,
        "question",
        vec![text_part(&text), json!({"data": {"inputs": data}})],
    )
}

/// An answer to an MCP server's questions from a message: a data part
/// `{"action", "content", "callId"}`, or the words "decline" / "cancel".
fn mcp_answer(
    text: &str,
    data: Option<&Value>,
) -> Result<(String, String, Option<String>), RpcError> {
    if let Some(data) = data.filter(|d| d.get("action").is_some() || d.get("content").is_some()) {
        let action = data
            .get("action")
            .and_then(Value::as_str)
            .unwrap_or("accept")
            .to_string();
        let content = match data.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(content) => content.to_string(),
        };
        let call = data
            .get("callId")
            .or_else(|| data.get("call_id"))
            .and_then(Value::as_str)
            .map(str::to_string);
        return Ok((action, content, call));
    }
    match text.trim().to_lowercase().as_str() {
        action @ ("decline" | "cancel") => Ok((action.to_string(), String::new(), None)),
        _ => Err(RpcError::params(
            "this task waits for answers to an MCP server's questions: a data part \
             {\"action\": \"accept\", \"content\": {…}} (or \"decline\" / \"cancel\")",
        )),
    }
}

/// The state of a turn, and the agent message that goes with it.
fn status(fold: &Fold, turn: &Turn) -> Value {
    let task = task_id(&fold.session_id, &turn.id);
    match &turn.finished {
        Some((f, at)) => {
            let outcome = spb::TurnOutcome::try_from(f.outcome).unwrap_or_default();
            let state = match outcome {
                spb::TurnOutcome::Completed => "TASK_STATE_COMPLETED",
                spb::TurnOutcome::Cancelled => "TASK_STATE_CANCELED",
                _ => "TASK_STATE_FAILED",
            };
            let mut status = json!({"state": state, "timestamp": rfc3339(at.as_ref())});
            if outcome != spb::TurnOutcome::Completed && !f.message.is_empty() {
                status["message"] =
                    agent_message(&task, &fold.session_id, "end", vec![text_part(&f.message)]);
            }
            status
        }
        None if fold.asking(turn) && fold.view.questions.is_empty() => json!({
            "state": "TASK_STATE_INPUT_REQUIRED",
            "message": input_message(&task, &fold.session_id, &fold.view.inputs),
        }),
        None if fold.asking(turn) => json!({
            "state": "TASK_STATE_INPUT_REQUIRED",
            "message": question_message(&task, &fold.session_id, &fold.view.questions),
        }),
        None => json!({"state": "TASK_STATE_WORKING"}),
    }
}

/// A turn as an A2A task.
fn task_json(fold: &Fold, turn: &Turn, history_length: Option<usize>, artifacts: bool) -> Value {
    let task = task_id(&fold.session_id, &turn.id);
    let mut history = vec![json!({
        "messageId": format!("{task}:user"),
        "contextId": fold.session_id,
        "taskId": task,
        "role": "ROLE_USER",
        "parts": [text_part(&turn.text)]
    })];
    let answer = match &turn.finished {
        Some((f, _)) if f.outcome == spb::TurnOutcome::Completed as i32 => f.message.clone(),
        _ => String::new(),
    };
    if !answer.is_empty() {
        history.push(agent_message(
            &task,
            &fold.session_id,
            "answer",
            vec![text_part(&answer)],
        ));
    }
    if let Some(n) = history_length {
        let skip = history.len().saturating_sub(n);
        history.drain(..skip);
    }
    let mut out = json!({
        "id": task,
        "contextId": fold.session_id,
        "status": status(fold, turn),
        "history": history,
    });
    if artifacts && !answer.is_empty() {
        out["artifacts"] = json!([{
            "artifactId": "answer",
            "name": "answer",
            "parts": [text_part(&answer)]
        }]);
    }
    out
}

fn history_length(params: &Value) -> Result<Option<usize>, RpcError> {
    match params.get("historyLength") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| RpcError::params("historyLength is a whole number")),
    }
}

fn string_param<'a>(params: &'a Value, name: &str) -> Result<&'a str, RpcError> {
    params
        .get(name)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| RpcError::params(format!("{name} is required")))
}

async fn get_task(gw: &Gateway, person: &Person, params: &Value) -> Result<Value, RpcError> {
    let id = string_param(params, "id")?;
    let (fold, turn) = own_task(gw, person, id).await?;
    Ok(task_json(&fold, &turn, history_length(params)?, true))
}

async fn list_tasks(gw: &Gateway, person: &Person, params: &Value) -> Result<Value, RpcError> {
    let page_size = match params.get("pageSize") {
        None | Some(Value::Null) => 50,
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=100).contains(n))
            .ok_or_else(|| RpcError::params("pageSize is a whole number from 1 to 100"))?
            as usize,
    };
    let offset = match params.get("pageToken").and_then(Value::as_str) {
        None | Some("") => 0,
        Some(token) => token
            .parse::<usize>()
            .map_err(|_| RpcError::params("pageToken is one a ListTasks answer gave"))?,
    };
    let wanted_state = params.get("status").and_then(Value::as_str).unwrap_or("");
    let include_artifacts = params
        .get("includeArtifacts")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let history = history_length(params)?;
    let sessions: Vec<String> = match params.get("contextId").and_then(Value::as_str) {
        Some(context) if !context.is_empty() => vec![context.to_string()],
        _ => gw
            .orchestrator
            .clone()
            .list_sessions(request(
                gw,
                person,
                spb::ListSessionsRequest {
                    limit: LIST_SESSIONS,
                    ..Default::default()
                },
            )?)
            .await?
            .into_inner()
            .sessions
            .into_iter()
            // Sub-agents' tasks are their delegating session's business.
            .filter(|s| s.parent.as_ref().is_none_or(|p| p.session_id.is_empty()))
            .map(|s| s.id)
            .collect(),
    };
    let mut tasks: Vec<(i64, Value)> = Vec::new();
    for session in sessions {
        let fold = match fold_session(gw, person, &session).await {
            Ok(fold) => fold,
            Err(e) if e.code == TASK_NOT_FOUND => continue,
            Err(e) => return Err(e),
        };
        for turn in fold.turns.iter().filter(|t| owned(person, t)) {
            let task = task_json(&fold, turn, history, include_artifacts);
            if wanted_state.is_empty()
                || wanted_state == "TASK_STATE_UNSPECIFIED"
                || task["status"]["state"] == wanted_state
            {
                let at = turn.at.map_or(0, |t| t.seconds);
                tasks.push((at, task));
            }
        }
    }
    // The most recent first.
    tasks.sort_by_key(|t| std::cmp::Reverse(t.0));
    let total = tasks.len();
    let page: Vec<Value> = tasks
        .into_iter()
        .skip(offset)
        .take(page_size)
        .map(|(_, t)| t)
        .collect();
    let next = offset + page.len();
    Ok(json!({
        "tasks": page,
        "nextPageToken": if next < total { next.to_string() } else { String::new() },
        "pageSize": page_size,
        "totalSize": total
    }))
}

async fn cancel_task(gw: &Gateway, person: &Person, params: &Value) -> Result<Value, RpcError> {
    let id = string_param(params, "id")?;
    let (fold, turn) = own_task(gw, person, id).await?;
    if turn.finished.is_some() {
        return Err(RpcError::new(
            TASK_NOT_CANCELABLE,
            format!("task {id} has ended"),
        ));
    }
    submit(
        gw,
        person,
        &fold.session_id,
        pb::input::Kind::Cancel(pb::CancelInput {
            reason: format!("cancelled by {} over A2A", person.name),
        }),
    )
    .await?;
    // The cancel takes a moment: the task is answered once it has ended.
    let (tx, mut rx) = mpsc::channel(64);
    let watch = watch(gw.clone(), person.clone(), fold, turn.id.clone(), tx, false);
    let _ = tokio::time::timeout(Duration::from_secs(15), async {
        tokio::spawn(watch);
        while rx.recv().await.is_some() {}
    })
    .await;
    let (fold, turn) = own_task(gw, person, id).await?;
    Ok(task_json(&fold, &turn, None, true))
}

pub(crate) async fn submit(
    gw: &Gateway,
    person: &Person,
    session_id: &str,
    kind: pb::input::Kind,
) -> Result<pb::SubmitResponse, RpcError> {
    Ok(gw
        .orchestrator
        .clone()
        .submit(request(
            gw,
            person,
            pb::SubmitRequest {
                session_id: session_id.to_string(),
                input: Some(pb::Input { kind: Some(kind) }),
            },
        )?)
        .await?
        .into_inner())
}

/// A message's text (text parts, data as JSON, links), and its first data
/// part.
fn message_content(message: &Value) -> Result<(String, Option<Value>), RpcError> {
    let parts = message
        .get("parts")
        .and_then(Value::as_array)
        .ok_or_else(|| RpcError::params("message.parts is required"))?;
    let mut text = Vec::new();
    let mut data = None;
    for part in parts {
        if let Some(t) = part.get("text").and_then(Value::as_str) {
            text.push(t.to_string());
        } else if let Some(d) = part.get("data") {
            text.push(d.to_string());
            data.get_or_insert_with(|| d.clone());
        } else if let Some(url) = part.get("url").and_then(Value::as_str) {
            let name = part.get("filename").and_then(Value::as_str).unwrap_or(url);
            text.push(format!("[{name}]({url})"));
        } else {
            return Err(RpcError::new(
                CONTENT_TYPE,
                "only text, data and url parts are taken",
            ));
        }
    }
    Ok((text.join("\n"), data))
}

/// An answer to a question from a message: a data part
/// `{"decision", "callId", "reason"}`, or words ("approve", "approve for
/// session", "deny: why").
fn decision(
    text: &str,
    data: Option<&Value>,
) -> Result<(spb::ApprovalDecision, Option<String>, String), RpcError> {
    use spb::ApprovalDecision::{Approve, ApproveForSession, Deny};
    if let Some(data) = data.filter(|d| d.get("decision").is_some()) {
        let call = data
            .get("callId")
            .or_else(|| data.get("call_id"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let reason = data
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let decision = match data["decision"].as_str().unwrap_or_default() {
            "approve" => Approve,
            "approve_for_session" | "approve for session" => ApproveForSession,
            "deny" => Deny,
            other => {
                return Err(RpcError::params(format!(
                    "decision {other:?}: approve, approve_for_session or deny"
                )));
            }
        };
        return Ok((decision, call, reason));
    }
    // Split the text as written, then lower only the head (lowering may
    // change lengths).
    let (head, rest) = match text.trim().split_once(':') {
        Some((head, rest)) => (head.trim().to_lowercase(), rest.trim().to_string()),
        None => (text.trim().to_lowercase(), String::new()),
    };
    let decision = match head.as_str() {
        "approve for session" | "approve for this session" | "always" => ApproveForSession,
        "approve" | "approved" | "yes" | "y" | "allow" | "ok" => Approve,
        "deny" | "denied" | "no" | "n" | "reject" => Deny,
        _ if head.starts_with("deny ") || head.starts_with("no ") => {
            return Ok((Deny, None, text.trim().to_string()));
        }
        _ => {
            return Err(RpcError::params(
                "this task waits for an answer: \"approve\", \"approve for session\" or \
                 \"deny: why\" (or a data part {\"decision\": …})",
            ));
        }
    };
    Ok((decision, None, rest))
}

/// SendMessage and SendStreamingMessage up to the start of the task: a
/// new turn, or the answer to the question a task waits on. Returns the
/// task's session read and its turn id.
async fn start(gw: &Gateway, person: &Person, params: &Value) -> Result<(Fold, String), RpcError> {
    let message = params
        .get("message")
        .ok_or_else(|| RpcError::params("message is required"))?;
    let (text, data) = message_content(message)?;
    // A message on a task answers what it asks.
    if let Some(id) = message
        .get("taskId")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        let (fold, turn) = own_task(gw, person, id).await?;
        if turn.finished.is_some() {
            return Err(RpcError::new(
                UNSUPPORTED,
                format!(
                    "task {id} has ended; send a new message with contextId {} to go on",
                    fold.session_id
                ),
            ));
        }
        if !fold.asking(&turn) {
            return Err(RpcError::new(
                UNSUPPORTED,
                format!("task {id} is working and takes no input now"),
            ));
        }
        let answers_input = !fold.view.inputs.is_empty()
            && (fold.view.questions.is_empty()
                || data
                    .as_ref()
                    .is_some_and(|d| d.get("action").is_some() || d.get("content").is_some()));
        if answers_input {
            let (action, content_json, call) = mcp_answer(&text, data.as_ref())?;
            let call_id = match call {
                Some(call) if fold.view.inputs.iter().any(|q| q.call_id == call) => call,
                Some(call) => {
                    return Err(RpcError::params(format!(
                        "task {id} does not ask about {call:?}; its questions are in its status \
                         message"
                    )));
                }
                None => fold.view.inputs[0].call_id.clone(),
            };
            submit(
                gw,
                person,
                &fold.session_id,
                pb::input::Kind::McpAnswer(pb::McpAnswerInput {
                    call_id,
                    action,
                    content_json,
                }),
            )
            .await?;
            let fold = fold_session(gw, person, &fold.session_id).await?;
            return Ok((fold, turn.id));
        }
        let (decision, call, reason) = decision(&text, data.as_ref())?;
        // Only a question this task asks can be answered here.
        let call_id = match call {
            Some(call) if fold.view.questions.iter().any(|q| q.call_id == call) => call,
            Some(call) => {
                return Err(RpcError::params(format!(
                    "task {id} does not ask about {call:?}; its questions are in its status \
                     message"
                )));
            }
            None => fold.view.questions[0].call_id.clone(),
        };
        let (session_id, call_id) = agentry_client::relay::answer_to(&fold.session_id, &call_id);
        submit(
            gw,
            person,
            &session_id,
            pb::input::Kind::Approval(pb::ApprovalInput {
                call_id,
                decision: decision as i32,
                reason,
                edited_arguments_json: String::new(),
            }),
        )
        .await?;
        // Read again: the answer is in the log, and what follows is news.
        let fold = fold_session(gw, person, &fold.session_id).await?;
        return Ok((fold, turn.id));
    }
    if text.trim().is_empty() {
        return Err(RpcError::params("the message has no text"));
    }
    let fold = match message
        .get("contextId")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        Some(context) => {
            // Going on in a conversation of one's own only.
            let fold = fold_session(gw, person, context).await?;
            // A session with no turn of the caller's is not theirs.
            if !fold.turns.first().is_some_and(|t| owned(person, t)) {
                return Err(RpcError::new(
                    TASK_NOT_FOUND,
                    format!("no context {context} of yours"),
                ));
            }
            fold
        }
        None => {
            let id = gw
                .orchestrator
                .clone()
                .create_session(request(
                    gw,
                    person,
                    pb::CreateSessionRequest {
                        title: "A2A".to_string(),
                        ..Default::default()
                    },
                )?)
                .await?
                .into_inner()
                .id;
            fold_session(gw, person, &id).await?
        }
    };
    let submitted = submit(
        gw,
        person,
        &fold.session_id,
        pb::input::Kind::UserMessage(pb::UserInput {
            text,
            approval_mode: spb::ApprovalMode::Policy as i32,
            ..Default::default()
        }),
    )
    .await?;
    Ok((fold, submitted.turn_id))
}

async fn send_message(gw: &Gateway, person: &Person, params: &Value) -> Result<Value, RpcError> {
    let (fold, turn) = start(gw, person, params).await?;
    let immediately = params
        .pointer("/configuration/returnImmediately")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let history = params
        .pointer("/configuration/historyLength")
        .and_then(Value::as_u64)
        .map(|n| n as usize);
    let session = fold.session_id.clone();
    if !immediately {
        let (tx, mut rx) = mpsc::channel(64);
        tokio::spawn(watch(
            gw.clone(),
            person.clone(),
            fold,
            turn.clone(),
            tx,
            false,
        ));
        let _ = tokio::time::timeout(MAX_WAIT, async { while rx.recv().await.is_some() {} }).await;
    }
    let (fold, turn) = own_task(gw, person, &task_id(&session, &turn)).await?;
    Ok(json!({"task": task_json(&fold, &turn, history, true)}))
}

/// SendStreamingMessage and SubscribeToTask: server-sent events, each a
/// JSON-RPC answer holding a StreamResponse, until the task ends or asks.
async fn streaming(
    gw: Gateway,
    person: Person,
    id: Value,
    params: Value,
    send: bool,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Response {
    let started = if send {
        start(&gw, &person, &params).await
    } else {
        match string_param(&params, "id") {
            Ok(task) => match own_task(&gw, &person, task).await {
                Ok((_, turn)) if turn.finished.is_some() => Err(RpcError::new(
                    UNSUPPORTED,
                    format!("task {task} has ended: GetTask reads it"),
                )),
                Ok((fold, turn)) => Ok((fold, turn.id)),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    };
    let (fold, turn) = match started {
        Ok(started) => started,
        Err(e) => return axum::Json(reply(&id, Err(e))).into_response(),
    };
    let (tx, rx) = mpsc::channel(256);
    let watching = watch(gw.clone(), person, fold, turn, tx, true);
    tokio::spawn(async move {
        // The place is the stream's for as long as it is watched.
        let _slot = slot;
        watching.await;
    });
    let stop = gw.stop.subscribe();
    let events = futures::stream::unfold((rx, stop, id), |(mut rx, mut stop, id)| async move {
        if *stop.borrow() {
            return None;
        }
        let item = tokio::select! {
            item = rx.recv() => item?,
            _ = stop.changed() => return None,
        };
        let data = reply(&id, Ok(item)).to_string();
        Some((
            Ok::<_, Infallible>(SseEvent::default().data(data)),
            (rx, stop, id),
        ))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// Follows a task from where `fold` stopped reading, sending
/// StreamResponses (the task first when `announce`), until it ends or asks
/// a person.
async fn watch(
    gw: Gateway,
    person: Person,
    mut fold: Fold,
    turn_id: String,
    tx: mpsc::Sender<Value>,
    announce: bool,
) {
    let task = task_id(&fold.session_id, &turn_id);
    let context = fold.session_id.clone();
    let snapshot = |fold: &Fold| {
        fold.turn(&turn_id)
            .map(|turn| task_json(fold, turn, None, false))
            .unwrap_or_else(|| {
                json!({"id": task, "contextId": context, "status": {"state": "TASK_STATE_SUBMITTED"}})
            })
    };
    if announce && tx.send(json!({"task": snapshot(&fold)})).await.is_err() {
        return;
    }
    let status_update = |fold: &Fold, status: Value| json!({"statusUpdate": {"taskId": task, "contextId": fold.session_id, "status": status}});
    let subscribe = match request(
        &gw,
        &person,
        pb::SubscribeRequest {
            session_id: fold.session_id.clone(),
            from_seq: fold.next_seq,
            live_only: false,
        },
    ) {
        Ok(r) => r,
        Err(_) => return,
    };
    let mut events = match gw.orchestrator.clone().subscribe(subscribe).await {
        Ok(events) => events.into_inner(),
        Err(status) => {
            let failed = json!({"state": "TASK_STATE_FAILED", "message": agent_message(
                &task, &fold.session_id, "error", vec![text_part(&format!("cannot follow the task: {}", status.message()))])});
            let _ = tx.send(status_update(&fold, failed)).await;
            return;
        }
    };
    // A task already asking or ended says so and stops.
    if let Some(turn) = fold.turn(&turn_id).cloned()
        && (turn.finished.is_some() || fold.asking(&turn))
    {
        let _ = tx.send(status_update(&fold, status(&fold, &turn))).await;
        return;
    }
    let mut streamed = false;
    let mut working_sent = false;
    let mut stop = gw.stop.subscribe();
    let mut check = tokio::time::interval(Duration::from_secs(2));
    loop {
        // A caller that went away, a gateway stopping, or a person whose
        // token was removed or replaced ends the watch, even while nothing
        // happens.
        let event = tokio::select! {
            next = events.message() => match next {
                Ok(Some(event)) => event,
                _ => return,
            },
            () = tx.closed() => return,
            _ = stop.changed() => return,
            _ = check.tick() => {
                if !person.still_logged_in(&gw) {
                    return;
                }
                continue;
            }
        };
        let ours = event.turn_id == turn_id || event.turn_id.is_empty();
        let applied = fold.apply(&event);
        if !ours {
            continue;
        }
        let Some(turn) = fold.turn(&turn_id).cloned() else {
            continue;
        };
        let update = match &event.kind {
            Some(Kind::ModelTextDelta(d)) if !is_relayed(&fold.session_id, &event) => {
                let update = json!({"artifactUpdate": {
                    "taskId": task, "contextId": fold.session_id,
                    "artifact": {"artifactId": "answer", "name": "answer", "parts": [text_part(&d.text)]},
                    "append": streamed, "lastChunk": false
                }});
                streamed = true;
                Some(update)
            }
            Some(Kind::TurnFinished(f)) if !is_relayed(&fold.session_id, &event) => {
                if f.outcome == spb::TurnOutcome::Completed as i32 && !f.message.is_empty() {
                    let whole = json!({"artifactUpdate": {
                        "taskId": task, "contextId": fold.session_id,
                        "artifact": {"artifactId": "answer", "name": "answer", "parts": [text_part(&f.message)]},
                        "append": false, "lastChunk": true
                    }});
                    if tx.send(whole).await.is_err() {
                        return;
                    }
                }
                let _ = tx.send(status_update(&fold, status(&fold, &turn))).await;
                return;
            }
            _ if (applied.asked.is_some()
                || matches!(event.kind, Some(Kind::McpInputRequested(_))))
                && fold.asking(&turn) =>
            {
                let _ = tx.send(status_update(&fold, status(&fold, &turn))).await;
                return;
            }
            Some(Kind::UserMessage(_)) | Some(Kind::ModelMessage(_)) if !working_sent => {
                working_sent = true;
                Some(status_update(&fold, json!({"state": "TASK_STATE_WORKING"})))
            }
            _ => None,
        };
        if let Some(update) = update
            && tx.send(update).await.is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn answers_are_read_from_words_or_data() {
        use spb::ApprovalDecision::{Approve, ApproveForSession, Deny};
        assert_eq!(decision("Approve", None).unwrap().0, Approve);
        assert_eq!(
            decision(" approve for session ", None).unwrap().0,
            ApproveForSession
        );
        let (d, call, reason) = decision("deny: use the other file", None).unwrap();
        assert_eq!(
            (d, call, reason.as_str()),
            (Deny, None, "use the other file")
        );
        let data = json!({"decision": "deny", "callId": "c7", "reason": "no"});
        let (d, call, reason) = decision("", Some(&data)).unwrap();
        assert_eq!(
            (d, call.as_deref(), reason.as_str()),
            (Deny, Some("c7"), "no")
        );
        assert!(
            decision("maybe later", None)
                .unwrap_err()
                .message
                .contains("approve")
        );
        let bad = json!({"decision": "perhaps"});
        assert!(
            decision("", Some(&bad))
                .unwrap_err()
                .message
                .contains("perhaps")
        );
    }

    #[test]
    fn task_ids_name_a_session_and_a_turn() {
        assert_eq!(
            split_task("s-1:t-2").unwrap(),
            ("s-1".to_string(), "t-2".to_string())
        );
        for bad in ["", "s-1", ":t", "s:"] {
            assert_eq!(split_task(bad).unwrap_err().code, TASK_NOT_FOUND, "{bad:?}");
        }
    }

    #[test]
    fn only_text_data_and_links_are_taken() {
        let m = json!({"parts": [{"text": "hi"}, {"url": "https://x.test/a", "filename": "a"}, {"data": {"k": 1}}]});
        let (text, data) = message_content(&m).unwrap();
        assert_eq!(text, "hi\n[a](https://x.test/a)\n{\"k\":1}");
        assert_eq!(data, Some(json!({"k": 1})));
        let raw = json!({"parts": [{"raw": "AAAA", "mediaType": "image/png"}]});
        assert_eq!(message_content(&raw).unwrap_err().code, CONTENT_TYPE);
        assert_eq!(
            message_content(&json!({})).unwrap_err().code,
            INVALID_PARAMS
        );
    }
}
