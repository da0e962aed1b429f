//! Who may call the services.
//!
//! Every RPC except `grpc.health.v1` needs a bearer token in the
//! `authorization` metadata. There are two tokens, each a random secret in
//! a file of mode 0600 that the services create at first start:
//!
//! - the **client token** (`<data_dir>/auth/client.token`), for people and
//!   their tools: the CLI reads it, `agentry token` prints it;
//! - the **service token** (`<data_dir>/auth/service.token`), which the
//!   services send to each other and which never leaves them.
//!
//! A few methods accept only the service token ([`SERVICE_ONLY`]): writing
//! and deleting session logs, running a tool without the orchestrator's
//! policy, and taking due reminders. TLS with client certificates can be
//! added for services on several hosts ([`Auth::server_tls`],
//! [`Auth::endpoint`]).

use crate::config::{AuthMode, Config};
use crate::telemetry::{Propagate, TracedChannel};
use std::future::Future;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig,
};

/// What a credential may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// A person or their tools: everything but [`SERVICE_ONLY`].
    Client,
    /// One of Agentry's services: everything.
    Service,
}

/// Methods that accept only the service token.
pub const SERVICE_ONLY: &[&str] = &[
    "/agentry.sessions.v1.SessionStore/CreateSession",
    "/agentry.sessions.v1.SessionStore/DeleteSession",
    "/agentry.sessions.v1.SessionStore/ForkSession",
    "/agentry.sessions.v1.SessionStore/RenameSession",
    "/agentry.sessions.v1.SessionStore/Append",
    "/agentry.sessions.v1.SessionStore/Heartbeat",
    "/agentry.sessions.v1.SessionStore/AcquireSession",
    "/agentry.sessions.v1.SessionStore/ReleaseSession",
    "/agentry.tools.v1.ToolRunner/Execute",
    "/agentry.tools.v1.ToolRunner/McpSubscribe",
    "/agentry.tools.v1.ToolRunner/McpReadResource",
    "/agentry.tools.v1.ToolRunner/McpWatch",
    "/agentry.tools.v1.ToolRunner/Snapshot",
    "/agentry.tools.v1.ToolRunner/RestoreSnapshot",
    "/agentry.tools.v1.ToolRunner/PruneSnapshots",
    "/agentry.tools.v1.ToolRunner/Preview",
    "/agentry.tools.v1.ToolRunner/RunHook",
    "/agentry.tools.v1.ToolRunner/OpenProject",
    "/agentry.tools.v1.ToolRunner/ReadInstructions",
    "/agentry.tools.v1.ToolRunner/ForgetSession",
    "/agentry.tools.v1.ToolRunner/ReadImage",
    "/agentry.scheduler.v1.Scheduler/StreamDue",
];

/// The role a call to `path` (`/package.Service/Method`) needs; `None` for
/// calls open to anyone (health checks).
pub fn required_role(path: &str) -> Option<Role> {
    if path.starts_with("/grpc.health.v1.Health/") {
        None
    } else if SERVICE_ONLY.contains(&path) {
        Some(Role::Service)
    } else {
        Some(Role::Client)
    }
}

/// A bearer token. Its `Debug` form never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Arc<str>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A new random token (256 bits from the kernel's generator), prefixed
    /// by its role so a leaked one is easy to recognise.
    pub fn generate(role: Role) -> std::io::Result<Token> {
        let mut bytes = [0u8; 32];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
        let prefix = match role {
            Role::Client => "agentry_client_",
            Role::Service => "agentry_service_",
        };
        let mut text = String::with_capacity(prefix.len() + 64);
        text.push_str(prefix);
        for b in bytes {
            text.push_str(&format!("{b:02x}"));
        }
        Ok(Token(text.into()))
    }

    /// A token given as text (surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<Token, String> {
        let text = text.trim();
        if text.len() < 16 {
            return Err("a token has at least 16 characters".into());
        }
        if text.len() > 1024 {
            return Err("a token has at most 1024 characters".into());
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("a token is printable ASCII without spaces".into());
        }
        Ok(Token(text.into()))
    }

    /// The secret itself, for `agentry token`.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, in time independent of where
    /// they differ.
    fn matches(&self, presented: &[u8]) -> bool {
        let mine = self.0.as_bytes();
        if mine.len() != presented.len() {
            return false;
        }
        mine.iter()
            .zip(presented)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    fn bearer(&self) -> Option<AsciiMetadataValue> {
        let mut value = AsciiMetadataValue::try_from(format!("Bearer {}", self.0)).ok()?;
        value.set_sensitive(true);
        Some(value)
    }
}

