//! What every Agentry service binary needs: layered configuration, logging
//! set-up, and a gRPC server bootstrap with health, reflection and graceful
//! shutdown.
//!
//! Shared by every service and the CLI; it must not depend on any service
//! crate (only on `agentry-proto` and the pure `agentry-policy`, whose
//! configuration types it loads).

pub mod access;
pub mod auth;
pub mod bounded;
pub mod config;
pub mod datadir;
pub mod images;
pub mod metrics;
pub mod people;
pub mod reasons;
pub mod serve;
pub mod telemetry;
pub mod topics;

pub use auth::Auth;

/// The largest gRPC message a service or client accepts (a page of events
/// read from the store, a session listing), in bytes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
pub use config::{Config, ConfigError, ConfigSource};
pub use serve::{ServeError, serve, shutdown_signal};
