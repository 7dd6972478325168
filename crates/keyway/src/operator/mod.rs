//! The keyed operator API: what an application implements.
//!
//! An operator names its state, decodes a record into its input, says which key the input belongs
//! to and processes one input at a time with the key's state and a way to emit outputs. The
//! executor (`crate::executor`) does everything else: batching, loading, ordering, emitting,
//! committing and reporting.
//!
//! `process` must be deterministic given the key's state and the input (read time only through
//! `Ctx::now_millis`): when part of a key's batch has to be undone, the executor replays the part
//! that stays, and retries recompute outputs that must carry the same ids. Which outputs a record
//! emits to each sink, and in which order, must be the same at every attempt of it (never the
//! iteration order of a `HashMap` or of a cache of the process, nor anything that changes with the
//! time between two attempts): the retry of a record whose outputs went out in part skips those by
//! their place (see the executor's notes on what went out of a record left unapplied).

mod broadcast;
mod ctx;
mod input;
pub mod lock;
pub mod migration;
pub mod signature;
mod sink;
mod state;
mod timer;

use std::time::Duration;

use thiserror::Error;

pub use broadcast::BROADCAST_KEY;
pub(crate) use broadcast::{BroadcastCache, BroadcastSnapshot};
pub use ctx::{stored_bytes, stored_json_bytes, Ctx};
pub use input::{check_inputs, Input, InputDescriptor, InputWiringError, Route};
pub use migration::{MigrateFn, Migration, MigrationError, NewState, OldState};
pub use sink::{check_sinks, Sink, SinkDescriptor, SinkWiringError};
pub(crate) use state::TypedSlot;
pub use state::{
    kind, BroadcastState, Keyed, Kind, ListHandle, ListState, MapHandle, MapState, State,
    StateDescriptor, StateError, ValueHandle, ValueState,
};
pub use timer::timers;
pub(crate) use timer::{pending_in as pending_timers, take_stored as take_stored_timer};

use crate::domain::hash::sha256_hex;
pub use crate::domain::InvalidInput;
use crate::domain::{Payload, SourceRecord};

impl SourceRecord {
    /// The record's Kinesis data as JSON of `T`: the decode most operators start with. Data that
    /// is not a `T` is invalid input naming `data` and saying whether it is no JSON at all or
    /// JSON of another shape (serde's words name the field and what it expected); a DynamoDB
    /// change, `record`.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, InvalidInput> {
        match &self.payload {
            Payload::Bytes(data) => serde_json::from_slice(data).map_err(|e| {
                let what = match e.classify() {
                    serde_json::error::Category::Data => "JSON of another shape",
                    _ => "not JSON",
                };
                InvalidInput::new("data", format!("{what}: {e}"))
            }),
            Payload::Change(_) => Err(InvalidInput::new(
                "record",
                "expected a Kinesis record, got a DynamoDB Streams change",
            )),
            Payload::Timer { .. } => Err(InvalidInput::new(
                "record",
                "expected a Kinesis record, got a timer",
            )),
        }
    }
}

/// Why `process` did not apply a record.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ProcessError {
    /// The record is bad: it is dead-lettered and the key goes on with its next record.
    #[error("invalid input: {0}")]
    Invalid(#[from] InvalidInput),
    /// The record may succeed later (a dependency is down, a bug is being fixed): its key stops
    /// here and Lambda redelivers from this record.
    #[error("retry later: {0}")]
    Retry(String),
}

impl ProcessError {
    /// Whether the key stops here for a redelivery (`Retry`) rather than dead-lettering the record.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ProcessError::Retry(_))
    }
}

impl From<StateError> for ProcessError {
    fn from(err: StateError) -> Self {
        match err {
            // Stored state that no longer decodes will not decode on a retry either.
            StateError::Decode { ref slot, .. } | StateError::Encode { ref slot, .. } => {
                ProcessError::Invalid(InvalidInput::new(format!("state.{slot}"), err.to_string()))
            }
            // A programming error, which no retry fixes either: the record is dead-lettered
            // with the reason, where an operator's test sees it, instead of holding its key (and
            // Lambda the shard behind it) until a fixed version runs. Once fixed, the record is
            // replayed from the dead-letter sink.
            StateError::Undeclared { ref slot }
            | StateError::KindMismatch { ref slot, .. }
            | StateError::BroadcastFromKey { ref slot, .. }
            | StateError::NotLoaded { ref slot } => {
                ProcessError::Invalid(InvalidInput::new(format!("state.{slot}"), err.to_string()))
            }
        }
    }
}

