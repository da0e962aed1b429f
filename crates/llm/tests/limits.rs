//! A hostile model server that never stops: endless text, endless tool
//! call arguments, one endless line, a huge whole response, for each
//! protocol. The client stops reading at the response limits and ends the
//! stream with `LlmError::TooLarge`, having read little more than the limit.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agentry_llm::{
    ChatClient, ChatRequest, LlmError, Message, Provider, ProviderConfig, ResponseLimits,
    StreamEvent,
};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Answers every connection with `head`, then `chunk` over and over until
/// the client goes away (or 4 GiB were written); returns the base address
/// and how many bytes went out.
async fn serve_endless(head: String, chunk: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let written = Arc::new(AtomicUsize::new(0));
    let counter = written.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counter = counter.clone();
            let (head, chunk) = (head.clone(), chunk.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut request = Vec::new();
                // The headers and the announced body, then the answer.
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                while counter.load(Ordering::Relaxed) < 4 << 30 {
                    if socket.write_all(&chunk).await.is_err() {
                        return;
                    }
                    counter.fetch_add(chunk.len(), Ordering::Relaxed);
                }
            });
        }
    });
    (format!("http://{addr}"), written)
}

/// HTTP response headers for a body of `content_type`, closed by the
/// server (no length).
fn head(content_type: &str) -> String {
    format!("HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\nconnection: close\r\n\r\n")
}

const LIMITS: ResponseLimits = ResponseLimits {
    max_response_bytes: 256 * 1024,
    max_tool_arguments_bytes: 64 * 1024,
};

fn client(provider: Provider, base_url: String) -> ChatClient {
    let mut cfg = ProviderConfig::new(provider, base_url, "m");
    cfg.max_retries = 0;
    cfg.limits = LIMITS;
    ChatClient::new(cfg).unwrap()
}

/// Runs one request to its end; the error it ended with.
async fn failure(client: &ChatClient) -> LlmError {
    let request = ChatRequest::new(vec![Message::user("go")]);
    let mut stream = match client.stream(&request).await {
        Ok(stream) => stream,
        Err(e) => return e,
    };
    while let Some(item) = stream.next().await {
        match item {
            Ok(StreamEvent::Completed(_)) => panic!("an endless response completed"),
            Ok(StreamEvent::TextDelta(_)) => {}
            Err(e) => return e,
        }
    }
    panic!("the stream ended without an error");
}

/// The client stopped with TooLarge naming `setting`, and the server wrote
/// at most a few times the limit before the connection was dropped.
async fn assert_stopped(client: ChatClient, written: Arc<AtomicUsize>, setting: &str) {
    let err = failure(&client).await;
    assert!(
        matches!(err, LlmError::TooLarge(_)),
        "not a size error: {err:?}"
    );
    let message = err.to_string();
    assert!(message.contains(setting), "{message}");
    assert!(!err.is_retryable());
    // The server notices the closed connection within a few socket buffers.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let sent = written.load(Ordering::Relaxed);
    assert!(
        sent < 64 << 20,
        "{sent} bytes were sent before the client stopped"
    );
}

fn sse(data: &str) -> Vec<u8> {
    format!("data: {data}\n\n").into_bytes()
}

#[tokio::test]
async fn openai_endless_tool_arguments_stop_at_the_call_limit() {
    let (url, written) = serve_endless(
        head("text/event-stream")
            + &String::from_utf8(sse(
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"bash","arguments":""}}]}}]}"#,
            ))
            .unwrap(),
        sse(&format!(
            r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":"{}"}}}}]}}}}]}}"#,
            "a".repeat(4096)
        )),
    )
    .await;
    let client = client(Provider::OpenAi, format!("{url}/v1"));
    assert_stopped(client, written, "llm.max_tool_arguments_bytes").await;
}

#[tokio::test]
async fn openai_endless_text_stops_at_the_response_limit() {
    let (url, written) = serve_endless(
        head("text/event-stream"),
        sse(&format!(
            r#"{{"choices":[{{"index":0,"delta":{{"content":"{}"}}}}]}}"#,
            "b".repeat(4096)
        )),
    )
    .await;
    let client = client(Provider::OpenAi, format!("{url}/v1"));
    assert_stopped(client, written, "llm.max_response_bytes").await;
}

#[tokio::test]
async fn one_endless_line_is_never_buffered_whole() {
    let (url, written) = serve_endless(
        head("text/event-stream") + "data: {\"choices\":[{\"delta\":{\"content\":\"",
        vec![b'c'; 65536],
    )
    .await;
    let client = client(Provider::OpenAi, format!("{url}/v1"));
    assert_stopped(client, written, "llm.max_response_bytes").await;
}

#[tokio::test]
async fn a_huge_whole_json_response_is_refused() {
    let (url, written) = serve_endless(
        head("application/json") + "{\"choices\":[{\"message\":{\"content\":\"",
        vec![b'd'; 65536],
    )
    .await;
    let client = client(Provider::OpenAi, format!("{url}/v1"));
    assert_stopped(client, written, "llm.max_response_bytes").await;
}

#[tokio::test]
async fn ollama_endless_text_stops_at_the_response_limit() {
    let line = format!(
        "{{\"model\":\"m\",\"message\":{{\"role\":\"assistant\",\"content\":\"{}\"}},\"done\":false}}\n",
        "e".repeat(4096)
    );
    let (url, written) = serve_endless(head("application/x-ndjson"), line.into_bytes()).await;
    let client = client(Provider::Ollama, url);
    assert_stopped(client, written, "llm.max_response_bytes").await;
}

#[tokio::test]
async fn anthropic_endless_tool_input_stops_at_the_call_limit() {
    let start = [
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"bash\",\"input\":{}}}\n\n",
    ]
    .concat();
    let delta = format!(
        "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}}}\n\n",
        "f".repeat(4096)
    );
    let (url, written) =
        serve_endless(head("text/event-stream") + &start, delta.into_bytes()).await;
    let client = client(Provider::Anthropic, url);
    assert_stopped(client, written, "llm.max_tool_arguments_bytes").await;
}
