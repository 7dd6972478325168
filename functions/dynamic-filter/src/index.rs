//! The subscriptions as the filter holds them in memory: by filter key, plus the broadcast set of
//! subscriptions to all events, each with its pattern compiled. Built from a snapshot of the
//! filter state and kept exact by applying the journal of later changes in order.
//!
//! Every change carries the revision of the policy change it comes from. A change older than what
//! the index holds for its subscription is ignored, so a change replayed or read twice (from the
//! snapshot and from the journal) never undoes a newer one; removed subscriptions keep their
//! revision as a tombstone for the same reason.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use keyway::domain::pattern::Pattern;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::subscription::{Identity, Subscription, Target};

/// A subscription as one change of its policy item left it: `None` once removed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Revised {
    pub identity: Identity,
    /// Orders the changes of one subscription: the policy change's stream sequence number,
    /// zero-padded so that strings compare as the numbers do.
    pub revision: String,
    pub subscription: Option<Subscription>,
}

/// A change as the journal holds it: its version (1, 2, 3 ... without gaps) and when it was
/// appended (epoch milliseconds, by the writer's clock).
#[derive(Clone, Debug, PartialEq)]
pub struct Journaled {
    pub version: u64,
    pub appended_at: i64,
    pub change: Revised,
}

/// Width revisions are padded to: DynamoDB Streams sequence numbers have at most 40 digits.
pub const REVISION_DIGITS: usize = 40;

/// The revision of a change with stream sequence number `sequence` (decimal digits).
pub fn revision(sequence: &str) -> String {
    format!("{sequence:0>REVISION_DIGITS$}")
}

/// The revision of a change a policy table's stream made at `created_millis`, with sequence
/// number `sequence`: ordered by when the change was made, then by sequence number. Sequence
/// numbers alone order the changes of one stream only, and a subscription may move between
/// tables (from the shared one to its consumer's own, or to a table made again) whose streams
/// number afresh. Two changes of one subscription in two tables within the same stream time
/// (a second, as DynamoDB Streams stamps them by default) are ordered by sequence number, which
/// may not be the order they were made in. The leading `t` sorts every such revision after the
/// sequence-number-only ones (`revision`) that rows written before may still hold.
pub fn timed_revision(created_millis: i64, sequence: &str) -> String {
    format!("t{created_millis:015}{}", revision(sequence))
}

/// Where a subscription delivers an event: its consumer's queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery<'a> {
    pub consumer: &'a str,
    pub queue: &'a str,
}

/// Where one event goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routing<'a> {
    pub deliveries: Vec<Delivery<'a>>,
    /// Consumers subscribed to the event whose patterns all refused it.
    pub dropped: Vec<&'a str>,
}

struct Compiled {
    subscription: Subscription,
    pattern: Pattern,
}

struct Entry {
    revision: String,
    live: Option<Arc<Compiled>>,
}

/// The journal has no change right after the index's version: it was trimmed past it, so the
/// index has to be built again from a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the journal continues at version {found}, the index is at {at}: reload from a snapshot")]
pub struct Gap {
    pub at: u64,
    pub found: u64,
}

#[derive(Default)]
pub struct SubscriptionIndex {
    version: u64,
    entries: HashMap<Identity, Entry>,
    by_key: HashMap<String, Bucket>,
    all: Bucket,
}

/// The subscriptions of one filter key (or to all events), in identity order.
type Bucket = BTreeMap<Identity, Arc<Compiled>>;

impl SubscriptionIndex {
    /// An index of a snapshot taken at journal version `version`.
    pub fn from_snapshot(version: u64, rows: impl IntoIterator<Item = Revised>) -> Self {
        let mut index = Self {
            version,
            ..Self::default()
        };
        for row in rows {
            index.apply(&row);
        }
        index
    }

    /// The last journal version applied.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Applies the journal's changes after `version()`, in order. Versions that do not follow on
    /// one another (the TTL process deletes expired entries in no particular order) are a gap:
    /// the index is unchanged.
    pub fn catch_up(&mut self, changes: &[Journaled]) -> Result<(), Gap> {
        let fresh = changes.iter().filter(|j| j.version > self.version);
        for (expected, journaled) in (self.version + 1..).zip(fresh) {
            if journaled.version != expected {
                return Err(Gap {
                    at: expected - 1,
                    found: journaled.version,
                });
            }
        }
        for journaled in changes {
            if journaled.version > self.version {
                self.apply(&journaled.change);
                self.version = journaled.version;
            }
        }
        Ok(())
    }

