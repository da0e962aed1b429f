//! Network for a command, opened by a policy rule or by the person for a
//! turn: the only way out is the tool runner's proxy, which keeps loopback,
//! private, link-local and metadata addresses closed unless the runner's
//! configuration names them, and serves only calls that were granted
//! network.
//!
//! A small HTTP server on the host's loopback stands in for "somewhere"
//! (this machine reaches no public address): it is closed to commands by
//! default, and reachable once `network_allow_hosts` names 127.0.0.1.

use crate::support::{finished, new_session, send, tool_results, until_finished};
use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::sessions::v1::{self as spb, event::Kind};
use agentry_runtime::config::{PolicyDecision, PolicyRule};
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Reply;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the stand-in server answers.
const SECRET: &str = "the-page-behind-the-proxy";

/// Serves one fixed page to every connection; returns its port.
async fn page_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let body = format!("{SECRET}\n");
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    port
}

/// A cluster whose policy gives `curl` network, and whose runner lets
/// commands reach `allow` although internal.
async fn cluster(allow: &[&str]) -> Cluster {
    let allow: Vec<String> = allow.iter().map(|s| s.to_string()).collect();
    Cluster::start_with(move |config| {
        config.policy.rules.insert(
            0,
            PolicyRule {
                read_only_hint: None,
                tool: "bash".into(),
                command: Some("curl *".into()),
                path: None,
                decision: PolicyDecision::Confirm,
                reason: Some("fetches from the network".into()),
                check_arguments: true,
                network: true,
                approvers: Vec::new(),
                approvals_required: None,
            },
        );
        config.tool_runner.sandbox.network_allow_hosts = allow;
    })
    .await
    .unwrap()
}

/// Runs the commands as one turn's bash calls, every call approved;
/// returns their outputs in order.
pub(crate) async fn run_in_a_turn(cluster: &Cluster, commands: &[String]) -> Vec<String> {
    for (i, command) in commands.iter().enumerate() {
        cluster.model.push(Reply::tool_call(
            &format!("call-{i}"),
            "bash",
            json!({ "command": command }),
        ));
    }
    cluster.model.push(Reply::text("done"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "go").await;
    let received = until_finished(&mut events, &turn).await;
    finished(&received);
    let results = tool_results(&received);
    assert_eq!(results.len(), commands.len(), "{received:?}");
    results.into_iter().map(|r| r.output).collect()
}

fn curl(args: &str) -> String {
    format!("curl -sS --max-time 10 -w ' status=%{{http_code}}' {args}")
}

fn tool_runner_port(cluster: &Cluster) -> u16 {
    cluster
        .config
        .tool_runner
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_granted_command_goes_out_only_through_the_proxy_and_internal_hosts_stay_closed() {
    let port = page_server().await;
    let cluster = cluster(&[]).await;
    let runner = tool_runner_port(&cluster);
    let outputs = run_in_a_turn(
        &cluster,
        &[
            // Granted (a curl rule with network): through the proxy, but
            // loopback is internal and not named.
            curl(&format!("http://127.0.0.1:{port}/")),
            // A tunnel to a service, and the metadata address.
            curl(&format!("-p http://127.0.0.1:{runner}/")),
            curl("http://169.254.169.254/latest/meta-data/"),
            // Around the proxy: nothing else is reachable.
            curl(&format!("--noproxy '*' http://127.0.0.1:{port}/")),
            // Not granted (the rule matches curl only): no network at all,
            // not even the proxy.
            format!("echo x | {}", curl(&format!("http://127.0.0.1:{port}/"))),
        ],
    )
    .await;
    for output in &outputs {
        assert!(!output.contains(SECRET), "the page was reached:\n{output}");
    }
    for (i, output) in outputs[..3].iter().enumerate() {
        assert!(
            // curl reports a refused tunnel as "response 403".
            output.contains("403") && output.contains("[agentry network: refused 1"),
            "call {i} was not refused by the proxy:\n{output}"
        );
    }
    assert!(outputs[0].contains("loopback"), "{}", outputs[0]);
    assert!(outputs[2].contains("169.254.169.254"), "{}", outputs[2]);
    assert!(
        outputs[3].contains("status=000") && !outputs[3].contains("[agentry network"),
        "a connection around the proxy: {}",
        outputs[3]
    );
    assert!(
        outputs[4].contains("status=000") && !outputs[4].contains("[agentry network"),
        "a call without network: {}",
        outputs[4]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_the_runner_names_is_reachable_by_request_and_by_tunnel() {
    let port = page_server().await;
    let cluster = cluster(&["127.0.0.1"]).await;
    let outputs = run_in_a_turn(
        &cluster,
        &[
            curl(&format!("http://127.0.0.1:{port}/")),
            curl(&format!("-p http://127.0.0.1:{port}/")),
            // Without the call's credential the proxy serves nobody.
            curl(&format!(
                "--proxy http://127.0.0.1:3128 http://127.0.0.1:{port}/"
            )),
        ],
    )
    .await;
    for output in &outputs[..2] {
        assert!(
            output.contains(SECRET) && output.contains("status=200"),
            "{output}"
        );
        assert!(
            output.contains(&format!("[agentry network: reached 127.0.0.1:{port}")),
            "{output}"
        );
    }
    assert!(
        outputs[2].contains("status=407") && !outputs[2].contains(SECRET),
        "{}",
        outputs[2]
    );
}

/// A turn the person gave network (`agentry run --network`): its bash calls
/// go out through the proxy without any rule, under the same proxy rules;
/// the turns before and after it, and calls the model asks for in them,
/// get none.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_the_person_gives_network_reaches_out_and_the_turns_around_it_do_not() {
    let port = page_server().await;
    let cluster = Cluster::start_with(|config| {
        config.tool_runner.sandbox.network_allow_hosts = vec!["127.0.0.1".into()];
    })
    .await
    .unwrap();
    let fetch = curl(&format!("http://127.0.0.1:{port}/"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let mut outputs = Vec::new();
    for (i, network) in [false, true, false].into_iter().enumerate() {
        cluster.model.push(Reply::tool_call(
            &format!("call-{i}"),
            "bash",
            json!({ "command": fetch }),
        ));
        cluster.model.push(Reply::text("done"));
        let turn = client
            .submit(opb::SubmitRequest {
                session_id: session.id.clone(),
                input: Some(opb::Input {
                    kind: Some(opb::input::Kind::UserMessage(opb::UserInput {
                        images: Vec::new(),
                        text: "fetch the page".into(),
                        approval_mode: spb::ApprovalMode::Always as i32,
                        plan: false,
                        network,
                        budget: None,
                        compact: false,
                        interrupt: false,
                    })),
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .turn_id;
        let received = until_finished(&mut events, &turn).await;
        finished(&received);
        let recorded = received.iter().find_map(|e| match &e.kind {
            Some(Kind::UserMessage(m)) => Some(m.network),
            _ => None,
        });
        assert_eq!(recorded, Some(network), "the log records the switch");
        let results = tool_results(&received);
        assert_eq!(results.len(), 1, "{received:?}");
        outputs.push(results[0].output.clone());
    }
    assert!(
        outputs[1].contains(SECRET)
            && outputs[1].contains(&format!("[agentry network: reached 127.0.0.1:{port}")),
        "the turn with network: {}",
        outputs[1]
    );
    for output in [&outputs[0], &outputs[2]] {
        assert!(
            output.contains("status=000") && !output.contains(SECRET),
            "a turn without network: {output}"
        );
    }
}
