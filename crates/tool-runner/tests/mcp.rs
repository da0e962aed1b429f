//! MCP servers as tools, against real servers nobody here wrote
//! (`mcp-server-time` from PyPI) and a server written with the official
//! Python SDK (`crates/fakes/mcp/fixture_server.py`), over stdio inside the real
//! sandbox and over streamable HTTP, through the runner's gRPC service.
//!
//! The servers come from `scripts/mcp-servers.sh` (a virtualenv); without
//! it the tests skip with a message, and fail under `CI=true`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sandbox_support;
use sandbox_support::confined;

use agentry_proto::tools::v1::tool_runner_client::ToolRunnerClient;
use agentry_proto::tools::v1::{
    ExecuteRequest, ExecuteResult, ListToolsRequest, McpReadResourceRequest, McpSubscribeRequest,
    McpWatchRequest, execute_response,
};
use agentry_runtime::config::McpServerConfig;
use agentry_tool_runner::Limits;
use serde_json::json;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tokio::net::TcpListener;
use tonic::transport::Channel;

/// What the tests run: the virtualenv and a copy of the fixture server in a
/// directory every identity can read.
struct Servers {
    venv: PathBuf,
    fixture: agentry_fakes::mcp_servers::Fixture,
}

impl Servers {
    fn new() -> Option<Servers> {
        Some(Servers {
            venv: agentry_fakes::mcp_servers::venv()?,
            fixture: agentry_fakes::mcp_servers::Fixture::new().unwrap(),
        })
    }

    fn python(&self) -> String {
        self.venv.join("bin/python").display().to_string()
    }

    fn script(&self) -> String {
        self.fixture.script().display().to_string()
    }

    /// The fixture over stdio, named `name`.
    fn stdio(&self, name: &str) -> McpServerConfig {
        McpServerConfig {
            name: name.into(),
            command: self.python(),
            args: vec![self.script(), "stdio".into()],
            enabled: true,
            ..McpServerConfig::default()
        }
    }

    /// The reference time server over stdio.
    fn time(&self) -> McpServerConfig {
        McpServerConfig {
            name: "time".into(),
            command: self.venv.join("bin/mcp-server-time").display().to_string(),
            enabled: true,
            ..McpServerConfig::default()
        }
    }

    /// Starts the fixture over streamable HTTP on `port` (0: any).
    async fn http(&self, port: u16) -> HttpServer {
        let mut child = tokio::process::Command::new(self.python())
            .arg(self.script())
            .args(["http", "--port", &port.to_string()])
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let port = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(port) = line.trim().strip_prefix("listening on ") {
                    return port.trim().parse::<u16>().unwrap();
                }
            }
            panic!("the HTTP fixture ended before listening");
        })
        .await
        .expect("the HTTP fixture did not start");
        // Keep draining its stderr so it never blocks.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        HttpServer { child, port }
    }
}

struct HttpServer {
    child: tokio::process::Child,
    port: u16,
}

impl HttpServer {
    fn config(&self, name: &str) -> McpServerConfig {
        McpServerConfig {
            name: name.into(),
            url: format!("http://127.0.0.1:{}/mcp", self.port),
            enabled: true,
            ..McpServerConfig::default()
        }
    }

    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

struct Runner {
    addr: SocketAddr,
    metrics: SocketAddr,
    root: PathBuf,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), agentry_runtime::ServeError>>>,
    dir: Option<tempfile::TempDir>,
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

fn settings() -> agentry_tool_runner::mcp::Settings {
    agentry_tool_runner::mcp::Settings {
        call_timeout: Duration::from_secs(30),
        init_timeout: Duration::from_secs(30),
        idle: Duration::from_secs(600),
        max_connections: 16,
        breaker: agentry_tool_runner::web::breaker::BreakerSettings {
            failure_threshold: 3,
            open_for: Duration::from_secs(60),
        },
    }
}

impl Runner {
    async fn start(
        servers: Vec<McpServerConfig>,
        settings: agentry_tool_runner::mcp::Settings,
    ) -> Option<Runner> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Runner::start_in(dir, servers, settings).await
    }

    /// Stops the runner (its servers end with it) and hands back its
    /// directory, for a runner started again on the same workspaces.
    async fn stop(mut self) -> tempfile::TempDir {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("the runner did not stop")
            .unwrap()
            .unwrap();
        self.dir.take().unwrap()
    }

