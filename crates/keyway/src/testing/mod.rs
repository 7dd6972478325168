//! Contract suites for the ports, run on the in-memory adapters in `cargo test` and on the AWS
//! adapters against the emulator in the project's test command. An implementation that passes
//! its suite can stand in for the other.
//!
//! Each suite takes fresh resources (an empty table, an empty stream or queue) and panics with a
//! message on the first broken promise.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;

use crate::adapters::dynamodb::{
    DynamoStateStore, Expect, ItemKey, Table, WriteRequest, BATCH_GET_MAX, VERSION,
};
use crate::domain::{
    AttrValue, Item, KeyState, Origin, Output, OutputId, SequenceNumber, SlotData,
};
use crate::ports::{
    Clock, Commit, ManualClock, Namespace, Sink, SinkError, StateStore, StoreError,
};

fn item(pk: &str, sk: &str, version: u64, payload: &str) -> Item {
    let mut item = ItemKey {
        pk: pk.into(),
        sk: sk.into(),
    }
    .to_item();
    item.insert(VERSION.into(), AttrValue::N(version.to_string()));
    item.insert("payload".into(), AttrValue::S(payload.into()));
    item
}

fn key(pk: &str, sk: &str) -> ItemKey {
    ItemKey {
        pk: pk.into(),
        sk: sk.into(),
    }
}

/// The `Table` contract: conditional puts, batch reads and writes, limits, queries.
pub async fn table_contract<T: Table>(table: &T) {
    // A put conditional on absence succeeds once.
    table
        .put(item("a", "head", 1, "one"), Expect::Absent)
        .await
        .expect("first put on an absent key");
    assert_eq!(
        table
            .put(item("a", "head", 1, "again"), Expect::Absent)
            .await,
        Err(StoreError::Conflict),
        "a second put conditional on absence must conflict"
    );
    // A put conditional on the version read succeeds only at that version.
    table
        .put(item("a", "head", 2, "two"), Expect::Version(1))
        .await
        .expect("put at the version read");
    assert_eq!(
        table
            .put(item("a", "head", 3, "stale"), Expect::Version(1))
            .await,
        Err(StoreError::Conflict)
    );
    let got = table
        .get(&key("a", "head"))
        .await
        .unwrap()
        .expect("item a exists");
    assert_eq!(
        got["payload"],
        AttrValue::S("two".into()),
        "a failed condition must not write"
    );
    assert_eq!(
        table
            .put(item("missing", "head", 1, "x"), Expect::Version(1))
            .await,
        Err(StoreError::Conflict)
    );
    table
        .put(item("a", "head", 9, "any"), Expect::Anything)
        .await
        .expect("unconditional put");

    // Batch writes and reads, with missing keys simply absent from the answer.
    let writes: Vec<WriteRequest> = (0..25)
        .map(|i| WriteRequest::Put(item("b", &format!("s{i:02}"), 1, "x")))
        .collect();
    let mut left = table
        .batch_write(writes)
        .await
        .expect("25 puts in one batch");
    for _ in 0..20 {
        if left.is_empty() {
            break;
        }
        left = table
            .batch_write(left)
            .await
            .expect("retry unprocessed writes");
    }
    assert!(left.is_empty(), "unprocessed writes succeed when retried");
    let keys: Vec<ItemKey> = (0..BATCH_GET_MAX)
        .map(|i| key("b", &format!("s{i:02}")))
        .collect();
    let mut found = 0;
    let mut pending = keys;
    for _ in 0..20 {
        let out = table
            .batch_get(&pending)
            .await
            .expect("100 keys in one batch get");
        found += out.items.len();
        pending = out.unprocessed;
        if pending.is_empty() {
            break;
        }
    }
    assert_eq!(found, 25, "25 of the 100 keys exist");
    let queried = table.query_partition("b").await.expect("query");
    assert_eq!(queried.len(), 25, "a query returns the whole partition");
    assert!(queried.iter().all(|i| i["pk"] == AttrValue::S("b".into())));

    let deletes: Vec<WriteRequest> = (0..10)
        .map(|i| WriteRequest::Delete(key("b", &format!("s{i:02}"))))
        .collect();
    let mut left = table.batch_write(deletes).await.expect("deletes");
    while !left.is_empty() {
        left = table.batch_write(left).await.expect("retry deletes");
    }
    assert_eq!(
        table.query_partition("b").await.unwrap().len(),
        15,
        "deleted items are gone"
    );

    // Limits DynamoDB enforces.
    let too_many: Vec<ItemKey> = (0..BATCH_GET_MAX + 1)
        .map(|i| key("c", &i.to_string()))
        .collect();
    let err = table
        .batch_get(&too_many)
        .await
        .expect_err("101 keys in one batch get are refused");
    assert!(
        !err.is_retryable(),
        "a refused request is not retryable: {err}"
    );
    let mut big = item("c", "big", 1, "");
    big.insert("blob".into(), AttrValue::S("x".repeat(401 * 1024)));
    let err = table
        .put(big, Expect::Anything)
        .await
        .expect_err("an item over 400 KB is refused");
    assert!(!err.is_retryable(), "{err}");
    let dup = vec![
        WriteRequest::Put(item("c", "d", 1, "x")),
        WriteRequest::Put(item("c", "d", 1, "y")),
    ];
    assert!(
        table.batch_write(dup).await.is_err(),
        "a batch writing one key twice is refused"
    );
}

fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_owned()).expect("valid JSON")
}

fn seq(n: u64) -> SequenceNumber {
    SequenceNumber::parse(&n.to_string()).expect("digits")
}

fn state_with(slots: &[(&str, Vec<Box<RawValue>>)]) -> KeyState {
    let mut state = KeyState::default();
    for (name, entries) in slots {
        state.slots.insert(
            (*name).to_owned(),
            SlotData {
                segments: Vec::new(),
                entries: entries.clone(),
            },
        );
    }
    state
}

fn entries_of(state: &KeyState, slot: &str) -> Vec<String> {
    state
        .slots
        .get(slot)
        .map(|s| s.entries.iter().map(|e| e.get().to_owned()).collect())
        .unwrap_or_default()
}

async fn commit_one(
    store: &dyn StateStore,
    ns: &Namespace,
    key: &str,
    expected: u64,
    state: KeyState,
) -> Result<(), StoreError> {
    store
        .commit(
            ns,
            vec![Commit {
                key: key.into(),
                expected_version: expected,
                state,
            }],
        )
        .await
        .remove(0)
}

/// The `StateStore` contract, on a `DynamoStateStore` over any table whose clock is `clock`.
pub async fn state_store_contract<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    clock: Arc<ManualClock>,
) {
    let ns = Namespace {
        operator: "contract".into(),
        signature: "0123456789abcdef".into(),
    };

    // An absent key loads empty at version 0.
    let loaded = store.load(&ns, &["k1".into()]).await.expect("load");
    assert_eq!(loaded["k1"].version, 0);
    assert!(loaded["k1"].slots.is_empty());

    // A commit stores slots, watermarks and outbox, and bumps the version.
    let mut state = state_with(&[
        ("count", vec![raw("41")]),
        ("seen", vec![raw(r#"["a",1]"#), raw(r#"["b",2]"#)]),
    ]);
    state.advance(&Origin("s/shardId-0".into()), &seq(17), clock.now_millis());
    state.outbox.push(Output {
        id: OutputId::derive(&Origin("s/shardId-0".into()), &seq(17), 0),
        sink: "out".into(),
        partition_key: "k1".into(),
        body: "{\"n\":41}".into(),
    });
    commit_one(store, &ns, "k1", 0, state.clone())
        .await
        .expect("first commit");
    let loaded = store.load(&ns, &["k1".into()]).await.expect("load");
    let k1 = &loaded["k1"];
    assert_eq!(k1.version, 1);
    assert_eq!(entries_of(k1, "count"), ["41"]);
    assert_eq!(entries_of(k1, "seen"), [r#"["a",1]"#, r#"["b",2]"#]);
    assert!(k1.has_applied(&Origin("s/shardId-0".into()), &seq(17)));
    assert_eq!(k1.outbox, state.outbox);

    // A commit at a stale version conflicts and changes nothing.
    let stale = state_with(&[("count", vec![raw("999")])]);
    assert_eq!(
        commit_one(store, &ns, "k1", 0, stale.clone()).await,
        Err(StoreError::Conflict)
    );
    let loaded = store.load(&ns, &["k1".into()]).await.unwrap();
    assert_eq!(
        entries_of(&loaded["k1"], "count"),
        ["41"],
        "a conflicting commit must not write"
    );

    // Other namespaces (another operator, another signature) see nothing of it.
    let other = Namespace {
        operator: "contract".into(),
        signature: "fedcba9876543210".into(),
    };
    assert_eq!(
        store.load(&other, &["k1".into()]).await.unwrap()["k1"].version,
        0
    );

    // Many keys load in one call of the store (more than one BatchGetItem).
    let keys: Vec<String> = (0..250).map(|i| format!("many-{i}")).collect();
    let commits = keys
        .iter()
        .map(|k| Commit {
            key: k.clone(),
            expected_version: 0,
            state: state_with(&[("count", vec![raw(&format!("\"{k}\""))])]),
        })
        .collect();
    assert!(
        store.commit(&ns, commits).await.iter().all(Result::is_ok),
        "250 independent commits"
    );
    let loaded = store.load(&ns, &keys).await.expect("load 250 keys");
    assert_eq!(loaded.len(), 250);
    for k in &keys {
        assert_eq!(entries_of(&loaded[k], "count"), [format!("\"{k}\"")]);
    }

    // A list of 10,000 entries of 2 KB (20 MB, fifty times DynamoDB's item limit) stores and loads.
    let entry = |i: usize| raw(&format!("\"{i:05}{}\"", "x".repeat(2043)));
    let big: Vec<Box<RawValue>> = (0..10_000).map(entry).collect();
    commit_one(store, &ns, "big", 0, state_with(&[("buffer", big)]))
        .await
        .expect("commit a 20 MB list");
    let loaded = store
        .load(&ns, &["big".into()])
        .await
        .expect("load a 20 MB list");
    let list = &loaded["big"].slots["buffer"];
    assert_eq!(list.entries.len(), 10_000);
    assert!(
        list.entries
            .iter()
            .enumerate()
            .all(|(i, e)| e.get().starts_with(&format!("\"{i:05}"))),
        "order kept"
    );
    let segments_before = list.segments.clone();
    assert!(
        !segments_before.is_empty(),
        "a 20 MB list lives in segments"
    );

    // Appending keeps every segment and writes only the new entries.
    let mut grown = loaded["big"].clone();
    grown
        .slots
        .get_mut("buffer")
        .unwrap()
        .entries
        .push(entry(10_000));
    commit_one(store, &ns, "big", 1, grown)
        .await
        .expect("append");
    let loaded = store.load(&ns, &["big".into()]).await.unwrap();
    let list = &loaded["big"].slots["buffer"];
    assert_eq!(list.entries.len(), 10_001);
    assert_eq!(
        list.segments, segments_before,
        "an append must not rewrite segments"
    );

    // Replacing the list retires its segments; the next commit deletes them.
    let head_pk = DynamoStateStore::<T>::head_key(&ns, "big").pk;
    let mut replaced = loaded["big"].clone();
    let old = replaced.slots.remove("buffer").unwrap();
    replaced
        .retired
        .extend(old.segments.iter().map(|s| ("buffer".to_owned(), s.id)));
    replaced.slots.insert(
        "buffer".into(),
        SlotData {
            segments: Vec::new(),
            entries: vec![raw("1")],
        },
    );
    commit_one(store, &ns, "big", 2, replaced)
        .await
        .expect("replace");
    let loaded = store.load(&ns, &["big".into()]).await.unwrap();
    assert_eq!(entries_of(&loaded["big"], "buffer"), ["1"]);
    assert_eq!(
        loaded["big"].garbage.len(),
        segments_before.len(),
        "retired segments are listed as garbage"
    );
    commit_one(store, &ns, "big", 3, loaded["big"].clone())
        .await
        .expect("commit that collects garbage");
    let items = store.table().query_partition(&head_pk).await.unwrap();
    assert_eq!(
        items.len(),
        1,
        "only the head remains once garbage is collected"
    );
    assert!(store.load(&ns, &["big".into()]).await.unwrap()["big"]
        .garbage
        .is_empty());

    // State past its TTL loads empty but keeps its version, so it can be replaced.
    let mut expiring = state_with(&[("count", vec![raw("5")])]);
    let now_secs = clock.now_millis() / 1000;
    expiring.expires_at = Some(now_secs + 60);
    commit_one(store, &ns, "ttl", 0, expiring)
        .await
        .expect("commit with ttl");
    assert_eq!(
        entries_of(
            &store.load(&ns, &["ttl".into()]).await.unwrap()["ttl"],
            "count"
        ),
        ["5"]
    );
    clock.advance(61_000);
    let loaded = store.load(&ns, &["ttl".into()]).await.unwrap();
    assert!(
        loaded["ttl"].slots.is_empty(),
        "expired state is never returned"
    );
    assert_eq!(loaded["ttl"].version, 1);
    commit_one(
        store,
        &ns,
        "ttl",
        1,
        state_with(&[("count", vec![raw("1")])]),
    )
    .await
    .expect("replace expired state");
    let head = store
        .table()
        .get(&DynamoStateStore::<T>::head_key(&ns, "ttl"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        !head.contains_key(crate::adapters::dynamodb::TTL),
        "state without a TTL has no ttl attribute"
    );

    // A long key round-trips.
    let long_key = "k".repeat(3000);
    commit_one(
        store,
        &ns,
        &long_key,
        0,
        state_with(&[("count", vec![raw("3")])]),
    )
    .await
    .expect("long key");
    assert_eq!(
        entries_of(
            &store
                .load(&ns, std::slice::from_ref(&long_key))
                .await
                .unwrap()[&long_key],
            "count"
        ),
        ["3"]
    );
}

/// Messages a sink's destination received, as the contract reads them back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub body: String,
    pub output_id: Option<String>,
    /// The Kinesis partition key or the SQS FIFO group.
    pub group: Option<String>,
}

fn output(i: usize, body: String) -> Output {
    Output {
        id: OutputId::derive(
            &Origin("contract/shardId-0".into()),
            &seq(1000 + i as u64),
            0,
        ),
        sink: "contract".into(),
        partition_key: format!("key-{}", i % 3),
        body,
    }
}

/// The `Sink` contract. `read_back` returns what the destination holds, in arrival order.
pub async fn sink_contract<S, F, Fut>(sink: &S, read_back: F, expects_ids: bool)
where
    S: Sink + ?Sized,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Vec<Received>>,
{
    // Twenty-five messages: more than one SQS batch, in one call of the sink.
    let messages: Vec<Output> = (0..25)
        .map(|i| output(i, format!("{{\"n\":{i}}}")))
        .collect();
    let failed = sink.send(&messages).await;
    assert!(failed.is_empty(), "every message is sent: {failed:?}");
    let mut received = Vec::new();
    for _ in 0..50 {
        received = read_back().await;
        if received.len() >= 25 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut bodies: Vec<&str> = received.iter().map(|r| r.body.as_str()).collect();
    bodies.sort();
    let mut expected: Vec<&str> = messages.iter().map(|m| m.body.as_str()).collect();
    expected.sort();
    assert_eq!(bodies, expected, "every body arrives exactly once");
    if expects_ids {
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
        if !got.is_empty() {
            assert_eq!(got, sent, "messages of one key arrive in the order sent");
        }
    }

    // A message the destination can never take fails alone, as not retryable.
    let too_big = output(99, "x".repeat(1024 * 1024 + 1));
    let small = output(100, "{\"small\":true}".into());
    let failed = sink.send(&[too_big, small]).await;
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
