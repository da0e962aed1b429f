//! Scripts: replies given as JSON (the control API, the binary's script
//! files).

use super::*;

/// Parses a script: a JSON array of replies, each one of
/// `{"text": "..."}`, `{"tool_call": {"name": "...", "arguments": {...}, "id": "..."}}` or
/// `{"error": {"status": 503, "message": "...", "retry_after": 2}}` (`id` and `retry_after`
/// are optional); any of them may add `"delay_ms": N` to be answered that late. The `agentry-fake-model` program's `--script` file and `POST /_fake/replies`
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
    let reply = parse_kind(n, item)?;
    Ok(match item.get("delay_ms") {
        None => reply,
        Some(ms) => reply
            .delay(std::time::Duration::from_millis(ms.as_u64().with_context(
                || format!("reply {n}: \"delay_ms\" must be a whole number"),
            )?)),
    })
}

fn parse_kind(n: usize, item: &Value) -> anyhow::Result<Reply> {
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

#[cfg(test)]
mod tests;

#[cfg(test)]
mod delay_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_reply_may_be_answered_late() {
        let script = serde_json::json!([{"text": "slow", "delay_ms": 1500}, {"text": "fast"}]);
        let replies = parse_script(&script).unwrap();
        assert_eq!(
            replies[0].delay,
            Some(std::time::Duration::from_millis(1500))
        );
        assert_eq!(replies[1].delay, None);
        let error = parse_script(&serde_json::json!([{"text": "x", "delay_ms": "soon"}]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("delay_ms"), "{error}");
    }
}
