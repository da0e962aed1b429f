//! Sub-agents through the real binary: `agentry up` with an agent defined
//! in a file, the fake model answering the parent and the child in turn.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_testkit::fake_model::{self, FakeModel, Reply};
use common::install::{Install, Up, text};
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::{Duration, Instant};

const RESEARCHER: &str = "---
name: researcher
description: Reads the workspace and answers questions about it
tools: read_file, list_dir
max_steps: 4
---
You read files and report facts. Never change anything.
";

/// An install with the researcher agent, `agentry up` running, and a
/// session whose workspace holds notes.txt; returns the session's id.
async fn with_notes(model: &FakeModel) -> (Install, Up, std::path::PathBuf, String) {
    model.push(Reply::tool_call(
        "w1",
        "write_file",
        json!({"path": "notes.txt", "content": "hello from the notes\n"}),
    ));
    model.push(Reply::text("written"));
    let install = Install::new(&model.base_url());
    let agents = install.dir.path().join("config/agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(agents.join("researcher.md"), RESEARCHER).unwrap();
    let log = install.dir.path().join("up.log");
    let up = Up::try_start(&install, &log).expect("agentry up");
    let out = install.run(&["run", "--approve", "always", "write the notes"]);
    assert!(out.status.success(), "{}", text(&out).1);
    let session = install.latest_session();
    (install, up, log, session)
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn delegate_reply() -> Reply {
    Reply::tool_call(
        "d1",
        "delegate",
        json!({"agent": "researcher", "task": "What does notes.txt say?"}),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_delegates_to_a_read_only_agent_and_uses_its_answer() {
    let model = FakeModel::start().await.unwrap();
    let (install, _up, log, session) = with_notes(&model).await;
    model.push(delegate_reply());
    model.push(Reply::tool_call(
        "r1",
        "read_file",
        json!({"path": "notes.txt"}),
    ));
    model.push(Reply::text("notes.txt says: hello from the notes"));
    model.push(Reply::text("The researcher found: hello from the notes."));
    let before = model.request_count();
    let out = install.run(&["run", "--session", &session, "ask the researcher"]);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "{stdout}\n{stderr}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(stdout.trim(), "The researcher found: hello from the notes.");

    let requests = model.requests();
    let new = &requests[before..];
    assert_eq!(new.len(), 4, "{new:?}");
    // The parent is offered the delegate tool, naming the agent.
    let tools = |r: &Value| -> Vec<String> {
        r["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(tools(&new[0]).contains(&"delegate".to_string()));
    // The child's requests carry only the agent's prompt and tools, and
    // the task as the person's message.
    for child in &new[1..3] {
        let mut offered = tools(child);
        offered.sort();
        assert_eq!(offered, vec!["list_dir", "read_file"], "{child}");
        let messages = child["messages"].as_array().unwrap();
        assert!(
            messages[0]["content"]
                .as_str()
                .unwrap()
                .starts_with("You read files and report facts."),
            "{child}"
        );
        assert!(!child.to_string().contains("ask the researcher"), "{child}");
        assert_eq!(messages[1]["content"], "What does notes.txt say?");
    }
    // It read the parent's workspace.
    assert!(
        new[2].to_string().contains("hello from the notes"),
        "{}",
        new[2]
    );
    // The child's answer is the delegate call's result.
    let result = new[3]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == "d1")
        .unwrap()["content"]
        .clone();
    assert_eq!(result, "notes.txt says: hello from the notes");

    // The child is a session of its own, listed as the researcher's task,
    // with its complete log; the parent shows it.
    let tasks = children_of(&install, "researcher");
    assert_eq!(tasks.len(), 1);
    let child_log = install.events(&tasks[0]);
    let kinds: Vec<&str> = child_log
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"user_message"));
    assert!(kinds.contains(&"tool_result"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"turn_finished"));
    let (shown, _) = text(&install.run(&["sessions", "show", &session]));
    assert!(
        shown.contains(&format!("↳ {} [researcher for call d1]", tasks[0])),
        "{shown}"
    );
    let (child_shown, _) = text(&install.run(&["sessions", "show", &tasks[0]]));
    assert!(
        child_shown.contains(&format!(
            "a task of the sub-agent researcher for session {session}"
        )),
        "{child_shown}"
    );
    // Its progress was the delegate call's output in the parent's log.
    let parent_log = install.events(&session);
    assert!(
        parent_log.iter().any(|e| e["type"] == "tool_output_chunk"
            && e["text"]
                .as_str()
                .is_some_and(|t| t.contains("[researcher] read_file"))),
        "{parent_log:?}"
    );
    // The child's tokens count in the parent's turn.
    let spent = |log: &[Value]| -> u64 {
        log.iter()
            .filter(|e| e["type"] == "model_message")
            .map(|e| e["usage"]["total_tokens"].as_u64().unwrap())
            .sum()
    };
    let finished = parent_log
        .iter()
        .rfind(|e| e["type"] == "turn_finished")
        .unwrap();
    let this_turn: Vec<Value> = parent_log
        .iter()
        .filter(|e| e["turn_id"] == finished["turn_id"])
        .cloned()
        .collect();
    let (child_tokens, own_tokens) = (spent(&child_log), spent(&this_turn));
    assert!(child_tokens > 0 && own_tokens > 0);
    let result = parent_log
        .iter()
        .find(|e| e["type"] == "tool_result" && e["call_id"] == "d1")
        .unwrap();
    assert_eq!(
        result["sub_agent_usage"]["total_tokens"], child_tokens,
        "{result}"
    );
    assert_eq!(
        finished["usage"]["total_tokens"],
        own_tokens + child_tokens,
        "{finished}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_the_agent_was_not_offered_is_refused_and_an_unknown_agent_said() {
    let model = FakeModel::start().await.unwrap();
    let (install, _up, _log, session) = with_notes(&model).await;
    model.push(Reply::tool_call(
        "d0",
        "delegate",
        json!({"agent": "writer", "task": "write"}),
    ));
    model.push(delegate_reply());
    model.push(Reply::tool_call(
        "b1",
        "bash",
        json!({"command": "rm notes.txt"}),
    ));
    model.push(Reply::text("I may not run bash."));
    model.push(Reply::text("done"));
    let before = model.request_count();
    let out = install.run(&["run", "--session", &session, "--approve", "always", "go"]);
    assert!(out.status.success(), "{}", text(&out).1);
    let requests = model.requests();
    let tool_result = |r: &Value, id: &str| -> String {
        r["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
            .map(|m| m["content"].as_str().unwrap().to_string())
            .unwrap_or_default()
    };
    assert!(
        tool_result(&requests[before + 1], "d0")
            .contains("no agent \"writer\"; the agents are: researcher"),
        "{}",
        requests[before + 1]
    );
    // The child asked for bash, which it was not offered: refused, even
    // with every call approved for the turn; nothing was removed.
    assert!(
        tool_result(&requests[before + 3], "b1")
            .starts_with("error: the tool bash is not offered to you"),
        "{}",
        requests[before + 3]
    );
    let notes = install
        .dir
        .path()
        .join("data/workspaces")
        .join(&session)
        .join("notes.txt");
    assert!(notes.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_the_parent_cancels_its_sub_agent() {
    let model = FakeModel::start().await.unwrap();
    let (install, _up, _log, session) = with_notes(&model).await;
    model.push(delegate_reply());
    // The child's model call takes long: the cancel comes meanwhile.
    model.push(Reply::text("too late").delay(Duration::from_secs(30)));
    let mut run = install
        .command(&["run", "--session", &session, "ask the researcher"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the sub-agent's session", || {
        children_of(&install, "researcher").len() == 1
    });
    let child = children_of(&install, "researcher").remove(0);
    wait_for("the child's turn to start", || {
        install
            .events(&child)
            .iter()
            .any(|e| e["type"] == "user_message")
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(130), "the run ends cancelled");
    wait_for("the child's turn to be cancelled", || {
        install
            .events(&child)
            .iter()
            .any(|e| e["type"] == "turn_finished" && e["outcome"] == "cancelled")
    });
    let parent = install.events(&session);
    assert!(parent.iter().any(|e| {
        e["type"] == "tool_result"
            && e["call_id"] == "d1"
            && e["output"]
                .as_str()
                .is_some_and(|o| o.contains("cancelled"))
    }));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_during_a_sub_agents_task_resumes_parent_and_child() {
    let model = FakeModel::start().await.unwrap();
    let (install, up, log, session) = with_notes(&model).await;
    model.push(delegate_reply());
    model.push(Reply::tool_call(
        "r1",
        "read_file",
        json!({"path": "notes.txt"}),
    ));
    // The child's second model call hangs; the services die meanwhile.
    model.push(Reply::text("lost").delay(Duration::from_secs(60)));
    let submitted = install
        .command(&["run", "--session", &session, "ask the researcher"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = {
        wait_for("the sub-agent's session", || {
            children_of(&install, "researcher").len() == 1
        });
        children_of(&install, "researcher").remove(0)
    };
    wait_for("the child's read_file result", || {
        install
            .events(&child)
            .iter()
            .any(|e| e["type"] == "tool_result")
    });
    drop(up); // SIGKILL
    let mut submitted = submitted;
    let _ = submitted.kill();
    let _ = submitted.wait();
    // After the restart the child is asked again, then the parent.
    model.push(Reply::text("notes.txt says: hello from the notes"));
    model.push(Reply::text("Resumed: hello from the notes."));
    let _up = Up::try_start(&install, &log).expect("agentry up again");
    wait_for("the parent's turn to finish", || {
        install
            .events(&session)
            .iter()
            .filter(|e| e["type"] == "turn_finished")
            .count()
            == 2
    });
    let parent = install.events(&session);
    let finished = parent
        .iter()
        .rev()
        .find(|e| e["type"] == "turn_finished")
        .unwrap();
    assert_eq!(finished["outcome"], "completed", "{parent:?}");
    assert_eq!(finished["message"], "Resumed: hello from the notes.");
    // One task, finished, with its answer as the parent's call result.
    assert_eq!(children_of(&install, "researcher"), vec![child.clone()]);
    let result = parent
        .iter()
        .rev()
        .find(|e| e["type"] == "tool_result" && e["call_id"] == "d1")
        .unwrap();
    assert_eq!(result["output"], "notes.txt says: hello from the notes");
    let child_log = install.events(&child);
    assert_eq!(
        child_log
            .iter()
            .filter(|e| e["type"] == "user_message")
            .count(),
        1,
        "the task was not started twice"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sub_agents_call_is_approved_in_the_parents_chat() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "d1",
        "delegate",
        json!({"agent": "builder", "task": "create built.txt"}),
    ));
    model.push(Reply::tool_call(
        "b1",
        "bash",
        json!({"command": "echo built > built.txt"}),
    ));
    model.push(Reply::text("created built.txt"));
    model.push(Reply::text("The builder created it."));
    let builder = "[[agents]]\nname = \"builder\"\ndescription = \"Builds things\"\n\
                   system_prompt = \"You build.\"\ntools = [\"bash\", \"read_file\"]\n";
    let (install, _up, _log) = Up::start_configured(&model.base_url(), builder);
    // The delegate call itself asks first (the builder changes files),
    // then the builder's bash call, relayed from its session.
    let out = common::install::run_with_input(&install, &["chat"], b"build it\ny\ny\n", &[]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("the agent wants to run delegate"),
        "{stderr}"
    );
    assert!(
        stderr.contains("the sub-agent builder wants to run bash"),
        "{stderr}"
    );
    assert!(stderr.contains("$ echo built > built.txt"), "{stderr}");
    assert!(stdout.contains("The builder created it."), "{stdout}");
    let session = install.latest_session();
    let session = if session.starts_with("sub-") {
        // The listing's first row is the most recent: the parent was
        // touched last when its turn ended.
        text(&install.run(&["sessions", "list"]))
            .0
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().next().unwrap().to_string())
            .find(|id| !id.starts_with("sub-"))
            .unwrap()
    } else {
        session
    };
    let built = install
        .dir
        .path()
        .join("data/workspaces")
        .join(&session)
        .join("built.txt");
    assert_eq!(std::fs::read_to_string(built).unwrap(), "built\n");
    let tasks: Vec<String> = text(&install.run(&["sessions", "list"]))
        .0
        .lines()
        .filter(|l| l.contains("↳ [builder for"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert_eq!(tasks.len(), 1);
    let child_log = install.events(&tasks[0]);
    assert!(
        child_log
            .iter()
            .any(|e| e["type"] == "approval_decided" && e["call_id"] == "b1"),
        "the decision is in the child's log: {child_log:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_whose_call_ends_after_a_restart_does_not_go_on() {
    let model = FakeModel::start().await.unwrap();
    let builder = "[[agents]]\nname = \"builder\"\ndescription = \"Builds things\"\n\
                   system_prompt = \"You build.\"\ntools = [\"bash\"]\n";
    let (install, up, log) = Up::start_configured(&model.base_url(), builder);
    model.push(Reply::tool_call(
        "d1",
        "delegate",
        json!({"agent": "builder", "task": "build for a long time"}),
    ));
    model.push(Reply::tool_call(
        "b1",
        "bash",
        json!({"command": "sleep 30"}),
    ));
    let mut run = install
        .command(&["run", "--approve", "always", "build"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let task = |install: &Install| -> Option<String> {
        text(&install.run(&["sessions", "list"]))
            .0
            .lines()
            .find(|l| l.contains("↳ [builder for"))
            .map(|l| l.split_whitespace().next().unwrap().to_string())
    };
    wait_for("the builder's task", || task(&install).is_some());
    let child = task(&install).unwrap();
    wait_for("the builder's command to run", || {
        install
            .events(&child)
            .iter()
            .any(|e| e["type"] == "tool_call_state" && e["phase"] == "executing")
    });
    let session = text(&install.run(&["sessions", "list"]))
        .0
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .find(|id| !id.starts_with("sub-"))
        .unwrap();
    drop(up); // SIGKILL, with the task's command running
    let _ = run.kill();
    let _ = run.wait();
    // After the restart nobody can say what the delegate call did (it may
    // change files): its result says so, and its task is cancelled rather
    // than left to go on by itself.
    model.push(Reply::text("done").delay(Duration::from_secs(2)));
    model.push(Reply::text("done").delay(Duration::from_secs(2)));
    let _up = Up::try_start(&install, &log).expect("agentry up again");
    wait_for("the task to be cancelled", || {
        install
            .events(&child)
            .iter()
            .any(|e| e["type"] == "turn_finished" && e["outcome"] == "cancelled")
    });
    let parent = install.events(&session);
    let result = parent
        .iter()
        .find(|e| e["type"] == "tool_result" && e["call_id"] == "d1")
        .unwrap();
    assert!(
        result["output"]
            .as_str()
            .unwrap()
            .contains("outcome unknown"),
        "{result}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tasks_wait_for_a_place_when_the_bound_is_reached() {
    let model = FakeModel::start().await.unwrap();
    let researcher = "[agent]\nmax_parallel_agents = 1\n\n[[agents]]\nname = \"researcher\"\n\
                      description = \"Reads\"\nsystem_prompt = \"You read.\"\n\
                      tools = [\"read_file\"]\n";
    let (install, _up, _log) = Up::start_configured(&model.base_url(), researcher);
    // Two read-only tasks in one response: they could run side by side,
    // but one place means the second waits for the first to end.
    let first = json!({"agent": "researcher", "task": "first question"}).to_string();
    let second = json!({"agent": "researcher", "task": "second question"}).to_string();
    model.push(Reply::stream(vec![
        fake_model::tool_call(0, "d1", "delegate", &[&first]),
        fake_model::tool_call(1, "d2", "delegate", &[&second]),
        fake_model::finish("tool_calls"),
        fake_model::usage(10, 5),
    ]));
    model.push(Reply::text("answer one").delay(Duration::from_millis(1500)));
    model.push(Reply::text("answer two"));
    model.push(Reply::text("both answered"));
    let out = install.run(&["run", "ask twice"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "both answered");
    let mut tasks: Vec<(f64, f64)> = children_of(&install, "researcher")
        .iter()
        .map(|id| {
            let log = install.events(id);
            let at = |kind: &str| {
                log.iter()
                    .find(|e| e["type"] == kind)
                    .and_then(|e| e["time"].as_f64())
                    .unwrap()
            };
            (at("user_message"), at("turn_finished"))
        })
        .collect();
    assert_eq!(tasks.len(), 2);
    tasks.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(
        tasks[1].0 >= tasks[0].1,
        "the second task started before the first ended: {tasks:?}"
    );
}

/// The task sessions of `agent` that `agentry sessions list` shows.
fn children_of(install: &Install, agent: &str) -> Vec<String> {
    let (list, _) = text(&install.run(&["sessions", "list"]));
    list.lines()
        .filter(|l| l.contains(&format!("↳ [{agent} for")))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}
