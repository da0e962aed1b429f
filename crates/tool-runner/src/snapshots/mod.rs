//! Workspace snapshots: a content-addressed store of the files of every
//! session's workspace, so that a session can be rewound or forked with its
//! files.
//!
//! Layout of the store (private to the runner, out of the sessions' reach):
//! - `objects/ab/cdef…`: file contents, named by their SHA-256, written
//!   once and never changed;
//! - `manifests/ab/cdef…`: one snapshot each (paths, kinds, modes, sizes,
//!   content hashes), named by the SHA-256 of the manifest itself, so an
//!   unchanged workspace gives the same snapshot;
//! - `refs/<session>/<snapshot>`: which sessions took or restored which
//!   snapshot; the file's mtime is when (retention works on these);
//! - `index/<session>.json`: a cache of each file's metadata and hash, so
//!   a file whose size, times and inode did not change is not read again;
//! - `tmp/`: files being written, renamed into place when complete;
//! - `lock`: snapshots and restores share it, pruning takes it alone.
//!
//! The workspace is read and written on a confined thread as the session
//! (its identity, a Landlock domain holding only its workspace, every path
//! opened beneath it without following links); only the store is touched
//! with the runner's own rights. Open files cross between the two threads.

mod prune;
mod restore;
pub mod walk;

use crate::ToolError;
use crate::workspace::Workspace;
use agentry_sandbox::ThreadConfinement;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use walk::{Found, FoundKind, Known, WalkOptions};

pub use prune::{PruneOptions, Pruned};
pub use restore::Restored;

/// A path relative to a workspace (Unix paths are bytes). Stored as a
/// string when it is UTF-8, else as "\0" followed by its bytes in hex.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(pub Vec<u8>);

impl Name {
    /// The path for messages.
    pub fn shown(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }

    /// The parent's path and the last component.
    pub fn split(&self) -> (&[u8], &[u8]) {
        match self.0.iter().rposition(|&b| b == b'/') {
            Some(i) => (&self.0[..i], &self.0[i + 1..]),
            None => (&[], &self.0),
        }
    }
}

impl Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(text) if !text.starts_with('\0') => s.serialize_str(text),
            _ => s.serialize_str(&format!("\0{}", hex(&self.0))),
        }
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.strip_prefix('\0') {
            Some(encoded) => unhex(encoded)
                .map(Name)
                .ok_or_else(|| serde::de::Error::custom("bad hex path")),
            None => Ok(Name(text.into_bytes())),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        text.push_str(&format!("{b:02x}"));
    }
    text
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Whether `id` looks like a snapshot or object id (64 lowercase hex).
fn is_hash(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// One entry of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(rename = "p")]
    pub path: Name,
    #[serde(flatten)]
    pub kind: EntryKind,
}

/// What a snapshot holds at a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub enum EntryKind {
    Dir {
        mode: u32,
    },
    File {
        mode: u32,
        size: u64,
        mtime_ns: i64,
        hash: String,
    },
    Link {
        target: Name,
    },
    /// Not recorded; a restore leaves the path as it is.
    Skipped {
        why: String,
    },
}

/// A snapshot: every entry of a workspace, sorted by path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub entries: Vec<Entry>,
}

/// What taking a snapshot gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub id: String,
    pub files: u64,
    pub bytes: u64,
    pub new_bytes: u64,
    pub skipped: u64,
    pub duration: Duration,
}

/// Limits and retention of the store.
#[derive(Debug, Clone)]
pub struct SnapshotLimits {
    pub max_file_bytes: u64,
    pub max_entries: u64,
    pub keep: Duration,
    /// The whole store, enforced before anything is written (and by the
    /// retention, which removes the oldest first); 0: no limit.
    pub max_total_bytes: u64,
    /// What one session's kept snapshots may have added to the store: its
    /// share, the workspace quota; 0: no limit.
    pub session_bytes: u64,
    /// Record what `.gitignore` ignores, and `.git`, in project
    /// directories too (scratch workspaces always record everything).
    pub include_ignored: bool,
}

impl SnapshotLimits {
    /// Whether walks of `workspace` leave ignored paths out.
    pub fn skips_ignored(&self, workspace: &Workspace) -> bool {
        workspace.is_project() && !self.include_ignored
    }
}

