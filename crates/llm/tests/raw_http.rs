//! The chat client against hand-written HTTP responses the fake model server cannot produce.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use agentry_llm::{
    ChatClient, ChatRequest, LlmError, Message, Provider, ProviderConfig, StreamEvent,
};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves `response` verbatim to the first connection, then closes it; returns the base URL.
async fn serve_once(response: String) -> String {
    let addr = serve_parts(vec![response.into_bytes()], Duration::ZERO).await;
    format!("http://{addr}/v1")
}

/// Serves `parts` to the first connection, each written and flushed separately with `gap` in
/// between, then closes it; returns the server's address.
async fn serve_parts(parts: Vec<Vec<u8>>, gap: Duration) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        // Read the headers and the announced body before answering.
        loop {
            let n = socket.read(&mut buf).await.unwrap();
            request.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&request).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if body.len() >= len {
                    break;
                }
            }
            if n == 0 {
                break;
            }
        }
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(gap).await;
            }
            socket.write_all(part).await.unwrap();
            socket.flush().await.unwrap();
        }
        socket.shutdown().await.ok();
    });
    addr
}

fn http_response(status: &str, content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn client(base_url: String) -> ChatClient {
    client_for(Provider::OpenAi, base_url)
}

/// A client that never retries (each server here answers one connection only).
fn client_for(provider: Provider, base_url: String) -> ChatClient {
    let mut cfg = ProviderConfig::new(provider, base_url, "raw-model");
    cfg.api_key = Some("sk-abc".into());
    cfg.request_timeout = Duration::from_secs(5);
    cfg.connect_timeout = Duration::from_secs(2);
    cfg.max_retries = 0;
    ChatClient::new(cfg).unwrap()
}

fn hello() -> ChatRequest {
    ChatRequest::new(vec![Message::user("hello")])
}

#[tokio::test]
async fn plain_text_error_body_is_used_as_message() {
    let url = serve_once(http_response(
        "502 Bad Gateway",
        "text/plain",
        "upstream connect error\n",
    ))
    .await;
    let err = client(url).stream(hello()).await.err().expect("must fail");
    assert_eq!(
        err.to_string(),
        "model server returned HTTP 502: upstream connect error"
    );
    assert!(err.is_retryable());
}

#[tokio::test]
async fn long_error_bodies_are_truncated() {
    let body = "x".repeat(10_000);
    let url = serve_once(http_response(
        "500 Internal Server Error",
        "text/html",
        &body,
    ))
    .await;
    let err = client(url).stream(hello()).await.err().expect("must fail");
    let LlmError::Http { status, message } = err else {
        panic!("expected Http");
    };
    assert_eq!(status, 500);
    assert!(message.chars().count() <= 2001, "{}", message.len());
    assert!(message.starts_with("xxxx"));
}

#[tokio::test]
async fn empty_error_body_uses_the_status_reason() {
    let url = serve_once(http_response("503 Service Unavailable", "text/plain", "")).await;
    let err = client(url).stream(hello()).await.err().expect("must fail");
    assert_eq!(
        err.to_string(),
        "model server returned HTTP 503: Service Unavailable"
    );
}

#[tokio::test]
async fn a_server_ignoring_stream_true_is_still_understood() {
    let body = r#"{"id":"c","object":"chat.completion","model":"served","choices":[{"index":0,
        "message":{"role":"assistant","content":"Hi!","tool_calls":[{"id":"t1","type":"function",
        "function":{"name":"f","arguments":"{\"a\":1}"}}]},"finish_reason":"tool_calls"}],
        "usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;
    let url = serve_once(http_response("200 OK", "application/json", body)).await;
    let items: Vec<StreamEvent> = client(url)
        .stream(hello())
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(items[0], StreamEvent::TextDelta("Hi!".into()));
    let StreamEvent::Completed(c) = &items[1] else {
        panic!("expected Completed");
    };
    assert_eq!(c.text, "Hi!");
    assert_eq!(c.model, "served");
    assert_eq!(c.finish_reason, "tool_calls");
    assert_eq!(c.tool_calls[0].arguments, r#"{"a":1}"#);
    assert_eq!(c.usage.map(|u| u.total_tokens), Some(5));
    assert_eq!(items.len(), 2);
}

#[tokio::test]
async fn clean_end_without_finish_or_done_is_truncated() {
    let sse = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"par\"}}]}\n\n";
    let url = serve_once(http_response("200 OK", "text/event-stream", sse)).await;
    let items: Vec<Result<StreamEvent, LlmError>> =
        client(url).stream(hello()).await.unwrap().collect().await;
    assert_eq!(items.len(), 2);
    assert_eq!(
        items[0].as_ref().unwrap(),
        &StreamEvent::TextDelta("par".into())
    );
    assert!(
        matches!(items[1], Err(LlmError::Truncated(_))),
        "{:?}",
        items[1]
    );
}

