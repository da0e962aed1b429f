//! Reminders in PostgreSQL, for deployments running several schedulers on
//! one database. The contract is the SQLite store's (`store.rs`): a due
//! reminder's firings are written in the same transaction that moves it on.
//! Several schedulers share the work: each claims due reminders with
//! `FOR UPDATE SKIP LOCKED`, so a reminder falls due in one scheduler only,
//! and a firing's id (`<reminder>@<due ms>`) is unique, so even a claim
//! repeated after a crash writes it once.

use crate::store::{
    Delivery, DeliveryState, Firing, Kind, NewReminder, Reminder, Status, StoreError, fall_due,
    from_ms, missed_code, missed_from_code, ms, ms_of, pause_change, task_bytes, task_from_bytes,
    timestamp,
};
use agentry_proto::scheduler::v1::ScheduledRun;
use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Pool};
use std::time::Duration;

const COLUMNS: &str = "id, session_id, message, kind, next_due_ms, cron, tz, missed, status, created_ms, fire_count, task";

const RUN_COLUMNS: &str =
    "firing_id, reminder_id, due_ms, recorded_ms, session_id, turn_id, state, note, from_seq";

const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE reminders (
        id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        message TEXT NOT NULL,
        kind BIGINT NOT NULL,
        next_due_ms BIGINT,
        cron TEXT NOT NULL DEFAULT '',
        tz TEXT NOT NULL DEFAULT 'UTC',
        missed BIGINT NOT NULL DEFAULT 1,
        status BIGINT NOT NULL,
        created_ms BIGINT NOT NULL,
        fire_count BIGINT NOT NULL DEFAULT 0
     );
     CREATE INDEX reminders_by_due ON reminders (status, next_due_ms);
     CREATE INDEX reminders_by_session ON reminders (session_id);
     CREATE TABLE firings (
        firing_id TEXT PRIMARY KEY,
        reminder_id TEXT NOT NULL,
        due_ms BIGINT NOT NULL,
        fired_ms BIGINT NOT NULL,
        late_ms BIGINT NOT NULL,
        occurrences BIGINT NOT NULL,
        snapshot_message TEXT NOT NULL,
        acked BOOLEAN NOT NULL DEFAULT FALSE
     );
     CREATE INDEX firings_unacked ON firings (acked, fired_ms);",
    ),
    (
        2,
        "ALTER TABLE reminders ADD COLUMN task BYTEA;
         CREATE TABLE runs (
            firing_id TEXT PRIMARY KEY,
            reminder_id TEXT NOT NULL,
            due_ms BIGINT NOT NULL,
            recorded_ms BIGINT NOT NULL,
            session_id TEXT NOT NULL,
            turn_id TEXT NOT NULL,
            state BIGINT NOT NULL,
            note TEXT NOT NULL,
            from_seq BIGINT NOT NULL
         );
         CREATE INDEX runs_by_reminder ON runs (reminder_id, due_ms);",
    ),
    (
        3,
        "CREATE TABLE outbox (
            id TEXT PRIMARY KEY,
            target TEXT NOT NULL,
            event TEXT NOT NULL,
            title TEXT NOT NULL,
            body TEXT NOT NULL,
            created_ms BIGINT NOT NULL,
            next_ms BIGINT NOT NULL,
            attempts BIGINT NOT NULL DEFAULT 0,
            state BIGINT NOT NULL DEFAULT 0,
            last_error TEXT NOT NULL DEFAULT ''
         );
         CREATE INDEX outbox_due ON outbox (state, next_ms);",
    ),
];

/// A key of our own for `pg_advisory_xact_lock` ("agentry-scheduler").
const LOCK_KEY: i64 = 0x6167_656e_7472_7932;

