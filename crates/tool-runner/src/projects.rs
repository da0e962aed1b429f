//! Where sessions work: a scratch workspace of their own under the
//! workspace root, or a person's project directory the session opened.
//!
//! A session opens a project once ([`Places::open_project`]); the runner
//! then records the directory in `<workspace root>/.projects/<session>`,
//! on the volume every replica shares and out of every session's reach.
//! Each later call of that session (and of its sub-agents, which work in
//! their parent's place) finds the record and is checked again against the
//! settings of the runner serving it, so narrowing
//! `tool_runner.project_roots` closes a project to sessions that had it.
//!
//! A directory may be opened when it lies under one of the project roots,
//! is not (and does not hold) the services' own data, configuration or
//! workspaces, and, when commands switch identity, is not owned by root:
//! commands of a project session run as the directory's owner, so the
//! files they make belong to the person whose project it is.

use crate::ToolError;
use crate::workspace::{Workspace, check_session_id};
use agentry_sandbox::Ids;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The directory under the workspace root holding each project session's
/// record (a name no session id can take).
pub const PROJECTS: &str = ".projects";

/// The setting that names the directories projects may be opened under.
pub const SETTING: &str = "tool_runner.project_roots";

/// Where sessions work, and which project directories they may open.
#[derive(Debug, Clone)]
pub struct Places {
    root: PathBuf,
    project_roots: Vec<PathBuf>,
    forbidden: Vec<PathBuf>,
    switches_identity: bool,
    roots_note: String,
}

impl Places {
    /// Scratch workspaces under `root` only: no project can be opened.
    pub fn scratch_only(root: PathBuf) -> Places {
        Places {
            root,
            project_roots: Vec::new(),
            forbidden: Vec::new(),
            switches_identity: false,
            roots_note: format!("{SETTING} is empty"),
        }
    }

    /// Scratch workspaces under `root`, and projects under `project_roots`
    /// (directories that do not exist are left out). `forbidden` are the
    /// services' own directories (data, configuration, token): no project
    /// may be one of them, lie inside one or hold one. `switches_identity`:
    /// commands run as another user than the runner (it is root), so a
    /// project's owner must not be root.
    pub fn new(
        root: PathBuf,
        project_roots: &[PathBuf],
        forbidden: &[PathBuf],
        switches_identity: bool,
    ) -> Places {
        let canonical = |p: &PathBuf| p.canonicalize().ok();
        let roots: Vec<PathBuf> = project_roots.iter().filter_map(canonical).collect();
        let roots_note = if project_roots.is_empty() {
            if switches_identity {
                format!(
                    "{SETTING} is empty (the services run as root, so no directory is open to \
                     sessions until it is set)"
                )
            } else {
                format!("{SETTING} is empty")
            }
        } else {
            format!(
                "{SETTING} is [{}]",
                project_roots
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let mut forbidden: Vec<PathBuf> = forbidden.iter().filter_map(canonical).collect();
        forbidden.extend(canonical(&root));
        Places {
            root,
            project_roots: roots,
            forbidden,
            switches_identity,
            roots_note,
        }
    }

    /// The workspace root (scratch workspaces, temp dirs, records).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The session's place: its project directory when it opened one, else
    /// its scratch workspace (created if new).
    pub fn open(&self, session_id: &str) -> Result<Workspace, ToolError> {
        check_session_id(session_id)?;
        match self.recorded(session_id)? {
            None => Workspace::open(&self.root, session_id),
            Some(dir) => {
                let (dir, owner) = self.check(&dir).map_err(|e| match e {
                    ToolError::NotAllowed(why) => ToolError::NotAllowed(format!(
                        "this session works in a project directory it may no longer use: {why}"
                    )),
                    other => other,
                })?;
                Workspace::open_project(&self.root, session_id, dir, owner)
            }
        }
    }

    /// Makes `dir` the session's place, after checking that it may be.
    /// Opening the same directory again is a no-op; a session that works
    /// somewhere else already is refused.
    pub fn open_project(&self, session_id: &str, dir: &Path) -> Result<Workspace, ToolError> {
        check_session_id(session_id)?;
        let (dir, owner) = self.check(dir)?;
        match self.recorded(session_id)? {
            Some(current) if current == dir => {}
            Some(current) => {
                return Err(ToolError::InvalidRequest(format!(
                    "session {session_id} already works in {}",
                    current.display()
                )));
            }
            None => {
                if self.root.join(session_id).exists() {
                    return Err(ToolError::InvalidRequest(format!(
                        "session {session_id} already has a scratch workspace; a project \
                         directory is chosen when a session is created"
                    )));
                }
                self.record(session_id, &dir)?;
            }
        }
        Workspace::open_project(&self.root, session_id, dir, owner)
    }

    /// The project directory a session recorded, if any.
    pub fn recorded(&self, session_id: &str) -> Result<Option<PathBuf>, ToolError> {
        use std::os::unix::ffi::OsStringExt;
        let path = self.root.join(PROJECTS).join(session_id);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(PathBuf::from(std::ffi::OsString::from_vec(bytes)))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ToolError::Io(format!(
                "cannot read the project record {}: {e}",
                path.display()
            ))),
        }
    }

