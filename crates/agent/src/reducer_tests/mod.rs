#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Unit tests of the session reducer: every (phase, input) transition, the
//! events and effects it yields, the state it leaves, the tool-call
//! lifecycle (policy, approvals, dispatch, recovery after a restart), and the
//! replay property (the state is exactly the fold of the recorded events).

use crate::prompt::{CompactionJob, ModelRequest, Settings, View};
use crate::reducer::{
    Call, CallPhase, Catalog, Effect, Input, Phase, PolicyRef, Refusal, SessionState, ToolFlags,
    Turn,
};
use agentry_llm::{Completion, Message, ToolCall, Usage};
use agentry_policy::{Decision, Policy, SessionRule};
use agentry_policy::{PolicyConfig, PolicyDecision, PolicyRule};
use agentry_proto::sessions::v1::{
    self as pb, ApprovalDecision, ApprovalMode, ErrorSource, OutputStream, TokenUsage,
    ToolCallPhase, TurnOutcome, event::Kind,
};
use pretty_assertions::assert_eq;
use std::collections::BTreeMap;
use std::sync::Arc;

// ---------------------------------------------------------------------------
// Helpers: inputs
// ---------------------------------------------------------------------------

const TURN: &str = "turn-1";
const TURN2: &str = "turn-2";
const MODEL: &str = "test-model";
const ALLOW_ALL: &str = "allow all";
const CANCELLED_OUTPUT: &str = "error: cancelled before it finished";
const RESTARTED_GENERATING: &str =
    "the orchestrator restarted while the model was answering; asking the model again";
const RESTARTED_USING_TOOLS: &str = "the orchestrator restarted while tool calls were in progress";
const BASH_DEFAULT: &str = "default for bash: confirm";
const SUDO_RULE: &str = r#"rule 1 (bash "sudo *"): no privilege escalation"#;
const GIT_STATUS_RULE: &str = r#"rule 2 (bash "git status")"#;
const SECRETS_RULE: &str = r#"rule 3 (read_file path "secrets/**"): secrets stay secret"#;
const READ_FILE_DEFAULT: &str = "default for read_file: allow";
const GREP_DEFAULT: &str = "default for grep: allow";
const STAT_DEFAULT: &str = "default for stat: allow";
const WRITE_FILE_DEFAULT: &str = "default for write_file: confirm";
const APPROVED: &str = "approved by a person";
const APPROVED_FOR_SESSION: &str = "approved by a person for this session";
const EDITED: &str = "edited and approved by a person";

fn gave_up(times: u32) -> String {
    format!("the orchestrator restarted {times} times during this turn; giving up on it")
}

fn outcome_unknown(tool: &str) -> String {
    format!(
        "error: outcome unknown: the runtime restarted while this {tool} call was running; it \
         may or may not have taken effect. Check before repeating it."
    )
}

fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

fn bash(id: &str, command: &str) -> ToolCall {
    call(
        id,
        "bash",
        &serde_json::json!({ "command": command }).to_string(),
    )
}

fn read_file(id: &str, path: &str) -> ToolCall {
    call(
        id,
        "read_file",
        &serde_json::json!({ "path": path }).to_string(),
    )
}

