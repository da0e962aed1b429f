//! A small syntax highlighter for code blocks in answers: keywords,
//! strings, comments and numbers for the languages agents write most
//! (Rust, Python, JavaScript/TypeScript, Go, shell, C-likes, JSON, TOML,
//! YAML). One pass over each line, linear in its length; a block comment
//! or string left open at the end of a line carries to the next.

use super::theme::Theme;
use ratatui::text::Span;

/// How a language writes comments and which words it reserves.
struct Lang {
    line_comment: &'static [&'static str],
    block_comment: Option<(&'static str, &'static str)>,
    keywords: &'static [&'static str],
}

const RUST: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern",
    "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub",
    "ref", "return", "self", "Self", "static", "struct", "super", "trait", "true", "type",
    "unsafe", "use", "where", "while",
];
const PYTHON: &[&str] = &[
    "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del", "elif",
    "else", "except", "False", "finally", "for", "from", "global", "if", "import", "in", "is",
    "lambda", "None", "nonlocal", "not", "or", "pass", "raise", "return", "True", "try", "while",
    "with", "yield",
];
const JS: &[&str] = &[
    "async",
    "await",
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "default",
    "delete",
    "do",
    "else",
    "export",
    "extends",
    "false",
    "finally",
    "for",
    "function",
    "if",
    "import",
    "in",
    "instanceof",
    "interface",
    "let",
    "new",
    "null",
    "of",
    "return",
    "switch",
    "this",
    "throw",
    "true",
    "try",
    "type",
    "typeof",
    "undefined",
    "var",
    "void",
    "while",
    "yield",
];
const GO: &[&str] = &[
    "break",
    "case",
    "chan",
    "const",
    "continue",
    "default",
    "defer",
    "else",
    "false",
    "for",
    "func",
    "go",
    "goto",
    "if",
    "import",
    "interface",
    "map",
    "nil",
    "package",
    "range",
    "return",
    "select",
    "struct",
    "switch",
    "true",
    "type",
    "var",
];
const SHELL: &[&str] = &[
    "case", "do", "done", "elif", "else", "esac", "export", "fi", "for", "function", "if", "in",
    "local", "return", "then", "until", "while",
];
const C: &[&str] = &[
    "auto",
    "bool",
    "break",
    "case",
    "char",
    "class",
    "const",
    "continue",
    "default",
    "do",
    "double",
    "else",
    "enum",
    "extern",
    "false",
    "final",
    "float",
    "for",
    "if",
    "import",
    "int",
    "long",
    "namespace",
    "new",
    "null",
    "nullptr",
    "package",
    "private",
    "protected",
    "public",
    "return",
    "short",
    "signed",
    "static",
    "struct",
    "switch",
    "this",
    "true",
    "typedef",
    "union",
    "unsigned",
    "void",
    "volatile",
    "while",
];
const DATA: &[&str] = &["true", "false", "null", "yes", "no"];

fn lang(name: &str) -> Option<Lang> {
    let slashes: &[&str] = &["//"];
    let hash: &[&str] = &["#"];
    let c_block = Some(("/*", "*/"));
    Some(match name.to_ascii_lowercase().as_str() {
        "rust" | "rs" => Lang {
            line_comment: slashes,
            block_comment: c_block,
            keywords: RUST,
        },
        "python" | "py" => Lang {
            line_comment: hash,
            block_comment: None,
            keywords: PYTHON,
        },
        "js" | "javascript" | "ts" | "typescript" | "jsx" | "tsx" => Lang {
            line_comment: slashes,
            block_comment: c_block,
            keywords: JS,
        },
        "go" | "golang" => Lang {
            line_comment: slashes,
            block_comment: c_block,
            keywords: GO,
        },
        "sh" | "bash" | "shell" | "zsh" | "console" => Lang {
            line_comment: hash,
            block_comment: None,
            keywords: SHELL,
        },
        "c" | "h" | "cpp" | "c++" | "cc" | "java" | "kotlin" | "cs" | "csharp" | "swift" => Lang {
            line_comment: slashes,
            block_comment: c_block,
            keywords: C,
        },
        "json" => Lang {
            line_comment: &[],
            block_comment: None,
            keywords: DATA,
        },
        "toml" | "yaml" | "yml" | "ini" => Lang {
            line_comment: hash,
            block_comment: None,
            keywords: DATA,
        },
        _ => return None,
    })
}

/// What an unfinished line leaves open for the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Carry {
    /// Nothing.
    #[default]
    None,
    /// A block comment.
    Comment,
}

/// Highlights the lines of one code block in `lang` (unknown languages
/// come back plain).
pub fn block(code: &str, lang_name: &str, theme: &Theme) -> Vec<Vec<Span<'static>>> {
    let lang = lang(lang_name);
    let mut carry = Carry::None;
    code.lines()
        .map(|line| match &lang {
            Some(lang) => {
                let (spans, next) = line_spans(line, lang, carry, theme);
                carry = next;
                spans
            }
            None => vec![Span::styled(line.to_string(), theme.text())],
        })
        .collect()
}

