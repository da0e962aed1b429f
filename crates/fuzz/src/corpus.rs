//! Saved inputs: each finding's input, replayed first on every run so a
//! fixed problem stays fixed.
//!
//! Layout: `<dir>/<Service>/<Method>/<hash>.<credential>.bin` holds an
//! RPC's messages, each framed as on the gRPC wire (a 0 byte, a 4-byte
//! big-endian length, the message); `<dir>/config/<hash>.toml` holds a
//! config loader input (see [`crate::config_fuzz::ConfigCase`]).

use crate::config_fuzz::ConfigCase;
use crate::oracle::{Evidence, Finding};
use crate::target::Credential;
use std::path::{Path, PathBuf};

/// One saved RPC input.
#[derive(Debug, Clone)]
pub struct Saved {
    /// `Service/Method`.
    pub rpc: String,
    pub messages: Vec<Vec<u8>>,
    pub credential: Credential,
    pub file: PathBuf,
}

/// Frames `messages` as on the wire.
pub fn frame(messages: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for message in messages {
        out.push(0);
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
    }
    out
}

/// The messages of a framed file; `None` if it is not one.
pub fn unframe(mut bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut messages = Vec::new();
    while !bytes.is_empty() {
        let (&flag, rest) = bytes.split_first()?;
        let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        if flag != 0 {
            return None;
        }
        messages.push(rest.get(4..4 + len)?.to_vec());
        bytes = &rest[4 + len..];
    }
    Some(messages)
}

fn hash(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn credential_named(name: &str) -> Option<Credential> {
    [
        Credential::Service,
        Credential::Client,
        Credential::Missing,
        Credential::Malformed,
        Credential::Wrong,
    ]
    .into_iter()
    .find(|c| c.name() == name)
}

/// Saves a finding's input under `dir`; the file written, if any.
pub fn save(dir: &Path, finding: &Finding) -> std::io::Result<Option<PathBuf>> {
    let (folder, name, bytes) = match &finding.evidence {
        Evidence::Rpc {
            messages,
            credential,
            ..
        } => {
            let bytes = frame(messages);
            let name = format!("{}.{}.bin", hash(&bytes), credential.name());
            (dir.join(&finding.rpc), name, bytes)
        }
        Evidence::Config(case) => {
            let text = case.to_text();
            let name = format!("{}.toml", hash(text.as_bytes()));
            (dir.join("config"), name, text.into_bytes())
        }
        Evidence::None => return Ok(None),
    };
    std::fs::create_dir_all(&folder)?;
    let path = folder.join(name);
    std::fs::write(&path, bytes)?;
    Ok(Some(path))
}

/// Every saved RPC input and config input under `dir` (none if it does
/// not exist); files that cannot be read are named in `skipped`.
pub fn load(dir: &Path, skipped: &mut Vec<String>) -> (Vec<Saved>, Vec<(PathBuf, ConfigCase)>) {
    let mut rpcs = Vec::new();
    let mut configs = Vec::new();
    let Ok(services) = std::fs::read_dir(dir) else {
        return (rpcs, configs);
    };
    let mut services: Vec<PathBuf> = services.filter_map(Result::ok).map(|e| e.path()).collect();
    services.sort();
    for service in services.into_iter().filter(|p| p.is_dir()) {
        let service_name = service
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if service_name == "config" {
            for file in sorted_files(&service) {
                match std::fs::read_to_string(&file)
                    .ok()
                    .and_then(|t| ConfigCase::from_text(&t))
                {
                    Some(case) => configs.push((file, case)),
                    None => skipped.push(file.display().to_string()),
                }
            }
            continue;
        }
        let Ok(methods) = std::fs::read_dir(&service) else {
            continue;
        };
        let mut methods: Vec<PathBuf> = methods.filter_map(Result::ok).map(|e| e.path()).collect();
        methods.sort();
        for method in methods.into_iter().filter(|p| p.is_dir()) {
            let method_name = method
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            for file in sorted_files(&method) {
                let name = file
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let credential = name
                    .strip_suffix(".bin")
                    .and_then(|stem| stem.rsplit('.').next())
                    .and_then(credential_named);
                let messages = std::fs::read(&file).ok().and_then(|b| unframe(&b));
                match (credential, messages) {
                    (Some(credential), Some(messages)) => rpcs.push(Saved {
                        rpc: format!("{service_name}/{method_name}"),
                        messages,
                        credential,
                        file,
                    }),
                    _ if name.ends_with(".md") => {}
                    _ => skipped.push(file.display().to_string()),
                }
            }
        }
    }
    (rpcs, configs)
}

fn sorted_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.is_file());
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn saved_inputs_load_back() {
        let dir = tempfile::tempdir().unwrap();
        let finding = Finding {
            rpc: "SessionStore/Append".into(),
            kind: "panic",
            detail: "x".into(),
            evidence: Evidence::Rpc {
                input_type: "agentry.sessions.v1.AppendRequest".into(),
                messages: vec![vec![1, 2, 3], vec![]],
                credential: Credential::Wrong,
            },
        };
        let path = save(dir.path(), &finding).unwrap().unwrap();
        assert!(path.starts_with(dir.path().join("SessionStore/Append")));
        let mut skipped = Vec::new();
        let (rpcs, configs) = load(dir.path(), &mut skipped);
        assert!(skipped.is_empty() && configs.is_empty());
        assert_eq!(rpcs.len(), 1);
        assert_eq!(rpcs[0].rpc, "SessionStore/Append");
        assert_eq!(rpcs[0].messages, vec![vec![1, 2, 3], vec![]]);
        assert_eq!(rpcs[0].credential, Credential::Wrong);
        assert_eq!(unframe(&[0, 0, 0, 0, 9]), None);
    }
}
