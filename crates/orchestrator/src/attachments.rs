//! `@server:uri` in a person's message attaches that MCP resource: the
//! orchestrator reads it through a tool runner (as the session, inside its
//! sandbox) and adds its content to the message, which the log then keeps.

/// Most resources one message may attach.
pub const MAX_ATTACHMENTS: usize = 8;

/// The `@server:uri` mentions of `text`, in order, without repeats: a word
/// that starts with `@`, then a name of letters, digits, `-` or `_`, a
/// colon, and the URI (trailing punctuation of the sentence is not part of
/// it).
pub fn mentions(text: &str) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = Vec::new();
    for word in text.split_whitespace() {
        let Some(rest) = word.strip_prefix('@') else {
            continue;
        };
        let Some((server, uri)) = rest.split_once(':') else {
            continue;
        };
        let uri = uri.trim_end_matches(['.', ',', ';', '!', '?', ')', '\'', '"']);
        let name_ok = !server.is_empty()
            && server.len() <= 32
            && server
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok || uri.is_empty() {
            continue;
        }
        let mention = (server.to_string(), uri.to_string());
        if !found.contains(&mention) {
            found.push(mention);
        }
    }
    found
}

/// The message with the resources' contents attached after it.
pub fn attach(text: &str, resources: &[(String, String, String, String)]) -> String {
    let mut out = text.to_string();
    for (server, uri, mime, content) in resources {
        let mime = if mime.is_empty() {
            String::new()
        } else {
            format!(" ({mime})")
        };
        out.push_str(&format!(
            "\n\n[attached: the resource {uri} of the MCP server {server}{mime}]\n{content}"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_are_words_naming_a_server_and_a_uri() {
        assert_eq!(
            mentions(
                "summarise @docs:file:///guide.md, then @fx:watch://file. Ask me@home:x or @:y or @bad name:z"
            ),
            vec![
                ("docs".to_string(), "file:///guide.md".to_string()),
                ("fx".to_string(), "watch://file".to_string()),
            ]
        );
        assert_eq!(
            mentions("@a:b and @a:b again"),
            vec![("a".to_string(), "b".to_string())]
        );
        assert!(mentions("mail me at someone@example.org").is_empty());
    }

    #[test]
    fn attachments_follow_the_message() {
        let text = attach(
            "read this",
            &[(
                "fx".into(),
                "watch://file".into(),
                "text/plain".into(),
                "hello".into(),
            )],
        );
        assert_eq!(
            text,
            "read this\n\n[attached: the resource watch://file of the MCP server fx (text/plain)]\nhello"
        );
    }
}
