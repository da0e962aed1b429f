#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Unit tests of the session reducer: every (phase, input) transition, the
//! events and effects it yields, the state it leaves, the tool-call
//! lifecycle (policy, approvals, dispatch, recovery after a restart), and the
//! replay property (the state is exactly the fold of the recorded events).

use crate::reducer::{
    Call, CallPhase, Effect, Input, Phase, PolicyRef, Refusal, SessionState, ToolFlags, Turn,
};
use agentry_llm::{Completion, Message, ToolCall, Usage};
use agentry_policy::{Decision, Policy, SessionRule};
use agentry_proto::sessions::v1::{
    self as pb, ApprovalDecision, ApprovalMode, ErrorSource, OutputStream, TokenUsage,
    ToolCallPhase, TurnOutcome, event::Kind,
};
use agentry_runtime::config::{PolicyConfig, PolicyDecision, PolicyRule};
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
    }
}

fn token_usage(prompt: u64, completion: u64) -> TokenUsage {
    TokenUsage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
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
        call_id: call_id.into(),
        tool: "shell".into(),
        output: output.into(),
        is_error: false,
        exit_code: Some(0),
        duration_ms: 12,
        runner_id: "runner-1".into(),
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
        turn_id: turn_id.into(),
        text: text.into(),
        approval_mode,
        plan: false,
        network: false,
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
            Effect::RunTool(call) => Some(call.clone()),
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
        text: text.into(),
        approval_mode: mode as i32,
        plan: false,
        network: false,
    })
}

fn model_message(text: &str, finish_reason: &str, step: u32, usage: Option<TokenUsage>) -> Kind {
    Kind::ModelMessage(pb::ModelMessage {
        text: text.into(),
        finish_reason: finish_reason.into(),
        usage,
        model: MODEL.into(),
        step,
    })
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
    })
}

fn scheduled(call_id: &str, detail: &str) -> Kind {
    phase_event(call_id, ToolCallPhase::Scheduled, detail)
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
fn core(state: &SessionState) -> SessionState {
    SessionState {
        history_spans: Vec::new(),
        last_seq: 0,
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
        tool: tool.into(),
        command: command.map(str::to_string),
        path: path.map(str::to_string),
        decision,
        reason: reason.map(str::to_string),
        check_arguments: true,
        network: false,
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
};
const READ_ONLY_PARALLEL: ToolFlags = ToolFlags {
    read_only: true,
    parallel_safe: true,
};
const READ_ONLY_SERIAL: ToolFlags = ToolFlags {
    read_only: true,
    parallel_safe: false,
};

/// read_file and grep are read-only and parallel-safe, stat is read-only but
/// must run alone, bash and write_file change things.
fn catalog() -> BTreeMap<String, ToolFlags> {
    BTreeMap::from([
        ("bash".to_string(), MUTATING),
        ("write_file".to_string(), MUTATING),
        ("read_file".to_string(), READ_ONLY_PARALLEL),
        ("grep".to_string(), READ_ONLY_PARALLEL),
        ("stat".to_string(), READ_ONLY_SERIAL),
    ])
}

fn flags_of(tool: &str) -> ToolFlags {
    catalog().get(tool).copied().unwrap_or_default()
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
/// most one Record, then only RunTool and CallModel.
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
            matches!(effect, Effect::RunTool(_) | Effect::CallModel { .. }),
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

    fn with_policy(
        max_steps: u32,
        policy: Arc<Policy>,
        catalog: BTreeMap<String, ToolFlags>,
    ) -> Self {
        let mut session = Session::new(max_steps);
        session.state = session.state.with_policy(policy);
        session.ok(Input::ToolCatalog(catalog));
        session
    }

    /// The state the actor rebuilds from the log: a fresh state with this
    /// session's policy and tool catalog (neither is in the log), replayed.
    fn rebuilt(&self) -> SessionState {
        let mut fresh = SessionState::new(self.max_steps)
            .with_policy(self.state.policy.0.clone())
            .with_plan_max_steps(self.state.plan_max_steps);
        fresh.catalog = self.state.catalog.clone();
        fresh.replayed(&self.log)
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
        if self.state.policy == SessionState::new(1).policy
            && self.state.catalog.is_empty()
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

// ---------------------------------------------------------------------------
// Construction and replay basics
// ---------------------------------------------------------------------------

#[test]
fn new_session_is_idle_and_empty() {
    let state = SessionState::new(3);
    assert_eq!(state.phase, Phase::Idle);
    assert_eq!(state.turn, None);
    assert_eq!(state.history, vec![]);
    assert_eq!(state.max_steps, 3);
    assert_eq!(state.session_rules, vec![]);
    assert_eq!(state.catalog, BTreeMap::new());
    assert!(state.is_idle());
    assert_eq!(state.turn_id(), None);
    assert!(state.awaiting_approval().is_empty());
    // The shared allow-all policy.
    assert_eq!(state.policy, SessionState::new(7).policy);
    let verdict = state
        .policy
        .0
        .check("bash", r#"{"command":"sudo rm -rf /"}"#, false, &[]);
    assert_eq!(verdict.decision, Decision::Allow);
    assert_eq!(verdict.rule, ALLOW_ALL);
}

#[test]
fn policies_compare_by_instance() {
    let policy = test_policy();
    let a = SessionState::new(3).with_policy(policy.clone());
    let b = SessionState::new(3).with_policy(policy.clone());
    assert_eq!(a, b);
    assert!(Arc::ptr_eq(&a.policy.0, &policy));
    // Same rules, another instance: a different policy.
    assert_ne!(a, SessionState::new(3).with_policy(test_policy()));
    assert_ne!(
        SessionState::new(3).policy,
        PolicyRef(Arc::new(Policy::allow_all()))
    );
    // `with_policy` changes nothing else.
    assert_eq!(
        SessionState {
            policy: SessionState::new(3).policy,
            ..a
        },
        SessionState::new(3)
    );
}

#[test]
fn max_steps_is_at_least_one() {
    assert_eq!(SessionState::new(0).max_steps, 1);
    assert_eq!(SessionState::replay(0, &[]).max_steps, 1);
    assert_eq!(SessionState::replay(0, &[]), SessionState::new(0));
}

#[test]
fn replay_of_no_events_is_a_new_session() {
    assert_eq!(SessionState::replay(5, &[]), SessionState::new(5));
    let policy = test_policy();
    assert_eq!(
        SessionState::new(5)
            .with_policy(policy.clone())
            .replayed(&[]),
        SessionState::new(5).with_policy(policy)
    );
}

#[test]
fn replay_skips_events_without_a_kind() {
    let events = vec![
        pb::Event {
            turn_id: TURN.into(),
            kind: None,
            ..Default::default()
        },
        pb::Event {
            turn_id: TURN.into(),
            kind: Some(user_message("hi")),
            ..Default::default()
        },
        pb::Event::default(),
    ];
    let mut expected = SessionState::new(2);
    expected.step(user("hi")).unwrap();
    assert_eq!(SessionState::replay(2, &events), expected);
}

#[test]
fn replayed_keeps_the_policy_and_the_catalog() {
    let mut live = Session::with_policy(4, test_policy(), catalog());
    live.ok(user("go"));
    live.ok(model_done("", vec![bash("b1", "make build")]));
    live.ok(approve_for_session("b1"));
    let rebuilt = live.rebuilt();
    assert!(Arc::ptr_eq(&rebuilt.policy.0, &live.state.policy.0));
    assert_eq!(rebuilt.catalog, catalog());
    assert_eq!(rebuilt, live.state);
    // `replay` uses the allow-all policy and an empty catalog; the rest is
    // the same fold.
    let plain = SessionState::replay(4, &live.log);
    assert_eq!(
        plain,
        SessionState {
            policy: SessionState::new(1).policy,
            catalog: BTreeMap::new(),
            ..live.state.clone()
        }
    );
}

#[test]
fn refusals_read_well() {
    assert_eq!(
        Refusal::Unexpected {
            input: "tool output",
            phase: Phase::Idle,
        }
        .to_string(),
        "unexpected tool output while the session is Idle"
    );
    assert_eq!(Refusal::EmptyMessage.to_string(), "the message is empty");
    assert_eq!(
        Refusal::NothingToCancel.to_string(),
        "no turn is running in this session"
    );
    assert_eq!(
        Refusal::Busy.to_string(),
        "a turn is already running in this session; wait for it to finish or cancel it"
    );
    assert_eq!(
        Refusal::NoPendingApproval {
            call_id: "c9".into()
        }
        .to_string(),
        r#"no approval is pending for call "c9""#
    );
    assert_eq!(
        Refusal::InvalidDecision("bad edit".into()).to_string(),
        "bad edit"
    );
}

#[test]
fn only_malformed_inputs_are_invalid_arguments() {
    assert!(Refusal::EmptyMessage.is_invalid_argument());
    assert!(Refusal::InvalidDecision("x".into()).is_invalid_argument());
    for refusal in [
        Refusal::Busy,
        Refusal::NothingToCancel,
        Refusal::NoPendingApproval {
            call_id: "c1".into(),
        },
        Refusal::Unexpected {
            input: "tool result",
            phase: Phase::UseTools,
        },
    ] {
        assert!(!refusal.is_invalid_argument(), "{refusal:?}");
    }
}

#[test]
fn call_phases_only_move_forward() {
    use CallPhase::*;
    let all = [
        Validating,
        AwaitingApproval,
        Scheduled,
        Executing,
        Success,
        Error,
        Cancelled,
    ];
    for (i, from) in all.iter().enumerate() {
        for (j, to) in all.iter().enumerate() {
            // The three terminal phases are equally far.
            let forward = j > i && !from.is_terminal();
            assert_eq!(from.can_move_to(*to), forward, "{from:?} -> {to:?}");
        }
        assert_eq!(from.is_terminal(), i >= 4, "{from:?}");
    }
}

// ---------------------------------------------------------------------------
// Tool catalog (any phase)
// ---------------------------------------------------------------------------

#[test]
fn tool_catalog_is_taken_in_every_phase_without_events() {
    for state in [
        SessionState::new(4),
        generating(4),
        using_tools(4),
        generating_step_two(4),
        idle_after_turn(4),
    ] {
        let mut after = state.clone();
        assert_eq!(after.step(Input::ToolCatalog(catalog())), Ok(vec![]));
        assert_eq!(
            after,
            SessionState {
                catalog: catalog(),
                ..state.clone()
            }
        );
        // A new catalog replaces the old one.
        let small = BTreeMap::from([("grep".to_string(), READ_ONLY_SERIAL)]);
        assert_eq!(after.step(Input::ToolCatalog(small.clone())), Ok(vec![]));
        assert_eq!(after.catalog, small);
        assert_eq!(after.step(Input::ToolCatalog(BTreeMap::new())), Ok(vec![]));
        assert_eq!(after, state);
    }
}

#[test]
fn tool_catalog_does_not_change_calls_already_requested() {
    let mut state = using_tools(4);
    let calls = calls_of(&state);
    state.step(Input::ToolCatalog(catalog())).unwrap();
    assert_eq!(calls_of(&state), calls);
}

// ---------------------------------------------------------------------------
// Idle
// ---------------------------------------------------------------------------

#[test]
fn idle_user_message_records_it_and_calls_the_model() {
    let mut state = SessionState::new(4);
    let effects = state.step(user("hello")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(TURN, vec![user_message("hello")]),
            Effect::CallModel {
                history: vec![Message::user("hello")],
            },
        ]
    );
    assert_eq!(
        core(&state),
        state_with(
            Phase::Generate,
            Some(turn(TURN, 0, TokenUsage::default(), vec![], 0, "")),
            vec![Message::user("hello")],
            4
        )
    );
    assert!(!state.is_idle());
    assert_eq!(state.turn_id(), Some(TURN));
}

#[test]
fn idle_user_message_records_the_approval_mode() {
    for mode in [
        ApprovalMode::Unspecified,
        ApprovalMode::Policy,
        ApprovalMode::Always,
        ApprovalMode::Never,
    ] {
        let mut session = Session::new(4);
        let effects = session.ok(user_with(TURN, "hello", mode));
        assert_eq!(
            events_of(&effects),
            vec![user_message_with("hello", mode)],
            "{mode:?}"
        );
        assert_eq!(
            session.state.turn,
            Some(Turn {
                approval_mode: mode,
                ..turn(TURN, 0, TokenUsage::default(), vec![], 0, "")
            })
        );
    }
}

#[test]
fn replay_of_an_unknown_approval_mode_uses_the_policy() {
    let events = [pb::Event {
        turn_id: TURN.into(),
        kind: Some(Kind::UserMessage(pb::UserMessage {
            text: "hi".into(),
            approval_mode: 99,
            plan: false,
            network: false,
        })),
        ..Default::default()
    }];
    let state = SessionState::replay(4, &events);
    assert_eq!(
        state.turn.map(|t| t.approval_mode),
        Some(ApprovalMode::Policy)
    );
}

#[test]
fn idle_user_message_keeps_the_text_as_sent() {
    let mut state = SessionState::new(4);
    let effects = state.step(user("  spaced out \n")).unwrap();
    assert_eq!(events_of(&effects), vec![user_message("  spaced out \n")]);
    assert_eq!(state.history, vec![Message::user("  spaced out \n")]);
}

#[test]
fn idle_user_message_after_a_turn_sends_the_whole_conversation() {
    let mut state = idle_after_turn(4);
    let effects = state.step(user_in(TURN2, "and then?")).unwrap();
    let history = vec![
        Message::user("hello"),
        Message::assistant("the answer"),
        Message::user("and then?"),
    ];
    assert_eq!(
        effects,
        vec![
            record(TURN2, vec![user_message("and then?")]),
            Effect::CallModel {
                history: history.clone(),
            },
        ]
    );
    assert_eq!(state.turn_id(), Some(TURN2));
    assert_eq!(state.history, history);
}

#[test]
fn idle_empty_or_blank_message_is_refused() {
    for text in ["", " ", "   ", "\n\t \r\n"] {
        assert_refused(&SessionState::new(4), user(text), Refusal::EmptyMessage);
        assert_refused(&idle_after_turn(4), user(text), Refusal::EmptyMessage);
        assert_refused(
            &SessionState::new(4),
            user_with(TURN, text, ApprovalMode::Never),
            Refusal::EmptyMessage,
        );
    }
}

#[test]
fn idle_cancel_is_refused() {
    assert_refused(
        &SessionState::new(4),
        cancel("stop"),
        Refusal::NothingToCancel,
    );
    assert_refused(&idle_after_turn(4), cancel(""), Refusal::NothingToCancel);
}

#[test]
fn idle_interrupted_does_nothing() {
    for state in [SessionState::new(4), idle_after_turn(4)] {
        let mut after = state.clone();
        assert_eq!(after.step(Input::Interrupted), Ok(vec![]));
        assert_eq!(after, state);
    }
}

#[test]
fn idle_model_output_is_refused() {
    let unexpected = Refusal::Unexpected {
        input: "model output",
        phase: Phase::Idle,
    };
    for state in [SessionState::new(4), idle_after_turn(4)] {
        assert_refused(&state, Input::ModelDelta("x".into()), unexpected.clone());
        assert_refused(&state, model_done("late", vec![]), unexpected.clone());
        assert_refused(&state, model_done("late", two_calls()), unexpected.clone());
        assert_refused(&state, model_failed("late", true), unexpected.clone());
    }
}

#[test]
fn idle_tool_output_is_refused() {
    let unexpected = Refusal::Unexpected {
        input: "tool output",
        phase: Phase::Idle,
    };
    for state in [SessionState::new(4), idle_after_turn(4)] {
        assert_refused(
            &state,
            chunk("c1", OutputStream::Stdout, "late"),
            unexpected.clone(),
        );
        assert_refused(&state, done("c1", "late"), unexpected.clone());
    }
}

#[test]
fn idle_approval_is_refused() {
    for state in [SessionState::new(4), idle_after_turn(4)] {
        for input in [
            approve("c1"),
            approve_for_session("c1"),
            deny("c1", "no"),
            edit("c1", "{}"),
            approval("c1", ApprovalDecision::Unspecified, "", ""),
        ] {
            assert_refused(
                &state,
                input,
                Refusal::NoPendingApproval {
                    call_id: "c1".into(),
                },
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Generate
// ---------------------------------------------------------------------------

#[test]
fn generate_user_message_is_busy() {
    assert_refused(&generating(4), user_in(TURN2, "hey"), Refusal::Busy);
    assert_refused(
        &generating_step_two(4),
        user_in(TURN2, "hey"),
        Refusal::Busy,
    );
    // Even an empty one: the session is busy first.
    assert_refused(&generating(4), user_in(TURN2, ""), Refusal::Busy);
}

#[test]
fn generate_model_delta_is_recorded_and_changes_nothing_else() {
    let mut state = generating(4);
    let before = state.clone();
    assert_eq!(
        state.step(Input::ModelDelta("Hel".into())),
        Ok(vec![record(
            TURN,
            vec![Kind::ModelTextDelta(pb::ModelTextDelta {
                text: "Hel".into()
            })]
        )])
    );
    assert_eq!(
        state.step(Input::ModelDelta("lo".into())),
        Ok(vec![record(
            TURN,
            vec![Kind::ModelTextDelta(pb::ModelTextDelta {
                text: "lo".into()
            })]
        )])
    );
    assert_eq!(core(&state), core(&before));
}

#[test]
fn generate_model_done_without_tool_calls_completes_the_turn() {
    let mut state = generating(4);
    let effects = state.step(model_done("the answer", vec![])).unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                model_message("the answer", "stop", 1, Some(token_usage(10, 2))),
                finished(TurnOutcome::Completed, "the answer", 1, token_usage(10, 2)),
            ]
        )]
    );
    assert_eq!(
        core(&state),
        idle(
            vec![Message::user("hello"), Message::assistant("the answer")],
            4
        )
    );
}

#[test]
fn generate_model_done_without_usage_records_none_and_sums_zero() {
    let mut state = generating(4);
    let effects = state
        .step(Input::ModelDone(completion_with_usage("ok", vec![], None)))
        .unwrap();
    assert_eq!(
        events_of(&effects),
        vec![
            model_message("ok", "stop", 1, None),
            finished(TurnOutcome::Completed, "ok", 1, TokenUsage::default()),
        ]
    );
}

#[test]
fn generate_model_done_with_two_tool_calls_runs_the_first() {
    let mut state = generating(4);
    let effects = state.step(model_done("let me look", two_calls())).unwrap();
    // Unknown tools count as mutating: they run one at a time.
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    first_message("let me look"),
                    requested(&c1()),
                    requested(&c2()),
                    allowed("c1"),
                    allowed("c2"),
                    executing("c1"),
                ]
            ),
            Effect::RunTool(c1()),
        ]
    );
    assert_eq!(
        core(&state),
        state_with(
            Phase::UseTools,
            Some(turn(
                TURN,
                1,
                token_usage(10, 2),
                vec![
                    call_in(&c1(), CallPhase::Executing, false),
                    call_in(&c2(), CallPhase::Scheduled, false),
                ],
                1,
                "let me look"
            )),
            vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
            ],
            4
        )
    );
}

