//! The keyed counter: counts events per key from a Kinesis stream and emits each key's running
//! count. Input records are JSON `{"key": "...", "amount": 3}` (`amount` defaults to 1).
//!
//! `COUNTS_EMIT` says which counts go out: `every` (the default) sends the count after each
//! event; `latest` sends each key's count after the last of its events in an invocation, the
//! others being superseded by it (one message a key a batch: at BatchSize 10,000 over 500 keys,
//! 500 messages where `every` sends 10,000). A retry that Lambda cuts otherwise may then send an
//! earlier count after a later one: consumers keep each key's highest count.
//!
//! One writer per key (its stream's shard), so emit-then-commit is safe: a retry recomputes the
//! same counts with the same output ids.
//!
//! Environment: `STATE_TABLE` (the keyway state table), `COUNTS_SINK` and `DEAD_LETTER_SINK`
//! (`kinesis:<stream>` or `sqs:<queue URL>`), and optionally `COUNTS_EMIT`, `KEYWAY_LINEAGE` and
//! `KEYWAY_REDELIVERY_WINDOW_SECONDS` (see `keyway::lambda::executor_config`).

// Functions of one step each: clippy.toml sets the threshold (tests, which read as scenarios,
// are left out).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use serde::{Deserialize, Serialize};

use keyway::domain::{Payload, SourceRecord};
use keyway::lambda::{
    executor_config, observed, sink_from, state_store_from, ConfigError, Env, Platform, SetupError,
    StreamHandler,
};
use keyway::operator::{SinkDescriptor, StateDescriptor};
use keyway::{Ctx, Executor, InvalidInput, KeyedOperator, ProcessError, Sink, Sinks, ValueState};

/// The count of one key.
pub const COUNT: ValueState<u64> = ValueState::new("count");
/// The sink counts go to.
pub const COUNTS: Sink<CountUpdate> = Sink::new("counts");

/// One input event: `{"key": "...", "amount": 3}`, no other field.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountEvent {
    /// The key counted; never empty.
    pub key: String,
    /// How much the event adds to its key's count; 1 when absent.
    #[serde(default = "one")]
    pub amount: u64,
}

fn one() -> u64 {
    1
}

/// What the counter emits after each event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountUpdate {
    /// The key counted.
    pub key: String,
    /// The key's running count, after the event.
    pub count: u64,
    /// The sequence number of the event that produced this count.
    pub sequence: String,
}

/// A `CountUpdate` as written, borrowing its text: emitted for every event.
#[derive(Serialize)]
struct CountUpdateRef<'a> {
    key: &'a str,
    count: u64,
    sequence: &'a str,
}

/// The counter operator: adds each event's amount to its key's count and emits the new count.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyedCounter;

impl KeyedOperator for KeyedCounter {
    type Input = CountEvent;

    fn name(&self) -> &str {
        "keyed-counter"
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![COUNT.descriptor()]
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        vec![COUNTS.descriptor()]
    }

    fn decode(&self, record: &SourceRecord) -> Result<CountEvent, InvalidInput> {
        let Payload::Bytes(data) = &record.payload else {
            return Err(InvalidInput::new("record", "expected a Kinesis record"));
        };
        let event: CountEvent = serde_json::from_slice(data).map_err(|e| {
            InvalidInput::new(
                "data",
                format!("expected {{\"key\": string, \"amount\": unsigned integer}}: {e}"),
            )
        })?;
        if event.key.is_empty() {
            return Err(InvalidInput::new("data.key", "must not be empty"));
        }
        Ok(event)
    }

    fn key(&self, input: &CountEvent) -> String {
        input.key.clone()
    }

    fn process(&self, ctx: &mut Ctx<'_>, input: CountEvent) -> Result<(), ProcessError> {
        let mut count = ctx.value(&COUNT)?;
        let total = count
            .get()
            .copied()
            .unwrap_or(0)
            .checked_add(input.amount)
            .ok_or_else(|| {
                InvalidInput::new(
                    "data.amount",
                    format!(
                        "{} would overflow the count of {:?}",
                        input.amount, input.key
                    ),
                )
            })?;
        count.set(total);
        let update = CountUpdateRef {
            key: &input.key,
            count: total,
            sequence: ctx.record().sequence.as_str(),
        };
        // Written from the borrowed form: no copy of the key and sequence number per event.
        let body = serde_json::to_string(&update).expect("a count update serializes");
        ctx.emit_json(&COUNTS, input.key, body)
    }
}

/// Which counts go out: `COUNTS_EMIT`.
pub const COUNTS_EMIT: &str = "COUNTS_EMIT";

/// Whether `COUNTS_EMIT` asks for each key's latest count of an invocation only.
fn latest_only(env: &Env) -> Result<bool, ConfigError> {
    match env.get(COUNTS_EMIT).map(String::as_str) {
        None | Some("" | "every") => Ok(false),
        Some("latest") => Ok(true),
        Some(other) => Err(ConfigError {
            name: COUNTS_EMIT.into(),
            problem: format!("{other:?} is neither \"every\" nor \"latest\""),
        }),
    }
}

/// The function: the keyed counter wired to the ports its environment names.
pub fn handler(
    platform: &dyn Platform,
    env: &Env,
) -> Result<StreamHandler<KeyedCounter>, SetupError> {
    let mut sinks = Sinks::new(sink_from(platform, env, "DEAD_LETTER_SINK")?)
        .with(&COUNTS, sink_from(platform, env, "COUNTS_SINK")?);
    if latest_only(env)? {
        sinks = sinks.keep_latest(&COUNTS);
    }
    let store = state_store_from(platform, env, "STATE_TABLE")?;
    let config = executor_config(env)?;
    let executor = Executor::new(KeyedCounter, store, sinks, platform.clock())?;
    Ok(StreamHandler::new(
        observed(executor, platform, env).with_config(config),
    ))
}

#[cfg(test)]
mod tests {
    use keyway::lambda::env_of;

    use super::*;

    #[test]
    fn counts_emit_is_every_unless_set_to_latest_and_anything_else_is_refused_by_name() {
        assert!(!latest_only(&env_of(&[])).unwrap());
        assert!(!latest_only(&env_of(&[(COUNTS_EMIT, "every")])).unwrap());
        assert!(latest_only(&env_of(&[(COUNTS_EMIT, "latest")])).unwrap());
        let err = latest_only(&env_of(&[(COUNTS_EMIT, "last")])).unwrap_err();
        assert_eq!(err.name, COUNTS_EMIT);
        assert!(err.to_string().contains("\"last\""), "{err}");
    }
}