    async fn start_in(
        dir: tempfile::TempDir,
        servers: Vec<McpServerConfig>,
        settings: agentry_tool_runner::mcp::Settings,
    ) -> Option<Runner> {
        let root = dir.path().canonicalize().unwrap().join("workspaces");
        std::fs::create_dir_all(&root).unwrap();
        let sandbox = confined(&root)?;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics = metrics_listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let setup = agentry_tool_runner::Setup {
            project_roots: Vec::new(),
            workspace_root: root.clone(),
            limits: Limits {
                default_timeout: Duration::from_secs(30),
                max_timeout: Duration::from_secs(60),
                max_output_bytes: 64 * 1024,
                max_read_bytes: 256 * 1024,
                workspace_bytes: 0,
            },
            sandbox,
            web: agentry_runtime::Config::builtin().tool_runner.web.clone(),
            runner_id: "mcp-test".into(),
            metrics: Some(metrics_listener),
            mcp_servers: servers,
            mcp: settings,
            snapshots: None,
            secrets: Default::default(),
        };
        let task = tokio::spawn(async move {
            let auth = agentry_runtime::Auth::off();
            agentry_tool_runner::serve(setup, &auth, listener, async {
                let _ = rx.await;
            })
            .await
        });
        Some(Runner {
            addr,
            metrics,
            root,
            shutdown: Some(tx),
            task: Some(task),
            dir: Some(dir),
        })
    }

    async fn client(&self) -> ToolRunnerClient<Channel> {
        for _ in 0..100 {
            if let Ok(c) = ToolRunnerClient::connect(format!("http://{}", self.addr)).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("cannot connect to the runner");
    }

    /// Waits until no server is starting; returns the statuses.
    async fn settled(&self) -> Vec<agentry_proto::sessions::v1::McpServerStatus> {
        let mut client = self.client().await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let list = client
                .list_tools(ListToolsRequest::default())
                .await
                .unwrap()
                .into_inner();
            if list.mcp_servers.iter().all(|s| s.state != "starting") || Instant::now() > deadline {
                return list.mcp_servers;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn call(&self, session: &str, tool: &str, args: serde_json::Value) -> Call {
        self.execute(session, tool, args, None).await
    }

    /// A call, or one going on with `resume` (a call that asked for input).
    async fn execute(
        &self,
        session: &str,
        tool: &str,
        args: serde_json::Value,
        resume: Option<agentry_proto::sessions::v1::McpResume>,
    ) -> Call {
        let mut client = self.client().await;
        let mut stream = client
            .execute(ExecuteRequest {
                call_id: format!("c-{tool}"),
                session_id: session.into(),
                tool: tool.into(),
                arguments_json: args.to_string(),
                timeout_ms: 0,
                network: false,
                resume,
            })
            .await
            .unwrap()
            .into_inner();
        let mut live = String::new();
        let result = tokio::time::timeout(Duration::from_secs(90), async {
            while let Some(message) = stream.message().await.unwrap() {
                match message.kind {
                    Some(execute_response::Kind::Chunk(c)) => live.push_str(&c.text),
                    Some(execute_response::Kind::Result(r)) => return r,
                    None => {}
                }
            }
            panic!("the call ended without a result");
        })
        .await
        .expect("the call did not finish");
        Call { live, result }
    }
}

/// Kills the stdio server processes working in `session`'s workspace (as
/// an outside event would: no call in flight); returns how many.
fn kill_session_servers(root: &Path, session: &str) -> usize {
    let workspace = root.join(session);
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if !cmdline.contains("fixture_server.py") || cmdline.contains("agentry-sandbox") {
            continue;
        }
        if std::fs::read_link(entry.path().join("cwd")).ok().as_deref() == Some(workspace.as_path())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            killed += 1;
        }
    }
    killed
}

struct Call {
    live: String,
    result: ExecuteResult,
}

impl Call {
    fn ok(&self) -> &str {
        assert!(
            !self.result.is_error,
            "the call failed: {}",
            self.result.output
        );
        &self.result.output
    }

