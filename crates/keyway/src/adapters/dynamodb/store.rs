//! The state store on one DynamoDB table (single-table design).
//!
//! # Key schema
//!
//! | item    | pk                              | sk                      | attributes                  |
//! |---------|---------------------------------|-------------------------|-----------------------------|
//! | head    | `{operator}#{signature}#{key}`  | `head`                  | `v` (N), `doc` (S), `ttl` (N)|
//! | segment | same as its head                | `seg#{slot}#{id:016x}`  | `e` (S), `ttl` (N)          |
//!
//! Why this shape:
//! - One table for every operator: one IAM resource, one TTL setting, and a batch of keys of any
//!   operator loads with one BatchGetItem (100 keys a call).
//! - Operator name and state signature lead the partition key, so state written under another
//!   structure is never read under this one, and ages out by TTL.
//! - The head holds everything small about a key — version, watermarks per origin, slots' inline
//!   entries, the outbox — so the common batch costs one read and one conditional write per key.
//!   It is JSON text (`doc`): cheap to write, readable in the console.
//! - Entries that do not fit the head (above `HEAD_INLINE_LIMIT`) move to immutable segment items
//!   under the same partition key. Segments are written before the head that references them and
//!   never changed, so the conditional write of the head alone commits the whole state, of any
//!   size, atomically; TransactWriteItems (100 items, 4 MB, double cost) is never needed.
//! - Segment ids are random: two writers racing on one key never overwrite each other's segments.
//!   Segments a head stops referencing are listed in its `gc` and deleted by the next commit.
//! - `ttl` is the table's TTL attribute; since DynamoDB deletes expired items only eventually,
//!   `load` also treats a head past its `ttl` as absent.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::join_all;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{
    Expect, ItemKey, Table, WriteRequest, BATCH_GET_MAX, BATCH_WRITE_MAX, ITEM_MAX_BYTES, TTL,
    VERSION,
};
use crate::adapters::retry::Backoff;
use crate::domain::hash::sha256_hex;
use crate::domain::item::item_size;
use crate::domain::{AttrValue, Item, KeyState, Origin, Output, Segment, SlotData, Watermark};
use crate::ports::{Clock, Commit, Namespace, StateStore, StoreError};

/// Inline entries beyond this many bytes move to segments: a head rewritten on every commit costs
/// one write unit per KB, so it stays small.
pub const HEAD_INLINE_LIMIT: usize = 32 * 1024;
/// Segments are filled up to this size, well under the 400 KB item limit.
pub const SEGMENT_TARGET: usize = 256 * 1024;
/// Keys longer than this are stored under their hash (DynamoDB allows 2048 bytes of partition key).
const KEY_MAX_BYTES: usize = 1024;
const HEAD_SK: &str = "head";
const DOC: &str = "doc";
const ENTRIES: &str = "e";

/// The head's `doc` attribute, as read.
#[derive(Default, Deserialize)]
struct HeadDoc {
    #[serde(default)]
    wm: BTreeMap<Origin, Watermark>,
    #[serde(default)]
    slots: BTreeMap<String, SlotDoc>,
    #[serde(default)]
    ob: Vec<Output>,
    #[serde(default)]
    gc: Vec<(String, u64)>,
}

#[derive(Default, Deserialize)]
struct SlotDoc {
    #[serde(default)]
    seg: Vec<Segment>,
    /// Inline entries: those after the segments'.
    #[serde(default)]
    e: Vec<Box<RawValue>>,
}

/// The head's `doc` attribute, as written: the same fields, borrowed from the state.
#[derive(Serialize)]
struct HeadDocRef<'a> {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    wm: &'a BTreeMap<Origin, Watermark>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    slots: BTreeMap<&'a str, SlotDocRef<'a>>,
    #[serde(skip_serializing_if = "<[Output]>::is_empty")]
    ob: &'a [Output],
    #[serde(skip_serializing_if = "Vec::is_empty")]
    gc: Vec<&'a (String, u64)>,
    /// The key itself when the partition key holds its hash, for people reading the table.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
}

#[derive(Serialize)]
struct SlotDocRef<'a> {
    #[serde(skip_serializing_if = "<[Segment]>::is_empty")]
    seg: &'a [Segment],
    e: &'a [Box<RawValue>],
}

/// `StateStore` on any `Table`: the SDK's for AWS, the in-memory one for tests and local runs.
pub struct DynamoStateStore<T: Table> {
    table: Arc<T>,
    clock: Arc<dyn Clock>,
    backoff: Backoff,
}

