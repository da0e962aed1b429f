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
//!
//! Here: the state and its types; `step` (deciding), `apply` (the fold),
//! `calls` (the tool-call lifecycle), `plan_calls` (plan mode's tools),
//! `model` (each model call's exact request, and compaction), `catalog` (the
//! tools offered, as recorded), `checkpoint` (the state written beside the
//! log so that a load reads only the events after it).

use crate::hooks::{HookEvent, HookJob, HookOutcome};
use crate::plan::{Plan, PlanCall, Stage};
use crate::prompt::{CompactionJob, ModelRequest, View};
use agentry_llm::{Completion, Message, ToolCall};
use agentry_policy::{Approver, Decision, Need, Policy, SessionRule, session_rules_for};
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
    /// Its MCP server says it changes nothing (only policy rules that ask
    /// for this use it).
    pub read_only_hint: bool,
    /// A call may be given outbound network.
    pub network: bool,
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
    /// It was running when the runtime restarted and a person is asked
    /// what to do (check, run again, skip).
    pub outcome_unknown: bool,
    /// A before_tool hook asked for a person: only a person releases it.
    pub hook_asked: bool,
    /// Who must approve it (what the policy rules that asked say).
    pub need: Need,
    /// The people who approved it so far, when it needs several.
    pub approved_by: Vec<String>,
    /// Its MCP server waits for a person's answers (it stays executing).
    pub asking: Option<pb::McpInputRequested>,
    /// How it goes on with the answers a person gave its server.
    pub resume: Option<pb::McpResume>,
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
    /// What its model calls cost so far, at the configured price (0 when
    /// none is configured).
    pub cost: f64,
    /// The person asked for the conversation to be summarised: the turn
    /// compacts it and ends without a model answer.
    pub compact: bool,
    /// The latest answer tried to call a tool in its text and could not be
    /// read: (its text, why). The next request shows it to the model with
    /// the reason; a second one in the same step fails the turn.
    pub unreadable: Option<(String, String)>,
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

/// The settings that shape a session's model requests. Two states compare
/// equal when they share the same instance.
#[derive(Debug, Clone)]
pub struct ViewRef(pub Arc<View>);

impl PartialEq for ViewRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

static DEFAULT_VIEW: LazyLock<Arc<View>> = LazyLock::new(|| Arc::new(View::default()));

/// The token count of each message of a session's conversation, kept
/// beside it: a model call counts only the messages added since the last
/// one, not the whole conversation again. A cache: two states compare
/// equal whatever it holds.
#[derive(Debug, Clone, Default)]
pub struct TokenMemo {
    /// The tokenizer the counts are of.
    tokenizer: &'static str,
    /// By message; `None`: not counted yet (or changed since).
    counts: Vec<Option<usize>>,
}

impl PartialEq for TokenMemo {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl TokenMemo {
    /// A message was inserted at `at`.
    pub fn inserted(&mut self, at: usize) {
        if at <= self.counts.len() {
            self.counts.insert(at, None);
        }
    }

    /// The message at `at` changed.
    pub fn changed(&mut self, at: usize) {
        if let Some(count) = self.counts.get_mut(at) {
            *count = None;
        }
    }

    /// The first `count` messages were removed.
    pub fn removed_first(&mut self, count: usize) {
        self.counts.drain(..count.min(self.counts.len()));
    }

