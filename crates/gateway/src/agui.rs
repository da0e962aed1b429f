//! AG-UI 1.0: `POST /agui` takes a `RunAgentInput` and answers with the
//! run as server-sent events, for web frontends that speak AG-UI.
//!
//! A thread is a session (created with the thread's id on its first run), a
//! run is the turn its last user message starts. The stream opens with
//! `RUN_STARTED`, carries the answer as `TEXT_MESSAGE_*`, tool calls as
//! `TOOL_CALL_*` (with their results), each model call and plan step as
//! `STEP_*`, and ends with `MESSAGES_SNAPSHOT` and `RUN_FINISHED`, or
//! `RUN_ERROR`. A call waiting for a person ends the run with an interrupt
//! outcome (one interrupt per question, its id the call's); the next run's
//! `resume` entries answer them and the turn goes on in that run. Calls are
//! made with a person's bearer token, as that person; a thread is its
//! person's own.

use crate::Gateway;
use crate::a2a::{Fold, RpcError, fold_session, owned, submit};
use crate::login::Person;
use agentry_client::relay::is_relayed;
use agentry_client::view::{CallState, Entry, SessionView};
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{self as spb, event::Kind};
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc;

/// The protocol version spoken.
const VERSION: &str = "1.0";

/// `POST /agui`.
pub async fn run(
    State(gw): State<Gateway>,
    ConnectInfo(crate::tls::ClientAddr(peer)): ConnectInfo<crate::tls::ClientAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let person = match crate::login::bearer(&gw, &headers, peer.ip()) {
        Ok(person) => person,
        Err(response) => return *response,
    };
    let input: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return crate::error::ApiError::bad_request(format!(
                "the body is a RunAgentInput (JSON): {e}"
            ))
            .into_response();
        }
    };
    let text = |name: &str| {
        input
            .get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let (Some(thread), Some(run)) = (text("threadId"), text("runId")) else {
        return crate::error::ApiError::bad_request("a RunAgentInput names its threadId and runId")
            .into_response();
    };
    let slot = match gw.stream_slot() {
        Ok(slot) => slot,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = mpsc::channel::<Value>(256);
    let driving = drive(gw.clone(), person, thread, run, input, tx);
    tokio::spawn(async move {
        // The place is the run's for as long as it streams.
        let _slot = slot;
        driving.await;
    });
    let stop = gw.stop.subscribe();
    let events = futures::stream::unfold((rx, stop), |(mut rx, mut stop)| async move {
        if *stop.borrow() {
            return None;
        }
        let item = tokio::select! {
            item = rx.recv() => item?,
            _ = stop.changed() => return None,
        };
        Some((
            Ok::<_, Infallible>(SseEvent::default().data(item.to_string())),
            (rx, stop),
        ))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// The run: starts or resumes the thread's turn and streams it.
async fn drive(
    gw: Gateway,
    person: Person,
    thread: String,
    run: String,
    input: Value,
    tx: mpsc::Sender<Value>,
) {
    let mut out = Stream {
        tx,
        thread: thread.clone(),
        run: run.clone(),
        text: None,
        step: None,
        ok: true,
        calls: Default::default(),
    };
    out.send(json!({
        "type": "RUN_STARTED", "threadId": thread, "runId": run, "protocolVersion": VERSION
    }))
    .await;
    match start(&gw, &person, &thread, &input).await {
        Ok((fold, turn)) => follow(&gw, &person, fold, turn, &mut out).await,
        Err(e) => {
            out.send(json!({"type": "RUN_ERROR", "message": e.message, "code": code_name(e.code)}))
                .await;
        }
    }
}

fn code_name(code: i64) -> &'static str {
    match code {
        -32602 => "invalid_input",
        -32001 => "not_found",
        -32004 => "not_allowed",
        _ => "internal",
    }
}

/// Starts the run's turn from the input's last user message, or answers
/// the interrupts its `resume` entries name. Returns the session read up to
/// now and the turn to follow.
async fn start(
    gw: &Gateway,
    person: &Person,
    thread: &str,
    input: &Value,
) -> Result<(Fold, String), RpcError> {
    // Each person's threads are sessions of their own: nobody can take
    // over, or squat, another person's thread id.
    let session = session_of(&person.name, thread);
    let exists = fold_session(gw, person, &session).await;
    let fold = match exists {
        Ok(fold) => fold,
        Err(e) if e.code == -32001 => {
            gw.orchestrator
                .clone()
                .create_session(crate::a2a::request(
                    gw,
                    person,
                    pb::CreateSessionRequest {
                        session_id: session.clone(),
                        title: "AG-UI".to_string(),
                        ..Default::default()
                    },
                )?)
                .await?;
            fold_session(gw, person, &session).await?
        }
        Err(e) => return Err(e),
    };
    if fold.turns.first().is_some_and(|t| !owned(person, t)) {
        return Err(RpcError {
            code: -32001,
            message: format!("no thread {thread} of yours"),
        });
    }
    if let Some(entries) = input.get("resume").and_then(Value::as_array)
        && !entries.is_empty()
    {
        let Some(turn) = fold
            .turns
            .last()
            .filter(|t| fold.asking(t) && owned(person, t))
            .cloned()
        else {
            return Err(RpcError {
                code: -32004,
                message: "nothing in this thread waits for an answer; send a message instead"
                    .to_string(),
            });
        };
        for entry in entries {
            // A tool's MCP server's questions.
            if let Some(asked) = entry
                .get("interruptId")
                .and_then(Value::as_str)
                .and_then(|id| fold.view.inputs.iter().find(|q| q.call_id == id))
            {
                let (action, content_json) = input_answer(entry)?;
                submit(
                    gw,
                    person,
                    &fold.session_id,
                    pb::input::Kind::McpAnswer(pb::McpAnswerInput {
                        call_id: asked.call_id.clone(),
                        action,
                        content_json,
                    }),
                )
                .await?;
                continue;
            }
            let (call_id, decision, reason) = resume_entry(entry)?;
            // Only what this thread asks can be answered here.
            if !fold.view.questions.iter().any(|q| q.call_id == call_id) {
                return Err(RpcError {
                    code: -32602,
                    message: format!("this thread has no interrupt {call_id:?}"),
                });
            }
            let (session_id, call_id) =
                agentry_client::relay::answer_to(&fold.session_id, &call_id);
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
        }
        let fold = fold_session(gw, person, &session).await?;
        return Ok((fold, turn.id));
    }
    let text = last_user_text(input)?;
    let submitted = submit(
        gw,
        person,
        &session,
        pb::input::Kind::UserMessage(pb::UserInput {
            text,
            approval_mode: spb::ApprovalMode::Policy as i32,
            ..Default::default()
        }),
    )
    .await?;
    Ok((fold, submitted.turn_id))
}

/// The session of `person`'s thread `thread`: a name of its own for each
/// person and thread (session ids are short and plain).
fn session_of(person: &str, thread: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{person}\u{0}{thread}").as_bytes());
    let hex: String = digest.iter().take(10).map(|b| format!("{b:02x}")).collect();
    format!("agui-{hex}")
}

/// The text of the input's last message, which must be the person's.
fn last_user_text(input: &Value) -> Result<String, RpcError> {
    let invalid = |message: &str| RpcError {
        code: -32602,
        message: message.to_string(),
    };
    let last = input
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .ok_or_else(|| invalid("the input has no messages: its last one is the person's"))?;
    if last.get("role").and_then(Value::as_str) != Some("user") {
        return Err(invalid(
            "the input's last message is not the person's (role \"user\"); to answer an \
             interrupt, send resume entries",
        ));
    }
    let text = match last.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    if text.trim().is_empty() {
        return Err(invalid("the person's message has no text"));
    }
    Ok(text)
}

/// A resume entry as an answer: `resolved` with a payload of `true`,
/// `"approve"`, or `{"decision", "reason"}`; `cancelled` denies.
fn resume_entry(entry: &Value) -> Result<(String, spb::ApprovalDecision, String), RpcError> {
    use spb::ApprovalDecision::{Approve, ApproveForSession, Deny};
    let invalid = |message: String| RpcError {
        code: -32602,
        message,
    };
    let id = entry
        .get("interruptId")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid("a resume entry names its interruptId".to_string()))?
        .to_string();
    match entry.get("status").and_then(Value::as_str) {
        Some("cancelled") => return Ok((id, Deny, "abandoned by the person".to_string())),
        Some("resolved") => {}
        other => {
            return Err(invalid(format!(
                "a resume entry's status is \"resolved\" or \"cancelled\", not {other:?}"
            )));
        }
    }
    let payload = entry.get("payload").cloned().unwrap_or(Value::Null);
    let (word, reason) = match &payload {
        Value::Bool(true) => ("approve".to_string(), String::new()),
        Value::Bool(false) => ("deny".to_string(), String::new()),
        Value::String(s) => (s.to_lowercase(), String::new()),
        Value::Object(o) => (
            o.get("decision")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_lowercase(),
            o.get("reason")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        ),
        _ => (String::new(), String::new()),
    };
    let decision = match word.as_str() {
        "approve" | "approved" | "yes" => Approve,
        "approve_for_session" => ApproveForSession,
        "deny" | "denied" | "no" => Deny,
        _ => {
            return Err(invalid(format!(
                "interrupt {id}: the payload is {{\"decision\": \"approve\" | \
                 \"approve_for_session\" | \"deny\", \"reason\": …}} or true/false, not {payload}"
            )));
        }
    };
    Ok((id, decision, reason))
}

/// The interrupt of a call whose MCP server asks a person for input: its
/// questions (the server's words, passed on as text, never followed) and
/// the answer it takes.
fn input_interrupt(asked: &spb::McpInputRequested) -> Value {
    let lines: Vec<String> = asked
        .questions
        .iter()
        .map(|q| match q.mode.as_str() {
            "url" => format!("{} (visit {})", q.message, q.url),
            _ => q.message.clone(),
        })
        .collect();
    let content = match asked.questions.as_slice() {
        [only] if only.mode != "url" => {
            serde_json::from_str::<Value>(&only.schema_json).unwrap_or(json!({"type": "object"}))
        }
        _ => json!({"type": "object"}),
    };
    json!({
        "id": asked.call_id,
        "reason": "input_required",
        "message": format!("The MCP server {} asks: {}", asked.server, lines.join("; ")),
        "toolCallId": asked.call_id,
        "responseSchema": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["accept", "decline", "cancel"]},
                "content": content
            }
        },
        "metadata": {
            "server": asked.server,
            "questions": asked.questions.iter().map(|q| json!({
                "key": q.key, "mode": q.mode, "message": q.message,
                "schema": serde_json::from_str::<Value>(&q.schema_json).unwrap_or(Value::Null),
                "url": q.url,
            })).collect::<Vec<_>>()
        }
    })
}

