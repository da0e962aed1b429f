//! The SQLite event store: sessions plus an append-only, gap-free event log
//! per session. Appends are durable (`synchronous=FULL` in WAL mode) before
//! they return.

use agentry_proto::sessions::v1::{Event, Session, event};
use prost::Message;
use rusqlite::{Connection, OptionalExtension, params};
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::broadcast;

/// The longest title or preview kept, in characters.
const PREVIEW_CHARS: usize = 120;
/// The most events one `append` may carry.
pub const MAX_APPEND_EVENTS: usize = 10_000;
/// The most events one `read` returns.
pub const MAX_READ_EVENTS: u32 = 10_000;

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The session does not exist.
    #[error("session {0:?} not found")]
    NotFound(String),
    /// The session already exists.
    #[error("session {0:?} already exists")]
    AlreadyExists(String),
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
    /// The request is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// SQLite failed.
    #[error("database error: {0}")]
    Database(#[from] rusqlite::Error),
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
            StoreError::Database(_) => false,
            StoreError::NotFound(_)
            | StoreError::AlreadyExists(_)
            | StoreError::Conflict { .. }
            | StoreError::InvalidArgument(_)
            | StoreError::Corrupt { .. } => false,
        }
    }
}

/// A change to the store, broadcast to watchers after it is committed.
#[derive(Debug, Clone)]
pub enum Change {
    /// Events appended in one call.
    Appended(Arc<Vec<Event>>),
    /// A session was deleted.
    Deleted(String),
}

/// Checkpoints the WAL from its own connection and thread, off the append
/// path: PASSIVE, so it never blocks writers, every 200 ms.
struct Checkpointer {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    const EVERY: std::time::Duration = std::time::Duration::from_millis(200);

    fn start(path: &Path) -> Result<Checkpointer, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("wal-checkpoint".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(Self::EVERY)
                {
                    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                    {
                        tracing::warn!(error = %e, "WAL checkpoint failed; retrying");
                    }
                }
                // A last full one, so a clean stop leaves a short WAL.
                let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
            })
            .map_err(|e| {
                StoreError::InvalidArgument(format!("cannot start the checkpoint thread: {e}"))
            })?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

type Slot = Arc<Mutex<Option<Result<Vec<Event>, StoreError>>>>;

/// An append waiting for the next group commit.
struct QueuedAppend {
    session_id: String,
    expected_seq: u64,
    events: Vec<Event>,
    /// Where its committer leaves the result.
    slot: Slot,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The store. Cheap to share behind an `Arc`; every method blocks on SQLite,
/// so async callers run them on a blocking thread.
pub struct Store {
    writer: Mutex<Connection>,
    /// Appends waiting for a commit; whoever holds the writer commits all of
    /// them in one transaction (one fsync): group commit.
    queue: Mutex<Vec<QueuedAppend>>,
    /// Transactions committed by appends (fewer than appends when batched).
    commits: std::sync::atomic::AtomicU64,
    _checkpointer: Checkpointer,
    reader: Mutex<Connection>,
    changes: broadcast::Sender<Change>,
    /// The last recency stamp given out: listings sort by it, so sessions
    /// touched within the same millisecond still list in write order.
    touched: AtomicI64,
}

/// Checks a session id: 1–64 letters, digits, `-` or `_`.
pub fn validate_session_id(id: &str) -> Result<(), StoreError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidArgument(format!(
            "invalid session id {id:?}: use 1-64 letters, digits, '-' or '_'"
        )))
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Milliseconds since the epoch as a protobuf timestamp.
pub fn timestamp_from_ms(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

fn ms_from_timestamp(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds * 1000 + i64::from(ts.nanos / 1_000_000)
}

/// The stable name of an event's kind, kept in its own column.
pub fn kind_name(kind: &event::Kind) -> &'static str {
    match kind {
        event::Kind::UserMessage(_) => "user_message",
        event::Kind::ModelTextDelta(_) => "model_text_delta",
        event::Kind::ModelMessage(_) => "model_message",
        event::Kind::ToolCallRequested(_) => "tool_call_requested",
        event::Kind::ApprovalRequested(_) => "approval_requested",
        event::Kind::ApprovalDecided(_) => "approval_decided",
        event::Kind::ToolOutputChunk(_) => "tool_output_chunk",
        event::Kind::ToolResult(_) => "tool_result",
        event::Kind::ReminderDue(_) => "reminder_due",
        event::Kind::Error(_) => "error",
        event::Kind::TurnFinished(_) => "turn_finished",
        event::Kind::CancelRequested(_) => "cancel_requested",
        event::Kind::SkillsetChosen(_) => "skillset_chosen",
        event::Kind::ContextCompacted(_) => "context_compacted",
        event::Kind::PlanSubmitted(_) => "plan_submitted",
        event::Kind::PlanStepUpdated(_) => "plan_step_updated",
        event::Kind::ToolCallState(_) => "tool_call_state",
    }
}

