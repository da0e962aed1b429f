//! Session events as JSON objects, made from the contracts themselves: the
//! fields of an event's message are read through its descriptor
//! (`agentry_proto::FILE_DESCRIPTOR_SET`), so a field or an event kind added
//! to `proto/agentry/sessions/v1/events.proto` appears here with no change.
//!
//! The form: the envelope (`version`, `session_id`, `seq`, `turn_id`,
//! `time`, `live` when set), `type` (the name of the event's kind in the
//! contract, `tool_result`), and the kind's fields by their names in the
//! contract. Enum values are their names without the enum's prefix, in
//! lower case (`OUTPUT_STREAM_STDOUT` → `stdout`; a number this build does
//! not know stays a number, as text); 64-bit integers are numbers; bytes
//! are base64; timestamps are seconds since the epoch; an `optional`
//! field that is not set is `null`.

use agentry_proto::sessions::v1 as pb;
use base64::Engine as _;
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DynamicMessage, EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor,
    ReflectMessage, Value as Field,
};
use serde_json::{Map, Value, json};
use std::sync::OnceLock;

/// The version of the JSON form of events (`"version"` in each object):
/// raised when a field changes meaning or goes away; new fields may come
/// without it. 3: every field by its name in the contract.
pub const JSON_VERSION: u32 = 3;

/// The contracts' descriptors, read once.
fn event_descriptor() -> Option<&'static MessageDescriptor> {
    static EVENT: OnceLock<Option<MessageDescriptor>> = OnceLock::new();
    EVENT
        .get_or_init(|| {
            DescriptorPool::decode(agentry_proto::FILE_DESCRIPTOR_SET)
                .ok()?
                .get_message_by_name("agentry.sessions.v1.Event")
        })
        .as_ref()
}

/// One event as a JSON object (see the module's documentation).
pub fn event_json(event: &pb::Event) -> Value {
    let mut out = json!({
        "version": JSON_VERSION,
        "session_id": event.session_id,
        "seq": event.seq,
        "turn_id": event.turn_id,
        "time": event.time.as_ref().map_or(Value::Null, |t| seconds(t.seconds, t.nanos)),
    });
    if event.live {
        out["live"] = json!(true);
    }
    if !event.by.is_empty() {
        out["by"] = json!(event.by);
    }
    let kind = event.kind.as_ref().and_then(|_| {
        let descriptor = event_descriptor()?;
        let message =
            DynamicMessage::decode(descriptor.clone(), event.encode_to_vec().as_slice()).ok()?;
        let oneof = descriptor.oneofs().find(|o| o.name() == "kind")?;
        oneof
            .fields()
            .find(|field| message.has_field(field))
            .map(|field| {
                (
                    field.name().to_string(),
                    message.get_field(&field).into_owned(),
                )
            })
    });
    let Value::Object(object) = &mut out else {
        return out;
    };
    match kind {
        Some((name, Field::Message(body))) => {
            object.insert("type".into(), Value::String(name));
            object.extend(message_fields(&body));
        }
        _ => {
            object.insert("type".into(), json!("unknown"));
        }
    }
    out
}

/// A message's fields, every one (unset ones with their default, or
/// `null` for an unset `optional`), by name.
fn message_fields(message: &DynamicMessage) -> Map<String, Value> {
    message
        .descriptor()
        .fields()
        .map(|field| {
            let value = if field.supports_presence() && !message.has_field(&field) {
                Value::Null
            } else {
                value_json(&field, &message.get_field(&field))
            };
            (field.name().to_string(), value)
        })
        .collect()
}

fn value_json(field: &FieldDescriptor, value: &Field) -> Value {
    match value {
        Field::Bool(b) => json!(b),
        Field::I32(n) => json!(n),
        Field::I64(n) => json!(n),
        Field::U32(n) => json!(n),
        Field::U64(n) => json!(n),
        Field::F32(n) => json!(n),
        Field::F64(n) => json!(n),
        Field::String(s) => json!(s),
        Field::Bytes(b) => json!(base64::engine::general_purpose::STANDARD.encode(b)),
        Field::EnumNumber(n) => match field.kind() {
            Kind::Enum(e) => json!(enum_name(&e, *n)),
            _ => json!(n.to_string()),
        },
        Field::Message(m) if m.descriptor().full_name() == "google.protobuf.Timestamp" => {
            let get = |name: &str| m.get_field_by_name(name).map(|v| v.into_owned());
            match (get("seconds"), get("nanos")) {
                (Some(Field::I64(s)), Some(Field::I32(n))) => seconds(s, n),
                _ => Value::Null,
            }
        }
        Field::Message(m) => Value::Object(message_fields(m)),
        Field::List(items) => Value::Array(items.iter().map(|v| value_json(field, v)).collect()),
        Field::Map(entries) => Value::Object(
            entries
                .iter()
                .map(|(key, v)| {
                    let key = match key {
                        prost_reflect::MapKey::String(s) => s.clone(),
                        prost_reflect::MapKey::Bool(b) => b.to_string(),
                        prost_reflect::MapKey::I32(n) => n.to_string(),
                        prost_reflect::MapKey::I64(n) => n.to_string(),
                        prost_reflect::MapKey::U32(n) => n.to_string(),
                        prost_reflect::MapKey::U64(n) => n.to_string(),
                    };
                    let value_field = field
                        .kind()
                        .as_message()
                        .map(|entry| entry.map_entry_value_field());
                    let value = match value_field {
                        Some(value_field) => value_json(&value_field, v),
                        None => Value::Null,
                    };
                    (key, value)
                })
                .collect(),
        ),
    }
}

