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
