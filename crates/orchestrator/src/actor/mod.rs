//! The effect runner: one actor per session performs the reducer's effects
//! (append to the store, call the model, run tools) and feeds their outcomes
//! back as inputs.

mod hook_run;
mod model_call;
mod rewind;
mod tool_call;

use rewind::RewindError;

use crate::deps::Deps;
use crate::metrics::{CALLS_IN_FLIGHT, CALLS_IN_FLIGHT_HELP};
use crate::prompt::{CompactionJob, ModelRequest};
use crate::reducer::{Catalog, Effect, Input, SessionState};
use crate::settings::Settings;
use agentry_llm::{Message, ToolCall};
use agentry_proto::sessions::v1 as pb;
use std::collections::VecDeque;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tonic::Status;
use tracing::{Instrument, Span};

/// What a successful submit reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The turn the input started or belongs to.
    pub turn_id: String,
    /// The seq of the event recording the input.
    pub seq: u64,
}

/// A request to a session actor (always sent boxed, so the size of its
/// largest variant costs nothing in the channel).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Command {
    /// An input for the reducer.
    Input {
        input: Input,
        /// The person who sent it (`None`: made by the services).
        by: Option<String>,
        reply: oneshot::Sender<Result<Submitted, Status>>,
    },
    /// Put the session back to the end of turn `to_turn`.
    Rewind {
        to_turn: u32,
        with_files: bool,
        /// The person who asked.
        by: Option<String>,
        reply:
            oneshot::Sender<Result<agentry_proto::orchestrator::v1::RewindSessionResponse, Status>>,
    },
}

/// A handle to a running session actor.
#[derive(Clone)]
pub(crate) struct SessionHandle {
    /// Boxed, like the outcomes: the channel's blocks stay small.
    pub commands: mpsc::Sender<Box<Command>>,
}

/// Outcomes of in-flight work, tagged with the task that produced them;
/// boxed, so that the channel's blocks (which an idle session keeps) stay
/// small.
type Outcome = Box<(u64, Input)>;

/// Where a loaded session's log stands.
pub(crate) struct LogPosition {
    /// The seq of its last event (0: none yet).
    pub log_len: u64,
    /// The seq its stored checkpoint is at (0: none).
    pub checkpointed_at: u64,
}

pub(crate) struct Actor {
    session_id: String,
    state: SessionState,
    next_seq: u64,
    /// The seq of the session's latest checkpoint, stored or on its way
    /// with the append in flight (0: none).
    checkpointed_at: u64,
    /// The session's lease epoch this replica holds (0: no lease).
    lease_epoch: u64,
    deps: Arc<Deps>,
    settings: Arc<Settings>,
    /// The sessions of this replica, for the tasks this session starts
    /// and ends.
    sessions: crate::service::Sessions,
    outcomes_tx: mpsc::Sender<Outcome>,
    outcomes: mpsc::Receiver<Outcome>,
    /// Model and tool calls running now, by task id.
    in_flight: HashMap<u64, AbortHandle>,
    tasks_started: u64,
    /// The span of the turn running now: the root of the turn's trace.
    turn_span: Option<(String, Span)>,
    /// The tool catalog last found equal to the recorded one.
    offered: Option<Arc<Catalog>>,
    /// The turn whose workspace was recorded before its first call that
    /// may change files.
    snapshotted_turn: Option<String>,
    /// A turn ran such a call: its workspace is recorded when it ends.
    files_changed: bool,
    /// The session's instruction files were looked for since the actor
    /// started (before its first model call).
    instructions_checked: bool,
    /// Set for a sub-agent's session.
    child: Option<Child>,
    /// The task of each delegate call started, by call id.
    tasks: HashMap<String, String>,
    /// The person whose input is being handled: the events recording it
    /// carry their name.
    acting_for: Option<String>,
    /// Events decided and not yet sent to the store, and effects waiting
    /// for the events before them to be durable, in the order decided
    /// (see [`Actor::pump`]).
    queue: VecDeque<Queued>,
    /// The append in flight (one at a time, so the log keeps the order).
    writing: Option<Write>,
    /// Events in the append in flight, in runs recorded in ordinary or
    /// scheduled turns (for the webhooks).
    writing_runs: Vec<(u64, bool)>,
    /// Turns whose end is decided and not yet durable (with the seq their
    /// `turn_finished` will have): if the store fails first, their
    /// followers are told the turn ended.
    ending: VecDeque<(u64, String)>,
    /// Work without side effects in flight (model calls, read-only tool
    /// calls), by task: its outcome is about to add events.
    quick: HashSet<u64>,
    /// Until when the queued events wait for that work before they are
    /// written (see [`LINGER`]).
    linger: Option<tokio::time::Instant>,
    /// When the actor last handled anything (for unloading an idle session).
    active_at: tokio::time::Instant,
}

/// Counts the session actors running on this replica
/// (`agentry_sessions_loaded`) for as long as it lives.
struct Loaded(Arc<agentry_runtime::metrics::Registry>);

impl Loaded {
    fn new(metrics: Arc<agentry_runtime::metrics::Registry>) -> Self {
        crate::metrics::sessions_loaded_changed(&metrics, 1.0);
        Loaded(metrics)
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        crate::metrics::sessions_loaded_changed(&self.0, -1.0);
    }
}

/// When to write the queued events.
#[derive(Clone, Copy, PartialEq, Eq)]
enum When {
    /// Not now: more effects of the same step follow.
    Later,
    /// Now, unless work without side effects that will add events is in
    /// flight: then up to [`LINGER`] later, so that its events go in the
    /// same commit.
    Soon,
    /// Now.
    Now,
}

