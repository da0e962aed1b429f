//! Connecting to the orchestrator, with one clear line when it is not there.

use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_runtime::Config;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Connects to `url`, or fails with one line naming the service, the
/// address, the innermost cause ("Connection refused") and how to fix it.
pub async fn dial(url: &str, service: &str, variable: &str) -> anyhow::Result<Channel> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| anyhow::anyhow!("invalid {service} URL {url:?}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    endpoint.connect().await.map_err(|e| {
        let reason = innermost_cause(&e);
        anyhow::anyhow!(
            "cannot reach the {service} at {url} ({reason}). Start Agentry with `agentry up`, \
             or set {variable} to a running {service}."
        )
    })
}

/// The innermost cause of an error ("Connection refused"), the part a
/// person can act on.
pub fn innermost_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut reason = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        reason = cause.to_string();
        source = cause.source();
    }
    reason
}

/// Connects to the orchestrator named by the configuration.
pub async fn connect(config: &Config) -> anyhow::Result<OrchestratorClient<Channel>> {
    let channel = dial(
        &config.orchestrator.url,
        "orchestrator",
        "AGENTRY_ORCHESTRATOR_URL",
    )
    .await?;
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
