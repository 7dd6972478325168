//! DynamoDB: the narrow table API the state store needs (`Table`), its AWS SDK implementation and
//! the state store built on it.
//!
//! The state store's logic (item layout, batching, retries, segments) is written once against
//! `Table`; the SDK, the in-memory table (`MemoryTable`) and the embedded runtime's table
//! (`keyway_local::LocalTable`) implement `Table` and pass the same contract suite, so the logic
//! that runs in tests is the logic that runs on AWS. The tables that are not DynamoDB follow its
//! rules as `rules` writes them down.

mod hot_keys;
mod memory;
mod read_only;
pub mod rules;
mod sdk;
mod store;
mod table_sink;

use async_trait::async_trait;

pub use hot_keys::{AdaptivePartitioner, HotKeyRegistry};
pub use memory::{MemoryTable, TableUsage};
pub use read_only::ReadOnlyTable;
pub use sdk::{item_from_sdk, item_to_sdk, sdk_store_error, SdkTable};
pub use store::text as stored_text;
pub use store::{
    DynamoStateStore, HEAD_INLINE_LIMIT, LINEAGES_PER_COMMIT, SEGMENT_TARGET, TOKENS_KEPT,
    WATERMARKS_INLINE,
};
pub use table_sink::{apply_each, apply_latest};

use crate::domain::{AttrValue, Item};
use crate::ports::StoreError;

/// Partition key attribute (S).
pub const PK: &str = "pk";
/// Sort key attribute (S).
pub const SK: &str = "sk";
/// Version attribute (N) that commits are conditional on.
pub const VERSION: &str = "v";
/// The table's TTL attribute (N, epoch seconds).
pub const TTL: &str = "ttl";

/// BatchGetItem takes at most 100 keys.
pub const BATCH_GET_MAX: usize = 100;
/// BatchWriteItem takes at most 25 requests.
pub const BATCH_WRITE_MAX: usize = 25;
/// DynamoDB's item size limit.
pub const ITEM_MAX_BYTES: usize = 400 * 1024;

/// The primary key of an item: partition key `pk` and sort key `sk`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ItemKey {
    /// The partition key.
    pub pk: String,
    /// The sort key.
    pub sk: String,
}

impl ItemKey {
    /// The key of `item`; none when it has no `pk` or `sk` string.
    pub fn of(item: &Item) -> Option<Self> {
        Some(Self {
            pk: item.get(PK)?.as_s()?.to_owned(),
            sk: item.get(SK)?.as_s()?.to_owned(),
        })
    }

    /// An item holding only this key's `pk` and `sk` attributes.
    pub fn to_item(&self) -> Item {
        let mut item = Item::new();
        item.insert(PK.to_owned(), AttrValue::S(self.pk.clone()));
        item.insert(SK.to_owned(), AttrValue::S(self.sk.clone()));
        item
    }
}

/// The condition a put is made on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Unconditional.
    Anything,
    /// `attribute_not_exists(v)`: no item has this key, or it has no version yet (a head that
    /// only lists pending segments).
    Absent,
    /// `v = :version`: the item is at this version.
    Version(u64),
    /// `attribute_not_exists(pk) OR #attribute < :value`: no item has this key, or its string
    /// attribute is lower than `value` (a put that only ever raises the attribute).
    Raise {
        /// The string attribute compared.
        attribute: &'static str,
        /// The value the stored attribute must be below.
        value: String,
    },
}

/// One request of a BatchWriteItem call.
#[derive(Clone, Debug, PartialEq)]
pub enum WriteRequest {
    /// Puts the item, replacing any item with its key.
    Put(Item),
    /// Deletes the item with this key, if there is one.
    Delete(ItemKey),
}

/// What one BatchGetItem call read, and the keys it left for another call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchGetOutput {
    /// The items read; a key with no item has none here.
    pub items: Vec<Item>,
    /// Keys DynamoDB did not read this time (throttling, the 16 MB response limit).
    pub unprocessed: Vec<ItemKey>,
}

/// One page of a Scan: the items it kept, and the key to go on after (none: the scan is done).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScanPage {
    /// The items the page kept.
    pub items: Vec<Item>,
    /// The key to go on after; none when the scan is done.
    pub next: Option<ItemKey>,
}

