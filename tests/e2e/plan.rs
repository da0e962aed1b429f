//! Plan mode: the model plans with `submit_plan`, executes step by step,
//! ends each step with `complete_step`; a failed step sends it back to
//! planning with the error, and a safety rail stops a plan that loops.

use crate::support::*;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{
    self as spb, ApprovalDecision, ApprovalMode, PlanStepStatus, TurnOutcome, event::Kind,
};
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Channel;
use agentry_testkit::fake_model::{Fallback, Reply};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use std::time::Duration;

type Client = pb::orchestrator_client::OrchestratorClient<Channel>;

async fn send_plan(
    client: &mut Client,
    session_id: &str,
    text: &str,
    mode: ApprovalMode,
) -> String {
    send_with(client, session_id, text, mode, true).await
}

/// The plan events, as (kind, step index, status name or revision).
fn plan_trail(events: &[spb::Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::PlanSubmitted(p)) => Some(format!(
                "plan r{}: {}",
                p.revision,
                p.steps
                    .iter()
                    .map(|s| s.title.as_str())
                    .collect::<Vec<_>>()
                    .join(" / ")
            )),
            Some(Kind::PlanStepUpdated(u)) => Some(format!(
                "step {} {}",
                u.index + 1,
                PlanStepStatus::try_from(u.status).unwrap().as_str_name()
            )),
            _ => None,
        })
        .collect()
}

