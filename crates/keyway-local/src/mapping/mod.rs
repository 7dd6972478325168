//! The event source mapping emulator: reads Kinesis shards and DynamoDB streams and invokes a
//! function with the batches Lambda would send, honouring the mapping's settings as the Lambda
//! Developer Guide describes them ("Lambda event source mappings", "Using Lambda with Kinesis
//! Data Streams", "Using Lambda with DynamoDB"):
//!
//! - BatchSize and MaximumBatchingWindowInSeconds: a batch goes when it is full, when its first
//!   record has waited the window, or when it reaches the 6 MB payload limit;
//! - StartingPosition: TRIM_HORIZON, LATEST or AT_TIMESTAMP;
//! - shard lineage: a shard is read only once every parent it took hash keys from is closed, read
//!   to its end and done with, so a key's records reach the function in order across a reshard
//!   ("Using Lambda with Kinesis Data Streams": Lambda processes a parent shard before its
//!   children; DynamoDB Streams' shards split and roll over the same way);
//! - ParallelizationFactor: each shard's records are spread over up to ten concurrent batches by
//!   partition key, so one key's records stay in order;
//! - ReportBatchItemFailures: the batch checkpoints before the lowest reported sequence number and
//!   the rest is retried; an empty or null identifier fails the whole batch;
//! - BisectBatchOnFunctionError: a failed batch is split in two and the halves retried apart,
//!   without using up retries;
//! - MaximumRetryAttempts and MaximumRecordAgeInSeconds: records past either are discarded and
//!   described to the OnFailure destination (an SQS queue) as Lambda describes them;
//! - FilterCriteria: a record that matches none of the filter patterns is never delivered and
//!   counts as done ("Lambda event filtering"; the patterns are `domain::pattern`'s);
//! - function errors and timeouts fail the batch.
//!
//! A function reached over Lambda's Runtime API (`keyway local`) gets each batch as the event's
//! JSON text, as Lambda sends it, and so does any handler that reads that text itself. The
//! runtime's stream handler in this process takes a Kinesis batch as the records themselves
//! (`Handler::handle_kinesis`), decoded to the records that JSON would have given: writing
//! megabytes of JSON and base64 for every batch and reading them back cost more than the
//! functions' work (`sources::kinesis::KinesisBatch` and its property test).

pub mod events;
pub mod queue;

use std::collections::VecDeque;
use std::future::Future as _;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use serde_json::{json, Value};

use super::services::dynamodb::{LocalTable, StreamRecord};
use super::services::faults::{Crash, Fault, Faults};
use super::services::kinesis::{LocalKinesis, StoredRecord};
use super::services::meter::{in_function, thread_cpu_time};
use super::services::shards::ShardInfo;
use super::services::sqs::LocalSqs;
use events::{dynamodb_event_json, DynamoDbEventRecord};
use keyway::domain::item::item_to_dynamodb_json;
use keyway::domain::Pattern;
use keyway::lambda::{FunctionError, Handler, Invocation};
use keyway::ports::Clock;
use keyway::sources::kinesis::KinesisBatch;

/// A DynamoDB stream keeps a record 24 hours.
pub(crate) const DYNAMODB_STREAM_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Lambda's limit on the payload of one invocation.
pub(crate) const PAYLOAD_MAX_BYTES: usize = 6 * 1024 * 1024;

/// How long a failed batch waits before its retry. Lambda retries stream batches promptly; a
/// pause keeps virtual time moving, so record ages grow and a run that only retries ends.
pub(crate) const RETRY_DELAY: Duration = Duration::from_millis(500);

/// Where a mapping starts reading a shard the first time it polls (StartingPosition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartingPosition {
    /// TRIM_HORIZON: the oldest record the shard still holds.
    TrimHorizon,
    /// LATEST: only records written after the mapping starts.
    Latest,
    /// AT_TIMESTAMP: the first record that arrived at or after the time, in epoch
    /// milliseconds.
    AtTimestamp(i64),
}