fn seconds(seconds: i64, nanos: i32) -> Value {
    json!(seconds as f64 + f64::from(nanos) / 1e9)
}

/// An enum value's plain name: its name in the contract without the enum's
/// prefix (`OutputStream` → `OUTPUT_STREAM_`), in lower case; the number,
/// as text, when this build does not know it.
fn enum_name(descriptor: &EnumDescriptor, number: i32) -> String {
    let Some(value) = descriptor.get_value(number) else {
        return number.to_string();
    };
    let mut prefix = String::new();
    for (i, c) in descriptor.name().chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            prefix.push('_');
        }
        prefix.push(c.to_ascii_uppercase());
    }
    prefix.push('_');
    let name = value.name();
    name.strip_prefix(&prefix)
        .unwrap_or(name)
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    fn event(kind: pb::event::Kind) -> pb::Event {
        pb::Event {
            seq: 7,
            session_id: "s".into(),
            kind: Some(kind),
            ..Default::default()
        }
    }

    #[test]
    fn events_carry_the_version_and_plain_enum_names() {
        let chunk = event_json(&event(pb::event::Kind::ToolOutputChunk(
            pb::ToolOutputChunk {
                call_id: "c1".into(),
                stream: pb::OutputStream::Stdout as i32,
                text: "hi".into(),
            },
        )));
        assert_eq!(chunk["version"], JSON_VERSION);
        assert_eq!(chunk["type"], "tool_output_chunk");
        assert_eq!(chunk["seq"], 7);
        assert_eq!(chunk["stream"], "stdout");
        assert_eq!(chunk["text"], "hi");
        let decided = event_json(&event(pb::event::Kind::ApprovalDecided(
            pb::ApprovalDecided {
                call_id: "c1".into(),
                decision: pb::ApprovalDecision::ApproveForSession as i32,
                ..Default::default()
            },
        )));
        assert_eq!(decided["decision"], "approve_for_session");
        assert_eq!(decided["edited_arguments_json"], "");
        // A value this build does not know stays a number.
        let unknown = event_json(&event(pb::event::Kind::Error(pb::Error {
            source: 99,
            ..Default::default()
        })));
        assert_eq!(unknown["source"], "99");
    }

    #[test]
    fn optional_nested_repeated_and_bytes_fields_take_their_json_forms() {
        let result = event_json(&event(pb::event::Kind::ToolResult(pb::ToolResult {
            call_id: "c1".into(),
            exit_code: None,
            sub_agent_usage: Some(pb::TokenUsage {
                total_tokens: 12,
                ..Default::default()
            }),
            ..Default::default()
        })));
        assert_eq!(result["exit_code"], Value::Null);
        assert_eq!(result["sub_agent_usage"]["total_tokens"], 12);
        assert_eq!(result["is_error"], false);
        let message = event_json(&event(pb::event::Kind::UserMessage(pb::UserMessage {
            text: "look".into(),
            images: vec![pb::Image {
                path: "a.png".into(),
                mime: "image/png".into(),
                data: vec![0x89, 0x50],
            }],
            ..Default::default()
        })));
        assert_eq!(message["images"][0]["path"], "a.png");
        assert_eq!(message["images"][0]["data"], "iVA=");
        let finished = event_json(&event(pb::event::Kind::TurnFinished(pb::TurnFinished {
            outcome: pb::TurnOutcome::StepLimit as i32,
            cost: Some(0.5),
            ..Default::default()
        })));
        assert_eq!(finished["outcome"], "step_limit");
        assert_eq!(finished["cost"], 0.5);
        let timed = event_json(&pb::Event {
            time: Some(prost_types::Timestamp {
                seconds: 10,
                nanos: 500_000_000,
            }),
            live: true,
            kind: Some(pb::event::Kind::ModelTextDelta(pb::ModelTextDelta {
                text: "x".into(),
            })),
            ..Default::default()
        });
        assert_eq!(timed["time"], 10.5);
        assert_eq!(timed["live"], true);
        assert!(timed.get("by").is_none());
        let sent = event_json(&pb::Event {
            by: "alice".into(),
            ..Default::default()
        });
        assert_eq!(sent["by"], "alice");
    }

    #[test]
    fn every_kind_of_event_has_its_contract_name_as_type() {
        // Each kind the contract has comes out under its own name, never
        // as "unknown": nothing is hand-written per kind.
        let descriptor = event_descriptor().expect("the contracts decode");
        let oneof = descriptor
            .oneofs()
            .find(|o| o.name() == "kind")
            .expect("Event has a kind");
        let mut seen = 0;
        for field in oneof.fields() {
            let mut message = DynamicMessage::new(descriptor.clone());
            let body = DynamicMessage::new(field.kind().as_message().expect("a message").clone());
            message.set_field(&field, Field::Message(body));
            let event = pb::Event::decode(message.encode_to_vec().as_slice()).expect("decodes");
            assert_eq!(event_json(&event)["type"], field.name(), "{}", field.name());
            seen += 1;
        }
        assert!(seen >= 25, "only {seen} kinds");
        assert_eq!(event_json(&pb::Event::default())["type"], "unknown");
    }
}
