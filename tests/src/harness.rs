//! An in-memory world for executor tests: a state table, SQS queues for outputs and dead letters,
//! Kinesis-shaped batches, and Lambda's redelivery rule.

use std::collections::BTreeMap;
use std::sync::Arc;

use keyway::adapters::dynamodb::DynamoStateStore;
use keyway::adapters::sqs::SqsSink;
use keyway::domain::{DeadLetter, SequenceNumber};
use keyway::executor::SIGNATURE_HISTORY;
use keyway::ports::{ManualClock, Sink, StateStore};
use keyway::sources::kinesis::decode_event;
use keyway::{BatchReport, Executor, KeyedOperator, Sinks};
use keyway_local::mapping::events::{kinesis_event, KinesisEventRecord};
use keyway_local::{LocalSqs, LocalTable, QueuedMessage};
use serde_json::Value;

/// A state table with its store, a queue for each sink and one for dead letters, and a clock
/// that moves only when a test moves it: what executors run against.
pub struct World {
    /// The state table, to read operators' items from.
    pub table: Arc<LocalTable>,
    /// The state store on the table, on the world's clock.
    pub store: Arc<DynamoStateStore<LocalTable>>,
    /// The SQS that holds the sinks' queues and the dead-letter queue.
    pub sqs: Arc<LocalSqs>,
    /// The clock of the store and the executors: 2026-01-01 until a test moves it.
    pub clock: Arc<ManualClock>,
    /// The dead-letter queue's URL.
    pub dead_letter_url: String,
    /// Sink name to queue URL.
    pub queues: BTreeMap<String, String>,
}

impl World {
    /// A world whose operators emit to the named sinks (one standard queue each).
    pub fn new(sinks: &[&str]) -> Self {
        let table = Arc::new(LocalTable::new());
        let clock = ManualClock::at(1_767_225_600_000);
        let store = Arc::new(DynamoStateStore::new(table.clone(), clock.clone()));
        let sqs = Arc::new(LocalSqs::default());
        let dead_letter_url = sqs.create_queue("dead-letter");
        let queues = sinks
            .iter()
            .map(|s| (s.to_string(), sqs.create_queue(s)))
            .collect();
        Self {
            table,
            store,
            sqs,
            clock,
            dead_letter_url,
            queues,
        }
    }

    /// Every queue of the world, wired as a sink of its name, and the dead-letter queue.
    pub fn sinks(&self) -> Sinks {
        self.sinks_named(self.queues.keys().map(String::as_str))
    }

    /// The queues of `names`, wired as sinks of their names, and the dead-letter queue.
    pub fn sinks_named<'a>(&self, names: impl Iterator<Item = &'a str>) -> Sinks {
        let mut sinks = Sinks::new(Arc::new(SqsSink::new(
            self.sqs.clone(),
            &self.dead_letter_url,
        )));
        for name in names {
            let Some(url) = self.queues.get(name) else {
                continue;
            };
            sinks = sinks.with_name(
                name,
                Arc::new(SqsSink::new(self.sqs.clone(), url)) as Arc<dyn Sink>,
            );
        }
        sinks
    }

    /// An executor of `operator` on the world's store, with the queues of the sinks it declares;
    /// panics when the world has no queue for one.
    pub fn executor<O: KeyedOperator>(&self, operator: O) -> Executor<O> {
        self.executor_on(operator, self.store.clone())
    }

    /// As `executor`, on `store` rather than the world's (a store wrapped to race or fail).
    pub fn executor_on<O: KeyedOperator>(
        &self,
        operator: O,
        store: Arc<dyn StateStore>,
    ) -> Executor<O> {
        // Operators that share a world declare different sinks: each gets those it declares.
        let declared = operator.sinks();
        let sinks = self.sinks_named(declared.iter().map(|s| s.name));
        Executor::new(operator, store, sinks, self.clock.clone())
            .expect("the world has a queue for every sink the operator declares")
    }

    /// Items of operators' state, leaving out their signature histories.
    pub fn state_items(&self) -> usize {
        self.table
            .items()
            .iter()
            .filter(|i| {
                !i["pk"]
                    .as_s()
                    .is_some_and(|pk| pk.contains(&format!("#{SIGNATURE_HISTORY}#")))
            })
            .count()
    }

    /// The size of the largest item of the table, in DynamoDB's reckoning.
    pub fn largest_item(&self) -> usize {
        self.table
            .items()
            .iter()
            .map(keyway::domain::item::item_size)
            .max()
            .unwrap_or(0)
    }

    /// Every message the queue of `sink` accepted, in order, received or not.
    pub fn outputs(&self, sink: &str) -> Vec<QueuedMessage> {
        self.sqs.messages(&self.queues[sink])
    }

    /// Every dead letter the dead-letter queue accepted, in order.
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        self.sqs
            .messages(&self.dead_letter_url)
            .iter()
            .map(|m| serde_json::from_str(&m.body).expect("dead letters are JSON"))
            .collect()
    }
}

