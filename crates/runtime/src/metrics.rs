//! Metrics in the Prometheus text format: a small registry of counters,
//! gauges and histograms, and the HTTP endpoint (`GET /metrics`) that every
//! service can serve (`<service>.metrics_listen`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of histogram buckets, in seconds: 1 ms to 60 s.
const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 60.0,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

#[derive(Debug, Clone)]
enum Series {
    Value(f64),
    Histogram {
        counts: [u64; BUCKETS.len()],
        sum: f64,
        count: u64,
    },
}

#[derive(Debug)]
struct Family {
    help: &'static str,
    kind: Kind,
    series: BTreeMap<String, Series>,
}

/// A set of metrics; cheap to update from any thread.
#[derive(Debug, Default)]
pub struct Registry {
    families: Mutex<BTreeMap<&'static str, Family>>,
}

/// A label value escaped for the text format.
pub fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn label_set(labels: &[(&str, &str)]) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect::<Vec<_>>()
        .join(",")
}

impl Registry {
    fn update(
        &self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
        labels: &[(&str, &str)],
        apply: impl FnOnce(&mut Series),
    ) {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let family = families.entry(name).or_insert_with(|| Family {
            help,
            kind,
            series: BTreeMap::new(),
        });
        if family.kind != kind {
            return; // One name, one kind: a programming slip, not worth a panic.
        }
        let series = family
            .series
            .entry(label_set(labels))
            .or_insert_with(|| match kind {
                Kind::Histogram => Series::Histogram {
                    counts: [0; BUCKETS.len()],
                    sum: 0.0,
                    count: 0,
                },
                Kind::Counter | Kind::Gauge => Series::Value(0.0),
            });
        apply(series);
    }

    fn bump(
        &self,
        kind: Kind,
        name: &'static str,
        help: &'static str,
        labels: &[(&str, &str)],
        by: f64,
    ) {
        self.update(name, help, kind, labels, |s| {
            if let Series::Value(v) = s {
                *v += by;
            }
        });
    }

    /// Adds `by` to a counter.
    pub fn add(&self, name: &'static str, help: &'static str, labels: &[(&str, &str)], by: f64) {
        self.bump(Kind::Counter, name, help, labels, by);
    }

    /// Adds one to a counter.
    pub fn inc(&self, name: &'static str, help: &'static str, labels: &[(&str, &str)]) {
        self.add(name, help, labels, 1.0);
    }

    /// Sets a counter to `total`, for a count kept elsewhere (it only grows).
    pub fn set_total(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&str, &str)],
        total: f64,
    ) {
        self.update(name, help, Kind::Counter, labels, |s| {
            *s = Series::Value(total)
        });
    }

    /// Sets a gauge.
    pub fn set(&self, name: &'static str, help: &'static str, labels: &[(&str, &str)], value: f64) {
        self.update(name, help, Kind::Gauge, labels, |s| {
            *s = Series::Value(value)
        });
    }

    /// Adds `by` (which may be negative) to a gauge.
    pub fn shift(&self, name: &'static str, help: &'static str, labels: &[(&str, &str)], by: f64) {
        self.bump(Kind::Gauge, name, help, labels, by);
    }

    /// Records a duration in a histogram (in seconds).
    pub fn observe(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&str, &str)],
        value: Duration,
    ) {
        let seconds = value.as_secs_f64();
        self.update(name, help, Kind::Histogram, labels, |s| {
            if let Series::Histogram { counts, sum, count } = s {
                for (bound, n) in BUCKETS.iter().zip(counts.iter_mut()) {
                    if seconds <= *bound {
                        *n += 1;
                    }
                }
                *sum += seconds;
                *count += 1;
            }
        });
    }

    /// The current value of a counter or gauge series, for tests and tools.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        match families.get(name)?.series.get(&label_set(labels))? {
            Series::Value(v) => Some(*v),
            Series::Histogram { count, .. } => Some(*count as f64),
        }
    }

    /// The whole registry in the Prometheus text format.
    pub fn render(&self) -> String {
        let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        for (name, family) in families.iter() {
            let _ = writeln!(out, "# HELP {name} {}", family.help);
            let _ = writeln!(out, "# TYPE {name} {}", family.kind.name());
            for (labels, series) in &family.series {
                match series {
                    Series::Value(v) if labels.is_empty() => {
                        let _ = writeln!(out, "{name} {v}");
                    }
                    Series::Value(v) => {
                        let _ = writeln!(out, "{name}{{{labels}}} {v}");
                    }
                    Series::Histogram { counts, sum, count } => {
                        let sep = if labels.is_empty() { "" } else { "," };
                        for (bound, n) in BUCKETS.iter().zip(counts.iter()) {
                            let _ =
                                writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {n}");
                        }
                        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
                        let braces = if labels.is_empty() {
                            String::new()
                        } else {
                            format!("{{{labels}}}")
                        };
                        let _ = writeln!(out, "{name}_sum{braces} {sum}");
                        let _ = writeln!(out, "{name}_count{braces} {count}");
                    }
                }
            }
        }
        out
    }
}

