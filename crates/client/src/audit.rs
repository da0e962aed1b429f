//! Who did what in a session, and what let each tool call run, read from
//! its log: each person's input carries their name (`Event.by`), and each
//! scheduled call what allowed it (`ToolCallState.allowed_by`). A standing
//! approval is traced back to the answer that granted it, and the turn's
//! "approve always" to the message that asked for it.

use crate::text::{short_args, shorten};
use agentry_policy::{SessionRule, session_rules_for};
use agentry_proto::sessions::v1::{self as pb, event::Kind};
use serde_json::{Value, json};
use std::collections::HashMap;

/// One thing done: by a person, or a tool call the agent made.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The session.
    pub session_id: String,
    /// The event that records it.
    pub seq: u64,
    /// When, in milliseconds since the epoch (`None`: not recorded).
    pub time_ms: Option<i64>,
    /// Who: a person's name; empty for what the agent did.
    pub by: String,
    /// What: `message`, `approve`, `approve_for_session`, `deny`, `edit`, `fork`,
    /// `check`, `cancel`, `model`, `rewind`, or `tool_call`.
    pub action: &'static str,
    /// About what: the message, the call (tool and main argument), the
    /// model, the turn rewound to.
    pub subject: String,
    /// For a tool call: what let it run.
    pub allowed: Option<Allowed>,
}

/// What let a tool call run.
#[derive(Debug, Clone, PartialEq)]
pub enum Allowed {
    /// A policy rule, or the tool's default (which one).
    Rule(String),
    /// A before_tool hook (which, and what it said).
    Hook(String),
    /// A standing approval for the session, granted by these people (the
    /// answers that granted what the call needed).
    Session(Vec<String>),
    /// The turn's "approve always", asked for by this person.
    Turn(String),
    /// This person's answer to the call's approval request.
    Person(String),
    /// A log from before this was recorded: what it said.
    NotRecorded(String),
}

impl Allowed {
    /// In words.
    pub fn describe(&self) -> String {
        let who = |name: &str| {
            if name.is_empty() {
                "someone unnamed".to_string()
            } else {
                name.to_string()
            }
        };
        match self {
            Allowed::Rule(rule) => format!("allowed by {rule}"),
            Allowed::Hook(hook) => hook.clone(),
            Allowed::Session(by) if by.is_empty() => {
                "allowed for this session (the grant is not in this log)".to_string()
            }
            Allowed::Session(by) => format!(
                "allowed for this session by {}",
                by.iter().map(|b| who(b)).collect::<Vec<_>>().join(", ")
            ),
            Allowed::Turn(by) => format!("approve always for the turn, asked by {}", who(by)),
            Allowed::Person(by) => format!("approved by {}", who(by)),
            Allowed::NotRecorded(detail) => format!("not recorded ({detail})"),
        }
    }

    /// As JSON: `{"kind": …}` with who or which rule.
    pub fn to_json(&self) -> Value {
        match self {
            Allowed::Rule(rule) => json!({"kind": "rule", "rule": rule}),
            Allowed::Hook(hook) => json!({"kind": "hook", "hook": hook}),
            Allowed::Session(by) => json!({"kind": "session", "granted_by": by}),
            Allowed::Turn(by) => json!({"kind": "turn", "by": by}),
            Allowed::Person(by) => json!({"kind": "person", "by": by}),
            Allowed::NotRecorded(detail) => json!({"kind": "not_recorded", "detail": detail}),
        }
    }
}

impl Record {
    /// As one JSON object.
    pub fn to_json(&self) -> Value {
        json!({
            "session_id": self.session_id,
            "seq": self.seq,
            "time": self.time_ms.map(|ms| ms as f64 / 1000.0),
            "by": self.by,
            "action": self.action,
            "subject": self.subject,
            "allowed": self.allowed.as_ref().map(Allowed::to_json),
        })
    }
}

/// A grant for the session: what it allows, who gave it.
struct Grant {
    rule: SessionRule,
    by: String,
}

impl Grant {
    fn covers(&self, needed: &SessionRule) -> bool {
        self.rule.tool == needed.tool
            && (self.rule.command.is_none() || self.rule.command == needed.command)
            && (self.rule.path.is_none() || self.rule.path == needed.path)
    }
}