fn grep(id: &str) -> ToolCall {
    call(id, "grep", r#"{"pattern":"x"}"#)
}

fn stat(id: &str) -> ToolCall {
    call(id, "stat", r#"{"path":"a.txt"}"#)
}

fn write_file(id: &str, path: &str) -> ToolCall {
    call(
        id,
        "write_file",
        &serde_json::json!({ "path": path, "content": "x" }).to_string(),
    )
}

/// The two calls most tests use: `c1` (shell) then `c2` (read_file). With
/// the default (empty) catalog both are mutating, so they run one by one.
fn two_calls() -> Vec<ToolCall> {
    vec![
        call("c1", "shell", r#"{"cmd":"ls"}"#),
        call("c2", "read_file", r#"{"path":"a.txt"}"#),
    ]
}

fn c1() -> ToolCall {
    two_calls()[0].clone()
}

fn c2() -> ToolCall {
    two_calls()[1].clone()
}

fn usage(prompt: u64, completion: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        cached_prompt_tokens: 0,
        cache_write_tokens: 0,
    }
}

fn token_usage(prompt: u64, completion: u64) -> TokenUsage {
    TokenUsage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        cached_prompt_tokens: 0,
        cache_write_prompt_tokens: 0,
    }
}

/// A model response using 10 prompt + 2 completion tokens.
fn completion(text: &str, calls: Vec<ToolCall>) -> Completion {
    completion_with_usage(text, calls, Some(usage(10, 2)))
}

fn completion_with_usage(text: &str, calls: Vec<ToolCall>, usage: Option<Usage>) -> Completion {
    let finish_reason = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    Completion {
        text: text.into(),
        tool_calls: calls,
        finish_reason: finish_reason.into(),
        usage,
        model: MODEL.into(),
    }
}

fn model_done(text: &str, calls: Vec<ToolCall>) -> Input {
    Input::ModelDone(completion(text, calls))
}

fn tool_result(call_id: &str, output: &str) -> pb::ToolResult {
    pb::ToolResult {
        truncated: false,
        timed_out: false,
        sub_agent_usage: None,
        call_id: call_id.into(),
        tool: "shell".into(),
        output: output.into(),
        is_error: false,
        exit_code: Some(0),
        duration_ms: 12,
        runner_id: "runner-1".into(),
        secrets_used: Vec::new(),
    }
}

fn done(call_id: &str, output: &str) -> Input {
    Input::ToolDone(tool_result(call_id, output))
}

fn user(text: &str) -> Input {
    user_in(TURN, text)
}

fn user_in(turn_id: &str, text: &str) -> Input {
    user_with(turn_id, text, ApprovalMode::Policy)
}

fn user_with(turn_id: &str, text: &str, approval_mode: ApprovalMode) -> Input {
    Input::UserMessage {
        images: Vec::new(),
        turn_id: turn_id.into(),
        text: text.into(),
        approval_mode,
        plan: false,
        network: false,
        budget: None,
    }
}

fn cancel(reason: &str) -> Input {
    Input::Cancel {
        reason: reason.into(),
    }
}

fn model_failed(message: &str, retryable: bool) -> Input {
    Input::ModelFailed {
        message: message.into(),
        retryable,
    }
}

fn chunk(call_id: &str, stream: OutputStream, text: &str) -> Input {
    Input::ToolChunk {
        call_id: call_id.into(),
        stream,
        text: text.into(),
    }
}

fn approval(call_id: &str, decision: ApprovalDecision, reason: &str, edited: &str) -> Input {
    Input::Approval {
        call_id: call_id.into(),
        decision,
        reason: reason.into(),
        edited_arguments_json: edited.into(),
        by: None,
    }
}

fn approve(call_id: &str) -> Input {
    approval(call_id, ApprovalDecision::Approve, "", "")
}

fn approve_for_session(call_id: &str) -> Input {
    approval(call_id, ApprovalDecision::ApproveForSession, "", "")
}

fn deny(call_id: &str, reason: &str) -> Input {
    approval(call_id, ApprovalDecision::Deny, reason, "")
}

fn edit(call_id: &str, arguments: &str) -> Input {
    approval(call_id, ApprovalDecision::Edit, "", arguments)
}

// ---------------------------------------------------------------------------
// Helpers: events and effects
// ---------------------------------------------------------------------------

/// All events of the Record effects, in order.
fn events_of(effects: &[Effect]) -> Vec<Kind> {
    effects
        .iter()
        .flat_map(|e| match e {
            Effect::Record { events, .. } => events.clone(),
            _ => Vec::new(),
        })
        .collect()
}

fn run_tools(effects: &[Effect]) -> Vec<ToolCall> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::RunTool { call, .. } => Some(call.clone()),
            _ => None,
        })
        .collect()
}

fn record(turn_id: &str, events: Vec<Kind>) -> Effect {
    Effect::Record {
        turn_id: turn_id.into(),
        events,
    }
}

fn user_message(text: &str) -> Kind {
    user_message_with(text, ApprovalMode::Policy)
}

fn user_message_with(text: &str, mode: ApprovalMode) -> Kind {
    Kind::UserMessage(pb::UserMessage {
        images: Vec::new(),
        text: text.into(),
        approval_mode: mode as i32,
        plan: false,
        network: false,
        budget: None,
        compact: false,
    })
}

