//! Test support for Agentry: a fake OpenAI-compatible model server that
//! speaks the real wire protocol ([`fake_model`]), and a harness that runs
//! every service in-process on ephemeral loopback ports ([`cluster`]).

pub mod cluster;
pub mod fake_crawl4ai;
pub mod fake_model;
mod http_server;

pub use cluster::Cluster;
pub use fake_model::{FakeModel, Reply};
