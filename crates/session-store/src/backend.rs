//! Where the sessions are kept: the embedded SQLite file (the default, one
//! machine) or a PostgreSQL server (several replicas). The service speaks
//! to either through this one face; both keep the same contract
//! (`tests/contract.rs` runs one suite against both).

use crate::pg::PgStore;
use crate::store::{Change, Store, StoreError};
use agentry_proto::sessions::v1::{Checkpoint, Event, Session};
use std::sync::Arc;
use tokio::sync::broadcast;

/// A session store backend.
#[derive(Clone)]
pub enum Backend {
    /// SQLite: its calls block, so they run on blocking threads.
    Sqlite(Arc<Store>),
    /// PostgreSQL.
    Postgres(Arc<PgStore>),
}

/// Runs a blocking SQLite call off the async threads.
async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|e| StoreError::Unavailable(format!("store task failed: {e}")))?
}

impl Backend {
    /// Which one, for logs and health.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Creates a session with `id` (generated when empty).
    pub async fn create_session(&self, id: String, title: String) -> Result<Session, StoreError> {
        self.create(agentry_proto::sessions::v1::CreateSessionRequest {
            session_id: id,
            title,
            ..Default::default()
        })
        .await
    }

    /// Creates the session `new` describes: a sub-agent's with a parent,
    /// one working in a project directory…
    pub async fn create(
        &self,
        new: agentry_proto::sessions::v1::CreateSessionRequest,
    ) -> Result<Session, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.create(&new)).await,
            Backend::Postgres(p) => p.create(&new).await,
        }
    }

    /// Gives a session a name (empty: none), checked.
    pub async fn rename(&self, id: String, name: String) -> Result<Session, StoreError> {
        let name = crate::store::check_session_name(&name)?;
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.rename(&id, &name)).await,
            Backend::Postgres(p) => p.rename(&id, &name).await,
        }
    }

    /// Returns one session.
    pub async fn get_session(&self, id: String) -> Result<Session, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.get_session(&id)).await,
            Backend::Postgres(p) => p.get_session(&id).await,
        }
    }

    /// Lists sessions, most recently updated first, with the total.
    pub async fn list_sessions(
        &self,
        limit: u32,
        offset: u32,
        only_open_turns: bool,
    ) -> Result<(Vec<Session>, u64), StoreError> {
        match self {
            Backend::Sqlite(s) => {
                blocking(s, move |s| s.list_sessions(limit, offset, only_open_turns)).await
            }
            Backend::Postgres(p) => p.list_sessions(limit, offset, only_open_turns).await,
        }
    }

    /// Deletes a session and its log; returns how many events went.
    pub async fn delete_session(&self, id: String) -> Result<u64, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.delete_session(&id)).await,
            Backend::Postgres(p) => p.delete_session(&id).await,
        }
    }

    /// Copies a session's log up to `up_to_seq` (0: all) into a new one,
    /// which works in `project_dir` (empty: a scratch workspace), and
    /// appends the fork's own `events`, atomically.
    pub async fn fork_session(
        &self,
        id: String,
        up_to_seq: u64,
        new_id: String,
        project_dir: String,
        events: Vec<Event>,
    ) -> Result<Session, StoreError> {
        match self {
            Backend::Sqlite(s) => {
                blocking(s, move |s| {
                    s.fork_session(&id, up_to_seq, &new_id, &project_dir, events)
                })
                .await
            }
            Backend::Postgres(p) => {
                p.fork_session(&id, up_to_seq, &new_id, &project_dir, events)
                    .await
            }
        }
    }

    /// Appends at `expected_seq`, durably; returns the events as stored.
    pub async fn append(
        &self,
        session_id: String,
        expected_seq: u64,
        events: Vec<Event>,
    ) -> Result<Vec<Event>, StoreError> {
        self.append_leased(session_id, expected_seq, 0, events)
            .await
    }

    /// [`Backend::append`] by the holder of lease `lease_epoch` (0: none):
    /// refused once the session's lease moved on.
    pub async fn append_leased(
        &self,
        session_id: String,
        expected_seq: u64,
        lease_epoch: u64,
        events: Vec<Event>,
    ) -> Result<Vec<Event>, StoreError> {
        self.append_checkpointed(session_id, expected_seq, lease_epoch, events, None)
            .await
    }

    /// [`Backend::append_leased`] with the session's state after one of
    /// its events, stored in the same commit, replacing its earlier one.
    pub async fn append_checkpointed(
        &self,
        session_id: String,
        expected_seq: u64,
        lease_epoch: u64,
        events: Vec<Event>,
        checkpoint: Option<Checkpoint>,
    ) -> Result<Vec<Event>, StoreError> {
        match self {
            Backend::Sqlite(s) => {
                blocking(s, move |s| {
                    s.append_checkpointed(
                        &session_id,
                        expected_seq,
                        lease_epoch,
                        events,
                        checkpoint,
                    )
                })
                .await
            }
            Backend::Postgres(p) => {
                p.append_checkpointed(&session_id, expected_seq, lease_epoch, events, checkpoint)
                    .await
            }
        }
    }

    /// The session's checkpoint, if it has one.
    pub async fn checkpoint(&self, session_id: String) -> Result<Option<Checkpoint>, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.checkpoint(&session_id)).await,
            Backend::Postgres(p) => p.checkpoint(&session_id).await,
        }
    }

    /// Keeps orchestrator replica `instance_id` alive for `ttl_ms` more.
    pub async fn heartbeat(
        &self,
        instance_id: String,
        url: String,
        ttl_ms: u64,
    ) -> Result<(), StoreError> {
        match self {
            Backend::Sqlite(s) => {
                blocking(s, move |s| s.heartbeat(&instance_id, &url, ttl_ms)).await
            }
            Backend::Postgres(p) => p.heartbeat(&instance_id, &url, ttl_ms).await,
        }
    }

    /// Who drives `session_id` now, without taking it.
    pub async fn session_driver(
        &self,
        session_id: String,
    ) -> Result<crate::store::Lease, StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.session_driver(&session_id)).await,
            Backend::Postgres(p) => p.session_driver(&session_id).await,
        }
    }

    /// Makes `instance_id` drive `session_id` unless a live replica does.
    pub async fn acquire_session(
        &self,
        session_id: String,
        instance_id: String,
    ) -> Result<crate::store::Lease, StoreError> {
        match self {
            Backend::Sqlite(s) => {
                blocking(s, move |s| s.acquire_session(&session_id, &instance_id)).await
            }
            Backend::Postgres(p) => p.acquire_session(&session_id, &instance_id).await,
        }
    }

    /// Lets go of a session.
    pub async fn release_session(
        &self,
        session_id: String,
        instance_id: String,
        epoch: u64,
    ) -> Result<bool, StoreError> {
        match self {
            Backend::Sqlite(s) => {
                blocking(s, move |s| {
                    s.release_session(&session_id, &instance_id, epoch)
                })
                .await
            }
            Backend::Postgres(p) => p.release_session(&session_id, &instance_id, epoch).await,
        }
    }

    /// Reads up to `limit` events from `from_seq`, and whether more follow.
    pub async fn read(
        &self,
        session_id: String,
        from_seq: u64,
        limit: u32,
    ) -> Result<(Vec<Event>, bool), StoreError> {
        match self {
            Backend::Sqlite(s) => blocking(s, move |s| s.read(&session_id, from_seq, limit)).await,
            Backend::Postgres(p) => p.read(&session_id, from_seq, limit).await,
        }
    }

    /// Every change committed after this call.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        match self {
            Backend::Sqlite(s) => s.subscribe(),
            Backend::Postgres(p) => p.subscribe(),
        }
    }

    /// Append transactions committed (fewer than appends when batched).
    pub fn commits(&self) -> u64 {
        match self {
            Backend::Sqlite(s) => s.commits(),
            Backend::Postgres(p) => p.commits(),
        }
    }
}
