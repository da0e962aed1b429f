#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Unit tests of the session reducer: every (phase, input) transition, the
//! events and effects it yields, the state it leaves, and the replay property
//! (the state is exactly the fold of the recorded events).

use crate::reducer::{Effect, Input, Phase, Refusal, SessionState, Turn};
use agentry_llm::{Completion, Message, ToolCall, Usage};
use agentry_proto::sessions::v1::{
    self as pb, ErrorSource, OutputStream, TokenUsage, TurnOutcome, event::Kind,
};
use pretty_assertions::assert_eq;
use std::collections::VecDeque;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const TURN: &str = "turn-1";
const TURN2: &str = "turn-2";
const MODEL: &str = "test-model";
const INTERRUPTED: &str = "the orchestrator stopped during this turn; its outcome is unknown";
const CANCELLED_OUTPUT: &str = "error: cancelled before it finished";
const INTERRUPTED_OUTPUT: &str =
    "error: the orchestrator stopped while this call was pending; it may or may not have run";

fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// The two calls most tests use: `c1` (shell) then `c2` (read_file).
fn two_calls() -> Vec<ToolCall> {
    vec![
        call("c1", "shell", r#"{"cmd":"ls"}"#),
        call("c2", "read_file", r#"{"path":"a.txt"}"#),
    ]
}

fn c1() -> ToolCall {
    two_calls()[0].clone()
}

fn c2() -> ToolCall {
    two_calls()[1].clone()
}

fn usage(prompt: u64, completion: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
    }
}

fn token_usage(prompt: u64, completion: u64) -> TokenUsage {
    TokenUsage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
    }
}

/// A model response using 10 prompt + 2 completion tokens.
fn completion(text: &str, calls: Vec<ToolCall>) -> Completion {
    completion_with_usage(text, calls, Some(usage(10, 2)))
}

fn completion_with_usage(text: &str, calls: Vec<ToolCall>, usage: Option<Usage>) -> Completion {
    let finish_reason = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    Completion {
        text: text.into(),
        tool_calls: calls,
        finish_reason: finish_reason.into(),
        usage,
        model: MODEL.into(),
    }
}

fn tool_result(call_id: &str, output: &str) -> pb::ToolResult {
    pb::ToolResult {
        call_id: call_id.into(),
        tool: "shell".into(),
        output: output.into(),
        is_error: false,
        exit_code: Some(0),
        duration_ms: 12,
        runner_id: "runner-1".into(),
    }
}

fn done(call_id: &str, output: &str) -> Input {
    Input::ToolDone(tool_result(call_id, output))
}

fn user(text: &str) -> Input {
    user_in(TURN, text)
}

fn user_in(turn_id: &str, text: &str) -> Input {
    Input::UserMessage {
        turn_id: turn_id.into(),
        text: text.into(),
    }
}

fn cancel(reason: &str) -> Input {
    Input::Cancel {
        reason: reason.into(),
    }
}

fn model_failed(message: &str, retryable: bool) -> Input {
    Input::ModelFailed {
        message: message.into(),
        retryable,
    }
}

fn chunk(call_id: &str, stream: OutputStream, text: &str) -> Input {
    Input::ToolChunk {
        call_id: call_id.into(),
        stream,
        text: text.into(),
    }
}

/// All events of the Record effects, in order.
fn events_of(effects: &[Effect]) -> Vec<Kind> {
    effects
        .iter()
        .flat_map(|e| match e {
            Effect::Record { events, .. } => events.clone(),
            _ => Vec::new(),
        })
        .collect()
}

fn record(turn_id: &str, events: Vec<Kind>) -> Effect {
    Effect::Record {
        turn_id: turn_id.into(),
        events,
    }
}

fn user_message(text: &str) -> Kind {
    Kind::UserMessage(pb::UserMessage { text: text.into() })
}

fn model_message(text: &str, finish_reason: &str, step: u32, usage: Option<TokenUsage>) -> Kind {
    Kind::ModelMessage(pb::ModelMessage {
        text: text.into(),
        finish_reason: finish_reason.into(),
        usage,
        model: MODEL.into(),
        step,
    })
}

fn requested(call: &ToolCall) -> Kind {
    Kind::ToolCallRequested(pb::ToolCallRequested {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        arguments_json: call.arguments.clone(),
    })
}

fn result_event(call_id: &str, output: &str) -> Kind {
    Kind::ToolResult(tool_result(call_id, output))
}

/// The error result the reducer writes for a call it gives up on.
fn closed_result(call: &ToolCall, output: &str) -> Kind {
    Kind::ToolResult(pb::ToolResult {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        output: output.into(),
        is_error: true,
        ..Default::default()
    })
}

