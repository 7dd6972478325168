//! The two functions wired to the ports their environments name.
//!
//! The first phase (`keyed-aggregate`): `STATE_TABLE`, `PARTIALS_SINK` (the merge's stream,
//! `kinesis:<stream>`), `DEAD_LETTER_SINK`; the aggregation: `KEY_POINTER` (default `/key`),
//! `VALUE_POINTER` (needed by every aggregate but the count), `AGGREGATES` (comma-separated
//! `count`, `sum`, `min`, `max`, `mean`; default `count`), and for windows `WINDOW_SECONDS`,
//! `TIME_POINTER`, `ALLOWED_LATENESS_SECONDS` (default 0) and `MAX_AHEAD_SECONDS` (how far ahead
//! of the clock a record's time may be, default an hour); `FLUSH_SECONDS` (default 60) for
//! running totals; `HOT_KEYS_TABLE` and `HOT_KEYS_PERIOD_SECONDS` for the adaptive hot-key
//! registry (`keyway::lambda::hot_key_registry`). A schedule sweeps its timers, which send
//! partials to the merge.
//!
//! The second (`aggregate-merge`): `STATE_TABLE`, `RESULTS_SINK`, `DEAD_LETTER_SINK`,
//! `AGGREGATES` as above, and `KEEP_WINDOWS_SECONDS` (default a day). Both take the executor's
//! variables too (`keyway::lambda::executor_config`).

use std::sync::Arc;
use std::time::Duration;

use keyway::domain::pointer::Pointer;
use keyway::lambda::{
    executor_config, hot_key_registry, observed, required, sink_from, state_store_from,
    whole_number, ConfigError, Env, Platform, SetupError, StreamHandler,
};
use keyway::{Executor, Sinks};

use crate::aggregate::Aggregate;
use crate::merge::{AggregateMerge, RESULTS};
use crate::partials::{KeyedAggregate, PARTIALS};
use crate::spec::{Spec, Windows};

/// The first phase's function.
pub fn aggregate_handler(
    platform: &dyn Platform,
    env: &Env,
) -> Result<StreamHandler<KeyedAggregate>, SetupError> {
    let sinks = Sinks::new(sink_from(platform, env, "DEAD_LETTER_SINK")?)
        .with(&PARTIALS, sink_from(platform, env, "PARTIALS_SINK")?);
    let store = state_store_from(platform, env, "STATE_TABLE")?;
    let operator = KeyedAggregate::new(Arc::new(spec_from(env)?));
    let executor = Executor::new(operator, store, sinks, platform.clock())?;
    let executor = hot_key_registry(observed(executor, platform, env), platform, env)?;
    Ok(StreamHandler::new(
        executor.with_config(executor_config(env)?),
    ))
}

/// The second phase's function.
pub fn merge_handler(
    platform: &dyn Platform,
    env: &Env,
) -> Result<StreamHandler<AggregateMerge>, SetupError> {
    let sinks = Sinks::new(sink_from(platform, env, "DEAD_LETTER_SINK")?)
        .with(&RESULTS, sink_from(platform, env, "RESULTS_SINK")?);
    let store = state_store_from(platform, env, "STATE_TABLE")?;
    let keep = whole_number::<u64>(env, "KEEP_WINDOWS_SECONDS")?.unwrap_or(86_400);
    let config = executor_config(env)?;
    let operator = AggregateMerge {
        aggregates: aggregates_from(env)?,
        keep: Duration::from_secs(keep),
        idle: config.redelivery_window,
    };
    let executor = Executor::new(operator, store, sinks, platform.clock())?;
    Ok(StreamHandler::new(
        observed(executor, platform, env).with_config(config),
    ))
}

