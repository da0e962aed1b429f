//! The WAL checkpointer: a thread with its own connection, off the append
//! path.

use super::StoreError;
use rusqlite::Connection;
use std::path::Path;

/// Checkpoints the WAL from its own connection and thread, off the append
/// path: PASSIVE, so it never blocks writers, every 200 ms.
pub(super) struct Checkpointer {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    const EVERY: std::time::Duration = std::time::Duration::from_millis(200);

    pub(super) fn start(path: &Path) -> Result<Checkpointer, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("wal-checkpoint".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(Self::EVERY)
                {
                    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                    {
                        tracing::warn!(error = %e, "WAL checkpoint failed; retrying");
                    }
                }
                // A last full one, so a clean stop leaves a short WAL.
                let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
            })
            .map_err(|source| StoreError::Io {
                what: "start the checkpoint thread for",
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