    /// Applies one change unless the index holds a newer revision of its subscription; says
    /// whether it did.
    pub fn apply(&mut self, change: &Revised) -> bool {
        if let Some(entry) = self.entries.get(&change.identity) {
            if entry.revision > change.revision {
                return false;
            }
            if let Some(old) = entry.live.clone() {
                self.remove(&old.subscription.target, &change.identity);
            }
        }
        // A subscription whose pattern does not compile (state written by other means) matches
        // nothing: it is kept out of the buckets.
        let live = change.subscription.as_ref().and_then(|subscription| {
            let compiled = Arc::new(Compiled {
                pattern: subscription.compiled_pattern().ok()?,
                subscription: subscription.clone(),
            });
            self.bucket(&subscription.target)
                .insert(change.identity.clone(), compiled.clone());
            Some(compiled)
        });
        self.entries.insert(
            change.identity.clone(),
            Entry {
                revision: change.revision.clone(),
                live,
            },
        );
        true
    }

    /// Takes `identity`'s subscription out of `target`'s bucket, and the bucket out once empty.
    fn remove(&mut self, target: &Target, identity: &Identity) {
        match target {
            Target::Key(key) => {
                if let Some(bucket) = self.by_key.get_mut(key) {
                    bucket.remove(identity);
                    if bucket.is_empty() {
                        self.by_key.remove(key);
                    }
                }
            }
            Target::All => {
                self.all.remove(identity);
            }
        }
    }

    fn bucket(&mut self, target: &Target) -> &mut Bucket {
        match target {
            Target::Key(key) => self.by_key.entry(key.clone()).or_default(),
            Target::All => &mut self.all,
        }
    }

