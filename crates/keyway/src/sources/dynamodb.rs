//! DynamoDB Streams events (the Lambda event source mapping payload) to source records.

use serde_json::value::RawValue;
use serde_json::Value;

use super::{
    decode_all, epoch_seconds_to_millis, records_of, rejected, unreadable, DecodedBatch, Problem,
    StreamNames,
};
use crate::domain::hash::xxh3_128_hex;
use crate::domain::item::{item_from_dynamodb_json, item_to_dynamodb_json};
use crate::domain::RejectedRecord;
use crate::domain::{
    Change, ChangeKind, InvalidInput, Origin, Payload, RawJson, SequenceNumber, SourceRecord,
};

/// Decodes every record of a DynamoDB Streams event's JSON text; a record that does not decode is returned as
/// rejected, naming the field. Fails only when the event has no `Records` array at all.
pub fn decode_event(event: &str) -> Result<DecodedBatch, InvalidInput> {
    Ok(decode_records(&records_of(event)?))
}

/// Decodes the records of an event, each on its own.
pub fn decode_records(records: &[&RawValue]) -> DecodedBatch {
    decode_all(records, decode_record)
}

pub use crate::domain::record::dynamodb_table_name as table_name;

/// The stream label in a stream ARN: a table deleted and created again, or whose stream was turned
/// off and on, has a new label, and its sequence numbers start over.
pub fn stream_label(arn: &str) -> Option<&str> {
    arn.split_once("/stream/").map(|(_, label)| label)
}

/// The stream label a DynamoDB Streams record's origin names (`table@label/item`), if its event
/// named its stream: what orders the changes of one item across the streams its table had.
pub fn stream_label_of(origin: &Origin) -> Option<&str> {
    let (stream, _item) = origin.as_str().split_once('/')?;
    stream.split_once('@').map(|(_table, label)| label)
}

// A batch holds records and rejections side by side, both about as large: boxing the rejection
// would only add an allocation.
#[allow(clippy::result_large_err)]
fn decode_record(
    raw: &RawValue,
    streams: &mut StreamNames,
) -> Result<SourceRecord, RejectedRecord> {
    // A change's images are read as trees whatever their shape: the tree is the item (a record
    // nested past serde_json's depth cannot even be read as one).
    let tree: Value = match serde_json::from_str(raw.get()) {
        Ok(tree) => tree,
        Err(e) => return Err(rejected(raw, unreadable(e))),
    };
    match parse(&tree) {
        Ok((origin, sequence, arrival_millis, change)) => Ok(SourceRecord {
            stream: streams.get(change.table.as_deref().unwrap_or("")),
            input: None,
            partition_key: item_to_dynamodb_json(&change.keys).to_string(),
            lineage: origin.clone(),
            origin,
            sequence,
            arrival_millis,
            payload: Payload::Change(change),
            raw: RawJson::new(raw),
        }),
        Err(problem) => Err(rejected(raw, problem)),
    }
}

fn parse(raw: &Value) -> Result<(Origin, SequenceNumber, Option<i64>, Change), Problem> {
    let change = raw.get("dynamodb");
    let table = raw
        .get("eventSourceARN")
        .and_then(Value::as_str)
        .and_then(table_name)
        .or_else(|| raw.get("tableName").and_then(Value::as_str))
        .map(str::to_owned);
    let keys = change
        .and_then(|c| c.get("Keys"))
        .ok_or_else(|| InvalidInput::new("dynamodb.Keys", "missing"))
        .and_then(|k| item_from_dynamodb_json(k, "dynamodb.Keys"));
    let sequence = sequence_number(change);
    let origin = keys
        .as_ref()
        .ok()
        .map(|keys| origin_of(raw, table.as_deref(), keys));
    let (keys, sequence, origin) = match (keys, sequence, origin) {
        (Ok(k), Ok(s), Some(o)) => (k, s, o),
        (k, s, o) => {
            // With keys there is an origin: one of keys and sequence number failed.
            let invalid = k.as_ref().err().or(s.as_ref().err()).cloned();
            return Err(Problem {
                origin: o,
                sequence: s.ok(),
                invalid: invalid.expect("keys or sequence number failed"),
            });
        }
    };
    let at = |invalid: InvalidInput| Problem {
        origin: Some(origin.clone()),
        sequence: Some(sequence.clone()),
        invalid,
    };

    let kind = event_kind(raw).map_err(at)?;
    let new_image = image(change, "NewImage").map_err(at)?;
    let old_image = image(change, "OldImage").map_err(at)?;
    let arrival_millis = change
        .and_then(|c| c.get("ApproximateCreationDateTime"))
        .filter(|v| !v.is_null())
        .map(|v| epoch_seconds_to_millis(v, "dynamodb.ApproximateCreationDateTime"))
        .transpose()
        .map_err(at)?;
    let ttl_deletion = is_ttl_deletion(raw);
    Ok((
        origin,
        sequence,
        arrival_millis,
        Change {
            kind,
            table,
            keys,
            old_image,
            new_image,
            ttl_deletion,
        },
    ))
}

