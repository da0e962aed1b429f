//! The HTTP server under the test doubles: an axum app on a loopback
//! listener, stopped when the handle is dropped.

use axum::Router;
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running server; dropping it stops accepting at once.
pub(crate) struct HttpServer {
    pub(crate) addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// Binds `addr` (port 0 picks a free port) and serves `app`, with
    /// Nagle's algorithm off, as a real server behind a proxy would have
    /// it: streamed chunks are small writes. `name` appears in errors.
    pub(crate) async fn start(addr: SocketAddr, app: Router, name: &str) -> anyhow::Result<Self> {
        use axum::serve::ListenerExt;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("{name}: cannot listen on {addr}: {e}"))?;
        let addr = listener.local_addr()?;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let (shutdown, shutdown_rx) = oneshot::channel::<()>();
        let name = name.to_string();
        let task = tokio::spawn(async move {
            let server = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = shutdown_rx.await;
            });
            if let Err(e) = server.await {
                eprintln!("{name} on {addr} failed: {e}");
            }
        });
        Ok(HttpServer {
            addr,
            shutdown: Some(shutdown),
            task,
        })
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        // Stop accepting at once; streams being served end with their tasks.
        self.task.abort();
    }
}
