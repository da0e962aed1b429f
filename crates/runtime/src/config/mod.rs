//! Layered configuration: built-in defaults ← `config/default.toml` ←
//! `config/local.toml` ← `AGENTRY_*` environment variables, later wins.
//!
//! Every layer is parsed and checked on its own, so an error names the file
//! (or variable), the key and the reason.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The defaults, compiled in so the binaries work without a config directory.
pub const DEFAULT_TOML: &str = include_str!("../../../../config/default.toml");
/// The default system instructions, compiled in for the same reason.
pub const DEFAULT_SYSTEM_PROMPT: &str = include_str!("../../../../config/default_system.md");

/// A configuration problem, reported at start-up.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file could not be read.
    #[error("cannot read config file {path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A file (or the built-in defaults) is not valid.
    #[error("invalid config in {source_name}: {reason}")]
    Invalid {
        /// The file or layer name.
        source_name: String,
        /// What is wrong, with the key where known.
        reason: String,
    },
    /// An environment variable has a bad value.
    #[error("invalid value for {var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: String,
        /// Its value (never printed for secrets).
        value: String,
        /// What is wrong.
        reason: String,
    },
}

/// Sub-agent tasks that may run at once by default.
fn default_parallel_agents() -> u32 {
    4
}

/// The resolved configuration of every service.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where sessions, reminders and workspaces are kept; empty for the default.
    #[serde(default)]
    pub data_dir: String,
    /// The model server.
    pub llm: LlmConfig,
    /// The agent loop.
    pub agent: AgentConfig,
    /// Which tool calls are allowed, denied or need a person.
    pub policy: PolicyConfig,
    /// The orchestrator service.
    pub orchestrator: OrchestratorConfig,
    /// The session store service.
    pub session_store: SessionStoreConfig,
    /// The tool runner service.
    pub tool_runner: ToolRunnerConfig,
    /// The scheduler service.
    pub scheduler: SchedulerConfig,
    /// The web gateway (the console and its API).
    pub gateway: GatewayConfig,
    /// Logging.
    pub log: LogConfig,
    /// OpenTelemetry export.
    #[serde(default)]
    pub otel: OtelConfig,
    /// Who may call the services.
    pub auth: AuthConfig,
    /// What models can do, by model-name pattern; the first match applies.
    #[serde(default)]
    pub model_profiles: Vec<ModelProfile>,
    /// What models cost, by model-name pattern; the first match applies.
    #[serde(default)]
    pub model_prices: Vec<ModelPrice>,
    /// Settings of the MCP client.
    pub mcp: McpConfig,
    /// MCP servers whose tools the agent may use; see also
    /// `mcp.servers_file` and [`Config::mcp_servers`].
    #[serde(default)]
    pub mcp_servers: Vec<McpServerConfig>,
    /// Commands run at points of a session (before and after tool calls,
    /// on messages, at a turn's end, at a session's start).
    #[serde(default)]
    pub hooks: Vec<HookConfig>,
    /// Webhooks told about events (a question waits, a turn ends, …).
    #[serde(default)]
    pub notify: Vec<NotifyConfig>,
    /// Secrets the tool runners release only where their rules say.
    #[serde(default)]
    pub secrets: Vec<SecretConfig>,
    /// Agents a task can be delegated to (see also `agents/*.md` in the
    /// config directory and [`Config::agents`]).
    #[serde(default)]
    pub agents: Vec<AgentDefinition>,
    /// The directory the files were read from, if any.
    #[serde(skip)]
    pub config_dir: Option<PathBuf>,
    /// What loading the layers did that a person should hear of at start
    /// (deny rules a layer dropped with `policy.replace_default_rules`).
    #[serde(skip)]
    pub notices: Vec<String>,
}

