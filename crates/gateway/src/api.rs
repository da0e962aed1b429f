//! The console's API: JSON in and out, each call passed to the orchestrator
//! for the person logged in, whose role the orchestrator checks.

use crate::error::ApiError;
use crate::login::{Acting, Person, check_same_origin};
use crate::{Gateway, wire};
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1 as spb;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::time::Duration;

/// A JSON body, or a clear refusal of a malformed one.
pub struct Body<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(Body(value)),
            Err(rejection) => Err(ApiError::bad_request(rejection.body_text())),
        }
    }
}

fn time_ms(t: Option<&prost_types::Timestamp>) -> Option<i64> {
    t.map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
}

fn session_json(s: &spb::Session, waiting: usize) -> Value {
    json!({
        "id": s.id,
        "name": s.name,
        "title": wire::web_text(&s.title),
        "preview": wire::web_text(&s.preview),
        "created_ms": time_ms(s.created_at.as_ref()),
        "updated_ms": time_ms(s.updated_at.as_ref()),
        "events": s.event_count,
        "messages": s.user_message_count,
        "turn_open": s.turn_open,
        "project_dir": s.project_dir,
        "forked_from": s.forked_from,
        "parent": s.parent.as_ref().map(|p| p.session_id.clone()),
        "waiting": waiting,
        "cost": s.cost,
        "currency": s.currency,
    })
}