/// An event source mapping's settings, with Lambda's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct MappingSettings {
    /// BatchSize: the most records in one invocation, from 1 to 10,000 (100 by default, as
    /// for streams).
    pub batch_size: usize,
    /// MaximumBatchingWindowInSeconds: how long a batch's first record may wait for more
    /// (0 by default).
    pub maximum_batching_window: Duration,
    /// StartingPosition (TRIM_HORIZON by default).
    pub starting_position: StartingPosition,
    /// Whether the function reports failed records (`ReportBatchItemFailures` in
    /// FunctionResponseTypes) instead of failing the whole batch.
    pub report_batch_item_failures: bool,
    /// BisectBatchOnFunctionError: whether a failed batch is split in two and the halves
    /// retried apart.
    pub bisect_batch_on_function_error: bool,
    /// `None` retries until the records expire (Lambda's -1).
    pub maximum_retry_attempts: Option<u32>,
    /// `None` keeps records as long as the stream does (Lambda's -1).
    pub maximum_record_age: Option<Duration>,
    /// The SQS queue URL discarded batches are described to.
    pub on_failure: Option<String>,
    /// ParallelizationFactor: concurrent batches per shard, from 1 to 10 (1 by default).
    pub parallelization_factor: u32,
    /// The function's timeout.
    pub function_timeout: Duration,
    /// FilterCriteria: a record is delivered when any of these matches it; none delivers all.
    pub filters: Vec<Pattern>,
    /// A disabled mapping reads and invokes nothing until it is enabled, and then goes on from
    /// where it stopped (or from its starting position, if it never ran).
    pub enabled: bool,
}

impl Default for MappingSettings {
    fn default() -> Self {
        Self {
            batch_size: 100,
            maximum_batching_window: Duration::ZERO,
            starting_position: StartingPosition::TrimHorizon,
            report_batch_item_failures: false,
            bisect_batch_on_function_error: false,
            maximum_retry_attempts: None,
            maximum_record_age: None,
            on_failure: None,
            parallelization_factor: 1,
            function_timeout: Duration::from_secs(3),
            filters: Vec::new(),
            enabled: true,
        }
    }
}

/// Where a mapping reads from.
#[derive(Clone)]
pub enum MappingSource {
    /// A Kinesis data stream.
    Kinesis {
        /// The service that holds the stream.
        kinesis: Arc<LocalKinesis>,
        /// The stream's name.
        stream: String,
    },
    /// A DynamoDB table's stream.
    DynamoDb {
        /// The table whose stream is read.
        table: Arc<LocalTable>,
    },
}

impl MappingSource {
    /// Every shard of the source, open and closed, by number.
    fn shards(&self) -> Vec<ShardInfo> {
        match self {
            MappingSource::Kinesis { kinesis, stream } => kinesis.shards(stream),
            MappingSource::DynamoDb { table } => table.stream_shards(),
        }
    }

    /// The records of `shard` from `from` on, and the position after them.
    fn read(&self, shard: usize, from: usize) -> (Vec<Polled>, usize) {
        match self {
            MappingSource::Kinesis { kinesis, stream } => {
                let (records, next) = kinesis.read(stream, shard, from, usize::MAX);
                (records.into_iter().map(Polled::Kinesis).collect(), next)
            }
            MappingSource::DynamoDb { table } => {
                let (records, next) = table.stream_read(shard, from, usize::MAX);
                (records.into_iter().map(Polled::DynamoDb).collect(), next)
            }
        }
    }

    /// Where a mapping starting at `at` begins to read `shard`.
    fn start(&self, shard: &ShardInfo, number: usize, at: StartingPosition) -> usize {
        match (self, at) {
            (_, StartingPosition::TrimHorizon) => 0,
            (_, StartingPosition::Latest) => shard.len,
            (MappingSource::Kinesis { kinesis, stream }, StartingPosition::AtTimestamp(t)) => {
                kinesis.position_at(stream, number, t)
            }
            (MappingSource::DynamoDb { table }, StartingPosition::AtTimestamp(t)) => {
                table.stream_position_at(number, t)
            }
        }
    }

    /// The id of `shard`, as on-failure records name it.
    fn shard_id(&self, shard: usize) -> String {
        match self {
            MappingSource::Kinesis { kinesis, stream } => {
                kinesis.shard_id(stream, shard).unwrap_or_default()
            }
            MappingSource::DynamoDb { table } => table.stream_shard_id(shard),
        }
    }
}

