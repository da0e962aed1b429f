//! Hooks: commands a person configures to run at points of a session
//! (`[[hooks]]`). A `before_tool` hook may tighten the policy's decision on
//! a call (deny, ask) or skip a confirmation it asked for (allow), never
//! lift a DENY; an `after_tool` hook may add context to what the model sees;
//! the others are notifications. What they may answer is the agent core's
//! (`agentry_agent::hooks`), running them the orchestrator's; the types of
//! their configuration are the core's too (`agentry_agent::settings`). Here
//! are only its checks.

use super::{Config, ConfigError};

/// Longest a hook may be given to run.
pub const MAX_HOOK_TIMEOUT_SECS: u64 = 600;

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
