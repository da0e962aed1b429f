//! A fake model server for tests, speaking the OpenAI-compatible API and Ollama's native API.
//!
//! [`FakeModel`] listens on real HTTP (127.0.0.1, ephemeral port by default) and answers, from
//! one queue of scripted [`Reply`]s:
//!
//! - `POST /v1/chat/completions` ([`FakeModel::base_url`]) streamed exactly like the OpenAI API:
//!   `data: {chunk}\n\n` server-sent events ending with `data: [DONE]`;
//! - `POST /api/chat` ([`FakeModel::root_url`]) streamed like Ollama: one JSON object per line
//!   (`application/x-ndjson`), `{"model", "created_at", "message": {..}, "done": false}` for every
//!   text delta or tool call, then a final `{"done": true, "done_reason", "prompt_eval_count",
//!   "eval_count", ..}` line.
//!
//! It records every chat request: body, headers and path.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use agentry_fakes::fake_model::{FakeModel, Reply, finish, text, usage};
//! let fake = FakeModel::start().await?;
//! fake.push(Reply::text("Hello there"));
//! fake.push(Reply::stream(vec![text("Hi"), finish("stop"), usage(3, 1)]));
//! // ... point a client at fake.base_url() ...
//! assert_eq!(fake.requests().len(), 0);
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// One piece of a streamed reply; build them with [`text`], [`tool_call`], [`finish`],
/// [`usage`], [`pause`], [`cut`] and [`raw`].
#[derive(Clone, Debug, PartialEq)]
pub struct Chunk(ChunkKind);

#[derive(Clone, Debug, PartialEq)]
enum ChunkKind {
    Text(String),
    ToolCall {
        index: u32,
        id: String,
        name: String,
        fragments: Vec<String>,
    },
    Finish(String),
    Usage {
        prompt: u64,
        completion: u64,
    },
    Pause(Duration),
    Cut,
    Raw(String),
}

/// A text delta (`delta.content`).
pub fn text(s: &str) -> Chunk {
    Chunk(ChunkKind::Text(s.to_string()))
}

/// A tool call at stream position `index`: the first event carries `id`, `name` and the first
/// argument fragment, every other fragment is its own event. An empty `id` omits the `id`
/// field (to test servers that send none).
pub fn tool_call(index: u32, id: &str, name: &str, args_fragments: &[&str]) -> Chunk {
    Chunk(ChunkKind::ToolCall {
        index,
        id: id.to_string(),
        name: name.to_string(),
        fragments: args_fragments.iter().map(|f| f.to_string()).collect(),
    })
}

/// A chunk with an empty delta and this `finish_reason` ("stop", "tool_calls", "length").
pub fn finish(reason: &str) -> Chunk {
    Chunk(ChunkKind::Finish(reason.to_string()))
}

/// The usage chunk (`choices: []`), with `total_tokens = prompt + completion`.
pub fn usage(prompt: u64, completion: u64) -> Chunk {
    Chunk(ChunkKind::Usage { prompt, completion })
}

/// Wait `d` before sending the next chunk.
pub fn pause(d: Duration) -> Chunk {
    Chunk(ChunkKind::Pause(d))
}

/// Abort the HTTP body here: the connection is dropped without the final chunk of the chunked
/// encoding and without `data: [DONE]` (Ollama: without the `"done": true` line).
pub fn cut() -> Chunk {
    Chunk(ChunkKind::Cut)
}

/// Send `data: <data>` verbatim (for malformed-chunk tests); on `/api/chat` the line `<data>`.
pub fn raw(data: &str) -> Chunk {
    Chunk(ChunkKind::Raw(data.to_string()))
}

#[derive(Clone, Debug, PartialEq)]
enum ReplyKind {
    Stream(Vec<Chunk>),
    Error { status: u16, message: String },
}

/// A scripted answer to one chat request (on either endpoint).
///
/// On `/api/chat` the chunks map to Ollama's format: each [`text`] is a line with
/// `message.content`, each [`tool_call`] a line with one whole call in `message.tool_calls`
/// (arguments as a JSON object, no id), [`finish`] and [`usage`] go into the final `done` line
/// (`done_reason`, `prompt_eval_count`, `eval_count`; "tool_calls" becomes "stop", as Ollama
/// reports it), [`raw`] is a verbatim line and [`cut`] ends the body without the `done` line.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    kind: ReplyKind,
    delay: Option<Duration>,
    retry_after: Option<String>,
}

