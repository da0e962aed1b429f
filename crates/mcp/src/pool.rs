//! The connections: one per server and session, opened on first use,
//! closed when idle or when room is needed; and the catalog connection of
//! each server, which lists its tools and follows their changes.

use super::*;

impl Mcp {
    /// The session's open connection to `server`, started when there is
    /// none (or it ended).
    pub(super) async fn connection(
        &self,
        server: &Arc<Server>,
        place: &Place,
    ) -> Result<Arc<Conn>, McpError> {
        let key = key_of(server, place);
        let slot = lock(&self.shared.conns).entry(key).or_default().clone();
        let mut held = slot.lock().await;
        if let Some(conn) = held.as_ref() {
            if conn.is_open() {
                return Ok(conn.clone());
            }
            server.restarts.fetch_add(1, Ordering::Relaxed);
            tracing::info!(server = %server.config.name, session = %place.session_id, "the MCP server's connection ended; starting it again");
        }
        *held = None;
        let conn = match open(&self.shared, server, place).await {
            Ok(conn) => Arc::new(conn),
            Err(why) => {
                drop(held);
                self.drop_slot(&key_of(server, place), &slot);
                return Err(why);
            }
        };
        *held = Some(conn.clone());
        drop(held);
        self.make_room().await;
        Ok(conn)
    }

    pub(super) async fn forget(&self, server: &str, session_id: &str, conn: &Arc<Conn>) {
        let key = (server.to_string(), session_id.to_string());
        let slot = lock(&self.shared.conns).get(&key).cloned();
        if let Some(slot) = slot {
            let mut held = slot.lock().await;
            if held.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
                *held = None;
                drop(held);
                self.drop_slot(&key, &slot);
            }
        }
    }

    /// Removes an empty slot from the map (unless it was replaced).
    pub(super) fn drop_slot(&self, key: &(String, String), slot: &Slot) {
        let mut conns = lock(&self.shared.conns);
        if conns.get(key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            conns.remove(key);
        }
    }

    /// Closes the least recently used connections past the limit.
    pub(super) async fn make_room(&self) {
        close_where(&self.shared, |open| {
            let excess = open
                .len()
                .saturating_sub(self.shared.settings.max_connections);
            let mut by_age: Vec<_> = open.iter().collect();
            by_age.sort_by_key(|(_, used)| *used);
            by_age
                .into_iter()
                .take(excess)
                .map(|(key, _)| key.clone())
                .collect()
        })
        .await;
    }
}

pub(super) fn key_of(server: &Server, place: &Place) -> (String, String) {
    (server.config.name.clone(), place.session_id.clone())
}

/// Closes the session connections `choose` picks out of the open ones
/// (key, last use).
pub(super) async fn close_where(
    shared: &Shared,
    choose: impl FnOnce(&[((String, String), Instant)]) -> Vec<(String, String)>,
) {
    let slots: Vec<((String, String), Slot)> = lock(&shared.conns)
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let kept: BTreeSet<(String, String)> = lock(&shared.subs)
        .iter()
        .map(|s| (s.server.clone(), s.session_id.clone()))
        .collect();
    let mut open = Vec::new();
    for (key, slot) in &slots {
        // Connections holding subscriptions stay open.
        if kept.contains(key) {
            continue;
        }
        // A slot being opened is busy, not idle.
        if let Ok(held) = slot.try_lock()
            && let Some(conn) = held.as_ref()
        {
            open.push((key.clone(), conn.last_used()));
        }
    }
    for key in choose(&open) {
        tracing::debug!(server = %key.0, session = %key.1, "closing an MCP connection");
        let slot = lock(&shared.conns).remove(&key);
        if let Some(slot) = slot {
            // In-flight calls keep their own handle and finish first.
            *slot.lock().await = None;
        }
    }
}

pub(super) async fn idle_loop(shared: std::sync::Weak<Shared>) {
    loop {
        let period = match shared.upgrade() {
            Some(s) => {
                (s.settings.idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30))
            }
            None => return,
        };
        tokio::time::sleep(period).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let idle = shared.settings.idle;
        close_where(&shared, |open| {
            open.iter()
                .filter(|(_, used)| used.elapsed() >= idle)
                .map(|(key, _)| key.clone())
                .collect()
        })
        .await;
    }
}

