//! What the phases' unit tests share: a summing operator, records made by hand, a sink that
//! records its calls and fails on demand, and an executor on the in-memory table.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::json;

use super::{Executor, Sinks};
use crate::adapters::dynamodb::DynamoStateStore;
use crate::adapters::dynamodb::MemoryTable;
use crate::domain::RejectedRecord;
use crate::domain::{Origin, Output, Payload, SequenceNumber, SourceRecord};
use crate::operator::{
    Ctx, Delivery, InvalidInput, KeyedOperator, ProcessError, SinkDescriptor, StateDescriptor,
};
use crate::ports::{Deadline, ManualClock, Sink, SinkError};
use crate::ValueState;

pub(crate) const SUM: ValueState<i64> = ValueState::new("sum");
/// A state `Summer` uses without declaring it.
const FORGOTTEN: ValueState<i64> = ValueState::new("forgotten");
/// Where `Summer` sends its running sums.
pub(crate) const OUT: crate::Sink<i64> = crate::Sink::new("out");
pub(crate) const START: i64 = 1_767_225_600_000;

/// Sums `n` per `key` of records `{"key": .., "n": ..}` and emits the running sum to `out`.
/// `n` of 0 changes nothing and emits nothing, 13 fails (retryably), 66 panics, a negative `n`
/// is invalid, and 21, 22 and 23 touch a state, a sink and timers it never declared (a
/// programming error).
///
/// With `facts`, an `n` of 1000 or more is a fact: answered without the key's state
/// (`answer_without_state`), it emits `n` itself, settled; but 1013 reads the sum anyway and
/// 1066 emits `n` unsettled (two programming errors).
#[derive(Clone, Copy, Default)]
pub(crate) struct Summer {
    pub outbox: bool,
    /// Declares no sink: a version deployed without `out`.
    pub without_out: bool,
    pub facts: bool,
    /// Declares timers: `n` = 23 sets one a minute after `START`.
    pub timers: bool,
}

impl KeyedOperator for Summer {
    type Input = (String, i64);

    fn name(&self) -> &str {
        "summer"
    }

    fn states(&self) -> Vec<StateDescriptor> {
        let mut states = vec![SUM.descriptor()];
        if self.timers {
            states.push(crate::operator::timers());
        }
        states
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        if self.without_out {
            Vec::new()
        } else {
            vec![OUT.descriptor()]
        }
    }

    fn decode(&self, record: &SourceRecord) -> Result<(String, i64), InvalidInput> {
        let Payload::Bytes(data) = &record.payload else {
            return Err(InvalidInput::new("record", "not Kinesis"));
        };
        let value: serde_json::Value =
            serde_json::from_slice(data).map_err(|e| InvalidInput::new("data", e.to_string()))?;
        if value["n"] == 77 {
            panic!("the decoder has a bug");
        }
        match (value["key"].as_str(), value["n"].as_i64()) {
            (Some(key), Some(n)) => Ok((key.to_owned(), n)),
            _ => Err(InvalidInput::new("data", "expected key and n")),
        }
    }

    fn key(&self, input: &(String, i64)) -> String {
        input.0.clone()
    }

    fn answer_without_state(
        &self,
        _key: &str,
        _record: &SourceRecord,
        input: &mut (String, i64),
        _now: i64,
    ) -> bool {
        self.facts && input.1 >= 1000
    }

    fn process(&self, ctx: &mut Ctx<'_>, (key, n): (String, i64)) -> Result<(), ProcessError> {
        if self.facts && n >= 1000 {
            return fact(ctx, key, n);
        }
        match n {
            0 => return Ok(()),
            13 => return Err(ProcessError::Retry("unlucky".into())),
            66 => panic!("a bug"),
            n if n < 0 => return Err(InvalidInput::new("data.n", "negative").into()),
            21 => {
                ctx.value(&FORGOTTEN)?.set(n);
            }
            22 => return ctx.emit(&crate::Sink::<i64>::new("forgotten"), key, &n),
            23 => return ctx.timer_at(START + 60_000),
            _ => {}
        }
        let mut sum = ctx.value(&SUM)?;
        let total = sum.get().copied().unwrap_or(0) + n;
        sum.set(total);
        ctx.emit(&OUT, key, &total)
    }

    fn delivery(&self) -> Delivery {
        if self.outbox {
            Delivery::Outbox
        } else {
            Delivery::EmitThenCommit
        }
    }
}

/// What `Summer` does with a fact `n`.
fn fact(ctx: &mut Ctx<'_>, key: String, n: i64) -> Result<(), ProcessError> {
    match n {
        1013 => {
            ctx.value(&SUM)?;
            Ok(())
        }
        1066 => ctx.emit(&OUT, key, &n),
        _ => {
            let (origin, sequence) = (ctx.record().origin.clone(), ctx.record().sequence.clone());
            ctx.emit_settled_for(&OUT, (&origin, &sequence), 0, key, &n)
        }
    }
}

