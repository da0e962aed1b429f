//! Sessions moved in from another store, and the leases that say which
//! orchestrator drives each session (heartbeats, acquiring, releasing).

use super::*;

impl PgStore {
    /// Copies a session and its whole log as they are (ids, seqs, times,
    /// titles), for `agentry migrate`. Returns false, changing nothing, when
    /// the session is already here with as many events; a session already
    /// here with another log is an error.
    pub async fn import_session(
        &self,
        session: &Session,
        events: &[Event],
    ) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        if let Some(row) = tx
            .query_opt(
                "SELECT event_count FROM sessions WHERE id = $1",
                &[&session.id],
            )
            .await
            .map_err(db_error)?
        {
            let count: i64 = row.get(0);
            return if count as u64 == session.event_count {
                Ok(false)
            } else {
                Err(StoreError::AlreadyExists(format!(
                    "{} (with {count} events; the copy has {})",
                    session.id, session.event_count
                )))
            };
        }
        let ms =
            |t: &Option<prost_types::Timestamp>| t.as_ref().map(ms_from_timestamp).unwrap_or(0);
        let parent = session.parent.clone().unwrap_or_default();
        tx.execute(
            "INSERT INTO sessions (id, title, created_ms, updated_ms, preview, forked_from, touched,
                                   parent_session, parent_call, parent_agent, project_dir, name)
             VALUES ($1, $2, $3, $4, $5, $6, nextval('sessions_touched'), $7, $8, $9, $10, $11)",
            &[
                &session.id,
                &session.title,
                &ms(&session.created_at),
                &ms(&session.updated_at),
                &session.preview,
                &session.forked_from,
                &parent.session_id,
                &parent.call_id,
                &parent.agent,
                &session.project_dir,
                &session.name,
            ],
        )
        .await
        .map_err(db_error)?;
        for chunk in events.chunks(MAX_APPEND_EVENTS) {
            let before = chunk.first().map(|e| e.seq - 1).unwrap_or(0);
            insert_events(&tx, &session.id, before, chunk, ms(&session.updated_at)).await?;
        }
        // The copy keeps the original's times and listing facts.
        tx.execute(
            "UPDATE sessions SET updated_ms = $2, title = $3, preview = $4,
                 user_message_count = $5, turn_open = $6
             WHERE id = $1",
            &[
                &session.id,
                &ms(&session.updated_at),
                &session.title,
                &session.preview,
                &(session.user_message_count as i64),
                &session.turn_open,
            ],
        )
        .await
        .map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        Ok(true)
    }

    /// Records that replica `instance_id` (at `url`) is alive for `ttl_ms`
    /// more (0: gone now). Times are the database server's.
    pub async fn heartbeat(
        &self,
        instance_id: &str,
        url: &str,
        ttl_ms: u64,
    ) -> Result<(), StoreError> {
        if instance_id.is_empty() {
            return Err(StoreError::InvalidArgument(
                "instance_id must be set".into(),
            ));
        }
        self.client()
            .await?
            .execute(
                "INSERT INTO orchestrators (id, url, expires_ms)
                 VALUES ($1, $2, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $3)
                 ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url, expires_ms = EXCLUDED.expires_ms",
                &[&instance_id, &url, &(ttl_ms.min(3_600_000) as i64)],
            )
            .await
            .map_err(db_error)?;
        Ok(())
    }

    /// Who drives `session_id` now, without taking it.
    pub async fn session_driver(
        &self,
        session_id: &str,
    ) -> Result<crate::store::Lease, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT s.owner, s.lease_epoch, o.url
                 FROM sessions s LEFT JOIN orchestrators o ON o.id = s.owner
                   AND o.expires_ms > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT
                 WHERE s.id = $1",
                &[&session_id],
            )
            .await
            .map_err(db_error)?
            .ok_or_else(|| StoreError::NotFound(session_id.to_string()))?;
        let owner: String = row.get(0);
        let epoch: i64 = row.get(1);
        let url: Option<String> = row.get(2);
        Ok(match url {
            Some(url) if !owner.is_empty() => crate::store::Lease {
                acquired: false,
                epoch: epoch as u64,
                owner,
                owner_url: url,
            },
            _ => crate::store::Lease {
                acquired: false,
                epoch: epoch as u64,
                owner: String::new(),
                owner_url: String::new(),
            },
        })
    }

    /// Makes `instance_id` drive `session_id` unless a live replica does.
    pub async fn acquire_session(
        &self,
        session_id: &str,
        instance_id: &str,
    ) -> Result<crate::store::Lease, StoreError> {
        if instance_id.is_empty() {
            return Err(StoreError::InvalidArgument(
                "instance_id must be set".into(),
            ));
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        let row = tx
            .query_opt(
                "SELECT s.owner, s.lease_epoch, o.url,
                        o.expires_ms > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT
                 FROM sessions s LEFT JOIN orchestrators o ON o.id = s.owner
                 WHERE s.id = $1 FOR UPDATE OF s",
                &[&session_id],
            )
            .await
            .map_err(db_error)?
            .ok_or_else(|| StoreError::NotFound(session_id.to_string()))?;
        let caller_alive: bool = tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM orchestrators WHERE id = $1
                    AND expires_ms > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT)",
                &[&instance_id],
            )
            .await
            .map_err(db_error)?
            .get(0);
        if !caller_alive {
            return Err(StoreError::NoHeartbeat(instance_id.to_string()));
        }
        let owner: String = row.get(0);
        let epoch: i64 = row.get(1);
        let url: Option<String> = row.get(2);
        let alive: Option<bool> = row.get(3);
        let lease = if !owner.is_empty() && alive == Some(true) {
            crate::store::Lease {
                acquired: owner == instance_id,
                epoch: epoch as u64,
                owner,
                owner_url: url.unwrap_or_default(),
            }
        } else {
            let epoch = epoch + 1;
            tx.execute(
                "UPDATE sessions SET owner = $2, lease_epoch = $3 WHERE id = $1",
                &[&session_id, &instance_id, &epoch],
            )
            .await
            .map_err(db_error)?;
            let url: Option<String> = tx
                .query_opt(
                    "SELECT url FROM orchestrators WHERE id = $1",
                    &[&instance_id],
                )
                .await
                .map_err(db_error)?
                .map(|r| r.get(0));
            crate::store::Lease {
                acquired: true,
                epoch: epoch as u64,
                owner: instance_id.to_string(),
                owner_url: url.unwrap_or_default(),
            }
        };
        tx.commit().await.map_err(db_error)?;
        Ok(lease)
    }

    /// Lets go of a session `instance_id` drives with lease `epoch`.
    pub async fn release_session(
        &self,
        session_id: &str,
        instance_id: &str,
        epoch: u64,
    ) -> Result<bool, StoreError> {
        let changed = self
            .client()
            .await?
            .execute(
                "UPDATE sessions SET owner = '' WHERE id = $1 AND owner = $2 AND lease_epoch = $3",
                &[&session_id, &instance_id, &(epoch as i64)],
            )
            .await
            .map_err(db_error)?;
        Ok(changed == 1)
    }
}
