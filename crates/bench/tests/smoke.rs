//! The benchmark binary end to end on a tiny load: it must run every
//! scenario against the real services and report zero errors, and say
//! clearly when the services cannot be started.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_agentry-bench");

fn agentry() -> PathBuf {
    let path = PathBuf::from(BENCH).with_file_name("agentry");
    assert!(
        path.is_file(),
        "{} is missing: cargo test --workspace builds it",
        path.display()
    );
    path
}

#[test]
fn every_scenario_runs_on_a_small_load() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("figures.json");
    let out = Command::new(BENCH)
        .args([
            "--scenarios",
            "turns,streaming,shell,reminders,store,idle",
            "--sessions",
            "1,3",
            "--turns",
            "6",
            "--pending",
            "100",
            "--idle-sessions",
            "5",
            "--streams",
            "4",
            "--json",
        ])
        .arg(&json)
        .arg("--agentry-bin")
        .arg(agentry())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let figures: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = figures["turns"]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "fresh, growing and 3 sessions: {runs:?}");
    for run in runs {
        assert_eq!(run["errors"], 0, "{run}");
        assert!(run["turns_per_sec"].as_f64().unwrap() > 0.0, "{run}");
    }
    assert_eq!(figures["streaming"]["tokens"], 2000);
    assert_eq!(figures["streaming"]["streams"], 4);
    assert!(
        figures["streaming"]["load_orchestrator_cpu_us_per_token"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(figures["shell"]["ratio_sandbox_on"].as_f64().unwrap() > 0.0);
    assert!(figures["shell"]["ratio_sandbox_off"].as_f64().unwrap() > 0.0);
    // The goals table: growing vs fresh, commits per turn, streaming (one
    // session, and many at once) and the shell with and without the
    // sandbox, each with its figure (the concurrency goal is for 1,000
    // sessions, not run here).
    let goals = figures["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 6, "{goals:?}");
    // Every turn is durable: at least its message and its end are commits.
    let commits = runs[0]["commits_per_turn"].as_f64().unwrap();
    assert!((1.0..=8.0).contains(&commits), "{commits}");
    for g in goals {
        assert!(g["value"].as_f64().unwrap().is_finite(), "{g}");
        assert!(g["met"].is_boolean(), "{g}");
    }
    assert!(stdout.contains("== goals"), "{stdout}");
    assert_eq!(figures["reminders"]["runs"][0]["fired"], 100);
    assert_eq!(figures["store"]["runs"].as_array().unwrap().len(), 2);
    assert_eq!(figures["idle"]["errors"], 0);
    assert!(stdout.contains("turns/s"), "{stdout}");
}

#[test]
fn services_that_do_not_start_are_a_clear_error() {
    let out = Command::new(BENCH)
        .args(["--scenarios", "store", "--agentry-bin", "/bin/false"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("agentry-bench: the session-store did not come up"),
        "{stderr}"
    );
}
