//! The PostgreSQL schema and its migrations, applied at start-up under an
//! advisory lock so that replicas starting together apply each once.

use super::db_error;
use crate::store::StoreError;

/// Migrations, in order; a database records which it has had.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        created_ms BIGINT NOT NULL,
        updated_ms BIGINT NOT NULL,
        event_count BIGINT NOT NULL DEFAULT 0,
        user_message_count BIGINT NOT NULL DEFAULT 0,
        preview TEXT NOT NULL DEFAULT '',
        forked_from TEXT NOT NULL DEFAULT '',
        turn_open BOOLEAN NOT NULL DEFAULT FALSE,
        touched BIGINT NOT NULL
     );
     CREATE SEQUENCE sessions_touched;
     CREATE INDEX sessions_by_touched ON sessions (touched DESC);
     CREATE TABLE events (
        session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        seq BIGINT NOT NULL,
        kind TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        time_ms BIGINT NOT NULL,
        body BYTEA NOT NULL,
        PRIMARY KEY (session_id, seq)
     );",
    ),
    (
        2,
        "ALTER TABLE sessions ADD COLUMN owner TEXT NOT NULL DEFAULT '';
         ALTER TABLE sessions ADD COLUMN lease_epoch BIGINT NOT NULL DEFAULT 0;
         CREATE TABLE orchestrators (
            id TEXT PRIMARY KEY,
            url TEXT NOT NULL,
            expires_ms BIGINT NOT NULL
         );",
    ),
    (
        3,
        "ALTER TABLE sessions ADD COLUMN parent_session TEXT NOT NULL DEFAULT '';
         ALTER TABLE sessions ADD COLUMN parent_call TEXT NOT NULL DEFAULT '';
         ALTER TABLE sessions ADD COLUMN parent_agent TEXT NOT NULL DEFAULT '';",
    ),
    (
        4,
        "ALTER TABLE sessions ADD COLUMN project_dir TEXT NOT NULL DEFAULT '';",
    ),
    (
        5,
        "ALTER TABLE sessions ADD COLUMN name TEXT NOT NULL DEFAULT '';
         CREATE UNIQUE INDEX sessions_by_name ON sessions (name) WHERE name <> '';",
    ),
    (
        6,
        "ALTER TABLE sessions ADD COLUMN cost DOUBLE PRECISION NOT NULL DEFAULT 0;
         ALTER TABLE sessions ADD COLUMN currency TEXT NOT NULL DEFAULT '';",
    ),
    (
        7,
        "CREATE TABLE checkpoints (
            session_id TEXT PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
            seq BIGINT NOT NULL,
            format BIGINT NOT NULL,
            state BYTEA NOT NULL
         );",
    ),
];

/// The newest schema this build knows.
pub const SCHEMA_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// A key of our own for `pg_advisory_xact_lock` ("agentry-sessions").
const LOCK_KEY: i64 = 0x6167_656e_7472_7931;

/// Applies the migrations the database has not had, each in the same
/// transaction as the record of it.
pub async fn migrate(client: &mut deadpool_postgres::Object) -> Result<(), StoreError> {
    let tx = client.transaction().await.map_err(db_error)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
        .await
        .map_err(db_error)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS agentry_session_store_schema (
            version INTEGER PRIMARY KEY,
            applied_ms BIGINT NOT NULL
         )",
    )
    .await
    .map_err(db_error)?;
    let current: i32 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM agentry_session_store_schema",
            &[],
        )
        .await
        .map_err(db_error)?
        .get(0);
    if current > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            found: current as u32,
            known: SCHEMA_VERSION as u32,
        });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        tx.batch_execute(sql)
            .await
            .map_err(|e| StoreError::Migration {
                version: *version as u32,
                reason: e.to_string(),
            })?;
        tx.execute(
            "INSERT INTO agentry_session_store_schema (version, applied_ms) VALUES ($1, $2)",
            &[version, &crate::store::now_ms()],
        )
        .await
        .map_err(db_error)?;
        tracing::info!(version, "session store: PostgreSQL schema migrated");
    }
    tx.commit().await.map_err(db_error)
}