fn model_message(text: &str, finish_reason: &str, step: u32, usage: Option<TokenUsage>) -> Kind {
    Kind::ModelMessage(pb::ModelMessage {
        text: text.into(),
        finish_reason: finish_reason.into(),
        usage,
        model: MODEL.into(),
        step,
        ..Default::default()
    })
}

/// The fixed part of a request in the default view (an empty system
/// prompt), in estimated tokens.
const FIXED_BARE: u32 = 4;
/// The same with the test catalog of tools.
const FIXED_WITH_TOOLS: u32 = 99;

/// `message` as the session's first answer: it records the request's
/// fixed part and the window (the default view's 32,768 tokens).
fn first_answer(fixed: u32, message: Kind) -> Kind {
    match message {
        Kind::ModelMessage(m) => Kind::ModelMessage(pb::ModelMessage {
            fixed_tokens: fixed,
            context_window: 32_768,
            ..m
        }),
        other => other,
    }
}

/// The model message of a first response with tool calls.
fn first_message(text: &str) -> Kind {
    model_message(text, "tool_calls", 1, Some(token_usage(10, 2)))
}

/// The request of a call of a tool the catalog does not know.
fn requested(call: &ToolCall) -> Kind {
    requested_with(call, ToolFlags::default())
}

fn requested_with(call: &ToolCall, flags: ToolFlags) -> Kind {
    Kind::ToolCallRequested(pb::ToolCallRequested {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        arguments_json: call.arguments.clone(),
        read_only: flags.read_only,
        parallel_safe: flags.parallel_safe,
    })
}

/// The request of a call as the test catalog describes its tool.
fn requested_in_catalog(call: &ToolCall) -> Kind {
    requested_with(call, flags_of(&call.name))
}

fn phase_event(call_id: &str, phase: ToolCallPhase, detail: &str) -> Kind {
    Kind::ToolCallState(pb::ToolCallState {
        call_id: call_id.into(),
        phase: phase as i32,
        detail: detail.into(),
        allowed_by: 0,
    })
}

/// A call scheduled, with what allowed it as the wording of `detail`
/// says (the reducer decides it from the decision itself, not the words).
fn scheduled(call_id: &str, detail: &str) -> Kind {
    let allowed_by = if detail.contains("by a person") || detail.ends_with(" people") {
        pb::AllowedBy::Person
    } else if detail.starts_with("approved for this turn") {
        pb::AllowedBy::Turn
    } else if detail.starts_with("allowed by the hook") {
        pb::AllowedBy::Hook
    } else if detail.starts_with("session rule") {
        pb::AllowedBy::Session
    } else {
        pb::AllowedBy::Rule
    };
    Kind::ToolCallState(pb::ToolCallState {
        call_id: call_id.into(),
        phase: ToolCallPhase::Scheduled as i32,
        detail: detail.into(),
        allowed_by: allowed_by as i32,
    })
}

/// Scheduled by the default allow-all policy.
fn allowed(call_id: &str) -> Kind {
    scheduled(call_id, ALLOW_ALL)
}

fn executing(call_id: &str) -> Kind {
    phase_event(call_id, ToolCallPhase::Executing, "")
}

fn succeeded(call_id: &str) -> Kind {
    phase_event(call_id, ToolCallPhase::Success, "")
}

fn awaiting(call_id: &str) -> Kind {
    phase_event(call_id, ToolCallPhase::AwaitingApproval, "")
}

fn approval_requested(call: &ToolCall, matched_rule: &str) -> Kind {
    Kind::ApprovalRequested(pb::ApprovalRequested {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        arguments_json: call.arguments.clone(),
        matched_rule: matched_rule.into(),
        network: false,
        outcome_unknown: false,
        approvers: Vec::new(),
        approvals_required: 0,
    })
}

fn decided(
    call_id: &str,
    decision: ApprovalDecision,
    reason: &str,
    edited: &str,
    allowances: Vec<pb::SessionAllowance>,
) -> Kind {
    Kind::ApprovalDecided(pb::ApprovalDecided {
        call_id: call_id.into(),
        decision: decision as i32,
        reason: reason.into(),
        edited_arguments_json: edited.into(),
        allowances,
        approved_by: Vec::new(),
        approvals_missing: 0,
    })
}