    /// Forgets a session's project (the directory itself is untouched).
    pub fn forget(&self, session_id: &str) -> Result<(), ToolError> {
        check_session_id(session_id)?;
        match std::fs::remove_file(self.root.join(PROJECTS).join(session_id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(ToolError::Io(format!(
                "cannot forget the project of {session_id}: {e}"
            ))),
            _ => Ok(()),
        }
    }

    fn record(&self, session_id: &str, dir: &Path) -> Result<(), ToolError> {
        use std::io::Write;
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::OpenOptionsExt;
        let records = self.root.join(PROJECTS);
        let io = |what: &str, e: std::io::Error| {
            ToolError::Io(format!("cannot {what} {}: {e}", records.display()))
        };
        agentry_runtime::datadir::prepare_dir(&records).map_err(|e| io("create", e))?;
        let target = records.join(session_id);
        let tmp = crate::workspace::temp_path_for(&target)?;
        let written = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(dir.as_os_str().as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&tmp, &target)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io("record a project in", e));
        }
        Ok(())
    }

    /// Checks that `dir` may be a session's project: returns it canonical,
    /// with the ids its commands run as when the runner switches identity.
    pub fn check(&self, dir: &Path) -> Result<(PathBuf, Option<Ids>), ToolError> {
        if !dir.is_absolute() {
            return Err(ToolError::InvalidRequest(format!(
                "the project directory {} is not an absolute path",
                dir.display()
            )));
        }
        let canonical = dir.canonicalize().map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::NotFound {
                " (the tool runner sees its own files: a runner in a container or on another \
                 machine sees the directory only where it is mounted at the same path)"
            } else {
                ""
            };
            ToolError::InvalidRequest(format!(
                "the project directory {} cannot be opened where the tool runner runs: {e}{hint}",
                dir.display()
            ))
        })?;
        let meta = std::fs::metadata(&canonical)
            .map_err(|e| ToolError::InvalidRequest(format!("{}: {e}", canonical.display())))?;
        if !meta.is_dir() {
            return Err(ToolError::InvalidRequest(format!(
                "{} is not a directory",
                canonical.display()
            )));
        }
        if !self.project_roots.iter().any(|r| canonical.starts_with(r)) {
            return Err(ToolError::NotAllowed(format!(
                "{} is not under a directory sessions may work in ({}); add it (or a parent) \
                 to {SETTING} in the services' configuration, or start the session with \
                 --scratch",
                canonical.display(),
                self.roots_note
            )));
        }
        if let Some(own) = self
            .forbidden
            .iter()
            .find(|f| canonical.starts_with(f) || f.starts_with(&canonical))
        {
            return Err(ToolError::NotAllowed(format!(
                "{} holds or lies in the services' own directory {}; choose a directory that \
                 does not",
                canonical.display(),
                own.display()
            )));
        }
        let owner = Ids {
            uid: meta.uid(),
            gid: meta.gid(),
        };
        if self.switches_identity && owner.uid == 0 {
            return Err(ToolError::NotAllowed(format!(
                "{} is owned by root, and commands never run as root; give the directory to \
                 the person whose project it is (chown)",
                canonical.display()
            )));
        }
        Ok((canonical, self.switches_identity.then_some(owner)))
    }

    /// Whether `dir` (canonical) lies under a project root and outside the
    /// services' own directories: where instruction files may be read.
    pub fn within_roots(&self, dir: &Path) -> bool {
        self.project_roots.iter().any(|r| dir.starts_with(r))
            && !self
                .forbidden
                .iter()
                .any(|f| dir.starts_with(f) || f.starts_with(dir))
    }

    /// The lock file of a project directory's changing calls.
    pub fn lock_path(&self, dir: &Path) -> PathBuf {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        dir.hash(&mut hasher);
        self.root
            .join(PROJECTS)
            .join(format!(".lock-{:016x}", hasher.finish()))
    }
}

/// A held lock on a project directory: changing calls of two sessions on
/// one directory never run at the same time. Released when dropped.
#[derive(Debug)]
pub struct DirectoryLock {
    file: std::fs::File,
}

impl DirectoryLock {
    /// Takes the lock at `path` for `session_id`, or says which session
    /// holds it (`Err(Some(holder))`); `Err(None)` for an I/O failure,
    /// which is logged.
    pub fn try_take(path: &Path, session_id: &str) -> Result<DirectoryLock, Option<String>> {
        use std::io::{Read, Seek, Write};
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| {
                tracing::warn!(path = %path.display(), error = %e, "cannot open a project lock");
                None
            })?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                let mut file = file;
                let _ = file.set_len(0);
                let _ = file.rewind();
                let _ = file.write_all(session_id.as_bytes());
                Ok(DirectoryLock { file })
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut holder = String::new();
                let _ = (&file).take(128).read_to_string(&mut holder);
                Err(Some(holder))
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot lock a project");
                Err(None)
            }
        }
    }
}

