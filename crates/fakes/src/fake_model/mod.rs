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
mod anthropic;
mod script;
mod server;
mod window;
mod wire;

pub use script::parse_script;
use server::*;
pub use window::ServerKind;
use window::*;

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
        cached: u64,
        written: u64,
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
    usage_cached(prompt, completion, 0)
}

/// The same, saying that `cached` of the prompt's tokens came from the
/// server's prompt cache (`prompt_tokens_details.cached_tokens`).
pub fn usage_cached(prompt: u64, completion: u64, cached: u64) -> Chunk {
    usage_cache(prompt, completion, cached, 0)
}

/// The same, with `written` of the prompt's tokens written to the prompt
/// cache (Anthropic's `cache_creation_input_tokens`; other protocols do not
/// report it). `prompt` counts every prompt token.
pub fn usage_cache(prompt: u64, completion: u64, cached: u64, written: u64) -> Chunk {
    Chunk(ChunkKind::Usage {
        prompt,
        completion,
        cached,
        written,
    })
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
    headers: Vec<(String, String)>,
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
            headers: Vec::new(),
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
            headers: Vec::new(),
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

    /// Send this header with the response too (rate-limit reset headers).
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Wait `d` before sending the response headers.
    pub fn delay(mut self, d: Duration) -> Reply {
        self.delay = Some(d);
        self
    }
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
    /// The calls the conversation's last user message lists, one per step:
    /// each of its lines `call NAME {JSON arguments}`, in order, the k-th
    /// once k tool results follow that message; then the text `done`. Any
    /// number of conversations each follow their own script, and a
    /// repeated request (a restart asking again) gets the same step.
    Directed,
    /// Cycle through these replies forever (an empty list behaves like [`Fallback::Error`]).
    Script(Vec<Reply>),
    /// The reply of the first rule whose text the request's last message
    /// contains, else `otherwise`: a conversation that depends on what was
    /// asked (a tool result, a request to summarise, ...).
    Match {
        /// (text the last message contains, the reply), tried in order.
        rules: Vec<(String, Reply)>,
        /// The reply when no rule matches.
        otherwise: Box<Reply>,
    },
}

#[derive(Default)]
struct Inner {
    queue: VecDeque<Reply>,
    /// The chat requests received (shared, never copied: a growing
    /// conversation's requests are large).
    requests: Vec<Arc<Value>>,
    /// How many chat requests arrived, kept or not.
    request_total: usize,
    /// Requests are not kept (long benchmark runs).
    forget_requests: bool,
    /// Requests waiting out their reply's delay now, and the most at once.
    delayed: usize,
    most_delayed: usize,
    headers: Vec<Vec<(String, String)>>,
    paths: Vec<String>,
    fallback: Fallback,
    script_pos: usize,
    /// Each text chunk of an OpenAI stream, with when it was handed to
    /// the server.
    texts_sent: Vec<(String, std::time::Instant)>,
    /// The server it poses as when asked about its context window.
    server: ServerKind,
}

#[derive(Default)]
struct Shared {
    inner: Mutex<Inner>,
    next_id: AtomicU64,
}

impl Inner {
    /// Notes a chat request (kept unless requests are forgotten).
    fn record(&mut self, request: Arc<Value>, headers: &HeaderMap, path: &str) {
        self.request_total += 1;
        if self.forget_requests {
            return;
        }
        self.requests.push(request);
        self.headers.push(
            headers
                .iter()
                .map(|(name, value)| {
                    (
                        name.as_str().to_string(),
                        String::from_utf8_lossy(value.as_bytes()).into_owned(),
                    )
                })
                .collect(),
        );
        self.paths.push(path.to_string());
    }
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
            .route("/v1/messages", post(anthropic::messages))
            .route("/api/tags", get(ollama_tags))
            .route("/props", get(props))
            .route("/api/ps", get(ollama_ps))
            .route("/api/show", post(ollama_show))
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
        self.take_texts_sent()
            .into_iter()
            .map(|(_, at)| at)
            .collect()
    }

    /// [`FakeModel::take_text_sent`] with each chunk's text: for streams
    /// running at once, each with texts of its own.
    pub fn take_texts_sent(&self) -> Vec<(String, std::time::Instant)> {
        std::mem::take(&mut self.shared.lock().texts_sent)
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
        let inner = self.shared.lock();
        inner.requests.iter().map(|r| Value::clone(r)).collect()
    }

    /// The most requests that waited out their reply's delay at the same
    /// time (how many a client had in flight at once).
    pub fn most_in_flight(&self) -> usize {
        self.shared.lock().most_delayed
    }

    /// How many chat requests were received so far (on either endpoint).
    pub fn request_count(&self) -> usize {
        self.shared.lock().request_total
    }

    /// Stops keeping the requests, their headers and paths (what
    /// [`FakeModel::requests`] returns): for long runs whose conversations
    /// grow, where keeping every request would cost more than answering it.
    /// [`FakeModel::request_count`] still counts them.
    pub fn forget_requests(&self) {
        let mut inner = self.shared.lock();
        inner.forget_requests = true;
        inner.requests = Vec::new();
        inner.headers = Vec::new();
        inner.paths = Vec::new();
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

    /// Poses as `kind` of server when asked about the context window.
    pub fn set_server(&self, kind: ServerKind) {
        self.shared.lock().server = kind;
    }

    /// Sets what to answer when the queue is empty.
    pub fn set_fallback(&self, fallback: Fallback) {
        let mut inner = self.shared.lock();
        inner.fallback = fallback;
        inner.script_pos = 0;
    }
}

#[cfg(test)]
mod tests;
