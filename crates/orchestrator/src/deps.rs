//! What every session actor shares: clients of the other services and of
//! the model, and the agent's settings.

use crate::reducer::ToolFlags;
use crate::runners::RunnerPool;
use agentry_llm::{ChatClient, ToolDefinition};
use agentry_policy::Policy;
use agentry_proto::scheduler::v1::scheduler_client::SchedulerClient;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_runtime::telemetry::TracedChannel;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::RwLock;

/// Shared dependencies of the session actors.
pub struct Deps {
    /// The session store.
    pub store: SessionStoreClient<TracedChannel>,
    /// Where the session store is, for messages.
    pub store_url: String,
    /// The tool runner replicas.
    pub runners: Arc<RunnerPool>,
    /// The scheduler (reminders).
    pub scheduler: SchedulerClient<TracedChannel>,
    /// Where the scheduler is, for messages.
    pub scheduler_url: String,
    /// The model.
    pub llm: ChatClient,
    /// System instructions.
    pub system_prompt: String,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Model calls allowed per turn.
    pub max_steps: u32,
    /// How long an append keeps retrying while the store is unavailable.
    pub store_retry_window: Duration,
    /// The tool-call policy.
    pub policy: Arc<Policy>,
    /// The orchestrator's metrics.
    pub metrics: Arc<agentry_runtime::metrics::Registry>,
    /// What the model can do.
    pub profile: agentry_runtime::config::ModelProfile,
    /// Instructions per kind of request.
    pub skillsets: crate::skillsets::Skillsets,
    /// When and how conversations are compacted.
    pub compaction: crate::compaction::Settings,
    /// How the model's tokens are counted.
    pub tokenizer: crate::compaction::Tokenizer,
    /// Plan steps a plan-mode turn may start.
    pub plan_max_steps: u32,
    tool_cache: RwLock<Option<Arc<ToolSet>>>,
}

/// The tools the model may call.
#[derive(Debug, Default)]
pub struct ToolSet {
    /// As offered to the model.
    pub definitions: Vec<ToolDefinition>,
    /// Their flags, by name.
    pub flags: BTreeMap<String, ToolFlags>,
    /// The tokens the definitions take, counted once.
    tokens: std::sync::OnceLock<usize>,
}

impl ToolSet {
    /// The tokens the definitions take in a request.
    pub fn tokens(&self, tokenizer: &crate::compaction::Tokenizer) -> usize {
        *self
            .tokens
            .get_or_init(|| tokenizer.definitions(&self.definitions))
    }

    fn add_builtins(&mut self) {
        for (definition, flags) in crate::builtin::definitions() {
            self.flags.insert(definition.name.clone(), flags);
            self.definitions.push(definition);
        }
    }
}

impl Deps {
    /// Bundles the dependencies.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: SessionStoreClient<TracedChannel>,
        store_url: String,
        runners: Arc<RunnerPool>,
        scheduler: SchedulerClient<TracedChannel>,
        scheduler_url: String,
        llm: ChatClient,
        system_prompt: String,
        temperature: Option<f32>,
        max_steps: u32,
        policy: Arc<Policy>,
    ) -> Self {
        Deps {
            store,
            store_url,
            runners,
            scheduler,
            scheduler_url,
            llm,
            system_prompt,
            temperature,
            max_steps,
            store_retry_window: Duration::from_secs(10),
            policy,
            metrics: Arc::default(),
            profile: agentry_runtime::config::ModelProfile::fallback(),
            skillsets: crate::skillsets::Skillsets::default(),
            compaction: crate::compaction::Settings::default(),
            tokenizer: crate::compaction::Tokenizer::Estimate,
            plan_max_steps: crate::plan::default_max_steps(),
            tool_cache: RwLock::new(None),
        }
    }

    /// The tools as the model sees them, fetched from the runner once.
    pub async fn tools(&self) -> Arc<ToolSet> {
        if let Some(cached) = self.tool_cache.read().await.as_ref() {
            return cached.clone();
        }
        match self.fetch_tools().await {
            Ok(tools) => {
                let tools = Arc::new(tools);
                *self.tool_cache.write().await = Some(tools.clone());
                tools
            }
            Err(status) => {
                tracing::warn!(
                    url = %self.runners.configured,
                    error = %status.message(),
                    "cannot list the tool runner's tools; offering only the built-in ones"
                );
                let mut set = ToolSet::default();
                set.add_builtins();
                Arc::new(set)
            }
        }
    }

    /// Asks the tool runner for its tools.
    pub async fn fetch_tools(&self) -> Result<ToolSet, tonic::Status> {
        let response = self.runners.list_tools().await?;
        let mut set = ToolSet::default();
        for t in response.tools {
            if crate::builtin::is_builtin(&t.name) {
                tracing::warn!(
                    tool = %t.name,
                    "the tool runner offers a tool with the name of a built-in tool; the built-in one is used"
                );
                continue;
            }
            let parameters = serde_json::from_str(&t.parameters_json_schema).map_err(|e| {
                tonic::Status::internal(format!("tool {} has an invalid JSON schema: {e}", t.name))
            })?;
            set.flags.insert(
                t.name.clone(),
                ToolFlags {
                    read_only: t.read_only,
                    parallel_safe: t.parallel_safe,
                },
            );
            set.definitions.push(ToolDefinition {
                name: t.name,
                description: t.description,
                parameters,
            });
        }
        set.add_builtins();
        Ok(set)
    }
}