    /// Where the event of filter key `key` goes: one delivery per consumer with a subscription
    /// that matches, to the queue of its first such subscription (those to the key before those
    /// to all events, each in identity order).
    pub fn deliveries(&self, key: &str, event: &Value) -> Vec<Delivery<'_>> {
        self.route(key, event).deliveries
    }

    /// `deliveries`, and the consumers subscribed to the event (by its key or to all events)
    /// whose patterns all refused it.
    pub fn route(&self, key: &str, event: &Value) -> Routing<'_> {
        let keyed = self.by_key.get(key).into_iter().flat_map(BTreeMap::values);
        let mut routing = Routing::default();
        let mut delivered: HashSet<&str> = HashSet::new();
        let mut considered: Vec<&str> = Vec::new();
        for compiled in keyed.chain(self.all.values()) {
            let consumer = compiled.subscription.identity.consumer.as_str();
            if delivered.contains(consumer) {
                continue;
            }
            if compiled.pattern.matches(event) {
                delivered.insert(consumer);
                routing.deliveries.push(Delivery {
                    consumer,
                    queue: &compiled.subscription.queue,
                });
            } else {
                considered.push(consumer);
            }
        }
        let mut dropped = HashSet::new();
        routing.dropped = considered
            .into_iter()
            .filter(|c| !delivered.contains(c) && dropped.insert(*c))
            .collect();
        routing
    }

    /// Live subscriptions: to filter keys, and to all events.
    pub fn counts(&self) -> (usize, usize) {
        (
            self.by_key.values().map(BTreeMap::len).sum(),
            self.all.len(),
        )
    }

    /// The live subscriptions, in identity order.
    pub fn subscriptions(&self) -> Vec<&Subscription> {
        let mut live: Vec<&Subscription> = self
            .entries
            .values()
            .filter_map(|e| e.live.as_ref().map(|c| &c.subscription))
            .collect();
        live.sort_by(|a, b| a.identity.cmp(&b.identity));
        live
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn sub(consumer: &str, target: Target, queue: &str, pattern: Option<Value>) -> Subscription {
        Subscription {
            identity: Identity {
                consumer: consumer.into(),
                id: target.subscription_id(),
            },
            target,
            queue: queue.into(),
            pattern,
        }
    }

    fn put(revision: u64, subscription: Subscription) -> Revised {
        Revised {
            identity: subscription.identity.clone(),
            revision: super::revision(&revision.to_string()),
            subscription: Some(subscription),
        }
    }

    fn removal(revision: u64, identity: &Identity) -> Revised {
        Revised {
            identity: identity.clone(),
            revision: super::revision(&revision.to_string()),
            subscription: None,
        }
    }

    fn key(k: &str) -> Target {
        Target::Key(k.into())
    }

    fn consumers(index: &SubscriptionIndex, k: &str, event: Value) -> Vec<String> {
        index
            .deliveries(k, &event)
            .iter()
            .map(|d| format!("{}>{}", d.consumer, d.queue))
            .collect()
    }

    #[test]
    fn an_event_reaches_each_matching_consumer_once_keyed_subscriptions_first() {
        let rows = [
            put(1, sub("live", key("s1"), "live-q", None)),
            put(2, sub("audit", Target::All, "audit-q", None)),
            put(3, sub("live", Target::All, "live-all-q", None)),
            put(
                4,
                sub("bots", key("s1"), "bots-q", Some(json!({"op": ["delete"]}))),
            ),
        ];
        let index = SubscriptionIndex::from_snapshot(4, rows);
        assert_eq!(
            consumers(&index, "s1", json!({"op": "update"})),
            ["live>live-q", "audit>audit-q"]
        );
        assert_eq!(
            consumers(&index, "s1", json!({"op": "delete"})),
            ["bots>bots-q", "live>live-q", "audit>audit-q"]
        );
        assert_eq!(
            consumers(&index, "s2", json!({"op": "delete"})),
            ["audit>audit-q", "live>live-all-q"]
        );
        let routing = index.route("s1", &json!({"op": "update"}));
        assert_eq!(
            routing.dropped,
            ["bots"],
            "subscribed to s1, refused by its pattern"
        );
    }

    #[test]
    fn a_subscription_moved_to_another_key_leaves_nothing_at_the_old_one() {
        let mut index = SubscriptionIndex::default();
        let first = sub("live", key("s1"), "q", None);
        let mut moved = first.clone();
        moved.target = key("s2");
        index.apply(&put(1, first.clone()));
        index.apply(&removal(2, &first.identity));
        index.apply(&put(2, moved));
        assert!(consumers(&index, "s1", json!({})).is_empty());
        assert_eq!(consumers(&index, "s2", json!({})), ["live>q"]);
        assert_eq!(index.counts(), (1, 0));
    }

    #[test]
    fn an_older_revision_never_undoes_a_newer_one_removals_included() {
        let mut index = SubscriptionIndex::default();
        let s = sub("live", key("s1"), "q", None);
        assert!(index.apply(&put(5, s.clone())));
        assert!(!index.apply(&removal(4, &s.identity)));
        assert_eq!(consumers(&index, "s1", json!({})), ["live>q"]);
        assert!(index.apply(&removal(6, &s.identity)));
        assert!(
            !index.apply(&put(5, s.clone())),
            "a replay after the removal"
        );
        assert!(consumers(&index, "s1", json!({})).is_empty());
        // The same revision again (a change read from the snapshot and the journal) is harmless.
        assert!(index.apply(&removal(6, &s.identity)));
        assert_eq!(index.counts(), (0, 0));
    }

    #[test]
    fn the_journal_is_applied_in_order_and_a_gap_asks_for_a_snapshot() {
        let mut index = SubscriptionIndex::from_snapshot(10, []);
        let s = sub("live", key("s1"), "q", None);
        let at = |version: u64, change: Revised| Journaled {
            version,
            appended_at: 0,
            change,
        };
        let gap = index.catch_up(&[at(12, put(1, s.clone()))]).unwrap_err();
        assert_eq!(gap, Gap { at: 10, found: 12 });
        assert_eq!(index.version(), 10);
        // Changes up to the version already applied are skipped; the rest are applied.
        index
            .catch_up(&[at(10, removal(9, &s.identity)), at(11, put(1, s.clone()))])
            .unwrap();
        assert_eq!(index.version(), 11);
        assert_eq!(consumers(&index, "s1", json!({})), ["live>q"]);
        // The TTL process took an entry from the middle of what is left.
        let gap = index
            .catch_up(&[at(12, put(2, s.clone())), at(14, removal(3, &s.identity))])
            .unwrap_err();
        assert_eq!(gap, Gap { at: 12, found: 14 });
        assert_eq!(index.version(), 11, "nothing applied");
        assert_eq!(consumers(&index, "s1", json!({})), ["live>q"]);
    }

    #[test]
    fn timed_revisions_order_by_time_then_sequence_and_follow_every_untimed_one() {
        let early_big = super::timed_revision(1_000, "900000000000000000099");
        let late_small = super::timed_revision(2_000, "1");
        assert!(
            early_big < late_small,
            "another table's stream numbers afresh"
        );
        assert!(super::timed_revision(1_000, "8") < super::timed_revision(1_000, "9"));
        assert!(super::revision("9".repeat(40).as_str()) < super::timed_revision(0, "1"));
    }

    #[test]
    fn a_key_with_a_hundred_thousand_subscriptions_loads_and_routes_each_consumer_once() {
        let rows = (0..100_000u64).map(|c| {
            let mut s = sub(&format!("c{c:06}"), key("hot"), "q", None);
            s.identity.id = format!("key#hot#{}", c % 3);
            put(c, s)
        });
        let mut index = SubscriptionIndex::from_snapshot(1, rows);
        let routing = index.route("hot", &json!({}));
        assert_eq!(routing.deliveries.len(), 100_000);
        assert_eq!(routing.deliveries[0].consumer, "c000000");
        for c in 0..50_000u64 {
            let mut s = sub(&format!("c{c:06}"), key("hot"), "q", None);
            s.identity.id = format!("key#hot#{}", c % 3);
            index.apply(&removal(c + 1, &s.identity));
        }
        assert_eq!(index.counts(), (50_000, 0));
    }

    #[test]
    fn a_stored_subscription_whose_pattern_does_not_compile_matches_nothing_and_panics_nowhere() {
        let mut index = SubscriptionIndex::default();
        let broken = sub(
            "live",
            key("s1"),
            "q",
            Some(json!({"op": [{"prefx": "a"}]})),
        );
        assert!(index.apply(&put(1, broken)));
        assert!(consumers(&index, "s1", json!({"op": "a"})).is_empty());
        assert_eq!(index.counts(), (0, 0));
    }
}