#[test]
fn generate_model_done_takes_the_flags_from_the_catalog() {
    let mut state = generating(4);
    state.step(Input::ToolCatalog(catalog())).unwrap();
    let calls = vec![
        read_file("r1", "a.txt"),
        stat("s2"),
        bash("b3", "ls"),
        call("u4", "unknown_tool", "{}"),
    ];
    let effects = state.step(model_done("", calls.clone())).unwrap();
    let events = events_of(&effects);
    assert_eq!(
        events[1..5].to_vec(),
        vec![
            requested_with(&calls[0], READ_ONLY_PARALLEL),
            requested_with(&calls[1], READ_ONLY_SERIAL),
            requested_with(&calls[2], MUTATING),
            requested_with(&calls[3], ToolFlags::default()),
        ]
    );
    let flags: Vec<(bool, bool)> = calls_of(&state)
        .iter()
        .map(|c| (c.read_only, c.parallel_safe))
        .collect();
    assert_eq!(
        flags,
        vec![(true, true), (true, false), (false, false), (false, false)]
    );
}

#[test]
fn generate_model_done_with_only_tool_calls_has_empty_assistant_text() {
    let mut state = generating(4);
    let effects = state.step(model_done("", vec![c1()])).unwrap();
    assert_eq!(effects.last(), Some(&Effect::RunTool(c1())));
    assert_eq!(state.history.last(), Some(&assistant("", vec![c1()])));
}

#[test]
fn generate_model_done_with_invalid_arguments_answers_with_an_error() {
    let bad_json = call("c1", "shell", "{not json");
    let not_object = call("c2", "shell", "[1,2]");
    let empty = call("c3", "shell", "");
    let mut session = Session::new(4);
    session.ok(user("hello"));
    let effects = session.ok(model_done(
        "",
        vec![bad_json.clone(), not_object.clone(), empty.clone()],
    ));
    let events = events_of(&effects);
    assert_eq!(
        events[..4].to_vec(),
        vec![
            first_message(""),
            requested(&bad_json),
            requested(&not_object),
            requested(&empty),
        ]
    );
    let bad_json_output = match &events[4] {
        Kind::ToolCallState(s) => s.detail.clone(),
        other => panic!("expected a state event, got {other:?}"),
    };
    assert!(
        bad_json_output.starts_with("error: invalid arguments for shell: not valid JSON ("),
        "{bad_json_output}"
    );
    let not_object_output = "error: invalid arguments for shell: expected a JSON object, got [1,2]";
    assert_eq!(
        events[4..].to_vec(),
        concat(vec![
            closed(&bad_json, ToolCallPhase::Error, &bad_json_output),
            closed(&not_object, ToolCallPhase::Error, not_object_output),
            // Empty arguments mean `{}`.
            vec![allowed("c3"), executing("c3")],
        ])
    );
    assert_eq!(run_tools(&effects), vec![empty]);
}

#[test]
fn generate_model_done_with_only_invalid_calls_calls_the_model_again() {
    let bad = call("c1", "shell", "nope");
    let mut state = generating(4);
    let effects = state.step(model_done("", vec![bad.clone()])).unwrap();
    assert_eq!(effects.len(), 2);
    let Effect::CallModel { history } = &effects[1] else {
        panic!("expected a model call, got {effects:?}");
    };
    assert_eq!(history, &state.history);
    assert_eq!(state.phase, Phase::Generate);
    assert!(matches!(
        history.last(),
        Some(Message::Tool { tool_call_id, content })
            if tool_call_id == "c1" && content.starts_with("error: invalid arguments for shell")
    ));
}

#[test]
fn generate_model_done_at_a_later_step_counts_and_sums() {
    let mut state = generating_step_two(4);
    let effects = state
        .step(Input::ModelDone(completion_with_usage(
            "all done",
            vec![],
            Some(usage(20, 3)),
        )))
        .unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                model_message("all done", "stop", 2, Some(token_usage(20, 3))),
                finished(TurnOutcome::Completed, "all done", 2, token_usage(30, 5)),
            ]
        )]
    );
    assert!(state.is_idle());
}

#[test]
fn generate_model_done_at_the_last_allowed_step_still_completes() {
    // The step limit only stops a turn that wants to call the model again.
    let mut state = generating(1);
    let effects = state.step(model_done("short", vec![])).unwrap();
    assert_eq!(
        events_of(&effects).last(),
        Some(&finished(
            TurnOutcome::Completed,
            "short",
            1,
            token_usage(10, 2)
        ))
    );
    assert!(state.is_idle());
}

#[test]
fn generate_model_failed_fails_the_turn() {
    let mut state = generating(4);
    let effects = state
        .step(model_failed("connection refused", true))
        .unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                error(ErrorSource::Model, "connection refused", true),
                finished(
                    TurnOutcome::Failed,
                    "connection refused",
                    0,
                    TokenUsage::default()
                ),
            ]
        )]
    );
    assert_eq!(core(&state), idle(vec![Message::user("hello")], 4));

    // The session takes the next message.
    let effects = state.step(user_in(TURN2, "again")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(TURN2, vec![user_message("again")]),
            Effect::CallModel {
                history: vec![Message::user("hello"), Message::user("again")],
            },
        ]
    );
    assert_eq!(state.phase, Phase::Generate);
    assert_eq!(state.turn_id(), Some(TURN2));
}

#[test]
fn generate_model_failed_after_tools_reports_the_steps_so_far() {
    let mut state = generating_step_two(4);
    let effects = state.step(model_failed("bad gateway", false)).unwrap();
    assert_eq!(
        events_of(&effects),
        vec![
            error(ErrorSource::Model, "bad gateway", false),
            finished(TurnOutcome::Failed, "bad gateway", 1, token_usage(10, 2)),
        ]
    );
    assert_eq!(
        core(&state),
        idle(
            vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
                Message::tool("c1", "out1"),
                Message::tool("c2", "out2"),
            ],
            4
        )
    );
}

#[test]
fn generate_model_failure_does_not_count_as_a_restart() {
    let mut state = generating(4);
    state.apply(TURN, &error(ErrorSource::Model, "x", true));
    state.apply(TURN, &error(ErrorSource::Tool, "x", true));
    assert_eq!(core(&state), core(&generating(4)));
}

#[test]
fn generate_tool_output_is_refused() {
    let unexpected = Refusal::Unexpected {
        input: "tool output",
        phase: Phase::Generate,
    };
    for state in [generating(4), generating_step_two(4)] {
        assert_refused(
            &state,
            chunk("c1", OutputStream::Stdout, "late"),
            unexpected.clone(),
        );
        assert_refused(&state, done("c1", "late"), unexpected.clone());
        assert_refused(&state, done("c2", "late"), unexpected.clone());
    }
}

#[test]
fn generate_approval_is_refused() {
    // Also for the calls of the previous response, all answered.
    for state in [generating(4), generating_step_two(4)] {
        for id in ["c1", "c2", "ghost"] {
            assert_refused(
                &state,
                approve(id),
                Refusal::NoPendingApproval { call_id: id.into() },
            );
        }
    }
}

#[test]
fn generate_cancel_aborts_and_cancels_the_turn() {
    let mut state = generating(4);
    let effects = state.step(cancel("enough")).unwrap();
    assert_eq!(
        effects,
        vec![
            Effect::AbortInFlight,
            record(
                TURN,
                vec![
                    Kind::CancelRequested(pb::CancelRequested {
                        reason: "enough".into()
                    }),
                    finished(
                        TurnOutcome::Cancelled,
                        "cancelled",
                        0,
                        TokenUsage::default()
                    ),
                ]
            ),
        ]
    );
    assert_eq!(core(&state), idle(vec![Message::user("hello")], 4));
}

#[test]
fn generate_cancel_after_tools_reports_the_steps_so_far() {
    let mut state = generating_step_two(4);
    let effects = state.step(cancel("")).unwrap();
    // The calls of the previous response are all over: nothing to close.
    assert_eq!(
        effects,
        vec![
            Effect::AbortInFlight,
            record(
                TURN,
                vec![
                    Kind::CancelRequested(pb::CancelRequested::default()),
                    finished(TurnOutcome::Cancelled, "cancelled", 1, token_usage(10, 2)),
                ]
            ),
        ]
    );
    assert!(state.is_idle());
}

#[test]
fn generate_interrupted_asks_the_model_again() {
    let mut state = generating(4);
    let effects = state.step(Input::Interrupted).unwrap();
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![error(ErrorSource::Orchestrator, RESTARTED_GENERATING, true)]
            ),
            Effect::CallModel {
                history: vec![Message::user("hello")],
            },
        ]
    );
    assert_eq!(
        core(&state),
        state_with(
            Phase::Generate,
            Some(Turn {
                restarts: 1,
                ..turn(TURN, 0, TokenUsage::default(), vec![], 0, "")
            }),
            vec![Message::user("hello")],
            4
        )
    );
}

// ---------------------------------------------------------------------------
// UseTools
// ---------------------------------------------------------------------------

#[test]
fn use_tools_user_message_is_busy() {
    assert_refused(&using_tools(4), user_in(TURN2, "hey"), Refusal::Busy);
    let mut one_left = using_tools(4);
    one_left.step(done("c1", "out1")).unwrap();
    assert_refused(&one_left, user_in(TURN2, "hey"), Refusal::Busy);
}

#[test]
fn use_tools_model_output_is_refused() {
    let unexpected = Refusal::Unexpected {
        input: "model output",
        phase: Phase::UseTools,
    };
    let state = using_tools(4);
    assert_refused(&state, Input::ModelDelta("x".into()), unexpected.clone());
    assert_refused(&state, model_done("late", vec![]), unexpected.clone());
    assert_refused(&state, model_done("late", two_calls()), unexpected.clone());
    assert_refused(&state, model_failed("late", true), unexpected);
}

#[test]
fn use_tools_chunks_are_recorded_and_change_nothing_else() {
    let mut state = using_tools(4);
    let before = state.clone();
    for (stream, text) in [
        (OutputStream::Stdout, "line 1\n"),
        (OutputStream::Stderr, "warning\n"),
    ] {
        assert_eq!(
            state.step(chunk("c1", stream, text)),
            Ok(vec![record(
                TURN,
                vec![Kind::ToolOutputChunk(pb::ToolOutputChunk {
                    call_id: "c1".into(),
                    stream: stream as i32,
                    text: text.into(),
                })]
            )])
        );
    }
    assert_eq!(core(&state), core(&before));
}

#[test]
fn use_tools_chunks_of_calls_not_running_are_refused() {
    let unexpected = Refusal::Unexpected {
        input: "tool output",
        phase: Phase::UseTools,
    };
    let state = using_tools(4);
    // c2 is scheduled, not running.
    for id in ["c2", "ghost", ""] {
        assert_refused(
            &state,
            chunk(id, OutputStream::Stdout, "x"),
            unexpected.clone(),
        );
    }
    let mut one_left = state;
    one_left.step(done("c1", "out1")).unwrap();
    assert_refused(
        &one_left,
        chunk("c1", OutputStream::Stdout, "late"),
        unexpected,
    );
}

#[test]
fn use_tools_first_result_runs_the_next_call() {
    let mut state = using_tools(4);
    let effects = state.step(done("c1", "out1")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![success("c1", "out1"), vec![executing("c2")]])
            ),
            Effect::RunTool(c2()),
        ]
    );
    assert_eq!(
        core(&state),
        state_with(
            Phase::UseTools,
            Some(turn(
                TURN,
                1,
                token_usage(10, 2),
                vec![
                    call_in(&c1(), CallPhase::Success, true),
                    call_in(&c2(), CallPhase::Executing, false),
                ],
                1,
                "let me look"
            )),
            vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
                Message::tool("c1", "out1"),
            ],
            4
        )
    );
}

#[test]
fn use_tools_last_result_calls_the_model_with_the_results() {
    let mut state = using_tools(4);
    state.step(done("c1", "out1")).unwrap();
    let effects = state.step(done("c2", "out2")).unwrap();
    let history = vec![
        Message::user("hello"),
        assistant("let me look", two_calls()),
        Message::tool("c1", "out1"),
        Message::tool("c2", "out2"),
    ];
    assert_eq!(
        effects,
        vec![
            record(TURN, success("c2", "out2")),
            Effect::CallModel {
                history: history.clone(),
            },
        ]
    );
    assert_eq!(
        core(&state),
        state_with(
            Phase::Generate,
            Some(turn(
                TURN,
                1,
                token_usage(10, 2),
                vec![
                    call_in(&c1(), CallPhase::Success, true),
                    call_in(&c2(), CallPhase::Success, true),
                ],
                1,
                "let me look"
            )),
            history,
            4
        )
    );
}

#[test]
fn use_tools_error_result_is_passed_to_the_model() {
    let mut state = generating(4);
    state.step(model_done("", vec![c1()])).unwrap();
    let failed = pb::ToolResult {
        is_error: true,
        exit_code: Some(2),
        ..tool_result("c1", "ls: cannot access 'x'")
    };
    let effects = state.step(Input::ToolDone(failed.clone())).unwrap();
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    phase_event("c1", ToolCallPhase::Error, ""),
                    Kind::ToolResult(failed),
                ]
            ),
            Effect::CallModel {
                history: vec![
                    Message::user("hello"),
                    assistant("", vec![c1()]),
                    Message::tool("c1", "ls: cannot access 'x'"),
                ],
            },
        ]
    );
    assert_eq!(phase_of(&state, "c1"), Some(CallPhase::Error));
}

#[test]
fn use_tools_result_without_a_tool_name_gets_the_calls() {
    let mut state = using_tools(4);
    let effects = state
        .step(Input::ToolDone(pb::ToolResult {
            tool: String::new(),
            ..tool_result("c1", "out1")
        }))
        .unwrap();
    assert_eq!(
        events_of(&effects)[1],
        Kind::ToolResult(tool_result("c1", "out1"))
    );
}

#[test]
fn use_tools_result_for_a_call_not_running_is_refused() {
    let unexpected = Refusal::Unexpected {
        input: "tool result",
        phase: Phase::UseTools,
    };
    let state = using_tools(4);
    // Scheduled (not started), unknown, and empty ids.
    assert_refused(&state, done("c2", "out2"), unexpected.clone());
    assert_refused(&state, done("nope", "?"), unexpected.clone());
    assert_refused(&state, done("", "?"), unexpected.clone());

    // A second result for an answered call.
    let mut one_left = state;
    one_left.step(done("c1", "out1")).unwrap();
    assert_refused(&one_left, done("c1", "again"), unexpected);
}

