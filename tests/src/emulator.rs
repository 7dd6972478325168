//! The AWS emulator harness. The project's test command starts the emulator on a free loopback
//! port and sets `KEYWAY_TEST_ENDPOINT`; a test of the emulator suite without it fails, saying so,
//! rather than passing without having run.

use std::time::Duration;

use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TimeToLiveSpecification,
};
use rand::Rng;

/// The environment variable that holds the emulator's endpoint URL.
pub(crate) const ENDPOINT_VARIABLE: &str = "KEYWAY_TEST_ENDPOINT";

/// The emulator's endpoint; panics with the way to get one when it is not set.
pub fn endpoint() -> String {
    std::env::var(ENDPOINT_VARIABLE).unwrap_or_else(|_| {
        panic!(
            "{ENDPOINT_VARIABLE} is not set: the emulator suite needs a running AWS emulator. \
             Run ./scripts/test, which starts one and sets it."
        )
    })
}

/// SDK configuration for the emulator: fixed region, dummy credentials.
pub async fn sdk_config() -> aws_config::SdkConfig {
    keyway::lambda::aws::config_loader()
        .endpoint_url(endpoint())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "keyway-tests"))
        .load()
        .await
}

/// A random resource name, so that tests never share resources.
pub fn unique_name(prefix: &str) -> String {
    let suffix: u64 = rand::rng().random();
    format!("{prefix}-{suffix:016x}")
}

/// Creates a keyway state table (pk/sk strings, on demand, TTL on `ttl`) and waits until it is
/// active.
pub async fn create_state_table(client: &aws_sdk_dynamodb::Client, name: &str) {
    create_table(client, name, ("pk", "sk")).await;
    client
        .update_time_to_live()
        .table_name(name)
        .time_to_live_specification(
            TimeToLiveSpecification::builder()
                .enabled(true)
                .attribute_name("ttl")
                .build()
                .expect("ttl spec"),
        )
        .send()
        .await
        .expect("enable TTL");
}

/// Creates an on-demand table keyed by the strings `hash` and `range` and waits until it is
/// active.
pub async fn create_table(
    client: &aws_sdk_dynamodb::Client,
    name: &str,
    (hash, range): (&str, &str),
) {
    let attribute = |n: &str| {
        AttributeDefinition::builder()
            .attribute_name(n)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .expect("attribute")
    };
    let key = |n: &str, t: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(n)
            .key_type(t)
            .build()
            .expect("key")
    };
    client
        .create_table()
        .table_name(name)
        .attribute_definitions(attribute(hash))
        .attribute_definitions(attribute(range))
        .key_schema(key(hash, KeyType::Hash))
        .key_schema(key(range, KeyType::Range))
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("create table");
    for _ in 0..100 {
        let status = client
            .describe_table()
            .table_name(name)
            .send()
            .await
            .expect("describe table");
        if status
            .table()
            .and_then(|t| t.table_status())
            .map(|s| s.as_str())
            == Some("ACTIVE")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a Kinesis stream and waits until it is active.
pub async fn create_stream(client: &aws_sdk_kinesis::Client, name: &str, shards: i32) {
    client
        .create_stream()
        .stream_name(name)
        .shard_count(shards)
        .send()
        .await
        .expect("create stream");
    for _ in 0..100 {
        let summary = client
            .describe_stream_summary()
            .stream_name(name)
            .send()
            .await
            .expect("describe stream");
        if summary
            .stream_description_summary()
            .map(|d| d.stream_status().as_str())
            == Some("ACTIVE")
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("stream {name} did not become active");
}

/// Every record of every shard of `stream`, shard by shard.
pub async fn read_stream(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
) -> Vec<aws_sdk_kinesis::types::Record> {
    let shards = client
        .list_shards()
        .stream_name(stream)
        .send()
        .await
        .expect("list shards");
    let mut records = Vec::new();
    for shard in shards.shards() {
        let iterator = client
            .get_shard_iterator()
            .stream_name(stream)
            .shard_id(shard.shard_id())
            .shard_iterator_type(aws_sdk_kinesis::types::ShardIteratorType::TrimHorizon)
            .send()
            .await
            .expect("shard iterator");
        let mut next = iterator.shard_iterator().map(str::to_owned);
        while let Some(it) = next {
            let page = client
                .get_records()
                .shard_iterator(it)
                .send()
                .await
                .expect("get records");
            if page.records().is_empty() {
                break;
            }
            records.extend(page.records().iter().cloned());
            next = page.next_shard_iterator().map(str::to_owned);
        }
    }
    records
}

/// Creates an SQS queue (FIFO when the name ends with `.fifo`) and returns its URL.
pub async fn create_queue(client: &aws_sdk_sqs::Client, name: &str) -> String {
    let mut request = client.create_queue().queue_name(name);
    if name.ends_with(".fifo") {
        request = request.attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true");
    }
    request
        .send()
        .await
        .expect("create queue")
        .queue_url()
        .expect("queue url")
        .to_owned()
}

/// Receives (and deletes) what the queue holds right now.
pub async fn drain_queue(
    client: &aws_sdk_sqs::Client,
    url: &str,
) -> Vec<aws_sdk_sqs::types::Message> {
    let mut messages = Vec::new();
    loop {
        let page = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
            .send()
            .await
            .expect("receive");
        if page.messages().is_empty() {
            return messages;
        }
        for m in page.messages() {
            if let Some(handle) = m.receipt_handle() {
                client
                    .delete_message()
                    .queue_url(url)
                    .receipt_handle(handle)
                    .send()
                    .await
                    .expect("delete message");
            }
        }
        messages.extend(page.messages().iter().cloned());
    }
}
