//! The generate phase.

use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// Generate
// ---------------------------------------------------------------------------

#[test]
fn generate_user_message_steers_the_turn() {
    for mut state in [generating(4), generating_step_two(4)] {
        let effects = state.step(user_in(TURN2, "hey")).unwrap();
        assert_eq!(
            effects,
            vec![record(
                TURN,
                vec![Kind::SteeringQueued(pb::SteeringQueued {
                    text: "hey".into()
                })]
            )]
        );
        assert_eq!(state.steering, vec!["hey".to_string()]);
    }
    // An empty one is refused; a plan or a compaction needs its own turn.
    assert_refused(&generating(4), user_in(TURN2, ""), Refusal::EmptyMessage);
    assert_refused(
        &generating(4),
        Input::Compact {
            turn_id: TURN2.into(),
            text: "/compact".into(),
        },
        Refusal::Busy,
    );
}

#[test]
fn steering_goes_with_the_next_model_call_and_a_final_answer_asks_again() {
    let mut session = Session::new(4);
    session.ok(user("hello"));
    session.ok(user("also this"));
    // The model answers without calls: it is asked again, with the message.
    let effects = session.ok(model_done("first answer", vec![]));
    let events = events_of(&effects);
    assert!(
        matches!(events.last(), Some(Kind::SteeringDelivered(d)) if d.count == 1),
        "{events:?}"
    );
    assert_eq!(session.state.phase, Phase::Generate);
    assert!(session.state.steering.is_empty());
    let history = vec![
        Message::user("hello"),
        assistant("first answer", vec![]),
        Message::user("also this"),
    ];
    assert_eq!(effects.last(), Some(&model_call(&session.state, history)));
    session.ok(model_done("done", vec![]));
    assert!(session.state.is_idle());
}

#[test]
fn steering_not_yet_delivered_goes_with_a_cancelled_turn() {
    let mut session = Session::new(4);
    session.ok(user("hello"));
    session.ok(user("also this"));
    session.ok(cancel("stop"));
    assert!(session.state.is_idle());
    assert!(session.state.steering.is_empty());
    assert!(
        !session
            .state
            .history
            .iter()
            .any(|m| matches!(m, Message::User { content, .. } if content == "also this"))
    );
}

#[test]
fn a_logged_text_delta_of_an_older_log_changes_nothing_but_the_position() {
    // Streamed text is live now; logs written before hold it as events.
    let mut state = generating(4);
    let before = state.clone();
    for text in ["Hel", "lo"] {
        state.apply(
            TURN,
            &Kind::ModelTextDelta(pb::ModelTextDelta { text: text.into() }),
        );
    }
    assert_eq!(state.last_seq, before.last_seq + 2);
    assert_eq!(core(&state), core(&before));
}

#[test]
fn generate_model_done_without_tool_calls_completes_the_turn() {
    let mut state = generating(4);
    let effects = state.step(model_done("the answer", vec![])).unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                first_answer(
                    FIXED_BARE,
                    model_message("the answer", "stop", 1, Some(token_usage(10, 2)))
                ),
                finished(TurnOutcome::Completed, "the answer", 1, token_usage(10, 2)),
            ]
        )]
    );
    assert_eq!(
        core(&state),
        idle(
            vec![Message::user("hello"), Message::assistant("the answer")],
            4
        )
    );
}

#[test]
fn generate_model_done_without_usage_records_none_and_sums_zero() {
    let mut state = generating(4);
    let effects = state
        .step(Input::ModelDone(completion_with_usage("ok", vec![], None)))
        .unwrap();
    assert_eq!(
        events_of(&effects),
        vec![
            first_answer(FIXED_BARE, model_message("ok", "stop", 1, None)),
            finished(TurnOutcome::Completed, "ok", 1, TokenUsage::default()),
        ]
    );
}

#[test]
fn generate_model_done_with_two_tool_calls_runs_the_first() {
    let mut state = generating(4);
    let effects = state.step(model_done("let me look", two_calls())).unwrap();
    // Unknown tools count as mutating: they run one at a time.
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    first_answer(FIXED_BARE, first_message("let me look")),
                    requested(&c1()),
                    requested(&c2()),
                    allowed("c1"),
                    allowed("c2"),
                    executing("c1"),
                ]
            ),
            ran(c1()),
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
                    call_in(&c1(), CallPhase::Executing, false),
                    call_in(&c2(), CallPhase::Scheduled, false),
                ],
                1,
                "let me look"
            )),
            vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
            ],
            4
        )
    );
}

