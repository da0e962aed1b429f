//! The chat client against the testkit's fake OpenAI-compatible server, over real HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use agentry_fakes::fake_model::{
    FakeModel, Fallback, Reply, cut, finish, pause, raw, text, tool_call, usage,
};
use agentry_llm::{
    ChatClient, ChatRequest, ChatStream, Completion, LlmError, Message, Provider, ProviderConfig,
    StreamEvent, ToolCall, ToolDefinition, Usage,
};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::json;

/// No retries: these tests look at single exchanges (see `retries.rs` for retrying).
fn config(base_url: &str) -> ProviderConfig {
    let mut cfg = ProviderConfig::new(Provider::OpenAi, base_url, "test-model");
    cfg.request_timeout = Duration::from_secs(10);
    cfg.connect_timeout = Duration::from_secs(2);
    cfg.max_retries = 0;
    cfg
}

fn client(fake: &FakeModel) -> ChatClient {
    ChatClient::new(config(&fake.base_url())).unwrap()
}

fn hello() -> ChatRequest {
    ChatRequest::new(vec![Message::user("hello")])
}

/// Every item of the stream, checking that nothing follows an error.
async fn collect(mut stream: ChatStream) -> Vec<Result<StreamEvent, LlmError>> {
    let mut items = Vec::new();
    while let Some(item) = stream.next().await {
        let is_err = item.is_err();
        items.push(item);
        if is_err {
            assert!(
                stream.next().await.is_none(),
                "the stream must end after an error"
            );
            break;
        }
    }
    items
}

/// Runs one request that must succeed; returns the text deltas and the completion.
async fn run_ok(client: &ChatClient, req: ChatRequest) -> (Vec<String>, Completion) {
    let items = collect(client.stream(req).await.unwrap()).await;
    let mut deltas = Vec::new();
    let mut completion = None;
    for item in items {
        match item.unwrap() {
            StreamEvent::TextDelta(d) => {
                assert!(completion.is_none(), "text delta after Completed");
                deltas.push(d);
            }
            StreamEvent::Completed(c) => {
                assert!(completion.is_none(), "two Completed events");
                completion = Some(c);
            }
        }
    }
    (deltas, completion.expect("no Completed event"))
}

/// Runs one request whose stream must fail; returns the deltas seen before and the error.
async fn run_err(client: &ChatClient, req: ChatRequest) -> (Vec<String>, LlmError) {
    let items = collect(client.stream(req).await.unwrap()).await;
    let mut deltas = Vec::new();
    for item in items {
        match item {
            Ok(StreamEvent::TextDelta(d)) => deltas.push(d),
            Ok(StreamEvent::Completed(c)) => panic!("unexpected completion {c:?}"),
            Err(e) => return (deltas, e),
        }
    }
    panic!("the stream ended without an error");
}

#[tokio::test]
async fn text_deltas_arrive_in_order_then_completed_with_usage() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("Hel"),
        text("lo"),
        text(""),
        text(", world"),
        finish("stop"),
        usage(7, 3),
    ]));
    let (deltas, completion) = run_ok(&client(&fake), hello()).await;
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
    let mut stream = client(&fake).stream(hello()).await.unwrap();
    let first = tokio::time::timeout(Duration::from_millis(300), stream.next())
        .await
        .expect("the first delta must not wait for the rest of the stream");
    assert_eq!(
        first.unwrap().unwrap(),
        StreamEvent::TextDelta("first".into())
    );
    let rest = collect(stream).await;
    let rest: Vec<StreamEvent> = rest.into_iter().map(Result::unwrap).collect();
    assert_eq!(rest[0], StreamEvent::TextDelta(" second".into()));
    let StreamEvent::Completed(c) = &rest[1] else {
        panic!("expected Completed, got {:?}", rest[1]);
    };
    assert_eq!(c.text, "first second");
    assert_eq!(c.usage, None, "no usage chunk was sent");
}