fn allowance(tool: &str, command: &str, path: &str) -> pb::SessionAllowance {
    pb::SessionAllowance {
        tool: tool.into(),
        command: command.into(),
        path: path.into(),
    }
}

fn result_event(call_id: &str, output: &str) -> Kind {
    Kind::ToolResult(tool_result(call_id, output))
}

/// The events of a successful result: the Success state, then the result.
fn success(call_id: &str, output: &str) -> Vec<Kind> {
    vec![succeeded(call_id), result_event(call_id, output)]
}

/// The error result the reducer writes for a call that will not (or did not
/// visibly) run.
fn closed_result(call: &ToolCall, output: &str) -> Kind {
    Kind::ToolResult(pb::ToolResult {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        output: output.into(),
        is_error: true,
        ..Default::default()
    })
}

/// A call closed by the reducer: its terminal state (the output as detail),
/// then its error result.
fn closed(call: &ToolCall, phase: ToolCallPhase, output: &str) -> Vec<Kind> {
    vec![
        phase_event(&call.id, phase, output),
        closed_result(call, output),
    ]
}

fn finished(outcome: TurnOutcome, message: &str, steps: u32, usage: TokenUsage) -> Kind {
    Kind::TurnFinished(pb::TurnFinished {
        outcome: outcome as i32,
        message: message.into(),
        steps,
        usage: Some(usage),
        cost: None,
        currency: String::new(),
    })
}

fn error(source: ErrorSource, message: &str, retryable: bool) -> Kind {
    Kind::Error(pb::Error {
        source: source as i32,
        message: message.into(),
        retryable,
    })
}

fn step_limit_message(steps: u32) -> String {
    format!("stopped after {steps} model calls (the step limit); send a message to continue")
}

fn assistant(content: &str, tool_calls: Vec<ToolCall>) -> Message {
    Message::Assistant {
        content: content.into(),
        tool_calls,
    }
}

fn concat(parts: Vec<Vec<Kind>>) -> Vec<Kind> {
    parts.into_iter().flatten().collect()
}

// ---------------------------------------------------------------------------
// Helpers: states
// ---------------------------------------------------------------------------

/// A call of a tool the catalog does not know, as the turn holds it.
fn call_in(call: &ToolCall, phase: CallPhase, answered: bool) -> Call {
    Call {
        id: call.id.clone(),
        tool: call.name.clone(),
        arguments: call.arguments.clone(),
        effective_arguments: call.arguments.clone(),
        read_only: false,
        parallel_safe: false,
        phase,
        answered,
        outcome_unknown: false,
        hook_asked: false,
        need: agentry_policy::Need::default(),
        approved_by: Vec::new(),
        asking: None,
        resume: None,
    }
}

fn turn(
    id: &str,
    steps: u32,
    usage: TokenUsage,
    calls: Vec<Call>,
    assistant_index: usize,
    last_text: &str,
) -> Turn {
    Turn {
        id: id.into(),
        steps,
        usage,
        calls,
        assistant_index,
        last_text: last_text.into(),
        approval_mode: ApprovalMode::Policy,
        restarts: 0,
        skillset: String::new(),
        plan: None,
        network: false,
        cost: 0.0,
        compact: false,
        unreadable: None,
    }
}

/// A new session's state with `phase`, `turn` and `history`.
fn state_with(
    phase: Phase,
    turn: Option<Turn>,
    history: Vec<Message>,
    max_steps: u32,
) -> SessionState {
    SessionState {
        phase,
        turn,
        history,
        ..SessionState::new(max_steps)
    }
}

/// The state without the seqs it has seen (which explicit expected states
/// do not spell out; the replay checks compare them in full).
/// The state without its bookkeeping (the seqs of the log, what the
/// session has spent), for comparing with a state built by hand.
fn core(state: &SessionState) -> SessionState {
    SessionState {
        history_spans: Vec::new(),
        last_seq: 0,
        spent_tokens: 0,
        spent_cost: 0.0,
        failed_calls: Default::default(),
        ..state.clone()
    }
}

fn idle(history: Vec<Message>, max_steps: u32) -> SessionState {
    state_with(Phase::Idle, None, history, max_steps)
}