fn finished(outcome: TurnOutcome, message: &str, steps: u32, usage: TokenUsage) -> Kind {
    Kind::TurnFinished(pb::TurnFinished {
        outcome: outcome as i32,
        message: message.into(),
        steps,
        usage: Some(usage),
    })
}

fn error(source: ErrorSource, message: &str, retryable: bool) -> Kind {
    Kind::Error(pb::Error {
        source: source as i32,
        message: message.into(),
        retryable,
    })
}

fn step_limit_message(steps: u32) -> String {
    format!("stopped after {steps} model calls (the step limit); send a message to continue")
}

fn assistant(content: &str, tool_calls: Vec<ToolCall>) -> Message {
    Message::Assistant {
        content: content.into(),
        tool_calls,
    }
}

fn turn(id: &str, steps: u32, usage: TokenUsage, pending: Vec<ToolCall>, last_text: &str) -> Turn {
    Turn {
        id: id.into(),
        steps,
        usage,
        pending: pending.into(),
        last_text: last_text.into(),
    }
}

fn idle(history: Vec<Message>, max_steps: u32) -> SessionState {
    SessionState {
        phase: Phase::Idle,
        turn: None,
        history,
        max_steps,
    }
}

/// A session that has just started turn `TURN` with "hello" (phase Generate).
fn generating(max_steps: u32) -> SessionState {
    let mut state = SessionState::new(max_steps);
    state.step(user("hello")).unwrap();
    state
}

/// A session whose first response asked for [`two_calls`] (phase UseTools,
/// both pending).
fn using_tools(max_steps: u32) -> SessionState {
    let mut state = generating(max_steps);
    state
        .step(Input::ModelDone(completion("let me look", two_calls())))
        .unwrap();
    state
}

/// A session back in Generate after both tool calls of step 1 answered.
fn generating_step_two(max_steps: u32) -> SessionState {
    let mut state = using_tools(max_steps);
    state.step(done("c1", "out1")).unwrap();
    state.step(done("c2", "out2")).unwrap();
    state
}

/// A session whose first turn completed ("the answer").
fn idle_after_turn(max_steps: u32) -> SessionState {
    let mut state = generating(max_steps);
    state
        .step(Input::ModelDone(completion("the answer", vec![])))
        .unwrap();
    state
}

/// Steps `input` and checks it is refused with `refusal`, leaving the whole
/// state unchanged.
fn assert_refused(state: &SessionState, input: Input, refusal: Refusal) {
    let mut after = state.clone();
    let what = format!("{input:?}");
    assert_eq!(after.step(input), Err(refusal), "input {what}");
    assert_eq!(&after, state, "a refused {what} changed the state");
}

/// A session together with the log its Record effects wrote; every step
/// checks that replaying the log rebuilds the live state, and that a refused
/// input changed nothing.
struct Session {
    state: SessionState,
    log: Vec<pb::Event>,
    max_steps: u32,
}

impl Session {
    fn new(max_steps: u32) -> Self {
        Session {
            state: SessionState::new(max_steps),
            log: Vec::new(),
            max_steps,
        }
    }

    fn step(&mut self, input: Input) -> Result<Vec<Effect>, Refusal> {
        let before = self.state.clone();
        let what = format!("{input:?}");
        let result = self.state.step(input);
        match &result {
            Ok(effects) => {
                for effect in effects {
                    if let Effect::Record { turn_id, events } = effect {
                        for kind in events {
                            self.log.push(pb::Event {
                                session_id: "session-1".into(),
                                seq: self.log.len() as u64 + 1,
                                turn_id: turn_id.clone(),
                                time: None,
                                kind: Some(kind.clone()),
                            });
                        }
                    }
                }
            }
            Err(_) => assert_eq!(self.state, before, "refused {what} changed the state"),
        }
        assert_eq!(
            SessionState::replay(self.max_steps, &self.log),
            self.state,
            "replaying the log after {what} differs from the live state"
        );
        result
    }

    fn ok(&mut self, input: Input) -> Vec<Effect> {
        let what = format!("{input:?}");
        self.step(input)
            .unwrap_or_else(|r| panic!("{what} refused: {r}"))
    }
}

// ---------------------------------------------------------------------------
// Construction and replay basics
// ---------------------------------------------------------------------------

#[test]
fn new_session_is_idle_and_empty() {
    let state = SessionState::new(3);
    assert_eq!(state, idle(vec![], 3));
    assert!(state.is_idle());
    assert_eq!(state.turn_id(), None);
}

#[test]
fn max_steps_is_at_least_one() {
    assert_eq!(SessionState::new(0).max_steps, 1);
    assert_eq!(SessionState::replay(0, &[]).max_steps, 1);
    assert_eq!(SessionState::replay(0, &[]), SessionState::new(0));
}

