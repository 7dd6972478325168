//! The store's requests to its table: batched reads and writes with their retries, and the head
//! put that finds out whether a write whose response was lost landed.

use std::collections::HashMap;
use std::sync::Mutex;

use futures::future::join_all;

use super::super::{Expect, ItemKey, Table, WriteRequest, BATCH_GET_MAX, BATCH_WRITE_MAX};
use super::DynamoStateStore;
use crate::adapters::retry::Round;
use crate::domain::Item;
use crate::ports::{Deadline, StoreError};

impl<T: Table> DynamoStateStore<T> {
    /// Reads every key, 100 a call, all calls at once; keys DynamoDB leaves unprocessed (or whose
    /// call was throttled) are read again after a backoff.
    pub(super) async fn get_all(
        &self,
        keys: &[ItemKey],
    ) -> Result<HashMap<ItemKey, Item>, StoreError> {
        let found = Mutex::new(HashMap::with_capacity(keys.len()));
        let failed = self
            .backoff
            .retry_rounds(keys.to_vec(), Deadline::NONE, |pending| {
                self.get_round(pending, &found)
            })
            .await;
        match failed.into_iter().next() {
            Some((_, err)) => Err(err),
            None => Ok(found.into_inner().expect("items read")),
        }
    }

    /// One round of reads; a call refused for good fails the whole read.
    async fn get_round(
        &self,
        pending: Vec<ItemKey>,
        found: &Mutex<HashMap<ItemKey, Item>>,
    ) -> Round<ItemKey, StoreError> {
        let calls = pending
            .chunks(BATCH_GET_MAX)
            .map(|chunk| async move { (chunk, self.table.batch_get(chunk).await) });
        let mut round = Round::default();
        for (chunk, result) in join_all(calls).await {
            match result {
                Ok(output) => {
                    let mut found = found.lock().expect("items read");
                    for item in output.items {
                        if let Some(key) = ItemKey::of(&item) {
                            found.insert(key, item);
                        }
                    }
                    let left = StoreError::Throttled("left unprocessed by BatchGetItem".into());
                    round
                        .retry
                        .extend(output.unprocessed.into_iter().map(|k| (k, left.clone())));
                }
                Err(err) => chunk
                    .iter()
                    .for_each(|k| round.add_error(k.clone(), err.clone())),
            }
        }
        if !round.failed.is_empty() {
            round.failed.append(&mut round.retry);
        }
        round
    }

    /// Writes every request, 25 a call, all calls at once, retrying unprocessed ones. Returns the
    /// requests that could still not be written, with an error that says why (one no retry can
    /// fix if there is one).
    pub(super) async fn write_all(
        &self,
        requests: Vec<WriteRequest>,
    ) -> (Vec<WriteRequest>, Option<StoreError>) {
        let failed = self
            .backoff
            .retry_rounds(requests, Deadline::NONE, |pending| {
                self.write_round(pending)
            })
            .await;
        let err = failed
            .iter()
            .map(|(_, err)| err)
            .find(|err| !err.is_retryable())
            .or(failed.last().map(|(_, err)| err))
            .cloned();
        (
            failed.into_iter().map(|(request, _)| request).collect(),
            err,
        )
    }

    /// One round of writes; a call refused for good ends the writing.
    async fn write_round(&self, pending: Vec<WriteRequest>) -> Round<WriteRequest, StoreError> {
        let calls = pending
            .chunks(BATCH_WRITE_MAX)
            .map(|chunk| async move { (chunk, self.table.batch_write(chunk.to_vec()).await) });
        let mut round = Round::default();
        for (chunk, result) in join_all(calls).await {
            match result {
                Ok(unprocessed) => {
                    let left = StoreError::Throttled("left unprocessed by BatchWriteItem".into());
                    round
                        .retry
                        .extend(unprocessed.into_iter().map(|r| (r, left.clone())));
                }
                Err(err) => chunk
                    .iter()
                    .for_each(|r| round.add_error(r.clone(), err.clone())),
            }
        }
        if !round.failed.is_empty() {
            round.failed.append(&mut round.retry);
        }
        round
    }

    /// A conditional put, retried while the error is retryable. A timeout may come after the
    /// write was applied, so a conflict after a retry can be the put's own earlier attempt: the
    /// caller of a head put finds out from the head (see `commit::settle`).
    pub(super) async fn put_retrying(
        &self,
        item: &Item,
        expect: &Expect,
    ) -> Result<(), StoreError> {
        self.backoff
            .retry_call(|| self.table.put(item, expect))
            .await
    }

