#![allow(clippy::expect_used)]
//! The shared view of a session: what every client shows is what this fold
//! makes of the events.

use agentry_client::relay::question_id;
use agentry_client::view::{Activity, CallState, Entry, NoteKind, SessionView};
use agentry_proto::sessions::v1::{self as pb, event::Kind};

const OWN: &str = "own-session";

fn logged(seq: u64, kind: Kind) -> pb::Event {
    pb::Event {
        session_id: OWN.into(),
        seq,
        turn_id: "turn-1".into(),
        kind: Some(kind),
        ..Default::default()
    }
}

fn view() -> SessionView {
    SessionView::new(OWN, str::to_string)
}

#[test]
fn a_turn_becomes_a_transcript_with_its_figures() {
    let mut view = view();
    view.apply(&logged(
        1,
        Kind::UserMessage(pb::UserMessage {
            text: "list the files".into(),
            ..Default::default()
        }),
    ));
    assert!(view.turn_open);
    assert_eq!(view.activity, Some(Activity::Model));
    // Streamed text, then the logged answer replaces it.
    let mut delta = logged(
        1,
        Kind::ModelTextDelta(pb::ModelTextDelta {
            text: "Look".into(),
        }),
    );
    delta.live = true;
    view.apply(&delta);
    view.apply(&logged(
        2,
        Kind::ModelMessage(pb::ModelMessage {
            text: "Looking.".into(),
            usage: Some(pb::TokenUsage {
                prompt_tokens: 100,
                completion_tokens: 5,
                total_tokens: 105,
                ..Default::default()
            }),
            context_window: 4096,
            model: "m".into(),
            ..Default::default()
        }),
    ));
    view.apply(&logged(
        3,
        Kind::ToolCallRequested(pb::ToolCallRequested {
            call_id: "c1".into(),
            tool: "bash".into(),
            arguments_json: r#"{"command":"ls"}"#.into(),
            ..Default::default()
        }),
    ));
    view.apply(&logged(
        4,
        Kind::ToolResult(pb::ToolResult {
            call_id: "c1".into(),
            tool: "bash".into(),
            output: "a.txt".into(),
            duration_ms: 7,
            runner_id: "r1".into(),
            ..Default::default()
        }),
    ));
    let applied = view.apply(&logged(
        5,
        Kind::TurnFinished(pb::TurnFinished {
            outcome: pb::TurnOutcome::Completed as i32,
            steps: 2,
            cost: Some(0.5),
            currency: "USD".into(),
            ..Default::default()
        }),
    ));
    assert!(!view.turn_open);
    assert_eq!(view.activity, None);
    assert_eq!((view.model.as_str(), view.context_window), ("m", 4096));
    assert_eq!((view.context_used, view.session_tokens), (105, 105));
    assert_eq!(view.session_cost, 0.5);
    assert_eq!(view.entries[0], Entry::Turn(1));
    assert_eq!(
        view.entries[1],
        Entry::User {
            text: "list the files".into(),
            by: String::new()
        }
    );
    assert_eq!(
        view.entries[2],
        Entry::Answer {
            text: "Looking.".into(),
            streaming: false
        }
    );
    let Entry::Tool(block) = &view.entries[3] else {
        panic!("a tool block: {:?}", view.entries[3]);
    };
    assert_eq!(
        (block.summary.as_str(), block.output.as_str(), block.state),
        ("ls", "a.txt", CallState::Done)
    );
    // The turn's end is a note, the same for every client.
    let (text, kind) = applied.note.expect("a note");
    assert_eq!(kind, NoteKind::Info);
    assert_eq!(text, "  (2 steps, $0.50)");
    assert_eq!(view.entries.last(), Some(&Entry::Note(text, kind)));
}

#[test]
fn questions_are_asked_and_resolved_here_and_for_sub_agents() {
    let mut view = view();
    let asked = view.apply(&logged(
        1,
        Kind::ApprovalRequested(pb::ApprovalRequested {
            call_id: "c1".into(),
            tool: "bash".into(),
            ..Default::default()
        }),
    ));
    assert_eq!(asked.asked.expect("asked").call_id, "c1");
    // The same question again (a client reconnecting) is not asked twice.
    let again = view.apply(&logged(
        1,
        Kind::ApprovalRequested(pb::ApprovalRequested {
            call_id: "c1".into(),
            tool: "bash".into(),
            ..Default::default()
        }),
    ));
    assert!(again.asked.is_none());
    // A sub-agent's question, relayed live under its own session.
    let relayed = pb::Event {
        session_id: "sub-1".into(),
        seq: 9,
        live: true,
        kind: Some(Kind::ApprovalRequested(pb::ApprovalRequested {
            call_id: "c1".into(),
            tool: "write_file".into(),
            ..Default::default()
        })),
        ..Default::default()
    };
    let child = view.apply(&relayed).asked.expect("relayed");
    assert_eq!(child.call_id, question_id(OWN, "sub-1", "c1"));
    assert_eq!(view.questions.len(), 2);
    // A sub-agent's event changes nothing else here.
    assert!(view.entries.is_empty());
    // Answered elsewhere: the sub-agent's call runs.
    let answered = view.apply(&pb::Event {
        kind: Some(Kind::ToolCallState(pb::ToolCallState {
            call_id: "c1".into(),
            phase: pb::ToolCallPhase::Executing as i32,
            ..Default::default()
        })),
        ..relayed
    });
    assert_eq!(answered.resolved, [child.call_id]);
    // The turn's end clears what is left.
    let ended = view.apply(&logged(
        2,
        Kind::TurnFinished(pb::TurnFinished {
            outcome: pb::TurnOutcome::Cancelled as i32,
            ..Default::default()
        }),
    ));
    assert!(ended.cleared && view.questions.is_empty());
    assert!(
        ended
            .note
            .expect("a note")
            .0
            .starts_with("(turn cancelled)")
    );
}

