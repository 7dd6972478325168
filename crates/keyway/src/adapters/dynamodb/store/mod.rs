//! The state store on one DynamoDB table (single-table design).
//!
//! # Key schema
//!
//! | item      | pk                              | sk                      | attributes                          |
//! |-----------|---------------------------------|-------------------------|-------------------------------------|
//! | head      | `{operator}#{signature}#{key}`  | `head`                  | `v` (N), `doc` (S), `ttl` (N)       |
//! | segment   | same as its head                | `seg#{slot}#{id:016x}`  | `e` (S), `ttl` (N)                  |
//! | outbox    | same as its head                | `ob#{id:016x}`          | `e` (S)                             |
//! | watermark | same as its head                | `wm#{lineage}`          | `s` (S), `t` (N), `ttl` (N)         |
//!
//! Beside the keys' items, the due-time index of their timers (`timers`).
//!
//! Why this shape:
//! - One table for every operator: one IAM resource, one TTL setting, and a batch of keys of any
//!   operator loads with one BatchGetItem (100 keys a call).
//! - Operator name and state signature lead the partition key, so state written under another
//!   structure is never read under this one, and ages out by TTL.
//! - The head holds everything small about a key — version, recent watermarks, slots' inline
//!   entries, the outbox, the notes of what went out of records not yet applied (`sn`, at most
//!   `SentSoFar::MAX_RECORDS` records and `SentSoFar::MAX_RANGES` ranges) — so the common batch
//!   costs one read and one conditional write per key.
//!   It is JSON text (`doc`): cheap to write, readable in the console; above a KB it is stored
//!   deflated beside (`docz`, B; see `text`), as segments' entries are (`ez`), since DynamoDB
//!   bills a write by the item's bytes. A head is deflated with its operator's preset
//!   dictionary if it declares one (`KeyedOperator::state_dictionaries`), which takes many a
//!   head of a few records under a KB.
//! - Entries that do not fit the head (above `HEAD_INLINE_LIMIT`) move to immutable segment items
//!   under the same partition key, the outbox's as the slots'. Segments are written before the
//!   head that references them and never changed, so the conditional write of the head alone
//!   commits the whole state, of any size, atomically; TransactWriteItems (100 items, 4 MB,
//!   double cost) is never needed.
//! - Segment ids are random: two writers racing on one key never overwrite each other's segments.
//!   Segments a head stops referencing are listed in its `gc` and deleted by the next commit.
//! - A commit that writes segments first lists them in the head's `pd` attribute (an update at
//!   the version it read, leaving the rest of the head alone). If it never finishes (the process
//!   crashed after writing segments, before its head), the next commit of the key finds them
//!   there and lists them in its own `gc`: they can never be referenced, since a head put that
//!   expected the old version cannot land once the next commit's has.
//!
//! # Design notes
//!
//! **Watermarks of many lineages.** A key fed by many lineages (a DynamoDB stream's items, the
//! partition keys of a shard read with ParallelizationFactor > 1) would fill its head with
//! watermarks, each rewritten by every commit. The head keeps every watermark its commit advanced
//! and the `WATERMARKS_INLINE` most recent others. The rest move to watermark items, written
//! before the head with a condition that only raises them (a stale writer can never lower one); a
//! load reads the items of the lineages its batch holds, and only when the head says some were
//! moved (`wx`). A watermark only ever moves out of the head once committed, so an item never
//! holds a value no commit made. A commit may advance at most `LINEAGES_PER_COMMIT` lineages of a
//! key; the executor stops a key's batch there and Lambda redelivers the rest.
//!
//! **TTL.** An operator's state TTL applies to its slots (`exp` in the doc): a load after it
//! returns empty slots. The item's own `ttl`, which DynamoDB's TTL process acts on, is later:
//! watermarks must outlive any redelivery (the latest watermark's arrival plus the retention the
//! commit names), and an outbox never expires, so a head holding one has no `ttl` until it is
//! cleared. A head with no slots at all (a deleted row, an emptied group) expires with its
//! watermarks, TTL or not. Watermark items expire with their own arrival plus the retention.
//!
//! **Lost responses.** Every commit writes a random token into the head, which keeps the last
//! `TOKENS_KEPT`. A head put that fails its condition — after a timeout whose write landed, or
//! the SDK retrying one — reads the head: finding its token, it reports success, not a conflict.
//! Segments a failed commit wrote are deleted only once the head's version has moved past the
//! one the commit expected (so the put can never land later) and the head does not reference
//! them; otherwise they are left for their TTL.
//!
//! **Outbox.** Outputs committed in the outbox are sent after the commit; the executor then asks
//! the store to clear them, which rewrites the head at the same version, conditional on it, so a
//! writer that read the head in between still commits and the outbox is never sent twice by the
//! key's next commit.

