//! Hooks in the reducer: before_tool hooks heard with the policy, after_tool
//! hooks adding context, notifications recorded.

use super::plan::tool_output;
use super::*;
use crate::hooks::{HookConfig, HookEvent, HookJob, HookOutcome, Hooks};
use crate::prompt::View;
use pretty_assertions::assert_eq;

fn hook(event: HookEvent, matcher: &str, command: &str) -> HookConfig {
    HookConfig {
        event,
        matcher: matcher.into(),
        command: command.into(),
        timeout_secs: 5,
    }
}

/// A session with the test policy (bash confirmed, `sudo` denied, `git
/// status` allowed) and these hooks.
fn with_hooks(hooks: &[HookConfig]) -> Session {
    let mut session = Session::with_policy(5, test_policy(), catalog());
    let view = View {
        hooks: Arc::new(Hooks::new(hooks).unwrap()),
        ..View::default()
    };
    session.state = session.state.clone().with_view(Arc::new(view));
    session
}

fn hook_job(effects: &[Effect]) -> HookJob {
    effects
        .iter()
        .find_map(|e| match e {
            Effect::RunHooks(job) => Some((**job).clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no hooks asked for: {effects:?}"))
}

fn printed(stdout: &str) -> HookOutcome {
    HookOutcome {
        exit_code: Some(0),
        stdout: stdout.into(),
        ..HookOutcome::default()
    }
}

fn hook_runs(effects: &[Effect]) -> Vec<pb::HookRan> {
    events_of(effects)
        .into_iter()
        .filter_map(|k| match k {
            Kind::HookRan(h) => Some(h),
            _ => None,
        })
        .collect()
}

/// Sends a turn whose model asks for `call`; returns the hook job asked for.
fn call_with_hooks(session: &mut Session, call: ToolCall) -> HookJob {
    session.ok(user("go"));
    let effects = session.ok(model_done("", vec![call]));
    assert!(
        !events_of(&effects).iter().any(|k| matches!(
            k,
            Kind::ApprovalRequested(_) | Kind::ToolCallState(_) | Kind::ToolResult(_)
        )),
        "nothing is decided before the hooks answer: {effects:?}"
    );
    assert!(run_tools(&effects).is_empty());
    hook_job(&effects)
}

#[test]
fn a_before_tool_hook_denies_with_a_reason_the_model_sees() {
    let mut session = with_hooks(&[hook(HookEvent::BeforeTool, "bash", "/hooks/no-rm")]);
    let job = call_with_hooks(&mut session, bash("b1", "rm -rf build"));
    assert_eq!(job.event, HookEvent::BeforeTool);
    assert_eq!(job.input["tool"], "bash");
    assert_eq!(job.input["arguments"]["command"], "rm -rf build");
    assert_eq!(calls_of(&session.state)[0].phase, CallPhase::Validating);
    let effects = session.ok(Input::HooksDone {
        job: Box::new(job),
        outcomes: vec![printed(r#"{"decision":"deny","reason":"no rm here"}"#)],
    });
    let runs = hook_runs(&effects);
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].decision.as_str(), runs[0].outcome.as_str()),
        ("deny", "deny")
    );
    assert_eq!(
        tool_output(&effects, "b1"),
        "error: denied by the hook /hooks/no-rm: no rm here"
    );
    assert!(run_tools(&effects).is_empty());
    // The model hears about it next.
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::CallModel { .. }))
    );
}