#[test]
fn a_rewind_marks_what_it_took_out_as_history() {
    let mut view = view();
    for (seq, text) in [(1, "first"), (3, "second")] {
        let mut event = logged(
            seq,
            Kind::UserMessage(pb::UserMessage {
                text: text.into(),
                ..Default::default()
            }),
        );
        event.turn_id = format!("turn-{seq}");
        view.apply(&event);
    }
    view.apply(&logged(
        5,
        Kind::SessionRewound(pb::SessionRewound {
            to_turn: 1,
            to_seq: 2,
            ..Default::default()
        }),
    ));
    let history: Vec<&Entry> = view
        .entries
        .iter()
        .zip(&view.rewound)
        .filter(|(_, rewound)| **rewound)
        .map(|(entry, _)| entry)
        .collect();
    assert_eq!(
        history,
        [
            &Entry::Turn(2),
            &Entry::User {
                text: "second".into(),
                by: String::new()
            }
        ]
    );
    assert!(matches!(
        view.entries.last(),
        Some(Entry::Note(text, _)) if text.starts_with("── rewound to the end of turn 1")
    ));
}

/// An unreadable tool call: shown as the model wrote it (what streamed of
/// it settles), told in a note, its tokens counted, and named in JSON by
/// its contract field.
#[test]
fn an_unreadable_tool_call_is_shown_as_written_with_a_note_and_counted() {
    let mut view = view();
    view.apply(&logged(
        1,
        Kind::UserMessage(pb::UserMessage {
            text: "list".into(),
            ..Default::default()
        }),
    ));
    view.apply(&pb::Event {
        seq: 0,
        ..logged(
            1,
            Kind::ModelTextDelta(pb::ModelTextDelta {
                text: "TOOL:list_dir {".into(),
            }),
        )
    });
    let event = logged(
        2,
        Kind::ToolCallUnreadable(pb::ToolCallUnreadable {
            text: "TOOL:list_dir {\"path\": ".into(),
            error: "the arguments are not valid JSON".into(),
            usage: Some(pb::TokenUsage {
                prompt_tokens: 10,
                completion_tokens: 2,
                total_tokens: 12,
                ..Default::default()
            }),
            attempt: 1,
        }),
    );
    let applied = view.apply(&event);
    assert_eq!(view.session_tokens, 12);
    let answers: Vec<_> = view
        .entries
        .iter()
        .filter_map(|e| match e {
            Entry::Answer { text, streaming } => Some((text.as_str(), *streaming)),
            _ => None,
        })
        .collect();
    assert_eq!(answers, [("TOOL:list_dir {\"path\": ", false)]);
    let (note, kind) = applied.note.expect("a note");
    assert_eq!(kind, NoteKind::Info);
    assert_eq!(
        note,
        "  (the model's tool call could not be read: the arguments are not valid JSON; it is \
         shown the format and asked again)"
    );
    let json = agentry_client::json::event_json(&event);
    assert_eq!(json["type"], "tool_call_unreadable");
    assert_eq!(json["attempt"], 1);
    assert_eq!(json["error"], "the arguments are not valid JSON");
    assert_eq!(json["usage"]["completion_tokens"], 2);
    // The second, which fails the turn, says so.
    let again = logged(
        3,
        Kind::ToolCallUnreadable(pb::ToolCallUnreadable {
            text: "TOOL:nope {}".into(),
            error: "no tool named \"nope\"".into(),
            usage: None,
            attempt: 2,
        }),
    );
    let (note, _) = view.apply(&again).note.expect("a note");
    assert_eq!(
        note,
        "  (the model's tool call still could not be read: no tool named \"nope\")"
    );
}

#[test]
fn another_persons_message_and_answer_say_who_the_installs_own_do_not() {
    let by = |seq: u64, kind: Kind, by: &str| pb::Event {
        by: by.into(),
        ..logged(seq, kind)
    };
    let message = |text: &str| {
        Kind::UserMessage(pb::UserMessage {
            text: text.into(),
            ..Default::default()
        })
    };
    let mut view = view();
    view.apply(&by(1, message("mine"), "admin"));
    view.apply(&by(
        2,
        Kind::ToolCallRequested(pb::ToolCallRequested {
            call_id: "c1".into(),
            tool: "write_file".into(),
            arguments_json: r#"{"path":"a","content":""}"#.into(),
            ..Default::default()
        }),
        "",
    ));
    view.apply(&by(
        3,
        Kind::ApprovalDecided(pb::ApprovalDecided {
            call_id: "c1".into(),
            decision: pb::ApprovalDecision::Deny as i32,
            reason: "not now".into(),
            ..Default::default()
        }),
        "abe",
    ));
    view.apply(&by(4, message("theirs"), "otto"));
    let users: Vec<(&str, &str)> = view
        .entries
        .iter()
        .filter_map(|e| match e {
            Entry::User { text, by } => Some((text.as_str(), by.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(users, [("mine", ""), ("theirs", "otto")]);
    let decision = view
        .entries
        .iter()
        .find_map(|e| match e {
            Entry::Tool(b) if b.call_id == "c1" => Some(b.decision.clone()),
            _ => None,
        })
        .expect("the call's block");
    assert_eq!(decision, "denied by abe: not now");
}
