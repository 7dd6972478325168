//! The stored form of one key's state, as the state store loads and commits it.
//!
//! A key holds named slots (value, list or map state), each a sequence of JSON entries: a value has
//! at most one, a list one per element, a map one `[key, value]` pair per entry. A slot remembers
//! how many of its leading entries are still the ones loaded, so a store can keep them where they
//! are (a list that only grows is never rewritten). Where the store keeps entries is its own
//! business: it leaves a memo in the state it loads and reads it back at commit.
//!
//! Beside the slots, a key holds its watermarks (the last sequence number applied per lineage) and
//! its outbox (outputs committed with the state and not yet confirmed sent). Both outlive the
//! slots' TTL: an expired key starts with empty slots but still skips what it applied and still
//! sends what it owes. It may also hold notes of which outputs of its records not yet applied went
//! out (`SentNotes`), good only on the state they were noted on.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::output::Output;
use super::record::{Origin, SequenceNumber};

/// Which kind of state a slot is; part of the slot's identity, so a value of a list is never read
/// as a list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateKind {
    /// A single value: at most one entry.
    Value,
    /// A list: one entry per element.
    List,
    /// A map: one `[key, value]` pair per entry.
    Map,
    /// One value per operator, not per key (`operator::BroadcastState`), stored as the value
    /// of the operator's broadcast key.
    Broadcast,
}

impl StateKind {
    /// The kind's lowercase name, as it is stored.
    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Value => "value",
            StateKind::List => "list",
            StateKind::Map => "map",
            StateKind::Broadcast => "broadcast",
        }
    }
}

/// One slot's entries.
#[derive(Clone, Debug, Default)]
pub struct SlotData {
    /// The slot's entries, each a JSON text, in order.
    pub entries: Vec<Box<RawValue>>,
    /// The first `kept` entries are the ones loaded, unchanged.
    pub kept: usize,
}

impl SlotData {
    /// A slot as loaded: every entry is kept.
    pub fn loaded(entries: Vec<Box<RawValue>>) -> Self {
        let kept = entries.len();
        Self { entries, kept }
    }

    /// New entries that were never stored.
    pub fn fresh(entries: Vec<Box<RawValue>>) -> Self {
        Self { entries, kept: 0 }
    }

    /// Applies `update`: keeps the first `update.keep` entries, then appends its tail.
    pub fn apply(&mut self, update: SlotUpdate) {
        self.entries.truncate(update.keep);
        self.entries.extend(update.tail);
        self.kept = self.kept.min(update.keep);
    }
}

/// A change to a slot: keep its first `keep` entries, then append `tail`.
#[derive(Clone, Debug, Default)]
pub struct SlotUpdate {
    /// How many of the slot's leading entries stay.
    pub keep: usize,
    /// The entries appended after them.
    pub tail: Vec<Box<RawValue>>,
}

/// The last sequence number a key applied from one lineage, and when that record arrived.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    /// The last sequence number the key applied from the lineage.
    #[serde(rename = "s")]
    pub sequence: SequenceNumber,
    /// Arrival time (epoch milliseconds) of that record: it says how long a redelivery of it, or
    /// of anything before it, can still come, and tells a recreated stream from a redelivery.
    #[serde(rename = "t")]
    pub at_millis: i64,
}

/// A record at or below a watermark whose arrival is later than the watermark's record by more
/// than this cannot be a redelivery: within a lineage, sequence numbers and arrival times grow
/// together. It comes from a stream deleted and created again under the same name, whose sequence
/// numbers started over. (Deleting and creating a stream takes far longer than this.)
pub const RECREATED_AFTER_MILLIS: i64 = 5_000;

/// The watermarks of one key, by lineage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Watermarks {
    entries: BTreeMap<Origin, Watermark>,
}

impl Watermarks {
    /// The watermark of `lineage`, if the key applied any of its records.
    pub fn get(&self, lineage: &Origin) -> Option<&Watermark> {
        self.entries.get(lineage)
    }

