//! A table's items by canonical key, its TTL index and its stream: the writes every call and
//! every test make, each recorded in the stream as DynamoDB Streams records it.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::{Arc, Mutex};

use super::{
    push_canonical, push_canonical_last, KeySchema, LocalTable, State, StreamRecord, StreamView,
    STREAM_CREATED_MILLIS,
};
use crate::services::faults::{FaultCounts, Faults};
use crate::services::meter::Meter;
use crate::services::shards::{ReshardError, ShardInfo, Shards};
use keyway::adapters::dynamodb::rules::check_item_size;
use keyway::adapters::dynamodb::{ItemKey, TTL};
use keyway::domain::{AttrValue, ChangeKind, Item};
use keyway::ports::{Clock, StoreError, SystemClock};

impl LocalTable {
    /// A state table (`pk`, `sk`, TTL on `ttl`) on the system clock, without a stream or faults.
    pub fn new() -> Self {
        Self::create(
            "keyway-state",
            KeySchema::state_table(),
            Some(TTL.into()),
            None,
            Arc::new(SystemClock),
            Faults::none(),
        )
    }

    /// An empty table, on `clock` and injecting `faults`: its items' TTL is read from
    /// `ttl_attribute`, and with `stream` it records its changes in a stream of that view type.
    pub fn create(
        name: &str,
        schema: KeySchema,
        ttl_attribute: Option<String>,
        stream: Option<StreamView>,
        clock: Arc<dyn Clock>,
        faults: Faults,
    ) -> Self {
        Self {
            name: name.to_owned(),
            schema,
            state: Mutex::new(State {
                items: BTreeMap::new(),
                expiring: BTreeSet::new(),
                stream: stream.map(|view| (view, Self::stream_shards_of(name))),
            }),
            ttl_attribute,
            next_sequence: Arc::new(Mutex::new(0)),
            clock,
            meter: Meter::default(),
            faults,
        }
    }

    /// The table, injecting `faults` instead.
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The table's calls and capacity units so far.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// The faults this table injected so far.
    pub fn faults_fired(&self) -> FaultCounts {
        self.faults.fired()
    }

    /// The chances each kind of fault had at this table (`Faults::drawn`).
    pub fn faults_drawn(&self) -> FaultCounts {
        self.faults.drawn()
    }

    /// The ARN of the table's stream (one per table here).
    pub fn stream_arn(&self) -> String {
        format!(
            "arn:aws:dynamodb:us-east-1:000000000000:table/{}/stream/2026-01-01T00:00:00.000",
            self.name
        )
    }

    /// A new stream's one shard. Shard ids have DynamoDB Streams' form: the shard's creation
    /// time in epoch milliseconds, 20 digits, and 8 hex digits
    /// (`shardId-00000001767225600000-1a2b3c4d`).
    pub(super) fn stream_shards_of(table: &str) -> Shards<StreamRecord> {
        let table = table.to_owned();
        let name = move |number: usize, millis: i64| {
            let suffix = keyway::domain::hash::xxh3_128_hex(&[
                table.as_bytes(),
                number.to_string().as_bytes(),
            ]);
            format!("shardId-{millis:020}-{}", &suffix[..8])
        };
        Shards::even(1, Box::new(name), STREAM_CREATED_MILLIS)
    }

    /// The id of one shard of the table's stream (by number).
    pub(crate) fn stream_shard_id(&self, shard: usize) -> String {
        self.with_stream(|s| s.id(shard).map(str::to_owned))
            .flatten()
            .unwrap_or_default()
    }

    /// Every shard of the table's stream, open and closed, numbered in the order they were
    /// created.
    pub fn stream_shards(&self) -> Vec<ShardInfo> {
        self.with_stream(Shards::infos).unwrap_or_default()
    }

