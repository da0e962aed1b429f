//! Reading a session's log: pages of events in seq order, decoded.

use super::{Store, StoreError};
use agentry_proto::sessions::v1::{Checkpoint, Event};
use prost::Message;
use rusqlite::OptionalExtension;
use rusqlite::{Connection, params};

impl Store {
    /// Reads up to `limit` events from `from_seq`; returns them and whether
    /// more follow.
    pub fn read(
        &self,
        session_id: &str,
        from_seq: u64,
        limit: u32,
    ) -> Result<(Vec<Event>, bool), StoreError> {
        let conn = self.reader();
        let session = Self::session_in(&conn, session_id)?;
        let (from, to, more) = super::read_window(from_seq, limit, session.event_count);
        let events = Self::read_in(&conn, session_id, from, to)?;
        Ok((events, more))
    }

    /// The session's checkpoint, if it has one.
    pub fn checkpoint(&self, session_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let conn = self.reader();
        Self::session_in(&conn, session_id)?;
        Ok(conn
            .prepare_cached("SELECT seq, format, state FROM checkpoints WHERE session_id = ?1")?
            .query_row([session_id], |r| {
                Ok(Checkpoint {
                    seq: r.get::<_, i64>(0)? as u64,
                    format: r.get(1)?,
                    state: r.get(2)?,
                })
            })
            .optional()?)
    }

    pub(super) fn read_in(
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
