//! Streaming chat client with tool calls, for OpenAI-compatible servers and Ollama's native API.
//!
//! [`ChatClient::stream`] posts a streaming request — to `{base_url}/chat/completions` for
//! [`Provider::OpenAi`] (server-sent events), to `{base_url}/api/chat` for [`Provider::Ollama`]
//! (newline-delimited JSON) — and returns a [`ChatStream`] of [`StreamEvent::TextDelta`]s
//! followed by one [`StreamEvent::Completed`] holding the assembled text, tool calls, finish
//! reason and token usage. Failures before the first event are retried with exponential
//! backoff (see [`ProviderConfig::max_retries`]).
//!
//! It owns the model wire protocols and nothing of the agent: it must not
//! depend on the services, the proto types or the runtime; the orchestrator
//! decides what is sent.

mod anthropic;
mod assemble;
mod client;
mod config;
mod error;
mod limits;
mod ollama;
mod openai;
mod retry;
mod sse;
mod types;
mod window;

pub use client::{ChatClient, ChatStream};
pub use config::{Provider, ProviderConfig};
pub use error::LlmError;
pub use limits::ResponseLimits;
pub use types::{
    ChatRequest, Completion, Image, Message, StreamEvent, ToolCall, ToolDefinition, Usage,
};
pub use window::{ServerWindow, WindowKind};
