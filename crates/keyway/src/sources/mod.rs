//! Lambda payloads to domain records (the responses back are `lambda`'s).
//!
//! Records are decoded one by one from the event's JSON, not through one typed event struct: a
//! single malformed record must be dead-lettered on its own, not fail the whole invocation. The
//! decoders accept what real senders produce (no ApproximateCreationDateTime, timestamps with any
//! number of decimals, emulator payloads) and name the field when they reject something.

pub mod dynamodb;
pub mod kinesis;

use std::sync::Arc;

use serde_json::Value;

use crate::domain::{InvalidInput, Origin, RejectedRecord, SequenceNumber, SourceRecord};

/// One decoded batch: per record, the record or why it was rejected.
pub type DecodedBatch = Vec<Result<SourceRecord, RejectedRecord>>;

/// The `Records` array of a Lambda stream event, taken out of it.
pub fn records_of(event: Value) -> Result<Vec<Value>, InvalidInput> {
    match event {
        Value::Object(mut map) => match map.remove("Records") {
            Some(Value::Array(records)) => Ok(records),
            _ => Err(InvalidInput::new(
                "Records",
                "the event has no Records array",
            )),
        },
        _ => Err(InvalidInput::new(
            "Records",
            "the event is not a JSON object",
        )),
    }
}

/// Every record of `event` through `decode`, with the stream names they share.
pub(crate) fn decode_all(
    event: Value,
    decode: fn(Value, &mut StreamNames) -> Result<SourceRecord, RejectedRecord>,
) -> Result<DecodedBatch, InvalidInput> {
    let records = records_of(event)?;
    let mut streams = StreamNames::default();
    let mut batch = Vec::with_capacity(records.len());
    for raw in records {
        batch.push(decode(raw, &mut streams));
    }
    Ok(batch)
}

/// The stream names of a batch's records: one shared name, as a batch comes from one stream.
#[derive(Default)]
pub(crate) struct StreamNames(Option<Arc<str>>);

impl StreamNames {
    pub fn get(&mut self, name: &str) -> Arc<str> {
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

/// Reads a timestamp in epoch seconds given as a number or a numeric string, with any number of
/// decimals, to milliseconds.
pub(crate) fn epoch_seconds_to_millis(value: &Value, field: &str) -> Result<i64, InvalidInput> {
    let seconds = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
    .filter(|s| s.is_finite() && *s >= 0.0)
    .ok_or_else(|| InvalidInput::new(field, format!("expected epoch seconds, got {value}")))?;
    Ok((seconds * 1000.0).round() as i64)
}

pub(crate) fn rejected(raw: Value, problem: Problem) -> RejectedRecord {
    RejectedRecord {
        origin: problem.origin.map(|o| o.0),
        sequence: problem.sequence,
        field: problem.invalid.field,
        problem: problem.invalid.problem,
        raw,
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
        let err = epoch_seconds_to_millis(&Value::Bool(true), "t").unwrap_err();
        assert_eq!(err.field, "t");
    }
}