/// How long decided events may wait for quick work in flight (a model
/// call, a read-only tool) before they are written anyway. A model and a
/// read-only tool that answer within it put a turn's whole middle into
/// one commit; a slow model costs its events no more than this.
const LINGER: Duration = Duration::from_millis(2);

/// A store append in flight (its own task, so it goes out at once, even
/// while the actor awaits something else); it yields its request back with
/// the outcome.
type Write = tokio::task::JoinHandle<(pb::AppendRequest, Result<(), Broken>)>;

/// What the actor has decided and not yet done.
enum Queued {
    /// Events to append, with the span of the turn that recorded them and
    /// whether that turn was a scheduled run.
    Events(Vec<pb::Event>, Span, bool),
    /// An effect, with where in the turn it was decided.
    Effect(Effect, Decided),
}

/// Where in its turn an effect was decided: a tool call started later
/// still belongs there.
#[derive(Clone)]
pub(crate) struct Decided {
    turn_id: String,
    step: u32,
    approval_mode: pb::ApprovalMode,
    /// The turn's span: the work started belongs to the turn's trace.
    span: Span,
}

/// Whether `effect` may start before the events decided ahead of it are
/// durable: work without side effects (a model call, a read-only tool) may,
/// as its outcome only ever follows those events in the log, and if the
/// process dies meanwhile, recovery asks the model again and re-runs
/// read-only calls. Anything else waits until the events before it are
/// durable.
fn overlaps(effect: &Effect) -> bool {
    match effect {
        Effect::CallModel { .. } | Effect::Summarise { .. } => true,
        // Going on with a person's answers waits until they are stored.
        Effect::RunTool {
            read_only, resume, ..
        } => *read_only && resume.is_none(),
        // A person's commands: only once what led to them is stored.
        Effect::Record { .. }
        | Effect::StopAsking { .. }
        | Effect::AbortInFlight
        | Effect::RunHooks(_)
        | Effect::WakeAt { .. }
        | Effect::EndTask { .. } => false,
    }
}

/// The outcome of the append in flight (never ready when there is none).
async fn written(writing: &mut Option<Write>) -> Written {
    match writing {
        Some(write) => write.await,
        None => std::future::pending().await,
    }
}

/// How an append task ended.
type Written = Result<(pb::AppendRequest, Result<(), Broken>), tokio::task::JoinError>;

/// The store could not record an event: the actor stops, and the session is
/// reloaded from its log on next use.
#[derive(Debug)]
struct Broken(Status);

pub(crate) fn now() -> prost_types::Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// What makes a session a sub-agent's task.
pub(crate) struct Child {
    /// Its agent.
    pub agent: Arc<crate::agents::Agent>,
    /// The session whose workspace it works in (its parent's).
    pub workspace: String,
    /// Its delegate call has ended: an unfinished turn is cancelled, not
    /// recovered.
    pub orphan: bool,
}

/// Whether an event records a person's input (and so carries who sent it).
fn records_input(kind: &pb::event::Kind) -> bool {
    use pb::event::Kind;
    matches!(
        kind,
        Kind::UserMessage(_)
            | Kind::ApprovalDecided(_)
            | Kind::McpInputProvided(_)
            | Kind::TurnResumed(_)
            | Kind::CancelRequested(_)
            | Kind::ModelChanged(_)
            | Kind::SessionRewound(_)
    )
}

/// How long past its own timeout a hook's runner may take to answer.
const HOOK_RPC_MARGIN_SECS: u64 = 10;

/// How many ready outcomes are handled in one go at most.
const MAX_BATCH: usize = 512;

/// How many events one append carries at most.
const MAX_APPEND: usize = 512;

/// How many decided events may wait for the store before the actor stops
/// taking outcomes until they are stored.
const MAX_UNDURABLE: u64 = 2048;

impl Actor {
    /// Starts the actor of a session whose log holds `event_count` events.
    pub(crate) fn spawn(
        session_id: String,
        state: SessionState,
        position: LogPosition,
        lease_epoch: u64,
        sessions: crate::service::Sessions,
        child: Option<Child>,
    ) -> SessionHandle {
        let deps = sessions.deps().clone();
        let settings = sessions.settings().clone();
        let (commands_tx, commands) = mpsc::channel(64);
        let (outcomes_tx, outcomes) = mpsc::channel(1024);
        let files_changed = state.turn_changes_files();
        let actor = Actor {
            snapshotted_turn: None,
            files_changed,
            instructions_checked: false,
            session_id,
            state,
            next_seq: position.log_len + 1,
            checkpointed_at: position.checkpointed_at,
            lease_epoch,
            deps,
            settings,
            sessions,
            outcomes_tx,
            outcomes,
            in_flight: HashMap::new(),
            tasks_started: 0,
            turn_span: None,
            offered: None,
            child,
            tasks: HashMap::new(),
            acting_for: None,
            queue: VecDeque::new(),
            writing: None,
            writing_runs: Vec::new(),
            ending: VecDeque::new(),
            quick: HashSet::new(),
            linger: None,
            active_at: tokio::time::Instant::now(),
        };
        let loaded = Loaded::new(actor.deps.metrics.clone());
        tokio::spawn(async move {
            actor.run(commands).await;
            drop(loaded);
        });
        SessionHandle {
            commands: commands_tx,
        }
    }

