//! The file-system view of a call with namespaces: a root that is built,
//! not subtracted. The command's process gets a mount namespace of its own
//! whose root is a fresh tmpfs holding only what commands need:
//!
//! - the read-only directories of the spec (`/usr`, `/etc`, `/opt`, the
//!   library directories, an MCP server's own files…) bound read-only at
//!   their own paths, with the spec's hidden paths inside them covered by
//!   an empty read-only tmpfs (a hidden file by `/dev/null`);
//! - the writable directories (the workspace or project, the session's
//!   temp dir) bound read-write at their own paths;
//! - a private `/tmp` and `/dev/shm`, its own `/proc`, and a `/dev` with
//!   only `null`, `zero`, `full`, `random` and `urandom` (and the usual
//!   `fd`, `stdin`, `stdout`, `stderr` links);
//! - nothing else: no `/sys`, no `/run` or `/var/run`, no home directories,
//!   so no host socket (a database's, D-Bus, Docker's, an ssh agent's) can
//!   even be named.
//!
//! Symbolic links among the listed paths (`/bin -> usr/bin`) are made again
//! as the same links. Directories made to hold a mount point copy the mode
//! of the host's directory at that path, so a path the command could not
//! traverse on the host stays closed.
//!
//! Runs in the child between fork and exec, before Landlock is built (its
//! rules then name paths of this view) and before the identity switch.

use crate::Spec;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Size of the private `/tmp` and `/dev/shm` of a call.
const TMPFS_OPTIONS: &str = "mode=1777,size=1g";

/// The devices a command gets.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom"];

/// Where the new root is assembled before it becomes `/` (a tmpfs mounted
/// over it, in the call's own mount namespace only).
const ASSEMBLY: &str = "/tmp";

/// What is put at one path of the view.
enum Source {
    /// The host's file or directory, bound read-only.
    ReadOnly(OwnedFd),
    /// The host's file or directory, bound read-write.
    ReadWrite(OwnedFd),
    /// A symbolic link with this target.
    Link(PathBuf),
    /// An empty read-only directory over a hidden one.
    HiddenDir,
    /// `/dev/null` over a hidden file.
    HiddenFile(OwnedFd),
    /// A fresh tmpfs with these options (`/tmp`, `/dev/shm`, `/dev`).
    Tmpfs(String),
    /// A fresh procfs.
    Proc,
}

struct Entry {
    path: PathBuf,
    source: Source,
    /// A directory (else a file) is mounted there.
    is_dir: bool,
}

fn err(what: &str, path: &Path, e: impl std::fmt::Display) -> String {
    format!("file-system view: {what} {}: {e}", path.display())
}

/// Opens `path` without following a final symbolic link, for binding
/// later from `/proc/self/fd`.
fn open_path(path: &Path) -> Result<OwnedFd, String> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| err("cannot open", path, e))
}

fn fd_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Whether `path` lies beneath (or is) one of `dirs`.
fn beneath(path: &Path, dirs: &[PathBuf]) -> bool {
    dirs.iter().any(|d| path.starts_with(d))
}

/// Builds the view and makes it the root of a new mount namespace of the
/// calling process. The working directory is `spec.cwd` afterwards.
pub(crate) fn enter(spec: &Spec) -> Result<(), String> {
    if !spec.cwd.is_absolute() {
        return Err(format!(
            "file-system view: the working directory {} is not absolute",
            spec.cwd.display()
        ));
    }
    private_mounts(nix::sched::CloneFlags::empty())?;
    let entries = plan(spec)?;
    // The host's directory modes, read while the host's /tmp is in sight.
    let modes = parent_modes(&entries);
    let root = Path::new(ASSEMBLY);
    mount(
        Some("tmpfs"),
        root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755,size=4m"),
    )
    .map_err(|e| err("cannot mount a tmpfs on", root, e))?;
    let mut read_only_mounts = Vec::new();
    for entry in &entries {
        if place(root, entry, &modes)? {
            read_only_mounts.push(entry.path.clone());
        }
    }
    let old = root.join(".old-root");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&old)
        .map_err(|e| err("cannot make", &old, e))?;
    nix::unistd::pivot_root(root, &old)
        .map_err(|e| format!("file-system view: pivot_root failed: {e}"))?;
    std::env::set_current_dir("/").map_err(|e| format!("file-system view: chdir /: {e}"))?;
    umount2("/.old-root", MntFlags::MNT_DETACH)
        .map_err(|e| format!("file-system view: cannot detach the host's root: {e}"))?;
    std::fs::remove_dir("/.old-root")
        .map_err(|e| format!("file-system view: cannot remove /.old-root: {e}"))?;
    for path in read_only_mounts.iter().rev() {
        remount_read_only(path)?;
    }
    remount_read_only(Path::new("/"))?;
    std::env::set_current_dir(&spec.cwd).map_err(|e| {
        format!(
            "file-system view: the working directory {} is not in the sandbox's view ({e}); \
             it must lie beneath a writable or read-only directory of the call",
            spec.cwd.display()
        )
    })
}

