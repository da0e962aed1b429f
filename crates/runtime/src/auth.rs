//! Who may call the services.
//!
//! Every RPC except `grpc.health.v1` needs a bearer token in the
//! `authorization` metadata, and each needs a role ([`crate::access`]).
//! The tokens:
//!
//! - the **client token** (`<data_dir>/auth/client.token`), created at
//!   first start: the person `admin` (the CLI reads it, `agentry token`
//!   prints it);
//! - one token per **person** (`agentry users add NAME --role ROLE`), kept
//!   as a hash in the people file ([`crate::people`]), with the person's
//!   role;
//! - the **service token** (`<data_dir>/auth/service.token`), which the
//!   services send to each other and which never leaves them. A service
//!   acting for a person (the web gateway, an orchestrator forwarding a
//!   call to the replica that drives the session) names them in
//!   [`ON_BEHALF_OF`]; the call then has that person's role.
//!
//! The check puts the caller, a [`Principal`], in the request's
//! extensions, where a service finds who asked. TLS with client
//! certificates can be added for services on several hosts
//! ([`Auth::server_tls`], [`Auth::endpoint`]).

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

/// What a credential may do; each role may also do everything the roles
/// before it may.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads sessions, approvals, tools and reminders.
    Viewer,
    /// Also chats, cancels, rewinds, forks and sets reminders.
    Operator,
    /// Also answers approval requests.
    Approver,
    /// Also deletes sessions and prunes snapshots (the client token).
    Admin,
    /// One of Agentry's services: everything.
    Service,
}

impl Role {
    /// The roles a person can have, from the least allowed.
    pub const FOR_PEOPLE: [Role; 4] = [Role::Viewer, Role::Operator, Role::Approver, Role::Admin];

    /// Its name, as configured and shown.
    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Approver => "approver",
            Role::Admin => "admin",
            Role::Service => "service",
        }
    }

    /// The person's role named `text`.
    pub fn parse(text: &str) -> Result<Role, String> {
        Role::FOR_PEOPLE
            .into_iter()
            .find(|r| r.name() == text.trim())
            .ok_or_else(|| {
                format!("no role {text:?}: the roles are viewer, operator, approver and admin")
            })
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

pub use crate::access::{SERVICE_ONLY, required_role};

/// The metadata in which a service acting for a person names them (with
/// the service token only).
pub const ON_BEHALF_OF: &str = "x-agentry-person";

/// The name calls of the services themselves are recorded under.
pub const SERVICE_PERSON: &str = "agentry";

/// Who made a call: a person, or one of the services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The person's name ([`crate::people::ADMIN`] for the client token,
    /// [`SERVICE_PERSON`] for a service acting for nobody, `local` when
    /// credentials are off).
    pub name: String,
    /// What they may do.
    pub role: Role,
}

impl Principal {
    /// A service acting for nobody.
    pub fn service() -> Principal {
        Principal {
            name: SERVICE_PERSON.to_string(),
            role: Role::Service,
        }
    }

    /// Who asked, as the credential check recorded it in `extensions`;
    /// `None` for a call made in-process (not through a server).
    pub fn of(extensions: &http::Extensions) -> Option<&Principal> {
        extensions.get::<Principal>()
    }

    /// Refuses, naming the person and the role needed, unless they have
    /// `needed`; `what` says what they tried.
    pub fn require(&self, needed: Role, what: &str) -> Result<(), tonic::Status> {
        if self.role >= needed {
            return Ok(());
        }
        Err(crate::reasons::status(
            tonic::Code::PermissionDenied,
            crate::reasons::Reason::RoleTooLow,
            format!(
                "{} is {} {}; {what} needs {} (an admin can change it: `agentry users remove {}` \
                 then `agentry users add {} --role {}`)",
                self.name,
                article(self.role),
                self.role,
                needed,
                self.name,
                self.name,
                needed
            ),
        ))
    }
}