    async fn run(mut self, mut commands: mpsc::Receiver<Box<Command>>) {
        // A turn left unfinished by an earlier process is closed first.
        if !self.state.is_idle() {
            let orphan = self.child.as_ref().is_some_and(|c| c.orphan);
            let input = if orphan {
                tracing::info!(session_id = %self.session_id, "cancelling a sub-agent's task whose call has ended");
                Input::Cancel {
                    reason: "the delegating call has ended".into(),
                }
            } else {
                tracing::warn!(session_id = %self.session_id, "closing a turn interrupted by a restart");
                Input::Interrupted
            };
            let effects = self.state.step(input).unwrap_or_default();
            if let Err(Broken(status)) = self.run_effects_traced(effects, true).await {
                tracing::error!(session_id = %self.session_id, error = %status.message(), "cannot close the interrupted turn");
                self.stopped(&status);
                return;
            }
        }
        loop {
            let linger = self.linger;
            let unload_at = self
                .settings
                .unload_idle
                .filter(|_| self.is_resting())
                .and_then(|idle| self.active_at.checked_add(idle));
            let mut unload = false;
            let result = tokio::select! {
                command = commands.recv() => match command.map(|c| *c) {
                    Some(Command::Input { input, by, reply }) => {
                        self.acting_for = by;
                        let result = self.handle_command(input, reply).await;
                        self.acting_for = None;
                        result
                    }
                    Some(Command::Rewind { to_turn, with_files, by, reply }) => {
                        self.acting_for = by;
                        let result = self.rewind(to_turn, with_files).await;
                        self.acting_for = None;
                        let broken = matches!(&result, Err(RewindError::Broken(_)));
                        let _ = reply.send(result.map_err(RewindError::into_status));
                        if broken {
                            Err(Broken(Status::unavailable("the session store refused an append")))
                        } else {
                            Ok(())
                        }
                    }
                    None => {
                        // Nothing decided is dropped: it is stored first.
                        let flushed = self.flush().await;
                        if flushed.is_ok() {
                            break;
                        }
                        flushed
                    }
                },
                Some(outcome) = self.outcomes.recv() => self.handle_outcome(outcome).await,
                done = written(&mut self.writing) => self.written(done),
                () = tokio::time::sleep_until(linger.unwrap_or_else(tokio::time::Instant::now)),
                    if linger.is_some() =>
                {
                    self.linger = None;
                    self.pump(When::Now);
                    Ok(())
                }
                () = tokio::time::sleep_until(unload_at.unwrap_or_else(tokio::time::Instant::now)),
                    if unload_at.is_some() =>
                {
                    unload = true;
                    Ok(())
                }
            };
            if let Err(Broken(status)) = result {
                tracing::error!(session_id = %self.session_id, error = %status.message(), "session actor stopped: the session store refused an append");
                self.stopped(&status);
                return;
            }
            if unload {
                // Inputs that reached the channel meanwhile are dropped
                // unread: their senders see the actor gone and route them
                // again, to an actor loaded afresh from the log, which
                // holds everything this one decided.
                drop(commands);
                tracing::debug!(session_id = %self.session_id, "unloading the session: idle");
                break;
            }
            self.active_at = tokio::time::Instant::now();
        }
        self.abort_in_flight();
        self.sessions.unloaded(&self.session_id);
    }

    /// Whether nothing runs or waits here: no turn open, nothing in
    /// flight, nothing decided and not yet stored. Such a session can be
    /// unloaded and loaded again from its log without a difference.
    fn is_resting(&self) -> bool {
        self.state.is_idle()
            && self.queue.is_empty()
            && self.writing.is_none()
            && self.in_flight.is_empty()
            && self.tasks.is_empty()
            && self.ending.is_empty()
            && self.linger.is_none()
    }

    /// The actor stops because the log cannot be written: the followers of
    /// a running turn, and of a turn whose end was decided but not stored,
    /// are told it ended (live: it cannot be logged), so no client waits
    /// for it forever. The next input starts a new actor, which closes the
    /// turn in the log.
    fn stopped(&mut self, status: &Status) {
        self.abort_in_flight();
        if let Some(write) = self.writing.take() {
            write.abort();
        }
        let mut turns: Vec<String> = self.ending.drain(..).map(|(_, turn)| turn).collect();
        if let Some(turn_id) = self.state.turn_id() {
            turns.push(turn_id.to_string());
        }
        turns.dedup();
        for turn_id in turns {
            self.announce_failed(turn_id, status);
        }
    }

    /// Tells the followers of `turn_id` that it ended as the store failed.
    fn announce_failed(&self, turn_id: String, status: &Status) {
        self.deps.live.publish(pb::Event {
            session_id: self.session_id.clone(),
            seq: self.next_seq.saturating_sub(1),
            turn_id,
            time: Some(now()),
            kind: Some(pb::event::Kind::TurnFinished(pb::TurnFinished {
                outcome: pb::TurnOutcome::Failed as i32,
                message: format!(
                    "the session stopped: {}; the turn was not recorded past this point \
                     (send a message to carry on)",
                    status.message()
                ),
                ..Default::default()
            })),
            live: true,
            by: String::new(),
        });
    }

    async fn handle_command(
        &mut self,
        input: Input,
        reply: oneshot::Sender<Result<Submitted, Status>>,
    ) -> Result<(), Broken> {
        // A person's input is taken as the old one-step-at-a-time actor took
        // it: after everything decided before it is stored and started (a
        // cancel then aborts every call already started).
        if let Err(Broken(status)) = self.flush().await {
            let _ = reply.send(Err(status.clone()));
            return Err(Broken(status));
        }
        // A cancel ends the turn it belongs to: remember which.
        let turn_before = self.state.turn_id().map(str::to_string);
        let effects = match self.state.step(input) {
            // The skillset chosen for the message is recorded with it, before
            // the model is called.
            Ok(effects) => effects,
            Err(refusal) => {
                let _ = reply.send(Err(crate::errors::refusal_status(&refusal)));
                return Ok(());
            }
        };
        // The turn the input started or belongs to: the running one, or
        // the one it was recorded in (a turn may start and end in the same
        // step, refused at once by a spending limit).
        let recorded = effects.iter().find_map(|effect| match effect {
            Effect::Record { turn_id, .. } if !turn_id.is_empty() => Some(turn_id.clone()),
            _ => None,
        });
        let turn_id = self
            .state
            .turn_id()
            .map(str::to_string)
            .or(recorded)
            .or(turn_before);
        match self.run_effects_traced(effects, true).await {
            Ok(first_seq) => {
                let turn_id = turn_id.unwrap_or_default();
                let _ = reply.send(Ok(Submitted {
                    turn_id,
                    seq: first_seq.unwrap_or(self.next_seq - 1),
                }));
                Ok(())
            }
            Err(Broken(status)) => {
                let _ = reply.send(Err(status.clone()));
                Err(Broken(status))
            }
        }
    }

