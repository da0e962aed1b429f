//! The orchestrator's pool of tool runners against real runner processes
//! (`agentry serve tool-runner`), killed with SIGKILL or frozen with SIGSTOP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_orchestrator::runners::RunnerPool;
use agentry_proto::tools::v1::{ExecuteRequest, ExecuteResult};
use agentry_runtime::Auth;
use common::BIN;
use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Runner {
    child: Option<Child>,
    url: String,
    id: String,
    _config: tempfile::TempDir,
}

impl Runner {
    async fn start(id: &str, workspace: &std::path::Path) -> Runner {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let config = tempfile::tempdir().unwrap();
        let child = Command::new(BIN)
            .args(["serve", "tool-runner"])
            .env("AGENTRY_CONFIG_DIR", config.path())
            .env("AGENTRY_DATA_DIR", config.path())
            .env("AGENTRY_TOOL_RUNNER_LISTEN", format!("127.0.0.1:{port}"))
            .env("AGENTRY_WORKSPACE_ROOT", workspace)
            .env("AGENTRY_RUNNER_ID", id)
            // The pool's behaviour is under test here, not credentials.
            .env("AGENTRY_AUTH", "off")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        agentry_testkit::cluster::connect(&url).await.unwrap();
        Runner {
            child: Some(child),
            url,
            id: id.to_string(),
            _config: config,
        }
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn kill(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn request(tool: &str, arguments: serde_json::Value) -> ExecuteRequest {
    ExecuteRequest {
        call_id: uuid::Uuid::now_v7().to_string(),
        session_id: "pool-session".into(),
        tool: tool.into(),
        arguments_json: arguments.to_string(),
        timeout_ms: 0,
        network: false,
        resume: None,
    }
}

async fn run(
    pool: &Arc<RunnerPool>,
    request: ExecuteRequest,
    read_only: bool,
) -> Result<ExecuteResult, agentry_orchestrator::runners::CallFailure> {
    pool.execute(request, read_only, |_chunk| async { true })
        .await
}

async fn two_runners() -> (tempfile::TempDir, Runner, Runner, Arc<RunnerPool>) {
    let workspace = tempfile::tempdir().unwrap();
    let a = Runner::start("runner-a", workspace.path()).await;
    let b = Runner::start("runner-b", workspace.path()).await;
    let pool = RunnerPool::new(&format!("{},{}", a.url, b.url), &Auth::off()).unwrap();
    (workspace, a, b, pool)
}

/// Waits until a call is in flight on one of the replicas and returns its URL.
async fn busy_replica(pool: &RunnerPool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(r) = pool.replicas().iter().find(|r| r.in_flight() > 0) {
            // Give the runner a moment to start the command.
            tokio::time::sleep(Duration::from_millis(300)).await;
            return r.url.clone();
        }
        assert!(Instant::now() < deadline, "no call went in flight");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_spread_over_every_runner() {
    let (_ws, a, b, pool) = two_runners().await;
    let mut served = BTreeSet::new();
    for n in 0..6 {
        let result = run(
            &pool,
            request("bash", serde_json::json!({"command": format!("echo {n}")})),
            false,
        )
        .await
        .unwrap();
        assert!(!result.is_error, "{}", result.output);
        assert_eq!(result.output.trim(), n.to_string());
        served.insert(result.runner_id);
    }
    assert_eq!(served, BTreeSet::from([a.id.clone(), b.id.clone()]));

    let tools = pool.list_tools().await.unwrap();
    assert!(tools.tools.iter().any(|t| t.name == "bash"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutating_call_lost_with_its_runner_is_reported_not_repeated() {
    let (workspace, mut a, mut b, pool) = two_runners().await;
    let marker = workspace.path().join("pool-session").join("ran");
    let pending = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let command = "echo once >> ran; sleep 30";
            run(
                &pool,
                request("bash", serde_json::json!({"command": command})),
                false,
            )
            .await
        })
    };
    let busy = busy_replica(&pool).await;
    let (victim, survivor) = if busy == a.url {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    let started = Instant::now();
    victim.kill();
    let failure = pending.await.unwrap().unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(failure.runner, busy);
    assert!(
        failure.message.contains("may or may not have completed"),
        "{}",
        failure.message
    );
    // Not repeated on the survivor.
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "once\n");

    // The next calls reach the survivor, even the ones first sent to the
    // dead runner (its refused connection proves they never ran there).
    for _ in 0..4 {
        let result = run(
            &pool,
            request("bash", serde_json::json!({"command": "echo next"})),
            false,
        )
        .await
        .unwrap();
        assert_eq!(result.runner_id, survivor.id);
        assert_eq!(result.output.trim(), "next");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_calls_move_to_another_runner() {
    let (workspace, mut a, b, pool) = two_runners().await;
    let dir = workspace.path().join("pool-session");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "kept\n").unwrap();
    a.kill();
    for _ in 0..4 {
        let result = run(
            &pool,
            request("read_file", serde_json::json!({"path": "notes.txt"})),
            true,
        )
        .await
        .unwrap();
        assert!(!result.is_error, "{}", result.output);
        assert!(result.output.contains("kept"), "{}", result.output);
        assert_eq!(result.runner_id, b.id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_stops_answering_is_noticed_by_its_health_checks() {
    // SIGSTOP leaves the connection open but silent, as a container whose
    // network vanished does: only the health checks can tell.
    let (_ws, a, b, pool) = two_runners().await;
    let pending = {
        let pool = pool.clone();
        tokio::spawn(async move {
            run(
                &pool,
                request("bash", serde_json::json!({"command": "sleep 60"})),
                false,
            )
            .await
        })
    };
    let busy = busy_replica(&pool).await;
    let (frozen, survivor) = if busy == a.url { (&a, &b) } else { (&b, &a) };
    let started = Instant::now();
    frozen.signal("STOP");
    let failure = pending.await.unwrap().unwrap_err();
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    assert!(
        failure.message.contains("stopped answering"),
        "{}",
        failure.message
    );
    let result = run(
        &pool,
        request("bash", serde_json::json!({"command": "echo alive"})),
        false,
    )
    .await
    .unwrap();
    assert_eq!(result.runner_id, survivor.id);
    eprintln!("a frozen runner was noticed after {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reachable_runner_is_a_clear_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let pool = RunnerPool::new(&format!("http://127.0.0.1:{port}"), &Auth::off()).unwrap();
    let failure = run(
        &pool,
        request("bash", serde_json::json!({"command": "true"})),
        false,
    )
    .await
    .unwrap_err();
    assert!(
        failure.message.starts_with(&format!(
            "error: no tool runner is reachable at http://127.0.0.1:{port}"
        )),
        "{}",
        failure.message
    );
    let status = pool.list_tools().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
}
