//! The in-memory services' own limits and semantics, beyond what the port contracts check.

use std::sync::Arc;
use std::time::Duration;

use keyway::adapters::kinesis::{KinesisApi, PutEntry, PutOutcome};
use keyway::adapters::sqs::{SqsApi, SqsEntry, SqsOutcome};
use keyway_local::{Faults, LocalKinesis, LocalSqs, VirtualClock};

#[tokio::test(start_paused = true)]
async fn a_shard_takes_a_thousand_records_a_second_and_refuses_the_rest_as_throughput_exceeded() {
    let clock = VirtualClock::starting_at(1_767_225_600_000);
    let kinesis = LocalKinesis::new(clock, Faults::none()).with_write_limit();
    kinesis.create_stream("s", 1);
    let data = vec![b'x'; 10];
    let mut written = 0;
    let mut refused = 0;
    for _ in 0..3 {
        let entries: Vec<PutEntry> = (0..500)
            .map(|_| PutEntry {
                partition_key: "k",
                data: &data,
                explicit_hash_key: None,
            })
            .collect();
        for outcome in kinesis.put_records("s", &entries).await.unwrap() {
            match outcome {
                PutOutcome::Written { .. } => written += 1,
                PutOutcome::Failed { code, .. } => {
                    assert_eq!(code, "ProvisionedThroughputExceededException");
                    refused += 1;
                }
            }
        }
    }
    assert_eq!((written, refused), (1000, 500));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let entry = [PutEntry {
        partition_key: "k",
        data: &data,
        explicit_hash_key: None,
    }];
    assert!(
        matches!(
            kinesis.put_records("s", &entry).await.unwrap()[0],
            PutOutcome::Written { .. }
        ),
        "a new second, a new allowance"
    );
}

#[tokio::test(start_paused = true)]
async fn a_shard_takes_a_mebibyte_a_second() {
    let clock = VirtualClock::starting_at(1_767_225_600_000);
    let kinesis = LocalKinesis::new(clock, Faults::none()).with_write_limit();
    kinesis.create_stream("s", 1);
    let data = vec![b'x'; 300 * 1024];
    let entries: Vec<PutEntry> = (0..4)
        .map(|_| PutEntry {
            partition_key: "k",
            data: &data,
            explicit_hash_key: None,
        })
        .collect();
    let outcomes = kinesis.put_records("s", &entries).await.unwrap();
    let written = outcomes
        .iter()
        .filter(|o| matches!(o, PutOutcome::Written { .. }))
        .count();
    assert_eq!(
        written, 3,
        "three of 300 KiB fit a mebibyte, the fourth does not"
    );
}

#[tokio::test]
async fn an_explicit_hash_key_chooses_the_shard() {
    let kinesis = LocalKinesis::new(Arc::new(keyway::ports::SystemClock), Faults::none());
    kinesis.create_stream("s", 4);
    let top = u128::MAX.to_string();
    let entry = [PutEntry {
        partition_key: "any",
        data: b"d",
        explicit_hash_key: Some(&top),
    }];
    match &kinesis.put_records("s", &entry).await.unwrap()[0] {
        PutOutcome::Written { shard_id, .. } => assert_eq!(shard_id, "shardId-000000000003"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_fifo_queue_drops_a_deduplication_id_seen_in_the_last_five_minutes() {
    let clock = VirtualClock::starting_at(1_767_225_600_000);
    let sqs = LocalSqs::new(clock, Faults::none());
    let url = sqs.create_queue("out.fifo");
    let send = |body: &'static str| {
        let sqs = &sqs;
        let url = url.clone();
        async move {
            let entry = SqsEntry {
                id: "0",
                body,
                output_id: Some("id-1"),
                group_id: Some("g"),
                deduplication_id: Some("id-1"),
            };
            sqs.send_message_batch(&url, &[entry]).await.unwrap()
        }
    };
    assert!(matches!(send("first").await[0], SqsOutcome::Sent { .. }));
    tokio::time::sleep(Duration::from_secs(299)).await;
    assert!(
        matches!(send("again").await[0], SqsOutcome::Sent { .. }),
        "answered as sent"
    );
    assert_eq!(sqs.messages(&url).len(), 1, "but dropped");
    tokio::time::sleep(Duration::from_secs(2)).await;
    send("later").await;
    assert_eq!(
        sqs.messages(&url)
            .iter()
            .map(|m| m.body.as_str())
            .collect::<Vec<_>>(),
        ["first", "later"]
    );
}

#[tokio::test]
async fn a_batch_over_ten_entries_or_a_mebibyte_is_refused() {
    let sqs = LocalSqs::default();
    let url = sqs.create_queue("out");
    let body = "x".repeat(120 * 1024);
    let ids: Vec<String> = (0..11).map(|i| i.to_string()).collect();
    let entries: Vec<SqsEntry> = (0..11)
        .map(|i| SqsEntry {
            id: &ids[i],
            body: "b",
            output_id: None,
            group_id: None,
            deduplication_id: None,
        })
        .collect();
    assert!(sqs.send_message_batch(&url, &entries).await.is_err());
    let entries: Vec<SqsEntry> = (0..9)
        .map(|i| SqsEntry {
            id: &ids[i],
            body: &body,
            output_id: None,
            group_id: None,
            deduplication_id: None,
        })
        .collect();
    let err = sqs.send_message_batch(&url, &entries).await.unwrap_err();
    assert!(
        !err.is_retryable() && err.to_string().contains("BatchRequestTooLong"),
        "{err}"
    );
}