impl<T: Table> DynamoStateStore<T> {
    pub fn new(table: Arc<T>, clock: Arc<dyn Clock>) -> Self {
        Self {
            table,
            clock,
            backoff: Backoff::default(),
        }
    }

    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

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

    /// Reads every key, 100 a call, all calls at once; keys DynamoDB leaves unprocessed (or whose
    /// call was throttled) are read again after a backoff.
    async fn get_all(&self, keys: &[ItemKey]) -> Result<HashMap<ItemKey, Item>, StoreError> {
        let mut found = HashMap::with_capacity(keys.len());
        let mut unprocessed: Vec<ItemKey> = Vec::new();
        let mut attempt = 0;
        loop {
            let pending: &[ItemKey] = if attempt == 0 { keys } else { &unprocessed };
            if pending.is_empty() {
                break;
            }
            let calls = pending
                .chunks(BATCH_GET_MAX)
                .map(|chunk| async move { (chunk, self.table.batch_get(chunk).await) });
            let mut retry = Vec::new();
            let mut last_error = None;
            for (chunk, result) in join_all(calls).await {
                match result {
                    Ok(output) => {
                        for item in output.items {
                            if let Some(key) = ItemKey::of(&item) {
                                found.insert(key, item);
                            }
                        }
                        retry.extend(output.unprocessed);
                    }
                    Err(err) if err.is_retryable() => {
                        retry.extend_from_slice(chunk);
                        last_error = Some(err);
                    }
                    Err(err) => return Err(err),
                }
            }
            attempt += 1;
            if !retry.is_empty() && attempt >= self.backoff.max_attempts {
                return Err(last_error.unwrap_or_else(|| {
                    StoreError::Throttled(format!(
                        "{} keys still unprocessed after {attempt} attempts",
                        retry.len()
                    ))
                }));
            }
            if !retry.is_empty() {
                self.backoff.wait(attempt - 1).await;
            }
            unprocessed = retry;
        }
        Ok(found)
    }

    /// Writes every request, 25 a call, all calls at once, retrying unprocessed ones. Returns the
    /// requests that could still not be written.
    async fn write_all(
        &self,
        requests: Vec<WriteRequest>,
    ) -> (Vec<WriteRequest>, Option<StoreError>) {
        let mut pending = requests;
        let mut attempt = 0;
        let mut last_error = None;
        while !pending.is_empty() {
            let calls = pending
                .chunks(BATCH_WRITE_MAX)
                .map(|chunk| async move { (chunk, self.table.batch_write(chunk.to_vec()).await) });
            let mut retry = Vec::new();
            for (chunk, result) in join_all(calls).await {
                match result {
                    Ok(unprocessed) => retry.extend(unprocessed),
                    Err(err) if err.is_retryable() => {
                        retry.extend_from_slice(chunk);
                        last_error = Some(err);
                    }
                    Err(err) => {
                        retry.extend_from_slice(chunk);
                        return (retry, Some(err));
                    }
                }
            }
            attempt += 1;
            if !retry.is_empty() && attempt >= self.backoff.max_attempts {
                let err = last_error.unwrap_or_else(|| {
                    StoreError::Throttled(format!(
                        "{} writes still unprocessed after {attempt} attempts",
                        retry.len()
                    ))
                });
                return (retry, Some(err));
            }
            if !retry.is_empty() {
                self.backoff.wait(attempt - 1).await;
            }
            pending = retry;
        }
        (Vec::new(), None)
    }

    /// A conditional head put, retried while the error is retryable.
    async fn put_head(&self, item: Item, expect: Expect) -> Result<(), StoreError> {
        let mut attempt = 0;
        loop {
            match self.table.put(item.clone(), expect).await {
                Err(err) if err.is_retryable() && attempt + 1 < self.backoff.max_attempts => {
                    self.backoff.wait(attempt).await;
                    attempt += 1;
                }
                result => return result,
            }
        }
    }
}

fn partition_key(namespace: &Namespace, key: &str) -> String {
    // Built by hand: this runs for every key of every batch, and `format!` costs more than the rest.
    let hashed;
    let key = if key.len() > KEY_MAX_BYTES {
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

fn segment_key(pk: &str, slot: &str, id: u64) -> ItemKey {
    ItemKey {
        pk: pk.to_owned(),
        sk: format!("seg#{slot}#{id:016x}"),
    }
}

fn number(item: &Item, name: &str) -> Result<Option<i64>, StoreError> {
    item.get(name)
        .map(|v| {
            v.as_n().and_then(|n| n.parse::<i64>().ok()).ok_or_else(|| {
                StoreError::Invalid(format!("attribute {name} is not an integer: {v:?}"))
            })
        })
        .transpose()
}

fn segment_covers(segment: Option<i64>, head: Option<i64>) -> bool {
    match (segment, head) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(s), Some(h)) => s >= h,
    }
}

