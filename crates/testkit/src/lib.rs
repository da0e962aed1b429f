//! The whole-cluster test harness: every service in-process on ephemeral
//! loopback ports ([`cluster`]), with the wire fakes of `agentry-fakes`
//! (re-exported here) standing in for the model server and Crawl4AI.
//!
//! It depends on every service crate; tests of one client crate should use
//! `agentry-fakes` alone.
//! Nothing but tests and benchmarks may depend on it.

pub mod cluster;
pub mod rng;

pub use agentry_fakes::{FakeModel, Reply, fake_crawl4ai, fake_model, mcp_servers, postgres};
pub use cluster::Cluster;
