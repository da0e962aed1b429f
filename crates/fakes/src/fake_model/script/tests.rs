#![allow(clippy::unwrap_used)]

use super::*;
use serde_json::json;

#[test]
fn parses_script_items() {
    assert_eq!(
        parse_reply(0, &json!({"text": "hi"})).unwrap(),
        Reply::text("hi")
    );
    assert_eq!(
        parse_reply(
            3,
            &json!({"tool_call": {"name": "f", "arguments": {"a": 1}}})
        )
        .unwrap(),
        Reply::tool_call("call_3", "f", json!({"a": 1}))
    );
    assert_eq!(
        parse_reply(
            0,
            &json!({"tool_call": {"id": "x", "name": "f", "arguments": {}}})
        )
        .unwrap(),
        Reply::tool_call("x", "f", json!({}))
    );
    assert_eq!(
        parse_reply(0, &json!({"error": {"status": 503, "message": "busy"}})).unwrap(),
        Reply::error(503, "busy")
    );
    assert_eq!(
        parse_reply(
            0,
            &json!({"error": {"status": 429, "message": "slow", "retry_after": 3}})
        )
        .unwrap(),
        Reply::error(429, "slow").retry_after(3)
    );
    assert!(parse_reply(0, &json!({"error": {"retry_after": "soon"}})).is_err());
    assert!(parse_reply(0, &json!({"nope": 1})).is_err());
    assert!(parse_reply(0, &json!({"text": 5})).is_err());
}

#[test]
fn parses_scripts() {
    assert_eq!(
        parse_script(&json!([{"text": "a"}, {"text": "b"}]))
            .unwrap()
            .len(),
        2
    );
    assert!(parse_script(&json!([])).is_err());
    assert!(parse_script(&json!({"text": "a"})).is_err());
}