#[test]
fn use_tools_cancel_closes_every_open_call() {
    let mut state = using_tools(4);
    let effects = state.step(cancel("enough")).unwrap();
    assert_eq!(
        effects,
        vec![
            Effect::AbortInFlight,
            record(
                TURN,
                concat(vec![
                    vec![Kind::CancelRequested(pb::CancelRequested {
                        reason: "enough".into()
                    })],
                    closed(&c1(), ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
                    closed(&c2(), ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
                    vec![finished(
                        TurnOutcome::Cancelled,
                        "cancelled",
                        1,
                        token_usage(10, 2)
                    )],
                ])
            ),
        ]
    );
    assert_eq!(
        core(&state),
        idle(
            vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
                Message::tool("c1", CANCELLED_OUTPUT),
                Message::tool("c2", CANCELLED_OUTPUT),
            ],
            4
        )
    );
}

#[test]
fn use_tools_cancel_after_the_first_result_closes_only_the_rest() {
    let mut state = using_tools(4);
    state.step(done("c1", "out1")).unwrap();
    let effects = state.step(cancel("")).unwrap();
    assert_eq!(
        effects,
        vec![
            Effect::AbortInFlight,
            record(
                TURN,
                concat(vec![
                    vec![Kind::CancelRequested(pb::CancelRequested::default())],
                    closed(&c2(), ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
                    vec![finished(
                        TurnOutcome::Cancelled,
                        "cancelled",
                        1,
                        token_usage(10, 2)
                    )],
                ])
            ),
        ]
    );
    assert_eq!(
        state.history,
        vec![
            Message::user("hello"),
            assistant("let me look", two_calls()),
            Message::tool("c1", "out1"),
            Message::tool("c2", CANCELLED_OUTPUT),
        ]
    );
    assert!(state.is_idle());
}

#[test]
fn use_tools_interrupted_reports_the_running_mutating_call_and_starts_the_next() {
    let mut state = using_tools(4);
    let unknown = outcome_unknown("shell");
    let effects = state.step(Input::Interrupted).unwrap();
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![error(
                        ErrorSource::Orchestrator,
                        RESTARTED_USING_TOOLS,
                        true
                    )],
                    closed(&c1(), ToolCallPhase::Error, &unknown),
                    vec![executing("c2")],
                ])
            ),
            Effect::RunTool(c2()),
        ]
    );
    assert_eq!(
        core(&state),
        state_with(
            Phase::UseTools,
            Some(Turn {
                restarts: 1,
                ..turn(
                    TURN,
                    1,
                    token_usage(10, 2),
                    vec![
                        call_in(&c1(), CallPhase::Error, true),
                        call_in(&c2(), CallPhase::Executing, false),
                    ],
                    1,
                    "let me look"
                )
            }),
            vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
                Message::tool("c1", &unknown),
            ],
            4
        )
    );
}

// ---------------------------------------------------------------------------
// Step limit
// ---------------------------------------------------------------------------

#[test]
fn step_limit_of_one_stops_after_the_first_tools() {
    let mut state = using_tools(1);
    assert_eq!(
        state.step(done("c1", "out1")),
        Ok(vec![
            record(
                TURN,
                concat(vec![success("c1", "out1"), vec![executing("c2")]])
            ),
            Effect::RunTool(c2()),
        ])
    );
    let effects = state.step(done("c2", "out2")).unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            concat(vec![
                success("c2", "out2"),
                vec![finished(
                    TurnOutcome::StepLimit,
                    &step_limit_message(1),
                    1,
                    token_usage(10, 2)
                )],
            ])
        )]
    );
    assert_eq!(
        core(&state),
        idle(
            vec![
                Message::user("hello"),
                assistant("let me look", two_calls()),
                Message::tool("c1", "out1"),
                Message::tool("c2", "out2"),
            ],
            1
        )
    );
    // The person may continue with a new turn.
    let effects = state.step(user_in(TURN2, "go on")).unwrap();
    assert!(matches!(effects.last(), Some(Effect::CallModel { .. })));
}

#[test]
fn step_limit_also_stops_when_every_call_was_refused() {
    let mut state = generating(1);
    let bad = call("c1", "shell", "nope");
    let effects = state.step(model_done("", vec![bad])).unwrap();
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(
        events_of(&effects).last(),
        Some(&finished(
            TurnOutcome::StepLimit,
            &step_limit_message(1),
            1,
            token_usage(10, 2)
        ))
    );
    assert!(state.is_idle());
}

#[test]
fn step_limit_of_two_stops_after_the_second_tools_with_summed_usage() {
    let mut state = generating(2);
    let effects = state
        .step(Input::ModelDone(completion_with_usage(
            "first",
            vec![c1()],
            Some(usage(10, 2)),
        )))
        .unwrap();
    assert_eq!(effects.last(), Some(&Effect::RunTool(c1())));
    let effects = state.step(done("c1", "out1")).unwrap();
    assert_eq!(
        effects,
        vec![
            record(TURN, success("c1", "out1")),
            Effect::CallModel {
                history: vec![
                    Message::user("hello"),
                    assistant("first", vec![c1()]),
                    Message::tool("c1", "out1"),
                ],
            },
        ]
    );
    let effects = state
        .step(Input::ModelDone(completion_with_usage(
            "second",
            vec![c2()],
            Some(usage(20, 3)),
        )))
        .unwrap();
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    model_message("second", "tool_calls", 2, Some(token_usage(20, 3))),
                    requested(&c2()),
                    allowed("c2"),
                    executing("c2"),
                ]
            ),
            Effect::RunTool(c2()),
        ]
    );
    let effects = state.step(done("c2", "out2")).unwrap();
    assert_eq!(
        effects,
        vec![record(
            TURN,
            concat(vec![
                success("c2", "out2"),
                vec![finished(
                    TurnOutcome::StepLimit,
                    &step_limit_message(2),
                    2,
                    token_usage(30, 5)
                )],
            ])
        )]
    );
    assert_eq!(
        core(&state),
        idle(
            vec![
                Message::user("hello"),
                assistant("first", vec![c1()]),
                Message::tool("c1", "out1"),
                assistant("second", vec![c2()]),
                Message::tool("c2", "out2"),
            ],
            2
        )
    );
}

#[test]
fn step_limit_counts_per_turn() {
    // A new turn starts from zero steps.
    let mut state = using_tools(1);
    state.step(done("c1", "out1")).unwrap();
    state.step(done("c2", "out2")).unwrap();
    assert!(state.is_idle());
    state.step(user_in(TURN2, "go on")).unwrap();
    assert_eq!(
        state.turn,
        Some(turn(TURN2, 0, TokenUsage::default(), vec![], 0, ""))
    );
    let effects = state.step(model_done("fine", vec![])).unwrap();
    assert_eq!(
        events_of(&effects),
        vec![
            model_message("fine", "stop", 1, Some(token_usage(10, 2))),
            finished(TurnOutcome::Completed, "fine", 1, token_usage(10, 2)),
        ]
    );
}

// ---------------------------------------------------------------------------
// History projection
// ---------------------------------------------------------------------------

#[test]
fn history_after_a_full_turn_with_tools() {
    let mut session = Session::new(4);
    session.ok(user("list and read"));
    session.ok(Input::ModelDelta("let me ".into()));
    session.ok(Input::ModelDelta("look".into()));
    session.ok(model_done("let me look", two_calls()));
    session.ok(chunk("c1", OutputStream::Stdout, "a.txt\n"));
    session.ok(done("c1", "a.txt\n"));
    session.ok(chunk("c2", OutputStream::Stdout, "hi"));
    session.ok(done("c2", "hi"));
    let effects = session.ok(Input::ModelDone(completion_with_usage(
        "a.txt says hi",
        vec![],
        Some(usage(30, 4)),
    )));
    assert_eq!(
        events_of(&effects).last(),
        Some(&finished(
            TurnOutcome::Completed,
            "a.txt says hi",
            2,
            token_usage(40, 6)
        ))
    );
    assert_eq!(
        session.state.history,
        vec![
            Message::User {
                content: "list and read".into(),
            },
            Message::Assistant {
                content: "let me look".into(),
                tool_calls: two_calls(),
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: "a.txt\n".into(),
            },
            Message::Tool {
                tool_call_id: "c2".into(),
                content: "hi".into(),
            },
            Message::Assistant {
                content: "a.txt says hi".into(),
                tool_calls: vec![],
            },
        ]
    );
    assert_eq!(session.state.phase, Phase::Idle);
    assert_eq!(session.state.turn, None);
}

#[test]
fn turn_tracks_the_last_response() {
    let mut state = using_tools(4);
    assert_eq!(state.turn.as_ref().unwrap().last_text, "let me look");
    assert_eq!(state.turn.as_ref().unwrap().assistant_index, 1);
    state.step(done("c1", "out1")).unwrap();
    state.step(done("c2", "out2")).unwrap();
    state
        .step(model_done("again", vec![call("c3", "shell", "{}")]))
        .unwrap();
    let t = state.turn.as_ref().unwrap();
    assert_eq!(t.last_text, "again");
    assert_eq!(t.steps, 2);
    assert_eq!(t.usage, token_usage(20, 4));
    assert_eq!(t.assistant_index, 4);
    // Only the calls of the latest response.
    assert_eq!(
        t.calls,
        vec![call_in(
            &call("c3", "shell", "{}"),
            CallPhase::Executing,
            false
        )]
    );
}

// ---------------------------------------------------------------------------
// Replay property
// ---------------------------------------------------------------------------

/// Runs `script` (input, whether it is accepted) through a [`Session`],
/// which checks after every step that replaying the log gives the live state.
fn run_script(max_steps: u32, script: Vec<(Input, bool)>) -> Session {
    run_script_in(Session::new(max_steps), script)
}

fn run_script_in(mut session: Session, script: Vec<(Input, bool)>) -> Session {
    for (input, accepted) in script {
        let what = format!("{input:?}");
        assert_eq!(session.step(input).is_ok(), accepted, "{what}");
    }
    assert_eq!(session.rebuilt(), session.state, "final replay");
    session
}

#[test]
fn replay_matches_a_plain_turn() {
    let session = run_script(
        4,
        vec![
            (user("hi"), true),
            (Input::ModelDelta("he".into()), true),
            (Input::ModelDelta("llo".into()), true),
            (model_done("hello", vec![]), true),
        ],
    );
    assert_eq!(
        core(&session.state),
        idle(vec![Message::user("hi"), Message::assistant("hello")], 4)
    );
    assert_eq!(session.log.len(), 5);
}

#[test]
fn replay_matches_two_turns_with_tools() {
    let session = run_script(
        4,
        vec![
            (user("hello"), true),
            (model_done("let me look", two_calls()), true),
            (chunk("c1", OutputStream::Stdout, "x"), true),
            (done("c1", "out1"), true),
            (done("c2", "out2"), true),
            (model_done("done", vec![]), true),
            (user_in(TURN2, "more"), true),
            (
                model_done("more calls", vec![call("c3", "shell", "{}")]),
                true,
            ),
            (done("c3", "out3"), true),
            (model_done("finished", vec![]), true),
        ],
    );
    let turn_ids: Vec<&str> = session.log.iter().map(|e| e.turn_id.as_str()).collect();
    // Turn 1: message; response, 2 requests, 2 scheduled, 1 executing;
    // chunk; success, result, executing; success, result; response, end.
    assert_eq!(turn_ids.iter().filter(|t| **t == TURN).count(), 15);
    // Turn 2: message; response, request, scheduled, executing; success,
    // result; response, end.
    assert_eq!(turn_ids.iter().filter(|t| **t == TURN2).count(), 9);
    assert_eq!(turn_ids.len(), 24);
    assert!(session.state.is_idle());
    assert_eq!(session.state.history.len(), 9);
}

#[test]
fn replay_matches_step_limits() {
    for max_steps in [1, 2, 3] {
        let mut script = vec![(user("loop"), true)];
        for i in 0..max_steps {
            let id = format!("c{i}");
            script.push((model_done("again", vec![call(&id, "shell", "{}")]), true));
            script.push((done(&id, "out"), true));
        }
        let session = run_script(max_steps, script);
        assert!(session.state.is_idle());
        assert_eq!(
            session.log.last().and_then(|e| e.kind.clone()),
            Some(finished(
                TurnOutcome::StepLimit,
                &step_limit_message(max_steps),
                max_steps,
                token_usage(10 * u64::from(max_steps), 2 * u64::from(max_steps))
            ))
        );
    }
}

#[test]
fn replay_matches_cancels_failures_and_interruptions() {
    let session = run_script(
        4,
        vec![
            (user("one"), true),
            (model_done("tools", two_calls()), true),
            (cancel("stop"), true),
            (done("c1", "too late"), false),
            (user_in(TURN2, "two"), true),
            (Input::ModelDelta("par".into()), true),
            (cancel(""), true),
            (model_done("too late", vec![]), false),
            (user_in("turn-3", "three"), true),
            (model_failed("boom", false), true),
            (user_in("turn-4", "four"), true),
            (model_done("tools", two_calls()), true),
            (done("c1", "out1"), true),
            // c2 (mutating) was running: its outcome is unknown; the model
            // is asked again.
            (Input::Interrupted, true),
            (done("c2", "too late"), false),
            (Input::Interrupted, true),
            (cancel(""), true),
            (user_in("turn-5", "five"), true),
            (Input::Interrupted, true),
            (Input::Interrupted, true),
            // The third restart of turn-5 gives up on it.
            (Input::Interrupted, true),
            (cancel(""), false),
            (Input::Interrupted, true),
        ],
    );
    assert!(session.state.is_idle());
    let outcomes: Vec<i32> = session
        .log
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::TurnFinished(f)) => Some(f.outcome),
            _ => None,
        })
        .collect();
    assert_eq!(
        outcomes,
        vec![
            TurnOutcome::Cancelled as i32,
            TurnOutcome::Cancelled as i32,
            TurnOutcome::Failed as i32,
            TurnOutcome::Cancelled as i32,
            TurnOutcome::Failed as i32,
        ]
    );
}

#[test]
fn replay_matches_with_refused_inputs_interleaved() {
    run_script(
        2,
        vec![
            (user(""), false),
            (cancel(""), false),
            (done("c1", "x"), false),
            (Input::ModelDelta("x".into()), false),
            (approve("c1"), false),
            (user("go"), true),
            (user("again"), false),
            (done("c1", "x"), false),
            (chunk("c1", OutputStream::Stderr, "x"), false),
            (approve("c1"), false),
            (model_done("t", two_calls()), true),
            (Input::ModelDelta("x".into()), false),
            (model_failed("x", true), false),
            (done("c2", "x"), false),
            (approve("c1"), false),
            (done("c1", "x"), true),
            (done("c1", "x"), false),
            (done("c2", "x"), true),
            (model_done("end", vec![]), true),
            (Input::Interrupted, true),
        ],
    );
}

#[test]
fn replay_matches_approvals_and_session_rules() {
    let session = run_script_in(
        Session::with_policy(4, test_policy(), catalog()),
        vec![
            (user("go"), true),
            (
                model_done(
                    "",
                    vec![
                        bash("b1", "make build"),
                        bash("b2", "make lint"),
                        bash("b3", "make test"),
                        write_file("w4", "out.txt"),
                    ],
                ),
                true,
            ),
            (approve_for_session("b1"), true),
            (done("b1", "built"), true),
            (edit("b2", r#"{"command":"git status"}"#), true),
            (done("b2", "clean"), true),
            (deny("b3", "not now"), true),
            (approve_for_session("w4"), true),
            (approve("w4"), false),
            (done("w4", "written"), true),
            (model_done("done", vec![]), true),
        ],
    );
    assert_eq!(
        session.state.session_rules,
        vec![
            SessionRule {
                tool: "bash".into(),
                command: Some("make build".into()),
                path: None,
            },
            SessionRule {
                tool: "write_file".into(),
                command: None,
                path: Some("out.txt".into()),
            },
        ]
    );
}

// ---------------------------------------------------------------------------
// Policy: allow, deny, confirm
// ---------------------------------------------------------------------------

#[test]
fn policy_allows_denies_and_asks() {
    let mut session = policed(4, ApprovalMode::Policy);
    let read = read_file("r1", "a.txt");
    let secret = read_file("r2", "secrets/key");
    let sudo = bash("b3", "sudo rm -rf /");
    let build = bash("b4", "make build");
    let status = bash("b5", "git status");
    let calls = vec![
        read.clone(),
        secret.clone(),
        sudo.clone(),
        build.clone(),
        status.clone(),
    ];
    let effects = session.ok(model_done("checking", calls.clone()));
    let denied_secret = format!("error: denied by policy: {SECRETS_RULE}");
    let denied_sudo = format!("error: denied by policy: {SUDO_RULE}");
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![first_message("checking")],
                    calls.iter().map(requested_in_catalog).collect(),
                    vec![scheduled("r1", READ_FILE_DEFAULT)],
                    closed(&secret, ToolCallPhase::Error, &denied_secret),
                    closed(&sudo, ToolCallPhase::Error, &denied_sudo),
                    vec![
                        approval_requested(&build, BASH_DEFAULT),
                        awaiting("b4"),
                        scheduled("b5", GIT_STATUS_RULE),
                        executing("r1"),
                    ],
                ])
            ),
            Effect::RunTool(read.clone()),
        ]
    );
    assert_eq!(
        calls_of(&session.state),
        vec![
            call_in_catalog(&read, CallPhase::Executing, false),
            call_in_catalog(&secret, CallPhase::Error, true),
            call_in_catalog(&sudo, CallPhase::Error, true),
            call_in_catalog(&build, CallPhase::AwaitingApproval, false),
            call_in_catalog(&status, CallPhase::Scheduled, false),
        ]
    );
    assert_eq!(
        session.state.awaiting_approval(),
        vec![&call_in_catalog(&build, CallPhase::AwaitingApproval, false)]
    );
    // Denied calls are answered at once, in the model's order.
    assert_eq!(
        session.state.history[2..].to_vec(),
        vec![
            Message::tool("r2", &denied_secret),
            Message::tool("b3", &denied_sudo),
        ]
    );

    // The read finishes; the call awaiting approval holds up git status.
    let effects = session.ok(done("r1", "text"));
    assert_eq!(effects, vec![record(TURN, success("r1", "text"))]);
    assert_eq!(phase_of(&session.state, "b5"), Some(CallPhase::Scheduled));
    assert_eq!(
        session.state.history[2..].to_vec(),
        vec![
            Message::tool("r1", "text"),
            Message::tool("r2", &denied_secret),
            Message::tool("b3", &denied_sudo),
        ]
    );
}