/// Credentials could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A token file does not exist.
    #[error("no token in {path}: it is created when the services first start (`agentry up`)")]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// A token file could not be read or written.
    #[error("cannot use the token file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A TLS file could not be used.
    #[error("cannot use {what} {path}: {reason}")]
    Tls {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A service may not listen on this address without authentication.
    #[error(
        "refusing to listen on {addr} without authentication: anyone who can reach it could \
         read every session and run commands. Keep auth.mode = \"token\" (AGENTRY_AUTH, the \
         default), configure TLS with client certificates (auth.tls), or listen on 127.0.0.1"
    )]
    OpenListen {
        /// The address.
        addr: std::net::SocketAddr,
    },
    /// A URL is unusable.
    #[error("invalid URL {url:?}: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
}

/// Reads the token in `path`, refusing a file other users can read.
pub fn read_token(path: &Path) -> Result<Token, AuthError> {
    let file_error = |reason: String| AuthError::File {
        path: path.to_path_buf(),
        reason,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(AuthError::Missing {
                path: path.to_path_buf(),
            });
        }
        Err(e) => return Err(file_error(e.to_string())),
    };
    let mode = std::fs::metadata(path)
        .map_err(|e| file_error(e.to_string()))?
        .mode();
    if mode & 0o077 != 0 {
        return Err(file_error(format!(
            "other users can read it (mode {:o}); run `chmod 600 {}`",
            mode & 0o777,
            path.display()
        )));
    }
    Token::parse(&text).map_err(file_error)
}

/// Reads the token in `path`, creating it first (mode 0600, its directory
/// 0700) when it does not exist. Several processes starting at once end
/// up with the same token: the file appears whole, by a hard link, once.
pub fn load_or_create(path: &Path, role: Role) -> Result<Token, AuthError> {
    match read_token(path) {
        Err(AuthError::Missing { .. }) => {}
        found => return found,
    }
    let file_error = |reason: String| AuthError::File {
        path: path.to_path_buf(),
        reason,
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // The token's own directory is private; directories above it (the
    // data dir) get their usual modes from whoever prepares them.
    if let Some(above) = dir.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(above)
            .map_err(|e| file_error(format!("cannot create {}: {e}", above.display())))?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| file_error(format!("cannot create {}: {e}", dir.display())))?;
    let token = Token::generate(role).map_err(|e| file_error(e.to_string()))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    static ATTEMPT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let attempt = ATTEMPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".token.{}.{nanos}.{attempt}.tmp",
        std::process::id()
    ));
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(token.secret().as_bytes())?;
        file.write_all(b"\n")?;
        file.sync_all()?;
        // A service started as root (a container's tool runner) leaves the
        // file to whoever owns the directory, so the others can read it.
        let owner = std::fs::metadata(dir)?;
        if crate::config::running_as_root() && owner.uid() != 0 {
            std::os::unix::fs::chown(&tmp, Some(owner.uid()), Some(owner.gid()))?;
        }
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => Ok(()),
            // Another process created it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    written.map_err(|e| file_error(e.to_string()))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    read_token(path)
}

/// PEM material for TLS.
struct TlsFiles {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Vec<u8>,
}

struct Inner {
    mode: AuthMode,
    client: Option<Token>,
    service: Option<Token>,
    tls: Option<TlsFiles>,
    /// Why a client has no token, for error messages.
    missing: Option<String>,
}

/// The credentials of one process: what its servers accept and what its
/// clients send. Cheap to clone.
#[derive(Clone)]
pub struct Auth(Arc<Inner>);

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("mode", &self.0.mode)
            .field("client_token", &self.0.client.is_some())
            .field("service_token", &self.0.service.is_some())
            .field("tls", &self.0.tls.is_some())
            .finish()
    }
}