fn preview_of(text: &str) -> String {
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    let mut out: String = line.chars().take(PREVIEW_CHARS).collect();
    if line.chars().count() > PREVIEW_CHARS {
        out.push('…');
    }
    out
}

const SESSION_COLUMNS: &str = "id, title, created_ms, updated_ms, event_count, user_message_count, preview, forked_from, turn_open";

fn session_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Session> {
    Ok(Session {
        id: row.get(0)?,
        title: row.get(1)?,
        created_at: Some(timestamp_from_ms(row.get(2)?)),
        updated_at: Some(timestamp_from_ms(row.get(3)?)),
        event_count: row.get::<_, i64>(4)? as u64,
        user_message_count: row.get::<_, i64>(5)? as u64,
        preview: row.get(6)?,
        forked_from: row.get(7)?,
        turn_open: row.get::<_, i64>(8)? != 0,
    })
}

impl Store {
    /// Opens (creating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            agentry_runtime::datadir::prepare_dir(parent).map_err(|e| {
                StoreError::InvalidArgument(format!(
                    "cannot create data directory {}: {e}",
                    parent.display()
                ))
            })?;
        }
        agentry_runtime::datadir::prepare_file(path).map_err(|e| {
            StoreError::InvalidArgument(format!("cannot create {}: {e}", path.display()))
        })?;
        let writer = Connection::open(path)?;
        writer.busy_timeout(std::time::Duration::from_secs(5))?;
        writer.pragma_update(None, "journal_mode", "WAL")?;
        writer.pragma_update(None, "synchronous", "FULL")?;
        writer.pragma_update(None, "foreign_keys", "ON")?;
        // Checkpoints copy the WAL into the database and fsync it: done
        // inline they stall whichever append crosses the threshold, for tens
        // or hundreds of milliseconds. A background thread does them instead.
        // A large automatic threshold stays as a safety net should the
        // thread fall behind (about 40 MB of WAL).
        writer.pragma_update(None, "wal_autocheckpoint", 10_000)?;
        writer.execute_batch(
            "CREATE TABLE IF NOT EXISTS sessions (
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
            PRAGMA user_version = 1;",
        )?;
        let touched: i64 =
            writer.query_row("SELECT COALESCE(MAX(touched), 0) FROM sessions", [], |r| {
                r.get(0)
            })?;
        let reader = Connection::open(path)?;
        reader.busy_timeout(std::time::Duration::from_secs(5))?;
        let checkpointer = Checkpointer::start(path)?;
        let (changes, _) = broadcast::channel(1024);
        Ok(Store {
            writer: Mutex::new(writer),
            queue: Mutex::new(Vec::new()),
            commits: std::sync::atomic::AtomicU64::new(0),
            _checkpointer: checkpointer,
            reader: Mutex::new(reader),
            changes,
            touched: AtomicI64::new(touched),
        })
    }

    /// Append transactions committed so far: with appends arriving
    /// together, fewer than the appends (one fsync serves many).
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// The next recency stamp (called with the write lock held).
    fn touch(&self) -> i64 {
        self.touched.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn writer(&self) -> MutexGuard<'_, Connection> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reader(&self) -> MutexGuard<'_, Connection> {
        self.reader.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Receives every change committed after this call, appends in commit
    /// (and so seq) order; a watcher that lags and misses some fills the
    /// gap from the log.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// Creates a session with `id` (generated when empty).
    pub fn create_session(&self, id: &str, title: &str) -> Result<Session, StoreError> {
        let id = if id.is_empty() {
            uuid::Uuid::now_v7().to_string()
        } else {
            validate_session_id(id)?;
            id.to_string()
        };
        let now = now_ms();
        let title = preview_of(title);
        let conn = self.writer();
        let inserted = conn.execute(
            "INSERT INTO sessions (id, title, created_ms, updated_ms, touched)
             VALUES (?1, ?2, ?3, ?3, ?4) ON CONFLICT(id) DO NOTHING",
            params![id, title, now, self.touch()],
        )?;
        if inserted == 0 {
            return Err(StoreError::AlreadyExists(id));
        }
        Self::session_in(&conn, &id)
    }

    fn session_in(conn: &Connection, id: &str) -> Result<Session, StoreError> {
        conn.query_row(
            &format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?1"),
            [id],
            session_from_row,
        )
        .optional()?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }

    /// Returns one session.
    pub fn get_session(&self, id: &str) -> Result<Session, StoreError> {
        Self::session_in(&self.reader(), id)
    }

    /// Lists sessions, most recently updated first, with the total count.
    pub fn list_sessions(
        &self,
        limit: u32,
        offset: u32,
        only_open_turns: bool,
    ) -> Result<(Vec<Session>, u64), StoreError> {
        let limit = match limit {
            0 => 50,
            n => n.min(1000),
        };
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE turn_open >= ?3 ORDER BY touched DESC LIMIT ?1 OFFSET ?2"
        ))?;
        let sessions = stmt
            .query_map(
                params![limit, offset, i64::from(only_open_turns)],
                session_from_row,
            )?
            .collect::<Result<Vec<_>, _>>()?;
        let total: i64 = conn.query_row(
            "SELECT COUNT(*) FROM sessions WHERE turn_open >= ?1",
            [i64::from(only_open_turns)],
            |r| r.get(0),
        )?;
        Ok((sessions, total as u64))
    }

    /// Deletes a session and its log; returns how many events went with it.
    pub fn delete_session(&self, id: &str) -> Result<u64, StoreError> {
        let mut conn = self.writer();
        let tx = conn.transaction()?;
        let count: Option<i64> = tx
            .query_row(
                "SELECT event_count FROM sessions WHERE id = ?1",
                [id],
                |r| r.get(0),
            )
            .optional()?;
        let Some(count) = count else {
            return Err(StoreError::NotFound(id.to_string()));
        };
        tx.execute("DELETE FROM events WHERE session_id = ?1", [id])?;
        tx.execute("DELETE FROM sessions WHERE id = ?1", [id])?;
        tx.commit()?;
        drop(conn);
        let _ = self.changes.send(Change::Deleted(id.to_string()));
        Ok(count as u64)
    }

    /// Copies a session's events up to `up_to_seq` (0: all) into a new session.
    pub fn fork_session(
        &self,
        id: &str,
        up_to_seq: u64,
        new_id: &str,
    ) -> Result<Session, StoreError> {
        let new_id = if new_id.is_empty() {
            uuid::Uuid::now_v7().to_string()
        } else {
            validate_session_id(new_id)?;
            new_id.to_string()
        };
        let mut conn = self.writer();
        let tx = conn.transaction()?;
        let source = Self::session_in(&tx, id)?;
        let last = if up_to_seq == 0 {
            source.event_count
        } else if up_to_seq > source.event_count {
            return Err(StoreError::InvalidArgument(format!(
                "cannot fork session {id:?} at seq {up_to_seq}: its log ends at seq {}",
                source.event_count
            )));
        } else {
            up_to_seq
        };
        let now = now_ms();
        let inserted = tx.execute(
            "INSERT INTO sessions (id, title, created_ms, updated_ms, forked_from, touched)
             VALUES (?1, ?2, ?3, ?3, ?4, ?5) ON CONFLICT(id) DO NOTHING",
            params![new_id, source.title, now, id, self.touch()],
        )?;
        if inserted == 0 {
            return Err(StoreError::AlreadyExists(new_id));
        }
        let events = Self::read_in(&tx, id, 1, last)?;
        let renamed: Vec<Event> = events
            .into_iter()
            .map(|mut e| {
                e.session_id = new_id.clone();
                e
            })
            .collect();
        Self::insert_events(&tx, &new_id, 0, &renamed, now, self.touch())?;
        let session = Self::session_in(&tx, &new_id)?;
        tx.commit()?;
        Ok(session)
    }

    /// Appends `events` at seq `expected_seq`.. atomically and durably, and
    /// returns them as stored (with session id and seq set).
    pub fn append(
        &self,
        session_id: &str,
        expected_seq: u64,
        events: Vec<Event>,
    ) -> Result<Vec<Event>, StoreError> {
        if events.is_empty() {
            return Err(StoreError::InvalidArgument(
                "append needs at least one event".into(),
            ));
        }
        if events.len() > MAX_APPEND_EVENTS {
            return Err(StoreError::InvalidArgument(format!(
                "append carries {} events; at most {MAX_APPEND_EVENTS} per call",
                events.len()
            )));
        }
        if let Some(i) = events.iter().position(|e| e.kind.is_none()) {
            return Err(StoreError::InvalidArgument(format!(
                "event {i} of the append has no kind"
            )));
        }
        let slot: Slot = Arc::default();
        lock(&self.queue).push(QueuedAppend {
            session_id: session_id.to_string(),
            expected_seq,
            events,
            slot: slot.clone(),
        });
        // Wait for the writer. Whoever held it meanwhile may have committed
        // this append with its own; if not, this thread commits everything
        // queued so far, its own append included.
        let mut conn = self.writer();
        if let Some(result) = lock(&slot).take() {
            return result;
        }
        let mut batch = std::mem::take(&mut *lock(&self.queue));
        let results = self.commit_batch(&mut conn, &mut batch);
        // Results are handed out, and watchers told in log order, before the
        // writer is released: the next holder finds its result waiting.
        for (queued, result) in batch.into_iter().zip(results) {
            if let Ok(events) = &result {
                // No watcher is fine: the send fails only when nobody listens.
                let _ = self
                    .changes
                    .send(Change::Appended(Arc::new(events.clone())));
            }
            *lock(&queued.slot) = Some(result);
        }
        drop(conn);
        lock(&slot).take().unwrap_or_else(|| {
            Err(StoreError::Database(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_INTERNAL),
                Some("an append was lost from its batch".into()),
            )))
        })
    }

    /// Runs queued appends in one transaction, each in a savepoint so that a
    /// refused one leaves the others alone; one commit makes them durable.
    fn commit_batch(
        &self,
        conn: &mut Connection,
        batch: &mut [QueuedAppend],
    ) -> Vec<Result<Vec<Event>, StoreError>> {
        // Every append of the batch fails with the transaction's error.
        let size = batch.len();
        let failed_all = |e: &rusqlite::Error| {
            (0..size)
                .map(|_| {
                    Err(StoreError::Database(match e {
                        rusqlite::Error::SqliteFailure(code, message) => {
                            rusqlite::Error::SqliteFailure(*code, message.clone())
                        }
                        other => rusqlite::Error::SqliteFailure(
                            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
                            Some(other.to_string()),
                        ),
                    }))
                })
                .collect()
        };
        let mut tx = match conn.transaction() {
            Ok(tx) => tx,
            Err(e) => return failed_all(&e),
        };
        let now = now_ms();
        let mut results = Vec::with_capacity(batch.len());
        for queued in batch.iter_mut() {
            let events = std::mem::take(&mut queued.events);
            let result = tx.savepoint().map_err(StoreError::from).and_then(|sp| {
                let events =
                    self.append_in(&sp, &queued.session_id, queued.expected_seq, events, now)?;
                sp.commit()?;
                Ok(events)
            });
            let failed = result.is_err();
            results.push(result);
            if failed && tx.is_autocommit() {
                // SQLite rolled the whole transaction back (disk full, I/O
                // error): nothing of this batch is stored; stop here rather
                // than let later savepoints commit on their own.
                let e = rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                    Some("the batch's transaction was rolled back".into()),
                );
                return failed_all(&e);
            }
        }
        if results.iter().all(Result::is_err) {
            // Nothing to make durable: no commit, no fsync.
            return results;
        }
        match tx.commit() {
            Ok(()) => {
                self.commits.fetch_add(1, Ordering::Relaxed);
                results
            }
            Err(e) => failed_all(&e),
        }
    }

    fn append_in(
        &self,
        tx: &Connection,
        session_id: &str,
        expected_seq: u64,
        mut events: Vec<Event>,
        now: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let count: Option<i64> = tx
            .query_row(
                "SELECT event_count FROM sessions WHERE id = ?1",
                [session_id],
                |r| r.get(0),
            )
            .optional()?;
        let Some(count) = count else {
            return Err(StoreError::NotFound(session_id.to_string()));
        };
        let actual = count as u64 + 1;
        if expected_seq != actual {
            return Err(StoreError::Conflict {
                session_id: session_id.to_string(),
                expected: expected_seq,
                actual,
            });
        }
        for (i, e) in events.iter_mut().enumerate() {
            e.session_id = session_id.to_string();
            e.seq = actual + i as u64;
            if e.time.is_none() {
                e.time = Some(timestamp_from_ms(now));
            }
        }
        Self::insert_events(tx, session_id, count as u64, &events, now, self.touch())?;
        Ok(events)
    }

    fn insert_events(
        tx: &Connection,
        session_id: &str,
        count_before: u64,
        events: &[Event],
        now: i64,
        touched: i64,
    ) -> Result<(), StoreError> {
        let mut user_messages = 0i64;
        // The last turn boundary in the batch decides; none keeps the flag.
        let mut turn_open: Option<bool> = None;
        let mut first_user_text: Option<&str> = None;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO events (session_id, seq, kind, turn_id, time_ms, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for e in events {
                let Some(kind) = &e.kind else { continue };
                match kind {
                    event::Kind::UserMessage(m) => {
                        user_messages += 1;
                        first_user_text.get_or_insert(m.text.as_str());
                        turn_open = Some(true);
                    }
                    event::Kind::TurnFinished(_) => turn_open = Some(false),
                    event::Kind::ReminderDue(r) if r.kind == "task" => turn_open = Some(true),
                    _ => {}
                }
                let time = e.time.as_ref().map(ms_from_timestamp).unwrap_or(now);
                insert.execute(params![
                    session_id,
                    e.seq as i64,
                    kind_name(kind),
                    e.turn_id,
                    time,
                    e.encode_to_vec()
                ])?;
            }
        }
        let preview = first_user_text.map(preview_of).unwrap_or_default();
        tx.execute(
            "UPDATE sessions SET
                event_count = ?2,
                updated_ms = ?3,
                touched = ?6,
                user_message_count = user_message_count + ?4,
                preview = CASE WHEN preview = '' THEN ?5 ELSE preview END,
                title = CASE WHEN title = '' THEN ?5 ELSE title END,
                turn_open = COALESCE(?7, turn_open)
             WHERE id = ?1",
            params![
                session_id,
                (count_before + events.len() as u64) as i64,
                now,
                user_messages,
                preview,
                touched,
                turn_open.map(i64::from)
            ],
        )?;
        Ok(())
    }

    /// Reads up to `limit` events from `from_seq`; returns them and whether
    /// more follow.
    pub fn read(
        &self,
        session_id: &str,
        from_seq: u64,
        limit: u32,
    ) -> Result<(Vec<Event>, bool), StoreError> {
        let limit = match limit {
            0 => 1000,
            n => n.min(MAX_READ_EVENTS),
        };
        let from = from_seq.max(1);
        let conn = self.reader();
        let session = Self::session_in(&conn, session_id)?;
        let to = session
            .event_count
            .min(from.saturating_add(u64::from(limit)) - 1);
        let events = Self::read_in(&conn, session_id, from, to)?;
        Ok((events, to < session.event_count))
    }

    fn read_in(
        conn: &Connection,
        session_id: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<Event>, StoreError> {
        if from > to {
            return Ok(Vec::new());
        }
        let mut stmt = conn.prepare_cached(
            "SELECT seq, body FROM events WHERE session_id = ?1 AND seq BETWEEN ?2 AND ?3 ORDER BY seq",
        )?;
        let rows = stmt.query_map(params![session_id, from as i64, to as i64], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?))
        })?;
        let mut events = Vec::new();
        for row in rows {
            let (seq, body) = row?;
            let event = Event::decode(body.as_slice()).map_err(|e| StoreError::Corrupt {
                session_id: session_id.to_string(),
                seq: seq as u64,
                reason: e.to_string(),
            })?;
            events.push(event);
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use agentry_proto::sessions::v1::{ModelTextDelta, UserMessage};
    use pretty_assertions::assert_eq;

    fn user(text: &str) -> Event {
        Event {
            turn_id: "t1".into(),
            kind: Some(event::Kind::UserMessage(UserMessage {
                text: text.into(),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn delta(text: &str) -> Event {
        Event {
            turn_id: "t1".into(),
            kind: Some(event::Kind::ModelTextDelta(ModelTextDelta {
                text: text.into(),
            })),
            ..Default::default()
        }
    }

    #[test]
    fn the_wal_is_checkpointed_in_the_background() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = Store::open(&path).unwrap();
        store.create_session("s", "").unwrap();
        let before = std::fs::metadata(&path).unwrap().len();
        for seq in 1..=200u64 {
            let text = "x".repeat(2000);
            store.append("s", seq, vec![user(&text)]).unwrap();
        }
        // Appends never checkpoint; only the background thread moves the
        // WAL's pages into the database file.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::metadata(&path).unwrap().len() < before + 200 * 2000 {
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint happened"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        drop(store);
        // The last checkpoint truncates the WAL.
        let wal = dir.path().join("s.db-wal");
        assert!(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0) == 0);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.read("s", 1, 1000).unwrap().0.len(), 200);
    }

    #[test]
    fn concurrent_appends_share_commits_and_keep_every_log_in_order() {
        const WRITERS: usize = 16;
        const APPENDS: u64 = 40;
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("s.db")).unwrap());
        for w in 0..WRITERS {
            store.create_session(&format!("s{w}"), "").unwrap();
        }
        let threads: Vec<_> = (0..WRITERS)
            .map(|w| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for seq in 1..=APPENDS {
                        let events = vec![user(&format!("{w}/{seq}"))];
                        let stored = store.append(&format!("s{w}"), seq, events).unwrap();
                        assert_eq!(stored[0].seq, seq);
                        // A stale expected seq is refused, batched or not.
                        let stale = store.append(&format!("s{w}"), seq, vec![delta("x")]);
                        assert!(
                            matches!(stale, Err(StoreError::Conflict { .. })),
                            "{stale:?}"
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for w in 0..WRITERS {
            let (events, _) = store.read(&format!("s{w}"), 1, 1000).unwrap();
            let texts: Vec<String> = events
                .iter()
                .map(|e| match &e.kind {
                    Some(event::Kind::UserMessage(m)) => m.text.clone(),
                    other => panic!("unexpected {other:?}"),
                })
                .collect();
            let expected: Vec<String> = (1..=APPENDS).map(|s| format!("{w}/{s}")).collect();
            assert_eq!(texts, expected);
        }
        let appends = WRITERS as u64 * APPENDS;
        let commits = store.commits();
        assert!(
            commits >= 1 && commits <= appends,
            "{commits} commits for {appends} appends"
        );
        eprintln!("{appends} successful appends took {commits} commits");
    }

    #[test]
    fn append_assigns_gap_free_seqs_and_enforces_expected_seq() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        store.create_session("s1", "").unwrap();
        let stored = store
            .append("s1", 1, vec![user("hello"), delta("hi")])
            .unwrap();
        assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
        assert!(
            stored
                .iter()
                .all(|e| e.session_id == "s1" && e.time.is_some())
        );
        let err = store.append("s1", 2, vec![delta("x")]).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Conflict {
                    expected: 2,
                    actual: 3,
                    ..
                }
            ),
            "{err}"
        );
        let err = store.append("s1", 4, vec![delta("x")]).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Conflict {
                    expected: 4,
                    actual: 3,
                    ..
                }
            ),
            "{err}"
        );
        store.append("s1", 3, vec![delta("!")]).unwrap();
        let (events, more) = store.read("s1", 2, 0).unwrap();
        assert!(!more);
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![2, 3]);
        let (page, more) = store.read("s1", 1, 2).unwrap();
        assert_eq!(page.len(), 2);
        assert!(more);
    }

    #[test]
    fn bad_appends_are_refused_and_store_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        store.create_session("s1", "").unwrap();
        assert!(matches!(
            store.append("nope", 1, vec![user("x")]).unwrap_err(),
            StoreError::NotFound(_)
        ));
        assert!(matches!(
            store.append("s1", 1, vec![]).unwrap_err(),
            StoreError::InvalidArgument(_)
        ));
        let no_kind = Event::default();
        assert!(matches!(
            store.append("s1", 1, vec![user("a"), no_kind]).unwrap_err(),
            StoreError::InvalidArgument(_)
        ));
        assert_eq!(store.get_session("s1").unwrap().event_count, 0);
        assert!(matches!(
            store.create_session("bad id!", "").unwrap_err(),
            StoreError::InvalidArgument(_)
        ));
        assert!(matches!(
            store.create_session("s1", "").unwrap_err(),
            StoreError::AlreadyExists(_)
        ));
    }

    #[test]
    fn data_survives_reopen_and_listing_is_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            let store = Store::open(&path).unwrap();
            store.create_session("a", "").unwrap();
            store.create_session("b", "Given title").unwrap();
            store
                .append("a", 1, vec![user("first question\nmore")])
                .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let (sessions, total) = store.list_sessions(0, 0, false).unwrap();
        assert_eq!(total, 2);
        assert_eq!(sessions[0].id, "a");
        assert_eq!(sessions[0].title, "first question");
        assert_eq!(sessions[0].preview, "first question");
        assert_eq!(sessions[0].user_message_count, 1);
        assert_eq!(sessions[0].event_count, 1);
        assert_eq!(sessions[1].title, "Given title");
        let (events, _) = store.read("a", 0, 0).unwrap();
        assert_eq!(
            events,
            vec![Event {
                seq: 1,
                session_id: "a".into(),
                ..events[0].clone()
            }]
        );
    }

    #[test]
    fn delete_and_fork() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        store.create_session("a", "").unwrap();
        store
            .append("a", 1, vec![user("q"), delta("x"), delta("y")])
            .unwrap();
        let fork = store.fork_session("a", 2, "f").unwrap();
        assert_eq!(fork.event_count, 2);
        assert_eq!(fork.forked_from, "a");
        let (events, _) = store.read("f", 1, 0).unwrap();
        assert!(events.iter().all(|e| e.session_id == "f"));
        assert!(matches!(
            store.fork_session("a", 9, "g").unwrap_err(),
            StoreError::InvalidArgument(_)
        ));
        assert_eq!(store.delete_session("a").unwrap(), 3);
        assert!(matches!(
            store.get_session("a").unwrap_err(),
            StoreError::NotFound(_)
        ));
        assert!(matches!(
            store.read("a", 1, 0).unwrap_err(),
            StoreError::NotFound(_)
        ));
        assert_eq!(store.read("f", 1, 0).unwrap().0.len(), 2);
    }
}
