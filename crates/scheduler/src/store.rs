//! Durable reminders and their firings in SQLite.
//!
//! A reminder is pending until it fires (one-shot) or is cancelled; each time
//! one falls due, a *firing* row is written in the same transaction that
//! moves the reminder to its next due time. Firings stay unacknowledged until
//! the consumer (the orchestrator) acks them, so delivery is at-least-once
//! and survives restarts of either side.

use crate::schedule::{self, MissedPolicy, Recurrence};
use agentry_proto::scheduler::v1::{ScheduledRun, ScheduledTask};
use chrono::{DateTime, TimeZone, Utc};
use rusqlite::{Connection, OptionalExtension, params};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// A scheduler store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such reminder (or not in that session).
    #[error("reminder {0:?} not found")]
    NotFound(String),
    /// The reminder can no longer be cancelled.
    #[error("reminder {id:?} is already {status}")]
    NotPending {
        /// The reminder.
        id: String,
        /// Its status.
        status: &'static str,
    },
    /// Only a recurring reminder can be paused.
    #[error("reminder {0:?} fires once; only a recurring one can be paused (cancel it instead)")]
    NotRecurring(String),
    /// SQLite failed.
    #[error("database error: {0}")]
    Database(#[from] rusqlite::Error),
    /// PostgreSQL refused a statement.
    #[error("database error: {0}")]
    Postgres(String),
    /// The database cannot be reached now; the same call may succeed later.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// A stored value no longer parses.
    #[error("stored reminder {id} is corrupt: {reason}")]
    Corrupt {
        /// The reminder.
        id: String,
        /// Why.
        reason: String,
    },
}

impl StoreError {
    /// Whether retrying may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Database(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ),
            StoreError::Unavailable(_) => true,
            StoreError::Database(_)
            | StoreError::Postgres(_)
            | StoreError::NotFound(_)
            | StoreError::NotPending { .. }
            | StoreError::NotRecurring(_)
            | StoreError::Corrupt { .. } => false,
        }
    }
}

/// What a reminder does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Deliver the text.
    Notify,
    /// Deliver the text and let the agent act on it.
    Task,
}

impl Kind {
    pub(crate) fn code(self) -> i64 {
        match self {
            Kind::Notify => 1,
            Kind::Task => 2,
        }
    }

    pub(crate) fn from_code(code: i64) -> Kind {
        if code == 2 { Kind::Task } else { Kind::Notify }
    }

    /// The kind's name in events: `notify` or `task`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Notify => "notify",
            Kind::Task => "task",
        }
    }
}

/// Where a reminder is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Waiting to fall due.
    Pending,
    /// Fired (one-shot) and done.
    Completed,
    /// Cancelled before it fired.
    Cancelled,
    /// A recurring reminder a person paused.
    Paused,
}

impl Status {
    pub(crate) fn code(self) -> i64 {
        match self {
            Status::Pending => 1,
            Status::Completed => 2,
            Status::Cancelled => 3,
            Status::Paused => 4,
        }
    }

    pub(crate) fn from_code(code: i64) -> Status {
        match code {
            2 => Status::Completed,
            3 => Status::Cancelled,
            4 => Status::Paused,
            _ => Status::Pending,
        }
    }

    /// The status's name.
    pub fn name(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Completed => "completed",
            Status::Cancelled => "cancelled",
            Status::Paused => "paused",
        }
    }
}

/// A scheduled task's settings, as stored (protobuf bytes; NULL: a plain
/// reminder).
pub(crate) fn task_bytes(task: Option<&ScheduledTask>) -> Option<Vec<u8>> {
    task.map(prost::Message::encode_to_vec)
}

pub(crate) fn task_from_bytes(
    id: &str,
    bytes: Option<Vec<u8>>,
) -> Result<Option<ScheduledTask>, StoreError> {
    bytes
        .map(|b| {
            <ScheduledTask as prost::Message>::decode(b.as_slice()).map_err(|e| {
                StoreError::Corrupt {
                    id: id.to_string(),
                    reason: format!("its task settings do not decode: {e}"),
                }
            })
        })
        .transpose()
}

pub(crate) fn missed_code(m: MissedPolicy) -> i64 {
    match m {
        MissedPolicy::Once => 1,
        MissedPolicy::All => 2,
        MissedPolicy::Skip => 3,
    }
}