#[test]
fn replay_of_no_events_is_a_new_session() {
    assert_eq!(SessionState::replay(5, &[]), SessionState::new(5));
}

#[test]
fn replay_skips_events_without_a_kind() {
    let events = vec![
        pb::Event {
            turn_id: TURN.into(),
            kind: None,
            ..Default::default()
        },
        pb::Event {
            turn_id: TURN.into(),
            kind: Some(user_message("hi")),
            ..Default::default()
        },
        pb::Event::default(),
    ];
    let mut expected = SessionState::new(2);
    expected.step(user("hi")).unwrap();
    assert_eq!(SessionState::replay(2, &events), expected);
}

#[test]
fn refusals_read_well() {
    assert_eq!(
        Refusal::Unexpected {
            input: "tool output",
            phase: Phase::Idle,
        }
        .to_string(),
        "unexpected tool output while the session is Idle"
    );
    assert_eq!(Refusal::EmptyMessage.to_string(), "the message is empty");
    assert_eq!(
        Refusal::NothingToCancel.to_string(),
        "no turn is running in this session"
    );
}

// ---------------------------------------------------------------------------
// Idle
// ---------------------------------------------------------------------------

#[test]
fn idle_user_message_records_it_and_calls_the_model() {
    let mut state = SessionState::new(4);
    let effects = state.step(user("hello")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(TURN, vec![user_message("hello")]),
            Effect::CallModel {
                history: vec![Message::user("hello")],
            },
        ]
    );
    assert_eq!(
        state,
        SessionState {
            phase: Phase::Generate,
            turn: Some(turn(TURN, 0, TokenUsage::default(), vec![], "")),
            history: vec![Message::user("hello")],
            max_steps: 4,
        }
    );
    assert!(!state.is_idle());
    assert_eq!(state.turn_id(), Some(TURN));
}

#[test]
fn idle_user_message_keeps_the_text_as_sent() {
    let mut state = SessionState::new(4);
    let effects = state.step(user("  spaced out \n")).unwrap();
    assert_eq!(events_of(&effects), vec![user_message("  spaced out \n")]);
    assert_eq!(state.history, vec![Message::user("  spaced out \n")]);
}

#[test]
fn idle_user_message_after_a_turn_sends_the_whole_conversation() {
    let mut state = idle_after_turn(4);
    let effects = state.step(user_in(TURN2, "and then?")).unwrap();
    let history = vec![
        Message::user("hello"),
        Message::assistant("the answer"),
        Message::user("and then?"),
    ];
    assert_eq!(
        effects,
        vec![
            record(TURN2, vec![user_message("and then?")]),
            Effect::CallModel {
                history: history.clone(),
            },
        ]
    );
    assert_eq!(state.turn_id(), Some(TURN2));
    assert_eq!(state.history, history);
}

#[test]
fn idle_empty_or_blank_message_is_refused() {
    for text in ["", " ", "   ", "\n\t \r\n"] {
        assert_refused(&SessionState::new(4), user(text), Refusal::EmptyMessage);
        assert_refused(&idle_after_turn(4), user(text), Refusal::EmptyMessage);
    }
}

#[test]
fn idle_cancel_is_refused() {
    assert_refused(
        &SessionState::new(4),
        cancel("stop"),
        Refusal::NothingToCancel,
    );
    assert_refused(&idle_after_turn(4), cancel(""), Refusal::NothingToCancel);
}

#[test]
fn idle_interrupted_does_nothing() {
    for state in [SessionState::new(4), idle_after_turn(4)] {
        let mut after = state.clone();
        assert_eq!(after.step(Input::Interrupted), Ok(vec![]));
        assert_eq!(after, state);
    }
}

#[test]
fn idle_model_output_is_refused() {
    let unexpected = Refusal::Unexpected {
        input: "model output",
        phase: Phase::Idle,
    };
    for state in [SessionState::new(4), idle_after_turn(4)] {
        assert_refused(&state, Input::ModelDelta("x".into()), unexpected.clone());
        assert_refused(
            &state,
            Input::ModelDone(completion("late", vec![])),
            unexpected.clone(),
        );
        assert_refused(
            &state,
            Input::ModelDone(completion("late", two_calls())),
            unexpected.clone(),
        );
        assert_refused(&state, model_failed("late", true), unexpected.clone());
    }
}

#[test]
fn idle_tool_output_is_refused() {
    let unexpected = Refusal::Unexpected {
        input: "tool output",
        phase: Phase::Idle,
    };
    for state in [SessionState::new(4), idle_after_turn(4)] {
        assert_refused(
            &state,
            chunk("c1", OutputStream::Stdout, "late"),
            unexpected.clone(),
        );
        assert_refused(&state, done("c1", "late"), unexpected.clone());
    }
}

