//! Lean requests for small context windows: at 4,096 tokens the full tool
//! definitions alone would take most of the window before the person has
//! said anything. For windows up to [`LEAN_WINDOW`] tokens the model gets
//! each tool's first sentence, schemas without their prose, a one-line
//! signature per tool instead of a JSON schema when calls are written as
//! text, and only the tools the turn's skillset needs.
//!
//! Tools this module does not know (a runner's new tool, a server's) are
//! always offered: only what is known to be beside the point is left out.

use agentry_llm::ToolDefinition;
use serde_json::Value;

/// The largest context window that gets lean requests, in tokens.
pub const LEAN_WINDOW: usize = 8_192;

/// The longest description a lean tool definition keeps, in characters.
const MAX_DESCRIPTION_CHARS: usize = 120;

/// Offered in every lean request: what nearly every turn uses.
const ALWAYS: &[&str] = &[
    "bash",
    "read_file",
    "write_file",
    "edit_file",
    "list_dir",
    "recall",
];

/// Known tools offered only to the turns whose skillset needs them. A turn
/// without a skillset gets every tool.
const ONLY_FOR: &[(&str, &[&str])] = &[
    (
        "grep",
        &[
            "testing",
            "debugging",
            "security",
            "devops",
            "coding",
            "analysis",
            "explanation",
            "research",
        ],
    ),
    (
        "glob",
        &[
            "testing",
            "debugging",
            "security",
            "devops",
            "coding",
            "analysis",
            "explanation",
        ],
    ),
    (
        "web_fetch",
        &["research", "devops", "security", "debugging"],
    ),
    ("web_crawl", &["research"]),
    ("schedule_reminder", &["devops"]),
    ("list_reminders", &["devops"]),
    ("cancel_reminder", &["devops"]),
];

/// Whether a turn with `skillset` ("" for none) is offered `tool`.
fn offered(tool: &str, skillset: &str) -> bool {
    if skillset.is_empty() || ALWAYS.contains(&tool) {
        return true;
    }
    match ONLY_FOR.iter().find(|(name, _)| *name == tool) {
        Some((_, skillsets)) => skillsets.contains(&skillset),
        None => true,
    }
}

/// The lean definitions of `tools` for a turn with `skillset` ("" for
/// none): the tools it needs, each with its first sentence and a schema
/// without descriptions.
pub fn definitions(tools: &[ToolDefinition], skillset: &str) -> Vec<ToolDefinition> {
    tools
        .iter()
        .filter(|t| offered(&t.name, skillset))
        .map(|t| ToolDefinition {
            name: t.name.clone(),
            description: first_sentence(&t.description),
            parameters: without_prose(&t.parameters),
        })
        .collect()
}

/// The first sentence of `text`, at most [`MAX_DESCRIPTION_CHARS`]
/// characters.
fn first_sentence(text: &str) -> String {
    let text = text.trim();
    let end = text
        .char_indices()
        .find(|&(i, c)| c == '\n' || (c == '.' && text[i + 1..].starts_with(char::is_whitespace)))
        .map_or(text.len(), |(i, c)| if c == '.' { i + 1 } else { i });
    let sentence = &text[..end];
    if sentence.chars().count() <= MAX_DESCRIPTION_CHARS {
        return sentence.to_string();
    }
    let cut: String = sentence.chars().take(MAX_DESCRIPTION_CHARS - 1).collect();
    format!("{}…", cut.trim_end())
}

/// Schema keywords a lean definition leaves out: prose, and limits the tool
/// runner checks anyway (an argument out of range comes back as an error
/// the model can correct).
const LEFT_OUT: &[&str] = &[
    "description",
    "title",
    "examples",
    "default",
    "additionalProperties",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
    "format",
    "$schema",
];

/// A JSON schema without [`LEFT_OUT`] keywords (what is left says what
/// the arguments are).
fn without_prose(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, value)| {
                    // A property may be called "description" or "pattern":
                    // only the keyword is left out, whose value is no schema.
                    !LEFT_OUT.contains(&key.as_str()) || value.is_object()
                })
                .map(|(key, value)| (key.clone(), without_prose(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_prose).collect()),
        other => other.clone(),
    }
}

