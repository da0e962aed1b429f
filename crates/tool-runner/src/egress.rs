//! The egress proxy: the only way out for a command that was granted
//! network. It speaks HTTP proxy (CONNECT tunnels for https and anything
//! else over TCP, absolute-form requests for plain http), and applies the
//! address rules of the web tools to every destination: no loopback,
//! private, link-local, shared or metadata address, whatever the spelling
//! or DNS answer, unless named in `tool_runner.sandbox.network_allow_hosts`.
//! The proxy resolves names itself and connects to the address it checked,
//! so DNS rebinding cannot slip past it.
//!
//! Each call with network gets a [`Pass`]: a random credential carried in
//! the proxy URL of the command's environment (`http_proxy`,
//! `https_proxy`…), valid while the call runs. A connection without a valid
//! credential is refused, so neither a call without network nor another
//! process on the host can use the proxy.
//!
//! A secret's header rule (`[[secrets]]` with `host` and `header`) makes
//! the proxy add the header to a tool call's plain `http://` request for
//! that host and send it on over HTTPS itself (the only requests whose
//! headers it can see); the call's result records the use.
//!
//! Commands reach the proxy through its Unix socket (bridged into the
//! call's network namespace by the sandbox helper) or, without namespaces,
//! through its loopback TCP port, the only port Landlock lets them connect
//! to.

use crate::errors::NoNetwork;
use crate::web::FetchError;
use crate::web::ssrf::Guard;
use agentry_sandbox::ProxyRoute;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The proxy's socket, in the directory of the sessions' temp dirs.
pub const SOCKET_NAME: &str = ".egress.sock";

/// The port commands connect to inside their network namespace.
pub const BRIDGE_PORT: u16 = 3128;

/// Largest request head read.
const MAX_HEAD: usize = 16 * 1024;

/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(15);

/// How long connecting to a destination may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Destinations remembered per call for its closing note.
const MAX_REMEMBERED: usize = 8;

/// The longest path a Unix socket can have.
const MAX_SOCKET_PATH: usize = 100;

/// The user name in a pass's proxy URL.
const PASS_USER: &str = "agentry";

/// The proxy of one tool runner.
pub struct Egress {
    guard: Guard,
    passes: Mutex<HashMap<String, Arc<Usage>>>,
    route: Result<ProxyRoute, NoNetwork>,
    /// Destinations holding a secret's value are refused; header rules
    /// are applied.
    secrets: std::sync::OnceLock<crate::secrets::Secrets>,
    /// TLS for requests sent on with a secret's header.
    tls: std::sync::OnceLock<tokio_rustls::TlsConnector>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("route", &self.route)
            .finish_non_exhaustive()
    }
}

/// What one call did through the proxy.
#[derive(Debug, Default)]
struct Usage {
    inner: Mutex<UsageLog>,
    /// Whether secrets' header rules apply to its requests.
    secret_headers: bool,
}

#[derive(Debug, Default)]
struct UsageLog {
    reached: Vec<(String, usize)>,
    refused: Vec<String>,
    refusals: usize,
    /// Secrets added to its requests as headers.
    secrets: Vec<String>,
}

impl Usage {
    fn reached(&self, target: &str) {
        let mut log = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, n)) = log.reached.iter_mut().find(|(t, _)| t == target) {
            *n += 1;
        } else if log.reached.len() < MAX_REMEMBERED {
            log.reached.push((target.to_string(), 1));
        }
    }

    fn released(&self, secrets: &[String]) {
        let mut log = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for name in secrets {
            if !log.secrets.contains(name) {
                log.secrets.push(name.clone());
            }
        }
    }

    fn refused(&self, why: &str) {
        let mut log = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        log.refusals += 1;
        if log.refused.len() < MAX_REMEMBERED && !log.refused.iter().any(|r| r == why) {
            log.refused.push(why.to_string());
        }
    }
}

/// Network for one call, valid until dropped.
#[derive(Debug)]
pub struct Pass {
    egress: Arc<Egress>,
    token: String,
    usage: Arc<Usage>,
    /// How the command reaches the proxy.
    pub route: ProxyRoute,
}

impl Pass {
    /// The variables that point HTTP clients at the proxy.
    pub fn environment(&self) -> Vec<(String, String)> {
        let url = format!(
            "http://{PASS_USER}:{}@127.0.0.1:{}",
            self.token,
            self.route.port()
        );
        let mut env = Vec::new();
        for name in ["http_proxy", "https_proxy", "all_proxy"] {
            env.push((name.to_string(), url.clone()));
            env.push((name.to_ascii_uppercase(), url.clone()));
        }
        env.push(("no_proxy".to_string(), String::new()));
        env.push(("NO_PROXY".to_string(), String::new()));
        env
    }