/// Opens a connection for `place`; what the server announces is handled
/// as it arrives: a tool list change relists the catalog, a subscribed
/// resource's change becomes an update.
pub(super) async fn open(
    shared: &Arc<Shared>,
    server: &Arc<Server>,
    place: &Place,
) -> Result<Conn, McpError> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let conn = open_with(shared, server, place, tx).await?;
    // Weak: the connection (held by `shared`) owns the sender this task
    // waits on.
    let weak = Arc::downgrade(shared);
    let (server, session_id) = (server.clone(), place.session_id.clone());
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            match event {
                ConnEvent::ToolsChanged => server.relist.notify_one(),
                ConnEvent::ResourceUpdated { uri } => {
                    let Some(shared) = weak.upgrade() else { return };
                    let sub = Sub {
                        session_id: session_id.clone(),
                        server: server.config.name.clone(),
                        uri,
                    };
                    if lock(&shared.subs).contains(&sub) {
                        Mcp { shared }.changed(sub);
                    }
                }
            }
        }
    });
    Ok(conn)
}

pub(super) async fn open_with(
    shared: &Shared,
    server: &Server,
    place: &Place,
    events: tokio::sync::mpsc::UnboundedSender<ConnEvent>,
) -> Result<Conn, McpError> {
    Conn::open(
        &server.config,
        place,
        shared.host.as_ref(),
        shared.settings.init_timeout,
        events,
    )
    .await
}

/// The place of the connection that lists a server's tools.
pub(super) fn catalog_place(shared: &Shared, server: &str) -> Result<Place, McpError> {
    shared.host.catalog_place(server)
}

/// Keeps one connection per server that lists its tools, relisting on
/// `tools/list_changed` and starting it again (with a backoff) when it
/// fails.
pub(super) async fn catalog_loop(shared: Arc<Shared>, server: Arc<Server>) {
    let name = server.config.name.clone();
    let mut backoff = Duration::from_millis(500);
    loop {
        let result: Result<std::convert::Infallible, McpError> = async {
            let place = catalog_place(&shared, &name)?;
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let conn = open_with(&shared, &server, &place, tx).await?;
            let timeout = shared.settings.init_timeout;
            relist(&server, &conn, timeout).await?;
            let mut check = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    event = rx.recv() => match event {
                        Some(ConnEvent::ToolsChanged) => relist(&server, &conn, timeout).await?,
                        Some(_) => {}
                        None => return Err(McpError::from("the connection ended")),
                    },
                    () = server.relist.notified() => relist(&server, &conn, timeout).await?,
                    _ = check.tick() => {
                        if !conn.is_open() {
                            return Err(McpError::from("the server went away"));
                        }
                    }
                }
            }
        }
        .await;
        let Err(why) = result;
        tracing::warn!(server = %name, error = %why, retry_in = ?backoff, "MCP server unavailable");
        *lock(&server.state) = State::Failed(why.0);
        if signed_in_meanwhile(&shared, &server, backoff).await {
            backoff = Duration::from_millis(500);
        } else {
            backoff = (backoff * 2).min(Duration::from_secs(60));
        }
    }
}

/// Waits `backoff`, or less when someone signs in to the (HTTP) server
/// meanwhile (`agentry mcp login` wrote its tokens): then it is tried again
/// at once. Returns whether that happened.
async fn signed_in_meanwhile(shared: &Shared, server: &Server, backoff: Duration) -> bool {
    if server.config.url.trim().is_empty() {
        tokio::time::sleep(backoff).await;
        return false;
    }
    let path = crate::oauth::credentials_path(&shared.host.state_dir(), &server.config.name);
    let stamp = || std::fs::metadata(&path).and_then(|m| m.modified()).ok();
    let before = stamp();
    let deadline = tokio::time::Instant::now() + backoff;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250).min(backoff)).await;
        if stamp() != before {
            return true;
        }
    }
    false
}

/// Lists the tools of `server` through `conn` and marks it ready.
pub(super) async fn relist(
    server: &Server,
    conn: &Conn,
    timeout: Duration,
) -> Result<(), McpError> {
    let name = &server.config.name;
    let tools = conn.list_tools(timeout).await?;
    let offered = offered_tools(name, &tools);
    tracing::info!(server = %name, tools = offered.len(), "MCP server ready");
    *server.tools.write().unwrap_or_else(|e| e.into_inner()) = offered;
    *lock(&server.state) = State::Ready;
    Ok(())
}