/// What a mapping did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MappingStats {
    /// Invocations of the function, retries and duplicate deliveries included.
    pub invocations: u64,
    /// What the invocations spent.
    pub spent: Spent,
    /// Invocations that failed: an error returned, a timeout or a crash.
    pub function_errors: u64,
    /// Invocations stopped by the function's timeout (counted among the function errors too).
    pub timeouts: u64,
    /// Invocations whose runtime crashed (counted among the function errors too).
    pub crashes: u64,
    /// Invocations whose response reported some of the batch's records as failed.
    pub partial_failures: u64,
    /// Failed batches split in two (BisectBatchOnFunctionError).
    pub bisections: u64,
    /// Records in invoked batches, retries included.
    pub records_delivered: u64,
    /// Records checkpointed after an invocation that succeeded for them.
    pub records_done: u64,
    /// Records discarded for being older than MaximumRecordAgeInSeconds.
    pub discarded_for_age: u64,
    /// Records discarded once their batch used up MaximumRetryAttempts.
    pub discarded_for_retries: u64,
    /// Batches delivered a second time, as when Lambda loses an acknowledgement.
    pub duplicate_deliveries: u64,
    /// Records that matched none of the FilterCriteria patterns.
    pub filtered_out: u64,
}

/// A record read from the source, with when the poller saw it.
#[derive(Clone, Debug)]
enum Polled {
    Kinesis(Arc<StoredRecord>),
    DynamoDb(Arc<StreamRecord>),
}

impl Polled {
    fn sequence(&self) -> &str {
        match self {
            Polled::Kinesis(r) => &r.sequence_number,
            Polled::DynamoDb(r) => &r.sequence_number,
        }
    }

    fn arrival_millis(&self) -> i64 {
        match self {
            Polled::Kinesis(r) => r.arrival_millis,
            Polled::DynamoDb(r) => r.created_millis,
        }
    }

    /// What the record adds to an invocation's payload, roughly as Lambda counts it.
    fn size(&self) -> usize {
        match self {
            Polled::Kinesis(r) => r.data.len() * 4 / 3 + r.partition_key.len() + 400,
            Polled::DynamoDb(r) => {
                let image = |i: &Option<keyway::domain::Item>| {
                    i.as_ref().map_or(0, keyway::domain::item::item_size)
                };
                image(&r.old_image) + image(&r.new_image) + 400
            }
        }
    }

    /// The record as FilterCriteria patterns see it: a Kinesis record's metadata with its data
    /// as JSON (data that is not JSON stays base64 text, which no pattern of its fields
    /// matches); a DynamoDB change as its event record.
    fn filter_view(&self) -> Value {
        match self {
            Polled::Kinesis(r) => json!({
                "kinesisSchemaVersion": "1.0",
                "partitionKey": r.partition_key,
                "sequenceNumber": r.sequence_number,
                "approximateArrivalTimestamp": r.arrival_millis as f64 / 1000.0,
                "data": serde_json::from_slice::<Value>(&r.data).unwrap_or_else(|_| {
                    use base64::Engine as _;
                    Value::String(base64::engine::general_purpose::STANDARD.encode(&r.data))
                }),
            }),
            Polled::DynamoDb(r) => events::dynamodb_event(
                "arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/0",
                [event_record(r)],
            )["Records"][0]
                .take(),
        }
    }

    /// The key records are spread over concurrent batches by: any stable hash does.
    fn partition_hash(&self) -> u64 {
        match self {
            Polled::Kinesis(r) => xxhash_rust::xxh3::xxh3_64(r.partition_key.as_bytes()),
            Polled::DynamoDb(r) => {
                xxhash_rust::xxh3::xxh3_64(item_to_dynamodb_json(&r.keys).to_string().as_bytes())
            }
        }
    }
}

/// A stream record as a DynamoDB Streams event carries it.
fn event_record(r: &StreamRecord) -> DynamoDbEventRecord<'_> {
    DynamoDbEventRecord {
        kind: r.kind,
        keys: &r.keys,
        view: r.view,
        old_image: r.old_image.as_ref(),
        new_image: r.new_image.as_ref(),
        sequence_number: &r.sequence_number,
        created_secs: r.created_millis.div_euclid(1000),
        ttl_deletion: r.ttl_deletion,
    }
}

