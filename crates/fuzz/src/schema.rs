//! The contracts as the fuzzer walks them: every service's methods and
//! every message's fields, read from the encoded `FileDescriptorSet` the
//! proto crate compiles in (so a new RPC or field is fuzzed without a
//! change here).

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use std::collections::HashMap;

/// A field's type.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Double,
    Float,
    Int64,
    Uint64,
    Int32,
    Fixed64,
    Fixed32,
    Bool,
    String,
    Bytes,
    Uint32,
    Sfixed32,
    Sfixed64,
    Sint32,
    Sint64,
    /// An enum, by full name (no leading dot).
    Enum(String),
    /// A message, by full name (no leading dot).
    Message(String),
}

/// One field of a message.
#[derive(Debug, Clone)]
pub struct Field {
    pub name: String,
    pub number: u32,
    pub kind: Kind,
    pub repeated: bool,
    /// The real oneof it belongs to (not the synthetic one of a proto3
    /// `optional`).
    pub oneof: Option<usize>,
}

/// One message type.
#[derive(Debug, Clone)]
pub struct MessageType {
    /// Full name, e.g. `agentry.sessions.v1.AppendRequest`.
    pub name: String,
    pub fields: Vec<Field>,
    /// How many real oneofs it has.
    pub oneofs: usize,
}

/// One RPC.
#[derive(Debug, Clone)]
pub struct Method {
    /// The service's short name (`SessionStore`).
    pub service: String,
    /// The method's name (`Append`).
    pub name: String,
    /// `/agentry.sessions.v1.SessionStore/Append`.
    pub path: String,
    /// The input message's full name.
    pub input: String,
    /// The output message's full name.
    pub output: String,
    pub client_streaming: bool,
    pub server_streaming: bool,
}

impl Method {
    /// `Service/Method`, as the CLI names it.
    pub fn label(&self) -> String {
        format!("{}/{}", self.service, self.name)
    }
}

/// Every message, enum and method of a descriptor set.
#[derive(Debug, Default)]
pub struct Schema {
    messages: HashMap<String, MessageType>,
    enums: HashMap<String, Vec<i32>>,
    pub methods: Vec<Method>,
}

impl Schema {
    /// Reads an encoded `FileDescriptorSet`.
    pub fn decode(bytes: &[u8]) -> Result<Schema, prost::DecodeError> {
        let set = prost_types::FileDescriptorSet::decode(bytes)?;
        let mut schema = Schema::default();
        for file in &set.file {
            let package = file.package();
            for message in &file.message_type {
                schema.add_message(package, message);
            }
            for e in &file.enum_type {
                schema.add_enum(package, e);
            }
            for service in &file.service {
                for method in &service.method {
                    schema.methods.push(Method {
                        service: service.name().to_string(),
                        name: method.name().to_string(),
                        path: format!("/{package}.{}/{}", service.name(), method.name()),
                        input: method.input_type().trim_start_matches('.').to_string(),
                        output: method.output_type().trim_start_matches('.').to_string(),
                        client_streaming: method.client_streaming(),
                        server_streaming: method.server_streaming(),
                    });
                }
            }
        }
        Ok(schema)
    }

    fn add_message(&mut self, scope: &str, message: &prost_types::DescriptorProto) {
        let name = join(scope, message.name());
        for nested in &message.nested_type {
            self.add_message(&name, nested);
        }
        for e in &message.enum_type {
            self.add_enum(&name, e);
        }
        // A proto3 `optional` field is the only member of a synthetic oneof.
        let synthetic: Vec<bool> = (0..message.oneof_decl.len())
            .map(|i| {
                message
                    .field
                    .iter()
                    .any(|f| f.oneof_index == Some(i as i32) && f.proto3_optional())
            })
            .collect();
        let mut real = HashMap::new();
        for (i, is_synthetic) in synthetic.iter().enumerate() {
            if !is_synthetic {
                let next = real.len();
                real.insert(i as i32, next);
            }
        }
        let fields = message
            .field
            .iter()
            .map(|f| Field {
                name: f.name().to_string(),
                number: f.number() as u32,
                kind: kind_of(f),
                repeated: f.label() == Label::Repeated,
                oneof: f.oneof_index.and_then(|i| real.get(&i).copied()),
            })
            .collect();
        self.messages.insert(
            name.clone(),
            MessageType {
                name,
                fields,
                oneofs: real.len(),
            },
        );
    }

