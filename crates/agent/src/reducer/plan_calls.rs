//! Plan mode's own tools: submitted plans and completed steps.

use super::*;

impl SessionState {
    /// A plan step's new status; starting a step counts towards the rail.
    pub(super) fn step_update(&self, index: usize, status: PlanStepStatus, summary: &str) -> Kind {
        let started = self.turn_plan().map(|p| p.started).unwrap_or_default()
            + u32::from(status == PlanStepStatus::InProgress);
        let mut update = pb::PlanStepUpdated {
            index: index as u32,
            status: 0,
            summary: crate::plan::clip(summary, 500),
            started,
        };
        update.set_status(status);
        Kind::PlanStepUpdated(update)
    }

    /// A call of `submit_plan` or `complete_step`: the reducer answers it
    /// itself, moving the plan forward.
    pub(super) fn plan_call(&mut self, out: &mut Out, turn_id: &str, call_id: &str) {
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
}