#[test]
fn generate_model_done_takes_the_flags_from_the_catalog() {
    let mut state = generating(4);
    state.step(Input::ToolCatalog(catalog())).unwrap();
    let calls = vec![
        read_file("r1", "a.txt"),
        stat("s2"),
        bash("b3", "ls"),
        call("u4", "unknown_tool", "{}"),
    ];
    let effects = state.step(model_done("", calls.clone())).unwrap();
    let events = events_of(&effects);
    assert_eq!(
        events[1..5].to_vec(),
        vec![
            requested_with(&calls[0], READ_ONLY_PARALLEL),
            requested_with(&calls[1], READ_ONLY_SERIAL),
            requested_with(&calls[2], MUTATING),
            requested_with(&calls[3], ToolFlags::default()),
        ]
    );
    let flags: Vec<(bool, bool)> = calls_of(&state)
        .iter()
        .map(|c| (c.read_only, c.parallel_safe))
        .collect();
    assert_eq!(
        flags,
        vec![(true, true), (true, false), (false, false), (false, false)]
    );
}

#[test]
fn generate_model_done_with_only_tool_calls_has_empty_assistant_text() {
    let mut state = generating(4);
    let effects = state.step(model_done("", vec![c1()])).unwrap();
    assert_eq!(effects.last(), Some(&ran(c1())));
    assert_eq!(state.history.last(), Some(&assistant("", vec![c1()])));
}

#[test]
fn generate_model_done_with_invalid_arguments_answers_with_an_error() {
    let bad_json = call("c1", "shell", "{not json");
    let not_object = call("c2", "shell", "[1,2]");
    let empty = call("c3", "shell", "");
    let mut session = Session::new(4);
    session.ok(user("hello"));
    let effects = session.ok(model_done(
        "",
        vec![bad_json.clone(), not_object.clone(), empty.clone()],
    ));
    let events = events_of(&effects);
    assert_eq!(
        events[..4].to_vec(),
        vec![
            first_answer(FIXED_BARE, first_message("")),
            requested(&bad_json),
            requested(&not_object),
            requested(&empty),
        ]
    );
    let bad_json_output = match &events[4] {
        Kind::ToolCallState(s) => s.detail.clone(),
        other => panic!("expected a state event, got {other:?}"),
    };
    assert!(
        bad_json_output.starts_with("error: invalid arguments for shell: not valid JSON ("),
        "{bad_json_output}"
    );
    let not_object_output = "error: invalid arguments for shell: expected a JSON object, got [1,2]";
    assert_eq!(
        events[4..].to_vec(),
        concat(vec![
            closed(&bad_json, ToolCallPhase::Error, &bad_json_output),
            closed(&not_object, ToolCallPhase::Error, not_object_output),
            // Empty arguments mean `{}`.
            vec![allowed("c3"), executing("c3")],
        ])
    );
    assert_eq!(run_tools(&effects), vec![empty]);
}

#[test]
fn generate_model_done_with_only_invalid_calls_calls_the_model_again() {
    let bad = call("c1", "shell", "nope");
    let mut state = generating(4);
    let effects = state.step(model_done("", vec![bad.clone()])).unwrap();
    assert_eq!(effects.len(), 2);
    let Effect::CallModel {
        request: ModelRequest { history, .. },
    } = &effects[1]
    else {
        panic!("expected a model call, got {effects:?}");
    };
    assert_eq!(history, &state.history);
    assert_eq!(state.phase, Phase::Generate);
    assert!(matches!(
        history.last(),
        Some(Message::Tool { tool_call_id, content })
            if tool_call_id == "c1" && content.starts_with("error: invalid arguments for shell")
    ));
}

#[test]
fn generate_model_done_at_a_later_step_counts_and_sums() {
    let mut state = generating_step_two(4);
    let effects = state
        .step(Input::ModelDone(completion_with_usage(
            "all done",
            vec![],
            Some(usage(20, 3)),
        )))
        .unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                model_message("all done", "stop", 2, Some(token_usage(20, 3))),
                finished(TurnOutcome::Completed, "all done", 2, token_usage(30, 5)),
            ]
        )]
    );
    assert!(state.is_idle());
}

#[test]
fn generate_model_done_at_the_last_allowed_step_still_completes() {
    // The step limit only stops a turn that wants to call the model again.
    let mut state = generating(1);
    let effects = state.step(model_done("short", vec![])).unwrap();
    assert_eq!(
        events_of(&effects).last(),
        Some(&finished(
            TurnOutcome::Completed,
            "short",
            1,
            token_usage(10, 2)
        ))
    );
    assert!(state.is_idle());
}

