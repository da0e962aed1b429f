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

/// The crates of the four services: their errors are typed (a thiserror
/// type per kind of failure), never a bare `String`.
const SERVICE_CRATES: &[&str] = &[
    "orchestrator",
    "tool-runner",
    "scheduler",
    "session-store",
    "tool",
    "web",
    "mcp",
];

#[test]
fn the_services_fail_with_typed_errors_not_strings() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for name in SERVICE_CRATES {
        sources(&crates.join(name).join("src"), &mut files);
    }
    assert!(files.len() > 50, "found only {} sources", files.len());
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let production = text.split("#[cfg(test)]").next().unwrap_or_default();
        // `Result<T, String>`, with any T (a nested generic included).
        let flat: String = production.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut rest = flat.as_str();
        while let Some(at) = rest.find("Result<") {
            rest = &rest[at + "Result<".len()..];
            let mut depth = 1;
            let mut last_comma = None;
            for (i, c) in rest.char_indices() {
                match c {
                    '<' | '(' => depth += 1,
                    '>' | ')' => {
                        depth -= 1;
                        if depth == 0 {
                            // The error type: after the last top-level comma
                            // but a trailing one (`…, String,>` as rustfmt
                            // writes a long one).
                            let inner = rest[..i].trim().trim_end_matches(',');
                            let error = last_comma
                                .filter(|c: &usize| *c < inner.len())
                                .map(|c: usize| inner[c + 1..].trim());
                            if error == Some("String") {
                                found.push(format!("{}: Result<{}>", file.display(), &rest[..i]));
                            }
                            break;
                        }
                    }
                    ',' if depth == 1 && rest[i + 1..].trim_start().starts_with(['>', ',']) => {}
                    ',' if depth == 1 => last_comma = Some(i),
                    _ => {}
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "give these failures a type of their own (see `agentry_tool_runner::errors`):\n{}",
        found.join("\n")
    );
}
