//! The file tools cannot be raced: while calls run, a directory on their
//! path is swapped, as fast as the kernel allows, with symbolic links to a
//! directory outside the workspace that anyone may read and write. Not one
//! byte may be read from it or written to it.

use agentry_proto::tools::v1 as tpb;
use agentry_proto::tools::v1::tool_runner_client::ToolRunnerClient;
use agentry_testkit::Cluster;
use agentry_testkit::cluster::{Channel, connect_as};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SESSION: &str = "racer";
const SECRET: &str = "OUTSIDE-SECRET";
const MARKER: &str = "outside-marker.txt";
const RACE: Duration = Duration::from_secs(10);

/// Runs one tool call on the runner; the final result.
async fn call(
    runner: &mut ToolRunnerClient<Channel>,
    tool: &str,
    args: serde_json::Value,
) -> tpb::ExecuteResult {
    let mut stream = runner
        .execute(tpb::ExecuteRequest {
            call_id: format!("race-{tool}"),
            session_id: SESSION.into(),
            tool: tool.into(),
            arguments_json: args.to_string(),
            timeout_ms: 0,
            network: false,
            resume: None,
        })
        .await
        .unwrap()
        .into_inner();
    while let Some(message) = stream.message().await.unwrap() {
        if let Some(tpb::execute_response::Kind::Result(result)) = message.kind {
            return result;
        }
    }
    panic!("{tool}: the stream ended without a result");
}

/// Swaps `dir` with each link in turn (one atomic exchange each), until
/// told to stop; returns how many swaps it made.
fn swap_until(stop: &AtomicBool, dir: &Path, links: &[PathBuf]) -> u64 {
    let mut swaps = 0;
    while !stop.load(Ordering::Relaxed) {
        for link in links {
            // Twice: the link takes the directory's name, then gives it back.
            for _ in 0..2 {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    dir,
                    rustix::fs::CWD,
                    link,
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps += 1;
            }
        }
    }
    swaps
}

/// What a directory holds: names, contents, owners, modes and times.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>, u32, u32, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = e.path().symlink_metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap_or_default(),
                meta.uid(),
                meta.mode(),
                meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
                meta.ctime_nsec() + meta.ctime() * 1_000_000_000,
            )
        })
        .collect();
    entries.sort();
    entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn swapping_a_directory_for_a_link_outside_reads_and_writes_nothing_there() {
    let cluster = Cluster::start().await.unwrap();
    let workspace = cluster.workspace_root().join(SESSION);
    race(&cluster, &workspace).await;
}