fn sequence_number(change: Option<&Value>) -> Result<SequenceNumber, InvalidInput> {
    let field = "dynamodb.SequenceNumber";
    match change.and_then(|c| c.get("SequenceNumber")) {
        Some(Value::String(s)) => {
            SequenceNumber::parse(s).map_err(|e| InvalidInput::new(field, e.to_string()))
        }
        Some(other) => Err(InvalidInput::new(
            field,
            format!("expected a string, got {other}"),
        )),
        None => Err(InvalidInput::new(field, "missing")),
    }
}

/// All changes of one item are ordered, so the item is the origin (see `Origin`), within one
/// stream of the table: a new stream's sequence numbers start over.
fn origin_of(raw: &Value, table: Option<&str>, keys: &crate::domain::Item) -> Origin {
    let label = raw
        .get("eventSourceARN")
        .and_then(Value::as_str)
        .and_then(stream_label);
    let canonical = item_to_dynamodb_json(keys).to_string();
    let mut text = table.unwrap_or("").to_owned();
    if let Some(label) = label {
        text.push('@');
        text.push_str(label);
    }
    text.push('/');
    text.push_str(&xxh3_128_hex(&[canonical.as_bytes()]));
    Origin(text)
}

fn event_kind(raw: &Value) -> Result<ChangeKind, InvalidInput> {
    match raw.get("eventName").and_then(Value::as_str) {
        Some("INSERT") => Ok(ChangeKind::Insert),
        Some("MODIFY") => Ok(ChangeKind::Modify),
        Some("REMOVE") => Ok(ChangeKind::Remove),
        other => Err(InvalidInput::new(
            "eventName",
            format!("expected INSERT, MODIFY or REMOVE, got {other:?}"),
        )),
    }
}

/// The change's image `name` (`NewImage`, `OldImage`), if it has one.
fn image(change: Option<&Value>, name: &str) -> Result<Option<crate::domain::Item>, InvalidInput> {
    match change.and_then(|c| c.get(name)) {
        None | Some(Value::Null) => Ok(None),
        // An item always has its key attributes, so an empty image is no image: senders that
        // serialize through aws_lambda_events write `{}` for an absent one.
        Some(Value::Object(map)) if map.is_empty() => Ok(None),
        Some(v) => item_from_dynamodb_json(v, &format!("dynamodb.{name}")).map(Some),
    }
}

