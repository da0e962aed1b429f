//! People: who may use Agentry, each with a role and a token of their own.
//!
//! The people file (`auth.people_file`, by default
//! `<data_dir>/auth/people.toml`, mode 0600 beside the service token) lists
//! each person's name, role, and the SHA-256 of their token. The token
//! itself is printed once, by `agentry users add`, and kept nowhere. The
//! services read the file again when it changes ([`PeopleFile::current`]),
//! so a person added or removed counts within a second, with no restart.
//!
//! The client token (`agentry token`) stays valid: it is the person
//! [`ADMIN`], the first admin.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

pub use crate::auth::Role;

/// The person the client token stands for.
pub const ADMIN: &str = "admin";

/// The person recorded when credentials are off (`auth.mode = "off"`).
pub const LOCAL: &str = "local";

/// Names no one can be given: the client token's person, the name the
/// services act under, and the one recorded with credentials off.
pub const RESERVED: &[&str] = &[ADMIN, crate::auth::SERVICE_PERSON, LOCAL];

/// One person as the file lists them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Person {
    /// Their name: lower-case letters, digits, `.`, `_` and `-`, starting
    /// with a letter.
    pub name: String,
    /// What they may do.
    pub role: Role,
    /// The SHA-256 of their token, in lower-case hex.
    pub token_sha256: String,
    /// When they were added, in seconds since the Unix epoch.
    #[serde(default)]
    pub added_at: u64,
    /// Who added them.
    #[serde(default)]
    pub added_by: String,
}

/// The people the file lists.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct People {
    /// In the order they were added.
    #[serde(default, rename = "person")]
    pub people: Vec<Person>,
}

/// Why the people file, or a change to it, cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PeopleError {
    /// The file cannot be read or written.
    #[error("cannot use the people file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A person cannot have this role.
    #[error(
        "{name} cannot be given the role {role}: a person is a viewer, operator, approver or admin"
    )]
    NotForPeople {
        /// The person.
        name: String,
        /// The role.
        role: Role,
    },
    /// A name is not allowed.
    #[error("invalid name {name:?}: {reason}")]
    Name {
        /// The name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The name is taken.
    #[error(
        "{0} is already a person here (`agentry users remove {0}` first to give them a new token)"
    )]
    Exists(String),
    /// Nobody has the name.
    #[error("nobody is called {0} here (`agentry users list` shows who is)")]
    Unknown(String),
}

impl People {
    /// The person whose token has this SHA-256 (compared in constant
    /// time).
    pub fn by_token_hash(&self, sha256: &str) -> Option<&Person> {
        self.people
            .iter()
            .find(|p| constant_time_eq(p.token_sha256.as_bytes(), sha256.as_bytes()))
    }

    /// The person called `name`.
    pub fn by_name(&self, name: &str) -> Option<&Person> {
        self.people.iter().find(|p| p.name == name)
    }

    /// Reads the file at `path`; a missing file lists nobody. A file other
    /// users can read or write is refused.
    pub fn load(path: &Path) -> Result<People, PeopleError> {
        let file_error = |reason: String| PeopleError::File {
            path: path.to_path_buf(),
            reason,
        };
        let Some(text) = crate::auth::read_private(path).map_err(file_error)? else {
            return Ok(People::default());
        };
        let people: People = toml::from_str(&text).map_err(|e| file_error(e.to_string()))?;
        for person in &people.people {
            check_name(&person.name).map_err(|e| file_error(e.to_string()))?;
            if !Role::FOR_PEOPLE.contains(&person.role) {
                return Err(file_error(format!(
                    "{} has the role {}, which is the services' alone",
                    person.name, person.role
                )));
            }
            if person.token_sha256.len() != 64
                || !person.token_sha256.bytes().all(|b| b.is_ascii_hexdigit())
            {
                return Err(file_error(format!(
                    "{}'s token_sha256 is not 64 hex digits",
                    person.name
                )));
            }
        }
        Ok(people)
    }

