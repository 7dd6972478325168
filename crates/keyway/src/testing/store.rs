//! The `StateStore` contract on a `DynamoStateStore` over any `Table`: commits conditional on the
//! version read, lists in segments, TTLs, outboxes, watermarks of many lineages, lost responses,
//! lost races, crashes inside a commit and the timer index. One function per promise;
//! `state_store_contract_tests!` makes a test of each.

use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;

use super::{output, seq};
use crate::adapters::dynamodb::{
    DynamoStateStore, Expect, ItemKey, Table, WriteRequest, TOKENS_KEPT,
};
use crate::domain::{Item, KeyState, Origin, SlotData, SlotUpdate};
use crate::ports::{
    Clock, Commit, Committed, LoadKey, ManualClock, Namespace, StateStore, StoreError, TimerIndex,
};

fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_owned()).expect("valid JSON")
}

fn state_with(slots: &[(&str, Vec<Box<RawValue>>)]) -> KeyState {
    let mut state = KeyState::default();
    for (name, entries) in slots {
        state
            .slots
            .insert((*name).to_owned(), SlotData::fresh(entries.clone()));
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
    state: KeyState,
) -> Result<Committed, StoreError> {
    let version = state.version;
    store
        .commit(ns, vec![Commit::new(key, version, state)])
        .await
        .remove(0)
}

async fn load_one(store: &dyn StateStore, ns: &Namespace, key: &str) -> KeyState {
    store
        .load(ns, &[key.to_owned()])
        .await
        .expect("load")
        .remove(key)
        .expect("every key asked for is answered")
}

/// Sort keys of the items under a key's partition, heads left out.
async fn stored_items<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    key: &str,
) -> Vec<String> {
    let pk = DynamoStateStore::<T>::head_key(ns, key).pk;
    let mut sks: Vec<String> = store
        .table()
        .query_partition(&pk)
        .await
        .expect("query")
        .iter()
        .filter_map(|i| i["sk"].as_s().map(str::to_owned))
        .filter(|sk| sk != "head")
        .collect();
    sks.sort();
    sks
}

fn watermark_at(millis: i64) -> impl Fn(u64) -> crate::domain::Watermark {
    move |n| crate::domain::Watermark {
        sequence: seq(n),
        at_millis: millis,
    }
}

/// Something that happens between a put landing and its lost response reaching the caller.
type Meanwhile = futures::future::BoxFuture<'static, ()>;

/// A table that loses the response of chosen puts: the put lands, the caller hears a timeout.
pub struct LosingResponses<T> {
    inner: Arc<T>,
    lose: std::sync::atomic::AtomicUsize,
    meanwhile: std::sync::Mutex<Option<Meanwhile>>,
    before_put: std::sync::Mutex<Option<Meanwhile>>,
}

impl<T> LosingResponses<T> {
    pub fn new(inner: Arc<T>) -> Self {
        Self {
            inner,
            lose: std::sync::atomic::AtomicUsize::new(0),
            meanwhile: std::sync::Mutex::new(None),
            before_put: std::sync::Mutex::new(None),
        }
    }

    /// `meanwhile` (another writer's commit, say) runs before the next put is made.
    pub fn before_next_put(&self, meanwhile: Meanwhile) {
        *self.before_put.lock().unwrap() = Some(meanwhile);
    }

    /// The next `n` puts that land report a timeout instead.
    pub fn lose_next(&self, n: usize) {
        self.lose.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// The next put that lands reports a timeout, and only once `meanwhile` (another writer's
    /// commit, say) has run.
    pub fn lose_next_while(&self, meanwhile: Meanwhile) {
        *self.meanwhile.lock().unwrap() = Some(meanwhile);
        self.lose_next(1);
    }
}

#[async_trait::async_trait]
impl<T: Table> Table for LosingResponses<T> {
    async fn scan_page(
        &self,
        pk_prefix: &str,
        sk: &str,
        start: Option<&ItemKey>,
        limit: usize,
    ) -> Result<crate::adapters::dynamodb::ScanPage, StoreError> {
        self.inner.scan_page(pk_prefix, sk, start, limit).await
    }

    async fn batch_get(
        &self,
        keys: &[ItemKey],
    ) -> Result<crate::adapters::dynamodb::BatchGetOutput, StoreError> {
        self.inner.batch_get(keys).await
    }

    async fn put(&self, item: &Item, expect: &Expect) -> Result<(), StoreError> {
        let before = self.before_put.lock().unwrap().take();
        if let Some(before) = before {
            before.await;
        }
        self.inner.put(item, expect).await?;
        let lost = self
            .lose
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            )
            .is_ok();
        if lost {
            let meanwhile = self.meanwhile.lock().unwrap().take();
            if let Some(meanwhile) = meanwhile {
                meanwhile.await;
            }
            return Err(StoreError::Unavailable("the response was lost".into()));
        }
        Ok(())
    }

    async fn update(
        &self,
        key: &ItemKey,
        attributes: &Item,
        expect: &Expect,
    ) -> Result<(), StoreError> {
        self.inner.update(key, attributes, expect).await
    }

    async fn batch_write(
        &self,
        requests: Vec<WriteRequest>,
    ) -> Result<Vec<WriteRequest>, StoreError> {
        self.inner.batch_write(requests).await
    }

