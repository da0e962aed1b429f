//! Compaction.

use super::plan::{calls_model, complete_step, outcome_of, plan_user, submit_plan, tool_output};
use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// Compaction
// ---------------------------------------------------------------------------

/// The error event among `effects`.
fn error_of(effects: &[Effect]) -> pb::Error {
    events_of(effects)
        .into_iter()
        .find_map(|k| match k {
            Kind::Error(e) => Some(e),
            _ => None,
        })
        .expect("an error event")
}

/// The summary of the first `messages` messages (events `first_seq` to
/// `last_seq`) came back.
fn compacted(messages: u32, first_seq: u64, last_seq: u64, summary: &str) -> Input {
    Input::Summarised {
        job: CompactionJob {
            messages: messages as usize,
            first_seq,
            last_seq,
            tokens_before: 0,
            max_tokens: 100,
        },
        summary: Ok(summary.into()),
    }
}

/// A view whose model reads `window` tokens, compacting past 80% and
/// keeping the last two messages.
fn window_of(window: usize) -> Arc<View> {
    Arc::new(View {
        compaction: Settings {
            enabled: true,
            threshold: 0.8,
            keep_last: 2,
            context_window: window,
            ..Settings::default()
        },
        ..View::default()
    })
}

/// A session with `view`, one finished turn with a long message, and a
/// second long message just sent; returns the effects of sending it.
fn two_long_messages(view: Arc<View>) -> (Session, Vec<Effect>) {
    let mut session = Session::new(5);
    session.state = session.state.clone().with_view(view);
    session.ok(user(&format!("first {}", "word ".repeat(200))));
    session.ok(model_done("answer one", vec![]));
    let effects = session.ok(user_in(TURN2, &format!("second {}", "word ".repeat(200))));
    (session, effects)
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
    assert_eq!(session.state.history.len(), 2);
    // The model is called with the summary in place of the replaced turn.
    assert_eq!(
        effects.last(),
        Some(&model_call(&session.state, session.state.history.clone()))
    );
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
    let Some(Effect::CallModel { request }) = effects.last() else {
        panic!("{effects:?}")
    };
    assert_eq!(request.history.len(), 4);
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
fn a_request_past_the_threshold_asks_for_a_summary_first() {
    let view = window_of(400);
    let (session, effects) = two_long_messages(view.clone());
    let spans = session.state.history_spans.clone();
    let Some(Effect::Summarise { job, messages }) = effects.last() else {
        panic!("{effects:?}")
    };
    assert!(!calls_model(&effects), "the summary comes first");
    // The oldest message goes; the last two stay.
    assert_eq!(job.messages, 1);
    assert_eq!(messages, &session.state.history[..1]);
    assert_eq!((job.first_seq, job.last_seq), spans[0]);
    assert!(
        job.tokens_before > view.compaction.budget(),
        "{job:?} {}",
        view.compaction.budget()
    );
    assert!(job.max_tokens > 0 && job.max_tokens <= view.compaction.budget() / 4);
}

#[test]
fn a_summary_is_recorded_and_the_model_called_with_it() {
    let (mut session, effects) = two_long_messages(window_of(400));
    let Some(Effect::Summarise { job, .. }) = effects.last().cloned() else {
        panic!("{effects:?}")
    };
    let before = session.state.history.clone();
    let effects = session.ok(Input::Summarised {
        job: job.clone(),
        summary: Ok("The person wrote a long first message.".into()),
    });
    let [Kind::ContextCompacted(c)] = &events_of(&effects)[..] else {
        panic!("{effects:?}")
    };
    assert_eq!(c.summary, "The person wrote a long first message.");
    assert_eq!(c.messages, 1);
    assert_eq!((c.first_seq, c.last_seq), (job.first_seq, job.last_seq));
    assert_eq!(c.tokens_before, job.tokens_before as u64);
    assert!(
        c.tokens_after > 0 && c.tokens_after < c.tokens_before,
        "{c:?}"
    );
    assert_eq!(session.state.history[1..], before[1..]);
    assert_eq!(
        effects.last(),
        Some(&model_call(&session.state, session.state.history.clone()))
    );
}

#[test]
fn a_failed_summary_leaves_the_oldest_messages_out_with_a_note() {
    let (mut session, effects) = two_long_messages(window_of(400));
    let Some(Effect::Summarise { job, .. }) = effects.last().cloned() else {
        panic!("{effects:?}")
    };
    let effects = session.ok(Input::Summarised {
        job,
        summary: Err("the model server is down".into()),
    });
    let [Kind::ContextCompacted(c)] = &events_of(&effects)[..] else {
        panic!("{effects:?}")
    };
    assert_eq!(c.summary, "");
    assert!(
        c.note
            .contains("summarising failed (the model server is down)"),
        "{}",
        c.note
    );
    let Message::System { content } = &session.state.history[0] else {
        panic!("{:?}", session.state.history[0])
    };
    assert!(content.contains("were left out"), "{content}");
    assert!(calls_model(&effects));
}

#[test]
fn a_request_that_cannot_fit_ends_the_turn_instead_of_calling_the_model() {
    let view = Arc::new(View {
        system_prompt: "Be careful. ".repeat(100),
        ..(*window_of(200)).clone()
    });
    let mut session = Session::new(5);
    session.state = session.state.clone().with_view(view);
    let effects = session.ok(user("hello"));
    assert!(!calls_model(&effects), "{effects:?}");
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::Summarise { .. })),
        "{effects:?}"
    );
    let error = error_of(&effects);
    assert!(
        error
            .message
            .starts_with("model call not sent: the request would take about"),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("context window of 200"),
        "{}",
        error.message
    );
    assert_eq!(
        outcome_of(&effects).unwrap().outcome,
        TurnOutcome::Failed as i32
    );
    assert!(session.state.is_idle());
}

