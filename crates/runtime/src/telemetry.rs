//! Logs and traces, shared by every binary.
//!
//! Logs go to stderr, as text or one JSON object per line. Traces are
//! exported over OTLP/gRPC when an endpoint is configured (`otel.endpoint`,
//! `AGENTRY_OTLP_ENDPOINT`); otherwise no OpenTelemetry layer is installed
//! and the propagation helpers below return at once.
//!
//! W3C trace context crosses every hop: [`Propagate`] (a tonic interceptor)
//! writes `traceparent` into outgoing gRPC requests, [`server_span`] starts
//! each incoming request's span as a child of the caller's, and
//! [`inject_http`] does the same for the model's HTTP requests.

use crate::config::LogFormat;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Whether traces are exported (so context is worth propagating).
static TRACING: AtomicBool = AtomicBool::new(false);

/// Keeps the trace exporter alive; [`Telemetry::shutdown`] (or dropping it)
/// sends what is buffered.
#[must_use = "dropping it stops trace export"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Longest wait for the last spans to leave on shutdown.
const FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

impl Telemetry {
    /// Flushes and stops the trace exporter, waiting at most a few seconds
    /// (an unreachable collector must not hold up a stopping service).
    pub async fn shutdown(mut self) {
        let Some(provider) = self.provider.take() else {
            return;
        };
        TRACING.store(false, Ordering::Relaxed);
        // The SDK blocks while its export task, on this runtime, drains:
        // wait on a blocking thread, never on a runtime worker.
        let flushing = tokio::task::spawn_blocking(move || provider.shutdown());
        match tokio::time::timeout(FLUSH_TIMEOUT, flushing).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => eprintln!("agentry: could not flush traces: {e}"),
            Ok(Err(e)) => eprintln!("agentry: could not flush traces: {e}"),
            Err(_) => eprintln!(
                "agentry: traces not flushed within {} s; the last spans are lost",
                FLUSH_TIMEOUT.as_secs()
            ),
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        // Without `shutdown`: flush on a thread of its own, not waited for.
        if let Some(provider) = self.provider.take() {
            TRACING.store(false, Ordering::Relaxed);
            let _ = std::thread::Builder::new()
                .name("otel-flush".into())
                .spawn(move || {
                    let _ = provider.shutdown();
                });
        }
    }
}

/// Installs the global `tracing` subscriber, writing logs to stderr, and,
/// when `otlp_endpoint` is non-empty, exporting spans there as
/// `service_name`. Must run inside a Tokio runtime.
///
/// Levels come from `AGENTRY_LOG`, else `RUST_LOG`, else `default_directive`
/// (e.g. `"info"`). Calling it twice keeps the first subscriber.
pub fn init(
    format: LogFormat,
    default_directive: &str,
    otlp_endpoint: &str,
    service_name: &str,
) -> Telemetry {
    let filter = std::env::var("AGENTRY_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new(default_directive));
    let (provider, otel_layer) = match otlp_endpoint.trim() {
        "" => (None, None),
        endpoint => match exporter(endpoint, service_name) {
            Ok(provider) => {
                let tracer = provider.tracer("agentry");
                // Spans have their own filter: quieter logs must not stop
                // traces, and the transport's own spans (the exporter's
                // requests among them) are never exported.
                let layer = tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(EnvFilter::new(
                        "info,h2=off,hyper=off,hyper_util=off,tower=off,tonic=off,opentelemetry=off",
                    ));
                (Some(provider), Some(layer))
            }
            Err(e) => {
                eprintln!("agentry: traces are not exported: {e}");
                (None, None)
            }
        },
    };
    // Colours only for a person at a terminal, never into files or pipes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let registry = tracing_subscriber::registry().with(otel_layer);
    // An error here means a subscriber is already installed: keep it.
    let installed = match format {
        LogFormat::Text => registry.with(fmt.with_filter(filter)).try_init(),
        LogFormat::Json => registry
            // Every enclosing span's fields: a line inside a turn carries
            // its session_id and turn_id however deep it is.
            .with(
                fmt.json()
                    .with_current_span(false)
                    .with_span_list(true)
                    .with_filter(filter),
            )
            .try_init(),
    };
    let provider = if installed.is_ok() { provider } else { None };
    if provider.is_some() {
        TRACING.store(true, Ordering::Relaxed);
        tracing::info!(endpoint = %otlp_endpoint, service = service_name, "exporting traces over OTLP");
    }
    Telemetry { provider }
}

fn exporter(endpoint: &str, service_name: &str) -> Result<SdkTracerProvider, String> {
    use opentelemetry_otlp::WithExportConfig;
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(format!(
            "the OTLP endpoint {endpoint:?} is not an http(s) URL (e.g. http://localhost:4317)"
        ));
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| format!("cannot build the OTLP exporter for {endpoint}: {e}"))?;
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service_name.to_string())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build())
}

