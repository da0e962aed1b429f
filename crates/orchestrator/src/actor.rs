//! The effect runner: one actor per session performs the reducer's effects
//! (append to the store, call the model, run tools) and feeds their outcomes
//! back as inputs.

use crate::deps::Deps;
use crate::metrics::{CALLS_IN_FLIGHT, CALLS_IN_FLIGHT_HELP};
use crate::reducer::{Effect, Input, SessionState};
use agentry_llm::{ChatRequest, Message, StreamEvent, ToolCall};
use agentry_proto::sessions::v1::{self as pb, ApprovalDecision, ApprovalMode};
use agentry_proto::tools::v1::{ExecuteRequest, OutputChunk};
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tonic::Status;
use tracing::{Instrument, Span};

/// Inputs a client may submit.
#[derive(Debug, Clone)]
pub enum SubmitInput {
    /// A message from the person.
    User {
        /// The text.
        text: String,
        /// How the turn's tool calls are approved.
        approval_mode: ApprovalMode,
        /// Run the turn in plan mode.
        plan: bool,
        /// Give the turn's bash calls outbound network.
        network: bool,
    },
    /// A decision on a call awaiting approval.
    Approval {
        /// The call.
        call_id: String,
        /// The decision.
        decision: ApprovalDecision,
        /// Why.
        reason: String,
        /// Replacement arguments, for an edit.
        edited_arguments_json: String,
    },
    /// Stop the running turn.
    Cancel {
        /// Why.
        reason: String,
    },
    /// A reminder fell due for this session.
    Reminder(pb::ReminderDue),
}

/// What a successful submit reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The turn the input started or belongs to.
    pub turn_id: String,
    /// The seq of the event recording the input.
    pub seq: u64,
}

/// A request to a session actor.
pub(crate) struct Command {
    pub input: SubmitInput,
    pub reply: oneshot::Sender<Result<Submitted, Status>>,
}

/// A handle to a running session actor.
#[derive(Clone)]
pub(crate) struct SessionHandle {
    pub commands: mpsc::Sender<Command>,
}

/// Outcomes of in-flight work, tagged with the task that produced them.
type Outcome = (u64, Input);

pub(crate) struct Actor {
    session_id: String,
    state: SessionState,
    next_seq: u64,
    deps: Arc<Deps>,
    outcomes_tx: mpsc::Sender<Outcome>,
    outcomes: mpsc::Receiver<Outcome>,
    /// Model and tool calls running now, by task id.
    in_flight: HashMap<u64, AbortHandle>,
    tasks_started: u64,
    /// The span of the turn running now: the root of the turn's trace.
    turn_span: Option<(String, Span)>,
}

/// The store could not record an event: the actor stops, and the session is
/// reloaded from its log on next use.
#[derive(Debug)]
struct Broken(Status);

fn now() -> prost_types::Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// How many ready outcomes are folded into one store append at most.
const MAX_BATCH: usize = 512;