#[test]
fn a_message_that_selects_a_skillset_records_it_and_the_model_reads_it() {
    let skillsets = crate::skillsets::Skillsets::load(true, None, None);
    let text = skillsets.text("debugging").unwrap().to_string();
    let view = Arc::new(View {
        skillsets,
        ..View::default()
    });
    let mut session = Session::new(5);
    session.state = session.state.clone().with_view(view);
    let effects = session.ok(user("why does this crash with a panic?"));
    let events = events_of(&effects);
    assert!(matches!(events[0], Kind::UserMessage(_)), "{events:?}");
    let Kind::SkillsetChosen(chosen) = &events[1] else {
        panic!("{events:?}")
    };
    assert_eq!(chosen.skillset, "debugging");
    assert!(chosen.keywords.contains(&"panic".to_string()), "{chosen:?}");
    let Some(Effect::CallModel { request }) = effects.last() else {
        panic!("{effects:?}")
    };
    assert_eq!(request.head[1], Message::System { content: text });
    // A message that selects none records nothing.
    session.ok(model_done("fixed", vec![]));
    let effects = session.ok(user_in(TURN2, "hello there"));
    assert_eq!(events_of(&effects).len(), 1, "{effects:?}");
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
    let error = error_of(&effects);
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

// ---------------------------------------------------------------------------
// Compaction on demand
// ---------------------------------------------------------------------------

fn compact_in(turn_id: &str) -> Input {
    Input::Compact {
        turn_id: turn_id.into(),
        text: "/compact".into(),
    }
}

/// A session (a large window, keeping the last two messages) with two
/// finished turns: history [user, assistant, user, assistant].
fn two_short_turns() -> Session {
    let mut session = Session::new(5);
    session.state = session.state.clone().with_view(window_of(100_000));
    session.ok(user("first"));
    session.ok(model_done("answer one", vec![]));
    session.ok(user_in(TURN2, "second"));
    session.ok(model_done("answer two", vec![]));
    session
}

#[test]
fn compact_on_demand_summarises_all_but_the_last_messages_whatever_the_window() {
    let mut session = two_short_turns();
    let effects = session.ok(compact_in("turn-3"));
    // The request is recorded, is not part of the conversation, and no
    // model answer is asked for: a summary is.
    let Some(Kind::UserMessage(m)) = events_of(&effects).into_iter().next() else {
        panic!("the request is recorded first: {effects:?}");
    };
    assert!(m.compact, "{m:?}");
    assert_eq!(session.state.history.len(), 4);
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::CallModel { .. }))
    );
    let Some(Effect::Summarise { job, messages }) = effects
        .iter()
        .find(|e| matches!(e, Effect::Summarise { .. }))
        .cloned()
    else {
        panic!("a summary is asked for: {effects:?}");
    };
    assert_eq!(job.messages, 2, "the last two messages are kept");
    assert_eq!(messages.len(), 2);
    assert_eq!((job.first_seq, job.last_seq), (1, 2));

    let effects = session.ok(Input::Summarised {
        job,
        summary: Ok("they said hello twice".into()),
    });
    let events = events_of(&effects);
    assert!(matches!(&events[0], Kind::ContextCompacted(c) if c.messages == 2));
    let finished = outcome_of(&effects).expect("the turn ends");
    assert_eq!(finished.outcome, TurnOutcome::Completed as i32);
    assert!(
        finished
            .message
            .starts_with("compacted: 2 earlier messages"),
        "{}",
        finished.message
    );
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::CallModel { .. }))
    );
    assert!(session.state.is_idle());
    // The summary and the two kept messages.
    assert_eq!(session.state.history.len(), 3);
    assert!(
        matches!(&session.state.history[0], Message::System { content } if content.contains("they said hello twice"))
    );
    // The next message goes on from the compacted conversation.
    let effects = session.ok(user_in("turn-4", "third"));
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::CallModel { .. }))
    );
}

