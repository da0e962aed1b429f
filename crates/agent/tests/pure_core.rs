#![allow(clippy::expect_used)]
//! The core's purity is compiled, not commented: this crate's normal
//! dependencies, as cargo resolves them for it alone, hold no async
//! runtime, no gRPC, no HTTP stack and no clock crate.

use std::process::Command;

const FORBIDDEN: &[&str] = &[
    "tokio", "tonic", "hyper", "reqwest", "axum", "tower", "chrono", "mio",
];

#[test]
fn the_core_depends_on_no_runtime_network_or_clock() {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--package",
            "agentry-agent",
            "--edges",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tree = String::from_utf8_lossy(&output.stdout);
    let names: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(
        names.contains(&"agentry-proto") && names.contains(&"agentry-llm"),
        "the tree lists the core's own dependencies:\n{tree}"
    );
    let found: Vec<&&str> = FORBIDDEN
        .iter()
        .filter(|forbidden| {
            names
                .iter()
                .any(|name| name == *forbidden || name.starts_with(&format!("{forbidden}-")))
        })
        .collect();
    assert!(
        found.is_empty(),
        "the agent core must not depend on {found:?}:\n{tree}"
    );
}
