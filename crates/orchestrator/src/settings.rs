//! How this orchestrator runs sessions: built once from the configuration
//! ([`Settings::from_config`]) and handed to the service, its session
//! actors and the tasks they start. The clients of the other services are
//! apart, in [`crate::deps::Deps`].

use crate::agents::Agents;
use crate::reducer::SessionState;
use crate::{RunError, compaction, hooks, prompt, skillsets, window};
use agentry_policy::Policy;
use agentry_proto::sessions::v1 as spb;
use agentry_runtime::Config;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

/// The agent's settings, shared by every session driven here.
pub struct Settings {
    /// What shapes every model request (system prompt, skillsets, tool
    /// calling, token counting, compaction, temperature); replaced when the
    /// context window becomes known, for the sessions loaded after.
    view: RwLock<Arc<prompt::View>>,
    /// Model calls allowed per turn.
    pub max_steps: u32,
    /// Plan steps a plan-mode turn may start.
    pub plan_max_steps: u32,
    /// The tool-call policy.
    pub policy: Arc<Policy>,
    /// The agents tasks can be delegated to.
    pub agents: Agents,
    /// How long an append keeps retrying while the store is unavailable.
    pub store_retry_window: Duration,
    /// Sessions may bring MCP servers of their own (`mcp.session_servers`).
    pub session_mcp_servers: bool,
    /// A session with nothing running is unloaded after this long
    /// (`orchestrator.unload_idle_secs`; `None`: kept until the process
    /// ends); its next input loads it again from its log.
    pub unload_idle: Option<Duration>,
    /// An idle session writes a checkpoint once this many events were
    /// appended since its last one (`orchestrator.checkpoint_every_events`;
    /// 0: never).
    pub checkpoint_every: u64,
}

impl Settings {
    /// Settings with `view`, `max_steps` and `policy`, no agents and the
    /// defaults for the rest.
    pub fn new(view: prompt::View, max_steps: u32, policy: Arc<Policy>) -> Self {
        Settings {
            view: RwLock::new(Arc::new(view)),
            max_steps,
            plan_max_steps: crate::plan::default_max_steps(),
            policy,
            agents: Agents::default(),
            store_retry_window: Duration::from_secs(10),
            session_mcp_servers: true,
            unload_idle: None,
            checkpoint_every: 0,
        }
    }

    /// The settings the configuration describes; the context window is
    /// the model profile's until the model server says (see
    /// [`Settings::set_context_window`]).
    pub fn from_config(config: &Config) -> Result<Self, RunError> {
        let policy = Policy::from_config(&config.policy)?;
        let mut settings = Settings::new(view(config)?, config.agent.max_steps, Arc::new(policy));
        settings.plan_max_steps = config.agent.plan_max_steps;
        settings.agents = Agents::new(config.agents()?, config.agent.max_parallel_agents);
        settings.session_mcp_servers = config.mcp.session_servers;
        settings.unload_idle = (config.orchestrator.unload_idle_secs > 0)
            .then(|| Duration::from_secs(config.orchestrator.unload_idle_secs));
        settings.checkpoint_every = config.orchestrator.checkpoint_every_events;
        Ok(settings)
    }

    /// What shapes model requests now.
    pub fn view(&self) -> Arc<prompt::View> {
        self.view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Plans requests for a context window of `tokens` (`source` says
    /// where that number comes from); sessions loaded from now on use it.
    pub fn set_context_window(&self, tokens: usize, source: String) {
        let mut view = (*self.view()).clone();
        view.lean = tokens <= prompt::lean::LEAN_WINDOW;
        view.compaction.context_window = tokens;
        view.compaction.window_source = source;
        *self.view.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(view);
    }

    /// The state a session's log gives, with these settings.
    pub fn replayed(&self, events: &[spb::Event]) -> SessionState {
        self.fresh().replayed(events)
    }

    /// A sub-agent's session rebuilt from its log: the agent's view and
    /// step limit.
    pub fn replayed_as(&self, agent: &crate::agents::Agent, events: &[spb::Event]) -> SessionState {
        self.fresh_as(agent).replayed(events)
    }

    /// A new session's state with these settings: what a replay starts from.
    pub fn fresh(&self) -> SessionState {
        SessionState::new(self.max_steps)
            .with_policy(self.policy.clone())
            .with_plan_max_steps(self.plan_max_steps)
            .with_view(self.view())
    }

    /// [`Settings::fresh`] for a sub-agent's session: the agent's view and
    /// step limit.
    pub fn fresh_as(&self, agent: &crate::agents::Agent) -> SessionState {
        SessionState::new(agent.def.max_steps.unwrap_or(self.max_steps))
            .with_policy(self.policy.clone())
            .with_plan_max_steps(self.plan_max_steps)
            .with_view(Arc::new(agent.view(&self.view())))
    }
}

/// What shapes model requests, as the configuration says, planned for the
/// model profile's context window.
fn view(config: &Config) -> Result<prompt::View, RunError> {
    let system_prompt = config.system_prompt()?;
    let profile = config.model_profile();
    let tokenizer = compaction::Tokenizer::for_model(&config.llm.model, &profile.tokenizer);
    let context_window = compaction::context_window(&config.llm.model, profile.context_window);
    tracing::info!(
        model = %config.llm.model,
        pattern = %profile.pattern,
        native_tools = profile.native_tools,
        context_window,
        tokenizer = tokenizer.name(),
        "model profile"
    );
    let user_dir = (!config.agent.skillsets_dir.is_empty())
        .then(|| std::path::PathBuf::from(&config.agent.skillsets_dir));
    Ok(prompt::View {
        system_prompt,
        skillsets: skillsets::Skillsets::load(
            config.agent.skillsets,
            config.config_dir.as_deref(),
            user_dir.as_deref(),
        ),
        native: profile.native_tools,
        images: config.llm.images,
        catalogs: Arc::default(),
        tokenizer,
        compaction: prompt::Settings {
            enabled: config.agent.compaction,
            threshold: config.agent.compaction_threshold,
            keep_last: config.agent.compaction_keep_messages as usize,
            context_window,
            window_source: window::planned_source(profile.context_window),
        },
        temperature: profile.temperature.or(config.llm.temperature),
        price: config.model_price(),
        lean: context_window <= prompt::lean::LEAN_WINDOW,
        require_first_tool: config.llm.tool_choice == agentry_runtime::config::ToolChoice::Required,
        loop_repeats: config.agent.loop_repeats,
        no_progress_steps: config.agent.no_progress_steps,
        budget: spb::Budget {
            turn_tokens: config.agent.turn_token_budget,
            session_tokens: config.agent.session_token_budget,
            turn_cost: config.agent.turn_cost_budget,
            session_cost: config.agent.session_cost_budget,
        },
        park_on_budget: config.agent.on_budget == agentry_runtime::config::OnBudget::Park,
        hooks: Arc::new(hooks::Hooks::new(&config.hooks).map_err(RunError::Hooks)?),
        only_offered: false,
        own_instructions: config.config_dir.as_ref().map(|d| d.join("AGENTS.md")),
    })
}
