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
    CallToolRequestParams, CallToolResult, CancelTaskParams, ClientCapabilities, ClientConfig,
    ClientRequest, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationCapability,
    FormElicitationCapability, GetTaskParams, Implementation, InputRequests, InputResponses,
    ProgressNotificationParam, ProtocolVersion, Request, RequestMetaObject,
    ResourceUpdatedNotificationParam, ServerResult, SubscriptionFilter, TASKS_EXTENSION_ID,
    TaskPayload, Tool, UpdateTaskParams, UrlElicitationCapability,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, NotificationContext, PeerRequestOptions, RequestContext,
    RunningService, ServiceError,
};
use rmcp::{ClientHandler, RoleClient};
use std::collections::BTreeMap;
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

    /// A question asked in the middle of a call (servers of protocols
    /// before 2026-07-28 without tasks) cannot wait for a person, who may
    /// answer hours later: it is declined, and the call's output says so.
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        let message = match &request {
            ElicitRequestParams::FormElicitationParams { message, .. }
            | ElicitRequestParams::UrlElicitationParams { message, .. } => message.clone(),
            _ => String::new(),
        };
        let _ = self.logs.send(clip(
            format!(
                "[agentry] the server asked a person in the middle of the call ({message:?}); \
                 it was declined: Agentry passes questions on to people for servers that ask \
                 them between calls (protocol 2026-07-28, or MCP tasks)"
            ),
            MAX_LINE,
        ));
        Ok(ElicitResult::new(ElicitationAction::Decline))
    }

    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        capabilities.elicitation = Some(
            ElicitationCapability::new()
                .with_form(FormElicitationCapability::default())
                .with_url(UrlElicitationCapability::default()),
        );
        capabilities.extensions = Some(BTreeMap::from([(
            TASKS_EXTENSION_ID.to_string(),
            serde_json::Map::new(),
        )]));
        ClientConfig::new(
            capabilities,
            Implementation::new("agentry", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// Starts a streamable HTTP connection through `client` within `timeout`.
async fn start_http<C>(
    handler: Handler,
    client: C,
    config: rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig,
    timeout: Duration,
) -> Result<
    Result<RunningService<RoleClient, Handler>, rmcp::service::ClientInitializeError>,
    tokio::time::error::Elapsed,
>
where
    C: rmcp::transport::streamable_http_client::StreamableHttpClient + Send + 'static,
{
    let transport = rmcp::transport::StreamableHttpClientTransport::with_client(client, config);
    tokio::time::timeout(
        timeout,
        handler.serve_with_lifecycle(transport, lifecycle()),
    )
    .await
}

/// How a connection starts: `server/discover` first (servers of the
/// 2026-07-28 revision need no `initialize`), falling back to the
/// `initialize` handshake for earlier servers.
fn lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::LATEST],
        legacy_version: None,
    }
}

/// What a call came to.
#[derive(Debug)]
pub enum Answer {
    /// Its result.
    Done(CallToolResult),
    /// The server needs a person's answers first: the questions, and how
    /// the call goes on (`resume_json`, for [`Conn::call`]'s `resume`).
    NeedsInput {
        /// The questions, in the server's order of keys.
        questions: Vec<agentry_proto::sessions::v1::McpQuestion>,
        /// How the call goes on.
        resume_json: String,
    },
}

/// How a call that asked for input goes on, as recorded in the log.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Resume {
    /// The server's task that waits for the answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    task: Option<String>,
    /// The request state the server wants back with them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state: Option<String>,
    /// Answers given without a person (the roots request).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    auto: BTreeMap<String, serde_json::Value>,
}

/// The server's requests for input: those a person answers (elicitation
/// questions), and the answers Agentry gives itself (no roots). A request
/// to sample the model is refused: servers do not use the session's model.
fn split_requests(
    requests: &InputRequests,
) -> Result<
    (
        Vec<agentry_proto::sessions::v1::McpQuestion>,
        BTreeMap<String, serde_json::Value>,
    ),
    CallError,
