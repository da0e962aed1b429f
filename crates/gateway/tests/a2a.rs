//! A2A 1.0 on the gateway, driven by another agent written with the
//! official A2A Python SDK (`tests/a2a/caller.py`, the `a2a-sdk` of
//! `scripts/protocol-clients.sh`), against a real cluster and a scripted
//! model: the card, a streamed task that waits for a person, the answer on
//! the task, a cancelled task, and tasks that only their person sees.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_fakes::fake_model::Reply;
use agentry_proto::sessions::v1::event::Kind;
use serde_json::json;
use std::time::Duration;

const CALLER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/a2a/caller.py");

#[tokio::test(flavor = "multi_thread")]
async fn another_agent_runs_a_task_answers_its_question_cancels_one_and_sees_only_its_own() {
    let Some(venv) = agentry_fakes::protocol_clients::venv() else {
        return;
    };
    let (cluster, ann, bob) = common::with_people().await;
    cluster.model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "echo marker written > marker.txt"}),
    ));
    cluster.model.push(Reply::text("The marker is written."));
    cluster
        .model
        .push(Reply::text("Too late.").delay(Duration::from_secs(60)));

    let base = common::base(&cluster);
    let seen = common::python(
        &venv,
        CALLER,
        &[&base],
        &[("ANN_TOKEN", ann.secret()), ("BOB_TOKEN", bob.secret())],
    )
    .await;
    assert_eq!(
        seen["first"].as_array().unwrap().last().unwrap(),
        "TASK_STATE_INPUT_REQUIRED"
    );
    assert_eq!(
        seen["second"].as_array().unwrap().last().unwrap(),
        "TASK_STATE_COMPLETED"
    );

    // The session's log: the approval is Ann's.
    let session = seen["context"].as_str().unwrap();
    let decided_by = common::senders(&cluster, session, 2, |k| {
        matches!(k, Kind::ApprovalDecided(_))
    })
    .await;
    assert_eq!(decided_by, ["ann"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_of_another_site_cannot_call_and_notifications_get_no_answer() {
    let (cluster, ann, _bob) = common::with_people().await;
    let url = format!("{}/a2a", common::base(&cluster));
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{}}"#;
    let http = reqwest::Client::new();
    // What a cross-site simple request can send: not JSON.
    let plain = http
        .post(&url)
        .bearer_auth(ann.secret())
        .header("content-type", "text/plain")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 415);
    let foreign = http
        .post(&url)
        .bearer_auth(ann.secret())
        .header("content-type", "application/json")
        .header("origin", "https://evil.example")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), 403);
    // The scheme's name is not case-sensitive.
    let lower = http
        .post(&url)
        .header("authorization", format!("bearer {}", ann.secret()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(lower.status(), 200);
    let notification = http
        .post(&url)
        .bearer_auth(ann.secret())
        .json(&json!({"jsonrpc": "2.0", "method": "ListTasks", "params": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(notification.status(), 204);
}

/// Behind a TLS proxy every caller has the proxy's address: failed tokens
/// are counted by the address the proxy appended to X-Forwarded-For, so
/// one caller's stale token does not lock out the others.
#[tokio::test(flavor = "multi_thread")]
async fn behind_a_proxy_failed_tokens_count_against_the_forwarded_address() {
    let (cluster, ann, _bob) =
        common::with_people_and(|config| config.gateway.behind_tls_proxy = true).await;
    let url = format!("{}/a2a", common::base(&cluster));
    let http = reqwest::Client::new();
    let call = |token: String, forwarded: &'static str| {
        http.post(&url)
            .bearer_auth(token)
            .header("x-forwarded-for", forwarded)
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}))
            .send()
    };
    let mut statuses = Vec::new();
    for _ in 0..12 {
        // A forged first entry changes nothing: the proxy's is the last.
        let status = call("agt_wrong".into(), "198.51.100.7, 203.0.113.1")
            .await
            .unwrap()
            .status()
            .as_u16();
        statuses.push(status);
    }
    assert_eq!(statuses.first(), Some(&401), "{statuses:?}");
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    let limited = call(ann.secret().to_string(), "203.0.113.1").await.unwrap();
    assert_eq!(limited.status(), 429, "that address waits");
    let other = call(ann.secret().to_string(), "203.0.113.2").await.unwrap();
    assert_eq!(
        other.status(),
        200,
        "another caller behind the proxy does not"
    );
}

const ASKED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/a2a/asked.py");

#[tokio::test(flavor = "multi_thread")]
async fn a_question_of_an_mcp_server_is_input_required_and_answered_with_a_data_part() {
    let Some(venv) = agentry_fakes::protocol_clients::venv() else {
        return;
    };
    let Some((cluster, ann, _bob, asking)) = common::with_asking_server("web", "Deployed.").await
    else {
        return;
    };
    let seen = common::python(
        &venv,
        ASKED,
        &[&common::base(&cluster)],
        &[("ANN_TOKEN", ann.secret())],
    )
    .await;
    assert_eq!(seen["call"], "d1");
    assert_eq!(seen["answer"], "Deployed.");
    // The answer is Ann's, and the server's task finished with it.
    let session = seen["context"].as_str().unwrap();
    let answered_by = common::senders(&cluster, session, 1, |k| {
        matches!(k, Kind::McpInputProvided(_))
    })
    .await;
    assert_eq!(answered_by, ["ann"]);
    let state = asking.get_json("/state");
    assert!(
        state
            .as_object()
            .unwrap()
            .values()
            .any(|t| t["target"] == "web" && t["status"] == "completed"),
        "{state}"
    );
}