#[test]
fn policy_denying_every_call_calls_the_model_with_the_reasons() {
    let mut session = policed(4, ApprovalMode::Policy);
    let sudo = bash("b1", "sudo ls");
    let effects = session.ok(model_done("", vec![sudo.clone()]));
    let output = format!("error: denied by policy: {SUDO_RULE}");
    let history = vec![
        Message::user("go"),
        assistant("", vec![sudo.clone()]),
        Message::tool("b1", &output),
    ];
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![first_message(""), requested_in_catalog(&sudo)],
                    closed(&sudo, ToolCallPhase::Error, &output),
                ])
            ),
            Effect::CallModel {
                history: history.clone()
            },
        ]
    );
    assert_eq!(session.state.phase, Phase::Generate);
    assert_eq!(session.state.history, history);
}

// ---------------------------------------------------------------------------
// Approvals
// ---------------------------------------------------------------------------

/// A policed session whose first response asked for `make build` (b1,
/// awaiting approval) then read_file a.txt (r2, scheduled behind it).
fn awaiting_build() -> Session {
    let mut session = policed(4, ApprovalMode::Policy);
    let effects = session.ok(model_done(
        "",
        vec![bash("b1", "make build"), read_file("r2", "a.txt")],
    ));
    assert_eq!(run_tools(&effects), vec![]);
    session
}

#[test]
fn approval_request_names_the_matched_rule() {
    let mut session = policed(4, ApprovalMode::Policy);
    let build = bash("b1", "make build");
    let write = write_file("w2", "out.txt");
    let effects = session.ok(model_done("", vec![build.clone(), write.clone()]));
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                first_message(""),
                requested_in_catalog(&build),
                requested_in_catalog(&write),
                approval_requested(&build, BASH_DEFAULT),
                awaiting("b1"),
                approval_requested(&write, WRITE_FILE_DEFAULT),
                awaiting("w2"),
            ]
        )]
    );
    assert_eq!(session.state.phase, Phase::UseTools);
    assert_eq!(
        session
            .state
            .awaiting_approval()
            .iter()
            .map(|c| c.id.as_str())
            .collect::<Vec<_>>(),
        vec!["b1", "w2"]
    );
}

#[test]
fn approve_schedules_and_runs_the_call() {
    let mut session = awaiting_build();
    let build = bash("b1", "make build");
    let effects = session.ok(approval("b1", ApprovalDecision::Approve, "looks fine", ""));
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    decided("b1", ApprovalDecision::Approve, "looks fine", "", vec![]),
                    scheduled("b1", APPROVED),
                    executing("b1"),
                ]
            ),
            Effect::RunTool(build.clone()),
        ]
    );
    assert!(session.state.awaiting_approval().is_empty());
    assert_eq!(session.state.session_rules, vec![]);
    // The mutating call runs alone; the read follows it.
    let effects = session.ok(done("b1", "built"));
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![success("b1", "built"), vec![executing("r2")]])
            ),
            Effect::RunTool(read_file("r2", "a.txt")),
        ]
    );
    let effects = session.ok(done("r2", "text"));
    assert_eq!(
        effects.last(),
        Some(&Effect::CallModel {
            history: vec![
                Message::user("go"),
                assistant("", vec![build, read_file("r2", "a.txt")]),
                Message::tool("b1", "built"),
                Message::tool("r2", "text"),
            ]
        })
    );
}

#[test]
fn approve_for_session_records_allowances_and_later_calls_pass() {
    let mut session = policed(4, ApprovalMode::Policy);
    let both = bash("b1", "make build && make test");
    session.ok(model_done("", vec![both.clone()]));
    let effects = session.ok(approve_for_session("b1"));
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    decided(
                        "b1",
                        ApprovalDecision::ApproveForSession,
                        "",
                        "",
                        vec![
                            allowance("bash", "make build", ""),
                            allowance("bash", "make test", ""),
                        ]
                    ),
                    scheduled("b1", APPROVED_FOR_SESSION),
                    executing("b1"),
                ]
            ),
            Effect::RunTool(both),
        ]
    );
    let rules = vec![
        SessionRule {
            tool: "bash".into(),
            command: Some("make build".into()),
            path: None,
        },
        SessionRule {
            tool: "bash".into(),
            command: Some("make test".into()),
            path: None,
        },
    ];
    assert_eq!(session.state.session_rules, rules);
    session.ok(done("b1", "ok"));
    session.ok(model_done("done", vec![]));
    // The allowances outlive the turn.
    assert!(session.state.is_idle());
    assert_eq!(session.state.session_rules, rules);

    // A later identical command goes straight to Scheduled; others still ask,
    // and deny rules still win.
    session.ok(user_in(TURN2, "again"));
    let test = bash("b2", "make test");
    let other = bash("b3", "make clean");
    let sudo = bash("b4", "sudo make test");
    let effects = session.ok(model_done(
        "",
        vec![test.clone(), other.clone(), sudo.clone()],
    ));
    let denied = format!("error: denied by policy: {SUDO_RULE}");
    assert_eq!(
        effects,
        vec![
            record(
                TURN2,
                concat(vec![
                    vec![
                        first_message(""),
                        requested_in_catalog(&test),
                        requested_in_catalog(&other),
                        requested_in_catalog(&sudo),
                        scheduled("b2", r#"session rule: bash "make test""#),
                        approval_requested(&other, BASH_DEFAULT),
                        awaiting("b3"),
                    ],
                    closed(&sudo, ToolCallPhase::Error, &denied),
                    vec![executing("b2")],
                ])
            ),
            Effect::RunTool(test),
        ]
    );
}

#[test]
fn approve_for_session_of_a_file_call_allows_that_path() {
    let mut session = policed(4, ApprovalMode::Policy);
    session.ok(model_done("", vec![write_file("w1", "out.txt")]));
    let effects = session.ok(approve_for_session("w1"));
    assert_eq!(
        events_of(&effects)[0],
        decided(
            "w1",
            ApprovalDecision::ApproveForSession,
            "",
            "",
            vec![allowance("write_file", "", "out.txt")]
        )
    );
    session.ok(done("w1", "written"));
    let same = write_file("w2", "out.txt");
    let other = write_file("w3", "other.txt");
    let effects = session.ok(model_done("", vec![same.clone(), other.clone()]));
    assert_eq!(
        events_of(&effects)[3..].to_vec(),
        vec![
            scheduled("w2", r#"session rule: write_file path "out.txt""#),
            approval_requested(&other, WRITE_FILE_DEFAULT),
            awaiting("w3"),
            executing("w2"),
        ]
    );
}

#[test]
fn approve_for_session_adds_each_allowance_once() {
    let mut session = policed(4, ApprovalMode::Policy);
    session.ok(model_done("", vec![bash("b1", "make build && make test")]));
    session.ok(approve_for_session("b1"));
    session.ok(done("b1", "ok"));
    // `make test` is allowed now, `make lint` is not: the call still asks.
    let next = bash("b2", "make test && make lint");
    let effects = session.ok(model_done("", vec![next.clone()]));
    assert_eq!(
        events_of(&effects)[2..].to_vec(),
        vec![approval_requested(&next, BASH_DEFAULT), awaiting("b2")]
    );
    let effects = session.ok(approve_for_session("b2"));
    assert_eq!(
        events_of(&effects)[0],
        decided(
            "b2",
            ApprovalDecision::ApproveForSession,
            "",
            "",
            vec![
                allowance("bash", "make test", ""),
                allowance("bash", "make lint", ""),
            ]
        )
    );
    let bash_rule = |command: &str| SessionRule {
        tool: "bash".into(),
        command: Some(command.into()),
        path: None,
    };
    assert_eq!(
        session.state.session_rules,
        vec![
            bash_rule("make build"),
            bash_rule("make test"),
            bash_rule("make lint"),
        ]
    );
}

#[test]
fn deny_answers_with_the_reason() {
    let mut session = awaiting_build();
    let build = bash("b1", "make build");
    let output = "error: the person denied this call: it takes too long";
    let effects = session.ok(deny("b1", "it takes too long"));
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![decided(
                        "b1",
                        ApprovalDecision::Deny,
                        "it takes too long",
                        "",
                        vec![]
                    )],
                    closed(&build, ToolCallPhase::Error, output),
                    vec![executing("r2")],
                ])
            ),
            Effect::RunTool(read_file("r2", "a.txt")),
        ]
    );
    assert_eq!(session.state.history[2], Message::tool("b1", output));
    assert_eq!(phase_of(&session.state, "b1"), Some(CallPhase::Error));
}

#[test]
fn deny_without_a_reason_says_so() {
    for reason in ["", "  "] {
        let mut session = awaiting_build();
        let effects = session.ok(deny("b1", reason));
        assert_eq!(
            events_of(&effects)[2],
            closed_result(
                &bash("b1", "make build"),
                "error: the person denied this call: no reason given"
            )
        );
    }
}

#[test]
fn deny_of_the_last_call_calls_the_model() {
    let mut session = policed(4, ApprovalMode::Policy);
    session.ok(model_done("", vec![bash("b1", "make build")]));
    let effects = session.ok(deny("b1", "no"));
    assert_eq!(
        effects.last(),
        Some(&Effect::CallModel {
            history: session.state.history.clone()
        })
    );
    assert_eq!(session.state.phase, Phase::Generate);
}

#[test]
fn edit_into_an_allowed_call_runs_the_edited_arguments() {
    let mut session = awaiting_build();
    let original = bash("b1", "make build");
    let edited_args = r#"{"command":"git status"}"#;
    let effects = session.ok(approval(
        "b1",
        ApprovalDecision::Edit,
        "only look",
        edited_args,
    ));
    let edited = call("b1", "bash", edited_args);
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    decided(
                        "b1",
                        ApprovalDecision::Edit,
                        "only look",
                        edited_args,
                        vec![]
                    ),
                    scheduled("b1", EDITED),
                    executing("b1"),
                ]
            ),
            Effect::RunTool(edited),
        ]
    );
    assert_eq!(
        calls_of(&session.state)[0],
        Call {
            effective_arguments: edited_args.into(),
            ..call_in_catalog(&original, CallPhase::Executing, false)
        }
    );
    // The result notes the edit; the model's own request is kept as it was.
    let effects = session.ok(done("b1", "clean"));
    let noted = format!("[the person edited the arguments to {edited_args}]\nclean");
    assert_eq!(
        events_of(&effects)[..2].to_vec(),
        vec![succeeded("b1"), result_event("b1", &noted)]
    );
    assert_eq!(
        session.state.history,
        vec![
            Message::user("go"),
            assistant("", vec![original, read_file("r2", "a.txt")]),
            Message::tool("b1", &noted),
        ]
    );
}

#[test]
fn edit_counts_as_approval_unless_the_policy_denies_it() {
    // `make test` would need a confirmation; the person's edit is one.
    let mut session = awaiting_build();
    let edited_args = r#"{"command":"make test"}"#;
    let effects = session.ok(edit("b1", edited_args));
    assert_eq!(
        events_of(&effects)[1..].to_vec(),
        vec![scheduled("b1", EDITED), executing("b1")]
    );
    assert_eq!(run_tools(&effects), vec![call("b1", "bash", edited_args)]);
}

#[test]
fn edit_into_a_denied_call_answers_with_an_error() {
    let mut session = awaiting_build();
    let edited_args = r#"{"command":"sudo make build"}"#;
    let effects = session.ok(edit("b1", edited_args));
    let output = format!("error: the edited call is denied by policy: {SUDO_RULE}");
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![decided(
                        "b1",
                        ApprovalDecision::Edit,
                        "",
                        edited_args,
                        vec![]
                    )],
                    closed(&bash("b1", "make build"), ToolCallPhase::Error, &output),
                    vec![executing("r2")],
                ])
            ),
            Effect::RunTool(read_file("r2", "a.txt")),
        ]
    );
    assert_eq!(calls_of(&session.state)[0].effective_arguments, edited_args);
}

#[test]
fn edit_with_the_same_arguments_adds_no_note() {
    let mut session = awaiting_build();
    let same = bash("b1", "make build").arguments;
    session.ok(edit("b1", &same));
    let effects = session.ok(done("b1", "built"));
    assert_eq!(events_of(&effects)[1], result_event("b1", "built"));
}

#[test]
fn decisions_for_calls_not_awaiting_approval_are_refused() {
    let mut session = awaiting_build();
    let no_pending = |id: &str| Refusal::NoPendingApproval { call_id: id.into() };
    // Unknown, and scheduled (never asked about).
    session.refused(approve("ghost"), no_pending("ghost"));
    session.refused(approve(""), no_pending(""));
    session.refused(approve("r2"), no_pending("r2"));
    session.refused(deny("r2", "no"), no_pending("r2"));
    // Decided already (duplicate, or a second person's late decision).
    session.ok(approve("b1"));
    for input in [
        approve("b1"),
        approve_for_session("b1"),
        deny("b1", "too late"),
        edit("b1", "{}"),
        approval("b1", ApprovalDecision::Unspecified, "", ""),
    ] {
        session.refused(input, no_pending("b1"));
    }
    // From an earlier turn (stale).
    session.ok(done("b1", "built"));
    session.ok(done("r2", "text"));
    session.ok(model_done("done", vec![]));
    session.ok(user_in(TURN2, "more"));
    session.refused(approve("b1"), no_pending("b1"));
    session.ok(model_done("", vec![bash("b1-new", "make build")]));
    session.refused(deny("b1", ""), no_pending("b1"));
    session.ok(deny("b1-new", ""));
}

#[test]
fn unspecified_decision_is_invalid_and_changes_nothing() {
    let mut session = awaiting_build();
    let refusal = session
        .step(approval("b1", ApprovalDecision::Unspecified, "why", ""))
        .unwrap_err();
    assert_eq!(
        refusal,
        Refusal::InvalidDecision(
            "the decision is not set: approve, approve for session, deny or edit".into()
        )
    );
    assert!(refusal.is_invalid_argument());
    // Still waiting; a proper decision works.
    assert_eq!(
        phase_of(&session.state, "b1"),
        Some(CallPhase::AwaitingApproval)
    );
    session.ok(approve("b1"));
}

#[test]
fn edit_with_invalid_arguments_is_invalid_and_changes_nothing() {
    let session = awaiting_build();
    for (arguments, why) in [
        ("{not json", "not valid JSON ("),
        ("[1]", "expected a JSON object, got [1]"),
        (r#""ls""#, r#"expected a JSON object, got "ls""#),
        ("42", "expected a JSON object, got 42"),
    ] {
        let mut state = session.state.clone();
        let refusal = state.step(edit("b1", arguments)).unwrap_err();
        let Refusal::InvalidDecision(message) = &refusal else {
            panic!("{arguments}: expected an invalid decision, got {refusal:?}");
        };
        assert!(
            message.starts_with(&format!("the edited arguments are invalid: {why}")),
            "{arguments}: {message}"
        );
        assert!(refusal.is_invalid_argument());
        assert_eq!(state, session.state, "{arguments}");
    }
}

// ---------------------------------------------------------------------------
// Approval modes
// ---------------------------------------------------------------------------

#[test]
fn approval_mode_always_schedules_confirmed_calls_but_not_denied_ones() {
    let mut session = policed(4, ApprovalMode::Always);
    let build = bash("b1", "make build");
    let sudo = bash("b2", "sudo make install");
    let effects = session.ok(model_done("", vec![build.clone(), sudo.clone()]));
    let denied = format!("error: denied by policy: {SUDO_RULE}");
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![
                        first_message(""),
                        requested_in_catalog(&build),
                        requested_in_catalog(&sudo),
                        scheduled("b1", &format!("approved for this turn ({BASH_DEFAULT})")),
                    ],
                    closed(&sudo, ToolCallPhase::Error, &denied),
                    vec![executing("b1")],
                ])
            ),
            Effect::RunTool(build),
        ]
    );
    assert!(session.state.awaiting_approval().is_empty());
    // Nothing is remembered for later turns.
    assert_eq!(session.state.session_rules, vec![]);
}

#[test]
fn approval_mode_never_refuses_calls_needing_a_person() {
    let mut session = policed(4, ApprovalMode::Never);
    let build = bash("b1", "make build");
    let read = read_file("r2", "a.txt");
    let effects = session.ok(model_done("", vec![build.clone(), read.clone()]));
    let output = format!(
        "error: this call needs a person's approval ({BASH_DEFAULT}), and this turn runs \
         without one"
    );
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![
                        first_message(""),
                        requested_in_catalog(&build),
                        requested_in_catalog(&read),
                    ],
                    closed(&build, ToolCallPhase::Error, &output),
                    vec![scheduled("r2", READ_FILE_DEFAULT), executing("r2")],
                ])
            ),
            Effect::RunTool(read),
        ]
    );
    assert!(session.state.awaiting_approval().is_empty());
}

