//! Putting a workspace back to a snapshot. The confined thread (the
//! session) changes the workspace; the runner's side only opens the
//! snapshot's stored files and hands them over.

use super::walk::{self, Found, FoundKind, Known, WalkOptions};
use super::{EntryKind, Name, Snapshots, hex};
use crate::ToolError;
use crate::errors::SnapshotError;
use crate::workspace::Workspace;
use agentry_sandbox::ThreadConfinement;
use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::mpsc::SyncSender;

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    pub written: u64,
    pub deleted: u64,
    pub unchanged: u64,
    pub bytes_written: u64,
    pub left_alone: u64,
}

/// A stored file asked for by the confined thread, and where to answer.
type Request = (String, SyncSender<std::io::Result<OwnedFd>>);

impl Snapshots {
    /// Makes `workspace` match snapshot `id`. Blocking.
    pub fn restore(
        &self,
        workspace: &Workspace,
        confinement: &ThreadConfinement,
        id: &str,
    ) -> Result<Restored, ToolError> {
        let _lock = self.lock(false)?;
        let manifest = self.manifest(id)?;
        // Every stored file must be there before anything changes.
        for entry in &manifest.entries {
            if let EntryKind::File { hash, size, .. } = &entry.kind {
                let stored = std::fs::metadata(self.object_path(hash)).map(|m| m.len());
                if stored.as_ref().ok() != Some(size) {
                    return Err(ToolError::Io(format!(
                        "snapshot {id} is damaged: the content of {} is {} in the store",
                        entry.path.shown(),
                        if stored.is_ok() {
                            "truncated"
                        } else {
                            "missing"
                        }
                    )));
                }
            }
        }
        let known = self.known(workspace.session_id());
        let (requests_tx, requests) = std::sync::mpsc::sync_channel::<Request>(1);
        let root = workspace.root().to_path_buf();
        let skip_ignored = self.limits.skips_ignored(workspace);
        let confinement = confinement.clone();
        let target: BTreeMap<Name, EntryKind> = manifest
            .entries
            .into_iter()
            .map(|e| (e.path, e.kind))
            .collect();
        let worker = std::thread::spawn(move || {
            agentry_sandbox::run_confined(&confinement, move || {
                let root = walk::open_beneath_root(&root)?;
                apply(&root, &target, &known, skip_ignored, &requests_tx)
            })
        });
        // Serve the stored files the worker asks for until it is done.
        for (hash, reply) in requests.iter() {
            let path = self.object_path(&hash);
            let opened = std::fs::File::open(&path).map(OwnedFd::from);
            let _ = reply.send(opened);
        }
        let restored = worker
            .join()
            .map_err(|_| ToolError::Io("snapshots: the restore panicked".into()))?
            .map_err(|e| ToolError::Io(format!("snapshots: cannot confine the restore: {e}")))?
            .map_err(|e| {
                ToolError::Io(format!(
                    "cannot restore snapshot {id}: {e}; the workspace may be partly restored: \
                     restoring again finishes the job"
                ))
            })?;
        self.add_ref(workspace.session_id(), id, None)?;
        // What was just written is read again by the next snapshot.
        let _ = std::fs::remove_file(self.index_path(workspace.session_id()));
        Ok(restored)
    }
}

/// Whether what is at a path can stay as the snapshot's entry (possibly
/// with a new mode): the same kind, and for files the same content.
fn same_kind(found: &Found, entry: &EntryKind) -> bool {
    matches!(
        (&found.kind, entry),
        (FoundKind::Dir, EntryKind::Dir { .. })
            | (FoundKind::File, EntryKind::File { .. })
            | (FoundKind::Link(_), EntryKind::Link { .. })
            | (_, EntryKind::Skipped { .. })
    )
}

/// What the workspace holds now, by path.
fn present(
    root: &OwnedFd,
    known: &HashMap<Name, Known>,
    skip_ignored: bool,
) -> Result<BTreeMap<Name, Found>, SnapshotError> {
    let mut current: BTreeMap<Name, Found> = BTreeMap::new();
    let options = WalkOptions {
        open_files: false,
        known,
        max_file_bytes: u64::MAX,
        max_entries: u64::MAX,
        skip_ignored,
    };
    walk::walk(root, &options, |found| {
        current.insert(found.path.clone(), found);
        true
    })?;
    Ok(current)
}

