//! The port contract suites on the in-memory adapters: the embedded runtime's services and
//! keyway's own `MemoryTable`. The same suites run on the AWS adapters against the emulator
//! (tests/tests/emulator.rs).

use std::sync::Arc;

use keyway::adapters::dynamodb::DynamoStateStore;
use keyway::adapters::kinesis::KinesisSink;
use keyway::adapters::retry::Backoff;
use keyway::adapters::sqs::SqsSink;
use keyway::ports::SystemClock;
use keyway::ports::{Deadline, ManualClock};
use keyway_local::services::faults::Fault;
use keyway_local::testing::{
    state_store_contract, table_contract, Received, SinkUnderTest, StoreUnderTest,
};
use keyway_local::{FaultPlan, Faults, LocalKinesis, LocalSqs, LocalTable};

/// Each promise of each contract on a fresh in-memory resource, one test apiece.
mod local_table {
    keyway_local::table_contract_tests!(async { keyway_local::LocalTable::new() });
}

mod state_store_on_the_local_table {
    use super::*;

    keyway_local::state_store_contract_tests!(async {
        let clock = ManualClock::at(1_700_000_000_000);
        StoreUnderTest {
            store: DynamoStateStore::new(Arc::new(LocalTable::new()), clock.clone()),
            clock,
        }
    });
}

mod memory_table {
    keyway_local::table_contract_tests!(async { keyway::adapters::dynamodb::MemoryTable::new() });
}

mod state_store_on_the_memory_table {
    use super::*;
    use keyway::adapters::dynamodb::MemoryTable;

    keyway_local::state_store_contract_tests!(async {
        let clock = ManualClock::at(1_700_000_000_000);
        StoreUnderTest {
            store: DynamoStateStore::new(Arc::new(MemoryTable::new()), clock.clone()),
            clock,
        }
    });
}

mod memory_kinesis_sink {
    use super::*;

    keyway_local::sink_contract_tests!(async {
        let kinesis = Arc::new(LocalKinesis::new(Arc::new(SystemClock), Faults::none()));
        kinesis.create_stream("out", 2);
        let read = kinesis.clone();
        SinkUnderTest {
            sink: Box::new(KinesisSink::new(kinesis, "out")),
            read_back: Box::new(move || {
                let records = read.records("out");
                Box::pin(async move {
                    records
                        .into_iter()
                        .map(|r| Received {
                            body: String::from_utf8(r.data.to_vec()).unwrap(),
                            output_id: None,
                            group: Some(r.partition_key),
                        })
                        .collect()
                })
            }),
            expects_ids: false,
            keeps_order: true,
        }
    });
}

/// A sink to an in-memory queue named `name` (a FIFO queue if it ends in `.fifo`).
fn memory_queue(name: &str) -> SinkUnderTest {
    let sqs = Arc::new(LocalSqs::default());
    let url = sqs.create_queue(name);
    let fifo = name.ends_with(".fifo");
    let read = (sqs.clone(), url.clone());
    SinkUnderTest {
        sink: Box::new(SqsSink::new(sqs, url)),
        read_back: Box::new(move || {
            let messages = read.0.messages(&read.1);
            Box::pin(async move {
                messages
                    .into_iter()
                    .map(|m| Received::queued(m, fifo))
                    .collect()
            })
        }),
        expects_ids: true,
        keeps_order: fifo,
    }
}

mod memory_standard_queue_sink {
    keyway_local::sink_contract_tests!(async { super::memory_queue("out") });
}

mod memory_fifo_queue_sink {
    keyway_local::sink_contract_tests!(async { super::memory_queue("out.fifo") });
}

