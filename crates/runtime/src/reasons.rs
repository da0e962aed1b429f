//! Why a call failed, for programs: a [`Reason`] travels in the status's
//! details as a `google.rpc.ErrorInfo` (domain [`DOMAIN`]), so a caller
//! matches the reason and never the message, which is for people.

pub use agentry_proto::errors::v1::Reason;
use std::collections::HashMap;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The `ErrorInfo.domain` of Agentry's reasons.
pub const DOMAIN: &str = "agentry";

/// A status with `reason` in its details.
pub fn status(code: Code, reason: Reason, message: impl Into<String>) -> Status {
    with_metadata(code, reason, message, HashMap::new())
}

/// [`status`] with `ErrorInfo.metadata` (e.g. the URL of the replica that
/// drives a session).
pub fn with_metadata(
    code: Code,
    reason: Reason,
    message: impl Into<String>,
    metadata: HashMap<String, String>,
) -> Status {
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(wire_name(reason), DOMAIN, metadata),
    )
}

/// The reason a status carries ([`Reason::Unspecified`] for none, another
/// domain's, or one this build does not know).
pub fn reason_of(status: &Status) -> Reason {
    status
        .get_details_error_info()
        .filter(|info| info.domain == DOMAIN)
        .and_then(|info| Reason::from_str_name(&format!("REASON_{}", info.reason)))
        .unwrap_or(Reason::Unspecified)
}

/// A metadata value of the reason a status carries.
pub fn metadata_of(status: &Status, key: &str) -> Option<String> {
    status
        .get_details_error_info()
        .filter(|info| info.domain == DOMAIN)
        .and_then(|info| info.metadata.get(key).cloned())
}

/// `status` told in other words (with context for a person), keeping its
/// code and its details, so the reason survives being passed on.
pub fn restated(status: &Status, message: impl Into<String>) -> Status {
    Status::with_details(status.code(), message, status.details().to_vec().into())
}

/// The reason's name on the wire: the enum value's without `REASON_`.
fn wire_name(reason: Reason) -> String {
    let name = reason.as_str_name();
    name.strip_prefix("REASON_").unwrap_or(name).to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[test]
    fn a_reason_survives_the_wire_and_a_restatement() {
        let refused = status(Code::FailedPrecondition, Reason::LeaseLost, "lost it");
        assert_eq!(reason_of(&refused), Reason::LeaseLost);
        let info = refused.get_details_error_info().expect("error info");
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("LEASE_LOST", "agentry")
        );
        // Through HTTP/2 headers and back, as a client sees it.
        let mut headers = http::HeaderMap::new();
        refused.add_header(&mut headers).expect("headers");
        let received = Status::from_header_map(&headers).expect("a status");
        assert_eq!(reason_of(&received), Reason::LeaseLost);
        let told = restated(&received, "cannot append: lost it");
        assert_eq!(told.code(), Code::FailedPrecondition);
        assert_eq!(told.message(), "cannot append: lost it");
        assert_eq!(reason_of(&told), Reason::LeaseLost);
    }

    #[test]
    fn no_reason_is_unspecified_and_metadata_is_read() {
        assert_eq!(
            reason_of(&Status::failed_precondition("x")),
            Reason::Unspecified
        );
        let elsewhere = with_metadata(
            Code::FailedPrecondition,
            Reason::DrivenElsewhere,
            "driven at b",
            HashMap::from([("url".to_string(), "http://b:7741".to_string())]),
        );
        assert_eq!(reason_of(&elsewhere), Reason::DrivenElsewhere);
        assert_eq!(
            metadata_of(&elsewhere, "url").as_deref(),
            Some("http://b:7741")
        );
        assert_eq!(metadata_of(&elsewhere, "other"), None);
    }
}
