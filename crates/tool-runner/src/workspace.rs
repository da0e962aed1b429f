//! Confinement of every path a tool touches to the session's workspace.

use crate::ToolError;
use std::path::{Component, Path, PathBuf};

/// A temporary file name next to `path`, unique per call — also across
/// replicas sharing the volume, which may all run as pid 1 — for writes that
/// create it exclusively and rename it over `path`.
pub fn temp_path_for(path: &Path) -> Result<PathBuf, ToolError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let parent = path.parent().ok_or_else(|| {
        ToolError::InvalidArguments(format!("{} has no parent directory", path.display()))
    })?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    Ok(parent.join(format!(
        ".{name}.agentry-{}-{}-{nanos}.tmp",
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    )))
}

/// A session's workspace directory, and its private temp directory.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    tmp: PathBuf,
    session_id: String,
    project: bool,
    owner: Option<agentry_sandbox::Ids>,
}

/// The directory under the workspace root that holds each session's
/// private temp directory (a name no session id can take).
pub const TEMP_DIRS: &str = ".tmp";

/// Checks a session id: 1-64 letters, digits, '-' or '_'.
pub fn check_session_id(session_id: &str) -> Result<(), ToolError> {
    let valid = !session_id.is_empty()
        && session_id.len() <= 64
        && session_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if valid {
        Ok(())
    } else {
        Err(ToolError::InvalidRequest(format!(
            "invalid session id {session_id:?}: use 1-64 letters, digits, '-' or '_'"
        )))
    }
}

impl Workspace {
    /// Opens (creating if needed) the workspace of `session_id` under `root`.
    pub fn open(root: &Path, session_id: &str) -> Result<Workspace, ToolError> {
        check_session_id(session_id)?;
        let dir = root.join(session_id);
        let (root, tmp) = Self::prepare(root, session_id, Some(&dir))?;
        Ok(Workspace {
            root,
            tmp,
            session_id: session_id.to_string(),
            project: false,
            owner: None,
        })
    }

    /// The workspace of a session working in the project directory `dir`
    /// (canonical, checked by [`crate::projects::Places`]); its temp dir
    /// stays under `root`. `owner`: the ids its commands run as.
    pub(crate) fn open_project(
        root: &Path,
        session_id: &str,
        dir: PathBuf,
        owner: Option<agentry_sandbox::Ids>,
    ) -> Result<Workspace, ToolError> {
        let (_, tmp) = Self::prepare(root, session_id, None)?;
        Ok(Workspace {
            root: dir,
            tmp,
            session_id: session_id.to_string(),
            project: true,
            owner,
        })
    }

