//! The changelog model: every change to a row is a `Delete` of the row as it was, an `Insert` of
//! the row as it is, or an update as both, the delete first. State kept by a key the row no longer
//! has is then removed by the delete, wherever the insert goes: nothing stale is left behind when
//! a change moves a row to another key (a subscription to another filter key, a row to another
//! join key).
//!
//! A change that does not carry the row as it was (a REMOVE or MODIFY from a stream without old
//! images) is completed from the row the caller stored, never guessed: with no stored row there
//! is nothing to delete.

use super::{Change, ChangeKind, InvalidInput, Item};

/// One step of a changelog.
#[derive(Clone, Debug, PartialEq)]
pub enum RowChange<R> {
    Delete(R),
    Insert(R),
}

impl<R> RowChange<R> {
    pub fn row(&self) -> &R {
        match self {
            RowChange::Delete(row) | RowChange::Insert(row) => row,
        }
    }

    pub fn is_insert(&self) -> bool {
        matches!(self, RowChange::Insert(_))
    }
}

/// A DynamoDB Streams change as changelog steps: INSERT inserts the new image, REMOVE deletes the
/// old one, MODIFY deletes the old and inserts the new. `stored` is the row as the caller last
/// stored it, for a change without its old image.
pub fn dynamodb_changes(
    change: &Change,
    stored: Option<&Item>,
) -> Result<Vec<RowChange<Item>>, InvalidInput> {
    let before = || change.old_image.as_ref().or(stored).cloned();
    let after = || {
        change.new_image.clone().ok_or_else(|| {
            InvalidInput::new(
                "dynamodb.NewImage",
                "missing: a stream that does not carry new images (KEYS_ONLY, OLD_IMAGE) cannot \
                 say what the row became; use NEW_IMAGE or NEW_AND_OLD_IMAGES",
            )
        })
    };
    Ok(match change.kind {
        ChangeKind::Insert => vec![RowChange::Insert(after()?)],
        ChangeKind::Remove => before().map(RowChange::Delete).into_iter().collect(),
        ChangeKind::Modify => {
            let insert = RowChange::Insert(after()?);
            before()
                .map(RowChange::Delete)
                .into_iter()
                .chain([insert])
                .collect()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::AttrValue;

    fn row(id: &str, key: &str) -> Item {
        Item::from([
            ("id".to_owned(), AttrValue::S(id.into())),
            ("filterKey".to_owned(), AttrValue::S(key.into())),
        ])
    }

    fn change(kind: ChangeKind, old: Option<Item>, new: Option<Item>) -> Change {
        Change {
            kind,
            table: None,
            keys: Item::from([("id".to_owned(), AttrValue::S("1".into()))]),
            old_image: old,
            new_image: new,
            ttl_deletion: false,
        }
    }

    #[test]
    fn a_modification_is_the_delete_of_the_old_row_then_the_insert_of_the_new() {
        let moved = change(
            ChangeKind::Modify,
            Some(row("1", "sheet-a")),
            Some(row("1", "sheet-b")),
        );
        assert_eq!(
            dynamodb_changes(&moved, None).unwrap(),
            [
                RowChange::Delete(row("1", "sheet-a")),
                RowChange::Insert(row("1", "sheet-b"))
            ]
        );
    }

    #[test]
    fn inserts_and_removals_are_one_step_each() {
        let inserted = change(ChangeKind::Insert, None, Some(row("1", "a")));
        assert_eq!(
            dynamodb_changes(&inserted, None).unwrap(),
            [RowChange::Insert(row("1", "a"))]
        );
        let removed = change(ChangeKind::Remove, Some(row("1", "a")), None);
        assert_eq!(
            dynamodb_changes(&removed, None).unwrap(),
            [RowChange::Delete(row("1", "a"))]
        );
    }

    #[test]
    fn a_missing_old_image_is_taken_from_the_stored_row_and_never_guessed() {
        let modified = change(ChangeKind::Modify, None, Some(row("1", "b")));
        assert_eq!(
            dynamodb_changes(&modified, Some(&row("1", "a"))).unwrap(),
            [
                RowChange::Delete(row("1", "a")),
                RowChange::Insert(row("1", "b"))
            ]
        );
        // Nothing stored: nothing to delete.
        assert_eq!(
            dynamodb_changes(&modified, None).unwrap(),
            [RowChange::Insert(row("1", "b"))]
        );
        let removed = change(ChangeKind::Remove, None, None);
        assert_eq!(dynamodb_changes(&removed, None).unwrap(), []);
    }

    #[test]
    fn a_change_without_its_new_image_is_refused_naming_the_field() {
        let keys_only = change(ChangeKind::Modify, None, None);
        let e = dynamodb_changes(&keys_only, None).unwrap_err();
        assert_eq!(e.field, "dynamodb.NewImage");
        assert!(e.problem.contains("NEW_AND_OLD_IMAGES"), "{e}");
    }
}
