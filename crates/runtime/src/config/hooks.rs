//! Hooks: commands a person configures to run at points of a session
//! (`[[hooks]]`). A `before_tool` hook may tighten the policy's decision on
//! a call (deny, ask) or skip a confirmation it asked for (allow), never
//! lift a DENY; an `after_tool` hook may add context to what the model sees;
//! the others are notifications. How they run and what they may answer is
//! the orchestrator's (`agentry_orchestrator::hooks`); here is only their
//! configuration and its checks.

use super::{Config, ConfigError};
use serde::Deserialize;

/// Longest a hook may be given to run.
pub const MAX_HOOK_TIMEOUT_SECS: u64 = 600;

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

impl Config {
    /// Checks the `[[hooks]]` entries.
    pub(super) fn check_hooks(&self, label: &str) -> Result<(), ConfigError> {
        for (i, hook) in self.hooks.iter().enumerate() {
            let invalid = |reason: String| ConfigError::Invalid {
                source_name: label.to_string(),
                reason: format!(
                    "hooks[{i}] ({} {:?}): {reason}",
                    hook.event.name(),
                    hook.command
                ),
            };
            if hook.command.trim().is_empty() {
                return Err(invalid("command must not be empty".into()));
            }
            if hook.timeout_secs == 0 || hook.timeout_secs > MAX_HOOK_TIMEOUT_SECS {
                return Err(invalid(format!(
                    "timeout_secs must be between 1 and {MAX_HOOK_TIMEOUT_SECS}, not {}",
                    hook.timeout_secs
                )));
            }
            if hook.matcher.trim().is_empty() {
                return Err(invalid(
                    "matcher must not be empty (\"*\" matches every tool)".into(),
                ));
            }
            if let Err(e) = globset::Glob::new(&hook.matcher) {
                return Err(invalid(format!(
                    "matcher {:?} is not a glob: {e}",
                    hook.matcher
                )));
            }
        }
        Ok(())
    }
}
