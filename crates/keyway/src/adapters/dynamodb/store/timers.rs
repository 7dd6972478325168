//! The due-time index of keyed timers, in the state table beside the state.
//!
//! | item   | pk                                        | sk                         | attributes              |
//! |--------|-------------------------------------------|----------------------------|-------------------------|
//! | entry  | `{operator}#timers#{hour}#{spread}`       | `{due:020}#{hash}`         | `k` (S) or `ks` (L), `at` (N) |
//! | cursor | `{operator}#timers`                       | `cursor`                   | `v` (N), `h` (N)        |
//!
//! Why this shape:
//! - An entry holds every timer that one write sets for one time, up to `TIMERS_PER_ENTRY` keys
//!   and `ENTRY_KEY_BYTES` of them (`ks`; one key alone is `k`). A batch that makes many keys
//!   wait sets their timers for the same time (the invocation's, plus a delay), and DynamoDB
//!   bills a write by the KB, not by the key: fifteen keys cost what one does, to write and to
//!   delete. A sweep takes an entry whole; a part of it that could not be settled is postponed
//!   as an entry of its own.
//! - Entries are bucketed by the hour they come due in, so a sweep reads only the buckets up to
//!   now, and within one only the entries due (`sk <= now`), by Query: no Scan, however many
//!   timers wait for later. DynamoDB's TTL deletions lag by days and cannot serve as timers.
//! - Each hour is spread over `SPREAD` partitions by the entry's hash: the entries that many
//!   writers set at one time do not all write one partition.
//! - An entry's hash covers its timers' time, its keys and the moment it was written, so every
//!   write is an item of its own: a sweep deletes only the entries it read, never one a writer
//!   wrote again since (a commit that lost its race and set the same timer again), which alone
//!   may still stand for a pending timer. A timer indexed twice fires once: firing needs it
//!   pending in its key's state.
//! - A release before entries held several timers refuses an entry with `ks` as malformed, and
//!   its sweeps stop there: roll back past it only once no such entry is left.
//! - An entry's hour is that of its time or of the moment it is written, whichever is later, so
//!   a timer set for a time already past lands in a bucket the sweep still reads.
//! - An entry comes due at its timer's time, or later when a sweep postponed it (its firing
//!   failed): the sort key is when it is due, the timer's time an attribute, so a sweep takes the
//!   entries due first and a timer that keeps failing moves behind the others.
//! - The cursor is the first hour that may still hold entries. A sweep moves it past hours that
//!   are empty and that no writer can still write to (`WRITER_LAG_MILLIS` after their end), so a
//!   sweep reads one or two hours, and an entry due long ago (the sweeper was stopped) is still
//!   found. The first write of an operator's entries creates the cursor.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Mutex;

use async_trait::async_trait;

use super::super::{Expect, ItemKey, Table, WriteRequest, VERSION};
use super::{number, DynamoStateStore};
use crate::domain::hash::sha256_hex;
use crate::domain::{AttrValue, Item};
use crate::ports::{DueTimer, StoreError, TimerEntry, TimerIndex};

const HOUR_MILLIS: i64 = 3_600_000;
/// Partitions each hour of entries is spread over.
const SPREAD: u32 = 8;
/// How far a writer's clock may lag the moment it writes an entry: an invocation's time is read
/// when it starts, and Lambda runs one for up to 15 minutes.
const WRITER_LAG_MILLIS: i64 = 20 * 60_000;
/// The most hours one sweep reads, so that a sweeper stopped for long catches up in steps.
const HOURS_PER_SWEEP: i64 = 48;
const KEY: &str = "k";
const AT: &str = "at";
const HOUR: &str = "h";

fn hour_of(millis: i64) -> i64 {
    millis.div_euclid(HOUR_MILLIS)
}

fn cursor_key(operator: &str) -> ItemKey {
    ItemKey {
        pk: format!("{operator}#timers"),
        sk: "cursor".to_owned(),
    }
}

