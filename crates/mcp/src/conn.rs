//! One connection to an MCP server: a stdio server's process, started
//! through the sandbox helper like every tool process, or a streamable
//! HTTP session; the `initialize` handshake under a deadline; calls with a
//! deadline whose progress and log notifications stream as live output.

pub use crate::host::Place;
use crate::{Host, McpError, OutputSink};
use agentry_proto::sessions::v1::OutputStream;
use agentry_runtime::config::McpServerConfig;
use rmcp::handler::client::progress::ProgressDispatcher;
#[allow(deprecated)]
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ClientRequest,
    Implementation, ProgressNotificationParam, ProtocolVersion, Request,
    ResourceUpdatedNotificationParam, ServerResult, SubscriptionFilter, Tool,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService, ServiceError};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc};

use super::process::*;

/// Something a server said outside of a call's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnEvent {
    /// Its tool list changed.
    ToolsChanged,
    /// A subscribed resource changed.
    ResourceUpdated {
        /// The resource.
        uri: String,
    },
}

/// Why a call did not get an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The deadline passed; the server was told to stop.
    Timeout(Duration),
    /// The connection ended (the server exited or hung up).
    Closed(String),
    /// The server answered with a JSON-RPC error.
    Server(String),
    /// Anything else (transport, protocol).
    Other(String),
}

impl CallError {
    /// Whether the connection is unusable after this.
    pub fn closes(&self) -> bool {
        matches!(self, CallError::Closed(_))
    }
}

/// Receives what the server sends on its own.
struct Handler {
    progress: ProgressDispatcher,
    logs: broadcast::Sender<String>,
    events: mpsc::UnboundedSender<ConnEvent>,
}

