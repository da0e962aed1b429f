//! The contracts as data: every service, method and message of
//! `agentry_proto::FILE_DESCRIPTOR_SET`, and a generator that writes
//! random but well-formed protobuf encodings of any message from its
//! descriptor (with the occasional malformed one, see [`crate::mutate`]).

use crate::rng::{Edges, Rng};
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorSet};
use std::collections::HashMap;

/// One RPC of one service.
#[derive(Clone, Debug)]
pub struct Method {
    /// `agentry.sessions.v1.SessionStore`.
    pub service: String,
    /// `Append`.
    pub name: String,
    /// Fully qualified, without the leading dot.
    pub input: String,
    pub client_streaming: bool,
    pub server_streaming: bool,
}

impl Method {
    /// The HTTP/2 path of the call.
    pub fn path(&self) -> String {
        format!("/{}/{}", self.service, self.name)
    }

    /// `SessionStore.Append`: how the reports and the corpus name it.
    pub fn label(&self) -> String {
        let service = self.service.rsplit('.').next().unwrap_or(&self.service);
        format!("{service}.{}", self.name)
    }
}

/// The messages, enums and methods of the contracts.
pub struct Schema {
    messages: HashMap<String, DescriptorProto>,
    enums: HashMap<String, Vec<i32>>,
    pub methods: Vec<Method>,
}

impl Schema {
    /// The contracts compiled into `agentry-proto`.
    pub fn load() -> anyhow::Result<Schema> {
        let set = FileDescriptorSet::decode(agentry_proto::FILE_DESCRIPTOR_SET)?;
        let mut schema = Schema {
            messages: HashMap::new(),
            enums: HashMap::new(),
            methods: Vec::new(),
        };
        for file in &set.file {
            let package = file.package();
            for message in &file.message_type {
                schema.add_message(package, message);
            }
            for e in &file.enum_type {
                schema.enums.insert(
                    format!("{package}.{}", e.name()),
                    e.value.iter().map(|v| v.number()).collect(),
                );
            }
            if !package.starts_with("agentry.") {
                continue;
            }
            for service in &file.service {
                for method in &service.method {
                    schema.methods.push(Method {
                        service: format!("{package}.{}", service.name()),
                        name: method.name().to_string(),
                        input: method.input_type().trim_start_matches('.').to_string(),
                        client_streaming: method.client_streaming(),
                        server_streaming: method.server_streaming(),
                    });
                }
            }
        }
        Ok(schema)
    }

    fn add_message(&mut self, scope: &str, message: &DescriptorProto) {
        let name = format!("{scope}.{}", message.name());
        for nested in &message.nested_type {
            self.add_message(&name, nested);
        }
        for e in &message.enum_type {
            self.enums.insert(
                format!("{name}.{}", e.name()),
                e.value.iter().map(|v| v.number()).collect(),
            );
        }
        self.messages.insert(name, message.clone());
    }

    /// A random encoding of the message `name`.
    pub fn generate(&self, name: &str, rng: &mut Rng, pools: &Pools) -> Vec<u8> {
        let mut out = Vec::new();
        let mut budget = FIELDS_PER_INPUT;
        self.write_message(name, rng, pools, 0, &mut budget, &mut out);
        out
    }

