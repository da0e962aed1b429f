//! Anthropic's Messages API, as strict as the real one about what it
//! accepts: `POST /v1/messages` with `x-api-key` and `anthropic-version`,
//! `model`, `max_tokens`, messages that alternate user / assistant starting
//! with the user, non-empty text blocks, every `tool_use` answered by a
//! `tool_result` in the next user message and no `tool_result` without its
//! `tool_use`, at most four `cache_control` breakpoints. A request that
//! breaks a rule gets the API's 400 `invalid_request_error` (and consumes
//! no scripted reply).
//!
//! Replies stream as the API's server-sent events: `message_start` (input
//! usage, cache reads and writes), content blocks (`text_delta`,
//! `input_json_delta`), `message_delta` (stop reason, output usage),
//! `message_stop`.

use super::wire::{cut_body, sse};
use super::*;

/// The API's error type for an HTTP status.
pub(super) fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

/// `POST /v1/messages`.
pub(super) async fn messages(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err((status, message)) = check(&headers, &body) {
        let request = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
        shared
            .lock()
            .record(Arc::new(request), &HeaderMap::new(), "/v1/messages");
        return protocol_error(Protocol::Anthropic, status, &message);
    }
    chat(shared, Protocol::Anthropic, "/v1/messages", headers, body).await
}

/// What the real API would refuse, with its status and message.
fn check(headers: &HeaderMap, body: &[u8]) -> Result<(), (u16, String)> {
    let invalid = |message: String| Err((400, message));
    if headers.get("x-api-key").is_none_or(|k| k.is_empty()) {
        return Err((401, "x-api-key header is required".into()));
    }
    if headers.get("anthropic-version").is_none() {
        return invalid("anthropic-version: header is required".into());
    }
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return invalid("There was an error parsing the body of your request.".into());
    };
    if request["model"].as_str().is_none_or(str::is_empty) {
        return invalid("model: Field required".into());
    }
    if request["max_tokens"].as_u64().is_none_or(|n| n == 0) {
        return invalid("max_tokens: Field required (an integer of at least 1)".into());
    }
    let mut breakpoints = 0;
    match &request["system"] {
        Value::Null | Value::String(_) => {}
        Value::Array(blocks) => {
            for block in blocks {
                if block["type"] != "text" || block["text"].as_str().is_none_or(str::is_empty) {
                    return invalid("system: text content blocks must be non-empty".into());
                }
                breakpoints += usize::from(block.get("cache_control").is_some());
            }
        }
        _ => return invalid("system: Input should be a valid string or list".into()),
    }
    if let Some(tools) = request.get("tools") {
        for (i, tool) in tools.as_array().into_iter().flatten().enumerate() {
            if tool["name"].as_str().is_none_or(str::is_empty) || !tool["input_schema"].is_object()
            {
                return invalid(format!("tools.{i}: name and input_schema are required"));
            }
            breakpoints += usize::from(tool.get("cache_control").is_some());
        }
    }
    let Some(messages) = request["messages"].as_array().filter(|m| !m.is_empty()) else {
        return invalid("messages: at least one message is required".into());
    };
    let mut open_calls: Vec<String> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or_default();
        let expected = if i % 2 == 0 { "user" } else { "assistant" };
        if role != expected {
            return invalid(format!(
                "messages.{i}: roles must alternate between \"user\" and \"assistant\", \
                 starting with \"user\"; got \"{role}\""
            ));
        }
        let blocks: Vec<Value> = match &message["content"] {
            Value::String(text) => vec![json!({"type": "text", "text": text})],
            Value::Array(blocks) => blocks.clone(),
            _ => return invalid(format!("messages.{i}.content: a string or a list")),
        };
        let mut answered: Vec<String> = Vec::new();
        for (j, block) in blocks.iter().enumerate() {
            breakpoints += usize::from(block.get("cache_control").is_some());
            match block["type"].as_str() {
                Some("text") if block["text"].as_str().is_some_and(|t| !t.trim().is_empty()) => {}
                Some("text") => {
                    return invalid(format!(
                        "messages.{i}.content.{j}: text content blocks must be non-empty"
                    ));
                }
                Some("tool_use") if role == "assistant" => {
                    if !block["input"].is_object() {
                        return invalid(format!(
                            "messages.{i}.content.{j}.tool_use.input: Input should be an object"
                        ));
                    }
                    open_calls.push(block["id"].as_str().unwrap_or_default().to_string());
                }
                Some("tool_result") if role == "user" => {
                    let id = block["tool_use_id"].as_str().unwrap_or_default();
                    if !open_calls.iter().any(|c| c == id) {
                        return invalid(format!(
                            "messages.{i}.content.{j}: unexpected `tool_use_id` found in \
                             `tool_result` blocks: {id}. Each `tool_result` block must have a \
                             corresponding `tool_use` block in the previous message."
                        ));
                    }
                    answered.push(id.to_string());
                }
                other => {
                    return invalid(format!(
                        "messages.{i}.content.{j}: a {other:?} block is not allowed in a {role} \
                         message"
                    ));
                }
            }
        }
        if role == "user" {
            if let Some(missing) = open_calls.iter().find(|c| !answered.contains(c)) {
                return invalid(format!(
                    "messages.{i}: `tool_use` ids were found without `tool_result` blocks \
                     immediately after: {missing}"
                ));
            }
            open_calls.clear();
        }
    }
    if messages.len() % 2 == 0 {
        return invalid("the last message must be from the user".into());
    }
    if breakpoints > 4 {
        return invalid(format!(
            "A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
        ));
    }
    Ok(())
}

