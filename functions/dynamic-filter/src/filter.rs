//! The dynamic filter: a stateless keyed operator over events partitioned by filter key. Each
//! event is matched against the subscriptions of its key and the all-events set in the
//! execution environment's index (`index`), with no lookup of its own; each consumer with a
//! matching subscription gets the event once, on its queue (`router`).
//!
//! A delivery's id derives from the event's place in its stream and the consumer, so a
//! redelivered event goes to each consumer under the id it had before, whichever subscription
//! matched it and whatever else changed in between.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use keyway::domain::{Payload, SourceRecord};
use keyway::operator::{SinkDescriptor, StateDescriptor};
use keyway::{Ctx, InvalidInput, KeyedOperator, ProcessError, Sink};
use serde_json::Value;

use crate::index::SubscriptionIndex;

/// Where matched events go: the router sends each to the queue its partition key names.
pub const DELIVERIES: Sink<Value> = Sink::new("deliveries");

/// The filter key's place in an event, when none is configured.
pub const DEFAULT_KEY_POINTER: &str = "/key";

/// An event and its filter key.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The filter key: the string or number at the event's key pointer.
    pub key: String,
    /// The event as it came, the JSON delivered to each consumer.
    pub event: Value,
}

/// Delivered and dropped events per consumer since the last `take`: an event a consumer is
/// subscribed to (by its key, or to all events) that none of its patterns matches is dropped
/// for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Events the filter processed.
    pub events: u64,
    /// Events no consumer received.
    pub unmatched: u64,
    /// Per consumer id, the events delivered to it and the events dropped for it.
    pub by_consumer: BTreeMap<String, (u64, u64)>,
}

/// The filter operator: sends each event to the consumers whose subscriptions match it, looking
/// them up in the execution environment's index.
pub struct DynamicFilter {
    index: Arc<RwLock<SubscriptionIndex>>,
    key_pointer: String,
    tally: Mutex<Tally>,
}

impl DynamicFilter {
    /// A filter that matches events against `index`, reading each event's filter key at the JSON
    /// pointer `key_pointer` (`DEFAULT_KEY_POINTER` by default).
    pub fn new(index: Arc<RwLock<SubscriptionIndex>>, key_pointer: impl Into<String>) -> Self {
        Self {
            index,
            key_pointer: key_pointer.into(),
            tally: Mutex::default(),
        }
    }

    /// The counts since the last call.
    pub fn take_tally(&self) -> Tally {
        std::mem::take(&mut *self.tally.lock().expect("tally lock"))
    }
}

impl KeyedOperator for DynamicFilter {
    type Input = Event;

    fn name(&self) -> &str {
        "dynamic-filter"
    }

    fn states(&self) -> Vec<StateDescriptor> {
        Vec::new()
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        vec![DELIVERIES.descriptor()]
    }

    fn stateless(&self) -> bool {
        true
    }

    fn decode(&self, record: &SourceRecord) -> Result<Event, InvalidInput> {
        let Payload::Bytes(data) = &record.payload else {
            return Err(InvalidInput::new("record", "expected a Kinesis record"));
        };
        let text = std::str::from_utf8(data)
            .map_err(|e| InvalidInput::new("data", format!("not UTF-8: {e}")))?;
        let event: Value = serde_json::from_str(text)
            .map_err(|e| InvalidInput::new("data", format!("not JSON: {e}")))?;
        let key = match event.pointer(&self.key_pointer) {
            Some(Value::String(key)) if !key.is_empty() => key.clone(),
            Some(Value::Number(n)) => n.to_string(),
            Some(other) => {
                return Err(InvalidInput::new(
                    format!("data{}", self.key_pointer),
                    format!("the filter key must be a string or a number, got {other}"),
                ))
            }
            None => {
                return Err(InvalidInput::new(
                    format!("data{}", self.key_pointer),
                    "missing: the event has no filter key there",
                ))
            }
        };
        Ok(Event { key, event })
    }

    fn key(&self, event: &Event) -> String {
        event.key.clone()
    }

    fn process(&self, ctx: &mut Ctx<'_>, event: Event) -> Result<(), ProcessError> {
        let index = self.index.read().expect("index lock");
        let routing = index.route(&event.key, &event.event);
        let (origin, sequence) = (ctx.record().origin.clone(), ctx.record().sequence.clone());
        for delivery in &routing.deliveries {
            let n = consumer_index(delivery.consumer);
            ctx.emit_for(
                &DELIVERIES,
                (&origin, &sequence),
                n,
                delivery.queue,
                &event.event,
            )?;
        }
        let mut tally = self.tally.lock().expect("tally lock");
        tally.events += 1;
        tally.unmatched += u64::from(routing.deliveries.is_empty());
        for delivery in &routing.deliveries {
            tally
                .by_consumer
                .entry(delivery.consumer.to_owned())
                .or_default()
                .0 += 1;
        }
        for consumer in &routing.dropped {
            tally
                .by_consumer
                .entry((*consumer).to_owned())
                .or_default()
                .1 += 1;
        }
        Ok(())
    }
}

/// The output index a consumer's deliveries go under: a stable hash of its id.
fn consumer_index(consumer: &str) -> u32 {
    xxhash_rust::xxh3::xxh3_64(consumer.as_bytes()) as u32
}
