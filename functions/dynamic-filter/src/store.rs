//! The filter state in DynamoDB: every subscription as of its last change (the snapshot an index
//! starts from), and a journal of the changes in the order they were made (what an index catches
//! up from with one strongly consistent Query a batch). Written by filter-policy-sync, read by
//! dynamic-filter; built on the runtime's `Table`, so the same code runs on DynamoDB and on the
//! embedded runtime's table.
//!
//! Layout (`pk`, `sk`):
//! - `subscriptions`, the subscription's policy item (`row_key`: its table and identity): the
//!   latest `Revised` of it, with its `revision`; a removal stays as a tombstone (with a TTL past
//!   any redelivery of the change);
//! - `journal`, a position: the time the change was appended (epoch milliseconds, zero-padded)
//!   and a hash of the change, one `Revised` each, kept for a day.
//!
//! A change is written to its row first, under the condition that it raises the row's revision,
//! and then appended to the journal. Whatever a snapshot reads was therefore written before any
//! journal entry it does not include; and a change the row refuses as older is never journaled.
//! A change retried after a crash between the two writes finds its own revision in the row and is
//! appended again: an index applies a revision it already holds without effect.
//!
//! The journal is ordered by time, not numbered: writers never contend for a place in it, so
//! changes of different consumers (or of one) never conflict, however many policy syncs append at
//! once. What a reader needs instead is a bound on how late an entry appears: a writer whose
//! append took longer than `LANDING_BOUND` appends the change again under a new time, so every
//! change has an entry that appeared within `LANDING_BOUND` of its time. A reader therefore holds
//! everything appended up to `JOURNAL_OVERLAP` (past that bound and any clock skew between two
//! machines) before its read began, and reads from there the next time: it reads some entries
//! twice, which the index applies once (revisions).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keyway::adapters::dynamodb::{
    apply_each, Expect, ItemKey, Table, WriteRequest, ITEM_MAX_BYTES, PK, SK, TTL,
};
use keyway::adapters::retry::Backoff;
use keyway::domain::hash::xxh3_128_hex;
use keyway::domain::{AttrValue, Item, Output};
use keyway::ports::{Clock, Deadline, Sink, SinkError, StoreError};

use crate::index::{Journaled, Revised};

const ROWS: &str = "subscriptions";
const JOURNAL: &str = "journal";
const REVISION: &str = "revision";
const BODY: &str = "body";
/// When a journal entry was appended (N, epoch milliseconds).
const APPENDED_AT: &str = "appendedAt";
/// How long the journal keeps a change: an index further behind reloads a snapshot.
pub const JOURNAL_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long a removed subscription's tombstone stays: past the day a DynamoDB stream can still
/// redeliver the changes before it.
pub const TOMBSTONE_RETENTION: Duration = Duration::from_secs(25 * 3600);
/// The longest an append may take for its entry to stand: one that took longer (a PutItem takes
/// milliseconds; retried through throttling, it may take this long) is made again under a new
/// time.
pub const LANDING_BOUND: Duration = Duration::from_secs(1);
/// How far back of its last read's start a reader reads the journal again: `LANDING_BOUND`, and
/// as long again for the clocks of two machines to differ (Lambda's hosts keep theirs within a
/// millisecond). Every read takes in this much of the journal: a burst of changes is read by
/// each batch of the next two seconds.
pub const JOURNAL_OVERLAP: Duration = Duration::from_secs(2);
/// Appends that took longer than `LANDING_BOUND` are made again this many times before the
/// change fails (and its batch is retried).
const APPEND_ATTEMPTS: usize = 3;

/// What applying a change came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Written, and appended to the journal at this time (epoch milliseconds).
    Journaled(i64),
    /// The subscription already has a newer revision: nothing written.
    Stale,
}

/// The filter state in a DynamoDB table: every subscription's latest change, and the journal of
/// changes.
pub struct FilterState {
    table: Arc<dyn Table>,
    clock: Arc<dyn Clock>,
    /// Every call is tried again after a backoff while its error says that can help: a throttle
    /// must not cost a batch a retry of its own, of which a mapping has few.
    backoff: Backoff,
}

