//! The scheduler service: durable reminders that fire as events into
//! sessions (`agentry.scheduler.v1.Scheduler`).
//!
//! Reminders live in SQLite ([`store`]), or in PostgreSQL ([`pg`]) shared by
//! several schedulers; a worker sleeps until the next one
//! falls due (re-armed on every change, no polling), writes its firing and
//! moves it on in one transaction; consumers receive firings over
//! `StreamDue` and ack them, and anything unacknowledged is sent again —
//! after a restart of either side too.
//!
//! It knows sessions only by id and reaches the session store through its
//! gRPC contract: it must not depend on another service's crate.

pub mod backend;
pub mod notify;
pub mod pg;
pub mod schedule;
pub mod service;
pub mod store;

pub use backend::Backend;
pub use service::{Clock, Core, SchedulerService, Settings, SystemClock};

use agentry_proto::scheduler::v1::scheduler_server::SchedulerServer;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::service::Routes;

/// The file name of the scheduler's database inside the data directory.
pub const DB_FILE: &str = "scheduler.db";

/// Why the scheduler stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Opening the store failed.
    #[error("cannot open the scheduler store: {0}")]
    Store(#[from] store::StoreError),
    /// A setting is unusable.
    #[error("{0}")]
    Config(String),
    /// Serving failed.
    #[error(transparent)]
    Serve(#[from] agentry_runtime::ServeError),
}

/// The store the configuration names: PostgreSQL at
/// `scheduler.database_url`, else SQLite in the data directory.
pub async fn open(config: &agentry_runtime::Config) -> Result<Backend, RunError> {
    let url = config.scheduler.database_url.trim();
    if url.is_empty() {
        let path = config.data_dir().join(DB_FILE);
        let store = tokio::task::spawn_blocking(move || store::Store::open(&path))
            .await
            .map_err(|e| RunError::Config(format!("scheduler start-up failed: {e}")))??;
        Ok(Backend::Sqlite(Arc::new(store)))
    } else {
        Ok(Backend::Postgres(Arc::new(
            pg::PgStore::connect(url, Duration::from_secs(30)).await?,
        )))
    }
}

/// Settings from the configuration.
pub fn settings_from_config(config: &agentry_runtime::Config) -> Settings {
    use agentry_runtime::config::MissedOccurrences;
    Settings {
        missed: match config.scheduler.missed {
            MissedOccurrences::Once => schedule::MissedPolicy::Once,
            MissedOccurrences::All => schedule::MissedPolicy::All,
            MissedOccurrences::Skip => schedule::MissedPolicy::Skip,
        },
        grace: chrono::Duration::seconds(60),
        redeliver_after: Duration::from_secs(config.scheduler.redeliver_after_secs.max(1)),
        metrics_listen: config.scheduler.metrics_listen.clone(),
        notify_retry: Duration::from_millis(config.scheduler.notify_retry_ms.max(100)),
    }
}

/// Serves the scheduler the configuration describes (reminders in the data
/// directory, sessions checked against `session_store.url`) on `listener`
/// until `shutdown`: what `agentry up`, `agentry serve scheduler` and the
/// test cluster start.
pub async fn run(
    config: &agentry_runtime::Config,
    auth: &agentry_runtime::Auth,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RunError> {
    let settings = settings_from_config(config);
    let targets =
        Arc::new(notify::targets(&config.notify).map_err(|e| RunError::Config(e.to_string()))?);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let session_store_url = config.session_store.url.as_str();
    let store = open(config).await?;
    tracing::info!(backend = store.name(), "scheduler store ready");
    let channel = auth
        .lazy_channel(session_store_url)
        .map_err(|e| RunError::Config(format!("session store: {e}")))?;
    let notify_retry = settings.notify_retry;
    let core = Core::new(
        store.clone(),
        clock,
        settings,
        SessionStoreClient::new(channel),
        session_store_url.to_string(),
    )
    .with_notify(targets.clone());
    let metrics_core = core.clone();
    let metrics_task =
        agentry_runtime::metrics::spawn(core.metrics_listen(), "scheduler", move || {
            metrics_core.metrics_page()
        })
        .await
        .map_err(RunError::Config)?;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(core.clone().run_worker(stop.clone()));
    let notifier = tokio::spawn(notify::run(
        store,
        targets,
        notify_retry,
        core.notify_wake(),
        stop,
    ));
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let result = agentry_runtime::serve(
        listener,
        Routes::new(SchedulerServer::new(SchedulerService::new(core))),
        &[SchedulerServer::<SchedulerService>::NAME],
        auth,
        shutdown,
    )
    .await;
    worker.abort();
    notifier.abort();
    if let Some(task) = metrics_task {
        task.abort();
    }
    result?;
    Ok(())
}
