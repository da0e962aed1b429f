//! Step limit, busy sessions and cancellation.

use crate::support::*;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{TurnOutcome, event::Kind};
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::{Fallback, Reply};
use pretty_assertions::assert_eq;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread")]
async fn a_model_that_never_stops_calling_tools_hits_the_step_limit() {
    let cluster = Cluster::start_with(|c| c.agent.max_steps = 3)
        .await
        .unwrap();
    cluster
        .model
        .set_fallback(Fallback::Script(vec![Reply::tool_call(
            "again",
            "bash",
            json!({"command": "true"}),
        )]));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "loop forever").await;
    let got = until_finished(&mut events, &turn).await;
    let done = finished(&got);
    assert_eq!(done.outcome, TurnOutcome::StepLimit as i32);
    assert_eq!(done.steps, 3);
    assert!(done.message.contains("step limit"), "{}", done.message);
    assert_eq!(cluster.model.requests().len(), 3);
    assert_eq!(tool_results(&got).len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_repeating_one_call_is_told_then_stopped() {
    let cluster = Cluster::start().await.unwrap();
    cluster
        .model
        .set_fallback(Fallback::Script(vec![Reply::tool_call(
            "again",
            "bash",
            json!({"command": "echo same"}),
        )]));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "loop forever").await;
    let got = until_finished(&mut events, &turn).await;
    let loops: Vec<(u32, bool)> = got
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::LoopDetected(l)) => Some((l.repeats, l.stopped)),
            _ => None,
        })
        .collect();
    assert_eq!(loops, [(3, false), (4, true)]);
    let results = tool_results(&got);
    // Two ran; the third told the model; the fourth was not run.
    assert_eq!(results.len(), 4);
    assert_eq!(results[0].output.trim(), "same");
    assert!(results[2].is_error && results[2].output.contains("call number 3 of bash"));
    assert!(results[3].output.starts_with("not run: stopped"));
    let done = finished(&got);
    assert_eq!(done.outcome, TurnOutcome::Failed as i32);
    assert!(
        done.message
            .contains("asked for the same bash call 4 times"),
        "{}",
        done.message
    );
    // The model saw why, before it was stopped.
    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 4);
    assert!(
        requests[3]
            .to_string()
            .contains("its result would be the same")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_message_during_a_turn_is_refused() {
    let cluster = Cluster::start().await.unwrap();
    cluster
        .model
        .push(Reply::text("slow answer").delay(Duration::from_millis(800)));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "first").await;
    let err = client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(user("second")),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        agentry_runtime::reasons::reason_of(&err),
        agentry_runtime::reasons::Reason::SessionBusy
    );
    assert!(
        err.message().contains("already running"),
        "{}",
        err.message()
    );
    let got = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&got).message, "slow answer");
    // Bad inputs are refused up front.
    for (input, code) in [
        (None, tonic::Code::InvalidArgument),
        (Some(user("")), tonic::Code::InvalidArgument),
        (
            Some(user(&"x".repeat(2 * 1024 * 1024))),
            tonic::Code::InvalidArgument,
        ),
    ] {
        let err = client
            .submit(pb::SubmitRequest {
                session_id: session.id.clone(),
                input,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{}", err.message());
    }
    let err = client
        .submit(pb::SubmitRequest {
            session_id: "no-such-session".into(),
            input: Some(user("hi")),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{}", err.message());
}

/// The pid of a live process whose command line is exactly `cmdline`.
fn process_with_cmdline(cmdline: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == cmdline.as_bytes())
                && process_alive(*pid)
        })
}

fn process_alive(pid: u32) -> bool {
    // A killed process that nobody has reaped yet is a zombie: dead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_kills_the_running_tool_and_the_session_carries_on() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "long",
        "bash",
        json!({"command": "sleep 4731 & echo started; wait"}),
    ));
    cluster.model.push(Reply::text("next answer"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "run something long").await;
    // Wait until the command is running.
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(e) = events.message().await.unwrap() {
            let started =
                matches!(&e.kind, Some(Kind::ToolOutputChunk(c)) if c.text.contains("started"));
            seen.push(e);
            if started {
                return;
            }
        }
    })
    .await
    .unwrap();
    // The command runs in its own pid namespace: find its background child
    // as this machine numbers it.
    let pid = process_with_cmdline("sleep\u{0}4731\u{0}").expect("the background sleep runs");
    assert!(process_alive(pid));

    let started = Instant::now();
    let cancelled = client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::Cancel(pb::CancelInput {
                    reason: "changed my mind".into(),
                })),
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        cancelled.turn_id, turn,
        "the cancel reports the turn it ended"
    );
    let rest = until_finished(&mut events, &turn).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the cancel took {:?}",
        started.elapsed()
    );
    assert_eq!(finished(&rest).outcome, TurnOutcome::Cancelled as i32);
    assert_eq!(
        kinds(&rest),
        vec![
            "cancel_requested",
            "tool_call_state",
            "tool_result",
            "turn_finished"
        ]
    );
    assert!(tool_results(&rest)[0].is_error);
    // The background child of the killed command is gone too.
    // Killed within a second of the cancel.
    let deadline = started + Duration::from_secs(1);
    while process_alive(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !process_alive(pid),
        "process {pid} outlived the cancelled call"
    );

    // Cancelling with nothing running is refused; the next turn works.
    let err = client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::Cancel(pb::CancelInput::default())),
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    let turn = send(&mut client, &session.id, "and now?").await;
    let got = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&got).message, "next answer");
    // The model saw the cancelled call answered with an error.
    let last = &cluster.model.requests()[1]["messages"];
    let tool_msg = last
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert_eq!(tool_msg["tool_call_id"], "long");
}