// ---------------------------------------------------------------------------
// Generate
// ---------------------------------------------------------------------------

#[test]
fn generate_user_message_is_busy() {
    assert_refused(&generating(4), user_in(TURN2, "hey"), Refusal::Busy);
    assert_refused(
        &generating_step_two(4),
        user_in(TURN2, "hey"),
        Refusal::Busy,
    );
}

#[test]
fn generate_model_delta_is_recorded_and_changes_nothing_else() {
    let mut state = generating(4);
    let before = state.clone();
    assert_eq!(
        state.step(Input::ModelDelta("Hel".into())),
        Ok(vec![record(
            TURN,
            vec![Kind::ModelTextDelta(pb::ModelTextDelta {
                text: "Hel".into()
            })]
        )])
    );
    assert_eq!(
        state.step(Input::ModelDelta("lo".into())),
        Ok(vec![record(
            TURN,
            vec![Kind::ModelTextDelta(pb::ModelTextDelta {
                text: "lo".into()
            })]
        )])
    );
    assert_eq!(state, before);
}

#[test]
fn generate_model_done_without_tool_calls_completes_the_turn() {
    let mut state = generating(4);
    let effects = state
        .step(Input::ModelDone(completion("the answer", vec![])))
        .unwrap();
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![model_message(
                    "the answer",
                    "stop",
                    1,
                    Some(token_usage(10, 2))
                )]
            ),
            record(
                TURN,
                vec![finished(
                    TurnOutcome::Completed,
                    "the answer",
                    1,
                    token_usage(10, 2)
                )]
            ),
        ]
    );
    assert_eq!(
        state,
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
            model_message("ok", "stop", 1, None),
            finished(TurnOutcome::Completed, "ok", 1, TokenUsage::default()),
        ]
    );
}

#[test]
fn generate_model_done_with_two_tool_calls_runs_the_first() {
    let mut state = generating(4);
    let effects = state
        .step(Input::ModelDone(completion("let me look", two_calls())))
        .unwrap();
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    model_message("let me look", "tool_calls", 1, Some(token_usage(10, 2))),
                    requested(&c1()),
                    requested(&c2()),
                ]
            ),
            Effect::RunTool(c1()),
        ]
    );
    assert_eq!(
        state,
        SessionState {
            phase: Phase::UseTools,
            turn: Some(turn(
                TURN,
                1,
                token_usage(10, 2),
                two_calls(),
                "let me look"
            )),
            history: vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
            ],
            max_steps: 4,
        }
    );
}

#[test]
fn generate_model_done_with_only_tool_calls_has_empty_assistant_text() {
    let mut state = generating(4);
    let effects = state
        .step(Input::ModelDone(completion("", vec![c1()])))
        .unwrap();
    assert_eq!(effects.last(), Some(&Effect::RunTool(c1())));
    assert_eq!(state.history.last(), Some(&assistant("", vec![c1()])));
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
        vec![
            record(
                TURN,
                vec![model_message(
                    "all done",
                    "stop",
                    2,
                    Some(token_usage(20, 3))
                )]
            ),
            record(
                TURN,
                vec![finished(
                    TurnOutcome::Completed,
                    "all done",
                    2,
                    token_usage(30, 5)
                )]
            ),
        ]
    );
    assert!(state.is_idle());
}

#[test]
fn generate_model_done_at_the_last_allowed_step_still_completes() {
    // The step limit only stops a turn that wants to call the model again.
    let mut state = generating(1);
    let effects = state
        .step(Input::ModelDone(completion("short", vec![])))
        .unwrap();
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
    assert_eq!(state, idle(vec![Message::user("hello")], 4));

    // The session takes the next message.
    let effects = state.step(user_in(TURN2, "again")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(TURN2, vec![user_message("again")]),
            Effect::CallModel {
                history: vec![Message::user("hello"), Message::user("again")],
            },
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
        state,
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
    assert_eq!(state, idle(vec![Message::user("hello")], 4));
}

#[test]
fn generate_cancel_after_tools_reports_the_steps_so_far() {
    let mut state = generating_step_two(4);
    let effects = state.step(cancel("")).unwrap();
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
fn generate_interrupted_fails_the_turn() {
    let mut state = generating(4);
    let effects = state.step(Input::Interrupted).unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                error(ErrorSource::Orchestrator, INTERRUPTED, true),
                finished(TurnOutcome::Failed, INTERRUPTED, 0, TokenUsage::default()),
            ]
        )]
    );
    assert_eq!(state, idle(vec![Message::user("hello")], 4));
}

// ---------------------------------------------------------------------------
// UseTools
// ---------------------------------------------------------------------------

