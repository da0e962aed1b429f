//! Logging set-up shared by every binary.

use crate::config::LogFormat;
use tracing_subscriber::EnvFilter;

/// Installs the global `tracing` subscriber, writing to stderr.
///
/// Levels come from `AGENTRY_LOG`, else `RUST_LOG`, else `default_directive`
/// (e.g. `"info"`). Calling it twice keeps the first subscriber.
pub fn init(format: LogFormat, default_directive: &str) {
    let filter = std::env::var("AGENTRY_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new(default_directive));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // An error here means a subscriber is already installed: keep it.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
