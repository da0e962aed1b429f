//! Request options beyond the conversation: a required tool call, and keys
//! added to every body for a particular server, as the fake server
//! receives them over real HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use agentry_fakes::fake_model::{FakeModel, Reply};
use agentry_llm::{ChatClient, ChatRequest, Message, Provider, ToolDefinition};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use support::{client, config};

fn with_tool(require_tool: bool) -> ChatRequest {
    ChatRequest {
        tools: vec![ToolDefinition {
            name: "list_reminders".into(),
            description: "List reminders.".into(),
            parameters: json!({"type": "object", "properties": {}}),
        }],
        require_tool,
        temperature: Some(0.0),
        ..ChatRequest::new(vec![Message::user("which reminders?")])
    }
}

async fn sent(fake: &FakeModel, client: &ChatClient, request: ChatRequest) -> Value {
    fake.push(Reply::text("ok"));
    let mut stream = client.stream(request).await.unwrap();
    while stream.next().await.is_some() {}
    fake.requests().pop().unwrap()
}

#[tokio::test]
async fn a_required_tool_call_is_asked_for_only_when_tools_are_offered() {
    let fake = FakeModel::start().await.unwrap();
    let client = client(config(&fake, Provider::OpenAi));
    assert_eq!(
        sent(&fake, &client, with_tool(true)).await["tool_choice"],
        "required"
    );
    assert_eq!(
        sent(&fake, &client, with_tool(false))
            .await
            .get("tool_choice"),
        None
    );
    let no_tools = ChatRequest {
        require_tool: true,
        ..ChatRequest::new(vec![Message::user("hi")])
    };
    assert_eq!(
        sent(&fake, &client, no_tools).await.get("tool_choice"),
        None
    );
}

#[tokio::test]
async fn extra_body_keys_reach_the_server() {
    let fake = FakeModel::start().await.unwrap();
    let extra = json!({"max_tokens": 48, "parallel_tool_calls": false, "temperature": 0.7,
                       "options": {"top_k": 20}});
    let Value::Object(extra) = extra else {
        unreachable!()
    };
    let openai = client(config(&fake, Provider::OpenAi)).with_extra_body(extra.clone());
    let body = sent(&fake, &openai, with_tool(true)).await;
    assert_eq!(body["max_tokens"], 48);
    assert_eq!(body["parallel_tool_calls"], false);
    // An extra key replaces the request's own.
    assert_eq!(body["temperature"], 0.7);
    assert_eq!(body["tool_choice"], "required");
    assert_eq!(body["messages"][0]["content"], "which reminders?");

    // Ollama: `options` are merged with the request's own.
    let native = client(config(&fake, Provider::Ollama))
        .with_context_window(4096)
        .with_extra_body(extra);
    let body = sent(&fake, &native, with_tool(false)).await;
    assert_eq!(
        body["options"],
        json!({"temperature": 0.0, "num_ctx": 4096, "top_k": 20})
    );
    assert_eq!(body["max_tokens"], 48);
}
