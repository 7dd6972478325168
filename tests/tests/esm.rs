//! The event source mapping emulator reproduces Lambda's documented behaviour, one setting a test.
//! Each test names the section of the AWS Lambda Developer Guide it follows.

use std::sync::Arc;
use std::time::Duration;

use keyway::domain::pattern::{Dialect, Pattern};
use keyway::domain::{AttrValue, Item};
use keyway::lambda::{FunctionError, Invocation};
use keyway::ports::Clock;
use keyway_local::{
    FaultPlan, KeySchema, LocalRuntime, LocalServices, MappingSettings, MappingSource,
    StartingPosition,
};
use keyway_tests::scripted::{Scripted, Seen};
use serde_json::{json, Value};

const EPOCH: i64 = 1_767_225_600_000;

/// A table keyed by `id`, with a stream of `view`.
fn id_table(
    services: &LocalServices,
    name: &str,
    ttl: Option<String>,
    view: Option<keyway_local::StreamView>,
) -> Arc<keyway_local::LocalTable> {
    let schema = KeySchema {
        hash: "id".into(),
        range: None,
    };
    services.dynamodb.create_table(name, schema, ttl, view)
}

struct Setup {
    runtime: LocalRuntime,
    stream: String,
    failures: String,
}

/// One stream of `shards` shards, an on-failure queue, and `handler` mapped with `settings`.
fn setup(shards: usize, handler: Arc<Scripted>, settings: MappingSettings) -> Setup {
    setup_with(FaultPlan::default(), shards, handler, settings)
}

/// `setup`, on services that inject `faults`.
fn setup_with(
    faults: FaultPlan,
    shards: usize,
    handler: Arc<Scripted>,
    settings: MappingSettings,
) -> Setup {
    let services = LocalServices::new(EPOCH, faults);
    services.kinesis.create_stream("in", shards);
    let failures = services.sqs.create_queue("failed-batches");
    let mut runtime = LocalRuntime::new(services.clone());
    let settings = MappingSettings {
        on_failure: Some(failures.clone()),
        ..settings
    };
    let source = MappingSource::Kinesis {
        kinesis: services.kinesis.clone(),
        stream: "in".into(),
    };
    runtime.add_mapping("f", handler, source, settings);
    Setup {
        runtime,
        stream: "in".into(),
        failures,
    }
}

impl Setup {
    /// Writes one record; returns the shard it went to and its sequence number.
    fn write(&self, key: &str, data: &[u8]) -> (String, String) {
        match self
            .runtime
            .services
            .kinesis
            .put_record(&self.stream, key, data)
            .unwrap()
        {
            keyway::adapters::kinesis::PutOutcome::Written {
                shard_id,
                sequence_number,
            } => (shard_id, sequence_number),
            failed => panic!("{failed:?}"),
        }
    }

    fn put(&self, key: &str, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| self.write(key, format!("{key}-{i}").as_bytes()).1)
            .collect()
    }

    async fn run(&mut self) -> keyway_local::RunReport {
        self.runtime
            .run_until_idle(Duration::from_secs(3600))
            .await
            .expect("the run ends")
    }

    fn failure_records(&self) -> Vec<Value> {
        self.runtime
            .services
            .sqs
            .messages(&self.failures)
            .iter()
            .map(|m| serde_json::from_str(&m.body).unwrap())
            .collect()
    }
}

fn sequences(batch: &[Seen]) -> Vec<String> {
    batch.iter().map(|s| s.sequence.clone()).collect()
}

/// "Lambda event source mappings", batching behavior: a batch holds at most BatchSize records.
#[tokio::test(start_paused = true)]
async fn batches_hold_at_most_the_batch_size() {
    let f = Scripted::succeeding();
    let mut s = setup(
        1,
        f.clone(),
        MappingSettings {
            batch_size: 100,
            ..Default::default()
        },
    );
    s.put("k", 250);
    let report = s.run().await;
    assert_eq!(f.sizes(), [100, 100, 50]);
    assert_eq!(report.mappings[0].1.records_done, 250);
}

/// "Lambda event source mappings", batching behavior: a batch also goes when its payload would
/// pass 6 MB, the limit of a synchronous invocation. Kinesis data travels base64-encoded, so four
/// records of a million bytes fill one.
#[tokio::test(start_paused = true)]
async fn a_batch_stops_short_of_the_six_megabyte_invocation_payload() {
    let f = Scripted::succeeding();
    let mut s = setup(1, f.clone(), MappingSettings::default());
    let data = vec![b'x'; 1_000_000];
    // Partition keys count too: Kinesis allows 256 characters.
    let key = "k".repeat(256);
    for _ in 0..10 {
        s.write(&key, &data);
    }
    let report = s.run().await;
    assert_eq!(f.sizes(), [4, 4, 2]);
    assert_eq!(report.mappings[0].1.records_done, 10);
}

/// Small records with the longest partition keys still fill a batch up to the payload limit:
/// each adds its base64 data, its key and the fields every record carries (some 400 bytes).
#[tokio::test(start_paused = true)]
async fn small_records_with_long_keys_fill_a_batch_up_to_the_payload_limit() {
    let f = Scripted::succeeding();
    let settings = MappingSettings {
        batch_size: 10_000,
        ..Default::default()
    };
    let mut s = setup(1, f.clone(), settings);
    let data = vec![b'x'; 10_000];
    let key = "k".repeat(256);
    for _ in 0..1_000 {
        s.write(&key, &data);
    }
    s.run().await;
    let sizes = f.sizes();
    // 6 MiB over some 13,333 bytes of base64, 256 of key and 400 of the rest: 449 records.
    assert!((440..=460).contains(&sizes[0]), "{sizes:?}");
    assert_eq!(sizes.iter().sum::<usize>(), 1_000);
}

