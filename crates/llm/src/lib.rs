//! OpenAI-compatible chat-completions client with streaming text and tool calls.
//!
//! [`ChatClient::stream`] posts a request with `"stream": true` to
//! `{base_url}/chat/completions` and returns a [`ChatStream`] of [`StreamEvent::TextDelta`]s
//! followed by one [`StreamEvent::Completed`] holding the assembled text, tool calls, finish
//! reason and token usage.

mod assemble;
mod client;
mod error;
mod types;

pub use client::{ChatClient, ChatStream, ProviderConfig};
pub use error::LlmError;
pub use types::{ChatRequest, Completion, Message, StreamEvent, ToolCall, ToolDefinition, Usage};
