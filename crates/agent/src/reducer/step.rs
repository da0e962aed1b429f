//! Deciding: `step` takes an input, records events and returns effects;
//! the model's answers, and the governor of a turn's steps and context.

use super::*;

impl SessionState {
    /// Records `kind` (applying it at once).
    pub(super) fn emit(&mut self, out: &mut Out, turn_id: &str, kind: Kind) {
        if let Kind::ToolResult(r) = &kind
            && r.tool == super::DELEGATE_TOOL
        {
            out.after.push(Effect::EndTask {
                turn_id: turn_id.to_string(),
                call_id: r.call_id.clone(),
                step: self.turn.as_ref().map(|t| t.steps).unwrap_or_default(),
                cancel: r.is_error,
            });
        }
        self.apply(turn_id, &kind);
        self.notify_hooks(out, turn_id, &kind);
        out.events.push(kind);
    }

    /// The notification hooks an event calls for (run once it is stored).
    fn notify_hooks(&self, out: &mut Out, turn_id: &str, kind: &Kind) {
        let hooks = &self.view.0.hooks;
        let mut jobs = Vec::new();
        match kind {
            Kind::UserMessage(m) if !m.compact => {
                // The session's first event starts it.
                if self.last_seq == 1 {
                    jobs.push((
                        HookEvent::SessionStart,
                        serde_json::json!({"event": "session_start", "turn_id": turn_id}),
                    ));
                }
                jobs.push((
                    HookEvent::UserMessage,
                    serde_json::json!({
                        "event": "user_message", "turn_id": turn_id, "text": m.text,
                    }),
                ));
            }
            Kind::TurnFinished(f) => jobs.push((
                HookEvent::TurnFinished,
                serde_json::json!({
                    "event": "turn_finished",
                    "turn_id": turn_id,
                    "outcome": match TurnOutcome::try_from(f.outcome) {
                        Ok(TurnOutcome::Completed) => "completed",
                        Ok(TurnOutcome::Failed) => "failed",
                        Ok(TurnOutcome::Cancelled) => "cancelled",
                        Ok(TurnOutcome::StepLimit) => "step_limit",
                        Ok(TurnOutcome::Budget) => "budget",
                        Ok(TurnOutcome::Unspecified) | Err(_) => "unspecified",
                    },
                    "message": f.message,
                }),
            )),
            _ => {}
        }
        for (event, input) in jobs {
            let matching = hooks.matching(event, "");
            if !matching.is_empty() {
                out.after.push(Effect::RunHooks(Box::new(HookJob {
                    event,
                    call_id: String::new(),
                    tool: String::new(),
                    hooks: matching,
                    input,
                    result: None,
                })));
            }
        }
    }

    pub(super) fn finish(&self, outcome: TurnOutcome, message: String) -> Kind {
        let (steps, usage, cost) = self
            .turn
            .as_ref()
            .map(|t| (t.steps, t.usage, t.cost))
            .unwrap_or_default();
        let price = self.view.0.price.as_ref();
        let mut finished = pb::TurnFinished {
            outcome: 0,
            message,
            steps,
            usage: Some(usage),
            cost: price.map(|_| cost),
            currency: price.map(|p| p.currency().to_string()).unwrap_or_default(),
        };
        finished.set_outcome(outcome);
        Kind::TurnFinished(finished)
    }

