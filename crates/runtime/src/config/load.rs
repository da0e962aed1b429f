//! Resolving the configuration: the layers (built-in defaults, the config
//! directory's files, the environment), each parsed and checked on its own,
//! merged in order; and what is derived from it (data directory, workspace
//! root, system prompt, model profile).

use super::*;

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
    /// The directory given, else `AGENTRY_CONFIG_DIR`, else `./config`
    /// when it exists (a checkout of this project), else the person's
    /// `$XDG_CONFIG_HOME/agentry` (`~/.config/agentry`) when it exists;
    /// with the process environment.
    pub fn from_process(dir_override: Option<PathBuf>) -> Self {
        let env: BTreeMap<String, String> = std::env::vars().collect();
        let dir = dir_override
            .or_else(|| env.get("AGENTRY_CONFIG_DIR").map(PathBuf::from))
            .or_else(|| {
                let local = PathBuf::from("config");
                local.is_dir().then_some(local)
            })
            .or_else(|| {
                let base = env
                    .get("XDG_CONFIG_HOME")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
                    .or_else(|| {
                        env.get("HOME")
                            .filter(|v| !v.is_empty())
                            .map(|h| PathBuf::from(h).join(".config"))
                    })?;
                let personal = base.join("agentry");
                personal.is_dir().then_some(personal)
            });
        Self { dir, env }
    }
}

/// The environment variables the loader reads.
pub fn env_vars() -> impl Iterator<Item = &'static str> {
    ENV_KEYS.iter().map(|(var, _)| *var)
}