    async fn handle_outcome(&mut self, outcome: Outcome) -> Result<(), Broken> {
        let (task, input) = *outcome;
        let mut effects = Vec::new();
        self.fold_outcome(task, input, &mut effects);
        // Fold whatever else is ready into the same append (streamed text
        // arrives much faster than one durable write per delta).
        let mut folded = 1;
        while folded < MAX_BATCH {
            let Ok(outcome) = self.outcomes.try_recv() else {
                break;
            };
            let (task, input) = *outcome;
            self.fold_outcome(task, input, &mut effects);
            folded += 1;
        }
        // Not waited for: what the outcome decided is stored with whatever
        // else is decided while the append before it runs; unless the store
        // has fallen far behind, then the actor waits for it.
        self.run_effects_traced(effects, false).await?;
        if self.undurable() > MAX_UNDURABLE {
            self.flush().await?;
        }
        Ok(())
    }

    /// The span of the turn the state is in (or has just finished), started
    /// when a new turn begins.
    fn turn_span(&mut self) -> Span {
        if let Some(turn_id) = self.state.turn_id()
            && self.turn_span.as_ref().is_none_or(|(id, _)| id != turn_id)
        {
            let span = tracing::info_span!(
                parent: None,
                "turn",
                session_id = %self.session_id,
                turn_id = %turn_id,
                outcome = tracing::field::Empty,
            );
            self.turn_span = Some((turn_id.to_string(), span));
        }
        match &self.turn_span {
            Some((_, span)) => span.clone(),
            None => Span::none(),
        }
    }

    /// Runs effects inside the turn's span; the span ends with the turn.
    /// With `wait`, returns once every event they record is durable.
    async fn run_effects_traced(
        &mut self,
        effects: Vec<Effect>,
        wait: bool,
    ) -> Result<Option<u64>, Broken> {
        let span = self.turn_span();
        let first_seq = self.decide(effects).instrument(span.clone()).await;
        // A turn that may have changed files has ended: record them, once
        // whatever the turn's end started (an abort of its calls) has run.
        if self.state.is_idle() && self.files_changed {
            self.files_changed = false;
            self.flush().await?;
            if let Some(noted) = self.take_snapshot(pb::SnapshotPoint::TurnEnd).await {
                self.decide(noted).instrument(span).await;
            }
        }
        if self.state.turn_id().is_none() {
            self.turn_span = None;
        }
        if wait {
            self.flush().await?;
        }
        Ok(first_seq)
    }

    /// Records the workspace; the effects that note it in the log (`None`
    /// when snapshots are off).
    async fn take_snapshot(&mut self, point: pb::SnapshotPoint) -> Option<Vec<Effect>> {
        // A sub-agent works in its parent's workspace, which the parent's
        // own snapshots record (a scheduled run as an agent has its own).
        if self
            .child
            .as_ref()
            .is_some_and(|c| c.workspace != self.session_id)
        {
            return None;
        }
        let taken = self.deps.snapshot(&self.session_id).await;
        let event = crate::forks::snapshot_event(taken, point)?;
        self.state
            .step(Input::Noted(pb::event::Kind::WorkspaceSnapshot(event)))
            .ok()
    }

    fn fold_outcome(&mut self, task: u64, input: Input, effects: &mut Vec<Effect>) {
        if !self.in_flight.contains_key(&task) {
            return; // Output of work that was cancelled.
        }
        let finishes_task = matches!(
            input,
            Input::ModelDone(_)
                | Input::ModelUnreadable { .. }
                | Input::ModelFailed { .. }
                | Input::ModelTryLater(_)
                | Input::Unpark
                | Input::ToolDone(_)
                | Input::ToolNeedsInput(_)
                | Input::Summarised { .. }
                | Input::HooksDone { .. }
        );
        let summary = matches!(input, Input::Summarised { .. });
        match self.state.step(input) {
            Ok(more) => effects.extend(more),
            Err(refusal) if summary => {
                tracing::warn!(session_id = %self.session_id, %refusal, "a compaction did not fit the conversation and was not recorded");
            }
            Err(refusal) => {
                tracing::debug!(session_id = %self.session_id, %refusal, "dropped an outcome");
            }
        }
        if finishes_task {
            self.in_flight.remove(&task);
            self.quick.remove(&task);
        }
    }

    fn abort_in_flight(&mut self) {
        for (_, handle) in self.in_flight.drain() {
            handle.abort();
        }
        self.quick.clear();
    }

    /// Runs effects in order and returns once every event they record is
    /// durable, with the seq of the first one.
    async fn run_effects(&mut self, effects: Vec<Effect>) -> Result<Option<u64>, Broken> {
        let first_seq = self.decide(effects).await;
        self.flush().await?;
        Ok(first_seq)
    }

