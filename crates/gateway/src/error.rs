//! How the API says no: an HTTP status and a JSON body
//! `{"error": sentence, "reason": word}` a page can show as it is.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::time::Duration;

/// A refused or failed API request.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    reason: String,
    message: String,
    retry_after: Option<Duration>,
}

impl ApiError {
    /// An error with `status`, a one-word `reason` and a sentence.
    pub fn new(status: StatusCode, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            reason: reason.to_string(),
            message: message.into(),
            retry_after: None,
        }
    }

    /// Not logged in (or the login ended).
    pub fn login() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "login",
            "log in with your token first",
        )
    }

    /// Refused.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// Malformed.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// Broken here.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// Too many failed logins: wait.
    pub fn too_many(wait: Duration) -> ApiError {
        ApiError {
            retry_after: Some(wait),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_logins",
                format!(
                    "too many failed logins from this address: try again in {} s",
                    wait.as_secs().max(1)
                ),
            )
        }
    }
}

impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> ApiError {
        use tonic::Code;
        let http = match status.code() {
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::Aborted | Code::FailedPrecondition => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable | Code::DeadlineExceeded => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let reason = agentry_runtime::reasons::reason_of(&status);
        let reason = match reason {
            agentry_runtime::reasons::Reason::Unspecified => {
                format!("{:?}", status.code()).to_lowercase()
            }
            other => other
                .as_str_name()
                .trim_start_matches("REASON_")
                .to_lowercase(),
        };
        ApiError::new(http, &reason, status.message())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(serde_json::json!({"error": self.message, "reason": self.reason})),
        )
            .into_response();
        if let Some(wait) = self.retry_after
            && let Ok(value) = HeaderValue::from_str(&wait.as_secs().max(1).to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}
