//! The two functions as Lambda runs them: each operator wired to the ports its environment names.
//!
//! Environment of both: `JOIN` (`LEFT.COL=RIGHT.COL`, for example `domains.user_id=users.id`),
//! `JOIN_KIND` (`inner`, the default, or `left`), `FILTER` (optional: the rows that take part,
//! `domains.status = "active" AND users.tier >= 2`, see `filter`), `STATE_TABLE`, `DEAD_LETTER_SINK`, and the
//! executor's variables (see `keyway::lambda::executor_config`). The re-key's: `CHANGELOG_SINK`
//! (`kinesis:<stream>`, the changelog the join reads) and `TABLE_NAMES` (optional: a JSON object
//! of a source table's name in its changes to its name in the join, for a DynamoDB table, whose
//! changes carry its physical name), `BEFORE_IMAGES` (`sometimes`, the default, or `always`: see
//! `rekey::BeforeImages`) and `TRUNCATE_SETTLE_SECONDS` (optional: see `truncate`; its schedule
//! runs the truncate sweep). The join's: `JOINED_SINK` (the joined
//! changelog) and `VIEW_TABLE` (the materialized view, keyed `pk`, `sk`, TTL on `ttl`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keyway::lambda::{
    executor_config, observed, required, sink_from, state_store_from, table_from, ConfigError, Env,
    Platform, SetupError, StreamHandler,
};
use keyway::{Executor, KeyedOperator, Sinks};

use crate::filter::Filter;
use crate::joiner::{Join, JOINED, VIEW};
use crate::rekey::{BeforeImages, Rekey, CHANGELOG};
use crate::spec::{JoinKind, JoinSpec};
use crate::truncate::{RekeyHandler, Sweeper};
use crate::view_table::ViewTable;

/// The join the environment names.
pub fn spec_from(env: &Env) -> Result<JoinSpec, ConfigError> {
    let kind = match env.get("JOIN_KIND").map(|k| k.trim()) {
        None | Some("" | "inner") => JoinKind::Inner,
        Some("left") => JoinKind::LeftOuter,
        Some(other) => {
            return Err(ConfigError {
                name: "JOIN_KIND".into(),
                problem: format!("{other:?} is not inner or left"),
            })
        }
    };
    let spec = JoinSpec::parse(required(env, "JOIN")?, kind).map_err(|e| ConfigError {
        name: "JOIN".into(),
        problem: e.to_string(),
    })?;
    let filter_problem = |problem: String| ConfigError {
        name: "FILTER".into(),
        problem,
    };
    let filter = Filter::parse(env.get("FILTER").map_or("", String::as_str))
        .map_err(|e| filter_problem(e.to_string()))?;
    spec.with_filter(filter)
        .map_err(|e| filter_problem(e.to_string()))
}

/// A source table's name in the join by the name its changes carry (`TABLE_NAMES`, a JSON object;
/// none when unset or empty).
pub fn table_names_from(env: &Env) -> Result<BTreeMap<String, String>, ConfigError> {
    match env.get("TABLE_NAMES").filter(|t| !t.trim().is_empty()) {
        None => Ok(BTreeMap::new()),
        Some(text) => serde_json::from_str(text).map_err(|e| ConfigError {
            name: "TABLE_NAMES".into(),
            problem: format!(
                "expected a JSON object of a table's name in its changes to its name in the join: {e}"
            ),
        }),
    }
}

/// Whether the source's updates and deletes carry whole before images (`BEFORE_IMAGES`:
/// `sometimes` unless set).
pub fn before_images_from(env: &Env) -> Result<BeforeImages, ConfigError> {
    let text = env.get("BEFORE_IMAGES").map_or("", |t| t.trim());
    if text.is_empty() {
        return Ok(BeforeImages::Sometimes);
    }
    BeforeImages::ALL
        .into_iter()
        .find(|b| b.name() == text)
        .ok_or_else(|| ConfigError {
            name: "BEFORE_IMAGES".into(),
            problem: format!("{text:?} is not sometimes or always"),
        })
}

/// The re-key function: its stream batches, and on its schedule the truncate sweep.
pub fn rekey_handler(platform: &dyn Platform, env: &Env) -> Result<RekeyHandler, SetupError> {
    let changelog = sink_from(platform, env, "CHANGELOG_SINK")?;
    let sinks = Sinks::new(sink_from(platform, env, "DEAD_LETTER_SINK")?)
        .with(&CHANGELOG, changelog.clone());
    let store = state_store_from(platform, env, "STATE_TABLE")?;
    let operator = Rekey {
        spec: spec_from(env)?,
        table_names: table_names_from(env)?,
        before_images: before_images_from(env)?,
    };
    let config = executor_config(env)?;
    // Trusting whole before images, it keeps no state: the sweep then finds no row to retract.
    let executor = if operator.stateless() {
        Executor::stateless(operator.clone(), sinks, platform.clock())?
    } else {
        Executor::new(operator.clone(), store.clone(), sinks, platform.clock())?
    };
    let sweeper = Sweeper {
        rekey: operator,
        store,
        namespace: executor.namespace().clone(),
        changelog,
        clock: platform.clock(),
        settle: settle_from(env)?,
        redelivery_window: config.redelivery_window,
    };
    Ok(RekeyHandler {
        stream: StreamHandler::new(observed(executor, platform, env).with_config(config)),
        sweeper,
    })
}

