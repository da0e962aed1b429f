//! `@server:uri` in a person's message attaches that MCP resource, and
//! `@path` a file of the session's workspace or project (`@dir/` a
//! listing): the orchestrator reads it through a tool runner (as the
//! session, inside its sandbox) and adds its content to the message, which
//! the log then keeps.

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

/// A path mentioned with `@`: a word that starts with `@` and is no
/// `@server:uri` mention (no colon), trailing punctuation of the sentence
/// left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMention {
    /// The path as written, relative to the session's directory.
    pub path: String,
    /// Written with a trailing `/`: a listing is asked for.
    pub dir: bool,
    /// It looks like a path (holds `/` or `.`): one that cannot be read
    /// refuses the message. Other words (`@alice`) are attached only when
    /// such a file exists.
    pub clearly_a_path: bool,
}

/// The `@path` mentions of `text`, in order, without repeats.
pub fn file_mentions(text: &str) -> Vec<FileMention> {
    let mut found: Vec<FileMention> = Vec::new();
    for word in text.split_whitespace() {
        let Some(rest) = word.strip_prefix('@') else {
            continue;
        };
        let path = rest.trim_end_matches(['.', ',', ';', '!', '?', ')', '\'', '"']);
        if path.is_empty() || path.contains(':') || path.starts_with('@') {
            continue;
        }
        let dir = path.ends_with('/');
        let trimmed = path.trim_end_matches('/');
        let mention = FileMention {
            path: if trimmed.is_empty() {
                ".".to_string()
            } else {
                trimmed.to_string()
            },
            dir,
            clearly_a_path: dir || path.contains('/') || path.contains('.'),
        };
        if !found.iter().any(|m| m.path == mention.path) {
            found.push(mention);
        }
    }
    found
}

/// Whether `path` names an image (by its extension): images are not sent
/// as text.
pub fn is_image(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    [
        ".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tiff", ".ico",
    ]
    .iter()
    .any(|ext| lower.ends_with(ext))
}

/// The message with the files' contents (or listings) attached after it:
/// (path, is a listing, content).
pub fn attach_files(text: &str, files: &[(String, bool, String)]) -> String {
    let mut out = text.to_string();
    for (path, listing, content) in files {
        let what = if *listing {
            format!("the listing of the directory {path}")
        } else {
            format!("the file {path}")
        };
        out.push_str(&format!("\n\n[attached: {what}]\n{content}"));
    }
    out
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
    fn path_mentions_are_words_without_a_colon() {
        let found = file_mentions(
            "fix @src/main.rs, see @docs/ and @README.md. Thanks @alice; not @server:uri or a@b.c",
        );
        let paths: Vec<(&str, bool, bool)> = found
            .iter()
            .map(|m| (m.path.as_str(), m.dir, m.clearly_a_path))
            .collect();
        assert_eq!(
            paths,
            [
                ("src/main.rs", false, true),
                ("docs", true, true),
                ("README.md", false, true),
                ("alice", false, false),
            ]
        );
        assert_eq!(file_mentions("@./ twice @./")[0].path, ".");
        assert_eq!(file_mentions("@a.rs @a.rs").len(), 1);
        assert!(is_image("shot.PNG") && !is_image("main.rs"));
        assert_eq!(
            attach_files("look", &[("a.rs".into(), false, "fn a() {}".into())]),
            "look\n\n[attached: the file a.rs]\nfn a() {}"
        );
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
