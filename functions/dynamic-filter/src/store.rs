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
//! - `journal`, the version zero-padded: one `Revised` each, versions 1, 2, 3 ... without gaps,
//!   kept for a day;
//! - `journal-head`, `head`: the last version appended, kept for good. When a quiet day has let
//!   every entry expire, the next change still continues the numbering, so an index that read up
//!   to the old last version finds it.
//!
//! A change is written to its row first, under the condition that it raises the row's revision,
//! and then appended to the journal. Whatever a snapshot reads was therefore written before any
//! journal entry it does not include; and a change the row refuses as older is never journaled.
//! A change retried after a crash between the two writes finds its own revision in the row and is
//! appended again: an index applies a revision it already holds without effect.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keyway::adapters::dynamodb::{
    apply_each, Expect, ItemKey, Table, WriteRequest, ITEM_MAX_BYTES, PK, SK, TTL, VERSION,
};
use keyway::adapters::retry::Backoff;
use keyway::domain::{AttrValue, Item, Output};
use keyway::ports::{Clock, Sink, SinkError, StoreError};

use crate::index::{Journaled, Revised};

const ROWS: &str = "subscriptions";
const JOURNAL: &str = "journal";
const HEAD: (&str, &str) = ("journal-head", "head");
/// The head's last version, zero-padded as a journal sort key (S): a put may only raise it.
const LAST: &str = "last";
const REVISION: &str = "revision";
const BODY: &str = "body";
/// When a journal entry was appended (N, epoch milliseconds).
const APPENDED_AT: &str = "appendedAt";
/// How long the journal keeps a change: an index further behind reloads a snapshot.
pub const JOURNAL_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long a removed subscription's tombstone stays: past the day a DynamoDB stream can still
/// redeliver the changes before it.
pub const TOMBSTONE_RETENTION: Duration = Duration::from_secs(25 * 3600);
/// Appends that lose the race for a version try again this many times before giving up.
const APPEND_ATTEMPTS: usize = 20;

/// What applying a change came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Written, at this journal version.
    Journaled(u64),
    /// The subscription already has a newer revision: nothing written.
    Stale,
}

pub struct FilterState {
    table: Arc<dyn Table>,
    clock: Arc<dyn Clock>,
    /// Every call is tried again after a backoff while its error says that can help: a throttle
    /// must not cost a batch a retry of its own, of which a mapping has few.
    backoff: Backoff,
}

