//! Modes of what services keep on disk: the data directory is closed to
//! everyone but the services (0711: others may pass through it to the
//! session workspaces beneath, never list or read it), and databases and
//! credentials are readable by their owner only (0600).

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of the data directory and of the workspace root.
pub const DIR_MODE: u32 = 0o711;
/// Mode of databases and credentials.
pub const FILE_MODE: u32 = 0o600;

/// Creates `dir` (and its parents) if needed and gives it [`DIR_MODE`],
/// tightening a directory that is more open.
pub fn prepare_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let meta = std::fs::metadata(dir)?;
    if meta.permissions().mode() & 0o777 != DIR_MODE {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE))?;
    }
    Ok(())
}

/// Creates `file` empty with [`FILE_MODE`] if it does not exist, and
/// tightens it if it does. SQLite gives its -wal and -shm files the mode
/// of the database, so calling this before opening a database covers them.
pub fn prepare_file(file: &Path) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(FILE_MODE)
        .open(file)?;
    let meta = std::fs::metadata(file)?;
    if meta.permissions().mode() & 0o777 != FILE_MODE {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(FILE_MODE))?;
    }
    for suffix in ["-wal", "-shm"] {
        let mut side = file.as_os_str().to_owned();
        side.push(suffix);
        let side = Path::new(&side);
        if side.exists() {
            std::fs::set_permissions(side, std::fs::Permissions::from_mode(FILE_MODE))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn modes_are_set_and_tightened() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare_dir(&dir).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o711);
        let db = dir.join("x.db");
        prepare_file(&db).unwrap();
        assert_eq!(mode(&db), 0o600);
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(dir.join("x.db-wal"), b"").unwrap();
        prepare_file(&db).unwrap();
        assert_eq!(mode(&db), 0o600);
        assert_eq!(mode(&dir.join("x.db-wal")), 0o600);
    }
}
