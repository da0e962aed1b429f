//! What an editor is told of a session: the shared view's changes as ACP
//! `session/update`s. [`Sent`] remembers what the editor has been sent of
//! each entry, so an answer goes out as the text added since, a tool call
//! as one `tool_call` and then `tool_call_update`s, and the plan when it
//! changes.

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus, SessionUpdate,
    ToolCall, ToolCallContent, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use agentry_client::view::{CallState, Entry, NoteKind, PlanItem, SessionView, ToolBlock};
use agentry_proto::sessions::v1::PlanStepStatus;

/// What the editor was sent of one entry.
#[derive(Debug, Clone, Default)]
struct Shown {
    /// The entry's revision when it was last looked at.
    revision: u64,
    /// Of an answer: the text sent.
    text: String,
    /// Of a tool call: the status sent (None: not sent).
    status: Option<ToolCallStatus>,
}

/// What the editor has been sent of one session's view.
#[derive(Debug, Default)]
pub struct Sent {
    shown: Vec<Shown>,
    plan: Vec<PlanItem>,
    /// Messages the editor sent itself (and shows): not echoed back.
    own: Vec<String>,
}

impl Sent {
    /// The editor shows this message itself (a prompt it sent): its entry
    /// is not sent back to it.
    pub fn expect_own(&mut self, text: &str) {
        self.own.push(text.to_string());
    }

    /// The editor's message was not sent after all.
    pub fn forget_own(&mut self, text: &str) {
        if let Some(at) = self.own.iter().rposition(|own| own == text) {
            self.own.remove(at);
        }
    }

    /// The updates that bring the editor to what `view` shows now.
    pub fn updates(&mut self, view: &SessionView) -> Vec<SessionUpdate> {
        let mut out = Vec::new();
        for (i, entry) in view.entries.iter().enumerate() {
            let revision = view.revisions.get(i).copied().unwrap_or_default();
            if i >= self.shown.len() {
                self.shown.push(Shown::default());
            }
            let shown = &mut self.shown[i];
            let new = shown.revision == 0;
            if !new && shown.revision == revision {
                continue;
            }
            shown.revision = revision;
            match entry {
                Entry::User { text, .. } if new => {
                    if let Some(at) = self.own.iter().position(|own| own == text) {
                        self.own.remove(at);
                    } else {
                        out.push(SessionUpdate::UserMessageChunk(chunk(text)));
                    }
                }
                Entry::Answer { text, .. } => {
                    // Only text added to what was sent; an answer settled
                    // to other words than streamed keeps what was sent.
                    if let Some(added) = text.strip_prefix(shown.text.as_str())
                        && !added.is_empty()
                    {
                        out.push(SessionUpdate::AgentMessageChunk(chunk(added)));
                        shown.text = text.clone();
                    }
                }
                Entry::Tool(block) => {
                    let status = status(block);
                    if shown.status.is_none() {
                        out.push(SessionUpdate::ToolCall(tool_call(block, status)));
                    } else if shown.status != Some(status) {
                        let mut fields = ToolCallUpdateFields::new().status(status);
                        if status_is_final(status) && !block.output.is_empty() {
                            fields = fields.content(vec![output(block)]);
                        }
                        out.push(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
                            block.call_id.clone(),
                            fields,
                        )));
                    }
                    shown.status = Some(status);
                }
                // Something went wrong, or arrived by itself (a reminder):
                // said in the answer's flow, on a line of its own.
                Entry::Note(text, NoteKind::Error | NoteKind::Arrived) if new => {
                    out.push(SessionUpdate::AgentMessageChunk(chunk(&format!(
                        "\n\n{}\n\n",
                        text.trim()
                    ))));
                }
                _ => {}
            }
        }
        if view.plan != self.plan {
            self.plan = view.plan.clone();
            if !self.plan.is_empty() {
                let entries = self
                    .plan
                    .iter()
                    .map(|step| {
                        PlanEntry::new(
                            step.title.clone(),
                            PlanEntryPriority::Medium,
                            plan_status(step.status),
                        )
                    })
                    .collect();
                out.push(SessionUpdate::Plan(Plan::new(entries)));
            }
        }
        out
    }
}

