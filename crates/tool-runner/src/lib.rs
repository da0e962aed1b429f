//! The tool runner: executes the agent's tools (shell and files) confined to
//! the session's workspace, and serves them over gRPC
//! (`agentry.tools.v1.ToolRunner`). Stateless: any number of replicas may
//! share one workspace volume.
//!
//! It runs what it is asked and keeps the sandbox's rules; whether a call
//! may run at all is the orchestrator's policy. It must not depend on the
//! orchestrator, the session store or the scheduler.

pub mod egress;
pub mod errors;
pub mod files;
pub mod hooks;
pub mod instructions;
pub use agentry_mcp as mcp;
pub mod mcp_host;
pub mod metrics;
pub use agentry_tool::output;
pub mod projects;
pub mod sandbox;
pub mod secrets;
pub mod service;
pub mod session_sandbox;
pub mod snapshots;
pub mod tools;
pub mod watchdog;
pub mod workspace;

pub use agentry_web as web;
pub use service::ToolRunnerService;

use agentry_proto::tools::v1::tool_runner_server::ToolRunnerServer;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::service::Routes;

/// Why a tool call failed. Each of these goes back to the model as the
/// tool's error output, so it can correct the call.
pub use agentry_tool::ToolError;

/// Bounds on tool calls.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Shell timeout when the call names none.
    pub default_timeout: Duration,
    /// The largest shell timeout a call may ask for.
    pub max_timeout: Duration,
    /// Largest output kept, in bytes.
    pub max_output_bytes: usize,
    /// Largest file `read_file` returns whole, in bytes.
    pub max_read_bytes: u64,
    /// Largest size of a session's workspace and temp dir, in bytes; 0:
    /// not limited.
    pub workspace_bytes: u64,
}

impl Limits {
    /// The limits from the configuration.
    pub fn from_config(config: &agentry_runtime::Config) -> Self {
        let t = &config.tool_runner;
        Limits {
            default_timeout: Duration::from_secs(t.default_timeout_secs),
            max_timeout: Duration::from_secs(t.max_timeout_secs),
            max_output_bytes: t.max_output_bytes,
            max_read_bytes: t.max_read_bytes,
            workspace_bytes: t.limits.workspace_mib.saturating_mul(1024 * 1024),
        }
    }
}

/// How a runner identifies itself in results: `AGENTRY_RUNNER_ID`, else the
/// host name and process id.
pub fn default_runner_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "runner".to_string());
    format!("{host}-{}", std::process::id())
}

/// What a tool runner starts with: [`Setup::from_config`] builds it from
/// the configuration; tests of the runner alone build it by hand.
pub struct Setup {
    /// Where sessions' workspaces live.
    pub workspace_root: PathBuf,
    /// Directories under which sessions may work on a project.
    pub project_roots: Vec<PathBuf>,
    /// Timeouts and output limits.
    pub limits: Limits,
    /// How commands are confined.
    pub sandbox: sandbox::Sandbox,
    /// The web tools' settings.
    pub web: agentry_runtime::config::WebConfig,
    /// This runner's name in tool results.
    pub runner_id: String,
    /// Where to serve `/metrics`, if anywhere.
    pub metrics: Option<TcpListener>,
    /// The MCP servers whose tools this runner offers.
    pub mcp_servers: Vec<agentry_runtime::config::McpServerConfig>,
    /// How the MCP client behaves.
    pub mcp: mcp::Settings,
    /// Where workspace snapshots are kept and their limits; `None`: no
    /// snapshots.
    pub snapshots: Option<(PathBuf, snapshots::SnapshotLimits)>,
    /// The secrets released at the point of use (`[[secrets]]`).
    pub secrets: secrets::Secrets,
}

