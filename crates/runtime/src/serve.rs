//! The gRPC server bootstrap every service uses.

use crate::auth::Auth;
use std::future::Future;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic_health::ServingStatus;

/// How long open calls may take to finish once shutdown begins.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {reason}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The service's configuration cannot be carried out (a setting, a
    /// missing component).
    #[error("{0}")]
    Startup(String),
    /// Reflection could not be set up from the descriptor set.
    #[error("cannot build the reflection service: {0}")]
    Reflection(String),
    /// The credentials forbid serving here, or TLS could not be set up.
    #[error("{0}")]
    Auth(String),
    /// The transport failed.
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Binds `addr`, with a clear error when it is taken.
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr).await.map_err(|e| ServeError::Bind {
        addr: addr.to_string(),
        reason: if e.kind() == std::io::ErrorKind::AddrInUse {
            "the address is already in use (is another Agentry running?)".to_string()
        } else {
            e.to_string()
        },
    })
}

/// Accepted connections with Nagle's algorithm off: a gRPC answer is a few
/// small writes (headers, message, trailers), and with Nagle on each one
/// after the first waits for the client's delayed ACK, some 40 ms a call.
fn incoming(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    TcpListenerStream::new(listener).map(|accepted| {
        let stream = accepted?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}

/// Serves `routes` on `listener` together with `grpc.health.v1` (reporting
/// each of `service_names` as SERVING) and server reflection, until
/// `shutdown` completes; then stops accepting and drains open calls.
///
/// Every call but health checks goes through `auth`'s credential check;
/// TLS is served when `auth` has it. A listener on a non-loopback address
/// with neither tokens nor TLS is refused.
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    service_names: &[&str],
    auth: &Auth,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    if let Ok(addr) = listener.local_addr() {
        auth.check_listen(addr)
            .map_err(|e| ServeError::Auth(e.to_string()))?;
    }
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    for name in service_names {
        reporter
            .set_service_status(*name, ServingStatus::Serving)
            .await;
    }
    // Reflection v1, and v1alpha for the clients that speak only it
    // (Postman, grpc_cli, Evans, older grpcurl).
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(agentry_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(addr = %local, services = ?service_names, "serving gRPC");
    let (stopping_tx, stopping) = tokio::sync::oneshot::channel::<()>();
    let mut builder = Server::builder();
    if let Some(tls) = auth.server_tls() {
        builder = builder
            .tls_config(tls)
            .map_err(|e| ServeError::Auth(format!("cannot set up TLS: {e}")))?;
    }
    let server = builder
        .trace_fn(crate::telemetry::server_span)
        // Outermost: refusals of every layer within are bounded.
        .layer(crate::bounded::BoundedStatusLayer)
        .layer(auth.layer())
        .add_routes(routes)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(incoming(listener), async move {
            shutdown.await;
            let _ = stopping_tx.send(());
        });
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => result?,
        () = async {
            // Only reached after shutdown began: give open calls a grace period.
            if stopping.await.is_ok() {
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => {
            tracing::warn!(addr = %local, grace_secs = SHUTDOWN_GRACE.as_secs(), "open calls did not finish in time; closing them");
        }
    }
    tracing::info!(addr = %local, "gRPC server stopped");
    Ok(())
}

/// Completes on Ctrl+C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("interrupt received, shutting down"),
        () = term => tracing::info!("SIGTERM received, shutting down"),
    }
}
