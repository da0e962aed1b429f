//! The real `agentry` binary: `agentry up` in the background, then
//! `agentry run`, `agentry sessions` and `agentry chat` against it, with the
//! test kit's fake model as the LLM server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_testkit::fake_model::{FakeModel, Reply};
use common::install::{Install, Up, free_port, run_with_input, text};
use serde_json::json;
use std::net::TcpListener;
use std::process::Stdio;

#[tokio::test(flavor = "multi_thread")]
async fn up_then_run_prints_the_answer() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "c1",
        "bash",
        json!({"command": "echo $((6*7))"}),
    ));
    model.push(Reply::text("6*7 is 42."));
    let (install, up, log) = Up::start(&model.base_url());

    let out = tokio::task::spawn_blocking({
        let cmd = install.command(&["run", "--verbose", "--approve", "always", "what is 6*7?"]);
        move || {
            let mut cmd = cmd;
            cmd.stdin(Stdio::null()).output().unwrap()
        }
    })
    .await
    .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    // stdout holds the answer alone; tool activity goes to stderr.
    assert_eq!(stdout.trim(), "6*7 is 42.");
    assert!(stderr.contains("bash echo $((6*7))"), "{stderr}");
    assert!(stderr.contains("← 42"), "{stderr}");
    // The session's first answer says what every request carries, and
    // `agentry tools` gives the same figure.
    let fixed_part = |text: &str| -> String {
        let at = text
            .find("(fixed part of each request: ~")
            .unwrap_or_else(|| panic!("no fixed part in {text}"));
        text[at..].lines().next().unwrap().to_string()
    };
    let first = fixed_part(&stderr);
    assert!(
        first.ends_with("% of the 32768-token context window)"),
        "{first}"
    );
    let (tools, _) = text(&install.run(&["tools"]));
    assert!(
        tools.starts_with("model fake-model: context window 32768 tokens ("),
        "{tools}"
    );
    assert_eq!(fixed_part(&tools), first);
    assert!(tools.contains("\nbash "), "{tools}");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1]["messages"][3]["content"], "42\n");
    // The API key went to the model server as a bearer token...
    let headers = model.request_headers();
    assert!(
        headers[0]
            .iter()
            .any(|(k, v)| k == "authorization" && v == "Bearer sk-test-secret-123")
    );

    // The session is listed and can be shown.
    let (list, _) = text(&install.run(&["sessions", "list"]));
    assert!(list.contains("what is 6*7?"), "{list}");
    let id = list
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let (shown, _) = text(&install.run(&["sessions", "show", &id]));
    assert!(shown.contains("you> what is 6*7?"), "{shown}");
    assert!(shown.contains("6*7 is 42."), "{shown}");
    let (json_lines, _) = text(&install.run(&["sessions", "show", &id, "--json"]));
    let events: Vec<serde_json::Value> = json_lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.first().unwrap()["type"], "user_message");
    // The turn ran bash: its end is followed by the workspace's snapshot.
    let last = &events[events.len() - 1];
    let finished = &events[events.len() - 2];
    assert_eq!(last["type"], "workspace_snapshot");
    assert_eq!(last["point"], "turn_end");
    assert_eq!(finished["type"], "turn_finished");
    assert_eq!(finished["outcome"], "completed");

    assert_eq!(events.first().unwrap()["network"], false);

    // `run --json` continues the session and prints every event as JSON;
    // `--network` is recorded with the message.
    model.push(Reply::text("still 42"));
    let out = install.run(&["run", "--session", &id, "--json", "--network", "and again?"]);
    assert!(out.status.success());
    let (stdout, _) = text(&out);
    let events: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "user_message");
    assert_eq!(events[0]["text"], "and again?");
    assert_eq!(events[0]["network"], true);
    assert_eq!(events[0]["plan"], false);
    assert!(events.iter().all(|e| e["session_id"] == id.as_str()));
    assert_eq!(events.last().unwrap()["message"], "still 42");

    // A failing turn exits non-zero.
    model.push(Reply::error(400, "the prompt is too long"));
    let out = install.run(&["run", "--session", &id, "hello?"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).1.contains("the prompt is too long"),
        "{}",
        text(&out).1
    );

    // SIGTERM stops every service cleanly.
    let status = up.stop();
    assert!(status.success(), "agentry up exited with {status}");
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(
        !logs.contains("sk-test-secret-123"),
        "the API key leaked into the logs"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_reads_one_message_per_line_from_a_pipe() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::text("Hello!"));
    model.push(Reply::text("Goodbye!"));
    let (install, _up, _log) = Up::start(&model.base_url());
    let out = run_with_input(&install, &["chat"], b"hi\n\nbye\n", &[]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout
            .lines()
            .filter(|l| !l.trim_start().starts_with('('))
            .collect::<Vec<_>>(),
        vec!["Hello!", "Goodbye!"]
    );
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1]["messages"][3]["content"], "bye");
}

