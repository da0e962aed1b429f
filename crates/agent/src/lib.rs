//! The agent's pure core: what a session decides, not how it is carried
//! out. The session reducer ([`reducer`]) folds inputs into state, events
//! and effects; [`prompt`] builds what the model is sent from the state;
//! [`plan`], [`hooks`], [`textcalls`], [`tokens`], [`rewind`], [`inbox`]
//! and [`skillsets`] are the decisions it needs on the way.
//!
//! This crate has no async runtime, no gRPC and no clock (the time of an
//! input is passed in with it): its dependencies say so, and `cargo tree -p
//! agentry-agent -e normal` shows no tokio, tonic or hyper. Settings come in
//! as values ([`prompt::Settings`], [`prompt::View`]); the core reads no
//! configuration file and keeps no global state. The orchestrator's actor
//! executes the [`reducer::Effect`]s it returns.

pub mod hooks;
pub mod inbox;
pub mod plan;
pub mod prompt;
pub mod questions;
pub mod reducer;
pub mod rewind;
pub mod settings;
pub mod skillsets;
pub mod textcalls;
pub mod tokens;

#[cfg(test)]
mod reducer_tests;