/// A resume entry as the answer to an MCP server's questions: `cancelled`
/// cancels; `resolved` with `{"action", "content"}`, the fields themselves,
/// or the word "decline".
fn input_answer(entry: &Value) -> Result<(String, String), RpcError> {
    let invalid = |message: String| RpcError {
        code: -32602,
        message,
    };
    match entry.get("status").and_then(Value::as_str) {
        Some("cancelled") => return Ok(("cancel".to_string(), String::new())),
        Some("resolved") => {}
        other => {
            return Err(invalid(format!(
                "a resume entry's status is \"resolved\" or \"cancelled\", not {other:?}"
            )));
        }
    }
    match entry.get("payload") {
        Some(Value::String(word)) => Ok((word.to_lowercase(), String::new())),
        Some(Value::Object(o)) if o.contains_key("action") || o.contains_key("content") => {
            let action = o
                .get("action")
                .and_then(Value::as_str)
                .unwrap_or("accept")
                .to_string();
            let content = match o.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(content) => content.to_string(),
            };
            Ok((action, content))
        }
        Some(fields @ Value::Object(_)) => Ok(("accept".to_string(), fields.to_string())),
        None | Some(Value::Null) => Ok(("accept".to_string(), String::new())),
        Some(other) => Err(invalid(format!(
            "the answer to an MCP server's questions is {{\"action\", \"content\"}}, the \
             fields, or \"decline\"; not {other}"
        ))),
    }
}

