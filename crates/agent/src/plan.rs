//! Plan mode: the model first writes a plan (the `submit_plan` tool), then
//! carries it out one step at a time, ending each step with
//! `complete_step`. The governor that moves between planning, executing and
//! repairing lives in the reducer; this module holds the plan's state, the
//! two tools, and the instructions the model gets at each stage.
//!
//! Everything here is pure: the plan changes only by applying
//! `PlanSubmitted` and `PlanStepUpdated` events.

use agentry_llm::ToolDefinition;
use agentry_proto::sessions::v1::{self as pb, PlanStepStatus};
use serde::Deserialize;
use std::fmt::Write as _;

/// Plan steps a turn may start (retries included) unless configured (the
/// built-in configuration's `agent.plan_max_steps`, which a test keeps
/// equal).
pub const DEFAULT_MAX_STEPS: u32 = 15;

/// [`DEFAULT_MAX_STEPS`].
pub fn default_max_steps() -> u32 {
    DEFAULT_MAX_STEPS
}
/// The planner's tool.
pub const SUBMIT_PLAN: &str = "submit_plan";
/// The executor's tool.
pub const COMPLETE_STEP: &str = "complete_step";
/// Steps one plan may have.
const MAX_STEPS_PER_PLAN: usize = 30;
/// Longest step title kept.
const MAX_TITLE_CHARS: usize = 200;
/// Longest step detail or summary kept.
const MAX_TEXT_CHARS: usize = 2_000;
/// Longest step outcome shown in the plan's outline.
const OUTLINE_SUMMARY_CHARS: usize = 200;

/// What the governor is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stage {
    /// The model is writing the first plan.
    #[default]
    Planning,
    /// A plan is being carried out.
    Executing,
    /// A step failed: the model is revising the plan.
    Repairing,
}

/// The plan of a plan-mode turn.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// The steps, including finished ones.
    pub steps: Vec<pb::PlanStep>,
    /// Where the governor is.
    pub stage: Stage,
    /// The step being carried out.
    pub current: Option<usize>,
    /// Steps started so far, retries included (the safety rail).
    pub started: u32,
    /// The plan's revision (0 before the first plan).
    pub revision: u32,
    /// The turn's model-call count when the current stage began; the step
    /// limit applies per stage.
    pub stage_start: u32,
    /// Why the last step failed (for the repair).
    pub failure: String,
}

/// A call of one of the plan tools, read from its arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum PlanCall {
    /// A new or revised plan: the steps still to do.
    Submit(Vec<pb::PlanStep>),
    /// The current step ended.
    Complete {
        /// It could not be done.
        failed: bool,
        /// What came of it, or why it failed.
        summary: String,
    },
}

fn status(step: &pb::PlanStep) -> PlanStepStatus {
    PlanStepStatus::try_from(step.status).unwrap_or(PlanStepStatus::Pending)
}

impl Plan {
    /// Applies a `PlanSubmitted` event.
    pub(crate) fn submitted(&mut self, p: &pb::PlanSubmitted, turn_steps: u32) {
        self.steps = p.steps.clone();
        self.revision = p.revision;
        self.current = None;
        self.stage = Stage::Executing;
        self.stage_start = turn_steps;
        self.failure.clear();
    }

    /// Applies a `PlanStepUpdated` event.
    pub(crate) fn step_updated(&mut self, u: &pb::PlanStepUpdated, turn_steps: u32) {
        let index = u.index as usize;
        if let Some(step) = self.steps.get_mut(index) {
            step.status = u.status;
            if !u.summary.is_empty() {
                step.summary = u.summary.clone();
            }
        }
        self.stage_start = turn_steps;
        match PlanStepStatus::try_from(u.status).unwrap_or(PlanStepStatus::Pending) {
            PlanStepStatus::InProgress => {
                self.current = Some(index);
                self.started = u.started;
                self.stage = Stage::Executing;
            }
            PlanStepStatus::Completed => self.current = None,
            PlanStepStatus::Failed => {
                self.current = None;
                self.stage = Stage::Repairing;
                self.failure = u.summary.clone();
            }
            PlanStepStatus::Pending => {}
        }
    }