    pub(super) fn into_effects(turn_id: &str, out: Out) -> Vec<Effect> {
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

    /// Takes one input; returns the effects to run, or why the input does
    /// not fit. A refused input leaves the state unchanged.
    pub fn step(&mut self, input: Input) -> Result<Vec<Effect>, Refusal> {
        let phase = self.phase;
        let turn_id = self.turn_id().unwrap_or_default().to_string();
        let mut out = Out::default();
        match (phase, input) {
            // Parked, no model call runs: its output is stale.
            (
                Phase::Generate,
                Input::ModelDone(_)
                | Input::ModelUnreadable { .. }
                | Input::ModelFailed { .. }
                | Input::ModelTryLater(_),
            ) if self.parked.is_some() => {
                return Err(Refusal::Unexpected {
                    input: "model output",
                    phase,
                });
            }
            (
                Phase::Idle,
                Input::UserMessage {
                    turn_id,
                    text,
                    approval_mode,
                    plan,
                    network,
                    budget,
                    images,
                },
            ) => {
                if text.trim().is_empty() {
                    return Err(Refusal::EmptyMessage);
                }
                // Only a message that selects a skillset records a choice.
                let chosen = self
                    .view
                    .0
                    .skillsets
                    .choose(&text)
                    .filter(|(_, skillset)| !skillset.is_empty());
                let mut message = pb::UserMessage {
                    text,
                    approval_mode: 0,
                    plan,
                    network,
                    budget,
                    compact: false,
                    images,
                };
                message.set_approval_mode(approval_mode);
                self.emit(&mut out, &turn_id, Kind::UserMessage(message));
                if let Some((intent, skillset)) = chosen {
                    let choice = Kind::SkillsetChosen(pb::SkillsetChosen {
                        intent: intent.name,
                        skillset,
                        keywords: intent.keywords,
                    });
                    self.emit(&mut out, &turn_id, choice);
                }
                if !self.stop_at_a_limit(&mut out, &turn_id, &[]) {
                    self.call_model(&mut out, &turn_id, true);
                }
                return Ok(Self::into_effects(&turn_id, out));
            }
            (Phase::Idle, Input::Compact { turn_id, text }) => {
                let message = pb::UserMessage {
                    text,
                    compact: true,
                    ..Default::default()
                };
                self.emit(&mut out, &turn_id, Kind::UserMessage(message));
                self.compact_now(&mut out, &turn_id);
                return Ok(Self::into_effects(&turn_id, out));
            }
            // A message while the turn runs steers it: recorded now, given
            // to the model at its next call (text only; a plan, a budget or
            // images need a turn of their own).
            (
                Phase::Generate | Phase::UseTools,
                Input::UserMessage {
                    text,
                    plan: false,
                    budget: None,
                    images,
                    ..
                },
            ) if images.is_empty() => {
                if text.trim().is_empty() {
                    return Err(Refusal::EmptyMessage);
                }
                if self.steering.len() >= MAX_STEERING {
                    return Err(Refusal::Busy);
                }
                self.emit(
                    &mut out,
                    &turn_id,
                    Kind::SteeringQueued(pb::SteeringQueued { text }),
                );
            }
            (
                Phase::Generate | Phase::UseTools,
                Input::UserMessage { .. } | Input::Compact { .. },
            ) => {
                return Err(Refusal::Busy);
            }
            (_, Input::ToolCatalog(catalog)) => {
                self.offer_tools(&mut out, &turn_id, catalog)?;
            }
            (Phase::Idle, Input::SetModel(model)) => {
                let changed = pb::ModelChanged { model };
                self.emit(&mut out, "", Kind::ModelChanged(changed));
            }
            (_, Input::SetModel(_)) => return Err(Refusal::Busy),
            (_, Input::Instructions(files)) => {
                self.take_instructions(&mut out, &turn_id, files);
            }
            (Phase::Generate, Input::ModelDone(c)) => self.model_done(&mut out, &turn_id, c),
            (Phase::Generate, Input::ModelUnreadable { text, error, usage }) => {
                self.unreadable(&mut out, &turn_id, text, error, usage);
            }
            (Phase::Generate, Input::ModelTryLater(parked)) => {
                let at_ms = parked.until.as_ref().map_or(0, timestamp_ms);
                self.emit(&mut out, &turn_id, Kind::TurnParked(parked));
                out.after.push(Effect::WakeAt { at_ms });
            }
            (Phase::Generate, Input::RaiseBudget { budget })
                if self
                    .parked
                    .as_ref()
                    .is_some_and(|p| p.reason == pb::ParkReason::Budget as i32) =>
            {
                if budget == pb::Budget::default() {
                    return Err(Refusal::InvalidDecision(
                        "say which limit to raise: turn or session tokens or cost".into(),
                    ));
                }
                self.raise_parked(&mut out, &turn_id, budget);
            }
            (_, Input::RaiseBudget { .. }) => return Err(Refusal::NotParkedAtALimit),
            (Phase::Generate, Input::Unpark)
                if self.parked.as_ref().is_some_and(|p| p.until.is_some()) =>
            {
                let reason = self.parked.as_ref().map_or(0, |p| p.reason);
                self.emit(
                    &mut out,
                    &turn_id,
                    Kind::TurnResumed(pb::TurnResumed {
                        reason,
                        budget: None,
                    }),
                );
                self.call_model(&mut out, &turn_id, true);
            }
            (_, Input::Unpark) => return Ok(Vec::new()), // Resumed already.
            // Restarted while parked: the wait goes on, not counted as a
            // restart of the model call.
            (Phase::Generate, Input::Interrupted) if self.parked.is_some() => {
                // A turn parked at a limit waits for a person: nothing to arm.
                if let Some(until) = self.parked.as_ref().and_then(|p| p.until.as_ref()) {
                    out.after.push(Effect::WakeAt {
                        at_ms: timestamp_ms(until),
                    });
                }
            }
            (Phase::Generate, Input::ModelFailed { message, retryable }) => {
                let error = error_event(ErrorSource::Model, message.clone(), retryable);
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
                let mut chunk = pb::ToolOutputChunk {
                    call_id,
                    stream: 0,
                    text,
                };
                chunk.set_stream(stream);
                self.emit(&mut out, &turn_id, Kind::ToolOutputChunk(chunk));
            }
            (Phase::UseTools, Input::ToolDone(result)) => {
                if !self.is_executing(&result.call_id) {
                    return Err(Refusal::Unexpected {
                        input: "tool result",
                        phase,
                    });
                }
                let tool = call_tool(self, &result.call_id);
                let hooks = self.view.0.hooks.matching(HookEvent::AfterTool, &tool);
                if hooks.is_empty() {
                    self.answer(&mut out, &turn_id, result);
                    self.dispatch(&mut out, &turn_id);
                } else {
                    // The result waits for the hooks (nothing recorded yet:
                    // a restart meanwhile finds the call still running).
                    out.after.push(Effect::RunHooks(Box::new(HookJob {
                        event: HookEvent::AfterTool,
                        call_id: result.call_id.clone(),
                        tool: tool.clone(),
                        hooks,
                        input: serde_json::json!({
                            "event": HookEvent::AfterTool.name(),
                            "turn_id": turn_id,
                            "call_id": result.call_id,
                            "tool": tool,
                            "result": {"output": result.output, "is_error": result.is_error},
                        }),
                        result: Some(result),
                    })));
                }
            }
            (Phase::UseTools, Input::ToolNeedsInput(asked)) => {
                if !self.is_executing(&asked.call_id) {
                    return Err(Refusal::Unexpected {
                        input: "a question of a tool",
                        phase,
                    });
                }
                self.asked(&mut out, &turn_id, asked);
            }
            (
                _,
                Input::McpAnswer {
                    call_id,
                    action,
                    content_json,
                    by,
                },
            ) => {
                let by = by.unwrap_or_else(Answerer::local);
                self.answer_question(&mut out, &turn_id, &call_id, &action, &content_json, &by)?;
            }
            (
                _,
                Input::Approval {
                    call_id,
                    decision,
                    reason,
                    edited_arguments_json,
                    by,
                },
            ) => {
                let pending = self
                    .turn
                    .as_ref()
                    .and_then(|t| t.call(&call_id))
                    .is_some_and(|c| {
                        c.phase == CallPhase::AwaitingApproval
                            || (c.phase == CallPhase::Executing && c.outcome_unknown)
                    });
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
                    by.unwrap_or_else(Answerer::local),
                )?;
            }
            (Phase::Generate | Phase::UseTools, Input::Cancel { reason }) => {
                out.before.push(Effect::AbortInFlight);
                self.stop_asking(&mut out);
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
                if reminder.reminder_kind() == pb::ReminderKind::Task {
                    if phase != Phase::Idle {
                        return Err(Refusal::Busy);
                    }
                    self.emit(&mut out, &new_turn, Kind::ReminderDue(reminder));
                    self.call_model(&mut out, &new_turn, true);
                    return Ok(Self::into_effects(&new_turn, out));
                }
                self.emit(&mut out, &turn_id, Kind::ReminderDue(reminder));
            }
            (
                _,
                Input::McpResourceUpdated {
                    turn_id: new_turn,
                    update,
                },
            ) => {
                let key = (update.server.clone(), update.uri.clone());
                if self.last_mcp_updates.get(&key) == Some(&update.update_id) {
                    return Ok(Vec::new()); // Delivered again: already in the log.
                }
                if phase != Phase::Idle {
                    return Err(Refusal::Busy);
                }
                self.emit(&mut out, &new_turn, Kind::McpResourceUpdated(update));
                self.call_model(&mut out, &new_turn, true);
                return Ok(Self::into_effects(&new_turn, out));
            }
            (Phase::Generate, Input::Interrupted)
                if self.turn.as_ref().is_some_and(|t| t.compact) =>
            {
                let message = "the orchestrator restarted while the conversation was being \
                               summarised; nothing was replaced: ask for the compaction again";
                self.emit(&mut out, &turn_id, orchestrator_error(message, true));
                let finished = self.finish(TurnOutcome::Failed, message.to_string());
                self.emit(&mut out, &turn_id, finished);
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
                    self.call_model(&mut out, &turn_id, true);
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
            (_, Input::Noted(kind)) => self.emit(&mut out, &turn_id, kind),
            (
                Phase::Idle | Phase::UseTools,
                Input::ModelDone(_)
                | Input::ModelUnreadable { .. }
                | Input::ModelFailed { .. }
                | Input::ModelTryLater(_),
            ) => {
                return Err(Refusal::Unexpected {
                    input: "model output",
                    phase,
                });
            }
            (_, Input::HooksDone { job, outcomes }) => {
                self.hooks_done(&mut out, &turn_id, *job, outcomes)?;
            }
            (_, Input::Summarised { job, summary }) => {
                self.summarised(&mut out, &turn_id, job, summary)?;
            }
            (
                Phase::Idle | Phase::Generate,
                Input::ToolChunk { .. } | Input::ToolDone(_) | Input::ToolNeedsInput(_),
            ) => {
                return Err(Refusal::Unexpected {
                    input: "tool output",
                    phase,
                });
            }
        }
        Ok(Self::into_effects(&turn_id, out))
    }

    /// An answer whose tool call could not be read: recorded, then the
    /// model is shown it with the reason and the format, once per step; a
    /// second one fails the turn.
    fn unreadable(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        text: String,
        error: String,
        usage: Option<agentry_llm::Usage>,
    ) {
        let again = self.turn.as_ref().is_some_and(|t| t.unreadable.is_some());
        let event = pb::ToolCallUnreadable {
            text,
            error: error.clone(),
            usage: usage.map(recorded_usage),
            attempt: if again { 2 } else { 1 },
        };
        self.emit(out, turn_id, Kind::ToolCallUnreadable(event));
        if again {
            let message = format!(
                "the model wrote a tool call that could not be read, even after being shown \
                 the format: {error}"
            );
            let failed = error_event(ErrorSource::Model, message.clone(), false);
            self.emit(out, turn_id, failed);
            let finished = self.finish(TurnOutcome::Failed, message);
            self.emit(out, turn_id, finished);
        } else {
            self.call_model(out, turn_id, false);
        }
    }

    pub(super) fn model_done(&mut self, out: &mut Out, turn_id: &str, c: Completion) {
        let step = self.turn.as_ref().map(|t| t.steps).unwrap_or_default() + 1;
        // The session's first answer (nothing answered or summarised yet)
        // records what its requests are made of.
        let first = !self
            .history
            .iter()
            .any(|m| matches!(m, Message::Assistant { .. } | Message::System { .. }));
        let (fixed_tokens, context_window) = if !first {
            (0, 0)
        } else {
            let view = &self.view.0;
            let fixed = self.prompt().tokens(&view.tokenizer);
            (
                u32::try_from(fixed).unwrap_or(u32::MAX),
                u32::try_from(view.compaction.context_window).unwrap_or(u32::MAX),
            )
        };
        let message = Kind::ModelMessage(pb::ModelMessage {
            text: c.text.clone(),
            finish_reason: c.finish_reason.clone(),
            usage: c.usage.map(recorded_usage),
            model: c.model.clone(),
            step,
            fixed_tokens,
            context_window,
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
                let error = error_event(ErrorSource::Model, message, false);
                self.emit(out, turn_id, error);
                let finished = self.finish(TurnOutcome::Failed, c.text);
                self.emit(out, turn_id, finished);
                return;
            }
            // A person steered while the model answered: it hears them
            // (within the step limit; past it, the answer stands).
            let steps = self.turn.as_ref().map_or(0, |t| t.steps);
            if !self.steering.is_empty() && steps < self.max_steps {
                self.call_model(out, turn_id, true);
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
            let flags = self
                .catalog
                .flags
                .get(&call.name)
                .copied()
                .unwrap_or_default();
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
        if self.stop_at_a_limit(out, turn_id, &ids) || self.stop_a_loop(out, turn_id, &ids) {
            return;
        }
        if self.check_progress(out, turn_id, &ids) {
            self.dispatch(out, turn_id);
            return;
        }
        let plan_mode = self.turn_plan().is_some();
        for id in &ids {
            let tool = call_tool(self, id);
            if plan_mode && crate::plan::is_plan_tool(&tool) {
                self.plan_call(out, turn_id, id);
            } else if !self.tell_of_a_loop(out, turn_id, id) {
                self.validate(out, turn_id, id);
            }
        }
        self.dispatch(out, turn_id);
    }

    /// The plan-mode governor, once a response's calls are all answered:
    /// start the next step, stop at the safety rail or the stage's call
    /// limit, or ask the model to go on (planning, repairing, executing the
    /// current step, or writing the final answer).
    pub(super) fn govern(&mut self, out: &mut Out, turn_id: &str) {
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
        self.call_model(out, turn_id, true);
    }

    /// Whether a compaction names a prefix of the conversation that leaves
    /// at least one message and does not split a tool call from its result.
    pub(super) fn compaction_fits(&self, c: &pb::ContextCompacted) -> bool {
        let count = c.messages as usize;
        if count == 0 || count >= self.history.len() || self.history_spans.len() < count {
            return false;
        }
        let replaced = &self.history_spans[..count];
        replaced[0].0 == c.first_seq
            && replaced.iter().map(|s| s.1).max() == Some(c.last_seq)
            && !matches!(self.history[count], Message::Tool { .. })
    }
}

/// A model server's token counts as the log records them.
fn recorded_usage(u: agentry_llm::Usage) -> TokenUsage {
    TokenUsage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.total_tokens,
        cached_prompt_tokens: u.cached_prompt_tokens,
        cache_write_prompt_tokens: u.cache_write_tokens,
    }
}

/// Messages that may wait for the model's next call at once.
const MAX_STEERING: usize = 20;

/// A time as milliseconds since the epoch.
fn timestamp_ms(t: &prost_types::Timestamp) -> i64 {
    t.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(t.nanos) / 1_000_000)
}
