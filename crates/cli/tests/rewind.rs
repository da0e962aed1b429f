//! Rewind and fork with the workspace, through the real `agentry` binary:
//! `agentry up` in the background, a scripted model, and
//! `agentry sessions fork | rewind | prune | show`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_testkit::fake_model::{FakeModel, Reply};
use common::install::{Install, Up, run_with_input, text};
use serde_json::{Value, json};
use std::path::PathBuf;

fn workspace(install: &Install, session: &str) -> PathBuf {
    install.dir.path().join("data/workspaces").join(session)
}

/// The seq of the n-th (1-based) event of `kind`.
fn nth_seq(events: &[Value], kind: &str, n: usize) -> u64 {
    events
        .iter()
        .filter(|e| e["type"] == kind)
        .nth(n - 1)
        .unwrap_or_else(|| panic!("no {kind} #{n} in {events:#?}"))["seq"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn fork_and_rewind_put_back_files_bash_deleted() {
    let model = FakeModel::start().await.unwrap();
    // Turn 1 writes two files; turn 2 deletes one with bash and adds junk.
    model.push(Reply::tool_call(
        "w1",
        "write_file",
        json!({"path": "notes/plan.md", "content": "keep me\n"}),
    ));
    model.push(Reply::tool_call(
        "w2",
        "bash",
        json!({"command": "echo v1 > version.txt"}),
    ));
    model.push(Reply::text("Written."));
    model.push(Reply::tool_call(
        "d1",
        "bash",
        json!({"command": "rm -r notes && echo v2 > version.txt && mkdir junk && echo x > junk/y"}),
    ));
    model.push(Reply::text("Cleaned up."));
    let (install, up, log) = Up::start_configured(
        &model.base_url(),
        "[tool_runner.snapshots]\nkeep_days = 0\n",
    );
    let out = install.run(&["run", "--approve", "always", "write the plan"]);
    assert!(out.status.success(), "{:?}\n{}", text(&out), log.display());
    let id = install.latest_session();
    let out = install.run(&["run", "--session", &id, "--approve", "always", "clean up"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let ws = workspace(&install, &id);
    assert!(!ws.join("notes/plan.md").exists());
    assert!(ws.join("junk/y").exists());

    // Snapshots are in the log: before each turn's first change, and at
    // each turn's end.
    let log_events = install.events(&id);
    let snapshots: Vec<&Value> = log_events
        .iter()
        .filter(|e| e["type"] == "workspace_snapshot")
        .collect();
    let points: Vec<&str> = snapshots
        .iter()
        .map(|e| e["point"].as_str().unwrap())
        .collect();
    assert_eq!(
        points,
        ["before_change", "turn_end", "before_change", "turn_end"],
        "{snapshots:#?}"
    );
    assert!(snapshots.iter().all(|s| s["error"] == ""), "{snapshots:#?}");
    // The end of turn 1 and the start of turn 2 hold the same files.
    assert_eq!(snapshots[1]["snapshot_id"], snapshots[2]["snapshot_id"]);
    let shown = install.run(&["sessions", "show", &id]);
    let (stdout, _) = text(&shown);
    assert!(stdout.contains("── turn 1 · seq 1 ──"), "{stdout}");
    assert!(stdout.contains("── turn 2 · seq"), "{stdout}");

    // A fork at the end of turn 1 has the files as they were then.
    let end_of_turn_1 = nth_seq(&log_events, "turn_finished", 1);
    let out = install.run(&[
        "sessions",
        "fork",
        &id,
        "--at",
        &end_of_turn_1.to_string(),
        "--id",
        "forked-1",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("forked"), "{stdout}");
    assert!(stdout.contains("files: as recorded at seq"), "{stdout}");
    let fork = workspace(&install, "forked-1");
    assert_eq!(
        std::fs::read_to_string(fork.join("notes/plan.md")).unwrap(),
        "keep me\n"
    );
    assert_eq!(
        std::fs::read_to_string(fork.join("version.txt")).unwrap(),
        "v1\n"
    );
    assert!(!fork.join("junk").exists());
    // The fork's log stops there, and it records where its files came from.
    let forked = install.events("forked-1");
    assert!(
        forked
            .iter()
            .all(|e| e["type"] != "user_message" || e["text"] != "clean up")
    );
    assert_eq!(forked.last().unwrap()["point"], "fork");
    // The original is untouched by the fork.
    assert!(!ws.join("notes").exists());

    // A rewind to turn 1 puts the files back in place.
    let out = install.run(&["sessions", "rewind", &id, "--to", "1"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("rewound"), "{stdout}");
    assert!(stdout.contains("files: put back"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/plan.md")).unwrap(),
        "keep me\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("version.txt")).unwrap(),
        "v1\n"
    );
    assert!(!ws.join("junk").exists());
    // Turn 2 is history: shown as such, and out of what the model sees.
    let (stdout, _) = text(&install.run(&["sessions", "show", &id]));
    assert!(stdout.contains("turn (rewound: history)"), "{stdout}");
    assert!(stdout.contains("rewound to the end of turn 1"), "{stdout}");
    let history = install.events(&id);
    assert!(
        history
            .iter()
            .any(|e| e["history"] == true && e["type"] == "user_message"),
        "{history:#?}"
    );
    model.push(Reply::text("Back where we were."));
    let out = install.run(&[
        "run",
        "--session",
        &id,
        "--approve",
        "always",
        "where are we?",
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
    let request = model.requests().last().unwrap().to_string();
    assert!(request.contains("write the plan"), "{request}");
    assert!(!request.contains("clean up"), "{request}");
    assert!(!request.contains("rm -r notes"), "{request}");
    let (stdout, _) = text(&install.run(&["sessions", "show", &id]));
    assert!(
        stdout.contains("── turn 2 · seq"),
        "the next turn is turn 2 again: {stdout}"
    );

    // Bad requests get clear answers.
    let out = install.run(&["sessions", "rewind", &id, "--to", "9"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("the session has 2 turns"), "{stderr}");
    let out = install.run(&["sessions", "fork", &id, "--at", "100000"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("its log ends at seq"), "{stderr}");

    // Pruning (keep_days = 0) keeps each session's latest snapshot only: a
    // rewind to the empty workspace of the start is then refused, with the
    // way out, and the conversation alone can still go back.
    let out = install.run(&["sessions", "prune", "--dry-run"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("would remove"), "{stdout}");
    let out = install.run(&["sessions", "prune"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("removed "), "{stdout}");
    assert!(!stdout.starts_with("removed 0 "), "{stdout}");
    let out = install.run(&["sessions", "rewind", &id, "--to", "0"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("not in the store"), "{stderr}");
    assert!(
        ws.join("notes/plan.md").exists(),
        "a refused rewind changes nothing"
    );
    let out = install.run(&[
        "sessions",
        "rewind",
        &id,
        "--to",
        "0",
        "--conversation-only",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("files: left as they are"), "{stdout}");
    drop(up);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_inside_a_turn_closes_it_and_a_running_turn_cannot_be_rewound() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "echo one > a.txt"}),
    ));
    model.push(Reply::text("Done."));
    let (install, up, _log) = Up::start(&model.base_url());
    let out = install.run(&["run", "--approve", "always", "make a"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let id = install.latest_session();
    let log = install.events(&id);
    // Right after the call's result: inside the turn, files changed.
    let result = nth_seq(&log, "tool_result", 1);
    let out = install.run(&[
        "sessions",
        "fork",
        &id,
        "--at",
        &result.to_string(),
        "--id",
        "mid-turn",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("closed as cancelled"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(workspace(&install, "mid-turn").join("a.txt")).unwrap(),
        "one\n"
    );
    let forked = install.events("mid-turn");
    assert_eq!(forked.last().unwrap()["type"], "turn_finished");
    // The fork is usable at once.
    model.push(Reply::text("Forked and fine."));
    let out = install.run(&[
        "run",
        "--session",
        "mid-turn",
        "--approve",
        "always",
        "hello",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "Forked and fine.");
    // A whole-log fork takes the files as they are now.
    std::fs::write(workspace(&install, &id).join("b.txt"), "made by hand").unwrap();
    let out = install.run(&["sessions", "fork", &id, "--id", "now"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("files: as they are now"), "{stdout}");
    assert!(workspace(&install, "now").join("b.txt").exists());
    // While a turn runs (the model is slow to answer), no rewind.
    model.push(Reply::text("Slow answer.").delay(std::time::Duration::from_secs(3)));
    let running = install.command(&["run", "--session", &id, "--approve", "always", "slow"]);
    let running = tokio::task::spawn_blocking(move || {
        let mut running = running;
        running.stdin(std::process::Stdio::null()).output().unwrap()
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while model.request_count() < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow turn never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let out = install.run(&["sessions", "rewind", &id, "--to", "0"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("is running: cancel it"), "{stderr}");
    let out = running.await.unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    drop(up);
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_rewinds_with_a_slash_command() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "echo kept > kept.txt"}),
    ));
    model.push(Reply::text("Made it."));
    model.push(Reply::tool_call(
        "d1",
        "bash",
        json!({"command": "rm kept.txt"}),
    ));
    model.push(Reply::text("Removed it."));
    let (install, up, _log) = Up::start(&model.base_url());
    let out = run_with_input(
        &install,
        &["chat"],
        b"make the file\ny\nremove it\ny\n/rewind x\n/rewind 1\n",
        &[],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Removed it."), "{stdout}");
    assert!(
        stderr.contains("/rewind N: the turn to go back to"),
        "{stderr}"
    );
    let id = install.latest_session();
    assert_eq!(
        std::fs::read_to_string(workspace(&install, &id).join("kept.txt")).unwrap(),
        "kept\n"
    );
    let (shown, _) = text(&install.run(&["sessions", "show", &id]));
    assert!(shown.contains("rewound to the end of turn 1"), "{shown}");
    drop(up);
}
