//! The calls of `Table` on an in-memory table: DynamoDB's rules (`keyway::adapters::dynamodb::rules`),
//! the faults a plan injects where the service would return them (throttling, unprocessed keys,
//! a concurrent writer's commit, a lost response, a crash in a commit), and the capacity units
//! each call is metered for.

use std::ops::Bound;

use async_trait::async_trait;

use super::LocalTable;
use crate::services::faults::{crash, Fault};
use keyway::adapters::dynamodb::rules::{
    check_batch_get, check_batch_write, check_item_size, check_state_key, read_units, scan_page_of,
    write_units, BATCH_GET_RESPONSE_MAX,
};
use keyway::adapters::dynamodb::{
    BatchGetOutput, Expect, ItemKey, ScanPage, Table, WriteRequest, SK, VERSION,
};
use keyway::domain::item::item_size;
use keyway::domain::{AttrValue, Item};
use keyway::ports::StoreError;

impl LocalTable {
    /// Up to `limit` items of partition `pk` in sort key order, after `after_sk` when given,
    /// while their sort key passes `keep`: what a Query with a key condition and a Limit reads.
    fn query_range(
        &self,
        pk: &str,
        after_sk: Option<&str>,
        limit: usize,
        keep: impl Fn(&str) -> bool,
    ) -> Vec<Item> {
        let state = self.state.lock().expect("table lock");
        let (partition, from) = self.partition_bounds(pk, after_sk);
        fn sk(item: &Item) -> Option<&str> {
            item.get(SK).and_then(AttrValue::as_s)
        }
        state
            .items
            .range(from..partition.end)
            .map(|(_, item)| item)
            .skip_while(|item| after_sk.is_some() && sk(item) == after_sk)
            .take_while(|item| sk(item).is_some_and(&keep))
            .take(limit)
            .cloned()
            .collect()
    }

    /// Meters a Query that read `items`, as DynamoDB bills one with a Limit: by the bytes of the
    /// items it returns, 4 KB a unit.
    async fn billed_query(&self, items: Vec<Item>) -> Vec<Item> {
        let size: usize = items.iter().map(item_size).sum();
        self.meter.call("Query", read_units(size), 0.0).await;
        items
    }

    pub(super) fn throttled(&self) -> Option<StoreError> {
        self.faults
            .draw(Fault::Throttle)
            .then(|| StoreError::Throttled("ProvisionedThroughputExceededException".into()))
    }

    fn do_batch_get(&self, keys: &[ItemKey]) -> Result<(BatchGetOutput, f64), StoreError> {
        check_batch_get(keys)?;
        if let Some(err) = self.throttled() {
            return Err(err);
        }
        let mut output = BatchGetOutput::default();
        let mut units = 0.0;
        let mut bytes = 0;
        let state = self.state.lock().expect("table lock");
        for key in keys {
            if bytes >= BATCH_GET_RESPONSE_MAX || self.faults.draw(Fault::PartialFailure) {
                output.unprocessed.push(key.clone());
                continue;
            }
            match state.items.get(&self.item_key(key)) {
                Some(item) => {
                    let size = item_size(item);
                    bytes += size;
                    units += read_units(size);
                    output.items.push(item.clone());
                }
                // Reading an absent item still consumes a read.
                None => units += read_units(0),
            }
        }
        Ok((output, units))
    }

    fn do_put(&self, item: Item, expect: Expect) -> (Result<(), StoreError>, f64) {
        let key = match check_state_key(&item).and_then(|_| self.key_of(&item)) {
            Ok(key) => key,
            Err(err) => return (Err(err), 0.0),
        };
        let size = match check_item_size(&item) {
            Ok(size) => size,
            Err(err) => return (Err(err), 0.0),
        };
        if let Some(err) = self.throttled() {
            return (Err(err), 0.0);
        }
        let mut state = self.state.lock().expect("table lock");
        if matches!(expect, Expect::Version(_)) && self.faults.draw(Fault::Conflict) {
            // A concurrent writer commits the same state first: the version moves, nothing else.
            if let Some(existing) = state.items.get_mut(&key) {
                if let Some(v) = existing
                    .get(VERSION)
                    .and_then(AttrValue::as_n)
                    .and_then(|n| n.parse::<u64>().ok())
                {
                    existing.insert(VERSION.into(), AttrValue::N((v + 1).to_string()));
                    return (Err(StoreError::Conflict), write_units(size));
                }
            }
        }
        let existing = state.items.get(&key);
        let old_size = existing.map(item_size).unwrap_or(0);
        let holds = expect.holds(existing);
        // A failed condition still consumes write capacity.
        let units = write_units(size.max(old_size));
        if !holds {
            return (Err(StoreError::Conflict), units);
        }
        self.write(&mut state, key, Some(item), false);
        if self.faults.draw(Fault::LostResponse) {
            // The write landed; the caller only hears that the call timed out.
            return (
                Err(StoreError::Unavailable(
                    "the PutItem response was lost (timed out)".into(),
                )),
                units,
            );
        }
        (Ok(()), units)
    }

    fn do_update(
        &self,
        key: &ItemKey,
        attributes: &Item,
        expect: &Expect,
    ) -> (Result<(), StoreError>, f64) {
        if let Some(err) = self.throttled() {
            return (Err(err), 0.0);
        }
        let canonical = self.item_key(key);
        let mut state = self.state.lock().expect("table lock");
        let existing = state.items.get(&canonical);
        let old_size = existing.map(item_size).unwrap_or(0);
        if !expect.holds(existing) {
            return (Err(StoreError::Conflict), write_units(old_size));
        }
        let mut item = existing.cloned().unwrap_or_else(|| key.to_item());
        item.extend(attributes.iter().map(|(k, v)| (k.clone(), v.clone())));
        let size = match check_item_size(&item) {
            Ok(size) => size,
            Err(err) => return (Err(err), 0.0),
        };
        self.write(&mut state, canonical, Some(item), false);
        (Ok(()), write_units(size.max(old_size)))
    }

