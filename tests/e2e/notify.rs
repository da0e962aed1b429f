//! `[[notify]]` webhooks: events reach a receiver through the durable
//! outbox, signed, retried with backoff while it is down, each delivered
//! once.

use crate::support::*;
use agentry_proto::sessions::v1::{ApprovalDecision, ApprovalMode, TurnOutcome};
use agentry_runtime::config::{NotifyConfig, NotifyFormat};
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Reply;
use hmac::{KeyInit, Mac};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the receiver got: (status it answered, headers, body).
type Received = Arc<Mutex<Vec<(u16, Vec<(String, String)>, String)>>>;

/// A webhook receiver that answers 503 to its first `down_for` requests.
async fn receiver(down_for: usize) -> (String, Received) {
    let got: Received = Arc::default();
    let seen = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let seen = seen.clone();
            async move {
                let mut seen = seen.lock().unwrap();
                let status = if seen.len() < down_for { 503 } else { 200 };
                let headers = headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                    .collect();
                seen.push((status, headers, body));
                axum::http::StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), got)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_down_for_three_attempts_gets_each_event_once_signed() {
    let (url, got) = receiver(3).await;
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), "s3cret-key\n").unwrap();
    let key_path = key.path().display().to_string();
    let cluster = Cluster::start_with(|c| {
        c.scheduler.notify_retry_ms = 200;
        c.notify = vec![NotifyConfig {
            name: "phone".into(),
            url: url.clone(),
            events: vec!["approval_requested".into(), "turn_finished".into()],
            secret_env: String::new(),
            secret_file: key_path.clone(),
            format: NotifyFormat::Json,
            headers: [("X-Extra".to_string(), "yes".to_string())].into(),
        }];
    })
    .await
    .unwrap();
    cluster.model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "touch made.txt"}),
    ));
    cluster.model.push(Reply::text("made it"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_with(
        &mut client,
        &session.id,
        "make a file",
        ApprovalMode::Policy,
        false,
    )
    .await;
    let (asked, _) = until_approval(&mut events).await;
    decide(
        &mut client,
        &session.id,
        &asked.call_id,
        ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap();
    let done = finished(&until_finished(&mut events, &turn).await);
    assert_eq!(done.outcome, TurnOutcome::Completed as i32);

    // Both events arrive once the receiver is back.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let delivered = got.lock().unwrap().iter().filter(|r| r.0 == 200).count();
        if delivered >= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:#?}",
            got.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Retries have nothing left to send.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = got.lock().unwrap().clone();
    assert_eq!(got.iter().filter(|r| r.0 == 503).count(), 3, "{got:#?}");
    let delivered: Vec<_> = got.iter().filter(|r| r.0 == 200).collect();
    assert_eq!(delivered.len(), 2, "each event once: {got:#?}");
    let mut events_seen = Vec::new();
    for (_, headers, body) in &delivered {
        let timestamp = header(headers, "x-agentry-timestamp");
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"s3cret-key").unwrap();
        mac.update(format!("{timestamp}.{body}").as_bytes());
        let expected: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            header(headers, "x-agentry-signature"),
            format!("sha256={expected}"),
            "{body}"
        );
        assert_eq!(header(headers, "x-extra"), "yes");
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["session_id"], session.id.as_str());
        assert_eq!(json["event"], header(headers, "x-agentry-event"));
        events_seen.push(json["event"].as_str().unwrap().to_string());
        if json["event"] == "approval_requested" {
            assert_eq!(json["details"]["tool"], "bash");
            assert!(
                json["text"]
                    .as_str()
                    .unwrap()
                    .contains("agentry approvals answer")
            );
        } else {
            assert_eq!(json["details"]["outcome"], "completed");
            assert_eq!(json["text"], "made it");
        }
    }
    events_seen.sort();
    assert_eq!(events_seen, ["approval_requested", "turn_finished"]);
    // Every attempt of one delivery carries its id: the receiver can tell
    // a repeat.
    let ids: std::collections::BTreeSet<&str> = got
        .iter()
        .map(|r| header(&r.1, "x-agentry-delivery"))
        .collect();
    assert_eq!(ids.len(), 2, "{got:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_text_webhook_gets_a_line_and_a_title_for_ntfy_style_services() {
    let (url, got) = receiver(0).await;
    let cluster = Cluster::start_with(|c| {
        c.notify = vec![NotifyConfig {
            name: "ntfy".into(),
            url: url.clone(),
            events: vec!["turn_finished".into()],
            secret_env: String::new(),
            secret_file: String::new(),
            format: NotifyFormat::Text,
            headers: [("Priority".to_string(), "high".to_string())].into(),
        }];
    })
    .await
    .unwrap();
    cluster.model.push(Reply::text("all done"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "hello").await;
    until_finished(&mut events, &turn).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.lock().unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "nothing arrived");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, headers, body) = got.lock().unwrap()[0].clone();
    assert_eq!(header(&headers, "title"), "Agentry: turn completed");
    assert_eq!(header(&headers, "priority"), "high");
    assert!(header(&headers, "content-type").starts_with("text/plain"));
    assert!(header(&headers, "x-agentry-signature").is_empty());
    assert_eq!(body, format!("all done\nsession {}", session.id));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_notification_waiting_in_the_outbox_survives_a_scheduler_restart() {
    let (url, got) = receiver(2).await;
    let mut cluster = Cluster::start_with(|c| {
        c.scheduler.notify_retry_ms = 300;
        c.notify = vec![NotifyConfig {
            name: "hook".into(),
            url: url.clone(),
            events: vec!["turn_finished".into()],
            secret_env: String::new(),
            secret_file: String::new(),
            format: NotifyFormat::Json,
            headers: Default::default(),
        }];
    })
    .await
    .unwrap();
    cluster.model.push(Reply::text("done"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "hello").await;
    until_finished(&mut events, &turn).await;
    // The first attempt failed; the scheduler goes away with it queued.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.lock().unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "nothing arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster
        .restart_service(agentry_testkit::cluster::Service::Scheduler)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !got.lock().unwrap().iter().any(|r| r.0 == 200) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:#?}",
            got.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let got = got.lock().unwrap().clone();
    assert_eq!(got.iter().filter(|r| r.0 == 200).count(), 1, "{got:#?}");
    assert!(got.iter().all(|r| r.2.contains(&session.id)));
}
