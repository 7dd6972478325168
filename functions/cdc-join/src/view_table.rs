//! The materialized view in DynamoDB, written as the join's sink: each joined change is a put of
//! its row under the condition that it raises the row's rank (`view::rank`), so changes apply in
//! any order and any number of times and the table ends as `view::View` does. Of a row's changes
//! in one send, only the latest is written: the others could only lose to it. Built on the
//! runtime's `Table`: the same code writes DynamoDB and the embedded runtime's table.
//!
//! Layout (`pk`, `sk`): the left row's primary key, the right row's (`-` for a left row without a
//! partner, which no primary key as JSON text can be); `rank`; `left` and `right`, the rows as
//! JSON. A deleted row stays as a tombstone (`deleted`, no rows) as long as a change can still
//! come late (the join's redelivery window: a shard can lag that far behind another), then goes
//! by TTL: readers skip items with `deleted`. A pair whose rows together pass DynamoDB's item
//! limit (two rows of some 200 KB) is kept without them, `omitted` saying why: its rank still
//! orders the pair's changes, the joined changelog carries its rows, and the step that made it
//! applies whole, its other pairs with it, where refusing the one pair refused them all.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keyway::adapters::dynamodb::{apply_latest, Expect, ItemKey, Table, ITEM_MAX_BYTES, TTL};
use keyway::adapters::retry::Backoff;
use keyway::domain::item::item_size;
use keyway::domain::{AttrValue, Item, Output, RowChange};
use keyway::ports::{Clock, Deadline, Sink, SinkError, StoreError};

use crate::join::{Joined, Stamped};
use crate::view::rank;

const RANK: &str = "rank";
const LEFT: &str = "left";
const RIGHT: &str = "right";
const DELETED: &str = "deleted";
const OMITTED: &str = "omitted";
/// The sort key of a left row without a partner.
pub const NO_PARTNER: &str = "-";

/// The view table, as the join's sink.
pub struct ViewTable {
    table: Arc<dyn Table>,
    clock: Arc<dyn Clock>,
    /// How long a tombstone stays: as long as a change older than the delete can still arrive.
    tombstones: Duration,
    /// A throttle is retried after a backoff: a view write must not cost the batch a retry.
    backoff: Backoff,
}

impl ViewTable {
    /// The view in `table`, its tombstones kept for `tombstones` (the join's redelivery window).
    pub fn new(table: Arc<dyn Table>, clock: Arc<dyn Clock>, tombstones: Duration) -> Self {
        Self {
            table,
            clock,
            tombstones,
            backoff: Backoff::default(),
        }
    }

    /// With `backoff` between the attempts of a write, instead of the default.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Writes `stamped` unless the view holds its row at a rank as high.
    pub async fn apply(&self, stamped: &Stamped) -> Result<(), StoreError> {
        self.apply_until(stamped, Deadline::NONE).await
    }

