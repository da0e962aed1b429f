//! Walking a workspace as its session: every step is an `openat2` beneath
//! the workspace that refuses symbolic links, so a directory swapped for a
//! link while the walk runs leads nowhere else. Run on a confined thread
//! (the session's identity and Landlock domain).

use super::Name;
use crate::errors::SnapshotError;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// What a walk found at one path.
#[derive(Debug)]
pub struct Found {
    /// Relative to the workspace, components joined by '/'.
    pub path: Name,
    pub kind: FoundKind,
    /// Permission bits.
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub ino: u64,
    /// The file, opened for reading, when its content is needed.
    pub fd: Option<OwnedFd>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FoundKind {
    Dir,
    File,
    /// A symbolic link and its target.
    Link(Name),
    /// Something that is not recorded, and why.
    Other(&'static str),
}

/// What a walk remembers of a file it hashed before: if the file's
/// metadata is unchanged, its content is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Known {
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub ino: u64,
    pub hash: String,
}

impl Known {
    /// Whether `found` is the file this was taken from, unchanged.
    pub fn matches(&self, found: &Found) -> bool {
        self.size == found.size
            && self.mtime_ns == found.mtime_ns
            && self.ctime_ns == found.ctime_ns
            && self.ino == found.ino
    }
}

/// How a walk goes.
pub struct WalkOptions<'a> {
    /// Files whose content is needed are opened unless `known` vouches
    /// for them.
    pub open_files: bool,
    pub known: &'a HashMap<Name, Known>,
    /// Larger files are reported as `Other`.
    pub max_file_bytes: u64,
    /// More entries than this fail the walk.
    pub max_entries: u64,
    /// Leave out `.git` and what `.gitignore` files (and
    /// `.git/info/exclude`) ignore, as if they were not there (a
    /// project's build output, its repository's internals).
    pub skip_ignored: bool,
}

/// The ignore rules in force in a directory: its ancestors' and its own,
/// nearest last.
type Rules = std::rc::Rc<Vec<ignore::gitignore::Gitignore>>;

/// Largest ignore file read.
const MAX_IGNORE_FILE: u64 = 1024 * 1024;

/// `rules` with those of the file `file` (beneath `root`) added, for the
/// directory `dir` (relative): unchanged when there is no such file.
fn with_rules(root: &OwnedFd, dir: &[u8], file: &[u8], rules: &Rules) -> Rules {
    use std::io::Read;
    let Ok(fd) = open_beneath(root, &join(dir, file), OFlags::RDONLY | OFlags::NONBLOCK) else {
        return rules.clone();
    };
    let mut text = String::new();
    if std::fs::File::from(fd)
        .take(MAX_IGNORE_FILE)
        .read_to_string(&mut text)
        .is_err()
    {
        return rules.clone();
    }
    let mut builder = ignore::gitignore::GitignoreBuilder::new(virtual_path(dir));
    for line in text.lines() {
        // A line git would refuse is one rule less, not a failed walk.
        let _ = builder.add_line(None, line);
    }
    match builder.build() {
        Ok(set) if !set.is_empty() => {
            let mut more = (**rules).clone();
            more.push(set);
            std::rc::Rc::new(more)
        }
        _ => rules.clone(),
    }
}

/// A relative path as an absolute one under `/`, so rules and paths share
/// one root whatever the workspace's real place.
fn virtual_path(rel: &[u8]) -> std::path::PathBuf {
    Path::new("/").join(std::ffi::OsStr::from_bytes_compat(rel))
}

/// Whether the nearest rule that speaks of `path` ignores it.
fn ignored(rules: &Rules, path: &[u8], is_dir: bool) -> bool {
    let path = virtual_path(path);
    for set in rules.iter().rev() {
        match set.matched(&path, is_dir) {
            ignore::Match::Ignore(_) => return true,
            ignore::Match::Whitelist(_) => return false,
            ignore::Match::None => {}
        }
    }
    false
}