/// The model server.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// The wire protocol.
    pub provider: LlmProvider,
    /// Base URL, e.g. `http://localhost:11434/v1` (OpenAI-compatible) or
    /// `http://localhost:11434` (Ollama's native API).
    pub base_url: String,
    /// The model name sent with each request.
    pub model: String,
    /// Bearer token; empty for none.
    #[serde(default)]
    pub api_key: String,
    /// Longest a model call may take.
    pub request_timeout_secs: u64,
    /// Longest connecting may take.
    pub connect_timeout_secs: u64,
    /// Sampling temperature, when set.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Retries before any output was streamed.
    pub max_retries: u32,
    /// Model calls in flight at once (0: no limit).
    #[serde(default)]
    pub max_concurrent_requests: u32,
    /// The model's context window in tokens, overriding its profile's
    /// (0: the profile's).
    #[serde(default)]
    pub context_window: u32,
    /// Whether the model is made to call a tool.
    #[serde(default)]
    pub tool_choice: ToolChoice,
    /// Keys added to every request body, for server-specific settings
    /// (`max_tokens`, `top_k`, `parallel_tool_calls`, `logit_bias`...).
    #[serde(default)]
    pub extra_body: toml::Table,
    /// Most bytes of one model response (its text and every tool call's
    /// arguments together); past it the stream is stopped and the turn
    /// fails with a message saying so.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
    /// Most bytes of one tool call's arguments.
    #[serde(default = "default_max_tool_arguments_bytes")]
    pub max_tool_arguments_bytes: u64,
    /// The model takes images: `@shot.png` in a message sends the image
    /// with it (off: such a message is refused, saying so).
    #[serde(default)]
    pub images: bool,
}

fn default_max_response_bytes() -> u64 {
    1024 * 1024
}

fn default_max_tool_arguments_bytes() -> u64 {
    256 * 1024
}

/// The largest `llm.max_response_bytes` accepted: a quarter of the largest
/// message between the services, so that an event holding a whole
/// response (JSON-escaped) always fits in the session store.
pub const MAX_RESPONSE_BYTES_CEILING: u64 = crate::MAX_MESSAGE_BYTES as u64 / 4;

impl LlmConfig {
    /// `extra_body` as JSON, to add to request bodies.
    pub fn extra_body_json(&self) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::to_value(&self.extra_body) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        }
    }
}

/// Whether the model is made to call a tool.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoice {
    /// The model decides (the server's default).
    #[default]
    Auto,
    /// The first model call of each turn must call a tool (`tool_choice:
    /// "required"`); later calls decide, so that the turn can end with an
    /// answer. For small models that answer in prose instead of calling.
    Required,
}

/// The model server's wire protocol.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LlmProvider {
    /// OpenAI-compatible `/chat/completions` with SSE streaming.
    Openai,
    /// Ollama's native `/api/chat` with NDJSON streaming.
    Ollama,
    /// Anthropic's Messages API (`/v1/messages`) with SSE streaming.
    Anthropic,
}

pub use agentry_policy::{PolicyConfig, PolicyDecision, PolicyRule};

impl std::fmt::Debug for LlmConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field(
                "api_key",
                &if self.api_key.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("request_timeout_secs", &self.request_timeout_secs)
            .field("connect_timeout_secs", &self.connect_timeout_secs)
            .field("temperature", &self.temperature)
            .field("provider", &self.provider)
            .field("max_retries", &self.max_retries)
            .field("max_concurrent_requests", &self.max_concurrent_requests)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("max_tool_arguments_bytes", &self.max_tool_arguments_bytes)
            .field("images", &self.images)
            .finish()
    }
}

/// The agent loop.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Model calls allowed in one turn.
    pub max_steps: u32,
    /// Sub-agents' tasks that may run at once on one orchestrator (a task
    /// waiting for a person keeps its place).
    #[serde(default = "default_parallel_agents")]
    pub max_parallel_agents: u32,
    /// Pick a skillset per user message by its intent.
    pub skillsets: bool,
    /// A directory of the user's own skillsets (`<name>.md`), read after the
    /// built-in ones and those in the config directory's `skillsets/`.
    #[serde(default)]
    pub skillsets_dir: String,
    /// Shorten the model's view of long conversations (summarising the
    /// oldest messages) before a request would outgrow the context window.
    pub compaction: bool,
    /// Compact once a request would take more than this share of the
    /// model's context window (0.1 to 1.0).
    pub compaction_threshold: f32,
    /// Messages always kept as they are at the end of the conversation.
    pub compaction_keep_messages: u32,
    /// Plan steps a plan-mode turn may start, retries included, before it
    /// stops (the safety rail).
    pub plan_max_steps: u32,
    /// The loop detector: the model asking for the same call (tool and
    /// arguments) this many times in one turn is told the result would not
    /// change instead of running it; asking once more stops the turn (0: off).
    pub loop_repeats: u32,
    /// Steps in a row without progress (every tool call failed or returned
    /// what an earlier call of the turn returned) after which the model is
    /// told; one more and the turn stops (0: off).
    pub no_progress_steps: u32,
    /// Tokens (prompt and completion) one turn may use before it stops (0: no limit).
    pub turn_token_budget: u64,
    /// Tokens a session may use before its turns stop (0: no limit).
    pub session_token_budget: u64,
    /// What one turn may cost at `model_prices` before it stops (0: no limit).
    pub turn_cost_budget: f64,
    /// What a session may cost before its turns stop (0: no limit).
    pub session_cost_budget: f64,
    /// What a turn that reaches a spending limit does.
    pub on_budget: OnBudget,
}