    /// How many lineages have a watermark.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no lineage has a watermark.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Each lineage with its watermark, in lineage order.
    pub fn iter(&self) -> impl Iterator<Item = (&Origin, &Watermark)> {
        self.entries.iter()
    }

    /// Sets a lineage's watermark as stored (no comparison).
    pub fn insert(&mut self, lineage: Origin, watermark: Watermark) {
        self.entries.insert(lineage, watermark);
    }

    /// Keeps the higher of the two where both know a lineage.
    pub fn merge(&mut self, lineage: Origin, watermark: Watermark) {
        match self.entries.get(&lineage) {
            Some(w) if w.sequence >= watermark.sequence => {}
            _ => {
                self.entries.insert(lineage, watermark);
            }
        }
    }

    /// True when the record at `sequence` of `lineage`, which arrived at `arrival_millis`, was
    /// already applied to this key.
    pub fn has_applied(
        &self,
        lineage: &Origin,
        sequence: &SequenceNumber,
        arrival_millis: Option<i64>,
    ) -> bool {
        self.entries
            .get(lineage)
            .is_some_and(|w| *sequence <= w.sequence && !recreated(w, arrival_millis))
    }

    /// Records `sequence` of `lineage` as applied. A watermark never moves back, unless the record
    /// comes from a recreated stream, whose sequence numbers start over.
    pub fn advance(&mut self, lineage: &Origin, sequence: &SequenceNumber, at_millis: i64) {
        match self.entries.get_mut(lineage) {
            Some(w) if *sequence >= w.sequence || recreated(w, Some(at_millis)) => {
                w.sequence = sequence.clone();
                w.at_millis = at_millis;
            }
            Some(_) => {}
            None => {
                self.entries.insert(
                    lineage.clone(),
                    Watermark {
                        sequence: sequence.clone(),
                        at_millis,
                    },
                );
            }
        }
    }

    /// Forgets lineages whose last applied record arrived more than `retention_millis` before
    /// `now_millis`: no stream redelivers a record older than its retention (or the mapping's
    /// maximum record age), so their watermarks guard nothing.
    pub fn prune(&mut self, now_millis: i64, retention_millis: i64) {
        self.entries
            .retain(|_, w| now_millis - w.at_millis <= retention_millis);
    }

    /// The latest arrival among the watermarks: until that plus the retention, a redelivery can
    /// still come.
    pub fn latest_arrival(&self) -> Option<i64> {
        self.entries.values().map(|w| w.at_millis).max()
    }
}

fn recreated(watermark: &Watermark, arrival_millis: Option<i64>) -> bool {
    arrival_millis.is_some_and(|a| a > watermark.at_millis.saturating_add(RECREATED_AFTER_MILLIS))
}

/// What went out of the outputs of a key's records not yet applied, noted with the key so that
/// their retry sends only the rest: a record whose outputs take more than one invocation to send
/// (a join key's thousands of joined rows on a busy shard) then gets through a part at each retry
/// instead of being sent again whole at every one. Outputs are named by their place among their
/// record's outputs, which a retry computes again in the same order only if it runs the same
/// records, on the same state, with the same code: the notes hold only at the key's version their
/// commit wrote (any other commit of the key, whoever makes it and whatever it carries over,
/// retires them), under the build that wrote them, and while the retry runs the same records
/// before each noted one to the same outcomes (a record dropped, aged out or discarded, or one
/// added by a changed trigger, changes what the later ones compute).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentNotes {
    /// The key's version the notes were committed at.
    #[serde(rename = "v")]
    pub version: u64,
    /// The fingerprint of the code and configuration that computed the outputs.
    #[serde(rename = "b")]
    pub build: u64,
    /// The key's records from its first left unapplied to the last noted, when the notes were
    /// made: how many, and a hash of each one's lineage, sequence number and outcome. The notes
    /// hold for a run that starts with the same records, run to the same outcomes: the state each
    /// noted record ran on.
    #[serde(rename = "c")]
    pub chain: (u32, u64),
    /// Each record's outputs that went out.
    #[serde(rename = "n")]
    pub records: Vec<SentSoFar>,
}

