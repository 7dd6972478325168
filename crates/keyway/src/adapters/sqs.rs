//! SQS as a sink: the narrow SendMessageBatch API (`SqsApi`), its SDK implementation, and
//! `SqsSink`, which batches outputs (10 entries / 1 MiB a call) and retries failed entries.
//!
//! Every message carries its output id: on a FIFO queue as MessageDeduplicationId (SQS then drops
//! a duplicate sent within five minutes) with the partition key as MessageGroupId (SQS keeps a
//! group's order); on a standard queue as the message attribute `outputId`, for the consumer.

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use aws_sdk_sqs::Client;

use super::kinesis::sink_error;
use super::retry::{split_calls, Backoff, CallLimits, Round};
use super::sdk_error::{class_of, classify, CodeClass};

use crate::domain::hash::sha256_hex;
use crate::domain::json::{escape_noncharacters, holds_noncharacters};
use crate::domain::Output;
use crate::ports::{Deadline, Sink, SinkError};

/// SendMessageBatch takes at most 10 entries.
pub const BATCH_MAX_ENTRIES: usize = 10;
/// The ids of a call's entries, by position.
const ENTRY_IDS: [&str; BATCH_MAX_ENTRIES] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
/// The total payload of one SendMessageBatch, and of one message: 1 MiB, SQS's limit since
/// August 2025 (256 KB before).
pub const BATCH_MAX_BYTES: usize = 1024 * 1024;
/// What a SendMessageBatch call takes: a message may fill one alone.
const SEND_MESSAGE_BATCH: CallLimits = CallLimits {
    entries: BATCH_MAX_ENTRIES,
    bytes: BATCH_MAX_BYTES,
    entry_bytes: BATCH_MAX_BYTES,
};
/// The attribute that carries the output id on standard queues.
pub const OUTPUT_ID_ATTRIBUTE: &str = "outputId";
/// What the output id attribute adds to a message's size: SQS counts an attribute's name, data
/// type and value against the message and batch limits.
const ATTRIBUTE_BYTES: usize = OUTPUT_ID_ATTRIBUTE.len() + "String".len() + 32;

/// One entry of a SendMessageBatch call, borrowed from the output it sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqsEntry<'a> {
    /// Unique within the call.
    pub id: &'a str,
    /// The message body.
    pub body: &'a str,
    /// Sent as the `outputId` message attribute.
    pub output_id: Option<&'a str>,
    /// FIFO queues only.
    pub group_id: Option<&'a str>,
    /// FIFO queues only: SQS drops a message sent with the same id within five minutes.
    pub deduplication_id: Option<&'a str>,
}

/// What SendMessageBatch did with one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SqsOutcome {
    /// The message was sent.
    Sent {
        /// The id SQS gave the message.
        message_id: String,
    },
    /// The message was not sent.
    Failed {
        /// The entry's error code.
        code: String,
        /// The entry's error message.
        message: String,
        /// SQS blames the request, not itself: unless the code says otherwise, resending the
        /// message as is will not help.
        sender_fault: bool,
    },
}