/// What a turn that reaches a spending limit does.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnBudget {
    /// It ends; the person raises the limit and sends another message.
    Stop,
    /// It waits until someone raises the limit, then goes on.
    Park,
}

/// What a family of models can do.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelProfile {
    /// A glob on the model name (`*` any run of characters, `?` one), case-insensitive.
    pub pattern: String,
    /// Tokens the model reads at most; 0: the size known for the model
    /// name (OpenAI's models), else 32,768.
    #[serde(default)]
    pub context_window: u32,
    /// Whether the server's native tool calling works with it; when not,
    /// tools are described in the system prompt and calls read from text.
    #[serde(default = "yes")]
    pub native_tools: bool,
    /// Sampling temperature for it (overrides `llm.temperature`).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// How its tokens are counted: "o200k_base" or "cl100k_base" (OpenAI's
    /// encodings), or "estimate". Empty: the encoding known for the model
    /// name, else the estimate.
    #[serde(default)]
    pub tokenizer: String,
}

impl ModelProfile {
    /// The profile for any model no pattern matches.
    pub fn fallback() -> ModelProfile {
        ModelProfile {
            pattern: "*".into(),
            context_window: 0,
            native_tools: true,
            temperature: None,
            tokenizer: String::new(),
        }
    }

    /// Whether `model` matches the pattern.
    pub fn matches(&self, model: &str) -> bool {
        glob_matches(&self.pattern, model)
    }
}

/// Whether a model name matches a pattern: `*` any run of characters, `?`
/// one, case-insensitive.
fn glob_matches(pattern: &str, model: &str) -> bool {
    fn glob(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => glob(&p[1..], s) || (!s.is_empty() && glob(p, &s[1..])),
            (Some(b'?'), Some(_)) => glob(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a.eq_ignore_ascii_case(b) => glob(&p[1..], &s[1..]),
            _ => false,
        }
    }
    glob(pattern.as_bytes(), model.as_bytes())
}

impl Config {
    /// The profile of the configured model: the first whose pattern matches.
    pub fn model_profile(&self) -> ModelProfile {
        let mut profile = self
            .model_profiles
            .iter()
            .find(|p| p.matches(&self.llm.model))
            .cloned()
            .unwrap_or_else(ModelProfile::fallback);
        if self.llm.context_window > 0 {
            profile.context_window = self.llm.context_window;
        }
        profile
    }

    /// The price of the configured model: the first whose pattern matches;
    /// `None` when none does.
    pub fn model_price(&self) -> Option<ModelPrice> {
        self.model_prices
            .iter()
            .find(|p| glob_matches(&p.pattern, &self.llm.model))
            .cloned()
    }
}

/// OpenTelemetry export.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OtelConfig {
    /// OTLP/gRPC endpoint for traces, e.g. `http://localhost:4317`; empty:
    /// traces are not exported.
    #[serde(default)]
    pub endpoint: String,
}

/// Who may call the services: bearer tokens (a client token for people and
/// their tools, a service token for the services' calls to each other) and
/// optionally TLS with client certificates.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// "token": every call but health checks needs a token; "off": no
    /// credential is asked for (only allowed on loopback addresses).
    pub mode: AuthMode,
    /// The client token's file; empty: `<data_dir>/auth/client.token`.
    /// Services create it (mode 0600) when it does not exist.
    pub client_token_file: String,
    /// The service token's file; empty: `<data_dir>/auth/service.token`.
    pub service_token_file: String,
    /// The people file (each person's name, role and token hash, written
    /// by `agentry users`); empty: `people.toml` beside the service token.
    pub people_file: String,
    /// The client token itself, for clients on another machine; empty: read
    /// from `client_token_file`.
    pub token: String,
    /// TLS for every gRPC connection.
    pub tls: TlsConfig,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("mode", &self.mode)
            .field("client_token_file", &self.client_token_file)
            .field("service_token_file", &self.service_token_file)
            .field("people_file", &self.people_file)
            .field(
                "token",
                &if self.token.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("tls", &self.tls)
            .finish()
    }
}

