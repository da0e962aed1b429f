//! Streaming chat client with tool calls, for OpenAI-compatible servers and Ollama's native API.
//!
//! [`ChatClient::stream`] posts a streaming request — to `{base_url}/chat/completions` for
//! [`Provider::OpenAi`] (server-sent events), to `{base_url}/api/chat` for [`Provider::Ollama`]
//! (newline-delimited JSON) — and returns a [`ChatStream`] of [`StreamEvent::TextDelta`]s
//! followed by one [`StreamEvent::Completed`] holding the assembled text, tool calls, finish
//! reason and token usage. Failures before the first event are retried with exponential
//! backoff (see [`ProviderConfig::max_retries`]).
//!
//! Without the default `client` feature only the message types are built
//! (no HTTP, no async runtime), for the pure agent core.
//!
//! It owns the model wire protocols and nothing of the agent: it must not
//! depend on the services, the proto types or the runtime; the orchestrator
//! decides what is sent.

#[cfg(feature = "client")]
mod anthropic;
#[cfg(feature = "client")]
mod assemble;
#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
mod config;
#[cfg(feature = "client")]
mod error;
#[cfg(feature = "client")]
mod limits;
#[cfg(feature = "client")]
mod ollama;
#[cfg(feature = "client")]
mod openai;
#[cfg(feature = "client")]
mod retry;
#[cfg(feature = "client")]
mod sse;
mod types;
#[cfg(feature = "client")]
mod window;

#[cfg(feature = "client")]
pub use client::{ChatClient, ChatStream};
#[cfg(feature = "client")]
pub use config::{Provider, ProviderConfig};
#[cfg(feature = "client")]
pub use error::LlmError;
#[cfg(feature = "client")]
pub use limits::ResponseLimits;
pub use types::{
    ChatRequest, Completion, Image, Message, StreamEvent, ToolCall, ToolDefinition, Usage,
};
#[cfg(feature = "client")]
pub use window::{ServerWindow, WindowKind};