    /// Takes effects in order: events are queued for the next append (all
    /// that are decided while one append runs go together in the next),
    /// work without side effects starts at once, anything else once the
    /// events before it are durable. Returns the seq the first recorded
    /// event will have.
    async fn decide(&mut self, effects: Vec<Effect>) -> Option<u64> {
        let mut first_seq = None;
        let mut effects = VecDeque::from(effects);
        while let Some(effect) = effects.pop_front() {
            // The first model call looks for the session's instruction
            // files: new ones are recorded and the call decided again.
            if matches!(effect, Effect::CallModel { .. } | Effect::Summarise { .. })
                && !self.instructions_checked
                && let Some(instead) = self.instructions_found().await
            {
                for effect in instead.into_iter().rev() {
                    effects.push_front(effect);
                }
                continue;
            }
            // A model call is decided with the tools offered now: if they
            // changed, the reducer records them and decides the call again.
            if matches!(effect, Effect::CallModel { .. } | Effect::Summarise { .. })
                && let Some(instead) = self.tools_changed().await
            {
                for effect in instead.into_iter().rev() {
                    effects.push_front(effect);
                }
                continue;
            }
            // The first call of a turn that may change files waits for the
            // workspace to be recorded as it was.
            if let Effect::RunTool {
                read_only: false, ..
            } = &effect
                && let Some(turn_id) = self.state.turn_id()
            {
                self.files_changed = true;
                if self.snapshotted_turn.as_deref() != Some(turn_id) {
                    self.snapshotted_turn = Some(turn_id.to_string());
                    if let Some(noted) = self.take_snapshot(pb::SnapshotPoint::BeforeChange).await {
                        effects.push_front(effect);
                        for noted in noted.into_iter().rev() {
                            effects.push_front(noted);
                        }
                        continue;
                    }
                }
            }
            if let Effect::Record { turn_id, events } = effect {
                first_seq.get_or_insert(self.next_seq + self.undurable());
                self.record(turn_id, events);
                continue;
            }
            let decided = Decided {
                turn_id: self.state.turn_id().unwrap_or_default().to_string(),
                step: self.state.turn.as_ref().map_or(0, |t| t.steps),
                approval_mode: self
                    .state
                    .turn
                    .as_ref()
                    .map_or(pb::ApprovalMode::Policy, |t| t.approval_mode),
                span: Span::current(),
            };
            self.queue.push_back(Queued::Effect(effect, decided));
            self.pump(When::Later);
        }
        self.pump(When::Soon);
        first_seq
    }

    /// Queues the events of one record effect for the next append.
    fn record(&mut self, turn_id: String, events: Vec<pb::event::Kind>) {
        let time = now();
        for kind in &events {
            let pending = match kind {
                pb::event::Kind::ApprovalRequested(_) => 1.0,
                pb::event::Kind::ApprovalDecided(_) => -1.0,
                _ => 0.0,
            };
            if pending != 0.0 {
                crate::metrics::pending_approvals_changed(&self.deps.metrics, pending);
            }
            if let pb::event::Kind::LoopDetected(repeat) = kind {
                crate::metrics::loop_detected(&self.deps.metrics, repeat.stopped);
            }
            if let pb::event::Kind::TurnFinished(finished) = kind {
                let outcome = pb::TurnOutcome::try_from(finished.outcome)
                    .map(|o| o.as_str_name())
                    .unwrap_or("TURN_OUTCOME_UNSPECIFIED");
                Span::current().record("outcome", outcome);
                crate::metrics::turn_finished(&self.deps.metrics, outcome);
                if let Some(cost) = finished.cost {
                    crate::metrics::turn_cost(&self.deps.metrics, cost, &finished.currency);
                }
            }
        }
        let scheduled = self.state.turn_scheduled;
        let first = self.next_seq + self.undurable();
        for (i, kind) in events.iter().enumerate() {
            if matches!(kind, pb::event::Kind::TurnFinished(_)) {
                self.ending.push_back((first + i as u64, turn_id.clone()));
            }
        }
        let events = events.into_iter().map(|kind| pb::Event {
            turn_id: turn_id.clone(),
            time: Some(time),
            by: match &self.acting_for {
                Some(by) if records_input(&kind) => by.clone(),
                _ => String::new(),
            },
            kind: Some(kind),
            ..Default::default()
        });
        match self.queue.back_mut() {
            Some(Queued::Events(queued, _, run)) if *run == scheduled => queued.extend(events),
            _ => self
                .queue
                .push_back(Queued::Events(events.collect(), Span::current(), scheduled)),
        }
    }

    /// Events decided that are not durable yet (in flight or queued).
    fn undurable(&self) -> u64 {
        self.writing_runs.iter().map(|(n, _)| n).sum::<u64>()
            + self
                .queue
                .iter()
                .map(|queued| match queued {
                    Queued::Events(events, ..) => events.len() as u64,
                    Queued::Effect(..) => 0,
                })
                .sum::<u64>()
    }