mod commit;
mod head;
mod io;
mod layout;
pub mod text;
mod timers;
mod watermarks;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::value::RawValue;

use super::{ItemKey, Table, ITEM_MAX_BYTES, VERSION};
use crate::adapters::retry::Backoff;
use crate::domain::hash::sha256_hex;
use crate::domain::{
    AttrValue, Dictionary, Item, KeyState, Origin, Output, SlotData, StoreMemo, Watermarks,
};
use crate::ports::{
    Clock, Commit, Committed, KeyPage, LoadKey, Namespace, StateStore, StoreError, StoreLimits,
    TimerIndex,
};

pub use head::TOKENS_KEPT;
use head::{HeadDoc, ListDoc, Loaded};

/// Inline entries beyond this many bytes move to segments: a head rewritten on every commit costs
/// one write unit per KB, so it stays small.
pub const HEAD_INLINE_LIMIT: usize = 32 * 1024;
/// Segments are filled up to this size, well under the 400 KB item limit.
pub const SEGMENT_TARGET: usize = 256 * 1024;
/// How many watermarks a head keeps besides those its commit advanced; the rest live in
/// watermark items.
pub const WATERMARKS_INLINE: usize = 32;
/// The most lineages one commit of a key may advance: all of them are in the head it writes.
pub const LINEAGES_PER_COMMIT: usize = 256;
/// The largest entry (or outbox output) a segment item can hold: the item limit less its key and
/// attribute names.
pub(super) const ENTRY_MAX_BYTES: usize = ITEM_MAX_BYTES - 2 * 1024;
/// Items a scan of `list_keys` reads per page.
const SCAN_PAGE: usize = 1_000;
/// Keys longer than this are stored under their hash (DynamoDB allows 2048 bytes of partition key).
const KEY_HASHED_PAST_BYTES: usize = 1024;
const HEAD_SK: &str = "head";
const DOC: &str = "doc";
/// The head's list of segments a commit wrote before its head (see the key schema notes).
const PENDING: &str = "pd";
const ENTRIES: &str = "e";

/// `StateStore` on any `Table`: the SDK's for AWS, the in-memory one for tests and local runs.
pub struct DynamoStateStore<T: Table> {
    table: Arc<T>,
    clock: Arc<dyn Clock>,
    backoff: Backoff,
    cursors: timers::KnownCursors,
}

impl<T: Table> DynamoStateStore<T> {
    /// The store on `table`, reading the time (TTLs, timers) from `clock`, with the default
    /// backoff.
    pub fn new(table: Arc<T>, clock: Arc<dyn Clock>) -> Self {
        Self {
            table,
            clock,
            backoff: Backoff::default(),
            cursors: timers::KnownCursors::default(),
        }
    }

    /// The same store, retrying its calls with `backoff`.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The table the store is on.
    pub fn table(&self) -> &Arc<T> {
        &self.table
    }

    /// The head item's key for `key` of the operator in `namespace`.
    pub fn head_key(namespace: &Namespace, key: &str) -> ItemKey {
        ItemKey {
            pk: partition_key(namespace, key),
            sk: HEAD_SK.to_owned(),
        }
    }

