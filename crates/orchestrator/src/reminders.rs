//! Consuming due reminders from the scheduler: each firing is delivered
//! into its session as a `reminder_due` event and acknowledged only once it
//! is durably in the log (or already was). Unacknowledged firings come back,
//! so delivery is at-least-once; the session's record of delivered firing
//! ids makes it exactly-once in the log.

use crate::reducer::Input;
use crate::service::Sessions;
use agentry_proto::scheduler::v1 as spb;
use agentry_proto::sessions::v1 as pb;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// A scheduled task's run starts in a session made for it: its id comes
/// from the firing, so a firing delivered again finds the same session.
pub fn run_session_id(firing_id: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("scheduled run\n{firing_id}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// Turns a firing into the session event's payload.
pub fn event_of(due: &spb::DueReminder) -> Option<(String, pb::ReminderDue)> {
    let reminder = due.reminder.as_ref()?;
    Some((
        reminder.session_id.clone(),
        pb::ReminderDue {
            reminder_id: reminder.id.clone(),
            firing_id: due.firing_id.clone(),
            message: reminder.message.clone(),
            legacy_kind: String::new(),
            kind: reminder.kind,
            due_time: due.due_time,
            late_ms: due.late_ms,
            scheduled: reminder.task.is_some(),
            approval_mode: reminder.task.as_ref().map_or(0, |t| t.approval_mode),
        },
    ))
}

/// Receives due reminders for as long as the orchestrator runs,
/// reconnecting with backoff whenever the scheduler goes away.
pub async fn consume(service: Sessions) {
    let mut delay = Duration::from_millis(200);
    loop {
        match consume_once(&service).await {
            Ok(()) => delay = Duration::from_millis(200),
            Err(status) => {
                tracing::debug!(error = %status.message(), "reminder stream unavailable; retrying");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

async fn consume_once(service: &Sessions) -> Result<(), tonic::Status> {
    let (tx, rx) = mpsc::channel(256);
    let subscribe = spb::StreamDueRequest {
        kind: Some(spb::stream_due_request::Kind::Subscribe(spb::Subscribe {
            consumer: "orchestrator".into(),
        })),
    };
    let _ = tx.send(subscribe).await;
    let mut due = service
        .deps()
        .scheduler
        .clone()
        .stream_due(ReceiverStream::new(rx))
        .await?
        .into_inner();
    tracing::info!("receiving due reminders from the scheduler");
    while let Some(firing) = due.message().await? {
        if firing.reminder.as_ref().is_some_and(|r| r.task.is_some()) {
            if run_scheduled(service, &firing).await {
                let ack = spb::StreamDueRequest {
                    kind: Some(spb::stream_due_request::Kind::Ack(spb::Ack {
                        firing_id: firing.firing_id.clone(),
                    })),
                };
                if tx.send(ack).await.is_err() {
                    break;
                }
            }
            continue;
        }
        let Some((session_id, event)) = event_of(&firing) else {
            continue;
        };
        let delivered = service
            .submit_input(
                &session_id,
                Input::ReminderDue {
                    turn_id: crate::service::new_turn_id(),
                    reminder: event,
                },
            )
            .await;
        let ack = match delivered {
            Ok(_) => true,
            // The session is gone: nothing to deliver into, ever.
            Err(status) if status.code() == tonic::Code::NotFound => true,
            // Busy with a turn (task reminders wait) or the store is down:
            // leave it unacknowledged; the scheduler sends it again.
            Err(status) => {
                tracing::debug!(firing_id = %firing.firing_id, error = %status.message(), "reminder not delivered yet");
                false
            }
        };
        if ack {
            let ack = spb::StreamDueRequest {
                kind: Some(spb::stream_due_request::Kind::Ack(spb::Ack {
                    firing_id: firing.firing_id.clone(),
                })),
            };
            if tx.send(ack).await.is_err() {
                break;
            }
        }
    }
    Ok(())
}

/// Starts (or skips) one run of a scheduled task and records it with the
/// scheduler. True when the firing is dealt with for good (acknowledge
/// it); false to have it delivered again (the scheduler or the store is
/// away). Delivered again, a firing already recorded is not run twice.
async fn run_scheduled(service: &Sessions, firing: &spb::DueReminder) -> bool {
    let Some(reminder) = firing.reminder.as_ref() else {
        return true;
    };
    let Some(task) = reminder.task.as_ref() else {
        return true;
    };
    let scheduler = service.deps().scheduler.clone();
    let runs = match scheduler
        .clone()
        .list_runs(spb::ListRunsRequest {
            reminder_id: reminder.id.clone(),
            limit: 20,
        })
        .await
    {
        Ok(r) => r.into_inner().runs,
        Err(status) => {
            tracing::debug!(error = %status.message(), "cannot read a scheduled task's runs yet");
            return false;
        }
    };
    let mut run = spb::ScheduledRun {
        firing_id: firing.firing_id.clone(),
        reminder_id: reminder.id.clone(),
        due_time: firing.due_time,
        ..Default::default()
    };
    let Some((session_id, mut event)) = event_of(firing) else {
        return true;
    };
    if let Some(known) = runs.iter().find(|r| r.firing_id == firing.firing_id) {
        // Delivered again: a run that started is handed to its session
        // again (the session keeps each firing once); anything else is done.
        if known.state != spb::RunState::Running as i32 {
            return true;
        }
        return deliver(service, &known.session_id, &known.turn_id, event)
            .await
            .is_ok();
    }
    let deps = service.deps().clone();
    let prompt = reminder.message.clone();
    let record = |run: spb::ScheduledRun| {
        let mut scheduler = scheduler.clone();
        let deps = deps.clone();
        let prompt = prompt.clone();
        async move {
            // A run that could not start is a schedule failure to tell.
            if run.state == spb::RunState::NotStarted as i32 {
                let failed = spb::Notification {
                    id: format!("{}:not-started", run.firing_id),
                    event: "schedule_failed".into(),
                    session_id: run.session_id.clone(),
                    turn_id: String::new(),
                    title: "Agentry: a scheduled task did not start".into(),
                    text: format!("\"{}\": {}", preview(&prompt), run.note),
                    payload_json: serde_json::json!({
                        "schedule_id": run.reminder_id, "firing_id": run.firing_id,
                        "outcome": "not_started", "message": run.note,
                    })
                    .to_string(),
                    time: run.due_time,
                };
                crate::notifications::send(&deps, vec![failed]);
            }
            match scheduler
                .record_run(spb::RecordRunRequest { run: Some(run) })
                .await
            {
                Ok(_) => true,
                Err(status) => {
                    tracing::debug!(error = %status.message(), "cannot record a scheduled run yet");
                    false
                }
            }
        }
    };
    // A run still going (its turn open, maybe waiting for a person) makes
    // this one skip.
    let busy = if session_id.is_empty() {
        runs.iter()
            .find(|r| r.state == spb::RunState::Running as i32)
            .map(|r| {
                format!(
                    "the run due {} is still going (session {})",
                    due_text(r.due_time.as_ref()),
                    r.session_id
                )
            })
    } else {
        match service.get_session(&session_id).await {
            Ok(session) if session.turn_open => Some(format!(
                "session {session_id} was still in a turn when this run was due"
            )),
            Ok(_) => None,
            Err(status) if status.code() == tonic::Code::NotFound => {
                run.state = spb::RunState::NotStarted as i32;
                run.note = format!("its session {session_id} no longer exists");
                return record(run).await;
            }
            Err(_) => return false,
        }
    };
    if let Some(note) = busy {
        tracing::info!(firing_id = %firing.firing_id, %note, "scheduled run skipped");
        run.state = spb::RunState::Skipped as i32;
        run.note = note;
        return record(run).await;
    }
    // Where it runs: the given session, or a new one of its own (as the
    // task's agent, when it names one).
    if !task.agent.is_empty() {
        let why = match service.settings().agents.get(&task.agent) {
            None => Some(format!("no agent named {:?} is configured", task.agent)),
            Some(agent) if agent.def.url.is_some() => Some(format!(
                "the agent {:?} is a remote agent; a scheduled run works as a local one",
                task.agent
            )),
            Some(_) => None,
        };
        if let Some(why) = why {
            run.state = spb::RunState::NotStarted as i32;
            run.note = why;
            return record(run).await;
        }
    }
    let (session_id, from_seq) = if session_id.is_empty() {
        let id = if task.agent.is_empty() {
            run_session_id(&firing.firing_id)
        } else {
            format!(
                "{}{}",
                crate::agents::AGENT_RUN_PREFIX,
                run_session_id(&firing.firing_id)
            )
        };
        let title = format!("scheduled: {}", preview(&reminder.message));
        match service
            .create_session_for_run(&id, title, task.project_dir.clone(), &task.agent)
            .await
        {
            Ok(()) => (id, 1),
            Err(status) if is_retryable(&status) => return false,
            Err(status) => {
                run.state = spb::RunState::NotStarted as i32;
                run.note = format!("its session could not be made: {}", status.message());
                return record(run).await;
            }
        }
    } else {
        match service.get_session(&session_id).await {
            Ok(session) => (session_id, session.event_count + 1),
            Err(_) => return false,
        }
    };
    let turn_id = crate::service::new_turn_id();
    run.session_id = session_id.clone();
    run.turn_id = turn_id.clone();
    run.from_seq = from_seq;
    run.state = spb::RunState::Running as i32;
    if !record(run.clone()).await {
        return false;
    }
    event.late_ms = firing.late_ms;
    match deliver(service, &session_id, &turn_id, event).await {
        Ok(()) => true,
        Err(status) if status.code() == tonic::Code::FailedPrecondition => {
            // A turn began between the check and the run.
            run.state = spb::RunState::Skipped as i32;
            run.note = format!("session {session_id} began a turn when this run was due");
            record(run).await
        }
        Err(status) if status.code() == tonic::Code::NotFound => {
            run.state = spb::RunState::NotStarted as i32;
            run.note = format!("its session {session_id} no longer exists");
            record(run).await
        }
        Err(_) => false,
    }
}

async fn deliver(
    service: &Sessions,
    session_id: &str,
    turn_id: &str,
    event: pb::ReminderDue,
) -> Result<(), tonic::Status> {
    service
        .submit_input(
            session_id,
            Input::ReminderDue {
                turn_id: turn_id.to_string(),
                reminder: event,
            },
        )
        .await
        .map(|_| ())
}

fn is_retryable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Aborted
    )
}

fn due_text(t: Option<&prost_types::Timestamp>) -> String {
    t.and_then(|t| chrono::DateTime::from_timestamp(t.seconds, 0))
        .map(|d| d.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|| "earlier".into())
}

fn preview(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    let mut out: String = line.chars().take(60).collect();
    if line.chars().count() > 60 || text.lines().nth(1).is_some() {
        out.push('…');
    }
    out
}
