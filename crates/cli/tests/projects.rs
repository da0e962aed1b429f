//! Sessions on a person's project directory, through the real `agentry`
//! binary: `agentry up` in the background, a scripted model, and
//! `agentry run` started in (or pointed at) a git repository.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_testkit::fake_model::{FakeModel, Reply};
use common::install::{Install, Up, text};
use serde_json::json;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The uid (and gid) the repository belongs to when the tests run as
/// root: not root, and not a uid the sandbox gives sessions.
const OWNER: u32 = 4242;

fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.name=Test", "-c", "user.email=test@example.com"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {:?}", text(&out));
}

/// A git repository with a tracked source file, an ignored build
/// directory, and (as root) an owner who is not root.
fn repository(parent: &Path) -> PathBuf {
    let repo = parent.join("repo");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::create_dir_all(repo.join("target")).unwrap();
    std::fs::write(repo.join("src/lib.rs"), "pub fn answer() -> u32 { 41 }\n").unwrap();
    std::fs::write(repo.join(".gitignore"), "target/\n").unwrap();
    std::fs::write(repo.join("target/build.txt"), "first build\n").unwrap();
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "start"]);
    hand_to_owner(&repo);
    repo
}

/// As root, gives `dir` to an owner who is not root (a root-owned project
/// is refused with per-session users).
fn hand_to_owner(dir: &Path) {
    if running_as_root() {
        let out = Command::new("chown")
            .args([
                "-R",
                &format!("{OWNER}:{OWNER}"),
                &dir.display().to_string(),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{:?}", text(&out));
    }
}

/// Runs `agentry ARGS` started in `dir`, with nothing on standard input.
fn run_in(install: &Install, dir: &Path, args: &[&str]) -> std::process::Output {
    install
        .command(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// A run that failed, saying `says` (the callers check that no model call
/// was made).
fn refused(out: &std::process::Output, prompt: &str, says: &str) {
    let (_, stderr) = text(out);
    assert!(!out.status.success(), "{prompt}");
    assert!(stderr.contains(says), "{prompt}: {stderr}");
}

fn start(model: &FakeModel) -> (Install, Up, PathBuf, PathBuf) {
    start_with(model, "")
}

/// [`start`], with `more` added to the configuration.
fn start_with(model: &FakeModel, more: &str) -> (Install, Up, PathBuf, PathBuf) {
    Up::start_with_projects(&model.base_url(), more)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_started_in_a_repository_reads_and_edits_it_and_rewinds_leave_builds_alone() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "r1",
        "read_file",
        json!({"path": "src/lib.rs"}),
    ));
    model.push(Reply::tool_call(
        "e1",
        "edit_file",
        json!({"path": "src/lib.rs", "old_string": "41", "new_string": "42"}),
    ));
    model.push(Reply::tool_call(
        "b1",
        "bash",
        json!({"command": "pwd; echo new > created.txt; echo second build > target/build.txt"}),
    ));
    model.push(Reply::text("Fixed the answer."));
    let (install, _up, root, log) = start(&model);
    let repo = repository(&root);

    // Started inside the repository, with no option: it works there.
    let out = run_in(
        &install,
        &repo,
        &["run", "--approve", "always", "fix the answer"],
    );
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "{stdout}\n{stderr}\n{}",
        log.display()
    );
    assert!(stdout.contains("Fixed the answer."), "{stdout}");
    assert!(!stderr.contains("scratch"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(repo.join("src/lib.rs")).unwrap(),
        "pub fn answer() -> u32 { 42 }\n"
    );
    let id = install.latest_session();
    let events = install.events(&id);
    let results: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_result")
        .collect();
    assert!(
        results[0]["output"].as_str().unwrap().contains("41"),
        "{results:#?}"
    );
    let canonical = repo.canonicalize().unwrap();
    assert!(
        results[2]["output"]
            .as_str()
            .unwrap()
            .contains(&canonical.display().to_string()),
        "{results:#?}"
    );
    // Nothing the session made belongs to anyone but the repository's owner.
    let owner = std::fs::metadata(&repo).unwrap().uid();
    for made in ["created.txt", "src/lib.rs", "target/build.txt"] {
        assert_eq!(
            std::fs::metadata(repo.join(made)).unwrap().uid(),
            owner,
            "{made}"
        );
    }
    if running_as_root() {
        assert_eq!(owner, OWNER);
    }
    // No temp dir or other leftover of the runner in the repository.
    let mut names: Vec<String> = std::fs::read_dir(&repo)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [".git", ".gitignore", "created.txt", "src", "target"]
    );
    // The listing and the session say where it works.
    let (listed, _) = text(&install.run(&["sessions", "list"]));
    assert!(listed.contains("WHERE"), "{listed}");
    assert!(listed.contains("repo"), "{listed}");
    let (shown, _) = text(&install.run(&["sessions", "show", &id]));
    assert!(
        shown.contains(&format!("works in {}", canonical.display())),
        "{shown}"
    );

    // Rewinding the turn puts the tracked file back and removes what the
    // turn made, but leaves the ignored build output as it is now.
    let out = install.run(&["sessions", "rewind", &id, "--to", "0"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        std::fs::read_to_string(repo.join("src/lib.rs")).unwrap(),
        "pub fn answer() -> u32 { 41 }\n"
    );
    assert!(!repo.join("created.txt").exists());
    assert_eq!(
        std::fs::read_to_string(repo.join("target/build.txt")).unwrap(),
        "second build\n"
    );
    // The repository itself is intact.
    let out = Command::new("git")
        .args([
            "-c",
            &format!("safe.directory={}", canonical.display()),
            "status",
            "--porcelain",
        ])
        .current_dir(&repo)
        .output()
        .unwrap();
    let (porcelain, err) = text(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(porcelain.trim(), "", "the rewound repository is clean");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_outside_the_project_roots_is_refused_or_left_for_scratch() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call("p1", "bash", json!({"command": "pwd"})));
    model.push(Reply::text("Here."));
    let (install, _up, _root, _log) = start(&model);
    let elsewhere = install.dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();

    // Named with --dir: refused, with the setting named, and no session.
    let out = install.run(&[
        "run",
        "--dir",
        &elsewhere.display().to_string(),
        "look around",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("tool_runner.project_roots"), "{stderr}");
    assert!(stderr.contains("--scratch"), "{stderr}");
    let (listed, _) = text(&install.run(&["sessions", "list"]));
    assert!(listed.contains("no sessions yet"), "{listed}");

    // Started there without --dir: a scratch workspace, said once.
    let out = run_in(
        &install,
        &elsewhere,
        &["run", "--approve", "always", "look around"],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("scratch workspace"), "{stderr}");
    let id = install.latest_session();
    let pwd = install
        .events(&id)
        .into_iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap();
    assert!(
        pwd["output"]
            .as_str()
            .unwrap()
            .contains(&format!("workspaces/{id}")),
        "{pwd}"
    );

    // A missing directory is the client's error, before any service.
    let out = install.run(&["run", "--dir", "/no/such/dir", "x"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("--dir /no/such/dir"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn agents_md_of_the_repository_and_of_a_subdirectory_reach_the_model() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "r1",
        "read_file",
        json!({"path": "crates/core/lib.rs"}),
    ));
    model.push(Reply::text("Read it."));
    let (install, _up, root, log) = start(&model);
    let repo = repository(&root);
    let core = repo.join("crates/core");
    std::fs::create_dir_all(&core).unwrap();
    std::fs::write(
        repo.join("AGENTS.md"),
        "Run `make check` before you say you are done.\n",
    )
    .unwrap();
    std::fs::write(core.join("AGENTS.md"), "The core crate has no I/O.\n").unwrap();
    std::fs::write(core.join("lib.rs"), "pub fn pure() {}\n").unwrap();
    if running_as_root() {
        let out = Command::new("chown")
            .args([
                "-R",
                &format!("{OWNER}:{OWNER}"),
                &repo.display().to_string(),
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    let canonical = repo.canonicalize().unwrap();

    // `agentry tools` in the repository counts them in the fixed part.
    let plain = install.run(&["tools"]);
    let (plain_out, _) = text(&plain);
    let here = run_in(&install, &repo, &["tools"]);
    let (tools_out, tools_err) = text(&here);
    assert!(here.status.success(), "{tools_out}\n{tools_err}");
    let agents = canonical.join("AGENTS.md").display().to_string();
    assert!(tools_out.contains(&agents), "{tools_out}");
    let fixed = |out: &str| -> u64 {
        let line = out
            .lines()
            .find(|l| l.contains("fixed part"))
            .unwrap_or_else(|| panic!("no fixed part in {out}"));
        line.split_whitespace()
            .find_map(|w| w.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok())
            .unwrap()
    };
    assert!(
        fixed(&tools_out) > fixed(&plain_out),
        "{tools_out}\n---\n{plain_out}"
    );

    let out = run_in(
        &install,
        &repo,
        &["run", "--approve", "always", "look at the core"],
    );
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "{stdout}\n{stderr}\n{}",
        log.display()
    );
    assert!(
        stderr.contains(&format!("instructions from {agents}")),
        "{stderr}"
    );
    let requests = model.requests();
    let system_text = |request: &serde_json::Value| -> String {
        request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "system")
            .map(|m| m["content"].as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    // The first request has the repository's file; the one after the
    // read of crates/core has the subdirectory's too, nearest last.
    let first = system_text(&requests[requests.len() - 2]);
    assert!(first.contains("Run `make check`"), "{first}");
    assert!(!first.contains("The core crate has no I/O."), "{first}");
    let second = system_text(&requests[requests.len() - 1]);
    let (root_at, core_at) = (
        second.find("Run `make check`").unwrap(),
        second.find("The core crate has no I/O.").unwrap(),
    );
    assert!(root_at < core_at, "{second}");
    // Both are in the log, as events.
    let id = install.latest_session();
    let loaded: Vec<String> = install
        .events(&id)
        .iter()
        .filter(|e| e["type"] == "instructions_loaded")
        .flat_map(|e| e["files"].as_array().unwrap().clone())
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        loaded,
        [
            agents,
            canonical
                .join("crates/core/AGENTS.md")
                .display()
                .to_string()
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn at_path_attaches_a_file_or_a_listing_and_a_missing_one_is_refused() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::text("It returns 41."));
    let (install, _up, root, _log) = start(&model);
    let repo = repository(&root);
    let run_here = |prompt: &str| run_in(&install, &repo, &["run", prompt]);
    let out = run_here("what does @src/lib.rs return? see also @src/");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let request = model.requests().pop().unwrap();
    let user = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap()["content"]
        .to_string();
    assert!(user.contains("[attached: the file src/lib.rs]"), "{user}");
    assert!(user.contains("answer() -> u32 { 41 }"), "{user}");
    assert!(
        user.contains("[attached: the listing of the directory src]"),
        "{user}"
    );
    // A path that is not there, and an image: refused before any turn.
    let before = model.requests().len();
    for (prompt, says) in [
        (
            "fix @src/missing.rs please",
            "cannot attach @src/missing.rs",
        ),
        (
            "what is in @shot.png",
            "not set to take images; if it takes images, set `llm.images = true`",
        ),
    ] {
        refused(&run_here(prompt), prompt, says);
    }
    assert_eq!(model.requests().len(), before);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_mentioned_goes_to_a_model_that_takes_images_and_other_files_are_refused() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::text("A red dot."));
    let (install, _up, root, _log) = start_with(&model, "[llm]\nimages = true\n");
    let repo = repository(&root);
    // A real (1×1) PNG, and text dressed as one.
    let png: &[u8] = &[
        0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d, b'I', b'H', b'D', b'R', 0,
        0, 0, 1, 0, 0, 0, 1, 8, 2, 0, 0, 0, 0x90, 0x77, 0x53, 0xde,
    ];
    std::fs::write(repo.join("shot.png"), png).unwrap();
    std::fs::write(repo.join("fake.png"), "just text\n").unwrap();
    let run_here = |prompt: &str| run_in(&install, &repo, &["run", "--json", prompt]);
    let out = run_here("what is in @shot.png?");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let request = model.requests().pop().unwrap();
    let user = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap()
        .clone();
    let parts = user["content"].as_array().expect("text and image parts");
    assert_eq!(parts[0]["text"], "what is in @shot.png?", "{user}");
    {
        use base64::Engine as _;
        let url = format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(png)
        );
        assert_eq!(parts[1]["image_url"]["url"], url.as_str(), "{user}");
    }
    // The log keeps it, and the transcript says so.
    let message = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["type"] == "user_message")
        .expect("the message in the JSON output");
    assert_eq!(
        message["images"],
        serde_json::json!([{
            "path": "shot.png",
            "mime": "image/png",
            "data": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, png),
        }])
    );
    // Text named like an image, and a path outside the project: refused
    // before any turn.
    let before = model.requests().len();
    for (prompt, says) in [
        ("and @fake.png?", "is not a PNG, JPEG, GIF or WebP image"),
        ("and @../../x.png?", "cannot attach @../../x.png"),
    ] {
        refused(&run_here(prompt), prompt, says);
    }
    assert_eq!(model.requests().len(), before);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_works_in_a_git_worktree_of_its_own_and_leaves_the_source_alone() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::text("Looked."));
    let (install, _up, root, _log) = start(&model);
    let repo = repository(&root);
    let out = run_in(&install, &repo, &["run", "look at the answer"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let source = install.latest_session();
    // A worktree beside the repository, for the fork.
    let worktree = root.join("try-b");
    git(
        &repo,
        &[
            "-c",
            "safe.directory=*",
            "worktree",
            "add",
            "-q",
            worktree.to_str().unwrap(),
        ],
    );
    hand_to_owner(&worktree);
    let out = install.run(&[
        "sessions",
        "fork",
        &source,
        "--id",
        "try-b",
        "--dir",
        worktree.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let canonical = worktree.canonicalize().unwrap();
    assert!(
        stdout.contains(&format!("works in {}", canonical.display())),
        "{stdout}"
    );
    // The fork goes on from the same conversation, in the worktree.
    model.push(Reply::tool_call(
        "e1",
        "edit_file",
        json!({"path": "src/lib.rs", "old_string": "41", "new_string": "43"}),
    ));
    model.push(Reply::text("Changed it there."));
    let out = install.run(&[
        "run",
        "--session",
        "try-b",
        "--approve",
        "always",
        "change it",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let request = model.requests().pop().unwrap();
    assert!(
        request.to_string().contains("look at the answer"),
        "{request}"
    );
    assert_eq!(
        std::fs::read_to_string(worktree.join("src/lib.rs")).unwrap(),
        "pub fn answer() -> u32 { 43 }\n"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("src/lib.rs")).unwrap(),
        "pub fn answer() -> u32 { 41 }\n",
        "the source's directory is untouched"
    );
    let (shown, _) = text(&install.run(&["sessions", "show", "try-b"]));
    assert!(shown.contains(&canonical.display().to_string()), "{shown}");
    // A directory outside the project roots: refused, and no fork is left.
    let elsewhere = install.dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let out = install.run(&[
        "sessions",
        "fork",
        &source,
        "--id",
        "nowhere",
        "--dir",
        elsewhere.to_str().unwrap(),
    ]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("tool_runner.project_roots"), "{stderr}");
    let (listed, _) = text(&install.run(&["sessions", "list"]));
    assert!(!listed.contains("nowhere"), "{listed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_named_used_by_name_and_deleted_without_touching_a_project() {
    let model = FakeModel::start().await.unwrap();
    model.push(Reply::text("Hello."));
    model.push(Reply::tool_call(
        "w1",
        "bash",
        json!({"command": "echo scratch > note.txt"}),
    ));
    model.push(Reply::text("Noted."));
    let (install, _up, root, _log) = start(&model);
    let repo = repository(&root);
    // One session in the project, one in a scratch workspace.
    let out = run_in(&install, &repo, &["run", "hello"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let project_session = install.latest_session();
    let out = install.run(&["run", "--scratch", "--approve", "always", "note it"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let scratch_session = install.latest_session();
    let scratch = install
        .dir
        .path()
        .join("data/workspaces")
        .join(&scratch_session);
    assert!(scratch.join("note.txt").exists());

    // A name, then every command takes it.
    let out = install.run(&["sessions", "rename", &project_session, "login-fix"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("is named login-fix"), "{stdout}");
    let (listed, _) = text(&install.run(&["sessions", "list"]));
    assert!(listed.contains("[login-fix]"), "{listed}");
    let (shown, _) = text(&install.run(&["sessions", "show", "login-fix"]));
    assert!(shown.contains(&project_session), "{shown}");
    let out = install.run(&["sessions", "rename", &scratch_session, "login-fix"]);
    assert!(!out.status.success());
    assert!(
        text(&out).1.contains("is taken by session"),
        "{:?}",
        text(&out)
    );

    // Deleting asks for --yes without a terminal, then removes the log and
    // the scratch workspace; a project directory stays as it was.
    let out = install.run(&["sessions", "delete", &scratch_session]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("pass --yes"), "{:?}", text(&out));
    for id in [scratch_session.as_str(), "login-fix"] {
        let out = install.run(&["sessions", "delete", id, "--yes"]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("deleted session"), "{stdout}");
    }
    assert!(!scratch.exists());
    assert!(repo.join("src/lib.rs").exists() && repo.join(".git").exists());
    let (listed, _) = text(&install.run(&["sessions", "list"]));
    assert!(listed.contains("no sessions yet"), "{listed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_sessions_on_one_repository_take_turns_with_their_changing_calls() {
    let model = FakeModel::start().await.unwrap();
    for label in ["one", "two"] {
        model.push(Reply::tool_call(
            &format!("b-{label}"),
            "bash",
            json!({"command": format!(
                "echo start-{label} >> order.txt; sleep 1.5; echo end-{label} >> order.txt"
            )}),
        ));
    }
    model.push(Reply::text("Done."));
    model.push(Reply::text("Done."));
    let (install, _up, root, _log) = start(&model);
    let repo = repository(&root);
    // Two runs at once, both started in the repository.
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let mut cmd = install.command(&["run", "--approve", "always", "log it"]);
            cmd.current_dir(&repo)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    for run in runs {
        let out = run.wait_with_output().unwrap();
        assert!(out.status.success(), "{:?}", text(&out));
    }
    // The changing calls ran one after the other, never interleaved.
    let order = std::fs::read_to_string(repo.join("order.txt")).unwrap();
    let lines: Vec<&str> = order.lines().collect();
    assert_eq!(lines.len(), 4, "{order}");
    assert!(
        lines[0].starts_with("start-") && lines[2].starts_with("start-"),
        "{order}"
    );
    assert_eq!(lines[0].replace("start", "end"), lines[1], "{order}");
    assert_eq!(lines[2].replace("start", "end"), lines[3], "{order}");
    // The one that waited said whom for.
    let (listed, _) = text(&install.run(&["sessions", "list"]));
    let ids: Vec<String> = listed
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert_eq!(ids.len(), 2, "{listed}");
    let waited = ids.iter().any(|id| {
        install.events(id).iter().any(|e| {
            e["type"] == "tool_output_chunk"
                && e["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("[waiting for session"))
        })
    });
    assert!(waited, "no call said it waited");
}