impl Auth {
    /// No credential asked for or sent (loopback only).
    pub fn off() -> Auth {
        Auth(Arc::new(Inner {
            mode: AuthMode::Off,
            client: None,
            service: None,
            tls: None,
            missing: None,
        }))
    }

    /// Servers accept these tokens; clients send the service token.
    pub fn with_tokens(client: Token, service: Token) -> Auth {
        Auth(Arc::new(Inner {
            mode: AuthMode::Token,
            client: Some(client),
            service: Some(service),
            tls: None,
            missing: None,
        }))
    }

    /// A client that sends `token` (or nothing), for tools and tests.
    pub fn client_with(token: Option<Token>) -> Auth {
        Auth(Arc::new(Inner {
            mode: AuthMode::Token,
            client: token,
            service: None,
            tls: None,
            missing: None,
        }))
    }

    /// The credentials of the services: both tokens, created at first
    /// start, and the TLS files when configured.
    pub fn for_services(config: &Config) -> Result<Auth, AuthError> {
        let tls = load_tls(config)?;
        let (client, service) = match config.auth.mode {
            AuthMode::Off => (None, None),
            AuthMode::Token => (
                Some(load_or_create(&config.client_token_file(), Role::Client)?),
                Some(load_or_create(&config.service_token_file(), Role::Service)?),
            ),
        };
        Ok(Auth(Arc::new(Inner {
            mode: config.auth.mode,
            client,
            service,
            tls,
            missing: None,
        })))
    }

    /// The credentials of a client (the CLI): the configured token, else
    /// the client token file when it can be read. A client without a token
    /// still works against services with `auth.mode = "off"`; against
    /// others, [`Auth::missing_token`] says why it has none.
    pub fn for_client(config: &Config) -> Result<Auth, AuthError> {
        let tls = load_tls(config)?;
        let (client, missing) = if config.auth.mode == AuthMode::Off {
            (None, None)
        } else if !config.auth.token.is_empty() {
            let token = Token::parse(&config.auth.token).map_err(|reason| AuthError::File {
                path: "AGENTRY_TOKEN".into(),
                reason,
            })?;
            (Some(token), None)
        } else {
            match read_token(&config.client_token_file()) {
                Ok(token) => (Some(token), None),
                Err(e) => (None, Some(e.to_string())),
            }
        };
        Ok(Auth(Arc::new(Inner {
            mode: config.auth.mode,
            client,
            service: None,
            tls,
            missing,
        })))
    }

    /// The client token, if this process has it.
    pub fn client_token(&self) -> Option<&Token> {
        self.0.client.as_ref()
    }

    /// The service token, if this process has it.
    pub fn service_token(&self) -> Option<&Token> {
        self.0.service.as_ref()
    }

    /// Why a client has no token, if it has none.
    pub fn missing_token(&self) -> Option<&str> {
        self.0.missing.as_deref()
    }

    /// Refuses to serve on a non-loopback address with neither tokens nor
    /// client certificates.
    pub fn check_listen(&self, addr: std::net::SocketAddr) -> Result<(), AuthError> {
        if self.0.mode == AuthMode::Off && self.0.tls.is_none() && !addr.ip().is_loopback() {
            return Err(AuthError::OpenListen { addr });
        }
        Ok(())
    }

    /// The TLS settings of a server, when TLS is configured: its
    /// certificate, and client certificates required, signed by the CA.
    pub fn server_tls(&self) -> Option<ServerTlsConfig> {
        let tls = self.0.tls.as_ref()?;
        Some(
            ServerTlsConfig::new()
                .identity(Identity::from_pem(&tls.cert, &tls.key))
                .client_ca_root(Certificate::from_pem(&tls.ca)),
        )
    }