#[tokio::test]
async fn clean_end_after_finish_without_done_completes() {
    let sse = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":null}]}\n\n",
        ": keep-alive comment\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    );
    let url = serve_once(http_response("200 OK", "text/event-stream", sse)).await;
    let items: Vec<StreamEvent> = client(url)
        .stream(hello())
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(items.len(), 2);
    let StreamEvent::Completed(c) = &items[1] else {
        panic!("expected Completed");
    };
    assert_eq!((c.text.as_str(), c.finish_reason.as_str()), ("ok", "stop"));
    assert_eq!(c.model, "raw-model", "falls back to the configured model");
}

/// The head of a close-delimited NDJSON response.
fn ndjson_head() -> Vec<u8> {
    b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\nconnection: close\r\n\r\n".to_vec()
}

#[tokio::test]
async fn ollama_lines_split_across_reads_are_reassembled() {
    let line1 =
        r#"{"model":"served","message":{"role":"assistant","content":"Héllo"},"done":false}"#;
    let line2 =
        r#"{"model":"served","message":{"role":"assistant","content":" world"},"done":false}"#;
    // The last line lacks its newline.
    let line3 = r#"{"model":"served","done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":2}"#;
    let body = format!("{line1}\n{line2}\n{line3}").into_bytes();
    // Split inside "é" (a two-byte character), inside a key, and right before a newline.
    let cut_a = line1.find('é').unwrap() + 1;
    let cut_b = line1.len() + 1 + 20;
    let cut_c = line1.len() + 1 + line2.len();
    let parts = vec![
        ndjson_head(),
        body[..cut_a].to_vec(),
        body[cut_a..cut_b].to_vec(),
        body[cut_b..cut_c].to_vec(),
        body[cut_c..].to_vec(),
    ];
    let addr = serve_parts(parts, Duration::from_millis(30)).await;
    let items: Vec<StreamEvent> = client_for(Provider::Ollama, format!("http://{addr}"))
        .stream(hello())
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(
        items[..2],
        [
            StreamEvent::TextDelta("Héllo".into()),
            StreamEvent::TextDelta(" world".into())
        ]
    );
    let StreamEvent::Completed(c) = &items[2] else {
        panic!("expected Completed, got {:?}", items[2]);
    };
    assert_eq!(c.text, "Héllo world");
    assert_eq!(c.model, "served");
    assert_eq!(c.finish_reason, "stop");
    assert_eq!(c.usage.map(|u| u.total_tokens), Some(5));
    assert_eq!(items.len(), 3);
}

#[tokio::test]
async fn ollama_clean_end_without_done_is_truncated() {
    let mut body = ndjson_head();
    body.extend_from_slice(
        b"{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"par\"},\"done\":false}\n",
    );
    let addr = serve_parts(vec![body], Duration::ZERO).await;
    let items: Vec<Result<StreamEvent, LlmError>> =
        client_for(Provider::Ollama, format!("http://{addr}"))
            .stream(hello())
            .await
            .unwrap()
            .collect()
            .await;
    assert_eq!(items.len(), 2);
    assert_eq!(
        items[0].as_ref().unwrap(),
        &StreamEvent::TextDelta("par".into())
    );
    let Err(err) = &items[1] else {
        panic!("expected an error, got {:?}", items[1]);
    };
    assert!(matches!(err, LlmError::Truncated(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "model stream ended before the response was finished: the server closed the stream \
         before the final message (\"done\": true)"
    );
}

#[tokio::test]
async fn ollama_non_streamed_answer_is_understood() {
    let body = r#"{"model":"llama3.2","created_at":"2024-07-22T20:33:28.123648Z","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_current_weather","arguments":{"format":"celsius","location":"Paris, FR"}}}]},"done_reason":"stop","done":true,"prompt_eval_count":122,"eval_count":33}"#;
    let url = serve_once(http_response("200 OK", "application/json", body)).await;
    let url = url.trim_end_matches("/v1").to_string();
    let items: Vec<StreamEvent> = client_for(Provider::Ollama, url)
        .stream(hello())
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(items.len(), 1, "no text, only the completion: {items:?}");
    let StreamEvent::Completed(c) = &items[0] else {
        panic!("expected Completed");
    };
    assert_eq!(c.finish_reason, "tool_calls");
    assert_eq!(c.tool_calls[0].id, "call_0");
    assert_eq!(c.tool_calls[0].name, "get_current_weather");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&c.tool_calls[0].arguments).unwrap(),
        serde_json::json!({"format": "celsius", "location": "Paris, FR"})
    );
    assert_eq!(c.usage.map(|u| u.total_tokens), Some(155));
}
