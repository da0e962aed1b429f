#![allow(clippy::unwrap_used)]

use super::*;
use std::os::unix::fs::{PermissionsExt, symlink};

fn limits() -> SnapshotLimits {
    SnapshotLimits {
        max_file_bytes: 4 << 20,
        max_entries: 10_000,
        keep: Duration::from_secs(3600),
        max_total_bytes: 0,
        session_bytes: 0,
        include_ignored: false,
    }
}

/// A workspace root, a store and one session's workspace.
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    store: Snapshots,
}

impl Fixture {
    fn new(limits: SnapshotLimits) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("workspaces");
        let store = Snapshots::open(&root.join(".snapshots"), limits).unwrap();
        Fixture {
            _dir: dir,
            root,
            store,
        }
    }

    fn workspace(&self, session: &str) -> Workspace {
        Workspace::open(&self.root, session).unwrap()
    }

    fn confinement(&self, ws: &Workspace) -> ThreadConfinement {
        ThreadConfinement {
            workspace: ws.root().to_path_buf(),
            ids: None,
            landlock: false,
        }
    }

    fn snapshot(&self, ws: &Workspace) -> Taken {
        self.store.snapshot(ws, &self.confinement(ws)).unwrap()
    }

    fn restore(&self, ws: &Workspace, id: &str) -> Restored {
        self.store.restore(ws, &self.confinement(ws), id).unwrap()
    }
}

/// Every path under `dir` with what it is (file content, link target, or
/// a directory and its mode).
fn tree(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in walkdir(dir) {
        let rel = entry
            .strip_prefix(dir)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let meta = std::fs::symlink_metadata(&entry).unwrap();
        let what = if meta.file_type().is_symlink() {
            format!("-> {}", std::fs::read_link(&entry).unwrap().display())
        } else if meta.is_dir() {
            format!("dir {:o}", meta.permissions().mode() & 0o7777)
        } else {
            format!(
                "{:o} {}",
                meta.permissions().mode() & 0o7777,
                String::from_utf8_lossy(&std::fs::read(&entry).unwrap())
            )
        };
        out.push((rel, what));
    }
    out.sort();
    out
}

fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        out.push(path.clone());
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            out.extend(walkdir(&path));
        }
    }
    out
}

#[test]
fn a_restore_puts_back_files_changed_deleted_and_added_since() {
    let f = Fixture::new(limits());
    let ws = f.workspace("s1");
    let root = ws.root().to_path_buf();
    std::fs::create_dir_all(root.join("src/deep")).unwrap();
    std::fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(root.join("src/deep/data.txt"), "data").unwrap();
    std::fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    symlink("src/main.rs", root.join("link")).unwrap();
    let before = tree(&root);
    let taken = f.snapshot(&ws);
    assert_eq!(taken.files, 3);
    assert_eq!(taken.bytes, 13 + 4 + 10);
    assert_eq!(taken.new_bytes, taken.bytes);

    // Everything changes: deleted, edited, replaced by another kind, added.
    std::fs::remove_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("src"), "now a file").unwrap();
    std::fs::write(root.join("run.sh"), "rm -rf /\n").unwrap();
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::remove_file(root.join("link")).unwrap();
    std::fs::create_dir(root.join("link")).unwrap();
    std::fs::create_dir_all(root.join("new/dir")).unwrap();
    std::fs::write(root.join("new/dir/x"), "x").unwrap();
    assert_ne!(tree(&root), before);

    let restored = f.restore(&ws, &taken.id);
    assert_eq!(tree(&root), before);
    assert!(restored.deleted >= 5, "{restored:?}");
    assert!(restored.written >= 5, "{restored:?}");
    // Nothing left behind by the writes.
    assert!(
        !tree(&root)
            .iter()
            .any(|(p, _)| p.contains("agentry-restore"))
    );

    // Restoring again changes nothing; the same files give the same id.
    let again = f.restore(&ws, &taken.id);
    assert_eq!(again.written + again.deleted, 0, "{again:?}");
    assert_eq!(f.snapshot(&ws).id, taken.id);
}

