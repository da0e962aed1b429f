//! Workspaces: snapshots and projects.

use super::tools::execute_ok;
use super::*;

/// Workspace snapshots of a 10,000-file workspace (100 directories of 100
/// small files, written by the session's own shell): the first snapshot
/// (every file stored), again unchanged (nothing read), after 10 files
/// changed, and a restore after 1,000 files were deleted.
pub async fn snapshots(bin: &Path) -> anyhow::Result<Value> {
    use agentry_proto::tools::v1::{RestoreSnapshotRequest, SnapshotRequest};
    const RUNS: usize = 5;
    let stack = Stack::start_only(bin, "http://127.0.0.1:9/v1", &["tool-runner"]).await?;
    let mut runner = ToolRunnerClient::new(stack.as_service("tool-runner").await?);
    let shell = |command: &str| json!({"command": command, "timeout_secs": 300});
    execute_ok(
        &mut runner,
        0,
        "bash",
        shell(
            "for d in $(seq -w 0 99); do mkdir -p d$d; for f in $(seq -w 0 99); do \
             echo \"file $d/$f: some content of a small source file\" > d$d/f$f.txt; done; done",
        ),
    )
    .await?;
    let request = SnapshotRequest {
        session_id: "bench-shell".into(),
    };
    println!("\n== snapshots: a workspace of 10,000 files in 100 directories");
    let started = Instant::now();
    let first = runner.snapshot(request.clone()).await?.into_inner();
    let first_ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(first.files == 10_000, "{} files recorded", first.files);
    let mut unchanged = Vec::new();
    for _ in 0..RUNS {
        let started = Instant::now();
        let again = runner.snapshot(request.clone()).await?.into_inner();
        unchanged.push(started.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            again.snapshot_id == first.snapshot_id,
            "an unchanged workspace gave another snapshot"
        );
    }
    let mut changed = Vec::new();
    let mut new_bytes = 0;
    for run in 0..RUNS {
        execute_ok(
            &mut runner,
            run + 1,
            "bash",
            shell(&format!(
                "for d in $(seq 0 9); do echo run {run} >> d0$d/f00.txt; done"
            )),
        )
        .await?;
        let started = Instant::now();
        let taken = runner.snapshot(request.clone()).await?.into_inner();
        changed.push(started.elapsed().as_secs_f64() * 1000.0);
        new_bytes = taken.new_bytes;
    }
    execute_ok(&mut runner, 99, "bash", shell("rm -r d0[0-9]")).await?;
    let started = Instant::now();
    let restored = runner
        .restore_snapshot(RestoreSnapshotRequest {
            session_id: "bench-shell".into(),
            snapshot_id: first.snapshot_id.clone(),
        })
        .await?
        .into_inner();
    let restore_ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        restored.written >= 1_000,
        "the restore wrote {} entries",
        restored.written
    );
    let store = stack.data.path().join("workspaces/.snapshots");
    let stored = du(&store);
    let workspace = du(&stack.workspace("bench-shell"));
    let (u50, u99, _) = summary(&mut unchanged);
    let (c50, c99, _) = summary(&mut changed);
    println!(
        "first snapshot:     {first_ms:>8.1} ms  ({} files, {} bytes stored)",
        first.files, first.new_bytes
    );
    println!("unchanged again:    {u50:>8.1} ms p50, {u99:.1} p99");
    println!("10 files changed:   {c50:>8.1} ms p50, {c99:.1} p99 ({new_bytes} new bytes)");
    println!(
        "restore 1,000 deleted files + 10 changed: {restore_ms:.1} ms ({} written, {} unchanged)",
        restored.written, restored.unchanged
    );
    println!(
        "disk: workspace {:.1} MiB, store {:.1} MiB after {} snapshots",
        workspace as f64 / 1_048_576.0,
        stored as f64 / 1_048_576.0,
        RUNS + 1
    );
    Ok(json!({
        "files": first.files,
        "first_ms": first_ms,
        "unchanged_p50_ms": u50, "unchanged_p99_ms": u99,
        "changed_p50_ms": c50, "changed_p99_ms": c99,
        "restore_ms": restore_ms, "restore_written": restored.written,
        "workspace_bytes_on_disk": workspace, "store_bytes_on_disk": stored,
    }))
}

