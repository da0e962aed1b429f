//! The tool-call lifecycle: validation, the policy's verdict, approvals,
//! dispatch in order, results, and recovery after a restart.

use super::*;

impl SessionState {
    /// For a tool of an MCP server (its name has the `__` separator, which
    /// no other tool's has): what the server says of it, from the catalog
    /// the call was offered with. `None` for every other tool.
    fn read_only_hint(&self, tool: &str) -> Option<bool> {
        tool.contains("__").then(|| {
            self.catalog
                .flags
                .get(tool)
                .is_some_and(|f| f.read_only_hint)
        })
    }

    /// A call's result, with its terminal state.
    pub(super) fn answer(&mut self, out: &mut Out, turn_id: &str, mut result: pb::ToolResult) {
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
    pub(super) fn refuse_call(
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

    /// The turn stops before the calls `ids` run: each is closed as
    /// cancelled, its result saying why.
    pub(super) fn close_unrun(&mut self, out: &mut Out, turn_id: &str, ids: &[String], why: &str) {
        for id in ids {
            self.refuse_call(
                out,
                turn_id,
                id,
                CallPhase::Cancelled,
                format!("not run: {why}"),
            );
        }
    }

    /// Checks one requested call: its arguments, then the policy with the
    /// before_tool hooks (which run first when any matches the tool; the
    /// call stays `Validating` until they answer).
    pub(super) fn validate(&mut self, out: &mut Out, turn_id: &str, call_id: &str) {
        let Some(call) = self.turn.as_ref().and_then(|t| t.call(call_id)) else {
            return;
        };
        let (tool, args) = (call.tool.clone(), call.effective_arguments.clone());
        if let Err(reason) = check_arguments(&args) {
            let output = format!("error: invalid arguments for {tool}: {reason}");
            self.refuse_call(out, turn_id, call_id, CallPhase::Error, output);
            return;
        }
        if self.view.0.only_offered && !self.catalog.flags.contains_key(&tool) {
            let offered: Vec<&str> = self.catalog.flags.keys().map(String::as_str).collect();
            let output = format!(
                "error: the tool {tool} is not offered to you; your tools are: {}",
                offered.join(", ")
            );
            self.refuse_call(out, turn_id, call_id, CallPhase::Error, output);
            return;
        }
        let hooks = self.view.0.hooks.matching(HookEvent::BeforeTool, &tool);
        if hooks.is_empty() {
            self.settle(out, turn_id, call_id, &[]);
            return;
        }
        let arguments: serde_json::Value =
            serde_json::from_str(&args).unwrap_or_else(|_| serde_json::json!({}));
        out.after.push(Effect::RunHooks(Box::new(HookJob {
            event: HookEvent::BeforeTool,
            call_id: call_id.to_string(),
            tool: tool.clone(),
            hooks,
            input: serde_json::json!({
                "event": HookEvent::BeforeTool.name(),
                "turn_id": turn_id,
                "call_id": call_id,
                "tool": tool,
                "arguments": arguments,
            }),
            result: None,
        })));
    }

    /// Decides a valid call: the policy's verdict with what the hooks
    /// said (`hooks`: the before_tool hooks that ran for it, recorded).
    pub(super) fn settle(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        call_id: &str,
        hooks: &[pb::HookRan],
    ) {
        let Some(turn) = self.turn.as_ref() else {
            return;
        };
        let Some(call) = turn.call(call_id) else {
            return;
        };
        let (tool, args, read_only, mode, hook_asked) = (
            call.tool.clone(),
            call.effective_arguments.clone(),
            call.read_only,
            turn.approval_mode,
            call.hook_asked,
        );
        let verdict = self.policy.0.check_tool(
            &tool,
            &args,
            read_only,
            self.read_only_hint(&tool),
            &self.session_rules,
        );
        let (decision, by_hook) = crate::hooks::combine(verdict.decision, hooks);
        let need = match by_hook {
            Some(_) => Need::default(),
            None => verdict.need,
        };
        let rule = match by_hook {
            Some(hook) if hook.reason.is_empty() => format!("the hook {}", hook.command),
            Some(hook) => format!("the hook {}: {}", hook.command, hook.reason),
            None => verdict.rule,
        };
        // Asked about by a hook, or by a rule naming who approves, a call
        // waits for a person whatever the turn's approval mode.
        let mode = match (hook_asked || need.is_restricted(), mode) {
            (true, ApprovalMode::Always) => ApprovalMode::Policy,
            (_, mode) => mode,
        };
        match (decision, mode) {
            (Decision::Deny, _) if by_hook.is_some() => {
                let output = format!("error: denied by {rule}");
                self.refuse_call(out, turn_id, call_id, CallPhase::Error, output);
            }
            (Decision::Deny, _) => {
                let output = format!("error: denied by policy: {rule}");
                self.refuse_call(out, turn_id, call_id, CallPhase::Error, output);
            }
            (Decision::Confirm, ApprovalMode::Never) => {
                let output = format!(
                    "error: this call needs a person's approval ({rule}), and this turn runs without one"
                );
                self.refuse_call(out, turn_id, call_id, CallPhase::Error, output);
            }
            (Decision::Allow, _) => {
                let (detail, allowed_by) = match by_hook {
                    Some(_) => (format!("allowed by {rule}"), pb::AllowedBy::Hook),
                    None => (rule, self.allowed_by_policy(&tool, &args, read_only)),
                };
                self.emit(out, turn_id, scheduled(call_id, detail, allowed_by));
            }
            (Decision::Confirm, ApprovalMode::Always) => {
                let detail = format!("approved for this turn ({rule})");
                self.emit(
                    out,
                    turn_id,
                    scheduled(call_id, detail, pb::AllowedBy::Turn),
                );
            }
            (Decision::Confirm, ApprovalMode::Policy | ApprovalMode::Unspecified) => {
                let (approvers, approvals_required) = need_fields(&need);
                self.emit(
                    out,
                    turn_id,
                    Kind::ApprovalRequested(pb::ApprovalRequested {
                        call_id: call_id.to_string(),
                        network: self.network_for(&tool, &args),
                        tool,
                        arguments_json: args,
                        matched_rule: rule,
                        outcome_unknown: false,
                        approvers,
                        approvals_required,
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

    /// Hooks asked for by an effect answered: each is recorded; a call's
    /// before_tool hooks then settle it, its after_tool hooks release its
    /// result with the context they added.
    pub(super) fn hooks_done(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        job: HookJob,
        outcomes: Vec<HookOutcome>,
    ) -> Result<(), Refusal> {
        let phase = self.phase;
        let call_phase = self
            .turn
            .as_ref()
            .and_then(|t| t.call(&job.call_id))
            .map(|c| c.phase);
        match job.event {
            HookEvent::BeforeTool if call_phase != Some(CallPhase::Validating) => {
                return Err(Refusal::Unexpected {
                    input: "hook outcome",
                    phase,
                });
            }
            HookEvent::AfterTool if !self.is_executing(&job.call_id) => {
                return Err(Refusal::Unexpected {
                    input: "hook outcome",
                    phase,
                });
            }
            _ => {}
        }
        let mut ran: Vec<pb::HookRan> = job
            .hooks
            .iter()
            .zip(&outcomes)
            .map(|(hook, outcome)| crate::hooks::interpret(&job, hook, outcome))
            .collect();
        if job.event == HookEvent::BeforeTool {
            // The last record says what became of the call.
            let policy = self
                .turn
                .as_ref()
                .and_then(|t| t.call(&job.call_id))
                .map(|c| {
                    self.policy
                        .0
                        .check_tool(
                            &c.tool,
                            &c.effective_arguments,
                            c.read_only,
                            self.read_only_hint(&c.tool),
                            &self.session_rules,
                        )
                        .decision
                })
                .unwrap_or(Decision::Confirm);
            let decided = crate::hooks::combine(policy, &ran).0;
            if let Some(last) = ran.last_mut() {
                last.outcome = crate::hooks::decision_name(decided).to_string();
            }
        }
        for event in &ran {
            self.emit(out, turn_id, Kind::HookRan(event.clone()));
        }
        match job.event {
            HookEvent::BeforeTool => {
                self.settle(out, turn_id, &job.call_id, &ran);
                self.dispatch(out, turn_id);
            }
            HookEvent::AfterTool => {
                if let Some(mut result) = job.result {
                    for hook in ran.iter().filter(|r| !r.context.is_empty()) {
                        result.output.push_str(&format!(
                            "\n\n[context from the hook {}]\n{}",
                            hook.command, hook.context
                        ));
                    }
                    self.answer(out, turn_id, result);
                }
                self.dispatch(out, turn_id);
            }
            HookEvent::UserMessage | HookEvent::TurnFinished | HookEvent::SessionStart => {}
        }
        Ok(())
    }

    /// Starts whatever calls may run now, or moves on when all are done.
    ///
    /// Calls run in the model's order; a run of consecutive parallel-safe,
    /// read-only calls runs concurrently; a call awaiting approval holds up
    /// the calls after it.
    pub(super) fn dispatch(&mut self, out: &mut Out, turn_id: &str) {
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
    pub(super) fn after_tools(&mut self, out: &mut Out, turn_id: &str) {
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
            self.call_model(out, turn_id, true);
        }
    }

    /// Whether the call runs now (one whose outcome is unknown after a
    /// restart does not: a result of its lost run is stale).
    pub(super) fn is_executing(&self, call_id: &str) -> bool {
        self.turn
            .as_ref()
            .and_then(|t| t.call(call_id))
            .is_some_and(|c| c.phase == CallPhase::Executing && !c.outcome_unknown)
    }

    pub(super) fn open_calls(&self) -> Vec<String> {
        self.turn
            .iter()
            .flat_map(|t| t.calls.iter())
            .filter(|c| !c.phase.is_terminal())
            .map(|c| c.id.clone())
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        call_id: String,
        decision: ApprovalDecision,
        reason: String,
        edited: String,
        by: Answerer,
    ) -> Result<(), Refusal> {
        let Some(call) = self.turn.as_ref().and_then(|t| t.call(&call_id)).cloned() else {
            return Err(Refusal::NoPendingApproval { call_id });
        };
        let approves = matches!(
            decision,
            ApprovalDecision::Approve
                | ApprovalDecision::ApproveForSession
                | ApprovalDecision::Edit
        );
        if approves && !call.need.admits(&by.name, &by.role) {
            return Err(Refusal::NotAnApprover(format!(
                "{} may not approve this call: the rule that asked names who may ({}); \
                 anyone with the approver role may deny it",
                by.name,
                call.need.describe()
            )));
        }
        let decided = |allowances: Vec<pb::SessionAllowance>,
                       edited: String,
                       (approved_by, approvals_missing): (Vec<String>, u32)| {
            let mut decided = pb::ApprovalDecided {
                call_id: call_id.clone(),
                decision: 0,
                reason: reason.clone(),
                edited_arguments_json: edited,
                allowances,
                approved_by,
                approvals_missing,
            };
            decided.set_decision(decision);
            Kind::ApprovalDecided(decided)
        };
        if call.outcome_unknown {
            return self.decide_unknown(out, turn_id, &call, decision, reason, &by);
        }
        match decision {
            ApprovalDecision::Unspecified => {
                return Err(Refusal::InvalidDecision(
                    "the decision is not set: approve, approve for session, deny or edit".into(),
                ));
            }
            ApprovalDecision::Check => {
                return Err(Refusal::InvalidDecision(
                    "check applies only to a call whose outcome is unknown after a restart; \
                     approve, approve for session, deny or edit"
                        .into(),
                ));
            }
            ApprovalDecision::Approve => {
                let tally = tally(&call, &by)?;
                let missing = tally.1;
                let detail = approved_detail(&tally.0);
                self.emit(out, turn_id, decided(Vec::new(), String::new(), tally));
                if missing > 0 {
                    return Ok(()); // It waits for the others.
                }
                self.emit(
                    out,
                    turn_id,
                    scheduled(&call_id, detail, pb::AllowedBy::Person),
                );
            }
            ApprovalDecision::ApproveForSession => {
                if call.need.is_restricted() {
                    return Err(Refusal::InvalidDecision(format!(
                        "the rule that asked about this call says who approves each such call \
                         ({}): approve this one, not the session",
                        call.need.describe()
                    )));
                }
                let allowances = session_rules_for(&call.tool, &call.effective_arguments)
                    .into_iter()
                    .map(|r| pb::SessionAllowance {
                        tool: r.tool,
                        command: r.command.unwrap_or_default(),
                        path: r.path.unwrap_or_default(),
                    })
                    .collect();
                self.emit(
                    out,
                    turn_id,
                    decided(allowances, String::new(), (Vec::new(), 0)),
                );
                let detail = "approved by a person for this session";
                self.emit(
                    out,
                    turn_id,
                    scheduled(&call_id, detail, pb::AllowedBy::Person),
                );
                self.release_allowed(out, turn_id);
            }
            ApprovalDecision::Deny => {
                self.emit(
                    out,
                    turn_id,
                    decided(Vec::new(), String::new(), (Vec::new(), 0)),
                );
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
                // The edited call is checked by the policy again; the person's
                // edit counts as their approval unless the policy denies it.
                // Earlier approvals were of other arguments: they lapse.
                let verdict = self.policy.0.check_tool(
                    &call.tool,
                    &edited,
                    call.read_only,
                    self.read_only_hint(&call.tool),
                    &self.session_rules,
                );
                if verdict.decision == Decision::Deny {
                    self.emit(out, turn_id, decided(Vec::new(), edited, (Vec::new(), 0)));
                    let output = format!(
                        "error: the edited call is denied by policy: {}",
                        verdict.rule
                    );
                    self.refuse_call(out, turn_id, &call_id, CallPhase::Error, output);
                    self.dispatch(out, turn_id);
                    return Ok(());
                }
                let mut need = call.need.clone();
                if verdict.decision == Decision::Confirm {
                    need.join(&verdict.need);
                }
                let approved: Vec<String> = if need.admits(&by.name, &by.role) {
                    vec![by.name.clone()]
                } else {
                    Vec::new()
                };
                let missing = need.count().saturating_sub(approved.len() as u32);
                let shown = if need.count() > 1 || missing > 0 {
                    approved
                } else {
                    Vec::new()
                };
                self.emit(
                    out,
                    turn_id,
                    decided(Vec::new(), edited.clone(), (shown, missing)),
                );
                if missing > 0 {
                    // The new arguments wait for the people they need.
                    let (approvers, approvals_required) = need_fields(&need);
                    self.emit(
                        out,
                        turn_id,
                        Kind::ApprovalRequested(pb::ApprovalRequested {
                            call_id: call_id.clone(),
                            network: self.network_for(&call.tool, &edited),
                            tool: call.tool.clone(),
                            arguments_json: edited,
                            matched_rule: format!("edited by {}: {}", by.name, verdict.rule),
                            outcome_unknown: false,
                            approvers,
                            approvals_required,
                        }),
                    );
                    return Ok(());
                }
                let detail = "edited and approved by a person";
                self.emit(
                    out,
                    turn_id,
                    scheduled(&call_id, detail, pb::AllowedBy::Person),
                );
            }
        }
        self.dispatch(out, turn_id);
        Ok(())
    }

    /// What let a call the policy allows run: the configured policy, or
    /// (when that alone would have asked) a person's standing approval for
    /// this session.
    fn allowed_by_policy(&self, tool: &str, arguments: &str, read_only: bool) -> pb::AllowedBy {
        if self.session_rules.is_empty() {
            return pb::AllowedBy::Rule;
        }
        let alone =
            self.policy
                .0
                .check_tool(tool, arguments, read_only, self.read_only_hint(tool), &[]);
        if alone.decision == Decision::Allow {
            pb::AllowedBy::Rule
        } else {
            pb::AllowedBy::Session
        }
    }

    /// A person's choice about a call whose outcome is unknown after a
    /// restart: check (the model is told, and checks), run it again, or
    /// skip it.
    fn decide_unknown(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        call: &Call,
        decision: ApprovalDecision,
        reason: String,
        by: &Answerer,
    ) -> Result<(), Refusal> {
        // Running it again is approving it: as many people as it needs.
        let (approved_by, approvals_missing) = if decision == ApprovalDecision::Approve {
            tally(call, by)?
        } else {
            (Vec::new(), 0)
        };
        let output = match decision {
            ApprovalDecision::Approve => None,
            ApprovalDecision::Check => Some(outcome_unknown_text(&call.tool)),
            ApprovalDecision::Deny => Some(format!(
                "error: not run again: the runtime restarted while this {} call was running, and \
                 the person chose to skip it{}. It may or may not have taken effect; do not \
                 repeat it.",
                call.tool,
                if reason.trim().is_empty() {
                    String::new()
                } else {
                    format!(" ({})", reason.trim())
                }
            )),
            _ => {
                return Err(Refusal::InvalidDecision(
                    "this call's outcome is unknown after a restart: answer check, approve (run \
                     it again) or deny (skip it)"
                        .into(),
                ));
            }
        };
        let mut decided = pb::ApprovalDecided {
            call_id: call.id.clone(),
            decision: 0,
            reason,
            edited_arguments_json: String::new(),
            allowances: Vec::new(),
            approved_by,
            approvals_missing,
        };
        decided.set_decision(decision);
        self.emit(out, turn_id, Kind::ApprovalDecided(decided));
        if approvals_missing > 0 {
            return Ok(()); // It waits for the others.
        }
        match output {
            // It is still `Executing`: it runs again as it was.
            None => {
                let mut again = call.clone();
                again.outcome_unknown = false;
                out.after.push(self.run_tool(&again));
            }
            Some(output) => {
                self.refuse_call(out, turn_id, &call.id, CallPhase::Error, output);
                self.dispatch(out, turn_id);
            }
        }
        Ok(())
    }

    /// Schedules waiting calls that the session's standing approvals now
    /// allow (e.g. identical calls in the same response).
    pub(super) fn release_allowed(&mut self, out: &mut Out, turn_id: &str) {
        let waiting: Vec<Call> = self.awaiting_approval().into_iter().cloned().collect();
        for call in waiting {
            if call.outcome_unknown || call.hook_asked {
                continue; // Only a person answers these.
            }
            let verdict = self.policy.0.check_tool(
                &call.tool,
                &call.effective_arguments,
                call.read_only,
                self.read_only_hint(&call.tool),
                &self.session_rules,
            );
            if verdict.decision == Decision::Allow {
                let allowed_by =
                    self.allowed_by_policy(&call.tool, &call.effective_arguments, call.read_only);
                self.emit(out, turn_id, scheduled(&call.id, verdict.rule, allowed_by));
            }
        }
    }

    /// After a restart: re-run read-only calls that were running, report
    /// mutating ones as of unknown outcome, ask again for pending approvals,
    /// and carry on.
    /// Asks a person about `call` again (after a restart).
    fn ask_again(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        call: &Call,
        matched_rule: String,
        outcome_unknown: bool,
    ) {
        let (approvers, approvals_required) = need_fields(&call.need);
        let asked = Kind::ApprovalRequested(pb::ApprovalRequested {
            call_id: call.id.clone(),
            tool: call.tool.clone(),
            arguments_json: call.effective_arguments.clone(),
            matched_rule,
            network: self.network_for(&call.tool, &call.effective_arguments),
            outcome_unknown,
            approvers,
            approvals_required,
        });
        self.emit(out, turn_id, asked);
    }

    pub(super) fn recover_calls(&mut self, out: &mut Out, turn_id: &str) {
        let calls: Vec<Call> = self
            .turn
            .as_ref()
            .map(|t| t.calls.clone())
            .unwrap_or_default();
        for call in calls {
            match call.phase {
                // Its server still waits for a person's answers.
                CallPhase::Executing if call.asking.is_some() => {}
                CallPhase::Executing if call.read_only => {
                    out.after.push(self.run_tool(&call));
                }
                CallPhase::Executing => {
                    let mode = self
                        .turn
                        .as_ref()
                        .map(|t| t.approval_mode)
                        .unwrap_or(ApprovalMode::Policy);
                    if matches!(mode, ApprovalMode::Policy | ApprovalMode::Unspecified) {
                        // A person decides: check, run again, or skip.
                        self.ask_again(
                            out,
                            turn_id,
                            &call,
                            format!(
                                "outcome unknown: the runtime restarted while this {} call \
                                     was running",
                                call.tool
                            ),
                            true,
                        );
                        // It stays where it was (running, as far as anyone
                        // knows) until the person answers.
                    } else {
                        // Nobody to ask (a headless turn): the model checks.
                        let output = outcome_unknown_text(&call.tool);
                        self.refuse_call(out, turn_id, &call.id, CallPhase::Error, output);
                    }
                }
                CallPhase::AwaitingApproval if call.hook_asked => {
                    // Asked again, as the hook asked.
                    self.ask_again(
                        out,
                        turn_id,
                        &call,
                        "a hook asked for a person".to_string(),
                        false,
                    );
                }
                CallPhase::AwaitingApproval => {
                    let verdict = self.policy.0.check_tool(
                        &call.tool,
                        &call.effective_arguments,
                        call.read_only,
                        self.read_only_hint(&call.tool),
                        &self.session_rules,
                    );
                    if verdict.decision == Decision::Allow {
                        let allowed_by = self.allowed_by_policy(
                            &call.tool,
                            &call.effective_arguments,
                            call.read_only,
                        );
                        self.emit(out, turn_id, scheduled(&call.id, verdict.rule, allowed_by));
                        continue;
                    }
                    self.ask_again(out, turn_id, &call, verdict.rule, false);
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

/// One more approval of `call` by `by`: the people whose approvals count
/// now and how many more it waits for. A call one person approves counts
/// nobody; one person never counts twice.
fn tally(call: &Call, by: &Answerer) -> Result<(Vec<String>, u32), Refusal> {
    let needed = call.need.count();
    if needed <= 1 {
        return Ok((Vec::new(), 0));
    }
    if call.approved_by.contains(&by.name) {
        return Err(Refusal::NotAnApprover(format!(
            "{} approved this call already; it needs {needed} different people ({} so far: {})",
            by.name,
            call.approved_by.len(),
            call.approved_by.join(", ")
        )));
    }
    let mut approved = call.approved_by.clone();
    approved.push(by.name.clone());
    let missing = needed.saturating_sub(approved.len() as u32);
    Ok((approved, missing))
}

/// How a scheduled call names the approval that let it run.
fn approved_detail(people: &[String]) -> String {
    match people {
        [] | [_] => "approved by a person".to_string(),
        many => format!("approved by {} people", many.len()),
    }
}

/// What the model is told of a call that was running when the runtime
/// restarted.
fn outcome_unknown_text(tool: &str) -> String {
    format!(
        "error: outcome unknown: the runtime restarted while this {tool} call was running; it may \
         or may not have taken effect. Check before repeating it."
    )
}
