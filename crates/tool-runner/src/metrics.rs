//! The tool runner's metrics in the Prometheus text format: tool calls by
//! tool and outcome, and the web backends' health and circuit-breaker state.

use crate::web::Web;
use crate::web::breaker::BreakerState;
use crate::web::crawl4ai::Health;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Counters of tool calls.
#[derive(Debug, Default)]
pub struct ToolCalls {
    counts: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl ToolCalls {
    /// Counts one finished call of `tool` (`outcome`: ok, error, timeout,
    /// cancelled).
    pub fn record(&self, tool: &str, outcome: &'static str) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        *counts.entry((tool.to_string(), outcome)).or_default() += 1;
    }

    fn snapshot(&self) -> BTreeMap<(String, &'static str), u64> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

use agentry_runtime::metrics::escape;

/// The metrics page.
pub fn render(
    runner_id: &str,
    calls: &ToolCalls,
    web: Option<&Web>,
    mcp: Option<&crate::mcp::Mcp>,
) -> String {
    let mut out = String::new();
    let id = escape(runner_id);
    let _ = writeln!(
        out,
        "# HELP agentry_tool_calls_total Tool calls finished, by tool and outcome."
    );
    let _ = writeln!(out, "# TYPE agentry_tool_calls_total counter");
    for ((tool, outcome), n) in calls.snapshot() {
        let _ = writeln!(
            out,
            "agentry_tool_calls_total{{runner=\"{id}\",tool=\"{}\",outcome=\"{outcome}\"}} {n}",
            escape(&tool)
        );
    }
    if let Some(mcp) = mcp {
        render_mcp(&mut out, &id, mcp);
    }
    let Some(web) = web else { return out };
    let _ = writeln!(
        out,
        "# HELP agentry_web_backend_enabled Web backends in the fallback chain, in order."
    );
    let _ = writeln!(out, "# TYPE agentry_web_backend_enabled gauge");
    for (i, backend) in web.backends().iter().enumerate() {
        let _ = writeln!(
            out,
            "agentry_web_backend_enabled{{runner=\"{id}\",backend=\"{backend}\",position=\"{i}\"}} 1"
        );
    }
    if let Some(crawl4ai) = web.crawl4ai() {
        let stats = crawl4ai.stats();
        let _ = writeln!(
            out,
            "# HELP agentry_web_breaker_state Circuit breaker state of a web backend (1 for the current state)."
        );
        let _ = writeln!(out, "# TYPE agentry_web_breaker_state gauge");
        for state in [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ] {
            let value = u8::from(stats.state == state);
            let _ = writeln!(
                out,
                "agentry_web_breaker_state{{runner=\"{id}\",backend=\"crawl4ai\",state=\"{state}\"}} {value}"
            );
        }
        let (up, version) = match &stats.health {
            Health::Up { version } => (1, version.clone()),
            Health::Down { .. } | Health::Unknown => (0, String::new()),
        };
        let _ = writeln!(
            out,
            "# HELP agentry_web_backend_healthy Whether the last health check of a backend succeeded."
        );
        let _ = writeln!(out, "# TYPE agentry_web_backend_healthy gauge");
        let _ = writeln!(
            out,
            "agentry_web_backend_healthy{{runner=\"{id}\",backend=\"crawl4ai\",version=\"{}\"}} {up}",
            escape(&version)
        );
        let counters = [
            (
                "agentry_web_backend_fetches_total",
                "Fetches let through the breaker.",
                stats.breaker.fetches,
            ),
            (
                "agentry_web_backend_failures_total",
                "Fetches that failed after their retries.",
                stats.breaker.failures,
            ),
            (
                "agentry_web_breaker_opens_total",
                "Times the breaker opened.",
                stats.breaker.opens,
            ),
            (
                "agentry_web_breaker_rejected_total",
                "Fetches refused while the breaker was open.",
                stats.breaker.rejected,
            ),
            (
                "agentry_web_backend_requests_total",
                "HTTP requests sent (retries included).",
                stats.requests,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(
                out,
                "{name}{{runner=\"{id}\",backend=\"crawl4ai\"}} {value}"
            );
        }
    }
    out
}

/// The MCP servers' health and counters.
fn render_mcp(out: &mut String, id: &str, mcp: &crate::mcp::Mcp) {
    let statuses = mcp.statuses();
    type Value = fn(&agentry_proto::sessions::v1::McpServerStatus) -> u64;
    let families: [(&str, &str, &str, Value); 5] = [
        (
            "agentry_mcp_server_up",
            "gauge",
            "1 when the MCP server listed its tools and its circuit is closed.",
            |s| u64::from(s.state == "ready"),
        ),
        (
            "agentry_mcp_connections",
            "gauge",
            "Open connections to the MCP server (one per session, one for its tool list).",
            |s| u64::from(s.connections),
        ),
        (
            "agentry_mcp_calls_total",
            "counter",
            "Calls of the MCP server's tools.",
            |s| s.calls,
        ),
        (
            "agentry_mcp_failures_total",
            "counter",
            "Calls or starts of the MCP server that failed (timeouts, exits, transport errors).",
            |s| s.failures,
        ),
        (
            "agentry_mcp_restarts_total",
            "counter",
            "Connections to the MCP server started again after it went away.",
            |s| s.restarts,
        ),
    ];
    for (name, kind, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for s in &statuses {
            let _ = writeln!(
                out,
                "{name}{{runner=\"{id}\",server=\"{}\"}} {}",
                escape(&s.name),
                value(s)
            );
        }
    }
}
