//! Tools the orchestrator serves itself: reminders, scoped to the session
//! that calls them and backed by the scheduler service.

use crate::deps::Deps;
use crate::reducer::ToolFlags;
use agentry_llm::{ToolCall, ToolDefinition};
use agentry_proto::scheduler::v1 as spb;
use agentry_proto::sessions::v1 as pb;
use serde::Deserialize;
use std::time::Instant;

/// The names of the built-in tools.
pub const NAMES: [&str; 3] = ["schedule_reminder", "list_reminders", "cancel_reminder"];

/// Whether `name` is a built-in tool.
pub fn is_builtin(name: &str) -> bool {
    NAMES.contains(&name)
}

/// The built-in tools as offered to the model, with their flags.
pub fn definitions() -> Vec<(ToolDefinition, ToolFlags)> {
    vec![
        (
            ToolDefinition {
                name: "schedule_reminder".into(),
                description: "Schedule a reminder for this conversation. It arrives as a message \
                    when due, even if nobody is chatting. Give `due` as a duration (\"in 10m\", \
                    \"2h30m\", \"1d\") or an RFC 3339 time with offset; or a 5-field `cron` \
                    expression (with an IANA `time_zone`) for a recurring reminder. kind \"notify\" \
                    just tells the person; \"task\" wakes you up to act on it."
                    .into(),
                parameters: serde_json::json!({
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
            },
            ToolFlags {
                read_only: false,
                parallel_safe: false,
            },
        ),
        (
            ToolDefinition {
                name: "list_reminders".into(),
                description: "List this conversation's reminders.".into(),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {
                        "status": {"type": "string", "enum": ["pending", "completed", "cancelled", "all"], "description": "Which reminders (default pending)."}
                    },
                    "additionalProperties": false
                }),
            },
            ToolFlags {
                read_only: true,
                parallel_safe: true,
            },
        ),
        (
            ToolDefinition {
                name: "cancel_reminder".into(),
                description: "Cancel one of this conversation's pending reminders.".into(),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {
                        "reminder_id": {"type": "string", "description": "The id schedule_reminder or list_reminders gave."}
                    },
                    "required": ["reminder_id"],
                    "additionalProperties": false
                }),
            },
            ToolFlags {
                read_only: false,
                parallel_safe: false,
            },
        ),
    ]
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

fn parse<T: for<'de> Deserialize<'de>>(tool: &str, json: &str) -> Result<T, String> {
    let json = if json.trim().is_empty() { "{}" } else { json };
    serde_json::from_str(json).map_err(|e| format!("invalid arguments for {tool}: {e}"))
}

fn format_time(t: Option<&prost_types::Timestamp>) -> String {
    t.and_then(|t| chrono::DateTime::from_timestamp(t.seconds, 0))
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| "-".into())
}

fn describe(r: &spb::Reminder) -> String {
    let kind = match spb::ReminderKind::try_from(r.kind) {
        Ok(spb::ReminderKind::Task) => "task",
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

/// Runs a built-in tool call for `session_id`.
pub async fn run(deps: &Deps, session_id: &str, call: &ToolCall) -> pb::ToolResult {
    let started = Instant::now();
    let outcome = match call.name.as_str() {
        "schedule_reminder" => schedule(deps, session_id, &call.arguments).await,
        "list_reminders" => list(deps, session_id, &call.arguments).await,
        "cancel_reminder" => cancel(deps, session_id, &call.arguments).await,
        other => Err(format!("{other} is not a built-in tool")),
    };
    let (output, is_error) = match outcome {
        Ok(output) => (output, false),
        Err(e) => (format!("error: {e}"), true),
    };
    pb::ToolResult {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        output,
        is_error,
        exit_code: None,
        duration_ms: started.elapsed().as_millis() as u64,
        runner_id: "orchestrator".into(),
    }
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

async fn schedule(deps: &Deps, session_id: &str, arguments: &str) -> Result<String, String> {
    let args: ScheduleArgs = parse("schedule_reminder", arguments)?;
    let kind = match args.kind.as_deref().unwrap_or("notify") {
        "notify" => spb::ReminderKind::Notify,
        "task" => spb::ReminderKind::Task,
        other => {
            return Err(format!(
                "kind must be \"notify\" or \"task\", not {other:?}"
            ));
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

async fn list(deps: &Deps, session_id: &str, arguments: &str) -> Result<String, String> {
    let args: ListArgs = parse("list_reminders", arguments)?;
    let status = match args.status.as_deref().unwrap_or("pending") {
        "pending" => spb::ReminderStatus::Pending,
        "completed" => spb::ReminderStatus::Completed,
        "cancelled" => spb::ReminderStatus::Cancelled,
        "all" => spb::ReminderStatus::Unspecified,
        other => {
            return Err(format!(
                "status must be pending, completed, cancelled or all, not {other:?}"
            ));
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

async fn cancel(deps: &Deps, session_id: &str, arguments: &str) -> Result<String, String> {
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
    fn every_builtin_has_a_definition() {
        let names: Vec<String> = definitions().into_iter().map(|(d, _)| d.name).collect();
        assert_eq!(names, NAMES.to_vec());
        assert!(
            definitions()
                .iter()
                .all(|(d, _)| d.parameters["type"] == "object")
        );
    }
}