/// Whether spans are being exported.
pub fn tracing_enabled() -> bool {
    TRACING.load(Ordering::Relaxed)
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            http::header::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(key, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The current span's context, when it is worth sending.
fn current_context() -> Option<opentelemetry::Context> {
    if !tracing_enabled() {
        return None;
    }
    let cx = tracing::Span::current().context();
    cx.span().span_context().is_valid().then_some(cx)
}

/// Writes the current span's W3C trace context into HTTP headers (the
/// model's requests).
pub fn inject_http(headers: &mut http::HeaderMap) {
    if let Some(cx) = current_context() {
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
    }
}

/// A tonic interceptor writing the current span's W3C trace context, and
/// the caller's credential when it has one, into every outgoing request.
#[derive(Clone, Default)]
pub struct Propagate {
    bearer: Option<tonic::metadata::AsciiMetadataValue>,
}

impl std::fmt::Debug for Propagate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Propagate")
            .field("credential", &self.bearer.is_some())
            .finish()
    }
}

impl Propagate {
    /// Also sends `bearer` as the `authorization` metadata.
    pub fn with_bearer(bearer: Option<tonic::metadata::AsciiMetadataValue>) -> Self {
        Propagate { bearer }
    }
}

impl tonic::service::Interceptor for Propagate {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(cx) = current_context() {
            TraceContextPropagator::new()
                .inject_context(&cx, &mut MetadataInjector(request.metadata_mut()));
        }
        if let Some(bearer) = &self.bearer {
            request
                .metadata_mut()
                .insert("authorization", bearer.clone());
        }
        Ok(request)
    }
}

/// A channel whose requests carry the caller's trace context.
pub type TracedChannel =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Propagate>;

/// Wraps a channel so its requests carry trace context.
pub fn traced(channel: tonic::transport::Channel) -> TracedChannel {
    tonic::service::interceptor::InterceptedService::new(channel, Propagate::default())
}

/// The span of one incoming gRPC request, a child of the caller's span when
/// the request carries W3C trace context. Health checks and reflection get
/// none, so probes do not flood the traces.
pub fn server_span(request: &http::Request<()>) -> tracing::Span {
    if !tracing_enabled() {
        return tracing::Span::none();
    }
    let path = request.uri().path();
    if path.starts_with("/grpc.health.") || path.starts_with("/grpc.reflection.") {
        return tracing::Span::none();
    }
    let (service, method) = path
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or((path, ""));
    let span = tracing::info_span!(
        "grpc.server",
        otel.name = %path.trim_start_matches('/'),
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = %service,
        rpc.method = %method,
    );
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(request.headers()));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    span
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn nothing_is_propagated_when_tracing_is_off() {
        let mut headers = http::HeaderMap::new();
        inject_http(&mut headers);
        assert!(headers.is_empty());
        let request =
            tonic::service::Interceptor::call(&mut Propagate::default(), tonic::Request::new(()))
                .unwrap();
        assert!(request.metadata().is_empty());
        let request = http::Request::builder()
            .uri("/agentry.sessions.v1.SessionStore/Append")
            .body(())
            .unwrap();
        assert!(server_span(&request).is_none());
    }

    #[test]
    fn a_bad_endpoint_is_refused_with_a_reason() {
        let err = exporter("localhost:4317", "agentry").err().unwrap();
        assert!(err.contains("not an http(s) URL"), "{err}");
    }
}
