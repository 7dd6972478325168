//! The subscriptions as the filter holds them in memory: by filter key, plus the broadcast set of
//! subscriptions to all events, each with its pattern compiled. Built from a snapshot of the
//! filter state and kept exact by applying the journal of later changes in order.
//!
//! A subscription is a policy item: its table and its key there (`PolicyItem`). One consumer's
//! subscriptions to the same key in two tables (the shared table and its own, while it moves from
//! one to the other) are two subscriptions, each made and removed by its own table's changes, so
//! the delete of the old one never takes the new one with it, whatever the order and the speed
//! of the two; an event reaches the consumer once all the same.
//!
//! Every change carries the revision of the policy change it comes from, which orders the
//! changes of one policy item: its table's stream label (a table made again streams anew), then
//! the change's sequence number. A change older than what the index holds for its subscription
//! is ignored, so a change replayed or read twice (from the snapshot and from the journal) never
//! undoes a newer one; removed subscriptions keep their revision as a tombstone for the same
//! reason.
//!
//! The index holds no subscription whose consumer does not own its queue (`QueueOwnership`): the
//! policy sync refuses those, and the filter checks again what its state holds.
//!
//! Every event is matched against every subscription to all events: a consumer's first
//! `ALL_EVENTS_PER_CONSUMER` of them (in policy item order, the same in every environment
//! whatever order they were applied in) are live, and the rest held back until some of those go,
//! so that no consumer can make every event cost thousands of matches.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use keyway::domain::pattern::Pattern;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::subscription::{Identity, QueueOwnership, Subscription, Target};

/// Which policy item a subscription is: its table and its key there.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyItem {
    /// The policy table the item is in.
    pub table: String,
    /// The item's key in that table: its consumer and subscription id.
    pub identity: Identity,
}

/// A subscription as one change of its policy item left it: `None` once removed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Revised {
    /// The policy table the item is in (empty in changes written before tables were told apart).
    #[serde(default)]
    pub table: String,
    /// The item's key in its table: its consumer and subscription id.
    pub identity: Identity,
    /// Orders the changes of one subscription: the policy change's stream sequence number,
    /// zero-padded so that strings compare as the numbers do.
    pub revision: String,
    /// The subscription as the change left it; `None` once removed.
    pub subscription: Option<Subscription>,
}

/// A change as the journal holds it: its position (`store::journal_sk`) and when it was appended
/// (epoch milliseconds, by the writer's clock).
#[derive(Clone, Debug, PartialEq)]
pub struct Journaled {
    /// The entry's place in the journal: its append time and a hash of the change.
    pub position: String,
    /// When the change was appended, in epoch milliseconds by the writer's clock.
    pub appended_at: i64,
    /// The change the entry carries.
    pub change: Revised,
}

/// How many subscriptions to all events of one consumer are live: each is matched against every
/// event of every consumer's filter keys. A consumer needs one a queue (or a pattern); a tenant
/// with thousands would slow every shard for everyone.
pub const ALL_EVENTS_PER_CONSUMER: usize = 25;

/// Width revisions are padded to: DynamoDB Streams sequence numbers have at most 40 digits.
pub const REVISION_DIGITS: usize = 40;

/// The revision of a change with stream sequence number `sequence` (decimal digits).
pub fn revision(sequence: &str) -> String {
    format!("{sequence:0>REVISION_DIGITS$}")
}

/// The revision of a change of a policy table's stream labelled `label` (the stream ARN's last
/// part, the time the stream was made: labels of one table order as its streams were made) with
/// sequence number `sequence`. A table deleted and made again, or whose stream was turned off and
/// on, numbers its changes afresh in a stream of a later label, and they are newer all the same.
/// The leading `u` sorts every such revision after the older forms (`revision`,
/// `timed_revision`) that rows written before may hold.
pub fn stream_revision(label: &str, sequence: &str) -> String {
    format!("u{label}/{}", revision(sequence))
}

/// Where a subscription delivers an event: its consumer's queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery<'a> {
    /// The consumer whose subscription matched.
    pub consumer: &'a str,
    /// The name of the consumer's queue the event goes to.
    pub queue: &'a str,
}

/// Where one event goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routing<'a> {
    /// Each consumer the event goes to, once, with its queue.
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
    /// Whether the change held a subscription (live, or refused), not a removal.
    subscribed: bool,
    live: Option<Arc<Compiled>>,
}

