//! A project's instruction files (AGENTS.md, or the names other agents
//! use): found in the project's directory and its parents up to the
//! repository's root, and in the subdirectories a file tool touches.
//!
//! They are read as the session (its identity; the caller runs these on a
//! confined thread), each name opened beneath its directory without
//! following any symbolic link, and cut at [`MAX_FILE_BYTES`]. What they
//! say is text for the model: nothing here reads a setting from them.

use agentry_proto::sessions::v1::InstructionFile;
use rustix::fs::{Mode, OFlags, ResolveFlags};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The names read in a directory: the first that exists.
pub const NAMES: [&str; 4] = [
    "AGENTS.md",
    "CLAUDE.md",
    "GEMINI.md",
    ".github/copilot-instructions.md",
];

/// The most of one file that is read.
pub const MAX_FILE_BYTES: u64 = 32 * 1024;

/// How far up parent directories are searched for the repository's root.
const MAX_PARENTS: usize = 16;

/// The directories whose files a project at `root` gets, farthest first:
/// `root` itself, and when it lies inside a git repository (a parent
/// holding `.git`, reached without leaving what `allowed` accepts), every
/// directory from the repository's root down.
pub fn project_dirs(root: &Path, allowed: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    if !root.join(".git").exists() {
        let mut found = false;
        let mut current = root.parent();
        while let Some(dir) = current {
            if dirs.len() > MAX_PARENTS || !allowed(dir) {
                break;
            }
            dirs.push(dir.to_path_buf());
            if dir.join(".git").exists() {
                found = true;
                break;
            }
            current = dir.parent();
        }
        if !found {
            dirs.truncate(1);
        }
    }
    dirs.reverse();
    dirs
}

/// The instruction file of each of `dirs` that has one.
pub fn read_dirs(dirs: &[PathBuf]) -> Vec<InstructionFile> {
    dirs.iter().filter_map(|dir| read_dir(dir)).collect()
}

/// The instruction file of `dir`: the first of [`NAMES`] there.
pub fn read_dir(dir: &Path) -> Option<InstructionFile> {
    read_below(dir, Path::new(""))
}

/// The instruction file of the directory `rel` beneath `root` (reached
/// without following a symbolic link).
pub fn read_below(root: &Path, rel: &Path) -> Option<InstructionFile> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut fd = rustix::fs::open(root, flags, Mode::empty()).ok()?;
    if !rel.as_os_str().is_empty() {
        fd = rustix::fs::openat2(
            &fd,
            rel,
            flags,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .ok()?;
    }
    let dir = root.join(rel);
    NAMES.iter().find_map(|name| {
        let file = rustix::fs::openat2(
            &fd,
            *name,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .ok()?;
        let file = std::fs::File::from(file);
        let meta = file.metadata().ok()?;
        if !meta.is_file() {
            return None;
        }
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES).read_to_end(&mut bytes).ok()?;
        Some(InstructionFile {
            path: dir.join(name).display().to_string(),
            text: String::from_utf8_lossy(&bytes).into_owned(),
            truncated: meta.len() > MAX_FILE_BYTES,
            size: meta.len(),
        })
    })
}

