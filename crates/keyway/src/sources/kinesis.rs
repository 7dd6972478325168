//! Kinesis stream events (the Lambda event source mapping payload) to source records.

use base64::Engine as _;
use serde_json::Value;

use super::{decode_all, epoch_seconds_to_millis, rejected, DecodedBatch, Problem, StreamNames};
use crate::domain::hash::xxh3_128_hex;
use crate::domain::RejectedRecord;
use crate::domain::{InvalidInput, Origin, Payload, SequenceNumber, SourceRecord};

/// Decodes every record of a Kinesis event; a record that does not decode is returned as rejected,
/// naming the field. Fails only when the event has no `Records` array at all.
pub fn decode_event(event: Value) -> Result<DecodedBatch, InvalidInput> {
    decode_all(event, decode_record)
}

pub use crate::domain::record::kinesis_stream_name as stream_name;

/// The record JSON moves into the result: it is kept, not copied, for a dead letter.
// A batch holds records and rejections side by side, both about as large: boxing the rejection
// would only add an allocation.
#[allow(clippy::result_large_err)]
fn decode_record(raw: Value, streams: &mut StreamNames) -> Result<SourceRecord, RejectedRecord> {
    match parse(&raw) {
        Ok((origin, sequence, partition_key, arrival_millis, data)) => Ok(SourceRecord {
            stream: streams.get(
                raw.get("eventSourceARN")
                    .and_then(Value::as_str)
                    .map_or("", stream_name),
            ),
            input: None,
            lineage: lineage(&origin, &partition_key),
            origin,
            sequence,
            partition_key,
            arrival_millis,
            payload: Payload::Bytes(data),
            raw,
        }),
        Err(problem) => Err(rejected(raw, problem)),
    }
}

type Parsed = (Origin, SequenceNumber, String, Option<i64>, Vec<u8>);

/// Partition keys longer than this are named by their hash in a lineage.
const LINEAGE_KEY_MAX: usize = 64;

/// The lineage of a record: its shard and partition key (see `Origin`). A long partition key is
/// replaced by its 128-bit hash, which keeps lineages short in the state that stores them.
pub fn lineage(origin: &Origin, partition_key: &str) -> Origin {
    let mut text = String::with_capacity(
        origin.as_str().len() + 1 + LINEAGE_KEY_MAX.min(partition_key.len() + 1),
    );
    text.push_str(origin.as_str());
    text.push('/');
    if partition_key.len() <= LINEAGE_KEY_MAX {
        text.push_str(partition_key);
    } else {
        text.push('~');
        text.push_str(&xxh3_128_hex(&[partition_key.as_bytes()]));
    }
    Origin(text)
}