    fn write_message(
        &self,
        name: &str,
        rng: &mut Rng,
        pools: &Pools,
        depth: u32,
        budget: &mut u32,
        out: &mut Vec<u8>,
    ) {
        let Some(message) = self.messages.get(name) else {
            return;
        };
        // Deeper messages are sparser, so that a recursive type ends.
        let keep = match depth {
            0 => 0.7,
            1 => 0.5,
            2 => 0.3,
            3 => 0.15,
            _ => 0.0,
        };
        // One member of each oneof at most (a later one would win anyway;
        // sometimes two are sent, to see that too).
        let mut oneof_taken = vec![false; message.oneof_decl.len()];
        for field in &message.field {
            if *budget == 0 || !rng.chance(keep) {
                continue;
            }
            if let Some(index) = field.oneof_index.filter(|_| !field.proto3_optional())
                && let Some(taken) = oneof_taken.get_mut(index as usize)
            {
                if *taken && !rng.chance(0.05) {
                    continue;
                }
                *taken = true;
            }
            let count = if field.label() == Label::Repeated {
                match rng.below(10) {
                    0..=3 => 0,
                    4..=7 => 1 + rng.below(3),
                    8 => 3 + rng.below(8),
                    _ => 20 + rng.below(200),
                }
            } else {
                1
            };
            for _ in 0..count {
                if *budget == 0 {
                    break;
                }
                *budget -= 1;
                self.write_field(field, rng, pools, depth, budget, out);
            }
        }
        // Now and then a field number the contract does not have.
        if rng.chance(0.02) {
            let number = 1000 + rng.below(5000) as u32;
            put_key(out, number, 2);
            let junk = rng.junk(16);
            put_varint(out, junk.len() as u64);
            out.extend_from_slice(&junk);
        }
    }

    fn write_field(
        &self,
        field: &FieldDescriptorProto,
        rng: &mut Rng,
        pools: &Pools,
        depth: u32,
        budget: &mut u32,
        out: &mut Vec<u8>,
    ) {
        let number = field.number() as u32;
        match field.r#type() {
            Type::Message | Type::Group => {
                let mut inner = Vec::new();
                self.write_message(
                    field.type_name().trim_start_matches('.'),
                    rng,
                    pools,
                    depth + 1,
                    budget,
                    &mut inner,
                );
                put_key(out, number, 2);
                put_varint(out, inner.len() as u64);
                out.extend_from_slice(&inner);
            }
            Type::String => {
                let text = pools.string_for(field.name(), rng);
                put_key(out, number, 2);
                put_varint(out, text.len() as u64);
                out.extend_from_slice(&text);
            }
            Type::Bytes => {
                let data = match rng.below(4) {
                    0 => Vec::new(),
                    1 => pools.string_for(field.name(), rng),
                    _ => rng.junk(64),
                };
                put_key(out, number, 2);
                put_varint(out, data.len() as u64);
                out.extend_from_slice(&data);
            }
            Type::Enum => {
                let values = self.enums.get(field.type_name().trim_start_matches('.'));
                let value = match values {
                    Some(values) if !values.is_empty() && rng.chance(0.85) => {
                        values[rng.below(values.len() as u64) as usize] as i64
                    }
                    _ => rng.int() as i32 as i64,
                };
                put_key(out, number, 0);
                put_varint(out, value as u64);
            }
            Type::Bool => {
                put_key(out, number, 0);
                put_varint(
                    out,
                    if rng.chance(0.1) {
                        rng.below(300)
                    } else {
                        rng.below(2)
                    },
                );
            }
            Type::Int32 | Type::Uint32 | Type::Int64 | Type::Uint64 => {
                let value = rng.int();
                let value = match field.r#type() {
                    Type::Int32 => value as i32 as i64 as u64,
                    Type::Uint32 => value as u32 as u64,
                    _ => value,
                };
                put_key(out, number, 0);
                put_varint(out, value);
            }
            Type::Sint32 | Type::Sint64 => {
                let value = rng.int() as i64;
                put_key(out, number, 0);
                put_varint(out, ((value << 1) ^ (value >> 63)) as u64);
            }
            Type::Fixed32 | Type::Sfixed32 | Type::Float => {
                let value: u32 = if field.r#type() == Type::Float {
                    rng.float().to_bits() as u32
                } else {
                    rng.int() as u32
                };
                put_key(out, number, 5);
                out.extend_from_slice(&value.to_le_bytes());
            }
            Type::Fixed64 | Type::Sfixed64 | Type::Double => {
                let value = if field.r#type() == Type::Double {
                    rng.float().to_bits()
                } else {
                    rng.int()
                };
                put_key(out, number, 1);
                out.extend_from_slice(&value.to_le_bytes());
            }
        }
    }
}

