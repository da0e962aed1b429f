//! Hooks: commands a person configured, run by a tool runner in the
//! session's sandbox at points of a session, heard as one more voice in
//! the same decision as the policy.
//!
//! Rules, all decided here and in the reducer, never in the hook:
//! - `before_tool` hooks run once a call's arguments are valid, whatever
//!   the policy said. `deny` and `ask` tighten the policy's decision; `allow`
//!   only skips a confirmation the policy asked for; a policy DENY stands
//!   whatever any hook says. Deny wins over ask, ask over allow.
//! - A call a hook asked about waits for a person: another call's "approve
//!   for session" or a turn run with `--approve always` does not release it.
//! - An `after_tool` hook may add `{"context": …}` to what the model sees of
//!   the result (at most [`MAX_CONTEXT`] bytes).
//! - A hook that cannot start, exits non-zero, times out or prints
//!   something that is not a decision has no say; the call follows the
//!   policy alone, and its failure is recorded with its stderr.
//! - Every hook that ran is a `hook_ran` event in the session's log.

pub use crate::settings::{HookConfig, HookEvent};
use agentry_policy::Decision;
use agentry_proto::sessions::v1 as pb;
use serde_json::Value;

/// Most context one after_tool hook may add.
pub const MAX_CONTEXT: usize = 16 * 1024;
/// Longest reason kept of a hook's decision.
pub const MAX_REASON: usize = 2 * 1024;
/// How much of a hook's standard error the log keeps (its end).
pub const STDERR_TAIL: usize = 2 * 1024;

/// One hook to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookSpec {
    /// The command, as configured.
    pub command: String,
    /// Longest it may run.
    pub timeout_secs: u64,
}

/// The configured hooks, their matchers compiled.
#[derive(Debug, Default)]
pub struct Hooks {
    entries: Vec<(HookConfig, globset::GlobMatcher)>,
}

impl Hooks {
    /// Compiles `configs` (checked when the configuration was loaded).
    pub fn new(configs: &[HookConfig]) -> Result<Hooks, String> {
        let mut entries = Vec::new();
        for hook in configs {
            let glob = globset::Glob::new(&hook.matcher)
                .map_err(|e| format!("hook matcher {:?}: {e}", hook.matcher))?;
            entries.push((hook.clone(), glob.compile_matcher()));
        }
        Ok(Hooks { entries })
    }

    /// The hooks for `event` (for tool events, those whose matcher matches
    /// `tool`), in the configured order.
    pub fn matching(&self, event: HookEvent, tool: &str) -> Vec<HookSpec> {
        self.entries
            .iter()
            .filter(|(hook, glob)| {
                hook.event == event && (!event.is_tool_event() || glob.is_match(tool))
            })
            .map(|(hook, _)| HookSpec {
                command: hook.command.clone(),
                timeout_secs: hook.timeout_secs,
            })
            .collect()
    }
}

/// Hooks to run for one event, and what the reducer needs back with their
/// outcomes.
#[derive(Debug, Clone, PartialEq)]
pub struct HookJob {
    /// The event.
    pub event: HookEvent,
    /// The call (tool events).
    pub call_id: String,
    /// Its tool (tool events).
    pub tool: String,
    /// The hooks, in order.
    pub hooks: Vec<HookSpec>,
    /// What each hook reads on standard input (the actor adds the session's
    /// id).
    pub input: Value,
    /// For after_tool: the result, given to the model once the hooks ran.
    pub result: Option<pb::ToolResult>,
}

/// What running one hook gave.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookOutcome {
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
    /// It was killed at its timeout.
    pub timed_out: bool,
    /// How long it ran.
    pub duration_ms: u64,
    /// Why it could not run.
    pub error: String,
}

