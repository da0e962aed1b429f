//! The session store: sessions and their append-only event logs in SQLite,
//! served over gRPC (`agentry.sessions.v1.SessionStore`).
//!
//! It stores what it is given and decides nothing about the agent: it must
//! not depend on the orchestrator, the tool runner or the scheduler.

pub mod backend;
pub mod pg;
pub mod service;
pub mod store;

pub use backend::Backend;
pub use pg::PgStore;
pub use service::SessionStoreService;
pub use store::{Store, StoreError};

use agentry_proto::sessions::v1::session_store_server::SessionStoreServer;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic::service::Routes;

/// The file name of the store's database inside the data directory.
pub const DB_FILE: &str = "sessions.db";

/// Serves the session store the configuration describes (its database in
/// the data directory, metrics where `session_store.metrics_listen` says)
/// on `listener` until `shutdown`, to callers `auth` accepts: what `agentry
/// up`, `agentry serve session-store` and the test cluster start.
pub async fn run(
    config: &agentry_runtime::Config,
    auth: &agentry_runtime::Auth,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RunError> {
    let metrics_listen = config.session_store.metrics_listen.as_str();
    let store = open(config).await?;
    tracing::info!(backend = store.name(), "session store ready");
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = closing_tx.send(true);
    };
    let backend = store.clone();
    let service = SessionStoreService::new(store, closing);
    let metrics = service.metrics.clone();
    let metrics_task =
        agentry_runtime::metrics::spawn(metrics_listen, "session store", move || {
            metrics.set_total(
                "agentry_store_commits_total",
                "Durable append transactions committed (appends that arrive together share one).",
                &[],
                backend.commits() as f64,
            );
            metrics.render()
        })
        .await
        .map_err(RunError::Startup)?;
    let service = SessionStoreServer::new(service)
        .max_decoding_message_size(agentry_runtime::MAX_MESSAGE_BYTES);
    let served = agentry_runtime::serve(
        listener,
        Routes::new(service),
        &[SessionStoreServer::<SessionStoreService>::NAME],
        auth,
        shutdown,
    )
    .await;
    if let Some(task) = metrics_task {
        task.abort();
    }
    served?;
    Ok(())
}

/// How long start-up waits for a PostgreSQL server that cannot be reached.
const POSTGRES_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// The backend the configuration names: PostgreSQL at
/// `session_store.database_url`, else SQLite in the data directory.
pub async fn open(config: &agentry_runtime::Config) -> Result<Backend, RunError> {
    let url = config.session_store.database_url.trim();
    if url.is_empty() {
        let path = config.data_dir().join(DB_FILE);
        let store = tokio::task::spawn_blocking(move || Store::open(&path))
            .await
            .map_err(|e| RunError::Startup(e.to_string()))??;
        Ok(Backend::Sqlite(Arc::new(store)))
    } else {
        Ok(Backend::Postgres(Arc::new(
            PgStore::connect(url, POSTGRES_PATIENCE).await?,
        )))
    }
}

/// Why the service stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Opening the store failed.
    #[error("cannot open the session store: {0}")]
    Store(#[from] StoreError),
    /// Serving failed.
    #[error(transparent)]
    Serve(#[from] agentry_runtime::ServeError),
    /// The opening task died.
    #[error("session store start-up failed: {0}")]
    Startup(String),
}
