//! The store's schema and its migrations.
//!
//! `PRAGMA user_version` records the schema a database has. Opening runs,
//! in order and each in its own transaction, every migration newer than
//! that; a database written by a newer build (a version this one does not
//! know) is refused rather than guessed at.
//!
//! Versions:
//! - 0: an empty file.
//! - 1: what the first releases wrote. Some of them stamped 1 on the
//!   original tables, later ones on tables with two more columns
//!   (`touched`, `turn_open`); migration 2 tells them apart by the columns.
//! - 2: sessions ordered by a recency stamp (`touched`) and flagged while a
//!   turn is open (`turn_open`); the listing index on `touched`.
//! - 3: leases: which orchestrator replica drives each session (`owner`,
//!   `lease_epoch`) and the replicas' heartbeats (`orchestrators`).
//! - 4: the parent of a sub-agent's session (`parent_*`).
//! - 5: the project directory a session works in (`project_dir`).
//! - 6: a name people give a session (`name`, unique when set).
//! - 7: what each session's turns cost (`cost`, `currency`).
//! - 8: each session's latest checkpoint (`checkpoints`).

use super::{StoreError, kind_name};
use agentry_proto::sessions::v1::{Event, ReminderKind, event};
use prost::Message;
use rusqlite::{Connection, OptionalExtension, Transaction, params};

/// The schema this build writes.
pub const SCHEMA_VERSION: u32 = 8;

/// One step of the schema.
struct Migration {
    /// The version it brings the database to.
    version: u32,
    /// What it does, for the log.
    what: &'static str,
    apply: fn(&Transaction<'_>) -> rusqlite::Result<()>,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        what: "sessions and their event logs",
        apply: create_tables,
    },
    Migration {
        version: 2,
        what: "a recency stamp and an open-turn flag per session",
        apply: stamp_and_flag_sessions,
    },
    Migration {
        version: 3,
        what: "session leases for several orchestrators",
        apply: add_leases,
    },
    Migration {
        version: 4,
        what: "the parent of a sub-agent's session",
        apply: add_parents,
    },
    Migration {
        version: 5,
        what: "the project directory a session works in",
        apply: add_project_dirs,
    },
    Migration {
        version: 6,
        what: "session names",
        apply: add_names,
    },
    Migration {
        version: 7,
        what: "what each session's turns cost",
        apply: add_costs,
    },
    Migration {
        version: 8,
        what: "session checkpoints",
        apply: add_checkpoints,
    },
];

/// Version 8: each session's latest checkpoint (its state after one of its
/// events, as an orchestrator encodes it).
fn add_checkpoints(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE checkpoints (
            session_id TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            format INTEGER NOT NULL,
            state BLOB NOT NULL
         );",
    )
}

/// Version 7: what a session's turns cost, and in which currency.
fn add_costs(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "ALTER TABLE sessions ADD COLUMN cost REAL NOT NULL DEFAULT 0;
         ALTER TABLE sessions ADD COLUMN currency TEXT NOT NULL DEFAULT '';",
    )
}

/// Version 6: a session's name, unique among the named ones.
fn add_names(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "ALTER TABLE sessions ADD COLUMN name TEXT NOT NULL DEFAULT '';
         CREATE UNIQUE INDEX IF NOT EXISTS sessions_by_name ON sessions(name) WHERE name != '';",
    )
}

/// Version 5: the project directory of a session (empty: a scratch
/// workspace).
fn add_project_dirs(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch("ALTER TABLE sessions ADD COLUMN project_dir TEXT NOT NULL DEFAULT '';")
}

/// Version 4: the session and call a sub-agent's session works for.
fn add_parents(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "ALTER TABLE sessions ADD COLUMN parent_session TEXT NOT NULL DEFAULT '';
         ALTER TABLE sessions ADD COLUMN parent_call TEXT NOT NULL DEFAULT '';
         ALTER TABLE sessions ADD COLUMN parent_agent TEXT NOT NULL DEFAULT '';",
    )
}

/// Version 3: the driver of each session and the replicas' heartbeats.
fn add_leases(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "ALTER TABLE sessions ADD COLUMN owner TEXT NOT NULL DEFAULT '';
         ALTER TABLE sessions ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
         CREATE TABLE IF NOT EXISTS orchestrators (
            id TEXT PRIMARY KEY,
            url TEXT NOT NULL,
            expires_ms INTEGER NOT NULL
         );",
    )
}

