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
mod host;
pub mod oauth;
mod pool;
mod process;
mod subscriptions;

pub use host::{Host, Launch, Place};

/// Live output of a running call: (stream, text).
pub type OutputSink =
    tokio::sync::mpsc::Sender<(agentry_proto::sessions::v1::OutputStream, String)>;

agentry_tool::sentence_error!(
    /// Why an MCP server could not be reached, started or used, as a sentence
    /// for a person or the model.
    McpError
);

use pool::{catalog_loop, idle_loop};

use agentry_proto::sessions::v1 as spb;
use agentry_runtime::config::{MCP_SEPARATOR, McpConfig, McpServerConfig};
use agentry_tool::breaker::{Breaker, BreakerSettings, BreakerState, SystemClock};
use agentry_tool::output::CappedOutput;
use agentry_tool::{ToolError, ToolOutcome};
use conn::{CallError, Conn, ConnEvent};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// The identity (and scratch workspace name) of the connections that list
/// servers' tools.
pub const CATALOG: &str = ".mcp-catalog";

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

impl Server {
    fn new(config: McpServerConfig, settings: &Settings) -> Server {
        let timeout = match config.timeout_secs {
            0 => settings.call_timeout,
            secs => Duration::from_secs(secs),
        };
        let breaker = Breaker::new(
            format!("mcp {}", config.name),
            settings.breaker,
            Arc::new(SystemClock),
        );
        Server {
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
        }
    }
}

/// Most servers one session may bring.
pub const MAX_SESSION_SERVERS: usize = 16;

/// What setting a session's own servers came to, per server.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionServer {
    /// The server's name.
    pub name: String,
    /// Its tools, once listed; why it could not be started otherwise.
    pub tools: Result<Vec<McpTool>, McpError>,
}

type Slot = Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>;