    async fn get(&self, key: &ItemKey) -> Result<Option<Item>, StoreError> {
        self.inner.get(key).await
    }

    async fn query_partition(&self, pk: &str) -> Result<Vec<Item>, StoreError> {
        self.inner.query_partition(pk).await
    }
}

/// A `DynamoStateStore` to check, over a fresh table whose clock is `clock`.
pub struct StoreUnderTest<T: Table> {
    pub store: DynamoStateStore<T>,
    pub clock: Arc<ManualClock>,
}

/// The promises of the `StateStore` contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorePromise {
    /// A commit is conditional on the version read and a load sees what it stored.
    Basics,
    /// Lists far beyond the item limit store in segments, appends write only what is new.
    LargeLists,
    /// State past its TTL loads empty, and its segments outlive it.
    Expiry,
    /// An outbox is stored with the state and clearing it leaves no trace.
    Outboxes,
    /// A key fed by many lineages finds the watermark of each.
    ManyLineages,
    /// A head put whose response is lost counts as landed.
    LostResponses,
    /// A commit that loses the race for its key deletes the segments it wrote.
    LostRaces,
    /// A commit that dies between its segments and its head leaves nothing behind for good.
    CrashesInsideACommit,
    /// Timers come due in time order once their time has come, until forgotten.
    TimerIndex,
    /// The keys with state under a prefix list once each, page after page.
    KeyListing,
}

impl StorePromise {
    pub const ALL: [Self; 10] = [
        Self::Basics,
        Self::LargeLists,
        Self::Expiry,
        Self::Outboxes,
        Self::ManyLineages,
        Self::LostResponses,
        Self::LostRaces,
        Self::CrashesInsideACommit,
        Self::TimerIndex,
        Self::KeyListing,
    ];
}

/// Whether the store keeps `promise`; panics with the broken promise otherwise. Each promise
/// writes keys of its own, so that they run on one table in any order.
pub async fn keep_store_promise<T: Table + 'static>(
    promise: StorePromise,
    under: &StoreUnderTest<T>,
) {
    let (store, clock) = (&under.store, &*under.clock);
    let ns = Namespace {
        operator: "contract".into(),
        signature: "0123456789abcdef".into(),
    };
    match promise {
        StorePromise::Basics => basics(store, &ns, clock).await,
        StorePromise::LargeLists => large_lists(store, &ns).await,
        StorePromise::Expiry => expiry(store, &ns, clock).await,
        StorePromise::Outboxes => outboxes(store, &ns, clock).await,
        StorePromise::ManyLineages => many_lineages(store, &ns, clock).await,
        StorePromise::LostResponses => lost_responses(store, &ns, clock).await,
        StorePromise::LostRaces => lost_races(store, &ns, clock).await,
        StorePromise::CrashesInsideACommit => crashes_inside_a_commit(store, &ns, clock).await,
        StorePromise::TimerIndex => timer_index(store, clock).await,
        StorePromise::KeyListing => key_listing(store).await,
    }
}

async fn key_listing<T: Table + 'static>(store: &DynamoStateStore<T>) {
    // A namespace of its own: the listing sees every key of it.
    let ns = Namespace {
        operator: "listing".into(),
        signature: "0123456789abcdef".into(),
    };
    let long = format!("rows#{}", "x".repeat(1_500));
    let mut keys: Vec<String> = (0..25).map(|n| format!("rows#{n:02}")).collect();
    keys.push(long);
    for key in keys
        .iter()
        .chain([&"other#1".to_owned(), &"rows#gone".to_owned()])
    {
        commit_one(store, &ns, key, state_with(&[("row", vec![raw("1")])]))
            .await
            .expect("commit");
    }
    // A key whose state went (a deleted row keeps its head for its watermarks) is not listed.
    let mut gone = load_one(store, &ns, "rows#gone").await;
    gone.slots.clear();
    commit_one(store, &ns, "rows#gone", gone)
        .await
        .expect("commit");
    // Another namespace's keys stay out.
    let other = Namespace {
        operator: "listing2".into(),
        signature: ns.signature.clone(),
    };
    commit_one(
        store,
        &other,
        "rows#99",
        state_with(&[("row", vec![raw("1")])]),
    )
    .await
    .expect("commit");
    let (mut found, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let page = store
            .list_keys(&ns, "rows#", cursor.as_deref())
            .await
            .expect("list keys");
        found.extend(page.keys);
        pages += 1;
        assert!(pages < 10_000, "the listing never ends");
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    found.sort();
    keys.sort();
    assert_eq!(
        found, keys,
        "each key with state under the prefix once, long ones too"
    );
}

/// The whole `StateStore` contract, promise after promise, on one store.
pub async fn state_store_contract<T: Table + 'static>(under: &StoreUnderTest<T>) {
    for promise in StorePromise::ALL {
        keep_store_promise(promise, under).await;
    }
}

