//! The AWS platform: SDK clients built once per process, and the ports a function's
//! configuration names.

use std::sync::Arc;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
use aws_smithy_runtime_api::client::http::SharedHttpClient;

use super::platform::{Platform, PortError, SinkMaker, SinkTarget, TableAccess};
use crate::adapters::dynamodb::{DynamoStateStore, SdkTable, Table};
use crate::adapters::kinesis::{KinesisSink, SdkKinesis};
use crate::adapters::sqs::{SdkSqs, SqsSink};
use crate::ports::{Clock, MetricLog, Sink, StateStore, StdoutMetrics, SystemClock};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One attempt of any call: BatchWriteItem of 25 items and PutRecords of 5 MB take well under it.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// The SDK's configuration loader with keyway's HTTPS client: the standard environment (region,
/// credentials, `AWS_ENDPOINT_URL`) is read by `load`.
pub fn config_loader() -> aws_config::ConfigLoader {
    aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(https_client())
}

/// The one HTTP client of every SDK client: hyper with rustls on ring, and the system's trusted
/// roots. The SDK's default client is the same on aws-lc, a C library that takes minutes to
/// build for each architecture and weighs in every function's zip, for faster handshakes that a
/// function makes few of: one per connection its process keeps.
pub fn https_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// The SDK clients a function needs.
#[derive(Clone, Debug)]
pub struct AwsClients {
    /// DynamoDB: the state store and an application's own tables.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// Kinesis, for Kinesis sinks.
    pub kinesis: Arc<SdkKinesis>,
    /// SQS, for SQS sinks.
    pub sqs: Arc<SdkSqs>,
}

impl AwsClients {
    /// Clients from the standard environment (region, credentials, `AWS_ENDPOINT_URL`).
    pub async fn from_env() -> Self {
        Self::from_config(&config_loader().load().await)
    }

    /// Clients on `config`, with the SDK's own retries turned off: every adapter retries with
    /// its own backoff, knowing which entries of a batch call to send again, and retries on top
    /// of the SDK's would multiply. Timeouts are explicit, so that a call that hangs is retried
    /// (or given up) well inside the function's timeout.
    pub fn from_config(config: &aws_config::SdkConfig) -> Self {
        let config = config
            .to_builder()
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT)
                    .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                    .build(),
            )
            .build();
        Self {
            dynamodb: aws_sdk_dynamodb::Client::new(&config),
            kinesis: Arc::new(SdkKinesis::new(aws_sdk_kinesis::Client::new(&config))),
            sqs: Arc::new(SdkSqs::new(aws_sdk_sqs::Client::new(&config))),
        }
    }
}

impl Platform for AwsClients {
    fn state_store(&self, table: &str) -> Result<Arc<dyn StateStore>, PortError> {
        let table = Arc::new(SdkTable::new(self.dynamodb.clone(), table));
        Ok(Arc::new(DynamoStateStore::new(table, self.clock())))
    }

    /// IAM holds the function to `_access`: the role grants no more.
    fn table(&self, table: &str, _access: TableAccess) -> Result<Arc<dyn Table>, PortError> {
        Ok(Arc::new(SdkTable::new(self.dynamodb.clone(), table)))
    }

    fn sink_maker(&self) -> SinkMaker {
        let clients = self.clone();
        Arc::new(move |target| {
            Ok(match SinkTarget::parse(target)? {
                SinkTarget::Kinesis(stream) => {
                    Arc::new(KinesisSink::new(clients.kinesis.clone(), stream)) as Arc<dyn Sink>
                }
                SinkTarget::Sqs(url) => Arc::new(SqsSink::new(clients.sqs.clone(), url)),
            })
        })
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::new(SystemClock)
    }

    fn metrics(&self) -> Arc<dyn MetricLog> {
        Arc::new(StdoutMetrics)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_clients_leave_retries_to_the_adapters_and_time_out_explicitly() {
        let config = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .build();
        let clients = AwsClients::from_config(&config);
        let dynamodb = clients.dynamodb.config();
        assert_eq!(dynamodb.retry_config().map(|r| r.max_attempts()), Some(1));
        let timeouts = dynamodb.timeout_config().expect("timeouts set");
        assert_eq!(timeouts.operation_attempt_timeout(), Some(ATTEMPT_TIMEOUT));
        assert_eq!(timeouts.connect_timeout(), Some(CONNECT_TIMEOUT));
        assert_eq!(
            clients
                .sqs
                .config()
                .retry_config()
                .map(|r| r.max_attempts()),
            Some(1)
        );
        assert_eq!(
            clients
                .kinesis
                .config()
                .retry_config()
                .map(|r| r.max_attempts()),
            Some(1)
        );
    }
}
