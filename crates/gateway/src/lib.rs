//! The gateway: an HTTP server (`agentry serve gateway`, also started by
//! `agentry up`) that serves the web console and the JSON + server-sent
//! events API it uses. It is a client of the orchestrator like the CLI: it
//! calls with the service token and names the person logged in
//! (`x-agentry-person`), so the orchestrator applies that person's role to
//! every call, and records them on what they send.
//!
//! - [`login`]: tokens in, signed cookies out; the anti-forgery checks;
//! - [`api`]: sessions, messages, approvals, rewinds, forks, the inbox;
//! - [`live`]: one shared fold per watched session, streamed to pages;
//! - [`wire`]: the shared session view as JSON;
//! - [`a2a`]: A2A 1.0 over JSON-RPC, for other agents (bearer tokens);
//! - [`agui`]: AG-UI runs as server-sent events, for web frontends;
//! - [`mcp`]: Agentry as an MCP server (streamable HTTP here, stdio in the
//!   CLI), for MCP hosts.
//!
//! It keeps no state of its own but the key that signs cookies (a private
//! file beside the service token): any number may run, and a restarted
//! one keeps everyone logged in.

pub mod a2a;
pub mod agui;
pub mod api;
pub mod assets;
pub mod error;
pub mod live;
pub mod login;
pub mod mcp;
pub mod tls;
pub mod wire;

use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_proto::scheduler::v1::scheduler_client::SchedulerClient;
use agentry_proto::tools::v1::tool_runner_client::ToolRunnerClient;
use agentry_runtime::auth::{ON_BEHALF_OF, TokenKind};
use agentry_runtime::telemetry::TracedChannel;
use agentry_runtime::{Auth, Config};
use axum::Router;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::routing::{get, post};
use error::ApiError;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// What every request handler shares.
#[derive(Clone)]
pub struct Gateway {
    /// The orchestrator, called with the service token.
    pub orchestrator: OrchestratorClient<TracedChannel>,
    /// The scheduler (reminders), likewise.
    pub scheduler: SchedulerClient<TracedChannel>,
    /// A tool runner, for the sandbox's report.
    pub runner: ToolRunnerClient<TracedChannel>,
    /// Checks people's tokens.
    pub auth: Auth,
    /// Credentials are off: everyone is the install's own person.
    pub auth_off: bool,
    /// Signs cookies.
    pub keys: Arc<login::Keys>,
    /// Failed logins per address.
    pub limiter: Arc<login::Limiter>,
    /// The watched sessions.
    pub hub: live::Hub,
    /// Cookies are marked Secure (TLS in front).
    pub secure_cookie: bool,
    /// How long a login lasts.
    pub login_ttl: Duration,
    /// Host names requests may name (empty: any).
    pub hosts: Arc<Vec<String>>,
    /// Set when the gateway stops: live streams end.
    pub stop: Arc<tokio::sync::watch::Sender<bool>>,
    /// Serves HTTPS itself.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// The configured sub-agents (name, description): the agent card's
    /// skills.
    pub skills: Arc<Vec<(String, String)>>,
    /// Places for protocol calls open at once (A2A streams and waits,
    /// AG-UI runs).
    pub streams: Arc<tokio::sync::Semaphore>,
    /// A TLS proxy in front sets `X-Forwarded-For`: the client's address
    /// (for the limit on failed tokens) is the one it appended.
    pub behind_proxy: bool,
}

impl Gateway {
    /// The address a request comes from: the peer's, or behind a TLS proxy
    /// the last address the proxy appended to `X-Forwarded-For` (a client
    /// cannot forge that one; without a proxy the header is ignored).
    pub fn client_ip(&self, headers: &HeaderMap, peer: std::net::IpAddr) -> std::net::IpAddr {
        if !self.behind_proxy {
            return peer;
        }
        headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .next_back()
            .and_then(|last| last.trim().parse().ok())
            .unwrap_or(peer)
    }

    /// A place for one more open protocol call, or the answer refusing it.
    pub fn stream_slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        self.streams.clone().try_acquire_owned().map_err(|_| {
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "too many streams are open on this gateway \
                 (gateway.max_protocol_streams); try again in a moment",
            )
        })
    }
}

