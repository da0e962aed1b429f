//! Plan mode.

use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// Plan mode
// ---------------------------------------------------------------------------

pub(super) fn plan_user(text: &str) -> Input {
    Input::UserMessage {
        images: Vec::new(),
        turn_id: TURN.into(),
        text: text.into(),
        approval_mode: ApprovalMode::Policy,
        plan: true,
        network: false,
        budget: None,
    }
}

pub(super) fn submit_plan(id: &str, steps: &[&str]) -> ToolCall {
    call(
        id,
        "submit_plan",
        &serde_json::json!({ "steps": steps }).to_string(),
    )
}

pub(super) fn complete_step(id: &str, status: &str, summary: &str) -> ToolCall {
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

pub(super) fn calls_model(effects: &[Effect]) -> bool {
    effects
        .iter()
        .any(|e| matches!(e, Effect::CallModel { .. }))
}

pub(super) fn outcome_of(effects: &[Effect]) -> Option<pb::TurnFinished> {
    events_of(effects).into_iter().find_map(|k| match k {
        Kind::TurnFinished(f) => Some(f),
        _ => None,
    })
}

pub(super) fn tool_output(effects: &[Effect], call_id: &str) -> String {
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
    assert_eq!(step_statuses(&session.state), ["IN_PROGRESS", "PENDING"]);
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
        ["COMPLETED", "IN_PROGRESS", "PENDING"]
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
