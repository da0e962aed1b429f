//! Compiles the contracts in `proto/` with protox (a pure-Rust protobuf
//! compiler, so no system `protoc` is needed) and generates tonic code.

use prost::Message;
use std::path::PathBuf;

const FILES: &[&str] = &[
    "agentry/errors/v1/errors.proto",
    "agentry/sessions/v1/events.proto",
    "agentry/sessions/v1/sessions.proto",
    "agentry/sessions/v1/state.proto",
    "agentry/tools/v1/tools.proto",
    "agentry/scheduler/v1/scheduler.proto",
    "agentry/orchestrator/v1/orchestrator.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let fds = protox::compile(FILES, [&root])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("agentry_descriptor.bin"), fds.encode_to_vec())?;
    std::fs::write(out_dir.join("event_kinds.rs"), event_kind_names(&fds)?)?;
    // Without the `grpc` feature, only the messages are generated.
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_server(grpc)
        .build_client(grpc)
        .build_transport(grpc)
        .compile_fds(fds)?;
    Ok(())
}

/// `event::Kind::name`, from the contract: each variant of the `Event`
/// message's `kind` oneof is named by its field, so a new kind is named
/// where it is declared.
fn event_kind_names(
    fds: &protox::prost_reflect::prost_types::FileDescriptorSet,
) -> Result<String, Box<dyn std::error::Error>> {
    let event = fds
        .file
        .iter()
        .filter(|f| f.package() == "agentry.sessions.v1")
        .flat_map(|f| &f.message_type)
        .find(|m| m.name() == "Event")
        .ok_or("no Event message in agentry.sessions.v1")?;
    let kind = event
        .oneof_decl
        .iter()
        .position(|o| o.name() == "kind")
        .ok_or("no kind oneof in Event")?;
    let mut arms = String::new();
    for field in &event.field {
        if field.oneof_index != Some(kind as i32) {
            continue;
        }
        let variant: String = field
            .name()
            .split('_')
            .map(|part| {
                let mut chars = part.chars();
                chars.next().map_or_else(String::new, |first| {
                    first.to_ascii_uppercase().to_string() + chars.as_str()
                })
            })
            .collect();
        arms.push_str(&format!(
            "            Self::{variant}(_) => {:?},\n",
            field.name()
        ));
    }
    Ok(format!(
        "impl event::Kind {{\n    \
         /// The kind's name in the contract (its field in `Event.kind`).\n    \
         pub fn name(&self) -> &'static str {{\n        \
         match self {{\n{arms}        }}\n    }}\n}}\n"
    ))
}
