//! What the soak's clients do, and what they record: sessions driven turn
//! after turn (each turn a changing call that appends a token of its own
//! to `marker.txt`, sometimes a second one to `second.txt`, and a
//! read-only call; the default policy has a person approve each changing
//! call; now and then a sub-agent's task), reminders and recurring
//! reminders scheduled, forks and rewinds; a scripted person answers approvals after a random delay.
//! Every acknowledged request is recorded for the checker.

use super::Rng;
use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_proto::scheduler::v1 as schpb;
use agentry_proto::scheduler::v1::scheduler_client::SchedulerClient;
use agentry_proto::sessions::v1 as spb;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_testkit::cluster::Channel;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;

/// The file each changing call appends its token to.
pub const MARKER: &str = "marker.txt";
/// The file a turn's second changing call appends its token to.
pub const SECOND: &str = "second.txt";

/// The sub-agent a turn now and then hands a task to.
pub const READER: &str = "reader";

/// How long a client waits for an answer to one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a client waits for its turn to finish before going on.
const TURN_WAIT: Duration = Duration::from_secs(90);

/// What the clients were told was done.
#[derive(Default, Debug)]
pub struct Records {
    /// Sessions created by the clients.
    pub sessions: BTreeSet<String>,
    /// (session, turn id) of every acknowledged message.
    pub turns: Vec<(String, String)>,
    /// (session, call id, decision) of every acknowledged answer.
    pub answers: Vec<(String, String, i32)>,
    /// Reminder id → (session, recurring) of every acknowledged reminder.
    pub reminders: BTreeMap<String, (String, bool)>,
    /// Forks made: (from, new session).
    pub forks: Vec<(String, String)>,
    /// Sessions rewound (their files went back: tokens may be gone).
    pub rewound: BTreeSet<String>,
    /// Sessions working in a project directory, and which (two sessions
    /// share each: their changing calls take turns on its lock).
    pub projects: BTreeMap<String, std::path::PathBuf>,
    /// When the latest one-shot reminder falls due.
    pub latest_due: Option<std::time::Instant>,
    /// Turns a client saw finish.
    pub turns_finished: usize,
    /// Requests that failed (under faults, expected; never checked).
    pub failed_requests: usize,
}

/// The clients' shared record.
#[derive(Default)]
pub struct Ledger(Mutex<Records>);