    fn add_enum(&mut self, scope: &str, e: &prost_types::EnumDescriptorProto) {
        let values = e.value.iter().map(|v| v.number()).collect();
        self.enums.insert(join(scope, e.name()), values);
    }

    /// A message type by full name.
    pub fn message(&self, name: &str) -> Option<&MessageType> {
        self.messages.get(name)
    }

    /// The numbers an enum declares (empty for an unknown enum).
    pub fn enum_values(&self, name: &str) -> &[i32] {
        self.enums.get(name).map_or(&[], Vec::as_slice)
    }

    /// The methods, optionally only those `filter` selects.
    pub fn selected<'a>(&'a self, filter: &'a [String]) -> impl Iterator<Item = &'a Method> + 'a {
        self.methods
            .iter()
            .filter(move |m| filter.is_empty() || filter.iter().any(|f| selects(f, m)))
    }
}

/// Whether `--only` entry `filter` names `method`: `Service/Method`,
/// `Service` alone, or the full path.
pub fn selects(filter: &str, method: &Method) -> bool {
    let filter = filter.trim().trim_start_matches('/');
    filter.eq_ignore_ascii_case(&method.label())
        || filter.eq_ignore_ascii_case(&method.service)
        || filter.eq_ignore_ascii_case(method.path.trim_start_matches('/'))
}

fn join(scope: &str, name: &str) -> String {
    if scope.is_empty() {
        name.to_string()
    } else {
        format!("{scope}.{name}")
    }
}

fn kind_of(f: &prost_types::FieldDescriptorProto) -> Kind {
    let type_name = || f.type_name().trim_start_matches('.').to_string();
    match f.r#type() {
        Type::Double => Kind::Double,
        Type::Float => Kind::Float,
        Type::Int64 => Kind::Int64,
        Type::Uint64 => Kind::Uint64,
        Type::Int32 => Kind::Int32,
        Type::Fixed64 => Kind::Fixed64,
        Type::Fixed32 => Kind::Fixed32,
        Type::Bool => Kind::Bool,
        Type::String => Kind::String,
        Type::Bytes => Kind::Bytes,
        Type::Uint32 => Kind::Uint32,
        Type::Sfixed32 => Kind::Sfixed32,
        Type::Sfixed64 => Kind::Sfixed64,
        Type::Sint32 => Kind::Sint32,
        Type::Sint64 => Kind::Sint64,
        Type::Enum => Kind::Enum(type_name()),
        // Groups do not occur in proto3; treat them as messages.
        Type::Message | Type::Group => Kind::Message(type_name()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn every_service_of_the_contracts_is_read() {
        let schema = Schema::decode(agentry_proto::FILE_DESCRIPTOR_SET).unwrap();
        let services: std::collections::BTreeSet<&str> =
            schema.methods.iter().map(|m| m.service.as_str()).collect();
        for service in ["SessionStore", "ToolRunner", "Scheduler", "Orchestrator"] {
            assert!(services.contains(service), "{services:?}");
        }
        for method in &schema.methods {
            assert!(schema.message(&method.input).is_some(), "{}", method.input);
            assert!(schema.message(&method.output).is_some(), "{}", method.output);
        }
        let append = schema.message("agentry.sessions.v1.AppendRequest").unwrap();
        assert!(append.fields.iter().any(|f| f.name == "events" && f.repeated));
        // The Event's kinds are one oneof.
        let event = schema.message("agentry.sessions.v1.Event").unwrap();
        assert!(event.oneofs >= 1);
        let timestamp = schema.message("google.protobuf.Timestamp").unwrap();
        assert_eq!(timestamp.fields.len(), 2);
    }
}
