//! The checker: once the faults stop, reads every session's log, the
//! workspaces' marker files and the clients' records, and lists every
//! broken promise: an acknowledged request missing, a gap or duplicate in
//! a log, an event that does not decode, a turn neither finished nor
//! visibly waiting, a changing call run twice, an approval applied twice,
//! a reminder fired twice or not at all, a session that does not answer a
//! new turn, a process left behind.

use super::workload::{Ledger, MARKER, Records, SECOND, read_all};
use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_proto::sessions::v1 as spb;
use agentry_proto::sessions::v1::event::Kind as Ev;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_testkit::cluster::Channel;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

/// A broken promise.
#[derive(Debug, Clone)]
pub struct Violation {
    /// What kind (`gap`, `ran-twice`, `stuck-turn`, …).
    pub kind: &'static str,
    pub detail: String,
}

fn violation(kind: &'static str, detail: String) -> Violation {
    Violation { kind, detail }
}

/// Every stored session and its log.
pub async fn logs(
    store: &mut SessionStoreClient<Channel>,
) -> anyhow::Result<BTreeMap<String, Vec<spb::Event>>> {
    let mut ids = Vec::new();
    loop {
        let page = store
            .list_sessions(spb::ListSessionsRequest {
                limit: 500,
                offset: ids.len() as u32,
                only_open_turns: false,
            })
            .await?
            .into_inner();
        let n = page.sessions.len();
        ids.extend(page.sessions.into_iter().map(|s| s.id));
        if n < 500 {
            break;
        }
    }
    let mut out = BTreeMap::new();
    for id in ids {
        let events = read_all(store, &id).await?;
        out.insert(id, events);
    }
    Ok(out)
}

/// Turns of a log that neither finished nor wait visibly for a person
/// (a question unanswered, or parked at a limit).
fn open_turns(events: &[spb::Event]) -> Vec<String> {
    let mut open: BTreeMap<&str, bool> = BTreeMap::new();
    let mut asked: BTreeMap<&str, &str> = BTreeMap::new();
    for e in events {
        if e.turn_id.is_empty() || e.live {
            continue;
        }
        match &e.kind {
            Some(Ev::TurnFinished(_)) => {
                open.remove(e.turn_id.as_str());
                continue;
            }
            Some(Ev::ApprovalRequested(a)) => {
                asked.insert(a.call_id.as_str(), e.turn_id.as_str());
            }
            Some(Ev::ApprovalDecided(d)) if d.approvals_missing == 0 => {
                asked.remove(d.call_id.as_str());
            }
            _ => {}
        }
        open.entry(e.turn_id.as_str()).or_insert(true);
    }
    let waiting: BTreeSet<&str> = asked.values().copied().collect();
    let parked = events.iter().rev().find_map(|e| match &e.kind {
        Some(Ev::TurnParked(_)) => Some(e.turn_id.as_str()),
        Some(Ev::TurnResumed(_)) | Some(Ev::TurnFinished(_)) => Some(""),
        _ => None,
    });
    open.keys()
        .filter(|t| !waiting.contains(*t) && parked != Some(**t))
        .map(|t| t.to_string())
        .collect()
}

/// How long a session's log must stay still for an open turn to count as
/// stuck rather than progressing.
const STILL: Duration = Duration::from_secs(10);
/// How much longer than the limit a progressing turn is watched.
const PROGRESSING: Duration = Duration::from_secs(60);

