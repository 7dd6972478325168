//! The rows of both sides under one join key, and what each change does to the join.
//!
//! Every change reaches the join as a delete or an insert of one source row (by primary key)
//! under the join key the row has or had: an update that moved a row to another join key is a
//! delete under the old key and an insert under the new one, so no group keeps a row its source
//! no longer has, and the state holds exactly the live source rows. Each step answers with the
//! joined changelog: the joined rows it takes away (deletes, first) and those it adds (inserts).
//!
//! A step that changes nothing changes nothing: a delete of a row the group does not hold (a
//! duplicate, a replay, FLINK-19795's "retract a non-existent record") and an insert of a row it
//! already holds make no joined change and never fail. An insert of another version of a row the
//! group holds replaces it.
//!
//! **Replays.** The re-key emits before it commits: a retried batch sends its steps again, after
//! steps of the same rows it sent already, so a group can meet a row's delete once more after
//! the row came back, or its insert once more after it went. A step is applied only over an older
//! one of its row: the row held carries the stamp of its insert, and a row the group deleted
//! leaves its delete's stamp (`Group::gone`) for as long as a replay can come (the operator
//! forgets it after the redelivery window).
//!
//! **Stamps.** The groups of two join keys run on different shards, in no order between them: a
//! row that moves from one join key to another is inserted under the new one, maybe before it is
//! deleted under the old. Each step carries the stamp the re-key gave it (`Stamp`: the sequence
//! number of the change it came from, which grows with each change of a row since a row's
//! changes arrive in order under its primary key, then 0 for the delete and 1 for the insert),
//! and every joined change carries a pair: the stamps of its left and right rows as the group
//! holds or changes them, or for a left row without a partner, the left row's stamp and the
//! group's own count of steps. Of all the changes ever made
//! to one joined row, the one made from the newest versions of both its rows has the largest pair,
//! so a view that applies a change only over a smaller pair (`view::View`) ends as the join of
//! the current rows, in any order between groups.

use std::collections::BTreeMap;

use keyway::domain::debezium::Row;
use keyway::domain::RowChange;
use serde::{Deserialize, Serialize};

use crate::spec::{JoinKind, Side};

/// Where a step stands among the steps of its row: fixed-width text that sorts as the position
/// of the change it came from (a sequence number of up to `DIGITS` digits), then the step.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Stamp(pub String);

/// Digits of a stamp's position: Kinesis sequence numbers have up to 56, DynamoDB Streams' fewer.
pub const DIGITS: usize = 60;

impl Stamp {
    /// The delete step of the change at `sequence` (decimal digits).
    pub fn delete(sequence: &str) -> Self {
        Self(format!("{sequence:0>DIGITS$}.0"))
    }

    /// The insert step of the change at `sequence`.
    pub fn insert(sequence: &str) -> Self {
        Self(format!("{sequence:0>DIGITS$}.1"))
    }

    /// The step `change` of the change at `sequence`: its delete or its insert.
    pub fn of<R>(change: &RowChange<R>, sequence: &str) -> Self {
        match change {
            RowChange::Delete(_) => Self::delete(sequence),
            RowChange::Insert(_) => Self::insert(sequence),
        }
    }

    /// The delete, by a truncate of its table, of the row the change at `sequence` inserted:
    /// after that insert, before the next change of the row (whose sequence number is larger),
    /// wherever the truncate itself came from.
    pub fn truncated(sequence: &str) -> Self {
        Self(format!("{sequence:0>DIGITS$}.2"))
    }

    /// The `n`-th step of a group, for a row without a partner: sorts as `n` does.
    fn count(n: u64) -> Self {
        Self(format!("{n:0>DIGITS$}"))
    }
}

/// A source row as a group holds it, with the stamp of the insert that brought it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Held {
    /// The row's columns.
    pub row: Row,
    /// The stamp of the insert that brought this version of the row.
    pub stamp: Stamp,
}

/// The rows of both sides under one join key, by primary key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Group {
    /// The left table's rows under this join key, by primary key.
    pub left: BTreeMap<String, Held>,
    /// The right table's rows under this join key, by primary key.
    pub right: BTreeMap<String, Held>,
    /// Steps applied: orders the changes of a left row without a partner, which no right stamp
    /// does.
    pub clock: u64,
    /// The rows this group deleted, by `gone_key`: the stamp of the delete, and when (the
    /// operator's `now`).
    pub gone: Gone,
    /// When the step applied now is applied, in epoch milliseconds: what a new entry of `gone`
    /// records.
    pub now: i64,
}