/// The SQS operation sinks need.
#[async_trait]
pub trait SqsApi: Send + Sync {
    /// SendMessageBatch: one outcome per entry, in order.
    async fn send_message_batch(
        &self,
        queue_url: &str,
        entries: &[SqsEntry<'_>],
    ) -> Result<Vec<SqsOutcome>, SinkError>;
}

/// `SqsApi` on the AWS SDK.
#[derive(Clone, Debug)]
pub struct SdkSqs {
    client: Client,
}

impl SdkSqs {
    /// SendMessageBatch through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// The client's configuration (region, endpoint).
    pub fn config(&self) -> &aws_sdk_sqs::Config {
        self.client.config()
    }
}

#[async_trait]
impl SqsApi for SdkSqs {
    async fn send_message_batch(
        &self,
        queue_url: &str,
        entries: &[SqsEntry<'_>],
    ) -> Result<Vec<SqsOutcome>, SinkError> {
        let requests = entries
            .iter()
            .map(|e| {
                let mut entry = SendMessageBatchRequestEntry::builder()
                    .id(e.id)
                    .message_body(e.body)
                    .set_message_group_id(e.group_id.map(str::to_owned))
                    .set_message_deduplication_id(e.deduplication_id.map(str::to_owned));
                if let Some(id) = e.output_id {
                    let attribute = MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value(id)
                        .build()
                        .map_err(|err| SinkError::Rejected(err.to_string()))?;
                    entry = entry.message_attributes(OUTPUT_ID_ATTRIBUTE, attribute);
                }
                entry
                    .build()
                    .map_err(|err| SinkError::Rejected(err.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let response = self
            .client
            .send_message_batch()
            .queue_url(queue_url)
            .set_entries(Some(requests))
            .send()
            .await
            .map_err(|e| sink_error(classify(&e)))?;
        Ok(entries
            .iter()
            .map(|e| {
                if let Some(ok) = response.successful().iter().find(|s| s.id() == e.id) {
                    SqsOutcome::Sent {
                        message_id: ok.message_id().to_owned(),
                    }
                } else if let Some(failed) = response.failed().iter().find(|f| f.id() == e.id) {
                    SqsOutcome::Failed {
                        code: failed.code().to_owned(),
                        message: failed.message().unwrap_or_default().to_owned(),
                        sender_fault: failed.sender_fault(),
                    }
                } else {
                    SqsOutcome::Failed {
                        code: "Missing".into(),
                        message: "the response does not mention this entry".into(),
                        sender_fault: false,
                    }
                }
            })
            .collect())
    }
}

/// The message group for a FIFO output. SQS takes 1 to 128 characters, letters, digits and
/// punctuation; any other key is replaced by its SHA-256, which keeps one key in one group.
fn group_id(key: &str) -> Cow<'_, str> {
    let valid = !key.is_empty() && key.len() <= 128 && key.bytes().all(|b| b.is_ascii_graphic());
    if valid {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(sha256_hex(&[key.as_bytes()], 64))
    }
}

/// A body as SQS takes it. SQS refuses a message holding a character outside XML's, and of
/// those JSON writes U+FFFE and U+FFFF as they are (it escapes the others, controls). Outputs and
/// dead letters are made with them escaped (`escape_noncharacters`), which reads as the same
/// JSON; one an older release left in an outbox is escaped here.
fn sqs_body(body: &str) -> Cow<'_, str> {
    if holds_noncharacters(body) {
        Cow::Owned(escape_noncharacters(body.to_owned()))
    } else {
        Cow::Borrowed(body)
    }
}

/// Outputs to one SQS queue.
pub struct SqsSink<A: SqsApi> {
    api: Arc<A>,
    queue_url: String,
    fifo: bool,
    backoff: Backoff,
}

impl<A: SqsApi> SqsSink<A> {
    /// A FIFO queue is recognised by its `.fifo` suffix, as SQS requires of FIFO queue names.
    pub fn new(api: Arc<A>, queue_url: impl Into<String>) -> Self {
        let queue_url = queue_url.into();
        let fifo = queue_url.ends_with(".fifo");
        Self {
            api,
            queue_url,
            fifo,
            backoff: Backoff::default(),
        }
    }

    /// The same sink, retrying failed messages with `backoff`.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    async fn send_batch(
        &self,
        messages: &[Output],
        bodies: &[Cow<'_, str>],
        pending: Vec<usize>,
    ) -> Round<usize, SinkError> {
        let groups: Vec<Option<Cow<str>>> = pending
            .iter()
            .map(|&i| self.fifo.then(|| group_id(&messages[i].partition_key)))
            .collect();
        let entries: Vec<SqsEntry> = pending
            .iter()
            .enumerate()
            .map(|(n, &i)| SqsEntry {
                id: ENTRY_IDS[n],
                body: &bodies[i],
                output_id: Some(messages[i].id.as_str()),
                group_id: groups[n].as_deref(),
                deduplication_id: self.fifo.then_some(messages[i].id.as_str()),
            })
            .collect();
        let mut round = Round::default();
        match self.api.send_message_batch(&self.queue_url, &entries).await {
            Ok(outcomes) => {
                for (&i, outcome) in pending.iter().zip(outcomes) {
                    if let SqsOutcome::Failed {
                        code,
                        message,
                        sender_fault,
                    } = outcome
                    {
                        let text = format!("{code}: {message}");
                        match class_of(&code) {
                            CodeClass::Throttled => {
                                round.retry.push((i, SinkError::Throttled(text)))
                            }
                            CodeClass::Refused if sender_fault => {
                                round.failed.push((i, SinkError::Rejected(text)))
                            }
                            _ => round.retry.push((i, SinkError::Unavailable(text))),
                        }
                    }
                }
            }
            Err(err) => pending
                .iter()
                .for_each(|&i| round.add_error(i, err.clone())),
        }
        round
    }
}

#[async_trait]
impl<A: SqsApi> Sink for SqsSink<A> {
    async fn send(&self, messages: &[Output], deadline: Deadline) -> Vec<(usize, SinkError)> {
        let bodies: Vec<Cow<str>> = messages.iter().map(|m| sqs_body(&m.body)).collect();
        let sizes = bodies.iter().map(|body| body.len() + ATTRIBUTE_BYTES);
        let (calls, mut failed) = split_calls(sizes, SEND_MESSAGE_BATCH, |size| {
            format!("an SQS message is at most {BATCH_MAX_BYTES} bytes with its attributes; this one is {size}")
        });
        // A FIFO queue gets one call after another, so that a group's messages keep their
        // order; a standard queue keeps none and gets every call at once.
        let sent = self
            .backoff
            .send_calls(calls, self.fifo, deadline, |pending| {
                self.send_batch(messages, &bodies, pending)
            });
        failed.extend(sent.await);
        failed.sort_by_key(|(i, _)| *i);
        failed
    }

    fn max_message_bytes(&self) -> usize {
        BATCH_MAX_BYTES - ATTRIBUTE_BYTES
    }

    /// A FIFO queue keeps a message group's order; a standard queue keeps none.
    fn ordered(&self) -> bool {
        self.fifo
    }

    fn order_of<'a>(&self, key: &'a str) -> Cow<'a, str> {
        group_id(key)
    }
}
