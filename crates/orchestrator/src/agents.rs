//! Sub-agents: a task handed by the built-in `delegate` tool to a child
//! session that runs with an agent's prompt, only its tools and its limits,
//! in the parent's workspace.
//!
//! A child is a real session: its own log in the store, linked to the
//! parent's session and call (`Session.parent`), driven by an actor like
//! any other (so its calls go through the same policy, hooks and
//! approvals, and it is recovered after a restart like any other). Its id
//! is derived from the parent's session, turn and call, so a call run again
//! after a restart finds its task instead of starting a second one.
//!
//! While the task runs, its progress (calls, results, questions) is the
//! delegate call's output; its final answer is the call's result. A child's
//! question for a person is relayed live to the parent's subscribers (the
//! event keeps the child's session id, so an answer goes to the child).
//! Dropping the delegate call (a cancel, the turn ending) cancels the task.

use crate::builtin::TurnCall;
use crate::deps::Deps;
use crate::errors::ToolFailure;
use crate::prompt::View;
use crate::reducer::{Catalog, ToolFlags};
use agentry_llm::{ToolCall, ToolDefinition};
use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::orchestrator::v1::orchestrator_server::Orchestrator;
use agentry_proto::sessions::v1::{self as pb, event::Kind};
use agentry_runtime::config::AgentDefinition;
use agentry_tool::{Running, Tool, ToolSpec};
use sha2::Digest;
use std::sync::Arc;
use tokio_stream::StreamExt;

/// The built-in tool's name.
pub const DELEGATE: &str = crate::reducer::DELEGATE_TOOL;
/// How the ids of sub-agents' task sessions start (clients may not use it).
pub const TASK_PREFIX: &str = "sub-";
/// How often a task's open questions are shown again to the parent's
/// subscribers (a chat that attached later sees them).
const RELAY_AGAIN: std::time::Duration = std::time::Duration::from_secs(3);

/// One configured agent.
#[derive(Debug)]
pub struct Agent {
    /// As configured.
    pub def: AgentDefinition,
}

/// The configured agents and the bound on tasks running at once.
#[derive(Debug)]
pub struct Agents {
    list: Vec<Arc<Agent>>,
    /// Places for tasks running at once.
    pub slots: Arc<tokio::sync::Semaphore>,
}

impl Default for Agents {
    fn default() -> Self {
        Agents::new(Vec::new(), 4)
    }
}

impl Agents {
    /// These agents, at most `parallel` tasks at once.
    pub fn new(defs: Vec<AgentDefinition>, parallel: u32) -> Agents {
        Agents {
            list: defs
                .into_iter()
                .map(|def| Arc::new(Agent { def }))
                .collect(),
            slots: Arc::new(tokio::sync::Semaphore::new(parallel.max(1) as usize)),
        }
    }

    /// A place for one task among those running at once (waits for one).
    pub async fn slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ToolFailure> {
        self.slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ToolFailure("the orchestrator is stopping".to_string()))
    }

    /// Whether any agent is configured (the `delegate` tool is offered only
    /// then).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The agent called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Agent>> {
        self.list.iter().find(|a| a.def.name == name).cloned()
    }

    /// The `delegate` tool, as offered with `catalog` (the runners' and the
    /// built-in tools): read-only, and so run side by side with other
    /// read-only calls, when every agent's tools are read-only there.
    pub fn delegate_tool(&self, catalog: &Catalog) -> (ToolDefinition, ToolFlags) {
        // A remote agent may change anything on its side: never read-only.
        let read_only = self.list.iter().all(|a| {
            a.def.url.is_none()
                && a.def
                    .tools
                    .iter()
                    .all(|t| catalog.flags.get(t).is_some_and(|f| f.read_only))
        });
        let names: Vec<&str> = self.list.iter().map(|a| a.def.name.as_str()).collect();
        let listing: Vec<String> = self
            .list
            .iter()
            .map(|a| format!("- {}: {}", a.def.name, a.def.description))
            .collect();
        (
            ToolDefinition {
                name: DELEGATE.into(),
                description: format!(
                    "Hand a focused task to a sub-agent, which works on it in this workspace \
                     with its own instructions and tools, and returns its final answer. Give it \
                     everything it needs in `task`: it does not see this conversation. \
                     Agents:\n{}",
                    listing.join("\n")
                ),
                parameters: serde_json::json!({
                    "type": "object",
                    "properties": {
                        "agent": {"type": "string", "enum": names, "description": "Which agent."},
                        "task": {"type": "string", "description": "The task, self-contained."}
                    },
                    "required": ["agent", "task"],
                    "additionalProperties": false
                }),
            },
            ToolFlags {
                read_only,
                parallel_safe: read_only,
                read_only_hint: false,
                network: false,
            },
        )
    }
}

