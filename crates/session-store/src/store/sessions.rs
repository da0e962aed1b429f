//! Sessions: create, look up, list (most recently touched first), delete,
//! fork.

use super::{Change, SESSION_COLUMNS, Store, StoreError, now_ms, preview_of, session_from_row};
use agentry_proto::sessions::v1::CreateSessionRequest;
use agentry_proto::sessions::v1::{Event, Session};
use rusqlite::{Connection, OptionalExtension, params};

impl Store {
    /// Creates a session with `id` (generated when empty).
    pub fn create_session(&self, id: &str, title: &str) -> Result<Session, StoreError> {
        self.create(&CreateSessionRequest {
            session_id: id.to_string(),
            title: title.to_string(),
            ..Default::default()
        })
    }

    /// Creates the session `new` describes (its id generated when empty):
    /// a sub-agent's with a parent, one working in a project directory…
    pub fn create(&self, new: &CreateSessionRequest) -> Result<Session, StoreError> {
        let parent = new.parent.clone().unwrap_or_default();
        let id = super::new_session_id(&new.session_id)?;
        let now = now_ms();
        let title = preview_of(&new.title);
        let conn = self.writer();
        let inserted = conn.execute(
            "INSERT INTO sessions (id, title, created_ms, updated_ms, touched, parent_session,
                                   parent_call, parent_agent, project_dir)
             VALUES (?1, ?2, ?3, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT(id) DO NOTHING",
            params![
                id,
                title,
                now,
                self.touch(),
                parent.session_id,
                parent.call_id,
                parent.agent,
                new.project_dir
            ],
        )?;
        if inserted == 0 {
            return Err(StoreError::AlreadyExists(id));
        }
        Self::session_in(&conn, &id)
    }

    /// Gives a session a name (checked by the caller; empty: none).
    pub fn rename(&self, id: &str, name: &str) -> Result<Session, StoreError> {
        let conn = self.writer();
        if !name.is_empty()
            && let Some(by) = conn
                .query_row(
                    "SELECT id FROM sessions WHERE name = ?1 AND id != ?2",
                    params![name, id],
                    |r| r.get::<_, String>(0),
                )
                .optional()?
        {
            return Err(StoreError::NameTaken {
                name: name.to_string(),
                by,
            });
        }
        let changed = conn.execute(
            "UPDATE sessions SET name = ?2 WHERE id = ?1",
            params![id, name],
        )?;
        if changed == 0 {
            return Err(StoreError::NotFound(id.to_string()));
        }
        Self::session_in(&conn, id)
    }

    pub(super) fn session_in(conn: &Connection, id: &str) -> Result<Session, StoreError> {
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
        tx.execute("DELETE FROM checkpoints WHERE session_id = ?1", [id])?;
        tx.execute("DELETE FROM sessions WHERE id = ?1", [id])?;
        tx.commit()?;
        drop(conn);
        let _ = self.changes.send(Change::Deleted(id.to_string()));
        Ok(count as u64)
    }

    /// Copies a session's events up to `up_to_seq` (0: all) into a new
    /// session, then appends the fork's own `events`, in one transaction.
    pub fn fork_session(
        &self,
        id: &str,
        up_to_seq: u64,
        new_id: &str,
        project_dir: &str,
        events: Vec<Event>,
    ) -> Result<Session, StoreError> {
        let new_id = super::new_session_id(new_id)?;
        let own = events;
        let mut conn = self.writer();
        let tx = conn.transaction()?;
        let source = Self::session_in(&tx, id)?;
        let last = super::fork_end(id, up_to_seq, source.event_count)?;
        let now = now_ms();
        let inserted = tx.execute(
            "INSERT INTO sessions (id, title, created_ms, updated_ms, forked_from, touched,
                                   project_dir)
             VALUES (?1, ?2, ?3, ?3, ?4, ?5, ?6) ON CONFLICT(id) DO NOTHING",
            params![new_id, source.title, now, id, self.touch(), project_dir],
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
        let own = super::fork_events(&new_id, last, own, now)?;
        if !own.is_empty() {
            Self::insert_events(&tx, &new_id, last, &own, now, self.touch())?;
        }
        let session = Self::session_in(&tx, &new_id)?;
        tx.commit()?;
        Ok(session)
    }
}
