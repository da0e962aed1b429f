//! The session state machine: a pure reducer with no I/O.
//!
//! `step(input)` decides which events to record and which effects to run;
//! the state itself only ever changes by [`SessionState::apply`]ing an event,
//! so replaying a session's log rebuilds exactly the state that wrote it.
//!
//! Turn states: `Idle → Generate → UseTools ⇄ (awaiting approval) → Generate
//! … → Idle`; the turn's cleanup is the `TurnFinished` event that returns it
//! to `Idle`. Each tool call has its own forward-only lifecycle:
//! `Validating → AwaitingApproval → Scheduled → Executing → Success | Error |
//! Cancelled`, every change recorded as a `ToolCallState` event.

use crate::plan::{Plan, PlanCall, Stage};
use agentry_llm::{Completion, Message, ToolCall};
use agentry_policy::{Decision, Policy, SessionRule, session_rules_for};
use agentry_proto::sessions::v1::{
    self as pb, ApprovalDecision, ApprovalMode, ErrorSource, PlanStepStatus, TokenUsage,
    ToolCallPhase, TurnOutcome, event::Kind,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, LazyLock};

/// Where a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No turn running; waiting for input.
    Idle,
    /// Waiting for the model's response.
    Generate,
    /// Handling the tool calls of the last model response.
    UseTools,
}

/// A tool's flags, as the tool runner describes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ToolFlags {
    /// It changes nothing.
    pub read_only: bool,
    /// It may run concurrently with other parallel-safe calls.
    pub parallel_safe: bool,
}

/// The lifecycle state of one tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallPhase {
    /// Requested; being checked.
    Validating,
    /// Waiting for a person.
    AwaitingApproval,
    /// Allowed; waiting to run.
    Scheduled,
    /// Running on a tool runner.
    Executing,
    /// Finished without error.
    Success,
    /// Failed, denied, or its outcome is unknown.
    Error,
    /// Stopped by a cancel.
    Cancelled,
}

impl CallPhase {
    fn rank(self) -> u8 {
        match self {
            CallPhase::Validating => 0,
            CallPhase::AwaitingApproval => 1,
            CallPhase::Scheduled => 2,
            CallPhase::Executing => 3,
            CallPhase::Success | CallPhase::Error | CallPhase::Cancelled => 4,
        }
    }

    /// Whether the call is over.
    pub fn is_terminal(self) -> bool {
        self.rank() == 4
    }

    /// Whether moving from `self` to `to` goes forward.
    pub fn can_move_to(self, to: CallPhase) -> bool {
        to.rank() > self.rank()
    }

    fn to_proto(self) -> ToolCallPhase {
        match self {
            CallPhase::Validating => ToolCallPhase::Validating,
            CallPhase::AwaitingApproval => ToolCallPhase::AwaitingApproval,
            CallPhase::Scheduled => ToolCallPhase::Scheduled,
            CallPhase::Executing => ToolCallPhase::Executing,
            CallPhase::Success => ToolCallPhase::Success,
            CallPhase::Error => ToolCallPhase::Error,
            CallPhase::Cancelled => ToolCallPhase::Cancelled,
        }
    }

    fn from_proto(phase: i32) -> Option<CallPhase> {
        match ToolCallPhase::try_from(phase).ok()? {
            ToolCallPhase::Validating => Some(CallPhase::Validating),
            ToolCallPhase::AwaitingApproval => Some(CallPhase::AwaitingApproval),
            ToolCallPhase::Scheduled => Some(CallPhase::Scheduled),
            ToolCallPhase::Executing => Some(CallPhase::Executing),
            ToolCallPhase::Success => Some(CallPhase::Success),
            ToolCallPhase::Error => Some(CallPhase::Error),
            ToolCallPhase::Cancelled => Some(CallPhase::Cancelled),
            ToolCallPhase::Unspecified => None,
        }
    }
}

/// One tool call of the current model response.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The call's id.
    pub id: String,
    /// The tool.
    pub tool: String,
    /// The arguments the model wrote.
    pub arguments: String,
    /// The arguments it runs with (a person may have edited them).
    pub effective_arguments: String,
    /// The tool changes nothing.
    pub read_only: bool,
    /// The tool may run concurrently with other parallel-safe calls.
    pub parallel_safe: bool,
    /// Where the call is.
    pub phase: CallPhase,
    /// Its result has been recorded.
    pub answered: bool,
}

impl Call {
    fn as_tool_call(&self) -> ToolCall {
        ToolCall {
            id: self.id.clone(),
            name: self.tool.clone(),
            arguments: self.effective_arguments.clone(),
        }
    }
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
    /// The tool calls of the latest model response, in the model's order.
    pub calls: Vec<Call>,
    /// Where the latest assistant message is in the history.
    pub assistant_index: usize,
    /// The text of the last model response.
    pub last_text: String,
    /// How tool calls needing confirmation are handled.
    pub approval_mode: ApprovalMode,
    /// Restarts of the orchestrator during this turn.
    pub restarts: u32,
    /// The skillset given to the model for this turn ("" for none).
    pub skillset: String,
    /// The plan, for a turn in plan mode.
    pub plan: Option<Plan>,
    /// The person gave this turn's bash calls outbound network.
    pub network: bool,
}

impl Turn {
    fn call(&self, id: &str) -> Option<&Call> {
        self.calls.iter().find(|c| c.id == id)
    }

    fn call_mut(&mut self, id: &str) -> Option<&mut Call> {
        self.calls.iter_mut().find(|c| c.id == id)
    }
}

/// The policy a session checks tool calls against. Two states compare equal
/// when they share the same policy instance.
#[derive(Debug, Clone)]
pub struct PolicyRef(pub Arc<Policy>);

impl PartialEq for PolicyRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

