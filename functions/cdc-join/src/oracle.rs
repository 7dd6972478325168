//! The join of the source tables as they end, computed plainly from the changes in their order:
//! what the view must converge to, for `keyway cdc --check`, the benchmark and the tests. It
//! shares only the join's definition (`JoinSpec::join_key`: NULL joins nothing) with the
//! incremental join it checks.

use std::collections::BTreeMap;

use keyway::domain::debezium::{Op, Row, RowEvent};

use crate::join::{Joined, JoinedId};
use crate::spec::{JoinKey, JoinKind, JoinSpec, Side};

/// Every table's rows by primary key, as the changes applied so far leave them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tables {
    /// Each table's rows by primary key, by the table's name.
    pub rows: BTreeMap<String, BTreeMap<String, Row>>,
}

impl Tables {
    /// Applies one change of `table`'s row `pk`, in the order its source made it: a create, read
    /// or update leaves the row as after, a delete removes it, a truncate empties the table.
    pub fn apply(&mut self, table: &str, pk: &str, event: &RowEvent) {
        let rows = self.rows.entry(table.to_owned()).or_default();
        match (event.op, &event.after) {
            (Op::Create | Op::Read | Op::Update, Some(after)) => {
                rows.insert(pk.to_owned(), after.clone());
            }
            (Op::Delete, _) => {
                rows.remove(pk);
            }
            (Op::Truncate, _) => rows.clear(),
            _ => {}
        }
    }

    /// Rows of every table.
    pub fn len(&self) -> usize {
        self.rows.values().map(BTreeMap::len).sum()
    }

    /// Whether no table holds a row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The join of the tables as they are, of the rows the join's filter lets through.
    pub fn join(&self, spec: &JoinSpec) -> BTreeMap<JoinedId, Joined> {
        let side = |s: Side| -> BTreeMap<&String, &Row> {
            let table = spec.table(s);
            self.rows
                .get(table)
                .into_iter()
                .flatten()
                .filter(|(_, row)| spec.takes_part(table, row))
                .collect()
        };
        let (left, right) = (side(Side::Left), side(Side::Right));
        let mut out = BTreeMap::new();
        for (left_pk, left_row) in left {
            let key = spec.join_key(Side::Left, left_row);
            let partners: Vec<(&String, &Row)> = match &key {
                JoinKey::Null => Vec::new(),
                JoinKey::Value(_) => right
                    .iter()
                    .filter(|(_, row)| spec.join_key(Side::Right, row) == key)
                    .map(|(pk, row)| (*pk, *row))
                    .collect(),
            };
            let mut add = |right: Option<(&String, &Row)>| {
                let joined = Joined {
                    left_pk: left_pk.clone(),
                    left: left_row.clone(),
                    right_pk: right.map(|(pk, _)| pk.clone()),
                    right: right.map(|(_, row)| row.clone()),
                };
                out.insert(joined.id(), joined);
            };
            if partners.is_empty() && spec.kind == JoinKind::LeftOuter {
                add(None);
            }
            for partner in partners {
                add(Some(partner));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn row(value: serde_json::Value) -> Row {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_oracle_joins_the_tables_as_their_last_changes_leave_them() {
        let mut tables = Tables::default();
        let domain = |user: serde_json::Value| row(json!({"id": 1, "user_id": user}));
        let create = |r: Row| RowEvent::new(Op::Create, None, Some(r));
        tables.apply("users", "7", &create(row(json!({"id": 7}))));
        tables.apply("users", "8", &create(row(json!({"id": 8}))));
        tables.apply("domains", "1", &create(domain(json!(7))));
        let moved = RowEvent::new(Op::Update, Some(domain(json!(7))), Some(domain(json!(8))));
        tables.apply("domains", "1", &moved);
        tables.apply(
            "domains",
            "2",
            &create(row(json!({"id": 2, "user_id": null}))),
        );
        tables.apply("users", "7", &RowEvent::new(Op::Delete, None, None));
        let inner = JoinSpec::parse("domains.user_id=users.id", JoinKind::Inner).unwrap();
        let ids: Vec<JoinedId> = tables.join(&inner).into_keys().collect();
        assert_eq!(ids, [("1".to_owned(), Some("8".to_owned()))]);
        let left = JoinSpec::parse("domains.user_id=users.id", JoinKind::LeftOuter).unwrap();
        assert_eq!(tables.join(&left).len(), 2, "domain 2 joins no one");
        tables.apply("users", "", &RowEvent::new(Op::Truncate, None, None));
        assert_eq!(tables.len(), 2);
        assert!(tables.join(&inner).is_empty());
    }
}