impl Agent {
    /// What shapes the agent's requests: the orchestrator's view with the
    /// agent's prompt and window, no skillsets, only the tools offered.
    pub fn view(&self, base: &View) -> View {
        let mut view = base.clone();
        view.system_prompt = self.def.system_prompt.clone();
        view.skillsets = Default::default();
        view.only_offered = true;
        if let Some(window) = self.def.context_window {
            view.compaction.context_window = window as usize;
            view.compaction.window_source = format!("agent {:?}", self.def.name);
        }
        view
    }

    /// The agent's tools out of `catalog` (in its order).
    pub fn catalog(&self, catalog: &Catalog) -> Catalog {
        let mut own = Catalog::default();
        for definition in &catalog.definitions {
            if self.def.tools.contains(&definition.name)
                && let Some(flags) = catalog.flags.get(&definition.name)
            {
                own.add(definition.clone(), *flags);
            }
        }
        own
    }
}

/// The id of the task a delegate call runs: the same for the same call of
/// the same model response (`step` of the turn), so a call run again after
/// a restart finds its task, and a call id the model uses again in a later
/// response is another task.
/// Sessions a scheduled task's run works in as a configured agent begin
/// with this (their store record names the agent as their parent's).
pub const AGENT_RUN_PREFIX: &str = "run-as-";

pub fn child_id(parent: &str, turn_id: &str, step: u32, call_id: &str) -> String {
    let digest = sha2::Sha256::digest(format!("{parent}\n{turn_id}\n{step}\n{call_id}").as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{TASK_PREFIX}{hex}")
}

/// Whether the delegate call that task `child` works for has a result in
/// the parent's log `log` (the call found by the id it gives).
pub fn call_ended(log: &[pb::Event], parent: &str, call_id: &str, child: &str) -> bool {
    let mut steps: std::collections::HashMap<&str, u32> = Default::default();
    let mut found: Option<&str> = None;
    for event in log {
        let turn = event.turn_id.as_str();
        match &event.kind {
            Some(Kind::ModelMessage(_)) => {
                *steps.entry(turn).or_default() += 1;
                // A later response of the turn: the call's step is over.
                if found == Some(turn) {
                    return false;
                }
            }
            Some(Kind::ToolCallRequested(c))
                if c.call_id == call_id
                    && child_id(parent, turn, steps.get(turn).copied().unwrap_or(0), call_id)
                        == child =>
            {
                found = Some(turn);
            }
            Some(Kind::ToolResult(r)) if found == Some(turn) && r.call_id == call_id => {
                return true;
            }
            _ => {}
        }
    }
    false
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DelegateArgs {
    agent: String,
    task: String,
}

/// Where a delegate call sends its progress.
pub type Progress = tokio::sync::mpsc::UnboundedSender<String>;

/// The `delegate` tool: a task for a sub-agent, its progress as the
/// call's output, its answer as the result, its tokens as the result's
/// sub-agent usage. Offered (with the configured agents listed) by
/// [`Agents::delegate_tool`].
pub struct Delegate {
    spec: ToolSpec,
}

impl Default for Delegate {
    /// The tool, described without the agents (they are listed where it
    /// is offered).
    fn default() -> Delegate {
        Delegate {
            spec: ToolSpec::changing(
                DELEGATE,
                "Hand a focused task to a sub-agent, which works on it in this workspace with \
                 its own instructions and tools, and returns its final answer.",
                serde_json::json!({
                    "type": "object",
                    "properties": {
                        "agent": {"type": "string", "description": "Which agent."},
                        "task": {"type": "string", "description": "The task, self-contained."}
                    },
                    "required": ["agent", "task"],
                    "additionalProperties": false
                }),
            ),
        }
    }
}

impl Tool<TurnCall> for Delegate {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run<'a>(&'a self, call: &'a TurnCall, _arguments: &'a str) -> Running<'a, pb::ToolResult> {
        Box::pin(async move {
            let started = std::time::Instant::now();
            let outcome = delegate(
                &call.sessions,
                &call.session_id,
                &call.turn_id,
                call.step,
                call.approval_mode,
                &call.call,
                call.progress.clone(),
            )
            .await;
            let deps = call.sessions.deps();
            let usage = task_usage_of(
                deps,
                &call.session_id,
                &call.turn_id,
                call.step,
                &call.call.id,
            )
            .await;
            pb::ToolResult {
                sub_agent_usage: usage,
                ..crate::builtin::result_of(&call.call, outcome, started)
            }
        })
    }
}