/// The same limit for DynamoDB Streams, whose records carry an item's old and new images.
#[tokio::test(start_paused = true)]
async fn a_dynamodb_batch_stops_short_of_the_six_megabytes_of_its_images() {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let table = id_table(
        &services,
        "big",
        None,
        Some(keyway_local::StreamView::NewAndOldImages),
    );
    let f = Scripted::succeeding();
    let mut runtime = LocalRuntime::new(services.clone());
    let source = MappingSource::DynamoDb {
        table: table.clone(),
    };
    runtime.add_mapping("f", f.clone(), source, MappingSettings::default());
    // An insert of 250 KB, then 20 modifications: old and new images of 250 KB each.
    for version in 0..21 {
        let mut item = Item::from([("id".to_owned(), AttrValue::S("a".into()))]);
        let filler = format!("{version:02}{}", "x".repeat(250_000));
        item.insert("v".to_owned(), AttrValue::S(filler));
        table.put_item(item).unwrap();
    }
    runtime
        .run_until_idle(Duration::from_secs(60))
        .await
        .unwrap();
    let sizes = f.sizes();
    assert_eq!(sizes.iter().sum::<usize>(), 21);
    assert!(
        (10..=13).contains(&sizes[0]),
        "an insert and about twelve 500 KB changes fill 6 MB: {sizes:?}"
    );
}

/// "Lambda event source mappings", batching window: Lambda waits up to
/// MaximumBatchingWindowInSeconds for a batch to fill, and not at all once it is full.
#[tokio::test(start_paused = true)]
async fn a_batch_waits_for_the_batching_window_unless_it_is_full() {
    let f = Scripted::succeeding();
    let mut s = setup(
        1,
        f.clone(),
        MappingSettings {
            batch_size: 10,
            maximum_batching_window: Duration::from_secs(5),
            ..Default::default()
        },
    );
    s.put("k", 3);
    let start = s.runtime.services.clock.now_millis();
    let report = s.run().await;
    assert_eq!(f.sizes(), [3]);
    assert_eq!(
        report.elapsed,
        Duration::from_secs(5),
        "three records waited the whole window"
    );

    s.put("k", 10);
    let report = s.run().await;
    assert_eq!(f.sizes(), [3, 10]);
    assert_eq!(report.elapsed, Duration::ZERO, "a full batch goes at once");
    assert!(s.runtime.services.clock.now_millis() - start >= 5_000);
}

