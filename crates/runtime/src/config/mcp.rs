//! MCP servers: `[[mcp_servers]]` in the TOML layers, plus the servers of a
//! JSON file in the form other agents use (`{"mcpServers": {…}}`), named by
//! `mcp.servers_file`.

use super::{Config, ConfigError};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Settings shared by every MCP server.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// A JSON file of servers in the common `{"mcpServers": {…}}` form;
    /// relative to the config directory; empty: none.
    #[serde(default)]
    pub servers_file: String,
    /// Longest a call may take when its server names no `timeout_secs`.
    pub call_timeout_secs: u64,
    /// Longest a server may take to start and answer `initialize`.
    pub init_timeout_secs: u64,
    /// A session's connection to a server unused this long is closed (its
    /// process ends); the next call starts it again.
    pub idle_secs: u64,
    /// Most connections a runner keeps open; the least recently used one
    /// is closed to make room.
    pub max_connections: usize,
    /// Consecutive failed calls or starts that open a server's circuit.
    pub breaker_failures: u32,
    /// How long an open circuit refuses calls before trying once more.
    pub breaker_open_secs: u64,
    /// Whether a session may bring MCP servers of its own (an editor's,
    /// through ACP): started as the session, inside its sandbox.
    #[serde(default = "yes")]
    pub session_servers: bool,
}

/// One MCP server. Exactly one of `command` (stdio) and `url` (streamable
/// HTTP) is set.
#[derive(Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The name its tools are offered under (`<name>__<tool>`): letters,
    /// digits, `-` and `_`, without `__`.
    pub name: String,
    /// stdio: the program, looked up on the runner's PATH.
    #[serde(default)]
    pub command: String,
    /// stdio: its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// stdio: variables added to the sandbox's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// stdio: the working directory; relative paths are taken in the
    /// session's workspace (the default).
    #[serde(default)]
    pub cwd: String,
    /// stdio: more paths the server may read (its own files are found from
    /// `command` and absolute `args`).
    #[serde(default)]
    pub read_only: Vec<String>,
    /// stdio: outbound network through the runner's proxy.
    #[serde(default)]
    pub network: bool,
    /// HTTP: the endpoint, e.g. `http://127.0.0.1:8000/mcp`.
    #[serde(default)]
    pub url: String,
    /// HTTP: headers sent with every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// HTTP: a bearer token.
    #[serde(default)]
    pub bearer_token: String,
    /// HTTP: the runner's environment variable holding the bearer token.
    #[serde(default)]
    pub bearer_token_env: String,
    /// HTTP, OAuth: a client id registered with the server's authorization
    /// server; empty: `agentry mcp login` registers one itself.
    #[serde(default)]
    pub oauth_client_id: String,
    /// HTTP, OAuth: the scopes to ask for; empty: what the server names.
    #[serde(default)]
    pub oauth_scopes: Vec<String>,
    /// Whether the server is used.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Longest one call may take; 0: `mcp.call_timeout_secs`.
    #[serde(default)]
    pub timeout_secs: u64,
}

fn yes() -> bool {
    true
}

impl std::fmt::Debug for McpServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |map: &BTreeMap<String, String>| {
            map.keys()
                .map(|k| (k.clone(), "<redacted>"))
                .collect::<BTreeMap<_, _>>()
        };
        f.debug_struct("McpServerConfig")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &redacted(&self.env))
            .field("cwd", &self.cwd)
            .field("read_only", &self.read_only)
            .field("network", &self.network)
            .field("url", &self.url)
            .field("headers", &redacted(&self.headers))
            .field(
                "bearer_token",
                &if self.bearer_token.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("bearer_token_env", &self.bearer_token_env)
            .field("oauth_client_id", &self.oauth_client_id)
            .field("oauth_scopes", &self.oauth_scopes)
            .field("enabled", &self.enabled)
            .field("timeout_secs", &self.timeout_secs)
            .finish()
    }
}

impl McpServerConfig {
    /// "stdio" or "http".
    pub fn transport(&self) -> &'static str {
        if self.url.is_empty() { "stdio" } else { "http" }
    }
}

/// The separator between a server's name and its tool's in the names
/// offered to the model.
pub const MCP_SEPARATOR: &str = "__";

impl Config {
    /// Every configured MCP server: `[[mcp_servers]]`, then those of
    /// `mcp.servers_file`. Checked: names, transports, duplicates.
    pub fn mcp_servers(&self) -> Result<Vec<McpServerConfig>, ConfigError> {
        let mut servers = self.mcp_servers.clone();
        if !self.mcp.servers_file.trim().is_empty() {
            let path = self.resolve_config_path(self.mcp.servers_file.trim());
            servers.extend(read_servers_file(&path)?);
        }
        let mut seen = std::collections::BTreeSet::new();
        for server in &servers {
            check_server(server).map_err(|reason| ConfigError::Invalid {
                source_name: "configuration".into(),
                reason: format!("mcp_servers {:?}: {reason}", server.name),
            })?;
            if !seen.insert(server.name.clone()) {
                return Err(ConfigError::Invalid {
                    source_name: "configuration".into(),
                    reason: format!(
                        "mcp_servers: {:?} is defined twice (names must be unique across \
                         [[mcp_servers]] and mcp.servers_file)",
                        server.name
                    ),
                });
            }
        }
        Ok(servers)
    }

