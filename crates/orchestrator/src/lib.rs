//! The orchestrator: one actor per session runs the agent's state machine
//! (a pure reducer, [`reducer`]) and performs its effects ([`actor`]):
//! calling the model, running tools on the tool runner, and appending every
//! event to the session store before anyone sees it.
//!
//! It owns the agent's decisions (the reducer, the policy's application,
//! prompts, compaction) and talks to the other services only through their
//! gRPC contracts: it must not depend on another service's crate. The policy
//! itself is the pure `agentry-policy` crate.

pub mod actor;
pub mod agents;
pub mod attachments;
pub mod builtin;
pub mod cluster;
pub mod compaction;
pub mod deps;
pub mod errors;
pub mod forks;
pub mod live;
pub mod mcp_updates;
pub mod metrics;
pub mod notifications;
pub mod reminders;
pub mod remote_agent;
pub mod runners;
pub mod service;
pub mod settings;
pub mod window;

// The pure core, under the names the shell has always used for it.
pub use agentry_agent::{
    hooks, inbox, plan, prompt, reducer, rewind, skillsets, textcalls, tokens,
};
pub use deps::Deps;
pub use service::Sessions;
/// The gRPC service is the sessions handle itself.
pub use service::Sessions as OrchestratorService;
pub use settings::Settings;

use agentry_llm::{ChatClient, ProviderConfig};
use agentry_proto::orchestrator::v1::orchestrator_server::OrchestratorServer;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_runtime::Auth;
use agentry_runtime::Config;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::service::Routes;

