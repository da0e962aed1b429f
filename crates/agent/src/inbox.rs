//! The approval inbox and the record of decisions, read from session logs:
//! which calls wait for a person now (across sessions, after restarts), and
//! what people decided before (for `agentry policy suggest`).

use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{self as spb, event::Kind};
use std::collections::BTreeMap;

/// The turn of `events` (one session's log, in order) parked at a spending
/// limit, waiting for someone to raise it.
pub fn parked(session: &spb::Session, events: &[spb::Event]) -> Option<pb::ParkedTurn> {
    let mut exceeded: Option<spb::BudgetExceeded> = None;
    let mut parked = None;
    for event in events {
        match &event.kind {
            Some(Kind::BudgetExceeded(b)) => exceeded = Some(b.clone()),
            Some(Kind::TurnParked(p)) if p.reason == spb::ParkReason::Budget as i32 => {
                parked = Some(pb::ParkedTurn {
                    session_id: session.id.clone(),
                    session_title: session.title.clone(),
                    turn_id: event.turn_id.clone(),
                    message: p.message.clone(),
                    parked_at: event.time,
                    exceeded: exceeded.clone(),
                });
            }
            Some(Kind::TurnResumed(_) | Kind::TurnFinished(_) | Kind::UserMessage(_)) => {
                parked = None;
            }
            _ => {}
        }
    }
    parked
}

/// The calls of `events` (one session's log, in order) that wait for a
/// person: asked for in the open turn and not decided, run or closed since.
pub fn pending(session: &spb::Session, events: &[spb::Event]) -> Vec<pb::PendingApproval> {
    let mut waiting: BTreeMap<String, pb::PendingApproval> = BTreeMap::new();
    // The calls of the open turn: (tool, arguments), for the questions
    // their servers ask.
    let mut calls: BTreeMap<String, (String, String)> = BTreeMap::new();
    for event in events {
        let Some(kind) = &event.kind else { continue };
        match kind {
            // A new turn, or the end of one: nothing of before waits.
            Kind::UserMessage(_)
            | Kind::McpResourceUpdated(_)
            | Kind::TurnFinished(_)
            | Kind::CancelRequested(_) => {
                waiting.clear();
                calls.clear();
            }
            Kind::ReminderDue(r) if r.reminder_kind() == spb::ReminderKind::Task => {
                waiting.clear();
                calls.clear();
            }
            Kind::ToolCallRequested(c) => {
                calls.insert(
                    c.call_id.clone(),
                    (c.tool.clone(), c.arguments_json.clone()),
                );
            }
            Kind::McpInputRequested(asked) => {
                let (tool, arguments_json) = calls.get(&asked.call_id).cloned().unwrap_or_default();
                waiting.insert(
                    asked.call_id.clone(),
                    pb::PendingApproval {
                        session_id: session.id.clone(),
                        session_title: session.title.clone(),
                        turn_id: event.turn_id.clone(),
                        call_id: asked.call_id.clone(),
                        tool,
                        arguments_json,
                        matched_rule: format!("the MCP server {} asks a person", asked.server),
                        asked_at: event.time,
                        question: Some(asked.clone()),
                        ..Default::default()
                    },
                );
            }
            Kind::McpInputProvided(given) => {
                waiting.remove(&given.call_id);
            }
            Kind::ApprovalRequested(a) => {
                waiting.insert(
                    a.call_id.clone(),
                    pb::PendingApproval {
                        session_id: session.id.clone(),
                        session_title: session.title.clone(),
                        turn_id: event.turn_id.clone(),
                        call_id: a.call_id.clone(),
                        tool: a.tool.clone(),
                        arguments_json: a.arguments_json.clone(),
                        matched_rule: a.matched_rule.clone(),
                        network: a.network,
                        asked_at: event.time,
                        approvers: {
                            let need = crate::reducer::need_of(a);
                            if need.is_restricted() {
                                need.describe()
                            } else {
                                String::new()
                            }
                        },
                        approved_by: waiting
                            .get(&a.call_id)
                            .filter(|p| p.arguments_json == a.arguments_json)
                            .map(|p| p.approved_by.clone())
                            .unwrap_or_default(),
                        question: None,
                    },
                );
            }
            // Approved by some of the people it needs: it still waits.
            Kind::ApprovalDecided(d) if d.approvals_missing > 0 => {
                if let Some(p) = waiting.get_mut(&d.call_id) {
                    p.approved_by = d.approved_by.clone();
                    if d.decision() == spb::ApprovalDecision::Edit {
                        p.arguments_json = d.edited_arguments_json.clone();
                    }
                }
            }
            Kind::ApprovalDecided(d) => {
                waiting.remove(&d.call_id);
            }
            Kind::ToolResult(r) => {
                waiting.remove(&r.call_id);
            }
            _ => {}
        }
    }
    let mut out: Vec<_> = waiting.into_values().collect();
    out.sort_by_key(|p| p.asked_at.map(|t| (t.seconds, t.nanos)));
    out
}

