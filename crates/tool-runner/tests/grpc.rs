#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Integration tests of the tool runner over real gRPC on 127.0.0.1.

use agentry_proto::sessions::v1::OutputStream;
use agentry_proto::tools::v1::tool_runner_client::ToolRunnerClient;
use agentry_proto::tools::v1::{
    ExecuteRequest, ExecuteResult, ListToolsRequest, OutputChunk, execute_response,
};
use agentry_tool_runner::Limits;
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const RUNNER_ID: &str = "runner-under-test";
/// No single call in these tests may take longer than this.
const CALL_DEADLINE: Duration = Duration::from_secs(30);

/// Generous limits, for tests that do not exercise a limit.
fn default_limits() -> Limits {
    Limits {
        default_timeout: Duration::from_secs(60),
        max_timeout: Duration::from_secs(120),
        max_output_bytes: 64 * 1024,
        max_read_bytes: 256 * 1024,
        workspace_bytes: 0,
    }
}

/// Small limits, for the tests that exercise them.
fn small_limits() -> Limits {
    Limits {
        default_timeout: Duration::from_secs(60),
        max_timeout: Duration::from_secs(2),
        max_output_bytes: 100,
        max_read_bytes: 1024,
        workspace_bytes: 0,
    }
}

/// A tool runner served on an ephemeral port, with its own workspace root.
struct Runner {
    addr: SocketAddr,
    /// The canonical workspace root (session workspaces live below it).
    root: PathBuf,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), agentry_runtime::ServeError>>>,
    _dir: tempfile::TempDir,
}

impl Runner {
    async fn start(limits: Limits) -> Runner {
        let dir = tempfile::tempdir().unwrap();
        // `run` creates the root itself; make it a directory that does not exist yet.
        let root = dir.path().canonicalize().unwrap().join("workspaces");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let web = agentry_runtime::Config::load(&agentry_runtime::ConfigSource::default())
            .unwrap()
            .tool_runner
            .web;
        let task_root = root.clone();
        let task = tokio::spawn(async move {
            // On loopback, without credentials: those are tested with the
            // whole cluster.
            let auth = agentry_runtime::Auth::off();
            let setup = agentry_tool_runner::Setup {
                project_roots: Vec::new(),
                mcp_servers: Vec::new(),
                mcp: agentry_tool_runner::mcp::Settings::default(),
                snapshots: None,
                workspace_root: task_root,
                limits,
                sandbox: agentry_tool_runner::sandbox::Sandbox::unconfined(),
                web,
                runner_id: RUNNER_ID.to_string(),
                metrics: None,
                secrets: Default::default(),
            };
            agentry_tool_runner::serve(setup, &auth, listener, async {
                let _ = rx.await;
            })
            .await
        });
        Runner {
            addr,
            root,
            shutdown: Some(tx),
            task: Some(task),
            _dir: dir,
        }
    }

    async fn client(&self) -> ToolRunnerClient<Channel> {
        tokio::time::timeout(
            Duration::from_secs(10),
            ToolRunnerClient::connect(format!("http://{}", self.addr)),
        )
        .await
        .expect("connecting timed out")
        .expect("cannot connect to the runner")
    }

    /// The workspace directory of `session`.
    fn workspace(&self, session: &str) -> PathBuf {
        self.root.join(session)
    }

