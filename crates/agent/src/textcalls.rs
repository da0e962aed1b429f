//! Tool calls written as text, for models without native tool calling (or
//! that answer with a call in prose anyway). Two forms are understood:
//!
//! ```text
//! TOOL:read_file {"path": "notes.txt"}
//! ```
//!
//! (one call per line; the JSON may continue on the following lines), and a
//! fenced JSON block naming a tool:
//!
//! ````text
//! ```json
//! {"name": "read_file", "arguments": {"path": "notes.txt"}}
//! ```
//! ````
//!
//! A fenced block whose `name` is not a known tool is ordinary prose. A
//! `TOOL:` line that cannot be read, or a block naming a known tool with bad
//! arguments, is a malformed call: the caller asks the model once for the
//! exact format, then gives up with a clear error.

use serde_json::Value;
use std::collections::BTreeSet;

/// A call found in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextCall {
    /// The tool.
    pub name: String,
    /// Its arguments, as a JSON object text.
    pub arguments: String,
}

/// What the text held.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    /// The text without the calls.
    pub prose: String,
    /// The calls, in order.
    pub calls: Vec<TextCall>,
}

/// The instructions for a model that calls tools through text.
///
/// `lean` gives each tool one line (its signature and first sentence)
/// instead of its description and JSON schema.
pub fn instructions(tools: &[agentry_llm::ToolDefinition], lean: bool) -> String {
    let mut out = String::from(
        "You can use tools. To call one, write a line of its own, exactly:\n\
         TOOL:<tool name> <arguments as one JSON object>\n\
         for example: TOOL:read_file {\"path\": \"notes.txt\"}\n\
         Then stop and wait: the result comes back in the next message. \
         Call tools only this way. The tools:\n",
    );
    for tool in tools {
        if lean {
            out.push_str(&format!("- {}\n", crate::prompt::lean::signature(tool)));
            continue;
        }
        out.push_str(&format!(
            "- {}: {}\n  arguments (JSON schema): {}\n",
            tool.name, tool.description, tool.parameters
        ));
    }
    out
}

/// The corrective message sent after a malformed call.
pub fn correction(error: &str) -> String {
    format!(
        "Your tool call could not be read: {error}. Write it again as a line of its own, \
         exactly TOOL:<tool name> {{\"argument\": \"value\"}} with the arguments as one \
         JSON object, and nothing else on that line."
    )
}

fn parse_arguments(value: Value, tool: &str) -> Result<String, String> {
    match value {
        Value::Object(_) => Ok(value.to_string()),
        Value::String(s) => match serde_json::from_str::<Value>(&s) {
            Ok(inner @ Value::Object(_)) => Ok(inner.to_string()),
            _ => Err(format!(
                "the arguments of {tool} must be a JSON object, got the string {s:?}"
            )),
        },
        Value::Null => Ok("{}".into()),
        other => Err(format!(
            "the arguments of {tool} must be a JSON object, got {other}"
        )),
    }
}

