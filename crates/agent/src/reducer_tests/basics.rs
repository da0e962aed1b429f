//! Construction and replay, the tool catalog.

use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// Construction and replay basics
// ---------------------------------------------------------------------------

#[test]
fn new_session_is_idle_and_empty() {
    let state = SessionState::new(3);
    assert_eq!(state.phase, Phase::Idle);
    assert_eq!(state.turn, None);
    assert_eq!(state.history, vec![]);
    assert_eq!(state.max_steps, 3);
    assert_eq!(state.session_rules, vec![]);
    assert_eq!(*state.catalog, Catalog::default());
    assert!(state.is_idle());
    assert_eq!(state.turn_id(), None);
    assert!(state.awaiting_approval().is_empty());
    // The shared allow-all policy.
    assert_eq!(state.policy, SessionState::new(7).policy);
    let verdict = state
        .policy
        .0
        .check("bash", r#"{"command":"sudo rm -rf /"}"#, false, &[]);
    assert_eq!(verdict.decision, Decision::Allow);
    assert_eq!(verdict.rule, ALLOW_ALL);
}

#[test]
fn policies_compare_by_instance() {
    let policy = test_policy();
    let a = SessionState::new(3).with_policy(policy.clone());
    let b = SessionState::new(3).with_policy(policy.clone());
    assert_eq!(a, b);
    assert!(Arc::ptr_eq(&a.policy.0, &policy));
    // Same rules, another instance: a different policy.
    assert_ne!(a, SessionState::new(3).with_policy(test_policy()));
    assert_ne!(
        SessionState::new(3).policy,
        PolicyRef(Arc::new(Policy::allow_all()))
    );
    // `with_policy` changes nothing else.
    assert_eq!(
        SessionState {
            policy: SessionState::new(3).policy,
            ..a
        },
        SessionState::new(3)
    );
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
    let policy = test_policy();
    assert_eq!(
        SessionState::new(5)
            .with_policy(policy.clone())
            .replayed(&[]),
        SessionState::new(5).with_policy(policy)
    );
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
fn replayed_keeps_the_policy_and_the_catalog() {
    let mut live = Session::with_policy(4, test_policy(), catalog());
    live.ok(user("go"));
    live.ok(model_done("", vec![bash("b1", "make build")]));
    live.ok(approve_for_session("b1"));
    let rebuilt = live.rebuilt();
    assert!(Arc::ptr_eq(&rebuilt.policy.0, &live.state.policy.0));
    assert_eq!(rebuilt.catalog, catalog());
    assert_eq!(rebuilt, live.state);
    // `replay` uses the allow-all policy and an empty catalog; the rest is
    // the same fold.
    let plain = SessionState::replay(4, &live.log);
    assert_eq!(
        plain,
        SessionState {
            policy: SessionState::new(1).policy,
            catalog: Arc::default(),
            ..live.state.clone()
        }
    );
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
    assert_eq!(
        Refusal::Busy.to_string(),
        "a turn is already running in this session; wait for it to finish or cancel it"
    );
    assert_eq!(
        Refusal::NoPendingApproval {
            call_id: "c9".into()
        }
        .to_string(),
        r#"no approval is pending for call "c9""#
    );
    assert_eq!(
        Refusal::InvalidDecision("bad edit".into()).to_string(),
        "bad edit"
    );
}

#[test]
fn only_malformed_inputs_are_invalid_arguments() {
    assert!(Refusal::EmptyMessage.is_invalid_argument());
    assert!(Refusal::InvalidDecision("x".into()).is_invalid_argument());
    for refusal in [
        Refusal::Busy,
        Refusal::NothingToCancel,
        Refusal::NoPendingApproval {
            call_id: "c1".into(),
        },
        Refusal::Unexpected {
            input: "tool result",
            phase: Phase::UseTools,
        },
    ] {
        assert!(!refusal.is_invalid_argument(), "{refusal:?}");
    }
}

#[test]
fn call_phases_only_move_forward() {
    use CallPhase::*;
    let all = [
        Validating,
        AwaitingApproval,
        Scheduled,
        Executing,
        Success,
        Error,
        Cancelled,
    ];
    for (i, from) in all.iter().enumerate() {
        for (j, to) in all.iter().enumerate() {
            // The three terminal phases are equally far.
            let forward = j > i && !from.is_terminal();
            assert_eq!(from.can_move_to(*to), forward, "{from:?} -> {to:?}");
        }
        assert_eq!(from.is_terminal(), i >= 4, "{from:?}");
    }
}

// ---------------------------------------------------------------------------
// Tool catalog (any phase)
// ---------------------------------------------------------------------------

#[test]
fn a_changed_tool_catalog_is_recorded_and_the_model_call_decided_again() {
    for state in [generating(4), generating_step_two(4)] {
        let mut after = state.clone();
        let effects = after.step(Input::ToolCatalog(catalog())).unwrap();
        assert_eq!(
            effects,
            vec![
                record(TURN, vec![Kind::ToolsOffered(catalog().to_event())]),
                model_call(&after, state.history.clone()),
            ]
        );
        assert_eq!(after.catalog, catalog());
        let Some(Effect::CallModel { request }) = effects.last() else {
            panic!("{effects:?}")
        };
        assert_eq!(request.tools, catalog().definitions, "offered as recorded");
        // The same tools again: nothing to record, the call stands.
        assert_eq!(after.step(Input::ToolCatalog(catalog())), Ok(vec![]));
        // A new catalog replaces the old one.
        let small = catalog_of(&[("grep", READ_ONLY_SERIAL)]);
        let effects = after.step(Input::ToolCatalog(small.clone())).unwrap();
        assert_eq!(
            events_of(&effects),
            vec![Kind::ToolsOffered(small.to_event())]
        );
        assert_eq!(after.catalog, small);
        assert_eq!(after.history, state.history);
        assert_eq!(after.phase, Phase::Generate);
    }
}

#[test]
fn the_tool_catalog_is_only_taken_before_a_model_call() {
    for state in [SessionState::new(4), using_tools(4), idle_after_turn(4)] {
        let mut after = state.clone();
        assert_eq!(
            after.step(Input::ToolCatalog(catalog())),
            Err(Refusal::Unexpected {
                input: "tool catalog",
                phase: state.phase,
            })
        );
        assert_eq!(after, state);
    }
}

#[test]
fn a_recorded_catalog_comes_back_on_replay() {
    let mut session = Session::new(4);
    session.ok(user("go"));
    session.ok(Input::ToolCatalog(catalog()));
    // The flags of the recorded catalog decide how calls run, after a
    // restart too.
    let restarted = session.restarted();
    assert_eq!(*restarted.state.catalog, *catalog());
    assert_eq!(*SessionState::replay(4, &session.log).catalog, *catalog());
    let effects = session.ok(model_done("", vec![read_file("r1", "a.txt")]));
    assert_eq!(run_tools(&effects), vec![read_file("r1", "a.txt")]);
    assert!(
        effects.contains(&ran(read_file("r1", "a.txt"))),
        "{effects:?}"
    );
}

#[test]
fn tool_catalog_does_not_change_calls_already_requested() {
    let mut state = using_tools(4);
    let calls = calls_of(&state);
    assert!(state.step(Input::ToolCatalog(catalog())).is_err());
    assert_eq!(calls_of(&state), calls);
}

// ---------------------------------------------------------------------------
// Instruction files
// ---------------------------------------------------------------------------

fn instruction(path: &str, text: &str) -> pb::InstructionFile {
    pb::InstructionFile {
        path: path.into(),
        text: text.into(),
        truncated: false,
        size: text.len() as u64,
    }
}

#[test]
fn new_instruction_files_are_recorded_and_the_model_call_decided_again_with_them() {
    let state = generating(4);
    let mut after = state.clone();
    let root = instruction("/p/AGENTS.md", "use make check");
    let effects = after.step(Input::Instructions(vec![root.clone()])).unwrap();
    assert_eq!(
        events_of(&effects),
        vec![Kind::InstructionsLoaded(pb::InstructionsLoaded {
            files: vec![root.clone()]
        })]
    );
    let Some(Effect::CallModel { request }) = effects.last() else {
        panic!("{effects:?}")
    };
    assert!(
        request.head.iter().any(|m| matches!(m,
            agentry_llm::Message::System { content } if content.contains("use make check"))),
        "{request:?}"
    );
    // The same file again: nothing; a changed one: recorded, in its place.
    assert_eq!(
        after.step(Input::Instructions(vec![root.clone()])),
        Ok(vec![])
    );
    let changed = instruction("/p/AGENTS.md", "use make test");
    let effects = after
        .step(Input::Instructions(vec![changed.clone()]))
        .unwrap();
    assert_eq!(events_of(&effects).len(), 1);
    assert_eq!(after.instructions, vec![changed]);
}

#[test]
fn instruction_files_found_by_a_tool_call_are_recorded_without_a_model_call() {
    let mut state = using_tools(4);
    let nested = instruction("/p/sub/AGENTS.md", "no I/O here");
    let effects = state
        .step(Input::Instructions(vec![nested.clone()]))
        .unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![Kind::InstructionsLoaded(pb::InstructionsLoaded {
                files: vec![nested.clone()]
            })]
        )]
    );
    assert_eq!(state.phase, Phase::UseTools);
    assert_eq!(state.instructions, vec![nested]);
}

