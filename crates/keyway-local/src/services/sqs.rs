//! In-memory SQS: standard and FIFO queues (FIFO by the `.fifo` suffix, as SQS names them), the
//! SendMessageBatch limits (10 entries, 1 MiB, the characters of XML in a body), and FIFO deduplication: a message whose
//! deduplication id was accepted in the last five minutes is answered as sent and dropped (with
//! ContentBasedDeduplication, the body's SHA-256 is its deduplication id).
//!
//! What a consumer meets, as the Lambda poller reads a queue (`receive_visible`): a received
//! message is invisible for the queue's visibility timeout and comes back unless deleted, its
//! receive count growing; past the redrive policy's maxReceiveCount it moves to the dead-letter
//! queue instead; a FIFO queue hands out no message of a group while another of that group is in
//! flight; a message older than the retention period is gone.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::faults::{Fault, Faults};
use super::meter::{sqs_requests, Meter};
use keyway::adapters::sqs::{
    SqsApi, SqsEntry, SqsOutcome, BATCH_MAX_BYTES, BATCH_MAX_ENTRIES, OUTPUT_ID_ATTRIBUTE,
};
use keyway::ports::{Clock, SinkError, SystemClock};

/// A message as a queue holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedMessage {
    /// The id SendMessageBatch answered with: the message's sequence number, as text.
    pub message_id: String,
    /// The message body, as sent.
    pub body: String,
    /// The `outputId` attribute, when the sender set one.
    pub output_id: Option<String>,
    /// MessageGroupId, on a FIFO queue.
    pub group_id: Option<String>,
    /// MessageDeduplicationId: the sender's, or the body's SHA-256 with ContentBasedDeduplication.
    pub deduplication_id: Option<String>,
}

/// SQS FIFO drops a message whose deduplication id it accepted in the last five minutes.
pub(crate) const FIFO_DEDUPLICATION_WINDOW_MILLIS: i64 = 5 * 60 * 1000;

/// A queue's attributes that change what a consumer meets, with SQS's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    /// How long a received message stays invisible (VisibilityTimeout, 30 s by default).
    pub visibility_timeout: Duration,
    /// RedrivePolicy: the dead-letter queue's URL and the receives a message gets before it
    /// moves there.
    pub redrive: Option<(String, u32)>,
    /// How long the queue keeps a message (MessageRetentionPeriod, 4 days by default).
    pub retention: Duration,
    /// ContentBasedDeduplication: a FIFO message sent without a deduplication id takes the
    /// SHA-256 of its body as one.
    pub content_based_deduplication: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            visibility_timeout: Duration::from_secs(30),
            redrive: None,
            retention: Duration::from_secs(4 * 24 * 3600),
            content_based_deduplication: false,
        }
    }
}

/// A message as a consumer receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The message received.
    pub message: QueuedMessage,
    /// Deletes the message while it is in flight from this receive.
    pub receipt_handle: String,
    /// How many times the message was received, this receive included
    /// (ApproximateReceiveCount).
    pub receive_count: u32,
    /// When the message was sent, in epoch milliseconds (SentTimestamp).
    pub sent_millis: i64,
    /// When the message was first received, in epoch milliseconds
    /// (ApproximateFirstReceiveTimestamp).
    pub first_receive_millis: i64,
    /// The queue's order of the message (a FIFO queue's sequence number).
    pub sequence: u64,
}

/// A message the queue holds, with what SQS keeps of it.
#[derive(Clone, Debug)]
struct Held {
    sequence: u64,
    message: QueuedMessage,
    sent_millis: i64,
    receive_count: u32,
    first_receive_millis: Option<i64>,
}

struct Queue {
    fifo: bool,
    config: QueueConfig,
    /// Every message accepted, in order.
    accepted: Vec<QueuedMessage>,
    /// Messages visible to a receive, in order.
    waiting: VecDeque<Held>,
    /// Messages received and not deleted, by sequence, with when they become visible again.
    in_flight: BTreeMap<u64, (Held, i64)>,
    /// FIFO deduplication ids and when they were accepted.
    seen: HashMap<String, i64>,
    /// The queue's KMS key is disabled: SQS refuses every send, retryably, until it is enabled.
    key_disabled: bool,
}

