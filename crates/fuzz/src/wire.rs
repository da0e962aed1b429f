//! Sending an input as it is: the bytes go on the wire unchanged (no
//! client-side encoding that would refuse a malformed one), and the answer
//! comes back as bytes.

use crate::schema::Method;
use agentry_testkit::cluster::Channel;
use bytes::{Buf, BufMut, Bytes};
use std::time::Duration;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Code, Status};

/// Passes bytes through.
#[derive(Clone, Copy, Default)]
pub struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// How one call ended.
#[derive(Debug)]
pub enum Outcome {
    /// Answered (for a stream: its first messages, or its end, came).
    Ok,
    /// Refused or failed with this status.
    Status(Code, String),
    /// No answer within the time allowed.
    Hung,
}

/// For a streaming answer: how long to read it before hanging up (a
/// subscription to a live session never ends by itself).
const STREAM_READ: Duration = Duration::from_millis(50);

/// Sends `messages` (one for a unary or server-streaming method) to
/// `method` over `channel`.
pub async fn call(
    channel: &Channel,
    method: &Method,
    messages: Vec<Bytes>,
    timeout: Duration,
) -> Outcome {
    let call = send(channel.clone(), method, messages);
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(())) => Outcome::Ok,
        Ok(Err(status)) => Outcome::Status(status.code(), status.message().to_string()),
        Err(_) => Outcome::Hung,
    }
}

async fn send(channel: Channel, method: &Method, mut messages: Vec<Bytes>) -> Result<(), Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("transport error: {e}")))?;
    let path = PathAndQuery::try_from(method.path())
        .map_err(|e| Status::internal(format!("bad path {}: {e}", method.path())))?;
    if method.client_streaming {
        let stream = tokio_stream::iter(messages);
        let response = grpc
            .streaming(tonic::Request::new(stream), path, Raw)
            .await?;
        drain(response.into_inner()).await
    } else {
        let message = messages.pop().unwrap_or_default();
        if method.server_streaming {
            let response = grpc
                .server_streaming(tonic::Request::new(message), path, Raw)
                .await?;
            drain(response.into_inner()).await
        } else {
            grpc.unary(tonic::Request::new(message), path, Raw)
                .await
                .map(|_| ())
        }
    }
}

/// Reads a streamed answer for a moment: its end, an error, or up to a
/// few messages.
async fn drain(mut stream: tonic::Streaming<Bytes>) -> Result<(), Status> {
    let deadline = tokio::time::Instant::now() + STREAM_READ;
    for _ in 0..16 {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) | Err(_) => return Ok(()),
            Ok(Err(status)) => return Err(status),
        }
    }
    Ok(())
}