/// Workspace snapshots of a person's project: a repository of 50,000
/// files in 500 directories with a `.git` of 2,000 objects and an ignored
/// 1 GiB build directory (`target/`: 64 files of 16 MiB and 10,000 small
/// ones). The first snapshot, again unchanged, after 10 files changed, and
/// a restore after 1,000 files were deleted; the build directory and `.git`
/// are never read nor touched.
pub async fn project(bin: &Path) -> anyhow::Result<Value> {
    use agentry_proto::tools::v1::{OpenProjectRequest, RestoreSnapshotRequest, SnapshotRequest};
    use std::os::unix::fs::PermissionsExt;
    const RUNS: usize = 5;
    let home = tempfile::tempdir()?;
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755))?;
    let repo = home.path().join("repo");
    println!("\n== project: 50,000 files, .git, and an ignored 1 GiB target/");
    let made = Instant::now();
    for d in 0..500 {
        let dir = repo.join(format!("src/m{d:03}"));
        std::fs::create_dir_all(&dir)?;
        for f in 0..100 {
            std::fs::write(
                dir.join(format!("f{f:02}.rs")),
                format!("// module {d}, file {f}\npub fn f{f}() -> u32 {{ {f} }}\n"),
            )?;
        }
    }
    std::fs::write(repo.join(".gitignore"), "/target\n")?;
    for o in 0..2_000 {
        let dir = repo.join(format!(".git/objects/{:02x}", o % 256));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("{o:038x}")), format!("object {o}"))?;
    }
    let big = vec![7u8; 16 << 20];
    std::fs::create_dir_all(repo.join("target/release/deps"))?;
    for n in 0..64 {
        std::fs::write(repo.join(format!("target/release/deps/lib{n}.rlib")), &big)?;
    }
    for n in 0..10_000 {
        std::fs::write(repo.join(format!("target/release/deps/d{n}.d")), "dep")?;
    }
    if nix::unistd::geteuid().is_root() {
        // Commands and snapshots run as the project's owner, never root.
        let status = std::process::Command::new("chown")
            .args(["-R", "4242:4242", &repo.display().to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "chown failed");
    }
    println!(
        "made the repository in {:.1} s ({:.1} GiB on disk)",
        made.elapsed().as_secs_f64(),
        du(&repo) as f64 / (1u64 << 30) as f64
    );
    let roots = [(
        "AGENTRY_PROJECT_ROOTS".to_string(),
        home.path().display().to_string(),
    )];
    let stack = Stack::start_with(bin, "http://127.0.0.1:9/v1", &["tool-runner"], &roots).await?;
    let mut runner = ToolRunnerClient::new(stack.as_service("tool-runner").await?);
    let session = "bench-project".to_string();
    runner
        .open_project(OpenProjectRequest {
            session_id: session.clone(),
            dir: repo.display().to_string(),
            check_only: false,
        })
        .await?;
    let request = SnapshotRequest {
        session_id: session.clone(),
    };
    let started = Instant::now();
    let first = runner.snapshot(request.clone()).await?.into_inner();
    let first_ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        first.files == 50_001,
        "{} files recorded (50,000 and .gitignore expected)",
        first.files
    );
    let mut unchanged = Vec::new();
    for _ in 0..RUNS {
        let started = Instant::now();
        let again = runner.snapshot(request.clone()).await?.into_inner();
        unchanged.push(started.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            again.snapshot_id == first.snapshot_id,
            "unchanged, yet another snapshot"
        );
    }
    let mut changed = Vec::new();
    for run in 0..RUNS {
        for d in 0..10 {
            let file = repo.join(format!("src/m{d:03}/f00.rs"));
            let mut text = std::fs::read_to_string(&file)?;
            text.push_str(&format!("// run {run}\n"));
            std::fs::write(&file, text)?;
        }
        let started = Instant::now();
        runner.snapshot(request.clone()).await?;
        changed.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    for d in 0..10 {
        std::fs::remove_dir_all(repo.join(format!("src/m{d:03}")))?;
    }
    std::fs::write(repo.join("target/release/deps/d0.d"), "rebuilt")?;
    let started = Instant::now();
    let restored = runner
        .restore_snapshot(RestoreSnapshotRequest {
            session_id: session.clone(),
            snapshot_id: first.snapshot_id.clone(),
        })
        .await?
        .into_inner();
    let restore_ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        std::fs::read_to_string(repo.join("target/release/deps/d0.d"))? == "rebuilt",
        "the restore touched the ignored build directory"
    );
    anyhow::ensure!(
        repo.join("src/m000/f00.rs").exists() && repo.join(".git/objects/00").exists(),
        "the restore did not put the files back, or touched .git"
    );
    let (u50, u99, _) = summary(&mut unchanged);
    let (c50, c99, _) = summary(&mut changed);
    println!(
        "first snapshot:     {first_ms:>8.1} ms  ({} files, {} bytes stored)",
        first.files, first.new_bytes
    );
    println!("unchanged again:    {u50:>8.1} ms p50, {u99:.1} p99");
    println!("10 files changed:   {c50:>8.1} ms p50, {c99:.1} p99");
    println!(
        "restore 1,000 deleted files: {restore_ms:.1} ms ({} written, {} unchanged)",
        restored.written, restored.unchanged
    );
    Ok(json!({
        "files": first.files,
        "first_ms": first_ms,
        "unchanged_p50_ms": u50, "unchanged_p99_ms": u99,
        "changed_p50_ms": c50, "changed_p99_ms": c99,
        "restore_ms": restore_ms, "restore_written": restored.written,
    }))
}

/// Bytes a directory tree takes on disk (allocated blocks).
fn du(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = meta.blocks() * 512;
    if meta.is_dir()
        && let Ok(entries) = std::fs::read_dir(path)
    {
        for entry in entries.flatten() {
            total += du(&entry.path());
        }
    }
    total
}
