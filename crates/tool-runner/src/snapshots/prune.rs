//! Retention: which snapshots go, then the stored files only they held.

use super::{EntryKind, Snapshots, is_hash};
use crate::ToolError;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// What to prune.
#[derive(Debug, Clone, Default)]
pub struct PruneOptions {
    /// Every session that exists: the snapshots of any other go. `None`:
    /// unknown, nothing goes for that reason.
    pub sessions: Option<HashSet<String>>,
    /// Count, remove nothing.
    pub dry_run: bool,
}

/// What pruning did (or, dry, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    pub snapshots_removed: u64,
    pub snapshots_kept: u64,
    pub sessions_removed: u64,
    pub objects_removed: u64,
    pub bytes_freed: u64,
    pub bytes_kept: u64,
    /// The sessions whose snapshots went for not being listed.
    pub unlisted_sessions: Vec<String>,
}

/// One session's reference to a snapshot.
#[derive(Debug, Clone)]
struct Ref {
    session: String,
    id: String,
    time: SystemTime,
    /// The session's most recent one: kept past its age.
    latest: bool,
}

/// Temp files older than this are left-overs of a crash.
const STALE_TEMP: Duration = Duration::from_secs(3600);

fn entries(dir: &Path) -> Vec<std::fs::DirEntry> {
    std::fs::read_dir(dir)
        .map(|r| r.filter_map(Result::ok).collect())
        .unwrap_or_default()
}

fn name_of(entry: &std::fs::DirEntry) -> String {
    entry.file_name().to_string_lossy().into_owned()
}

