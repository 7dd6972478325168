//! In-memory DynamoDB: tables with a key schema, the semantics the state store relies on
//! (strongly consistent reads, conditional puts, BatchGetItem of 100 keys and 16 MB with the rest
//! unprocessed, BatchWriteItem of 25 requests with no key twice, the 400 KB item limit), a TTL
//! process, and streams of any view type (`StreamView`) where TTL deletions are marked as the
//! service's and a write that changes nothing leaves no record. A stream's shards split and roll
//! over as DynamoDB Streams' do, each item's changes staying in one lineage (`shards`).
//! It meters calls and capacity units, and injects throttling, unprocessed keys and items, and the
//! commits of a concurrent writer.
//!
//! `table` holds a table's items, its TTL index and its stream; `calls` is what the state store
//! and the adapters call (`Table`), metered and with its faults.

mod calls;
mod table;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::services::faults::{FaultCounts, Faults};
use crate::services::meter::Meter;
use crate::services::shards::{Arrived, Shards};
use keyway::adapters::dynamodb::{PK, SK};
use keyway::domain::{AttrValue, ChangeKind, Item};
use keyway::ports::Clock;

/// When every table's stream was enabled: the label in its ARN, 2026-01-01T00:00:00.000.
const STREAM_CREATED_MILLIS: i64 = 1_767_225_600_000;

/// A table's key attributes (both strings here, as in every table keyway writes or reads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySchema {
    /// The partition (HASH) key attribute.
    pub hash: String,
    /// The sort (RANGE) key attribute, if the table has one.
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
    /// `KEYS_ONLY`: only the item's key attributes.
    KeysOnly,
    /// `NEW_IMAGE`: the item as it is after the change.
    NewImage,
    /// `OLD_IMAGE`: the item as it was before the change.
    OldImage,
    /// `NEW_AND_OLD_IMAGES`: the item both before and after the change.
    NewAndOldImages,
}

impl StreamView {
    /// Every view type.
    pub const ALL: [StreamView; 4] = [
        Self::KeysOnly,
        Self::NewImage,
        Self::OldImage,
        Self::NewAndOldImages,
    ];

    /// The view type's name in the API and in stream records, such as `NEW_AND_OLD_IMAGES`.
    pub fn name(self) -> &'static str {
        match self {
            Self::KeysOnly => "KEYS_ONLY",
            Self::NewImage => "NEW_IMAGE",
            Self::OldImage => "OLD_IMAGE",
            Self::NewAndOldImages => "NEW_AND_OLD_IMAGES",
        }
    }

    /// The view type of that name (`StreamView::name`), if any.
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
    /// The record's sequence number: 21 digits, growing with every change of the table.
    pub sequence_number: String,
    /// Whether the change inserted, modified or removed the item.
    pub kind: ChangeKind,
    /// The item's key attributes.
    pub keys: Item,
    /// The stream's view type when the change was made.
    pub view: StreamView,
    /// The item before the change, if the view keeps old images and there was one.
    pub old_image: Option<Item>,
    /// The item after the change, if the view keeps new images and there is one.
    pub new_image: Option<Item>,
    /// When the change was made, in epoch milliseconds.
    pub created_millis: i64,
    /// Whether the TTL process deleted the item.
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
    /// No tables yet; each table created draws its faults from `faults`, and the TTL process
    /// waits `DEFAULT_TTL_DELAY`.
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

    /// The table named `name`, if it exists.
    pub fn table(&self, name: &str) -> Option<Arc<LocalTable>> {
        self.tables.lock().expect("tables lock").get(name).cloned()
    }

    /// Every table, by name.
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
        self.summed(LocalTable::faults_fired)
    }

    /// The chances each kind of fault had, at every table.
    pub fn faults_drawn(&self) -> FaultCounts {
        self.summed(LocalTable::faults_drawn)
    }

    /// `counts` of every table, added up.
    fn summed(&self, counts: impl Fn(&LocalTable) -> FaultCounts) -> FaultCounts {
        let mut all = FaultCounts::new();
        for table in self.tables() {
            super::faults::add_counts(&mut all, &counts(&table));
        }
        all
    }

    /// When the TTL process next deletes an item (epoch milliseconds), if any table holds one
    /// with a TTL.
    pub(crate) fn next_expiry_millis(&self) -> Option<i64> {
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
    use keyway::adapters::dynamodb::TTL;

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