> {
    let mut questions = Vec::new();
    let mut auto = BTreeMap::new();
    for (key, request) in requests {
        let request = serde_json::to_value(request).unwrap_or_default();
        let method = request["method"].as_str().unwrap_or_default();
        let params = &request["params"];
        match method {
            "elicitation/create" => {
                let text = |field: &str| params[field].as_str().unwrap_or_default().to_string();
                let mode = match params["mode"].as_str() {
                    Some("url") => "url",
                    _ => "form",
                };
                questions.push(agentry_proto::sessions::v1::McpQuestion {
                    key: key.clone(),
                    mode: mode.to_string(),
                    message: clip(text("message"), MAX_QUESTION),
                    schema_json: match &params["requestedSchema"] {
                        serde_json::Value::Null => String::new(),
                        schema => clip(schema.to_string(), MAX_QUESTION),
                    },
                    url: clip(text("url"), MAX_QUESTION),
                });
            }
            "roots/list" => {
                auto.insert(key.clone(), serde_json::json!({"roots": []}));
            }
            "sampling/createMessage" => {
                return Err(CallError::Other(
                    "the server asked to use the model (sampling), which Agentry does not offer \
                     to MCP servers"
                        .into(),
                ));
            }
            other => {
                return Err(CallError::Other(format!(
                    "the server asked for input of a kind Agentry does not know ({other:?})"
                )));
            }
        }
    }
    if questions.len() > MAX_QUESTIONS {
        return Err(CallError::Other(format!(
            "the server asked {} questions at once; Agentry passes on at most {MAX_QUESTIONS}",
            questions.len()
        )));
    }
    Ok((questions, auto))
}