/// Whether the services ask for a credential.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Bearer tokens.
    Token,
    /// No credential (loopback addresses only).
    Off,
}

/// TLS for gRPC: set all three to have every service serve TLS and require
/// a client certificate signed by `ca`, and every client (services calling
/// each other, the CLI) present `cert` and trust servers signed by `ca`.
/// URLs then use `https://`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// This program's certificate chain (PEM).
    pub cert: String,
    /// Its private key (PEM).
    pub key: String,
    /// The certificate authority that signs servers' and clients'
    /// certificates (PEM).
    pub ca: String,
}

impl TlsConfig {
    /// Whether TLS is configured.
    pub fn enabled(&self) -> bool {
        !(self.cert.is_empty() && self.key.is_empty() && self.ca.is_empty())
    }
}

/// The session store.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionStoreConfig {
    /// The socket address the service binds.
    pub listen: SocketAddr,
    /// The URL clients dial.
    pub url: String,
    /// Serve Prometheus metrics on `GET /metrics` here; empty: not served.
    #[serde(default)]
    pub metrics_listen: String,
    /// A PostgreSQL server (`postgres://user:password@host:port/db`) that
    /// holds the sessions; empty: SQLite in the data directory.
    #[serde(default)]
    pub database_url: String,
}

impl std::fmt::Debug for SessionStoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionStoreConfig")
            .field("listen", &self.listen)
            .field("url", &self.url)
            .field("metrics_listen", &self.metrics_listen)
            .field("database_url", &redact_url(&self.database_url))
            .finish()
    }
}

/// A database URL with its password hidden, for logs and messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}")
            } else {
                format!("{scheme}://{user}@{host}")
            }
        }
        None => url.to_string(),
    }
}

/// The orchestrator.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OrchestratorConfig {
    /// The socket address the service binds.
    pub listen: SocketAddr,
    /// The URL clients dial.
    pub url: String,
    /// Serve Prometheus metrics on `GET /metrics` here; empty: not served.
    #[serde(default)]
    pub metrics_listen: String,
    /// Where the other orchestrator replicas reach this one; set, sessions
    /// are leased in the session store so several replicas can serve them
    /// (docs/operations.md, "Scaling out"); empty: one orchestrator.
    #[serde(default)]
    pub advertise_url: String,
    /// Seconds a session with nothing running stays loaded (its state in
    /// memory) after its last activity; its next input loads it again
    /// from its log. 0: sessions stay loaded until the process ends.
    #[serde(default = "default_unload_idle_secs")]
    pub unload_idle_secs: u64,
    /// Events appended since a session's last checkpoint after which its
    /// next idle moment writes a new one (its state, in the same commit as
    /// its events), so that loading it reads only the events after it. 0:
    /// no checkpoints.
    #[serde(default = "default_checkpoint_every_events")]
    pub checkpoint_every_events: u64,
}

fn default_unload_idle_secs() -> u64 {
    600
}

fn default_checkpoint_every_events() -> u64 {
    1000
}

/// Where a service listens and where others reach it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// The socket address the service binds.
    pub listen: SocketAddr,
    /// The URL clients dial.
    pub url: String,
    /// Serve Prometheus metrics on `GET /metrics` here; empty: not served.
    #[serde(default)]
    pub metrics_listen: String,
}