/// The directories below the project's root on the way to `touched` (a
/// path relative to it, as a file tool's call named it; `is_dir`: it names
/// a directory), relative to the root, nearest last. Never the root
/// itself, whose file the session got at its start.
pub fn touched_dirs(touched: &str, is_dir: bool) -> Vec<PathBuf> {
    use std::path::Component;
    let rel = Path::new(touched);
    if rel
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Vec::new();
    }
    let dir = if is_dir {
        rel.to_path_buf()
    } else {
        rel.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    let mut dirs = Vec::new();
    let mut prefix = PathBuf::new();
    for part in dir.components() {
        if let std::path::Component::Normal(name) = part {
            prefix.push(name);
            dirs.push(prefix.clone());
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_project_inside_a_repository_gets_every_file_from_its_root_down() {
        let home = tempfile::tempdir().unwrap();
        let repo = home.path().join("repo");
        let project = repo.join("services/api");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::create_dir_all(&project).unwrap();
        std::fs::write(repo.join("AGENTS.md"), "repo rules").unwrap();
        std::fs::write(repo.join("services/CLAUDE.md"), "services rules").unwrap();
        std::fs::write(project.join("AGENTS.md"), "api rules").unwrap();
        std::fs::write(project.join("CLAUDE.md"), "not read: AGENTS.md is there").unwrap();
        // Above the repository: never read.
        std::fs::write(home.path().join("AGENTS.md"), "outside").unwrap();
        let dirs = project_dirs(&project, |_| true);
        assert_eq!(dirs, [repo.clone(), repo.join("services"), project.clone()]);
        let texts: Vec<String> = read_dirs(&dirs).into_iter().map(|f| f.text).collect();
        assert_eq!(texts, ["repo rules", "services rules", "api rules"]);
        // Parents outside what is allowed are not searched.
        let dirs = project_dirs(&project, |d| d.starts_with(&project));
        assert_eq!(dirs, std::slice::from_ref(&project));
    }

    #[test]
    fn outside_a_repository_only_the_project_s_own_file_counts() {
        let home = tempfile::tempdir().unwrap();
        let project = home.path().join("notes");
        std::fs::create_dir_all(project.join(".github")).unwrap();
        std::fs::write(home.path().join("AGENTS.md"), "home rules").unwrap();
        std::fs::write(
            project.join(".github/copilot-instructions.md"),
            "copilot rules",
        )
        .unwrap();
        let dirs = project_dirs(&project, |_| true);
        assert_eq!(dirs, std::slice::from_ref(&project));
        let files = read_dirs(&dirs);
        assert_eq!(files.len(), 1);
        assert!(files[0].path.ends_with(".github/copilot-instructions.md"));
    }

    #[test]
    fn links_are_not_followed_and_long_files_are_cut() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "SECRET").unwrap();
        let project = dir.path().join("p");
        std::fs::create_dir_all(project.join("linked")).unwrap();
        std::os::unix::fs::symlink(&secret, project.join("AGENTS.md")).unwrap();
        std::os::unix::fs::symlink(dir.path(), project.join(".github")).unwrap();
        std::fs::write(dir.path().join("copilot-instructions.md"), "SECRET").unwrap();
        assert_eq!(read_dir(&project), None);
        let long = "x".repeat(MAX_FILE_BYTES as usize + 10);
        std::fs::write(project.join("linked/AGENTS.md"), &long).unwrap();
        let file = read_dir(&project.join("linked")).unwrap();
        assert!(file.truncated);
        assert_eq!(file.text.len(), MAX_FILE_BYTES as usize);
        assert_eq!(file.size, MAX_FILE_BYTES + 10);
    }

    #[test]
    fn touched_paths_name_the_directories_below_the_root() {
        assert_eq!(
            touched_dirs("a/b/c.rs", false),
            [PathBuf::from("a"), PathBuf::from("a/b")]
        );
        assert_eq!(touched_dirs("./a", true), [PathBuf::from("a")]);
        assert!(touched_dirs("top.rs", false).is_empty());
        assert!(touched_dirs("../x/y", false).is_empty());
        assert!(touched_dirs("/etc/x", false).is_empty());
    }

    #[test]
    fn a_nested_file_is_read_beneath_the_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("p");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(dir.path().join("elsewhere")).unwrap();
        std::fs::write(root.join("sub/AGENTS.md"), "sub rules").unwrap();
        std::fs::write(dir.path().join("elsewhere/AGENTS.md"), "SECRET").unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("out")).unwrap();
        assert_eq!(
            read_below(&root, Path::new("sub")).unwrap().text,
            "sub rules"
        );
        assert_eq!(read_below(&root, Path::new("out")), None);
    }
}
