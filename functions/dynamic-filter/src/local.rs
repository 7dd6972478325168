//! The policy table port on the embedded runtime's DynamoDB table, for the `keyway` command and
//! the tests.

use async_trait::async_trait;
use keyway::domain::{AttrValue, Item};
use keyway::local::LocalTable;
use keyway::ports::StoreError;

use crate::client::PolicyTable;
use crate::subscription::{Identity, CONSUMER, SUBSCRIPTION};

#[async_trait]
impl PolicyTable for LocalTable {
    async fn put(&self, item: Item) -> Result<(), StoreError> {
        self.put_item(item)
    }

    async fn delete(&self, identity: &Identity) -> Result<(), StoreError> {
        self.delete_item(&Item::from([
            (CONSUMER.to_owned(), AttrValue::S(identity.consumer.clone())),
            (SUBSCRIPTION.to_owned(), AttrValue::S(identity.id.clone())),
        ]))
    }

    async fn items_of(&self, consumer: &str) -> Result<Vec<Item>, StoreError> {
        Ok(self
            .items()
            .into_iter()
            .filter(|item| item.get(CONSUMER).and_then(AttrValue::as_s) == Some(consumer))
            .collect())
    }
}