/// The tool runner.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolRunnerConfig {
    /// The socket address the service binds.
    pub listen: SocketAddr,
    /// The URL the orchestrator dials.
    pub url: String,
    /// Root of the session workspaces; empty for `<data_dir>/workspaces`.
    #[serde(default)]
    pub workspace_root: String,
    /// Directories under which a session may work on a person's project
    /// (`agentry chat` in a directory, `--dir`). `~` is the home directory
    /// of the user the services run as, and stands for nothing when that
    /// is root: as root, only directories named here are open.
    #[serde(default)]
    pub project_roots: Vec<String>,
    /// Default shell timeout.
    pub default_timeout_secs: u64,
    /// Largest shell timeout a call may ask for.
    pub max_timeout_secs: u64,
    /// Largest tool output kept, in bytes.
    pub max_output_bytes: usize,
    /// Largest file `read_file` returns, in bytes.
    pub max_read_bytes: u64,
    /// Variables of the runner's environment that commands also get. The
    /// environment of a command is built from an allowlist (PATH, HOME set
    /// to the workspace, TMPDIR, LANG, TERM…), never inherited; name here
    /// any other variable a command needs (it reaches every session).
    #[serde(default)]
    pub env_passthrough: Vec<String>,
    /// When the runner runs as root, commands run as: "session" (a uid of
    /// their own per session, from `sandbox.session_uid_base`), or the name
    /// of a user. Never as root.
    pub run_as_user: String,
    /// The OS sandbox of every process a tool starts.
    pub sandbox: SandboxConfig,
    /// Where to serve `GET /metrics` (Prometheus text); empty: not served.
    #[serde(default)]
    pub metrics_listen: String,
    /// This runner's name in tool results; empty: `<hostname>-<pid>`.
    #[serde(default)]
    pub id: String,
    /// Resource limits of each command.
    pub limits: ResourceLimits,
    /// The web tools.
    pub web: WebConfig,
    /// Workspace snapshots (rewind and fork).
    pub snapshots: SnapshotsConfig,
}

/// Snapshots of session workspaces, for rewinding and forking sessions
/// with their files.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SnapshotsConfig {
    /// Take snapshots at all.
    pub enabled: bool,
    /// Where they are stored; empty: `<workspace_root>/.snapshots`.
    pub dir: String,
    /// Files larger than this (MiB) are not recorded.
    pub max_file_mib: u64,
    /// A workspace with more entries than this is not snapshotted.
    pub max_entries: u64,
    /// Snapshots older than this are pruned (each session keeps its
    /// latest).
    pub keep_days: u64,
    /// Then the oldest are pruned while all hold more than this (MiB);
    /// 0: no limit.
    pub max_total_mib: u64,
    /// Record `.git` and what `.gitignore` ignores in project directories
    /// too (by default they are left out, and rewinds leave them alone).
    #[serde(default)]
    pub include_ignored: bool,
}

/// Where a service run as root keeps its data unless told otherwise.
const ROOT_DATA_DIR: &str = "/var/lib/agentry";

pub(crate) fn running_as_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// The OS sandbox of tool processes.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfig {
    /// "auto": every layer this machine supports, the missing ones reported
    /// at start-up; "require": refuse to start unless namespaces, Landlock
    /// and seccomp all work; "off": commands run without an OS sandbox
    /// (only the identity, environment and limits apply).
    pub mode: String,
    /// The `agentry-sandbox` helper; empty: next to the agentry program or
    /// on PATH.
    pub helper: String,
    /// With `run_as_user = "session"`: session uids are
    /// `session_uid_base + hash(session id) % session_uid_count`.
    pub session_uid_base: u32,
    /// How many uids sessions are spread over.
    pub session_uid_count: u32,
    /// Seconds a session's sandbox (the namespaces and view its bash
    /// commands are forked in) is kept after its last command; 0: a
    /// sandbox per command.
    #[serde(default = "default_session_idle_secs")]
    pub session_idle_secs: u64,
    /// More directories commands may read (e.g. a toolchain under /srv).
    pub read_only: Vec<String>,
    /// Hosts (names or IP addresses) that calls granted network may reach
    /// through the proxy although they are loopback, private, link-local
    /// or metadata addresses. Names match exactly as the command writes
    /// them.
    pub network_allow_hosts: Vec<String>,
    /// Certificates (PEM) the proxy trusts besides the system's roots when
    /// it opens HTTPS itself for a secret's header rule; empty: none.
    #[serde(default)]
    pub network_ca_file: String,
}

fn default_session_idle_secs() -> u64 {
    300
}

/// Resource limits (setrlimit) of each command; 0 means unlimited.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ResourceLimits {
    /// CPU seconds.
    pub cpu_secs: u64,
    /// Address space, in MiB.
    pub address_space_mib: u64,
    /// Processes of the user.
    pub processes: u64,
    /// Largest file written, in MiB.
    pub file_size_mib: u64,
    /// Open files per process.
    #[serde(default)]
    pub open_files: u64,
    /// Size of a session's workspace (and its temp dir), in MiB; 0: not
    /// limited.
    #[serde(default)]
    pub workspace_mib: u64,
    /// Memory (resident) of all a session's running commands together, in
    /// MiB; past it they are stopped. 0: not limited.
    #[serde(default)]
    pub session_memory_mib: u64,
}