/// The batch at the head of a partition and what happened to it so far.
#[derive(Clone, Copy, Debug)]
struct Planned {
    size: usize,
    /// Retries so far (the first invocation is not a retry).
    retries: u32,
    /// Invocations so far, for the on-failure record.
    invocations: u32,
    /// Whether its last invocation ended in a function error (an error, a timeout, a crash),
    /// which the on-failure record reports as `functionError`.
    function_error: bool,
}

/// One of the concurrent batches of a shard.
struct Partition {
    shard: usize,
    queue: VecDeque<(Polled, i64)>,
    /// The batches in flight: the one at the front is invoked next; bisection adds its halves.
    plan: VecDeque<Planned>,
    /// A failed batch is retried no earlier than this.
    not_before: i64,
}

/// An event source mapping between a stream and a function.
pub struct EventSourceMapping {
    /// The mapping's name, which its invocations' request ids start with.
    pub name: String,
    /// The ARN of the function it invokes, as on-failure records give it.
    pub function_arn: String,
    handler: Arc<dyn Handler>,
    source: MappingSource,
    settings: MappingSettings,
    /// Read position per shard (by number); a shard that appears after the first poll is
    /// read from its start.
    positions: Vec<usize>,
    /// Whether the first poll placed the positions at the starting position.
    started: bool,
    partitions: Vec<Partition>,
    sqs: Arc<LocalSqs>,
    clock: Arc<dyn Clock>,
    faults: Arc<Faults>,
    stats: MappingStats,
}

/// How an invocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failed {
    /// The function returned an error.
    Error,
    /// Stopped by the function's timeout.
    TimedOut,
    /// The runtime process died (`services::faults::crash`).
    Crashed,
}

/// What an invocation hands a function.
#[derive(Clone)]
pub(crate) enum Event {
    /// The event's JSON text, as Lambda sends it.
    Json(String),
    /// A Kinesis batch, handed over in memory (`Handler::handle_kinesis`).
    Kinesis(KinesisBatch),
}

/// Invokes `handler`, as Lambda would: stopped at `timeout`, and a runtime that crashes is a
/// failed invocation, not the end of the mapping. Also returns what the invocation spent.
pub(crate) async fn invoke(
    handler: &dyn Handler,
    event: &Event,
    invocation: &Invocation,
    timeout: Duration,
) -> (Result<Value, Failed>, Spent) {
    let call = match event {
        Event::Json(text) => handler.handle(text, invocation),
        Event::Kinesis(batch) => handler.handle_kinesis(batch, invocation),
    };
    let call = std::panic::AssertUnwindSafe(call).catch_unwind();
    let mut call = std::pin::pin!(in_function(call));
    let mut cpu = Duration::ZERO;
    let on_cpu = std::future::poll_fn(|cx| {
        let start = thread_cpu_time();
        let poll = call.as_mut().poll(cx);
        cpu += thread_cpu_time().saturating_sub(start);
        poll
    });
    let start = tokio::time::Instant::now();
    let outcome = tokio::time::timeout(timeout, on_cpu).await;
    let spent = Spent {
        invocations: 1,
        waited: start.elapsed(),
        cpu,
    };
    let result = match outcome {
        // Lambda reads the response as JSON, whatever wrote it, malformed ones included.
        Ok(Ok(result)) => result
            .map(|response| response.to_json())
            .map_err(|_: FunctionError| Failed::Error),
        Ok(Err(payload)) if payload.is::<Crash>() => Err(Failed::Crashed),
        // A panic that is not an injected crash is a bug: let it fail the run.
        Ok(Err(payload)) => std::panic::resume_unwind(payload),
        Err(_) => Err(Failed::TimedOut),
    };
    (result, spent)
}

/// What invocations spent, for a cost report: on the paused clock the embedded runtime runs on,
/// time passes only while a call waits the services' simulated latency (see
/// `LocalServices::set_function_latency`) or the function sleeps, so `waited` is what the
/// invocations would wait on AWS; `cpu` is the CPU time of their own work on this thread, the
/// in-memory services' work among it (standing in for the SDK's work of making the requests).
#[derive(Clone, Copy, Debug, Default)]
pub struct Spent {
    /// How many invocations.
    pub invocations: u64,
    /// The virtual time they took, as on AWS.
    pub waited: Duration,
    /// The CPU time of their work on this machine.
    pub cpu: Duration,
}