/// Splits `s` into at most `parts` non-empty pieces on character boundaries.
fn split_in(s: &str, parts: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        return Vec::new();
    }
    let size = chars.len().div_ceil(parts.max(1));
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

impl Reply {
    /// A streamed reply: a role chunk, then `chunks`, then `data: [DONE]` (unless a [`cut`]
    /// ends the body first).
    pub fn stream(chunks: Vec<Chunk>) -> Reply {
        Reply {
            kind: ReplyKind::Stream(chunks),
            delay: None,
            retry_after: None,
        }
    }

    /// `s` in up to 3 text deltas, finish reason "stop", usage (10 prompt tokens, one
    /// completion token per whitespace-separated word) and `[DONE]`.
    pub fn text(s: &str) -> Reply {
        let mut chunks: Vec<Chunk> = split_in(s, 3).iter().map(|p| text(p)).collect();
        chunks.push(finish("stop"));
        chunks.push(usage(10, s.split_whitespace().count().max(1) as u64));
        Reply::stream(chunks)
    }

    /// One tool call (index 0) whose JSON arguments are split over up to 3 deltas, finish
    /// reason "tool_calls", usage (10 prompt tokens, 5 completion tokens) and `[DONE]`.
    pub fn tool_call(id: &str, name: &str, args: Value) -> Reply {
        let args = split_in(&args.to_string(), 3);
        let fragments: Vec<&str> = args.iter().map(String::as_str).collect();
        Reply::stream(vec![
            tool_call(0, id, name, &fragments),
            finish("tool_calls"),
            usage(10, 5),
        ])
    }

    /// An HTTP error with body `{"error":{"message":..,"type":..,"param":null,"code":null}}`
    /// (on `/api/chat`: `{"error": message}`, like Ollama).
    pub fn error(status: u16, message: &str) -> Reply {
        Reply {
            kind: ReplyKind::Error {
                status,
                message: message.to_string(),
            },
            delay: None,
            retry_after: None,
        }
    }

    /// Send a `Retry-After: <secs>` header with the response.
    pub fn retry_after(self, secs: u64) -> Reply {
        self.retry_after_header(&secs.to_string())
    }

    /// Send this `Retry-After` header value verbatim (e.g. an HTTP date).
    pub fn retry_after_header(mut self, value: &str) -> Reply {
        self.retry_after = Some(value.to_string());
        self
    }

    /// Wait `d` before sending the response headers.
    pub fn delay(mut self, d: Duration) -> Reply {
        self.delay = Some(d);
        self
    }
}

/// Parses a script: a JSON array of replies, each one of
/// `{"text": "..."}`, `{"tool_call": {"name": "...", "arguments": {...}, "id": "..."}}` or
/// `{"error": {"status": 503, "message": "...", "retry_after": 2}}` (`id` and `retry_after`
/// are optional). The `agentry-fake-model` program's `--script` file and `POST /_fake/replies`
/// use this format.
pub fn parse_script(value: &Value) -> anyhow::Result<Vec<Reply>> {
    let items = value
        .as_array()
        .context("must be a JSON array of replies")?;
    if items.is_empty() {
        anyhow::bail!("contains no replies");
    }
    items
        .iter()
        .enumerate()
        .map(|(n, item)| parse_reply(n, item))
        .collect()
}

fn parse_reply(n: usize, item: &Value) -> anyhow::Result<Reply> {
    if let Some(text) = item.get("text") {
        let text = text
            .as_str()
            .with_context(|| format!("reply {n}: \"text\" must be a string"))?;
        return Ok(Reply::text(text));
    }
    if let Some(call) = item.get("tool_call") {
        let name = call
            .get("name")
            .and_then(Value::as_str)
            .with_context(|| format!("reply {n}: \"tool_call\" needs a string \"name\""))?;
        let arguments = call
            .get("arguments")
            .cloned()
            .unwrap_or_else(|| Value::Object(Default::default()));
        let id = match call.get("id").and_then(Value::as_str) {
            Some(id) => id.to_string(),
            None => format!("call_{n}"),
        };
        return Ok(Reply::tool_call(&id, name, arguments));
    }
    if let Some(error) = item.get("error") {
        let status = error
            .get("status")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok())
            .unwrap_or(500);
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("fake model error");
        let reply = Reply::error(status, message);
        return Ok(match error.get("retry_after") {
            None => reply,
            Some(secs) => reply.retry_after(secs.as_u64().with_context(|| {
                format!("reply {n}: \"retry_after\" must be a number of seconds")
            })?),
        });
    }
    bail!("reply {n}: expected an object with \"text\", \"tool_call\" or \"error\", got {item}")
}

