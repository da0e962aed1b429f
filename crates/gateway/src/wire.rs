//! The shared session view ([`SessionView`]) as the console receives it:
//! JSON objects for entries, figures and questions. Everything in them is
//! text for the page to show as text.

use agentry_client::view::{Activity, CallState, Entry, NoteKind, SessionView};
use agentry_proto::sessions::v1 as pb;
use serde_json::{Value, json};

/// Keeps the session's text as text a page can show: control characters
/// (but newlines and tabs) and the bidirectional overrides that can make
/// text read other than it is are dropped.
pub fn web_text(text: &str) -> String {
    text.chars()
        .filter(|c| {
            let control = c.is_control() && !matches!(*c, '\n' | '\t');
            let direction = matches!(*c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
            !control && !direction
        })
        .collect()
}

/// One transcript entry.
pub fn entry(view: &SessionView, i: usize) -> Value {
    let mut value = match &view.entries[i] {
        Entry::User { text, by } => json!({"kind": "user", "text": text, "by": by}),
        Entry::Answer { text, streaming } => {
            json!({"kind": "answer", "text": text, "streaming": streaming})
        }
        Entry::Tool(block) => json!({
            "kind": "tool",
            "call_id": block.call_id,
            "tool": block.tool,
            "summary": block.summary,
            "output": block.output,
            "state": match block.state {
                CallState::Requested => "requested",
                CallState::Waiting => "waiting",
                CallState::Running => "running",
                CallState::Done => "done",
            },
            "is_error": block.is_error,
            "duration_ms": block.duration_ms,
            "decision": block.decision,
        }),
        Entry::Note(text, kind) => json!({
            "kind": "note",
            "text": text,
            "note": match kind {
                NoteKind::Info => "info",
                NoteKind::Error => "error",
                NoteKind::Arrived => "arrived",
            },
        }),
        Entry::Turn(n) => json!({"kind": "turn", "turn": n}),
    };
    value["i"] = json!(i);
    value["seq"] = json!(view.place(i));
    value["rewound"] = json!(view.rewound.get(i).copied().unwrap_or(false));
    value
}

/// The session's figures and what runs.
pub fn status(view: &SessionView) -> Value {
    json!({
        "model": view.model,
        "context_window": view.context_window,
        "context_used": view.context_used,
        "tokens": view.session_tokens,
        "cost": view.session_cost,
        "currency": view.currency,
        "turn_open": view.turn_open,
        "activity": match &view.activity {
            None => Value::Null,
            Some(Activity::Model) => json!("model"),
            Some(Activity::Tool(tool)) => json!(format!("tool:{tool}")),
            Some(Activity::Waiting) => json!("waiting"),
        },
        "last_seq": view.last_seq,
    })
}

/// A question waiting for a person.
pub fn question(q: &pb::ApprovalRequested) -> Value {
    json!({
        "call_id": q.call_id,
        "tool": q.tool,
        "arguments": web_text(&q.arguments_json),
        "rule": web_text(&q.matched_rule),
        "network": q.network,
        "outcome_unknown": q.outcome_unknown,
        "approvers": agentry_client::text::approvers(q),
    })
}

/// Everything the page shows of the session: every entry, the figures and
/// the questions.
pub fn snapshot(view: &SessionView) -> Value {
    json!({
        "entries": (0..view.entries.len()).map(|i| entry(view, i)).collect::<Vec<_>>(),
        "status": status(view),
        "questions": view.questions.iter().map(question).collect::<Vec<_>>(),
    })
}

/// What changed since revision `since`: the entries changed or added, the
/// figures and the questions. An answer still streaming is sent as the
/// text added since `streamed` (its index and the bytes of it sent), which
/// is updated: a long answer watched by many pages costs each page only
/// its new text.
pub fn patch(view: &SessionView, since: u64, streamed: &mut Option<(usize, usize)>) -> Value {
    let changed: Vec<Value> = view
        .revisions
        .iter()
        .enumerate()
        .filter(|(_, r)| **r > since)
        .map(|(i, _)| match &view.entries[i] {
            Entry::Answer {
                text,
                streaming: true,
            } => {
                let sent = match *streamed {
                    Some((at, n)) if at == i && n <= text.len() && text.is_char_boundary(n) => {
                        Some(n)
                    }
                    _ => None,
                };
                *streamed = Some((i, text.len()));
                match sent {
                    Some(n) => json!({
                        "i": i,
                        "kind": "answer",
                        "append": &text[n..],
                        "streaming": true,
                    }),
                    None => entry(view, i),
                }
            }
            _ => {
                if streamed.is_some_and(|(at, _)| at == i) {
                    *streamed = None;
                }
                entry(view, i)
            }
        })
        .collect();
    json!({
        "entries": changed,
        "status": status(view),
        "questions": view.questions.iter().map(question).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use agentry_proto::sessions::v1::event::Kind;

    fn event(seq: u64, live: bool, kind: Kind) -> pb::Event {
        pb::Event {
            seq,
            live,
            kind: Some(kind),
            ..Default::default()
        }
    }

    fn delta(text: &str) -> pb::Event {
        event(
            1,
            true,
            Kind::ModelTextDelta(pb::ModelTextDelta { text: text.into() }),
        )
    }

    #[test]
    fn a_streaming_answer_is_sent_as_what_it_gained_then_whole_when_logged() {
        let mut view = SessionView::new("s", web_text);
        let mut streamed = None;
        view.apply(&event(
            1,
            false,
            Kind::UserMessage(pb::UserMessage {
                text: "hi".into(),
                ..Default::default()
            }),
        ));
        let mut since = view.revision();
        let mut step = |view: &mut SessionView, e: pb::Event| {
            view.apply(&e);
            let p = patch(view, since, &mut streamed);
            since = view.revision();
            p["entries"].as_array().unwrap().clone()
        };
        let first = step(&mut view, delta("Hel"));
        assert_eq!(first[0]["text"], "Hel", "the first piece whole: {first:?}");
        let more = step(&mut view, delta("lo, wörld"));
        assert_eq!(more[0]["append"], "lo, wörld");
        assert_eq!(more[0].get("text"), None);
        let logged = step(
            &mut view,
            event(
                2,
                false,
                Kind::ModelMessage(pb::ModelMessage {
                    text: "Hello, world.".into(),
                    ..Default::default()
                }),
            ),
        );
        let answer = logged.iter().find(|e| e["kind"] == "answer").unwrap();
        assert_eq!(answer["text"], "Hello, world.");
        assert_eq!(answer["streaming"], false);
    }

    #[test]
    fn text_loses_controls_and_direction_overrides_but_keeps_lines() {
        assert_eq!(
            web_text("a\u{1b}[31mb\nc\td\u{202E}e\u{0}"),
            "a[31mb\nc\tde"
        );
        assert_eq!(web_text("<script>x</script>"), "<script>x</script>");
    }
}