/// Why the gateway cannot start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// It would listen beyond loopback without TLS in front.
    #[error(
        "the gateway would listen on {0}, beyond loopback, in clear text: put a TLS proxy in \
         front and set gateway.behind_tls_proxy = true (AGENTRY_GATEWAY_BEHIND_TLS_PROXY=true), \
         give it a certificate (gateway.tls_cert and gateway.tls_key), \
         listen on 127.0.0.1, or, on a private network only (a container's port published on \
         the host's loopback), set gateway.private_network = true"
    )]
    ClearText(SocketAddr),
    /// Credentials are off and it would listen beyond loopback.
    #[error(
        "credentials are off (auth.mode = \"off\"): the gateway would let anyone reaching {0} \
         in as admin; listen on 127.0.0.1, or turn credentials on"
    )]
    OpenBeyondLoopback(SocketAddr),
    /// One of the certificate and its key is set, not both.
    #[error("set both gateway.tls_cert and gateway.tls_key (PEM files), or neither")]
    HalfTls,
    /// The signing key cannot be read or made.
    #[error("the gateway's signing key: {0}")]
    Key(String),
}

impl Gateway {
    /// The gateway `config` describes, calling the orchestrator with
    /// `auth`'s service credentials.
    pub fn new(config: &Config, auth: &Auth) -> anyhow::Result<Gateway> {
        let listen = config.gateway.listen;
        let tls = match (
            config.gateway.tls_cert.is_empty(),
            config.gateway.tls_key.is_empty(),
        ) {
            (true, true) => None,
            (false, false) => Some(tls::acceptor(
                &config.gateway.tls_cert,
                &config.gateway.tls_key,
            )?),
            _ => return Err(GatewayError::HalfTls.into()),
        };
        if auth.is_off() && !listen.ip().is_loopback() {
            return Err(GatewayError::OpenBeyondLoopback(listen).into());
        }
        if !listen.ip().is_loopback()
            && tls.is_none()
            && !config.gateway.behind_tls_proxy
            && !config.gateway.private_network
        {
            return Err(GatewayError::ClearText(listen).into());
        }
        let key_file = config
            .service_token_file()
            .parent()
            .map_or_else(|| "gateway.key".into(), |d| d.join("gateway.key"));
        let key = agentry_runtime::auth::load_or_create(&key_file, TokenKind::Signing)
            .map_err(|e| GatewayError::Key(e.to_string()))?;
        let channel = auth.lazy_channel(&config.orchestrator.url)?;
        let orchestrator =
            OrchestratorClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
        let mut hosts: Vec<String> = config.gateway.allowed_hosts.clone();
        if listen.ip().is_loopback() || config.gateway.private_network {
            hosts.extend(["localhost", "127.0.0.1", "[::1]"].map(String::from));
        }
        // Beyond loopback with no names given: behind a proxy, by whatever
        // name it is given (an empty list checks nothing).
        let scheduler = SchedulerClient::new(auth.lazy_channel(&config.scheduler.url)?);
        let runner = ToolRunnerClient::new(auth.lazy_channel(&config.tool_runner.url)?);
        Ok(Gateway {
            scheduler,
            runner,
            orchestrator: orchestrator.clone(),
            auth: auth.clone(),
            auth_off: auth.is_off(),
            keys: Arc::new(login::Keys::new(key.secret().as_bytes())),
            limiter: Arc::new(login::Limiter::default()),
            hub: live::Hub::new(orchestrator),
            secure_cookie: config.gateway.behind_tls_proxy || tls.is_some(),
            login_ttl: Duration::from_secs(config.gateway.login_hours.clamp(1, 24 * 30) * 3600),
            hosts: Arc::new(hosts),
            stop: Arc::new(tokio::sync::watch::channel(false).0),
            tls,
            skills: Arc::new(
                config
                    .agents
                    .iter()
                    .map(|a| (a.name.clone(), a.description.clone()))
                    .collect(),
            ),
            streams: Arc::new(tokio::sync::Semaphore::new(
                config.gateway.max_protocol_streams.max(1) as usize,
            )),
            behind_proxy: config.gateway.behind_tls_proxy,
        })
    }