/// The stream being written: what is open in it.
struct Stream {
    tx: mpsc::Sender<Value>,
    thread: String,
    run: String,
    /// The assistant message being streamed.
    text: Option<String>,
    /// The step open.
    step: Option<String>,
    /// The page is still reading.
    ok: bool,
    /// The tool calls this stream announced.
    calls: std::collections::HashSet<String>,
}

impl Stream {
    async fn send(&mut self, mut event: Value) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        event["timestamp"] = json!(now);
        if self.ok && self.tx.send(event).await.is_err() {
            self.ok = false;
        }
    }

    /// Announces a tool call: its name and arguments, whole.
    async fn call(&mut self, id: &str, tool: &str, arguments: &str) {
        if !self.calls.insert(id.to_string()) {
            return;
        }
        self.end_text().await;
        self.send(json!({"type": "TOOL_CALL_START", "toolCallId": id, "toolCallName": tool}))
            .await;
        self.send(json!({"type": "TOOL_CALL_ARGS", "toolCallId": id, "delta": arguments}))
            .await;
        self.send(json!({"type": "TOOL_CALL_END", "toolCallId": id}))
            .await;
    }

    async fn end_text(&mut self) {
        if let Some(id) = self.text.take() {
            self.send(json!({"type": "TEXT_MESSAGE_END", "messageId": id}))
                .await;
        }
    }

    async fn end_step(&mut self) {
        self.end_text().await;
        if let Some(name) = self.step.take() {
            self.send(json!({"type": "STEP_FINISHED", "stepName": name}))
                .await;
        }
    }

    async fn start_step(&mut self, name: String) {
        if self.step.as_deref() == Some(name.as_str()) {
            return;
        }
        self.end_step().await;
        self.send(json!({"type": "STEP_STARTED", "stepName": name}))
            .await;
        self.step = Some(name);
    }

    /// Ends the run: what is open, the thread's messages, the outcome.
    async fn finish(
        &mut self,
        view: &SessionView,
        calls: &std::collections::HashMap<String, (String, String)>,
        outcome: Value,
        result: Option<String>,
    ) {
        self.end_step().await;
        self.send(snapshot(view, calls)).await;
        let mut event = json!({
            "type": "RUN_FINISHED", "threadId": self.thread, "runId": self.run, "outcome": outcome
        });
        if let Some(result) = result {
            event["result"] = json!(result);
        }
        self.send(event).await;
    }
}