fn article(role: Role) -> &'static str {
    match role {
        Role::Operator | Role::Approver | Role::Admin => "an",
        Role::Viewer | Role::Service => "a",
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

/// Whose a token is, which its prefix shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// The client token (`agentry_client_…`).
    Client,
    /// The service token (`agentry_service_…`).
    Service,
    /// A person's (`agentry_user_…`).
    Person,
    /// A key a service signs with, never sent (`agentry_key_…`).
    Signing,
}

impl Token {
    /// A new random token (256 bits from the kernel's generator), prefixed
    /// by its kind so a leaked one is easy to recognise.
    pub fn generate(kind: TokenKind) -> std::io::Result<Token> {
        let mut bytes = [0u8; 32];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
        let prefix = match kind {
            TokenKind::Client => "agentry_client_",
            TokenKind::Service => "agentry_service_",
            TokenKind::Person => "agentry_user_",
            TokenKind::Signing => "agentry_key_",
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
        crate::people::constant_time_eq(self.0.as_bytes(), presented)
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
    /// The people file cannot be used.
    #[error(transparent)]
    People(#[from] crate::people::PeopleError),
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
    match read_private(path).map_err(file_error)? {
        Some(text) => Token::parse(&text).map_err(file_error),
        None => Err(AuthError::Missing {
            path: path.to_path_buf(),
        }),
    }
}

/// The directory of the private file `path`, made (mode 0700) when it does
/// not exist; directories above it (the data dir) get their usual modes.
pub(crate) fn private_dir(path: &Path) -> Result<&Path, String> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Some(above) = dir.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(above)
            .map_err(|e| format!("cannot create {}: {e}", above.display()))?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Writes `bytes` to the new file `file` in `dir` (mode 0600, synced). A
/// process running as root (a container's service, `agentry users` run
/// there) leaves it to whoever owns the directory, so the services can
/// read it.
pub(crate) fn write_private(file: &Path, dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)?;
    out.write_all(bytes)?;
    out.sync_all()?;
    let owner = std::fs::metadata(dir)?;
    if crate::config::running_as_root() && owner.uid() != 0 {
        std::os::unix::fs::chown(file, Some(owner.uid()), Some(owner.gid()))?;
    }
    Ok(())
}

/// The text of a file only its owner may read or write (`None`: it does
/// not exist); a file others may use is refused, saying how to fix it.
pub(crate) fn read_private(path: &Path) -> Result<Option<String>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mode = std::fs::metadata(path).map_err(|e| e.to_string())?.mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "other users can read or write it (mode {:o}); run `chmod 600 {}`",
            mode & 0o777,
            path.display()
        ));
    }
    Ok(Some(text))
}

