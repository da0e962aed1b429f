//! A first run: bare `agentry` in a terminal with no services running
//! starts them, chats, and stops them when the chat ends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_testkit::fake_model::{FakeModel, Reply};
use common::install::{BIN, Install, text};
use common::tmux::{Tmux, tmux_present};

#[tokio::test(flavor = "multi_thread")]
async fn bare_agentry_with_no_services_starts_them_for_a_working_chat() {
    if !tmux_present() {
        return;
    }
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::text("Hello from the model."));
    let install = Install::new(&model.base_url());
    // Nothing answers yet.
    assert!(!install.run(&["sessions", "list"]).status.success());
    let mut script = String::from("cd \"$(dirname \"$0\")\"\n");
    script.push_str(&install.shell_exports());
    script.push_str(&format!("{BIN}\necho \"[agentry exited $?]\"\nsleep 60\n"));
    let tmux = Tmux::start(install.dir.path(), &script);
    tmux.wait_for("the chat", |s| s.contains("ready"));
    tmux.type_text("hello");
    tmux.keys(&["Enter"]);
    tmux.wait_for("the answer", |s| s.contains("Hello from the model."));
    tmux.keys(&["C-d"]);
    let screen = tmux.wait_for("the chat to end", |s| s.contains("[agentry exited"));
    assert!(screen.contains("[agentry exited 0]"), "{screen}");
    let history = tmux.history();
    assert!(
        history.contains("no services answer") && history.contains("logs/up.log"),
        "{history}"
    );
    // The services it started stopped with it; the conversation is kept.
    let out = install.run(&["sessions", "list"]);
    assert!(!out.status.success(), "{:?}", text(&out));
    let logs = std::fs::read_to_string(install.dir.path().join("data/logs/up.log")).unwrap();
    assert!(logs.contains("orchestrator"), "{logs}");
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_names_a_missing_model_server_and_the_fix_then_passes_with_one() {
    // No model server: the port is closed.
    let closed = common::install::free_port();
    let install = Install::new(&format!("http://127.0.0.1:{closed}/v1"));
    let out = install.run(&["doctor"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "FAIL  model server http://127.0.0.1:{closed}/v1 does not answer"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("fix: start it"), "{stdout}");
    assert!(stdout.contains("AGENTRY_LLM_BASE_URL"), "{stdout}");

    // A server that does not have the model.
    let model = FakeModel::start().await.unwrap();
    let mut install = Install::new(&model.base_url());
    for (k, v) in &mut install.env {
        if k == "AGENTRY_LLM_MODEL" {
            *v = "no-such-model".into();
        }
    }
    let out = install.run(&["doctor"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("model no-such-model is not listed") && stdout.contains("fake-model"),
        "{stdout}"
    );

    // With the model, and a model that calls the tool it is offered.
    model.push(Reply::tool_call("p1", "ping", serde_json::json!({})));
    let install = Install::new(&model.base_url());
    let out = install.run(&["doctor"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("answers and lists fake-model"), "{stdout}");
    assert!(stdout.contains("ok    the model calls tools"), "{stdout}");
    assert!(stdout.contains("no services answer"), "{stdout}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_no_model_server_up_and_health_say_so_at_once() {
    let closed = common::install::free_port();
    let (install, _up, log) = common::install::Up::start(&format!("http://127.0.0.1:{closed}/v1"));
    let out = install.run(&["health"]);
    let (stdout, stderr) = text(&out);
    // The services serve; the model is named as the problem, with the fix.
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "model: model unreachable at http://127.0.0.1:{closed}/v1"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("agentry doctor"), "{stdout}");
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(logs.contains("model unreachable"), "{logs}");
}

#[test]
fn a_config_dir_that_does_not_exist_is_an_error() {
    let install = Install::new("http://127.0.0.1:9/v1");
    let out = install.run(&[
        "--config-dir",
        "/no/such/agentry-config",
        "sessions",
        "list",
    ]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--config-dir /no/such/agentry-config: no such directory"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn init_lists_the_models_of_a_server_and_writes_the_one_chosen() {
    use std::io::Write;
    let model = FakeModel::start().await.unwrap();
    let install = Install::new(&model.base_url());
    let config = install.dir.path().join("config");
    let mut child = install
        .command(&["init", "--url", &model.base_url()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"2\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("1. fake-model (the server given"),
        "{stdout}"
    );
    assert!(stdout.contains("2. fake-model-large"), "{stdout}");
    let written = std::fs::read_to_string(config.join("local.toml")).unwrap();
    assert!(
        written.contains("model = \"fake-model-large\""),
        "{written}"
    );
    assert!(
        written.contains(&format!("base_url = \"{}\"", model.base_url())),
        "{written}"
    );
    // The file parses as configuration, and is not replaced by accident.
    let out = install.run(&["init", "--url", &model.base_url()]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("local.toml exists; nothing was changed"),
        "{stderr}"
    );
    let parsed: toml::Table = toml::from_str(&written).unwrap();
    assert_eq!(parsed["llm"]["provider"].as_str(), Some("openai"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_naming_a_tool_nobody_offers_stops_the_start_with_the_nearest_name() {
    let model = FakeModel::start().await.unwrap();
    let install = Install::new(&model.base_url());
    let agents = install.dir.path().join("config/agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(
        agents.join("reviewer.md"),
        "---\nname: reviewer\ndescription: reviews code\ntools: read_file, grpe\n---\nReview.\n",
    )
    .unwrap();
    let out = install
        .command(&["up"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("reviewer.md"), "{stderr}");
    assert!(
        stderr.contains("names the tool \"grpe\"") && stderr.contains("did you mean \"grep\"?"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn slash_model_switches_the_session_s_model_and_refuses_one_not_listed() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::text("Hi from the large one."));
    let (install, _up, _log) = common::install::Up::start(&model.base_url());
    let out = common::install::run_with_input(
        &install,
        &["chat", "--scratch"],
        b"/model fake-model-large\nhello\n/model no-such-model\n",
        &[],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("Hi from the large one."), "{stdout}");
    assert!(
        stderr.contains("does not list \"no-such-model\""),
        "{stderr}"
    );
    let request = model.requests().pop().unwrap();
    assert_eq!(request["model"], "fake-model-large");
    let id = install.latest_session();
    let changed: Vec<String> = install
        .events(&id)
        .iter()
        .filter(|e| e["type"] == "model_changed")
        .map(|e| e["model"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(changed, ["fake-model-large"]);
}