#[test]
fn generate_model_failed_fails_the_turn() {
    let mut state = generating(4);
    let effects = state
        .step(model_failed("connection refused", true))
        .unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                error(ErrorSource::Model, "connection refused", true),
                finished(
                    TurnOutcome::Failed,
                    "connection refused",
                    0,
                    TokenUsage::default()
                ),
            ]
        )]
    );
    assert_eq!(core(&state), idle(vec![Message::user("hello")], 4));

    // The session takes the next message.
    let effects = state.step(user_in(TURN2, "again")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(TURN2, vec![user_message("again")]),
            model_call(&state, vec![Message::user("hello"), Message::user("again")]),
        ]
    );
    assert_eq!(state.phase, Phase::Generate);
    assert_eq!(state.turn_id(), Some(TURN2));
}

#[test]
fn generate_model_failed_after_tools_reports_the_steps_so_far() {
    let mut state = generating_step_two(4);
    let effects = state.step(model_failed("bad gateway", false)).unwrap();
    assert_eq!(
        events_of(&effects),
        vec![
            error(ErrorSource::Model, "bad gateway", false),
            finished(TurnOutcome::Failed, "bad gateway", 1, token_usage(10, 2)),
        ]
    );
    assert_eq!(
        core(&state),
        idle(
            vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
                Message::tool("c1", "out1"),
                Message::tool("c2", "out2"),
            ],
            4
        )
    );
}

#[test]
fn generate_model_failure_does_not_count_as_a_restart() {
    let mut state = generating(4);
    state.apply(TURN, &error(ErrorSource::Model, "x", true));
    state.apply(TURN, &error(ErrorSource::Tool, "x", true));
    assert_eq!(core(&state), core(&generating(4)));
}

#[test]
fn generate_tool_output_is_refused() {
    let unexpected = Refusal::Unexpected {
        input: "tool output",
        phase: Phase::Generate,
    };
    for state in [generating(4), generating_step_two(4)] {
        assert_refused(
            &state,
            chunk("c1", OutputStream::Stdout, "late"),
            unexpected.clone(),
        );
        assert_refused(&state, done("c1", "late"), unexpected.clone());
        assert_refused(&state, done("c2", "late"), unexpected.clone());
    }
}

#[test]
fn generate_approval_is_refused() {
    // Also for the calls of the previous response, all answered.
    for state in [generating(4), generating_step_two(4)] {
        for id in ["c1", "c2", "ghost"] {
            assert_refused(
                &state,
                approve(id),
                Refusal::NoPendingApproval { call_id: id.into() },
            );
        }
    }
}

#[test]
fn generate_cancel_aborts_and_cancels_the_turn() {
    let mut state = generating(4);
    let effects = state.step(cancel("enough")).unwrap();
    assert_eq!(
        effects,
        vec![
            Effect::AbortInFlight,
            record(
                TURN,
                vec![
                    Kind::CancelRequested(pb::CancelRequested {
                        reason: "enough".into()
                    }),
                    finished(
                        TurnOutcome::Cancelled,
                        "cancelled",
                        0,
                        TokenUsage::default()
                    ),
                ]
            ),
        ]
    );
    assert_eq!(core(&state), idle(vec![Message::user("hello")], 4));
}

#[test]
fn generate_cancel_after_tools_reports_the_steps_so_far() {
    let mut state = generating_step_two(4);
    let effects = state.step(cancel("")).unwrap();
    // The calls of the previous response are all over: nothing to close.
    assert_eq!(
        effects,
        vec![
            Effect::AbortInFlight,
            record(
                TURN,
                vec![
                    Kind::CancelRequested(pb::CancelRequested::default()),
                    finished(TurnOutcome::Cancelled, "cancelled", 1, token_usage(10, 2)),
                ]
            ),
        ]
    );
    assert!(state.is_idle());
}

#[test]
fn generate_interrupted_asks_the_model_again() {
    let mut state = generating(4);
    let effects = state.step(Input::Interrupted).unwrap();
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![error(ErrorSource::Orchestrator, RESTARTED_GENERATING, true)]
            ),
            model_call(&state, vec![Message::user("hello")]),
        ]
    );
    assert_eq!(
        core(&state),
        state_with(
            Phase::Generate,
            Some(Turn {
                restarts: 1,
                ..turn(TURN, 0, TokenUsage::default(), vec![], 0, "")
            }),
            vec![Message::user("hello")],
            4
        )
    );
}
