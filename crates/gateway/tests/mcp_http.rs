//! Agentry's MCP server over streamable HTTP on the gateway (`/mcp`),
//! driven by an MCP host written with the official MCP Python SDK
//! (`crates/fakes/mcp/host.py`, the `mcp` package of
//! `scripts/mcp-servers.sh`) with a person's bearer token: the tools, a
//! task that asks about its call, the approval, the answer; the call is
//! recorded as that person's. Without a token the endpoint answers 401.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_fakes::fake_model::Reply;
use agentry_proto::sessions::v1::event::Kind;
use serde_json::json;
use std::time::Duration;

const HOST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fakes/mcp/host.py");

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_host_over_http_runs_a_task_as_the_person_its_token_names() {
    let Some(venv) = agentry_fakes::mcp_servers::venv() else {
        return;
    };
    let (cluster, ann, _bob) = common::with_people().await;
    cluster.model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "echo marker written | tee marker.txt"}),
    ));
    cluster.model.push(Reply::text("The marker is written."));
    let url = format!("{}/mcp", common::base(&cluster));

    let anonymous = reqwest::Client::new()
        .post(&url)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);

    let seen = common::python(
        &venv,
        HOST,
        &["--http", &url],
        &[("AGENTRY_TOKEN", ann.secret())],
    )
    .await;
    assert_eq!(seen["done"]["status"], "completed");

    // The message and the approval are Ann's.
    let session = seen["started"]["session_id"].as_str().unwrap();
    let by = common::senders(&cluster, session, 1, |k| {
        matches!(k, Kind::UserMessage(_) | Kind::ApprovalDecided(_))
    })
    .await;
    assert_eq!(by, ["ann", "ann"]);
}

/// MCP's tasks extension, with the official Rust SDK as the host: a host
/// that declares it gets start_task as a task at once, and polls tasks/get
/// until the task (a turn that asks nothing) completes with its answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_speaking_the_tasks_extension_gets_a_task_and_polls_it_to_its_answer() {
    use rmcp::model::{
        CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, GetTaskParams,
        Implementation, TaskPayload,
    };
    use rmcp::service::{ClientLifecycleMode, ClientServiceExt};
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let (cluster, ann, _bob) = common::with_people().await;
    cluster
        .model
        .push(Reply::text("Done, as a task.").delay(Duration::from_millis(500)));
    let url = format!("{}/mcp", common::base(&cluster));
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(ann.secret()),
    );
    // The newest revision: stateless, the host's capabilities on each
    // request.
    let host = ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("tasks-host", "1.0"),
    )
    .serve_with_lifecycle(
        transport,
        ClientLifecycleMode::Discover {
            preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .unwrap();
    let arguments = json!({"prompt": "Say you are done."});
    let answer = host
        .peer()
        .call_tool_once(
            CallToolRequestParams::new("start_task")
                .with_arguments(arguments.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    let CallToolResponse::Task(created) = answer else {
        panic!("a task was expected: {answer:?}");
    };
    let id = created.task.task_id.clone();
    assert!(id.contains(':'), "{id}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let result = loop {
        let got = host
            .peer()
            .get_task(GetTaskParams::new(id.clone()))
            .await
            .unwrap();
        match got.task.payload {
            TaskPayload::Completed { result } => break result,
            TaskPayload::Working => {}
            other => panic!("the task should complete: {other:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the task did not finish"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let text = serde_json::to_string(&result).unwrap();
    assert!(text.contains("Done, as a task."), "{text}");
    assert!(
        host.peer()
            .get_task(GetTaskParams::new("no-such:task"))
            .await
            .is_err()
    );
    let _ = host.cancel().await;
}

/// A task whose call reaches a tool of an MCP server that asks a person
/// (a form): get_task says input_required with the server's questions, and
/// answer_approval with accept and the fields lets the task complete. The
/// official Rust SDK is the host.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_whose_mcp_server_asks_is_answered_through_answer_approval() {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let Some((cluster, ann, _bob, _asking)) =
        common::with_asking_server("api", "Deployed the api.").await
    else {
        return;
    };
    let url = format!("{}/mcp", common::base(&cluster));
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(ann.secret()),
    );
    let host = ().serve(transport).await.unwrap();
    let call = |name: &'static str, args: serde_json::Value| {
        let mut params = CallToolRequestParams::new(name);
        params.arguments = args.as_object().cloned();
        let peer = host.peer().clone();
        async move {
            let result = peer.call_tool(params).await.unwrap();
            let text = result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect::<String>();
            serde_json::from_str::<serde_json::Value>(&text).unwrap()
        }
    };
    let started = call("start_task", json!({"prompt": "Deploy the api."})).await;
    let session = started["session_id"].as_str().unwrap().to_string();
    let turn = started["turn_id"].as_str().unwrap().to_string();
    let asked = call(
        "get_task",
        json!({"session_id": session, "turn_id": turn, "wait_seconds": 60}),
    )
    .await;
    assert_eq!(asked["status"], "input_required", "{asked}");
    let question = &asked["server_questions"][0];
    assert_eq!(question["server"], "ask", "{asked}");
    assert_eq!(
        question["questions"][0]["message"],
        "Deploy api to production?"
    );
    let call_id = question["call_id"].as_str().unwrap().to_string();
    let answered = call(
        "answer_approval",
        json!({"session_id": session, "call_id": call_id, "decision": "accept",
               "content": {"confirm": true, "note": "via MCP"}}),
    )
    .await;
    assert_eq!(answered["answered"], true, "{answered}");
    let done = call(
        "get_task",
        json!({"session_id": session, "turn_id": turn, "wait_seconds": 60}),
    )
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["answer"], "Deployed the api.");
    let by = common::senders(&cluster, &session, 1, |k| {
        matches!(k, Kind::McpInputProvided(_))
    })
    .await;
    assert_eq!(by, ["ann"]);
    let _ = host.cancel().await;
}