impl FilterState {
    pub fn new(table: Arc<dyn Table>, clock: Arc<dyn Clock>) -> Self {
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

    /// Writes `change` to its subscription's row and appends it to the journal, unless the row
    /// holds a newer revision.
    pub async fn apply(&self, change: &Revised) -> Result<Applied, StoreError> {
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
                .retry_call(|| self.table.put(&row, &raise))
                .await
            {
                Ok(()) => break,
                Err(StoreError::Conflict) => {
                    let stored = self.backoff.retry_call(|| self.table.get(&key)).await?;
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
        self.drop_untabled_row(change).await?;
        self.append(change).await.map(Applied::Journaled)
    }

    /// Deletes the row a change of the same subscription left before tables were told apart
    /// (`row_key`), once a change names its table: that row gives way to the table's in the
    /// index, but would stand for the subscription again once the table's tombstone expired.
    async fn drop_untabled_row(&self, change: &Revised) -> Result<(), StoreError> {
        if change.table.is_empty() {
            return Ok(());
        }
        let untabled = ItemKey {
            pk: ROWS.to_owned(),
            sk: change.identity.key(),
        };
        self.backoff
            .retry_call(|| async {
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

    async fn append(&self, change: &Revised) -> Result<u64, StoreError> {
        for _ in 0..APPEND_ATTEMPTS {
            let version = self.head().await? + 1;
            let key = ItemKey {
                pk: JOURNAL.to_owned(),
                sk: journal_sk(version),
            };
            let mut entry = self.item(&key, change)?;
            entry.insert(VERSION.to_owned(), AttrValue::N(version.to_string()));
            let now = self.clock.now_millis().to_string();
            entry.insert(APPENDED_AT.to_owned(), AttrValue::N(now));
            entry.insert(TTL.to_owned(), self.expiry(JOURNAL_RETENTION));
            match self
                .backoff
                .retry_call(|| self.table.put(&entry, &Expect::Absent))
                .await
            {
                Ok(()) => {
                    self.raise_head(version).await?;
                    return Ok(version);
                }
                // Another writer took this version: the next one is free.
                Err(StoreError::Conflict) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Throttled(format!(
            "the journal's next version was taken {APPEND_ATTEMPTS} times in a row"
        )))
    }

    /// Records `version` as the last one appended, unless a later one is recorded already.
    async fn raise_head(&self, version: u64) -> Result<(), StoreError> {
        let mut head = self.head_key().to_item();
        head.insert(LAST.to_owned(), AttrValue::S(journal_sk(version)));
        let raise = Expect::Raise {
            attribute: LAST,
            value: journal_sk(version),
        };
        match self
            .backoff
            .retry_call(|| self.table.put(&head, &raise))
            .await
        {
            // A later version is recorded already.
            Ok(()) | Err(StoreError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn head_key(&self) -> ItemKey {
        ItemKey {
            pk: HEAD.0.to_owned(),
            sk: HEAD.1.to_owned(),
        }
    }

    /// The journal's last version: the last entry's, or the one the head recorded if every entry
    /// has expired (or a writer stopped before raising the head); 0 when nothing was ever appended.
    pub async fn head(&self) -> Result<u64, StoreError> {
        let last = self
            .backoff
            .retry_call(|| self.table.query_last(JOURNAL))
            .await?
            .map(|entry| version_of(&entry))
            .transpose()?
            .unwrap_or(0);
        let key = self.head_key();
        let recorded = self
            .backoff
            .retry_call(|| self.table.get(&key))
            .await?
            .and_then(|head| head.get(LAST)?.as_s()?.parse::<u64>().ok())
            .unwrap_or(0);
        Ok(last.max(recorded))
    }

    /// Up to `limit` journal changes after `version`, in order, by one strongly consistent Query.
    pub async fn since(&self, version: u64, limit: usize) -> Result<Vec<Journaled>, StoreError> {
        let after = journal_sk(version);
        let entries = self
            .backoff
            .retry_call(|| self.table.query_after(JOURNAL, &after, limit))
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
                    version: version_of(entry)?,
                    appended_at,
                    change: body_of(entry)?,
                })
            })
            .collect()
    }

    /// Every subscription's latest change, tombstones included, and the journal version the
    /// snapshot is at least as new as: an index built from it catches up from there.
    pub async fn snapshot(&self) -> Result<(u64, Vec<Revised>), StoreError> {
        let version = self.head().await?;
        let rows = self
            .backoff
            .retry_call(|| self.table.query_partition(ROWS))
            .await?;
        let rows = rows.iter().map(body_of).collect::<Result<_, _>>()?;
        Ok((version, rows))
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
    async fn send(&self, messages: &[Output]) -> Vec<(usize, SinkError)> {
        apply_each(
            messages,
            "a subscription change",
            |change: Revised| async move { self.apply(&change).await.map(|_| ()) },
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

fn journal_sk(version: u64) -> String {
    format!("{version:020}")
}

fn version_of(entry: &Item) -> Result<u64, StoreError> {
    entry
        .get(VERSION)
        .and_then(AttrValue::as_n)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            StoreError::Invalid(format!(
                "a journal entry without a version: {:?}",
                entry.get(SK)
            ))
        })
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
    use keyway::local::{KeySchema, LocalDynamoDb};
    use keyway::ports::ManualClock;

    use super::*;
    use crate::index::{revision, SubscriptionIndex};
    use crate::subscription::{Identity, QueueOwnership, Subscription, Target};

    fn state() -> FilterState {
        deployed().2
    }

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

    #[tokio::test]
    async fn changes_are_journaled_in_order_and_an_older_revision_is_refused() {
        let state = state();
        assert_eq!(state.head().await.unwrap(), 0);
        assert_eq!(
            state.apply(&change("a", "k1", 10, true)).await.unwrap(),
            Applied::Journaled(1)
        );
        assert_eq!(
            state.apply(&change("b", "k1", 3, true)).await.unwrap(),
            Applied::Journaled(2)
        );
        assert_eq!(
            state.apply(&change("a", "k2", 12, true)).await.unwrap(),
            Applied::Journaled(3)
        );
        assert_eq!(
            state.apply(&change("a", "k1", 11, true)).await.unwrap(),
            Applied::Stale
        );
        // The same revision again is journaled again: its first append may have been lost.
        assert_eq!(
            state.apply(&change("a", "k2", 12, true)).await.unwrap(),
            Applied::Journaled(4)
        );
        let journal = state.since(0, 100).await.unwrap();
        let versions: Vec<u64> = journal.iter().map(|j| j.version).collect();
        assert_eq!(versions, [1, 2, 3, 4]);
        assert_eq!(state.since(2, 1).await.unwrap()[0].version, 3);
        assert_eq!(journal[0].appended_at, 1_767_225_600_000);
    }

    #[tokio::test]
    async fn after_the_whole_journal_expired_the_next_change_continues_its_numbering() {
        let (dynamodb, clock, state) = deployed();
        state.apply(&change("a", "k1", 1, true)).await.unwrap();
        state.apply(&change("b", "k1", 2, true)).await.unwrap();
        let (version, rows) = state.snapshot().await.unwrap();
        let mut index = SubscriptionIndex::from_snapshot(QueueOwnership::default(), version, rows);
        // A quiet day, and the days DynamoDB takes to delete what expired: every journal entry
        // is gone.
        let ttl_delay = keyway::local::DEFAULT_TTL_DELAY.as_millis() as i64;
        clock.advance(26 * 3600 * 1000 + ttl_delay);
        dynamodb.expire();
        assert!(state.since(0, 100).await.unwrap().is_empty());
        assert_eq!(state.head().await.unwrap(), 2);
        assert_eq!(
            state.apply(&change("c", "k2", 3, true)).await.unwrap(),
            Applied::Journaled(3)
        );
        index
            .catch_up(&state.since(index.version(), 100).await.unwrap())
            .unwrap();
        let live: Vec<&str> = index
            .subscriptions()
            .iter()
            .map(|s| s.identity.consumer.as_str())
            .collect();
        assert_eq!(live, ["a", "b", "c"]);
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
        let ttl_delay = keyway::local::DEFAULT_TTL_DELAY.as_millis() as i64;
        clock.advance(TOMBSTONE_RETENTION.as_millis() as i64 + ttl_delay + 1000);
        dynamodb.expire();
        let (version, rows) = state.snapshot().await.unwrap();
        assert!(rows.is_empty(), "{rows:?}");
        let index = SubscriptionIndex::from_snapshot(QueueOwnership::default(), version, rows);
        assert!(index.subscriptions().is_empty());
    }

    #[tokio::test]
    async fn concurrent_writers_take_distinct_versions_without_gaps() {
        let state = state();
        let changes: Vec<Revised> = (0..20)
            .map(|i| change(&format!("c{i}"), "k", i + 1, true))
            .collect();
        let applied = futures::future::join_all(changes.iter().map(|c| state.apply(c))).await;
        let mut versions: Vec<u64> = applied
            .into_iter()
            .map(|a| match a.unwrap() {
                Applied::Journaled(v) => v,
                Applied::Stale => panic!("no change is stale"),
            })
            .collect();
        versions.sort_unstable();
        assert_eq!(versions, (1..=20).collect::<Vec<u64>>());
    }

    #[tokio::test]
    async fn an_index_from_a_snapshot_and_the_journal_after_it_equals_one_from_the_whole_journal() {
        let state = state();
        state.apply(&change("a", "k1", 1, true)).await.unwrap();
        state.apply(&change("b", "k1", 2, true)).await.unwrap();
        let (version, rows) = state.snapshot().await.unwrap();
        let mut from_snapshot =
            SubscriptionIndex::from_snapshot(QueueOwnership::default(), version, rows);
        state.apply(&change("a", "k1", 3, false)).await.unwrap();
        state.apply(&change("c", "k2", 4, true)).await.unwrap();
        from_snapshot
            .catch_up(&state.since(from_snapshot.version(), 100).await.unwrap())
            .unwrap();
        let mut replayed = SubscriptionIndex::default();
        replayed
            .catch_up(&state.since(0, 100).await.unwrap())
            .unwrap();
        assert_eq!(from_snapshot.subscriptions(), replayed.subscriptions());
        assert_eq!(from_snapshot.version(), 4);
        let live: Vec<&str> = replayed
            .subscriptions()
            .iter()
            .map(|s| s.identity.consumer.as_str())
            .collect();
        assert_eq!(live, ["b", "c"]);
    }
}