/// What one hook said, as recorded: its decision or context, or why it
/// has no say.
pub fn interpret(job: &HookJob, hook: &HookSpec, outcome: &HookOutcome) -> pb::HookRan {
    let mut ran = pb::HookRan {
        event: job.event.name().to_string(),
        command: hook.command.clone(),
        call_id: job.call_id.clone(),
        tool: job.tool.clone(),
        stderr: tail(&outcome.stderr, STDERR_TAIL),
        duration_ms: outcome.duration_ms,
        ..Default::default()
    };
    ran.error = if !outcome.error.is_empty() {
        outcome.error.clone()
    } else if outcome.timed_out {
        format!("timed out after {} s and was killed", hook.timeout_secs)
    } else {
        match outcome.exit_code {
            Some(0) => String::new(),
            Some(code) => format!("exited with status {code}"),
            None => "killed by a signal".to_string(),
        }
    };
    if !ran.error.is_empty() {
        return ran;
    }
    let stdout = outcome.stdout.trim();
    if stdout.is_empty() || !job.event.is_tool_event() {
        return ran;
    }
    let parsed: Option<serde_json::Map<String, Value>> = serde_json::from_str(stdout).ok();
    let Some(object) = parsed else {
        ran.error = format!(
            "printed something that is not a JSON object: {:?}",
            tail(stdout, 200)
        );
        return ran;
    };
    let text = |key: &str| object.get(key).and_then(Value::as_str).map(str::to_string);
    match job.event {
        HookEvent::BeforeTool => match text("decision").as_deref() {
            Some(decision @ ("allow" | "deny" | "ask")) => {
                ran.decision = decision.to_string();
                ran.reason = head(&text("reason").unwrap_or_default(), MAX_REASON);
            }
            None if !object.contains_key("decision") => {}
            _ => {
                ran.error = format!(
                    "printed a decision that is not \"allow\", \"deny\" or \"ask\": {}",
                    object
                        .get("decision")
                        .map(Value::to_string)
                        .unwrap_or_default()
                );
            }
        },
        HookEvent::AfterTool => {
            if let Some(context) = text("context") {
                ran.context = head(&context, MAX_CONTEXT);
            } else if object.contains_key("context") {
                ran.error = "printed a context that is not a string".to_string();
            }
        }
        HookEvent::UserMessage | HookEvent::TurnFinished | HookEvent::SessionStart => {}
    }
    ran
}

/// What becomes of a call: the policy's decision with every before_tool
/// hook heard. Returns the decision and, when a hook made it, the hook
/// that did (deny over ask over allow; the first of each in order).
pub fn combine(policy: Decision, ran: &[pb::HookRan]) -> (Decision, Option<&pb::HookRan>) {
    if policy == Decision::Deny {
        return (Decision::Deny, None);
    }
    let first = |decision: &str| ran.iter().find(|r| r.decision == decision);
    if let Some(hook) = first("deny") {
        return (Decision::Deny, Some(hook));
    }
    if let Some(hook) = first("ask") {
        return (Decision::Confirm, Some(hook));
    }
    if policy == Decision::Confirm
        && let Some(hook) = first("allow")
    {
        return (Decision::Allow, Some(hook));
    }
    (policy, None)
}

/// The name of a decision in `hook_ran.outcome`.
pub fn decision_name(decision: Decision) -> &'static str {
    match decision {
        Decision::Allow => "allow",
        Decision::Deny => "deny",
        Decision::Confirm => "ask",
    }
}