fn system_text(request: &Value) -> String {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "system")
        .map(|m| m["content"].as_str().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

fn bash(id: &str, command: &str) -> Reply {
    Reply::tool_call(id, "bash", json!({ "command": command }))
}

fn submit(id: &str, steps: &[&str]) -> Reply {
    Reply::tool_call(id, "submit_plan", json!({ "steps": steps }))
}

fn complete(id: &str, status: &str, summary: &str) -> Reply {
    Reply::tool_call(
        id,
        "complete_step",
        json!({ "status": status, "summary": summary }),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plan_with_a_failing_step_is_repaired_and_completed() {
    let cluster = Cluster::start().await.unwrap();
    let model = &cluster.model;
    model.push(submit("p1", &["show notes.txt", "count its lines"]));
    model.push(bash("b1", "cat notes.txt"));
    model.push(complete("c1", "failed", "notes.txt does not exist"));
    model.push(submit("p2", &["create notes.txt", "count its lines"]));
    model.push(bash("b2", "printf 'a\\nb\\n' > notes.txt"));
    model.push(complete("c2", "completed", "created notes.txt"));
    model.push(bash("b3", "wc -l < notes.txt"));
    model.push(complete("c3", "completed", "it has 2 lines"));
    model.push(Reply::text("notes.txt now exists and has 2 lines."));

    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_plan(
        &mut client,
        &session.id,
        "show notes.txt and count its lines",
        ApprovalMode::Always,
    )
    .await;
    let received = until_finished(&mut events, &turn).await;

    let done = finished(&received);
    assert_eq!(done.outcome, TurnOutcome::Completed as i32, "{done:?}");
    assert_eq!(done.message, "notes.txt now exists and has 2 lines.");
    assert_eq!(
        plan_trail(&received),
        [
            "plan r1: show notes.txt / count its lines",
            "step 1 PLAN_STEP_STATUS_IN_PROGRESS",
            "step 1 PLAN_STEP_STATUS_FAILED",
            "plan r2: create notes.txt / count its lines",
            "step 1 PLAN_STEP_STATUS_IN_PROGRESS",
            "step 1 PLAN_STEP_STATUS_COMPLETED",
            "step 2 PLAN_STEP_STATUS_IN_PROGRESS",
            "step 2 PLAN_STEP_STATUS_COMPLETED",
        ]
    );
    // The revision names the failure it repairs.
    let revision = received
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::PlanSubmitted(p)) if p.revision == 2 => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(revision.reason, "notes.txt does not exist");
    // The tools really ran: the failing cat, then the fix and the count.
    let results = tool_results(&received);
    let bash_results: Vec<_> = results.iter().filter(|r| r.tool == "bash").collect();
    assert_eq!(bash_results.len(), 3);
    assert!(bash_results[0].is_error || bash_results[0].output.contains("No such file"));
    assert_eq!(bash_results[2].output.trim(), "2", "{:?}", bash_results[2]);

    // Each call got the instructions of its stage.
    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 9);
    let tools = offered_tools(&requests[0]);
    assert!(
        tools.contains(&"submit_plan") && tools.contains(&"complete_step"),
        "{tools:?}"
    );
    assert!(system_text(&requests[0]).contains("write a step-by-step plan"));
    assert!(system_text(&requests[1]).contains("Carry out step 1 only"));
    let repair = system_text(&requests[3]);
    assert!(repair.contains("A step of the plan failed"), "{repair}");
    assert!(repair.contains("notes.txt does not exist"), "{repair}");
    assert!(system_text(&requests[6]).contains("Carry out step 2 only"));
    assert!(system_text(&requests[8]).contains("Every step of the plan is done"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_safety_rail_stops_a_looping_plan_after_fifteen_steps() {
    let cluster = Cluster::start().await.unwrap();
    // A model that plans one step, fails it, and plans it again, forever.
    cluster.model.set_fallback(Fallback::Script(vec![
        submit("p", &["try once more"]),
        complete("c", "failed", "still broken"),
    ]));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_plan(&mut client, &session.id, "fix it", ApprovalMode::Always).await;
    let received = until_finished(&mut events, &turn).await;

    let done = finished(&received);
    assert_eq!(done.outcome, TurnOutcome::StepLimit as i32, "{done:?}");
    assert!(
        done.message.contains("safety rail of 15 steps"),
        "{}",
        done.message
    );
    let started: Vec<u32> = received
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::PlanStepUpdated(u)) if u.status == PlanStepStatus::InProgress as i32 => {
                Some(u.started)
            }
            _ => None,
        })
        .collect();
    assert_eq!(started, (1..=15).collect::<Vec<_>>());
    // One plan, fifteen failures each followed by a revision: 31 calls.
    assert_eq!(cluster.model.request_count(), 31);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pending_approval_pauses_the_plan_and_the_answer_resumes_it() {
    let cluster = Cluster::start().await.unwrap();
    let model = &cluster.model;
    model.push(submit("p1", &["write the file"]));
    model.push(Reply::tool_call(
        "w1",
        "write_file",
        json!({"path": "out.txt", "content": "hello"}),
    ));
    model.push(complete("c1", "completed", "wrote out.txt"));
    model.push(Reply::text("Wrote out.txt."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_plan(
        &mut client,
        &session.id,
        "write out.txt",
        ApprovalMode::Policy,
    )
    .await;

    // The plan stops at the approval request.
    let mut seen = Vec::new();
    let request = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let event = events.message().await.unwrap().unwrap();
            seen.push(event.clone());
            if let Some(Kind::ApprovalRequested(r)) = event.kind {
                return r;
            }
        }
    })
    .await
    .expect("no approval was requested");
    assert_eq!(request.tool, "write_file");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        cluster.model.request_count(),
        2,
        "the plan went on without the answer"
    );

    client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::Approval(pb::ApprovalInput {
                    call_id: request.call_id.clone(),
                    decision: ApprovalDecision::Approve as i32,
                    reason: String::new(),
                    edited_arguments_json: String::new(),
                })),
            }),
        })
        .await
        .unwrap();
    let rest = until_finished(&mut events, &turn).await;
    seen.extend(rest);
    let done = finished(&seen);
    assert_eq!(done.outcome, TurnOutcome::Completed as i32, "{done:?}");
    assert_eq!(done.message, "Wrote out.txt.");
    assert_eq!(
        plan_trail(&seen),
        [
            "plan r1: write the file",
            "step 1 PLAN_STEP_STATUS_IN_PROGRESS",
            "step 1 PLAN_STEP_STATUS_COMPLETED",
        ]
    );
    let written = tool_results(&seen)
        .into_iter()
        .find(|r| r.tool == "write_file")
        .unwrap();
    assert!(!written.is_error, "{}", written.output);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_text_only_model_plans_through_the_text_format() {
    let cluster = Cluster::start_with(|c| {
        c.llm.model = "fake-text-planner".into();
        c.model_profiles = vec![agentry_runtime::config::ModelProfile {
            pattern: "fake-text-*".into(),
            native_tools: false,
            ..agentry_runtime::config::ModelProfile::fallback()
        }];
    })
    .await
    .unwrap();
    let model = &cluster.model;
    model.push(Reply::text(
        "My plan:\nTOOL:submit_plan {\"steps\": [\"list the workspace\"]}",
    ));
    model.push(Reply::text("TOOL:list_dir {\"path\": \".\"}"));
    model.push(Reply::text(
        "TOOL:complete_step {\"status\": \"completed\", \"summary\": \"empty\"}",
    ));
    model.push(Reply::text("The workspace is empty."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_plan(
        &mut client,
        &session.id,
        "what is here?",
        ApprovalMode::Always,
    )
    .await;
    let received = until_finished(&mut events, &turn).await;
    let done = finished(&received);
    assert_eq!(done.outcome, TurnOutcome::Completed as i32, "{done:?}");
    assert_eq!(done.message, "The workspace is empty.");
    assert_eq!(
        plan_trail(&received),
        [
            "plan r1: list the workspace",
            "step 1 PLAN_STEP_STATUS_IN_PROGRESS",
            "step 1 PLAN_STEP_STATUS_COMPLETED",
        ]
    );
    // The plan tools were taught in the system prompt.
    let first = system_text(&cluster.model.requests()[0]);
    assert!(first.contains("- submit_plan:"), "{first}");
}
