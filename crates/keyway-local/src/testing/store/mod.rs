//! The `StateStore` contract on a `DynamoStateStore` over any `Table`: commits conditional on the
//! version read, lists in segments, TTLs, outboxes, watermarks of many lineages, lost responses,
//! lost races, crashes inside a commit and the timer index. One function per promise, in a file
//! by subject (`state`, `expiry`, `delivery`, `failures`, `timers`; `faulty` holds the tables that
//! fail on purpose); `state_store_contract_tests!` makes a test of each.

use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;

use super::{output, seq};
use keyway::adapters::dynamodb::{
    DynamoStateStore, Expect, ItemKey, Table, WriteRequest, TOKENS_KEPT,
};
use keyway::domain::{Dictionary, Item, KeyState, Origin, SlotData, SlotUpdate};
use keyway::ports::{
    Clock, Commit, Committed, LoadKey, ManualClock, Namespace, StateStore, StoreError, TimerIndex,
};

mod delivery;
mod expiry;
mod failures;
mod faulty;
mod state;
mod timers;

use delivery::*;
use expiry::*;
pub use failures::orphans;
use failures::*;
pub use faulty::LosingResponses;
use faulty::*;
use state::*;
use timers::*;

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

fn watermark_at(millis: i64) -> impl Fn(u64) -> keyway::domain::Watermark {
    move |n| keyway::domain::Watermark {
        sequence: seq(n),
        at_millis: millis,
    }
}

/// Something that happens between a put landing and its lost response reaching the caller.
type Meanwhile = futures::future::BoxFuture<'static, ()>;

/// A `DynamoStateStore` to check, over a fresh table whose clock is `clock`.
pub struct StoreUnderTest<T: Table> {
    /// The store the promises are checked on.
    pub store: DynamoStateStore<T>,
    /// The table's clock, which the promises move to let state expire and timers come due.
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
    /// Every promise of the contract, in the order `state_store_contract` checks them.
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
    // With a preset dictionary, as an operator may declare: every promise holds for heads
    // deflated with one (the store's own tests cover those deflated without).
    let ns = Namespace::new("contract", "0123456789abcdef")
        .with_dictionaries([Dictionary::new(CONTRACT_DICTIONARY)]);
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

/// The preset dictionary of the contract's namespace: a head of the shape its promises write.
const CONTRACT_DICTIONARY: &str = r#"{"wm":{"s/shardId-000000000000":{"s":"49000000000000000000000000000000","t":1}},"slots":{"buffer":{"e":["entry-0000","entry-0001"]}},"ob":{"e":[{"id":"0","sink":"out","partition_key":"k","body":"1"}]},"tk":[1]}"#;

/// The whole `StateStore` contract, promise after promise, on one store.
pub async fn state_store_contract<T: Table + 'static>(under: &StoreUnderTest<T>) {
    for promise in StorePromise::ALL {
        keep_store_promise(promise, under).await;
    }
}