/// The subscriptions an execution environment matches events against: by filter key, and to all
/// events, each with its compiled pattern.
#[derive(Default)]
pub struct SubscriptionIndex {
    /// The index holds every change appended to the journal before this time (epoch
    /// milliseconds): where its next read of the journal starts.
    cursor: i64,
    ownership: QueueOwnership,
    /// Subscriptions held back because their consumer does not own their queue.
    refused: HashMap<PolicyItem, String>,
    /// The subscriptions some change of which named its table.
    named: HashSet<Identity>,
    entries: HashMap<PolicyItem, Entry>,
    by_key: HashMap<String, Bucket>,
    /// The live subscriptions to all events: each consumer's first `ALL_EVENTS_PER_CONSUMER`.
    all: Bucket,
    /// Every consumer's subscriptions to all events, live and held back.
    all_of: HashMap<String, Bucket>,
}

/// The subscriptions of one filter key (or to all events), in policy item order.
type Bucket = BTreeMap<PolicyItem, Arc<Compiled>>;

impl SubscriptionIndex {
    /// An empty index that holds subscriptions to the queues `ownership` gives their consumers.
    pub fn new(ownership: QueueOwnership) -> Self {
        Self {
            ownership,
            ..Self::default()
        }
    }

    /// An index of a snapshot that holds every change appended before `cursor`
    /// (`FilterState::snapshot`), of the subscriptions to the queues `ownership` gives their
    /// consumers.
    pub fn from_snapshot(
        ownership: QueueOwnership,
        cursor: i64,
        rows: impl IntoIterator<Item = Revised>,
    ) -> Self {
        let mut index = Self {
            cursor,
            ..Self::new(ownership)
        };
        for row in rows {
            index.apply(&row);
        }
        index
    }

    /// Before when the index holds every change appended (epoch milliseconds).
    pub fn cursor(&self) -> i64 {
        self.cursor
    }

    /// Applies journal entries, in any order and any number of times (each subscription keeps
    /// its newest revision); how many changed the index.
    pub fn catch_up(&mut self, changes: &[Journaled]) -> usize {
        changes.iter().filter(|j| self.apply(&j.change)).count()
    }

    /// Notes that the index holds every change appended before `cursor`, once its entries are
    /// applied; a cursor never goes back.
    pub fn advance(&mut self, cursor: i64) {
        self.cursor = self.cursor.max(cursor);
    }

    /// Applies one change unless the index holds a newer revision of its subscription, or this
    /// one; says whether it did.
    pub fn apply(&mut self, change: &Revised) -> bool {
        let item = PolicyItem {
            table: change.table.clone(),
            identity: change.identity.clone(),
        };
        // A row written before tables were told apart (no table) stands for the subscription
        // until a change of it names its table: then the table's row is the subscription.
        let legacy = PolicyItem {
            table: String::new(),
            identity: change.identity.clone(),
        };
        if item.table.is_empty() {
            if self.named.contains(&item.identity) {
                return false;
            }
        } else {
            self.named.insert(item.identity.clone());
            if let Some(old) = self.entries.remove(&legacy).and_then(|e| e.live) {
                self.remove(&old.subscription.target, &legacy);
            }
            self.refused.remove(&legacy);
        }
        if let Some(entry) = self.entries.get(&item) {
            // The journal is read with an overlap, in time order: a revision held already
            // changes nothing, and of a removal and a subscription of the same revision (a
            // policy item changed in place), the subscription stands whichever came first.
            let held = entry.revision.cmp(&change.revision);
            if held.is_gt() || held.is_eq() && (entry.subscribed || change.subscription.is_none()) {
                return false;
            }
            if let Some(old) = entry.live.clone() {
                self.remove(&old.subscription.target, &item);
            }
        }
        // A subscription whose pattern does not compile, or whose consumer does not own its
        // queue (state written by other means), matches nothing: it is kept out of the buckets.
        self.refused.remove(&item);
        let live = change.subscription.as_ref().and_then(|subscription| {
            let consumer = &subscription.identity.consumer;
            if let Err(e) = self.ownership.check(consumer, &subscription.queue) {
                self.refused.insert(item.clone(), e.to_string());
                return None;
            }
            let compiled = Arc::new(Compiled {
                pattern: subscription.compiled_pattern().ok()?,
                subscription: subscription.clone(),
            });
            match &subscription.target {
                Target::Key(key) => {
                    let bucket = self.by_key.entry(key.clone()).or_default();
                    bucket.insert(item.clone(), compiled.clone());
                }
                Target::All => self.insert_all(&item, &compiled),
            }
            Some(compiled)
        });
        self.entries.insert(
            item,
            Entry {
                revision: change.revision.clone(),
                subscribed: change.subscription.is_some(),
                live,
            },
        );
        true
    }

