//! The settings the agent core takes from the configuration whose types it
//! owns: hooks and model prices. The services' configuration
//! (`agentry_runtime::config`) holds them as its `[[hooks]]` and
//! `[[model_prices]]` sections and checks them when it loads.

use agentry_proto::sessions::v1 as pb;
use serde::Deserialize;

/// When a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookEvent {
    /// Before a tool call runs, once its arguments are valid: may deny it,
    /// ask a person about it, or allow what the policy would ask about.
    BeforeTool,
    /// After a tool call finished, before the model sees its result: may
    /// add context to it.
    AfterTool,
    /// A person's message started a turn.
    UserMessage,
    /// A turn ended.
    TurnFinished,
    /// A session's first turn started.
    SessionStart,
}

impl HookEvent {
    /// The name used in the configuration and in the hook's input.
    pub fn name(self) -> &'static str {
        match self {
            HookEvent::BeforeTool => "before_tool",
            HookEvent::AfterTool => "after_tool",
            HookEvent::UserMessage => "user_message",
            HookEvent::TurnFinished => "turn_finished",
            HookEvent::SessionStart => "session_start",
        }
    }

    /// Whether the hook is about one tool call (and its matcher applies).
    pub fn is_tool_event(self) -> bool {
        matches!(self, HookEvent::BeforeTool | HookEvent::AfterTool)
    }
}

fn default_matcher() -> String {
    "*".to_string()
}

fn default_timeout() -> u64 {
    10
}

/// One `[[hooks]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// When it runs.
    pub event: HookEvent,
    /// For tool events: the tools it runs for, a glob over tool names
    /// (`bash`, `*_file`, `*`); ignored for the other events.
    #[serde(default = "default_matcher")]
    pub matcher: String,
    /// The command, run with `bash -c` in the session's sandbox; it gets the
    /// event as one JSON object on standard input.
    pub command: String,
    /// Longest it may run; it is killed (with every process it started)
    /// after that, and the call follows the policy alone.
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
}

/// What a family of models costs, per million tokens.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// A glob on the model name, as for profiles.
    pub pattern: String,
    /// Per million prompt tokens.
    pub input: f64,
    /// Per million generated tokens.
    pub output: f64,
    /// Per million prompt tokens read from the server's prompt cache; unset:
    /// the same as `input`.
    #[serde(default)]
    pub cached_input: Option<f64>,
    /// Per million prompt tokens written to the server's prompt cache;
    /// unset: the same as `input`.
    #[serde(default)]
    pub cache_write: Option<f64>,
    /// The currency of the prices; unset: USD.
    #[serde(default)]
    pub currency: Option<String>,
}

impl ModelPrice {
    /// What a model call with this usage costs: prompt tokens read from the
    /// cache at `cached_input`, written to it at `cache_write`, the rest at
    /// `input`; completion tokens at `output`.
    pub fn cost(&self, usage: &pb::TokenUsage) -> f64 {
        let prompt = usage.prompt_tokens;
        let cached = usage.cached_prompt_tokens.min(prompt);
        let written = usage.cache_write_prompt_tokens.min(prompt - cached);
        let fresh = (prompt - cached - written) as f64 * self.input;
        let cached = cached as f64 * self.cached_input.unwrap_or(self.input);
        let written = written as f64 * self.cache_write.unwrap_or(self.input);
        (fresh + cached + written + usage.completion_tokens as f64 * self.output) / 1_000_000.0
    }

    /// The currency of the prices.
    pub fn currency(&self) -> &str {
        self.currency.as_deref().unwrap_or("USD")
    }
}
