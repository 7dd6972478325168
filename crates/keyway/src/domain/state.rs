//! The stored form of one key's state, as the state store loads and commits it.
//!
//! A key holds named slots (value, list or map state). Each slot is a sequence of JSON entries: a
//! value has at most one, a list one per element, a map one `[key, value]` pair per entry. Entries
//! that no longer fit in the key's head item live in immutable segments, each its own item; a list
//! that only grows keeps its segments and only ever writes new ones, so appending to a list of
//! 10,000 large entries does not rewrite it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::output::Output;
use super::record::{Origin, SequenceNumber};

/// Which kind of state a slot is; part of the slot's identity, so a value of a list is never read
/// as a list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateKind {
    Value,
    List,
    Map,
}

impl StateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Value => "value",
            StateKind::List => "list",
            StateKind::Map => "map",
        }
    }
}

/// An immutable run of a slot's entries stored outside the head item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub id: u64,
    /// How many entries it holds.
    pub len: usize,
    /// Its own TTL (epoch seconds): segments outlive the head they belong to by one TTL period so
    /// that a head whose expiry moves forward never points at an expired segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
}

/// One slot's entries.
#[derive(Clone, Debug, Default)]
pub struct SlotData {
    /// Sealed segments, in order; they hold the first `sealed_len()` entries.
    pub segments: Vec<Segment>,
    /// All entries, segments' first.
    pub entries: Vec<Box<RawValue>>,
}

/// A change to a slot: keep its first `keep` entries, then append `tail`.
#[derive(Clone, Debug, Default)]
pub struct SlotUpdate {
    pub keep: usize,
    pub tail: Vec<Box<RawValue>>,
}

impl SlotData {
    /// Applies `update`. Segments survive only when every entry they hold is kept; otherwise the
    /// slot is stored afresh and its segment ids are returned as garbage.
    pub fn apply(&mut self, update: SlotUpdate) -> Vec<u64> {
        let mut dropped = Vec::new();
        if update.keep < self.sealed_len() {
            dropped = self.segments.drain(..).map(|s| s.id).collect();
        }
        self.entries.truncate(update.keep);
        self.entries.extend(update.tail);
        dropped
    }

    pub fn sealed_len(&self) -> usize {
        self.segments.iter().map(|s| s.len).sum()
    }

    /// Entries not in any segment: they are stored inline in the head item.
    pub fn inline_entries(&self) -> &[Box<RawValue>] {
        &self.entries[self.sealed_len().min(self.entries.len())..]
    }
}

/// The last sequence number a key applied from one origin, and when that record arrived.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    #[serde(rename = "s")]
    pub sequence: SequenceNumber,
    /// Arrival time (epoch milliseconds) of that record; lets old origins be pruned.
    #[serde(rename = "t")]
    pub at_millis: i64,
}

/// Everything stored for one key of one operator.
#[derive(Clone, Debug, Default)]
pub struct KeyState {
    /// 0 when nothing is stored; every commit increments it and is conditional on the value read.
    pub version: u64,
    pub watermarks: BTreeMap<Origin, Watermark>,
    pub slots: BTreeMap<String, SlotData>,
    /// Outputs committed with the state and not yet confirmed sent (outbox delivery).
    pub outbox: Vec<Output>,
    /// Epoch seconds after which the state counts as absent.
    pub expires_at: Option<i64>,
    /// Segments (slot, id) that the stored head no longer references: the store deletes them.
    pub garbage: Vec<(String, u64)>,
    /// Segments this change stops referencing. The stored head still references them until the
    /// commit succeeds, so they are only recorded as garbage and deleted by a later commit.
    pub retired: Vec<(String, u64)>,
}

impl KeyState {
    /// True when the record at `sequence` from `origin` was already applied to this key.
    pub fn has_applied(&self, origin: &Origin, sequence: &SequenceNumber) -> bool {
        self.watermarks
            .get(origin)
            .is_some_and(|w| *sequence <= w.sequence)
    }

    /// Records `sequence` from `origin` as applied.
    pub fn advance(&mut self, origin: &Origin, sequence: &SequenceNumber, at_millis: i64) {
        let entry = self
            .watermarks
            .entry(origin.clone())
            .or_insert_with(|| Watermark {
                sequence: sequence.clone(),
                at_millis,
            });
        if *sequence >= entry.sequence {
            entry.sequence = sequence.clone();
            entry.at_millis = at_millis;
        }
    }