impl SnapshotLimits {
    /// The limits from the configuration; `workspace_mib` is the session's
    /// quota, which its snapshots are charged to.
    pub fn from_config(
        config: &agentry_runtime::config::SnapshotsConfig,
        workspace_mib: u64,
    ) -> Self {
        SnapshotLimits {
            max_file_bytes: config.max_file_mib.saturating_mul(1024 * 1024),
            max_entries: config.max_entries.max(1),
            keep: Duration::from_secs(config.keep_days.saturating_mul(86_400)),
            max_total_bytes: config.max_total_mib.saturating_mul(1024 * 1024),
            session_bytes: workspace_mib.saturating_mul(1024 * 1024),
            include_ignored: config.include_ignored,
        }
    }
}

/// What a snapshot may still add to the store: the session's share and the
/// store's room, both checked before each new object is written.
struct Room {
    session: u64,
    store: u64,
}

impl Room {
    /// Takes `bytes` of room, or says which limit they would pass.
    fn take(&mut self, bytes: u64, limits: &SnapshotLimits) -> Result<(), ToolError> {
        let mib = |b: u64| b.div_ceil(1024 * 1024);
        if bytes > self.session {
            return Err(ToolError::Io(format!(
                "snapshot refused: the session's snapshots would hold more than its {} MiB share \
                 (tool_runner.limits.workspace_mib); its files were not recorded. Remove large \
                 files the session no longer needs, or raise the limit",
                mib(limits.session_bytes)
            )));
        }
        if bytes > self.store {
            return Err(ToolError::Io(format!(
                "snapshot refused: the snapshot store would hold more than {} MiB \
                 (tool_runner.snapshots.max_total_mib); its files were not recorded. Run \
                 `agentry sessions prune`, or raise the limit",
                mib(limits.max_total_bytes)
            )));
        }
        self.session -= bytes;
        self.store -= bytes;
        Ok(())
    }

    /// Gives `bytes` back (an object that was there already).
    fn give(&mut self, bytes: u64) {
        self.session = self.session.saturating_add(bytes);
        self.store = self.store.saturating_add(bytes);
    }
}

/// Contents up to this size are hashed in memory before being written.
const IN_MEMORY: u64 = 1 << 20;

/// The snapshot store.
#[derive(Debug, Clone)]
pub struct Snapshots {
    dir: PathBuf,
    limits: SnapshotLimits,
    /// The bytes of the store's objects, as this runner knows them: counted
    /// when first needed (a store without a total limit is never counted)
    /// and by each retention run, and grown by its own snapshots.
    total: Arc<std::sync::OnceLock<std::sync::atomic::AtomicU64>>,
}

fn io_error(what: &str, path: &Path, e: impl std::fmt::Display) -> ToolError {
    ToolError::Io(format!("snapshots: cannot {what} {}: {e}", path.display()))
}