#[test]
fn a_hook_may_skip_a_confirmation_but_never_lift_a_policy_deny() {
    let mut session = with_hooks(&[hook(HookEvent::BeforeTool, "*", "/hooks/yes")]);
    let job = call_with_hooks(&mut session, bash("b1", "make"));
    let effects = session.ok(Input::HooksDone {
        job: Box::new(job),
        outcomes: vec![printed(
            r#"{"decision":"allow","reason":"builds are fine"}"#,
        )],
    });
    assert!(
        !events_of(&effects)
            .iter()
            .any(|k| matches!(k, Kind::ApprovalRequested(_)))
    );
    assert_eq!(run_tools(&effects), vec![bash("b1", "make")]);
    // The log says the hook let it run.
    let allowed_by: Vec<pb::AllowedBy> = events_of(&effects)
        .iter()
        .filter_map(|k| match k {
            Kind::ToolCallState(s)
                if s.call_id == "b1" && s.phase() == pb::ToolCallPhase::Scheduled =>
            {
                Some(s.allowed_by())
            }
            _ => None,
        })
        .collect();
    assert_eq!(allowed_by, [pb::AllowedBy::Hook]);
    session.ok(done("b1", "built"));

    let job = {
        let effects = session.ok(model_done("", vec![bash("b2", "sudo rm -rf /")]));
        hook_job(&effects)
    };
    let effects = session.ok(Input::HooksDone {
        job: Box::new(job),
        outcomes: vec![printed(r#"{"decision":"allow"}"#)],
    });
    assert_eq!(hook_runs(&effects)[0].outcome, "deny");
    assert!(run_tools(&effects).is_empty());
    assert!(
        tool_output(&effects, "b2").starts_with("error: denied by policy"),
        "{}",
        tool_output(&effects, "b2")
    );
}

#[test]
fn a_call_a_hook_asked_about_waits_for_a_person_whatever_else_happens() {
    let mut session = with_hooks(&[hook(HookEvent::BeforeTool, "bash", "/hooks/ask")]);
    // Allowed by the policy, asked about by the hook.
    let job = call_with_hooks(&mut session, bash("b1", "git status"));
    let effects = session.ok(Input::HooksDone {
        job: Box::new(job),
        outcomes: vec![printed(r#"{"decision":"ask","reason":"look first"}"#)],
    });
    let asked = events_of(&effects)
        .into_iter()
        .find_map(|k| match k {
            Kind::ApprovalRequested(a) => Some(a),
            _ => None,
        })
        .expect("a person is asked");
    assert_eq!(asked.matched_rule, "the hook /hooks/ask: look first");
    assert!(calls_of(&session.state)[0].hook_asked);
    // After a restart it is asked again, not released by the policy.
    let mut restarted = session.restarted();
    let effects = restarted.ok(Input::Interrupted);
    assert!(
        events_of(&effects)
            .iter()
            .any(|k| matches!(k, Kind::ApprovalRequested(_)))
    );
    assert!(run_tools(&effects).is_empty());
    // A person releases it.
    let effects = session.ok(approve("b1"));
    assert_eq!(run_tools(&effects), vec![bash("b1", "git status")]);
}

#[test]
fn a_failed_or_silent_hook_leaves_the_policy_alone_and_is_recorded() {
    let mut session = with_hooks(&[
        hook(HookEvent::BeforeTool, "bash", "/hooks/slow"),
        hook(HookEvent::BeforeTool, "bash", "/hooks/quiet"),
    ]);
    let job = call_with_hooks(&mut session, bash("b1", "make"));
    assert_eq!(job.hooks.len(), 2);
    let timed_out = HookOutcome {
        timed_out: true,
        stdout: r#"{"decision":"allow"}"#.into(),
        stderr: "still thinking\n".into(),
        ..HookOutcome::default()
    };
    let effects = session.ok(Input::HooksDone {
        job: Box::new(job),
        outcomes: vec![timed_out, printed("")],
    });
    let runs = hook_runs(&effects);
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].error, "timed out after 5 s and was killed");
    assert_eq!(runs[0].stderr, "still thinking\n");
    assert_eq!(runs[1].outcome, "ask", "the policy's confirm stands");
    assert!(
        events_of(&effects)
            .iter()
            .any(|k| matches!(k, Kind::ApprovalRequested(_)))
    );
}

#[test]
fn an_after_tool_hook_adds_context_to_the_result() {
    let mut session = with_hooks(&[hook(HookEvent::AfterTool, "read_file", "/hooks/lint")]);
    session.ok(user("read it"));
    let effects = session.ok(model_done("", vec![read_file("r1", "a.py")]));
    assert_eq!(run_tools(&effects).len(), 1);
    let effects = session.ok(done("r1", "print(1)"));
    // The result waits for the hook.
    assert!(events_of(&effects).is_empty(), "{effects:?}");
    let job = hook_job(&effects);
    assert_eq!(job.input["result"]["output"], "print(1)");
    let effects = session.ok(Input::HooksDone {
        job: Box::new(job),
        outcomes: vec![printed(r#"{"context":"lint: fine"}"#)],
    });
    assert_eq!(hook_runs(&effects)[0].context, "lint: fine");
    assert_eq!(
        tool_output(&effects, "r1"),
        "print(1)\n\n[context from the hook /hooks/lint]\nlint: fine"
    );
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::CallModel { .. }))
    );
    // A stale outcome (the same job again) is refused.
    let stale = HookJob {
        event: HookEvent::AfterTool,
        call_id: "r1".into(),
        tool: "read_file".into(),
        hooks: Vec::new(),
        input: serde_json::Value::Null,
        result: None,
    };
    assert!(
        session
            .step(Input::HooksDone {
                job: Box::new(stale),
                outcomes: Vec::new()
            })
            .is_err()
    );
}

#[test]
fn notifications_run_for_messages_turn_ends_and_the_session_start() {
    let mut session = with_hooks(&[
        hook(HookEvent::SessionStart, "*", "/hooks/start"),
        hook(HookEvent::UserMessage, "*", "/hooks/said"),
        hook(HookEvent::TurnFinished, "*", "/hooks/done"),
    ]);
    let effects = session.ok(user("hello"));
    let events: Vec<HookEvent> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::RunHooks(job) => Some(job.event),
            _ => None,
        })
        .collect();
    assert_eq!(
        events,
        vec![HookEvent::SessionStart, HookEvent::UserMessage]
    );
    let effects = session.ok(model_done("hi", vec![]));
    let job = hook_job(&effects);
    assert_eq!(job.event, HookEvent::TurnFinished);
    assert_eq!(job.input["outcome"], "completed");
    // Its outcome is recorded once idle, and decides nothing.
    let effects = session.ok(Input::HooksDone {
        job: Box::new(job),
        outcomes: vec![printed(r#"{"decision":"deny"}"#)],
    });
    let runs = hook_runs(&effects);
    assert_eq!(
        (runs[0].event.as_str(), runs[0].decision.as_str()),
        ("turn_finished", "")
    );
    assert!(session.state.is_idle());
    // The second message is no session start.
    let effects = session.ok(user_in(TURN2, "again"));
    assert_eq!(
        effects
            .iter()
            .filter(|e| matches!(e, Effect::RunHooks(_)))
            .count(),
        1
    );
}
