//! Every Agentry service, started in this process on ephemeral ports, with
//! its data in a temporary directory. Each service runs its real gRPC server
//! and the services talk to each other over real TCP connections.

use crate::fake_model::FakeModel;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_runtime::{Auth, Config, ConfigSource};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A channel to a service, sending a credential when it has one.
pub type Channel = agentry_runtime::telemetry::TracedChannel;

/// Which service, for starting and stopping one of them.
pub use agentry_stack::Service;

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

/// A whole Agentry cluster for one test.
pub struct Cluster {
    /// The fake model every model call goes to.
    pub model: FakeModel,
    /// The configuration the services run with.
    pub config: Config,
    /// The services' credentials: tokens created in the data dir at start,
    /// as `agentry up` does.
    pub auth: Auth,
    dir: tempfile::TempDir,
    running: Vec<(Service, Running)>,
    /// Listeners bound at start-up and not yet handed to their service, so
    /// that no other test can take the port in between.
    reserved: Vec<(Service, TcpListener)>,
}

impl Cluster {
    /// Starts every service against a fresh fake model.
    pub async fn start() -> anyhow::Result<Cluster> {
        Self::start_with(|_| {}).await
    }

    /// Starts every service; `adjust` may change the configuration first.
    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> anyhow::Result<Cluster> {
        Self::start_only(
            &[
                Service::SessionStore,
                Service::ToolRunner,
                Service::Scheduler,
                Service::Orchestrator,
            ],
            adjust,
        )
        .await
    }

    /// Starts only `services` (the others' addresses are reserved in the
    /// configuration, e.g. for a test that runs one of them as a process).
    pub async fn start_only(
        services: &[Service],
        adjust: impl FnOnce(&mut Config),
    ) -> anyhow::Result<Cluster> {
        let model = FakeModel::start().await?;
        let dir = tempfile::tempdir()?;
        // Sandboxed commands run as other users when the tests run as root:
        // they must be able to pass through to their workspaces.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        let mut config = Config::load(&ConfigSource::default())?;
        config.data_dir = dir.path().join("data").display().to_string();
        config.tool_runner.workspace_root = dir.path().join("workspaces").display().to_string();
        // No project directory is open unless a test opens one: a session
        // created from a test's working directory gets a scratch workspace.
        config.tool_runner.project_roots = Vec::new();
        config.llm.base_url = model.base_url();
        config.llm.model = "fake-model".into();
        config.llm.request_timeout_secs = 30;
        // Scripted replies are consumed one per request: retries would eat
        // the next test step's reply. The client's retries are tested on
        // their own in agentry-llm.
        config.llm.max_retries = 0;
        let mut reserved = Vec::new();
        for (service, endpoint) in [
            (Service::Orchestrator, &mut config.orchestrator.listen),
            (Service::SessionStore, &mut config.session_store.listen),
            (Service::Scheduler, &mut config.scheduler.listen),
            (Service::ToolRunner, &mut config.tool_runner.listen),
            (Service::Gateway, &mut config.gateway.listen),
        ] {
            let listener = bind_below_ephemeral().await?;
            *endpoint = listener.local_addr()?;
            reserved.push((service, listener));
        }
        config.orchestrator.url = format!("http://{}", config.orchestrator.listen);
        config.session_store.url = format!("http://{}", config.session_store.listen);
        config.scheduler.url = format!("http://{}", config.scheduler.listen);
        config.tool_runner.url = format!("http://{}", config.tool_runner.listen);
        config.gateway.url = format!("http://{}", config.gateway.listen);
        adjust(&mut config);
        let auth = Auth::for_services(&config)?;
        let mut cluster = Cluster {
            model,
            config,
            auth,
            dir,
            running: Vec::new(),
            reserved,
        };
        for service in services {
            cluster.start_service(*service).await?;
        }
        Ok(cluster)
    }

    /// The data directory (holds `sessions.db`).
    pub fn data_dir(&self) -> PathBuf {
        self.config.data_dir()
    }

    /// The root of the session workspaces.
    pub fn workspace_root(&self) -> PathBuf {
        self.config.workspace_root()
    }

