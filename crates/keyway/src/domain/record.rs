//! Source records: what a stream delivered, independent of the Lambda payload it came in.

use std::cmp::Ordering;
use std::fmt;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::item::Item;

/// A stream sequence number. Kinesis sequence numbers are decimal strings of up to 128 digits,
/// beyond any integer type, and DynamoDB Streams uses the same form; both compare as numbers.
/// The text is kept exactly as delivered, because a partial batch response must name a record by
/// the very string Lambda gave it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SequenceNumber(String);

impl SequenceNumber {
    /// Parses a decimal sequence number, rejecting anything but digits.
    pub fn parse(text: &str) -> Result<Self, NotASequenceNumber> {
        if text.is_empty() || text.len() > 128 || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(NotASequenceNumber(text.to_owned()));
        }
        Ok(Self(text.to_owned()))
    }

    /// The sequence number exactly as delivered.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The digits without leading zeros, on which equality and order are defined.
    fn significant(&self) -> &str {
        let trimmed = self.0.trim_start_matches('0');
        if trimmed.is_empty() {
            "0"
        } else {
            trimmed
        }
    }
}

/// Text that is not a sequence number (1 to 128 decimal digits).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("expected a decimal sequence number, got {0:?}")]
pub struct NotASequenceNumber(pub String);

impl TryFrom<String> for SequenceNumber {
    type Error = NotASequenceNumber;
    fn try_from(value: String) -> Result<Self, NotASequenceNumber> {
        Self::parse(&value)
    }
}

impl From<SequenceNumber> for String {
    fn from(value: SequenceNumber) -> String {
        value.0
    }
}

impl Ord for SequenceNumber {
    fn cmp(&self, other: &Self) -> Ordering {
        // Without leading zeros, a longer number is larger; equal lengths compare digit by digit.
        let (a, b) = (self.significant(), other.significant());
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    }
}

impl PartialOrd for SequenceNumber {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for SequenceNumber {
    fn eq(&self, other: &Self) -> bool {
        self.significant() == other.significant()
    }
}

impl Eq for SequenceNumber {}

impl std::hash::Hash for SequenceNumber {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.significant().hash(state);
    }
}

impl fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a record sits: a stream position that, with the sequence number, names the record. For
/// Kinesis that is a shard of a stream (`stream/shardId-…`). DynamoDB Streams does not name the
/// shard in a Lambda event, so there it is the table's stream and a hash of the item's key.
///
/// The same type names a *lineage*: the records Lambda keeps in order, where a retry redelivers a
/// suffix of what it delivered. A Kinesis shard keeps all its records in order only with
/// ParallelizationFactor 1; with a higher factor Lambda runs a shard's partition keys in
/// concurrent lanes, and only one partition key's records stay in order, so the lineage is the
/// shard and the partition key (`stream/shardId-…/partition key`). A DynamoDB stream keeps only
/// one item's changes in order: the lineage is the item.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Origin(pub String);

impl Origin {
    /// The origin's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The stream name in a Kinesis stream ARN (`arn:aws:kinesis:region:account:stream/name`).
pub fn kinesis_stream_name(arn: &str) -> &str {
    arn.rsplit_once("stream/").map_or(arn, |(_, name)| name)
}

/// The table name in a DynamoDB table or stream ARN
/// (`arn:aws:dynamodb:region:account:table/name/stream/label`).
pub fn dynamodb_table_name(arn: &str) -> Option<&str> {
    let rest = arn.split_once(":table/")?.1;
    Some(rest.split_once("/stream/").map_or(rest, |(table, _)| table))
}

/// What `SourceRecord::stream` holds for records of `name_or_arn`: a Kinesis stream's name, or
/// the table's of a DynamoDB stream, whether given by name or by ARN.
pub fn stream_name_of(name_or_arn: &str) -> &str {
    if let Some(table) = dynamodb_table_name(name_or_arn) {
        table
    } else if name_or_arn.starts_with("arn:") {
        kinesis_stream_name(name_or_arn)
    } else {
        name_or_arn
    }
}

/// One record as delivered by a stream, with where it sits in its origin.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceRecord {
    /// The stream it came from: a Kinesis stream's name, or the table of a DynamoDB stream.
    /// Shared by the records of a batch.
    pub stream: Arc<str>,
    /// Which of the operator's declared inputs reads `stream`, once the executor routed it
    /// (`None` for an operator that declares no inputs, or a stream none of them reads).
    pub input: Option<&'static str>,
    /// Where the record sits; with `sequence`, it names the record (see `Origin`).
    pub origin: Origin,
    /// The finest run of records Lambda keeps in order whatever the mapping's settings: the shard
    /// and partition key for Kinesis, the item for DynamoDB Streams (see `Origin`).
    pub lineage: Origin,
    /// The record's sequence number in its origin.
    pub sequence: SequenceNumber,
    /// The Kinesis partition key, or for DynamoDB Streams the item's key as canonical JSON.
    pub partition_key: String,
    /// When the stream received the record, in milliseconds since the epoch, where known.
    pub arrival_millis: Option<i64>,
    /// What the record carries.
    pub payload: Payload,
    /// The record as it arrived (the Lambda event's record JSON), for the dead-letter sink.
    pub raw: RawJson,
}

