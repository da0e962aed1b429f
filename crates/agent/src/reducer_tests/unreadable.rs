//! A tool call written in the text that cannot be read: recorded, shown
//! back to the model once, a second one fails the turn; replay keeps it.

use super::*;
use pretty_assertions::assert_eq;

fn unreadable(text: &str, error: &str) -> Input {
    Input::ModelUnreadable {
        text: text.into(),
        error: error.into(),
        usage: Some(usage(10, 2)),
    }
}

fn unreadable_event(text: &str, error: &str, attempt: u32) -> Kind {
    Kind::ToolCallUnreadable(pb::ToolCallUnreadable {
        text: text.into(),
        error: error.into(),
        usage: Some(token_usage(10, 2)),
        attempt,
    })
}

/// The conversation so far, then the unreadable answer and the correction.
fn corrected(history: Vec<Message>, text: &str, error: &str) -> Vec<Message> {
    let mut history = history;
    crate::prompt::ask_to_rewrite(&mut history, text.into(), error);
    history
}

#[test]
fn an_unreadable_call_is_recorded_and_shown_back_once_and_its_tokens_count() {
    let mut session = Session::new(4);
    session.ok(user("hello"));
    let effects = session.ok(unreadable("TOOL:bash {oops", "not valid JSON"));
    let history = corrected(
        vec![Message::user("hello")],
        "TOOL:bash {oops",
        "not valid JSON",
    );
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![unreadable_event("TOOL:bash {oops", "not valid JSON", 1)]
            ),
            model_call(&session.state, history.clone()),
        ]
    );
    let Message::User { content, .. } = &history[2] else {
        panic!("{history:?}");
    };
    assert!(
        content.contains("could not be read: not valid JSON"),
        "{content}"
    );
    // The answer that follows is the step's; the correction is no part of
    // the conversation after it, and both answers' tokens count.
    let effects = session.ok(model_done("the answer", vec![]));
    assert_eq!(
        events_of(&effects).last(),
        Some(&finished(
            TurnOutcome::Completed,
            "the answer",
            1,
            token_usage(20, 4)
        ))
    );
    assert_eq!(
        core(&session.state),
        idle(
            vec![Message::user("hello"), Message::assistant("the answer")],
            4
        )
    );
    assert_eq!(session.state.spent_tokens, 24);
}

#[test]
fn a_second_unreadable_call_in_a_step_fails_the_turn_clearly() {
    let mut session = Session::new(4);
    session.ok(user("hello"));
    session.ok(unreadable(
        "TOOL:list_dir [1]",
        "arguments are not an object",
    ));
    let effects = session.ok(unreadable(
        "TOOL:nonexistent {}",
        "no tool named \"nonexistent\"",
    ));
    let message = "the model wrote a tool call that could not be read, even after being \
                   shown the format: no tool named \"nonexistent\"";
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                unreadable_event("TOOL:nonexistent {}", "no tool named \"nonexistent\"", 2),
                error(ErrorSource::Model, message, false),
                finished(TurnOutcome::Failed, message, 0, token_usage(20, 4)),
            ]
        )]
    );
    assert_eq!(session.state.phase, Phase::Idle);
    // The next turn starts clean: its first unreadable answer is shown back.
    session.ok(user_in(TURN2, "again"));
    let effects = session.ok(unreadable("TOOL:x", "no arguments"));
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::CallModel { .. })),
        "{effects:?}"
    );
}

#[test]
fn a_restart_after_an_unreadable_answer_asks_again_with_the_correction() {
    let mut live = Session::new(4);
    live.ok(user("hello"));
    let effects = live.ok(unreadable("TOOL:bash {oops", "not valid JSON"));
    let asked = effects
        .into_iter()
        .find(|e| matches!(e, Effect::CallModel { .. }))
        .expect("the model is asked again");
    // Crash while the model writes the call again.
    let mut session = live.restarted();
    assert_eq!(session.state, live.state);
    let effects = session.ok(Input::Interrupted);
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![error(ErrorSource::Orchestrator, RESTARTED_GENERATING, true)]
            ),
            asked,
        ]
    );
    // Still one correction per step: another unreadable answer fails.
    let effects = session.ok(unreadable("TOOL:bash {oops", "not valid JSON"));
    assert!(
        events_of(&effects)
            .iter()
            .any(|k| matches!(k, Kind::TurnFinished(f) if f.outcome == TurnOutcome::Failed as i32)),
        "{effects:?}"
    );
}

#[test]
fn an_unreadable_answer_in_a_wrong_phase_is_refused() {
    let state = SessionState::new(4);
    assert!(state.clone().step(unreadable("TOOL:x", "why")).is_err());
}