    /// Splits an open shard of the stream in two, as DynamoDB does when the table's partition
    /// splits: each child takes half of its partition keys. Returns the children.
    pub fn split_stream_shard(&self, shard: usize) -> Result<(usize, usize), ReshardError> {
        let now = self.clock.now_millis();
        let mut state = self.state.lock().expect("table lock");
        let (_, shards) = state
            .stream
            .as_mut()
            .ok_or_else(|| ReshardError::NoStream(format!("of table {}", self.name)))?;
        shards.halve(shard, now)
    }

    /// Closes every open shard of the stream and opens a child of each: what DynamoDB Streams
    /// does every few hours. Returns the children.
    pub fn roll_over_stream(&self) -> Vec<usize> {
        let now = self.clock.now_millis();
        let mut state = self.state.lock().expect("table lock");
        state
            .stream
            .as_mut()
            .map(|(_, shards)| shards.roll_over(now))
            .unwrap_or_default()
    }

    pub(super) fn with_stream<T>(&self, f: impl FnOnce(&Shards<StreamRecord>) -> T) -> Option<T> {
        let state = self.state.lock().expect("table lock");
        state.stream.as_ref().map(|(_, s)| f(s))
    }

    /// Every item, in key order.
    pub fn items(&self) -> Vec<Item> {
        self.state
            .lock()
            .expect("table lock")
            .items
            .values()
            .cloned()
            .collect()
    }

    /// How many items the table holds.
    pub fn len(&self) -> usize {
        self.state.lock().expect("table lock").items.len()
    }

    /// Whether the table holds no item.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Up to `max` records of one shard of the stream from position `from`, and the position
    /// after them.
    pub(crate) fn stream_read(
        &self,
        shard: usize,
        from: usize,
        max: usize,
    ) -> (Vec<Arc<StreamRecord>>, usize) {
        self.with_stream(|s| s.read(shard, from, max))
            .unwrap_or((Vec::new(), from))
    }

    /// Every record the stream holds, in the order the changes were made.
    pub fn stream_records(&self) -> Vec<Arc<StreamRecord>> {
        let mut records: Vec<Arc<StreamRecord>> = self
            .with_stream(|s| s.records().cloned().collect())
            .unwrap_or_default();
        // Sequence numbers are of one width, and grow with every change of the table.
        records.sort_by(|a, b| a.sequence_number.cmp(&b.sequence_number));
        records
    }

    /// How many records the stream holds.
    pub fn stream_len(&self) -> usize {
        self.with_stream(Shards::held).unwrap_or(0)
    }

    /// The position of the first record of one shard created at or after `millis`.
    pub(crate) fn stream_position_at(&self, shard: usize, millis: i64) -> usize {
        self.with_stream(|s| s.position_at(shard, millis))
            .unwrap_or(0)
    }

    /// PutItem without a condition, as an application writing to its own table does.
    pub fn put_item(&self, item: Item) -> Result<(), StoreError> {
        let key = self.key_of(&item)?;
        check_item_size(&item)?;
        let mut state = self.state.lock().expect("table lock");
        self.write(&mut state, key, Some(item), false);
        Ok(())
    }

    /// DeleteItem by the item's key attributes.
    pub fn delete_item(&self, key: &Item) -> Result<(), StoreError> {
        let key = self.key_of(key)?;
        let mut state = self.state.lock().expect("table lock");
        self.write(&mut state, key, None, false);
        Ok(())
    }

    /// The table's key attributes.
    pub fn key_schema(&self) -> &KeySchema {
        &self.schema
    }

    /// GetItem with a strongly consistent read, by the item's key attributes, on a table of any
    /// key schema (what an external function's SDK asks for).
    pub fn read(&self, key: &Item) -> Result<Option<Item>, StoreError> {
        let key = self.key_of(key)?;
        if let Some(err) = self.throttled() {
            return Err(err);
        }
        Ok(self
            .state
            .lock()
            .expect("table lock")
            .items
            .get(&key)
            .cloned())
    }

