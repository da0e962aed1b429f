//! One chat turn through four service processes (`agentry serve …`), each
//! exporting spans over OTLP to a collector in this test (a real tonic
//! server of the OTLP trace service): one trace, spans from every service,
//! correct parent links, trace context on the model request, and no secret
//! in any log line or span.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_proto::sessions::v1::{ApprovalMode, event::Kind};
use agentry_testkit::fake_model::{FakeModel, Reply};
use common::BIN;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_stream::StreamExt;

const API_KEY: &str = "sk-secret-never-logged-4711";
const CRAWL_TOKEN: &str = "c4-token-never-logged-9931";

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
    raw: Arc<Mutex<String>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let request = request.into_inner();
        self.raw.lock().unwrap().push_str(&format!("{request:?}"));
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.clone())
                .map(|v| match v {
                    AnyValue::StringValue(s) => s,
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    self.spans.lock().unwrap().push((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
        .map(|v| match v {
            AnyValue::StringValue(s) => s,
            AnyValue::IntValue(i) => i.to_string(),
            AnyValue::BoolValue(b) => b.to_string(),
            other => format!("{other:?}"),
        })
}

struct Services {
    children: Vec<(String, Child)>,
    logs: tempfile::TempDir,
}

impl Services {
    fn stop(&mut self) {
        for (_, child) in &self.children {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        for (name, child) in &mut self.children {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                assert!(Instant::now() < deadline, "{name} did not stop on SIGTERM");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn logs(&self) -> String {
        let mut all = String::new();
        for (name, _) in &self.children {
            all.push_str(
                &std::fs::read_to_string(self.logs.path().join(format!("{name}.log")))
                    .unwrap_or_default(),
            );
        }
        all
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_turn_is_one_trace_across_every_service() {
    // The collector.
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", listener.local_addr().unwrap());
    let server = collector.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(server))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });

    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "c1",
        "list_dir",
        serde_json::json!({"path": "."}),
    ));
    model.push(Reply::tool_call(
        "c2",
        "schedule_reminder",
        serde_json::json!({"message": "stretch", "due": "in 1h"}),
    ));
    model.push(Reply::text("Listed and scheduled."));

    let data = tempfile::tempdir().unwrap();
    let config = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let names = ["session-store", "tool-runner", "scheduler", "orchestrator"];
    let vars = ["SESSION_STORE", "TOOL_RUNNER", "SCHEDULER", "ORCHESTRATOR"];
    let mut env: Vec<(String, String)> = vec![
        (
            "AGENTRY_CONFIG_DIR".into(),
            config.path().display().to_string(),
        ),
        ("AGENTRY_DATA_DIR".into(), data.path().display().to_string()),
        ("AGENTRY_LLM_BASE_URL".into(), model.base_url()),
        ("AGENTRY_LLM_MODEL".into(), "fake-model".into()),
        ("AGENTRY_LLM_API_KEY".into(), API_KEY.into()),
        ("AGENTRY_CRAWL4AI_URL".into(), "http://127.0.0.1:9".into()),
        ("AGENTRY_CRAWL4AI_TOKEN".into(), CRAWL_TOKEN.into()),
        ("AGENTRY_OTLP_ENDPOINT".into(), otlp.clone()),
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
        (
            "AGENTRY_LOG".into(),
            "info,agentry_orchestrator=debug,agentry_llm=debug,agentry_runtime=debug,\
             agentry_tool_runner=debug,agentry_scheduler=debug,agentry_session_store=debug"
                .into(),
        ),
    ];
    let mut urls = BTreeMap::new();
    for var in vars {
        let port = free_port();
        env.push((format!("AGENTRY_{var}_LISTEN"), format!("127.0.0.1:{port}")));
        env.push((
            format!("AGENTRY_{var}_URL"),
            format!("http://127.0.0.1:{port}"),
        ));
        urls.insert(var, format!("http://127.0.0.1:{port}"));
    }
    let mut services = Services {
        children: Vec::new(),
        logs,
    };
    for name in names {
        let log = std::fs::File::create(services.logs.path().join(format!("{name}.log"))).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", name])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &env {
            cmd.env(k, v);
        }
        if name == "orchestrator" {
            cmd.args(["--log-format", "json"]);
        }
        services
            .children
            .push((name.to_string(), cmd.spawn().unwrap()));
    }
    for var in vars {
        agentry_testkit::cluster::connect(&urls[var]).await.unwrap();
    }

    // One turn, with the client token the services created.
    let client_token =
        agentry_runtime::auth::read_token(&data.path().join("auth/client.token")).unwrap();
    let service_token =
        agentry_runtime::auth::read_token(&data.path().join("auth/service.token")).unwrap();
    let mut client = OrchestratorClient::new(
        agentry_testkit::cluster::connect_as(
            &agentry_runtime::Auth::client_with(Some(client_token.clone())),
            &urls["ORCHESTRATOR"],
        )
        .await
        .unwrap(),
    );
    let session_id = client
        .create_session(opb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .id;
    common::submit(
        &mut client,
        &session_id,
        common::message("list and remind me", ApprovalMode::Policy),
    )
    .await;
    let mut events = client
        .subscribe(opb::SubscribeRequest {
            session_id: session_id.clone(),
            from_seq: 0,
            live_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut turn_id = String::new();
    let finished = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = events.next().await {
            let event = event.unwrap();
            if let Some(Kind::TurnFinished(f)) = event.kind {
                turn_id = event.turn_id;
                return f;
            }
        }
        panic!("the event stream ended");
    })
    .await
    .expect("the turn did not finish");
    assert_eq!(finished.message, "Listed and scheduled.");

    // The turn's span closes just after its last event is stored: wait for
    // it to be exported (every 100 ms here), then SIGTERM flushes the rest.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !collector
        .spans
        .lock()
        .unwrap()
        .iter()
        .any(|(_, s)| s.name == "turn")
    {
        assert!(
            Instant::now() < deadline,
            "the turn span was never exported"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    services.stop();
    let spans = collector.spans.lock().unwrap().clone();
    let turn = spans
        .iter()
        .find(|(_, s)| s.name == "turn" && attribute(s, "turn_id").as_deref() == Some(&turn_id))
        .unwrap_or_else(|| panic!("no turn span among {} spans", spans.len()))
        .1
        .clone();
    assert_eq!(
        attribute(&turn, "session_id").as_deref(),
        Some(&*session_id)
    );
    assert_eq!(
        attribute(&turn, "outcome").as_deref(),
        Some("TURN_OUTCOME_COMPLETED")
    );
    assert!(
        turn.parent_span_id.is_empty(),
        "the turn is the trace's root"
    );
    let trace: Vec<&(String, Span)> = spans
        .iter()
        .filter(|(_, s)| s.trace_id == turn.trace_id)
        .collect();
    let services_seen: BTreeSet<&str> = trace.iter().map(|(svc, _)| svc.as_str()).collect();
    assert_eq!(
        services_seen,
        BTreeSet::from([
            "agentry-orchestrator",
            "agentry-session-store",
            "agentry-tool-runner",
            "agentry-scheduler"
        ]),
        "services in the turn's trace"
    );

    // Parent links: every span but the root has its parent in the trace.
    let by_id: BTreeMap<&[u8], &Span> = trace
        .iter()
        .map(|(_, s)| (s.span_id.as_slice(), s))
        .collect();
    for (svc, span) in &trace {
        if span.span_id == turn.span_id {
            continue;
        }
        let parent = by_id
            .get(span.parent_span_id.as_slice())
            .unwrap_or_else(|| panic!("{svc} span {} has no parent in the trace", span.name));
        let _ = parent;
    }
    let parent_name = |span: &Span| by_id[span.parent_span_id.as_slice()].name.clone();
    let find = |svc: &str, name: &str| -> Vec<&Span> {
        trace
            .iter()
            .filter(|(s, span)| s == svc && span.name == name)
            .map(|(_, span)| span)
            .collect()
    };
    let model_calls = find("agentry-orchestrator", "model_call");
    assert_eq!(model_calls.len(), 3, "three model calls");
    for call in &model_calls {
        assert_eq!(call.parent_span_id, turn.span_id);
        assert_eq!(attribute(call, "model").as_deref(), Some("fake-model"));
        assert_eq!(attribute(call, "outcome").as_deref(), Some("ok"));
    }
    let tool_calls = find("agentry-orchestrator", "tool_call");
    assert_eq!(tool_calls.len(), 2, "two tool calls");
    let list = tool_calls
        .iter()
        .find(|s| attribute(s, "tool").as_deref() == Some("list_dir"))
        .unwrap();
    assert_eq!(list.parent_span_id, turn.span_id);
    assert_eq!(attribute(list, "outcome").as_deref(), Some("ok"));
    assert!(attribute(list, "runner_id").is_some_and(|r| !r.is_empty()));
    let execute = find("agentry-tool-runner", "agentry.tools.v1.ToolRunner/Execute");
    assert_eq!(execute.len(), 1);
    assert_eq!(
        execute[0].parent_span_id, list.span_id,
        "runner span under the tool call"
    );
    let create = find(
        "agentry-scheduler",
        "agentry.scheduler.v1.Scheduler/CreateReminder",
    );
    assert_eq!(create.len(), 1);
    assert_eq!(parent_name(create[0]), "tool_call");
    let appends = find(
        "agentry-session-store",
        "agentry.sessions.v1.SessionStore/Append",
    );
    assert!(appends.len() >= 3, "{} appends", appends.len());
    for append in appends {
        assert_eq!(parent_name(append), "store.append");
    }

    // The model request carried the trace context of its model_call span.
    let traceparents: Vec<String> = model
        .request_headers()
        .iter()
        .filter_map(|h| {
            h.iter()
                .find(|(k, _)| k == "traceparent")
                .map(|(_, v)| v.clone())
        })
        .collect();
    assert_eq!(traceparents.len(), 3, "{:?}", model.request_headers());
    let trace_hex: String = turn.trace_id.iter().map(|b| format!("{b:02x}")).collect();
    for tp in &traceparents {
        assert!(tp.starts_with(&format!("00-{trace_hex}-")), "{tp}");
    }

    // Secrets appear in no log line and no span.
    let logs = services.logs();
    let orchestrator_log =
        std::fs::read_to_string(services.logs.path().join("orchestrator.log")).unwrap();
    let mut in_turn = 0;
    for line in orchestrator_log.lines() {
        let json: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        let Some(spans) = json["spans"].as_array() else {
            continue;
        };
        if let Some(turn) = spans.iter().find(|s| s["name"] == "turn") {
            assert_eq!(turn["session_id"], *session_id, "{line}");
            assert_eq!(turn["turn_id"], *turn_id, "{line}");
            in_turn += 1;
        }
    }
    assert!(
        in_turn >= 3,
        "log lines inside the turn: {in_turn}\n{orchestrator_log}"
    );
    let raw = collector.raw.lock().unwrap().clone();
    for secret in [
        API_KEY,
        CRAWL_TOKEN,
        client_token.secret(),
        service_token.secret(),
    ] {
        assert!(!logs.contains(secret), "a secret was logged");
        assert!(!raw.contains(secret), "a secret is in a span");
    }
}