fn bucket(operator: &str, hour: i64, spread: u32) -> String {
    format!("{operator}#timers#{hour}#{spread}")
}

/// The most keys one entry holds.
const TIMERS_PER_ENTRY: usize = 100;
/// The most bytes of keys one entry holds, unless a single key is longer. A state key may be of
/// any length (the store keys a long one by its hash), so a hundred keys may not fit DynamoDB's
/// 400 KB item; past a few KB, sharing an entry saves nothing, since writes are billed by the KB.
const ENTRY_KEY_BYTES: usize = 16 * 1024;
/// The keys of an entry of several timers.
const KEYS: &str = "ks";
/// How many entries a sweep reads of a bucket at first (see `due_entries`).
const FIRST_READ_ITEMS: usize = 16;

/// The entries of `timers`, written at `now_millis`, due at their time or at `due_millis` when
/// given (postponed): one entry for the timers of one time, `TIMERS_PER_ENTRY` keys and
/// `ENTRY_KEY_BYTES` of them at most.
fn entry_items(
    operator: &str,
    timers: &[TimerEntry],
    due_millis: Option<i64>,
    now_millis: i64,
) -> Vec<Item> {
    let mut by_time: BTreeMap<i64, BTreeSet<&str>> = BTreeMap::new();
    for timer in timers {
        by_time
            .entry(timer.at_millis)
            .or_default()
            .insert(&timer.key);
    }
    let mut items = Vec::new();
    for (at_millis, keys) in by_time {
        for shared in shares(keys) {
            let due = due_millis.unwrap_or(at_millis);
            items.push(entry_item(operator, at_millis, &shared, due, now_millis));
        }
    }
    items
}

/// `keys` in the groups that share an entry, in order: `TIMERS_PER_ENTRY` keys and
/// `ENTRY_KEY_BYTES` of them at most, or one key alone that is longer.
fn shares(keys: BTreeSet<&str>) -> Vec<Vec<&str>> {
    let mut shares: Vec<Vec<&str>> = Vec::new();
    let mut bytes = 0;
    for key in keys {
        match shares.last_mut() {
            Some(share)
                if share.len() < TIMERS_PER_ENTRY && bytes + key.len() <= ENTRY_KEY_BYTES =>
            {
                share.push(key);
                bytes += key.len();
            }
            _ => {
                shares.push(vec![key]);
                bytes = key.len();
            }
        }
    }
    shares
}

/// The entry of the timers of `keys` at `at_millis`, due at `due_millis`, written at
/// `now_millis`. Its sort key ends with the hash of its time, its keys and the moment it is
/// written (see the module doc): two timers of one key postponed to one time stay two.
fn entry_item(
    operator: &str,
    at_millis: i64,
    keys: &[&str],
    due_millis: i64,
    now_millis: i64,
) -> Item {
    let (at, written) = (at_millis.to_string(), now_millis.to_string());
    let parts: Vec<&[u8]> = [at.as_bytes(), written.as_bytes()]
        .into_iter()
        .chain(keys.iter().map(|k| k.as_bytes()))
        .collect();
    let hash = sha256_hex(&parts, 16);
    let spread = u32::from_str_radix(&hash[..2], 16).expect("hex") % SPREAD;
    let hour = hour_of(due_millis.max(now_millis));
    let mut item = ItemKey {
        pk: bucket(operator, hour, spread),
        sk: format!("{:020}#{hash}", due_millis.max(0)),
    }
    .to_item();
    match keys {
        [key] => item.insert(KEY.to_owned(), AttrValue::S((*key).to_owned())),
        keys => item.insert(
            KEYS.to_owned(),
            AttrValue::L(keys.iter().map(|k| AttrValue::S((*k).to_owned())).collect()),
        ),
    };
    item.insert(AT.to_owned(), AttrValue::N(at_millis.to_string()));
    item
}

