//! The fake model's control API, used by tests that drive it from outside
//! (the container end-to-end test queues replies with it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_testkit::fake_model::FakeModel;
use serde_json::{Value, json};

#[tokio::test]
async fn replies_are_queued_over_http_and_bad_scripts_refused() {
    let model = FakeModel::start().await.unwrap();
    let root = model.root_url();
    let http = reqwest::Client::new();

    let queued: Value = http
        .post(format!("{root}/_fake/replies"))
        .json(&json!([
            {"tool_call": {"name": "bash", "arguments": {"command": "echo hi"}}},
            {"text": "done"}
        ]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(queued, json!({"queued": 2, "pending": 2}));
    assert_eq!(model.pending(), 2);

    let bad = http
        .post(format!("{root}/_fake/replies"))
        .json(&json!([{"nope": 1}]))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("reply 0"), "{message}");
    assert_eq!(model.pending(), 2, "a bad script queues nothing");

    // The queued replies answer the next model calls, in order.
    let answer = http
        .post(format!("{}/chat/completions", model.base_url()))
        .json(
            &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(answer.contains("\"bash\""), "{answer}");
    let counts: Value = http
        .get(format!("{root}/_fake/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(counts, json!({"requests": 1, "pending": 1}));
}
