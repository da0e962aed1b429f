//! The tool runner's metrics page: tool calls by tool and outcome, the web
//! backends, and Crawl4AI's health and circuit-breaker state.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_fakes::fake_crawl4ai::{FakeCrawl4ai, FakePage};
use agentry_proto::tools::v1::ExecuteRequest;
use agentry_proto::tools::v1::execute_response::Kind;
use agentry_proto::tools::v1::tool_runner_client::ToolRunnerClient;
use agentry_tool_runner::Limits;
use serde_json::json;
use std::time::Duration;

async fn call(
    client: &mut ToolRunnerClient<agentry_runtime::telemetry::TracedChannel>,
    tool: &str,
    args: serde_json::Value,
) -> bool {
    let mut stream = client
        .execute(ExecuteRequest {
            call_id: "c".into(),
            session_id: "s1".into(),
            tool: tool.into(),
            arguments_json: args.to_string(),
            timeout_ms: 0,
            network: false,
            resume: None,
        })
        .await
        .unwrap()
        .into_inner();
    while let Some(message) = stream.message().await.unwrap() {
        if let Some(Kind::Result(r)) = message.kind {
            return r.is_error;
        }
    }
    panic!("no result");
}

fn line_value(page: &str, prefix: &str) -> Option<String> {
    page.lines()
        .find(|l| l.starts_with(prefix))
        .map(|l| l.rsplit(' ').next().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_show_tool_calls_and_the_breaker_state() {
    let crawl4ai = FakeCrawl4ai::start().await.unwrap();
    let mut config =
        agentry_runtime::Config::load(&agentry_runtime::ConfigSource::default()).unwrap();
    let web = &mut config.tool_runner.web;
    web.crawl4ai_url = crawl4ai.url();
    web.chromium = false;
    web.allow_hosts = vec!["127.0.0.1".into()];
    let page_url = format!("{}/health", crawl4ai.url());
    crawl4ai.page(&page_url, FakePage::new("Health", "all good"));

    let root = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_url = format!("http://{}/metrics", metrics.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (root_path, limits, web) = (
        root.path().to_path_buf(),
        Limits::from_config(&config),
        config.tool_runner.web.clone(),
    );
    let server = tokio::spawn(async move {
        let auth = agentry_runtime::Auth::off();
        let setup = agentry_tool_runner::Setup {
            project_roots: Vec::new(),
            mcp_servers: Vec::new(),
            mcp: agentry_tool_runner::mcp::Settings::default(),
            snapshots: None,
            workspace_root: root_path,
            limits,
            sandbox: agentry_tool_runner::sandbox::Sandbox::unconfined(),
            web,
            runner_id: "metrics-runner".into(),
            metrics: Some(metrics),
            secrets: Default::default(),
        };
        agentry_tool_runner::serve(setup, &auth, listener, async {
            let _ = stopped.await;
        })
        .await
    });
    let channel = agentry_runtime::Auth::off()
        .lazy_channel(&format!("http://{addr}"))
        .unwrap();
    let mut client = ToolRunnerClient::new(channel);

    assert!(!call(&mut client, "bash", json!({"command": "true"})).await);
    assert!(call(&mut client, "bash", json!({"command": "false"})).await);
    assert!(!call(&mut client, "web_fetch", json!({"url": page_url})).await);
    let page = reqwest::get(&metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let id = "runner=\"metrics-runner\"";
    assert_eq!(
        line_value(
            &page,
            &format!("agentry_tool_calls_total{{{id},tool=\"bash\",outcome=\"ok\"}}")
        )
        .as_deref(),
        Some("1"),
        "{page}"
    );
    assert_eq!(
        line_value(
            &page,
            &format!("agentry_tool_calls_total{{{id},tool=\"bash\",outcome=\"error\"}}")
        )
        .as_deref(),
        Some("1"),
        "{page}"
    );
    assert_eq!(
        line_value(
            &page,
            &format!("agentry_tool_calls_total{{{id},tool=\"web_fetch\",outcome=\"ok\"}}")
        )
        .as_deref(),
        Some("1"),
        "{page}"
    );
    assert!(
        page.contains("backend=\"crawl4ai\",position=\"0\"} 1"),
        "{page}"
    );
    assert!(
        page.contains("backend=\"http\",position=\"1\"} 1"),
        "{page}"
    );
    assert_eq!(
        line_value(
            &page,
            &format!("agentry_web_breaker_state{{{id},backend=\"crawl4ai\",state=\"closed\"}}")
        )
        .as_deref(),
        Some("1"),
        "{page}"
    );

    // Five failed fetches open the breaker, and the page says so.
    crawl4ai.fail_all(true);
    for _ in 0..5 {
        call(&mut client, "web_fetch", json!({"url": page_url})).await;
    }
    let page = reqwest::get(&metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        line_value(
            &page,
            &format!("agentry_web_breaker_state{{{id},backend=\"crawl4ai\",state=\"open\"}}")
        )
        .as_deref(),
        Some("1"),
        "{page}"
    );
    assert_eq!(
        line_value(
            &page,
            &format!("agentry_web_breaker_opens_total{{{id},backend=\"crawl4ai\"}}")
        )
        .as_deref(),
        Some("1"),
        "{page}"
    );

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
