#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::wire::rfc3339_now;
use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads, checking the `data: ...\n\n` framing on the way.
    fn events(&self) -> Vec<String> {
        assert!(self.body.ends_with("\n\n"), "body: {:?}", self.body);
        self.body
            .split_terminator("\n\n")
            .map(|event| {
                let data = event.strip_prefix("data: ").expect("event without data");
                assert!(!data.contains('\n'), "multi-line event {event:?}");
                data.to_string()
            })
            .collect()
    }

    fn json_events(&self) -> Vec<Value> {
        self.events()
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    }
}

/// A minimal HTTP/1.0 exchange (close-delimited body, no chunked encoding).
async fn http(
    fake: &FakeModel,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> RawResponse {
    let mut stream = tokio::net::TcpStream::connect(fake.addr()).await.unwrap();
    let mut request = format!("{method} {path} HTTP/1.0\r\nHost: test\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("no header end");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("bad status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_lowercase(), v.trim().to_string()))
        .collect();
    RawResponse {
        status,
        headers,
        body: body.to_string(),
    }
}

async fn chat(fake: &FakeModel, body: &Value) -> RawResponse {
    http(
        fake,
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        &body.to_string(),
    )
    .await
}

fn req(model: &str, user: &str) -> Value {
    json!({"model": model, "stream": true, "messages": [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": user},
    ]})
}

fn delta(event: &Value) -> &Value {
    &event["choices"][0]["delta"]
}

#[tokio::test]
async fn text_reply_is_framed_like_openai() {
    let fake = FakeModel::start().await.unwrap();
    assert!(fake.base_url().starts_with("http://127.0.0.1:"));
    assert!(fake.base_url().ends_with("/v1"));
    fake.push(Reply::text("abcdef"));
    let response = chat(&fake, &req("my-model", "hi")).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("text/event-stream"));
    let events = response.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks = response.json_events();
    // role, 3 deltas, finish, usage
    assert_eq!(chunks.len(), 6, "{chunks:#?}");
    for chunk in &chunks {
        assert_eq!(chunk["object"], json!("chat.completion.chunk"));
        assert_eq!(chunk["model"], json!("my-model"));
        assert_eq!(chunk["id"], chunks[0]["id"]);
        assert!(chunk["created"].is_u64());
    }
    assert_eq!(delta(&chunks[0])["role"], json!("assistant"));
    let text: String = chunks[1..4]
        .iter()
        .map(|c| delta(c)["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, "abcdef");
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], json!("stop"));
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], Value::Null);
    assert_eq!(chunks[5]["choices"], json!([]));
    assert_eq!(
        chunks[5]["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11})
    );
}

#[tokio::test]
async fn tool_call_chunk_sends_id_and_name_first_then_fragments() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        tool_call(2, "call_9", "grep", &["{\"q\"", ":\"x\"", "}"]),
        tool_call(3, "", "noid", &["{}"]),
        finish("tool_calls"),
    ]));
    let chunks = chat(&fake, &req("m", "hi")).await.json_events();
    let calls: Vec<&Value> = chunks[1..5]
        .iter()
        .map(|c| &delta(c)["tool_calls"][0])
        .collect();
    assert_eq!(
        calls[0],
        &json!({"index": 2, "id": "call_9", "type": "function",
                "function": {"name": "grep", "arguments": "{\"q\""}})
    );
    assert_eq!(
        calls[1],
        &json!({"index": 2, "function": {"arguments": ":\"x\""}})
    );
    assert_eq!(
        calls[2],
        &json!({"index": 2, "function": {"arguments": "}"}})
    );
    assert_eq!(
        calls[3],
        &json!({"index": 3, "type": "function", "function": {"name": "noid", "arguments": "{}"}})
    );
    assert_eq!(
        chunks[5]["choices"][0]["finish_reason"],
        json!("tool_calls")
    );
}

#[tokio::test]
async fn convenience_tool_call_splits_arguments() {
    let fake = FakeModel::start().await.unwrap();
    let args = json!({"path": "/tmp/some/file.txt"});
    fake.push(Reply::tool_call("c1", "read", args.clone()));
    let chunks = chat(&fake, &req("m", "hi")).await.json_events();
    let fragments: Vec<&str> = chunks
        .iter()
        .filter_map(|c| delta(c)["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert!(fragments.len() > 1, "{fragments:?}");
    let joined: Value = serde_json::from_str(&fragments.concat()).unwrap();
    assert_eq!(joined, args);
}

#[tokio::test]
async fn raw_and_cut_are_sent_verbatim_without_done() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("a"),
        raw("{broken"),
        cut(),
        text("never"),
    ]));
    let events = chat(&fake, &req("m", "hi")).await.events();
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[2], "{broken");
    assert!(!events.iter().any(|e| e == "[DONE]" || e.contains("never")));
}