/// The web tools (`web_fetch`, `web_crawl`).
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebConfig {
    /// The Crawl4AI REST service; empty to skip it.
    #[serde(default)]
    pub crawl4ai_url: String,
    /// Bearer token for Crawl4AI; empty for none.
    #[serde(default)]
    pub crawl4ai_token: String,
    /// Use headless Chromium (`chromium` on PATH) when Crawl4AI cannot help.
    pub chromium: bool,
    /// The Chromium executable; empty to look for `chromium` on PATH.
    #[serde(default)]
    pub chromium_path: String,
    /// Pages open at once in Chromium.
    pub chromium_max_pages: usize,
    /// Chromium's own sandbox; turn off where user namespaces are denied
    /// (containers). Always off when running as root.
    pub chromium_sandbox: bool,
    /// Longest a page may take to load.
    pub page_timeout_secs: u64,
    /// Longest a plain HTTP fetch may take.
    pub http_timeout_secs: u64,
    /// Largest body a plain HTTP fetch reads, in bytes.
    pub max_body_bytes: usize,
    /// Redirects followed at most.
    pub max_redirects: usize,
    /// Characters of page text returned to the model.
    pub max_chars: usize,
    /// Hosts (names or IP addresses) allowed even though they resolve to
    /// loopback, private, link-local or metadata addresses.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
}

fn yes() -> bool {
    true
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("crawl4ai_url", &self.crawl4ai_url)
            .field(
                "crawl4ai_token",
                &if self.crawl4ai_token.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("chromium", &self.chromium)
            .field("chromium_path", &self.chromium_path)
            .field("chromium_max_pages", &self.chromium_max_pages)
            .field("chromium_sandbox", &self.chromium_sandbox)
            .field("page_timeout_secs", &self.page_timeout_secs)
            .field("http_timeout_secs", &self.http_timeout_secs)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_redirects", &self.max_redirects)
            .field("max_chars", &self.max_chars)
            .field("allow_hosts", &self.allow_hosts)
            .finish()
    }
}

/// The web gateway: the console and its JSON + server-sent-events API.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// The socket address it binds; a non-loopback one needs
    /// `behind_tls_proxy`.
    pub listen: SocketAddr,
    /// The address people open (shown by `agentry up`).
    pub url: String,
    /// A proxy in front terminates TLS: the gateway may listen on a
    /// non-loopback address, and its cookies are marked Secure.
    #[serde(default)]
    pub behind_tls_proxy: bool,
    /// The address is reachable only on a private network (a container
    /// network whose port is published on the host's loopback): it may be
    /// a non-loopback one without TLS.
    #[serde(default)]
    pub private_network: bool,
    /// Serve HTTPS with this certificate chain (PEM); with `tls_key`.
    #[serde(default)]
    pub tls_cert: String,
    /// The private key of `tls_cert` (PEM).
    #[serde(default)]
    pub tls_key: String,
    /// How long a login lasts, in hours.
    pub login_hours: u64,
    /// Host names the console may be reached by besides the loopback ones
    /// (a page served under another name is refused: DNS rebinding).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Protocol calls that may be open at once (A2A streams and waits,
    /// AG-UI runs); more are refused with 503 until one ends.
    #[serde(default = "default_protocol_streams")]
    pub max_protocol_streams: u32,
}

fn default_protocol_streams() -> u32 {
    256
}

/// The scheduler.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    /// The socket address the service binds.
    pub listen: SocketAddr,
    /// The URL the orchestrator and the CLI dial.
    pub url: String,
    /// What to do with occurrences of a recurring reminder missed while the
    /// scheduler was down, when the reminder names no policy.
    pub missed: MissedOccurrences,
    /// How long a delivered firing may stay unacknowledged before it is
    /// sent again.
    pub redeliver_after_secs: u64,
    /// Serve Prometheus metrics on `GET /metrics` here; empty: not served.
    #[serde(default)]
    pub metrics_listen: String,
    /// A PostgreSQL server that holds the reminders; empty: SQLite in the
    /// data directory.
    #[serde(default)]
    pub database_url: String,
    /// The first wait before a failed notification is sent again (it
    /// doubles each time, up to 5 minutes; a notification is tried for 24
    /// hours).
    #[serde(default = "notify_retry_ms")]
    pub notify_retry_ms: u64,
}

fn notify_retry_ms() -> u64 {
    5000
}