/// The due-time index of timers: entries come due in time order once their time has come, each
/// operator's apart, until forgotten; one due long ago is found however long no sweep ran.
async fn timer_index<T: Table + 'static>(store: &DynamoStateStore<T>, clock: &ManualClock) {
    let now = clock.now_millis();
    let minute = 60_000;
    let entry = |key: &str, at_millis: i64| crate::ports::TimerEntry {
        at_millis,
        key: key.to_owned(),
    };
    let keys = |due: &[crate::ports::DueTimer]| -> Vec<String> {
        due.iter().map(|d| d.timer.key.clone()).collect()
    };
    let entries = [
        entry("late", now + 180 * minute),
        entry("soon", now + minute),
        entry("later", now + 120 * minute),
        entry("past", now - 30 * minute),
    ];
    store
        .schedule_timers("timed", &entries, now)
        .await
        .expect("timers indexed");
    let due = store.due_timers("timed", now, 10).await.expect("due");
    assert_eq!(
        keys(&due),
        ["past"],
        "a timer set in the past is due at once"
    );
    assert!(
        store
            .due_timers("untimed", now + 999 * minute, 10)
            .await
            .unwrap()
            .is_empty(),
        "an operator sees only its own timers"
    );
    let all = store
        .due_timers("timed", now + 180 * minute, 10)
        .await
        .unwrap();
    assert_eq!(
        keys(&all),
        ["past", "soon", "later", "late"],
        "in time order"
    );
    let two = store
        .due_timers("timed", now + 180 * minute, 2)
        .await
        .unwrap();
    assert_eq!(keys(&two), ["past", "soon"], "at most the limit");
    store.forget_timers("timed", &two).await.expect("forgotten");
    let rest = store
        .due_timers("timed", now + 180 * minute, 10)
        .await
        .unwrap();
    assert_eq!(keys(&rest), ["later", "late"], "forgotten entries are gone");
    assert_eq!(rest[1].timer, entries[0]);
    store.forget_timers("timed", &rest).await.unwrap();
    // An entry postponed comes due again then, as the same timer, and not before. (Written by a
    // clock as late as the sweeps above: the index trusts writers to lag no more than minutes.)
    let t = now + 180 * minute;
    let again = entry("again", t + minute);
    store
        .schedule_timers("timed", std::slice::from_ref(&again), t)
        .await
        .unwrap();
    let due = store.due_timers("timed", t + minute, 10).await.unwrap();
    assert_eq!(due.len(), 1);
    store
        .postpone_timers("timed", &due, t + 5 * minute)
        .await
        .expect("postponed");
    let early = store.due_timers("timed", t + 4 * minute, 10).await.unwrap();
    assert!(early.is_empty(), "not due before its new time: {early:?}");
    let later = store.due_timers("timed", t + 5 * minute, 10).await.unwrap();
    assert_eq!(later.len(), 1, "one entry, not two");
    assert_eq!(later[0].timer, again);
    store.forget_timers("timed", &later).await.unwrap();
    // No sweep for four days, then one that reads a bounded number of hours each time.
    let long_ago = entry("long-ago", now + 200 * minute);
    store
        .schedule_timers("timed", std::slice::from_ref(&long_ago), now)
        .await
        .unwrap();
    let mut found = Vec::new();
    for _ in 0..3 {
        found.extend(
            store
                .due_timers("timed", now + 4 * 1440 * minute, 10)
                .await
                .unwrap(),
        );
    }
    assert_eq!(found.first().map(|d| &d.timer), Some(&long_ago));
}

/// A table whose process dies right after writing segments, before the head that references them.
struct CrashingAfterSegments<T>(Arc<T>);

#[async_trait::async_trait]
impl<T: Table> Table for CrashingAfterSegments<T> {
    async fn scan_page(
        &self,
        pk_prefix: &str,
        sk: &str,
        start: Option<&ItemKey>,
        limit: usize,
    ) -> Result<crate::adapters::dynamodb::ScanPage, StoreError> {
        self.0.scan_page(pk_prefix, sk, start, limit).await
    }

    async fn batch_get(
        &self,
        keys: &[ItemKey],
    ) -> Result<crate::adapters::dynamodb::BatchGetOutput, StoreError> {
        self.0.batch_get(keys).await
    }

    async fn put(&self, item: &Item, expect: &Expect) -> Result<(), StoreError> {
        self.0.put(item, expect).await
    }

    async fn update(
        &self,
        key: &ItemKey,
        attributes: &Item,
        expect: &Expect,
    ) -> Result<(), StoreError> {
        self.0.update(key, attributes, expect).await
    }

    async fn batch_write(
        &self,
        requests: Vec<WriteRequest>,
    ) -> Result<Vec<WriteRequest>, StoreError> {
        let puts = requests.iter().any(|r| matches!(r, WriteRequest::Put(_)));
        let left = self.0.batch_write(requests).await;
        if puts && left.as_ref().is_ok_and(Vec::is_empty) {
            crate::local::services::faults::crash();
        }
        left
    }

    async fn get(&self, key: &ItemKey) -> Result<Option<Item>, StoreError> {
        self.0.get(key).await
    }

    async fn query_partition(&self, pk: &str) -> Result<Vec<Item>, StoreError> {
        self.0.query_partition(pk).await
    }
}

