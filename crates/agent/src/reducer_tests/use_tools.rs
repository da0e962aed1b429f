//! The use-tools phase.

use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// UseTools
// ---------------------------------------------------------------------------

#[test]
fn use_tools_user_message_steers_after_the_results() {
    let mut state = using_tools(4);
    state.step(user_in(TURN2, "hey")).unwrap();
    state.step(done("c1", "out1")).unwrap();
    assert_eq!(state.steering, vec!["hey".to_string()]);
    // The last result: the model is asked with the message after them.
    let effects = state.step(done("c2", "out2")).unwrap();
    assert!(state.steering.is_empty());
    let Some(Effect::CallModel { request }) = effects.last() else {
        panic!("{effects:?}")
    };
    assert!(matches!(
        request.history.last(),
        Some(Message::User { content, .. }) if content == "hey"
    ));
    assert!(matches!(
        &request.history[request.history.len() - 2],
        Message::Tool { tool_call_id, .. } if tool_call_id == "c2"
    ));
}

#[test]
fn use_tools_model_output_is_refused() {
    let unexpected = Refusal::Unexpected {
        input: "model output",
        phase: Phase::UseTools,
    };
    let state = using_tools(4);
    assert_refused(&state, model_done("late", vec![]), unexpected.clone());
    assert_refused(&state, model_done("late", two_calls()), unexpected.clone());
    assert_refused(&state, model_failed("late", true), unexpected);
}

#[test]
fn use_tools_chunks_are_recorded_and_change_nothing_else() {
    let mut state = using_tools(4);
    let before = state.clone();
    for (stream, text) in [
        (OutputStream::Stdout, "line 1\n"),
        (OutputStream::Stderr, "warning\n"),
    ] {
        assert_eq!(
            state.step(chunk("c1", stream, text)),
            Ok(vec![record(
                TURN,
                vec![Kind::ToolOutputChunk(pb::ToolOutputChunk {
                    call_id: "c1".into(),
                    stream: stream as i32,
                    text: text.into(),
                })]
            )])
        );
    }
    assert_eq!(core(&state), core(&before));
}

#[test]
fn use_tools_chunks_of_calls_not_running_are_refused() {
    let unexpected = Refusal::Unexpected {
        input: "tool output",
        phase: Phase::UseTools,
    };
    let state = using_tools(4);
    // c2 is scheduled, not running.
    for id in ["c2", "ghost", ""] {
        assert_refused(
            &state,
            chunk(id, OutputStream::Stdout, "x"),
            unexpected.clone(),
        );
    }
    let mut one_left = state;
    one_left.step(done("c1", "out1")).unwrap();
    assert_refused(
        &one_left,
        chunk("c1", OutputStream::Stdout, "late"),
        unexpected,
    );
}

#[test]
fn use_tools_first_result_runs_the_next_call() {
    let mut state = using_tools(4);
    let effects = state.step(done("c1", "out1")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![success("c1", "out1"), vec![executing("c2")]])
            ),
            ran_unflagged(c2()),
        ]
    );
    assert_eq!(
        core(&state),
        state_with(
            Phase::UseTools,
            Some(turn(
                TURN,
                1,
                token_usage(10, 2),
                vec![
                    call_in(&c1(), CallPhase::Success, true),
                    call_in(&c2(), CallPhase::Executing, false),
                ],
                1,
                "let me look"
            )),
            vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
                Message::tool("c1", "out1"),
            ],
            4
        )
    );
}

#[test]
fn use_tools_last_result_calls_the_model_with_the_results() {
    let mut state = using_tools(4);
    state.step(done("c1", "out1")).unwrap();
    let effects = state.step(done("c2", "out2")).unwrap();
    let history = vec![
        Message::user("hello"),
        assistant("let me look", two_calls()),
        Message::tool("c1", "out1"),
        Message::tool("c2", "out2"),
    ];
    assert_eq!(
        effects,
        vec![
            record(TURN, success("c2", "out2")),
            model_call(&state, history.clone()),
        ]
    );
    assert_eq!(
        core(&state),
        state_with(
            Phase::Generate,
            Some(turn(
                TURN,
                1,
                token_usage(10, 2),
                vec![
                    call_in(&c1(), CallPhase::Success, true),
                    call_in(&c2(), CallPhase::Success, true),
                ],
                1,
                "let me look"
            )),
            history,
            4
        )
    );
}

#[test]
fn use_tools_error_result_is_passed_to_the_model() {
    let mut state = generating(4);
    state.step(model_done("", vec![c1()])).unwrap();
    let failed = pb::ToolResult {
        is_error: true,
        exit_code: Some(2),
        ..tool_result("c1", "ls: cannot access 'x'")
    };
    let effects = state.step(Input::ToolDone(failed.clone())).unwrap();
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    phase_event("c1", ToolCallPhase::Error, ""),
                    Kind::ToolResult(failed),
                ]
            ),
            model_call(
                &state,
                vec![
                    Message::user("hello"),
                    assistant("", vec![c1()]),
                    Message::tool("c1", "ls: cannot access 'x'"),
                ]
            ),
        ]
    );
    assert_eq!(phase_of(&state, "c1"), Some(CallPhase::Error));
}