    /// A conditional write of the item with `key`'s key attributes, atomic as DynamoDB's: under
    /// the table's lock, `change` sees the item (none: no item has the key) and answers what to
    /// store (none: delete it), or an error that leaves the item as it was.
    pub fn change(
        &self,
        key: &Item,
        change: impl FnOnce(Option<&Item>) -> Result<Option<Item>, StoreError>,
    ) -> Result<(), StoreError> {
        let canonical = self.key_of(key)?;
        if let Some(err) = self.throttled() {
            return Err(err);
        }
        let mut state = self.state.lock().expect("table lock");
        let next = change(state.items.get(&canonical))?;
        if let Some(item) = &next {
            check_item_size(item)?;
            if self.key_of(item)? != canonical {
                return Err(StoreError::Invalid(
                    "ValidationException: an update cannot change the item's key".into(),
                ));
            }
        }
        self.write(&mut state, canonical, next, false);
        Ok(())
    }

    /// The items of the partition with hash key `hash`, in sort key order. Items are stored
    /// under their canonical key, the hash key's first and length-prefixed: one partition is one
    /// range of the map, found without a scan.
    pub fn partition(&self, hash: &AttrValue) -> Vec<Item> {
        let mut prefix = String::new();
        push_canonical(&mut prefix, hash);
        let state = self.state.lock().expect("table lock");
        state
            .items
            .range(prefix.clone()..)
            .take_while(|(key, _)| key.starts_with(&prefix))
            .map(|(_, item)| item.clone())
            .collect()
    }

    /// Up to `limit` items in the table's key order after the item with `start`'s key
    /// attributes, and whether more follow: a page of a Scan.
    pub(crate) fn scan_after(
        &self,
        start: Option<&Item>,
        limit: usize,
    ) -> Result<(Vec<Item>, bool), StoreError> {
        let from = start.map(|key| self.key_of(key)).transpose()?;
        let state = self.state.lock().expect("table lock");
        let mut read = match &from {
            Some(from) => state
                .items
                .range::<String, _>((Bound::Excluded(from), Bound::Unbounded)),
            None => state.items.range::<String, _>(..),
        };
        let page: Vec<Item> = read
            .by_ref()
            .take(limit)
            .map(|(_, item)| item.clone())
            .collect();
        Ok((page, read.next().is_some()))
    }

    /// The key attributes of `item`.
    pub(crate) fn key_of_item(&self, item: &Item) -> Item {
        self.key_attributes(item)
    }

    /// What DynamoDB's TTL process does, eventually: deletes the items whose TTL attribute is
    /// before `now_secs`, each with a stream record marked as a deletion by the service.
    pub fn expire(&self, now_secs: i64) -> usize {
        if self.ttl_attribute.is_none() {
            return 0;
        }
        let mut state = self.state.lock().expect("table lock");
        let expired: Vec<String> = state
            .expiring
            .iter()
            .take_while(|(ttl, _)| *ttl <= now_secs)
            .map(|(_, key)| key.clone())
            .collect();
        for key in &expired {
            self.write(&mut state, key.clone(), None, true);
        }
        expired.len()
    }

    /// The earliest TTL (epoch seconds) of an item the TTL process will delete.
    pub(crate) fn next_ttl(&self) -> Option<i64> {
        self.ttl_attribute.as_ref()?;
        let state = self.state.lock().expect("table lock");
        state.expiring.first().map(|(ttl, _)| *ttl)
    }

    /// The canonical form of an item's key attributes: the map key items are stored under.
    pub(super) fn key_of(&self, item: &Item) -> Result<String, StoreError> {
        let mut key = String::new();
        for (i, name) in std::iter::once(&self.schema.hash)
            .chain(self.schema.range.as_ref())
            .enumerate()
        {
            let value = item.get(name).ok_or_else(|| {
                StoreError::Invalid(format!(
                    "ValidationException: the item has no key attribute {name}"
                ))
            })?;
            if i == 0 {
                push_canonical(&mut key, value);
            } else {
                push_canonical_last(&mut key, value);
            }
        }
        Ok(key)
    }

