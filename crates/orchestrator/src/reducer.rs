//! The session state machine: a pure reducer with no I/O.
//!
//! `step(input)` decides which events to record and which effects to run;
//! the state itself only ever changes by [`SessionState::apply`]ing an event,
//! so replaying a session's log rebuilds exactly the state that wrote it.
//!
//! States: `Idle → Generate → UseTools → Generate … → Idle` (the turn's
//! cleanup is the `TurnFinished` event that returns it to `Idle`).

use agentry_llm::{Completion, Message, ToolCall};
use agentry_proto::sessions::v1::{self as pb, ErrorSource, TokenUsage, TurnOutcome, event::Kind};
use std::collections::VecDeque;

/// Where a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No turn running; waiting for input.
    Idle,
    /// Waiting for the model's response.
    Generate,
    /// Running the tool calls of the last model response, in order.
    UseTools,
}

/// The running turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// The turn's id.
    pub id: String,
    /// Model responses received so far.
    pub steps: u32,
    /// Token usage so far.
    pub usage: TokenUsage,
    /// Tool calls requested and not yet answered, in order.
    pub pending: VecDeque<ToolCall>,
    /// The text of the last model response.
    pub last_text: String,
}

/// A session's state: its phase, its running turn, and the conversation as
/// the model sees it (a projection of the log).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionState {
    /// Where the session is.
    pub phase: Phase,
    /// The running turn, when not idle.
    pub turn: Option<Turn>,
    /// The conversation (without the system message).
    pub history: Vec<Message>,
    /// Model calls allowed per turn.
    pub max_steps: u32,
}

/// Something that happened, fed to [`SessionState::step`].
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The person sent a message.
    UserMessage {
        /// The id for the turn it starts.
        turn_id: String,
        /// The text.
        text: String,
    },
    /// The model streamed text.
    ModelDelta(String),
    /// The model finished its response.
    ModelDone(Completion),
    /// The model call failed.
    ModelFailed {
        /// What went wrong, for people.
        message: String,
        /// Whether a retry may succeed.
        retryable: bool,
    },
    /// A running tool produced output.
    ToolChunk {
        /// The call.
        call_id: String,
        /// Which stream.
        stream: pb::OutputStream,
        /// The text.
        text: String,
    },
    /// A tool call finished.
    ToolDone(pb::ToolResult),
    /// The person asked to stop the turn.
    Cancel {
        /// Why, if they said.
        reason: String,
    },
    /// The session was loaded with a turn that never finished (the
    /// orchestrator stopped mid-turn): close it.
    Interrupted,
}

/// Work for the effect runner.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Append these events (in order) to the log, then publish them.
    Record {
        /// The turn they belong to.
        turn_id: String,
        /// The events.
        events: Vec<Kind>,
    },
    /// Call the model with this conversation (the runner adds the system
    /// message and the tool definitions).
    CallModel {
        /// The conversation.
        history: Vec<Message>,
    },
    /// Run a tool call.
    RunTool(ToolCall),
    /// Stop whatever model call or tool call is in flight.
    AbortInFlight,
}

/// An input that does not fit the session's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A message arrived while a turn runs.
    #[error("a turn is already running in this session; wait for it to finish or cancel it")]
    Busy,
    /// A cancel arrived with no turn running.
    #[error("no turn is running in this session")]
    NothingToCancel,
    /// The message is empty.
    #[error("the message is empty")]
    EmptyMessage,
    /// An outcome arrived that the state does not expect (a stale result).
    #[error("unexpected {input} while the session is {phase:?}")]
    Unexpected {
        /// The input's name.
        input: &'static str,
        /// The phase.
        phase: Phase,
    },
}

fn add_usage(total: &mut TokenUsage, u: &TokenUsage) {
    total.prompt_tokens += u.prompt_tokens;
    total.completion_tokens += u.completion_tokens;
    total.total_tokens += u.total_tokens;
}

impl SessionState {
    /// An idle session with an empty conversation.
    pub fn new(max_steps: u32) -> Self {
        SessionState {
            phase: Phase::Idle,
            turn: None,
            history: Vec::new(),
            max_steps: max_steps.max(1),
        }
    }

