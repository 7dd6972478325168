//! The store's requests to its table: batched reads and writes with their retries, and the head
//! put that finds out whether a write whose response was lost landed.

use std::collections::HashMap;

use futures::future::join_all;

use super::super::{Expect, ItemKey, Table, WriteRequest, BATCH_GET_MAX, BATCH_WRITE_MAX};
use super::DynamoStateStore;
use crate::domain::Item;
use crate::ports::StoreError;

impl<T: Table> DynamoStateStore<T> {
    /// Reads every key, 100 a call, all calls at once; keys DynamoDB leaves unprocessed (or whose
    /// call was throttled) are read again after a backoff.
    pub(super) async fn get_all(
        &self,
        keys: &[ItemKey],
    ) -> Result<HashMap<ItemKey, Item>, StoreError> {
        let mut found = HashMap::with_capacity(keys.len());
        let mut pending: Vec<ItemKey> = keys.to_vec();
        let mut attempt = 0;
        while !pending.is_empty() {
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
            if !retry.is_empty() {
                if attempt >= self.backoff.max_attempts {
                    return Err(last_error.unwrap_or_else(|| {
                        StoreError::Throttled(format!(
                            "{} keys still unprocessed after {attempt} attempts",
                            retry.len()
                        ))
                    }));
                }
                self.backoff.wait(attempt - 1).await;
            }
            pending = retry;
        }
        Ok(found)
    }

    /// Writes every request, 25 a call, all calls at once, retrying unprocessed ones. Returns the
    /// requests that could still not be written, with the last error.
    pub(super) async fn write_all(
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
            if !retry.is_empty() {
                if attempt >= self.backoff.max_attempts {
                    let err = last_error.unwrap_or_else(|| {
                        StoreError::Throttled(format!(
                            "{} writes still unprocessed after {attempt} attempts",
                            retry.len()
                        ))
                    });
                    return (retry, Some(err));
                }
                self.backoff.wait(attempt - 1).await;
            }
            pending = retry;
        }
        (Vec::new(), None)
    }

    /// A conditional put, retried while the error is retryable. A timeout may come after the
    /// write was applied, so a conflict after a retry can be the put's own earlier attempt: the
    /// caller of a head put finds out from the head (see `commit::settle`).
    pub(super) async fn put_retrying(
        &self,
        item: &Item,
        expect: &Expect,
    ) -> Result<(), StoreError> {
        self.retrying(|| self.table.put(item, expect)).await
    }

    /// A conditional update, retried while the error is retryable (it only ever sets the same
    /// attributes again: a retry after a lost response does no harm).
    pub(super) async fn update_retrying(
        &self,
        key: &ItemKey,
        attributes: &Item,
        expect: &Expect,
    ) -> Result<(), StoreError> {
        self.retrying(|| self.table.update(key, attributes, expect))
            .await
    }

    /// `call`, again after a backoff while its error is retryable, up to the backoff's attempts.
    async fn retrying<F, Fut>(&self, call: F) -> Result<(), StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), StoreError>>,
    {
        let mut attempt = 0;
        loop {
            match call().await {
                Err(err) if err.is_retryable() && attempt + 1 < self.backoff.max_attempts => {
                    self.backoff.wait(attempt).await;
                    attempt += 1;
                }
                result => return result,
            }
        }
    }
}