/// A session that has just started turn `TURN` with "hello" (phase Generate).
fn generating(max_steps: u32) -> SessionState {
    let mut state = SessionState::new(max_steps);
    state.step(user("hello")).unwrap();
    state
}

/// A session whose first response asked for [`two_calls`] (phase UseTools,
/// `c1` executing, `c2` scheduled behind it).
fn using_tools(max_steps: u32) -> SessionState {
    let mut state = generating(max_steps);
    state.step(model_done("let me look", two_calls())).unwrap();
    state
}

/// A session back in Generate after both tool calls of step 1 answered.
fn generating_step_two(max_steps: u32) -> SessionState {
    let mut state = using_tools(max_steps);
    state.step(done("c1", "out1")).unwrap();
    state.step(done("c2", "out2")).unwrap();
    state
}

/// A session whose first turn completed ("the answer").
fn idle_after_turn(max_steps: u32) -> SessionState {
    let mut state = generating(max_steps);
    state.step(model_done("the answer", vec![])).unwrap();
    state
}

/// Steps `input` and checks it is refused with `refusal`, leaving the whole
/// state unchanged.
fn assert_refused(state: &SessionState, input: Input, refusal: Refusal) {
    let mut after = state.clone();
    let what = format!("{input:?}");
    assert_eq!(after.step(input), Err(refusal), "input {what}");
    assert_eq!(&after, state, "a refused {what} changed the state");
}

// ---------------------------------------------------------------------------
// Helpers: policy and catalog
// ---------------------------------------------------------------------------

fn rule(
    tool: &str,
    command: Option<&str>,
    path: Option<&str>,
    decision: PolicyDecision,
    reason: Option<&str>,
) -> PolicyRule {
    PolicyRule {
        read_only_hint: None,
        tool: tool.into(),
        command: command.map(str::to_string),
        path: path.map(str::to_string),
        decision,
        reason: reason.map(str::to_string),
        check_arguments: true,
        network: false,
        approvers: Vec::new(),
        approvals_required: None,
    }
}

/// bash is confirmed except `sudo …` (denied) and `git status` (allowed);
/// read_file is allowed except under `secrets/` (denied); other tools get
/// the policy's default (read-only ones allowed, others confirmed).
fn test_policy_config() -> PolicyConfig {
    PolicyConfig {
        tools: BTreeMap::from([
            ("bash".to_string(), PolicyDecision::Confirm),
            ("read_file".to_string(), PolicyDecision::Allow),
        ]),
        rules: vec![
            rule(
                "bash",
                Some("sudo *"),
                None,
                PolicyDecision::Deny,
                Some("no privilege escalation"),
            ),
            rule(
                "bash",
                Some("git status"),
                None,
                PolicyDecision::Allow,
                None,
            ),
            rule(
                "read_file",
                None,
                Some("secrets/**"),
                PolicyDecision::Deny,
                Some("secrets stay secret"),
            ),
        ],
        network: false,
    }
}

fn test_policy() -> Arc<Policy> {
    Arc::new(Policy::from_config(&test_policy_config()).unwrap())
}

const MUTATING: ToolFlags = ToolFlags {
    read_only: false,
    parallel_safe: false,
    read_only_hint: false,
    network: false,
};
const MUTATING_NETWORKED: ToolFlags = ToolFlags {
    network: true,
    ..MUTATING
};
const READ_ONLY_PARALLEL: ToolFlags = ToolFlags {
    read_only: true,
    parallel_safe: true,
    read_only_hint: false,
    network: false,
};
const READ_ONLY_SERIAL: ToolFlags = ToolFlags {
    read_only: true,
    parallel_safe: false,
    read_only_hint: false,
    network: false,
};

/// read_file and grep are read-only and parallel-safe, stat is read-only but
/// must run alone, bash and write_file change things; bash's calls may be
/// given network.
fn catalog() -> Arc<Catalog> {
    catalog_of(&[
        ("bash", MUTATING_NETWORKED),
        ("write_file", MUTATING),
        ("read_file", READ_ONLY_PARALLEL),
        ("grep", READ_ONLY_PARALLEL),
        ("stat", READ_ONLY_SERIAL),
    ])
}