#[test]
fn compact_with_nothing_to_summarise_says_so_and_ends() {
    let mut session = Session::new(5);
    session.state = session.state.clone().with_view(window_of(100_000));
    session.ok(user("only"));
    session.ok(model_done("answer", vec![]));
    let effects = session.ok(compact_in(TURN2));
    let finished = outcome_of(&effects).expect("the turn ends at once");
    assert_eq!(finished.outcome, TurnOutcome::Completed as i32);
    assert!(
        finished.message.starts_with("nothing to compact"),
        "{}",
        finished.message
    );
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::Summarise { .. }))
    );
    assert_eq!(session.state.history.len(), 2, "nothing changed");
    assert!(session.state.is_idle());
}

#[test]
fn a_failed_or_interrupted_compaction_on_demand_replaces_nothing() {
    let mut session = two_short_turns();
    let effects = session.ok(compact_in("turn-3"));
    let Some(Effect::Summarise { job, .. }) = effects
        .iter()
        .find(|e| matches!(e, Effect::Summarise { .. }))
        .cloned()
    else {
        panic!("a summary is asked for");
    };
    // A restart meanwhile: the turn fails, nothing replaced.
    let mut restarted = session.restarted();
    let effects = restarted.ok(Input::Interrupted);
    let finished = outcome_of(&effects).expect("the turn ends");
    assert_eq!(finished.outcome, TurnOutcome::Failed as i32);
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::CallModel { .. } | Effect::Summarise { .. }))
    );
    assert_eq!(restarted.state.history.len(), 4);

    // The summary fails: nothing is left out either.
    let effects = session.ok(Input::Summarised {
        job,
        summary: Err("the model is down".into()),
    });
    let finished = outcome_of(&effects).expect("the turn ends");
    assert_eq!(finished.outcome, TurnOutcome::Failed as i32);
    assert!(
        finished.message.contains("nothing was replaced"),
        "{}",
        finished.message
    );
    assert!(
        !events_of(&effects)
            .iter()
            .any(|k| matches!(k, Kind::ContextCompacted(_)))
    );
    assert_eq!(session.state.history.len(), 4);
}

#[test]
fn compact_while_a_turn_runs_is_refused() {
    let mut session = Session::new(5);
    session.ok(user("busy"));
    session.refused(compact_in(TURN2), Refusal::Busy);
}

#[test]
fn tools_that_changed_before_a_compaction_on_demand_leave_it_a_compaction() {
    let mut session = two_short_turns();
    session.ok(compact_in("turn-3"));
    let effects = session.ok(Input::ToolCatalog(catalog()));
    assert!(
        events_of(&effects)
            .iter()
            .any(|k| matches!(k, Kind::ToolsOffered(_)))
    );
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::Summarise { .. })),
        "{effects:?}"
    );
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::CallModel { .. }))
    );
}