    /// A path from the configuration: absolute as given, else in the
    /// config directory (or the working directory without one).
    pub fn resolve_config_path(&self, path: &str) -> PathBuf {
        let p = Path::new(path);
        if p.is_absolute() {
            return p.to_path_buf();
        }
        match &self.config_dir {
            Some(dir) => dir.join(p),
            None => p.to_path_buf(),
        }
    }
}

/// Whether `server` is a usable definition: its name, one transport, the
/// settings of that transport only. The reason when not.
pub fn check_server(server: &McpServerConfig) -> Result<(), String> {
    let name = &server.name;
    if name.is_empty()
        || name.len() > 32
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(
            "the name must be 1 to 32 letters, digits, '-' or '_' (its tools are offered as \
             <name>__<tool>)"
                .into(),
        );
    }
    if name.contains(MCP_SEPARATOR) || name.ends_with('_') {
        return Err("the name must not contain \"__\" or end with '_'".into());
    }
    match (
        server.command.trim().is_empty(),
        server.url.trim().is_empty(),
    ) {
        (true, true) => {
            Err("set `command` (a stdio server) or `url` (a streamable HTTP server)".into())
        }
        (false, false) => Err("set `command` or `url`, not both".into()),
        (false, true) => {
            if !server.headers.is_empty()
                || !server.bearer_token.is_empty()
                || !server.bearer_token_env.is_empty()
                || !server.oauth_client_id.is_empty()
                || !server.oauth_scopes.is_empty()
            {
                return Err(
                    "headers, bearer tokens and OAuth settings apply to `url` servers only".into(),
                );
            }
            Ok(())
        }
        (true, false) => {
            let url = server.url.trim();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!("url {url:?} is not an http(s) URL"));
            }
            if !server.args.is_empty() || !server.env.is_empty() || !server.cwd.is_empty() {
                return Err("args, env and cwd apply to `command` servers only".into());
            }
            Ok(())
        }
    }
}

/// One server as the common JSON form writes it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonServer {
    #[serde(default)]
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    cwd: String,
    #[serde(default)]
    url: String,
    /// Gemini CLI's name for a streamable HTTP endpoint.
    #[serde(default)]
    http_url: String,
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    disabled: bool,
    #[serde(default)]
    enabled: Option<bool>,
    /// Milliseconds, as Gemini CLI writes it.
    #[serde(default)]
    timeout: u64,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonFile {
    mcp_servers: BTreeMap<String, JsonServer>,
}

/// Keys of the common form that mean nothing here; they are skipped.
const IGNORED_KEYS: &[&str] = &[
    "trust",
    "description",
    "includeTools",
    "excludeTools",
    "autoApprove",
    "alwaysAllow",
];

