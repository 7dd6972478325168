//! Classifies AWS SDK errors into retryable and final ones, for every adapter.

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// What an SDK error means to the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// Throttled: back off and retry.
    Throttled(String),
    /// A transient failure (timeout, connection, 5xx): retry.
    Unavailable(String),
    /// A condition did not hold.
    ConditionFailed(String),
    /// The request itself is wrong: retrying will not help.
    Invalid(String),
}

/// Error codes AWS services answer when a caller goes too fast.
const THROTTLING: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "Throttling",
    "RequestLimitExceeded",
    "LimitExceededException",
    "RequestThrottled",
    "TooManyRequestsException",
    "KMSThrottlingException",
];

/// Error codes of transient service-side failures.
const TRANSIENT: &[&str] = &[
    "InternalServerError",
    "InternalFailure",
    "InternalError",
    "ServiceUnavailable",
    "ServiceUnavailableException",
];

pub fn classify<E, R>(err: &SdkError<E, R>) -> ErrorClass
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let text = DisplayErrorContext(err).to_string();
    match err {
        SdkError::ServiceError(service) => {
            let code = service.err().code().unwrap_or_default();
            if code == "ConditionalCheckFailedException" || code == "TransactionCanceledException" {
                ErrorClass::ConditionFailed(text)
            } else if THROTTLING.contains(&code) {
                ErrorClass::Throttled(text)
            } else if TRANSIENT.contains(&code) {
                ErrorClass::Unavailable(text)
            } else {
                ErrorClass::Invalid(text)
            }
        }
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            ErrorClass::Unavailable(text)
        }
        _ => ErrorClass::Invalid(text),
    }
}