#[test]
fn recorded_instruction_files_come_back_on_replay() {
    let mut session = Session::new(4);
    session.ok(user("go"));
    session.ok(Input::Instructions(vec![instruction(
        "/p/AGENTS.md",
        "rules",
    )]));
    assert_eq!(
        SessionState::replay(4, &session.log).instructions,
        vec![instruction("/p/AGENTS.md", "rules")]
    );
}

#[test]
fn the_person_switches_the_model_between_turns_and_replay_keeps_it() {
    let mut session = Session::new(4);
    let effects = session.ok(Input::SetModel("big-model".into()));
    assert_eq!(
        events_of(&effects),
        vec![Kind::ModelChanged(pb::ModelChanged {
            model: "big-model".into()
        })]
    );
    assert_eq!(session.state.model.as_deref(), Some("big-model"));
    session.ok(user("go"));
    assert_eq!(
        session.state.clone().step(Input::SetModel("other".into())),
        Err(Refusal::Busy)
    );
    assert_eq!(
        SessionState::replay(4, &session.log).model.as_deref(),
        Some("big-model")
    );
    let mut idle = SessionState::replay(4, &session.log);
    idle.phase = Phase::Idle;
    idle.turn = None;
    idle.step(Input::SetModel(String::new())).unwrap();
    assert_eq!(idle.model, None);
}