    /// Rebuilds the state from a session's stored events.
    pub fn replay<'a>(max_steps: u32, events: impl IntoIterator<Item = &'a pb::Event>) -> Self {
        let mut state = SessionState::new(max_steps);
        for event in events {
            if let Some(kind) = &event.kind {
                state.apply(&event.turn_id, kind);
            }
        }
        state
    }

    /// Whether no turn is running.
    pub fn is_idle(&self) -> bool {
        self.phase == Phase::Idle
    }

    /// The running turn's id, if any.
    pub fn turn_id(&self) -> Option<&str> {
        self.turn.as_ref().map(|t| t.id.as_str())
    }

    /// Folds one event into the state. The only place the state changes.
    pub fn apply(&mut self, turn_id: &str, kind: &Kind) {
        match kind {
            Kind::UserMessage(m) => {
                self.history.push(Message::User {
                    content: m.text.clone(),
                });
                self.turn = Some(Turn {
                    id: turn_id.to_string(),
                    steps: 0,
                    usage: TokenUsage::default(),
                    pending: VecDeque::new(),
                    last_text: String::new(),
                });
                self.phase = Phase::Generate;
            }
            Kind::ModelMessage(m) => {
                self.history.push(Message::Assistant {
                    content: m.text.clone(),
                    tool_calls: Vec::new(),
                });
                if let Some(turn) = &mut self.turn {
                    turn.steps += 1;
                    if let Some(u) = &m.usage {
                        add_usage(&mut turn.usage, u);
                    }
                    turn.last_text = m.text.clone();
                }
            }
            Kind::ToolCallRequested(c) => {
                let call = ToolCall {
                    id: c.call_id.clone(),
                    name: c.tool.clone(),
                    arguments: c.arguments_json.clone(),
                };
                if let Some(Message::Assistant { tool_calls, .. }) = self.history.last_mut() {
                    tool_calls.push(call.clone());
                }
                if let Some(turn) = &mut self.turn {
                    turn.pending.push_back(call);
                }
                self.phase = Phase::UseTools;
            }
            Kind::ToolResult(r) => {
                self.history.push(Message::Tool {
                    tool_call_id: r.call_id.clone(),
                    content: r.output.clone(),
                });
                if let Some(turn) = &mut self.turn {
                    // Only the first match: a response may repeat an id.
                    if let Some(i) = turn.pending.iter().position(|c| c.id == r.call_id) {
                        turn.pending.remove(i);
                    }
                    if turn.pending.is_empty() {
                        self.phase = Phase::Generate;
                    }
                }
            }
            Kind::TurnFinished(_) => {
                self.turn = None;
                self.phase = Phase::Idle;
            }
            Kind::ModelTextDelta(_)
            | Kind::ApprovalRequested(_)
            | Kind::ApprovalDecided(_)
            | Kind::ToolOutputChunk(_)
            | Kind::ReminderDue(_)
            | Kind::Error(_)
            | Kind::CancelRequested(_) => {}
        }
    }

    /// Records `events` (applying each) and returns the Record effect.
    fn record(&mut self, turn_id: &str, events: Vec<Kind>) -> Effect {
        for kind in &events {
            self.apply(turn_id, kind);
        }
        Effect::Record {
            turn_id: turn_id.to_string(),
            events,
        }
    }

    fn finish(&self, outcome: TurnOutcome, message: String) -> Kind {
        let (steps, usage) = self
            .turn
            .as_ref()
            .map(|t| (t.steps, t.usage))
            .unwrap_or_default();
        Kind::TurnFinished(pb::TurnFinished {
            outcome: outcome as i32,
            message,
            steps,
            usage: Some(usage),
        })
    }

    /// What to do after the last tool result of a step: call the model
    /// again, or stop at the step limit.
    fn after_tools(&mut self, turn_id: &str) -> Vec<Effect> {
        let steps = self.turn.as_ref().map(|t| t.steps).unwrap_or_default();
        if steps >= self.max_steps {
            let finished = self.finish(
                TurnOutcome::StepLimit,
                format!(
                    "stopped after {steps} model calls (the step limit); send a message to continue"
                ),
            );
            vec![self.record(turn_id, vec![finished])]
        } else {
            vec![Effect::CallModel {
                history: self.history.clone(),
            }]
        }
    }

    /// Takes one input; returns the effects to run, or why the input does
    /// not fit. A refused input leaves the state unchanged.
    pub fn step(&mut self, input: Input) -> Result<Vec<Effect>, Refusal> {
        let phase = self.phase;
        let turn_id = self.turn_id().unwrap_or_default().to_string();
        match (phase, input) {
            (Phase::Idle, Input::UserMessage { turn_id, text }) => {
                if text.trim().is_empty() {
                    return Err(Refusal::EmptyMessage);
                }
                let record =
                    self.record(&turn_id, vec![Kind::UserMessage(pb::UserMessage { text })]);
                Ok(vec![
                    record,
                    Effect::CallModel {
                        history: self.history.clone(),
                    },
                ])
            }
            (Phase::Generate | Phase::UseTools, Input::UserMessage { .. }) => Err(Refusal::Busy),
            (Phase::Generate, Input::ModelDelta(text)) => Ok(vec![self.record(
                &turn_id,
                vec![Kind::ModelTextDelta(pb::ModelTextDelta { text })],
            )]),
            (Phase::Generate, Input::ModelDone(c)) => {
                let step = self.turn.as_ref().map(|t| t.steps).unwrap_or_default() + 1;
                let mut events = vec![Kind::ModelMessage(pb::ModelMessage {
                    text: c.text.clone(),
                    finish_reason: c.finish_reason.clone(),
                    usage: c.usage.map(|u| TokenUsage {
                        prompt_tokens: u.prompt_tokens,
                        completion_tokens: u.completion_tokens,
                        total_tokens: u.total_tokens,
                    }),
                    model: c.model.clone(),
                    step,
                })];
                events.extend(c.tool_calls.iter().map(|call| {
                    Kind::ToolCallRequested(pb::ToolCallRequested {
                        call_id: call.id.clone(),
                        tool: call.name.clone(),
                        arguments_json: call.arguments.clone(),
                    })
                }));
                let mut effects = vec![self.record(&turn_id, events)];
                match c.tool_calls.first() {
                    Some(first) => effects.push(Effect::RunTool(first.clone())),
                    None => {
                        let finished = self.finish(TurnOutcome::Completed, c.text);
                        effects.push(self.record(&turn_id, vec![finished]));
                    }
                }
                Ok(effects)
            }
            (Phase::Generate, Input::ModelFailed { message, retryable }) => {
                let error = Kind::Error(pb::Error {
                    source: ErrorSource::Model as i32,
                    message: message.clone(),
                    retryable,
                });
                let finished = self.finish(TurnOutcome::Failed, message);
                Ok(vec![self.record(&turn_id, vec![error, finished])])
            }
            (
                Phase::UseTools,
                Input::ToolChunk {
                    call_id,
                    stream,
                    text,
                },
            ) => {
                let running = self.turn.as_ref().and_then(|t| t.pending.front());
                if running.map(|c| c.id.as_str()) != Some(call_id.as_str()) {
                    return Err(Refusal::Unexpected {
                        input: "tool output",
                        phase,
                    });
                }
                Ok(vec![self.record(
                    &turn_id,
                    vec![Kind::ToolOutputChunk(pb::ToolOutputChunk {
                        call_id,
                        stream: stream as i32,
                        text,
                    })],
                )])
            }
            (Phase::UseTools, Input::ToolDone(result)) => {
                let expected = self
                    .turn
                    .as_ref()
                    .and_then(|t| t.pending.front())
                    .map(|c| c.id.clone());
                if expected.as_deref() != Some(result.call_id.as_str()) {
                    return Err(Refusal::Unexpected {
                        input: "tool result",
                        phase,
                    });
                }
                let mut effects = vec![self.record(&turn_id, vec![Kind::ToolResult(result)])];
                let next = self.turn.as_ref().and_then(|t| t.pending.front()).cloned();
                match next {
                    Some(call) => effects.push(Effect::RunTool(call)),
                    None => effects.extend(self.after_tools(&turn_id)),
                }
                Ok(effects)
            }
            (Phase::Generate | Phase::UseTools, Input::Cancel { reason }) => {
                let mut events = vec![Kind::CancelRequested(pb::CancelRequested { reason })];
                events.extend(self.close_pending("cancelled before it finished"));
                events.push(self.finish(TurnOutcome::Cancelled, "cancelled".to_string()));
                Ok(vec![Effect::AbortInFlight, self.record(&turn_id, events)])
            }
            (Phase::Idle, Input::Cancel { .. }) => Err(Refusal::NothingToCancel),
            (Phase::Generate | Phase::UseTools, Input::Interrupted) => {
                let message =
                    "the orchestrator stopped during this turn; its outcome is unknown".to_string();
                let mut events = vec![Kind::Error(pb::Error {
                    source: ErrorSource::Orchestrator as i32,
                    message: message.clone(),
                    retryable: true,
                })];
                events.extend(self.close_pending(
                    "the orchestrator stopped while this call was pending; it may or may not have run",
                ));
                events.push(self.finish(TurnOutcome::Failed, message));
                Ok(vec![self.record(&turn_id, events)])
            }
            (Phase::Idle, Input::Interrupted) => Ok(Vec::new()),
            (
                Phase::Idle | Phase::UseTools,
                Input::ModelDelta(_) | Input::ModelDone(_) | Input::ModelFailed { .. },
            ) => Err(Refusal::Unexpected {
                input: "model output",
                phase,
            }),
            (Phase::Idle | Phase::Generate, Input::ToolChunk { .. } | Input::ToolDone(_)) => {
                Err(Refusal::Unexpected {
                    input: "tool output",
                    phase,
                })
            }
        }
    }

    /// Error results for every pending tool call, so the conversation never
    /// holds a call without an answer.
    fn close_pending(&self, why: &str) -> Vec<Kind> {
        self.turn
            .as_ref()
            .map(|t| {
                t.pending
                    .iter()
                    .map(|c| {
                        Kind::ToolResult(pb::ToolResult {
                            call_id: c.id.clone(),
                            tool: c.name.clone(),
                            output: format!("error: {why}"),
                            is_error: true,
                            ..Default::default()
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}
