//! The due-time index of keyed timers, in the state table beside the state.
//!
//! | item   | pk                                        | sk                         | attributes              |
//! |--------|-------------------------------------------|----------------------------|-------------------------|
//! | entry  | `{operator}#timers#{hour}#{spread}`       | `{due:020}#{key hash}`     | `k` (S), `at` (N)       |
//! | cursor | `{operator}#timers`                       | `cursor`                   | `v` (N), `h` (N)        |
//!
//! Why this shape:
//! - Entries are bucketed by the hour they come due in, so a sweep reads only the buckets up to
//!   now, and within one only the entries due (`sk <= now`), by Query: no Scan, however many
//!   timers wait for later. DynamoDB's TTL deletions lag by days and cannot serve as timers.
//! - Each hour is spread over `SPREAD` partitions by the key's hash: timers set at one time by
//!   many keys do not all write one partition.
//! - An entry's hour is that of its time or of the moment it is written, whichever is later, so
//!   a timer set for a time already past lands in a bucket the sweep still reads.
//! - An entry comes due at its timer's time, or later when a sweep postponed it (its firing
//!   failed): the sort key is when it is due, the timer's time an attribute, so a sweep takes the
//!   entries due first and a timer that keeps failing moves behind the others.
//! - The cursor is the first hour that may still hold entries. A sweep moves it past hours that
//!   are empty and that no writer can still write to (`WRITER_LAG_MILLIS` after their end), so a
//!   sweep reads one or two hours, and an entry due long ago (the sweeper was stopped) is still
//!   found. The first write of an operator's entries creates the cursor.

use std::collections::HashSet;
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

fn key_hash(key: &str) -> String {
    sha256_hex(&[key.as_bytes()], 16)
}

/// The entry of `timer` due at `due_millis`, written at `now_millis`.
fn entry_item(operator: &str, timer: &TimerEntry, due_millis: i64, now_millis: i64) -> Item {
    let hash = key_hash(&timer.key);
    let spread = u32::from_str_radix(&hash[..2], 16).expect("hex") % SPREAD;
    let hour = hour_of(due_millis.max(now_millis));
    let mut item = ItemKey {
        pk: bucket(operator, hour, spread),
        sk: format!("{:020}#{hash}", due_millis.max(0)),
    }
    .to_item();
    item.insert(KEY.to_owned(), AttrValue::S(timer.key.clone()));
    item.insert(AT.to_owned(), AttrValue::N(timer.at_millis.to_string()));
    item
}

fn parse_entry(item: &Item) -> Result<DueTimer, StoreError> {
    let invalid = || StoreError::Invalid(format!("a timer index entry is malformed: {item:?}"));
    let ItemKey { pk, sk } = ItemKey::of(item).ok_or_else(invalid)?;
    let handle = format!("{pk}\n{sk}");
    let key = item
        .get(KEY)
        .and_then(AttrValue::as_s)
        .ok_or_else(invalid)?;
    let at_millis = number(item, AT)?.ok_or_else(invalid)?;
    Ok(DueTimer {
        timer: TimerEntry {
            at_millis,
            key: key.to_owned(),
        },
        handle,
    })
}

/// The item of a due entry, from its handle (`pk`, a line break, `sk`).
fn entry_key(due: &DueTimer) -> ItemKey {
    let (pk, sk) = due.handle.split_once('\n').unwrap_or((&due.handle, ""));
    ItemKey {
        pk: pk.to_owned(),
        sk: sk.to_owned(),
    }
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
        let puts = timers
            .iter()
            .map(|t| WriteRequest::Put(entry_item(operator, t, t.at_millis, now_millis)))
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
        let mut due = Vec::new();
        let mut next_cursor = first;
        for hour in first..=last {
            let mut empty = true;
            for spread in 0..SPREAD {
                let wanted = limit.saturating_sub(due.len());
                if wanted == 0 {
                    // Not read to the end: not known empty.
                    empty = false;
                    break;
                }
                let items = self
                    .table
                    .query_up_to(&bucket(operator, hour, spread), &sk_max, wanted)
                    .await?;
                empty &= items.is_empty();
                for item in &items {
                    due.push(parse_entry(item)?);
                }
            }
            let closed = (hour + 1) * HOUR_MILLIS + WRITER_LAG_MILLIS <= now_millis;
            if empty && closed && next_cursor == hour {
                next_cursor = hour + 1;
            }
            if due.len() >= limit {
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
        // Due first: the sort key leads the handle after the bucket, which leads with the hour.
        due.sort_by(|a, b| due_of(a).cmp(due_of(b)).then(a.timer.cmp(&b.timer)));
        due.truncate(limit);
        Ok(due)
    }

    async fn forget_timers(&self, _operator: &str, due: &[DueTimer]) -> Result<(), StoreError> {
        let deletes = due
            .iter()
            .map(|d| WriteRequest::Delete(entry_key(d)))
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
        let puts = due
            .iter()
            .map(|d| WriteRequest::Put(entry_item(operator, &d.timer, until_millis, now)))
            .collect();
        if let (_, Some(err)) = self.write_all(puts).await {
            return Err(err);
        }
        self.forget_timers(operator, due).await
    }
}

impl<T: Table> DynamoStateStore<T> {
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