#[tokio::test(flavor = "multi_thread")]
async fn health_reports_serving_services_and_unreachable_ones() {
    let model = FakeModel::start().await.unwrap();
    let (install, _up, _log) = Up::start(&model.base_url());
    let all: Vec<String> = ["ORCHESTRATOR", "SESSION_STORE", "TOOL_RUNNER", "SCHEDULER"]
        .iter()
        .map(|var| {
            let key = format!("AGENTRY_{var}_URL");
            install
                .env
                .iter()
                .find(|(k, _)| *k == key)
                .unwrap()
                .1
                .clone()
        })
        .collect();
    let mut args = vec!["health"];
    args.extend(all.iter().map(String::as_str));
    let out = install.run(&args);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let services: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("  ")).collect();
    assert_eq!(services.len(), 4, "{stdout}");
    assert!(
        services.iter().all(|l| l.ends_with(": SERVING")),
        "{stdout}"
    );
    // The tool runner says how it confines commands, layer by layer.
    let sandbox: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("  sandbox "))
        .collect();
    for layer in ["namespaces: ", "landlock: ", "seccomp: ", "identity: "] {
        assert!(
            sandbox.iter().any(|l| l.starts_with(layer)),
            "{layer} missing from {stdout}"
        );
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        // This machine's kernel has Landlock and seccomp.
        assert!(
            sandbox.iter().any(|l| l.starts_with("landlock: on")),
            "{stdout}"
        );
        assert!(
            sandbox.iter().any(|l| l.starts_with("seccomp: on")),
            "{stdout}"
        );
    }

    // No URL: the configured orchestrator; --quiet prints nothing.
    let out = install.run(&["health", "--quiet"]);
    assert!(out.status.success());
    assert!(out.stdout.is_empty());

    let dead = format!("http://127.0.0.1:{}", free_port());
    let out = install.run(&["health", &all[0], &dead]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains(&all[0]), "{stdout}");
    assert!(stderr.contains(&dead), "{stderr}");
    assert!(stderr.to_lowercase().contains("refused"), "{stderr}");
}

#[test]
fn unreachable_orchestrator_gives_one_clear_line() {
    let install = Install::new("http://127.0.0.1:9/v1");
    let out = install.run(&["run", "hello"]);
    assert_eq!(out.status.code(), Some(1));
    let (_, stderr) = text(&out);
    let url = install.orchestrator_url();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&url), "{stderr}");
    assert!(stderr.contains("agentry up"), "{stderr}");
    assert!(stderr.to_lowercase().contains("refused"), "{stderr}");
}

#[test]
fn a_bad_config_file_fails_naming_file_key_and_reason() {
    let install = Install::new("http://127.0.0.1:9/v1");
    let path = install.dir.path().join("config/local.toml");
    std::fs::write(&path, "[agent]\nmax_steps = -4\n").unwrap();
    let out = install.run(&["up"]);
    assert!(!out.status.success());
    let (_, stderr) = text(&out);
    assert!(stderr.contains("local.toml"), "{stderr}");
    assert!(stderr.contains("agent.max_steps"), "{stderr}");
    let install = Install::new("not a url");
    let out = install.run(&["up"]);
    assert!(!out.status.success());
    assert!(
        text(&out).1.contains("AGENTRY_LLM_BASE_URL"),
        "{}",
        text(&out).1
    );
}