impl SentNotes {
    /// Whether `stored`, which holds at `version` (the key's, as loaded), notes the same as these
    /// notes, made to hold at the next.
    pub fn same_as(&self, stored: Option<&SentNotes>, version: u64) -> bool {
        stored.is_some_and(|stored| {
            stored.version == version
                && self.version == version + 1
                && stored.build == self.build
                && stored.chain == self.chain
                && stored.records == self.records
        })
    }

    /// The note of the record at `sequence` of `lineage`, if it has one.
    pub fn of_record(&self, lineage: &Origin, sequence: &SequenceNumber) -> Option<&SentSoFar> {
        self.records.iter().find(|r| r.is_for(lineage, sequence))
    }
}

/// The outputs of one record not yet applied that went out (see `SentNotes`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentSoFar {
    /// The record's lineage.
    #[serde(rename = "l")]
    pub lineage: Origin,
    /// The record's sequence number.
    #[serde(rename = "s")]
    pub sequence: SequenceNumber,
    /// The places sent, as ranges `[start, end)` in increasing order.
    #[serde(rename = "r")]
    pub ranges: Vec<(u32, u32)>,
}

impl SentSoFar {
    /// The most ranges a key keeps, over all its records: a record whose sent places break into
    /// more (failures scattered over thousands of outputs) keeps its first ones, and the retry
    /// sends the rest again, under the same ids.
    pub const MAX_RANGES: usize = 1_000;

    /// The most records a key keeps notes of: with `MAX_RANGES`, some 45 KB of the key's head
    /// item at most (a DynamoDB stream's lineage names its table).
    pub const MAX_RECORDS: usize = 100;

    /// The places of `count` outputs that went out, all but `unsent`; `None` when none did.
    pub fn of(
        lineage: Origin,
        sequence: SequenceNumber,
        count: u32,
        unsent: impl IntoIterator<Item = u32>,
    ) -> Option<Self> {
        let mut unsent: Vec<u32> = unsent.into_iter().filter(|&p| p < count).collect();
        unsent.sort_unstable();
        unsent.dedup();
        let mut ranges = Vec::new();
        let mut start = 0;
        for end in unsent.into_iter().chain(std::iter::once(count)) {
            if start < end && ranges.len() < Self::MAX_RANGES {
                ranges.push((start, end));
            }
            start = end + 1;
        }
        (!ranges.is_empty()).then_some(Self {
            lineage,
            sequence,
            ranges,
        })
    }

    /// Whether the output at `place` went out.
    pub fn contains(&self, place: u32) -> bool {
        let after = self.ranges.partition_point(|&(start, _)| start <= place);
        after > 0 && place < self.ranges[after - 1].1
    }

    /// Whether this is the record at `sequence` of `lineage`.
    pub fn is_for(&self, lineage: &Origin, sequence: &SequenceNumber) -> bool {
        self.lineage == *lineage && self.sequence == *sequence
    }
}

/// What a store remembers of a key it loaded (where its entries live, what its stored item held),
/// carried through the executor untouched and read back at commit. Only the store that made it
/// knows its type.
#[derive(Clone, Default)]
pub struct StoreMemo(Option<Arc<dyn Any + Send + Sync>>);

impl StoreMemo {
    /// A memo holding `memo`.
    pub fn new<T: Any + Send + Sync>(memo: T) -> Self {
        Self(Some(Arc::new(memo)))
    }

    /// The memo as a `T`, if it holds one.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.as_ref().and_then(|m| m.downcast_ref())
    }
}

impl std::fmt::Debug for StoreMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "StoreMemo(..)"
        } else {
            "StoreMemo(none)"
        })
    }
}