impl ClientHandler for Handler {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.handle_notification(params).await;
    }

    // Logging is deprecated by the newest protocol, but servers on the
    // earlier ones (most of them) still send it.
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let data = match &params.data {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let level = serde_json::to_value(params.level)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let line = match &params.logger {
            Some(logger) => format!("[{level}] {logger}: {data}"),
            None => format!("[{level}] {data}"),
        };
        // Nobody may be listening (no call in flight): fine.
        let _ = self.logs.send(clip(line, MAX_LINE));
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.events.send(ConnEvent::ToolsChanged);
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self
            .events
            .send(ConnEvent::ResourceUpdated { uri: params.uri });
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("agentry", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// An open connection.
pub struct Conn {
    service: RunningService<RoleClient, Handler>,
    process: Option<ServerProcess>,
    /// The protocol version the server chose.
    pub protocol: ProtocolVersion,
    last_used: Mutex<Instant>,
    stderr_tail: Arc<Mutex<Vec<String>>>,
    /// Resources subscribed on this connection.
    subscribed: Mutex<std::collections::BTreeSet<String>>,
}

/// How much of a stdio server's stderr is kept to explain its failures.
pub(super) const STDERR_LINES: usize = 20;

impl Conn {
    /// Starts the server and completes `initialize` within `init_timeout`.
    /// `events` receives what it announces.
    pub async fn open(
        config: &McpServerConfig,
        place: &Place,
        host: &dyn Host,
        init_timeout: Duration,
        events: mpsc::UnboundedSender<ConnEvent>,
    ) -> Result<Conn, McpError> {
        let handler = Handler {
            progress: ProgressDispatcher::new(),
            logs: broadcast::channel(64).0,
            events,
        };
        let stderr_tail = Arc::new(Mutex::new(Vec::new()));
        let (service, process) = if config.url.is_empty() {
            let (mut process, stdout, stdin) = ServerProcess::start(config, place, host)?;
            if let Some(stderr) = process.child.as_mut().and_then(|c| c.stderr.take()) {
                tokio::spawn(keep_stderr(
                    config.name.clone(),
                    stderr,
                    stderr_tail.clone(),
                ));
            }
            let started = tokio::time::timeout(init_timeout, handler.serve((stdout, stdin))).await;
            match started {
                Ok(Ok(service)) => (service, Some(process)),
                Ok(Err(e)) => {
                    let status = process.exit_status().await;
                    let setup = process.reports.as_ref().and_then(|r| r.setup_failure());
                    return Err(McpError(explain_start(
                        &e.to_string(),
                        status,
                        setup,
                        &stderr_tail,
                    )));
                }
                Err(_) => {
                    return Err(McpError(format!(
                        "it did not answer initialize within {}s",
                        init_timeout.as_secs_f64()
                    )));
                }
            }
        } else {
            let transport = http_transport(config)?;
            match tokio::time::timeout(init_timeout, handler.serve(transport)).await {
                Ok(Ok(service)) => (service, None),
                Ok(Err(e)) => {
                    return Err(McpError(format!(
                        "{} did not start a session: {}",
                        shown_url(&config.url),
                        scrub_url(&e.to_string(), &config.url)
                    )));
                }
                Err(_) => {
                    return Err(McpError(format!(
                        "{} did not answer initialize within {}s",
                        shown_url(&config.url),
                        init_timeout.as_secs_f64()
                    )));
                }
            }
        };
        let protocol = service
            .peer_info()
            .map(|info| info.protocol_version.clone())
            .unwrap_or_default();
        let conn = Conn {
            service,
            process,
            protocol,
            last_used: Mutex::new(Instant::now()),
            stderr_tail,
            subscribed: Mutex::default(),
        };
        conn.listen_for_tool_changes();
        Ok(conn)
    }

    /// On protocol 2026-07-28 and later, list changes arrive only on a
    /// `subscriptions/listen` stream that asked for them.
    fn listen_for_tool_changes(&self) {
        let announces = self
            .service
            .peer_info()
            .and_then(|info| info.capabilities.tools.as_ref()?.list_changed)
            .unwrap_or(false);
        if !announces || self.protocol < ProtocolVersion::V_2026_07_28 {
            return;
        }
        let peer = self.service.peer().clone();
        let events = self.service.service().events.clone();
        tokio::spawn(async move {
            let filter = SubscriptionFilter::builder().tools_list_changed().build();
            let Ok(mut subscription) = peer.listen(filter).await else {
                return;
            };
            while let Ok(Some(_)) = subscription.next().await {
                if events.send(ConnEvent::ToolsChanged).is_err() {
                    return;
                }
            }
        });
    }

    /// Whether the connection still works: the service runs, its
    /// transport is open, and (stdio) the server's process is alive.
    pub fn is_open(&self) -> bool {
        !self.service.is_closed()
            && !self.service.peer().is_transport_closed()
            && self
                .process
                .as_ref()
                .is_none_or(|p| p.status_now().is_none())
    }

    /// The resources this connection is subscribed to.
    pub fn subscribed(&self) -> std::collections::BTreeSet<String> {
        self.subscribed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// When it was last used.
    pub fn last_used(&self) -> Instant {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// The server's tools.
    pub async fn list_tools(&self, timeout: Duration) -> Result<Vec<Tool>, McpError> {
        self.touch();
        match tokio::time::timeout(timeout, self.service.peer().list_all_tools()).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(e)) => Err(McpError(format!("tools/list failed: {}", self.explain(&e)))),
            Err(_) => Err(McpError(format!(
                "tools/list got no answer within {}s",
                timeout.as_secs_f64()
            ))),
        }
    }

    /// Calls `tool`; progress and log notifications go to `sink` while it
    /// runs.
    pub async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
        timeout: Duration,
        sink: &OutputSink,
    ) -> Result<CallToolResult, CallError> {
        self.touch();
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = Some(arguments);
        let request = ClientRequest::CallToolRequest(Request::new(params));
        let options = PeerRequestOptions::with_timeout(timeout);
        let mut logs = self.service.service().logs.subscribe();
        let handle = self
            .service
            .peer()
            .send_request_with_option(request, options)
            .await
            .map_err(|e| self.call_error(e))?;
        // A call dropped before its answer (the caller cancelled) is
        // cancelled on the server too.
        let mut cancel = CancelOnDrop {
            peer: Some(self.service.peer().clone()),
            id: handle.id.clone(),
        };
        let mut progress = self
            .service
            .service()
            .progress
            .subscribe(handle.progress_token.clone())
            .await;
        let response = handle.await_response();
        tokio::pin!(response);
        // The request's own deadline sends the cancellation; this one holds
        // even when sending it hangs.
        let hard = tokio::time::sleep(timeout + CANCEL_GRACE);
        tokio::pin!(hard);
        let answer = loop {
            tokio::select! {
                answer = &mut response => break answer,
                () = &mut hard => break Err(ServiceError::Timeout { timeout }),
                Some(p) = futures::StreamExt::next(&mut progress) => {
                    let _ = sink.send((OutputStream::Stderr, progress_line(&p))).await;
                }
                Ok(line) = logs.recv() => {
                    let _ = sink.send((OutputStream::Stderr, format!("{line}\n"))).await;
                }
            }
        };
        self.touch();
        cancel.peer = None;
        match answer.map_err(|e| self.call_error(e))? {
            ServerResult::CallToolResult(result) => Ok(result),
            ServerResult::InputRequiredResult(_) => Err(CallError::Other(
                "the server asked for more input from the person during the call, which \
                 Agentry does not relay"
                    .into(),
            )),
            ServerResult::CreateTaskResult(_) => Err(CallError::Other(
                "the server made the call a background task, which Agentry does not follow".into(),
            )),
            other => Err(CallError::Other(format!(
                "the server answered tools/call with something else: {}",
                serde_json::to_string(&other).unwrap_or_default()
            ))),
        }
    }

    fn call_error(&self, e: ServiceError) -> CallError {
        match e {
            ServiceError::Timeout { timeout } => CallError::Timeout(timeout),
            ServiceError::McpError(data) => CallError::Server(data.message.to_string()),
            // A send that failed because the server is gone is the same as
            // the server hanging up.
            ServiceError::TransportClosed => CallError::Closed(self.explain(&e)),
            ServiceError::TransportSend(_) if !self.is_open() => {
                CallError::Closed(self.explain(&e))
            }
            other => CallError::Other(self.explain(&other)),
        }
    }

    fn explain(&self, e: &ServiceError) -> String {
        let tail = self
            .stderr_tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n");
        match (e, self.process.as_ref().and_then(ServerProcess::status_now)) {
            (_, Some(status)) if tail.is_empty() => format!("the server exited ({status})"),
            (_, Some(status)) => format!("the server exited ({status}); its last words:\n{tail}"),
            (ServiceError::TransportClosed, None) => "the server closed the connection".into(),
            (e, None) => e.to_string(),
        }
    }

    /// Whether the server offers resource subscriptions.
    pub fn supports_subscriptions(&self) -> bool {
        self.service
            .peer_info()
            .and_then(|info| info.capabilities.resources.as_ref()?.subscribe)
            .unwrap_or(false)
    }

    /// Reads a resource: its text (binary parts described) and MIME type.
    pub async fn read_resource(
        &self,
        uri: &str,
        timeout: Duration,
    ) -> Result<(String, String), McpError> {
        self.touch();
        let read = self
            .service
            .peer()
            .read_resource(rmcp::model::ReadResourceRequestParams::new(uri));
        let result = tokio::time::timeout(timeout, read)
            .await
            .map_err(|_| {
                format!(
                    "resources/read got no answer within {}s",
                    timeout.as_secs_f64()
                )
            })?
            .map_err(|e| format!("resources/read failed: {}", self.explain(&e)))?;
        let mut parts = Vec::new();
        let mut mime = String::new();
        for contents in &result.contents {
            match contents {
                rmcp::model::ResourceContents::TextResourceContents {
                    text, mime_type, ..
                } => {
                    if mime.is_empty() {
                        mime = mime_type.clone().unwrap_or_default();
                    }
                    parts.push(text.clone());
                }
                rmcp::model::ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => {
                    if mime.is_empty() {
                        mime = mime_type.clone().unwrap_or_default();
                    }
                    parts.push(format!(
                        "[{uri}: {} bytes of binary data ({}), not shown]",
                        blob.len() * 3 / 4,
                        mime_type.as_deref().unwrap_or("application/octet-stream")
                    ));
                }
                _ => parts.push("[contents of a kind Agentry does not know]".into()),
            }
        }
        Ok((parts.join("\n"), mime))
    }

    /// Subscribes to updates of `uri` (legacy `resources/subscribe`, or a
    /// `subscriptions/listen` stream on 2026-07-28), once per connection.
    pub async fn subscribe(&self, uri: &str, timeout: Duration) -> Result<(), McpError> {
        if self.subscribed().contains(uri) {
            return Ok(());
        }
        self.subscribe_once(uri, timeout).await?;
        self.subscribed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uri.to_string());
        Ok(())
    }

    async fn subscribe_once(&self, uri: &str, timeout: Duration) -> Result<(), McpError> {
        self.touch();
        if self.protocol >= ProtocolVersion::V_2026_07_28 {
            let peer = self.service.peer().clone();
            let events = self.service.service().events.clone();
            let filter = SubscriptionFilter::builder()
                .resource_subscriptions([uri.to_string()])
                .build();
            let mut subscription = tokio::time::timeout(timeout, peer.listen(filter))
                .await
                .map_err(|_| "the server did not acknowledge the subscription in time".to_string())?
                .map_err(|e| format!("the server refused the subscription: {e}"))?;
            tokio::spawn(async move {
                while let Ok(Some(notification)) = subscription.next().await {
                    if let rmcp::model::ServerNotification::ResourceUpdatedNotification(n) =
                        notification
                        && events
                            .send(ConnEvent::ResourceUpdated { uri: n.params.uri })
                            .is_err()
                    {
                        return;
                    }
                }
            });
            return Ok(());
        }
        #[allow(deprecated)]
        let subscribed = self
            .service
            .peer()
            .subscribe(rmcp::model::SubscribeRequestParams::new(uri));
        tokio::time::timeout(timeout, subscribed)
            .await
            .map_err(|_| McpError::from("the server did not answer resources/subscribe in time"))?
            .map_err(|e| McpError(format!("the server refused the subscription: {e}")))
    }
}

