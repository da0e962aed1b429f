//! The PostgreSQL event store, for deployments with several store replicas
//! and orchestrators sharing one database.
//!
//! Same contract as the SQLite store: gap-free seqs, appends refused unless
//! they start at the log's next seq (the session's row is locked while an
//! append checks it, so replicas cannot interleave), durable before they
//! return (a committed transaction, `synchronous_commit` as the server
//! has it, `on` by default), and appends arriving together committed in one
//! transaction, each in a savepoint. Every commit notifies the other
//! replicas (`LISTEN`/`NOTIFY`), whose watchers then read the new events.
//!
//! Client: `tokio-postgres` with a `deadpool` pool — plain asynchronous
//! calls and explicit SQL, no code generation, and a small dependency tree;
//! the notification connection is a `tokio-postgres` connection of its own,
//! driven by hand so its notifications can be read.

mod leases;
mod schema;

use crate::store::{
    Change, MAX_APPEND_EVENTS, StoreError, Summary, fork_end, kind_name, ms_from_timestamp,
    new_session_id, now_ms, preview_of, read_window, timestamp_from_ms,
};
use agentry_proto::sessions::v1::{Checkpoint, Event, Session};
use deadpool_postgres::{GenericClient, Pool};
use prost::Message;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot};

/// The channel appends and deletions are announced on.
const CHANNEL: &str = "agentry_sessions";
/// How many appends one transaction carries at most.
const MAX_BATCH: usize = 256;

/// An append waiting for the committer.
struct Queued {
    session_id: String,
    expected_seq: u64,
    lease_epoch: u64,
    events: Vec<Event>,
    checkpoint: Option<Checkpoint>,
    reply: oneshot::Sender<Result<Vec<Event>, StoreError>>,
}

/// The store.
pub struct PgStore {
    pool: Pool,
    appends: mpsc::Sender<Queued>,
    changes: broadcast::Sender<Change>,
    commits: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A failure of the database or of reaching it.
pub(crate) fn db_error(e: tokio_postgres::Error) -> StoreError {
    if e.is_closed() || e.code().is_none() {
        return StoreError::Unavailable(format!("PostgreSQL: {e}"));
    }
    let code = e.code().cloned();
    let message = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string());
    match code {
        // The server is shutting down or out of connections: try again.
        Some(c)
            if c == tokio_postgres::error::SqlState::ADMIN_SHUTDOWN
                || c == tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE
                || c == tokio_postgres::error::SqlState::QUERY_CANCELED
                || c == tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW
                || c == tokio_postgres::error::SqlState::TOO_MANY_CONNECTIONS
                || c == tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
                || c == tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED =>
        {
            StoreError::Unavailable(format!("PostgreSQL: {message}"))
        }
        _ => StoreError::Postgres(message),
    }
}

fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => db_error(e),
        other => StoreError::Unavailable(format!("PostgreSQL: {other}")),
    }
}

fn session_from_row(row: &tokio_postgres::Row) -> Session {
    Session {
        id: row.get(0),
        title: row.get(1),
        created_at: Some(timestamp_from_ms(row.get(2))),
        updated_at: Some(timestamp_from_ms(row.get(3))),
        event_count: row.get::<_, i64>(4) as u64,
        user_message_count: row.get::<_, i64>(5) as u64,
        preview: row.get(6),
        forked_from: row.get(7),
        turn_open: row.get(8),
        parent: crate::store::parent_of(row.get(9), row.get(10), row.get(11)),
        project_dir: row.get(12),
        name: row.get(13),
        cost: row.get(14),
        currency: row.get(15),
    }
}

const SESSION_COLUMNS: &str = "id, title, created_ms, updated_ms, event_count, user_message_count, preview, forked_from, turn_open, parent_session, parent_call, parent_agent, project_dir, name, cost, currency";