/// When outputs leave relative to the state commit (DESIGN §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Emit, then commit. Safe when a retry recomputes the same outputs: one writer per key, or
    /// state facts that never change once written. Cheapest.
    EmitThenCommit,
    /// Store outputs with the state in the same conditional write and send them after the commit;
    /// for keys that several invocations write and whose outputs depend on state that changes.
    Outbox,
}

/// A keyed stream operator.
pub trait KeyedOperator: Send + Sync + 'static {
    /// What `decode` turns a record into, and `process` takes.
    type Input: Send;

    /// Stable name: part of every state key this operator writes.
    fn name(&self) -> &str;

    /// Every state the operator reads or writes.
    fn states(&self) -> Vec<StateDescriptor>;

    /// The inputs of an operator that reads several streams, each routed by its stream (see
    /// `Input`); an operator of one input declares none and gets every record.
    fn inputs(&self) -> Vec<InputDescriptor> {
        Vec::new()
    }

    /// Every sink the operator emits to (the dead-letter sink is every operator's, undeclared).
    /// The executor refuses to start unless the function wires exactly these.
    fn sinks(&self) -> Vec<SinkDescriptor> {
        Vec::new()
    }

    /// Turns a record into input, or says which field is wrong.
    fn decode(&self, record: &SourceRecord) -> Result<Self::Input, InvalidInput>;

    /// The key whose state `process` sees. A key longer than `executor::KEY_MAX_BYTES` (64 KiB)
    /// dead-letters its record, field `key`.
    fn key(&self, input: &Self::Input) -> String;

    /// The key skew detection counts the record under when it is not `key`: the producer's own
    /// key of a record whose state is one of that key's salted buckets, so that the hot-key
    /// registry judges the key a producer salts, not its buckets. `None`: `key` itself.
    fn hot_key(&self, input: &Self::Input) -> Option<String> {
        let _ = input;
        None
    }

    /// Applies one input to the current key's state and emits its outputs, both through `ctx`;
    /// an error says whether the record is dead-lettered or its key retried.
    fn process(&self, ctx: &mut Ctx<'_>, input: Self::Input) -> Result<(), ProcessError>;

    /// Runs once for each timer `process` (or an earlier `on_timer`) set with `Ctx::timer_at`,
    /// when its time `at_millis` has come, with the key's state; errors count as they do for
    /// `process`. Timers fire from a sweep of the due ones (`Executor::fire_timers`), within a
    /// minute of their time on AWS. Under emit-then-commit a firing, as a record, must emit the
    /// same outputs in the same order whenever it runs on the same state (from `at_millis`, not
    /// `Ctx::now_millis`): a firing whose outputs went out in part is fired again, and sends
    /// only those that did not.
    fn on_timer(&self, ctx: &mut Ctx<'_>, at_millis: i64) -> Result<(), ProcessError> {
        let _ = (ctx, at_millis);
        Ok(())
    }

    /// When outputs leave relative to the state commit; emit-then-commit unless overridden.
    fn delivery(&self) -> Delivery {
        Delivery::EmitThenCommit
    }

    /// True for an operator that keeps nothing per key (a filter, a router): the executor then
    /// reads and writes no state for it, watermarks included, so a record delivered again is
    /// processed again and its outputs go out again under the same ids. Such an operator declares
    /// no states, sets no timers and delivers emit-then-commit (`executor::stateless`).
    fn stateless(&self) -> bool {
        false
    }

    /// Whether `process` answers this record of `key` from the record itself and facts the
    /// operator keeps in memory that never change once written (an access key's identity):
    /// touching no state, setting no timer, and emitting only settled outputs. When it answers
    /// every record of a key in a batch, the executor neither reads nor writes the key's state,
    /// saving a read a key a batch. The operator may rewrite `input` to carry what it answers it
    /// from, so that `process` decides as this did; a record decoded again (its key run again
    /// from its first record) is asked again. `now_millis` is the invocation's time.
    ///
    /// Without the key's state there is no watermark: a record Lambda delivers again runs again.
    /// Answer only records for which that gives the same outputs as the first time, or nothing
    /// new: a record that may have been applied already, and decided by the state then (it
    /// waited, say), needs its key's state, whose watermark skips it. `record.arrival_millis`
    /// tells a record that arrived after the operator read the facts it answers from.
    ///
    /// A record so answered that touches state anyway, or emits an output that is not settled
    /// from an outbox operator, is dead-lettered (`StateError::NotLoaded`): a programming error.
    /// By default no record is answered without its key's state.
    fn answer_without_state(
        &self,
        key: &str,
        record: &SourceRecord,
        input: &mut Self::Input,
        now_millis: i64,
    ) -> bool {
        let _ = (key, record, input, now_millis);
        false
    }

    /// How long a key's state lives after its last commit; `None` keeps it forever.
    fn state_ttl(&self) -> Option<Duration> {
        None
    }

    /// Conversions of state written under older signatures (see `migration`).
    fn migrations(&self) -> Vec<Migration> {
        Vec::new()
    }

    /// Samples of what the operator's state holds as stored (a key's head: JSON of its slots,
    /// watermarks and outbox), newest first, as preset dictionaries for deflating it
    /// (`domain::dictionary`): a key's head above a KB is written deflated with the first, and
    /// read with whichever it names (segments, tens of KB each, are deflated without). None by
    /// default. Never change one's text once state was written with it (a key whose head names
    /// a dictionary the operator no longer has cannot be read, and its records wait): put a new
    /// one in front, and keep the old one until no item names it.
    fn state_dictionaries(&self) -> &'static [&'static str] {
        &[]
    }
}

