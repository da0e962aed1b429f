//! Sessions working in a person's project directory, under the real
//! sandbox: writes stay inside it (no `..`, no symbolic link out of it,
//! not even one swapped in while a write runs), commands run as the
//! directory's owner when the runner is root, the runner's records are out
//! of reach, and two sessions' changing calls take turns.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sandbox_support;
use sandbox_support::{attempt, bash, confined, limits, run, workspace_root};

use agentry_proto::tools::v1 as pb;
use agentry_proto::tools::v1::tool_runner_server::ToolRunner;
use agentry_tool_runner::ToolRunnerService;
use agentry_tool_runner::projects::Places;
use agentry_tool_runner::sandbox::Sandbox;
use agentry_tool_runner::workspace::Workspace;
use serde_json::json;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_stream::StreamExt;

/// The owner of the project when the tests run as root: neither root nor
/// a uid the sandbox gives sessions.
const OWNER: u32 = 4343;

/// A home with a project directory in it (owned by [`OWNER`] as root) and
/// a file beside the project that no session may read or change.
struct Home {
    dir: tempfile::TempDir,
    project: PathBuf,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let project = dir.path().join("project");
        std::fs::create_dir(&project).unwrap();
        std::fs::write(dir.path().join("beside.txt"), "BESIDE-SECRET").unwrap();
        std::fs::set_permissions(
            dir.path().join("beside.txt"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&project, Some(OWNER), Some(OWNER)).unwrap();
        }
        let project = project.canonicalize().unwrap();
        Home { dir, project }
    }

    fn places(&self, root: &Path, sandbox: &Sandbox) -> Places {
        Places::new(
            root.to_path_buf(),
            &[self.dir.path().to_path_buf()],
            &sandbox.hidden,
            sandbox.switches_identity(),
        )
    }
}

fn open(places: &Places, sandbox: &Sandbox, session: &str, dir: &Path) -> Workspace {
    let ws = places.open_project(session, dir).unwrap();
    sandbox.hand_over_workspace(&ws).unwrap();
    ws
}

/// Session `s1` working in a fresh home's project under the real sandbox,
/// with the workspace root beside it; `None` (said) without the helper.
fn confined_project() -> Option<(tempfile::TempDir, Sandbox, Home, Workspace)> {
    let root = workspace_root();
    let sandbox = confined(root.path())?;
    let home = Home::new();
    let places = home.places(root.path(), &sandbox);
    let ws = open(&places, &sandbox, "s1", &home.project);
    Some((root, sandbox, home, ws))
}

