//! Identity enrichment: every CloudTrail action traced through role chains back to its original
//! actor. Records are partitioned by `customer#accessKeyId` of their caller, which spreads a large
//! customer over many partitions; the resolution of each issued access key is re-published to a
//! feedback stream partitioned by that key, which puts a role chain back together across
//! partitions (DESIGN §1, and the article it comes from).
//!
//! `cloudtrail` reads a record into what resolution needs: who called (`Caller`) and which
//! credentials the call issued (`Issued`). `identity` holds what resolution produces: the
//! original actor, the role chain, the resolution messages of the feedback stream, and the
//! partition keys producers use. `enricher` is the keyed operator that puts them together; here
//! it is wired to the ports its environment names. Behind features, for the `keyway` command and
//! the tests: `traffic` generates CloudTrail traffic, `log_files` reads CloudTrail's log files.
//!
//! Environment: `STATE_TABLE`; `EVENTS_STREAM` (the CloudTrail stream the function reads);
//! `FEEDBACK_STREAM` (the feedback stream, which it reads and publishes resolutions to);
//! `ENRICHED_SINK` and `DEAD_LETTER_SINK` (`kinesis:<stream>` or `sqs:<queue URL>`); optionally
//! `CUSTOMER_MAP` (a JSON object of account id to customer id), `BUFFER_TTL_SECONDS`,
//! `GRACE_SECONDS`, `MAX_CHAIN_DEPTH`, `MAX_BUFFERED`, and the executor's variables (see
//! `keyway::lambda::executor_config`), of which `KEYWAY_REDELIVERY_WINDOW_SECONDS` is also how late
//! a record can come: how long the enricher keeps a key's state past its last change.

// Functions of one step each: clippy.toml sets the threshold (tests, which read as scenarios,
// are left out).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod cloudtrail;
pub mod enricher;
pub mod identity;
#[cfg(feature = "log-files")]
pub mod log_files;
#[cfg(feature = "traffic")]
pub mod traffic;

use std::time::Duration;

use keyway::lambda::{
    executor_config, observed, required, sink_from, state_store_from, whole_number, ConfigError,
    Env, Platform, SetupError, StreamHandler,
};
use keyway::{Executor, Inputs, Sinks};

use enricher::{EnricherConfig, IdentityEnricher, ENRICHED, EVENTS, FEEDBACK, RESOLUTIONS};
use identity::CustomerMap;

/// The function: the identity enricher wired to the streams, table and sinks its environment
/// names.
pub fn handler(
    platform: &dyn Platform,
    env: &Env,
) -> Result<StreamHandler<IdentityEnricher>, SetupError> {
    let feedback = required(env, "FEEDBACK_STREAM")?;
    let inputs = Inputs::new()
        .with(&EVENTS, required(env, "EVENTS_STREAM")?)
        .with(&FEEDBACK, feedback);
    // Resolutions go to the stream the function reads them back from: one variable for both, so
    // the loop cannot be wired open.
    let resolutions = platform
        .sink(&format!("kinesis:{feedback}"))
        .map_err(|e| ConfigError {
            name: "FEEDBACK_STREAM".into(),
            problem: e.to_string(),
        })?;
    let sinks = Sinks::new(sink_from(platform, env, "DEAD_LETTER_SINK")?)
        .with(&ENRICHED, sink_from(platform, env, "ENRICHED_SINK")?)
        .with(&RESOLUTIONS, resolutions);
    let store = state_store_from(platform, env, "STATE_TABLE")?;
    let operator = IdentityEnricher::new(enricher_config(env)?);
    let executor = Executor::with_inputs(operator, inputs, store, sinks, platform.clock())?;
    Ok(StreamHandler::new(
        observed(executor, platform, env).with_config(executor_config(env)?),
    ))
}

/// The enricher's settings from the environment; defaults for what it leaves out.
pub fn enricher_config(env: &Env) -> Result<EnricherConfig, ConfigError> {
    let mut config = EnricherConfig::default();
    if let Some(text) = env.get("CUSTOMER_MAP").filter(|t| !t.trim().is_empty()) {
        config.customers = CustomerMap::from_json(text).map_err(|e| ConfigError {
            name: "CUSTOMER_MAP".into(),
            problem: format!("expected a JSON object of account id to customer id: {e}"),
        })?;
    }
    if let Some(seconds) = whole_number::<u64>(env, "BUFFER_TTL_SECONDS")? {
        config.buffer_ttl = Duration::from_secs(seconds);
    }
    if let Some(seconds) = whole_number::<u64>(env, "GRACE_SECONDS")? {
        config.grace = Duration::from_secs(seconds);
    }
    if let Some(depth) = whole_number(env, "MAX_CHAIN_DEPTH")? {
        if !(1..=100).contains(&depth) {
            return Err(ConfigError {
                name: "MAX_CHAIN_DEPTH".into(),
                problem: format!("{depth}: expected 1 to 100 roles (the template's range)"),
            });
        }
        config.max_chain_depth = depth;
    }
    if let Some(most) = whole_number(env, "MAX_BUFFERED")? {
        config.max_buffered = most;
    }
    // The executor keeps watermarks as long: one setting for how late a record comes.
    if let Some(seconds) = whole_number::<u64>(env, "KEYWAY_REDELIVERY_WINDOW_SECONDS")? {
        config.lateness = Duration::from_secs(seconds);
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use keyway::lambda::env_of as env;

    use super::*;

    #[test]
    fn the_environment_sets_the_customer_map_and_the_limits() {
        let config = enricher_config(&env(&[
            ("CUSTOMER_MAP", r#"{"111111111111": "acme"}"#),
            ("BUFFER_TTL_SECONDS", "30"),
            ("GRACE_SECONDS", "60"),
            ("MAX_CHAIN_DEPTH", "4"),
            ("MAX_BUFFERED", "100"),
            ("KEYWAY_REDELIVERY_WINDOW_SECONDS", "3600"),
        ]))
        .unwrap();
        assert_eq!(config.lateness, Duration::from_secs(3600));
        assert_eq!(config.customers.customer_of("111111111111"), "acme");
        assert_eq!(config.buffer_ttl, Duration::from_secs(30));
        assert_eq!(config.grace, Duration::from_secs(60));
        assert_eq!((config.max_chain_depth, config.max_buffered), (4, 100));
        let defaults = enricher_config(&Env::new()).unwrap();
        assert_eq!(defaults.buffer_ttl, EnricherConfig::default().buffer_ttl);
    }

    #[test]
    fn a_bad_setting_is_named_with_its_problem() {
        let err = enricher_config(&env(&[("CUSTOMER_MAP", "[1]")])).unwrap_err();
        assert_eq!(err.name, "CUSTOMER_MAP");
        assert!(err.problem.contains("JSON object"), "{err}");
        let err = enricher_config(&env(&[("BUFFER_TTL_SECONDS", "15m")])).unwrap_err();
        assert_eq!(err.name, "BUFFER_TTL_SECONDS");
        assert_eq!(err.problem, "\"15m\" is not a whole number");
        for depth in ["0", "101"] {
            let err = enricher_config(&env(&[("MAX_CHAIN_DEPTH", depth)])).unwrap_err();
            assert_eq!(err.name, "MAX_CHAIN_DEPTH");
            assert!(err.problem.contains("1 to 100"), "{err}");
        }
    }
}