    /// Takes `item`'s subscription out of `target`'s bucket, and the bucket out once empty.
    fn remove(&mut self, target: &Target, item: &PolicyItem) {
        match target {
            Target::Key(key) => {
                if let Some(bucket) = self.by_key.get_mut(key) {
                    bucket.remove(item);
                    if bucket.is_empty() {
                        self.by_key.remove(key);
                    }
                }
            }
            Target::All => self.remove_all(item),
        }
    }

    /// Adds a subscription to all events of `item`'s consumer: live if among the consumer's
    /// first `ALL_EVENTS_PER_CONSUMER`, where it takes the place of the last one live.
    fn insert_all(&mut self, item: &PolicyItem, compiled: &Arc<Compiled>) {
        let consumer = &item.identity.consumer;
        let of = self.all_of.entry(consumer.clone()).or_default();
        of.insert(item.clone(), compiled.clone());
        let before = of.range(..item).take(ALL_EVENTS_PER_CONSUMER).count();
        if before >= ALL_EVENTS_PER_CONSUMER {
            return;
        }
        self.all.insert(item.clone(), compiled.clone());
        if let Some((last, _)) = of.iter().nth(ALL_EVENTS_PER_CONSUMER) {
            self.all.remove(last);
        }
    }

    /// Takes a subscription to all events out: if it was live, the consumer's first held back
    /// takes its place.
    fn remove_all(&mut self, item: &PolicyItem) {
        let consumer = &item.identity.consumer;
        let Some(of) = self.all_of.get_mut(consumer) else {
            return;
        };
        of.remove(item);
        if self.all.remove(item).is_some() {
            if let Some((next, compiled)) = of.iter().nth(ALL_EVENTS_PER_CONSUMER - 1) {
                self.all.insert(next.clone(), compiled.clone());
            }
        }
        if of.is_empty() {
            self.all_of.remove(consumer);
        }
    }

    /// Where the event of filter key `key` goes: one delivery per consumer with a subscription
    /// that matches, to the queue of its first such subscription (those to the key before those
    /// to all events, each in policy item order: table, consumer, id).
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

    /// The subscriptions held back because their consumer does not own their queue (state
    /// written by other means, or before the ownership rule), with why.
    pub fn refused(&self) -> Vec<(&PolicyItem, &str)> {
        let mut refused: Vec<(&PolicyItem, &str)> = self
            .refused
            .iter()
            .map(|(i, why)| (i, why.as_str()))
            .collect();
        refused.sort();
        refused
    }

    /// The subscriptions to all events held back because their consumer has
    /// `ALL_EVENTS_PER_CONSUMER` before them, in policy item order.
    pub fn held_back(&self) -> Vec<&PolicyItem> {
        let mut held: Vec<&PolicyItem> = self
            .all_of
            .values()
            .flat_map(|of| of.keys().skip(ALL_EVENTS_PER_CONSUMER))
            .collect();
        held.sort();
        held
    }

    /// Live subscriptions: to filter keys, and to all events.
    pub fn counts(&self) -> (usize, usize) {
        (
            self.by_key.values().map(BTreeMap::len).sum(),
            self.all.len(),
        )
    }

