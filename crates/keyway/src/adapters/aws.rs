//! The AWS platform: SDK clients built once per process, and the ports a function's
//! configuration names.

use std::sync::Arc;

use super::dynamodb::{DynamoStateStore, SdkTable};
use super::kinesis::{KinesisSink, SdkKinesis};
use super::sqs::{SdkSqs, SqsSink};
use crate::lambda::{Platform, SinkTarget};
use crate::ports::{Clock, Sink, StateStore, SystemClock};

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
}

impl Platform for AwsClients {
    fn state_store(&self, table: &str) -> Result<Arc<dyn StateStore>, String> {
        let table = Arc::new(SdkTable::new(self.dynamodb.clone(), table));
        Ok(Arc::new(DynamoStateStore::new(table, self.clock())))
    }

    fn sink(&self, target: &str) -> Result<Arc<dyn Sink>, String> {
        Ok(match SinkTarget::parse(target)? {
            SinkTarget::Kinesis(stream) => Arc::new(KinesisSink::new(self.kinesis.clone(), stream)),
            SinkTarget::Sqs(url) => Arc::new(SqsSink::new(self.sqs.clone(), url)),
        })
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::new(SystemClock)
    }
}