/// `event: <type>\ndata: <json>\n\n`.
fn event(data: &Value) -> Bytes {
    let kind = data["type"].as_str().unwrap_or("message");
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// The API's stop reason for one of the fake's finish reasons.
fn stop_reason(finish: &str) -> &str {
    match finish {
        "stop" => "end_turn",
        "tool_calls" => "tool_use",
        "length" => "max_tokens",
        other => other,
    }
}

/// Streams `chunks` as the API's events into `tx`; stops when the client
/// is gone.
pub(super) async fn send_events(
    id: String,
    model: String,
    chunks: Vec<Chunk>,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let send = |bytes: Bytes| {
        let tx = tx.clone();
        async move { tx.send(Ok(bytes)).await.is_ok() }
    };
    // Input usage comes first on this wire: taken from the usage chunk.
    let (prompt, completion, cached, written) = chunks
        .iter()
        .find_map(|c| match c.0 {
            ChunkKind::Usage {
                prompt,
                completion,
                cached,
                written,
            } => Some((prompt, completion, cached, written)),
            _ => None,
        })
        .unwrap_or((0, 0, 0, 0));
    let start = json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {
            "input_tokens": prompt.saturating_sub(cached + written),
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": cached,
            "output_tokens": 1,
        },
    }});
    if !send(event(&start)).await || !send(event(&json!({"type": "ping"}))).await {
        return;
    }
    let mut index = 0u64;
    let mut text_open = false;
    let mut called = false;
    let mut finish: Option<String> = None;
    for chunk in chunks {
        let events = match chunk.0 {
            ChunkKind::Pause(d) => {
                tokio::time::sleep(d).await;
                continue;
            }
            ChunkKind::Cut => {
                cut_body(&tx).await;
                return;
            }
            ChunkKind::Finish(reason) => {
                finish = Some(reason);
                continue;
            }
            ChunkKind::Usage { .. } => continue,
            ChunkKind::Raw(data) => vec![sse(&data)],
            ChunkKind::Text(text) => {
                let mut events = Vec::new();
                if !text_open {
                    events.push(event(
                        &json!({"type": "content_block_start", "index": index,
                        "content_block": {"type": "text", "text": ""}}),
                    ));
                    text_open = true;
                }
                events.push(event(
                    &json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": text}}),
                ));
                events
            }
            ChunkKind::ToolCall {
                id,
                name,
                fragments,
                ..
            } => {
                let mut events = Vec::new();
                if text_open {
                    events.push(event(
                        &json!({"type": "content_block_stop", "index": index}),
                    ));
                    index += 1;
                    text_open = false;
                }
                let id = if id.is_empty() {
                    format!("toolu_fake_{index}")
                } else {
                    id
                };
                events.push(event(
                    &json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                ));
                events.extend(fragments.iter().map(|fragment| {
                    event(&json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": fragment}}))
                }));
                events.push(event(
                    &json!({"type": "content_block_stop", "index": index}),
                ));
                index += 1;
                called = true;
                events
            }
        };
        for bytes in events {
            if !send(bytes).await {
                return;
            }
        }
    }
    if text_open
        && !send(event(
            &json!({"type": "content_block_stop", "index": index}),
        ))
        .await
    {
        return;
    }
    let reason = match finish.as_deref() {
        Some(finish) => stop_reason(finish).to_string(),
        None if called => "tool_use".to_string(),
        None => "end_turn".to_string(),
    };
    let delta = json!({"type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": null},
        "usage": {"output_tokens": completion}});
    if send(event(&delta)).await {
        let _ = send(event(&json!({"type": "message_stop"}))).await;
    }
}
