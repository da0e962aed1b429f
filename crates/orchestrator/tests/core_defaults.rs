//! The agent core reads no configuration; its defaults must still say what
//! `config/default.toml` says, or a session built without settings would
//! behave unlike a configured one.

use agentry_orchestrator::{plan, prompt::View};
use agentry_runtime::Config;

#[test]
fn the_cores_defaults_are_the_built_in_configurations() {
    let agent = &Config::builtin().agent;
    let view = View::default();
    assert_eq!(view.loop_repeats, agent.loop_repeats);
    assert_eq!(view.no_progress_steps, agent.no_progress_steps);
    assert_eq!(view.compaction.enabled, agent.compaction);
    assert_eq!(view.compaction.threshold, agent.compaction_threshold);
    assert_eq!(
        view.compaction.keep_last,
        agent.compaction_keep_messages as usize
    );
    assert_eq!(plan::DEFAULT_MAX_STEPS, agent.plan_max_steps);
}
