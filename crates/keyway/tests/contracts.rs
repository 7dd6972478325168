//! The port contract suites on the in-memory adapters. The same suites run on the AWS adapters
//! against the emulator (tests/tests/emulator.rs).

use std::sync::Arc;

use keyway::adapters::dynamodb::DynamoStateStore;
use keyway::adapters::kinesis::KinesisSink;
use keyway::adapters::memory::{MemoryKinesis, MemorySqs, MemoryTable, TableFaults};
use keyway::adapters::retry::Backoff;
use keyway::adapters::sqs::SqsSink;
use keyway::ports::ManualClock;
use keyway::testing::{sink_contract, state_store_contract, table_contract, Received};

#[tokio::test]
async fn the_memory_table_keeps_the_table_contract() {
    table_contract(&MemoryTable::new()).await;
}

#[tokio::test]
async fn the_memory_table_keeps_the_table_contract_while_leaving_keys_unprocessed() {
    let table = MemoryTable::new().with_faults(TableFaults {
        unprocessed: 0.3,
        seed: 11,
        ..Default::default()
    });
    table_contract(&table).await;
}

#[tokio::test]
async fn the_state_store_keeps_its_contract_on_the_memory_table() {
    let clock = ManualClock::at(1_700_000_000_000);
    let store = DynamoStateStore::new(Arc::new(MemoryTable::new()), clock.clone());
    state_store_contract(&store, clock).await;
}

#[tokio::test(start_paused = true)]
async fn the_state_store_keeps_its_contract_through_throttling_and_unprocessed_keys() {
    let clock = ManualClock::at(1_700_000_000_000);
    let table = MemoryTable::new().with_faults(TableFaults {
        throttle: 0.1,
        unprocessed: 0.1,
        seed: 5,
    });
    let store = DynamoStateStore::new(Arc::new(table), clock.clone())
        .with_backoff(Backoff::default().seeded(5));
    state_store_contract(&store, clock).await;
    let calls = store.table().meter().snapshot().calls;
    assert!(
        calls["BatchGetItem"] > 10 && calls["PutItem"] > 250,
        "{calls:?}"
    );
}

#[tokio::test]
async fn the_kinesis_sink_keeps_the_sink_contract_on_memory_kinesis() {
    let kinesis = Arc::new(MemoryKinesis::default());
    kinesis.create_stream("out", 2);
    let sink = KinesisSink::new(kinesis.clone(), "out");
    let read = || async {
        kinesis
            .records("out")
            .into_iter()
            .map(|r| Received {
                body: String::from_utf8(r.data).unwrap(),
                output_id: None,
                group: Some(r.partition_key),
            })
            .collect()
    };
    sink_contract(&sink, read, false).await;
}

#[tokio::test]
async fn the_sqs_sink_keeps_the_sink_contract_on_a_memory_standard_queue() {
    let sqs = Arc::new(MemorySqs::default());
    let url = sqs.create_queue("out");
    let sink = SqsSink::new(sqs.clone(), url.clone());
    let read = || async {
        sqs.messages(&url)
            .into_iter()
            .map(|m| Received {
                body: m.body,
                output_id: Some(m.output_id),
                group: m.group_id,
            })
            .collect()
    };
    sink_contract(&sink, read, true).await;
}

#[tokio::test]
async fn the_sqs_sink_keeps_the_sink_contract_on_a_memory_fifo_queue() {
    let sqs = Arc::new(MemorySqs::default());
    let url = sqs.create_queue("out.fifo");
    let sink = SqsSink::new(sqs.clone(), url.clone());
    let read = || async {
        sqs.messages(&url)
            .into_iter()
            .map(|m| Received {
                body: m.body,
                output_id: m.deduplication_id,
                group: m.group_id,
            })
            .collect()
    };
    sink_contract(&sink, read, true).await;
}