    /// The sort keys of every segment `head` references or lists as garbage or pending: all a
    /// key's segment items should be among them (tests and tools check there are no others).
    /// `dictionaries` are its operator's: a head that cannot be read without one accounts for
    /// its pending segments alone, so its others show as unaccounted for.
    pub fn accounted_for(
        head: &Item,
        dictionaries: &[Dictionary],
    ) -> std::collections::HashSet<String> {
        let pk = head.get(super::PK).and_then(AttrValue::as_s).unwrap_or("");
        let mut keys: std::collections::HashSet<String> = pending_of(head).into_iter().collect();
        if let Ok((_, doc)) = parse_head(head, dictionaries) {
            keys.extend(commit::referenced(pk, &doc));
            keys.extend(doc.gc);
        }
        keys
    }

    fn now_secs(&self) -> i64 {
        self.clock.now_millis().div_euclid(1000)
    }
}

fn partition_key(namespace: &Namespace, key: &str) -> String {
    // Built by hand: this runs for every key of every batch, and `format!` costs more than the rest.
    let hashed;
    let key = if key.len() > KEY_HASHED_PAST_BYTES {
        hashed = format!("~{}", sha256_hex(&[key.as_bytes()], 64));
        hashed.as_str()
    } else {
        key
    };
    let mut pk =
        String::with_capacity(namespace.operator.len() + namespace.signature.len() + key.len() + 2);
    pk.push_str(&namespace.operator);
    pk.push('#');
    pk.push_str(&namespace.signature);
    pk.push('#');
    pk.push_str(key);
    pk
}

fn slot_segment_key(pk: &str, slot: &str, id: u64) -> ItemKey {
    ItemKey {
        pk: pk.to_owned(),
        sk: format!("seg#{slot}#{id:016x}"),
    }
}

fn outbox_segment_key(pk: &str, id: u64) -> ItemKey {
    ItemKey {
        pk: pk.to_owned(),
        sk: format!("ob#{id:016x}"),
    }
}

fn number(item: &Item, name: &str) -> Result<Option<i64>, StoreError> {
    item.get(name)
        .map(|v| {
            v.as_n().and_then(|n| n.parse::<i64>().ok()).ok_or_else(|| {
                StoreError::Corrupt(format!("attribute {name} is not an integer: {v:?}"))
            })
        })
        .transpose()
}

