//! Kinesis stream events (the Lambda event source mapping payload) to source records.

use std::borrow::Cow;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::{
    decode_all, epoch_seconds_to_millis, records_of, rejected, DecodedBatch, Problem, StreamNames,
};
use crate::domain::hash::xxh3_128_hex;
use crate::domain::RejectedRecord;
use crate::domain::{InvalidInput, Origin, Payload, RawJson, SequenceNumber, SourceRecord};

/// Decodes every record of a Kinesis event's JSON text; a record that does not decode is returned
/// as rejected, naming the field. Fails only when the event has no `Records` array at all.
pub fn decode_event(event: &str) -> Result<DecodedBatch, InvalidInput> {
    Ok(decode_records(&records_of(event)?))
}

/// Decodes the records of an event, each on its own.
pub fn decode_records(records: &[&RawValue]) -> DecodedBatch {
    decode_all(records, decode_record)
}

pub use crate::domain::record::kinesis_stream_name as stream_name;

/// A Kinesis record as Lambda delivers it, its strings borrowed from the event where they hold no
/// escapes (base64 data never does).
#[derive(Deserialize)]
struct RecordIn<'a> {
    #[serde(rename = "eventID", borrow)]
    event_id: Cow<'a, str>,
    #[serde(rename = "eventSourceARN", borrow, default)]
    event_source_arn: Option<Cow<'a, str>>,
    #[serde(borrow)]
    kinesis: KinesisIn<'a>,
}

#[derive(Deserialize)]
struct KinesisIn<'a> {
    #[serde(rename = "partitionKey", borrow)]
    partition_key: Cow<'a, str>,
    #[serde(rename = "sequenceNumber", borrow)]
    sequence_number: Cow<'a, str>,
    #[serde(borrow)]
    data: Cow<'a, str>,
    #[serde(rename = "approximateArrivalTimestamp", default)]
    arrival: Option<Value>,
}

// A batch holds records and rejections side by side, both about as large: boxing the rejection
// would only add an allocation.
#[allow(clippy::result_large_err)]
fn decode_record(
    raw: &RawValue,
    streams: &mut StreamNames,
) -> Result<SourceRecord, RejectedRecord> {
    let parsed = match serde_json::from_str::<RecordIn>(raw.get()) {
        Ok(record) => {
            let stream = record.event_source_arn.as_deref().map_or("", stream_name);
            let fields = Fields {
                stream,
                event_id: Ok(&record.event_id),
                sequence: Ok(&record.kinesis.sequence_number),
                partition_key: Ok(&record.kinesis.partition_key),
                data: Some(&record.kinesis.data),
                arrival: record.kinesis.arrival.as_ref(),
            };
            fields.parse().map(|parsed| (parsed, streams.get(stream)))
        }
        // Not the shape of a Kinesis record: read it as a tree to say what is wrong.
        Err(_) => {
            let tree: Value = serde_json::from_str(raw.get()).expect("an event's records are JSON");
            let stream = tree
                .get("eventSourceARN")
                .and_then(Value::as_str)
                .map_or("", stream_name);
            let parsed = Fields::of(&tree, stream).parse();
            parsed.map(|parsed| (parsed, streams.get(stream)))
        }
    };
    match parsed {
        Ok(((origin, sequence, partition_key, arrival_millis, data), stream)) => Ok(SourceRecord {
            stream,
            input: None,
            lineage: lineage(&origin, &partition_key),
            origin,
            sequence,
            partition_key,
            arrival_millis,
            payload: Payload::Bytes(data),
            raw: RawJson::new(raw),
        }),
        Err(problem) => Err(rejected(raw, problem)),
    }
}

type Parsed = (Origin, SequenceNumber, String, Option<i64>, Vec<u8>);

/// Decodes standard base64 with SIMD, where most of a batch's decoding time goes; the scalar
/// decoder is asked only about text the fast one refused, for its message naming the offset.
fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    match base64_simd::STANDARD.decode_to_vec(text) {
        Ok(bytes) => Ok(bytes),
        Err(_) => base64::engine::general_purpose::STANDARD.decode(text),
    }
}

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

/// A record's fields, each a string or why it is not one.
struct Fields<'a> {
    stream: &'a str,
    event_id: Result<&'a str, InvalidInput>,
    sequence: Result<&'a str, InvalidInput>,
    partition_key: Result<&'a str, InvalidInput>,
    data: Option<&'a str>,
    arrival: Option<&'a Value>,
}