/// One line for a tool in the text-call instructions:
/// `name(arg: type, optional?: type): first sentence`, the arguments by
/// name (the same prompt whichever order a JSON map keeps its keys in).
pub fn signature(tool: &ToolDefinition) -> String {
    let schema = &tool.parameters;
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let arguments: Vec<String> = schema["properties"]
        .as_object()
        .map(|properties| {
            let mut properties: Vec<(&String, &Value)> = properties.iter().collect();
            properties.sort_by(|a, b| a.0.cmp(b.0));
            properties
                .into_iter()
                .map(|(name, property)| {
                    let optional = if required.contains(&name.as_str()) {
                        ""
                    } else {
                        "?"
                    };
                    format!("{name}{optional}: {}", type_of(property))
                })
                .collect()
        })
        .unwrap_or_default();
    format!(
        "{}({}): {}",
        tool.name,
        arguments.join(", "),
        first_sentence(&tool.description)
    )
}

/// A short name for a property's type: `string`, `integer`, `a|b` for an
/// enum, `string[]` for an array.
fn type_of(property: &Value) -> String {
    if let Some(choices) = property["enum"].as_array() {
        return choices
            .iter()
            .map(|c| c.as_str().map_or_else(|| c.to_string(), str::to_string))
            .collect::<Vec<_>>()
            .join("|");
    }
    match &property["type"] {
        Value::String(t) if t == "array" => format!("{}[]", type_of(&property["items"])),
        Value::String(t) => t.clone(),
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join("|"),
        _ => "any".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn tool(name: &str) -> ToolDefinition {
        ToolDefinition {
            name: name.into(),
            description: "Read a text file in the workspace. Paths are relative to it.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The file."},
                    "limit": {"type": "integer", "description": "Lines.", "default": 2000,
                              "minimum": 1},
                    "pattern": {"type": "string", "pattern": "^[a-z]+$"},
                    "mode": {"enum": ["text", "bytes"]},
                    "names": {"type": "array", "items": {"type": "string"}},
                    "description": {"type": "string", "description": "a property so named"},
                },
                "required": ["path"],
                "additionalProperties": false,
            }),
        }
    }

    #[test]
    fn lean_definitions_keep_the_first_sentence_and_the_schema_without_prose() {
        let lean = definitions(&[tool("read_file")], "");
        assert_eq!(lean[0].description, "Read a text file in the workspace.");
        assert_eq!(
            lean[0].parameters,
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "limit": {"type": "integer"},
                    "pattern": {"type": "string"},
                    "mode": {"enum": ["text", "bytes"]},
                    "names": {"type": "array", "items": {"type": "string"}},
                    "description": {"type": "string"},
                },
                "required": ["path"],
            })
        );
    }

    #[test]
    fn a_skillset_gets_the_tools_it_needs_and_every_unknown_one() {
        let all: Vec<ToolDefinition> = [
            "bash",
            "read_file",
            "grep",
            "web_fetch",
            "web_crawl",
            "schedule_reminder",
            "time__now",
        ]
        .into_iter()
        .map(tool)
        .collect();
        let names = |skillset: &str| -> Vec<String> {
            definitions(&all, skillset)
                .into_iter()
                .map(|t| t.name)
                .collect()
        };
        assert_eq!(names("coding"), ["bash", "read_file", "grep", "time__now"]);
        assert_eq!(
            names("research"),
            [
                "bash",
                "read_file",
                "grep",
                "web_fetch",
                "web_crawl",
                "time__now"
            ]
        );
        assert_eq!(names("").len(), all.len(), "no skillset: every tool");
    }

    #[test]
    fn signatures_are_one_line() {
        assert_eq!(
            signature(&tool("read_file")),
            "read_file(description?: string, limit?: integer, mode?: text|bytes, names?: \
             string[], path: string, pattern?: string): Read a text file in the workspace."
        );
        let long = ToolDefinition {
            description: format!("{} and more", "word ".repeat(40)),
            ..tool("x")
        };
        assert!(signature(&long).ends_with('…'));
        assert!(signature(&long).chars().count() < 250);
    }
}
