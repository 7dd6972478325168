//! An in-memory DynamoDB table with the semantics the state store relies on: strongly consistent
//! reads, conditional puts, BatchGetItem (100 keys, 16 MB per response, the rest unprocessed),
//! BatchWriteItem (25 requests, no key twice), the 400 KB item limit, and optional throttling and
//! unprocessed keys drawn from a seeded generator. It meters calls and capacity units.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::meter::{read_units, write_units, Meter};
use crate::adapters::dynamodb::{
    BatchGetOutput, Expect, ItemKey, Table, WriteRequest, BATCH_GET_MAX, BATCH_WRITE_MAX,
    ITEM_MAX_BYTES, TTL, VERSION,
};
use crate::domain::item::item_size;
use crate::domain::Item;
use crate::ports::StoreError;

/// BatchGetItem returns at most 16 MB; DynamoDB leaves the rest unprocessed.
const BATCH_GET_RESPONSE_MAX: usize = 16 * 1024 * 1024;

/// Faults the table injects, each with a probability per call (or per key for unprocessed keys).
#[derive(Clone, Debug, Default)]
pub struct TableFaults {
    pub throttle: f64,
    pub unprocessed: f64,
    pub seed: u64,
}

pub struct MemoryTable {
    items: Mutex<BTreeMap<ItemKey, Item>>,
    meter: Meter,
    faults: Mutex<(TableFaults, StdRng)>,
}

impl Default for MemoryTable {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryTable {
    pub fn new() -> Self {
        Self {
            items: Mutex::new(BTreeMap::new()),
            meter: Meter::default(),
            faults: Mutex::new((TableFaults::default(), StdRng::seed_from_u64(0))),
        }
    }

