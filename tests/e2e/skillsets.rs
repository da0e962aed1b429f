//! Skillsets: chosen per user message by intent, recorded as an event, and
//! given to the model for that turn only.

use crate::support::*;
use agentry_proto::sessions::v1::event::Kind;
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Reply;
use pretty_assertions::assert_eq;

fn system_messages(request: &serde_json::Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "system")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chosen_skillset_appears_only_in_that_turn() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "c1",
        "list_dir",
        serde_json::json!({"path": "."}),
    ));
    cluster.model.push(Reply::text("Here is a test plan."));
    cluster.model.push(Reply::text("Hi!"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;

    let turn = send(
        &mut client,
        &session.id,
        "Please write unit tests for the parser and check coverage",
    )
    .await;
    let first = until_finished(&mut events, &turn).await;
    let first_kinds = kinds(&first);
    assert_eq!(
        &first_kinds[..2],
        &["user_message", "skillset_chosen"],
        "{first_kinds:?}"
    );
    let Some(Kind::SkillsetChosen(chosen)) = &first[1].kind else {
        unreachable!()
    };
    assert_eq!(chosen.intent, "testing");
    assert_eq!(chosen.skillset, "testing");
    assert_eq!(chosen.keywords, vec!["tests", "coverage"]);

    let turn = send(&mut client, &session.id, "Hello there!").await;
    let second = until_finished(&mut events, &turn).await;
    assert!(!kinds(&second).contains(&"skillset_chosen"));

    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 3);
    // Both model calls of the first turn carry the skillset, after the
    // system prompt; the next turn's call does not.
    for request in &requests[..2] {
        let system = system_messages(request);
        assert_eq!(system.len(), 2, "{system:?}");
        assert!(
            system[1].contains("You are working on tests."),
            "{}",
            system[1]
        );
    }
    let system = system_messages(&requests[2]);
    assert_eq!(system.len(), 1, "{system:?}");
    assert!(!system[0].contains("You are working on tests."));
}

#[tokio::test(flavor = "multi_thread")]
async fn skillsets_can_be_turned_off() {
    let cluster = Cluster::start_with(|c| c.agent.skillsets = false)
        .await
        .unwrap();
    cluster.model.push(Reply::text("ok"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "write unit tests").await;
    let received = until_finished(&mut events, &turn).await;
    assert!(!kinds(&received).contains(&"skillset_chosen"));
    assert_eq!(system_messages(&cluster.model.requests()[0]).len(), 1);
}
