//! Classifies AWS errors into retryable and final ones, for every adapter: SDK errors of whole
//! calls, and the error codes of single entries of batch calls (PutRecords, SendMessageBatch).
//!
//! The tables hold the codes the service API references document for DynamoDB, Kinesis, SQS and
//! KMS (a KMS-encrypted stream or queue answers with KMS's codes), and those the SDKs' own retry
//! classifiers treat as throttling or transient. A code that says the request is configured
//! wrongly for now (a KMS key disabled, access denied) is not the message's fault: it is
//! retryable, so that records wait for the fix instead of going to the dead-letter sink.

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// What an SDK error means to the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    /// Throttled: back off and retry.
    Throttled(String),
    /// A transient failure (timeout, connection, 5xx) or a configuration being fixed: retry.
    Unavailable(String),
    /// A condition did not hold.
    ConditionFailed(String),
    /// The request itself is wrong: retrying will not help.
    Invalid(String),
}

/// What an error code says of a request, before any condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CodeClass {
    Throttled,
    Transient,
    /// Nothing in the tables: the request itself is at fault.
    Refused,
}

/// Codes AWS services answer when a caller goes too fast.
const THROTTLING: &[&str] = &[
    // The SDKs' retry classifiers.
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "RequestThrottled",
    "SlowDown",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
    // DynamoDB.
    "ReplicatedWriteConflictException",
    // SQS (query and JSON protocols).
    "AWS.SimpleQueueService.RequestThrottled",
    "KmsThrottled",
    "KMS.ThrottlingException",
    // Kinesis.
    "KMSThrottlingException",
];

/// Codes of transient service-side failures, and of KMS states an operator fixes.
const TRANSIENT: &[&str] = &[
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalServerError",
    "InternalFailure",
    "InternalError",
    "InternalServiceError",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "TransactionConflictException",
    "AWS.SimpleQueueService.InternalError",
    // KMS behind Kinesis (PutRecords entries and calls).
    "KMSInternalException",
    "KMSDisabledException",
    "KMSInvalidStateException",
    "KMSAccessDeniedException",
    "KMSNotFoundException",
    "KMSOptInRequired",
    // KMS behind SQS.
    "KmsAccessDenied",
    "KmsDisabled",
    "KmsInvalidState",
    "KmsNotFound",
    "KmsOptInRequired",
    "KmsInvalidKeyUsage",
    "KMS.KMSInternalException",
    "KMS.DisabledException",
    "KMS.KMSInvalidStateException",
    "KMS.AccessDeniedException",
    "KMS.NotFoundException",
    "KMS.KeyUnavailableException",
    "KMS.DependencyTimeoutException",
];

/// The class of an error code.
pub(crate) fn class_of(code: &str) -> CodeClass {
    if THROTTLING.contains(&code) {
        CodeClass::Throttled
    } else if TRANSIENT.contains(&code) {
        CodeClass::Transient
    } else {
        CodeClass::Refused
    }
}

pub(crate) fn classify<E, R>(err: &SdkError<E, R>) -> ErrorClass
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let text = DisplayErrorContext(err).to_string();
    match err {
        SdkError::ServiceError(service) => {
            let code = service.err().code().unwrap_or_default();
            if code == "ConditionalCheckFailedException" {
                return ErrorClass::ConditionFailed(text);
            }
            match class_of(code) {
                CodeClass::Throttled => ErrorClass::Throttled(text),
                CodeClass::Transient => ErrorClass::Unavailable(text),
                CodeClass::Refused => ErrorClass::Invalid(text),
            }
        }
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            ErrorClass::Unavailable(text)
        }
        _ => ErrorClass::Invalid(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service_error(
        code: &str,
    ) -> SdkError<
        aws_sdk_sqs::operation::send_message_batch::SendMessageBatchError,
        aws_smithy_runtime_api::http::Response,
    > {
        use aws_sdk_sqs::error::ErrorMetadata;
        let err = aws_sdk_sqs::operation::send_message_batch::SendMessageBatchError::generic(
            ErrorMetadata::builder()
                .code(code)
                .message("injected")
                .build(),
        );
        let response = aws_smithy_runtime_api::http::Response::new(
            aws_smithy_runtime_api::http::StatusCode::try_from(400).unwrap(),
            aws_smithy_types::body::SdkBody::empty(),
        );
        SdkError::service_error(err, response)
    }

    #[test]
    fn a_throttled_call_to_a_kms_encrypted_queue_is_retryable() {
        assert!(matches!(
            classify(&service_error("KMS.ThrottlingException")),
            ErrorClass::Throttled(_)
        ));
        assert!(matches!(
            classify(&service_error("KmsDisabled")),
            ErrorClass::Unavailable(_)
        ));
        assert!(matches!(
            classify(&service_error("InvalidMessageContents")),
            ErrorClass::Invalid(_)
        ));
    }

    #[test]
    fn every_documented_code_has_its_class() {
        let table = [
            // DynamoDB
            (
                "ProvisionedThroughputExceededException",
                CodeClass::Throttled,
            ),
            ("ThrottlingException", CodeClass::Throttled),
            ("RequestLimitExceeded", CodeClass::Throttled),
            ("InternalServerError", CodeClass::Transient),
            ("ServiceUnavailable", CodeClass::Transient),
            ("TransactionConflictException", CodeClass::Transient),
            ("ValidationException", CodeClass::Refused),
            ("ResourceNotFoundException", CodeClass::Refused),
            (
                "ItemCollectionSizeLimitExceededException",
                CodeClass::Refused,
            ),
            // Kinesis
            ("LimitExceededException", CodeClass::Throttled),
            ("KMSThrottlingException", CodeClass::Throttled),
            ("InternalFailure", CodeClass::Transient),
            ("KMSInternalException", CodeClass::Transient),
            ("KMSDisabledException", CodeClass::Transient),
            ("KMSAccessDeniedException", CodeClass::Transient),
            ("KMSInvalidStateException", CodeClass::Transient),
            ("KMSNotFoundException", CodeClass::Transient),
            ("KMSOptInRequired", CodeClass::Transient),
            ("InvalidArgumentException", CodeClass::Refused),
            // SQS
            ("RequestThrottled", CodeClass::Throttled),
            (
                "AWS.SimpleQueueService.RequestThrottled",
                CodeClass::Throttled,
            ),
            ("KmsThrottled", CodeClass::Throttled),
            ("KMS.ThrottlingException", CodeClass::Throttled),
            ("KmsDisabled", CodeClass::Transient),
            ("KMS.KMSInternalException", CodeClass::Transient),
            ("InternalError", CodeClass::Transient),
            ("InvalidMessageContents", CodeClass::Refused),
            ("InvalidParameterValue", CodeClass::Refused),
            ("BatchRequestTooLong", CodeClass::Refused),
            // The SDKs' own lists
            ("SlowDown", CodeClass::Throttled),
            ("RequestTimeout", CodeClass::Transient),
            ("TooManyRequestsException", CodeClass::Throttled),
        ];
        for (code, class) in table {
            assert_eq!(class_of(code), class, "{code}");
        }
    }
}