#[tokio::test]
async fn replies_are_consumed_in_order_and_requests_captured() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::text("one"));
    fake.push(Reply::error(404, "model 'x' not found"));
    assert_eq!(fake.pending(), 2);
    let first = chat(&fake, &req("m", "first")).await;
    assert_eq!(
        first.json_events()[1]["choices"][0]["delta"]["content"],
        json!("o")
    );
    let second = http(
        &fake,
        "POST",
        "/v1/chat/completions",
        &[("Authorization", "Bearer k")],
        &req("m", "second").to_string(),
    )
    .await;
    assert_eq!(second.status, 404);
    assert_eq!(second.header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_str(&second.body).unwrap();
    assert_eq!(body["error"]["message"], json!("model 'x' not found"));
    assert_eq!(fake.pending(), 0);

    assert_eq!(fake.requests(), vec![req("m", "first"), req("m", "second")]);
    let headers = fake.request_headers();
    assert_eq!(headers.len(), 2);
    assert!(
        headers[1]
            .iter()
            .any(|(n, v)| n == "authorization" && v == "Bearer k"),
        "{headers:?}"
    );
    assert!(!headers[0].iter().any(|(n, _)| n == "authorization"));
}

#[tokio::test]
async fn fallbacks() {
    let fake = FakeModel::start().await.unwrap();
    let response = chat(&fake, &req("m", "x")).await;
    assert_eq!(response.status, 500);
    let body: Value = serde_json::from_str(&response.body).unwrap();
    assert_eq!(
        body["error"]["message"],
        json!("fake model: no scripted reply left")
    );

    fake.set_fallback(Fallback::Echo);
    let chunks = chat(&fake, &req("m", "ping pong")).await.json_events();
    let text: String = chunks
        .iter()
        .filter_map(|c| delta(c)["content"].as_str())
        .collect();
    assert_eq!(text, "echo: ping pong");

    fake.set_fallback(Fallback::Script(vec![
        Reply::text("A"),
        Reply::error(503, "busy"),
    ]));
    let statuses = [
        chat(&fake, &req("m", "1")).await.status,
        chat(&fake, &req("m", "2")).await.status,
        chat(&fake, &req("m", "3")).await.status,
    ];
    assert_eq!(statuses, [200, 503, 200]);
    // Queued replies take precedence over the fallback.
    fake.push(Reply::error(418, "teapot"));
    assert_eq!(chat(&fake, &req("m", "4")).await.status, 418);
    assert_eq!(chat(&fake, &req("m", "5")).await.status, 503);
}

