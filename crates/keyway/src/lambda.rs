//! What a function needs to run on Lambda and on the embedded runtime alike: the platform its
//! wiring asks for ports, its environment, and a handler the event source mapping invokes.
//!
//! A function crate exposes `handler(platform, env)`; its `main` calls it with the AWS platform
//! and the process environment, the embedded runtime with its in-memory services and the
//! environment template.yaml gives the function.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use crate::executor::{Executor, ExecutorConfig, Lineage, WiringError};
use crate::operator::KeyedOperator;
use crate::ports::{Clock, Sink, StateStore};

/// Where a function runs: it builds the ports the function's configuration names.
pub trait Platform: Send + Sync {
    /// The state store on the DynamoDB table `table`.
    fn state_store(&self, table: &str) -> Result<Arc<dyn StateStore>, PortError>;
    /// A sink for `target`: `kinesis:<stream name>` or `sqs:<queue URL>`.
    fn sink(&self, target: &str) -> Result<Arc<dyn Sink>, PortError>;
    fn clock(&self) -> Arc<dyn Clock>;
}

/// A platform cannot build the port a configuration value names.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum PortError {
    #[error("sink target {target:?}: expected kinesis:<stream name> or sqs:<queue URL>")]
    SinkTarget { target: String },
    #[error("no DynamoDB table named {table:?}")]
    NoTable { table: String },
}

/// A function's environment variables.
pub type Env = BTreeMap<String, String>;

/// The variable `name`, or an error naming it.
pub fn required<'a>(env: &'a Env, name: &str) -> Result<&'a str, ConfigError> {
    env.get(name)
        .map(String::as_str)
        .ok_or_else(|| ConfigError {
            name: name.to_owned(),
            problem: "is not set".to_owned(),
        })
}

/// The state store on the table the variable `name` names.
pub fn state_store_from(
    platform: &dyn Platform,
    env: &Env,
    name: &str,
) -> Result<Arc<dyn StateStore>, ConfigError> {
    port_from(env, name, |table| platform.state_store(table))
}

/// The sink the variable `name` names (`kinesis:<stream name>` or `sqs:<queue URL>`).
pub fn sink_from(
    platform: &dyn Platform,
    env: &Env,
    name: &str,
) -> Result<Arc<dyn Sink>, ConfigError> {
    port_from(env, name, |target| platform.sink(target))
}

fn port_from<P>(
    env: &Env,
    name: &str,
    build: impl FnOnce(&str) -> Result<P, PortError>,
) -> Result<P, ConfigError> {
    build(required(env, name)?).map_err(|e| ConfigError::new(name, e))
}

/// A function's environment says something the function cannot run with.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("environment variable {name}: {problem}")]
pub struct ConfigError {
    pub name: String,
    pub problem: String,
}

impl ConfigError {
    fn new(name: &str, problem: impl std::fmt::Display) -> Self {
        Self {
            name: name.to_owned(),
            problem: problem.to_string(),
        }
    }
}

/// A function could not be set up: a variable of its environment, or an operator that does not
/// fit the ports it was given.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum SetupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Wiring(#[from] WiringError),
}

/// Which records a watermark guards: `partition-key` (the default, right for every
/// ParallelizationFactor) or `shard` (only for mappings with ParallelizationFactor 1).
pub const LINEAGE: &str = "KEYWAY_LINEAGE";
/// How long after its arrival a record may still be redelivered, in seconds: the stream's
/// retention or the mapping's MaximumRecordAgeInSeconds, whichever is shorter. A year by default.
pub const REDELIVERY_WINDOW: &str = "KEYWAY_REDELIVERY_WINDOW_SECONDS";

