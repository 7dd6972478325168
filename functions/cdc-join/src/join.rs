//! The rows of both sides under one join key, and what each change does to the join.
//!
//! Every change reaches the join as a delete or an insert of one source row (by primary key)
//! under the join key the row has or had: an update that moved a row to another join key is a
//! delete under the old key and an insert under the new one, so no group keeps a row its source
//! no longer has, and the state holds exactly the live source rows. Each step answers with the
//! joined changelog: the joined rows it takes away (deletes, first) and those it adds (inserts).
//! Applied in order to a view keyed by `Joined::id`, they keep the view equal to the join of the
//! current source rows.
//!
//! A step that changes nothing changes nothing: a delete of a row the group does not hold (a
//! duplicate, a replay, FLINK-19795's "retract a non-existent record") and an insert of a row it
//! already holds make no joined change and never fail. An insert of another version of a row the
//! group holds replaces it.

use std::collections::BTreeMap;

use keyway::domain::debezium::Row;
use keyway::domain::RowChange;

use crate::spec::{JoinKind, Side};

/// The rows of both sides under one join key, by primary key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Group {
    pub left: BTreeMap<String, Row>,
    pub right: BTreeMap<String, Row>,
}

/// A row of the join: a left row with a right partner, or with none (left outer).
#[derive(Clone, Debug, PartialEq)]
pub struct Joined {
    pub left_pk: String,
    pub left: Row,
    pub right_pk: Option<String>,
    pub right: Option<Row>,
}

impl Joined {
    /// The row's identity in the view: both primary keys.
    pub fn id(&self) -> (String, Option<String>) {
        (self.left_pk.clone(), self.right_pk.clone())
    }
}

