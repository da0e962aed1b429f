//! A bound on what a refusal sends back. A status message often quotes
//! the request (an id, a path, a name); a request that carries a value of
//! many kilobytes would otherwise be answered with headers larger than a
//! gRPC client accepts, and the caller would see a broken connection
//! instead of the error. Statuses sent in the response's headers (every
//! refusal of a call) are cut to [`MAX_MESSAGE_CHARS`] characters (fewer
//! when they must be to fit), and the
//! values of their `ErrorInfo` to [`MAX_VALUE_CHARS`]; the code and the
//! reason are kept.

use std::task::{Context, Poll};
use tonic::Status;
use tonic_types::{ErrorDetails, StatusExt};

/// Characters of a status message that are sent.
pub const MAX_MESSAGE_CHARS: usize = 1000;
/// Characters of each `ErrorInfo` metadata value that are sent.
pub const MAX_VALUE_CHARS: usize = 300;

/// Header bytes a status may take (a gRPC client takes 16 KiB of headers
/// in all).
const HEADER_BUDGET: usize = 6 * 1024;

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// Cuts `text` to `max` characters, saying how much was left out.
pub fn shorten(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_string();
    }
    let kept: String = text.chars().take(max).collect();
    format!("{kept}… ({} more characters)", count - max)
}

/// Rewrites the status in `headers` when it is too large to send.
pub fn bound_status(headers: &mut http::HeaderMap) {
    let size = |name: &str| headers.get(name).map_or(0, |v| v.len());
    if size("grpc-message") + size("grpc-status-details-bin") <= HEADER_BUDGET {
        return;
    }
    let Some(status) = Status::from_header_map(headers) else {
        return;
    };
    let details = status.get_error_details();
    // Text outside ASCII grows threefold when percent-encoded, and the
    // message is sent twice (plain, and inside the details): cut further
    // until it fits.
    let mut chars = MAX_MESSAGE_CHARS;
    loop {
        let bounded = bounded(&status, &details, chars);
        let mut candidate = headers.clone();
        candidate.remove("grpc-message");
        candidate.remove("grpc-status-details-bin");
        if bounded.add_header(&mut candidate).is_err() {
            return;
        }
        let size = |name: &str| candidate.get(name).map_or(0, |v| v.len());
        if size("grpc-message") + size("grpc-status-details-bin") <= HEADER_BUDGET || chars <= 60 {
            *headers = candidate;
            return;
        }
        chars /= 2;
    }
}

/// `status` with its message cut to `chars` characters and its
/// `ErrorInfo` values bounded.
fn bounded(status: &Status, details: &ErrorDetails, chars: usize) -> Status {
    let message = shorten(status.message(), chars);
    match details.error_info() {
        Some(info) => Status::with_error_details(
            status.code(),
            message,
            ErrorDetails::with_error_info(
                shorten(&info.reason, MAX_VALUE_CHARS),
                shorten(&info.domain, MAX_VALUE_CHARS),
                info.metadata
                    .iter()
                    .map(|(k, v)| (shorten(k, MAX_VALUE_CHARS), shorten(v, MAX_VALUE_CHARS)))
                    .collect::<std::collections::HashMap<_, _>>(),
            ),
        ),
        None => Status::new(status.code(), message),
    }
}

/// The layer that bounds the statuses of a server's answers.
#[derive(Clone, Copy, Default)]
pub struct BoundedStatusLayer;

impl<S> tower_layer::Layer<S> for BoundedStatusLayer {
    type Service = BoundedStatus<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BoundedStatus { inner }
    }
}

/// The service [`BoundedStatusLayer`] wraps around a server's routes.
#[derive(Clone)]
pub struct BoundedStatus<S> {
    inner: S,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for BoundedStatus<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let answer = self.inner.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            bound_status(response.headers_mut());
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::reasons::{Reason, reason_of, with_metadata};

    #[test]
    fn a_huge_message_is_cut_and_keeps_its_code_and_reason() {
        let id = "🦀".repeat(20_000);
        let status = with_metadata(
            tonic::Code::NotFound,
            Reason::LeaseLost,
            format!("session {id:?} not found"),
            [("session".to_string(), id.clone())].into(),
        );
        let mut headers = http::HeaderMap::new();
        status.add_header(&mut headers).unwrap();
        assert!(headers.get("grpc-message").unwrap().len() > 100_000);
        bound_status(&mut headers);
        let size = headers.get("grpc-message").unwrap().len()
            + headers.get("grpc-status-details-bin").unwrap().len();
        assert!(size <= 6 * 1024, "{size} bytes of headers");
        let back = Status::from_header_map(&headers).unwrap();
        assert_eq!(back.code(), tonic::Code::NotFound);
        assert_eq!(reason_of(&back), Reason::LeaseLost);
        assert!(back.message().starts_with("session \"🦀🦀"));
        assert!(
            back.message().ends_with(" more characters)"),
            "{}",
            back.message()
        );
    }

    #[test]
    fn a_short_status_is_left_as_it_is() {
        let status = Status::not_found("session \"abc\" not found");
        let mut headers = http::HeaderMap::new();
        status.add_header(&mut headers).unwrap();
        let before = headers.clone();
        bound_status(&mut headers);
        assert_eq!(headers, before);
    }
}
