//! Kinesis stream events (the Lambda event source mapping payload) to source records, from the
//! event's JSON text as Lambda sends it, or from the records themselves when the embedded runtime
//! hands a batch to a function of its own process (`KinesisBatch`): decoded to the same records,
//! each rejected for the same reason, without writing and reading back the JSON.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::{
    decode_all, epoch_seconds_to_millis, records_of, rejected, unreadable, DecodedBatch, Problem,
    StreamNames,
};
use crate::domain::hash::xxh3_128_hex;
use crate::domain::json::push_string;
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
        // Not the shape of a Kinesis record: read it as a tree to say what is wrong (a record
        // nested past serde_json's depth cannot even be read as one).
        Err(_) => match serde_json::from_str::<Value>(raw.get()) {
            Ok(tree) => {
                let stream = tree
                    .get("eventSourceARN")
                    .and_then(Value::as_str)
                    .map_or("", stream_name);
                let parsed = Fields::of(&tree, stream).parse();
                parsed.map(|parsed| (parsed, streams.get(stream)))
            }
            Err(e) => Err(unreadable(e)),
        },
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
            payload: Payload::Bytes(data.into()),
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

/// A Kinesis record as a shard holds it and an event carries it, its data not yet base64.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KinesisRecord {
    /// The shard the record is in (`shardId-…`).
    pub shard_id: String,
    /// The record's sequence number in its shard, as decimal text.
    pub sequence_number: String,
    /// The partition key the producer gave the record.
    pub partition_key: String,
    /// The record's data, as raw bytes.
    pub data: Bytes,
    /// Epoch milliseconds.
    pub arrival_millis: i64,
}

/// A record to write into a Kinesis event, its fields borrowed.
#[derive(Clone, Debug)]
pub struct KinesisEventRecord<'a> {
    /// The shard the record is in (`shardId-…`).
    pub shard_id: &'a str,
    /// The record's sequence number in its shard, as decimal text.
    pub sequence_number: &'a str,
    /// The partition key the producer gave the record.
    pub partition_key: &'a str,
    /// The record's data, raw (the event carries it as base64).
    pub data: &'a [u8],
    /// Epoch milliseconds.
    pub arrival_millis: i64,
}

impl<'a> From<&'a KinesisRecord> for KinesisEventRecord<'a> {
    fn from(r: &'a KinesisRecord) -> Self {
        Self {
            shard_id: &r.shard_id,
            sequence_number: &r.sequence_number,
            partition_key: &r.partition_key,
            data: &r.data,
            arrival_millis: r.arrival_millis,
        }
    }
}

/// The bytes of a Kinesis event record besides its data, partition key, sequence number, shard,
/// region and stream ARN (a little more, for escapes).
const RECORD_ENVELOPE_BYTES: usize = 400;

/// A Kinesis event for records of the stream `stream_arn` as JSON text, the form Lambda hands a
/// function (shapes from the Lambda Developer Guide, "Using Lambda with Kinesis"). Written
/// directly: the event source mapping emulator builds one for every batch a function reads as
/// JSON.
pub fn kinesis_event_json<'a>(
    stream_arn: &str,
    records: impl IntoIterator<Item = KinesisEventRecord<'a>>,
) -> String {
    let records: Vec<KinesisEventRecord> = records.into_iter().collect();
    // Sized up front: a batch's event runs to megabytes, and growing it by doubling copied it
    // over and over into freshly faulted pages.
    let capacity: usize = records
        .iter()
        .map(|r| record_json_capacity(stream_arn, r))
        .sum();
    let mut out = String::with_capacity(capacity + 16);
    out.push_str("{\"Records\":[");
    for (i, r) in records.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_record_json(&mut out, stream_arn, r);
    }
    out.push_str("]}");
    out
}

/// About how long a record's JSON is, at least.
fn record_json_capacity(stream_arn: &str, r: &KinesisEventRecord) -> usize {
    let text = r.partition_key.len() + 2 * r.sequence_number.len() + r.shard_id.len();
    RECORD_ENVELOPE_BYTES + 3 * stream_arn.len() + text + r.data.len().div_ceil(3) * 4
}

/// Appends one record of a Kinesis event, as Lambda writes it.
fn push_record_json(out: &mut String, stream_arn: &str, r: &KinesisEventRecord) {
    let region = stream_arn.split(':').nth(3).unwrap_or("us-east-1");
    out.push_str("{\"kinesis\":{\"kinesisSchemaVersion\":\"1.0\",\"partitionKey\":");
    push_string(out, r.partition_key);
    out.push_str(",\"sequenceNumber\":");
    push_string(out, r.sequence_number);
    out.push_str(",\"data\":\"");
    base64_simd::STANDARD.encode_append(r.data, out);
    // Lambda sends seconds with millisecond decimals.
    let _ = write!(
        out,
        "\",\"approximateArrivalTimestamp\":{}.{:03}",
        r.arrival_millis.div_euclid(1000),
        r.arrival_millis.rem_euclid(1000)
    );
    out.push_str("},\"eventSource\":\"aws:kinesis\",\"eventVersion\":\"1.0\",\"eventID\":");
    // A real shard id and sequence number need no escaping; anything else still writes JSON.
    push_string(out, &format!("{}:{}", r.shard_id, r.sequence_number));
    out.push_str(",\"eventName\":\"aws:kinesis:record\",\"invokeIdentityArn\":\"arn:aws:iam::123456789012:role/keyway-function\",\"awsRegion\":");
    push_string(out, region);
    out.push_str(",\"eventSourceARN\":");
    push_string(out, stream_arn);
    out.push('}');
}