/// The workspace's side: removes what the snapshot does not hold, then
/// writes what differs.
fn apply(
    root: &OwnedFd,
    target: &BTreeMap<Name, EntryKind>,
    known: &HashMap<Name, Known>,
    skip_ignored: bool,
    requests: &SyncSender<Request>,
) -> Result<Restored, SnapshotError> {
    let mut done = Restored::default();
    let current = present(root, known, skip_ignored)?;
    let mut parents = Parents::default();
    // Directories made writable to empty them, and the mode they had.
    let mut opened: Vec<(Vec<u8>, u32)> = Vec::new();
    // Deepest first, so a directory is empty when it goes.
    for (path, found) in current.iter().rev() {
        if target
            .get(path)
            .is_some_and(|entry| same_kind(found, entry))
        {
            continue;
        }
        let (parent, name) = path.split();
        let dir = parents.open(root, parent)?;
        let flags = if found.kind == FoundKind::Dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        let mut removed = rustix::fs::unlinkat(dir, name, flags);
        if removed == Err(rustix::io::Errno::ACCESS) {
            // A read-only directory (a tool's cache, say): writable while
            // it is emptied, its mode given back at the end.
            let mode = rustix::fs::fstat(dir)
                .map(|st| st.st_mode & 0o7777)
                .map_err(|e| format!("cannot look at the directory of {}: {e}", path.shown()))?;
            rustix::fs::fchmod(dir, Mode::from_bits_truncate(mode | 0o700))
                .map_err(|e| format!("cannot open the directory of {}: {e}", path.shown()))?;
            opened.push((parent.to_vec(), mode));
            removed = rustix::fs::unlinkat(dir, name, flags);
        }
        match removed {
            Ok(()) | Err(rustix::io::Errno::NOENT) => done.deleted += 1,
            Err(e) => {
                return Err(SnapshotError(format!(
                    "cannot remove {}: {e}",
                    path.shown()
                )));
            }
        }
    }
    // Directories are made writable while they are filled, and get their
    // own mode at the end (deepest first).
    let mut modes = Vec::new();
    for (path, entry) in target {
        let (parent, name) = path.split();
        let now = current.get(path).filter(|found| same_kind(found, entry));
        match entry {
            EntryKind::Skipped { .. } => done.left_alone += 1,
            EntryKind::Dir { mode } => {
                let dir = parents.open(root, parent)?;
                match now {
                    Some(_) => done.unchanged += 1,
                    None => {
                        rustix::fs::mkdirat(dir, name, Mode::from_bits_truncate(0o700))
                            .map_err(|e| format!("cannot create {}: {e}", path.shown()))?;
                        done.written += 1;
                    }
                }
                let reopened = opened.iter().any(|(p, _)| p == &path.0);
                if now.is_none_or(|found| found.mode != *mode) || mode & 0o700 != 0o700 || reopened
                {
                    chmod_beneath(dir, name, Mode::from_bits_truncate(0o700))
                        .map_err(|e| format!("cannot change {}: {e}", path.shown()))?;
                    modes.push((path.clone(), *mode));
                }
            }
            EntryKind::Link { target: to } => {
                if let Some(Found {
                    kind: FoundKind::Link(current_to),
                    ..
                }) = now
                    && current_to == to
                {
                    done.unchanged += 1;
                    continue;
                }
                let dir = parents.open(root, parent)?;
                let temp = temp_name(name);
                rustix::fs::symlinkat(to.0.as_slice(), dir, temp.as_slice())
                    .map_err(|e| format!("cannot create {}: {e}", path.shown()))?;
                rustix::fs::renameat(dir, temp.as_slice(), dir, name)
                    .map_err(|e| format!("cannot create {}: {e}", path.shown()))?;
                done.written += 1;
            }
            EntryKind::File {
                mode,
                size,
                mtime_ns,
                hash,
            } => {
                let dir = parents.open(root, parent)?;
                let mode = Mode::from_bits_truncate(mode & 0o1777);
                if let Some(found) = now
                    && found.size == *size
                    && content_hash(dir, name, found, known)? == *hash
                {
                    if found.mode != mode.bits() {
                        chmod_beneath(dir, name, mode)
                            .map_err(|e| format!("cannot change {}: {e}", path.shown()))?;
                    }
                    done.unchanged += 1;
                    continue;
                }
                let (reply_tx, reply) = std::sync::mpsc::sync_channel(1);
                requests
                    .send((hash.clone(), reply_tx))
                    .map_err(|_| "the runner stopped serving stored files".to_string())?;
                let source = reply
                    .recv()
                    .map_err(|_| "the runner stopped serving stored files".to_string())?
                    .map_err(|e| {
                        format!("cannot open the stored content of {}: {e}", path.shown())
                    })?;
                write_file(dir, name, source, mode, *mtime_ns)
                    .map_err(|e| format!("cannot write {}: {e}", path.shown()))?;
                done.written += 1;
                done.bytes_written += size;
            }
        }
    }
    for (path, mode) in modes.into_iter().rev() {
        let (parent, name) = path.split();
        let dir = parents.open(root, parent)?;
        chmod_beneath(dir, name, Mode::from_bits_truncate(mode & 0o1777))
            .map_err(|e| format!("cannot change {}: {e}", path.shown()))?;
    }
    // The workspace itself, if it was opened to be emptied.
    if let Some((_, mode)) = opened.iter().find(|(p, _)| p.is_empty()) {
        rustix::fs::fchmod(root, Mode::from_bits_truncate(*mode))
            .map_err(|e| format!("cannot change the workspace's mode: {e}"))?;
    }
    Ok(done)
}

