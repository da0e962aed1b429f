//! Tools the orchestrator serves itself: reminders, scoped to the session
//! that calls them and backed by the scheduler service, and `recall`, which
//! reads the session's own log (the originals of compacted messages).

use crate::deps::Deps;
use crate::errors::ToolFailure;
use crate::reducer::ToolFlags;
use agentry_llm::{ToolCall, ToolDefinition};
use agentry_proto::scheduler::v1 as spb;
use agentry_proto::sessions::v1 as pb;
use agentry_tool::{Context, Registry, Running, Tool, ToolSpec};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Instant;

/// The built-in tool that subscribes a session to an MCP resource (offered
/// only when the runners have MCP servers).
pub const MCP_SUBSCRIBE: &str = "mcp_subscribe";

/// What the orchestrator gives a call of one of its own tools: the session
/// and where the call acts, the call itself, and where its progress goes
/// (it becomes the call's live output).
pub struct TurnCall {
    /// The sessions this replica drives (a delegate call drives its task
    /// through them, as a client would).
    pub sessions: crate::service::Sessions,
    /// The calling session.
    pub session_id: String,
    /// The turn the call came in.
    pub turn_id: String,
    /// The model response of the turn the call came in.
    pub step: u32,
    /// How the turn's calls are approved.
    pub approval_mode: pb::ApprovalMode,
    /// The call.
    pub call: ToolCall,
    /// Lines of progress, shown as the call's output while it runs.
    pub progress: crate::agents::Progress,
}

impl Context for TurnCall {
    type Output = pb::ToolResult;
}

/// The orchestrator's own tools: reminders, `recall`, `mcp_subscribe` and
/// `delegate`. What the model is offered of them is worked out per catalog
/// ([`crate::deps::Deps::tools`]): `delegate` lists the configured agents
/// and `mcp_subscribe` needs MCP servers.
pub fn own() -> &'static Registry<TurnCall> {
    static OWN: std::sync::LazyLock<Registry<TurnCall>> = std::sync::LazyLock::new(registry);
    &OWN
}

fn registry() -> Registry<TurnCall> {
    let mut registry = Registry::new();
    add(
        &mut registry,
        Builtin {
            spec: ToolSpec::changing(
                "schedule_reminder",
                "Schedule a reminder for this conversation. It arrives as a message \
                    when due, even if nobody is chatting. Give `due` as a duration (\"in 10m\", \
                    \"2h30m\", \"1d\") or an RFC 3339 time with offset; or a 5-field `cron` \
                    expression (with an IANA `time_zone`) for a recurring reminder. kind \"notify\" \
                    just tells the person; \"task\" wakes you up to act on it.",
                serde_json::json!({
                    "type": "object",
                    "properties": {
                        "message": {"type": "string", "description": "What the reminder says."},
                        "due": {"type": "string", "description": "When: \"in 10m\", \"2h\", or RFC 3339 with offset."},
                        "cron": {"type": "string", "description": "For recurring reminders: minute hour day-of-month month day-of-week."},
                        "time_zone": {"type": "string", "description": "IANA time zone for cron, e.g. Europe/Paris (default UTC)."},
                        "kind": {"type": "string", "enum": ["notify", "task"], "description": "notify (default) or task."}
                    },
                    "required": ["message"],
                    "additionalProperties": false
                }),
            ),
            act: |deps, session, arguments| Box::pin(schedule(deps, session, arguments)),
        },
    );
    add(
        &mut registry,
        Builtin {
            spec: ToolSpec::reading(
                "list_reminders",
                "List this conversation's reminders.",
                serde_json::json!({
                    "type": "object",
                    "properties": {
                        "status": {"type": "string", "enum": ["pending", "completed", "cancelled", "all"], "description": "Which reminders (default pending)."}
                    },
                    "additionalProperties": false
                }),
            ),
            act: |deps, session, arguments| Box::pin(list(deps, session, arguments)),
        },
    );
    add(
        &mut registry,
        Builtin {
            spec: ToolSpec::changing(
                "cancel_reminder",
                "Cancel one of this conversation's pending reminders.",
                serde_json::json!({
                    "type": "object",
                    "properties": {
                        "reminder_id": {"type": "string", "description": "The id schedule_reminder or list_reminders gave."}
                    },
                    "required": ["reminder_id"],
                    "additionalProperties": false
                }),
            ),
            act: |deps, session, arguments| Box::pin(cancel(deps, session, arguments)),
        },
    );
    add(
        &mut registry,
        Builtin {
            spec: ToolSpec::reading(
                "recall",
                "Read original events of this conversation by seq, e.g. the ones \
                    a summary replaced (it names their range). Returns messages, tool calls and \
                    tool results.",
                serde_json::json!({
                    "type": "object",
                    "properties": {
                        "from_seq": {"type": "integer", "minimum": 1, "description": "First seq to read."},
                        "to_seq": {"type": "integer", "minimum": 1, "description": "Last seq to read; one call returns at most 200 messages and results, and says where to go on."}
                    },
                    "required": ["from_seq", "to_seq"],
                    "additionalProperties": false
                }),
            ),
            act: |deps, session, arguments| Box::pin(recall(deps, session, arguments)),
        },
    );
    add(
        &mut registry,
        Builtin {
            spec: ToolSpec::changing(
                MCP_SUBSCRIBE,
                "Subscribe this conversation to a resource of an MCP server: when the \
                resource changes, you are woken with its new content, even if nobody is \
                chatting. Set unsubscribe to stop.",
                serde_json::json!({
                    "type": "object",
                    "properties": {
                        "server": {"type": "string", "description": "The MCP server's name (the part before __ in its tools' names)."},
                        "uri": {"type": "string", "description": "The resource's URI."},
                        "unsubscribe": {"type": "boolean", "description": "Stop the subscription instead."}
                    },
                    "required": ["server", "uri"],
                    "additionalProperties": false
                }),
            ),
            act: |deps, session, arguments| Box::pin(mcp_subscribe(deps, session, arguments)),
        },
    );
    add(&mut registry, crate::agents::Delegate::default());
    registry
}