/// Two runs that did the same spent the same: the CPU time is a measurement of this machine,
/// which differs between two runs of one seed, and is left out.
impl PartialEq for Spent {
    fn eq(&self, other: &Self) -> bool {
        (self.invocations, self.waited) == (other.invocations, other.waited)
    }
}

impl Eq for Spent {}

impl std::ops::AddAssign for Spent {
    fn add_assign(&mut self, other: Spent) {
        self.invocations += other.invocations;
        self.waited += other.waited;
        self.cpu += other.cpu;
    }
}

/// What one invocation came to.
enum Outcome {
    Success,
    /// The records before this index succeeded.
    Partial(usize),
    /// The batch failed: by a function error, or by a malformed partial batch response.
    Failure {
        function_error: bool,
    },
}

impl EventSourceMapping {
    /// A mapping from `source` to `handler`, its batch size and parallelization factor brought
    /// within Lambda's limits; it reads nothing until it is polled.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: impl Into<String>,
        function_arn: impl Into<String>,
        handler: Arc<dyn Handler>,
        source: MappingSource,
        settings: MappingSettings,
        sqs: Arc<LocalSqs>,
        clock: Arc<dyn Clock>,
        faults: Arc<Faults>,
    ) -> Self {
        let settings = MappingSettings {
            parallelization_factor: settings.parallelization_factor.clamp(1, 10),
            batch_size: settings.batch_size.clamp(1, 10_000),
            ..settings
        };
        Self {
            name: name.into(),
            function_arn: function_arn.into(),
            handler,
            source,
            settings,
            positions: Vec::new(),
            started: false,
            partitions: Vec::new(),
            sqs,
            clock,
            faults,
            stats: MappingStats::default(),
        }
    }

    /// What the mapping did so far.
    pub fn stats(&self) -> &MappingStats {
        &self.stats
    }

    /// The mapping's settings, within Lambda's limits.
    pub fn settings(&self) -> &MappingSettings {
        &self.settings
    }

    /// Enables or disables the mapping, as UpdateEventSourceMapping's `Enabled` does.
    pub fn set_enabled(&mut self, enabled: bool) {
        self.settings.enabled = enabled;
    }

    /// The mapping's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads what the shards hold beyond the positions, into the partitions; a shard only once
    /// its parents are done.
    pub fn poll(&mut self) {
        if !self.settings.enabled {
            return;
        }
        let shards = self.source.shards();
        if !self.started {
            let at = self.settings.starting_position;
            self.positions = shards
                .iter()
                .enumerate()
                .map(|(number, shard)| self.source.start(shard, number, at))
                .collect();
            self.started = true;
        }
        self.positions.resize(shards.len(), 0);
        let factor = self.settings.parallelization_factor as usize;
        while self.partitions.len() < shards.len() * factor {
            self.partitions.push(Partition {
                shard: self.partitions.len() / factor,
                queue: VecDeque::new(),
                plan: VecDeque::new(),
                not_before: i64::MIN,
            });
        }
        let now = self.clock.now_millis();
        for (number, shard) in shards.iter().enumerate() {
            // A closed shard read to its end has nothing more; a shard waits for its parents.
            let read_out = !shard.open && self.positions[number] >= shard.len;
            if read_out || !shard.parents.iter().all(|&p| self.done_with(p, &shards[p])) {
                continue;
            }
            let (fresh, next) = self.source.read(number, self.positions[number]);
            self.positions[number] = next;
            self.enqueue(number, fresh, now);
        }
    }

    /// Whether `shard` is closed, read to its end, and none of its records waits.
    fn done_with(&self, number: usize, shard: &ShardInfo) -> bool {
        let factor = self.settings.parallelization_factor as usize;
        !shard.open
            && self.positions[number] >= shard.len
            && self.partitions[number * factor..(number + 1) * factor]
                .iter()
                .all(|p| p.queue.is_empty())
    }

    /// Puts a shard's fresh records into its partitions, less those no filter pattern matches.
    fn enqueue(&mut self, shard: usize, fresh: Vec<Polled>, now: i64) {
        let factor = u64::from(self.settings.parallelization_factor);
        let before = fresh.len();
        let fresh: Vec<Polled> = if self.settings.filters.is_empty() {
            fresh
        } else {
            fresh
                .into_iter()
                .filter(|r| {
                    let view = r.filter_view();
                    self.settings.filters.iter().any(|p| p.matches(&view))
                })
                .collect()
        };
        self.stats.filtered_out += (before - fresh.len()) as u64;
        for record in fresh {
            let lane = if factor == 1 {
                0
            } else {
                (record.partition_hash() % factor) as usize
            };
            self.partitions[shard * factor as usize + lane]
                .queue
                .push_back((record, now));
        }
    }

    /// Whether any record waits, and the earliest time a waiting batch becomes due.
    pub fn pending(&self) -> (usize, Option<i64>) {
        if !self.settings.enabled {
            return (0, None);
        }
        let waiting = self.partitions.iter().map(|p| p.queue.len()).sum();
        let due = self.partitions.iter().filter_map(|p| self.due_at(p)).min();
        (waiting, due)
    }

    /// When the partition's next batch is due: now when one is planned or full, else when its
    /// first record has waited the batching window.
    fn due_at(&self, partition: &Partition) -> Option<i64> {
        let (_, first_polled) = partition.queue.front()?;
        if !partition.plan.is_empty() {
            return Some(partition.not_before);
        }
        if partition.queue.len() >= self.settings.batch_size {
            return Some(i64::MIN);
        }
        Some(first_polled + self.settings.maximum_batching_window.as_millis() as i64)
    }

    /// Invokes every partition whose batch is due, all at once; returns how many invocations ran.
    pub async fn step(&mut self) -> usize {
        if !self.settings.enabled {
            return 0;
        }
        let now = self.clock.now_millis();
        let mut due: Vec<usize> = Vec::new();
        for i in 0..self.partitions.len() {
            self.discard_expired(i, now);
            let partition = &self.partitions[i];
            if self.due_at(partition).is_some_and(|t| t <= now) {
                due.push(i);
            }
        }
        let mut invocations = Vec::new();
        for &i in &due {
            let batch = self.next_batch(i);
            invocations.push((i, batch));
        }
        let handler = self.handler.clone();
        let deadline = now + self.settings.function_timeout.as_millis() as i64;
        let calls = invocations.iter().map(|(i, batch)| {
            let event = self.event(batch);
            let invocation = Invocation {
                request_id: format!("{}-{i}-{}", self.name, self.stats.invocations),
                deadline_millis: Some(deadline),
            };
            let timeout = if self.faults.draw(Fault::Timeout) {
                // Stopped somewhere in the middle, wherever it is by then.
                Duration::from_micros(self.faults.pick(4_000))
            } else {
                self.settings.function_timeout
            };
            let duplicate = self
                .faults
                .draw(Fault::DuplicateDelivery)
                .then(|| event.clone());
            let handler = handler.clone();
            async move {
                let (result, mut spent) =
                    invoke(handler.as_ref(), &event, &invocation, timeout).await;
                if let (Ok(_), Some(again)) = (&result, duplicate) {
                    // The same batch once more, as a lost acknowledgement makes Lambda do.
                    let (_, again) = invoke(handler.as_ref(), &again, &invocation, timeout).await;
                    spent += again;
                    return (result, spent, true);
                }
                (result, spent, false)
            }
        });
        let results = futures::future::join_all(calls).await;
        let count = invocations.len();
        for ((i, batch), (result, spent, duplicated)) in invocations.into_iter().zip(results) {
            self.stats.invocations += 1 + u64::from(duplicated);
            self.stats.spent += spent;
            self.stats.duplicate_deliveries += u64::from(duplicated);
            self.stats.records_delivered += batch.len() as u64;
            let outcome = self.classify(&batch, result);
            self.apply(i, batch.len(), outcome);
            self.partitions[i].not_before =
                self.clock.now_millis() + RETRY_DELAY.as_millis() as i64;
        }
        count
    }

    /// The records of the partition's next batch (planned, or newly formed and planned).
    fn next_batch(&mut self, i: usize) -> Vec<Polled> {
        let batch_size = self.settings.batch_size;
        let partition = &mut self.partitions[i];
        if partition.plan.is_empty() {
            let mut size = 0;
            let mut bytes = 0;
            for (record, _) in partition.queue.iter().take(batch_size) {
                if size > 0 && bytes + record.size() > PAYLOAD_MAX_BYTES {
                    break;
                }
                bytes += record.size();
                size += 1;
            }
            partition.plan.push_back(Planned {
                size,
                retries: 0,
                invocations: 0,
                function_error: false,
            });
        }
        let planned = partition.plan.front_mut().expect("planned above");
        planned.invocations += 1;
        partition
            .queue
            .iter()
            .take(planned.size)
            .map(|(r, _)| r.clone())
            .collect()
    }

    fn event(&self, batch: &[Polled]) -> Event {
        match &self.source {
            MappingSource::Kinesis { kinesis, stream } => Event::Kinesis(KinesisBatch {
                stream_arn: kinesis.stream_arn(stream).unwrap_or_default().into(),
                records: batch
                    .iter()
                    .filter_map(|r| match r {
                        Polled::Kinesis(r) => Some(r.clone()),
                        Polled::DynamoDb(_) => None,
                    })
                    .collect(),
            }),
            MappingSource::DynamoDb { table } => Event::Json(dynamodb_event_json(
                &table.stream_arn(),
                batch.iter().filter_map(|r| match r {
                    Polled::DynamoDb(r) => Some(event_record(r)),
                    Polled::Kinesis(_) => None,
                }),
            )),
        }
    }

    fn classify(&mut self, batch: &[Polled], result: Result<Value, Failed>) -> Outcome {
        let response = match result {
            Ok(response) => response,
            Err(failed) => {
                self.stats.function_errors += 1;
                self.stats.timeouts += u64::from(failed == Failed::TimedOut);
                self.stats.crashes += u64::from(failed == Failed::Crashed);
                return Outcome::Failure {
                    function_error: true,
                };
            }
        };
        if !self.settings.report_batch_item_failures {
            return Outcome::Success;
        }
        // Lambda Developer Guide, "Configuring partial batch response": an empty or null list, or
        // an empty or null response, is a success; an empty or null identifier, or one under a
        // wrong key, fails the whole batch.
        let failures = match response.get("batchItemFailures") {
            None | Some(Value::Null) => return Outcome::Success,
            Some(Value::Array(items)) => items,
            Some(_) => {
                return Outcome::Failure {
                    function_error: false,
                }
            }
        };
        let mut lowest: Option<usize> = None;
        for item in failures {
            let Some(id) = item
                .get("itemIdentifier")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            else {
                return Outcome::Failure {
                    function_error: false,
                };
            };
            // An identifier that names no record of the batch is treated as failing it all.
            let Some(index) = batch.iter().position(|r| r.sequence() == id) else {
                return Outcome::Failure {
                    function_error: false,
                };
            };
            lowest = Some(lowest.map_or(index, |l| l.min(index)));
        }
        match lowest {
            None => Outcome::Success,
            Some(index) => {
                self.stats.partial_failures += 1;
                Outcome::Partial(index)
            }
        }
    }

    fn apply(&mut self, i: usize, size: usize, outcome: Outcome) {
        let bisect = self.settings.bisect_batch_on_function_error;
        let partition = &mut self.partitions[i];
        let mut planned = *partition.plan.front().expect("an invoked batch is planned");
        planned.function_error = matches!(
            outcome,
            Outcome::Failure {
                function_error: true
            }
        );
        match outcome {
            Outcome::Success => {
                partition.queue.drain(..size);
                partition.plan.pop_front();
                self.stats.records_done += size as u64;
            }
            Outcome::Partial(done) => {
                partition.queue.drain(..done);
                self.stats.records_done += done as u64;
                let rest = Planned {
                    size: size - done,
                    retries: planned.retries + 1,
                    ..planned
                };
                *partition.plan.front_mut().expect("planned") = rest;
            }
            Outcome::Failure { .. } if bisect && size > 1 => {
                // Splitting does not use up retries.
                self.stats.bisections += 1;
                partition.plan.pop_front();
                let first = Planned {
                    size: size / 2,
                    ..planned
                };
                let second = Planned {
                    size: size - size / 2,
                    ..planned
                };
                partition.plan.push_front(second);
                partition.plan.push_front(first);
            }
            Outcome::Failure { .. } => {
                let front = partition.plan.front_mut().expect("planned");
                front.retries += 1;
                front.function_error = planned.function_error;
            }
        }
        let exhausted = partition.plan.front().is_some_and(|p| {
            self.settings
                .maximum_retry_attempts
                .is_some_and(|max| p.retries > max)
        });
        if exhausted {
            let planned = partition.plan.pop_front().expect("checked above");
            let discarded: Vec<Polled> = partition
                .queue
                .drain(..planned.size)
                .map(|(r, _)| r)
                .collect();
            self.stats.discarded_for_retries += discarded.len() as u64;
            self.describe_discarded(i, &discarded, "RetryAttemptsExhausted", planned);
        }
    }

    /// How long after its arrival a record can still be delivered: the stream's retention (a
    /// DynamoDB stream keeps records 24 hours), or MaximumRecordAgeInSeconds if shorter.
    fn max_age(&self) -> Duration {
        let retention = match &self.source {
            MappingSource::Kinesis { kinesis, stream } => kinesis.retention(stream),
            MappingSource::DynamoDb { .. } => DYNAMODB_STREAM_RETENTION,
        };
        self.settings
            .maximum_record_age
            .map_or(retention, |age| age.min(retention))
    }

    /// Discards the records at the head of the partition older than the maximum record age, or
    /// gone from the stream with its retention.
    fn discard_expired(&mut self, i: usize, now: i64) {
        let max_age = self.max_age().as_millis() as i64;
        let partition = &mut self.partitions[i];
        let expired = partition
            .queue
            .iter()
            .take_while(|(r, _)| now - r.arrival_millis() > max_age)
            .count();
        if expired == 0 {
            return;
        }
        let discarded: Vec<Polled> = partition.queue.drain(..expired).map(|(r, _)| r).collect();
        // The batch in flight loses those records; a batch left empty is gone.
        let mut left = expired;
        // What the on-failure record tells of the invocations the records were in.
        let mut last = Planned {
            size: expired,
            retries: 0,
            invocations: 0,
            function_error: false,
        };
        while left > 0 {
            let Some(front) = partition.plan.front_mut() else {
                break;
            };
            if front.invocations >= last.invocations {
                last.invocations = front.invocations;
                last.function_error = front.function_error;
            }
            if front.size <= left {
                left -= front.size;
                partition.plan.pop_front();
            } else {
                front.size -= left;
                left = 0;
            }
        }
        self.stats.discarded_for_age += discarded.len() as u64;
        self.describe_discarded(i, &discarded, "RecordAgeExceeded", last);
    }

    /// Sends the on-failure record for discarded records, in the shape Lambda sends it (the
    /// Developer Guide's example records): `functionError` when the batch's last invocation ended
    /// in one, none after a partial batch response or before any invocation.
    fn describe_discarded(&self, i: usize, records: &[Polled], condition: &str, batch: Planned) {
        let (Some(destination), Some(first), Some(last)) =
            (&self.settings.on_failure, records.first(), records.last())
        else {
            return;
        };
        let iso = |millis: i64| {
            chrono::DateTime::from_timestamp_millis(millis)
                .unwrap_or_default()
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        };
        let shard = self.partitions[i].shard;
        let shard_id = self.source.shard_id(shard);
        let (info_key, stream_arn) = match &self.source {
            MappingSource::Kinesis { kinesis, stream } => (
                "KinesisBatchInfo",
                kinesis.stream_arn(stream).unwrap_or_default(),
            ),
            MappingSource::DynamoDb { table } => ("DDBStreamBatchInfo", table.stream_arn()),
        };
        let now = self.clock.now_millis();
        let mut body = json!({
            "requestContext": {
                "requestId": format!("{}-{}-{}", self.name, shard, first.sequence()),
                "functionArn": self.function_arn,
                "condition": condition,
                "approximateInvokeCount": batch.invocations,
            },
            "responseContext": {
                "statusCode": 200,
                "executedVersion": "$LATEST",
            },
            "version": "1.0",
            "timestamp": iso(now),
        });
        if batch.function_error {
            body["responseContext"]["functionError"] = json!("Unhandled");
        }
        body[info_key] = json!({
            "shardId": shard_id,
            "startSequenceNumber": first.sequence(),
            "endSequenceNumber": last.sequence(),
            "approximateArrivalOfFirstRecord": iso(first.arrival_millis()),
            "approximateArrivalOfLastRecord": iso(last.arrival_millis()),
            "batchSize": records.len(),
            "streamArn": stream_arn,
        });
        if let Err(err) = self.sqs.send_message(destination, body.to_string()) {
            tracing::warn!(mapping = %self.name, error = %err, "on-failure record not delivered");
        }
    }
}