#[tokio::test]
async fn the_memory_table_keeps_the_table_contract_while_leaving_keys_unprocessed() {
    let table = LocalTable::new().with_faults(Faults::new(
        FaultPlan {
            partial_failure: 0.3,
            seed: 11,
            ..Default::default()
        },
        0,
    ));
    table_contract(&table).await;
    let fired = table.faults_fired();
    println!("faults fired: {fired:?}");
    assert!(
        fired.get(&Fault::PartialFailure) > Some(&10),
        "keys and items were left unprocessed: {fired:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_state_store_keeps_its_contract_through_throttling_and_unprocessed_keys() {
    let clock = ManualClock::at(1_700_000_000_000);
    let table = LocalTable::new().with_faults(Faults::new(
        FaultPlan {
            throttle: 0.1,
            partial_failure: 0.1,
            seed: 5,
            ..Default::default()
        },
        0,
    ));
    let faulty = StoreUnderTest {
        store: DynamoStateStore::new(Arc::new(table), clock.clone())
            .with_backoff(Backoff::default().seeded(5)),
        clock,
    };
    state_store_contract(&faulty).await;
    let fired = faulty.store.table().faults_fired();
    println!("faults fired: {fired:?}");
    assert!(
        fired.get(&Fault::Throttle) > Some(&10) && fired.get(&Fault::PartialFailure) > Some(&10),
        "calls were throttled and keys left unprocessed: {fired:?}"
    );
    // The same contract without faults makes fewer calls: the faults made the store retry.
    let clean_clock = ManualClock::at(1_700_000_000_000);
    let clean = StoreUnderTest {
        store: DynamoStateStore::new(Arc::new(LocalTable::new()), clean_clock.clone()),
        clock: clean_clock,
    };
    state_store_contract(&clean).await;
    let (faulty, clean) = (
        faulty.store.table().meter().snapshot().calls,
        clean.store.table().meter().snapshot().calls,
    );
    for call in ["BatchGetItem", "BatchWriteItem", "PutItem"] {
        assert!(
            faulty[call] > clean[call],
            "{call}: {faulty:?} against {clean:?}"
        );
    }
}

fn outputs(n: usize) -> Vec<keyway::domain::Output> {
    (0..n)
        .map(|i| keyway::domain::Output {
            id: keyway::domain::OutputId(format!("{i:032x}")),
            sink: "out".into(),
            partition_key: format!("key-{}", i % 7),
            body: format!("{{\"n\":{i}}}"),
            settled: false,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_sqs_sink_retries_the_entries_a_batch_could_not_send_until_all_are_sent_once() {
    use keyway::ports::Sink;
    let sqs = Arc::new(LocalSqs::new(
        Arc::new(SystemClock),
        Faults::new(
            FaultPlan {
                partial_failure: 0.3,
                seed: 3,
                ..Default::default()
            },
            0,
        ),
    ));
    let url = sqs.create_queue("out");
    let sink = SqsSink::new(sqs.clone(), url.clone()).with_backoff(Backoff::default().seeded(3));
    let messages = outputs(95);
    assert!(
        sink.send(&messages, Deadline::NONE).await.is_empty(),
        "every entry is sent in the end"
    );
    let mut bodies: Vec<String> = sqs.messages(&url).into_iter().map(|m| m.body).collect();
    bodies.sort();
    let mut expected: Vec<String> = messages.iter().map(|m| m.body.clone()).collect();
    expected.sort();
    assert_eq!(bodies, expected, "each message once");
    assert!(
        sqs.meter().snapshot().calls["SendMessageBatch"] > 10,
        "failed entries were sent again"
    );
}

#[tokio::test(start_paused = true)]
async fn the_kinesis_sink_retries_records_a_put_could_not_write_and_reports_those_it_never_could() {
    use keyway::ports::Sink;
    let flaky = Arc::new(LocalKinesis::new(
        Arc::new(SystemClock),
        Faults::new(
            FaultPlan {
                partial_failure: 0.3,
                seed: 9,
                ..Default::default()
            },
            0,
        ),
    ));
    flaky.create_stream("out", 4);
    let sink = KinesisSink::new(flaky.clone(), "out").with_backoff(Backoff::default().seeded(9));
    assert!(
        sink.send(&outputs(600), Deadline::NONE).await.is_empty(),
        "600 records in two calls, failures retried"
    );
    assert_eq!(flaky.records("out").len(), 600);

    let down = Arc::new(LocalKinesis::new(
        Arc::new(SystemClock),
        Faults::new(
            FaultPlan {
                partial_failure: 1.0,
                seed: 1,
                ..Default::default()
            },
            0,
        ),
    ));
    down.create_stream("out", 1);
    let sink = KinesisSink::new(down.clone(), "out").with_backoff(Backoff::default().seeded(1));
    let failed = sink.send(&outputs(3), Deadline::NONE).await;
    assert_eq!(
        failed.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert!(
        failed.iter().all(|(_, e)| e.is_retryable()),
        "throttling stays retryable: {failed:?}"
    );
    assert_eq!(
        down.meter().snapshot().calls["PutRecords"],
        u64::from(Backoff::default().max_attempts)
    );
}

#[tokio::test]
async fn keys_the_services_would_refuse_as_group_or_partition_keys_are_sent_under_their_hash() {
    use keyway::ports::Sink;
    let odd_keys = ["", "a key with spaces", "clé-ünïcode", &"k".repeat(300)];
    let messages: Vec<keyway::domain::Output> = odd_keys
        .iter()
        .enumerate()
        .map(|(i, key)| keyway::domain::Output {
            id: keyway::domain::OutputId(format!("{i:032x}")),
            sink: "out".into(),
            partition_key: key.to_string(),
            body: format!("{i}"),
            settled: false,
        })
        .collect();
    let sqs = Arc::new(LocalSqs::default());
    let url = sqs.create_queue("out.fifo");
    assert!(SqsSink::new(sqs.clone(), url.clone())
        .send(&messages, Deadline::NONE)
        .await
        .is_empty());
    let groups: Vec<String> = sqs
        .messages(&url)
        .into_iter()
        .map(|m| m.group_id.unwrap())
        .collect();
    assert_eq!(groups.len(), 4);
    assert!(
        groups
            .iter()
            .all(|g| !g.is_empty() && g.len() <= 128 && g.bytes().all(|b| b.is_ascii_graphic())),
        "{groups:?}"
    );

    let kinesis = Arc::new(LocalKinesis::new(Arc::new(SystemClock), Faults::none()));
    kinesis.create_stream("out", 2);
    assert!(KinesisSink::new(kinesis.clone(), "out")
        .send(&messages, Deadline::NONE)
        .await
        .is_empty());
    assert!(kinesis
        .records("out")
        .iter()
        .all(|r| !r.partition_key.is_empty() && r.partition_key.chars().count() <= 256));
}
