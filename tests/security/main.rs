//! The hostile-input suite: what an attacker who controls the model's
//! output, a file or a web page (or a process on the same machine) tries,
//! run against the real services. Every case must be refused.
//!
//! Run with `cargo test -p agentry-tests --test security`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../e2e/support.rs"]
#[allow(dead_code)]
mod support;

mod auth;
mod flood;
mod huge_values;
mod model_output;
mod network;
mod people;
mod policy;
mod race;
mod secrets;
mod shell;
mod tls;