    /// Adds a person called `name` with `role` (added by `by`) to the file
    /// at `path`, creating it when needed; returns their token, which is
    /// stored only as its hash.
    pub fn add(
        path: &Path,
        name: &str,
        role: Role,
        by: &str,
    ) -> Result<crate::auth::Token, PeopleError> {
        check_name(name)?;
        if !Role::FOR_PEOPLE.contains(&role) {
            return Err(PeopleError::NotForPeople {
                name: name.to_string(),
                role,
            });
        }
        if RESERVED.contains(&name) {
            return Err(PeopleError::Name {
                name: name.to_string(),
                reason: "the name is reserved (the client token is `admin`)",
            });
        }
        let token = crate::auth::Token::generate(crate::auth::TokenKind::Person).map_err(|e| {
            PeopleError::File {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }
        })?;
        change(path, |people| {
            if people.by_name(name).is_some() {
                return Err(PeopleError::Exists(name.to_string()));
            }
            people.people.push(Person {
                name: name.to_string(),
                role,
                token_sha256: sha256_hex(token.secret().as_bytes()),
                added_at: SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or_default(),
                added_by: by.to_string(),
            });
            Ok(())
        })?;
        Ok(token)
    }

    /// Removes the person called `name` from the file at `path`: their
    /// token stops working.
    pub fn remove(path: &Path, name: &str) -> Result<Person, PeopleError> {
        let mut removed = None;
        change(path, |people| {
            let at = people
                .people
                .iter()
                .position(|p| p.name == name)
                .ok_or_else(|| PeopleError::Unknown(name.to_string()))?;
            removed = Some(people.people.remove(at));
            Ok(())
        })?;
        removed.ok_or_else(|| PeopleError::Unknown(name.to_string()))
    }
}