/// A key's state under an older signature that a migration carried over: its signature and the
/// version it was read at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retiring {
    /// The older signature.
    pub signature: String,
    /// The version the migration read.
    pub version: u64,
}

/// Everything stored for one key of one operator.
#[derive(Clone, Debug, Default)]
pub struct KeyState {
    /// 0 when nothing is stored; every commit increments it and is conditional on the value read.
    pub version: u64,
    /// The last sequence number applied per lineage; outlives the slots' TTL.
    pub watermarks: Watermarks,
    /// Each slot's entries, by slot name.
    pub slots: BTreeMap<String, SlotData>,
    /// Outputs committed with the state and not yet confirmed sent (outbox delivery).
    pub outbox: Vec<Output>,
    /// Epoch seconds after which the slots count as absent. Watermarks and outbox stay.
    pub expires_at: Option<i64>,
    /// What went out already of the outputs of the key's records not yet applied.
    pub sent_so_far: Option<SentNotes>,
    /// The state under an older signature this one was carried over from (a migration), until
    /// that state is known to be retired: kept with the key so that a later commit retires it
    /// should the first attempt not land.
    pub retiring: Option<Retiring>,
    /// The store's own notes on the key as loaded.
    pub memo: StoreMemo,
}

impl KeyState {
    /// True when the slots' TTL has passed at `now_secs`.
    pub fn is_expired(&self, now_secs: i64) -> bool {
        self.expires_at.is_some_and(|t| t <= now_secs)
    }

    /// Drops every slot but keeps the version, the watermarks and the outbox: what an expired or
    /// reset key keeps. The outbox holds outputs already promised: no TTL may lose them.
    pub fn clear_slots(&mut self) {
        self.slots.clear();
        self.expires_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: u64) -> SequenceNumber {
        SequenceNumber::parse(&n.to_string()).unwrap()
    }

    #[test]
    fn a_record_at_or_below_the_watermark_counts_as_applied() {
        let lineage = Origin("s/shardId-0/pk".into());
        let mut marks = Watermarks::default();
        assert!(!marks.has_applied(&lineage, &seq(5), Some(0)));
        marks.advance(&lineage, &seq(5), 0);
        assert!(marks.has_applied(&lineage, &seq(5), Some(0)));
        assert!(marks.has_applied(&lineage, &seq(4), None));
        assert!(!marks.has_applied(&lineage, &seq(6), Some(0)));
        assert!(!marks.has_applied(&Origin("s/shardId-1/pk".into()), &seq(1), Some(0)));
    }

    #[test]
    fn a_watermark_never_moves_backwards() {
        let lineage = Origin("s/shardId-0".into());
        let mut marks = Watermarks::default();
        marks.advance(&lineage, &seq(9), 1_000);
        marks.advance(&lineage, &seq(3), 1_000);
        assert_eq!(marks.get(&lineage).unwrap().sequence, seq(9));
        marks.merge(
            lineage.clone(),
            Watermark {
                sequence: seq(4),
                at_millis: 0,
            },
        );
        assert_eq!(marks.get(&lineage).unwrap().sequence, seq(9));
    }

    #[test]
    fn a_lower_sequence_number_that_arrived_well_after_the_watermark_comes_from_a_recreated_stream()
    {
        let lineage = Origin("s/shardId-0".into());
        let mut marks = Watermarks::default();
        marks.advance(&lineage, &seq(900), 10_000);
        // A redelivery carries its first arrival time, at or before the watermark's.
        assert!(marks.has_applied(&lineage, &seq(500), Some(9_000)));
        assert!(marks.has_applied(&lineage, &seq(500), Some(10_000 + RECREATED_AFTER_MILLIS)));
        // The same stream name created again: numbers start low, arrivals are later.
        let later = 10_000 + RECREATED_AFTER_MILLIS + 1;
        assert!(!marks.has_applied(&lineage, &seq(5), Some(later)));
        marks.advance(&lineage, &seq(5), later);
        assert_eq!(marks.get(&lineage).unwrap().sequence, seq(5));
        assert!(marks.has_applied(&lineage, &seq(5), Some(later)));
    }

