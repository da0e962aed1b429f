//! The web tools through the whole stack: the SSRF guard refuses local
//! addresses unless allowed, and an allowed page comes back as text naming
//! the backend that fetched it.

use crate::support::*;
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Reply;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn local_addresses_are_refused_by_default() {
    let cluster = Cluster::start_with(|c| c.tool_runner.web.chromium = false)
        .await
        .unwrap();
    let target = format!("{}/models", cluster.model.base_url());
    cluster
        .model
        .push(Reply::tool_call("w1", "web_fetch", json!({"url": target})));
    cluster.model.push(Reply::tool_call(
        "w2",
        "web_fetch",
        json!({"url": "http://169.254.169.254/latest/meta-data/"}),
    ));
    cluster.model.push(Reply::text("blocked, as expected"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "fetch them").await;
    let got = until_finished(&mut events, &turn).await;
    let results = tool_results(&got);
    assert_eq!(results.len(), 2);
    for r in &results {
        assert!(r.is_error, "{}", r.output);
    }
    assert!(
        results[0].output.contains("127.0.0.1"),
        "{}",
        results[0].output
    );
    assert!(
        results[1].output.contains("169.254.169.254"),
        "{}",
        results[1].output
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_page_comes_back_naming_its_backend() {
    let cluster = Cluster::start_with(|c| {
        c.tool_runner.web.chromium = false;
        c.tool_runner.web.allow_hosts = vec!["127.0.0.1".into()];
    })
    .await
    .unwrap();
    let target = format!("{}/models", cluster.model.base_url());
    cluster
        .model
        .push(Reply::tool_call("w1", "web_fetch", json!({"url": target})));
    cluster.model.push(Reply::text("got it"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "fetch it").await;
    let got = until_finished(&mut events, &turn).await;
    let result = &tool_results(&got)[0];
    assert!(!result.is_error, "{}", result.output);
    assert!(result.output.contains("with http"), "{}", result.output);
    assert!(
        result.output.contains("fake-model") || result.output.contains("\"data\""),
        "{}",
        result.output
    );
}
