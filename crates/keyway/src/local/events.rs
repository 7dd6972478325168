//! Lambda event payloads as the Kinesis and DynamoDB Streams event source mappings send them
//! (shapes from the Lambda Developer Guide, "Using Lambda with Kinesis" and "... with DynamoDB").

use base64::Engine as _;
use serde_json::{json, Value};

use crate::domain::item::item_to_dynamodb_json;
use crate::domain::{ChangeKind, Item};

/// A record to put in a Kinesis event.
#[derive(Clone, Debug)]
pub struct KinesisEventRecord<'a> {
    pub shard_id: &'a str,
    pub sequence_number: &'a str,
    pub partition_key: &'a str,
    pub data: &'a [u8],
    /// Epoch milliseconds.
    pub arrival_millis: i64,
}

/// A Kinesis event for records of the stream `stream_arn`.
pub fn kinesis_event<'a>(
    stream_arn: &str,
    records: impl IntoIterator<Item = KinesisEventRecord<'a>>,
) -> Value {
    let region = stream_arn.split(':').nth(3).unwrap_or("us-east-1");
    let records: Vec<Value> = records
        .into_iter()
        .map(|r| {
            json!({
                "kinesis": {
                    "kinesisSchemaVersion": "1.0",
                    "partitionKey": r.partition_key,
                    "sequenceNumber": r.sequence_number,
                    "data": base64::engine::general_purpose::STANDARD.encode(r.data),
                    // Lambda sends seconds with millisecond decimals.
                    "approximateArrivalTimestamp": r.arrival_millis as f64 / 1000.0,
                },
                "eventSource": "aws:kinesis",
                "eventVersion": "1.0",
                "eventID": format!("{}:{}", r.shard_id, r.sequence_number),
                "eventName": "aws:kinesis:record",
                "invokeIdentityArn": "arn:aws:iam::123456789012:role/keyway-function",
                "awsRegion": region,
                "eventSourceARN": stream_arn,
            })
        })
        .collect();
    json!({ "Records": records })
}

/// A change to put in a DynamoDB Streams event.
#[derive(Clone, Debug)]
pub struct DynamoDbEventRecord<'a> {
    pub kind: ChangeKind,
    pub keys: &'a Item,
    pub old_image: Option<&'a Item>,
    pub new_image: Option<&'a Item>,
    pub sequence_number: &'a str,
    /// Epoch seconds.
    pub created_secs: i64,
    pub ttl_deletion: bool,
}

/// A DynamoDB Streams event (NEW_AND_OLD_IMAGES) for the stream `stream_arn`.
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
                "StreamViewType": "NEW_AND_OLD_IMAGES",
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
                "eventID": crate::domain::hash::sha256_hex(&[r.sequence_number.as_bytes()], 32),
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
    use crate::domain::{AttrValue, Payload};

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
        let batch = crate::sources::kinesis::decode_event(event.clone()).unwrap();
        let r = batch[0].as_ref().unwrap();
        assert_eq!(r.origin.as_str(), "counts/shardId-000000000001");
        assert_eq!(r.arrival_millis, Some(1_700_000_000_123));
        assert_eq!(r.payload, Payload::Bytes(b"{}".to_vec()));
        // The shape aws_lambda_events' own type accepts, too.
        let typed: aws_lambda_events::event::kinesis::KinesisEvent =
            serde_json::from_value(event).unwrap();
        assert_eq!(typed.records[0].kinesis.partition_key, "k");
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
                old_image: Some(&keys),
                new_image: None,
                sequence_number: "100",
                created_secs: 1_700_000_000,
                ttl_deletion: true,
            }],
        );
        let batch = crate::sources::dynamodb::decode_event(event.clone()).unwrap();
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
