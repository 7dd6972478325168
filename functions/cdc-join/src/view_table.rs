//! The materialized view in DynamoDB, written as the join's sink: each joined change is a put of
//! its row under the condition that it raises the row's rank (`view::rank`), so changes apply in
//! any order and any number of times and the table ends as `view::View` does. Built on the
//! runtime's `Table`: the same code writes DynamoDB and the embedded runtime's table.
//!
//! Layout (`pk`, `sk`): the left row's primary key, the right row's (`-` for a left row without a
//! partner, which no primary key as JSON text can be); `rank`; `left` and `right`, the rows as
//! JSON. A deleted row stays as a tombstone (`deleted`, no rows) for `TOMBSTONE_RETENTION`, past
//! which no change can come late, then goes by TTL: readers skip items with `deleted`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keyway::adapters::dynamodb::{apply_each, Expect, ItemKey, Table, ITEM_MAX_BYTES, TTL};
use keyway::adapters::retry::Backoff;
use keyway::domain::{AttrValue, Item, Output, RowChange};
use keyway::ports::{Clock, Sink, SinkError, StoreError};

use crate::join::{Joined, Stamped};
use crate::view::rank;

/// How long a tombstone stays: longer than the streams keep a record (a day) and a redelivery
/// takes, so no change older than the delete arrives after it went.
pub const TOMBSTONE_RETENTION: Duration = Duration::from_secs(25 * 3600);

const RANK: &str = "rank";
const LEFT: &str = "left";
const RIGHT: &str = "right";
const DELETED: &str = "deleted";
/// The sort key of a left row without a partner.
pub const NO_PARTNER: &str = "-";

/// The view table, as the join's sink.
pub struct ViewTable {
    table: Arc<dyn Table>,
    clock: Arc<dyn Clock>,
    /// A throttle is retried after a backoff: a view write must not cost the batch a retry.
    backoff: Backoff,
}

impl ViewTable {
    pub fn new(table: Arc<dyn Table>, clock: Arc<dyn Clock>) -> Self {
        Self {
            table,
            clock,
            backoff: Backoff::default(),
        }
    }

    /// Writes `stamped` unless the view holds its row at a rank as high.
    pub async fn apply(&self, stamped: &Stamped) -> Result<(), StoreError> {
        let item = self.item(stamped);
        let raise = Expect::Raise {
            attribute: RANK,
            value: rank(stamped),
        };
        match self
            .backoff
            .retry_call(|| self.table.put(&item, &raise))
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
                item.insert(LEFT.to_owned(), AttrValue::S(json(&joined.left)));
                if let Some(right) = &joined.right {
                    item.insert(RIGHT.to_owned(), AttrValue::S(json(right)));
                }
            }
            RowChange::Delete(_) => {
                let ttl = self.clock.now_millis() / 1000 + TOMBSTONE_RETENTION.as_secs() as i64;
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

/// The joined row an item of the view holds, or `None` for a tombstone.
pub fn joined_of(item: &Item) -> Result<Option<Joined>, StoreError> {
    if item.contains_key(DELETED) {
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

#[async_trait]
impl Sink for ViewTable {
    async fn send(&self, messages: &[Output]) -> Vec<(usize, SinkError)> {
        apply_each(messages, "a joined change", |stamped: Stamped| async move {
            self.apply(&stamped).await
        })
        .await
    }

    fn max_message_bytes(&self) -> usize {
        // An item holds both rows with the keys and the rank beside them.
        ITEM_MAX_BYTES - 4 * 1024
    }

    /// Ranks order the changes of a row: the sink needs no order of its own.
    fn ordered(&self) -> bool {
        false
    }
}