static ALLOW_ALL: LazyLock<Arc<Policy>> = LazyLock::new(|| Arc::new(Policy::allow_all()));

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
    /// For each message of `history`, the seqs of the events it stands for
    /// (first, last): one event for most messages, a whole range for the
    /// summary that replaced older messages.
    pub history_spans: Vec<(u64, u64)>,
    /// The seq of the last event applied.
    pub last_seq: u64,
    /// Model calls allowed per turn (per plan stage in plan mode).
    pub max_steps: u32,
    /// Plan steps a plan-mode turn may start, retries included.
    pub plan_max_steps: u32,
    /// Calls a person approved for the rest of the session.
    pub session_rules: Vec<SessionRule>,
    /// The policy tool calls are checked against.
    pub policy: PolicyRef,
    /// The flags of the tools the model may call.
    pub catalog: BTreeMap<String, ToolFlags>,
    /// Reminder firings already in the log (a firing enters at most once).
    pub delivered_firings: BTreeSet<String>,
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
        /// How this turn's tool calls are approved.
        approval_mode: ApprovalMode,
        /// Run the turn in plan mode.
        plan: bool,
        /// Give the turn's bash calls outbound network.
        network: bool,
    },
    /// The tools the model was offered (sent before its answer).
    ToolCatalog(BTreeMap<String, ToolFlags>),
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
    /// A person decided on a call awaiting approval.
    Approval {
        /// The call.
        call_id: String,
        /// The decision.
        decision: ApprovalDecision,
        /// Their reason.
        reason: String,
        /// Replacement arguments, for an edit.
        edited_arguments_json: String,
    },
    /// The person asked to stop the turn.
    Cancel {
        /// Why, if they said.
        reason: String,
    },
    /// A reminder fell due: `notify` ones are recorded at any time; a
    /// `task` one starts a turn when the session is idle.
    ReminderDue {
        /// The id for the turn a task reminder starts.
        turn_id: String,
        /// The firing.
        reminder: pb::ReminderDue,
    },
    /// The session was loaded with a turn that never finished (the
    /// orchestrator stopped mid-turn): recover it.
    Interrupted,
    /// The intent of the message that started the turn, and the skillset
    /// chosen for it; only before the turn's first model answer.
    SkillsetChosen {
        /// The intent.
        intent: String,
        /// The skillset ("" for none).
        skillset: String,
        /// The words that decided it.
        keywords: Vec<String>,
    },
    /// Before a model call, the oldest messages of the conversation were
    /// summarised (or dropped) to fit the context window.
    Compacted(pb::ContextCompacted),
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
    RunTool {
        /// The call, with the arguments it runs with.
        call: ToolCall,
        /// The tool only reads: it may overlap the append of the events
        /// before it, and is run again after a restart.
        read_only: bool,
        /// The call gets outbound network (see [`SessionState::network_for`]).
        network: bool,
    },
    /// Stop every model call and tool call in flight.
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
    /// A decision for a call that is not waiting for one (unknown, already
    /// decided, or from an earlier turn).
    #[error("no approval is pending for call {call_id:?}")]
    NoPendingApproval {
        /// The call named.
        call_id: String,
    },
    /// A decision that cannot be carried out as given.
    #[error("{0}")]
    InvalidDecision(String),
    /// An outcome arrived that the state does not expect (a stale result).
    #[error("unexpected {input} while the session is {phase:?}")]
    Unexpected {
        /// The input's name.
        input: &'static str,
        /// The phase.
        phase: Phase,
    },
}

impl Refusal {
    /// Whether the input itself was malformed (rather than ill-timed).
    pub fn is_invalid_argument(&self) -> bool {
        match self {
            Refusal::EmptyMessage | Refusal::InvalidDecision(_) => true,
            Refusal::Busy
            | Refusal::NothingToCancel
            | Refusal::NoPendingApproval { .. }
            | Refusal::Unexpected { .. } => false,
        }
    }
}

fn add_usage(total: &mut TokenUsage, u: &TokenUsage) {
    total.prompt_tokens += u.prompt_tokens;
    total.completion_tokens += u.completion_tokens;
    total.total_tokens += u.total_tokens;
}

/// What one step produces: effects to run before recording (aborts), the
/// events to record, then effects to run after they are stored.
#[derive(Default)]
struct Out {
    before: Vec<Effect>,
    events: Vec<Kind>,
    after: Vec<Effect>,
}

/// Limit on model-call retries after orchestrator restarts within one turn.
const MAX_RESTARTS_PER_TURN: u32 = 2;

fn state_event(call_id: &str, phase: CallPhase, detail: impl Into<String>) -> Kind {
    Kind::ToolCallState(pb::ToolCallState {
        call_id: call_id.to_string(),
        phase: phase.to_proto() as i32,
        detail: detail.into(),
    })
}

impl SessionState {
    /// An idle session with an empty conversation that allows every call.
    pub fn new(max_steps: u32) -> Self {
        SessionState {
            phase: Phase::Idle,
            turn: None,
            history: Vec::new(),
            history_spans: Vec::new(),
            last_seq: 0,
            max_steps: max_steps.max(1),
            plan_max_steps: crate::plan::default_max_steps(),
            session_rules: Vec::new(),
            policy: PolicyRef(ALLOW_ALL.clone()),
            catalog: BTreeMap::new(),
            delivered_firings: BTreeSet::new(),
        }
    }

    /// The same state checking calls against `policy`.
    pub fn with_policy(mut self, policy: Arc<Policy>) -> Self {
        self.policy = PolicyRef(policy);
        self
    }

