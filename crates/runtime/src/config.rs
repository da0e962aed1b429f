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
pub const DEFAULT_TOML: &str = include_str!("../../../config/default.toml");
/// The default system instructions, compiled in for the same reason.
pub const DEFAULT_SYSTEM_PROMPT: &str = include_str!("../../../config/default_system.md");

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
    pub orchestrator: Endpoint,
    /// The session store service.
    pub session_store: Endpoint,
    /// The tool runner service.
    pub tool_runner: ToolRunnerConfig,
    /// The scheduler service.
    pub scheduler: SchedulerConfig,
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
    /// The directory the files were read from, if any.
    #[serde(skip)]
    pub config_dir: Option<PathBuf>,
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
}

/// The model server's wire protocol.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LlmProvider {
    /// OpenAI-compatible `/chat/completions` with SSE streaming.
    Openai,
    /// Ollama's native `/api/chat` with NDJSON streaming.
    Ollama,
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
            .finish()
    }
}

/// The agent loop.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Model calls allowed in one turn.
    pub max_steps: u32,
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
        fn glob(p: &[u8], s: &[u8]) -> bool {
            match (p.first(), s.first()) {
                (None, None) => true,
                (Some(b'*'), _) => glob(&p[1..], s) || (!s.is_empty() && glob(p, &s[1..])),
                (Some(b'?'), Some(_)) => glob(&p[1..], &s[1..]),
                (Some(a), Some(b)) if a.eq_ignore_ascii_case(b) => glob(&p[1..], &s[1..]),
                _ => false,
            }
        }
        glob(self.pattern.as_bytes(), model.as_bytes())
    }
}