    /// A conditional update, retried while the error is retryable (it only ever sets the same
    /// attributes again: a retry after a lost response does no harm).
    pub(super) async fn update_retrying(
        &self,
        key: &ItemKey,
        attributes: &Item,
        expect: &Expect,
    ) -> Result<(), StoreError> {
        self.backoff
            .retry_call(|| self.table.update(key, attributes, expect))
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;

    use super::super::super::BatchGetOutput;
    use super::*;
    use crate::adapters::dynamodb::MemoryTable;
    use crate::adapters::retry::Backoff;
    use crate::ports::ManualClock;

    /// How the table answers the store's batch calls.
    #[derive(Clone, Copy)]
    enum Answer {
        RefuseReads,
        LeaveReadsUnprocessed,
        LeaveFirstReadUnprocessed,
        LeaveFirstWriteUnprocessed,
        ThrottlePuts,
    }

    /// The in-memory table, answering batch calls as `answer` says and counting them.
    struct Answering {
        inner: MemoryTable,
        answer: Answer,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl Table for Answering {
        async fn scan_page(
            &self,
            _: &str,
            _: &str,
            _: Option<&ItemKey>,
            _: usize,
        ) -> Result<super::super::super::ScanPage, StoreError> {
            unreachable!("the state store's reads and writes never scan")
        }

        async fn batch_get(&self, keys: &[ItemKey]) -> Result<BatchGetOutput, StoreError> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            let unprocessed = BatchGetOutput {
                items: Vec::new(),
                unprocessed: keys.to_vec(),
            };
            match self.answer {
                Answer::RefuseReads => Err(StoreError::Invalid("no such table".into())),
                Answer::LeaveReadsUnprocessed => Ok(unprocessed),
                Answer::LeaveFirstReadUnprocessed if call == 0 => Ok(unprocessed),
                _ => self.inner.batch_get(keys).await,
            }
        }
        async fn put(&self, item: &Item, expect: &Expect) -> Result<(), StoreError> {
            if let Answer::ThrottlePuts = self.answer {
                self.calls.fetch_add(1, Ordering::SeqCst);
                return Err(StoreError::Throttled("slow down".into()));
            }
            self.inner.put(item, expect).await
        }
        async fn update(&self, key: &ItemKey, a: &Item, e: &Expect) -> Result<(), StoreError> {
            self.inner.update(key, a, e).await
        }
        async fn batch_write(
            &self,
            requests: Vec<WriteRequest>,
        ) -> Result<Vec<WriteRequest>, StoreError> {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                return Ok(requests);
            }
            self.inner.batch_write(requests).await
        }
        async fn get(&self, key: &ItemKey) -> Result<Option<Item>, StoreError> {
            self.inner.get(key).await
        }
        async fn query_partition(&self, pk: &str) -> Result<Vec<Item>, StoreError> {
            self.inner.query_partition(pk).await
        }
    }

    fn store(answer: Answer, backoff: Backoff) -> DynamoStateStore<Answering> {
        let table = Answering {
            inner: MemoryTable::new(),
            answer,
            calls: AtomicUsize::new(0),
        };
        DynamoStateStore::new(Arc::new(table), ManualClock::at(0)).with_backoff(backoff)
    }

    fn keys() -> Vec<ItemKey> {
        vec![ItemKey {
            pk: "op#sig#k".into(),
            sk: "head".into(),
        }]
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_the_table_refuses_for_good_fails_at_once() {
        let store = store(Answer::RefuseReads, Backoff::default());
        let err = store.get_all(&keys()).await.unwrap_err();
        assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
        assert_eq!(store.table.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn keys_left_unprocessed_for_ever_are_given_up_after_the_attempts() {
        let backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1), 3);
        let store = store(Answer::LeaveReadsUnprocessed, backoff);
        let err = store.get_all(&keys()).await.unwrap_err();
        assert!(matches!(err, StoreError::Throttled(_)), "{err:?}");
        assert_eq!(store.table.calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_put_throttled_for_ever_is_tried_as_often_as_the_backoff_allows() {
        let backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1), 3);
        let store = store(Answer::ThrottlePuts, backoff);
        let item = keys()[0].to_item();
        let err = store.put_retrying(&item, &Expect::Anything).await;
        assert!(matches!(err, Err(StoreError::Throttled(_))), "{err:?}");
        assert_eq!(store.table.calls.load(Ordering::SeqCst), 3);
    }

    /// A backoff of one-second steps, seeded so that its first draw, were it the second step's,
    /// would wait longer than the first step allows: a test tells the steps apart with it.
    fn telling_steps_apart() -> (Backoff, Duration) {
        let base = Duration::from_secs(1);
        let backoff = |seed| Backoff::new(base, Duration::from_secs(3600), 3).seeded(seed);
        let seed = (0..100)
            .find(|&s| backoff(s).delay(1) > base)
            .expect("a seed");
        (backoff(seed), base)
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_retried_once_waits_no_longer_than_the_first_backoff_step() {
        let (backoff, base) = telling_steps_apart();
        let store = store(Answer::LeaveFirstReadUnprocessed, backoff);
        let start = tokio::time::Instant::now();
        store
            .get_all(&keys())
            .await
            .expect("read on the second call");
        assert_eq!(store.table.calls.load(Ordering::SeqCst), 2);
        assert!(start.elapsed() <= base, "waited {:?}", start.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_retried_once_waits_no_longer_than_the_first_backoff_step() {
        let (backoff, base) = telling_steps_apart();
        let store = store(Answer::LeaveFirstWriteUnprocessed, backoff);
        let item = ItemKey {
            pk: "op#sig#k".into(),
            sk: "seg#x".into(),
        }
        .to_item();
        let start = tokio::time::Instant::now();
        let (left, err) = store.write_all(vec![WriteRequest::Put(item)]).await;
        assert!(left.is_empty() && err.is_none(), "{err:?}");
        assert_eq!(store.table.calls.load(Ordering::SeqCst), 2);
        assert!(start.elapsed() <= base, "waited {:?}", start.elapsed());
    }
}