pub(crate) fn missed_from_code(code: i64) -> MissedPolicy {
    match code {
        2 => MissedPolicy::All,
        3 => MissedPolicy::Skip,
        _ => MissedPolicy::Once,
    }
}

/// A stored reminder.
#[derive(Debug, Clone, PartialEq)]
pub struct Reminder {
    /// Its id.
    pub id: String,
    /// The session it fires into.
    pub session_id: String,
    /// The text.
    pub message: String,
    /// What it does.
    pub kind: Kind,
    /// When it next falls due (none once completed).
    pub next_due: Option<DateTime<Utc>>,
    /// The 5-field cron expression, for recurring reminders.
    pub cron: Option<String>,
    /// The time zone of the cron expression.
    pub time_zone: String,
    /// What to do with missed occurrences.
    pub missed: MissedPolicy,
    /// Where it is.
    pub status: Status,
    /// When it was created.
    pub created: DateTime<Utc>,
    /// How many times it fired.
    pub fire_count: u32,
    /// Set for a scheduled task.
    pub task: Option<ScheduledTask>,
}

/// One firing of a reminder.
#[derive(Debug, Clone, PartialEq)]
pub struct Firing {
    /// `<reminder id>@<due ms>`: stable across redeliveries.
    pub firing_id: String,
    /// The reminder as it was when it fired.
    pub reminder: Reminder,
    /// The occurrence that fell due.
    pub due: DateTime<Utc>,
    /// When it fired.
    pub fired: DateTime<Utc>,
    /// How late it fired, in milliseconds.
    pub late_ms: u64,
    /// How many occurrences it stands for.
    pub occurrences: u32,
}

/// Every reminder, and every firing with whether it was acknowledged.
pub type Export = (Vec<Reminder>, Vec<(Firing, bool)>);

/// A new reminder, validated by the caller.
#[derive(Debug, Clone)]
pub struct NewReminder {
    /// The session.
    pub session_id: String,
    /// The text.
    pub message: String,
    /// What it does.
    pub kind: Kind,
    /// The first due time.
    pub due: DateTime<Utc>,
    /// The recurrence, if any.
    pub recurrence: Option<Recurrence>,
    /// What to do with missed occurrences.
    pub missed: MissedPolicy,
    /// Set for a scheduled task.
    pub task: Option<ScheduledTask>,
}

pub(crate) fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

pub(crate) fn from_ms(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

/// What falling due does to a reminder: the firings it writes, and where
/// it goes next.
pub(crate) struct FellDue {
    pub firings: Vec<Firing>,
    pub next_due: Option<DateTime<Utc>>,
    pub status: Status,
}

/// Plans the firings of a pending `reminder` due at or before `now`
/// (`None` when it has no due time).
pub(crate) fn fall_due(
    reminder: &Reminder,
    now: DateTime<Utc>,
    grace: chrono::Duration,
) -> Result<Option<FellDue>, StoreError> {
    let Some(due_at) = reminder.next_due else {
        return Ok(None);
    };
    let recurrence =
        match &reminder.cron {
            Some(cron) => Some(Recurrence::parse(cron, &reminder.time_zone).map_err(|e| {
                StoreError::Corrupt {
                    id: reminder.id.clone(),
                    reason: e.to_string(),
                }
            })?),
            None => None,
        };
    let plan = schedule::plan(due_at, recurrence.as_ref(), reminder.missed, now, grace);
    let firings = plan
        .fire
        .iter()
        .map(|planned| Firing {
            firing_id: format!("{}@{}", reminder.id, ms(planned.due)),
            reminder: reminder.clone(),
            due: planned.due,
            fired: now,
            late_ms: (now - planned.due).num_milliseconds().max(0) as u64,
            occurrences: planned.occurrences,
        })
        .collect();
    Ok(Some(FellDue {
        firings,
        next_due: plan.next_due,
        status: if plan.next_due.is_some() {
            Status::Pending
        } else {
            Status::Completed
        },
    }))
}

/// What pausing (or resuming) `reminder` changes: its status from, to,
/// and its next due time.
pub(crate) fn pause_change(
    reminder: &Reminder,
    paused: bool,
    resume_at: DateTime<Utc>,
) -> Result<(Status, Status, Option<DateTime<Utc>>), StoreError> {
    match (paused, reminder.status) {
        (true, Status::Pending) if reminder.cron.is_some() => {
            Ok((Status::Pending, Status::Paused, reminder.next_due))
        }
        (true, Status::Paused) | (false, Status::Pending) => Err(StoreError::NotPending {
            id: reminder.id.clone(),
            status: reminder.status.name(),
        }),
        (false, Status::Paused) => Ok((Status::Paused, Status::Pending, Some(resume_at))),
        (true, Status::Pending) => Err(StoreError::NotRecurring(reminder.id.clone())),
        (_, status) => Err(StoreError::NotPending {
            id: reminder.id.clone(),
            status: status.name(),
        }),
    }
}

/// A delivery waiting in the notifications' outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// `<notification id>/<webhook name>`.
    pub id: String,
    /// The webhook's name.
    pub target: String,
    /// The event.
    pub event: String,
    /// One line for a person.
    pub title: String,
    /// The body to send.
    pub body: String,
    /// When it was queued.
    pub created: DateTime<Utc>,
    /// Attempts so far.
    pub attempts: u32,
}

