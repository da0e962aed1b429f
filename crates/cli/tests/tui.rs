//! The full-screen chat driven in a real terminal: the real `agentry`
//! binary runs `agentry chat` inside tmux (80×24), keys are typed with
//! `send-keys` and the screen is read with `capture-pane`, against
//! `agentry up` and the test kit's fake model.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_testkit::fake_model::{FakeModel, Reply};
use common::install::{BIN, Install, Up};
use common::tmux::{Tmux, tmux_present};
use serde_json::json;
use std::time::Duration;

fn chat_script(install: &Install, args: &str) -> String {
    let mut script = String::from("cd \"$(dirname \"$0\")\"\nunset NO_COLOR\n");
    script.push_str(&install.shell_exports());
    script.push_str(&format!(
        "{BIN} chat {args}\necho \"[chat exited $?]\"\nsleep 60\n"
    ));
    script
}

#[tokio::test(flavor = "multi_thread")]
async fn an_edit_is_approved_from_its_diff_the_answer_renders_and_a_turn_is_cancelled() {
    if !tmux_present() {
        return;
    }
    let model = FakeModel::start().await.unwrap();
    // A first, headless turn writes the file the chat will edit.
    model.push(Reply::tool_call(
        "w1",
        "write_file",
        json!({"path": "notes.txt", "content": "first line\nsecond line\nthird line\n"}),
    ));
    model.push(Reply::text("written"));
    let prices = "[[model_prices]]\npattern = \"fake-model\"\ninput = 1.5\noutput = 2.0\n";
    let (install, _up, _log) = Up::start_configured(&model.base_url(), prices);
    let out = install.run(&["run", "--approve", "always", "write the notes"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let session = install.latest_session();
    let file = install
        .dir
        .path()
        .join("data/workspaces")
        .join(&session)
        .join("notes.txt");
    assert!(file.exists());

    model.push(Reply::tool_call(
        "e1",
        "edit_file",
        json!({"path": "notes.txt", "old_string": "second line", "new_string": "2nd line"}),
    ));
    model.push(Reply::text(
        "Done: the **second** line now reads `2nd line`.\n\n- one\n- two",
    ));
    let tmux = Tmux::start(
        install.dir.path(),
        &chat_script(&install, &format!("--session {session}")),
    );
    tmux.wait_for("the chat to open", |s| s.contains("message the agent"));
    tmux.type_text("shorten the second line");
    tmux.keys(&["Enter"]);

    // The question shows the change as a diff against the file now.
    let screen = tmux.wait_for("the edit's diff", |s| {
        s.contains("+2nd line") && s.contains("allow?")
    });
    assert!(
        screen.contains("the agent wants to run edit_file"),
        "{screen}"
    );
    assert!(screen.contains("-second line"), "{screen}");
    assert!(screen.contains(" first line"), "{screen}");
    assert!(screen.contains("--- a/notes.txt"), "{screen}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "first line\nsecond line\nthird line\n",
        "nothing is written before the answer"
    );
    // A question takes single keys once it has been on screen a moment.
    std::thread::sleep(Duration::from_millis(800));
    tmux.keys(&["y"]);

    // The answer renders as markdown; the status line shows the context
    // used against the window and the session's cost.
    let screen = tmux.wait_for("the answer", |s| {
        s.contains("line now reads") && s.contains("ready")
    });
    assert!(
        screen.contains("Done: the second line now reads 2nd line."),
        "{screen}"
    );
    assert!(!screen.contains("**"), "{screen}");
    assert!(screen.contains("• one"), "{screen}");
    assert!(screen.contains("✓ edit_file notes.txt"), "{screen}");
    assert!(screen.contains("approved"), "{screen}");
    let status = screen.lines().last().unwrap().to_string();
    assert!(status.contains("fake-model"), "{status}");
    assert!(status.contains("/32.8k ("), "{status}");
    assert!(status.contains("$0.0"), "{status}");
    assert!(status.contains(&session[..8]), "{status}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "first line\n2nd line\nthird line\n"
    );

    // A long command, approved, then cancelled with Ctrl+C.
    model.push(Reply::tool_call(
        "b1",
        "bash",
        json!({"command": "sleep 30"}),
    ));
    model.push(Reply::text("never shown"));
    tmux.type_text("wait a while");
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("the bash question", |s| s.contains("$ sleep 30"));
    assert!(screen.contains("the agent wants to run bash"), "{screen}");
    // A question takes single keys once it has been on screen a moment.
    std::thread::sleep(Duration::from_millis(800));
    tmux.keys(&["y"]);
    tmux.wait_for("the command to run", |s| s.contains("running bash"));
    tmux.keys(&["C-c"]);
    let screen = tmux.wait_for("the cancel", |s| {
        s.contains("turn cancelled") && s.contains("ready")
    });
    assert!(!screen.contains("never shown"), "{screen}");

    // /compact (completed from "/comp" with Tab) summarises the
    // conversation at once, without a model answer.
    model.push(Reply::text("The person had notes edited and waited."));
    tmux.type_text("/comp");
    tmux.keys(&["Tab"]);
    tmux.wait_for("the completed command", |s| s.contains("› /compact"));
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("the compaction", |s| {
        s.contains("compacted:") && s.contains("ready")
    });
    assert!(screen.contains("context compacted"), "{screen}");
    let requests = model.requests();
    let summarise = requests.last().unwrap().to_string();
    assert!(
        summarise.contains("Person: write the notes"),
        "the summary request holds the oldest messages: {summarise}"
    );

    // Ctrl+D leaves, saying how to come back.
    tmux.keys(&["C-d"]);
    let screen = tmux.wait_for("the chat to end", |s| s.contains("[chat exited 0]"));
    assert!(
        screen.contains(&format!("agentry chat --session {session}")),
        "{screen}"
    );
}

/// Leaving the chat while a question waits does not decide it: the turn
/// is not cancelled, the question stays in the inbox, and the chat says so.
#[tokio::test(flavor = "multi_thread")]
async fn leaving_with_a_question_waiting_keeps_it_in_the_inbox() {
    leave_with_a_question_waiting("").await;
}

/// The same in the line chat on a terminal.
#[tokio::test(flavor = "multi_thread")]
async fn leaving_the_line_chat_with_a_question_waiting_keeps_it_in_the_inbox() {
    leave_with_a_question_waiting("--plain").await;
}

async fn leave_with_a_question_waiting(args: &str) {
    if !tmux_present() {
        return;
    }
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "make release"}),
    ));
    model.push(Reply::text("released"));
    let (install, _up, _log) = Up::start_configured(&model.base_url(), "");
    let tmux = Tmux::start(install.dir.path(), &chat_script(&install, args));
    tmux.wait_for("the chat to open", |s| {
        s.contains("message the agent") || s.contains("Type a message")
    });
    tmux.type_text("release it");
    tmux.keys(&["Enter"]);
    tmux.wait_for("the question", |s| s.contains("$ make release"));
    std::thread::sleep(Duration::from_millis(300));
    tmux.keys(&["C-d"]);
    let screen = tmux.wait_for("the chat to end", |s| s.contains("[chat exited 0]"));
    assert!(
        screen.contains("1 question of this session waits for an answer in `agentry approvals`"),
        "{screen}"
    );
    let (waiting, _) = common::install::text(&install.run(&["approvals"]));
    assert!(waiting.contains("make release"), "{waiting}");
    let session = install.latest_session();
    let events = install.events(&session);
    assert!(
        !events
            .iter()
            .any(|e| e.to_string().contains("turn_cancelled")
                || e.to_string().contains("\"cancelled\"")),
        "the turn was cancelled: {events:?}"
    );
}