impl PgStore {
    /// Connects to `url`, brings the schema up to date (safely when several
    /// replicas start at once) and starts listening for other replicas'
    /// changes. Retries for `patience` while the server cannot be reached.
    pub async fn connect(url: &str, patience: Duration) -> Result<PgStore, StoreError> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            StoreError::InvalidArgument(format!(
                "session_store.database_url {}: {e}",
                agentry_runtime::config::redact_url(url)
            ))
        })?;
        // A statement stuck behind a lock (another replica's connection
        // hanging) fails in time instead of stalling every append.
        let options = format!(
            "{} -c lock_timeout=10s -c statement_timeout=30s",
            config.get_options().unwrap_or_default()
        );
        config.options(options.trim());
        let manager = deadpool_postgres::Manager::from_config(
            config.clone(),
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(16)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(10)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::InvalidArgument(format!("PostgreSQL pool: {e}")))?;
        let deadline = tokio::time::Instant::now() + patience;
        let mut client = loop {
            match pool.get().await {
                Ok(client) => break client,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(url = %agentry_runtime::config::redact_url(url), error = %e, "PostgreSQL not reachable yet; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    return Err(StoreError::Unavailable(format!(
                        "cannot reach PostgreSQL at {}: {e}",
                        agentry_runtime::config::redact_url(url)
                    )));
                }
            }
        };
        schema::migrate(&mut client).await?;
        drop(client);
        let (changes, _) = broadcast::channel(1024);
        let (appends, queue) = mpsc::channel(4096);
        let commits = Arc::new(AtomicU64::new(0));
        let listener = tokio::spawn(listen(config, changes.clone()));
        let committer = tokio::spawn(commit_loop(
            pool.clone(),
            queue,
            changes.clone(),
            commits.clone(),
        ));
        Ok(PgStore {
            pool,
            appends,
            changes,
            commits,
            tasks: vec![listener, committer],
        })
    }

    /// Append transactions committed so far.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Receives every change committed after this call (see
    /// [`crate::Store::subscribe`]); other replicas' appends arrive as
    /// [`Change::Advanced`].
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }

    /// Creates a session with `id` (generated when empty).
    pub async fn create_session(&self, id: &str, title: &str) -> Result<Session, StoreError> {
        self.create(&agentry_proto::sessions::v1::CreateSessionRequest {
            session_id: id.to_string(),
            title: title.to_string(),
            ..Default::default()
        })
        .await
    }

    /// Creates the session `new` describes (its id generated when empty):
    /// a sub-agent's with a parent, one working in a project directory…
    pub async fn create(
        &self,
        new: &agentry_proto::sessions::v1::CreateSessionRequest,
    ) -> Result<Session, StoreError> {
        let parent = new.parent.clone().unwrap_or_default();
        let id = new_session_id(&new.session_id)?;
        let now = now_ms();
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "INSERT INTO sessions (id, title, created_ms, updated_ms, touched,
                                           parent_session, parent_call, parent_agent,
                                           project_dir)
                     VALUES ($1, $2, $3, $3, nextval('sessions_touched'), $4, $5, $6, $7)
                     ON CONFLICT (id) DO NOTHING RETURNING {SESSION_COLUMNS}"
                ),
                &[
                    &id,
                    &preview_of(&new.title),
                    &now,
                    &parent.session_id,
                    &parent.call_id,
                    &parent.agent,
                    &new.project_dir,
                ],
            )
            .await
            .map_err(db_error)?;
        row.map(|r| session_from_row(&r))
            .ok_or(StoreError::AlreadyExists(id))
    }

    /// Gives a session a name (checked by the caller; empty: none).
    pub async fn rename(&self, id: &str, name: &str) -> Result<Session, StoreError> {
        let client = self.client().await?;
        if !name.is_empty()
            && let Some(row) = client
                .query_opt(
                    "SELECT id FROM sessions WHERE name = $1 AND id <> $2",
                    &[&name, &id],
                )
                .await
                .map_err(db_error)?
        {
            return Err(StoreError::NameTaken {
                name: name.to_string(),
                by: row.get(0),
            });
        }
        let row = client
            .query_opt(
                &format!("UPDATE sessions SET name = $2 WHERE id = $1 RETURNING {SESSION_COLUMNS}"),
                &[&id, &name],
            )
            .await
            .map_err(|e| match e.code() {
                Some(code) if *code == tokio_postgres::error::SqlState::UNIQUE_VIOLATION => {
                    StoreError::NameTaken {
                        name: name.to_string(),
                        by: "another".into(),
                    }
                }
                _ => db_error(e),
            })?;
        row.map(|r| session_from_row(&r))
            .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }

    /// Returns one session.
    pub async fn get_session(&self, id: &str) -> Result<Session, StoreError> {
        session_in(&self.client().await?, id).await
    }

    /// Lists sessions, most recently updated first, with the total count.
    pub async fn list_sessions(
        &self,
        limit: u32,
        offset: u32,
        only_open_turns: bool,
    ) -> Result<(Vec<Session>, u64), StoreError> {
        let limit = i64::from(match limit {
            0 => 50,
            n => n.min(1000),
        });
        let client = self.client().await?;
        // `turn_open >= false` is every session; `>= true` the open ones.
        let rows = client
            .query(
                &format!(
                    "SELECT {SESSION_COLUMNS} FROM sessions WHERE turn_open >= $3
                     ORDER BY touched DESC LIMIT $1 OFFSET $2"
                ),
                &[&limit, &i64::from(offset), &only_open_turns],
            )
            .await
            .map_err(db_error)?;
        let total: i64 = client
            .query_one(
                "SELECT COUNT(*) FROM sessions WHERE turn_open >= $1",
                &[&only_open_turns],
            )
            .await
            .map_err(db_error)?
            .get(0);
        Ok((rows.iter().map(session_from_row).collect(), total as u64))
    }

    /// Deletes a session and its log; returns how many events went with it.
    pub async fn delete_session(&self, id: &str) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        let row = tx
            .query_opt(
                "DELETE FROM sessions WHERE id = $1 RETURNING event_count",
                &[&id],
            )
            .await
            .map_err(db_error)?
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &format!("d {id}")])
            .await
            .map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        let _ = self.changes.send(Change::Deleted(id.to_string()));
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// Copies a session's events up to `up_to_seq` (0: all) into a new
    /// session, then appends the fork's own `events`, in one transaction.
    pub async fn fork_session(
        &self,
        id: &str,
        up_to_seq: u64,
        new_id: &str,
        project_dir: &str,
        own: Vec<Event>,
    ) -> Result<Session, StoreError> {
        let new_id = new_session_id(new_id)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        let source = session_in(&tx, id).await?;
        let last = fork_end(id, up_to_seq, source.event_count)?;
        let now = now_ms();
        let inserted = tx
            .execute(
                "INSERT INTO sessions (id, title, created_ms, updated_ms, forked_from, touched,
                                       project_dir)
                 VALUES ($1, $2, $3, $3, $4, nextval('sessions_touched'), $5)
                 ON CONFLICT (id) DO NOTHING",
                &[&new_id, &source.title, &now, &id, &project_dir],
            )
            .await
            .map_err(db_error)?;
        if inserted == 0 {
            return Err(StoreError::AlreadyExists(new_id));
        }
        let events: Vec<Event> = read_in(&tx, id, 1, last)
            .await?
            .into_iter()
            .map(|mut e| {
                e.session_id = new_id.clone();
                e
            })
            .collect();
        insert_events(&tx, &new_id, 0, &events, now).await?;
        let own = crate::store::fork_events(&new_id, last, own, now)?;
        if !own.is_empty() {
            insert_events(&tx, &new_id, last, &own, now).await?;
        }
        let session = session_in(&tx, &new_id).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(session)
    }

    /// Appends `events` at seq `expected_seq`.. atomically and durably, and
    /// returns them as stored.
    pub async fn append(
        &self,
        session_id: &str,
        expected_seq: u64,
        events: Vec<Event>,
    ) -> Result<Vec<Event>, StoreError> {
        self.append_leased(session_id, expected_seq, 0, events)
            .await
    }

    /// [`PgStore::append`] by the holder of lease `lease_epoch` (0: none).
    pub async fn append_leased(
        &self,
        session_id: &str,
        expected_seq: u64,
        lease_epoch: u64,
        events: Vec<Event>,
    ) -> Result<Vec<Event>, StoreError> {
        self.append_checkpointed(session_id, expected_seq, lease_epoch, events, None)
            .await
    }

    /// [`PgStore::append_leased`] with the session's state after one of its
    /// events, stored in the same commit, replacing its earlier checkpoint.
    pub async fn append_checkpointed(
        &self,
        session_id: &str,
        expected_seq: u64,
        lease_epoch: u64,
        events: Vec<Event>,
        checkpoint: Option<Checkpoint>,
    ) -> Result<Vec<Event>, StoreError> {
        crate::store::check_append(&events)?;
        let (reply, answer) = oneshot::channel();
        self.appends
            .send(Queued {
                session_id: session_id.to_string(),
                expected_seq,
                lease_epoch,
                events,
                checkpoint,
                reply,
            })
            .await
            .map_err(|_| StoreError::Unavailable("the store is shutting down".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the append was dropped".into()))?
    }

    /// Reads up to `limit` events from `from_seq`; returns them and whether
    /// more follow.
    pub async fn read(
        &self,
        session_id: &str,
        from_seq: u64,
        limit: u32,
    ) -> Result<(Vec<Event>, bool), StoreError> {
        let client = self.client().await?;
        let session = session_in(&client, session_id).await?;
        let (from, to, more) = read_window(from_seq, limit, session.event_count);
        let events = read_in(&client, session_id, from, to).await?;
        Ok((events, more))
    }
}

impl PgStore {
    /// The session's checkpoint, if it has one.
    pub async fn checkpoint(&self, session_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let client = self.client().await?;
        session_in(&client, session_id).await?;
        let row = client
            .query_opt(
                "SELECT seq, format, state FROM checkpoints WHERE session_id = $1",
                &[&session_id],
            )
            .await
            .map_err(db_error)?;
        Ok(row.map(|row| Checkpoint {
            seq: row.get::<_, i64>(0) as u64,
            format: row.get::<_, i64>(1) as u32,
            state: row.get(2),
        }))
    }
}

async fn session_in(client: &impl GenericClient, id: &str) -> Result<Session, StoreError> {
    client
        .query_opt(
            &format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1"),
            &[&id],
        )
        .await
        .map_err(db_error)?
        .map(|r| session_from_row(&r))
        .ok_or_else(|| StoreError::NotFound(id.to_string()))
}

async fn read_in(
    client: &impl GenericClient,
    session_id: &str,
    from: u64,
    to: u64,
) -> Result<Vec<Event>, StoreError> {
    if from > to {
        return Ok(Vec::new());
    }
    let rows = client
        .query(
            "SELECT seq, body FROM events WHERE session_id = $1 AND seq BETWEEN $2 AND $3 ORDER BY seq",
            &[&session_id, &(from as i64), &(to as i64)],
        )
        .await
        .map_err(db_error)?;
    rows.iter()
        .map(|row| {
            let seq: i64 = row.get(0);
            let body: &[u8] = row.get(1);
            Event::decode(body).map_err(|e| StoreError::Corrupt {
                session_id: session_id.to_string(),
                seq: seq as u64,
                reason: e.to_string(),
            })
        })
        .collect()
}

/// Inserts events (seqs set) and updates the session's row.
async fn insert_events(
    client: &impl GenericClient,
    session_id: &str,
    count_before: u64,
    events: &[Event],
    now: i64,
) -> Result<(), StoreError> {
    let summary = Summary::of(events);
    let mut seqs = Vec::with_capacity(events.len());
    let mut kinds = Vec::with_capacity(events.len());
    let mut turns = Vec::with_capacity(events.len());
    let mut times = Vec::with_capacity(events.len());
    let mut bodies = Vec::with_capacity(events.len());
    for e in events {
        let Some(kind) = &e.kind else { continue };
        seqs.push(e.seq as i64);
        kinds.push(kind_name(kind));
        turns.push(e.turn_id.as_str());
        times.push(e.time.as_ref().map(ms_from_timestamp).unwrap_or(now));
        bodies.push(e.encode_to_vec());
    }
    client
        .execute(
            "INSERT INTO events (session_id, seq, kind, turn_id, time_ms, body)
             SELECT $1, * FROM UNNEST($2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::bytea[])",
            &[&session_id, &seqs, &kinds, &turns, &times, &bodies],
        )
        .await
        .map_err(db_error)?;
    let preview = summary.preview();
    client
        .execute(
            "UPDATE sessions SET
                event_count = $2,
                updated_ms = $3,
                touched = nextval('sessions_touched'),
                user_message_count = user_message_count + $4,
                preview = CASE WHEN preview = '' THEN $5 ELSE preview END,
                title = CASE WHEN title = '' THEN $5 ELSE title END,
                turn_open = COALESCE($6, turn_open),
                cost = cost + $7,
                currency = COALESCE($8, currency)
             WHERE id = $1",
            &[
                &session_id,
                &((count_before + events.len() as u64) as i64),
                &now,
                &summary.user_messages,
                &preview,
                &summary.turn_open,
                &summary.cost,
                &summary.currency,
            ],
        )
        .await
        .map_err(db_error)?;
    Ok(())
}

/// One append inside the batch's transaction: the session's row is locked
/// until the commit, so another replica's append to it waits, then sees
/// the new count.
async fn append_in(
    tx: &impl GenericClient,
    queued: &mut Queued,
    now: i64,
) -> Result<Vec<Event>, StoreError> {
    let row = tx
        .query_opt(
            "SELECT event_count, lease_epoch FROM sessions WHERE id = $1 FOR UPDATE",
            &[&queued.session_id],
        )
        .await
        .map_err(db_error)?
        .ok_or_else(|| StoreError::NotFound(queued.session_id.clone()))?;
    let count: i64 = row.get(0);
    let current: i64 = row.get(1);
    if queued.lease_epoch != 0 && queued.lease_epoch != current as u64 {
        return Err(StoreError::LeaseLost {
            session_id: queued.session_id.clone(),
            epoch: queued.lease_epoch,
            current: current as u64,
        });
    }
    let actual = count as u64 + 1;
    if queued.expected_seq != actual {
        return Err(StoreError::Conflict {
            session_id: queued.session_id.clone(),
            expected: queued.expected_seq,
            actual,
        });
    }
    let mut events = std::mem::take(&mut queued.events);
    for (i, e) in events.iter_mut().enumerate() {
        e.session_id = queued.session_id.clone();
        e.seq = actual + i as u64;
        if e.time.is_none() {
            e.time = Some(timestamp_from_ms(now));
        }
    }
    insert_events(tx, &queued.session_id, count as u64, &events, now).await?;
    let last = actual + events.len() as u64 - 1;
    if let Some(checkpoint) = &queued.checkpoint {
        crate::store::check_checkpoint(checkpoint, last)?;
        tx.execute(
            "INSERT INTO checkpoints (session_id, seq, format, state) VALUES ($1, $2, $3, $4)
             ON CONFLICT (session_id) DO UPDATE
             SET seq = EXCLUDED.seq, format = EXCLUDED.format, state = EXCLUDED.state",
            &[
                &queued.session_id,
                &(checkpoint.seq as i64),
                &(checkpoint.format as i64),
                &checkpoint.state,
            ],
        )
        .await
        .map_err(db_error)?;
    }
    tx.execute(
        "SELECT pg_notify($1, $2)",
        &[&CHANNEL, &format!("a {last} {}", queued.session_id)],
    )
    .await
    .map_err(db_error)?;
    Ok(events)
}

/// Commits queued appends, as many as have arrived, in one transaction.
async fn commit_loop(
    pool: Pool,
    mut queue: mpsc::Receiver<Queued>,
    changes: broadcast::Sender<Change>,
    commits: Arc<AtomicU64>,
) {
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(more) => batch.push(more),
                Err(_) => break,
            }
        }
        let results = commit_batch(&pool, &mut batch).await;
        if results.iter().any(Result::is_ok) {
            commits.fetch_add(1, Ordering::Relaxed);
        }
        for (queued, result) in batch.into_iter().zip(results) {
            if let Ok(events) = &result {
                let _ = changes.send(Change::Appended(Arc::new(events.clone())));
            }
            let _ = queued.reply.send(result);
        }
    }
}