#[tokio::test]
async fn a_project_session_changes_only_its_directory_as_its_owner() {
    let Some((root, sandbox, home, ws)) = confined_project() else {
        return;
    };
    let record = root.path().join(".projects/s1");
    assert!(record.exists());
    let out = bash(
        &ws,
        &sandbox,
        &format!(
            "id -u; pwd; cat ../beside.txt; echo x > ../planted; echo y > {}/planted; \
             cat {}; echo z > {}; ls -a {}; echo fine > inside.txt; mkdir -p sub && echo deep > sub/f",
            home.dir.path().display(),
            record.display(),
            record.display(),
            root.path().display(),
        ),
    )
    .await;
    let shown = &out.output;
    let mut lines = shown.lines();
    let uid = lines.next().unwrap();
    assert_eq!(lines.next().unwrap(), home.project.display().to_string());
    assert!(!shown.contains("BESIDE-SECRET"), "{shown}");
    assert!(!home.dir.path().join("planted").exists());
    assert_eq!(
        std::fs::read_to_string(&record).unwrap(),
        home.project.display().to_string()
    );
    // The runner's records are not in the command's view of the root.
    assert!(!shown.lines().any(|l| l == ".projects"), "{shown}");
    // What the session made is the project owner's.
    let owner = std::fs::metadata(&home.project).unwrap().uid();
    for made in ["inside.txt", "sub", "sub/f"] {
        assert_eq!(
            std::fs::metadata(home.project.join(made)).unwrap().uid(),
            owner,
            "{made}"
        );
    }
    if sandbox.switches_identity() {
        assert_eq!(uid, OWNER.to_string(), "{shown}");
        // The file tools write as the owner too.
        run(
            &ws,
            &sandbox,
            "write_file",
            json!({"path": "tools/written.txt", "content": "by the tool"}),
        )
        .await;
        assert_eq!(
            std::fs::metadata(home.project.join("tools/written.txt"))
                .unwrap()
                .uid(),
            OWNER
        );
    }
    // The file tools refuse `..` and links out of the project.
    std::os::unix::fs::symlink("..", home.project.join("up")).unwrap();
    for (tool, args) in [
        (
            "write_file",
            json!({"path": "../escape.txt", "content": "x"}),
        ),
        (
            "write_file",
            json!({"path": "up/escape.txt", "content": "x"}),
        ),
        ("read_file", json!({"path": "up/beside.txt"})),
    ] {
        match attempt(&ws, &sandbox, tool, &args).await {
            Err(e) => assert!(!e.to_string().contains("BESIDE-SECRET")),
            Ok(o) => panic!("{tool} {args} was not refused: {}", o.output),
        }
    }
    assert!(!home.dir.path().join("escape.txt").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_swapped_in_while_writing_never_leads_out_of_the_project() {
    let Some((_root, sandbox, home, ws)) = confined_project() else {
        return;
    };
    // A command swaps `d` between a directory and a link to the parent
    // as fast as it can while the file tool writes into `d` again and
    // again.
    let swapper = {
        let (ws, sandbox) = (ws.clone(), sandbox.clone());
        tokio::spawn(async move {
            bash(
                &ws,
                &sandbox,
                "end=$((SECONDS+3)); while [ $SECONDS -lt $end ]; do \
                 rm -rf d; mkdir d; rm -rf d; ln -s .. d; done 2>/dev/null; echo swapped",
            )
            .await
        })
    };
    let started = Instant::now();
    let mut written = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let out = attempt(
            &ws,
            &sandbox,
            "write_file",
            &json!({"path": "d/race.txt", "content": "raced"}),
        )
        .await;
        // Refused (a link on the way) or failed (the directory was gone):
        // either way nothing is written.
        if out.is_ok_and(|o| !o.is_error) {
            written += 1;
        }
    }
    let swapped = swapper.await.unwrap();
    assert!(swapped.output.contains("swapped"), "{}", swapped.output);
    assert!(
        !home.dir.path().join("race.txt").exists(),
        "a write went out of the project ({written} writes landed inside)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn changing_calls_of_two_sessions_on_one_directory_take_turns() {
    let root = workspace_root();
    let home = Home::new();
    // The runner's own tools, unconfined: the lock is the runner's, not
    // the sandbox's.
    let sandbox = Sandbox::unconfined();
    let places = home.places(root.path(), &sandbox);
    places.open_project("alpha", &home.project).unwrap();
    places.open_project("beta", &home.project).unwrap();
    let service = ToolRunnerService::new(root.path().to_path_buf(), limits(), "r1".into())
        .with_places(places);
    let call = |session: &str, tool: &str, args: serde_json::Value| {
        let service = service.clone();
        let request = pb::ExecuteRequest {
            call_id: format!("{session}-{tool}"),
            session_id: session.to_string(),
            tool: tool.to_string(),
            arguments_json: args.to_string(),
            timeout_ms: 0,
            network: false,
            resume: None,
        };
        async move {
            let started = Instant::now();
            let mut stream = service
                .execute(tonic::Request::new(request))
                .await
                .unwrap()
                .into_inner();
            let mut text = String::new();
            let mut finished = None;
            while let Some(message) = stream.next().await {
                match message.unwrap().kind.unwrap() {
                    pb::execute_response::Kind::Chunk(c) => text.push_str(&c.text),
                    pb::execute_response::Kind::Result(r) => {
                        text.push_str(&r.output);
                        finished = Some(started.elapsed());
                    }
                }
            }
            (text, finished.unwrap())
        }
    };
    let first = tokio::spawn(call(
        "alpha",
        "bash",
        json!({"command": "echo start >> order; sleep 1.5; echo alpha >> order"}),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A read-only call does not wait.
    let (listed, took) = call("beta", "list_dir", json!({"path": "."})).await;
    assert!(listed.contains("order"), "{listed}");
    assert!(took < Duration::from_millis(900), "{took:?}");
    // A changing call waits for alpha's, and says so.
    let (second, _) = call("beta", "bash", json!({"command": "echo beta >> order"})).await;
    assert!(second.contains("[waiting for session alpha"), "{second}");
    let (first, _) = first.await.unwrap();
    assert!(!first.contains("waiting"), "{first}");
    assert_eq!(
        std::fs::read_to_string(home.project.join("order")).unwrap(),
        "start\nalpha\nbeta\n"
    );
}