/// Most questions passed on from one request of a server.
const MAX_QUESTIONS: usize = 8;
/// Longest message, schema or URL of a question passed on, in bytes.
const MAX_QUESTION: usize = 16 * 1024;
/// Most input rounds of one call that need no person.
const MAX_ROUNDS: usize = 10;

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
            let started = tokio::time::timeout(
                init_timeout,
                handler.serve_with_lifecycle((stdout, stdin), lifecycle()),
            )
            .await;
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
            let (transport_config, client) = http_settings(config)?;
            let signed_in = match configured_token(config)? {
                Some(_) => None,
                None => crate::oauth::signed_in(config, &host.state_dir()).await?,
            };
            let started = match signed_in {
                Some(manager) => {
                    let client = rmcp::transport::auth::AuthClient::new(client, manager);
                    start_http(handler, client, transport_config, init_timeout).await
                }
                None => start_http(handler, client, transport_config, init_timeout).await,
            };
            match started {
                Ok(Ok(service)) => (service, None),
                Ok(Err(e)) => {
                    let why = scrub_url(&e.to_string(), &config.url);
                    let lower = why.to_lowercase();
                    if lower.contains("auth required")
                        || lower.contains("401")
                        || lower.contains("unauthorized")
                    {
                        return Err(McpError(format!(
                            "{} asks for a sign-in (401 without a valid token): run agentry mcp \
                             login {}",
                            shown_url(&config.url),
                            config.name
                        )));
                    }
                    return Err(McpError(format!(
                        "{} did not start a session: {why}",
                        shown_url(&config.url),
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

    /// Calls `tool`, or goes on with a call that asked for input
    /// (`resume`); progress and log notifications go to `sink` while it
    /// runs. A server that makes the call a task is polled until the task
    /// ends or asks for input; `timeout` bounds the whole call.
    pub async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
        resume: Option<&agentry_proto::sessions::v1::McpResume>,
        timeout: Duration,
        sink: &OutputSink,
    ) -> Result<Answer, CallError> {
        let deadline = Instant::now() + timeout;
        // A deadline says the whole call's.
        let whole = |e: CallError| match e {
            CallError::Timeout(_) => CallError::Timeout(timeout),
            other => other,
        };
        let Some(resume) = resume else {
            return self
                .rounds(tool, arguments, Resume::default(), deadline, sink)
                .await
                .map_err(whole);
        };
        let state: Resume = serde_json::from_str(&resume.resume_json).map_err(|e| {
            CallError::Other(format!("the recorded way to go on cannot be read ({e})"))
        })?;
        let answers: InputResponses = if resume.cancel || resume.answers_json.is_empty() {
            InputResponses::new()
        } else {
            serde_json::from_str(&resume.answers_json).map_err(|e| {
                CallError::Other(format!("the recorded answers cannot be read ({e})"))
            })?
        };
        match state.task {
            Some(task) if resume.cancel => {
                self.cancel_task(&task).await;
                Err(CallError::Server("the call was cancelled".into()))
            }
            None if resume.cancel => Err(CallError::Server("the call was cancelled".into())),
            Some(task) => {
                let mut responses = state.auto;
                responses.extend(answers);
                let update = ClientRequest::UpdateTaskRequest(Request::new(UpdateTaskParams::new(
                    task.clone(),
                    responses,
                )));
                self.send(update, deadline, sink).await.map_err(whole)?;
                self.poll(&task, deadline, sink).await.map_err(whole)
            }
            None => {
                let mut state = state;
                state.auto.extend(answers);
                self.rounds(tool, arguments, state, deadline, sink)
                    .await
                    .map_err(whole)
            }
        }
    }

    /// `tools/call`, again with the answers while the server asks only
    /// what Agentry answers itself.
    async fn rounds(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
        mut state: Resume,
        deadline: Instant,
        sink: &OutputSink,
    ) -> Result<Answer, CallError> {
        for _ in 0..MAX_ROUNDS {
            let mut params = CallToolRequestParams::new(tool.to_string());
            params.arguments = Some(arguments.clone());
            // On 2026-07-28 a server sends log lines only for requests that
            // ask for them.
            let mut meta = RequestMetaObject::default();
            // Deprecated by the newest revision, still what servers send.
            #[allow(deprecated)]
            meta.set_log_level(rmcp::model::LoggingLevel::Info);
            params.meta = Some(meta);
            if !state.auto.is_empty() {
                params.input_responses = Some(std::mem::take(&mut state.auto));
            }
            params.request_state = state.state.take();
            let request = ClientRequest::CallToolRequest(Request::new(params));
            match self.send(request, deadline, sink).await? {
                ServerResult::CallToolResult(result) => return Ok(Answer::Done(result)),
                ServerResult::CreateTaskResult(created) => {
                    let task = created.task.task_id;
                    let _ = sink
                        .send((
                            OutputStream::Stderr,
                            format!("[the server runs the call as its task {task}]\n"),
                        ))
                        .await;
                    return self.poll(&task, deadline, sink).await;
                }
                ServerResult::InputRequiredResult(asked) => {
                    let (questions, auto) =
                        split_requests(&asked.input_requests.unwrap_or_default())?;
                    state = Resume {
                        task: None,
                        state: asked.request_state,
                        auto,
                    };
                    if !questions.is_empty() {
                        return Ok(Answer::NeedsInput {
                            questions,
                            resume_json: serde_json::to_string(&state).unwrap_or_default(),
                        });
                    }
                }
                other => {
                    return Err(CallError::Other(format!(
                        "the server answered tools/call with something else: {}",
                        clip(serde_json::to_string(&other).unwrap_or_default(), MAX_LINE)
                    )));
                }
            }
        }
        Err(CallError::Other(format!(
            "the server asked for input {MAX_ROUNDS} times in a row without finishing the call"
        )))
    }

    /// Polls the server's task until it ends or asks a person; a task
    /// left behind (the call timed out or was dropped) is cancelled.
    async fn poll(
        &self,
        task: &str,
        deadline: Instant,
        sink: &OutputSink,
    ) -> Result<Answer, CallError> {
        let mut guard = CancelTaskOnDrop {
            peer: Some(self.service.peer().clone()),
            task: task.to_string(),
        };
        let mut said = None::<String>;
        loop {
            let request = ClientRequest::GetTaskRequest(Request::new(GetTaskParams::new(task)));
            let got = match self.send(request, deadline, sink).await? {
                ServerResult::GetTaskResult(got) => got,
                other => {
                    return Err(CallError::Other(format!(
                        "the server answered tasks/get with something else: {}",
                        clip(serde_json::to_string(&other).unwrap_or_default(), MAX_LINE)
                    )));
                }
            };
            let detailed = got.task;
            if let Some(message) = &detailed.task.status_message
                && said.as_ref() != Some(message)
            {
                said = Some(message.clone());
                let line = format!("[task {task}] {}\n", clip(message.clone(), MAX_LINE));
                let _ = sink.send((OutputStream::Stderr, line)).await;
            }
            match detailed.payload {
                TaskPayload::Completed { result } => {
                    guard.peer = None;
                    return serde_json::from_value(serde_json::Value::Object(result))
                        .map(Answer::Done)
                        .map_err(|e| {
                            CallError::Other(format!(
                                "the task's result is not a tool result ({e})"
                            ))
                        });
                }
                TaskPayload::Failed { error } => {
                    guard.peer = None;
                    let message = error
                        .get("message")
                        .and_then(|m| m.as_str())
                        .unwrap_or("no reason given");
                    return Err(CallError::Server(format!("its task failed: {message}")));
                }
                TaskPayload::Cancelled => {
                    guard.peer = None;
                    return Err(CallError::Server("its task was cancelled".into()));
                }
                TaskPayload::InputRequired { input_requests } => {
                    let (questions, auto) = split_requests(&input_requests)?;
                    let state = Resume {
                        task: Some(task.to_string()),
                        state: None,
                        auto,
                    };
                    if questions.is_empty() {
                        let update = ClientRequest::UpdateTaskRequest(Request::new(
                            UpdateTaskParams::new(task, state.auto),
                        ));
                        self.send(update, deadline, sink).await?;
                        continue;
                    }
                    // The task waits for the person, however long.
                    guard.peer = None;
                    return Ok(Answer::NeedsInput {
                        questions,
                        resume_json: serde_json::to_string(&state).unwrap_or_default(),
                    });
                }
                _ => {
                    let every = Duration::from_millis(
                        detailed
                            .task
                            .poll_interval_ms
                            .unwrap_or(1000)
                            .clamp(100, 5000),
                    );
                    let now = Instant::now();
                    if now + every > deadline {
                        return Err(CallError::Timeout(deadline.saturating_duration_since(now)));
                    }
                    tokio::time::sleep(every).await;
                }
            }
        }
    }

    /// Asks the server to stop its task; whatever it answers.
    async fn cancel_task(&self, task: &str) {
        let request = ClientRequest::CancelTaskRequest(Request::new(CancelTaskParams::new(task)));
        let options = PeerRequestOptions::with_timeout(CANCEL_GRACE);
        if let Ok(handle) = self
            .service
            .peer()
            .send_request_with_option(request, options)
            .await
        {
            let _ = handle.await_response().await;
        }
    }

    /// Sends one request with the time left until `deadline`; its progress
    /// and the server's log lines go to `sink` meanwhile. A request dropped
    /// before its answer is cancelled on the server too.
    async fn send(
        &self,
        request: ClientRequest,
        deadline: Instant,
        sink: &OutputSink,
    ) -> Result<ServerResult, CallError> {
        self.touch();
        let timeout = deadline.saturating_duration_since(Instant::now());
        if timeout.is_zero() {
            return Err(CallError::Timeout(timeout));
        }
        let options = PeerRequestOptions::with_timeout(timeout);
        let mut logs = self.service.service().logs.subscribe();
        let handle = self
            .service
            .peer()
            .send_request_with_option(request, options)
            .await
            .map_err(|e| self.call_error(e))?;
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
        answer.map_err(|e| self.call_error(e))
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

/// Sends `tasks/cancel` for a task left behind (its call timed out or
/// was dropped before the task ended or asked a person).
struct CancelTaskOnDrop {
    peer: Option<rmcp::Peer<RoleClient>>,
    task: String,
}

impl Drop for CancelTaskOnDrop {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else { return };
        let task = std::mem::take(&mut self.task);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let request =
                    ClientRequest::CancelTaskRequest(Request::new(CancelTaskParams::new(task)));
                let options = PeerRequestOptions::with_timeout(CANCEL_GRACE);
                if let Ok(sent) = peer.send_request_with_option(request, options).await {
                    let _ = sent.await_response().await;
                }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn requests(value: serde_json::Value) -> InputRequests {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn questions_are_passed_on_roots_answered_and_sampling_refused() {
        let asked = requests(serde_json::json!({
            "who": {"method": "elicitation/create", "params": {
                "message": "Your name?",
                "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}
            }},
            "page": {"method": "elicitation/create", "params": {
                "mode": "url", "message": "Sign in", "url": "https://example.test/x",
                "elicitationId": "e1"
            }},
            "roots": {"method": "roots/list", "params": {}}
        }));
        let (questions, auto) = split_requests(&asked).unwrap();
        let keys: Vec<&str> = questions.iter().map(|q| q.key.as_str()).collect();
        assert_eq!(keys, ["page", "who"]);
        assert_eq!(questions[0].mode, "url");
        assert_eq!(questions[0].url, "https://example.test/x");
        assert_eq!(questions[1].mode, "form");
        assert!(questions[1].schema_json.contains("\"name\""));
        assert_eq!(auto["roots"], serde_json::json!({"roots": []}));

        let sampling = requests(serde_json::json!({
            "s": {"method": "sampling/createMessage", "params": {
                "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
                "maxTokens": 5
            }}
        }));
        let refused = split_requests(&sampling).unwrap_err();
        assert!(
            matches!(&refused, CallError::Other(why) if why.contains("sampling")),
            "{refused:?}"
        );
    }

    #[test]
    fn a_flood_of_questions_or_a_huge_one_is_bounded() {
        let mut many = serde_json::Map::new();
        for i in 0..=MAX_QUESTIONS {
            many.insert(
                format!("q{i}"),
                serde_json::json!({"method": "elicitation/create", "params": {
                    "message": "?", "requestedSchema": {"type": "object", "properties": {}}
                }}),
            );
        }
        let flood = split_requests(&requests(serde_json::Value::Object(many))).unwrap_err();
        assert!(
            matches!(&flood, CallError::Other(why) if why.contains("at most 8")),
            "{flood:?}"
        );
        let huge = requests(serde_json::json!({
            "q": {"method": "elicitation/create", "params": {
                "message": "x".repeat(MAX_QUESTION * 2),
                "requestedSchema": {"type": "object", "properties": {}}
            }}
        }));
        let (questions, _) = split_requests(&huge).unwrap();
        assert!(questions[0].message.len() <= MAX_QUESTION + '…'.len_utf8());
    }
}