/// The segments a head lists as pending.
fn pending_of(item: &Item) -> Vec<String> {
    match item.get(PENDING) {
        Some(AttrValue::L(values)) => values
            .iter()
            .filter_map(|v| v.as_s().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// A head item parsed: its version and doc, inflated with whichever of `dictionaries` it names.
fn parse_head(item: &Item, dictionaries: &[Dictionary]) -> Result<(u64, HeadDoc), StoreError> {
    let version = number(item, VERSION)?.unwrap_or(0) as u64;
    let text = text::read(item, DOC, "{}", "the head's doc", dictionaries)?;
    let doc: HeadDoc = serde_json::from_str(&text)
        .map_err(|e| StoreError::Corrupt(format!("head doc does not parse: {e}")))?;
    Ok((version, doc))
}

/// The entries of a list: its segments' (read in the second wave), then its inline ones.
fn list_entries(
    list: ListDoc,
    key_of: impl Fn(u64) -> ItemKey,
    items: &HashMap<ItemKey, Item>,
) -> Result<Vec<Box<RawValue>>, StoreError> {
    let mut entries = Vec::with_capacity(list.sealed_len() + list.e.len());
    for segment in &list.seg {
        let key = key_of(segment.id);
        let item = items.get(&key).ok_or_else(|| {
            StoreError::Corrupt(format!("segment {} of {} is missing", key.sk, key.pk))
        })?;
        // Segments are deflated without a dictionary: at tens of KB, they gain little from one.
        let text = text::read(item, ENTRIES, "[]", &format!("segment {}", key.sk), &[])?;
        let mut part: Vec<Box<RawValue>> = serde_json::from_str(&text)
            .map_err(|e| StoreError::Corrupt(format!("segment {} does not parse: {e}", key.sk)))?;
        entries.append(&mut part);
    }
    entries.extend(list.e);
    Ok(entries)
}

/// A loaded head, waiting for its second wave.
struct Pending {
    key: String,
    pk: String,
    version: u64,
    doc: HeadDoc,
    expired: bool,
    /// Lineages whose watermark items the second wave reads.
    lineages: Vec<crate::domain::Origin>,
    pending: Vec<String>,
}

impl Pending {
    /// The items the second wave reads for this key.
    fn wanted(&self) -> Vec<ItemKey> {
        let mut keys = Vec::new();
        if !self.expired {
            for (name, slot) in &self.doc.slots {
                keys.extend(
                    slot.seg
                        .iter()
                        .map(|s| slot_segment_key(&self.pk, name, s.id)),
                );
            }
        }
        if let Some(outbox) = &self.doc.ob {
            keys.extend(
                outbox
                    .seg
                    .iter()
                    .map(|s| outbox_segment_key(&self.pk, s.id)),
            );
        }
        keys.extend(
            self.lineages
                .iter()
                .map(|l| watermarks::item_key(&self.pk, l)),
        );
        keys
    }

    /// The key's state, from its head and the second wave's items.
    fn finish(self, items: &HashMap<ItemKey, Item>) -> Result<KeyState, StoreError> {
        let pk = &self.pk;
        let mut doc = self.doc;
        let mut loaded = Loaded {
            garbage: std::mem::take(&mut doc.gc),
            inline: doc.wm.clone(),
            spilled: doc.wx,
            tokens: std::mem::take(&mut doc.tk),
            pending: self.pending,
            ..Loaded::default()
        };
        let mut marks = Watermarks::default();
        for (lineage, mark) in std::mem::take(&mut doc.wm) {
            marks.insert(lineage, mark);
        }
        for lineage in &self.lineages {
            if let Some(mark) = items
                .get(&watermarks::item_key(pk, lineage))
                .and_then(watermarks::parse_item)
            {
                loaded.fetched.insert(lineage.clone(), mark.clone());
                marks.merge(lineage.clone(), mark);
            }
        }
        let mut slots = BTreeMap::new();
        for (name, list) in std::mem::take(&mut doc.slots) {
            loaded.slots.insert(name.clone(), list.seg.clone());
            if !self.expired {
                let entries = list_entries(list, |id| slot_segment_key(pk, &name, id), items)?;
                slots.insert(name, SlotData::loaded(entries));
            }
        }
        let mut outbox = Vec::new();
        if let Some(list) = doc.ob.take() {
            loaded.outbox = list.seg.clone();
            for entry in list_entries(list, |id| outbox_segment_key(pk, id), items)? {
                let output: Output = serde_json::from_str(entry.get()).map_err(|e| {
                    StoreError::Corrupt(format!("an outbox entry of {pk} does not parse: {e}"))
                })?;
                outbox.push(output);
            }
        }
        Ok(KeyState {
            version: self.version,
            watermarks: marks,
            slots,
            outbox,
            expires_at: if self.expired { None } else { doc.exp },
            // An expired key's record runs on empty state: its outputs are not the ones sent.
            sent_so_far: if self.expired { None } else { doc.sn },
            retiring: doc.mf,
            memo: StoreMemo::new(loaded),
        })
    }
}

#[async_trait]
impl<T: Table + 'static> StateStore for DynamoStateStore<T> {
    async fn load_keys(
        &self,
        namespace: &Namespace,
        keys: &[LoadKey<'_>],
    ) -> Result<HashMap<String, KeyState>, StoreError> {
        let now_secs = self.now_secs();
        let head_keys: Vec<ItemKey> = keys
            .iter()
            .map(|k| Self::head_key(namespace, k.key))
            .collect();
        let heads = self.get_all(&head_keys).await?;

        let mut states = HashMap::with_capacity(keys.len());
        let mut pending = Vec::new();
        for (request, head_key) in keys.iter().zip(head_keys) {
            let Some(item) = heads.get(&head_key) else {
                states.insert(request.key.to_owned(), KeyState::default());
                continue;
            };
            let (version, doc) = parse_head(item, &namespace.dictionaries)?;
            let expired = doc.exp.is_some_and(|t| t <= now_secs);
            // Watermark items are read only for lineages the head does not hold, once some moved.
            let lineages = if doc.wx {
                let mut wanted: Vec<Origin> = request
                    .lineages
                    .iter()
                    .filter(|l| !doc.wm.contains_key(**l))
                    .map(|l| (*l).clone())
                    .collect();
                wanted.sort();
                wanted.dedup();
                wanted
            } else {
                Vec::new()
            };
            pending.push(Pending {
                key: request.key.to_owned(),
                pk: head_key.pk,
                version,
                doc,
                expired,
                lineages,
                pending: pending_of(item),
            });
        }
        // Second wave: segments of keys that outgrew their head, watermark items of many lineages.
        let wanted: Vec<ItemKey> = pending.iter().flat_map(Pending::wanted).collect();
        let items = if wanted.is_empty() {
            HashMap::new()
        } else {
            self.get_all(&wanted).await?
        };
        for p in pending {
            let key = p.key.clone();
            states.insert(key, p.finish(&items)?);
        }
        Ok(states)
    }

    async fn commit(
        &self,
        namespace: &Namespace,
        commits: Vec<Commit>,
    ) -> Vec<Result<Committed, StoreError>> {
        self.commit_all(namespace, commits).await
    }

    async fn clear_outbox(
        &self,
        namespace: &Namespace,
        committed: Vec<Committed>,
    ) -> Vec<Result<(), StoreError>> {
        self.clear_outboxes(namespace, committed).await
    }

    fn timers(&self) -> &dyn TimerIndex {
        self
    }

    async fn list_keys(
        &self,
        namespace: &Namespace,
        prefix: &str,
        cursor: Option<&str>,
    ) -> Result<KeyPage, StoreError> {
        let start: Option<ItemKey> = cursor
            .map(|text| {
                serde_json::from_str::<(String, String)>(text)
                    .map(|(pk, sk)| ItemKey { pk, sk })
                    .map_err(|e| StoreError::Invalid(format!("not a cursor of list_keys: {e}")))
            })
            .transpose()?;
        // The whole namespace, keys stored under their hash included: a scan reads every item
        // of the table whatever it keeps, so filtering on the key's prefix saves nothing more.
        let space = partition_key(namespace, "");
        let page = self
            .table
            .scan_page(&space, HEAD_SK, start.as_ref(), SCAN_PAGE)
            .await?;
        let now_secs = self.now_secs();
        let mut keys = Vec::new();
        for item in &page.items {
            let pk = item.get(super::PK).and_then(AttrValue::as_s).unwrap_or("");
            let (_, doc) = parse_head(item, &namespace.dictionaries)?;
            // A key whose slots are gone (a deleted row keeps its watermarks) has no state.
            if doc.slots.is_empty() || doc.exp.is_some_and(|t| t <= now_secs) {
                continue;
            }
            let key = doc.key.unwrap_or_else(|| pk[space.len()..].to_owned());
            if key.starts_with(prefix) {
                keys.push(key);
            }
        }
        let next = page
            .next
            .map(|k| serde_json::to_string(&(k.pk, k.sk)).expect("a pair of strings"));
        Ok(KeyPage { keys, next })
    }

    fn limits(&self) -> StoreLimits {
        StoreLimits {
            max_entry_bytes: ENTRY_MAX_BYTES,
            lineages_per_commit: LINEAGES_PER_COMMIT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_keys_are_stored_under_their_hash() {
        let ns = Namespace::new("op", "abc");
        let short = partition_key(&ns, "customer#AKIA1");
        assert_eq!(short, "op#abc#customer#AKIA1");
        let long = partition_key(&ns, &"k".repeat(5000));
        assert!(long.starts_with("op#abc#~") && long.len() < 100, "{long}");
        let longest = "k".repeat(KEY_HASHED_PAST_BYTES);
        assert_eq!(partition_key(&ns, &longest), format!("op#abc#{longest}"));
    }

    type MemoryStore = DynamoStateStore<crate::adapters::dynamodb::MemoryTable>;

    /// A namespace, and a store on an in-memory table.
    fn store_on_a_table() -> (
        Namespace,
        Arc<crate::adapters::dynamodb::MemoryTable>,
        MemoryStore,
    ) {
        let ns = Namespace::new("op", "abc");
        let table = Arc::new(crate::adapters::dynamodb::MemoryTable::new());
        let store = DynamoStateStore::new(table.clone(), crate::ports::ManualClock::at(0));
        (ns, table, store)
    }

    #[tokio::test]
    async fn notes_of_what_went_out_read_back_until_the_keys_ttl_passes() {
        use crate::domain::{Origin, SentNotes, SentSoFar, SequenceNumber};
        let (ns, _, store) = store_on_a_table();
        let sequence = SequenceNumber::parse("7").unwrap();
        let record = SentSoFar::of(Origin("s/shardId-0".into()), sequence, 10, [4]).unwrap();
        let notes = SentNotes {
            version: 1,
            build: 9,
            chain: (1, 3),
            records: vec![record],
        };
        // The store's clock reads 0 s: a key expiring at 0 has expired.
        for (key, expires_at, kept) in [("live", None, true), ("expired", Some(0), false)] {
            let state = KeyState {
                sent_so_far: Some(notes.clone()),
                expires_at,
                ..KeyState::default()
            };
            let results = store.commit(&ns, vec![Commit::new(key, 0, state)]).await;
            assert!(results[0].is_ok(), "{results:?}");
            let loaded = store.load(&ns, &[key.to_owned()]).await.unwrap();
            let read = loaded[key].sent_so_far.clone();
            assert_eq!(
                read.is_some(),
                kept,
                "{key}: the record would run on empty state"
            );
            if kept {
                assert_eq!(read, Some(notes.clone()));
            }
        }
    }

    #[tokio::test]
    async fn only_a_head_stored_under_its_keys_hash_spells_out_the_key() {
        let (ns, table, store) = store_on_a_table();
        let mut state = KeyState::default();
        state.slots.insert(
            "n".into(),
            SlotData::fresh(vec![RawValue::from_string("1".into()).unwrap()]),
        );
        for (len, spelled) in [
            (KEY_HASHED_PAST_BYTES, false),
            (KEY_HASHED_PAST_BYTES + 1, true),
        ] {
            let key = "k".repeat(len);
            let results = store
                .commit(&ns, vec![Commit::new(key.clone(), 0, state.clone())])
                .await;
            assert!(results[0].is_ok(), "{results:?}");
            let head = table
                .get(
                    &DynamoStateStore::<crate::adapters::dynamodb::MemoryTable>::head_key(
                        &ns, &key,
                    ),
                )
                .await
                .unwrap()
                .unwrap();
            let (_, doc) = parse_head(&head, &[]).unwrap();
            assert_eq!(doc.key.is_some(), spelled, "a key of {len} bytes");
        }
    }

    #[tokio::test]
    async fn a_state_of_records_above_a_kb_is_written_deflated_for_a_fraction_of_its_units() {
        let (ns, table, store) = store_on_a_table();
        // 200 records of one shape, about 13 KB of JSON: 14 write units as text.
        let records: Vec<Box<RawValue>> = (0..200)
            .map(|i| {
                let record = format!(
                    r#"{{"eventName":"AssumeRole","eventSource":"sts.amazonaws.com","n":{i}}}"#
                );
                RawValue::from_string(record).unwrap()
            })
            .collect();
        let text_bytes: usize = records.iter().map(|r| r.get().len()).sum();
        assert!(text_bytes > 12 * 1024, "{text_bytes}");
        let mut state = KeyState::default();
        state
            .slots
            .insert("buffer".into(), SlotData::fresh(records.clone()));
        let results = store.commit(&ns, vec![Commit::new("k", 0, state)]).await;
        assert!(results[0].is_ok(), "{results:?}");
        let units = table.usage().write_units;
        assert!(
            units <= 4.0,
            "{units} write units for {text_bytes} bytes of records"
        );
        let head_key =
            DynamoStateStore::<crate::adapters::dynamodb::MemoryTable>::head_key(&ns, "k");
        let head = table.get(&head_key).await.unwrap().unwrap();
        assert!(
            matches!(head.get("docz"), Some(AttrValue::B(_))),
            "deflated"
        );
        let loaded = store.load(&ns, &["k".to_owned()]).await.unwrap();
        let entries = &loaded["k"].slots["buffer"].entries;
        let read: Vec<&str> = entries.iter().map(|e| e.get()).collect();
        let written: Vec<&str> = records.iter().map(|e| e.get()).collect();
        assert_eq!(read, written, "the records read back as written");
    }
}