/// "Using Lambda with Kinesis", starting position: LATEST reads only records added after the
/// mapping starts, TRIM_HORIZON every record, AT_TIMESTAMP records from a time on.
#[tokio::test(start_paused = true)]
async fn the_starting_position_decides_which_records_are_read() {
    for (position, expected) in [
        (StartingPosition::TrimHorizon, 6),
        (StartingPosition::Latest, 2),
        (StartingPosition::AtTimestamp(EPOCH + 60_000), 4),
    ] {
        let services = LocalServices::new(EPOCH, FaultPlan::default());
        services.kinesis.create_stream("in", 1);
        let put = |n: usize| {
            for i in 0..n {
                services
                    .kinesis
                    .put_record("in", "k", format!("{i}").as_bytes())
                    .unwrap();
            }
        };
        put(2);
        tokio::time::sleep(Duration::from_secs(120)).await;
        put(2);
        let mut runtime = LocalRuntime::new(services.clone());
        let f = Scripted::succeeding();
        let settings = MappingSettings {
            starting_position: position,
            ..Default::default()
        };
        runtime.add_mapping(
            "f",
            f.clone(),
            MappingSource::Kinesis {
                kinesis: services.kinesis.clone(),
                stream: "in".into(),
            },
            settings,
        );
        put(2);
        runtime
            .run_until_idle(Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(f.batches().concat().len(), expected, "{position:?}");
    }
}

/// "Configuring partial batch response with Kinesis": Lambda checkpoints before the lowest
/// reported sequence number and retries from there.
#[tokio::test(start_paused = true)]
async fn a_partial_batch_response_redelivers_from_the_lowest_failed_record() {
    let f = Scripted::new(|call, batch| {
        Ok(match call {
            0 => {
                json!({"batchItemFailures": [{"itemIdentifier": batch[4].sequence}, {"itemIdentifier": batch[2].sequence}]})
            }
            _ => json!({"batchItemFailures": []}),
        })
    });
    let mut s = setup(
        1,
        f.clone(),
        MappingSettings {
            report_batch_item_failures: true,
            batch_size: 6,
            ..Default::default()
        },
    );
    let written = s.put("k", 10);
    let report = s.run().await;
    let batches = f.batches();
    assert_eq!(sequences(&batches[0]), written[..6]);
    assert_eq!(
        sequences(&batches[1]),
        written[2..6],
        "only the batch's records from the lowest failure are retried"
    );
    assert_eq!(sequences(&batches[2]), written[6..]);
    assert_eq!(batches.len(), 3);
    assert_eq!(report.mappings[0].1.partial_failures, 1);
    assert_eq!(
        report.mappings[0].1.records_done, 10,
        "the records a partial failure applied count as done"
    );
}

/// "Configuring partial batch response with Kinesis" with MaximumRetryAttempts: a retry after a
/// partial failure is a retry; once they are used up the rest of the batch is discarded.
#[tokio::test(start_paused = true)]
async fn retries_after_partial_failures_use_up_the_maximum_retry_attempts() {
    let f = Scripted::new(|_, batch| {
        Ok(json!({"batchItemFailures": [{"itemIdentifier": batch[1].sequence}]}))
    });
    let mut s = setup(
        1,
        f.clone(),
        MappingSettings {
            report_batch_item_failures: true,
            maximum_retry_attempts: Some(1),
            ..Default::default()
        },
    );
    let written = s.put("k", 4);
    let report = s.run().await;
    let batches = f.batches();
    assert_eq!(batches.len(), 2, "the first invocation and one retry");
    assert_eq!(sequences(&batches[1]), written[1..]);
    assert_eq!(report.mappings[0].1.discarded_for_retries, 2);
    let records = s.failure_records();
    assert_eq!(records.len(), 1);
    assert!(
        records[0]["responseContext"].get("functionError").is_none(),
        "a partial batch response is no function error: {}",
        records[0]
    );
}

/// "Retain discarded batch records for a Kinesis Data Streams event source": the record of a
/// batch whose last invocation failed says so in `responseContext.functionError` (the documented
/// example's "Unhandled"), whether the function returned an error or timed out.
#[tokio::test(start_paused = true)]
async fn an_on_failure_record_carries_the_function_error_that_ended_its_batch() {
    for slow in [false, true] {
        let f = Scripted::taking(Duration::from_secs(if slow { 10 } else { 0 }), |_, _| {
            Err(FunctionError::Failed("boom".into()))
        });
        let mut s = setup(
            1,
            f.clone(),
            MappingSettings {
                maximum_retry_attempts: Some(0),
                function_timeout: Duration::from_secs(3),
                ..Default::default()
            },
        );
        s.put("k", 2);
        let report = s.run().await;
        assert_eq!(report.mappings[0].1.timeouts, u64::from(slow));
        let records = s.failure_records();
        assert_eq!(records.len(), 1);
        assert_eq!(
            records[0]["responseContext"]["functionError"], "Unhandled",
            "{}",
            records[0]
        );
        assert_eq!(
            records[0]["KinesisBatchInfo"]["shardId"],
            "shardId-000000000000"
        );
    }
}

/// "Configuring partial batch response with Kinesis", success and failure conditions: without
/// ReportBatchItemFailures a response is ignored; an empty or null identifier fails the batch.
#[tokio::test(start_paused = true)]
async fn partial_batch_responses_count_only_when_reported_and_well_formed() {
    let reporting = |first: Value| {
        Scripted::new(move |call, _| {
            Ok(if call == 0 {
                first.clone()
            } else {
                json!({"batchItemFailures": []})
            })
        })
    };
    // Not turned on: the same response checkpoints the whole batch.
    let f = reporting(json!({"batchItemFailures": [{"itemIdentifier": "1"}]}));
    let mut s = setup(1, f.clone(), MappingSettings::default());
    s.put("k", 3);
    s.run().await;
    assert_eq!(f.sizes(), [3]);

    for bad in [
        json!({"batchItemFailures": [{"itemIdentifier": ""}]}),
        json!({"batchItemFailures": [{"itemIdentifier": null}]}),
        json!({"batchItemFailures": [{"sequenceNumber": "1"}]}),
    ] {
        let f = reporting(bad.clone());
        let mut s = setup(
            1,
            f.clone(),
            MappingSettings {
                report_batch_item_failures: true,
                ..Default::default()
            },
        );
        s.put("k", 3);
        s.run().await;
        assert_eq!(f.sizes(), [3, 3], "{bad}: the whole batch is retried");
    }
    for fine in [
        json!({"batchItemFailures": []}),
        json!({"batchItemFailures": null}),
        json!({}),
        Value::Null,
    ] {
        let f = reporting(fine.clone());
        let mut s = setup(
            1,
            f.clone(),
            MappingSettings {
                report_batch_item_failures: true,
                ..Default::default()
            },
        );
        s.put("k", 3);
        s.run().await;
        assert_eq!(f.sizes(), [3], "{fine}: a complete success");
    }
}

/// "Using Lambda with Kinesis", error handling: BisectBatchOnFunctionError splits a failing batch
/// in two, without using up retries, until the bad record is alone; MaximumRetryAttempts then
/// discards it and the on-failure destination receives the batch's description.
#[tokio::test(start_paused = true)]
async fn bisection_isolates_a_poison_record_which_is_discarded_after_its_retries() {
    let poison = Arc::new(std::sync::Mutex::new(String::new()));
    let p = poison.clone();
    let f = Scripted::new(move |_, batch| {
        if batch.iter().any(|r| r.sequence == *p.lock().unwrap()) {
            Err(FunctionError::Failed("poisoned".into()))
        } else {
            Ok(json!({}))
        }
    });
    let settings = MappingSettings {
        bisect_batch_on_function_error: true,
        maximum_retry_attempts: Some(2),
        ..Default::default()
    };
    let mut s = setup(1, f.clone(), settings);
    let written = s.put("k", 8);
    *poison.lock().unwrap() = written[5].clone();
    let report = s.run().await;
    let stats = &report.mappings[0].1;

    // Records 0-7, the poison at 5: [0-7] fails; [0-3] ok, [4-7] fails; [4-5] fails; [4] ok,
    // [5] fails three times (one try, two retries) and is discarded; then [6-7] ok.
    assert_eq!(f.sizes(), [8, 4, 4, 2, 1, 1, 1, 1, 2]);
    assert_eq!(stats.bisections, 3);
    assert_eq!(stats.function_errors, 6, "8, 4, 2, then 1 three times");
    assert_eq!(stats.records_done, 7);
    assert_eq!(stats.discarded_for_retries, 1);
    let delivered: Vec<String> = f
        .batches()
        .iter()
        .flatten()
        .map(|r| r.sequence.clone())
        .collect();
    assert!(
        delivered.contains(&written[7]),
        "the records after the poison are processed"
    );

    let records = s.failure_records();
    assert_eq!(records.len(), 1);
    let info = &records[0]["KinesisBatchInfo"];
    assert_eq!(
        records[0]["requestContext"]["condition"],
        "RetryAttemptsExhausted"
    );
    // Invocations that carried the record: in the batches of 8, 4 and 2, then three alone.
    assert_eq!(records[0]["requestContext"]["approximateInvokeCount"], 6);
    assert_eq!(
        (
            info["startSequenceNumber"].as_str(),
            info["endSequenceNumber"].as_str()
        ),
        (Some(written[5].as_str()), Some(written[5].as_str()))
    );
    assert_eq!(info["batchSize"], 1);
    assert_eq!(info["shardId"], "shardId-000000000000");
    assert_eq!(
        info["streamArn"],
        "arn:aws:kinesis:us-east-1:000000000000:stream/in"
    );
}

/// "Using Lambda with Kinesis", error handling: without bisection a failing batch is retried
/// MaximumRetryAttempts times, then discarded whole.
#[tokio::test(start_paused = true)]
async fn a_failing_batch_is_retried_the_maximum_number_of_times_then_discarded() {
    let f = Scripted::new(|call, _| {
        if call < 4 {
            Err(FunctionError::Failed("down".into()))
        } else {
            Ok(json!({}))
        }
    });
    let mut s = setup(
        1,
        f.clone(),
        MappingSettings {
            maximum_retry_attempts: Some(3),
            batch_size: 5,
            ..Default::default()
        },
    );
    let written = s.put("k", 7);
    let report = s.run().await;
    // One invocation and three retries of the first five, discarded; the last two succeed.
    assert_eq!(f.sizes(), [5, 5, 5, 5, 2]);
    assert_eq!(report.mappings[0].1.discarded_for_retries, 5);
    let record = &s.failure_records()[0];
    assert_eq!(record["requestContext"]["approximateInvokeCount"], 4);
    assert_eq!(
        record["KinesisBatchInfo"]["startSequenceNumber"],
        written[0].as_str()
    );
    assert_eq!(
        record["KinesisBatchInfo"]["endSequenceNumber"],
        written[4].as_str()
    );
    assert_eq!(record["KinesisBatchInfo"]["batchSize"], 5);
}

/// "Using Lambda with Kinesis", error handling: records older than MaximumRecordAgeInSeconds are
/// discarded, also while their batch is being retried.
#[tokio::test(start_paused = true)]
async fn records_past_the_maximum_age_are_discarded_and_described() {
    let f = Scripted::new(|_, _| Err(FunctionError::Failed("down".into())));
    let settings = MappingSettings {
        maximum_record_age: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    let mut s = setup(1, f.clone(), settings);
    s.put("k", 4);
    let report = s.run().await;
    let stats = &report.mappings[0].1;
    assert_eq!(stats.discarded_for_age, 4);
    assert!(
        report.elapsed >= Duration::from_secs(60) && report.elapsed < Duration::from_secs(62),
        "{:?}",
        report.elapsed
    );
    assert!(
        f.sizes().len() > 100,
        "retried all along until the records expired"
    );
    let record = &s.failure_records()[0];
    assert_eq!(record["requestContext"]["condition"], "RecordAgeExceeded");
    assert_eq!(record["KinesisBatchInfo"]["batchSize"], 4);
}

/// Records that expire while their batch is being retried leave it: the retry holds the rest of
/// that batch and no more.
#[tokio::test(start_paused = true)]
async fn records_expiring_from_a_batch_in_retry_leave_the_rest_of_it_to_be_retried() {
    let f = Scripted::new(|_, _| Err(FunctionError::Failed("down".into())));
    let settings = MappingSettings {
        maximum_record_age: Some(Duration::from_secs(60)),
        batch_size: 5,
        ..Default::default()
    };
    let mut s = setup(1, f.clone(), settings);
    s.put("old", 2);
    tokio::time::sleep(Duration::from_secs(30)).await;
    s.put("new", 4);
    let report = s.run().await;
    assert_eq!(report.mappings[0].1.discarded_for_age, 6);
    let sizes = f.sizes();
    let first_short = sizes
        .iter()
        .position(|&n| n != 5)
        .expect("the batch shrank");
    assert!(
        first_short > 1,
        "the first batch was retried whole: {sizes:?}"
    );
    assert_eq!(
        sizes[first_short], 3,
        "two records expired out of the batch of five: {sizes:?}"
    );
    let described: Vec<u64> = s
        .failure_records()
        .iter()
        .map(|r| r["KinesisBatchInfo"]["batchSize"].as_u64().unwrap())
        .collect();
    assert_eq!(described.iter().sum::<u64>(), 6, "{described:?}");
    assert_eq!(described[0], 2, "the expired pair first");
}

/// "Older than" the maximum age: a record exactly that old, held by a batching window as long,
/// is still delivered.
#[tokio::test(start_paused = true)]
async fn a_record_exactly_the_maximum_age_old_is_still_delivered() {
    let f = Scripted::succeeding();
    let settings = MappingSettings {
        maximum_record_age: Some(Duration::from_secs(60)),
        maximum_batching_window: Duration::from_secs(60),
        ..Default::default()
    };
    let mut s = setup(1, f.clone(), settings);
    s.put("k", 2);
    let report = s.run().await;
    assert_eq!(
        report.elapsed,
        Duration::from_secs(60),
        "the window held it"
    );
    assert_eq!(report.mappings[0].1.discarded_for_age, 0);
    assert_eq!(f.sizes(), [2]);
}

/// "Using Lambda with Kinesis", polling and batching, ParallelizationFactor: up to ten batches
/// of a shard run at once, and records with the same partition key stay in order.
#[tokio::test(start_paused = true)]
async fn a_parallelization_factor_runs_a_shards_batches_at_once_keeping_each_keys_order() {
    let f = Scripted::taking(Duration::from_millis(200), |_, _| Ok(json!({})));
    let mut s = setup(
        1,
        f.clone(),
        MappingSettings {
            parallelization_factor: 4,
            batch_size: 5,
            ..Default::default()
        },
    );
    let mut written: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for round in 0..5 {
        for key in ["a", "b", "c", "d", "e", "f", "g", "h"] {
            written
                .entry(key.into())
                .or_default()
                .extend(s.put(key, 1 + round % 2));
        }
    }
    s.run().await;
    assert!(f.max_concurrency() > 1, "batches of one shard ran at once");
    assert!(f.max_concurrency() <= 4);
    let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for batch in f.batches() {
        for r in batch {
            seen.entry(r.key).or_default().push(r.sequence);
        }
    }
    assert_eq!(seen, written, "every key's records arrive once, in order");
}

/// "Using Lambda with Kinesis", ParallelizationFactor: the factor applies per shard, so two
/// shards at a factor of 2 run up to four batches at once, each batch from one shard.
#[tokio::test(start_paused = true)]
async fn a_parallelization_factor_gives_every_shard_its_own_concurrent_batches() {
    let f = Scripted::taking(Duration::from_millis(200), |_, _| Ok(json!({})));
    let mut s = setup(
        2,
        f.clone(),
        MappingSettings {
            parallelization_factor: 2,
            batch_size: 3,
            ..Default::default()
        },
    );
    let mut shard_of: std::collections::HashMap<String, String> = Default::default();
    for round in 0..3 {
        for k in 0..24 {
            let key = format!("key-{k}");
            let (shard, _) = s.write(&key, format!("{round}").as_bytes());
            shard_of.insert(key, shard);
        }
    }
    let shards: std::collections::BTreeSet<&String> = shard_of.values().collect();
    assert_eq!(shards.len(), 2, "the keys fill both shards");
    s.run().await;
    for batch in f.batches() {
        let from: std::collections::BTreeSet<&String> =
            batch.iter().map(|r| &shard_of[&r.key]).collect();
        assert_eq!(from.len(), 1, "a batch holds one shard's records");
    }
    assert!(f.max_concurrency() > 2, "both shards' lanes ran at once");
    assert!(f.max_concurrency() <= 4);
}

/// "Using Lambda with Kinesis", error handling: a function that runs past its timeout fails the
/// batch, which is retried.
#[tokio::test(start_paused = true)]
async fn an_invocation_past_the_function_timeout_fails_and_is_retried() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = calls.clone();
    let f = Scripted::taking(Duration::from_secs(5), move |_, _| {
        c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(json!({}))
    });
    let settings = MappingSettings {
        function_timeout: Duration::from_secs(3),
        maximum_retry_attempts: Some(1),
        ..Default::default()
    };
    let mut s = setup(1, f.clone(), settings);
    s.put("k", 2);
    let report = s.run().await;
    let stats = &report.mappings[0].1;
    assert_eq!(
        stats.timeouts, 2,
        "the first try and its one retry time out"
    );
    assert_eq!(stats.crashes, 0, "a timeout is no crash");
    assert_eq!(stats.discarded_for_retries, 2);
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a timed-out invocation never answers"
    );
}