/// A commit made ready: its segment writes, then its head.
struct Prepared {
    pk: String,
    state: KeyState,
    expected_version: u64,
    original_key: Option<String>,
    /// New or refreshed segments.
    segment_puts: Vec<Item>,
    written_segments: Vec<ItemKey>,
}

impl<T: Table> DynamoStateStore<T> {
    /// Moves inline entries to segments until the head fits, and rewrites segments whose TTL would
    /// end before the head's.
    fn prepare(
        &self,
        namespace: &Namespace,
        commit: Commit,
        now_secs: i64,
    ) -> Result<Prepared, StoreError> {
        let pk = partition_key(namespace, &commit.key);
        let mut state = commit.state;
        // Segments outlive their head by one TTL period (see `Segment::expires_at`).
        let segment_ttl = state.expires_at.map(|h| h + (h - now_secs).max(0));
        let mut segment_puts = Vec::new();
        let mut written_segments = Vec::new();

        let make_segment = |slot: &str,
                            entries: &[Box<RawValue>],
                            puts: &mut Vec<Item>,
                            written: &mut Vec<ItemKey>| {
            let id: u64 = rand::random();
            let key = segment_key(&pk, slot, id);
            let mut item = key.to_item();
            let text = format!(
                "[{}]",
                entries
                    .iter()
                    .map(|e| e.get())
                    .collect::<Vec<_>>()
                    .join(",")
            );
            item.insert(ENTRIES.to_owned(), AttrValue::S(text));
            if let Some(ttl) = segment_ttl {
                item.insert(TTL.to_owned(), AttrValue::N(ttl.to_string()));
            }
            if item_size(&item) > ITEM_MAX_BYTES {
                return Err(StoreError::Invalid(format!(
                    "a state entry of slot {slot:?} is larger than DynamoDB's 400 KB item limit"
                )));
            }
            puts.push(item);
            written.push(key);
            Ok(Segment {
                id,
                len: entries.len(),
                expires_at: segment_ttl,
            })
        };

        // Refresh segments whose TTL no longer covers the head's.
        for (name, slot) in &mut state.slots {
            let mut offset = 0;
            let mut refreshed = Vec::with_capacity(slot.segments.len());
            for segment in &slot.segments {
                let range = offset..offset + segment.len;
                offset += segment.len;
                if segment_covers(segment.expires_at, state.expires_at) {
                    refreshed.push(segment.clone());
                } else {
                    state.retired.push((name.clone(), segment.id));
                    refreshed.push(make_segment(
                        name,
                        &slot.entries[range],
                        &mut segment_puts,
                        &mut written_segments,
                    )?);
                }
            }
            slot.segments = refreshed;
        }

        // Spill the largest inline tail until the head fits.
        loop {
            let inline_size = |slot: &SlotData| {
                slot.inline_entries()
                    .iter()
                    .map(|e| e.get().len() + 1)
                    .sum::<usize>()
            };
            let total: usize = state.slots.values().map(inline_size).sum();
            if total <= HEAD_INLINE_LIMIT {
                break;
            }
            let (name, slot) = state
                .slots
                .iter_mut()
                .max_by_key(|(_, slot)| inline_size(slot))
                .expect("some slot has inline entries");
            let start = slot.sealed_len();
            let mut chunk_start = start;
            let mut chunk_bytes = 0;
            for i in start..slot.entries.len() {
                let size = slot.entries[i].get().len() + 1;
                if chunk_bytes > 0 && chunk_bytes + size > SEGMENT_TARGET {
                    let segment = make_segment(
                        name,
                        &slot.entries[chunk_start..i],
                        &mut segment_puts,
                        &mut written_segments,
                    )?;
                    slot.segments.push(segment);
                    chunk_start = i;
                    chunk_bytes = 0;
                }
                chunk_bytes += size;
            }
            let segment = make_segment(
                name,
                &slot.entries[chunk_start..],
                &mut segment_puts,
                &mut written_segments,
            )?;
            slot.segments.push(segment);
        }

        let original_key = (commit.key.len() > KEY_MAX_BYTES).then_some(commit.key);
        Ok(Prepared {
            pk,
            state,
            expected_version: commit.expected_version,
            original_key,
            segment_puts,
            written_segments,
        })
    }

