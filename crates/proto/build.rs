//! Compiles the contracts in `proto/` with protox (a pure-Rust protobuf
//! compiler, so no system `protoc` is needed) and generates tonic code.

use prost::Message;
use std::path::PathBuf;

const FILES: &[&str] = &[
    "agentry/errors/v1/errors.proto",
    "agentry/sessions/v1/events.proto",
    "agentry/sessions/v1/sessions.proto",
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
    // Without the `grpc` feature, only the messages are generated.
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_server(grpc)
        .build_client(grpc)
        .build_transport(grpc)
        .compile_fds(fds)?;
    Ok(())
}