/// The `(key, n)` of a record `record` made: what the test operators take as input.
pub(crate) fn key_and_n(record: &SourceRecord) -> Result<(String, i64), InvalidInput> {
    let Payload::Bytes(data) = &record.payload else {
        return Err(InvalidInput::new("record", "not Kinesis"));
    };
    let value: serde_json::Value =
        serde_json::from_slice(data).map_err(|e| InvalidInput::new("data", e.to_string()))?;
    match (value["key"].as_str(), value["n"].as_i64()) {
        (Some(key), Some(n)) => Ok((key.to_owned(), n)),
        _ => Err(InvalidInput::new("data", "expected key and n")),
    }
}

/// A record of shard 0 of stream `s` under partition key `pk`, as a batch holds it.
#[allow(clippy::result_large_err)]
pub(crate) fn record(
    seq: u64,
    pk: &str,
    key: &str,
    n: i64,
) -> Result<SourceRecord, RejectedRecord> {
    let origin = Origin("s/shardId-0".into());
    Ok(SourceRecord {
        stream: "s".into(),
        input: None,
        lineage: crate::sources::kinesis::lineage(&origin, pk),
        origin,
        sequence: SequenceNumber::parse(&seq.to_string()).unwrap(),
        partition_key: pk.into(),
        arrival_millis: Some(START),
        payload: Payload::Bytes(json!({"key": key, "n": n}).to_string().into_bytes().into()),
        raw: crate::domain::RawJson::from_value(&json!({"seq": seq})),
    })
}

/// A sink that records each call's messages, and fails those whose body a test names.
#[derive(Default)]
pub(crate) struct Recorder {
    pub ordered: bool,
    pub calls: Mutex<Vec<Vec<Output>>>,
    pub failing: Mutex<HashSet<String>>,
    pub refusing: Mutex<HashSet<String>>,
    /// Fails every message while set.
    pub down: std::sync::atomic::AtomicBool,
}

impl Recorder {
    pub(crate) fn fail(&self, body: &str) {
        self.failing.lock().unwrap().insert(body.into());
    }

    pub(crate) fn bodies(&self) -> Vec<Vec<String>> {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .map(|c| c.iter().map(|o| o.body.clone()).collect())
            .collect()
    }
}

#[async_trait]
impl Sink for Recorder {
    async fn send(&self, messages: &[Output], _: Deadline) -> Vec<(usize, SinkError)> {
        self.calls.lock().unwrap().push(messages.to_vec());
        let failing = self.failing.lock().unwrap();
        let refusing = self.refusing.lock().unwrap();
        messages
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                let down = self.down.load(std::sync::atomic::Ordering::SeqCst);
                if down || failing.contains(&m.body) {
                    Some((i, SinkError::Unavailable("down".into())))
                } else if refusing.contains(&m.body) {
                    Some((i, SinkError::Rejected("too odd".into())))
                } else {
                    None
                }
            })
            .collect()
    }

    fn max_message_bytes(&self) -> usize {
        1024
    }

    fn ordered(&self) -> bool {
        self.ordered
    }
}

/// An executor of `operator` on a fresh in-memory table, its `out` and dead-letter sinks.
pub(crate) struct Bench<O: KeyedOperator> {
    pub executor: Executor<O>,
    pub clock: Arc<ManualClock>,
    pub table: Arc<MemoryTable>,
    pub out: Arc<Recorder>,
    pub dead: Arc<Recorder>,
}

pub(crate) fn bench<O: KeyedOperator>(operator: O, ordered: bool) -> Bench<O> {
    bench_with(operator, ordered, |sinks| sinks)
}

/// `bench`, its sinks as `wire` leaves them.
pub(crate) fn bench_with<O: KeyedOperator>(
    operator: O,
    ordered: bool,
    wire: impl FnOnce(Sinks) -> Sinks,
) -> Bench<O> {
    let clock = ManualClock::at(START);
    let table = Arc::new(MemoryTable::new());
    let store = Arc::new(DynamoStateStore::new(table.clone(), clock.clone()));
    let out = Arc::new(Recorder {
        ordered,
        ..Recorder::default()
    });
    let dead = Arc::new(Recorder::default());
    let sinks = wire(Sinks::new(dead.clone()).with(&OUT, out.clone()));
    Bench {
        executor: Executor::new(operator, store, sinks, clock.clone()).expect("the bench is wired"),
        clock,
        table,
        out,
        dead,
    }
}

/// Makes the stored head of a key unreadable, as a bad write or a hand edit leaves it: the head
/// whose partition key `pk_matches` gets a document that is not JSON.
pub(crate) fn corrupt_head(table: &MemoryTable, pk_matches: impl Fn(&str) -> bool) {
    let mut head = table
        .items()
        .into_iter()
        .find(|item| {
            crate::adapters::dynamodb::ItemKey::of(item)
                .is_some_and(|key| pk_matches(&key.pk) && key.sk == "head")
        })
        .expect("a stored head for the key");
    head.insert(
        "doc".into(),
        crate::domain::AttrValue::S("{not json".into()),
    );
    table.put_item(head).expect("the head written back");
}
