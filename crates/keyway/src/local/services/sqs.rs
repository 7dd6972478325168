//! In-memory SQS: standard and FIFO queues (FIFO by the `.fifo` suffix, as SQS names them), the
//! SendMessageBatch limits (10 entries, 256 KB), and FIFO deduplication: a message whose
//! deduplication id was accepted in the last five minutes is answered as sent and dropped.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::faults::{Fault, Faults};
use super::meter::Meter;
use crate::adapters::sqs::{
    SqsApi, SqsEntry, SqsOutcome, BATCH_MAX_BYTES, BATCH_MAX_ENTRIES, OUTPUT_ID_ATTRIBUTE,
};
use crate::ports::{Clock, SinkError, SystemClock};

/// A message as a queue holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedMessage {
    pub message_id: String,
    pub body: String,
    /// The `outputId` attribute, when the sender set one.
    pub output_id: Option<String>,
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
}

/// SQS FIFO drops a message whose deduplication id it accepted in the last five minutes.
pub const FIFO_DEDUPLICATION_WINDOW_MILLIS: i64 = 5 * 60 * 1000;

struct Queue {
    fifo: bool,
    /// Every message accepted, in order.
    accepted: Vec<QueuedMessage>,
    /// Messages not received yet.
    waiting: VecDeque<QueuedMessage>,
    /// FIFO deduplication ids and when they were accepted.
    seen: HashMap<String, i64>,
}

/// In-memory SQS queues.
pub struct LocalSqs {
    queues: Mutex<BTreeMap<String, Queue>>,
    next_id: Mutex<u64>,
    clock: Arc<dyn Clock>,
    meter: Meter,
    faults: Faults,
}

impl Default for LocalSqs {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock), Faults::none())
    }
}

impl LocalSqs {
    pub fn new(clock: Arc<dyn Clock>, faults: Faults) -> Self {
        Self {
            queues: Mutex::new(BTreeMap::new()),
            next_id: Mutex::new(0),
            clock,
            meter: Meter::default(),
            faults,
        }
    }

    /// The URL of the queue `name`, as AWS forms it: this prefix and the name.
    pub const URL_PREFIX: &'static str = "https://sqs.us-east-1.amazonaws.com/000000000000/";

    /// Creates a queue and returns its URL.
    pub fn create_queue(&self, name: &str) -> String {
        let url = format!("{}{name}", Self::URL_PREFIX);
        let queue = Queue {
            fifo: name.ends_with(".fifo"),
            accepted: Vec::new(),
            waiting: VecDeque::new(),
            seen: HashMap::new(),
        };
        self.queues
            .lock()
            .expect("queues lock")
            .insert(url.clone(), queue);
        url
    }

    /// The ARN of the queue at `url`.
    pub fn queue_arn(url: &str) -> String {
        let name = url.rsplit('/').next().unwrap_or(url);
        format!("arn:aws:sqs:us-east-1:000000000000:{name}")
    }

    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// The faults this service injected so far.
    pub fn faults_fired(&self) -> super::faults::FaultCounts {
        self.faults.fired()
    }

    /// Every message the queue accepted, in order, received or not.
    pub fn messages(&self, url: &str) -> Vec<QueuedMessage> {
        self.queues
            .lock()
            .expect("queues lock")
            .get(url)
            .map(|q| q.accepted.clone())
            .unwrap_or_default()
    }

    /// Receives (and deletes) up to `max` messages not received yet.
    pub fn receive(&self, url: &str, max: usize) -> Vec<QueuedMessage> {
        let mut queues = self.queues.lock().expect("queues lock");
        let Some(queue) = queues.get_mut(url) else {
            return Vec::new();
        };
        let n = max.min(queue.waiting.len());
        queue.waiting.drain(..n).collect()
    }

    /// SendMessage of one body, as Lambda sends to an on-failure destination.
    pub fn send_message(&self, url: &str, body: String) -> Result<String, SinkError> {
        let entry = SqsEntry {
            id: "0",
            body: &body,
            output_id: None,
            group_id: None,
            deduplication_id: None,
        };
        match self.send(url, std::slice::from_ref(&entry))?.remove(0) {
            SqsOutcome::Sent { message_id } => Ok(message_id),
            SqsOutcome::Failed { code, message, .. } => {
                Err(SinkError::Unavailable(format!("{code}: {message}")))
            }
        }
    }

    fn send(
        &self,
        queue_url: &str,
        entries: &[SqsEntry<'_>],
    ) -> Result<Vec<SqsOutcome>, SinkError> {
        if entries.is_empty() || entries.len() > BATCH_MAX_ENTRIES {
            return Err(SinkError::Rejected(format!(
                "AWS.SimpleQueueService.TooManyEntriesInBatchRequest: {} entries",
                entries.len()
            )));
        }
        // The batch limit counts message attributes: name, data type and value.
        let total: usize = entries
            .iter()
            .map(|e| {
                e.body.len()
                    + e.output_id.map_or(0, |id| {
                        OUTPUT_ID_ATTRIBUTE.len() + "String".len() + id.len()
                    })
            })
            .sum();
        if total > BATCH_MAX_BYTES {
            return Err(SinkError::Rejected(format!(
                "AWS.SimpleQueueService.BatchRequestTooLong: {total} bytes"
            )));
        }
        let ids: HashSet<&str> = entries.iter().map(|e| e.id).collect();
        if ids.len() != entries.len() {
            return Err(SinkError::Rejected(
                "AWS.SimpleQueueService.BatchEntryIdsNotDistinct".into(),
            ));
        }
        let now = self.clock.now_millis();
        if self.faults.in_outage(now) {
            return Err(SinkError::Unavailable(
                "ServiceUnavailable: the service is down".into(),
            ));
        }
        if self.faults.draw(Fault::Throttle) {
            return Err(SinkError::Throttled(
                "RequestThrottled: the request rate is too high".into(),
            ));
        }
        let mut queues = self.queues.lock().expect("queues lock");
        let queue = queues.get_mut(queue_url).ok_or_else(|| {
            SinkError::Rejected(format!(
                "AWS.SimpleQueueService.NonExistentQueue: {queue_url}"
            ))
        })?;
        queue
            .seen
            .retain(|_, at| now - *at < FIFO_DEDUPLICATION_WINDOW_MILLIS);
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
            if self.faults.draw(Fault::PartialFailure) {
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
                let message = QueuedMessage {
                    message_id: message_id.clone(),
                    body: entry.body.to_owned(),
                    output_id: entry.output_id.map(str::to_owned),
                    group_id: entry.group_id.map(str::to_owned),
                    deduplication_id: entry.deduplication_id.map(str::to_owned),
                };
                queue.waiting.push_back(message.clone());
                queue.accepted.push(message);
            }
            // SQS answers a deduplicated message as sent.
            outcomes.push(SqsOutcome::Sent { message_id });
        }
        Ok(outcomes)
    }
}

#[async_trait]
impl SqsApi for LocalSqs {
    async fn send_message_batch(
        &self,
        queue_url: &str,
        entries: &[SqsEntry<'_>],
    ) -> Result<Vec<SqsOutcome>, SinkError> {
        // Accounts the whole call, metering included (see `Meter::busy`).
        let _busy = self.meter.busy();
        let outcome = self.send(queue_url, entries);
        self.meter.call("SendMessageBatch", 0.0, 0.0).await;
        outcome
    }
}
