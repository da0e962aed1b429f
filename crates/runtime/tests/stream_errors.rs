//! A client connection outlives any number of stream errors.
//!
//! HTTP/2 libraries count the streams their side resets because of a frame
//! they cannot take, and at 1,024 (h2's default) close the connection. A
//! client of Agentry's services keeps one connection for many calls and
//! sees such frames in normal operation (a frame for a stream it cancelled
//! a second earlier, on a busy machine): the fuzzer's long runs saw their
//! connection closed that way. Here a server written frame by frame sends,
//! before each answer, a DATA frame for an earlier call's stream, which is
//! closed: each call costs the client one such reset, and 2,000 calls
//! through an endpoint made by `Auth::endpoint` must all succeed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CALLS: usize = 2000;
/// How many requests back the stream is that a stray frame names.
const BEHIND: usize = 20;

/// One frame: its header, then its payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const END_STREAM: u8 = 1;
const ACK: u8 = 1;
const END_HEADERS: u8 = 4;

/// The answer to a health check: `:status 200`, `content-type:
/// application/grpc`, the message SERVING, then `grpc-status: 0`.
fn answer(stream: u32) -> Vec<u8> {
    let mut headers = vec![0x88, 0x0f, 0x10, 16];
    headers.extend_from_slice(b"application/grpc");
    let message = [0u8, 0, 0, 0, 2, 0x08, 0x01];
    let mut trailers = vec![0x00, 11];
    trailers.extend_from_slice(b"grpc-status");
    trailers.extend_from_slice(&[1, b'0']);
    let mut out = frame(HEADERS, END_HEADERS, stream, &headers);
    out.extend(frame(DATA, 0, stream, &message));
    out.extend(frame(HEADERS, END_HEADERS | END_STREAM, stream, &trailers));
    out
}

/// Serves one connection: every request is answered, after a DATA frame
/// for the stream of the request [`BEHIND`] before it (long closed: a
/// stream the client still holds, closed, makes such a frame an error of
/// the whole connection instead).
async fn serve(mut conn: TcpStream) -> std::io::Result<()> {
    let mut preface = [0u8; 24];
    conn.read_exact(&mut preface).await?;
    conn.write_all(&frame(SETTINGS, 0, 0, &[])).await?;
    let mut earlier: std::collections::VecDeque<u32> = std::collections::VecDeque::new();
    loop {
        let mut header = [0u8; 9];
        conn.read_exact(&mut header).await?;
        let len =
            (usize::from(header[0]) << 16) | (usize::from(header[1]) << 8) | usize::from(header[2]);
        let (kind, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).await?;
        match kind {
            SETTINGS if flags & ACK == 0 => conn.write_all(&frame(SETTINGS, ACK, 0, &[])).await?,
            PING if flags & ACK == 0 => conn.write_all(&frame(PING, ACK, 0, &payload)).await?,
            HEADERS => {
                if earlier.len() == BEHIND
                    && let Some(closed) = earlier.pop_front()
                {
                    conn.write_all(&frame(DATA, 0, closed, b"x")).await?;
                }
                conn.write_all(&answer(stream)).await?;
                earlier.push_back(stream);
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_connection_outlives_thousands_of_stream_errors() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = tokio::spawn(async move {
        let mut accepted = 0;
        while let Ok((conn, _)) = listener.accept().await {
            accepted += 1;
            tokio::spawn(serve(conn));
        }
        accepted
    });
    let endpoint = agentry_runtime::Auth::off()
        .endpoint(&format!("http://{addr}"))
        .unwrap();
    let channel = endpoint.connect().await.unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for call in 0..CALLS {
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .unwrap_or_else(|status| panic!("call {call} of {CALLS} failed: {status:?}"));
        assert_eq!(answer.into_inner().status, 1, "call {call}");
    }
    connections.abort();
}
