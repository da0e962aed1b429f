//! Connecting to the orchestrator, with one clear line when it is not there.

use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_runtime::Config;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Connects to the orchestrator named by the configuration.
pub async fn connect(config: &Config) -> anyhow::Result<OrchestratorClient<Channel>> {
    let url = &config.orchestrator.url;
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| anyhow::anyhow!("invalid orchestrator URL {url:?}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    let channel = endpoint.connect().await.map_err(|e| {
        // The innermost cause says what happened ("Connection refused").
        let mut reason = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            reason = cause.to_string();
            source = cause.source();
        }
        anyhow::anyhow!(
            "cannot reach the orchestrator at {url} ({reason}). Start Agentry with `agentry up`, \
             or set AGENTRY_ORCHESTRATOR_URL to a running orchestrator."
        )
    })?;
    Ok(OrchestratorClient::new(channel).max_decoding_message_size(64 * 1024 * 1024))
}

/// Turns a gRPC status into a one-line error.
pub fn status_error(what: &str, status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{what}: {} ({:?})", status.message(), status.code())
}

/// Writes one line to stdout; a closed pipe (`agentry … | head`) surfaces as
/// an `io::Error` that `main` treats as a quiet exit.
pub fn print_line(line: impl std::fmt::Display) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    Ok(())
}
