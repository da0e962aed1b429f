//! Reaching the services as a client: a channel to a service's address
//! with a credential, or an error that names the service, the address, the
//! innermost cause ("Connection refused") and the setting to change.

use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_runtime::Auth;
use agentry_runtime::telemetry::TracedChannel;

/// Why a service cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Its address is unusable (not a URL, a TLS setting missing).
    #[error("{service} ({variable}): {source}")]
    Address {
        /// Which service.
        service: String,
        /// The setting that names its address.
        variable: String,
        /// Why.
        source: agentry_runtime::auth::AuthError,
    },
    /// Nothing answers there.
    #[error(
        "cannot reach the {service} at {url} ({reason}). Start Agentry with `agentry up`, or set \
         {variable} to a running {service}."
    )]
    Unreachable {
        /// Which service.
        service: String,
        /// Where it was looked for.
        url: String,
        /// The innermost cause, the part a person can act on.
        reason: String,
        /// The setting that names its address.
        variable: String,
    },
}

/// A channel to the `service` at `url` carrying `auth`'s credential;
/// `variable` is the setting that names the address (said when it fails).
pub async fn dial(
    auth: &Auth,
    url: &str,
    service: &str,
    variable: &str,
) -> Result<TracedChannel, ConnectError> {
    let endpoint = auth.endpoint(url).map_err(|source| ConnectError::Address {
        service: service.to_string(),
        variable: variable.to_string(),
        source,
    })?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| ConnectError::Unreachable {
            service: service.to_string(),
            url: url.to_string(),
            reason: innermost_cause(&e),
            variable: variable.to_string(),
        })?;
    Ok(auth.wrap(channel))
}

/// The orchestrator at `url`, taking messages as large as the services
/// send.
pub async fn orchestrator(
    auth: &Auth,
    url: &str,
) -> Result<OrchestratorClient<TracedChannel>, ConnectError> {
    let channel = dial(auth, url, "orchestrator", "AGENTRY_ORCHESTRATOR_URL").await?;
    Ok(OrchestratorClient::new(channel)
        .max_decoding_message_size(agentry_runtime::MAX_MESSAGE_BYTES))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[tokio::test]
    async fn an_unreachable_service_says_where_and_what_to_set() {
        // A port nothing listens on.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().expect("an address").port();
        drop(listener);
        let url = format!("http://127.0.0.1:{port}");
        let error = orchestrator(&Auth::off(), &url)
            .await
            .expect_err("nothing listens there");
        assert!(
            matches!(error, ConnectError::Unreachable { .. }),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(text.contains(&url), "{text}");
        assert!(text.contains("AGENTRY_ORCHESTRATOR_URL"), "{text}");
        let error = orchestrator(&Auth::off(), "not a url").await.err();
        assert!(
            matches!(error, Some(ConnectError::Address { .. })),
            "{error:?}"
        );
    }
}
