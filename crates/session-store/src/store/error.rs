//! What can go wrong in the store, and which failures are worth a retry.

use std::path::PathBuf;

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The session does not exist.
    #[error("session {0:?} not found")]
    NotFound(String),
    /// The session already exists.
    #[error("session {0:?} already exists")]
    AlreadyExists(String),
    /// Another session has the name.
    #[error("the name {name:?} is taken by session {by}; choose another")]
    NameTaken {
        /// The name.
        name: String,
        /// The session that has it.
        by: String,
    },
    /// An append did not start at the log's next seq.
    #[error(
        "append to session {session_id:?} expected next seq {expected} but the log's next seq is {actual}"
    )]
    Conflict {
        /// The session.
        session_id: String,
        /// The seq the caller expected.
        expected: u64,
        /// The log's actual next seq.
        actual: u64,
    },
    /// The caller's lease on the session was taken over by another
    /// orchestrator: it must not write to the session any more.
    #[error(
        "session {session_id:?} is now driven by another orchestrator (lease epoch {current}, the append carried {epoch})"
    )]
    LeaseLost {
        /// The session.
        session_id: String,
        /// The epoch the append carried.
        epoch: u64,
        /// The session's epoch now.
        current: u64,
    },
    /// An orchestrator replica asked for a session without a live
    /// heartbeat: the others would take it back at once.
    #[error(
        "orchestrator replica {0:?} has no live heartbeat in the store: it cannot take sessions"
    )]
    NoHeartbeat(String),
    /// The request is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// SQLite failed.
    #[error("database error: {0}")]
    Database(#[from] rusqlite::Error),
    /// PostgreSQL refused a statement.
    #[error("database error: {0}")]
    Postgres(String),
    /// The database cannot be reached now (PostgreSQL down, restarting, out
    /// of connections); the same call may succeed later.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// The store's files cannot be created or opened.
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The database was written by a newer build.
    #[error(
        "the database has schema version {found}, newer than this build knows ({known}); \
         run the version of Agentry that wrote it, or a newer one"
    )]
    NewerSchema {
        /// The database's version.
        found: u32,
        /// The newest version this build knows.
        known: u32,
    },
    /// A schema migration failed (the database is left at the version
    /// before it).
    #[error("migrating the database to schema version {version} failed: {reason}")]
    Migration {
        /// The version it was migrating to.
        version: u32,
        /// What failed.
        reason: String,
    },
    /// A stored event could not be decoded.
    #[error("stored event {session_id}/{seq} is corrupt: {reason}")]
    Corrupt {
        /// The session.
        session_id: String,
        /// The seq.
        seq: u64,
        /// The decode error.
        reason: String,
    },
}

impl StoreError {
    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Database(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ),
            StoreError::Database(_) | StoreError::Postgres(_) => false,
            StoreError::Unavailable(_) => true,
            StoreError::NotFound(_)
            | StoreError::AlreadyExists(_)
            | StoreError::NameTaken { .. }
            | StoreError::Conflict { .. }
            | StoreError::LeaseLost { .. }
            | StoreError::NoHeartbeat(_)
            | StoreError::InvalidArgument(_)
            | StoreError::Io { .. }
            | StoreError::NewerSchema { .. }
            | StoreError::Migration { .. }
            | StoreError::Corrupt { .. } => false,
        }
    }
}