/// Reads the servers of a JSON file in the `{"mcpServers": {…}}` form.
pub fn read_servers_file(path: &Path) -> Result<Vec<McpServerConfig>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let invalid = |reason: String| ConfigError::Invalid {
        source_name: path.display().to_string(),
        reason,
    };
    let file: JsonFile = serde_json::from_str(&text).map_err(|e| {
        invalid(format!(
            "{e} (expected {{\"mcpServers\": {{\"<name>\": {{\"command\": …}}}}}})"
        ))
    })?;
    let mut servers = Vec::new();
    for (name, s) in file.mcp_servers {
        let unknown: Vec<&String> = s
            .other
            .keys()
            .filter(|k| !IGNORED_KEYS.contains(&k.as_str()))
            .collect();
        if !unknown.is_empty() {
            return Err(invalid(format!(
                "mcpServers.{name}: unknown keys {unknown:?} (known: command, args, env, cwd, \
                 url, httpUrl, type, headers, disabled, timeout)"
            )));
        }
        let url = if s.http_url.is_empty() {
            s.url
        } else {
            s.http_url
        };
        match s.kind.as_str() {
            "" | "stdio" | "http" | "streamable-http" | "streamableHttp" => {}
            // A file shared with other agents may name servers of the
            // old transport: the rest of the file still counts.
            "sse" => {
                tracing::warn!(
                    file = %path.display(),
                    "mcpServers.{name} is skipped: the old HTTP+SSE transport (\"type\": \
                     \"sse\") is not supported; give the server's streamable HTTP endpoint \
                     instead"
                );
                continue;
            }
            other => {
                return Err(invalid(format!(
                    "mcpServers.{name}: unknown type {other:?} (stdio or http)"
                )));
            }
        }
        servers.push(McpServerConfig {
            name,
            command: s.command,
            args: s.args,
            env: s.env,
            cwd: s.cwd,
            url,
            headers: s.headers,
            enabled: s.enabled.unwrap_or(!s.disabled),
            timeout_secs: s.timeout.div_ceil(1000),
            ..McpServerConfig::default()
        });
    }
    Ok(servers)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn config_with(servers: Vec<McpServerConfig>, file: Option<&Path>) -> Config {
        let mut config = Config::builtin().clone();
        config.mcp_servers = servers;
        config.mcp.servers_file = file.map(|p| p.display().to_string()).unwrap_or_default();
        config
    }

    fn stdio(name: &str) -> McpServerConfig {
        McpServerConfig {
            name: name.into(),
            command: "python3".into(),
            enabled: true,
            ..McpServerConfig::default()
        }
    }

    #[test]
    fn the_common_json_form_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcp.json");
        std::fs::write(
            &path,
            r#"{"mcpServers": {
                "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
                "docs": {"type": "http", "url": "http://127.0.0.1:9000/mcp",
                         "headers": {"X-Key": "k"}, "timeout": 1500},
                "gem": {"httpUrl": "http://127.0.0.1:9001/mcp", "trust": true},
                "off": {"command": "x", "disabled": true}
            }}"#,
        )
        .unwrap();
        let servers = config_with(vec![stdio("local")], Some(&path))
            .mcp_servers()
            .unwrap();
        let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["local", "docs", "gem", "off", "time"]);
        let docs = &servers[1];
        assert_eq!(docs.transport(), "http");
        assert_eq!(docs.timeout_secs, 2);
        assert_eq!(docs.headers.get("X-Key").map(String::as_str), Some("k"));
        assert_eq!(servers[2].url, "http://127.0.0.1:9001/mcp");
        assert!(!servers[3].enabled);
        assert_eq!(servers[4].args, ["mcp-server-time"]);
        assert_eq!(servers[4].transport(), "stdio");
    }

    #[test]
    fn bad_servers_are_refused_with_the_reason() {
        let cases: Vec<(McpServerConfig, &str)> = vec![
            (
                McpServerConfig {
                    name: "a__b".into(),
                    ..stdio("x")
                },
                "must not contain",
            ),
            (
                McpServerConfig {
                    name: "sp ace".into(),
                    ..stdio("x")
                },
                "letters, digits",
            ),
            (
                McpServerConfig {
                    command: String::new(),
                    ..stdio("none")
                },
                "set `command`",
            ),
            (
                McpServerConfig {
                    url: "http://h/mcp".into(),
                    ..stdio("both")
                },
                "not both",
            ),
            (
                McpServerConfig {
                    command: String::new(),
                    url: "ftp://h".into(),
                    ..stdio("ftp")
                },
                "not an http(s) URL",
            ),
            (
                McpServerConfig {
                    headers: [("a".to_string(), "b".to_string())].into(),
                    ..stdio("hdr")
                },
                "apply to `url` servers only",
            ),
        ];
        for (server, expected) in cases {
            let err = config_with(vec![server.clone()], None)
                .mcp_servers()
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{server:?}: {err}");
        }
        let err = config_with(vec![stdio("t"), stdio("t")], None)
            .mcp_servers()
            .unwrap_err()
            .to_string();
        assert!(err.contains("defined twice"), "{err}");
    }

    #[test]
    fn bad_json_files_name_the_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        for (text, expected) in [
            (r#"{"servers": {}}"#, "mcpServers"),
            (
                r#"{"mcpServers": {"a": {"command": "x", "bogus": 1}}}"#,
                "unknown keys",
            ),
        ] {
            let path = dir.path().join("bad.json");
            std::fs::write(&path, text).unwrap();
            let err = config_with(Vec::new(), Some(&path))
                .mcp_servers()
                .unwrap_err()
                .to_string();
            assert!(err.contains("bad.json"), "{err}");
            assert!(err.contains(expected), "{text}: {err}");
        }
        // A server of the old SSE transport is skipped; the others count.
        let shared = dir.path().join("shared.json");
        std::fs::write(
            &shared,
            r#"{"mcpServers": {"old": {"type": "sse", "url": "http://h/sse"},
                               "time": {"command": "uvx", "args": ["mcp-server-time"]}}}"#,
        )
        .unwrap();
        let servers = config_with(Vec::new(), Some(&shared))
            .mcp_servers()
            .unwrap();
        let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["time"]);
        let err = config_with(Vec::new(), Some(&dir.path().join("missing.json")))
            .mcp_servers()
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.json"), "{err}");
    }
}