    /// The stored keys of partition `pk` (string sort keys), and where the keys after sort key
    /// `after` start: every range part begins with a type tag below 'T'.
    pub(super) fn partition_bounds(
        &self,
        pk: &str,
        after: Option<&str>,
    ) -> (std::ops::Range<String>, String) {
        let mut start = String::new();
        push_canonical(&mut start, &AttrValue::S(pk.to_owned()));
        let end = format!("{start}T");
        let mut from = start.clone();
        if let Some(after) = after {
            push_canonical_last(&mut from, &AttrValue::S(after.to_owned()));
        }
        (start..end, from)
    }

    pub(super) fn item_key(&self, key: &ItemKey) -> String {
        let mut canonical = String::with_capacity(key.pk.len() + key.sk.len() + 16);
        push_canonical(&mut canonical, &AttrValue::S(key.pk.clone()));
        if self.schema.range.is_some() {
            push_canonical_last(&mut canonical, &AttrValue::S(key.sk.clone()));
        }
        canonical
    }

    pub(super) fn key_attributes(&self, item: &Item) -> Item {
        std::iter::once(&self.schema.hash)
            .chain(self.schema.range.as_ref())
            .filter_map(|name| item.get(name).map(|v| (name.clone(), v.clone())))
            .collect()
    }

    /// Writes (or deletes, with `None`) the item at `key`, recording the change in the stream.
    pub(super) fn write(
        &self,
        state: &mut State,
        key: String,
        item: Option<Item>,
        ttl_deletion: bool,
    ) {
        if let Some(ttl) = self.ttl_of(item.as_ref()) {
            state.expiring.insert((ttl, key.clone()));
        }
        let old = match &item {
            Some(item) => state.items.insert(key.clone(), item.clone()),
            None => state.items.remove(&key),
        };
        if let Some(ttl) = self.ttl_of(old.as_ref()) {
            if self.ttl_of(item.as_ref()) != Some(ttl) {
                state.expiring.remove(&(ttl, key));
            }
        }
        let Some((view, stream)) = state.stream.as_mut() else {
            return;
        };
        let kind = match (&old, &item) {
            (None, Some(_)) => ChangeKind::Insert,
            // "If you perform a PutItem or UpdateItem operation that does not change any data in
            // an item, DynamoDB Streams does not write a stream record for that operation."
            (Some(old), Some(new)) if old == new => return,
            (Some(_), Some(_)) => ChangeKind::Modify,
            (Some(_), None) => ChangeKind::Remove,
            (None, None) => return,
        };
        let keys = self.key_attributes(item.as_ref().or(old.as_ref()).expect("one of them exists"));
        // An item's changes stay in the shard lineage of its partition key.
        let mut partition = String::new();
        push_canonical(
            &mut partition,
            keys.get(&self.schema.hash)
                .expect("a key has its hash attribute"),
        );
        let shard = stream.route(keyway::domain::hash::kinesis_hash_key(&partition));
        let mut next = self.next_sequence.lock().expect("sequence lock");
        *next += 1;
        stream.push(
            shard,
            StreamRecord {
                sequence_number: format!(
                    "{:021}",
                    100_000_000_000_000_000_000u128 + u128::from(*next)
                ),
                kind,
                keys,
                view: *view,
                old_image: old.filter(|_| view.keeps_old()),
                new_image: item.filter(|_| view.keeps_new()),
                created_millis: self.clock.now_millis(),
                ttl_deletion,
            },
        );
    }

    /// The item's TTL (epoch seconds), when TTL is on and the item has one.
    pub(super) fn ttl_of(&self, item: Option<&Item>) -> Option<i64> {
        let attribute = self.ttl_attribute.as_ref()?;
        item?
            .get(attribute)
            .and_then(AttrValue::as_n)
            .and_then(|n| n.parse::<i64>().ok())
    }
}