async fn commit_batch(pool: &Pool, batch: &mut [Queued]) -> Vec<Result<Vec<Event>, StoreError>> {
    let size = batch.len();
    let all_failed = |e: StoreError| -> Vec<Result<Vec<Event>, StoreError>> {
        let message = e.to_string();
        let retryable = e.is_retryable();
        (0..size)
            .map(|_| {
                Err(if retryable {
                    StoreError::Unavailable(message.clone())
                } else {
                    StoreError::Postgres(message.clone())
                })
            })
            .collect()
    };
    let mut client = match pool.get().await {
        Ok(client) => client,
        Err(e) => return all_failed(pool_error(e)),
    };
    let mut tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => return all_failed(db_error(e)),
    };
    let now = now_ms();
    let mut results = Vec::with_capacity(size);
    for queued in batch.iter_mut() {
        let result = async {
            let savepoint = tx.savepoint("append").await.map_err(db_error)?;
            let events = append_in(&savepoint, queued, now).await?;
            savepoint.commit().await.map_err(db_error)?;
            Ok(events)
        }
        .await;
        if let Err(StoreError::Unavailable(_)) = &result {
            // The connection failed: nothing of this batch is stored.
            return all_failed(
                result
                    .err()
                    .unwrap_or(StoreError::Unavailable(String::new())),
            );
        }
        results.push(result);
    }
    if results.iter().all(Result::is_err) {
        return results;
    }
    match tx.commit().await {
        Ok(()) => results,
        Err(e) => all_failed(db_error(e)),
    }
}

