//! The ways a runtime can lose, repeat or reorder work under settings users have, each played out
//! on the memory adapters: lanes of a shard (ParallelizationFactor > 1), old redeliveries, TTLs
//! shorter than outages, lost responses, operators sharing a stream, large outboxes, keys fed by
//! thousands of items, FIFO order after a failure, throttling codes, outboxes sent twice,
//! recreated streams, panics and deadlines.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use keyed_counter::{CountUpdate, KeyedCounter, COUNTS};
use keyway::adapters::dynamodb::DynamoStateStore;
use keyway::adapters::sqs::{SqsSink, BATCH_MAX_BYTES};
use keyway::domain::{AttrValue, ChangeKind, Item};
use keyway::ports::{Clock, Sink, StateStore};
use keyway::sources::kinesis::decode_event;
use keyway::{Executor, ExecutorConfig};
use keyway_local::mapping::events::{dynamodb_event, DynamoDbEventRecord};
use keyway_local::testing::LosingResponses;
use keyway_tests::harness::{
    count, count_under, pick, redelivery, run_to_completion, stored_count, Shard, World,
};
use keyway_tests::operators::{
    Buffer, FlakySink, GroupCounter, Keeper, Resolved, Tweaked, Waker, RESOLVED,
};
use serde_json::Value;

const DAY: i64 = 24 * 3600 * 1000;

fn counts_of(world: &World, sink: &str, key: &str) -> Vec<u64> {
    world
        .outputs(sink)
        .iter()
        .map(|m| serde_json::from_str::<CountUpdate>(&m.body).unwrap())
        .filter(|u| u.key == key)
        .map(|u| u.count)
        .collect()
}

