//! The `Sink` contract: every message once with its id, a key's order where the destination
//! keeps one, and a message the destination refuses failing alone. One function per promise;
//! `sink_contract_tests!` makes a test of each.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;

use super::output;
use keyway::domain::Output;
use keyway::ports::{Deadline, Sink, SinkError};

/// Messages a sink's destination received, as the contract reads them back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// The message's body.
    pub body: String,
    /// The output id the destination kept with it, if it keeps one.
    pub output_id: Option<String>,
    /// The Kinesis partition key or the SQS FIFO group.
    pub group: Option<String>,
}

impl Received {
    /// A message of an in-memory queue; a FIFO queue deduplicates by the output id, which it
    /// keeps as the deduplication id.
    pub fn queued(message: crate::QueuedMessage, fifo: bool) -> Self {
        Self {
            body: message.body,
            output_id: match fifo {
                true => message.deduplication_id,
                false => message.output_id,
            },
            group: message.group_id,
        }
    }
}

/// A sink to check, with how to read back what its destination holds (in arrival order).
pub struct SinkUnderTest {
    /// The sink the promises are checked on.
    pub sink: Box<dyn Sink>,
    /// Reads back what its destination holds.
    pub read_back: ReadBack,
    /// The destination keeps each message's output id.
    pub expects_ids: bool,
    /// The destination keeps a key's order (a stream, a FIFO queue), which the sink then must
    /// keep too.
    pub keeps_order: bool,
}

/// What a sink's destination holds, read back.
pub(crate) type ReadBack = Box<dyn Fn() -> BoxFuture<'static, Vec<Received>> + Send + Sync>;

/// The promises of the `Sink` contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinkPromise {
    /// Every message of a call arrives exactly once, with its output id where the destination
    /// keeps ids.
    EveryMessageOnce,
    /// A key's messages arrive in the order sent where the destination keeps order, and the sink
    /// says whether it does.
    KeyOrder,
    /// A message the destination can never take fails alone, as not retryable.
    RefusedMessageFailsAlone,
}

impl SinkPromise {
    /// Every promise of the contract, in the order `sink_contract` checks them.
    pub const ALL: [Self; 3] = [
        Self::EveryMessageOnce,
        Self::KeyOrder,
        Self::RefusedMessageFailsAlone,
    ];
}

/// Whether the sink keeps `promise`; panics with the broken promise otherwise. Each promise sends
/// messages of its own, so that they run on one destination in any order.
pub async fn keep_sink_promise(promise: SinkPromise, under: &SinkUnderTest) {
    match promise {
        SinkPromise::EveryMessageOnce => every_message_once(under).await,
        SinkPromise::KeyOrder => key_order(under).await,
        SinkPromise::RefusedMessageFailsAlone => refused_message_fails_alone(under).await,
    }
}

/// The whole `Sink` contract, promise after promise, on one destination.
pub async fn sink_contract(under: &SinkUnderTest) {
    for promise in SinkPromise::ALL {
        keep_sink_promise(promise, under).await;
    }
}

/// Twenty-five messages of `promise` (more than one SQS batch), sent in one call of the sink;
/// returns them and what arrived of them.
async fn send_25(
    under: &SinkUnderTest,
    promise: &str,
    first: usize,
) -> (Vec<Output>, Vec<Received>) {
    let messages: Vec<Output> = (first..first + 25)
        .map(|i| output(i, format!("{{\"promise\":\"{promise}\",\"n\":{i}}}")))
        .collect();
    let failed = under.sink.send(&messages, Deadline::NONE).await;
    assert!(failed.is_empty(), "every message is sent: {failed:?}");
    let ours = |r: &Received| r.body.contains(&format!("\"promise\":\"{promise}\""));
    let mut received = Vec::new();
    for _ in 0..50 {
        received = (under.read_back)().await.into_iter().filter(ours).collect();
        if received.len() >= messages.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (messages, received)
}

async fn every_message_once(under: &SinkUnderTest) {
    let (messages, received) = send_25(under, "once", 0).await;
    let mut bodies: Vec<&str> = received.iter().map(|r| r.body.as_str()).collect();
    bodies.sort();
    let mut expected: Vec<&str> = messages.iter().map(|m| m.body.as_str()).collect();
    expected.sort();
    assert_eq!(bodies, expected, "every body arrives exactly once");
    if under.expects_ids {
        let by_body: BTreeMap<&str, &Option<String>> = received
            .iter()
            .map(|r| (r.body.as_str(), &r.output_id))
            .collect();
        for m in &messages {
            assert_eq!(
                by_body[m.body.as_str()].as_deref(),
                Some(m.id.as_str()),
                "a message carries its output id"
            );
        }
    }
}

async fn key_order(under: &SinkUnderTest) {
    let (messages, received) = send_25(under, "order", 200).await;
    if under.keeps_order {
        for key in ["key-0", "key-1", "key-2"] {
            let sent: Vec<&str> = messages
                .iter()
                .filter(|m| m.partition_key == key)
                .map(|m| m.body.as_str())
                .collect();
            let got: Vec<&str> = received
                .iter()
                .filter(|r| r.group.as_deref() == Some(key))
                .map(|r| r.body.as_str())
                .collect();
            assert_eq!(got, sent, "messages of one key arrive in the order sent");
        }
        order_of_is_the_key_sent(under).await;
    }
    assert_eq!(
        under.sink.ordered(),
        under.keeps_order,
        "the sink says whether the executor must keep a key's order for it"
    );
}

/// Keys a destination cannot take as they are (too long, not ASCII) are sent as another key:
/// `Sink::order_of` names the one sent, which the executor keeps order by.
async fn order_of_is_the_key_sent(under: &SinkUnderTest) {
    let keys = ["k".repeat(300), "ü".repeat(100)];
    let messages: Vec<Output> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| Output {
            partition_key: key.clone(),
            ..output(300 + i, format!("{{\"promise\":\"order-of\",\"n\":{i}}}"))
        })
        .collect();
    let failed = under.sink.send(&messages, Deadline::NONE).await;
    assert!(failed.is_empty(), "every message is sent: {failed:?}");
    let mut received = Vec::new();
    for _ in 0..50 {
        received = (under.read_back)()
            .await
            .into_iter()
            .filter(|r| r.body.contains("\"promise\":\"order-of\""))
            .collect();
        if received.len() >= messages.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (i, key) in keys.iter().enumerate() {
        let body = &messages[i].body;
        let got = received.iter().find(|r| &r.body == body);
        assert_eq!(
            got.and_then(|r| r.group.as_deref()),
            Some(under.sink.order_of(key).as_ref()),
            "the key a message of key {:?}… is sent under is the one the sink orders by",
            key.chars().next()
        );
    }
}

async fn refused_message_fails_alone(under: &SinkUnderTest) {
    let too_big = output(99, "x".repeat(1024 * 1024 + 1));
    let small = output(100, "{\"promise\":\"refused\"}".into());
    let failed = under.sink.send(&[too_big, small], Deadline::NONE).await;
    assert_eq!(
        failed.len(),
        1,
        "only the oversized message fails: {failed:?}"
    );
    assert_eq!(failed[0].0, 0);
    assert!(
        matches!(failed[0].1, SinkError::Rejected(_)),
        "{:?}",
        failed[0].1
    );
    assert!(!failed[0].1.is_retryable());
}
