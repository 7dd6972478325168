//! Wiring for functions on AWS: SDK clients built once per process, and sinks named by target.

use std::sync::Arc;

use super::dynamodb::{DynamoStateStore, SdkTable};
use super::kinesis::{KinesisSink, SdkKinesis};
use super::sqs::{SdkSqs, SqsSink};
use crate::ports::{Clock, Sink};

/// The SDK clients a function needs.
#[derive(Clone, Debug)]
pub struct AwsClients {
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub kinesis: Arc<SdkKinesis>,
    pub sqs: Arc<SdkSqs>,
}

impl AwsClients {
    /// Clients from the standard environment (region, credentials, `AWS_ENDPOINT_URL`).
    pub async fn from_env() -> Self {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self::from_config(&config)
    }

    pub fn from_config(config: &aws_config::SdkConfig) -> Self {
        Self {
            dynamodb: aws_sdk_dynamodb::Client::new(config),
            kinesis: Arc::new(SdkKinesis::new(aws_sdk_kinesis::Client::new(config))),
            sqs: Arc::new(SdkSqs::new(aws_sdk_sqs::Client::new(config))),
        }
    }

    pub fn state_store(
        &self,
        table: &str,
        clock: Arc<dyn Clock>,
    ) -> Arc<DynamoStateStore<SdkTable>> {
        Arc::new(DynamoStateStore::new(
            Arc::new(SdkTable::new(self.dynamodb.clone(), table)),
            clock,
        ))
    }

    /// A sink for `target`: `kinesis:<stream name>` or `sqs:<queue URL>`.
    pub fn sink(&self, target: &str) -> Result<Arc<dyn Sink>, String> {
        match target.split_once(':') {
            Some(("kinesis", stream)) if !stream.is_empty() => {
                Ok(Arc::new(KinesisSink::new(self.kinesis.clone(), stream)))
            }
            Some(("sqs", url)) if url.starts_with("http") => {
                Ok(Arc::new(SqsSink::new(self.sqs.clone(), url)))
            }
            _ => Err(format!(
                "sink target {target:?}: expected kinesis:<stream name> or sqs:<queue URL>"
            )),
        }
    }
}

/// An environment variable that must be set, or an error naming it.
pub fn required_env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("environment variable {name} is not set"))
}
