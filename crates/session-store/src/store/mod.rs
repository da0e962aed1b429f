//! The SQLite event store: sessions plus an append-only, gap-free event log
//! per session. Appends are durable (`synchronous=FULL` in WAL mode) before
//! they return.
//!
//! - `schema`: the tables, and the migrations that bring a database written
//!   by an earlier version up to date;
//! - `append`: validation and group commit;
//! - `sessions`: create, get, list, delete, fork;
//! - `read`: pages of a log;
//! - `checkpoint`: the background WAL checkpointer.

mod append;
mod checkpoint;
mod error;
mod leases;
mod read;
mod schema;
mod sessions;

pub use error::StoreError;
pub use leases::Lease;
pub use schema::{SCHEMA_VERSION, version_of};

use agentry_proto::sessions::v1::{Event, Session, event};
use checkpoint::Checkpointer;
use rusqlite::Connection;
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

/// A change to the store, broadcast to watchers after it is committed.
#[derive(Debug, Clone)]
pub enum Change {
    /// Events appended in one call.
    Appended(Arc<Vec<Event>>),
    /// A session was deleted.
    Deleted(String),
    /// Another replica appended to a session up to this seq (the events
    /// are read from the database).
    Advanced {
        /// The session.
        session_id: String,
        /// Its last seq now.
        last_seq: u64,
    },
    /// Changes may have been missed (the notification connection was
    /// lost): every watcher reads what it has not seen.
    Resync,
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
    queue: Mutex<Vec<append::QueuedAppend>>,
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

/// A session name as given, checked: 1-64 characters, no whitespace or
/// control characters, not only hex digits and dashes (it would read as an
/// id or a prefix of one); empty removes the name.
pub fn check_session_name(name: &str) -> Result<String, StoreError> {
    let name = name.trim();
    if name.is_empty() {
        return Ok(String::new());
    }
    if name.chars().count() > 64 {
        return Err(StoreError::InvalidArgument(format!(
            "the name {name:?} is longer than 64 characters"
        )));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(StoreError::InvalidArgument(format!(
            "the name {name:?} has spaces or control characters; use letters, digits, '-', '_', '.'"
        )));
    }
    if name.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(StoreError::InvalidArgument(format!(
            "the name {name:?} reads like a session id; give it a letter that is not a-f"
        )));
    }
    Ok(name.to_string())
}

/// The id a new session gets: `id`, checked, or a fresh one when empty.
pub(crate) fn new_session_id(id: &str) -> Result<String, StoreError> {
    if id.is_empty() {
        Ok(uuid::Uuid::now_v7().to_string())
    } else {
        validate_session_id(id)?;
        Ok(id.to_string())
    }
}

/// Refuses an append no backend takes: empty, too large, or an event
/// without a kind.
/// A fork's own events, stamped to follow a copy of `copied` events of
/// session `new_id` (checked like an append; none is fine).
pub(crate) fn fork_events(
    new_id: &str,
    copied: u64,
    mut events: Vec<Event>,
    now: i64,
) -> Result<Vec<Event>, StoreError> {
    if events.is_empty() {
        return Ok(events);
    }
    check_append(&events)?;
    for (i, e) in events.iter_mut().enumerate() {
        e.session_id = new_id.to_string();
        e.seq = copied + 1 + i as u64;
        if e.time.is_none() {
            e.time = Some(timestamp_from_ms(now));
        }
    }
    Ok(events)
}

pub(crate) fn check_append(events: &[Event]) -> Result<(), StoreError> {
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
    Ok(())
}

/// A checkpoint must name an event of the log, which ends at `last`.
pub(crate) fn check_checkpoint(
    checkpoint: &agentry_proto::sessions::v1::Checkpoint,
    last: u64,
) -> Result<(), StoreError> {
    if checkpoint.seq == 0 || checkpoint.seq > last {
        return Err(StoreError::InvalidArgument(format!(
            "the checkpoint is after event {}, but the log's events are 1 to {last}",
            checkpoint.seq
        )));
    }
    Ok(())
}

/// The last seq a fork of session `id` (whose log ends at `event_count`)
/// copies when asked for `up_to_seq` (0: all).
pub(crate) fn fork_end(id: &str, up_to_seq: u64, event_count: u64) -> Result<u64, StoreError> {
    match up_to_seq {
        0 => Ok(event_count),
        n if n > event_count => Err(StoreError::InvalidArgument(format!(
            "cannot fork session {id:?} at seq {up_to_seq}: its log ends at seq {event_count}"
        ))),
        n => Ok(n),
    }
}