#[test]
fn use_tools_result_without_a_tool_name_gets_the_calls() {
    let mut state = using_tools(4);
    let effects = state
        .step(Input::ToolDone(pb::ToolResult {
            tool: String::new(),
            ..tool_result("c1", "out1")
        }))
        .unwrap();
    assert_eq!(
        events_of(&effects)[1],
        Kind::ToolResult(tool_result("c1", "out1"))
    );
}

#[test]
fn use_tools_result_for_a_call_not_running_is_refused() {
    let unexpected = Refusal::Unexpected {
        input: "tool result",
        phase: Phase::UseTools,
    };
    let state = using_tools(4);
    // Scheduled (not started), unknown, and empty ids.
    assert_refused(&state, done("c2", "out2"), unexpected.clone());
    assert_refused(&state, done("nope", "?"), unexpected.clone());
    assert_refused(&state, done("", "?"), unexpected.clone());

    // A second result for an answered call.
    let mut one_left = state;
    one_left.step(done("c1", "out1")).unwrap();
    assert_refused(&one_left, done("c1", "again"), unexpected);
}

#[test]
fn use_tools_cancel_closes_every_open_call() {
    let mut state = using_tools(4);
    let effects = state.step(cancel("enough")).unwrap();
    assert_eq!(
        effects,
        vec![
            Effect::AbortInFlight,
            record(
                TURN,
                concat(vec![
                    vec![Kind::CancelRequested(pb::CancelRequested {
                        reason: "enough".into()
                    })],
                    closed(&c1(), ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
                    closed(&c2(), ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
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
        core(&state),
        idle(
            vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
                Message::tool("c1", CANCELLED_OUTPUT),
                Message::tool("c2", CANCELLED_OUTPUT),
            ],
            4
        )
    );
}

#[test]
fn use_tools_cancel_after_the_first_result_closes_only_the_rest() {
    let mut state = using_tools(4);
    state.step(done("c1", "out1")).unwrap();
    let effects = state.step(cancel("")).unwrap();
    assert_eq!(
        effects,
        vec![
            Effect::AbortInFlight,
            record(
                TURN,
                concat(vec![
                    vec![Kind::CancelRequested(pb::CancelRequested::default())],
                    closed(&c2(), ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
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
        state.history,
        vec![
            Message::user("hello"),
            assistant("let me look", two_calls()),
            Message::tool("c1", "out1"),
            Message::tool("c2", CANCELLED_OUTPUT),
        ]
    );
    assert!(state.is_idle());
}

#[test]
fn use_tools_interrupted_reports_the_running_mutating_call_and_starts_the_next() {
    // A headless turn (nobody to ask what to do with c1).
    let mut state = SessionState::new(4);
    state
        .step(user_with(TURN, "hello", ApprovalMode::Always))
        .unwrap();
    state.step(model_done("let me look", two_calls())).unwrap();
    let unknown = outcome_unknown("shell");
    let effects = state.step(Input::Interrupted).unwrap();
    assert_eq!(
        effects,
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
                    vec![executing("c2")],
                ])
            ),
            ran_unflagged(c2()),
        ]
    );
    assert_eq!(
        core(&state),
        state_with(
            Phase::UseTools,
            Some(Turn {
                restarts: 1,
                approval_mode: ApprovalMode::Always,
                ..turn(
                    TURN,
                    1,
                    token_usage(10, 2),
                    vec![
                        call_in(&c1(), CallPhase::Error, true),
                        call_in(&c2(), CallPhase::Executing, false),
                    ],
                    1,
                    "let me look"
                )
            }),
            vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
                Message::tool("c1", &unknown),
            ],
            4
        )
    );
}

#[test]
fn a_delegate_calls_result_ends_its_task_and_one_without_the_answer_cancels_it() {
    let end_tasks = |effects: &[Effect]| -> Vec<(String, u32, bool)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::EndTask {
                    call_id,
                    step,
                    cancel,
                    ..
                } => Some((call_id.clone(), *step, *cancel)),
                _ => None,
            })
            .collect()
    };
    let delegate = |id: &str| call(id, "delegate", r#"{"agent":"a","task":"t"}"#);
    // Answered: the task is over, not cancelled; after the result is stored.
    let mut s = Session::new(20);
    s.ok(user("go"));
    s.ok(model_done("", vec![delegate("d1")]));
    let mut answered = tool_result("d1", "the answer");
    answered.tool = "delegate".into();
    let effects = s.ok(Input::ToolDone(answered));
    assert_eq!(end_tasks(&effects), vec![("d1".to_string(), 1, false)]);
    let record = effects
        .iter()
        .position(|e| matches!(e, Effect::Record { .. }))
        .unwrap();
    let end = effects
        .iter()
        .position(|e| matches!(e, Effect::EndTask { .. }))
        .unwrap();
    assert!(record < end, "{effects:?}");
    // Cancelled while it runs: its task is cancelled too.
    let mut s = Session::new(20);
    s.ok(user("go"));
    s.ok(model_done("", vec![delegate("d2")]));
    let effects = s.ok(cancel("stop"));
    assert_eq!(end_tasks(&effects), vec![("d2".to_string(), 1, true)]);
    // Other tools end no task.
    let mut s = Session::new(20);
    s.ok(user("go"));
    s.ok(model_done("", vec![bash("b1", "ls")]));
    assert!(end_tasks(&s.ok(done("b1", "a.txt"))).is_empty());
}