fn add(registry: &mut Registry<TurnCall>, tool: impl Tool<TurnCall> + 'static) {
    // The names are distinct constants; a clash is a bug the tests catch.
    if let Err(taken) = registry.register(Arc::new(tool)) {
        tracing::error!(error = %taken, "a built-in tool is left out");
    }
}

/// The definition and flags a tool is offered to the model with.
pub fn offered(spec: &ToolSpec) -> (ToolDefinition, ToolFlags) {
    (
        ToolDefinition {
            name: spec.name.clone(),
            description: spec.description.clone(),
            parameters: spec.schema.clone(),
        },
        ToolFlags {
            read_only: spec.read_only,
            parallel_safe: spec.parallel_safe,
            read_only_hint: false,
            network: spec.network,
        },
    )
}

/// A built-in served by one async function of the session's id and the
/// call's arguments.
type Act = for<'a> fn(&'a Deps, &'a str, &'a str) -> Running<'a, Result<String, ToolFailure>>;

struct Builtin {
    spec: ToolSpec,
    act: Act,
}

impl Tool<TurnCall> for Builtin {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run<'a>(&'a self, call: &'a TurnCall, arguments: &'a str) -> Running<'a, pb::ToolResult> {
        Box::pin(async move {
            let started = Instant::now();
            let deps = call.sessions.deps();
            let outcome = (self.act)(deps, &call.session_id, arguments).await;
            result_of(&call.call, outcome, started)
        })
    }
}