/// The executor settings a function's environment gives (`LINEAGE`, `REDELIVERY_WINDOW`).
pub fn executor_config(env: &Env) -> Result<ExecutorConfig, ConfigError> {
    let mut config = ExecutorConfig::default();
    let problem = |name: &str, problem: String| ConfigError {
        name: name.to_owned(),
        problem,
    };
    match env.get(LINEAGE).map(String::as_str) {
        None | Some("partition-key") => config.lineage = Lineage::PartitionKey,
        Some("shard") => config.lineage = Lineage::Shard,
        Some(other) => {
            return Err(problem(
                LINEAGE,
                format!("{other:?} is neither partition-key nor shard"),
            ))
        }
    }
    if let Some(text) = env.get(REDELIVERY_WINDOW) {
        let seconds: u64 = text.parse().map_err(|_| {
            problem(
                REDELIVERY_WINDOW,
                format!("{text:?} is not a whole number of seconds"),
            )
        })?;
        config.redelivery_window = Duration::from_secs(seconds);
    }
    Ok(config)
}

/// Whether `config` is right for a mapping with `parallelization_factor` whose records may be
/// redelivered up to `horizon` after they arrived: a shorter window would forget watermarks a
/// redelivery still needs, and one watermark per shard skips records when a shard is read in lanes.
pub fn check_mapping(
    config: &ExecutorConfig,
    parallelization_factor: u32,
    horizon: Duration,
) -> Result<(), ConfigError> {
    if config.lineage == Lineage::Shard && parallelization_factor > 1 {
        return Err(ConfigError {
            name: LINEAGE.into(),
            problem: format!(
                "shard keeps one watermark per shard, but the mapping reads each shard in {parallelization_factor} lanes (ParallelizationFactor): use partition-key"
            ),
        });
    }
    if config.redelivery_window < horizon {
        return Err(ConfigError {
            name: REDELIVERY_WINDOW.into(),
            problem: format!(
                "{} seconds is shorter than the {} seconds the mapping can still redeliver a record after it arrived (the stream's retention, or MaximumRecordAgeInSeconds if shorter)",
                config.redelivery_window.as_secs(),
                horizon.as_secs()
            ),
        });
    }
    Ok(())
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
/// responses (the source is told by the records' `eventSource`); a scheduled event sweeps the
/// operator's due timers.
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
        if is_scheduled(&event) {
            // The function's schedule (a `Schedule` event in its template) sweeps due timers.
            let sweep = self
                .executor
                .fire_timers(invocation.deadline_millis)
                .await
                .map_err(|e| FunctionError(format!("the timer sweep failed: {e}")))?;
            return Ok(serde_json::to_value(sweep).expect("a sweep serializes"));
        }
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
        response.map_err(|e| FunctionError(e.to_string()))
    }
}