    /// Stops the server through its shutdown future and checks it ends cleanly.
    async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let task = self.task.take().unwrap();
        let result = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the runner did not stop in time")
            .expect("the runner task panicked");
        assert!(result.is_ok(), "the runner stopped with {result:?}");
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A whole Execute stream: the chunks, then its final result.
#[derive(Debug)]
struct Outcome {
    chunks: Vec<OutputChunk>,
    result: ExecuteResult,
    elapsed: Duration,
}

impl Outcome {
    /// The concatenated text of the chunks from `stream`.
    fn streamed(&self, stream: OutputStream) -> String {
        self.chunks
            .iter()
            .filter(|c| c.stream() == stream)
            .map(|c| c.text.as_str())
            .collect()
    }
}

fn request(session: &str, tool: &str, arguments_json: &str) -> ExecuteRequest {
    ExecuteRequest {
        call_id: format!("call-{tool}"),
        session_id: session.to_string(),
        tool: tool.to_string(),
        arguments_json: arguments_json.to_string(),
        timeout_ms: 0,
        network: false,
        resume: None,
    }
}

/// Runs a call to the end and checks the stream's shape: chunks only, then
/// exactly one result, last, from this runner.
async fn execute_request(client: &mut ToolRunnerClient<Channel>, req: ExecuteRequest) -> Outcome {
    let started = Instant::now();
    let messages = tokio::time::timeout(CALL_DEADLINE, async {
        let mut stream = client
            .execute(req)
            .await
            .expect("Execute failed")
            .into_inner();
        let mut messages = Vec::new();
        while let Some(message) = stream.message().await.expect("the stream failed") {
            messages.push(message);
        }
        messages
    })
    .await
    .expect("the call did not finish in time");
    let elapsed = started.elapsed();
    let (last, rest) = messages.split_last().expect("the stream was empty");
    let result = match &last.kind {
        Some(execute_response::Kind::Result(r)) => r.clone(),
        other => panic!("the last message is not the result: {other:?}"),
    };
    let chunks = rest
        .iter()
        .map(|m| match &m.kind {
            Some(execute_response::Kind::Chunk(c)) => c.clone(),
            other => panic!("a message before the end is not a chunk: {other:?}"),
        })
        .collect();
    assert_eq!(result.runner_id, RUNNER_ID);
    Outcome {
        chunks,
        result,
        elapsed,
    }
}

async fn execute(
    client: &mut ToolRunnerClient<Channel>,
    session: &str,
    tool: &str,
    arguments: serde_json::Value,
) -> Outcome {
    execute_request(client, request(session, tool, &arguments.to_string())).await
}

async fn bash(client: &mut ToolRunnerClient<Channel>, session: &str, command: &str) -> Outcome {
    execute(client, session, "bash", json!({ "command": command })).await
}

async fn read_file(
    client: &mut ToolRunnerClient<Channel>,
    session: &str,
    arguments: serde_json::Value,
) -> ExecuteResult {
    execute(client, session, "read_file", arguments)
        .await
        .result
}

async fn write_file(
    client: &mut ToolRunnerClient<Channel>,
    session: &str,
    path: &str,
    content: &str,
) -> ExecuteResult {
    execute(
        client,
        session,
        "write_file",
        json!({ "path": path, "content": content }),
    )
    .await
    .result
}

/// Asserts a successful result and returns its output.
#[track_caller]
fn ok_output(result: &ExecuteResult) -> &str {
    assert!(!result.is_error, "the call failed: {result:?}");
    &result.output
}

/// Asserts an error result whose output mentions `needle`.
#[track_caller]
fn assert_error_mentions(result: &ExecuteResult, needle: &str) {
    assert!(result.is_error, "expected an error result, got {result:?}");
    assert!(
        result.output.contains(needle),
        "the error {:?} does not mention {needle:?}",
        result.output
    );
}

/// Whether `pid` is a live process. A zombie counts as dead: it no longer
/// runs, and whether it is reaped depends on this machine's init process.
fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            !matches!(state, Some("Z" | "X" | "x"))
        }
        Err(_) => false,
    }
}

/// Waits up to 5 s for `pid` to be gone.
async fn wait_gone(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if !process_alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    !process_alive(pid)
}

/// Waits for a file holding a pid to appear, then returns the pid.
async fn read_pid_file(path: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse::<i32>()
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no pid in {} after 10 s",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------
// ListTools
// ---------------------------------------------------------------------------

#[tokio::test]
async fn list_tools_describes_every_tool_with_its_flags_and_schema() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let response = client
        .list_tools(ListToolsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.runner_id, RUNNER_ID);
    let names: Vec<&str> = response.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "bash",
            "edit_file",
            "glob",
            "grep",
            "list_dir",
            "read_file",
            "web_crawl",
            "web_fetch",
            "write_file"
        ],
        "sorted by name"
    );

    for tool in &response.tools {
        assert!(
            !tool.description.trim().is_empty(),
            "{} has no description",
            tool.name
        );
        let schema: serde_json::Value = serde_json::from_str(&tool.parameters_json_schema)
            .unwrap_or_else(|e| panic!("schema of {} is not JSON: {e}", tool.name));
        assert_eq!(schema["type"], "object", "{}", tool.name);
        assert_eq!(schema["additionalProperties"], false, "{}", tool.name);
        let properties = schema["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("schema of {} has no properties", tool.name));
        // Tools whose arguments are all optional may leave `required` out.
        let required = schema["required"].as_array().cloned().unwrap_or_default();
        for r in &required {
            let r = r.as_str().unwrap();
            assert!(
                properties.contains_key(r),
                "{}: required {r} is not a property",
                tool.name
            );
        }
        for (name, property) in properties {
            assert!(
                property["type"].is_string(),
                "{}.{name} has no type",
                tool.name
            );
        }
    }

    let by_name = |name: &str| response.tools.iter().find(|t| t.name == name).unwrap();
    let bash = by_name("bash");
    assert!(
        !bash.read_only && !bash.parallel_safe && bash.sensitive,
        "{bash:?}"
    );
    let read = by_name("read_file");
    assert!(
        read.read_only && read.parallel_safe && !read.sensitive,
        "{read:?}"
    );
    for name in ["write_file", "edit_file"] {
        let t = by_name(name);
        assert!(!t.read_only && !t.parallel_safe && t.sensitive, "{t:?}");
    }
    for name in ["list_dir", "glob", "grep", "web_fetch", "web_crawl"] {
        let t = by_name(name);
        assert!(t.read_only && t.parallel_safe && !t.sensitive, "{t:?}");
    }

    let required = |name: &str| -> Vec<String> {
        let schema: serde_json::Value =
            serde_json::from_str(&by_name(name).parameters_json_schema).unwrap();
        serde_json::from_value(schema["required"].clone()).unwrap()
    };
    assert_eq!(required("bash"), ["command"]);
    assert_eq!(required("read_file"), ["path"]);
    assert_eq!(required("write_file"), ["path", "content"]);

    drop(client);
    runner.stop().await;
}