    /// The live subscriptions, in policy item order (those to all events held back left out).
    pub fn subscriptions(&self) -> Vec<&Subscription> {
        let mut live: Vec<(&PolicyItem, &Subscription)> = self
            .entries
            .iter()
            .filter_map(|(item, e)| e.live.as_ref().map(|c| (item, &c.subscription)))
            .filter(|(item, s)| s.target != Target::All || self.all.contains_key(item))
            .collect();
        live.sort_by(|a, b| a.0.cmp(b.0));
        live.into_iter().map(|(_, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `consumer`'s subscription to `target`, delivered to its queue named `queue`.
    fn sub(consumer: &str, target: Target, queue: &str, pattern: Option<Value>) -> Subscription {
        Subscription {
            identity: Identity {
                consumer: consumer.into(),
                id: target.subscription_id(),
            },
            target,
            queue: format!("keyway-{consumer}_{queue}"),
            pattern,
        }
    }

    fn put(revision: u64, subscription: Subscription) -> Revised {
        Revised {
            table: "policies".into(),
            identity: subscription.identity.clone(),
            revision: super::revision(&revision.to_string()),
            subscription: Some(subscription),
        }
    }

    fn removal(revision: u64, identity: &Identity) -> Revised {
        Revised {
            table: "policies".into(),
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
            .map(|d| {
                let queue = d.queue.strip_prefix(&format!("keyway-{}_", d.consumer));
                format!("{}>{}", d.consumer, queue.unwrap_or(d.queue))
            })
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
        let index = SubscriptionIndex::from_snapshot(QueueOwnership::default(), 4, rows);
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
        index.apply(&put(2, moved.clone()));
        assert!(consumers(&index, "s1", json!({})).is_empty());
        assert_eq!(consumers(&index, "s2", json!({})), ["live>q"]);
        assert_eq!(index.counts(), (1, 0));
        // The same two of one revision the other way round, as a journal in time order may
        // hold them: the subscription stands.
        let mut index = SubscriptionIndex::default();
        index.apply(&put(1, first.clone()));
        index.apply(&put(2, moved));
        assert!(!index.apply(&removal(2, &first.identity)));
        assert_eq!(consumers(&index, "s2", json!({})), ["live>q"]);
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
        // The same revision again (a change read from the snapshot and the journal, or twice
        // from the journal) changes nothing.
        assert!(!index.apply(&removal(6, &s.identity)));
        assert_eq!(index.counts(), (0, 0));
    }

    #[test]
    fn journal_entries_read_twice_or_out_of_order_leave_the_newest_revision_of_each() {
        let mut index = SubscriptionIndex::from_snapshot(QueueOwnership::default(), 10, []);
        let s = sub("live", key("s1"), "q", None);
        let at = |ms: i64, change: Revised| Journaled {
            position: format!("{ms:015}"),
            appended_at: ms,
            change,
        };
        let entries = [
            at(11, put(1, s.clone())),
            at(12, removal(2, &s.identity)),
            at(13, put(3, s.clone())),
        ];
        assert_eq!(index.catch_up(&entries), 3);
        assert_eq!(consumers(&index, "s1", json!({})), ["live>q"]);
        // The next read overlaps this one, and an entry made again late comes in between.
        let again = [
            entries[1].clone(),
            entries[2].clone(),
            at(14, removal(2, &s.identity)),
        ];
        assert_eq!(index.catch_up(&again), 0, "nothing newer");
        assert_eq!(consumers(&index, "s1", json!({})), ["live>q"]);
        index.advance(13);
        index.advance(12);
        assert_eq!(index.cursor(), 13, "a cursor never goes back");
    }

    #[test]
    fn stream_revisions_order_by_stream_then_sequence_and_follow_every_older_form() {
        let old_stream_big = super::stream_revision("2026-01-01T00:00:00.000", &"9".repeat(40));
        let new_stream_small = super::stream_revision("2026-01-01T00:00:00.001", "1");
        assert!(
            old_stream_big < new_stream_small,
            "a table made again streams anew"
        );
        let same = |n: &str| super::stream_revision("2026-01-01T00:00:00.000", n);
        assert!(same("8") < same("9") && same("9") < same("10"));
        assert!(super::revision(&"9".repeat(40)) < super::stream_revision("", "1"));
        assert!(*"t999999999999999" < *super::stream_revision("", "1"));
    }

    #[test]
    fn one_consumers_subscriptions_to_a_key_in_two_tables_are_two_and_an_event_arrives_once() {
        let mut index = SubscriptionIndex::default();
        let s = sub("live", key("s1"), "q", None);
        let in_table = |table: &str, change: Revised| Revised {
            table: table.into(),
            ..change
        };
        assert!(index.apply(&in_table("shared", put(900, s.clone()))));
        assert!(index.apply(&in_table("own", put(1, s.clone()))));
        assert_eq!(consumers(&index, "s1", json!({})), ["live>q"]);
        // The delete in the shared table, whatever its revision, leaves the own table's.
        assert!(index.apply(&in_table("shared", removal(901, &s.identity))));
        assert_eq!(consumers(&index, "s1", json!({})), ["live>q"]);
        assert_eq!(index.counts(), (1, 0));
    }

    #[test]
    fn a_subscription_to_a_queue_its_consumer_does_not_own_is_kept_out_and_said_so() {
        let mut index = SubscriptionIndex::default();
        let mut stolen = sub("mallory", key("s1"), "q", None);
        stolen.queue = "keyway-live_q".into();
        assert!(index.apply(&put(1, stolen.clone())));
        assert!(consumers(&index, "s1", json!({})).is_empty());
        assert_eq!(index.counts(), (0, 0));
        let refused = index.refused();
        assert_eq!(refused.len(), 1);
        assert!(
            refused[0].1.contains("not a queue of consumer \"mallory\""),
            "{refused:?}"
        );
        assert!(index.apply(&removal(2, &stolen.identity)));
        assert!(
            index.refused().is_empty(),
            "a removal takes it off the list"
        );
    }

    #[test]
    fn a_row_written_before_tables_were_told_apart_gives_way_to_its_tables_row() {
        let mut index = SubscriptionIndex::default();
        let s = sub("live", key("s1"), "old", None);
        let untabled = Revised {
            table: String::new(),
            ..put(5, s.clone())
        };
        assert!(index.apply(&untabled));
        assert_eq!(consumers(&index, "s1", json!({})), ["live>old"]);
        // The consumer unsubscribes in its table: the old row goes with it.
        assert!(index.apply(&removal(6, &s.identity)));
        assert!(consumers(&index, "s1", json!({})).is_empty());
        assert_eq!(index.counts(), (0, 0));
        // Read again from a snapshot, in either order, the old row stays out.
        for rows in [
            vec![untabled.clone(), removal(6, &s.identity)],
            vec![removal(6, &s.identity), untabled.clone()],
        ] {
            let index = SubscriptionIndex::from_snapshot(QueueOwnership::default(), 1, rows);
            assert!(consumers(&index, "s1", json!({})).is_empty());
        }
    }

    #[test]
    fn a_key_with_a_hundred_thousand_subscriptions_loads_and_routes_each_consumer_once() {
        let rows = (0..100_000u64).map(|c| {
            let mut s = sub(&format!("c{c:06}"), key("hot"), "q", None);
            s.identity.id = format!("key#hot#{}", c % 3);
            put(c, s)
        });
        let mut index = SubscriptionIndex::from_snapshot(QueueOwnership::default(), 1, rows);
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

    /// Fifty thousand subscriptions to all events of one tenant made every event of every
    /// consumer cost fifty thousand matches: a batch of 500 outran the function's timeout.
    #[test]
    fn a_consumer_has_at_most_its_first_subscriptions_to_all_events_live_in_any_order_of_changes() {
        let broadcast = |consumer: &str, n: usize, pattern: Value| {
            let mut s = sub(consumer, Target::All, &format!("q{n}"), Some(pattern));
            s.identity.id = format!("all-{n:05}");
            s
        };
        let never = json!({"op": ["never"]});
        let mut flood: Vec<Subscription> = (0..5_000)
            .map(|n| broadcast("mallory", n, never.clone()))
            .collect();
        // The one that would match sits past the limit.
        flood[ALL_EVENTS_PER_CONSUMER] = broadcast("mallory", ALL_EVENTS_PER_CONSUMER, json!({}));
        let alice = broadcast("alice", 0, json!({}));
        for reversed in [false, true] {
            let mut changes: Vec<Subscription> = flood.clone();
            if reversed {
                changes.reverse();
            }
            changes.push(alice.clone());
            let rows = changes
                .into_iter()
                .enumerate()
                .map(|(r, s)| put(r as u64, s));
            let mut index = SubscriptionIndex::from_snapshot(QueueOwnership::default(), 1, rows);
            assert_eq!(
                index.counts(),
                (0, ALL_EVENTS_PER_CONSUMER + 1),
                "reversed {reversed}"
            );
            assert_eq!(index.held_back().len(), 5_000 - ALL_EVENTS_PER_CONSUMER);
            assert_eq!(index.held_back()[0].identity.id, "all-00025");
            assert_eq!(consumers(&index, "k", json!({"op": "x"})), ["alice>q0"]);
            // One of mallory's live ones goes: the first held back takes its place.
            index.apply(&removal(10_000, &flood[3].identity));
            assert_eq!(
                consumers(&index, "k", json!({"op": "x"})),
                ["alice>q0", "mallory>q25"]
            );
            assert_eq!(index.counts(), (0, ALL_EVENTS_PER_CONSUMER + 1));
            // Changed in place, a live one stays live; one made before them all goes first.
            index.apply(&put(10_001, broadcast("mallory", 0, never.clone())));
            let mut first = broadcast("mallory", 0, never.clone());
            first.identity.id = "all-0".into();
            index.apply(&put(10_002, first));
            assert_eq!(consumers(&index, "k", json!({"op": "x"})), ["alice>q0"]);
            assert_eq!(index.counts(), (0, ALL_EVENTS_PER_CONSUMER + 1));
        }
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
