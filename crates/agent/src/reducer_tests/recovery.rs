//! Recovery after a restart, repeated call ids.

use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// Recovery after a restart (the actor rebuilds the state from the log, then
// steps Interrupted)
// ---------------------------------------------------------------------------

#[test]
fn interrupted_while_generating_asks_the_model_again_twice_then_fails() {
    let mut live = Session::new(4);
    live.ok(user("hello"));
    live.ok(model_done("let me look", two_calls()));
    live.ok(done("c1", "out1"));
    live.ok(done("c2", "out2"));
    // Crash while the model answers the second time.
    let mut session = live.restarted();
    assert_eq!(session.state, live.state);
    assert_eq!(session.state.phase, Phase::Generate);
    let history = vec![
        Message::user("hello"),
        assistant("let me look", two_calls()),
        Message::tool("c1", "out1"),
        Message::tool("c2", "out2"),
    ];
    for restarts in 1..=2 {
        let effects = session.ok(Input::Interrupted);
        assert_eq!(
            effects,
            vec![
                record(
                    TURN,
                    vec![error(ErrorSource::Orchestrator, RESTARTED_GENERATING, true)]
                ),
                model_call(&session.state, history.clone()),
            ]
        );
        assert_eq!(session.state.turn.as_ref().unwrap().restarts, restarts);
        // And it crashes again.
        session = session.restarted();
        assert_eq!(session.state.turn.as_ref().unwrap().restarts, restarts);
    }
    let effects = session.ok(Input::Interrupted);
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                error(ErrorSource::Orchestrator, &gave_up(3), false),
                finished(TurnOutcome::Failed, &gave_up(3), 1, token_usage(10, 2)),
            ]
        )]
    );
    assert_eq!(core(&session.state), idle(history, 4));
    // The next turn starts with no restarts.
    session.ok(user_in(TURN2, "again"));
    assert_eq!(session.state.turn.as_ref().unwrap().restarts, 0);
    session.ok(Input::Interrupted);
    assert_eq!(session.state.turn.as_ref().unwrap().restarts, 1);
}

#[test]
fn interrupted_at_the_start_of_a_turn_asks_the_model() {
    let mut live = Session::new(4);
    live.ok(user("hello"));
    let mut session = live.restarted();
    assert_eq!(
        session.ok(Input::Interrupted),
        vec![
            record(
                TURN,
                vec![error(ErrorSource::Orchestrator, RESTARTED_GENERATING, true)]
            ),
            model_call(&session.state, vec![Message::user("hello")]),
        ]
    );
}

#[test]
fn interrupted_reruns_read_only_calls_that_were_running() {
    let mut live = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let r2 = grep("r2");
    let r3 = read_file("r3", "b.txt");
    live.ok(model_done("", vec![r1.clone(), r2.clone(), r3.clone()]));
    live.ok(chunk("r1", OutputStream::Stdout, "partial"));
    live.ok(done("r2", "2"));
    let mut session = live.restarted();
    assert_eq!(session.state, live.state);
    let effects = session.ok(Input::Interrupted);
    // No state event: the calls stay Executing and simply run again.
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![error(
                    ErrorSource::Orchestrator,
                    RESTARTED_USING_TOOLS,
                    true
                )]
            ),
            ran(r1),
            ran(r3),
        ]
    );
    assert_eq!(
        calls_of(&session.state)
            .iter()
            .map(|c| c.phase)
            .collect::<Vec<_>>(),
        vec![
            CallPhase::Executing,
            CallPhase::Success,
            CallPhase::Executing
        ]
    );
    session.ok(done("r3", "3"));
    let effects = session.ok(done("r1", "1"));
    assert!(matches!(effects.last(), Some(Effect::CallModel { .. })));
    assert_eq!(
        session.state.history[2..].to_vec(),
        vec![
            Message::tool("r1", "1"),
            Message::tool("r2", "2"),
            Message::tool("r3", "3"),
        ]
    );
}

