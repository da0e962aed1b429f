//! Against a real model server: llama.cpp's `llama-server` with the GGUF
//! weights of SmolLM2-135M-Instruct, both provided by
//! `scripts/llama-server.sh` (built from source once, cached outside the
//! repository). Where the server is not built the tests say so and pass;
//! under `CI=true` a missing server fails them.
//!
//! The model is tiny: these tests check what Agentry does with a real
//! server's streaming, usage, context size, errors and tool-call parser,
//! not the quality of its answers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_proto::sessions::v1::{self as spb, ApprovalMode, TurnOutcome, event::Kind};
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Channel;
use common::install::{Up, free_port, text};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The template that lets the server parse tool calls the tiny model
/// writes as bare JSON objects.
const TOOL_TEMPLATE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/llama/chatml-json-tools.jinja"
);

/// Where `scripts/llama-server.sh` put the server and the weights:
/// `AGENTRY_LLAMA_DIR`, else the newest `llama-server-*` of the cache.
fn llama_dir() -> Option<PathBuf> {
    let complete = |dir: &Path| dir.join("bin/llama-server").is_file() && weights(dir).is_some();
    if let Some(dir) = std::env::var_os("AGENTRY_LLAMA_DIR").map(PathBuf::from) {
        return complete(&dir).then_some(dir);
    }
    let cache = std::env::var_os("AGENTRY_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/agentry")))?;
    let mut found: Vec<PathBuf> = std::fs::read_dir(cache)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("llama-server-") && !n.ends_with(".part"))
                && complete(p)
        })
        .collect();
    found.sort();
    found.pop()
}

fn weights(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir.join("models"))
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "gguf"))
}

/// One server at a time: each takes both cores, and several at once slow
/// each other past any sensible time limit.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The server's directory, or `None` after saying why the test is skipped
/// (a failure under `CI=true`).
fn required(test: &str) -> Option<PathBuf> {
    let found = llama_dir();
    if found.is_none() {
        let why = "llama-server is not built: run scripts/llama-server.sh (about 8 minutes) \
                   or set AGENTRY_LLAMA_DIR";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: {why}"
        );
        eprintln!("SKIPPED {test}: {why}");
    }
    found
}