    /// The temporary directory everything lives in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts one service on its configured address and waits until it
    /// accepts connections.
    pub async fn start_service(&mut self, service: Service) -> anyhow::Result<()> {
        let mut config = self.config.clone();
        let addr = service.listen(&config);
        let listener = match self.reserved.iter().position(|(s, _)| *s == service) {
            Some(i) => self.reserved.remove(i).1,
            None => bind_retrying(addr).await?,
        };
        if service == Service::ToolRunner {
            config.tool_runner.id = format!("runner-{}", addr.port());
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        // Set up here, not in the task, so a missing helper fails the start
        // with its own message.
        let serving =
            agentry_stack::prepare(service, &config, &self.auth, listener, shutdown).await?;
        let task: JoinHandle<anyhow::Result<()>> = tokio::spawn(serving);
        self.running.push((service, Running { stop, task }));
        Ok(())
    }

    /// Stops one service gracefully and waits until it has stopped.
    pub async fn stop_service(&mut self, service: Service) -> anyhow::Result<()> {
        let Some(i) = self.running.iter().position(|(s, _)| *s == service) else {
            anyhow::bail!("{service:?} is not running");
        };
        let (_, running) = self.running.remove(i);
        let _ = running.stop.send(());
        tokio::time::timeout(Duration::from_secs(15), running.task)
            .await
            .map_err(|_| anyhow::anyhow!("{service:?} did not stop within 15 s"))???;
        Ok(())
    }

    /// Stops and restarts one service on the same address and data.
    pub async fn restart_service(&mut self, service: Service) -> anyhow::Result<()> {
        self.stop_service(service).await?;
        self.start_service(service).await
    }

    /// Hands over the listener reserved for `service`, for a test that
    /// serves something of its own there (no window for another bind).
    pub fn take_listener(&mut self, service: Service) -> Option<TcpListener> {
        let i = self.reserved.iter().position(|(s, _)| *s == service)?;
        Some(self.reserved.remove(i).1)
    }

    /// Releases the port reserved for `service`, so that another process
    /// can bind it; returns its address.
    pub fn release(&mut self, service: Service) -> Option<SocketAddr> {
        let i = self.reserved.iter().position(|(s, _)| *s == service)?;
        let (_, listener) = self.reserved.remove(i);
        listener.local_addr().ok()
    }

    /// The credentials of a person's client (the client token).
    pub fn client_auth(&self) -> Auth {
        match Auth::for_client(&self.config) {
            Ok(auth) => auth,
            Err(e) => panic!("the cluster's client credentials: {e}"),
        }
    }

    /// A client of the orchestrator, with the client token as the CLI has.
    pub async fn orchestrator(&self) -> anyhow::Result<OrchestratorClient<Channel>> {
        Ok(OrchestratorClient::new(
            connect_as(&self.client_auth(), &self.config.orchestrator.url).await?,
        ))
    }

    /// A client of the scheduler, with the service token.
    pub async fn scheduler(
        &self,
    ) -> anyhow::Result<agentry_proto::scheduler::v1::scheduler_client::SchedulerClient<Channel>>
    {
        Ok(
            agentry_proto::scheduler::v1::scheduler_client::SchedulerClient::new(
                connect_as(&self.auth, &self.config.scheduler.url).await?,
            ),
        )
    }

    /// A client of the session store, with the service token (tests read
    /// and write logs as the services do).
    pub async fn store(&self) -> anyhow::Result<SessionStoreClient<Channel>> {
        Ok(SessionStoreClient::new(
            connect_as(&self.auth, &self.config.session_store.url).await?,
        ))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, running) in self.running.drain(..) {
            running.task.abort();
        }
    }
}

/// Binds a free loopback port below the kernel's ephemeral range, so that
/// once a test releases it (to run a service as a process on it, or to
/// restart one), no port-0 bind elsewhere can be handed the same port in
/// between.
pub async fn bind_below_ephemeral() -> anyhow::Result<TcpListener> {
    let mut last = None;
    for _ in 0..200 {
        match TcpListener::bind(("127.0.0.1", port_below_ephemeral())).await {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(anyhow::anyhow!(
        "no free port below the ephemeral range: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    ))
}

/// A loopback port to try, below the kernel's ephemeral range (20000 to
/// 31999), another at random on each call.
pub fn port_below_ephemeral() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    20_000 + (hasher.finish() % 12_000) as u16
}

/// Binds `addr`, retrying briefly while a just-stopped server releases it.
async fn bind_retrying(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let mut last = None;
    for _ in 0..50 {
        match TcpListener::bind(addr).await {
            Ok(listener) => return Ok(listener),
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Err(anyhow::anyhow!(
        "cannot bind {addr}: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    ))
}

/// Connects to a gRPC server without a credential, retrying for a few
/// seconds while it starts.
pub async fn connect(url: &str) -> anyhow::Result<Channel> {
    connect_as(&Auth::off(), url).await
}

/// Connects to a gRPC server with `auth`'s credential, retrying for a few
/// seconds while it starts.
pub async fn connect_as(auth: &Auth, url: &str) -> anyhow::Result<Channel> {
    let endpoint = auth.endpoint(url)?;
    let mut last = None;
    for _ in 0..50 {
        match endpoint.connect().await {
            Ok(channel) => return Ok(auth.wrap(channel)),
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Err(anyhow::anyhow!(
        "cannot connect to {url}: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    ))
}

/// Waits (at most a minute) until the orchestrator offers `tool`: an MCP
/// server's tool is offered once its server listed it.
pub async fn wait_for_tool(
    client: &mut OrchestratorClient<Channel>,
    tool: &str,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let tools = client
            .list_tools(agentry_proto::orchestrator::v1::ListToolsRequest::default())
            .await?
            .into_inner();
        if tools.tools.iter().any(|t| t.name == tool) {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            anyhow::bail!("the orchestrator did not offer {tool} within a minute: {tools:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
