//! Context compaction: a conversation that outgrows the model's context
//! window is summarised by the model before the next call; the log keeps
//! every event, and `recall` reads the replaced ones back.

use crate::support::*;
use agentry_proto::sessions::v1::{self as spb, TurnOutcome, event::Kind};
use agentry_runtime::config::ModelProfile;
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Reply;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

/// 20,000 tokens of window, compaction past 80% (16,000 tokens), the last
/// five messages kept. Messages of about 5,000 tokens each make the third
/// turn cross the threshold while the second stays well under it.
async fn small_window_cluster() -> Cluster {
    Cluster::start_with(|c| {
        c.llm.model = "fake-small-window".into();
        c.model_profiles = vec![ModelProfile {
            pattern: "fake-small-*".into(),
            context_window: 20_000,
            tokenizer: "estimate".into(),
            ..ModelProfile::fallback()
        }];
        c.agent.compaction_keep_messages = 5;
    })
    .await
    .unwrap()
}

/// A message of about 5,000 estimated tokens, starting with `marker`.
fn big(marker: &str) -> String {
    format!("{marker} {}", "word ".repeat(5_000))
}

fn compactions(events: &[spb::Event]) -> Vec<spb::ContextCompacted> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ContextCompacted(c)) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

fn contents(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Three turns: the first uses a tool, the third crosses the threshold.
/// Returns the session id, the event stream and every event read.
async fn three_turns(
    cluster: &Cluster,
    summary: Reply,
) -> (
    String,
    tonic::Streaming<spb::Event>,
    Vec<spb::Event>,
    agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient<
        agentry_testkit::cluster::Channel,
    >,
) {
    let model = &cluster.model;
    model.push(Reply::tool_call("call-1", "list_dir", json!({"path": "."})));
    model.push(Reply::text("The workspace is empty."));
    model.push(Reply::text("Noted the second part."));
    model.push(summary);
    model.push(Reply::text("Noted the third part."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let mut all = Vec::new();
    for text in [big("MARK-ONE"), big("MARK-TWO"), big("MARK-THREE")] {
        let turn = send(&mut client, &session.id, &text).await;
        let received = until_finished(&mut events, &turn).await;
        assert_eq!(
            finished(&received).outcome,
            TurnOutcome::Completed as i32,
            "{:?}",
            finished(&received)
        );
        all.extend(received);
    }
    (session.id, events, all, client)
}

#[tokio::test(flavor = "multi_thread")]
async fn compaction_triggers_at_the_threshold_keeps_tool_pairs_and_recall_returns_originals() {
    let cluster = small_window_cluster().await;
    let (session_id, mut events, all, mut client) = three_turns(
        &cluster,
        Reply::text(
            "The person sent a long first part marked MARK-ONE; the agent listed the workspace.",
        ),
    )
    .await;

    // Exactly one compaction, in the third turn, before its model call.
    let found = compactions(&all);
    assert_eq!(found.len(), 1, "{:?}", kinds(&all));
    let c = &found[0];
    assert!(c.note.is_empty(), "{c:?}");
    assert!(c.tokens_before > 16_000, "{c:?}");
    assert!(c.tokens_after <= 16_000, "{c:?}");
    assert!(c.summary.contains("MARK-ONE"), "{c:?}");
    // Keeping five messages would start at the list_dir result: the cut
    // moves back so that the call stays with its result, and only the
    // first message is replaced.
    assert_eq!(c.messages, 1, "{c:?}");
    let first_user = all
        .iter()
        .find(|e| matches!(&e.kind, Some(Kind::UserMessage(m)) if m.text.starts_with("MARK-ONE")))
        .unwrap();
    assert_eq!((c.first_seq, c.last_seq), (first_user.seq, first_user.seq));

    let requests = cluster.model.requests();
    // 3 for turn one and two, then the summary request and the third call.
    assert_eq!(requests.len(), 5);
    // The second turn's request was sent whole.
    assert!(
        contents(&requests[2])
            .iter()
            .any(|m| m.starts_with("MARK-ONE"))
    );
    // The summary request holds the replaced message, and no tools.
    let summary_request = contents(&requests[3]);
    assert!(
        summary_request[1].contains("Person: MARK-ONE"),
        "{:.200}",
        summary_request[1]
    );
    assert!(requests[3].get("tools").is_none());
    // The third call sees the summary in place of the first message, then
    // the call, its result, and the rest in order.
    let third = requests[4]["messages"].as_array().unwrap();
    let roles: Vec<&str> = third.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        [
            "system",
            "system",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
            "user"
        ]
    );
    let summary_message = third[1]["content"].as_str().unwrap();
    assert!(
        summary_message.contains(&format!("events {}–{}", c.first_seq, c.last_seq)),
        "{summary_message}"
    );
    assert_eq!(third[2]["tool_calls"][0]["function"]["name"], "list_dir");
    assert_eq!(third[3]["tool_call_id"], third[2]["tool_calls"][0]["id"]);
    assert!(
        !contents(&requests[4])
            .iter()
            .any(|m| m.starts_with("MARK-ONE"))
    );

    // The log keeps everything.
    let mut store = cluster.store().await.unwrap();
    let log = read_log(&mut store, &session_id).await;
    assert!(
        log.iter().any(
            |e| matches!(&e.kind, Some(Kind::UserMessage(m)) if m.text.starts_with("MARK-ONE"))
        )
    );

    // The model reads the replaced range back with recall.
    cluster.model.push(Reply::tool_call(
        "call-recall",
        "recall",
        json!({"from_seq": c.first_seq, "to_seq": c.last_seq}),
    ));
    cluster.model.push(Reply::text("I have re-read it."));
    let turn = send(&mut client, &session_id, "what did I say first?").await;
    let received = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&received).outcome, TurnOutcome::Completed as i32);
    let results = tool_results(&received);
    assert_eq!(results.len(), 1);
    assert!(!results[0].is_error, "{}", results[0].output);
    assert!(
        results[0]
            .output
            .starts_with(&format!("#{} person: MARK-ONE word word", c.first_seq)),
        "{:.200}",
        results[0].output
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_summary_drops_the_oldest_messages_with_a_note() {
    let cluster = small_window_cluster().await;
    let (_, _, all, _) = three_turns(&cluster, Reply::error(400, "summaries are off today")).await;
    let found = compactions(&all);
    assert_eq!(found.len(), 1, "{:?}", kinds(&all));
    let c = &found[0];
    assert!(c.summary.is_empty(), "{c:?}");
    assert!(c.note.contains("summarising failed"), "{c:?}");
    assert!(c.note.contains("summaries are off today"), "{c:?}");
    assert!(c.tokens_after <= 16_000, "{c:?}");
    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 5);
    let third = contents(&requests[4]);
    assert!(
        third[1].contains("were left out to fit the context window"),
        "{}",
        third[1]
    );
    assert!(!third.iter().any(|m| m.starts_with("MARK-ONE")));
    assert!(third.iter().any(|m| m.starts_with("MARK-THREE")));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_larger_than_the_window_is_shortened_in_the_request_only() {
    let cluster = small_window_cluster().await;
    cluster.model.push(Reply::text("That was long."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let huge = format!("HEAD {} TAIL", "word ".repeat(30_000));
    let turn = send(&mut client, &session.id, &huge).await;
    let received = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&received).outcome, TurnOutcome::Completed as i32);
    // Nothing to summarise (one message): it is shortened for the model...
    assert!(compactions(&received).is_empty());
    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 1);
    let sent = contents(&requests[0]).last().unwrap().clone();
    assert!(sent.starts_with("HEAD word"), "{:.100}", sent);
    assert!(
        sent.ends_with("word  TAIL"),
        "{}",
        &sent[sent.len() - 200..]
    );
    assert!(sent.contains("shortened to fit the context window"));
    assert!(sent.len() < huge.len() / 2, "{}", sent.len());
    // ...and kept whole in the log.
    let mut store = cluster.store().await.unwrap();
    let log = read_log(&mut store, &session.id).await;
    assert!(
        log.iter()
            .any(|e| matches!(&e.kind, Some(Kind::UserMessage(m)) if m.text == huge))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_window_too_small_for_the_instructions_fails_the_turn_clearly() {
    let cluster = Cluster::start_with(|c| {
        c.llm.model = "fake-tiny-window".into();
        c.model_profiles = vec![ModelProfile {
            pattern: "fake-tiny-*".into(),
            context_window: 300,
            tokenizer: "estimate".into(),
            ..ModelProfile::fallback()
        }];
    })
    .await
    .unwrap();
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "hi").await;
    let received = until_finished(&mut events, &turn).await;
    let done = finished(&received);
    assert_eq!(done.outcome, TurnOutcome::Failed as i32);
    assert!(
        done.message
            .contains("more than the model's context window of 300"),
        "{}",
        done.message
    );
    assert!(done.message.contains("model_profiles.context_window"));
    assert_eq!(
        cluster.model.request_count(),
        0,
        "nothing over-long was sent"
    );
}

#[tokio::test]
async fn the_context_window_is_read_from_the_model_server() {
    // No window in the profile; the server (posing as llama.cpp started
    // with a 300-token context) says how much it gives the model.
    let mut cluster = Cluster::start_with(|c| {
        c.model_profiles = vec![ModelProfile {
            tokenizer: "estimate".into(),
            ..ModelProfile::fallback()
        }];
    })
    .await
    .unwrap();
    cluster
        .model
        .set_server(agentry_testkit::fake_model::ServerKind::LlamaCpp { n_ctx: 300 });
    cluster
        .restart_service(agentry_testkit::cluster::Service::Orchestrator)
        .await
        .unwrap();
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "hi").await;
    let done = finished(&until_finished(&mut events, &turn).await);
    assert_eq!(done.outcome, TurnOutcome::Failed as i32);
    assert!(
        done.message
            .contains("context window of 300 (llama.cpp /props"),
        "{}",
        done.message
    );
    assert_eq!(
        cluster.model.request_count(),
        0,
        "nothing over-long was sent"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_server_that_comes_up_later_is_asked_again() {
    // Nothing listens at the model's address when the orchestrator starts.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cluster = Cluster::start_with(|c| {
        c.llm.base_url = format!("http://{addr}/v1");
        c.model_profiles = vec![ModelProfile {
            tokenizer: "estimate".into(),
            ..ModelProfile::fallback()
        }];
    })
    .await
    .unwrap();
    let mut client = cluster.orchestrator().await.unwrap();
    let window =
        |client: &mut agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient<
            _,
        >| {
            let mut client = client.clone();
            async move {
                client
                    .list_tools(agentry_proto::orchestrator::v1::ListToolsRequest::default())
                    .await
                    .unwrap()
                    .into_inner()
                    .context_window
            }
        };
    assert_eq!(
        window(&mut client).await,
        32_768,
        "planned before the server says"
    );
    // The server comes up (posing as llama.cpp with a 300-token context).
    let model = agentry_testkit::FakeModel::start_on(addr).await.unwrap();
    model.set_server(agentry_testkit::fake_model::ServerKind::LlamaCpp { n_ctx: 300 });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while window(&mut client).await != 300 {
        assert!(
            std::time::Instant::now() < deadline,
            "the window was not asked again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Sessions loaded from now on plan for it.
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "hi").await;
    let done = finished(&until_finished(&mut events, &turn).await);
    assert!(
        done.message
            .contains("context window of 300 (llama.cpp /props"),
        "{}",
        done.message
    );
    assert_eq!(model.request_count(), 0);
}
