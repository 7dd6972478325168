//! The AWS emulator suite: the port contracts on the AWS SDK adapters against a real emulator of
//! AWS's APIs. Run by ./scripts/test (feature `emulator`, `KEYWAY_TEST_ENDPOINT` set).
#![cfg(feature = "emulator")]

use std::sync::{Arc, Mutex};

use keyway::adapters::dynamodb::{DynamoStateStore, SdkTable};
use keyway::adapters::kinesis::{KinesisSink, SdkKinesis};
use keyway::adapters::sqs::{SdkSqs, SqsSink, OUTPUT_ID_ATTRIBUTE};
use keyway::ports::ManualClock;
use keyway::testing::{sink_contract, state_store_contract, table_contract, Received};
use keyway_tests::emulator::{
    create_queue, create_state_table, create_stream, drain_queue, read_stream, sdk_config,
    unique_name,
};

#[tokio::test]
async fn the_sdk_table_keeps_the_table_contract_on_the_emulator() {
    let config = sdk_config().await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let name = unique_name("keyway-table");
    create_state_table(&client, &name).await;
    table_contract(&SdkTable::new(client.clone(), &name)).await;
    client
        .delete_table()
        .table_name(&name)
        .send()
        .await
        .expect("delete table");
}

#[tokio::test]
async fn the_state_store_keeps_its_contract_on_the_emulator() {
    let config = sdk_config().await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let name = unique_name("keyway-state");
    create_state_table(&client, &name).await;
    // The contract moves this clock past TTLs; the emulator's own TTL sweeper runs on wall time,
    // so the clock starts at the present.
    let clock = ManualClock::at(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64,
    );
    let store = DynamoStateStore::new(
        Arc::new(SdkTable::new(client.clone(), &name)),
        clock.clone(),
    );
    state_store_contract(&store, clock).await;
    client
        .delete_table()
        .table_name(&name)
        .send()
        .await
        .expect("delete table");
}

#[tokio::test]
async fn the_kinesis_sink_keeps_the_sink_contract_on_the_emulator() {
    let config = sdk_config().await;
    let client = aws_sdk_kinesis::Client::new(&config);
    let name = unique_name("keyway-out");
    create_stream(&client, &name, 2).await;
    let sink = KinesisSink::new(Arc::new(SdkKinesis::new(client.clone())), &name);
    let read = || async {
        read_stream(&client, &name)
            .await
            .into_iter()
            .map(|r| Received {
                body: String::from_utf8(r.data().as_ref().to_vec()).expect("utf-8"),
                output_id: None,
                group: r.partition_key().map(str::to_owned),
            })
            .collect()
    };
    sink_contract(&sink, read, false, true).await;
    client
        .delete_stream()
        .stream_name(&name)
        .send()
        .await
        .expect("delete stream");
}

async fn sqs_contract(queue_name: String) {
    let config = sdk_config().await;
    let client = aws_sdk_sqs::Client::new(&config);
    let url = create_queue(&client, &queue_name).await;
    let sink = SqsSink::new(Arc::new(SdkSqs::new(client.clone())), &url);
    // Receiving deletes, so what was read is kept between calls.
    let seen: Arc<Mutex<Vec<Received>>> = Arc::default();
    let read = || {
        let (client, url, seen) = (client.clone(), url.clone(), seen.clone());
        async move {
            let fresh = drain_queue(&client, &url).await;
            let mut seen = seen.lock().unwrap();
            seen.extend(fresh.into_iter().map(|m| {
                Received {
                    body: m.body().unwrap_or_default().to_owned(),
                    output_id: m
                        .message_attributes()
                        .and_then(|a| a.get(OUTPUT_ID_ATTRIBUTE))
                        .and_then(|v| v.string_value())
                        .map(str::to_owned),
                    group: m
                        .attributes()
                        .and_then(|a| {
                            a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId)
                        })
                        .cloned(),
                }
            }));
            seen.clone()
        }
    };
    let fifo = queue_name.ends_with(".fifo");
    sink_contract(&sink, read, true, fifo).await;
    client
        .delete_queue()
        .queue_url(&url)
        .send()
        .await
        .expect("delete queue");
}

#[tokio::test]
async fn the_sqs_sink_keeps_the_sink_contract_on_an_emulated_standard_queue() {
    sqs_contract(unique_name("keyway-out")).await;
}

#[tokio::test]
async fn the_sqs_sink_keeps_the_sink_contract_on_an_emulated_fifo_queue() {
    sqs_contract(format!("{}.fifo", unique_name("keyway-out"))).await;
}