/// Segment items under a key that its head neither references nor lists as garbage or pending:
/// storage nothing would ever free.
pub async fn orphans<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    key: &str,
) -> Vec<String> {
    let head_key = DynamoStateStore::<T>::head_key(ns, key);
    let items = store
        .table()
        .query_partition(&head_key.pk)
        .await
        .expect("query");
    let Some(head) = items.iter().find(|i| i["sk"].as_s() == Some("head")) else {
        return items
            .iter()
            .filter_map(|i| i["sk"].as_s().map(str::to_owned))
            .collect();
    };
    let accounted = DynamoStateStore::<T>::accounted_for(head);
    items
        .iter()
        .filter_map(|i| i["sk"].as_s())
        .filter(|sk| *sk != "head" && !sk.starts_with("wm#") && !accounted.contains(*sk))
        .map(str::to_owned)
        .collect()
}

async fn crashes_inside_a_commit<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    use futures::FutureExt as _;
    let crashing = DynamoStateStore::new(
        Arc::new(CrashingAfterSegments(store.table().clone())),
        ManualClock::at(clock.now_millis()) as Arc<dyn Clock>,
    );
    let entry = |i: usize| raw(&format!("\"{i:05}{}\"", "z".repeat(2043)));
    let list = |n: usize| -> Vec<Box<RawValue>> { (0..n).map(entry).collect() };
    // A key whose first commit writes segments, and one whose later commit does: both die
    // between their segments and their head.
    commit_one(
        store,
        ns,
        "crashed-later",
        state_with(&[("buffer", list(20))]),
    )
    .await
    .expect("a first commit");
    for key in ["crashed-first", "crashed-later"] {
        let mut state = load_one(store, ns, key).await;
        state
            .slots
            .insert("buffer".into(), SlotData::fresh(list(100)));
        let crashed = std::panic::AssertUnwindSafe(commit_one(&crashing, ns, key, state))
            .catch_unwind()
            .await;
        assert!(crashed.is_err(), "{key}: the commit died");
        assert!(
            !stored_items(store, ns, key).await.is_empty(),
            "{key}: its segments were written"
        );
        assert_eq!(
            orphans(store, ns, key).await,
            Vec::<String>::new(),
            "{key}: listed as pending"
        );
        // The redelivery commits again; the segments of the commit that died become garbage,
        // and the commit after collects them.
        let mut again = load_one(store, ns, key).await;
        again
            .slots
            .insert("buffer".into(), SlotData::fresh(list(3)));
        commit_one(store, ns, key, again)
            .await
            .expect("the redelivery commits");
        assert_eq!(
            orphans(store, ns, key).await,
            Vec::<String>::new(),
            "{key}: listed as garbage"
        );
        let after = load_one(store, ns, key).await;
        assert_eq!(after.slots["buffer"].entries.len(), 3);
        commit_one(store, ns, key, after)
            .await
            .expect("a commit that collects them");
        assert_eq!(
            stored_items(store, ns, key).await,
            Vec::<String>::new(),
            "{key}: nothing is left of the commit that died"
        );
    }
}

