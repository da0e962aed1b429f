//! The chat client speaking Ollama's native `/api/chat` to the testkit's fake server, over real
//! HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use agentry_fakes::fake_model::{
    FakeModel, Fallback, Reply, cut, finish, pause, raw, text, tool_call, usage,
};
use agentry_llm::{
    ChatClient, ChatRequest, Completion, LlmError, Message, Provider, StreamEvent, ToolCall,
    ToolDefinition, Usage,
};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use support::{client, collect, config, header, hello, run_err, run_ok};

fn ollama(fake: &FakeModel) -> ChatClient {
    client(config(fake, Provider::Ollama))
}

#[tokio::test]
async fn text_deltas_stream_in_order_then_completed_with_usage() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("Hel"),
        text("lo"),
        text(""),
        text(", world"),
        finish("stop"),
        usage(7, 3),
    ]));
    let (deltas, completion) = run_ok(&ollama(&fake), hello()).await;
    assert_eq!(deltas, vec!["Hel", "lo", ", world"]);
    assert_eq!(
        completion,
        Completion {
            text: "Hello, world".into(),
            tool_calls: vec![],
            finish_reason: "stop".into(),
            usage: Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 3,
                total_tokens: 10,
                cached_prompt_tokens: 0,
                cache_write_tokens: 0,
            }),
            model: "test-model".into(),
        }
    );
    assert_eq!(fake.request_paths(), vec!["/api/chat"]);
}

#[tokio::test]
async fn deltas_are_yielded_before_the_stream_finishes() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("first"),
        pause(Duration::from_millis(400)),
        text(" second"),
        finish("stop"),
    ]));
    let mut stream = ollama(&fake).stream(hello()).await.unwrap();
    let first = tokio::time::timeout(Duration::from_millis(300), stream.next())
        .await
        .expect("the first delta must not wait for the rest of the stream");
    assert_eq!(
        first.unwrap().unwrap(),
        StreamEvent::TextDelta("first".into())
    );
    let rest: Vec<StreamEvent> = collect(stream)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rest[0], StreamEvent::TextDelta(" second".into()));
    let StreamEvent::Completed(c) = &rest[1] else {
        panic!("expected Completed, got {:?}", rest[1]);
    };
    assert_eq!(c.text, "first second");
    assert_eq!(c.usage, None, "no usage was scripted");
}

#[tokio::test]
async fn finish_reason_and_usage_come_from_the_done_line() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("cut short"),
        finish("length"),
        usage(120, 4096),
    ]));
    fake.push(Reply::text("Fine thanks"));
    let client = ollama(&fake);
    let (_, completion) = run_ok(&client, hello()).await;
    assert_eq!(completion.finish_reason, "length");
    assert_eq!(
        completion.usage,
        Some(Usage {
            prompt_tokens: 120,
            completion_tokens: 4096,
            total_tokens: 4216,
            cached_prompt_tokens: 0,
            cache_write_tokens: 0,
        })
    );
    let (deltas, completion) = run_ok(&client, hello()).await;
    assert!(deltas.len() > 1, "{deltas:?}");
    assert_eq!(completion.text, "Fine thanks");
    assert_eq!(completion.finish_reason, "stop");
    assert_eq!(completion.usage.map(|u| u.completion_tokens), Some(2));
}

#[tokio::test]
async fn completion_reports_the_model_named_by_the_server() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        raw(r#"{"model":"llama3.2:1b","created_at":"2024-01-01T00:00:00Z","message":{"role":"assistant","content":"hi"},"done":false}"#),
        finish("stop"),
    ]));
    let (deltas, completion) = run_ok(&ollama(&fake), hello()).await;
    assert_eq!(deltas, vec!["hi"]);
    assert_eq!(completion.model, "llama3.2:1b");
}

