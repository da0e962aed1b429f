//! `agentry users` and `agentry audit` on the real binary: people added
//! with their roles, then a log that says who did what and what let each
//! tool call run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_proto::sessions::v1 as spb;
use agentry_testkit::fake_model::{FakeModel, Reply};
use common::install::{Install, Up, text};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// A person's token, as `agentry users add` prints it.
fn add(install: &Install, name: &str, role: &str) -> String {
    let out = install.run(&["users", "add", name, "--role", role]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("shown only this once"), "{stderr}");
    stdout.trim().to_string()
}

async fn orchestrator_as(
    install: &Install,
    token: &str,
) -> OrchestratorClient<agentry_testkit::cluster::Channel> {
    let auth = agentry_runtime::Auth::client_with(Some(
        agentry_runtime::auth::Token::parse(token).unwrap(),
    ));
    let channel = agentry_testkit::cluster::connect_as(&auth, &install.orchestrator_url())
        .await
        .unwrap();
    OrchestratorClient::new(channel)
}

fn message(session: &str, text: &str, mode: spb::ApprovalMode) -> opb::SubmitRequest {
    opb::SubmitRequest {
        session_id: session.into(),
        input: Some(opb::Input {
            kind: Some(opb::input::Kind::UserMessage(opb::UserInput {
                text: text.into(),
                approval_mode: mode as i32,
                ..Default::default()
            })),
        }),
    }
}

async fn until_idle(client: &mut OrchestratorClient<agentry_testkit::cluster::Channel>, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let session = client
            .get_session(opb::GetSessionRequest {
                session_id: id.into(),
            })
            .await
            .unwrap()
            .into_inner();
        if !session.turn_open {
            return;
        }
        assert!(Instant::now() < deadline, "the turn never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_audit_names_who_sent_and_approved_and_what_let_each_call_run() {
    let model = FakeModel::start().await.unwrap();
    let (install, _up, _log) = Up::start(&model.base_url());
    let otto = add(&install, "otto", "operator");
    let abe = add(&install, "abe", "approver");
    let vera = add(&install, "vera", "viewer");
    let listed = text(&install.run(&["users", "list"])).0;
    for line in [
        "otto", "operator", "abe", "approver", "vera", "viewer", "admin",
    ] {
        assert!(listed.contains(line), "{listed}");
    }
    tokio::time::sleep(Duration::from_millis(1300)).await;

    // The install's own person (the client token) runs a turn that
    // approves everything; the read is allowed by the policy anyway.
    model.push(Reply::tool_call(
        "c1",
        "bash",
        json!({"command": "touch made.txt"}),
    ));
    model.push(Reply::tool_call("c2", "list_dir", json!({"path": "."})));
    model.push(Reply::text("done"));
    let out = install.run(&["run", "--scratch", "--approve", "always", "say hi"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let first = install.latest_session();

    // An operator asks for a write; only the approver can let it run.
    let mut as_otto = orchestrator_as(&install, &otto).await;
    let session = as_otto
        .create_session(opb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    model.push(Reply::tool_call(
        "c3",
        "write_file",
        json!({"path": "notes.txt", "content": "x"}),
    ));
    model.push(Reply::text("written"));
    as_otto
        .submit(message(
            &session.id,
            "write the notes",
            spb::ApprovalMode::Policy,
        ))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = install
            .command(&["approvals", "--json"])
            .env("AGENTRY_TOKEN", &abe)
            .output()
            .unwrap();
        if text(&out).0.contains("\"c3\"") {
            break;
        }
        assert!(Instant::now() < deadline, "the write never waited");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The operator cannot answer it from the CLI either.
    let out = install
        .command(&["approvals", "answer", &session.id, "c3", "approve"])
        .env("AGENTRY_TOKEN", &otto)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).1.contains("otto is an operator"),
        "{:?}",
        text(&out)
    );
    let out = install
        .command(&["approvals", "answer", &session.id, "c3", "approve"])
        .env("AGENTRY_TOKEN", &abe)
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));
    until_idle(&mut as_otto, &session.id).await;

    // A viewer may read the audit; as JSON, one object per thing done.
    let out = install
        .command(&["audit", "--json", "--since", "1h"])
        .env("AGENTRY_TOKEN", &vera)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let records: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |session: &str| -> Vec<(String, String, String, Value)> {
        records
            .iter()
            .filter(|r| r["session_id"] == session)
            .map(|r| {
                (
                    r["by"].as_str().unwrap().to_string(),
                    r["action"].as_str().unwrap().to_string(),
                    r["subject"].as_str().unwrap().to_string(),
                    r["allowed"].clone(),
                )
            })
            .collect()
    };
    let first_records = of(&first);
    assert_eq!(
        first_records[..3],
        [
            (
                "admin".into(),
                "message".into(),
                "say hi".into(),
                Value::Null
            ),
            (
                String::new(),
                "tool_call".into(),
                "bash touch made.txt".into(),
                json!({"kind": "turn", "by": "admin"})
            ),
            (
                String::new(),
                "tool_call".into(),
                "list_dir .".into(),
                json!({"kind": "rule", "rule": first_records[2].3["rule"].clone()})
            ),
        ],
        "{stdout}"
    );
    assert!(
        first_records[2].3["rule"]
            .as_str()
            .unwrap()
            .contains("list_dir"),
        "{stdout}"
    );
    assert_eq!(
        of(&session.id),
        [
            (
                "otto".into(),
                "message".into(),
                "write the notes".into(),
                Value::Null
            ),
            (
                "abe".into(),
                "approve".into(),
                "write_file notes.txt".into(),
                Value::Null
            ),
            (
                String::new(),
                "tool_call".into(),
                "write_file notes.txt".into(),
                json!({"kind": "person", "by": "abe"})
            ),
        ],
        "{stdout}"
    );

    // In words, for one session; nothing in the future.
    let (words, _) = text(&install.run(&["audit", "--session", &session.id]));
    assert!(words.contains("approved by abe"), "{words}");
    let (later, _) = text(&install.run(&["audit", "--since", "2999-01-01T00:00:00Z"]));
    assert!(later.contains("nothing was done"), "{later}");
    let out = install.run(&["audit", "--since", "last week"]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("--since"), "{:?}", text(&out));

    // A person removed can no longer read it.
    let out = install.run(&["users", "remove", "vera"]);
    assert!(out.status.success(), "{:?}", text(&out));
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let out = install
        .command(&["audit"])
        .env("AGENTRY_TOKEN", &vera)
        .output()
        .unwrap();
    assert!(!out.status.success());
}