/// The tokens the task of a delegate call used (read from its log, so a
/// call run again after a restart counts the same); `None` for none or no
/// task.
pub async fn task_usage_of(
    deps: &Deps,
    parent: &str,
    turn_id: &str,
    step: u32,
    call_id: &str,
) -> Option<pb::TokenUsage> {
    let log = deps
        .read_log(&child_id(parent, turn_id, step, call_id))
        .await
        .ok()?;
    task_usage(&log)
}

/// The tokens a task's log shows spent: its model calls' and its own
/// sub-agents' (rewound turns included: what was spent was spent); `None`
/// for none.
pub fn task_usage(log: &[pb::Event]) -> Option<pb::TokenUsage> {
    let mut total = pb::TokenUsage::default();
    for event in log {
        let usage = match &event.kind {
            Some(Kind::ModelMessage(m)) => m.usage.as_ref(),
            Some(Kind::ToolResult(r)) => r.sub_agent_usage.as_ref(),
            _ => None,
        };
        if let Some(u) = usage {
            total.prompt_tokens += u.prompt_tokens;
            total.completion_tokens += u.completion_tokens;
            total.total_tokens += u.total_tokens;
            total.cached_prompt_tokens += u.cached_prompt_tokens;
            total.cache_write_prompt_tokens += u.cache_write_prompt_tokens;
        }
    }
    (total.total_tokens > 0).then_some(total)
}

/// Runs a delegate call of session `parent` (turn `turn_id`, whose calls
/// are approved as `approval_mode`): the child's final answer, or why
/// there is none.
pub async fn delegate(
    service: &crate::service::Sessions,
    parent: &str,
    turn_id: &str,
    step: u32,
    approval_mode: pb::ApprovalMode,
    call: &ToolCall,
    progress: Progress,
) -> Result<String, ToolFailure> {
    let deps = service.deps().clone();
    let agents = &service.settings().agents;
    let (agent, args) = agent_and_task(agents, call)?;
    if let Some(url) = &agent.def.url {
        let _slot = agents.slot().await?;
        return crate::remote_agent::delegate(&agent.def, url, &args.task, &call.id, progress)
            .await;
    }
    let child = child_id(parent, turn_id, step, &call.id);
    let link = pb::SessionParent {
        session_id: parent.to_string(),
        call_id: call.id.clone(),
        agent: agent.def.name.clone(),
    };
    make_task_session(&deps, &child, &link, &args.task).await?;
    // A call that ends without the answer (cancelled, refused) cancels its
    // task when its result is recorded (the actor's `cancel_task`).
    let log = deps
        .read_log(&child)
        .await
        .map_err(|s| format!("cannot read the task's session: {}", s.message()))?;
    if let Some(answer) = finished(&log) {
        return answer;
    }
    let _slot = agents.slot().await?;
    let open = questions_left(&child, &log);
    let started = log
        .iter()
        .any(|e| matches!(e.kind, Some(Kind::UserMessage(_))));
    let events = service
        .subscribe(tonic::Request::new(opb::SubscribeRequest {
            session_id: child.clone(),
            from_seq: (log.len() as u64) + 1,
            live_only: false,
        }))
        .await
        .map_err(|s| format!("cannot follow the task: {}", s.message()))?
        .into_inner();
    if started {
        // Taken up again after a restart: its actor recovers it.
        service
            .wake(&child)
            .await
            .map_err(|s| format!("cannot take up the task: {}", s.message()))?;
    } else {
        let _ = progress.send(format!(
            "[{}] {}\n",
            agent.def.name,
            one_line(&args.task, 200)
        ));
        service
            .submit(tonic::Request::new(opb::SubmitRequest {
                session_id: child.clone(),
                input: Some(opb::Input {
                    kind: Some(opb::input::Kind::UserMessage(opb::UserInput {
                        text: args.task.clone(),
                        approval_mode: approval_mode as i32,
                        ..Default::default()
                    })),
                }),
            }))
            .await
            .map_err(|s| format!("cannot start the task: {}", s.message()))?;
    }
    let task = Task {
        deps: &deps,
        parent,
        child: &child,
        name: &agent.def.name,
        progress,
    };
    task.follow(events, open).await
}