    /// Forgets origins whose last record arrived more than `retention_millis` before `now_millis`:
    /// no stream redelivers records older than its retention, so their watermarks guard nothing.
    pub fn prune_watermarks(&mut self, now_millis: i64, retention_millis: i64) {
        self.watermarks
            .retain(|_, w| now_millis - w.at_millis <= retention_millis);
    }

    /// True when the state's TTL has passed at `now_secs`.
    pub fn is_expired(&self, now_secs: i64) -> bool {
        self.expires_at.is_some_and(|t| t <= now_secs)
    }

    /// Drops every slot and outbox entry but keeps the version and the watermarks; the dropped
    /// segments are retired. Used when the state expired or was reset.
    pub fn clear_contents(&mut self) {
        for (name, slot) in std::mem::take(&mut self.slots) {
            self.retired
                .extend(slot.segments.iter().map(|s| (name.clone(), s.id)));
        }
        self.outbox.clear();
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
        let origin = Origin("s/shardId-0".into());
        let mut state = KeyState::default();
        assert!(!state.has_applied(&origin, &seq(5)));
        state.advance(&origin, &seq(5), 0);
        assert!(state.has_applied(&origin, &seq(5)));
        assert!(state.has_applied(&origin, &seq(4)));
        assert!(!state.has_applied(&origin, &seq(6)));
        assert!(!state.has_applied(&Origin("s/shardId-1".into()), &seq(1)));
    }

    #[test]
    fn a_watermark_never_moves_backwards() {
        let origin = Origin("s/shardId-0".into());
        let mut state = KeyState::default();
        state.advance(&origin, &seq(9), 0);
        state.advance(&origin, &seq(3), 0);
        assert_eq!(state.watermarks[&origin].sequence, seq(9));
    }

    #[test]
    fn watermarks_older_than_the_retention_are_pruned() {
        let mut state = KeyState::default();
        state.advance(&Origin("old".into()), &seq(1), 1_000);
        state.advance(&Origin("new".into()), &seq(1), 90_000);
        state.prune_watermarks(100_000, 50_000);
        assert_eq!(
            state
                .watermarks
                .keys()
                .map(|o| o.as_str())
                .collect::<Vec<_>>(),
            ["new"]
        );
    }

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn appending_to_a_slot_keeps_its_segments() {
        let mut slot = SlotData {
            segments: vec![Segment {
                id: 1,
                len: 2,
                expires_at: None,
            }],
            entries: vec![raw("1"), raw("2"), raw("3")],
        };
        let dropped = slot.apply(SlotUpdate {
            keep: 3,
            tail: vec![raw("4")],
        });
        assert!(dropped.is_empty());
        assert_eq!(slot.segments.len(), 1);
        assert_eq!(
            slot.inline_entries()
                .iter()
                .map(|r| r.get())
                .collect::<Vec<_>>(),
            ["3", "4"]
        );
    }

    #[test]
    fn rewriting_a_segmented_prefix_drops_the_segments() {
        let mut slot = SlotData {
            segments: vec![Segment {
                id: 1,
                len: 2,
                expires_at: None,
            }],
            entries: vec![raw("1"), raw("2"), raw("3")],
        };
        let dropped = slot.apply(SlotUpdate {
            keep: 1,
            tail: vec![raw("9")],
        });
        assert_eq!(dropped, vec![1]);
        assert!(slot.segments.is_empty());
        assert_eq!(
            slot.entries.iter().map(|r| r.get()).collect::<Vec<_>>(),
            ["1", "9"]
        );
    }

    #[test]
    fn clearing_contents_retires_segments_and_keeps_the_version() {
        let mut state = KeyState {
            version: 7,
            ..Default::default()
        };
        state.slots.insert(
            "buffer".into(),
            SlotData {
                segments: vec![Segment {
                    id: 3,
                    len: 1,
                    expires_at: None,
                }],
                entries: vec![],
            },
        );
        state.clear_contents();
        assert!(state.slots.is_empty());
        assert_eq!(state.retired, vec![("buffer".to_owned(), 3)]);
        assert_eq!(state.version, 7);
    }
}