    /// The first step not started yet.
    pub fn next_pending(&self) -> Option<usize> {
        self.steps
            .iter()
            .position(|s| status(s) == PlanStepStatus::Pending)
    }

    /// Every step is done and none runs: the model writes the final answer.
    pub fn is_finishing(&self) -> bool {
        self.stage == Stage::Executing && self.current.is_none() && self.next_pending().is_none()
    }

    /// Steps completed so far.
    pub fn completed(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| status(s) == PlanStepStatus::Completed)
            .count()
    }

    /// The plan that replaces this one when the model submits `steps`:
    /// completed steps stay, the new steps follow.
    pub fn revised(&self, steps: Vec<pb::PlanStep>) -> Vec<pb::PlanStep> {
        let mut out: Vec<pb::PlanStep> = self
            .steps
            .iter()
            .filter(|s| status(s) == PlanStepStatus::Completed)
            .cloned()
            .collect();
        out.extend(steps);
        out
    }

    fn outline(&self, out: &mut String) {
        for (i, step) in self.steps.iter().enumerate() {
            let mark = match status(step) {
                PlanStepStatus::Pending => "to do",
                PlanStepStatus::InProgress => "current",
                PlanStepStatus::Completed => "done",
                PlanStepStatus::Failed => "failed",
            };
            let _ = write!(out, "\n{}. [{mark}] {}", i + 1, step.title);
            // Details of the step at hand only, and short outcomes: the
            // outline goes with every call of the turn.
            if !step.detail.is_empty() && self.current == Some(i) {
                let _ = write!(out, " ({})", step.detail);
            }
            if !step.summary.is_empty() {
                let _ = write!(out, " -> {}", clip(&step.summary, OUTLINE_SUMMARY_CHARS));
            }
        }
    }

    /// What the model is told to do now (a system message for this call).
    pub fn guidance(&self) -> String {
        let mut out = String::from("Plan mode.");
        match self.stage {
            Stage::Planning => out.push_str(
                " Before doing anything, write a step-by-step plan for the person's request and \
                 submit it with the submit_plan tool: a few short, checkable steps in order. You \
                 may use read-only tools to look around first. Do not carry out the steps yet.",
            ),
            Stage::Repairing => {
                out.push_str(" A step of the plan failed:");
                let _ = write!(out, "\n{}", self.failure);
                out.push_str("\n\nThe plan so far:");
                self.outline(&mut out);
                out.push_str(
                    "\n\nWrite a revised plan for the work that remains, taking the failure into \
                     account, and submit it with submit_plan. Completed steps are kept; list only \
                     the steps still to do.",
                );
            }
            Stage::Executing => match self.current {
                Some(i) => {
                    out.push_str(" The plan:");
                    self.outline(&mut out);
                    let _ = write!(
                        out,
                        "\n\nCarry out step {} only, using tools as needed. When it is done, call \
                         complete_step with status \"completed\" and a one-line summary. If it \
                         cannot be done, call complete_step with status \"failed\" and the reason.",
                        i + 1
                    );
                }
                None => {
                    out.push_str(" Every step of the plan is done:");
                    self.outline(&mut out);
                    out.push_str(
                        "\n\nTell the person the outcome in a short final answer. Do not call tools.",
                    );
                }
            },
        }
        out
    }
}

/// The plan tools as offered to the model.
pub fn definitions() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: SUBMIT_PLAN.into(),
            description: "Submit your step-by-step plan (or a revised plan for the remaining \
                work). Each step is one checkable piece of work."
                .into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {
                    "steps": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": MAX_STEPS_PER_PLAN,
                        "items": {
                            "type": "object",
                            "properties": {
                                "title": {"type": "string", "description": "What the step does, in a few words."},
                                "detail": {"type": "string", "description": "How, if it helps."}
                            },
                            "required": ["title"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["steps"],
                "additionalProperties": false
            }),
        },
        ToolDefinition {
            name: COMPLETE_STEP.into(),
            description: "End the current plan step: completed, or failed with the reason.".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {
                    "status": {"type": "string", "enum": ["completed", "failed"]},
                    "summary": {"type": "string", "description": "What was done, or why it failed."}
                },
                "required": ["status"],
                "additionalProperties": false
            }),
        },
    ]
}

