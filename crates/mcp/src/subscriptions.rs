//! Resource subscriptions: which sessions follow which resources of which
//! servers (kept in a file of the workspace volume, so a restart keeps
//! them), and the updates waiting to be acknowledged.

use super::*;

impl Mcp {
    /// Subscribes `session_id` to updates of `uri` on `server` (or ends
    /// the subscription); updates then wait in [`Mcp::pending`]. Returns
    /// the session's subscriptions on that server.
    pub async fn subscribe(
        &self,
        session_id: &str,
        server: &str,
        uri: &str,
        unsubscribe: bool,
    ) -> Result<Vec<String>, McpError> {
        let Some(s) = self.shared.servers.get(server).cloned() else {
            return Err(McpError(format!(
                "no MCP server is named {server:?}; configured: {}",
                self.shared
                    .servers
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        if uri.trim().is_empty() {
            return Err("the resource URI is empty".into());
        }
        let sub = Sub {
            session_id: session_id.to_string(),
            server: server.to_string(),
            uri: uri.to_string(),
        };
        if unsubscribe {
            lock(&self.shared.subs).remove(&sub);
            lock(&self.shared.pending).remove(&sub);
            self.change_file(&[], |s| *s == sub);
        } else {
            let held = lock(&self.shared.subs)
                .iter()
                .filter(|s| s.session_id == session_id)
                .count();
            if held >= MAX_SUBSCRIPTIONS_PER_SESSION && !lock(&self.shared.subs).contains(&sub) {
                return Err(McpError(format!(
                    "this session already holds {held} subscriptions, the most it may; \
                     unsubscribe from one first"
                )));
            }
            let place = self.session_place(session_id)?;
            let conn = self.connection(&s, &place).await?;
            let supports = conn.supports_subscriptions();
            if !supports {
                return Err(McpError(format!(
                    "the MCP server {server} does not offer resource subscriptions"
                )));
            }
            conn.subscribe(uri, self.shared.settings.init_timeout)
                .await?;
            lock(&self.shared.subs).insert(sub.clone());
            self.change_file(&[sub], |_| false);
        }
        Ok(lock(&self.shared.subs)
            .iter()
            .filter(|s| s.session_id == session_id && s.server == server)
            .map(|s| s.uri.clone())
            .collect())
    }

    /// Reads `uri` of `server` as `session_id`: its text, MIME type, and
    /// whether it was cut to `max_bytes`.
    pub async fn read_resource(
        &self,
        session_id: &str,
        server: &str,
        uri: &str,
        max_bytes: usize,
    ) -> Result<(String, String, bool), McpError> {
        let Some(s) = self.shared.servers.get(server).cloned() else {
            return Err(McpError(format!("no MCP server is named {server:?}")));
        };
        let place = self.session_place(session_id)?;
        let conn = self.connection(&s, &place).await?;
        let (text, mime) = conn.read_resource(uri, s.timeout).await?;
        let mut out = CappedOutput::new(max_bytes);
        out.push(text.as_bytes());
        let (text, truncated) = out.finish();
        Ok((text, mime, truncated))
    }

    /// Updates waiting to be acknowledged.
    pub fn pending(&self) -> Vec<Update> {
        lock(&self.shared.pending).values().cloned().collect()
    }

    /// Changes whenever an update is added.
    pub fn pending_changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    /// Forgets acknowledged updates; `gone` ones also end their session's
    /// subscriptions (the session no longer exists).
    pub fn acknowledge(&self, acks: &[String], gone: &[String]) {
        let mut pending = lock(&self.shared.pending);
        let mut dropped = Vec::new();
        pending.retain(|sub, update| {
            if gone.contains(&update.id) {
                dropped.push(sub.session_id.clone());
                return false;
            }
            !acks.contains(&update.id)
        });
        drop(pending);
        if !dropped.is_empty() {
            lock(&self.shared.subs).retain(|s| !dropped.contains(&s.session_id));
            self.change_file(&[], |s| dropped.contains(&s.session_id));
        }
    }

    /// The subscriptions, for tests and health.
    pub fn subscriptions(&self) -> Vec<Sub> {
        lock(&self.shared.subs).iter().cloned().collect()
    }

    pub(super) fn subs_file(&self) -> PathBuf {
        self.shared.host.state_dir().join(".mcp-subscriptions.json")
    }

    pub(super) fn load_subscriptions(&self) {
        let path = self.subs_file();
        let subs: Vec<Sub> = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(subs) => subs,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot read the MCP subscriptions; starting without them");
                    Vec::new()
                }
            },
            Err(_) => Vec::new(),
        };
        let known: Vec<Sub> = subs
            .into_iter()
            .filter(|s| self.shared.servers.contains_key(&s.server))
            .collect();
        if !known.is_empty() {
            tracing::info!(count = known.len(), "restoring MCP resource subscriptions");
        }
        lock(&self.shared.subs).extend(known);
    }

    /// Changes the subscriptions file: adds `add`, removes what `remove`
    /// picks. The file is shared by the runners of one workspace volume, so
    /// each change is applied to what it holds now, under a lock; it is
    /// private to the runner's user (mode 0600), beneath the workspace root
    /// that no sandbox can read.
    pub(super) fn change_file(&self, add: &[Sub], remove: impl Fn(&Sub) -> bool) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let _serial = lock(&self.shared.subs_file_lock);
        let path = self.subs_file();
        let change = || -> std::io::Result<()> {
            let guard = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(path.with_extension("lock"))?;
            rustix::fs::flock(&guard, rustix::fs::FlockOperation::LockExclusive)?;
            let mut set: BTreeSet<Sub> = match std::fs::read(&path) {
                Ok(bytes) => serde_json::from_slice::<Vec<Sub>>(&bytes)
                    .map(|v| v.into_iter().collect())
                    .unwrap_or_default(),
                Err(_) => BTreeSet::new(),
            };
            set.retain(|s| !remove(s));
            set.extend(add.iter().cloned());
            let subs: Vec<&Sub> = set.iter().collect();
            let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(&serde_json::to_vec_pretty(&subs).unwrap_or_default())?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = change() {
            tracing::warn!(path = %path.display(), error = %e, "cannot save the MCP subscriptions");
        }
    }

    /// The session's workspace, prepared for its identity.
    pub(super) fn session_place(&self, session_id: &str) -> Result<Place, McpError> {
        self.shared.host.session_place(session_id)
    }

    /// A subscribed resource changed: read it (one read at a time per
    /// subscription, again when it changed during the read, so the last
    /// content wins) and queue the update.
    pub(super) fn changed(&self, sub: Sub) {
        {
            let mut reading = lock(&self.shared.reading);
            if let Some(again) = reading.get_mut(&sub) {
                *again = true;
                return;
            }
            reading.insert(sub.clone(), false);
        }
        let weak = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            loop {
                let Some(shared) = weak.upgrade() else { return };
                let this = Mcp { shared };
                match this
                    .read_resource(&sub.session_id, &sub.server, &sub.uri, UPDATE_CONTENT_BYTES)
                    .await
                {
                    Ok((content, _, _)) => {
                        let update = Update {
                            id: fnv64(&[&sub.session_id, &sub.server, &sub.uri, &content]),
                            sub: sub.clone(),
                            content,
                        };
                        tracing::info!(session = %sub.session_id, server = %sub.server, uri = %sub.uri, id = %update.id, "MCP resource updated");
                        lock(&this.shared.pending).insert(sub.clone(), update);
                        this.shared.changed.send_modify(|n| *n += 1);
                    }
                    // Not worth waking the model for: the next change reads
                    // it again.
                    Err(why) => {
                        tracing::warn!(session = %sub.session_id, server = %sub.server, uri = %sub.uri, error = %why, "cannot read an updated MCP resource");
                    }
                }
                let mut reading = lock(&this.shared.reading);
                match reading.get_mut(&sub) {
                    Some(again) if *again => *again = false,
                    _ => {
                        reading.remove(&sub);
                        return;
                    }
                }
            }
        });
    }

    /// Keeps every subscription's connection open, starting it again (and
    /// subscribing again) when it ended.
    pub(super) async fn keeper_loop(self) {
        let mut retry_at: HashMap<Sub, (Instant, Duration)> = HashMap::new();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            for sub in self.subscriptions() {
                let key = (sub.server.clone(), sub.session_id.clone());
                let slot = lock(&self.shared.conns).get(&key).cloned();
                let open = match &slot {
                    Some(slot) => match slot.try_lock() {
                        Ok(held) => held
                            .as_ref()
                            .is_some_and(|c| c.is_open() && c.subscribed().contains(&sub.uri)),
                        // Being opened or used right now.
                        Err(_) => true,
                    },
                    None => false,
                };
                if open {
                    retry_at.remove(&sub);
                    continue;
                }
                if retry_at
                    .get(&sub)
                    .is_some_and(|(at, _)| Instant::now() < *at)
                {
                    continue;
                }
                let Some(server) = self.shared.servers.get(&sub.server).cloned() else {
                    continue;
                };
                let again = async {
                    let place = self.session_place(&sub.session_id)?;
                    let conn = self.connection(&server, &place).await?;
                    conn.subscribe(&sub.uri, self.shared.settings.init_timeout)
                        .await
                };
                match again.await {
                    Ok(()) => {
                        tracing::info!(session = %sub.session_id, server = %sub.server, uri = %sub.uri, "MCP subscription established again");
                        retry_at.remove(&sub);
                    }
                    Err(why) => {
                        let delay = retry_at
                            .get(&sub)
                            .map(|(_, d)| (*d * 2).min(Duration::from_secs(60)))
                            .unwrap_or(Duration::from_secs(1));
                        tracing::warn!(session = %sub.session_id, server = %sub.server, uri = %sub.uri, error = %why, retry_in = ?delay, "cannot subscribe again");
                        retry_at.insert(sub, (Instant::now() + delay, delay));
                    }
                }
            }
        }
    }
}