    /// The secrets the proxy added to this call's requests as headers.
    pub fn secrets_used(&self) -> Vec<String> {
        let log = self.usage.inner.lock().unwrap_or_else(|e| e.into_inner());
        log.secrets.clone()
    }

    /// A line for the call's output: where it went and what was refused;
    /// `None` when it used no network.
    pub fn note(&self) -> Option<String> {
        let log = self.usage.inner.lock().unwrap_or_else(|e| e.into_inner());
        if log.reached.is_empty() && log.refusals == 0 {
            return None;
        }
        let mut parts = Vec::new();
        if !log.reached.is_empty() {
            let list: Vec<String> = log
                .reached
                .iter()
                .map(|(t, n)| {
                    if *n > 1 {
                        format!("{t} ×{n}")
                    } else {
                        t.clone()
                    }
                })
                .collect();
            parts.push(format!("reached {}", list.join(", ")));
        }
        if log.refusals > 0 {
            parts.push(format!(
                "refused {} connection(s): {}",
                log.refusals,
                log.refused.join("; ")
            ));
        }
        Some(format!("[agentry network: {}]", parts.join("; ")))
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.egress
            .passes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.token);
    }
}

impl Egress {
    /// Holds the runner's secrets: destinations that hold a value (one
    /// smuggled out in a host name or a URL) are refused, and header rules
    /// are applied, over TLS trusting the system's roots and `extra_ca`.
    pub fn hold_secrets(
        &self,
        secrets: crate::secrets::Secrets,
        extra_ca: Option<&Path>,
    ) -> Result<(), crate::secrets::SecretError> {
        if secrets.has_header_rules() {
            let _ = self.tls.set(tls_connector(extra_ca)?);
        }
        let _ = self.secrets.set(secrets);
        Ok(())
    }

    /// Starts the proxy: on a Unix socket at `socket` when commands get
    /// namespaces (`bridge`), else on a loopback TCP port when Landlock can
    /// hold commands to it (`host_port_confined`). When neither holds,
    /// the proxy does not start and every grant of network fails with
    /// `why_not`.
    pub async fn start(
        allow_hosts: &[String],
        socket: &Path,
        bridge: bool,
        host_port_confined: bool,
        why_not: &str,
    ) -> Arc<Egress> {
        let guard = Guard::new(allow_hosts);
        let (route, listener) = if bridge {
            match bind_unix(socket) {
                Ok(listener) => (
                    Ok(ProxyRoute::Bridge {
                        socket: socket.to_path_buf(),
                        port: BRIDGE_PORT,
                    }),
                    Some(Listener::Unix(listener)),
                ),
                Err(e) => (Err(e), None),
            }
        } else if host_port_confined {
            match tokio::net::TcpListener::bind(("127.0.0.1", 0)).await {
                Ok(listener) => match listener.local_addr() {
                    Ok(addr) => (
                        Ok(ProxyRoute::Host { port: addr.port() }),
                        Some(Listener::Tcp(listener)),
                    ),
                    Err(e) => (
                        Err(NoNetwork(format!("the network proxy has no address: {e}"))),
                        None,
                    ),
                },
                Err(e) => (
                    Err(NoNetwork(format!(
                        "the network proxy cannot listen on loopback: {e}"
                    ))),
                    None,
                ),
            }
        } else {
            (Err(NoNetwork(why_not.to_string())), None)
        };
        let egress = Arc::new(Egress {
            guard,
            passes: Mutex::new(HashMap::new()),
            route,
            secrets: std::sync::OnceLock::new(),
            tls: std::sync::OnceLock::new(),
        });
        match (&egress.route, listener) {
            (Ok(route), Some(listener)) => {
                tracing::info!(?route, "network proxy ready for calls granted network");
                tokio::spawn(serve(Arc::downgrade(&egress), listener));
            }
            (Err(why), _) => {
                tracing::warn!("calls cannot be granted network: {why}");
            }
            (Ok(_), None) => {}
        }
        egress
    }

