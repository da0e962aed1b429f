//! The loop detector: the same call again and again in one turn is told,
//! then stopped.

use super::*;
use pretty_assertions::assert_eq;

fn same(id: &str, arguments: &str) -> ToolCall {
    call(id, "read_file", arguments)
}

fn loop_event(arguments: &str, repeats: u32, stopped: bool) -> Kind {
    Kind::LoopDetected(pb::LoopDetected {
        tool: "read_file".into(),
        arguments_json: arguments.into(),
        repeats,
        stopped,
        no_progress: false,
    })
}

fn results(effects: &[Effect]) -> Vec<pb::ToolResult> {
    events_of(effects)
        .into_iter()
        .filter_map(|k| match k {
            Kind::ToolResult(r) => Some(r),
            _ => None,
        })
        .collect()
}

fn calls_the_model(effects: &[Effect]) -> bool {
    effects
        .iter()
        .any(|e| matches!(e, Effect::CallModel { .. }))
}

#[test]
fn the_same_call_again_and_again_is_told_then_stopped() {
    let mut s = Session::new(10);
    s.ok(user("hello"));
    // Twice: both run (the same arguments, spaced and ordered differently).
    let effects = s.ok(model_done("", vec![same("a", r#"{"path":"x","limit":5}"#)]));
    assert_eq!(run_tools(&effects).len(), 1);
    s.ok(done("a", "text of x"));
    let effects = s.ok(model_done(
        "",
        vec![same("b", r#"{ "limit": 5, "path": "x" }"#)],
    ));
    assert_eq!(run_tools(&effects).len(), 1);
    s.ok(done("b", "text of x"));

    // The third time it does not run; the model is told why and asked on.
    let effects = s.ok(model_done("", vec![same("c", r#"{"path":"x","limit":5}"#)]));
    assert!(run_tools(&effects).is_empty(), "{effects:?}");
    assert!(events_of(&effects).contains(&loop_event(r#"{"path":"x","limit":5}"#, 3, false)));
    let told = results(&effects);
    assert_eq!(told.len(), 1);
    assert!(told[0].is_error);
    assert!(
        told[0].output.contains("call number 3 of read_file"),
        "{}",
        told[0].output
    );
    assert!(calls_the_model(&effects));

    // Once more, beside another call: nothing runs and the turn stops.
    let effects = s.ok(model_done(
        "",
        vec![same("d", r#"{"path":"x","limit":5}"#), bash("e", "ls")],
    ));
    assert!(run_tools(&effects).is_empty());
    assert!(!calls_the_model(&effects));
    let events = events_of(&effects);
    assert!(events.contains(&loop_event(r#"{"path":"x","limit":5}"#, 4, true)));
    let closed = results(&effects);
    assert_eq!(closed.len(), 2);
    assert!(
        closed
            .iter()
            .all(|r| r.is_error && r.output.starts_with("not run: stopped"))
    );
    match events.last() {
        Some(Kind::TurnFinished(f)) => {
            assert_eq!(f.outcome, TurnOutcome::Failed as i32);
            assert!(
                f.message
                    .contains("asked for the same read_file call 4 times"),
                "{}",
                f.message
            );
        }
        other => panic!("the turn did not finish: {other:?}"),
    }
    assert_eq!(s.state.phase, Phase::Idle);
}

#[test]
fn other_arguments_and_the_next_turn_count_afresh() {
    let mut s = Session::new(10);
    s.ok(user("hello"));
    for (id, path) in [("a", "x"), ("b", "y"), ("c", "x"), ("d", "y")] {
        let arguments = format!(r#"{{"path":"{path}"}}"#);
        let effects = s.ok(model_done("", vec![same(id, &arguments)]));
        assert_eq!(run_tools(&effects).len(), 1, "{id}: twice each, all run");
        s.ok(done(id, "text"));
    }
    s.ok(model_done("done", vec![]));
    // A new turn: the same call runs again.
    s.ok(user("again"));
    for id in ["e", "f"] {
        let effects = s.ok(model_done("", vec![same(id, r#"{"path":"x"}"#)]));
        assert_eq!(run_tools(&effects).len(), 1, "{id}");
        s.ok(done(id, "text"));
    }
}

#[test]
fn a_limit_of_zero_turns_the_detector_off() {
    let mut s = Session::new(10);
    s.state = s.state.clone().with_view(Arc::new(View {
        loop_repeats: 0,
        ..View::default()
    }));
    s.ok(user("hello"));
    for id in ["a", "b", "c", "d", "e"] {
        let effects = s.ok(model_done("", vec![same(id, r#"{"path":"x"}"#)]));
        assert_eq!(run_tools(&effects).len(), 1, "{id}");
        s.ok(done(id, "text"));
    }
}

fn failed(call_id: &str, output: &str) -> Input {
    Input::ToolDone(pb::ToolResult {
        is_error: true,
        ..tool_result(call_id, output)
    })
}

fn no_progress_events(effects: &[Effect]) -> Vec<(u32, bool)> {
    events_of(effects)
        .into_iter()
        .filter_map(|k| match k {
            Kind::LoopDetected(l) if l.no_progress => Some((l.repeats, l.stopped)),
            _ => None,
        })
        .collect()
}

/// Five steps whose calls all fail (each a different call, so the repeat
/// detector has nothing to say).
fn five_failing_steps() -> Session {
    let mut s = Session::new(20);
    s.ok(user("fix the build"));
    for i in 0..5 {
        let id = format!("f{i}");
        let effects = s.ok(model_done(
            "",
            vec![call(&id, "bash", &format!(r#"{{"command":"make {i}"}}"#))],
        ));
        assert_eq!(run_tools(&effects).len(), 1, "{id}");
        assert!(no_progress_events(&effects).is_empty());
        s.ok(failed(&id, &format!("make: *** no rule {i}")));
    }
    s
}

#[test]
fn steps_without_progress_are_told_then_stopped() {
    let mut s = five_failing_steps();
    // The sixth response: told, its calls not run.
    let effects = s.ok(model_done(
        "",
        vec![call("t", "bash", r#"{"command":"make 9"}"#)],
    ));
    assert!(run_tools(&effects).is_empty(), "{effects:?}");
    assert_eq!(no_progress_events(&effects), vec![(5, false)]);
    let told = results(&effects);
    assert!(
        told[0]
            .output
            .starts_with("error: not run: no progress in the last 5 steps"),
        "{}",
        told[0].output
    );
    assert!(calls_the_model(&effects));
    // It gets one more step...
    let effects = s.ok(model_done(
        "",
        vec![call("g", "bash", r#"{"command":"make x"}"#)],
    ));
    assert_eq!(run_tools(&effects).len(), 1);
    // ...which fails too, or repeats an earlier output: the turn stops.
    s.ok(done("g", "make: *** no rule 3"));
    let effects = s.ok(model_done(
        "",
        vec![call("h", "bash", r#"{"command":"make y"}"#)],
    ));
    assert!(run_tools(&effects).is_empty());
    assert_eq!(no_progress_events(&effects), vec![(6, true)]);
    let finished = events_of(&effects)
        .into_iter()
        .find_map(|k| match k {
            Kind::TurnFinished(f) => Some(f),
            _ => None,
        })
        .unwrap();
    assert_eq!(finished.outcome, TurnOutcome::Failed as i32);
    assert!(
        finished.message.contains("made no progress"),
        "{}",
        finished.message
    );
}

#[test]
fn progress_after_being_told_carries_on() {
    let mut s = five_failing_steps();
    s.ok(model_done(
        "",
        vec![call("t", "bash", r#"{"command":"make 9"}"#)],
    ));
    s.ok(model_done(
        "",
        vec![call("g", "bash", r#"{"command":"ls"}"#)],
    ));
    s.ok(done("g", "Makefile src"));
    let effects = s.ok(model_done(
        "",
        vec![call("h", "bash", r#"{"command":"make all"}"#)],
    ));
    assert_eq!(
        run_tools(&effects).len(),
        1,
        "progress was made: {effects:?}"
    );
    assert!(no_progress_events(&effects).is_empty());
}

#[test]
fn no_progress_steps_of_zero_turns_it_off() {
    let mut s = Session::new(20);
    s.state = s.state.clone().with_view(Arc::new(View {
        no_progress_steps: 0,
        ..View::default()
    }));
    s.ok(user("fix the build"));
    for i in 0..8 {
        let id = format!("f{i}");
        let effects = s.ok(model_done(
            "",
            vec![call(&id, "bash", &format!(r#"{{"command":"make {i}"}}"#))],
        ));
        assert_eq!(run_tools(&effects).len(), 1, "{id}");
        s.ok(failed(&id, "no"));
    }
}
