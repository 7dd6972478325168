//! Kinesis PutRecords and PutRecord, and SQS SendMessageBatch and SendMessage, on the in-memory
//! streams and queues: the writes a function makes. Reads are the event source mapping's, which
//! invokes the function; a function that reads a stream or a queue itself is refused by name.

use base64::Engine as _;
use serde_json::{json, Value};

use super::ApiError;
use crate::services::kinesis::LocalKinesis;
use crate::services::sqs::LocalSqs;
use keyway::adapters::kinesis::{KinesisApi, PutEntry, PutOutcome};
use keyway::adapters::sqs::{SqsApi, SqsEntry, SqsOutcome};
use keyway::domain::hash::md5_hex;
use keyway::ports::SinkError;

/// Kinesis's operations.
pub(super) async fn kinesis(
    kinesis: &LocalKinesis,
    operation: &str,
    request: &Value,
) -> Result<Value, ApiError> {
    let stream = request["StreamName"]
        .as_str()
        .or_else(|| {
            request["StreamARN"]
                .as_str()
                .and_then(|arn| arn.rsplit_once(":stream/").map(|(_, n)| n))
        })
        .ok_or_else(|| ApiError::validation("StreamName or StreamARN: required"))?;
    let records = match operation {
        "PutRecords" => request["Records"]
            .as_array()
            .cloned()
            .ok_or_else(|| ApiError::validation("Records: required"))?,
        "PutRecord" => vec![request.clone()],
        other => return Err(ApiError::unknown_operation("Kinesis", other)),
    };
    let mut data = Vec::with_capacity(records.len());
    for (i, record) in records.iter().enumerate() {
        // A PutRecord's fields are the request's own.
        let at = match operation {
            "PutRecords" => format!("Records[{i}]."),
            _ => String::new(),
        };
        let text = record["Data"]
            .as_str()
            .ok_or_else(|| ApiError::validation(format!("{at}Data: required")))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| ApiError::validation(format!("{at}Data: not base64: {e}")))?;
        let key = record["PartitionKey"]
            .as_str()
            .ok_or_else(|| ApiError::validation(format!("{at}PartitionKey: required")))?;
        data.push((bytes, key, record["ExplicitHashKey"].as_str()));
    }
    let entries: Vec<PutEntry> = data
        .iter()
        .map(|(bytes, key, hash)| PutEntry {
            partition_key: key,
            data: bytes,
            explicit_hash_key: *hash,
        })
        .collect();
    let outcomes = kinesis.put_records(stream, &entries).await.map_err(sink)?;
    let answers: Vec<Value> = outcomes
        .iter()
        .map(|outcome| match outcome {
            PutOutcome::Written {
                shard_id,
                sequence_number,
            } => json!({ "ShardId": shard_id, "SequenceNumber": sequence_number }),
            PutOutcome::Failed { code, message } => {
                json!({ "ErrorCode": code, "ErrorMessage": message })
            }
        })
        .collect();
    if operation == "PutRecord" {
        return match outcomes.first() {
            Some(PutOutcome::Failed { code, message }) => {
                Err(ApiError::code(code, message.clone()))
            }
            _ => Ok(answers.into_iter().next().unwrap_or_default()),
        };
    }
    let failed = outcomes
        .iter()
        .filter(|o| matches!(o, PutOutcome::Failed { .. }))
        .count();
    Ok(json!({ "FailedRecordCount": failed, "Records": answers }))
}

/// SQS's operations.
pub(super) async fn sqs(
    sqs: &LocalSqs,
    operation: &str,
    request: &Value,
) -> Result<Value, ApiError> {
    let queue = request["QueueUrl"]
        .as_str()
        .ok_or_else(|| ApiError::validation("QueueUrl: required"))?;
    let messages = match operation {
        "SendMessageBatch" => request["Entries"]
            .as_array()
            .cloned()
            .ok_or_else(|| ApiError::validation("Entries: required"))?,
        "SendMessage" => {
            let mut message = request.clone();
            message["Id"] = json!("0");
            vec![message]
        }
        other => return Err(ApiError::unknown_operation("SQS", other)),
    };
    let mut parts = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        // A SendMessage's fields are the request's own.
        let at = match operation {
            "SendMessageBatch" => format!("Entries[{i}]."),
            _ => String::new(),
        };
        parts.push(Message::read(message, i, &at)?);
    }
    let entries: Vec<SqsEntry> = parts
        .iter()
        .map(|m| SqsEntry {
            id: &m.id,
            body: &m.body,
            output_id: m.output_id.as_deref(),
            group_id: m.group_id.as_deref(),
            deduplication_id: m.deduplication_id.as_deref(),
        })
        .collect();
    let outcomes = sqs
        .send_message_batch(queue, &entries)
        .await
        .map_err(sink)?;
    let (mut successful, mut failed) = (Vec::new(), Vec::new());
    for (message, outcome) in parts.iter().zip(&outcomes) {
        match outcome {
            SqsOutcome::Sent { message_id } => successful.push(json!({
                "Id": message.id,
                "MessageId": message_id,
                "MD5OfMessageBody": md5_hex(message.body.as_bytes()),
            })),
            SqsOutcome::Failed {
                code,
                message: text,
                sender_fault,
            } => failed.push(json!({
                "Id": message.id, "Code": code, "Message": text, "SenderFault": sender_fault,
            })),
        }
    }
    if operation == "SendMessage" {
        return match outcomes.first() {
            Some(SqsOutcome::Failed { code, message, .. }) => {
                Err(ApiError::code(code, message.clone()))
            }
            _ => {
                let mut sent = successful.into_iter().next().unwrap_or_default();
                sent.as_object_mut().map(|m| m.remove("Id"));
                Ok(sent)
            }
        };
    }
    Ok(json!({ "Successful": successful, "Failed": failed }))
}

/// One message of a send, as the queue takes it.
struct Message {
    id: String,
    body: String,
    output_id: Option<String>,
    group_id: Option<String>,
    deduplication_id: Option<String>,
}

impl Message {
    fn read(message: &Value, i: usize, at: &str) -> Result<Self, ApiError> {
        let field = |name: &str| message[name].as_str().map(str::to_owned);
        let body = field("MessageBody")
            .ok_or_else(|| ApiError::validation(format!("{at}MessageBody: required")))?;
        if message["DelaySeconds"].as_u64().is_some_and(|d| d > 0) {
            return Err(ApiError::validation(format!(
                "{at}DelaySeconds: delayed messages are not reproduced"
            )));
        }
        let mut output_id = None;
        if let Some(attributes) = message["MessageAttributes"].as_object() {
            for (name, attribute) in attributes {
                match (name.as_str(), attribute["StringValue"].as_str()) {
                    ("outputId", Some(value)) => output_id = Some(value.to_owned()),
                    _ => return Err(ApiError::validation(format!(
                        "{at}MessageAttributes.{name}: only the string attribute outputId is kept by the embedded queues"
                    ))),
                }
            }
        }
        Ok(Self {
            id: field("Id").unwrap_or_else(|| i.to_string()),
            body,
            output_id,
            group_id: field("MessageGroupId"),
            deduplication_id: field("MessageDeduplicationId"),
        })
    }
}

/// A failed call as the service answers it.
fn sink(err: SinkError) -> ApiError {
    match err {
        SinkError::Throttled(m) => ApiError::code("ProvisionedThroughputExceededException", m),
        SinkError::Unavailable(m) | SinkError::OutOfTime(m) => ApiError {
            status: 500,
            code: "InternalFailure".into(),
            message: m,
        },
        SinkError::Rejected(m) => ApiError::validation(m),
    }
}