/// "Using Lambda with DynamoDB": changes arrive in order with NEW_AND_OLD_IMAGES; items removed by
/// TTL carry the service's identity; discarded batches are described as DDBStreamBatchInfo.
#[tokio::test(start_paused = true)]
async fn a_dynamodb_stream_delivers_changes_ttl_deletions_and_failure_records() {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let table = id_table(
        &services,
        "subscriptions",
        Some("expires".into()),
        Some(keyway_local::StreamView::NewAndOldImages),
    );
    let failures = services.sqs.create_queue("failed");
    let events = Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let e = events.clone();
    let f = Scripted::new(move |call, _| {
        if call == 0 {
            Err(FunctionError::Failed("once".into()))
        } else {
            Ok(json!({}))
        }
    });
    let recorder = Arc::new(Recording {
        inner: f.clone(),
        events: e,
    });
    let mut runtime = LocalRuntime::new(services.clone());
    let settings = MappingSettings {
        on_failure: Some(failures.clone()),
        maximum_retry_attempts: Some(0),
        ..Default::default()
    };
    runtime.add_mapping(
        "f",
        recorder,
        MappingSource::DynamoDb {
            table: table.clone(),
        },
        settings,
    );

    let item = |id: &str, extra: &[(&str, AttrValue)]| -> Item {
        let mut i = Item::from([("id".to_owned(), AttrValue::S(id.into()))]);
        i.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        i
    };
    table.put_item(item("gone", &[])).unwrap();
    runtime
        .run_until_idle(Duration::from_secs(10))
        .await
        .unwrap();
    let record = serde_json::from_str::<Value>(&services.sqs.messages(&failures)[0].body).unwrap();
    assert_eq!(
        record["DDBStreamBatchInfo"]["streamArn"],
        table.stream_arn()
    );
    assert_eq!(record["DDBStreamBatchInfo"]["batchSize"], 1);

    table
        .put_item(item("a", &[("v", AttrValue::N("1".into()))]))
        .unwrap();
    table
        .put_item(item("a", &[("v", AttrValue::N("2".into()))]))
        .unwrap();
    let expires = (EPOCH / 1000 + 30).to_string();
    table
        .put_item(item("t", &[("expires", AttrValue::N(expires))]))
        .unwrap();
    runtime.run_for(Duration::from_secs(60)).await;
    // Expired half a minute ago, and not deleted yet: DynamoDB takes days ("Using time to live").
    assert_eq!(table.stream_len(), 4);
    runtime.run_for(keyway_local::DEFAULT_TTL_DELAY).await;
    assert_eq!(table.stream_len(), 5);
    runtime
        .run_until_idle(Duration::from_secs(10))
        .await
        .unwrap();
    let delivered: Vec<Value> = events
        .lock()
        .unwrap()
        .iter()
        .skip(1)
        .flat_map(|e| e["Records"].as_array().unwrap().clone())
        .collect();
    let names: Vec<&str> = delivered
        .iter()
        .map(|r| r["eventName"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["INSERT", "MODIFY", "INSERT", "REMOVE"]);
    assert_eq!(delivered[1]["dynamodb"]["OldImage"]["v"], json!({"N": "1"}));
    assert_eq!(delivered[1]["dynamodb"]["NewImage"]["v"], json!({"N": "2"}));
    assert_eq!(
        delivered[3]["userIdentity"],
        json!({"type": "Service", "principalId": "dynamodb.amazonaws.com"})
    );
    // Every delivered record decodes as keyway's DynamoDB source reads it.
    let decoded =
        keyway::sources::dynamodb::decode_event(&json!({"Records": delivered}).to_string())
            .unwrap();
    assert!(decoded.iter().all(Result::is_ok));
}

/// Keeps every event it was given, then answers as `inner` does.
struct Recording {
    inner: Arc<Scripted>,
    events: Arc<std::sync::Mutex<Vec<Value>>>,
}

#[async_trait::async_trait]
impl keyway::lambda::Handler for Recording {
    async fn handle(
        &self,
        event: &str,
        invocation: &Invocation,
    ) -> Result<keyway::lambda::Response, FunctionError> {
        self.events
            .lock()
            .unwrap()
            .push(serde_json::from_str(event).unwrap());
        self.inner.handle(event, invocation).await
    }
}

/// "Using Lambda with Kinesis", on-failure destinations: the record names the shard the discarded
/// batch came from, also when each shard is read in several lanes.
#[tokio::test(start_paused = true)]
async fn an_on_failure_record_names_the_shard_of_its_batch_with_every_parallelization_factor() {
    for factor in [1, 3] {
        let f = Scripted::new(|_, _| Err(FunctionError::Failed("down".into())));
        let mut s = setup(
            2,
            f.clone(),
            MappingSettings {
                parallelization_factor: factor,
                maximum_retry_attempts: Some(0),
                ..Default::default()
            },
        );
        let mut shard_of = std::collections::HashMap::new();
        for k in 0..16 {
            let (shard, sequence) = s.write(&format!("key-{k}"), b"x");
            shard_of.insert(sequence, shard);
        }
        s.run().await;
        let records = s.failure_records();
        let named: std::collections::BTreeSet<&str> = records
            .iter()
            .map(|r| r["KinesisBatchInfo"]["shardId"].as_str().unwrap())
            .collect();
        assert_eq!(named.len(), 2, "factor {factor}: both shards' batches fail");
        for record in &records {
            let info = &record["KinesisBatchInfo"];
            let first = info["startSequenceNumber"].as_str().unwrap();
            assert_eq!(
                info["shardId"].as_str().unwrap(),
                shard_of[first],
                "factor {factor}"
            );
        }
    }
}

/// "Configure Lambda function timeout": an invocation's context says when it will be stopped, the
/// function's timeout after it starts.
#[tokio::test(start_paused = true)]
async fn each_invocation_is_told_its_deadline_the_function_timeout_after_it_starts() {
    let f = Scripted::succeeding();
    let settings = MappingSettings {
        function_timeout: Duration::from_secs(7),
        batch_size: 1,
        ..Default::default()
    };
    let mut s = setup(1, f.clone(), settings);
    s.put("k", 2);
    let start = s.runtime.services.clock.now_millis();
    s.run().await;
    let deadlines = f.deadlines.lock().unwrap().clone();
    assert_eq!(deadlines.len(), 2);
    for deadline in deadlines {
        let after = deadline.expect("a deadline") - start;
        assert!(
            (7_000..8_000).contains(&after),
            "{after} ms after the start"
        );
    }
}

/// A lost acknowledgement makes Lambda deliver a batch again: a second invocation, counted.
#[tokio::test(start_paused = true)]
async fn a_duplicate_delivery_is_a_second_invocation_of_the_same_batch() {
    let f = Scripted::succeeding();
    let faults = FaultPlan {
        duplicate_delivery: 1.0,
        ..FaultPlan::default()
    };
    let settings = MappingSettings {
        batch_size: 1,
        ..Default::default()
    };
    let mut s = setup_with(faults, 1, f.clone(), settings);
    s.put("k", 3);
    let report = s.run().await;
    let batches = f.batches();
    assert_eq!(batches.len(), 6);
    assert!(batches.chunks(2).all(|pair| pair[0] == pair[1]));
    let stats = &report.mappings[0].1;
    assert_eq!(
        (
            stats.invocations,
            stats.duplicate_deliveries,
            stats.records_delivered
        ),
        (6, 3, 3),
        "a duplicate delivers no new record"
    );
}

/// A panic that is not an injected crash is a bug in the function: the run fails with it rather
/// than retrying it as a crashed runtime.
#[tokio::test(start_paused = true)]
#[should_panic(expected = "a bug in the function")]
async fn a_function_that_panics_with_a_bug_fails_the_run_instead_of_passing_for_a_crash() {
    let f = Scripted::new(|_, _| panic!("a bug in the function"));
    let mut s = setup(1, f, MappingSettings::default());
    s.put("k", 1);
    s.run().await;
}

/// "Control which events Lambda sends to your function" (event filtering): a Kinesis record
/// whose data matches none of the FilterCriteria patterns is never delivered and counts as done;
/// patterns see the data as JSON, and its metadata beside it.
#[tokio::test(start_paused = true)]
async fn kinesis_records_matching_no_filter_are_never_delivered() {
    let f = Scripted::succeeding();
    let filters = [
        r#"{"data": {"kind": ["order"], "total": [{"numeric": [">=", 100]}]}}"#,
        r#"{"partitionKey": [{"prefix": "vip-"}]}"#,
    ];
    let mut s = setup(
        1,
        f.clone(),
        MappingSettings {
            filters: filters
                .iter()
                .map(|p| Pattern::parse_str(p, Dialect::EventBridge).unwrap())
                .collect(),
            ..Default::default()
        },
    );
    let big = s.write("a", br#"{"kind": "order", "total": 250}"#).1;
    s.write("a", br#"{"kind": "order", "total": 99.5}"#);
    s.write("a", br#"{"kind": "refund", "total": 250}"#);
    s.write("a", b"not json at all");
    let vip = s.write("vip-7", b"not json either").1;
    let report = s.run().await;
    let delivered: Vec<String> = f.batches().iter().flat_map(|b| sequences(b)).collect();
    assert_eq!(delivered, [big, vip]);
    assert_eq!(report.mappings[0].1.filtered_out, 3);
    assert_eq!(report.mappings[0].1.records_done, 2);
}

/// The same for DynamoDB Streams: patterns see the change as its event record, images in
/// DynamoDB JSON ("Filtering DynamoDB events").
#[tokio::test(start_paused = true)]
async fn dynamodb_changes_matching_no_filter_are_never_delivered() {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let table = id_table(
        &services,
        "t",
        None,
        Some(keyway_local::StreamView::NewAndOldImages),
    );
    let f = Scripted::succeeding();
    let mut runtime = LocalRuntime::new(services.clone());
    let pattern =
        r#"{"eventName": ["INSERT"], "dynamodb": {"NewImage": {"state": {"S": ["open"]}}}}"#;
    let settings = MappingSettings {
        filters: vec![Pattern::parse_str(pattern, Dialect::EventBridge).unwrap()],
        ..Default::default()
    };
    runtime.add_mapping(
        "f",
        f.clone(),
        MappingSource::DynamoDb {
            table: table.clone(),
        },
        settings,
    );
    let item = |id: &str, state: &str| {
        Item::from([
            ("id".to_owned(), AttrValue::S(id.into())),
            ("state".to_owned(), AttrValue::S(state.into())),
        ])
    };
    table.put_item(item("1", "open")).unwrap();
    table.put_item(item("2", "closed")).unwrap();
    // A modification to "open" is no INSERT.
    table.put_item(item("2", "open")).unwrap();
    let report = runtime
        .run_until_idle(Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(f.sizes().iter().sum::<usize>(), 1);
    assert_eq!(report.mappings[0].1.filtered_out, 2);
}

/// "Change data capture for DynamoDB Streams", StreamViewType: KEYS_ONLY carries only the key
/// attributes, NEW_IMAGE the item after the change, OLD_IMAGE the item before it,
/// NEW_AND_OLD_IMAGES both. A function reading an image its table's view leaves out sees none.
#[tokio::test(start_paused = true)]
async fn each_stream_view_type_delivers_exactly_the_images_it_names() {
    use keyway::domain::Payload;
    use keyway_local::StreamView;
    for view in StreamView::ALL {
        let services = LocalServices::new(EPOCH, FaultPlan::default());
        let table = id_table(&services, "t", None, Some(view));
        let events = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recording = Arc::new(Recording {
            inner: Scripted::succeeding(),
            events: events.clone(),
        });
        let mut runtime = LocalRuntime::new(services.clone());
        let source = MappingSource::DynamoDb {
            table: table.clone(),
        };
        runtime.add_mapping("f", recording, source, MappingSettings::default());
        let item = |state: &str| {
            Item::from([
                ("id".to_owned(), AttrValue::S("1".into())),
                ("state".to_owned(), AttrValue::S(state.into())),
            ])
        };
        table.put_item(item("open")).unwrap();
        table.put_item(item("closed")).unwrap();
        table.delete_item(&item("closed")).unwrap();
        runtime
            .run_until_idle(Duration::from_secs(60))
            .await
            .unwrap();
        let delivered: Vec<Value> = events.lock().unwrap()[0]["Records"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(delivered.len(), 3, "{view:?}");
        for record in &delivered {
            assert_eq!(record["dynamodb"]["StreamViewType"], view.name());
            assert_eq!(record["dynamodb"]["Keys"], json!({"id": {"S": "1"}}));
        }
        let images = |name: &str| -> Vec<Option<String>> {
            delivered
                .iter()
                .map(|r| {
                    r["dynamodb"][name]["state"]["S"]
                        .as_str()
                        .map(str::to_owned)
                })
                .collect()
        };
        let (new, old) = (images("NewImage"), images("OldImage"));
        let some = |s: &[Option<&str>]| -> Vec<Option<String>> {
            s.iter().map(|o| o.map(str::to_owned)).collect()
        };
        let news = match view {
            StreamView::NewImage | StreamView::NewAndOldImages => {
                some(&[Some("open"), Some("closed"), None])
            }
            _ => some(&[None, None, None]),
        };
        let olds = match view {
            StreamView::OldImage | StreamView::NewAndOldImages => {
                some(&[None, Some("open"), Some("closed")])
            }
            _ => some(&[None, None, None]),
        };
        assert_eq!((new, old), (news, olds), "{view:?}");
        // Decoded as the functions decode it: an image left out is no image, not an empty one.
        let text = json!({"Records": delivered}).to_string();
        for (decoded, record) in keyway::sources::dynamodb::decode_event(&text)
            .unwrap()
            .into_iter()
            .zip(&delivered)
        {
            let Payload::Change(change) = decoded.unwrap().payload else {
                panic!("a change")
            };
            assert_eq!(
                change.new_image.is_some(),
                record["dynamodb"].get("NewImage").is_some()
            );
            assert_eq!(
                change.old_image.is_some(),
                record["dynamodb"].get("OldImage").is_some()
            );
        }
    }
}

/// "Change data capture for DynamoDB Streams": "If you perform a PutItem or UpdateItem operation
/// that does not change any data in an item, DynamoDB Streams does not write a stream record for
/// that operation."
#[tokio::test(start_paused = true)]
async fn a_write_that_changes_nothing_leaves_no_stream_record() {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let table = id_table(
        &services,
        "t",
        None,
        Some(keyway_local::StreamView::NewAndOldImages),
    );
    let item = |n: &str| {
        Item::from([
            ("id".to_owned(), AttrValue::S("1".into())),
            ("n".to_owned(), AttrValue::N(n.into())),
        ])
    };
    table.put_item(item("1")).unwrap();
    table.put_item(item("1")).unwrap();
    assert_eq!(table.stream_len(), 1);
    table.put_item(item("2")).unwrap();
    table.put_item(item("2")).unwrap();
    assert_eq!(table.stream_len(), 2);
}

/// "Using Lambda with Kinesis Data Streams", error handling: with unlimited retries and no
/// maximum record age, a record that always fails blocks its shard until the stream's retention
/// drops it (24 hours here); then it is described to the on-failure destination and the records
/// after it go on. The stream no longer holds it either.
#[tokio::test(start_paused = true)]
async fn a_poison_record_retried_without_limit_ends_when_the_streams_retention_drops_it() {
    let f = Scripted::new(|_, batch| match batch.iter().any(|r| r.key == "poison") {
        true => Err(FunctionError::Failed("cannot read it".into())),
        false => Ok(Value::Null),
    });
    let mut s = setup(1, f.clone(), MappingSettings::default());
    s.write("poison", b"{}");
    s.runtime.run_for(Duration::from_secs(23 * 3600)).await;
    s.write("good", b"{}");
    let report = s
        .runtime
        .run_until_idle(Duration::from_secs(48 * 3600))
        .await
        .expect("the run ends once the record expires");
    let stats = &report.mappings[0].1;
    assert_eq!(stats.discarded_for_age, 1);
    assert_eq!(stats.records_done, 1, "the record after it is delivered");
    let records = s.failure_records();
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0]["requestContext"]["condition"],
        "RecordAgeExceeded"
    );
    let last = f.batches().last().cloned().unwrap();
    assert_eq!(
        last.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        ["good"]
    );
    // The stream's retention runs in the background, once a virtual second.
    s.runtime.run_for(Duration::from_secs(2)).await;
    let kept = s.runtime.services.kinesis.records("in");
    assert!(
        kept.iter().all(|r| r.partition_key != "poison"),
        "trimmed from the stream"
    );
}
