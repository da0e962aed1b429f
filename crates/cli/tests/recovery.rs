//! Crash recovery with real processes: the orchestrator runs as an
//! `agentry serve orchestrator` child process and is killed with SIGKILL
//! (a) while the model streams, (b) while tools run, (c) while an approval
//! is pending. The session store and tool runner keep running; after a
//! restart the orchestrator rebuilds each session from its log on its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{
    self as spb, ApprovalDecision, ApprovalMode, ErrorSource, TurnOutcome, event::Kind,
};
use agentry_proto::tools::v1 as tpb;
use agentry_proto::tools::v1::tool_runner_server::{ToolRunner, ToolRunnerServer};
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Service;
use agentry_testkit::fake_model::{Reply, pause, text};
use common::{Live, Log, Orchestrator, cluster_without_orchestrator, message, submit};
use serde_json::json;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

#[tokio::test(flavor = "multi_thread")]
async fn killed_while_the_model_streams_the_turn_is_retried() {
    let mut cluster = cluster_without_orchestrator(|_| {}).await;
    let mut orchestrator = Orchestrator::new(&mut cluster);
    let mut client = orchestrator.start().await;
    cluster.model.push(Reply::stream(vec![
        text("partial "),
        pause(Duration::from_secs(30)),
        text("never sent"),
    ]));
    cluster.model.push(Reply::text("the full answer"));
    let session = client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut log = Log::follow(&cluster, &session.id).await;
    let mut live = Live::follow(&mut client, &session.id).await;
    submit(
        &mut client,
        &session.id,
        message("hello", ApprovalMode::Always),
    )
    .await;
    assert_eq!(live.text("the first delta").await, "partial ");

    orchestrator.kill();
    // Nobody submits anything: the restarted orchestrator recovers on its own.
    let _client = orchestrator.start().await;
    let done = log.finished().await;
    assert_eq!(
        done.outcome,
        TurnOutcome::Completed as i32,
        "{:#?}",
        log.seen
    );
    assert_eq!(done.message, "the full answer");
    let restart_note = log.seen.iter().find_map(|e| match &e.kind {
        Some(Kind::Error(err)) if err.source == ErrorSource::Orchestrator as i32 => {
            Some(err.message.clone())
        }
        _ => None,
    });
    assert!(
        restart_note.is_some_and(|m| m.contains("restarted")),
        "{:#?}",
        log.seen
    );
    assert_eq!(cluster.model.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rate_limited_turn_parks_and_goes_on_after_a_restart_during_the_wait() {
    let mut cluster = cluster_without_orchestrator(|_| {}).await;
    cluster
        .model
        .push(Reply::error(429, "rate limit reached for requests").retry_after(5));
    cluster.model.push(Reply::text("after the wait"));
    let mut orchestrator = Orchestrator::new(&mut cluster);
    // No retries of its own: the server's wait is longer than none.
    orchestrator.local_config("[llm]\nmax_retries = 0\n");
    let mut client = orchestrator.start().await;
    let session = client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut log = Log::follow(&cluster, &session.id).await;
    submit(
        &mut client,
        &session.id,
        message("hello", ApprovalMode::Policy),
    )
    .await;
    let parked = log
        .until("the turn parks", |k| matches!(k, Kind::TurnParked(_)))
        .await;
    let Some(Kind::TurnParked(parked)) = parked.kind else {
        unreachable!()
    };
    assert_eq!(parked.reason, spb::ParkReason::RateLimit as i32);
    assert!(parked.message.contains("429"), "{}", parked.message);
    let until = parked.until.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (3..=6).contains(&(until.seconds - now)),
        "{until:?} at {now}"
    );
    // The turn stays open meanwhile: no failure, no second request.
    assert!(
        !log.seen
            .iter()
            .any(|e| matches!(e.kind, Some(Kind::TurnFinished(_) | Kind::Error(_)))),
        "{:#?}",
        log.seen
    );

    orchestrator.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cluster.model.request_count(), 1);
    // Nobody submits anything: the restarted orchestrator waits out the
    // rest and goes on.
    let _client = orchestrator.start().await;
    let done = log.finished().await;
    assert_eq!(
        done.outcome,
        TurnOutcome::Completed as i32,
        "{:#?}",
        log.seen
    );
    assert_eq!(done.message, "after the wait");
    let resumed = log
        .seen
        .iter()
        .find(|e| matches!(e.kind, Some(Kind::TurnResumed(_))))
        .unwrap_or_else(|| panic!("{:#?}", log.seen));
    assert!(
        resumed.time.as_ref().unwrap().seconds >= until.seconds,
        "resumed at {:?}, before {until:?}",
        resumed.time
    );
    assert_eq!(cluster.model.request_count(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_parked_at_its_budget_goes_on_when_raised_from_the_inbox() {
    let mut cluster = cluster_without_orchestrator(|_| {}).await;
    // Each tool-call answer counts 15 tokens: the second reaches 30.
    cluster.model.push(Reply::tool_call(
        "c1",
        "read_file",
        json!({"path": "notes.txt"}),
    ));
    cluster.model.push(Reply::tool_call(
        "c2",
        "read_file",
        json!({"path": "todo.txt"}),
    ));
    cluster.model.push(Reply::text("done after the raise"));
    let mut orchestrator = Orchestrator::new(&mut cluster);
    orchestrator.local_config("[agent]\non_budget = \"park\"\nturn_token_budget = 30\n");
    let mut client = orchestrator.start().await;
    let session = client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut log = Log::follow(&cluster, &session.id).await;
    submit(
        &mut client,
        &session.id,
        message("read my notes", ApprovalMode::Policy),
    )
    .await;
    let parked = log
        .until("the turn parks", |k| matches!(k, Kind::TurnParked(_)))
        .await;
    let Some(Kind::TurnParked(parked)) = parked.kind else {
        unreachable!()
    };
    assert_eq!(parked.reason, spb::ParkReason::Budget as i32);
    assert!(parked.until.is_none());
    assert!(parked.message.contains("30 tokens"), "{}", parked.message);
    // The second answer's call did not run; the turn is open.
    assert!(
        !log.seen
            .iter()
            .any(|e| matches!(e.kind, Some(Kind::TurnFinished(_)))),
        "{:#?}",
        log.seen
    );

    // A restart keeps it parked: nothing is asked of the model meanwhile.
    orchestrator.kill();
    let _client = orchestrator.start().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(cluster.model.request_count(), 2);

    // The inbox lists it with the command that lets it go on.
    let out = orchestrator.cli(&["approvals"]).output().unwrap();
    let inbox = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{inbox}");
    assert!(inbox.contains("paused at a spending limit"), "{inbox}");
    assert!(
        inbox.contains(&format!(
            "agentry approvals raise {} --turn-tokens 60",
            session.id
        )),
        "{inbox}"
    );
    // Raising nothing is refused with what to give.
    let out = orchestrator
        .cli(&["approvals", "raise", &session.id])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--turn-tokens"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = orchestrator
        .cli(&[
            "approvals",
            "raise",
            &session.id[..8],
            "--turn-tokens",
            "1000",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = log.finished().await;
    assert_eq!(
        done.outcome,
        TurnOutcome::Completed as i32,
        "{:#?}",
        log.seen
    );
    assert_eq!(done.message, "done after the raise");
    let resumed = log
        .seen
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::TurnResumed(r)) => Some((*r, e.by.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(resumed.0.budget.unwrap().turn_tokens, 1000);
    assert!(!resumed.1.is_empty(), "the raise records who raised it");
    // Nothing is left in the inbox, and raising again is refused.
    let out = orchestrator.cli(&["approvals"]).output().unwrap();
    let inbox = String::from_utf8_lossy(&out.stdout);
    assert!(inbox.contains("no tool call is waiting"), "{inbox}");
    let out = orchestrator
        .cli(&["approvals", "raise", &session.id, "--turn-tokens", "5000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no turn of this session waits"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_while_an_approval_is_pending_it_is_offered_again() {
    let mut cluster = cluster_without_orchestrator(|_| {}).await;
    let mut orchestrator = Orchestrator::new(&mut cluster);
    let mut client = orchestrator.start().await;
    cluster.model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "touch approved.txt && echo ran"}),
    ));
    cluster.model.push(Reply::text("all done"));
    let session = client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut log = Log::follow(&cluster, &session.id).await;
    submit(
        &mut client,
        &session.id,
        message("make it", ApprovalMode::Policy),
    )
    .await;
    log.until("the approval request", |k| {
        matches!(k, Kind::ApprovalRequested(_))
    })
    .await;

    orchestrator.kill();
    let mut client = orchestrator.start().await;
    // The pending approval is offered again...
    let again = log
        .until(
            "the approval offered again",
            |k| matches!(k, Kind::ApprovalRequested(a) if a.call_id == "t1"),
        )
        .await;
    assert!(again.seq > 1);
    // ...and answering it continues the turn.
    submit(
        &mut client,
        &session.id,
        pb::input::Kind::Approval(pb::ApprovalInput {
            call_id: "t1".into(),
            decision: ApprovalDecision::Approve as i32,
            reason: String::new(),
            edited_arguments_json: String::new(),
        }),
    )
    .await;
    let done = log.finished().await;
    assert_eq!(
        done.outcome,
        TurnOutcome::Completed as i32,
        "{:#?}",
        log.seen
    );
    assert!(
        cluster
            .workspace_root()
            .join(&session.id)
            .join("approved.txt")
            .exists()
    );
}

/// What a runner with snapshots off answers (its reason included, as the
/// real runner's).
fn snapshots_off() -> Status {
    agentry_runtime::reasons::status(
        tonic::Code::FailedPrecondition,
        agentry_runtime::reasons::Reason::SnapshotsOff,
        "workspace snapshots are off in this test double",
    )
}

/// A tool runner double speaking our own gRPC contract: the first call of
/// each call id hangs (so the orchestrator can be killed mid-call); a
/// repeated call answers at once.
#[derive(Clone, Default)]
struct HangingRunner {
    calls: Arc<Mutex<Vec<(String, String)>>>,
}

type ExecStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<tpb::ExecuteResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ToolRunner for HangingRunner {
    async fn list_tools(
        &self,
        _request: Request<tpb::ListToolsRequest>,
    ) -> Result<Response<tpb::ListToolsResponse>, Status> {
        let tool = |name: &str, read_only: bool| tpb::ToolSpec {
            name: name.into(),
            description: format!("{name} (test double)"),
            parameters_json_schema: json!({"type": "object"}).to_string(),
            read_only,
            parallel_safe: read_only,
            sensitive: !read_only,
            ..tpb::ToolSpec::default()
        };
        Ok(Response::new(tpb::ListToolsResponse {
            tools: vec![tool("slow_read", true), tool("slow_write", false)],
            runner_id: "hanging-runner".into(),
            sandbox: Vec::new(),
            mcp_servers: Vec::new(),
        }))
    }

    type ExecuteStream = ExecStream;
    type McpWatchStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<tpb::McpResourceUpdate, Status>> + Send>,
    >;

    async fn mcp_subscribe(
        &self,
        _request: Request<tpb::McpSubscribeRequest>,
    ) -> Result<Response<tpb::McpSubscribeResponse>, Status> {
        Err(Status::failed_precondition(
            "no MCP servers in this test double",
        ))
    }

    async fn mcp_session_servers(
        &self,
        _request: Request<tpb::McpSessionServersRequest>,
    ) -> Result<Response<tpb::McpSessionServersResponse>, Status> {
        Err(Status::failed_precondition(
            "no MCP servers in this test double",
        ))
    }

    async fn snapshot(
        &self,
        _request: Request<tpb::SnapshotRequest>,
    ) -> Result<Response<tpb::SnapshotResponse>, Status> {
        Err(snapshots_off())
    }

    async fn restore_snapshot(
        &self,
        _request: Request<tpb::RestoreSnapshotRequest>,
    ) -> Result<Response<tpb::RestoreSnapshotResponse>, Status> {
        Err(snapshots_off())
    }

    async fn prune_snapshots(
        &self,
        _request: Request<tpb::PruneSnapshotsRequest>,
    ) -> Result<Response<tpb::PruneSnapshotsResponse>, Status> {
        Err(snapshots_off())
    }

    async fn preview(
        &self,
        _request: Request<tpb::PreviewRequest>,
    ) -> Result<Response<tpb::PreviewResponse>, Status> {
        Err(Status::unimplemented("no previews in this test double"))
    }

    async fn run_hook(
        &self,
        _request: Request<tpb::RunHookRequest>,
    ) -> Result<Response<tpb::RunHookResponse>, Status> {
        Err(Status::unimplemented("no hooks in this test double"))
    }

    async fn forget_session(
        &self,
        _request: Request<tpb::ForgetSessionRequest>,
    ) -> Result<Response<tpb::ForgetSessionResponse>, Status> {
        Ok(Response::new(tpb::ForgetSessionResponse::default()))
    }

    async fn read_image(
        &self,
        _request: Request<tpb::ReadImageRequest>,
    ) -> Result<Response<tpb::ReadImageResponse>, Status> {
        Err(Status::unimplemented("this runner reads no images"))
    }

    async fn read_instructions(
        &self,
        _request: Request<tpb::ReadInstructionsRequest>,
    ) -> Result<Response<tpb::ReadInstructionsResponse>, Status> {
        Ok(Response::new(tpb::ReadInstructionsResponse::default()))
    }

    async fn open_project(
        &self,
        _request: Request<tpb::OpenProjectRequest>,
    ) -> Result<Response<tpb::OpenProjectResponse>, Status> {
        Err(Status::permission_denied("no projects in this test double"))
    }

    async fn mcp_read_resource(
        &self,
        _request: Request<tpb::McpReadResourceRequest>,
    ) -> Result<Response<tpb::McpReadResourceResponse>, Status> {
        Err(Status::failed_precondition(
            "no MCP servers in this test double",
        ))
    }

    async fn mcp_watch(
        &self,
        _request: Request<tonic::Streaming<tpb::McpWatchRequest>>,
    ) -> Result<Response<Self::McpWatchStream>, Status> {
        Err(Status::failed_precondition(
            "no MCP servers in this test double",
        ))
    }

    async fn execute(
        &self,
        request: Request<tpb::ExecuteRequest>,
    ) -> Result<Response<Self::ExecuteStream>, Status> {
        let req = request.into_inner();
        let first = {
            let mut calls = self.calls.lock().unwrap();
            let first = !calls.iter().any(|(id, _)| *id == req.call_id);
            calls.push((req.call_id.clone(), req.tool.clone()));
            first
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let chunk = tpb::ExecuteResponse {
                kind: Some(tpb::execute_response::Kind::Chunk(tpb::OutputChunk {
                    stream: spb::OutputStream::Stdout as i32,
                    text: "working\n".into(),
                })),
            };
            if tx.send(Ok(chunk)).await.is_err() {
                return;
            }
            if first {
                // Hang until the caller goes away.
                tx.closed().await;
                return;
            }
            let result = tpb::ExecuteResponse {
                kind: Some(tpb::execute_response::Kind::Result(tpb::ExecuteResult {
                    output: format!("fresh result of {}", req.tool),
                    runner_id: "hanging-runner".into(),
                    ..Default::default()
                })),
            };
            let _ = tx.send(Ok(result)).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_while_tools_run_read_only_calls_rerun_and_mutating_ones_report_unknown() {
    let (cluster, runner, mut orchestrator, mut client) = with_hanging_runner().await;
    cluster
        .model
        .push(Reply::tool_call("r1", "slow_read", json!({})));
    cluster
        .model
        .push(Reply::tool_call("w1", "slow_write", json!({})));
    cluster.model.push(Reply::text("done"));
    let session = client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut log = Log::follow(&cluster, &session.id).await;
    submit(
        &mut client,
        &session.id,
        message("go", ApprovalMode::Always),
    )
    .await;

    // (1) Killed while a read-only call runs: it is run again.
    log.until(
        "r1 running",
        |k| matches!(k, Kind::ToolOutputChunk(c) if c.call_id == "r1"),
    )
    .await;
    orchestrator.kill();
    orchestrator.start().await;
    let r1 = log
        .until(
            "r1's result",
            |k| matches!(k, Kind::ToolResult(r) if r.call_id == "r1"),
        )
        .await;
    match r1.kind {
        Some(Kind::ToolResult(r)) => {
            assert!(!r.is_error, "{r:?}");
            assert_eq!(r.output, "fresh result of slow_read");
        }
        _ => unreachable!(),
    }

    // (2) Killed while a mutating call runs: never silently re-run; the
    // model is told its outcome is unknown.
    log.until(
        "w1 running",
        |k| matches!(k, Kind::ToolOutputChunk(c) if c.call_id == "w1"),
    )
    .await;
    orchestrator.kill();
    orchestrator.start().await;
    let done = log.finished().await;
    assert_eq!(
        done.outcome,
        TurnOutcome::Completed as i32,
        "{:#?}",
        log.seen
    );
    let w1 = log
        .seen
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::ToolResult(r)) if r.call_id == "w1" => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    assert!(w1.is_error);
    assert!(
        w1.output.contains("outcome unknown: the runtime restarted"),
        "{}",
        w1.output
    );
    let calls = runner.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![
            ("r1".to_string(), "slow_read".to_string()),
            ("r1".to_string(), "slow_read".to_string()),
            ("w1".to_string(), "slow_write".to_string()),
        ]
    );
    let requests = cluster.model.requests();
    let last = requests[2]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["tool_call_id"], "w1");
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .contains("outcome unknown")
    );
}

/// A plan-mode turn survives the orchestrator: killed while the model works
/// on step 2, the restarted orchestrator rebuilds the plan from the log and
/// asks for step 2 again.
#[tokio::test(flavor = "multi_thread")]
async fn killed_mid_plan_the_plan_resumes_at_its_step() {
    let mut cluster = cluster_without_orchestrator(|_| {}).await;
    let mut orchestrator = Orchestrator::new(&mut cluster);
    let mut client = orchestrator.start().await;
    let model = &cluster.model;
    model.push(Reply::tool_call(
        "p1",
        "submit_plan",
        json!({"steps": ["one", "two"]}),
    ));
    model.push(Reply::tool_call(
        "c1",
        "complete_step",
        json!({"status": "completed", "summary": "one done"}),
    ));
    model.push(Reply::stream(vec![
        text("working on two "),
        pause(Duration::from_secs(30)),
        text("never sent"),
    ]));
    model.push(Reply::tool_call(
        "c2",
        "complete_step",
        json!({"status": "completed", "summary": "two done"}),
    ));
    model.push(Reply::text("Both steps are done."));
    let session = client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut log = Log::follow(&cluster, &session.id).await;
    let mut live = Live::follow(&mut client, &session.id).await;
    submit(
        &mut client,
        &session.id,
        pb::input::Kind::UserMessage(pb::UserInput {
            images: Vec::new(),
            text: "do one then two".into(),
            approval_mode: ApprovalMode::Always as i32,
            plan: true,
            network: false,
            budget: None,
            compact: false,
            interrupt: false,
        }),
    )
    .await;
    assert_eq!(live.text("step 2's first delta").await, "working on two ");

    orchestrator.kill();
    let _client = orchestrator.start().await;
    let done = log.finished().await;
    assert_eq!(
        done.outcome,
        TurnOutcome::Completed as i32,
        "{:#?}",
        log.seen
    );
    assert_eq!(done.message, "Both steps are done.");
    let trail: Vec<(u32, i32)> = log
        .seen
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::PlanStepUpdated(u)) => Some((u.index, u.status)),
            _ => None,
        })
        .collect();
    use spb::PlanStepStatus::{Completed, InProgress};
    assert_eq!(
        trail,
        [
            (0, InProgress as i32),
            (0, Completed as i32),
            (1, InProgress as i32),
            (1, Completed as i32),
        ]
    );
    // The retried call was told to carry out step 2, with step 1 done.
    let requests = cluster.model.requests();
    assert_eq!(requests.len(), 5);
    let system: String = requests[3]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "system")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert!(system.contains("Carry out step 2 only"), "{system}");
    assert!(system.contains("1. [done] one -> one done"), "{system}");
}

