//! The changelog model: every change to a row is a `Delete` of the row as it was, an `Insert` of
//! the row as it is, or an update as both, the delete first; DynamoDB Streams changes and
//! Debezium change events (`super::debezium`) alike. State kept by a key the row no longer
//! has is then removed by the delete, wherever the insert goes: nothing stale is left behind when
//! a change moves a row to another key (a subscription to another filter key, a row to another
//! join key).
//!
//! A change that does not carry the row as it was (a REMOVE or MODIFY from a stream without old
//! images) is completed from the row the caller stored, never guessed: with no stored row there
//! is nothing to delete.

use super::debezium::{Op, Row, RowEvent};
use super::item::item_to_plain_json;
use super::{Change, ChangeKind, InvalidInput, Item};

/// One step of a changelog; as JSON `{"op": "delete" | "insert", "row": ...}`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", content = "row", rename_all = "lowercase")]
pub enum RowChange<R> {
    /// Removes the row as it was.
    Delete(R),
    /// Adds the row as it is now.
    Insert(R),
}

impl<R> RowChange<R> {
    /// The row deleted or inserted.
    pub fn row(&self) -> &R {
        match self {
            RowChange::Delete(row) | RowChange::Insert(row) => row,
        }
    }

    /// True for an insert.
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

/// A DynamoDB Streams change as a row event of plain JSON rows (`AttrValue::to_plain_json`), for
/// a consumer that handles Debezium's and DynamoDB's changes alike: INSERT creates, MODIFY
/// updates, REMOVE deletes (a TTL deletion too: the row is gone). The new image is required where
/// the row goes on; the old image may be missing (a stream of new images only) and is then taken
/// from the stored row by `debezium_changes`.
pub fn dynamodb_row_event(change: &Change) -> Result<RowEvent, InvalidInput> {
    let row = |image: &Option<Item>| image.as_ref().map(item_to_plain_json);
    let after = || {
        row(&change.new_image).map(Some).ok_or_else(|| {
            InvalidInput::new(
                "dynamodb.NewImage",
                "missing: a stream that does not carry new images (KEYS_ONLY, OLD_IMAGE) cannot \
                 say what the row became; use NEW_IMAGE or NEW_AND_OLD_IMAGES",
            )
        })
    };
    let (op, after) = match change.kind {
        ChangeKind::Insert => (Op::Create, after()?),
        ChangeKind::Modify => (Op::Update, after()?),
        ChangeKind::Remove => (Op::Delete, None),
    };
    Ok(RowEvent::new(op, row(&change.old_image), after))
}

/// A Debezium change as changelog steps: a create or a snapshot read inserts `after`, a delete
/// deletes the row, an update does both, the delete first. The row deleted is the row `stored`
/// (as the caller last stored it: what state downstream holds); with none stored, the event's
/// `before` when it is whole (every column `after` has; PostgreSQL's REPLICA IDENTITY DEFAULT
/// gives the key columns only, or null), else nothing: a row never stored left nothing to delete.
/// A create or read of a row already stored replaces it (a snapshot read again after a restart),
/// and a change that leaves the row as stored is no step at all, so a duplicate or a replay
/// alters nothing. Truncates and messages change no row here (the caller clears a truncated
/// table).
pub fn debezium_changes(event: &RowEvent, stored: Option<&Row>) -> Vec<RowChange<Row>> {
    let after = match event.op {
        Op::Create | Op::Read | Op::Update => event.after.as_ref(),
        Op::Delete => None,
        Op::Truncate | Op::Message => return Vec::new(),
    };
    let whole = |before: &&Row| after.is_none_or(|a| a.keys().all(|c| before.contains_key(c)));
    let before = match event.op {
        Op::Update | Op::Delete => stored.or(event.before.as_ref().filter(whole)),
        _ => stored,
    };
    if before == after {
        return Vec::new();
    }
    let delete = before.cloned().map(RowChange::Delete);
    let insert = after.cloned().map(RowChange::Insert);
    delete.into_iter().chain(insert).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

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

    fn json_row(value: serde_json::Value) -> Row {
        value.as_object().unwrap().clone()
    }

    fn debezium(op: Op, before: Option<Row>, after: Option<Row>) -> RowEvent {
        RowEvent::new(op, before, after)
    }

    #[test]
    fn a_debezium_update_is_the_delete_of_the_row_before_then_the_insert_of_the_row_after() {
        let (a, b) = (
            json_row(json!({"id": 1, "user_id": 7})),
            json_row(json!({"id": 1, "user_id": 8})),
        );
        let update = debezium(Op::Update, Some(a.clone()), Some(b.clone()));
        assert_eq!(
            debezium_changes(&update, None),
            [RowChange::Delete(a.clone()), RowChange::Insert(b.clone())]
        );
        let created = debezium(Op::Create, None, Some(a.clone()));
        assert_eq!(
            debezium_changes(&created, None),
            [RowChange::Insert(a.clone())]
        );
        let deleted = debezium(Op::Delete, Some(b.clone()), None);
        assert_eq!(debezium_changes(&deleted, None), [RowChange::Delete(b)]);
    }

    #[test]
    fn a_partial_or_missing_before_image_is_completed_from_the_stored_row_never_guessed() {
        let stored = json_row(json!({"id": 1, "user_id": 7, "name": "a"}));
        let after = json_row(json!({"id": 1, "user_id": 8, "name": "a"}));
        let key_only = Some(json_row(json!({"id": 1})));
        for before in [key_only.clone(), None] {
            let update = debezium(Op::Update, before.clone(), Some(after.clone()));
            assert_eq!(
                debezium_changes(&update, Some(&stored)),
                [
                    RowChange::Delete(stored.clone()),
                    RowChange::Insert(after.clone())
                ]
            );
            // Nothing stored: nothing to delete, and no row made up.
            assert_eq!(
                debezium_changes(&update, None),
                [RowChange::Insert(after.clone())]
            );
            let delete = debezium(Op::Delete, before, None);
            assert_eq!(
                debezium_changes(&delete, Some(&stored)),
                [RowChange::Delete(stored.clone())]
            );
        }
    }

    #[test]
    fn a_primary_key_change_deletes_the_old_row_and_inserts_the_new_one() {
        // Debezium writes it as a delete of the old key, a tombstone, and a create of the new.
        let old = json_row(json!({"id": 1, "user_id": 7}));
        let new = json_row(json!({"id": 2, "user_id": 7}));
        let delete = debezium(Op::Delete, Some(old.clone()), None);
        let create = debezium(Op::Create, None, Some(new.clone()));
        assert_eq!(
            debezium_changes(&delete, Some(&old)),
            [RowChange::Delete(old)]
        );
        assert_eq!(debezium_changes(&create, None), [RowChange::Insert(new)]);
    }

    #[test]
    fn a_replayed_or_duplicate_debezium_change_alters_nothing() {
        let row = json_row(json!({"id": 1, "user_id": 7}));
        let create = debezium(Op::Create, None, Some(row.clone()));
        assert_eq!(debezium_changes(&create, Some(&row)), []);
        let update = debezium(Op::Update, Some(row.clone()), Some(row.clone()));
        assert_eq!(debezium_changes(&update, Some(&row)), []);
        // A snapshot read of a row already stored, changed since: the stored row is replaced.
        let newer = json_row(json!({"id": 1, "user_id": 9}));
        let read = debezium(Op::Read, None, Some(newer.clone()));
        assert_eq!(
            debezium_changes(&read, Some(&row)),
            [RowChange::Delete(row), RowChange::Insert(newer)]
        );
        for op in [Op::Truncate, Op::Message] {
            assert_eq!(debezium_changes(&debezium(op, None, None), None), []);
        }
    }

    #[test]
    fn a_dynamodb_change_is_the_row_event_of_its_plain_rows_and_decomposes_like_debezium() {
        let modify = change(ChangeKind::Modify, Some(row("1", "a")), Some(row("1", "b")));
        let event = dynamodb_row_event(&modify).unwrap();
        let plain = |key: &str| json_row(json!({"id": "1", "filterKey": key}));
        assert_eq!(
            event,
            debezium(Op::Update, Some(plain("a")), Some(plain("b")))
        );
        assert_eq!(
            debezium_changes(&event, None),
            vec![RowChange::Delete(plain("a")), RowChange::Insert(plain("b"))]
        );
        // A removal from a stream of new images only deletes the row stored, or nothing.
        let remove = dynamodb_row_event(&change(ChangeKind::Remove, None, None)).unwrap();
        assert_eq!(debezium_changes(&remove, None), vec![]);
        assert_eq!(
            debezium_changes(&remove, Some(&plain("b"))),
            vec![RowChange::Delete(plain("b"))]
        );
        let keys_only = change(ChangeKind::Insert, None, None);
        assert_eq!(
            dynamodb_row_event(&keys_only).unwrap_err().field,
            "dynamodb.NewImage"
        );
    }
}