    pub fn with_faults(self, faults: TableFaults) -> Self {
        let rng = StdRng::seed_from_u64(faults.seed);
        *self.faults.lock().expect("faults lock") = (faults, rng);
        self
    }

    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Every item, in key order.
    pub fn items(&self) -> Vec<Item> {
        self.items
            .lock()
            .expect("table lock")
            .values()
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.items.lock().expect("table lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What DynamoDB's TTL process eventually does: deletes items whose `ttl` is before `now_secs`.
    pub fn expire(&self, now_secs: i64) -> usize {
        let mut items = self.items.lock().expect("table lock");
        let before = items.len();
        items.retain(|_, item| {
            item.get(TTL)
                .and_then(|v| v.as_n())
                .and_then(|n| n.parse::<i64>().ok())
                .is_none_or(|t| t > now_secs)
        });
        before - items.len()
    }

    fn draw(&self, pick: impl Fn(&TableFaults) -> f64) -> bool {
        let mut faults = self.faults.lock().expect("faults lock");
        let p = pick(&faults.0);
        p > 0.0 && faults.1.random_bool(p.min(1.0))
    }

    fn check_size(item: &Item) -> Result<usize, StoreError> {
        let size = item_size(item);
        if size > ITEM_MAX_BYTES {
            return Err(StoreError::Invalid(format!(
                "ValidationException: Item size has exceeded the maximum allowed size ({size} bytes)"
            )));
        }
        Ok(size)
    }

    fn check_key(item: &Item) -> Result<ItemKey, StoreError> {
        ItemKey::of(item).ok_or_else(|| {
            StoreError::Invalid("ValidationException: the item has no pk/sk strings".into())
        })
    }
}

#[async_trait]
impl Table for MemoryTable {
    async fn batch_get(&self, keys: &[ItemKey]) -> Result<BatchGetOutput, StoreError> {
        let _busy = self.meter.busy();
        if keys.len() > BATCH_GET_MAX {
            return Err(StoreError::Invalid(format!(
                "ValidationException: {} keys in one BatchGetItem",
                keys.len()
            )));
        }
        let distinct: HashSet<&ItemKey> = keys.iter().collect();
        if distinct.len() != keys.len() {
            return Err(StoreError::Invalid(
                "ValidationException: Provided list of item keys contains duplicates".into(),
            ));
        }
        if self.draw(|f| f.throttle) {
            self.meter.call("BatchGetItem", 0.0, 0.0).await;
            return Err(StoreError::Throttled(
                "ProvisionedThroughputExceededException".into(),
            ));
        }
        let mut output = BatchGetOutput::default();
        let mut units = 0.0;
        let mut bytes = 0;
        {
            let items = self.items.lock().expect("table lock");
            for key in keys {
                if bytes >= BATCH_GET_RESPONSE_MAX || self.draw(|f| f.unprocessed) {
                    output.unprocessed.push(key.clone());
                    continue;
                }
                match items.get(key) {
                    Some(item) => {
                        let size = item_size(item);
                        bytes += size;
                        units += read_units(size);
                        output.items.push(item.clone());
                    }
                    None => units += read_units(0),
                }
            }
        }
        self.meter.call("BatchGetItem", units, 0.0).await;
        Ok(output)
    }

    async fn put(&self, item: Item, expect: Expect) -> Result<(), StoreError> {
        let _busy = self.meter.busy();
        let key = Self::check_key(&item)?;
        let size = Self::check_size(&item)?;
        if self.draw(|f| f.throttle) {
            self.meter.call("PutItem", 0.0, 0.0).await;
            return Err(StoreError::Throttled(
                "ProvisionedThroughputExceededException".into(),
            ));
        }
        let (result, units) = {
            let mut items = self.items.lock().expect("table lock");
            let existing = items.get(&key);
            let old_size = existing.map(item_size).unwrap_or(0);
            let holds = match expect {
                Expect::Anything => true,
                Expect::Absent => existing.is_none(),
                Expect::Version(v) => existing
                    .and_then(|i| i.get(VERSION))
                    .and_then(|a| a.as_n())
                    .is_some_and(|n| n.parse::<u64>() == Ok(v)),
            };
            // A failed condition still consumes write capacity.
            let units = write_units(size.max(old_size));
            if holds {
                items.insert(key, item);
                (Ok(()), units)
            } else {
                (Err(StoreError::Conflict), units)
            }
        };
        self.meter.call("PutItem", 0.0, units).await;
        result
    }

    async fn batch_write(
        &self,
        requests: Vec<WriteRequest>,
    ) -> Result<Vec<WriteRequest>, StoreError> {
        let _busy = self.meter.busy();
        if requests.len() > BATCH_WRITE_MAX {
            return Err(StoreError::Invalid(format!(
                "ValidationException: {} requests in one BatchWriteItem",
                requests.len()
            )));
        }
        let mut seen = HashSet::new();
        for request in &requests {
            let key = match request {
                WriteRequest::Put(item) => {
                    Self::check_size(item)?;
                    Self::check_key(item)?
                }
                WriteRequest::Delete(key) => key.clone(),
            };
            if !seen.insert(key) {
                return Err(StoreError::Invalid(
                    "ValidationException: Provided list of item keys contains duplicates".into(),
                ));
            }
        }
        if self.draw(|f| f.throttle) {
            self.meter.call("BatchWriteItem", 0.0, 0.0).await;
            return Err(StoreError::Throttled(
                "ProvisionedThroughputExceededException".into(),
            ));
        }
        let mut unprocessed = Vec::new();
        let mut units = 0.0;
        {
            let mut items = self.items.lock().expect("table lock");
            for request in requests {
                if self.draw(|f| f.unprocessed) {
                    unprocessed.push(request);
                    continue;
                }
                match request {
                    WriteRequest::Put(item) => {
                        let key = ItemKey::of(&item).expect("checked above");
                        let old = items.get(&key).map(item_size).unwrap_or(0);
                        units += write_units(item_size(&item).max(old));
                        items.insert(key, item);
                    }
                    WriteRequest::Delete(key) => {
                        let old = items.remove(&key).map(|i| item_size(&i)).unwrap_or(0);
                        units += write_units(old);
                    }
                }
            }
        }
        self.meter.call("BatchWriteItem", 0.0, units).await;
        Ok(unprocessed)
    }

    async fn get(&self, key: &ItemKey) -> Result<Option<Item>, StoreError> {
        let _busy = self.meter.busy();
        let item = self.items.lock().expect("table lock").get(key).cloned();
        self.meter
            .call(
                "GetItem",
                read_units(item.as_ref().map(item_size).unwrap_or(0)),
                0.0,
            )
            .await;
        Ok(item)
    }

    async fn query_partition(&self, pk: &str) -> Result<Vec<Item>, StoreError> {
        let _busy = self.meter.busy();
        let items: Vec<Item> = self
            .items
            .lock()
            .expect("table lock")
            .iter()
            .filter(|(key, _)| key.pk == pk)
            .map(|(_, item)| item.clone())
            .collect();
        let size: usize = items.iter().map(item_size).sum();
        self.meter.call("Query", read_units(size), 0.0).await;
        Ok(items)
    }
}
