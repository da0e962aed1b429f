//! The HTTP routes: chat (OpenAI and Ollama), model listings, the control
//! API, and the errors each protocol expects.

use super::wire::*;
use super::*;

pub(super) fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The two wire protocols served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Protocol {
    OpenAi,
    Ollama,
    Anthropic,
}

pub(super) fn error_response(status: u16, message: &str) -> Response {
    protocol_error(Protocol::OpenAi, status, message)
}

/// An error answer in the format of `protocol`.
pub(super) fn protocol_error(protocol: Protocol, status: u16, message: &str) -> Response {
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
        Protocol::Anthropic => json_response(
            status,
            &json!({"type": "error", "error": {
                "type": super::anthropic::error_type(status.as_u16()),
                "message": message,
            }}),
        ),
    }
}

pub(super) async fn not_found(request: Request) -> Response {
    let message = format!(
        "fake model: no route for {} {}",
        request.method(),
        request.uri().path()
    );
    error_response(404, &message)
}

pub(super) async fn models(State(shared): State<Arc<Shared>>) -> Response {
    let mut data = json!([
        {"id": "fake-model", "object": "model", "created": 0, "owned_by": "agentry-testkit"},
        {"id": "fake-model-large", "object": "model", "created": 0, "owned_by": "agentry-testkit"},
    ]);
    if let ServerKind::Vllm { max_model_len } = shared.lock().server
        && let Some(models) = data.as_array_mut()
    {
        for model in models {
            model["max_model_len"] = json!(max_model_len);
        }
    }
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

pub(super) async fn ollama_tags() -> Response {
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

/// What the replies read of a chat request, for a server that does not
/// keep requests: the model, and of the messages only the last one and the
/// last from the user (in their order). The other messages are checked as
/// JSON but not built into a tree: a long conversation's request costs the
/// fake little more than a short one's, as a real server's parser does.
/// `None` when the body is not such an object (it is then read whole).
fn lean_request(body: &[u8]) -> Option<Value> {
    use serde_json::value::RawValue;
    #[derive(serde::Deserialize)]
    struct Lean<'a> {
        #[serde(default)]
        model: Option<String>,
        #[serde(borrow, default)]
        messages: Vec<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Role {
        #[serde(default)]
        role: Option<String>,
    }
    let lean: Lean = serde_json::from_slice(body).ok()?;
    let mut kept = Vec::new();
    for (i, raw) in lean.messages.iter().enumerate().rev() {
        let role = serde_json::from_str::<Role>(raw.get()).ok()?.role;
        if i + 1 == lean.messages.len() || role.as_deref() == Some("user") {
            kept.push(serde_json::from_str::<Value>(raw.get()).ok()?);
        }
        if role.as_deref() == Some("user") {
            break;
        }
    }
    kept.reverse();
    let mut request = serde_json::Map::new();
    if let Some(model) = lean.model {
        request.insert("model".into(), Value::String(model));
    }
    request.insert("messages".into(), Value::Array(kept));
    Some(Value::Object(request))
}

/// The text of the last message of a request body, whatever its role (the
/// text and tool-result blocks of a message made of blocks).
pub(super) fn last_message(body: &Value) -> String {
    body.get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .map(|m| match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(blocks)) => blocks
                .iter()
                .filter_map(|b| b.get("text").or_else(|| b.get("content")))
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        })
        .unwrap_or_default()
}

/// The text of the last user message of a request body.
pub(super) fn last_user_message(body: &Value) -> String {
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

/// The calls the last user message of `body` lists (`call NAME {JSON}`
/// lines), and how many tool results follow that message.
fn directed_step(body: &Value) -> (Vec<(String, Value)>, usize) {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let from = messages
        .iter()
        .rposition(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .unwrap_or(0);
    let done = messages[from..]
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
        .count();
    let calls = last_user_message(body)
        .lines()
        .filter_map(|line| {
            let (name, arguments) = line.trim().strip_prefix("call ")?.split_once(' ')?;
            Some((name.to_string(), serde_json::from_str(arguments).ok()?))
        })
        .collect();
    (calls, done)
}

/// `POST /_fake/replies`: queues the replies of a script (see [`parse_script`]), so a
/// test driving the server from outside (a container, a shell script) can say what
/// the next model calls answer.
pub(super) async fn push_replies(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
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
pub(super) async fn request_count(State(shared): State<Arc<Shared>>) -> Response {
    let inner = shared.lock();
    Json(serde_json::json!({"requests": inner.request_total, "pending": inner.queue.len()}))
        .into_response()
}

pub(super) async fn chat_completions(
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

pub(super) async fn ollama_chat(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    chat(shared, Protocol::Ollama, "/api/chat", headers, body).await
}

/// Captures a chat request and answers it with the next scripted reply.
pub(super) async fn chat(
    shared: Arc<Shared>,
    protocol: Protocol,
    path: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // A directed conversation counts the tool results of its whole turn:
    // it needs every message.
    let forget = {
        let inner = shared.lock();
        inner.forget_requests && inner.fallback != Fallback::Directed
    };
    let request: Arc<Value> = Arc::new(
        forget
            .then(|| lean_request(&body))
            .flatten()
            .unwrap_or_else(|| {
                serde_json::from_slice(&body)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()))
            }),
    );
    let reply = {
        let mut inner = shared.lock();
        inner.record(request.clone(), &headers, path);
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
                Fallback::Directed => {
                    let (calls, done) = directed_step(&request);
                    Some(match calls.into_iter().nth(done) {
                        Some((name, arguments)) => {
                            let n = inner.script_pos;
                            inner.script_pos = inner.script_pos.wrapping_add(1);
                            Reply::tool_call(&format!("call_{n}"), &name, arguments)
                        }
                        None => Reply::text("done"),
                    })
                }
                Fallback::Match { rules, otherwise } => {
                    let last = last_message(&request);
                    let reply = rules
                        .iter()
                        .find(|(text, _)| last.contains(text.as_str()))
                        .map_or(&**otherwise, |(_, reply)| reply);
                    Some(reply.clone())
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
        {
            let mut inner = shared.lock();
            inner.delayed += 1;
            inner.most_delayed = inner.most_delayed.max(inner.delayed);
        }
        tokio::time::sleep(d).await;
        shared.lock().delayed -= 1;
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
                Protocol::Anthropic => {
                    let id = format!(
                        "msg_fake_{}",
                        shared.next_id.fetch_add(1, Ordering::Relaxed)
                    );
                    tokio::spawn(super::anthropic::send_events(id, model, chunks, tx));
                    "text/event-stream"
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
    for (name, value) in reply.headers {
        if let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}