/// A command of a session's sandbox, in the session's built view, run by
/// its supervisor before the command is forked: a mount namespace and an
/// IPC namespace of their own (the supervisor's and the command's), a
/// fresh `/tmp`, `/dev/shm` and HOME (empty, private, its identity's). The
/// command mounts its `/proc` itself ([`proc_of_command`]). The supervisor
/// holds these namespaces, so they are torn down when it exits, after it
/// reported how the command ended, not on the command's way out.
pub(crate) fn refresh(spec: &Spec) -> Result<(), String> {
    private_mounts(nix::sched::CloneFlags::CLONE_NEWIPC)?;
    // What the view holds beneath `/tmp` or `/dev/shm` (a workspace under
    // `/tmp`) is bound again over the fresh ones, and HOME is made anew;
    // the descriptors are opened while the session's mounts are in sight.
    let fresh = [Path::new("/tmp"), Path::new("/dev/shm")];
    let again: Vec<Entry> = plan(spec)?
        .into_iter()
        .filter(|e| {
            Some(&e.path) == spec.home.as_ref()
                || fresh.iter().any(|f| e.path.starts_with(f) && e.path != *f)
        })
        .collect();
    let modes = parent_modes(&again);
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    for path in fresh {
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            nosuid,
            Some(TMPFS_OPTIONS),
        )
        .map_err(|e| err("cannot mount a tmpfs on", path, e))?;
    }
    let root = Path::new("/");
    let mut read_only_mounts = Vec::new();
    for entry in &again {
        if place(root, entry, &modes)? {
            read_only_mounts.push(entry.path.clone());
        }
    }
    for path in read_only_mounts.iter().rev() {
        remount_read_only(path)?;
    }
    Ok(())
}

/// In the command of a session's sandbox, process 1 of its own pid
/// namespace, between fork and exec: a `/proc` of that namespace, and the
/// working directory.
pub(crate) fn proc_of_command(spec: &Spec) -> Result<(), String> {
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| err("cannot mount", Path::new("/proc"), e))?;
    std::env::set_current_dir(&spec.cwd).map_err(|e| {
        format!(
            "file-system view: the working directory {} is not in the session's view ({e})",
            spec.cwd.display()
        )
    })
}

