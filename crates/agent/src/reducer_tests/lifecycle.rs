//! The call lifecycle, dispatch order and cancels.

use super::approvals::awaiting_build;
use super::plan::outcome_of;
use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// The call lifecycle only moves forward
// ---------------------------------------------------------------------------

#[test]
fn backward_state_events_are_ignored_by_apply() {
    // c1 executing, c2 scheduled.
    let mut state = using_tools(4);
    let before = state.clone();
    for (id, phase) in [
        ("c1", ToolCallPhase::Validating),
        ("c1", ToolCallPhase::AwaitingApproval),
        ("c1", ToolCallPhase::Scheduled),
        ("c1", ToolCallPhase::Executing),
        ("c1", ToolCallPhase::Unspecified),
        ("c2", ToolCallPhase::Validating),
        ("c2", ToolCallPhase::AwaitingApproval),
        ("c2", ToolCallPhase::Scheduled),
        ("ghost", ToolCallPhase::Success),
    ] {
        state.apply(TURN, &phase_event(id, phase, "backward"));
        assert_eq!(core(&state), core(&before), "{id} -> {phase:?}");
    }
    let mut raw = pb::ToolCallState {
        call_id: "c2".into(),
        phase: 0,
        detail: String::new(),
        allowed_by: 0,
    };
    for unknown in [-1, 99] {
        raw.phase = unknown;
        state.apply(TURN, &Kind::ToolCallState(raw.clone()));
        assert_eq!(core(&state), core(&before), "phase {unknown}");
    }

    // Forward moves apply; from a terminal phase nothing moves, not even to
    // another terminal phase.
    state.apply(TURN, &phase_event("c2", ToolCallPhase::Cancelled, ""));
    assert_eq!(phase_of(&state, "c2"), Some(CallPhase::Cancelled));
    for phase in [
        ToolCallPhase::Executing,
        ToolCallPhase::Success,
        ToolCallPhase::Error,
        ToolCallPhase::Validating,
    ] {
        state.apply(TURN, &phase_event("c2", phase, ""));
        assert_eq!(phase_of(&state, "c2"), Some(CallPhase::Cancelled));
    }
}

#[test]
fn results_for_calls_not_executing_are_refused() {
    let mut session = awaiting_build();
    let unexpected = Refusal::Unexpected {
        input: "tool result",
        phase: Phase::UseTools,
    };
    // Awaiting approval, and scheduled.
    session.refused(done("b1", "x"), unexpected.clone());
    session.refused(done("r2", "x"), unexpected.clone());
    session.ok(approve("b1"));
    session.refused(done("r2", "x"), unexpected.clone());
    // Finished.
    session.ok(done("b1", "built"));
    session.refused(done("b1", "again"), unexpected.clone());
    // Denied.
    let mut session = awaiting_build();
    session.ok(deny("b1", ""));
    session.refused(done("b1", "x"), unexpected.clone());
    session.refused(
        chunk("b1", OutputStream::Stdout, "x"),
        Refusal::Unexpected {
            input: "tool output",
            phase: Phase::UseTools,
        },
    );
}

// ---------------------------------------------------------------------------
// Dispatch: order and concurrency
// ---------------------------------------------------------------------------

#[test]
fn read_only_parallel_calls_start_together_and_a_mutating_call_waits_for_them() {
    let mut session = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let r2 = grep("r2");
    let r3 = read_file("r3", "b.txt");
    let m4 = bash("m4", "git status");
    let calls = vec![r1.clone(), r2.clone(), r3.clone(), m4.clone()];
    let effects = session.ok(model_done("looking", calls.clone()));
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![first_answer(FIXED_WITH_TOOLS, first_message("looking"))],
                    calls.iter().map(requested_in_catalog).collect(),
                    vec![
                        scheduled("r1", READ_FILE_DEFAULT),
                        scheduled("r2", GREP_DEFAULT),
                        scheduled("r3", READ_FILE_DEFAULT),
                        scheduled("m4", GIT_STATUS_RULE),
                        executing("r1"),
                        executing("r2"),
                        executing("r3"),
                    ],
                ])
            ),
            ran(r1),
            ran(r2),
            ran(r3),
        ]
    );
    // They finish out of order; the results go into the history in the
    // model's order, and the mutating call starts after the last of them.
    let base = vec![Message::user("go"), assistant("looking", calls)];
    let history = |tools: &[(&str, &str)]| {
        let mut h = base.clone();
        h.extend(tools.iter().map(|(id, out)| Message::tool(*id, *out)));
        h
    };
    assert_eq!(
        session.ok(done("r3", "B")),
        vec![record(TURN, success("r3", "B"))]
    );
    assert_eq!(session.state.history, history(&[("r3", "B")]));
    assert_eq!(
        session.ok(done("r1", "A")),
        vec![record(TURN, success("r1", "A"))]
    );
    assert_eq!(session.state.history, history(&[("r1", "A"), ("r3", "B")]));
    assert_eq!(
        session.ok(done("r2", "x")),
        vec![
            record(
                TURN,
                concat(vec![success("r2", "x"), vec![executing("m4")]])
            ),
            ran(m4),
        ]
    );
    assert_eq!(
        session.state.history,
        history(&[("r1", "A"), ("r2", "x"), ("r3", "B")])
    );
    let effects = session.ok(done("m4", "clean"));
    let full = history(&[("r1", "A"), ("r2", "x"), ("r3", "B"), ("m4", "clean")]);
    assert_eq!(
        effects,
        vec![
            record(TURN, success("m4", "clean")),
            model_call(&session.state, full.clone()),
        ]
    );
    assert_eq!(session.state.history, full);
}

