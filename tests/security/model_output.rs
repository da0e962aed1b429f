//! A hostile model server: a tool call whose arguments are 64 MiB, and one
//! of 2 GiB (written lazily, as far as the client reads). Before the
//! response limits, the first grew the orchestrator past a gigabyte and
//! stopped the session when the store refused the event; the second took
//! every service down. Now the turn fails with a message naming the limit,
//! the orchestrator read little more than the limit, and the session goes on.

use crate::support::{finished, new_session, send, until_finished};
use agentry_proto::sessions::v1::{TurnOutcome, event::Kind};
use agentry_testkit::Cluster;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: u64 = 1024 * 1024;

/// An OpenAI-compatible server whose first answer is one `bash` call with
/// `arguments` bytes of arguments, streamed in 64 KiB pieces; every later
/// answer is the text "fine". Returns its base URL and how many bytes of
/// the first answer were written before the client stopped reading.
async fn hostile_model(arguments: u64) -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let written = Arc::new(AtomicU64::new(0));
    let answers = Arc::new(AtomicUsize::new(0));
    let counter = written.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (counter, answers) = (counter.clone(), answers.clone());
            tokio::spawn(async move {
                match read_request(&mut socket).await {
                    Some(line) if line.starts_with("POST") && line.contains("CHAT/COMPLETIONS") => {
                    }
                    // Anything else (the services asking what the server
                    // is): not found.
                    Some(_) => {
                        let _ = socket
                            .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                            .await;
                        return;
                    }
                    None => return,
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let event = |data: String| format!("data: {data}\n\n");
                if answers.fetch_add(1, Ordering::SeqCst) > 0 {
                    let body = [
                        event(r#"{"model":"m","choices":[{"index":0,"delta":{"content":"fine"}}]}"#.into()),
                        event(r#"{"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#.into()),
                        "data: [DONE]\n\n".to_string(),
                    ]
                    .concat();
                    let _ = socket.write_all(body.as_bytes()).await;
                    return;
                }
                let start = event(
                    r#"{"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"big","type":"function","function":{"name":"bash","arguments":"{\"command\":\"echo "}}]}}]}"#.into(),
                );
                if socket.write_all(start.as_bytes()).await.is_err() {
                    return;
                }
                let piece = event(format!(
                    r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":"{}"}}}}]}}}}]}}"#,
                    "a".repeat(64 * 1024)
                ));
                let mut sent = 0u64;
                while sent < arguments {
                    if socket.write_all(piece.as_bytes()).await.is_err() {
                        return;
                    }
                    sent += 64 * 1024;
                    counter.store(sent, Ordering::SeqCst);
                }
                let end = [
                    event(r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"}"}}]}}]}"#.into()),
                    event(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#.into()),
                    "data: [DONE]\n\n".to_string(),
                ]
                .concat();
                let _ = socket.write_all(end.as_bytes()).await;
            });
        }
    });
    (format!("http://127.0.0.1:{port}/v1"), written)
}

/// Reads one request's headers and announced body: its request line, or
/// `None` when the client went away.
async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<String> {
    let mut request = Vec::new();
    let mut buffer = vec![0u8; 65536];
    loop {
        if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&request[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if request.len() >= end + 4 + length {
                return head.lines().next().map(|l| l.to_uppercase());
            }
        }
        match socket.read(&mut buffer).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => request.extend_from_slice(&buffer[..n]),
        }
    }
}

async fn an_oversized_call_fails_the_turn_only(arguments: u64) {
    let (url, written) = hostile_model(arguments).await;
    let cluster = Cluster::start_with(move |config| {
        config.llm.base_url = url;
    })
    .await
    .unwrap();
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "do it").await;
    let received = until_finished(&mut events, &turn).await;
    let end = finished(&received);
    assert_eq!(end.outcome, TurnOutcome::Failed as i32, "{received:?}");
    let error = received
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::Error(e)) => Some(e.message.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no error event: {received:?}"));
    assert!(
        error.contains("llm.max_tool_arguments_bytes"),
        "the error does not name the limit: {error}"
    );
    assert!(
        !received
            .iter()
            .any(|e| matches!(e.kind, Some(Kind::ToolCallRequested(_)))),
        "the oversized call was kept"
    );
    let read = written.load(Ordering::SeqCst);
    eprintln!("{arguments} bytes offered; {read} written before the client stopped reading");
    assert!(read < 16 * MIB, "{read} bytes were read from the model");

    // The session goes on.
    let turn = send(&mut client, &session.id, "again").await;
    let received = until_finished(&mut events, &turn).await;
    let end = finished(&received);
    assert_eq!(end.outcome, TurnOutcome::Completed as i32, "{received:?}");
    assert_eq!(end.message, "fine");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_64_mib_tool_call_fails_the_turn_only() {
    an_oversized_call_fails_the_turn_only(64 * MIB).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_2_gib_tool_call_is_never_read_whole() {
    an_oversized_call_fails_the_turn_only(2048 * MIB).await;
}