/// DynamoDB's TTL process deletes as the service principal (Developer Guide, "Working with
/// expired items and time to live").
fn is_ttl_deletion(raw: &Value) -> bool {
    let identity = raw.get("userIdentity");
    identity.and_then(|u| u.get("type")).and_then(Value::as_str) == Some("Service")
        && identity
            .and_then(|u| u.get("principalId"))
            .and_then(Value::as_str)
            == Some("dynamodb.amazonaws.com")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::AttrValue;
    use serde_json::json;

    /// The event as Lambda hands it over: JSON text.
    fn decode_event(event: Value) -> Result<DecodedBatch, InvalidInput> {
        super::decode_event(&event.to_string())
    }

    fn record(name: &str, seq: &str) -> Value {
        json!({
            "eventID": "c4ca4238a0b923820dcc509a6f75849b", "eventName": name, "eventVersion": "1.1",
            "eventSource": "aws:dynamodb", "awsRegion": "eu-west-1",
            "dynamodb": {
                "ApproximateCreationDateTime": 1479499740,
                "Keys": {"Id": {"N": "101"}},
                "NewImage": {"Id": {"N": "101"}, "Message": {"S": "New item!"}},
                "SequenceNumber": seq, "SizeBytes": 26, "StreamViewType": "NEW_AND_OLD_IMAGES"
            },
            "eventSourceARN": "arn:aws:dynamodb:eu-west-1:123456789012:table/policies/stream/2015-06-27T00:48:05.899"
        })
    }

    #[test]
    fn an_insert_decodes_to_a_change_with_keys_image_and_origin_per_item() {
        let batch = decode_event(json!({"Records": [record("INSERT", "111")]})).unwrap();
        let r = batch[0].as_ref().unwrap();
        let Payload::Change(change) = &r.payload else {
            panic!("a change")
        };
        assert_eq!(change.kind, ChangeKind::Insert);
        assert_eq!(change.table.as_deref(), Some("policies"));
        assert_eq!(change.keys["Id"], AttrValue::N("101".into()));
        assert_eq!(
            change.new_image.as_ref().unwrap()["Message"],
            AttrValue::S("New item!".into())
        );
        assert!(change.old_image.is_none());
        assert!(!change.ttl_deletion);
        assert!(
            r.origin
                .as_str()
                .starts_with("policies@2015-06-27T00:48:05.899/"),
            "{}",
            r.origin
        );
        assert_eq!(r.lineage, r.origin, "one item's changes are one lineage");
        assert_eq!(
            &*r.stream, "policies",
            "a table's stream is named by the table"
        );
        assert_eq!(r.partition_key, r#"{"Id":{"N":"101"}}"#);
        assert_eq!(r.arrival_millis, Some(1_479_499_740_000));
    }

    #[test]
    fn the_same_item_in_a_new_stream_of_the_table_is_another_lineage() {
        let mut again = record("INSERT", "1");
        again["eventSourceARN"] = Value::String(
            "arn:aws:dynamodb:eu-west-1:123456789012:table/policies/stream/2026-01-01T00:00:00.000"
                .into(),
        );
        let batch = decode_event(json!({"Records": [record("INSERT", "1"), again]})).unwrap();
        assert_ne!(
            batch[0].as_ref().unwrap().lineage,
            batch[1].as_ref().unwrap().lineage
        );
    }

    #[test]
    fn a_records_origin_gives_back_its_streams_label() {
        let batch = decode_event(json!({"Records": [record("INSERT", "1")]})).unwrap();
        let origin = &batch[0].as_ref().unwrap().origin;
        assert_eq!(stream_label_of(origin), Some("2015-06-27T00:48:05.899"));
        let mut bare = record("INSERT", "1");
        bare["eventSourceARN"] = json!("arn:aws:dynamodb:eu-west-1:123456789012:table/policies");
        let batch = decode_event(json!({ "Records": [bare] })).unwrap();
        let origin = &batch[0].as_ref().unwrap().origin;
        assert_eq!(stream_label_of(origin), None);
    }

    #[test]
    fn a_ttl_deletion_is_marked_as_one() {
        let mut r = record("REMOVE", "112");
        r["userIdentity"] = json!({"type": "Service", "principalId": "dynamodb.amazonaws.com"});
        let batch = decode_event(json!({"Records": [r]})).unwrap();
        let Payload::Change(change) = &batch[0].as_ref().unwrap().payload else {
            panic!()
        };
        assert!(change.ttl_deletion);
        assert_eq!(change.kind, ChangeKind::Remove);
    }

    #[test]
    fn a_record_without_creation_time_decodes() {
        let mut r = record("MODIFY", "113");
        r["dynamodb"]
            .as_object_mut()
            .unwrap()
            .remove("ApproximateCreationDateTime");
        let batch = decode_event(json!({"Records": [r]})).unwrap();
        assert_eq!(batch[0].as_ref().unwrap().arrival_millis, None);
    }

    #[test]
    fn an_unknown_event_name_is_rejected_naming_the_field() {
        let batch = decode_event(json!({"Records": [record("UPSERT", "114")]})).unwrap();
        let rejected = batch[0].as_ref().unwrap_err();
        assert_eq!(rejected.field, "eventName");
        assert_eq!(rejected.sequence.as_ref().unwrap().as_str(), "114");
    }

    #[test]
    fn the_same_item_in_two_records_has_the_same_origin() {
        let batch =
            decode_event(json!({"Records": [record("INSERT", "1"), record("MODIFY", "2")]}))
                .unwrap();
        assert_eq!(
            batch[0].as_ref().unwrap().origin,
            batch[1].as_ref().unwrap().origin
        );
    }
}