    /// Creates (0700) the scratch directory `dir`, if given, and the
    /// session's temp dir; returns both canonical (the temp dir twice
    /// without `dir`).
    fn prepare(
        root: &Path,
        session_id: &str,
        dir: Option<&Path>,
    ) -> Result<(PathBuf, PathBuf), ToolError> {
        let tmp = root.join(TEMP_DIRS).join(session_id);
        for d in dir.into_iter().chain([tmp.as_path()]) {
            if d.is_dir() {
                continue;
            }
            std::fs::create_dir_all(d).map_err(|e| {
                ToolError::Io(format!("cannot create workspace {}: {e}", d.display()))
            })?;
            // Only the session (its owner, once handed over) may enter.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
                ToolError::Io(format!("cannot protect workspace {}: {e}", d.display()))
            })?;
        }
        let canonical = |d: &Path| {
            d.canonicalize()
                .map_err(|e| ToolError::Io(format!("cannot open workspace {}: {e}", d.display())))
        };
        let tmp = canonical(&tmp)?;
        let dir = match dir {
            Some(d) => canonical(d)?,
            None => tmp.clone(),
        };
        Ok((dir, tmp))
    }

    /// Whether this is a person's project directory (not a scratch
    /// workspace the runner made).
    pub fn is_project(&self) -> bool {
        self.project
    }

    /// For a project when commands switch identity: the directory's owner,
    /// whom its commands run as.
    pub fn owner(&self) -> Option<agentry_sandbox::Ids> {
        self.owner
    }

    /// The session's private temp directory (TMPDIR of its commands).
    pub fn tmp(&self) -> &Path {
        &self.tmp
    }

    /// The session this workspace belongs to.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The workspace directory (canonical).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves `path` (relative to the workspace) to a location inside it.
    ///
    /// Refuses empty and absolute paths, any `..` component, and paths whose
    /// existing part leads outside through a symbolic link. The target itself
    /// need not exist.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, ToolError> {
        let refuse = |why: &str| ToolError::PathOutsideWorkspace {
            path: path.to_string(),
            reason: why.to_string(),
        };
        let clean = self.relative(path)?;
        let joined = self.root.join(&clean);
        // Follow symbolic links through the longest part that exists.
        let mut existing = joined.as_path();
        let mut rest = Vec::new();
        loop {
            match existing.symlink_metadata() {
                Ok(_) => break,
                Err(_) => match (existing.parent(), existing.file_name()) {
                    (Some(parent), Some(name)) => {
                        rest.push(name.to_os_string());
                        existing = parent;
                    }
                    _ => return Err(refuse("it has no existing ancestor")),
                },
            }
        }
        let real = existing.canonicalize().map_err(|e| {
            // A dangling symbolic link: we cannot tell where it leads.
            refuse(&format!("it cannot be resolved ({e})"))
        })?;
        if !real.starts_with(&self.root) {
            return Err(refuse("a symbolic link leads outside the workspace"));
        }
        let mut resolved = real;
        for name in rest.into_iter().rev() {
            resolved.push(name);
        }
        Ok(resolved)
    }

    /// Checks `path` lexically: relative, no `..`, no NUL. Returns it clean.
    fn relative(&self, path: &str) -> Result<PathBuf, ToolError> {
        let refuse = |why: &str| ToolError::PathOutsideWorkspace {
            path: path.to_string(),
            reason: why.to_string(),
        };
        if path.trim().is_empty() {
            return Err(ToolError::InvalidArguments("path must not be empty".into()));
        }
        if path.contains('\0') {
            return Err(ToolError::InvalidArguments(
                "path must not contain NUL bytes".into(),
            ));
        }
        let mut clean = PathBuf::new();
        for component in Path::new(path).components() {
            match component {
                Component::Normal(part) => clean.push(part),
                Component::CurDir => {}
                Component::ParentDir => {
                    return Err(refuse(
                        "'..' is not allowed; use a path inside the workspace",
                    ));
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(refuse(
                        "absolute paths are not allowed; use a path relative to the workspace",
                    ));
                }
            }
        }
        Ok(clean)
    }

    /// Opens `rel` (clean, relative) beneath the workspace in one kernel
    /// call: `openat2` with RESOLVE_BENEATH refuses any step that leaves
    /// the workspace (a symbolic link leading out, `/proc` magic links), so
    /// a directory swapped for a link between a check and the open cannot
    /// lead anywhere else.
    fn open_at(
        &self,
        shown: &str,
        rel: &Path,
        flags: rustix::fs::OFlags,
    ) -> Result<std::os::fd::OwnedFd, ToolError> {
        use rustix::fs::{Mode, OFlags, ResolveFlags};
        let root = rustix::fs::open(
            &self.root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ToolError::Io(format!("cannot open the workspace: {e}")))?;
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        rustix::fs::openat2(
            &root,
            rel,
            // openat2 refuses O_PATH with any flag but CLOEXEC, DIRECTORY
            // and NOFOLLOW.
            if flags.contains(OFlags::PATH) {
                flags | OFlags::CLOEXEC
            } else {
                flags | OFlags::CLOEXEC | OFlags::NOCTTY
            },
            // openat2 refuses a mode without O_CREAT.
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| match e {
            rustix::io::Errno::XDEV | rustix::io::Errno::LOOP => ToolError::PathOutsideWorkspace {
                path: shown.to_string(),
                reason: "a symbolic link leads outside the workspace or is absolute \
                         (links inside it must be relative)"
                    .into(),
            },
            rustix::io::Errno::NOENT => {
                ToolError::Io(format!("{shown}: no such file in the workspace"))
            }
            rustix::io::Errno::NOSYS => ToolError::Io(
                "this kernel lacks openat2 (Linux 5.6 or later is needed for file tools)".into(),
            ),
            e => ToolError::Io(format!("{shown}: {e}")),
        })
    }

    /// Opens an existing regular file for reading, beneath the workspace;
    /// returns it with its path for messages.
    pub fn open_read(&self, path: &str) -> Result<(std::fs::File, String), ToolError> {
        use rustix::fs::OFlags;
        let rel = self.relative(path)?;
        let shown = rel.display().to_string();
        // NONBLOCK: opening a FIFO must not hang the call.
        let fd = self.open_at(&shown, &rel, OFlags::RDONLY | OFlags::NONBLOCK)?;
        let file = std::fs::File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| ToolError::Io(format!("{shown}: {e}")))?;
        if meta.is_dir() {
            return Err(ToolError::InvalidArguments(format!(
                "{shown} is a directory, not a file"
            )));
        }
        if !meta.is_file() {
            return Err(ToolError::InvalidArguments(format!(
                "{shown} is not a regular file"
            )));
        }
        Ok((file, shown))
    }

    /// Replaces (or creates) the file `path` with `content`, atomically and
    /// beneath the workspace: missing directories are made one by one,
    /// each opened with RESOLVE_BENEATH; the content goes to a new file in
    /// the opened parent directory, which is then renamed over the name
    /// (replacing a symbolic link there, never writing through it). What
    /// is made belongs to the caller's identity (file tools run as the
    /// session's user); `keep` is an edited file's original metadata, whose
    /// permissions the new file gets, and its owner when the caller may.
    pub fn replace_file(
        &self,
        path: &str,
        content: &[u8],
        keep: Option<&std::fs::Metadata>,
    ) -> Result<String, ToolError> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let mode = keep.map(|m| m.permissions().mode() & 0o7777);
        use rustix::fs::{AtFlags, Mode, OFlags};
        use std::io::Write;
        let rel = self.relative(path)?;
        let shown = rel.display().to_string();
        let name = rel
            .file_name()
            .ok_or_else(|| ToolError::InvalidArguments(format!("{shown} names no file")))?
            .to_os_string();
        // The parent, made beneath the workspace one directory at a time.
        let mut prefix = PathBuf::new();
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
        let mut dir = self.open_at(&shown, &prefix, dir_flags)?;
        for part in rel.parent().into_iter().flat_map(Path::components) {
            let parent = dir;
            prefix.push(part);
            dir = match self.open_at(&shown, &prefix, dir_flags) {
                Ok(fd) => fd,
                Err(ToolError::Io(_))
                    if rustix::fs::statat(&parent, part.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
                        .is_err() =>
                {
                    match rustix::fs::mkdirat(&parent, part.as_os_str(), Mode::from_raw_mode(0o755))
                    {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => {
                            return Err(ToolError::Io(format!(
                                "cannot create the directories of {shown}: {e}"
                            )));
                        }
                    }
                    self.open_at(&shown, &prefix, dir_flags)?
                }
                Err(e) => return Err(e),
            };
        }
        if let Ok(stat) = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW)
            && rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Directory
        {
            return Err(ToolError::InvalidArguments(format!(
                "{shown} is a directory"
            )));
        }
        let tmp = temp_path_for(Path::new("x").join(&name).as_path())?;
        let tmp = tmp.file_name().unwrap_or_default().to_os_string();
        let written = (|| -> Result<(), ToolError> {
            let fd = rustix::fs::openat(
                &dir,
                &tmp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(mode.unwrap_or(0o644)),
            )
            .map_err(|e| ToolError::Io(format!("cannot write {shown}: {e}")))?;
            let mut file = std::fs::File::from(fd);
            let io = |e: std::io::Error| ToolError::Io(format!("cannot write {shown}: {e}"));
            // Through the handle, never a name: no link can redirect it.
            if let Some(meta) = keep
                && (meta.uid(), meta.gid())
                    != (
                        rustix::process::geteuid().as_raw(),
                        rustix::process::getegid().as_raw(),
                    )
                && let Err(e) = std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid()))
            {
                tracing::debug!(path = %shown, error = %e, "an edited file changes owner");
            }
            if let Some(mode) = mode {
                file.set_permissions(std::fs::Permissions::from_mode(mode))
                    .map_err(io)?;
            }
            file.write_all(content).map_err(io)?;
            file.sync_all().map_err(io)?;
            rustix::fs::renameat(&dir, &tmp, &dir, &name)
                .map_err(|e| ToolError::Io(format!("cannot write {shown}: {e}")))?;
            Ok(())
        })();
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
        }
        written?;
        // Make the rename durable where the file system allows it.
        if let Ok(d) =
            rustix::fs::openat(&dir, ".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
        {
            let _ = rustix::fs::fsync(&d);
        }
        Ok(shown)
    }

    /// The disk space the workspace and its temp dir take, in bytes
    /// (allocated blocks, so sparse files count what they use). Symbolic
    /// links are not followed; the walk stops counting after a million
    /// entries. Run it confined (a file-tool thread): a directory swapped
    /// for a link while it walks then leads nowhere.
    pub fn usage(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        const MAX_ENTRIES: usize = 1_000_000;
        let mut total = 0u64;
        let mut seen = 0usize;
        let mut stack = vec![self.root.clone(), self.tmp.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                seen += 1;
                if seen > MAX_ENTRIES {
                    return total;
                }
                let Ok(meta) = entry.path().symlink_metadata() else {
                    continue;
                };
                total = total.saturating_add(meta.blocks().saturating_mul(512));
                if meta.is_dir() {
                    stack.push(entry.path());
                }
            }
        }
        total
    }

    /// `Err` with the reason when writing `adding` more bytes would take
    /// the workspace past `quota` bytes (0: no quota).
    /// A project directory has no quota: it is the person's own disk, and
    /// measuring a large repository at every write would be slow.
    pub fn check_quota(&self, quota: u64, adding: u64) -> Result<(), ToolError> {
        if quota == 0 || self.project {
            return Ok(());
        }
        let used = self.usage();
        if used.saturating_add(adding) > quota {
            return Err(ToolError::TooLarge(format!(
                "the workspace takes {} MiB; {adding} more bytes would exceed its quota of {} \
                 MiB (tool_runner.limits.workspace_mib): delete files first",
                used / (1024 * 1024),
                quota / (1024 * 1024)
            )));
        }
        Ok(())
    }

    /// `path` relative to the workspace, for messages.
    pub fn display(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| path.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn outside(e: ToolError) -> bool {
        matches!(e, ToolError::PathOutsideWorkspace { .. })
    }

    #[test]
    fn paths_inside_resolve() {
        let root = tempfile::tempdir().unwrap();
        let ws = Workspace::open(root.path(), "s1").unwrap();
        let p = ws.resolve("a/b.txt").unwrap();
        assert_eq!(p, ws.root().join("a/b.txt"));
        assert_eq!(ws.resolve("./c").unwrap(), ws.root().join("c"));
        std::fs::create_dir(ws.root().join("d")).unwrap();
        std::os::unix::fs::symlink(ws.root().join("d"), ws.root().join("link")).unwrap();
        assert_eq!(ws.resolve("link/x").unwrap(), ws.root().join("d/x"));
    }

    #[test]
    fn escapes_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let ws = Workspace::open(root.path(), "s1").unwrap();
        assert!(outside(ws.resolve("../s2/x").unwrap_err()));
        assert!(outside(ws.resolve("a/../../x").unwrap_err()));
        assert!(outside(ws.resolve("/etc/passwd").unwrap_err()));
        std::os::unix::fs::symlink("/etc", ws.root().join("etc")).unwrap();
        assert!(outside(ws.resolve("etc/passwd").unwrap_err()));
        assert!(outside(ws.resolve("etc").unwrap_err()));
        std::os::unix::fs::symlink("/nonexistent/x", ws.root().join("dangling")).unwrap();
        assert!(outside(ws.resolve("dangling").unwrap_err()));
        assert!(matches!(
            ws.resolve("").unwrap_err(),
            ToolError::InvalidArguments(_)
        ));
        assert!(matches!(
            Workspace::open(root.path(), "../x").unwrap_err(),
            ToolError::InvalidRequest(_)
        ));
    }
}
