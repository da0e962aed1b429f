//! Streaming a reply on the wire: server-sent events for OpenAI, one JSON
//! object per line for Ollama, cut streams and raw data.

use super::*;

/// Lets the server flush what was sent so far (it flushes when the body has nothing ready),
/// then aborts the connection mid-body with an error item.
pub(super) async fn cut_body(tx: &mpsc::Sender<Result<Bytes, std::io::Error>>) {
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
pub(super) async fn send_ndjson(
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
            ChunkKind::Usage {
                prompt, completion, ..
            } => {
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
pub(super) fn rfc3339_now() -> String {
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
pub(super) async fn send_stream(
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
                for event in framer.events(&other) {
                    if !send(event).await {
                        return;
                    }
                }
                if let ChunkKind::Text(text) = other {
                    let at = std::time::Instant::now();
                    shared.lock().texts_sent.push((text, at));
                }
            }
        }
    }
    let _ = send(sse("[DONE]")).await;
}

/// `data: <data>\n\n`.
pub(super) fn sse(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// Renders chunks with the envelope fields of one response.
pub(super) struct Framer {
    pub(super) id: String,
    pub(super) model: String,
    pub(super) created: u64,
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
            ChunkKind::Usage {
                prompt,
                completion,
                cached,
                ..
            } => {
                let mut usage = json!({
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                });
                if *cached > 0 {
                    usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
                }
                vec![self.envelope(json!([]), usage)]
            }
            ChunkKind::Raw(data) => vec![sse(data)],
            ChunkKind::Pause(_) | ChunkKind::Cut => Vec::new(),
        }
    }
}
