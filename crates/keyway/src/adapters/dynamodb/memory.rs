//! `MemoryTable`: the state table in memory, the in-memory twin of `Table` for unit tests of the
//! state store, of the executor and of an application's operators, without the embedded
//! runtime. It keeps DynamoDB's rules (`rules`): strongly consistent reads, conditional writes,
//! the batch and item limits, capacity units. What it leaves out (streams, TTL, faults, latency)
//! is the embedded runtime's table, which passes the same contract suite. Items are kept in
//! (pk, sk) order, which is the order a Scan reads them in here.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Mutex;

use async_trait::async_trait;

use super::rules::{
    check_batch_get, check_batch_write, check_item_size, check_state_key, read_units, scan_page_of,
    write_units, BATCH_GET_RESPONSE_MAX,
};
use super::{BatchGetOutput, Expect, ItemKey, ScanPage, Table, WriteRequest};
use crate::domain::item::item_size;
use crate::domain::Item;
use crate::ports::StoreError;

/// What a `MemoryTable` has been asked so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableUsage {
    /// Calls by operation name (`GetItem`, `PutItem`, `BatchWriteItem` ...).
    pub calls: BTreeMap<&'static str, u64>,
    /// Read capacity units, as DynamoDB counts strongly consistent reads.
    pub read_units: f64,
    /// Write capacity units, as DynamoDB counts writes.
    pub write_units: f64,
}

/// A state table (`pk`, `sk`) in memory.
#[derive(Default)]
pub struct MemoryTable {
    items: Mutex<BTreeMap<ItemKey, Item>>,
    usage: Mutex<TableUsage>,
}

impl ItemKey {
    fn of_pk(pk: &str, sk: &str) -> Self {
        Self {
            pk: pk.to_owned(),
            sk: sk.to_owned(),
        }
    }
}

impl MemoryTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every item, in key order.
    pub fn items(&self) -> Vec<Item> {
        self.lock().values().cloned().collect()
    }

    /// Writes an item without a condition and without counting it, as a test arranging the
    /// table does.
    pub fn put_item(&self, item: Item) -> Result<(), StoreError> {
        let key = check_state_key(&item)?;
        check_item_size(&item)?;
        self.lock().insert(key, item);
        Ok(())
    }

    /// The calls and capacity units so far.
    pub fn usage(&self) -> TableUsage {
        self.usage.lock().expect("usage lock").clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<ItemKey, Item>> {
        self.items.lock().expect("table lock")
    }

    fn count(&self, operation: &'static str, read: f64, write: f64) {
        let mut usage = self.usage.lock().expect("usage lock");
        *usage.calls.entry(operation).or_default() += 1;
        usage.read_units += read;
        usage.write_units += write;
    }

    fn partition(&self, pk: &str) -> Vec<Item> {
        let from = ItemKey::of_pk(pk, "");
        self.lock()
            .range(from..)
            .take_while(|(key, _)| key.pk == pk)
            .map(|(_, item)| item.clone())
            .collect()
    }

    fn counted_query(&self, items: Vec<Item>) -> Vec<Item> {
        let size: usize = items.iter().map(item_size).sum();
        self.count("Query", read_units(size), 0.0);
        items
    }
}

#[async_trait]
impl Table for MemoryTable {
    async fn batch_get(&self, keys: &[ItemKey]) -> Result<BatchGetOutput, StoreError> {
        check_batch_get(keys)?;
        let items = self.lock();
        let mut output = BatchGetOutput::default();
        let (mut units, mut bytes) = (0.0, 0);
        for key in keys {
            if bytes >= BATCH_GET_RESPONSE_MAX {
                output.unprocessed.push(key.clone());
                continue;
            }
            let item = items.get(key);
            let size = item.map_or(0, item_size);
            bytes += size;
            units += read_units(size);
            output.items.extend(item.cloned());
        }
        drop(items);
        self.count("BatchGetItem", units, 0.0);
        Ok(output)
    }

    async fn put(&self, item: &Item, expect: &Expect) -> Result<(), StoreError> {
        let key = check_state_key(item)?;
        let size = check_item_size(item)?;
        let mut items = self.lock();
        let existing = items.get(&key);
        // A failed condition still consumes write capacity.
        let units = write_units(size.max(existing.map_or(0, item_size)));
        let holds = expect.holds(existing);
        if holds {
            items.insert(key, item.clone());
        }
        drop(items);
        self.count("PutItem", 0.0, units);
        if holds {
            Ok(())
        } else {
            Err(StoreError::Conflict)
        }
    }

    async fn update(
        &self,
        key: &ItemKey,
        attributes: &Item,
        expect: &Expect,
    ) -> Result<(), StoreError> {
        let mut items = self.lock();
        let existing = items.get(key);
        let old_size = existing.map_or(0, item_size);
        if !expect.holds(existing) {
            drop(items);
            self.count("UpdateItem", 0.0, write_units(old_size));
            return Err(StoreError::Conflict);
        }
        let mut item = existing.cloned().unwrap_or_else(|| key.to_item());
        item.extend(attributes.iter().map(|(k, v)| (k.clone(), v.clone())));
        let size = check_item_size(&item)?;
        items.insert(key.clone(), item);
        drop(items);
        self.count("UpdateItem", 0.0, write_units(size.max(old_size)));
        Ok(())
    }