impl Actor {
    /// Starts the actor of a session whose log holds `event_count` events.
    pub(crate) fn spawn(
        session_id: String,
        state: SessionState,
        event_count: u64,
        deps: Arc<Deps>,
    ) -> SessionHandle {
        let (commands_tx, commands) = mpsc::channel(64);
        let (outcomes_tx, outcomes) = mpsc::channel(1024);
        let actor = Actor {
            session_id,
            state,
            next_seq: event_count + 1,
            deps,
            outcomes_tx,
            outcomes,
            in_flight: HashMap::new(),
            tasks_started: 0,
            turn_span: None,
        };
        tokio::spawn(actor.run(commands));
        SessionHandle {
            commands: commands_tx,
        }
    }

    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        // A turn left unfinished by an earlier process is closed first.
        if !self.state.is_idle() {
            tracing::warn!(session_id = %self.session_id, "closing a turn interrupted by a restart");
            let effects = self.state.step(Input::Interrupted).unwrap_or_default();
            if let Err(Broken(status)) = self.run_effects_traced(effects).await {
                tracing::error!(session_id = %self.session_id, error = %status.message(), "cannot close the interrupted turn");
                self.abort_in_flight();
                return;
            }
        }
        loop {
            let result = tokio::select! {
                command = commands.recv() => match command {
                    Some(command) => self.handle_command(command).await,
                    None => break,
                },
                Some(outcome) = self.outcomes.recv() => self.handle_outcome(outcome).await,
            };
            if let Err(Broken(status)) = result {
                tracing::error!(session_id = %self.session_id, error = %status.message(), "session actor stopped: the session store refused an append");
                self.abort_in_flight();
                return;
            }
        }
        self.abort_in_flight();
    }

    async fn handle_command(&mut self, command: Command) -> Result<(), Broken> {
        // A cancel ends the turn it belongs to: remember which.
        let turn_before = self.state.turn_id().map(str::to_string);
        let input = match command.input {
            SubmitInput::User {
                text,
                approval_mode,
                plan,
                network,
            } => Input::UserMessage {
                turn_id: uuid::Uuid::now_v7().to_string(),
                text,
                approval_mode,
                plan,
                network,
            },
            SubmitInput::Approval {
                call_id,
                decision,
                reason,
                edited_arguments_json,
            } => Input::Approval {
                call_id,
                decision,
                reason,
                edited_arguments_json,
            },
            SubmitInput::Cancel { reason } => Input::Cancel { reason },
            SubmitInput::Reminder(reminder) => Input::ReminderDue {
                turn_id: uuid::Uuid::now_v7().to_string(),
                reminder,
            },
        };
        // Only a message that selects a skillset records a choice.
        let chosen = match &input {
            Input::UserMessage { text, .. } => self
                .deps
                .skillsets
                .choose(text)
                .filter(|(_, skillset)| !skillset.is_empty()),
            _ => None,
        };
        let effects = match self.state.step(input) {
            // The skillset chosen for the message is recorded with it, before
            // the model is called.
            Ok(effects) => match chosen {
                Some((intent, skillset)) => {
                    let choice = Input::SkillsetChosen {
                        intent: intent.name,
                        skillset,
                        keywords: intent.keywords,
                    };
                    let more = self.state.step(choice).unwrap_or_default();
                    let (mut records, rest): (Vec<Effect>, Vec<Effect>) = effects
                        .into_iter()
                        .partition(|e| matches!(e, Effect::Record { .. }));
                    records.extend(more);
                    records.extend(rest);
                    records
                }
                None => effects,
            },
            Err(refusal) => {
                let status = if refusal.is_invalid_argument() {
                    Status::invalid_argument(refusal.to_string())
                } else {
                    Status::failed_precondition(refusal.to_string())
                };
                let _ = command.reply.send(Err(status));
                return Ok(());
            }
        };
        let turn_id = self.state.turn_id().map(str::to_string).or(turn_before);
        match self.run_effects_traced(effects).await {
            Ok(first_seq) => {
                let turn_id = turn_id.unwrap_or_default();
                let _ = command.reply.send(Ok(Submitted {
                    turn_id,
                    seq: first_seq.unwrap_or(self.next_seq - 1),
                }));
                Ok(())
            }
            Err(Broken(status)) => {
                let _ = command.reply.send(Err(status.clone()));
                Err(Broken(status))
            }
        }
    }

    async fn handle_outcome(&mut self, (task, input): Outcome) -> Result<(), Broken> {
        let mut effects = Vec::new();
        self.fold_outcome(task, input, &mut effects);
        // Fold whatever else is ready into the same append (streamed text
        // arrives much faster than one durable write per delta).
        let mut folded = 1;
        while folded < MAX_BATCH {
            let Ok((task, input)) = self.outcomes.try_recv() else {
                break;
            };
            self.fold_outcome(task, input, &mut effects);
            folded += 1;
        }
        self.run_effects_traced(effects).await.map(|_| ())
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
    async fn run_effects_traced(&mut self, effects: Vec<Effect>) -> Result<Option<u64>, Broken> {
        let span = self.turn_span();
        let result = self.run_effects(effects).instrument(span).await;
        if self.state.turn_id().is_none() {
            self.turn_span = None;
        }
        result
    }

    fn fold_outcome(&mut self, task: u64, input: Input, effects: &mut Vec<Effect>) {
        if !self.in_flight.contains_key(&task) {
            return; // Output of work that was cancelled.
        }
        let finishes_task = matches!(
            input,
            Input::ModelDone(_) | Input::ModelFailed { .. } | Input::ToolDone(_)
        );
        let compaction = matches!(input, Input::Compacted(_));
        match self.state.step(input) {
            Ok(more) => effects.extend(more),
            Err(refusal) if compaction => {
                tracing::warn!(session_id = %self.session_id, %refusal, "a compaction did not fit the conversation and was not recorded");
            }
            Err(refusal) => {
                tracing::debug!(session_id = %self.session_id, %refusal, "dropped an outcome");
            }
        }
        if finishes_task {
            self.in_flight.remove(&task);
        }
    }

    fn abort_in_flight(&mut self) {
        for (_, handle) in self.in_flight.drain() {
            handle.abort();
        }
    }

    /// Runs effects in order; consecutive records become one append.
    /// Returns the seq of the first recorded event.
    async fn run_effects(&mut self, effects: Vec<Effect>) -> Result<Option<u64>, Broken> {
        let mut first_seq = None;
        let mut batch: Vec<pb::Event> = Vec::new();
        for effect in effects {
            if let Effect::Record { turn_id, events } = effect {
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
                    if let pb::event::Kind::TurnFinished(finished) = kind {
                        let outcome = pb::TurnOutcome::try_from(finished.outcome)
                            .map(|o| o.as_str_name())
                            .unwrap_or("TURN_OUTCOME_UNSPECIFIED");
                        Span::current().record("outcome", outcome);
                        crate::metrics::turn_finished(&self.deps.metrics, outcome);
                    }
                }
                batch.extend(events.into_iter().map(|kind| pb::Event {
                    turn_id: turn_id.clone(),
                    time: Some(time),
                    kind: Some(kind),
                    ..Default::default()
                }));
                continue;
            }
            // Work without side effects (a model call, a read-only tool)
            // starts now and overlaps the append of the events before it:
            // its outcome is only handled after that append, and if the
            // process dies in between, recovery asks the model again and
            // re-runs read-only calls. Anything else waits until the events
            // before it are durable.
            let overlaps = match &effect {
                Effect::CallModel { .. } => true,
                Effect::RunTool { read_only, .. } => *read_only,
                Effect::Record { .. } | Effect::AbortInFlight => false,
            };
            let mut waiting = Some(effect);
            if overlaps && let Some(effect) = waiting.take() {
                self.start_effect(effect);
            }
            if !batch.is_empty() {
                let seq = self.append(std::mem::take(&mut batch)).await?;
                first_seq.get_or_insert(seq);
            }
            if let Some(effect) = waiting {
                self.start_effect(effect);
            }
        }
        if !batch.is_empty() {
            let seq = self.append(batch).await?;
            first_seq.get_or_insert(seq);
        }
        Ok(first_seq)
    }

    fn start_effect(&mut self, effect: Effect) {
        match effect {
            Effect::Record { .. } => {}
            Effect::CallModel { history } => self.start_model_call(history),
            Effect::RunTool {
                call,
                read_only,
                network,
            } => self.start_tool_call(call, read_only, network),
            Effect::AbortInFlight => self.abort_in_flight(),
        }
    }

    /// Appends durably, retrying while the store is unreachable for a while.
    async fn append(&mut self, events: Vec<pb::Event>) -> Result<u64, Broken> {
        let first = self.next_seq;
        let count = events.len() as u64;
        let request = pb::AppendRequest {
            session_id: self.session_id.clone(),
            expected_seq: first,
            events,
        };
        let mut delay = Duration::from_millis(50);
        let deadline = Instant::now() + self.deps.store_retry_window;
        let span = tracing::info_span!("store.append", events = count, first_seq = first);
        loop {
            let mut store = self.deps.store.clone();
            let attempt = store.append(request.clone());
            match attempt.instrument(span.clone()).await {
                Ok(_) => {
                    self.next_seq += count;
                    return Ok(first);
                }
                Err(status)
                    if status.code() == tonic::Code::Unavailable && Instant::now() < deadline =>
                {
                    tracing::warn!(session_id = %self.session_id, error = %status.message(), "session store unavailable; retrying append");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                Err(status) => {
                    return Err(Broken(Status::new(
                        status.code(),
                        format!(
                            "cannot record events in the session store at {}: {}",
                            self.deps.store_url,
                            status.message()
                        ),
                    )));
                }
            }
        }
    }

    fn next_task(&mut self) -> (u64, mpsc::Sender<Outcome>) {
        self.tasks_started += 1;
        (self.tasks_started, self.outcomes_tx.clone())
    }

    fn start_model_call(&mut self, history: Vec<Message>) {
        // Instructions for this call only: the turn's skillset, then what
        // plan mode asks for now.
        let mut extra: Vec<String> = self
            .state
            .turn_skillset()
            .and_then(|name| self.deps.skillsets.text(name))
            .map(str::to_string)
            .into_iter()
            .collect();
        // The plan tools, except for the final answer.
        let plan_mode = self.state.turn_plan().is_some_and(|p| !p.is_finishing());
        extra.extend(self.state.plan_guidance());
        let call = ModelCall {
            history,
            spans: self.state.history_spans.clone(),
            extra,
            plan_mode,
        };
        let (task, tx) = self.next_task();
        let deps = self.deps.clone();
        let span = tracing::info_span!(
            "model_call",
            model = %deps.llm.model(),
            messages = call.history.len(),
            prompt_tokens = tracing::field::Empty,
            completion_tokens = tracing::field::Empty,
            latency_ms = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let handle = tokio::spawn(
            async move {
                let gauge = InFlightGauge::new(&deps.metrics, "model");
                model_call(deps.clone(), call, task, tx).await;
                drop(gauge);
            }
            .instrument(span),
        );
        self.in_flight.insert(task, handle.abort_handle());
    }

    fn start_tool_call(&mut self, call: ToolCall, read_only: bool, network: bool) {
        let (task, tx) = self.next_task();
        let deps = self.deps.clone();
        let session_id = self.session_id.clone();
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
                let result =
                    tool_call(&deps, &session_id, call, read_only, network, task, &tx).await;
                drop(gauge);
                let span = Span::current();
                span.record("runner_id", result.runner_id.as_str());
                span.record("outcome", if result.is_error { "error" } else { "ok" });
                span.record("duration_ms", result.duration_ms);
                crate::metrics::tool_call_finished(&deps.metrics, &result);
                let _ = tx.send((task, Input::ToolDone(result))).await;
            }
            .instrument(span),
        );
        self.in_flight.insert(task, handle.abort_handle());
    }
}