/// A catalog of these tools, each with a one-line description.
fn catalog_of(tools: &[(&str, ToolFlags)]) -> Arc<Catalog> {
    let mut catalog = Catalog::default();
    for (name, flags) in tools {
        catalog.add(
            agentry_llm::ToolDefinition {
                name: name.to_string(),
                description: format!("The {name} tool."),
                parameters: serde_json::json!({"type": "object"}),
            },
            *flags,
        );
    }
    Arc::new(catalog)
}

/// The model call a state makes with `history`: its prompt, the
/// conversation as given.
fn model_call(state: &SessionState, history: Vec<Message>) -> Effect {
    Effect::CallModel {
        request: state.request_for(history),
    }
}

/// The effect that runs `call`, with the test catalog's read-only flag
/// and no network.
fn ran(call: ToolCall) -> Effect {
    Effect::RunTool {
        read_only: flags_of(&call.name).read_only,
        call,
        network: false,
        resume: None,
    }
}

/// The same, for a session given no catalog (every tool counts as
/// mutating).
fn ran_unflagged(call: ToolCall) -> Effect {
    Effect::RunTool {
        call,
        read_only: false,
        network: false,
        resume: None,
    }
}

fn flags_of(tool: &str) -> ToolFlags {
    catalog().flags.get(tool).copied().unwrap_or_default()
}

/// A call as the turn holds it, with the test catalog's flags.
fn call_in_catalog(call: &ToolCall, phase: CallPhase, answered: bool) -> Call {
    let flags = flags_of(&call.name);
    Call {
        read_only: flags.read_only,
        parallel_safe: flags.parallel_safe,
        ..call_in(call, phase, answered)
    }
}

/// A [`Session`] with the test policy and catalog that started turn `TURN`
/// ("go") in `mode`.
fn policed(max_steps: u32, mode: ApprovalMode) -> Session {
    let mut session = Session::with_policy(max_steps, test_policy(), catalog());
    session.ok(user_with(TURN, "go", mode));
    session
}

/// The calls of the running turn.
fn calls_of(state: &SessionState) -> Vec<Call> {
    state
        .turn
        .as_ref()
        .map(|t| t.calls.clone())
        .unwrap_or_default()
}

fn phase_of(state: &SessionState, call_id: &str) -> Option<CallPhase> {
    state
        .turn
        .as_ref()
        .and_then(|t| t.calls.iter().find(|c| c.id == call_id))
        .map(|c| c.phase)
}

// ---------------------------------------------------------------------------
// Helpers: a session with its log
// ---------------------------------------------------------------------------

/// Checks the shape every step's effects have: an optional abort first, at
/// most one Record, then only RunTool, CallModel, Summarise, RunHooks,
/// EndTask, StopAsking and WakeAt.
fn check_effect_shape(effects: &[Effect]) {
    let mut rest = effects;
    if let [Effect::AbortInFlight, tail @ ..] = rest {
        rest = tail;
    }
    if let [Effect::Record { .. }, tail @ ..] = rest {
        rest = tail;
    }
    for effect in rest {
        assert!(
            matches!(
                effect,
                Effect::RunTool { .. }
                    | Effect::CallModel { .. }
                    | Effect::Summarise { .. }
                    | Effect::StopAsking { .. }
                    | Effect::WakeAt { .. }
                    | Effect::RunHooks(_)
                    | Effect::EndTask { .. }
            ),
            "unexpected effect {effect:?} in {effects:?}"
        );
    }
}

/// A session together with the log its Record effects wrote; every step
/// checks that rebuilding the state from the log (as the actor does after a
/// restart) gives the live state, that a refused input changed nothing, and
/// the shape of the effects.
struct Session {
    state: SessionState,
    log: Vec<pb::Event>,
    max_steps: u32,
}

impl Session {
    fn new(max_steps: u32) -> Self {
        Session {
            state: SessionState::new(max_steps),
            log: Vec::new(),
            max_steps,
        }
    }

    /// A session checking calls against `policy`, whose tools are
    /// `catalog` (as if an earlier log had recorded them).
    fn with_policy(max_steps: u32, policy: Arc<Policy>, catalog: Arc<Catalog>) -> Self {
        let mut session = Session::new(max_steps);
        session.state = session.state.with_policy(policy);
        session.state.catalog = catalog;
        session
    }