/// The signature of an operator's state structure: a stable hash of its states' names, kinds and
/// type structures (`signature`). It is part of every state key, so state written by a different
/// structure is never read into this one.
pub fn state_signature(states: &[StateDescriptor]) -> String {
    let mut described: Vec<String> = states.iter().map(StateDescriptor::describe).collect();
    described.sort();
    let joined = described.join("\n");
    sha256_hex(&[joined.as_bytes()], 16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Change, ChangeKind, Item, Origin, SequenceNumber};

    fn record(payload: Payload) -> SourceRecord {
        SourceRecord {
            stream: "s".into(),
            input: None,
            origin: Origin("s/shardId-0".into()),
            lineage: Origin("s/shardId-0/p".into()),
            sequence: SequenceNumber::parse("1").unwrap(),
            partition_key: "p".into(),
            arrival_millis: None,
            payload,
            raw: crate::domain::RawJson::from_value(&serde_json::Value::Null),
        }
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Click {
        user: String,
    }

    #[test]
    fn a_records_json_decodes_into_the_type_asked_for_or_says_it_is_no_json_or_another_shape() {
        let good = record(Payload::Bytes(br#"{"user":"u1"}"#.to_vec().into()));
        assert_eq!(good.json::<Click>(), Ok(Click { user: "u1".into() }));
        let bad = record(Payload::Bytes(br#"{"name":"u1"}"#.to_vec().into()));
        let err = bad.json::<Click>().unwrap_err();
        assert_eq!(err.field, "data");
        assert!(
            err.problem
                .starts_with("JSON of another shape: missing field `user`"),
            "{err}"
        );
        let cut = record(Payload::Bytes(br#"{"user":"u"#.to_vec().into()));
        let err = cut.json::<Click>().unwrap_err();
        assert!(err.problem.starts_with("not JSON: EOF"), "{err}");
        let change = record(Payload::Change(Change {
            kind: ChangeKind::Insert,
            table: None,
            keys: Item::new(),
            old_image: None,
            new_image: None,
            ttl_deletion: false,
        }));
        assert_eq!(change.json::<Click>().unwrap_err().field, "record");
    }
}
