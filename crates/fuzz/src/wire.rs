//! The protobuf wire format, by hand: writing fields (so that inputs can
//! hold what a generated struct cannot, such as unknown fields, unknown
//! enum numbers and repeated singular fields) and walking an encoded
//! message to find its strings (the ids a response names).

use crate::schema::{Kind, Schema};

pub const VARINT: u32 = 0;
pub const FIXED64: u32 = 1;
pub const LEN: u32 = 2;
pub const FIXED32: u32 = 5;

/// Appends `value` as a varint.
pub fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Appends a field's key.
pub fn key(out: &mut Vec<u8>, number: u32, wire_type: u32) {
    varint(out, (u64::from(number) << 3) | u64::from(wire_type));
}

/// Appends a length-delimited field.
pub fn len_field(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    key(out, number, LEN);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// ZigZag encoding of `sint32`/`sint64`.
pub fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

/// The wire type a field of `kind` is written with (unpacked).
pub fn wire_type(kind: &Kind) -> u32 {
    match kind {
        Kind::Double | Kind::Fixed64 | Kind::Sfixed64 => FIXED64,
        Kind::Float | Kind::Fixed32 | Kind::Sfixed32 => FIXED32,
        Kind::String | Kind::Bytes | Kind::Message(_) => LEN,
        Kind::Int64
        | Kind::Uint64
        | Kind::Int32
        | Kind::Bool
        | Kind::Uint32
        | Kind::Sint32
        | Kind::Sint64
        | Kind::Enum(_) => VARINT,
    }
}

fn read_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

/// Calls `found(message, field, value)` for every string field in the
/// encoded `message` and the messages it holds (to `depth` levels). An
/// encoding it cannot follow ends the walk quietly: this is for finding
/// ids, not for checking.
pub fn strings(
    schema: &Schema,
    message: &str,
    bytes: &[u8],
    depth: usize,
    found: &mut dyn FnMut(&str, &str, &str),
) {
    let Some(ty) = schema.message(message) else {
        return;
    };
    let mut at = 0;
    while at < bytes.len() {
        let Some(k) = read_varint(bytes, &mut at) else {
            return;
        };
        let (number, wire) = ((k >> 3) as u32, (k & 7) as u32);
        let field = ty.fields.iter().find(|f| f.number == number);
        match wire {
            VARINT => {
                if read_varint(bytes, &mut at).is_none() {
                    return;
                }
            }
            FIXED64 => at += 8,
            FIXED32 => at += 4,
            LEN => {
                let Some(len) = read_varint(bytes, &mut at) else {
                    return;
                };
                let end = at.saturating_add(len as usize);
                let Some(value) = bytes.get(at..end) else {
                    return;
                };
                match field.map(|f| &f.kind) {
                    Some(Kind::String) => {
                        if let (Some(f), Ok(text)) = (field, std::str::from_utf8(value)) {
                            found(&ty.name, &f.name, text);
                        }
                    }
                    Some(Kind::Message(inner)) if depth > 0 => {
                        strings(schema, inner, value, depth - 1, found);
                    }
                    _ => {}
                }
                at = end;
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use prost::Message;

    #[test]
    fn hand_written_fields_decode_as_prost_writes_them() {
        let mut out = Vec::new();
        len_field(&mut out, 1, b"s-1");
        key(&mut out, 2, VARINT);
        varint(&mut out, 300);
        let read = agentry_proto::sessions::v1::ReadRequest::decode(out.as_slice()).unwrap();
        assert_eq!(read.session_id, "s-1");
        assert_eq!(read.from_seq, 300);
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
    }

    #[test]
    fn the_strings_of_a_response_are_found_with_their_fields() {
        let schema = Schema::decode(agentry_proto::FILE_DESCRIPTOR_SET).unwrap();
        let list = agentry_proto::sessions::v1::ListSessionsResponse {
            sessions: vec![agentry_proto::sessions::v1::Session {
                id: "abc".into(),
                title: "t".into(),
                ..Default::default()
            }],
            total: 1,
        };
        let mut seen = Vec::new();
        strings(
            &schema,
            "agentry.sessions.v1.ListSessionsResponse",
            &list.encode_to_vec(),
            4,
            &mut |m, f, v| seen.push(format!("{m}.{f}={v}")),
        );
        assert_eq!(
            seen,
            [
                "agentry.sessions.v1.Session.id=abc",
                "agentry.sessions.v1.Session.title=t"
            ]
        );
    }
}
