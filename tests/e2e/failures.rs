//! Model and tool failures end up as information, never as a broken session.

use crate::support::*;
use agentry_proto::sessions::v1::{ErrorSource, TurnOutcome, event::Kind};
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::{Reply, cut, raw, text};
use pretty_assertions::assert_eq;
use serde_json::json;

fn error_message(events: &[agentry_proto::sessions::v1::Event]) -> String {
    events
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::Error(err)) => {
                assert_eq!(err.source, ErrorSource::Model as i32);
                Some(err.message.clone())
            }
            _ => None,
        })
        .expect("an error event")
}

#[tokio::test(flavor = "multi_thread")]
async fn model_failures_end_the_turn_with_a_clear_error_and_the_session_stays_usable() {
    let cluster = Cluster::start().await.unwrap();
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;

    let cases: Vec<(Reply, &str)> = vec![
        (Reply::error(500, "the GPU caught fire"), "HTTP 500"),
        (
            Reply::error(404, "model 'fake-model' not found"),
            "not found",
        ),
        (Reply::stream(vec![text("partial answer"), cut()]), "ended"),
        (Reply::stream(vec![raw("{this is not json")]), "malformed"),
    ];
    for (reply, expected) in cases {
        cluster.model.push(reply);
        let turn = send(&mut client, &session.id, "hello?").await;
        let got = until_finished(&mut events, &turn).await;
        let done = finished(&got);
        assert_eq!(done.outcome, TurnOutcome::Failed as i32, "{got:#?}");
        let message = error_message(&got).to_lowercase();
        assert!(
            message.contains(&expected.to_lowercase()),
            "{message:?} lacks {expected:?}"
        );
    }
    // After all that, the next turn works.
    cluster.model.push(Reply::text("all good now"));
    let turn = send(&mut client, &session.id, "try again").await;
    let got = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&got).outcome, TurnOutcome::Completed as i32);
    assert_eq!(finished(&got).message, "all good now");
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_model_server_is_named_in_the_error() {
    let cluster = Cluster::start_with(|c| c.llm.base_url = "http://127.0.0.1:9/v1".into())
        .await
        .unwrap();
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "anyone there?").await;
    let got = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&got).outcome, TurnOutcome::Failed as i32);
    let message = error_message(&got);
    assert!(message.contains("127.0.0.1:9"), "{message}");
    assert!(message.contains("cannot reach"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_tool_calls_go_back_to_the_model_as_tool_errors() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "c1",
        "launch_rockets",
        json!({"count": 3}),
    ));
    cluster
        .model
        .push(Reply::tool_call("c2", "bash", json!({"cmd": "ls"})));
    cluster.model.push(Reply::tool_call(
        "c3",
        "read_file",
        json!({"path": "../../etc/passwd"}),
    ));
    cluster
        .model
        .push(Reply::tool_call("c4", "bash", json!({"command": "exit 3"})));
    cluster.model.push(Reply::text("I could not do it."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "do things").await;
    let got = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&got).outcome, TurnOutcome::Completed as i32);
    let results = tool_results(&got);
    assert_eq!(results.len(), 4);
    assert!(results.iter().all(|r| r.is_error), "{results:#?}");
    assert!(
        results[0]
            .output
            .contains("unknown tool \"launch_rockets\""),
        "{}",
        results[0].output
    );
    assert!(results[0].output.contains("bash"), "{}", results[0].output);
    assert!(
        results[1].output.contains("command"),
        "{}",
        results[1].output
    );
    assert!(
        results[2].output.contains("outside the workspace"),
        "{}",
        results[2].output
    );
    assert_eq!(results[3].exit_code, Some(3));
    // Each error reached the model as that call's tool message.
    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 5);
    for (i, result) in results.iter().enumerate() {
        let messages = requests[i + 1]["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        assert_eq!(last["role"], "tool");
        assert_eq!(last["tool_call_id"], result.call_id.as_str());
        assert_eq!(last["content"], result.output.as_str());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_that_times_out_or_is_cut_says_so_in_its_result() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "slow",
        "bash",
        json!({"command": "sleep 5", "timeout_secs": 1}),
    ));
    cluster.model.push(Reply::tool_call(
        "loud",
        "bash",
        json!({"command": "head -c 200000 /dev/zero | tr '\\0' x"}),
    ));
    cluster.model.push(Reply::text("done"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "run them").await;
    let got = until_finished(&mut events, &turn).await;
    let results = tool_results(&got);
    assert_eq!(results.len(), 2, "{got:#?}");
    assert!(
        results[0].timed_out && results[0].is_error,
        "{:?}",
        results[0]
    );
    assert!(!results[0].truncated);
    assert!(
        results[1].truncated && !results[1].timed_out,
        "{:?}",
        results[1]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_outage_between_turns_loses_nothing() {
    let mut cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::text("first"));
    cluster.model.push(Reply::text("second"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "one").await;
    until_finished(&mut events, &turn).await;

    // While the store is down, inputs are refused with a clear error.
    cluster
        .stop_service(agentry_testkit::cluster::Service::SessionStore)
        .await
        .unwrap();
    let mut client2 = cluster.orchestrator().await.unwrap();
    let err = client2
        .get_session(agentry_proto::orchestrator::v1::GetSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("session store"), "{}", err.message());
    cluster
        .start_service(agentry_testkit::cluster::Service::SessionStore)
        .await
        .unwrap();

    let mut events = client
        .subscribe(agentry_proto::orchestrator::v1::SubscribeRequest {
            session_id: session.id.clone(),
            from_seq: 1,
            live_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    let turn = send(&mut client, &session.id, "two").await;
    let all = until_finished(&mut events, &turn).await;
    let users: Vec<String> = all
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::UserMessage(m)) => Some(m.text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(users, vec!["one", "two"]);
    assert_eq!(finished(&all).message, "second");
}

/// The store goes away for good while a turn runs: the session's actor
/// cannot record the turn's end and stops; whoever follows the turn is told
/// it ended (or gets an error), never left waiting.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_lost_mid_turn_never_leaves_a_follower_waiting() {
    let mut cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "wait",
        "bash",
        json!({"command": "sleep 1; echo done"}),
    ));
    cluster.model.push(Reply::text("never recorded"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "wait a little").await;
    // The call runs; the store goes away before its result is recorded.
    loop {
        let event = events.message().await.unwrap().unwrap();
        if matches!(event.kind, Some(Kind::ToolCallRequested(_))) {
            break;
        }
    }
    cluster
        .stop_service(agentry_testkit::cluster::Service::SessionStore)
        .await
        .unwrap();
    // The actor retries for its store window (10 s), then stops.
    let end = tokio::time::timeout(std::time::Duration::from_secs(40), async {
        loop {
            match events.message().await {
                Ok(Some(event)) => {
                    if let Some(Kind::TurnFinished(f)) = &event.kind
                        && event.turn_id == turn
                    {
                        return Ok(f.clone());
                    }
                }
                Ok(None) => return Err("the stream ended".to_string()),
                Err(status) => return Err(status.message().to_string()),
            }
        }
    })
    .await
    .expect("the follower was left waiting for 40 s");
    match end {
        Ok(finished) => {
            assert_eq!(finished.outcome, TurnOutcome::Failed as i32, "{finished:?}");
            assert!(
                finished.message.contains("the session stopped"),
                "{}",
                finished.message
            );
        }
        Err(why) => assert!(!why.is_empty()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn model_calls_wait_their_turn_at_max_concurrent_requests() {
    let cluster = Cluster::start_with(|c| c.llm.max_concurrent_requests = 2)
        .await
        .unwrap();
    cluster
        .model
        .set_fallback(agentry_testkit::fake_model::Fallback::Script(vec![
            Reply::text("answered").delay(std::time::Duration::from_millis(400)),
        ]));
    let mut client = cluster.orchestrator().await.unwrap();
    let mut turns = Vec::new();
    for i in 0..5 {
        let (session, events) = new_session(&mut client).await;
        let turn = send(&mut client, &session.id, &format!("question {i}")).await;
        turns.push((events, turn));
    }
    // Every turn is answered; never more than two calls were in flight.
    for (mut events, turn) in turns {
        let done = finished(&until_finished(&mut events, &turn).await);
        assert_eq!(
            done.outcome,
            TurnOutcome::Completed as i32,
            "{}",
            done.message
        );
        assert_eq!(done.message, "answered");
    }
    assert_eq!(cluster.model.request_count(), 5);
    assert_eq!(cluster.model.most_in_flight(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_limit_model_calls_run_side_by_side() {
    let cluster = Cluster::start().await.unwrap();
    cluster
        .model
        .set_fallback(agentry_testkit::fake_model::Fallback::Script(vec![
            Reply::text("answered").delay(std::time::Duration::from_millis(400)),
        ]));
    let mut client = cluster.orchestrator().await.unwrap();
    let mut turns = Vec::new();
    for i in 0..4 {
        let (session, events) = new_session(&mut client).await;
        let turn = send(&mut client, &session.id, &format!("question {i}")).await;
        turns.push((events, turn));
    }
    for (mut events, turn) in turns {
        finished(&until_finished(&mut events, &turn).await);
    }
    assert!(
        cluster.model.most_in_flight() > 2,
        "{}",
        cluster.model.most_in_flight()
    );
}

/// A sub-agent's task whose first events were stored but whose start was
/// reported failed (the store's answer lost on a cut connection): the
/// delegate call ended with an error, and nothing drives the task's turn.
/// Recovery takes it up and cancels it instead of leaving it open.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_left_open_after_its_call_ended_is_cancelled_on_recovery() {
    use agentry_proto::sessions::v1 as spb;
    let mut cluster = Cluster::start_with(|config| {
        config.agents.push(
            serde_json::from_value(json!({
                "name": "reader",
                "description": "Reads files",
                "system_prompt": "Read.",
                "tools": ["read_file"],
            }))
            .unwrap(),
        );
    })
    .await
    .unwrap();
    let mut store = cluster.store().await.unwrap();
    let event = |turn: &str, kind: Kind| spb::Event {
        turn_id: turn.to_string(),
        kind: Some(kind),
        ..Default::default()
    };
    let append = |session: &str, events: Vec<spb::Event>| spb::AppendRequest {
        session_id: session.to_string(),
        expected_seq: 1,
        events,
        lease_epoch: 0,
        ..Default::default()
    };
    // The parent: its delegate call ended with an error.
    let (parent, turn, call) = ("parent-1", "turn-1", "d1");
    store
        .create_session(spb::CreateSessionRequest {
            session_id: parent.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let model = || {
        Kind::ModelMessage(spb::ModelMessage {
            finish_reason: "tool_calls".into(),
            ..Default::default()
        })
    };
    store
        .append(append(
            parent,
            vec![
                event(
                    turn,
                    Kind::UserMessage(spb::UserMessage {
                        text: "delegate".into(),
                        ..Default::default()
                    }),
                ),
                event(turn, model()),
                event(
                    turn,
                    Kind::ToolCallRequested(spb::ToolCallRequested {
                        call_id: call.into(),
                        tool: "delegate".into(),
                        arguments_json: json!({"agent": "reader", "task": "read"}).to_string(),
                        read_only: true,
                        ..Default::default()
                    }),
                ),
                event(
                    turn,
                    Kind::ToolResult(spb::ToolResult {
                        call_id: call.into(),
                        tool: "delegate".into(),
                        output: "error: cannot start the task".into(),
                        is_error: true,
                        ..Default::default()
                    }),
                ),
                event(turn, model()),
                event(turn, Kind::TurnFinished(spb::TurnFinished::default())),
            ],
        ))
        .await
        .unwrap();
    // Its task: stored, its turn open.
    let child = agentry_orchestrator::agents::child_id(parent, turn, 1, call);
    store
        .create_session(spb::CreateSessionRequest {
            session_id: child.clone(),
            parent: Some(spb::SessionParent {
                session_id: parent.into(),
                call_id: call.into(),
                agent: "reader".into(),
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    store
        .append(append(
            &child,
            vec![event(
                "task-turn",
                Kind::UserMessage(spb::UserMessage {
                    text: "read".into(),
                    ..Default::default()
                }),
            )],
        ))
        .await
        .unwrap();

    cluster
        .restart_service(agentry_testkit::cluster::Service::Orchestrator)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let log = read_log(&mut store, &child).await;
        if let Some(done) = log.iter().find_map(|e| match &e.kind {
            Some(Kind::TurnFinished(f)) if e.turn_id == "task-turn" => Some(f.clone()),
            _ => None,
        }) {
            assert_eq!(done.outcome, TurnOutcome::Cancelled as i32, "{done:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the task's turn is still open: {:?}",
            kinds(&log)
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // The parent's log is left as it was.
    assert_eq!(read_log(&mut store, parent).await.len(), 6);
}
