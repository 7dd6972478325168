//! The AWS APIs of the in-memory services over HTTP, for a function that runs as a process of its
//! own (`external`): its SDK, pointed here by `AWS_ENDPOINT_URL`, writes to the same
//! tables, streams and queues the in-process functions and the event source mappings use.
//!
//! The JSON protocols (`X-Amz-Target`) of DynamoDB's item operations (`dynamodb`, with the
//! expression language of `expression`), and of Kinesis's and SQS's writes (`streams`). Requests
//! are not authenticated: any signature is taken. An operation or parameter that is not served is
//! answered with an error naming it, never approximated.

mod dynamodb;
pub mod expression;
mod streams;

use std::sync::Arc;

use serde_json::{json, Value};

use super::http::{self, Request, Response};
use super::runtime::LocalServices;

/// A request the services refuse, as AWS's JSON protocols answer it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ApiError {
    /// The HTTP status: 400 for a request at fault, 500 for a failure of the service.
    pub status: u16,
    /// The error's type, such as `ValidationException`, sent as `__type`.
    pub code: String,
    /// What is wrong, in words.
    pub message: String,
}

impl ApiError {
    fn code(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: 400,
            code: code.into(),
            message: message.into(),
        }
    }

    fn validation(message: impl Into<String>) -> Self {
        Self::code("ValidationException", message)
    }

    fn expression(err: expression::ExpressionError) -> Self {
        Self::validation(err.0)
    }

    fn unknown_operation(service: &str, operation: &str) -> Self {
        Self::code(
            "UnknownOperationException",
            format!("{service} {operation}: not served by the embedded runtime"),
        )
    }
}

/// The services' endpoint: what a process's `AWS_ENDPOINT_URL` is set to.
pub struct AwsApi {
    /// The URL the services answer on, `http://127.0.0.1:<port>`.
    pub endpoint: String,
    server: tokio::task::JoinHandle<()>,
}

impl AwsApi {
    /// Serves `services` on a loopback port, on tasks of the calling runtime.
    pub async fn start(services: Arc<LocalServices>) -> std::io::Result<Self> {
        let (listener, address) = http::bind().await?;
        let service: http::Service = Arc::new(move |request| {
            let services = services.clone();
            Box::pin(async move { answer(&services, request).await })
        });
        Ok(Self {
            endpoint: format!("http://{address}"),
            server: http::serve(listener, service),
        })
    }
}

impl Drop for AwsApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn answer(services: &LocalServices, request: Request) -> Response {
    let target = request
        .header("x-amz-target")
        .unwrap_or_default()
        .to_owned();
    let (content_type, result) = match serde_json::from_slice::<Value>(&request.body) {
        Err(err) => (
            "application/x-amz-json-1.0",
            Err(ApiError::code(
                "SerializationException",
                format!("the body is not JSON: {err}"),
            )),
        ),
        Ok(body) => call(services, &target, &body).await,
    };
    match result {
        Ok(body) => Response::new(200, body.to_string()).with_header("content-type", content_type),
        Err(err) => {
            tracing::debug!(%target, code = %err.code, message = %err.message, "a service call was refused");
            let body = json!({ "__type": err.code, "message": err.message });
            Response::new(err.status, body.to_string())
                .with_header("content-type", content_type)
                .with_header("x-amzn-errortype", err.code.clone())
                .with_header("x-amzn-query-error", format!("{};Sender", err.code))
        }
    }
}

async fn call(
    services: &LocalServices,
    target: &str,
    body: &Value,
) -> (&'static str, Result<Value, ApiError>) {
    const JSON_10: &str = "application/x-amz-json-1.0";
    const JSON_11: &str = "application/x-amz-json-1.1";
    match target.split_once('.') {
        Some(("DynamoDB_20120810", operation)) => (
            JSON_10,
            dynamodb::call(&services.dynamodb, operation, body).await,
        ),
        Some(("Kinesis_20131202", operation)) => (
            JSON_11,
            streams::kinesis(&services.kinesis, operation, body).await,
        ),
        Some(("AmazonSQS", operation)) => {
            (JSON_10, streams::sqs(&services.sqs, operation, body).await)
        }
        _ => (
            JSON_10,
            Err(ApiError::code(
                "UnknownOperationException",
                format!("X-Amz-Target {target:?}: the embedded runtime serves DynamoDB's item operations and Kinesis's and SQS's writes"),
            )),
        ),
    }
}
