//! Questions of a session's sub-agents, relayed: a sub-agent's approval
//! request reaches the chat of its parent session as a live event carrying
//! the sub-agent's session id; the chat asks it under an id naming both
//! ([`question_id`]) and sends the answer where it belongs ([`answer_to`]).

use agentry_proto::sessions::v1 as pb;

/// Separates a sub-agent's session from its call in the id a chat keeps
/// for a relayed question (a call id alone may be the same in both
/// sessions).
pub const RELAYED: char = '\u{1f}';

/// The id a chat keeps for the question of call `call_id` of `session_id`
/// (a sub-agent's, relayed; `own` is the chat's session).
pub fn question_id(own: &str, session_id: &str, call_id: &str) -> String {
    if session_id.is_empty() || session_id == own {
        call_id.to_string()
    } else {
        format!("{session_id}{RELAYED}{call_id}")
    }
}

/// Where the answer to the question kept as `id` goes: the session and the
/// call.
pub fn answer_to(own: &str, id: &str) -> (String, String) {
    match id.split_once(RELAYED) {
        Some((session, call)) => (session.to_string(), call.to_string()),
        None => (own.to_string(), id.to_string()),
    }
}

/// Whether an event of a session's stream is a sub-agent's, relayed.
pub fn is_relayed(own: &str, event: &pb::Event) -> bool {
    event.live && !event.session_id.is_empty() && event.session_id != own
}

/// What a sub-agent's relayed event means to the chat of session `own`:
/// its questions are asked there under an id naming the sub-agent's session
/// ([`question_id`]; a call id alone may be the same in both sessions).
#[derive(Debug, Clone, PartialEq)]
pub enum Relayed {
    /// A question, its `call_id` the question's id.
    Asked(pb::ApprovalRequested),
    /// The question with this id was answered (here or elsewhere).
    Answered(String),
    /// Nothing for the chat.
    Nothing,
}

/// The meaning of `event` for the chat of `own` when it is a sub-agent's,
/// relayed; `None` for the session's own events.
pub fn relayed(own: &str, event: &pb::Event) -> Option<Relayed> {
    use pb::event::Kind;
    if !is_relayed(own, event) {
        return None;
    }
    let id = |call: &str| question_id(own, &event.session_id, call);
    Some(match &event.kind {
        Some(Kind::ApprovalRequested(a)) => Relayed::Asked(pb::ApprovalRequested {
            call_id: id(&a.call_id),
            ..a.clone()
        }),
        Some(Kind::ToolCallState(s)) if s.phase != pb::ToolCallPhase::AwaitingApproval as i32 => {
            Relayed::Answered(id(&s.call_id))
        }
        _ => Relayed::Nothing,
    })
}