#[tokio::test]
async fn tool_call_round_trip() {
    let fake = FakeModel::start().await.unwrap();
    let args = json!({"path": "a.txt", "max_lines": 40});
    fake.push(Reply::tool_call(
        "ignored-by-ollama",
        "read_file",
        args.clone(),
    ));
    fake.push(Reply::text("It says hello."));
    let client = ollama(&fake);
    let read_file = ToolDefinition {
        name: "read_file".into(),
        description: "Read a file".into(),
        parameters: json!({
            "type": "object",
            "properties": {"path": {"type": "string"}, "max_lines": {"type": "integer"}},
            "required": ["path"],
        }),
    };
    let mut req = ChatRequest::new(vec![
        Message::system("You are terse."),
        Message::user("What's in a.txt?"),
    ]);
    req.tools = vec![read_file.clone()];
    req.temperature = Some(0.25);

    // 1. The model calls the tool: one whole call, no id, arguments as an object.
    let (deltas, completion) = run_ok(&client, req.clone()).await;
    assert!(deltas.is_empty(), "{deltas:?}");
    assert_eq!(completion.finish_reason, "tool_calls");
    assert_eq!(completion.usage.map(|u| u.total_tokens), Some(15));
    assert_eq!(completion.tool_calls.len(), 1);
    let call = completion.tool_calls[0].clone();
    assert_eq!(
        (call.id.as_str(), call.name.as_str()),
        ("call_0", "read_file")
    );
    assert_eq!(
        serde_json::from_str::<Value>(&call.arguments).unwrap(),
        args
    );

    // 2. The result goes back with the call in the history.
    req.messages.push(Message::Assistant {
        content: String::new(),
        tool_calls: vec![call.clone()],
    });
    req.messages
        .push(Message::tool(&call.id, "hello from a.txt"));
    let (_, completion) = run_ok(&client, req).await;
    assert_eq!(completion.text, "It says hello.");

    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let tools = json!([{"type": "function", "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "max_lines": {"type": "integer"}},
            "required": ["path"],
        },
    }}]);
    assert_eq!(
        requests[0],
        json!({
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What's in a.txt?"},
            ],
            "tools": tools,
            "stream": true,
            "options": {"temperature": 0.25},
        })
    );
    assert_eq!(
        requests[1],
        json!({
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What's in a.txt?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "read_file", "arguments": {"path": "a.txt", "max_lines": 40}}}
                ]},
                {"role": "tool", "content": "hello from a.txt", "tool_name": "read_file"},
            ],
            "tools": tools,
            "stream": true,
            "options": {"temperature": 0.25},
        })
    );
    assert_eq!(fake.request_paths(), vec!["/api/chat", "/api/chat"]);
}

#[tokio::test]
async fn text_and_several_tool_calls_get_generated_ids() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("Let me check both."),
        tool_call(0, "", "read_file", &["{\"path\":", "\"a.txt\"}"]),
        tool_call(1, "", "list_dir", &[]),
        finish("tool_calls"),
        usage(1, 2),
    ]));
    let (deltas, completion) = run_ok(&ollama(&fake), hello()).await;
    assert_eq!(deltas, vec!["Let me check both."]);
    assert_eq!(completion.text, "Let me check both.");
    assert_eq!(
        completion.tool_calls,
        vec![
            ToolCall {
                id: "call_0".into(),
                name: "read_file".into(),
                arguments: r#"{"path":"a.txt"}"#.into(),
            },
            ToolCall {
                id: "call_1".into(),
                name: "list_dir".into(),
                arguments: "{}".into(),
            },
        ]
    );
    assert_eq!(completion.finish_reason, "tool_calls");
}

#[tokio::test]
async fn unparseable_arguments_are_sent_as_a_string() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::text("ok"));
    let req = ChatRequest::new(vec![
        Message::user("go"),
        Message::Assistant {
            content: "Trying.".into(),
            tool_calls: vec![ToolCall {
                id: "c9".into(),
                name: "shell".into(),
                arguments: "{\"cmd\": \"ls".into(),
            }],
        },
        Message::tool("c9", "error: invalid arguments"),
        Message::tool("unknown-id", "orphan result"),
    ]);
    run_ok(&ollama(&fake), req).await;
    assert_eq!(
        fake.requests()[0]["messages"],
        json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "Trying.", "tool_calls": [
                {"function": {"name": "shell", "arguments": "{\"cmd\": \"ls"}}
            ]},
            {"role": "tool", "content": "error: invalid arguments", "tool_name": "shell"},
            {"role": "tool", "content": "orphan result"},
        ])
    );
}

#[tokio::test]
async fn request_without_tools_or_temperature_omits_them() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::text("x"));
    let mut cfg = config(&fake, Provider::Ollama);
    cfg.api_key = Some("sk-ollama".into());
    run_ok(&client(cfg), hello()).await;
    assert_eq!(
        fake.requests(),
        vec![json!({
            "model": "test-model",
            "messages": [{"role": "user", "content": "hello"}],
            "stream": true,
        })]
    );
    let headers = &fake.request_headers()[0];
    assert_eq!(header(headers, "authorization"), Some("Bearer sk-ollama"));
    assert_eq!(header(headers, "content-type"), Some("application/json"));
    assert_eq!(header(headers, "accept"), Some("application/x-ndjson"));
}