#[test]
fn use_tools_user_message_is_busy() {
    assert_refused(&using_tools(4), user_in(TURN2, "hey"), Refusal::Busy);
    let mut one_left = using_tools(4);
    one_left.step(done("c1", "out1")).unwrap();
    assert_refused(&one_left, user_in(TURN2, "hey"), Refusal::Busy);
}

#[test]
fn use_tools_model_output_is_refused() {
    let unexpected = Refusal::Unexpected {
        input: "model output",
        phase: Phase::UseTools,
    };
    let state = using_tools(4);
    assert_refused(&state, Input::ModelDelta("x".into()), unexpected.clone());
    assert_refused(
        &state,
        Input::ModelDone(completion("late", vec![])),
        unexpected.clone(),
    );
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
    assert_eq!(state, before);
}

#[test]
fn use_tools_first_result_runs_the_next_call() {
    let mut state = using_tools(4);
    let effects = state.step(done("c1", "out1")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(TURN, vec![result_event("c1", "out1")]),
            Effect::RunTool(c2()),
        ]
    );
    assert_eq!(
        state,
        SessionState {
            phase: Phase::UseTools,
            turn: Some(turn(TURN, 1, token_usage(10, 2), vec![c2()], "let me look")),
            history: vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
                Message::tool("c1", "out1"),
            ],
            max_steps: 4,
        }
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
            record(TURN, vec![result_event("c2", "out2")]),
            Effect::CallModel {
                history: history.clone(),
            },
        ]
    );
    assert_eq!(
        state,
        SessionState {
            phase: Phase::Generate,
            turn: Some(turn(TURN, 1, token_usage(10, 2), vec![], "let me look")),
            history,
            max_steps: 4,
        }
    );
}

#[test]
fn use_tools_error_result_is_passed_to_the_model() {
    let mut state = generating(4);
    state
        .step(Input::ModelDone(completion("", vec![c1()])))
        .unwrap();
    let failed = pb::ToolResult {
        is_error: true,
        exit_code: Some(2),
        ..tool_result("c1", "ls: cannot access 'x'")
    };
    let effects = state.step(Input::ToolDone(failed.clone())).unwrap();
    assert_eq!(
        effects,
        vec![
            record(TURN, vec![Kind::ToolResult(failed)]),
            Effect::CallModel {
                history: vec![
                    Message::user("hello"),
                    assistant("", vec![c1()]),
                    Message::tool("c1", "ls: cannot access 'x'"),
                ],
            },
        ]
    );
}

#[test]
fn use_tools_result_for_the_wrong_call_is_refused() {
    let unexpected = Refusal::Unexpected {
        input: "tool result",
        phase: Phase::UseTools,
    };
    let state = using_tools(4);
    // Out of order, unknown, and empty ids.
    assert_refused(&state, done("c2", "out2"), unexpected.clone());
    assert_refused(&state, done("nope", "?"), unexpected.clone());
    assert_refused(&state, done("", "?"), unexpected.clone());

    // A second result for an answered call.
    let mut one_left = state;
    one_left.step(done("c1", "out1")).unwrap();
    assert_refused(&one_left, done("c1", "again"), unexpected);
}

#[test]
fn use_tools_cancel_closes_every_pending_call() {
    let mut state = using_tools(4);
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
                    closed_result(&c1(), CANCELLED_OUTPUT),
                    closed_result(&c2(), CANCELLED_OUTPUT),
                    finished(TurnOutcome::Cancelled, "cancelled", 1, token_usage(10, 2)),
                ]
            ),
        ]
    );
    assert_eq!(
        state,
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
                vec![
                    Kind::CancelRequested(pb::CancelRequested::default()),
                    closed_result(&c2(), CANCELLED_OUTPUT),
                    finished(TurnOutcome::Cancelled, "cancelled", 1, token_usage(10, 2)),
                ]
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
fn use_tools_interrupted_fails_the_turn_and_closes_pending_calls() {
    let mut state = using_tools(4);
    let effects = state.step(Input::Interrupted).unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                error(ErrorSource::Orchestrator, INTERRUPTED, true),
                closed_result(&c1(), INTERRUPTED_OUTPUT),
                closed_result(&c2(), INTERRUPTED_OUTPUT),
                finished(TurnOutcome::Failed, INTERRUPTED, 1, token_usage(10, 2)),
            ]
        )]
    );
    assert_eq!(
        state,
        idle(
            vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
                Message::tool("c1", INTERRUPTED_OUTPUT),
                Message::tool("c2", INTERRUPTED_OUTPUT),
            ],
            4
        )
    );
}

