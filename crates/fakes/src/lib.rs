//! Test doubles of the components Agentry talks to but cannot run here,
//! each speaking the real wire protocol so the real client code is what
//! talks to it: an OpenAI-compatible model server (SSE; also Ollama's
//! NDJSON) in [`fake_model`], and the Crawl4AI REST API in
//! [`fake_crawl4ai`].
//!
//! A leaf crate: it must not depend on any Agentry crate, so the client
//! crates' tests (`agentry-llm`, `agentry-tool-runner`) build without the
//! services. The whole-cluster harness is `agentry-testkit`.

pub mod fake_crawl4ai;
pub mod fake_model;
mod http_server;
pub mod mcp_servers;
pub mod postgres;
pub mod protocol_clients;

pub use fake_model::{FakeModel, Reply};
