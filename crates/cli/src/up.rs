//! `agentry up` (every service in this process) and `agentry serve`.

use crate::Service;
use agentry_runtime::Auth;
use agentry_runtime::config::Config;
use agentry_runtime::serve::bind;
use agentry_runtime::{shutdown_signal, telemetry};
use std::future::Future;
use std::pin::Pin;
use tokio::sync::watch;

type ServiceFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// A shutdown future that completes when `rx` sees `true`.
async fn on_stop(mut rx: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn start(
    config: &Config,
    auth: &Auth,
    service: Service,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<ServiceFuture> {
    let auth = auth.clone();
    let shutdown = on_stop(stop);
    let fut: ServiceFuture = match service {
        Service::SessionStore => {
            let listener = bind(config.session_store.listen).await?;
            let config = config.clone();
            Box::pin(async move {
                agentry_session_store::run(&config, &auth, listener, shutdown).await?;
                Ok(())
            })
        }
        Service::ToolRunner => {
            let listener = bind(config.tool_runner.listen).await?;
            // Set up before anything runs, so a missing helper or a bad
            // metrics address fails the start.
            let setup = agentry_tool_runner::Setup::from_config(config).await?;
            Box::pin(async move {
                agentry_tool_runner::serve(setup, &auth, listener, shutdown).await?;
                Ok(())
            })
        }
        Service::Scheduler => {
            let listener = bind(config.scheduler.listen).await?;
            let config = config.clone();
            Box::pin(async move {
                agentry_scheduler::run(&config, &auth, listener, shutdown).await?;
                Ok(())
            })
        }
        Service::Orchestrator => {
            let listener = bind(config.orchestrator.listen).await?;
            let config = config.clone();
            Box::pin(async move {
                agentry_orchestrator::run(&config, &auth, listener, shutdown).await?;
                Ok(())
            })
        }
    };
    Ok(fut)
}

/// Runs the given services until Ctrl+C / SIGTERM or until one fails.
async fn run_services(config: &Config, services: &[Service]) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    // Bind every address first, so a taken port fails before anything runs.
    let auth = Auth::for_services(config)?;
    let mut futures = Vec::new();
    for service in services {
        futures.push((
            *service,
            start(config, &auth, *service, stop_rx.clone()).await?,
        ));
    }
    for (service, fut) in futures {
        tasks.spawn(async move { (service, fut.await) });
    }
    let mut failure = None;
    tokio::select! {
        () = shutdown_signal() => {}
        Some(done) = tasks.join_next() => {
            match done {
                Ok((service, Err(e))) => failure = Some(anyhow::anyhow!("{service:?} failed: {e:#}")),
                Ok((service, Ok(()))) => failure = Some(anyhow::anyhow!("{service:?} stopped unexpectedly")),
                Err(e) => failure = Some(anyhow::anyhow!("a service task failed: {e}")),
            }
        }
    }
    let _ = stop_tx.send(true);
    while let Some(done) = tasks.join_next().await {
        if let Ok((service, Err(e))) = done {
            tracing::error!(?service, error = %format!("{e:#}"), "service stopped with an error");
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `agentry up`.
pub async fn up(config: &Config) -> anyhow::Result<()> {
    let telemetry = telemetry::init(config.log.format, "info", &config.otel.endpoint, "agentry");
    let all = [
        Service::SessionStore,
        Service::ToolRunner,
        Service::Scheduler,
        Service::Orchestrator,
    ];
    eprintln!(
        "Agentry is starting: orchestrator on {}, data in {}, model {} at {}",
        config.orchestrator.url,
        config.data_dir().display(),
        config.llm.model,
        config.llm.base_url
    );
    let result = run_services(config, &all).await;
    telemetry.shutdown().await;
    result
}

/// `agentry serve SERVICE`.
pub async fn serve(config: &Config, service: Service) -> anyhow::Result<()> {
    let name = match service {
        Service::Orchestrator => "agentry-orchestrator",
        Service::SessionStore => "agentry-session-store",
        Service::ToolRunner => "agentry-tool-runner",
        Service::Scheduler => "agentry-scheduler",
    };
    let telemetry = telemetry::init(config.log.format, "info", &config.otel.endpoint, name);
    let result = run_services(config, &[service]).await;
    telemetry.shutdown().await;
    result
}
