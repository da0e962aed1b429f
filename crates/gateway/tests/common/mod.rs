//! What the protocol tests share: a cluster with the gateway and two
//! people, and a Python script (a client written with an official SDK) run
//! against it, its last line read as JSON.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use agentry_runtime::auth::{Role, Token};
use agentry_runtime::people::People;
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Service;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// A cluster with the gateway, Ann (an approver) and Bob (an operator).
pub async fn with_people() -> (Cluster, Token, Token) {
    with_people_and(|_| {}).await
}

/// [`with_people`], with `adjust` made to the configuration first.
pub async fn with_people_and(
    adjust: impl FnOnce(&mut agentry_runtime::Config),
) -> (Cluster, Token, Token) {
    let mut cluster = Cluster::start_with(adjust).await.unwrap();
    cluster.start_service(Service::Gateway).await.unwrap();
    let file = cluster.config.people_file();
    let ann = People::add(&file, "ann", Role::Approver, "test").unwrap();
    let bob = People::add(&file, "bob", Role::Operator, "test").unwrap();
    // Every service reads the people file again within a second.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    (cluster, ann, bob)
}

/// The gateway's address.
pub fn base(cluster: &Cluster) -> String {
    format!("http://{}", cluster.config.gateway.listen)
}

/// Runs `script ARGS` with the virtualenv's Python and `env`; fails the
/// test with its output unless it succeeds; its last line, as JSON.
pub async fn python(venv: &Path, script: &str, args: &[&str], env: &[(&str, &str)]) -> Value {
    let out = tokio::process::Command::new(venv.join("bin/python"))
        .arg(script)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

/// Who sent each event of `kinds` in the session's log, until its
/// `turns`-th turn ends.
pub async fn senders(
    cluster: &Cluster,
    session: &str,
    turns: usize,
    wanted: impl Fn(&agentry_proto::sessions::v1::event::Kind) -> bool,
) -> Vec<String> {
    use agentry_proto::sessions::v1::event::Kind;
    let mut orchestrator = cluster.orchestrator().await.unwrap();
    let mut events = orchestrator
        .subscribe(agentry_proto::orchestrator::v1::SubscribeRequest {
            session_id: session.to_string(),
            from_seq: 1,
            live_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut by = Vec::new();
    let mut finished = 0;
    while finished < turns {
        let event = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match &event.kind {
            Some(Kind::TurnFinished(_)) => finished += 1,
            Some(kind) if wanted(kind) => by.push(event.by.clone()),
            _ => {}
        }
    }
    by
}

/// [`with_people`] with the MCP server whose tools ask a person
/// (`asking_server.py`) configured as `ask`, its `deploy` allowed by the
/// policy (what stops a turn is the server's own question), offered
/// already; the model's next turn calls `ask__deploy` on `target` and then
/// answers `answer`. `None` (skipped) without the MCP virtualenv.
pub async fn with_asking_server(
    target: &str,
    answer: &str,
) -> Option<(
    Cluster,
    Token,
    Token,
    agentry_fakes::mcp_servers::HttpFixture,
)> {
    let venv = agentry_fakes::mcp_servers::venv()?;
    let asking = agentry_fakes::mcp_servers::HttpFixture::asking(&venv).unwrap();
    let url = asking.url();
    let (cluster, ann, bob) = with_people_and(|c| {
        c.mcp_servers
            .push(agentry_runtime::config::McpServerConfig {
                name: "ask".into(),
                url,
                enabled: true,
                ..Default::default()
            });
        c.policy.tools.insert(
            "ask__deploy".into(),
            agentry_runtime::config::PolicyDecision::Allow,
        );
    })
    .await;
    let mut orchestrator = cluster.orchestrator().await.unwrap();
    agentry_testkit::cluster::wait_for_tool(&mut orchestrator, "ask__deploy")
        .await
        .unwrap();
    cluster
        .model
        .push(agentry_fakes::fake_model::Reply::tool_call(
            "d1",
            "ask__deploy",
            serde_json::json!({"target": target}),
        ));
    cluster
        .model
        .push(agentry_fakes::fake_model::Reply::text(answer));
    Some((cluster, ann, bob, asking))
}