/// What was done in the session whose log is `log`, in order.
pub fn records(log: &[pb::Event]) -> Vec<Record> {
    let mut out = Vec::new();
    // Per call: its tool and arguments, and who answered it last.
    let mut calls: HashMap<&str, (&str, &str)> = HashMap::new();
    let mut answered: HashMap<&str, String> = HashMap::new();
    // Per turn: who started it.
    let mut turns: HashMap<&str, &str> = HashMap::new();
    let mut grants: Vec<Grant> = Vec::new();
    for event in log.iter().filter(|e| !e.live) {
        let Some(kind) = &event.kind else { continue };
        let record = |action: &'static str, subject: String, allowed: Option<Allowed>| Record {
            session_id: event.session_id.clone(),
            seq: event.seq,
            time_ms: event
                .time
                .as_ref()
                .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000),
            by: event.by.clone(),
            action,
            subject,
            allowed,
        };
        match kind {
            Kind::UserMessage(m) => {
                turns.insert(&event.turn_id, &event.by);
                let action = if m.compact { "compact" } else { "message" };
                out.push(record(action, shorten(&m.text, 80), None));
            }
            Kind::ToolCallRequested(c) => {
                calls.insert(&c.call_id, (&c.tool, &c.arguments_json));
            }
            Kind::ApprovalDecided(d) => {
                // Several people: all of them (the last event names the last).
                let people = if d.approved_by.len() > 1 {
                    d.approved_by.join(" and ")
                } else {
                    event.by.clone()
                };
                answered.insert(&d.call_id, people);
                let decision = pb::ApprovalDecision::try_from(d.decision).unwrap_or_default();
                if decision == pb::ApprovalDecision::ApproveForSession {
                    grants.extend(d.allowances.iter().map(|a| Grant {
                        rule: SessionRule {
                            tool: a.tool.clone(),
                            command: (!a.command.is_empty()).then(|| a.command.clone()),
                            path: (!a.path.is_empty()).then(|| a.path.clone()),
                        },
                        by: event.by.clone(),
                    }));
                }
                let action = match decision {
                    pb::ApprovalDecision::Approve => "approve",
                    pb::ApprovalDecision::ApproveForSession => "approve_for_session",
                    pb::ApprovalDecision::Deny => "deny",
                    pb::ApprovalDecision::Edit => "edit",
                    pb::ApprovalDecision::Check => "check",
                    pb::ApprovalDecision::Unspecified => "decide",
                };
                let call = calls
                    .get(d.call_id.as_str())
                    .map(|(tool, args)| format!("{tool} {}", short_args(tool, args)))
                    .unwrap_or_else(|| d.call_id.clone());
                let mut subject = if d.reason.is_empty() {
                    call
                } else {
                    format!("{call} ({})", shorten(&d.reason, 80))
                };
                if d.approvals_missing > 0 {
                    subject.push_str(&format!(" (waits for {} more)", d.approvals_missing));
                }
                out.push(record(action, subject, None));
            }
            Kind::ToolCallState(s) if s.phase() == pb::ToolCallPhase::Scheduled => {
                let (tool, args) = calls.get(s.call_id.as_str()).copied().unwrap_or(("?", ""));
                let allowed = match s.allowed_by() {
                    pb::AllowedBy::Rule => Allowed::Rule(s.detail.clone()),
                    pb::AllowedBy::Hook => Allowed::Hook(s.detail.clone()),
                    pb::AllowedBy::Person => Allowed::Person(
                        answered
                            .get(s.call_id.as_str())
                            .map(|b| b.to_string())
                            .unwrap_or_default(),
                    ),
                    pb::AllowedBy::Turn => Allowed::Turn(
                        turns
                            .get(event.turn_id.as_str())
                            .map(|b| b.to_string())
                            .unwrap_or_default(),
                    ),
                    pb::AllowedBy::Session => {
                        let mut by: Vec<String> = Vec::new();
                        for needed in session_rules_for(tool, args) {
                            if let Some(grant) = grants.iter().find(|g| g.covers(&needed))
                                && !by.contains(&grant.by)
                            {
                                by.push(grant.by.clone());
                            }
                        }
                        Allowed::Session(by)
                    }
                    pb::AllowedBy::Unspecified => Allowed::NotRecorded(s.detail.clone()),
                };
                out.push(record(
                    "tool_call",
                    format!("{tool} {}", short_args(tool, args)),
                    Some(allowed),
                ));
            }
            Kind::CancelRequested(c) => out.push(record("cancel", shorten(&c.reason, 80), None)),
            Kind::ModelChanged(m) => out.push(record("model", m.model.clone(), None)),
            Kind::SessionRewound(r) => {
                out.push(record("rewind", format!("to turn {}", r.to_turn), None));
            }
            Kind::SessionForked(f) => out.push(record(
                "fork",
                format!("from {} at seq {}", f.from_session_id, f.at_seq),
                None,
            )),
            _ => {}
        }
    }
    out
}
