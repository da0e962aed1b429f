//! Real MCP servers for tests: the reference servers from PyPI and the
//! fixture server written with the official Python SDK
//! (`crates/fakes/mcp/fixture_server.py`), as `scripts/mcp-servers.sh`
//! installs them in a virtualenv.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

/// The fixture server's source.
pub const FIXTURE: &str = include_str!("../mcp/fixture_server.py");

/// The virtualenv of `scripts/mcp-servers.sh` (`AGENTRY_MCP_VENV`, else
/// `/opt/agentry/mcp-venv-1` for root, `~/.cache/agentry/mcp-venv-1` for
/// others), or `None` with a message when it is not there; under
/// `CI=true` its absence panics, so a missing install fails the run.
pub fn venv() -> Option<PathBuf> {
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    let path = match std::env::var("AGENTRY_MCP_VENV") {
        Ok(p) if !p.is_empty() => PathBuf::from(p),
        _ if root => PathBuf::from("/opt/agentry/mcp-venv-1"),
        _ => PathBuf::from(std::env::var("HOME").unwrap_or_default())
            .join(".cache/agentry/mcp-venv-1"),
    };
    if path.join("bin/mcp-server-time").is_file() {
        return Some(path);
    }
    let why = format!(
        "no MCP servers at {} (run scripts/mcp-servers.sh)",
        path.display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("skipping: {why}");
    None
}

/// A copy of the fixture server in a directory every identity can read
/// (sandboxed servers run as other users); removed when dropped.
pub struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    /// Writes the fixture.
    pub fn new() -> std::io::Result<Fixture> {
        let dir = tempfile::tempdir()?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let fixture = Fixture { dir };
        std::fs::write(fixture.script(), FIXTURE)?;
        std::fs::set_permissions(fixture.script(), std::fs::Permissions::from_mode(0o644))?;
        Ok(fixture)
    }

    /// The script's path.
    pub fn script(&self) -> PathBuf {
        self.dir.path().join("fixture_server.py")
    }
}

/// An MCP server of this repository's fixtures (`crates/fakes/mcp/`) run
/// over streamable HTTP on loopback with the virtualenv's python; stopped
/// when dropped.
pub struct HttpFixture {
    child: std::process::Child,
    /// Its port.
    pub port: u16,
}

impl HttpFixture {
    /// The server whose tools ask a person for input (`asking_server.py`:
    /// a task that asks with a form, the stateless round trip with a form
    /// and with a page to visit).
    pub fn asking(venv: &std::path::Path) -> std::io::Result<HttpFixture> {
        HttpFixture::start(venv, "asking_server.py", &[])
    }

    /// The server behind OAuth, its own authorization server
    /// (`oauth_server.py`), whose access tokens live `access_ttl_secs`.
    pub fn oauth(venv: &std::path::Path, access_ttl_secs: u64) -> std::io::Result<HttpFixture> {
        let ttl = access_ttl_secs.to_string();
        HttpFixture::start(venv, "oauth_server.py", &[("FIXTURE_ACCESS_TTL", &ttl)])
    }

    /// Starts `script` with `env`; waits until it listens.
    fn start(
        venv: &std::path::Path,
        script: &str,
        env: &[(&str, &str)],
    ) -> std::io::Result<HttpFixture> {
        use std::io::BufRead;
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("mcp")
            .join(script);
        let mut child = std::process::Command::new(venv.join("bin/python"))
            .arg(&script)
            .args(["--port", "0"])
            .envs(env.iter().copied())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| std::io::Error::other("no stderr"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let name = script.display().to_string();
        std::thread::spawn(move || {
            let mut told = false;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if !told && let Some(port) = line.trim().strip_prefix("listening on ") {
                    told = true;
                    let _ = tx.send(port.trim().parse::<u16>().ok());
                } else {
                    eprintln!("{name}: {line}");
                }
            }
        });
        match rx.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(Some(port)) => Ok(HttpFixture { child, port }),
            _ => {
                let _ = child.kill();
                Err(std::io::Error::other(format!(
                    "{} did not start",
                    script.display()
                )))
            }
        }
    }

    /// Its MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// The JSON it answers a plain GET of `path` with (its test views:
    /// `/state`, `/stats`); `Null` when it cannot be read.
    pub fn get_json(&self, path: &str) -> serde_json::Value {
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return serde_json::Value::Null;
        };
        use std::io::{Read, Write};
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.port
        );
        if stream.write_all(request.as_bytes()).is_err() {
            return serde_json::Value::Null;
        }
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        text.split_once("\r\n\r\n")
            .and_then(|(_, body)| serde_json::from_str(body).ok())
            .unwrap_or(serde_json::Value::Null)
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
