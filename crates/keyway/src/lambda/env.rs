//! A function's environment: the variables it reads, each error naming the variable, and the
//! executor settings and ports they give.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::platform::{Platform, PortError, TableAccess};
use crate::adapters::dynamodb::{HotKeyRegistry, Table};
use crate::domain::skew::Hysteresis;
use crate::executor::{Executor, ExecutorConfig, Lineage, WiringError};
use crate::operator::KeyedOperator;
use crate::ports::{Sink, StateStore};

/// A function's environment variables.
pub type Env = BTreeMap<String, String>;

/// An environment of `pairs`, as a test or a tool sets one.
pub fn env_of(pairs: &[(&str, &str)]) -> Env {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The variable `name`, or an error naming it.
pub fn required<'a>(env: &'a Env, name: &str) -> Result<&'a str, ConfigError> {
    env.get(name)
        .map(String::as_str)
        .ok_or_else(|| ConfigError {
            name: name.to_owned(),
            problem: "is not set".to_owned(),
        })
}

/// The variable `name` as a whole number; none when it is unset or empty (a template parameter
/// left at an empty default), an error naming it when it is something else.
pub fn whole_number<T: std::str::FromStr>(env: &Env, name: &str) -> Result<Option<T>, ConfigError> {
    env.get(name)
        .filter(|text| !text.is_empty())
        .map(|text| {
            text.parse().map_err(|_| ConfigError {
                name: name.to_owned(),
                problem: format!("{text:?} is not a whole number"),
            })
        })
        .transpose()
}

/// The state store on the table the variable `name` names.
pub fn state_store_from(
    platform: &dyn Platform,
    env: &Env,
    name: &str,
) -> Result<Arc<dyn StateStore>, ConfigError> {
    port_from(env, name, |table| platform.state_store(table))
}

/// The DynamoDB table the variable `name` names, to read and write.
pub fn table_from(
    platform: &dyn Platform,
    env: &Env,
    name: &str,
) -> Result<Arc<dyn Table>, ConfigError> {
    port_from(env, name, |table| {
        platform.table(table, TableAccess::ReadWrite)
    })
}

/// The DynamoDB table the variable `name` names, to read only: the function's role grants no
/// writes on it.
pub fn read_table_from(
    platform: &dyn Platform,
    env: &Env,
    name: &str,
) -> Result<Arc<dyn Table>, ConfigError> {
    port_from(env, name, |table| platform.table(table, TableAccess::Read))
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
    /// The variable's name.
    pub name: String,
    /// What is wrong with it (`is not set`, a value out of range).
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
    /// A variable of the function's environment is missing or wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The operator does not fit the ports it was given.
    #[error(transparent)]
    Wiring(#[from] WiringError),
}

/// Which records a watermark guards: `partition-key` (the default, right for every
/// ParallelizationFactor) or `shard` (only for mappings with ParallelizationFactor 1).
pub const LINEAGE: &str = "KEYWAY_LINEAGE";
/// How long after its arrival a record may still be redelivered, in seconds: the stream's
/// retention or the mapping's MaximumRecordAgeInSeconds, whichever is shorter. A year by default.
pub const REDELIVERY_WINDOW: &str = "KEYWAY_REDELIVERY_WINDOW_SECONDS";

/// `executor`, writing each batch's skew line (records, bytes, keys, hot keys per shard) to the
/// platform's metric log under the function's name (`AWS_LAMBDA_FUNCTION_NAME`, which Lambda
/// sets; else the operator's).
pub fn observed<O: KeyedOperator>(
    executor: Executor<O>,
    platform: &dyn Platform,
    env: &Env,
) -> Executor<O> {
    let function = env
        .get("AWS_LAMBDA_FUNCTION_NAME")
        .cloned()
        .unwrap_or_else(|| executor.namespace().operator.clone());
    executor.with_metrics(platform.metrics(), function)
}

/// The table of the adaptive hot-key registry (`adapters::dynamodb::HotKeyRegistry`), which
/// producers read to salt the keys it lists; unset, the function keeps none.
pub const HOT_KEYS_TABLE: &str = "HOT_KEYS_TABLE";
/// How often the registry decides which keys are hot, in seconds: 10 by default.
pub const HOT_KEYS_PERIOD: &str = "HOT_KEYS_PERIOD_SECONDS";

/// `executor`, reporting each batch's heavy keys to the hot-key registry on `HOT_KEYS_TABLE`
/// (if set) under the operator's name, with the default hysteresis: a key turns hot at 5% of a
/// period's records and cools after 5 periods in a row under 1%.
pub fn hot_key_registry<O: KeyedOperator>(
    executor: Executor<O>,
    platform: &dyn Platform,
    env: &Env,
) -> Result<Executor<O>, ConfigError> {
    if env.get(HOT_KEYS_TABLE).is_none_or(|t| t.is_empty()) {
        return Ok(executor);
    }
    let table = table_from(platform, env, HOT_KEYS_TABLE)?;
    let period = whole_number::<u64>(env, HOT_KEYS_PERIOD)?.unwrap_or(10);
    if period == 0 {
        return Err(ConfigError::new(HOT_KEYS_PERIOD, "must be at least 1"));
    }
    let registry = HotKeyRegistry::new(
        table,
        executor.namespace().operator.clone(),
        Duration::from_secs(period),
        Hysteresis::default(),
    );
    Ok(executor.with_hot_key_reports(Arc::new(registry)))
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lambda::SinkTarget;
    use crate::ports::Clock;

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
            fn table(&self, table: &str, _: TableAccess) -> Result<Arc<dyn Table>, PortError> {
                Err(PortError::NoTable {
                    table: table.to_owned(),
                })
            }
            fn sink_maker(&self) -> crate::lambda::platform::SinkMaker {
                Arc::new(|target| Err(SinkTarget::parse(target).unwrap_err()))
            }
            fn clock(&self) -> Arc<dyn Clock> {
                Arc::new(crate::ports::SystemClock)
            }
            fn metrics(&self) -> Arc<dyn crate::ports::MetricLog> {
                Arc::new(crate::ports::StdoutMetrics)
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
}
