//! What a function needs to run on Lambda and on the embedded runtime alike: the platform its
//! wiring asks for ports, its environment, and a handler the event source mapping invokes.
//!
//! A function crate exposes `handler(platform, env)`; its `main` calls it with the AWS platform
//! and the process environment, the embedded runtime with its in-memory services and the
//! environment template.yaml gives the function.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::executor::Executor;
use crate::operator::KeyedOperator;
use crate::ports::{Clock, Sink, StateStore};

/// Where a function runs: it builds the ports the function's configuration names.
pub trait Platform: Send + Sync {
    /// The state store on the DynamoDB table `table`.
    fn state_store(&self, table: &str) -> Result<Arc<dyn StateStore>, String>;
    /// A sink for `target`: `kinesis:<stream name>` or `sqs:<queue URL>`.
    fn sink(&self, target: &str) -> Result<Arc<dyn Sink>, String>;
    fn clock(&self) -> Arc<dyn Clock>;
}

/// A function's environment variables.
pub type Env = BTreeMap<String, String>;

/// The variable `name`, or an error naming it.
pub fn required<'a>(env: &'a Env, name: &str) -> Result<&'a str, String> {
    env.get(name)
        .map(String::as_str)
        .ok_or_else(|| format!("environment variable {name} is not set"))
}

/// An invocation failed: Lambda retries the batch (or bisects it).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct FunctionError(pub String);

/// What Lambda says of one invocation besides its event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Invocation {
    pub request_id: String,
    /// When the invocation times out (epoch milliseconds), if it does.
    pub deadline_millis: Option<i64>,
}

/// A Lambda function as the event source mapping sees it: an event's JSON text in, a response
/// out. Text, as Lambda hands the payload to the function's runtime, which parses it.
#[async_trait]
pub trait Handler: Send + Sync {
    async fn handle(&self, event: &str, invocation: &Invocation) -> Result<Value, FunctionError>;
}

/// Runs Kinesis and DynamoDB Streams events through an executor and answers partial batch
/// responses; the source is told by the records' `eventSource`.
pub struct StreamHandler<O: KeyedOperator> {
    executor: Executor<O>,
}

impl<O: KeyedOperator> StreamHandler<O> {
    pub fn new(executor: Executor<O>) -> Self {
        Self { executor }
    }

    pub fn executor(&self) -> &Executor<O> {
        &self.executor
    }
}

#[async_trait]
impl<O: KeyedOperator> Handler for StreamHandler<O> {
    async fn handle(&self, event: &str, invocation: &Invocation) -> Result<Value, FunctionError> {
        let event: Value = serde_json::from_str(event)
            .map_err(|e| FunctionError(format!("the event is not JSON: {e}")))?;
        let source = event["Records"][0]["eventSource"]
            .as_str()
            .unwrap_or("aws:kinesis")
            .to_owned();
        let response = match source.as_str() {
            "aws:dynamodb" => {
                crate::sources::run_dynamodb(&self.executor, event, invocation.deadline_millis)
                    .await
            }
            .map(|r| serde_json::to_value(r).expect("a response serializes")),
            _ => crate::sources::run_kinesis(&self.executor, event, invocation.deadline_millis)
                .await
                .map(|r| serde_json::to_value(r).expect("a response serializes")),
        };
        response.map_err(FunctionError)
    }
}

/// Where a sink sends to, as configuration names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkTarget {
    /// `kinesis:<stream name>`
    Kinesis(String),
    /// `sqs:<queue URL>`
    Sqs(String),
}

impl SinkTarget {
    pub fn parse(target: &str) -> Result<Self, String> {
        match target.split_once(':') {
            Some(("kinesis", stream)) if !stream.is_empty() => Ok(Self::Kinesis(stream.to_owned())),
            Some(("sqs", url)) if url.starts_with("http") => Ok(Self::Sqs(url.to_owned())),
            _ => Err(format!(
                "sink target {target:?}: expected kinesis:<stream name> or sqs:<queue URL>"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_targets_name_a_stream_or_a_queue_url() {
        assert_eq!(
            SinkTarget::parse("kinesis:counts"),
            Ok(SinkTarget::Kinesis("counts".into()))
        );
        let url = "https://sqs.eu-west-1.amazonaws.com/123456789012/out";
        assert_eq!(
            SinkTarget::parse(&format!("sqs:{url}")),
            Ok(SinkTarget::Sqs(url.into()))
        );
        let err = SinkTarget::parse("sns:topic").unwrap_err();
        assert!(
            err.contains("\"sns:topic\"") && err.contains("kinesis:<stream name>"),
            "{err}"
        );
        assert!(SinkTarget::parse("kinesis:").is_err());
    }

    #[test]
    fn a_missing_variable_is_named() {
        assert_eq!(
            required(&Env::new(), "STATE_TABLE"),
            Err("environment variable STATE_TABLE is not set".into())
        );
    }
}