/// Finds the calls in `text`. `tools` are the names the model may call.
pub fn parse(text: &str, tools: &BTreeSet<String>) -> Result<Parsed, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut parsed = Parsed::default();
    let mut prose: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if let Some(rest) = line.strip_prefix("TOOL:") {
            let rest = rest.trim_start();
            let (name, json_start) = match rest.find(|c: char| c.is_whitespace() || c == '{') {
                Some(at) => (&rest[..at], rest[at..].trim_start()),
                None => (rest, ""),
            };
            if name.is_empty() {
                return Err(format!("no tool name after TOOL: in {line:?}"));
            }
            if !tools.contains(name) {
                return Err(format!(
                    "there is no tool named {name:?} (the tools: {})",
                    tools.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
            // The JSON may continue on the next lines.
            let mut json = json_start.to_string();
            let mut end = i;
            let arguments = loop {
                if json.trim().is_empty() {
                    break Ok("{}".to_string());
                }
                match serde_json::from_str::<Value>(&json) {
                    Ok(value) => break parse_arguments(value, name),
                    Err(e) if e.is_eof() && end + 1 < lines.len() => {
                        end += 1;
                        json.push('\n');
                        json.push_str(lines[end]);
                    }
                    Err(e) => {
                        break Err(format!(
                            "the arguments of {name} are not valid JSON ({e}): {}",
                            json.trim()
                        ));
                    }
                }
            }?;
            parsed.calls.push(TextCall {
                name: name.to_string(),
                arguments,
            });
            i = end + 1;
            continue;
        }
        if let Some(lang) = line.strip_prefix("```")
            && matches!(lang.trim(), "" | "json" | "tool" | "tool_call")
            && let Some(close) = (i + 1..lines.len()).find(|&j| lines[j].trim() == "```")
        {
            let body = lines[i + 1..close].join("\n");
            let value = serde_json::from_str::<Value>(&body).ok();
            let name = value
                .as_ref()
                .and_then(|v| v.get("name"))
                .and_then(Value::as_str)
                .map(str::to_string);
            if let (Some(value), Some(name)) = (value, name)
                && tools.contains(&name)
            {
                let arguments = value.get("arguments").cloned().unwrap_or(Value::Null);
                parsed.calls.push(TextCall {
                    arguments: parse_arguments(arguments, &name)?,
                    name,
                });
                i = close + 1;
                continue;
            }
            // Not a call: keep the block as prose.
            prose.extend(&lines[i..=close]);
            i = close + 1;
            continue;
        }
        prose.push(lines[i]);
        i += 1;
    }
    parsed.prose = prose.join("\n").trim().to_string();
    Ok(parsed)
}

/// Whether `text` looks like it tries to call a tool (so a parse error is
/// worth a correction rather than taking the text as the answer).
pub fn looks_like_a_call(text: &str) -> bool {
    text.lines().any(|l| l.trim_start().starts_with("TOOL:"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn tools() -> BTreeSet<String> {
        ["read_file", "bash"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn call(name: &str, arguments: &str) -> TextCall {
        TextCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn tool_lines_are_calls_and_the_rest_is_prose() {
        let p = parse(
            "Let me look.\nTOOL:read_file {\"path\": \"a.txt\"}\n  TOOL: bash {\"command\": \"ls\"}\nThen I answer.",
            &tools(),
        )
        .unwrap();
        assert_eq!(
            p.calls,
            vec![
                call("read_file", r#"{"path":"a.txt"}"#),
                call("bash", r#"{"command":"ls"}"#)
            ]
        );
        assert_eq!(p.prose, "Let me look.\nThen I answer.");
    }

    #[test]
    fn arguments_may_span_lines_or_be_absent() {
        let p = parse(
            "TOOL:bash {\n  \"command\": \"ls\"\n}\nTOOL:read_file",
            &tools(),
        )
        .unwrap();
        assert_eq!(
            p.calls,
            vec![call("bash", r#"{"command":"ls"}"#), call("read_file", "{}")]
        );
    }

    #[test]
    fn fenced_blocks_naming_a_tool_are_calls() {
        let text = "Sure.\n```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"b\"}}\n```\n\
                    ```\n{\"name\": \"bash\", \"arguments\": \"{\\\"command\\\": \\\"pwd\\\"}\"}\n```\n\
                    ```json\n{\"name\": \"weather\", \"city\": \"Oslo\"}\n```";
        let p = parse(text, &tools()).unwrap();
        assert_eq!(
            p.calls,
            vec![
                call("read_file", r#"{"path":"b"}"#),
                call("bash", r#"{"command":"pwd"}"#)
            ]
        );
        // A block naming no known tool stays prose.
        assert!(p.prose.contains("weather"), "{}", p.prose);
    }

    #[test]
    fn malformed_calls_are_errors_that_say_why() {
        let err = parse("TOOL:read_file {\"path\": ", &tools()).unwrap_err();
        assert!(err.contains("not valid JSON"), "{err}");
        let err = parse("TOOL:rm {}", &tools()).unwrap_err();
        assert!(err.contains("no tool named \"rm\""), "{err}");
        let err = parse("TOOL:bash [1, 2]", &tools()).unwrap_err();
        assert!(err.contains("must be a JSON object"), "{err}");
        let err = parse("TOOL: ", &tools()).unwrap_err();
        assert!(err.contains("no tool name"), "{err}");
        let err = parse(
            "```json\n{\"name\": \"bash\", \"arguments\": 5}\n```",
            &tools(),
        )
        .unwrap_err();
        assert!(err.contains("must be a JSON object"), "{err}");
    }

    #[test]
    fn plain_text_has_no_calls() {
        let p = parse("Just an answer.\n```rust\nfn main() {}\n```", &tools()).unwrap();
        assert!(p.calls.is_empty());
        assert!(!looks_like_a_call("Just an answer."));
        assert!(looks_like_a_call("ok\nTOOL:bash {}"));
    }

    #[test]
    fn instructions_name_every_tool_and_the_format() {
        let text = instructions(
            &[agentry_llm::ToolDefinition {
                name: "read_file".into(),
                description: "Reads a file.".into(),
                parameters: serde_json::json!({"type": "object"}),
            }],
            false,
        );
        assert!(text.contains("TOOL:<tool name>"));
        assert!(text.contains("- read_file: Reads a file."));
        assert!(correction("bad JSON").contains("bad JSON"));
    }
}