impl Ledger {
    pub fn with<T>(&self, f: impl FnOnce(&mut Records) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Where the clients send their requests.
pub struct Targets {
    /// Each orchestrator (a session sticks to one).
    pub orchestrators: Vec<Channel>,
    pub scheduler: Channel,
    /// The session store, with the services' token (the person reads a
    /// question's details from the log).
    pub store: Channel,
    /// Project directories some sessions work in (none: scratch
    /// workspaces only).
    pub projects: Vec<std::path::PathBuf>,
}

/// A message whose calls the directed model makes, in order.
fn script(lines: &[String]) -> String {
    lines.join("\n")
}

fn bash(command: &str) -> String {
    format!("call bash {}", serde_json::json!({ "command": command }))
}

fn read(path: &str) -> String {
    format!("call read_file {}", serde_json::json!({ "path": path }))
}

async fn within<T>(
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Option<T> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(Ok(response)) => Some(response.into_inner()),
        _ => None,
    }
}

/// Drives session `index` until `stop` turns true.
pub async fn drive_session(
    targets: std::sync::Arc<Targets>,
    ledger: std::sync::Arc<Ledger>,
    index: usize,
    seed: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = Rng::new(seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let channel = targets.orchestrators[index % targets.orchestrators.len()].clone();
    let mut client = OrchestratorClient::new(channel);
    let mut scheduler = SchedulerClient::new(targets.scheduler.clone());
    let session = format!("chaos-{index}");
    // Every tenth session works in a project directory it shares.
    let project = (index % 10 == 3 && !targets.projects.is_empty())
        .then(|| targets.projects[(index / 10) % targets.projects.len()].clone());
    // Created once: a retry after a lost answer finds it there.
    loop {
        if *stop.borrow() {
            return;
        }
        let created = tokio::time::timeout(
            REQUEST_TIMEOUT,
            client.create_session(opb::CreateSessionRequest {
                session_id: session.clone(),
                title: format!("soak {index}"),
                project_dir: project
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            }),
        )
        .await;
        match created {
            Ok(Ok(_)) => break,
            Ok(Err(status)) if status.code() == tonic::Code::AlreadyExists => break,
            _ => {
                ledger.with(|r| r.failed_requests += 1);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    ledger.with(|r| {
        r.sessions.insert(session.clone());
        if let Some(project) = &project {
            r.projects.insert(session.clone(), project.clone());
        }
    });
    if index.is_multiple_of(25) {
        // A recurring reminder (read-only: each firing reads the marker).
        let request = schpb::CreateReminderRequest {
            session_id: session.clone(),
            due: String::new(),
            message: script(&["recurring check".into(), read(MARKER)]),
            kind: spb::ReminderKind::Task as i32,
            recurrence: Some(schpb::Recurrence {
                cron: "* * * * *".into(),
                time_zone: "UTC".into(),
                missed: 0,
            }),
            task: None,
        };
        if let Some(reminder) = within(scheduler.create_reminder(request)).await {
            ledger.with(|r| r.reminders.insert(reminder.id, (session.clone(), true)));
        }
    }
    let mut next_seq = 1;
    let mut turn = 0u32;
    while !*stop.borrow() {
        turn += 1;
        let token = format!("s{index}t{turn}");
        let mut lines = vec![
            format!("soak turn {turn}"),
            bash(&format!("echo {token} >> {MARKER}")),
        ];
        if rng.chance(0.3) {
            lines.push(bash(&format!("echo {token}a >> {SECOND}")));
        }
        if rng.chance(0.1) {
            // A sub-agent's task: its own session reads the marker.
            lines.push(format!(
                "call delegate {}",
                serde_json::json!({ "agent": READER, "task": script(&["read it".into(), read(MARKER)]) })
            ));
        }
        lines.push(read(MARKER));
        let submitted = within(client.submit(opb::SubmitRequest {
            session_id: session.clone(),
            input: Some(opb::Input {
                kind: Some(opb::input::Kind::UserMessage(opb::UserInput {
                    text: script(&lines),
                    approval_mode: spb::ApprovalMode::Policy as i32,
                    ..Default::default()
                })),
            }),
        }))
        .await;
        let Some(submitted) = submitted else {
            ledger.with(|r| r.failed_requests += 1);
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        ledger.with(|r| r.turns.push((session.clone(), submitted.turn_id.clone())));
        if wait_turn(
            &mut client,
            &session,
            &submitted.turn_id,
            &mut next_seq,
            &mut stop,
        )
        .await
        {
            ledger.with(|r| r.turns_finished += 1);
        }
        // Now and then: a reminder, a fork, a rewind.
        let roll = rng.below(100);
        if roll < 15 {
            let wait = 5 + rng.below(15);
            let due = chrono::Utc::now() + chrono::Duration::seconds(wait as i64);
            let due_at = std::time::Instant::now() + Duration::from_secs(wait);
            let request = schpb::CreateReminderRequest {
                session_id: session.clone(),
                due: due.to_rfc3339(),
                message: script(&[
                    "reminder".into(),
                    bash(&format!("echo {token}r >> {MARKER}")),
                ]),
                kind: spb::ReminderKind::Task as i32,
                recurrence: None,
                task: None,
            };
            if let Some(reminder) = within(scheduler.create_reminder(request)).await {
                ledger.with(|r| {
                    r.reminders.insert(reminder.id, (session.clone(), false));
                    r.latest_due = r.latest_due.max(Some(due_at));
                });
            } else {
                ledger.with(|r| r.failed_requests += 1);
            }
        } else if roll < 20 {
            let new = format!("{session}-fork{turn}");
            let forked = within(client.fork_session(opb::ForkSessionRequest {
                session_id: session.clone(),
                at_seq: 0,
                new_session_id: new.clone(),
                conversation_only: false,
                dir: String::new(),
            }))
            .await;
            if forked.is_some() {
                ledger.with(|r| r.forks.push((session.clone(), new)));
            }
        } else if roll < 24 && turn > 2 && project.is_none() {
            // (A project's files are shared: a rewind would take the
            // other session's changes back too.)
            let rewound = within(client.rewind_session(opb::RewindSessionRequest {
                session_id: session.clone(),
                to_turn: turn / 2,
                conversation_only: false,
            }))
            .await;
            // Even a rewind whose answer was lost may have happened.
            ledger.with(|r| r.rewound.insert(session.clone()));
            if rewound.is_none() {
                ledger.with(|r| r.failed_requests += 1);
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(500))).await;
    }
}

/// Follows `session`'s events until `turn` finishes (true), the wait runs
/// out or the soak stops (false); reconnects when the stream breaks.
async fn wait_turn(
    client: &mut OrchestratorClient<Channel>,
    session: &str,
    turn: &str,
    next_seq: &mut u64,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let deadline = tokio::time::Instant::now() + TURN_WAIT;
    while tokio::time::Instant::now() < deadline && !*stop.borrow() {
        let subscribed = tokio::time::timeout(
            REQUEST_TIMEOUT,
            client.subscribe(opb::SubscribeRequest {
                session_id: session.to_string(),
                from_seq: *next_seq,
                live_only: false,
            }),
        )
        .await;
        let Ok(Ok(stream)) = subscribed else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        let mut stream = stream.into_inner();
        loop {
            let next = tokio::select! {
                next = stream.message() => next,
                _ = tokio::time::sleep_until(deadline) => return false,
                _ = stop.changed() => return false,
            };
            match next {
                Ok(Some(event)) => {
                    if event.live {
                        continue;
                    }
                    *next_seq = event.seq + 1;
                    if event.turn_id == turn
                        && matches!(event.kind, Some(spb::event::Kind::TurnFinished(_)))
                    {
                        return true;
                    }
                }
                _ => break,
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// The scripted person: answers every waiting approval after a random
/// delay (approve; a call whose outcome is unknown after a restart:
/// "check", never "run again"), until `stop`.
pub async fn person(
    targets: std::sync::Arc<Targets>,
    ledger: std::sync::Arc<Ledger>,
    seed: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = Rng::new(seed ^ 0x5eed_0fa9);
    let mut store = SessionStoreClient::new(targets.store.clone());
    // Answers acknowledged or being given: (session, call, outcome unknown).
    let answered: std::sync::Arc<Mutex<BTreeSet<(String, String, bool)>>> = Default::default();
    let mut next = 0usize;
    while !*stop.borrow() {
        let channel = targets.orchestrators[next % targets.orchestrators.len()].clone();
        next += 1;
        let mut client = OrchestratorClient::new(channel.clone());
        let waiting = within(client.list_approvals(opb::ListApprovalsRequest { sessions: 2000 }))
            .await
            .map(|r| r.approvals)
            .unwrap_or_default();
        for approval in waiting {
            if approval.question.is_some() {
                continue;
            }
            let Some(unknown) =
                outcome_unknown(&mut store, &approval.session_id, &approval.call_id).await
            else {
                continue;
            };
            let key = (
                approval.session_id.clone(),
                approval.call_id.clone(),
                unknown,
            );
            if !answered
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.clone())
            {
                continue;
            }
            let decision = if unknown {
                spb::ApprovalDecision::Check
            } else {
                spb::ApprovalDecision::Approve
            } as i32;
            let delay = Duration::from_millis(rng.below(3000));
            let (ledger, answered, mut client) = (
                ledger.clone(),
                answered.clone(),
                OrchestratorClient::new(channel.clone()),
            );
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let given = within(client.submit(opb::SubmitRequest {
                    session_id: approval.session_id.clone(),
                    input: Some(opb::Input {
                        kind: Some(opb::input::Kind::Approval(opb::ApprovalInput {
                            call_id: approval.call_id.clone(),
                            decision,
                            reason: String::new(),
                            edited_arguments_json: String::new(),
                        })),
                    }),
                }))
                .await;
                if given.is_some() {
                    ledger.with(|r| {
                        r.answers
                            .push((approval.session_id, approval.call_id, decision))
                    });
                } else {
                    // Asked again at the next look.
                    answered
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&key);
                    ledger.with(|r| r.failed_requests += 1);
                }
            });
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(700)) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Whether the latest question about `call` in `session`'s log is about a
/// call whose outcome is unknown (`None`: the log cannot be read now).
async fn outcome_unknown(
    store: &mut SessionStoreClient<Channel>,
    session: &str,
    call: &str,
) -> Option<bool> {
    let events = read_all(store, session).await.ok()?;
    events.iter().rev().find_map(|e| match &e.kind {
        Some(spb::event::Kind::ApprovalRequested(a)) if a.call_id == call => {
            Some(a.outcome_unknown)
        }
        _ => None,
    })
}

/// Every stored event of `session`, in order.
pub async fn read_all(
    store: &mut SessionStoreClient<Channel>,
    session: &str,
) -> Result<Vec<spb::Event>, tonic::Status> {
    let mut events = Vec::new();
    let mut from = 1;
    loop {
        let page = tokio::time::timeout(
            REQUEST_TIMEOUT,
            store.read(spb::ReadRequest {
                session_id: session.to_string(),
                from_seq: from,
                limit: 1000,
                ..Default::default()
            }),
        )
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("the store did not answer"))??
        .into_inner()
        .events;
        let Some(last) = page.last() else {
            return Ok(events);
        };
        from = last.seq + 1;
        let short = page.len() < 1000;
        events.extend(page);
        if short {
            return Ok(events);
        }
    }
}