/// The stamps of the deletes of rows a group no longer holds, with when each was applied.
pub type Gone = BTreeMap<String, (Stamp, i64)>;

/// A row's key in `Group::gone`.
pub fn gone_key(side: Side, pk: &str) -> String {
    match side {
        Side::Left => format!("left#{pk}"),
        Side::Right => format!("right#{pk}"),
    }
}

/// A row of the join: a left row with a right partner, or with none (left outer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Joined {
    /// The left row's primary key.
    pub left_pk: String,
    /// The left row's columns.
    pub left: Row,
    /// The right partner's primary key; none for a left row without a partner.
    pub right_pk: Option<String>,
    /// The right partner's columns; none for a left row without a partner.
    pub right: Option<Row>,
}

/// A joined row's identity in the view: both primary keys.
pub type JoinedId = (String, Option<String>);

impl Joined {
    /// The row's identity in the view: both primary keys.
    pub fn id(&self) -> JoinedId {
        (self.left_pk.clone(), self.right_pk.clone())
    }
}

/// A change of the joined changelog with the pair that orders it among the changes of its row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stamped {
    /// The stamps of the joined row's left and right rows as the change made them (for a left row
    /// without a partner, the group's count of steps in place of the right's): a later change of
    /// the joined row has a larger pair.
    pub stamp: (Stamp, Stamp),
    /// The joined row inserted or deleted.
    pub change: RowChange<Joined>,
}

