//! What every session actor shares: clients of the other services and of
//! the model, and what is last known of them (the runners' tools, the
//! model server's trouble). The agent's settings are apart, in
//! [`crate::settings::Settings`].

use crate::agents::Agents;
use crate::reducer::{Catalog, ToolFlags};
use crate::runners::RunnerPool;
use agentry_llm::{ChatClient, ToolDefinition};
use agentry_proto::scheduler::v1::scheduler_client::SchedulerClient;
use agentry_proto::sessions::v1 as spb;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_runtime::telemetry::TracedChannel;
use std::sync::Arc;
use tokio::sync::RwLock;
use tonic::Status;

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
    /// The model (replaced when the context window becomes known).
    llm: std::sync::RwLock<ChatClient>,
    /// The orchestrator's metrics.
    pub metrics: Arc<agentry_runtime::metrics::Registry>,
    tool_cache: RwLock<Option<(std::time::Instant, Arc<Catalog>)>>,
    /// The tools of the MCP servers sessions brought of their own, by
    /// session (kept while this process runs).
    session_tools: std::sync::RwLock<
        std::collections::HashMap<String, Vec<agentry_proto::tools::v1::ToolSpec>>,
    >,
    /// What is wrong with the model server, as last found ("unreachable",
    /// a model it does not list); `None` when nothing is known wrong.
    model_problem: std::sync::RwLock<Option<String>>,
    /// This replica among several (`None`: the only orchestrator).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// The streamed text of the sessions driven here, for their subscribers.
    pub live: Arc<crate::live::LiveHub>,
    /// Model calls in flight at once (`llm.max_concurrent_requests`; `None`:
    /// no limit). Its waiters are served first come, first served.
    pub model_gate: Option<Arc<tokio::sync::Semaphore>>,
    /// The events some `[[notify]]` webhook wants.
    pub notify_events: std::collections::BTreeSet<String>,
}

impl Deps {
    /// Bundles the clients.
    pub fn new(
        store: SessionStoreClient<TracedChannel>,
        store_url: String,
        runners: Arc<RunnerPool>,
        scheduler: SchedulerClient<TracedChannel>,
        scheduler_url: String,
        llm: ChatClient,
    ) -> Self {
        Deps {
            store,
            store_url,
            runners,
            scheduler,
            scheduler_url,
            llm: std::sync::RwLock::new(llm),
            metrics: Arc::default(),
            tool_cache: RwLock::new(None),
            session_tools: std::sync::RwLock::default(),
            model_problem: std::sync::RwLock::new(None),
            cluster: None,
            live: Arc::default(),
            model_gate: None,
            notify_events: Default::default(),
        }
    }

    /// A turn to call the model: at once without a limit, else when one of
    /// `llm.max_concurrent_requests` is free (held until dropped).
    pub async fn model_turn(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let gate = self.model_gate.clone()?;
        if gate.available_permits() == 0 {
            tracing::debug!("model calls at their limit; waiting for one to end");
        }
        gate.acquire_owned().await.ok()
    }

