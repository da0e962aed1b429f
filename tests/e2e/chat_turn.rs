//! One complete chat turn across the real services.

use crate::support::*;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{self as spb, TurnOutcome, event::Kind};
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Service;
use agentry_testkit::fake_model::{Reply, finish, text, usage};
use pretty_assertions::assert_eq;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn bash_tool_call_runs_and_its_result_goes_back_to_the_model() {
    let mut cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "call_1",
        "bash",
        json!({"command": "echo $((6*7))"}),
    ));
    cluster.model.push(Reply::stream(vec![
        text("6*7 "),
        text("is "),
        text("42."),
        finish("stop"),
        usage(30, 4),
    ]));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "what is 6*7?").await;
    let received = until_finished(&mut events, &turn).await;

    // Every event, in order, gap-free; the tools the model was offered are
    // recorded before its first call.
    assert_eq!(
        kinds(&received),
        vec![
            "user_message",
            "tools_offered",
            "model_message",
            "tool_call_requested",
            "tool_call_state",
            "tool_call_state",
            "workspace_snapshot",
            "tool_output_chunk",
            "tool_call_state",
            "tool_result",
            "model_text_delta",
            "model_text_delta",
            "model_text_delta",
            "model_message",
            "turn_finished",
        ]
    );
    // The logged ones gap-free; the streamed text live (not in the log),
    // each carrying the seq of the logged event it follows.
    let logged: Vec<u64> = received.iter().filter(|e| !e.live).map(|e| e.seq).collect();
    assert_eq!(logged, (1..=logged.len() as u64).collect::<Vec<_>>());
    for (i, event) in received.iter().enumerate() {
        let delta = kinds(std::slice::from_ref(event)) == ["model_text_delta"];
        assert_eq!(event.live, delta, "event {i}");
        if event.live {
            assert_eq!(event.seq, received[i - 1].seq, "event {i}");
        }
    }
    assert!(
        received
            .iter()
            .all(|e| e.turn_id == turn && e.session_id == session.id)
    );
    assert!(received.iter().all(|e| e.time.is_some()));

    // The tool really ran.
    let results = tool_results(&received);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].output, "42\n");
    assert!(!results[0].is_error);
    assert_eq!(results[0].exit_code, Some(0));
    assert!(
        results[0].runner_id.starts_with("runner-"),
        "{}",
        results[0].runner_id
    );

    // The answer streamed, then the turn completed with usage summed.
    let streamed: String = received
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ModelTextDelta(d)) => Some(d.text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(streamed, "6*7 is 42.");
    let done = finished(&received);
    assert_eq!(done.outcome, TurnOutcome::Completed as i32);
    assert_eq!(done.message, "6*7 is 42.");
    assert_eq!(done.steps, 2);
    let usage = done.usage.unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (40, 9));

    // What the model was sent.
    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 2);
    let tools = offered_tools(&requests[0]);
    assert_eq!(
        tools,
        vec![
            "bash",
            "edit_file",
            "glob",
            "grep",
            "list_dir",
            "read_file",
            "web_crawl",
            "web_fetch",
            "write_file",
            "schedule_reminder",
            "list_reminders",
            "cancel_reminder",
            "recall"
        ]
    );
    // The log says which tools the model had: exactly those it was sent,
    // with their flags, recorded once (both calls had the same).
    let offered: Vec<&spb::ToolsOffered> = received
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ToolsOffered(t)) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(offered.len(), 1);
    let recorded: Vec<&str> = offered[0].tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(recorded, tools);
    for (tool, sent) in offered[0]
        .tools
        .iter()
        .zip(requests[0]["tools"].as_array().unwrap())
    {
        assert_eq!(sent["function"]["description"], tool.description.as_str());
        let schema: serde_json::Value = serde_json::from_str(&tool.parameters_json_schema).unwrap();
        assert_eq!(sent["function"]["parameters"], schema);
    }
    let flags = |name: &str| {
        let t = offered[0].tools.iter().find(|t| t.name == name).unwrap();
        (t.read_only, t.parallel_safe)
    };
    assert!(!flags("bash").0);
    assert!(flags("read_file").0);
    assert_eq!(requests[0]["model"], "fake-model");
    assert_eq!(requests[0]["stream"], true);
    let second = requests[1]["messages"].as_array().unwrap();
    assert_eq!(second.len(), 4);
    assert_eq!(second[0]["role"], "system");
    assert_eq!(
        second[1],
        json!({"role": "user", "content": "what is 6*7?"})
    );
    assert_eq!(second[2]["role"], "assistant");
    assert_eq!(second[2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(second[2]["tool_calls"][0]["function"]["name"], "bash");
    let args: serde_json::Value = serde_json::from_str(
        second[2]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(args, json!({"command": "echo $((6*7))"}));
    assert_eq!(
        second[3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "42\n"})
    );

    // The turn ran bash, so the workspace is recorded once it ended.
    let mut received = received;
    let snapshot = tokio::time::timeout(std::time::Duration::from_secs(10), events.message())
        .await
        .expect("no workspace snapshot after the turn")
        .unwrap()
        .unwrap();
    match &snapshot.kind {
        Some(Kind::WorkspaceSnapshot(w)) => {
            assert_eq!(w.point(), spb::SnapshotPoint::TurnEnd);
            assert!(w.error.is_empty(), "{}", w.error);
        }
        other => panic!("expected the turn-end snapshot, got {other:?}"),
    }
    received.push(snapshot);

    // The log holds exactly what subscribers saw but the streamed text, and
    // survives a restart of the session store.
    received.retain(|e| !e.live);
    let mut store = cluster.store().await.unwrap();
    let stored = read_log(&mut store, &session.id).await;
    assert_eq!(stored, received);
    cluster
        .restart_service(Service::SessionStore)
        .await
        .unwrap();
    let mut store = cluster.store().await.unwrap();
    let reread = read_log(&mut store, &session.id).await;
    assert_eq!(reread, received);
    let listed = client
        .get_session(pb::GetSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.event_count, received.len() as u64);
    assert_eq!(listed.title, "what is 6*7?");
}

#[tokio::test(flavor = "multi_thread")]
async fn conversation_continues_across_an_orchestrator_restart() {
    let mut cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::text("Hello Ada."));
    cluster.model.push(Reply::text("Your name is Ada."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "my name is Ada").await;
    until_finished(&mut events, &turn).await;

    cluster
        .restart_service(Service::Orchestrator)
        .await
        .unwrap();
    let mut client = cluster.orchestrator().await.unwrap();
    let mut events = client
        .subscribe(pb::SubscribeRequest {
            session_id: session.id.clone(),
            from_seq: 1,
            live_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    let turn = send(&mut client, &session.id, "what is my name?").await;
    let all = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&all).message, "Your name is Ada.");
    // The new orchestrator rebuilt the conversation from the log.
    let messages = cluster.model.requests()[1]["messages"].clone();
    assert_eq!(
        messages,
        json!([
            messages[0].clone(),
            {"role": "user", "content": "my name is Ada"},
            {"role": "assistant", "content": "Hello Ada."},
            {"role": "user", "content": "what is my name?"},
        ])
    );
    assert_eq!(messages[0]["role"], "system");
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_stream_attaches_takes_inputs_and_rejects_bad_ones() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::text("hi there"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(pb::ChatRequest {
        kind: Some(pb::chat_request::Kind::Attach(pb::Attach {
            project_dir: String::new(),
            session_id: "chat-1".into(),
            create: true,
            from_seq: 1,
        })),
    })
    .await
    .unwrap();
    let mut responses = client
        .chat(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = responses.message().await.unwrap().unwrap();
    match first.kind {
        Some(pb::chat_response::Kind::Attached(s)) => assert_eq!(s.id, "chat-1"),
        other => panic!("expected attached, got {other:?}"),
    }
    // An empty message is rejected on the stream, which stays open.
    tx.send(pb::ChatRequest {
        kind: Some(pb::chat_request::Kind::Input(user("  "))),
    })
    .await
    .unwrap();
    let rejected = responses.message().await.unwrap().unwrap();
    match rejected.kind {
        Some(pb::chat_response::Kind::Rejected(r)) => {
            assert_eq!(r.code, tonic::Code::InvalidArgument as i32);
            assert!(r.message.contains("empty"), "{}", r.message);
        }
        other => panic!("expected rejected, got {other:?}"),
    }
    tx.send(pb::ChatRequest {
        kind: Some(pb::chat_request::Kind::Input(user("hello"))),
    })
    .await
    .unwrap();
    let mut seen = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(message) = responses.message().await.unwrap() {
            if let Some(pb::chat_response::Kind::Event(e)) = message.kind {
                let last = matches!(e.kind, Some(Kind::TurnFinished(_)));
                seen.push(e);
                if last {
                    break;
                }
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(kinds(&seen).first(), Some(&"user_message"));
    assert_eq!(finished(&seen).message, "hi there");
}

#[tokio::test(flavor = "multi_thread")]
async fn ollama_native_provider_runs_a_tool_turn() {
    // The native API lives at the server root, not under /v1.
    let cluster = Cluster::start_with(|c| {
        c.llm.provider = agentry_runtime::config::LlmProvider::Ollama;
        c.llm.base_url = c.llm.base_url.trim_end_matches("/v1").to_string();
    })
    .await
    .unwrap();
    cluster.model.push(Reply::tool_call(
        "ignored",
        "bash",
        json!({"command": "echo $((6*7))"}),
    ));
    cluster.model.push(Reply::text("It is 42."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "what is 6*7?").await;
    let got = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&got).message, "It is 42.");
    assert_eq!(tool_results(&got)[0].output, "42\n");
    assert_eq!(
        cluster.model.request_paths(),
        vec!["/api/chat", "/api/chat"]
    );
    let second = &cluster.model.requests()[1];
    let messages = second["messages"].as_array().unwrap();
    // Tool call arguments travel as an object on this API.
    assert_eq!(
        messages[2]["tool_calls"][0]["function"]["arguments"],
        json!({"command": "echo $((6*7))"})
    );
    assert_eq!(messages[3]["role"], "tool");
    assert_eq!(messages[3]["content"], "42\n");
}

/// The log says which tools each model call had: with the tool runner down,
/// only the orchestrator's own tools are offered (and recorded); once it is
/// up, the next call offers its tools too, and the change is recorded.
#[tokio::test(flavor = "multi_thread")]
async fn a_change_in_the_tools_offered_is_recorded_before_the_call_that_has_it() {
    let mut cluster = Cluster::start_only(
        &[
            Service::SessionStore,
            Service::Scheduler,
            Service::Orchestrator,
        ],
        |_| {},
    )
    .await
    .unwrap();
    // Nothing listens at the runner's address: calls to it fail at once.
    cluster.release(Service::ToolRunner).unwrap();
    cluster.model.push(Reply::text("hello"));
    cluster.model.push(Reply::text("hello again"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;

    let turn = send(&mut client, &session.id, "hi").await;
    let first = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&first).outcome, TurnOutcome::Completed as i32);
    let offered = |events: &[spb::Event]| -> Vec<Vec<String>> {
        events
            .iter()
            .filter_map(|e| match &e.kind {
                Some(Kind::ToolsOffered(t)) => {
                    Some(t.tools.iter().map(|t| t.name.clone()).collect())
                }
                _ => None,
            })
            .collect()
    };
    let builtins = vec![
        "schedule_reminder",
        "list_reminders",
        "cancel_reminder",
        "recall",
    ];
    assert_eq!(offered(&first), vec![builtins.clone()]);
    let requests = cluster.model.requests();
    assert_eq!(offered_tools(&requests[0]), builtins);

    cluster.start_service(Service::ToolRunner).await.unwrap();
    let turn = send(&mut client, &session.id, "and now?").await;
    let second = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&second).outcome, TurnOutcome::Completed as i32);
    let now = offered(&second);
    assert_eq!(now.len(), 1, "{:?}", kinds(&second));
    assert!(now[0].contains(&"bash".to_string()), "{now:?}");
    let requests = cluster.model.requests();
    assert_eq!(offered_tools(&requests[1]), now[0]);
    // Recorded after the message and before the model's answer.
    let order = kinds(&second);
    let at = |kind: &str| order.iter().position(|k| *k == kind).unwrap();
    assert!(at("user_message") < at("tools_offered"), "{order:?}");
    assert!(at("tools_offered") < at("model_message"), "{order:?}");
}

/// With a price configured for the model, each turn ends with what its
/// model calls cost, cached prompt tokens at their own price.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_ends_with_its_cost_at_the_configured_price() {
    let cluster = Cluster::start_with(|config| {
        config.model_prices = vec![agentry_runtime::config::ModelPrice {
            pattern: "fake-*".into(),
            input: 3.0,
            output: 15.0,
            cached_input: Some(0.3),
            cache_write: None,
            currency: None,
        }];
    })
    .await
    .unwrap();
    cluster.model.push(Reply::stream(vec![
        text("Hello."),
        finish("stop"),
        agentry_testkit::fake_model::usage_cached(10_000, 500, 8_000),
    ]));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "hi").await;
    let received = until_finished(&mut events, &turn).await;
    let done = finished(&received);
    assert_eq!(done.outcome, TurnOutcome::Completed as i32);
    assert_eq!(done.usage.unwrap().cached_prompt_tokens, 8_000);
    // 2,000 uncached × 3 + 8,000 cached × 0.3 + 500 out × 15, per million.
    let expected = (2_000.0 * 3.0 + 8_000.0 * 0.3 + 500.0 * 15.0) / 1e6;
    let cost = done.cost.expect("a priced turn has a cost");
    assert!((cost - expected).abs() < 1e-12, "{cost} vs {expected}");
    assert_eq!(done.currency, "USD");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_required_tool_call_is_asked_for_on_the_first_call_of_each_turn() {
    let cluster = Cluster::start_with(|c| {
        c.llm.tool_choice = agentry_runtime::config::ToolChoice::Required;
        c.llm.extra_body.insert("max_tokens".into(), 64.into());
    })
    .await
    .unwrap();
    cluster
        .model
        .push(Reply::tool_call("call_1", "list_reminders", json!({})));
    cluster.model.push(Reply::text("You have no reminders."));
    cluster.model.push(Reply::text("Hello."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    converse(
        &mut client,
        &session.id,
        &mut events,
        &["which reminders do I have?", "thanks"],
    )
    .await;
    let requests = cluster.model.requests();
    let choices: Vec<Option<&str>> = requests
        .iter()
        .map(|r| r.get("tool_choice").and_then(|c| c.as_str()))
        .collect();
    assert_eq!(choices, [Some("required"), None, Some("required")]);
    assert!(requests.iter().all(|r| r["max_tokens"] == 64));
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_native_provider_runs_a_tool_turn_and_prices_the_cache() {
    use agentry_testkit::fake_model::{tool_call, usage_cache};
    let cluster = Cluster::start_with(|c| {
        c.llm.provider = agentry_runtime::config::LlmProvider::Anthropic;
        c.llm.model = "claude-test".into();
        c.llm.api_key = "sk-ant-test".into();
        c.model_prices = vec![agentry_runtime::config::ModelPrice {
            pattern: "claude-*".into(),
            input: 3.0,
            output: 15.0,
            cached_input: Some(0.3),
            cache_write: Some(3.75),
            currency: None,
        }];
    })
    .await
    .unwrap();
    cluster.model.push(Reply::stream(vec![
        text("Let me compute."),
        tool_call(0, "toolu_01", "bash", &[r#"{"command": "echo $((6*7))"}"#]),
        usage_cache(2_000, 20, 0, 1_800),
    ]));
    cluster.model.push(Reply::stream(vec![
        text("It is 42."),
        finish("stop"),
        usage_cache(2_100, 6, 1_800, 0),
    ]));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "what is 6*7?").await;
    let received = until_finished(&mut events, &turn).await;
    let done = finished(&received);
    assert_eq!(
        done.outcome,
        TurnOutcome::Completed as i32,
        "{}",
        done.message
    );
    assert_eq!(done.message, "It is 42.");
    let results = tool_results(&received);
    assert_eq!(results[0].output.trim(), "42");
    // The second request carried the call and its result as the API wants
    // them (the double refuses anything else).
    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1]["messages"].as_array().unwrap();
    assert_eq!(messages[1]["content"][1]["type"], "tool_use");
    assert_eq!(
        messages[1]["content"][1]["input"],
        json!({"command": "echo $((6*7))"})
    );
    assert_eq!(messages[2]["content"][0]["tool_use_id"], "toolu_01");
    // Usage with cache reads and writes; the cost prices each part:
    // 200 fresh + 1,800 written + 20 out, then 300 fresh + 1,800 read + 6 out.
    let usage = done.usage.unwrap();
    assert_eq!(usage.prompt_tokens, 4_100);
    assert_eq!(usage.cached_prompt_tokens, 1_800);
    assert_eq!(usage.cache_write_prompt_tokens, 1_800);
    let expected =
        (200.0 * 3.0 + 1_800.0 * 3.75 + 20.0 * 15.0 + 300.0 * 3.0 + 1_800.0 * 0.3 + 6.0 * 15.0)
            / 1_000_000.0;
    assert!(
        (done.cost.unwrap() - expected).abs() < 1e-12,
        "{:?}",
        done.cost
    );
}
