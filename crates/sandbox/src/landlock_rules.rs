//! The Landlock ruleset of a command: what it may read, write and connect
//! to. Built while the helper still has its full rights (path descriptors
//! are opened then), enforced later with `restrict_self`.

use crate::Spec;
use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope,
};
use std::path::Path;

/// The newest ABI whose rights this ruleset was written and tested for:
/// file-system rights with truncation and device ioctls, TCP bind/connect,
/// and the abstract-socket and signal scopes. Older kernels enforce the
/// subset they know.
const TARGET: ABI = ABI::V6;

/// Device files every command may read and write (never `/dev/tty`: a
/// command has no terminal).
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// Builds the ruleset of `spec`; nothing is enforced yet.
pub fn build(spec: &Spec) -> Result<RulesetCreated, String> {
    let all = AccessFs::from_all(TARGET);
    let read = AccessFs::from_read(TARGET);
    let mut ruleset = Ruleset::default()
        .handle_access(all)
        .map_err(|e| format!("landlock: {e}"))?
        .scope(Scope::from_all(TARGET))
        .map_err(|e| format!("landlock: {e}"))?;
    // Every TCP bind and connect is denied, but a connect to the proxy's
    // port when the call has network.
    ruleset = ruleset
        .handle_access(AccessNet::from_all(TARGET))
        .map_err(|e| format!("landlock: {e}"))?;
    let mut created = ruleset.create().map_err(|e| format!("landlock: {e}"))?;
    if let Some(proxy) = &spec.proxy {
        created = created
            .add_rule(NetPort::new(proxy.port(), AccessNet::ConnectTcp))
            .map_err(|e| format!("landlock: rule for the proxy's port: {e}"))?;
    }
    for dir in &spec.read_write {
        created = add(created, dir, all)?;
    }
    for root in &spec.read_only {
        // A listed path that is not here (or not in the built view) is
        // simply not granted.
        if root.symlink_metadata().is_err() {
            continue;
        }
        created = allow_except(created, root, &spec.hidden, read, 0)?;
    }
    let device = AccessFs::from_file(TARGET) & !AccessFs::Execute;
    for dev in DEVICES {
        let path = Path::new(dev);
        if path.exists() {
            created = add(created, path, device)?;
        }
    }
    Ok(created)
}

fn add(
    created: RulesetCreated,
    path: &Path,
    access: BitFlags<AccessFs>,
) -> Result<RulesetCreated, String> {
    let fd =
        PathFd::new(path).map_err(|e| format!("landlock: cannot open {}: {e}", path.display()))?;
    // Rights that only make sense on directories are dropped for files.
    let access = if path.is_dir() {
        access
    } else {
        access & AccessFs::from_file(TARGET)
    };
    created
        .add_rule(PathBeneath::new(fd, access))
        .map_err(|e| format!("landlock: rule for {}: {e}", path.display()))
}

/// How deep [`allow_except`] descends to carve out hidden paths.
const MAX_CARVE_DEPTH: usize = 8;

/// Allows `access` beneath `root`, except beneath any of `hidden`: when a
/// hidden path lies inside `root`, the rule is given to each of `root`'s
/// entries instead, recursively, skipping the hidden ones. Landlock rules
/// only add rights, so this is how "everything here but that" is said.
fn allow_except(
    mut created: RulesetCreated,
    root: &Path,
    hidden: &[std::path::PathBuf],
    access: BitFlags<AccessFs>,
    depth: usize,
) -> Result<RulesetCreated, String> {
    if hidden.iter().any(|h| root.starts_with(h)) {
        return Ok(created);
    }
    let inside: Vec<_> = hidden.iter().filter(|h| h.starts_with(root)).collect();
    if inside.is_empty() || !root.is_dir() {
        if depth > 0 && PathFd::new(root).is_err() {
            // An entry that vanished or cannot be opened is simply not allowed.
            return Ok(created);
        }
        return add(created, root, access);
    }
    if depth >= MAX_CARVE_DEPTH {
        // Too deep to carve: leave the whole directory out (fail closed).
        return Ok(created);
    }
    let entries = std::fs::read_dir(root)
        .map_err(|e| format!("landlock: cannot list {}: {e}", root.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        // Symbolic links are resolved by the kernel on each access, through
        // rules of their targets; they need no rule of their own.
        if entry.file_type().map(|t| t.is_symlink()).unwrap_or(true) {
            continue;
        }
        created = allow_except(created, &path, hidden, access, depth + 1)?;
    }
    Ok(created)
}