#[tokio::test]
async fn error_body_becomes_http_error() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(
        404,
        "model 'nope' not found, try pulling it first",
    ));
    let mut cfg = config(&fake, Provider::Ollama);
    cfg.max_retries = 3;
    let err = client(cfg).stream(hello()).await.err().expect("must fail");
    assert!(
        matches!(&err, LlmError::Http { status: 404, message } if message == "model 'nope' not found, try pulling it first"),
        "got {err:?}"
    );
    assert_eq!(
        err.to_string(),
        "model server returned HTTP 404: model 'nope' not found, try pulling it first"
    );
    assert_eq!(fake.request_count(), 1, "a 404 is not retried");
}

#[tokio::test]
async fn error_line_in_the_stream_becomes_http_error() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("Hi"),
        raw(r#"{"error":"model runner has unexpectedly stopped"}"#),
        text("never seen"),
    ]));
    let (deltas, err) = run_err(&ollama(&fake), hello()).await;
    assert_eq!(deltas, vec!["Hi"]);
    assert!(
        matches!(&err, LlmError::Http { status: 500, message } if message == "model runner has unexpectedly stopped"),
        "got {err:?}"
    );
    assert_eq!(
        err.to_string(),
        "model server returned HTTP 500: model runner has unexpectedly stopped"
    );
}

#[tokio::test]
async fn cut_stream_is_truncated() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("partial ans"),
        finish("stop"),
        cut(),
    ]));
    let (deltas, err) = run_err(&ollama(&fake), hello()).await;
    assert_eq!(deltas, vec!["partial ans"]);
    assert!(matches!(err, LlmError::Truncated(_)), "got {err:?}");
    assert!(
        err.to_string()
            .starts_with("model stream ended before the response was finished"),
        "{err}"
    );
    assert!(err.is_retryable());
}

#[tokio::test]
async fn malformed_line_is_reported_with_a_snippet() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("ok so far"),
        raw(r#"{"message": this is not json"#),
        text("never seen"),
        finish("stop"),
    ]));
    let (deltas, err) = run_err(&ollama(&fake), hello()).await;
    assert_eq!(deltas, vec!["ok so far"]);
    let LlmError::Malformed(detail) = &err else {
        panic!("expected Malformed, got {err:?}");
    };
    assert!(detail.contains("this is not json"), "{detail}");
    assert!(
        err.to_string()
            .starts_with("model server sent a malformed response: invalid JSON line"),
        "{err}"
    );
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn stalled_stream_times_out() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("a"),
        pause(Duration::from_secs(3)),
        finish("stop"),
    ]));
    let mut cfg = config(&fake, Provider::Ollama);
    cfg.request_timeout = Duration::from_millis(300);
    let (deltas, err) = run_err(&client(cfg), hello()).await;
    assert_eq!(deltas, vec!["a"]);
    assert!(
        matches!(err, LlmError::Timeout { after } if after == Duration::from_millis(300)),
        "got {err:?}"
    );
}

#[tokio::test]
async fn echo_fallback_and_shared_queue() {
    let fake = FakeModel::start().await.unwrap();
    fake.set_fallback(Fallback::Echo);
    fake.push(Reply::text("from the queue"));
    let openai = client(config(&fake, Provider::OpenAi));
    let ollama = ollama(&fake);
    let (_, first) = run_ok(&openai, hello()).await;
    let (_, second) = run_ok(&ollama, ChatRequest::new(vec![Message::user("ping")])).await;
    assert_eq!(first.text, "from the queue");
    assert_eq!(second.text, "echo: ping");
    assert_eq!(
        fake.request_paths(),
        vec!["/v1/chat/completions", "/api/chat"]
    );
}

#[tokio::test]
async fn connection_refused_names_the_native_url() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut cfg = agentry_llm::ProviderConfig::new(
        Provider::Ollama,
        format!("http://127.0.0.1:{port}/"),
        "m",
    );
    cfg.max_retries = 0;
    let err = client(cfg).stream(hello()).await.err().expect("must fail");
    assert_eq!(
        err.to_string(),
        format!(
            "cannot reach the model server at http://127.0.0.1:{port}/api/chat: connection refused"
        )
    );
}
