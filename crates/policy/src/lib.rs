//! The tool-call security policy: every tool call the model makes is
//! classified [`Decision::Allow`], [`Decision::Deny`] or
//! [`Decision::Confirm`] (ask a person) by a [`Policy`] built from the
//! `[policy]` section of the configuration ([`PolicyConfig`]).
//!
//! Pure and synchronous: no I/O, no async runtime, no service types, so the
//! orchestrator, tests and fuzzers use it alike. It owns:
//! - [`config`]: the rules as configured (deserialized by the runtime's
//!   configuration loader);
//! - [`rules`]: compiled rules, verdicts, session allowances, network;
//! - `shell`: reading a bash command line into *segments* with a real shell
//!   parser (`brush-parser`);
//! - `args`: what the commands an allow rule knows may be given.
//!
//! It must not depend on the services, gRPC, tokio or the proto types.
//!
//! Shell commands given to `bash` are parsed with a real shell parser; every
//! simple command found anywhere in the line (pipelines, lists, subshells,
//! groups, command substitutions, compound commands, function bodies,
//! `bash -c` strings, `eval` arguments, commands run by wrappers such as
//! `env` or `sudo`) is a *segment*, classified on its own; the call is only
//! as permissive as its strictest segment. Anything the policy cannot read
//! with confidence (the parser rejects it, the command name is computed, it
//! nests too deeply) is at least confirmed.

pub mod approvals;
mod args;
pub mod config;
pub mod rules;
mod shell;
pub mod suggest;

pub use approvals::{Approver, Need};
pub use config::{PolicyConfig, PolicyDecision, PolicyRule};
pub use rules::{Policy, PolicyError, SessionRule, Verdict, session_rules_for};

/// What a policy does with a tool call.
pub use config::PolicyDecision as Decision;

/// The tool whose calls are shell command lines.
const BASH: &str = "bash";

#[cfg(test)]
mod tests;