fn parse(raw: &Value) -> Result<Parsed, Problem> {
    let text = |v: Option<&Value>, field: &str| -> Result<String, InvalidInput> {
        match v {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(InvalidInput::new(
                field,
                format!("expected a string, got {other}"),
            )),
            None => Err(InvalidInput::new(field, "missing")),
        }
    };
    let kinesis = raw.get("kinesis");
    // Sequence number and origin first: with them a rejected record can still be reported.
    let sequence_field = "kinesis.sequenceNumber";
    let sequence = text(
        kinesis.and_then(|k| k.get("sequenceNumber")),
        sequence_field,
    )
    .and_then(|s| {
        SequenceNumber::parse(&s).map_err(|e| InvalidInput::new(sequence_field, e.to_string()))
    });
    let origin = text(raw.get("eventID"), "eventID").and_then(|id| {
        let shard = id
            .split_once(':')
            .map(|(shard, _)| shard.to_owned())
            .ok_or_else(|| {
                InvalidInput::new(
                    "eventID",
                    format!("expected shardId-…:sequence, got {id:?}"),
                )
            })?;
        let stream = raw
            .get("eventSourceARN")
            .and_then(Value::as_str)
            .map(stream_name)
            .unwrap_or("");
        Ok(Origin(format!("{stream}/{shard}")))
    });
    let (sequence, origin) = match (sequence, origin) {
        (Ok(s), Ok(o)) => (s, o),
        (s, o) => {
            let invalid = s.as_ref().err().or(o.as_ref().err()).cloned();
            return Err(Problem {
                origin: o.ok(),
                sequence: s.ok(),
                invalid: invalid.expect("one of them failed"),
            });
        }
    };
    let at = |invalid: InvalidInput| Problem {
        origin: Some(origin.clone()),
        sequence: Some(sequence.clone()),
        invalid,
    };

    let partition_key = text(
        kinesis.and_then(|k| k.get("partitionKey")),
        "kinesis.partitionKey",
    )
    .map_err(at)?;
    let data = kinesis
        .and_then(|k| k.get("data"))
        .and_then(Value::as_str)
        .ok_or_else(|| at(InvalidInput::new("kinesis.data", "missing or not a string")))?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| {
            at(InvalidInput::new(
                "kinesis.data",
                format!("not base64: {e}"),
            ))
        })?;
    let arrival_millis = kinesis
        .and_then(|k| k.get("approximateArrivalTimestamp"))
        .filter(|v| !v.is_null())
        .map(|v| epoch_seconds_to_millis(v, "kinesis.approximateArrivalTimestamp"))
        .transpose()
        .map_err(at)?;
    Ok((origin, sequence, partition_key, arrival_millis, data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(seq: &str, data: &str, ts: Value) -> Value {
        json!({
            "kinesis": {"kinesisSchemaVersion": "1.0", "partitionKey": "k1", "sequenceNumber": seq,
                        "data": data, "approximateArrivalTimestamp": ts},
            "eventSource": "aws:kinesis", "eventVersion": "1.0",
            "eventID": format!("shardId-000000000006:{seq}"), "eventName": "aws:kinesis:record",
            "awsRegion": "us-east-2", "eventSourceARN": "arn:aws:kinesis:us-east-2:123456789012:stream/orders"
        })
    }

    #[test]
    fn a_record_decodes_to_its_origin_sequence_key_data_and_arrival() {
        let event = json!({"Records": [record("49590338271490256608559692538361571095921575989136588898", "SGVsbG8=", json!(1545084650.987))]});
        let batch = decode_event(event).unwrap();
        let r = batch[0].as_ref().unwrap();
        assert_eq!(r.origin.as_str(), "orders/shardId-000000000006");
        assert_eq!(&*r.stream, "orders");
        assert_eq!(r.lineage.as_str(), "orders/shardId-000000000006/k1");
        assert_eq!(
            r.sequence.as_str(),
            "49590338271490256608559692538361571095921575989136588898"
        );
        assert_eq!(r.partition_key, "k1");
        assert_eq!(r.payload, Payload::Bytes(b"Hello".to_vec()));
        assert_eq!(r.arrival_millis, Some(1_545_084_650_987));
    }

    #[test]
    fn a_long_partition_key_is_named_by_its_hash_in_the_lineage() {
        let origin = Origin("orders/shardId-000000000006".into());
        let long = "k".repeat(256);
        let lineage = lineage(&origin, &long);
        assert!(lineage
            .as_str()
            .starts_with("orders/shardId-000000000006/~"));
        assert_eq!(lineage.as_str().len(), origin.as_str().len() + 2 + 32);
        assert_ne!(lineage, super::lineage(&origin, &"k".repeat(255)));
    }

    #[test]
    fn a_record_without_arrival_time_still_decodes() {
        let mut r = record("1", "SGVsbG8=", json!(null));
        r["kinesis"]
            .as_object_mut()
            .unwrap()
            .remove("approximateArrivalTimestamp");
        let batch = decode_event(json!({"Records": [r]})).unwrap();
        assert_eq!(batch[0].as_ref().unwrap().arrival_millis, None);
    }

    #[test]
    fn bad_base64_is_rejected_naming_the_field_and_keeping_the_sequence_number() {
        let batch = decode_event(json!({"Records": [record("7", "%%%", json!(1.5))]})).unwrap();
        let rejected = batch[0].as_ref().unwrap_err();
        assert_eq!(rejected.field, "kinesis.data");
        assert!(rejected.problem.contains("base64"), "{}", rejected.problem);
        assert_eq!(rejected.sequence.as_ref().unwrap().as_str(), "7");
        assert_eq!(rejected.raw["kinesis"]["data"], "%%%");
    }

    #[test]
    fn a_missing_sequence_number_is_rejected_without_one() {
        let mut r = record("7", "SGVsbG8=", json!(1.5));
        r["kinesis"]
            .as_object_mut()
            .unwrap()
            .remove("sequenceNumber");
        let batch = decode_event(json!({"Records": [r]})).unwrap();
        let rejected = batch[0].as_ref().unwrap_err();
        assert_eq!(rejected.field, "kinesis.sequenceNumber");
        assert_eq!(rejected.sequence, None);
    }

    #[test]
    fn an_event_without_records_is_an_error() {
        let err = decode_event(json!({"records": []})).unwrap_err();
        assert_eq!(
            (err.field.as_str(), err.problem.as_str()),
            ("Records", "the event has no Records array")
        );
    }
}