/// Whether `event` is a schedule's (an EventBridge rule's "Scheduled Event", or EventBridge
/// Scheduler's) rather than a stream batch.
fn is_scheduled(event: &Value) -> bool {
    event.get("Records").is_none()
        && (event["detail-type"] == "Scheduled Event"
            || matches!(
                event["source"].as_str(),
                Some("aws.events" | "aws.scheduler")
            ))
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
    pub fn parse(target: &str) -> Result<Self, PortError> {
        match target.split_once(':') {
            Some(("kinesis", stream)) if !stream.is_empty() => Ok(Self::Kinesis(stream.to_owned())),
            Some(("sqs", url)) if url.starts_with("http") => Ok(Self::Sqs(url.to_owned())),
            _ => Err(PortError::SinkTarget {
                target: target.to_owned(),
            }),
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
        let err = SinkTarget::parse("sns:topic").unwrap_err().to_string();
        assert!(
            err.contains("\"sns:topic\"") && err.contains("kinesis:<stream name>"),
            "{err}"
        );
        assert!(SinkTarget::parse("kinesis:").is_err());
    }

    #[test]
    fn the_environment_sets_the_lineage_and_the_redelivery_window_and_names_a_bad_value() {
        let env: Env = [
            (LINEAGE.to_owned(), "shard".to_owned()),
            (REDELIVERY_WINDOW.to_owned(), "90000".to_owned()),
        ]
        .into();
        let config = executor_config(&env).unwrap();
        assert_eq!(config.lineage, Lineage::Shard);
        assert_eq!(config.redelivery_window, Duration::from_secs(90_000));
        let defaults = executor_config(&Env::new()).unwrap();
        assert_eq!(defaults.lineage, Lineage::PartitionKey);
        let bad: Env = [(LINEAGE.to_owned(), "key".to_owned())].into();
        let err = executor_config(&bad).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("environment variable KEYWAY_LINEAGE"),
            "{err}"
        );
    }

    #[test]
    fn a_mapping_that_could_outlive_the_watermarks_or_read_lanes_with_one_per_shard_is_refused() {
        let day = Duration::from_secs(86_400);
        let mut config = ExecutorConfig {
            redelivery_window: day,
            ..ExecutorConfig::default()
        };
        assert!(check_mapping(&config, 10, day).is_ok());
        let err = check_mapping(&config, 1, 7 * day).unwrap_err();
        assert_eq!(err.name, REDELIVERY_WINDOW);
        config.lineage = Lineage::Shard;
        assert!(check_mapping(&config, 1, day).is_ok());
        assert_eq!(check_mapping(&config, 2, day).unwrap_err().name, LINEAGE);
    }

    #[test]
    fn a_missing_variable_is_named() {
        let err = required(&Env::new(), "STATE_TABLE").unwrap_err();
        assert_eq!(err.name, "STATE_TABLE");
        assert_eq!(
            err.to_string(),
            "environment variable STATE_TABLE: is not set"
        );
    }

    #[test]
    fn a_sink_variable_that_names_no_sink_is_named_with_the_problem() {
        struct Nowhere;
        impl Platform for Nowhere {
            fn state_store(&self, table: &str) -> Result<Arc<dyn StateStore>, PortError> {
                Err(PortError::NoTable {
                    table: table.to_owned(),
                })
            }
            fn sink(&self, target: &str) -> Result<Arc<dyn Sink>, PortError> {
                Err(SinkTarget::parse(target).unwrap_err())
            }
            fn clock(&self) -> Arc<dyn Clock> {
                Arc::new(crate::ports::SystemClock)
            }
        }
        let env: Env = [
            ("COUNTS_SINK".to_owned(), "sns:topic".to_owned()),
            ("STATE_TABLE".to_owned(), "state".to_owned()),
        ]
        .into();
        let err = sink_from(&Nowhere, &env, "COUNTS_SINK").err().unwrap();
        assert_eq!(err.name, "COUNTS_SINK");
        assert!(err.problem.contains("\"sns:topic\""), "{err}");
        let err = state_store_from(&Nowhere, &env, "STATE_TABLE")
            .err()
            .unwrap();
        assert_eq!(err.name, "STATE_TABLE");
        assert_eq!(err.problem, "no DynamoDB table named \"state\"");
        let err = sink_from(&Nowhere, &env, "ALERTS_SINK").err().unwrap();
        assert_eq!(
            (err.name.as_str(), err.problem.as_str()),
            ("ALERTS_SINK", "is not set")
        );
    }

    #[test]
    fn a_scheduled_event_is_told_from_a_stream_batch() {
        // The documented EventBridge "Scheduled Event".
        let scheduled = serde_json::json!({
            "version": "0",
            "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
            "detail-type": "Scheduled Event",
            "source": "aws.events",
            "account": "123456789012",
            "time": "2015-10-08T16:53:06Z",
            "region": "us-east-1",
            "resources": ["arn:aws:events:us-east-1:123456789012:rule/my-scheduled-rule"],
            "detail": {}
        });
        assert!(is_scheduled(&scheduled));
        assert!(is_scheduled(
            &serde_json::json!({"source": "aws.scheduler"})
        ));
        let batch = serde_json::json!({"Records": [{"eventSource": "aws:kinesis"}]});
        assert!(!is_scheduled(&batch));
        assert!(!is_scheduled(
            &serde_json::json!({"detail-type": "Object Created"})
        ));
    }
}
