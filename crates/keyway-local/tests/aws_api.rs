//! The AWS SDK adapters against the embedded runtime's AWS APIs (`keyway_local::AwsApi`), which
//! a function run as its own process (`keyway local --function ID=BOOTSTRAP`) calls: the same
//! contract suites the in-memory adapters (contracts.rs) and the emulator's (tests/emulator.rs)
//! keep, over HTTP, so that an external function's SDK calls do what in-process calls do.

use std::sync::Arc;

use aws_sdk_dynamodb::config::{Credentials, Region};
use keyway::adapters::dynamodb::{DynamoStateStore, SdkTable};
use keyway::adapters::kinesis::{KinesisSink, SdkKinesis};
use keyway::adapters::sqs::{SdkSqs, SqsSink};
use keyway::ports::ManualClock;
use keyway_local::testing::{Received, SinkUnderTest, StoreUnderTest};
use keyway_local::{AwsApi, FaultPlan, KeySchema, LocalServices};

/// Services on the real clock, served on a loopback port for as long as the test runs, and the
/// SDK's configuration for them.
async fn served() -> (Arc<LocalServices>, aws_config::SdkConfig) {
    let services = LocalServices::new(1_767_225_600_000, FaultPlan::all(0.0, 1));
    let api = AwsApi::start(services.clone())
        .await
        .expect("a loopback port");
    let config = keyway::lambda::aws::config_loader()
        .endpoint_url(&api.endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "local",
            "local",
            None,
            None,
            "keyway-tests",
        ))
        .load()
        .await;
    // The server's tasks end with the test's runtime.
    std::mem::forget(api);
    (services, config)
}

async fn sdk_table() -> SdkTable {
    let (services, config) = served().await;
    services.dynamodb.create_table(
        "keyway-state",
        KeySchema::state_table(),
        Some("ttl".into()),
        None,
    );
    SdkTable::new(aws_sdk_dynamodb::Client::new(&config), "keyway-state")
}

mod sdk_table_on_the_aws_api {
    keyway_local::table_contract_tests!(super::sdk_table());
}

mod state_store_on_the_aws_api {
    use super::*;

    keyway_local::state_store_contract_tests!(async {
        let clock = ManualClock::at(1_700_000_000_000);
        StoreUnderTest {
            store: DynamoStateStore::new(Arc::new(sdk_table().await), clock.clone()),
            clock,
        }
    });
}

async fn served_stream() -> SinkUnderTest {
    let (services, config) = served().await;
    services.kinesis.create_stream("out", 2);
    let client = aws_sdk_kinesis::Client::new(&config);
    SinkUnderTest {
        sink: Box::new(KinesisSink::new(Arc::new(SdkKinesis::new(client)), "out")),
        read_back: Box::new(move || {
            let records = services.kinesis.records("out");
            Box::pin(async move {
                records
                    .into_iter()
                    .map(|r| Received {
                        body: String::from_utf8(r.data.to_vec()).expect("utf-8"),
                        output_id: None,
                        group: Some(r.partition_key),
                    })
                    .collect()
            })
        }),
        expects_ids: false,
        keeps_order: true,
    }
}

mod kinesis_sink_on_the_aws_api {
    keyway_local::sink_contract_tests!(super::served_stream());
}

async fn served_queue(name: &'static str) -> SinkUnderTest {
    let (services, config) = served().await;
    let url = services.sqs.create_queue(name);
    let fifo = name.ends_with(".fifo");
    let client = aws_sdk_sqs::Client::new(&config);
    let read = url.clone();
    SinkUnderTest {
        sink: Box::new(SqsSink::new(Arc::new(SdkSqs::new(client)), &url)),
        read_back: Box::new(move || {
            let messages = services.sqs.messages(&read);
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

mod sqs_sink_on_the_aws_api_standard_queue {
    keyway_local::sink_contract_tests!(super::served_queue("out"));
}

mod sqs_sink_on_the_aws_api_fifo_queue {
    keyway_local::sink_contract_tests!(super::served_queue("out.fifo"));
}

#[tokio::test]
async fn an_operation_or_expression_it_does_not_serve_is_refused_by_name() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let (services, config) = served().await;
    services
        .dynamodb
        .create_table("t", KeySchema::state_table(), None, None);
    let client = aws_sdk_dynamodb::Client::new(&config);
    let refused = client
        .put_item()
        .table_name("t")
        .item("pk", AttributeValue::S("a".into()))
        .item("sk", AttributeValue::S("b".into()))
        .condition_expression("size(pk) > :n")
        .expression_attribute_values(":n", AttributeValue::N("1".into()))
        .send()
        .await
        .expect_err("size is not reproduced");
    let text = format!(
        "{:?}",
        aws_sdk_dynamodb::error::DisplayErrorContext(&refused)
    );
    assert!(
        text.contains("ValidationException") && text.contains("size"),
        "{text}"
    );
    let refused = client
        .describe_table()
        .table_name("t")
        .send()
        .await
        .expect_err("not served");
    let text = format!(
        "{:?}",
        aws_sdk_dynamodb::error::DisplayErrorContext(&refused)
    );
    assert!(text.contains("DescribeTable"), "{text}");
    let missing = client
        .get_item()
        .table_name("nope")
        .key("pk", AttributeValue::S("a".into()))
        .key("sk", AttributeValue::S("b".into()))
        .send()
        .await
        .expect_err("no such table");
    assert!(missing
        .into_service_error()
        .is_resource_not_found_exception());
}

#[tokio::test]
async fn a_query_reads_numbers_in_order_and_goes_on_after_a_start_key_that_is_gone() {
    use aws_sdk_dynamodb::types::AttributeValue;
    let (services, config) = served().await;
    let schema = KeySchema {
        hash: "p".into(),
        range: Some("n".into()),
    };
    let table = services
        .dynamodb
        .create_table("numbers", schema, None, None);
    for n in ["9", "10", "2"] {
        let item = keyway::domain::Item::from([
            ("p".to_owned(), keyway::domain::AttrValue::S("a".into())),
            ("n".to_owned(), keyway::domain::AttrValue::N(n.into())),
        ]);
        table.put_item(item).unwrap();
    }
    let client = aws_sdk_dynamodb::Client::new(&config);
    let query = || {
        client
            .query()
            .table_name("numbers")
            .key_condition_expression("p = :p")
            .expression_attribute_values(":p", AttributeValue::S("a".into()))
    };
    let numbers = |items: &[std::collections::HashMap<String, AttributeValue>]| -> Vec<String> {
        items
            .iter()
            .map(|i| i["n"].as_n().unwrap().clone())
            .collect()
    };
    let first = query().limit(2).send().await.unwrap();
    assert_eq!(numbers(first.items()), ["2", "9"], "by value, not as text");
    let start = first.last_evaluated_key().unwrap().clone();
    client
        .delete_item()
        .table_name("numbers")
        .set_key(Some(start.clone()))
        .send()
        .await
        .unwrap();
    let rest = query()
        .set_exclusive_start_key(Some(start))
        .send()
        .await
        .unwrap();
    assert_eq!(
        numbers(rest.items()),
        ["10"],
        "after the deleted item's place"
    );
    let backwards = query().scan_index_forward(false).send().await.unwrap();
    assert_eq!(numbers(backwards.items()), ["10", "2"]);
}