/// A cluster whose tool runner is a [`HangingRunner`], and an orchestrator
/// process (started) with a client of it.
async fn with_hanging_runner() -> (
    Cluster,
    HangingRunner,
    Orchestrator,
    agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient<
        agentry_testkit::cluster::Channel,
    >,
) {
    let mut cluster = Cluster::start_only(&[Service::SessionStore, Service::Scheduler], |_| {})
        .await
        .unwrap();
    let runner = HangingRunner::default();
    let listener = cluster.take_listener(Service::ToolRunner).unwrap();
    let serve = runner.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(ToolRunnerServer::new(serve))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });
    let mut orchestrator = Orchestrator::new(&mut cluster);
    let client = orchestrator.start().await;
    (cluster, runner, orchestrator, client)
}

/// Killed while a mutating call runs in a turn a person attends: after the
/// restart the person is asked what to do with it, and `choice` is the
/// answer. Returns the call's result and the runner's calls.
async fn killed_mid_write_then(
    choice: ApprovalDecision,
) -> (spb::ToolResult, Vec<(String, String)>) {
    let (cluster, runner, mut orchestrator, mut client) = with_hanging_runner().await;
    cluster
        .model
        .push(Reply::tool_call("w1", "slow_write", json!({})));
    cluster.model.push(Reply::text("done"));
    let session = client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut log = Log::follow(&cluster, &session.id).await;
    submit(
        &mut client,
        &session.id,
        message("write it", ApprovalMode::Policy),
    )
    .await;
    let decide = |call: &str, decision: ApprovalDecision| {
        pb::input::Kind::Approval(pb::ApprovalInput {
            call_id: call.into(),
            decision: decision as i32,
            reason: String::new(),
            edited_arguments_json: String::new(),
        })
    };
    log.until("w1's approval", |k| matches!(k, Kind::ApprovalRequested(_)))
        .await;
    submit(
        &mut client,
        &session.id,
        decide("w1", ApprovalDecision::Approve),
    )
    .await;
    log.until(
        "w1 running",
        |k| matches!(k, Kind::ToolOutputChunk(c) if c.call_id == "w1"),
    )
    .await;

    orchestrator.kill();
    let mut client = orchestrator.start().await;
    // Not run again on its own: the person is asked.
    let asked = log
        .until(
            "the question about w1",
            |k| matches!(k, Kind::ApprovalRequested(a) if a.call_id == "w1" && a.outcome_unknown),
        )
        .await;
    match asked.kind {
        Some(Kind::ApprovalRequested(a)) => {
            assert!(a.matched_rule.contains("outcome unknown"), "{a:?}")
        }
        _ => unreachable!(),
    }
    assert_eq!(runner.calls.lock().unwrap().len(), 1);
    submit(&mut client, &session.id, decide("w1", choice)).await;
    let done = log.finished().await;
    assert_eq!(
        done.outcome,
        TurnOutcome::Completed as i32,
        "{:#?}",
        log.seen
    );
    let result = log
        .seen
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::ToolResult(r)) if r.call_id == "w1" => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    let calls = runner.calls.lock().unwrap().clone();
    (result, calls)
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_mid_write_the_person_chooses_check() {
    let (result, calls) = killed_mid_write_then(ApprovalDecision::Check).await;
    assert!(result.is_error);
    assert!(
        result
            .output
            .contains("outcome unknown: the runtime restarted"),
        "{}",
        result.output
    );
    assert_eq!(calls.len(), 1, "not run again: {calls:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_mid_write_the_person_chooses_run_again() {
    let (result, calls) = killed_mid_write_then(ApprovalDecision::Approve).await;
    assert!(!result.is_error, "{result:?}");
    assert_eq!(result.output, "fresh result of slow_write");
    assert_eq!(
        calls,
        vec![
            ("w1".to_string(), "slow_write".to_string()),
            ("w1".to_string(), "slow_write".to_string()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_mid_write_the_person_chooses_skip() {
    let (result, calls) = killed_mid_write_then(ApprovalDecision::Deny).await;
    assert!(result.is_error);
    assert!(
        result.output.starts_with("error: not run again"),
        "{}",
        result.output
    );
    assert_eq!(calls.len(), 1, "not run again: {calls:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_typed_while_the_orchestrator_is_down_is_sent_once_it_is_back() {
    use std::io::Write as _;
    let mut cluster = cluster_without_orchestrator(|_| {}).await;
    let mut orchestrator = Orchestrator::new(&mut cluster);
    let mut client = orchestrator.start().await;
    cluster.model.push(Reply::text("one"));
    cluster.model.push(Reply::text("two"));
    let session = client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut log = Log::follow(&cluster, &session.id).await;
    let errors = tempfile::NamedTempFile::new().unwrap();
    let output = tempfile::NamedTempFile::new().unwrap();
    let mut chat = orchestrator
        .cli(&["chat", "--session", &session.id])
        .stdin(std::process::Stdio::piped())
        .stdout(output.reopen().unwrap())
        .stderr(errors.reopen().unwrap())
        .spawn()
        .unwrap();
    let mut typed = chat.stdin.take().unwrap();
    let wait_for = |file: &std::path::Path, needle: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(file).unwrap();
            if text.contains(needle) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the chat did not say {needle:?}: {text}\n{}",
                std::fs::read_to_string(errors.path()).unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    writeln!(typed, "hello one").unwrap();
    log.finished().await;
    // The chat saw the turn end too.
    wait_for(output.path(), "(1 step");

    orchestrator.kill();
    writeln!(typed, "hello two").unwrap();
    wait_for(
        errors.path(),
        "the message is kept and sent once it is back",
    );
    orchestrator.start().await;
    let sent = log
        .until(
            "the kept message",
            |k| matches!(k, Kind::UserMessage(m) if m.text == "hello two"),
        )
        .await;
    assert!(sent.seq > 1);
    assert_eq!(log.finished().await.outcome, TurnOutcome::Completed as i32);
    drop(typed);
    let status = chat.wait().unwrap();
    let stderr = std::fs::read_to_string(errors.path()).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("the orchestrator answers again: the message was sent"),
        "{stderr}"
    );
    // Sent once: one such message in the log.
    let copies = log
        .seen
        .iter()
        .filter(|e| matches!(&e.kind, Some(Kind::UserMessage(m)) if m.text == "hello two"))
        .count();
    assert_eq!(copies, 1);
}

/// The output of a CLI command that must succeed.
fn cli_ok(orchestrator: &Orchestrator, args: &[&str]) -> String {
    let out = orchestrator.cli(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "agentry {args:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_while_an_mcp_server_asks_the_question_waits_in_the_inbox_and_its_answer_goes_on() {
    let Some(venv) = agentry_fakes::mcp_servers::venv() else {
        return;
    };
    let asking = agentry_fakes::mcp_servers::HttpFixture::asking(&venv).unwrap();
    let url = asking.url();
    let mut cluster = cluster_without_orchestrator(|c| {
        c.mcp_servers
            .push(agentry_runtime::config::McpServerConfig {
                name: "ask".into(),
                url,
                enabled: true,
                ..Default::default()
            });
    })
    .await;
    let mut orchestrator = Orchestrator::new(&mut cluster);
    let mut client = orchestrator.start().await;
    // The server's tools are offered before the model asks for one.
    agentry_testkit::cluster::wait_for_tool(&mut client, "ask__deploy")
        .await
        .unwrap();
    cluster.model.push(Reply::tool_call(
        "d1",
        "ask__deploy",
        json!({"target": "web"}),
    ));
    cluster.model.push(Reply::text("deployed, as you said"));
    let session = client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut log = Log::follow(&cluster, &session.id).await;
    // Every call approved ahead: the server's question still goes to a
    // person (it is not an approval).
    submit(
        &mut client,
        &session.id,
        message("deploy web", ApprovalMode::Always),
    )
    .await;
    log.until(
        "the server's question",
        |k| matches!(k, Kind::McpInputRequested(q) if q.call_id == "d1"),
    )
    .await;
    let inbox = cli_ok(&orchestrator, &["approvals"]);
    assert!(
        inbox.contains("the MCP server ask asks") && inbox.contains("Deploy web to production?"),
        "{inbox}"
    );
    assert!(inbox.contains("confirm (boolean, required)"), "{inbox}");

    orchestrator.kill();
    let _client = orchestrator.start().await;
    // After the restart the question still waits, and nothing else ran.
    let inbox = cli_ok(&orchestrator, &["approvals", "--json"]);
    let entry: serde_json::Value = serde_json::from_str(inbox.lines().next().unwrap()).unwrap();
    assert_eq!(entry["call_id"], "d1", "{inbox}");
    assert_eq!(entry["question"]["questions"][0]["key"], "approval");
    // A wrong answer is refused with what the question wants…
    let out = orchestrator
        .cli(&[
            "approvals",
            "reply",
            &session.id,
            "d1",
            "--set",
            "confirm=maybe",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(why.contains("must be true or false"), "{why}");
    // …and the right one lets the server's task finish the call.
    let said = cli_ok(
        &orchestrator,
        &[
            "approvals",
            "reply",
            &session.id,
            "d1",
            "--set",
            "confirm=true",
            "--set",
            "note=after the freeze",
        ],
    );
    assert!(said.contains("d1: accepted"), "{said}");
    let done = log.finished().await;
    assert_eq!(
        done.outcome,
        TurnOutcome::Completed as i32,
        "{:#?}",
        log.seen
    );
    let result = log
        .seen
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::ToolResult(r)) if r.call_id == "d1" => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    assert!(!result.is_error, "{result:?}");
    assert_eq!(result.output, "deployed web (note: after the freeze)");
    let answered = log
        .seen
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::McpInputProvided(_)) => Some(e.clone()),
            _ => None,
        })
        .unwrap();
    // Recorded with who answered, as approvals are.
    assert!(!answered.by.is_empty(), "{answered:?}");
    assert!(cli_ok(&orchestrator, &["approvals"]).contains("no tool call is waiting"));
}