    /// The count of every message of `history`, counting only those not
    /// counted yet with `tokenizer`.
    pub fn counts(
        &mut self,
        history: &[Message],
        tokenizer: crate::tokens::Tokenizer,
    ) -> Vec<usize> {
        if self.tokenizer != tokenizer.name() || self.counts.len() != history.len() {
            self.tokenizer = tokenizer.name();
            self.counts = vec![None; history.len()];
        }
        self.counts
            .iter_mut()
            .zip(history)
            .map(|(count, message)| *count.get_or_insert_with(|| tokenizer.message(message)))
            .collect()
    }
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
    /// For each message of `history`, the seqs of the events it stands for
    /// (first, last): one event for most messages, a whole range for the
    /// summary that replaced older messages.
    pub history_spans: Vec<(u64, u64)>,
    /// Token counts of `history`'s messages, counted once each.
    pub history_tokens: TokenMemo,
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
    /// The tools the model is offered (as last recorded).
    pub catalog: Arc<Catalog>,
    /// What shapes the model requests (not in the log: the orchestrator's
    /// settings).
    pub view: ViewRef,
    /// Reminder firings already in the log (a firing enters at most once).
    pub delivered_firings: BTreeSet<String>,
    /// The running turn waits (see [`pb::TurnParked`]) until it is resumed.
    pub parked: Option<pb::TurnParked>,
    /// Messages a person sent while the turn runs, waiting for its next
    /// model call.
    pub steering: Vec<String>,
    /// The current (or last) turn was started by a scheduled task.
    pub turn_scheduled: bool,
    /// Calls of the running turn whose result was an error (the progress
    /// detector reads it).
    pub failed_calls: BTreeSet<String>,
    /// The last update of each subscribed MCP resource in the log, by
    /// (server, URI): the same update delivered again enters once.
    pub last_mcp_updates: BTreeMap<(String, String), String>,
    /// Spending limits the person set (0: the configured one).
    pub limits: pb::Budget,
    /// Tokens the session's model calls used so far.
    pub spent_tokens: u64,
    /// What they cost so far, at the configured price.
    pub spent_cost: f64,
    /// The instruction files given to the model (AGENTS.md…), in the order
    /// it reads them: the last recorded text of each path.
    pub instructions: Vec<pb::InstructionFile>,
    /// The model the person switched the session to (`None`: the
    /// configured one).
    pub model: Option<String>,
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
        /// Spending limits raised with this message.
        budget: Option<pb::Budget>,
        /// Images sent with the text.
        images: Vec<pb::Image>,
    },
    /// The person asked for the conversation to be summarised now (a turn
    /// of its own: every message but the last few replaced by a summary,
    /// no model answer).
    Compact {
        /// The id for the turn it starts.
        turn_id: String,
        /// What the person typed (recorded, not part of the conversation).
        text: String,
    },
    /// The tools the model is offered now, fed in place of a model call
    /// about to start (only while generating): recorded when they changed,
    /// and the model call is decided again with them.
    ToolCatalog(Arc<Catalog>),
    /// Instruction files found for the session (its project's, a
    /// subdirectory's a file tool touched): those not given to the model
    /// yet are recorded; fed in place of a model call about to start, the
    /// call is then decided again with them.
    Instructions(Vec<pb::InstructionFile>),
    /// The person switches the session's model (between turns; empty: the
    /// configured one).
    SetModel(String),
    /// The model finished its response.
    ModelDone(Completion),
    /// The model answered with a tool call written in its text that
    /// could not be read.
    ModelUnreadable {
        /// The answer as written.
        text: String,
        /// Why it could not be read.
        error: String,
        /// What the answer cost.
        usage: Option<agentry_llm::Usage>,
    },
    /// The model server asks to be called again later: the turn parks
    /// until `parked.until` (the orchestrator computed it from the server's
    /// wait and the clock).
    ModelTryLater(pb::TurnParked),
    /// The time a parked turn waited for has come.
    Unpark,
    /// Someone raised the limits of a turn parked at one.
    RaiseBudget {
        /// The new limits (unset fields keep theirs).
        budget: pb::Budget,
    },
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
    /// A tool call's MCP server needs a person's answers before it can go
    /// on (the call is not over).
    ToolNeedsInput(pb::McpInputRequested),
    /// A person answered an MCP server's questions for a call.
    McpAnswer {
        /// The call.
        call_id: String,
        /// `accept`, `decline` or `cancel`.
        action: String,
        /// With `accept`: the answers (see [`crate::questions`]).
        content_json: String,
        /// Who answered (`None`: the install's own person).
        by: Option<Answerer>,
    },
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
        /// Who answered (`None`: the install's own person, as
        /// [`Answerer::local`]).
        by: Option<Answerer>,
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
    /// An MCP resource the session subscribed to changed: a turn starts
    /// with it when the session is idle.
    McpResourceUpdated {
        /// The id for the turn it starts.
        turn_id: String,
        /// The update.
        update: pb::McpResourceUpdated,
    },
    /// The session was loaded with a turn that never finished (the
    /// orchestrator stopped mid-turn): recover it.
    Interrupted,
    /// Something that happened beside the conversation (a workspace
    /// snapshot, a rewind): recorded as it is, in the running turn if any.
    Noted(Kind),
    /// The hooks an effect asked for ran (their outcomes in the job's
    /// order).
    HooksDone {
        /// The job, as the reducer asked for it.
        job: Box<HookJob>,
        /// What each hook gave.
        outcomes: Vec<HookOutcome>,
    },
    /// The summary a compaction asked for was written (or writing it
    /// failed, with the reason).
    Summarised {
        /// The compaction, as the reducer asked for it.
        job: CompactionJob,
        /// The summary, or why there is none.
        summary: Result<String, String>,
    },
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
    /// Call the model with exactly this request.
    CallModel {
        /// The request.
        request: ModelRequest,
    },
    /// Ask the model to summarise these messages for a compaction; the
    /// outcome comes back as [`Input::Summarised`].
    Summarise {
        /// The compaction.
        job: CompactionJob,
        /// The messages to summarise.
        messages: Vec<Message>,
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
        /// For a call whose MCP server asked for input: going on with the
        /// answers.
        resume: Option<pb::McpResume>,
    },
    /// Tell the MCP server of a call that waited for answers to stop its
    /// work (the turn ended without them); nothing comes back.
    StopAsking {
        /// The call.
        call: ToolCall,
        /// How it would have gone on.
        resume_json: String,
    },
    /// Run hooks; their outcomes come back as [`Input::HooksDone`].
    RunHooks(Box<HookJob>),
    /// Stop every model call and tool call in flight.
    AbortInFlight,
    /// Hand back [`Input::Unpark`] at this time (milliseconds since the
    /// epoch; at once when it is past).
    WakeAt {
        /// When.
        at_ms: i64,
    },
    /// A delegate call has its result (run once it is stored): its
    /// sub-agent's task is over for this session; when the call ended
    /// without the task's answer (cancelled, refused, skipped), the task is
    /// cancelled so that nothing runs on behind it.
    EndTask {
        /// The turn of the call.
        turn_id: String,
        /// The call.
        call_id: String,
        /// The model response of the turn the call came in (names the task).
        step: u32,
        /// Cancel the task.
        cancel: bool,
    },
}