#[test]
fn interrupted_closes_a_turn_rebuilt_from_the_log() {
    // What the actor does on start: replay a log that stops mid-turn, then
    // close the turn.
    let mut live = Session::new(4);
    live.ok(user("hello"));
    live.ok(Input::ModelDone(completion("let me look", two_calls())));
    live.ok(done("c1", "out1"));
    let mut state = SessionState::replay(4, &live.log);
    assert_eq!(state, live.state);
    assert_eq!(state.phase, Phase::UseTools);

    let effects = state.step(Input::Interrupted).unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                error(ErrorSource::Orchestrator, INTERRUPTED, true),
                closed_result(&c2(), INTERRUPTED_OUTPUT),
                finished(TurnOutcome::Failed, INTERRUPTED, 1, token_usage(10, 2)),
            ]
        )]
    );
    assert!(state.is_idle());
}

// ---------------------------------------------------------------------------
// Step limit
// ---------------------------------------------------------------------------

#[test]
fn step_limit_of_one_stops_after_the_first_tools() {
    let mut state = using_tools(1);
    assert_eq!(
        state.step(done("c1", "out1")),
        Ok(vec![
            record(TURN, vec![result_event("c1", "out1")]),
            Effect::RunTool(c2()),
        ])
    );
    let effects = state.step(done("c2", "out2")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(TURN, vec![result_event("c2", "out2")]),
            record(
                TURN,
                vec![finished(
                    TurnOutcome::StepLimit,
                    &step_limit_message(1),
                    1,
                    token_usage(10, 2)
                )]
            ),
        ]
    );
    assert_eq!(
        state,
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
fn step_limit_of_two_stops_after_the_second_tools_with_summed_usage() {
    let mut state = generating(2);
    let effects = state
        .step(Input::ModelDone(completion_with_usage(
            "first",
            vec![c1()],
            Some(usage(10, 2)),
        )))
        .unwrap();
    assert_eq!(effects.last(), Some(&Effect::RunTool(c1())));
    let effects = state.step(done("c1", "out1")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(TURN, vec![result_event("c1", "out1")]),
            Effect::CallModel {
                history: vec![
                    Message::user("hello"),
                    assistant("first", vec![c1()]),
                    Message::tool("c1", "out1"),
                ],
            },
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
                ]
            ),
            Effect::RunTool(c2()),
        ]
    );
    let effects = state.step(done("c2", "out2")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(TURN, vec![result_event("c2", "out2")]),
            record(
                TURN,
                vec![finished(
                    TurnOutcome::StepLimit,
                    &step_limit_message(2),
                    2,
                    token_usage(30, 5)
                )]
            ),
        ]
    );
    assert_eq!(
        state,
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
        Some(turn(TURN2, 0, TokenUsage::default(), vec![], ""))
    );
    let effects = state
        .step(Input::ModelDone(completion("fine", vec![])))
        .unwrap();
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
    session.ok(Input::ModelDelta("let me ".into()));
    session.ok(Input::ModelDelta("look".into()));
    session.ok(Input::ModelDone(completion("let me look", two_calls())));
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
fn turn_tracks_the_last_response_text() {
    let mut state = using_tools(4);
    assert_eq!(state.turn.as_ref().unwrap().last_text, "let me look");
    state.step(done("c1", "out1")).unwrap();
    state.step(done("c2", "out2")).unwrap();
    state
        .step(Input::ModelDone(completion(
            "again",
            vec![call("c3", "shell", "{}")],
        )))
        .unwrap();
    let t = state.turn.as_ref().unwrap();
    assert_eq!(t.last_text, "again");
    assert_eq!(t.steps, 2);
    assert_eq!(t.usage, token_usage(20, 4));
    assert_eq!(t.pending, VecDeque::from(vec![call("c3", "shell", "{}")]));
}

// ---------------------------------------------------------------------------
// Replay property
// ---------------------------------------------------------------------------

/// Runs `script` (input, whether it is accepted) through a [`Session`],
/// which checks after every step that replaying the log gives the live state.
fn run_script(max_steps: u32, script: Vec<(Input, bool)>) -> Session {
    let mut session = Session::new(max_steps);
    for (input, accepted) in script {
        let what = format!("{input:?}");
        assert_eq!(session.step(input).is_ok(), accepted, "{what}");
    }
    assert_eq!(
        SessionState::replay(max_steps, &session.log),
        session.state,
        "final replay"
    );
    session
}

#[test]
fn replay_matches_a_plain_turn() {
    let session = run_script(
        4,
        vec![
            (user("hi"), true),
            (Input::ModelDelta("he".into()), true),
            (Input::ModelDelta("llo".into()), true),
            (Input::ModelDone(completion("hello", vec![])), true),
        ],
    );
    assert_eq!(
        session.state,
        idle(vec![Message::user("hi"), Message::assistant("hello")], 4)
    );
    assert_eq!(session.log.len(), 5);
}

