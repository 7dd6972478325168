//! Kinesis as a sink: the narrow PutRecords API (`KinesisApi`), its SDK implementation, and
//! `KinesisSink`, which batches outputs (500 records / 5 MB a call) and retries the records a
//! call could not write.
//!
//! Order: a stream keeps a partition key's records in the order they were written, but a record
//! that fails inside a PutRecords call does not stop a later one of the same key in that call.
//! The sink is therefore `ordered`: the executor gives it one output of a key per call, and sends
//! a key's next output only once the previous one was written.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use aws_sdk_kinesis::Client;

use super::retry::{split_calls, Backoff, CallLimits, Round};
use super::sdk_error::{class_of, classify, CodeClass, ErrorClass};
use crate::domain::hash::{is_partition_key, sha256_hex};
use crate::domain::Output;
use crate::ports::{Deadline, Sink, SinkError};

/// A record's data plus partition key may be at most 1 MiB.
pub const RECORD_MAX_BYTES: usize = 1024 * 1024;
/// PutRecords takes at most 500 records.
pub const PUT_RECORDS_MAX: usize = 500;
/// PutRecords takes at most 5 MiB of data and partition keys in all.
pub const PUT_RECORDS_MAX_BYTES: usize = 5 * 1024 * 1024;
/// What a PutRecords call takes.
const PUT_RECORDS: CallLimits = CallLimits {
    entries: PUT_RECORDS_MAX,
    bytes: PUT_RECORDS_MAX_BYTES,
    entry_bytes: RECORD_MAX_BYTES,
};

/// One record of a PutRecords call, borrowed from the output it sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutEntry<'a> {
    /// The record's partition key (1 to 256 characters).
    pub partition_key: &'a str,
    /// The record's data.
    pub data: &'a [u8],
    /// A hash key that picks the shard in place of the partition key's hash.
    pub explicit_hash_key: Option<&'a str>,
}

/// What PutRecords did with one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// The record was written.
    Written {
        /// The shard it was written to.
        shard_id: String,
        /// Its sequence number in the shard.
        sequence_number: String,
    },
    /// The record was not written; others of the same call may have been.
    Failed {
        /// The entry's error code (`ProvisionedThroughputExceededException`, `InternalFailure`).
        code: String,
        /// The entry's error message.
        message: String,
    },
}