#[tokio::test]
async fn delay_holds_back_the_headers() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::text("x").delay(Duration::from_millis(200)));
    let started = std::time::Instant::now();
    let response = chat(&fake, &req("m", "x")).await;
    assert_eq!(response.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn models_and_unknown_paths() {
    let fake = FakeModel::start().await.unwrap();
    let models = http(&fake, "GET", "/v1/models", &[], "").await;
    assert_eq!(models.status, 200);
    let body: Value = serde_json::from_str(&models.body).unwrap();
    assert_eq!(body["object"], json!("list"));
    assert_eq!(body["data"][0]["id"], json!("fake-model"));

    let missing = http(&fake, "GET", "/v2/whatever", &[], "").await;
    assert_eq!(missing.status, 404);
    let body: Value = serde_json::from_str(&missing.body).unwrap();
    assert_eq!(
        body["error"]["message"],
        json!("fake model: no route for GET /v2/whatever")
    );
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn dropping_stops_the_server() {
    let fake = FakeModel::start().await.unwrap();
    let addr = fake.addr();
    drop(fake);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

async fn ollama_chat(fake: &FakeModel, body: &Value) -> RawResponse {
    http(
        fake,
        "POST",
        "/api/chat",
        &[("Content-Type", "application/json")],
        &body.to_string(),
    )
    .await
}

/// The NDJSON lines of a body, checking that each ends with a newline.
fn lines(response: &RawResponse) -> Vec<String> {
    assert!(response.body.ends_with('\n'), "body: {:?}", response.body);
    response.body.lines().map(str::to_string).collect()
}

fn json_lines(response: &RawResponse) -> Vec<Value> {
    lines(response)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn ollama_text_reply_is_ndjson() {
    let fake = FakeModel::start().await.unwrap();
    assert_eq!(fake.root_url(), format!("http://{}", fake.addr()));
    fake.push(Reply::text("abcdef"));
    let response = ollama_chat(&fake, &req("llama3.2", "hi")).await;
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("content-type"),
        Some("application/x-ndjson")
    );
    let lines = json_lines(&response);
    // 3 deltas, then the done line.
    assert_eq!(lines.len(), 4, "{lines:#?}");
    for line in &lines {
        assert_eq!(line["model"], json!("llama3.2"));
        let created = line["created_at"].as_str().unwrap();
        assert!(created.ends_with('Z') && created.len() == 27, "{created}");
    }
    let text: String = lines[..3]
        .iter()
        .map(|l| {
            assert_eq!(l["done"], json!(false));
            assert_eq!(l["message"]["role"], json!("assistant"));
            l["message"]["content"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text, "abcdef");
    let done = &lines[3];
    assert_eq!(done["done"], json!(true));
    assert_eq!(done["done_reason"], json!("stop"));
    assert_eq!(done["message"], json!({"role": "assistant", "content": ""}));
    assert_eq!(done["prompt_eval_count"], json!(10));
    assert_eq!(done["eval_count"], json!(1));
    assert!(done["total_duration"].is_u64());
}

#[tokio::test]
async fn ollama_tool_call_is_one_whole_call_with_object_arguments() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        tool_call(0, "call_9", "grep", &["{\"q\"", ":\"x\"}"]),
        tool_call(1, "", "noargs", &[]),
        finish("tool_calls"),
    ]));
    let lines = json_lines(&ollama_chat(&fake, &req("m", "hi")).await);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert_eq!(
        lines[0]["message"],
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "grep", "arguments": {"q": "x"}}}
        ]})
    );
    assert_eq!(
        lines[1]["message"]["tool_calls"],
        json!([{"function": {"name": "noargs", "arguments": {}}}])
    );
    // Ollama reports "stop" after tool calls; no usage was scripted.
    assert_eq!(lines[2]["done_reason"], json!("stop"));
    assert_eq!(lines[2].get("eval_count"), None);
}

#[tokio::test]
async fn ollama_finish_reason_usage_raw_and_cut() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::stream(vec![
        text("a"),
        finish("length"),
        usage(5, 6),
    ]));
    fake.push(Reply::stream(vec![
        text("a"),
        raw("{broken"),
        cut(),
        text("never"),
    ]));
    let lines = json_lines(&ollama_chat(&fake, &req("m", "hi")).await);
    assert_eq!(lines[1]["done_reason"], json!("length"));
    assert_eq!(
        (&lines[1]["prompt_eval_count"], &lines[1]["eval_count"]),
        (&json!(5), &json!(6))
    );
    let cut_lines = lines_of(&ollama_chat(&fake, &req("m", "hi")).await);
    assert_eq!(cut_lines.len(), 2, "{cut_lines:?}");
    assert_eq!(cut_lines[1], "{broken");
    assert!(
        !cut_lines
            .iter()
            .any(|l| l.contains("never") || l.contains("\"done\":true"))
    );
}

/// The lines of a body that may end without a newline.
fn lines_of(response: &RawResponse) -> Vec<String> {
    response.body.lines().map(str::to_string).collect()
}

#[tokio::test]
async fn ollama_errors_use_ollamas_error_body() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(404, "model 'x' not found"));
    let response = ollama_chat(&fake, &req("m", "hi")).await;
    assert_eq!(response.status, 404);
    assert_eq!(response.header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_str(&response.body).unwrap();
    assert_eq!(body, json!({"error": "model 'x' not found"}));
    assert_eq!(response.header("retry-after"), None);

    let response = ollama_chat(&fake, &req("m", "hi")).await;
    assert_eq!(response.status, 500);
    let body: Value = serde_json::from_str(&response.body).unwrap();
    assert_eq!(body, json!({"error": "fake model: no scripted reply left"}));
}