/// Why the orchestrator could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Another service's address is unusable.
    #[error("{service}: {source}")]
    Service {
        /// Which one (its configuration key).
        service: &'static str,
        /// Why.
        source: agentry_runtime::auth::AuthError,
    },
    /// The tool runners' addresses are unusable.
    #[error("tool_runner.url: {0}")]
    Runners(errors::SettingError),
    /// The model client cannot be set up.
    #[error(transparent)]
    Model(#[from] agentry_llm::LlmError),
    /// The system prompt cannot be read.
    #[error(transparent)]
    SystemPrompt(#[from] agentry_runtime::ConfigError),
    /// A hook's configuration is invalid.
    #[error("hooks: {0}")]
    Hooks(String),
    /// The policy's rules are invalid (the cause says which; it is not
    /// repeated in this message, which error chains print before it).
    #[error("invalid policy")]
    Policy(#[from] agentry_policy::PolicyError),
    /// The metrics endpoint cannot be served.
    #[error("{0}")]
    Metrics(String),
    /// A setting is unusable.
    #[error(transparent)]
    Config(#[from] errors::SettingError),
    /// Serving failed.
    #[error(transparent)]
    Serve(#[from] agentry_runtime::ServeError),
}
/// The model client the configuration describes (`[llm]`), as the
/// orchestrator and `agentry doctor` use it.
pub fn llm_client(config: &Config) -> Result<ChatClient, agentry_llm::LlmError> {
    Ok(ChatClient::new(ProviderConfig {
        provider: match config.llm.provider {
            agentry_runtime::config::LlmProvider::Openai => agentry_llm::Provider::OpenAi,
            agentry_runtime::config::LlmProvider::Ollama => agentry_llm::Provider::Ollama,
            agentry_runtime::config::LlmProvider::Anthropic => agentry_llm::Provider::Anthropic,
        },
        base_url: config.llm.base_url.clone(),
        api_key: (!config.llm.api_key.is_empty()).then(|| config.llm.api_key.clone()),
        model: config.llm.model.clone(),
        request_timeout: Duration::from_secs(config.llm.request_timeout_secs),
        connect_timeout: Duration::from_secs(config.llm.connect_timeout_secs),
        max_retries: config.llm.max_retries,
        retry_base_delay: ProviderConfig::DEFAULT_RETRY_BASE_DELAY,
        limits: agentry_llm::ResponseLimits {
            max_response_bytes: usize::try_from(config.llm.max_response_bytes)
                .unwrap_or(usize::MAX),
            max_tool_arguments_bytes: usize::try_from(config.llm.max_tool_arguments_bytes)
                .unwrap_or(usize::MAX),
        },
    })?
    .with_headers_hook(agentry_runtime::telemetry::inject_http)
    .with_extra_body(config.llm.extra_body_json()))
}

/// Builds the clients of the other services and of the model from the
/// configuration; calls to the other services carry `auth`'s service
/// credential.
pub fn deps_from_config(config: &Config, auth: &Auth) -> Result<Deps, RunError> {
    let channel = |url: &str, service: &'static str| {
        auth.lazy_channel(url)
            .map_err(|source| RunError::Service { service, source })
    };
    let store = SessionStoreClient::new(channel(&config.session_store.url, "session_store.url")?)
        .max_decoding_message_size(agentry_runtime::MAX_MESSAGE_BYTES);
    let runners =
        runners::RunnerPool::new(&config.tool_runner.url, auth).map_err(RunError::Runners)?;
    let scheduler = agentry_proto::scheduler::v1::scheduler_client::SchedulerClient::new(channel(
        &config.scheduler.url,
        "scheduler.url",
    )?);
    let profile = config.model_profile();
    let context_window = compaction::context_window(&config.llm.model, profile.context_window);
    // Until the model server is asked (see `run`), the profile's window.
    let llm =
        llm_client(config)?.with_context_window(u32::try_from(context_window).unwrap_or(u32::MAX));
    let mut deps = Deps::new(
        store,
        config.session_store.url.clone(),
        runners,
        scheduler,
        config.scheduler.url.clone(),
        llm,
    );
    deps.notify_events = config
        .notify
        .iter()
        .flat_map(|n| n.events.iter().cloned())
        .collect();
    if config.llm.max_concurrent_requests > 0 {
        deps.model_gate = Some(Arc::new(tokio::sync::Semaphore::new(
            config.llm.max_concurrent_requests as usize,
        )));
    }
    let advertise = config.orchestrator.advertise_url.trim();
    if !advertise.is_empty() {
        let cluster = cluster::Cluster::new(advertise, config.orchestrator.listen, auth)
            .map_err(RunError::Config)?;
        deps.cluster = Some(Arc::new(cluster));
    }
    Ok(deps)
}

/// Refuses to start when an agent names a tool nobody offers (a typo the
/// sub-agent would otherwise silently go without), naming the agent, where
/// it is defined and the nearest tool. Tools of configured MCP servers
/// (`server__…`) are not checked: a server may still be starting. Skipped,
/// with a warning, when no tool runner answers yet.
async fn check_agent_tools(config: &Config, deps: &Deps) -> Result<(), RunError> {
    let agents = config.agents()?;
    if agents.is_empty() {
        return Ok(());
    }
    let listed = tokio::time::timeout(Duration::from_secs(5), deps.runners.list_tools()).await;
    let Ok(Ok(listed)) = listed else {
        tracing::warn!("no tool runner answers yet: the agents' tool lists are not checked");
        return Ok(());
    };
    let mut known: Vec<String> = listed.tools.into_iter().map(|t| t.name).collect();
    known.extend(
        builtin::own()
            .specs()
            .into_iter()
            .map(|s| s.name)
            .filter(|n| n != agents::DELEGATE),
    );
    let servers: Vec<String> = config
        .mcp_servers()
        .map(|servers| servers.into_iter().map(|s| s.name).collect())
        .unwrap_or_default();
    for agent in &agents {
        for tool in &agent.tools {
            let of_a_server = tool
                .split_once("__")
                .is_some_and(|(server, _)| servers.iter().any(|s| s == server));
            if of_a_server || known.contains(tool) {
                continue;
            }
            let nearest = known
                .iter()
                .min_by_key(|k| strsim::levenshtein(k, tool))
                .cloned()
                .unwrap_or_default();
            let source = agent
                .file
                .as_ref()
                .map_or("[[agents]]".to_string(), |f| f.display().to_string());
            return Err(RunError::Config(errors::SettingError(format!(
                "{source}: agent {:?} names the tool {tool:?}, which no tool runner or the \
                 orchestrator offers (did you mean {nearest:?}?). The tools: {}",
                agent.name,
                known.join(", ")
            ))));
        }
    }
    Ok(())
}

/// The session id under which hooks are tried at start (its scratch
/// directory is removed again).
const HOOK_CHECK_SESSION: &str = "agentry-hook-check";

/// The shell that checks, inside the sandbox, that what a hook command
/// names can be run there: its program on the PATH (or, named by path,
/// readable), and the script an interpreter is given by path readable.
fn hook_probe(command: &str) -> Option<String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let program = *words.first()?;
    // Shell syntax (variables, substitutions, assignments) is not guessed at.
    if program.contains(['$', '`', '=', '(', ')', '{', '}', ';', '|', '&', '<', '>']) {
        return None;
    }
    let quote = |w: &str| format!("'{}'", w.replace('\'', "'\\''"));
    let mut probe = String::new();
    if program.contains('/') {
        probe.push_str(&format!(
            "[ -r {p} ] || {{ echo {p}; exit 3; }}; ",
            p = quote(program)
        ));
    } else {
        probe.push_str(&format!(
            "command -v -- {p} >/dev/null || {{ echo {p}; exit 3; }}; ",
            p = quote(program)
        ));
    }
    // An interpreter's script, named by path.
    let interpreter = matches!(
        program.rsplit('/').next().unwrap_or(program),
        "sh" | "bash" | "dash" | "python" | "python3" | "node" | "perl" | "ruby" | "deno"
    );
    if interpreter
        && let Some(script) = words.get(1).map(|w| w.trim_matches(['"', '\'']))
        && script.starts_with('/')
        && script
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+@".contains(c))
    {
        probe.push_str(&format!(
            "[ -r {p} ] || {{ echo {p}; exit 3; }}; ",
            p = quote(script)
        ));
    }
    Some(probe)
}

/// Refuses to start when a hook's program (or a script it names by path)
/// cannot be found or read inside the sandbox, where hooks run: such a
/// hook would have no say at every call. Skipped, with a warning, when no
/// tool runner answers yet.
async fn check_hooks_runnable(config: &Config, deps: &Deps) -> Result<(), RunError> {
    if config.hooks.is_empty() {
        return Ok(());
    }
    let mut checked = false;
    for (i, hook) in config.hooks.iter().enumerate() {
        let Some(probe) = hook_probe(&hook.command) else {
            continue;
        };
        let request = agentry_proto::tools::v1::RunHookRequest {
            session_id: HOOK_CHECK_SESSION.into(),
            command: probe,
            input: String::new(),
            timeout_secs: 10,
        };
        let ran = tokio::time::timeout(Duration::from_secs(15), deps.run_hook(request)).await;
        let Ok(Ok(ran)) = ran else {
            tracing::warn!("no tool runner answers yet: the hooks' commands are not checked");
            return Ok(());
        };
        checked = true;
        if ran.exit_code == Some(3) {
            let missing = ran.stdout.trim().trim_matches('\'');
            return Err(RunError::Hooks(format!(
                "hooks[{i}] ({} {:?}): {missing} cannot be found or read inside the sandbox, \
                 where hooks run, so the hook would have no say; put it in a directory the \
                 sandbox shows (the system directories, or tool_runner.sandbox.read_only)",
                hook.event.name(),
                hook.command
            )));
        }
    }
    if checked {
        let _ = deps.forget_session(HOOK_CHECK_SESSION).await;
    }
    Ok(())
}

/// Serves the orchestrator on `listener` until `shutdown`, checking callers
/// and calling the other services with `auth`.
pub async fn run(
    config: &Config,
    auth: &Auth,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RunError> {
    for notice in &config.notices {
        tracing::warn!("{notice}");
    }
    let settings = Arc::new(Settings::from_config(config)?);
    let deps = Arc::new(deps_from_config(config, auth)?);
    let configured = config.model_profile().context_window;
    let asking = match window::settle(&deps, &settings, configured).await {
        Ok(()) => None,
        Err(_) => Some(tokio::spawn(window::keep_trying(
            deps.clone(),
            settings.clone(),
            configured,
        ))),
    };
    check_agent_tools(config, &deps).await?;
    check_hooks_runnable(config, &deps).await?;
    tracing::info!(
        model = %config.llm.model,
        llm = %config.llm.base_url,
        store = %config.session_store.url,
        tool_runner = %config.tool_runner.url,
        "orchestrator ready"
    );
    let metrics = deps.metrics.clone();
    metrics::init(&metrics);
    let metrics_task = agentry_runtime::metrics::spawn(
        &config.orchestrator.metrics_listen,
        "orchestrator",
        move || metrics.render(),
    )
    .await
    .map_err(RunError::Metrics)?;
    let (stop_heartbeat, heartbeat_stop) = tokio::sync::watch::channel(false);
    let heartbeat = deps.cluster.clone().map(|cluster| {
        tracing::info!(instance_id = %cluster.instance_id, url = %cluster.url, "orchestrator replica: sessions are leased");
        let store = deps.store.clone();
        tokio::spawn(async move { cluster.heartbeat(store, heartbeat_stop).await })
    });
    let orchestrator = OrchestratorService::new(deps, settings);
    // Sessions left mid-turn by an earlier process are recovered now; with
    // several replicas, those of a replica that died are taken over as
    // long as this one runs.
    let recovering = orchestrator.clone();
    let recovery = tokio::spawn(async move {
        let Some(cluster) = recovering.deps().cluster.clone() else {
            recovering.recover_open_sessions().await;
            return;
        };
        let mut alive = cluster.watch_alive();
        let mut was_alive = false;
        loop {
            // Only while the store counts this replica alive; when it
            // stops, the sessions it drove are dropped here (others take
            // them over).
            let now_alive = *alive.borrow_and_update();
            if was_alive && !now_alive {
                tracing::warn!("this orchestrator's lease lapsed: it stops driving its sessions");
                recovering.drop_sessions();
            }
            was_alive = now_alive;
            if now_alive {
                recovering.recover_open_sessions().await;
            }
            tokio::select! {
                () = tokio::time::sleep(cluster::TAKEOVER_EVERY) => {}
                _ = alive.changed() => {}
            }
        }
    });
    // Reminders that fall due arrive from the scheduler.
    let consumer = tokio::spawn(reminders::consume(orchestrator.clone()));
    // Updates of subscribed MCP resources arrive from the tool runners.
    let mcp_consumer = tokio::spawn(mcp_updates::consume(orchestrator.clone()));
    let sessions = orchestrator.clone();
    let service = OrchestratorServer::new(orchestrator);
    let served = agentry_runtime::serve(
        listener,
        Routes::new(service),
        &[OrchestratorServer::<OrchestratorService>::NAME],
        auth,
        shutdown,
    )
    .await;
    consumer.abort();
    mcp_consumer.abort();
    recovery.abort();
    // The actors hold the sessions handle (for the tasks they start): they
    // end when their handles go.
    sessions.drop_sessions();
    let _ = stop_heartbeat.send(true);
    if let Some(task) = heartbeat {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), task).await;
    }
    if let Some(task) = asking {
        task.abort();
    }
    if let Some(task) = metrics_task {
        task.abort();
    }
    served?;
    Ok(())
}

#[cfg(test)]
mod start_checks {
    #![allow(clippy::unwrap_used)]
    use super::hook_probe;

    #[test]
    fn a_hook_s_program_and_an_interpreter_s_script_are_probed() {
        let probe = hook_probe("python3 /opt/hooks/check.py --strict").unwrap();
        assert!(probe.contains("command -v -- 'python3'"), "{probe}");
        assert!(probe.contains("[ -r '/opt/hooks/check.py' ]"), "{probe}");
        let probe = hook_probe("/usr/local/bin/no-push").unwrap();
        assert!(
            probe.starts_with("[ -r '/usr/local/bin/no-push' ]"),
            "{probe}"
        );
        // Redirections and other words are the hook's business.
        let probe = hook_probe("cat > /dev/null; echo ok").unwrap();
        assert!(!probe.contains("[ -r '/dev/null'"), "{probe}");
        // Shell syntax in the program is not guessed at.
        assert_eq!(hook_probe("$HOME/bin/hook"), None);
        assert_eq!(hook_probe("X=1 hook"), None);
        assert_eq!(hook_probe("  "), None);
    }
}