/// The thread's messages as AG-UI messages, from the shared view (a tool
/// call's arguments as the model wrote them, from `calls`).
fn snapshot(
    view: &SessionView,
    calls: &std::collections::HashMap<String, (String, String)>,
) -> Value {
    let mut messages = Vec::new();
    for (i, entry) in view.entries.iter().enumerate() {
        if view.rewound.get(i).copied().unwrap_or(false) {
            continue;
        }
        let id = format!("m{}-{i}", view.place(i));
        match entry {
            Entry::User { text, .. } => {
                messages.push(json!({"id": id, "role": "user", "content": text}));
            }
            Entry::Answer { text, .. } if !text.is_empty() => {
                messages.push(json!({"id": id, "role": "assistant", "content": text}));
            }
            Entry::Tool(block) => {
                messages.push(json!({
                    "id": id,
                    "role": "assistant",
                    "toolCalls": [{
                        "id": block.call_id,
                        "type": "function",
                        "function": {
                            "name": block.tool,
                            "arguments": calls.get(&block.call_id).map_or("{}", |c| c.1.as_str())
                        }
                    }]
                }));
                if block.state == CallState::Done {
                    let mut result = json!({
                        "id": format!("{id}-result"),
                        "role": "tool",
                        "toolCallId": block.call_id,
                        "content": block.output
                    });
                    if block.is_error {
                        result["error"] = json!(block.output);
                    }
                    messages.push(result);
                }
            }
            _ => {}
        }
    }
    json!({"type": "MESSAGES_SNAPSHOT", "messages": messages})
}

