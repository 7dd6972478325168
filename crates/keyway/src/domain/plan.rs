//! The batch plan: which records belong to which key, in arrival order.

use std::collections::HashMap;

/// The records of one key, as indexes into the batch, in arrival order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyGroup {
    /// The key the records share.
    pub key: String,
    /// The records' indexes into the batch, in arrival order.
    pub records: Vec<usize>,
}

/// Keys in order of their first record, each with its records in arrival order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct BatchPlan {
    /// One group per key, in order of the key's first record.
    pub groups: Vec<KeyGroup>,
}

impl BatchPlan {
    /// Groups `(record index, key)` pairs, given in arrival order.
    pub(crate) fn group<'a>(keyed: impl IntoIterator<Item = (usize, &'a str)>) -> Self {
        let mut groups: Vec<KeyGroup> = Vec::new();
        let mut position: HashMap<&'a str, usize> = HashMap::new();
        for (index, key) in keyed {
            let at = *position.entry(key).or_insert_with(|| {
                groups.push(KeyGroup {
                    key: key.to_owned(),
                    records: Vec::new(),
                });
                groups.len() - 1
            });
            groups[at].records.push(index);
        }
        Self { groups }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_grouped_by_key_keeping_arrival_order_within_each_key() {
        let plan = BatchPlan::group([(0, "a"), (1, "b"), (2, "a"), (4, "c"), (5, "b")]);
        assert_eq!(
            plan.groups,
            vec![
                KeyGroup {
                    key: "a".into(),
                    records: vec![0, 2]
                },
                KeyGroup {
                    key: "b".into(),
                    records: vec![1, 5]
                },
                KeyGroup {
                    key: "c".into(),
                    records: vec![4]
                },
            ]
        );
    }
}