async fn basics<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    // An absent key loads empty at version 0.
    let k1 = load_one(store, ns, "k1").await;
    assert_eq!(k1.version, 0);
    assert!(k1.slots.is_empty());

    // A commit stores slots, watermarks and outbox, and bumps the version.
    let lineage = Origin("s/shardId-0/k1".into());
    let mut state = state_with(&[
        ("count", vec![raw("41")]),
        ("seen", vec![raw(r#"["a",1]"#), raw(r#"["b",2]"#)]),
    ]);
    state
        .watermarks
        .advance(&lineage, &seq(17), clock.now_millis());
    state.outbox.push(output(17, "{\"n\":41}".into()));
    let committed = commit_one(store, ns, "k1", state.clone())
        .await
        .expect("first commit");
    assert_eq!(committed.version, 1);
    let k1 = load_one(store, ns, "k1").await;
    assert_eq!(k1.version, 1);
    assert_eq!(entries_of(&k1, "count"), ["41"]);
    assert_eq!(entries_of(&k1, "seen"), [r#"["a",1]"#, r#"["b",2]"#]);
    assert!(k1.watermarks.has_applied(&lineage, &seq(17), None));
    assert_eq!(k1.outbox, state.outbox);

    // A commit at a stale version conflicts and changes nothing.
    let stale = state_with(&[("count", vec![raw("999")])]);
    assert_eq!(
        commit_one(store, ns, "k1", stale).await.map(|c| c.version),
        Err(StoreError::Conflict)
    );
    assert_eq!(
        entries_of(&load_one(store, ns, "k1").await, "count"),
        ["41"],
        "a conflicting commit must not write"
    );

    // Other namespaces (another operator, another signature) see nothing of it.
    let other = Namespace {
        operator: "contract".into(),
        signature: "fedcba9876543210".into(),
    };
    assert_eq!(load_one(store, &other, "k1").await.version, 0);

    // Many keys load in one call of the store (more than one BatchGetItem).
    let keys: Vec<String> = (0..250).map(|i| format!("many-{i}")).collect();
    let commits = keys
        .iter()
        .map(|k| {
            Commit::new(
                k.clone(),
                0,
                state_with(&[("count", vec![raw(&format!("\"{k}\""))])]),
            )
        })
        .collect();
    assert!(
        store.commit(ns, commits).await.iter().all(Result::is_ok),
        "250 independent commits"
    );
    let loaded = store.load(ns, &keys).await.expect("load 250 keys");
    assert_eq!(loaded.len(), 250);
    for k in &keys {
        assert_eq!(entries_of(&loaded[k], "count"), [format!("\"{k}\"")]);
    }

    // A long key round-trips.
    let long_key = "k".repeat(3000);
    commit_one(
        store,
        ns,
        &long_key,
        state_with(&[("count", vec![raw("3")])]),
    )
    .await
    .expect("long key");
    assert_eq!(
        entries_of(&load_one(store, ns, &long_key).await, "count"),
        ["3"]
    );
}

async fn large_lists<T: Table + 'static>(store: &DynamoStateStore<T>, ns: &Namespace) {
    // An entry of exactly the size the store says it holds is stored, under the item limit.
    let limit = store.limits().max_entry_bytes;
    let largest = raw(&format!("\"{}\"", "y".repeat(limit - 2)));
    commit_one(store, ns, "largest", state_with(&[("v", vec![largest])]))
        .await
        .expect("an entry of the store's limit commits");
    let loaded = load_one(store, ns, "largest").await;
    assert_eq!(loaded.slots["v"].entries[0].get().len(), limit);

    // A list of 10,000 entries of 2 KB (20 MB, fifty times DynamoDB's item limit) stores and loads.
    let entry = |i: usize| raw(&format!("\"{i:05}{}\"", "x".repeat(2043)));
    let big: Vec<Box<RawValue>> = (0..10_000).map(entry).collect();
    commit_one(store, ns, "big", state_with(&[("buffer", big)]))
        .await
        .expect("commit a 20 MB list");
    let loaded = load_one(store, ns, "big").await;
    let list = &loaded.slots["buffer"];
    assert_eq!(list.entries.len(), 10_000);
    assert!(
        list.entries
            .iter()
            .enumerate()
            .all(|(i, e)| e.get().starts_with(&format!("\"{i:05}"))),
        "order kept"
    );
    let segments_before = stored_items(store, ns, "big").await;
    // Segments are filled up to their target size: 20 MB in 256 KB segments.
    assert!(
        (50..=100).contains(&segments_before.len()),
        "a 20 MB list lives in some 80 segments: {}",
        segments_before.len()
    );

    // Appending keeps every segment and writes only the new entries.
    let mut grown = loaded.clone();
    grown
        .slots
        .get_mut("buffer")
        .unwrap()
        .entries
        .push(entry(10_000));
    commit_one(store, ns, "big", grown).await.expect("append");
    let loaded = load_one(store, ns, "big").await;
    assert_eq!(loaded.slots["buffer"].entries.len(), 10_001);
    let after_append = stored_items(store, ns, "big").await;
    assert!(
        segments_before.iter().all(|sk| after_append.contains(sk)),
        "an append must not rewrite segments"
    );

    // Keeping the first half (as a store may be handed any prefix) keeps the segments that lie
    // wholly within it and rewrites the rest.
    let mut halved = loaded.clone();
    halved.slots.get_mut("buffer").unwrap().apply(SlotUpdate {
        keep: 5_000,
        tail: vec![raw("\"tail\"")],
    });
    commit_one(store, ns, "big", halved).await.expect("halve");
    let loaded = load_one(store, ns, "big").await;
    let entries = &loaded.slots["buffer"].entries;
    assert_eq!(entries.len(), 5_001);
    assert!(entries[..5_000]
        .iter()
        .enumerate()
        .all(|(i, e)| e.get().starts_with(&format!("\"{i:05}"))));
    assert_eq!(entries[5_000].get(), "\"tail\"");

    // Replacing the list leaves its segments unreferenced; the next commit deletes them.
    let mut replaced = loaded.clone();
    replaced.slots.get_mut("buffer").unwrap().apply(SlotUpdate {
        keep: 0,
        tail: vec![raw("1")],
    });
    commit_one(store, ns, "big", replaced)
        .await
        .expect("replace");
    let loaded = load_one(store, ns, "big").await;
    assert_eq!(entries_of(&loaded, "buffer"), ["1"]);
    commit_one(store, ns, "big", loaded)
        .await
        .expect("commit that collects garbage");
    assert_eq!(
        stored_items(store, ns, "big").await,
        Vec::<String>::new(),
        "only the head remains once garbage is collected"
    );
}

async fn expiry<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    // Slots past their TTL load empty but keep the version, the watermarks and the outbox.
    let lineage = Origin("s/shardId-0/ttl".into());
    let mut expiring = state_with(&[("count", vec![raw("5")])]);
    let now_secs = clock.now_millis() / 1000;
    expiring.expires_at = Some(now_secs + 60);
    expiring
        .watermarks
        .advance(&lineage, &seq(5), clock.now_millis());
    expiring.outbox.push(output(5, "{\"owed\":true}".into()));
    commit_one(store, ns, "ttl", expiring)
        .await
        .expect("commit with ttl");
    assert_eq!(
        entries_of(&load_one(store, ns, "ttl").await, "count"),
        ["5"]
    );
    let head_key = DynamoStateStore::<T>::head_key(ns, "ttl");
    let head = store.table().get(&head_key).await.unwrap().unwrap();
    assert!(
        !head.contains_key(crate::adapters::dynamodb::TTL),
        "a head holding an outbox never expires"
    );
    clock.advance(61_000);
    let loaded = load_one(store, ns, "ttl").await;
    assert!(loaded.slots.is_empty(), "expired slots are never returned");
    assert_eq!(loaded.version, 1);
    assert!(
        loaded.watermarks.has_applied(&lineage, &seq(5), None),
        "watermarks outlive the slots"
    );
    assert_eq!(loaded.outbox.len(), 1, "an outbox never expires");

    // The replacing commit (outbox sent) sets a TTL that covers the watermarks' redeliveries.
    let mut replacing = loaded;
    replacing.outbox.clear();
    replacing
        .slots
        .insert("count".into(), SlotData::fresh(vec![raw("1")]));
    replacing.expires_at = Some(clock.now_millis() / 1000 + 60);
    let version = replacing.version;
    let window = Duration::from_secs(24 * 3600);
    let commit = Commit {
        key: "ttl".into(),
        expected_version: version,
        state: replacing,
        redelivery_window: window,
    };
    store
        .commit(ns, vec![commit])
        .await
        .remove(0)
        .expect("replace expired state");
    let head = store.table().get(&head_key).await.unwrap().unwrap();
    let ttl: i64 = head[crate::adapters::dynamodb::TTL]
        .as_n()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        ttl >= now_secs + window.as_secs() as i64,
        "the head lives while its watermarks guard redeliveries: ttl {ttl}"
    );

    // Segments of state with a TTL outlive it, and are rewritten before they would expire
    // under state whose TTL moved on, their entries intact.
    let entry = |i: usize| raw(&format!("\"{i:05}{}\"", "z".repeat(2043)));
    let mut large = state_with(&[("buffer", (0..300).map(entry).collect())]);
    let exp = clock.now_millis() / 1000 + 60;
    large.expires_at = Some(exp);
    commit_one(store, ns, "ttl-large", large).await.unwrap();
    let pk = DynamoStateStore::<T>::head_key(ns, "ttl-large").pk;
    let segment_ttls = || async {
        let items = store.table().query_partition(&pk).await.unwrap();
        let ttls: Vec<i64> = items
            .iter()
            .filter(|i| i["sk"].as_s().is_some_and(|sk| sk.starts_with("seg#")))
            .map(|i| {
                i[crate::adapters::dynamodb::TTL]
                    .as_n()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        assert!(!ttls.is_empty(), "the list lives in segments");
        ttls
    };
    let period = exp - clock.now_millis() / 1000;
    for ttl in segment_ttls().await {
        assert!(
            ttl >= exp + period,
            "a segment expires at {ttl}, not a TTL period of {period} s after its state at {exp}"
        );
    }
    clock.advance(50_000);
    let mut extended = load_one(store, ns, "ttl-large").await;
    extended.expires_at = Some(clock.now_millis() / 1000 + 600);
    let later = extended.expires_at.unwrap();
    extended
        .slots
        .get_mut("buffer")
        .unwrap()
        .entries
        .push(entry(300));
    commit_one(store, ns, "ttl-large", extended).await.unwrap();
    // The segments rewritten become garbage, which the next commit deletes.
    let again = load_one(store, ns, "ttl-large").await;
    commit_one(store, ns, "ttl-large", again).await.unwrap();
    for ttl in segment_ttls().await {
        assert!(
            ttl >= later,
            "a segment left to expire at {ttl}, before {later}"
        );
    }
    let loaded = load_one(store, ns, "ttl-large").await;
    let entries = &loaded.slots["buffer"].entries;
    assert_eq!(entries.len(), 301);
    assert!(entries
        .iter()
        .enumerate()
        .all(|(i, e)| e.get().starts_with(&format!("\"{i:05}"))));

    // State without a TTL has no ttl attribute.
    commit_one(
        store,
        ns,
        "forever",
        state_with(&[("count", vec![raw("1")])]),
    )
    .await
    .unwrap();
    assert_eq!(head_ttl(store, ns, "forever").await, None);

    // A key emptied of its state keeps its watermarks as long as a redelivery can come, then
    // goes: nothing of a deleted row stays for ever.
    let mut emptied = load_one(store, ns, "forever").await;
    emptied.slots.clear();
    emptied
        .watermarks
        .advance(&Origin("s/shardId-0/e".into()), &seq(9), clock.now_millis());
    commit_one(store, ns, "forever", emptied).await.unwrap();
    let window = crate::ports::DEFAULT_REDELIVERY_WINDOW.as_secs() as i64;
    assert_eq!(
        head_ttl(store, ns, "forever").await,
        Some(clock.now_millis() / 1000 + window + 1)
    );
}

/// The `ttl` of the head of `key`, which must exist.
async fn head_ttl<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    key: &str,
) -> Option<i64> {
    let head = store
        .table()
        .get(&DynamoStateStore::<T>::head_key(ns, key))
        .await
        .unwrap()
        .expect("the head");
    head.get(crate::adapters::dynamodb::TTL)
        .and_then(|t| t.as_n())
        .and_then(|t| t.parse().ok())
}

async fn outboxes<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    // An outbox larger than a head spills like a list, and clearing it leaves no trace.
    let mut state = state_with(&[("count", vec![raw("1")])]);
    state.watermarks.advance(
        &Origin("s/shardId-0/ob".into()),
        &seq(1),
        clock.now_millis(),
    );
    state.outbox = (0..300)
        .map(|i| output(i, format!("{{\"pad\":\"{}\"}}", "p".repeat(2000))))
        .collect();
    let committed = commit_one(store, ns, "ob", state)
        .await
        .expect("a 600 KB outbox");
    let loaded = load_one(store, ns, "ob").await;
    assert_eq!(loaded.outbox.len(), 300);
    assert!(loaded
        .outbox
        .iter()
        .enumerate()
        .all(|(i, o)| o.id == output(i, String::new()).id));
    assert!(
        !stored_items(store, ns, "ob").await.is_empty(),
        "it spilled"
    );

    let cleared = store.clear_outbox(ns, vec![committed]).await;
    assert!(cleared.iter().all(Result::is_ok), "{cleared:?}");
    // Its segments stay a while for loads that read the head before, then go by TTL, even if
    // the key never commits again.
    let pk = DynamoStateStore::<T>::head_key(ns, "ob").pk;
    let segments: Vec<Item> = store
        .table()
        .query_partition(&pk)
        .await
        .expect("query")
        .into_iter()
        .filter(|i| i["sk"].as_s() != Some("head"))
        .collect();
    assert!(!segments.is_empty());
    let now = clock.now_millis() / 1000;
    for segment in &segments {
        let ttl = segment
            .get(crate::adapters::dynamodb::TTL)
            .and_then(|t| t.as_n())
            .and_then(|t| t.parse::<i64>().ok());
        assert!(
            ttl.is_some_and(|t| t > now && t <= now + 3600),
            "{:?} expires within the hour: {ttl:?}",
            segment["sk"]
        );
    }
    let loaded = load_one(store, ns, "ob").await;
    assert!(loaded.outbox.is_empty(), "a cleared outbox is gone");
    assert_eq!(loaded.version, 1, "clearing does not move the version");
    assert_eq!(entries_of(&loaded, "count"), ["1"]);
    // A writer that read the key before the clear still commits, at the same version.
    let mut next = loaded;
    next.outbox.push(output(1, "{}".into()));
    let committed = commit_one(store, ns, "ob", next)
        .await
        .expect("commit after a clear");
    assert_eq!(
        stored_items(store, ns, "ob").await,
        Vec::<String>::new(),
        "the spilled outbox was collected"
    );

    // A clear that comes after another commit leaves that commit alone.
    let mut later = load_one(store, ns, "ob").await;
    later.outbox.clear();
    later.outbox.push(output(2, "{\"later\":1}".into()));
    commit_one(store, ns, "ob", later)
        .await
        .expect("a later commit");
    store
        .clear_outbox(ns, vec![committed])
        .await
        .remove(0)
        .expect("a stale clear is no error");
    assert_eq!(
        load_one(store, ns, "ob").await.outbox.len(),
        1,
        "the later outbox stays"
    );
}

async fn many_lineages<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    // A key fed by many lineages: the head holds the most recent, items the rest, and a load
    // finds each lineage it is asked for.
    let limits = store.limits();
    let total = limits.lineages_per_commit * 3;
    let lineage = |i: usize| Origin(format!("items@label/{i:06}"));
    for round in 0..3 {
        let mut state = load_one(store, ns, "fan-in").await;
        assert_eq!(state.version, round as u64);
        let base = round * limits.lineages_per_commit;
        for i in base..base + limits.lineages_per_commit {
            let mark = watermark_at(clock.now_millis() + i as i64);
            state.watermarks.insert(lineage(i), mark(i as u64 + 1));
        }
        state.slots.insert(
            "count".into(),
            SlotData::fresh(vec![raw(&round.to_string())]),
        );
        commit_one(store, ns, "fan-in", state)
            .await
            .expect("a commit of new lineages");
    }
    let head = store
        .table()
        .get(&DynamoStateStore::<T>::head_key(ns, "fan-in"))
        .await
        .unwrap()
        .unwrap();
    assert!(
        crate::domain::item::item_size(&head) < 64 * 1024,
        "the head stays small: {} bytes",
        crate::domain::item::item_size(&head)
    );
    let wanted: Vec<Origin> = (0..total).step_by(7).map(lineage).collect();
    let loaded = store
        .load_keys(
            ns,
            &[LoadKey {
                key: "fan-in",
                lineages: wanted.iter().collect(),
            }],
        )
        .await
        .expect("load with lineages")
        .remove("fan-in")
        .unwrap();
    for l in &wanted {
        let i: usize = l.as_str().rsplit('/').next().unwrap().parse().unwrap();
        assert!(
            loaded.watermarks.has_applied(l, &seq(i as u64 + 1), None),
            "lineage {l} is known"
        );
        assert!(!loaded.watermarks.has_applied(l, &seq(i as u64 + 2), None));
    }
}

