//! Questions MCP servers ask a person during a call (elicitation), and the
//! answers they get: a person's fields checked against the server's schema
//! and turned into the results the server reads.

use agentry_proto::sessions::v1 as pb;
use serde_json::{Map, Value};

/// The actions a person may take on a server's questions.
pub const ACTIONS: [&str; 3] = ["accept", "decline", "cancel"];

/// The answers the server gets (its `inputResponses`, as JSON), from a
/// person's `action` and, for `accept`, `content_json`: each question's
/// fields by its key, or, when the call asks one question, its fields
/// directly. A `url` question takes no fields.
pub fn answers(
    asked: &pb::McpInputRequested,
    action: &str,
    content_json: &str,
) -> Result<String, String> {
    if !ACTIONS.contains(&action) {
        return Err(format!(
            "the action must be accept, decline or cancel, not {action:?}"
        ));
    }
    let mut out = Map::new();
    if action != "accept" {
        for q in &asked.questions {
            out.insert(q.key.clone(), serde_json::json!({ "action": action }));
        }
        return Ok(Value::Object(out).to_string());
    }
    let given = match content_json.trim() {
        "" => Map::new(),
        text => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err("the answers must be a JSON object".into()),
            Err(e) => return Err(format!("the answers are not valid JSON ({e})")),
        },
    };
    let keys: Vec<&str> = asked.questions.iter().map(|q| q.key.as_str()).collect();
    let by_key = !given.is_empty()
        && given
            .iter()
            .all(|(k, v)| keys.contains(&k.as_str()) && v.is_object());
    for q in &asked.questions {
        let fields = if by_key {
            given
                .get(&q.key)
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default()
        } else if asked.questions.len() == 1 {
            given.clone()
        } else {
            return Err(format!(
                "the call asks {} questions ({}): give the fields of each under its key, as \
                 {{\"{}\": {{...}}}}",
                keys.len(),
                keys.join(", "),
                keys.first().copied().unwrap_or_default()
            ));
        };
        let content = if q.mode == "url" {
            if !fields.is_empty() {
                return Err(format!(
                    "question {} asks you to visit a page, not for fields: accept once done",
                    q.key
                ));
            }
            None
        } else {
            Some(check(q, fields)?)
        };
        let mut result = Map::new();
        result.insert("action".into(), "accept".into());
        if let Some(content) = content {
            result.insert("content".into(), Value::Object(content));
        }
        out.insert(q.key.clone(), Value::Object(result));
    }
    Ok(Value::Object(out).to_string())
}