/// Environment variables and the key each one sets.
const ENV_KEYS: &[(&str, &[&str])] = &[
    ("AGENTRY_DATA_DIR", &["data_dir"]),
    ("AGENTRY_MCP_SERVERS_FILE", &["mcp", "servers_file"]),
    ("AGENTRY_LLM_BASE_URL", &["llm", "base_url"]),
    ("AGENTRY_LLM_MODEL", &["llm", "model"]),
    (
        "AGENTRY_LLM_MAX_CONCURRENT_REQUESTS",
        &["llm", "max_concurrent_requests"],
    ),
    ("AGENTRY_LLM_API_KEY", &["llm", "api_key"]),
    ("AGENTRY_LLM_PROVIDER", &["llm", "provider"]),
    ("AGENTRY_LLM_TOOL_CHOICE", &["llm", "tool_choice"]),
    ("AGENTRY_LLM_CONTEXT_WINDOW", &["llm", "context_window"]),
    ("AGENTRY_LLM_IMAGES", &["llm", "images"]),
    (
        "AGENTRY_LLM_MAX_RESPONSE_BYTES",
        &["llm", "max_response_bytes"],
    ),
    (
        "AGENTRY_LLM_MAX_TOOL_ARGUMENTS_BYTES",
        &["llm", "max_tool_arguments_bytes"],
    ),
    ("AGENTRY_MAX_STEPS", &["agent", "max_steps"]),
    ("AGENTRY_SKILLSETS", &["agent", "skillsets"]),
    ("AGENTRY_SKILLSETS_DIR", &["agent", "skillsets_dir"]),
    ("AGENTRY_COMPACTION", &["agent", "compaction"]),
    ("AGENTRY_PLAN_MAX_STEPS", &["agent", "plan_max_steps"]),
    ("AGENTRY_LOOP_REPEATS", &["agent", "loop_repeats"]),
    ("AGENTRY_NO_PROGRESS_STEPS", &["agent", "no_progress_steps"]),
    ("AGENTRY_TURN_TOKEN_BUDGET", &["agent", "turn_token_budget"]),
    (
        "AGENTRY_SESSION_TOKEN_BUDGET",
        &["agent", "session_token_budget"],
    ),
    ("AGENTRY_ORCHESTRATOR_URL", &["orchestrator", "url"]),
    ("AGENTRY_ORCHESTRATOR_LISTEN", &["orchestrator", "listen"]),
    (
        "AGENTRY_ORCHESTRATOR_ADVERTISE_URL",
        &["orchestrator", "advertise_url"],
    ),
    (
        "AGENTRY_ORCHESTRATOR_UNLOAD_IDLE_SECS",
        &["orchestrator", "unload_idle_secs"],
    ),
    (
        "AGENTRY_ORCHESTRATOR_CHECKPOINT_EVERY_EVENTS",
        &["orchestrator", "checkpoint_every_events"],
    ),
    ("AGENTRY_SESSION_STORE_URL", &["session_store", "url"]),
    ("AGENTRY_SESSION_STORE_LISTEN", &["session_store", "listen"]),
    (
        "AGENTRY_SESSION_STORE_DATABASE_URL",
        &["session_store", "database_url"],
    ),
    (
        "AGENTRY_SCHEDULER_DATABASE_URL",
        &["scheduler", "database_url"],
    ),
    ("AGENTRY_TOOL_RUNNER_URL", &["tool_runner", "url"]),
    ("AGENTRY_TOOL_RUNNER_LISTEN", &["tool_runner", "listen"]),
    ("AGENTRY_WORKSPACE_ROOT", &["tool_runner", "workspace_root"]),
    ("AGENTRY_RUNNER_ID", &["tool_runner", "id"]),
    ("AGENTRY_PROJECT_ROOTS", &["tool_runner", "project_roots"]),
    (
        "AGENTRY_SNAPSHOTS_INCLUDE_IGNORED",
        &["tool_runner", "snapshots", "include_ignored"],
    ),
    ("AGENTRY_SANDBOX", &["tool_runner", "sandbox", "mode"]),
    (
        "AGENTRY_SNAPSHOTS",
        &["tool_runner", "snapshots", "enabled"],
    ),
    (
        "AGENTRY_SNAPSHOTS_DIR",
        &["tool_runner", "snapshots", "dir"],
    ),
    (
        "AGENTRY_SANDBOX_HELPER",
        &["tool_runner", "sandbox", "helper"],
    ),
    (
        "AGENTRY_SANDBOX_SESSION_IDLE_SECS",
        &["tool_runner", "sandbox", "session_idle_secs"],
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
    ("AGENTRY_GATEWAY_LISTEN", &["gateway", "listen"]),
    ("AGENTRY_GATEWAY_URL", &["gateway", "url"]),
    (
        "AGENTRY_GATEWAY_BEHIND_TLS_PROXY",
        &["gateway", "behind_tls_proxy"],
    ),
    (
        "AGENTRY_GATEWAY_PRIVATE_NETWORK",
        &["gateway", "private_network"],
    ),
    ("AGENTRY_GATEWAY_TLS_CERT", &["gateway", "tls_cert"]),
    ("AGENTRY_GATEWAY_TLS_KEY", &["gateway", "tls_key"]),
    ("AGENTRY_SCHEDULER_URL", &["scheduler", "url"]),
    ("AGENTRY_SCHEDULER_LISTEN", &["scheduler", "listen"]),
    ("AGENTRY_LOG_FORMAT", &["log", "format"]),
    ("AGENTRY_OTLP_ENDPOINT", &["otel", "endpoint"]),
    ("AGENTRY_AUTH", &["auth", "mode"]),
    ("AGENTRY_TOKEN", &["auth", "token"]),
    ("AGENTRY_CLIENT_TOKEN_FILE", &["auth", "client_token_file"]),
    ("AGENTRY_PEOPLE_FILE", &["auth", "people_file"]),
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
        let mut notices = Vec::new();
        let mut merged = parse_layer("built-in defaults", DEFAULT_TOML)?;
        check_layer("built-in defaults", &merged, None)?;
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
                let mut layer = parse_layer(&label, &text)?;
                let dropped = add_policy_rules(&merged, &mut layer);
                // Check the layer over the defaults so that a layer may set
                // only some keys, yet errors still name this file.
                let mut candidate = merged.clone();
                merge(&mut candidate, layer);
                check_layer(&label, &candidate, Some(dir))?;
                merged = candidate;
                notices.extend(dropped.into_iter().map(|rule| {
                    format!(
                        "{label}: policy.replace_default_rules = true drops the deny rule {rule}"
                    )
                }));
            }
        }
        for (var, path) in ENV_KEYS {
            let Some(value) = source.env.get(*var) else {
                continue;
            };
            let mut candidate = merged.clone();
            set_path(&mut candidate, path, env_value(&merged, path, value));
            check_layer(var, &candidate, source.dir.as_deref()).map_err(|e| ConfigError::Env {
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
        config.notices = notices;
        config.validate("configuration")?;
        Ok(config)
    }

    /// Checks the `[[secrets]]`.
    fn check_secrets(&self, label: &str) -> Result<(), ConfigError> {
        let invalid = |i: usize, reason: String| ConfigError::Invalid {
            source_name: label.to_string(),
            reason: format!("secrets[{i}]: {reason}"),
        };
        let mut names = std::collections::BTreeSet::new();
        for (i, s) in self.secrets.iter().enumerate() {
            let name_ok = s
                .name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
                && s.name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if !name_ok || !names.insert(s.name.as_str()) {
                return Err(invalid(
                    i,
                    format!(
                        "name {:?} must be unique and an environment variable's name (A-Z, 0-9, _)",
                        s.name
                    ),
                ));
            }
            if s.value_env.is_empty() == s.value_file.is_empty() {
                return Err(invalid(
                    i,
                    "set value_env or value_file (one of them)".into(),
                ));
            }
            if s.allow.is_empty() {
                return Err(invalid(i, "allow is empty: say where it may go".into()));
            }
            for rule in &s.allow {
                let command_rule = rule.tool == "bash"
                    && !rule.command.trim().is_empty()
                    && rule.host.is_empty()
                    && rule.header.is_empty();
                let header_rule = rule.tool.is_empty()
                    && rule.command.is_empty()
                    && valid_host_rule(&rule.host)
                    && rule.header_parts().is_some();
                if !command_rule && !header_rule {
                    return Err(invalid(
                        i,
                        "each allow rule is { tool = \"bash\", command = \"GLOB\" } or \
                         { host = \"HOST[:PORT]\", header = \"Name: text with {value}\" }"
                            .into(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checks the `[[notify]]` webhooks.
    fn check_notify(&self, label: &str) -> Result<(), ConfigError> {
        let invalid = |i: usize, reason: String| ConfigError::Invalid {
            source_name: label.to_string(),
            reason: format!("notify[{i}]: {reason}"),
        };
        let mut names = std::collections::BTreeSet::new();
        for (i, n) in self.notify.iter().enumerate() {
            if n.name.trim().is_empty() || !names.insert(n.name.as_str()) {
                return Err(invalid(
                    i,
                    format!("name {:?} must be set and unique", n.name),
                ));
            }
            if !(n.url.starts_with("http://") || n.url.starts_with("https://")) {
                return Err(invalid(i, format!("url {:?} is not an http(s) URL", n.url)));
            }
            if !n.secret_env.is_empty() && !n.secret_file.is_empty() {
                return Err(invalid(i, "set secret_env or secret_file, not both".into()));
            }
            if n.events.is_empty() {
                return Err(invalid(
                    i,
                    format!(
                        "events is empty; name some of {}",
                        super::NOTIFY_EVENTS.join(", ")
                    ),
                ));
            }
            for event in &n.events {
                if !super::NOTIFY_EVENTS.contains(&event.as_str()) {
                    return Err(invalid(
                        i,
                        format!(
                            "unknown event {event:?}; the events are {}",
                            super::NOTIFY_EVENTS.join(", ")
                        ),
                    ));
                }
            }
            for (name, value) in &n.headers {
                if name.is_empty()
                    || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    || value.chars().any(char::is_control)
                {
                    return Err(invalid(i, format!("header {name:?} is not a valid header")));
                }
            }
        }
        Ok(())
    }

    fn validate(&self, label: &str) -> Result<(), ConfigError> {
        self.check_model(label)?;
        self.check_services(label)?;
        self.check_agent(label)?;
        self.check_addresses(label)
    }

    /// Checks `[llm]` and the policy's rules.
    fn check_model(&self, label: &str) -> Result<(), ConfigError> {
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
        // A rule that does not compile is the file's mistake, said at load
        // by every command, not when the orchestrator starts.
        if let Err(e) = agentry_policy::Policy::from_config(&self.policy) {
            return Err(invalid(
                "policy.rules",
                &format!("{e} (rules of earlier layers count first)"),
            ));
        }
        let ceiling = super::MAX_RESPONSE_BYTES_CEILING;
        if !(1024..=ceiling).contains(&self.llm.max_response_bytes) {
            return Err(invalid(
                "llm.max_response_bytes",
                &format!(
                    "{} is outside 1024..={ceiling} (the upper bound keeps every event holding \
                     a response within what the session store accepts)",
                    self.llm.max_response_bytes
                ),
            ));
        }
        if !(1024..=self.llm.max_response_bytes).contains(&self.llm.max_tool_arguments_bytes) {
            return Err(invalid(
                "llm.max_tool_arguments_bytes",
                &format!(
                    "{} is outside 1024..={} (llm.max_response_bytes)",
                    self.llm.max_tool_arguments_bytes, self.llm.max_response_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Checks TLS, the sandbox's identities, MCP, hooks and agents.
    fn check_services(&self, label: &str) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: &str| ConfigError::Invalid {
            source_name: label.to_string(),
            reason: format!("{key}: {reason}"),
        };
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
        if self.mcp.max_connections == 0 {
            return Err(invalid("mcp.max_connections", "must be at least 1"));
        }
        for (key, value) in [
            ("mcp.call_timeout_secs", self.mcp.call_timeout_secs),
            ("mcp.init_timeout_secs", self.mcp.init_timeout_secs),
            ("mcp.idle_secs", self.mcp.idle_secs),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        self.mcp_servers()?;
        self.check_hooks(label)?;
        self.check_notify(label)?;
        self.check_secrets(label)?;
        self.agents()?;
        Ok(())
    }

    /// Checks `[agent]`, the model prices and profiles.
    fn check_agent(&self, label: &str) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: &str| ConfigError::Invalid {
            source_name: label.to_string(),
            reason: format!("{key}: {reason}"),
        };
        if self.agent.max_parallel_agents == 0 {
            return Err(invalid("agent.max_parallel_agents", "must be at least 1"));
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
        for (key, value) in [
            ("agent.turn_cost_budget", self.agent.turn_cost_budget),
            ("agent.session_cost_budget", self.agent.session_cost_budget),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(invalid(key, "must be a number of 0 (no limit) or more"));
            }
        }
        if self.agent.loop_repeats == 1 {
            return Err(invalid(
                "agent.loop_repeats",
                "must be 0 (off) or at least 2: a first call is never a repeat",
            ));
        }
        if self.agent.plan_max_steps == 0 {
            return Err(invalid("agent.plan_max_steps", "must be at least 1"));
        }
        for price in &self.model_prices {
            let prices = [
                Some(price.input),
                Some(price.output),
                price.cached_input,
                price.cache_write,
            ];
            if prices
                .into_iter()
                .flatten()
                .any(|p| !p.is_finite() || p < 0.0)
            {
                return Err(invalid(
                    "model_prices",
                    &format!(
                        "the prices for {:?} must be numbers of 0 or more (per million tokens)",
                        price.pattern
                    ),
                ));
            }
        }
        if let Some(key) = self.llm.extra_body.keys().find(|k| {
            matches!(
                k.as_str(),
                "model" | "messages" | "stream" | "stream_options" | "tools" | "tool_choice"
            )
        }) {
            return Err(invalid(
                "llm.extra_body",
                &format!(
                    "{key:?} is set by Agentry itself (model, messages, stream, stream_options, \
                     tools and tool_choice cannot be overridden; see llm.tool_choice)"
                ),
            ));
        }
        if self.llm.context_window != 0 && self.llm.context_window < 256 {
            return Err(invalid(
                "llm.context_window",
                &format!(
                    "{} is too small: at least 256 tokens (0: the model profile's)",
                    self.llm.context_window
                ),
            ));
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
        Ok(())
    }

    /// Checks the runner's timeouts and the services' URLs.
    fn check_addresses(&self, label: &str) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: &str| ConfigError::Invalid {
            source_name: label.to_string(),
            reason: format!("{key}: {reason}"),
        };
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
                        &format!("{url:?} is not an http(s) URL (e.g. http://127.0.0.1:7741)"),
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

    /// The people file: `auth.people_file`, else `people.toml` beside the
    /// service token (which every service can read, and clients cannot).
    pub fn people_file(&self) -> PathBuf {
        match self.auth.people_file.as_str() {
            "" => self
                .service_token_file()
                .parent()
                .map_or_else(|| PathBuf::from("people.toml"), |d| d.join("people.toml")),
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
    /// The directories sessions may work under (`tool_runner.project_roots`
    /// with `~` expanded; `~` stands for nothing when the services run as
    /// root).
    pub fn project_roots(&self) -> Vec<PathBuf> {
        let home = (!running_as_root()).then(home_dir).flatten();
        self.tool_runner
            .project_roots
            .iter()
            .map(|r| r.trim())
            .filter(|r| !r.is_empty())
            .filter_map(|r| match r.strip_prefix('~') {
                Some("") => home.clone(),
                Some(rest) if rest.starts_with('/') => {
                    home.as_ref().map(|h| h.join(rest.trim_start_matches('/')))
                }
                _ => Some(PathBuf::from(r)),
            })
            .collect()
    }

    /// Where workspace snapshots are stored.
    pub fn snapshots_dir(&self) -> PathBuf {
        if self.tool_runner.snapshots.dir.is_empty() {
            self.workspace_root().join(".snapshots")
        } else {
            PathBuf::from(&self.tool_runner.snapshots.dir)
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
    text.parse::<toml::Table>().map_err(|e| {
        let reason = describe_toml_error(&e, text);
        ConfigError::Invalid {
            source_name: label.to_string(),
            // A syntax error: its line in the file.
            reason: match e.span() {
                Some(span) => {
                    let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                    format!("line {line}: {reason}")
                }
                None => reason,
            },
        }
    })
}

fn check_layer(
    label: &str,
    table: &toml::Table,
    dir: Option<&std::path::Path>,
) -> Result<(), ConfigError> {
    let mut config = deserialize(label, table)?;
    // Paths in the layers are relative to the config directory.
    config.config_dir = dir.map(std::path::Path::to_path_buf);
    config.validate(label)
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

/// Makes a layer's `[[policy.rules]]` add to the rules so far instead of
/// replacing them (a rule already there is not added twice), so that a
/// `local.toml` with one allow rule keeps every default deny rule. A layer
/// with `policy.replace_default_rules = true` replaces them instead; the
/// deny rules it drops are returned, for start-up to name. The directive
/// itself is taken out of the layer: it is about merging, not a setting.
fn add_policy_rules(base: &toml::Table, layer: &mut toml::Table) -> Vec<String> {
    let Some(toml::Value::Table(policy)) = layer.get_mut("policy") else {
        return Vec::new();
    };
    let replace = policy
        .remove("replace_default_rules")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    let earlier: Vec<toml::Value> = base
        .get("policy")
        .and_then(|p| p.get("rules"))
        .and_then(toml::Value::as_array)
        .cloned()
        .unwrap_or_default();
    let Some(toml::Value::Array(rules)) = policy.get_mut("rules") else {
        return Vec::new();
    };
    if replace {
        return earlier
            .iter()
            .filter(|r| r.get("decision").and_then(toml::Value::as_str) == Some("deny"))
            .filter(|r| !rules.contains(r))
            .map(|r| {
                let text = |key: &str| r.get(key).and_then(toml::Value::as_str).unwrap_or("");
                let what = [text("command"), text("path")].concat();
                if what.is_empty() {
                    format!("for {}", text("tool"))
                } else {
                    format!("{} {what:?}", text("tool"))
                }
            })
            .collect();
    }
    let mut combined = earlier;
    for rule in rules.drain(..) {
        if !combined.contains(&rule) {
            combined.push(rule);
        }
    }
    *rules = combined;
    Vec::new()
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
        Some(toml::Value::Array(_)) => toml::Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(|item| toml::Value::String(item.to_string()))
                .collect(),
        ),
        Some(toml::Value::Boolean(_)) => match raw.trim() {
            "true" | "1" | "yes" => toml::Value::Boolean(true),
            "false" | "0" | "no" => toml::Value::Boolean(false),
            _ => toml::Value::String(raw.to_string()),
        },
        _ => toml::Value::String(raw.to_string()),
    }
}

/// The home directory of the user this process runs as ($HOME).
fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// A secret's host rule names one host (a DNS name or an IP address),
/// optionally with a port: no scheme, path or wildcard.
fn valid_host_rule(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => (name, Some(port)),
        _ => (host, None),
    };
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p != 0))
}
