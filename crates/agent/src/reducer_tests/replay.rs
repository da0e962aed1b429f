//! Replay.

use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// Replay property
// ---------------------------------------------------------------------------

/// Runs `script` (input, whether it is accepted) through a [`Session`],
/// which checks after every step that replaying the log gives the live state.
fn run_script(max_steps: u32, script: Vec<(Input, bool)>) -> Session {
    run_script_in(Session::new(max_steps), script)
}

fn run_script_in(mut session: Session, script: Vec<(Input, bool)>) -> Session {
    for (input, accepted) in script {
        let what = format!("{input:?}");
        assert_eq!(session.step(input).is_ok(), accepted, "{what}");
    }
    assert_eq!(session.rebuilt(), session.state, "final replay");
    session
}

#[test]
fn replay_matches_a_plain_turn() {
    let session = run_script(
        4,
        vec![(user("hi"), true), (model_done("hello", vec![]), true)],
    );
    assert_eq!(
        core(&session.state),
        idle(vec![Message::user("hi"), Message::assistant("hello")], 4)
    );
    assert_eq!(session.log.len(), 3);
}

#[test]
fn replay_matches_two_turns_with_tools() {
    let session = run_script(
        4,
        vec![
            (user("hello"), true),
            (model_done("let me look", two_calls()), true),
            (chunk("c1", OutputStream::Stdout, "x"), true),
            (done("c1", "out1"), true),
            (done("c2", "out2"), true),
            (model_done("done", vec![]), true),
            (user_in(TURN2, "more"), true),
            (
                model_done("more calls", vec![call("c3", "shell", "{}")]),
                true,
            ),
            (done("c3", "out3"), true),
            (model_done("finished", vec![]), true),
        ],
    );
    let turn_ids: Vec<&str> = session.log.iter().map(|e| e.turn_id.as_str()).collect();
    // Turn 1: message; response, 2 requests, 2 scheduled, 1 executing;
    // chunk; success, result, executing; success, result; response, end.
    assert_eq!(turn_ids.iter().filter(|t| **t == TURN).count(), 15);
    // Turn 2: message; response, request, scheduled, executing; success,
    // result; response, end.
    assert_eq!(turn_ids.iter().filter(|t| **t == TURN2).count(), 9);
    assert_eq!(turn_ids.len(), 24);
    assert!(session.state.is_idle());
    assert_eq!(session.state.history.len(), 9);
}