/// One shard of a Kinesis stream that hands out batches with growing sequence numbers.
pub struct Shard {
    /// The stream's name, which its ARN ends with.
    pub stream: String,
    /// The shard's id, as Kinesis writes it (`shardId-000000000000`).
    pub shard_id: String,
    next: u64,
    /// When the records of the next batches arrived (epoch milliseconds).
    pub arrival_millis: i64,
}

impl Shard {
    /// Shard number `shard` of `stream`, its records arriving at 2026-01-01 until a test says
    /// otherwise.
    pub fn new(stream: &str, shard: u32) -> Self {
        Self {
            stream: stream.into(),
            shard_id: format!("shardId-{shard:012}"),
            next: 1000,
            arrival_millis: 1_767_225_600_000,
        }
    }

    /// The shard of a stream deleted and created again: numbers start over.
    pub fn recreated(&self) -> Self {
        Self {
            next: 1000,
            ..Self::new(&self.stream, 0)
        }
    }

    /// A Lambda Kinesis event of `records` (partition key, data), in order.
    pub fn batch(&mut self, records: &[(&str, Vec<u8>)]) -> Value {
        let sequences: Vec<String> = records
            .iter()
            .map(|_| {
                self.next += 1;
                // Real sequence numbers are 56 digits: keep the length, so order is by value.
                format!("4959{:052}", self.next)
            })
            .collect();
        let arn = format!(
            "arn:aws:kinesis:us-east-1:123456789012:stream/{}",
            self.stream
        );
        kinesis_event(
            &arn,
            records
                .iter()
                .zip(&sequences)
                .map(|((key, data), seq)| KinesisEventRecord {
                    shard_id: &self.shard_id,
                    sequence_number: seq,
                    partition_key: key,
                    data,
                    arrival_millis: self.arrival_millis,
                }),
        )
    }
}

/// A JSON record for the keyed counter.
pub fn count(key: &str, amount: u64) -> (&str, Vec<u8>) {
    (
        key,
        format!(r#"{{"key":"{key}","amount":{amount}}}"#).into_bytes(),
    )
}

/// The records of `event` at `indexes`, as one lane of a shard read with a ParallelizationFactor
/// above 1 receives them.
pub fn pick(event: &Value, indexes: &[usize]) -> Value {
    let records = event["Records"].as_array().expect("records");
    serde_json::json!({ "Records": indexes.iter().map(|&i| records[i].clone()).collect::<Vec<_>>() })
}

/// A JSON record for the keyed counter under another partition key.
pub fn count_under(partition_key: &'static str, key: &str, amount: u64) -> (&'static str, Vec<u8>) {
    (
        partition_key,
        format!(r#"{{"key":"{key}","amount":{amount}}}"#).into_bytes(),
    )
}

/// What Lambda redelivers after a partial batch response: the records from `failed_from` on.
pub fn redelivery(event: &Value, failed_from: &SequenceNumber) -> Value {
    let records: Vec<Value> = event["Records"]
        .as_array()
        .expect("records")
        .iter()
        .filter(|r| {
            let seq = SequenceNumber::parse(r["kinesis"]["sequenceNumber"].as_str().expect("seq"))
                .expect("digits");
            seq >= *failed_from
        })
        .cloned()
        .collect();
    serde_json::json!({ "Records": records })
}

/// Runs `event` as Lambda would with ReportBatchItemFailures: redelivering from the reported
/// sequence number until the batch succeeds (at most `attempts` invocations). Returns the reports.
pub async fn run_to_completion<O: KeyedOperator>(
    executor: &Executor<O>,
    event: &Value,
    attempts: usize,
) -> Vec<BatchReport> {
    let mut reports = Vec::new();
    let mut current = event.clone();
    for _ in 0..attempts {
        let report = executor
            .run(decode_event(&current.to_string()).expect("a Kinesis event"))
            .await;
        let failed = report.failed_from.clone();
        reports.push(report);
        match failed {
            Some(seq) => current = redelivery(event, &seq),
            None => return reports,
        }
    }
    panic!("the batch did not complete in {attempts} invocations: {reports:?}");
}

/// The count stored for `key` by the keyed counter.
pub async fn stored_count<O: KeyedOperator>(
    world: &World,
    executor: &Executor<O>,
    key: &str,
) -> Option<u64> {
    let loaded = world
        .store
        .load(executor.namespace(), &[key.to_owned()])
        .await
        .expect("load");
    loaded[key]
        .slots
        .get("count")
        .and_then(|slot| slot.entries.first())
        .map(|e| e.get().parse().expect("a count"))
}
