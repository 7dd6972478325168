//! A table a function may only read: every write is refused by name, as IAM refuses a role that
//! grants no writes. The embedded runtime gives a function that asks for read access
//! (`TableAccess::Read`) this wrapper, so that a function writing where its role cannot fails on a
//! laptop as it would on AWS.

use std::sync::Arc;

use async_trait::async_trait;

use super::{BatchGetOutput, Expect, ItemKey, ScanPage, Table, WriteRequest};
use crate::domain::Item;
use crate::ports::StoreError;

/// `inner`, read-only.
pub struct ReadOnlyTable {
    inner: Arc<dyn Table>,
    name: String,
}

impl ReadOnlyTable {
    /// `inner`, read-only; `name` is the table's name its refusals give.
    pub fn new(inner: Arc<dyn Table>, name: impl Into<String>) -> Self {
        Self {
            inner,
            name: name.into(),
        }
    }

    fn refused(&self, operation: &str) -> StoreError {
        StoreError::Invalid(format!(
            "{operation} on table {:?}: the function asked to read this table only, and its role grants no writes",
            self.name
        ))
    }
}

#[async_trait]
impl Table for ReadOnlyTable {
    async fn batch_get(&self, keys: &[ItemKey]) -> Result<BatchGetOutput, StoreError> {
        self.inner.batch_get(keys).await
    }

    async fn put(&self, _item: &Item, _expect: &Expect) -> Result<(), StoreError> {
        Err(self.refused("PutItem"))
    }

    async fn update(
        &self,
        _key: &ItemKey,
        _attributes: &Item,
        _expect: &Expect,
    ) -> Result<(), StoreError> {
        Err(self.refused("UpdateItem"))
    }

    async fn batch_write(
        &self,
        _requests: Vec<WriteRequest>,
    ) -> Result<Vec<WriteRequest>, StoreError> {
        Err(self.refused("BatchWriteItem"))
    }

    async fn get(&self, key: &ItemKey) -> Result<Option<Item>, StoreError> {
        self.inner.get(key).await
    }

    async fn query_partition(&self, pk: &str) -> Result<Vec<Item>, StoreError> {
        self.inner.query_partition(pk).await
    }

    async fn query_up_to(
        &self,
        pk: &str,
        sk_max: &str,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        self.inner.query_up_to(pk, sk_max, limit).await
    }

    async fn query_after(
        &self,
        pk: &str,
        after_sk: &str,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        self.inner.query_after(pk, after_sk, limit).await
    }

    async fn scan_page(
        &self,
        pk_prefix: &str,
        sk: &str,
        start: Option<&ItemKey>,
        limit: usize,
    ) -> Result<ScanPage, StoreError> {
        self.inner.scan_page(pk_prefix, sk, start, limit).await
    }

    async fn query_last(&self, pk: &str) -> Result<Option<Item>, StoreError> {
        self.inner.query_last(pk).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::dynamodb::MemoryTable;
    use crate::adapters::dynamodb::PK;
    use crate::domain::AttrValue;

    #[tokio::test]
    async fn a_read_only_table_reads_and_refuses_every_write_naming_the_table() {
        let inner = Arc::new(MemoryTable::new());
        let key = ItemKey {
            pk: "a".into(),
            sk: "b".into(),
        };
        inner.put(&key.to_item(), &Expect::Anything).await.unwrap();
        let table = ReadOnlyTable::new(inner, "FilterState");
        assert!(table.get(&key).await.unwrap().is_some());
        assert_eq!(table.query_partition("a").await.unwrap().len(), 1);
        let item: Item = [(PK.to_owned(), AttrValue::S("c".into()))].into();
        let refusals = [
            table.put(&item, &Expect::Anything).await.unwrap_err(),
            table
                .update(&key, &item, &Expect::Anything)
                .await
                .unwrap_err(),
            table.batch_write(Vec::new()).await.unwrap_err(),
        ];
        for refused in refusals {
            assert!(!refused.is_retryable());
            assert!(refused.to_string().contains("\"FilterState\""), "{refused}");
        }
    }
}