#[tokio::test]
async fn convenience_text_reply_round_trips() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::text("The quick brown fox"));
    let (deltas, completion) = run_ok(&client(&fake), hello()).await;
    assert!(
        deltas.len() > 1,
        "text should arrive in several deltas: {deltas:?}"
    );
    assert_eq!(deltas.concat(), "The quick brown fox");
    assert_eq!(completion.text, "The quick brown fox");
    assert_eq!(completion.finish_reason, "stop");
    assert_eq!(
        completion.usage,
        Some(Usage {
            prompt_tokens: 10,
            completion_tokens: 4,
            total_tokens: 14,
            cached_prompt_tokens: 0,
            cache_write_tokens: 0,
        })
    );
}

#[tokio::test]
async fn completion_reports_the_model_named_by_the_server() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        raw(r#"{"id":"x","object":"chat.completion.chunk","model":"served-model-v2","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}"#),
    ]));
    let (deltas, completion) = run_ok(&client(&fake), hello()).await;
    assert_eq!(deltas, vec!["hi"]);
    // The fake's own role chunk names the requested model first.
    assert_eq!(completion.model, "test-model");

    let fake = FakeModel::start().await.unwrap();
    let mut cfg = config(&fake.base_url());
    cfg.model = "llama3.2:1b".into();
    fake.push(Reply::text("ok"));
    let (_, completion) = run_ok(&ChatClient::new(cfg).unwrap(), hello()).await;
    assert_eq!(completion.model, "llama3.2:1b");
    assert_eq!(fake.requests()[0]["model"], json!("llama3.2:1b"));
}

#[tokio::test]
async fn tool_call_arguments_are_assembled_across_chunks() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        tool_call(
            0,
            "call_abc",
            "get_weather",
            &["{\"ci", "ty\": \"Pa", "ris\", \"unit\"", ": \"C\"}"],
        ),
        finish("tool_calls"),
        usage(20, 9),
    ]));
    let (deltas, completion) = run_ok(&client(&fake), hello()).await;
    assert!(deltas.is_empty(), "no text was sent: {deltas:?}");
    assert_eq!(
        completion.tool_calls,
        vec![ToolCall {
            id: "call_abc".into(),
            name: "get_weather".into(),
            arguments: r#"{"city": "Paris", "unit": "C"}"#.into(),
        }]
    );
    assert_eq!(completion.finish_reason, "tool_calls");
    assert_eq!(completion.text, "");
    assert_eq!(completion.usage.map(|u| u.total_tokens), Some(29));
}

#[tokio::test]
async fn convenience_tool_call_reply_round_trips() {
    let fake = FakeModel::start().await.unwrap();
    let args = json!({"path": "src/main.rs", "max_lines": 40});
    fake.push(Reply::tool_call("call_1", "read_file", args.clone()));
    let (_, completion) = run_ok(&client(&fake), hello()).await;
    assert_eq!(completion.tool_calls.len(), 1);
    let call = &completion.tool_calls[0];
    assert_eq!(
        (call.id.as_str(), call.name.as_str()),
        ("call_1", "read_file")
    );
    let parsed: serde_json::Value = serde_json::from_str(&call.arguments).unwrap();
    assert_eq!(parsed, args);
    assert_eq!(completion.finish_reason, "tool_calls");
}

#[tokio::test]
async fn two_sequential_tool_calls_and_text() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("Let me check both."),
        tool_call(0, "call_a", "read_file", &["{\"path\":", "\"a.txt\"}"]),
        tool_call(1, "call_b", "list_dir", &["{\"dir\"", ":\".\"}"]),
        finish("tool_calls"),
        usage(1, 2),
    ]));
    let (deltas, completion) = run_ok(&client(&fake), hello()).await;
    assert_eq!(deltas, vec!["Let me check both."]);
    assert_eq!(completion.text, "Let me check both.");
    assert_eq!(
        completion.tool_calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "read_file".into(),
                arguments: r#"{"path":"a.txt"}"#.into(),
            },
            ToolCall {
                id: "call_b".into(),
                name: "list_dir".into(),
                arguments: r#"{"dir":"."}"#.into(),
            },
        ]
    );
}