/// How long after a truncate's first sweep the second one runs (`TRUNCATE_SETTLE_SECONDS`,
/// longer than the re-key's timeout; 30 minutes unless set).
pub fn settle_from(env: &Env) -> Result<Duration, ConfigError> {
    match env.get("TRUNCATE_SETTLE_SECONDS").map(|t| t.trim()) {
        None | Some("") => Ok(DEFAULT_SETTLE),
        Some(text) => text
            .parse()
            .map(Duration::from_secs)
            .map_err(|_| ConfigError {
                name: "TRUNCATE_SETTLE_SECONDS".into(),
                problem: format!("{text:?} is not a whole number of seconds"),
            }),
    }
}

/// Twice Lambda's longest timeout: a batch that loaded its state before a truncate's fence has
/// ended by then.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(30 * 60);

/// The join function.
pub fn join_handler(platform: &dyn Platform, env: &Env) -> Result<StreamHandler<Join>, SetupError> {
    let config = executor_config(env)?;
    // A tombstone must outlive the lag of any shard of the changelog: its redelivery window.
    let view = ViewTable::new(
        table_from(platform, env, "VIEW_TABLE")?,
        platform.clock(),
        config.redelivery_window,
    )
    .with_backoff(platform.backoff());
    let sinks = Sinks::new(sink_from(platform, env, "DEAD_LETTER_SINK")?)
        .with(&JOINED, sink_from(platform, env, "JOINED_SINK")?)
        .with(&VIEW, Arc::new(view));
    let store = state_store_from(platform, env, "STATE_TABLE")?;
    // The re-key's retries replay its steps within its own redelivery window, which the stack
    // sets alike for both functions.
    let operator = Join {
        kind: spec_from(env)?.kind,
        replays_within: config.redelivery_window,
    };
    let executor = Executor::new(operator, store, sinks, platform.clock())?;
    Ok(StreamHandler::new(
        observed(executor, platform, env).with_config(config),
    ))
}

#[cfg(test)]
mod tests {
    use keyway::lambda::env_of as env;

    use super::*;

    #[test]
    fn the_environment_names_the_join_and_its_kind_and_a_bad_one_is_named() {
        let spec = spec_from(&env(&[("JOIN", "domains.user_id=users.id")])).unwrap();
        assert_eq!(
            (spec.left.table.as_str(), spec.kind),
            ("domains", JoinKind::Inner)
        );
        let left = env(&[("JOIN", "domains.user_id=users.id"), ("JOIN_KIND", "left")]);
        assert_eq!(spec_from(&left).unwrap().kind, JoinKind::LeftOuter);
        for (pairs, name) in [
            (vec![], "JOIN"),
            (vec![("JOIN", "domains=users")], "JOIN"),
            (
                vec![("JOIN", "a.b=c.d"), ("JOIN_KIND", "outer")],
                "JOIN_KIND",
            ),
        ] {
            assert_eq!(spec_from(&env(&pairs)).unwrap_err().name, name);
        }
    }

    #[test]
    fn the_environment_may_filter_the_rows_and_a_filter_on_another_table_is_named() {
        let join = ("JOIN", "domains.user_id=users.id");
        let spec = spec_from(&env(&[join, ("FILTER", "domains.status = 'active'")])).unwrap();
        assert_eq!(spec.filter.conditions.len(), 1);
        assert!(spec_from(&env(&[join, ("FILTER", "")]))
            .unwrap()
            .filter
            .is_empty());
        for filter in ["orders.total > 1", "domains.status = active"] {
            let err = spec_from(&env(&[join, ("FILTER", filter)])).unwrap_err();
            assert_eq!(err.name, "FILTER", "{filter}");
        }
    }

    #[test]
    fn the_environment_says_whether_before_images_are_whole_and_a_bad_answer_is_named() {
        let read = |value: &str| before_images_from(&env(&[("BEFORE_IMAGES", value)]));
        assert_eq!(before_images_from(&env(&[])), Ok(BeforeImages::Sometimes));
        assert_eq!(read("sometimes"), Ok(BeforeImages::Sometimes));
        assert_eq!(read(" always "), Ok(BeforeImages::Always));
        assert_eq!(read("full").unwrap_err().name, "BEFORE_IMAGES");
    }

    #[test]
    fn table_names_map_a_physical_table_name_to_its_name_in_the_join() {
        let names = table_names_from(&env(&[("TABLE_NAMES", r#"{"stack-Users-1A": "users"}"#)]));
        assert_eq!(names.unwrap()["stack-Users-1A"], "users");
        assert!(table_names_from(&env(&[])).unwrap().is_empty());
        let err = table_names_from(&env(&[("TABLE_NAMES", "[1]")])).unwrap_err();
        assert_eq!(err.name, "TABLE_NAMES");
    }
}