#[test]
fn interrupted_reruns_an_edited_read_only_call_with_its_edited_arguments() {
    let policy = Arc::new(
        Policy::from_config(&PolicyConfig {
            tools: BTreeMap::from([("read_file".to_string(), PolicyDecision::Confirm)]),
            rules: vec![],
            network: false,
        })
        .unwrap(),
    );
    let mut live = Session::with_policy(4, policy, catalog());
    live.ok(user("go"));
    live.ok(model_done("", vec![read_file("r1", "a.txt")]));
    live.ok(edit("r1", r#"{"path":"b.txt"}"#));
    let mut session = live.restarted();
    let effects = session.ok(Input::Interrupted);
    assert_eq!(
        run_tools(&effects),
        vec![call("r1", "read_file", r#"{"path":"b.txt"}"#)]
    );
}

/// The question a restart asks about a mutating call that was running.
fn unknown_asked(call: &ToolCall) -> Kind {
    Kind::ApprovalRequested(pb::ApprovalRequested {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        arguments_json: call.arguments.clone(),
        matched_rule: format!(
            "outcome unknown: the runtime restarted while this {} call was running",
            call.name
        ),
        network: false,
        outcome_unknown: true,
        approvers: Vec::new(),
        approvals_required: 0,
    })
}

fn answer(call_id: &str, decision: ApprovalDecision) -> Input {
    approval(call_id, decision, "", "")
}

#[test]
fn interrupted_asks_a_person_about_mutating_calls_that_were_running() {
    let mut live = policed(4, ApprovalMode::Policy);
    let m1 = bash("m1", "git status");
    let w2 = write_file("w2", "out.txt");
    live.ok(model_done("", vec![m1.clone(), w2.clone()]));
    assert_eq!(phase_of(&live.state, "m1"), Some(CallPhase::Executing));
    live.ok(chunk("m1", OutputStream::Stdout, "On branch main"));
    let mut session = live.restarted();
    let effects = session.ok(Input::Interrupted);
    // Asked about m1 (check, run again, skip); w2's approval asked again.
    assert_eq!(
        effects,
        vec![record(
            TURN,
            concat(vec![
                vec![error(
                    ErrorSource::Orchestrator,
                    RESTARTED_USING_TOOLS,
                    true
                )],
                vec![unknown_asked(&m1)],
                vec![approval_requested(&w2, WRITE_FILE_DEFAULT)],
            ])
        )]
    );
    // Nothing moves on until the person answers; a late result of the lost
    // run is stale.
    assert_eq!(phase_of(&session.state, "m1"), Some(CallPhase::Executing));
    session.refused(
        done("m1", "late"),
        Refusal::Unexpected {
            input: "tool result",
            phase: Phase::UseTools,
        },
    );
    // Only check, run again (approve) and skip (deny) fit the question.
    session.refused(
        answer("m1", ApprovalDecision::ApproveForSession),
        Refusal::InvalidDecision(
            "this call's outcome is unknown after a restart: answer check, approve (run it \
             again) or deny (skip it)"
                .into(),
        ),
    );
    // Check: the model is told, as a headless turn does on its own.
    let unknown = outcome_unknown("bash");
    let effects = session.ok(answer("m1", ApprovalDecision::Check));
    assert_eq!(
        events_of(&effects)[1..],
        closed(&m1, ToolCallPhase::Error, &unknown)[..]
    );
    assert_eq!(session.state.history[2], Message::tool("m1", &unknown));
    assert_eq!(run_tools(&session.ok(approve("w2"))), vec![w2]);
    // Another call's question cannot be answered "check".
    let mut other = policed(4, ApprovalMode::Policy);
    other.ok(model_done("", vec![write_file("w9", "x.txt")]));
    other.refused(
        answer("w9", ApprovalDecision::Check),
        Refusal::InvalidDecision(
            "check applies only to a call whose outcome is unknown after a restart; approve, \
             approve for session, deny or edit"
                .into(),
        ),
    );
}

#[test]
fn a_person_may_run_a_lost_call_again_or_skip_it() {
    let start = || {
        let mut live = policed(4, ApprovalMode::Policy);
        live.ok(model_done("", vec![bash("m1", "git status")]));
        let mut session = live.restarted();
        session.ok(Input::Interrupted);
        session
    };
    // Run again: the same call runs once more, and its result answers.
    let mut session = start();
    let effects = session.ok(answer("m1", ApprovalDecision::Approve));
    assert_eq!(run_tools(&effects), vec![bash("m1", "git status")]);
    assert_eq!(phase_of(&session.state, "m1"), Some(CallPhase::Executing));
    // A restart during the second run asks again.
    let mut again = session.restarted();
    let asked = events_of(&again.ok(Input::Interrupted));
    assert!(
        asked.contains(&unknown_asked(&bash("m1", "git status"))),
        "{asked:?}"
    );
    session.ok(done("m1", "On branch main"));
    assert_eq!(
        session.state.history[2],
        Message::tool("m1", "On branch main")
    );

    // Skip: not run again; the model is told not to repeat it.
    let mut session = start();
    let effects = session.ok(approval(
        "m1",
        ApprovalDecision::Deny,
        "I pushed it by hand",
        "",
    ));
    assert!(run_tools(&effects).is_empty());
    let told = match &session.state.history[2] {
        Message::Tool { content, .. } => content.clone(),
        other => panic!("{other:?}"),
    };
    assert!(
        told.starts_with("error: not run again") && told.contains("(I pushed it by hand)"),
        "{told}"
    );
}

#[test]
fn interrupted_with_only_mutating_calls_running_calls_the_model() {
    // A headless turn: nobody to ask, so the model is told and checks.
    let mut live = Session::new(4);
    live.ok(user_with(TURN, "hello", ApprovalMode::Always));
    live.ok(model_done("", vec![c1()]));
    let mut session = live.restarted();
    let unknown = outcome_unknown("shell");
    let history = vec![
        Message::user("hello"),
        assistant("", vec![c1()]),
        Message::tool("c1", &unknown),
    ];
    assert_eq!(
        session.ok(Input::Interrupted),
        vec![
            record(
                TURN,
                concat(vec![
                    vec![error(
                        ErrorSource::Orchestrator,
                        RESTARTED_USING_TOOLS,
                        true
                    )],
                    closed(&c1(), ToolCallPhase::Error, &unknown),
                ])
            ),
            model_call(&session.state, history.clone()),
        ]
    );
    assert_eq!(session.state.phase, Phase::Generate);
    assert_eq!(session.state.history, history);
}

#[test]
fn interrupted_asks_again_for_pending_approvals_and_keeps_the_rest_waiting() {
    let mut live = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let b2 = bash("b2", "make build");
    let r3 = read_file("r3", "b.txt");
    live.ok(model_done("", vec![r1.clone(), b2.clone(), r3.clone()]));
    let mut session = live.restarted();
    let effects = session.ok(Input::Interrupted);
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    error(ErrorSource::Orchestrator, RESTARTED_USING_TOOLS, true),
                    approval_requested(&b2, BASH_DEFAULT),
                ]
            ),
            ran(r1),
        ]
    );
    assert_eq!(
        session.state.awaiting_approval(),
        vec![&call_in_catalog(&b2, CallPhase::AwaitingApproval, false)]
    );
    assert_eq!(phase_of(&session.state, "r3"), Some(CallPhase::Scheduled));
    // The decision works as before the restart.
    session.ok(done("r1", "1"));
    assert_eq!(run_tools(&session.ok(approve("b2"))), vec![b2]);
}