    /// Starts what may start: effects without side effects at once, the
    /// others once every event decided before them is durable, in the
    /// order decided; then, as `when` says and when no append is in flight,
    /// writes the events queued ahead of the first effect still waiting.
    fn pump(&mut self, when: When) {
        let mut ahead = 0u64;
        let mut i = 0;
        while i < self.queue.len() {
            let startable = match &self.queue[i] {
                Queued::Events(events, ..) => {
                    ahead += events.len() as u64;
                    i += 1;
                    continue;
                }
                Queued::Effect(effect, _) => {
                    overlaps(effect) || (ahead == 0 && self.writing.is_none())
                }
            };
            if !startable {
                break;
            }
            if let Some(Queued::Effect(effect, decided)) = self.queue.remove(i) {
                let pending = self.writing_runs.iter().map(|(n, _)| n).sum::<u64>() + ahead;
                self.start_effect(effect, decided, pending);
            }
        }
        if when == When::Later || self.writing.is_some() {
            return;
        }
        // Quick work in flight will add events: they may share this commit,
        // unless an effect waits for these events to be durable.
        let waiting = self.queue.iter().any(|q| matches!(q, Queued::Effect(..)));
        if when == When::Soon && !self.quick.is_empty() && !waiting && !self.queue.is_empty() {
            let now = tokio::time::Instant::now();
            let until = *self.linger.get_or_insert(now + LINGER);
            if now < until {
                return;
            }
        }
        self.linger = None;
        let mut batch: Vec<pb::Event> = Vec::new();
        let mut runs = Vec::new();
        let mut span = None;
        while batch.len() < MAX_APPEND
            && let Some(Queued::Events(events, recorded_in, scheduled)) = self.queue.front_mut()
        {
            // At most MAX_APPEND events per append: the rest stay queued.
            let take = events.len().min(MAX_APPEND - batch.len());
            span.get_or_insert_with(|| recorded_in.clone());
            runs.push((take as u64, *scheduled));
            batch.extend(events.drain(..take));
            if events.is_empty() {
                self.queue.pop_front();
            }
        }
        if batch.is_empty() {
            return;
        }
        let first = self.next_seq;
        let count = batch.len() as u64;
        let span = span.unwrap_or_else(Span::current);
        let span =
            tracing::info_span!(parent: &span, "store.append", events = count, first_seq = first);
        let checkpoint = self.checkpoint_after(first + count - 1);
        let request = pb::AppendRequest {
            session_id: self.session_id.clone(),
            expected_seq: first,
            events: batch,
            lease_epoch: self.lease_epoch,
            checkpoint,
        };
        self.writing_runs = runs;
        self.writing = Some(tokio::spawn(
            append(self.deps.clone(), self.settings.store_retry_window, request).instrument(span),
        ));
    }

    /// The session's state as a checkpoint to store with the append that
    /// ends at `last_seq`: when that append holds every event decided so
    /// far (so the state is the one after it), the session is idle, and
    /// enough events came since the last checkpoint
    /// (`orchestrator.checkpoint_every_events`).
    fn checkpoint_after(&mut self, last_seq: u64) -> Option<pb::Checkpoint> {
        let every = self.settings.checkpoint_every;
        if every == 0
            || self.state.last_seq != last_seq
            || last_seq.saturating_sub(self.checkpointed_at) < every
        {
            return None;
        }
        let checkpoint = self.state.checkpoint()?;
        // A state too large for one message is not written: loads read
        // the whole log, as without checkpoints.
        if checkpoint.state.len() > agentry_runtime::MAX_MESSAGE_BYTES / 4 {
            return None;
        }
        self.checkpointed_at = last_seq;
        Some(checkpoint)
    }

    /// The append in flight has ended: its events are published and what
    /// waited for them starts.
    fn written(&mut self, done: Written) -> Result<(), Broken> {
        self.writing = None;
        let runs = std::mem::take(&mut self.writing_runs);
        let (request, result) = done.map_err(|e| {
            Broken(Status::internal(format!(
                "an append to the session store did not finish: {e}"
            )))
        })?;
        result?;
        let first = request.expected_seq;
        self.next_seq += request.events.len() as u64;
        while self
            .ending
            .front()
            .is_some_and(|(seq, _)| *seq < self.next_seq)
        {
            self.ending.pop_front();
        }
        self.deps
            .live
            .logged(&self.session_id, first, &request.events);
        let mut at = 0usize;
        for (count, scheduled) in runs {
            let end = at + count as usize;
            if let Some(events) = request.events.get(at..end) {
                self.notify(first + at as u64, events, scheduled);
            }
            at = end;
        }
        self.pump(When::Soon);
        Ok(())
    }

    /// Waits until everything decided is durable and every effect has
    /// started.
    async fn flush(&mut self) -> Result<(), Broken> {
        self.pump(When::Now);
        while let Some(write) = self.writing.as_mut() {
            let done = write.await;
            self.written(done)?;
            self.pump(When::Now);
        }
        Ok(())
    }

    /// The effects that replace a model call about to start when the
    /// session has instruction files the model was not given (`None` when
    /// it has none new). Asked once per actor, again after a failure.
    async fn instructions_found(&mut self) -> Option<Vec<Effect>> {
        self.instructions_checked = true;
        let request = agentry_proto::tools::v1::ReadInstructionsRequest {
            session_id: self.workspace(),
            dir: String::new(),
        };
        let own = self.settings.view().own_instructions.clone();
        let files = match self.deps.instructions(own.as_deref(), request).await {
            Ok(files) => files,
            Err(status) => {
                tracing::warn!(session_id = %self.session_id, error = %status.message(), "cannot read the session's instruction files; trying again at the next model call");
                self.instructions_checked = false;
                return None;
            }
        };
        if files.is_empty() {
            return None;
        }
        self.state
            .step(Input::Instructions(files))
            .ok()
            .filter(|effects| !effects.is_empty())
    }

    /// The effects that replace a model call about to start when the tools
    /// offered differ from the recorded catalog (`None` when they do not).
    async fn tools_changed(&mut self) -> Option<Vec<Effect>> {
        let mut tools = self.deps.tools(&self.settings.agents).await;
        if let Some(child) = &self.child {
            // Only the agent's tools.
            tools = Arc::new(child.agent.catalog(&tools));
        } else {
            // With the tools of the servers the session brought.
            tools = self.deps.with_session_tools(&self.session_id, tools);
        }
        if self
            .offered
            .as_ref()
            .is_some_and(|offered| Arc::ptr_eq(offered, &tools))
        {
            return None;
        }
        if *tools == *self.state.catalog {
            self.offered = Some(tools);
            return None;
        }
        match self.state.step(Input::ToolCatalog(tools.clone())) {
            Ok(effects) => {
                self.offered = Some(tools);
                Some(effects)
            }
            Err(refusal) => {
                tracing::debug!(session_id = %self.session_id, %refusal, "tool catalog not taken");
                None
            }
        }
    }