/// What the server answers when no scripted reply is queued.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Fallback {
    /// HTTP 500 `{"error":{"message":"fake model: no scripted reply left"}}` (the default).
    #[default]
    Error,
    /// A text reply `echo: <content of the last user message>`.
    Echo,
    /// One tool call, then a text answer once the tool's result is in: when the last
    /// message of the request comes from a tool, answer `text`, else call `tool` with
    /// `arguments`. Any number of concurrent conversations each get a ReAct-style turn.
    ToolThenText {
        /// The tool to call.
        tool: String,
        /// Its arguments.
        arguments: Value,
        /// The final answer.
        text: String,
    },
    /// Cycle through these replies forever (an empty list behaves like [`Fallback::Error`]).
    Script(Vec<Reply>),
}

#[derive(Default)]
struct Inner {
    queue: VecDeque<Reply>,
    requests: Vec<Value>,
    headers: Vec<Vec<(String, String)>>,
    paths: Vec<String>,
    fallback: Fallback,
    script_pos: usize,
    /// When each text chunk of an OpenAI stream was handed to the server.
    text_sent: Vec<std::time::Instant>,
}

#[derive(Default)]
struct Shared {
    inner: Mutex<Inner>,
    next_id: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running fake model server; dropping it shuts the server down.
pub struct FakeModel {
    server: crate::http_server::HttpServer,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FakeModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeModel")
            .field("addr", &self.server.addr)
            .finish_non_exhaustive()
    }
}

impl FakeModel {
    /// Starts a server on an ephemeral port of 127.0.0.1.
    pub async fn start() -> anyhow::Result<FakeModel> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts a server on `addr` (port 0 picks a free port).
    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<FakeModel> {
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .route("/v1/models", get(models))
            .route("/api/chat", post(ollama_chat))
            .route("/api/tags", get(ollama_tags))
            .route("/_fake/replies", post(push_replies))
            .route("/_fake/requests", get(request_count))
            .fallback(not_found)
            .with_state(shared.clone());
        let server = crate::http_server::HttpServer::start(addr, app, "fake model").await?;
        Ok(FakeModel { server, shared })
    }

    /// When each text chunk of the OpenAI-format streams so far was handed to
    /// the HTTP server, in order; taking them clears the list. For latency
    /// measurements (what a client adds on top of the server).
    pub fn take_text_sent(&self) -> Vec<std::time::Instant> {
        std::mem::take(&mut self.shared.lock().text_sent)
    }

    /// The API root to configure OpenAI-compatible clients with: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.server.addr)
    }

    /// The server root, to configure clients of Ollama's native API with
    /// (`http://127.0.0.1:PORT`; they post to `{root}/api/chat`).
    pub fn root_url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// Queues a reply; each chat request (on either endpoint) consumes one, first in first out.
    pub fn push(&self, reply: Reply) {
        self.shared.lock().queue.push_back(reply);
    }

    /// How many queued replies have not been consumed yet.
    pub fn pending(&self) -> usize {
        self.shared.lock().queue.len()
    }

    /// The JSON bodies of all chat requests received so far, in order (a body that is not JSON
    /// is recorded as a JSON string).
    pub fn requests(&self) -> Vec<Value> {
        self.shared.lock().requests.clone()
    }

    /// How many chat requests were received so far (on either endpoint).
    pub fn request_count(&self) -> usize {
        self.shared.lock().requests.len()
    }

    /// The headers of all chat requests (lower-case names), in order.
    pub fn request_headers(&self) -> Vec<Vec<(String, String)>> {
        self.shared.lock().headers.clone()
    }

    /// The paths all chat requests were sent to (`/v1/chat/completions` or `/api/chat`), in
    /// order.
    pub fn request_paths(&self) -> Vec<String> {
        self.shared.lock().paths.clone()
    }

    /// Sets what to answer when the queue is empty.
    pub fn set_fallback(&self, fallback: Fallback) {
        let mut inner = self.shared.lock();
        inner.fallback = fallback;
        inner.script_pos = 0;
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The two wire protocols served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    OpenAi,
    Ollama,
}

fn error_response(status: u16, message: &str) -> Response {
    protocol_error(Protocol::OpenAi, status, message)
}