/// What one model call needs besides the shared dependencies.
struct ModelCall {
    /// The conversation.
    history: Vec<Message>,
    /// The seqs each message of `history` stands for (the conversation is
    /// not compacted when they do not match it).
    spans: Vec<(u64, u64)>,
    /// System messages for this call only (skillset, plan-mode guidance).
    extra: Vec<String>,
    /// Offer the plan tools.
    plan_mode: bool,
}

async fn model_call(deps: Arc<Deps>, call: ModelCall, task: u64, tx: mpsc::Sender<Outcome>) {
    let tools = deps.tools().await;
    if tx
        .send((task, Input::ToolCatalog(tools.flags.clone())))
        .await
        .is_err()
    {
        return;
    }
    let mut definitions = tools.definitions.clone();
    let plan_tools = if call.plan_mode {
        crate::plan::definitions()
    } else {
        Vec::new()
    };
    definitions.extend(plan_tools.iter().cloned());
    let native = deps.profile.native_tools;
    let mut system = deps.system_prompt.clone();
    if !native {
        system.push_str("\n\n");
        system.push_str(&crate::textcalls::instructions(&definitions));
    }
    let mut messages = vec![Message::System { content: system }];
    // Instructions for this call only, each a system message of its own.
    messages.extend(
        call.extra
            .into_iter()
            .map(|content| Message::System { content }),
    );
    // Keep the request within the context window.
    let tool_tokens = if native {
        tools.tokens(&deps.tokenizer) + deps.tokenizer.definitions(&plan_tools)
    } else {
        0
    };
    let fitted =
        crate::compaction::fit(&deps, &messages, tool_tokens, call.history, &call.spans).await;
    let overhead = fitted.overhead;
    let window = deps.compaction.context_window;
    if deps.compaction.enabled && fitted.tokens > window {
        let message = format!(
            "the request would take about {} tokens, more than the model's context window of \
             {window} (the system prompt, instructions and tool definitions alone take about \
             {overhead}); raise model_profiles.context_window if the model reads more",
            fitted.tokens
        );
        let _ = tx
            .send((
                task,
                Input::ModelFailed {
                    message: format!("model call not sent: {message}"),
                    retryable: false,
                },
            ))
            .await;
        return;
    }
    if fitted.truncated > 0 {
        tracing::warn!(
            messages = fitted.truncated,
            "messages shortened in this request to fit the context window"
        );
    }
    if let Some(event) = fitted.event
        && tx.send((task, Input::Compacted(event))).await.is_err()
    {
        return;
    }
    if native {
        messages.extend(fitted.history);
    } else {
        messages.extend(fitted.history.into_iter().map(as_text));
    }
    let names: std::collections::BTreeSet<String> =
        definitions.iter().map(|t| t.name.clone()).collect();
    let mut request = ChatRequest {
        messages,
        tools: if native { definitions } else { Vec::new() },
        temperature: deps.temperature,
    };
    let started = Instant::now();
    let failed = |message: String, retryable: bool| {
        let span = Span::current();
        span.record("outcome", "error");
        span.record("latency_ms", started.elapsed().as_millis() as u64);
        crate::metrics::model_call_finished(&deps.metrics, "error", started.elapsed(), None);
        (
            task,
            Input::ModelFailed {
                message: format!("model call failed: {message}"),
                retryable,
            },
        )
    };
    // A tool call written as text that cannot be read gets one correction.
    let mut corrected = false;
    loop {
        let completion = match stream_once(&deps, request.clone(), task, &tx).await {
            Ok(Some(completion)) => completion,
            Ok(None) => return, // Nobody listens any more.
            Err((message, retryable)) => {
                let _ = tx.send(failed(message, retryable)).await;
                return;
            }
        };
        let completion = if completion.tool_calls.is_empty() {
            match read_text_calls(completion, &names, native) {
                Ok(completion) => completion,
                Err((text, error)) if !corrected => {
                    tracing::info!(%error, "asking the model to rewrite a malformed tool call");
                    corrected = true;
                    request.messages.push(Message::Assistant {
                        content: text,
                        tool_calls: Vec::new(),
                    });
                    request.messages.push(Message::User {
                        content: crate::textcalls::correction(&error),
                    });
                    continue;
                }
                Err((_, error)) => {
                    let message = format!(
                        "the model wrote a tool call that could not be read, even after being shown the format: {error}"
                    );
                    let _ = tx.send(failed(message, false)).await;
                    return;
                }
            }
        } else {
            completion
        };
        let elapsed = started.elapsed();
        let span = Span::current();
        span.record("outcome", "ok");
        span.record("latency_ms", elapsed.as_millis() as u64);
        if let Some(usage) = completion.usage {
            span.record("prompt_tokens", usage.prompt_tokens);
            span.record("completion_tokens", usage.completion_tokens);
        }
        crate::metrics::model_call_finished(&deps.metrics, "ok", elapsed, completion.usage);
        tracing::debug!(
            elapsed_ms = elapsed.as_millis() as u64,
            "model call finished"
        );
        let _ = tx.send((task, Input::ModelDone(completion))).await;
        return;
    }
}