    fn err(&self) -> &str {
        assert!(
            self.result.is_error,
            "the call should have failed: {}",
            self.result.output
        );
        &self.result.output
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_and_http_servers_offer_their_tools_and_answer() {
    let Some(servers) = Servers::new() else {
        return;
    };
    let http = servers.http(0).await;
    // fx speaks only the handshake era (as servers written before
    // 2026-07-28 do); web and time the newest revision.
    let legacy = McpServerConfig {
        env: [("FIXTURE_LEGACY".to_string(), "1".to_string())].into(),
        ..servers.stdio("fx")
    };
    let Some(runner) =
        Runner::start(vec![servers.time(), legacy, http.config("web")], settings()).await
    else {
        return;
    };
    let statuses = runner.settled().await;
    for s in &statuses {
        assert_eq!(s.state, "ready", "{s:?}");
        assert!(s.tool_count > 0, "{s:?}");
    }
    let transports: Vec<(&str, &str)> = statuses
        .iter()
        .map(|s| (s.name.as_str(), s.transport.as_str()))
        .collect();
    assert_eq!(
        transports,
        [("fx", "stdio"), ("time", "stdio"), ("web", "http")]
    );

    let tools = runner
        .client()
        .await
        .list_tools(ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .tools;
    let time = tools
        .iter()
        .find(|t| t.name == "time__get_current_time")
        .expect("the time server's tool is offered");
    assert_eq!(time.mcp_server, "time");
    assert!(time.read_only_hint, "mcp-server-time marks it read-only");
    assert!(
        !time.read_only && time.sensitive,
        "a server's word never makes a tool read-only"
    );
    assert!(time.parameters_json_schema.contains("timezone"));
    assert!(tools.iter().any(|t| t.name == "web__echo"));
    assert!(tools.iter().any(|t| t.name == "bash"), "own tools stay");

    // The real reference server answers.
    let call = runner
        .call("s1", "time__get_current_time", json!({"timezone": "UTC"}))
        .await;
    let answer: serde_json::Value = serde_json::from_str(call.ok()).unwrap();
    assert_eq!(answer["timezone"], "UTC");
    assert!(answer["datetime"].as_str().unwrap().ends_with("+00:00"));
    // Its errors reach the model as errors.
    let call = runner
        .call(
            "s1",
            "time__get_current_time",
            json!({"timezone": "Mars/Olympus"}),
        )
        .await;
    assert!(call.err().contains("Invalid timezone"), "{}", call.err());

    // Every kind of content, over both transports.
    assert_eq!(
        runner
            .call("s1", "fx__echo", json!({"text": "hi"}))
            .await
            .ok(),
        "echo: hi"
    );
    assert_eq!(
        runner
            .call("s1", "web__echo", json!({"text": "hi"}))
            .await
            .ok(),
        "echo: hi"
    );
    let sum = runner.call("s1", "web__add", json!({"a": 2, "b": 3})).await;
    assert!(sum.ok().contains("\"sum\": 5"), "{}", sum.ok());
    let image = runner.call("s1", "fx__image", json!({})).await;
    assert!(image.ok().contains("[image: image/png"), "{}", image.ok());
    let resource = runner.call("s1", "fx__resource", json!({})).await;
    assert!(
        resource
            .ok()
            .contains("[resource fixture://readme (text/plain)]\nfixture readme"),
        "{}",
        resource.ok()
    );
    let failed = runner
        .call("s1", "fx__fail", json!({"message": "it broke"}))
        .await;
    assert!(failed.err().contains("it broke"));

    // Progress and log notifications stream while the call runs.
    for tool in ["fx__slow", "web__slow"] {
        let slow = runner.call("s1", tool, json!({"seconds": 0.6})).await;
        assert!(slow.ok().contains("slept 0.6"), "{}", slow.ok());
        assert!(
            slow.live.contains("[progress 1/3] step 1/3"),
            "{tool}: {}",
            slow.live
        );
        assert!(
            slow.live.contains("[info] fixture: slow: step"),
            "{tool}: {}",
            slow.live
        );
    }

    // Bad arguments and unknown tools are the model's to correct.
    let bad = runner.call("s1", "fx__echo", json!([1])).await;
    assert!(bad.err().contains("must be a JSON object"), "{}", bad.err());
    let unknown = runner.call("s1", "fx__nope", json!({})).await;
    assert!(unknown.err().contains("fx__echo"), "{}", unknown.err());

    // The servers' health and counters are metrics.
    let page = reqwest::get(format!("http://{}/metrics", runner.metrics))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "agentry_mcp_server_up{runner=\"mcp-test\",server=\"time\"} 1",
        "agentry_mcp_server_up{runner=\"mcp-test\",server=\"web\"} 1",
        "agentry_mcp_calls_total{runner=\"mcp-test\",server=\"time\"} 2",
        "agentry_mcp_failures_total{runner=\"mcp-test\",server=\"fx\"} 0",
    ] {
        assert!(page.contains(line), "{line} not in:\n{page}");
    }
    http.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_servers_run_per_session_inside_its_sandbox() {
    let Some(servers) = Servers::new() else {
        return;
    };
    let fx = McpServerConfig {
        env: [("FIXTURE_SECRET".to_string(), "s3cr3t-t0ken-9".to_string())].into(),
        ..servers.stdio("fx")
    };
    let Some(runner) = Runner::start(vec![fx], settings()).await else {
        return;
    };
    runner.settled().await;
    // The server's environment is on no command line any user can read,
    // and the file that carried it to the sandbox is gone.
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            assert!(
                !String::from_utf8_lossy(&cmdline).contains("s3cr3t-t0ken-9"),
                "{}",
                String::from_utf8_lossy(&cmdline)
            );
        }
    }
    let specs = runner.root.join(".tmp/.mcp-specs");
    assert_eq!(std::fs::read_dir(&specs).unwrap().count(), 0);
    let who = runner.call("s1", "fx__whoami", json!({})).await;
    let ws = runner.root.join("s1").display().to_string();
    // HOME is the session's temp dir, never the workspace.
    let tmp = runner.root.join(".tmp/s1").display().to_string();
    assert!(
        who.ok().contains(&format!("cwd={ws} home={tmp}")),
        "{}",
        who.ok()
    );
    if nix::unistd::geteuid().is_root() {
        assert!(!who.ok().contains("uid=0 "), "{}", who.ok());
    }
    let other = runner.call("s2", "fx__whoami", json!({})).await;
    assert!(other.ok().contains("/s2 "), "{}", other.ok());
    let pid1 = runner
        .call("s1", "fx__pid", json!({}))
        .await
        .ok()
        .to_string();
    let pid2 = runner
        .call("s2", "fx__pid", json!({}))
        .await
        .ok()
        .to_string();
    assert_ne!(pid1, pid2, "each session has its own server process");
    assert_eq!(
        runner.call("s1", "fx__pid", json!({})).await.ok(),
        pid1,
        "a session keeps its process between calls"
    );
    let statuses = runner.settled().await;
    assert_eq!(statuses[0].connections, 3, "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_mid_call_is_started_again() {
    let Some(servers) = Servers::new() else {
        return;
    };
    let Some(runner) = Runner::start(vec![servers.stdio("fx")], settings()).await else {
        return;
    };
    runner.settled().await;
    let before = runner
        .call("s1", "fx__pid", json!({}))
        .await
        .ok()
        .to_string();
    let crash = runner.call("s1", "fx__crash", json!({})).await;
    assert!(
        crash.err().contains("went away during the call") && crash.err().contains("unknown"),
        "{}",
        crash.err()
    );
    let after = runner
        .call("s1", "fx__pid", json!({}))
        .await
        .ok()
        .to_string();
    assert_ne!(before, after, "a new process serves the next call");
    let statuses = runner.settled().await;
    assert!(statuses[0].failures >= 1, "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_call_hits_its_deadline_and_the_server_goes_on() {
    let Some(servers) = Servers::new() else {
        return;
    };
    let fx = McpServerConfig {
        timeout_secs: 2,
        ..servers.stdio("fx")
    };
    let Some(runner) = Runner::start(vec![fx], settings()).await else {
        return;
    };
    runner.settled().await;
    let started = Instant::now();
    let hang = runner.call("s1", "fx__hang", json!({})).await;
    assert!(hang.result.timed_out, "{}", hang.result.output);
    assert!(hang.err().contains("timed out after 2s"), "{}", hang.err());
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        runner
            .call("s1", "fx__echo", json!({"text": "still here"}))
            .await
            .ok(),
        "echo: still here"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_start_says_why() {
    let Some(servers) = Servers::new() else {
        return;
    };
    let broken = McpServerConfig {
        name: "broken".into(),
        command: servers.python(),
        args: vec![
            "-c".into(),
            "import sys; print('no such server', file=sys.stderr); sys.exit(4)".into(),
        ],
        enabled: true,
        ..McpServerConfig::default()
    };
    let mut s = settings();
    s.breaker.failure_threshold = 2;
    let Some(runner) = Runner::start(vec![broken], s).await else {
        return;
    };
    let statuses = runner.settled().await;
    assert_eq!(statuses[0].state, "failed", "{statuses:?}");
    assert!(statuses[0].error.contains("no such server"), "{statuses:?}");
    // Its tools are not offered; a call naming one is refused.
    let call = runner.call("s1", "broken__anything", json!({})).await;
    assert!(call.err().contains("offers no tools"), "{}", call.err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_that_restarts_serves_the_next_call() {
    let Some(servers) = Servers::new() else {
        return;
    };
    let http = servers.http(0).await;
    let port = http.port;
    let Some(runner) = Runner::start(vec![http.config("web")], settings()).await else {
        return;
    };
    runner.settled().await;
    let before = runner
        .call("s1", "web__pid", json!({}))
        .await
        .ok()
        .to_string();
    http.kill().await;
    let down = runner.call("s1", "web__echo", json!({"text": "x"})).await;
    down.err();
    let http = servers.http(port).await;
    let mut answer = None;
    for _ in 0..20 {
        let call = runner.call("s1", "web__pid", json!({})).await;
        if !call.result.is_error {
            answer = Some(call.result.output);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let after = answer.expect("the restarted server never answered");
    assert_ne!(before, after);
    // A tool list change on the server reaches the catalog.
    runner.call("s1", "web__add_tool", json!({})).await.ok();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let tools = runner
            .client()
            .await
            .list_tools(ListToolsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .tools;
        if tools.iter().any(|t| t.name == "web__late") {
            break;
        }
        assert!(Instant::now() < deadline, "web__late never appeared");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        runner.call("s1", "web__late", json!({"x": "y"})).await.ok(),
        "late: y"
    );
    http.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failures_open_the_circuit() {
    let Some(servers) = Servers::new() else {
        return;
    };
    let mut s = settings();
    s.breaker.failure_threshold = 2;
    let Some(runner) = Runner::start(vec![servers.stdio("fx")], s).await else {
        return;
    };
    runner.settled().await;
    for _ in 0..2 {
        runner.call("s1", "fx__crash", json!({})).await.err();
    }
    let refused = runner.call("s1", "fx__echo", json!({"text": "x"})).await;
    assert!(refused.err().contains("circuit open"), "{}", refused.err());
    let statuses = runner.settled().await;
    assert_eq!(statuses[0].state, "circuit open", "{statuses:?}");
}

/// Watches the runner's resource updates, acknowledging each one received.
struct Watch {
    acks: tokio::sync::mpsc::Sender<McpWatchRequest>,
    updates: tonic::Streaming<agentry_proto::tools::v1::McpResourceUpdate>,
}

impl Watch {
    async fn open(runner: &Runner) -> Watch {
        let (acks, rx) = tokio::sync::mpsc::channel(16);
        acks.send(McpWatchRequest {
            consumer: "test".into(),
            ..McpWatchRequest::default()
        })
        .await
        .unwrap();
        let updates = runner
            .client()
            .await
            .mcp_watch(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Watch { acks, updates }
    }

    /// The next update (acknowledged), within `wait`.
    async fn next(
        &mut self,
        wait: Duration,
    ) -> Option<agentry_proto::tools::v1::McpResourceUpdate> {
        let update = tokio::time::timeout(wait, self.updates.message())
            .await
            .ok()?
            .unwrap()?;
        self.acks
            .send(McpWatchRequest {
                acks: vec![update.id.clone()],
                ..McpWatchRequest::default()
            })
            .await
            .unwrap();
        Some(update)
    }
}

/// Writes the watched file until an update with `content` arrives (the
/// fixture polls it every 100 ms; an update sent before the subscription
/// was in place is lost, as servers do).
async fn write_until_update(
    file: &Path,
    content: &str,
    watch: &mut Watch,
) -> agentry_proto::tools::v1::McpResourceUpdate {
    for attempt in 0..40 {
        std::fs::write(file, format!("{content}{}", " ".repeat(attempt % 2))).unwrap();
        while let Some(update) = watch.next(Duration::from_millis(500)).await {
            if update.content.trim_end() == content {
                return update;
            }
        }
    }
    panic!("no update with {content:?} arrived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribed_resources_send_updates_that_survive_a_restart() {
    let Some(servers) = Servers::new() else {
        return;
    };
    let fx = McpServerConfig {
        env: [("FIXTURE_WATCH_FILE".to_string(), "note.txt".to_string())].into(),
        ..servers.stdio("fx")
    };
    let Some(runner) = Runner::start(vec![fx.clone()], settings()).await else {
        return;
    };
    runner.settled().await;
    let mut client = runner.client().await;
    let subscribed = client
        .mcp_subscribe(McpSubscribeRequest {
            session_id: "s1".into(),
            server: "fx".into(),
            uri: "watch://file".into(),
            unsubscribe: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(subscribed.uris, ["watch://file"]);
    // Unknown servers and bad session ids are refused.
    let err = client
        .mcp_subscribe(McpSubscribeRequest {
            session_id: "s1".into(),
            server: "nope".into(),
            uri: "watch://file".into(),
            unsubscribe: false,
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("no MCP server is named"), "{err:?}");
    let err = client
        .mcp_subscribe(McpSubscribeRequest {
            session_id: "../x".into(),
            server: "fx".into(),
            uri: "watch://file".into(),
            unsubscribe: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    let file = runner.root.join("s1").join("note.txt");
    let mut watch = Watch::open(&runner).await;
    let first = write_until_update(&file, "first", &mut watch).await;
    assert_eq!(
        (
            first.session_id.as_str(),
            first.server.as_str(),
            first.uri.as_str()
        ),
        ("s1", "fx", "watch://file")
    );
    let second = write_until_update(&file, "second", &mut watch).await;
    assert_ne!(first.id, second.id, "new content, new id");

    // The server dies: the runner starts it again and subscribes again.
    assert_eq!(kill_session_servers(&runner.root, "s1"), 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let revived = write_until_update(&file, "after the crash", &mut watch).await;
    assert_eq!(revived.uri, "watch://file");
    let back = write_until_update(&file, "second", &mut watch).await;
    assert_eq!(back.id, second.id, "the same content, the same id");

    // The resource reads as the session.
    let read = client
        .mcp_read_resource(McpReadResourceRequest {
            session_id: "s1".into(),
            server: "fx".into(),
            uri: "watch://file".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.text.trim_end(), "second");

    // A runner started again on the same workspaces subscribes again.
    let dir = runner.stop().await;
    let runner = Runner::start_in(dir, vec![fx], settings()).await.unwrap();
    let mut watch = Watch::open(&runner).await;
    let third = write_until_update(&file, "third", &mut watch).await;
    assert_eq!(third.session_id, "s1");

    // Unsubscribed: no more updates.
    let left = runner
        .client()
        .await
        .mcp_subscribe(McpSubscribeRequest {
            session_id: "s1".into(),
            server: "fx".into(),
            uri: "watch://file".into(),
            unsubscribe: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(left.uris.is_empty());
    std::fs::write(&file, "fourth").unwrap();
    assert!(watch.next(Duration::from_secs(2)).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_git_server_reads_a_repository_in_the_workspace() {
    let Some(servers) = Servers::new() else {
        return;
    };
    let git = McpServerConfig {
        name: "git".into(),
        command: servers
            .venv
            .join("bin/mcp-server-git")
            .display()
            .to_string(),
        enabled: true,
        ..McpServerConfig::default()
    };
    let Some(runner) = Runner::start(vec![git], settings()).await else {
        return;
    };
    let statuses = runner.settled().await;
    assert_eq!(statuses[0].state, "ready", "{statuses:?}");
    // The repository is made by the session itself (its files belong to
    // the session's identity, as git requires).
    let made = runner
        .call(
            "s1",
            "bash",
            json!({"command": "git init -q -b main && echo hello > a.txt && git add a.txt && \
                   git -c user.email=t@example.org -c user.name=t commit -qm 'first commit' && echo made"}),
        )
        .await;
    assert!(made.ok().contains("made"), "{}", made.ok());
    let log = runner
        .call("s1", "git__git_log", json!({"repo_path": "."}))
        .await;
    assert!(log.ok().contains("first commit"), "{}", log.ok());
    let status = runner
        .call("s1", "git__git_status", json!({"repo_path": "."}))
        .await;
    assert!(status.ok().contains("On branch main"), "{}", status.ok());
    // Another session's workspace is out of the server's reach.
    let other = runner
        .call("s2", "git__git_status", json!({"repo_path": "../s1"}))
        .await;
    assert!(other.result.is_error, "{}", other.result.output);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_servers_get_the_configured_headers_and_bearer_token() {
    // A listener that records the first request and hangs up: what the
    // client sends with its first request is what every request carries.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel::<String>();
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 16 * 1024];
        let n = socket.read(&mut buf).await.unwrap_or(0);
        let _ = seen_tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
    });
    let server = McpServerConfig {
        name: "remote".into(),
        url: format!("http://user:pw@127.0.0.1:{port}/mcp?key=query-secret"),
        headers: [("X-Team".to_string(), "infra".to_string())].into(),
        bearer_token: "tok-123".into(),
        enabled: true,
        ..McpServerConfig::default()
    };
    let Some(runner) = Runner::start(vec![server], settings()).await else {
        return;
    };
    let request = tokio::time::timeout(Duration::from_secs(20), seen_rx)
        .await
        .expect("no request reached the server")
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        request.starts_with("post /mcp?key=query-secret "),
        "{request}"
    );
    assert!(
        request.contains("authorization: bearer tok-123"),
        "{request}"
    );
    assert!(request.contains("x-team: infra"), "{request}");
    // The newest revision first: `server/discover`, no handshake.
    assert!(
        request.contains("\"method\":\"server/discover\""),
        "{request}"
    );
    // The failure says why without the URL's secrets.
    let statuses = runner.settled().await;
    assert_eq!(statuses[0].state, "failed", "{statuses:?}");
    assert!(
        !statuses[0].error.contains("query-secret") && !statuses[0].error.contains("pw@"),
        "{statuses:?}"
    );
}

fn answering(
    asked: &agentry_proto::sessions::v1::McpInputRequested,
    action: &str,
    content: serde_json::Value,
) -> Option<agentry_proto::sessions::v1::McpResume> {
    Some(agentry_proto::sessions::v1::McpResume {
        resume_json: asked.resume_json.clone(),
        answers_json: agentry_agent::questions::answers(asked, action, &content.to_string())
            .unwrap(),
        cancel: false,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_of_a_server_come_back_to_be_answered_and_the_call_goes_on() {
    let Some(venv) = agentry_fakes::mcp_servers::venv() else {
        return;
    };
    let asking = agentry_fakes::mcp_servers::HttpFixture::asking(&venv).unwrap();
    let server = McpServerConfig {
        name: "ask".into(),
        url: asking.url(),
        enabled: true,
        ..McpServerConfig::default()
    };
    let Some(runner) = Runner::start(vec![server], settings()).await else {
        return;
    };
    let statuses = runner.settled().await;
    assert_eq!(statuses[0].state, "ready", "{statuses:?}");

    // A task that asks with a form: the call returns the question (not a
    // result), and the task waits on the server.
    let args = json!({"target": "web"});
    let first = runner.call("s1", "ask__deploy", args.clone()).await;
    let asked = first
        .result
        .input_required
        .clone()
        .unwrap_or_else(|| panic!("no question: {:?}", first.result));
    assert_eq!(asked.server, "ask");
    assert_eq!(asked.call_id, "c-ask__deploy");
    assert_eq!(asked.questions.len(), 1, "{asked:?}");
    let q = &asked.questions[0];
    assert_eq!((q.key.as_str(), q.mode.as_str()), ("approval", "form"));
    assert!(q.message.contains("Deploy web"), "{q:?}");
    assert!(q.schema_json.contains("confirm"), "{q:?}");
    assert!(first.live.contains("as its task task-"), "{}", first.live);
    let task = asked.resume_json.clone();
    assert!(task.contains("\"task\""), "{task}");
    let tasks = asking.get_json("/state");
    assert!(
        tasks
            .as_object()
            .unwrap()
            .values()
            .any(|t| t["status"] == "input_required"),
        "{tasks}"
    );
    // Answered, the task goes on and its result is the call's.
    let done = runner
        .execute(
            "s1",
            "ask__deploy",
            args.clone(),
            answering(&asked, "accept", json!({"confirm": true, "note": "go"})),
        )
        .await;
    assert_eq!(done.ok(), "deployed web (note: go)");

    // The stateless round trip: a form…
    let greet = runner.call("s1", "ask__greet", json!({})).await;
    let asked = greet.result.input_required.clone().expect("greet asks");
    assert_eq!(asked.questions[0].mode, "form");
    assert!(asked.questions[0].message.contains("name"), "{asked:?}");
    let hello = runner
        .execute(
            "s1",
            "ask__greet",
            json!({}),
            answering(&asked, "accept", json!({"name": "Ada"})),
        )
        .await;
    assert!(hello.ok().starts_with("hello Ada"), "{}", hello.ok());

    // …and a page to visit, whose request state comes back with the answer.
    let visit = runner.call("s1", "ask__visit", json!({})).await;
    let asked = visit.result.input_required.clone().expect("visit asks");
    assert_eq!(asked.questions[0].mode, "url");
    assert_eq!(
        asked.questions[0].url,
        "https://auth.example.test/consent?session=42"
    );
    let declined = runner
        .execute(
            "s1",
            "ask__visit",
            json!({}),
            answering(&asked, "decline", json!({})),
        )
        .await;
    assert_eq!(declined.ok(), "not visited (decline)");

    // A call stopped while its task waits: the server's task is cancelled.
    let second = runner
        .call("s1", "ask__deploy", json!({"target": "db"}))
        .await;
    let asked = second.result.input_required.clone().expect("deploy asks");
    let stopped = runner
        .execute(
            "s1",
            "ask__deploy",
            json!({"target": "db"}),
            Some(agentry_proto::sessions::v1::McpResume {
                resume_json: asked.resume_json.clone(),
                answers_json: String::new(),
                cancel: true,
            }),
        )
        .await;
    assert!(stopped.err().contains("stopped"), "{}", stopped.err());
    let tasks = asking.get_json("/state");
    assert!(
        tasks
            .as_object()
            .unwrap()
            .values()
            .any(|t| t["target"] == "db" && t["status"] == "cancelled"),
        "{tasks}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_own_servers_serve_that_session_alone_and_must_be_public() {
    let Some(servers) = Servers::new() else {
        return;
    };
    // No configured server: a session brings its own.
    let Some(runner) = Runner::start(Vec::new(), settings()).await else {
        return;
    };
    let mut client = runner.client().await;
    let own = agentry_proto::tools::v1::McpSessionServer {
        name: "mine".into(),
        command: servers.python(),
        args: vec![servers.script(), "stdio".into()],
        ..Default::default()
    };
    let set = client
        .mcp_session_servers(agentry_proto::tools::v1::McpSessionServersRequest {
            session_id: "s1".into(),
            servers: vec![own],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(set.errors.is_empty(), "{:?}", set.errors);
    assert!(set.tools.iter().any(|t| t.name == "mine__echo"), "{set:?}");
    let lister = client.clone();
    let listed = |session: &str| {
        let mut client = lister.clone();
        let session = session.to_string();
        async move {
            client
                .list_tools(ListToolsRequest {
                    session_id: session,
                })
                .await
                .unwrap()
                .into_inner()
                .tools
                .into_iter()
                .map(|t| t.name)
                .collect::<Vec<_>>()
        }
    };
    assert!(listed("s1").await.contains(&"mine__echo".to_string()));
    assert!(!listed("s2").await.contains(&"mine__echo".to_string()));
    assert!(!listed("").await.contains(&"mine__echo".to_string()));
    // Its calls run for that session; another session has no such tool.
    let echoed = runner.call("s1", "mine__echo", json!({"text": "hi"})).await;
    assert_eq!(echoed.ok(), "echo: hi");
    let elsewhere = runner.call("s2", "mine__echo", json!({"text": "hi"})).await;
    assert!(
        elsewhere.err().contains("mine__echo"),
        "{}",
        elsewhere.err()
    );

    // An HTTP server of a session's at an internal address is refused,
    // and nothing changes.
    let internal = client
        .mcp_session_servers(agentry_proto::tools::v1::McpSessionServersRequest {
            session_id: "s1".into(),
            servers: vec![agentry_proto::tools::v1::McpSessionServer {
                name: "inside".into(),
                url: "http://169.254.169.254/mcp".into(),
                ..Default::default()
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(internal.code(), tonic::Code::InvalidArgument);
    assert!(internal.message().contains("allow_hosts"), "{internal:?}");
    assert!(listed("s1").await.contains(&"mine__echo".to_string()));
}