impl Snapshots {
    /// Removes snapshots past retention, then unreferenced manifests and
    /// stored files. Blocking; waits for snapshots being taken.
    pub fn prune(&self, options: &PruneOptions) -> Result<Pruned, ToolError> {
        let _lock = self.lock(true)?;
        let now = SystemTime::now();
        let mut pruned = Pruned::default();
        let remove = |path: &Path| {
            if !options.dry_run {
                let _ = std::fs::remove_file(path);
            }
        };
        // The references, by session; sessions that no longer exist go.
        let refs = self.references(options, now, &mut pruned);
        // Past their age (each session keeps its latest).
        let keep = self.limits.keep;
        let old = |r: &Ref| !r.latest && now.duration_since(r.time).unwrap_or_default() > keep;
        let (expired, mut kept): (Vec<Ref>, Vec<Ref>) = refs.into_iter().partition(old);
        for r in &expired {
            remove(&self.dir.join("refs").join(&r.session).join(&r.id));
        }
        pruned.snapshots_removed += expired.len() as u64;
        // What the rest hold: object -> (size, how many kept refs hold it).
        let manifests = self.held_objects(&kept);
        let mut holders: HashMap<String, usize> = HashMap::new();
        for r in &kept {
            *holders.entry(r.id.clone()).or_default() += 1;
        }
        let mut objects: HashMap<String, (u64, usize)> = HashMap::new();
        for (id, held) in &manifests {
            if holders.get(id).copied().unwrap_or(0) == 0 {
                continue;
            }
            for (hash, size) in held {
                objects.entry(hash.clone()).or_insert((*size, 0)).1 += 1;
            }
        }
        let mut total: u64 = objects.values().map(|(size, _)| size).sum();
        // Over the size limit: the oldest go first, sessions' latest last.
        let limit = self.limits.max_total_bytes;
        if limit > 0 && total > limit {
            kept.sort_by_key(|r| (r.latest, r.time));
            let mut index = 0;
            while total > limit && index < kept.len() {
                let r = &kept[index];
                index += 1;
                remove(&self.dir.join("refs").join(&r.session).join(&r.id));
                pruned.snapshots_removed += 1;
                let holders_left = holders.get_mut(&r.id).map(|n| {
                    *n -= 1;
                    *n
                });
                if holders_left == Some(0) {
                    for (hash, _) in manifests.get(&r.id).into_iter().flatten() {
                        if let Some((size, count)) = objects.get_mut(hash) {
                            *count -= 1;
                            if *count == 0 {
                                total -= *size;
                            }
                        }
                    }
                }
            }
            kept.drain(..index);
        }
        pruned.snapshots_kept = kept.len() as u64;
        let live_manifests: HashSet<&str> = kept.iter().map(|r| r.id.as_str()).collect();
        objects.retain(|_, (_, count)| *count > 0);
        pruned.bytes_kept = objects.values().map(|(size, _)| size).sum();
        // Sweep what nothing holds.
        for fan in entries(&self.dir.join("manifests")) {
            for file in entries(&fan.path()) {
                let id = format!("{}{}", name_of(&fan), name_of(&file));
                if !live_manifests.contains(id.as_str()) {
                    remove(&file.path());
                }
            }
        }
        for fan in entries(&self.dir.join("objects")) {
            for file in entries(&fan.path()) {
                let hash = format!("{}{}", name_of(&fan), name_of(&file));
                if !objects.contains_key(&hash) {
                    pruned.objects_removed += 1;
                    pruned.bytes_freed += file.metadata().map(|m| m.len()).unwrap_or(0);
                    remove(&file.path());
                }
            }
        }
        if pruned.objects_removed > 0 && !options.dry_run {
            // Indexes vouch for stored content: forget them all.
            for index in entries(&self.dir.join("index")) {
                let _ = std::fs::remove_file(index.path());
            }
        }
        for temp in entries(&self.dir.join("tmp")) {
            let stale = temp
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > STALE_TEMP);
            if stale {
                remove(&temp.path());
            }
        }
        if !options.dry_run {
            for session in entries(&self.dir.join("refs")) {
                let _ = std::fs::remove_dir(session.path()); // only when empty
            }
            self.counted(super::objects_size(&self.dir.join("objects")));
        }
        Ok(pruned)
    }

    /// Every session's snapshot references, its latest marked; a session
    /// not in `options.sessions` (and not made just now) goes, with them.
    fn references(&self, options: &PruneOptions, now: SystemTime, pruned: &mut Pruned) -> Vec<Ref> {
        let mut refs: Vec<Ref> = Vec::new();
        for session in entries(&self.dir.join("refs")) {
            let name = name_of(&session);
            // A session made after the list was taken is not left out.
            let young = session
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).unwrap_or_default() < STALE_TEMP);
            let listed = young || options.sessions.as_ref().is_none_or(|s| s.contains(&name));
            let mut mine: Vec<Ref> = entries(&session.path())
                .into_iter()
                .filter(|e| is_hash(&name_of(e)))
                .map(|e| Ref {
                    session: name.clone(),
                    id: name_of(&e),
                    time: e
                        .metadata()
                        .and_then(|m| m.modified())
                        .unwrap_or(SystemTime::UNIX_EPOCH),
                    latest: false,
                })
                .collect();
            if !listed {
                pruned.sessions_removed += 1;
                pruned.unlisted_sessions.push(name.clone());
                pruned.snapshots_removed += mine.len() as u64;
                if !options.dry_run {
                    let _ = std::fs::remove_dir_all(session.path());
                    let _ = std::fs::remove_file(self.index_path(&name));
                }
                continue;
            }
            if let Some(latest) = mine.iter_mut().max_by_key(|r| r.time) {
                latest.latest = true;
            }
            refs.extend(mine);
        }
        refs
    }

    /// The files (hash and size) each kept snapshot holds, by snapshot.
    fn held_objects(&self, kept: &[Ref]) -> HashMap<String, Vec<(String, u64)>> {
        let mut manifests: HashMap<String, Vec<(String, u64)>> = HashMap::new();
        for r in kept {
            if manifests.contains_key(&r.id) {
                continue;
            }
            let objects = match self.manifest(&r.id) {
                Ok(m) => m
                    .entries
                    .into_iter()
                    .filter_map(|e| match e.kind {
                        EntryKind::File { hash, size, .. } => Some((hash, size)),
                        _ => None,
                    })
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
                Err(e) => {
                    tracing::warn!(snapshot = %r.id, error = %e, "a snapshot cannot be read; its files are not kept for it");
                    Vec::new()
                }
            };
            manifests.insert(r.id.clone(), objects);
        }
        manifests
    }
}