/// The decisions people took in `events` (one session's log).
pub fn decisions(session_id: &str, events: &[spb::Event]) -> Vec<pb::TakenDecision> {
    let mut asked: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut out = Vec::new();
    for event in events {
        match &event.kind {
            Some(Kind::ApprovalRequested(a)) => {
                asked.insert(
                    a.call_id.clone(),
                    (a.tool.clone(), a.arguments_json.clone()),
                );
            }
            // One of several approvals: the last one decides.
            Some(Kind::ApprovalDecided(d)) if d.approvals_missing > 0 => {}
            Some(Kind::ApprovalDecided(d)) => {
                let Some((tool, arguments)) = asked.remove(&d.call_id) else {
                    continue;
                };
                let decision = d.decision();
                let approved = matches!(
                    decision,
                    spb::ApprovalDecision::Approve
                        | spb::ApprovalDecision::ApproveForSession
                        | spb::ApprovalDecision::Edit
                );
                let arguments_json = if decision == spb::ApprovalDecision::Edit
                    && !d.edited_arguments_json.is_empty()
                {
                    d.edited_arguments_json.clone()
                } else {
                    arguments
                };
                out.push(pb::TakenDecision {
                    session_id: session_id.to_string(),
                    tool,
                    arguments_json,
                    approved,
                });
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn event(seq: u64, turn: &str, kind: Kind) -> spb::Event {
        spb::Event {
            seq,
            turn_id: turn.into(),
            time: Some(prost_types::Timestamp {
                seconds: seq as i64,
                nanos: 0,
            }),
            kind: Some(kind),
            ..Default::default()
        }
    }

    fn asked(call: &str, tool: &str, args: &str) -> Kind {
        Kind::ApprovalRequested(spb::ApprovalRequested {
            call_id: call.into(),
            tool: tool.into(),
            arguments_json: args.into(),
            matched_rule: "default for bash: confirm".into(),
            network: false,
            outcome_unknown: false,
            approvers: Vec::new(),
            approvals_required: 0,
        })
    }

    fn decided(call: &str, decision: spb::ApprovalDecision, edited: &str) -> Kind {
        Kind::ApprovalDecided(spb::ApprovalDecided {
            call_id: call.into(),
            decision: decision as i32,
            edited_arguments_json: edited.into(),
            ..Default::default()
        })
    }

    fn user() -> Kind {
        Kind::UserMessage(spb::UserMessage {
            text: "go".into(),
            ..Default::default()
        })
    }

    #[test]
    fn only_the_open_turns_undecided_calls_wait() {
        let session = spb::Session {
            id: "s1".into(),
            title: "build it".into(),
            ..Default::default()
        };
        let log = vec![
            event(1, "t1", user()),
            event(2, "t1", asked("old", "bash", "{}")),
            event(3, "t1", Kind::TurnFinished(spb::TurnFinished::default())),
            event(4, "t2", user()),
            event(5, "t2", asked("a", "bash", r#"{"command":"make"}"#)),
            event(6, "t2", asked("b", "write_file", "{}")),
            event(7, "t2", asked("c", "fx__slow", "{}")),
            event(8, "t2", decided("b", spb::ApprovalDecision::Approve, "")),
            event(
                9,
                "t2",
                Kind::ToolResult(spb::ToolResult {
                    call_id: "c".into(),
                    ..Default::default()
                }),
            ),
            // Asked again after a restart: one entry, the latest.
            event(10, "t2", asked("a", "bash", r#"{"command":"make"}"#)),
        ];
        let waiting = pending(&session, &log);
        assert_eq!(waiting.len(), 1, "{waiting:?}");
        assert_eq!(waiting[0].call_id, "a");
        assert_eq!(waiting[0].turn_id, "t2");
        assert_eq!(waiting[0].session_title, "build it");
        assert_eq!(waiting[0].asked_at.unwrap().seconds, 10);
        let mut finished = log.clone();
        finished.push(event(11, "t2", Kind::CancelRequested(Default::default())));
        assert!(pending(&session, &finished).is_empty());
    }

    #[test]
    fn decisions_say_what_was_approved_with_which_arguments() {
        let log = vec![
            event(1, "t", asked("a", "bash", r#"{"command":"ls"}"#)),
            event(
                2,
                "t",
                decided("a", spb::ApprovalDecision::ApproveForSession, ""),
            ),
            event(3, "t", asked("b", "bash", r#"{"command":"rm -rf x"}"#)),
            event(4, "t", decided("b", spb::ApprovalDecision::Deny, "")),
            event(5, "t", asked("c", "bash", r#"{"command":"make"}"#)),
            event(
                6,
                "t",
                decided(
                    "c",
                    spb::ApprovalDecision::Edit,
                    r#"{"command":"make -j2"}"#,
                ),
            ),
        ];
        let got: Vec<(String, bool)> = decisions("s", &log)
            .into_iter()
            .map(|d| (d.arguments_json, d.approved))
            .collect();
        assert_eq!(
            got,
            vec![
                (r#"{"command":"ls"}"#.to_string(), true),
                (r#"{"command":"rm -rf x"}"#.to_string(), false),
                (r#"{"command":"make -j2"}"#.to_string(), true),
            ]
        );
    }
}
