//! In-memory DynamoDB: tables with a key schema, the semantics the state store relies on
//! (strongly consistent reads, conditional puts, BatchGetItem of 100 keys and 16 MB with the rest
//! unprocessed, BatchWriteItem of 25 requests with no key twice, the 400 KB item limit), a TTL
//! process, and streams of any view type (`StreamView`) where TTL deletions are marked as the
//! service's and a write that changes nothing leaves no record. A stream's shards split and roll
//! over as DynamoDB Streams' do, each item's changes staying in one lineage (`shards`).
//! It meters calls and capacity units, and injects throttling, unprocessed keys and items, and the
//! commits of a concurrent writer.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicI64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::faults::{crash, Fault, FaultCounts, Faults};
use super::meter::Meter;
use super::shards::{Arrived, ReshardError, ShardInfo, Shards};
use keyway::adapters::dynamodb::rules::{
    check_batch_get, check_batch_write, check_item_size, check_state_key, read_units, scan_page_of,
    write_units,
};
use keyway::adapters::dynamodb::{
    BatchGetOutput, Expect, ItemKey, ScanPage, Table, WriteRequest, PK, SK, TTL, VERSION,
};
use keyway::domain::item::item_size;
use keyway::domain::{AttrValue, ChangeKind, Item};
use keyway::ports::{Clock, StoreError, SystemClock};

/// BatchGetItem returns at most 16 MB; DynamoDB leaves the rest unprocessed.
const BATCH_GET_RESPONSE_MAX: usize = 16 * 1024 * 1024;
/// When every table's stream was enabled: the label in its ARN, 2026-01-01T00:00:00.000.
const STREAM_CREATED_MILLIS: i64 = 1_767_225_600_000;

/// A table's key attributes (both strings here, as in every table keyway writes or reads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySchema {
    pub hash: String,
    pub range: Option<String>,
}

impl KeySchema {
    /// The schema of keyway's state table.
    pub fn state_table() -> Self {
        Self {
            hash: PK.into(),
            range: Some(SK.into()),
        }
    }
}

/// Appends a key value to a canonical key: its type, its length, then its text, so that no two
/// different keys share a canonical form.
fn push_canonical(out: &mut String, value: &AttrValue) {
    use std::fmt::Write as _;
    let (tag, text) = canonical_parts(value);
    let _ = write!(out, "{tag}{}:{text}", text.len());
}

/// The canonical form of a range key: the last part of a stored key needs no length, and without
/// one, string sort keys order as DynamoDB orders them, so a partition reads in sort key order.
fn push_canonical_last(out: &mut String, value: &AttrValue) {
    use std::fmt::Write as _;
    let (tag, text) = canonical_parts(value);
    let _ = write!(out, "{tag}:{text}");
}

fn canonical_parts(value: &AttrValue) -> (char, std::borrow::Cow<'_, str>) {
    match value {
        AttrValue::S(s) => ('S', std::borrow::Cow::Borrowed(s.as_str())),
        AttrValue::N(n) => ('N', std::borrow::Cow::Borrowed(n.as_str())),
        other => (
            'J',
            std::borrow::Cow::Owned(other.to_dynamodb_json().to_string()),
        ),
    }
}

/// What a table's stream records carry of the item: `StreamSpecification.StreamViewType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamView {
    KeysOnly,
    NewImage,
    OldImage,
    NewAndOldImages,
}

impl StreamView {
    pub const ALL: [StreamView; 4] = [
        Self::KeysOnly,
        Self::NewImage,
        Self::OldImage,
        Self::NewAndOldImages,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::KeysOnly => "KEYS_ONLY",
            Self::NewImage => "NEW_IMAGE",
            Self::OldImage => "OLD_IMAGE",
            Self::NewAndOldImages => "NEW_AND_OLD_IMAGES",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name() == text)
    }

    fn keeps_old(self) -> bool {
        matches!(self, Self::OldImage | Self::NewAndOldImages)
    }

    fn keeps_new(self) -> bool {
        matches!(self, Self::NewImage | Self::NewAndOldImages)
    }
}

/// One change as the table's stream holds it: the images its view type keeps.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamRecord {
    pub sequence_number: String,
    pub kind: ChangeKind,
    pub keys: Item,
    pub view: StreamView,
    pub old_image: Option<Item>,
    pub new_image: Option<Item>,
    pub created_millis: i64,
    pub ttl_deletion: bool,
}

struct State {
    items: BTreeMap<String, Item>,
    /// (TTL, key) of every item with a TTL: what the TTL process finds due without reading
    /// every item, once a virtual second, however large the table grows.
    expiring: BTreeSet<(i64, String)>,
    stream: Option<(StreamView, Shards<StreamRecord>)>,
}

impl Arrived for StreamRecord {
    fn arrival_millis(&self) -> i64 {
        self.created_millis
    }
}

/// One in-memory table.
pub struct LocalTable {
    name: String,
    schema: KeySchema,
    state: Mutex<State>,
    /// The attribute DynamoDB's TTL process reads, when TTL is on.
    ttl_attribute: Option<String>,
    next_sequence: Arc<Mutex<u64>>,
    clock: Arc<dyn Clock>,
    meter: Meter,
    faults: Faults,
}