#[tokio::test]
async fn retry_after_is_sent_on_both_endpoints() {
    let fake = FakeModel::start().await.unwrap();
    fake.push(Reply::error(429, "slow down").retry_after(2));
    fake.push(Reply::error(503, "busy").retry_after_header("Wed, 21 Oct 2015 07:28:00 GMT"));
    let first = ollama_chat(&fake, &req("m", "hi")).await;
    assert_eq!(first.status, 429);
    assert_eq!(first.header("retry-after"), Some("2"));
    let second = chat(&fake, &req("m", "hi")).await;
    assert_eq!(second.status, 503);
    assert_eq!(
        second.header("retry-after"),
        Some("Wed, 21 Oct 2015 07:28:00 GMT")
    );
    let body: Value = serde_json::from_str(&second.body).unwrap();
    assert_eq!(body["error"]["message"], json!("busy"));
}

#[tokio::test]
async fn requests_on_both_endpoints_are_counted_with_their_paths() {
    let fake = FakeModel::start().await.unwrap();
    fake.set_fallback(Fallback::Echo);
    let openai = chat(&fake, &req("m", "one")).await;
    let ollama = ollama_chat(&fake, &req("m", "two")).await;
    assert_eq!((openai.status, ollama.status), (200, 200));
    let echoed: String = json_lines(&ollama)
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect();
    assert_eq!(echoed, "echo: two");
    assert_eq!(fake.request_count(), 2);
    assert_eq!(
        fake.request_paths(),
        vec!["/v1/chat/completions", "/api/chat"]
    );
    assert_eq!(fake.requests(), vec![req("m", "one"), req("m", "two")]);
    assert_eq!(fake.request_headers().len(), 2);
}

#[tokio::test]
async fn ollama_tags_lists_models() {
    let fake = FakeModel::start().await.unwrap();
    let response = http(&fake, "GET", "/api/tags", &[], "").await;
    assert_eq!(response.status, 200);
    let body: Value = serde_json::from_str(&response.body).unwrap();
    assert_eq!(body["models"][0]["name"], json!("fake-model"));
    assert_eq!(fake.request_count(), 0);
}

#[test]
fn rfc3339_now_has_the_expected_shape() {
    let now = rfc3339_now();
    let bytes = now.as_bytes();
    assert_eq!(now.len(), 27, "{now}");
    for (i, c) in [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
        (26, b'Z'),
    ] {
        assert_eq!(bytes[i], c, "{now}");
    }
    let year: u32 = now[..4].parse().unwrap();
    assert!((2024..3000).contains(&year), "{now}");
}

#[test]
fn split_in_keeps_characters_whole() {
    assert_eq!(split_in("héllo", 3), vec!["hé", "ll", "o"]);
    assert_eq!(split_in("ab", 3), vec!["a", "b"]);
    assert!(split_in("", 3).is_empty());
}

#[tokio::test]
async fn directed_conversations_follow_their_own_calls() {
    let fake = FakeModel::start().await.unwrap();
    fake.set_fallback(Fallback::Directed);
    let script =
        "do this\ncall bash {\"command\":\"echo a >> m\"}\ncall read_file {\"path\":\"m\"}";
    let step = |tools: usize| {
        let mut messages = vec![
            json!({"role": "user", "content": "an earlier turn"}),
            json!({"role": "tool", "tool_call_id": "x", "content": "old"}),
            json!({"role": "user", "content": script}),
        ];
        for i in 0..tools {
            messages
                .push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": "ok"}));
        }
        json!({"model": "m", "stream": true, "messages": messages})
    };
    let call = |events: Vec<Value>| -> (String, String) {
        let calls: Vec<&Value> = events
            .iter()
            .filter_map(|c| delta(c)["tool_calls"].as_array())
            .flatten()
            .collect();
        let name = calls
            .iter()
            .find_map(|c| c["function"]["name"].as_str())
            .unwrap_or_default()
            .to_string();
        let args: String = calls
            .iter()
            .filter_map(|c| c["function"]["arguments"].as_str())
            .collect();
        (name, args)
    };
    let first = call(chat(&fake, &step(0)).await.json_events());
    assert_eq!(first.0, "bash");
    assert_eq!(
        serde_json::from_str::<Value>(&first.1).unwrap(),
        json!({"command": "echo a >> m"})
    );
    // Asked again at the same step: the same call.
    assert_eq!(call(chat(&fake, &step(0)).await.json_events()).0, "bash");
    assert_eq!(
        call(chat(&fake, &step(1)).await.json_events()).0,
        "read_file"
    );
    let text: String = chat(&fake, &step(2))
        .await
        .json_events()
        .iter()
        .filter_map(|c| delta(c)["content"].as_str())
        .collect();
    assert_eq!(text, "done");
}