    fn head_item(prepared: &Prepared, undeleted: &[(String, u64)]) -> Result<Item, StoreError> {
        let state = &prepared.state;
        let doc = HeadDocRef {
            wm: &state.watermarks,
            slots: state
                .slots
                .iter()
                .map(|(name, slot)| {
                    (
                        name.as_str(),
                        SlotDocRef {
                            seg: &slot.segments,
                            e: slot.inline_entries(),
                        },
                    )
                })
                .collect(),
            ob: &state.outbox,
            gc: state.retired.iter().chain(undeleted).collect(),
            key: prepared.original_key.as_deref(),
        };
        let mut item = ItemKey {
            pk: prepared.pk.clone(),
            sk: HEAD_SK.to_owned(),
        }
        .to_item();
        item.insert(
            VERSION.to_owned(),
            AttrValue::N((prepared.expected_version + 1).to_string()),
        );
        let text = serde_json::to_string(&doc).map_err(|e| StoreError::Invalid(e.to_string()))?;
        item.insert(DOC.to_owned(), AttrValue::S(text));
        if let Some(t) = state.expires_at {
            item.insert(TTL.to_owned(), AttrValue::N(t.to_string()));
        }
        if item_size(&item) > ITEM_MAX_BYTES {
            return Err(StoreError::Invalid(format!(
                "the head of key {:?} is {} bytes even with every entry in segments (outbox of {} outputs, {} watermarks)",
                prepared.pk,
                item_size(&item),
                state.outbox.len(),
                state.watermarks.len()
            )));
        }
        Ok(item)
    }
}

/// A head item parsed, with the segments it references still to read.
fn parse_head(item: &Item) -> Result<(KeyState, Vec<(String, Segment)>), StoreError> {
    let version = number(item, VERSION)?.unwrap_or(0) as u64;
    let doc_text = item.get(DOC).and_then(AttrValue::as_s).unwrap_or("{}");
    let doc: HeadDoc = serde_json::from_str(doc_text)
        .map_err(|e| StoreError::Invalid(format!("head doc does not parse: {e}")))?;
    let mut wanted = Vec::new();
    let mut slots = BTreeMap::new();
    for (name, slot) in doc.slots {
        for segment in &slot.seg {
            wanted.push((name.clone(), segment.clone()));
        }
        slots.insert(
            name,
            SlotData {
                segments: slot.seg,
                entries: slot.e,
            },
        );
    }
    let state = KeyState {
        version,
        watermarks: doc.wm,
        slots,
        outbox: doc.ob,
        expires_at: number(item, TTL)?,
        garbage: doc.gc,
        retired: Vec::new(),
    };
    Ok((state, wanted))
}

