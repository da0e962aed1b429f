//! `agentry up` (every service in this process) and `agentry serve`.

use crate::Service;
use agentry_runtime::Auth;
use agentry_runtime::config::Config;
use agentry_runtime::serve::bind;
use agentry_runtime::{shutdown_signal, telemetry};
use tokio::sync::watch;

/// A shutdown future that completes when `rx` sees `true`.
async fn on_stop(mut rx: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = rx.wait_for(|stop| *stop).await;
}

impl From<Service> for agentry_stack::Service {
    fn from(service: Service) -> Self {
        match service {
            Service::SessionStore => agentry_stack::Service::SessionStore,
            Service::ToolRunner => agentry_stack::Service::ToolRunner,
            Service::Scheduler => agentry_stack::Service::Scheduler,
            Service::Orchestrator => agentry_stack::Service::Orchestrator,
            Service::Gateway => agentry_stack::Service::Gateway,
        }
    }
}

/// Runs the given services until Ctrl+C / SIGTERM or until one fails.
async fn run_services(config: &Config, services: &[agentry_stack::Service]) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    // Bind and set up every service first, so a taken port or a bad set-up
    // fails before anything runs.
    let auth = Auth::for_services(config)?;
    let mut futures = Vec::new();
    for service in services {
        let listener = match bind(service.listen(config)).await {
            Ok(listener) => listener,
            // The console is a convenience of `agentry up`: a taken port
            // (8080 is also llama.cpp's) leaves the services running.
            Err(e) if *service == agentry_stack::Service::Gateway && services.len() > 1 => {
                tracing::warn!(error = %e, "the web console is not started");
                eprintln!(
                    "The web console is not started: {e}. Set gateway.listen \
                     (AGENTRY_GATEWAY_LISTEN=127.0.0.1:PORT) to another port."
                );
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let serving =
            agentry_stack::prepare(*service, config, &auth, listener, on_stop(stop_rx.clone()))
                .await?;
        futures.push((*service, serving));
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

/// Where to open the console: `gateway.url`, unless only the listen address
/// was changed (then that address).
fn console_url(config: &Config) -> String {
    let builtin = &Config::builtin().gateway;
    if config.gateway.url == builtin.url && config.gateway.listen != builtin.listen {
        format!("http://{}", config.gateway.listen)
    } else {
        config.gateway.url.clone()
    }
}

/// `agentry up`.
pub async fn up(config: &Config) -> anyhow::Result<()> {
    let telemetry = telemetry::init(config.log.format, "info", &config.otel.endpoint, "agentry");
    eprintln!(
        "Agentry is starting: orchestrator on {}, data in {}, model {} at {}; the console: \
         open {}",
        config.orchestrator.url,
        config.data_dir().display(),
        config.llm.model,
        config.llm.base_url,
        console_url(config)
    );
    let result = run_services(config, &agentry_stack::Service::ALL).await;
    telemetry.shutdown().await;
    result
}

/// `agentry serve SERVICE`.
pub async fn serve(config: &Config, service: Service) -> anyhow::Result<()> {
    let service = agentry_stack::Service::from(service);
    let telemetry = telemetry::init(
        config.log.format,
        "info",
        &config.otel.endpoint,
        service.program(),
    );
    let result = run_services(config, &[service]).await;
    telemetry.shutdown().await;
    result
}