/// The timers an entry holds, each with the entry's handle.
fn parse_entry(item: &Item) -> Result<Vec<DueTimer>, StoreError> {
    let invalid = || StoreError::Invalid(format!("a timer index entry is malformed: {item:?}"));
    let ItemKey { pk, sk } = ItemKey::of(item).ok_or_else(invalid)?;
    let handle = format!("{pk}\n{sk}");
    let keys: Vec<&str> = match (item.get(KEY), item.get(KEYS)) {
        (Some(key), _) => vec![key.as_s().ok_or_else(invalid)?],
        (None, Some(AttrValue::L(keys))) => keys
            .iter()
            .map(|k| k.as_s().ok_or_else(invalid))
            .collect::<Result<_, _>>()?,
        _ => return Err(invalid()),
    };
    if keys.is_empty() {
        return Err(invalid());
    }
    let at_millis = number(item, AT)?.ok_or_else(invalid)?;
    Ok(keys
        .into_iter()
        .map(|key| DueTimer {
            timer: TimerEntry {
                at_millis,
                key: key.to_owned(),
            },
            handle: handle.clone(),
        })
        .collect())
}

/// The item of a due entry, from its handle (`pk`, a line break, `sk`).
fn entry_key(handle: &str) -> ItemKey {
    let (pk, sk) = handle.split_once('\n').unwrap_or((handle, ""));
    ItemKey {
        pk: pk.to_owned(),
        sk: sk.to_owned(),
    }
}

/// The entries due first, whole, until they hold `limit` timers: more when an entry straddles
/// the limit, since a sweep takes or leaves an entry as one.
fn earliest(mut entries: Vec<Vec<DueTimer>>, limit: usize) -> Vec<DueTimer> {
    // Due first: the sort key leads the handle after the bucket, which leads with the hour.
    entries.sort_by(|a, b| {
        due_of(&a[0])
            .cmp(due_of(&b[0]))
            .then(a[0].timer.cmp(&b[0].timer))
    });
    let mut due = Vec::new();
    for entry in entries {
        if due.len() >= limit {
            break;
        }
        due.extend(entry);
    }
    due
}

/// When a due entry came due, as its sort key spells it.
fn due_of(due: &DueTimer) -> &str {
    due.handle.split_once('\n').map_or("", |(_, sk)| sk)
}

/// The operators whose cursor this process has seen: their writes need not create it.
#[derive(Default)]
pub(super) struct KnownCursors(Mutex<HashSet<String>>);

impl KnownCursors {
    fn contains(&self, operator: &str) -> bool {
        self.0.lock().expect("cursor set").contains(operator)
    }

    fn insert(&self, operator: &str) {
        self.0
            .lock()
            .expect("cursor set")
            .insert(operator.to_owned());
    }
}