/// A mount namespace of the calling process's own (and the namespaces
/// of `more`), whose mounts are private to it.
fn private_mounts(more: nix::sched::CloneFlags) -> Result<(), String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS | more)
        .map_err(|e| format!("file-system view: cannot unshare mounts: {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("file-system view: cannot make mounts private: {e}"))
}

/// The options of a command's HOME: empty, private, its identity's.
fn home_options(spec: &Spec) -> String {
    match spec.user {
        Some(ids) => format!("mode=0700,size=1g,uid={},gid={}", ids.uid, ids.gid),
        None => "mode=0700,size=1g".to_string(),
    }
}

/// What goes where, parents before children.
fn plan(spec: &Spec) -> Result<Vec<Entry>, String> {
    let mut entries: Vec<Entry> = Vec::new();
    let special = |p: &Path| {
        p == Path::new("/")
            || p.starts_with("/proc")
            || p.starts_with("/dev")
            || p.starts_with("/sys")
    };
    // `/tmp` and `/dev/shm` are always private tmpfs (writable): the
    // host's are never shown, even when named writable.
    let writable: Vec<PathBuf> = spec
        .read_write
        .iter()
        .filter(|p| !special(p) && p.as_path() != Path::new("/tmp"))
        .cloned()
        .collect();
    let mut read_only: Vec<PathBuf> = spec
        .read_only
        .iter()
        .filter(|p| !special(p) && !beneath(p, &spec.hidden) && !beneath(p, &writable))
        .cloned()
        .collect();
    read_only.sort();
    read_only.dedup();
    // A path beneath another read-only path is already in the view.
    let covered: Vec<PathBuf> = read_only.clone();
    read_only.retain(|p| !covered.iter().any(|c| c != p && p.starts_with(c)));
    for path in read_only {
        let Ok(meta) = path.symlink_metadata() else {
            // A listed path that does not exist here is simply not shown.
            continue;
        };
        let source = if meta.file_type().is_symlink() {
            Source::Link(std::fs::read_link(&path).map_err(|e| err("cannot read", &path, e))?)
        } else {
            match open_path(&path) {
                Ok(fd) => Source::ReadOnly(fd),
                // Not reachable by the helper's identity: not shown.
                Err(_) => continue,
            }
        };
        entries.push(Entry {
            is_dir: meta.is_dir(),
            path,
            source,
        });
    }
    for hidden in &spec.hidden {
        let inside_shown = entries
            .iter()
            .any(|e| matches!(e.source, Source::ReadOnly(_)) && hidden.starts_with(&e.path));
        if !inside_shown || hidden.symlink_metadata().is_err() {
            continue;
        }
        let (source, is_dir) = if hidden.is_dir() {
            (Source::HiddenDir, true)
        } else {
            (
                Source::HiddenFile(open_path(Path::new("/dev/null"))?),
                false,
            )
        };
        entries.push(Entry {
            path: hidden.clone(),
            source,
            is_dir,
        });
    }
    let mut rw = writable.clone();
    rw.sort();
    rw.dedup();
    let covered = rw.clone();
    rw.retain(|p| !covered.iter().any(|c| c != p && p.starts_with(c)));
    for path in rw {
        let meta = path
            .metadata()
            .map_err(|e| err("cannot open the writable path", &path, e))?;
        entries.push(Entry {
            source: Source::ReadWrite(open_path(&path)?),
            is_dir: meta.is_dir(),
            path,
        });
    }
    entries.push(Entry {
        path: PathBuf::from("/proc"),
        source: Source::Proc,
        is_dir: true,
    });
    entries.push(Entry {
        path: PathBuf::from("/dev"),
        source: Source::Tmpfs("mode=0755,size=64k".into()),
        is_dir: true,
    });
    for dev in DEVICES {
        let path = Path::new("/dev").join(dev);
        if let Ok(fd) = open_path(&path) {
            entries.push(Entry {
                path,
                source: Source::ReadWrite(fd),
                is_dir: false,
            });
        }
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        entries.push(Entry {
            path: Path::new("/dev").join(name),
            source: Source::Link(PathBuf::from(target)),
            is_dir: false,
        });
    }
    // A session's sandbox mounts each command's HOME here.
    if let Some(home) = &spec.home {
        entries.push(Entry {
            path: home.clone(),
            source: Source::Tmpfs(home_options(spec)),
            is_dir: true,
        });
    }
    for private in ["/dev/shm", "/tmp"] {
        entries.push(Entry {
            path: PathBuf::from(private),
            source: Source::Tmpfs(TMPFS_OPTIONS.into()),
            is_dir: true,
        });
    }
    // Parents first; at equal depth the order above (hidden after shown).
    entries.sort_by_key(|e| e.path.components().count());
    Ok(entries)
}

/// The mode of each host directory above an entry.
fn parent_modes(entries: &[Entry]) -> std::collections::BTreeMap<PathBuf, u32> {
    let mut modes = std::collections::BTreeMap::new();
    for entry in entries {
        for dir in entry.path.ancestors().skip(1) {
            if let Ok(meta) = dir.metadata() {
                modes.insert(dir.to_path_buf(), meta.permissions().mode() & 0o7777);
            }
        }
    }
    modes
}

/// Makes the directories above `path` inside `root`, each with the mode
/// of the host's directory at the same place (0755 where there is none).
fn make_parents(
    root: &Path,
    path: &Path,
    modes: &std::collections::BTreeMap<PathBuf, u32>,
) -> Result<(), String> {
    let mut host = PathBuf::from("/");
    for part in path.parent().into_iter().flat_map(Path::components).skip(1) {
        host.push(part);
        let inside = root.join(host.strip_prefix("/").unwrap_or(&host));
        if inside.symlink_metadata().is_ok() {
            continue;
        }
        let mode = modes.get(&host).copied().unwrap_or(0o755);
        std::fs::DirBuilder::new()
            .mode(mode)
            .create(&inside)
            .map_err(|e| err("cannot make", &inside, e))?;
        // The umask may have taken bits away.
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(mode))
            .map_err(|e| err("cannot set the mode of", &inside, e))?;
    }
    Ok(())
}

