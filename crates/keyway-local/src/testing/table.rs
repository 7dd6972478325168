//! The `Table` contract: conditional puts, updates, batch reads and writes, queries, and the limits
//! DynamoDB enforces. One function per promise; `table_contract_tests!` makes a test of each.

use super::{item, key};
use keyway::adapters::dynamodb::{Expect, ItemKey, Table, WriteRequest, BATCH_GET_MAX};
use keyway::domain::{AttrValue, Item};
use keyway::ports::StoreError;

/// The promises of the `Table` contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TablePromise {
    /// A put conditional on absence or on a version writes only then.
    ConditionalPuts,
    /// An update sets attributes, keeps the others and is conditional like a put.
    Updates,
    /// A put that raises a string attribute never lowers it.
    RaisingPuts,
    /// Batch writes, batch reads and queries see every item once, in sort key order.
    BatchesAndQueries,
    /// Requests over DynamoDB's limits are refused as not retryable.
    Limits,
    /// A partition reads as an ordered log: the items after a sort key, and the last one.
    LogQueries,
    /// A scan, page after page, finds every item of a partition key prefix and sort key once.
    Scans,
}

impl TablePromise {
    /// Every promise of the contract, in the order `table_contract` checks them.
    pub const ALL: [Self; 7] = [
        Self::ConditionalPuts,
        Self::Updates,
        Self::RaisingPuts,
        Self::BatchesAndQueries,
        Self::Limits,
        Self::LogQueries,
        Self::Scans,
    ];
}

/// Whether `table` keeps `promise`; panics with the broken promise otherwise. Each promise writes
/// keys of its own, so that they run on one table in any order.
pub async fn keep_table_promise<T: Table>(promise: TablePromise, table: &T) {
    match promise {
        TablePromise::ConditionalPuts => conditional_puts(table).await,
        TablePromise::Updates => updates(table).await,
        TablePromise::RaisingPuts => raising_puts(table).await,
        TablePromise::BatchesAndQueries => batches_and_queries(table).await,
        TablePromise::Limits => limits(table).await,
        TablePromise::LogQueries => log_queries(table).await,
        TablePromise::Scans => scans(table).await,
    }
}

/// The whole `Table` contract, promise after promise, on one table.
pub async fn table_contract<T: Table>(table: &T) {
    for promise in TablePromise::ALL {
        keep_table_promise(promise, table).await;
    }
}

async fn conditional_puts<T: Table>(table: &T) {
    // A put conditional on absence succeeds once.
    table
        .put(&item("a", "head", 1, "one"), &Expect::Absent)
        .await
        .expect("first put on an absent key");
    assert_eq!(
        table
            .put(&item("a", "head", 1, "again"), &Expect::Absent)
            .await,
        Err(StoreError::Conflict),
        "a second put conditional on absence must conflict"
    );
    // A put conditional on the version read succeeds only at that version.
    table
        .put(&item("a", "head", 2, "two"), &Expect::Version(1))
        .await
        .expect("put at the version read");
    assert_eq!(
        table
            .put(&item("a", "head", 3, "stale"), &Expect::Version(1))
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
            .put(&item("missing", "head", 1, "x"), &Expect::Version(1))
            .await,
        Err(StoreError::Conflict)
    );
    table
        .put(&item("a", "head", 9, "any"), &Expect::Anything)
        .await
        .expect("unconditional put");
}

async fn updates<T: Table>(table: &T) {
    // An update sets attributes, keeps the others, and creates an item with no version yet,
    // which a put conditional on absence may then replace.
    let mut pending = Item::new();
    pending.insert(
        "pd".into(),
        AttrValue::L(vec![AttrValue::S("seg#x#1".into())]),
    );
    table
        .update(&key("u", "head"), &pending, &Expect::Absent)
        .await
        .expect("update creates the item");
    assert_eq!(
        table.get(&key("u", "head")).await.unwrap().unwrap()["pd"],
        pending["pd"]
    );
    table
        .put(&item("u", "head", 1, "first"), &Expect::Absent)
        .await
        .expect("an item without a version counts as absent");
    let mut more = Item::new();
    more.insert("pd".into(), AttrValue::L(Vec::new()));
    assert_eq!(
        table
            .update(&key("u", "head"), &more, &Expect::Version(2))
            .await,
        Err(StoreError::Conflict),
        "an update conditional on another version changes nothing"
    );
    table
        .update(&key("u", "head"), &more, &Expect::Version(1))
        .await
        .expect("update at the version read");
    let updated = table.get(&key("u", "head")).await.unwrap().unwrap();
    assert_eq!(
        updated["payload"],
        AttrValue::S("first".into()),
        "other attributes stay"
    );
    assert_eq!(updated["pd"], AttrValue::L(Vec::new()));
}