fn db_error(e: tokio_postgres::Error) -> StoreError {
    use tokio_postgres::error::SqlState;
    match e.code() {
        None => StoreError::Unavailable(format!("PostgreSQL: {e}")),
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || *c == SqlState::TOO_MANY_CONNECTIONS
                || *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED =>
        {
            StoreError::Unavailable(format!("PostgreSQL: {e}"))
        }
        Some(_) => StoreError::Postgres(
            e.as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_else(|| e.to_string()),
        ),
    }
}

fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => db_error(e),
        other => StoreError::Unavailable(format!("PostgreSQL: {other}")),
    }
}

fn reminder_from_row(row: &tokio_postgres::Row) -> Result<Reminder, StoreError> {
    reminder_at(row, 0)
}

/// The reminder in `row`'s columns from `at` on (in `COLUMNS` order).
fn reminder_at(row: &tokio_postgres::Row, at: usize) -> Result<Reminder, StoreError> {
    let cron: String = row.get(at + 5);
    let id: String = row.get(at);
    let task = task_from_bytes(&id, row.get(at + 11))?;
    Ok(Reminder {
        id,
        session_id: row.get(at + 1),
        message: row.get(at + 2),
        kind: Kind::from_code(row.get(at + 3)),
        next_due: row.get::<_, Option<i64>>(at + 4).map(from_ms),
        cron: (!cron.is_empty()).then_some(cron),
        time_zone: row.get(at + 6),
        missed: missed_from_code(row.get(at + 7)),
        status: Status::from_code(row.get(at + 8)),
        created: from_ms(row.get(at + 9)),
        fire_count: row.get::<_, i64>(at + 10) as u32,
        task,
    })
}

fn run_from_row(row: &tokio_postgres::Row) -> ScheduledRun {
    ScheduledRun {
        firing_id: row.get(0),
        reminder_id: row.get(1),
        due_time: Some(timestamp(from_ms(row.get(2)))),
        recorded_at: Some(timestamp(from_ms(row.get(3)))),
        session_id: row.get(4),
        turn_id: row.get(5),
        state: row.get::<_, i64>(6) as i32,
        note: row.get(7),
        from_seq: row.get::<_, i64>(8).max(0) as u64,
    }
}

/// The scheduler's PostgreSQL store.
pub struct PgStore {
    pool: Pool,
}

