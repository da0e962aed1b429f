//! What the model reads of an MCP tool result: text as it is, structured
//! content as JSON, embedded text resources with their URI, and a line
//! describing what it cannot read (images, audio, binary resources).

use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};

/// The text of a result, and whether the server marked it an error.
pub fn render(result: &CallToolResult) -> (String, bool) {
    let mut parts: Vec<String> = Vec::new();
    for block in &result.content {
        parts.push(match block {
            ContentBlock::Text(t) => t.text.clone(),
            ContentBlock::Image(i) => format!(
                "[image: {}, {} bytes; images are not shown to the model]",
                i.mime_type,
                decoded_len(&i.data)
            ),
            ContentBlock::Audio(a) => format!(
                "[audio: {}, {} bytes; audio is not given to the model]",
                a.mime_type,
                decoded_len(&a.data)
            ),
            ContentBlock::Resource(r) => match &r.resource {
                ResourceContents::TextResourceContents {
                    uri,
                    mime_type,
                    text,
                    ..
                } => format!(
                    "[resource {uri}{}]\n{text}",
                    mime_type
                        .as_deref()
                        .map(|m| format!(" ({m})"))
                        .unwrap_or_default()
                ),
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => format!(
                    "[resource {uri}: {}, {} bytes of binary data, not shown]",
                    mime_type.as_deref().unwrap_or("application/octet-stream"),
                    decoded_len(blob)
                ),
                _ => "[an embedded resource of a kind Agentry does not know]".to_string(),
            },
            ContentBlock::ResourceLink(link) => format!(
                "[resource link: {}{}{}]",
                link.uri,
                if link.name.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", link.name)
                },
                link.description
                    .as_deref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default()
            ),
            _ => "[content of a kind Agentry does not know]".to_string(),
        });
    }
    if let Some(structured) = &result.structured_content {
        let json = serde_json::to_string_pretty(structured).unwrap_or_default();
        // Servers usually repeat the structured result as a text block;
        // say it once.
        let repeated = parts
            .iter()
            .any(|p| serde_json::from_str::<serde_json::Value>(p).is_ok_and(|v| &v == structured));
        if !repeated {
            parts.push(json);
        }
    }
    let is_error = result.is_error.unwrap_or(false);
    let mut text = parts.join("\n");
    if text.is_empty() {
        text = if is_error {
            "(the tool reported an error without a message)".into()
        } else {
            "(no output)".into()
        };
    }
    (text, is_error)
}

/// The size of base64 data once decoded (approximately, for display).
fn decoded_len(base64: &str) -> usize {
    let clean = base64.trim_end_matches('=').len();
    clean * 3 / 4
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(json: serde_json::Value) -> CallToolResult {
        match serde_json::from_value(json) {
            Ok(r) => r,
            Err(e) => panic!("not a result: {e}"),
        }
    }

    #[test]
    fn every_kind_of_content_becomes_text() {
        let (text, is_error) = render(&result(serde_json::json!({
            "content": [
                {"type": "text", "text": "hello"},
                {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "fixture://readme", "mimeType": "text/plain", "text": "readme text"}},
                {"type": "resource", "resource": {"uri": "fixture://bin", "blob": "AAAA"}},
                {"type": "resource_link", "uri": "file:///x", "name": "x"}
            ]
        })));
        assert!(!is_error);
        assert_eq!(
            text,
            "hello\n[image: image/png, 8 bytes; images are not shown to the model]\n\
             [resource fixture://readme (text/plain)]\nreadme text\n\
             [resource fixture://bin: application/octet-stream, 3 bytes of binary data, not shown]\n\
             [resource link: file:///x (x)]"
        );
    }

    #[test]
    fn structured_content_is_said_once() {
        let (text, _) = render(&result(serde_json::json!({
            "content": [{"type": "text", "text": "{\"sum\": 5}"}],
            "structuredContent": {"sum": 5}
        })));
        assert_eq!(text, "{\"sum\": 5}");
        let (text, _) = render(&result(serde_json::json!({
            "content": [],
            "structuredContent": {"sum": 5}
        })));
        assert_eq!(text, "{\n  \"sum\": 5\n}");
    }

    #[test]
    fn errors_are_marked_and_never_empty() {
        let (text, is_error) = render(&result(serde_json::json!({
            "content": [{"type": "text", "text": "no such file"}],
            "isError": true
        })));
        assert!(is_error);
        assert_eq!(text, "no such file");
        let (text, is_error) = render(&result(serde_json::json!({"content": [], "isError": true})));
        assert!(is_error);
        assert!(text.contains("without a message"));
    }
}
