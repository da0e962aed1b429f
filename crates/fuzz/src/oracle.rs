//! What makes a call a finding: a panic anywhere in the process, a call
//! that does not finish in time, an error that is no proper gRPC status
//! (empty message, `Unknown`, a Rust debug dump), a bad credential let
//! through, an answer that does not decode.

use crate::config_fuzz::ConfigCase;
use crate::schema::Method;
use crate::target::{Credential, Outcome};
use agentry_runtime::auth::Role;
use std::sync::Mutex;
use tonic::Code;

/// The input that led to a finding.
#[derive(Debug, Clone)]
pub enum Evidence {
    /// An RPC's messages (their type) and credential.
    Rpc {
        input_type: String,
        messages: Vec<Vec<u8>>,
        credential: Credential,
    },
    /// A config loader input.
    Config(ConfigCase),
    /// Nothing to replay (found by a check between calls).
    None,
}

/// One problem.
#[derive(Debug, Clone)]
pub struct Finding {
    /// `Service/Method`, `config/load`, or the check that found it.
    pub rpc: String,
    /// `panic`, `hang`, `bad status`, `auth`, `bad answer`, `stored`,
    /// `escape`, `config`.
    pub kind: &'static str,
    pub detail: String,
    pub evidence: Evidence,
}

impl Finding {
    /// What makes two findings the same problem: the place and kind, and
    /// the detail without its numbers and quoted values.
    pub fn key(&self) -> String {
        let mut detail = String::new();
        let mut quoted = false;
        for c in self.detail.chars().take(160) {
            match c {
                '"' => quoted = !quoted,
                _ if quoted || c.is_ascii_digit() => {}
                _ => detail.push(c),
            }
        }
        format!("{}|{}|{detail}", self.rpc, self.kind)
    }
}

/// Text that shows an error was formatted with `Debug` (or worse) rather
/// than written for the caller.
const DUMPS: &[&str] = &[
    "Error {",
    "Os {",
    "Custom {",
    "kind: ",
    "panicked",
    "unwrap()",
    "DecodeError {",
    "RUST_BACKTRACE",
    "Status {",
];

/// What is wrong with an error status, if anything.
pub fn status_problem(status: &tonic::Status) -> Option<String> {
    let message = status.message();
    if message.trim().is_empty() {
        return Some(format!("{:?} with an empty message", status.code()));
    }
    if status.code() == Code::Unknown {
        return Some(format!("Unknown status: {message}"));
    }
    DUMPS
        .iter()
        .find(|d| message.contains(**d))
        .map(|d| format!("{:?} whose message holds a debug dump ({d}): {message}", status.code()))
}

/// What is wrong with how a call with `credential` was treated, if
/// anything: a missing or wrong credential must be Unauthenticated, a
/// person's token on a service-only RPC PermissionDenied.
pub fn auth_problem(method: &Method, credential: Credential, outcome: &Outcome) -> Option<String> {
    let required = agentry_runtime::auth::required_role(&method.path)?;
    let code = outcome.status.as_ref().map_or(Code::Ok, tonic::Status::code);
    if credential.is_bad() && code != Code::Unauthenticated {
        return Some(format!(
            "a call with a {} credential ended {code:?}, not Unauthenticated",
            credential.name()
        ));
    }
    if credential == Credential::Client && required == Role::Service && code != Code::PermissionDenied
    {
        return Some(format!(
            "the client token on a service-only RPC ended {code:?}, not PermissionDenied"
        ));
    }
    None
}

/// What is wrong with the messages of a successful call, if anything.
pub fn answer_problem(method: &Method, outcome: &Outcome) -> Option<String> {
    for (i, message) in outcome.responses.iter().enumerate() {
        if let Some(Err(e)) = crate::decode::debug(&method.output, message) {
            return Some(format!("answer message {i} does not decode as {}: {e}", method.output));
        }
    }
    None
}

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records every panic of the process (a handler's task, a background
/// task, the fuzzer), with where it happened, for [`take_panics`].
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        let frames: Vec<&str> = trace
            .lines()
            .filter(|l| l.contains("agentry"))
            .take(16)
            .collect();
        let thread = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        let text = format!("{info} (thread {thread})\n{}", frames.join("\n"));
        PANICS.lock().unwrap_or_else(|e| e.into_inner()).push(text);
    }));
}

/// The panics since the last call.
pub fn take_panics() -> Vec<String> {
    std::mem::take(&mut *PANICS.lock().unwrap_or_else(|e| e.into_inner()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_judged() {
        assert!(status_problem(&tonic::Status::not_found("no session x")).is_none());
        assert!(status_problem(&tonic::Status::internal("")).is_some());
        assert!(status_problem(&tonic::Status::unknown("boom")).is_some());
        let dump = tonic::Status::internal("io: Os { code: 2, kind: NotFound }");
        assert!(status_problem(&dump).is_some());
    }

    #[test]
    fn findings_with_other_numbers_are_the_same() {
        let f = |detail: &str| Finding {
            rpc: "A/B".into(),
            kind: "hang",
            detail: detail.into(),
            evidence: Evidence::None,
        };
        assert_eq!(f("seq 3 of \"x\"").key(), f("seq 41 of \"y\"").key());
        assert_ne!(f("seq 3").key(), f("a gap").key());
    }
}
