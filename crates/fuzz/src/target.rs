//! Calling any RPC with raw message bytes: a tonic client over loopback
//! with a codec that passes bytes through, so the input reaches the
//! server exactly as generated (including encodings no generated struct
//! could produce), under the auth layer and message limits the services
//! really run with.

use crate::schema::Method;
use bytes::{Buf, BufMut, Bytes};
use futures::StreamExt;
use std::collections::HashMap;
use std::time::Duration;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

/// Longer than this for an answer (or for a stream that should end to
/// end) is a hang.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a live stream (Watch, Subscribe, Chat, StreamDue, McpWatch)
/// is read after its last message before it is dropped.
pub const LIVE_IDLE: Duration = Duration::from_millis(15);
/// The most messages read from a live stream.
const LIVE_MESSAGES: usize = 32;

/// Passes message bytes through unchanged.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// The credential a call carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// The service token (every RPC accepts it).
    Service,
    /// The client token (a person, `admin`): refused by service-only RPCs.
    Client,
    /// No `authorization` metadata.
    Missing,
    /// `authorization` that is not `Bearer <token>`.
    Malformed,
    /// A bearer token nobody holds.
    Wrong,
}

impl Credential {
    /// Whether a call with it must be refused whatever the RPC.
    pub fn is_bad(self) -> bool {
        matches!(
            self,
            Credential::Missing | Credential::Malformed | Credential::Wrong
        )
    }

    /// Its name in saved inputs and reports.
    pub fn name(self) -> &'static str {
        match self {
            Credential::Service => "service",
            Credential::Client => "client",
            Credential::Missing => "missing",
            Credential::Malformed => "malformed",
            Credential::Wrong => "wrong",
        }
    }
}

/// How a call ended.
#[derive(Debug)]
pub struct Outcome {
    /// `None` for OK, else the status.
    pub status: Option<tonic::Status>,
    /// The messages received.
    pub responses: Vec<Bytes>,
    /// What took longer than [`CALL_TIMEOUT`], if anything did.
    pub hung: Option<&'static str>,
}

/// Channels to every service, and the cluster's tokens.
#[derive(Clone)]
pub struct Target {
    channels: HashMap<String, Channel>,
    service_token: String,
    client_token: String,
}

impl Target {
    /// Connects to each `(service name, url)`.
    pub async fn connect(
        services: &[(&str, &str)],
        service_token: String,
        client_token: String,
    ) -> anyhow::Result<Target> {
        let mut channels = HashMap::new();
        for (name, url) in services {
            let endpoint = agentry_runtime::Auth::off().endpoint(url)?;
            channels.insert((*name).to_string(), endpoint.connect().await?);
        }
        Ok(Target {
            channels,
            service_token,
            client_token,
        })
    }

    /// Whether the target serves `service`.
    pub fn serves(&self, service: &str) -> bool {
        self.channels.contains_key(service)
    }

    /// Calls `method` with `messages` (one for a unary or server-streaming
    /// RPC). A live stream is read until it idles, then dropped; with
    /// `keep_open`, the request stream stays open until then.
    pub async fn call(
        &self,
        method: &Method,
        messages: Vec<Bytes>,
        credential: Credential,
        person: Option<&str>,
        keep_open: bool,
    ) -> Outcome {
        let fail = |status: tonic::Status| Outcome {
            status: Some(status),
            responses: Vec::new(),
            hung: None,
        };
        let Some(channel) = self.channels.get(&method.service) else {
            return fail(tonic::Status::unimplemented("no such service here"));
        };
        let Ok(path) = PathAndQuery::try_from(method.path.as_str()) else {
            return fail(tonic::Status::internal("bad path"));
        };
        let mut grpc = tonic::client::Grpc::new(channel.clone())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let sent = futures::stream::iter(messages);
        let sent = if keep_open {
            sent.chain(futures::stream::pending()).boxed()
        } else {
            sent.boxed()
        };
        let mut request = tonic::Request::new(sent);
        self.authorize(&mut request, credential, person);
        let started = tokio::time::timeout(CALL_TIMEOUT, async {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(format!("channel not ready: {e}")))?;
            grpc.streaming(request, path, RawCodec).await
        })
        .await;
        let mut stream = match started {
            Err(_) => {
                return Outcome {
                    status: None,
                    responses: Vec::new(),
                    hung: Some("no answer"),
                };
            }
            Ok(Err(status)) => return fail(status),
            Ok(Ok(response)) => response.into_inner(),
        };
        let mut responses = Vec::new();
        let live = is_live(method);
        let read = async {
            loop {
                if live && responses.len() >= LIVE_MESSAGES {
                    return None;
                }
                let next = if live {
                    match tokio::time::timeout(LIVE_IDLE, stream.message()).await {
                        Ok(next) => next,
                        // Idle: a live stream is dropped here.
                        Err(_) => return None,
                    }
                } else {
                    stream.message().await
                };
                match next {
                    Ok(Some(message)) => responses.push(message),
                    Ok(None) => return None,
                    Err(status) => return Some(status),
                }
            }
        };
        match tokio::time::timeout(CALL_TIMEOUT, read).await {
            Ok(status) => Outcome {
                status,
                responses,
                hung: None,
            },
            Err(_) => Outcome {
                status: None,
                responses,
                hung: Some("the answer did not end"),
            },
        }
    }

    fn authorize<T>(&self, request: &mut tonic::Request<T>, credential: Credential, person: Option<&str>) {
        let value = match credential {
            Credential::Service => Some(format!("Bearer {}", self.service_token)),
            Credential::Client => Some(format!("Bearer {}", self.client_token)),
            Credential::Missing => None,
            Credential::Malformed => Some(format!("Basic {}", self.client_token)),
            Credential::Wrong => Some("Bearer agentry-not-a-token-0000".to_string()),
        };
        let metadata = request.metadata_mut();
        if let Some(value) = value.and_then(|v| v.parse().ok()) {
            metadata.insert("authorization", value);
        }
        if let Some(value) = person.and_then(|p| p.parse().ok()) {
            metadata.insert(agentry_runtime::auth::ON_BEHALF_OF, value);
        }
    }
}

/// Streams that stay open until the caller goes: read briefly, then
/// dropped.
pub fn is_live(method: &Method) -> bool {
    method.client_streaming || (method.server_streaming && method.name != "Execute")
}