    /// Refuses a request naming a host this gateway does not answer to (a
    /// page of another site reaching it through DNS rebinding).
    pub fn check_host(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.hosts.is_empty() {
            return Ok(());
        }
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        let name = match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        };
        if self.hosts.iter().any(|h| h.eq_ignore_ascii_case(name)) {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "this gateway does not answer to the host {name:?}; add it to \
                 gateway.allowed_hosts"
            )))
        }
    }

    /// A request to the orchestrator made for `person`. A name that cannot
    /// travel as metadata is refused (never sent as the services' own).
    pub fn request<T>(
        &self,
        person: &login::Person,
        message: T,
    ) -> Result<tonic::Request<T>, ApiError> {
        let mut request = tonic::Request::new(message);
        let name = person
            .name
            .parse()
            .map_err(|_| ApiError::forbidden("this person's name cannot be passed on"))?;
        request.metadata_mut().insert(ON_BEHALF_OF, name);
        Ok(request)
    }

    /// The login cookie's name: `__Host-` prefixed under TLS, so no other
    /// site of the domain can set it.
    pub fn cookie_name(&self) -> &'static str {
        if self.secure_cookie {
            login::SECURE_COOKIE
        } else {
            login::COOKIE
        }
    }

    /// The routes.
    pub fn router(self) -> Router {
        let mcp = Router::new()
            .route_service("/mcp", mcp::http_service(&self))
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                mcp::authorize,
            ));
        Router::new()
            .merge(mcp)
            .route("/", get(assets::index))
            .route("/console.css", get(assets::css))
            .route("/console.js", get(assets::js))
            .route("/api/login", post(login::login))
            .route("/api/logout", post(login::logout))
            .route("/api/me", get(login::me))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/api/sessions", get(api::sessions).post(api::create))
            .route("/api/sessions/{id}", get(api::session))
            .route("/api/sessions/{id}/live", get(api::live))
            .route("/api/sessions/{id}/messages", post(api::message))
            .route("/api/sessions/{id}/cancel", post(api::cancel))
            .route("/api/sessions/{id}/rewind", post(api::rewind))
            .route("/api/sessions/{id}/fork", post(api::fork))
            .route("/api/sessions/{id}/approvals/{call_id}", post(api::answer))
            .route("/api/approvals", get(api::approvals))
            .route("/api/sessions/{id}/preview/{call_id}", get(api::preview))
            .route("/api/overview", get(api::overview))
            .route("/.well-known/agent-card.json", get(a2a::card))
            .route(a2a::RPC_PATH, post(a2a::rpc))
            .route("/agui", post(agui::run))
            .layer(axum::middleware::map_response(security_headers))
            .layer(axum::middleware::map_response_with_state(
                self.secure_cookie,
                strict_transport,
            ))
            .with_state(self)
    }
}

/// Headers every answer carries: no framing by other sites, no sniffing,
/// nothing cached, no referrer, and a content policy that runs only this
/// site's scripts and fetches only from it.
async fn security_headers(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Under TLS: browsers are told to come back only over HTTPS.
async fn strict_transport(
    axum::extract::State(secure): axum::extract::State<bool>,
    mut response: axum::response::Response,
) -> axum::response::Response {
    if secure {
        response.headers_mut().insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
    response
}

/// Serves the gateway `config` describes on `listener` until `shutdown`
/// completes.
pub async fn run(
    config: &Config,
    auth: &Auth,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve(Gateway::new(config, auth)?, listener, shutdown).await
}

/// Serves `gateway` (set up already) on `listener` until `shutdown`
/// completes.
pub async fn serve(
    gateway: Gateway,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "the gateway is serving the console");
    let stop = gateway.stop.clone();
    let shutdown = async move {
        shutdown.await;
        // Live streams never end on their own: they end now.
        let _ = stop.send(true);
    };
    let tls = gateway.tls.clone();
    let app = gateway
        .router()
        .into_make_service_with_connect_info::<tls::ClientAddr>();
    match tls {
        Some(acceptor) => {
            let listener = tls::TlsListener::new(listener, acceptor)?;
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await?;
        }
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await?
        }
    }
    Ok(())
}
