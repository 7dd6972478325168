//! Per-state TTL (`ValueState::with_ttl` and the like, or a time of the value's own from
//! `ValueHandle::set_expiring`): when each state of a key expires, kept in the key's
//! `keyway.expiry` slot (state name to epoch seconds) by the commit that changes the state. A
//! state past its time is dropped from the loaded state before the key's records run, so
//! `process` finds it absent, and the key's next commit leaves it out.

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use crate::domain::{KeyState, SlotData};
use crate::operator::StateDescriptor;

/// The slot the expiry times live in: not a declared state, so no operator can read it.
const EXPIRY_SLOT: &str = "keyway.expiry";

fn read(state: &KeyState) -> BTreeMap<String, i64> {
    state
        .slots
        .get(EXPIRY_SLOT)
        .and_then(|slot| slot.entries.first())
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
        .unwrap_or_default()
}

/// When the state `name` of `state`, as loaded, goes (epoch seconds): at its own time or at the
/// key's, whichever comes first; `None` when neither is set.
pub(crate) fn of(state: &KeyState, name: &str) -> Option<i64> {
    let own = read(state).get(name).copied();
    match (own, state.expires_at) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Drops the states of `base` whose time has passed at `now_secs`; says whether one was.
pub(super) fn drop_expired(base: &mut KeyState, now_secs: i64) -> bool {
    let mut dropped = false;
    for (name, at) in read(base) {
        if at <= now_secs {
            dropped |= base.slots.remove(&name).is_some();
        }
    }
    dropped
}

/// When a key's states expire, as a commit leaves them.
pub(super) struct Expiry {
    /// When the last state with a time expires.
    pub latest: Option<i64>,
    /// Every state the key holds has a time (pending timers are a state without one): the key's
    /// slots can all go at `latest`. A state without a TTL that the key does not hold keeps
    /// nothing: a join key emptied of its rows, holding only its deletes' stamps for their
    /// window, goes after it.
    pub all: bool,
}

/// Stamps the states in `changed` (each with the time its run gave it, in epoch milliseconds, if
/// any) with their expiry, and forgets the expiry of states no longer stored.
pub(super) fn stamp<'n>(
    state: &mut KeyState,
    declared: &[StateDescriptor],
    changed: impl Iterator<Item = (&'n str, Option<i64>)>,
    now_secs: i64,
) -> Expiry {
    let mut expiry = read(state);
    for (name, at_millis) in changed {
        let ttl = declared.iter().find(|d| d.name == name).and_then(|d| d.ttl);
        match (at_millis, ttl) {
            (Some(at), _) => expiry.insert(name.to_owned(), at.div_euclid(1000)),
            (None, Some(ttl)) => expiry.insert(name.to_owned(), now_secs + ttl.as_secs() as i64),
            (None, None) => expiry.remove(name),
        };
    }
    expiry.retain(|name, _| state.slots.contains_key(name));
    let latest = expiry.values().max().copied();
    let all = !expiry.is_empty()
        && state
            .slots
            .keys()
            .all(|name| name == EXPIRY_SLOT || expiry.contains_key(name));
    if expiry.is_empty() {
        state.slots.remove(EXPIRY_SLOT);
    } else {
        let json = serde_json::to_string(&expiry).expect("a map of numbers serializes");
        let entry = RawValue::from_string(json).expect("valid JSON");
        state
            .slots
            .insert(EXPIRY_SLOT.to_owned(), SlotData::fresh(vec![entry]));
    }
    Expiry { latest, all }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testkit::{bench, key_and_n, record, OUT, START};
    use super::*;
    use crate::operator::{Ctx, InvalidInput, KeyedOperator, ProcessError, SinkDescriptor};
    use std::sync::Arc;

    use super::super::testkit::Recorder;
    use crate::adapters::dynamodb::{
        BatchGetOutput, DynamoStateStore, Expect, ItemKey, MemoryTable, Table, WriteRequest,
    };
    use crate::domain::Item;
    use crate::ports::{ManualClock, StateStore, StoreError};
    use crate::{Executor, Sinks, ValueState};

    const COUNT: ValueState<i64> = ValueState::new("count");
    const LAST: ValueState<i64> = ValueState::new("last").with_ttl(Duration::from_secs(60));

    /// Counts `n` per key; a record of `n` 1 also notes when it came. Emits when the key's
    /// previous such record came, or -1.
    struct Noting;

    impl KeyedOperator for Noting {
        type Input = (String, i64);
        fn name(&self) -> &str {
            "noting"
        }
        fn states(&self) -> Vec<StateDescriptor> {
            vec![COUNT.descriptor(), LAST.descriptor()]
        }
        fn sinks(&self) -> Vec<SinkDescriptor> {
            vec![OUT.descriptor()]
        }
        fn decode(
            &self,
            record: &crate::domain::SourceRecord,
        ) -> Result<(String, i64), InvalidInput> {
            key_and_n(record)
        }

        fn key(&self, input: &(String, i64)) -> String {
            input.0.clone()
        }
        fn process(&self, ctx: &mut Ctx<'_>, (key, n): (String, i64)) -> Result<(), ProcessError> {
            *ctx.value(&COUNT)?.get_or_insert_with(|| 0) += n;
            let now = ctx.now_millis();
            let mut last = ctx.value(&LAST)?;
            let before = last.get().copied().unwrap_or(-1);
            if n == 1 {
                last.set(now);
            }
            ctx.emit(&OUT, key, &before)
        }
    }

    #[tokio::test]
    async fn a_state_with_its_own_ttl_expires_after_its_last_change_and_the_others_stay() {
        let b = bench(Noting, false);
        b.executor.run(vec![record(1, "p", "a", 1)]).await;
        b.clock.advance(30_000);
        // Changes the count only: the noted time keeps its expiry.
        b.executor.run(vec![record(2, "p", "a", 2)]).await;
        b.clock.advance(31_000);
        b.executor.run(vec![record(3, "p", "a", 2)]).await;
        let sent: Vec<String> = b.out.bodies().concat();
        assert_eq!(sent, ["-1", &START.to_string(), "-1"]);
        let store =
            crate::adapters::dynamodb::DynamoStateStore::new(b.table.clone(), b.clock.clone());
        let state = store
            .load(b.executor.namespace(), &["a".to_owned()])
            .await
            .unwrap()
            .remove("a")
            .unwrap();
        let names: Vec<&str> = state.slots.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["count"],
            "the expired state is gone, its expiry with it"
        );
        assert_eq!(state.slots["count"].entries[0].get(), "5");
        assert_eq!(
            state.expires_at, None,
            "the count has no TTL: the key stays"
        );
    }

    /// Keeps a value until the time each record gives it; the key itself lives a minute past
    /// its last commit. Emits the value it found.
    struct Until;

    const HELD: ValueState<i64> = ValueState::new("held").with_ttl(Duration::from_secs(60));

    impl KeyedOperator for Until {
        type Input = (String, i64);
        fn name(&self) -> &str {
            "until"
        }
        fn states(&self) -> Vec<StateDescriptor> {
            vec![HELD.descriptor()]
        }
        fn sinks(&self) -> Vec<SinkDescriptor> {
            vec![OUT.descriptor()]
        }
        fn decode(
            &self,
            record: &crate::domain::SourceRecord,
        ) -> Result<(String, i64), InvalidInput> {
            key_and_n(record)
        }
        fn key(&self, input: &(String, i64)) -> String {
            input.0.clone()
        }
        fn state_ttl(&self) -> Option<Duration> {
            Some(Duration::from_secs(60))
        }
        fn process(&self, ctx: &mut Ctx<'_>, (key, n): (String, i64)) -> Result<(), ProcessError> {
            let mut held = ctx.value(&HELD)?;
            let found = held.get().copied().unwrap_or(-1);
            if n > 0 {
                held.set_expiring(n, n);
            }
            ctx.emit(&OUT, key, &found)
        }
    }

    /// When key `a`'s state expires, as stored.
    async fn stored(b: &super::super::testkit::Bench<Until>) -> Option<i64> {
        let store =
            crate::adapters::dynamodb::DynamoStateStore::new(b.table.clone(), b.clock.clone());
        let mut states = store
            .load(b.executor.namespace(), &["a".to_owned()])
            .await
            .unwrap();
        states.remove("a").unwrap().expires_at
    }

    #[tokio::test]
    async fn a_value_stored_until_its_own_time_outlives_its_ttl_and_keeps_the_key_until_then() {
        let b = bench(Until, false);
        let hour_on = START + 3_600_000;
        b.executor.run(vec![record(1, "p", "a", hour_on)]).await;
        assert_eq!(
            stored(&b).await,
            Some(hour_on / 1000),
            "the key lives as long as its value, past its own minute"
        );
        b.clock.advance(30 * 60_000);
        b.executor.run(vec![record(2, "p", "a", 0)]).await;
        b.clock.advance(31 * 60_000);
        // A value whose time is past: found absent at once; the key keeps its own minute.
        b.executor.run(vec![record(3, "p", "a", 1)]).await;
        let sent: Vec<String> = b.out.bodies().concat();
        assert_eq!(
            sent,
            ["-1", &hour_on.to_string(), "-1"],
            "held past its minute's TTL, gone after its own time"
        );
        assert_eq!(
            stored(&b).await,
            Some((START + 61 * 60_000) / 1000 + 60),
            "with its value's time past, the key has its minute"
        );
    }

    const DATED: crate::MapState<i64, i64> = crate::MapState::new("dated");

    /// A map kept until the time a record gives (`n` above 0), or for good (`n` 0: a change that
    /// says nothing of its time); a record of a negative `n` only reads. Emits the entries found.
    struct Dated;

    impl KeyedOperator for Dated {
        type Input = (String, i64);
        fn name(&self) -> &str {
            "dated"
        }
        fn states(&self) -> Vec<StateDescriptor> {
            vec![DATED.descriptor()]
        }
        fn sinks(&self) -> Vec<SinkDescriptor> {
            vec![OUT.descriptor()]
        }
        fn decode(
            &self,
            record: &crate::domain::SourceRecord,
        ) -> Result<(String, i64), InvalidInput> {
            key_and_n(record)
        }
        fn key(&self, input: &(String, i64)) -> String {
            input.0.clone()
        }
        fn process(&self, ctx: &mut Ctx<'_>, (key, n): (String, i64)) -> Result<(), ProcessError> {
            let mut dated = ctx.map(&DATED)?;
            let found = dated.len() as i64;
            if n >= 0 {
                dated.insert(n, n);
            }
            if n > 0 {
                dated.expire_at(n);
            }
            ctx.emit(&OUT, key, &found)
        }
    }

    #[tokio::test]
    async fn a_map_kept_until_a_time_reads_empty_after_it_and_a_later_change_keeps_it_for_good() {
        let b = bench(Dated, false);
        let expires = || async {
            let store = DynamoStateStore::new(b.table.clone(), b.clock.clone());
            let mut states = store
                .load(b.executor.namespace(), &["a".to_owned()])
                .await
                .unwrap();
            states.remove("a").map(|s| s.expires_at)
        };
        let hour_on = START + 3_600_000;
        b.executor.run(vec![record(1, "p", "a", hour_on)]).await;
        assert_eq!(expires().await, Some(Some(hour_on / 1000)));
        b.clock.advance(3_600_001);
        b.executor.run(vec![record(2, "p", "a", -1)]).await;
        // In one batch: kept until a time by one record, changed by the next without one.
        let later = hour_on + 3_600_000;
        b.executor
            .run(vec![record(3, "p", "a", later), record(4, "p", "a", 0)])
            .await;
        b.clock.advance(7_200_000);
        b.executor.run(vec![record(5, "p", "a", -1)]).await;
        let sent: Vec<String> = b.out.bodies().concat();
        assert_eq!(
            sent,
            ["0", "0", "0", "1", "2"],
            "empty past its time, kept after"
        );
        assert_eq!(expires().await, Some(None));
    }

    const BULK: crate::ListState<String> = crate::ListState::new("bulk");
    const STAMPS: crate::MapState<i64, String> =
        crate::MapState::new("stamps").with_ttl(Duration::from_secs(60));

    /// Keeps a KB of text in `bulk` (no TTL) and in `stamps` (a TTL) per `n` a record gives; a
    /// record of `n` 0 empties `bulk`, leaving the key holding `stamps` only, so it expires; one
    /// of -1 adds a short entry to `bulk` alone. The key's states live `key_ttl` if set.
    struct Spilling {
        key_ttl: Option<Duration>,
        outbox: bool,
    }

    impl KeyedOperator for Spilling {
        type Input = (String, i64);
        fn name(&self) -> &str {
            "spilling"
        }
        fn states(&self) -> Vec<StateDescriptor> {
            vec![BULK.descriptor(), STAMPS.descriptor()]
        }
        fn sinks(&self) -> Vec<SinkDescriptor> {
            vec![OUT.descriptor()]
        }
        fn decode(
            &self,
            record: &crate::domain::SourceRecord,
        ) -> Result<(String, i64), InvalidInput> {
            key_and_n(record)
        }
        fn key(&self, input: &(String, i64)) -> String {
            input.0.clone()
        }
        fn state_ttl(&self) -> Option<Duration> {
            self.key_ttl
        }
        fn delivery(&self) -> crate::operator::Delivery {
            if self.outbox {
                crate::operator::Delivery::Outbox
            } else {
                crate::operator::Delivery::EmitThenCommit
            }
        }
        fn process(&self, ctx: &mut Ctx<'_>, (key, n): (String, i64)) -> Result<(), ProcessError> {
            match n {
                0 => ctx.list(&BULK)?.clear(),
                -1 => ctx.list(&BULK)?.push("short".to_owned()),
                _ => {}
            }
            for i in 0..n {
                ctx.list(&BULK)?.push(format!("{i:01000}"));
                ctx.map(&STAMPS)?.insert(i, format!("{i:01000}"));
            }
            ctx.emit(&OUT, key, &n)
        }
    }

    /// The items of key `a`.
    fn of_a(table: &MemoryTable) -> Vec<crate::domain::Item> {
        table
            .items()
            .into_iter()
            .filter(|i| {
                i.get("pk")
                    .and_then(|v| v.as_s())
                    .is_some_and(|pk| pk.contains("#a"))
            })
            .collect()
    }

    /// The sort keys of key `a`'s segments.
    fn segments_of_a(table: &MemoryTable) -> Vec<String> {
        of_a(table)
            .iter()
            .filter_map(|i| i.get("sk").and_then(|v| v.as_s()).map(str::to_owned))
            .filter(|sk| sk.starts_with("seg#"))
            .collect()
    }

    #[tokio::test]
    async fn a_key_that_comes_to_expire_leaves_none_of_its_segments_without_a_ttl() {
        for outbox in [false, true] {
            let b = bench(
                Spilling {
                    key_ttl: None,
                    outbox,
                },
                false,
            );
            comes_to_expire(&b.executor, &b.table, &b.clock).await;
        }
    }

    /// The in-memory table, whose answer to the first put of a head with a TTL is lost: the put
    /// lands, the store hears a throttle.
    struct LosingAnExpiringHead {
        inner: Arc<MemoryTable>,
        lost: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl Table for LosingAnExpiringHead {
        async fn put(&self, item: &Item, expect: &Expect) -> Result<(), StoreError> {
            self.inner.put(item, expect).await?;
            let expiring_head =
                ItemKey::of(item).is_some_and(|k| k.sk == "head") && item.contains_key("ttl");
            if expiring_head && !self.lost.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::Throttled("the response was lost".into()));
            }
            Ok(())
        }
        async fn scan_page(
            &self,
            pk_prefix: &str,
            sk: &str,
            after: Option<&ItemKey>,
            limit: usize,
        ) -> Result<crate::adapters::dynamodb::ScanPage, StoreError> {
            self.inner.scan_page(pk_prefix, sk, after, limit).await
        }
        async fn batch_get(&self, keys: &[ItemKey]) -> Result<BatchGetOutput, StoreError> {
            self.inner.batch_get(keys).await
        }
        async fn update(&self, key: &ItemKey, a: &Item, e: &Expect) -> Result<(), StoreError> {
            self.inner.update(key, a, e).await
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

    #[tokio::test(start_paused = true)]
    async fn a_key_whose_expiring_heads_put_answered_nothing_leaves_none_of_its_segments_without_a_ttl(
    ) {
        let memory = Arc::new(MemoryTable::new());
        let table = LosingAnExpiringHead {
            inner: memory.clone(),
            lost: Default::default(),
        };
        let clock = ManualClock::at(START);
        let store = Arc::new(DynamoStateStore::new(Arc::new(table), clock.clone()));
        let out = Arc::new(Recorder::default());
        let sinks = Sinks::new(Arc::new(Recorder::default())).with(&OUT, out.clone());
        let spilling = Spilling {
            key_ttl: None,
            outbox: false,
        };
        let executor = Executor::new(spilling, store, sinks, clock.clone()).unwrap();
        comes_to_expire(&executor, &memory, &clock).await;
        assert_eq!(out.bodies().concat(), ["100", "0"], "each record once");
    }

    /// The key's records hold 100 KB in each state, then only its stamps: every item of the key
    /// has a TTL then.
    async fn comes_to_expire(
        executor: &Executor<Spilling>,
        table: &MemoryTable,
        clock: &ManualClock,
    ) {
        // Some 100 KB in each state: both spill into segments, kept for good.
        executor.run(vec![record(1, "p", "a", 100)]).await;
        assert_eq!(segments_of_a(table).len(), 2, "a segment of each state");
        assert!(of_a(table).iter().all(|i| !i.contains_key("ttl")));
        clock.advance(1_000);
        executor.run(vec![record(2, "p", "a", 0)]).await;
        let without: Vec<String> = of_a(table)
            .iter()
            .filter(|i| !i.contains_key("ttl"))
            .map(|i| format!("{:?}", i.get("sk")))
            .collect();
        assert!(
            without.is_empty(),
            "the head expires: the stamps' kept segments and the bulk's retired ones with it, \
             but these have no TTL: {without:?}"
        );
    }

    #[tokio::test]
    async fn a_key_with_a_state_ttl_writes_its_kept_segments_again_once_a_ttl_not_at_every_commit()
    {
        let b = bench(
            Spilling {
                key_ttl: Some(Duration::from_secs(60)),
                outbox: false,
            },
            false,
        );
        b.executor.run(vec![record(1, "p", "a", 100)]).await;
        let written = segments_of_a(&b.table);
        assert_eq!(written.len(), 2, "a segment of each state");
        // Each commit moves the key's time on; its segments outlive it by a TTL.
        for (sequence, by) in [(2, 1_000), (3, 20_000), (4, 30_000)] {
            b.clock.advance(by);
            b.executor.run(vec![record(sequence, "p", "a", -1)]).await;
            assert_eq!(segments_of_a(&b.table), written, "kept as written");
        }
        b.clock.advance(20_000);
        b.executor.run(vec![record(5, "p", "a", -1)]).await;
        let again = segments_of_a(&b.table);
        assert!(
            again.iter().any(|sk| !written.contains(sk)),
            "a TTL on, written again to outlive the key: {again:?}"
        );
    }

    #[test]
    fn a_key_expires_with_its_last_state_only_when_every_state_it_holds_has_a_time() {
        let mut state = KeyState::default();
        state.slots.insert(
            "last".into(),
            SlotData::fresh(vec![RawValue::from_string("1".into()).unwrap()]),
        );
        let only_last = [LAST.descriptor()];
        let alone = stamp(&mut state, &only_last, [("last", None)].into_iter(), 100);
        assert_eq!((alone.latest, alone.all), (Some(160), true));
        let both = [COUNT.descriptor(), LAST.descriptor()];
        let without_count = stamp(&mut state, &both, std::iter::empty(), 130);
        assert_eq!(
            (without_count.latest, without_count.all),
            (Some(160), true),
            "a state without a TTL that the key does not hold keeps nothing"
        );
        let one = RawValue::from_string("1".into()).unwrap();
        state
            .slots
            .insert("count".into(), SlotData::fresh(vec![one.clone()]));
        let beside = stamp(&mut state, &both, std::iter::empty(), 130);
        assert_eq!((beside.latest, beside.all), (Some(160), false));
        state.slots.remove("count");
        state
            .slots
            .insert("keyway.timers".into(), SlotData::fresh(vec![one]));
        let timers = stamp(&mut state, &both, std::iter::empty(), 130);
        assert!(!timers.all, "a pending timer keeps its key");
        state.slots.remove("keyway.timers");
        assert!(state.slots.contains_key(EXPIRY_SLOT));
        assert!(!drop_expired(&mut state, 159));
        assert!(drop_expired(&mut state, 160));
        assert!(!state.slots.contains_key("last"));
    }
}