/// The tool that hands a task to a sub-agent (run by the orchestrator).
pub const DELEGATE_TOOL: &str = "delegate";

/// Who must approve a call, as an `ApprovalRequested` event says it. An
/// entry that does not read (a damaged log) admits nobody.
pub fn need_of(asked: &pb::ApprovalRequested) -> Need {
    Need {
        approvers: asked
            .approvers
            .iter()
            .map(|list| {
                list.any_of
                    .iter()
                    .filter_map(|a| Approver::parse(a).ok())
                    .collect()
            })
            .collect(),
        required: asked.approvals_required.max(1),
    }
}

/// The event fields of `need`: its approver lists and count.
fn need_fields(need: &Need) -> (Vec<pb::Approvers>, u32) {
    let lists = need
        .approvers
        .iter()
        .map(|list| pb::Approvers {
            any_of: list.iter().map(ToString::to_string).collect(),
        })
        .collect();
    (lists, if need.count() > 1 { need.count() } else { 0 })
}

/// Who answers an approval: a person's name and role (as the credential
/// check names them: `viewer`, `operator`, `approver`, `admin`, `service`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answerer {
    /// Their name.
    pub name: String,
    /// Their role.
    pub role: String,
}

impl Answerer {
    /// The install's own person, answering when credentials are off or a
    /// caller in the same process does.
    pub fn local() -> Answerer {
        Answerer {
            name: "local".to_string(),
            role: "admin".to_string(),
        }
    }
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
    /// Limits were raised with no turn parked at one.
    #[error(
        "no turn of this session waits at a spending limit; raise limits with your next message \
         instead"
    )]
    NotParkedAtALimit,
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
    /// An answer for a call whose MCP server asks nothing now.
    #[error("no question of an MCP server waits for call {call_id:?}")]
    NoPendingQuestion {
        /// The call named.
        call_id: String,
    },
    /// A decision that cannot be carried out as given.
    #[error("{0}")]
    InvalidDecision(String),
    /// The person may not approve this call (the rule that asked names
    /// others), or approved it already.
    #[error("{0}")]
    NotAnApprover(String),
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
            | Refusal::NotParkedAtALimit
            | Refusal::NoPendingApproval { .. }
            | Refusal::NoPendingQuestion { .. }
            | Refusal::NotAnApprover(_)
            | Refusal::Unexpected { .. } => false,
        }
    }
}