/// An error answer in the format of `protocol`.
fn protocol_error(protocol: Protocol, status: u16, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match protocol {
        Protocol::OpenAi => {
            let kind = if status.is_client_error() {
                "invalid_request_error"
            } else {
                "server_error"
            };
            json_response(
                status,
                &json!({"error": {"message": message, "type": kind, "param": null, "code": null}}),
            )
        }
        Protocol::Ollama => json_response(status, &json!({"error": message})),
    }
}

async fn not_found(request: Request) -> Response {
    let message = format!(
        "fake model: no route for {} {}",
        request.method(),
        request.uri().path()
    );
    error_response(404, &message)
}

async fn models() -> Response {
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [
            {"id": "fake-model", "object": "model", "created": 0, "owned_by": "agentry-testkit"},
            {"id": "fake-model-large", "object": "model", "created": 0, "owned_by": "agentry-testkit"},
        ]}),
    )
}

async fn ollama_tags() -> Response {
    let model = |name: &str| {
        json!({
            "name": name, "model": name, "modified_at": "2024-01-01T00:00:00Z", "size": 0,
            "digest": "0000000000000000000000000000000000000000000000000000000000000000",
            "details": {"format": "gguf", "family": "fake", "parameter_size": "0B",
                        "quantization_level": "F16"},
        })
    };
    json_response(
        StatusCode::OK,
        &json!({"models": [model("fake-model"), model("fake-model-large")]}),
    )
}

/// The text of the last user message of a request body.
fn last_user_message(body: &Value) -> String {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return String::new();
    };
    let Some(message) = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
    else {
        return String::new();
    };
    match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        // Content parts: [{"type":"text","text":"..."}]
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// `POST /_fake/replies`: queues the replies of a script (see [`parse_script`]), so a
/// test driving the server from outside (a container, a shell script) can say what
/// the next model calls answer.
async fn push_replies(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let parsed = serde_json::from_slice::<Value>(&body)
        .map_err(|e| anyhow::anyhow!("not JSON: {e}"))
        .and_then(|value| parse_script(&value));
    match parsed {
        Ok(replies) => {
            let mut inner = shared.lock();
            let queued = replies.len();
            inner.queue.extend(replies);
            Json(serde_json::json!({"queued": queued, "pending": inner.queue.len()}))
                .into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": {"message": format!("bad script: {e:#}")}})),
        )
            .into_response(),
    }
}

/// `GET /_fake/requests`: how many model requests arrived and how many replies are queued.
async fn request_count(State(shared): State<Arc<Shared>>) -> Response {
    let inner = shared.lock();
    Json(serde_json::json!({"requests": inner.requests.len(), "pending": inner.queue.len()}))
        .into_response()
}

async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    chat(
        shared,
        Protocol::OpenAi,
        "/v1/chat/completions",
        headers,
        body,
    )
    .await
}

async fn ollama_chat(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    chat(shared, Protocol::Ollama, "/api/chat", headers, body).await
}