impl Default for LocalTable {
    fn default() -> Self {
        Self::new()
    }
}

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

    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// The faults this table injected so far.
    pub fn faults_fired(&self) -> FaultCounts {
        self.faults.fired()
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
    fn stream_shards_of(table: &str) -> Shards<StreamRecord> {
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
    pub fn stream_shard_id(&self, shard: usize) -> String {
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

    fn with_stream<T>(&self, f: impl FnOnce(&Shards<StreamRecord>) -> T) -> Option<T> {
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

    pub fn len(&self) -> usize {
        self.state.lock().expect("table lock").items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Up to `max` records of one shard of the stream from position `from`, and the position
    /// after them.
    pub fn stream_read(
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
    pub fn stream_position_at(&self, shard: usize, millis: i64) -> usize {
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
    pub fn scan_after(
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
    pub fn key_of_item(&self, item: &Item) -> Item {
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
    pub fn next_ttl(&self) -> Option<i64> {
        self.ttl_attribute.as_ref()?;
        let state = self.state.lock().expect("table lock");
        state.expiring.first().map(|(ttl, _)| *ttl)
    }

    /// The canonical form of an item's key attributes: the map key items are stored under.
    fn key_of(&self, item: &Item) -> Result<String, StoreError> {
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
    fn partition_bounds(&self, pk: &str, after: Option<&str>) -> (std::ops::Range<String>, String) {
        let mut start = String::new();
        push_canonical(&mut start, &AttrValue::S(pk.to_owned()));
        let end = format!("{start}T");
        let mut from = start.clone();
        if let Some(after) = after {
            push_canonical_last(&mut from, &AttrValue::S(after.to_owned()));
        }
        (start..end, from)
    }

    fn item_key(&self, key: &ItemKey) -> String {
        let mut canonical = String::with_capacity(key.pk.len() + key.sk.len() + 16);
        push_canonical(&mut canonical, &AttrValue::S(key.pk.clone()));
        if self.schema.range.is_some() {
            push_canonical_last(&mut canonical, &AttrValue::S(key.sk.clone()));
        }
        canonical
    }

    fn key_attributes(&self, item: &Item) -> Item {
        std::iter::once(&self.schema.hash)
            .chain(self.schema.range.as_ref())
            .filter_map(|name| item.get(name).map(|v| (name.clone(), v.clone())))
            .collect()
    }

    /// Writes (or deletes, with `None`) the item at `key`, recording the change in the stream.
    fn write(&self, state: &mut State, key: String, item: Option<Item>, ttl_deletion: bool) {
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
    fn ttl_of(&self, item: Option<&Item>) -> Option<i64> {
        let attribute = self.ttl_attribute.as_ref()?;
        item?
            .get(attribute)
            .and_then(AttrValue::as_n)
            .and_then(|n| n.parse::<i64>().ok())
    }

    fn throttled(&self) -> Option<StoreError> {
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
        let items: Vec<Item> = {
            let _busy = self.meter.busy();
            self.partition(&AttrValue::S(pk.to_owned()))
        };
        let size: usize = items.iter().map(item_size).sum();
        self.meter.call("Query", read_units(size), 0.0).await;
        Ok(items)
    }

    async fn query_after(
        &self,
        pk: &str,
        after_sk: &str,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        let items: Vec<Item> = {
            let _busy = self.meter.busy();
            let state = self.state.lock().expect("table lock");
            let (partition, after) = self.partition_bounds(pk, Some(after_sk));
            state
                .items
                .range(after..partition.end)
                .filter(|(key, _)| key.starts_with(&partition.start))
                .skip_while(|(_, item)| item.get(SK).and_then(AttrValue::as_s) == Some(after_sk))
                .take(limit)
                .map(|(_, item)| item.clone())
                .collect()
        };
        let size: usize = items.iter().map(item_size).sum();
        self.meter.call("Query", read_units(size), 0.0).await;
        Ok(items)
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
        let size = item.as_ref().map_or(0, item_size);
        self.meter.call("Query", read_units(size), 0.0).await;
        Ok(item)
    }
}

/// The tables of the embedded runtime, by name.
pub struct LocalDynamoDb {
    tables: Mutex<BTreeMap<String, Arc<LocalTable>>>,
    clock: Arc<dyn Clock>,
    faults: super::faults::FaultPlan,
    /// How long after its TTL the TTL process deletes an item, in seconds.
    ttl_delay_secs: AtomicI64,
    /// The latency of calls from functions, for every table, those made later included.
    function_latency: Mutex<Option<Duration>>,
}

/// DynamoDB deletes an expired item "typically within a few days" of its expiry ("Using time to
/// live (TTL) in DynamoDB"). The embedded runtime waits two days by default, so that code that
/// takes a TTL deletion for a timer fails its tests instead of its users.
pub const DEFAULT_TTL_DELAY: Duration = Duration::from_secs(2 * 24 * 3600);

impl LocalDynamoDb {
    pub fn new(clock: Arc<dyn Clock>, faults: super::faults::FaultPlan) -> Self {
        Self {
            tables: Mutex::new(BTreeMap::new()),
            clock,
            faults,
            ttl_delay_secs: AtomicI64::new(DEFAULT_TTL_DELAY.as_secs() as i64),
            function_latency: Mutex::new(None),
        }
    }

    /// Calls from function invocations to every table, now and to be made, take `latency`
    /// (`Meter::set_function_latency`).
    pub fn set_function_latency(&self, latency: Option<Duration>) {
        *self.function_latency.lock().expect("latency lock") = latency;
        for table in self.tables() {
            table.meter().set_function_latency(latency);
        }
    }

    /// How long after its TTL an item is deleted (whole seconds): a test of what happens on a
    /// TTL deletion shortens it; one of code that must not wait for one keeps the default.
    pub fn set_ttl_delay(&self, delay: Duration) {
        self.ttl_delay_secs
            .store(delay.as_secs() as i64, AtomicOrdering::Relaxed);
    }

    /// Creates a table (replacing one of the same name) and returns it.
    pub fn create_table(
        &self,
        name: &str,
        schema: KeySchema,
        ttl_attribute: Option<String>,
        stream: Option<StreamView>,
    ) -> Arc<LocalTable> {
        let mut tables = self.tables.lock().expect("tables lock");
        // Each table draws its own faults, salted by its position, so runs repeat.
        let faults = Faults::new(self.faults.clone(), 0x7ab1e + tables.len() as u64);
        let table = Arc::new(LocalTable::create(
            name,
            schema,
            ttl_attribute,
            stream,
            self.clock.clone(),
            faults,
        ));
        let latency = *self.function_latency.lock().expect("latency lock");
        table.meter().set_function_latency(latency);
        tables.insert(name.to_owned(), table.clone());
        table
    }

    pub fn table(&self, name: &str) -> Option<Arc<LocalTable>> {
        self.tables.lock().expect("tables lock").get(name).cloned()
    }

    pub fn tables(&self) -> Vec<Arc<LocalTable>> {
        self.tables
            .lock()
            .expect("tables lock")
            .values()
            .cloned()
            .collect()
    }

    /// The faults every table injected so far.
    pub fn faults_fired(&self) -> FaultCounts {
        let mut counts = FaultCounts::new();
        for table in self.tables() {
            super::faults::add_counts(&mut counts, &table.faults_fired());
        }
        counts
    }

    /// When the TTL process next deletes an item (epoch milliseconds), if any table holds one
    /// with a TTL.
    pub fn next_expiry_millis(&self) -> Option<i64> {
        let delay = self.ttl_delay_secs.load(AtomicOrdering::Relaxed);
        let next = self.tables().iter().filter_map(|t| t.next_ttl()).min()?;
        Some((next + delay + 1).saturating_mul(1000))
    }

    /// Runs the TTL process on every table: deletes the items expired for the TTL delay.
    pub fn expire(&self) -> usize {
        let delay = self.ttl_delay_secs.load(AtomicOrdering::Relaxed);
        let now_secs = self.clock.now_millis().div_euclid(1000) - delay;
        self.tables().iter().map(|t| t.expire(now_secs)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(pk: &str, ttl: Option<i64>) -> Item {
        let mut item: Item = [
            ("pk".to_owned(), AttrValue::S(pk.into())),
            ("sk".to_owned(), AttrValue::S("head".into())),
        ]
        .into();
        if let Some(ttl) = ttl {
            item.insert(TTL.into(), AttrValue::N(ttl.to_string()));
        }
        item
    }

    fn keys(table: &LocalTable) -> Vec<String> {
        let mut keys: Vec<String> = table
            .items()
            .iter()
            .map(|i| i["pk"].as_s().unwrap().to_owned())
            .collect();
        keys.sort();
        keys
    }

    #[test]
    fn the_ttl_process_deletes_exactly_the_items_due_by_their_latest_ttl() {
        let table = LocalTable::new();
        table.put_item(item("due", Some(10))).unwrap();
        table.put_item(item("later", Some(20))).unwrap();
        table.put_item(item("forever", None)).unwrap();
        table.put_item(item("moved-later", Some(5))).unwrap();
        table.put_item(item("moved-later", Some(30))).unwrap();
        table.put_item(item("moved-earlier", Some(40))).unwrap();
        table.put_item(item("moved-earlier", Some(10))).unwrap();
        table.put_item(item("ttl-dropped", Some(5))).unwrap();
        table.put_item(item("ttl-dropped", None)).unwrap();
        assert_eq!(table.expire(9), 0);
        assert_eq!(table.expire(10), 2, "due and moved-earlier");
        assert_eq!(
            keys(&table),
            ["forever", "later", "moved-later", "ttl-dropped"]
        );
        assert_eq!(table.expire(10), 0, "each item is deleted once");
        assert_eq!(table.expire(1_000), 2);
        assert_eq!(keys(&table), ["forever", "ttl-dropped"]);
    }
}