/// Follows turn `turn_id` from where `fold` stopped reading, writing the
/// run's events, until it ends or waits for a person.
async fn follow(gw: &Gateway, person: &Person, mut fold: Fold, turn_id: String, out: &mut Stream) {
    let interrupt = |fold: &Fold| {
        let mut interrupts: Vec<Value> = fold
            .view
            .questions
            .iter()
            .map(|q| {
                let args = agentry_client::text::short_args(&q.tool, &q.arguments_json);
                json!({
                    "id": q.call_id,
                    "reason": "tool_approval",
                    "message": format!("Agentry asks before running {} {args}", q.tool),
                    "toolCallId": q.call_id,
                    "responseSchema": {
                        "type": "object",
                        "properties": {
                            "decision": {"type": "string", "enum": ["approve", "approve_for_session", "deny"]},
                            "reason": {"type": "string"}
                        },
                        "required": ["decision"]
                    },
                    "metadata": {"tool": q.tool, "arguments": q.arguments_json, "rule": q.matched_rule}
                })
            })
            .collect();
        interrupts.extend(fold.view.inputs.iter().map(input_interrupt));
        json!({"type": "interrupt", "interrupts": interrupts})
    };
    // Already waiting (a resume that did not answer everything).
    if let Some(turn) = fold.turn(&turn_id).cloned()
        && fold.asking(&turn)
    {
        let outcome = interrupt(&fold);
        out.finish(&fold.view, &fold.calls, outcome, None).await;
        return;
    }
    let subscribe = match crate::a2a::request(
        gw,
        person,
        pb::SubscribeRequest {
            session_id: fold.session_id.clone(),
            from_seq: fold.next_seq,
            live_only: false,
        },
    ) {
        Ok(r) => r,
        Err(e) => {
            out.send(json!({"type": "RUN_ERROR", "message": e.message}))
                .await;
            return;
        }
    };
    let mut events = match gw.orchestrator.clone().subscribe(subscribe).await {
        Ok(events) => events.into_inner(),
        Err(status) => {
            let message = format!("cannot follow the thread: {}", status.message());
            out.send(json!({"type": "RUN_ERROR", "message": message}))
                .await;
            return;
        }
    };
    let mut step_number = 0u32;
    let mut stop = gw.stop.subscribe();
    let mut check = tokio::time::interval(Duration::from_secs(2));
    while out.ok {
        // A page that went away ends the run's watch, even while nothing
        // happens.
        let next = tokio::select! {
            next = events.message() => next,
            () = out.tx.closed() => return,
            _ = stop.changed() => return,
            _ = check.tick() => {
                if !person.still_logged_in(gw) {
                    out.send(json!({"type": "RUN_ERROR", "message": "your token was removed or replaced", "code": "unauthenticated"})).await;
                    return;
                }
                continue;
            }
        };
        let event = match next {
            Ok(Some(event)) => event,
            Ok(None) | Err(_) => {
                out.send(json!({"type": "RUN_ERROR", "message": "the thread's events stopped; run again to go on"}))
                    .await;
                return;
            }
        };
        let applied = fold.apply(&event);
        if event.turn_id != turn_id || is_relayed(&fold.session_id, &event) {
            // A sub-agent's question waits in this run too.
            if applied.asked.is_some()
                && let Some(turn) = fold.turn(&turn_id).cloned()
                && fold.asking(&turn)
            {
                let outcome = interrupt(&fold);
                out.finish(&fold.view, &fold.calls, outcome, None).await;
                return;
            }
            continue;
        }
        match &event.kind {
            Some(Kind::ModelTextDelta(d)) => {
                if out.step.is_none() {
                    step_number += 1;
                    out.start_step(format!("model call {step_number}")).await;
                }
                if out.text.is_none() {
                    let id = format!("{turn_id}-text-{}", fold.next_seq);
                    out.send(
                        json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"}),
                    )
                    .await;
                    out.text = Some(id);
                }
                let id = out.text.clone().unwrap_or_default();
                out.send(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": d.text}))
                    .await;
            }
            Some(Kind::ModelMessage(m)) => {
                if out.step.is_none() {
                    step_number += 1;
                    out.start_step(format!("model call {step_number}")).await;
                }
                if out.text.is_none() && !m.text.is_empty() {
                    // Nothing streamed: the whole text at once.
                    let id = format!("{turn_id}-text-{}", event.seq);
                    out.send(
                        json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"}),
                    )
                    .await;
                    out.send(
                        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": m.text}),
                    )
                    .await;
                    out.text = Some(id);
                }
                out.end_text().await;
            }
            Some(Kind::ToolCallRequested(c)) => {
                out.call(&c.call_id, &c.tool, &c.arguments_json).await;
            }
            Some(Kind::ToolResult(r)) => {
                // A call an earlier run announced (and a person approved
                // since) is announced in this run too, before its result.
                let (tool, arguments) = fold.calls.get(&r.call_id).cloned().unwrap_or_default();
                out.call(&r.call_id, &tool, &arguments).await;
                out.send(json!({
                    "type": "TOOL_CALL_RESULT",
                    "messageId": format!("{}-result", r.call_id),
                    "toolCallId": r.call_id,
                    "content": r.output,
                    "role": "tool"
                }))
                .await;
                // The next model call is a step of its own.
                out.end_step().await;
            }
            Some(Kind::PlanStepUpdated(u)) => {
                let title = fold
                    .view
                    .plan
                    .get(u.index as usize)
                    .map(|item| format!("plan step {}: {}", u.index + 1, item.title))
                    .unwrap_or_else(|| format!("plan step {}", u.index + 1));
                match spb::PlanStepStatus::try_from(u.status) {
                    Ok(spb::PlanStepStatus::InProgress) => out.start_step(title).await,
                    Ok(spb::PlanStepStatus::Completed | spb::PlanStepStatus::Failed) => {
                        out.end_step().await;
                    }
                    _ => {}
                }
            }
            Some(Kind::TurnFinished(f)) => {
                match spb::TurnOutcome::try_from(f.outcome).unwrap_or_default() {
                    spb::TurnOutcome::Completed => {
                        let answer = Some(f.message.clone());
                        out.finish(&fold.view, &fold.calls, json!({"type": "success"}), answer)
                            .await;
                    }
                    spb::TurnOutcome::Cancelled => {
                        out.finish(&fold.view, &fold.calls, json!({"type": "cancelled"}), None)
                            .await;
                    }
                    other => {
                        out.end_step().await;
                        out.send(snapshot(&fold.view, &fold.calls)).await;
                        let code = match other {
                            spb::TurnOutcome::StepLimit => "step_limit",
                            spb::TurnOutcome::Budget => "budget",
                            _ => "failed",
                        };
                        out.send(json!({"type": "RUN_ERROR", "message": f.message, "code": code}))
                            .await;
                    }
                }
                return;
            }
            _ if applied.asked.is_some()
                || matches!(event.kind, Some(Kind::McpInputRequested(_))) =>
            {
                let outcome = interrupt(&fold);
                out.finish(&fold.view, &fold.calls, outcome, None).await;
                return;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn resume_entries_become_answers() {
        use spb::ApprovalDecision::{Approve, ApproveForSession, Deny};
        let entry = |status: &str, payload: Value| json!({"interruptId": "c1", "status": status, "payload": payload});
        assert_eq!(
            resume_entry(&entry("resolved", json!(true))).unwrap().1,
            Approve
        );
        assert_eq!(
            resume_entry(&entry(
                "resolved",
                json!({"decision": "approve_for_session"})
            ))
            .unwrap()
            .1,
            ApproveForSession
        );
        let (_, d, reason) = resume_entry(&entry(
            "resolved",
            json!({"decision": "deny", "reason": "no"}),
        ))
        .unwrap();
        assert_eq!((d, reason.as_str()), (Deny, "no"));
        assert_eq!(
            resume_entry(&entry("cancelled", Value::Null)).unwrap().1,
            Deny
        );
        assert!(resume_entry(&entry("resolved", json!("maybe"))).is_err());
        assert!(resume_entry(&entry("pending", json!(true))).is_err());
        assert!(resume_entry(&json!({"status": "resolved"})).is_err());
    }

    #[test]
    fn each_persons_threads_are_sessions_of_their_own() {
        let ann = session_of("ann", "t1");
        assert_eq!(
            ann,
            session_of("ann", "t1"),
            "the same thread, the same session"
        );
        assert_ne!(ann, session_of("bob", "t1"));
        assert_ne!(ann, session_of("ann", "t2"));
        assert!(ann.len() <= 64 && ann.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }

    #[test]
    fn the_run_takes_the_last_message_when_it_is_the_persons() {
        let input = json!({"messages": [
            {"id": "1", "role": "user", "content": "first"},
            {"id": "2", "role": "assistant", "content": "ok"},
            {"id": "3", "role": "user", "content": [{"type": "text", "text": "second"}]}
        ]});
        assert_eq!(last_user_text(&input).unwrap(), "second");
        let ends_with_answer =
            json!({"messages": [{"id": "2", "role": "assistant", "content": "ok"}]});
        assert!(
            last_user_text(&ends_with_answer)
                .unwrap_err()
                .message
                .contains("resume")
        );
        assert!(last_user_text(&json!({})).is_err());
    }
}