/// The agent a delegate call names and its task, or why the call cannot
/// run.
fn agent_and_task(
    agents: &Agents,
    call: &ToolCall,
) -> Result<(Arc<Agent>, DelegateArgs), ToolFailure> {
    let args: DelegateArgs = serde_json::from_str(&call.arguments)
        .map_err(|e| format!("invalid arguments for delegate: {e}"))?;
    let Some(agent) = agents.get(&args.agent) else {
        let names: Vec<String> = agents.list.iter().map(|a| a.def.name.clone()).collect();
        return Err(ToolFailure(format!(
            "no agent {:?}; the agents are: {}",
            args.agent,
            names.join(", ")
        )));
    };
    if args.task.trim().is_empty() {
        return Err("the task is empty: say what the agent should do".into());
    }
    Ok((agent, args))
}

/// Makes the task's session, once: an existing one is taken up again only
/// when it is this call's own task.
async fn make_task_session(
    deps: &Deps,
    child: &str,
    link: &pb::SessionParent,
    task: &str,
) -> Result<(), ToolFailure> {
    let created = deps
        .store
        .clone()
        .create_session(pb::CreateSessionRequest {
            project_dir: String::new(),
            session_id: child.to_string(),
            title: task.chars().take(80).collect(),
            parent: Some(link.clone()),
        })
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(status) if status.code() == tonic::Code::AlreadyExists => {
            let existing = deps
                .store
                .clone()
                .get_session(pb::GetSessionRequest {
                    session_id: child.to_string(),
                })
                .await
                .map_err(|s| format!("cannot read the task's session: {}", s.message()))?
                .into_inner();
            if existing.parent.as_ref() == Some(link) {
                Ok(())
            } else {
                Err(ToolFailure(format!(
                    "session {child} exists and is not this call's task; not using it"
                )))
            }
        }
        Err(status) => Err(ToolFailure(format!(
            "cannot start the task: {}",
            status.message()
        ))),
    }
}

/// The questions the task asked before this call followed it (a restart),
/// as the events that asked them.
fn questions_left(child: &str, log: &[pb::Event]) -> Vec<pb::Event> {
    let session = pb::Session {
        id: child.to_string(),
        ..Default::default()
    };
    crate::inbox::pending(&session, log)
        .into_iter()
        .map(|p| pb::Event {
            session_id: child.to_string(),
            turn_id: p.turn_id,
            kind: Some(Kind::ApprovalRequested(pb::ApprovalRequested {
                call_id: p.call_id,
                tool: p.tool,
                arguments_json: p.arguments_json,
                matched_rule: p.matched_rule,
                network: p.network,
                outcome_unknown: false,
                ..Default::default()
            })),
            ..Default::default()
        })
        .collect()
}

/// A task being followed by its delegate call.
struct Task<'a> {
    deps: &'a Arc<Deps>,
    parent: &'a str,
    child: &'a str,
    name: &'a str,
    progress: Progress,
}