/// Puts one entry in place under `root`; returns whether it is to be made
/// read-only once the view is the root.
fn place(
    root: &Path,
    entry: &Entry,
    modes: &std::collections::BTreeMap<PathBuf, u32>,
) -> Result<bool, String> {
    let at = root.join(entry.path.strip_prefix("/").unwrap_or(&entry.path));
    make_parents(root, &entry.path, modes)?;
    if let Source::Link(target) = &entry.source {
        return match std::os::unix::fs::symlink(target, &at) {
            Ok(()) => Ok(false),
            // Something is there already (a bound directory holds it).
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(err("cannot link", &at, e)),
        };
    }
    // The mount point: a directory or an empty file.
    if at.symlink_metadata().is_err() {
        let made = if entry.is_dir {
            std::fs::DirBuilder::new().mode(0o755).create(&at)
        } else {
            std::fs::File::create(&at).map(|_| ())
        };
        made.map_err(|e| err("cannot make the mount point", &at, e))?;
    }
    let bind = |fd: &OwnedFd| {
        mount(
            Some(fd_path(fd).as_str()),
            &at,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| err("cannot bind", &entry.path, e))
    };
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    match &entry.source {
        Source::ReadOnly(fd) => {
            bind(fd)?;
            Ok(true)
        }
        Source::ReadWrite(fd) => {
            bind(fd)?;
            Ok(false)
        }
        Source::HiddenFile(fd) => {
            bind(fd)?;
            Ok(true)
        }
        Source::HiddenDir => {
            mount(
                Some("tmpfs"),
                &at,
                Some("tmpfs"),
                nosuid | MsFlags::MS_NOEXEC,
                Some("mode=0755,size=64k"),
            )
            .map_err(|e| err("cannot hide", &entry.path, e))?;
            Ok(true)
        }
        Source::Tmpfs(options) => {
            mount(
                Some("tmpfs"),
                &at,
                Some("tmpfs"),
                nosuid,
                Some(options.as_str()),
            )
            .map_err(|e| err("cannot mount a tmpfs on", &entry.path, e))?;
            Ok(entry.path == Path::new("/dev"))
        }
        Source::Proc => {
            let fresh = mount(
                Some("proc"),
                &at,
                Some("proc"),
                nosuid | MsFlags::MS_NOEXEC,
                None::<&str>,
            );
            if fresh.is_err() {
                // Some container runtimes refuse a new procfs: the host's,
                // read-only, still guarded by Landlock's ptrace scoping.
                let fd = open_path(Path::new("/proc"))?;
                bind(&fd)?;
                return Ok(true);
            }
            Ok(false)
        }
        Source::Link(_) => Ok(false),
    }
}

/// Remounts the mount at `path` read-only, keeping the flags the kernel
/// will not let a user namespace drop (nosuid, nodev, noexec, atime).
fn remount_read_only(path: &Path) -> Result<(), String> {
    use nix::sys::statvfs::{FsFlags, statvfs};
    let flags = statvfs(path)
        .map_err(|e| err("cannot inspect", path, e))?
        .flags();
    let mut ms = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
    for (fs, m) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if flags.contains(fs) {
            ms |= m;
        }
    }
    mount(None::<&str>, path, None::<&str>, ms, None::<&str>)
        .map_err(|e| err("cannot make read-only", path, e))
}
