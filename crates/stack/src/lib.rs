//! The one place that knows how each Agentry service starts: `agentry up`
//! (all five in one process), `agentry serve SERVICE` (one; the bench and
//! the process-level tests start those) and the test cluster all start
//! services through [`prepare`].
//!
//! Starting is two steps. [`prepare`] does everything that can fail
//! because of the configuration or the machine (the tool runner's sandbox
//! helper and probe, its metrics address), so a bad set-up fails the start
//! with its own message before anything serves; the [`Serving`] future it
//! returns then serves on the listener until the shutdown future completes.

use agentry_runtime::{Auth, Config};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use tokio::net::TcpListener;

/// One of the services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// Sessions and their event logs.
    SessionStore,
    /// Tools in sandboxed workspaces.
    ToolRunner,
    /// Reminders.
    Scheduler,
    /// The per-session state machines.
    Orchestrator,
    /// The web console and its API.
    Gateway,
}

impl Service {
    /// Every service, in the order `agentry up` starts them (the ones
    /// others call first).
    pub const ALL: [Service; 5] = [
        Service::SessionStore,
        Service::ToolRunner,
        Service::Scheduler,
        Service::Orchestrator,
        Service::Gateway,
    ];

    /// Its name in logs and traces.
    pub fn program(self) -> &'static str {
        match self {
            Service::SessionStore => "agentry-session-store",
            Service::ToolRunner => "agentry-tool-runner",
            Service::Scheduler => "agentry-scheduler",
            Service::Orchestrator => "agentry-orchestrator",
            Service::Gateway => "agentry-gateway",
        }
    }

    /// The address the configuration has it listen on.
    pub fn listen(self, config: &Config) -> SocketAddr {
        match self {
            Service::SessionStore => config.session_store.listen,
            Service::ToolRunner => config.tool_runner.listen,
            Service::Scheduler => config.scheduler.listen,
            Service::Orchestrator => config.orchestrator.listen,
            Service::Gateway => config.gateway.listen,
        }
    }
}

/// A prepared service, serving until its shutdown future completes.
pub type Serving = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// Sets `service` up from `config` and returns the future that serves it
/// on `listener` until `shutdown` completes. Set-up failures (a missing
/// sandbox helper, a bad metrics address) are this call's error.
pub async fn prepare(
    service: Service,
    config: &Config,
    auth: &Auth,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Serving> {
    let auth = auth.clone();
    let config = config.clone();
    let serving: Serving = match service {
        Service::SessionStore => Box::pin(async move {
            agentry_session_store::run(&config, &auth, listener, shutdown).await?;
            Ok(())
        }),
        Service::ToolRunner => {
            let setup = agentry_tool_runner::Setup::from_config(&config).await?;
            Box::pin(async move {
                agentry_tool_runner::serve(setup, &auth, listener, shutdown).await?;
                Ok(())
            })
        }
        Service::Scheduler => Box::pin(async move {
            agentry_scheduler::run(&config, &auth, listener, shutdown).await?;
            Ok(())
        }),
        Service::Orchestrator => Box::pin(async move {
            agentry_orchestrator::run(&config, &auth, listener, shutdown).await?;
            Ok(())
        }),
        Service::Gateway => {
            // Checked now: a gateway that may not start fails `agentry up`
            // before anything serves.
            let gateway = agentry_gateway::Gateway::new(&config, &auth)?;
            Box::pin(agentry_gateway::serve(gateway, listener, shutdown))
        }
    };
    Ok(serving)
}