impl Setup {
    /// The runner the configuration describes (binding its metrics
    /// address, if any).
    pub async fn from_config(
        config: &agentry_runtime::Config,
    ) -> Result<Setup, agentry_runtime::ServeError> {
        let sandbox = sandbox::Sandbox::from_config(config).map_err(|reason| {
            agentry_runtime::ServeError::Startup(format!("the tool runner cannot start: {reason}"))
        })?;
        let metrics = match config.tool_runner.metrics_listen.trim() {
            "" => None,
            addr => {
                let addr: std::net::SocketAddr = addr.parse().map_err(|e| {
                    agentry_runtime::ServeError::Startup(format!(
                        "tool_runner.metrics_listen {addr:?} is not an address: {e}"
                    ))
                })?;
                Some(agentry_runtime::serve::bind(addr).await?)
            }
        };
        let runner_id = match config.tool_runner.id.trim() {
            "" => default_runner_id(),
            id => id.to_string(),
        };
        let mcp_servers = config
            .mcp_servers()
            .map_err(|e| agentry_runtime::ServeError::Startup(e.to_string()))?;
        let secrets = secrets::Secrets::from_config(&config.secrets).map_err(|e| {
            agentry_runtime::ServeError::Startup(format!("the tool runner cannot start: {e}"))
        })?;
        Ok(Setup {
            secrets,
            mcp_servers,
            mcp: mcp::Settings::from_config(&config.mcp),
            workspace_root: config.workspace_root(),
            project_roots: config.project_roots(),
            limits: Limits::from_config(config),
            sandbox,
            web: config.tool_runner.web.clone(),
            runner_id,
            metrics,
            snapshots: config.tool_runner.snapshots.enabled.then(|| {
                (
                    config.snapshots_dir(),
                    snapshots::SnapshotLimits::from_config(
                        &config.tool_runner.snapshots,
                        config.tool_runner.limits.workspace_mib,
                    ),
                )
            }),
        })
    }
}

/// Applies the snapshots' retention every hour (the first time a minute
/// after start). Sessions deleted meanwhile are left to
/// `agentry sessions prune`, which knows them.
async fn prune_hourly(store: snapshots::Snapshots) {
    let mut next = Duration::from_secs(60);
    loop {
        tokio::time::sleep(next).await;
        next = Duration::from_secs(3600);
        let store = store.clone();
        let options = snapshots::PruneOptions::default();
        match tokio::task::spawn_blocking(move || store.prune(&options)).await {
            Ok(Ok(pruned)) if pruned.snapshots_removed > 0 => tracing::info!(
                removed = pruned.snapshots_removed,
                bytes_freed = pruned.bytes_freed,
                bytes_kept = pruned.bytes_kept,
                "pruned workspace snapshots"
            ),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot prune workspace snapshots"),
            Err(e) => tracing::warn!(error = %e, "pruning workspace snapshots failed"),
        }
    }
}

/// Serves the tool runner the configuration describes on `listener` until
/// `shutdown`: what `agentry up`, `agentry serve tool-runner` and the test
/// cluster start.
pub async fn run(
    config: &agentry_runtime::Config,
    auth: &agentry_runtime::Auth,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), agentry_runtime::ServeError> {
    let setup = Setup::from_config(config).await?;
    serve(setup, auth, listener, shutdown).await
}