impl Task<'_> {
    /// Follows the task's events until its turn ends: its calls and results
    /// as the call's progress, its questions relayed to the parent (again
    /// every while, for clients that joined later); its answer.
    async fn follow(
        &self,
        mut events: crate::service::BoxStream<pb::Event>,
        mut open: Vec<pb::Event>,
    ) -> Result<String, ToolFailure> {
        let (deps, parent, child, name) = (self.deps, self.parent, self.child, self.name);
        let mut again = tokio::time::interval(RELAY_AGAIN);
        again.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                _ = again.tick() => {
                    for question in &open {
                        relay(deps, parent, question, name);
                    }
                    continue;
                }
            };
            let Some(event) = event else { break };
            let event = event.map_err(|s| format!("lost the task's events: {}", s.message()))?;
            if event.live {
                continue;
            }
            let Some(kind) = &event.kind else { continue };
            match kind {
                Kind::ToolCallRequested(c) => {
                    let _ = self.progress.send(format!(
                        "[{name}] {} {}\n",
                        c.tool,
                        one_line(&c.arguments_json, 160)
                    ));
                }
                Kind::ToolResult(r) => {
                    let mark = if r.is_error { "✗" } else { "←" };
                    let _ = self
                        .progress
                        .send(format!("[{name}] {mark} {}\n", one_line(&r.output, 160)));
                }
                Kind::ApprovalRequested(a) => {
                    let _ = self.progress.send(format!(
                        "[{name}] waits for a person to approve {} (session {child}, call {})\n",
                        a.tool, a.call_id
                    ));
                    relay(deps, parent, &event, name);
                    open.retain(|q| !same_call(q, &a.call_id));
                    open.push(event.clone());
                }
                Kind::ToolCallState(s) if s.phase != pb::ToolCallPhase::AwaitingApproval as i32 => {
                    relay(deps, parent, &event, name);
                    open.retain(|q| !same_call(q, &s.call_id));
                }
                Kind::TurnFinished(_) => {
                    return finished(std::slice::from_ref(&event)).unwrap_or_else(|| {
                        Err(ToolFailure("the task ended without an answer".to_string()))
                    });
                }
                _ => {}
            }
        }
        Err("the task's events ended before it finished".into())
    }
}

/// The task's answer once its turn has finished.
fn finished(log: &[pb::Event]) -> Option<Result<String, ToolFailure>> {
    log.iter().rev().find_map(|e| match &e.kind {
        Some(Kind::TurnFinished(f)) => Some(match pb::TurnOutcome::try_from(f.outcome) {
            Ok(pb::TurnOutcome::Completed) => Ok(f.message.clone()),
            Ok(pb::TurnOutcome::Cancelled) => Err("the task was cancelled".into()),
            _ => Err(ToolFailure(format!("the task stopped: {}", f.message))),
        }),
        _ => None,
    })
}

/// Shows a child's question (or its end) to the parent's subscribers, as
/// the child's event, the agent named in its rule.
fn relay(deps: &Deps, parent: &str, event: &pb::Event, agent: &str) {
    let mut relayed = event.clone();
    relayed.live = true;
    if let Some(Kind::ApprovalRequested(a)) = &mut relayed.kind {
        a.matched_rule = format!("sub-agent {agent}: {}", a.matched_rule);
    }
    deps.live.publish_to(parent, relayed);
}

fn one_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    let mut out: String = line.chars().filter(|c| !c.is_control()).take(max).collect();
    if line.chars().count() > max || text.lines().nth(1).is_some() {
        out.push('…');
    }
    out
}

/// Cancels the task `child` if it exists and runs (in the background).
pub fn cancel_task(service: crate::service::Sessions, child: String) {
    let deps = service.deps().clone();
    tokio::spawn(async move {
        // Only an existing task: no session is made for a cancel.
        let exists = deps
            .store
            .clone()
            .get_session(pb::GetSessionRequest {
                session_id: child.clone(),
            })
            .await
            .is_ok_and(|s| s.into_inner().turn_open);
        if exists {
            submit_cancel(&service, child).await;
        }
    });
}

async fn submit_cancel(service: &crate::service::Sessions, child: String) {
    let _ = service
        .submit(tonic::Request::new(opb::SubmitRequest {
            session_id: child,
            input: Some(opb::Input {
                kind: Some(opb::input::Kind::Cancel(opb::CancelInput {
                    reason: "the delegating call has ended".into(),
                })),
            }),
        }))
        .await;
}

/// Whether a relayed question is about `call_id`.
fn same_call(question: &pb::Event, call_id: &str) -> bool {
    matches!(&question.kind, Some(Kind::ApprovalRequested(a)) if a.call_id == call_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_id_is_the_same_for_the_same_call_and_fits_a_session_id() {
        let a = child_id("01abc", "turn-1", 1, "call_0");
        assert_eq!(a, child_id("01abc", "turn-1", 1, "call_0"));
        assert_ne!(a, child_id("01abc", "turn-1", 2, "call_0"));
        assert_ne!(a, child_id("01abc", "turn-2", 1, "call_0"));
        assert_ne!(a, child_id("01abd", "turn-1", 1, "call_0"));
        assert!(a.len() <= 64 && a.starts_with("sub-"), "{a}");
    }
}