/// The seqs a read of up to `limit` events (0: 1000) from `from_seq` covers
/// in a log ending at `event_count`: first, last, and whether more follow.
pub(crate) fn read_window(from_seq: u64, limit: u32, event_count: u64) -> (u64, u64, bool) {
    let limit = match limit {
        0 => 1000,
        n => n.min(MAX_READ_EVENTS),
    };
    let from = from_seq.max(1);
    let to = event_count.min(from.saturating_add(u64::from(limit)) - 1);
    (from, to, to < event_count)
}

pub(crate) fn now_ms() -> i64 {
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

pub(crate) fn ms_from_timestamp(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds * 1000 + i64::from(ts.nanos / 1_000_000)
}

/// The stable name of an event's kind, kept in its own column: its field
/// name in the contract.
pub fn kind_name(kind: &event::Kind) -> &'static str {
    kind.name()
}

/// What a batch of events changes in its session's row.
pub(crate) struct Summary<'a> {
    /// User messages among them.
    pub user_messages: i64,
    /// Whether a turn is open after them (`None`: no turn boundary among
    /// them, the flag stays).
    pub turn_open: Option<bool>,
    /// The first user message's text.
    pub first_user_text: Option<&'a str>,
    /// What the turns finished among them cost.
    pub cost: f64,
    /// The currency of the last priced one.
    pub currency: Option<&'a str>,
}

impl<'a> Summary<'a> {
    pub(crate) fn of(events: &'a [Event]) -> Summary<'a> {
        let mut summary = Summary {
            user_messages: 0,
            turn_open: None,
            first_user_text: None,
            cost: 0.0,
            currency: None,
        };
        for e in events {
            match &e.kind {
                // A request to compact starts a turn but is no message.
                Some(event::Kind::UserMessage(m)) if m.compact => summary.turn_open = Some(true),
                Some(event::Kind::UserMessage(m)) => {
                    summary.user_messages += 1;
                    summary.first_user_text.get_or_insert(m.text.as_str());
                    summary.turn_open = Some(true);
                }
                Some(event::Kind::TurnFinished(t)) => {
                    summary.turn_open = Some(false);
                    if let Some(cost) = t.cost.filter(|c| c.is_finite() && *c >= 0.0) {
                        summary.cost += cost;
                        if !t.currency.is_empty() {
                            summary.currency = Some(t.currency.as_str());
                        }
                    }
                }
                Some(event::Kind::ReminderDue(r))
                    if r.reminder_kind() == agentry_proto::sessions::v1::ReminderKind::Task =>
                {
                    summary.turn_open = Some(true)
                }
                // It starts a turn, like a task reminder.
                Some(event::Kind::McpResourceUpdated(_)) => summary.turn_open = Some(true),
                _ => {}
            }
        }
        summary
    }

    /// The session's preview, if these events set it.
    pub(crate) fn preview(&self) -> String {
        self.first_user_text.map(preview_of).unwrap_or_default()
    }
}

pub(crate) fn preview_of(text: &str) -> String {
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

const SESSION_COLUMNS: &str = "id, title, created_ms, updated_ms, event_count, user_message_count, preview, forked_from, turn_open, parent_session, parent_call, parent_agent, project_dir, name, cost, currency";

/// The parent link of a session's row (`None` for a session of its own;
/// only an agent: a scheduled run that works as that agent).
pub(crate) fn parent_of(
    session_id: String,
    call_id: String,
    agent: String,
) -> Option<agentry_proto::sessions::v1::SessionParent> {
    (!session_id.is_empty() || !agent.is_empty()).then_some(
        agentry_proto::sessions::v1::SessionParent {
            session_id,
            call_id,
            agent,
        },
    )
}

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
        parent: parent_of(row.get(9)?, row.get(10)?, row.get(11)?),
        project_dir: row.get(12)?,
        name: row.get(13)?,
        cost: row.get(14)?,
        currency: row.get(15)?,
    })
}

impl Store {
    /// Opens (creating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            agentry_runtime::datadir::prepare_dir(parent).map_err(|source| StoreError::Io {
                what: "create the data directory",
                path: parent.to_path_buf(),
                source,
            })?;
        }
        agentry_runtime::datadir::prepare_file(path).map_err(|source| StoreError::Io {
            what: "create the database file",
            path: path.to_path_buf(),
            source,
        })?;
        let mut writer = Connection::open(path)?;
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
        schema::migrate(&mut writer)?;
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
}

#[cfg(test)]
mod tests;
