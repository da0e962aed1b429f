//! The fuzzer as a program: its corpus (the inputs that once found
//! something) replays clean against today's services, and a selection it
//! cannot honour is refused in words.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

fn fuzz() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentry-fuzz"));
    command.current_dir(env!("CARGO_MANIFEST_DIR"));
    command
}

/// How many messages-files each RPC's corpus directory holds.
fn corpus() -> Vec<(String, usize)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut rpcs: Vec<(String, usize)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let files = std::fs::read_dir(entry.path()).unwrap().count();
            (entry.file_name().to_string_lossy().into_owned(), files)
        })
        .collect();
    rpcs.sort();
    rpcs
}

#[test]
fn every_corpus_input_replays_without_a_finding() {
    let rpcs = corpus();
    assert!(!rpcs.is_empty(), "the corpus is empty");
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("report.json");
    let mut command = fuzz();
    command
        .args(["--inputs", "0", "--seed", "1", "--corpus"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"))
        .arg("--findings")
        .arg(out.path().join("findings"))
        .arg("--json")
        .arg(&json);
    for (rpc, _) in &rpcs {
        command.args(["--rpc", rpc]);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the corpus replay found something:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("no findings"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for (rpc, files) in &rpcs {
        let entry = report["rpcs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["rpc"] == rpc.as_str())
            .unwrap_or_else(|| panic!("{rpc} is not in the report: {report}"));
        assert_eq!(entry["corpus"], *files as u64, "{entry}");
        assert_eq!(entry["inputs"], *files as u64, "{entry}");
        // Every input had an answer (a refusal counts), none hung.
        let answers: u64 = entry["codes"]
            .as_object()
            .unwrap()
            .values()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(answers, *files as u64, "{entry}");
        assert_eq!(entry["findings"], serde_json::json!([]), "{entry}");
    }
}

#[test]
fn an_rpc_no_contract_has_is_refused_with_the_way_to_list_them() {
    let output = fuzz()
        .args(["--rpc", "SessionStore.Apend", "--inputs", "1"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("\"SessionStore.Apend\"") && stderr.contains("--list"),
        "{stderr}"
    );
}