/// Applies `edit` to the file at `path` under an exclusive lock, and
/// replaces the file whole (a reader sees the old list or the new one).
fn change(
    path: &Path,
    edit: impl FnOnce(&mut People) -> Result<(), PeopleError>,
) -> Result<(), PeopleError> {
    let file_error = |reason: String| PeopleError::File {
        path: path.to_path_buf(),
        reason,
    };
    let dir = crate::auth::private_dir(path).map_err(file_error)?;
    let lock_path = dir.join(".people.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| file_error(format!("cannot open {}: {e}", lock_path.display())))?;
    lock.lock().map_err(|e| file_error(e.to_string()))?;
    let mut people = People::load(path)?;
    edit(&mut people)?;
    let text = format!(
        "# Who may use Agentry. Written by `agentry users`; each token is kept\n\
         # only as its SHA-256.\n\n{}",
        toml::to_string(&people).map_err(|e| file_error(e.to_string()))?
    );
    let tmp = dir.join(format!(".people.{}.tmp", std::process::id()));
    // One a crashed run left (under the lock, nobody else writes it).
    let _ = std::fs::remove_file(&tmp);
    let written = (|| -> std::io::Result<()> {
        crate::auth::write_private(&tmp, dir, text.as_bytes())?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(|e| file_error(e.to_string()))
}

/// Checks a person's name.
pub fn check_name(name: &str) -> Result<(), PeopleError> {
    let bad = |reason| {
        Err(PeopleError::Name {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() || name.len() > 64 {
        return bad("a name has 1 to 64 characters");
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return bad("a name starts with a lower-case letter");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    {
        return bad("a name has only lower-case letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

/// The SHA-256 of `bytes` in lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for b in digest.iter() {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// Whether `a` and `b` are equal, in time independent of where they
/// differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How often the file is looked at again.
const RECHECK: Duration = Duration::from_secs(1);

/// The people file as the services use it: read again when it changes,
/// looked at no more than once a second. A file that becomes unreadable
/// or invalid keeps the last good list (with an error in the log).
#[derive(Debug)]
pub struct PeopleFile {
    path: PathBuf,
    state: Mutex<Cached>,
}

#[derive(Debug)]
struct Cached {
    people: Arc<People>,
    /// The file's inode, modification time and size when read (`None`:
    /// absent); each change replaces the file, so its inode changes.
    seen: Option<(u64, SystemTime, u64)>,
    checked: Option<Instant>,
}

impl PeopleFile {
    /// The file at `path`, read now (an error when it exists and cannot be
    /// used).
    pub fn open(path: PathBuf) -> Result<PeopleFile, PeopleError> {
        let seen = stamp(&path);
        let people = People::load(&path)?;
        Ok(PeopleFile {
            path,
            state: Mutex::new(Cached {
                people: Arc::new(people),
                seen,
                checked: Some(Instant::now()),
            }),
        })
    }

    /// Nobody but the tokens' holders (for tests and `auth.mode = off`).
    pub fn empty() -> PeopleFile {
        PeopleFile {
            path: PathBuf::new(),
            state: Mutex::new(Cached {
                people: Arc::default(),
                seen: None,
                checked: None,
            }),
        }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The people now.
    pub fn current(&self) -> Arc<People> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if self.path.as_os_str().is_empty()
            || state.checked.is_some_and(|at| at.elapsed() < RECHECK)
        {
            return state.people.clone();
        }
        state.checked = Some(Instant::now());
        let seen = stamp(&self.path);
        if seen != state.seen {
            match People::load(&self.path) {
                Ok(people) => {
                    tracing::info!(path = %self.path.display(), people = people.people.len(), "people file read again");
                    state.people = Arc::new(people);
                    state.seen = seen;
                }
                Err(e) => {
                    tracing::error!("{e}; the people listed before stay in force");
                }
            }
        }
        state.people.clone()
    }
}

fn stamp(path: &Path) -> Option<(u64, SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.ino(), meta.modified().ok()?, meta.len()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_person_added_is_found_by_their_token_and_stored_only_as_a_hash() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("auth/people.toml");
        let token = People::add(&path, "alice", Role::Approver, ADMIN).unwrap();
        assert!(token.secret().starts_with("agentry_user_"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(token.secret()), "{text}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        let people = People::load(&path).unwrap();
        let alice = people
            .by_token_hash(&sha256_hex(token.secret().as_bytes()))
            .unwrap();
        assert_eq!((alice.name.as_str(), alice.role), ("alice", Role::Approver));
        assert_eq!(alice.added_by, ADMIN);
        assert!(
            people
                .by_token_hash(&sha256_hex(b"another token"))
                .is_none()
        );

        // Names are unique, checked, and the reserved ones are refused.
        assert!(matches!(
            People::add(&path, "alice", Role::Viewer, ADMIN),
            Err(PeopleError::Exists(_))
        ));
        for bad in [
            "",
            "Alice",
            "1x",
            "a b",
            "admin",
            "agentry",
            &"x".repeat(65),
        ] {
            assert!(
                People::add(&path, bad, Role::Viewer, ADMIN).is_err(),
                "{bad:?}"
            );
        }
        let bob = People::add(&path, "bob", Role::Viewer, "alice").unwrap();
        assert_ne!(bob, token);
        let removed = People::remove(&path, "alice").unwrap();
        assert_eq!(removed.name, "alice");
        let people = People::load(&path).unwrap();
        assert_eq!(people.people.len(), 1);
        assert!(
            people
                .by_token_hash(&sha256_hex(token.secret().as_bytes()))
                .is_none()
        );
        assert!(matches!(
            People::remove(&path, "alice"),
            Err(PeopleError::Unknown(_))
        ));
        // No temporary file left behind.
        let mut names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, vec![".people.lock", "people.toml"]);
    }

    #[test]
    fn a_file_others_can_read_or_a_damaged_one_is_refused_and_the_last_good_list_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("people.toml");
        assert_eq!(People::load(&path).unwrap(), People::default());
        People::add(&path, "carol", Role::Operator, ADMIN).unwrap();
        let file = PeopleFile::open(path.clone()).unwrap();
        assert_eq!(file.current().people.len(), 1);

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = People::load(&path).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

        std::fs::write(&path, "[[person]]\nname = \"x\"\nrole = \"king\"\n").unwrap();
        assert!(People::load(&path).is_err());
        std::thread::sleep(RECHECK + Duration::from_millis(50));
        // Damaged: the list read before stays.
        assert_eq!(file.current().people[0].name, "carol");
    }

    #[test]
    fn the_services_see_a_change_within_a_second() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("people.toml");
        let file = PeopleFile::open(path.clone()).unwrap();
        assert!(file.current().people.is_empty());
        People::add(&path, "dave", Role::Viewer, ADMIN).unwrap();
        std::thread::sleep(RECHECK + Duration::from_millis(50));
        assert_eq!(file.current().people[0].name, "dave");
        People::remove(&path, "dave").unwrap();
        std::thread::sleep(RECHECK + Duration::from_millis(50));
        assert!(file.current().people.is_empty());
    }

    #[test]
    fn roles_are_ordered_and_named_and_service_is_no_persons() {
        assert!(Role::Viewer < Role::Operator);
        assert!(Role::Operator < Role::Approver);
        assert!(Role::Approver < Role::Admin);
        assert!(Role::Admin < Role::Service);
        for role in Role::FOR_PEOPLE {
            assert_eq!(Role::parse(role.name()).unwrap(), role);
        }
        assert!(Role::parse("root").is_err());
        assert!(Role::parse("service").is_err());
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("people.toml");
        assert!(matches!(
            People::add(&path, "eve", Role::Service, ADMIN),
            Err(PeopleError::NotForPeople { .. })
        ));
    }
}