impl<'a> Fields<'a> {
    fn of(raw: &'a Value, stream: &'a str) -> Self {
        let text = |v: Option<&'a Value>, field: &str| -> Result<&'a str, InvalidInput> {
            match v {
                Some(Value::String(s)) => Ok(s),
                Some(other) => Err(InvalidInput::new(
                    field,
                    format!("expected a string, got {other}"),
                )),
                None => Err(InvalidInput::new(field, "missing")),
            }
        };
        let kinesis = raw.get("kinesis");
        Self {
            stream,
            event_id: text(raw.get("eventID"), "eventID"),
            sequence: text(
                kinesis.and_then(|k| k.get("sequenceNumber")),
                "kinesis.sequenceNumber",
            ),
            partition_key: text(
                kinesis.and_then(|k| k.get("partitionKey")),
                "kinesis.partitionKey",
            ),
            data: kinesis.and_then(|k| k.get("data")).and_then(Value::as_str),
            arrival: kinesis.and_then(|k| k.get("approximateArrivalTimestamp")),
        }
    }

    fn parse(self) -> Result<Parsed, Problem> {
        // Sequence number and origin first: with them a rejected record can still be reported.
        let sequence = self.sequence.and_then(|s| {
            SequenceNumber::parse(s)
                .map_err(|e| InvalidInput::new("kinesis.sequenceNumber", e.to_string()))
        });
        let origin = self.event_id.and_then(|id| {
            let (shard, _) = id.split_once(':').ok_or_else(|| {
                InvalidInput::new(
                    "eventID",
                    format!("expected shardId-…:sequence, got {id:?}"),
                )
            })?;
            Ok(Origin(format!("{}/{shard}", self.stream)))
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
        let partition_key = self.partition_key.map_err(at)?.to_owned();
        let data = self
            .data
            .ok_or_else(|| at(InvalidInput::new("kinesis.data", "missing or not a string")))?;
        let data = decode_base64(data.trim()).map_err(|e| {
            at(InvalidInput::new(
                "kinesis.data",
                format!("not base64: {e}"),
            ))
        })?;
        let arrival_millis = self
            .arrival
            .filter(|v| !v.is_null())
            .map(|v| epoch_seconds_to_millis(v, "kinesis.approximateArrivalTimestamp"))
            .transpose()
            .map_err(at)?;
        Ok((origin, sequence, partition_key, arrival_millis, data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_simd_decoder_reads_what_the_scalar_one_writes_and_refuses_what_it_refuses() {
        let standard = base64::engine::general_purpose::STANDARD;
        for len in 0..100usize {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + len) as u8).collect();
            let text = standard.encode(&bytes);
            assert_eq!(decode_base64(&text).unwrap(), bytes, "{len} bytes");
            assert_eq!(base64_simd::STANDARD.encode_to_string(&bytes), text);
        }
        for bad in ["QQ", "Q===", "QUJD!", "QUJ=RA==", "  QUJD"] {
            let scalar = standard.decode(bad).map_err(|e| e.to_string());
            assert_eq!(
                decode_base64(bad).map_err(|e| e.to_string()),
                scalar,
                "{bad}"
            );
        }
    }

    /// The event as Lambda hands it over: JSON text.
    fn decode_event(event: Value) -> Result<DecodedBatch, InvalidInput> {
        super::decode_event(&event.to_string())
    }

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
    fn escapes_in_a_partition_key_are_read_and_the_raw_record_is_kept_as_delivered() {
        let text = r#"{"Records": [{"kinesis": {"partitionKey": "a\"b\u00e9", "sequenceNumber": "7",
            "data": "SGVsbG8=", "approximateArrivalTimestamp": 1.5},
            "eventID": "shardId-000000000001:7", "eventSourceARN": "arn:aws:kinesis:us-east-2:1:stream/s"}]}"#;
        let batch = super::decode_event(text).unwrap();
        let record = batch[0].as_ref().unwrap();
        assert_eq!(record.partition_key, "a\"b\u{e9}");
        let start = text.find("{\"kinesis\"").unwrap();
        assert_eq!(record.raw.as_str(), &text[start..text.len() - 2]);
    }

    #[test]
    fn a_record_of_the_wrong_shape_is_rejected_naming_the_field() {
        let mut r = record("7", "SGVsbG8=", json!(1.5));
        r["kinesis"]["partitionKey"] = json!(12);
        let batch = decode_event(json!({"Records": [r, 42]})).unwrap();
        let wrong_type = batch[0].as_ref().unwrap_err();
        assert_eq!(wrong_type.field, "kinesis.partitionKey");
        assert_eq!(wrong_type.problem, "expected a string, got 12");
        assert_eq!(wrong_type.sequence.as_ref().unwrap().as_str(), "7");
        let not_a_record = batch[1].as_ref().unwrap_err();
        assert_eq!(not_a_record.field, "kinesis.sequenceNumber");
        assert_eq!(not_a_record.raw.as_str(), "42");
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
        assert_eq!(rejected.raw.to_value()["kinesis"]["data"], "%%%");
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
