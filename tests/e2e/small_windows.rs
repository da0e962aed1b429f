//! Small context windows: what every request carries stays small, so the
//! conversation has room.

use crate::support::*;
use agentry_proto::orchestrator::v1::ListToolsRequest;
use agentry_proto::sessions::v1::TurnOutcome;
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Reply;

/// The fixed part of a request at 4,096 tokens with the default tools.
const LEAN_TARGET: u32 = 1_200;

#[tokio::test(flavor = "multi_thread")]
async fn the_fixed_part_at_4096_tokens_stays_under_its_target() {
    // The default profile for phi models (text tool calls, counted by the
    // estimate, which errs high), and a native model counted by a real
    // encoding.
    for (model, native) in [("phi3", false), ("fake-small", true)] {
        let cluster = Cluster::start_with(|c| {
            c.llm.model = model.into();
            if native {
                c.model_profiles[0].pattern = "fake-small".into();
                c.model_profiles[0].native_tools = true;
                c.model_profiles[0].context_window = 4096;
                c.model_profiles[0].tokenizer = "cl100k_base".into();
            }
        })
        .await
        .unwrap();
        let mut client = cluster.orchestrator().await.unwrap();
        let tools = client
            .list_tools(ListToolsRequest::default())
            .await
            .unwrap()
            .into_inner();
        println!(
            "{model}: window {}, fixed part {} tokens, {} tools",
            tools.context_window,
            tools.fixed_tokens,
            tools.tools.len()
        );
        assert_eq!(tools.context_window, 4096, "{model}");
        assert!(tools.lean, "{model}");
        assert!(
            tools.fixed_tokens > 0 && tools.fixed_tokens <= LEAN_TARGET,
            "{model}: {} tokens",
            tools.fixed_tokens
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_small_window_offers_the_tools_the_turns_skillset_needs() {
    let cluster = Cluster::start_with(|c| c.llm.model = "phi3".into())
        .await
        .unwrap();
    cluster
        .model
        .push(Reply::text("Run the tests with cargo test."));
    cluster.model.push(Reply::text("Hello."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    converse(
        &mut client,
        &session.id,
        &mut events,
        &["how do I run the unit tests?", "hello there"],
    )
    .await;
    let requests = cluster.model.requests();
    let system = |i: usize| {
        requests[i]["messages"][0]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // One line per tool, with its arguments.
    let testing = system(0);
    assert!(
        testing.contains("- grep(") && testing.contains("pattern: string"),
        "{testing}"
    );
    assert!(
        testing.contains("- bash(command: string, timeout_secs?: integer): "),
        "{testing}"
    );
    assert!(!testing.contains("- web_fetch("), "{testing}");
    assert!(!testing.contains("JSON schema"), "{testing}");
    // A turn without a skillset gets every tool.
    let plain = system(1);
    assert!(
        plain.contains("- web_fetch(") && plain.contains("- schedule_reminder("),
        "{plain}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_small_profile_answers_with_a_tool_and_keeps_a_long_conversation() {
    use agentry_proto::sessions::v1::event::Kind;
    use agentry_testkit::fake_model::Fallback;
    // phi models: 4,096 tokens, tool calls written as text.
    let cluster = Cluster::start_with(|c| c.llm.model = "phi3".into())
        .await
        .unwrap();
    cluster.model.set_fallback(Fallback::Match {
        rules: vec![
            (
                "Summarise the transcript".into(),
                Reply::text("The person asked for numbers; seq listed them each time."),
            ),
            (
                "Result of tool call".into(),
                Reply::text("Done: the numbers are listed above."),
            ),
        ],
        otherwise: Box::new(Reply::text(
            "I will list them.\nTOOL:bash {\"command\": \"seq 1 300\"}",
        )),
    });
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let mut compactions = Vec::new();
    // Ten questions, each answered with one tool call: twenty messages
    // between the person and the agent, and ten tool exchanges.
    for i in 0..10 {
        let question = format!("question {i}: list the numbers from 1 to 300");
        let turn = send(&mut client, &session.id, &question).await;
        let received = until_finished(&mut events, &turn).await;
        let done = finished(&received);
        assert_eq!(
            done.outcome,
            TurnOutcome::Completed as i32,
            "turn {i}: {}",
            done.message
        );
        assert_eq!(done.steps, 2, "turn {i}: one tool call, then the answer");
        let results = tool_results(&received);
        assert_eq!(results.len(), 1, "turn {i}");
        assert!(
            !results[0].is_error && results[0].output.contains("\n300"),
            "turn {i}"
        );
        let asked_at = received
            .iter()
            .find(|e| matches!(e.kind, Some(Kind::UserMessage(_))))
            .unwrap()
            .seq;
        for event in &received {
            if let Some(Kind::ContextCompacted(c)) = &event.kind {
                // The running question is never summarised.
                assert!(
                    c.last_seq < asked_at,
                    "turn {i}: {c:?} replaced its question"
                );
                compactions.push(c.clone());
            }
        }
    }
    assert!(
        !compactions.is_empty(),
        "the conversation outgrew 4,096 tokens"
    );
    // Every model call of a turn was shown that turn's question, whole.
    for request in cluster.model.requests() {
        let texts: Vec<&str> = request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["content"].as_str())
            .collect();
        if texts.iter().any(|t| t.contains("Summarise the transcript")) {
            continue;
        }
        let question = texts
            .iter()
            .rev()
            .find(|t| t.starts_with("question "))
            .unwrap_or_else(|| panic!("a model call without the question: {texts:?}"));
        assert!(question.ends_with("from 1 to 300"), "{question}");
    }
}