/// Whether `tool` is one of the plan tools.
pub fn is_plan_tool(tool: &str) -> bool {
    tool == SUBMIT_PLAN || tool == COMPLETE_STEP
}

// Extra fields models like to add ("reasoning", "id") are ignored.
#[derive(Deserialize)]
struct SubmitArgs {
    steps: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct CompleteArgs {
    status: String,
    #[serde(default)]
    summary: String,
}

/// `text` trimmed and cut to `max` characters (marked with `…`).
pub(crate) fn clip(text: &str, max: usize) -> String {
    let text = text.trim();
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// Reads a plan tool call; the error says what is wrong, for the model.
pub fn parse_call(tool: &str, arguments: &str) -> Result<PlanCall, String> {
    let arguments = if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    };
    match tool {
        SUBMIT_PLAN => {
            let args: SubmitArgs = serde_json::from_str(arguments).map_err(|e| {
                format!(
                    "invalid arguments for submit_plan: {e}; expected {{\"steps\": [{{\"title\": \"...\"}}, ...]}}"
                )
            })?;
            if args.steps.is_empty() {
                return Err("a plan needs at least one step".into());
            }
            if args.steps.len() > MAX_STEPS_PER_PLAN {
                return Err(format!(
                    "a plan may have at most {MAX_STEPS_PER_PLAN} steps, not {}",
                    args.steps.len()
                ));
            }
            let mut steps = Vec::with_capacity(args.steps.len());
            for (i, step) in args.steps.into_iter().enumerate() {
                let text = |v: Option<&serde_json::Value>| {
                    v.and_then(serde_json::Value::as_str)
                        .unwrap_or_default()
                        .to_string()
                };
                let (title, detail) = match &step {
                    serde_json::Value::String(title) => (title.clone(), String::new()),
                    serde_json::Value::Object(fields) => {
                        (text(fields.get("title")), text(fields.get("detail")))
                    }
                    other => {
                        return Err(format!(
                            "step {} must be a string or an object with a \"title\", not {other}",
                            i + 1
                        ));
                    }
                };
                if title.trim().is_empty() {
                    return Err(format!("step {} has an empty title", i + 1));
                }
                steps.push(pb::PlanStep {
                    title: clip(&title, MAX_TITLE_CHARS),
                    detail: clip(&detail, MAX_TEXT_CHARS),
                    status: PlanStepStatus::Pending as i32,
                    summary: String::new(),
                });
            }
            Ok(PlanCall::Submit(steps))
        }
        COMPLETE_STEP => {
            let args: CompleteArgs = serde_json::from_str(arguments).map_err(|e| {
                format!(
                    "invalid arguments for complete_step: {e}; expected {{\"status\": \"completed\" or \"failed\", \"summary\": \"...\"}}"
                )
            })?;
            let failed = match args.status.as_str() {
                "completed" => false,
                "failed" => true,
                other => {
                    return Err(format!(
                        "status must be \"completed\" or \"failed\", not {other:?}"
                    ));
                }
            };
            Ok(PlanCall::Complete {
                failed,
                summary: clip(&args.summary, MAX_TEXT_CHARS),
            })
        }
        other => Err(format!("{other} is not a plan tool")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn step(title: &str, status: PlanStepStatus) -> pb::PlanStep {
        pb::PlanStep {
            title: title.into(),
            status: status as i32,
            ..Default::default()
        }
    }

    #[test]
    fn plans_are_read_from_titles_or_objects() {
        let call = parse_call(
            SUBMIT_PLAN,
            r#"{"steps": ["look", {"title": "fix", "detail": "the config"}]}"#,
        )
        .unwrap();
        let PlanCall::Submit(steps) = call else {
            panic!("{call:?}")
        };
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].title, "look");
        assert_eq!(steps[1].detail, "the config");
    }

    #[test]
    fn bad_plans_get_clear_errors() {
        let cases = [
            ("{}", "missing field `steps`"),
            (r#"{"steps": []}"#, "at least one step"),
            (r#"{"steps": ["  "]}"#, "step 1 has an empty title"),
            (r#"{"steps": "do it"}"#, "expected"),
            (
                r#"{"steps": ["a", 7]}"#,
                "step 2 must be a string or an object",
            ),
            (
                r#"{"steps": [{"detail": "x"}]}"#,
                "step 1 has an empty title",
            ),
            ("[1]", "invalid arguments for submit_plan"),
        ];
        for (args, want) in cases {
            let err = parse_call(SUBMIT_PLAN, args).unwrap_err();
            assert!(err.contains(want), "{args}: {err}");
        }
        let many = format!(r#"{{"steps": {:?}}}"#, vec!["x"; 31]);
        assert!(
            parse_call(SUBMIT_PLAN, &many)
                .unwrap_err()
                .contains("at most 30")
        );
    }

    #[test]
    fn extra_fields_are_ignored() {
        let call = parse_call(
            SUBMIT_PLAN,
            r#"{"reasoning": "why", "steps": [{"id": 1, "title": "look"}]}"#,
        )
        .unwrap();
        assert!(matches!(call, PlanCall::Submit(steps) if steps[0].title == "look"));
        assert!(parse_call(COMPLETE_STEP, r#"{"status": "completed", "step": 1}"#).is_ok());
    }

    #[test]
    fn step_outcomes_are_read() {
        assert_eq!(
            parse_call(
                COMPLETE_STEP,
                r#"{"status": "failed", "summary": "no disk"}"#
            )
            .unwrap(),
            PlanCall::Complete {
                failed: true,
                summary: "no disk".into()
            }
        );
        let err = parse_call(COMPLETE_STEP, r#"{"status": "done"}"#).unwrap_err();
        assert!(err.contains("\"completed\" or \"failed\""), "{err}");
        let err = parse_call(COMPLETE_STEP, "").unwrap_err();
        assert!(err.contains("missing field `status`"), "{err}");
    }

    #[test]
    fn a_revision_keeps_completed_steps() {
        let plan = Plan {
            steps: vec![
                step("a", PlanStepStatus::Completed),
                step("b", PlanStepStatus::Failed),
                step("c", PlanStepStatus::Pending),
            ],
            ..Default::default()
        };
        let revised = plan.revised(vec![step("b2", PlanStepStatus::Pending)]);
        let titles: Vec<_> = revised.iter().map(|s| s.title.as_str()).collect();
        assert_eq!(titles, ["a", "b2"]);
    }

    #[test]
    fn guidance_follows_the_stage() {
        let mut plan = Plan::default();
        assert!(
            plan.guidance()
                .contains("submit it with the submit_plan tool")
        );
        plan.submitted(
            &pb::PlanSubmitted {
                steps: vec![
                    step("read", PlanStepStatus::Pending),
                    step("write", PlanStepStatus::Pending),
                ],
                revision: 1,
                reason: String::new(),
            },
            1,
        );
        assert_eq!(plan.next_pending(), Some(0));
        plan.step_updated(
            &pb::PlanStepUpdated {
                index: 0,
                status: PlanStepStatus::InProgress as i32,
                summary: String::new(),
                started: 1,
            },
            1,
        );
        let g = plan.guidance();
        assert!(g.contains("1. [current] read"), "{g}");
        assert!(g.contains("2. [to do] write"), "{g}");
        assert!(g.contains("Carry out step 1 only"), "{g}");
        plan.step_updated(
            &pb::PlanStepUpdated {
                index: 0,
                status: PlanStepStatus::Failed as i32,
                summary: "permission denied".into(),
                started: 1,
            },
            3,
        );
        assert_eq!(plan.stage, Stage::Repairing);
        assert_eq!(plan.stage_start, 3);
        let g = plan.guidance();
        assert!(g.contains("permission denied"), "{g}");
        assert!(g.contains("1. [failed] read -> permission denied"), "{g}");
        assert!(!plan.is_finishing());
    }
}