/// `fields` as the question's schema wants them: only its properties, each
/// of its type (a string from the command line is read as the number or
/// boolean the schema asks for), every required one present.
fn check(q: &pb::McpQuestion, fields: Map<String, Value>) -> Result<Map<String, Value>, String> {
    let schema: Value = serde_json::from_str(&q.schema_json).unwrap_or(Value::Null);
    let properties = schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut out = Map::new();
    for (name, value) in fields {
        let Some(property) = properties.get(&name) else {
            let known: Vec<&String> = properties.keys().collect();
            return Err(format!(
                "question {} has no field {name:?} (its fields: {})",
                q.key,
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known
                        .iter()
                        .map(|k| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
        };
        out.insert(name.clone(), typed(&q.key, &name, property, value)?);
    }
    for required in schema["required"].as_array().into_iter().flatten() {
        if let Some(name) = required.as_str()
            && !out.contains_key(name)
        {
            return Err(format!(
                "question {} needs the field {name:?}{}",
                q.key,
                match properties.get(name).and_then(|p| p["description"].as_str()) {
                    Some(d) => format!(" ({d})"),
                    None => String::new(),
                }
            ));
        }
    }
    Ok(out)
}

fn typed(key: &str, name: &str, property: &Value, value: Value) -> Result<Value, String> {
    let kind = property["type"].as_str().unwrap_or("string");
    let wrong = |what: &str| format!("field {name:?} of question {key} must be {what}");
    let value = match (kind, value) {
        ("number", Value::String(s)) => s
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(|n| serde_json::Number::from_f64(n).map(Value::Number))
            .ok_or_else(|| wrong("a number"))?,
        ("integer", Value::String(s)) => s
            .trim()
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| wrong("a whole number"))?,
        ("boolean", Value::String(s)) => match s.trim() {
            "true" | "yes" => Value::Bool(true),
            "false" | "no" => Value::Bool(false),
            _ => return Err(wrong("true or false")),
        },
        ("number", v @ Value::Number(_)) => v,
        ("integer", Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n),
        ("boolean", v @ Value::Bool(_)) => v,
        ("string", v @ Value::String(_)) => v,
        ("array", v @ Value::Array(_)) => v,
        (_, _) => return Err(wrong(&format!("of type {kind}"))),
    };
    if let Some(allowed) = property["enum"].as_array()
        && !allowed.contains(&value)
    {
        let listed: Vec<String> = allowed.iter().map(Value::to_string).collect();
        return Err(format!(
            "field {name:?} of question {key} must be one of {}",
            listed.join(", ")
        ));
    }
    Ok(value)
}

/// One question for people to read: the server's words, its fields or
/// page. Untrusted text: a terminal gets it through the one sanitizer
/// (`agentry_client::terminal`), as every line the CLI prints.
pub fn describe(q: &pb::McpQuestion) -> String {
    let mut text = format!("{}: {}", q.key, q.message);
    if q.mode == "url" {
        text.push_str(&format!(
            "\n  visit (check where it leads first): {}",
            q.url
        ));
        return text;
    }
    let schema: Value = serde_json::from_str(&q.schema_json).unwrap_or(Value::Null);
    let required: Vec<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for (name, property) in schema["properties"].as_object().into_iter().flatten() {
        let kind = property["type"].as_str().unwrap_or("string");
        let mut line = format!(
            "\n  {} ({kind}{})",
            name,
            if required.contains(&name.as_str()) {
                ", required"
            } else {
                ""
            }
        );
        if let Some(d) = property["description"]
            .as_str()
            .or(property["title"].as_str())
        {
            line.push_str(&format!(": {}", d));
        }
        if let Some(allowed) = property["enum"].as_array() {
            let listed: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
            line.push_str(&format!(" [one of {}]", listed.join(", ")));
        }
        text.push_str(&line);
    }
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn asked(questions: Vec<pb::McpQuestion>) -> pb::McpInputRequested {
        pb::McpInputRequested {
            call_id: "c1".into(),
            server: "fx".into(),
            questions,
            resume_json: "{}".into(),
        }
    }

    fn form(key: &str) -> pb::McpQuestion {
        pb::McpQuestion {
            key: key.into(),
            mode: "form".into(),
            message: "Which \u{202e}colour?\u{1b}[31m".into(),
            schema_json: serde_json::json!({
                "type": "object",
                "properties": {
                    "colour": {"type": "string", "enum": ["red", "blue"]},
                    "count": {"type": "integer", "description": "how many"},
                    "sure": {"type": "boolean"}
                },
                "required": ["colour", "count"]
            })
            .to_string(),
            url: String::new(),
        }
    }

    #[test]
    fn one_question_takes_its_fields_directly_typed_by_the_schema() {
        let a = asked(vec![form("q")]);
        let got = answers(
            &a,
            "accept",
            r#"{"colour": "red", "count": "3", "sure": "yes"}"#,
        );
        let got: Value = serde_json::from_str(&got.unwrap()).unwrap();
        assert_eq!(
            got,
            serde_json::json!({"q": {"action": "accept",
                "content": {"colour": "red", "count": 3, "sure": true}}})
        );
    }

    #[test]
    fn wrong_fields_say_what_the_question_wants() {
        let a = asked(vec![form("q")]);
        let missing = answers(&a, "accept", r#"{"colour": "red"}"#).unwrap_err();
        assert!(
            missing.contains("\"count\"") && missing.contains("how many"),
            "{missing}"
        );
        let unknown = answers(&a, "accept", r#"{"colour": "red", "count": 1, "x": 1}"#);
        assert!(unknown.unwrap_err().contains("no field \"x\""));
        let not_listed = answers(&a, "accept", r#"{"colour": "green", "count": 1}"#);
        assert!(not_listed.unwrap_err().contains("one of"));
        let not_a_number = answers(&a, "accept", r#"{"colour": "red", "count": "many"}"#);
        assert!(not_a_number.unwrap_err().contains("whole number"));
        assert!(
            answers(&a, "maybe", "")
                .unwrap_err()
                .contains("accept, decline or cancel")
        );
    }

    #[test]
    fn several_questions_need_their_keys_and_a_decline_answers_all() {
        let mut url = form("visit");
        url.mode = "url".into();
        url.url = "https://example.test/authorize".into();
        let a = asked(vec![form("q"), url]);
        let flat = answers(&a, "accept", r#"{"colour": "red", "count": 1}"#).unwrap_err();
        assert!(flat.contains("2 questions (q, visit)"), "{flat}");
        let ok = answers(
            &a,
            "accept",
            r#"{"q": {"colour": "blue", "count": 2}, "visit": {}}"#,
        );
        let ok: Value = serde_json::from_str(&ok.unwrap()).unwrap();
        assert_eq!(ok["visit"], serde_json::json!({"action": "accept"}));
        let declined: Value = serde_json::from_str(&answers(&a, "decline", "").unwrap()).unwrap();
        assert_eq!(
            declined,
            serde_json::json!({"q": {"action": "decline"}, "visit": {"action": "decline"}})
        );
    }

    #[test]
    fn descriptions_say_each_field_and_what_it_takes() {
        let text = describe(&form("q"));
        assert!(
            text.contains("count (integer, required): how many"),
            "{text}"
        );
        assert!(text.contains("[one of \"red\", \"blue\"]"), "{text}");
    }
}