/// One streamed request: deltas go to the actor as they come; the complete
/// answer is returned (`None` when the actor is gone).
async fn stream_once(
    deps: &Deps,
    request: ChatRequest,
    task: u64,
    tx: &mpsc::Sender<Outcome>,
) -> Result<Option<agentry_llm::Completion>, (String, bool)> {
    let mut stream = deps
        .llm
        .stream(request)
        .await
        .map_err(|e| (e.to_string(), e.is_retryable()))?;
    while let Some(item) = stream.next().await {
        match item {
            Ok(StreamEvent::TextDelta(text)) => {
                if tx.send((task, Input::ModelDelta(text))).await.is_err() {
                    return Ok(None);
                }
            }
            Ok(StreamEvent::Completed(completion)) => return Ok(Some(completion)),
            Err(e) => return Err((e.to_string(), e.is_retryable())),
        }
    }
    Err((
        "the model stream ended without a complete response".into(),
        true,
    ))
}

/// Tool calls written in the text become real calls. A text that tries to
/// call a tool but cannot be read is returned with the reason; plain text
/// passes through. Without native tool calling, fenced JSON blocks count too.
fn read_text_calls(
    mut completion: agentry_llm::Completion,
    names: &std::collections::BTreeSet<String>,
    native: bool,
) -> Result<agentry_llm::Completion, (String, String)> {
    let tries = crate::textcalls::looks_like_a_call(&completion.text)
        || (!native && completion.text.contains("```"));
    if !tries {
        return Ok(completion);
    }
    match crate::textcalls::parse(&completion.text, names) {
        Ok(parsed) if parsed.calls.is_empty() => Ok(completion),
        Ok(parsed) => {
            completion.tool_calls = parsed
                .calls
                .into_iter()
                .map(|c| ToolCall {
                    id: format!("text-{}", uuid::Uuid::now_v7().simple()),
                    name: c.name,
                    arguments: c.arguments,
                })
                .collect();
            completion.text = parsed.prose;
            completion.finish_reason = "tool_calls".into();
            Ok(completion)
        }
        Err(error) => Err((completion.text, error)),
    }
}

