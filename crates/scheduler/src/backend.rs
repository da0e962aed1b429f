//! Where reminders are kept: SQLite in the data directory (one scheduler),
//! or PostgreSQL (several schedulers sharing the work).

use crate::pg::PgStore;
use crate::store::{
    Delivery, DeliveryState, Firing, NewReminder, Reminder, Status, Store, StoreError,
};
use agentry_proto::scheduler::v1::ScheduledRun;
use chrono::{DateTime, Utc};
use std::sync::Arc;

/// A scheduler store backend.
#[derive(Clone)]
pub enum Backend {
    /// SQLite: its calls block, so they run on blocking threads.
    Sqlite(Arc<Store>),
    /// PostgreSQL.
    Postgres(Arc<PgStore>),
}

async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|e| StoreError::Unavailable(format!("scheduler task failed: {e}")))?
}

impl Backend {
    /// Which one, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Whether other schedulers may share the reminders (then nobody tells
    /// this one about reminders they add, and it looks again often).
    pub fn shared(&self) -> bool {
        matches!(self, Backend::Postgres(_))
    }

    /// Stores a new reminder.
    pub async fn create(
        &self,
        new: NewReminder,
        now: DateTime<Utc>,
    ) -> Result<Reminder, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.create(new, now)).await,
            Backend::Postgres(p) => p.create(new, now).await,
        }
    }

    /// Stores many reminders in one transaction.
    pub async fn create_many(
        &self,
        reminders: Vec<NewReminder>,
        now: DateTime<Utc>,
    ) -> Result<usize, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.create_many(reminders, now)).await,
            Backend::Postgres(p) => p.create_many(reminders, now).await,
        }
    }

    /// One reminder.
    pub async fn get(&self, id: String) -> Result<Reminder, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.get(&id)).await,
            Backend::Postgres(p) => p.get(&id).await,
        }
    }

    /// How many reminders are pending.
    pub async fn pending_count(&self) -> Result<u64, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, |s| s.pending_count()).await,
            Backend::Postgres(p) => p.pending_count().await,
        }
    }

    /// Reminders, optionally of one session and/or status, soonest first.
    pub async fn list(
        &self,
        session_id: Option<String>,
        status: Option<Status>,
    ) -> Result<Vec<Reminder>, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.list(session_id.as_deref(), status)).await,
            Backend::Postgres(p) => p.list(session_id.as_deref(), status).await,
        }
    }

    /// Cancels a pending reminder (of `session_id`, when given).
    pub async fn cancel(
        &self,
        id: String,
        session_id: Option<String>,
    ) -> Result<Reminder, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.cancel(&id, session_id.as_deref())).await,
            Backend::Postgres(p) => p.cancel(&id, session_id.as_deref()).await,
        }
    }

    /// Pauses a pending recurring reminder, or resumes a paused one to fall
    /// due at `resume_at`.
    pub async fn set_paused(
        &self,
        id: String,
        paused: bool,
        resume_at: DateTime<Utc>,
    ) -> Result<Reminder, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.set_paused(&id, paused, resume_at)).await,
            Backend::Postgres(p) => p.set_paused(&id, paused, resume_at).await,
        }
    }

    /// Records a scheduled task's run.
    pub async fn record_run(
        &self,
        run: ScheduledRun,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.record_run(&run, now)).await,
            Backend::Postgres(p) => p.record_run(&run, now).await,
        }
    }

    /// A scheduled task's runs, newest first.
    pub async fn runs(
        &self,
        reminder_id: String,
        limit: u32,
    ) -> Result<Vec<ScheduledRun>, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.runs(&reminder_id, limit)).await,
            Backend::Postgres(p) => p.runs(&reminder_id, limit).await,
        }
    }

    /// Queues deliveries; how many were new.
    pub async fn enqueue(
        &self,
        deliveries: Vec<Delivery>,
        now: DateTime<Utc>,
    ) -> Result<u32, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.enqueue(&deliveries, now)).await,
            Backend::Postgres(p) => p.enqueue(&deliveries, now).await,
        }
    }

    /// Takes due deliveries, leased until `lease_until`.
    pub async fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Delivery>, StoreError> {
        match self {
            Backend::Sqlite(s) => {
                blocking(s, move |s| s.claim_deliveries(now, lease_until, limit)).await
            }
            Backend::Postgres(p) => p.claim_deliveries(now, lease_until, limit).await,
        }
    }

    /// Records a delivery attempt.
    pub async fn delivery_attempted(
        &self,
        id: String,
        state: DeliveryState,
        next: DateTime<Utc>,
        error: String,
    ) -> Result<(), StoreError> {
        match self {
            Backend::Sqlite(s) => {
                blocking(s, move |s| s.delivery_attempted(&id, state, next, &error)).await
            }
            Backend::Postgres(p) => p.delivery_attempted(&id, state, next, &error).await,
        }
    }

    /// When the next pending reminder falls due.
    pub async fn next_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, |s| s.next_due()).await,
            Backend::Postgres(p) => p.next_due().await,
        }
    }

    /// Fires what is due at `now` (at most `batch`).
    pub async fn fire_due(
        &self,
        now: DateTime<Utc>,
        grace: chrono::Duration,
        batch: usize,
    ) -> Result<Vec<Firing>, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.fire_due(now, grace, batch)).await,
            Backend::Postgres(p) => p.fire_due(now, grace, batch).await,
        }
    }

    /// Firings not yet acknowledged, oldest first.
    pub async fn unacked(&self) -> Result<Vec<Firing>, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, |s| s.unacked()).await,
            Backend::Postgres(p) => p.unacked().await,
        }
    }

    /// Marks a firing delivered.
    pub async fn ack(&self, firing_id: String) -> Result<bool, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.ack(&firing_id)).await,
            Backend::Postgres(p) => p.ack(&firing_id).await,
        }
    }
}