#[test]
fn replay_matches_two_turns_with_tools() {
    let session = run_script(
        4,
        vec![
            (user("hello"), true),
            (
                Input::ModelDone(completion("let me look", two_calls())),
                true,
            ),
            (chunk("c1", OutputStream::Stdout, "x"), true),
            (done("c1", "out1"), true),
            (done("c2", "out2"), true),
            (Input::ModelDone(completion("done", vec![])), true),
            (user_in(TURN2, "more"), true),
            (
                Input::ModelDone(completion("more calls", vec![call("c3", "shell", "{}")])),
                true,
            ),
            (done("c3", "out3"), true),
            (Input::ModelDone(completion("finished", vec![])), true),
        ],
    );
    let turn_ids: Vec<&str> = session.log.iter().map(|e| e.turn_id.as_str()).collect();
    assert_eq!(turn_ids.iter().filter(|t| **t == TURN).count(), 9);
    assert_eq!(turn_ids.iter().filter(|t| **t == TURN2).count(), 6);
    assert!(session.state.is_idle());
    assert_eq!(session.state.history.len(), 9);
}

#[test]
fn replay_matches_step_limits() {
    for max_steps in [1, 2, 3] {
        let mut script = vec![(user("loop"), true)];
        for i in 0..max_steps {
            let id = format!("c{i}");
            script.push((
                Input::ModelDone(completion("again", vec![call(&id, "shell", "{}")])),
                true,
            ));
            script.push((done(&id, "out"), true));
        }
        let session = run_script(max_steps, script);
        assert!(session.state.is_idle());
        assert_eq!(
            session.log.last().and_then(|e| e.kind.clone()),
            Some(finished(
                TurnOutcome::StepLimit,
                &step_limit_message(max_steps),
                max_steps,
                token_usage(10 * u64::from(max_steps), 2 * u64::from(max_steps))
            ))
        );
    }
}

#[test]
fn replay_matches_cancels_failures_and_interruptions() {
    run_script(
        4,
        vec![
            (user("one"), true),
            (Input::ModelDone(completion("tools", two_calls())), true),
            (cancel("stop"), true),
            (done("c1", "too late"), false),
            (user_in(TURN2, "two"), true),
            (Input::ModelDelta("par".into()), true),
            (cancel(""), true),
            (Input::ModelDone(completion("too late", vec![])), false),
            (user_in("turn-3", "three"), true),
            (model_failed("boom", false), true),
            (user_in("turn-4", "four"), true),
            (Input::ModelDone(completion("tools", two_calls())), true),
            (done("c1", "out1"), true),
            (Input::Interrupted, true),
            (Input::Interrupted, true),
            (cancel(""), false),
            (user_in("turn-5", "five"), true),
            (Input::Interrupted, true),
        ],
    );
}

#[test]
fn replay_matches_with_refused_inputs_interleaved() {
    run_script(
        2,
        vec![
            (user(""), false),
            (cancel(""), false),
            (done("c1", "x"), false),
            (Input::ModelDelta("x".into()), false),
            (user("go"), true),
            (user("again"), false),
            (done("c1", "x"), false),
            (chunk("c1", OutputStream::Stderr, "x"), false),
            (Input::ModelDone(completion("t", two_calls())), true),
            (Input::ModelDelta("x".into()), false),
            (model_failed("x", true), false),
            (done("c2", "x"), false),
            (done("c1", "x"), true),
            (done("c1", "x"), false),
            (done("c2", "x"), true),
            (Input::ModelDone(completion("end", vec![])), true),
            (Input::Interrupted, true),
        ],
    );
}

/// A small deterministic generator (no dependencies).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random input, biased towards inputs that fit the state.
fn random_input(rng: &mut Lcg, state: &SessionState, ids: &mut u32, turns: &mut u32) -> Input {
    let front = state
        .turn
        .as_ref()
        .and_then(|t| t.pending.front())
        .map(|c| c.id.clone());
    match rng.below(12) {
        0 | 1 => {
            *turns += 1;
            let text = if rng.below(5) == 0 { " " } else { "msg" };
            user_in(&format!("t{turns}"), text)
        }
        2 => Input::ModelDelta("d".into()),
        3 | 4 => {
            let calls = (0..rng.below(3))
                .map(|_| {
                    *ids += 1;
                    call(&format!("c{ids}"), "shell", "{}")
                })
                .collect();
            let used = (rng.below(3) > 0).then(|| usage(rng.below(50), rng.below(50)));
            Input::ModelDone(completion_with_usage("text", calls, used))
        }
        5 => model_failed("x", rng.below(2) == 0),
        6 => chunk(
            front.as_deref().unwrap_or("ghost"),
            OutputStream::Stdout,
            "o",
        ),
        7..=9 => {
            let id = match front {
                Some(id) if rng.below(6) > 0 => id,
                _ => "ghost".into(),
            };
            done(&id, "out")
        }
        10 => cancel("r"),
        _ => Input::Interrupted,
    }
}