/// A message for a model without native tool calling: its calls written
/// the way it was told to write them, results as plain messages.
fn as_text(message: Message) -> Message {
    match message {
        Message::Assistant {
            content,
            tool_calls,
        } if !tool_calls.is_empty() => {
            let mut text = content;
            for call in tool_calls {
                if !text.is_empty() {
                    text.push('\n');
                }
                let arguments = if call.arguments.trim().is_empty() {
                    "{}".to_string()
                } else {
                    call.arguments
                };
                text.push_str(&format!("TOOL:{} {arguments}", call.name));
            }
            Message::Assistant {
                content: text,
                tool_calls: Vec::new(),
            }
        }
        Message::Tool {
            tool_call_id,
            content,
        } => Message::User {
            content: format!("Result of tool call {tool_call_id}:\n{content}"),
        },
        other => other,
    }
}

fn tool_error(call: &ToolCall, output: String, started: Instant) -> pb::ToolResult {
    pb::ToolResult {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        output,
        is_error: true,
        exit_code: None,
        duration_ms: started.elapsed().as_millis() as u64,
        runner_id: String::new(),
    }
}

async fn tool_call(
    deps: &Deps,
    session_id: &str,
    call: ToolCall,
    read_only: bool,
    network: bool,
    task: u64,
    tx: &mpsc::Sender<Outcome>,
) -> pb::ToolResult {
    let started = Instant::now();
    let request = ExecuteRequest {
        call_id: call.id.clone(),
        session_id: session_id.to_string(),
        tool: call.name.clone(),
        arguments_json: call.arguments.clone(),
        timeout_ms: 0,
        network,
    };
    if crate::builtin::is_builtin(&call.name) {
        return crate::builtin::run(deps, session_id, &call).await;
    }
    let call_id = call.id.clone();
    let outcome = deps
        .runners
        .execute(request, read_only, |chunk: OutputChunk| {
            let stream =
                pb::OutputStream::try_from(chunk.stream).unwrap_or(pb::OutputStream::Unspecified);
            let input = Input::ToolChunk {
                call_id: call_id.clone(),
                stream,
                text: chunk.text,
            };
            let tx = tx.clone();
            async move { tx.send((task, input)).await.is_ok() }
        })
        .await;
    match outcome {
        Ok(result) => pb::ToolResult {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            output: result.output,
            is_error: result.is_error,
            exit_code: result.exit_code,
            duration_ms: result.duration_ms,
            runner_id: result.runner_id,
        },
        Err(failure) => {
            let mut result = tool_error(&call, failure.message, started);
            result.runner_id = failure.runner;
            result
        }
    }
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
