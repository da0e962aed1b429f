//! MCP servers as tools: the runner connects to the configured servers,
//! offers their tools as `<server>__<tool>` and runs calls of them.
//!
//! Where servers run: a stdio server runs **per session**, inside that
//! session's sandbox (its workspace, temp dir, identity, limits and
//! network rules), like every process a tool starts. Servers keep state per
//! connection (an open repository, a browser page, a login), and one
//! session must never see another's; a connection per session gives each
//! its own. A connection unused for `mcp.idle_secs` is closed, and at most
//! `mcp.max_connections` stay open (the least recently used is closed
//! first); the next call starts the server again. A streamable HTTP
//! server is reached the same way, one MCP session per Agentry session.
//!
//! One more connection per server, in a scratch workspace of its own, lists
//! the tools for the catalog and follows `tools/list_changed`; it is
//! restarted with a backoff when it fails, and its state is the server's
//! health.
//!
//! Failures: every call and every start has a deadline; a server that
//! dies is started again on the next call (the failed call says the
//! effects are unknown); consecutive failures open a per-server circuit
//! breaker, so a broken server fails fast instead of timing out each call.

pub mod conn;
pub mod content;

use crate::errors::McpError;
use crate::sandbox::Sandbox;
use crate::tools::{OutputSink, ToolOutcome};
use crate::web::breaker::{Breaker, BreakerSettings, BreakerState, SystemClock};
use crate::{ToolError, output::CappedOutput};
use agentry_proto::sessions::v1 as spb;
use agentry_runtime::config::{MCP_SEPARATOR, McpConfig, McpServerConfig};
use conn::{CallError, Conn, ConnEvent, Place};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// The identity (and scratch workspace name) of the connections that list
/// servers' tools.
const CATALOG: &str = ".mcp-catalog";

/// Settings of the MCP client.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Default deadline of a call.
    pub call_timeout: Duration,
    /// Deadline of a start.
    pub init_timeout: Duration,
    /// Idle connections are closed after this.
    pub idle: Duration,
    /// Most connections kept.
    pub max_connections: usize,
    /// The circuit breaker of each server.
    pub breaker: BreakerSettings,
}

impl Default for Settings {
    /// The built-in defaults.
    fn default() -> Settings {
        Settings::from_config(&agentry_runtime::Config::builtin().mcp)
    }
}

impl Settings {
    /// The settings of the configuration.
    pub fn from_config(config: &McpConfig) -> Settings {
        Settings {
            call_timeout: Duration::from_secs(config.call_timeout_secs),
            init_timeout: Duration::from_secs(config.init_timeout_secs),
            idle: Duration::from_secs(config.idle_secs),
            max_connections: config.max_connections,
            breaker: BreakerSettings {
                failure_threshold: config.breaker_failures.max(1),
                open_for: Duration::from_secs(config.breaker_open_secs),
            },
        }
    }
}

/// A tool of a server, as offered.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    /// `<server>__<tool>`, made safe for model APIs.
    pub exposed: String,
    /// The server's own name for it.
    pub original: String,
    /// Its description.
    pub description: String,
    /// JSON Schema of its arguments.
    pub schema: serde_json::Value,
    /// The server says it changes nothing.
    pub read_only_hint: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Starting,
    Ready,
    Failed(String),
}

struct Server {
    config: McpServerConfig,
    timeout: Duration,
    breaker: Breaker,
    tools: RwLock<Vec<McpTool>>,
    state: Mutex<State>,
    /// The last failure of a call or a session's start.
    last_error: Mutex<Option<String>>,
    /// Wakes the catalog connection to list the tools again.
    relist: tokio::sync::Notify,
    calls: AtomicU64,
    failures: AtomicU64,
    restarts: AtomicU64,
}

type Slot = Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>;

struct Shared {
    servers: BTreeMap<String, Arc<Server>>,
    settings: Settings,
    sandbox: Sandbox,
    places: crate::projects::Places,
    egress: Option<Arc<crate::egress::Egress>>,
    /// Connections by (server, session).
    conns: Mutex<HashMap<(String, String), Slot>>,
    /// Subscriptions whose resource is being read for an update, and
    /// whether it changed again meanwhile.
    reading: Mutex<HashMap<Sub, bool>>,
    /// Serializes changes of the subscriptions file within this runner.
    subs_file_lock: Mutex<()>,
    /// Resource subscriptions, kept in [`Shared::subs_file`].
    subs: Mutex<BTreeSet<Sub>>,
    /// Updates not yet acknowledged, the latest per subscription.
    pending: Mutex<BTreeMap<Sub, Update>>,
    /// Bumped when `pending` gains an update.
    changed: tokio::sync::watch::Sender<u64>,
}