impl Config {
    /// The profile of the configured model: the first whose pattern matches.
    pub fn model_profile(&self) -> ModelProfile {
        self.model_profiles
            .iter()
            .find(|p| p.matches(&self.llm.model))
            .cloned()
            .unwrap_or_else(ModelProfile::fallback)
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
    /// More directories commands may read (e.g. a toolchain under /srv).
    pub read_only: Vec<String>,
    /// Hosts (names or IP addresses) that calls granted network may reach
    /// through the proxy although they are loopback, private, link-local
    /// or metadata addresses. Names match exactly as the command writes
    /// them.
    pub network_allow_hosts: Vec<String>,
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

/// Where to look for configuration, and the environment to apply.
#[derive(Debug, Clone, Default)]
pub struct ConfigSource {
    /// The config directory; `None` reads no files (built-in defaults only).
    pub dir: Option<PathBuf>,
    /// Environment variables to apply (tests pass their own map; binaries
    /// pass the process environment).
    pub env: BTreeMap<String, String>,
}

impl ConfigSource {
    /// The directory from `AGENTRY_CONFIG_DIR`, else `./config` when it
    /// exists, with the process environment.
    pub fn from_process(dir_override: Option<PathBuf>) -> Self {
        let env: BTreeMap<String, String> = std::env::vars().collect();
        let dir = dir_override
            .or_else(|| env.get("AGENTRY_CONFIG_DIR").map(PathBuf::from))
            .or_else(|| {
                let local = PathBuf::from("config");
                local.is_dir().then_some(local)
            });
        Self { dir, env }
    }
}

/// Environment variables and the key each one sets.
const ENV_KEYS: &[(&str, &[&str])] = &[
    ("AGENTRY_DATA_DIR", &["data_dir"]),
    ("AGENTRY_LLM_BASE_URL", &["llm", "base_url"]),
    ("AGENTRY_LLM_MODEL", &["llm", "model"]),
    ("AGENTRY_LLM_API_KEY", &["llm", "api_key"]),
    ("AGENTRY_LLM_PROVIDER", &["llm", "provider"]),
    ("AGENTRY_MAX_STEPS", &["agent", "max_steps"]),
    ("AGENTRY_SKILLSETS", &["agent", "skillsets"]),
    ("AGENTRY_SKILLSETS_DIR", &["agent", "skillsets_dir"]),
    ("AGENTRY_COMPACTION", &["agent", "compaction"]),
    ("AGENTRY_PLAN_MAX_STEPS", &["agent", "plan_max_steps"]),
    ("AGENTRY_ORCHESTRATOR_URL", &["orchestrator", "url"]),
    ("AGENTRY_ORCHESTRATOR_LISTEN", &["orchestrator", "listen"]),
    ("AGENTRY_SESSION_STORE_URL", &["session_store", "url"]),
    ("AGENTRY_SESSION_STORE_LISTEN", &["session_store", "listen"]),
    ("AGENTRY_TOOL_RUNNER_URL", &["tool_runner", "url"]),
    ("AGENTRY_TOOL_RUNNER_LISTEN", &["tool_runner", "listen"]),
    ("AGENTRY_WORKSPACE_ROOT", &["tool_runner", "workspace_root"]),
    ("AGENTRY_RUNNER_ID", &["tool_runner", "id"]),
    ("AGENTRY_SANDBOX", &["tool_runner", "sandbox", "mode"]),
    (
        "AGENTRY_SANDBOX_HELPER",
        &["tool_runner", "sandbox", "helper"],
    ),
    (
        "AGENTRY_TOOL_RUNNER_METRICS_LISTEN",
        &["tool_runner", "metrics_listen"],
    ),
    (
        "AGENTRY_CRAWL4AI_URL",
        &["tool_runner", "web", "crawl4ai_url"],
    ),
    (
        "AGENTRY_CRAWL4AI_TOKEN",
        &["tool_runner", "web", "crawl4ai_token"],
    ),
    (
        "AGENTRY_CHROMIUM_SANDBOX",
        &["tool_runner", "web", "chromium_sandbox"],
    ),
    ("AGENTRY_SCHEDULER_URL", &["scheduler", "url"]),
    ("AGENTRY_SCHEDULER_LISTEN", &["scheduler", "listen"]),
    ("AGENTRY_LOG_FORMAT", &["log", "format"]),
    ("AGENTRY_OTLP_ENDPOINT", &["otel", "endpoint"]),
    ("AGENTRY_AUTH", &["auth", "mode"]),
    ("AGENTRY_TOKEN", &["auth", "token"]),
    ("AGENTRY_CLIENT_TOKEN_FILE", &["auth", "client_token_file"]),
    (
        "AGENTRY_SERVICE_TOKEN_FILE",
        &["auth", "service_token_file"],
    ),
    ("AGENTRY_TLS_CERT", &["auth", "tls", "cert"]),
    ("AGENTRY_TLS_KEY", &["auth", "tls", "key"]),
    ("AGENTRY_TLS_CA", &["auth", "tls", "ca"]),
    (
        "AGENTRY_ORCHESTRATOR_METRICS_LISTEN",
        &["orchestrator", "metrics_listen"],
    ),
    (
        "AGENTRY_SESSION_STORE_METRICS_LISTEN",
        &["session_store", "metrics_listen"],
    ),
    (
        "AGENTRY_SCHEDULER_METRICS_LISTEN",
        &["scheduler", "metrics_listen"],
    ),
];

impl Config {
    /// The built-in defaults (`config/default.toml`, compiled in), with no
    /// file or environment applied: the one source of default values for
    /// code that runs without a configuration (tests, pure modules).
    pub fn builtin() -> &'static Config {
        static BUILTIN: std::sync::LazyLock<Config> = std::sync::LazyLock::new(|| {
            // The compiled-in file is checked by this crate's tests; a
            // failure here is a defect of the build, not of the input.
            #[allow(clippy::expect_used)]
            Config::load(&ConfigSource::default()).expect("the built-in defaults are valid")
        });
        &BUILTIN
    }

    /// Resolves the configuration from its layers.
    pub fn load(source: &ConfigSource) -> Result<Config, ConfigError> {
        let mut merged = parse_layer("built-in defaults", DEFAULT_TOML)?;
        check_layer("built-in defaults", &merged)?;
        if let Some(dir) = &source.dir {
            for name in ["default.toml", "local.toml"] {
                let path = dir.join(name);
                let text = match std::fs::read_to_string(&path) {
                    Ok(text) => text,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => {
                        return Err(ConfigError::Read {
                            path,
                            reason: e.to_string(),
                        });
                    }
                };
                let label = path.display().to_string();
                let layer = parse_layer(&label, &text)?;
                // Check the layer over the defaults so that a layer may set
                // only some keys, yet errors still name this file.
                let mut candidate = merged.clone();
                merge(&mut candidate, layer);
                check_layer(&label, &candidate)?;
                merged = candidate;
            }
        }
        for (var, path) in ENV_KEYS {
            let Some(value) = source.env.get(*var) else {
                continue;
            };
            let mut candidate = merged.clone();
            set_path(&mut candidate, path, env_value(&merged, path, value));
            check_layer(var, &candidate).map_err(|e| ConfigError::Env {
                var: (*var).to_string(),
                value: if var.ends_with("_API_KEY") || var.ends_with("_TOKEN") {
                    "<redacted>".to_string()
                } else {
                    value.clone()
                },
                reason: match e {
                    ConfigError::Invalid { reason, .. } => reason,
                    other => other.to_string(),
                },
            })?;
            merged = candidate;
        }
        let mut config = deserialize("merged configuration", &merged)?;
        config.config_dir = source.dir.clone();
        config.validate("configuration")?;
        Ok(config)
    }

    fn validate(&self, label: &str) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: &str| ConfigError::Invalid {
            source_name: label.to_string(),
            reason: format!("{key}: {reason}"),
        };
        if !(self.llm.base_url.starts_with("http://") || self.llm.base_url.starts_with("https://"))
        {
            return Err(invalid(
                "llm.base_url",
                &format!(
                    "{:?} is not an http(s) URL (e.g. http://localhost:11434/v1)",
                    self.llm.base_url
                ),
            ));
        }
        if self.llm.model.trim().is_empty() {
            return Err(invalid("llm.model", "must not be empty"));
        }
        let tls = &self.auth.tls;
        if tls.enabled() && (tls.cert.is_empty() || tls.key.is_empty() || tls.ca.is_empty()) {
            return Err(invalid(
                "auth.tls",
                "set all of cert, key and ca (AGENTRY_TLS_CERT, AGENTRY_TLS_KEY, AGENTRY_TLS_CA), \
                 or none",
            ));
        }
        if !matches!(
            self.tool_runner.sandbox.mode.as_str(),
            "auto" | "require" | "off"
        ) {
            return Err(invalid(
                "tool_runner.sandbox.mode",
                &format!(
                    "{:?} is not one of \"auto\", \"require\", \"off\"",
                    self.tool_runner.sandbox.mode
                ),
            ));
        }
        if self.tool_runner.sandbox.session_uid_count == 0
            || self.tool_runner.sandbox.session_uid_base < 1000
            || self
                .tool_runner
                .sandbox
                .session_uid_base
                .checked_add(self.tool_runner.sandbox.session_uid_count)
                .is_none_or(|end| end >= u32::MAX - 1)
        {
            return Err(invalid(
                "tool_runner.sandbox.session_uid_base",
                "session uids must be a non-empty range above 999 and below 4294967294",
            ));
        }
        if self.agent.max_steps == 0 {
            return Err(invalid("agent.max_steps", "must be at least 1"));
        }
        if !(0.1..=1.0).contains(&self.agent.compaction_threshold) {
            return Err(invalid(
                "agent.compaction_threshold",
                "must be between 0.1 and 1.0 (a share of the context window)",
            ));
        }
        if self.agent.compaction_keep_messages == 0 {
            return Err(invalid(
                "agent.compaction_keep_messages",
                "must be at least 1",
            ));
        }
        if self.agent.plan_max_steps == 0 {
            return Err(invalid("agent.plan_max_steps", "must be at least 1"));
        }
        for profile in &self.model_profiles {
            if profile.context_window != 0 && profile.context_window < 256 {
                return Err(invalid(
                    "model_profiles.context_window",
                    &format!(
                        "{} (for {:?}) is too small: at least 256 tokens (0: from the model name)",
                        profile.context_window, profile.pattern
                    ),
                ));
            }
            if !matches!(
                profile.tokenizer.as_str(),
                "" | "o200k_base" | "cl100k_base" | "estimate"
            ) {
                return Err(invalid(
                    "model_profiles.tokenizer",
                    &format!(
                        "{:?} (for {:?}) is not one of o200k_base, cl100k_base, estimate",
                        profile.tokenizer, profile.pattern
                    ),
                ));
            }
        }
        if self.tool_runner.default_timeout_secs == 0
            || self.tool_runner.default_timeout_secs > self.tool_runner.max_timeout_secs
        {
            return Err(invalid(
                "tool_runner.default_timeout_secs",
                "must be between 1 and tool_runner.max_timeout_secs",
            ));
        }
        for (key, url) in [
            ("orchestrator.url", &self.orchestrator.url),
            ("session_store.url", &self.session_store.url),
            ("tool_runner.url", &self.tool_runner.url),
            ("scheduler.url", &self.scheduler.url),
        ] {
            // tool_runner.url may list several runners, separated by commas.
            for url in url.split(',').map(str::trim) {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(invalid(
                        key,
                        &format!("{url:?} is not an http(s) URL (e.g. http://127.0.0.1:50051)"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The client token's file.
    pub fn client_token_file(&self) -> PathBuf {
        match self.auth.client_token_file.as_str() {
            "" => self.data_dir().join("auth").join("client.token"),
            path => PathBuf::from(path),
        }
    }

    /// The service token's file.
    pub fn service_token_file(&self) -> PathBuf {
        match self.auth.service_token_file.as_str() {
            "" => self.data_dir().join("auth").join("service.token"),
            path => PathBuf::from(path),
        }
    }

    /// The data directory, resolved.
    pub fn data_dir(&self) -> PathBuf {
        if !self.data_dir.is_empty() {
            return PathBuf::from(&self.data_dir);
        }
        if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
            return PathBuf::from(xdg).join("agentry");
        }
        // Root's home is closed to the users sandboxed commands run as, so
        // a service run as root keeps its data where services do.
        if running_as_root() {
            return PathBuf::from(ROOT_DATA_DIR);
        }
        match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join(".local/share/agentry"),
            None => PathBuf::from(".agentry"),
        }
    }

    /// The root of the session workspaces, resolved.
    pub fn workspace_root(&self) -> PathBuf {
        if self.tool_runner.workspace_root.is_empty() {
            self.data_dir().join("workspaces")
        } else {
            PathBuf::from(&self.tool_runner.workspace_root)
        }
    }

    /// The system instructions: `system.md` in the config directory when
    /// non-empty, else `default_system.md` there, else the built-in text.
    pub fn system_prompt(&self) -> Result<String, ConfigError> {
        let Some(dir) = &self.config_dir else {
            return Ok(DEFAULT_SYSTEM_PROMPT.to_string());
        };
        for name in ["system.md", "default_system.md"] {
            match read_optional(&dir.join(name))? {
                Some(text) if !text.trim().is_empty() => return Ok(text),
                _ => continue,
            }
        }
        Ok(DEFAULT_SYSTEM_PROMPT.to_string())
    }

    /// The model call timeout.
    pub fn llm_request_timeout(&self) -> Duration {
        Duration::from_secs(self.llm.request_timeout_secs)
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ConfigError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

fn parse_layer(label: &str, text: &str) -> Result<toml::Table, ConfigError> {
    text.parse::<toml::Table>()
        .map_err(|e| ConfigError::Invalid {
            source_name: label.to_string(),
            reason: describe_toml_error(&e, text),
        })
}

fn check_layer(label: &str, table: &toml::Table) -> Result<(), ConfigError> {
    deserialize(label, table)?.validate(label)
}

fn deserialize(label: &str, table: &toml::Table) -> Result<Config, ConfigError> {
    let text = toml::to_string(table).map_err(|e| ConfigError::Invalid {
        source_name: label.to_string(),
        reason: e.to_string(),
    })?;
    toml::from_str::<Config>(&text).map_err(|e| ConfigError::Invalid {
        source_name: label.to_string(),
        reason: describe_toml_error(&e, &text),
    })
}

/// Names the key an error is about, from the error's span in `text`.
fn describe_toml_error(e: &toml::de::Error, text: &str) -> String {
    let message = e.message().trim().to_string();
    let Some(span) = e.span() else {
        return message;
    };
    let key = key_at(text, span.start);
    match key {
        Some(key) => format!("{key}: {message}"),
        None => message,
    }
}

/// The dotted key whose line contains byte offset `at`.
fn key_at(text: &str, at: usize) -> Option<String> {
    let mut table = String::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if trimmed.starts_with('[') && trimmed.ends_with(']') {
            table = trimmed
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .to_string();
        }
        let end = offset + line.len();
        if at >= offset && at < end.max(offset + 1) {
            if let Some((key, _)) = trimmed.split_once('=') {
                let key = key.trim();
                return Some(if table.is_empty() {
                    key.to_string()
                } else {
                    format!("{table}.{key}")
                });
            }
            return (!table.is_empty()).then_some(table);
        }
        offset = end;
    }
    None
}

fn merge(base: &mut toml::Table, layer: toml::Table) {
    for (key, value) in layer {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(base_table)), toml::Value::Table(layer_table)) => {
                merge(base_table, layer_table);
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

fn set_path(table: &mut toml::Table, path: &[&str], value: toml::Value) {
    match path {
        [] => {}
        [last] => {
            table.insert((*last).to_string(), value);
        }
        [first, rest @ ..] => {
            let entry = table
                .entry((*first).to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let toml::Value::Table(inner) = entry {
                set_path(inner, rest, value);
            }
        }
    }
}

/// Converts an environment string to the TOML type the key already has.
fn env_value(table: &toml::Table, path: &[&str], raw: &str) -> toml::Value {
    let mut current: Option<&toml::Value> = None;
    let mut scope = table;
    for (i, key) in path.iter().enumerate() {
        match scope.get(*key) {
            Some(toml::Value::Table(inner)) if i + 1 < path.len() => scope = inner,
            Some(value) if i + 1 == path.len() => current = Some(value),
            _ => break,
        }
    }
    match current {
        Some(toml::Value::Integer(_)) => raw
            .trim()
            .parse::<i64>()
            .map(toml::Value::Integer)
            .unwrap_or_else(|_| toml::Value::String(raw.to_string())),
        Some(toml::Value::Float(_)) => raw
            .trim()
            .parse::<f64>()
            .map(toml::Value::Float)
            .unwrap_or_else(|_| toml::Value::String(raw.to_string())),
        Some(toml::Value::Boolean(_)) => match raw.trim() {
            "true" | "1" | "yes" => toml::Value::Boolean(true),
            "false" | "0" | "no" => toml::Value::Boolean(false),
            _ => toml::Value::String(raw.to_string()),
        },
        _ => toml::Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn source(dir: Option<&Path>, env: &[(&str, &str)]) -> ConfigSource {
        ConfigSource {
            dir: dir.map(Path::to_path_buf),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn defaults_load() {
        let config = Config::load(&source(None, &[])).unwrap();
        assert_eq!(config.llm.base_url, "http://localhost:11434/v1");
        assert_eq!(config.agent.max_steps, 15);
        assert_eq!(config.orchestrator.url, "http://127.0.0.1:50051");
        assert_eq!(config.log.format, LogFormat::Text);
    }

    #[test]
    fn layers_apply_in_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("default.toml"),
            "[llm]\nmodel = \"from-default\"\nbase_url = \"http://a/v1\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("local.toml"),
            "[llm]\nmodel = \"from-local\"\n[agent]\nmax_steps = 3\n",
        )
        .unwrap();
        let config = Config::load(&source(
            Some(dir.path()),
            &[("AGENTRY_MAX_STEPS", "7"), ("AGENTRY_LLM_API_KEY", "sk-1")],
        ))
        .unwrap();
        assert_eq!(config.llm.model, "from-local");
        assert_eq!(config.llm.base_url, "http://a/v1");
        assert_eq!(config.agent.max_steps, 7);
        assert_eq!(config.llm.api_key, "sk-1");
        assert!(!format!("{config:?}").contains("sk-1"));
    }

    #[test]
    fn the_first_matching_model_profile_applies() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("local.toml"),
            "[[model_profiles]]\npattern = \"tiny-*\"\nnative_tools = false\ncontext_window = 4096\n\
             [[model_profiles]]\npattern = \"*\"\n",
        )
        .unwrap();
        let mut config = Config::load(&source(Some(dir.path()), &[])).unwrap();
        config.llm.model = "Tiny-Chat:1b".into();
        let p = config.model_profile();
        assert!(!p.native_tools);
        assert_eq!(p.context_window, 4096);
        config.llm.model = "qwen2.5:7b".into();
        assert!(config.model_profile().native_tools);
        assert!(ModelProfile::fallback().matches("anything"));
        let q = ModelProfile {
            pattern: "a?c".into(),
            ..ModelProfile::fallback()
        };
        assert!(q.matches("abc") && !q.matches("abbc"));
    }

    #[test]
    fn container_settings_from_the_environment() {
        let config = Config::load(&source(
            None,
            &[
                ("AGENTRY_CHROMIUM_SANDBOX", "false"),
                (
                    "AGENTRY_TOOL_RUNNER_URL",
                    "http://tool-runner:50053, http://10.0.0.9:50053",
                ),
            ],
        ))
        .unwrap();
        assert!(!config.tool_runner.web.chromium_sandbox);
        assert!(
            Config::load(&source(None, &[]))
                .unwrap()
                .tool_runner
                .web
                .chromium_sandbox
        );
        let err = Config::load(&source(
            None,
            &[("AGENTRY_TOOL_RUNNER_URL", "http://a:1,tool-runner:50053")],
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("tool_runner.url"), "{err}");
        assert!(
            err.contains("\"tool-runner:50053\" is not an http(s) URL"),
            "{err}"
        );
    }

    #[test]
    fn bad_file_names_file_key_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("local.toml"),
            "[agent]\nmax_steps = \"many\"\n",
        )
        .unwrap();
        let err = Config::load(&source(Some(dir.path()), &[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("local.toml"), "{err}");
        assert!(err.contains("max_steps"), "{err}");
        assert!(err.contains("invalid type"), "{err}");
    }

    #[test]
    fn unknown_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("default.toml"), "[llm]\nmodle = \"x\"\n").unwrap();
        let err = Config::load(&source(Some(dir.path()), &[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("default.toml"), "{err}");
        assert!(err.contains("modle"), "{err}");
    }

    #[test]
    fn syntax_error_is_reported_with_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("local.toml"), "[llm\n").unwrap();
        let err = Config::load(&source(Some(dir.path()), &[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("local.toml"), "{err}");
    }

    #[test]
    fn bad_env_value_names_variable() {
        let err = Config::load(&source(None, &[("AGENTRY_MAX_STEPS", "lots")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("AGENTRY_MAX_STEPS"), "{err}");
        assert!(err.contains("lots"), "{err}");
        let err = Config::load(&source(None, &[("AGENTRY_LLM_BASE_URL", "localhost:1")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("llm.base_url"), "{err}");
        let err = Config::load(&source(None, &[("AGENTRY_ORCHESTRATOR_LISTEN", "nowhere")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("AGENTRY_ORCHESTRATOR_LISTEN"), "{err}");
    }

    #[test]
    fn system_prompt_prefers_non_empty_system_md() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::load(&source(Some(dir.path()), &[])).unwrap();
        assert_eq!(config.system_prompt().unwrap(), DEFAULT_SYSTEM_PROMPT);
        std::fs::write(dir.path().join("default_system.md"), "default one").unwrap();
        std::fs::write(dir.path().join("system.md"), "  \n").unwrap();
        assert_eq!(config.system_prompt().unwrap(), "default one");
        std::fs::write(dir.path().join("system.md"), "mine").unwrap();
        assert_eq!(config.system_prompt().unwrap(), "mine");
        config.config_dir = None;
        assert_eq!(config.system_prompt().unwrap(), DEFAULT_SYSTEM_PROMPT);
    }
}