    /// The state the actor rebuilds from the log: a fresh state with this
    /// session's policy and view (not in the log) and its catalog (which a
    /// `ToolsOffered` event in the log replaces), replayed.
    fn rebuilt(&self) -> SessionState {
        self.fresh().replayed(&self.log)
    }

    /// A fresh state with this session's policy, view and catalog: what a
    /// replay starts from.
    fn fresh(&self) -> SessionState {
        let mut fresh = SessionState::new(self.max_steps)
            .with_policy(self.state.policy.0.clone())
            .with_plan_max_steps(self.state.plan_max_steps)
            .with_view(self.state.view.0.clone());
        fresh.catalog = self.state.catalog.clone();
        fresh
    }

    /// Every checkpoint the log allows (after each event at which the
    /// replayed state is idle), restored with the events after it, gives
    /// the live state; one is refused only when a later rewind goes back
    /// past it.
    fn check_checkpoints(&self, what: &str) {
        for at in 1..=self.log.len() {
            let Some(checkpoint) = self.fresh().replayed(&self.log[..at]).checkpoint() else {
                continue;
            };
            assert_eq!(checkpoint.seq, at as u64, "checkpoint after event {at}");
            let after = &self.log[at..];
            match self.fresh().resumed(&checkpoint, after) {
                Some(resumed) => assert_eq!(
                    resumed, self.state,
                    "the checkpoint after event {at}, with the events after it, differs from \
                     the live state after {what}"
                ),
                None => assert!(
                    after.iter().any(|e| matches!(
                        &e.kind,
                        Some(pb::event::Kind::SessionRewound(r)) if r.to_seq < at as u64
                    )),
                    "the checkpoint after event {at} was refused after {what} with no rewind \
                     past it"
                ),
            }
        }
    }

    /// The session as a restarted orchestrator finds it: rebuilt from its log
    /// (which stops at the crash point).
    fn restarted(&self) -> Session {
        Session {
            state: self.rebuilt(),
            log: self.log.clone(),
            max_steps: self.max_steps,
        }
    }

    fn step(&mut self, input: Input) -> Result<Vec<Effect>, Refusal> {
        let before = self.state.clone();
        let what = format!("{input:?}");
        let result = self.state.step(input);
        match &result {
            Ok(effects) => {
                check_effect_shape(effects);
                for effect in effects {
                    if let Effect::Record { turn_id, events } = effect {
                        assert!(!events.is_empty(), "an empty Record after {what}");
                        for kind in events {
                            self.log.push(pb::Event {
                                session_id: "session-1".into(),
                                seq: self.log.len() as u64 + 1,
                                turn_id: turn_id.clone(),
                                time: None,
                                kind: Some(kind.clone()),
                                live: false,
                                by: String::new(),
                            });
                        }
                    }
                }
            }
            Err(_) => assert_eq!(self.state, before, "refused {what} changed the state"),
        }
        assert_eq!(
            self.rebuilt(),
            self.state,
            "replaying the log after {what} differs from the live state"
        );
        self.check_checkpoints(&what);
        if self.state.policy == SessionState::new(1).policy
            && self.state.catalog.definitions.is_empty()
            && self.state.view == SessionState::new(1).view
            && self.state.plan_max_steps == SessionState::new(1).plan_max_steps
        {
            assert_eq!(
                SessionState::replay(self.max_steps, &self.log),
                self.state,
                "SessionState::replay after {what}"
            );
        }
        result
    }

    fn ok(&mut self, input: Input) -> Vec<Effect> {
        let what = format!("{input:?}");
        self.step(input)
            .unwrap_or_else(|r| panic!("{what} refused: {r}"))
    }

    fn refused(&mut self, input: Input, refusal: Refusal) {
        let what = format!("{input:?}");
        assert_eq!(self.step(input), Err(refusal), "{what}");
    }
}

mod approvals;
mod approvers;
mod basics;
mod budgets;
mod checkpoints;
mod compaction;
mod generate;
mod hooks;
mod idle;
mod lifecycle;
mod limits;
mod loops;
mod mcp;
mod network;
mod plan;
mod randomized;
mod recovery;
mod regressions;
mod replay;
mod unreadable;
mod use_tools;