struct Shared {
    servers: BTreeMap<String, Arc<Server>>,
    /// Servers a client brought for one session (an editor's), by session,
    /// then name; kept in memory while the runner runs.
    session_servers: Mutex<HashMap<String, BTreeMap<String, Arc<Server>>>>,
    settings: Settings,
    host: Arc<dyn Host>,
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
    pub fn new(servers: Vec<McpServerConfig>, settings: Settings, host: Arc<dyn Host>) -> Mcp {
        let servers = servers
            .into_iter()
            .filter(|s| s.enabled)
            .map(|config| {
                (
                    config.name.clone(),
                    Arc::new(Server::new(config, &settings)),
                )
            })
            .collect();
        Mcp {
            shared: Arc::new(Shared {
                servers,
                settings,
                host,
                session_servers: Mutex::default(),
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

    /// The configured server `tool` (`<server>__<tool>`) belongs to, and
    /// the tool as that server lists it now (`None` while it is not
    /// listed: the server starts, or dropped it).
    pub fn lookup(&self, tool: &str) -> Option<(String, Option<McpTool>)> {
        let server = self.server_of(tool)?;
        let listed = server
            .tools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|t| t.exposed == tool)
            .cloned();
        Some((server.config.name.clone(), listed))
    }

    /// The configured server a tool belongs to, else the first session's
    /// own server of that name (a call then finds its session's through
    /// [`Mcp::server_for`]).
    fn server_of(&self, tool: &str) -> Option<Arc<Server>> {
        let (server, _) = tool.split_once(MCP_SEPARATOR)?;
        if let Some(found) = self.shared.servers.get(server) {
            return Some(found.clone());
        }
        lock(&self.shared.session_servers)
            .values()
            .find_map(|servers| servers.get(server).cloned())
    }

    /// The server a tool belongs to for `session_id`: a configured one, or
    /// one the session brought.
    fn server_for(&self, tool: &str, session_id: &str) -> Option<Arc<Server>> {
        let (server, _) = tool.split_once(MCP_SEPARATOR)?;
        if let Some(found) = self.shared.servers.get(server) {
            return Some(found.clone());
        }
        lock(&self.shared.session_servers)
            .get(session_id)?
            .get(server)
            .cloned()
    }

    /// The tools of the servers `session_id` brought (with their server).
    pub fn session_tools(&self, session_id: &str) -> Vec<(String, McpTool)> {
        let servers: Vec<Arc<Server>> = lock(&self.shared.session_servers)
            .get(session_id)
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default();
        servers
            .iter()
            .flat_map(|s| {
                let tools = s.tools.read().unwrap_or_else(|e| e.into_inner()).clone();
                tools.into_iter().map(|t| (s.config.name.clone(), t))
            })
            .collect()
    }

    /// Sets the servers `session_id` brings of its own (an editor's, for
    /// one session), replacing those it brought before: each is started in
    /// the session's place (a stdio one inside its sandbox, as the session)
    /// and its tools listed. Names may not be those of configured servers.
    pub async fn set_session_servers(
        &self,
        session_id: &str,
        configs: Vec<McpServerConfig>,
    ) -> Result<Vec<SessionServer>, McpError> {
        if configs.len() > MAX_SESSION_SERVERS {
            return Err(McpError(format!(
                "{} MCP servers for one session; at most {MAX_SESSION_SERVERS}",
                configs.len()
            )));
        }
        let mut servers = BTreeMap::new();
        for mut config in configs {
            config.enabled = true;
            agentry_runtime::config::check_server(&config)
                .map_err(|why| McpError(format!("MCP server {:?}: {why}", config.name)))?;
            if self.shared.servers.contains_key(&config.name) {
                return Err(McpError(format!(
                    "MCP server {:?}: a configured server has that name",
                    config.name
                )));
            }
            if servers.contains_key(&config.name) {
                return Err(McpError(format!(
                    "MCP server {:?} is named twice",
                    config.name
                )));
            }
            let name = config.name.clone();
            servers.insert(name, Arc::new(Server::new(config, &self.shared.settings)));
        }
        let before = lock(&self.shared.session_servers)
            .insert(session_id.to_string(), servers.clone())
            .unwrap_or_default();
        // Connections to the servers it brought before end.
        for name in before.keys() {
            let key = (name.clone(), session_id.to_string());
            lock(&self.shared.conns).remove(&key);
        }
        let mut out = Vec::new();
        for (name, server) in &servers {
            let listed = async {
                let place = self.shared.host.session_place(session_id)?;
                let conn = self.connection(server, &place).await?;
                let tools = conn.list_tools(self.shared.settings.init_timeout).await?;
                Ok::<_, McpError>(offered_tools(name, &tools))
            }
            .await;
            match listed {
                Ok(tools) => {
                    *server.tools.write().unwrap_or_else(|e| e.into_inner()) = tools.clone();
                    *lock(&server.state) = State::Ready;
                    out.push(SessionServer {
                        name: name.clone(),
                        tools: Ok(tools),
                    });
                }
                Err(why) => {
                    *lock(&server.state) = State::Failed(why.0.clone());
                    out.push(SessionServer {
                        name: name.clone(),
                        tools: Err(why),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Runs one call of `tool` for the session of `place`, or goes on
    /// with one that asked for input (`resume`).
    #[allow(clippy::too_many_arguments)]
    pub async fn call(
        &self,
        tool: &str,
        arguments_json: &str,
        resume: Option<&spb::McpResume>,
        place: &Place,
        timeout: Option<Duration>,
        max_output_bytes: usize,
        sink: OutputSink,
    ) -> Result<Outcome, ToolError> {
        let Some(server) = self.server_for(tool, &place.session_id) else {
            return Err(ToolError::UnknownTool {
                name: tool.to_string(),
                available: "no MCP server has that name".into(),
            });
        };
        let name = server.config.name.clone();
        let original = original_name(&server, tool)?;
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
        let answer = conn
            .call(&original, arguments, resume, timeout, &sink)
            .await;
        let fail = |permit: agentry_tool::breaker::Permit<'_>| {
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
            Ok(conn::Answer::NeedsInput { resume_json, .. }) if resume_json.len() > MAX_RESUME => {
                permit.success();
                ToolOutcome {
                    output: format!(
                        "the MCP server {name} asked for input with {} bytes of state to keep; \
                         Agentry keeps at most {MAX_RESUME}",
                        resume_json.len()
                    ),
                    is_error: true,
                    ..ToolOutcome::default()
                }
            }
            Ok(conn::Answer::NeedsInput {
                questions,
                resume_json,
            }) => {
                permit.success();
                return Ok(Outcome::NeedsInput(spb::McpInputRequested {
                    call_id: String::new(),
                    server: name,
                    questions,
                    resume_json,
                }));
            }
            Ok(conn::Answer::Done(result)) => {
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
            Err(CallError::Server(message)) if resume.is_some_and(|r| r.cancel) => {
                permit.success();
                ToolOutcome {
                    output: format!("the call to the MCP server {name} was stopped ({message})"),
                    is_error: true,
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
        Ok(Outcome::Done(outcome))
    }
}

/// Most state a server may ask Agentry to keep for a call that waits for
/// a person (it is stored in the session's log).
const MAX_RESUME: usize = 64 * 1024;

/// What a call of a server's tool came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// It finished.
    Done(ToolOutcome),
    /// Its server waits for a person's answers (`call_id` left empty).
    NeedsInput(spb::McpInputRequested),
}

/// The name the server knows a tool by, from the name it is offered under
/// (`<server>__<tool>`).
fn original_name(server: &Server, tool: &str) -> Result<String, ToolError> {
    let name = &server.config.name;
    let original = {
        let tools = server.tools.read().unwrap_or_else(|e| e.into_inner());
        tools
            .iter()
            .find(|t| t.exposed == tool)
            .map(|t| t.original.clone())
    };
    match original {
        Some(o) => Ok(o),
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
            Err(ToolError::UnknownTool {
                name: tool.to_string(),
                available: if known.is_empty() {
                    format!("the MCP server {name} offers no tools now ({state})")
                } else {
                    known
                },
            })
        }
    }
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
