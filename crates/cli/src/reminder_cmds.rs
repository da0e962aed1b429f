//! `agentry reminders …`: talks to the scheduler directly.

use crate::ReminderStatus;
use crate::client::{dial, print_line, status_error};
use agentry_proto::scheduler::v1 as pb;
use agentry_proto::scheduler::v1::scheduler_client::SchedulerClient;
use agentry_proto::sessions::v1::ReminderKind;
use agentry_runtime::Config;
use agentry_runtime::telemetry::TracedChannel;

pub(crate) async fn connect(config: &Config) -> anyhow::Result<SchedulerClient<TracedChannel>> {
    let auth = crate::client::credentials(config)?;
    let channel = dial(
        &auth,
        &config.scheduler.url,
        "scheduler",
        "AGENTRY_SCHEDULER_URL",
    )
    .await?;
    Ok(SchedulerClient::new(channel))
}

pub(crate) fn when(t: Option<&prost_types::Timestamp>) -> String {
    t.and_then(|t| chrono::DateTime::from_timestamp(t.seconds, 0))
        .map(|d| {
            d.with_timezone(&chrono::Local)
                .format("%Y-%m-%d %H:%M:%S")
                .to_string()
        })
        .unwrap_or_else(|| "-".into())
}

fn kind_name(kind: i32) -> &'static str {
    match ReminderKind::try_from(kind) {
        Ok(ReminderKind::Task) => "task",
        Ok(ReminderKind::Notify) => "notify",
        Ok(ReminderKind::Unspecified) | Err(_) => "?",
    }
}

fn status_name(status: i32) -> &'static str {
    match pb::ReminderStatus::try_from(status) {
        Ok(pb::ReminderStatus::Pending) => "pending",
        Ok(pb::ReminderStatus::Completed) => "completed",
        Ok(pb::ReminderStatus::Cancelled) => "cancelled",
        Ok(pb::ReminderStatus::Paused) => "paused",
        Ok(pb::ReminderStatus::Unspecified) | Err(_) => "?",
    }
}

/// `agentry reminders list`.
pub async fn list(
    config: &Config,
    session: Option<String>,
    status: ReminderStatus,
) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let status = match status {
        ReminderStatus::Pending => pb::ReminderStatus::Pending,
        ReminderStatus::Completed => pb::ReminderStatus::Completed,
        ReminderStatus::Cancelled => pb::ReminderStatus::Cancelled,
        ReminderStatus::Paused => pb::ReminderStatus::Paused,
        ReminderStatus::All => pb::ReminderStatus::Unspecified,
    };
    let reminders = client
        .list_reminders(pb::ListRemindersRequest {
            session_id: session.unwrap_or_default(),
            status: status as i32,
        })
        .await
        .map_err(|s| status_error("cannot list reminders", s))?
        .into_inner()
        .reminders;
    if reminders.is_empty() {
        print_line("no reminders")?;
        return Ok(());
    }
    print_line(format!(
        "{:<38} {:<19} {:<9} {:<6} {:<38} MESSAGE",
        "ID", "NEXT DUE", "STATUS", "KIND", "SESSION"
    ))?;
    for r in reminders {
        let every = r
            .recurrence
            .as_ref()
            .map(|c| format!(" (every \"{}\" {})", c.cron, c.time_zone))
            .unwrap_or_default();
        print_line(format!(
            "{:<38} {:<19} {:<9} {:<6} {:<38} {}{every}",
            r.id,
            when(r.next_due.as_ref()),
            status_name(r.status),
            kind_name(r.kind),
            r.session_id,
            r.message
        ))?;
    }
    Ok(())
}

/// `agentry reminders cancel ID`.
pub async fn cancel(config: &Config, id: &str) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let reminder = client
        .cancel_reminder(pb::CancelReminderRequest {
            reminder_id: id.to_string(),
            session_id: String::new(),
        })
        .await
        .map_err(|s| status_error(&format!("cannot cancel reminder {id}"), s))?
        .into_inner();
    print_line(format!("cancelled: {}", reminder.message))?;
    Ok(())
}