async fn raising_puts<T: Table>(table: &T) {
    // A put that only raises a string attribute: on an absent item, over a lower value, never
    // over an equal or higher one.
    let raise = |value: &str| Expect::Raise {
        attribute: "payload",
        value: value.to_owned(),
    };
    table
        .put(&item("r", "wm", 1, "005"), &raise("005"))
        .await
        .expect("raise on an absent item");
    table
        .put(&item("r", "wm", 1, "007"), &raise("007"))
        .await
        .expect("raise over a lower value");
    for lower_or_equal in ["006", "007"] {
        assert_eq!(
            table
                .put(&item("r", "wm", 1, lower_or_equal), &raise(lower_or_equal))
                .await,
            Err(StoreError::Conflict),
            "{lower_or_equal} must not replace 007"
        );
    }
    assert_eq!(
        table.get(&key("r", "wm")).await.unwrap().unwrap()["payload"],
        AttrValue::S("007".into())
    );
}

async fn batches_and_queries<T: Table>(table: &T) {
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
    // Neighbouring partitions, one whose key starts with this one's: no part of it.
    for pk in ["a", "bb"] {
        let item = key(pk, "s00").to_item();
        table.put(&item, &Expect::Anything).await.expect("put");
    }
    let queried = table.query_partition("b").await.expect("query");
    assert_eq!(
        queried.len(),
        25,
        "a query returns the whole partition, and only it"
    );
    assert!(queried.iter().all(|i| i["pk"] == AttrValue::S("b".into())));
    // A query up to a sort key: in sort key order, none beyond it, at most the limit.
    let sort_keys = |items: Vec<Item>| -> Vec<String> {
        items
            .iter()
            .filter_map(|i| i["sk"].as_s().map(str::to_owned))
            .collect()
    };
    let first = table.query_up_to("b", "s24", 3).await.expect("query up to");
    assert_eq!(
        sort_keys(first),
        ["s00", "s01", "s02"],
        "the limit, in order"
    );
    let bounded = table.query_up_to("b", "s03~", 100).await.expect("query");
    assert_eq!(
        sort_keys(bounded),
        ["s00", "s01", "s02", "s03"],
        "nothing beyond the bound"
    );
    assert!(table.query_up_to("b", "r", 10).await.unwrap().is_empty());

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
}

async fn limits<T: Table>(table: &T) {
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
        .put(&big, &Expect::Anything)
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

async fn log_queries<T: Table>(table: &T) {
    let sort_keys = |items: Vec<Item>| -> Vec<String> {
        items
            .iter()
            .filter_map(|i| i["sk"].as_s().map(str::to_owned))
            .collect()
    };
    assert_eq!(
        table.query_last("log").await.expect("last of nothing"),
        None
    );
    // Sort keys of different lengths order as their bytes do; neighbouring partitions stay out.
    for sk in ["b", "ab", "a", "c"] {
        table
            .put(&key("log", sk).to_item(), &Expect::Anything)
            .await
            .expect("put");
    }
    for pk in ["lo", "log2"] {
        table
            .put(&key(pk, "z").to_item(), &Expect::Anything)
            .await
            .expect("put");
    }
    let all = table.query_after("log", "", 10).await.expect("query after");
    assert_eq!(
        sort_keys(all),
        ["a", "ab", "b", "c"],
        "the whole log, in order"
    );
    let after = table.query_after("log", "a", 2).await.expect("query after");
    assert_eq!(
        sort_keys(after),
        ["ab", "b"],
        "after a sort key, at most the limit"
    );
    let between = table
        .query_after("log", "aa", 10)
        .await
        .expect("query after");
    assert_eq!(
        sort_keys(between),
        ["ab", "b", "c"],
        "after a sort key no item has"
    );
    let none = table
        .query_after("log", "c", 10)
        .await
        .expect("query after");
    assert!(none.is_empty(), "nothing after the last");
    let last = table
        .query_last("log")
        .await
        .expect("last")
        .expect("an item");
    assert_eq!(last["sk"], AttrValue::S("c".into()));
}

async fn scans<T: Table>(table: &T) {
    // Partitions of the prefix, each with a head and other items; neighbours that must stay out.
    let mut expected = Vec::new();
    for n in 0..7 {
        let pk = format!("scan#{n}");
        for sk in ["head", "seg#1", "wm#a"] {
            table
                .put(&key(&pk, sk).to_item(), &Expect::Anything)
                .await
                .expect("put");
        }
        expected.push(pk);
    }
    for pk in ["scan", "sca#1", "other#scan#1"] {
        table
            .put(&key(pk, "head").to_item(), &Expect::Anything)
            .await
            .expect("put");
    }
    for limit in [1, 2, 5, 1000] {
        let (mut found, mut start, mut pages) = (Vec::new(), None, 0);
        loop {
            let page = table
                .scan_page("scan#", "head", start.as_ref(), limit)
                .await
                .expect("scan");
            for item in &page.items {
                let at = ItemKey::of(item).expect("a scanned item has its key");
                assert_eq!(at.sk, "head", "only the sort key asked for");
                found.push(at.pk);
            }
            pages += 1;
            assert!(pages < 1_000, "the scan never ends");
            match page.next {
                Some(next) => start = Some(next),
                None => break,
            }
        }
        found.sort();
        assert_eq!(
            found, expected,
            "each head of the prefix once, in pages of {limit}"
        );
    }
}
