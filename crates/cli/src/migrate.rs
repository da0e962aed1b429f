//! `agentry migrate`: copies the sessions (with their logs) and the
//! reminders of a data directory's SQLite files into PostgreSQL, then
//! checks that everything arrived.

use agentry_runtime::Config;
use agentry_runtime::config::redact_url;
use agentry_scheduler::pg::PgStore as PgReminders;
use agentry_session_store::PgStore;
use agentry_session_store::store::{MAX_READ_EVENTS, Store};
use std::path::PathBuf;
use std::time::Duration;

/// What was copied.
#[derive(Debug, Default)]
struct Copied {
    sessions: u64,
    already_there: u64,
    events: u64,
    reminders: u64,
    firings: u64,
    runs: u64,
}

/// Copies `from` (a data directory) into the database at `to`.
pub async fn migrate(
    config: &Config,
    to: Option<String>,
    from: Option<PathBuf>,
) -> anyhow::Result<()> {
    let to = to
        .or_else(|| Some(config.session_store.database_url.clone()).filter(|u| !u.is_empty()))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "say where to copy to: --to postgres://… (or set session_store.database_url)"
            )
        })?;
    let from = from.unwrap_or_else(|| config.data_dir());
    let sessions_db = from.join(agentry_session_store::DB_FILE);
    anyhow::ensure!(
        sessions_db.is_file(),
        "no {} in {}: nothing to copy",
        agentry_session_store::DB_FILE,
        from.display()
    );
    println!("copying {} into {}", from.display(), redact_url(&to));
    let source = {
        let path = sessions_db.clone();
        tokio::task::spawn_blocking(move || Store::open(&path)).await??
    };
    let target = PgStore::connect(&to, Duration::from_secs(10)).await?;
    let mut copied = Copied::default();
    let mut offset = 0;
    let mut checked = Vec::new();
    loop {
        let (page, total) = source.list_sessions(1000, offset, false)?;
        if page.is_empty() {
            break;
        }
        offset += page.len() as u32;
        for session in page {
            let mut events = Vec::with_capacity(session.event_count as usize);
            let mut from_seq = 1;
            loop {
                let (chunk, more) = source.read(&session.id, from_seq, MAX_READ_EVENTS)?;
                from_seq += chunk.len() as u64;
                events.extend(chunk);
                if !more {
                    break;
                }
            }
            anyhow::ensure!(
                events.len() as u64 == session.event_count,
                "session {} lists {} events but {} were read",
                session.id,
                session.event_count,
                events.len()
            );
            if target.import_session(&session, &events).await? {
                copied.sessions += 1;
                copied.events += events.len() as u64;
            } else {
                copied.already_there += 1;
            }
            checked.push((session.id, session.event_count));
        }
        if u64::from(offset) >= total {
            break;
        }
    }
    // Every session is there with every event.
    for (id, count) in &checked {
        let there = target.get_session(id).await?;
        anyhow::ensure!(
            there.event_count == *count,
            "session {id}: {count} events here, {} in PostgreSQL",
            there.event_count
        );
        let (events, _) = target.read(id, *count, 1).await?;
        anyhow::ensure!(
            *count == 0 || events.first().map(|e| e.seq) == Some(*count),
            "session {id}: its last event did not arrive"
        );
    }
    let scheduler_db = from.join(agentry_scheduler::DB_FILE);
    if scheduler_db.is_file() {
        let source = tokio::task::spawn_blocking(move || {
            agentry_scheduler::store::Store::open(&scheduler_db)
        })
        .await??;
        let (reminders, firings) = source.export()?;
        let runs = source.all_runs()?;
        let target = PgReminders::connect(&to, Duration::from_secs(10)).await?;
        let (new_reminders, new_firings) = target.import(&reminders, &firings).await?;
        copied.runs = target.import_runs(&runs).await?;
        copied.reminders = new_reminders;
        copied.firings = new_firings;
        let (there_reminders, there_firings) = target.counts().await?;
        anyhow::ensure!(
            there_reminders >= reminders.len() as u64 && there_firings >= firings.len() as u64,
            "reminders: {} here, {there_reminders} in PostgreSQL; firings: {} here, {there_firings} in PostgreSQL",
            reminders.len(),
            firings.len()
        );
    }
    println!(
        "copied {} sessions ({} events; {} were there already), {} reminders and schedules, {} firings and {} scheduled runs",
        copied.sessions,
        copied.events,
        copied.already_there,
        copied.reminders,
        copied.firings,
        copied.runs
    );
    println!(
        "checked: all {} sessions are in PostgreSQL with every event",
        checked.len()
    );
    println!(
        "next: set session_store.database_url and scheduler.database_url to it and start the services"
    );
    Ok(())
}
