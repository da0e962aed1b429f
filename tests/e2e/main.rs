//! End-to-end tests: every service runs for real (in-process, on loopback
//! ports, talking gRPC over TCP), the model is the test kit's fake server
//! speaking OpenAI's streaming wire format, and bash really runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod approvals;
mod chat_turn;
mod checkpoints;
mod compaction;
mod durable_writes;
mod failures;
mod mcp;
mod notify;
mod plan;
mod reminders;
mod skillsets;
mod small_windows;
mod text_calls;
mod turn_control;
mod unloading;
mod web;
