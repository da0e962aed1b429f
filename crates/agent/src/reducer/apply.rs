//! The fold: how each recorded event changes the state. The only place
//! the state changes.

use super::*;

impl SessionState {
    /// A turn started by an event rather than a person's message (a task
    /// reminder, an MCP resource update): tools are approved by policy.
    fn start_event_turn(&mut self, turn_id: &str) {
        self.failed_calls.clear();
        self.turn_scheduled = false;
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
            cost: 0.0,
            compact: false,
            unreadable: None,
        });
        self.phase = Phase::Generate;
    }

    /// Counts what a model answer cost, in the turn and the session.
    fn spend(&mut self, u: &TokenUsage) {
        let price = self.view.0.price.as_ref();
        self.spent_tokens += u.total_tokens;
        let cost = price.map_or(0.0, |p| p.cost(u));
        self.spent_cost += cost;
        if let Some(turn) = &mut self.turn {
            add_usage(&mut turn.usage, u);
            turn.cost += cost;
        }
    }

    /// Folds one event into the state. The only place the state changes.
    pub fn apply(&mut self, turn_id: &str, kind: &Kind) {
        self.last_seq += 1;
        match kind {
            Kind::UserMessage(m) => {
                self.turn_scheduled = false;
                if let Some(raised) = &m.budget {
                    self.raise_limits(raised);
                }
                // A request to compact is not part of the conversation.
                if !m.compact {
                    let message = user_message(&m.text, &m.images, self.view.0.images);
                    self.push_history(message);
                }
                self.failed_calls.clear();
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
                    cost: 0.0,
                    compact: m.compact,
                    unreadable: None,
                });
                self.phase = Phase::Generate;
            }
            Kind::ModelMessage(m) => {
                self.push_history(Message::Assistant {
                    content: m.text.clone(),
                    tool_calls: Vec::new(),
                });
                let index = self.history.len() - 1;
                if let Some(u) = &m.usage {
                    self.spend(u);
                }
                if let Some(turn) = &mut self.turn {
                    turn.steps += 1;
                    turn.last_text = m.text.clone();
                    turn.calls.clear();
                    turn.assistant_index = index;
                    turn.unreadable = None;
                }
            }
            Kind::ToolCallUnreadable(u) => {
                if let Some(usage) = &u.usage {
                    self.spend(usage);
                }
                if let Some(turn) = &mut self.turn {
                    turn.unreadable = Some((u.text.clone(), u.error.clone()));
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
                        self.history_tokens.changed(turn.assistant_index);
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
                        outcome_unknown: false,
                        hook_asked: false,
                        need: Need::default(),
                        approved_by: Vec::new(),
                        asking: None,
                        resume: None,
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
            Kind::McpInputRequested(asked) => {
                if let Some(turn) = &mut self.turn
                    && let Some(call) = turn.call_mut(&asked.call_id)
                {
                    call.asking = Some(asked.clone());
                    call.resume = None;
                }
            }
            Kind::McpInputProvided(given) => {
                if let Some(turn) = &mut self.turn
                    && let Some(call) = turn.call_mut(&given.call_id)
                    && let Some(asked) = call.asking.take()
                {
                    call.resume = Some(pb::McpResume {
                        resume_json: asked.resume_json,
                        answers_json: given.answers_json.clone(),
                        cancel: false,
                    });
                }
            }
            Kind::ApprovalRequested(a) => {
                if let Some(turn) = &mut self.turn
                    && let Some(call) = turn.call_mut(&a.call_id)
                {
                    call.outcome_unknown = a.outcome_unknown;
                    call.need = need_of(a);
                    if a.arguments_json != call.effective_arguments {
                        call.approved_by.clear();
                    }
                }
            }
            Kind::ApprovalDecided(d) => {
                if let Some(turn) = &mut self.turn
                    && let Some(call) = turn.call_mut(&d.call_id)
                {
                    call.approved_by = if d.approvals_missing > 0 {
                        d.approved_by.clone()
                    } else {
                        Vec::new()
                    };
                    if d.approvals_missing == 0 {
                        call.outcome_unknown = false;
                    }
                    if d.decision() == ApprovalDecision::Edit {
                        call.effective_arguments = d.edited_arguments_json.clone();
                    }
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
                if r.is_error {
                    self.failed_calls.insert(r.call_id.clone());
                }
                // A sub-agent's tokens are this session's spending too.
                if let Some(u) = &r.sub_agent_usage {
                    self.count_spent(Some(u));
                    let cost = self.view.0.price.as_ref().map(|p| p.cost(u));
                    if let Some(turn) = &mut self.turn {
                        add_usage(&mut turn.usage, u);
                        turn.cost += cost.unwrap_or_default();
                    }
                }
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
                self.history_tokens.inserted(at);
                turn.calls[index].answered = true;
                if turn.calls.iter().all(|c| c.answered) {
                    self.phase = Phase::Generate;
                }
            }
            Kind::Error(e) => {
                if e.source() == ErrorSource::Orchestrator
                    && let Some(turn) = &mut self.turn
                {
                    turn.restarts += 1;
                }
            }
            Kind::TurnParked(parked) => self.parked = Some(parked.clone()),
            Kind::SteeringQueued(q) => self.steering.push(q.text.clone()),
            Kind::SteeringDelivered(d) => {
                let count = (d.count as usize).min(self.steering.len());
                for text in self.steering.drain(..count).collect::<Vec<_>>() {
                    self.push_history(Message::User {
                        content: text,
                        images: Vec::new(),
                    });
                }
            }
            Kind::TurnResumed(resumed) => {
                if let Some(raised) = &resumed.budget {
                    self.raise_limits(raised);
                }
                self.parked = None;
            }
            Kind::TurnFinished(_) => {
                self.parked = None;
                self.steering.clear();
                self.failed_calls.clear();
                self.turn = None;
                self.phase = Phase::Idle;
            }
            Kind::McpResourceUpdated(u) => {
                self.last_mcp_updates
                    .insert((u.server.clone(), u.uri.clone()), u.update_id.clone());
                self.push_history(Message::User {
                    content: super::compose_mcp_update(u),
                    images: Vec::new(),
                });
                self.start_event_turn(turn_id);
            }
            Kind::ReminderDue(r) => {
                self.delivered_firings.insert(r.firing_id.clone());
                if r.reminder_kind() == pb::ReminderKind::Task {
                    // The Task state: the reminder becomes the message the
                    // agent acts on.
                    self.push_history(Message::User {
                        content: compose_reminder(r),
                        images: Vec::new(),
                    });
                    self.start_event_turn(turn_id);
                    // A scheduled task's calls are approved as it says
                    // (never: a call that needs a person is refused).
                    self.turn_scheduled = r.scheduled;
                    if r.scheduled
                        && let Some(turn) = &mut self.turn
                    {
                        turn.approval_mode = match ApprovalMode::try_from(r.approval_mode) {
                            Ok(ApprovalMode::Never) => ApprovalMode::Never,
                            _ => ApprovalMode::Policy,
                        };
                    }
                }
            }
            Kind::ModelChanged(m) => {
                self.model = (!m.model.is_empty()).then(|| m.model.clone());
            }
            Kind::InstructionsLoaded(loaded) => {
                for file in &loaded.files {
                    match self.instructions.iter_mut().find(|f| f.path == file.path) {
                        Some(known) => *known = file.clone(),
                        None => self.instructions.push(file.clone()),
                    }
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
                        content: crate::prompt::summary_message(c),
                    },
                );
                self.history_spans.insert(0, (c.first_seq, c.last_seq));
                self.history_tokens.removed_first(count);
                self.history_tokens.inserted(0);
            }
            Kind::ToolsOffered(t) => {
                self.catalog = self.view.0.catalogs.shared_from_event(t);
            }
            // What the loop detector and the limits saw; the calls' own
            // events and the turn's end carry the consequences.
            Kind::LoopDetected(_) | Kind::BudgetExceeded(_) => {}
            // The files, not the conversation; a rewind's events are left
            // out before they reach here (`crate::rewind::effective`).
            Kind::HookRan(h) => {
                if h.event == HookEvent::BeforeTool.name()
                    && h.decision == "ask"
                    && let Some(call) = self.turn.as_mut().and_then(|t| t.call_mut(&h.call_id))
                {
                    call.hook_asked = true;
                }
            }
            Kind::WorkspaceSnapshot(_) | Kind::SessionRewound(_) | Kind::SessionForked(_) => {}
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
            Kind::ModelTextDelta(_) | Kind::ToolOutputChunk(_) | Kind::CancelRequested(_) => {}
        }
    }
}

/// A person's message as the model gets it: with its images when the model
/// takes images, else with each named in the text (a session that switched
/// to such a model keeps its history).
fn user_message(text: &str, images: &[pb::Image], takes_images: bool) -> Message {
    if takes_images || images.is_empty() {
        return Message::User {
            content: text.to_string(),
            images: images
                .iter()
                .map(|image| agentry_llm::Image {
                    mime: image.mime.clone(),
                    data: std::sync::Arc::from(image.data.as_slice()),
                })
                .collect(),
        };
    }
    let mut content = text.to_string();
    for image in images {
        let name = if image.path.is_empty() {
            "an image"
        } else {
            image.path.as_str()
        };
        content.push_str(&format!(
            "\n\n[attached: {name} ({}), not shown: this model is not set to take images]",
            image.mime
        ));
    }
    Message::User {
        content,
        images: Vec::new(),
    }
}