#[test]
fn approval_mode_applies_to_its_turn_only() {
    let mut session = policed(4, ApprovalMode::Always);
    session.ok(model_done("", vec![bash("b1", "make build")]));
    session.ok(done("b1", "built"));
    session.ok(model_done("done", vec![]));
    session.ok(user_in(TURN2, "again"));
    session.ok(model_done("", vec![bash("b2", "make build")]));
    assert_eq!(
        phase_of(&session.state, "b2"),
        Some(CallPhase::AwaitingApproval)
    );
}

#[test]
fn unspecified_approval_mode_follows_the_policy() {
    let mut session = policed(4, ApprovalMode::Unspecified);
    let build = bash("b1", "make build");
    let effects = session.ok(model_done("", vec![build.clone()]));
    assert_eq!(
        events_of(&effects)[2..].to_vec(),
        vec![approval_requested(&build, BASH_DEFAULT), awaiting("b1")]
    );
}

// ---------------------------------------------------------------------------
// The call lifecycle only moves forward
// ---------------------------------------------------------------------------

#[test]
fn backward_state_events_are_ignored_by_apply() {
    // c1 executing, c2 scheduled.
    let mut state = using_tools(4);
    let before = state.clone();
    for (id, phase) in [
        ("c1", ToolCallPhase::Validating),
        ("c1", ToolCallPhase::AwaitingApproval),
        ("c1", ToolCallPhase::Scheduled),
        ("c1", ToolCallPhase::Executing),
        ("c1", ToolCallPhase::Unspecified),
        ("c2", ToolCallPhase::Validating),
        ("c2", ToolCallPhase::AwaitingApproval),
        ("c2", ToolCallPhase::Scheduled),
        ("ghost", ToolCallPhase::Success),
    ] {
        state.apply(TURN, &phase_event(id, phase, "backward"));
        assert_eq!(core(&state), core(&before), "{id} -> {phase:?}");
    }
    let mut raw = pb::ToolCallState {
        call_id: "c2".into(),
        phase: 0,
        detail: String::new(),
    };
    for unknown in [-1, 99] {
        raw.phase = unknown;
        state.apply(TURN, &Kind::ToolCallState(raw.clone()));
        assert_eq!(core(&state), core(&before), "phase {unknown}");
    }

    // Forward moves apply; from a terminal phase nothing moves, not even to
    // another terminal phase.
    state.apply(TURN, &phase_event("c2", ToolCallPhase::Cancelled, ""));
    assert_eq!(phase_of(&state, "c2"), Some(CallPhase::Cancelled));
    for phase in [
        ToolCallPhase::Executing,
        ToolCallPhase::Success,
        ToolCallPhase::Error,
        ToolCallPhase::Validating,
    ] {
        state.apply(TURN, &phase_event("c2", phase, ""));
        assert_eq!(phase_of(&state, "c2"), Some(CallPhase::Cancelled));
    }
}

#[test]
fn results_for_calls_not_executing_are_refused() {
    let mut session = awaiting_build();
    let unexpected = Refusal::Unexpected {
        input: "tool result",
        phase: Phase::UseTools,
    };
    // Awaiting approval, and scheduled.
    session.refused(done("b1", "x"), unexpected.clone());
    session.refused(done("r2", "x"), unexpected.clone());
    session.ok(approve("b1"));
    session.refused(done("r2", "x"), unexpected.clone());
    // Finished.
    session.ok(done("b1", "built"));
    session.refused(done("b1", "again"), unexpected.clone());
    // Denied.
    let mut session = awaiting_build();
    session.ok(deny("b1", ""));
    session.refused(done("b1", "x"), unexpected.clone());
    session.refused(
        chunk("b1", OutputStream::Stdout, "x"),
        Refusal::Unexpected {
            input: "tool output",
            phase: Phase::UseTools,
        },
    );
}

// ---------------------------------------------------------------------------
// Dispatch: order and concurrency
// ---------------------------------------------------------------------------

#[test]
fn read_only_parallel_calls_start_together_and_a_mutating_call_waits_for_them() {
    let mut session = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let r2 = grep("r2");
    let r3 = read_file("r3", "b.txt");
    let m4 = bash("m4", "git status");
    let calls = vec![r1.clone(), r2.clone(), r3.clone(), m4.clone()];
    let effects = session.ok(model_done("looking", calls.clone()));
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![first_message("looking")],
                    calls.iter().map(requested_in_catalog).collect(),
                    vec![
                        scheduled("r1", READ_FILE_DEFAULT),
                        scheduled("r2", GREP_DEFAULT),
                        scheduled("r3", READ_FILE_DEFAULT),
                        scheduled("m4", GIT_STATUS_RULE),
                        executing("r1"),
                        executing("r2"),
                        executing("r3"),
                    ],
                ])
            ),
            Effect::RunTool(r1),
            Effect::RunTool(r2),
            Effect::RunTool(r3),
        ]
    );
    // They finish out of order; the results go into the history in the
    // model's order, and the mutating call starts after the last of them.
    let base = vec![Message::user("go"), assistant("looking", calls)];
    let history = |tools: &[(&str, &str)]| {
        let mut h = base.clone();
        h.extend(tools.iter().map(|(id, out)| Message::tool(*id, *out)));
        h
    };
    assert_eq!(
        session.ok(done("r3", "B")),
        vec![record(TURN, success("r3", "B"))]
    );
    assert_eq!(session.state.history, history(&[("r3", "B")]));
    assert_eq!(
        session.ok(done("r1", "A")),
        vec![record(TURN, success("r1", "A"))]
    );
    assert_eq!(session.state.history, history(&[("r1", "A"), ("r3", "B")]));
    assert_eq!(
        session.ok(done("r2", "x")),
        vec![
            record(
                TURN,
                concat(vec![success("r2", "x"), vec![executing("m4")]])
            ),
            Effect::RunTool(m4),
        ]
    );
    assert_eq!(
        session.state.history,
        history(&[("r1", "A"), ("r2", "x"), ("r3", "B")])
    );
    let effects = session.ok(done("m4", "clean"));
    let full = history(&[("r1", "A"), ("r2", "x"), ("r3", "B"), ("m4", "clean")]);
    assert_eq!(
        effects,
        vec![
            record(TURN, success("m4", "clean")),
            Effect::CallModel {
                history: full.clone()
            },
        ]
    );
    assert_eq!(session.state.history, full);
}

#[test]
fn a_mutating_call_between_read_only_ones_splits_the_batches() {
    let mut session = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let r2 = grep("r2");
    let m3 = bash("m3", "git status");
    let r4 = read_file("r4", "b.txt");
    let r5 = grep("r5");
    let effects = session.ok(model_done(
        "",
        vec![r1.clone(), r2.clone(), m3.clone(), r4.clone(), r5.clone()],
    ));
    assert_eq!(run_tools(&effects), vec![r1, r2]);
    assert_eq!(run_tools(&session.ok(done("r2", "2"))), vec![]);
    assert_eq!(
        session.ok(done("r1", "1")),
        vec![
            record(
                TURN,
                concat(vec![success("r1", "1"), vec![executing("m3")]])
            ),
            Effect::RunTool(m3),
        ]
    );
    assert_eq!(
        session.ok(done("m3", "3")),
        vec![
            record(
                TURN,
                concat(vec![
                    success("m3", "3"),
                    vec![executing("r4"), executing("r5")],
                ])
            ),
            Effect::RunTool(r4),
            Effect::RunTool(r5),
        ]
    );
    session.ok(done("r5", "5"));
    let effects = session.ok(done("r4", "4"));
    assert!(matches!(effects.last(), Some(Effect::CallModel { .. })));
    let answers: Vec<&str> = session.state.history[2..]
        .iter()
        .map(|m| match m {
            Message::Tool { tool_call_id, .. } => tool_call_id.as_str(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(answers, vec!["r1", "r2", "m3", "r4", "r5"]);
}

#[test]
fn read_only_calls_that_are_not_parallel_safe_run_alone() {
    let mut session = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let s2 = stat("s2");
    let s3 = stat("s3");
    let r4 = read_file("r4", "b.txt");
    let effects = session.ok(model_done(
        "",
        vec![r1.clone(), s2.clone(), s3.clone(), r4.clone()],
    ));
    assert_eq!(
        events_of(&effects)[5..].to_vec(),
        vec![
            scheduled("r1", READ_FILE_DEFAULT),
            scheduled("s2", STAT_DEFAULT),
            scheduled("s3", STAT_DEFAULT),
            scheduled("r4", READ_FILE_DEFAULT),
            executing("r1"),
        ]
    );
    assert_eq!(run_tools(&effects), vec![r1]);
    assert_eq!(run_tools(&session.ok(done("r1", "1"))), vec![s2]);
    assert_eq!(run_tools(&session.ok(done("s2", "2"))), vec![s3]);
    assert_eq!(run_tools(&session.ok(done("s3", "3"))), vec![r4]);
}

#[test]
fn a_call_awaiting_approval_holds_up_the_calls_after_it() {
    let mut session = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let b2 = bash("b2", "make build");
    let r3 = read_file("r3", "b.txt");
    let effects = session.ok(model_done("", vec![r1.clone(), b2.clone(), r3.clone()]));
    assert_eq!(
        events_of(&effects)[4..].to_vec(),
        vec![
            scheduled("r1", READ_FILE_DEFAULT),
            approval_requested(&b2, BASH_DEFAULT),
            awaiting("b2"),
            scheduled("r3", READ_FILE_DEFAULT),
            executing("r1"),
        ]
    );
    assert_eq!(run_tools(&effects), vec![r1]);
    // r1 done: r3 still waits behind b2.
    assert_eq!(
        session.ok(done("r1", "1")),
        vec![record(TURN, success("r1", "1"))]
    );
    assert_eq!(phase_of(&session.state, "r3"), Some(CallPhase::Scheduled));
    // Approved: b2 runs (alone); then r3.
    assert_eq!(run_tools(&session.ok(approve("b2"))), vec![b2]);
    assert_eq!(
        session.ok(done("b2", "2")),
        vec![
            record(
                TURN,
                concat(vec![success("b2", "2"), vec![executing("r3")]])
            ),
            Effect::RunTool(r3),
        ]
    );
}

#[test]
fn an_approved_read_only_call_joins_the_running_batch() {
    // A read-only call the policy confirms (no default, a confirm rule).
    let policy = Arc::new(
        Policy::from_config(&PolicyConfig {
            tools: BTreeMap::new(),
            rules: vec![rule(
                "read_file",
                None,
                Some("private/*"),
                PolicyDecision::Confirm,
                None,
            )],
            network: false,
        })
        .unwrap(),
    );
    let mut session = Session::with_policy(4, policy, catalog());
    session.ok(user("go"));
    let r1 = read_file("r1", "a.txt");
    let r2 = read_file("r2", "private/x");
    let r3 = grep("r3");
    let effects = session.ok(model_done("", vec![r1.clone(), r2.clone(), r3.clone()]));
    assert_eq!(run_tools(&effects), vec![r1]);
    assert_eq!(session.state.awaiting_approval()[0].id, "r2", "{effects:?}");
    // r1 is still running: r2 and r3 start next to it.
    let effects = session.ok(approve("r2"));
    assert_eq!(run_tools(&effects), vec![r2, r3]);
    assert_eq!(
        calls_of(&session.state)
            .iter()
            .map(|c| c.phase)
            .collect::<Vec<_>>(),
        vec![CallPhase::Executing; 3]
    );
}

// ---------------------------------------------------------------------------
// Cancel with calls in every phase
// ---------------------------------------------------------------------------

#[test]
fn cancel_closes_running_waiting_and_scheduled_calls() {
    let mut session = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let r2 = grep("r2");
    let b3 = bash("b3", "make build");
    let r4 = read_file("r4", "b.txt");
    let r5 = read_file("r5", "c.txt");
    let calls = vec![r1.clone(), r2.clone(), b3.clone(), r4.clone(), r5.clone()];
    let effects = session.ok(model_done("", calls.clone()));
    assert_eq!(run_tools(&effects), vec![r1.clone(), r2.clone()]);
    session.ok(done("r2", "2"));
    // r1 executing, r2 done, b3 awaiting approval, r4 and r5 scheduled.
    let effects = session.ok(cancel("stop"));
    assert_eq!(
        effects,
        vec![
            Effect::AbortInFlight,
            record(
                TURN,
                concat(vec![
                    vec![Kind::CancelRequested(pb::CancelRequested {
                        reason: "stop".into()
                    })],
                    closed(&r1, ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
                    closed(&b3, ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
                    closed(&r4, ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
                    closed(&r5, ToolCallPhase::Cancelled, CANCELLED_OUTPUT),
                    vec![finished(
                        TurnOutcome::Cancelled,
                        "cancelled",
                        1,
                        token_usage(10, 2)
                    )],
                ])
            ),
        ]
    );
    assert_eq!(
        core(&session.state),
        SessionState {
            history: vec![
                Message::user("go"),
                assistant("", calls),
                Message::tool("r1", CANCELLED_OUTPUT),
                Message::tool("r2", "2"),
                Message::tool("b3", CANCELLED_OUTPUT),
                Message::tool("r4", CANCELLED_OUTPUT),
                Message::tool("r5", CANCELLED_OUTPUT),
            ],
            ..Session::with_policy(4, session.state.policy.0.clone(), catalog()).state
        }
    );
    // Late decisions and results are stale.
    session.refused(
        approve("b3"),
        Refusal::NoPendingApproval {
            call_id: "b3".into(),
        },
    );
    session.refused(
        done("r1", "late"),
        Refusal::Unexpected {
            input: "tool output",
            phase: Phase::Idle,
        },
    );
}

// ---------------------------------------------------------------------------
// Recovery after a restart (the actor rebuilds the state from the log, then
// steps Interrupted)
// ---------------------------------------------------------------------------

#[test]
fn interrupted_while_generating_asks_the_model_again_twice_then_fails() {
    let mut live = Session::new(4);
    live.ok(user("hello"));
    live.ok(model_done("let me look", two_calls()));
    live.ok(done("c1", "out1"));
    live.ok(done("c2", "out2"));
    // Crash while the model answers the second time.
    let mut session = live.restarted();
    assert_eq!(session.state, live.state);
    assert_eq!(session.state.phase, Phase::Generate);
    let history = vec![
        Message::user("hello"),
        assistant("let me look", two_calls()),
        Message::tool("c1", "out1"),
        Message::tool("c2", "out2"),
    ];
    for restarts in 1..=2 {
        let effects = session.ok(Input::Interrupted);
        assert_eq!(
            effects,
            vec![
                record(
                    TURN,
                    vec![error(ErrorSource::Orchestrator, RESTARTED_GENERATING, true)]
                ),
                Effect::CallModel {
                    history: history.clone()
                },
            ]
        );
        assert_eq!(session.state.turn.as_ref().unwrap().restarts, restarts);
        // And it crashes again.
        session = session.restarted();
        assert_eq!(session.state.turn.as_ref().unwrap().restarts, restarts);
    }
    let effects = session.ok(Input::Interrupted);
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                error(ErrorSource::Orchestrator, &gave_up(3), false),
                finished(TurnOutcome::Failed, &gave_up(3), 1, token_usage(10, 2)),
            ]
        )]
    );
    assert_eq!(core(&session.state), idle(history, 4));
    // The next turn starts with no restarts.
    session.ok(user_in(TURN2, "again"));
    assert_eq!(session.state.turn.as_ref().unwrap().restarts, 0);
    session.ok(Input::Interrupted);
    assert_eq!(session.state.turn.as_ref().unwrap().restarts, 1);
}

#[test]
fn interrupted_at_the_start_of_a_turn_asks_the_model() {
    let mut live = Session::new(4);
    live.ok(user("hello"));
    live.ok(Input::ModelDelta("par".into()));
    let mut session = live.restarted();
    assert_eq!(
        session.ok(Input::Interrupted),
        vec![
            record(
                TURN,
                vec![error(ErrorSource::Orchestrator, RESTARTED_GENERATING, true)]
            ),
            Effect::CallModel {
                history: vec![Message::user("hello")]
            },
        ]
    );
}

#[test]
fn interrupted_reruns_read_only_calls_that_were_running() {
    let mut live = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let r2 = grep("r2");
    let r3 = read_file("r3", "b.txt");
    live.ok(model_done("", vec![r1.clone(), r2.clone(), r3.clone()]));
    live.ok(chunk("r1", OutputStream::Stdout, "partial"));
    live.ok(done("r2", "2"));
    let mut session = live.restarted();
    assert_eq!(session.state, live.state);
    let effects = session.ok(Input::Interrupted);
    // No state event: the calls stay Executing and simply run again.
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![error(
                    ErrorSource::Orchestrator,
                    RESTARTED_USING_TOOLS,
                    true
                )]
            ),
            Effect::RunTool(r1),
            Effect::RunTool(r3),
        ]
    );
    assert_eq!(
        calls_of(&session.state)
            .iter()
            .map(|c| c.phase)
            .collect::<Vec<_>>(),
        vec![
            CallPhase::Executing,
            CallPhase::Success,
            CallPhase::Executing
        ]
    );
    session.ok(done("r3", "3"));
    let effects = session.ok(done("r1", "1"));
    assert!(matches!(effects.last(), Some(Effect::CallModel { .. })));
    assert_eq!(
        session.state.history[2..].to_vec(),
        vec![
            Message::tool("r1", "1"),
            Message::tool("r2", "2"),
            Message::tool("r3", "3"),
        ]
    );
}