/// The same race in a person's project directory (a session that opened
/// it), which lies outside the workspace root: nothing outside the project
/// is read or written, and nothing is made beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_a_project_directory_the_race_reads_and_writes_nothing_outside() {
    let home = tempfile::Builder::new()
        .prefix("agentry-race-home-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(home.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let project = home.path().join("project");
    std::fs::create_dir(&project).unwrap();
    if rustix::process::geteuid().is_root() {
        // Commands and file tools then run as the project's owner.
        std::os::unix::fs::chown(&project, Some(4343), Some(4343)).unwrap();
    }
    let roots = vec![home.path().display().to_string()];
    let cluster = Cluster::start_with(move |c| c.tool_runner.project_roots = roots)
        .await
        .unwrap();
    let channel = connect_as(&cluster.auth, &cluster.config.tool_runner.url)
        .await
        .unwrap();
    let opened = ToolRunnerClient::new(channel)
        .open_project(tpb::OpenProjectRequest {
            session_id: SESSION.into(),
            dir: project.display().to_string(),
            check_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    let project = project.canonicalize().unwrap();
    assert_eq!(opened.dir, project.display().to_string());
    race(&cluster, &project).await;
    assert_eq!(
        std::fs::read_dir(home.path()).unwrap().count(),
        1,
        "something was made beside the project"
    );
}

/// Runs the file tools of session [`SESSION`] (working in `workspace`)
/// while a directory on their path is swapped with links outside.
async fn race(cluster: &Cluster, workspace: &Path) {
    let channel = connect_as(&cluster.auth, &cluster.config.tool_runner.url)
        .await
        .unwrap();
    let mut runner = ToolRunnerClient::new(channel.clone());

    // The workspace, made by the runner, with d/f.txt in it.
    let made = call(
        &mut runner,
        "write_file",
        json!({"path": "d/f.txt", "content": "inside\n"}),
    )
    .await;
    assert!(!made.is_error, "{made:?}");
    let dir = workspace.join("d");

    // Outside: a directory everyone may enter and write, files everyone may
    // read and write, so only the confinement of the file tools stands in
    // the way (not file modes).
    let outside_root = tempfile::Builder::new()
        .prefix("agentry-race-")
        .tempdir_in("/tmp")
        .unwrap();
    let outside = outside_root.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    for (name, content) in [
        ("f.txt", format!("inside {SECRET}\n")),
        (MARKER, format!("{SECRET}\n")),
    ] {
        std::fs::write(outside.join(name), content).unwrap();
        std::fs::set_permissions(outside.join(name), PermissionsExt::from_mode(0o666)).unwrap();
    }
    for d in [outside_root.path(), outside.as_path()] {
        std::fs::set_permissions(d, PermissionsExt::from_mode(0o777)).unwrap();
    }
    let before = snapshot(&outside);

    // Two links: absolute, and relative through `..`.
    let absolute = workspace.join("link-absolute");
    std::os::unix::fs::symlink(&outside, &absolute).unwrap();
    let depth = workspace.components().count() - 1;
    let relative_target =
        PathBuf::from("../".repeat(depth)).join(outside.strip_prefix("/").unwrap());
    let relative = workspace.join("link-relative");
    std::os::unix::fs::symlink(&relative_target, &relative).unwrap();
    assert_eq!(
        std::fs::read_to_string(relative.join("f.txt")).unwrap(),
        format!("inside {SECRET}\n"),
        "the relative link leads outside"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let (dir, links) = (dir.clone(), vec![absolute.clone(), relative.clone()]);
        std::thread::spawn(move || swap_until(&stop, &dir, &links))
    };

    let ok_calls = Arc::new(AtomicU64::new(0));
    let refused_calls = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + RACE;
    let mut workers = Vec::new();
    for worker in 0..4u32 {
        let mut runner = ToolRunnerClient::new(channel.clone());
        let (ok_calls, refused_calls) = (ok_calls.clone(), refused_calls.clone());
        workers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let (tool, args) = match (n + u64::from(worker)) % 7 {
                    0 => ("read_file", json!({"path": "d/f.txt"})),
                    1 => (
                        "write_file",
                        json!({"path": format!("d/w{worker}-{n}.txt"), "content": "written\n"}),
                    ),
                    2 => (
                        "edit_file",
                        json!({"path": "d/f.txt", "old_string": "inside", "new_string": "in-side"}),
                    ),
                    3 => (
                        "edit_file",
                        json!({"path": "d/f.txt", "old_string": "in-side", "new_string": "inside"}),
                    ),
                    4 => ("list_dir", json!({"path": "d"})),
                    5 => ("glob", json!({"pattern": "**/*", "path": "d"})),
                    _ => ("grep", json!({"pattern": "SECRET|side", "path": "."})),
                };
                let result = call(&mut runner, tool, args.clone()).await;
                assert!(
                    !result.output.contains(SECRET) && !result.output.contains(MARKER),
                    "{tool} {args} read outside the workspace: {}",
                    result.output
                );
                if result.is_error {
                    refused_calls.fetch_add(1, Ordering::Relaxed);
                } else {
                    ok_calls.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();

    let (ok, refused) = (
        ok_calls.load(Ordering::Relaxed),
        refused_calls.load(Ordering::Relaxed),
    );
    eprintln!("{swaps} swaps; {ok} calls succeeded, {refused} were refused");
    // The race was run both ways: calls met the directory and the links.
    assert!(swaps > 1000, "only {swaps} swaps");
    assert!(ok > 0 && refused > 0, "{ok} succeeded, {refused} refused");
    assert_eq!(
        snapshot(&outside),
        before,
        "the directory outside the workspace changed"
    );
    assert_eq!(
        std::fs::read_dir(outside_root.path()).unwrap().count(),
        1,
        "something was made next to the outside directory"
    );
}
