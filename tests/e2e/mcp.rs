//! MCP servers end to end: a model turn calls a tool of the real
//! `mcp-server-time` (stdio, in the sandbox) and of a streamable HTTP
//! server after a person approves; a subscribed resource update wakes the
//! session once, even when the orchestrator was down when it happened.

use crate::support::*;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{self as spb, TurnOutcome, event::Kind};
use agentry_runtime::config::McpServerConfig;
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Service;
use agentry_testkit::fake_model::{Fallback, Reply};
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

use agentry_testkit::mcp_servers::{Fixture, venv};

/// The fixture server, copied where every identity can read it.
fn fixture() -> (Fixture, String) {
    let fixture = Fixture::new().unwrap();
    let script = fixture.script().display().to_string();
    (fixture, script)
}

/// Waits until the orchestrator lists every MCP server as ready.
async fn until_ready(cluster: &Cluster, count: usize) {
    let mut client = cluster.orchestrator().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = client
            .list_tools(pb::ListToolsRequest::default())
            .await
            .unwrap()
            .into_inner();
        let ready = list
            .mcp_servers
            .iter()
            .filter(|s| s.state == "ready")
            .count();
        if ready == count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "MCP servers not ready: {:?}",
            list.mcp_servers
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn approve(
    client: &mut agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient<
        agentry_testkit::cluster::Channel,
    >,
    session_id: &str,
    call_id: &str,
) {
    decide(
        client,
        session_id,
        call_id,
        spb::ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_asks_the_time_through_real_mcp_servers_after_approval() {
    let Some(venv) = venv() else {
        return;
    };
    let (_dir, script) = fixture();
    let python = venv.join("bin/python").display().to_string();
    let mut http = tokio::process::Command::new(&python)
        .args([script.as_str(), "http", "--port", "0"])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(http.stderr.take().unwrap()).lines();
    let port: u16 = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(p) = line.trim().strip_prefix("listening on ") {
                return p.trim().parse().unwrap();
            }
        }
        panic!("the HTTP fixture ended");
    })
    .await
    .unwrap();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let time_command = venv.join("bin/mcp-server-time").display().to_string();
    let cluster = Cluster::start_with(|c| {
        c.mcp_servers = vec![
            McpServerConfig {
                name: "time".into(),
                command: time_command,
                enabled: true,
                ..McpServerConfig::default()
            },
            McpServerConfig {
                name: "web".into(),
                url: format!("http://127.0.0.1:{port}/mcp"),
                enabled: true,
                ..McpServerConfig::default()
            },
        ];
    })
    .await
    .unwrap();
    until_ready(&cluster, 2).await;
    cluster.model.push(Reply::tool_call(
        "t1",
        "time__get_current_time",
        json!({"timezone": "UTC"}),
    ));
    cluster.model.push(Reply::tool_call(
        "t2",
        "web__echo",
        json!({"text": "over http"}),
    ));
    cluster.model.push(Reply::text("It is morning in UTC."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_with(
        &mut client,
        &session.id,
        "what time is it in UTC?",
        spb::ApprovalMode::Policy,
        false,
    )
    .await;
    // MCP tools are confirmed by default, whatever the server hints.
    for call in ["t1", "t2"] {
        let (asked, _) = until_approval(&mut events).await;
        assert_eq!(asked.call_id, call);
        approve(&mut client, &session.id, call).await;
    }
    let got = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&got).outcome, TurnOutcome::Completed as i32);
    let log = read_log(&mut cluster.store().await.unwrap(), &session.id).await;
    let results = tool_results(&log);
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(!results[0].is_error, "{}", results[0].output);
    assert!(
        results[0].output.contains("\"timezone\": \"UTC\""),
        "{}",
        results[0].output
    );
    assert_eq!(results[1].output, "echo: over http");
    // The answers reached the model.
    let requests = cluster.model.requests();
    let offered = offered_tools(&requests[0]);
    assert!(offered.contains(&"time__get_current_time"), "{offered:?}");
    assert!(offered.contains(&"mcp_subscribe"), "{offered:?}");
    let second = requests[1].to_string();
    assert!(second.contains("day_of_week"), "{second}");
    let third = requests[2].to_string();
    assert!(third.contains("echo: over http"), "{third}");
    http.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subscribed_resource_update_wakes_the_session_once_across_an_orchestrator_restart() {
    let Some(venv) = venv() else {
        return;
    };
    let (_dir, script) = fixture();
    let python = venv.join("bin/python").display().to_string();
    let mut cluster = Cluster::start_with(|c| {
        c.mcp_servers = vec![McpServerConfig {
            name: "fx".into(),
            command: python,
            args: vec![script, "stdio".into()],
            env: [("FIXTURE_WATCH_FILE".to_string(), "note.txt".to_string())].into(),
            enabled: true,
            ..McpServerConfig::default()
        }];
    })
    .await
    .unwrap();
    until_ready(&cluster, 1).await;
    cluster.model.push(Reply::tool_call(
        "s1",
        "mcp_subscribe",
        json!({"server": "fx", "uri": "watch://file"}),
    ));
    cluster.model.push(Reply::text("I will watch it."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_with(
        &mut client,
        &session.id,
        "tell me when note.txt changes",
        spb::ApprovalMode::Policy,
        false,
    )
    .await;
    // A subscription lets future changes wake the agent: a person agrees.
    let (asked, _) = until_approval(&mut events).await;
    assert_eq!(asked.tool, "mcp_subscribe");
    approve(&mut client, &session.id, &asked.call_id).await;
    let got = until_finished(&mut events, &turn).await;
    let result = &tool_results(&got)[0];
    assert!(!result.is_error, "{}", result.output);
    assert!(
        result.output.contains("subscribed to watch://file"),
        "{}",
        result.output
    );
    drop(events);

    // The orchestrator is down when the resource changes.
    cluster.stop_service(Service::Orchestrator).await.unwrap();
    let file = cluster.workspace_root().join(&session.id).join("note.txt");
    std::fs::write(&file, "the build is green").unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Whatever the restarted orchestrator asks the model server first
    // (its window probe included), the woken turn gets this answer.
    cluster
        .model
        .set_fallback(Fallback::Script(vec![Reply::text(
            "Noted: the build is green.",
        )]));
    cluster.start_service(Service::Orchestrator).await.unwrap();

    let mut client = cluster.orchestrator().await.unwrap();
    let mut events = client
        .subscribe(pb::SubscribeRequest {
            session_id: session.id.clone(),
            from_seq: 1,
            live_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    let woke = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(e) = events.message().await.unwrap() {
            if let Some(Kind::McpResourceUpdated(u)) = &e.kind {
                return (e.turn_id.clone(), u.clone());
            }
        }
        panic!("the stream ended");
    })
    .await
    .expect("the update never woke the session");
    assert_eq!(woke.1.uri, "watch://file");
    assert_eq!(woke.1.content, "the build is green");
    let got = until_finished(&mut events, &woke.0).await;
    let done = finished(&got);
    assert_eq!(
        done.outcome,
        TurnOutcome::Completed as i32,
        "{}",
        done.message
    );
    let last = cluster.model.requests().last().unwrap().to_string();
    assert!(
        last.contains("[MCP update]") && last.contains("the build is green"),
        "{last}"
    );

    // Redelivery never makes a second turn of the same update.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let log = read_log(&mut cluster.store().await.unwrap(), &session.id).await;
    let updates = log
        .iter()
        .filter(|e| matches!(e.kind, Some(Kind::McpResourceUpdated(_))))
        .count();
    assert_eq!(updates, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_attaches_the_resources_it_mentions() {
    let Some(venv) = venv() else {
        return;
    };
    let (_dir, script) = fixture();
    let python = venv.join("bin/python").display().to_string();
    let cluster = Cluster::start_with(|c| {
        c.mcp_servers = vec![McpServerConfig {
            name: "fx".into(),
            command: python,
            args: vec![script, "stdio".into()],
            env: [("FIXTURE_WATCH_FILE".to_string(), "note.txt".to_string())].into(),
            enabled: true,
            ..McpServerConfig::default()
        }];
    })
    .await
    .unwrap();
    until_ready(&cluster, 1).await;
    cluster
        .model
        .push(Reply::text("It says the build is green."));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let workspace = cluster.workspace_root().join(&session.id);
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("note.txt"), "the build is green").unwrap();

    let turn = send(
        &mut client,
        &session.id,
        "what does @fx:watch://file say? (mail me@home:x if unsure)",
    )
    .await;
    let got = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&got).outcome, TurnOutcome::Completed as i32);
    let request = cluster.model.requests()[0].to_string();
    assert!(
        request.contains(
            "[attached: the resource watch://file of the MCP server fx (text/plain)]\\nthe build is green"
        ),
        "{request}"
    );
    // Not a configured server: left as written.
    assert!(request.contains("me@home:x"), "{request}");

    // A resource that cannot be read refuses the message, saying why.
    let refused = client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(user("read @fx:nothing://here")),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused
            .message()
            .contains("cannot attach @fx:nothing://here"),
        "{}",
        refused.message()
    );
}