/// Serves a tool runner set up by hand on `listener` until `shutdown`.
pub async fn serve(
    setup: Setup,
    auth: &agentry_runtime::Auth,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), agentry_runtime::ServeError> {
    let Setup {
        workspace_root,
        project_roots,
        limits,
        sandbox,
        web,
        runner_id,
        metrics,
        mcp_servers,
        mcp,
        snapshots,
        secrets,
    } = setup;
    let refuse = |reason: String| agentry_runtime::ServeError::Bind {
        addr: listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default(),
        reason,
    };
    for dir in [
        workspace_root.clone(),
        workspace_root.join(workspace::TEMP_DIRS),
    ] {
        agentry_runtime::datadir::prepare_dir(&dir).map_err(|e| {
            refuse(format!(
                "cannot create the workspace root {}: {e}",
                dir.display()
            ))
        })?;
    }
    sandbox
        .check_reachable(&workspace_root)
        .map_err(|e| refuse(e.0))?;
    tracing::info!(runner_id, workspace_root = %workspace_root.display(), "tool runner ready");
    for line in sandbox.describe() {
        if line.contains("OFF") {
            tracing::warn!("sandbox {line}");
        } else {
            tracing::info!("sandbox {line}");
        }
    }
    let chromium: Option<std::sync::Arc<dyn web::Backend>> = web.chromium.then(|| {
        std::sync::Arc::new(web::chromium::Chromium::new(
            web::chromium::ChromiumSettings {
                executable: (!web.chromium_path.is_empty())
                    .then(|| std::path::PathBuf::from(&web.chromium_path)),
                max_pages: web.chromium_max_pages,
                page_timeout: Duration::from_secs(web.page_timeout_secs),
                guard: Some(std::sync::Arc::new(web::ssrf::Guard::new(&web.allow_hosts))),
                sandbox: web.chromium_sandbox,
            },
        )) as std::sync::Arc<dyn web::Backend>
    });
    let web = std::sync::Arc::new(web::Web::new(&web, chromium));
    let background = web.start_background();
    let egress = start_egress(&sandbox, &workspace_root).await;
    egress
        .hold_secrets(secrets.clone(), sandbox.network_ca_file.as_deref())
        .map_err(|e| refuse(e.to_string()))?;
    let places = projects::Places::new(
        workspace_root.clone(),
        &project_roots,
        &sandbox.hidden,
        sandbox.switches_identity(),
    );
    if !project_roots.is_empty() {
        tracing::info!(project_roots = ?project_roots, "sessions may work in project directories under these");
    }
    let mcp = mcp::Mcp::new(
        mcp_servers,
        mcp,
        std::sync::Arc::new(mcp_host::RunnerHost {
            sandbox: sandbox.clone(),
            places: places.clone(),
            egress: Some(egress.clone()),
        }),
    );
    let mcp_task = Some(mcp.start_background());
    let mut runner = ToolRunnerService::new(workspace_root, limits, runner_id)
        .with_places(places)
        .with_sandbox(sandbox)
        .with_web(web)
        .with_egress(egress)
        .with_mcp(mcp)
        .with_secrets(secrets);
    let mut prune_task = None;
    if let Some((dir, limits)) = snapshots {
        let store = snapshots::Snapshots::open(&dir, limits).map_err(|e| refuse(e.to_string()))?;
        prune_task = Some(tokio::spawn(prune_hourly(store.clone())));
        runner = runner.with_snapshots(store);
    }
    let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    let metrics_task = metrics.map(|listener| {
        let page = runner.clone();
        tracing::info!(addr = ?listener.local_addr().ok(), "serving tool runner metrics on /metrics");
        tokio::spawn(agentry_runtime::metrics::serve(
            listener,
            move || page.metrics_page(),
            async move {
                let _ = metrics_stopped.await;
            },
        ))
    });
    let service = ToolRunnerServer::new(runner);
    let served = agentry_runtime::serve(
        listener,
        Routes::new(service),
        &[ToolRunnerServer::<ToolRunnerService>::NAME],
        auth,
        shutdown,
    )
    .await;
    if let Some(task) = background {
        task.abort();
    }
    if let Some(task) = mcp_task {
        task.abort();
    }
    if let Some(task) = prune_task {
        task.abort();
    }
    let _ = stop_metrics.send(());
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    served
}

/// Starts the network proxy the way this machine's sandbox can confine
/// commands to it.
pub async fn start_egress(
    sandbox: &sandbox::Sandbox,
    workspace_root: &std::path::Path,
) -> std::sync::Arc<egress::Egress> {
    let socket = workspace_root
        .join(workspace::TEMP_DIRS)
        .join(egress::SOCKET_NAME);
    let route = sandbox.network_route();
    egress::Egress::start(
        &sandbox.network_allow_hosts,
        &socket,
        route == Ok(sandbox::NetworkRoute::Bridge),
        route == Ok(sandbox::NetworkRoute::HostPort),
        route
            .as_ref()
            .err()
            .map(|e| e.0.as_str())
            .unwrap_or_default(),
    )
    .await
}