/// Captures a chat request and answers it with the next scripted reply.
async fn chat(
    shared: Arc<Shared>,
    protocol: Protocol,
    path: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let captured: Vec<(String, String)> = headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let reply = {
        let mut inner = shared.lock();
        inner.requests.push(request.clone());
        inner.headers.push(captured);
        inner.paths.push(path.to_string());
        let inner = &mut *inner;
        match inner.queue.pop_front() {
            Some(reply) => Some(reply),
            None => match &inner.fallback {
                Fallback::Error => None,
                Fallback::Echo => Some(Reply::text(&format!(
                    "echo: {}",
                    last_user_message(&request)
                ))),
                Fallback::ToolThenText {
                    tool,
                    arguments,
                    text,
                } => {
                    let after_tool = request["messages"]
                        .as_array()
                        .and_then(|m| m.last())
                        .is_some_and(|m| m["role"] == "tool");
                    if after_tool {
                        Some(Reply::text(text))
                    } else {
                        let n = inner.script_pos;
                        inner.script_pos = inner.script_pos.wrapping_add(1);
                        Some(Reply::tool_call(
                            &format!("call_{n}"),
                            tool,
                            arguments.clone(),
                        ))
                    }
                }
                Fallback::Script(replies) if replies.is_empty() => None,
                Fallback::Script(replies) => {
                    let reply = replies[inner.script_pos % replies.len()].clone();
                    inner.script_pos = inner.script_pos.wrapping_add(1);
                    Some(reply)
                }
            },
        }
    };
    let Some(reply) = reply else {
        return protocol_error(protocol, 500, "fake model: no scripted reply left");
    };
    if !request.is_object() {
        return protocol_error(
            protocol,
            400,
            "fake model: the request body is not a JSON object",
        );
    }
    if let Some(d) = reply.delay {
        tokio::time::sleep(d).await;
    }
    let mut response = match reply.kind {
        ReplyKind::Error { status, message } => protocol_error(protocol, status, &message),
        ReplyKind::Stream(chunks) => {
            let model = request
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or("fake-model")
                .to_string();
            let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
            let content_type = match protocol {
                Protocol::OpenAi => {
                    let id = format!(
                        "chatcmpl-fake-{}",
                        shared.next_id.fetch_add(1, Ordering::Relaxed)
                    );
                    let framer = Framer {
                        id,
                        model,
                        created: SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map(|d| d.as_secs())
                            .unwrap_or(0),
                    };
                    tokio::spawn(send_stream(framer, chunks, tx, shared.clone()));
                    "text/event-stream"
                }
                Protocol::Ollama => {
                    tokio::spawn(send_ndjson(model, chunks, tx));
                    "application/x-ndjson"
                }
            };
            let mut response = Response::new(Body::from_stream(ReceiverStream::new(rx)));
            let h = response.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            response
        }
    };
    if let Some(value) = reply
        .retry_after
        .and_then(|v| HeaderValue::from_str(&v).ok())
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// Lets the server flush what was sent so far (it flushes when the body has nothing ready),
/// then aborts the connection mid-body with an error item.
async fn cut_body(tx: &mpsc::Sender<Result<Bytes, std::io::Error>>) {
    tokio::time::sleep(Duration::from_millis(30)).await;
    let _ = tx
        .send(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "fake model: stream cut",
        )))
        .await;
}

/// Writes the NDJSON lines of a streamed reply into `tx`, like Ollama's `/api/chat`; stops
/// early when the client is gone.
async fn send_ndjson(
    model: String,
    chunks: Vec<Chunk>,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let send = |line: String| {
        let tx = tx.clone();
        async move { tx.send(Ok(Bytes::from(line + "\n"))).await.is_ok() }
    };
    let message_line = |message: Value| {
        json!({
            "model": model,
            "created_at": rfc3339_now(),
            "message": message,
            "done": false,
        })
        .to_string()
    };
    let mut done_reason: Option<String> = None;
    let mut counts: Option<(u64, u64)> = None;
    for chunk in chunks {
        let line = match chunk.0 {
            ChunkKind::Pause(d) => {
                tokio::time::sleep(d).await;
                continue;
            }
            ChunkKind::Cut => {
                cut_body(&tx).await;
                return;
            }
            ChunkKind::Finish(reason) => {
                done_reason = Some(reason);
                continue;
            }
            ChunkKind::Usage { prompt, completion } => {
                counts = Some((prompt, completion));
                continue;
            }
            ChunkKind::Text(s) => message_line(json!({"role": "assistant", "content": s})),
            ChunkKind::ToolCall {
                name, fragments, ..
            } => {
                let arguments = fragments.concat();
                let arguments = if arguments.trim().is_empty() {
                    json!({})
                } else {
                    serde_json::from_str::<Value>(&arguments).unwrap_or(Value::String(arguments))
                };
                message_line(json!({
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": name, "arguments": arguments}}],
                }))
            }
            ChunkKind::Raw(line) => line,
        };
        if !send(line).await {
            return;
        }
    }
    // Ollama reports "stop" when the model called tools.
    let done_reason = match done_reason.as_deref() {
        None | Some("tool_calls") => "stop".to_string(),
        Some(other) => other.to_string(),
    };
    let mut done = json!({
        "model": model,
        "created_at": rfc3339_now(),
        "message": {"role": "assistant", "content": ""},
        "done": true,
        "done_reason": done_reason,
        "total_duration": 1_000_000,
        "load_duration": 100_000,
    });
    if let (Some((prompt, completion)), Value::Object(map)) = (counts, &mut done) {
        map.insert("prompt_eval_count".into(), json!(prompt));
        map.insert("prompt_eval_duration".into(), json!(200_000));
        map.insert("eval_count".into(), json!(completion));
        map.insert("eval_duration".into(), json!(700_000));
    }
    let _ = send(done.to_string()).await;
}

/// The current UTC time like Ollama's `created_at`: `2024-07-22T20:33:28.123648Z`.
fn rfc3339_now() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_micros()
    )
}