/// One record's JSON as its event carries it.
fn record_json(stream_arn: &str, r: &KinesisEventRecord) -> String {
    let mut out = String::with_capacity(record_json_capacity(stream_arn, r));
    push_record_json(&mut out, stream_arn, r);
    out
}

/// Whether a record reads the same from its fields as from its JSON: a shard id without the
/// colon that ends it in the event id, and an arrival time that seconds with three decimals
/// carry exactly and a record may say (up to the year 9999).
fn exact_as_json(r: &KinesisRecord) -> bool {
    !r.shard_id.contains(':') && (0..=super::LATEST_ARRIVAL_MILLIS).contains(&r.arrival_millis)
}

/// A batch of a stream's records as an event source mapping hands it to a function: written as
/// the event's JSON for a function in another process, as Lambda does, or handed over as it is
/// to one in the embedded runtime's own.
#[derive(Clone, Debug)]
pub struct KinesisBatch {
    /// The ARN of the stream the records come from.
    pub stream_arn: Arc<str>,
    /// The batch's records, in the order the function gets them.
    pub records: Vec<Arc<KinesisRecord>>,
}

impl KinesisBatch {
    /// The event as Lambda sends it.
    pub fn to_event_json(&self) -> String {
        kinesis_event_json(
            &self.stream_arn,
            self.records.iter().map(|r| KinesisEventRecord::from(&**r)),
        )
    }

    /// The records the event's JSON decodes to (`decode_event`), read from the records
    /// themselves: the data is shared (`Bytes`), not written as base64 and read back, and a
    /// record's JSON is written only if a dead letter asks for it. A record this cannot read as
    /// it stands is decoded from its JSON, which says what is wrong with it exactly as the event
    /// would.
    pub fn decode(&self) -> DecodedBatch {
        let mut streams = StreamNames::default();
        let stream = streams.get(stream_name(&self.stream_arn));
        self.records
            .iter()
            .map(|r| match SequenceNumber::parse(&r.sequence_number) {
                Ok(sequence) if exact_as_json(r) => {
                    let origin = Origin(format!("{stream}/{}", r.shard_id));
                    Ok(SourceRecord {
                        stream: stream.clone(),
                        input: None,
                        lineage: lineage(&origin, &r.partition_key),
                        origin,
                        sequence,
                        partition_key: r.partition_key.clone(),
                        arrival_millis: Some(r.arrival_millis),
                        payload: Payload::Bytes(r.data.clone()),
                        raw: self.raw(r),
                    })
                }
                _ => {
                    let text = record_json(&self.stream_arn, &KinesisEventRecord::from(&**r));
                    let raw = RawValue::from_string(text).expect("the writer writes JSON");
                    decode_record(&raw, &mut streams)
                }
            })
            .collect()
    }

    /// A record's JSON, written when it is first read.
    fn raw(&self, record: &Arc<KinesisRecord>) -> RawJson {
        let arn = self.stream_arn.clone();
        let record = record.clone();
        RawJson::deferred(move || record_json(&arn, &KinesisEventRecord::from(&*record)))
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
        assert_eq!(r.payload, Payload::Bytes(Bytes::from_static(b"Hello")));
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

    fn kinesis_record() -> impl proptest::strategy::Strategy<Value = KinesisRecord> {
        use proptest::prelude::*;
        (
            prop_oneof!["shardId-00000000000[0-9]", "shard:[0-9]", "shard[\"\\\\]"],
            prop_oneof!["[0-9]{1,56}", "[0-9a\"]{0,3}"],
            "\\PC{0,8}|[\"\\\\\u{0}-\u{1f}a]{0,6}",
            // Up to ten times a usual record, past every chunk the SIMD codecs work in.
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..40),
                proptest::collection::vec(any::<u8>(), 1_000..12_000),
            ],
            prop_oneof![0i64..1 << 50, Just(-1_500), Just(1 << 51)],
        )
            .prop_map(
                |(shard_id, sequence_number, partition_key, data, arrival_millis)| KinesisRecord {
                    shard_id,
                    sequence_number,
                    partition_key,
                    data: data.into(),
                    arrival_millis,
                },
            )
    }

    proptest::proptest! {
        /// The in-memory hand-over is the JSON event without the JSON: whatever the records,
        /// even those the event's decoder rejects, they decode alike, raw text included.
        #[test]
        fn a_batch_handed_over_in_memory_decodes_as_its_event_json_does(
            records in proptest::collection::vec(kinesis_record(), 0..6),
            stream_arn in proptest::prop_oneof![
                proptest::strategy::Just("arn:aws:kinesis:eu-west-1:123456789012:stream/orders"),
                proptest::strategy::Just(""),
            ],
        ) {
            let batch = KinesisBatch {
                stream_arn: stream_arn.into(),
                records: records.into_iter().map(Arc::new).collect(),
            };
            let from_json = super::decode_event(&batch.to_event_json()).unwrap();
            let handed_over = batch.decode();
            proptest::prop_assert_eq!(handed_over.len(), from_json.len());
            for (direct, json) in handed_over.iter().zip(&from_json) {
                proptest::prop_assert_eq!(direct, json);
                let raw = |r: &Result<SourceRecord, RejectedRecord>| match r {
                    Ok(r) => r.raw.as_str().to_owned(),
                    Err(r) => r.raw.as_str().to_owned(),
                };
                proptest::prop_assert_eq!(raw(direct), raw(json));
            }
        }
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