    /// Starts `effect`, decided at `decided`; `pending` events decided
    /// before it are not durable yet.
    fn start_effect(&mut self, effect: Effect, decided: Decided, pending: u64) {
        let span = decided.span.clone();
        let _in_turn = span.enter();
        let started = self.tasks_started;
        let quick = overlaps(&effect);
        match effect {
            Effect::Record { .. } => {}
            Effect::CallModel { request } => {
                // Its streamed text follows the last event decided before it.
                let after_seq = self.next_seq - 1 + pending;
                self.start_model_call(request, &decided.turn_id, after_seq)
            }
            Effect::Summarise { job, messages } => self.start_summary(job, messages),
            Effect::RunTool {
                call,
                read_only,
                network,
                resume,
            } => self.start_tool_call(call, decided, read_only, network, resume),
            Effect::StopAsking { call, resume_json } => self.stop_asking(call, resume_json),
            Effect::RunHooks(job) => self.start_hooks(*job),
            Effect::AbortInFlight => self.abort_in_flight(),
            Effect::WakeAt { at_ms } => self.wake_at(at_ms),
            Effect::EndTask {
                turn_id,
                call_id,
                step,
                cancel,
            } => {
                let task = self.tasks.remove(&call_id).unwrap_or_else(|| {
                    crate::agents::child_id(&self.session_id, &turn_id, step, &call_id)
                });
                if cancel {
                    crate::agents::cancel_task(self.sessions.clone(), task);
                }
            }
        }
        // The task the quick work runs as (it was given the next id).
        if quick && self.tasks_started > started {
            self.quick.insert(self.tasks_started);
        }
    }

    /// Tells the `[[notify]]` webhooks about what was just stored.
    fn notify(&self, first_seq: u64, events: &[pb::Event], scheduled: bool) {
        if self.deps.notify_events.is_empty() {
            return;
        }
        let notes = crate::notifications::of(&self.session_id, first_seq, events, scheduled);
        crate::notifications::send(&self.deps, notes);
    }