#[tokio::test]
async fn two_interleaved_tool_calls_are_assembled_by_index() {
    let continuation = |index: u32, fragment: &str| {
        raw(&json!({
            "id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "test-model",
            "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": index, "function": {"arguments": fragment}}
            ]}, "finish_reason": null}],
        })
        .to_string())
    };
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        // Index 1 starts first: the result must still be ordered by index.
        tool_call(1, "call_second", "beta", &["{\"b\":"]),
        tool_call(0, "call_first", "alpha", &["{\"a\":"]),
        continuation(1, "2}"),
        continuation(0, "1}"),
        finish("tool_calls"),
    ]));
    let (_, completion) = run_ok(&client(&fake), hello()).await;
    assert_eq!(
        completion.tool_calls,
        vec![
            ToolCall {
                id: "call_first".into(),
                name: "alpha".into(),
                arguments: r#"{"a":1}"#.into(),
            },
            ToolCall {
                id: "call_second".into(),
                name: "beta".into(),
                arguments: r#"{"b":2}"#.into(),
            },
        ]
    );
}

#[tokio::test]
async fn missing_tool_call_ids_are_generated_from_the_index() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        tool_call(0, "", "first", &["{}"]),
        tool_call(1, "", "second", &["{\"x\":", "1}"]),
        finish("tool_calls"),
    ]));
    let (_, completion) = run_ok(&client(&fake), hello()).await;
    let ids: Vec<(&str, &str, &str)> = completion
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
        .collect();
    assert_eq!(
        ids,
        vec![("call_0", "first", "{}"), ("call_1", "second", "{\"x\":1}")]
    );
}

#[tokio::test]
async fn reasoning_deltas_are_ignored() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        raw(r#"{"model":"test-model","choices":[{"index":0,"delta":{"reasoning_content":"thinking..."},"finish_reason":null}]}"#),
        raw(r#"{"model":"test-model","choices":[{"index":0,"delta":{"content":null,"reasoning_content":"more"},"finish_reason":null}]}"#),
        text("Answer"),
        finish("stop"),
    ]));
    let (deltas, completion) = run_ok(&client(&fake), hello()).await;
    assert_eq!(deltas, vec!["Answer"]);
    assert_eq!(completion.text, "Answer");
}

#[tokio::test]
async fn stream_cut_before_finish_is_truncated() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![text("partial ans"), cut()]));
    let (deltas, err) = run_err(&client(&fake), hello()).await;
    assert_eq!(deltas, vec!["partial ans"]);
    assert!(matches!(err, LlmError::Truncated(_)), "got {err:?}");
    assert!(err.is_retryable());
    assert!(
        err.to_string()
            .starts_with("model stream ended before the response was finished"),
        "{err}"
    );
}

#[tokio::test]
async fn stream_cut_before_any_content_is_truncated() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![cut()]));
    let (deltas, err) = run_err(&client(&fake), hello()).await;
    assert!(deltas.is_empty());
    assert!(matches!(err, LlmError::Truncated(_)), "got {err:?}");
}

#[tokio::test]
async fn stream_cut_after_finish_reason_still_completes() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![text("done"), finish("length"), cut()]));
    let (deltas, completion) = run_ok(&client(&fake), hello()).await;
    assert_eq!(deltas, vec!["done"]);
    assert_eq!(completion.finish_reason, "length");
    assert_eq!(completion.usage, None);
}

#[tokio::test]
async fn malformed_chunk_is_reported_with_a_snippet() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("ok so far"),
        raw(r#"{"choices": [ this is not json"#),
        text("never seen"),
        finish("stop"),
    ]));
    let (deltas, err) = run_err(&client(&fake), hello()).await;
    assert_eq!(deltas, vec!["ok so far"]);
    let LlmError::Malformed(detail) = &err else {
        panic!("expected Malformed, got {err:?}");
    };
    assert!(detail.contains("this is not json"), "{detail}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn error_object_inside_the_stream_becomes_http_error() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("Hi"),
        raw(r#"{"error":{"message":"the model is overloaded","type":"server_error","code":503}}"#),
    ]));
    fake.push(Reply::stream(vec![raw(
        r#"{"error":{"message":"context length exceeded","code":"context_length_exceeded"}}"#,
    )]));
    let client = client(&fake);
    let (deltas, err) = run_err(&client, hello()).await;
    assert_eq!(deltas, vec!["Hi"]);
    assert_eq!(
        err.to_string(),
        "model server returned HTTP 503: the model is overloaded"
    );
    let (_, err) = run_err(&client, hello()).await;
    assert!(
        matches!(&err, LlmError::Http { status: 500, message } if message == "context length exceeded"),
        "got {err:?}"
    );
}

