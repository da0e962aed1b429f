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
            .list_tools(ListToolsRequest {})
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
    for message in ["how do I run the unit tests?", "hello there"] {
        let turn = send(&mut client, &session.id, message).await;
        let done = finished(&until_finished(&mut events, &turn).await);
        assert_eq!(
            done.outcome,
            TurnOutcome::Completed as i32,
            "{}",
            done.message
        );
    }
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
