//! The idle phase.

use super::*;
use pretty_assertions::assert_eq;

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
            model_call(&state, vec![Message::user("hello")]),
        ]
    );
    assert_eq!(
        core(&state),
        state_with(
            Phase::Generate,
            Some(turn(TURN, 0, TokenUsage::default(), vec![], 0, "")),
            vec![Message::user("hello")],
            4
        )
    );
    assert!(!state.is_idle());
    assert_eq!(state.turn_id(), Some(TURN));
}

#[test]
fn idle_user_message_records_the_approval_mode() {
    for mode in [
        ApprovalMode::Unspecified,
        ApprovalMode::Policy,
        ApprovalMode::Always,
        ApprovalMode::Never,
    ] {
        let mut session = Session::new(4);
        let effects = session.ok(user_with(TURN, "hello", mode));
        assert_eq!(
            events_of(&effects),
            vec![user_message_with("hello", mode)],
            "{mode:?}"
        );
        assert_eq!(
            session.state.turn,
            Some(Turn {
                approval_mode: mode,
                ..turn(TURN, 0, TokenUsage::default(), vec![], 0, "")
            })
        );
    }
}

#[test]
fn replay_of_an_unknown_approval_mode_uses_the_policy() {
    let events = [pb::Event {
        turn_id: TURN.into(),
        kind: Some(Kind::UserMessage(pb::UserMessage {
            images: Vec::new(),
            text: "hi".into(),
            approval_mode: 99,
            plan: false,
            network: false,
            budget: None,
            compact: false,
        })),
        ..Default::default()
    }];
    let state = SessionState::replay(4, &events);
    assert_eq!(
        state.turn.map(|t| t.approval_mode),
        Some(ApprovalMode::Policy)
    );
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
            model_call(&state, history.clone()),
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
        assert_refused(
            &SessionState::new(4),
            user_with(TURN, text, ApprovalMode::Never),
            Refusal::EmptyMessage,
        );
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
        assert_refused(&state, model_done("late", vec![]), unexpected.clone());
        assert_refused(&state, model_done("late", two_calls()), unexpected.clone());
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

#[test]
fn idle_approval_is_refused() {
    for state in [SessionState::new(4), idle_after_turn(4)] {
        for input in [
            approve("c1"),
            approve_for_session("c1"),
            deny("c1", "no"),
            edit("c1", "{}"),
            approval("c1", ApprovalDecision::Unspecified, "", ""),
        ] {
            assert_refused(
                &state,
                input,
                Refusal::NoPendingApproval {
                    call_id: "c1".into(),
                },
            );
        }
    }
}