impl Group {
    /// The source rows held.
    pub fn rows(&self) -> usize {
        self.left.len() + self.right.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// Applies `step` of the row `pk` of `side`; returns the joined changes, deletes first.
    pub fn apply(
        &mut self,
        kind: JoinKind,
        side: Side,
        pk: &str,
        step: RowChange<Row>,
    ) -> Vec<RowChange<Joined>> {
        let held = match side {
            Side::Left => self.left.get(pk),
            Side::Right => self.right.get(pk),
        };
        let new = match step {
            RowChange::Insert(row) if held == Some(&row) => return Vec::new(),
            RowChange::Insert(row) => Some(row),
            RowChange::Delete(_) if held.is_none() => return Vec::new(),
            // The row held goes, whatever version the delete names: it is what the view joined.
            RowChange::Delete(_) => None,
        };
        let before = self.joined(kind);
        let rows = match side {
            Side::Left => &mut self.left,
            Side::Right => &mut self.right,
        };
        match new {
            Some(row) => rows.insert(pk.to_owned(), row),
            None => rows.remove(pk),
        };
        diff(before, self.joined(kind))
    }

    /// The joined rows of this group, by identity.
    fn joined(&self, kind: JoinKind) -> BTreeMap<(String, Option<String>), Joined> {
        let mut out = BTreeMap::new();
        for (left_pk, left) in &self.left {
            let partners: Vec<(Option<&String>, Option<&Row>)> = if self.right.is_empty() {
                match kind {
                    JoinKind::Inner => Vec::new(),
                    JoinKind::LeftOuter => vec![(None, None)],
                }
            } else {
                self.right.iter().map(|(k, r)| (Some(k), Some(r))).collect()
            };
            for (right_pk, right) in partners {
                let joined = Joined {
                    left_pk: left_pk.clone(),
                    left: left.clone(),
                    right_pk: right_pk.cloned(),
                    right: right.cloned(),
                };
                out.insert(joined.id(), joined);
            }
        }
        out
    }
}

/// The deletes and inserts that take a view from `before` to `after`: every joined row that went
/// or changed is deleted, then every one that came or changed is inserted.
fn diff(
    mut before: BTreeMap<(String, Option<String>), Joined>,
    after: BTreeMap<(String, Option<String>), Joined>,
) -> Vec<RowChange<Joined>> {
    let mut inserts = Vec::new();
    for (id, row) in after {
        match before.remove(&id) {
            Some(old) if old == row => {}
            Some(old) => {
                before.insert(id, old);
                inserts.push(RowChange::Insert(row));
            }
            None => inserts.push(RowChange::Insert(row)),
        }
    }
    before
        .into_values()
        .map(RowChange::Delete)
        .chain(inserts)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use keyway::domain::changelog::debezium_changes;
    use keyway::domain::debezium::{Op, RowEvent};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use serde_json::json;

    use super::*;
    use crate::spec::{JoinKey, JoinSpec};

    fn row(value: serde_json::Value) -> Row {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn a_left_row_joins_the_right_rows_of_its_key_and_leaves_with_them() {
        let mut group = Group::default();
        let domain = row(json!({"id": 1, "user_id": 7}));
        let user = row(json!({"id": 7, "name": "ann"}));
        let out = group.apply(
            JoinKind::Inner,
            Side::Left,
            "1",
            RowChange::Insert(domain.clone()),
        );
        assert!(out.is_empty(), "no partner yet");
        let out = group.apply(
            JoinKind::Inner,
            Side::Right,
            "7",
            RowChange::Insert(user.clone()),
        );
        assert_eq!(out.len(), 1);
        assert!(out[0].is_insert());
        assert_eq!(out[0].row().right.as_ref(), Some(&user));
        let out = group.apply(JoinKind::Inner, Side::Left, "1", RowChange::Delete(domain));
        assert!(matches!(&out[..], [RowChange::Delete(j)] if j.right_pk.as_deref() == Some("7")));
        assert_eq!(group.rows(), 1);
    }

    #[test]
    fn a_left_outer_row_has_no_partner_until_one_comes_and_again_when_it_goes() {
        let mut group = Group::default();
        let kind = JoinKind::LeftOuter;
        let domain = row(json!({"id": 1, "user_id": 7}));
        let user = row(json!({"id": 7}));
        let alone = group.apply(kind, Side::Left, "1", RowChange::Insert(domain));
        assert!(matches!(&alone[..], [RowChange::Insert(j)] if j.right.is_none()));
        let paired = group.apply(kind, Side::Right, "7", RowChange::Insert(user.clone()));
        assert!(
            matches!(&paired[..], [RowChange::Delete(a), RowChange::Insert(b)] if a.right.is_none() && b.right.is_some())
        );
        let alone = group.apply(kind, Side::Right, "7", RowChange::Delete(user));
        assert!(
            matches!(&alone[..], [RowChange::Delete(a), RowChange::Insert(b)] if a.right.is_some() && b.right.is_none())
        );
    }

    #[test]
    fn a_duplicate_or_a_retraction_of_a_row_not_held_changes_nothing() {
        let mut group = Group::default();
        let domain = row(json!({"id": 1, "user_id": 7}));
        let kind = JoinKind::LeftOuter;
        assert!(group
            .apply(kind, Side::Left, "1", RowChange::Delete(domain.clone()))
            .is_empty());
        assert!(group.is_empty());
        group.apply(kind, Side::Left, "1", RowChange::Insert(domain.clone()));
        assert!(group
            .apply(kind, Side::Left, "1", RowChange::Insert(domain))
            .is_empty());
        assert_eq!(group.rows(), 1);
    }

    /// Two tables changed at random (inserts, updates that move join keys and primary keys,
    /// deletes, duplicates), each change through the changelog and the groups: the view the
    /// joined changelog builds is the join of the final tables, and the groups hold exactly the
    /// live rows.
    #[test]
    fn random_changes_keep_the_view_equal_to_the_join_of_the_tables_and_no_row_leaks() {
        for (seed, kind) in (0..40).flat_map(|s| [(s, JoinKind::Inner), (s, JoinKind::LeftOuter)]) {
            let spec = JoinSpec::parse("domains.user_id=users.id", kind).unwrap();
            let mut rng = StdRng::seed_from_u64(seed);
            let mut tables: BTreeMap<Side, BTreeMap<String, Row>> = BTreeMap::new();
            let mut groups: BTreeMap<(JoinKey, Side, String), Group> = BTreeMap::new();
            let mut view: BTreeMap<(String, Option<String>), Joined> = BTreeMap::new();
            for _ in 0..400 {
                let side = if rng.random_bool(0.5) {
                    Side::Left
                } else {
                    Side::Right
                };
                let pk: u32 = rng.random_range(0..12);
                let table = tables.entry(side).or_default();
                let stored = table.get(&pk.to_string()).cloned();
                let event = random_event(&mut rng, side, pk, stored.as_ref());
                let steps = debezium_changes(&event, stored.as_ref());
                let repeat = if rng.random_bool(0.1) { 2 } else { 1 };
                for step in steps {
                    match &step {
                        RowChange::Delete(_) => table.remove(&pk.to_string()),
                        RowChange::Insert(r) => table.insert(pk.to_string(), r.clone()),
                    };
                    for _ in 0..repeat {
                        let key = spec.join_key(side, step.row());
                        // A row without a join key joins nothing: a group of its own.
                        let group_key = match &key {
                            JoinKey::Null => (key.clone(), side, pk.to_string()),
                            JoinKey::Value(_) => (key.clone(), Side::Left, String::new()),
                        };
                        let group = groups.entry(group_key).or_default();
                        for change in group.apply(kind, side, &pk.to_string(), step.clone()) {
                            apply_to_view(&mut view, change);
                        }
                    }
                }
            }
            let live: usize = tables.values().map(BTreeMap::len).sum();
            let held: usize = groups.values().map(Group::rows).sum();
            assert_eq!(held, live, "seed {seed}: state rows equal live source rows");
            let expected = oracle(&spec, &tables);
            let got: BTreeSet<_> = view.keys().cloned().collect();
            assert_eq!(got, expected, "seed {seed} {kind:?}");
        }
    }

    fn random_event(rng: &mut StdRng, side: Side, pk: u32, stored: Option<&Row>) -> RowEvent {
        let join_value = |rng: &mut StdRng| match rng.random_range(0..6) {
            0 => serde_json::Value::Null,
            n => json!(n),
        };
        let new_row = |rng: &mut StdRng| {
            let mut r = Row::new();
            r.insert("id".into(), json!(pk));
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

    fn apply_to_view(
        view: &mut BTreeMap<(String, Option<String>), Joined>,
        change: RowChange<Joined>,
    ) {
        match change {
            RowChange::Insert(j) => {
                assert!(
                    view.insert(j.id(), j).is_none(),
                    "an insert of a row the view has"
                );
            }
            RowChange::Delete(j) => {
                assert_eq!(
                    view.remove(&j.id()),
                    Some(j),
                    "a delete of a row it has not"
                );
            }
        }
    }

    /// The join of the tables, written plainly.
    fn oracle(
        spec: &JoinSpec,
        tables: &BTreeMap<Side, BTreeMap<String, Row>>,
    ) -> BTreeSet<(String, Option<String>)> {
        let empty = BTreeMap::new();
        let left = tables.get(&Side::Left).unwrap_or(&empty);
        let right = tables.get(&Side::Right).unwrap_or(&empty);
        let mut out = BTreeSet::new();
        for (lpk, l) in left {
            let key = spec.join_key(Side::Left, l);
            let partners: Vec<&String> = right
                .iter()
                .filter(|(_, r)| key != JoinKey::Null && spec.join_key(Side::Right, r) == key)
                .map(|(rpk, _)| rpk)
                .collect();
            if partners.is_empty() && spec.kind == JoinKind::LeftOuter {
                out.insert((lpk.clone(), None));
            }
            for rpk in partners {
                out.insert((lpk.clone(), Some(rpk.clone())));
            }
        }
        out
    }
}