/// A webhook told about events (`[[notify]]`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// A name for logs and the outbox.
    pub name: String,
    /// Where events are POSTed (http or https).
    pub url: String,
    /// Which events: `approval_requested`, `turn_finished`, `turn_parked`,
    /// `schedule_failed`.
    pub events: Vec<String>,
    /// The environment variable holding the key of the HMAC-SHA256
    /// signature (`X-Agentry-Signature`); empty: unsigned.
    #[serde(default)]
    pub secret_env: String,
    /// A file (readable by the scheduler alone, 0600) holding the key
    /// instead; empty: none.
    #[serde(default)]
    pub secret_file: String,
    /// The body: `json` (the event as JSON) or `text` (one line for a
    /// person, with a `Title` header: ntfy-style push services).
    #[serde(default)]
    pub format: NotifyFormat,
    /// Headers sent with every delivery (e.g. `Priority`, `Tags`, an
    /// authorization).
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
}

/// A secret the tool runners hold (`[[secrets]]`): the model sees only its
/// name; its value goes only where a rule says.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SecretConfig {
    /// Its name: the environment variable it becomes (`GH_TOKEN`).
    pub name: String,
    /// The runner's environment variable holding the value.
    #[serde(default)]
    pub value_env: String,
    /// Or a file of the runner's holding it (0600).
    #[serde(default)]
    pub value_file: String,
    /// Where it may go.
    pub allow: Vec<SecretRule>,
}

/// Where a secret may go: the environment of bash commands matching
/// `command` (`{ tool = "bash", command = "gh *" }`), or a header the egress
/// proxy adds to requests for `host`
/// (`{ host = "api.github.com", header = "Authorization: Bearer {value}" }`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SecretRule {
    /// The tool: `bash`.
    #[serde(default)]
    pub tool: String,
    /// A glob on the whole command (`gh *`): `*` any run of characters,
    /// `?` one. A command that chains, substitutes, redirects or expands
    /// (`;`, `&`, `|`, `` ` ``, `$`, `<`, `>`, a newline) never matches.
    #[serde(default)]
    pub command: String,
    /// A host (`api.github.com`, or `host:port`): a command's plain
    /// `http://` request for it is sent on over HTTPS (port 443, or the
    /// port named) with `header` added.
    #[serde(default)]
    pub host: String,
    /// The header, `Name: text` with `{value}` where the value goes.
    #[serde(default)]
    pub header: String,
}

impl SecretRule {
    /// A rule for bash commands matching `command`.
    pub fn command(command: &str) -> SecretRule {
        SecretRule {
            tool: "bash".into(),
            command: command.into(),
            ..SecretRule::default()
        }
    }

    /// A rule adding `header` to requests for `host`.
    pub fn header(host: &str, header: &str) -> SecretRule {
        SecretRule {
            host: host.into(),
            header: header.into(),
            ..SecretRule::default()
        }
    }

    /// The header's name and its text around `{value}`, when this is a
    /// well-formed header rule.
    pub fn header_parts(&self) -> Option<(&str, &str)> {
        let (name, text) = self.header.split_once(':')?;
        let name = name.trim();
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        (!name.is_empty()
            && name.chars().all(token)
            && text.contains("{value}")
            && !text.chars().any(|c| c.is_control()))
        .then(|| (name, text.trim()))
    }
}

/// The events a `[[notify]]` webhook can be told about.
pub const NOTIFY_EVENTS: &[&str] = &[
    "approval_requested",
    "turn_finished",
    "turn_parked",
    "schedule_failed",
];

/// The body of a notification.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NotifyFormat {
    /// The event as a JSON object.
    #[default]
    Json,
    /// One line of text for a person, with a `Title` header.
    Text,
}

/// What to do with missed occurrences of a recurring reminder.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum MissedOccurrences {
    /// Fire once for all of them.
    Once,
    /// Fire once per occurrence.
    All,
    /// Fire none; wait for the next one.
    Skip,
}

/// Log output.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
}

/// Log line format.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

mod agents;
mod hooks;
pub use agents::{AgentDefinition, parse_agent_file};
mod load;
pub use agentry_agent::settings::{HookConfig, HookEvent, ModelPrice};
pub use hooks::MAX_HOOK_TIMEOUT_SECS;
mod mcp;
pub use mcp::{MCP_SEPARATOR, McpConfig, McpServerConfig, check_server, read_servers_file};

pub use load::{ConfigSource, env_vars};

#[cfg(test)]
mod tests;
