//! Compaction.

use super::plan::{calls_model, complete_step, outcome_of, plan_user, submit_plan, tool_output};
use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// Compaction
// ---------------------------------------------------------------------------

fn compacted(messages: u32, first_seq: u64, last_seq: u64, summary: &str) -> Input {
    Input::Compacted(pb::ContextCompacted {
        first_seq,
        last_seq,
        summary: summary.into(),
        messages,
        tokens_before: 0,
        tokens_after: 0,
        note: String::new(),
    })
}

/// Two turns, the first with a tool call: history [user, assistant(call),
/// tool, assistant, user] and spans naming the events behind each.
fn two_turns_with_a_tool() -> Session {
    let mut session = Session::new(5);
    session.ok(user("first"));
    session.ok(model_done("", vec![bash("b1", "ls")]));
    session.ok(done("b1", "a b"));
    session.ok(model_done("listed", vec![]));
    session.ok(user_in(TURN2, "second"));
    session
}

#[test]
fn every_message_knows_the_events_behind_it() {
    let session = two_turns_with_a_tool();
    let seq_of = |pred: &dyn Fn(&Kind) -> bool| {
        session
            .log
            .iter()
            .find(|e| pred(e.kind.as_ref().unwrap()))
            .unwrap()
            .seq
    };
    let user1 = seq_of(&|k| matches!(k, Kind::UserMessage(m) if m.text == "first"));
    let call = seq_of(&|k| matches!(k, Kind::ModelMessage(m) if m.step == 1));
    let result = seq_of(&|k| matches!(k, Kind::ToolResult(_)));
    let answer = seq_of(&|k| matches!(k, Kind::ModelMessage(m) if m.text == "listed"));
    let user2 = seq_of(&|k| matches!(k, Kind::UserMessage(m) if m.text == "second"));
    let spans: Vec<(u64, u64)> = [user1, call, result, answer, user2]
        .iter()
        .map(|&s| (s, s))
        .collect();
    assert_eq!(session.state.history_spans, spans);
    assert_eq!(session.state.last_seq, session.log.len() as u64);
}

#[test]
fn a_compaction_replaces_a_prefix_with_its_summary() {
    let mut session = two_turns_with_a_tool();
    let spans = session.state.history_spans.clone();
    // Replace the first turn (user, call, result, answer).
    let effects = session.ok(compacted(
        4,
        spans[0].0,
        spans[3].1,
        "The person asked to list.",
    ));
    assert!(!calls_model(&effects), "the model call is already running");
    assert_eq!(session.state.history.len(), 2);
    let Message::System { content } = &session.state.history[0] else {
        panic!("{:?}", session.state.history[0])
    };
    assert!(content.ends_with("The person asked to list."), "{content}");
    assert_eq!(session.state.history[1], Message::user("second"));
    assert_eq!(
        session.state.history_spans,
        vec![(spans[0].0, spans[3].1), spans[4]]
    );
    // The turn goes on with the compacted history.
    let effects = session.ok(model_done("", vec![bash("b2", "pwd")]));
    assert_eq!(run_tools(&effects), vec![bash("b2", "pwd")]);
    let effects = session.ok(done("b2", "/w"));
    let Some(Effect::CallModel { history }) = effects.last() else {
        panic!("{effects:?}")
    };
    assert_eq!(history.len(), 4);
    // A second compaction replaces the summary and more.
    let spans = session.state.history_spans.clone();
    session.ok(compacted(
        2,
        spans[0].0,
        spans[1].1,
        "Listed, then asked again.",
    ));
    assert_eq!(session.state.history_spans[0], (spans[0].0, spans[1].1));
}

#[test]
fn compactions_that_do_not_fit_the_conversation_are_refused() {
    let mut session = two_turns_with_a_tool();
    let spans = session.state.history_spans.clone();
    let unexpected = |input| Refusal::Unexpected {
        input,
        phase: Phase::Generate,
    };
    let wrong = "compaction of another conversation";
    // It would separate the call from its result.
    session.refused(compacted(2, spans[0].0, spans[1].1, "x"), unexpected(wrong));
    // Not from the start of the conversation.
    session.refused(compacted(4, spans[1].0, spans[3].1, "x"), unexpected(wrong));
    // Not the range of the messages it names.
    session.refused(
        compacted(4, spans[0].0, spans[3].1 + 1, "x"),
        unexpected(wrong),
    );
    session.refused(compacted(3, spans[0].0, spans[3].1, "x"), unexpected(wrong));
    // Nothing would be left.
    session.refused(compacted(5, spans[0].0, spans[4].1, "x"), unexpected(wrong));
    session.refused(compacted(0, spans[0].0, spans[0].1, "x"), unexpected(wrong));
    // Only before a model call.
    session.ok(model_done("bye", vec![]));
    session.refused(
        compacted(4, spans[0].0, spans[3].1, "x"),
        Refusal::Unexpected {
            input: "compaction",
            phase: Phase::Idle,
        },
    );
}

