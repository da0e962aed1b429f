//! `agentry schedules …`: scheduled tasks, run by the scheduler with no
//! client open. A scheduled task is a recurring reminder that starts a turn
//! on its prompt, in a session of its own per run (or in a given session).

use crate::client::{print_line, status_error};
use crate::reminder_cmds::{connect, when};
use agentry_proto::scheduler::v1 as pb;
use agentry_proto::scheduler::v1::scheduler_client::SchedulerClient;
use agentry_proto::sessions::v1::{ApprovalMode, ReminderKind};
use agentry_runtime::Config;
use agentry_runtime::telemetry::TracedChannel;

/// What `agentry schedules add` was given.
pub struct NewSchedule {
    /// The 5-field cron expression.
    pub cron: String,
    /// Its time zone; the machine's when not given.
    pub time_zone: Option<String>,
    /// Run in this session instead of a new one per run.
    pub session: Option<String>,
    /// A new session per run works in this directory.
    pub project: Option<std::path::PathBuf>,
    /// Refuse calls that need a person instead of waiting for one.
    pub approve_never: bool,
    /// Each run's session works as this configured agent.
    pub agent: Option<String>,
    /// What the agent is asked each time.
    pub prompt: String,
}

/// The machine's IANA time zone, or UTC when it cannot be told.
fn local_time_zone() -> String {
    std::env::var("TZ")
        .ok()
        .map(|tz| tz.trim_start_matches(':').to_string())
        .filter(|tz| tz.parse::<chrono_tz::Tz>().is_ok())
        .or_else(|| iana_time_zone::get_timezone().ok())
        .filter(|tz| tz.parse::<chrono_tz::Tz>().is_ok())
        .unwrap_or_else(|| "UTC".to_string())
}

/// `agentry schedules add`.
pub async fn add(config: &Config, new: NewSchedule) -> anyhow::Result<()> {
    let prompt = new.prompt.trim().to_string();
    if prompt.is_empty() {
        anyhow::bail!("the prompt is empty: say what the agent should do each time");
    }
    let project_dir = match &new.project {
        Some(dir) => {
            let full = std::fs::canonicalize(dir)
                .map_err(|e| anyhow::anyhow!("--project {}: {e}", dir.display()))?;
            if !full.is_dir() {
                anyhow::bail!("--project {}: not a directory", full.display());
            }
            full.display().to_string()
        }
        None => String::new(),
    };
    let time_zone = new.time_zone.unwrap_or_else(local_time_zone);
    let mut client = connect(config).await?;
    let schedule = client
        .create_reminder(pb::CreateReminderRequest {
            session_id: new.session.unwrap_or_default(),
            due: String::new(),
            message: prompt,
            kind: ReminderKind::Task as i32,
            recurrence: Some(pb::Recurrence {
                cron: new.cron,
                time_zone,
                // A run missed while the services were down runs once.
                missed: pb::MissedPolicy::Once as i32,
            }),
            task: Some(pb::ScheduledTask {
                project_dir,
                agent: new.agent.unwrap_or_default(),
                approval_mode: if new.approve_never {
                    ApprovalMode::Never
                } else {
                    ApprovalMode::Policy
                } as i32,
            }),
        })
        .await
        .map_err(|s| status_error("cannot add the schedule", s))?
        .into_inner();
    print_line(format!("scheduled task {}", schedule.id))?;
    print_line(describe(&schedule))?;
    print_line(format!(
        "its runs: agentry schedules runs {}   pause it: agentry schedules pause {}",
        schedule.id, schedule.id
    ))?;
    Ok(())
}

fn status_name(status: i32) -> &'static str {
    match pb::ReminderStatus::try_from(status) {
        Ok(pb::ReminderStatus::Pending) => "active",
        Ok(pb::ReminderStatus::Paused) => "paused",
        Ok(pb::ReminderStatus::Completed) => "completed",
        Ok(pb::ReminderStatus::Cancelled) => "removed",
        Ok(pb::ReminderStatus::Unspecified) | Err(_) => "?",
    }
}

/// Where and how a schedule's runs go, in one line.
fn describe(s: &pb::Reminder) -> String {
    let every = s
        .recurrence
        .as_ref()
        .map(|r| format!("\"{}\" ({})", r.cron, r.time_zone))
        .unwrap_or_default();
    let task = s.task.clone().unwrap_or_default();
    let place = match (s.session_id.as_str(), task.project_dir.as_str()) {
        ("", "") => "a new scratch session per run".to_string(),
        ("", dir) => format!("a new session per run in {dir}"),
        (session, _) => format!("session {session}"),
    };
    let place = if task.agent.is_empty() {
        place
    } else {
        format!("{place}, as the agent {}", task.agent)
    };
    let approve = if task.approval_mode == ApprovalMode::Never as i32 {
        "calls that need a person are refused"
    } else {
        "calls that need a person wait in `agentry approvals`"
    };
    format!(
        "  {every}, next {}; {place}; {approve}",
        when(s.next_due.as_ref())
    )
}