async fn lost_responses<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    // A head put whose response is lost landed: the commit reports success, not a conflict, and
    // the segments the head references stay.
    let losing = Arc::new(LosingResponses::new(store.table().clone()));
    let lossy = DynamoStateStore::new(losing.clone(), ManualClock::at(clock.now_millis()));
    let entry = |i: usize| raw(&format!("\"{i:05}{}\"", "y".repeat(2043)));
    let list: Vec<Box<RawValue>> = (0..200).map(entry).collect();
    losing.lose_next(1);
    let committed = commit_one(&lossy, ns, "lost", state_with(&[("buffer", list)]))
        .await
        .expect("a commit whose response was lost still commits");
    assert_eq!(committed.version, 1);
    let loaded = load_one(store, ns, "lost").await;
    assert_eq!(loaded.version, 1);
    assert_eq!(
        loaded.slots["buffer"].entries.len(),
        200,
        "its segments are all there"
    );
    // And once more on a key that exists.
    let mut next = loaded;
    next.slots
        .get_mut("buffer")
        .unwrap()
        .entries
        .push(entry(200));
    losing.lose_next(1);
    commit_one(&lossy, ns, "lost", next)
        .await
        .expect("again, on a later version");
    assert_eq!(
        load_one(store, ns, "lost").await.slots["buffer"]
            .entries
            .len(),
        201
    );
    // And when another writer commits the key after the put landed, before its writer reads the
    // head back: the head still remembers the lost commit's token, so it is not taken for a
    // conflict (which would send the key's records round again and delete the segments the
    // other writer's head now references).
    let mut third = load_one(store, ns, "lost").await;
    third
        .slots
        .get_mut("buffer")
        .unwrap()
        .entries
        .push(entry(201));
    let other = DynamoStateStore::new(store.table().clone(), ManualClock::at(clock.now_millis()));
    let (other_ns, entry_202) = (ns.clone(), entry(202));
    losing.lose_next_while(Box::pin(async move {
        let mut state = load_one(&other, &other_ns, "lost").await;
        let buffer = state.slots.get_mut("buffer").unwrap();
        assert_eq!(buffer.entries.len(), 202, "the lost put landed");
        buffer.entries.push(entry_202);
        commit_one(&other, &other_ns, "lost", state)
            .await
            .expect("the other writer commits on top");
    }));
    let settled = commit_one(&lossy, ns, "lost", third)
        .await
        .expect("the lost commit is recognised after a later one");
    assert_eq!(settled.version, 3);
    let loaded = load_one(store, ns, "lost").await;
    assert_eq!(loaded.version, 4);
    assert_eq!(loaded.slots["buffer"].entries.len(), 203);
    // A head keeps the tokens of its last few commits, not of every commit.
    for _ in 0..TOKENS_KEPT + 2 {
        let state = load_one(store, ns, "lost").await;
        commit_one(store, ns, "lost", state).await.unwrap();
    }
    let head_key = DynamoStateStore::<T>::head_key(ns, "lost");
    let head = store.table().get(&head_key).await.unwrap().unwrap();
    let text = crate::adapters::dynamodb::stored_text::read(&head, "doc", "{}", "doc");
    let doc: serde_json::Value = serde_json::from_str(&text.unwrap()).expect("the head's doc");
    assert_eq!(doc["tk"].as_array().map(Vec::len), Some(TOKENS_KEPT));
}