    fn do_batch_write(
        &self,
        requests: Vec<WriteRequest>,
    ) -> Result<(Vec<WriteRequest>, f64), StoreError> {
        check_batch_write(&requests)?;
        if let Some(err) = self.throttled() {
            return Err(err);
        }
        let mut unprocessed = Vec::new();
        let mut units = 0.0;
        let mut state = self.state.lock().expect("table lock");
        for request in requests {
            if self.faults.draw(Fault::PartialFailure) {
                unprocessed.push(request);
                continue;
            }
            match request {
                WriteRequest::Put(item) => {
                    let key = self.key_of(&item)?;
                    let old = state.items.get(&key).map(item_size).unwrap_or(0);
                    units += write_units(item_size(&item).max(old));
                    self.write(&mut state, key, Some(item), false);
                }
                WriteRequest::Delete(key) => {
                    let key = self.item_key(&key);
                    units += write_units(state.items.get(&key).map(item_size).unwrap_or(0));
                    self.write(&mut state, key, None, false);
                }
            }
        }
        Ok((unprocessed, units))
    }
}

#[async_trait]
impl Table for LocalTable {
    async fn batch_get(&self, keys: &[ItemKey]) -> Result<BatchGetOutput, StoreError> {
        // Accounts the whole call, metering included (see `Meter::busy`).
        let _busy = self.meter.busy();
        let result = self.do_batch_get(keys);
        let units = result.as_ref().map_or(0.0, |(_, u)| *u);
        self.meter.call("BatchGetItem", units, 0.0).await;
        result.map(|(output, _)| output)
    }

    async fn put(&self, item: &Item, expect: &Expect) -> Result<(), StoreError> {
        // Accounts the whole call, metering included (see `Meter::busy`).
        let _busy = self.meter.busy();
        let (result, units) = self.do_put(item.clone(), expect.clone());
        self.meter.call("PutItem", 0.0, units).await;
        result
    }

    async fn update(
        &self,
        key: &ItemKey,
        attributes: &Item,
        expect: &Expect,
    ) -> Result<(), StoreError> {
        // Accounts the whole call, metering included (see `Meter::busy`).
        let _busy = self.meter.busy();
        let (result, units) = self.do_update(key, attributes, expect);
        self.meter.call("UpdateItem", 0.0, units).await;
        result
    }

    async fn batch_write(
        &self,
        requests: Vec<WriteRequest>,
    ) -> Result<Vec<WriteRequest>, StoreError> {
        // Accounts the whole call, metering included (see `Meter::busy`).
        let _busy = self.meter.busy();
        let puts = requests.iter().any(|r| matches!(r, WriteRequest::Put(_)));
        let result = self.do_batch_write(requests);
        if puts && result.is_ok() && self.faults.draw(Fault::CrashInCommit) {
            // The state's new segments are written; the head that would reference them never is.
            crash();
        }
        let units = result.as_ref().map_or(0.0, |(_, u)| *u);
        self.meter.call("BatchWriteItem", 0.0, units).await;
        result.map(|(unprocessed, _)| unprocessed)
    }

    async fn get(&self, key: &ItemKey) -> Result<Option<Item>, StoreError> {
        let item = {
            let _busy = self.meter.busy();
            self.state
                .lock()
                .expect("table lock")
                .items
                .get(&self.item_key(key))
                .cloned()
        };
        self.meter
            .call(
                "GetItem",
                read_units(item.as_ref().map(item_size).unwrap_or(0)),
                0.0,
            )
            .await;
        Ok(item)
    }

    async fn scan_page(
        &self,
        pk_prefix: &str,
        sk: &str,
        start: Option<&ItemKey>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        let (page, size) = {
            let _busy = self.meter.busy();
            let state = self.state.lock().expect("table lock");
            let from = start.map(|key| self.item_key(key));
            let read = match &from {
                Some(from) => state
                    .items
                    .range::<String, _>((Bound::Excluded(from), Bound::Unbounded)),
                None => state.items.range::<String, _>(..),
            };
            scan_page_of(read.map(|(_, item)| item), pk_prefix, sk, limit)
        };
        self.meter.call("Scan", read_units(size), 0.0).await;
        Ok(page)
    }

    async fn query_partition(&self, pk: &str) -> Result<Vec<Item>, StoreError> {
        let items = {
            let _busy = self.meter.busy();
            self.partition(&AttrValue::S(pk.to_owned()))
        };
        Ok(self.billed_query(items).await)
    }

    async fn query_up_to(
        &self,
        pk: &str,
        sk_max: &str,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        let items = {
            let _busy = self.meter.busy();
            self.query_range(pk, None, limit, |sk| sk <= sk_max)
        };
        Ok(self.billed_query(items).await)
    }

    async fn query_after(
        &self,
        pk: &str,
        after_sk: &str,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        let items = {
            let _busy = self.meter.busy();
            self.query_range(pk, Some(after_sk), limit, |_| true)
        };
        Ok(self.billed_query(items).await)
    }

    async fn query_last(&self, pk: &str) -> Result<Option<Item>, StoreError> {
        let item = {
            let _busy = self.meter.busy();
            let state = self.state.lock().expect("table lock");
            let (partition, _) = self.partition_bounds(pk, None);
            state
                .items
                .range(partition)
                .next_back()
                .map(|(_, item)| item.clone())
        };
        Ok(self.billed_query(item.into_iter().collect()).await.pop())
    }
}