/// Opens `rel` (empty: the workspace itself) beneath `root`, refusing any
/// symbolic link on the way.
pub fn open_beneath(root: &impl AsFd, rel: &[u8], flags: OFlags) -> std::io::Result<OwnedFd> {
    let rel: &Path = if rel.is_empty() {
        Path::new(".")
    } else {
        Path::new(std::ffi::OsStr::from_bytes_compat(rel))
    };
    Ok(rustix::fs::openat2(
        root,
        rel,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// Opens the workspace directory itself (not through a link).
pub fn open_beneath_root(root: &Path) -> Result<OwnedFd, SnapshotError> {
    rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| SnapshotError(format!("cannot open the workspace {}: {e}", root.display())))
}

/// `OsStr` from bytes (Unix paths are bytes).
trait FromBytesCompat {
    fn from_bytes_compat(bytes: &[u8]) -> &Self;
}

impl FromBytesCompat for std::ffi::OsStr {
    fn from_bytes_compat(bytes: &[u8]) -> &Self {
        std::os::unix::ffi::OsStrExt::from_bytes(bytes)
    }
}

fn join(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(prefix.len() + 1 + name.len());
    path.extend_from_slice(prefix);
    if !prefix.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

fn nanos(secs: i64, nsec: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nsec)
}

/// Walks the workspace `root` (an open directory), giving each entry to
/// `found` (which returns false to stop). Directories come before what
/// they hold.
pub fn walk(
    root: &OwnedFd,
    options: &WalkOptions<'_>,
    mut found: impl FnMut(Found) -> bool,
) -> Result<(), SnapshotError> {
    let mut top: Rules = Rules::default();
    if options.skip_ignored {
        top = with_rules(root, b"", b".git/info/exclude", &top);
    }
    let mut pending: Vec<(Vec<u8>, Rules)> = vec![(Vec::new(), top)];
    let mut entries = 0u64;
    while let Some((dir_path, rules)) = pending.pop() {
        let rules = if options.skip_ignored {
            with_rules(root, &dir_path, b".gitignore", &rules)
        } else {
            rules
        };
        let shown = || String::from_utf8_lossy(&dir_path).into_owned();
        let dir = open_beneath(root, &dir_path, OFlags::RDONLY | OFlags::DIRECTORY)
            .map_err(|e| format!("cannot open directory {:?}: {e}", shown()))?;
        let mut names: Vec<Vec<u8>> = Vec::new();
        let mut reader = rustix::fs::Dir::read_from(&dir)
            .map_err(|e| format!("cannot list directory {:?}: {e}", shown()))?;
        while let Some(entry) = reader.read() {
            let entry = entry.map_err(|e| format!("cannot list directory {:?}: {e}", shown()))?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." && !(options.skip_ignored && name == b".git") {
                names.push(name.to_vec());
            }
        }
        names.sort();
        let mut subdirs = Vec::new();
        for name in names {
            entries += 1;
            if entries > options.max_entries {
                return Err(SnapshotError(format!(
                    "the workspace holds more than {} entries (tool_runner.snapshots.max_entries)",
                    options.max_entries
                )));
            }
            let path = join(&dir_path, &name);
            let stat = match rustix::fs::statat(
                &dir,
                name.as_slice(),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            ) {
                Ok(stat) => stat,
                // Removed while we walk: it is simply not there.
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => {
                    return Err(SnapshotError(format!(
                        "cannot look at {:?}: {e}",
                        String::from_utf8_lossy(&path)
                    )));
                }
            };
            let mut item = Found {
                path: Name(path.clone()),
                kind: FoundKind::Other("special file"),
                mode: stat.st_mode & 0o7777,
                size: stat.st_size as u64,
                mtime_ns: nanos(stat.st_mtime, stat.st_mtime_nsec as i64),
                ctime_ns: nanos(stat.st_ctime, stat.st_ctime_nsec as i64),
                ino: stat.st_ino,
                fd: None,
            };
            let file_type = FileType::from_raw_mode(stat.st_mode);
            if options.skip_ignored && ignored(&rules, &path, file_type == FileType::Directory) {
                continue;
            }
            match file_type {
                FileType::Directory => {
                    item.kind = FoundKind::Dir;
                    item.size = 0;
                    subdirs.push(path);
                }
                FileType::Symlink => {
                    match rustix::fs::readlinkat(&dir, name.as_slice(), Vec::new()) {
                        Ok(target) => item.kind = FoundKind::Link(Name(target.into_bytes())),
                        Err(rustix::io::Errno::NOENT) => continue,
                        Err(e) => {
                            return Err(SnapshotError(format!(
                                "cannot read link {:?}: {e}",
                                String::from_utf8_lossy(&path)
                            )));
                        }
                    }
                }
                FileType::RegularFile if item.size > options.max_file_bytes => {
                    item.kind = FoundKind::Other("larger than tool_runner.snapshots.max_file_mib");
                }
                FileType::RegularFile => {
                    item.kind = FoundKind::File;
                    let vouched = options
                        .known
                        .get(&item.path)
                        .is_some_and(|known| known.matches(&item));
                    if options.open_files && !vouched {
                        match open_file(&dir, &name, &item) {
                            Ok(Some((fd, stat))) => {
                                // What is read is what the file is now.
                                item.size = stat.st_size as u64;
                                item.mtime_ns = nanos(stat.st_mtime, stat.st_mtime_nsec as i64);
                                item.ctime_ns = nanos(stat.st_ctime, stat.st_ctime_nsec as i64);
                                item.fd = Some(fd);
                            }
                            // Replaced or removed meanwhile: gone.
                            Ok(None) => continue,
                            Err(e) => {
                                return Err(SnapshotError(format!(
                                    "cannot read {:?}: {e}",
                                    String::from_utf8_lossy(&path)
                                )));
                            }
                        }
                    }
                }
                _ => {}
            }
            if !found(item) {
                return Ok(());
            }
        }
        // Depth first, in name order.
        pending.extend(subdirs.into_iter().rev().map(|d| (d, rules.clone())));
    }
    Ok(())
}

/// Opens a regular file for reading without following a link or blocking
/// on a FIFO swapped in; `None` when it is no longer the file `item` saw.
fn open_file(
    dir: &OwnedFd,
    name: &[u8],
    item: &Found,
) -> std::io::Result<Option<(OwnedFd, rustix::fs::Stat)>> {
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::LOOP) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let stat = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile || stat.st_ino != item.ino {
        return Ok(None);
    }
    Ok(Some((fd, stat)))
}