#[async_trait]
impl<T: Table + 'static> StateStore for DynamoStateStore<T> {
    async fn load(
        &self,
        namespace: &Namespace,
        keys: &[String],
    ) -> Result<HashMap<String, KeyState>, StoreError> {
        let now_secs = self.clock.now_millis().div_euclid(1000);
        let head_keys: Vec<ItemKey> = keys.iter().map(|k| Self::head_key(namespace, k)).collect();
        let heads = self.get_all(&head_keys).await?;

        let mut states = HashMap::with_capacity(keys.len());
        let mut segment_keys = Vec::new();
        for (key, head_key) in keys.iter().zip(&head_keys) {
            let Some(item) = heads.get(head_key) else {
                states.insert(key.clone(), KeyState::default());
                continue;
            };
            let (mut state, wanted) = parse_head(item)?;
            if state.is_expired(now_secs) {
                state.clear_contents();
            } else {
                segment_keys.extend(
                    wanted
                        .iter()
                        .map(|(slot, s)| segment_key(&head_key.pk, slot, s.id)),
                );
            }
            states.insert(key.clone(), state);
        }
        if segment_keys.is_empty() {
            return Ok(states);
        }

        // Second wave: the segments of keys whose state outgrew their head.
        let segments = self.get_all(&segment_keys).await?;
        for (key, head_key) in keys.iter().zip(&head_keys) {
            let state = states.get_mut(key).expect("every key has a state");
            for (name, slot) in &mut state.slots {
                if slot.segments.is_empty() {
                    continue;
                }
                let mut entries = Vec::with_capacity(slot.sealed_len() + slot.entries.len());
                for segment in &slot.segments {
                    let seg_key = segment_key(&head_key.pk, name, segment.id);
                    let item = segments.get(&seg_key).ok_or_else(|| {
                        StoreError::Invalid(format!(
                            "segment {} of {} is missing",
                            seg_key.sk, seg_key.pk
                        ))
                    })?;
                    let text = item.get(ENTRIES).and_then(AttrValue::as_s).unwrap_or("[]");
                    let mut part: Vec<Box<RawValue>> = serde_json::from_str(text).map_err(|e| {
                        StoreError::Invalid(format!("segment {} does not parse: {e}", seg_key.sk))
                    })?;
                    entries.append(&mut part);
                }
                entries.append(&mut slot.entries);
                slot.entries = entries;
            }
        }
        Ok(states)
    }

    async fn commit(
        &self,
        namespace: &Namespace,
        commits: Vec<Commit>,
    ) -> Vec<Result<(), StoreError>> {
        let now_secs = self.clock.now_millis().div_euclid(1000);
        let mut prepared: Vec<Result<Prepared, StoreError>> = commits
            .into_iter()
            .map(|c| self.prepare(namespace, c, now_secs))
            .collect();

        // Wave 1: new segments and garbage deletes of every key at once.
        let mut requests = Vec::new();
        let mut owner: HashMap<ItemKey, usize> = HashMap::new();
        for (i, p) in prepared.iter().enumerate() {
            let Ok(p) = p else { continue };
            for item in &p.segment_puts {
                owner.insert(ItemKey::of(item).expect("segment items have keys"), i);
                requests.push(WriteRequest::Put(item.clone()));
            }
            for (slot, id) in &p.state.garbage {
                let key = segment_key(&p.pk, slot, *id);
                owner.insert(key.clone(), i);
                requests.push(WriteRequest::Delete(key));
            }
        }
        let mut undeleted: Vec<Vec<(String, u64)>> = prepared.iter().map(|_| Vec::new()).collect();
        if !requests.is_empty() {
            let (left, error) = self.write_all(requests).await;
            for request in left {
                match request {
                    WriteRequest::Put(item) => {
                        let i = owner[&ItemKey::of(&item).expect("segment items have keys")];
                        let err = error
                            .clone()
                            .unwrap_or(StoreError::Unavailable("segment not written".into()));
                        prepared[i] = Err(err);
                    }
                    WriteRequest::Delete(key) => {
                        // Still garbage: the next commit tries again.
                        let i = owner[&key];
                        if let Ok(p) = &prepared[i] {
                            let (slot, id) = p
                                .state
                                .garbage
                                .iter()
                                .find(|(s, id)| segment_key(&p.pk, s, *id) == key)
                                .cloned()
                                .expect("a delete comes from the garbage list");
                            undeleted[i].push((slot, id));
                        }
                    }
                }
            }
        }

        // Wave 2: every head, conditional on the version read.
        let puts = prepared
            .iter()
            .zip(undeleted)
            .map(|(p, undeleted)| async move {
                let p = p.as_ref().map_err(Clone::clone)?;
                let item = Self::head_item(p, &undeleted)?;
                let expect = if p.expected_version == 0 {
                    Expect::Absent
                } else {
                    Expect::Version(p.expected_version)
                };
                self.put_head(item, expect).await
            });
        let results = join_all(puts).await;

        // A head that did not commit leaves its new segments unreferenced: remove them now.
        let orphans: Vec<WriteRequest> = prepared
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_err())
            .filter_map(|(p, _)| p.as_ref().ok())
            .flat_map(|p| p.written_segments.iter().cloned().map(WriteRequest::Delete))
            .collect();
        if !orphans.is_empty() {
            let _ = self.write_all(orphans).await;
        }
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_keys_are_stored_under_their_hash() {
        let ns = Namespace {
            operator: "op".into(),
            signature: "abc".into(),
        };
        let short = partition_key(&ns, "customer#AKIA1");
        assert_eq!(short, "op#abc#customer#AKIA1");
        let long = partition_key(&ns, &"k".repeat(5000));
        assert!(long.starts_with("op#abc#~") && long.len() < 100, "{long}");
    }

    #[test]
    fn a_segment_without_ttl_covers_any_head_and_one_with_ttl_only_an_earlier_head() {
        assert!(segment_covers(None, Some(10)));
        assert!(segment_covers(None, None));
        assert!(!segment_covers(Some(10), None));
        assert!(segment_covers(Some(10), Some(10)));
        assert!(!segment_covers(Some(9), Some(10)));
    }
}