    /// Whether calls can be granted network, or why not.
    pub fn available(&self) -> Result<(), NoNetwork> {
        self.route.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    /// Network for one tool call (`secret_headers`: secrets' header rules
    /// apply to its requests) or one MCP server (they do not).
    pub fn grant(self: &Arc<Self>, secret_headers: bool) -> Result<Pass, NoNetwork> {
        let route = self.route.clone()?;
        let token = new_token().map_err(|e| format!("cannot make a network credential: {e}"))?;
        let usage = Arc::new(Usage {
            secret_headers,
            ..Usage::default()
        });
        self.passes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.clone(), usage.clone());
        Ok(Pass {
            egress: self.clone(),
            token,
            usage,
            route,
        })
    }

    fn usage_of(&self, token: &str) -> Option<Arc<Usage>> {
        self.passes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()
    }
}

/// TLS trusting the system's roots and the certificates in `extra_ca`.
fn tls_connector(
    extra_ca: Option<&Path>,
) -> Result<tokio_rustls::TlsConnector, crate::secrets::SecretError> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let fail =
        |why: String| crate::secrets::SecretError::new(format!("secrets' header rules: {why}"));
    let mut roots = rustls::RootCertStore::empty();
    let (system, _) =
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(path) = extra_ca {
        let bad = |e: &dyn std::fmt::Display| {
            fail(format!(
                "tool_runner.sandbox.network_ca_file {}: {e}",
                path.display()
            ))
        };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| bad(&e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(&e))?;
        if certs.is_empty() {
            return Err(bad(&"no certificate in it"));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| bad(&e))?;
        }
    } else if system == 0 {
        return Err(fail(
            "this machine trusts no certificate authority (install ca-certificates, or name one \
             in tool_runner.sandbox.network_ca_file)"
                .into(),
        ));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

fn new_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 24];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

enum Listener {
    Unix(tokio::net::UnixListener),
    Tcp(tokio::net::TcpListener),
}

fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, NoNetwork> {
    use std::os::unix::fs::PermissionsExt;
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(NoNetwork(format!(
            "the network proxy's socket path {} is too long for a Unix socket; use a shorter \
             workspace root",
            path.display()
        )));
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(NoNetwork(format!(
                "cannot replace the network proxy's socket {}: {e}",
                path.display()
            )));
        }
    }
    let listener = tokio::net::UnixListener::bind(path)
        .map_err(|e| format!("the network proxy cannot listen on {}: {e}", path.display()))?;
    // Only the runner's user (and the helper, which runs as it) connects.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot restrict {}: {e}", path.display()))?;
    Ok(listener)
}

async fn serve(egress: std::sync::Weak<Egress>, listener: Listener) {
    loop {
        let accepted: std::io::Result<Box<dyn Stream>> = match &listener {
            Listener::Unix(l) => l
                .accept()
                .await
                .map(|(s, _)| Box::new(s) as Box<dyn Stream>),
            Listener::Tcp(l) => l
                .accept()
                .await
                .map(|(s, _)| Box::new(s) as Box<dyn Stream>),
        };
        let Some(egress) = egress.upgrade() else {
            return;
        };
        match accepted {
            Ok(client) => {
                tokio::spawn(async move {
                    if let Err(e) = handle(&egress, client).await {
                        tracing::debug!("network proxy connection ended: {e}");
                    }
                });
            }
            Err(e) => {
                tracing::warn!("network proxy cannot accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A parsed request head.
struct Head {
    method: String,
    target: String,
    version: String,
    headers: Vec<(String, String)>,
    /// Bytes after the head, already read.
    rest: Vec<u8>,
}

async fn read_head(client: &mut Box<dyn Stream>) -> Result<Head, (u16, String)> {
    let mut buffer = Vec::with_capacity(1024);
    let end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        if buffer.len() > MAX_HEAD {
            return Err((431, "the request head is larger than 16 KiB".into()));
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(HEAD_TIMEOUT, client.read(&mut chunk))
            .await
            .map_err(|_| (408, "the request head did not arrive in time".to_string()))?
            .map_err(|e| (400, format!("cannot read the request: {e}")))?;
        if n == 0 {
            return Err((400, "the connection closed before a request".into()));
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let text = std::str::from_utf8(&buffer[..end])
        .map_err(|_| (400, "the request head is not UTF-8".to_string()))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err((400, format!("not an HTTP request line: {line:?}")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err((505, format!("{version} is not spoken here; use HTTP/1.1")));
    }
    let mut headers = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err((400, format!("not a header line: {line:?}")));
        };
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    Ok(Head {
        method: method.to_string(),
        target: target.to_string(),
        version: version.to_string(),
        headers,
        rest: buffer[end + 4..].to_vec(),
    })
}

async fn respond(client: &mut Box<dyn Stream>, status: u16, message: &str, extra: &str) {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        405 => "Method Not Allowed",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    };
    let body = format!("agentry network proxy: {message}\n");
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
        body.len()
    );
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

/// The credential of a `Proxy-Authorization: Basic …` header.
fn credential(headers: &[(String, String)]) -> Option<String> {
    let value = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("proxy-authorization"))
        .map(|(_, v)| v.as_str())?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = decode_base64(encoded.trim())?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, token) = text.split_once(':')?;
    (user == PASS_USER).then(|| token.to_string())
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c)? << (18 - 6 * i);
        }
        let produced = chunk.len() - 1;
        for i in 0..produced {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

/// Splits `host:port` (IPv6 in brackets), with `default_port` when none.
fn host_port(authority: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port?,
            None => return None,
        };
        (host.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), port.parse().ok()?),
            None => (authority.to_string(), default_port?),
        }
    };
    (!host.is_empty() && port != 0).then_some((host, port))
}

