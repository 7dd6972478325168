//! In-memory Kinesis streams and SQS queues behind the narrow sink APIs, with the services'
//! request limits and optional per-entry failures drawn from a seeded generator.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::meter::Meter;
use crate::adapters::kinesis::{
    KinesisApi, PutEntry, PutOutcome, PUT_RECORDS_MAX, PUT_RECORDS_MAX_BYTES, RECORD_MAX_BYTES,
};
use crate::adapters::sqs::{SqsApi, SqsEntry, SqsOutcome, BATCH_MAX_BYTES, BATCH_MAX_ENTRIES};
use crate::domain::hash::{kinesis_hash_key, shard_for_hash};
use crate::ports::SinkError;

/// The probability that one entry of a call fails (as throttling or an internal error would).
#[derive(Clone, Debug, Default)]
pub struct EntryFaults {
    pub fail: f64,
    pub seed: u64,
}

struct Faults(Mutex<(EntryFaults, StdRng)>);

impl Faults {
    fn new(faults: EntryFaults) -> Self {
        let rng = StdRng::seed_from_u64(faults.seed);
        Self(Mutex::new((faults, rng)))
    }

    fn draw(&self) -> bool {
        let mut guard = self.0.lock().expect("faults lock");
        let p = guard.0.fail;
        p > 0.0 && guard.1.random_bool(p.min(1.0))
    }
}

/// A record as a stream stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    pub shard_id: String,
    pub sequence_number: String,
    pub partition_key: String,
    pub data: Vec<u8>,
}

struct Stream {
    shards: Vec<Vec<StoredRecord>>,
}

/// In-memory Kinesis: streams of N shards splitting the MD5 hash key space evenly.
pub struct MemoryKinesis {
    streams: Mutex<HashMap<String, Stream>>,
    next_sequence: Mutex<u128>,
    meter: Meter,
    faults: Faults,
}

impl Default for MemoryKinesis {
    fn default() -> Self {
        Self::new(EntryFaults::default())
    }
}

impl MemoryKinesis {
    pub fn new(faults: EntryFaults) -> Self {
        Self {
            streams: Mutex::new(HashMap::new()),
            next_sequence: Mutex::new(1),
            meter: Meter::default(),
            faults: Faults::new(faults),
        }
    }

    pub fn create_stream(&self, name: &str, shards: usize) {
        let stream = Stream {
            shards: (0..shards.max(1)).map(|_| Vec::new()).collect(),
        };
        self.streams
            .lock()
            .expect("streams lock")
            .insert(name.to_owned(), stream);
    }

    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Every record of `stream`, shard by shard, each shard in sequence order.
    pub fn records(&self, stream: &str) -> Vec<StoredRecord> {
        let streams = self.streams.lock().expect("streams lock");
        streams
            .get(stream)
            .map(|s| s.shards.iter().flatten().cloned().collect())
            .unwrap_or_default()
    }
}

#[async_trait]
impl KinesisApi for MemoryKinesis {
    async fn put_records(
        &self,
        stream: &str,
        entries: &[PutEntry],
    ) -> Result<Vec<PutOutcome>, SinkError> {
        let _busy = self.meter.busy();
        self.meter.call("PutRecords", 0.0, 0.0).await;
        let total: usize = entries
            .iter()
            .map(|e| e.data.len() + e.partition_key.len())
            .sum();
        if entries.is_empty() || entries.len() > PUT_RECORDS_MAX || total > PUT_RECORDS_MAX_BYTES {
            return Err(SinkError::Rejected(format!(
                "ValidationException: PutRecords takes 1-{PUT_RECORDS_MAX} records and at most 5 MiB; got {} records, {total} bytes",
                entries.len()
            )));
        }
        if let Some(bad) = entries.iter().find(|e| {
            e.partition_key.is_empty()
                || e.partition_key.chars().count() > 256
                || e.data.len() + e.partition_key.len() > RECORD_MAX_BYTES
        }) {
            return Err(SinkError::Rejected(format!(
                "ValidationException: a record with partition key of {} characters and {} bytes of data",
                bad.partition_key.chars().count(),
                bad.data.len()
            )));
        }
        let mut streams = self.streams.lock().expect("streams lock");
        let target = streams.get_mut(stream).ok_or_else(|| {
            SinkError::Rejected(format!(
                "ResourceNotFoundException: Stream {stream} not found"
            ))
        })?;
        let shard_count = target.shards.len() as u32;
        let mut next = self.next_sequence.lock().expect("sequence lock");
        let mut outcomes = Vec::with_capacity(entries.len());
        for entry in entries {
            if self.faults.draw() {
                outcomes.push(PutOutcome::Failed {
                    code: "ProvisionedThroughputExceededException".into(),
                    message: "Rate exceeded for shard".into(),
                });
                continue;
            }
            let hash = match entry.explicit_hash_key {
                Some(text) => text.parse::<u128>().map_err(|_| {
                    SinkError::Rejected(format!(
                        "ValidationException: ExplicitHashKey {text:?} is not a 128-bit decimal"
                    ))
                })?,
                None => kinesis_hash_key(entry.partition_key),
            };
            let shard = shard_for_hash(hash, shard_count) as usize;
            let sequence_number = format!("49{:054}", *next);
            *next += 1;
            let shard_id = format!("shardId-{shard:012}");
            target.shards[shard].push(StoredRecord {
                shard_id: shard_id.clone(),
                sequence_number: sequence_number.clone(),
                partition_key: entry.partition_key.to_owned(),
                data: entry.data.to_vec(),
            });
            outcomes.push(PutOutcome::Written {
                shard_id,
                sequence_number,
            });
        }
        Ok(outcomes)
    }
}

