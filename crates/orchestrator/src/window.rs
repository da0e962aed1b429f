//! One truth about the context window: the orchestrator plans every
//! request for the window of the model's profile (or the one known for the
//! model's name), bounded by what the model server says it gives the model.
//! The server is asked at start; one that cannot be asked yet (not
//! listening, still loading its model) is asked again in the background,
//! and sessions loaded once it has answered use its window. A disagreement
//! is logged once, as a warning that says what to change.

use crate::deps::Deps;
use crate::settings::Settings;
use crate::tokens::context_window;
use agentry_llm::{LlmError, ServerWindow, WindowKind};
use std::sync::Arc;
use std::time::Duration;

/// How long each question to the model server may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a server that could not be asked yet is asked again.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);

/// How many times it is asked again before the plan stays as configured.
const RETRIES: u32 = 120;

/// The window decided, and what to tell the operator about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The context window to plan requests for, in tokens.
    pub tokens: usize,
    /// Where it comes from, for the log.
    pub source: String,
    /// A disagreement or doubt worth a warning.
    pub warning: Option<String>,
}

/// Where the planned window comes from, before the server says.
pub fn planned_source(configured: u32) -> String {
    if configured > 0 {
        "the configured window: llm.context_window or model_profiles.context_window".to_string()
    } else {
        "the size known for the model name, else the default".to_string()
    }
}

/// Decides the window for `model` from the profile's `configured` window
/// (0: unset) and the server's answer (`Err`: it could not be asked).
pub fn decide(
    model: &str,
    configured: u32,
    server: Result<Option<ServerWindow>, &LlmError>,
) -> Decision {
    let planned = context_window(model, configured);
    let planned_source = planned_source(configured);
    let keep = |warning: Option<String>| Decision {
        tokens: planned,
        source: planned_source.clone(),
        warning,
    };
    let window = match server {
        Err(e) => {
            return keep(Some(format!(
                "could not ask the model server for its context window ({e}); planning for \
                 {planned} tokens"
            )));
        }
        Ok(None) => return keep(None),
        Ok(Some(window)) => window,
    };
    let Some(stated) = window.tokens.map(|t| t as usize) else {
        return keep(Some(format!(
            "{} does not say how many tokens it gives the model; planning for {planned} tokens: \
             make the server give at least that (for Ollama set OLLAMA_CONTEXT_LENGTH, or use \
             llm.provider = \"ollama\", which asks for the window with each request), or set \
             llm.context_window to what it gives",
            window.source
        )));
    };
    match window.kind {
        WindowKind::Serving if configured == 0 => Decision {
            tokens: stated,
            source: window.source,
            warning: None,
        },
        WindowKind::Serving => {
            let tokens = planned.min(stated);
            let warning = (stated != planned).then(|| {
                format!(
                    "the model server gives the model {stated} tokens ({}), the configured \
                     window (llm.context_window or model_profiles.context_window) says \
                     {planned}: planning for {tokens}; set both to the same size",
                    window.source
                )
            });
            Decision {
                tokens,
                source: if tokens == stated {
                    window.source
                } else {
                    planned_source
                },
                warning,
            }
        }
        WindowKind::Trained if stated < planned => Decision {
            tokens: stated,
            warning: (configured > 0).then(|| {
                format!(
                    "the configured window (llm.context_window or \
                     model_profiles.context_window) says {planned} tokens but the model takes \
                     at most {stated} ({}): planning for {stated}",
                    window.source
                )
            }),
            source: window.source,
        },
        WindowKind::Trained => keep(None),
    }
}

/// Asks the model server and, when it answers (or cannot be the kind of
/// server that says), decides (see [`decide`]), applies the window to the
/// model client and the settings, and logs the outcome. `Err` with the
/// reason when the server cannot be asked yet: it does not listen, does not
/// answer in time, or is still loading.
pub async fn settle(deps: &Deps, settings: &Settings, configured: u32) -> Result<(), LlmError> {
    let llm = deps.llm();
    let server = match llm.server_context_window(PROBE_TIMEOUT).await {
        Err(e) if not_ready(&e) => {
            tracing::debug!(error = %e, "the model server cannot say its context window yet");
            deps.set_model_problem(Some(format!("model unreachable at {}: {e}", llm.url())));
            return Err(e);
        }
        other => other,
    };
    // A model the server does not have fails every turn: said at once.
    deps.set_model_problem(None);
    if let Ok(Some(models)) = llm.listed_models(PROBE_TIMEOUT).await
        && !models.is_empty()
        && !listed(&models, llm.model())
    {
        deps.set_model_problem(Some(format!(
            "model {} not listed by the server at {}",
            llm.model(),
            llm.url()
        )));
        tracing::warn!(
            model = %llm.model(),
            url = %llm.url(),
            listed = %models.iter().take(8).cloned().collect::<Vec<_>>().join(", "),
            "model not listed by the server: turns will fail until it has it (`agentry doctor` \
             says how to fix it)"
        );
    }
    apply(
        deps,
        settings,
        decide(llm.model(), configured, server.as_ref().map(Clone::clone)),
    );
    Ok(())
}