    /// An endpoint for `url` with the settings every Agentry connection
    /// uses (TLS when configured, no Nagle delay, keep-alive that notices
    /// a vanished peer, a connect timeout).
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, AuthError> {
        let url_error = |reason: String| AuthError::Url {
            url: url.to_string(),
            reason,
        };
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| url_error(e.to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        if let Some(tls) = &self.0.tls {
            if !url.starts_with("https://") {
                return Err(url_error(
                    "TLS is configured (auth.tls), so service URLs use https://".into(),
                ));
            }
            endpoint = endpoint
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(Certificate::from_pem(&tls.ca))
                        .identity(Identity::from_pem(&tls.cert, &tls.key)),
                )
                .map_err(|e| url_error(e.to_string()))?;
        }
        Ok(endpoint)
    }

    /// `channel` sending this process's strongest credential (the service
    /// token in a service, the client token in a client) and trace context.
    pub fn wrap(&self, channel: Channel) -> TracedChannel {
        let token = self.0.service.as_ref().or(self.0.client.as_ref());
        tonic::service::interceptor::InterceptedService::new(
            channel,
            Propagate::with_bearer(token.and_then(Token::bearer)),
        )
    }

    /// A channel to `url` that connects on first use and reconnects, so
    /// services may start in any order.
    pub fn lazy_channel(&self, url: &str) -> Result<TracedChannel, AuthError> {
        Ok(self.wrap(self.endpoint(url)?.connect_lazy()))
    }

    /// The server layer that checks every call's credential.
    pub fn layer(&self) -> RequireCredentialLayer {
        RequireCredentialLayer { auth: self.clone() }
    }

    /// The role of a call to `path` with `authorization` metadata, or the
    /// status it is refused with.
    pub fn check(&self, path: &str, authorization: Option<&[u8]>) -> Result<Role, tonic::Status> {
        let Some(required) = required_role(path) else {
            return Ok(Role::Client);
        };
        if self.0.mode == AuthMode::Off {
            return Ok(Role::Service);
        }
        let Some(value) = authorization else {
            return Err(tonic::Status::unauthenticated(
                "this call needs a credential: send `authorization: Bearer <token>` metadata \
                 (`agentry token` prints the client token)",
            ));
        };
        let Some(presented) = value
            .strip_prefix(b"Bearer ")
            .or_else(|| value.strip_prefix(b"bearer "))
        else {
            return Err(tonic::Status::unauthenticated(
                "the authorization metadata must be `Bearer <token>`",
            ));
        };
        let role = if self
            .0
            .service
            .as_ref()
            .is_some_and(|t| t.matches(presented))
        {
            Role::Service
        } else if self.0.client.as_ref().is_some_and(|t| t.matches(presented)) {
            Role::Client
        } else {
            return Err(tonic::Status::unauthenticated(
                "the token is not valid here (`agentry token` prints the current client token)",
            ));
        };
        if role < required {
            return Err(tonic::Status::permission_denied(format!(
                "{} is only for Agentry's own services; a client token cannot call it",
                path.trim_start_matches('/')
            )));
        }
        Ok(role)
    }
}

fn load_tls(config: &Config) -> Result<Option<TlsFiles>, AuthError> {
    let tls = &config.auth.tls;
    if !tls.enabled() {
        return Ok(None);
    }
    let read = |what: &'static str, path: &str| {
        std::fs::read(path).map_err(|e| AuthError::Tls {
            what,
            path: path.to_string(),
            reason: e.to_string(),
        })
    };
    Ok(Some(TlsFiles {
        cert: read("auth.tls.cert", &tls.cert)?,
        key: read("auth.tls.key", &tls.key)?,
        ca: read("auth.tls.ca", &tls.ca)?,
    }))
}

/// Checks the credential of every call before it reaches a service.
#[derive(Clone)]
pub struct RequireCredentialLayer {
    auth: Auth,
}

impl<S> tower_layer::Layer<S> for RequireCredentialLayer {
    type Service = RequireCredential<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequireCredential {
            inner,
            auth: self.auth.clone(),
        }
    }
}