/// The joined rows a step can change.
#[derive(Clone, Copy)]
enum Scope<'a> {
    /// Those of this left row.
    Left(&'a str),
    /// Those of this right row, and the left rows without a partner.
    Right(&'a str),
    /// All of them.
    All,
}

/// A joined row as of a group's state, with its pair.
#[derive(Clone, PartialEq)]
struct Current {
    joined: Joined,
    stamp: (Stamp, Stamp),
}

impl Group {
    /// The source rows held.
    pub fn rows(&self) -> usize {
        self.left.len() + self.right.len()
    }

    /// Whether the group holds no source row.
    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// Applies `step`, stamped `stamp`, of the row `pk` of `side`; returns the joined changes,
    /// deletes first.
    pub fn apply(
        &mut self,
        kind: JoinKind,
        side: Side,
        pk: &str,
        stamp: Stamp,
        step: RowChange<Row>,
    ) -> Vec<Stamped> {
        self.apply_within(kind, side, pk, stamp, step, false)
    }

    /// `apply`, looking at every joined row of the group when `whole` (what the scoped look
    /// must equal).
    fn apply_within(
        &mut self,
        kind: JoinKind,
        side: Side,
        pk: &str,
        stamp: Stamp,
        step: RowChange<Row>,
        whole: bool,
    ) -> Vec<Stamped> {
        let held = match side {
            Side::Left => self.left.get(pk),
            Side::Right => self.right.get(pk),
        };
        let gone = self.gone.get(&gone_key(side, pk)).map(|(at, _)| at);
        if held
            .map(|h| &h.stamp)
            .or(gone)
            .is_some_and(|last| *last >= stamp)
        {
            // A replayed step: the row has moved on since.
            return Vec::new();
        }
        let new = match step {
            RowChange::Insert(row) if held.is_some_and(|h| h.row == row) => return Vec::new(),
            RowChange::Insert(row) => Some(Held {
                row,
                stamp: stamp.clone(),
            }),
            RowChange::Delete(_) if held.is_none() => return Vec::new(),
            // The row held goes, whatever version the delete names: it is what the view joined.
            RowChange::Delete(_) => None,
        };
        // Only the joined rows of the row that changed can change: its pairs, and for a right
        // row, the left rows without a partner when it was the only one or is the first.
        let scope = match (side, whole) {
            (_, true) => Scope::All,
            (Side::Left, false) => Scope::Left(pk),
            (Side::Right, false) => Scope::Right(pk),
        };
        let before = self.joined(kind, scope);
        self.clock += 1;
        let rows = match side {
            Side::Left => &mut self.left,
            Side::Right => &mut self.right,
        };
        match new {
            Some(held) => {
                rows.insert(pk.to_owned(), held);
                self.gone.remove(&gone_key(side, pk));
            }
            None => {
                rows.remove(pk);
                self.gone
                    .insert(gone_key(side, pk), (stamp.clone(), self.now));
            }
        };
        // What went is stamped as the step that took it: the step's stamp on its side.
        let gone = self.joined_with(&before, side, pk, &stamp);
        diff(gone, self.joined(kind, scope))
    }

    /// The joined rows of this group within `scope`, by identity, each with its pair.
    fn joined(&self, kind: JoinKind, scope: Scope<'_>) -> BTreeMap<JoinedId, Current> {
        let mut out = BTreeMap::new();
        let lefts: Vec<(&String, &Held)> = match scope {
            Scope::Left(pk) => self.left.get_key_value(pk).into_iter().collect(),
            Scope::Right(_) | Scope::All => self.left.iter().collect(),
        };
        for (left_pk, left) in lefts {
            let partners: Vec<(Option<&String>, Option<&Held>)> = if self.right.is_empty() {
                match kind {
                    JoinKind::Inner => Vec::new(),
                    JoinKind::LeftOuter => vec![(None, None)],
                }
            } else if let Scope::Right(pk) = scope {
                let partner = self.right.get_key_value(pk);
                partner
                    .map(|(k, r)| (Some(k), Some(r)))
                    .into_iter()
                    .collect()
            } else {
                self.right.iter().map(|(k, r)| (Some(k), Some(r))).collect()
            };
            for (right_pk, right) in partners {
                let joined = Joined {
                    left_pk: left_pk.clone(),
                    left: left.row.clone(),
                    right_pk: right_pk.cloned(),
                    right: right.map(|r| r.row.clone()),
                };
                let second = right.map_or_else(|| Stamp::count(self.clock), |r| r.stamp.clone());
                let stamp = (left.stamp.clone(), second);
                out.insert(joined.id(), Current { joined, stamp });
            }
        }
        out
    }

    /// `before` with the pairs of the rows a step of `pk` of `side` changed set as that step
    /// made them: its stamp on its side, and the group's clock for a row without a partner.
    fn joined_with(
        &self,
        before: &BTreeMap<JoinedId, Current>,
        side: Side,
        pk: &str,
        stamp: &Stamp,
    ) -> BTreeMap<JoinedId, Current> {
        before
            .iter()
            .map(|(id, current)| {
                let mut current = current.clone();
                let (first, second) = &mut current.stamp;
                match (side, &id.1) {
                    (Side::Left, _) if id.0 == pk => *first = stamp.clone(),
                    (Side::Right, Some(right_pk)) if right_pk == pk => *second = stamp.clone(),
                    _ => {}
                }
                if id.1.is_none() {
                    *second = Stamp::count(self.clock);
                }
                (id.clone(), current)
            })
            .collect()
    }
}

/// The deletes and inserts that take a view from `before` to `after`: every joined row that went
/// or changed is deleted, then every one that came or changed is inserted.
fn diff(
    mut before: BTreeMap<JoinedId, Current>,
    after: BTreeMap<JoinedId, Current>,
) -> Vec<Stamped> {
    let mut inserts = Vec::new();
    for (id, current) in after {
        match before.remove(&id) {
            Some(old) if old.joined == current.joined => {}
            Some(old) => {
                before.insert(id, old);
                inserts.push(Stamped {
                    stamp: current.stamp,
                    change: RowChange::Insert(current.joined),
                });
            }
            None => inserts.push(Stamped {
                stamp: current.stamp,
                change: RowChange::Insert(current.joined),
            }),
        }
    }
    before
        .into_values()
        .map(|old| Stamped {
            stamp: old.stamp,
            change: RowChange::Delete(old.joined),
        })
        .chain(inserts)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet, VecDeque};

    use keyway::domain::changelog::debezium_changes;
    use keyway::domain::debezium::{Op, RowEvent};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use serde_json::json;

    use super::*;
    use crate::spec::{JoinKey, JoinSpec};
    use crate::view::View;

    fn row(value: serde_json::Value) -> Row {
        value.as_object().unwrap().clone()
    }

    fn ins(row: &Row) -> RowChange<Row> {
        RowChange::Insert(row.clone())
    }

    fn del(row: &Row) -> RowChange<Row> {
        RowChange::Delete(row.clone())
    }

    #[test]
    fn a_left_row_joins_the_right_rows_of_its_key_and_leaves_with_them() {
        let mut group = Group::default();
        let domain = row(json!({"id": 1, "user_id": 7}));
        let user = row(json!({"id": 7, "name": "ann"}));
        let kind = JoinKind::Inner;
        let out = group.apply(kind, Side::Left, "1", Stamp::insert("1"), ins(&domain));
        assert!(out.is_empty(), "no partner yet");
        let out = group.apply(kind, Side::Right, "7", Stamp::insert("1"), ins(&user));
        assert_eq!(out.len(), 1);
        assert!(out[0].change.is_insert());
        assert_eq!(out[0].change.row().right.as_ref(), Some(&user));
        assert_eq!(
            out[0].stamp,
            (Stamp::insert("1"), Stamp::insert("1")),
            "both rows' insert stamps"
        );
        let out = group.apply(kind, Side::Left, "1", Stamp::delete("2"), del(&domain));
        assert!(
            matches!(&out[..], [Stamped { stamp, change: RowChange::Delete(j) }] if j.right_pk.as_deref() == Some("7") && *stamp == (Stamp::delete("2"), Stamp::insert("1")))
        );
        assert_eq!(group.rows(), 1);
    }

    #[test]
    fn a_left_outer_row_has_no_partner_until_one_comes_and_again_when_it_goes() {
        let mut group = Group::default();
        let kind = JoinKind::LeftOuter;
        let domain = row(json!({"id": 1, "user_id": 7}));
        let user = row(json!({"id": 7}));
        let alone = group.apply(kind, Side::Left, "1", Stamp::insert("1"), ins(&domain));
        assert!(
            matches!(&alone[..], [s] if s.change.row().right.is_none() && s.stamp == (Stamp::insert("1"), Stamp::count(1)))
        );
        let paired = group.apply(kind, Side::Right, "7", Stamp::insert("1"), ins(&user));
        assert!(
            matches!(&paired[..], [a, b] if !a.change.is_insert() && a.change.row().right.is_none() && a.stamp == (Stamp::insert("1"), Stamp::count(2)) && b.change.row().right.is_some())
        );
        let alone = group.apply(kind, Side::Right, "7", Stamp::delete("2"), del(&user));
        assert!(
            matches!(&alone[..], [a, b] if a.change.row().right.is_some() && b.change.row().right.is_none() && b.stamp == (Stamp::insert("1"), Stamp::count(3))),
            "the partnerless row comes back under a larger pair than it went"
        );
    }

    #[test]
    fn a_duplicate_or_a_retraction_of_a_row_not_held_changes_nothing() {
        let mut group = Group::default();
        let domain = row(json!({"id": 1, "user_id": 7}));
        let kind = JoinKind::LeftOuter;
        assert!(group
            .apply(kind, Side::Left, "1", Stamp::delete("1"), del(&domain))
            .is_empty());
        assert!(group.is_empty());
        group.apply(kind, Side::Left, "1", Stamp::insert("1"), ins(&domain));
        assert!(group
            .apply(kind, Side::Left, "1", Stamp::insert("1"), ins(&domain))
            .is_empty());
        assert_eq!(group.rows(), 1);
    }

    #[test]
    fn a_row_replaced_within_one_step_is_deleted_and_inserted_under_one_pair_and_the_insert_wins() {
        let mut group = Group::default();
        let kind = JoinKind::LeftOuter;
        let v1 = row(json!({"id": 1, "user_id": 7, "v": 1}));
        let v2 = row(json!({"id": 1, "user_id": 7, "v": 2}));
        let mut view = View::default();
        for s in group.apply(kind, Side::Left, "1", Stamp::insert("1"), ins(&v1)) {
            view.apply(s);
        }
        let out = group.apply(kind, Side::Left, "1", Stamp::insert("2"), ins(&v2));
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].stamp, out[1].stamp);
        // In either order the view ends with the new version.
        for order in [[0, 1], [1, 0]] {
            let mut v = view.clone();
            for i in order {
                v.apply(out[i].clone());
            }
            let rows: Vec<&Joined> = v.rows().collect();
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0].left["v"], 2);
        }
    }

    #[test]
    fn a_replayed_run_of_steps_after_the_rows_moved_on_changes_nothing() {
        // A retried re-key batch sends a domain's update again after the group saw the update
        // and then the user's delete: neither the old delete nor the old insert may apply.
        let kind = JoinKind::LeftOuter;
        let user = row(json!({"id": 7}));
        let (v1, v2) = (
            row(json!({"id": 1, "user_id": 7, "v": 1})),
            row(json!({"id": 1, "user_id": 7, "v": 2})),
        );
        let steps = [
            (Side::Right, "7", Stamp::insert("10"), ins(&user)),
            (Side::Left, "1", Stamp::insert("11"), ins(&v1)),
            (Side::Left, "1", Stamp::delete("12"), del(&v1)),
            (Side::Left, "1", Stamp::insert("12"), ins(&v2)),
            // The replay of the update's delete, the user's delete, the replay of the insert.
            (Side::Left, "1", Stamp::delete("12"), del(&v1)),
            (Side::Right, "7", Stamp::delete("13"), del(&user)),
            (Side::Left, "1", Stamp::insert("12"), ins(&v2)),
            // A row deleted, then its insert replayed: it stays deleted.
            (Side::Left, "1", Stamp::delete("14"), del(&v2)),
            (Side::Left, "1", Stamp::insert("12"), ins(&v2)),
        ];
        let mut group = Group::default();
        let mut view = View::default();
        for (i, (side, pk, stamp, step)) in steps.into_iter().enumerate() {
            for change in group.apply(kind, side, pk, stamp, step) {
                view.apply(change);
            }
            let expected: Vec<JoinedId> = match i {
                1 | 3 | 4 => vec![("1".into(), Some("7".into()))],
                5 | 6 => vec![("1".into(), None)],
                _ => vec![],
            };
            let ids: Vec<JoinedId> = view.rows().map(Joined::id).collect();
            assert_eq!(ids, expected, "after step {i}");
        }
        assert!(group.is_empty(), "no row held");
        assert_eq!(group.gone.len(), 2, "the deletes' stamps, for replays");
    }

    /// A row of `side` under join key `key`, in a group of its own when the key is NULL.
    fn group_key(key: JoinKey, side: Side, pk: &str) -> (JoinKey, Side, String) {
        match key {
            JoinKey::Null => (key, side, pk.to_owned()),
            JoinKey::Value(_) => (key, Side::Left, String::new()),
        }
    }

    /// A step on its way to its group: which row, its stamp, what it does.
    #[derive(Clone)]
    struct Step {
        side: Side,
        pk: String,
        stamp: Stamp,
        change: RowChange<Row>,
    }

    /// Two tables changed at random (inserts, updates that move join keys and primary keys,
    /// deletes), each change through the changelog into the queue of the join key its step
    /// belongs to; steps are sometimes sent twice, as a retried re-key sends them again. The
    /// groups then take their queues in random interleavings, each queue in order, as shards
    /// do, and their stamped changes reach one view: it ends as the join of the final tables,
    /// and the groups hold exactly the live rows.
    #[test]
    fn random_changes_in_any_order_between_join_keys_keep_the_view_equal_to_the_join_and_no_row_leaks(
    ) {
        let mut pairs = 0;
        for (seed, kind) in (0..60).flat_map(|s| [(s, JoinKind::Inner), (s, JoinKind::LeftOuter)]) {
            let spec = JoinSpec::parse("domains.user_id=users.id", kind).unwrap();
            let mut rng = StdRng::seed_from_u64(seed);
            let mut tables: BTreeMap<Side, BTreeMap<String, Row>> = BTreeMap::new();
            // Positions of the changes, growing as a stream's sequence numbers do.
            let mut sequence: u64 = 0;
            let mut queues: BTreeMap<(JoinKey, Side, String), VecDeque<Step>> = BTreeMap::new();
            for _ in 0..300 {
                let side = if rng.random_bool(0.5) {
                    Side::Left
                } else {
                    Side::Right
                };
                let pk = rng.random_range(0..10u32).to_string();
                let table = tables.entry(side).or_default();
                let stored = table.get(&pk).cloned();
                let event = random_event(&mut rng, side, &pk, stored.as_ref());
                let steps = debezium_changes(&event, stored.as_ref());
                sequence += rng.random_range(1..1_000);
                let at = sequence.to_string();
                let mut sent = Vec::new();
                for change in steps {
                    let stamp = match &change {
                        RowChange::Delete(_) => {
                            table.remove(&pk);
                            Stamp::delete(&at)
                        }
                        RowChange::Insert(r) => {
                            table.insert(pk.clone(), r.clone());
                            Stamp::insert(&at)
                        }
                    };
                    let key = group_key(spec.join_key(side, change.row()), side, &pk);
                    sent.push((
                        key,
                        Step {
                            side,
                            pk: pk.clone(),
                            stamp,
                            change,
                        },
                    ));
                }
                // A retried re-key sends the change's steps again, after the first.
                let times = if rng.random_bool(0.1) { 2 } else { 1 };
                for _ in 0..times {
                    for (key, step) in &sent {
                        queues
                            .entry(key.clone())
                            .or_default()
                            .push_back(step.clone());
                    }
                }
            }
            let mut groups: BTreeMap<(JoinKey, Side, String), Group> = BTreeMap::new();
            let mut view = View::default();
            while !queues.is_empty() {
                let at = rng.random_range(0..queues.len());
                let key = queues.keys().nth(at).unwrap().clone();
                let queue = queues.get_mut(&key).unwrap();
                let step = queue.pop_front().unwrap();
                if queue.is_empty() {
                    queues.remove(&key);
                }
                let group = groups.entry(key).or_default();
                let mut whole = group.clone();
                let Step {
                    side,
                    pk,
                    stamp,
                    change,
                } = step;
                let seen = whole.apply_within(kind, side, &pk, stamp.clone(), change.clone(), true);
                let out = group.apply(kind, side, &pk, stamp, change);
                assert_eq!(out, seen, "seed {seed}: the scoped look misses nothing");
                for stamped in out {
                    view.apply(stamped);
                }
            }
            let live: usize = tables.values().map(BTreeMap::len).sum();
            let held: usize = groups.values().map(Group::rows).sum();
            assert_eq!(held, live, "seed {seed}: state rows equal live source rows");
            let expected = oracle(&spec, &tables);
            let got: BTreeMap<JoinedId, Joined> =
                view.rows().map(|j| (j.id(), j.clone())).collect();
            assert_eq!(
                got.keys().cloned().collect::<BTreeSet<_>>(),
                expected.keys().cloned().collect::<BTreeSet<_>>(),
                "seed {seed} {kind:?}"
            );
            assert_eq!(got, expected, "seed {seed} {kind:?}: the rows' contents");
            pairs += expected.keys().filter(|(_, right)| right.is_some()).count();
        }
        assert!(
            pairs > 500,
            "the runs join rows: {pairs} pairs in the final views"
        );
    }

    fn random_event(rng: &mut StdRng, side: Side, pk: &str, stored: Option<&Row>) -> RowEvent {
        let join_value = |rng: &mut StdRng| match rng.random_range(0..5) {
            0 => serde_json::Value::Null,
            n => json!(n),
        };
        let new_row = |rng: &mut StdRng| {
            let mut r = Row::new();
            // Numbers, as the right side's `id` the left side's `user_id` names.
            r.insert("id".into(), json!(pk.parse::<u32>().unwrap()));
            match side {
                Side::Left => r.insert("user_id".into(), join_value(rng)),
                Side::Right => r.insert("name".into(), json!(rng.random_range(0..3))),
            };
            r
        };
        let (op, before, after) = match (stored, rng.random_range(0..3)) {
            (None, _) => (Op::Create, None, Some(new_row(rng))),
            (Some(s), 0) => (Op::Delete, Some(s.clone()), None),
            (Some(s), _) => (Op::Update, Some(s.clone()), Some(new_row(rng))),
        };
        RowEvent::new(op, before, after)
    }

    /// The join of the tables, written plainly.
    fn oracle(
        spec: &JoinSpec,
        tables: &BTreeMap<Side, BTreeMap<String, Row>>,
    ) -> BTreeMap<JoinedId, Joined> {
        let empty = BTreeMap::new();
        let left = tables.get(&Side::Left).unwrap_or(&empty);
        let right = tables.get(&Side::Right).unwrap_or(&empty);
        let mut out = BTreeMap::new();
        for (lpk, l) in left {
            let key = spec.join_key(Side::Left, l);
            let partners: Vec<(&String, &Row)> = right
                .iter()
                .filter(|(_, r)| key != JoinKey::Null && spec.join_key(Side::Right, r) == key)
                .collect();
            let mut add = |right_pk: Option<&String>, right: Option<&Row>| {
                let joined = Joined {
                    left_pk: lpk.clone(),
                    left: l.clone(),
                    right_pk: right_pk.cloned(),
                    right: right.cloned(),
                };
                out.insert(joined.id(), joined);
            };
            if partners.is_empty() && spec.kind == JoinKind::LeftOuter {
                add(None, None);
            }
            for (rpk, r) in partners {
                add(Some(rpk), Some(r));
            }
        }
        out
    }
}