/// Reads the token in `path`, creating it first (mode 0600, its directory
/// 0700) when it does not exist. Several processes starting at once end
/// up with the same token: the file appears whole, by a hard link, once.
pub fn load_or_create(path: &Path, kind: TokenKind) -> Result<Token, AuthError> {
    match read_token(path) {
        Err(AuthError::Missing { .. }) => {}
        found => return found,
    }
    let file_error = |reason: String| AuthError::File {
        path: path.to_path_buf(),
        reason,
    };
    let dir = private_dir(path).map_err(file_error)?;
    let token = Token::generate(kind).map_err(|e| file_error(e.to_string()))?;
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
        write_private(&tmp, dir, format!("{}\n", token.secret()).as_bytes())?;
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
#[derive(Clone)]
struct TlsFiles {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Vec<u8>,
}

struct Inner {
    mode: AuthMode,
    /// The people, each with a token of their own.
    people: Arc<crate::people::PeopleFile>,
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
            people: Arc::new(crate::people::PeopleFile::empty()),
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
            people: Arc::new(crate::people::PeopleFile::empty()),
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
            people: Arc::new(crate::people::PeopleFile::empty()),
            client: token,
            service: None,
            tls: None,
            missing: None,
        }))
    }

    /// The same credentials, also accepting the tokens of the people in
    /// `people`.
    pub fn with_people(&self, people: Arc<crate::people::PeopleFile>) -> Auth {
        Auth(Arc::new(Inner {
            mode: self.0.mode,
            people,
            client: self.0.client.clone(),
            service: self.0.service.clone(),
            tls: self.0.tls.clone(),
            missing: self.0.missing.clone(),
        }))
    }

    /// The credentials of the services: both tokens, created at first
    /// start, the people file, and the TLS files when configured.
    pub fn for_services(config: &Config) -> Result<Auth, AuthError> {
        let tls = load_tls(config)?;
        let (client, service) = match config.auth.mode {
            AuthMode::Off => (None, None),
            AuthMode::Token => (
                Some(load_or_create(
                    &config.client_token_file(),
                    TokenKind::Client,
                )?),
                Some(load_or_create(
                    &config.service_token_file(),
                    TokenKind::Service,
                )?),
            ),
        };
        let people = match config.auth.mode {
            AuthMode::Off => crate::people::PeopleFile::empty(),
            AuthMode::Token => crate::people::PeopleFile::open(config.people_file())?,
        };
        Ok(Auth(Arc::new(Inner {
            mode: config.auth.mode,
            people: Arc::new(people),
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
            people: Arc::new(crate::people::PeopleFile::empty()),
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
            .keep_alive_while_idle(true)
            // HTTP/2 counts the streams this side had to reset because of
            // frames it could not take (a frame for a stream it cancelled
            // more than a second before arrives late on a busy machine)
            // and, at 1,024 over a connection's life, closes the whole
            // connection. A client of Agentry's services keeps one
            // connection for many calls and cancels streams routinely
            // (a page closed, a call stopped, a session unloaded), so it
            // would end its own connection, and every call on it, after
            // enough of them; the limit guards servers, and the services
            // keep theirs.
            .http2_max_local_error_reset_streams(None);
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

    /// Who makes a call to `path` with `authorization` metadata (and, from
    /// a service, the person it acts for in `on_behalf_of`), or the status
    /// it is refused with.
    pub fn check(
        &self,
        path: &str,
        authorization: Option<&[u8]>,
        on_behalf_of: Option<&[u8]>,
    ) -> Result<Principal, tonic::Status> {
        let required = required_role(path);
        if self.0.mode == AuthMode::Off {
            // Loopback only, and everyone trusted: still, who asked is
            // recorded when a service says.
            let name = on_behalf_of
                .and_then(|n| std::str::from_utf8(n).ok())
                .filter(|n| crate::people::check_name(n).is_ok() || *n == crate::people::ADMIN)
                .unwrap_or(crate::people::LOCAL);
            return Ok(Principal {
                name: name.to_string(),
                role: Role::Service,
            });
        }
        let Some(required) = required else {
            return Ok(Principal {
                name: "anyone".into(),
                role: Role::Viewer,
            });
        };
        let Some(value) = authorization else {
            return Err(tonic::Status::unauthenticated(
                "this call needs a credential: send `authorization: Bearer <token>` metadata \
                 (`agentry token` prints the client token; `agentry users add` makes one per \
                 person)",
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
        let principal = self.principal(presented, on_behalf_of)?;
        if principal.role < required {
            if required == Role::Service {
                return Err(tonic::Status::permission_denied(format!(
                    "{} is only for Agentry's own services; a person's token cannot call it",
                    path.trim_start_matches('/')
                )));
            }
            principal.require(required, path.trim_start_matches('/'))?;
        }
        Ok(principal)
    }

    /// Credentials are off: every caller is trusted (loopback only).
    pub fn is_off(&self) -> bool {
        self.0.mode == AuthMode::Off
    }

    /// The person holding the token `presented` (a person's token, or the
    /// client token: the person `admin`); the service token is nobody's.
    pub fn identify(&self, presented: &[u8]) -> Result<Principal, tonic::Status> {
        if self
            .0
            .service
            .as_ref()
            .is_some_and(|t| t.matches(presented))
        {
            return Err(tonic::Status::unauthenticated(
                "the service token is for Agentry's own services, not a person: use your own \
                 token (`agentry users add`) or the client token (`agentry token`)",
            ));
        }
        self.principal(presented, None)
    }

    /// The person `name`, still holding the token whose SHA-256 (hex)
    /// starts with `fingerprint` (16 characters or more); `None` when they
    /// are gone or their token changed.
    pub fn holder(&self, name: &str, fingerprint: &str) -> Option<Principal> {
        if fingerprint.len() < 16 {
            return None;
        }
        let same = |hash: &str| {
            hash.get(..fingerprint.len()).is_some_and(|h| {
                crate::people::constant_time_eq(h.as_bytes(), fingerprint.as_bytes())
            })
        };
        if name == crate::people::ADMIN {
            let client = self.0.client.as_ref()?;
            return same(&crate::people::sha256_hex(client.secret().as_bytes())).then(|| {
                Principal {
                    name: name.to_string(),
                    role: Role::Admin,
                }
            });
        }
        let people = self.0.people.current();
        let person = people.by_name(name)?;
        same(&person.token_sha256).then(|| Principal {
            name: person.name.clone(),
            role: person.role,
        })
    }

    /// Who holds the token `presented`.
    fn principal(
        &self,
        presented: &[u8],
        on_behalf_of: Option<&[u8]>,
    ) -> Result<Principal, tonic::Status> {
        // The people are looked at only for a call made for or by one
        // (not for the services' own calls, the most frequent).
        if self
            .0
            .service
            .as_ref()
            .is_some_and(|t| t.matches(presented))
        {
            let Some(name) = on_behalf_of else {
                return Ok(Principal::service());
            };
            let name = std::str::from_utf8(name).unwrap_or_default();
            if name == crate::people::ADMIN {
                return Ok(Principal {
                    name: name.to_string(),
                    role: Role::Admin,
                });
            }
            return match self.0.people.current().by_name(name) {
                Some(person) => Ok(Principal {
                    name: person.name.clone(),
                    role: person.role,
                }),
                None => Err(tonic::Status::unauthenticated(format!(
                    "the call is made for {name:?}, who is not a person here (any more)"
                ))),
            };
        }
        if self.0.client.as_ref().is_some_and(|t| t.matches(presented)) {
            return Ok(Principal {
                name: crate::people::ADMIN.to_string(),
                role: Role::Admin,
            });
        }
        let people = self.0.people.current();
        match people.by_token_hash(&crate::people::sha256_hex(presented)) {
            Some(person) => Ok(Principal {
                name: person.name.clone(),
                role: person.role,
            }),
            None => Err(tonic::Status::unauthenticated(
                "the token is not valid here (`agentry token` prints the current client token; \
                 a person's token stops working when they are removed)",
            )),
        }
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

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let verdict = self.auth.check(
            request.uri().path(),
            request
                .headers()
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
            request.headers().get(ON_BEHALF_OF).map(|v| v.as_bytes()),
        );
        match verdict {
            Ok(principal) => {
                request.extensions_mut().insert(principal);
                Box::pin(self.inner.call(request))
            }
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

    #[test]
    fn the_policy_ranks_roles_as_the_credential_check_does() {
        let all = [
            Role::Viewer,
            Role::Operator,
            Role::Approver,
            Role::Admin,
            Role::Service,
        ];
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        let names: Vec<&str> = all.iter().map(|r| r.name()).collect();
        assert_eq!(names, agentry_policy::approvals::ROLES);
    }

    fn tokens() -> (Token, Token, Auth) {
        let client = Token::generate(TokenKind::Client).unwrap();
        let service = Token::generate(TokenKind::Service).unwrap();
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
        let missing = auth.check(path, None, None).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
        assert!(
            missing.message().contains("Bearer"),
            "{}",
            missing.message()
        );
        let wrong = Token::generate(TokenKind::Client).unwrap();
        let e = auth.check(path, Some(&bearer(&wrong)), None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = auth
            .check(path, Some(b"Basic dXNlcjpwYXNz"), None)
            .unwrap_err();
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
        let admin = auth.check(read, Some(&bearer(&client)), None).unwrap();
        assert_eq!((admin.name.as_str(), admin.role), ("admin", Role::Admin));
        for path in [append, execute] {
            let e = auth.check(path, Some(&bearer(&client)), None).unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{path}");
            assert_eq!(
                auth.check(path, Some(&bearer(&service)), None).unwrap(),
                Principal::service()
            );
        }
    }

    #[test]
    fn a_persons_token_has_their_role_and_a_service_may_act_for_them() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("people.toml");
        let viewer = crate::people::People::add(&file, "vera", Role::Viewer, "admin").unwrap();
        let approver = crate::people::People::add(&file, "abe", Role::Approver, "admin").unwrap();
        let (_, service, auth) = tokens();
        let auth = auth.with_people(Arc::new(crate::people::PeopleFile::open(file).unwrap()));
        let list = "/agentry.orchestrator.v1.Orchestrator/ListSessions";
        let submit = "/agentry.orchestrator.v1.Orchestrator/Submit";
        let delete = "/agentry.orchestrator.v1.Orchestrator/DeleteSession";

        let vera = auth.check(list, Some(&bearer(&viewer)), None).unwrap();
        assert_eq!((vera.name.as_str(), vera.role), ("vera", Role::Viewer));
        let refused = auth
            .check(submit, Some(&bearer(&viewer)), None)
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(
            refused.message().contains("vera is a viewer")
                && refused.message().contains("needs operator"),
            "{}",
            refused.message()
        );
        assert_eq!(
            crate::reasons::reason_of(&refused),
            crate::reasons::Reason::RoleTooLow
        );
        let abe = auth.check(submit, Some(&bearer(&approver)), None).unwrap();
        assert_eq!(abe.role, Role::Approver);
        assert!(auth.check(delete, Some(&bearer(&approver)), None).is_err());

        // A service acting for a person has that person's role, not its own.
        let for_vera = auth
            .check(submit, Some(&bearer(&service)), Some(b"vera"))
            .unwrap_err();
        assert_eq!(for_vera.code(), tonic::Code::PermissionDenied);
        let for_abe = auth
            .check(submit, Some(&bearer(&service)), Some(b"abe"))
            .unwrap();
        assert_eq!(for_abe.name, "abe");
        let nobody = auth
            .check(list, Some(&bearer(&service)), Some(b"mallory"))
            .unwrap_err();
        assert_eq!(nobody.code(), tonic::Code::Unauthenticated);
        // A person cannot claim to act for another.
        let claimed = auth
            .check(list, Some(&bearer(&viewer)), Some(b"abe"))
            .unwrap();
        assert_eq!(claimed.name, "vera");
    }

    #[test]
    fn health_checks_need_no_credential_and_off_needs_none_at_all() {
        let (_, _, auth) = tokens();
        assert!(
            auth.check("/grpc.health.v1.Health/Check", None, None)
                .is_ok()
        );
        assert!(
            auth.check(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                None,
                None
            )
            .is_err()
        );
        let off = Auth::off();
        assert!(
            off.check("/agentry.tools.v1.ToolRunner/Execute", None, None)
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
        let first = load_or_create(&path, TokenKind::Client).unwrap();
        assert!(first.secret().starts_with("agentry_client_"));
        assert_eq!(first.secret().len(), "agentry_client_".len() + 64);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert_eq!(load_or_create(&path, TokenKind::Client).unwrap(), first);
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
                .map(|_| s.spawn(|| load_or_create(&path, TokenKind::Service).unwrap()))
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