fn event_of(key: &str, event: &str) -> Vec<u8> {
    format!(r#"{{"key":"{key}","event":"{event}"}}"#).into_bytes()
}

fn resolution_of(key: &str, actor: &str) -> Vec<u8> {
    format!(r#"{{"key":"{key}","actor":"{actor}"}}"#).into_bytes()
}

/// Scenario 1: a shard read in lanes hands one key records from two lanes; the lane with the later
/// record commits first.
#[tokio::test]
async fn a_key_fed_by_two_lanes_of_one_shard_applies_the_earlier_record_that_commits_later() {
    let world = World::new(&[COUNTS.name]);
    let executor = world.executor(KeyedCounter);
    let mut shard = Shard::new("clicks", 0);
    // One key, two partition keys: Lambda may put them in different lanes.
    let event = shard.batch(&[
        count_under("user-1", "page", 1),
        count_under("user-2", "page", 10),
    ]);
    let later_lane = executor
        .run(decode_event(&pick(&event, &[1]).to_string()).unwrap())
        .await;
    let earlier_lane = executor
        .run(decode_event(&pick(&event, &[0]).to_string()).unwrap())
        .await;
    assert_eq!((later_lane.applied, earlier_lane.applied), (1, 1));
    assert_eq!(
        stored_count(&world, &executor, "page").await,
        Some(11),
        "the earlier record is applied, not skipped as already seen"
    );
    // Both lanes redelivered: nothing twice.
    let again = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!((again.applied, again.replayed), (0, 2));
    assert_eq!(stored_count(&world, &executor, "page").await, Some(11));
}

/// Scenario 2: a redelivery of a record that arrived long ago (a backfill, a lagging mapping on a
/// stream kept for a year) meets the watermark that guards it.
#[tokio::test]
async fn a_record_redelivered_months_after_it_arrived_is_not_applied_twice() {
    let world = World::new(&[COUNTS.name]);
    let executor = world.executor(KeyedCounter);
    let mut shard = Shard::new("archive", 0);
    shard.arrival_millis = world.clock.now_millis() - 200 * DAY;
    let event = shard.batch(&[count("a", 1), count("a", 2)]);
    executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    world.clock.advance(30 * DAY);
    let again = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!((again.applied, again.replayed), (0, 2));
    assert_eq!(stored_count(&world, &executor, "a").await, Some(3));

    // A mapping whose records live a day (DynamoDB Streams, MaximumRecordAgeInSeconds) keeps
    // watermarks a day: they are pruned once no redelivery can reach them, not before.
    let short = world.executor(KeyedCounter).with_config(ExecutorConfig {
        redelivery_window: Duration::from_millis(DAY as u64),
        ..ExecutorConfig::default()
    });
    let mut recent = Shard::new("recent", 0);
    recent.arrival_millis = world.clock.now_millis();
    let event = recent.batch(&[count("b", 1)]);
    short.run(decode_event(&event.to_string()).unwrap()).await;
    world.clock.advance(DAY - 1000);
    let later = short
        .run(decode_event(&recent.batch(&[count("b", 1)]).to_string()).unwrap())
        .await;
    assert_eq!(later.applied, 1);
    let replay = short.run(decode_event(&event.to_string()).unwrap()).await;
    assert_eq!(replay.replayed, 1, "still guarded within the window");
}

/// Scenario 3: an outbox operator commits, its sink is down longer than the key's state TTL.
#[tokio::test]
async fn an_unsent_outbox_outlives_the_state_ttl_and_is_sent_when_the_sink_is_back() {
    let world = World::new(&[]);
    let queue = world.sqs.create_queue("resolved");
    let flaky = Arc::new(FlakySink::new(Arc::new(SqsSink::new(
        world.sqs.clone(),
        &queue,
    ))));
    let sinks = world.sinks().with(&RESOLVED, flaky.clone());
    let operator = Tweaked::new(Waker).with_ttl(Duration::from_secs(60));
    let executor =
        Executor::new(operator, world.store.clone(), sinks, world.clock.clone()).unwrap();
    let mut shard = Shard::new("mixed", 0);
    let event = shard.batch(&[
        ("k", event_of("k", "e1")),
        ("k", resolution_of("k", "alice")),
    ]);
    flaky.set_down(true);
    let first = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!(first.commits, 1);
    assert!(first.failed_from.is_some());

    // The sink stays down past the TTL, and DynamoDB's TTL process runs.
    world.clock.advance(3_600_000);
    world.table.expire(world.clock.now_millis() / 1000);
    flaky.set_down(false);
    let reports = run_to_completion(
        &executor,
        &redelivery(&event, first.failed_from.as_ref().unwrap()),
        2,
    )
    .await;
    assert_eq!(reports[0].replayed, 2, "nothing applied twice");
    let sent: Vec<Resolved> = world
        .sqs
        .messages(&queue)
        .iter()
        .map(|m| serde_json::from_str(&m.body).unwrap())
        .collect();
    assert_eq!(
        sent,
        [Resolved {
            event: "e1".into(),
            actor: "alice".into()
        }],
        "the output promised before the TTL passed is sent"
    );
}

/// Scenario 4: DynamoDB applies a head put and its response is lost; the retry meets the key's
/// own write.
#[tokio::test]
async fn a_commit_whose_response_was_lost_is_a_commit_and_its_key_stays_readable() {
    let world = World::new(&["flushed"]);
    let losing = Arc::new(LosingResponses::new(world.table.clone()));
    let store = Arc::new(DynamoStateStore::new(losing.clone(), world.clock.clone()));
    let executor = world.executor_on(Buffer, store);
    let mut shard = Shard::new("in", 0);
    // Large enough that the list lives in segments.
    let records: Vec<(&str, Vec<u8>)> = (0..100)
        .map(|i| ("k", format!("{i:05}{}", "x".repeat(2043)).into_bytes()))
        .collect();
    let event = shard.batch(&records);
    world.executor(Buffer).run(Vec::new()).await;
    losing.lose_next(1);
    let report = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!(
        (report.commits, report.conflicts, report.failed_from),
        (1, 0, None),
        "the lost response is recognised as the key's own commit"
    );
    let flush = executor
        .run(decode_event(&shard.batch(&[("k", b"FLUSH".to_vec())]).to_string()).unwrap())
        .await;
    assert_eq!(flush.failed_from, None, "every segment is still there");
    let flushed: Value = serde_json::from_str(&world.outputs("flushed")[0].body).unwrap();
    assert_eq!(flushed["count"], 100);
}

/// Scenario 5: two operators read one stream and write to one FIFO queue.
#[tokio::test]
async fn two_operators_on_one_stream_never_share_an_output_id() {
    let world = World::new(&[]);
    let fifo = world.sqs.create_queue("counts.fifo");
    let sinks = world.sinks().with(
        &COUNTS,
        Arc::new(SqsSink::new(world.sqs.clone(), &fifo)) as Arc<dyn Sink>,
    );
    let first = Executor::new(
        KeyedCounter,
        world.store.clone(),
        sinks.clone(),
        world.clock.clone(),
    )
    .unwrap();
    let second = Executor::new(
        Tweaked::new(KeyedCounter).named("keyed-counter-copy"),
        world.store.clone(),
        sinks,
        world.clock.clone(),
    )
    .unwrap();
    let event = Shard::new("clicks", 0).batch(&[count("a", 1), count("b", 2)]);
    first.run(decode_event(&event.to_string()).unwrap()).await;
    second.run(decode_event(&event.to_string()).unwrap()).await;
    let messages = world.sqs.messages(&fifo);
    assert_eq!(messages.len(), 4, "the queue's deduplication drops neither");
    let ids: HashSet<_> = messages.iter().map(|m| m.output_id.clone()).collect();
    assert_eq!(ids.len(), 4);
}

/// Scenario 6: an outbox far larger than a head item, and state or outputs no store can hold.
#[tokio::test]
async fn an_outbox_larger_than_an_item_commits_and_an_unstorable_effect_is_dead_lettered() {
    let world = World::new(&["resolved"]);
    let executor = world.executor(Waker);
    let mut shard = Shard::new("mixed", 0);
    // 300 buffered events of 2 KB, woken at once: a 600 KB outbox.
    let mut records: Vec<(&str, Vec<u8>)> = (0..300)
        .map(|i| ("k", event_of("k", &format!("{i:04}{}", "e".repeat(2000)))))
        .collect();
    records.push(("k", resolution_of("k", "alice")));
    let event = shard.batch(&records);
    let report = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!(report.failed_from, None, "{report:?}");
    assert_eq!(world.outputs("resolved").len(), 300);
    // 500 records of one key in a batch, each sent 1 KB at once through the outbox.
    let burst: Vec<(&str, Vec<u8>)> = (0..500)
        .map(|i| ("k", event_of("k", &format!("{i:04}{}", "b".repeat(1000)))))
        .collect();
    let report = executor
        .run(decode_event(&shard.batch(&burst).to_string()).unwrap())
        .await;
    assert_eq!((report.applied, report.failed_from), (500, None));
    assert_eq!(world.outputs("resolved").len(), 800);

    // A value larger than any item: its record is dead-lettered, the key goes on.
    let keeper = world.executor(Keeper);
    let event = shard.batch(&[
        ("k", b"small".to_vec()),
        ("k", "x".repeat(500 * 1024).into_bytes()),
    ]);
    let report = keeper.run(decode_event(&event.to_string()).unwrap()).await;
    assert_eq!(
        (
            report.failed_from.clone(),
            report.applied,
            report.dead_lettered
        ),
        (None, 1, 1),
        "{report:?}"
    );
    let letter = world.dead_letters().pop().unwrap();
    assert_eq!(letter.field, "state.kept");
    assert!(letter.problem.contains("bytes"), "{}", letter.problem);
    let kept = world
        .store
        .load(keeper.namespace(), &["the-key".into()])
        .await
        .unwrap();
    assert_eq!(kept["the-key"].slots["kept"].entries[0].get(), "\"small\"");
    let after = keeper
        .run(decode_event(&shard.batch(&[("k", b"after".to_vec())]).to_string()).unwrap())
        .await;
    assert_eq!(after.applied, 1);
}

/// Scenario 7: a key aggregated over thousands of DynamoDB items, each its own lineage.
#[tokio::test]
async fn a_key_fed_by_thousands_of_dynamodb_items_keeps_a_bounded_head_and_applies_each_change_once(
) {
    let world = World::new(&[]);
    let executor = world.executor(GroupCounter);
    let arn = "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-01-01T00:00:00.000";
    // 6,000 items a key: one watermark each would not fit a 400 KB item.
    let items: Vec<Item> = (0..12_000)
        .map(|i| {
            Item::from([
                ("id".to_owned(), AttrValue::S(format!("order-{i}"))),
                ("group".to_owned(), AttrValue::S(format!("g{}", i % 2))),
            ])
        })
        .collect();
    let batch = |range: std::ops::Range<usize>| {
        dynamodb_event(
            arn,
            range.map(|i| DynamoDbEventRecord {
                kind: ChangeKind::Insert,
                keys: &items[i],
                view: keyway_local::StreamView::NewAndOldImages,
                old_image: None,
                new_image: Some(&items[i]),
                sequence_number: Box::leak(format!("{:021}", 1000 + i).into_boxed_str()),
                created_secs: 1_767_225_600,
                ttl_deletion: false,
            }),
        )
    };
    let mut events = Vec::new();
    for start in (0..12_000).step_by(1_000) {
        let event = batch(start..start + 1_000);
        let reports = run_to_completion_dynamodb(&executor, &event).await;
        assert!(
            reports.len() > 1,
            "a batch advances at most a head's lineages per key"
        );
        events.push(event);
    }
    assert_eq!(stored_count(&world, &executor, "g0").await, Some(6_000));
    assert_eq!(stored_count(&world, &executor, "g1").await, Some(6_000));
    let largest = world.largest_item();
    assert!(largest < 100 * 1024, "the largest item is {largest} bytes");
    // Every batch redelivered: nothing counted twice.
    for event in &events {
        run_to_completion_dynamodb(&executor, event).await;
    }
    assert_eq!(stored_count(&world, &executor, "g0").await, Some(6_000));
    assert_eq!(stored_count(&world, &executor, "g1").await, Some(6_000));
}

/// Runs a DynamoDB Streams event as Lambda would, redelivering from each reported record.
async fn run_to_completion_dynamodb(
    executor: &Executor<GroupCounter>,
    event: &Value,
) -> Vec<keyway::BatchReport> {
    let mut reports = Vec::new();
    let mut current = event.clone();
    for _ in 0..50 {
        let report = executor
            .run(keyway::sources::dynamodb::decode_event(&current.to_string()).unwrap())
            .await;
        let failed = report.failed_from.clone();
        reports.push(report);
        let Some(failed) = failed else {
            return reports;
        };
        let rest: Vec<Value> = event["Records"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                keyway::domain::SequenceNumber::parse(
                    r["dynamodb"]["SequenceNumber"].as_str().unwrap(),
                )
                .unwrap()
                    >= failed
            })
            .cloned()
            .collect();
        current = serde_json::json!({ "Records": rest });
    }
    panic!("the batch did not complete: {reports:?}");
}

/// Scenario 8: DynamoDB's TTL process deletes expired items; Lambda redelivers after that.
#[tokio::test]
async fn a_redelivery_after_the_state_ttl_and_the_ttl_process_is_still_skipped() {
    let world = World::new(&[COUNTS.name]);
    let executor = world.executor(Tweaked::new(KeyedCounter).with_ttl(Duration::from_secs(60)));
    let mut shard = Shard::new("clicks", 0);
    shard.arrival_millis = world.clock.now_millis();
    let event = shard.batch(&[count("a", 1), count("a", 2)]);
    executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    world.clock.advance(3_600_000);
    let deleted = world.table.expire(world.clock.now_millis() / 1000);
    assert_eq!(
        deleted, 0,
        "the head stays while a redelivery could reach it"
    );
    let again = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!((again.applied, again.replayed), (0, 2));
    assert_eq!(
        counts_of(&world, COUNTS.name, "a"),
        [1, 3],
        "no output was computed again from fresh state"
    );
    // Once no redelivery can come, DynamoDB may delete it.
    world.clock.advance(400 * DAY);
    assert_eq!(world.table.expire(world.clock.now_millis() / 1000), 1);
}

/// Scenario 9: on a FIFO queue, one message of a key fails and a later one of the same key would
/// go out before the redelivery re-sends the first.
#[tokio::test]
async fn after_a_failed_output_no_later_output_of_its_key_overtakes_it_on_a_fifo_queue() {
    let world = World::new(&[]);
    let fifo = world.sqs.create_queue("counts.fifo");
    let failing = Arc::new(FailFirst::new(Arc::new(SqsSink::new(
        world.sqs.clone(),
        &fifo,
    ))));
    let sinks = world
        .sinks()
        .with(&COUNTS, failing.clone() as Arc<dyn Sink>);
    let executor = Executor::new(
        KeyedCounter,
        world.store.clone(),
        sinks,
        world.clock.clone(),
    )
    .unwrap();
    let event = Shard::new("clicks", 0).batch(&[count("a", 1), count("a", 2), count("b", 5)]);
    let reports = run_to_completion(&executor, &event, 3).await;
    assert!(reports[0].failed_from.is_some());
    let order: Vec<u64> = world
        .sqs
        .messages(&fifo)
        .iter()
        .map(|m| serde_json::from_str::<CountUpdate>(&m.body).unwrap())
        .filter(|u| u.key == "a")
        .map(|u| u.count)
        .collect();
    assert_eq!(order, [1, 3], "key a's counts arrive in order");
}

/// A sink whose first message fails once, then works.
struct FailFirst {
    inner: Arc<dyn Sink>,
    failed: std::sync::atomic::AtomicBool,
}

impl FailFirst {
    fn new(inner: Arc<dyn Sink>) -> Self {
        Self {
            inner,
            failed: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

#[async_trait::async_trait]
impl Sink for FailFirst {
    async fn send(
        &self,
        messages: &[keyway::domain::Output],
        deadline: keyway::ports::Deadline,
    ) -> Vec<(usize, keyway::ports::SinkError)> {
        if messages.is_empty() || self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return self.inner.send(messages, deadline).await;
        }
        let mut failures = self.inner.send(&messages[1..], deadline).await;
        for failure in &mut failures {
            failure.0 += 1;
        }
        failures.insert(
            0,
            (
                0,
                keyway::ports::SinkError::Throttled("KMS.ThrottlingException".into()),
            ),
        );
        failures
    }

    fn max_message_bytes(&self) -> usize {
        self.inner.max_message_bytes()
    }

    fn ordered(&self) -> bool {
        self.inner.ordered()
    }
}

/// Scenario 11: an outbox operator's key commits again after its outbox was sent.
#[tokio::test]
async fn an_outbox_is_sent_once_and_not_again_by_the_keys_next_commit() {
    let world = World::new(&["resolved"]);
    let executor = world.executor(Waker);
    let mut shard = Shard::new("mixed", 0);
    let first = shard.batch(&[
        ("k", event_of("k", "e1")),
        ("k", resolution_of("k", "alice")),
    ]);
    executor
        .run(decode_event(&first.to_string()).unwrap())
        .await;
    let second = shard.batch(&[("k", event_of("k", "e2"))]);
    executor
        .run(decode_event(&second.to_string()).unwrap())
        .await;
    let third = shard.batch(&[("k", resolution_of("k", "bob"))]);
    executor
        .run(decode_event(&third.to_string()).unwrap())
        .await;
    let events: Vec<String> = world
        .outputs("resolved")
        .iter()
        .map(|m| serde_json::from_str::<Resolved>(&m.body).unwrap().event)
        .collect();
    assert_eq!(events, ["e1", "e2"], "each output once");
}

/// A stream deleted and created again under the same name: its sequence numbers start over.
#[tokio::test]
async fn records_of_a_recreated_stream_are_applied_though_their_numbers_are_below_old_watermarks() {
    let world = World::new(&[COUNTS.name]);
    let executor = world.executor(KeyedCounter);
    let mut old = Shard::new("clicks", 0);
    old.arrival_millis = world.clock.now_millis() - DAY;
    for _ in 0..5 {
        executor
            .run(decode_event(&old.batch(&[count("a", 1)]).to_string()).unwrap())
            .await;
    }
    let mut new = old.recreated();
    new.arrival_millis = world.clock.now_millis();
    let report = executor
        .run(decode_event(&new.batch(&[count("a", 10)]).to_string()).unwrap())
        .await;
    assert_eq!(report.applied, 1);
    assert_eq!(stored_count(&world, &executor, "a").await, Some(15));
}

/// An operator that panics on one key.
#[tokio::test]
async fn an_operator_that_panics_fails_its_key_and_the_others_go_on() {
    let world = World::new(&[COUNTS.name]);
    let executor = world.executor(Tweaked::new(KeyedCounter).panicking_on("boom"));
    let event = Shard::new("clicks", 0).batch(&[count("a", 1), count("boom", 1), count("b", 1)]);
    let report = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!(report.panics, 1);
    assert_eq!(
        report.failed_from.as_ref().map(|s| s.to_string()),
        event["Records"][1]["kinesis"]["sequenceNumber"]
            .as_str()
            .map(str::to_owned)
    );
    assert_eq!(stored_count(&world, &executor, "a").await, Some(1));
    assert_eq!(stored_count(&world, &executor, "b").await, Some(1));
}

/// A slow operator and an invocation deadline.
#[tokio::test]
async fn near_its_deadline_the_executor_commits_what_it_finished_and_reports_the_rest() {
    let world = World::new(&[COUNTS.name]);
    let executor = world.executor(Tweaked::new(KeyedCounter).taking(world.clock.clone(), 1_000));
    let records: Vec<(&str, Vec<u8>)> = ["a", "b", "c", "d", "e", "f"]
        .iter()
        .map(|k| count(k, 1))
        .collect();
    let event = Shard::new("clicks", 0).batch(&records);
    // Five seconds left, two kept in reserve: three keys get processed.
    let deadline = world.clock.now_millis() + 5_000;
    let report = executor
        .run_until(decode_event(&event.to_string()).unwrap(), Some(deadline))
        .await;
    assert_eq!((report.applied, report.deferred_keys), (3, 3), "{report:?}");
    assert_eq!(
        report.failed_from.as_ref().map(|s| s.to_string()),
        event["Records"][3]["kinesis"]["sequenceNumber"]
            .as_str()
            .map(str::to_owned)
    );
    assert_eq!(stored_count(&world, &executor, "c").await, Some(1));
    assert_eq!(stored_count(&world, &executor, "d").await, None);
    let rest = executor
        .run(
            decode_event(&redelivery(&event, report.failed_from.as_ref().unwrap()).to_string())
                .unwrap(),
        )
        .await;
    assert_eq!((rest.applied, rest.failed_from), (3, None));
}

/// The same checks a store does, through the port: a watermark store that outlives its state.
#[tokio::test]
async fn expired_state_keeps_its_watermarks_through_the_port() {
    let world = World::new(&[COUNTS.name]);
    let executor = world.executor(Tweaked::new(KeyedCounter).with_ttl(Duration::from_secs(1)));
    let event = Shard::new("clicks", 0).batch(&[count("a", 1)]);
    executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    world.clock.advance(5_000);
    let loaded = world
        .store
        .load(executor.namespace(), &["a".into()])
        .await
        .unwrap();
    assert!(loaded["a"].slots.is_empty());
    assert_eq!(loaded["a"].watermarks.len(), 1);
}

/// SQS answers per entry; a fake that fails the first entry of the first call as a
/// KMS-encrypted queue whose key is being re-enabled does, and records every call's entries.
#[derive(Default)]
struct KmsThrottledOnce {
    calls: std::sync::Mutex<Vec<Vec<usize>>>,
}

#[async_trait::async_trait]
impl keyway::adapters::sqs::SqsApi for KmsThrottledOnce {
    async fn send_message_batch(
        &self,
        _queue_url: &str,
        entries: &[keyway::adapters::sqs::SqsEntry<'_>],
    ) -> Result<Vec<keyway::adapters::sqs::SqsOutcome>, keyway::ports::SinkError> {
        use keyway::adapters::sqs::SqsOutcome;
        let mut calls = self.calls.lock().unwrap();
        calls.push(entries.iter().map(|e| e.body.len()).collect());
        let first_call = calls.len() == 1;
        Ok(entries
            .iter()
            .enumerate()
            .map(|(i, _)| {
                if first_call && i == 0 {
                    SqsOutcome::Failed {
                        code: "KmsDisabled".into(),
                        message: "the queue's key is disabled".into(),
                        sender_fault: true,
                    }
                } else {
                    SqsOutcome::Sent {
                        message_id: format!("m{i}"),
                    }
                }
            })
            .collect())
    }
}

fn output(i: usize, body: String) -> keyway::domain::Output {
    keyway::domain::Output {
        id: keyway::domain::OutputId(format!("{i:032}")),
        sink: COUNTS.name.into(),
        partition_key: "k".into(),
        body,
        settled: false,
    }
}

/// Scenario 10: a KMS-encrypted queue answers with KMS's codes; the message is retried, not refused
/// (the call-level codes, `KMS.ThrottlingException` among them, are tested in `sdk_error`).
#[tokio::test(start_paused = true)]
async fn a_kms_error_on_an_encrypted_queue_is_retried_not_dead_lettered() {
    let api = Arc::new(KmsThrottledOnce::default());
    let sink = SqsSink::new(api.clone(), "https://sqs.us-east-1.amazonaws.com/1/counts");
    let failed = sink
        .send(&[output(0, "{}".into())], keyway::ports::Deadline::NONE)
        .await;
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(
        api.calls.lock().unwrap().len(),
        2,
        "sent again after the throttle"
    );
}

/// SendMessageBatch's 1 MiB counts message attributes too.
#[tokio::test(start_paused = true)]
async fn an_sqs_batch_counts_the_output_id_attribute_against_its_size_limit() {
    let api = Arc::new(KmsThrottledOnce::default());
    let sink = SqsSink::new(api.clone(), "https://sqs.us-east-1.amazonaws.com/1/counts");
    // Ten bodies that fit one call by themselves, but not with their attributes.
    let body = BATCH_MAX_BYTES / 10 - 10;
    let messages: Vec<_> = (0..10).map(|i| output(i, "x".repeat(body))).collect();
    let failed = sink.send(&messages, keyway::ports::Deadline::NONE).await;
    assert!(failed.is_empty(), "{failed:?}");
    let calls = api.calls.lock().unwrap();
    assert!(calls.len() >= 3, "two calls and a retry: {calls:?}");
    for call in calls.iter() {
        let bytes: usize = call.iter().map(|b| b + 46).sum();
        assert!(bytes <= BATCH_MAX_BYTES, "a call of {bytes} bytes");
    }
}