fn chunk(text: &str) -> ContentChunk {
    ContentChunk::new(ContentBlock::from(text.to_string()))
}

/// A call's status as ACP names it.
pub fn status(block: &ToolBlock) -> ToolCallStatus {
    match block.state {
        CallState::Requested | CallState::Waiting => ToolCallStatus::Pending,
        CallState::Running => ToolCallStatus::InProgress,
        CallState::Done if block.is_error => ToolCallStatus::Failed,
        CallState::Done => ToolCallStatus::Completed,
    }
}

fn status_is_final(status: ToolCallStatus) -> bool {
    matches!(status, ToolCallStatus::Completed | ToolCallStatus::Failed)
}

fn output(block: &ToolBlock) -> ToolCallContent {
    ToolCallContent::from(block.output.clone())
}

/// The title a call is shown with: the tool and its arguments, short.
pub fn title(tool: &str, summary: &str) -> String {
    if summary.is_empty() {
        tool.to_string()
    } else {
        format!("{tool} {summary}")
    }
}

fn tool_call(block: &ToolBlock, status: ToolCallStatus) -> ToolCall {
    let mut call = ToolCall::new(block.call_id.clone(), title(&block.tool, &block.summary))
        .kind(kind(&block.tool))
        .status(status);
    if status_is_final(status) && !block.output.is_empty() {
        call = call.content(vec![output(block)]);
    }
    call
}

/// What kind of thing a tool does, for the editor's icon.
pub fn kind(tool: &str) -> ToolKind {
    match tool {
        "bash" => ToolKind::Execute,
        "read_file" | "list_dir" => ToolKind::Read,
        "write_file" | "edit_file" => ToolKind::Edit,
        "grep" | "glob" | "recall" => ToolKind::Search,
        t if t.starts_with("web_") => ToolKind::Fetch,
        _ => ToolKind::Other,
    }
}

fn plan_status(status: PlanStepStatus) -> PlanEntryStatus {
    match status {
        PlanStepStatus::Pending => PlanEntryStatus::Pending,
        PlanStepStatus::InProgress => PlanEntryStatus::InProgress,
        // A failed step is over; the revised plan says what replaces it.
        PlanStepStatus::Completed | PlanStepStatus::Failed => PlanEntryStatus::Completed,
    }
}

