//! The orchestrator's metrics (served on `orchestrator.metrics_listen`).

use agentry_llm::Usage;
use agentry_proto::sessions::v1 as pb;
use agentry_runtime::metrics::Registry;
use std::time::Duration;

/// Model and tool calls running now (the orchestrator's queue depth).
pub const CALLS_IN_FLIGHT: &str = "agentry_calls_in_flight";
/// Its help text.
pub const CALLS_IN_FLIGHT_HELP: &str = "Model and tool calls running now, by kind.";
const PENDING_APPROVALS: &str = "agentry_pending_approvals";
const PENDING_APPROVALS_HELP: &str = "Tool calls waiting for a person's decision.";

const SESSIONS_LOADED: &str = "agentry_sessions_loaded";
const SESSIONS_LOADED_HELP: &str =
    "Sessions whose state this orchestrator holds in memory (an actor each).";

/// Gauges that read 0 before anything happened.
pub fn init(metrics: &Registry) {
    metrics.set(PENDING_APPROVALS, PENDING_APPROVALS_HELP, &[], 0.0);
    metrics.set(SESSIONS_LOADED, SESSIONS_LOADED_HELP, &[], 0.0);
    for kind in ["model", "tool"] {
        metrics.set(
            CALLS_IN_FLIGHT,
            CALLS_IN_FLIGHT_HELP,
            &[("kind", kind)],
            0.0,
        );
    }
}

/// A session actor started (+) or ended (-).
pub fn sessions_loaded_changed(metrics: &Registry, by: f64) {
    metrics.shift(SESSIONS_LOADED, SESSIONS_LOADED_HELP, &[], by);
}

/// A session was loaded, from its checkpoint or from the start of its log
/// (`from`), applying `events` events.
pub fn session_loaded(metrics: &Registry, from: &str, events: u64) {
    metrics.inc(
        "agentry_session_loads_total",
        "Sessions loaded into memory, by where their state came from: a checkpoint and the events after it, or the whole log.",
        &[("from", from)],
    );
    metrics.add(
        "agentry_session_load_events_total",
        "Events read and applied to load sessions.",
        &[],
        events as f64,
    );
}

/// Approvals were requested (+) or decided (-).
pub fn pending_approvals_changed(metrics: &Registry, by: f64) {
    metrics.shift(PENDING_APPROVALS, PENDING_APPROVALS_HELP, &[], by);
}

/// A turn ended (`outcome` as in `TurnOutcome`, e.g. `TURN_OUTCOME_COMPLETED`).
pub fn turn_finished(metrics: &Registry, outcome: &str) {
    let outcome = outcome
        .trim_start_matches("TURN_OUTCOME_")
        .to_ascii_lowercase();
    metrics.inc(
        "agentry_turns_total",
        "Turns finished, by outcome.",
        &[("outcome", &outcome)],
    );
}

/// The loop detector told the model of a repeated call, or stopped a turn.
pub fn loop_detected(metrics: &Registry, stopped: bool) {
    metrics.inc(
        "agentry_loops_detected_total",
        "Repeated identical tool calls the loop detector caught, by what it did.",
        &[("action", if stopped { "stopped" } else { "told" })],
    );
}

/// A priced turn ended: what its model calls cost, added up per currency.
/// An input went to the replica that drives its session, or this replica
/// took over a session whose driver was gone.
pub fn session_routed(metrics: &Registry, how: &'static str) {
    metrics.inc(
        "agentry_session_routing_total",
        "Inputs forwarded to the orchestrator replica driving their session (forwarded), and sessions this replica took over from one that was gone (taken_over).",
        &[("how", how)],
    );
}

pub fn turn_cost(metrics: &Registry, cost: f64, currency: &str) {
    metrics.add(
        "agentry_model_cost_total",
        "What the model calls of finished turns cost at the configured prices, by currency.",
        &[("currency", currency)],
        cost,
    );
}

/// A tool call ended.
pub fn tool_call_finished(metrics: &Registry, result: &pb::ToolResult) {
    let outcome = if result.is_error { "error" } else { "ok" };
    metrics.inc(
        "agentry_orchestrator_tool_calls_total",
        "Tool calls finished, by tool and outcome (as the orchestrator saw them).",
        &[("tool", &result.tool), ("outcome", outcome)],
    );
    metrics.observe(
        "agentry_tool_call_seconds",
        "Tool call duration, by tool.",
        &[("tool", &result.tool)],
        Duration::from_millis(result.duration_ms),
    );
}

/// A model call ended.
pub fn model_call_finished(
    metrics: &Registry,
    outcome: &str,
    latency: Duration,
    usage: Option<Usage>,
) {
    metrics.observe(
        "agentry_model_call_seconds",
        "Model call latency, from request to the complete answer, by outcome.",
        &[("outcome", outcome)],
        latency,
    );
    if let Some(usage) = usage {
        let help = "Tokens reported by the model server, by kind.";
        metrics.add(
            "agentry_model_tokens_total",
            help,
            &[("kind", "prompt")],
            usage.prompt_tokens as f64,
        );
        metrics.add(
            "agentry_model_tokens_total",
            help,
            &[("kind", "completion")],
            usage.completion_tokens as f64,
        );
    }
}