    /// The model client.
    pub fn llm(&self) -> ChatClient {
        self.llm
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Runs a hook's command on any tool runner.
    pub async fn run_hook(
        &self,
        request: agentry_proto::tools::v1::RunHookRequest,
    ) -> Result<agentry_proto::tools::v1::RunHookResponse, tonic::Status> {
        self.runners
            .on_any(|mut client| {
                let request = request.clone();
                async move {
                    client
                        .run_hook(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await
    }

    /// Has a runner remove what it keeps for a session (its scratch
    /// workspace, temp dir and project record).
    pub async fn forget_session(&self, session_id: &str) -> Result<(), tonic::Status> {
        let request = agentry_proto::tools::v1::ForgetSessionRequest {
            session_id: session_id.to_string(),
        };
        self.runners
            .on_any(|mut client| {
                let request = request.clone();
                async move { client.forget_session(request).await.map(|_| ()) }
            })
            .await
    }

    /// The instruction files a session is given: the person's own (at
    /// `own`), then its project's as a tool runner reads them (`request`
    /// names the session, or a directory for one not made yet).
    pub async fn instructions(
        &self,
        own: Option<&std::path::Path>,
        request: agentry_proto::tools::v1::ReadInstructionsRequest,
    ) -> Result<Vec<agentry_proto::sessions::v1::InstructionFile>, tonic::Status> {
        let mut files: Vec<_> = own.and_then(read_own_instructions).into_iter().collect();
        let project = self
            .runners
            .on_any(|mut client| {
                let request = request.clone();
                async move {
                    client
                        .read_instructions(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await?;
        files.extend(project.files);
        Ok(files)
    }

    /// Records what is wrong with the model server (`None`: nothing known).
    pub fn set_model_problem(&self, problem: Option<String>) {
        *self
            .model_problem
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = problem;
    }

    /// What is wrong with the model server, as last found.
    pub fn model_problem(&self) -> Option<String> {
        self.model_problem
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Asks the model server for a context window of `tokens` where the
    /// protocol can (Ollama's `num_ctx`).
    pub fn set_context_window(&self, tokens: usize) {
        let llm = self
            .llm()
            .with_context_window(u32::try_from(tokens).unwrap_or(u32::MAX));
        *self
            .llm
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = llm;
    }

    /// The tools as the model sees them (`delegate` when there are
    /// `agents`), from the runner, asked again when the last answer is
    /// older than [`TOOL_CACHE_TTL`] (MCP servers come and go, and change
    /// their tools); the same tools keep the same catalog.
    pub async fn tools(&self, agents: &Agents) -> Arc<Catalog> {
        let cached = self.tool_cache.read().await.clone();
        if let Some((at, catalog)) = &cached
            && at.elapsed() < TOOL_CACHE_TTL
        {
            return catalog.clone();
        }
        match self.fetch_tools(agents).await {
            Ok(tools) => {
                let tools = match cached {
                    Some((_, old)) if *old == tools => old,
                    _ => Arc::new(tools),
                };
                *self.tool_cache.write().await = Some((std::time::Instant::now(), tools.clone()));
                tools
            }
            Err(status) => {
                if let Some((_, catalog)) = cached {
                    tracing::debug!(error = %status.message(), "cannot list the tool runner's tools again; offering the last list");
                    return catalog;
                }
                tracing::warn!(
                    url = %self.runners.configured,
                    error = %status.message(),
                    "cannot list the tool runner's tools; offering only the built-in ones"
                );
                let mut catalog = Catalog::default();
                add_builtins(&mut catalog);
                Arc::new(catalog)
            }
        }
    }

    /// Records the tools of the servers `session_id` brought (none: it
    /// brings none any more).
    pub fn set_session_tools(
        &self,
        session_id: &str,
        tools: Vec<agentry_proto::tools::v1::ToolSpec>,
    ) {
        let mut map = self
            .session_tools
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if tools.is_empty() {
            map.remove(session_id);
        } else {
            map.insert(session_id.to_string(), tools);
        }
    }

    /// `tools` with the tools of the servers `session_id` brought added
    /// (those whose names are taken already are left out); `tools` itself
    /// when it brought none.
    pub fn with_session_tools(&self, session_id: &str, tools: Arc<Catalog>) -> Arc<Catalog> {
        let extra = self
            .session_tools
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(session_id)
            .cloned();
        let Some(extra) = extra else { return tools };
        let mut catalog = (*tools).clone();
        for t in extra {
            if catalog.flags.contains_key(&t.name) {
                continue;
            }
            if let Err(why) = add_spec(&mut catalog, t) {
                tracing::warn!(session_id, error = %why.message(), "a tool of a server the session brought is left out");
            }
        }
        Arc::new(catalog)
    }

    /// Makes the next [`Deps::tools`] ask the runner again (the same tools
    /// still give the same catalog).
    pub async fn forget_tools(&self) {
        if let Some((at, _)) = self.tool_cache.write().await.as_mut() {
            *at = std::time::Instant::now() - TOOL_CACHE_TTL;
        }
    }

    /// Asks the tool runner for its tools.
    pub async fn fetch_tools(&self, agents: &Agents) -> Result<Catalog, tonic::Status> {
        let response = self.runners.list_tools().await?;
        let mut set = Catalog::default();
        for t in response.tools {
            if crate::builtin::own().has_own(&t.name) {
                tracing::warn!(
                    tool = %t.name,
                    "the tool runner offers a tool with the name of a built-in tool; the built-in one is used"
                );
                continue;
            }
            add_spec(&mut set, t)?;
        }
        add_builtins(&mut set);
        if !agents.is_empty() {
            let (definition, flags) = agents.delegate_tool(&set);
            set.add(definition, flags);
        }
        if !response.mcp_servers.is_empty()
            && let Some(subscribe) = crate::builtin::own().get(crate::builtin::MCP_SUBSCRIBE)
        {
            let (definition, flags) = crate::builtin::offered(subscribe.spec());
            set.add(definition, flags);
        }
        Ok(set)
    }
}

/// Adds a runner's tool to `catalog`, or says why its schema cannot be read.
fn add_spec(
    catalog: &mut Catalog,
    t: agentry_proto::tools::v1::ToolSpec,
) -> Result<(), tonic::Status> {
    let parameters = serde_json::from_str(&t.parameters_json_schema).map_err(|e| {
        tonic::Status::internal(format!("tool {} has an invalid JSON schema: {e}", t.name))
    })?;
    catalog.add(
        ToolDefinition {
            name: t.name,
            description: t.description,
            parameters,
        },
        ToolFlags {
            read_only: t.read_only,
            parallel_safe: t.parallel_safe,
            read_only_hint: t.read_only_hint,
            network: t.network,
        },
    );
    Ok(())
}

/// How long a list of the runner's tools is used before it is asked for
/// again.
pub const TOOL_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(2);

/// The orchestrator's own tools offered whatever the runners have (after
/// the runners' tools); `delegate` and `mcp_subscribe` are added when there
/// are agents and MCP servers.
fn add_builtins(catalog: &mut Catalog) {
    let conditional = [crate::agents::DELEGATE, crate::builtin::MCP_SUBSCRIBE];
    for spec in crate::builtin::own().specs() {
        if !conditional.contains(&spec.name.as_str()) {
            let (definition, flags) = crate::builtin::offered(&spec);
            catalog.add(definition, flags);
        }
    }
}

impl Deps {
    /// A session's whole log.
    pub async fn read_log(&self, session_id: &str) -> Result<Vec<spb::Event>, Status> {
        Ok(self.read_pages(session_id, false).await?.1)
    }

    /// A session's checkpoint, when it has one, and the events of its log
    /// after it (the whole log when it has none).
    pub async fn read_after_checkpoint(
        &self,
        session_id: &str,
    ) -> Result<(Option<spb::Checkpoint>, Vec<spb::Event>), Status> {
        self.read_pages(session_id, true).await
    }

    /// A session's log page by page, from its start or (`from_checkpoint`)
    /// from after its checkpoint.
    async fn read_pages(
        &self,
        session_id: &str,
        from_checkpoint: bool,
    ) -> Result<(Option<spb::Checkpoint>, Vec<spb::Event>), Status> {
        let mut events = Vec::new();
        let mut checkpoint = None;
        let mut from = 1;
        loop {
            let page = self
                .store
                .clone()
                .read(spb::ReadRequest {
                    session_id: session_id.to_string(),
                    from_seq: from,
                    limit: 0,
                    from_checkpoint: from_checkpoint && from == 1,
                })
                .await
                .map_err(|s| crate::service::store_status(&self.store_url, s))?
                .into_inner();
            from = page.next_seq;
            if page.checkpoint.is_some() {
                checkpoint = page.checkpoint;
            }
            events.extend(page.events);
            if !page.has_more {
                return Ok((checkpoint, events));
            }
        }
    }

    /// Every session (every one with an open turn, when asked), most
    /// recently updated first.
    pub async fn all_sessions(
        &self,
        only_open_turns: bool,
    ) -> Result<Vec<agentry_proto::sessions::v1::Session>, tonic::Status> {
        let mut sessions = Vec::new();
        loop {
            let page = self
                .store
                .clone()
                .list_sessions(agentry_proto::sessions::v1::ListSessionsRequest {
                    limit: 1000,
                    offset: sessions.len() as u32,
                    only_open_turns,
                })
                .await
                .map_err(|s| crate::service::store_status(&self.store_url, s))?
                .into_inner();
            let done = page.sessions.is_empty()
                || sessions.len() as u64 + page.sessions.len() as u64 >= page.total;
            sessions.extend(page.sessions);
            if done {
                return Ok(sessions);
            }
        }
    }
}

/// The person's own instruction file, if there is one (cut like a
/// project's).
fn read_own_instructions(
    path: &std::path::Path,
) -> Option<agentry_proto::sessions::v1::InstructionFile> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let size = file.metadata().ok().filter(|m| m.is_file())?.len();
    let limit = crate::prompt::MAX_INSTRUCTIONS_BYTES as u64;
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes).ok()?;
    Some(agentry_proto::sessions::v1::InstructionFile {
        path: path.display().to_string(),
        text: String::from_utf8_lossy(&bytes).into_owned(),
        truncated: size > limit,
        size,
    })
}