/// The aggregation the environment describes.
pub fn spec_from(env: &Env) -> Result<Spec, ConfigError> {
    let windows = match whole_number::<i64>(env, "WINDOW_SECONDS")? {
        Some(seconds) => Some(Windows {
            size_millis: seconds.saturating_mul(1000),
            lateness_millis: whole_number::<i64>(env, "ALLOWED_LATENESS_SECONDS")?
                .unwrap_or(0)
                .saturating_mul(1000),
            time: Pointer::parse(required(env, "TIME_POINTER")?).map_err(|e| ConfigError {
                name: "TIME_POINTER".into(),
                problem: e.to_string(),
            })?,
            ahead_millis: whole_number::<i64>(env, "MAX_AHEAD_SECONDS")?
                .map_or(Windows::AHEAD_MILLIS, |s| s.saturating_mul(1000)),
        }),
        None => None,
    };
    let flush = Duration::from_secs(whole_number::<u64>(env, "FLUSH_SECONDS")?.unwrap_or(60));
    let key = env.get("KEY_POINTER").map_or("/key", String::as_str);
    let value = env
        .get("VALUE_POINTER")
        .map(String::as_str)
        .filter(|v| !v.is_empty());
    Spec::new(key, value, aggregates_from(env)?, windows, flush).map_err(|e| ConfigError {
        name: "KEY_POINTER, VALUE_POINTER, AGGREGATES or WINDOW_SECONDS".into(),
        problem: e.to_string(),
    })
}

/// `AGGREGATES`: comma-separated names; the count when unset.
pub fn aggregates_from(env: &Env) -> Result<Vec<Aggregate>, ConfigError> {
    let Some(text) = env.get("AGGREGATES").filter(|t| !t.trim().is_empty()) else {
        return Ok(vec![Aggregate::Count]);
    };
    text.split(',')
        .map(|name| {
            Aggregate::parse(name.trim()).ok_or_else(|| ConfigError {
                name: "AGGREGATES".into(),
                problem: format!("{name:?} is none of count, sum, min, max, mean"),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway::lambda::env_of as env;

    #[test]
    fn the_environment_gives_the_aggregation_and_names_the_variable_that_is_wrong() {
        let spec = spec_from(&env(&[
            ("KEY_POINTER", "/user"),
            ("VALUE_POINTER", "/amount"),
            ("AGGREGATES", "count, sum,mean"),
            ("WINDOW_SECONDS", "60"),
            ("TIME_POINTER", "/at"),
            ("ALLOWED_LATENESS_SECONDS", "5"),
        ]))
        .unwrap();
        assert_eq!(
            spec.aggregates,
            [Aggregate::Count, Aggregate::Sum, Aggregate::Mean]
        );
        let windows = spec.windows.unwrap();
        assert_eq!(
            (windows.size_millis, windows.lateness_millis),
            (60_000, 5_000)
        );
        // Empty, as a template's default leaves it: running totals, counted under `/key`.
        let counting = spec_from(&env(&[("WINDOW_SECONDS", ""), ("VALUE_POINTER", "")])).unwrap();
        assert_eq!((counting.key.as_str(), counting.windows), ("/key", None));

        let wrong = |vars: &[(&str, &str)]| spec_from(&env(vars)).unwrap_err();
        assert_eq!(wrong(&[("AGGREGATES", "count,avg")]).name, "AGGREGATES");
        assert_eq!(wrong(&[("WINDOW_SECONDS", "60")]).name, "TIME_POINTER");
        assert_eq!(
            wrong(&[("WINDOW_SECONDS", "a minute")]).name,
            "WINDOW_SECONDS"
        );
        let no_value = wrong(&[("AGGREGATES", "sum")]);
        assert!(no_value.problem.contains("sum needs"), "{no_value:?}");
        let behind = wrong(&[
            ("WINDOW_SECONDS", "60"),
            ("TIME_POINTER", "/at"),
            ("MAX_AHEAD_SECONDS", "-60"),
        ]);
        assert!(behind.problem.contains("ahead of the"), "{behind:?}");
        assert_eq!(
            windows.ahead_millis,
            Windows::AHEAD_MILLIS,
            "an hour unless configured"
        );
    }
}