fn line_spans(
    line: &str,
    lang: &Lang,
    mut carry: Carry,
    theme: &Theme,
) -> (Vec<Span<'static>>, Carry) {
    let mut spans: Vec<Span<'static>> = Vec::new();
    let mut plain = String::new();
    let flush = |plain: &mut String, spans: &mut Vec<Span<'static>>| {
        if !plain.is_empty() {
            spans.push(Span::styled(std::mem::take(plain), theme.text()));
        }
    };
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < line.len() {
        let rest = &line[i..];
        if carry == Carry::Comment {
            let close = lang.block_comment.map_or("*/", |b| b.1);
            let end = match rest.find(close) {
                Some(at) => {
                    carry = Carry::None;
                    at + close.len()
                }
                None => rest.len(),
            };
            spans.push(Span::styled(rest[..end].to_string(), theme.comment()));
            i += end;
            continue;
        }
        if lang.line_comment.iter().any(|c| rest.starts_with(c)) {
            flush(&mut plain, &mut spans);
            spans.push(Span::styled(rest.to_string(), theme.comment()));
            break;
        }
        if let Some((open, close)) = lang.block_comment
            && rest.starts_with(open)
        {
            flush(&mut plain, &mut spans);
            let end = match rest[open.len()..].find(close) {
                Some(at) => open.len() + at + close.len(),
                None => {
                    carry = Carry::Comment;
                    rest.len()
                }
            };
            spans.push(Span::styled(rest[..end].to_string(), theme.comment()));
            i += end;
            continue;
        }
        let c = bytes[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            flush(&mut plain, &mut spans);
            let mut j = i + 1;
            while j < line.len() && bytes[j] != c {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(line.len());
            spans.push(Span::styled(line[i..end].to_string(), theme.string()));
            i = end;
            continue;
        }
        if c.is_ascii_digit() && (i == 0 || !is_word(bytes[i - 1])) {
            flush(&mut plain, &mut spans);
            let mut j = i;
            while j < line.len()
                && (bytes[j].is_ascii_alphanumeric() || bytes[j] == b'.' || bytes[j] == b'_')
            {
                j += 1;
            }
            spans.push(Span::styled(line[i..j].to_string(), theme.number()));
            i = j;
            continue;
        }
        if is_word(c) {
            let mut j = i;
            while j < line.len() && is_word(bytes[j]) {
                j += 1;
            }
            let word = &line[i..j];
            if lang.keywords.contains(&word) {
                flush(&mut plain, &mut spans);
                spans.push(Span::styled(word.to_string(), theme.keyword()));
            } else {
                plain.push_str(word);
            }
            i = j;
            continue;
        }
        // Any other character, whole (it may be more than one byte).
        let ch = rest.chars().next().map_or(1, char::len_utf8);
        plain.push_str(&rest[..ch]);
        i += ch;
    }
    flush(&mut plain, &mut spans);
    (spans, carry)
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn styled(spans: &[Span<'_>], theme: &Theme) -> Vec<(String, &'static str)> {
        spans
            .iter()
            .map(|s| {
                let kind = if s.style == theme.keyword() {
                    "kw"
                } else if s.style == theme.string() {
                    "str"
                } else if s.style == theme.comment() {
                    "comment"
                } else if s.style == theme.number() {
                    "num"
                } else {
                    "plain"
                };
                (s.content.to_string(), kind)
            })
            .collect()
    }

    #[test]
    fn rust_keywords_strings_numbers_and_comments_are_told_apart() {
        let theme = Theme { color: true };
        let lines = block("fn main() { let x = \"hi\"; 42 } // done", "rust", &theme);
        assert_eq!(
            styled(&lines[0], &theme),
            vec![
                ("fn".to_string(), "kw"),
                (" main() { ".to_string(), "plain"),
                ("let".to_string(), "kw"),
                (" x = ".to_string(), "plain"),
                ("\"hi\"".to_string(), "str"),
                ("; ".to_string(), "plain"),
                ("42".to_string(), "num"),
                (" } ".to_string(), "plain"),
                ("// done".to_string(), "comment"),
            ]
        );
    }

    #[test]
    fn a_block_comment_carries_to_the_next_line_and_ends_there() {
        let theme = Theme { color: true };
        let lines = block("int a; /* one\ntwo */ return 1;", "c", &theme);
        assert_eq!(
            styled(&lines[0], &theme)[2],
            ("/* one".to_string(), "comment")
        );
        assert_eq!(
            styled(&lines[1], &theme)[0],
            ("two */".to_string(), "comment")
        );
        assert!(styled(&lines[1], &theme).contains(&("return".to_string(), "kw")));
    }

    #[test]
    fn unknown_languages_and_words_inside_identifiers_stay_plain() {
        let theme = Theme { color: true };
        let lines = block("for x in y", "brainfuck", &theme);
        assert_eq!(
            styled(&lines[0], &theme),
            vec![("for x in y".to_string(), "plain")]
        );
        let lines = block("format = 1", "python", &theme);
        assert_eq!(
            styled(&lines[0], &theme)[0],
            ("format = ".to_string(), "plain")
        );
        // Multi-byte characters pass through whole.
        let lines = block("# héllo\nx = 'é'", "python", &theme);
        assert_eq!(styled(&lines[1], &theme)[1], ("'é'".to_string(), "str"));
    }
}
