//! Typed errors of the orchestrator's own work (the service's start-up
//! errors are [`crate::RunError`]; refusals of inputs are the reducer's
//! [`crate::reducer::Refusal`]).

use agentry_llm::LlmError;

/// Why a model call gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ModelCallError {
    /// The model server or the connection failed.
    #[error(transparent)]
    Llm(#[from] LlmError),
    /// The stream ended before the complete response.
    #[error("the model stream ended without a complete response")]
    Unfinished,
    /// A summary was asked for and nothing came back.
    #[error("the model returned an empty summary")]
    EmptySummary,
}

impl ModelCallError {
    /// Whether asking again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            ModelCallError::Llm(e) => e.is_retryable(),
            ModelCallError::Unfinished => true,
            ModelCallError::EmptySummary => false,
        }
    }
}

agentry_tool::sentence_error!(
    /// What the model is told when a call the orchestrator runs itself (a
    /// built-in tool, `delegate`) fails: a sentence for the model, who may act
    /// on it; programs decide by the result's `is_error`, never by this text.
    ToolFailure
);

agentry_tool::sentence_error!(
    /// A setting the orchestrator cannot use (an address, a URL): the message
    /// names the setting and says what is wrong, for the person who set it.
    SettingError
);

/// How a refused input is told to the client: its code and reason.
pub(crate) fn refusal_status(refusal: &crate::reducer::Refusal) -> tonic::Status {
    use crate::reducer::Refusal;
    use agentry_runtime::reasons::{Reason, status};
    let reason = match refusal {
        Refusal::Busy => Reason::SessionBusy,
        Refusal::NothingToCancel | Refusal::NotParkedAtALimit => Reason::NoTurnRunning,
        Refusal::NoPendingApproval { .. } | Refusal::NoPendingQuestion { .. } => {
            Reason::NoPendingApproval
        }
        Refusal::NotAnApprover(_) => Reason::NotAnApprover,
        Refusal::EmptyMessage | Refusal::InvalidDecision(_) | Refusal::Unexpected { .. } => {
            Reason::Unspecified
        }
    };
    let code = if let Refusal::NotAnApprover(_) = refusal {
        tonic::Code::PermissionDenied
    } else if refusal.is_invalid_argument() {
        tonic::Code::InvalidArgument
    } else {
        tonic::Code::FailedPrecondition
    };
    status(code, reason, refusal.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_follows_the_cause() {
        assert!(ModelCallError::Unfinished.is_retryable());
        assert!(!ModelCallError::EmptySummary.is_retryable());
        let refused = ModelCallError::from(LlmError::Http {
            status: 400,
            message: "bad request".into(),
        });
        assert!(!refused.is_retryable());
        assert_eq!(
            refused.to_string(),
            "model server returned HTTP 400: bad request"
        );
        let busy = ModelCallError::from(LlmError::Http {
            status: 503,
            message: "busy".into(),
        });
        assert!(busy.is_retryable());
    }
}