    /// Rebuilds the state from a session's stored events.
    pub fn replay<'a>(max_steps: u32, events: impl IntoIterator<Item = &'a pb::Event>) -> Self {
        SessionState::new(max_steps).replayed(events)
    }

    /// Applies stored events to this (fresh) state.
    pub fn replayed<'a>(mut self, events: impl IntoIterator<Item = &'a pb::Event>) -> Self {
        for event in events {
            if let Some(kind) = &event.kind {
                self.last_seq = event.seq.saturating_sub(1);
                self.apply(&event.turn_id, kind);
            }
        }
        self
    }

    /// Whether no turn is running.
    pub fn is_idle(&self) -> bool {
        self.phase == Phase::Idle
    }

    /// Whether a call runs with outbound network: the policy grants it, or
    /// the person gave the running turn network (bash calls only). The
    /// runner's proxy rules hold either way.
    pub fn network_for(&self, tool: &str, arguments_json: &str) -> bool {
        self.policy.0.network(tool, arguments_json)
            || (tool == "bash" && self.turn.as_ref().is_some_and(|t| t.network))
    }

    /// The effect that runs `call`.
    fn run_tool(&self, call: &Call) -> Effect {
        Effect::RunTool {
            call: call.as_tool_call(),
            read_only: call.read_only,
            network: self.network_for(&call.tool, &call.effective_arguments),
        }
    }

    /// The running turn's id, if any.
    pub fn turn_id(&self) -> Option<&str> {
        self.turn.as_ref().map(|t| t.id.as_str())
    }

    /// The skillset of the running turn, if it has one.
    pub fn turn_skillset(&self) -> Option<&str> {
        self.turn
            .as_ref()
            .map(|t| t.skillset.as_str())
            .filter(|s| !s.is_empty())
    }

    /// The last two messages are answers without tool calls.
    fn answered_twice_without_calls(&self) -> bool {
        let n = self.history.len();
        n >= 2 && self.history[n - 2..].iter().all(is_plain_answer)
    }

    /// What plan mode asks of the model now, for the running turn.
    pub fn plan_guidance(&self) -> Option<String> {
        let plan = self.turn_plan()?;
        let mut guidance = plan.guidance();
        if plan.stage == Stage::Planning && self.history.last().is_some_and(is_plain_answer) {
            guidance.push_str(
                "\n\nYour last answer did not submit a plan. Call submit_plan with the steps \
                 now; if the request truly needs no plan, give your answer again and it will be \
                 final.",
            );
        }
        Some(guidance)
    }

    /// The plan of the running turn, when it runs in plan mode.
    pub fn turn_plan(&self) -> Option<&Plan> {
        self.turn.as_ref().and_then(|t| t.plan.as_ref())
    }

    /// The running turn's plan and model-call count.
    fn plan_mut(&mut self) -> Option<(&mut Plan, u32)> {
        let turn = self.turn.as_mut()?;
        let steps = turn.steps;
        turn.plan.as_mut().map(|plan| (plan, steps))
    }

    /// The same state allowing `steps` plan steps per plan-mode turn.
    pub fn with_plan_max_steps(mut self, steps: u32) -> Self {
        self.plan_max_steps = steps.max(1);
        self
    }

    fn push_history(&mut self, message: Message) {
        self.history.push(message);
        self.history_spans.push((self.last_seq, self.last_seq));
    }

    /// The calls waiting for a person's decision.
    pub fn awaiting_approval(&self) -> Vec<&Call> {
        self.turn
            .iter()
            .flat_map(|t| t.calls.iter())
            .filter(|c| c.phase == CallPhase::AwaitingApproval)
            .collect()
    }

    /// Folds one event into the state. The only place the state changes.
    pub fn apply(&mut self, turn_id: &str, kind: &Kind) {
        self.last_seq += 1;
        match kind {
            Kind::UserMessage(m) => {
                self.push_history(Message::User {
                    content: m.text.clone(),
                });
                self.turn = Some(Turn {
                    id: turn_id.to_string(),
                    steps: 0,
                    usage: TokenUsage::default(),
                    calls: Vec::new(),
                    assistant_index: 0,
                    last_text: String::new(),
                    approval_mode: ApprovalMode::try_from(m.approval_mode)
                        .unwrap_or(ApprovalMode::Policy),
                    restarts: 0,
                    skillset: String::new(),
                    plan: m.plan.then(Plan::default),
                    network: m.network,
                });
                self.phase = Phase::Generate;
            }
            Kind::ModelMessage(m) => {
                self.push_history(Message::Assistant {
                    content: m.text.clone(),
                    tool_calls: Vec::new(),
                });
                let index = self.history.len() - 1;
                if let Some(turn) = &mut self.turn {
                    turn.steps += 1;
                    if let Some(u) = &m.usage {
                        add_usage(&mut turn.usage, u);
                    }
                    turn.last_text = m.text.clone();
                    turn.calls.clear();
                    turn.assistant_index = index;
                }
            }
            Kind::ToolCallRequested(c) => {
                let call = ToolCall {
                    id: c.call_id.clone(),
                    name: c.tool.clone(),
                    arguments: c.arguments_json.clone(),
                };
                if let Some(turn) = &mut self.turn {
                    if let Some(Message::Assistant { tool_calls, .. }) =
                        self.history.get_mut(turn.assistant_index)
                    {
                        tool_calls.push(call);
                    }
                    turn.calls.push(Call {
                        id: c.call_id.clone(),
                        tool: c.tool.clone(),
                        arguments: c.arguments_json.clone(),
                        effective_arguments: c.arguments_json.clone(),
                        read_only: c.read_only,
                        parallel_safe: c.parallel_safe,
                        phase: CallPhase::Validating,
                        answered: false,
                    });
                }
                self.phase = Phase::UseTools;
            }
            Kind::ToolCallState(s) => {
                if let (Some(turn), Some(to)) = (&mut self.turn, CallPhase::from_proto(s.phase))
                    && let Some(call) = turn.call_mut(&s.call_id)
                    && call.phase.can_move_to(to)
                {
                    call.phase = to;
                }
            }
            Kind::ApprovalDecided(d) => {
                if let Some(turn) = &mut self.turn
                    && let Some(call) = turn.call_mut(&d.call_id)
                    && d.decision == ApprovalDecision::Edit as i32
                {
                    call.effective_arguments = d.edited_arguments_json.clone();
                }
                for a in &d.allowances {
                    let rule = SessionRule {
                        tool: a.tool.clone(),
                        command: (!a.command.is_empty()).then(|| a.command.clone()),
                        path: (!a.path.is_empty()).then(|| a.path.clone()),
                    };
                    if !self.session_rules.contains(&rule) {
                        self.session_rules.push(rule);
                    }
                }
            }
            Kind::ToolResult(r) => {
                let Some(turn) = &mut self.turn else { return };
                let Some(index) = turn.calls.iter().position(|c| c.id == r.call_id) else {
                    return;
                };
                // Keep tool messages in the model's call order, whatever
                // order the calls finished in.
                let before = turn.calls[..index].iter().filter(|c| c.answered).count();
                let at = (turn.assistant_index + 1 + before).min(self.history.len());
                self.history.insert(
                    at,
                    Message::Tool {
                        tool_call_id: r.call_id.clone(),
                        content: r.output.clone(),
                    },
                );
                self.history_spans.insert(
                    at.min(self.history_spans.len()),
                    (self.last_seq, self.last_seq),
                );
                turn.calls[index].answered = true;
                if turn.calls.iter().all(|c| c.answered) {
                    self.phase = Phase::Generate;
                }
            }
            Kind::Error(e) => {
                if e.source == ErrorSource::Orchestrator as i32
                    && let Some(turn) = &mut self.turn
                {
                    turn.restarts += 1;
                }
            }
            Kind::TurnFinished(_) => {
                self.turn = None;
                self.phase = Phase::Idle;
            }
            Kind::ReminderDue(r) => {
                self.delivered_firings.insert(r.firing_id.clone());
                if r.kind == REMINDER_TASK {
                    // The Task state: the reminder becomes the message the
                    // agent acts on.
                    self.push_history(Message::User {
                        content: compose_reminder(r),
                    });
                    self.turn = Some(Turn {
                        id: turn_id.to_string(),
                        steps: 0,
                        usage: TokenUsage::default(),
                        calls: Vec::new(),
                        assistant_index: 0,
                        last_text: String::new(),
                        approval_mode: ApprovalMode::Policy,
                        restarts: 0,
                        skillset: String::new(),
                        plan: None,
                        network: false,
                    });
                    self.phase = Phase::Generate;
                }
            }
            Kind::SkillsetChosen(s) => {
                if let Some(turn) = &mut self.turn {
                    turn.skillset = s.skillset.clone();
                }
            }
            Kind::ContextCompacted(c) => {
                // The replaced messages are the first `messages` of the
                // conversation.
                let count = (c.messages as usize).min(self.history.len());
                self.history.drain(..count);
                self.history_spans.drain(..count);
                self.history.insert(
                    0,
                    Message::System {
                        content: crate::compaction::summary_message(c),
                    },
                );
                self.history_spans.insert(0, (c.first_seq, c.last_seq));
            }
            Kind::PlanSubmitted(p) => {
                if let Some((plan, steps)) = self.plan_mut() {
                    plan.submitted(p, steps);
                }
            }
            Kind::PlanStepUpdated(u) => {
                if let Some((plan, steps)) = self.plan_mut() {
                    plan.step_updated(u, steps);
                }
            }
            Kind::ModelTextDelta(_)
            | Kind::ApprovalRequested(_)
            | Kind::ToolOutputChunk(_)
            | Kind::CancelRequested(_) => {}
        }
    }

    /// Records `kind` (applying it at once).
    fn emit(&mut self, out: &mut Out, turn_id: &str, kind: Kind) {
        self.apply(turn_id, &kind);
        out.events.push(kind);
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

    fn into_effects(turn_id: &str, out: Out) -> Vec<Effect> {
        let mut effects = out.before;
        if !out.events.is_empty() {
            effects.push(Effect::Record {
                turn_id: turn_id.to_string(),
                events: out.events,
            });
        }
        effects.extend(out.after);
        effects
    }

    /// A call's result, with its terminal state.
    fn answer(&mut self, out: &mut Out, turn_id: &str, mut result: pb::ToolResult) {
        let Some(call) = self
            .turn
            .as_ref()
            .and_then(|t| t.call(&result.call_id))
            .cloned()
        else {
            return;
        };
        if call.effective_arguments != call.arguments {
            result.output = format!(
                "[the person edited the arguments to {}]\n{}",
                call.effective_arguments, result.output
            );
        }
        let phase = if result.is_error {
            CallPhase::Error
        } else {
            CallPhase::Success
        };
        if call.phase.can_move_to(phase) {
            self.emit(out, turn_id, state_event(&call.id, phase, ""));
        }
        if result.tool.is_empty() {
            result.tool = call.tool;
        }
        self.emit(out, turn_id, Kind::ToolResult(result));
    }

    /// An error result for a call that will not run.
    fn refuse_call(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        call_id: &str,
        phase: CallPhase,
        output: String,
    ) {
        let tool = call_tool(self, call_id);
        self.emit(out, turn_id, state_event(call_id, phase, output.clone()));
        self.emit(
            out,
            turn_id,
            Kind::ToolResult(pb::ToolResult {
                call_id: call_id.to_string(),
                tool,
                output,
                is_error: true,
                ..Default::default()
            }),
        );
    }

    /// Checks one requested call: its arguments, then the policy.
    fn validate(&mut self, out: &mut Out, turn_id: &str, call_id: &str) {
        let Some(turn) = self.turn.as_ref() else {
            return;
        };
        let Some(call) = turn.call(call_id) else {
            return;
        };
        let (tool, args, read_only, mode) = (
            call.tool.clone(),
            call.effective_arguments.clone(),
            call.read_only,
            turn.approval_mode,
        );
        if let Err(reason) = check_arguments(&args) {
            let output = format!("error: invalid arguments for {tool}: {reason}");
            self.refuse_call(out, turn_id, call_id, CallPhase::Error, output);
            return;
        }
        let verdict = self
            .policy
            .0
            .check(&tool, &args, read_only, &self.session_rules);
        match (verdict.decision, mode) {
            (Decision::Deny, _) => {
                let output = format!("error: denied by policy: {}", verdict.rule);
                self.refuse_call(out, turn_id, call_id, CallPhase::Error, output);
            }
            (Decision::Confirm, ApprovalMode::Never) => {
                let output = format!(
                    "error: this call needs a person's approval ({}), and this turn runs without one",
                    verdict.rule
                );
                self.refuse_call(out, turn_id, call_id, CallPhase::Error, output);
            }
            (Decision::Allow, _) => {
                self.emit(
                    out,
                    turn_id,
                    state_event(call_id, CallPhase::Scheduled, verdict.rule),
                );
            }
            (Decision::Confirm, ApprovalMode::Always) => {
                let detail = format!("approved for this turn ({})", verdict.rule);
                self.emit(
                    out,
                    turn_id,
                    state_event(call_id, CallPhase::Scheduled, detail),
                );
            }
            (Decision::Confirm, ApprovalMode::Policy | ApprovalMode::Unspecified) => {
                self.emit(
                    out,
                    turn_id,
                    Kind::ApprovalRequested(pb::ApprovalRequested {
                        call_id: call_id.to_string(),
                        network: self.network_for(&tool, &args),
                        tool,
                        arguments_json: args,
                        matched_rule: verdict.rule,
                    }),
                );
                self.emit(
                    out,
                    turn_id,
                    state_event(call_id, CallPhase::AwaitingApproval, ""),
                );
            }
        }
    }

    /// Starts whatever calls may run now, or moves on when all are done.
    ///
    /// Calls run in the model's order; a run of consecutive parallel-safe,
    /// read-only calls runs concurrently; a call awaiting approval holds up
    /// the calls after it.
    fn dispatch(&mut self, out: &mut Out, turn_id: &str) {
        let Some(turn) = self.turn.as_ref() else {
            return;
        };
        let mut start = Vec::new();
        for (i, call) in turn.calls.iter().enumerate() {
            if call.phase.is_terminal() {
                continue;
            }
            let concurrent = call.read_only && call.parallel_safe;
            match call.phase {
                // Reaching a call means every open call before it is concurrent.
                CallPhase::Executing if concurrent => {}
                CallPhase::Scheduled if concurrent => start.push(call.id.clone()),
                CallPhase::Scheduled => {
                    if turn.calls[..i].iter().all(|c| c.phase.is_terminal()) {
                        start.push(call.id.clone());
                    }
                    break;
                }
                CallPhase::Executing
                | CallPhase::Validating
                | CallPhase::AwaitingApproval
                | CallPhase::Success
                | CallPhase::Error
                | CallPhase::Cancelled => break,
            }
        }
        for id in start {
            self.emit(out, turn_id, state_event(&id, CallPhase::Executing, ""));
            if let Some(call) = self.turn.as_ref().and_then(|t| t.call(&id)) {
                out.after.push(self.run_tool(call));
            }
        }
        let all_done = self
            .turn
            .as_ref()
            .is_some_and(|t| t.calls.iter().all(|c| c.answered));
        if all_done {
            self.after_tools(out, turn_id);
        }
    }

    /// After the last tool result of a step: call the model again, or stop
    /// at the step limit.
    fn after_tools(&mut self, out: &mut Out, turn_id: &str) {
        if self.turn_plan().is_some() {
            self.govern(out, turn_id);
            return;
        }
        let steps = self.turn.as_ref().map(|t| t.steps).unwrap_or_default();
        if steps >= self.max_steps {
            let finished = self.finish(
                TurnOutcome::StepLimit,
                format!(
                    "stopped after {steps} model calls (the step limit); send a message to continue"
                ),
            );
            self.emit(out, turn_id, finished);
        } else {
            out.after.push(Effect::CallModel {
                history: self.history.clone(),
            });
        }
    }

    /// Takes one input; returns the effects to run, or why the input does
    /// not fit. A refused input leaves the state unchanged.
    pub fn step(&mut self, input: Input) -> Result<Vec<Effect>, Refusal> {
        let phase = self.phase;
        let turn_id = self.turn_id().unwrap_or_default().to_string();
        let mut out = Out::default();
        match (phase, input) {
            (
                Phase::Idle,
                Input::UserMessage {
                    turn_id,
                    text,
                    approval_mode,
                    plan,
                    network,
                },
            ) => {
                if text.trim().is_empty() {
                    return Err(Refusal::EmptyMessage);
                }
                let event = Kind::UserMessage(pb::UserMessage {
                    text,
                    approval_mode: approval_mode as i32,
                    plan,
                    network,
                });
                self.emit(&mut out, &turn_id, event);
                out.after.push(Effect::CallModel {
                    history: self.history.clone(),
                });
                return Ok(Self::into_effects(&turn_id, out));
            }
            (Phase::Generate | Phase::UseTools, Input::UserMessage { .. }) => {
                return Err(Refusal::Busy);
            }
            (_, Input::ToolCatalog(catalog)) => {
                self.catalog = catalog;
            }
            (Phase::Generate, Input::ModelDelta(text)) => {
                self.emit(
                    &mut out,
                    &turn_id,
                    Kind::ModelTextDelta(pb::ModelTextDelta { text }),
                );
            }
            (Phase::Generate, Input::ModelDone(c)) => self.model_done(&mut out, &turn_id, c),
            (Phase::Generate, Input::ModelFailed { message, retryable }) => {
                let error = Kind::Error(pb::Error {
                    source: ErrorSource::Model as i32,
                    message: message.clone(),
                    retryable,
                });
                self.emit(&mut out, &turn_id, error);
                let finished = self.finish(TurnOutcome::Failed, message);
                self.emit(&mut out, &turn_id, finished);
            }
            (
                Phase::UseTools,
                Input::ToolChunk {
                    call_id,
                    stream,
                    text,
                },
            ) => {
                if !self.is_executing(&call_id) {
                    return Err(Refusal::Unexpected {
                        input: "tool output",
                        phase,
                    });
                }
                self.emit(
                    &mut out,
                    &turn_id,
                    Kind::ToolOutputChunk(pb::ToolOutputChunk {
                        call_id,
                        stream: stream as i32,
                        text,
                    }),
                );
            }
            (Phase::UseTools, Input::ToolDone(result)) => {
                if !self.is_executing(&result.call_id) {
                    return Err(Refusal::Unexpected {
                        input: "tool result",
                        phase,
                    });
                }
                self.answer(&mut out, &turn_id, result);
                self.dispatch(&mut out, &turn_id);
            }
            (
                _,
                Input::Approval {
                    call_id,
                    decision,
                    reason,
                    edited_arguments_json,
                },
            ) => {
                let pending = self
                    .turn
                    .as_ref()
                    .and_then(|t| t.call(&call_id))
                    .is_some_and(|c| c.phase == CallPhase::AwaitingApproval);
                if !pending {
                    return Err(Refusal::NoPendingApproval { call_id });
                }
                self.decide(
                    &mut out,
                    &turn_id,
                    call_id,
                    decision,
                    reason,
                    edited_arguments_json,
                )?;
            }
            (Phase::Generate | Phase::UseTools, Input::Cancel { reason }) => {
                out.before.push(Effect::AbortInFlight);
                self.emit(
                    &mut out,
                    &turn_id,
                    Kind::CancelRequested(pb::CancelRequested { reason }),
                );
                for id in self.open_calls() {
                    let output = "error: cancelled before it finished".to_string();
                    self.refuse_call(&mut out, &turn_id, &id, CallPhase::Cancelled, output);
                }
                let finished = self.finish(TurnOutcome::Cancelled, "cancelled".to_string());
                self.emit(&mut out, &turn_id, finished);
            }
            (Phase::Idle, Input::Cancel { .. }) => return Err(Refusal::NothingToCancel),
            (
                _,
                Input::ReminderDue {
                    turn_id: new_turn,
                    reminder,
                },
            ) => {
                if self.delivered_firings.contains(&reminder.firing_id) {
                    return Ok(Vec::new()); // Redelivered: already in the log.
                }
                if reminder.kind == REMINDER_TASK {
                    if phase != Phase::Idle {
                        return Err(Refusal::Busy);
                    }
                    self.emit(&mut out, &new_turn, Kind::ReminderDue(reminder));
                    out.after.push(Effect::CallModel {
                        history: self.history.clone(),
                    });
                    return Ok(Self::into_effects(&new_turn, out));
                }
                self.emit(&mut out, &turn_id, Kind::ReminderDue(reminder));
            }
            (Phase::Generate, Input::Interrupted) => {
                let restarts = self.turn.as_ref().map(|t| t.restarts).unwrap_or_default();
                if restarts >= MAX_RESTARTS_PER_TURN {
                    let message = format!(
                        "the orchestrator restarted {} times during this turn; giving up on it",
                        restarts + 1
                    );
                    self.emit(&mut out, &turn_id, orchestrator_error(&message, false));
                    let finished = self.finish(TurnOutcome::Failed, message);
                    self.emit(&mut out, &turn_id, finished);
                } else {
                    let message = "the orchestrator restarted while the model was answering; \
                                   asking the model again";
                    self.emit(&mut out, &turn_id, orchestrator_error(message, true));
                    out.after.push(Effect::CallModel {
                        history: self.history.clone(),
                    });
                }
            }
            (Phase::UseTools, Input::Interrupted) => {
                self.emit(
                    &mut out,
                    &turn_id,
                    orchestrator_error(
                        "the orchestrator restarted while tool calls were in progress",
                        true,
                    ),
                );
                self.recover_calls(&mut out, &turn_id);
            }
            (Phase::Idle, Input::Interrupted) => {}
            (
                Phase::Idle | Phase::UseTools,
                Input::ModelDelta(_) | Input::ModelDone(_) | Input::ModelFailed { .. },
            ) => {
                return Err(Refusal::Unexpected {
                    input: "model output",
                    phase,
                });
            }
            (
                Phase::Generate,
                Input::SkillsetChosen {
                    intent,
                    skillset,
                    keywords,
                },
            ) if self.turn.as_ref().is_some_and(|t| t.steps == 0) => {
                self.emit(
                    &mut out,
                    &turn_id,
                    Kind::SkillsetChosen(pb::SkillsetChosen {
                        intent,
                        skillset,
                        keywords,
                    }),
                );
            }
            (Phase::Generate, Input::Compacted(c)) => {
                if !self.compaction_fits(&c) {
                    return Err(Refusal::Unexpected {
                        input: "compaction of another conversation",
                        phase,
                    });
                }
                self.emit(&mut out, &turn_id, Kind::ContextCompacted(c));
            }
            (_, Input::Compacted(_)) => {
                return Err(Refusal::Unexpected {
                    input: "compaction",
                    phase,
                });
            }
            (_, Input::SkillsetChosen { .. }) => {
                return Err(Refusal::Unexpected {
                    input: "skillset choice",
                    phase,
                });
            }
            (Phase::Idle | Phase::Generate, Input::ToolChunk { .. } | Input::ToolDone(_)) => {
                return Err(Refusal::Unexpected {
                    input: "tool output",
                    phase,
                });
            }
        }
        Ok(Self::into_effects(&turn_id, out))
    }

    fn is_executing(&self, call_id: &str) -> bool {
        self.turn
            .as_ref()
            .and_then(|t| t.call(call_id))
            .is_some_and(|c| c.phase == CallPhase::Executing)
    }

    fn open_calls(&self) -> Vec<String> {
        self.turn
            .iter()
            .flat_map(|t| t.calls.iter())
            .filter(|c| !c.phase.is_terminal())
            .map(|c| c.id.clone())
            .collect()
    }

    fn model_done(&mut self, out: &mut Out, turn_id: &str, c: Completion) {
        let step = self.turn.as_ref().map(|t| t.steps).unwrap_or_default() + 1;
        let message = Kind::ModelMessage(pb::ModelMessage {
            text: c.text.clone(),
            finish_reason: c.finish_reason.clone(),
            usage: c.usage.map(|u| TokenUsage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
                total_tokens: u.total_tokens,
            }),
            model: c.model.clone(),
            step,
        });
        self.emit(out, turn_id, message);
        if c.tool_calls.is_empty() {
            // In plan mode, an answer without tool calls ends the step
            // being carried out; otherwise it is the final answer.
            if let Some(current) = self.turn_plan().and_then(|p| p.current) {
                let update = self.step_update(current, PlanStepStatus::Completed, &c.text);
                self.emit(out, turn_id, update);
                // That was the last step: its answer is the turn's.
                if !self.turn_plan().is_some_and(Plan::is_finishing) {
                    self.govern(out, turn_id);
                    return;
                }
            }
            // Asked for a plan, the model answered instead: it is asked
            // once more; a second answer without a plan is final.
            if self.turn_plan().is_some_and(|p| p.stage == Stage::Planning)
                && !self.answered_twice_without_calls()
            {
                self.govern(out, turn_id);
                return;
            }
            // Asked to repair the plan, the model answered instead: the
            // plan failed.
            if let Some(plan) = self.turn_plan().filter(|p| p.stage == Stage::Repairing) {
                let message = format!(
                    "the plan stopped: a step failed ({}) and the model did not revise the plan",
                    plan.failure
                );
                let error = Kind::Error(pb::Error {
                    source: ErrorSource::Model as i32,
                    message,
                    retryable: false,
                });
                self.emit(out, turn_id, error);
                let finished = self.finish(TurnOutcome::Failed, c.text);
                self.emit(out, turn_id, finished);
                return;
            }
            let finished = self.finish(TurnOutcome::Completed, c.text);
            self.emit(out, turn_id, finished);
            return;
        }
        // Ids must be unique within the response: the model's own ids are
        // kept, repeats get a suffix.
        let mut seen: Vec<String> = Vec::new();
        let mut ids = Vec::new();
        for call in &c.tool_calls {
            let mut id = call.id.clone();
            let mut n = 2;
            while seen.contains(&id) {
                id = format!("{}-{n}", call.id);
                n += 1;
            }
            seen.push(id.clone());
            let flags = self.catalog.get(&call.name).copied().unwrap_or_default();
            self.emit(
                out,
                turn_id,
                Kind::ToolCallRequested(pb::ToolCallRequested {
                    call_id: id.clone(),
                    tool: call.name.clone(),
                    arguments_json: call.arguments.clone(),
                    read_only: flags.read_only,
                    parallel_safe: flags.parallel_safe,
                }),
            );
            ids.push(id);
        }
        let plan_mode = self.turn_plan().is_some();
        for id in &ids {
            let tool = call_tool(self, id);
            if plan_mode && crate::plan::is_plan_tool(&tool) {
                self.plan_call(out, turn_id, id);
            } else {
                self.validate(out, turn_id, id);
            }
        }
        self.dispatch(out, turn_id);
    }

    /// A plan step's new status; starting a step counts towards the rail.
    fn step_update(&self, index: usize, status: PlanStepStatus, summary: &str) -> Kind {
        let started = self.turn_plan().map(|p| p.started).unwrap_or_default()
            + u32::from(status == PlanStepStatus::InProgress);
        Kind::PlanStepUpdated(pb::PlanStepUpdated {
            index: index as u32,
            status: status as i32,
            summary: crate::plan::clip(summary, 500),
            started,
        })
    }

    /// A call of `submit_plan` or `complete_step`: the reducer answers it
    /// itself, moving the plan forward.
    fn plan_call(&mut self, out: &mut Out, turn_id: &str, call_id: &str) {
        let Some(call) = self.turn.as_ref().and_then(|t| t.call(call_id)).cloned() else {
            return;
        };
        let Some(plan) = self.turn_plan().cloned() else {
            return;
        };
        let refuse = |state: &mut Self, out: &mut Out, message: String| {
            state.refuse_call(
                out,
                turn_id,
                call_id,
                CallPhase::Error,
                format!("error: {message}"),
            );
        };
        let parsed = match crate::plan::parse_call(&call.tool, &call.arguments) {
            Ok(parsed) => parsed,
            Err(e) => return refuse(self, out, e),
        };
        let output = match parsed {
            PlanCall::Submit(steps) => {
                if let Some(i) = plan.current {
                    return refuse(
                        self,
                        out,
                        format!(
                            "step {} is still in progress: end it with complete_step first \
                             (status \"failed\" to have the plan revised)",
                            i + 1
                        ),
                    );
                }
                let steps = plan.revised(steps);
                let reason = if plan.stage == Stage::Repairing {
                    plan.failure.clone()
                } else {
                    String::new()
                };
                let count = steps.len();
                let next = plan.completed() + 1;
                self.emit(
                    out,
                    turn_id,
                    Kind::PlanSubmitted(pb::PlanSubmitted {
                        steps,
                        revision: plan.revision + 1,
                        reason,
                    }),
                );
                format!("plan recorded: {count} steps; step {next} comes next")
            }
            PlanCall::Complete { failed, summary } => {
                let Some(current) = plan.current else {
                    let why = match (plan.stage, plan.next_pending()) {
                        (Stage::Planning, _) => {
                            "there is no plan yet: submit one with submit_plan first".to_string()
                        }
                        (Stage::Repairing, _) => {
                            "the last step failed: submit a revised plan with submit_plan"
                                .to_string()
                        }
                        (Stage::Executing, Some(next)) => format!(
                            "step {next} was already ended in this response; step {} starts next",
                            next + 1
                        ),
                        (Stage::Executing, None) => "every step of the plan is done: write the \
                                                     final answer for the person, without tools"
                            .to_string(),
                    };
                    return refuse(self, out, why);
                };
                let status = if failed {
                    PlanStepStatus::Failed
                } else {
                    PlanStepStatus::Completed
                };
                let update = self.step_update(current, status, &summary);
                self.emit(out, turn_id, update);
                if failed {
                    format!("step {} recorded as failed; revise the plan", current + 1)
                } else {
                    format!("step {} recorded as completed", current + 1)
                }
            }
        };
        self.answer(
            out,
            turn_id,
            pb::ToolResult {
                call_id: call_id.to_string(),
                tool: call.tool,
                output,
                runner_id: "orchestrator".into(),
                ..Default::default()
            },
        );
    }

    /// The plan-mode governor, once a response's calls are all answered:
    /// start the next step, stop at the safety rail or the stage's call
    /// limit, or ask the model to go on (planning, repairing, executing the
    /// current step, or writing the final answer).
    fn govern(&mut self, out: &mut Out, turn_id: &str) {
        let Some(turn) = self.turn.as_ref() else {
            return;
        };
        let Some(plan) = turn.plan.clone() else {
            return;
        };
        if turn.steps.saturating_sub(plan.stage_start) >= self.max_steps {
            let what = match (plan.stage, plan.current) {
                (Stage::Planning, _) => "planning".to_string(),
                (Stage::Repairing, _) => "revising the plan".to_string(),
                (Stage::Executing, Some(i)) => format!("step {} of the plan", i + 1),
                (Stage::Executing, None) => "the final answer".to_string(),
            };
            let finished = self.finish(
                TurnOutcome::StepLimit,
                format!(
                    "stopped after {} model calls on {what} (the step limit); send a message to continue",
                    self.max_steps
                ),
            );
            self.emit(out, turn_id, finished);
            return;
        }
        if plan.stage == Stage::Executing
            && plan.current.is_none()
            && let Some(next) = plan.next_pending()
        {
            if plan.started >= self.plan_max_steps {
                let finished = self.finish(
                    TurnOutcome::StepLimit,
                    format!(
                        "the plan stopped at its safety rail of {} steps ({} of {} steps done); \
                         send a message to continue",
                        self.plan_max_steps,
                        plan.completed(),
                        plan.steps.len()
                    ),
                );
                self.emit(out, turn_id, finished);
                return;
            }
            let update = self.step_update(next, PlanStepStatus::InProgress, "");
            self.emit(out, turn_id, update);
        }
        out.after.push(Effect::CallModel {
            history: self.history.clone(),
        });
    }

    /// Whether a compaction names a prefix of the conversation that leaves
    /// at least one message and does not split a tool call from its result.
    fn compaction_fits(&self, c: &pb::ContextCompacted) -> bool {
        let count = c.messages as usize;
        if count == 0 || count >= self.history.len() || self.history_spans.len() < count {
            return false;
        }
        let replaced = &self.history_spans[..count];
        replaced[0].0 == c.first_seq
            && replaced.iter().map(|s| s.1).max() == Some(c.last_seq)
            && !matches!(self.history[count], Message::Tool { .. })
    }

    fn decide(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        call_id: String,
        decision: ApprovalDecision,
        reason: String,
        edited: String,
    ) -> Result<(), Refusal> {
        let Some(call) = self.turn.as_ref().and_then(|t| t.call(&call_id)).cloned() else {
            return Err(Refusal::NoPendingApproval { call_id });
        };
        let decided = |allowances: Vec<pb::SessionAllowance>, edited: String| {
            Kind::ApprovalDecided(pb::ApprovalDecided {
                call_id: call_id.clone(),
                decision: decision as i32,
                reason: reason.clone(),
                edited_arguments_json: edited,
                allowances,
            })
        };
        match decision {
            ApprovalDecision::Unspecified => {
                return Err(Refusal::InvalidDecision(
                    "the decision is not set: approve, approve for session, deny or edit".into(),
                ));
            }
            ApprovalDecision::Approve => {
                self.emit(out, turn_id, decided(Vec::new(), String::new()));
                let detail = "approved by a person";
                self.emit(
                    out,
                    turn_id,
                    state_event(&call_id, CallPhase::Scheduled, detail),
                );
            }
            ApprovalDecision::ApproveForSession => {
                let allowances = session_rules_for(&call.tool, &call.effective_arguments)
                    .into_iter()
                    .map(|r| pb::SessionAllowance {
                        tool: r.tool,
                        command: r.command.unwrap_or_default(),
                        path: r.path.unwrap_or_default(),
                    })
                    .collect();
                self.emit(out, turn_id, decided(allowances, String::new()));
                let detail = "approved by a person for this session";
                self.emit(
                    out,
                    turn_id,
                    state_event(&call_id, CallPhase::Scheduled, detail),
                );
                self.release_allowed(out, turn_id);
            }
            ApprovalDecision::Deny => {
                self.emit(out, turn_id, decided(Vec::new(), String::new()));
                let why = if reason.trim().is_empty() {
                    "no reason given".to_string()
                } else {
                    reason.clone()
                };
                let output = format!("error: the person denied this call: {why}");
                self.refuse_call(out, turn_id, &call_id, CallPhase::Error, output);
            }
            ApprovalDecision::Edit => {
                if edited.trim().is_empty() {
                    return Err(Refusal::InvalidDecision(
                        "an edit needs the new arguments (a JSON object)".into(),
                    ));
                }
                check_arguments(&edited).map_err(|e| {
                    Refusal::InvalidDecision(format!("the edited arguments are invalid: {e}"))
                })?;
                self.emit(out, turn_id, decided(Vec::new(), edited.clone()));
                // The edited call is checked by the policy again; the person's
                // edit counts as approval unless the policy denies it.
                let verdict =
                    self.policy
                        .0
                        .check(&call.tool, &edited, call.read_only, &self.session_rules);
                match verdict.decision {
                    Decision::Deny => {
                        let output = format!(
                            "error: the edited call is denied by policy: {}",
                            verdict.rule
                        );
                        self.refuse_call(out, turn_id, &call_id, CallPhase::Error, output);
                    }
                    Decision::Allow | Decision::Confirm => {
                        let detail = "edited and approved by a person";
                        self.emit(
                            out,
                            turn_id,
                            state_event(&call_id, CallPhase::Scheduled, detail),
                        );
                    }
                }
            }
        }
        self.dispatch(out, turn_id);
        Ok(())
    }

    /// Schedules waiting calls that the session's standing approvals now
    /// allow (e.g. identical calls in the same response).
    fn release_allowed(&mut self, out: &mut Out, turn_id: &str) {
        let waiting: Vec<Call> = self.awaiting_approval().into_iter().cloned().collect();
        for call in waiting {
            let verdict = self.policy.0.check(
                &call.tool,
                &call.effective_arguments,
                call.read_only,
                &self.session_rules,
            );
            if verdict.decision == Decision::Allow {
                self.emit(
                    out,
                    turn_id,
                    state_event(&call.id, CallPhase::Scheduled, verdict.rule),
                );
            }
        }
    }

    /// After a restart: re-run read-only calls that were running, report
    /// mutating ones as of unknown outcome, ask again for pending approvals,
    /// and carry on.
    fn recover_calls(&mut self, out: &mut Out, turn_id: &str) {
        let calls: Vec<Call> = self
            .turn
            .as_ref()
            .map(|t| t.calls.clone())
            .unwrap_or_default();
        for call in calls {
            match call.phase {
                CallPhase::Executing if call.read_only => {
                    out.after.push(self.run_tool(&call));
                }
                CallPhase::Executing => {
                    let output = format!(
                        "error: outcome unknown: the runtime restarted while this {} call was \
                         running; it may or may not have taken effect. Check before repeating it.",
                        call.tool
                    );
                    self.refuse_call(out, turn_id, &call.id, CallPhase::Error, output);
                }
                CallPhase::AwaitingApproval => {
                    let verdict = self.policy.0.check(
                        &call.tool,
                        &call.effective_arguments,
                        call.read_only,
                        &self.session_rules,
                    );
                    if verdict.decision == Decision::Allow {
                        let id = call.id.clone();
                        self.emit(
                            out,
                            turn_id,
                            state_event(&id, CallPhase::Scheduled, verdict.rule),
                        );
                        continue;
                    }
                    self.emit(
                        out,
                        turn_id,
                        Kind::ApprovalRequested(pb::ApprovalRequested {
                            call_id: call.id.clone(),
                            tool: call.tool.clone(),
                            arguments_json: call.effective_arguments.clone(),
                            matched_rule: verdict.rule,
                            network: self.network_for(&call.tool, &call.effective_arguments),
                        }),
                    );
                }
                CallPhase::Validating => self.validate(out, turn_id, &call.id),
                CallPhase::Scheduled
                | CallPhase::Success
                | CallPhase::Error
                | CallPhase::Cancelled => {}
            }
        }
        self.dispatch(out, turn_id);
    }
}