/// Follows other replicas' changes (`LISTEN`), reconnecting when the
/// connection is lost; after a reconnect every watcher reads what it may
/// have missed.
async fn listen(config: tokio_postgres::Config, changes: broadcast::Sender<Change>) {
    use futures::StreamExt;
    let mut delay = Duration::from_millis(200);
    loop {
        match config.connect(tokio_postgres::NoTls).await {
            Ok((client, mut connection)) => {
                let (tx, mut notifications) = mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(message) = messages.next().await {
                        match message {
                            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                if tx.send(n.payload().to_string()).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(error = %e, "lost the PostgreSQL notification connection");
                                return;
                            }
                        }
                    }
                });
                if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
                    tracing::warn!(error = %e, "cannot LISTEN on PostgreSQL");
                    driver.abort();
                } else {
                    delay = Duration::from_millis(200);
                    // Whatever was appended before this LISTEN took is
                    // read by every watcher now.
                    let _ = changes.send(Change::Resync);
                    while let Some(payload) = notifications.recv().await {
                        if let Some(change) = parse_notification(&payload) {
                            let _ = changes.send(change);
                        }
                    }
                    drop(client);
                    let _ = changes.send(Change::Resync);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the PostgreSQL notification connection; retrying");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// `a <last seq> <session>` or `d <session>`.
fn parse_notification(payload: &str) -> Option<Change> {
    let mut parts = payload.splitn(3, ' ');
    match (parts.next()?, parts.next(), parts.next()) {
        ("a", Some(seq), Some(session)) => Some(Change::Advanced {
            session_id: session.to_string(),
            last_seq: seq.parse().ok()?,
        }),
        ("d", Some(session), None) => Some(Change::Deleted(session.to_string())),
        _ => None,
    }
}