/// The stream name timer records carry: no Kinesis stream or table can be named so.
pub const TIMER_STREAM: &str = "$timers";

impl SourceRecord {
    /// The record that fires `key`'s timer at `at_millis` (not negative). Its origin is the key
    /// and its sequence number the time, so the ids of what firing it emits are derived as a
    /// stream record's are, and are the same each time the timer is fired again.
    pub fn timer(key: &str, at_millis: i64) -> Self {
        let origin = Origin(format!("{TIMER_STREAM}/{key}"));
        Self {
            stream: Arc::from(TIMER_STREAM),
            input: None,
            lineage: origin.clone(),
            origin,
            sequence: SequenceNumber(at_millis.max(0).to_string()),
            partition_key: key.to_owned(),
            arrival_millis: None,
            payload: Payload::Timer {
                key: key.to_owned(),
                at_millis,
            },
            raw: RawJson::from_value(
                &serde_json::json!({ "timer": { "key": key, "atMillis": at_millis } }),
            ),
        }
    }

    /// The key and time of a timer record.
    pub fn as_timer(&self) -> Option<(&str, i64)> {
        match &self.payload {
            Payload::Timer { key, at_millis } => Some((key, *at_millis)),
            _ => None,
        }
    }
}

/// What a record carries.
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    /// Kinesis data: opaque bytes, shared with the stream's record rather than copied.
    Bytes(Bytes),
    /// A DynamoDB Streams change.
    Change(Change),
    /// A timer of `key` coming due at `at_millis`: made by the executor's timer sweep, never by
    /// a source (see `SourceRecord::timer`).
    Timer {
        /// The key whose timer it is.
        key: String,
        /// When the timer comes due, in epoch milliseconds.
        at_millis: i64,
    },
}

/// A DynamoDB Streams change of one item.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// Whether the item was inserted, modified or removed.
    pub kind: ChangeKind,
    /// The table's name, from the event's source ARN or table name, when the event says.
    pub table: Option<String>,
    /// The item's key attributes (`Keys`).
    pub keys: Item,
    /// The item before the change (`OldImage`), when the stream carries old images.
    pub old_image: Option<Item>,
    /// The item after the change (`NewImage`), when the stream carries new images.
    pub new_image: Option<Item>,
    /// True when DynamoDB itself removed the item because its TTL expired.
    pub ttl_deletion: bool,
}

/// What a DynamoDB Streams change did to its item (the record's `eventName`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    /// A new item was written (`INSERT`).
    Insert,
    /// An existing item was changed (`MODIFY`).
    Modify,
    /// The item was deleted (`REMOVE`), by a request or by its TTL.
    Remove,
}

/// A record the source could not turn into a `SourceRecord` (malformed event JSON, no sequence
/// number...). It is dead-lettered as is.
#[derive(Clone, Debug, PartialEq)]
pub struct RejectedRecord {
    /// Where the record sits in its stream, when the record got far enough to say.
    pub origin: Option<String>,
    /// The record's sequence number, when it could be read.
    pub sequence: Option<SequenceNumber>,
    /// The field that is wrong.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
    /// The record JSON as delivered.
    pub raw: RawJson,
}