/// The first `max` bytes of `text` (at a character boundary).
fn head(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// The last `max` bytes of `text` (at a character boundary).
fn tail(text: &str, max: usize) -> String {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn job(event: HookEvent) -> HookJob {
        HookJob {
            event,
            call_id: "c1".into(),
            tool: "bash".into(),
            hooks: Vec::new(),
            input: Value::Null,
            result: None,
        }
    }

    fn spec() -> HookSpec {
        HookSpec {
            command: "/hooks/check".into(),
            timeout_secs: 5,
        }
    }

    fn printed(stdout: &str) -> HookOutcome {
        HookOutcome {
            exit_code: Some(0),
            stdout: stdout.into(),
            ..HookOutcome::default()
        }
    }

    #[test]
    fn a_before_tool_hook_decides_with_a_reason_or_has_no_say() {
        let before = job(HookEvent::BeforeTool);
        let ran = interpret(
            &before,
            &spec(),
            &printed(r#"{"decision":"deny","reason":"no rm"}"#),
        );
        assert_eq!(
            (
                ran.decision.as_str(),
                ran.reason.as_str(),
                ran.error.as_str()
            ),
            ("deny", "no rm", "")
        );
        assert_eq!(interpret(&before, &spec(), &printed("")).decision, "");
        assert_eq!(interpret(&before, &spec(), &printed("{}")).decision, "");
        for bad in ["yes", r#"{"decision":"maybe"}"#, r#"{"decision":1}"#, "[1]"] {
            let ran = interpret(&before, &spec(), &printed(bad));
            assert_eq!(ran.decision, "", "{bad}");
            assert!(!ran.error.is_empty(), "{bad}");
        }
        // A failed hook's decision is not heard, whatever it printed.
        let failed = HookOutcome {
            exit_code: Some(2),
            stdout: r#"{"decision":"allow"}"#.into(),
            stderr: "boom\n".into(),
            ..HookOutcome::default()
        };
        let ran = interpret(&before, &spec(), &failed);
        assert_eq!(
            (ran.decision.as_str(), ran.error.as_str()),
            ("", "exited with status 2")
        );
        assert_eq!(ran.stderr, "boom\n");
        let late = HookOutcome {
            timed_out: true,
            stdout: r#"{"decision":"allow"}"#.into(),
            ..HookOutcome::default()
        };
        let ran = interpret(&before, &spec(), &late);
        assert_eq!(ran.decision, "");
        assert_eq!(ran.error, "timed out after 5 s and was killed");
    }

    #[test]
    fn an_after_tool_hook_adds_capped_context() {
        let after = job(HookEvent::AfterTool);
        let ran = interpret(
            &after,
            &spec(),
            &printed(r#"{"context":"formatted with black"}"#),
        );
        assert_eq!(ran.context, "formatted with black");
        let long = format!(r#"{{"context":"{}"}}"#, "é".repeat(MAX_CONTEXT));
        let ran = interpret(&after, &spec(), &printed(&long));
        assert!(ran.context.len() <= MAX_CONTEXT);
        // A decision from an after_tool hook means nothing.
        let ran = interpret(&after, &spec(), &printed(r#"{"decision":"deny"}"#));
        assert_eq!((ran.decision.as_str(), ran.error.as_str()), ("", ""));
    }

    fn said(decision: &str) -> pb::HookRan {
        pb::HookRan {
            decision: decision.into(),
            command: format!("hook-{decision}"),
            ..Default::default()
        }
    }

    #[test]
    fn hooks_tighten_the_policy_and_never_lift_a_deny() {
        use Decision::*;
        // allow only skips a confirmation.
        assert_eq!(combine(Confirm, &[said("allow")]).0, Allow);
        assert_eq!(combine(Allow, &[said("allow")]), (Allow, None));
        // deny and ask tighten.
        assert_eq!(combine(Allow, &[said("ask")]).0, Confirm);
        assert_eq!(combine(Allow, &[said("deny")]).0, Deny);
        assert_eq!(combine(Confirm, &[said("allow"), said("ask")]).0, Confirm);
        assert_eq!(
            combine(Confirm, &[said("ask"), said("deny"), said("allow")]).0,
            Deny
        );
        // A policy deny stands.
        assert_eq!(combine(Deny, &[said("allow")]), (Deny, None));
        // The hook that decided is named.
        assert_eq!(
            combine(Allow, &[said("allow"), said("deny")])
                .1
                .map(|h| h.command.as_str()),
            Some("hook-deny")
        );
        // No say: the policy alone.
        assert_eq!(combine(Confirm, &[said("")]), (Confirm, None));
    }

    #[test]
    fn matchers_select_hooks_for_tool_events_only() {
        let config = |event, matcher: &str| HookConfig {
            event,
            matcher: matcher.into(),
            command: format!("{matcher}-hook"),
            timeout_secs: 3,
        };
        let hooks = Hooks::new(&[
            config(HookEvent::BeforeTool, "bash"),
            config(HookEvent::BeforeTool, "*_file"),
            config(HookEvent::AfterTool, "*"),
            config(HookEvent::TurnFinished, "bash"),
        ])
        .unwrap();
        let commands = |event, tool| -> Vec<String> {
            hooks
                .matching(event, tool)
                .into_iter()
                .map(|h| h.command)
                .collect()
        };
        assert_eq!(commands(HookEvent::BeforeTool, "bash"), vec!["bash-hook"]);
        assert_eq!(
            commands(HookEvent::BeforeTool, "write_file"),
            vec!["*_file-hook"]
        );
        assert!(commands(HookEvent::BeforeTool, "grep").is_empty());
        assert_eq!(commands(HookEvent::AfterTool, "grep"), vec!["*-hook"]);
        // The matcher does not apply to other events.
        assert_eq!(commands(HookEvent::TurnFinished, ""), vec!["bash-hook"]);
    }
}
