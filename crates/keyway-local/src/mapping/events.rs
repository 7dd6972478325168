//! Lambda event payloads as the Kinesis and DynamoDB Streams event source mappings send them
//! (shapes from the Lambda Developer Guide, "Using Lambda with Kinesis" and "... with DynamoDB").

use serde_json::{json, Value};

use crate::StreamView;
use keyway::domain::item::item_to_dynamodb_json;
use keyway::domain::{ChangeKind, Item};

pub use keyway::sources::kinesis::{kinesis_event_json, KinesisEventRecord};

/// A Kinesis event for records of the stream `stream_arn`.
pub fn kinesis_event<'a>(
    stream_arn: &str,
    records: impl IntoIterator<Item = KinesisEventRecord<'a>>,
) -> Value {
    serde_json::from_str(&kinesis_event_json(stream_arn, records)).expect("the builder writes JSON")
}

/// A change to put in a DynamoDB Streams event.
#[derive(Clone, Debug)]
pub struct DynamoDbEventRecord<'a> {
    /// The event's name: `INSERT`, `MODIFY` or `REMOVE`.
    pub kind: ChangeKind,
    /// The item's key attributes, which every record carries.
    pub keys: &'a Item,
    /// The stream's view type: which images a record may carry.
    pub view: StreamView,
    /// The item before the change, if the view keeps old images and there was one.
    pub old_image: Option<&'a Item>,
    /// The item after the change, if the view keeps new images and there is one.
    pub new_image: Option<&'a Item>,
    /// The record's position in its shard, which also derives its `eventID`.
    pub sequence_number: &'a str,
    /// Epoch seconds.
    pub created_secs: i64,
    /// Whether TTL deleted the item, which the record tells by the `dynamodb.amazonaws.com`
    /// service as its `userIdentity`.
    pub ttl_deletion: bool,
}

/// A DynamoDB Streams event as JSON text, the form Lambda hands a function.
pub(crate) fn dynamodb_event_json<'a>(
    stream_arn: &str,
    records: impl IntoIterator<Item = DynamoDbEventRecord<'a>>,
) -> String {
    dynamodb_event(stream_arn, records).to_string()
}

/// A DynamoDB Streams event for the stream `stream_arn`: each record with the images it has.
pub fn dynamodb_event<'a>(
    stream_arn: &str,
    records: impl IntoIterator<Item = DynamoDbEventRecord<'a>>,
) -> Value {
    let region = stream_arn.split(':').nth(3).unwrap_or("us-east-1");
    let records: Vec<Value> = records
        .into_iter()
        .map(|r| {
            let mut change = json!({
                "ApproximateCreationDateTime": r.created_secs,
                "Keys": item_to_dynamodb_json(r.keys),
                "SequenceNumber": r.sequence_number,
                "SizeBytes": 0,
                "StreamViewType": r.view.name(),
            });
            let size = serde_json::to_string(&change).map(|s| s.len()).unwrap_or(0);
            if let Some(image) = r.new_image {
                change["NewImage"] = item_to_dynamodb_json(image);
            }
            if let Some(image) = r.old_image {
                change["OldImage"] = item_to_dynamodb_json(image);
            }
            change["SizeBytes"] = json!(size);
            let mut record = json!({
                "eventID": keyway::domain::hash::sha256_hex(&[r.sequence_number.as_bytes()], 32),
                "eventName": match r.kind { ChangeKind::Insert => "INSERT", ChangeKind::Modify => "MODIFY", ChangeKind::Remove => "REMOVE" },
                "eventVersion": "1.1",
                "eventSource": "aws:dynamodb",
                "awsRegion": region,
                "dynamodb": change,
                "eventSourceARN": stream_arn,
            });
            if r.ttl_deletion {
                record["userIdentity"] = json!({"type": "Service", "principalId": "dynamodb.amazonaws.com"});
            }
            record
        })
        .collect();
    json!({ "Records": records })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway::domain::{AttrValue, Payload};

    #[test]
    fn a_built_kinesis_event_decodes_back_to_the_same_records() {
        let event = kinesis_event(
            "arn:aws:kinesis:eu-west-1:123456789012:stream/counts",
            [KinesisEventRecord {
                shard_id: "shardId-000000000001",
                sequence_number: "4959",
                partition_key: "k",
                data: b"{}",
                arrival_millis: 1_700_000_000_123,
            }],
        );
        let batch = keyway::sources::kinesis::decode_event(&event.to_string()).unwrap();
        let r = batch[0].as_ref().unwrap();
        assert_eq!(r.origin.as_str(), "counts/shardId-000000000001");
        assert_eq!(r.arrival_millis, Some(1_700_000_000_123));
        assert_eq!(r.payload, Payload::Bytes(b"{}".to_vec().into()));
        // The shape aws_lambda_events' own type accepts, too.
        let typed: aws_lambda_events::event::kinesis::KinesisEvent =
            serde_json::from_value(event).unwrap();
        assert_eq!(typed.records[0].kinesis.partition_key, "k");
    }

    #[test]
    fn partition_keys_that_need_escaping_are_escaped() {
        let text = kinesis_event_json(
            "arn:aws:kinesis:eu-west-1:123456789012:stream/s",
            [KinesisEventRecord {
                shard_id: "shardId-0",
                sequence_number: "1",
                partition_key: "a \"quoted\\ key\n",
                data: b"",
                arrival_millis: 5,
            }],
        );
        let event: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            event["Records"][0]["kinesis"]["partitionKey"],
            "a \"quoted\\ key\n"
        );
        assert_eq!(
            event["Records"][0]["kinesis"]["approximateArrivalTimestamp"],
            0.005
        );
    }

    #[test]
    fn a_built_dynamodb_event_decodes_back_to_the_same_change() {
        let mut keys = Item::new();
        keys.insert("id".into(), AttrValue::S("1".into()));
        let event = dynamodb_event(
            "arn:aws:dynamodb:eu-west-1:123456789012:table/subs/stream/2024-01-01T00:00:00.000",
            [DynamoDbEventRecord {
                kind: ChangeKind::Remove,
                keys: &keys,
                view: StreamView::NewAndOldImages,
                old_image: Some(&keys),
                new_image: None,
                sequence_number: "100",
                created_secs: 1_700_000_000,
                ttl_deletion: true,
            }],
        );
        let batch = keyway::sources::dynamodb::decode_event(&event.to_string()).unwrap();
        let Payload::Change(change) = &batch[0].as_ref().unwrap().payload else {
            panic!("a change")
        };
        assert!(change.ttl_deletion);
        assert_eq!(change.old_image.as_ref(), Some(&keys));
        let typed: aws_lambda_events::event::dynamodb::Event =
            serde_json::from_value(event).unwrap();
        assert_eq!(typed.records[0].event_name, "REMOVE");
    }
}
