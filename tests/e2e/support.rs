//! Helpers shared by the end-to-end tests.

use agentry_proto::orchestrator::v1::{self as pb, orchestrator_client::OrchestratorClient};
use agentry_proto::sessions::v1::{self as spb, event::Kind};
use agentry_testkit::cluster::Channel;
use std::time::Duration;
use tonic::Streaming;

/// A user-message input.
pub fn user(text: &str) -> pb::Input {
    user_input(text, spb::ApprovalMode::Always, false)
}

/// A user-message input with an approval mode, in plan mode or not.
pub fn user_input(text: &str, mode: spb::ApprovalMode, plan: bool) -> pb::Input {
    pb::Input {
        kind: Some(pb::input::Kind::UserMessage(pb::UserInput {
            images: Vec::new(),
            text: text.to_string(),
            approval_mode: mode as i32,
            plan,
            network: false,
            budget: None,
            compact: false,
            interrupt: false,
        })),
    }
}

/// The names of the tools a recorded model request offered.
pub fn offered_tools(request: &serde_json::Value) -> Vec<&str> {
    request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default()
}

/// Creates a session and subscribes to it from the start.
pub async fn new_session(
    client: &mut OrchestratorClient<Channel>,
) -> (spb::Session, Streaming<spb::Event>) {
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
    (session, events)
}

/// Submits a message with an approval mode, in plan mode or not; returns
/// the turn id.
pub async fn send_with(
    client: &mut OrchestratorClient<Channel>,
    session_id: &str,
    text: &str,
    mode: spb::ApprovalMode,
    plan: bool,
) -> String {
    client
        .submit(pb::SubmitRequest {
            session_id: session_id.to_string(),
            input: Some(user_input(text, mode, plan)),
        })
        .await
        .unwrap()
        .into_inner()
        .turn_id
}

/// Submits a message (every call approved) and returns the turn id.
pub async fn send(
    client: &mut OrchestratorClient<Channel>,
    session_id: &str,
    text: &str,
) -> String {
    send_with(client, session_id, text, spb::ApprovalMode::Always, false).await
}

/// Sends each message in turn; every turn must complete.
pub async fn converse(
    client: &mut OrchestratorClient<Channel>,
    session_id: &str,
    events: &mut Streaming<spb::Event>,
    messages: &[&str],
) {
    for message in messages {
        let turn = send(client, session_id, message).await;
        let done = finished(&until_finished(events, &turn).await);
        assert_eq!(
            done.outcome,
            spb::TurnOutcome::Completed as i32,
            "{message}: {}",
            done.message
        );
    }
}

/// Reads events until the turn `turn_id` finishes; returns every event read.
pub async fn until_finished(events: &mut Streaming<spb::Event>, turn_id: &str) -> Vec<spb::Event> {
    let mut out = Vec::new();
    let result = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = events.message().await.unwrap() {
            let done =
                matches!(event.kind, Some(Kind::TurnFinished(_))) && event.turn_id == turn_id;
            out.push(event);
            if done {
                return;
            }
        }
        panic!("the event stream ended before turn {turn_id} finished");
    })
    .await;
    assert!(
        result.is_ok(),
        "turn {turn_id} did not finish in 30 s; events so far: {out:#?}"
    );
    out
}

/// The kind names of events, for comparing sequences.
pub fn kinds(events: &[spb::Event]) -> Vec<&'static str> {
    events
        .iter()
        .map(|e| e.kind.as_ref().map_or("(none)", Kind::name))
        .collect()
}

/// The last event, which must be a TurnFinished.
pub fn finished(events: &[spb::Event]) -> spb::TurnFinished {
    match events.last().and_then(|e| e.kind.clone()) {
        Some(Kind::TurnFinished(f)) => f,
        other => panic!("last event is not turn_finished: {other:?}"),
    }
}

/// All tool results among `events`.
pub fn tool_results(events: &[spb::Event]) -> Vec<spb::ToolResult> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ToolResult(r)) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

/// Reads a session's whole log from the store.
pub async fn read_log(
    store: &mut agentry_proto::sessions::v1::session_store_client::SessionStoreClient<Channel>,
    session_id: &str,
) -> Vec<spb::Event> {
    store
        .read(spb::ReadRequest {
            session_id: session_id.to_string(),
            from_seq: 1,
            limit: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events
}

/// Answers a pending approval.
pub async fn decide(
    client: &mut OrchestratorClient<Channel>,
    session_id: &str,
    call_id: &str,
    decision: spb::ApprovalDecision,
    reason: &str,
    edited: &str,
) -> Result<pb::SubmitResponse, tonic::Status> {
    client
        .submit(pb::SubmitRequest {
            session_id: session_id.to_string(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::Approval(pb::ApprovalInput {
                    call_id: call_id.to_string(),
                    decision: decision as i32,
                    reason: reason.to_string(),
                    edited_arguments_json: edited.to_string(),
                })),
            }),
        })
        .await
        .map(|r| r.into_inner())
}

/// Reads events until an approval is requested; returns it and what came before.
pub async fn until_approval(
    events: &mut Streaming<spb::Event>,
) -> (spb::ApprovalRequested, Vec<spb::Event>) {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(e) = events.message().await.unwrap() {
            let request = match &e.kind {
                Some(Kind::ApprovalRequested(a)) => Some(a.clone()),
                _ => None,
            };
            seen.push(e);
            if let Some(a) = request {
                return a;
            }
        }
        panic!("stream ended before an approval request");
    })
    .await
    .expect("an approval request within 20 s");
    (found, seen)
}

/// A value on a service's metrics page at `addr` (`host:port`): the first
/// series named `series` exactly (labels included, as the page writes them).
pub async fn metric(addr: &str, series: &str) -> f64 {
    let page = metrics_page(addr).await;
    series_value(&page, series)
        .unwrap_or_else(|| panic!("no {series} on the metrics page at {addr}:\n{page}"))
}

/// A counter's value on the metrics page at `addr`; 0 while it is not on
/// the page (nothing counted yet).
pub async fn counted(addr: &str, series: &str) -> f64 {
    series_value(&metrics_page(addr).await, series).unwrap_or(0.0)
}

async fn metrics_page(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: metrics\r\n\r\n")
        .await
        .unwrap();
    let mut page = String::new();
    conn.read_to_string(&mut page).await.unwrap();
    page
}

fn series_value(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse::<f64>().ok())
}

/// A loopback address nothing listens on now, for a metrics page.
pub fn metrics_addr() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}
