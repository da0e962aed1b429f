//! Callers decide by a status's code and reason, never by its message: no
//! production source reads a status's message to decide anything (the
//! message is for people and may change; see `agentry_runtime::reasons`).

use std::path::{Path, PathBuf};

/// What deciding by a message looks like.
const PATTERNS: &[&str] = &[
    ".message().contains(",
    ".message().starts_with(",
    ".message().ends_with(",
    ".message() ==",
    ".message().find(",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if path.is_dir() {
            // Tests may read messages: they check what people see.
            if !matches!(name.as_str(), "tests" | "target" | "benches") && !name.ends_with("_tests")
            {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

#[test]
fn no_production_code_decides_by_a_status_message() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    sources(&crates, &mut files);
    assert!(
        files.len() > 100,
        "found only {} sources under {}",
        files.len(),
        crates.display()
    );
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        // A file's unit tests come last, after `#[cfg(test)]`.
        let production = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in production.lines().enumerate() {
            if PATTERNS.iter().any(|p| line.contains(p)) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "decide by `agentry_runtime::reasons::reason_of` (or the code), not the message:\n{}",
        found.join("\n")
    );
}