async fn schedules(
    client: &mut SchedulerClient<TracedChannel>,
) -> anyhow::Result<Vec<pb::Reminder>> {
    Ok(client
        .list_reminders(pb::ListRemindersRequest {
            session_id: String::new(),
            status: pb::ReminderStatus::Unspecified as i32,
        })
        .await
        .map_err(|s| status_error("cannot list the schedules", s))?
        .into_inner()
        .reminders
        .into_iter()
        .filter(|r| r.task.is_some())
        .collect())
}

/// The schedule `given` names: its id or a unique beginning of it.
async fn find(client: &mut SchedulerClient<TracedChannel>, given: &str) -> anyhow::Result<String> {
    let given = given.trim();
    let all = schedules(client).await?;
    if all.iter().any(|s| s.id == given) {
        return Ok(given.to_string());
    }
    let matching: Vec<&pb::Reminder> = all
        .iter()
        .filter(|s| given.len() >= 4 && s.id.starts_with(given))
        .collect();
    match matching.as_slice() {
        [one] => Ok(one.id.clone()),
        [] => anyhow::bail!(
            "no scheduled task {:?}; `agentry schedules list --all` shows them",
            given
        ),
        _ => anyhow::bail!(
            "{:?} begins {} schedules' ids; give more of it",
            given,
            matching.len()
        ),
    }
}

/// `agentry schedules list`.
pub async fn list(config: &Config, all: bool) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let shown: Vec<pb::Reminder> = schedules(&mut client)
        .await?
        .into_iter()
        .filter(|s| {
            all || matches!(
                pb::ReminderStatus::try_from(s.status),
                Ok(pb::ReminderStatus::Pending | pb::ReminderStatus::Paused)
            )
        })
        .collect();
    if shown.is_empty() {
        print_line(
            "no scheduled tasks; add one: agentry schedules add --cron \"0 9 * * 1-5\" \"PROMPT\"",
        )?;
        return Ok(());
    }
    print_line(format!("{:<38} {:<9} {:<5} PROMPT", "ID", "STATUS", "RUNS"))?;
    for s in shown {
        print_line(format!(
            "{:<38} {:<9} {:<5} {}",
            s.id,
            status_name(s.status),
            s.fire_count,
            one_line(&s.message, 80)
        ))?;
        print_line(describe(&s))?;
    }
    Ok(())
}

/// `agentry schedules pause|resume ID`.
pub async fn set_paused(config: &Config, id: &str, paused: bool) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let id = find(&mut client, id).await?;
    let what = if paused { "pause" } else { "resume" };
    let schedule = client
        .pause_reminder(pb::PauseReminderRequest {
            reminder_id: id.clone(),
            paused,
        })
        .await
        .map_err(|s| status_error(&format!("cannot {what} schedule {id}"), s))?
        .into_inner();
    if paused {
        print_line(format!(
            "paused {id}: it runs no more until `agentry schedules resume {id}`"
        ))?;
    } else {
        print_line(format!(
            "resumed {id}: next run {}",
            when(schedule.next_due.as_ref())
        ))?;
    }
    Ok(())
}

/// `agentry schedules remove ID`.
pub async fn remove(config: &Config, id: &str) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let id = find(&mut client, id).await?;
    client
        .cancel_reminder(pb::CancelReminderRequest {
            reminder_id: id.clone(),
            session_id: String::new(),
        })
        .await
        .map_err(|s| status_error(&format!("cannot remove schedule {id}"), s))?;
    print_line(format!(
        "removed {id}; its runs' sessions stay (`agentry schedules runs {id}` still lists them)"
    ))?;
    Ok(())
}

fn state_name(state: i32) -> &'static str {
    match pb::RunState::try_from(state) {
        Ok(pb::RunState::Running) => "running",
        Ok(pb::RunState::Skipped) => "skipped",
        Ok(pb::RunState::NotStarted) => "not-started",
        Ok(pb::RunState::Completed) => "completed",
        Ok(pb::RunState::Failed) => "failed",
        Ok(pb::RunState::Cancelled) => "cancelled",
        Ok(pb::RunState::Unspecified) | Err(_) => "?",
    }
}

/// `agentry schedules runs ID`.
pub async fn runs(config: &Config, id: &str, limit: u32) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let id = find(&mut client, id).await?;
    let runs = client
        .list_runs(pb::ListRunsRequest {
            reminder_id: id.clone(),
            limit,
        })
        .await
        .map_err(|s| status_error(&format!("cannot list the runs of {id}"), s))?
        .into_inner()
        .runs;
    if runs.is_empty() {
        print_line(format!("schedule {id} has not run yet"))?;
        return Ok(());
    }
    print_line(format!(
        "{:<19} {:<11} {:<38} NOTE",
        "DUE", "OUTCOME", "SESSION"
    ))?;
    for run in runs {
        print_line(format!(
            "{:<19} {:<11} {:<38} {}",
            when(run.due_time.as_ref()),
            state_name(run.state),
            if run.session_id.is_empty() {
                "-"
            } else {
                &run.session_id
            },
            one_line(&run.note, 100)
        ))?;
    }
    Ok(())
}

fn one_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    let mut out: String = line.chars().take(max).collect();
    if line.chars().count() > max || text.lines().nth(1).is_some() {
        out.push('…');
    }
    out
}