/// Serves `GET /metrics` with `page()` on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    page: impl Fn() -> String + Clone + Send + Sync + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let page = page.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    page(),
                )
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Binds `addr` (a `*.metrics_listen` setting) and serves `page` there in
/// the background; an empty address serves nothing.
pub async fn spawn(
    addr: &str,
    what: &str,
    page: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> Result<Option<tokio::task::JoinHandle<()>>, String> {
    if addr.trim().is_empty() {
        return Ok(None);
    }
    let listener = tokio::net::TcpListener::bind(addr.trim())
        .await
        .map_err(|e| format!("cannot serve {what} metrics on {addr}: {e}"))?;
    tracing::info!(addr = ?listener.local_addr().ok(), "serving {what} metrics on /metrics");
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = serve(listener, page, std::future::pending()).await {
            tracing::warn!(error = %e, "metrics endpoint stopped");
        }
    })))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn renders_counters_gauges_and_histograms() {
        let r = Registry::default();
        r.inc(
            "agentry_turns_total",
            "Turns finished.",
            &[("outcome", "completed")],
        );
        r.inc(
            "agentry_turns_total",
            "Turns finished.",
            &[("outcome", "completed")],
        );
        r.add(
            "agentry_turns_total",
            "Turns finished.",
            &[("outcome", "failed")],
            3.0,
        );
        r.set("agentry_sessions_loaded", "Sessions in memory.", &[], 4.0);
        r.shift("agentry_sessions_loaded", "Sessions in memory.", &[], -1.0);
        r.observe(
            "agentry_model_seconds",
            "Model latency.",
            &[("outcome", "ok")],
            Duration::from_millis(20),
        );
        r.observe(
            "agentry_model_seconds",
            "Model latency.",
            &[("outcome", "ok")],
            Duration::from_secs(3),
        );
        let page = r.render();
        assert!(
            page.contains("# TYPE agentry_turns_total counter\n"),
            "{page}"
        );
        assert!(
            page.contains("agentry_turns_total{outcome=\"completed\"} 2\n"),
            "{page}"
        );
        assert!(
            page.contains("agentry_turns_total{outcome=\"failed\"} 3\n"),
            "{page}"
        );
        assert!(page.contains("agentry_sessions_loaded 3\n"), "{page}");
        assert!(
            page.contains("agentry_model_seconds_bucket{outcome=\"ok\",le=\"0.025\"} 1\n"),
            "{page}"
        );
        assert!(
            page.contains("agentry_model_seconds_bucket{outcome=\"ok\",le=\"10\"} 2\n"),
            "{page}"
        );
        assert!(
            page.contains("agentry_model_seconds_bucket{outcome=\"ok\",le=\"+Inf\"} 2\n"),
            "{page}"
        );
        assert!(
            page.contains("agentry_model_seconds_count{outcome=\"ok\"} 2\n"),
            "{page}"
        );
        assert_eq!(
            r.value("agentry_turns_total", &[("outcome", "failed")]),
            Some(3.0)
        );
        // Label values are escaped.
        r.inc("agentry_x_total", "X.", &[("tool", "a\"b")]);
        assert!(r.render().contains("agentry_x_total{tool=\"a\\\"b\"} 1"));
    }
}