    #[test]
    fn watermarks_older_than_the_retention_are_pruned() {
        let mut marks = Watermarks::default();
        marks.advance(&Origin("old".into()), &seq(1), 1_000);
        marks.advance(&Origin("new".into()), &seq(1), 90_000);
        marks.prune(100_000, 50_000);
        assert_eq!(
            marks.iter().map(|(o, _)| o.as_str()).collect::<Vec<_>>(),
            ["new"]
        );
        assert_eq!(marks.latest_arrival(), Some(90_000));
    }

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn an_update_keeps_count_of_the_entries_still_as_loaded() {
        let mut slot = SlotData::loaded(vec![raw("1"), raw("2"), raw("3")]);
        slot.apply(SlotUpdate {
            keep: 3,
            tail: vec![raw("4")],
        });
        assert_eq!(slot.kept, 3);
        slot.apply(SlotUpdate {
            keep: 1,
            tail: vec![raw("9")],
        });
        assert_eq!(slot.kept, 1);
        assert_eq!(
            slot.entries.iter().map(|r| r.get()).collect::<Vec<_>>(),
            ["1", "9"]
        );
    }

    #[test]
    fn the_outputs_sent_of_a_record_are_the_ranges_between_those_that_were_not() {
        let sent = |count, unsent: &[u32]| {
            SentSoFar::of(Origin("o".into()), seq(3), count, unsent.iter().copied())
        };
        assert_eq!(sent(5, &[]).unwrap().ranges, [(0, 5)]);
        assert_eq!(
            sent(10, &[7, 2, 3, 9]).unwrap().ranges,
            [(0, 2), (4, 7), (8, 9)]
        );
        assert_eq!(sent(3, &[0, 1, 2]), None, "nothing went out");
        assert_eq!(sent(0, &[]), None);
        let marks = sent(10, &[2, 3, 7]).unwrap();
        let places: Vec<u32> = (0..11).filter(|&p| marks.contains(p)).collect();
        assert_eq!(places, [0, 1, 4, 5, 6, 8, 9]);
        assert!(marks.is_for(&Origin("o".into()), &seq(3)));
        assert!(!marks.is_for(&Origin("o".into()), &seq(4)));
        assert!(!marks.is_for(&Origin("p".into()), &seq(3)));
    }

    #[test]
    fn outputs_sent_in_more_ranges_than_kept_keep_the_first_ones_and_claim_no_more() {
        let every_other: Vec<u32> = (0..5_000).map(|p| 2 * p + 1).collect();
        let marks = SentSoFar::of(Origin("o".into()), seq(1), 10_000, every_other).unwrap();
        assert_eq!(marks.ranges.len(), SentSoFar::MAX_RANGES);
        let claimed = (0..10_000).filter(|&p| marks.contains(p)).count();
        assert_eq!(claimed, SentSoFar::MAX_RANGES);
        assert!(!marks.contains(2 * SentSoFar::MAX_RANGES as u32));
    }

    #[test]
    fn clearing_slots_keeps_version_watermarks_and_outbox() {
        let mut state = KeyState {
            version: 7,
            ..Default::default()
        };
        state.watermarks.advance(&Origin("o".into()), &seq(1), 0);
        state
            .slots
            .insert("buffer".into(), SlotData::loaded(vec![raw("1")]));
        state.outbox.push(Output {
            id: crate::domain::OutputId("x".into()),
            sink: "s".into(),
            partition_key: "k".into(),
            body: "{}".into(),
            settled: false,
        });
        state.clear_slots();
        assert!(state.slots.is_empty());
        assert_eq!(state.version, 7);
        assert_eq!(state.watermarks.len(), 1);
        assert_eq!(state.outbox.len(), 1);
    }
}
