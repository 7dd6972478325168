//! Tables that fail as a process or a network can: a response lost after its write landed, a
//! process that dies between a commit's segments and its head.

use super::*;

/// A table that loses the response of chosen puts: the put lands, the caller hears a timeout.
pub struct LosingResponses<T> {
    inner: Arc<T>,
    lose: std::sync::atomic::AtomicUsize,
    meanwhile: std::sync::Mutex<Option<Meanwhile>>,
    before_put: std::sync::Mutex<Option<Meanwhile>>,
}

impl<T> LosingResponses<T> {
    /// `inner`, losing no response until told to.
    pub fn new(inner: Arc<T>) -> Self {
        Self {
            inner,
            lose: std::sync::atomic::AtomicUsize::new(0),
            meanwhile: std::sync::Mutex::new(None),
            before_put: std::sync::Mutex::new(None),
        }
    }

    /// `meanwhile` (another writer's commit, say) runs before the next put is made.
    pub(crate) fn before_next_put(&self, meanwhile: Meanwhile) {
        *self.before_put.lock().unwrap() = Some(meanwhile);
    }

    /// The next `n` puts that land report a timeout instead.
    pub fn lose_next(&self, n: usize) {
        self.lose.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// The next put that lands reports a timeout, and only once `meanwhile` (another writer's
    /// commit, say) has run.
    pub(crate) fn lose_next_while(&self, meanwhile: Meanwhile) {
        *self.meanwhile.lock().unwrap() = Some(meanwhile);
        self.lose_next(1);
    }
}

#[async_trait::async_trait]
impl<T: Table> Table for LosingResponses<T> {
    async fn scan_page(
        &self,
        pk_prefix: &str,
        sk: &str,
        start: Option<&ItemKey>,
        limit: usize,
    ) -> Result<keyway::adapters::dynamodb::ScanPage, StoreError> {
        self.inner.scan_page(pk_prefix, sk, start, limit).await
    }

    async fn batch_get(
        &self,
        keys: &[ItemKey],
    ) -> Result<keyway::adapters::dynamodb::BatchGetOutput, StoreError> {
        self.inner.batch_get(keys).await
    }

    async fn put(&self, item: &Item, expect: &Expect) -> Result<(), StoreError> {
        let before = self.before_put.lock().unwrap().take();
        if let Some(before) = before {
            before.await;
        }
        self.inner.put(item, expect).await?;
        let lost = self
            .lose
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            )
            .is_ok();
        if lost {
            let meanwhile = self.meanwhile.lock().unwrap().take();
            if let Some(meanwhile) = meanwhile {
                meanwhile.await;
            }
            return Err(StoreError::Unavailable("the response was lost".into()));
        }
        Ok(())
    }

    async fn update(
        &self,
        key: &ItemKey,
        attributes: &Item,
        expect: &Expect,
    ) -> Result<(), StoreError> {
        self.inner.update(key, attributes, expect).await
    }

    async fn batch_write(
        &self,
        requests: Vec<WriteRequest>,
    ) -> Result<Vec<WriteRequest>, StoreError> {
        self.inner.batch_write(requests).await
    }

    async fn get(&self, key: &ItemKey) -> Result<Option<Item>, StoreError> {
        self.inner.get(key).await
    }

    async fn query_partition(&self, pk: &str) -> Result<Vec<Item>, StoreError> {
        self.inner.query_partition(pk).await
    }
}

/// A table whose process dies right after writing segments, before the head that references them.
pub(super) struct CrashingAfterSegments<T>(pub(super) Arc<T>);

#[async_trait::async_trait]
impl<T: Table> Table for CrashingAfterSegments<T> {
    async fn scan_page(
        &self,
        pk_prefix: &str,
        sk: &str,
        start: Option<&ItemKey>,
        limit: usize,
    ) -> Result<keyway::adapters::dynamodb::ScanPage, StoreError> {
        self.0.scan_page(pk_prefix, sk, start, limit).await
    }

    async fn batch_get(
        &self,
        keys: &[ItemKey],
    ) -> Result<keyway::adapters::dynamodb::BatchGetOutput, StoreError> {
        self.0.batch_get(keys).await
    }

    async fn put(&self, item: &Item, expect: &Expect) -> Result<(), StoreError> {
        self.0.put(item, expect).await
    }

    async fn update(
        &self,
        key: &ItemKey,
        attributes: &Item,
        expect: &Expect,
    ) -> Result<(), StoreError> {
        self.0.update(key, attributes, expect).await
    }

    async fn batch_write(
        &self,
        requests: Vec<WriteRequest>,
    ) -> Result<Vec<WriteRequest>, StoreError> {
        let puts = requests.iter().any(|r| matches!(r, WriteRequest::Put(_)));
        let left = self.0.batch_write(requests).await;
        if puts && left.as_ref().is_ok_and(Vec::is_empty) {
            crate::services::faults::crash();
        }
        left
    }

    async fn get(&self, key: &ItemKey) -> Result<Option<Item>, StoreError> {
        self.0.get(key).await
    }

    async fn query_partition(&self, pk: &str) -> Result<Vec<Item>, StoreError> {
        self.0.query_partition(pk).await
    }
}