/// A running `llama-server`, killed when dropped.
struct Llama {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Llama {
    /// Starts the server with a context of `ctx` tokens (per slot) and,
    /// when given, a chat template file; waits until it serves.
    fn start(dir: &Path, ctx: u32, template: Option<&str>) -> Llama {
        let scratch = tempfile::tempdir().unwrap();
        let log = scratch.path().join("llama-server.log");
        let port = free_port();
        let mut cmd = Command::new(dir.join("bin/llama-server"));
        cmd.arg("-m")
            .arg(weights(dir).unwrap())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--jinja", "-c", &ctx.to_string(), "--parallel", "1"])
            .args(["--threads", "2", "--no-warmup"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some(template) = template {
            cmd.args(["--chat-template-file", template]);
        }
        let mut llama = Llama {
            child: cmd.spawn().unwrap(),
            port,
            log,
            _dir: scratch,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while get(port, "/health").0 != 200 {
            if let Some(status) = llama.child.try_wait().unwrap() {
                panic!("llama-server exited with {status}: {}", llama.logs());
            }
            assert!(
                Instant::now() < deadline,
                "llama-server did not come up: {}",
                llama.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        llama
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` on the local port: status and body (0 when nothing answers).
fn get(port: u16, path: &str) -> (u16, String) {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, response)
}

/// Agentry's settings for the tiny model: deterministic, short answers.
const SHORT_ANSWERS: &str = "[llm]\ntemperature = 0.0\n[llm.extra_body]\nmax_tokens = 48\n";

/// The services in process, talking to the real server.
async fn cluster(llama: &Llama, adjust: impl FnOnce(&mut agentry_runtime::Config)) -> Cluster {
    let base_url = llama.base_url();
    Cluster::start_with(move |c| {
        c.llm.base_url = base_url;
        c.llm.model = "smollm2-135m-instruct".into();
        c.llm.temperature = Some(0.0);
        c.llm.extra_body.insert("max_tokens".into(), 48.into());
        adjust(c);
    })
    .await
    .unwrap()
}

/// A session and its event stream.
async fn session(
    client: &mut OrchestratorClient<Channel>,
) -> (String, tonic::Streaming<spb::Event>) {
    let session = client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let events = client
        .subscribe(pb::SubscribeRequest {
            session_id: session.id.clone(),
            from_seq: 1,
            live_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    (session.id, events)
}

/// Reads events until the turn finishes (at most `limit`).
async fn until_finished(
    events: &mut tonic::Streaming<spb::Event>,
    turn_id: &str,
    limit: Duration,
) -> (Vec<spb::Event>, spb::TurnFinished) {
    let mut seen = Vec::new();
    let read = async {
        while let Some(event) = events.message().await.unwrap() {
            seen.push(event.clone());
            if let Some(Kind::TurnFinished(f)) = event.kind
                && event.turn_id == turn_id
            {
                return f;
            }
        }
        panic!("the event stream ended");
    };
    match tokio::time::timeout(limit, read).await {
        Ok(finished) => (seen, finished),
        Err(_) => panic!("turn {turn_id} did not finish within {limit:?}"),
    }
}

/// Sends a message; returns its turn id.
async fn send(client: &mut OrchestratorClient<Channel>, session_id: &str, text: &str) -> String {
    common::submit(
        client,
        session_id,
        common::message(text, ApprovalMode::Always),
    )
    .await
    .turn_id
}

fn kind_name(event: &spb::Event) -> &'static str {
    match &event.kind {
        Some(Kind::ModelTextDelta(_)) => "delta",
        Some(Kind::ModelMessage(_)) => "model_message",
        Some(Kind::ToolCallRequested(_)) => "tool_call_requested",
        Some(Kind::ToolResult(_)) => "tool_result",
        Some(Kind::ContextCompacted(_)) => "context_compacted",
        Some(Kind::TurnFinished(_)) => "turn_finished",
        _ => "other",
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streamed_answer_comes_through_run_and_json() {
    let Some(dir) = required("a_streamed_answer_comes_through_run_and_json") else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let llama = Llama::start(&dir, 2048, None);
    let (install, up, log) = Up::start_configured(&llama.base_url(), SHORT_ANSWERS);

    let out = install.run(&["run", "--verbose", "--approve", "never", "Say hello."]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}\n{}", llama.logs());
    assert!(!stdout.trim().is_empty(), "no answer: {stderr}");
    // The first answer says how much of the server's window the fixed part
    // takes: the window came from the server (2,048 tokens per slot).
    assert!(
        stderr.contains("-token context window)") && stderr.contains("2048"),
        "{stderr}"
    );

    let out = install.run(&["run", "--json", "--approve", "never", "Name a colour."]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let events: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let message_at = types.iter().position(|t| *t == "model_message").unwrap();
    assert!(
        types[..message_at].contains(&"model_text_delta"),
        "the answer was streamed: {types:?}"
    );
    let message = &events[message_at];
    assert!(
        message["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{message}"
    );
    assert!(
        message["usage"]["completion_tokens"].as_u64().unwrap() > 0,
        "{message}"
    );
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "model_text_delta")
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert_eq!(deltas, message["text"].as_str().unwrap());
    assert_eq!(events.last().unwrap()["type"], "turn_finished");
    assert_eq!(events.last().unwrap()["outcome"], "completed");

    let status = up.stop();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(log).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_stops_a_streaming_answer_and_the_session_goes_on() {
    let Some(dir) = required("cancel_stops_a_streaming_answer_and_the_session_goes_on") else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let llama = Llama::start(&dir, 2048, None);
    let cluster = cluster(&llama, |c| {
        c.llm.extra_body.insert("max_tokens".into(), 400.into());
    })
    .await;
    let mut client = cluster.orchestrator().await.unwrap();
    let (id, mut events) = session(&mut client).await;
    let turn = send(&mut client, &id, "Write a very long story about a dragon.").await;
    // Cancel once the answer is streaming.
    let started = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(event) = events.message().await.unwrap() {
            if matches!(event.kind, Some(Kind::ModelTextDelta(_))) {
                return;
            }
        }
    })
    .await;
    assert!(started.is_ok(), "no streamed text: {}", llama.logs());
    let cancelled_at = Instant::now();
    common::submit(
        &mut client,
        &id,
        pb::input::Kind::Cancel(pb::CancelInput {
            reason: "enough".into(),
        }),
    )
    .await;
    let (_, finished) = until_finished(&mut events, &turn, Duration::from_secs(30)).await;
    assert_eq!(
        finished.outcome,
        TurnOutcome::Cancelled as i32,
        "{finished:?}"
    );
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(5),
        "the cancel took {:?}",
        cancelled_at.elapsed()
    );
    // The server and the session carry on.
    let turn = send(&mut client, &id, "Say hello.").await;
    let (_, finished) = until_finished(&mut events, &turn, Duration::from_secs(120)).await;
    assert_eq!(
        finished.outcome,
        TurnOutcome::Completed as i32,
        "{finished:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_outgrowing_a_2048_token_context_is_compacted() {
    let Some(dir) = required("a_conversation_outgrowing_a_2048_token_context_is_compacted") else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let llama = Llama::start(&dir, 2048, None);
    let cluster = cluster(&llama, |c| c.agent.compaction_keep_messages = 2).await;
    let mut client = cluster.orchestrator().await.unwrap();
    let (id, mut events) = session(&mut client).await;
    let mut compactions = Vec::new();
    for i in 0..4 {
        let note = format!(
            "Note {i}: {}",
            "the quick brown fox jumps over the lazy dog. ".repeat(40)
        );
        let turn = send(&mut client, &id, &note).await;
        let (seen, finished) = until_finished(&mut events, &turn, Duration::from_secs(180)).await;
        assert_eq!(
            finished.outcome,
            TurnOutcome::Completed as i32,
            "turn {i}: {finished:?}\n{}",
            llama.logs()
        );
        compactions.extend(seen.into_iter().filter_map(|e| match e.kind {
            Some(Kind::ContextCompacted(c)) => Some(c),
            _ => None,
        }));
    }
    // Four notes of ~400 tokens do not fit 2,048 tokens with the
    // instructions: the oldest were summarised by the real model, and
    // every request the server got fitted its context (it answers 400
    // otherwise, which would have failed a turn).
    assert!(!compactions.is_empty(), "no compaction");
    for c in &compactions {
        assert!(c.tokens_before > 0 && c.messages > 0, "{c:?}");
        assert!(!c.summary.is_empty() || !c.note.is_empty(), "{c:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_call_parsed_by_the_server_runs_and_its_result_is_recorded() {
    let Some(dir) = required("a_tool_call_parsed_by_the_server_runs_and_its_result_is_recorded")
    else {
        return;
    };
    let _turn = ONE_AT_A_TIME.lock().await;
    let llama = Llama::start(&dir, 4096, Some(TOOL_TEMPLATE));
    let config_dir = tempfile::tempdir().unwrap();
    // The tiny model needs an example to imitate, and to be made to call.
    std::fs::write(
        config_dir.path().join("system.md"),
        "You answer with a tool call. Example: {\"name\": \"list_reminders\", \"arguments\": {}}",
    )
    .unwrap();
    let config_path = config_dir.path().to_path_buf();
    let cluster = cluster(&llama, move |c| {
        c.config_dir = Some(config_path);
        c.llm.tool_choice = agentry_runtime::config::ToolChoice::Required;
        c.llm.extra_body.insert("max_tokens".into(), 128.into());
        c.llm
            .extra_body
            .insert("parallel_tool_calls".into(), false.into());
        // The tool's result is what this test is about; a second answer
        // from this model would be noise.
        c.agent.max_steps = 1;
    })
    .await;
    let mut client = cluster.orchestrator().await.unwrap();
    let (id, mut events) = session(&mut client).await;
    let turn = send(&mut client, &id, "Which reminders do I have?").await;
    let (seen, finished) = until_finished(&mut events, &turn, Duration::from_secs(120)).await;
    let kinds: Vec<&str> = seen
        .iter()
        .map(kind_name)
        .filter(|k| *k != "other" && *k != "delta")
        .collect();
    assert_eq!(
        kinds,
        [
            "model_message",
            "tool_call_requested",
            "tool_result",
            "turn_finished"
        ],
        "{finished:?}\n{}",
        llama.logs()
    );
    let message = seen
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::ModelMessage(m)) => Some(m.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(message.finish_reason, "tool_calls");
    let call = seen
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::ToolCallRequested(c)) => Some(c.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(call.tool, "list_reminders");
    let arguments: serde_json::Value = serde_json::from_str(&call.arguments_json).unwrap();
    assert!(arguments.is_object(), "{}", call.arguments_json);
    let result = seen
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::ToolResult(r)) => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    assert!(!result.is_error, "{}", result.output);
    assert_eq!(finished.outcome, TurnOutcome::StepLimit as i32);
}