#[test]
fn interrupted_reruns_an_edited_read_only_call_with_its_edited_arguments() {
    let policy = Arc::new(
        Policy::from_config(&PolicyConfig {
            tools: BTreeMap::from([("read_file".to_string(), PolicyDecision::Confirm)]),
            rules: vec![],
            network: false,
        })
        .unwrap(),
    );
    let mut live = Session::with_policy(4, policy, catalog());
    live.ok(user("go"));
    live.ok(model_done("", vec![read_file("r1", "a.txt")]));
    live.ok(edit("r1", r#"{"path":"b.txt"}"#));
    let mut session = live.restarted();
    let effects = session.ok(Input::Interrupted);
    assert_eq!(
        run_tools(&effects),
        vec![call("r1", "read_file", r#"{"path":"b.txt"}"#)]
    );
}

#[test]
fn interrupted_reports_mutating_calls_that_were_running_as_unknown() {
    let mut live = policed(4, ApprovalMode::Policy);
    let m1 = bash("m1", "git status");
    let w2 = write_file("w2", "out.txt");
    live.ok(model_done("", vec![m1.clone(), w2.clone()]));
    assert_eq!(phase_of(&live.state, "m1"), Some(CallPhase::Executing));
    live.ok(chunk("m1", OutputStream::Stdout, "On branch main"));
    let mut session = live.restarted();
    let unknown = outcome_unknown("bash");
    let effects = session.ok(Input::Interrupted);
    // The pending approval of w2 is asked again.
    assert_eq!(
        effects,
        vec![record(
            TURN,
            concat(vec![
                vec![error(
                    ErrorSource::Orchestrator,
                    RESTARTED_USING_TOOLS,
                    true
                )],
                closed(&m1, ToolCallPhase::Error, &unknown),
                vec![approval_requested(&w2, WRITE_FILE_DEFAULT)],
            ])
        )]
    );
    assert_eq!(session.state.history[2], Message::tool("m1", &unknown));
    // A late result of the lost run is stale.
    session.refused(
        done("m1", "late"),
        Refusal::Unexpected {
            input: "tool result",
            phase: Phase::UseTools,
        },
    );
    assert_eq!(run_tools(&session.ok(approve("w2"))), vec![w2]);
}

#[test]
fn interrupted_with_only_mutating_calls_running_calls_the_model() {
    let mut live = Session::new(4);
    live.ok(user("hello"));
    live.ok(model_done("", vec![c1()]));
    let mut session = live.restarted();
    let unknown = outcome_unknown("shell");
    let history = vec![
        Message::user("hello"),
        assistant("", vec![c1()]),
        Message::tool("c1", &unknown),
    ];
    assert_eq!(
        session.ok(Input::Interrupted),
        vec![
            record(
                TURN,
                concat(vec![
                    vec![error(
                        ErrorSource::Orchestrator,
                        RESTARTED_USING_TOOLS,
                        true
                    )],
                    closed(&c1(), ToolCallPhase::Error, &unknown),
                ])
            ),
            Effect::CallModel {
                history: history.clone()
            },
        ]
    );
    assert_eq!(session.state.phase, Phase::Generate);
    assert_eq!(session.state.history, history);
}

#[test]
fn interrupted_asks_again_for_pending_approvals_and_keeps_the_rest_waiting() {
    let mut live = policed(4, ApprovalMode::Policy);
    let r1 = read_file("r1", "a.txt");
    let b2 = bash("b2", "make build");
    let r3 = read_file("r3", "b.txt");
    live.ok(model_done("", vec![r1.clone(), b2.clone(), r3.clone()]));
    let mut session = live.restarted();
    let effects = session.ok(Input::Interrupted);
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    error(ErrorSource::Orchestrator, RESTARTED_USING_TOOLS, true),
                    approval_requested(&b2, BASH_DEFAULT),
                ]
            ),
            Effect::RunTool(r1),
        ]
    );
    assert_eq!(
        session.state.awaiting_approval(),
        vec![&call_in_catalog(&b2, CallPhase::AwaitingApproval, false)]
    );
    assert_eq!(phase_of(&session.state, "r3"), Some(CallPhase::Scheduled));
    // The decision works as before the restart.
    session.ok(done("r1", "1"));
    assert_eq!(run_tools(&session.ok(approve("b2"))), vec![b2]);
}

#[test]
fn interrupted_starts_scheduled_calls_left_behind_a_lost_mutating_call() {
    let mut live = policed(4, ApprovalMode::Policy);
    let m1 = bash("m1", "git status");
    let r2 = read_file("r2", "a.txt");
    let r3 = grep("r3");
    let m4 = bash("m4", "git status");
    live.ok(model_done("", vec![m1.clone(), r2.clone(), r3.clone(), m4]));
    let mut session = live.restarted();
    let unknown = outcome_unknown("bash");
    assert_eq!(
        session.ok(Input::Interrupted),
        vec![
            record(
                TURN,
                concat(vec![
                    vec![error(
                        ErrorSource::Orchestrator,
                        RESTARTED_USING_TOOLS,
                        true
                    )],
                    closed(&m1, ToolCallPhase::Error, &unknown),
                    vec![executing("r2"), executing("r3")],
                ])
            ),
            Effect::RunTool(r2),
            Effect::RunTool(r3),
        ]
    );
}

#[test]
fn restarts_count_across_the_phases_of_a_turn() {
    let mut live = Session::new(4);
    live.ok(user("hello"));
    live.ok(model_done("", vec![c1()]));
    // Restart while c1 runs: outcome unknown, the model is asked.
    let mut session = live.restarted();
    session.ok(Input::Interrupted);
    // Restart while the model answers.
    let mut session = session.restarted();
    session.ok(Input::Interrupted);
    assert_eq!(session.state.turn.as_ref().unwrap().restarts, 2);
    // The third restart of the turn gives up.
    let mut session = session.restarted();
    let effects = session.ok(Input::Interrupted);
    assert_eq!(
        events_of(&effects),
        vec![
            error(ErrorSource::Orchestrator, &gave_up(3), false),
            finished(TurnOutcome::Failed, &gave_up(3), 1, token_usage(10, 2)),
        ]
    );
}

// ---------------------------------------------------------------------------
// Repeated call ids
// ---------------------------------------------------------------------------

/// A response may repeat a call id; the repeats get a suffix so every call
/// can be told apart, runs, and gets its own answer.
#[test]
fn repeated_call_ids_in_one_response_get_suffixes() {
    let first = call("dup", "shell", r#"{"cmd":"a"}"#);
    let second = call("dup", "shell", r#"{"cmd":"b"}"#);
    let third = call("dup", "shell", r#"{"cmd":"c"}"#);
    let other = call("dup-2", "shell", r#"{"cmd":"d"}"#);
    let renamed = |c: &ToolCall, id: &str| ToolCall {
        id: id.into(),
        ..c.clone()
    };
    let calls_as_recorded = vec![
        first.clone(),
        renamed(&second, "dup-2"),
        renamed(&third, "dup-3"),
        renamed(&other, "dup-2-2"),
    ];
    let mut session = Session::new(4);
    session.ok(user("hello"));
    let effects = session.ok(model_done("", vec![first.clone(), second, third, other]));
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![first_message("")],
                    calls_as_recorded.iter().map(requested).collect(),
                    calls_as_recorded.iter().map(|c| allowed(&c.id)).collect(),
                    vec![executing("dup")],
                ])
            ),
            Effect::RunTool(first),
        ]
    );
    for (i, c) in calls_as_recorded.iter().enumerate() {
        let effects = session.ok(done(&c.id, &format!("out {i}")));
        match calls_as_recorded.get(i + 1) {
            Some(next) => assert_eq!(run_tools(&effects), vec![next.clone()]),
            None => assert!(matches!(effects.last(), Some(Effect::CallModel { .. }))),
        }
    }
    assert_eq!(
        session.state.history,
        vec![
            Message::user("hello"),
            assistant("", calls_as_recorded),
            Message::tool("dup", "out 0"),
            Message::tool("dup-2", "out 1"),
            Message::tool("dup-3", "out 2"),
            Message::tool("dup-2-2", "out 3"),
        ]
    );
}

#[test]
fn call_ids_may_repeat_across_responses() {
    let mut state = generating_step_two(4);
    let effects = state.step(model_done("", vec![c1()])).unwrap();
    assert_eq!(run_tools(&effects), vec![c1()]);
    state.step(done("c1", "second")).unwrap();
    assert_eq!(
        state.history[2..].to_vec(),
        vec![
            Message::tool("c1", "out1"),
            Message::tool("c2", "out2"),
            assistant("", vec![c1()]),
            Message::tool("c1", "second"),
        ]
    );
}

// ---------------------------------------------------------------------------
// Randomized: invariants and replay after every step
// ---------------------------------------------------------------------------

