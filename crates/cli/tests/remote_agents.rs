//! A remote agent: `[[agents]] url = …` names an A2A agent built with the
//! official Python SDK (`crates/fakes/a2a/remote_agent.py`, from
//! `scripts/protocol-clients.sh`), and a `delegate` call sends the task
//! there, with the bearer token `token_env` names, streaming its progress
//! as the call's output; a failing remote task is a failed call saying why.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_testkit::fake_model::{FakeModel, Reply};
use common::install::{Install, Up, free_port, text};
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REMOTE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fakes/a2a/remote_agent.py");

/// The remote agent's process, killed when dropped.
struct Remote(Child);

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn remote(venv: &std::path::Path, port: u16) -> Remote {
    let child = Command::new(venv.join("bin/python"))
        .args([REMOTE, &port.to_string()])
        .env("REMOTE_TOKEN", "remote-secret")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let remote = Remote(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the remote agent did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    remote
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_delegated_to_a_remote_a2a_agent_comes_back_with_its_answer() {
    let Some(venv) = agentry_fakes::protocol_clients::venv() else {
        return;
    };
    let port = free_port();
    let _remote = remote(&venv, port);
    let model = FakeModel::start().await.unwrap();
    let mut install = Install::new(&model.base_url());
    install
        .env
        .push(("ECHO_TOKEN".to_string(), "remote-secret".to_string()));
    std::fs::write(
        install.dir.path().join("config/local.toml"),
        format!(
            "[[agents]]\nname = \"echo\"\ndescription = \"Repeats what it is asked\"\n\
             url = \"http://127.0.0.1:{port}\"\ntoken_env = \"ECHO_TOKEN\"\n\n\
             [[agents]]\nname = \"locked\"\ndescription = \"The same agent, without its token\"\n\
             url = \"http://127.0.0.1:{port}\"\n"
        ),
    )
    .unwrap();
    let log = install.dir.path().join("up.log");
    let _up = Up::try_start(&install, &log).expect("agentry up");

    model.push(Reply::tool_call(
        "d1",
        "delegate",
        json!({"agent": "echo", "task": "say hello"}),
    ));
    model.push(Reply::tool_call(
        "d2",
        "delegate",
        json!({"agent": "locked", "task": "say hello"}),
    ));
    model.push(Reply::tool_call(
        "d3",
        "delegate",
        json!({"agent": "echo", "task": "please fail"}),
    ));
    model.push(Reply::text("The remote agent said hello."));
    let out = install.run(&["run", "--approve", "always", "ask the echo agent"]);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "{stdout}\n{stderr}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(stdout.trim(), "The remote agent said hello.");

    let session = install.latest_session();
    let results: Vec<Value> = install
        .events(&session)
        .into_iter()
        .filter(|e| e["type"] == "tool_result")
        .collect();
    assert_eq!(results.len(), 3, "{results:#?}");
    assert_eq!(results[0]["output"], "Remote answer to: say hello");
    assert_eq!(results[0]["is_error"], false);
    // Without the token the remote agent refuses; a failing task says why.
    assert_eq!(results[1]["is_error"], true);
    assert!(
        results[1]["output"].as_str().unwrap().contains("401"),
        "{:#?}",
        results[1]
    );
    assert_eq!(results[2]["is_error"], true);
    assert!(
        results[2]["output"]
            .as_str()
            .unwrap()
            .contains("this agent was asked to fail"),
        "{:#?}",
        results[2]
    );
    // The model saw the answer as the call's result.
    let sent = serde_json::to_string(&model.requests()).unwrap();
    assert!(sent.contains("Remote answer to: say hello"));
}