/// A commit that loses the race for its key after writing its segments deletes them at once: the
/// head that won never references them.
async fn lost_races<T: Table + 'static>(
    store: &DynamoStateStore<T>,
    ns: &Namespace,
    clock: &ManualClock,
) {
    let racing = Arc::new(LosingResponses::new(store.table().clone()));
    let loser = DynamoStateStore::new(racing.clone(), ManualClock::at(clock.now_millis()));
    commit_one(store, ns, "race", state_with(&[("buffer", vec![raw("1")])]))
        .await
        .unwrap();
    let mut large = load_one(store, ns, "race").await;
    let entry = |i: usize| raw(&format!("\"{i:05}{}\"", "r".repeat(2043)));
    large.slots.get_mut("buffer").unwrap().entries = (0..200).map(entry).collect();
    let winner = DynamoStateStore::new(store.table().clone(), ManualClock::at(clock.now_millis()));
    let other_ns = ns.clone();
    racing.before_next_put(Box::pin(async move {
        let mut state = load_one(&winner, &other_ns, "race").await;
        state
            .slots
            .get_mut("buffer")
            .unwrap()
            .entries
            .push(raw("2"));
        commit_one(&winner, &other_ns, "race", state)
            .await
            .expect("the other writer commits first");
    }));
    let lost = commit_one(&loser, ns, "race", large).await;
    assert!(matches!(lost, Err(StoreError::Conflict)), "{lost:?}");
    let segments: Vec<String> = stored_items(store, ns, "race")
        .await
        .into_iter()
        .filter(|sk| sk.starts_with("seg#"))
        .collect();
    assert_eq!(
        segments,
        Vec::<String>::new(),
        "the loser's segments are gone"
    );
    assert_eq!(
        entries_of(&load_one(store, ns, "race").await, "buffer"),
        ["1", "2"]
    );
}
