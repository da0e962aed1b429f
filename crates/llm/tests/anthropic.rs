//! The chat client speaking Anthropic's Messages API to the fake server's
//! double of it (which refuses what the real API refuses), over real HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use agentry_fakes::fake_model::{
    FakeModel, Reply, finish, raw, text, tool_call, usage, usage_cache,
};
use agentry_llm::{
    ChatClient, ChatRequest, Completion, LlmError, Message, Provider, ProviderConfig, ToolCall,
    ToolDefinition, Usage,
};
use pretty_assertions::assert_eq;
use serde_json::json;
use support::{client, header, retrying, run_err, run_ok};

fn anthropic(cfg: ProviderConfig) -> ChatClient {
    let mut cfg = cfg;
    cfg.api_key = Some("sk-ant-test".into());
    cfg.model = "claude-test".into();
    client(cfg)
}

fn claude(fake: &FakeModel) -> ChatClient {
    anthropic(support::config(fake, Provider::Anthropic))
}

fn bash() -> ToolDefinition {
    ToolDefinition {
        name: "bash".into(),
        description: "Run a command.".into(),
        parameters: json!({"type": "object", "properties": {"command": {"type": "string"}},
                           "required": ["command"]}),
    }
}

/// A conversation with a tool exchange, as the orchestrator sends it.
fn with_history() -> ChatRequest {
    ChatRequest {
        tools: vec![bash()],
        ..ChatRequest::new(vec![
            Message::system("You are careful."),
            Message::user("what is here?"),
            Message::Assistant {
                content: "Let me look.".into(),
                tool_calls: vec![ToolCall {
                    id: "toolu_01".into(),
                    name: "bash".into(),
                    arguments: r#"{"command": "ls"}"#.into(),
                }],
            },
            Message::tool("toolu_01", "a.txt\nb.txt"),
        ])
    }
}

#[tokio::test]
async fn text_streams_with_usage_including_the_prompt_cache() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("Two "),
        text("files."),
        finish("stop"),
        usage_cache(1_200, 9, 1_000, 150),
    ]));
    let (deltas, completion) = run_ok(&claude(&fake), with_history()).await;
    assert_eq!(deltas, ["Two ", "files."]);
    assert_eq!(
        completion,
        Completion {
            text: "Two files.".into(),
            tool_calls: Vec::new(),
            finish_reason: "stop".into(),
            usage: Some(Usage {
                prompt_tokens: 1_200,
                completion_tokens: 9,
                total_tokens: 1_209,
                cached_prompt_tokens: 1_000,
                cache_write_tokens: 150,
            }),
            model: "claude-test".into(),
        }
    );
    // The wire: the key in x-api-key, the API version, no bearer token.
    let headers = &fake.request_headers()[0];
    assert_eq!(header(headers, "x-api-key"), Some("sk-ant-test"));
    assert_eq!(header(headers, "anthropic-version"), Some("2023-06-01"));
    assert_eq!(header(headers, "authorization"), None);
    assert_eq!(fake.request_paths(), ["/v1/messages"]);
    let body = &fake.requests()[0];
    assert_eq!(
        body["system"][0]["cache_control"],
        json!({"type": "ephemeral"})
    );
    assert_eq!(
        body["tools"][0]["cache_control"],
        json!({"type": "ephemeral"})
    );
    assert_eq!(body["messages"][2]["content"][0]["type"], "tool_result");
}

#[tokio::test]
async fn tool_use_blocks_become_calls_with_their_input_assembled() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("Checking."),
        tool_call(0, "toolu_9", "bash", &["{\"comm", "and\": \"ls -l\"}"]),
        tool_call(1, "toolu_10", "bash", &[]),
        usage(40, 12),
    ]));
    let request = ChatRequest {
        tools: vec![bash()],
        require_tool: true,
        ..ChatRequest::new(vec![Message::user("list")])
    };
    let (deltas, completion) = run_ok(&claude(&fake), request).await;
    assert_eq!(deltas, ["Checking."]);
    assert_eq!(completion.finish_reason, "tool_calls");
    assert_eq!(
        completion.tool_calls,
        [
            ToolCall {
                id: "toolu_9".into(),
                name: "bash".into(),
                arguments: r#"{"command": "ls -l"}"#.into(),
            },
            ToolCall {
                id: "toolu_10".into(),
                name: "bash".into(),
                arguments: "{}".into(),
            },
        ]
    );
    assert_eq!(fake.requests()[0]["tool_choice"], json!({"type": "any"}));
}

#[tokio::test]
async fn overloads_and_rate_limits_are_retried_honouring_retry_after() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(
        Reply::error(429, "Number of request tokens has exceeded your rate limit").retry_after(1),
    );
    fake.push(Reply::error(529, "Overloaded"));
    // An overload reported as the stream's first event is retried too.
    fake.push(Reply::stream(vec![raw(
        r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
    )]));
    fake.push(Reply::text("fine"));
    let client = anthropic(retrying(&fake, Provider::Anthropic, 3));
    let started = std::time::Instant::now();
    let (_, completion) = run_ok(&client, with_history()).await;
    assert_eq!(completion.text, "fine");
    assert_eq!(fake.request_count(), 4);
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(1),
        "retry-after"
    );
}

#[tokio::test]
async fn errors_say_what_the_api_said() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(
        400,
        "prompt is too long: 210000 tokens > 200000 maximum",
    ));
    let Err(err) = claude(&fake).stream(with_history()).await else {
        panic!("the request succeeded");
    };
    match err {
        LlmError::Http { status, message } => {
            assert_eq!(status, 400);
            assert!(message.contains("prompt is too long"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // A missing key is the API's 401.
    let fake = FakeModel::start().await.unwrap();
    let mut cfg = support::config(&fake, Provider::Anthropic);
    cfg.model = "claude-test".into();
    let Err(err) = client(cfg).stream(with_history()).await else {
        panic!("the request succeeded");
    };
    assert!(matches!(err, LlmError::Http { status: 401, .. }), "{err:?}");
    // An error after the answer began ends the stream with it.
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("Hal"),
        raw(r#"{"type": "error", "error": {"type": "api_error", "message": "Internal error"}}"#),
    ]));
    let (deltas, err) = run_err(&claude(&fake), with_history()).await;
    assert_eq!(deltas, ["Hal"]);
    assert!(err.to_string().contains("Internal error"), "{err}");
}

#[tokio::test]
async fn a_long_conversation_is_one_the_api_accepts() {
    // Summaries and instructions as system messages anywhere, an empty
    // answer, several results of one response, a conversation that the
    // agent begins (after a compaction): the double refuses what the API
    // refuses, so a reply means the shape was right.
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::text("ok"));
    let request = ChatRequest {
        tools: vec![bash()],
        ..ChatRequest::new(vec![
            Message::system("You are careful."),
            Message::system("[Summary of the earlier conversation]"),
            Message::assistant(""),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![
                    ToolCall {
                        id: "a".into(),
                        name: "bash".into(),
                        arguments: String::new(),
                    },
                    ToolCall {
                        id: "b".into(),
                        name: "bash".into(),
                        arguments: "{broken".into(),
                    },
                ],
            },
            Message::tool("a", ""),
            Message::tool("b", "done"),
            Message::user("and now?"),
        ])
    };
    let (_, completion) = run_ok(&claude(&fake), request).await;
    assert_eq!(completion.text, "ok");
}
