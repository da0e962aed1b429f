//! Databases written by earlier versions open, migrated, with nothing lost;
//! a database from a newer build is refused with a clear error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_proto::sessions::v1::{Event, ReminderDue, TurnFinished, UserMessage, event};
use agentry_session_store::store::{SCHEMA_VERSION, Store, StoreError, version_of};
use prost::Message;
use rusqlite::{Connection, params};

/// The schema the first release wrote, stamped version 1.
const FIRST_RELEASE: &str = "CREATE TABLE IF NOT EXISTS sessions (
        id TEXT PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        created_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL,
        event_count INTEGER NOT NULL DEFAULT 0,
        user_message_count INTEGER NOT NULL DEFAULT 0,
        preview TEXT NOT NULL DEFAULT '',
        forked_from TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX IF NOT EXISTS sessions_by_update ON sessions(updated_ms DESC, id);
    CREATE TABLE IF NOT EXISTS events (
        session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        time_ms INTEGER NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    PRAGMA user_version = 1;";

/// The schema later releases wrote, also stamped version 1.
const LATER_RELEASE: &str = "CREATE TABLE IF NOT EXISTS sessions (
        id TEXT PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        created_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL,
        touched INTEGER NOT NULL DEFAULT 0,
        turn_open INTEGER NOT NULL DEFAULT 0,
        event_count INTEGER NOT NULL DEFAULT 0,
        user_message_count INTEGER NOT NULL DEFAULT 0,
        preview TEXT NOT NULL DEFAULT '',
        forked_from TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX IF NOT EXISTS sessions_by_touch ON sessions(touched DESC);
    CREATE TABLE IF NOT EXISTS events (
        session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        time_ms INTEGER NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    PRAGMA user_version = 1;";

fn user(text: &str) -> event::Kind {
    event::Kind::UserMessage(UserMessage {
        text: text.into(),
        ..Default::default()
    })
}

fn finished() -> event::Kind {
    event::Kind::TurnFinished(TurnFinished::default())
}

fn reminder(kind: &str) -> event::Kind {
    // The kind as the first release wrote it.
    event::Kind::ReminderDue(ReminderDue {
        legacy_kind: kind.into(),
        ..Default::default()
    })
}

/// Writes a session and its log the way a version-1 build did.
fn write_session(conn: &Connection, id: &str, updated_ms: i64, kinds: &[(&str, event::Kind)]) {
    conn.execute(
        "INSERT INTO sessions (id, title, created_ms, updated_ms, event_count, user_message_count, preview)
         VALUES (?1, ?1, ?2, ?2, ?3, 1, ?1)",
        params![id, updated_ms, kinds.len() as i64],
    )
    .unwrap();
    for (i, (name, kind)) in kinds.iter().enumerate() {
        let event = Event {
            session_id: id.into(),
            seq: i as u64 + 1,
            turn_id: "t".into(),
            time: None,
            kind: Some(kind.clone()),
            live: false,
            by: String::new(),
        };
        conn.execute(
            "INSERT INTO events (session_id, seq, kind, turn_id, time_ms, body)
             VALUES (?1, ?2, ?3, 't', ?4, ?5)",
            params![id, i as i64 + 1, name, updated_ms, event.encode_to_vec()],
        )
        .unwrap();
    }
}

#[test]
fn a_first_release_database_is_migrated_with_nothing_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(FIRST_RELEASE).unwrap();
        write_session(
            &conn,
            "finished",
            1_000,
            &[("user_message", user("hi")), ("turn_finished", finished())],
        );
        write_session(
            &conn,
            "open",
            3_000,
            &[
                ("user_message", user("hi")),
                ("turn_finished", finished()),
                ("user_message", user("again")),
            ],
        );
        write_session(
            &conn,
            "notified",
            2_000,
            &[
                ("user_message", user("hi")),
                ("turn_finished", finished()),
                ("reminder_due", reminder("notify")),
            ],
        );
        write_session(
            &conn,
            "tasked",
            500,
            &[
                ("user_message", user("hi")),
                ("turn_finished", finished()),
                ("reminder_due", reminder("task")),
            ],
        );
    }
    assert_eq!(version_of(&path).unwrap(), Some(1));

    let store = Store::open(&path).unwrap();
    assert_eq!(version_of(&path).unwrap(), Some(SCHEMA_VERSION));
    // Listing works (it orders by the new recency stamp): newest first.
    let (all, total) = store.list_sessions(0, 0, false).unwrap();
    assert_eq!(total, 4);
    let ids: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["open", "notified", "finished", "tasked"]);
    // Open turns are found from each log's last turn boundary.
    let (open, _) = store.list_sessions(0, 0, true).unwrap();
    let mut open: Vec<&str> = open.iter().map(|s| s.id.as_str()).collect();
    open.sort();
    assert_eq!(open, ["open", "tasked"]);
    // Every event reads back, and the log grows on from where it was.
    let (events, more) = store.read("open", 1, 0).unwrap();
    assert!(!more);
    assert_eq!(events.len(), 3);
    assert_eq!(events[2].kind, Some(user("again")));
    let appended = store
        .append(
            "open",
            4,
            vec![Event {
                kind: Some(finished()),
                ..Default::default()
            }],
        )
        .unwrap();
    assert_eq!(appended[0].seq, 4);
    let (open, _) = store.list_sessions(0, 0, true).unwrap();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(store.list_sessions(0, 0, false).unwrap().0[0].id, "open");
    drop(store);

    // Opening again changes nothing.
    let store = Store::open(&path).unwrap();
    assert_eq!(store.read("open", 1, 0).unwrap().0.len(), 4);
    assert_eq!(version_of(&path).unwrap(), Some(SCHEMA_VERSION));
}

#[test]
fn a_later_version_one_database_keeps_its_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(LATER_RELEASE).unwrap();
        write_session(&conn, "a", 1_000, &[("user_message", user("hi"))]);
        // Its own stamps and flag, which the migration must not redo.
        conn.execute("UPDATE sessions SET touched = 7, turn_open = 0", [])
            .unwrap();
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(version_of(&path).unwrap(), Some(SCHEMA_VERSION));
    assert!(store.list_sessions(0, 0, true).unwrap().0.is_empty());
    let created = store.create_session("b", "").unwrap();
    let (all, _) = store.list_sessions(0, 0, false).unwrap();
    assert_eq!(all[0].id, created.id, "a new session lists first");
    assert_eq!(store.read("a", 1, 0).unwrap().0.len(), 1);
}

#[test]
fn a_newer_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE future (x); PRAGMA user_version = 99;")
        .unwrap();
    let Err(error) = Store::open(&path) else {
        panic!("a newer database was opened");
    };
    assert!(
        matches!(error, StoreError::NewerSchema { found: 99, .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("newer than this build knows"),
        "{error}"
    );
    assert_eq!(version_of(&path).unwrap(), Some(99));
}

#[test]
fn a_data_directory_that_cannot_be_made_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "not a directory").unwrap();
    let Err(error) = Store::open(&blocker.join("sessions.db")) else {
        panic!("opened under a file");
    };
    assert!(matches!(error, StoreError::Io { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("cannot create the data directory"),
        "{error}"
    );
}