#[test]
fn interrupted_starts_scheduled_calls_left_behind_a_lost_mutating_call() {
    let mut live = policed(4, ApprovalMode::Always);
    let m1 = bash("m1", "git status");
    let r2 = read_file("r2", "a.txt");
    let r3 = grep("r3");
    let m4 = bash("m4", "git status");
    live.ok(model_done("", vec![m1.clone(), r2.clone(), r3.clone(), m4]));
    let mut session = live.restarted();
    let unknown = outcome_unknown("bash");
    assert_eq!(
        session.ok(Input::Interrupted),
        vec![
            record(
                TURN,
                concat(vec![
                    vec![error(
                        ErrorSource::Orchestrator,
                        RESTARTED_USING_TOOLS,
                        true
                    )],
                    closed(&m1, ToolCallPhase::Error, &unknown),
                    vec![executing("r2"), executing("r3")],
                ])
            ),
            ran(r2),
            ran(r3),
        ]
    );
}

#[test]
fn restarts_count_across_the_phases_of_a_turn() {
    let mut live = Session::new(4);
    live.ok(user_with(TURN, "hello", ApprovalMode::Always));
    live.ok(model_done("", vec![c1()]));
    // Restart while c1 runs: outcome unknown, the model is asked.
    let mut session = live.restarted();
    session.ok(Input::Interrupted);
    // Restart while the model answers.
    let mut session = session.restarted();
    session.ok(Input::Interrupted);
    assert_eq!(session.state.turn.as_ref().unwrap().restarts, 2);
    // The third restart of the turn gives up.
    let mut session = session.restarted();
    let effects = session.ok(Input::Interrupted);
    assert_eq!(
        events_of(&effects),
        vec![
            error(ErrorSource::Orchestrator, &gave_up(3), false),
            finished(TurnOutcome::Failed, &gave_up(3), 1, token_usage(10, 2)),
        ]
    );
}

// ---------------------------------------------------------------------------
// Repeated call ids
// ---------------------------------------------------------------------------