    /// `apply`, with no retry of the write starting past `deadline`.
    async fn apply_until(&self, stamped: &Stamped, deadline: Deadline) -> Result<(), StoreError> {
        let item = self.item(stamped);
        let raise = Expect::Raise {
            attribute: RANK,
            value: rank(stamped),
        };
        match self
            .backoff
            .retry_call_until(deadline, || self.table.put(&item, &raise))
            .await
        {
            // The row holds this change already, or a later one.
            Ok(()) | Err(StoreError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn item(&self, stamped: &Stamped) -> Item {
        let joined = stamped.change.row();
        let mut item = key_of(joined).to_item();
        item.insert(RANK.to_owned(), AttrValue::S(rank(stamped)));
        match &stamped.change {
            RowChange::Insert(joined) => {
                let json = |row| serde_json::to_string(row).expect("a JSON object serializes");
                let mut rows = item.clone();
                rows.insert(LEFT.to_owned(), AttrValue::S(json(&joined.left)));
                if let Some(right) = &joined.right {
                    rows.insert(RIGHT.to_owned(), AttrValue::S(json(right)));
                }
                let size = item_size(&rows);
                if size <= ITEM_MAX_BYTES {
                    return rows;
                }
                let why = format!(
                    "the rows take {size} bytes with their keys, past DynamoDB's item limit of \
                     {ITEM_MAX_BYTES}: the joined changelog carries them"
                );
                item.insert(OMITTED.to_owned(), AttrValue::S(why));
            }
            RowChange::Delete(_) => {
                let ttl = self.clock.now_millis() / 1000 + self.tombstones.as_secs() as i64;
                item.insert(DELETED.to_owned(), AttrValue::Bool(true));
                item.insert(TTL.to_owned(), AttrValue::N(ttl.to_string()));
            }
        }
        item
    }
}

/// Where a joined row is kept.
pub fn key_of(joined: &Joined) -> ItemKey {
    ItemKey {
        pk: joined.left_pk.clone(),
        sk: joined
            .right_pk
            .clone()
            .unwrap_or_else(|| NO_PARTNER.to_owned()),
    }
}

/// The joined row an item of the view holds, or `None` for a tombstone and for a pair whose
/// rows were too large to keep (`omitted_from`).
pub fn joined_of(item: &Item) -> Result<Option<Joined>, StoreError> {
    if item.contains_key(DELETED) || item.contains_key(OMITTED) {
        return Ok(None);
    }
    let text = |name: &str| item.get(name).and_then(AttrValue::as_s);
    let row = |name: &str| -> Result<Option<keyway::domain::debezium::Row>, StoreError> {
        text(name)
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| StoreError::Invalid(format!("view item {name}: {e}")))
    };
    let (Some(left_pk), Some(right_pk), Some(left)) = (text("pk"), text("sk"), row(LEFT)?) else {
        return Err(StoreError::Invalid(
            "a view item without pk, sk or left".into(),
        ));
    };
    let right_pk = (right_pk != NO_PARTNER).then(|| right_pk.to_owned());
    Ok(Some(Joined {
        left_pk: left_pk.to_owned(),
        left,
        right_pk,
        right: row(RIGHT)?,
    }))
}

/// Why an item of the view holds its pair without the rows, if it does: they were too large.
pub fn omitted_from(item: &Item) -> Option<&str> {
    item.get(OMITTED).and_then(AttrValue::as_s)
}

#[async_trait]
impl Sink for ViewTable {
    async fn send(&self, messages: &[Output], deadline: Deadline) -> Vec<(usize, SinkError)> {
        // A row's changes in one batch come down to its latest: an update of a row that keeps
        // its join key is a delete and an insert of it, one write instead of two.
        let order = |stamped: &Stamped| (stamped.change.row().id(), rank(stamped));
        apply_latest(
            messages,
            "a joined change",
            deadline,
            order,
            |stamped: Stamped| async move { self.apply_until(&stamped, deadline).await },
        )
        .await
    }

    fn max_message_bytes(&self) -> usize {
        // What the joined changelog takes (a Kinesis record): a pair too large for an item is
        // kept without its rows, not refused.
        1024 * 1024
    }

    /// Ranks order the changes of a row: the sink needs no order of its own.
    fn ordered(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use keyway::ports::ManualClock;
    use keyway_local::services::faults::{Fault, FaultPlan, Faults};
    use keyway_local::LocalTable;
    use serde_json::json;

    use super::*;
    use crate::join::Stamp;

    fn change(insert: bool, at: &str) -> Stamped {
        let joined = Joined {
            left_pk: "1".into(),
            left: json!({"id": 1, "user_id": 7}).as_object().unwrap().clone(),
            right_pk: Some("7".into()),
            right: Some(json!({"id": 7}).as_object().unwrap().clone()),
        };
        let (stamp, change) = if insert {
            (Stamp::insert(at), RowChange::Insert(joined))
        } else {
            (Stamp::delete(at), RowChange::Delete(joined))
        };
        Stamped {
            stamp: (stamp, Stamp::insert("1")),
            change,
        }
    }

    /// The joined rows the view table holds, tombstones left out.
    fn rows(table: &LocalTable) -> usize {
        let items = table.items();
        items.iter().filter_map(|i| joined_of(i).unwrap()).count()
    }

    /// A shard of the changelog that lags by its whole redelivery window (a sink down for a
    /// day, a stream kept a week) delivers an insert older than a delete the view applied long
    /// ago: the tombstone is still there to refuse it, and goes only after the window.
    #[tokio::test]
    async fn a_change_from_a_shard_lagging_by_the_whole_window_cannot_bring_a_deleted_row_back() {
        let table = Arc::new(LocalTable::new());
        let clock = ManualClock::at(1_767_225_600_000);
        let week = Duration::from_secs(7 * 24 * 3600);
        let view = ViewTable::new(table.clone(), clock.clone(), week);
        view.apply(&change(true, "10")).await.unwrap();
        view.apply(&change(false, "20")).await.unwrap();
        // Six days on, DynamoDB's TTL process has run; the stale insert arrives.
        clock.advance(6 * 24 * 3600 * 1000);
        table.expire(clock.now_millis() / 1000);
        view.apply(&change(true, "10")).await.unwrap();
        assert_eq!(rows(&table), 0, "the deleted row stays deleted");
        // Past the window the tombstone goes, and nothing of the row is left.
        clock.advance(2 * 24 * 3600 * 1000);
        table.expire(clock.now_millis() / 1000);
        assert!(table.is_empty());
    }

    #[tokio::test]
    async fn a_change_sent_again_after_a_lost_response_or_in_any_order_writes_the_latest() {
        let table = Arc::new(LocalTable::new());
        let clock = ManualClock::at(1_767_225_600_000);
        let view = ViewTable::new(table.clone(), clock, Duration::from_secs(3600));
        for stamped in [change(true, "30"), change(false, "20"), change(true, "30")] {
            view.apply(&stamped).await.unwrap();
        }
        assert_eq!(rows(&table), 1);
        let item = &table.items()[0];
        assert_eq!(item[RANK].as_s(), Some(rank(&change(true, "30")).as_str()));
    }

    fn output(stamped: &Stamped) -> Output {
        Output {
            id: keyway::domain::OutputId(rank(stamped)),
            sink: "view".into(),
            partition_key: "1".into(),
            body: serde_json::to_string(stamped).unwrap(),
            settled: false,
        }
    }

    /// An update of a joined row is its delete and its insert: sent together, only the insert
    /// is written, and the row ends as it would have after both.
    #[tokio::test]
    async fn an_update_of_a_joined_row_sent_at_once_costs_one_write() {
        let table = Arc::new(LocalTable::new());
        let clock = ManualClock::at(1_767_225_600_000);
        let view = ViewTable::new(table.clone(), clock, Duration::from_secs(3600));
        let update = [output(&change(false, "20")), output(&change(true, "20"))];
        assert!(view.send(&update, Deadline::NONE).await.is_empty());
        assert_eq!(table.meter().snapshot().write_units, 1.0);
        assert_eq!(rows(&table), 1);
        assert_eq!(
            table.items()[0][RANK].as_s(),
            Some(rank(&change(true, "20")).as_str())
        );
    }

    /// Rows of a batch are written at once: their writes start together, not a round trip after
    /// another.
    #[tokio::test(start_paused = true)]
    async fn the_rows_of_a_batch_are_written_in_a_few_round_trips_not_one_each() {
        let table = Arc::new(LocalTable::new());
        table.meter().set_latency(Some(Duration::from_millis(5)));
        let clock = ManualClock::at(1_767_225_600_000);
        let view = ViewTable::new(table.clone(), clock, Duration::from_secs(3600));
        let changes: Vec<Output> = (0..20)
            .map(|i| {
                let mut stamped = change(true, "30");
                if let RowChange::Insert(joined) = &mut stamped.change {
                    joined.left_pk = i.to_string();
                }
                output(&stamped)
            })
            .collect();
        assert!(view.send(&changes, Deadline::NONE).await.is_empty());
        assert_eq!(rows(&table), 20);
        let waves = table.meter().snapshot().waves;
        assert!(waves <= 2, "{waves} round trips for 20 rows");
    }

    /// A left row without a partner that moves from one join key to another is written by the
    /// invocations of both, at once (other shards, or lanes of one with ParallelizationFactor
    /// 10), each send writing its own latest change of the row, over lost responses: the row ends
    /// as the change ranked highest of all, a tombstone when that is its delete.
    #[tokio::test(start_paused = true)]
    async fn two_invocations_writing_one_row_at_once_leave_the_change_ranked_highest_of_both() {
        let alone = |insert: bool, at: &str| {
            let mut stamped = change(insert, at);
            match &mut stamped.change {
                RowChange::Insert(joined) | RowChange::Delete(joined) => {
                    joined.right_pk = None;
                    joined.right = None;
                }
            }
            output(&stamped)
        };
        for (highest_is_delete, expected) in [(false, (true, "30")), (true, (false, "40"))] {
            // Half the puts land with their response lost, and throttles: both retried.
            let faults = FaultPlan {
                lost_response: 0.5,
                throttle: 0.3,
                seed: 7,
                ..Default::default()
            };
            let table = Arc::new(LocalTable::new().with_faults(Faults::new(faults, 0)));
            table.meter().set_latency(Some(Duration::from_millis(5)));
            let clock = ManualClock::at(1_767_225_600_000);
            let view = |clock| ViewTable::new(table.clone(), clock, Duration::from_secs(3600));
            let (old_key, new_key) = (view(clock.clone()), view(clock.clone()));
            let last = if highest_is_delete { "40" } else { "20" };
            let left_behind = [alone(true, "10"), alone(false, last)];
            let moved_in = [alone(true, "30")];
            let (a, b) = tokio::join!(
                old_key.send(&left_behind, Deadline::NONE),
                new_key.send(&moved_in, Deadline::NONE)
            );
            assert!(a.is_empty() && b.is_empty(), "{a:?} {b:?}");
            let fired = table.faults_fired();
            assert!(fired.get(&Fault::LostResponse) > Some(&0), "{fired:?}");
            let items = table.items();
            assert_eq!(items.len(), 1, "one row");
            let winner = change(expected.0, expected.1);
            assert_eq!(items[0][RANK].as_s(), Some(rank(&winner).as_str()));
            assert_eq!(rows(&table), usize::from(!highest_is_delete));
        }
    }
}