impl PgStore {
    /// Connects to `url` and brings the schema up to date (safely when
    /// several schedulers start at once), retrying for `patience` while the
    /// server cannot be reached.
    pub async fn connect(url: &str, patience: Duration) -> Result<PgStore, StoreError> {
        let shown = agentry_runtime::config::redact_url(url);
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Postgres(format!("scheduler.database_url {shown}: {e}")))?;
        let manager = deadpool_postgres::Manager::from_config(
            config,
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(8)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(10)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Postgres(format!("PostgreSQL pool: {e}")))?;
        let deadline = tokio::time::Instant::now() + patience;
        let mut client = loop {
            match pool.get().await {
                Ok(client) => break client,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(url = %shown, error = %e, "PostgreSQL not reachable yet; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    return Err(StoreError::Unavailable(format!(
                        "cannot reach PostgreSQL at {shown}: {e}"
                    )));
                }
            }
        };
        let tx = client.transaction().await.map_err(db_error)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
            .await
            .map_err(db_error)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS agentry_scheduler_schema (
                version INTEGER PRIMARY KEY, applied_ms BIGINT NOT NULL)",
        )
        .await
        .map_err(db_error)?;
        let current: i32 = tx
            .query_one(
                "SELECT COALESCE(MAX(version), 0) FROM agentry_scheduler_schema",
                &[],
            )
            .await
            .map_err(db_error)?
            .get(0);
        let known = MIGRATIONS[MIGRATIONS.len() - 1].0;
        if current > known {
            return Err(StoreError::Postgres(format!(
                "the scheduler's tables have schema version {current}, newer than this build \
                 knows ({known}); run the version of Agentry that wrote them, or a newer one"
            )));
        }
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
            tx.batch_execute(sql).await.map_err(db_error)?;
            tx.execute(
                "INSERT INTO agentry_scheduler_schema (version, applied_ms) VALUES ($1, $2)",
                &[version, &Utc::now().timestamp_millis()],
            )
            .await
            .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(PgStore { pool })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }

    async fn insert(
        client: &impl GenericClient,
        new: &NewReminder,
        now: DateTime<Utc>,
    ) -> Result<String, StoreError> {
        let id = uuid::Uuid::now_v7().to_string();
        let (cron, tz) = match &new.recurrence {
            Some(r) => (r.cron().to_string(), r.time_zone().to_string()),
            None => (String::new(), "UTC".to_string()),
        };
        client
            .execute(
                "INSERT INTO reminders (id, session_id, message, kind, next_due_ms, cron, tz, missed, status, created_ms, task)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                &[
                    &id,
                    &new.session_id,
                    &new.message,
                    &new.kind.code(),
                    &ms(new.due),
                    &cron,
                    &tz,
                    &missed_code(new.missed),
                    &Status::Pending.code(),
                    &ms(now),
                    &task_bytes(new.task.as_ref()),
                ],
            )
            .await
            .map_err(db_error)?;
        Ok(id)
    }

    /// Stores a new reminder; returns it.
    pub async fn create(
        &self,
        new: NewReminder,
        now: DateTime<Utc>,
    ) -> Result<Reminder, StoreError> {
        let client = self.client().await?;
        let id = Self::insert(&client, &new, now).await?;
        get_in(&client, &id).await
    }

    /// Stores many reminders in one transaction.
    pub async fn create_many(
        &self,
        reminders: Vec<NewReminder>,
        now: DateTime<Utc>,
    ) -> Result<usize, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        for new in &reminders {
            Self::insert(&tx, new, now).await?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(reminders.len())
    }

    /// One reminder.
    pub async fn get(&self, id: &str) -> Result<Reminder, StoreError> {
        get_in(&self.client().await?, id).await
    }

    /// How many reminders are pending.
    pub async fn pending_count(&self) -> Result<u64, StoreError> {
        let n: i64 = self
            .client()
            .await?
            .query_one(
                "SELECT COUNT(*) FROM reminders WHERE status = $1",
                &[&Status::Pending.code()],
            )
            .await
            .map_err(db_error)?
            .get(0);
        Ok(n.max(0) as u64)
    }

    /// Reminders, optionally of one session and/or one status, soonest
    /// first.
    pub async fn list(
        &self,
        session_id: Option<&str>,
        status: Option<Status>,
    ) -> Result<Vec<Reminder>, StoreError> {
        let rows = self
            .client()
            .await?
            .query(
                &format!(
                    "SELECT {COLUMNS} FROM reminders
                     WHERE ($1::text IS NULL OR session_id = $1) AND ($2::bigint IS NULL OR status = $2)
                     ORDER BY next_due_ms IS NULL, next_due_ms, created_ms
                     LIMIT 10000"
                ),
                &[&session_id, &status.map(Status::code)],
            )
            .await
            .map_err(db_error)?;
        rows.iter().map(reminder_from_row).collect()
    }

    /// Cancels a pending reminder (of `session_id`, when given).
    pub async fn cancel(&self, id: &str, session_id: Option<&str>) -> Result<Reminder, StoreError> {
        self.change(id, |reminder| {
            if session_id.is_some_and(|s| s != reminder.session_id) {
                return Err(StoreError::NotFound(id.to_string()));
            }
            if !matches!(reminder.status, Status::Pending | Status::Paused) {
                return Err(StoreError::NotPending {
                    id: id.to_string(),
                    status: reminder.status.name(),
                });
            }
            Ok((Status::Cancelled, None))
        })
        .await
    }

    /// Pauses a pending recurring reminder, or resumes a paused one to fall
    /// due at `resume_at`.
    pub async fn set_paused(
        &self,
        id: &str,
        paused: bool,
        resume_at: DateTime<Utc>,
    ) -> Result<Reminder, StoreError> {
        self.change(id, |reminder| {
            let (_, to, next) = pause_change(reminder, paused, resume_at)?;
            Ok((to, next))
        })
        .await
    }

    /// Moves reminder `id` to the status and next due time `decide` gives
    /// it, holding its row meanwhile.
    async fn change(
        &self,
        id: &str,
        decide: impl FnOnce(&Reminder) -> Result<(Status, Option<DateTime<Utc>>), StoreError>,
    ) -> Result<Reminder, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        let row = tx
            .query_opt(
                &format!("SELECT {COLUMNS} FROM reminders WHERE id = $1 FOR UPDATE"),
                &[&id],
            )
            .await
            .map_err(db_error)?
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        let (to, next) = decide(&reminder_from_row(&row)?)?;
        tx.execute(
            "UPDATE reminders SET status = $2, next_due_ms = $3 WHERE id = $1",
            &[&id, &to.code(), &next.map(ms)],
        )
        .await
        .map_err(db_error)?;
        let reminder = get_in(&tx, id).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(reminder)
    }

    /// Records a scheduled task's run (replacing an earlier record of the
    /// same firing).
    pub async fn record_run(
        &self,
        run: &ScheduledRun,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.client()
            .await?
            .execute(
                &format!(
                    "INSERT INTO runs ({RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                     ON CONFLICT (firing_id) DO UPDATE SET recorded_ms = excluded.recorded_ms,
                       session_id = excluded.session_id, turn_id = excluded.turn_id,
                       state = excluded.state, note = excluded.note, from_seq = excluded.from_seq"
                ),
                &[
                    &run.firing_id,
                    &run.reminder_id,
                    &ms_of(run.due_time.as_ref()),
                    &ms(now),
                    &run.session_id,
                    &run.turn_id,
                    &i64::from(run.state),
                    &run.note,
                    &(run.from_seq as i64),
                ],
            )
            .await
            .map_err(db_error)?;
        Ok(())
    }

    /// Copies runs as they are (`agentry migrate`); those already here are
    /// left alone. Returns how many were new.
    pub async fn import_runs(&self, runs: &[ScheduledRun]) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        let mut new = 0;
        for run in runs {
            new += tx
                .execute(
                    &format!(
                        "INSERT INTO runs ({RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                         ON CONFLICT (firing_id) DO NOTHING"
                    ),
                    &[
                        &run.firing_id,
                        &run.reminder_id,
                        &ms_of(run.due_time.as_ref()),
                        &ms_of(run.recorded_at.as_ref()),
                        &run.session_id,
                        &run.turn_id,
                        &i64::from(run.state),
                        &run.note,
                        &(run.from_seq as i64),
                    ],
                )
                .await
                .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(new)
    }

    /// A scheduled task's runs, newest first.
    pub async fn runs(
        &self,
        reminder_id: &str,
        limit: u32,
    ) -> Result<Vec<ScheduledRun>, StoreError> {
        let rows = self
            .client()
            .await?
            .query(
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs WHERE reminder_id = $1
                     ORDER BY due_ms DESC, firing_id DESC LIMIT $2"
                ),
                &[&reminder_id, &i64::from(limit)],
            )
            .await
            .map_err(db_error)?;
        Ok(rows.iter().map(run_from_row).collect())
    }

    /// Queues deliveries (one already queued is left alone); how many were
    /// new.
    pub async fn enqueue(
        &self,
        deliveries: &[Delivery],
        now: DateTime<Utc>,
    ) -> Result<u32, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        let mut new = 0;
        for d in deliveries {
            new += tx
                .execute(
                    "INSERT INTO outbox (id, target, event, title, body, created_ms, next_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (id) DO NOTHING",
                    &[&d.id, &d.target, &d.event, &d.title, &d.body, &ms(now)],
                )
                .await
                .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(new as u32)
    }

    /// Takes up to `limit` deliveries due at `now` that no other scheduler
    /// holds, leasing each until `lease_until`.
    pub async fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Delivery>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        let rows = tx
            .query(
                "SELECT id, target, event, title, body, created_ms, attempts FROM outbox
                 WHERE state = 0 AND next_ms <= $1 ORDER BY next_ms LIMIT $2
                 FOR UPDATE SKIP LOCKED",
                &[&ms(now), &i64::from(limit)],
            )
            .await
            .map_err(db_error)?;
        let due: Vec<Delivery> = rows
            .iter()
            .map(|r| Delivery {
                id: r.get(0),
                target: r.get(1),
                event: r.get(2),
                title: r.get(3),
                body: r.get(4),
                created: from_ms(r.get(5)),
                attempts: r.get::<_, i64>(6) as u32,
            })
            .collect();
        for d in &due {
            tx.execute(
                "UPDATE outbox SET next_ms = $2 WHERE id = $1",
                &[&d.id, &ms(lease_until)],
            )
            .await
            .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(due)
    }

    /// Records an attempt: delivered, to retry at `next`, or given up.
    pub async fn delivery_attempted(
        &self,
        id: &str,
        state: DeliveryState,
        next: DateTime<Utc>,
        error: &str,
    ) -> Result<(), StoreError> {
        self.client()
            .await?
            .execute(
                "UPDATE outbox SET state = $2, next_ms = $3, attempts = attempts + 1, last_error = $4
                 WHERE id = $1",
                &[&id, &(state as i64), &ms(next), &error],
            )
            .await
            .map_err(db_error)?;
        Ok(())
    }

    /// When the next pending reminder falls due.
    pub async fn next_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let next: Option<i64> = self
            .client()
            .await?
            .query_one(
                "SELECT MIN(next_due_ms) FROM reminders WHERE status = $1",
                &[&Status::Pending.code()],
            )
            .await
            .map_err(db_error)?
            .get(0);
        Ok(next.map(from_ms))
    }

    /// Fires the pending reminders due at `now` that no other scheduler
    /// holds (at most `batch`): writes their firings and moves them on, in
    /// one transaction.
    pub async fn fire_due(
        &self,
        now: DateTime<Utc>,
        grace: chrono::Duration,
        batch: usize,
    ) -> Result<Vec<Firing>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        let due: Vec<Reminder> = tx
            .query(
                &format!(
                    "SELECT {COLUMNS} FROM reminders
                     WHERE status = $1 AND next_due_ms <= $2 ORDER BY next_due_ms LIMIT $3
                     FOR UPDATE SKIP LOCKED"
                ),
                &[&Status::Pending.code(), &ms(now), &(batch as i64)],
            )
            .await
            .map_err(db_error)?
            .iter()
            .map(reminder_from_row)
            .collect::<Result<_, _>>()?;
        let mut firings = Vec::new();
        for reminder in due {
            let Some(fell) = fall_due(&reminder, now, grace)? else {
                continue;
            };
            for firing in &fell.firings {
                let inserted = tx
                    .execute(
                        "INSERT INTO firings (firing_id, reminder_id, due_ms, fired_ms, late_ms, occurrences, snapshot_message)
                         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (firing_id) DO NOTHING",
                        &[
                            &firing.firing_id,
                            &reminder.id,
                            &ms(firing.due),
                            &ms(now),
                            &(firing.late_ms as i64),
                            &i64::from(firing.occurrences),
                            &reminder.message,
                        ],
                    )
                    .await
                    .map_err(db_error)?;
                if inserted == 1 {
                    firings.push(firing.clone());
                }
            }
            tx.execute(
                "UPDATE reminders SET next_due_ms = $2, status = $3, fire_count = fire_count + $4 WHERE id = $1",
                &[
                    &reminder.id,
                    &fell.next_due.map(ms),
                    &fell.status.code(),
                    &(fell.firings.len() as i64),
                ],
            )
            .await
            .map_err(db_error)?;
        }
        for firing in &mut firings {
            if let Ok(r) = get_in(&tx, &firing.reminder.id).await {
                firing.reminder = r;
            }
        }
        tx.commit().await.map_err(db_error)?;
        Ok(firings)
    }

    /// Firings not yet acknowledged, oldest first.
    pub async fn unacked(&self) -> Result<Vec<Firing>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT f.firing_id, f.due_ms, f.fired_ms, f.late_ms, f.occurrences, {}
                     FROM firings f JOIN reminders r ON r.id = f.reminder_id
                     WHERE NOT f.acked ORDER BY f.fired_ms, f.firing_id LIMIT 10000",
                    COLUMNS
                        .split(", ")
                        .map(|c| format!("r.{c}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                &[],
            )
            .await
            .map_err(db_error)?;
        rows.iter()
            .map(|row| {
                Ok(Firing {
                    firing_id: row.get(0),
                    reminder: reminder_at(row, 5)?,
                    due: from_ms(row.get(1)),
                    fired: from_ms(row.get(2)),
                    late_ms: row.get::<_, i64>(3).max(0) as u64,
                    occurrences: row.get::<_, i64>(4) as u32,
                })
            })
            .collect()
    }

    /// Copies reminders and firings as they are (`agentry migrate`); those
    /// already here are left alone. Returns how many of each were new.
    pub async fn import(
        &self,
        reminders: &[Reminder],
        firings: &[(Firing, bool)],
    ) -> Result<(u64, u64), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        let mut new_reminders = 0;
        for r in reminders {
            new_reminders += tx
                .execute(
                    "INSERT INTO reminders (id, session_id, message, kind, next_due_ms, cron, tz, missed, status, created_ms, fire_count, task)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (id) DO NOTHING",
                    &[
                        &r.id,
                        &r.session_id,
                        &r.message,
                        &r.kind.code(),
                        &r.next_due.map(ms),
                        &r.cron.clone().unwrap_or_default(),
                        &r.time_zone,
                        &missed_code(r.missed),
                        &r.status.code(),
                        &ms(r.created),
                        &i64::from(r.fire_count),
                        &task_bytes(r.task.as_ref()),
                    ],
                )
                .await
                .map_err(db_error)?;
        }
        let mut new_firings = 0;
        for (f, acked) in firings {
            new_firings += tx
                .execute(
                    "INSERT INTO firings (firing_id, reminder_id, due_ms, fired_ms, late_ms, occurrences, snapshot_message, acked)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (firing_id) DO NOTHING",
                    &[
                        &f.firing_id,
                        &f.reminder.id,
                        &ms(f.due),
                        &ms(f.fired),
                        &(f.late_ms as i64),
                        &i64::from(f.occurrences),
                        &f.reminder.message,
                        acked,
                    ],
                )
                .await
                .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok((new_reminders, new_firings))
    }

    /// How many reminders and firings there are.
    pub async fn counts(&self) -> Result<(u64, u64), StoreError> {
        let client = self.client().await?;
        let reminders: i64 = client
            .query_one("SELECT COUNT(*) FROM reminders", &[])
            .await
            .map_err(db_error)?
            .get(0);
        let firings: i64 = client
            .query_one("SELECT COUNT(*) FROM firings", &[])
            .await
            .map_err(db_error)?
            .get(0);
        Ok((reminders as u64, firings as u64))
    }

    /// Marks a firing delivered; false when it was not waiting.
    pub async fn ack(&self, firing_id: &str) -> Result<bool, StoreError> {
        let changed = self
            .client()
            .await?
            .execute(
                "UPDATE firings SET acked = TRUE WHERE firing_id = $1 AND NOT acked",
                &[&firing_id],
            )
            .await
            .map_err(db_error)?;
        Ok(changed == 1)
    }
}

async fn get_in(client: &impl GenericClient, id: &str) -> Result<Reminder, StoreError> {
    client
        .query_opt(
            &format!("SELECT {COLUMNS} FROM reminders WHERE id = $1"),
            &[&id],
        )
        .await
        .map_err(db_error)?
        .map(|r| reminder_from_row(&r))
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?
}