    /// Hands the reducer [`Input::Unpark`] at `at_ms` (a parked turn goes
    /// on); cancelled with the turn's other work.
    fn wake_at(&mut self, at_ms: i64) {
        let (task, tx) = self.next_task();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let wait = Duration::from_millis(at_ms.saturating_sub(now_ms).max(0) as u64);
        tracing::info!(session_id = %self.session_id, wait_ms = wait.as_millis() as u64, "turn parked");
        let handle = tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = tx.send(Box::new((task, Input::Unpark))).await;
        });
        self.in_flight.insert(task, handle.abort_handle());
    }

    fn next_task(&mut self) -> (u64, mpsc::Sender<Outcome>) {
        self.tasks_started += 1;
        (self.tasks_started, self.outcomes_tx.clone())
    }

    fn start_model_call(&mut self, request: ModelRequest, turn_id: &str, after_seq: u64) {
        let (task, tx) = self.next_task();
        let deps = self.deps.clone();
        let live = model_call::LiveText {
            session_id: self.session_id.clone(),
            turn_id: turn_id.to_string(),
            after_seq,
            // An agent's own model, else the one the person switched to.
            model: self
                .child
                .as_ref()
                .and_then(|c| c.agent.def.model.clone())
                .or_else(|| self.state.model.clone()),
        };
        let span = tracing::info_span!(
            "model_call",
            model = %deps.llm().model(),
            messages = request.history.len(),
            prompt_tokens = tracing::field::Empty,
            completion_tokens = tracing::field::Empty,
            latency_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let handle = tokio::spawn(
            async move {
                let gauge = InFlightGauge::new(&deps.metrics, "model");
                model_call::model_call(deps.clone(), request, live, task, tx).await;
                drop(gauge);
            }
            .instrument(span),
        );
        self.in_flight.insert(task, handle.abort_handle());
    }

    fn start_summary(&mut self, job: CompactionJob, messages: Vec<Message>) {
        let (task, tx) = self.next_task();
        let deps = self.deps.clone();
        let view = self.state.view.0.clone();
        let span = tracing::info_span!(
            "compaction",
            first_seq = job.first_seq,
            last_seq = job.last_seq,
            messages = job.messages,
        );
        let handle = tokio::spawn(
            async move {
                let gauge = InFlightGauge::new(&deps.metrics, "model");
                model_call::summary_call(&deps, &view, job, messages, task, tx).await;
                drop(gauge);
            }
            .instrument(span),
        );
        self.in_flight.insert(task, handle.abort_handle());
    }

    /// Runs a job's hooks one after the other on a tool runner, then hands
    /// their outcomes back.
    fn start_hooks(&mut self, job: crate::hooks::HookJob) {
        let (task, tx) = self.next_task();
        let span = tracing::info_span!(
            "hooks",
            event = job.event.name(),
            call_id = %job.call_id,
            hooks = job.hooks.len(),
        );
        // Hooks run where the session's tools act.
        let place = hook_run::Place {
            session_id: self.session_id.clone(),
            workspace: self.workspace(),
        };
        let deps = self.deps.clone();
        let run = hook_run::run_hooks(deps, place, job, task, tx);
        let handle = tokio::spawn(run.instrument(span));
        self.in_flight.insert(task, handle.abort_handle());
    }

    /// The session whose workspace this one's tools act on.
    fn workspace(&self) -> String {
        self.child
            .as_ref()
            .map_or_else(|| self.session_id.clone(), |c| c.workspace.clone())
    }

    /// Tells the MCP server of a call that waited for answers to stop; its
    /// answer is not waited for.
    fn stop_asking(&self, call: ToolCall, resume_json: String) {
        let request = agentry_proto::tools::v1::ExecuteRequest {
            call_id: call.id.clone(),
            session_id: self.workspace(),
            tool: call.name.clone(),
            arguments_json: call.arguments.clone(),
            timeout_ms: 30_000,
            network: false,
            resume: Some(pb::McpResume {
                resume_json,
                answers_json: String::new(),
                cancel: true,
            }),
        };
        let runners = self.deps.runners.clone();
        tokio::spawn(async move {
            if let Err(failure) = runners.execute(request, true, |_| async { true }).await {
                tracing::info!(call_id = %call.id, error = %failure.message, "could not tell an MCP server to stop a call that waited for answers");
            }
        });
    }

    fn start_tool_call(
        &mut self,
        call: ToolCall,
        decided: Decided,
        read_only: bool,
        network: bool,
        resume: Option<pb::McpResume>,
    ) {
        let (task, tx) = self.next_task();
        let deps = self.deps.clone();
        let sessions = self.sessions.clone();
        let session_id = self.session_id.clone();
        let Decided {
            turn_id,
            step,
            approval_mode,
            ..
        } = decided;
        if call.name == crate::agents::DELEGATE {
            let task = crate::agents::child_id(&self.session_id, &turn_id, step, &call.id);
            self.tasks.insert(call.id.clone(), task);
        }
        let place = tool_call::Place {
            workspace: self.workspace(),
            step,
            turn_id,
            approval_mode,
        };
        let span = tracing::info_span!(
            "tool_call",
            tool = %call.name,
            call_id = %call.id,
            runner_id = tracing::field::Empty,
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let handle = tokio::spawn(
            async move {
                let gauge = InFlightGauge::new(&deps.metrics, "tool");
                let result = tool_call::tool_call(
                    &sessions,
                    &session_id,
                    &place,
                    call,
                    read_only,
                    network,
                    resume,
                    task,
                    &tx,
                )
                .await;
                let result = match result {
                    tool_call::Ended::Done(result) => result,
                    tool_call::Ended::Asks(asked) => {
                        drop(gauge);
                        let _ = tx
                            .send(Box::new((task, Input::ToolNeedsInput(asked))))
                            .await;
                        return;
                    }
                };
                drop(gauge);
                let span = Span::current();
                span.record("runner_id", result.runner_id.as_str());
                span.record("outcome", if result.is_error { "error" } else { "ok" });
                span.record("duration_ms", result.duration_ms);
                crate::metrics::tool_call_finished(&deps.metrics, &result);
                let _ = tx.send(Box::new((task, Input::ToolDone(result)))).await;
            }
            .instrument(span),
        );
        self.in_flight.insert(task, handle.abort_handle());
    }
}

/// Appends durably, retrying while the store is unreachable for up to
/// `retry_window`; hands the request back with the outcome.
async fn append(
    deps: Arc<Deps>,
    retry_window: Duration,
    request: pb::AppendRequest,
) -> (pb::AppendRequest, Result<(), Broken>) {
    let mut delay = Duration::from_millis(50);
    let deadline = Instant::now() + retry_window;
    let mut retried = false;
    loop {
        let mut store = deps.store.clone();
        let status = match store.append(request.clone()).await {
            Ok(_) => return (request, Ok(())),
            Err(status) => status,
        };
        let session_id = &request.session_id;
        if status.code() == tonic::Code::Unavailable && Instant::now() < deadline {
            tracing::warn!(%session_id, error = %status.message(), "session store unavailable; retrying append");
            retried = true;
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
            continue;
        }
        // An earlier attempt may have been stored, its answer lost: if the
        // log holds exactly these events there, it was.
        if retried
            && status.code() == tonic::Code::FailedPrecondition
            && stored_already(&deps, &request).await
        {
            tracing::info!(%session_id, first_seq = request.expected_seq, "an append whose answer was lost had been stored");
            return (request, Ok(()));
        }
        let broken = Broken(agentry_runtime::reasons::restated(
            &status,
            format!(
                "cannot record events in the session store at {}: {}",
                deps.store_url,
                status.message()
            ),
        ));
        return (request, Err(broken));
    }
}

/// Whether the log already holds `request`'s events at its seqs.
async fn stored_already(deps: &Deps, request: &pb::AppendRequest) -> bool {
    let read = deps
        .store
        .clone()
        .read(pb::ReadRequest {
            session_id: request.session_id.clone(),
            from_seq: request.expected_seq,
            limit: request.events.len() as u32,
            ..Default::default()
        })
        .await;
    let Ok(page) = read.map(tonic::Response::into_inner) else {
        return false;
    };
    page.events.len() == request.events.len()
        && page
            .events
            .iter()
            .zip(&request.events)
            .all(|(stored, sent)| {
                stored.kind == sent.kind
                    && stored.turn_id == sent.turn_id
                    && stored.time == sent.time
            })
}

/// Counts a model or tool call in flight (the orchestrator's queue depth)
/// while it lives, even when the call is aborted.
struct InFlightGauge<'a> {
    metrics: &'a agentry_runtime::metrics::Registry,
    kind: &'static str,
}

impl<'a> InFlightGauge<'a> {
    fn new(metrics: &'a agentry_runtime::metrics::Registry, kind: &'static str) -> Self {
        metrics.shift(
            CALLS_IN_FLIGHT,
            CALLS_IN_FLIGHT_HELP,
            &[("kind", kind)],
            1.0,
        );
        InFlightGauge { metrics, kind }
    }
}

impl Drop for InFlightGauge<'_> {
    fn drop(&mut self) {
        self.metrics.shift(
            CALLS_IN_FLIGHT,
            CALLS_IN_FLIGHT_HELP,
            &[("kind", self.kind)],
            -1.0,
        );
    }
}