async fn handle(egress: &Egress, mut client: Box<dyn Stream>) -> std::io::Result<()> {
    let head = match read_head(&mut client).await {
        Ok(head) => head,
        Err((status, message)) => {
            respond(&mut client, status, &message, "").await;
            return Ok(());
        }
    };
    let Some(usage) = credential(&head.headers).and_then(|t| egress.usage_of(&t)) else {
        respond(
            &mut client,
            407,
            "this proxy serves only tool calls granted network, with the credential in their \
             proxy URL",
            "Proxy-Authenticate: Basic realm=\"agentry\"\r\n",
        )
        .await;
        return Ok(());
    };
    let tunnel = head.method.eq_ignore_ascii_case("CONNECT");
    let (host, port, plain_url) = if tunnel {
        let Some((host, port)) = host_port(&head.target, None) else {
            respond(
                &mut client,
                400,
                &format!("CONNECT needs host:port, not {:?}", head.target),
                "",
            )
            .await;
            return Ok(());
        };
        (host, port, None)
    } else {
        match url::Url::parse(&head.target) {
            Ok(url) if url.scheme() == "http" => {
                let Some(host) = url.host_str() else {
                    respond(&mut client, 400, "the URL has no host", "").await;
                    return Ok(());
                };
                let host = host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string();
                let port = url.port_or_known_default().unwrap_or(80);
                (host, port, Some(url))
            }
            Ok(url) => {
                respond(
                    &mut client,
                    400,
                    &format!(
                        "only http:// URLs are forwarded as requests; {} goes through CONNECT",
                        url.scheme()
                    ),
                    "",
                )
                .await;
                return Ok(());
            }
            Err(_) => {
                respond(
                    &mut client,
                    400,
                    &format!(
                        "{} {} is not a proxy request (CONNECT host:port, or an absolute http:// \
                         URL)",
                        head.method, head.target
                    ),
                    "",
                )
                .await;
                return Ok(());
            }
        }
    };
    if let Some(secrets) = egress.secrets.get()
        && (secrets.holds_secret(&head.target) || secrets.holds_secret(&host))
    {
        let why = "the destination holds a secret's value";
        tracing::warn!(target = %secrets.redact(&head.target).0, "network proxy refused a destination: {why}");
        usage.refused(why);
        respond(&mut client, 403, why, "").await;
        return Ok(());
    }
    // A plain request for a host a secret's header rule names goes on over
    // HTTPS with the header.
    let release = match (&plain_url, egress.secrets.get()) {
        (Some(_), Some(secrets)) if usage.secret_headers => secrets.headers_for(&host, port),
        _ => None,
    };
    let port = release.as_ref().map_or(port, |r| r.port);
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let addrs = match egress.guard.resolve_checked(&host, port).await {
        Ok(addrs) => addrs,
        Err(FetchError::Blocked(why)) => {
            let why = format!("{why} (port {port})");
            tracing::info!(target, "network proxy refused a destination: {why}");
            usage.refused(&why);
            respond(
                &mut client,
                403,
                &format!(
                    "{why}; commands reach only public addresses unless the host is in \
                     tool_runner.sandbox.network_allow_hosts"
                ),
                "",
            )
            .await;
            return Ok(());
        }
        Err(other) => {
            usage.refused(&other.to_string());
            respond(&mut client, 502, &other.to_string(), "").await;
            return Ok(());
        }
    };
    let Some(tcp) = connect_any(&addrs).await else {
        let why = format!("cannot connect to {target}");
        usage.refused(&why);
        respond(&mut client, 502, &why, "").await;
        return Ok(());
    };
    let mut upstream: Box<dyn Stream> = match (&release, egress.tls.get()) {
        (None, _) => Box::new(tcp),
        (Some(release), Some(tls)) => match open_tls(tls, &host, tcp).await {
            Ok(stream) => {
                usage.released(&release.secrets);
                tracing::info!(
                    target,
                    secrets = ?release.secrets,
                    "network proxy added secrets' headers to a request"
                );
                Box::new(stream)
            }
            Err(why) => {
                let why = format!("cannot open HTTPS to {target}: {why}");
                usage.refused(&why);
                respond(&mut client, 502, &why, "").await;
                return Ok(());
            }
        },
        (Some(_), None) => {
            let why = "secrets' header rules have no TLS set up";
            usage.refused(why);
            respond(&mut client, 502, why, "").await;
            return Ok(());
        }
    };
    let reached = match &release {
        Some(r) => format!("https://{target} (with {})", r.secrets.join(", ")),
        None => target.clone(),
    };
    usage.reached(&reached);
    tracing::debug!(target, "network proxy connected");
    match &plain_url {
        None => {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await?;
        }
        Some(url) => {
            let added = release.as_ref().map_or(&[][..], |r| r.headers.as_slice());
            upstream
                .write_all(origin_form(&head, url, added).as_bytes())
                .await?;
        }
    }
    if !head.rest.is_empty() {
        upstream.write_all(&head.rest).await?;
    }
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// TLS to `host` over `tcp`, its certificate checked for that name.
async fn open_tls(
    tls: &tokio_rustls::TlsConnector,
    host: &str,
    tcp: tokio::net::TcpStream,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use std::io::{Error, ErrorKind};
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| Error::new(ErrorKind::InvalidInput, e))?;
    tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(name, tcp))
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::TimedOut,
                "the TLS handshake did not finish in time",
            )
        })?
}

