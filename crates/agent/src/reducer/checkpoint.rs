//! Checkpoints: an idle session's state, written beside its log so that
//! loading the session reads the events after it instead of the whole log.
//!
//! A checkpoint is only a shortcut. Restoring one and applying the events
//! after it gives exactly the state that replaying the whole log gives (the
//! reducer's tests check it after every step of every scenario); where that
//! cannot hold, [`SessionState::resumed`] says so and the caller replays the
//! log from its start:
//! - a later rewind goes back to before the checkpoint (the conversation it
//!   holds is no longer the effective one);
//! - the checkpoint was written under other settings that the fold reads
//!   (whether the model takes images, the model prices);
//! - it is of a format this build does not write, or does not decode.
//!
//! Only an idle state is written (no turn, nothing parked or queued): what
//! a running turn holds stays in the log's events after the checkpoint.

use super::*;
use prost::Message as _;

/// The encoding of `pb::Checkpoint::state` this build writes and reads.
pub const CHECKPOINT_FORMAT: u32 = 1;

impl SessionState {
    /// The state as a checkpoint after its last event, when the session is
    /// idle with nothing parked or queued; `None` otherwise.
    pub fn checkpoint(&self) -> Option<pb::Checkpoint> {
        if self.phase != Phase::Idle
            || self.turn.is_some()
            || self.parked.is_some()
            || !self.steering.is_empty()
            || self.last_seq == 0
        {
            return None;
        }
        let history = self
            .history
            .iter()
            .zip(&self.history_spans)
            .map(|(message, &(first_seq, last_seq))| pb::CheckpointMessage {
                first_seq,
                last_seq,
                message: Some(message_to_proto(message)),
            })
            .collect();
        let state = pb::SessionCheckpoint {
            settings: self.replay_settings(),
            history,
            session_rules: self
                .session_rules
                .iter()
                .map(|rule| pb::CheckpointRule {
                    tool: rule.tool.clone(),
                    command: rule.command.clone(),
                    path: rule.path.clone(),
                })
                .collect(),
            catalog: Some(self.catalog.to_event()),
            delivered_firings: self.delivered_firings.iter().cloned().collect(),
            turn_scheduled: self.turn_scheduled,
            failed_calls: self.failed_calls.iter().cloned().collect(),
            last_mcp_updates: self
                .last_mcp_updates
                .iter()
                .map(|((server, uri), update)| pb::CheckpointMcpUpdate {
                    server: server.clone(),
                    uri: uri.clone(),
                    update: update.clone(),
                })
                .collect(),
            limits: Some(self.limits),
            spent_tokens: self.spent_tokens,
            spent_cost: self.spent_cost,
            instructions: self.instructions.clone(),
            model: self.model.clone().unwrap_or_default(),
        };
        Some(pb::Checkpoint {
            seq: self.last_seq,
            format: CHECKPOINT_FORMAT,
            state: state.encode_to_vec(),
        })
    }

    /// This fresh state (policy, view and limits from the settings)
    /// brought to `checkpoint`, then `after` (the log's events from the
    /// one after the checkpoint on) applied: what replaying the whole log
    /// gives. `None` when the checkpoint cannot stand for the log's start
    /// (see the module's documentation): replay the whole log instead.
    pub fn resumed(self, checkpoint: &pb::Checkpoint, after: &[pb::Event]) -> Option<Self> {
        if after.first().is_some_and(|e| e.seq != checkpoint.seq + 1) {
            return None;
        }
        let rewound_past = after
            .iter()
            .any(|e| matches!(&e.kind, Some(Kind::SessionRewound(r)) if r.to_seq < checkpoint.seq));
        if rewound_past {
            return None;
        }
        Some(self.restored(checkpoint)?.replayed(after))
    }

    /// This fresh state brought to `checkpoint`, or `None` when it cannot
    /// be used here.
    fn restored(mut self, checkpoint: &pb::Checkpoint) -> Option<Self> {
        if checkpoint.format != CHECKPOINT_FORMAT || checkpoint.seq == 0 {
            return None;
        }
        let state = pb::SessionCheckpoint::decode(checkpoint.state.as_slice()).ok()?;
        if state.settings != self.replay_settings() {
            return None;
        }
        let mut history = Vec::with_capacity(state.history.len());
        let mut spans = Vec::with_capacity(state.history.len());
        for entry in state.history {
            history.push(message_from_proto(entry.message?));
            spans.push((entry.first_seq, entry.last_seq));
        }
        self.history = history;
        self.history_spans = spans;
        self.history_tokens = TokenMemo::default();
        self.last_seq = checkpoint.seq;
        self.session_rules = state
            .session_rules
            .into_iter()
            .map(|rule| SessionRule {
                tool: rule.tool,
                command: rule.command,
                path: rule.path,
            })
            .collect();
        self.catalog = self
            .view
            .0
            .catalogs
            .shared_from_event(&state.catalog.unwrap_or_default());
        self.delivered_firings = state.delivered_firings.into_iter().collect();
        self.turn_scheduled = state.turn_scheduled;
        self.failed_calls = state.failed_calls.into_iter().collect();
        self.last_mcp_updates = state
            .last_mcp_updates
            .into_iter()
            .map(|u| ((u.server, u.uri), u.update))
            .collect();
        self.limits = state.limits.unwrap_or_default();
        self.spent_tokens = state.spent_tokens;
        self.spent_cost = state.spent_cost;
        self.instructions = state.instructions;
        self.model = (!state.model.is_empty()).then_some(state.model);
        Some(self)
    }

    /// What the fold reads besides the log: a checkpoint made under other
    /// values is not used.
    fn replay_settings(&self) -> String {
        format!(
            "images={} price={:?}",
            self.view.0.images, self.view.0.price
        )
    }
}

fn message_to_proto(message: &Message) -> pb::checkpoint_message::Message {
    use pb::checkpoint_message::Message as M;
    match message {
        Message::System { content } => M::System(pb::CheckpointText {
            content: content.clone(),
        }),
        Message::User { content, images } => M::User(pb::CheckpointUser {
            content: content.clone(),
            images: images
                .iter()
                .map(|image| pb::Image {
                    path: String::new(),
                    mime: image.mime.clone(),
                    data: image.data.to_vec(),
                })
                .collect(),
        }),
        Message::Assistant {
            content,
            tool_calls,
        } => M::Assistant(pb::CheckpointAssistant {
            content: content.clone(),
            tool_calls: tool_calls
                .iter()
                .map(|call| pb::CheckpointToolCall {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                })
                .collect(),
        }),
        Message::Tool {
            tool_call_id,
            content,
        } => M::Tool(pb::CheckpointToolResult {
            tool_call_id: tool_call_id.clone(),
            content: content.clone(),
        }),
    }
}

fn message_from_proto(message: pb::checkpoint_message::Message) -> Message {
    use pb::checkpoint_message::Message as M;
    match message {
        M::System(m) => Message::System { content: m.content },
        M::User(m) => Message::User {
            content: m.content,
            images: m
                .images
                .into_iter()
                .map(|image| agentry_llm::Image {
                    mime: image.mime,
                    data: Arc::from(image.data),
                })
                .collect(),
        },
        M::Assistant(m) => Message::Assistant {
            content: m.content,
            tool_calls: m
                .tool_calls
                .into_iter()
                .map(|call| ToolCall {
                    id: call.id,
                    name: call.name,
                    arguments: call.arguments,
                })
                .collect(),
        },
        M::Tool(m) => Message::Tool {
            tool_call_id: m.tool_call_id,
            content: m.content,
        },
    }
}