/// Results are kept in call order even when a later call is answered
/// first: a compaction names the latest event of the messages it replaces.
#[test]
fn a_compaction_covers_results_recorded_out_of_order() {
    let mut session = Session::new(5);
    session.ok(plan_user("work"));
    session.ok(model_done("", vec![submit_plan("p1", &["one", "two"])]));
    // complete_step is answered at once; bash's result comes later but
    // sits before it.
    session.ok(model_done(
        "",
        vec![
            bash("b1", "ls"),
            complete_step("c1", "completed", "one done"),
        ],
    ));
    session.ok(done("b1", "a b"));
    let spans = session.state.history_spans.clone();
    // [user, assistant(plan), plan result, assistant(b1, c1), b1 result, c1 result]
    assert_eq!(spans.len(), 6);
    assert!(spans[4].0 > spans[5].0, "{spans:?}");
    session.ok(model_done("", vec![bash("b2", "pwd")]));
    session.ok(done("b2", "/w"));
    // Replace the first six messages: the range ends at b1's result.
    let last = spans.iter().map(|s| s.1).max().unwrap();
    assert_eq!(last, spans[4].1);
    session.refused(
        compacted(6, spans[0].0, spans[5].1, "x"),
        Refusal::Unexpected {
            input: "compaction of another conversation",
            phase: Phase::Generate,
        },
    );
    session.ok(compacted(6, spans[0].0, last, "Planned; step one done."));
    assert_eq!(session.state.history.len(), 3);
    assert_eq!(session.state.history_spans[0], (spans[0].0, last));
}

#[test]
fn giving_up_on_a_repair_fails_the_turn() {
    let mut session = Session::new(5);
    session.ok(plan_user("work"));
    session.ok(model_done("", vec![submit_plan("p1", &["one"])]));
    session.ok(model_done(
        "",
        vec![complete_step("c1", "failed", "no network")],
    ));
    let effects = session.ok(model_done("I cannot do this without a network.", vec![]));
    let finished = outcome_of(&effects).unwrap();
    assert_eq!(finished.outcome, TurnOutcome::Failed as i32);
    assert_eq!(finished.message, "I cannot do this without a network.");
    let error = events_of(&effects)
        .into_iter()
        .find_map(|k| match k {
            Kind::Error(e) => Some(e),
            _ => None,
        })
        .unwrap();
    assert!(error.message.contains("no network"), "{}", error.message);
}

#[test]
fn complete_step_errors_say_what_to_do_instead() {
    let mut session = Session::new(8);
    session.ok(plan_user("work"));
    session.ok(model_done("", vec![submit_plan("p1", &["one", "two"])]));
    // Two ends of the same step in one response.
    let effects = session.ok(model_done(
        "",
        vec![
            complete_step("c1", "completed", ""),
            complete_step("c2", "completed", ""),
        ],
    ));
    assert_eq!(
        tool_output(&effects, "c2"),
        "error: step 1 was already ended in this response; step 2 starts next"
    );
    session.ok(model_done("", vec![complete_step("c3", "completed", "")]));
    // Every step done: the final answer is wanted, not another step.
    let effects = session.ok(model_done("", vec![complete_step("c4", "completed", "")]));
    assert!(
        tool_output(&effects, "c4").contains("write the final answer"),
        "{effects:?}"
    );
    let effects = session.ok(model_done("Both done.", vec![]));
    assert_eq!(
        outcome_of(&effects).unwrap().outcome,
        TurnOutcome::Completed as i32
    );
}

#[test]
fn an_answer_instead_of_a_plan_is_asked_for_a_plan_once() {
    let mut session = Session::new(5);
    session.ok(plan_user("work"));
    let effects = session.ok(model_done("1. look 2. fix", vec![]));
    assert!(calls_model(&effects), "asked once more");
    assert!(outcome_of(&effects).is_none());
    let guidance = session.state.plan_guidance().unwrap();
    assert!(guidance.contains("did not submit a plan"), "{guidance}");
    // It plans now: the nudge is gone.
    session.ok(model_done("", vec![submit_plan("p1", &["look"])]));
    assert!(
        !session
            .state
            .plan_guidance()
            .unwrap()
            .contains("did not submit")
    );

    // A model that answers twice has its answer taken.
    let mut session = Session::new(5);
    session.ok(plan_user("what is 2+2?"));
    session.ok(model_done("4", vec![]));
    let effects = session.ok(model_done("4", vec![]));
    let finished = outcome_of(&effects).unwrap();
    assert_eq!(finished.outcome, TurnOutcome::Completed as i32);
    assert_eq!(finished.message, "4");
}