/// Text from the session for an editor: control characters other than
/// line breaks and tabs are dropped (a terminal-based client would obey
/// them), and so are the invisible ones that reorder or hide text
/// (bidirectional overrides and isolates, zero-width characters), which
/// could make a permission request read as something else.
pub fn editor_text(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_control() || matches!(c, '\n' | '\t'))
        .filter(|c| {
            !matches!(c,
                '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}'
                    | '\u{FEFF}')
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use agentry_proto::sessions::v1::{self as pb, event::Kind};

    fn event(seq: u64, kind: Kind) -> pb::Event {
        pb::Event {
            seq,
            turn_id: "t1".into(),
            kind: Some(kind),
            ..Default::default()
        }
    }

    fn delta(text: &str) -> pb::Event {
        pb::Event {
            live: true,
            kind: Some(Kind::ModelTextDelta(pb::ModelTextDelta {
                text: text.into(),
            })),
            ..Default::default()
        }
    }

    fn texts(updates: &[SessionUpdate]) -> Vec<String> {
        updates
            .iter()
            .map(|u| serde_json::to_string(u).unwrap())
            .collect()
    }

    #[test]
    fn an_answer_goes_out_as_the_text_added_and_own_prompts_are_not_echoed() {
        let mut view = SessionView::new("s", editor_text);
        let mut sent = Sent::default();
        sent.expect_own("hello");
        view.apply(&event(
            1,
            Kind::UserMessage(pb::UserMessage {
                text: "hello".into(),
                ..Default::default()
            }),
        ));
        assert!(
            sent.updates(&view).is_empty(),
            "the editor shows its own prompt"
        );
        view.apply(&delta("Hel"));
        view.apply(&delta("lo\u{1b}[2J there"));
        let out = texts(&sent.updates(&view));
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].contains("\"agent_message_chunk\""), "{out:?}");
        assert!(out[0].contains("Hello[2J there"), "escape dropped: {out:?}");
        assert_eq!(editor_text("rm\u{202E}txt.exe\u{200B}"), "rmtxt.exe");
        view.apply(&delta("!"));
        view.apply(&event(
            2,
            Kind::ModelMessage(pb::ModelMessage {
                text: "Hello[2J there!".into(),
                ..Default::default()
            }),
        ));
        let out = texts(&sent.updates(&view));
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(
            out[0].contains("\"text\":\"!\""),
            "only what was added: {out:?}"
        );
        assert!(sent.updates(&view).is_empty(), "nothing new");
        // Another person's message is shown.
        view.apply(&event(
            3,
            Kind::UserMessage(pb::UserMessage {
                text: "from the console".into(),
                ..Default::default()
            }),
        ));
        let out = texts(&sent.updates(&view));
        assert!(out[0].contains("user_message_chunk"), "{out:?}");
    }

    #[test]
    fn a_tool_call_is_announced_once_then_updated_with_its_output_when_done() {
        let mut view = SessionView::new("s", editor_text);
        let mut sent = Sent::default();
        view.apply(&event(
            1,
            Kind::ToolCallRequested(pb::ToolCallRequested {
                call_id: "c1".into(),
                tool: "bash".into(),
                arguments_json: r#"{"command":"ls"}"#.into(),
                ..Default::default()
            }),
        ));
        let out = texts(&sent.updates(&view));
        assert_eq!(out.len(), 1);
        assert!(
            out[0].contains("\"sessionUpdate\":\"tool_call\""),
            "{out:?}"
        );
        assert!(out[0].contains("\"kind\":\"execute\""), "{out:?}");
        // Pending is the status a call starts in (left out on the wire).
        assert!(!out[0].contains("\"status\""), "{out:?}");
        view.apply(&event(
            2,
            Kind::ToolCallState(pb::ToolCallState {
                call_id: "c1".into(),
                phase: pb::ToolCallPhase::Executing as i32,
                ..Default::default()
            }),
        ));
        let out = texts(&sent.updates(&view));
        assert!(out[0].contains("\"status\":\"in_progress\""), "{out:?}");
        view.apply(&event(
            3,
            Kind::ToolOutputChunk(pb::ToolOutputChunk {
                call_id: "c1".into(),
                text: "a\n".into(),
                ..Default::default()
            }),
        ));
        assert!(
            sent.updates(&view).is_empty(),
            "output goes with the result"
        );
        view.apply(&event(
            4,
            Kind::ToolResult(pb::ToolResult {
                call_id: "c1".into(),
                tool: "bash".into(),
                output: "a\nb\n".into(),
                is_error: true,
                ..Default::default()
            }),
        ));
        let out = texts(&sent.updates(&view));
        assert!(out[0].contains("\"status\":\"failed\""), "{out:?}");
        assert!(out[0].contains("a\\nb\\n"), "{out:?}");
    }

    #[test]
    fn the_plan_is_sent_whole_when_a_step_changes() {
        let mut view = SessionView::new("s", editor_text);
        let mut sent = Sent::default();
        let step = |title: &str| pb::PlanStep {
            title: title.into(),
            ..Default::default()
        };
        view.apply(&event(
            1,
            Kind::PlanSubmitted(pb::PlanSubmitted {
                steps: vec![step("read"), step("fix")],
                revision: 1,
                ..Default::default()
            }),
        ));
        let out = texts(&sent.updates(&view));
        let plan: Vec<&String> = out.iter().filter(|u| u.contains("\"plan\"")).collect();
        assert_eq!(plan.len(), 1, "{out:?}");
        assert!(plan[0].contains("\"pending\""), "{out:?}");
        view.apply(&event(
            2,
            Kind::PlanStepUpdated(pb::PlanStepUpdated {
                index: 0,
                status: pb::PlanStepStatus::Completed as i32,
                ..Default::default()
            }),
        ));
        let out = texts(&sent.updates(&view));
        let plan: Vec<&String> = out.iter().filter(|u| u.contains("\"plan\"")).collect();
        assert!(plan[0].contains("\"completed\""), "{out:?}");
    }
}
