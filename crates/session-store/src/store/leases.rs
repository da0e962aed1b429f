//! Leases: which orchestrator replica drives each session. A replica stays
//! alive while it renews its heartbeat; a session whose driver is gone (or
//! never had one) goes to the next replica that asks, with a new epoch.

use super::{Store, StoreError, now_ms};
use rusqlite::{OptionalExtension, params};

/// The answer to an acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Whether the caller drives the session now.
    pub acquired: bool,
    /// The session's lease epoch.
    pub epoch: u64,
    /// The replica that drives it.
    pub owner: String,
    /// Where that replica is reached.
    pub owner_url: String,
}

impl Store {
    /// Records that replica `instance_id` (at `url`) is alive for `ttl_ms`
    /// more (0: gone now).
    pub fn heartbeat(&self, instance_id: &str, url: &str, ttl_ms: u64) -> Result<(), StoreError> {
        if instance_id.is_empty() {
            return Err(StoreError::InvalidArgument(
                "instance_id must be set".into(),
            ));
        }
        let expires = now_ms() + ttl_ms.min(3_600_000) as i64;
        self.writer().execute(
            "INSERT INTO orchestrators (id, url, expires_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT(id) DO UPDATE SET url = excluded.url, expires_ms = excluded.expires_ms",
            params![instance_id, url, expires],
        )?;
        Ok(())
    }

    /// Who drives `session_id` now, without taking it: the live owner's
    /// lease (`acquired` false), or an empty owner when nobody alive does.
    pub fn session_driver(&self, session_id: &str) -> Result<Lease, StoreError> {
        let conn = self.reader();
        let (owner, epoch, url): (String, i64, Option<String>) = conn
            .query_row(
                "SELECT s.owner, s.lease_epoch, o.url FROM sessions s
                 LEFT JOIN orchestrators o ON o.id = s.owner AND o.expires_ms > ?2
                 WHERE s.id = ?1",
                params![session_id, now_ms()],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?
            .ok_or_else(|| StoreError::NotFound(session_id.to_string()))?;
        Ok(match url {
            Some(url) if !owner.is_empty() => Lease {
                acquired: false,
                epoch: epoch as u64,
                owner,
                owner_url: url,
            },
            _ => Lease {
                acquired: false,
                epoch: epoch as u64,
                owner: String::new(),
                owner_url: String::new(),
            },
        })
    }

    /// Makes `instance_id` drive `session_id` unless a live replica does.
    pub fn acquire_session(
        &self,
        session_id: &str,
        instance_id: &str,
    ) -> Result<Lease, StoreError> {
        if instance_id.is_empty() {
            return Err(StoreError::InvalidArgument(
                "instance_id must be set".into(),
            ));
        }
        let mut conn = self.writer();
        let tx = conn.transaction()?;
        let caller_alive: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM orchestrators WHERE id = ?1 AND expires_ms > ?2)",
            params![instance_id, now_ms()],
            |r| r.get(0),
        )?;
        let (owner, epoch): (String, i64) = tx
            .query_row(
                "SELECT owner, lease_epoch FROM sessions WHERE id = ?1",
                [session_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?
            .ok_or_else(|| StoreError::NotFound(session_id.to_string()))?;
        let live: Option<String> = if owner.is_empty() {
            None
        } else {
            tx.query_row(
                "SELECT url FROM orchestrators WHERE id = ?1 AND expires_ms > ?2",
                params![owner, now_ms()],
                |r| r.get(0),
            )
            .optional()?
        };
        if !caller_alive {
            return Err(StoreError::NoHeartbeat(instance_id.to_string()));
        }
        let lease = match live {
            Some(url) if owner != instance_id => Lease {
                acquired: false,
                epoch: epoch as u64,
                owner,
                owner_url: url,
            },
            Some(url) => Lease {
                acquired: true,
                epoch: epoch as u64,
                owner,
                owner_url: url,
            },
            None => {
                let epoch = epoch + 1;
                tx.execute(
                    "UPDATE sessions SET owner = ?2, lease_epoch = ?3 WHERE id = ?1",
                    params![session_id, instance_id, epoch],
                )?;
                let url: String = tx
                    .query_row(
                        "SELECT url FROM orchestrators WHERE id = ?1",
                        [instance_id],
                        |r| r.get(0),
                    )
                    .optional()?
                    .unwrap_or_default();
                Lease {
                    acquired: true,
                    epoch: epoch as u64,
                    owner: instance_id.to_string(),
                    owner_url: url,
                }
            }
        };
        tx.commit()?;
        Ok(lease)
    }

    /// Lets go of a session `instance_id` drives with lease `epoch`.
    pub fn release_session(
        &self,
        session_id: &str,
        instance_id: &str,
        epoch: u64,
    ) -> Result<bool, StoreError> {
        let changed = self.writer().execute(
            "UPDATE sessions SET owner = '' WHERE id = ?1 AND owner = ?2 AND lease_epoch = ?3",
            params![session_id, instance_id, epoch as i64],
        )?;
        Ok(changed == 1)
    }
}