/// Writes the SSE events of a streamed reply into `tx`; stops early when the client is gone.
async fn send_stream(
    framer: Framer,
    chunks: Vec<Chunk>,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    shared: Arc<Shared>,
) {
    let send = |bytes: Bytes| {
        let tx = tx.clone();
        async move { tx.send(Ok(bytes)).await.is_ok() }
    };
    if !send(framer.role()).await {
        return;
    }
    for chunk in chunks {
        match chunk.0 {
            ChunkKind::Pause(d) => tokio::time::sleep(d).await,
            ChunkKind::Cut => {
                cut_body(&tx).await;
                return;
            }
            other => {
                let is_text = matches!(other, ChunkKind::Text(_));
                for event in framer.events(&other) {
                    if !send(event).await {
                        return;
                    }
                }
                if is_text {
                    shared.lock().text_sent.push(std::time::Instant::now());
                }
            }
        }
    }
    let _ = send(sse("[DONE]")).await;
}

/// `data: <data>\n\n`.
fn sse(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// Renders chunks with the envelope fields of one response.
struct Framer {
    id: String,
    model: String,
    created: u64,
}

impl Framer {
    fn envelope(&self, choices: Value, usage: Value) -> Bytes {
        sse(&json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_fake",
            "choices": choices,
            "usage": usage,
        })
        .to_string())
    }

    fn delta(&self, delta: Value, finish_reason: Value) -> Bytes {
        self.envelope(
            json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]),
            Value::Null,
        )
    }

    fn role(&self) -> Bytes {
        self.delta(
            json!({"role": "assistant", "content": "", "refusal": null}),
            Value::Null,
        )
    }

    fn events(&self, chunk: &ChunkKind) -> Vec<Bytes> {
        match chunk {
            ChunkKind::Text(s) => vec![self.delta(json!({"content": s}), Value::Null)],
            ChunkKind::ToolCall {
                index,
                id,
                name,
                fragments,
            } => {
                let first_args = fragments.first().map(String::as_str).unwrap_or("");
                let mut first = json!({
                    "index": index,
                    "type": "function",
                    "function": {"name": name, "arguments": first_args},
                });
                if !id.is_empty()
                    && let Some(obj) = first.as_object_mut()
                {
                    obj.insert("id".into(), json!(id));
                }
                let mut events = vec![self.delta(json!({"tool_calls": [first]}), Value::Null)];
                events.extend(fragments.iter().skip(1).map(|fragment| {
                    self.delta(
                        json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}),
                        Value::Null,
                    )
                }));
                events
            }
            ChunkKind::Finish(reason) => vec![self.delta(json!({}), json!(reason))],
            ChunkKind::Usage { prompt, completion } => vec![self.envelope(
                json!([]),
                json!({
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                }),
            )],
            ChunkKind::Raw(data) => vec![sse(data)],
            ChunkKind::Pause(_) | ChunkKind::Cut => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

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
}

#[cfg(test)]
mod script_tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    #[test]
    fn parses_script_items() {
        assert_eq!(
            parse_reply(0, &json!({"text": "hi"})).unwrap(),
            Reply::text("hi")
        );
        assert_eq!(
            parse_reply(
                3,
                &json!({"tool_call": {"name": "f", "arguments": {"a": 1}}})
            )
            .unwrap(),
            Reply::tool_call("call_3", "f", json!({"a": 1}))
        );
        assert_eq!(
            parse_reply(
                0,
                &json!({"tool_call": {"id": "x", "name": "f", "arguments": {}}})
            )
            .unwrap(),
            Reply::tool_call("x", "f", json!({}))
        );
        assert_eq!(
            parse_reply(0, &json!({"error": {"status": 503, "message": "busy"}})).unwrap(),
            Reply::error(503, "busy")
        );
        assert_eq!(
            parse_reply(
                0,
                &json!({"error": {"status": 429, "message": "slow", "retry_after": 3}})
            )
            .unwrap(),
            Reply::error(429, "slow").retry_after(3)
        );
        assert!(parse_reply(0, &json!({"error": {"retry_after": "soon"}})).is_err());
        assert!(parse_reply(0, &json!({"nope": 1})).is_err());
        assert!(parse_reply(0, &json!({"text": 5})).is_err());
    }

    #[test]
    fn parses_scripts() {
        assert_eq!(
            parse_script(&json!([{"text": "a"}, {"text": "b"}]))
                .unwrap()
                .len(),
            2
        );
        assert!(parse_script(&json!([])).is_err());
        assert!(parse_script(&json!({"text": "a"})).is_err());
    }
}