async fn connect_any(addrs: &[SocketAddr]) -> Option<tokio::net::TcpStream> {
    for addr in addrs {
        if let Ok(Ok(stream)) =
            tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await
        {
            return Some(stream);
        }
    }
    None
}

/// The request head as the origin server gets it: origin-form target, no
/// proxy or hop-by-hop headers, `added` in place of the client's headers
/// of those names, and one request per connection.
fn origin_form(head: &Head, url: &url::Url, added: &[(String, String)]) -> String {
    let mut path = url.path().to_string();
    if let Some(query) = url.query() {
        path.push('?');
        path.push_str(query);
    }
    let mut text = format!("{} {path} {}\r\n", head.method, head.version);
    let mut has_host = false;
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("proxy-")
            || lower == "connection"
            || lower == "keep-alive"
            || added.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
        {
            continue;
        }
        has_host |= lower == "host";
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    if !has_host {
        text.push_str(&format!("Host: {}\r\n", url.authority()));
    }
    for (name, value) in added {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("Connection: close\r\n\r\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_decode() {
        let header = |v: &str| vec![("Proxy-Authorization".to_string(), v.to_string())];
        // "agentry:abc123"
        assert_eq!(
            credential(&header("Basic YWdlbnRyeTphYmMxMjM=")).as_deref(),
            Some("abc123")
        );
        // "someone:abc123": another user name.
        assert_eq!(credential(&header("Basic c29tZW9uZTphYmMxMjM=")), None);
        assert_eq!(credential(&header("Bearer abc")), None);
        assert_eq!(credential(&header("Basic !!!")), None);
        assert_eq!(credential(&[]), None);
    }

    #[test]
    fn authorities_split() {
        assert_eq!(
            host_port("example.com:443", None),
            Some(("example.com".into(), 443))
        );
        assert_eq!(host_port("[::1]:80", None), Some(("::1".into(), 80)));
        assert_eq!(
            host_port("example.com", Some(80)),
            Some(("example.com".into(), 80))
        );
        assert_eq!(host_port("example.com", None), None);
        assert_eq!(host_port(":443", None), None);
        assert_eq!(host_port("example.com:0", None), None);
        assert_eq!(host_port("example.com:http", None), None);
        assert_eq!(host_port("[::1", None), None);
    }
}