/// Where a delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// Waiting to be (re)tried.
    Pending = 0,
    /// Delivered.
    Delivered = 1,
    /// Given up on.
    Failed = 2,
}

/// The scheduler's SQLite store.
pub struct Store {
    conn: Mutex<Connection>,
}

const REMINDER_COLUMNS: &str = "id, session_id, message, kind, next_due_ms, cron, tz, missed, status, created_ms, fire_count, task";

fn reminder_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Reminder> {
    let cron: String = row.get(5)?;
    let id: String = row.get(0)?;
    let task = task_from_bytes(&id, row.get(11)?).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(11, rusqlite::types::Type::Blob, Box::new(e))
    })?;
    Ok(Reminder {
        id: row.get(0)?,
        session_id: row.get(1)?,
        message: row.get(2)?,
        kind: Kind::from_code(row.get(3)?),
        next_due: row.get::<_, Option<i64>>(4)?.map(from_ms),
        cron: (!cron.is_empty()).then_some(cron),
        time_zone: row.get(6)?,
        missed: missed_from_code(row.get(7)?),
        status: Status::from_code(row.get(8)?),
        created: from_ms(row.get(9)?),
        fire_count: row.get::<_, i64>(10)? as u32,
        task,
    })
}

const RUN_COLUMNS: &str =
    "firing_id, reminder_id, due_ms, recorded_ms, session_id, turn_id, state, note, from_seq";

fn run_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ScheduledRun> {
    Ok(ScheduledRun {
        firing_id: row.get(0)?,
        reminder_id: row.get(1)?,
        due_time: Some(timestamp(from_ms(row.get(2)?))),
        recorded_at: Some(timestamp(from_ms(row.get(3)?))),
        session_id: row.get(4)?,
        turn_id: row.get(5)?,
        state: row.get::<_, i64>(6)? as i32,
        note: row.get(7)?,
        from_seq: row.get::<_, i64>(8)?.max(0) as u64,
    })
}

pub(crate) fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