fn put_key(out: &mut Vec<u8>, number: u32, wire_type: u32) {
    put_varint(out, u64::from((number << 3) | wire_type));
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Fields one input holds at most (a repeated field of messages of
/// repeated fields would otherwise grow without end).
const FIELDS_PER_INPUT: u32 = 2000;

/// Values that mean something to the services: ids of sessions, calls and
/// reminders that exist, tool and agent names, paths. A field whose name
/// suggests one draws from it one time in ten, so that inputs get past "not
/// found" into the code behind it.
#[derive(Default)]
pub struct Pools {
    pub session_ids: Vec<String>,
    pub reminder_ids: Vec<String>,
    pub call_ids: Vec<String>,
    pub tool_names: Vec<String>,
    pub instance_ids: Vec<String>,
}

const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-_./ ";

/// Text that has broken parsers and paths before.
const NASTY: &[&str] = &[
    "",
    " ",
    "\0",
    "a\0b",
    "..",
    "../../etc/passwd",
    "/etc/passwd",
    "/",
    "~",
    "$(id)",
    "`id`",
    "; rm -rf /",
    "\u{202e}gnp.exe",
    "\u{1b}[2J\u{1b}]0;title\u{7}",
    "é",
    "🦀",
    "%00",
    "%s%n",
    "{value}",
    "*",
    "**/*",
    "-1",
    "0",
    "18446744073709551616",
    "1e309",
    "NaN",
    "null",
    "true",
    "{}",
    "[]",
    "{\"a\":",
    "{\"command\":\"echo hi\"}",
    "{\"path\":\"../x\"}",
    "* * * * *",
    "0 0 31 2 *",
    "@every 1s",
    "2026-02-30T25:61:00Z",
    "1970-01-01T00:00:00Z",
    "P1Y",
    "http://127.0.0.1:1/",
    "file:///etc/passwd",
    "task-",
    "run-",
    "bash",
    "read_file",
    "write_file",
    "delegate",
    "remind",
    "agentry",
];

impl Pools {
    /// A value for a string field named `field`.
    pub fn string_for(&self, field: &str, rng: &mut Rng) -> Vec<u8> {
        let pick = |pool: &[String], rng: &mut Rng| -> Option<Vec<u8>> {
            if pool.is_empty() {
                return None;
            }
            Some(
                pool[rng.below(pool.len() as u64) as usize]
                    .clone()
                    .into_bytes(),
            )
        };
        let known = if field.ends_with("session_id") || field == "id" || field == "parent" {
            pick(&self.session_ids, rng)
        } else if field.contains("reminder") {
            pick(&self.reminder_ids, rng)
        } else if field.contains("call_id") {
            pick(&self.call_ids, rng)
        } else if field == "tool" || field == "name" || field.ends_with("tool_name") {
            pick(&self.tool_names, rng)
        } else if field.contains("instance") {
            pick(&self.instance_ids, rng)
        } else {
            None
        };
        if let Some(known) = known
            && rng.chance(0.1)
        {
            return known;
        }
        match rng.below(8) {
            0..=2 => NASTY[rng.below(NASTY.len() as u64) as usize]
                .as_bytes()
                .to_vec(),
            3 => {
                // Long text.
                let unit = NASTY[rng.below(NASTY.len() as u64) as usize];
                let unit = if unit.is_empty() { "x" } else { unit };
                unit.repeat(1 + rng.below(20_000) as usize / unit.len())
                    .into_bytes()
            }
            // Bytes that are not UTF-8 now and then: the gRPC layer
            // refuses the whole message, so not often.
            4 if rng.chance(0.1) => rng.junk(24),
            4 => String::from_utf8_lossy(&rng.junk(24))
                .into_owned()
                .into_bytes(),
            _ => {
                let len = rng.below(24) as usize;
                (0..len)
                    .map(|_| ALNUM[rng.below(ALNUM.len() as u64) as usize])
                    .collect()
            }
        }
    }
}