#[test]
fn a_taken_port_is_reported() {
    let install = Install::new("http://127.0.0.1:9/v1");
    let url = install.orchestrator_url();
    let addr = url.trim_start_matches("http://");
    let _holder = TcpListener::bind(addr).unwrap();
    let out = install.run(&["up"]);
    assert!(!out.status.success());
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains(addr) && stderr.contains("already in use"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_asks_before_a_sensitive_call_and_takes_the_answer() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "touch approved.txt && echo done"}),
    ));
    model.push(Reply::text("Created it."));
    model.push(Reply::tool_call(
        "t2",
        "bash",
        json!({"command": "make deploy"}),
    ));
    model.push(Reply::text("Understood, not deploying."));
    let (install, _up, _log) = Up::start(&model.base_url());
    let out = run_with_input(
        &install,
        &["chat"],
        b"create the file\ny\nnow deploy\nn\nnot today\n",
        &[],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The question showed the command and the rule that asked.
    assert!(
        stderr.contains("$ touch approved.txt && echo done"),
        "{stderr}"
    );
    assert!(stderr.contains("default for bash"), "{stderr}");
    assert!(
        stderr.contains("Allow? [y]es / [n]o / [a]lways in this session / [e]dit"),
        "{stderr}"
    );
    assert!(stdout.contains("Created it."), "{stdout}");
    assert!(stdout.contains("✓ approved"), "{stdout}");
    assert!(stdout.contains("✓ denied: not today"), "{stdout}");
    assert!(stdout.contains("Understood, not deploying."), "{stdout}");
    // The approved command really ran; the denied one's reason reached the model.
    let requests = model.requests();
    assert_eq!(requests.len(), 4);
    let last = requests[3]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        last["content"].as_str().unwrap().contains("not today"),
        "{last}"
    );
    let data = install.dir.path().join("data/workspaces");
    let made = std::fs::read_dir(&data)
        .unwrap()
        .any(|d| d.unwrap().path().join("approved.txt").exists());
    assert!(made, "approved.txt was not created");
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_edits_arguments_in_the_editor() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "echo original"}),
    ));
    model.push(Reply::text("ok"));
    let (install, _up, _log) = Up::start(&model.base_url());
    // `echo` is allowed by default, so ask for something that needs approval.
    model.push(Reply::tool_call(
        "t2",
        "bash",
        json!({"command": "make original"}),
    ));
    model.push(Reply::text("edited run done"));
    let out = run_with_input(
        &install,
        &["chat"],
        b"first\nsecond\ne\na\ny\n",
        &[("EDITOR", "sed -i 's/make original/echo edited/'")],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("edited to"), "{stdout}");
    // The edited call is shown again and runs only on a yes ("always"
    // does not cover an edited call).
    let shown = stderr.find("The call as edited:").expect(&stderr);
    assert!(stderr[shown..].contains("$ echo edited"), "{stderr}");
    assert!(stderr.contains("an edited call runs once"), "{stderr}");
    let requests = model.requests();
    let last = requests[3]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let content = last["content"].as_str().unwrap();
    assert!(content.contains("edited the arguments"), "{content}");
    assert!(content.ends_with("edited\n"), "{content}");
}

#[tokio::test(flavor = "multi_thread")]
async fn run_without_a_person_stops_with_a_distinct_exit_code() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "make all"}),
    ));
    let (install, _up, _log) = Up::start(&model.base_url());
    let out = install.run(&["run", "build it"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("needs a person's approval"), "{stderr}");
    assert!(stderr.contains("--approve always"), "{stderr}");
    // The session is not left waiting: the next turn works.
    model.push(Reply::tool_call(
        "t2",
        "bash",
        json!({"command": "make all"}),
    ));
    model.push(Reply::text("refused as asked"));
    let list = text(&install.run(&["sessions", "list"])).0;
    let id = list
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let out = install.run(&["run", "--session", &id, "--approve", "never", "build it"]);
    assert!(out.status.success(), "{}", text(&out).1);
    let requests = model.requests();
    let last = requests.last().unwrap()["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .contains("needs a person's approval"),
        "{last}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reminders_are_listed_and_cancelled_from_the_cli() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "r1",
        "schedule_reminder",
        json!({"message": "renew the certificate", "due": "in 2h"}),
    ));
    model.push(Reply::text("Scheduled."));
    let (install, _up, _log) = Up::start(&model.base_url());
    let out = install.run(&["run", "remind me to renew the certificate in two hours"]);
    assert!(out.status.success(), "{}", text(&out).1);
    let (list, _) = text(&install.run(&["reminders", "list"]));
    assert!(list.contains("renew the certificate"), "{list}");
    assert!(list.contains("pending"), "{list}");
    let id = list
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let out = install.run(&["reminders", "cancel", &id]);
    assert!(out.status.success(), "{}", text(&out).1);
    assert!(text(&out).0.contains("cancelled: renew the certificate"));
    let (pending, _) = text(&install.run(&["reminders", "list"]));
    assert_eq!(pending.trim(), "no reminders");
    let (all, _) = text(&install.run(&["reminders", "list", "--status", "all"]));
    assert!(all.contains("cancelled"), "{all}");
    // Cancelling twice is a clear error.
    let out = install.run(&["reminders", "cancel", &id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).1.contains("already cancelled"),
        "{}",
        text(&out).1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_see_only_passed_through_secrets() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "echo \"[$DEPLOY_TOKEN] [$OTHER_TOKEN] [$AGENTRY_LLM_API_KEY]\""}),
    ));
    model.push(Reply::text("done"));
    let mut install = Install::new(&model.base_url());
    install.env.push(("DEPLOY_TOKEN".into(), "pass-me".into()));
    install.env.push(("OTHER_TOKEN".into(), "hide-me".into()));
    std::fs::write(
        install.dir.path().join("config/local.toml"),
        "[tool_runner]\nenv_passthrough = [\"DEPLOY_TOKEN\"]\n",
    )
    .unwrap();
    let log = install.dir.path().join("up.log");
    let Some(_up) = Up::try_start(&install, &log) else {
        eprintln!("skipped: a port was taken; covered by the other runs");
        return;
    };
    let out = install.run(&["run", "--approve", "always", "show the tokens"]);
    assert!(out.status.success(), "{}", text(&out).1);
    let requests = model.requests();
    let tool_output = requests[1]["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(tool_output, "[pass-me] [] []\n");
}