/// A URL as errors show it: without credentials or a query (where API keys
/// often are).
fn shown_url(url: &str) -> String {
    match url::Url::parse(url.trim()) {
        Ok(mut parsed) => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.set_query(None);
            parsed.to_string()
        }
        Err(_) => "the configured URL".to_string(),
    }
}

/// `text` without the secrets of `url` (its password and query), which
/// transport errors quote.
fn scrub_url(text: &str, url: &str) -> String {
    let mut out = text.to_string();
    if let Ok(parsed) = url::Url::parse(url.trim()) {
        if let Some(query) = parsed.query().filter(|q| !q.is_empty()) {
            out = out.replace(&format!("?{query}"), "");
        }
        if let Some(password) = parsed.password().filter(|p| !p.is_empty()) {
            out = out.replace(password, "<redacted>");
        }
    }
    out
}

/// How long past its deadline a call may take to be cancelled.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// Longest log or progress line passed on.
const MAX_LINE: usize = 2000;

/// Sends `notifications/cancelled` for a request dropped before its answer.
struct CancelOnDrop {
    peer: Option<rmcp::Peer<RoleClient>>,
    id: rmcp::model::RequestId,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else { return };
        let id = self.id.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let params = rmcp::model::CancelledNotificationParam::new(
                    Some(id),
                    Some("the caller cancelled the call".into()),
                );
                let _ = tokio::time::timeout(CANCEL_GRACE, peer.notify_cancelled(params)).await;
            });
        }
    }
}

/// `text` cut to at most `max` bytes (on a character boundary).
fn clip(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut at = max;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
        text.push('…');
    }
    text
}

fn progress_line(p: &ProgressNotificationParam) -> String {
    let amount = match p.total {
        Some(total) => format!("{}/{}", p.progress, total),
        None => format!("{}", p.progress),
    };
    match &p.message {
        Some(message) => format!("[progress {amount}] {}\n", clip(message.clone(), MAX_LINE)),
        None => format!("[progress {amount}]\n"),
    }
}