#[test]
fn replay_matches_step_limits() {
    for max_steps in [1, 2, 3] {
        let mut script = vec![(user("loop"), true)];
        for i in 0..max_steps {
            let id = format!("c{i}");
            // Calls that differ: the loop detector is not what this tests.
            let arguments = format!(r#"{{"n":{i}}}"#);
            script.push((
                model_done("again", vec![call(&id, "shell", &arguments)]),
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
    let session = run_script(
        4,
        vec![
            (user("one"), true),
            (model_done("tools", two_calls()), true),
            (cancel("stop"), true),
            (done("c1", "too late"), false),
            (user_in(TURN2, "two"), true),
            (cancel(""), true),
            (model_done("too late", vec![]), false),
            (user_in("turn-3", "three"), true),
            (model_failed("boom", false), true),
            (user_in("turn-4", "four"), true),
            (model_done("tools", two_calls()), true),
            (done("c1", "out1"), true),
            // c2 (mutating) was running: its outcome is unknown; the model
            // is asked again.
            (Input::Interrupted, true),
            (done("c2", "too late"), false),
            (Input::Interrupted, true),
            (cancel(""), true),
            (user_in("turn-5", "five"), true),
            (Input::Interrupted, true),
            (Input::Interrupted, true),
            // The third restart of turn-5 gives up on it.
            (Input::Interrupted, true),
            (cancel(""), false),
            (Input::Interrupted, true),
        ],
    );
    assert!(session.state.is_idle());
    let outcomes: Vec<i32> = session
        .log
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::TurnFinished(f)) => Some(f.outcome),
            _ => None,
        })
        .collect();
    assert_eq!(
        outcomes,
        vec![
            TurnOutcome::Cancelled as i32,
            TurnOutcome::Cancelled as i32,
            TurnOutcome::Failed as i32,
            TurnOutcome::Cancelled as i32,
            TurnOutcome::Failed as i32,
        ]
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
            (approve("c1"), false),
            (user("go"), true),
            (
                Input::Compact {
                    turn_id: "turn-x".into(),
                    text: "/compact".into(),
                },
                false,
            ),
            (done("c1", "x"), false),
            (chunk("c1", OutputStream::Stderr, "x"), false),
            (approve("c1"), false),
            (model_done("t", two_calls()), true),
            (model_failed("x", true), false),
            (done("c2", "x"), false),
            (approve("c1"), false),
            (done("c1", "x"), true),
            (done("c1", "x"), false),
            (done("c2", "x"), true),
            (model_done("end", vec![]), true),
            (Input::Interrupted, true),
        ],
    );
}

#[test]
fn replay_matches_approvals_and_session_rules() {
    let session = run_script_in(
        Session::with_policy(4, test_policy(), catalog()),
        vec![
            (user("go"), true),
            (
                model_done(
                    "",
                    vec![
                        bash("b1", "make build"),
                        bash("b2", "make lint"),
                        bash("b3", "make test"),
                        write_file("w4", "out.txt"),
                    ],
                ),
                true,
            ),
            (approve_for_session("b1"), true),
            (done("b1", "built"), true),
            (edit("b2", r#"{"command":"git status"}"#), true),
            (done("b2", "clean"), true),
            (deny("b3", "not now"), true),
            (approve_for_session("w4"), true),
            (approve("w4"), false),
            (done("w4", "written"), true),
            (model_done("done", vec![]), true),
        ],
    );
    assert_eq!(
        session.state.session_rules,
        vec![
            SessionRule {
                tool: "bash".into(),
                command: Some("make build".into()),
                path: None,
            },
            SessionRule {
                tool: "write_file".into(),
                command: None,
                path: Some("out.txt".into()),
            },
        ]
    );
}

#[test]
fn a_rewind_leaves_later_turns_out_of_the_conversation_but_not_their_spending() {
    let mut s = Session::new(4);
    s.ok(user_in("t1", "first"));
    s.ok(Input::ModelDone(completion_with_usage(
        "one",
        vec![],
        Some(usage(90, 10)),
    )));
    assert!(s.state.is_idle());
    let end_of_first = s.log.len() as u64;
    let kept_history = s.state.history.clone();
    s.ok(user_in("t2", "second"));
    s.ok(Input::ModelDone(completion_with_usage(
        "two",
        vec![],
        Some(usage(40, 10)),
    )));
    assert_eq!(s.state.spent_tokens, 150);
    assert_ne!(s.state.history, kept_history);
    s.log.push(pb::Event {
        seq: s.log.len() as u64 + 1,
        kind: Some(Kind::SessionRewound(pb::SessionRewound {
            to_turn: 1,
            to_seq: end_of_first,
            ..Default::default()
        })),
        ..Default::default()
    });
    let rewound = s.rebuilt();
    assert_eq!(rewound.history, kept_history);
    assert!(rewound.is_idle());
    assert_eq!(
        rewound.spent_tokens, 150,
        "what the rewound turn spent stays spent"
    );
    assert_eq!(rewound.last_seq, s.log.len() as u64);
    // The next turn goes on from the first one's end.
    let mut after = Session {
        state: rewound,
        log: s.log.clone(),
        max_steps: 4,
    };
    after.ok(user_in("t3", "third"));
    assert!(matches!(
        after.state.history.last(),
        Some(Message::User { content, .. }) if content == "third"
    ));
    assert_eq!(after.state.history.len(), kept_history.len() + 1);
}