/// A session's subscription to a resource of a server.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Sub {
    /// The session.
    pub session_id: String,
    /// The server's name.
    pub server: String,
    /// The resource.
    pub uri: String,
}

/// A subscribed resource changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// Derived from the subscription and the content.
    pub id: String,
    /// What changed, for whom.
    pub sub: Sub,
    /// The content after the change (capped).
    pub content: String,
}

/// Most resource subscriptions one session may hold.
pub const MAX_SUBSCRIPTIONS_PER_SESSION: usize = 16;

/// Largest resource content an update carries.
const UPDATE_CONTENT_BYTES: usize = 16 * 1024;

/// FNV-1a, 64 bits: the same update gets the same id on every runner.
fn fnv64(parts: &[&str]) -> String {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// The MCP servers of one runner.
#[derive(Clone)]
pub struct Mcp {
    shared: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Mcp {
    /// The enabled servers of `servers`; nothing is started yet.
    pub fn new(
        servers: Vec<McpServerConfig>,
        settings: Settings,
        sandbox: Sandbox,
        places: crate::projects::Places,
        egress: Option<Arc<crate::egress::Egress>>,
    ) -> Mcp {
        let servers = servers
            .into_iter()
            .filter(|s| s.enabled)
            .map(|config| {
                let timeout = match config.timeout_secs {
                    0 => settings.call_timeout,
                    secs => Duration::from_secs(secs),
                };
                let breaker = Breaker::new(
                    format!("mcp {}", config.name),
                    settings.breaker,
                    Arc::new(SystemClock),
                );
                (
                    config.name.clone(),
                    Arc::new(Server {
                        config,
                        timeout,
                        breaker,
                        tools: RwLock::default(),
                        state: Mutex::new(State::Starting),
                        last_error: Mutex::default(),
                        relist: tokio::sync::Notify::new(),
                        calls: AtomicU64::new(0),
                        failures: AtomicU64::new(0),
                        restarts: AtomicU64::new(0),
                    }),
                )
            })
            .collect();
        Mcp {
            shared: Arc::new(Shared {
                servers,
                settings,
                sandbox,
                places,
                egress,
                conns: Mutex::default(),
                reading: Mutex::default(),
                subs_file_lock: Mutex::default(),
                subs: Mutex::default(),
                pending: Mutex::default(),
                changed: tokio::sync::watch::channel(0).0,
            }),
        }
    }

    /// Whether any server is configured.
    pub fn is_empty(&self) -> bool {
        self.shared.servers.is_empty()
    }

    /// Starts the connections that list each server's tools and the task
    /// that closes idle connections; they end when the returned handle is
    /// aborted (or the runtime stops).
    pub fn start_background(&self) -> tokio::task::JoinHandle<()> {
        let mut tasks = tokio::task::JoinSet::new();
        for server in self.shared.servers.values() {
            tasks.spawn(catalog_loop(self.shared.clone(), server.clone()));
        }
        tasks.spawn(idle_loop(Arc::downgrade(&self.shared)));
        self.load_subscriptions();
        tasks.spawn(self.clone().keeper_loop());
        tokio::spawn(async move { while tasks.join_next().await.is_some() {} })
    }

    /// Waits until every server has listed its tools or failed, at most
    /// `timeout`; for tests and start-up logs.
    pub async fn settled(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let starting = self
                .shared
                .servers
                .values()
                .any(|s| *lock(&s.state) == State::Starting);
            if !starting {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The tools of every ready server.
    pub fn tools(&self) -> Vec<(String, McpTool)> {
        self.shared
            .servers
            .values()
            .flat_map(|s| {
                let tools = s.tools.read().unwrap_or_else(|e| e.into_inner()).clone();
                tools.into_iter().map(|t| (s.config.name.clone(), t))
            })
            .collect()
    }

    /// Each server's state, for `ListTools` and health.
    pub fn statuses(&self) -> Vec<spb::McpServerStatus> {
        let conns = lock(&self.shared.conns);
        self.shared
            .servers
            .values()
            .map(|s| {
                let current = lock(&s.state).clone();
                let last_error = lock(&s.last_error).clone();
                let (state, error) = match (current, s.breaker.state()) {
                    (_, BreakerState::Open) => (
                        "circuit open".to_string(),
                        last_error.unwrap_or_else(|| "calls failed one after another".into()),
                    ),
                    (State::Starting, _) => ("starting".into(), String::new()),
                    (State::Ready, _) => ("ready".into(), String::new()),
                    (State::Failed(why), _) => ("failed".into(), why),
                };
                let catalog = u32::from(state == "ready");
                spb::McpServerStatus {
                    name: s.config.name.clone(),
                    transport: s.config.transport().into(),
                    state,
                    tool_count: s.tools.read().map(|t| t.len()).unwrap_or(0) as u32,
                    error,
                    connections: conns
                        .iter()
                        .filter(|((server, _), slot)| {
                            *server == s.config.name
                                && slot
                                    .try_lock()
                                    .map_or(true, |held| held.as_ref().is_some_and(|c| c.is_open()))
                        })
                        .count() as u32
                        + catalog,
                    calls: s.calls.load(Ordering::Relaxed),
                    failures: s.failures.load(Ordering::Relaxed),
                    restarts: s.restarts.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// The server of a tool name, when it is an MCP tool of a configured
    /// server.
    pub fn owns(&self, tool: &str) -> bool {
        self.server_of(tool).is_some()
    }

    fn server_of(&self, tool: &str) -> Option<Arc<Server>> {
        let (server, _) = tool.split_once(MCP_SEPARATOR)?;
        self.shared.servers.get(server).cloned()
    }

    /// Runs one call of `tool` for the session of `place`.
    pub async fn call(
        &self,
        tool: &str,
        arguments_json: &str,
        place: &Place,
        timeout: Option<Duration>,
        max_output_bytes: usize,
        sink: OutputSink,
    ) -> Result<ToolOutcome, ToolError> {
        let Some(server) = self.server_of(tool) else {
            return Err(ToolError::UnknownTool {
                name: tool.to_string(),
                available: "no MCP server has that name".into(),
            });
        };
        let name = server.config.name.clone();
        let original = {
            let tools = server.tools.read().unwrap_or_else(|e| e.into_inner());
            tools
                .iter()
                .find(|t| t.exposed == tool)
                .map(|t| t.original.clone())
        };
        let original = match original {
            Some(o) => o,
            None => {
                let known = server
                    .tools
                    .read()
                    .map(|t| {
                        t.iter()
                            .map(|t| t.exposed.clone())
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default();
                let state = match &*lock(&server.state) {
                    State::Starting => "it is starting".to_string(),
                    State::Ready => "it is ready".to_string(),
                    State::Failed(why) => format!("it is failing: {why}"),
                };
                return Err(ToolError::UnknownTool {
                    name: tool.to_string(),
                    available: if known.is_empty() {
                        format!("the MCP server {name} offers no tools now ({state})")
                    } else {
                        known
                    },
                });
            }
        };
        let arguments = match serde_json::from_str::<serde_json::Value>(arguments_json) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(_) | Err(_) => {
                return Err(ToolError::InvalidArguments(format!(
                    "the arguments of {tool} must be a JSON object"
                )));
            }
        };
        server.calls.fetch_add(1, Ordering::Relaxed);
        let permit = match server.breaker.try_acquire() {
            Ok(permit) => permit,
            Err(refused) => {
                let why = match &*lock(&server.last_error) {
                    Some(why) => format!("; last error: {why}"),
                    None => String::new(),
                };
                return Err(ToolError::Io(format!(
                    "the MCP server {name} is failing ({refused}: its calls failed {} times in a \
                     row; it is tried again within {}s){why}",
                    self.shared.settings.breaker.failure_threshold,
                    self.shared.settings.breaker.open_for.as_secs()
                )));
            }
        };
        let conn = match self.connection(&server, place).await {
            Ok(conn) => conn,
            Err(why) => {
                permit.failure();
                server.failures.fetch_add(1, Ordering::Relaxed);
                *lock(&server.last_error) = Some(why.0.clone());
                return Err(ToolError::Io(format!(
                    "cannot start the MCP server {name}: {why}"
                )));
            }
        };
        let timeout = timeout.unwrap_or(server.timeout);
        let answer = conn.call(&original, arguments, timeout, &sink).await;
        let fail = |permit: crate::web::breaker::Permit<'_>| {
            permit.failure();
            server.failures.fetch_add(1, Ordering::Relaxed);
        };
        match &answer {
            Err(CallError::Timeout(after)) => {
                *lock(&server.last_error) =
                    Some(format!("a call timed out after {}s", after.as_secs_f64()));
            }
            Err(CallError::Other(why)) => *lock(&server.last_error) = Some(why.clone()),
            _ => {}
        }
        let outcome = match answer {
            Ok(result) => {
                permit.success();
                let (text, is_error) = content::render(&result);
                let mut output = CappedOutput::new(max_output_bytes);
                output.push(text.as_bytes());
                let (output, truncated) = output.finish();
                ToolOutcome {
                    output,
                    is_error,
                    truncated,
                    ..ToolOutcome::default()
                }
            }
            Err(CallError::Server(message)) => {
                // The server is well; it refused this call.
                permit.success();
                ToolOutcome {
                    output: format!("the MCP server {name} refused the call: {message}"),
                    is_error: true,
                    ..ToolOutcome::default()
                }
            }
            Err(CallError::Timeout(after)) => {
                fail(permit);
                ToolOutcome {
                    output: format!(
                        "[timed out after {}s; the MCP server {name} was told to cancel the \
                         call, and its effects are unknown]",
                        after.as_secs_f64()
                    ),
                    is_error: true,
                    timed_out: true,
                    ..ToolOutcome::default()
                }
            }
            Err(CallError::Closed(why)) => {
                fail(permit);
                self.forget(&name, &place.session_id, &conn).await;
                *lock(&server.last_error) = Some(why.clone());
                ToolOutcome {
                    output: format!(
                        "the MCP server {name} went away during the call ({why}); the call's \
                         effects are unknown. The server is started again on the next call."
                    ),
                    is_error: true,
                    ..ToolOutcome::default()
                }
            }
            Err(CallError::Other(why)) => {
                fail(permit);
                // A transport in doubt is not used again.
                self.forget(&name, &place.session_id, &conn).await;
                ToolOutcome {
                    output: format!("the call to the MCP server {name} failed: {why}"),
                    is_error: true,
                    ..ToolOutcome::default()
                }
            }
        };
        Ok(outcome)
    }

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

    fn subs_file(&self) -> PathBuf {
        self.shared
            .places
            .root()
            .join(crate::workspace::TEMP_DIRS)
            .join(".mcp-subscriptions.json")
    }

    fn load_subscriptions(&self) {
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
    fn change_file(&self, add: &[Sub], remove: impl Fn(&Sub) -> bool) {
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
    fn session_place(&self, session_id: &str) -> Result<Place, McpError> {
        let ws = self
            .shared
            .places
            .open(session_id)
            .map_err(|e| e.to_string())?;
        self.shared
            .sandbox
            .hand_over_workspace(&ws)
            .map_err(|e| format!("cannot prepare the workspace: {e}"))?;
        Ok(self.place_of(&ws))
    }

    /// Where a session's stdio servers run: its (prepared) workspace.
    pub fn place_of(&self, ws: &crate::workspace::Workspace) -> Place {
        Place {
            session_id: ws.session_id().to_string(),
            owner: ws.owner(),
            workspace: ws.root().to_path_buf(),
            tmp: ws.tmp().to_path_buf(),
            spec_dir: spec_dir(&self.shared),
        }
    }

    /// A subscribed resource changed: read it (one read at a time per
    /// subscription, again when it changed during the read, so the last
    /// content wins) and queue the update.
    fn changed(&self, sub: Sub) {
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
    async fn keeper_loop(self) {
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

    /// The session's open connection to `server`, started when there is
    /// none (or it ended).
    async fn connection(&self, server: &Arc<Server>, place: &Place) -> Result<Arc<Conn>, McpError> {
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

    async fn forget(&self, server: &str, session_id: &str, conn: &Arc<Conn>) {
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
    fn drop_slot(&self, key: &(String, String), slot: &Slot) {
        let mut conns = lock(&self.shared.conns);
        if conns.get(key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            conns.remove(key);
        }
    }

    /// Closes the least recently used connections past the limit.
    async fn make_room(&self) {
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

fn key_of(server: &Server, place: &Place) -> (String, String) {
    (server.config.name.clone(), place.session_id.clone())
}

/// Closes the session connections `choose` picks out of the open ones
/// (key, last use).
async fn close_where(
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

async fn idle_loop(shared: std::sync::Weak<Shared>) {
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
async fn open(shared: &Arc<Shared>, server: &Arc<Server>, place: &Place) -> Result<Conn, McpError> {
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

async fn open_with(
    shared: &Shared,
    server: &Server,
    place: &Place,
    events: tokio::sync::mpsc::UnboundedSender<ConnEvent>,
) -> Result<Conn, McpError> {
    let network = if server.config.network && server.config.url.is_empty() {
        let egress = shared
            .egress
            .as_ref()
            .ok_or("it asks for network, but this tool runner gives none")?;
        Some(
            egress
                .grant()
                .map_err(|why| format!("it asks for network, which cannot be given: {why}"))?,
        )
    } else {
        None
    };
    Conn::open(
        &server.config,
        place,
        &shared.sandbox,
        network,
        shared.settings.init_timeout,
        events,
    )
    .await
}

/// Where sandbox settings are handed to the helper (private to the runner).
fn spec_dir(shared: &Shared) -> PathBuf {
    shared
        .places
        .root()
        .join(crate::workspace::TEMP_DIRS)
        .join(".mcp-specs")
}

/// The place of the connection that lists a server's tools.
fn catalog_place(shared: &Shared, server: &str) -> Result<Place, McpError> {
    let base = shared
        .places
        .root()
        .join(crate::workspace::TEMP_DIRS)
        .join(CATALOG);
    let place = Place {
        session_id: CATALOG.to_string(),
        owner: None,
        workspace: base.join(server),
        tmp: base.join(format!("{server}.tmp")),
        spec_dir: spec_dir(shared),
    };
    for dir in [&base, &place.workspace, &place.tmp] {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    for dir in [&place.workspace, &place.tmp] {
        shared
            .sandbox
            .hand_over(crate::sandbox::Who::session(CATALOG), dir)
            .map_err(|e| format!("cannot hand {} over: {e}", dir.display()))?;
    }
    // The identity must be able to pass through the base directory.
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o711));
    Ok(place)
}

/// Keeps one connection per server that lists its tools, relisting on
/// `tools/list_changed` and starting it again (with a backoff) when it
/// fails.
async fn catalog_loop(shared: Arc<Shared>, server: Arc<Server>) {
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
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(60));
    }
}

/// Lists the tools of `server` through `conn` and marks it ready.
async fn relist(server: &Server, conn: &Conn, timeout: Duration) -> Result<(), McpError> {
    let name = &server.config.name;
    let tools = conn.list_tools(timeout).await?;
    let offered = offered_tools(name, &tools);
    tracing::info!(server = %name, tools = offered.len(), "MCP server ready");
    *server.tools.write().unwrap_or_else(|e| e.into_inner()) = offered;
    *lock(&server.state) = State::Ready;
    Ok(())
}

/// Most tools offered of one server (each one costs tokens in every
/// request).
pub const MAX_TOOLS_PER_SERVER: usize = 128;
/// Longest tool description offered, in bytes.
const MAX_DESCRIPTION: usize = 2048;
/// Largest input schema offered, in bytes of JSON.
const MAX_SCHEMA: usize = 32 * 1024;

/// The tools of `server` as offered to the model: at most
/// [`MAX_TOOLS_PER_SERVER`], descriptions cut, tools with huge schemas left
/// out (with a warning).
pub fn offered_tools(server: &str, tools: &[rmcp::model::Tool]) -> Vec<McpTool> {
    let mut offered: Vec<McpTool> = Vec::new();
    if tools.len() > MAX_TOOLS_PER_SERVER {
        tracing::warn!(
            server,
            tools = tools.len(),
            "the MCP server offers more tools than are passed on; the first {MAX_TOOLS_PER_SERVER} are"
        );
    }
    for tool in tools.iter().take(MAX_TOOLS_PER_SERVER) {
        let mut safe: String = tool
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let room = 64usize.saturating_sub(server.len() + MCP_SEPARATOR.len());
        safe.truncate(room);
        let exposed = format!("{server}{MCP_SEPARATOR}{safe}");
        if offered.iter().any(|t| t.exposed == exposed) {
            tracing::warn!(server, tool = %tool.name, "two MCP tools have the same name once made safe; the second is not offered");
            continue;
        }
        let mut schema = serde_json::Value::Object((*tool.input_schema).clone());
        if schema.to_string().len() > MAX_SCHEMA {
            tracing::warn!(server, tool = %tool.name, "the tool's input schema is too large to offer; it is left out");
            continue;
        }
        if let Some(obj) = schema.as_object_mut() {
            obj.entry("type")
                .or_insert_with(|| serde_json::Value::String("object".into()));
        }
        offered.push(McpTool {
            exposed,
            original: tool.name.to_string(),
            description: {
                let mut d = tool
                    .description
                    .as_deref()
                    .unwrap_or(tool.title.as_deref().unwrap_or(""))
                    .to_string();
                if d.len() > MAX_DESCRIPTION {
                    let mut at = MAX_DESCRIPTION;
                    while !d.is_char_boundary(at) {
                        at -= 1;
                    }
                    d.truncate(at);
                    d.push('…');
                }
                d
            },
            schema,
            read_only_hint: tool
                .annotations
                .as_ref()
                .and_then(|a| a.read_only_hint)
                .unwrap_or(false),
        });
    }
    offered
}
