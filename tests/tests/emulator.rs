//! The AWS emulator suite: the port contracts on the AWS SDK adapters against a real emulator of
//! AWS's APIs, one test per promise, each on a table, stream or queue of its own (left to the
//! emulator, which the test command stops afterwards). Run by ./scripts/test (feature
//! `emulator`, `KEYWAY_TEST_ENDPOINT` set).
#![cfg(feature = "emulator")]

use std::sync::{Arc, Mutex};

use keyway::adapters::dynamodb::{DynamoStateStore, SdkTable};
use keyway::adapters::kinesis::{KinesisSink, SdkKinesis};
use keyway::adapters::sqs::{SdkSqs, SqsSink, OUTPUT_ID_ATTRIBUTE};
use keyway::ports::ManualClock;
use keyway_local::testing::{Received, SinkUnderTest, StoreUnderTest};
use keyway_tests::emulator::{
    create_queue, create_state_table, create_stream, create_table, drain_queue, read_stream,
    sdk_config, unique_name,
};

/// A fresh table on the emulator, through the SDK.
async fn sdk_table(prefix: &str) -> SdkTable {
    let client = aws_sdk_dynamodb::Client::new(&sdk_config().await);
    let name = unique_name(prefix);
    create_state_table(&client, &name).await;
    SdkTable::new(client, &name)
}

#[tokio::test]
async fn the_sdk_policy_table_keeps_the_policy_table_contract() {
    use dynamic_filter::subscription::{CONSUMER, SUBSCRIPTION};
    let client = aws_sdk_dynamodb::Client::new(&sdk_config().await);
    let name = unique_name("keyway-policies");
    create_table(&client, &name, (CONSUMER, SUBSCRIPTION)).await;
    let table = dynamic_filter::client::SdkPolicyTable::new(client, &name);
    dynamic_filter::local::policy_table_contract(&table).await;
}

mod sdk_table_on_the_emulator {
    keyway_local::table_contract_tests!(super::sdk_table("keyway-table"));
}

mod state_store_on_the_emulator {
    use super::*;

    keyway_local::state_store_contract_tests!(async {
        // The contract moves this clock past TTLs; the emulator's own TTL sweeper runs on wall
        // time, so the clock starts at the present.
        let clock = ManualClock::at(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64,
        );
        StoreUnderTest {
            store: DynamoStateStore::new(Arc::new(sdk_table("keyway-state").await), clock.clone()),
            clock,
        }
    });
}

/// A sink to a fresh two-shard stream on the emulator.
async fn emulated_stream() -> SinkUnderTest {
    let client = aws_sdk_kinesis::Client::new(&sdk_config().await);
    let name = unique_name("keyway-out");
    create_stream(&client, &name, 2).await;
    let sink = KinesisSink::new(Arc::new(SdkKinesis::new(client.clone())), &name);
    SinkUnderTest {
        sink: Box::new(sink),
        read_back: Box::new(move || {
            let (client, name) = (client.clone(), name.clone());
            Box::pin(async move {
                read_stream(&client, &name)
                    .await
                    .into_iter()
                    .map(|r| Received {
                        body: String::from_utf8(r.data().as_ref().to_vec()).expect("utf-8"),
                        output_id: None,
                        group: r.partition_key().map(str::to_owned),
                    })
                    .collect()
            })
        }),
        expects_ids: false,
        keeps_order: true,
    }
}

/// A sink to a fresh queue on the emulator, a FIFO queue if `fifo`.
async fn emulated_queue(fifo: bool) -> SinkUnderTest {
    let client = aws_sdk_sqs::Client::new(&sdk_config().await);
    let name = unique_name("keyway-out");
    let name = if fifo { format!("{name}.fifo") } else { name };
    let url = create_queue(&client, &name).await;
    let sink = SqsSink::new(Arc::new(SdkSqs::new(client.clone())), &url);
    // Receiving deletes, so what was read is kept between calls.
    let seen: Arc<Mutex<Vec<Received>>> = Arc::default();
    SinkUnderTest {
        sink: Box::new(sink),
        read_back: Box::new(move || {
            let (client, url, seen) = (client.clone(), url.clone(), seen.clone());
            Box::pin(async move {
                let fresh = drain_queue(&client, &url).await;
                let mut seen = seen.lock().unwrap();
                seen.extend(fresh.into_iter().map(received));
                seen.clone()
            })
        }),
        expects_ids: true,
        keeps_order: fifo,
    }
}

fn received(m: aws_sdk_sqs::types::Message) -> Received {
    Received {
        body: m.body().unwrap_or_default().to_owned(),
        output_id: m
            .message_attributes()
            .and_then(|a| a.get(OUTPUT_ID_ATTRIBUTE))
            .and_then(|v| v.string_value())
            .map(str::to_owned),
        group: m
            .attributes()
            .and_then(|a| a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId))
            .cloned(),
    }
}

mod kinesis_sink_on_the_emulator {
    keyway_local::sink_contract_tests!(super::emulated_stream());
}

mod sqs_sink_on_an_emulated_standard_queue {
    keyway_local::sink_contract_tests!(super::emulated_queue(false));
}

mod sqs_sink_on_an_emulated_fifo_queue {
    keyway_local::sink_contract_tests!(super::emulated_queue(true));
}