/// `GET /metrics` over plain HTTP/1.0.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(
        response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
        "{response}"
    );
    response
}

#[tokio::test(flavor = "multi_thread")]
async fn every_service_serves_metrics() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "c1",
        "bash",
        json!({"command": "echo hi"}),
    ));
    model.push(Reply::text("Said hi."));
    let ports: Vec<(&str, String)> = ["ORCHESTRATOR", "SESSION_STORE", "TOOL_RUNNER", "SCHEDULER"]
        .into_iter()
        .map(|var| (var, format!("127.0.0.1:{}", free_port())))
        .collect();
    let mut started = None;
    for _ in 0..3 {
        let mut install = Install::new(&model.base_url());
        for (var, addr) in &ports {
            install
                .env
                .push((format!("AGENTRY_{var}_METRICS_LISTEN"), addr.clone()));
        }
        let log = install.dir.path().join("up.log");
        if let Some(up) = Up::try_start(&install, &log) {
            started = Some((install, up));
            break;
        }
    }
    let (install, _up) = started.expect("agentry up did not start");
    let out = tokio::task::spawn_blocking({
        let cmd = install.command(&["run", "--approve", "always", "say hi"]);
        move || {
            let mut cmd = cmd;
            cmd.stdin(Stdio::null()).output().unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let page = |var: &str| scrape(&ports.iter().find(|(v, _)| *v == var).unwrap().1);
    let orchestrator = page("ORCHESTRATOR");
    for line in [
        "agentry_turns_total{outcome=\"completed\"} 1\n",
        "agentry_model_call_seconds_count{outcome=\"ok\"} 2\n",
        "agentry_orchestrator_tool_calls_total{tool=\"bash\",outcome=\"ok\"} 1\n",
        "agentry_calls_in_flight{kind=\"model\"} 0\n",
        "agentry_calls_in_flight{kind=\"tool\"} 0\n",
        "agentry_pending_approvals 0\n",
    ] {
        assert!(
            orchestrator.contains(line),
            "missing {line:?} in\n{orchestrator}"
        );
    }
    let store = page("SESSION_STORE");
    assert!(
        store.contains("agentry_store_append_seconds_count{outcome=\"ok\"}"),
        "{store}"
    );
    assert!(
        store.contains("# TYPE agentry_store_events_appended_total counter"),
        "{store}"
    );
    let runner = page("TOOL_RUNNER");
    assert!(
        runner.contains("tool=\"bash\",outcome=\"ok\"} 1"),
        "{runner}"
    );
    let scheduler = page("SCHEDULER");
    assert!(
        scheduler.contains("agentry_reminders_pending 0\n"),
        "{scheduler}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_runs_plan_mode_per_message_or_for_every_message() {
    let model = FakeModel::start().await.unwrap();
    // "/plan list the files": a plan, its step, the final answer.
    model.push(Reply::tool_call(
        "p1",
        "submit_plan",
        json!({"steps": ["list the workspace"]}),
    ));
    model.push(Reply::tool_call(
        "c1",
        "complete_step",
        json!({"status": "completed", "summary": "it is empty"}),
    ));
    model.push(Reply::text("The workspace is empty."));
    // "/plan" switches plan mode on; "count them" is planned too, and the
    // plain answer that ends its only step ends the turn.
    model.push(Reply::tool_call(
        "p2",
        "submit_plan",
        json!({"steps": ["count"]}),
    ));
    model.push(Reply::text("There are none."));
    let (install, _up, _log) = Up::start(&model.base_url());
    let out = run_with_input(
        &install,
        &["chat"],
        b"/plan list the files\n/plan\ncount them\n",
        &[],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("The workspace is empty."), "{stdout}");
    assert!(stdout.contains("There are none."), "{stdout}");
    // Chat shows the plan and its progress with the answers.
    assert!(
        stdout.contains("plan:\n   [ ] 1. list the workspace"),
        "{stdout}"
    );
    assert!(stdout.contains("▶ step 1: list the workspace"), "{stdout}");
    assert!(stdout.contains("✓ step 1 done: it is empty"), "{stdout}");
    assert!(stderr.contains("plan mode on"), "{stderr}");
    let requests = model.requests();
    assert_eq!(requests.len(), 5);
    // The command is not part of the message.
    assert_eq!(requests[0]["messages"][2]["content"], "list the files");
    let offered = |i: usize| {
        requests[i]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["function"]["name"] == "submit_plan")
    };
    assert!(offered(0) && offered(3));
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_network_is_switched_per_message_and_recorded() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::text("one"));
    model.push(Reply::text("two"));
    model.push(Reply::text("three"));
    let (install, _up, _log) = Up::start(&model.base_url());
    let out = run_with_input(
        &install,
        &["chat", "--network"],
        b"first\n/network\nsecond\n/network\nthird\n",
        &[],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("network off"), "{stderr}");
    assert!(stderr.contains("network on: "), "{stderr}");
    let (list, _) = text(&install.run(&["sessions", "list"]));
    let id = list
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    let (json_lines, _) = text(&install.run(&["sessions", "show", id, "--json"]));
    let switches: Vec<(String, bool)> = json_lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["type"] == "user_message")
        .map(|e| {
            (
                e["text"].as_str().unwrap().to_string(),
                e["network"] == true,
            )
        })
        .collect();
    assert_eq!(
        switches,
        vec![
            ("first".to_string(), true),
            ("second".to_string(), false),
            ("third".to_string(), true),
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn run_plan_plans_before_it_acts() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "p1",
        "submit_plan",
        json!({"steps": [{"title": "answer", "detail": "briefly"}]}),
    ));
    model.push(Reply::text("Done."));
    let (install, _up, _log) = Up::start(&model.base_url());
    let out = run_with_input(&install, &["run", "--plan", "--json", "say done"], b"", &[]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let types: Vec<String> = stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["type"].to_string())
        .filter(|t| t.contains("plan") || t.contains("turn_finished"))
        .collect();
    assert_eq!(
        types,
        [
            "\"plan_submitted\"",
            "\"plan_step_updated\"",
            "\"plan_step_updated\"",
            "\"turn_finished\""
        ]
    );
    assert!(stdout.contains(r#""detail":"briefly""#), "{stdout}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_uses_the_token_of_its_data_dir_and_others_are_refused() {
    let model = FakeModel::start().await.unwrap();
    let (install, up, _log) = Up::start(&model.base_url());
    // Up::start got an answer from `agentry sessions list` with no set-up:
    // the CLI found the client token the services created.
    let token_file = install.dir.path().join("data/auth/client.token");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&token_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // `agentry token` prints it, for grpcurl and remote CLIs.
    let out = install.run(&["token"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let token = stdout.trim().to_string();
    assert!(token.starts_with("agentry_client_"), "{stdout}");
    assert_eq!(
        token,
        std::fs::read_to_string(&token_file).unwrap().trim(),
        "the printed token is the file's"
    );

    // Given explicitly, it works from anywhere.
    let elsewhere = tempfile::tempdir().unwrap();
    let out = install
        .command(&["sessions", "list"])
        .env("AGENTRY_DATA_DIR", elsewhere.path())
        .env("AGENTRY_TOKEN", &token)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", text(&out));

    // A wrong token and no token are refused, each with one clear line.
    let out = install
        .command(&["sessions", "list"])
        .env(
            "AGENTRY_TOKEN",
            "agentry_client_0000000000000000000000000000",
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("not valid"), "{stderr}");
    assert!(stderr.contains("Unauthenticated"), "{stderr}");
    let out = install
        .command(&["sessions", "list"])
        .env("AGENTRY_DATA_DIR", elsewhere.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("has no client token"), "{stderr}");
    assert!(stderr.contains("AGENTRY_TOKEN"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    up.stop();
}

#[test]
fn a_service_without_authentication_refuses_to_listen_beyond_loopback() {
    let install = Install::new("http://127.0.0.1:9/v1");
    let port = free_port();
    let out = install
        .command(&["serve", "session-store"])
        .env("AGENTRY_AUTH", "off")
        .env("AGENTRY_SESSION_STORE_LISTEN", format!("0.0.0.0:{port}"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!(
            "refusing to listen on 0.0.0.0:{port} without authentication"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("auth.mode"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_stopped_at_its_limit_continues_once_the_person_raises_it() {
    use agentry_testkit::fake_model::{self as fm, finish, tool_call, usage};
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::stream(vec![
        tool_call(0, "c1", "bash", &[r#"{"command": "echo hi"}"#]),
        usage(590, 10),
    ]));
    let (install, up, _log) =
        Up::start_configured(&model.base_url(), "[agent]\nturn_token_budget = 500\n");
    let out = install.run(&["run", "--approve", "always", "do it"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(5), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("stopped at the turn limit: 600 tokens used of 500"),
        "{stderr}"
    );
    assert!(stderr.contains("--budget-tokens"), "{stderr}");
    // The call did not run: only one model call so far.
    assert_eq!(model.request_count(), 1);
    let id = install.latest_session();
    // Raised, the session carries on.
    model.push(Reply::stream(vec![
        tool_call(0, "c2", "bash", &[r#"{"command": "echo again"}"#]),
        usage(590, 10),
    ]));
    model.push(Reply::stream(vec![
        fm::text("Done."),
        finish("stop"),
        usage(700, 5),
    ]));
    let out = install.run(&[
        "run",
        "--session",
        &id,
        "--approve",
        "always",
        "--budget-tokens",
        "5000",
        "continue",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "Done.");
    drop(up);
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_raises_a_limit_with_the_next_message() {
    use agentry_testkit::fake_model::{self as fm, finish, tool_call, usage};
    let model = FakeModel::start().await.unwrap();
    for (id, path) in [("c1", "x"), ("c2", "y")] {
        model.push(Reply::stream(vec![
            tool_call(0, id, "read_file", &[&format!(r#"{{"path": "{path}"}}"#)]),
            usage(590, 10),
        ]));
    }
    model.push(Reply::stream(vec![
        fm::text("Done."),
        finish("stop"),
        usage(700, 5),
    ]));
    let (install, _up, _log) =
        Up::start_configured(&model.base_url(), "[agent]\nturn_token_budget = 500\n");
    let out = run_with_input(
        &install,
        &["chat"],
        b"read x\n/budget tokens 5000\nnow read y\n",
        &[],
    )
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // In chat, the turn's activity shares stdout with the answers.
    assert!(
        stdout.contains("(stopped at the turn limit: 600 tokens used of 500 tokens"),
        "{stdout}"
    );
    assert!(
        stderr.contains("limits raised with your next message"),
        "{stderr}"
    );
    assert!(stdout.contains("Done."), "{stdout}\n{stderr}");
    assert_eq!(model.request_count(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_servers_from_a_json_file_answer_a_run_and_show_in_the_cli() {
    let Some(venv) = agentry_testkit::mcp_servers::venv() else {
        return;
    };
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "t1",
        "time__get_current_time",
        json!({"timezone": "UTC"}),
    ));
    model.push(Reply::text("It is daytime somewhere."));
    // The common JSON form, as other agents' config files write it.
    let servers = json!({"mcpServers": {
        "time": {"command": venv.join("bin/mcp-server-time")},
        "broken": {"command": "/nonexistent/mcp-server", "args": ["x"]}
    }});
    let (install, up) = (0..3)
        .find_map(|_| {
            let install = Install::new(&model.base_url());
            let config = install.dir.path().join("config");
            std::fs::write(
                config.join("local.toml"),
                "[mcp]\nservers_file = \"mcp.json\"\n",
            )
            .unwrap();
            std::fs::write(config.join("mcp.json"), servers.to_string()).unwrap();
            let log = install.dir.path().join("up.log");
            Up::try_start(&install, &log).map(|up| (install, up))
        })
        .expect("agentry up could not bind its ports");

    // `agentry mcp list` exits 1 while a server is not ready; `time` gets
    // ready, `broken` says why it is not.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let listing = loop {
        let (stdout, stderr) = text(&install.run(&["mcp", "list"]));
        if stdout.contains("time")
            && stdout
                .lines()
                .any(|l| l.starts_with("time") && l.contains("ready"))
        {
            break stdout;
        }
        assert!(std::time::Instant::now() < deadline, "{stdout}\n{stderr}");
        std::thread::sleep(std::time::Duration::from_millis(300));
    };
    assert!(listing.contains("SERVER"), "{listing}");
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with("broken") && l.contains("failed")),
        "{listing}"
    );
    assert!(
        listing.contains("cannot find the program \"/nonexistent/mcp-server\""),
        "{listing}"
    );
    let out = install.run(&["mcp", "list"]);
    assert_eq!(out.status.code(), Some(1), "a server is not ready");

    let (tools, _) = text(&install.run(&["mcp", "tools", "time"]));
    assert!(
        tools.contains("time__get_current_time [the server says read-only]"),
        "{tools}"
    );
    let out = install.run(&["mcp", "tools", "nope"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("no MCP server is named \"nope\""),
        "{stderr}"
    );
    let (health, _) =
        text(&install.run(&["health", &install.env_value("AGENTRY_TOOL_RUNNER_URL")]));
    assert!(health.contains("mcp time (stdio): ready"), "{health}");

    // A headless run calls the real server.
    let out = tokio::task::spawn_blocking({
        let cmd = install.command(&["run", "--approve", "always", "what time is it in UTC?"]);
        move || {
            let mut cmd = cmd;
            cmd.stdin(Stdio::null()).output().unwrap()
        }
    })
    .await
    .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "It is daytime somewhere.");
    assert!(stderr.contains("time__get_current_time"), "{stderr}");
    let second = model.requests()[1].to_string();
    assert!(second.contains("day_of_week"), "{second}");
    drop(up);
}

/// A gRPC client of the install's orchestrator, with its client token.
async fn orchestrator_of(
    install: &Install,
) -> agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient<
    agentry_testkit::cluster::Channel,
> {
    let source = agentry_runtime::ConfigSource {
        dir: Some(install.dir.path().join("config")),
        env: install.env.iter().cloned().collect(),
    };
    let config = agentry_runtime::Config::load(&source).unwrap();
    let auth = agentry_runtime::Auth::for_client(&config).unwrap();
    let channel = agentry_testkit::cluster::connect_as(&auth, &install.orchestrator_url())
        .await
        .unwrap();
    agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient::new(channel)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_approval_inbox_answers_later_and_policy_suggest_learns_from_it() {
    use agentry_proto::orchestrator::v1 as opb;
    use agentry_proto::sessions::v1 as spb;
    let model = FakeModel::start().await.unwrap();
    let (install, _up, _log) = Up::start(&model.base_url());
    let mut client = orchestrator_of(&install).await;
    let session = client
        .create_session(opb::CreateSessionRequest {
            title: "nightly build".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Turns nobody watches (as a reminder or an MCP update starts them):
    // their questions wait in the inbox.
    let ask = |text: &str| opb::SubmitRequest {
        session_id: session.id.clone(),
        input: Some(opb::Input {
            kind: Some(opb::input::Kind::UserMessage(opb::UserInput {
                text: text.into(),
                approval_mode: spb::ApprovalMode::Policy as i32,
                ..Default::default()
            })),
        }),
    };
    let inbox = |install: &Install| {
        let out = install.run(&["approvals"]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        stdout
    };
    let wait_for = |install: &Install, needle: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let listing = inbox(install);
            if listing.contains(needle) {
                return listing;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{needle} never waited: {listing}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    let mut answered = Vec::new();
    for (i, (command, decision)) in [
        ("make build", "approve"),
        ("make build --release", "approve"),
        ("make install", "deny"),
    ]
    .into_iter()
    .enumerate()
    {
        let call = format!("c{i}");
        model.push(Reply::tool_call(&call, "bash", json!({"command": command})));
        model.push(Reply::text("done"));
        client.submit(ask("build it")).await.unwrap();
        let listing = wait_for(&install, &call);
        assert!(listing.contains(&format!("bash $ {command}")), "{listing}");
        assert!(listing.contains("nightly build"), "{listing}");
        assert!(listing.contains("default for bash: confirm"), "{listing}");
        let (json, _) = text(&install.run(&["approvals", "--json"]));
        let first: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
        assert_eq!(first["call_id"], call.as_str());
        assert_eq!(first["session_id"], session.id.as_str());
        let out = install.run(&[
            "approvals",
            "answer",
            &session.id,
            &call,
            decision,
            "--reason",
            "not now",
        ]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        answered.push(call);
        // Answered: the turn goes on and the inbox empties.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !inbox(&install).contains("no tool call is waiting") {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        // And the turn ends before the next message.
        while client
            .get_session(opb::GetSessionRequest {
                session_id: session.id.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .turn_open
        {
            assert!(std::time::Instant::now() < deadline, "the turn never ended");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    // An answer to nothing is refused.
    let out = install.run(&["approvals", "answer", &session.id, "c0", "approve"]);
    assert!(!out.status.success());

    let out = install.run(&["policy", "suggest"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("# 3 decisions in 1 session: 2 approved, 1 denied"),
        "{stdout}"
    );
    assert!(
        stdout.contains("# would have saved 2 prompts; allows none of the 1 denied call of bash\n[[policy.rules]]\ntool = \"bash\"\ncommand = \"make build*\"\ndecision = \"allow\""),
        "{stdout}"
    );
    assert!(!stdout.contains("command = \"make*\""), "{stdout}");
    // The suggested rules are valid configuration.
    let rules: String = stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let parsed: toml::Table = toml::from_str(&rules).unwrap();
    assert_eq!(parsed["policy"]["rules"].as_array().unwrap().len(), 1);
}

/// Session ids are 36 characters; any prefix only one session has will do,
/// an ambiguous one lists the candidates, an unknown one says so.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_named_by_any_unique_prefix_of_their_id() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::text("first answer"));
    model.push(Reply::text("second answer"));
    let (install, _up, _log) = Up::start(&model.base_url());
    for prompt in ["one", "two"] {
        let out = install.run(&["run", prompt]);
        assert!(out.status.success(), "{}", text(&out).1);
    }
    let list = text(&install.run(&["sessions", "list"])).0;
    let ids: Vec<&str> = list
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(ids.len(), 2, "{list}");
    // The shortest prefix of the first id that the second does not share.
    let unique = (1..=ids[0].len())
        .map(|n| &ids[0][..n])
        .find(|p| !ids[1].starts_with(p))
        .unwrap();
    let (shown, err) = text(&install.run(&["sessions", "show", unique]));
    assert!(shown.contains("answer"), "{shown}{err}");
    let (_, ambiguous) = text(&install.run(&["sessions", "show", &ids[0][..2]]));
    assert!(
        ambiguous.contains("2 sessions' ids start with") && ambiguous.contains(ids[1]),
        "{ambiguous}"
    );
    let out = install.run(&["sessions", "show", "zzzz"]);
    assert!(!out.status.success());
    assert!(
        text(&out)
            .1
            .contains("no session is named \"zzzz\" or has an id starting with it"),
        "{}",
        text(&out).1
    );
    // The chat and run take a prefix too.
    model.push(Reply::text("third answer"));
    let out = install.run(&["run", "--session", unique, "three"]);
    assert!(out.status.success(), "{}", text(&out).1);
    let events = install.events(ids[0]);
    assert!(
        events
            .iter()
            .any(|e| e.to_string().contains("third answer")),
        "the prefix did not reach the first session"
    );
}

/// `agentry run -` (or no message, with a pipe) takes the message from
/// standard input; an empty one is refused.
#[tokio::test(flavor = "multi_thread")]
async fn run_reads_the_message_from_a_pipe() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::text("read it"));
    model.push(Reply::text("read it again"));
    let (install, _up, _log) = Up::start(&model.base_url());
    let out = run_with_input(&install, &["run", "-"], b"line one\nline two\n", &[]).await;
    assert!(out.status.success(), "{}", text(&out).1);
    assert_eq!(text(&out).0.trim(), "read it");
    let out = run_with_input(&install, &["run"], b"from a pipe\n", &[]).await;
    assert!(out.status.success(), "{}", text(&out).1);
    let requests = model.requests();
    let sent: Vec<String> = requests
        .iter()
        .map(|r| r["messages"].as_array().unwrap().last().unwrap()["content"].to_string())
        .collect();
    assert!(sent[0].contains("line one\\nline two"), "{sent:?}");
    assert!(sent[1].contains("from a pipe"), "{sent:?}");
    let out = run_with_input(&install, &["run", "-"], b"  \n", &[]).await;
    assert!(!out.status.success());
    assert!(text(&out).1.contains("is empty"), "{}", text(&out).1);
}

/// `agentry completions bash` is a script bash completes the commands with
/// (no configuration or service needed).
#[test]
fn bash_completes_agentry_s_commands() {
    let script = std::process::Command::new(common::BIN)
        .args(["completions", "bash"])
        .env("AGENTRY_CONFIG_DIR", "/nonexistent")
        .output()
        .unwrap();
    assert!(script.status.success(), "{}", text(&script).1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentry.bash");
    std::fs::write(&path, &script.stdout).unwrap();
    let complete = |words: &str| {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
                 _agentry agentry \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
                 echo \"${{COMPREPLY[@]}}\"",
                path.display()
            ))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(complete("agentry ses").contains("sessions"));
    assert!(complete("agentry sessions sh").contains("show"));
    let shells = ["zsh", "fish"];
    for shell in shells {
        let out = std::process::Command::new(common::BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
}

/// Without `--verbose`, `run` keeps to the answer and the tool activity.
#[tokio::test(flavor = "multi_thread")]
async fn run_says_the_fixed_part_only_when_verbose() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::text("plain"));
    let (install, _up, _log) = Up::start(&model.base_url());
    let out = install.run(&["run", "hello"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout.trim(), "plain");
    assert!(!stderr.contains("fixed part"), "{stderr}");
}