// ---------------------------------------------------------------------------
// bash
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_streams_stdout_and_ends_with_one_result() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let out = bash(&mut client, "s1", "echo $((6*7))").await;
    assert_eq!(out.streamed(OutputStream::Stdout), "42\n");
    assert_eq!(out.streamed(OutputStream::Stderr), "");
    assert!(
        out.chunks
            .iter()
            .all(|c| c.stream() == OutputStream::Stdout),
        "{:?}",
        out.chunks
    );
    let r = &out.result;
    assert_eq!(r.output, "42\n");
    assert!(!r.is_error);
    assert_eq!(r.exit_code, Some(0));
    assert!(!r.truncated && !r.timed_out);
    assert!(
        u128::from(r.duration_ms) <= out.elapsed.as_millis(),
        "duration {} ms is longer than the whole call ({:?})",
        r.duration_ms,
        out.elapsed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_reports_its_duration() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let out = bash(&mut client, "s1", "sleep 0.3; echo done").await;
    assert_eq!(ok_output(&out.result), "done\n");
    assert!(
        out.result.duration_ms >= 300,
        "duration {} ms for a 300 ms command",
        out.result.duration_ms
    );
    assert!(u128::from(out.result.duration_ms) <= out.elapsed.as_millis());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_streams_stderr_as_stderr_chunks() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let out = bash(&mut client, "s1", "echo to-out; echo to-err >&2").await;
    assert_eq!(out.streamed(OutputStream::Stdout), "to-out\n");
    assert_eq!(out.streamed(OutputStream::Stderr), "to-err\n");
    assert!(
        out.chunks
            .iter()
            .all(|c| c.stream() != OutputStream::Unspecified),
        "{:?}",
        out.chunks
    );
    // The result holds both streams.
    let output = ok_output(&out.result);
    assert!(
        output.contains("to-out\n") && output.contains("to-err\n"),
        "{output:?}"
    );
    assert_eq!(output.len(), "to-out\nto-err\n".len(), "{output:?}");
    assert_eq!(out.result.exit_code, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_nonzero_exit_is_an_error_with_its_exit_code() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let out = bash(&mut client, "s1", "echo oops >&2; exit 3").await;
    let r = &out.result;
    assert!(r.is_error, "{r:?}");
    assert_eq!(r.exit_code, Some(3));
    assert!(!r.timed_out);
    assert_eq!(r.output, "oops\n\n[exit code: 3]");
    assert_eq!(out.streamed(OutputStream::Stderr), "oops\n");

    // Without any output, the exit code is still reported.
    let r = bash(&mut client, "s1", "false").await.result;
    assert!(r.is_error);
    assert_eq!(r.exit_code, Some(1));
    assert!(r.output.contains("[exit code: 1]"), "{:?}", r.output);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_zero_timeout_is_refused() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let args = json!({"command": "echo never", "timeout_secs": 0}).to_string();
    let out = execute_request(&mut client, request("s1", "bash", &args)).await;
    assert_error_mentions(&out.result, "timeout_secs must be at least 1");
    assert!(!out.result.timed_out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_killed_by_a_signal_is_an_error_without_exit_code() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let r = bash(&mut client, "s1", "kill -KILL $$").await.result;
    assert!(r.is_error, "{r:?}");
    assert_eq!(r.exit_code, None);
    assert!(!r.timed_out);
    assert!(r.output.contains("[killed by a signal]"), "{:?}", r.output);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_timeout_from_arguments_kills_quickly() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let out = execute(
        &mut client,
        "s1",
        "bash",
        json!({ "command": "echo started; sleep 30", "timeout_secs": 1 }),
    )
    .await;
    let r = &out.result;
    assert!(r.timed_out, "{r:?}");
    assert!(r.is_error);
    assert_eq!(r.exit_code, None);
    assert!(r.output.starts_with("started\n"), "{:?}", r.output);
    assert!(r.output.contains("timed out after 1s"), "{:?}", r.output);
    assert_eq!(out.streamed(OutputStream::Stdout), "started\n");
    assert!(
        out.elapsed < Duration::from_secs(5),
        "took {:?}",
        out.elapsed
    );
    assert!(r.duration_ms >= 1000, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_timeout_from_the_request_applies() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let mut req = request("s1", "bash", &json!({ "command": "sleep 30" }).to_string());
    req.timeout_ms = 500;
    let out = execute_request(&mut client, req).await;
    assert!(out.result.timed_out, "{:?}", out.result);
    assert!(
        out.result.output.contains("timed out after 0.5s"),
        "{:?}",
        out.result.output
    );
    assert!(
        out.elapsed < Duration::from_secs(5),
        "took {:?}",
        out.elapsed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_timeout_is_capped_by_the_runner_maximum() {
    // small_limits: max_timeout is 2 s.
    let runner = Runner::start(small_limits()).await;
    let mut client = runner.client().await;
    let out = execute(
        &mut client,
        "s1",
        "bash",
        json!({ "command": "sleep 30", "timeout_secs": 100 }),
    )
    .await;
    assert!(out.result.timed_out, "{:?}", out.result);
    assert!(
        out.result.output.contains("timed out after 2s"),
        "{:?}",
        out.result.output
    );
    assert!(
        out.elapsed < Duration::from_secs(6),
        "took {:?}",
        out.elapsed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_timeout_kills_background_processes() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let out = execute(
        &mut client,
        "s1",
        "bash",
        json!({
            "command": "echo $$ > shell.pid; sleep 300 & echo $! > child.pid; wait",
            "timeout_secs": 1,
        }),
    )
    .await;
    assert!(out.result.timed_out, "{:?}", out.result);
    assert!(
        out.elapsed < Duration::from_secs(5),
        "took {:?}",
        out.elapsed
    );
    let ws = runner.workspace("s1");
    let shell = read_pid_file(&ws.join("shell.pid")).await;
    let child = read_pid_file(&ws.join("child.pid")).await;
    assert!(shell > 1 && child > 1 && shell != child);
    assert!(
        wait_gone(child).await,
        "background process {child} survived the timeout"
    );
    assert!(wait_gone(shell).await, "shell {shell} survived the timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_stream_kills_the_call_and_its_background_processes() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let req = request(
        "s1",
        "bash",
        &json!({
            "command": "echo $$ > shell.pid; sleep 300 & echo $! > child.pid; echo started; wait",
        })
        .to_string(),
    );
    let mut stream = client.execute(req).await.unwrap().into_inner();
    // Mid-call: the first output has arrived, the command is still running.
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("no output within 10 s")
        .unwrap()
        .expect("the stream ended early");
    match first.kind {
        Some(execute_response::Kind::Chunk(c)) => {
            assert_eq!(c.stream(), OutputStream::Stdout);
            assert_eq!(c.text, "started\n");
        }
        other => panic!("expected a chunk, got {other:?}"),
    }
    let ws = runner.workspace("s1");
    let shell = read_pid_file(&ws.join("shell.pid")).await;
    let child = read_pid_file(&ws.join("child.pid")).await;
    assert!(process_alive(shell), "the shell should still run");
    assert!(
        process_alive(child),
        "the background process should still run"
    );
    // The background child is (or is about to become) `sleep 300`.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let cmdline = std::fs::read_to_string(format!("/proc/{child}/cmdline")).unwrap();
        if cmdline.split('\0').take(2).eq(["sleep", "300"]) {
            break;
        }
        assert!(Instant::now() < deadline, "{child} runs {cmdline:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    drop(stream);
    assert!(
        wait_gone(child).await,
        "background process {child} survived the cancellation"
    );
    assert!(
        wait_gone(shell).await,
        "shell {shell} survived the cancellation"
    );

    // The runner keeps serving on the same connection.
    let out = bash(&mut client, "s1", "echo still-here").await;
    assert_eq!(ok_output(&out.result), "still-here\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_kills_background_processes_left_after_a_normal_exit() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let out = bash(
        &mut client,
        "s1",
        "sleep 300 > /dev/null 2>&1 & echo $! > child.pid; echo ok",
    )
    .await;
    assert_eq!(ok_output(&out.result), "ok\n");
    assert!(
        out.elapsed < Duration::from_secs(10),
        "took {:?}",
        out.elapsed
    );
    let child = read_pid_file(&runner.workspace("s1").join("child.pid")).await;
    assert!(
        wait_gone(child).await,
        "background process {child} outlived the call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_does_not_pass_secret_variables() {
    // Tests never set environment variables; check whatever this process has.
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let out = bash(&mut client, "s1", "env").await;
    let output = ok_output(&out.result);
    let names: Vec<&str> = output
        .lines()
        .filter_map(|l| l.split_once('=').map(|(name, _)| name))
        .collect();
    // The environment is passed on, minus secrets.
    assert!(names.contains(&"PATH"), "PATH is missing from {names:?}");
    let secret = |name: &str| {
        name.starts_with("AGENTRY_")
            || name.ends_with("_API_KEY")
            || name.ends_with("_TOKEN")
            || name.ends_with("_SECRET")
    };
    let leaked: Vec<&&str> = names.iter().filter(|n| secret(n)).collect();
    assert!(
        leaked.is_empty(),
        "secret variables reached the command: {leaked:?}"
    );
    let present: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| secret(k))
        .collect();
    for name in &present {
        assert!(!output.contains(&format!("{name}=")), "{name} leaked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_output_over_the_cap_is_cut_with_a_marker() {
    // small_limits: 100 bytes of output are kept, 50 from each end.
    let runner = Runner::start(small_limits()).await;
    let mut client = runner.client().await;
    let out = bash(&mut client, "s1", "seq 1 2000").await;
    let full: String = (1..=2000).map(|i| format!("{i}\n")).collect();
    let r = &out.result;
    assert!(r.truncated, "{r:?}");
    assert!(!r.is_error);
    assert_eq!(r.exit_code, Some(0));
    let cut = full.len() - 100;
    let expected = format!(
        "{}\n[... {cut} bytes of output cut ...]\n{}",
        &full[..50],
        &full[full.len() - 50..]
    );
    assert_eq!(r.output, expected);
    // Live output is capped too: its head, then a note of what was held back.
    assert_eq!(out.streamed(OutputStream::Stdout), full[..100]);
    let note = format!("[{cut} more bytes of live output not shown");
    assert!(
        out.streamed(OutputStream::Stderr).contains(&note),
        "{:?}",
        out.streamed(OutputStream::Stderr)
    );

    // Output within the cap is not marked.
    let r = bash(&mut client, "s1", "echo short").await.result;
    assert_eq!(r.output, "short\n");
    assert!(!r.truncated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_stdin_is_closed() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let out = bash(&mut client, "s1", "cat").await;
    assert!(
        out.elapsed < Duration::from_secs(5),
        "cat waited for input: {:?}",
        out.elapsed
    );
    assert_eq!(ok_output(&out.result), "(no output)");
    assert_eq!(out.result.exit_code, Some(0));
    assert!(out.chunks.is_empty(), "{:?}", out.chunks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_runs_in_the_session_workspace() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let r = bash(&mut client, "my-session_1", "pwd; pwd -P")
        .await
        .result;
    let ws = runner.workspace("my-session_1");
    assert!(ws.is_dir(), "the workspace was not created");
    let expected = format!("{0}\n{0}\n", ws.display());
    assert_eq!(ok_output(&r), expected);

    // Relative paths in commands land in the workspace.
    let r = bash(
        &mut client,
        "my-session_1",
        "mkdir -p d && echo hi > d/f.txt",
    )
    .await
    .result;
    ok_output(&r);
    assert_eq!(std::fs::read_to_string(ws.join("d/f.txt")).unwrap(), "hi\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_command_is_an_error_result() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let r = bash(&mut client, "s1", "   ").await.result;
    assert_error_mentions(&r, "command must not be empty");
    assert_eq!(r.exit_code, None);
}

// ---------------------------------------------------------------------------
// read_file / write_file
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_then_read_round_trips_with_nested_directories() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let content = "line 1\nlíne 2 ✓\nline 3\n";
    let r = write_file(&mut client, "s1", "a/b/c/notes.txt", content).await;
    assert_eq!(
        ok_output(&r),
        format!("wrote {} bytes to a/b/c/notes.txt", content.len())
    );
    assert_eq!(r.exit_code, None);
    let ws = runner.workspace("s1");
    assert_eq!(
        std::fs::read_to_string(ws.join("a/b/c/notes.txt")).unwrap(),
        content
    );

    let r = read_file(&mut client, "s1", json!({ "path": "a/b/c/notes.txt" })).await;
    assert_eq!(ok_output(&r), content);
    assert!(!r.truncated);
    let r = read_file(&mut client, "s1", json!({ "path": "./a/b/c/notes.txt" })).await;
    assert_eq!(ok_output(&r), content);

    // Replacing the file is atomic and leaves no temporary file behind.
    let r = write_file(&mut client, "s1", "a/b/c/notes.txt", "new\n").await;
    ok_output(&r);
    let r = read_file(&mut client, "s1", json!({ "path": "a/b/c/notes.txt" })).await;
    assert_eq!(ok_output(&r), "new\n");
    let names: Vec<String> = std::fs::read_dir(ws.join("a/b/c"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["notes.txt"]);

    // bash sees the same files.
    let out = bash(&mut client, "s1", "cat a/b/c/notes.txt").await;
    assert_eq!(ok_output(&out.result), "new\n");

    // An empty file is written and read back empty.
    ok_output(&write_file(&mut client, "s1", "empty.txt", "").await);
    let r = read_file(&mut client, "s1", json!({ "path": "empty.txt" })).await;
    assert_eq!(ok_output(&r), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_line_ranges() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let content: String = (1..=10).map(|i| format!("l{i}\n")).collect();
    ok_output(&write_file(&mut client, "s1", "ten.txt", &content).await);

    let read = |args: serde_json::Value| {
        let mut client = client.clone();
        async move { read_file(&mut client, "s1", args).await }
    };
    let r = read(json!({ "path": "ten.txt", "offset": 3, "limit": 2 })).await;
    assert_eq!(ok_output(&r), "l3\nl4\n");
    let r = read(json!({ "path": "ten.txt", "offset": 9 })).await;
    assert_eq!(ok_output(&r), "l9\nl10\n");
    let r = read(json!({ "path": "ten.txt", "limit": 1 })).await;
    assert_eq!(ok_output(&r), "l1\n");
    let r = read(json!({ "path": "ten.txt", "offset": 10, "limit": 5 })).await;
    assert_eq!(ok_output(&r), "l10\n");
    let r = read(json!({ "path": "ten.txt", "offset": 1, "limit": 100 })).await;
    assert_eq!(ok_output(&r), content);
    let r = read(json!({ "path": "ten.txt", "offset": 11 })).await;
    assert_error_mentions(&r, "offset 11 is past the end of ten.txt (10 lines)");
    let r = read(json!({ "path": "ten.txt", "offset": "three" })).await;
    assert_error_mentions(&r, "invalid arguments for read_file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_refuses_binary_files() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    // Create the workspace, then put binary files in it directly.
    ok_output(&bash(&mut client, "s1", "true").await.result);
    let ws = runner.workspace("s1");
    std::fs::write(ws.join("blob.bin"), [0x7f, b'E', b'L', b'F', 0, 1, 2, 0xff]).unwrap();
    std::fs::write(ws.join("latin1.txt"), b"caf\xe9\n").unwrap();

    let r = read_file(&mut client, "s1", json!({ "path": "blob.bin" })).await;
    assert_error_mentions(&r, "blob.bin is a binary file");
    let r = read_file(&mut client, "s1", json!({ "path": "latin1.txt" })).await;
    assert_error_mentions(&r, "latin1.txt is a binary file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_refuses_files_over_the_limit() {
    // small_limits: max_read_bytes is 1024.
    let runner = Runner::start(small_limits()).await;
    let mut client = runner.client().await;
    let content: String = (1..=400).map(|i| format!("{i:04}\n")).collect(); // 2000 bytes
    ok_output(&write_file(&mut client, "s1", "big.txt", &content).await);

    let r = read_file(&mut client, "s1", json!({ "path": "big.txt" })).await;
    assert_error_mentions(&r, "big.txt is 2000 bytes, over the 1024-byte limit");
    assert_error_mentions(&r, "offset and limit");

    // A line range of it may still be read.
    let r = read_file(
        &mut client,
        "s1",
        json!({ "path": "big.txt", "offset": 11, "limit": 2 }),
    )
    .await;
    assert_eq!(ok_output(&r), "0011\n0012\n");
    assert!(!r.truncated);

    // A file of exactly the limit is fine.
    let exact = "x".repeat(1024);
    ok_output(&write_file(&mut client, "s1", "exact.txt", &exact).await);
    let r = read_file(&mut client, "s1", json!({ "path": "exact.txt" })).await;
    assert_eq!(ok_output(&r), exact);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_missing_file_and_directory_are_errors() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let r = read_file(&mut client, "s1", json!({ "path": "nope/missing.txt" })).await;
    assert_error_mentions(&r, "nope/missing.txt: no such file in the workspace");

    ok_output(&write_file(&mut client, "s1", "dir/f.txt", "x").await);
    let r = read_file(&mut client, "s1", json!({ "path": "dir" })).await;
    assert_error_mentions(&r, "dir is a directory");
    let r = write_file(&mut client, "s1", "dir", "x").await;
    assert_error_mentions(&r, "dir is a directory");

    let r = read_file(&mut client, "s1", json!({ "path": "" })).await;
    assert_error_mentions(&r, "path must not be empty");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_outside_the_workspace_are_refused() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    // Workspaces of s1 and s2, and a file next to them in the root.
    ok_output(&write_file(&mut client, "s1", "mine.txt", "s1 data").await);
    ok_output(&write_file(&mut client, "s2", "theirs.txt", "s2 data").await);
    std::fs::write(runner.root.join("x"), "root data").unwrap();
    let ws = runner.workspace("s1");
    std::os::unix::fs::symlink("/etc", ws.join("etc")).unwrap();
    std::os::unix::fs::symlink(runner.workspace("s2"), ws.join("other")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", ws.join("dangling")).unwrap();

    for path in [
        "../x",
        "a/../../x",
        "../s2/theirs.txt",
        "/etc/passwd",
        "etc/passwd",
        "etc",
        "other/theirs.txt",
        "dangling",
    ] {
        let r = read_file(&mut client, "s1", json!({ "path": path })).await;
        assert_error_mentions(&r, "outside the workspace");
        assert!(
            r.output.contains(path),
            "the error does not name {path:?}: {:?}",
            r.output
        );
        assert!(!r.output.contains("root data") && !r.output.contains("s2 data"));
    }
    for path in [
        "../escaped.txt",
        "/tmp/escaped.txt",
        "etc/escaped",
        "other/escaped.txt",
    ] {
        let r = write_file(&mut client, "s1", path, "pwned").await;
        assert_error_mentions(&r, "outside the workspace");
    }
    assert!(!runner.root.join("escaped.txt").exists());
    assert!(!runner.workspace("s2").join("escaped.txt").exists());
    assert!(!Path::new("/etc/escaped").exists());
    assert_eq!(
        std::fs::read_to_string(runner.root.join("x")).unwrap(),
        "root data"
    );

    // A relative symbolic link that stays inside the workspace is fine;
    // an absolute one is refused (the kernel resolves file tools' paths
    // beneath the workspace, where absolute links cannot be followed).
    std::os::unix::fs::symlink("mine.txt", ws.join("alias.txt")).unwrap();
    let r = read_file(&mut client, "s1", json!({ "path": "alias.txt" })).await;
    assert_eq!(ok_output(&r), "s1 data");
    std::os::unix::fs::symlink(ws.join("mine.txt"), ws.join("absolute.txt")).unwrap();
    let r = read_file(&mut client, "s1", json!({ "path": "absolute.txt" })).await;
    assert!(r.is_error, "{r:?}");
    assert!(r.output.contains("absolute"), "{r:?}");
}

// ---------------------------------------------------------------------------
// Bad calls
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_and_unknown_tools_are_error_results() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let cases: [(&str, &str, &str); 8] = [
        ("bash", "{not json", "arguments of bash are not valid JSON"),
        ("bash", "[1, 2]", "arguments of bash must be a JSON object"),
        ("bash", "\"echo hi\"", "must be a JSON object"),
        ("bash", "{}", "missing field `command`"),
        ("bash", "", "missing field `command`"),
        (
            "bash",
            r#"{"command": "echo hi", "bogus": 1}"#,
            "unknown field `bogus`",
        ),
        (
            "read_file",
            r#"{"path": 7}"#,
            "invalid arguments for read_file",
        ),
        (
            "write_file",
            r#"{"path": "f.txt"}"#,
            "missing field `content`",
        ),
    ];
    for (tool, args, needle) in cases {
        let out = execute_request(&mut client, request("s1", tool, args)).await;
        assert_error_mentions(&out.result, needle);
        assert!(out.chunks.is_empty(), "{:?}", out.chunks);
        assert_eq!(out.result.exit_code, None);
        assert!(!out.result.timed_out && !out.result.truncated);
    }
    // Nothing ran: the rejected command left no file behind.
    let out = execute_request(
        &mut client,
        request("s1", "bash", r#"{"command": "touch ran", "extra": true}"#),
    )
    .await;
    assert!(out.result.is_error);
    assert!(!runner.workspace("s1").join("ran").exists());

    let out = execute(&mut client, "s1", "rm_rf", json!({})).await;
    assert_eq!(
        out.result.output,
        "unknown tool \"rm_rf\"; available tools: bash, edit_file, glob, grep, list_dir, read_file, web_crawl, web_fetch, write_file"
    );
    assert!(out.result.is_error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_grpc_errors() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    for session in ["../evil", "", "a/b", "has space", &"x".repeat(65)] {
        let status = client
            .execute(request(session, "bash", r#"{"command": "echo hi"}"#))
            .await
            .expect_err("an invalid session id must be refused");
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{session:?}: {status:?}"
        );
        assert!(
            status.message().contains("invalid session id"),
            "{status:?}"
        );
    }
    assert!(!runner.root.parent().unwrap().join("evil").exists());
    // Nothing was created for the refused sessions (the directory of
    // private temp dirs is the runner's own, and empty).
    let names: Vec<_> = std::fs::read_dir(&runner.root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from(".tmp")]);
    assert!(
        std::fs::read_dir(runner.root.join(".tmp"))
            .unwrap()
            .next()
            .is_none()
    );

    let status = client
        .execute(request("s1", "", "{}"))
        .await
        .expect_err("a request without a tool must be refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("tool must be set"), "{status:?}");

    // The longest valid id is accepted.
    let longest = "y".repeat(64);
    let out = bash(&mut client, &longest, "echo ok").await;
    assert_eq!(ok_output(&out.result), "ok\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_have_separate_workspaces() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    ok_output(&write_file(&mut client, "alpha", "shared-name.txt", "alpha's").await);
    ok_output(&write_file(&mut client, "beta", "shared-name.txt", "beta's").await);
    ok_output(&write_file(&mut client, "alpha", "only-alpha.txt", "a").await);

    let r = read_file(&mut client, "alpha", json!({ "path": "shared-name.txt" })).await;
    assert_eq!(ok_output(&r), "alpha's");
    let r = read_file(&mut client, "beta", json!({ "path": "shared-name.txt" })).await;
    assert_eq!(ok_output(&r), "beta's");
    let r = read_file(&mut client, "beta", json!({ "path": "only-alpha.txt" })).await;
    assert_error_mentions(&r, "no such file in the workspace");

    let out = bash(&mut client, "beta", "ls -A; pwd").await;
    assert_eq!(
        ok_output(&out.result),
        format!("shared-name.txt\n{}\n", runner.workspace("beta").display())
    );
    assert_ne!(runner.workspace("alpha"), runner.workspace("beta"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_are_independent() {
    let runner = Runner::start(default_limits()).await;
    let client = runner.client().await;
    let calls = (0..4).map(|i| {
        let mut client = client.clone();
        async move {
            let session = format!("c{i}");
            let out = bash(&mut client, &session, &format!("sleep 0.5; echo call-{i}")).await;
            (i, out)
        }
    });
    let started = Instant::now();
    let outcomes = futures::future::join_all(calls).await;
    for (i, out) in outcomes {
        assert_eq!(ok_output(&out.result), format!("call-{i}\n"));
        assert_eq!(out.streamed(OutputStream::Stdout), format!("call-{i}\n"));
    }
    // They ran side by side, not one after another.
    assert!(
        started.elapsed() < Duration::from_millis(1900),
        "took {:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------
// Escaped processes and concurrent writes
// ---------------------------------------------------------------------------

/// A process that leaves the call's process group (`setsid`) but keeps its
/// stdout open must not hold the call open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_left_the_group_does_not_hold_the_call_open() {
    let runner = Runner::start(default_limits()).await;
    let mut client = runner.client().await;
    let req = request(
        "s1",
        "bash",
        &json!({
            "command": "setsid sleep 30 & echo $! > escaped.pid; sleep 0.3; echo hi",
            "timeout_secs": 1,
        })
        .to_string(),
    );
    let started = Instant::now();
    let finished = tokio::time::timeout(Duration::from_secs(10), async {
        let mut stream = client.execute(req).await.unwrap().into_inner();
        while stream.message().await.unwrap().is_some() {}
    })
    .await;
    let elapsed = started.elapsed();
    // Clean up the escaped process whatever happened.
    let escaped = read_pid_file(&runner.workspace("s1").join("escaped.pid")).await;
    if process_alive(escaped) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(escaped),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(finished.is_ok(), "the call was still open after 10 s");
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
}

/// Concurrent writes of one path each use their own temporary file, so all
/// succeed and the file holds one of them whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_to_one_path_all_succeed() {
    let runner = Runner::start(default_limits()).await;
    let client = runner.client().await;
    for round in 0..30 {
        let contents: Vec<String> = (0..2)
            .map(|i| {
                format!(
                    "writer {i} round {round}\n{}",
                    "x".repeat(100_000 * (i + 1))
                )
            })
            .collect();
        let calls = contents.iter().map(|content| {
            let mut client = client.clone();
            async move { write_file(&mut client, "s1", "same.txt", content).await }
        });
        for r in futures::future::join_all(calls).await {
            ok_output(&r);
        }
        let on_disk = std::fs::read_to_string(runner.workspace("s1").join("same.txt")).unwrap();
        assert!(
            contents.contains(&on_disk),
            "round {round}: a mix of both writes"
        );
    }
}

#[tokio::test]
async fn live_output_of_a_flood_is_capped_like_the_result() {
    let runner = Runner::start(small_limits()).await;
    let mut client = runner.client().await;
    // 200 kB of output against a 100-byte limit.
    let out = bash(&mut client, "s1", "head -c 200000 /dev/zero | tr '\\0' 'x'").await;
    let streamed: String = out.chunks.iter().map(|c| c.text.as_str()).collect();
    let (shown, note) = streamed
        .split_once("\n[")
        .expect("a note says live output was held back");
    assert_eq!(shown, "x".repeat(100));
    assert_eq!(
        note,
        "199900 more bytes of live output not shown; the result keeps the head and tail]\n"
    );
    assert!(out.result.truncated);
    assert!(
        out.result.output.contains("bytes of output cut"),
        "{}",
        out.result.output
    );
}

#[tokio::test]
async fn the_workspace_quota_stops_growth_and_refuses_writes() {
    const MIB: u64 = 1024 * 1024;
    let runner = Runner::start(Limits {
        workspace_bytes: 8 * MIB,
        ..default_limits()
    })
    .await;
    let mut client = runner.client().await;

    // A command that keeps growing the workspace is stopped.
    let out = bash(
        &mut client,
        "q1",
        "for i in $(seq 1 60); do head -c 1048576 /dev/urandom > f$i; sleep 0.1; done; echo finished",
    )
    .await;
    assert_error_mentions(&out.result, "past its quota of 8 MiB");
    assert!(!out.result.output.contains("finished"), "{:?}", out.result);
    let written = std::fs::read_dir(runner.workspace("q1")).unwrap().count();
    assert!((8..30).contains(&written), "{written} files written");

    // While over the quota, writes are refused with the reason.
    let refused = write_file(&mut client, "q1", "more.txt", "x").await;
    assert_error_mentions(&refused, "quota of 8 MiB");
    assert!(!runner.workspace("q1").join("more.txt").exists());

    // A command that writes everything before it is measured is told.
    let out = bash(&mut client, "q2", "head -c 12582912 /dev/urandom > big").await;
    assert_error_mentions(&out.result, "writes are refused until files are deleted");

    // Deleting makes room: a command may run over the quota as long as it
    // does not grow the workspace.
    let out = bash(&mut client, "q1", "rm -f f*; echo cleaned").await;
    assert_eq!(ok_output(&out.result).trim(), "cleaned");
    let written = write_file(&mut client, "q1", "more.txt", "x").await;
    ok_output(&written);
    runner.stop().await;
}