/// The service [`RequireCredentialLayer`] wraps around a server's routes.
#[derive(Clone)]
pub struct RequireCredential<S> {
    inner: S,
    auth: Auth,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower_service::Service<http::Request<B>> for RequireCredential<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let verdict = self.auth.check(
            request.uri().path(),
            request
                .headers()
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
        );
        match verdict {
            Ok(_) => Box::pin(self.inner.call(request)),
            Err(status) => {
                tracing::warn!(
                    method = request.uri().path(),
                    code = ?status.code(),
                    reason = status.message(),
                    "call refused"
                );
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tokens() -> (Token, Token, Auth) {
        let client = Token::generate(Role::Client).unwrap();
        let service = Token::generate(Role::Service).unwrap();
        let auth = Auth::with_tokens(client.clone(), service.clone());
        (client, service, auth)
    }

    fn bearer(t: &Token) -> Vec<u8> {
        format!("Bearer {}", t.secret()).into_bytes()
    }

    #[test]
    fn calls_without_or_with_a_wrong_credential_are_unauthenticated() {
        let (_, _, auth) = tokens();
        let path = "/agentry.orchestrator.v1.Orchestrator/ListSessions";
        let missing = auth.check(path, None).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
        assert!(
            missing.message().contains("Bearer"),
            "{}",
            missing.message()
        );
        let wrong = Token::generate(Role::Client).unwrap();
        let e = auth.check(path, Some(&bearer(&wrong))).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = auth.check(path, Some(b"Basic dXNlcjpwYXNz")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        // One line each.
        for status in [missing, e] {
            assert!(!status.message().contains('\n'));
        }
    }

    #[test]
    fn roles_decide_who_may_write_logs_and_run_tools() {
        let (client, service, auth) = tokens();
        let read = "/agentry.sessions.v1.SessionStore/Read";
        let append = "/agentry.sessions.v1.SessionStore/Append";
        let execute = "/agentry.tools.v1.ToolRunner/Execute";
        assert_eq!(
            auth.check(read, Some(&bearer(&client))).unwrap(),
            Role::Client
        );
        for path in [append, execute] {
            let e = auth.check(path, Some(&bearer(&client))).unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{path}");
            assert_eq!(
                auth.check(path, Some(&bearer(&service))).unwrap(),
                Role::Service
            );
        }
    }

    #[test]
    fn health_checks_need_no_credential_and_off_needs_none_at_all() {
        let (_, _, auth) = tokens();
        assert!(auth.check("/grpc.health.v1.Health/Check", None).is_ok());
        assert!(
            auth.check(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                None
            )
            .is_err()
        );
        let off = Auth::off();
        assert!(
            off.check("/agentry.tools.v1.ToolRunner/Execute", None)
                .is_ok()
        );
    }

    #[test]
    fn open_listening_is_refused_off_loopback() {
        let off = Auth::off();
        assert!(off.check_listen("127.0.0.1:1".parse().unwrap()).is_ok());
        assert!(off.check_listen("[::1]:1".parse().unwrap()).is_ok());
        let e = off
            .check_listen("0.0.0.0:7741".parse().unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("auth.mode"), "{e}");
        let (_, _, auth) = tokens();
        assert!(auth.check_listen("0.0.0.0:7741".parse().unwrap()).is_ok());
    }

    #[test]
    fn tokens_are_created_once_private_and_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("data/auth/client.token");
        let first = load_or_create(&path, Role::Client).unwrap();
        assert!(first.secret().starts_with("agentry_client_"));
        assert_eq!(first.secret().len(), "agentry_client_".len() + 64);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert_eq!(load_or_create(&path, Role::Client).unwrap(), first);
        assert_eq!(read_token(&path).unwrap(), first);
        // No temporary files left behind.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("client.token")]);
        // A file others can read is refused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_token(&path).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
    }

    #[test]
    fn processes_starting_together_agree_on_one_token() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("auth/service.token");
        let found: Vec<Token> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| load_or_create(&path, Role::Service).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(found.iter().all(|t| *t == found[0]));
    }

    #[test]
    fn token_text_is_checked_and_never_printed_by_debug() {
        assert!(Token::parse("short").is_err());
        assert!(Token::parse("has a space inside it").is_err());
        let t = Token::parse("  0123456789abcdef0123\n").unwrap();
        assert_eq!(t.secret(), "0123456789abcdef0123");
        assert!(!format!("{t:?}").contains("0123"));
        let (_, _, auth) = tokens();
        assert!(!format!("{auth:?}").contains("agentry_"));
    }
}