/// Waits until no turn is open anywhere (a person keeps answering), at
/// most `limit`; the open turns left. A turn still open at `limit` whose
/// session's log grew in the last 10 s is progressing (a person answering
/// one call after another) rather than stuck: it is watched a minute more.
pub async fn quiesce(
    store: &mut SessionStoreClient<Channel>,
    limit: Duration,
) -> anyhow::Result<Vec<(String, String)>> {
    let started = Instant::now();
    let mut grew_at: BTreeMap<String, (usize, Instant)> = BTreeMap::new();
    loop {
        let logs = logs(store).await;
        let now = Instant::now();
        let open: Vec<(String, String)> = match &logs {
            Ok(logs) => {
                for (session, events) in logs {
                    let seen = grew_at
                        .entry(session.clone())
                        .or_insert((events.len(), now));
                    if seen.0 != events.len() {
                        *seen = (events.len(), now);
                    }
                }
                logs.iter()
                    .flat_map(|(s, events)| open_turns(events).into_iter().map(|t| (s.clone(), t)))
                    .collect()
            }
            Err(_) => vec![("?".into(), "the store does not answer".into())],
        };
        if open.is_empty() || now >= started + limit + PROGRESSING {
            return Ok(open);
        }
        if now >= started + limit {
            let progressing = open.iter().any(|(session, _)| {
                grew_at
                    .get(session)
                    .is_some_and(|(_, at)| now.duration_since(*at) < STILL)
            });
            if !progressing {
                return Ok(open);
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The tokens a marker file holds, each with how often.
fn tokens(path: &Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        *counts.entry(line.trim().to_string()).or_insert(0) += 1;
    }
    counts
}

/// The token a changing call of the soak appends, and to which file.
fn token_of(arguments: &str) -> Option<(String, &'static str)> {
    let value: serde_json::Value = serde_json::from_str(arguments).ok()?;
    let command = value.get("command")?.as_str()?;
    let (echo, file) = command.split_once(" >> ")?;
    let token = echo.strip_prefix("echo ")?.to_string();
    let file = match file {
        MARKER => MARKER,
        SECOND => SECOND,
        _ => return None,
    };
    Some((token, file))
}

/// The firings each reminder delivered, by reminder id, from the logs (a
/// fork's copy of its parent's history not counted).
pub fn firings(logs: &BTreeMap<String, Vec<spb::Event>>) -> BTreeMap<String, Vec<String>> {
    let mut fired: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for events in logs.values() {
        // A fork's log starts with a copy of its parent's: reminders fired
        // there are the parent's.
        let own_from = events
            .iter()
            .position(|e| matches!(e.kind, Some(Ev::SessionForked(_))))
            .unwrap_or(0);
        for e in &events[own_from..] {
            if let Some(Ev::ReminderDue(r)) = &e.kind {
                fired
                    .entry(r.reminder_id.clone())
                    .or_default()
                    .push(r.firing_id.clone());
            }
        }
    }
    fired
}

/// One-shot reminders acknowledged to the clients that no log holds yet.
pub fn reminders_waiting(logs: &BTreeMap<String, Vec<spb::Event>>, records: &Records) -> usize {
    let fired = firings(logs);
    records
        .reminders
        .iter()
        .filter(|(id, (_, recurring))| !recurring && !fired.contains_key(*id))
        .count()
}

/// Checks the logs and the workspaces against the records.
pub fn check(
    logs: &BTreeMap<String, Vec<spb::Event>>,
    records: &Records,
    workspaces: &Path,
    recurring_minutes: u64,
) -> Vec<Violation> {
    let mut found = Vec::new();
    let fired = firings(logs);
    let forks: BTreeSet<&str> = records.forks.iter().map(|(_, f)| f.as_str()).collect();
    for (session, events) in logs {
        // Every seq once, from 1, in order; every event decodes.
        for (i, e) in events.iter().enumerate() {
            let expected = i as u64 + 1;
            if e.seq != expected {
                found.push(violation(
                    "gap-or-duplicate",
                    format!(
                        "{session}: event {i} has seq {} (expected {expected})",
                        e.seq
                    ),
                ));
                break;
            }
            if e.kind.is_none() {
                found.push(violation(
                    "undecodable",
                    format!("{session}: seq {} has no kind this build knows", e.seq),
                ));
            }
        }
        let turns: BTreeSet<&str> = events.iter().map(|e| e.turn_id.as_str()).collect();
        for (s, turn) in records.turns.iter().filter(|(s, _)| s == session) {
            if !turns.contains(turn.as_str()) {
                found.push(violation(
                    "lost-message",
                    format!("{s}: acknowledged turn {turn} is not in the log"),
                ));
            }
        }
        // Approvals: each acknowledged answer stored, none applied twice.
        let mut approved: BTreeMap<&str, usize> = BTreeMap::new();
        let mut decided: BTreeSet<&str> = BTreeSet::new();
        for e in events {
            if let Some(Ev::ApprovalDecided(d)) = &e.kind {
                decided.insert(d.call_id.as_str());
                if d.decision == spb::ApprovalDecision::Approve as i32 {
                    *approved.entry(d.call_id.as_str()).or_insert(0) += 1;
                }
            }
        }
        for (call, n) in approved.iter().filter(|(_, n)| **n > 1) {
            found.push(violation(
                "approval-twice",
                format!("{session}: call {call} was approved {n} times"),
            ));
        }
        for (s, call, _) in records.answers.iter().filter(|(s, _, _)| s == session) {
            if !decided.contains(call.as_str()) {
                found.push(violation(
                    "lost-approval",
                    format!("{s}: the acknowledged answer for call {call} is not in the log"),
                ));
            }
        }
        // Changing calls: no token twice; a call that succeeded left its
        // token (unless the session's files were put back).
        let dir = records
            .projects
            .get(session)
            .cloned()
            .unwrap_or_else(|| workspaces.join(session));
        let mut on_disk = BTreeMap::new();
        for file in [MARKER, SECOND] {
            for (token, n) in tokens(&dir.join(file)) {
                if n > 1 {
                    found.push(violation(
                        "ran-twice",
                        format!("{session}: {token} is {n} times in {file}"),
                    ));
                }
                on_disk.insert((token, file), n);
            }
        }
        // A rewind takes changes back, and a fork starts from its parent's
        // files at the fork point: their tokens may rightly be gone. The log
        // says so even when the client never heard the answer (a fork or a
        // rewind whose reply a fault cut, or a fork of a rewound session).
        let rewound_or_forked = records.rewound.contains(session)
            || forks.contains(session.as_str())
            || events.iter().any(|e| {
                matches!(
                    e.kind,
                    Some(Ev::SessionRewound(_)) | Some(Ev::SessionForked(_))
                )
            });
        if !rewound_or_forked {
            let mut calls = BTreeMap::new();
            for e in events {
                match &e.kind {
                    Some(Ev::ToolCallRequested(c)) if c.tool == "bash" => {
                        calls.insert(c.call_id.as_str(), c.arguments_json.as_str());
                    }
                    Some(Ev::ToolResult(r)) if !r.is_error => {
                        if let Some((token, file)) =
                            calls.get(r.call_id.as_str()).and_then(|a| token_of(a))
                            && !on_disk.contains_key(&(token.clone(), file))
                        {
                            found.push(violation(
                                "lost-change",
                                format!(
                                    "{session}: call {} succeeded, {token} is not in {file}",
                                    r.call_id
                                ),
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    for (from, fork) in &records.forks {
        if !logs.contains_key(fork) {
            found.push(violation(
                "lost-fork",
                format!("{from}: the acknowledged fork {fork} is not stored"),
            ));
        }
    }
    // Reminders: each firing once; a one-shot reminder fired exactly once.
    for (reminder, firings) in &fired {
        let distinct: BTreeSet<&String> = firings.iter().collect();
        if distinct.len() != firings.len() {
            found.push(violation(
                "reminder-twice",
                format!("reminder {reminder}: a firing delivered twice ({firings:?})"),
            ));
        }
    }
    for (reminder, (session, recurring)) in &records.reminders {
        let n = fired.get(reminder).map_or(0, Vec::len);
        if !recurring && n != 1 {
            found.push(violation(
                "reminder-count",
                format!("{session}: one-shot reminder {reminder} fired {n} times"),
            ));
        }
        // (Minutes a scheduler's clock jumped over or back are not all
        // fired: only a recurring reminder that never fired is lost.)
        if *recurring && n == 0 && recurring_minutes > 1 {
            found.push(violation(
                "reminder-count",
                format!(
                    "{session}: recurring reminder {reminder} never fired in {recurring_minutes} minutes"
                ),
            ));
        }
    }
    found
}

/// How many sessions are asked at once: the check is whether each
/// session answers, not how the fleet bears hundreds of turns started in
/// the same instant.
const ASKED_AT_ONCE: usize = 8;

/// Sends every session a new turn, a few sessions at a time; those that do
/// not finish it within `limit` of their input.
pub async fn answers_new_turns(
    orchestrators: &[Channel],
    sessions: &[String],
    limit: Duration,
) -> Vec<Violation> {
    use futures::StreamExt;
    let asked = sessions.iter().enumerate().map(|(i, session)| {
        let client = OrchestratorClient::new(orchestrators[i % orchestrators.len()].clone());
        answers_new_turn(client, session.clone(), limit)
    });
    futures::stream::iter(asked)
        .buffer_unordered(ASKED_AT_ONCE)
        .filter_map(|v| async move { v })
        .collect()
        .await
}

async fn answers_new_turn(
    mut client: OrchestratorClient<Channel>,
    session: String,
    limit: Duration,
) -> Option<Violation> {
    let started = Instant::now();
    let outcome = tokio::time::timeout(limit, async {
        let submitted = client
            .submit(opb::SubmitRequest {
                session_id: session.clone(),
                input: Some(opb::Input {
                    kind: Some(opb::input::Kind::UserMessage(opb::UserInput {
                        text: "are you there?".into(),
                        approval_mode: spb::ApprovalMode::Policy as i32,
                        ..Default::default()
                    })),
                }),
            })
            .await?
            .into_inner();
        // From the input on: the rest of the log is not the question.
        let mut stream = client
            .subscribe(opb::SubscribeRequest {
                session_id: session.clone(),
                from_seq: submitted.seq,
                live_only: false,
            })
            .await?
            .into_inner();
        while let Some(event) = stream.message().await? {
            if event.turn_id == submitted.turn_id && matches!(event.kind, Some(Ev::TurnFinished(_)))
            {
                return Ok::<_, tonic::Status>(());
            }
        }
        Err(tonic::Status::unavailable("the stream ended"))
    })
    .await;
    match outcome {
        Ok(Ok(())) => None,
        Ok(Err(status)) => Some(violation(
            "no-answer",
            format!("{session}: a new turn failed: {}", status.message()),
        )),
        Err(_) => Some(violation(
            "no-answer",
            format!(
                "{session}: a new turn did not finish within {:?}",
                started.elapsed()
            ),
        )),
    }
}

/// Processes still working in the fleet's data directory after every
/// service stopped (a sandboxed command left behind).
pub fn leftovers(data: &Path) -> Vec<Violation> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(cwd) = std::fs::read_link(entry.path().join("cwd"))
            && cwd.starts_with(data)
        {
            let command = std::fs::read_to_string(entry.path().join("cmdline"))
                .unwrap_or_default()
                .replace('\0', " ");
            found.push(violation(
                "left-behind",
                format!(
                    "process {pid} ({}) still runs in {}",
                    command.trim(),
                    cwd.display()
                ),
            ));
        }
    }
    found
}

/// Project locks still held when no call runs (each a `.lock-…` file
/// under the workspace root's `.projects`, held with flock while a
/// changing call runs).
pub fn held_locks(workspaces: &Path) -> Vec<Violation> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(workspaces.join(".projects")) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_lock = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(".lock-"));
        let Ok(file) = std::fs::File::open(&path) else {
            continue;
        };
        if is_lock
            && nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err()
        {
            found.push(violation(
                "lock-held",
                format!("{} is still held with no call running", path.display()),
            ));
        }
    }
    found
}

/// The ledger's records, copied.
pub fn records(ledger: &Ledger) -> Records {
    ledger.with(|r| Records {
        sessions: r.sessions.clone(),
        turns: r.turns.clone(),
        answers: r.answers.clone(),
        reminders: r.reminders.clone(),
        forks: r.forks.clone(),
        rewound: r.rewound.clone(),
        projects: r.projects.clone(),
        latest_due: r.latest_due,
        turns_finished: r.turns_finished,
        failed_requests: r.failed_requests,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn event(seq: u64, turn: &str, kind: Ev) -> spb::Event {
        spb::Event {
            session_id: "s".into(),
            seq,
            turn_id: turn.into(),
            kind: Some(kind),
            ..Default::default()
        }
    }

    fn bash_call(call: &str, token: &str) -> Ev {
        Ev::ToolCallRequested(spb::ToolCallRequested {
            call_id: call.into(),
            tool: "bash".into(),
            arguments_json: serde_json::json!({"command": format!("echo {token} >> {MARKER}")})
                .to_string(),
            ..Default::default()
        })
    }

    fn result(call: &str) -> Ev {
        Ev::ToolResult(spb::ToolResult {
            call_id: call.into(),
            tool: "bash".into(),
            ..Default::default()
        })
    }

    fn finished() -> Ev {
        Ev::TurnFinished(spb::TurnFinished::default())
    }

    fn kinds(found: &[Violation]) -> Vec<&'static str> {
        found.iter().map(|v| v.kind).collect()
    }

    /// A session whose workspace holds `marker`, its log `events`.
    fn run(events: Vec<spb::Event>, marker: &str, records: &Records) -> Vec<Violation> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("s")).unwrap();
        std::fs::write(dir.path().join("s").join(MARKER), marker).unwrap();
        let logs = BTreeMap::from([("s".to_string(), events)]);
        check(&logs, records, dir.path(), 1)
    }

    #[test]
    fn a_clean_session_passes() {
        let events = vec![
            event(1, "t1", Ev::UserMessage(Default::default())),
            event(2, "t1", bash_call("c1", "a1")),
            event(3, "t1", result("c1")),
            event(4, "t1", finished()),
        ];
        let records = Records {
            turns: vec![("s".into(), "t1".into())],
            ..Default::default()
        };
        assert!(run(events.clone(), "a1\n", &records).is_empty());
        assert!(open_turns(&events).is_empty());
    }

    #[test]
    fn broken_promises_are_each_found() {
        let events = vec![
            event(1, "t1", Ev::UserMessage(Default::default())),
            event(2, "t1", bash_call("c1", "a1")),
            event(2, "t1", result("c1")),
            event(4, "t1", bash_call("c2", "a2")),
            event(5, "t1", result("c2")),
            event(
                6,
                "t1",
                Ev::ReminderDue(spb::ReminderDue {
                    reminder_id: "r1".into(),
                    firing_id: "r1@1".into(),
                    ..Default::default()
                }),
            ),
            event(
                7,
                "t1",
                Ev::ReminderDue(spb::ReminderDue {
                    reminder_id: "r1".into(),
                    firing_id: "r1@1".into(),
                    ..Default::default()
                }),
            ),
        ];
        let records = Records {
            turns: vec![("s".into(), "t1".into()), ("s".into(), "lost".into())],
            answers: vec![("s".into(), "c9".into(), 1)],
            reminders: BTreeMap::from([("r1".to_string(), ("s".to_string(), false))]),
            forks: vec![("s".into(), "s-fork1".into())],
            ..Default::default()
        };
        // a1 ran twice; a2 succeeded but is not in the file.
        let found = run(events.clone(), "a1\na1\n", &records);
        let mut got = kinds(&found);
        got.sort();
        assert_eq!(
            got,
            [
                "gap-or-duplicate",
                "lost-approval",
                "lost-change",
                "lost-fork",
                "lost-message",
                "ran-twice",
                "reminder-count",
                "reminder-twice",
            ],
            "{found:?}"
        );
        // The turn never finished, and nothing waits for a person.
        assert_eq!(open_turns(&events), ["t1"]);
    }

    #[test]
    fn a_turn_waiting_for_a_person_is_not_stuck() {
        let asked = Ev::ApprovalRequested(spb::ApprovalRequested {
            call_id: "c1".into(),
            ..Default::default()
        });
        let mut events = vec![
            event(1, "t1", Ev::UserMessage(Default::default())),
            event(2, "t1", bash_call("c1", "a1")),
            event(3, "t1", asked),
        ];
        assert!(open_turns(&events).is_empty());
        events.push(event(
            4,
            "t1",
            Ev::ApprovalDecided(spb::ApprovalDecided {
                call_id: "c1".into(),
                decision: spb::ApprovalDecision::Approve as i32,
                ..Default::default()
            }),
        ));
        assert_eq!(open_turns(&events), ["t1"]);
    }

    #[test]
    fn a_fork_s_copied_firings_are_its_parent_s() {
        let due = |seq| {
            event(
                seq,
                "t1",
                Ev::ReminderDue(spb::ReminderDue {
                    reminder_id: "r1".into(),
                    firing_id: "r1@1".into(),
                    ..Default::default()
                }),
            )
        };
        let parent = vec![due(1)];
        let fork = vec![
            due(1),
            event(2, "t1", Ev::SessionForked(Default::default())),
        ];
        let logs = BTreeMap::from([("p".to_string(), parent), ("p-fork".to_string(), fork)]);
        let records = Records {
            reminders: BTreeMap::from([("r1".to_string(), ("p".to_string(), false))]),
            ..Default::default()
        };
        let dir = tempfile::tempdir().unwrap();
        assert!(check(&logs, &records, dir.path(), 1).is_empty());
        assert_eq!(firings(&logs)["r1"], ["r1@1"]);
        assert_eq!(reminders_waiting(&logs, &records), 0);
        // A fork nobody heard about (its answer lost) whose parent was
        // rewound: the calls taken back are not lost changes.
        let unheard = BTreeMap::from([(
            "q-fork".to_string(),
            vec![
                event(1, "t1", bash_call("c1", "tok1")),
                event(2, "t1", result("c1")),
                event(3, "t1", finished()),
                event(4, "", Ev::SessionRewound(Default::default())),
                event(5, "", Ev::SessionForked(Default::default())),
            ],
        )]);
        assert!(check(&unheard, &Records::default(), dir.path(), 1).is_empty());
        let mut plain = unheard.clone();
        plain.get_mut("q-fork").unwrap().truncate(3);
        assert_eq!(
            kinds(&check(&plain, &Records::default(), dir.path(), 1)),
            ["lost-change"]
        );
        // A reminder only a fork's copy holds is still on its way.
        let copied_only = BTreeMap::from([("p-fork".to_string(), logs["p-fork"].clone())]);
        assert_eq!(reminders_waiting(&copied_only, &records), 1);
    }
}
