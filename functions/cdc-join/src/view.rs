//! The materialized view as the join's changes build it, in any order between groups: each joined
//! row keeps the rank of the last change applied to it, and a change applies only over a lower
//! rank (see `join`'s stamps). A deleted row stays as a tombstone with its rank, so that a change
//! from before the delete, coming late from another group, cannot bring it back.
//!
//! A change's rank is its pair of stamps, then 1 for an insert or 0 for a delete: within one step
//! a joined row can be deleted and inserted again under the same pair (a row replaced by a new
//! version), and of the two the insert wins. Stamps have a fixed width, so ranks compare as text:
//! the DynamoDB view (`view_table`) keeps the same rule as a condition on one attribute.

use std::collections::BTreeMap;

use keyway::domain::RowChange;

use crate::join::{Joined, JoinedId, Stamped};

/// Where `stamped` stands among the changes of its joined row: greater is later.
pub fn rank(stamped: &Stamped) -> String {
    let (first, second) = &stamped.stamp;
    let insert = u8::from(stamped.change.is_insert());
    format!("{}/{}/{insert}", first.0, second.0)
}

/// A joined row as the view holds it: its content, or a tombstone, and the rank that set it.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The rank of the change that set the entry (`rank`): only a higher one replaces it.
    pub rank: String,
    /// The joined row; none for a tombstone.
    pub row: Option<Joined>,
}

/// The view: joined rows by identity, tombstones included.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Every joined row a change reached, by identity, deleted ones as tombstones.
    pub entries: BTreeMap<JoinedId, Entry>,
}

impl View {
    /// Applies `stamped` if it ranks above what the view holds of its row; says whether it did.
    pub fn apply(&mut self, stamped: Stamped) -> bool {
        let rank = rank(&stamped);
        let (id, row) = match stamped.change {
            RowChange::Insert(joined) => (joined.id(), Some(joined)),
            RowChange::Delete(joined) => (joined.id(), None),
        };
        let applies = self.entries.get(&id).is_none_or(|entry| rank > entry.rank);
        if applies {
            self.entries.insert(id, Entry { rank, row });
        }
        applies
    }

    /// The joined rows, tombstones left out.
    pub fn rows(&self) -> impl Iterator<Item = &Joined> {
        self.entries.values().filter_map(|e| e.row.as_ref())
    }
}