impl Snapshots {
    /// Opens (creating) the store in `dir`.
    pub fn open(dir: &Path, limits: SnapshotLimits) -> Result<Snapshots, ToolError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        for sub in ["", "objects", "manifests", "refs", "index", "tmp"] {
            let path = dir.join(sub);
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .map_err(|e| io_error("create", &path, e))?;
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io_error("protect", dir, e))?;
        Ok(Snapshots {
            dir: dir.to_path_buf(),
            limits,
            total: Arc::default(),
        })
    }

    /// Adds what a snapshot wrote to the store's size, once it is counted
    /// (counting later reads it from disk).
    fn grown(&self, bytes: u64) {
        if let Some(total) = self.total.get() {
            total.fetch_add(bytes, std::sync::atomic::Ordering::AcqRel);
        }
    }

    /// What this runner knows of the store's size.
    fn total(&self) -> &std::sync::atomic::AtomicU64 {
        self.total.get_or_init(|| {
            std::sync::atomic::AtomicU64::new(objects_size(&self.dir.join("objects")))
        })
    }

    /// The room a snapshot of `session_id` has.
    fn room(&self, session_id: &str) -> Room {
        let unlimited = |limit: u64, used: u64| {
            if limit == 0 {
                u64::MAX
            } else {
                limit.saturating_sub(used)
            }
        };
        let store = match self.limits.max_total_bytes {
            0 => u64::MAX,
            limit => unlimited(
                limit,
                self.total().load(std::sync::atomic::Ordering::Acquire),
            ),
        };
        Room {
            session: unlimited(self.limits.session_bytes, self.charged(session_id)),
            store,
        }
    }

    /// What the kept snapshots of `session_id` added to the store (each
    /// ref holds the bytes its snapshot added).
    fn charged(&self, session_id: &str) -> u64 {
        let Ok(refs) = std::fs::read_dir(self.dir.join("refs").join(session_id)) else {
            return 0;
        };
        refs.flatten()
            .filter_map(|r| std::fs::read_to_string(r.path()).ok())
            .filter_map(|text| text.trim().parse::<u64>().ok())
            .sum()
    }

    /// Sets what this runner knows of the store's size (after a retention
    /// run counted it).
    fn counted(&self, bytes: u64) {
        self.total()
            .store(bytes, std::sync::atomic::Ordering::Release);
    }

    /// Where the store is.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn object_path(&self, hash: &str) -> PathBuf {
        self.dir.join("objects").join(&hash[..2]).join(&hash[2..])
    }

    fn manifest_path(&self, id: &str) -> PathBuf {
        self.dir.join("manifests").join(&id[..2]).join(&id[2..])
    }

    fn index_path(&self, session_id: &str) -> PathBuf {
        self.dir.join("index").join(format!("{session_id}.json"))
    }

    /// Takes the store's lock, shared or alone, until the file is dropped.
    fn lock(&self, exclusive: bool) -> Result<std::fs::File, ToolError> {
        let path = self.dir.join("lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_error("open", &path, e))?;
        let how = if exclusive {
            rustix::fs::FlockOperation::LockExclusive
        } else {
            rustix::fs::FlockOperation::LockShared
        };
        rustix::fs::flock(&file, how).map_err(|e| io_error("lock", &path, e))?;
        Ok(file)
    }

    /// A new file in `tmp/`, created exclusively.
    fn temp_file(&self) -> Result<(PathBuf, std::fs::File), ToolError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = crate::workspace::temp_path_for(&self.dir.join("tmp").join("part"))?;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_error("create", &path, e))?;
        Ok((path, file))
    }

    /// Moves a complete temp file to `to`, unless the same content (by its
    /// name, and whole) is there already.
    fn put(&self, temp: &Path, to: &Path) -> Result<bool, ToolError> {
        let size = std::fs::metadata(temp).map(|m| m.len()).ok();
        if size.is_some() && std::fs::metadata(to).map(|m| m.len()).ok() == size {
            let _ = std::fs::remove_file(temp);
            return Ok(false);
        }
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_error("create", parent, e))?;
        }
        std::fs::rename(temp, to).map_err(|e| io_error("store", to, e))?;
        Ok(true)
    }

    /// Writes `bytes` as a new file at `to` (through `tmp/`).
    fn put_bytes(&self, bytes: &[u8], to: &Path) -> Result<bool, ToolError> {
        if std::fs::metadata(to).is_ok_and(|m| m.len() == bytes.len() as u64) {
            return Ok(false);
        }
        let (temp, mut file) = self.temp_file()?;
        file.write_all(bytes)
            .map_err(|e| io_error("write", &temp, e))?;
        drop(file);
        self.put(&temp, to)
    }

    /// Stores the content read from `fd`: its hash, size, and whether it
    /// was new; `None` when it grew past the size limit while being read.
    fn store_object(
        &self,
        fd: OwnedFd,
        size_hint: u64,
        room: &mut Room,
    ) -> Result<Option<(String, u64, bool)>, ToolError> {
        let mut file = std::fs::File::from(fd);
        let limit = self.limits.max_file_bytes;
        let mut hasher = Sha256::new();
        let read_error =
            |e: std::io::Error| ToolError::Io(format!("snapshots: cannot read a file: {e}"));
        if size_hint <= IN_MEMORY {
            let mut bytes = Vec::with_capacity(size_hint as usize);
            (&mut file)
                .take(limit.saturating_add(1))
                .read_to_end(&mut bytes)
                .map_err(read_error)?;
            if bytes.len() as u64 > limit {
                return Ok(None);
            }
            hasher.update(&bytes);
            let hash = hex(&hasher.finalize());
            let path = self.object_path(&hash);
            if std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64) {
                return Ok(Some((hash, bytes.len() as u64, false)));
            }
            room.take(bytes.len() as u64, &self.limits)?;
            let new = self.put_bytes(&bytes, &path)?;
            if !new {
                room.give(bytes.len() as u64);
            }
            return Ok(Some((hash, bytes.len() as u64, new)));
        }
        let (temp, mut out) = self.temp_file()?;
        let mut size = 0u64;
        let mut buffer = vec![0u8; 256 * 1024];
        let result = loop {
            let n = match file.read(&mut buffer) {
                Ok(0) => break Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(read_error(e)),
            };
            size += n as u64;
            if size > limit {
                break Ok(());
            }
            // Checked before the bytes are written (the object may turn out
            // to be stored already: then the room is given back).
            if let Err(e) = room.take(n as u64, &self.limits) {
                break Err(e);
            }
            hasher.update(&buffer[..n]);
            if let Err(e) = out.write_all(&buffer[..n]) {
                break Err(io_error("write", &temp, e));
            }
        };
        drop(out);
        if result.is_err() || size > limit {
            let _ = std::fs::remove_file(&temp);
            room.give(size.min(limit));
            return result.map(|()| None);
        }
        let hash = hex(&hasher.finalize());
        let new = self.put(&temp, &self.object_path(&hash))?;
        if !new {
            room.give(size);
        }
        Ok(Some((hash, size, new)))
    }

    /// The remembered hashes of a session's files whose content is still
    /// stored.
    fn known(&self, session_id: &str) -> HashMap<Name, Known> {
        let Ok(text) = std::fs::read(self.index_path(session_id)) else {
            return HashMap::new();
        };
        let mut known: HashMap<Name, Known> = serde_json::from_slice(&text).unwrap_or_default();
        // Only what is stored whole vouches for a file (a crash before the
        // store was flushed can leave a stored file short).
        known.retain(|_, k| {
            is_hash(&k.hash)
                && std::fs::metadata(self.object_path(&k.hash)).is_ok_and(|m| m.len() == k.size)
        });
        known
    }

    /// Reads and checks a manifest.
    pub fn manifest(&self, id: &str) -> Result<Manifest, ToolError> {
        if !is_hash(id) {
            return Err(ToolError::InvalidRequest(format!(
                "{id:?} is not a snapshot id (64 hex digits)"
            )));
        }
        let path = self.manifest_path(id);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ToolError::InvalidRequest(format!(
                    "snapshot {id} is not in the store (pruned, or taken on another volume)"
                )));
            }
            Err(e) => return Err(io_error("read", &path, e)),
        };
        if hex(&Sha256::digest(&bytes)) != id {
            return Err(ToolError::Io(format!(
                "snapshot {id} is damaged: its manifest does not match its id"
            )));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ToolError::Io(format!("snapshot {id} is damaged: {e}")))
    }

    /// Marks `id` as taken (or restored) by `session_id` now; a snapshot
    /// taken records the bytes it added (`added`), charged to the session
    /// while the ref is kept.
    fn add_ref(&self, session_id: &str, id: &str, added: Option<u64>) -> Result<(), ToolError> {
        let dir = self.dir.join("refs").join(session_id);
        std::fs::create_dir_all(&dir).map_err(|e| io_error("create", &dir, e))?;
        let path = dir.join(id);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_error("write", &path, e))?;
        if let Some(added) = added.filter(|a| *a > 0) {
            file.write_all(added.to_string().as_bytes())
                .map_err(|e| io_error("write", &path, e))?;
        }
        file.set_modified(std::time::SystemTime::now())
            .map_err(|e| io_error("touch", &path, e))
    }

    /// Flushes everything written to the store's file system.
    fn sync(&self) -> Result<(), ToolError> {
        let dir = std::fs::File::open(&self.dir).map_err(|e| io_error("open", &self.dir, e))?;
        rustix::fs::syncfs(&dir).map_err(|e| io_error("sync", &self.dir, e))
    }

    /// Records `workspace` as a snapshot. Blocking: run it off the async
    /// threads.
    pub fn snapshot(
        &self,
        workspace: &Workspace,
        confinement: &ThreadConfinement,
    ) -> Result<Taken, ToolError> {
        let started = Instant::now();
        let _lock = self.lock(false)?;
        let session_id = workspace.session_id().to_string();
        let known = Arc::new(self.known(&session_id));
        let mut room = self.room(&session_id);
        let (tx, rx) = std::sync::mpsc::sync_channel::<Found>(64);
        let root = workspace.root().to_path_buf();
        let limits = self.limits.clone();
        let skip_ignored = limits.skips_ignored(workspace);
        let walk_known = known.clone();
        let confinement = confinement.clone();
        let walker = std::thread::spawn(move || {
            agentry_sandbox::run_confined(&confinement, move || {
                let root = walk::open_beneath_root(&root)?;
                let options = WalkOptions {
                    open_files: true,
                    known: &walk_known,
                    max_file_bytes: limits.max_file_bytes,
                    max_entries: limits.max_entries,
                    skip_ignored,
                };
                walk::walk(&root, &options, |found| tx.send(found).is_ok())
            })
        });
        let mut entries = Vec::new();
        let mut index: HashMap<Name, Known> = HashMap::new();
        let mut taken = Taken {
            id: String::new(),
            files: 0,
            bytes: 0,
            new_bytes: 0,
            skipped: 0,
            duration: Duration::ZERO,
        };
        let mut failure = None;
        for found in rx.iter() {
            if failure.is_some() {
                continue; // Drain, so the walker ends.
            }
            let kind = match found.kind {
                FoundKind::Dir => EntryKind::Dir { mode: found.mode },
                FoundKind::Link(target) => EntryKind::Link { target },
                FoundKind::Other(why) => {
                    taken.skipped += 1;
                    EntryKind::Skipped {
                        why: why.to_string(),
                    }
                }
                FoundKind::File => {
                    let stored = match found.fd {
                        Some(fd) => match self.store_object(fd, found.size, &mut room) {
                            Ok(stored) => stored,
                            Err(e) => {
                                failure = Some(e);
                                continue;
                            }
                        },
                        None => known
                            .get(&found.path)
                            .map(|k| (k.hash.clone(), k.size, false)),
                    };
                    match stored {
                        Some((hash, size, new)) => {
                            taken.files += 1;
                            taken.bytes += size;
                            if new {
                                taken.new_bytes += size;
                            }
                            index.insert(
                                found.path.clone(),
                                Known {
                                    size,
                                    mtime_ns: found.mtime_ns,
                                    ctime_ns: found.ctime_ns,
                                    ino: found.ino,
                                    hash: hash.clone(),
                                },
                            );
                            EntryKind::File {
                                mode: found.mode,
                                size,
                                mtime_ns: found.mtime_ns,
                                hash,
                            }
                        }
                        None => {
                            taken.skipped += 1;
                            EntryKind::Skipped {
                                why: "larger than tool_runner.snapshots.max_file_mib".into(),
                            }
                        }
                    }
                }
            };
            entries.push(Entry {
                path: found.path,
                kind,
            });
        }
        let walked = walker
            .join()
            .map_err(|_| ToolError::Io("snapshots: the workspace walk panicked".into()))?
            .map_err(|e| ToolError::Io(format!("snapshots: cannot confine the walk: {e}")))?;
        if let Some(failure) = failure {
            // What was stored before it is on disk all the same.
            self.grown(taken.new_bytes);
            return Err(failure);
        }
        walked.map_err(|e| ToolError::Io(format!("snapshots: {e}")))?;
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        let manifest = Manifest {
            version: 1,
            entries,
        };
        let bytes = serde_json::to_vec(&manifest)
            .map_err(|e| ToolError::Io(format!("snapshots: cannot encode a manifest: {e}")))?;
        taken.id = hex(&Sha256::digest(&bytes));
        let new_manifest = self.put_bytes(&bytes, &self.manifest_path(&taken.id))?;
        self.add_ref(&session_id, &taken.id, Some(taken.new_bytes))?;
        self.grown(taken.new_bytes);
        if index != *known {
            self.save_index(&session_id, &index)?;
        }
        // What a recorded event will point at is on disk first.
        if new_manifest || taken.new_bytes > 0 {
            self.sync()?;
        }
        taken.duration = started.elapsed();
        Ok(taken)
    }

    fn save_index(&self, session_id: &str, index: &HashMap<Name, Known>) -> Result<(), ToolError> {
        let bytes = serde_json::to_vec(index)
            .map_err(|e| ToolError::Io(format!("snapshots: cannot encode an index: {e}")))?;
        let (temp, mut file) = self.temp_file()?;
        file.write_all(&bytes)
            .map_err(|e| io_error("write", &temp, e))?;
        drop(file);
        let to = self.index_path(session_id);
        std::fs::rename(&temp, &to).map_err(|e| io_error("write", &to, e))
    }
}

#[cfg(test)]
mod tests;

/// The bytes of the files two levels beneath `objects` (its fan-out).
fn objects_size(objects: &Path) -> u64 {
    let Ok(fans) = std::fs::read_dir(objects) else {
        return 0;
    };
    fans.flatten()
        .filter_map(|fan| std::fs::read_dir(fan.path()).ok())
        .flat_map(|files| files.flatten())
        .filter_map(|file| file.metadata().ok())
        .map(|m| m.len())
        .sum()
}
