//! Scheduled tasks run with no client open: schedules added with the CLI
//! fire every minute into sessions of their own, each run is listed with
//! its outcome, a run still waiting for a person makes the next one skip,
//! and `--approve never` refuses what would need a person.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_proto::scheduler::v1 as rpb;
use agentry_proto::sessions::v1::event::Kind;
use agentry_testkit::Reply;
use agentry_testkit::fake_model::Fallback;
use common::{Orchestrator, cluster_without_orchestrator};
use serde_json::json;
use std::time::{Duration, Instant};

/// Runs the CLI; its standard output, or a panic with everything it said.
fn cli(orchestrator: &Orchestrator, args: &[&str]) -> String {
    let out = orchestrator.cli(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "agentry {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The id `agentry schedules add` printed.
fn added(output: &str) -> String {
    output
        .lines()
        .find_map(|l| l.strip_prefix("scheduled task "))
        .unwrap_or_else(|| panic!("no id in {output:?}"))
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn cron_schedules_run_with_no_client_and_their_runs_are_listed() {
    let mut cluster = cluster_without_orchestrator(|_| {}).await;
    cluster.model.set_fallback(Fallback::Match {
        rules: vec![
            (
                "write the daily note".into(),
                Reply::text("the daily note is written"),
            ),
            (
                "tidy the workspace".into(),
                Reply::tool_call("c1", "bash", json!({"command": "touch tidy.txt"})),
            ),
            (
                "sweep the floor".into(),
                Reply::tool_call("c2", "bash", json!({"command": "touch swept.txt"})),
            ),
            ("write the scribe note".into(), Reply::text("scribed")),
        ],
        otherwise: Box::new(Reply::text("understood")),
    });
    let mut orchestrator = Orchestrator::new(&mut cluster);
    orchestrator.local_config(
        "[[agents]]\nname = \"scribe\"\ndescription = \"Writes notes\"\n\
         system_prompt = \"You are the scribe (SCRIBE-MARKER).\"\ntools = [\"read_file\"]\n",
    );
    let _client = orchestrator.start().await;

    // A bad expression is refused with a reason, and nothing is stored.
    let out = orchestrator
        .cli(&["schedules", "add", "--cron", "61 * * * *", "never"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("61"), "{said}");

    let every_minute = ["schedules", "add", "--cron", "* * * * *", "--tz", "UTC"];
    let note = added(&cli(
        &orchestrator,
        &[&every_minute[..], &["write the daily note"]].concat(),
    ));
    let tidy = added(&cli(
        &orchestrator,
        &[&every_minute[..], &["tidy the workspace"]].concat(),
    ));
    let sweep = added(&cli(
        &orchestrator,
        &[
            &every_minute[..],
            &["--approve", "never", "sweep the floor"],
        ]
        .concat(),
    ));
    let scribe = added(&cli(
        &orchestrator,
        &[
            &every_minute[..],
            &["--agent", "scribe", "write the scribe note"],
        ]
        .concat(),
    ));
    let nobody = added(&cli(
        &orchestrator,
        &[
            &every_minute[..],
            &["--agent", "nosuch", "write the scribe note"],
        ]
        .concat(),
    ));
    let listed = cli(&orchestrator, &["schedules", "list"]);
    for id in [&note, &tidy, &sweep, &scribe, &nobody] {
        assert!(listed.contains(id.as_str()), "{listed}");
    }
    assert!(listed.contains("as the agent scribe"), "{listed}");
    assert!(
        listed.contains("calls that need a person are refused"),
        "{listed}"
    );

    // No client from here on: the services run the schedules by themselves.
    let mut scheduler = cluster.scheduler().await.unwrap();
    let runs_of = |id: &str| {
        let mut scheduler = scheduler.clone();
        let id = id.to_string();
        async move {
            scheduler
                .list_runs(rpb::ListRunsRequest {
                    reminder_id: id,
                    limit: 10,
                })
                .await
                .unwrap()
                .into_inner()
                .runs
        }
    };
    let deadline = Instant::now() + Duration::from_secs(200);
    let state = |r: &rpb::ScheduledRun| rpb::RunState::try_from(r.state).unwrap();
    loop {
        let notes = runs_of(&note).await;
        let tidies = runs_of(&tidy).await;
        let done = notes
            .iter()
            .filter(|r| state(r) == rpb::RunState::Completed)
            .count()
            >= 2
            && tidies.len() >= 2
            && runs_of(&scribe)
                .await
                .iter()
                .any(|r| state(r) == rpb::RunState::Completed)
            && !runs_of(&nobody).await.is_empty();
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the schedules did not run twice: {notes:#?} {tidies:#?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // Two runs, each in a session of its own, each completed.
    let notes = runs_of(&note).await;
    let completed: Vec<&rpb::ScheduledRun> = notes
        .iter()
        .filter(|r| state(r) == rpb::RunState::Completed)
        .collect();
    assert_eq!(completed[0].note, "the daily note is written");
    assert_ne!(completed[0].session_id, completed[1].session_id);
    assert_ne!(completed[0].firing_id, completed[1].firing_id);
    let shown = cli(&orchestrator, &["schedules", "runs", &note[..24]]);
    assert_eq!(
        shown.matches("completed").count(),
        notes.len().min(10),
        "{shown}"
    );
    assert!(shown.contains(&completed[1].session_id), "{shown}");

    // The first tidy run waits for a person; the next one skipped it.
    let tidies = runs_of(&tidy).await;
    let first = tidies.last().unwrap();
    assert_eq!(state(first), rpb::RunState::Running, "{tidies:#?}");
    let skipped = &tidies[tidies.len() - 2];
    assert_eq!(state(skipped), rpb::RunState::Skipped, "{tidies:#?}");
    assert!(skipped.note.contains("still going"), "{}", skipped.note);
    assert!(skipped.note.contains(&first.session_id), "{}", skipped.note);
    let inbox = cli(&orchestrator, &["approvals"]);
    assert!(
        inbox.contains(&first.session_id[..8]) || inbox.contains("touch tidy.txt"),
        "{inbox}"
    );

    // With --approve never the call is refused: nobody is asked, the run
    // ends, and the command never ran.
    let sweeps = runs_of(&sweep).await;
    let swept = sweeps
        .iter()
        .find(|r| state(r) == rpb::RunState::Completed)
        .unwrap_or_else(|| panic!("{sweeps:#?}"));
    let log = cluster
        .store()
        .await
        .unwrap()
        .read(agentry_proto::sessions::v1::ReadRequest {
            session_id: swept.session_id.clone(),
            from_seq: 1,
            limit: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    assert!(
        !log.iter()
            .any(|e| matches!(e.kind, Some(Kind::ApprovalRequested(_)))),
        "{log:#?}"
    );
    let refused = log.iter().find_map(|e| match &e.kind {
        Some(Kind::ToolResult(r)) => Some(r.clone()),
        _ => None,
    });
    assert!(refused.as_ref().is_some_and(|r| r.is_error), "{log:#?}");
    let started = log.iter().find_map(|e| match &e.kind {
        Some(Kind::ReminderDue(r)) => Some(r.clone()),
        _ => None,
    });
    assert!(started.is_some_and(|r| r.scheduled && r.message == "sweep the floor"));

    // As an agent: its own session works with the agent's prompt and tools.
    let scribed = runs_of(&scribe).await;
    let scribed = scribed
        .iter()
        .find(|r| state(r) == rpb::RunState::Completed)
        .unwrap();
    assert!(scribed.session_id.starts_with("run-as-"), "{scribed:?}");
    assert_eq!(scribed.note, "scribed");
    let asked = cluster
        .model
        .requests()
        .into_iter()
        .find(|r| r.to_string().contains("write the scribe note"))
        .unwrap();
    assert!(asked.to_string().contains("SCRIBE-MARKER"), "{asked}");
    let offered: Vec<String> = asked["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default();
    assert!(!offered.iter().any(|t| t == "bash"), "{offered:?}");
    let shown = cli(&orchestrator, &["sessions", "show", &scribed.session_id]);
    assert!(shown.contains("works as the agent scribe"), "{shown}");
    // An agent nobody configured: the run does not start, and says why.
    let missing = runs_of(&nobody).await;
    assert_eq!(state(&missing[0]), rpb::RunState::NotStarted, "{missing:?}");
    assert!(
        missing[0].note.contains("no agent named \"nosuch\""),
        "{missing:?}"
    );

    // Paused, resumed, removed.
    let paused = cli(&orchestrator, &["schedules", "pause", &note]);
    assert!(paused.contains("paused"), "{paused}");
    let listed = cli(&orchestrator, &["schedules", "list"]);
    let line = listed.lines().find(|l| l.starts_with(&note)).unwrap();
    assert!(line.contains("paused"), "{listed}");
    let resumed = cli(&orchestrator, &["schedules", "resume", &note]);
    assert!(resumed.contains("next run"), "{resumed}");
    for id in [&note, &tidy, &sweep, &scribe, &nobody] {
        cli(&orchestrator, &["schedules", "remove", id]);
    }
    let listed = cli(&orchestrator, &["schedules", "list"]);
    assert!(listed.contains("no scheduled tasks"), "{listed}");
    let all = cli(&orchestrator, &["schedules", "list", "--all"]);
    assert!(all.contains(&note) && all.contains("removed"), "{all}");
    // A removed schedule fires no more.
    let before = scheduler
        .list_runs(rpb::ListRunsRequest {
            reminder_id: note.clone(),
            limit: 100,
        })
        .await
        .unwrap()
        .into_inner()
        .runs
        .len();
    let removed = scheduler
        .list_reminders(rpb::ListRemindersRequest {
            session_id: String::new(),
            status: rpb::ReminderStatus::Cancelled as i32,
        })
        .await
        .unwrap()
        .into_inner()
        .reminders;
    assert_eq!(removed.len(), 5);
    assert!(removed.iter().all(|r| r.next_due.is_none()));
    assert!(before >= 2);
}