impl Drop for DirectoryLock {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(&self.file, rustix::fs::FlockOperation::Unlock);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn places(scratch: &Path, roots: &[PathBuf], forbidden: &[PathBuf], switches: bool) -> Places {
        Places::new(scratch.to_path_buf(), roots, forbidden, switches)
    }

    #[test]
    fn a_project_under_a_root_is_recorded_and_found_again() {
        let scratch = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let project = home.path().join("repo");
        std::fs::create_dir(&project).unwrap();
        let places = places(scratch.path(), &[home.path().to_path_buf()], &[], false);
        let ws = places.open_project("s1", &project).unwrap();
        assert_eq!(ws.root(), project.canonicalize().unwrap());
        assert!(ws.is_project());
        let again = places.open("s1").unwrap();
        assert_eq!(again.root(), ws.root());
        // The temp dir stays under the workspace root, not in the project.
        assert!(
            again
                .tmp()
                .starts_with(scratch.path().canonicalize().unwrap())
        );
        assert!(!project.join(".tmp").exists());
        // Another session without a record gets its scratch workspace.
        let other = places.open("s2").unwrap();
        assert!(!other.is_project());
        assert!(
            other
                .root()
                .starts_with(scratch.path().canonicalize().unwrap())
        );
    }

    #[test]
    fn directories_outside_the_roots_are_refused_naming_the_setting() {
        let scratch = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let places = places(scratch.path(), &[home.path().to_path_buf()], &[], false);
        let err = places.open_project("s1", elsewhere.path()).unwrap_err();
        assert!(matches!(err, ToolError::NotAllowed(_)), "{err}");
        assert!(err.to_string().contains(SETTING), "{err}");
        assert!(places.recorded("s1").unwrap().is_none());
        // A symbolic link inside a root that leads out is judged by its target.
        let link = home.path().join("out");
        std::os::unix::fs::symlink(elsewhere.path(), &link).unwrap();
        assert!(matches!(
            places.open_project("s1", &link).unwrap_err(),
            ToolError::NotAllowed(_)
        ));
        // Relative paths and files are bad requests.
        assert!(matches!(
            places.open_project("s1", Path::new("repo")).unwrap_err(),
            ToolError::InvalidRequest(_)
        ));
        let file = home.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(matches!(
            places.open_project("s1", &file).unwrap_err(),
            ToolError::InvalidRequest(_)
        ));
    }

    #[test]
    fn the_services_own_directories_are_never_projects() {
        let home = tempfile::tempdir().unwrap();
        let data = home.path().join("data");
        let scratch = data.join("workspaces");
        std::fs::create_dir_all(&scratch).unwrap();
        let places = places(
            &scratch,
            &[home.path().to_path_buf()],
            std::slice::from_ref(&data),
            false,
        );
        for dir in [home.path().to_path_buf(), data.clone(), scratch.clone()] {
            let err = places.open_project("s1", &dir).unwrap_err();
            assert!(
                matches!(err, ToolError::NotAllowed(_)),
                "{}: {err}",
                dir.display()
            );
        }
    }

    #[test]
    fn narrowing_the_roots_closes_a_recorded_project() {
        let scratch = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let wide = places(scratch.path(), &[home.path().to_path_buf()], &[], false);
        wide.open_project("s1", home.path()).unwrap();
        let narrow = places(scratch.path(), &[], &[], false);
        let err = narrow.open("s1").unwrap_err();
        assert!(matches!(err, ToolError::NotAllowed(_)), "{err}");
        assert!(err.to_string().contains("no longer"), "{err}");
    }

    #[test]
    fn a_session_cannot_move_to_another_directory() {
        let scratch = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let (a, b) = (home.path().join("a"), home.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let places = places(scratch.path(), &[home.path().to_path_buf()], &[], false);
        places.open_project("s1", &a).unwrap();
        places.open_project("s1", &a).unwrap();
        assert!(matches!(
            places.open_project("s1", &b).unwrap_err(),
            ToolError::InvalidRequest(_)
        ));
        places.open("s2").unwrap();
        assert!(matches!(
            places.open_project("s2", &a).unwrap_err(),
            ToolError::InvalidRequest(_)
        ));
    }

    #[test]
    fn commands_that_switch_identity_run_as_the_owner_never_root() {
        use std::os::unix::fs::MetadataExt;
        let scratch = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let places = places(scratch.path(), &[home.path().to_path_buf()], &[], true);
        let meta = std::fs::metadata(home.path()).unwrap();
        match places.check(home.path()) {
            Ok((_, owner)) => assert_eq!(
                owner,
                Some(Ids {
                    uid: meta.uid(),
                    gid: meta.gid()
                })
            ),
            Err(e) => {
                assert_eq!(meta.uid(), 0);
                assert!(e.to_string().contains("owned by root"), "{e}");
            }
        }
    }

    #[test]
    fn a_directory_lock_names_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let held = DirectoryLock::try_take(&path, "session-a").unwrap();
        assert_eq!(
            DirectoryLock::try_take(&path, "session-b").unwrap_err(),
            Some("session-a".to_string())
        );
        drop(held);
        DirectoryLock::try_take(&path, "session-b").unwrap();
    }
}
