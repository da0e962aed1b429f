//! Checkpoints: every field of an idle state survives one; one that cannot
//! stand for the log's start is refused, and the caller replays instead.
//! (That a checkpoint after any idle point of any scenario, with the events
//! after it, gives the live state is checked after every step by
//! `Session::step`.)

use super::*;
use crate::reducer::CHECKPOINT_FORMAT;
use pretty_assertions::assert_eq;

/// An idle state with every field a checkpoint carries set.
fn full_state(view: Arc<View>) -> SessionState {
    let mut state = SessionState::new(4).with_view(view);
    state.history = vec![
        Message::System {
            content: "summary of the first turns".into(),
        },
        Message::User {
            content: "look at this".into(),
            images: vec![agentry_llm::Image {
                mime: "image/png".into(),
                data: Arc::from(vec![0x89u8, b'P', b'N', b'G', 0, 255]),
            }],
        },
        Message::Assistant {
            content: "reading it".into(),
            tool_calls: vec![ToolCall {
                id: "call-1".into(),
                name: "read_file".into(),
                arguments: r#"{"path":"a.txt"}"#.into(),
            }],
        },
        Message::Tool {
            tool_call_id: "call-1".into(),
            content: "hello".into(),
        },
    ];
    state.history_spans = vec![(1, 4), (5, 5), (6, 6), (7, 7)];
    state.last_seq = 9;
    state.session_rules = vec![
        SessionRule {
            tool: "bash".into(),
            command: Some("git status".into()),
            path: None,
        },
        SessionRule {
            tool: "read_file".into(),
            command: None,
            path: Some("docs/a.md".into()),
        },
    ];
    let mut catalog = Catalog::default();
    catalog.add(
        agentry_llm::ToolDefinition {
            name: "bash".into(),
            description: "runs a command".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"command": {"type": "string"}}}),
        },
        ToolFlags {
            read_only: false,
            parallel_safe: false,
            read_only_hint: false,
            network: true,
        },
    );
    state.catalog = Arc::new(catalog);
    state.delivered_firings = ["reminder-1@100".to_string()].into_iter().collect();
    state.turn_scheduled = true;
    state.failed_calls = ["call-0".to_string()].into_iter().collect();
    state.last_mcp_updates = [(
        ("docs".to_string(), "file:///a".to_string()),
        "u-3".to_string(),
    )]
    .into_iter()
    .collect();
    state.limits = pb::Budget {
        turn_tokens: 1000,
        session_tokens: 0,
        turn_cost: 0.0,
        session_cost: 2.5,
    };
    state.spent_tokens = 4321;
    state.spent_cost = 0.125;
    state.instructions = vec![pb::InstructionFile {
        path: "/work/AGENTS.md".into(),
        text: "be brief".into(),
        truncated: false,
        size: 8,
    }];
    state.model = Some("other-model".into());
    state
}

#[test]
fn every_field_of_an_idle_state_survives_a_checkpoint() {
    let view = Arc::new(View::default());
    let state = full_state(view.clone());
    let checkpoint = state.checkpoint().expect("an idle state has a checkpoint");
    assert_eq!(checkpoint.seq, 9);
    assert_eq!(checkpoint.format, CHECKPOINT_FORMAT);
    let resumed = SessionState::new(4)
        .with_view(view)
        .resumed(&checkpoint, &[])
        .expect("the checkpoint is used");
    assert_eq!(resumed, state);
    // Compared one by one too: equality of states leaves out caches.
    assert_eq!(resumed.history, state.history);
    assert_eq!(resumed.history_spans, state.history_spans);
    assert_eq!(*resumed.catalog, *state.catalog);
    assert_eq!(resumed.model.as_deref(), Some("other-model"));
}

#[test]
fn a_checkpoint_takes_the_events_after_it() {
    let view = Arc::new(View::default());
    let state = full_state(view.clone());
    let checkpoint = state.checkpoint().unwrap();
    let after = [pb::Event {
        seq: 10,
        turn_id: TURN.into(),
        kind: Some(Kind::UserMessage(pb::UserMessage {
            text: "and now?".into(),
            ..Default::default()
        })),
        ..Default::default()
    }];
    let resumed = SessionState::new(4)
        .with_view(view.clone())
        .resumed(&checkpoint, &after)
        .unwrap();
    assert_eq!(resumed.last_seq, 10);
    assert_eq!(resumed.phase, Phase::Generate);
    assert_eq!(resumed.history.len(), 5);
    assert_eq!(resumed, state.replayed(&after));
}

#[test]
fn a_running_turn_has_no_checkpoint() {
    let mut session = Session::new(4);
    assert!(
        session.state.checkpoint().is_none(),
        "a new session has none"
    );
    session.ok(user("hello"));
    assert!(session.state.checkpoint().is_none(), "a turn runs");
    session.ok(model_done("hi", vec![]));
    let checkpoint = session.state.checkpoint().expect("the turn ended");
    assert_eq!(checkpoint.seq, session.log.len() as u64);
}

#[test]
fn a_checkpoint_made_under_other_settings_or_format_is_not_used() {
    let state = full_state(Arc::new(View::default()));
    let checkpoint = state.checkpoint().unwrap();
    let images = Arc::new(View {
        images: !View::default().images,
        ..View::default()
    });
    assert!(
        SessionState::new(4)
            .with_view(images)
            .resumed(&checkpoint, &[])
            .is_none(),
        "the model takes images here and not there"
    );
    let fresh = || SessionState::new(4).with_view(Arc::new(View::default()));
    let newer = pb::Checkpoint {
        format: CHECKPOINT_FORMAT + 1,
        ..checkpoint.clone()
    };
    assert!(fresh().resumed(&newer, &[]).is_none(), "an unknown format");
    let damaged = pb::Checkpoint {
        state: vec![0xff, 0xff, 0xff],
        ..checkpoint.clone()
    };
    assert!(
        fresh().resumed(&damaged, &[]).is_none(),
        "bytes that do not decode"
    );
    let gap = [pb::Event {
        seq: 11,
        turn_id: TURN.into(),
        kind: Some(Kind::UserMessage(pb::UserMessage::default())),
        ..Default::default()
    }];
    assert!(
        fresh().resumed(&checkpoint, &gap).is_none(),
        "event 10 missing"
    );
}

#[test]
fn a_rewind_to_before_the_checkpoint_refuses_it_and_one_after_does_not() {
    let state = full_state(Arc::new(View::default()));
    let checkpoint = state.checkpoint().unwrap();
    let rewind = |to_seq| {
        [pb::Event {
            seq: 10,
            turn_id: String::new(),
            kind: Some(Kind::SessionRewound(pb::SessionRewound {
                to_seq,
                ..Default::default()
            })),
            ..Default::default()
        }]
    };
    let fresh = || SessionState::new(4).with_view(Arc::new(View::default()));
    assert!(fresh().resumed(&checkpoint, &rewind(6)).is_none());
    assert!(fresh().resumed(&checkpoint, &rewind(9)).is_some());
}