/// Whether `model` is among the server's `models` (Ollama adds `:latest`
/// to names given without a tag).
fn listed(models: &[String], model: &str) -> bool {
    models
        .iter()
        .any(|m| m == model || *m == format!("{model}:latest"))
}

/// Asks again every [`RETRY_EVERY`] until the server answers; after
/// [`RETRIES`] tries the plan stays as configured, with a warning.
pub async fn keep_trying(deps: Arc<Deps>, settings: Arc<Settings>, configured: u32) {
    tracing::warn!(
        url = %deps.llm().url(),
        every = ?RETRY_EVERY,
        "model unreachable: turns fail until the model server answers (asking again in the \
         background; `agentry doctor` says how to fix it)"
    );
    let mut last = None;
    for _ in 0..RETRIES {
        tokio::time::sleep(RETRY_EVERY).await;
        match settle(&deps, &settings, configured).await {
            Ok(()) => return,
            Err(why) => last = Some(why),
        }
    }
    if let Some(last) = last {
        apply(
            &deps,
            &settings,
            decide(deps.llm().model(), configured, Err(&last)),
        );
    }
}

/// The server may answer later: it does not listen yet, is slow, or says
/// it is loading (503).
fn not_ready(e: &LlmError) -> bool {
    matches!(
        e,
        LlmError::Connect { .. } | LlmError::Timeout { .. } | LlmError::Http { status: 503, .. }
    )
}

fn apply(deps: &Deps, settings: &Settings, decision: Decision) {
    let model = deps.llm().model().to_string();
    if let Some(warning) = &decision.warning {
        tracing::warn!(%model, context_window = decision.tokens, "{warning}");
    }
    tracing::info!(
        %model,
        context_window = decision.tokens,
        source = %decision.source,
        "context window"
    );
    deps.set_context_window(decision.tokens);
    settings.set_context_window(decision.tokens, decision.source);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pretty_assertions::assert_eq;

    fn stated(
        tokens: Option<u32>,
        kind: WindowKind,
    ) -> Result<Option<ServerWindow>, &'static LlmError> {
        Ok(Some(ServerWindow {
            tokens,
            kind,
            source: "the server".to_string(),
        }))
    }

    #[test]
    fn the_server_decides_when_the_profile_is_silent() {
        let d = decide("qwen2.5", 0, stated(Some(2048), WindowKind::Serving));
        assert_eq!((d.tokens, d.warning), (2048, None));
        // Larger than the default guess too: the server knows.
        let d = decide("qwen2.5", 0, stated(Some(131_072), WindowKind::Serving));
        assert_eq!(d.tokens, 131_072);
    }

    #[test]
    fn the_smaller_of_profile_and_server_wins_with_one_warning() {
        let d = decide("phi3", 4096, stated(Some(2048), WindowKind::Serving));
        assert_eq!(d.tokens, 2048);
        let warning = d.warning.unwrap();
        assert!(
            warning.contains("2048") && warning.contains("4096"),
            "{warning}"
        );
        let d = decide("phi3", 4096, stated(Some(8192), WindowKind::Serving));
        assert_eq!(d.tokens, 4096);
        assert!(d.warning.is_some());
        let d = decide("phi3", 4096, stated(Some(4096), WindowKind::Serving));
        assert_eq!((d.tokens, d.warning), (4096, None));
    }

    #[test]
    fn a_trained_maximum_only_bounds_the_plan() {
        // Ollama native: the client asks for the planned window.
        let d = decide("llama3", 0, stated(Some(131_072), WindowKind::Trained));
        assert_eq!((d.tokens, d.warning), (32_768, None));
        let d = decide("tiny", 8192, stated(Some(2048), WindowKind::Trained));
        assert_eq!(d.tokens, 2048);
        assert!(d.warning.is_some());
    }

    #[test]
    fn silence_and_failure_keep_the_plan() {
        let d = decide("gpt-4o", 0, Ok(None));
        assert_eq!((d.tokens, d.warning), (128_000, None));
        let refused = LlmError::Connect {
            url: "http://127.0.0.1:1/v1/models".into(),
            reason: "connection refused".into(),
        };
        let d = decide("x", 4096, Err(&refused));
        assert_eq!(d.tokens, 4096);
        assert!(d.warning.unwrap().contains("connection refused"));
        let d = decide("x", 0, stated(None, WindowKind::Serving));
        assert_eq!(d.tokens, 32_768);
        assert!(d.warning.unwrap().contains("OLLAMA_CONTEXT_LENGTH"));
    }
}
