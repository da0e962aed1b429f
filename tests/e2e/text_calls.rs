//! Models without native tool calling: tools described in the system
//! prompt, calls read from the answer's text, one correction for a call
//! that cannot be read.

use crate::support::*;
use agentry_proto::sessions::v1::{TurnOutcome, event::Kind};
use agentry_runtime::config::ModelProfile;
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Reply;
use pretty_assertions::assert_eq;

async fn text_only_cluster() -> Cluster {
    Cluster::start_with(|c| {
        c.llm.model = "fake-text-model".into();
        c.model_profiles = vec![ModelProfile {
            pattern: "fake-text-*".into(),
            native_tools: false,
            ..ModelProfile::fallback()
        }];
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_text_only_model_completes_a_tool_using_turn() {
    let cluster = text_only_cluster().await;
    cluster.model.push(Reply::text(
        "I will look at the workspace.\nTOOL:list_dir {\"path\": \".\"}",
    ));
    cluster.model.push(Reply::text("The workspace is empty."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "what is in the workspace?").await;
    let received = until_finished(&mut events, &turn).await;

    let done = finished(&received);
    assert_eq!(done.outcome, TurnOutcome::Completed as i32, "{done:?}");
    assert_eq!(done.message, "The workspace is empty.");
    let results = tool_results(&received);
    assert_eq!(results.len(), 1, "{received:#?}");
    assert_eq!(results[0].tool, "list_dir");
    assert!(!results[0].is_error, "{}", results[0].output);
    let requested: Vec<_> = received
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ToolCallRequested(c)) => Some(c.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(requested.len(), 1);
    assert_eq!(requested[0].arguments_json, r#"{"path":"."}"#);

    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 2);
    // No native tools offered; the system prompt teaches the format.
    assert!(requests[0].get("tools").is_none(), "{}", requests[0]);
    let system = requests[0]["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("TOOL:<tool name>"), "{system}");
    assert!(system.contains("- list_dir:"), "{system}");
    // The call and its result go back as plain messages.
    let second = requests[1]["messages"].as_array().unwrap();
    let n = second.len();
    assert_eq!(second[n - 2]["role"], "assistant");
    assert!(
        second[n - 2]["content"]
            .as_str()
            .unwrap()
            .contains("TOOL:list_dir {\"path\":\".\"}"),
        "{}",
        second[n - 2]
    );
    assert!(second[n - 2].get("tool_calls").is_none());
    assert_eq!(second[n - 1]["role"], "user");
    assert!(
        second[n - 1]["content"]
            .as_str()
            .unwrap()
            .starts_with("Result of tool call text-"),
        "{}",
        second[n - 1]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_call_gets_one_correction() {
    let cluster = text_only_cluster().await;
    cluster.model.push(Reply::text("TOOL:list_dir {\"path\": "));
    cluster
        .model
        .push(Reply::text("TOOL:list_dir {\"path\": \".\"}"));
    cluster.model.push(Reply::text("Listed."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "list").await;
    let received = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&received).outcome, TurnOutcome::Completed as i32);
    assert_eq!(tool_results(&received).len(), 1);
    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 3);
    let correction = requests[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(correction["role"], "user");
    assert!(
        correction["content"]
            .as_str()
            .unwrap()
            .contains("could not be read"),
        "{correction}"
    );
    // The unreadable answer is in the log with its reason and tokens, and
    // they count with the turn's (10 + 2, then 10 + 3, then the answer).
    let unreadable: Vec<_> = received
        .iter()
        .filter_map(|e| match &e.kind {
            Some(agentry_proto::sessions::v1::event::Kind::ToolCallUnreadable(u)) => Some(u),
            _ => None,
        })
        .collect();
    assert_eq!(unreadable.len(), 1, "{received:?}");
    assert_eq!(unreadable[0].text, "TOOL:list_dir {\"path\": ");
    assert_eq!(unreadable[0].attempt, 1);
    assert!(!unreadable[0].error.is_empty());
    let spent = unreadable[0].usage.unwrap();
    assert_eq!((spent.prompt_tokens, spent.completion_tokens), (10, 2));
    let first = received
        .iter()
        .find_map(|e| match &e.kind {
            Some(agentry_proto::sessions::v1::event::Kind::ModelMessage(m)) => m.usage,
            _ => None,
        })
        .unwrap();
    assert_eq!((first.prompt_tokens, first.completion_tokens), (10, 3));
    let answered: u64 = received
        .iter()
        .filter_map(|e| match &e.kind {
            Some(agentry_proto::sessions::v1::event::Kind::ModelMessage(m)) => m.usage,
            _ => None,
        })
        .map(|u| u.completion_tokens)
        .sum();
    let total = finished(&received).usage.unwrap();
    assert_eq!(total.completion_tokens, 2 + answered);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_still_malformed_after_the_correction_fails_the_turn_clearly() {
    let cluster = text_only_cluster().await;
    cluster.model.push(Reply::text("TOOL:list_dir [1]"));
    cluster.model.push(Reply::text("TOOL:nonexistent {}"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "list").await;
    let received = until_finished(&mut events, &turn).await;
    let done = finished(&received);
    assert_eq!(done.outcome, TurnOutcome::Failed as i32);
    assert!(
        done.message
            .contains("could not be read, even after being shown the format")
            && done.message.contains("no tool named \"nonexistent\""),
        "{}",
        done.message
    );
    assert!(tool_results(&received).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_native_model_that_writes_a_call_as_text_is_understood_too() {
    let cluster = Cluster::start().await.unwrap();
    cluster
        .model
        .push(Reply::text("TOOL:list_dir {\"path\": \".\"}"));
    cluster.model.push(Reply::text("Nothing there."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "list").await;
    let received = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&received).message, "Nothing there.");
    assert_eq!(tool_results(&received)[0].tool, "list_dir");
    // Native tools stay offered.
    assert!(cluster.model.requests()[0].get("tools").is_some());
}
