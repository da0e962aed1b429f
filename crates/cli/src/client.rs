//! Connecting to the orchestrator, with one clear line when it is not there.

use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_runtime::telemetry::TracedChannel;
use agentry_runtime::{Auth, Config};
use std::sync::OnceLock;

/// Why this CLI has no client token, when it has none.
static MISSING_TOKEN: OnceLock<String> = OnceLock::new();

/// The CLI's credentials, from the configuration.
pub fn credentials(config: &Config) -> anyhow::Result<Auth> {
    let auth = Auth::for_client(config)?;
    if let Some(why) = auth.missing_token() {
        let _ = MISSING_TOKEN.set(why.to_string());
    }
    Ok(auth)
}

/// Connects to `url` with the CLI's credential, or fails with one line
/// naming the service, the address, the innermost cause ("Connection
/// refused") and how to fix it.
pub async fn dial(
    auth: &Auth,
    url: &str,
    service: &str,
    variable: &str,
) -> anyhow::Result<TracedChannel> {
    let endpoint = auth
        .endpoint(url)
        .map_err(|e| anyhow::anyhow!("{service} ({variable}): {e}"))?;
    let channel = endpoint.connect().await.map_err(|e| {
        let reason = innermost_cause(&e);
        anyhow::anyhow!(
            "cannot reach the {service} at {url} ({reason}). Start Agentry with `agentry up`, \
             or set {variable} to a running {service}."
        )
    })?;
    Ok(auth.wrap(channel))
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
pub async fn connect(config: &Config) -> anyhow::Result<OrchestratorClient<TracedChannel>> {
    let auth = credentials(config)?;
    let channel = dial(
        &auth,
        &config.orchestrator.url,
        "orchestrator",
        "AGENTRY_ORCHESTRATOR_URL",
    )
    .await?;
    Ok(OrchestratorClient::new(channel)
        .max_decoding_message_size(agentry_runtime::MAX_MESSAGE_BYTES))
}

/// Turns a gRPC status into a one-line error.
pub fn status_error(what: &str, status: tonic::Status) -> anyhow::Error {
    if status.code() == tonic::Code::Unauthenticated
        && let Some(why) = MISSING_TOKEN.get()
    {
        return anyhow::anyhow!(
            "{what}: {} ({:?}); this CLI has no client token: {why}. Run it as the user the \
             services run as, or set AGENTRY_TOKEN to the output of `agentry token` there.",
            status.message(),
            status.code()
        );
    }
    anyhow::anyhow!("{what}: {} ({:?})", status.message(), status.code())
}

/// Writes one line to stdout; a closed pipe (`agentry … | head`) surfaces as
/// an `io::Error` that `main` treats as a quiet exit.
pub fn print_line(line: impl std::fmt::Display) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // Lines hold what sessions, reminders and servers said.
    writeln!(out, "{}", crate::terminal::visible(&line.to_string()))?;
    Ok(())
}