/// A message as a queue holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedMessage {
    pub message_id: String,
    pub body: String,
    pub output_id: String,
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
}

struct Queue {
    fifo: bool,
    messages: Vec<QueuedMessage>,
    /// FIFO deduplication ids and when they were first accepted.
    seen: HashMap<String, Instant>,
}

/// SQS FIFO drops a message whose deduplication id it accepted in the last five minutes.
pub const FIFO_DEDUPLICATION_WINDOW: Duration = Duration::from_secs(300);

/// In-memory SQS: standard and FIFO queues (by the `.fifo` suffix).
pub struct MemorySqs {
    queues: Mutex<BTreeMap<String, Queue>>,
    next_id: Mutex<u64>,
    meter: Meter,
    faults: Faults,
}

impl Default for MemorySqs {
    fn default() -> Self {
        Self::new(EntryFaults::default())
    }
}

impl MemorySqs {
    pub fn new(faults: EntryFaults) -> Self {
        Self {
            queues: Mutex::new(BTreeMap::new()),
            next_id: Mutex::new(0),
            meter: Meter::default(),
            faults: Faults::new(faults),
        }
    }

    /// Creates a queue and returns its URL.
    pub fn create_queue(&self, name: &str) -> String {
        let url = format!("https://sqs.memory.local/000000000000/{name}");
        let queue = Queue {
            fifo: name.ends_with(".fifo"),
            messages: Vec::new(),
            seen: HashMap::new(),
        };
        self.queues
            .lock()
            .expect("queues lock")
            .insert(url.clone(), queue);
        url
    }

    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Every message the queue accepted, in order.
    pub fn messages(&self, url: &str) -> Vec<QueuedMessage> {
        self.queues
            .lock()
            .expect("queues lock")
            .get(url)
            .map(|q| q.messages.clone())
            .unwrap_or_default()
    }
}

#[async_trait]
impl SqsApi for MemorySqs {
    async fn send_message_batch(
        &self,
        queue_url: &str,
        entries: &[SqsEntry],
    ) -> Result<Vec<SqsOutcome>, SinkError> {
        let _busy = self.meter.busy();
        self.meter.call("SendMessageBatch", 0.0, 0.0).await;
        if entries.is_empty() || entries.len() > BATCH_MAX_ENTRIES {
            return Err(SinkError::Rejected(format!(
                "TooManyEntriesInBatchRequest: {} entries",
                entries.len()
            )));
        }
        let total: usize = entries.iter().map(|e| e.body.len()).sum();
        if total > BATCH_MAX_BYTES {
            return Err(SinkError::Rejected(format!(
                "BatchRequestTooLong: {total} bytes"
            )));
        }
        let ids: HashSet<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        if ids.len() != entries.len() {
            return Err(SinkError::Rejected("BatchEntryIdsNotDistinct".into()));
        }
        let mut queues = self.queues.lock().expect("queues lock");
        let queue = queues.get_mut(queue_url).ok_or_else(|| {
            SinkError::Rejected(format!(
                "AWS.SimpleQueueService.NonExistentQueue: {queue_url}"
            ))
        })?;
        let now = Instant::now();
        queue
            .seen
            .retain(|_, at| now.duration_since(*at) < FIFO_DEDUPLICATION_WINDOW);
        let mut next_id = self.next_id.lock().expect("id lock");
        let mut outcomes = Vec::with_capacity(entries.len());
        for entry in entries {
            if queue.fifo && (entry.group_id.is_none() || entry.deduplication_id.is_none()) {
                outcomes.push(SqsOutcome::Failed {
                    code: "MissingParameter".into(),
                    message: "FIFO queues need MessageGroupId and MessageDeduplicationId".into(),
                    sender_fault: true,
                });
                continue;
            }
            if self.faults.draw() {
                outcomes.push(SqsOutcome::Failed {
                    code: "InternalError".into(),
                    message: "injected".into(),
                    sender_fault: false,
                });
                continue;
            }
            *next_id += 1;
            let message_id = next_id.to_string();
            let duplicate = queue.fifo
                && entry
                    .deduplication_id
                    .is_some_and(|d| queue.seen.contains_key(d));
            if !duplicate {
                if let Some(d) = entry.deduplication_id {
                    queue.seen.insert(d.to_owned(), now);
                }
                queue.messages.push(QueuedMessage {
                    message_id: message_id.clone(),
                    body: entry.body.to_owned(),
                    output_id: entry.output_id.to_owned(),
                    group_id: entry.group_id.map(str::to_owned),
                    deduplication_id: entry.deduplication_id.map(str::to_owned),
                });
            }
            // SQS answers a deduplicated message as sent.
            outcomes.push(SqsOutcome::Sent { message_id });
        }
        Ok(outcomes)
    }
}