#[test]
fn a_mutating_call_between_read_only_ones_splits_the_batches() {
    let mut session = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let r2 = grep("r2");
    let m3 = bash("m3", "git status");
    let r4 = read_file("r4", "b.txt");
    let r5 = grep("r5");
    let effects = session.ok(model_done(
        "",
        vec![r1.clone(), r2.clone(), m3.clone(), r4.clone(), r5.clone()],
    ));
    assert_eq!(run_tools(&effects), vec![r1, r2]);
    assert_eq!(run_tools(&session.ok(done("r2", "2"))), vec![]);
    assert_eq!(
        session.ok(done("r1", "1")),
        vec![
            record(
                TURN,
                concat(vec![success("r1", "1"), vec![executing("m3")]])
            ),
            ran(m3),
        ]
    );
    assert_eq!(
        session.ok(done("m3", "3")),
        vec![
            record(
                TURN,
                concat(vec![
                    success("m3", "3"),
                    vec![executing("r4"), executing("r5")],
                ])
            ),
            ran(r4),
            ran(r5),
        ]
    );
    session.ok(done("r5", "5"));
    let effects = session.ok(done("r4", "4"));
    assert!(matches!(effects.last(), Some(Effect::CallModel { .. })));
    let answers: Vec<&str> = session.state.history[2..]
        .iter()
        .map(|m| match m {
            Message::Tool { tool_call_id, .. } => tool_call_id.as_str(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(answers, vec!["r1", "r2", "m3", "r4", "r5"]);
}

#[test]
fn read_only_calls_that_are_not_parallel_safe_run_alone() {
    let mut session = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let s2 = stat("s2");
    let s3 = stat("s3");
    let r4 = read_file("r4", "b.txt");
    let effects = session.ok(model_done(
        "",
        vec![r1.clone(), s2.clone(), s3.clone(), r4.clone()],
    ));
    assert_eq!(
        events_of(&effects)[5..].to_vec(),
        vec![
            scheduled("r1", READ_FILE_DEFAULT),
            scheduled("s2", STAT_DEFAULT),
            scheduled("s3", STAT_DEFAULT),
            scheduled("r4", READ_FILE_DEFAULT),
            executing("r1"),
        ]
    );
    assert_eq!(run_tools(&effects), vec![r1]);
    assert_eq!(run_tools(&session.ok(done("r1", "1"))), vec![s2]);
    assert_eq!(run_tools(&session.ok(done("s2", "2"))), vec![s3]);
    assert_eq!(run_tools(&session.ok(done("s3", "3"))), vec![r4]);
}

#[test]
fn a_call_awaiting_approval_holds_up_the_calls_after_it() {
    let mut session = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let b2 = bash("b2", "make build");
    let r3 = read_file("r3", "b.txt");
    let effects = session.ok(model_done("", vec![r1.clone(), b2.clone(), r3.clone()]));
    assert_eq!(
        events_of(&effects)[4..].to_vec(),
        vec![
            scheduled("r1", READ_FILE_DEFAULT),
            approval_requested(&b2, BASH_DEFAULT),
            awaiting("b2"),
            scheduled("r3", READ_FILE_DEFAULT),
            executing("r1"),
        ]
    );
    assert_eq!(run_tools(&effects), vec![r1]);
    // r1 done: r3 still waits behind b2.
    assert_eq!(
        session.ok(done("r1", "1")),
        vec![record(TURN, success("r1", "1"))]
    );
    assert_eq!(phase_of(&session.state, "r3"), Some(CallPhase::Scheduled));
    // Approved: b2 runs (alone); then r3.
    assert_eq!(run_tools(&session.ok(approve("b2"))), vec![b2]);
    assert_eq!(
        session.ok(done("b2", "2")),
        vec![
            record(
                TURN,
                concat(vec![success("b2", "2"), vec![executing("r3")]])
            ),
            ran(r3),
        ]
    );
}

#[test]
fn an_approved_read_only_call_joins_the_running_batch() {
    // A read-only call the policy confirms (no default, a confirm rule).
    let policy = Arc::new(
        Policy::from_config(&PolicyConfig {
            tools: BTreeMap::new(),
            rules: vec![rule(
                "read_file",
                None,
                Some("private/*"),
                PolicyDecision::Confirm,
                None,
            )],
            network: false,
        })
        .unwrap(),
    );
    let mut session = Session::with_policy(4, policy, catalog());
    session.ok(user("go"));
    let r1 = read_file("r1", "a.txt");
    let r2 = read_file("r2", "private/x");
    let r3 = grep("r3");
    let effects = session.ok(model_done("", vec![r1.clone(), r2.clone(), r3.clone()]));
    assert_eq!(run_tools(&effects), vec![r1]);
    assert_eq!(session.state.awaiting_approval()[0].id, "r2", "{effects:?}");
    // r1 is still running: r2 and r3 start next to it.
    let effects = session.ok(approve("r2"));
    assert_eq!(run_tools(&effects), vec![r2, r3]);
    assert_eq!(
        calls_of(&session.state)
            .iter()
            .map(|c| c.phase)
            .collect::<Vec<_>>(),
        vec![CallPhase::Executing; 3]
    );
}

// ---------------------------------------------------------------------------
// Cancel with calls in every phase
// ---------------------------------------------------------------------------

#[test]
fn cancel_closes_running_waiting_and_scheduled_calls() {
    let mut session = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let r2 = grep("r2");
    let b3 = bash("b3", "make build");
    let r4 = read_file("r4", "b.txt");
    let r5 = read_file("r5", "c.txt");
    let calls = vec![r1.clone(), r2.clone(), b3.clone(), r4.clone(), r5.clone()];
    let effects = session.ok(model_done("", calls.clone()));
    assert_eq!(run_tools(&effects), vec![r1.clone(), r2.clone()]);
    session.ok(done("r2", "2"));
    // r1 executing, r2 done, b3 awaiting approval, r4 and r5 scheduled.
    let effects = session.ok(cancel("stop"));
    assert_eq!(
        effects,
        vec![
            Effect::AbortInFlight,
            record(
                TURN,
                concat(vec![
                    vec![Kind::CancelRequested(pb::CancelRequested {
                        reason: "stop".into()
                    })],
                    closed(&r1, ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
                    closed(&b3, ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
                    closed(&r4, ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
                    closed(&r5, ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
                    vec![finished(
                        TurnOutcome::Cancelled,
                        "cancelled",
                        1,
                        token_usage(10, 2)
                    )],
                ])
            ),
        ]
    );
    assert_eq!(
        core(&session.state),
        SessionState {
            history: vec![
                Message::user("go"),
                assistant("", calls),
                Message::tool("r1", CANCELLED_OUTPUT),
                Message::tool("r2", "2"),
                Message::tool("b3", CANCELLED_OUTPUT),
                Message::tool("r4", CANCELLED_OUTPUT),
                Message::tool("r5", CANCELLED_OUTPUT),
            ],
            ..Session::with_policy(4, session.state.policy.0.clone(), catalog()).state
        }
    );
    // Late decisions and results are stale.
    session.refused(
        approve("b3"),
        Refusal::NoPendingApproval {
            call_id: "b3".into(),
        },
    );
    session.refused(
        done("r1", "late"),
        Refusal::Unexpected {
            input: "tool output",
            phase: Phase::Idle,
        },
    );
}

#[test]
fn a_turn_ends_with_its_cost_at_the_configured_price() {
    let price = crate::settings::ModelPrice {
        pattern: "*".into(),
        input: 2.0,
        output: 8.0,
        cached_input: Some(0.5),
        cache_write: None,
        currency: Some("EUR".into()),
    };
    let view = Arc::new(View {
        price: Some(price),
        ..View::default()
    });
    let mut session = Session::new(4);
    session.state = session.state.clone().with_view(view);
    session.ok(user("go"));
    let cached = Usage {
        cached_prompt_tokens: 400,
        ..usage(1_000, 200)
    };
    session.ok(Input::ModelDone(completion_with_usage(
        "",
        vec![bash("b1", "ls")],
        Some(cached),
    )));
    session.ok(done("b1", "a"));
    let effects = session.ok(Input::ModelDone(completion_with_usage(
        "done",
        vec![],
        Some(usage(2_000, 100)),
    )));
    let finished = outcome_of(&effects).unwrap();
    // 600 uncached × 2 + 400 cached × 0.5 + 200 out × 8, then 2,000 × 2 +
    // 100 × 8, per million tokens.
    let expected = (600.0 * 2.0 + 400.0 * 0.5 + 200.0 * 8.0 + 2_000.0 * 2.0 + 100.0 * 8.0) / 1e6;
    let cost = finished.cost.unwrap();
    assert!((cost - expected).abs() < 1e-12, "{cost} vs {expected}");
    assert_eq!(finished.currency, "EUR");
    assert_eq!(finished.usage.unwrap().cached_prompt_tokens, 400);

    // Without a price, no cost.
    let mut session = Session::new(4);
    session.ok(user("go"));
    let effects = session.ok(Input::ModelDone(completion_with_usage(
        "done",
        vec![],
        Some(usage(10, 10)),
    )));
    let finished = outcome_of(&effects).unwrap();
    assert_eq!(finished.cost, None);
    assert_eq!(finished.currency, "");
}
