//! What a person may want to hear about, made from the events a session
//! just stored and handed to the scheduler's outbox (`[[notify]]`): a call
//! or a question waiting for a person, a turn's end, a parked turn, a
//! scheduled task's run that failed.

use crate::deps::Deps;
use agentry_proto::scheduler::v1 as spb;
use agentry_proto::sessions::v1::{self as pb, event::Kind};
use std::sync::Arc;
use std::time::Duration;

/// The notifications `events` (stored from `first_seq` on in `session_id`)
/// make; `turn_scheduled`: the turn was a scheduled task's run.
pub fn of(
    session_id: &str,
    first_seq: u64,
    events: &[pb::Event],
    turn_scheduled: bool,
) -> Vec<spb::Notification> {
    let mut out = Vec::new();
    for (i, event) in events.iter().enumerate() {
        let seq = first_seq + i as u64;
        let note = |name: &str, title: String, text: String, payload: serde_json::Value| {
            spb::Notification {
                id: format!("{session_id}:{seq}:{name}"),
                event: name.to_string(),
                session_id: session_id.to_string(),
                turn_id: event.turn_id.clone(),
                title,
                text,
                payload_json: payload.to_string(),
                time: event.time,
            }
        };
        match &event.kind {
            Some(Kind::ApprovalRequested(a)) => out.push(note(
                "approval_requested",
                format!("Agentry: {} waits for approval", a.tool),
                format!(
                    "{} {} waits for a person ({}): agentry approvals answer {session_id} {} \
                     approve|deny",
                    a.tool,
                    short(&a.arguments_json, 200),
                    a.matched_rule,
                    a.call_id
                ),
                serde_json::json!({
                    "call_id": a.call_id, "tool": a.tool,
                    "arguments": short(&a.arguments_json, 2000), "rule": a.matched_rule,
                }),
            )),
            Some(Kind::McpInputRequested(q)) => out.push(note(
                "approval_requested",
                format!("Agentry: the MCP server {} asks a question", q.server),
                format!(
                    "the MCP server {} asks a person (call {}): agentry approvals reply \
                     {session_id} {}",
                    q.server, q.call_id, q.call_id
                ),
                serde_json::json!({"call_id": q.call_id, "server": q.server}),
            )),
            Some(Kind::TurnParked(p)) => out.push(note(
                "turn_parked",
                "Agentry: a turn is parked".to_string(),
                short(&p.message, 500),
                serde_json::json!({
                    "reason": pb::ParkReason::try_from(p.reason)
                        .map(|r| r.as_str_name())
                        .unwrap_or("PARK_REASON_UNSPECIFIED"),
                    "until": p.until.map(|t| t.seconds),
                    "message": short(&p.message, 2000),
                }),
            )),
            Some(Kind::TurnFinished(f)) => {
                let outcome = pb::TurnOutcome::try_from(f.outcome)
                    .map(|o| {
                        o.as_str_name()
                            .trim_start_matches("TURN_OUTCOME_")
                            .to_lowercase()
                    })
                    .unwrap_or_else(|_| "unknown".into());
                let payload = serde_json::json!({
                    "outcome": outcome, "steps": f.steps,
                    "message": short(&f.message, 2000), "cost": f.cost, "currency": f.currency,
                });
                out.push(note(
                    "turn_finished",
                    format!("Agentry: turn {outcome}"),
                    short(&f.message, 500),
                    payload.clone(),
                ));
                if turn_scheduled && f.outcome != pb::TurnOutcome::Completed as i32 {
                    out.push(note(
                        "schedule_failed",
                        format!("Agentry: a scheduled task's run {outcome}"),
                        short(&f.message, 500),
                        payload,
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

fn short(text: &str, max: usize) -> String {
    let mut out: String = text.chars().take(max).collect();
    if text.chars().count() > max {
        out.push('…');
    }
    out
}

/// Hands `notifications` to the scheduler in the background (tried a few
/// times: the outbox keeps them once it has them).
pub fn send(deps: &Arc<Deps>, notifications: Vec<spb::Notification>) {
    let wanted: Vec<spb::Notification> = notifications
        .into_iter()
        .filter(|n| deps.notify_events.contains(&n.event))
        .collect();
    if wanted.is_empty() {
        return;
    }
    let mut scheduler = deps.scheduler.clone();
    tokio::spawn(async move {
        let mut delay = Duration::from_millis(200);
        for attempt in 0..5 {
            let request = spb::NotifyRequest {
                notifications: wanted.clone(),
            };
            match scheduler.notify(request).await {
                Ok(_) => return,
                Err(status) if attempt < 4 => {
                    tracing::debug!(error = %status.message(), "notifications not handed over yet");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(status) => {
                    tracing::warn!(error = %status.message(), count = wanted.len(),
                        "notifications could not be handed to the scheduler");
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn event(kind: Kind) -> pb::Event {
        pb::Event {
            turn_id: "t1".into(),
            kind: Some(kind),
            ..Default::default()
        }
    }

    fn finished(outcome: pb::TurnOutcome) -> pb::Event {
        event(Kind::TurnFinished(pb::TurnFinished {
            outcome: outcome as i32,
            message: "why".into(),
            ..Default::default()
        }))
    }

    #[test]
    fn a_failed_scheduled_run_is_also_a_schedule_failure() {
        let notes = of("s1", 7, &[finished(pb::TurnOutcome::Failed)], true);
        let events: Vec<&str> = notes.iter().map(|n| n.event.as_str()).collect();
        assert_eq!(events, ["turn_finished", "schedule_failed"]);
        assert_eq!(notes[0].id, "s1:7:turn_finished");
        assert_ne!(notes[0].id, notes[1].id);
        let payload: serde_json::Value = serde_json::from_str(&notes[1].payload_json).unwrap();
        assert_eq!(payload["outcome"], "failed");
        // Completed, or not scheduled: no schedule failure.
        for (outcome, scheduled) in [
            (pb::TurnOutcome::Completed, true),
            (pb::TurnOutcome::Failed, false),
        ] {
            let notes = of("s1", 7, &[finished(outcome)], scheduled);
            assert_eq!(notes.len(), 1);
            assert_eq!(notes[0].event, "turn_finished");
        }
    }

    #[test]
    fn questions_and_parked_turns_are_told_with_what_to_do() {
        let asked = event(Kind::ApprovalRequested(pb::ApprovalRequested {
            call_id: "c1".into(),
            tool: "bash".into(),
            arguments_json: r#"{"command":"rm -rf build"}"#.into(),
            ..Default::default()
        }));
        let parked = event(Kind::TurnParked(pb::TurnParked {
            reason: pb::ParkReason::RateLimit as i32,
            until: Some(prost_types::Timestamp {
                seconds: 1_800_000_000,
                nanos: 0,
            }),
            message: "HTTP 429: slow down".into(),
        }));
        let other = event(Kind::CancelRequested(pb::CancelRequested::default()));
        let notes = of("s1", 3, &[asked, other, parked], false);
        assert_eq!(notes.len(), 2);
        assert_eq!(notes[0].event, "approval_requested");
        assert!(notes[0].text.contains("agentry approvals answer s1 c1"));
        assert_eq!(notes[1].event, "turn_parked");
        assert_eq!(notes[1].id, "s1:5:turn_parked");
        let payload: serde_json::Value = serde_json::from_str(&notes[1].payload_json).unwrap();
        assert_eq!(payload["until"], 1_800_000_000);
    }
}