    async fn batch_write(
        &self,
        requests: Vec<WriteRequest>,
    ) -> Result<Vec<WriteRequest>, StoreError> {
        check_batch_write(&requests)?;
        let mut items = self.lock();
        let mut units = 0.0;
        for request in requests {
            match request {
                WriteRequest::Put(item) => {
                    let key = check_state_key(&item)?;
                    let old = items.get(&key).map_or(0, item_size);
                    units += write_units(item_size(&item).max(old));
                    items.insert(key, item);
                }
                WriteRequest::Delete(key) => {
                    units += write_units(items.remove(&key).as_ref().map_or(0, item_size));
                }
            }
        }
        drop(items);
        self.count("BatchWriteItem", 0.0, units);
        Ok(Vec::new())
    }

    async fn get(&self, key: &ItemKey) -> Result<Option<Item>, StoreError> {
        let item = self.lock().get(key).cloned();
        self.count(
            "GetItem",
            read_units(item.as_ref().map_or(0, item_size)),
            0.0,
        );
        Ok(item)
    }

    async fn query_partition(&self, pk: &str) -> Result<Vec<Item>, StoreError> {
        Ok(self.counted_query(self.partition(pk)))
    }

    /// Billed for the items it returns only, as DynamoDB bills a Query with a Limit.
    async fn query_up_to(
        &self,
        pk: &str,
        sk_max: &str,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        let items: Vec<Item> = self
            .lock()
            .range(ItemKey::of_pk(pk, "")..)
            .take_while(|(key, _)| key.pk == pk && key.sk.as_str() <= sk_max)
            .take(limit)
            .map(|(_, item)| item.clone())
            .collect();
        Ok(self.counted_query(items))
    }

    async fn query_after(
        &self,
        pk: &str,
        after_sk: &str,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        let after = ItemKey {
            pk: pk.to_owned(),
            sk: after_sk.to_owned(),
        };
        let items: Vec<Item> = self
            .lock()
            .range((Bound::Excluded(after), Bound::Unbounded))
            .take_while(|(key, _)| key.pk == pk)
            .take(limit)
            .map(|(_, item)| item.clone())
            .collect();
        Ok(self.counted_query(items))
    }

    async fn query_last(&self, pk: &str) -> Result<Option<Item>, StoreError> {
        // Every key of partition `pk` sorts before (pk + "\0", ""), the next partition's first.
        let (from, to) = (
            ItemKey::of_pk(pk, ""),
            ItemKey::of_pk(&format!("{pk}\0"), ""),
        );
        let item = self
            .lock()
            .range(from..to)
            .next_back()
            .map(|(_, i)| i.clone());
        let size = item.as_ref().map_or(0, item_size);
        self.count("Query", read_units(size), 0.0);
        Ok(item)
    }

    async fn scan_page(
        &self,
        pk_prefix: &str,
        sk: &str,
        start: Option<&ItemKey>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        let items = self.lock();
        let read = match start {
            Some(start) => items.range((Bound::Excluded(start.clone()), Bound::Unbounded)),
            None => items.range(..),
        };
        let (page, size) = scan_page_of(read.map(|(_, item)| item), pk_prefix, sk, limit);
        drop(items);
        self.count("Scan", read_units(size), 0.0);
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::AttrValue;

    fn item(pk: &str, sk: &str, doc_bytes: usize) -> Item {
        let mut item = ItemKey::of_pk(pk, sk).to_item();
        item.insert("doc".into(), AttrValue::S("x".repeat(doc_bytes)));
        item
    }

    #[tokio::test]
    async fn a_batch_read_past_16_mb_leaves_the_rest_unprocessed_and_a_second_call_reads_it() {
        let table = MemoryTable::new();
        // Sixty states of 390 KB, each just under DynamoDB's item limit: 23 MB in all.
        let keys: Vec<ItemKey> = (0..60)
            .map(|i| ItemKey::of_pk(&format!("k{i:02}"), "head"))
            .collect();
        for key in &keys {
            table.put_item(item(&key.pk, &key.sk, 390_000)).unwrap();
        }
        let first = table.batch_get(&keys).await.unwrap();
        assert!(!first.unprocessed.is_empty(), "the response stops at 16 MB");
        assert_eq!(first.items.len() + first.unprocessed.len(), keys.len());
        let bytes: usize = first.items.iter().map(item_size).sum();
        assert!(
            (BATCH_GET_RESPONSE_MAX..BATCH_GET_RESPONSE_MAX + 400 * 1024).contains(&bytes),
            "{bytes} bytes in one response"
        );
        let rest = table.batch_get(&first.unprocessed).await.unwrap();
        assert!(rest.unprocessed.is_empty());
        assert_eq!(rest.items.len(), first.unprocessed.len());
    }

    #[tokio::test]
    async fn the_last_item_of_a_partition_is_its_own_and_not_the_next_partitions() {
        let table = MemoryTable::new();
        for (pk, sk) in [("a", "1"), ("a", "2"), ("a\0", "0"), ("ab", "0")] {
            table.put_item(item(pk, sk, 1)).unwrap();
        }
        let last = table.query_last("a").await.unwrap().expect("an item");
        assert_eq!(ItemKey::of(&last), Some(ItemKey::of_pk("a", "2")));
        assert_eq!(table.query_last("none").await.unwrap(), None);
        assert_eq!(table.usage().calls["Query"], 2, "one query each");
    }
}