/// Query of the session list.
#[derive(Deserialize, Default)]
pub struct ListQuery {
    /// Words every listed session's title, name, preview or id contains.
    #[serde(default)]
    pub q: String,
    /// At most this many (50 by default, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// `GET /api/sessions?q=WORDS&limit=N`: the sessions, most recently active
/// first, each with how many of its calls wait for a person.
pub async fn sessions(
    State(gw): State<Gateway>,
    person: Person,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let mut orchestrator = gw.orchestrator.clone();
    let limit = query.limit.unwrap_or(50).clamp(1, 1000);
    let searching = !query.q.trim().is_empty();
    let listed = orchestrator
        .list_sessions(gw.request(
            &person,
            spb::ListSessionsRequest {
                // A search looks through more than one page.
                limit: if searching { 1000 } else { limit },
                offset: 0,
                only_open_turns: false,
            },
        )?)
        .await?
        .into_inner();
    let approvals = orchestrator
        .list_approvals(gw.request(&person, pb::ListApprovalsRequest::default())?)
        .await?
        .into_inner()
        .approvals;
    let words: Vec<String> = query.q.split_whitespace().map(str::to_lowercase).collect();
    let sessions: Vec<Value> = listed
        .sessions
        .iter()
        .filter(|s| {
            let text = format!("{} {} {} {}", s.id, s.name, s.title, s.preview).to_lowercase();
            words.iter().all(|w| text.contains(w))
        })
        .take(limit as usize)
        .map(|s| {
            let waiting = approvals.iter().filter(|a| a.session_id == s.id).count();
            session_json(s, waiting)
        })
        .collect();
    Ok(Json(json!({"sessions": sessions, "total": listed.total})))
}

/// `GET /api/sessions/{id}`.
pub async fn session(
    State(gw): State<Gateway>,
    person: Person,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let mut orchestrator = gw.orchestrator.clone();
    let session = orchestrator
        .get_session(gw.request(&person, pb::GetSessionRequest { session_id: id })?)
        .await?
        .into_inner();
    Ok(Json(session_json(&session, 0)))
}

/// Body of a new session.
#[derive(Deserialize, Default)]
pub struct NewSession {
    /// Its title.
    #[serde(default)]
    pub title: String,
    /// The project directory it works in (empty: a scratch workspace).
    #[serde(default)]
    pub project_dir: String,
}

/// `POST /api/sessions`.
pub async fn create(
    State(gw): State<Gateway>,
    Acting(person): Acting,
    Body(body): Body<NewSession>,
) -> Result<Json<Value>, ApiError> {
    let mut orchestrator = gw.orchestrator.clone();
    let session = orchestrator
        .create_session(gw.request(
            &person,
            pb::CreateSessionRequest {
                session_id: String::new(),
                title: body.title,
                project_dir: body.project_dir,
            },
        )?)
        .await?
        .into_inner();
    Ok(Json(session_json(&session, 0)))
}

/// Body of a message.
#[derive(Deserialize, Default)]
pub struct NewMessage {
    /// The text.
    pub text: String,
    /// Plan mode.
    #[serde(default)]
    pub plan: bool,
    /// Outbound network for this turn's commands.
    #[serde(default)]
    pub network: bool,
    /// Approve every call of the turn ahead (`"always"`), none (`"never"`),
    /// or ask as the policy says (the default).
    #[serde(default)]
    pub approve: Option<String>,
    /// Raise the spending limit to this many (currency units) for the
    /// session.
    #[serde(default)]
    pub budget_cost: Option<f64>,
    /// Raise the token limit for the session.
    #[serde(default)]
    pub budget_tokens: Option<u64>,
}

async fn submit(
    gw: &Gateway,
    person: &Person,
    session_id: String,
    kind: pb::input::Kind,
) -> Result<Json<Value>, ApiError> {
    let mut orchestrator = gw.orchestrator.clone();
    let submitted = orchestrator
        .submit(gw.request(
            person,
            pb::SubmitRequest {
                session_id,
                input: Some(pb::Input { kind: Some(kind) }),
            },
        )?)
        .await?
        .into_inner();
    Ok(Json(
        json!({"turn_id": submitted.turn_id, "seq": submitted.seq}),
    ))
}

/// `POST /api/sessions/{id}/messages`.
pub async fn message(
    State(gw): State<Gateway>,
    Acting(person): Acting,
    Path(id): Path<String>,
    Body(body): Body<NewMessage>,
) -> Result<Json<Value>, ApiError> {
    let approval_mode = match body.approve.as_deref().unwrap_or("policy") {
        "policy" => spb::ApprovalMode::Policy,
        "always" => spb::ApprovalMode::Always,
        "never" => spb::ApprovalMode::Never,
        other => {
            return Err(ApiError::bad_request(format!(
                "approve is \"policy\", \"always\" or \"never\", not {other:?}"
            )));
        }
    };
    let budget =
        (body.budget_cost.is_some() || body.budget_tokens.is_some()).then(|| spb::Budget {
            session_cost: body.budget_cost.unwrap_or_default(),
            session_tokens: body.budget_tokens.unwrap_or_default(),
            ..Default::default()
        });
    let input = pb::UserInput {
        text: body.text,
        approval_mode: approval_mode as i32,
        plan: body.plan,
        network: body.network,
        budget,
        compact: false,
        images: Vec::new(),
        interrupt: false,
    };
    submit(&gw, &person, id, pb::input::Kind::UserMessage(input)).await
}

/// Body of a cancel.
#[derive(Deserialize, Default)]
pub struct CancelBody {
    /// Why.
    #[serde(default)]
    pub reason: String,
}

/// `POST /api/sessions/{id}/cancel`.
pub async fn cancel(
    State(gw): State<Gateway>,
    Acting(person): Acting,
    Path(id): Path<String>,
    Body(body): Body<CancelBody>,
) -> Result<Json<Value>, ApiError> {
    let input = pb::CancelInput {
        reason: if body.reason.trim().is_empty() {
            format!("cancelled by {} from the console", person.name)
        } else {
            body.reason
        },
    };
    submit(&gw, &person, id, pb::input::Kind::Cancel(input)).await
}

/// Body of an answer to an approval.
#[derive(Deserialize)]
pub struct AnswerBody {
    /// `approve`, `approve_for_session`, `deny`, `edit` or `check`.
    pub decision: String,
    /// Why (a denial's reason reaches the model).
    #[serde(default)]
    pub reason: String,
    /// The edited arguments (a JSON object as text), for `edit`.
    #[serde(default)]
    pub arguments: String,
}

/// `POST /api/sessions/{id}/approvals/{call_id}`.
pub async fn answer(
    State(gw): State<Gateway>,
    Acting(person): Acting,
    Path((id, call_id)): Path<(String, String)>,
    Body(body): Body<AnswerBody>,
) -> Result<Json<Value>, ApiError> {
    use spb::ApprovalDecision as D;
    let decision = match body.decision.as_str() {
        "approve" => D::Approve,
        "approve_for_session" => D::ApproveForSession,
        "deny" => D::Deny,
        "edit" => D::Edit,
        "check" => D::Check,
        other => {
            return Err(ApiError::bad_request(format!(
                "decision is approve, approve_for_session, deny, edit or check, not {other:?}"
            )));
        }
    };
    // A sub-agent's question, relayed, is answered in its own session.
    let (session, call_id) = agentry_client::relay::answer_to(&id, &call_id);
    let input = pb::ApprovalInput {
        call_id,
        decision: decision as i32,
        reason: body.reason,
        edited_arguments_json: body.arguments,
    };
    submit(&gw, &person, session, pb::input::Kind::Approval(input)).await
}

/// Body of a rewind.
#[derive(Deserialize)]
pub struct RewindBody {
    /// The turn to go back to the end of (0: before the first).
    pub turn: u32,
    /// Keep the files as they are (rewind the conversation only).
    #[serde(default)]
    pub conversation_only: bool,
}

/// `POST /api/sessions/{id}/rewind`.
pub async fn rewind(
    State(gw): State<Gateway>,
    Acting(person): Acting,
    Path(id): Path<String>,
    Body(body): Body<RewindBody>,
) -> Result<Json<Value>, ApiError> {
    let mut orchestrator = gw.orchestrator.clone();
    let rewound = orchestrator
        .rewind_session(gw.request(
            &person,
            pb::RewindSessionRequest {
                session_id: id,
                to_turn: body.turn,
                conversation_only: body.conversation_only,
            },
        )?)
        .await?
        .into_inner();
    Ok(Json(json!({
        "to_turn": body.turn,
        "seq": rewound.rewound.map(|r| r.to_seq),
    })))
}

/// Body of a fork.
#[derive(Deserialize)]
pub struct ForkBody {
    /// The last event the new session keeps (0: all of them).
    #[serde(default)]
    pub at_seq: u64,
    /// Leave the files out (fork the conversation only).
    #[serde(default)]
    pub conversation_only: bool,
}

/// `POST /api/sessions/{id}/fork`.
pub async fn fork(
    State(gw): State<Gateway>,
    Acting(person): Acting,
    Path(id): Path<String>,
    Body(body): Body<ForkBody>,
) -> Result<Json<Value>, ApiError> {
    let mut orchestrator = gw.orchestrator.clone();
    let forked = orchestrator
        .fork_session(gw.request(
            &person,
            pb::ForkSessionRequest {
                session_id: id,
                at_seq: body.at_seq,
                new_session_id: String::new(),
                conversation_only: body.conversation_only,
                ..Default::default()
            },
        )?)
        .await?
        .into_inner();
    Ok(Json(json!({
        "session": forked.session.as_ref().map(|s| session_json(s, 0)),
    })))
}

/// `GET /api/approvals`: every call waiting for a person, across sessions.
pub async fn approvals(State(gw): State<Gateway>, person: Person) -> Result<Json<Value>, ApiError> {
    let mut orchestrator = gw.orchestrator.clone();
    let approvals = orchestrator
        .list_approvals(gw.request(&person, pb::ListApprovalsRequest::default())?)
        .await?
        .into_inner()
        .approvals;
    let listed: Vec<Value> = approvals
        .iter()
        .map(|a| {
            json!({
                "session_id": a.session_id,
                "session_title": wire::web_text(&a.session_title),
                "turn_id": a.turn_id,
                "call_id": a.call_id,
                "tool": a.tool,
                "arguments": wire::web_text(&a.arguments_json),
                "rule": wire::web_text(&a.matched_rule),
                "network": a.network,
                "asked_ms": time_ms(a.asked_at.as_ref()),
                "approvers": a.approvers,
                "approved_by": a.approved_by,
            })
        })
        .collect();
    Ok(Json(json!({"approvals": listed})))
}

/// `GET /api/sessions/{id}/live`: the session's view as server-sent
/// events (`snapshot`, then `patch`es), resumed from `Last-Event-ID`.
pub async fn live(
    State(gw): State<Gateway>,
    person: Person,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<axum::response::sse::Event, Infallible>>>, ApiError> {
    check_same_origin(&headers)?;
    // Reading needs a person; the orchestrator says whether the session is.
    let mut orchestrator = gw.orchestrator.clone();
    orchestrator
        .get_session(gw.request(
            &person,
            pb::GetSessionRequest {
                session_id: id.clone(),
            },
        )?)
        .await?;
    let last_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let watch = gw.hub.watch(&id, last_id.as_deref());
    let mut stopping = gw.stop.subscribe();
    // The stream ends with the gateway, or with the person's login (logged
    // out elsewhere, removed, given a new token, expired).
    let stop = async move {
        let mut check = tokio::time::interval(LOGIN_CHECK);
        loop {
            tokio::select! {
                _ = stopping.wait_for(|stop| *stop) => return,
                _ = check.tick() => {
                    if !person.still_logged_in(&gw) {
                        return;
                    }
                }
            }
        }
    };
    let stream = async_stream(watch, stop);
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// How often an open live stream looks whether its login still holds.
const LOGIN_CHECK: Duration = Duration::from_secs(2);

/// The events of one page's watch, until `stop` completes.
fn async_stream(
    watch: crate::live::Watch,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> impl Stream<Item = Result<axum::response::sse::Event, Infallible>> {
    use tokio::sync::broadcast::error::RecvError;
    let state = (watch, Box::pin(stop), true);
    futures::stream::unfold(state, |(mut watch, mut stop, first)| async move {
        if first && let Some(message) = watch.first.take() {
            return Some((Ok(message.event()), (watch, stop, false)));
        }
        loop {
            let next = tokio::select! {
                () = &mut stop => return None,
                next = watch.rx.recv() => next,
            };
            match next {
                Ok(message) => return Some((Ok(message.event()), (watch, stop, false))),
                // Fell behind: the whole view again, and only what follows.
                Err(RecvError::Lagged(_)) => {
                    if let Some(message) = watch.resync() {
                        return Some((Ok(message.event()), (watch, stop, false)));
                    }
                }
                Err(RecvError::Closed) => return None,
            }
        }
    })
}

/// `GET /api/sessions/{id}/preview/{call_id}`: the change a pending file
/// call would make, as a unified diff.
pub async fn preview(
    State(gw): State<Gateway>,
    person: Person,
    Path((id, call_id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let mut orchestrator = gw.orchestrator.clone();
    let preview = orchestrator
        .preview_call(gw.request(
            &person,
            pb::PreviewCallRequest {
                session_id: id,
                call_id,
            },
        )?)
        .await?
        .into_inner();
    Ok(Json(json!({
        "path": wire::web_text(&preview.path),
        "diff": wire::web_text(&preview.diff),
        "creates": preview.creates,
        "error": wire::web_text(&preview.error),
    })))
}

/// `GET /api/overview`: the model, the tools and MCP servers, the
/// reminders, and how the tool runner confines commands.
pub async fn overview(State(gw): State<Gateway>, person: Person) -> Result<Json<Value>, ApiError> {
    use agentry_proto::scheduler::v1 as rpb;
    use agentry_proto::tools::v1 as tpb;
    let mut orchestrator = gw.orchestrator.clone();
    let tools = orchestrator
        .list_tools(gw.request(&person, pb::ListToolsRequest::default())?)
        .await?
        .into_inner();
    let mut scheduler = gw.scheduler.clone();
    let reminders = match scheduler
        .list_reminders(gw.request(&person, rpb::ListRemindersRequest::default())?)
        .await
    {
        Ok(r) => json!(
            r.into_inner()
                .reminders
                .iter()
                .map(|r| json!({
                    "id": r.id,
                    "session_id": r.session_id,
                    "message": wire::web_text(&r.message),
                    "next_due_ms": time_ms(r.next_due.as_ref()),
                    "recurring": r.recurrence.is_some(),
                    "fired": r.fire_count,
                    "status": rpb::ReminderStatus::try_from(r.status)
                        .map(|s| s.as_str_name().trim_start_matches("REMINDER_STATUS_").to_lowercase())
                        .unwrap_or_default(),
                }))
                .collect::<Vec<_>>()
        ),
        Err(status) => json!({"error": status.message()}),
    };
    // The runner's report is the services' own: asked with the service
    // credential, shown to anyone logged in.
    let mut runner = gw.runner.clone();
    let sandbox = match runner.list_tools(tpb::ListToolsRequest::default()).await {
        Ok(r) => json!(r.into_inner().sandbox),
        Err(status) => json!({"error": status.message()}),
    };
    Ok(Json(json!({
        "model_problem": tools.model_problem,
        "context_window": tools.context_window,
        "tools": tools.tools.iter().map(|t| json!({
            "name": t.name,
            "description": wire::web_text(&t.description),
            "read_only": t.read_only,
            "mcp_server": t.mcp_server,
            "network": t.network,
        })).collect::<Vec<_>>(),
        "mcp_servers": tools.mcp_servers.iter().map(|s| json!({
            "name": s.name,
            "transport": s.transport,
            "state": s.state,
            "tools": s.tool_count,
            "error": wire::web_text(&s.error),
            "calls": s.calls,
            "failures": s.failures,
        })).collect::<Vec<_>>(),
        "reminders": reminders,
        "sandbox": sandbox,
    })))
}