fn add_usage(total: &mut TokenUsage, u: &TokenUsage) {
    total.prompt_tokens += u.prompt_tokens;
    total.completion_tokens += u.completion_tokens;
    total.total_tokens += u.total_tokens;
    total.cached_prompt_tokens += u.cached_prompt_tokens;
    total.cache_write_prompt_tokens += u.cache_write_prompt_tokens;
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
    let mut state = pb::ToolCallState {
        call_id: call_id.to_string(),
        phase: 0,
        detail: detail.into(),
        allowed_by: 0,
    };
    state.set_phase(phase.to_proto());
    Kind::ToolCallState(state)
}

/// A call scheduled to run, with what allowed it.
fn scheduled(call_id: &str, detail: impl Into<String>, allowed_by: pb::AllowedBy) -> Kind {
    let mut kind = state_event(call_id, CallPhase::Scheduled, detail);
    if let Kind::ToolCallState(state) = &mut kind {
        state.set_allowed_by(allowed_by);
    }
    kind
}

mod apply;
mod calls;
mod catalog;
mod checkpoint;
mod limits;
mod loops;
mod model;
mod plan_calls;
mod questions;
mod step;

pub use catalog::{Catalog, Catalogs};
pub use checkpoint::CHECKPOINT_FORMAT;

impl SessionState {
    /// An idle session with an empty conversation that allows every call.
    pub fn new(max_steps: u32) -> Self {
        SessionState {
            phase: Phase::Idle,
            turn: None,
            history: Vec::new(),
            history_spans: Vec::new(),
            history_tokens: TokenMemo::default(),
            last_seq: 0,
            max_steps: max_steps.max(1),
            plan_max_steps: crate::plan::default_max_steps(),
            session_rules: Vec::new(),
            policy: PolicyRef(ALLOW_ALL.clone()),
            catalog: Arc::default(),
            view: ViewRef(DEFAULT_VIEW.clone()),
            delivered_firings: BTreeSet::new(),
            parked: None,
            steering: Vec::new(),
            turn_scheduled: false,
            last_mcp_updates: BTreeMap::new(),
            failed_calls: BTreeSet::new(),
            limits: pb::Budget::default(),
            spent_tokens: 0,
            spent_cost: 0.0,
            instructions: Vec::new(),
            model: None,
        }
    }

    /// The same state checking calls against `policy`.
    pub fn with_policy(mut self, policy: Arc<Policy>) -> Self {
        self.policy = PolicyRef(policy);
        self
    }

    /// The same state shaping model requests with `view` (set before
    /// replaying).
    pub fn with_view(mut self, view: Arc<View>) -> Self {
        self.view = ViewRef(view);
        self
    }

