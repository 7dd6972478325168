//! Lambda payloads to domain records (the responses back are `lambda`'s).
//!
//! Records are decoded one by one from the event's JSON (or, for a Kinesis batch handed over in
//! memory, from the records themselves: `kinesis::KinesisBatch`), not through one typed event
//! struct: a
//! single malformed record must be dead-lettered on its own, not fail the whole invocation.
//! A well-formed record is read in one typed pass borrowing from the event's text; only a record
//! that does not fit is parsed into a JSON tree, to name what is wrong with it. The
//! decoders accept what real senders produce (no ApproximateCreationDateTime, timestamps with any
//! number of decimals, emulator payloads) and name the field when they reject something.

pub mod dynamodb;
pub mod kinesis;

use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::domain::{InvalidInput, Origin, RawJson, RejectedRecord, SequenceNumber, SourceRecord};

/// One decoded batch: per record, the record or why it was rejected.
pub type DecodedBatch = Vec<Result<SourceRecord, RejectedRecord>>;

/// A Lambda stream event as its records' JSON texts, borrowed from the event: each record is then
/// decoded on its own, so that one malformed record is dead-lettered alone.
#[derive(Deserialize)]
pub(crate) struct Envelope<'a> {
    #[serde(rename = "Records", borrow, default)]
    records: Option<Vec<&'a RawValue>>,
}

impl<'a> Envelope<'a> {
    /// Reads the event's `Records` array; `None` for an event without one (a schedule's).
    pub(crate) fn parse(event: &'a str) -> Result<Option<Vec<&'a RawValue>>, InvalidInput> {
        match serde_json::from_str::<Envelope>(event) {
            Ok(envelope) => Ok(envelope.records),
            Err(e) if e.is_syntax() || e.is_eof() => Err(InvalidInput::new(
                "Records",
                format!("the event is not JSON: {e}"),
            )),
            Err(e) => Err(InvalidInput::new(
                "Records",
                format!("the event is not an object with a Records array: {e}"),
            )),
        }
    }
}

/// The event source named by a record (`aws:kinesis`, `aws:dynamodb`), when it names one.
pub fn event_source(record: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct Source {
        #[serde(rename = "eventSource")]
        event_source: Option<String>,
    }
    serde_json::from_str::<Source>(record.get())
        .ok()?
        .event_source
}

/// The records of an event's JSON text, or why it has none.
pub fn records_of(event: &str) -> Result<Vec<&RawValue>, InvalidInput> {
    Envelope::parse(event)?
        .ok_or_else(|| InvalidInput::new("Records", "the event has no Records array"))
}

/// Every record through `decode`, with the stream names they share.
pub(crate) fn decode_all(
    records: &[&RawValue],
    decode: fn(&RawValue, &mut StreamNames) -> Result<SourceRecord, RejectedRecord>,
) -> DecodedBatch {
    let mut streams = StreamNames::default();
    records
        .iter()
        .map(|raw| decode(raw, &mut streams))
        .collect()
}

/// The stream names of a batch's records: one shared name, as a batch comes from one stream.
#[derive(Default)]
pub(crate) struct StreamNames(Option<Arc<str>>);

impl StreamNames {
    pub(crate) fn get(&mut self, name: &str) -> Arc<str> {
        match &self.0 {
            Some(shared) if &**shared == name => shared.clone(),
            _ => {
                let shared: Arc<str> = name.into();
                self.0 = Some(shared.clone());
                shared
            }
        }
    }
}

/// Why a record was rejected, with what could be read of its position.
pub(crate) struct Problem {
    pub origin: Option<Origin>,
    pub sequence: Option<SequenceNumber>,
    pub invalid: InvalidInput,
}

/// The latest time a record can say it arrived, in epoch seconds: the end of the year 9999.
/// Arrival times are compared and added to, and one past any clock is no time at all.
const LATEST_EPOCH_SECONDS: f64 = 253_402_300_799.0;
/// The same, in epoch milliseconds.
pub(crate) const LATEST_ARRIVAL_MILLIS: i64 = 253_402_300_799_000;

/// Reads a timestamp in epoch seconds given as a number or a numeric string, with any number of
/// decimals, to milliseconds.
pub(crate) fn epoch_seconds_to_millis(value: &Value, field: &str) -> Result<i64, InvalidInput> {
    let seconds = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
    .filter(|s| s.is_finite() && (0.0..=LATEST_EPOCH_SECONDS).contains(s))
    .ok_or_else(|| {
        InvalidInput::new(
            field,
            format!("expected epoch seconds up to the year 9999, got {value}"),
        )
    })?;
    Ok((seconds * 1000.0).round() as i64)
}

/// The problem of a record that cannot be read as a JSON tree at all: nested past serde_json's
/// depth limit (its raw text was taken from the event without building it).
pub(crate) fn unreadable(e: serde_json::Error) -> Problem {
    Problem {
        origin: None,
        sequence: None,
        invalid: InvalidInput::new("record", format!("cannot be read: {e}")),
    }
}

pub(crate) fn rejected(raw: &RawValue, problem: Problem) -> RejectedRecord {
    RejectedRecord {
        origin: problem.origin.map(|o| o.0),
        sequence: problem.sequence,
        field: problem.invalid.field,
        problem: problem.invalid.problem,
        raw: RawJson::new(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_with_many_decimals_keep_millisecond_precision() {
        let v: Value = serde_json::from_str("1545084650.98712345").unwrap();
        assert_eq!(epoch_seconds_to_millis(&v, "t").unwrap(), 1_545_084_650_987);
        let v: Value = serde_json::from_str("1545084650.05").unwrap();
        assert_eq!(epoch_seconds_to_millis(&v, "t").unwrap(), 1_545_084_650_050);
        assert_eq!(
            epoch_seconds_to_millis(&Value::String("1545084650".into()), "t").unwrap(),
            1_545_084_650_000
        );
        for past_any_clock in ["1e300", "253402300800", "-1"] {
            let v: Value = serde_json::from_str(past_any_clock).unwrap();
            let err = epoch_seconds_to_millis(&v, "t").unwrap_err();
            assert!(err.problem.contains("up to the year 9999"), "{err}");
        }
        let err = epoch_seconds_to_millis(&Value::Bool(true), "t").unwrap_err();
        assert_eq!(err.field, "t");
    }
}