/// Checks the invariants that hold between any two inputs.
fn check_invariants(state: &SessionState, effects: &[Effect]) {
    assert_eq!(state.phase == Phase::Idle, state.turn.is_none());
    if let Some(turn) = &state.turn {
        assert!(turn.steps <= state.max_steps);
        assert_eq!(
            state.phase == Phase::UseTools,
            !turn.pending.is_empty(),
            "pending calls exactly while using tools"
        );
    }
    for (i, effect) in effects.iter().enumerate() {
        match effect {
            Effect::AbortInFlight => assert_eq!(i, 0, "abort comes first"),
            Effect::CallModel { history } => {
                assert_eq!(state.phase, Phase::Generate);
                assert_eq!(history, &state.history);
            }
            Effect::RunTool(call) => {
                assert_eq!(
                    state.turn.as_ref().and_then(|t| t.pending.front()),
                    Some(call)
                );
            }
            Effect::Record { turn_id, events } => {
                assert!(!turn_id.is_empty());
                if events.iter().any(|k| matches!(k, Kind::TurnFinished(_))) {
                    assert!(state.is_idle());
                }
            }
        }
    }
    if state.is_idle() {
        // Every tool call of the conversation has exactly one answer, after it.
        for (i, message) in state.history.iter().enumerate() {
            if let Message::Assistant { tool_calls, .. } = message {
                for call in tool_calls {
                    let answers = state.history[i..]
                        .iter()
                        .filter(|m| matches!(m, Message::Tool { tool_call_id, .. } if *tool_call_id == call.id))
                        .count();
                    assert_eq!(answers, 1, "answers to {}", call.id);
                }
            }
        }
    }
}

#[test]
fn random_inputs_keep_invariants_and_replay() {
    // How often each turn outcome occurred, and how many tool results were
    // accepted, so the test proves it reaches every ending.
    let mut outcomes = [0u32; 5];
    let mut tool_results = 0;
    for seed in 0..40 {
        let max_steps = (seed % 4 + 1) as u32;
        let mut rng = Lcg(seed);
        let mut session = Session::new(max_steps);
        let (mut ids, mut turns) = (0, 0);
        for _ in 0..300 {
            let input = random_input(&mut rng, &session.state, &mut ids, &mut turns);
            // `Session::step` checks replay and that refusals change nothing.
            if let Ok(effects) = session.step(input) {
                check_invariants(&session.state, &effects);
                for kind in events_of(&effects) {
                    match kind {
                        Kind::TurnFinished(f) => outcomes[f.outcome as usize] += 1,
                        Kind::ToolResult(r) if !r.is_error => tool_results += 1,
                        _ => {}
                    }
                }
            }
        }
    }
    for outcome in [
        TurnOutcome::Completed,
        TurnOutcome::Cancelled,
        TurnOutcome::Failed,
        TurnOutcome::StepLimit,
    ] {
        assert!(
            outcomes[outcome as usize] >= 10,
            "{outcome:?} reached only {} times",
            outcomes[outcome as usize]
        );
    }
    assert!(tool_results >= 100, "only {tool_results} tool results");
}

// ---------------------------------------------------------------------------
// Repeated call ids
// ---------------------------------------------------------------------------

/// A response may repeat a call id; each call still runs and gets an answer.
#[test]
fn repeated_call_ids_in_one_response_each_run() {
    let first = call("dup", "shell", r#"{"cmd":"a"}"#);
    let second = call("dup", "shell", r#"{"cmd":"b"}"#);
    let mut state = generating(4);
    state
        .step(Input::ModelDone(completion(
            "",
            vec![first.clone(), second.clone()],
        )))
        .unwrap();
    assert_eq!(
        state.step(done("dup", "a")),
        Ok(vec![
            record(TURN, vec![result_event("dup", "a")]),
            Effect::RunTool(second),
        ])
    );
    assert_eq!(state.phase, Phase::UseTools);
    let effects = state.step(done("dup", "b")).unwrap();
    assert_eq!(
        effects.last(),
        Some(&Effect::CallModel {
            history: state.history.clone()
        })
    );
    assert_eq!(
        state.history,
        vec![
            Message::user("hello"),
            assistant("", vec![first, call("dup", "shell", r#"{"cmd":"b"}"#)]),
            Message::tool("dup", "a"),
            Message::tool("dup", "b"),
        ]
    );
}