impl Queue {
    /// The deduplication id of `entry`: its own, or, with ContentBasedDeduplication on a FIFO
    /// queue, the body's SHA-256.
    fn deduplication_id<'a>(&self, entry: &SqsEntry<'a>) -> Option<std::borrow::Cow<'a, str>> {
        match entry.deduplication_id {
            None if self.fifo && self.config.content_based_deduplication => {
                Some(keyway::domain::hash::sha256_hex(&[entry.body.as_bytes()], 64).into())
            }
            given => given.map(Into::into),
        }
    }

    /// Takes `entry` as message `sequence`, unless a FIFO queue saw its deduplication id within
    /// the window; SQS answers a deduplicated message as sent.
    fn accept(
        &mut self,
        entry: &SqsEntry<'_>,
        deduplication_id: Option<&str>,
        sequence: u64,
        now: i64,
    ) -> SqsOutcome {
        let message_id = sequence.to_string();
        let duplicate = self.fifo && deduplication_id.is_some_and(|d| self.seen.contains_key(d));
        if !duplicate {
            if let Some(d) = deduplication_id {
                self.seen.insert(d.to_owned(), now);
            }
            let message = QueuedMessage {
                message_id: message_id.clone(),
                body: entry.body.to_owned(),
                output_id: entry.output_id.map(str::to_owned),
                group_id: entry.group_id.map(str::to_owned),
                deduplication_id: deduplication_id.map(str::to_owned),
            };
            self.waiting.push_back(Held {
                sequence,
                message: message.clone(),
                sent_millis: now,
                receive_count: 0,
                first_receive_millis: None,
            });
            self.accepted.push(message);
        }
        SqsOutcome::Sent { message_id }
    }

    /// Brings back the messages whose visibility timeout passed, and drops those past retention.
    fn refresh(&mut self, now: i64) {
        let back: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, (_, visible_at))| *visible_at <= now)
            .map(|(sequence, _)| *sequence)
            .collect();
        for sequence in &back {
            let (held, _) = self.in_flight.remove(sequence).expect("listed above");
            self.waiting.push_back(held);
        }
        if !back.is_empty() {
            self.waiting.make_contiguous().sort_by_key(|h| h.sequence);
        }
        let retention = self.config.retention.as_millis() as i64;
        self.waiting.retain(|h| now - h.sent_millis < retention);
    }

    /// The FIFO groups that have a message in flight: none of theirs is handed out meanwhile.
    fn busy_groups(&self) -> HashSet<String> {
        match self.fifo {
            true => self
                .in_flight
                .values()
                .filter_map(|(h, _)| h.message.group_id.clone())
                .collect(),
            false => HashSet::new(),
        }
    }
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
    /// No queues yet, on `clock` and injecting `faults`.
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
            config: QueueConfig::default(),
            accepted: Vec::new(),
            waiting: VecDeque::new(),
            in_flight: BTreeMap::new(),
            seen: HashMap::new(),
            key_disabled: false,
        };
        self.queues
            .lock()
            .expect("queues lock")
            .insert(url.clone(), queue);
        url
    }

    /// Disables (or enables again) the KMS key the queue at `url` is encrypted with, as its
    /// owner may: while it is disabled, every send to the queue fails with SQS's `KmsDisabled`,
    /// which a sender retries.
    pub fn set_key_disabled(&self, url: &str, disabled: bool) {
        if let Some(queue) = self.queues.lock().expect("queues lock").get_mut(url) {
            queue.key_disabled = disabled;
        }
    }

    /// The ARN of the queue at `url`.
    pub(crate) fn queue_arn(url: &str) -> String {
        let name = url.rsplit('/').next().unwrap_or(url);
        format!("arn:aws:sqs:us-east-1:000000000000:{name}")
    }

    /// The service's calls and billed requests so far.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// The faults this service injected so far.
    pub fn faults_fired(&self) -> super::faults::FaultCounts {
        self.faults.fired()
    }

    /// The chances each kind of fault had here (`Faults::drawn`).
    pub fn faults_drawn(&self) -> super::faults::FaultCounts {
        self.faults.drawn()
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
        queue.waiting.drain(..n).map(|h| h.message).collect()
    }

    /// Sets the queue's attributes (its template's VisibilityTimeout, RedrivePolicy...).
    pub(crate) fn configure(&self, url: &str, config: QueueConfig) {
        if let Some(queue) = self.queues.lock().expect("queues lock").get_mut(url) {
            queue.config = config;
        }
    }

    /// Whether the queue at `url` is a FIFO queue (false when there is none).
    pub fn is_fifo(&self, url: &str) -> bool {
        let queues = self.queues.lock().expect("queues lock");
        queues.get(url).is_some_and(|q| q.fifo)
    }

    /// The attributes of the queue at `url`, if it exists.
    pub fn config(&self, url: &str) -> Option<QueueConfig> {
        let queues = self.queues.lock().expect("queues lock");
        queues.get(url).map(|q| q.config.clone())
    }

    /// How many messages a receive at `now` could hand out.
    pub(crate) fn visible(&self, url: &str, now: i64) -> usize {
        let mut queues = self.queues.lock().expect("queues lock");
        let Some(queue) = queues.get_mut(url) else {
            return 0;
        };
        queue.refresh(now);
        let busy = queue.busy_groups();
        queue
            .waiting
            .iter()
            .filter(|h| {
                h.message
                    .group_id
                    .as_ref()
                    .is_none_or(|g| !busy.contains(g))
            })
            .count()
    }

    /// The messages the queue holds, visible or in flight.
    pub fn held(&self, url: &str) -> usize {
        let queues = self.queues.lock().expect("queues lock");
        queues
            .get(url)
            .map_or(0, |q| q.waiting.len() + q.in_flight.len())
    }

    /// When the first message in flight becomes visible again.
    pub(crate) fn next_visible_millis(&self, url: &str) -> Option<i64> {
        let queues = self.queues.lock().expect("queues lock");
        let queue = queues.get(url)?;
        queue.in_flight.values().map(|(_, at)| *at).min()
    }

    /// ReceiveMessage as Lambda's poller makes it: up to `max` visible messages of at most
    /// `max_bytes` of bodies together (one at least), each invisible for the visibility timeout.
    /// A message received as often as the redrive policy allows moves to the dead-letter queue.
    pub(crate) fn receive_visible(
        &self,
        url: &str,
        max: usize,
        max_bytes: usize,
        now: i64,
    ) -> Vec<Delivery> {
        let mut queues = self.queues.lock().expect("queues lock");
        let Some(queue) = queues.get_mut(url) else {
            return Vec::new();
        };
        queue.refresh(now);
        let busy = queue.busy_groups();
        let visibility = queue.config.visibility_timeout.as_millis() as i64;
        let (mut taken, mut kept, mut redriven) = (Vec::new(), VecDeque::new(), Vec::new());
        let (mut bytes, mut full) = (0, false);
        while let Some(mut held) = queue.waiting.pop_front() {
            let blocked = held
                .message
                .group_id
                .as_ref()
                .is_some_and(|g| busy.contains(g));
            // Once a message does not fit, none after it is taken: a later one of its group
            // would overtake it.
            full = full
                || taken.len() == max
                || (!taken.is_empty() && bytes + held.message.body.len() > max_bytes);
            if blocked || full {
                kept.push_back(held);
                continue;
            }
            if let Some((_, most)) = &queue.config.redrive {
                if held.receive_count >= *most {
                    redriven.push(held);
                    continue;
                }
            }
            held.receive_count += 1;
            let first = *held.first_receive_millis.get_or_insert(now);
            bytes += held.message.body.len();
            taken.push(Delivery {
                message: held.message.clone(),
                receipt_handle: format!("{}:{}", held.sequence, held.receive_count),
                receive_count: held.receive_count,
                sent_millis: held.sent_millis,
                first_receive_millis: first,
                sequence: held.sequence,
            });
            queue
                .in_flight
                .insert(held.sequence, (held, now + visibility));
        }
        queue.waiting = kept;
        let dead_letter = queue.config.redrive.as_ref().map(|(url, _)| url.clone());
        if let Some(dead_letter) = dead_letter.and_then(|d| queues.get_mut(&d)) {
            for mut held in redriven {
                // The message keeps its id and body; its receive count starts again.
                held.receive_count = 0;
                held.first_receive_millis = None;
                dead_letter.accepted.push(held.message.clone());
                dead_letter.waiting.push_back(held);
            }
        }
        taken
    }

    /// DeleteMessage: true when `receipt_handle` is of the message's latest receive and the
    /// message is still in flight from it.
    pub fn delete(&self, url: &str, receipt_handle: &str) -> bool {
        let mut queues = self.queues.lock().expect("queues lock");
        let Some(queue) = queues.get_mut(url) else {
            return false;
        };
        let Some((sequence, count)) = receipt_handle
            .split_once(':')
            .and_then(|(s, c)| Some((s.parse::<u64>().ok()?, c.parse::<u32>().ok()?)))
        else {
            return false;
        };
        match queue.in_flight.get(&sequence) {
            Some((held, _)) if held.receive_count == count => {
                queue.in_flight.remove(&sequence);
                true
            }
            _ => false,
        }
    }

    /// SendMessage of one entry, unmetered: what a test or a tool puts on a queue. The queue's
    /// faults apply, as to any sender.
    pub fn send_now(&self, url: &str, entry: &SqsEntry<'_>) -> Result<SqsOutcome, SinkError> {
        Ok(self.send(url, std::slice::from_ref(entry))?.remove(0))
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
        check_batch(entries)?;
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
        if queue.key_disabled {
            return Err(SinkError::Unavailable(format!(
                "KmsDisabled: the KMS key of {queue_url} is disabled"
            )));
        }
        queue
            .seen
            .retain(|_, at| now - *at < FIFO_DEDUPLICATION_WINDOW_MILLIS);
        let mut next_id = self.next_id.lock().expect("id lock");
        let outcomes = entries
            .iter()
            .map(|entry| {
                let deduplication_id = queue.deduplication_id(entry);
                if queue.fifo && (entry.group_id.is_none() || deduplication_id.is_none()) {
                    return SqsOutcome::Failed {
                        code: "MissingParameter".into(),
                        message: "FIFO queues need MessageGroupId and MessageDeduplicationId"
                            .into(),
                        sender_fault: true,
                    };
                }
                if let Some(c) = refused_character(entry.body) {
                    return SqsOutcome::Failed {
                        code: "InvalidMessageContents".into(),
                        message: format!(
                            "the message holds U+{:04X}, outside the characters SQS allows",
                            u32::from(c)
                        ),
                        sender_fault: true,
                    };
                }
                if self.faults.draw(Fault::PartialFailure) {
                    return SqsOutcome::Failed {
                        code: "InternalError".into(),
                        message: "injected".into(),
                        sender_fault: false,
                    };
                }
                *next_id += 1;
                queue.accept(entry, deduplication_id.as_deref(), *next_id, now)
            })
            .collect();
        Ok(outcomes)
    }
}

/// The first character of `body` SQS refuses: it takes XML's only. Outside them a Rust string
/// can hold only controls and U+FFFE/U+FFFF (which begin with the byte 0xEF): a body with
/// neither byte is not read character by character.
fn refused_character(body: &str) -> Option<char> {
    let allowed = |c: char| matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..);
    body.bytes()
        .any(|b| b < 0x20 || b == 0xEF)
        .then(|| body.chars().find(|&c| !allowed(c)))
        .flatten()
}

/// SendMessageBatch's own limits: 1 to 10 entries, `BATCH_MAX_BYTES` in all (message attributes
/// count), distinct entry ids.
fn check_batch(entries: &[SqsEntry<'_>]) -> Result<(), SinkError> {
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
    Ok(())
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
        let size = entries.iter().map(|e| e.body.len()).sum();
        self.meter
            .billed_call("SendMessageBatch", 0.0, 0.0, sqs_requests(size))
            .await;
        outcome
    }
}