#[test]
fn unchanged_files_are_not_stored_again_and_content_is_shared() {
    let f = Fixture::new(limits());
    let a = f.workspace("a");
    std::fs::write(a.root().join("one"), "same content").unwrap();
    std::fs::write(a.root().join("two"), "same content").unwrap();
    let first = f.snapshot(&a);
    assert_eq!(first.bytes, 24);
    assert_eq!(
        first.new_bytes, 12,
        "two files with one content are stored once"
    );
    std::fs::write(a.root().join("three"), "more").unwrap();
    let second = f.snapshot(&a);
    assert_ne!(second.id, first.id);
    assert_eq!(second.new_bytes, 4);
    // Another session restores a's snapshot: the fork's workspace.
    let b = f.workspace("b");
    std::fs::write(b.root().join("stray"), "not in the snapshot").unwrap();
    f.restore(&b, &first.id);
    assert_eq!(
        tree(b.root()),
        tree(a.root())
            .into_iter()
            .filter(|(p, _)| p != "three")
            .collect::<Vec<_>>()
    );
}

#[test]
fn large_and_special_files_are_skipped_and_left_alone() {
    let f = Fixture::new(SnapshotLimits {
        max_file_bytes: 10,
        ..limits()
    });
    let ws = f.workspace("s");
    std::fs::write(ws.root().join("big"), "0123456789abcdef").unwrap();
    std::fs::write(ws.root().join("small"), "ok").unwrap();
    nix::unistd::mkfifo(&ws.root().join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let taken = f.snapshot(&ws);
    assert_eq!((taken.files, taken.skipped), (1, 2));
    std::fs::write(ws.root().join("big"), "changed since, still big").unwrap();
    std::fs::write(ws.root().join("small"), "changed").unwrap();
    let restored = f.restore(&ws, &taken.id);
    assert_eq!(restored.left_alone, 2);
    assert_eq!(
        std::fs::read_to_string(ws.root().join("small")).unwrap(),
        "ok"
    );
    assert_eq!(
        std::fs::read_to_string(ws.root().join("big")).unwrap(),
        "changed since, still big"
    );
}

#[test]
fn too_many_entries_fail_the_snapshot_with_the_setting_named() {
    let f = Fixture::new(SnapshotLimits {
        max_entries: 3,
        ..limits()
    });
    let ws = f.workspace("s");
    for i in 0..5 {
        std::fs::write(ws.root().join(format!("f{i}")), "x").unwrap();
    }
    let error = f.store.snapshot(&ws, &f.confinement(&ws)).unwrap_err();
    assert!(error.to_string().contains("max_entries"), "{error}");
}

#[test]
fn a_link_pointing_outside_is_recorded_as_a_link_never_followed() {
    let f = Fixture::new(limits());
    let ws = f.workspace("s");
    let outside = f.root.parent().unwrap().join("secret");
    std::fs::write(&outside, "secret").unwrap();
    symlink(&outside, ws.root().join("leak")).unwrap();
    let taken = f.snapshot(&ws);
    assert_eq!(taken.files, 0);
    let manifest = f.store.manifest(&taken.id).unwrap();
    assert!(
        matches!(&manifest.entries[0].kind, EntryKind::Link { target } if target.0 == outside.as_os_str().as_encoded_bytes())
    );
    // The secret's content is nowhere in the store.
    for path in walkdir(f.store.dir()) {
        if path.is_file() {
            assert_ne!(std::fs::read(&path).unwrap(), b"secret");
        }
    }
}

#[test]
fn a_damaged_or_unknown_snapshot_is_refused_before_anything_changes() {
    let f = Fixture::new(limits());
    let ws = f.workspace("s");
    std::fs::write(ws.root().join("a"), "a").unwrap();
    let taken = f.snapshot(&ws);
    std::fs::write(ws.root().join("b"), "b").unwrap();
    let unknown = "0".repeat(64);
    let error = f
        .store
        .restore(&ws, &f.confinement(&ws), &unknown)
        .unwrap_err();
    assert!(error.to_string().contains("not in the store"), "{error}");
    let error = f
        .store
        .restore(&ws, &f.confinement(&ws), "../../etc")
        .unwrap_err();
    assert!(error.to_string().contains("not a snapshot id"), "{error}");
    // Lose the content of `a`.
    for path in walkdir(&f.store.dir().join("objects")) {
        if path.is_file() {
            std::fs::remove_file(path).unwrap();
        }
    }
    let error = f
        .store
        .restore(&ws, &f.confinement(&ws), &taken.id)
        .unwrap_err();
    assert!(error.to_string().contains("missing"), "{error}");
    assert!(ws.root().join("b").exists(), "nothing was changed");
}

#[test]
fn names_that_are_not_utf8_survive_a_round_trip() {
    use std::os::unix::ffi::OsStrExt;
    let f = Fixture::new(limits());
    let ws = f.workspace("s");
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9");
    std::fs::write(ws.root().join(name), "latin-1").unwrap();
    let taken = f.snapshot(&ws);
    std::fs::remove_file(ws.root().join(name)).unwrap();
    f.restore(&ws, &taken.id);
    assert_eq!(std::fs::read(ws.root().join(name)).unwrap(), b"latin-1");
}

#[test]
fn pruning_keeps_the_latest_per_session_and_frees_what_only_old_ones_held() {
    let f = Fixture::new(SnapshotLimits {
        keep: Duration::from_secs(0),
        ..limits()
    });
    let ws = f.workspace("s");
    std::fs::write(ws.root().join("f"), "old content").unwrap();
    let old = f.snapshot(&ws);
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(ws.root().join("f"), "new content!").unwrap();
    let new = f.snapshot(&ws);
    let gone = f.workspace("gone");
    std::fs::write(gone.root().join("g"), "of a deleted session").unwrap();
    f.snapshot(&gone);
    // Sessions made in the last hour are never taken for deleted ones.
    let refs = std::fs::File::open(f.store.dir().join("refs/gone")).unwrap();
    refs.set_modified(std::time::SystemTime::now() - Duration::from_secs(7200))
        .unwrap();

    let dry = f
        .store
        .prune(&PruneOptions {
            sessions: Some(["s".to_string()].into()),
            dry_run: true,
        })
        .unwrap();
    assert!(
        f.store.manifest(&old.id).is_ok(),
        "a dry run removes nothing"
    );
    let pruned = f
        .store
        .prune(&PruneOptions {
            sessions: Some(["s".to_string()].into()),
            dry_run: false,
        })
        .unwrap();
    assert_eq!(pruned, dry);
    assert_eq!(pruned.sessions_removed, 1);
    assert_eq!(pruned.snapshots_removed, 2);
    assert_eq!(pruned.snapshots_kept, 1);
    assert_eq!(pruned.objects_removed, 2);
    assert_eq!(pruned.bytes_freed, 11 + 20);
    assert_eq!(pruned.bytes_kept, 12);
    assert!(f.store.manifest(&old.id).is_err());
    // The latest still restores.
    std::fs::write(ws.root().join("f"), "changed").unwrap();
    f.restore(&ws, &new.id);
    assert_eq!(
        std::fs::read_to_string(ws.root().join("f")).unwrap(),
        "new content!"
    );
    // And snapshots work after a prune (the index was dropped with the
    // stored files it vouched for).
    std::fs::write(ws.root().join("f"), "old content").unwrap();
    let again = f.snapshot(&ws);
    assert_eq!(again.new_bytes, 11);
}

#[test]
fn pruning_to_a_size_removes_the_oldest_first() {
    let f = Fixture::new(limits());
    let ws = f.workspace("s");
    let mut ids = Vec::new();
    for content in ["aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc"] {
        std::fs::write(ws.root().join("f"), content).unwrap();
        ids.push(f.snapshot(&ws).id);
        std::thread::sleep(Duration::from_millis(20));
    }
    // The limit lowered afterwards (snapshots are refused past it).
    let lowered = Snapshots::open(
        f.store.dir(),
        SnapshotLimits {
            max_total_bytes: 25,
            ..limits()
        },
    )
    .unwrap();
    let pruned = lowered.prune(&PruneOptions::default()).unwrap();
    assert_eq!(pruned.snapshots_removed, 1);
    assert_eq!(pruned.bytes_kept, 20);
    assert!(f.store.manifest(&ids[0]).is_err());
    assert!(f.store.manifest(&ids[2]).is_ok());
}

#[test]
fn a_stored_file_left_short_by_a_crash_is_refused_then_stored_again() {
    let f = Fixture::new(limits());
    let ws = f.workspace("s");
    std::fs::write(ws.root().join("a"), "the whole content").unwrap();
    let taken = f.snapshot(&ws);
    // A crash before the store was flushed: the object is there, short.
    for path in walkdir(&f.store.dir().join("objects")) {
        if path.is_file() {
            std::fs::write(&path, "the wh").unwrap();
        }
    }
    let error = f
        .store
        .restore(&ws, &f.confinement(&ws), &taken.id)
        .unwrap_err();
    assert!(error.to_string().contains("truncated"), "{error}");
    // The index no longer vouches for the file: it is read and stored again.
    let again = f.snapshot(&ws);
    assert_eq!(again.id, taken.id);
    assert_eq!(again.new_bytes, 17);
    std::fs::remove_file(ws.root().join("a")).unwrap();
    f.restore(&ws, &taken.id);
    assert_eq!(
        std::fs::read_to_string(ws.root().join("a")).unwrap(),
        "the whole content"
    );
}

#[test]
fn a_restore_empties_read_only_directories_and_keeps_their_modes() {
    // Meaningful as an ordinary user (`.ci/as-user` runs it so): root
    // ignores the modes.
    let f = Fixture::new(limits());
    let ws = f.workspace("s");
    std::fs::create_dir(ws.root().join("kept")).unwrap();
    std::fs::write(ws.root().join("kept/a"), "a").unwrap();
    std::fs::set_permissions(
        ws.root().join("kept"),
        std::fs::Permissions::from_mode(0o555),
    )
    .unwrap();
    let taken = f.snapshot(&ws);
    // Later: a read-only tool cache appears, and a file in the kept
    // read-only directory goes... as far as its mode lets the test.
    std::fs::create_dir(ws.root().join("cache")).unwrap();
    std::fs::write(ws.root().join("cache/blob"), "x").unwrap();
    std::fs::set_permissions(
        ws.root().join("cache"),
        std::fs::Permissions::from_mode(0o555),
    )
    .unwrap();
    std::fs::set_permissions(
        ws.root().join("kept"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(ws.root().join("kept/extra"), "extra").unwrap();
    std::fs::set_permissions(
        ws.root().join("kept"),
        std::fs::Permissions::from_mode(0o555),
    )
    .unwrap();
    f.restore(&ws, &taken.id);
    assert!(!ws.root().join("cache").exists());
    assert!(!ws.root().join("kept/extra").exists());
    assert_eq!(
        std::fs::read_to_string(ws.root().join("kept/a")).unwrap(),
        "a"
    );
    let mode = std::fs::metadata(ws.root().join("kept"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o555);
    // Let the temporary directory go.
    std::fs::set_permissions(
        ws.root().join("kept"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
}

/// The bytes of the store's objects on disk.
fn stored(f: &Fixture) -> u64 {
    objects_size(&f.store.dir().join("objects"))
}

#[test]
fn a_session_s_snapshots_are_held_to_its_share() {
    let f = Fixture::new(SnapshotLimits {
        session_bytes: 15,
        ..limits()
    });
    let ws = f.workspace("s");
    std::fs::write(ws.root().join("f"), "aaaaaaaaaa").unwrap();
    f.snapshot(&ws);
    // The same content again costs nothing.
    std::fs::write(ws.root().join("g"), "aaaaaaaaaa").unwrap();
    f.snapshot(&ws);
    std::fs::write(ws.root().join("f"), "bbbbbbbbbb").unwrap();
    let refused = f
        .store
        .snapshot(&ws, &f.confinement(&ws))
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("snapshot refused") && refused.contains("workspace_mib"),
        "{refused}"
    );
    assert_eq!(stored(&f), 10, "nothing past the share was written");
    // Another session has a share of its own.
    let other = f.workspace("t");
    std::fs::write(other.root().join("f"), "cccccccccc").unwrap();
    f.snapshot(&other);
    assert_eq!(stored(&f), 20);
    // Once the session's older snapshots are pruned, its share is free again.
    let lowered = Snapshots::open(
        f.store.dir(),
        SnapshotLimits {
            keep: Duration::ZERO,
            session_bytes: 15,
            ..limits()
        },
    )
    .unwrap();
    std::fs::write(ws.root().join("f"), "dddddddddd").unwrap();
    std::fs::remove_file(ws.root().join("g")).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    lowered.prune(&PruneOptions::default()).unwrap();
    let kept_charge = lowered.charged("s");
    assert!(kept_charge <= 10, "{kept_charge}");
}

#[test]
fn the_store_s_total_is_enforced_before_writing() {
    let f = Fixture::new(SnapshotLimits {
        max_total_bytes: 15,
        ..limits()
    });
    let ws = f.workspace("s");
    std::fs::write(ws.root().join("f"), "aaaaaaaaaa").unwrap();
    f.snapshot(&ws);
    let other = f.workspace("t");
    std::fs::write(other.root().join("f"), "bbbbbbbbbb").unwrap();
    let refused = f
        .store
        .snapshot(&other, &f.confinement(&other))
        .unwrap_err()
        .to_string();
    assert!(refused.contains("max_total_mib"), "{refused}");
    assert_eq!(stored(&f), 10);
}

#[test]
fn a_large_file_past_the_share_is_never_written() {
    let f = Fixture::new(SnapshotLimits {
        session_bytes: 3 << 19,
        ..limits()
    });
    let ws = f.workspace("s");
    // Streamed through a temporary file (larger than what is hashed in
    // memory): refused before the bytes past the share are written.
    std::fs::write(ws.root().join("big"), vec![7u8; 2 << 20]).unwrap();
    let refused = f
        .store
        .snapshot(&ws, &f.confinement(&ws))
        .unwrap_err()
        .to_string();
    assert!(refused.contains("workspace_mib"), "{refused}");
    assert_eq!(stored(&f), 0);
    let temps = std::fs::read_dir(f.store.dir().join("tmp"))
        .unwrap()
        .count();
    assert_eq!(temps, 0, "a temporary file was left");
}

/// A project directory (under the fixture's temp dir) for session `s1`.
fn project(f: &Fixture) -> Workspace {
    let dir = f.root.parent().unwrap().join("project");
    std::fs::create_dir_all(&dir).unwrap();
    let dir = dir.canonicalize().unwrap();
    Workspace::open_project(&f.root, "s1", dir, None).unwrap()
}

#[test]
fn a_project_snapshot_leaves_out_git_and_what_gitignore_ignores() {
    let f = Fixture::new(limits());
    let ws = project(&f);
    let root = ws.root().to_path_buf();
    for dir in [".git/objects", "target/debug", "src/gen", "node_modules/x"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::write(
        root.join(".gitignore"),
        "/target\nnode_modules/\n*.log\n!keep.log\n",
    )
    .unwrap();
    std::fs::write(root.join("src/.gitignore"), "gen/\n").unwrap();
    std::fs::write(root.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(root.join(".git/objects/ab"), "object").unwrap();
    std::fs::write(root.join("target/debug/app"), "binary").unwrap();
    std::fs::write(root.join("node_modules/x/index.js"), "js").unwrap();
    std::fs::write(root.join("src/gen/out.rs"), "generated").unwrap();
    std::fs::write(root.join("src/lib.rs"), "pub fn one() {}\n").unwrap();
    std::fs::write(root.join("debug.log"), "noise").unwrap();
    std::fs::write(root.join("keep.log"), "kept").unwrap();
    let taken = f.snapshot(&ws);
    // .gitignore, src/.gitignore, src/lib.rs, keep.log.
    assert_eq!(taken.files, 4, "{taken:?}");

    // The project changes: a tracked file is edited, one is added, and
    // the build writes; the repository moves on.
    std::fs::write(root.join("src/lib.rs"), "pub fn two() {}\n").unwrap();
    std::fs::write(root.join("src/new.rs"), "new").unwrap();
    std::fs::write(root.join("target/debug/app"), "rebuilt").unwrap();
    std::fs::write(root.join("target/debug/more"), "more").unwrap();
    std::fs::write(root.join(".git/objects/cd"), "newer object").unwrap();
    std::fs::write(root.join("debug.log"), "more noise").unwrap();
    let restored = f.restore(&ws, &taken.id);
    assert_eq!(
        std::fs::read_to_string(root.join("src/lib.rs")).unwrap(),
        "pub fn one() {}\n"
    );
    assert!(!root.join("src/new.rs").exists());
    assert_eq!(restored.deleted, 1, "{restored:?}");
    // What is ignored, and the repository, are as the project left them.
    assert_eq!(
        std::fs::read_to_string(root.join("target/debug/app")).unwrap(),
        "rebuilt"
    );
    assert!(root.join("target/debug/more").exists());
    assert!(root.join(".git/objects/cd").exists());
    assert!(root.join(".git/objects/ab").exists());
    assert_eq!(
        std::fs::read_to_string(root.join("debug.log")).unwrap(),
        "more noise"
    );
    assert!(root.join("node_modules/x/index.js").exists());
    assert!(root.join("src/gen/out.rs").exists());
}

#[test]
fn include_ignored_records_a_whole_project() {
    let f = Fixture::new(SnapshotLimits {
        include_ignored: true,
        ..limits()
    });
    let ws = project(&f);
    let root = ws.root().to_path_buf();
    std::fs::create_dir_all(root.join(".git")).unwrap();
    std::fs::create_dir_all(root.join("target")).unwrap();
    std::fs::write(root.join(".gitignore"), "target/\n").unwrap();
    std::fs::write(root.join(".git/HEAD"), "ref").unwrap();
    std::fs::write(root.join("target/app"), "binary").unwrap();
    assert_eq!(f.snapshot(&ws).files, 3);
}

#[test]
fn a_scratch_workspace_records_ignored_files() {
    let f = Fixture::new(limits());
    let ws = f.workspace("s1");
    let root = ws.root().to_path_buf();
    std::fs::create_dir_all(root.join("target")).unwrap();
    std::fs::write(root.join(".gitignore"), "target/\n").unwrap();
    std::fs::write(root.join("target/app"), "binary").unwrap();
    assert_eq!(f.snapshot(&ws).files, 2);
}