/// The Kinesis operation sinks need.
#[async_trait]
pub trait KinesisApi: Send + Sync {
    /// PutRecords: one outcome per entry, in order.
    async fn put_records(
        &self,
        stream: &str,
        entries: &[PutEntry<'_>],
    ) -> Result<Vec<PutOutcome>, SinkError>;
}

pub(crate) fn sink_error(class: ErrorClass) -> SinkError {
    match class {
        ErrorClass::Throttled(m) => SinkError::Throttled(m),
        ErrorClass::Unavailable(m) => SinkError::Unavailable(m),
        ErrorClass::ConditionFailed(m) | ErrorClass::Invalid(m) => SinkError::Rejected(m),
    }
}

/// `KinesisApi` on the AWS SDK.
#[derive(Clone, Debug)]
pub struct SdkKinesis {
    client: Client,
}

impl SdkKinesis {
    /// PutRecords through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// The client's configuration (region, endpoint).
    pub fn config(&self) -> &aws_sdk_kinesis::Config {
        self.client.config()
    }
}

#[async_trait]
impl KinesisApi for SdkKinesis {
    async fn put_records(
        &self,
        stream: &str,
        entries: &[PutEntry<'_>],
    ) -> Result<Vec<PutOutcome>, SinkError> {
        let records = entries
            .iter()
            .map(|e| {
                PutRecordsRequestEntry::builder()
                    .partition_key(e.partition_key)
                    .data(Blob::new(e.data))
                    .set_explicit_hash_key(e.explicit_hash_key.map(str::to_owned))
                    .build()
                    .map_err(|err| SinkError::Rejected(err.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let response = self
            .client
            .put_records()
            .stream_name(stream)
            .set_records(Some(records))
            .send()
            .await
            .map_err(|e| sink_error(classify(&e)))?;
        Ok(response
            .records()
            .iter()
            .map(
                |r| match (r.error_code(), r.sequence_number(), r.shard_id()) {
                    (None, Some(seq), Some(shard)) => PutOutcome::Written {
                        shard_id: shard.to_owned(),
                        sequence_number: seq.to_owned(),
                    },
                    (code, _, _) => PutOutcome::Failed {
                        code: code.unwrap_or("Unknown").to_owned(),
                        message: r.error_message().unwrap_or_default().to_owned(),
                    },
                },
            )
            .collect())
    }
}

/// The partition key to put an output under. Kinesis takes 1 to 256 characters; any other key is
/// replaced by its SHA-256, which keeps one key on one shard and in order.
fn partition_key(key: &str) -> std::borrow::Cow<'_, str> {
    if !is_partition_key(key) {
        std::borrow::Cow::Owned(sha256_hex(&[key.as_bytes()], 64))
    } else {
        std::borrow::Cow::Borrowed(key)
    }
}

/// Outputs to one Kinesis stream. Each output's partition key is the record's partition key.
pub struct KinesisSink<A: KinesisApi> {
    api: Arc<A>,
    stream: String,
    backoff: Backoff,
}

impl<A: KinesisApi> KinesisSink<A> {
    /// Outputs to the stream named `stream` through `api`, with the default backoff.
    pub fn new(api: Arc<A>, stream: impl Into<String>) -> Self {
        Self {
            api,
            stream: stream.into(),
            backoff: Backoff::default(),
        }
    }

    /// The same sink, retrying failed records with `backoff`.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    async fn put_records(
        &self,
        messages: &[Output],
        pending: Vec<usize>,
    ) -> Round<usize, SinkError> {
        let keys: Vec<_> = pending
            .iter()
            .map(|&i| partition_key(&messages[i].partition_key))
            .collect();
        let entries: Vec<PutEntry> = pending
            .iter()
            .zip(&keys)
            .map(|(&i, key)| PutEntry {
                partition_key: key,
                data: messages[i].body.as_bytes(),
                explicit_hash_key: None,
            })
            .collect();
        let mut round = Round::default();
        match self.api.put_records(&self.stream, &entries).await {
            Ok(outcomes) => {
                // A response that names fewer records than were put says nothing of the rest:
                // they are sent again, not taken as written.
                for &i in pending.iter().skip(outcomes.len()) {
                    let missing = "the response does not mention this record".to_owned();
                    round.retry.push((i, SinkError::Unavailable(missing)));
                }
                for (&i, outcome) in pending.iter().zip(outcomes) {
                    if let PutOutcome::Failed { code, message } = outcome {
                        let text = format!("{code}: {message}");
                        // A record's own errors (throughput, InternalFailure, KMS) are all
                        // passing per the API reference: retry each of them.
                        let err = match class_of(&code) {
                            CodeClass::Throttled => SinkError::Throttled(text),
                            _ => SinkError::Unavailable(text),
                        };
                        round.retry.push((i, err));
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
impl<A: KinesisApi> Sink for KinesisSink<A> {
    async fn send(&self, messages: &[Output], deadline: Deadline) -> Vec<(usize, SinkError)> {
        let sizes = messages
            .iter()
            .map(|m| m.body.len() + partition_key(&m.partition_key).len());
        let (calls, mut failed) = split_calls(sizes, PUT_RECORDS, |size| {
            format!("a Kinesis record holds at most 1 MiB of data and partition key; this one is {size} bytes")
        });
        // Calls go one after another so that a key's outputs keep their order.
        let sent = self.backoff.send_calls(calls, true, deadline, |pending| {
            self.put_records(messages, pending)
        });
        failed.extend(sent.await);
        failed.sort_by_key(|(i, _)| *i);
        failed
    }

    fn max_message_bytes(&self) -> usize {
        RECORD_MAX_BYTES - 256
    }

    fn order_of<'a>(&self, key: &'a str) -> std::borrow::Cow<'a, str> {
        partition_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Origin, OutputId, SequenceNumber};
    use std::time::Duration;

    /// Answers every PutRecords with the outcome of its first entry only, written.
    struct Short {
        calls: std::sync::Mutex<Vec<usize>>,
    }

    #[async_trait]
    impl KinesisApi for Short {
        async fn put_records(
            &self,
            _stream: &str,
            entries: &[PutEntry<'_>],
        ) -> Result<Vec<PutOutcome>, SinkError> {
            self.calls.lock().unwrap().push(entries.len());
            Ok(vec![PutOutcome::Written {
                shard_id: "shardId-000000000000".into(),
                sequence_number: "1".into(),
            }])
        }
    }

    /// `n` outputs to one partition key, the `i`th with body `i`.
    fn outputs(n: u32) -> Vec<Output> {
        (0..n)
            .map(|i| Output {
                id: OutputId::derive(
                    "op",
                    "out",
                    &Origin("s/shardId-0".into()),
                    &SequenceNumber::parse("1").unwrap(),
                    i,
                ),
                sink: "out".into(),
                partition_key: "k".into(),
                body: i.to_string(),
                settled: false,
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn records_a_response_does_not_mention_are_sent_again_and_never_taken_as_written() {
        let api = Arc::new(Short {
            calls: std::sync::Mutex::new(Vec::new()),
        });
        let sink = KinesisSink::new(api.clone(), "out");
        let failed = sink.send(&outputs(3), Deadline::NONE).await;
        // Each call writes its first record: 3 calls for 3 records.
        assert_eq!(*api.calls.lock().unwrap(), [3, 2, 1]);
        assert!(failed.is_empty(), "{failed:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_deadline_a_call_that_gets_some_through_is_retried_past_its_attempts_until_then()
    {
        let api = Arc::new(Short {
            calls: std::sync::Mutex::new(Vec::new()),
        });
        let sink = KinesisSink::new(api.clone(), "out").with_backoff(Backoff::default().seeded(5));
        let start = tokio::time::Instant::now();
        let failed = sink
            .send(&outputs(1_200), Deadline::after(Duration::from_secs(5)))
            .await;
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        // The first call of 500 writes a record a round, for more rounds than its 8 attempts.
        let calls = api.calls.lock().unwrap().clone();
        let rounds = calls.iter().take_while(|&&n| n > 0).zip((1..=500).rev());
        let rounds = rounds.take_while(|(n, left)| *n == left).count();
        assert!(rounds > 8, "{rounds} rounds of the first call: {calls:?}");
        assert!(failed
            .iter()
            .all(|(i, err)| *i >= rounds && err.is_retryable()));
        assert_eq!(
            failed.len(),
            1_200 - calls.len(),
            "a record written a round"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_deadline_a_send_makes_its_first_call_once_and_no_other() {
        let api = Arc::new(Short {
            calls: std::sync::Mutex::new(Vec::new()),
        });
        let sink = KinesisSink::new(api.clone(), "out");
        let failed = sink
            .send(&outputs(1_200), Deadline::after(Duration::ZERO))
            .await;
        assert_eq!(*api.calls.lock().unwrap(), [500]);
        let indexes: Vec<usize> = failed.iter().map(|(i, _)| *i).collect();
        assert_eq!(
            indexes,
            (1..1_200).collect::<Vec<_>>(),
            "the first record went"
        );
        for (i, err) in &failed {
            assert!(err.is_retryable());
            assert_eq!(
                matches!(err, SinkError::OutOfTime(_)),
                *i >= 500,
                "the later calls are not made: {i} {err}"
            );
        }
    }
}