/// A response may repeat a call id; the repeats get a suffix so every call
/// can be told apart, runs, and gets its own answer.
#[test]
fn repeated_call_ids_in_one_response_get_suffixes() {
    let first = call("dup", "shell", r#"{"cmd":"a"}"#);
    let second = call("dup", "shell", r#"{"cmd":"b"}"#);
    let third = call("dup", "shell", r#"{"cmd":"c"}"#);
    let other = call("dup-2", "shell", r#"{"cmd":"d"}"#);
    let renamed = |c: &ToolCall, id: &str| ToolCall {
        id: id.into(),
        ..c.clone()
    };
    let calls_as_recorded = vec![
        first.clone(),
        renamed(&second, "dup-2"),
        renamed(&third, "dup-3"),
        renamed(&other, "dup-2-2"),
    ];
    let mut session = Session::new(4);
    session.ok(user("hello"));
    let effects = session.ok(model_done("", vec![first.clone(), second, third, other]));
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![first_answer(FIXED_BARE, first_message(""))],
                    calls_as_recorded.iter().map(requested).collect(),
                    calls_as_recorded.iter().map(|c| allowed(&c.id)).collect(),
                    vec![executing("dup")],
                ])
            ),
            ran(first),
        ]
    );
    for (i, c) in calls_as_recorded.iter().enumerate() {
        let effects = session.ok(done(&c.id, &format!("out {i}")));
        match calls_as_recorded.get(i + 1) {
            Some(next) => assert_eq!(run_tools(&effects), vec![next.clone()]),
            None => assert!(matches!(effects.last(), Some(Effect::CallModel { .. }))),
        }
    }
    assert_eq!(
        session.state.history,
        vec![
            Message::user("hello"),
            assistant("", calls_as_recorded),
            Message::tool("dup", "out 0"),
            Message::tool("dup-2", "out 1"),
            Message::tool("dup-3", "out 2"),
            Message::tool("dup-2-2", "out 3"),
        ]
    );
}

#[test]
fn call_ids_may_repeat_across_responses() {
    let mut state = generating_step_two(4);
    let effects = state.step(model_done("", vec![c1()])).unwrap();
    assert_eq!(run_tools(&effects), vec![c1()]);
    state.step(done("c1", "second")).unwrap();
    assert_eq!(
        state.history[2..].to_vec(),
        vec![
            Message::tool("c1", "out1"),
            Message::tool("c2", "out2"),
            assistant("", vec![c1()]),
            Message::tool("c1", "second"),
        ]
    );
}

// ---------------------------------------------------------------------------
// A turn parked by a model server that asks to wait
// ---------------------------------------------------------------------------

fn parked_until(seconds: i64) -> pb::TurnParked {
    pb::TurnParked {
        reason: pb::ParkReason::RateLimit as i32,
        until: Some(prost_types::Timestamp { seconds, nanos: 0 }),
        message: "HTTP 429: slow down".into(),
    }
}

#[test]
fn a_parked_turn_waits_across_a_restart_and_goes_on_when_woken() {
    let mut live = Session::new(4);
    live.ok(user("hello"));
    let effects = live.ok(Input::ModelTryLater(parked_until(1_000)));
    assert_eq!(
        effects,
        vec![
            record(TURN, vec![Kind::TurnParked(parked_until(1_000))]),
            Effect::WakeAt { at_ms: 1_000_000 },
        ]
    );
    assert_eq!(live.state.phase, Phase::Generate);
    // While it waits: no model output is taken, no new message starts a
    // turn, and a second wait is not stacked.
    live.refused(
        model_done("late", vec![]),
        Refusal::Unexpected {
            input: "model output",
            phase: Phase::Generate,
        },
    );
    live.refused(
        Input::ModelTryLater(parked_until(2_000)),
        Refusal::Unexpected {
            input: "model output",
            phase: Phase::Generate,
        },
    );
    live.refused(
        Input::Compact {
            turn_id: "turn-2".into(),
            text: "/compact".into(),
        },
        Refusal::Busy,
    );

    // A restart re-arms the wait: no event, and not counted as a restart.
    let mut session = live.restarted();
    assert_eq!(session.state, live.state);
    assert_eq!(
        session.ok(Input::Interrupted),
        vec![Effect::WakeAt { at_ms: 1_000_000 }]
    );
    assert_eq!(session.state.turn.as_ref().unwrap().restarts, 0);

    // Woken: resumed, and the model is asked again with the same history.
    let effects = session.ok(Input::Unpark);
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![Kind::TurnResumed(pb::TurnResumed {
                    reason: pb::ParkReason::RateLimit as i32,
                    budget: None,
                })]
            ),
            model_call(&session.state, vec![Message::user("hello")]),
        ]
    );
    assert!(session.state.parked.is_none());
    // A second wake-up (a timer that fired twice) does nothing.
    assert!(session.ok(Input::Unpark).is_empty());
    session.ok(model_done("hi", vec![]));
    assert_eq!(session.state.phase, Phase::Idle);
}

#[test]
fn a_parked_turn_can_be_cancelled() {
    let mut session = Session::new(4);
    session.ok(user("hello"));
    session.ok(Input::ModelTryLater(parked_until(1_000)));
    let effects = session.ok(cancel("not today"));
    assert_eq!(effects[0], Effect::AbortInFlight);
    assert_eq!(session.state.phase, Phase::Idle);
    assert!(session.state.parked.is_none());
    let finished = events_of(&effects)
        .into_iter()
        .find_map(|k| match k {
            Kind::TurnFinished(f) => Some(f),
            _ => None,
        })
        .unwrap();
    assert_eq!(finished.outcome, TurnOutcome::Cancelled as i32);
}