/// A small deterministic generator (no dependencies).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Calls the random model makes: under the test policy they are allowed,
/// denied, confirmed, or invalid; with the test catalog some are read-only.
const CALL_MENU: &[(&str, &str)] = &[
    ("bash", r#"{"command":"make build"}"#),
    ("bash", r#"{"command":"make build && make test"}"#),
    ("bash", r#"{"command":"git status"}"#),
    ("bash", r#"{"command":"sudo rm -rf /"}"#),
    ("read_file", r#"{"path":"a.txt"}"#),
    ("read_file", r#"{"path":"b.txt"}"#),
    ("read_file", r#"{"path":"secrets/key"}"#),
    ("grep", r#"{"pattern":"x"}"#),
    ("stat", r#"{"path":"a.txt"}"#),
    ("write_file", r#"{"path":"out.txt","content":"x"}"#),
    ("read_file", "not json"),
];

/// Edits a person may make: allowed, denied, confirmed, and invalid ones.
const EDIT_MENU: &[&str] = &[
    r#"{"command":"git status"}"#,
    r#"{"command":"sudo ls"}"#,
    r#"{"command":"ls && sudo ls"}"#,
    r#"{"command":"make test"}"#,
    r#"{"path":"secrets/x"}"#,
    r#"{"path":"c.txt"}"#,
    "not json",
    "[1]",
];

const MODES: &[ApprovalMode] = &[
    ApprovalMode::Policy,
    ApprovalMode::Policy,
    ApprovalMode::Policy,
    ApprovalMode::Always,
    ApprovalMode::Never,
    ApprovalMode::Unspecified,
];

const DECISIONS: &[ApprovalDecision] = &[
    ApprovalDecision::Approve,
    ApprovalDecision::Approve,
    ApprovalDecision::Approve,
    ApprovalDecision::ApproveForSession,
    ApprovalDecision::ApproveForSession,
    ApprovalDecision::Deny,
    ApprovalDecision::Deny,
    ApprovalDecision::Edit,
    ApprovalDecision::Edit,
    ApprovalDecision::Unspecified,
];

struct Generator {
    rng: Lcg,
    ids: u32,
    turns: u32,
}

impl Generator {
    /// Usually one of `preferred`, else any call of the turn, else a ghost.
    fn pick_id(&mut self, preferred: &[String], all: &[String]) -> String {
        if !preferred.is_empty() && self.rng.below(8) > 0 {
            return self.rng.pick(preferred).clone();
        }
        if !all.is_empty() && self.rng.below(2) == 0 {
            return self.rng.pick(all).clone();
        }
        "ghost".into()
    }

    fn calls(&mut self) -> Vec<ToolCall> {
        let mut calls: Vec<ToolCall> = Vec::new();
        for _ in 0..self.rng.below(5) {
            let (tool, arguments) = *self.rng.pick(CALL_MENU);
            let id = if !calls.is_empty() && self.rng.below(8) == 0 {
                calls[0].id.clone()
            } else {
                self.ids += 1;
                format!("c{}", self.ids)
            };
            calls.push(call(&id, tool, arguments));
        }
        calls
    }

    /// A random input, biased towards inputs that fit the state.
    fn input(&mut self, state: &SessionState) -> Input {
        let calls = calls_of(state);
        let ids_in = |phase: CallPhase| -> Vec<String> {
            calls
                .iter()
                .filter(|c| c.phase == phase)
                .map(|c| c.id.clone())
                .collect()
        };
        let all: Vec<String> = calls.iter().map(|c| c.id.clone()).collect();
        let executing = ids_in(CallPhase::Executing);
        let awaiting = ids_in(CallPhase::AwaitingApproval);
        match self.rng.below(25) {
            0 | 1 => {
                self.turns += 1;
                let text = if self.rng.below(6) == 0 { " " } else { "msg" };
                let mode = *self.rng.pick(MODES);
                user_with(&format!("t{}", self.turns), text, mode)
            }
            2 => Input::ModelDelta("d".into()),
            3..=5 => {
                let calls = self.calls();
                let used =
                    (self.rng.below(3) > 0).then(|| usage(self.rng.below(50), self.rng.below(50)));
                Input::ModelDone(completion_with_usage("text", calls, used))
            }
            6 => model_failed("x", self.rng.below(2) == 0),
            7 => chunk(&self.pick_id(&executing, &all), OutputStream::Stdout, "o"),
            8..=12 | 22 => {
                let id = self.pick_id(&executing, &all);
                Input::ToolDone(pb::ToolResult {
                    is_error: self.rng.below(5) == 0,
                    ..tool_result(&id, "out")
                })
            }
            13..=17 => {
                let id = self.pick_id(&awaiting, &all);
                let decision = *self.rng.pick(DECISIONS);
                let edited = if decision == ApprovalDecision::Edit {
                    *self.rng.pick(EDIT_MENU)
                } else {
                    ""
                };
                let reason = *self.rng.pick(&["", "because"]);
                approval(&id, decision, reason, edited)
            }
            18 => cancel("r"),
            19 => Input::ToolCatalog(if self.rng.below(3) == 0 {
                BTreeMap::new()
            } else {
                catalog()
            }),
            20 if self.rng.below(2) == 0 => Input::Interrupted,
            _ => {
                let id = self.pick_id(&executing, &[]);
                done(&id, "out")
            }
        }
    }
}

/// What the random test reached, so it proves it exercises every path.
#[derive(Debug, Default)]
struct Coverage {
    outcomes: [u32; 5],
    ok_results: u32,
    decisions: [u32; 5],
    invalid_decisions: u32,
    batches: u32,
    reruns: u32,
    unknown_outcomes: u32,
    asked_again: u32,
    policy_denials: u32,
    never_refusals: u32,
    always_approvals: u32,
    session_rule_passes: u32,
    edit_denials: u32,
    edit_notes: u32,
    person_denials: u32,
    cancelled_calls: u32,
}

impl Coverage {
    fn count(&mut self, input: &Input, result: &Result<Vec<Effect>, Refusal>) {
        let effects = match result {
            Ok(effects) => effects,
            Err(refusal) => {
                if matches!(refusal, Refusal::InvalidDecision(_)) {
                    self.invalid_decisions += 1;
                }
                return;
            }
        };
        if let Input::Approval { decision, .. } = input {
            self.decisions[*decision as usize] += 1;
        }
        if run_tools(effects).len() >= 2 && !matches!(input, Input::Interrupted) {
            self.batches += 1;
        }
        for kind in events_of(effects) {
            match kind {
                Kind::TurnFinished(f) => self.outcomes[f.outcome as usize] += 1,
                Kind::ToolResult(r) if !r.is_error => {
                    self.ok_results += 1;
                    if r.output.starts_with("[the person edited the arguments to ") {
                        self.edit_notes += 1;
                    }
                }
                Kind::ToolResult(r) => {
                    let o = r.output.as_str();
                    let counter = if o.starts_with("error: outcome unknown") {
                        &mut self.unknown_outcomes
                    } else if o.starts_with("error: denied by policy: ") {
                        &mut self.policy_denials
                    } else if o.starts_with("error: this call needs a person's approval") {
                        &mut self.never_refusals
                    } else if o.starts_with("error: the edited call is denied by policy") {
                        &mut self.edit_denials
                    } else if o.starts_with("error: the person denied this call") {
                        &mut self.person_denials
                    } else if o == CANCELLED_OUTPUT {
                        &mut self.cancelled_calls
                    } else {
                        continue;
                    };
                    *counter += 1;
                }
                Kind::ToolCallState(s) if s.detail.starts_with("approved for this turn") => {
                    self.always_approvals += 1;
                }
                Kind::ToolCallState(s) if s.detail.starts_with("session rule: ") => {
                    self.session_rule_passes += 1;
                }
                Kind::ApprovalRequested(_) if matches!(input, Input::Interrupted) => {
                    self.asked_again += 1;
                }
                _ => {}
            }
        }
    }
}

fn concurrent(call: &Call) -> bool {
    call.read_only && call.parallel_safe
}

/// Checks the invariants that hold after every accepted step, given the
/// state before it and the log so far (including this step's events).
fn check_step(
    before: &SessionState,
    input: &Input,
    after: &SessionState,
    effects: &[Effect],
    log: &[pb::Event],
    coverage: &mut Coverage,
) {
    let what = format!("{input:?}");
    // Phase and turn agree.
    assert_eq!(after.phase == Phase::Idle, after.turn.is_none(), "{what}");
    let calls = calls_of(after);
    if let Some(turn) = &after.turn {
        assert!(turn.steps <= after.max_steps, "{what}");
        assert_eq!(
            after.phase == Phase::UseTools,
            calls.iter().any(|c| !c.answered),
            "unanswered calls exactly while using tools, after {what}"
        );
    }
    for c in &calls {
        assert_eq!(c.answered, c.phase.is_terminal(), "{} after {what}", c.id);
    }

    // Each recorded state event moves its call strictly forward, and the
    // events fold into the new state.
    let record_turn = match input {
        Input::UserMessage { turn_id, .. } => turn_id.clone(),
        _ => before.turn_id().unwrap_or_default().to_string(),
    };
    // (The catalog is not an event.)
    let mut folded = SessionState {
        catalog: after.catalog.clone(),
        ..before.clone()
    };
    for kind in events_of(effects) {
        if let Kind::ToolCallState(s) = &kind {
            let from = phase_of(&folded, &s.call_id);
            let to = match ToolCallPhase::try_from(s.phase) {
                Ok(ToolCallPhase::Validating) => CallPhase::Validating,
                Ok(ToolCallPhase::AwaitingApproval) => CallPhase::AwaitingApproval,
                Ok(ToolCallPhase::Scheduled) => CallPhase::Scheduled,
                Ok(ToolCallPhase::Executing) => CallPhase::Executing,
                Ok(ToolCallPhase::Success) => CallPhase::Success,
                Ok(ToolCallPhase::Error) => CallPhase::Error,
                Ok(ToolCallPhase::Cancelled) => CallPhase::Cancelled,
                other => panic!("recorded phase {other:?} after {what}"),
            };
            assert!(
                from.is_some_and(|f| f.can_move_to(to)),
                "{} recorded {from:?} -> {to:?} after {what}",
                s.call_id
            );
        }
        folded.apply(&record_turn, &kind);
    }
    assert_eq!(
        &folded, after,
        "the step's events do not fold into its state"
    );

    // Within one response, calls only move forward.
    if let (Some(b), Some(a)) = (&before.turn, &after.turn)
        && b.id == a.id
        && b.steps == a.steps
    {
        assert_eq!(b.calls.len(), a.calls.len(), "{what}");
        for (bc, ac) in b.calls.iter().zip(&a.calls) {
            assert_eq!(bc.id, ac.id);
            assert!(
                bc.phase == ac.phase || bc.phase.can_move_to(ac.phase),
                "{}: {:?} -> {:?} after {what}",
                bc.id,
                bc.phase,
                ac.phase
            );
        }
    }

    // Every answered call of the response has exactly one result, matching
    // its terminal phase; unanswered calls have none.
    if !calls.is_empty() {
        let start = log
            .iter()
            .rposition(|e| matches!(e.kind, Some(Kind::ModelMessage(_))))
            .unwrap();
        for c in &calls {
            let results: Vec<&pb::ToolResult> = log[start..]
                .iter()
                .filter_map(|e| match &e.kind {
                    Some(Kind::ToolResult(r)) if r.call_id == c.id => Some(r),
                    _ => None,
                })
                .collect();
            assert_eq!(
                results.len(),
                usize::from(c.answered),
                "results of {} after {what}",
                c.id
            );
            if let Some(r) = results.first() {
                assert_eq!(r.is_error, c.phase != CallPhase::Success, "{}", c.id);
            }
        }
    }

    // Dispatch: model order, mutating calls alone, approvals hold up later
    // calls, and nothing that may start is left waiting.
    for (i, c) in calls.iter().enumerate() {
        let earlier = &calls[..i];
        match c.phase {
            CallPhase::Executing => {
                for e in earlier {
                    assert!(
                        e.phase.is_terminal()
                            || (e.phase == CallPhase::Executing && concurrent(e) && concurrent(c)),
                        "{} runs while {} is {:?}, after {what}",
                        c.id,
                        e.id,
                        e.phase
                    );
                }
            }
            CallPhase::Scheduled => {
                let may_start = earlier.iter().all(|e| {
                    e.phase.is_terminal()
                        || (concurrent(e)
                            && concurrent(c)
                            && matches!(e.phase, CallPhase::Executing | CallPhase::Scheduled))
                });
                assert!(!may_start, "{} could start, after {what}", c.id);
            }
            CallPhase::Validating => panic!("{} left validating after {what}", c.id),
            _ => {}
        }
    }

    // Effects.
    let recorded = events_of(effects);
    let started: Vec<&str> = recorded
        .iter()
        .filter_map(|k| match k {
            Kind::ToolCallState(s) if s.phase == ToolCallPhase::Executing as i32 => {
                Some(s.call_id.as_str())
            }
            _ => None,
        })
        .collect();
    let runs = run_tools(effects);
    let mut run_ids: Vec<&str> = runs.iter().map(|c| c.id.as_str()).collect();
    for run in &runs {
        let c = calls
            .iter()
            .find(|c| c.id == run.id)
            .unwrap_or_else(|| panic!("RunTool {} of no call, after {what}", run.id));
        assert_eq!(c.phase, CallPhase::Executing, "{what}");
        assert_eq!(run.name, c.tool);
        assert_eq!(run.arguments, c.effective_arguments);
        if !started.contains(&run.id.as_str()) {
            // A re-run after a restart.
            assert!(matches!(input, Input::Interrupted), "{what}");
            assert!(c.read_only, "re-ran mutating {} after {what}", c.id);
            assert_eq!(phase_of(before, &c.id), Some(CallPhase::Executing));
            coverage.reruns += 1;
        }
    }
    for id in &started {
        assert!(run_ids.contains(id), "{id} executing without a RunTool");
    }
    run_ids.sort_unstable();
    run_ids.dedup();
    assert_eq!(run_ids.len(), runs.len(), "a call ran twice: {effects:?}");
    let model_calls: Vec<&Vec<Message>> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::CallModel { history } => Some(history),
            _ => None,
        })
        .collect();
    assert!(model_calls.len() <= 1, "{effects:?}");
    if let Some(history) = model_calls.first() {
        assert_eq!(after.phase, Phase::Generate);
        assert_eq!(*history, &after.history);
        assert!(runs.is_empty(), "{effects:?}");
    }
    assert_eq!(
        effects.first() == Some(&Effect::AbortInFlight),
        matches!(input, Input::Cancel { .. }),
        "{what}"
    );
    if recorded.iter().any(|k| matches!(k, Kind::TurnFinished(_))) {
        assert!(after.is_idle());
    }
    if let Some(Effect::Record { turn_id, .. }) =
        effects.iter().find(|e| matches!(e, Effect::Record { .. }))
    {
        assert_eq!(turn_id, &record_turn);
        assert!(!turn_id.is_empty());
    }

    // History: after each assistant message come the answers to its calls,
    // in the model's order (only the answered ones for the running
    // response).
    let current = after
        .turn
        .as_ref()
        .filter(|t| t.steps > 0)
        .map(|t| t.assistant_index);
    for (i, message) in after.history.iter().enumerate() {
        let Message::Assistant { tool_calls, .. } = message else {
            continue;
        };
        let expected: Vec<&str> = if Some(i) == current {
            calls
                .iter()
                .filter(|c| c.answered)
                .map(|c| c.id.as_str())
                .collect()
        } else {
            tool_calls.iter().map(|c| c.id.as_str()).collect()
        };
        let answers: Vec<&str> = after.history[i + 1..]
            .iter()
            .map_while(|m| match m {
                Message::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(answers, expected, "answers to message {i} after {what}");
    }
}

#[test]
fn random_inputs_keep_invariants_and_replay() {
    let policy = test_policy();
    let mut coverage = Coverage::default();
    for seed in 0..60u64 {
        let max_steps = (seed % 4 + 1) as u32;
        let mut session = match seed % 3 {
            0 => Session::new(max_steps),
            1 => Session::with_policy(max_steps, policy.clone(), BTreeMap::new()),
            _ => Session::with_policy(max_steps, policy.clone(), catalog()),
        };
        let mut generator = Generator {
            rng: Lcg(seed),
            ids: 0,
            turns: 0,
        };
        for _ in 0..400 {
            let input = generator.input(&session.state);
            let before = session.state.clone();
            // `Session::step` checks replay, the effects' shape, and that a
            // refusal changes nothing.
            let result = session.step(input.clone());
            coverage.count(&input, &result);
            if let Ok(effects) = &result {
                check_step(
                    &before,
                    &input,
                    &session.state,
                    effects,
                    &session.log,
                    &mut coverage,
                );
            }
        }
    }
    eprintln!("{coverage:#?}");
    for outcome in [
        TurnOutcome::Completed,
        TurnOutcome::Cancelled,
        TurnOutcome::Failed,
        TurnOutcome::StepLimit,
    ] {
        assert!(
            coverage.outcomes[outcome as usize] >= 10,
            "{outcome:?} reached only {} times",
            coverage.outcomes[outcome as usize]
        );
    }
    for decision in [
        ApprovalDecision::Approve,
        ApprovalDecision::ApproveForSession,
        ApprovalDecision::Deny,
        ApprovalDecision::Edit,
    ] {
        assert!(
            coverage.decisions[decision as usize] >= 10,
            "{decision:?} accepted only {} times",
            coverage.decisions[decision as usize]
        );
    }
    let Coverage {
        ok_results,
        invalid_decisions,
        batches,
        reruns,
        unknown_outcomes,
        asked_again,
        policy_denials,
        never_refusals,
        always_approvals,
        session_rule_passes,
        edit_denials,
        edit_notes,
        person_denials,
        cancelled_calls,
        ..
    } = coverage;
    for (name, count, least) in [
        ("successful results", ok_results, 100),
        ("invalid decisions", invalid_decisions, 10),
        ("parallel batches", batches, 10),
        ("re-runs after a restart", reruns, 3),
        ("unknown outcomes after a restart", unknown_outcomes, 3),
        ("approvals asked again after a restart", asked_again, 3),
        ("policy denials", policy_denials, 10),
        ("refusals without approval", never_refusals, 5),
        ("approvals for the turn", always_approvals, 5),
        ("session rule passes", session_rule_passes, 5),
        ("edits denied by policy", edit_denials, 3),
        ("results noting an edit", edit_notes, 3),
        ("calls denied by a person", person_denials, 10),
        ("cancelled calls", cancelled_calls, 10),
    ] {
        assert!(count >= least, "only {count} {name}");
    }
}

// ---------------------------------------------------------------------------
// Malformed decisions and other regressions once found
// ---------------------------------------------------------------------------

/// The proto says an edit carries "replacement arguments (a JSON object)";
/// an edit without any is a malformed decision (a client that forgot the
/// arguments), yet the reducer takes `""` as `{}`, schedules the call as
/// "edited and approved by a person" and runs the tool with empty
/// arguments, noting "[the person edited the arguments to ]".
#[test]
fn edit_without_arguments_is_invalid() {
    for arguments in ["", "  "] {
        let session = awaiting_build();
        let mut state = session.state.clone();
        let refusal = state.step(edit("b1", arguments));
        assert!(
            matches!(&refusal, Err(r @ Refusal::InvalidDecision(_)) if r.is_invalid_argument()),
            "{arguments:?}: {refusal:?}"
        );
        assert_eq!(state, session.state);
    }
}

/// "Approve for this session" records a standing allowance for the call
/// (listed in the `approval_decided` event and kept in `session_rules`), but
/// when the call was confirmed by an explicit confirm *rule* rather than by
/// the tool's default, `Policy::check` never consults session rules, so the
/// identical call asks again: the allowance the person was shown never takes
/// effect.
#[test]
fn approve_for_session_of_a_call_confirmed_by_a_rule_takes_effect() {
    let policy = Arc::new(
        Policy::from_config(&PolicyConfig {
            tools: BTreeMap::from([("bash".to_string(), PolicyDecision::Confirm)]),
            rules: vec![rule(
                "bash",
                Some("git push*"),
                None,
                PolicyDecision::Confirm,
                Some("pushes are public"),
            )],
            network: false,
        })
        .unwrap(),
    );
    let mut session = Session::with_policy(4, policy, catalog());
    session.ok(user("go"));
    session.ok(model_done("", vec![bash("b1", "git push origin")]));
    let effects = session.ok(approve_for_session("b1"));
    assert_eq!(
        events_of(&effects)[0],
        decided(
            "b1",
            ApprovalDecision::ApproveForSession,
            "",
            "",
            vec![allowance("bash", "git push origin", "")]
        )
    );
    session.ok(done("b1", "pushed"));
    let again = bash("b2", "git push origin");
    let effects = session.ok(model_done("", vec![again.clone()]));
    assert_eq!(
        events_of(&effects)[2..].to_vec(),
        vec![
            scheduled("b2", r#"session rule: bash "git push origin""#),
            executing("b2"),
        ]
    );
}

/// After "approve for this session", an identical call of the same response
/// that is already waiting for a decision keeps waiting: the person is asked
/// again about exactly what they just approved for the whole session (and
/// after a restart the re-sent `approval_requested` ignores the allowance
/// too).
#[test]
fn approve_for_session_releases_identical_calls_already_waiting() {
    let mut session = policed(4, ApprovalMode::Policy);
    let b1 = bash("b1", "make build");
    let b2 = bash("b2", "make build");
    session.ok(model_done("", vec![b1.clone(), b2]));
    session.ok(approve_for_session("b1"));
    assert_eq!(
        phase_of(&session.state, "b2"),
        Some(CallPhase::Scheduled),
        "b2 should be allowed by the new session rule"
    );
    let effects = session.ok(done("b1", "built"));
    assert_eq!(
        run_tools(&effects),
        vec![bash("b2", "make build")],
        "b2 should run after b1"
    );
}

// ---------------------------------------------------------------------------
// Plan mode
// ---------------------------------------------------------------------------

fn plan_user(text: &str) -> Input {
    Input::UserMessage {
        turn_id: TURN.into(),
        text: text.into(),
        approval_mode: ApprovalMode::Policy,
        plan: true,
        network: false,
    }
}

fn submit_plan(id: &str, steps: &[&str]) -> ToolCall {
    call(
        id,
        "submit_plan",
        &serde_json::json!({ "steps": steps }).to_string(),
    )
}

fn complete_step(id: &str, status: &str, summary: &str) -> ToolCall {
    call(
        id,
        "complete_step",
        &serde_json::json!({ "status": status, "summary": summary }).to_string(),
    )
}

fn plan_of(state: &SessionState) -> crate::plan::Plan {
    state.turn_plan().cloned().expect("a plan-mode turn")
}

fn step_statuses(state: &SessionState) -> Vec<&'static str> {
    plan_of(state)
        .steps
        .iter()
        .map(|s| {
            pb::PlanStepStatus::try_from(s.status)
                .unwrap()
                .as_str_name()
                .trim_start_matches("PLAN_STEP_STATUS_")
        })
        .collect()
}

fn calls_model(effects: &[Effect]) -> bool {
    effects
        .iter()
        .any(|e| matches!(e, Effect::CallModel { .. }))
}

fn outcome_of(effects: &[Effect]) -> Option<pb::TurnFinished> {
    events_of(effects).into_iter().find_map(|k| match k {
        Kind::TurnFinished(f) => Some(f),
        _ => None,
    })
}

fn tool_output(effects: &[Effect], call_id: &str) -> String {
    events_of(effects)
        .into_iter()
        .find_map(|k| match k {
            Kind::ToolResult(r) if r.call_id == call_id => Some(r.output),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no result for {call_id} in {effects:?}"))
}

#[test]
fn a_plan_turn_plans_executes_repairs_and_finishes() {
    let mut session = Session::new(5);
    let effects = session.ok(plan_user("tidy the repo"));
    assert!(calls_model(&effects));
    assert_eq!(plan_of(&session.state).stage, crate::plan::Stage::Planning);

    // The planner: the reducer answers submit_plan itself and starts step 1.
    let effects = session.ok(model_done("", vec![submit_plan("p1", &["list", "delete"])]));
    assert!(
        run_tools(&effects).is_empty(),
        "plan tools do not go to a runner"
    );
    assert!(tool_output(&effects, "p1").starts_with("plan recorded: 2 steps"));
    assert!(calls_model(&effects));
    assert_eq!(
        step_statuses(&session.state),
        ["IN_PROGRESS", "UNSPECIFIED"]
    );
    assert_eq!(plan_of(&session.state).started, 1);

    // The executor runs a tool, then ends the step.
    let effects = session.ok(model_done("", vec![bash("b1", "ls")]));
    assert_eq!(run_tools(&effects), vec![bash("b1", "ls")]);
    session.ok(done("b1", "a b"));
    let effects = session.ok(model_done(
        "",
        vec![complete_step("c1", "completed", "listed")],
    ));
    assert_eq!(tool_output(&effects, "c1"), "step 1 recorded as completed");
    assert_eq!(step_statuses(&session.state), ["COMPLETED", "IN_PROGRESS"]);

    // Step 2 fails: back to the planner, with the error.
    let effects = session.ok(model_done(
        "",
        vec![complete_step("c2", "failed", "disk is read-only")],
    ));
    assert!(calls_model(&effects));
    let plan = plan_of(&session.state);
    assert_eq!(plan.stage, crate::plan::Stage::Repairing);
    assert_eq!(plan.failure, "disk is read-only");
    assert!(plan.guidance().contains("disk is read-only"));

    // The revision keeps the completed step and starts the new one.
    let effects = session.ok(model_done(
        "",
        vec![submit_plan("p2", &["remount", "delete"])],
    ));
    let revised = events_of(&effects)
        .into_iter()
        .find_map(|k| match k {
            Kind::PlanSubmitted(p) => Some(p),
            _ => None,
        })
        .unwrap();
    assert_eq!(revised.revision, 2);
    assert_eq!(revised.reason, "disk is read-only");
    assert_eq!(
        step_statuses(&session.state),
        ["COMPLETED", "IN_PROGRESS", "UNSPECIFIED"]
    );
    assert_eq!(plan_of(&session.state).current, Some(1));

    // A plain answer ends a step too; the answer that ends the last step
    // is the turn's.
    let effects = session.ok(model_done("remounted", vec![]));
    assert!(outcome_of(&effects).is_none());
    assert_eq!(plan_of(&session.state).current, Some(2));
    let effects = session.ok(model_done("all deleted", vec![]));
    let finished = outcome_of(&effects).unwrap();
    assert_eq!(finished.outcome, TurnOutcome::Completed as i32);
    assert_eq!(finished.message, "all deleted");
    assert!(session.state.is_idle());
}

#[test]
fn the_rail_counts_every_started_step() {
    let mut session = Session::new(5);
    session.state = session.state.clone().with_plan_max_steps(2);
    session.ok(plan_user("loop"));
    session.ok(model_done("", vec![submit_plan("p", &["try"])]));
    session.ok(model_done("", vec![complete_step("c", "failed", "no")]));
    session.ok(model_done("", vec![submit_plan("p", &["try"])]));
    assert_eq!(plan_of(&session.state).started, 2);
    session.ok(model_done("", vec![complete_step("c", "failed", "no")]));
    let effects = session.ok(model_done("", vec![submit_plan("p", &["try"])]));
    let finished = outcome_of(&effects).unwrap();
    assert_eq!(finished.outcome, TurnOutcome::StepLimit as i32);
    assert!(
        finished.message.contains("safety rail of 2 steps"),
        "{}",
        finished.message
    );
    assert!(!calls_model(&effects));
}

#[test]
fn the_step_limit_applies_per_plan_stage() {
    let mut session = Session::new(2);
    session.ok(plan_user("work"));
    session.ok(model_done("", vec![submit_plan("p", &["one", "two"])]));
    // Two model calls for step 1 are allowed; the limit restarts with step 2.
    session.ok(model_done("", vec![complete_step("c1", "completed", "")]));
    session.ok(model_done("", vec![bash("b1", "true")]));
    let effects = session.ok(done("b1", ""));
    assert!(calls_model(&effects), "the second call of step 2");
    session.ok(model_done("", vec![bash("b2", "true")]));
    let effects = session.ok(done("b2", ""));
    let finished = outcome_of(&effects).unwrap();
    assert_eq!(finished.outcome, TurnOutcome::StepLimit as i32);
    assert!(
        finished.message.contains("on step 2 of the plan"),
        "{}",
        finished.message
    );
}

#[test]
fn plan_tools_used_out_of_order_get_clear_errors() {
    let mut session = Session::new(6);
    session.ok(plan_user("work"));
    // No step is running yet.
    let effects = session.ok(model_done("", vec![complete_step("c0", "completed", "")]));
    assert!(
        tool_output(&effects, "c0").contains("there is no plan yet"),
        "{effects:?}"
    );
    // Malformed plans are refused with the expected shape.
    let effects = session.ok(model_done(
        "",
        vec![call("p0", "submit_plan", "{\"steps\": []}")],
    ));
    assert!(tool_output(&effects, "p0").contains("at least one step"));
    session.ok(model_done("", vec![submit_plan("p1", &["one"])]));
    // A new plan while a step runs is refused.
    let effects = session.ok(model_done("", vec![submit_plan("p2", &["other"])]));
    assert!(
        tool_output(&effects, "p2").contains("step 1 is still in progress"),
        "{effects:?}"
    );
    assert_eq!(plan_of(&session.state).revision, 1);
    assert!(calls_model(&effects));
}

#[test]
fn outside_plan_mode_plan_tools_are_ordinary_calls() {
    let mut session = Session::new(4);
    session.ok(user("hello"));
    let effects = session.ok(model_done("", vec![submit_plan("p1", &["one"])]));
    assert!(session.state.turn_plan().is_none());
    // It goes through validation like any unknown tool (and is asked about).
    assert!(
        events_of(&effects)
            .iter()
            .all(|k| !matches!(k, Kind::PlanSubmitted(_)))
    );
}

#[test]
fn a_restart_mid_plan_resumes_from_the_log() {
    let mut session = Session::new(5);
    session.ok(plan_user("work"));
    session.ok(model_done("", vec![submit_plan("p1", &["one", "two"])]));
    session.ok(model_done(
        "",
        vec![complete_step("c1", "completed", "done one")],
    ));
    let mut restarted = session.restarted();
    assert_eq!(restarted.state, session.state);
    let effects = restarted.ok(Input::Interrupted);
    assert!(calls_model(&effects));
    let plan = plan_of(&restarted.state);
    assert_eq!(plan.current, Some(1));
    assert!(plan.guidance().contains("1. [done] one -> done one"));
}

// ---------------------------------------------------------------------------
// Compaction
// ---------------------------------------------------------------------------

fn compacted(messages: u32, first_seq: u64, last_seq: u64, summary: &str) -> Input {
    Input::Compacted(pb::ContextCompacted {
        first_seq,
        last_seq,
        summary: summary.into(),
        messages,
        tokens_before: 0,
        tokens_after: 0,
        note: String::new(),
    })
}

/// Two turns, the first with a tool call: history [user, assistant(call),
/// tool, assistant, user] and spans naming the events behind each.
fn two_turns_with_a_tool() -> Session {
    let mut session = Session::new(5);
    session.ok(user("first"));
    session.ok(model_done("", vec![bash("b1", "ls")]));
    session.ok(done("b1", "a b"));
    session.ok(model_done("listed", vec![]));
    session.ok(user_in(TURN2, "second"));
    session
}

#[test]
fn every_message_knows_the_events_behind_it() {
    let session = two_turns_with_a_tool();
    let seq_of = |pred: &dyn Fn(&Kind) -> bool| {
        session
            .log
            .iter()
            .find(|e| pred(e.kind.as_ref().unwrap()))
            .unwrap()
            .seq
    };
    let user1 = seq_of(&|k| matches!(k, Kind::UserMessage(m) if m.text == "first"));
    let call = seq_of(&|k| matches!(k, Kind::ModelMessage(m) if m.step == 1));
    let result = seq_of(&|k| matches!(k, Kind::ToolResult(_)));
    let answer = seq_of(&|k| matches!(k, Kind::ModelMessage(m) if m.text == "listed"));
    let user2 = seq_of(&|k| matches!(k, Kind::UserMessage(m) if m.text == "second"));
    let spans: Vec<(u64, u64)> = [user1, call, result, answer, user2]
        .iter()
        .map(|&s| (s, s))
        .collect();
    assert_eq!(session.state.history_spans, spans);
    assert_eq!(session.state.last_seq, session.log.len() as u64);
}

#[test]
fn a_compaction_replaces_a_prefix_with_its_summary() {
    let mut session = two_turns_with_a_tool();
    let spans = session.state.history_spans.clone();
    // Replace the first turn (user, call, result, answer).
    let effects = session.ok(compacted(
        4,
        spans[0].0,
        spans[3].1,
        "The person asked to list.",
    ));
    assert!(!calls_model(&effects), "the model call is already running");
    assert_eq!(session.state.history.len(), 2);
    let Message::System { content } = &session.state.history[0] else {
        panic!("{:?}", session.state.history[0])
    };
    assert!(content.ends_with("The person asked to list."), "{content}");
    assert_eq!(session.state.history[1], Message::user("second"));
    assert_eq!(
        session.state.history_spans,
        vec![(spans[0].0, spans[3].1), spans[4]]
    );
    // The turn goes on with the compacted history.
    let effects = session.ok(model_done("", vec![bash("b2", "pwd")]));
    assert_eq!(run_tools(&effects), vec![bash("b2", "pwd")]);
    let effects = session.ok(done("b2", "/w"));
    let Some(Effect::CallModel { history }) = effects.last() else {
        panic!("{effects:?}")
    };
    assert_eq!(history.len(), 4);
    // A second compaction replaces the summary and more.
    let spans = session.state.history_spans.clone();
    session.ok(compacted(
        2,
        spans[0].0,
        spans[1].1,
        "Listed, then asked again.",
    ));
    assert_eq!(session.state.history_spans[0], (spans[0].0, spans[1].1));
}

#[test]
fn compactions_that_do_not_fit_the_conversation_are_refused() {
    let mut session = two_turns_with_a_tool();
    let spans = session.state.history_spans.clone();
    let unexpected = |input| Refusal::Unexpected {
        input,
        phase: Phase::Generate,
    };
    let wrong = "compaction of another conversation";
    // It would separate the call from its result.
    session.refused(compacted(2, spans[0].0, spans[1].1, "x"), unexpected(wrong));
    // Not from the start of the conversation.
    session.refused(compacted(4, spans[1].0, spans[3].1, "x"), unexpected(wrong));
    // Not the range of the messages it names.
    session.refused(
        compacted(4, spans[0].0, spans[3].1 + 1, "x"),
        unexpected(wrong),
    );
    session.refused(compacted(3, spans[0].0, spans[3].1, "x"), unexpected(wrong));
    // Nothing would be left.
    session.refused(compacted(5, spans[0].0, spans[4].1, "x"), unexpected(wrong));
    session.refused(compacted(0, spans[0].0, spans[0].1, "x"), unexpected(wrong));
    // Only before a model call.
    session.ok(model_done("bye", vec![]));
    session.refused(
        compacted(4, spans[0].0, spans[3].1, "x"),
        Refusal::Unexpected {
            input: "compaction",
            phase: Phase::Idle,
        },
    );
}

/// Results are kept in call order even when a later call is answered
/// first: a compaction names the latest event of the messages it replaces.
#[test]
fn a_compaction_covers_results_recorded_out_of_order() {
    let mut session = Session::new(5);
    session.ok(plan_user("work"));
    session.ok(model_done("", vec![submit_plan("p1", &["one", "two"])]));
    // complete_step is answered at once; bash's result comes later but
    // sits before it.
    session.ok(model_done(
        "",
        vec![
            bash("b1", "ls"),
            complete_step("c1", "completed", "one done"),
        ],
    ));
    session.ok(done("b1", "a b"));
    let spans = session.state.history_spans.clone();
    // [user, assistant(plan), plan result, assistant(b1, c1), b1 result, c1 result]
    assert_eq!(spans.len(), 6);
    assert!(spans[4].0 > spans[5].0, "{spans:?}");
    session.ok(model_done("", vec![bash("b2", "pwd")]));
    session.ok(done("b2", "/w"));
    // Replace the first six messages: the range ends at b1's result.
    let last = spans.iter().map(|s| s.1).max().unwrap();
    assert_eq!(last, spans[4].1);
    session.refused(
        compacted(6, spans[0].0, spans[5].1, "x"),
        Refusal::Unexpected {
            input: "compaction of another conversation",
            phase: Phase::Generate,
        },
    );
    session.ok(compacted(6, spans[0].0, last, "Planned; step one done."));
    assert_eq!(session.state.history.len(), 3);
    assert_eq!(session.state.history_spans[0], (spans[0].0, last));
}

#[test]
fn giving_up_on_a_repair_fails_the_turn() {
    let mut session = Session::new(5);
    session.ok(plan_user("work"));
    session.ok(model_done("", vec![submit_plan("p1", &["one"])]));
    session.ok(model_done(
        "",
        vec![complete_step("c1", "failed", "no network")],
    ));
    let effects = session.ok(model_done("I cannot do this without a network.", vec![]));
    let finished = outcome_of(&effects).unwrap();
    assert_eq!(finished.outcome, TurnOutcome::Failed as i32);
    assert_eq!(finished.message, "I cannot do this without a network.");
    let error = events_of(&effects)
        .into_iter()
        .find_map(|k| match k {
            Kind::Error(e) => Some(e),
            _ => None,
        })
        .unwrap();
    assert!(error.message.contains("no network"), "{}", error.message);
}

#[test]
fn complete_step_errors_say_what_to_do_instead() {
    let mut session = Session::new(8);
    session.ok(plan_user("work"));
    session.ok(model_done("", vec![submit_plan("p1", &["one", "two"])]));
    // Two ends of the same step in one response.
    let effects = session.ok(model_done(
        "",
        vec![
            complete_step("c1", "completed", ""),
            complete_step("c2", "completed", ""),
        ],
    ));
    assert_eq!(
        tool_output(&effects, "c2"),
        "error: step 1 was already ended in this response; step 2 starts next"
    );
    session.ok(model_done("", vec![complete_step("c3", "completed", "")]));
    // Every step done: the final answer is wanted, not another step.
    let effects = session.ok(model_done("", vec![complete_step("c4", "completed", "")]));
    assert!(
        tool_output(&effects, "c4").contains("write the final answer"),
        "{effects:?}"
    );
    let effects = session.ok(model_done("Both done.", vec![]));
    assert_eq!(
        outcome_of(&effects).unwrap().outcome,
        TurnOutcome::Completed as i32
    );
}

#[test]
fn an_answer_instead_of_a_plan_is_asked_for_a_plan_once() {
    let mut session = Session::new(5);
    session.ok(plan_user("work"));
    let effects = session.ok(model_done("1. look 2. fix", vec![]));
    assert!(calls_model(&effects), "asked once more");
    assert!(outcome_of(&effects).is_none());
    let guidance = session.state.plan_guidance().unwrap();
    assert!(guidance.contains("did not submit a plan"), "{guidance}");
    // It plans now: the nudge is gone.
    session.ok(model_done("", vec![submit_plan("p1", &["look"])]));
    assert!(
        !session
            .state
            .plan_guidance()
            .unwrap()
            .contains("did not submit")
    );

    // A model that answers twice has its answer taken.
    let mut session = Session::new(5);
    session.ok(plan_user("what is 2+2?"));
    session.ok(model_done("4", vec![]));
    let effects = session.ok(model_done("4", vec![]));
    let finished = outcome_of(&effects).unwrap();
    assert_eq!(finished.outcome, TurnOutcome::Completed as i32);
    assert_eq!(finished.message, "4");
}

// ---------------------------------------------------------------------------
// The person's network switch
// ---------------------------------------------------------------------------

#[test]
fn a_turn_keeps_the_persons_network_switch_through_a_replay_and_no_other_turn_inherits_it() {
    let mut session = Session::new(4);
    let effects = session.ok(Input::UserMessage {
        turn_id: TURN.into(),
        text: "fetch it".into(),
        approval_mode: ApprovalMode::Policy,
        plan: false,
        network: true,
    });
    assert_eq!(
        events_of(&effects),
        vec![Kind::UserMessage(pb::UserMessage {
            text: "fetch it".into(),
            approval_mode: ApprovalMode::Policy as i32,
            plan: false,
            network: true,
        })]
    );
    // `step` has checked that the replayed log gives the same state.
    assert!(session.state.turn.as_ref().unwrap().network);
    session.ok(model_done("fetched", vec![]));
    assert_eq!(session.state.turn, None);

    // The next message does not say network: none.
    session.ok(user_in(TURN2, "again"));
    assert!(!session.state.turn.as_ref().unwrap().network);
    session.ok(model_done("done", vec![]));

    // Nor does a turn a reminder starts, with nobody there to give it.
    session.ok(Input::ReminderDue {
        turn_id: "turn-3".into(),
        reminder: pb::ReminderDue {
            reminder_id: "r1".into(),
            firing_id: "f1".into(),
            message: "check the page".into(),
            kind: crate::reducer::REMINDER_TASK.into(),
            ..Default::default()
        },
    });
    assert!(!session.state.turn.as_ref().unwrap().network);
}

#[test]
fn an_approval_request_says_when_the_call_would_get_network() {
    let mut config = test_policy_config();
    config.rules.push(PolicyRule {
        tool: "bash".into(),
        command: Some("curl *".into()),
        path: None,
        decision: PolicyDecision::Confirm,
        reason: None,
        check_arguments: true,
        network: true,
    });
    let policy = Arc::new(Policy::from_config(&config).unwrap());
    let asked = |session: &mut Session, call: ToolCall| -> bool {
        let effects = session.ok(model_done("", vec![call]));
        events_of(&effects)
            .iter()
            .find_map(|k| match k {
                Kind::ApprovalRequested(a) => Some(a.network),
                _ => None,
            })
            .expect("an approval request")
    };

    // A rule with network: the person is told.
    let mut session = Session::with_policy(4, policy.clone(), catalog());
    session.ok(user("fetch"));
    assert!(asked(&mut session, bash("b1", "curl https://example.org")));
    // Another command in the same turn: no network.
    session.ok(deny("b1", ""));
    assert!(!asked(&mut session, bash("b2", "make build")));
    assert!(
        !session
            .state
            .network_for("bash", r#"{"command":"make build"}"#)
    );

    // A turn the person gave network: every bash call has it, other tools not.
    let mut session = Session::with_policy(4, policy, catalog());
    session.ok(Input::UserMessage {
        turn_id: TURN.into(),
        text: "build".into(),
        approval_mode: ApprovalMode::Policy,
        plan: false,
        network: true,
    });
    assert!(asked(&mut session, bash("b1", "make build")));
    assert!(
        !session
            .state
            .network_for("write_file", r#"{"path":"a","content":""}"#)
    );
}