#[tokio::test]
async fn http_404_carries_the_server_message() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(404, "model 'x' not found"));
    let err = client(&fake)
        .stream(hello())
        .await
        .err()
        .expect("must fail");
    assert!(
        matches!(&err, LlmError::Http { status: 404, message } if message == "model 'x' not found"),
        "got {err:?}"
    );
    assert_eq!(
        err.to_string(),
        "model server returned HTTP 404: model 'x' not found"
    );
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn http_500_when_nothing_is_scripted() {
    let fake = FakeModel::start().await.unwrap();
    let err = client(&fake)
        .stream(hello())
        .await
        .err()
        .expect("must fail");
    assert!(
        matches!(&err, LlmError::Http { status: 500, message } if message == "fake model: no scripted reply left"),
        "got {err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(fake.requests().len(), 1, "the request was still captured");
}

#[tokio::test]
async fn http_429_is_retryable() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(429, "Rate limit reached"));
    let err = client(&fake)
        .stream(hello())
        .await
        .err()
        .expect("must fail");
    assert!(
        matches!(err, LlmError::Http { status: 429, .. }),
        "got {err:?}"
    );
    assert!(err.is_retryable());
}

#[tokio::test]
async fn wrong_base_path_gives_a_404_naming_the_path() {
    let fake = FakeModel::start().await.unwrap();
    let client = ChatClient::new(config(&format!("{}/nope/", fake.base_url()))).unwrap();
    let err = client.stream(hello()).await.err().expect("must fail");
    let LlmError::Http { status, message } = &err else {
        panic!("expected Http, got {err:?}");
    };
    assert_eq!(*status, 404);
    assert!(message.contains("/v1/nope/chat/completions"), "{message}");
}

#[tokio::test]
async fn connection_refused_names_the_url() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let client = ChatClient::new(config(&format!("http://127.0.0.1:{port}/v1"))).unwrap();
    let err = client.stream(hello()).await.err().expect("must fail");
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    assert!(
        matches!(&err, LlmError::Connect { url: u, reason } if *u == url && reason == "connection refused"),
        "got {err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("cannot reach the model server at {url}: connection refused")
    );
    assert!(err.is_retryable());
}

#[tokio::test]
async fn dropped_server_refuses_connections() {
    let fake = FakeModel::start().await.unwrap();
    let client = client(&fake);
    drop(fake);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let err = client.stream(hello()).await.err().expect("must fail");
    assert!(matches!(err, LlmError::Connect { .. }), "got {err:?}");
}

#[tokio::test]
async fn slow_headers_time_out() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::text("too late").delay(Duration::from_secs(3)));
    let mut cfg = config(&fake.base_url());
    cfg.request_timeout = Duration::from_millis(300);
    let err = ChatClient::new(cfg)
        .unwrap()
        .stream(hello())
        .await
        .err()
        .expect("must fail");
    assert!(
        matches!(err, LlmError::Timeout { after } if after == Duration::from_millis(300)),
        "got {err:?}"
    );
    assert_eq!(err.to_string(), "model server did not respond within 300ms");
}

#[tokio::test]
async fn stalled_stream_times_out() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("a"),
        pause(Duration::from_secs(3)),
        finish("stop"),
    ]));
    let mut cfg = config(&fake.base_url());
    cfg.request_timeout = Duration::from_millis(300);
    let (deltas, err) = run_err(&ChatClient::new(cfg).unwrap(), hello()).await;
    assert_eq!(deltas, vec!["a"]);
    assert!(matches!(err, LlmError::Timeout { .. }), "got {err:?}");
}