/// A record's JSON text exactly as it arrived. Kept as text, not as a parsed tree: only a dead
/// letter ever reads it, and building a tree of every record of every batch (its base64 data a
/// string of its own) cost more than decoding the record itself. A record handed over in memory
/// (`sources::kinesis::KinesisBatch`) writes its text only when it is first read.
#[derive(Clone)]
pub struct RawJson(Raw);

#[derive(Clone)]
enum Raw {
    Text(Box<serde_json::value::RawValue>),
    Deferred(Arc<dyn DeferredText>),
}

/// A text written when it is first read.
trait DeferredText: Send + Sync {
    fn text(&self) -> &str;
}

struct Deferred<F> {
    text: OnceLock<Box<serde_json::value::RawValue>>,
    write: F,
}

impl<F: Fn() -> String + Send + Sync> DeferredText for Deferred<F> {
    fn text(&self) -> &str {
        self.text
            .get_or_init(|| {
                serde_json::value::RawValue::from_string((self.write)())
                    .expect("the writer writes JSON")
            })
            .get()
    }
}

impl RawJson {
    /// The text of a JSON value that was already checked to be JSON.
    pub fn new(raw: &serde_json::value::RawValue) -> Self {
        Self(Raw::Text(raw.to_owned()))
    }

    /// The text of `value`, serialized.
    pub fn from_value(value: &serde_json::Value) -> Self {
        Self(Raw::Text(
            serde_json::value::to_raw_value(value).expect("a JSON value serializes"),
        ))
    }

    /// The text `write` writes, written when it is first read; it must write JSON.
    pub fn deferred(write: impl Fn() -> String + Send + Sync + 'static) -> Self {
        Self(Raw::Deferred(Arc::new(Deferred {
            text: OnceLock::new(),
            write,
        })))
    }

    /// The JSON text, written first if it was deferred.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Raw::Text(text) => text.get(),
            Raw::Deferred(deferred) => deferred.text(),
        }
    }

    /// The text parsed, for a reader that needs to look inside.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(self.as_str()).expect("the text was JSON when it was kept")
    }
}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RawJson").field(&self.as_str()).finish()
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl fmt::Display for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(text: &str) -> SequenceNumber {
        SequenceNumber::parse(text).unwrap()
    }

    #[test]
    fn sequence_numbers_beyond_u128_compare_as_numbers() {
        let a = seq("49590338271490256608559692538361571095921575989136588898");
        let b = seq("49590338271490256608559692540925702759324208523137515618");
        assert!(a < b);
        assert!(seq("9") < seq("10"));
        assert!(seq("100") > seq("99"));
        assert_eq!(seq("007"), seq("7"));
        assert_eq!(seq("007").as_str(), "007");
    }

    #[test]
    fn a_sequence_number_that_is_not_decimal_is_rejected_with_the_text() {
        let err = SequenceNumber::parse("12a").unwrap_err();
        assert!(err.to_string().contains("\"12a\""), "{err}");
        assert!(SequenceNumber::parse("").is_err());
    }

    #[test]
    fn a_stream_is_named_alike_by_its_name_and_by_its_arn() {
        assert_eq!(stream_name_of("clicks"), "clicks");
        assert_eq!(
            stream_name_of("arn:aws:kinesis:us-east-1:123456789012:stream/clicks"),
            "clicks"
        );
        let table = "arn:aws:dynamodb:us-east-1:123456789012:table/orders";
        assert_eq!(stream_name_of(table), "orders");
        assert_eq!(
            stream_name_of(&format!("{table}/stream/2026-01-01T00:00:00.000")),
            "orders"
        );
    }

    #[test]
    fn sequence_numbers_round_trip_through_json_as_strings() {
        let s = seq("123456789012345678901234567890123456789012345");
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, "\"123456789012345678901234567890123456789012345\"");
        assert_eq!(serde_json::from_str::<SequenceNumber>(&json).unwrap(), s);
        assert!(serde_json::from_str::<SequenceNumber>("\"x\"").is_err());
    }
}