pub(crate) fn ms_of(t: Option<&prost_types::Timestamp>) -> i64 {
    t.map_or(0, |t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
}

impl Store {
    /// Opens (creating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            let _ = agentry_runtime::datadir::prepare_dir(parent);
        }
        let _ = agentry_runtime::datadir::prepare_file(path);
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS reminders (
                id TEXT PRIMARY KEY,
                session_id TEXT NOT NULL,
                message TEXT NOT NULL,
                kind INTEGER NOT NULL,
                next_due_ms INTEGER,
                cron TEXT NOT NULL DEFAULT '',
                tz TEXT NOT NULL DEFAULT 'UTC',
                missed INTEGER NOT NULL DEFAULT 1,
                status INTEGER NOT NULL,
                created_ms INTEGER NOT NULL,
                fire_count INTEGER NOT NULL DEFAULT 0
            );
            CREATE INDEX IF NOT EXISTS reminders_by_due ON reminders(status, next_due_ms);
            CREATE INDEX IF NOT EXISTS reminders_by_session ON reminders(session_id);
            CREATE TABLE IF NOT EXISTS firings (
                firing_id TEXT PRIMARY KEY,
                reminder_id TEXT NOT NULL,
                due_ms INTEGER NOT NULL,
                fired_ms INTEGER NOT NULL,
                late_ms INTEGER NOT NULL,
                occurrences INTEGER NOT NULL,
                snapshot_message TEXT NOT NULL,
                acked INTEGER NOT NULL DEFAULT 0
            );
            CREATE INDEX IF NOT EXISTS firings_unacked ON firings(acked, fired_ms);",
        )?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version < 2 {
            // Version 2: scheduled tasks (their settings, their runs).
            conn.execute_batch(
                "BEGIN;
                ALTER TABLE reminders ADD COLUMN task BLOB;
                CREATE TABLE IF NOT EXISTS runs (
                    firing_id TEXT PRIMARY KEY,
                    reminder_id TEXT NOT NULL,
                    due_ms INTEGER NOT NULL,
                    recorded_ms INTEGER NOT NULL,
                    session_id TEXT NOT NULL,
                    turn_id TEXT NOT NULL,
                    state INTEGER NOT NULL,
                    note TEXT NOT NULL,
                    from_seq INTEGER NOT NULL
                );
                CREATE INDEX IF NOT EXISTS runs_by_reminder ON runs(reminder_id, due_ms);
                PRAGMA user_version = 2;
                COMMIT;",
            )?;
        }
        if version < 3 {
            // Version 3: the notifications' outbox.
            conn.execute_batch(
                "BEGIN;
                CREATE TABLE IF NOT EXISTS outbox (
                    id TEXT PRIMARY KEY,
                    target TEXT NOT NULL,
                    event TEXT NOT NULL,
                    title TEXT NOT NULL,
                    body TEXT NOT NULL,
                    created_ms INTEGER NOT NULL,
                    next_ms INTEGER NOT NULL,
                    attempts INTEGER NOT NULL DEFAULT 0,
                    state INTEGER NOT NULL DEFAULT 0,
                    last_error TEXT NOT NULL DEFAULT ''
                );
                CREATE INDEX IF NOT EXISTS outbox_due ON outbox(state, next_ms);
                PRAGMA user_version = 3;
                COMMIT;",
            )?;
        }
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores a new reminder; returns it.
    pub fn create(&self, new: NewReminder, now: DateTime<Utc>) -> Result<Reminder, StoreError> {
        let id = uuid::Uuid::now_v7().to_string();
        let (cron, tz) = match &new.recurrence {
            Some(r) => (r.cron().to_string(), r.time_zone().to_string()),
            None => (String::new(), "UTC".to_string()),
        };
        let conn = self.conn();
        conn.execute(
            "INSERT INTO reminders (id, session_id, message, kind, next_due_ms, cron, tz, missed, status, created_ms, task)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                id,
                new.session_id,
                new.message,
                new.kind.code(),
                ms(new.due),
                cron,
                tz,
                missed_code(new.missed),
                Status::Pending.code(),
                ms(now),
                task_bytes(new.task.as_ref())
            ],
        )?;
        Self::get_in(&conn, &id)
    }

    /// Stores many reminders in one transaction (bulk loads, benchmarks).
    pub fn create_many(
        &self,
        reminders: Vec<NewReminder>,
        now: DateTime<Utc>,
    ) -> Result<usize, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO reminders (id, session_id, message, kind, next_due_ms, cron, tz, missed, status, created_ms, task)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            )?;
            for new in &reminders {
                let (cron, tz) = match &new.recurrence {
                    Some(r) => (r.cron().to_string(), r.time_zone().to_string()),
                    None => (String::new(), "UTC".to_string()),
                };
                insert.execute(params![
                    uuid::Uuid::now_v7().to_string(),
                    new.session_id,
                    new.message,
                    new.kind.code(),
                    ms(new.due),
                    cron,
                    tz,
                    missed_code(new.missed),
                    Status::Pending.code(),
                    ms(now),
                    task_bytes(new.task.as_ref())
                ])?;
            }
        }
        tx.commit()?;
        Ok(reminders.len())
    }

    fn get_in(conn: &Connection, id: &str) -> Result<Reminder, StoreError> {
        conn.query_row(
            &format!("SELECT {REMINDER_COLUMNS} FROM reminders WHERE id = ?1"),
            [id],
            reminder_from_row,
        )
        .optional()?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }

    /// One reminder.
    pub fn get(&self, id: &str) -> Result<Reminder, StoreError> {
        Self::get_in(&self.conn(), id)
    }

    /// How many reminders are pending.
    pub fn pending_count(&self) -> Result<u64, StoreError> {
        let n: i64 = self.conn().query_row(
            "SELECT COUNT(*) FROM reminders WHERE status = ?1",
            params![Status::Pending.code()],
            |row| row.get(0),
        )?;
        Ok(n.max(0) as u64)
    }

    /// Reminders, optionally of one session and/or one status, soonest first.
    pub fn list(
        &self,
        session_id: Option<&str>,
        status: Option<Status>,
    ) -> Result<Vec<Reminder>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {REMINDER_COLUMNS} FROM reminders
             WHERE (?1 IS NULL OR session_id = ?1) AND (?2 IS NULL OR status = ?2)
             ORDER BY next_due_ms IS NULL, next_due_ms, created_ms
             LIMIT 10000"
        ))?;
        let rows = stmt
            .query_map(
                params![session_id, status.map(Status::code)],
                reminder_from_row,
            )?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// Cancels a pending reminder (of `session_id`, when given).
    pub fn cancel(&self, id: &str, session_id: Option<&str>) -> Result<Reminder, StoreError> {
        let conn = self.conn();
        let reminder = Self::get_in(&conn, id)?;
        if session_id.is_some_and(|s| s != reminder.session_id) {
            return Err(StoreError::NotFound(id.to_string()));
        }
        if !matches!(reminder.status, Status::Pending | Status::Paused) {
            return Err(StoreError::NotPending {
                id: id.to_string(),
                status: reminder.status.name(),
            });
        }
        conn.execute(
            "UPDATE reminders SET status = ?2, next_due_ms = NULL WHERE id = ?1",
            params![id, Status::Cancelled.code()],
        )?;
        Self::get_in(&conn, id)
    }

    /// Pauses a pending recurring reminder, or resumes a paused one to fall
    /// due at `resume_at`.
    pub fn set_paused(
        &self,
        id: &str,
        paused: bool,
        resume_at: DateTime<Utc>,
    ) -> Result<Reminder, StoreError> {
        let conn = self.conn();
        let reminder = Self::get_in(&conn, id)?;
        let (from, to, next) = pause_change(&reminder, paused, resume_at)?;
        conn.execute(
            "UPDATE reminders SET status = ?3, next_due_ms = ?4 WHERE id = ?1 AND status = ?2",
            params![id, from.code(), to.code(), next.map(ms)],
        )?;
        Self::get_in(&conn, id)
    }

    /// Records a scheduled task's run (replacing an earlier record of the
    /// same firing).
    pub fn record_run(&self, run: &ScheduledRun, now: DateTime<Utc>) -> Result<(), StoreError> {
        self.conn().execute(
            &format!(
                "INSERT INTO runs ({RUN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT(firing_id) DO UPDATE SET recorded_ms = excluded.recorded_ms,
                   session_id = excluded.session_id, turn_id = excluded.turn_id,
                   state = excluded.state, note = excluded.note, from_seq = excluded.from_seq"
            ),
            params![
                run.firing_id,
                run.reminder_id,
                ms_of(run.due_time.as_ref()),
                ms(now),
                run.session_id,
                run.turn_id,
                i64::from(run.state),
                run.note,
                run.from_seq as i64
            ],
        )?;
        Ok(())
    }

    /// Every scheduled task's runs (`agentry migrate`), oldest first.
    pub fn all_runs(&self) -> Result<Vec<ScheduledRun>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {RUN_COLUMNS} FROM runs ORDER BY due_ms, firing_id"
        ))?;
        let runs = stmt
            .query_map([], run_from_row)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(runs)
    }

    /// A scheduled task's runs, newest first.
    pub fn runs(&self, reminder_id: &str, limit: u32) -> Result<Vec<ScheduledRun>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE reminder_id = ?1
             ORDER BY due_ms DESC, firing_id DESC LIMIT ?2"
        ))?;
        let runs = stmt
            .query_map(params![reminder_id, i64::from(limit)], run_from_row)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(runs)
    }

    /// Queues deliveries (one already queued is left alone); how many were
    /// new.
    pub fn enqueue(&self, deliveries: &[Delivery], now: DateTime<Utc>) -> Result<u32, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut new = 0;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO outbox (id, target, event, title, body, created_ms, next_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) ON CONFLICT(id) DO NOTHING",
            )?;
            for d in deliveries {
                new +=
                    insert.execute(params![d.id, d.target, d.event, d.title, d.body, ms(now)])?;
            }
        }
        tx.commit()?;
        Ok(new as u32)
    }

    /// Takes up to `limit` deliveries due at `now`, leasing each until
    /// `lease_until` (another scheduler does not take them meanwhile).
    pub fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Delivery>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let due: Vec<Delivery> = {
            let mut stmt = tx.prepare_cached(
                "SELECT id, target, event, title, body, created_ms, attempts FROM outbox
                 WHERE state = 0 AND next_ms <= ?1 ORDER BY next_ms LIMIT ?2",
            )?;
            stmt.query_map(params![ms(now), i64::from(limit)], |r| {
                Ok(Delivery {
                    id: r.get(0)?,
                    target: r.get(1)?,
                    event: r.get(2)?,
                    title: r.get(3)?,
                    body: r.get(4)?,
                    created: from_ms(r.get(5)?),
                    attempts: r.get::<_, i64>(6)? as u32,
                })
            })?
            .collect::<Result<_, _>>()?
        };
        for d in &due {
            tx.execute(
                "UPDATE outbox SET next_ms = ?2 WHERE id = ?1",
                params![d.id, ms(lease_until)],
            )?;
        }
        tx.commit()?;
        Ok(due)
    }

    /// Records an attempt: delivered, to retry at `next`, or given up.
    pub fn delivery_attempted(
        &self,
        id: &str,
        state: DeliveryState,
        next: DateTime<Utc>,
        error: &str,
    ) -> Result<(), StoreError> {
        self.conn().execute(
            "UPDATE outbox SET state = ?2, next_ms = ?3, attempts = attempts + 1, last_error = ?4
             WHERE id = ?1",
            params![id, state as i64, ms(next), error],
        )?;
        Ok(())
    }

    /// How many deliveries are in each state: pending, delivered, failed.
    pub fn outbox_counts(&self) -> Result<(u64, u64, u64), StoreError> {
        let conn = self.conn();
        let count = |state: i64| -> Result<u64, StoreError> {
            let n: i64 = conn.query_row(
                "SELECT COUNT(*) FROM outbox WHERE state = ?1",
                [state],
                |r| r.get(0),
            )?;
            Ok(n.max(0) as u64)
        };
        Ok((count(0)?, count(1)?, count(2)?))
    }

    /// When the next pending reminder falls due.
    pub fn next_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let conn = self.conn();
        let next: Option<i64> = conn.query_row(
            "SELECT MIN(next_due_ms) FROM reminders WHERE status = ?1",
            [Status::Pending.code()],
            |r| r.get(0),
        )?;
        Ok(next.map(from_ms))
    }

    /// Fires every pending reminder due at `now` (at most `batch` of them):
    /// writes their firings and moves them on, in one transaction.
    pub fn fire_due(
        &self,
        now: DateTime<Utc>,
        grace: chrono::Duration,
        batch: usize,
    ) -> Result<Vec<Firing>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let due: Vec<Reminder> = {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {REMINDER_COLUMNS} FROM reminders
                 WHERE status = ?1 AND next_due_ms <= ?2 ORDER BY next_due_ms LIMIT ?3"
            ))?;
            stmt.query_map(
                params![Status::Pending.code(), ms(now), batch as i64],
                reminder_from_row,
            )?
            .collect::<Result<Vec<_>, _>>()?
        };
        let mut firings = Vec::new();
        for reminder in due {
            let Some(fell) = fall_due(&reminder, now, grace)? else {
                continue;
            };
            for firing in &fell.firings {
                let inserted = tx.execute(
                    "INSERT INTO firings (firing_id, reminder_id, due_ms, fired_ms, late_ms, occurrences, snapshot_message)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT(firing_id) DO NOTHING",
                    params![
                        firing.firing_id,
                        reminder.id,
                        ms(firing.due),
                        ms(now),
                        firing.late_ms as i64,
                        firing.occurrences,
                        reminder.message
                    ],
                )?;
                if inserted == 1 {
                    firings.push(firing.clone());
                }
            }
            tx.execute(
                "UPDATE reminders SET next_due_ms = ?2, status = ?3, fire_count = fire_count + ?4 WHERE id = ?1",
                params![
                    reminder.id,
                    fell.next_due.map(ms),
                    fell.status.code(),
                    fell.firings.len() as i64
                ],
            )?;
        }
        tx.commit()?;
        // The firings carry the reminder as it is now.
        for firing in &mut firings {
            if let Ok(r) = Self::get_in(&conn, &firing.reminder.id) {
                firing.reminder = r;
            }
        }
        Ok(firings)
    }

    /// Firings not yet acknowledged, oldest first.
    pub fn unacked(&self) -> Result<Vec<Firing>, StoreError> {
        let conn = self.conn();
        let firings = Self::firings_in(
            &conn,
            "WHERE acked = 0 ORDER BY fired_ms, firing_id LIMIT 10000",
        )?;
        Ok(firings.into_iter().map(|(f, _)| f).collect())
    }

    /// Every reminder and every firing (`agentry migrate`): the firings as
    /// (firing, acknowledged).
    pub fn export(&self) -> Result<Export, StoreError> {
        let conn = self.conn();
        let reminders = conn
            .prepare(&format!(
                "SELECT {REMINDER_COLUMNS} FROM reminders ORDER BY created_ms, id"
            ))?
            .query_map([], reminder_from_row)?
            .collect::<Result<Vec<_>, _>>()?;
        let firings = Self::firings_in(&conn, "ORDER BY fired_ms, firing_id")?;
        Ok((reminders, firings))
    }

    /// Firings chosen and ordered by `tail` (SQL after `FROM firings`),
    /// each with its reminder as it is now and whether it was acknowledged.
    fn firings_in(conn: &Connection, tail: &str) -> Result<Vec<(Firing, bool)>, StoreError> {
        let rows = conn
            .prepare_cached(&format!(
                "SELECT firing_id, reminder_id, due_ms, fired_ms, late_ms, occurrences, acked
                 FROM firings {tail}"
            ))?
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, i64>(6)? != 0,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let mut firings = Vec::with_capacity(rows.len());
        for (firing_id, reminder_id, due, fired, late, occurrences, acked) in rows {
            let reminder = Self::get_in(conn, &reminder_id)?;
            firings.push((
                Firing {
                    firing_id,
                    reminder,
                    due: from_ms(due),
                    fired: from_ms(fired),
                    late_ms: late.max(0) as u64,
                    occurrences: occurrences as u32,
                },
                acked,
            ));
        }
        Ok(firings)
    }

    /// Marks a firing delivered. Unknown ids are ignored (already acked and
    /// forgotten, or never ours).
    pub fn ack(&self, firing_id: &str) -> Result<bool, StoreError> {
        let conn = self.conn();
        let changed = conn.execute(
            "UPDATE firings SET acked = 1 WHERE firing_id = ?1 AND acked = 0",
            [firing_id],
        )?;
        Ok(changed == 1)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use pretty_assertions::assert_eq;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn new(
        due: DateTime<Utc>,
        recurrence: Option<Recurrence>,
        missed: MissedPolicy,
    ) -> NewReminder {
        NewReminder {
            session_id: "s1".into(),
            message: "stretch".into(),
            kind: Kind::Notify,
            due,
            recurrence,
            missed,
            task: None,
        }
    }

    const GRACE: chrono::Duration = chrono::Duration::seconds(60);

    #[test]
    fn a_one_shot_fires_once_and_completes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let now = t("2026-11-23T10:00:00Z");
        let r = store
            .create(
                new(t("2026-11-23T10:05:00Z"), None, MissedPolicy::Once),
                now,
            )
            .unwrap();
        assert_eq!(store.next_due().unwrap(), Some(t("2026-11-23T10:05:00Z")));
        assert!(
            store
                .fire_due(t("2026-11-23T10:04:59Z"), GRACE, 100)
                .unwrap()
                .is_empty()
        );
        let fired = store
            .fire_due(t("2026-11-23T10:05:00.250Z"), GRACE, 100)
            .unwrap();
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].late_ms, 250);
        assert_eq!(
            fired[0].firing_id,
            format!("{}@{}", r.id, ms(t("2026-11-23T10:05:00Z")))
        );
        assert_eq!(fired[0].reminder.status, Status::Completed);
        assert!(
            store
                .fire_due(t("2026-11-23T11:00:00Z"), GRACE, 100)
                .unwrap()
                .is_empty()
        );
        assert_eq!(store.next_due().unwrap(), None);
        // Unacked until acked, and across a reopen.
        drop(store);
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        assert_eq!(store.unacked().unwrap().len(), 1);
        assert!(store.ack(&fired[0].firing_id).unwrap());
        assert!(!store.ack(&fired[0].firing_id).unwrap());
        assert!(store.unacked().unwrap().is_empty());
    }

    #[test]
    fn a_recurring_reminder_fires_every_occurrence_with_a_simulated_clock() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let start = t("2026-11-23T10:00:30Z");
        let rec = Recurrence::parse("*/10 * * * *", "UTC").unwrap();
        let first = schedule::first_due(&rec, start).unwrap();
        assert_eq!(first, t("2026-11-23T10:10:00Z"));
        store
            .create(new(first, Some(rec), MissedPolicy::Once), start)
            .unwrap();
        let mut fired = Vec::new();
        let mut now = start;
        while now < t("2026-11-23T11:00:30Z") {
            now += chrono::Duration::seconds(30);
            for f in store.fire_due(now, GRACE, 100).unwrap() {
                fired.push(f.due);
            }
        }
        assert_eq!(
            fired,
            ["10:10", "10:20", "10:30", "10:40", "10:50", "11:00"]
                .iter()
                .map(|hm| t(&format!("2026-11-23T{hm}:00Z")))
                .collect::<Vec<_>>()
        );
        let r = &store.list(None, None).unwrap()[0];
        assert_eq!(r.fire_count, 6);
        assert_eq!(r.status, Status::Pending);
        assert_eq!(r.next_due, Some(t("2026-11-23T11:10:00Z")));
    }

    #[test]
    fn missed_occurrences_fire_once_after_downtime() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let rec = Recurrence::parse("*/10 * * * *", "UTC").unwrap();
        store
            .create(
                new(t("2026-11-23T10:00:00Z"), Some(rec), MissedPolicy::Once),
                t("2026-11-23T09:55:00Z"),
            )
            .unwrap();
        // Down from 09:59 to 10:35.
        let fired = store
            .fire_due(t("2026-11-23T10:35:00Z"), GRACE, 100)
            .unwrap();
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].occurrences, 4);
        assert_eq!(fired[0].due, t("2026-11-23T10:30:00Z"));
        assert_eq!(fired[0].late_ms, 5 * 60 * 1000);
    }

    #[test]
    fn cancel_stops_a_reminder_and_scopes_by_session() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let now = t("2026-11-23T10:00:00Z");
        let r = store
            .create(
                new(t("2026-11-23T10:05:00Z"), None, MissedPolicy::Once),
                now,
            )
            .unwrap();
        assert!(matches!(
            store.cancel(&r.id, Some("other")).unwrap_err(),
            StoreError::NotFound(_)
        ));
        let cancelled = store.cancel(&r.id, Some("s1")).unwrap();
        assert_eq!(cancelled.status, Status::Cancelled);
        assert!(matches!(
            store.cancel(&r.id, None).unwrap_err(),
            StoreError::NotPending { .. }
        ));
        assert!(
            store
                .fire_due(t("2026-11-23T11:00:00Z"), GRACE, 100)
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            store
                .list(Some("s1"), Some(Status::Cancelled))
                .unwrap()
                .len(),
            1
        );
        assert!(
            store
                .list(Some("s1"), Some(Status::Pending))
                .unwrap()
                .is_empty()
        );
        assert!(matches!(
            store.cancel("nope", None).unwrap_err(),
            StoreError::NotFound(_)
        ));
    }
}
