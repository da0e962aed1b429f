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

pub use agentry_client::connect::{dial, innermost_cause};

/// Connects to the orchestrator named by the configuration.
pub async fn connect(config: &Config) -> anyhow::Result<OrchestratorClient<TracedChannel>> {
    let auth = credentials(config)?;
    Ok(agentry_client::connect::orchestrator(&auth, &config.orchestrator.url).await?)
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

/// Sessions listed per request while a prefix is looked up.
const RESOLVE_PAGE: u32 = 500;

/// How many candidates an ambiguous prefix lists.
const MAX_CANDIDATES: usize = 10;

/// The full id of the session `given` names: an id, or a prefix of exactly
/// one session's id (people need not type all 36 characters). No session,
/// or several: an error that says so, listing the candidates.
pub async fn resolve_session(config: &Config, given: &str) -> anyhow::Result<String> {
    use agentry_proto::sessions::v1 as spb;
    let given = given.trim();
    if given.is_empty() {
        anyhow::bail!("the session id is empty; `agentry sessions list` shows them");
    }
    let mut client = connect(config).await?;
    // A whole id is looked up once, not searched for among every session.
    let exact = client
        .get_session(agentry_proto::orchestrator::v1::GetSessionRequest {
            session_id: given.to_string(),
        })
        .await;
    match exact {
        Ok(session) => return Ok(session.into_inner().id),
        Err(status) if status.code() == tonic::Code::NotFound => {}
        Err(status) if status.code() == tonic::Code::InvalidArgument => {}
        Err(status) => {
            return Err(status_error(
                &format!("cannot open session {given}"),
                status,
            ));
        }
    }
    let mut matches: Vec<spb::Session> = Vec::new();
    let mut offset = 0u32;
    loop {
        let page = client
            .list_sessions(spb::ListSessionsRequest {
                limit: RESOLVE_PAGE,
                offset,
                only_open_turns: false,
            })
            .await
            .map_err(|s| status_error("cannot list sessions", s))?
            .into_inner();
        for session in page.sessions.iter() {
            // A name is exact, and wins over prefixes.
            if session.name == given {
                return Ok(session.id.clone());
            }
            if session.id.starts_with(given) {
                matches.push(session.clone());
            }
        }
        offset = offset.saturating_add(page.sessions.len() as u32);
        if page.sessions.is_empty() || u64::from(offset) >= page.total {
            break;
        }
    }
    match matches.as_slice() {
        [] => anyhow::bail!(
            "no session is named {given:?} or has an id starting with it; `agentry sessions \
             list` shows them"
        ),
        [one] => Ok(one.id.clone()),
        several => {
            let mut lines: Vec<String> = several
                .iter()
                .take(MAX_CANDIDATES)
                .map(|s| {
                    let title = if s.title.is_empty() {
                        "(empty)"
                    } else {
                        &s.title
                    };
                    format!("  {}  {title}", s.id)
                })
                .collect();
            if several.len() > MAX_CANDIDATES {
                lines.push(format!("  … and {} more", several.len() - MAX_CANDIDATES));
            }
            anyhow::bail!(
                "{} sessions' ids start with {given:?}; give more of the id:\n{}",
                several.len(),
                lines.join("\n")
            )
        }
    }
}

/// [`resolve_session`] for an optional id.
pub async fn resolve_optional(
    config: &Config,
    given: Option<String>,
) -> anyhow::Result<Option<String>> {
    match given {
        Some(id) => resolve_session(config, &id).await.map(Some),
        None => Ok(None),
    }
}