/// The kind name of reminders that start a turn.
pub const REMINDER_TASK: &str = "task";

/// The message a task reminder puts before the model.
pub fn compose_reminder(r: &pb::ReminderDue) -> String {
    let late = if r.late_ms >= 60_000 {
        format!(
            " (it fired {} minutes late: the scheduler was not running when it fell due)",
            r.late_ms / 60_000
        )
    } else {
        String::new()
    };
    format!(
        "[Reminder] A reminder you scheduled is due now{late}: {}\nDo what it asks.",
        r.message
    )
}

/// An answer of the model without tool calls.
fn is_plain_answer(message: &Message) -> bool {
    matches!(message, Message::Assistant { tool_calls, .. } if tool_calls.is_empty())
}

fn call_tool(state: &SessionState, call_id: &str) -> String {
    state
        .turn
        .as_ref()
        .and_then(|t| t.call(call_id))
        .map(|c| c.tool.clone())
        .unwrap_or_default()
}

fn orchestrator_error(message: &str, retryable: bool) -> Kind {
    Kind::Error(pb::Error {
        source: ErrorSource::Orchestrator as i32,
        message: message.to_string(),
        retryable,
    })
}

/// Tool arguments must be a JSON object (empty means `{}`).
fn check_arguments(arguments: &str) -> Result<(), String> {
    if arguments.trim().is_empty() {
        return Ok(());
    }
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(other) => Err(format!("expected a JSON object, got {other}")),
        Err(e) => Err(format!("not valid JSON ({e})")),
    }
}
