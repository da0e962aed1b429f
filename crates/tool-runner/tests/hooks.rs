//! Running hooks: the event on standard input, the streams apart, the
//! process group killed at the timeout, a fresh directory each time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_tool_runner::Limits;
use agentry_tool_runner::hooks::{self, MAX_HOOK_OUTPUT};
use agentry_tool_runner::sandbox::Sandbox;
use agentry_tool_runner::workspace::Workspace;
use std::time::{Duration, Instant};

fn limits() -> Limits {
    Limits {
        default_timeout: Duration::from_secs(20),
        max_timeout: Duration::from_secs(60),
        max_output_bytes: 262_144,
        max_read_bytes: 262_144,
        workspace_bytes: 0,
    }
}

async fn run(ws: &Workspace, command: &str, input: &str, timeout: Duration) -> hooks::HookRun {
    hooks::run(
        &Sandbox::unconfined(),
        ws,
        &limits(),
        command,
        input,
        timeout,
    )
    .await
}

#[tokio::test]
async fn a_hook_reads_its_input_and_its_streams_stay_apart() {
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::open(dir.path(), "s1").unwrap();
    let ran = run(
        &ws,
        "read line; echo \"got $line\"; echo oops >&2; echo \"$PWD|$HOME|$AGENTRY_WORKSPACE\"; exit 3",
        "{\"event\":\"before_tool\"}\n",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(ran.error, "");
    assert_eq!(ran.exit_code, Some(3));
    assert!(!ran.timed_out);
    let mut lines = ran.stdout.lines();
    assert_eq!(lines.next(), Some("got {\"event\":\"before_tool\"}"));
    let places: Vec<&str> = lines.next().unwrap().split('|').collect();
    assert_eq!(ran.stderr, "oops\n");
    // A fresh directory, its HOME too, gone afterwards; the workspace named.
    assert!(places[0].contains("/.hook-"), "{places:?}");
    assert_eq!(places[0], places[1]);
    assert!(!std::path::Path::new(places[0]).exists());
    assert_eq!(places[2], ws.root().display().to_string());
    // Files the session left in its workspace are not where the hook starts.
    std::fs::write(ws.root().join("json.py"), "planted").unwrap();
    let ran = run(&ws, "ls -A", "", Duration::from_secs(10)).await;
    assert_eq!(ran.stdout, "");
}

#[tokio::test]
async fn a_hook_past_its_timeout_is_killed_with_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::open(dir.path(), "s1").unwrap();
    let marker = dir.path().join("survived");
    let started = Instant::now();
    let ran = run(
        &ws,
        &format!(
            "(sleep 2; touch {}) & echo started; sleep 30",
            marker.display()
        ),
        "",
        Duration::from_millis(500),
    )
    .await;
    assert!(ran.timed_out);
    assert_eq!(ran.exit_code, None);
    assert_eq!(ran.stdout, "started\n");
    assert!(started.elapsed() < Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!marker.exists(), "a process the hook started outlived it");
}

#[tokio::test]
async fn a_hook_output_is_capped_and_a_bad_hook_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::open(dir.path(), "s1").unwrap();
    let ran = run(
        &ws,
        "head -c 500000 /dev/zero | tr '\\0' x",
        "",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(ran.exit_code, Some(0));
    assert!(
        ran.stdout.len() <= MAX_HOOK_OUTPUT + 200,
        "{}",
        ran.stdout.len()
    );
    let ran = run(&ws, "  ", "", Duration::from_secs(1)).await;
    assert_eq!(ran.error, "the hook's command is empty");
    // A hook that does not read its (large) input still ends.
    let input = "x".repeat(200_000);
    let ran = run(&ws, "true", &input, Duration::from_secs(10)).await;
    assert_eq!((ran.exit_code, ran.error.as_str()), (Some(0), ""));
}
