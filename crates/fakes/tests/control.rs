//! The fake model's control API, used by tests that drive it from outside
//! (the container end-to-end test queues replies with it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_fakes::fake_model::{FakeModel, Fallback};
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

#[tokio::test]
async fn tool_then_text_gives_every_conversation_a_react_turn() {
    let model = FakeModel::start().await.unwrap();
    model.set_fallback(Fallback::ToolThenText {
        tool: "read_file".into(),
        arguments: json!({"path": "small.txt"}),
        text: "done".into(),
    });
    let http = reqwest::Client::new();
    let ask = |messages: Value| {
        let http = http.clone();
        let url = format!("{}/chat/completions", model.base_url());
        async move {
            http.post(url)
                .json(&json!({"model": "m", "stream": true, "messages": messages}))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let first = ask(json!([{"role": "user", "content": "read it"}])).await;
    // The arguments arrive in fragments; the name whole.
    assert!(first.contains("\"name\":\"read_file\""), "{first}");
    assert!(
        first.contains("\"finish_reason\":\"tool_calls\""),
        "{first}"
    );
    let second = ask(json!([
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "hello"}
    ]))
    .await;
    let text: String = second
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "done", "{second}");
    assert!(!second.contains("tool_calls"), "{second}");
}