/// Events one `recall` call may return.
const RECALL_MAX_EVENTS: u64 = 200;
/// Characters one `recall` call may return.
const RECALL_MAX_CHARS: usize = 16_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecallArgs {
    from_seq: u64,
    to_seq: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleArgs {
    message: String,
    #[serde(default)]
    due: Option<String>,
    #[serde(default)]
    cron: Option<String>,
    #[serde(default)]
    time_zone: Option<String>,
    #[serde(default)]
    kind: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    #[serde(default)]
    status: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelArgs {
    reminder_id: String,
}

fn parse<T: for<'de> Deserialize<'de>>(tool: &str, json: &str) -> Result<T, ToolFailure> {
    let json = if json.trim().is_empty() { "{}" } else { json };
    serde_json::from_str(json)
        .map_err(|e| ToolFailure(format!("invalid arguments for {tool}: {e}")))
}

fn format_time(t: Option<&prost_types::Timestamp>) -> String {
    t.and_then(|t| chrono::DateTime::from_timestamp(t.seconds, 0))
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| "-".into())
}

fn describe(r: &spb::Reminder) -> String {
    let kind = match pb::ReminderKind::try_from(r.kind) {
        Ok(pb::ReminderKind::Task) => "task",
        _ => "notify",
    };
    let status = match spb::ReminderStatus::try_from(r.status) {
        Ok(spb::ReminderStatus::Pending) => "pending",
        Ok(spb::ReminderStatus::Completed) => "completed",
        Ok(spb::ReminderStatus::Cancelled) => "cancelled",
        _ => "unknown",
    };
    let recurrence = r
        .recurrence
        .as_ref()
        .map(|c| format!(", every \"{}\" ({})", c.cron, c.time_zone))
        .unwrap_or_default();
    format!(
        "{} [{status}, {kind}{recurrence}] next due {}: {}",
        r.id,
        format_time(r.next_due.as_ref()),
        r.message
    )
}

/// The result of a call the orchestrator ran itself: its output, or the
/// error the model is told.
pub(crate) fn result_of(
    call: &ToolCall,
    outcome: Result<String, ToolFailure>,
    started: Instant,
) -> pb::ToolResult {
    let (output, is_error) = match outcome {
        Ok(output) => (output, false),
        Err(e) => (format!("error: {e}"), true),
    };
    pb::ToolResult {
        truncated: false,
        timed_out: false,
        sub_agent_usage: None,
        call_id: call.id.clone(),
        tool: call.name.clone(),
        output,
        is_error,
        exit_code: None,
        duration_ms: started.elapsed().as_millis() as u64,
        runner_id: "orchestrator".into(),
        secrets_used: Vec::new(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscribeArgs {
    server: String,
    uri: String,
    #[serde(default)]
    unsubscribe: bool,
}

async fn mcp_subscribe(
    deps: &Deps,
    session_id: &str,
    arguments: &str,
) -> Result<String, ToolFailure> {
    let args: SubscribeArgs = parse(MCP_SUBSCRIBE, arguments)?;
    let request = agentry_proto::tools::v1::McpSubscribeRequest {
        session_id: session_id.to_string(),
        server: args.server.clone(),
        uri: args.uri.clone(),
        unsubscribe: args.unsubscribe,
    };
    let response = if args.unsubscribe {
        // Whichever replica holds it: ask every one.
        let mut last = Err("no tool runner answered".to_string());
        for replica in deps.runners.replicas() {
            match replica.client().mcp_subscribe(request.clone()).await {
                Ok(r) => last = Ok(r.into_inner()),
                Err(s) if last.is_err() => last = Err(s.message().to_string()),
                Err(_) => {}
            }
        }
        last?
    } else {
        deps.runners
            .on_any(|mut client| {
                let request = request.clone();
                async move {
                    client
                        .mcp_subscribe(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await
            .map_err(|s| s.message().to_string())?
    };
    let now = if response.uris.is_empty() {
        "none".to_string()
    } else {
        response.uris.join(", ")
    };
    Ok(if args.unsubscribe {
        format!(
            "unsubscribed from {} on {}; subscriptions on {} now: {now}",
            args.uri, args.server, args.server
        )
    } else {
        format!(
            "subscribed to {} on {}: a change wakes this conversation with the new content; \
             subscriptions on {} now: {now}",
            args.uri, args.server, args.server
        )
    })
}

fn scheduler_error(deps: &Deps, status: tonic::Status) -> String {
    match status.code() {
        tonic::Code::Unavailable => format!(
            "the scheduler at {} is unavailable: {}",
            deps.scheduler_url,
            status.message()
        ),
        _ => status.message().to_string(),
    }
}

async fn schedule(deps: &Deps, session_id: &str, arguments: &str) -> Result<String, ToolFailure> {
    let args: ScheduleArgs = parse("schedule_reminder", arguments)?;
    let kind = match args.kind.as_deref().unwrap_or("notify") {
        "notify" => pb::ReminderKind::Notify,
        "task" => pb::ReminderKind::Task,
        other => {
            return Err(ToolFailure(format!(
                "kind must be \"notify\" or \"task\", not {other:?}"
            )));
        }
    };
    if args.due.is_none() && args.cron.is_none() {
        return Err("give `due` (e.g. \"in 10m\") or a `cron` expression".into());
    }
    let request = spb::CreateReminderRequest {
        session_id: session_id.to_string(),
        due: args.due.unwrap_or_default(),
        message: args.message,
        kind: kind as i32,
        recurrence: args.cron.map(|cron| spb::Recurrence {
            cron,
            time_zone: args.time_zone.unwrap_or_else(|| "UTC".into()),
            missed: spb::MissedPolicy::Unspecified as i32,
        }),
        task: None,
    };
    let reminder = deps
        .scheduler
        .clone()
        .create_reminder(request)
        .await
        .map_err(|s| scheduler_error(deps, s))?
        .into_inner();
    Ok(format!("scheduled reminder {}", describe(&reminder)))
}

async fn list(deps: &Deps, session_id: &str, arguments: &str) -> Result<String, ToolFailure> {
    let args: ListArgs = parse("list_reminders", arguments)?;
    let status = match args.status.as_deref().unwrap_or("pending") {
        "pending" => spb::ReminderStatus::Pending,
        "completed" => spb::ReminderStatus::Completed,
        "cancelled" => spb::ReminderStatus::Cancelled,
        "all" => spb::ReminderStatus::Unspecified,
        other => {
            return Err(ToolFailure(format!(
                "status must be pending, completed, cancelled or all, not {other:?}"
            )));
        }
    };
    let reminders = deps
        .scheduler
        .clone()
        .list_reminders(spb::ListRemindersRequest {
            session_id: session_id.to_string(),
            status: status as i32,
        })
        .await
        .map_err(|s| scheduler_error(deps, s))?
        .into_inner()
        .reminders;
    if reminders.is_empty() {
        return Ok("no reminders".into());
    }
    Ok(reminders
        .iter()
        .map(describe)
        .collect::<Vec<_>>()
        .join("\n"))
}

async fn cancel(deps: &Deps, session_id: &str, arguments: &str) -> Result<String, ToolFailure> {
    let args: CancelArgs = parse("cancel_reminder", arguments)?;
    let reminder = deps
        .scheduler
        .clone()
        .cancel_reminder(spb::CancelReminderRequest {
            reminder_id: args.reminder_id,
            session_id: session_id.to_string(),
        })
        .await
        .map_err(|s| scheduler_error(deps, s))?
        .into_inner();
    Ok(format!("cancelled reminder {}", describe(&reminder)))
}

async fn recall(deps: &Deps, session_id: &str, arguments: &str) -> Result<String, ToolFailure> {
    let args: RecallArgs = parse("recall", arguments)?;
    if args.from_seq == 0 || args.to_seq < args.from_seq {
        return Err(ToolFailure(format!(
            "from_seq must be at least 1 and to_seq at least from_seq (got {} and {})",
            args.from_seq, args.to_seq
        )));
    }
    // Streamed deltas and state changes are skipped, so pages are read
    // until enough events worth showing are found.
    const PAGE: u64 = 500;
    let mut out = String::new();
    let mut shown = 0u64;
    let mut from = args.from_seq;
    let mut last_read = None;
    'pages: while from <= args.to_seq {
        let limit = PAGE.min(args.to_seq - from + 1);
        let page = deps
            .store
            .clone()
            .read(pb::ReadRequest {
                session_id: session_id.to_string(),
                from_seq: from,
                limit: limit as u32,
                ..Default::default()
            })
            .await
            .map_err(|s| {
                format!(
                    "cannot read the session log from {}: {}",
                    deps.store_url,
                    s.message()
                )
            })?
            .into_inner()
            .events;
        let Some(last) = page.last().map(|e| e.seq) else {
            break;
        };
        for event in &page {
            let Some(line) = event.kind.as_ref().and_then(recall_line) else {
                last_read = Some(event.seq);
                continue;
            };
            let line = format!("#{} {line}\n", event.seq);
            if shown == RECALL_MAX_EVENTS
                || (out.len() + line.len() > RECALL_MAX_CHARS && !out.is_empty())
            {
                out.push_str(&format!(
                    "[output limit reached: call recall with from_seq {} for more]\n",
                    event.seq
                ));
                return Ok(out);
            }
            out.push_str(&line);
            shown += 1;
            last_read = Some(event.seq);
        }
        if (page.len() as u64) < limit {
            break 'pages;
        }
        from = last.saturating_add(1);
    }
    match last_read {
        None => Err(ToolFailure(format!(
            "the conversation has no events from seq {}",
            args.from_seq
        ))),
        Some(last) if out.is_empty() => Ok(format!(
            "events {}–{last} hold no messages or tool results",
            args.from_seq
        )),
        Some(_) => Ok(out),
    }
}

/// One event as `recall` shows it; `None` for events with nothing to read
/// (streamed deltas, state changes).
fn recall_line(kind: &pb::event::Kind) -> Option<String> {
    use pb::event::Kind;
    let clip = |text: &str| -> String {
        match text.char_indices().nth(RECALL_MAX_CHARS / 2) {
            Some((at, _)) => format!("{}…", &text[..at]),
            None => text.to_string(),
        }
    };
    Some(match kind {
        Kind::UserMessage(m) => format!("person: {}", clip(&m.text)),
        Kind::ModelMessage(m) if !m.text.is_empty() => format!("you: {}", clip(&m.text)),
        Kind::ToolCallRequested(c) => format!(
            "you called {} (call {}) with {}",
            c.tool,
            c.call_id,
            clip(&c.arguments_json)
        ),
        Kind::ToolResult(r) => format!(
            "result of {} (call {}){}: {}",
            r.tool,
            r.call_id,
            if r.is_error { ", an error" } else { "" },
            clip(&r.output)
        ),
        Kind::ReminderDue(r) => format!("reminder due: {}", clip(&r.message)),
        Kind::McpResourceUpdated(u) => format!(
            "MCP resource {} on {} changed: {}",
            u.uri,
            u.server,
            clip(&u.content)
        ),
        Kind::ContextCompacted(c) if !c.summary.is_empty() => format!(
            "summary of events {}–{}: {}",
            c.first_seq,
            c.last_seq,
            clip(&c.summary)
        ),
        Kind::PlanSubmitted(p) => format!(
            "plan (revision {}): {}",
            p.revision,
            p.steps
                .iter()
                .map(|s| s.title.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_format_as_rfc3339() {
        let t = prost_types::Timestamp {
            seconds: 1_795_423_121,
            nanos: 0,
        };
        assert_eq!(format_time(Some(&t)), "2026-11-23T08:38:41Z");
        assert_eq!(format_time(None), "-");
    }

    #[test]
    fn recall_shows_messages_calls_and_results() {
        use pb::event::Kind;
        let line = recall_line(&Kind::UserMessage(pb::UserMessage {
            text: "hello".into(),
            ..Default::default()
        }));
        assert_eq!(line.as_deref(), Some("person: hello"));
        let line = recall_line(&Kind::ToolResult(pb::ToolResult {
            call_id: "c1".into(),
            tool: "bash".into(),
            output: "boom".into(),
            is_error: true,
            ..Default::default()
        }));
        assert_eq!(
            line.as_deref(),
            Some("result of bash (call c1), an error: boom")
        );
        assert_eq!(
            recall_line(&Kind::ModelTextDelta(pb::ModelTextDelta {
                text: "x".into()
            })),
            None
        );
    }

    #[test]
    fn every_builtin_is_registered_once_with_an_object_schema() {
        let specs = own().specs();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "schedule_reminder",
                "list_reminders",
                "cancel_reminder",
                "recall",
                MCP_SUBSCRIBE,
                crate::agents::DELEGATE,
            ]
        );
        assert!(specs.iter().all(|s| s.schema["type"] == "object"));
        let read_only: Vec<&str> = specs
            .iter()
            .filter(|s| s.read_only)
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(read_only, ["list_reminders", "recall"]);
    }
}