/// The DynamoDB operations the state store uses, on one table with key `pk` (S), `sk` (S).
#[async_trait]
pub trait Table: Send + Sync {
    /// BatchGetItem with strongly consistent reads; at most `BATCH_GET_MAX` keys.
    async fn batch_get(&self, keys: &[ItemKey]) -> Result<BatchGetOutput, StoreError>;

    /// PutItem under a condition; `StoreError::Conflict` when it does not hold. Borrowed: a
    /// caller that retries keeps its item, and the service side copies what it sends.
    async fn put(&self, item: &Item, expect: &Expect) -> Result<(), StoreError>;

    /// UpdateItem setting `attributes` (creating the item if there is none) under a condition;
    /// the item's other attributes stay. `StoreError::Conflict` when the condition does not hold.
    async fn update(
        &self,
        key: &ItemKey,
        attributes: &Item,
        expect: &Expect,
    ) -> Result<(), StoreError>;

    /// BatchWriteItem; at most `BATCH_WRITE_MAX` requests. Returns the unprocessed ones.
    async fn batch_write(
        &self,
        requests: Vec<WriteRequest>,
    ) -> Result<Vec<WriteRequest>, StoreError>;

    /// GetItem with a strongly consistent read (tests and tools; the runtime batches).
    async fn get(&self, key: &ItemKey) -> Result<Option<Item>, StoreError>;

    /// Every item under one partition key, by a strongly consistent Query (tests and tools).
    async fn query_partition(&self, pk: &str) -> Result<Vec<Item>, StoreError>;

    /// The first `limit` items under `pk` whose sort key is at most `sk_max`, in sort key order,
    /// by a strongly consistent Query. (The SDK's table asks DynamoDB for just those.)
    async fn query_up_to(
        &self,
        pk: &str,
        sk_max: &str,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        let mut items: Vec<(ItemKey, Item)> = self
            .query_partition(pk)
            .await?
            .into_iter()
            .filter_map(|item| Some((ItemKey::of(&item)?, item)))
            .filter(|(key, _)| key.sk.as_str() <= sk_max)
            .collect();
        items.sort_by(|a, b| a.0.sk.cmp(&b.0.sk));
        Ok(items
            .into_iter()
            .take(limit)
            .map(|(_, item)| item)
            .collect())
    }

    /// The first `limit` items under `pk` whose sort key is above `after_sk`, in sort key order,
    /// by a strongly consistent Query: how a reader tails an ordered log.
    async fn query_after(
        &self,
        pk: &str,
        after_sk: &str,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        let mut items = sorted(self.query_partition(pk).await?);
        items.retain(|(key, _)| key.sk.as_str() > after_sk);
        Ok(items
            .into_iter()
            .take(limit)
            .map(|(_, item)| item)
            .collect())
    }

    /// A page of a strongly consistent Scan of the whole table for the items whose partition key
    /// starts with `pk_prefix` and whose sort key is `sk`, going on after `start`. DynamoDB
    /// counts the items it reads against `limit`, not those it keeps: a page may hold fewer (none,
    /// even) and still have a next one. Every item is read once however the pages fall. A scan
    /// reads the whole table: for rare sweeps, never on a batch's path.
    async fn scan_page(
        &self,
        pk_prefix: &str,
        sk: &str,
        start: Option<&ItemKey>,
        limit: usize,
    ) -> Result<ScanPage, StoreError>;

    /// The item with the highest sort key under `pk`, by a strongly consistent Query.
    async fn query_last(&self, pk: &str) -> Result<Option<Item>, StoreError> {
        Ok(sorted(self.query_partition(pk).await?)
            .pop()
            .map(|(_, item)| item))
    }
}

/// Items with their keys, in sort key order.
fn sorted(items: Vec<Item>) -> Vec<(ItemKey, Item)> {
    let mut keyed: Vec<(ItemKey, Item)> = items
        .into_iter()
        .filter_map(|item| Some((ItemKey::of(&item)?, item)))
        .collect();
    keyed.sort_by(|a, b| a.0.sk.cmp(&b.0.sk));
    keyed
}