    /// Rebuilds the state from a session's stored events.
    pub fn replay(max_steps: u32, events: &[pb::Event]) -> Self {
        SessionState::new(max_steps).replayed(events)
    }

    /// Applies stored events to this (fresh) state; events a rewind made
    /// history are left out.
    pub fn replayed(mut self, events: &[pb::Event]) -> Self {
        let effective = crate::rewind::effective(events);
        if effective.len() < events.len() {
            // What rewound turns spent was spent, and limits a person raised
            // stay raised.
            let kept: BTreeSet<u64> = effective.iter().map(|e| e.seq).collect();
            for event in events.iter().filter(|e| !kept.contains(&e.seq)) {
                match &event.kind {
                    Some(Kind::ModelMessage(m)) => self.count_spent(m.usage.as_ref()),
                    Some(Kind::ToolResult(r)) => self.count_spent(r.sub_agent_usage.as_ref()),
                    Some(Kind::UserMessage(m)) => {
                        if let Some(raised) = &m.budget {
                            self.raise_limits(raised);
                        }
                    }
                    _ => {}
                }
            }
        }
        for event in effective {
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
    /// the person gave the running turn network (calls of tools that take
    /// network only, as the catalog says). The runner's proxy rules hold
    /// either way.
    pub fn network_for(&self, tool: &str, arguments_json: &str) -> bool {
        self.policy.0.network(tool, arguments_json)
            || (self.turn.as_ref().is_some_and(|t| t.network)
                && self.catalog.flags.get(tool).is_some_and(|f| f.network))
    }

    /// The effect that runs `call`.
    fn run_tool(&self, call: &Call) -> Effect {
        Effect::RunTool {
            call: call.as_tool_call(),
            read_only: call.read_only,
            network: self.network_for(&call.tool, &call.effective_arguments),
            resume: call.resume.clone(),
        }
    }

    /// Whether the running turn has asked for a call that may change
    /// files.
    pub fn turn_changes_files(&self) -> bool {
        self.turn
            .as_ref()
            .is_some_and(|t| t.calls.iter().any(|c| !c.read_only))
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
        self.history_tokens.inserted(self.history.len() - 1);
    }

    /// The calls whose MCP server waits for a person's answers.
    pub fn awaiting_input(&self) -> Vec<&Call> {
        self.turn
            .iter()
            .flat_map(|t| t.calls.iter())
            .filter(|c| c.phase == CallPhase::Executing && c.asking.is_some())
            .collect()
    }

    /// The calls waiting for a person's decision.
    pub fn awaiting_approval(&self) -> Vec<&Call> {
        self.turn
            .iter()
            .flat_map(|t| t.calls.iter())
            .filter(|c| c.phase == CallPhase::AwaitingApproval)
            .collect()
    }
}

/// The message a task reminder puts before the model; a scheduled task's
/// prompt is the person's own words.
pub fn compose_reminder(r: &pb::ReminderDue) -> String {
    if r.scheduled {
        return format!(
            "[Scheduled task] This turn was started by a schedule a person set up; nobody \
             is watching it live. The task:\n{}",
            r.message
        );
    }
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

/// The message an MCP resource update puts before the model.
pub fn compose_mcp_update(u: &pb::McpResourceUpdated) -> String {
    format!(
        "[MCP update] The resource {} of the MCP server {}, which this session subscribed to, \
         changed. Its content now:\n{}\nDo what the subscription was for.",
        u.uri, u.server, u.content
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
    error_event(ErrorSource::Orchestrator, message.to_string(), retryable)
}

/// An `error` event. Enums become their wire numbers only where events are
/// built; decisions read them back through the typed getters.
fn error_event(source: ErrorSource, message: String, retryable: bool) -> Kind {
    let mut error = pb::Error {
        source: 0,
        message,
        retryable,
    };
    error.set_source(source);
    Kind::Error(error)
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
