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
async fn a_message_during_a_turn_steers_it_at_the_next_model_call() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "c1",
        "bash",
        json!({"command": "sleep 1; echo listed"}),
    ));
    cluster
        .model
        .push(Reply::text("done, and the logs are clean"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "list the files").await;
    // Once the command runs, a second message steers the turn.
    let mut seen = Vec::new();
    while let Some(event) = events.message().await.unwrap() {
        let running = matches!(&event.kind, Some(Kind::ToolCallRequested(_)));
        seen.push(event);
        if running {
            break;
        }
    }
    let steered = client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(user("also check the logs")),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(steered.turn_id, turn, "it joins the running turn");
    // A plan needs a turn of its own: refused while one runs.
    let err = client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(user_input(
                "plan it",
                agentry_proto::sessions::v1::ApprovalMode::Always,
                true,
            )),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        agentry_runtime::reasons::reason_of(&err),
        agentry_runtime::reasons::Reason::SessionBusy
    );
    seen.extend(until_finished(&mut events, &turn).await);
    let done = finished(&seen);
    assert_eq!(
        done.outcome,
        TurnOutcome::Completed as i32,
        "{}",
        done.message
    );
    assert_eq!(done.message, "done, and the logs are clean");
    let order: Vec<&str> = kinds(&seen)
        .into_iter()
        .filter(|k| {
            matches!(
                *k,
                "steering_queued" | "steering_delivered" | "tool_result" | "model_message"
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            "model_message",
            "steering_queued",
            "tool_result",
            "steering_delivered",
            "model_message"
        ],
        "{seen:#?}"
    );
    assert!(seen.iter().all(|e| e.turn_id == turn));
    // The model's next call had it, after the command's result.
    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1]["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "user");
    assert_eq!(last["content"], "also check the logs");
    assert_eq!(messages[messages.len() - 2]["role"], "tool");
    assert!(
        !requests[0].to_string().contains("also check the logs"),
        "the first call could not have it"
    );

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

#[tokio::test(flavor = "multi_thread")]
async fn a_message_sent_while_the_model_answers_is_heard_before_the_turn_ends() {
    let cluster = Cluster::start().await.unwrap();
    cluster
        .model
        .push(Reply::text("first answer").delay(Duration::from_millis(800)));
    cluster.model.push(Reply::text("heard you"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "first").await;
    client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(user("and one more thing")),
        })
        .await
        .unwrap();
    let got = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&got).message, "heard you");
    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1]["messages"].as_array().unwrap();
    let n = messages.len();
    assert_eq!(messages[n - 2]["role"], "assistant");
    assert_eq!(messages[n - 2]["content"], "first answer");
    assert_eq!(messages[n - 1]["content"], "and one more thing");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupting_message_cancels_the_turn_and_starts_a_new_one() {
    let cluster = Cluster::start().await.unwrap();
    cluster
        .model
        .push(Reply::text("never finished").delay(Duration::from_secs(3)));
    cluster.model.push(Reply::text("the new answer"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let first = send(&mut client, &session.id, "first").await;
    let mut input = user("instead, this");
    if let Some(pb::input::Kind::UserMessage(m)) = input.kind.as_mut() {
        m.interrupt = true;
    }
    let second = client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(input),
        })
        .await
        .unwrap()
        .into_inner()
        .turn_id;
    assert_ne!(second, first);
    let got = until_finished(&mut events, &first).await;
    assert_eq!(finished(&got).outcome, TurnOutcome::Cancelled as i32);
    let got = until_finished(&mut events, &second).await;
    let done = finished(&got);
    assert_eq!(
        done.outcome,
        TurnOutcome::Completed as i32,
        "{}",
        done.message
    );
    assert_eq!(done.message, "the new answer");
    // Interrupting an idle session simply starts a turn.
    cluster.model.push(Reply::text("idle answer"));
    let mut input = user("on an idle session");
    if let Some(pb::input::Kind::UserMessage(m)) = input.kind.as_mut() {
        m.interrupt = true;
    }
    let third = client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(input),
        })
        .await
        .unwrap()
        .into_inner()
        .turn_id;
    let got = until_finished(&mut events, &third).await;
    assert_eq!(finished(&got).message, "idle answer");
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

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_a_spending_limit_stops_at_once_is_named_in_the_submit_answer() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.set_fallback(Fallback::Echo);
    cluster.model.push(Reply::stream(vec![
        agentry_testkit::fake_model::text("spent"),
        agentry_testkit::fake_model::usage(500, 500),
        agentry_testkit::fake_model::finish("stop"),
    ]));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    // A session limit of 10 tokens: the first turn spends past it.
    let mut input = user("spend");
    if let Some(pb::input::Kind::UserMessage(message)) = &mut input.kind {
        message.budget = Some(agentry_proto::sessions::v1::Budget {
            session_tokens: 10,
            ..Default::default()
        });
    }
    let first = client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(input),
        })
        .await
        .unwrap()
        .into_inner()
        .turn_id;
    until_finished(&mut events, &first).await;

    // The next turn starts and stops at the limit within one step: the
    // answer still names it, so the client can follow it.
    let second = send(&mut client, &session.id, "again").await;
    assert!(!second.is_empty(), "the answer names no turn");
    assert_ne!(second, first);
    let received = until_finished(&mut events, &second).await;
    assert!(
        received
            .iter()
            .any(|e| e.turn_id == second && matches!(e.kind, Some(Kind::BudgetExceeded(_)))),
        "{:?}",
        kinds(&received)
    );
    // It never reached the model: it ended in the step that started it.
    assert_eq!(cluster.model.request_count(), 1);
}