impl FilterState {
    /// The filter state in `table`, whose journal's times `clock` tells.
    pub fn new(table: Arc<dyn Table>, clock: Arc<dyn Clock>) -> Self {
        Self {
            table,
            clock,
            backoff: Backoff::default(),
        }
    }

    /// With `backoff` between the attempts of a call, instead of the default.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Writes `change` to its subscription's row and appends it to the journal, unless the row
    /// holds a newer revision.
    pub async fn apply(&self, change: &Revised) -> Result<Applied, StoreError> {
        self.apply_until(change, Deadline::NONE).await
    }

    /// `apply`, with no retry of a call starting past `deadline`. A change cut short is applied
    /// again whole: each step of it finds what an earlier try left.
    async fn apply_until(
        &self,
        change: &Revised,
        deadline: Deadline,
    ) -> Result<Applied, StoreError> {
        let key = ItemKey {
            pk: ROWS.to_owned(),
            sk: row_key(change),
        };
        let mut row = self.item(&key, change)?;
        row.insert(REVISION.to_owned(), AttrValue::S(change.revision.clone()));
        if change.subscription.is_none() {
            row.insert(TTL.to_owned(), self.expiry(TOMBSTONE_RETENTION));
        }
        let raise = Expect::Raise {
            attribute: REVISION,
            value: change.revision.clone(),
        };
        for attempt in 1.. {
            match self
                .backoff
                .retry_call_until(deadline, || self.table.put(&row, &raise))
                .await
            {
                Ok(()) => break,
                Err(StoreError::Conflict) => {
                    let stored = self
                        .backoff
                        .retry_call_until(deadline, || self.table.get(&key))
                        .await?;
                    let revision = stored.as_ref().and_then(|r| r.get(REVISION)?.as_s());
                    match revision.map(|r| r.cmp(change.revision.as_str())) {
                        Some(std::cmp::Ordering::Greater) => return Ok(Applied::Stale),
                        // This change again: its first append may have been lost.
                        Some(std::cmp::Ordering::Equal) => break,
                        // Whoever wrote in between wrote an older revision: try again.
                        _ if attempt < APPEND_ATTEMPTS => continue,
                        _ => {
                            return Err(StoreError::Throttled(format!(
                                "the row of {:?} kept changing under {APPEND_ATTEMPTS} writes",
                                change.identity
                            )))
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.drop_untabled_row(change, deadline).await?;
        self.append(change, deadline).await.map(Applied::Journaled)
    }

    /// Deletes the row a change of the same subscription left before tables were told apart
    /// (`row_key`), once a change names its table: that row gives way to the table's in the
    /// index, but would stand for the subscription again once the table's tombstone expired.
    async fn drop_untabled_row(
        &self,
        change: &Revised,
        deadline: Deadline,
    ) -> Result<(), StoreError> {
        if change.table.is_empty() {
            return Ok(());
        }
        let untabled = ItemKey {
            pk: ROWS.to_owned(),
            sk: change.identity.key(),
        };
        self.backoff
            .retry_call_until(deadline, || async {
                let left = self
                    .table
                    .batch_write(vec![WriteRequest::Delete(untabled.clone())])
                    .await?;
                match left.is_empty() {
                    true => Ok(()),
                    false => Err(StoreError::Throttled(
                        "the delete of a subscription's untabled row was not processed".into(),
                    )),
                }
            })
            .await
    }

    /// Appends `change` to the journal; the time of the entry that appeared in time.
    async fn append(&self, change: &Revised, deadline: Deadline) -> Result<i64, StoreError> {
        for _ in 0..APPEND_ATTEMPTS {
            let at = self.clock.now_millis();
            let key = ItemKey {
                pk: JOURNAL.to_owned(),
                sk: journal_sk(at, change),
            };
            let mut entry = self.item(&key, change)?;
            entry.insert(APPENDED_AT.to_owned(), AttrValue::N(at.to_string()));
            entry.insert(TTL.to_owned(), self.expiry(JOURNAL_RETENTION));
            self.backoff
                .retry_call_until(deadline, || self.table.put(&entry, &Expect::Anything))
                .await?;
            // A reader may have read past an entry that appeared this late: make it again.
            if self.clock.now_millis() - at <= LANDING_BOUND.as_millis() as i64 {
                return Ok(at);
            }
        }
        Err(StoreError::Throttled(format!(
            "each of {APPEND_ATTEMPTS} journal appends took longer than {LANDING_BOUND:?}"
        )))
    }

    /// Up to `limit` journal entries after `after` (a position: `journal_position`, or an
    /// entry's), in order, by one strongly consistent Query.
    pub async fn since(&self, after: &str, limit: usize) -> Result<Vec<Journaled>, StoreError> {
        let entries = self
            .backoff
            .retry_call(|| self.table.query_after(JOURNAL, after, limit))
            .await?;
        entries
            .iter()
            .map(|entry| {
                let appended_at = entry
                    .get(APPENDED_AT)
                    .and_then(AttrValue::as_n)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_default();
                Ok(Journaled {
                    position: entry
                        .get(SK)
                        .and_then(AttrValue::as_s)
                        .map(str::to_owned)
                        .unwrap_or_default(),
                    appended_at,
                    change: body_of(entry)?,
                })
            })
            .collect()
    }

    /// Every subscription's latest change, tombstones included, and the time from which an index
    /// built from it reads the journal (`JOURNAL_OVERLAP` before the read began).
    pub async fn snapshot(&self) -> Result<(i64, Vec<Revised>), StoreError> {
        let cursor = self.clock.now_millis() - JOURNAL_OVERLAP.as_millis() as i64;
        let rows = self
            .backoff
            .retry_call(|| self.table.query_partition(ROWS))
            .await?;
        let rows = rows.iter().map(body_of).collect::<Result<_, _>>()?;
        Ok((cursor, rows))
    }

    fn item(&self, key: &ItemKey, change: &Revised) -> Result<Item, StoreError> {
        let body = serde_json::to_string(change)
            .map_err(|e| StoreError::Invalid(format!("a change that does not serialize: {e}")))?;
        let mut item = key.to_item();
        item.insert(BODY.to_owned(), AttrValue::S(body));
        Ok(item)
    }

    fn expiry(&self, after: Duration) -> AttrValue {
        let seconds = self.clock.now_millis() / 1000 + after.as_secs() as i64;
        AttrValue::N(seconds.to_string())
    }
}

/// The filter state as the sink filter-policy-sync emits its changes to: each output's body is
/// one `Revised`, applied in order.
#[async_trait]
impl Sink for FilterState {
    async fn send(&self, messages: &[Output], deadline: Deadline) -> Vec<(usize, SinkError)> {
        apply_each(
            messages,
            "a subscription change",
            deadline,
            |change: Revised| async move { self.apply_until(&change, deadline).await.map(|_| ()) },
        )
        .await
    }

    fn max_message_bytes(&self) -> usize {
        // A row holds the change with its keys and revision beside it.
        ITEM_MAX_BYTES - 4 * 1024
    }
}

/// The sort key of a subscription's row: its table and identity, unambiguously whatever they
/// hold (a table's name has no ':'). Rows of changes that named no table keep the identity's
/// own key, which starts with a digit.
fn row_key(change: &Revised) -> String {
    match change.table.as_str() {
        "" => change.identity.key(),
        table => format!("t{table}:{}", change.identity.key()),
    }
}

/// The journal position of `change` appended at `at`: ordered by time, and apart from every other
/// change appended in the same millisecond.
fn journal_sk(at: i64, change: &Revised) -> String {
    let of = xxh3_128_hex(&[row_key(change).as_bytes(), change.revision.as_bytes()]);
    format!("{}#{}", journal_position(at), &of[..16])
}

/// The journal position before every entry appended at `at` or later.
pub fn journal_position(at: i64) -> String {
    format!("{:015}", at.max(0))
}

fn body_of(item: &Item) -> Result<Revised, StoreError> {
    let body = item.get(BODY).and_then(AttrValue::as_s).unwrap_or_default();
    serde_json::from_str(body).map_err(|e| {
        StoreError::Invalid(format!(
            "filter state item {:?}/{:?} does not decode: {e}",
            item.get(PK),
            item.get(SK)
        ))
    })
}

#[cfg(test)]
mod tests {
    use keyway::ports::ManualClock;
    use keyway_local::{KeySchema, LocalDynamoDb};

    use super::*;
    use crate::index::{revision, SubscriptionIndex};
    use crate::subscription::{Identity, QueueOwnership, Subscription, Target};

    /// The filter state on an embedded table, with its services and clock.
    fn deployed() -> (LocalDynamoDb, Arc<ManualClock>, FilterState) {
        let clock = ManualClock::at(1_767_225_600_000);
        let dynamodb = LocalDynamoDb::new(clock.clone(), Default::default());
        let schema = KeySchema {
            hash: PK.into(),
            range: Some(SK.into()),
        };
        let table = dynamodb.create_table("filter-state", schema, Some(TTL.into()), None);
        let state = FilterState::new(table, clock.clone());
        (dynamodb, clock, state)
    }

    fn change(consumer: &str, key: &str, rev: u64, live: bool) -> Revised {
        let target = Target::Key(key.into());
        let identity = Identity {
            consumer: consumer.into(),
            id: "sub-1".into(),
        };
        Revised {
            table: "policies".into(),
            identity: identity.clone(),
            revision: revision(&rev.to_string()),
            subscription: live.then(|| Subscription {
                identity,
                target,
                queue: format!("keyway-{consumer}_q"),
                pattern: None,
            }),
        }
    }

    /// Every journal entry from the start, in order.
    async fn journal(state: &FilterState) -> Vec<Journaled> {
        state.since(&journal_position(0), 100).await.unwrap()
    }

    #[tokio::test]
    async fn changes_are_journaled_in_time_order_and_an_older_revision_is_refused() {
        let (_, clock, state) = deployed();
        let t0 = clock.now_millis();
        assert_eq!(
            state.apply(&change("a", "k1", 10, true)).await.unwrap(),
            Applied::Journaled(t0)
        );
        clock.advance(1);
        state.apply(&change("b", "k1", 3, true)).await.unwrap();
        state.apply(&change("a", "k2", 12, true)).await.unwrap();
        assert_eq!(
            state.apply(&change("a", "k1", 11, true)).await.unwrap(),
            Applied::Stale
        );
        // The same revision again is journaled again: its first append may have been lost.
        clock.advance(1);
        state.apply(&change("a", "k2", 12, true)).await.unwrap();
        let journal = journal(&state).await;
        let stamps: Vec<i64> = journal.iter().map(|j| j.appended_at - t0).collect();
        assert_eq!(stamps, [0, 1, 1, 2]);
        let consumers: Vec<&str> = journal
            .iter()
            .map(|j| j.change.identity.consumer.as_str())
            .collect();
        assert_eq!(consumers[0], "a");
        assert_eq!(consumers[3], "a");
        let after_first = state.since(&journal[0].position, 100).await.unwrap();
        assert_eq!(after_first, journal[1..]);
    }

    #[tokio::test]
    async fn an_index_more_than_a_day_behind_finds_the_journal_no_longer_reaches_it() {
        let (dynamodb, clock, state) = deployed();
        state.apply(&change("a", "k1", 1, true)).await.unwrap();
        let (cursor, rows) = state.snapshot().await.unwrap();
        let index = SubscriptionIndex::from_snapshot(QueueOwnership::default(), cursor, rows);
        // A quiet day, and the days DynamoDB takes to delete what expired: the entry is gone.
        let ttl_delay = keyway_local::DEFAULT_TTL_DELAY.as_millis() as i64;
        clock.advance(26 * 3600 * 1000 + ttl_delay);
        dynamodb.expire();
        assert!(journal(&state).await.is_empty());
        let kept_since =
            clock.now_millis() - (JOURNAL_RETENTION - JOURNAL_OVERLAP).as_millis() as i64;
        assert!(index.cursor() < kept_since, "the filter reloads a snapshot");
    }

    #[tokio::test]
    async fn a_subscription_removed_in_its_table_stays_removed_after_its_tombstone_expires() {
        let (dynamodb, clock, state) = deployed();
        // A row written before tables were told apart, then the removal its table sends.
        let untabled = Revised {
            table: String::new(),
            ..change("a", "k1", 1, true)
        };
        state.apply(&untabled).await.unwrap();
        state.apply(&change("a", "k1", 2, false)).await.unwrap();
        let ttl_delay = keyway_local::DEFAULT_TTL_DELAY.as_millis() as i64;
        clock.advance(TOMBSTONE_RETENTION.as_millis() as i64 + ttl_delay + 1000);
        dynamodb.expire();
        let (version, rows) = state.snapshot().await.unwrap();
        assert!(rows.is_empty(), "{rows:?}");
        let index = SubscriptionIndex::from_snapshot(QueueOwnership::default(), version, rows);
        assert!(index.subscriptions().is_empty());
    }

    #[tokio::test]
    async fn concurrent_writers_of_different_consumers_never_conflict_and_each_change_is_journaled()
    {
        let (dynamodb, _, state) = deployed();
        let changes: Vec<Revised> = (0..50)
            .map(|i| change(&format!("c{i}"), "k", i + 1, true))
            .collect();
        let applied = futures::future::join_all(changes.iter().map(|c| state.apply(c))).await;
        assert!(applied
            .iter()
            .all(|a| matches!(a, Ok(Applied::Journaled(_)))));
        assert_eq!(journal(&state).await.len(), 50);
        let table = dynamodb.table("filter-state").unwrap();
        let meter = table.meter().snapshot();
        // A conditional write of a row each; the journal's writes have no condition.
        assert_eq!(meter.calls.get("PutItem").copied(), Some(100), "{meter:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_journal_entry_that_appeared_late_is_appended_again_under_a_new_time() {
        use keyway_local::{FaultPlan, LocalServices};
        let services = LocalServices::new(1_767_225_600_000, FaultPlan::default());
        let schema = KeySchema {
            hash: PK.into(),
            range: Some(SK.into()),
        };
        let table = services
            .dynamodb
            .create_table("filter-state", schema, Some(TTL.into()), None);
        let state = FilterState::new(table.clone(), services.clock.clone());
        // Each call takes longer than an entry may take to appear: every append is late.
        table
            .meter()
            .set_latency(Some(LANDING_BOUND + Duration::from_millis(1)));
        let err = state.apply(&change("a", "k1", 1, true)).await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        table.meter().set_latency(None);
        let appended = journal(&state).await;
        assert_eq!(
            appended.len(),
            APPEND_ATTEMPTS,
            "each under a time of its own"
        );
        // Quick again: the retry's entry stands.
        state.apply(&change("a", "k1", 1, true)).await.unwrap();
        assert_eq!(journal(&state).await.len(), APPEND_ATTEMPTS + 1);
    }

    #[tokio::test]
    async fn an_index_from_a_snapshot_and_the_journal_after_it_equals_one_from_the_whole_journal() {
        let (_, clock, state) = deployed();
        state.apply(&change("a", "k1", 1, true)).await.unwrap();
        state.apply(&change("b", "k1", 2, true)).await.unwrap();
        clock.advance(JOURNAL_OVERLAP.as_millis() as i64 + 1);
        let (cursor, rows) = state.snapshot().await.unwrap();
        let mut from_snapshot =
            SubscriptionIndex::from_snapshot(QueueOwnership::default(), cursor, rows);
        state.apply(&change("a", "k1", 3, false)).await.unwrap();
        state.apply(&change("c", "k2", 4, true)).await.unwrap();
        let after = state
            .since(&journal_position(from_snapshot.cursor()), 100)
            .await
            .unwrap();
        assert_eq!(after.len(), 2, "only what came after the snapshot");
        assert_eq!(from_snapshot.catch_up(&after), 2);
        let mut replayed = SubscriptionIndex::default();
        replayed.catch_up(&journal(&state).await);
        assert_eq!(from_snapshot.subscriptions(), replayed.subscriptions());
        let live: Vec<&str> = replayed
            .subscriptions()
            .iter()
            .map(|s| s.identity.consumer.as_str())
            .collect();
        assert_eq!(live, ["b", "c"]);
    }
}
