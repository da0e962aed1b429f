//! The step limit and the history the model sees.

use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// Step limit
// ---------------------------------------------------------------------------

#[test]
fn step_limit_of_one_stops_after_the_first_tools() {
    let mut state = using_tools(1);
    assert_eq!(
        state.step(done("c1", "out1")),
        Ok(vec![
            record(
                TURN,
                concat(vec![success("c1", "out1"), vec![executing("c2")]])
            ),
            ran_unflagged(c2()),
        ])
    );
    let effects = state.step(done("c2", "out2")).unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            concat(vec![
                success("c2", "out2"),
                vec![finished(
                    TurnOutcome::StepLimit,
                    &step_limit_message(1),
                    1,
                    token_usage(10, 2)
                )],
            ])
        )]
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
            1
        )
    );
    // The person may continue with a new turn.
    let effects = state.step(user_in(TURN2, "go on")).unwrap();
    assert!(matches!(effects.last(), Some(Effect::CallModel { .. })));
}

#[test]
fn step_limit_also_stops_when_every_call_was_refused() {
    let mut state = generating(1);
    let bad = call("c1", "shell", "nope");
    let effects = state.step(model_done("", vec![bad])).unwrap();
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(
        events_of(&effects).last(),
        Some(&finished(
            TurnOutcome::StepLimit,
            &step_limit_message(1),
            1,
            token_usage(10, 2)
        ))
    );
    assert!(state.is_idle());
}

#[test]
fn step_limit_of_two_stops_after_the_second_tools_with_summed_usage() {
    let mut state = generating(2);
    let effects = state
        .step(Input::ModelDone(completion_with_usage(
            "first",
            vec![c1()],
            Some(usage(10, 2)),
        )))
        .unwrap();
    assert_eq!(effects.last(), Some(&ran(c1())));
    let effects = state.step(done("c1", "out1")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(TURN, success("c1", "out1")),
            model_call(
                &state,
                vec![
                    Message::user("hello"),
                    assistant("first", vec![c1()]),
                    Message::tool("c1", "out1"),
                ]
            ),
        ]
    );
    let effects = state
        .step(Input::ModelDone(completion_with_usage(
            "second",
            vec![c2()],
            Some(usage(20, 3)),
        )))
        .unwrap();
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    model_message("second", "tool_calls", 2, Some(token_usage(20, 3))),
                    requested(&c2()),
                    allowed("c2"),
                    executing("c2"),
                ]
            ),
            ran_unflagged(c2()),
        ]
    );
    let effects = state.step(done("c2", "out2")).unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            concat(vec![
                success("c2", "out2"),
                vec![finished(
                    TurnOutcome::StepLimit,
                    &step_limit_message(2),
                    2,
                    token_usage(30, 5)
                )],
            ])
        )]
    );
    assert_eq!(
        core(&state),
        idle(
            vec![
                Message::user("hello"),
                assistant("first", vec![c1()]),
                Message::tool("c1", "out1"),
                assistant("second", vec![c2()]),
                Message::tool("c2", "out2"),
            ],
            2
        )
    );
}

#[test]
fn step_limit_counts_per_turn() {
    // A new turn starts from zero steps.
    let mut state = using_tools(1);
    state.step(done("c1", "out1")).unwrap();
    state.step(done("c2", "out2")).unwrap();
    assert!(state.is_idle());
    state.step(user_in(TURN2, "go on")).unwrap();
    assert_eq!(
        state.turn,
        Some(turn(TURN2, 0, TokenUsage::default(), vec![], 0, ""))
    );
    let effects = state.step(model_done("fine", vec![])).unwrap();
    assert_eq!(
        events_of(&effects),
        vec![
            model_message("fine", "stop", 1, Some(token_usage(10, 2))),
            finished(TurnOutcome::Completed, "fine", 1, token_usage(10, 2)),
        ]
    );
}

// ---------------------------------------------------------------------------
// History projection
// ---------------------------------------------------------------------------

#[test]
fn history_after_a_full_turn_with_tools() {
    let mut session = Session::new(4);
    session.ok(user("list and read"));
    session.ok(model_done("let me look", two_calls()));
    session.ok(chunk("c1", OutputStream::Stdout, "a.txt\n"));
    session.ok(done("c1", "a.txt\n"));
    session.ok(chunk("c2", OutputStream::Stdout, "hi"));
    session.ok(done("c2", "hi"));
    let effects = session.ok(Input::ModelDone(completion_with_usage(
        "a.txt says hi",
        vec![],
        Some(usage(30, 4)),
    )));
    assert_eq!(
        events_of(&effects).last(),
        Some(&finished(
            TurnOutcome::Completed,
            "a.txt says hi",
            2,
            token_usage(40, 6)
        ))
    );
    assert_eq!(
        session.state.history,
        vec![
            Message::User {
                content: "list and read".into(),
                images: Vec::new(),
            },
            Message::Assistant {
                content: "let me look".into(),
                tool_calls: two_calls(),
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: "a.txt\n".into(),
            },
            Message::Tool {
                tool_call_id: "c2".into(),
                content: "hi".into(),
            },
            Message::Assistant {
                content: "a.txt says hi".into(),
                tool_calls: vec![],
            },
        ]
    );
    assert_eq!(session.state.phase, Phase::Idle);
    assert_eq!(session.state.turn, None);
}

#[test]
fn turn_tracks_the_last_response() {
    let mut state = using_tools(4);
    assert_eq!(state.turn.as_ref().unwrap().last_text, "let me look");
    assert_eq!(state.turn.as_ref().unwrap().assistant_index, 1);
    state.step(done("c1", "out1")).unwrap();
    state.step(done("c2", "out2")).unwrap();
    state
        .step(model_done("again", vec![call("c3", "shell", "{}")]))
        .unwrap();
    let t = state.turn.as_ref().unwrap();
    assert_eq!(t.last_text, "again");
    assert_eq!(t.steps, 2);
    assert_eq!(t.usage, token_usage(20, 4));
    assert_eq!(t.assistant_index, 4);
    // Only the calls of the latest response.
    assert_eq!(
        t.calls,
        vec![call_in(
            &call("c3", "shell", "{}"),
            CallPhase::Executing,
            false
        )]
    );
}