#[test]
fn a_messages_images_reach_a_model_that_takes_them_and_are_named_for_one_that_does_not() {
    let image = pb::Image {
        path: "shot.png".into(),
        mime: "image/png".into(),
        data: b"\x89PNG\r\n\x1a\n-pixels-".to_vec(),
    };
    for takes_images in [true, false] {
        let mut s = Session::new(20);
        s.state = s.state.clone().with_view(Arc::new(View {
            images: takes_images,
            ..View::default()
        }));
        let effects = s.ok(Input::UserMessage {
            images: vec![image.clone()],
            turn_id: TURN.into(),
            text: "what is this?".into(),
            approval_mode: ApprovalMode::Policy,
            plan: false,
            network: false,
            budget: None,
        });
        // The log keeps the image either way.
        let Kind::UserMessage(recorded) = &events_of(&effects)[0] else {
            panic!("{effects:?}")
        };
        assert_eq!(recorded.images, vec![image.clone()]);
        let Some(Effect::CallModel { request }) = effects.last() else {
            panic!("{effects:?}")
        };
        let Some(Message::User { content, images }) = request.history.last() else {
            panic!("{:?}", request.history)
        };
        if takes_images {
            assert_eq!(content, "what is this?");
            assert_eq!(images.len(), 1);
            assert_eq!(images[0].mime, "image/png");
            assert_eq!(&images[0].data[..], &image.data[..]);
        } else {
            assert!(images.is_empty());
            assert!(
                content.contains("[attached: shot.png (image/png), not shown: this model"),
                "{content}"
            );
        }
    }
}
