//! Appends: validated, queued, and committed in groups (whoever holds the
//! writer commits every queued append in one transaction, one fsync), each
//! in a savepoint so a refused one leaves the others alone.

use super::{
    Change, Store, StoreError, kind_name, lock, ms_from_timestamp, now_ms, timestamp_from_ms,
};
use agentry_proto::sessions::v1::{Checkpoint, Event};
use prost::Message;
use rusqlite::{Connection, OptionalExtension, params};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

type Slot = Arc<Mutex<Option<Result<Vec<Event>, StoreError>>>>;

/// An append waiting for the next group commit.
pub(super) struct QueuedAppend {
    session_id: String,
    expected_seq: u64,
    /// The caller's lease epoch; 0: none.
    lease_epoch: u64,
    events: Vec<Event>,
    /// The session's state after one of the events, kept with them.
    checkpoint: Option<Checkpoint>,
    /// Where its committer leaves the result.
    slot: Slot,
}

impl Store {
    /// Appends `events` at seq `expected_seq`.. atomically and durably, and
    /// returns them as stored (with session id and seq set).
    pub fn append(
        &self,
        session_id: &str,
        expected_seq: u64,
        events: Vec<Event>,
    ) -> Result<Vec<Event>, StoreError> {
        self.append_leased(session_id, expected_seq, 0, events)
    }

    /// [`Store::append`] by the holder of lease `lease_epoch` (0: none):
    /// refused once the session's lease moved on.
    pub fn append_leased(
        &self,
        session_id: &str,
        expected_seq: u64,
        lease_epoch: u64,
        events: Vec<Event>,
    ) -> Result<Vec<Event>, StoreError> {
        self.append_checkpointed(session_id, expected_seq, lease_epoch, events, None)
    }

    /// [`Store::append_leased`] with the session's state after one of its
    /// events (see [`Checkpoint`]), stored in the same commit and
    /// replacing the session's earlier checkpoint.
    pub fn append_checkpointed(
        &self,
        session_id: &str,
        expected_seq: u64,
        lease_epoch: u64,
        events: Vec<Event>,
        checkpoint: Option<Checkpoint>,
    ) -> Result<Vec<Event>, StoreError> {
        super::check_append(&events)?;
        let slot: Slot = Arc::default();
        lock(&self.queue).push(QueuedAppend {
            session_id: session_id.to_string(),
            expected_seq,
            lease_epoch,
            events,
            checkpoint,
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
                let events = self.append_in(
                    &sp,
                    &queued.session_id,
                    queued.expected_seq,
                    queued.lease_epoch,
                    events,
                    now,
                )?;
                if let Some(checkpoint) = &queued.checkpoint {
                    let last = events.last().map_or(0, |e| e.seq);
                    Self::keep_checkpoint(&sp, &queued.session_id, checkpoint, last)?;
                }
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
        lease_epoch: u64,
        mut events: Vec<Event>,
        now: i64,
    ) -> Result<Vec<Event>, StoreError> {
        let row: Option<(i64, i64)> = tx
            .query_row(
                "SELECT event_count, lease_epoch FROM sessions WHERE id = ?1",
                [session_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((count, current_epoch)) = row else {
            return Err(StoreError::NotFound(session_id.to_string()));
        };
        if lease_epoch != 0 && lease_epoch != current_epoch as u64 {
            return Err(StoreError::LeaseLost {
                session_id: session_id.to_string(),
                epoch: lease_epoch,
                current: current_epoch as u64,
            });
        }
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

    /// Replaces the session's checkpoint with `checkpoint`, whose seq must
    /// be that of an event of the log (which ends at `last`).
    fn keep_checkpoint(
        tx: &Connection,
        session_id: &str,
        checkpoint: &Checkpoint,
        last: u64,
    ) -> Result<(), StoreError> {
        super::check_checkpoint(checkpoint, last)?;
        tx.prepare_cached(
            "INSERT INTO checkpoints (session_id, seq, format, state) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (session_id) DO UPDATE
             SET seq = excluded.seq, format = excluded.format, state = excluded.state",
        )?
        .execute(params![
            session_id,
            checkpoint.seq as i64,
            checkpoint.format,
            checkpoint.state
        ])?;
        Ok(())
    }

    pub(super) fn insert_events(
        tx: &Connection,
        session_id: &str,
        count_before: u64,
        events: &[Event],
        now: i64,
        touched: i64,
    ) -> Result<(), StoreError> {
        let summary = super::Summary::of(events);
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO events (session_id, seq, kind, turn_id, time_ms, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for e in events {
                let Some(kind) = &e.kind else { continue };
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
        let preview = summary.preview();
        tx.execute(
            "UPDATE sessions SET
                event_count = ?2,
                updated_ms = ?3,
                touched = ?6,
                user_message_count = user_message_count + ?4,
                preview = CASE WHEN preview = '' THEN ?5 ELSE preview END,
                title = CASE WHEN title = '' THEN ?5 ELSE title END,
                turn_open = COALESCE(?7, turn_open),
                cost = cost + ?8,
                currency = COALESCE(?9, currency)
             WHERE id = ?1",
            params![
                session_id,
                (count_before + events.len() as u64) as i64,
                now,
                summary.user_messages,
                preview,
                touched,
                summary.turn_open.map(i64::from),
                summary.cost,
                summary.currency
            ],
        )?;
        Ok(())
    }
}