#[async_trait]
impl<T: Table + 'static> TimerIndex for DynamoStateStore<T> {
    async fn schedule_timers(
        &self,
        operator: &str,
        timers: &[TimerEntry],
        now_millis: i64,
    ) -> Result<(), StoreError> {
        if timers.is_empty() {
            return Ok(());
        }
        self.ensure_cursor(operator, now_millis).await?;
        let puts = entry_items(operator, timers, None, now_millis)
            .into_iter()
            .map(WriteRequest::Put)
            .collect();
        match self.write_all(puts).await {
            (_, None) => Ok(()),
            (_, Some(err)) => Err(err),
        }
    }

    async fn due_timers(
        &self,
        operator: &str,
        now_millis: i64,
        limit: usize,
    ) -> Result<Vec<DueTimer>, StoreError> {
        let key = cursor_key(operator);
        let Some(cursor) = self.get_all(std::slice::from_ref(&key)).await?.remove(&key) else {
            // No timer was ever set.
            return Ok(Vec::new());
        };
        let version = number(&cursor, VERSION)?.unwrap_or(0);
        let first = number(&cursor, HOUR)?.unwrap_or(hour_of(now_millis));
        let last = hour_of(now_millis).min(first + HOURS_PER_SWEEP - 1);
        let sk_max = format!("{now_millis:020}~");
        let mut entries = Vec::new();
        let mut timers = 0;
        let mut next_cursor = first;
        for hour in first..=last {
            let mut empty = true;
            for spread in 0..SPREAD {
                let wanted = limit.saturating_sub(timers);
                if wanted == 0 {
                    // Not read to the end: not known empty.
                    empty = false;
                    break;
                }
                let found = self
                    .due_entries(&bucket(operator, hour, spread), &sk_max, wanted)
                    .await?;
                empty &= found.is_empty();
                timers += found.iter().map(Vec::len).sum::<usize>();
                entries.extend(found);
            }
            let closed = (hour + 1) * HOUR_MILLIS + WRITER_LAG_MILLIS <= now_millis;
            if empty && closed && next_cursor == hour {
                next_cursor = hour + 1;
            }
            if timers >= limit {
                break;
            }
        }
        if next_cursor > first {
            let mut item = key.to_item();
            item.insert(VERSION.to_owned(), AttrValue::N((version + 1).to_string()));
            item.insert(HOUR.to_owned(), AttrValue::N(next_cursor.to_string()));
            // Another sweep moved it first: it read the same empty hours.
            match self
                .put_retrying(&item, &Expect::Version(version as u64))
                .await
            {
                Ok(()) | Err(StoreError::Conflict) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(earliest(entries, limit))
    }

    async fn forget_timers(&self, _operator: &str, due: &[DueTimer]) -> Result<(), StoreError> {
        // The timers of one entry share its handle: one delete each.
        let handles: BTreeSet<&str> = due.iter().map(|d| d.handle.as_str()).collect();
        let deletes = handles
            .into_iter()
            .map(|handle| WriteRequest::Delete(entry_key(handle)))
            .collect();
        match self.write_all(deletes).await {
            (_, None) => Ok(()),
            (_, Some(err)) => Err(err),
        }
    }

    async fn postpone_timers(
        &self,
        operator: &str,
        due: &[DueTimer],
        until_millis: i64,
    ) -> Result<(), StoreError> {
        // The new entries first: a sweep stopped in between finds an entry twice, never none.
        let now = self.clock.now_millis();
        let timers: Vec<TimerEntry> = due.iter().map(|d| d.timer.clone()).collect();
        let puts = entry_items(operator, &timers, Some(until_millis), now)
            .into_iter()
            .map(WriteRequest::Put)
            .collect();
        if let (_, Some(err)) = self.write_all(puts).await {
            return Err(err);
        }
        self.forget_timers(operator, due).await
    }
}

impl<T: Table> DynamoStateStore<T> {
    /// The entries of `bucket` due by `sk_max`, first due first, until they hold `wanted` timers
    /// or the bucket ends. Asked for a few items first, then twice as many while they hold too
    /// few timers: an entry may hold one timer or a hundred, and a Query bills every item it
    /// reads, so reading `wanted` items of a hundred timers each would read a hundred times too
    /// many; reading the first items again costs at most as much as the last read.
    async fn due_entries(
        &self,
        bucket: &str,
        sk_max: &str,
        wanted: usize,
    ) -> Result<Vec<Vec<DueTimer>>, StoreError> {
        let mut items_wanted = wanted.min(FIRST_READ_ITEMS);
        loop {
            let items = self.table.query_up_to(bucket, sk_max, items_wanted).await?;
            let entries = items
                .iter()
                .map(parse_entry)
                .collect::<Result<Vec<_>, _>>()?;
            let timers: usize = entries.iter().map(Vec::len).sum();
            if items.len() < items_wanted || timers >= wanted || items_wanted >= wanted {
                return Ok(entries);
            }
            items_wanted = (items_wanted * 2).min(wanted);
        }
    }

    /// Creates the operator's cursor unless it exists, at an hour no writer can be behind.
    async fn ensure_cursor(&self, operator: &str, now_millis: i64) -> Result<(), StoreError> {
        if self.cursors.contains(operator) {
            return Ok(());
        }
        let mut item = cursor_key(operator).to_item();
        item.insert(VERSION.to_owned(), AttrValue::N("1".into()));
        let first = hour_of(now_millis - WRITER_LAG_MILLIS);
        item.insert(HOUR.to_owned(), AttrValue::N(first.to_string()));
        match self.put_retrying(&item, &Expect::Absent).await {
            Ok(()) | Err(StoreError::Conflict) => {
                self.cursors.insert(operator);
                Ok(())
            }
            Err(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::adapters::dynamodb::MemoryTable;
    use crate::ports::{ManualClock, TimerIndex};

    /// 2026-01-01T00:05:00Z: five minutes into an hour.
    const T: i64 = 1_767_225_900_000;
    const MINUTE: i64 = 60_000;

    fn store() -> DynamoStateStore<MemoryTable> {
        DynamoStateStore::new(Arc::new(MemoryTable::new()), ManualClock::at(T))
    }

    fn timer(key: &str, at_millis: i64) -> TimerEntry {
        TimerEntry {
            at_millis,
            key: key.into(),
        }
    }

    fn keys(due: &[DueTimer]) -> Vec<&str> {
        due.iter().map(|d| d.timer.key.as_str()).collect()
    }

    #[tokio::test]
    async fn entries_come_due_in_time_order_once_their_time_has_come_and_until_forgotten() {
        let s = store();
        let timers = [
            timer("x", T + 180 * MINUTE),
            timer("y", T + MINUTE),
            timer("z", T + 120 * MINUTE),
        ];
        s.schedule_timers("op", &timers, T).await.unwrap();
        assert!(s.due_timers("op", T, 10).await.unwrap().is_empty());
        assert!(s
            .due_timers("other", T + 999 * MINUTE, 10)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            keys(&s.due_timers("op", T + MINUTE, 10).await.unwrap()),
            ["y"]
        );
        let all = s.due_timers("op", T + 180 * MINUTE, 10).await.unwrap();
        assert_eq!(keys(&all), ["y", "z", "x"]);
        let two = s.due_timers("op", T + 180 * MINUTE, 2).await.unwrap();
        assert_eq!(keys(&two), ["y", "z"]);
        s.forget_timers("op", &two).await.unwrap();
        let rest = s.due_timers("op", T + 180 * MINUTE, 10).await.unwrap();
        assert_eq!(keys(&rest), ["x"]);
        assert_eq!(rest[0].timer, timers[0]);
    }

    /// Timer index entries in the table.
    fn entries(s: &DynamoStateStore<MemoryTable>) -> usize {
        let items = s.table.items();
        items.iter().filter(|i| i.contains_key(AT)).count()
    }

    #[tokio::test]
    async fn timers_one_write_sets_for_one_time_share_an_entry_which_a_sweep_takes_whole() {
        let s = store();
        let many: Vec<TimerEntry> = (0..30)
            .map(|i| timer(&format!("key-{i:02}"), T + MINUTE))
            .collect();
        let mut timers = many.clone();
        timers.push(timer("later", T + 2 * MINUTE));
        s.schedule_timers("op", &timers, T).await.unwrap();
        assert_eq!(entries(&s), 2, "one entry a time");
        let written = s.table.usage().write_units;
        assert!(
            written <= 4.0,
            "billed by the KB, not by the key: {written}"
        );
        let due = s.due_timers("op", T + 2 * MINUTE, 10).await.unwrap();
        let expected: Vec<&str> = many.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys(&due), expected, "the whole entry, past the limit");
        s.forget_timers("op", &due).await.unwrap();
        assert_eq!(entries(&s), 1);
        let rest = s.due_timers("op", T + 2 * MINUTE, 10).await.unwrap();
        assert_eq!(keys(&rest), ["later"]);
        // More keys than an entry holds make more entries.
        let crowd: Vec<TimerEntry> = (0..TIMERS_PER_ENTRY + 1)
            .map(|i| timer(&format!("crowd-{i:03}"), T + 3 * MINUTE))
            .collect();
        s.schedule_timers("op", &crowd, T).await.unwrap();
        assert_eq!(entries(&s), 3);
    }

    #[tokio::test]
    async fn a_timer_postponed_from_a_shared_entry_comes_due_again_alone() {
        let s = store();
        let timers = [
            timer("a", T + MINUTE),
            timer("b", T + MINUTE),
            timer("c", T + MINUTE),
        ];
        s.schedule_timers("op", &timers, T).await.unwrap();
        let due = s.due_timers("op", T + MINUTE, 10).await.unwrap();
        let (left, done): (Vec<DueTimer>, Vec<DueTimer>) =
            due.into_iter().partition(|d| d.timer.key == "b");
        s.postpone_timers("op", &left, T + 5 * MINUTE)
            .await
            .unwrap();
        s.forget_timers("op", &done).await.unwrap();
        assert!(s
            .due_timers("op", T + 4 * MINUTE, 10)
            .await
            .unwrap()
            .is_empty());
        let again = s.due_timers("op", T + 5 * MINUTE, 10).await.unwrap();
        assert_eq!(keys(&again), ["b"]);
        assert_eq!(again[0].timer, timers[1], "its own time, due later");
    }

    #[tokio::test]
    async fn an_entry_written_again_after_a_sweep_read_it_outlives_that_sweeps_forgetting() {
        let s = store();
        let closes = timer("w", T + MINUTE);
        s.schedule_timers("op", std::slice::from_ref(&closes), T)
            .await
            .unwrap();
        let read = s.due_timers("op", T + MINUTE, 10).await.unwrap();
        // A commit that lost its race to the sweep's runs again and sets the same timer.
        s.schedule_timers("op", std::slice::from_ref(&closes), T + 1_000)
            .await
            .unwrap();
        s.forget_timers("op", &read).await.unwrap();
        let after = s.due_timers("op", T + MINUTE, 10).await.unwrap();
        assert_eq!(keys(&after), ["w"], "the second write still stands");
    }

    #[tokio::test]
    async fn a_sweep_reads_few_entries_of_many_timers_and_every_entry_of_one() {
        let s = store();
        for i in 0..400 {
            let crowd: Vec<TimerEntry> = (0..TIMERS_PER_ENTRY)
                .map(|k| timer(&format!("k{i}-{k}"), T + MINUTE))
                .collect();
            s.schedule_timers("op", &crowd, T + i).await.unwrap();
        }
        let before = s.table.usage().read_units;
        let due = s.due_timers("op", T + MINUTE, 500).await.unwrap();
        let read = s.table.usage().read_units - before;
        assert!((500..600).contains(&due.len()), "{}", due.len());
        // The cursor (1 unit), the empty hour before (8 queries, 1 unit each), then 16 of the
        // some 50 entries of a bucket, about 1.2 KB each (5 units); all 50 would take 15.
        assert!(read <= 15.0, "read {read} units");
        let singles: Vec<TimerEntry> = (0..300)
            .map(|k| timer(&format!("single-{k}"), T + 30 * MINUTE + k))
            .collect();
        let s = store();
        s.schedule_timers("op", &singles, T).await.unwrap();
        let due = s.due_timers("op", T + 40 * MINUTE, 500).await.unwrap();
        assert_eq!(due.len(), 300, "every entry of one timer");
    }

    #[tokio::test]
    async fn keys_of_kilobytes_setting_timers_at_one_time_are_indexed_and_come_due() {
        let s = store();
        // A key a record's field makes, ten times the usual size and then some: a hundred of
        // them would not fit one item.
        let timers: Vec<TimerEntry> = (0..TIMERS_PER_ENTRY)
            .map(|i| timer(&format!("{i:03}{}", "k".repeat(5_000)), T + MINUTE))
            .collect();
        s.schedule_timers("op", &timers, T)
            .await
            .expect("indexed in entries that fit");
        let due = s.due_timers("op", T + MINUTE, 500).await.unwrap();
        let mut at: Vec<TimerEntry> = due.into_iter().map(|d| d.timer).collect();
        at.sort();
        assert_eq!(at, timers);
        // One key larger than an entry's share of keys still gets an entry of its own.
        let huge = timer(&"h".repeat(100_000), T + 2 * MINUTE);
        s.schedule_timers("op", std::slice::from_ref(&huge), T)
            .await
            .unwrap();
        let due = s.due_timers("op", T + 2 * MINUTE, 1_000).await.unwrap();
        assert!(due.iter().any(|d| d.timer == huge));
    }

    #[tokio::test]
    async fn two_timers_of_one_key_postponed_to_one_time_both_come_due() {
        let s = store();
        let timers = [timer("a", T + MINUTE), timer("a", T + 2 * MINUTE)];
        s.schedule_timers("op", &timers, T).await.unwrap();
        let due = s.due_timers("op", T + 2 * MINUTE, 10).await.unwrap();
        assert_eq!(due.len(), 2);
        s.postpone_timers("op", &due, T + 5 * MINUTE).await.unwrap();
        let again = s.due_timers("op", T + 5 * MINUTE, 10).await.unwrap();
        let mut at: Vec<TimerEntry> = again.into_iter().map(|d| d.timer).collect();
        at.sort();
        assert_eq!(at, timers, "two entries, not one written over the other");
    }

    #[tokio::test]
    async fn a_timer_due_long_ago_is_found_by_a_sweeper_stopped_for_days() {
        let s = store();
        let (soon, later) = (
            timer("a", T + 60 * MINUTE),
            timer("b", T + 60 * 60 * MINUTE),
        );
        s.schedule_timers("op", &[soon.clone(), later.clone()], T)
            .await
            .unwrap();
        let now = T + 100 * 60 * MINUTE;
        let mut found = Vec::new();
        for _ in 0..3 {
            let due = s.due_timers("op", now, 1).await.unwrap();
            s.forget_timers("op", &due).await.unwrap();
            found.extend(due.into_iter().map(|d| d.timer));
        }
        assert_eq!(found, [soon, later]);
        assert!(s.due_timers("op", now, 1).await.unwrap().is_empty());
        let cursor = s.table.get(&cursor_key("op")).await.unwrap().unwrap();
        let hour = number(&cursor, HOUR).unwrap().unwrap();
        assert!(
            hour > hour_of(T + 60 * 60 * MINUTE),
            "the cursor moved past the emptied hours"
        );
        assert!(hour <= hour_of(now - WRITER_LAG_MILLIS));
    }

    #[tokio::test]
    async fn the_cursor_never_passes_an_hour_a_lagging_writer_may_still_write_to() {
        let s = store();
        s.schedule_timers("op", &[timer("a", T + 500 * MINUTE)], T - 30 * MINUTE)
            .await
            .unwrap();
        // Swept at T (five minutes into the hour): the hour before ended less than the writers'
        // lag ago.
        assert!(s.due_timers("op", T, 10).await.unwrap().is_empty());
        // An invocation that started 15 minutes ago sets a timer for its own now.
        let lagging = T - 15 * MINUTE;
        s.schedule_timers("op", &[timer("b", lagging)], lagging)
            .await
            .unwrap();
        assert_eq!(keys(&s.due_timers("op", T, 10).await.unwrap()), ["b"]);
    }
}