/// Brings the database on `conn` up to [`SCHEMA_VERSION`].
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let found: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            found,
            known: SCHEMA_VERSION,
        });
    }
    for migration in MIGRATIONS.iter().filter(|m| m.version > found) {
        let tx = conn.transaction()?;
        (migration.apply)(&tx).map_err(|e| StoreError::Migration {
            version: migration.version,
            reason: e.to_string(),
        })?;
        // PRAGMA takes no parameters; the version is a number of ours.
        tx.execute_batch(&format!("PRAGMA user_version = {}", migration.version))?;
        tx.commit()?;
        if found > 0 {
            tracing::info!(
                version = migration.version,
                what = migration.what,
                "session store schema migrated"
            );
        }
    }
    Ok(())
}

/// Version 1: the tables as the first release wrote them.
fn create_tables(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS sessions (
            id TEXT PRIMARY KEY,
            title TEXT NOT NULL DEFAULT '',
            created_ms INTEGER NOT NULL,
            updated_ms INTEGER NOT NULL,
            event_count INTEGER NOT NULL DEFAULT 0,
            user_message_count INTEGER NOT NULL DEFAULT 0,
            preview TEXT NOT NULL DEFAULT '',
            forked_from TEXT NOT NULL DEFAULT ''
        );
        CREATE TABLE IF NOT EXISTS events (
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            turn_id TEXT NOT NULL,
            time_ms INTEGER NOT NULL,
            body BLOB NOT NULL,
            PRIMARY KEY (session_id, seq)
        ) WITHOUT ROWID;",
    )
}

fn has_column(tx: &Transaction<'_>, table: &str, column: &str) -> rusqlite::Result<bool> {
    let mut stmt = tx.prepare(&format!("PRAGMA table_info({table})"))?;
    let names = stmt.query_map([], |r| r.get::<_, String>(1))?;
    for name in names {
        if name? == column {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Version 2: `touched` (listing order: the updated time of each session at
/// the migration, then a counter) and `turn_open` (from each log's last
/// turn boundary), where a version-1 database lacks them.
fn stamp_and_flag_sessions(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    if !has_column(tx, "sessions", "touched")? {
        tx.execute_batch(
            "ALTER TABLE sessions ADD COLUMN touched INTEGER NOT NULL DEFAULT 0;
             UPDATE sessions SET touched = updated_ms;",
        )?;
    }
    if !has_column(tx, "sessions", "turn_open")? {
        tx.execute_batch("ALTER TABLE sessions ADD COLUMN turn_open INTEGER NOT NULL DEFAULT 0;")?;
        let ids: Vec<String> = tx
            .prepare("SELECT id FROM sessions")?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        for id in ids {
            if last_turn_is_open(tx, &id)? {
                tx.execute("UPDATE sessions SET turn_open = 1 WHERE id = ?1", [&id])?;
            }
        }
    }
    tx.execute_batch(
        "DROP INDEX IF EXISTS sessions_by_update;
         CREATE INDEX IF NOT EXISTS sessions_by_touch ON sessions(touched DESC);",
    )
}

/// Whether a session's log ends inside a turn: its last turn boundary is a
/// user message or a task reminder, not a turn's end.
fn last_turn_is_open(tx: &Transaction<'_>, session_id: &str) -> rusqlite::Result<bool> {
    let boundary = |kind: &event::Kind| -> Option<bool> {
        match kind {
            event::Kind::UserMessage(_) => Some(true),
            event::Kind::ReminderDue(r) if r.reminder_kind() == ReminderKind::Task => Some(true),
            event::Kind::TurnFinished(_) => Some(false),
            _ => None,
        }
    };
    let names = [
        kind_name(&event::Kind::UserMessage(Default::default())),
        kind_name(&event::Kind::ReminderDue(Default::default())),
        kind_name(&event::Kind::TurnFinished(Default::default())),
    ];
    let mut stmt = tx.prepare(
        "SELECT body FROM events WHERE session_id = ?1 AND kind IN (?2, ?3, ?4)
         ORDER BY seq DESC",
    )?;
    let mut rows = stmt.query(params![session_id, names[0], names[1], names[2]])?;
    while let Some(row) = rows.next()? {
        let body: Vec<u8> = row.get(0)?;
        // An undecodable event is left for reads to report as corrupt.
        if let Some(open) = Event::decode(body.as_slice())
            .ok()
            .and_then(|e| e.kind)
            .and_then(|k| boundary(&k))
        {
            return Ok(open);
        }
    }
    Ok(false)
}

/// The schema version of the database at `path`, if it has one (tests and
/// diagnostics).
pub fn version_of(path: &std::path::Path) -> Result<Option<u32>, StoreError> {
    let conn = Connection::open(path)?;
    Ok(conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .optional()?)
}