/// The hash of the file `name` in `dir`, which the walk `found`: what is
/// known of it when its metadata is unchanged, else read.
fn content_hash(
    dir: &OwnedFd,
    name: &[u8],
    found: &Found,
    known: &HashMap<Name, Known>,
) -> Result<String, SnapshotError> {
    let path = &found.path;
    if let Some(k) = known.get(path).filter(|k| k.matches(found)) {
        return Ok(k.hash.clone());
    }
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot read {}: {e}", path.shown()))?;
    let mut hasher = Sha256::new();
    let mut file = std::fs::File::from(fd);
    let mut buffer = vec![0u8; 256 * 1024];
    loop {
        match std::io::Read::read(&mut file, &mut buffer) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(SnapshotError(format!("cannot read {}: {e}", path.shown()))),
        }
    }
    Ok(hex(&hasher.finalize()))
}

/// Changes the mode of `name` in `dir` without following a link there:
/// through a descriptor opened with O_NOFOLLOW, or, for an entry that
/// cannot be opened (mode 000), after checking it is no link.
fn chmod_beneath(dir: &OwnedFd, name: &[u8], mode: Mode) -> std::io::Result<()> {
    match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(rustix::fs::fchmod(&fd, mode)?),
        Err(rustix::io::Errno::ACCESS) => {
            let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
            if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink {
                return Err(std::io::Error::other("it became a symbolic link"));
            }
            Ok(rustix::fs::chmodat(dir, name, mode, AtFlags::empty())?)
        }
        Err(e) => Err(e.into()),
    }
}

/// A name for a file being written next to `name`.
fn temp_name(name: &[u8]) -> Vec<u8> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut temp = b".".to_vec();
    temp.extend_from_slice(&name[..name.len().min(100)]);
    temp.extend_from_slice(
        format!(
            ".agentry-restore-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        )
        .as_bytes(),
    );
    temp
}

/// Writes `source` as `name` in `dir`: a new file beside it, renamed over
/// it when complete.
fn write_file(
    dir: &OwnedFd,
    name: &[u8],
    source: OwnedFd,
    mode: Mode,
    mtime_ns: i64,
) -> std::io::Result<()> {
    let temp = temp_name(name);
    let out = rustix::fs::openat(
        dir,
        temp.as_slice(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )?;
    let result = (|| {
        let mut out = std::fs::File::from(out);
        std::io::copy(&mut std::fs::File::from(source), &mut out)?;
        rustix::fs::fchmod(&out, mode)?;
        let time = Timespec {
            tv_sec: mtime_ns.div_euclid(1_000_000_000),
            tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as _,
        };
        rustix::fs::futimens(
            &out,
            &Timestamps {
                last_access: time,
                last_modification: time,
            },
        )?;
        rustix::fs::renameat(dir, temp.as_slice(), dir, name)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(dir, temp.as_slice(), AtFlags::empty());
    }
    result
}

/// The directory last opened, kept while siblings are written.
#[derive(Default)]
struct Parents {
    last: Option<(Vec<u8>, OwnedFd)>,
}

impl Parents {
    fn open(&mut self, root: &OwnedFd, parent: &[u8]) -> Result<&OwnedFd, SnapshotError> {
        if let Some((path, _)) = &self.last
            && path != parent
        {
            self.last = None;
        }
        let last = match self.last.take() {
            Some(last) => last,
            None => {
                let fd = walk::open_beneath(root, parent, OFlags::RDONLY | OFlags::DIRECTORY)
                    .map_err(|e| {
                        format!(
                            "cannot open directory {:?}: {e}",
                            String::from_utf8_lossy(parent)
                        )
                    })?;
                (parent.to_vec(), fd)
            }
        };
        Ok(&self.last.insert(last).1)
    }
}