#[tokio::test]
async fn short_pauses_below_the_timeout_are_fine() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("a"),
        pause(Duration::from_millis(150)),
        text("b"),
        pause(Duration::from_millis(150)),
        text("c"),
        pause(Duration::from_millis(150)),
        finish("stop"),
    ]));
    let mut cfg = config(&fake.base_url());
    cfg.request_timeout = Duration::from_millis(400);
    let (deltas, completion) = run_ok(&ChatClient::new(cfg).unwrap(), hello()).await;
    assert_eq!(deltas, vec!["a", "b", "c"]);
    assert_eq!(completion.text, "abc");
}

#[tokio::test]
async fn request_body_matches_the_openai_wire_format() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::text("fine"));
    let req = ChatRequest {
        messages: vec![
            Message::system("You are terse."),
            Message::user("What's in a.txt?"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"a.txt"}"#.into(),
                }],
            },
            Message::tool("call_1", "hello from a.txt"),
            Message::Assistant {
                content: "It says hello.".into(),
                tool_calls: vec![],
            },
            Message::user("Thanks"),
        ],
        tools: vec![ToolDefinition {
            name: "read_file".into(),
            description: "Read a file".into(),
            parameters: json!({
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            }),
        }],
        temperature: Some(0.25),
        require_tool: false,
    };
    run_ok(&client(&fake), req).await;
    assert_eq!(
        fake.requests(),
        vec![json!({
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What's in a.txt?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "hello from a.txt"},
                {"role": "assistant", "content": "It says hello."},
                {"role": "user", "content": "Thanks"},
            ],
            "tools": [{"type": "function", "function": {
                "name": "read_file",
                "description": "Read a file",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"],
                },
            }}],
            "stream": true,
            "stream_options": {"include_usage": true},
            "temperature": 0.25,
        })]
    );
}

#[tokio::test]
async fn request_without_tools_omits_the_key() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::text("x"));
    run_ok(&client(&fake), hello()).await;
    assert_eq!(
        fake.requests(),
        vec![json!({
            "model": "test-model",
            "messages": [{"role": "user", "content": "hello"}],
            "stream": true,
            "stream_options": {"include_usage": true},
        })]
    );
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn api_key_is_sent_as_bearer_token() {
    let fake = FakeModel::start().await.unwrap();
    fake.set_fallback(Fallback::Echo);
    let mut cfg = config(&fake.base_url());
    cfg.api_key = Some("sk-test-123".into());
    run_ok(&ChatClient::new(cfg).unwrap(), hello()).await;
    let mut cfg = config(&fake.base_url());
    cfg.api_key = Some(String::new());
    run_ok(&ChatClient::new(cfg).unwrap(), hello()).await;
    run_ok(&client(&fake), hello()).await;

    let headers = fake.request_headers();
    assert_eq!(headers.len(), 3);
    assert_eq!(
        header(&headers[0], "authorization"),
        Some("Bearer sk-test-123")
    );
    assert_eq!(header(&headers[1], "authorization"), None, "empty key");
    assert_eq!(header(&headers[2], "authorization"), None, "no key");
    assert_eq!(
        header(&headers[0], "content-type"),
        Some("application/json")
    );
    assert_eq!(header(&headers[0], "accept"), Some("text/event-stream"));
}

#[tokio::test]
async fn clones_share_the_configuration_and_run_concurrently() {
    let fake = FakeModel::start().await.unwrap();
    fake.set_fallback(Fallback::Echo);
    let a = client(&fake);
    let b = a.clone();
    assert_eq!(b.model(), "test-model");
    let (ra, rb) = tokio::join!(
        run_ok(&a, ChatRequest::new(vec![Message::user("one")])),
        run_ok(&b, ChatRequest::new(vec![Message::user("two")])),
    );
    let mut texts = vec![ra.1.text, rb.1.text];
    texts.sort();
    assert_eq!(texts, vec!["echo: one", "echo: two"]);
    assert_eq!(fake.requests().len(), 2);
}
