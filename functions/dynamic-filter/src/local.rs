//! The policy table port on the embedded runtime's DynamoDB table, for the `keyway` command and
//! the tests; and the port's contract, which the SDK's table keeps on the AWS emulator too.

use async_trait::async_trait;
use keyway::domain::{AttrValue, Item};
use keyway::ports::StoreError;
use keyway_local::LocalTable;

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

/// The `PolicyTable` contract, on a fresh table: an item put is listed for its consumer only and
/// replaced by a put of the same key; a delete removes it, and deleting what is not there is no
/// error.
pub async fn policy_table_contract(table: &dyn PolicyTable) {
    let item = |consumer: &str, id: &str, queue: &str| {
        Item::from([
            (CONSUMER.to_owned(), AttrValue::S(consumer.into())),
            (SUBSCRIPTION.to_owned(), AttrValue::S(id.into())),
            ("queue".to_owned(), AttrValue::S(queue.into())),
        ])
    };
    let queues = |items: Vec<Item>| -> Vec<String> {
        let mut queues: Vec<String> = items
            .iter()
            .filter_map(|i| i.get("queue").and_then(AttrValue::as_s).map(str::to_owned))
            .collect();
        queues.sort();
        queues
    };
    assert!(table.items_of("live").await.expect("list").is_empty());
    for (consumer, id, queue) in [
        ("live", "key#a", "q1"),
        ("live", "key#b", "q2"),
        ("audit", "all", "q3"),
    ] {
        table.put(item(consumer, id, queue)).await.expect("put");
    }
    table
        .put(item("live", "key#a", "q4"))
        .await
        .expect("replace");
    assert_eq!(
        queues(table.items_of("live").await.expect("list")),
        ["q2", "q4"]
    );
    let gone = Identity {
        consumer: "live".into(),
        id: "key#b".into(),
    };
    table.delete(&gone).await.expect("delete");
    table.delete(&gone).await.expect("deleting nothing");
    assert_eq!(queues(table.items_of("live").await.expect("list")), ["q4"]);
    assert_eq!(queues(table.items_of("audit").await.expect("list")), ["q3"]);
}

#[cfg(test)]
mod tests {
    use keyway_local::KeySchema;

    use super::*;

    #[tokio::test]
    async fn the_embedded_table_keeps_the_policy_table_contract() {
        let dynamodb =
            keyway_local::LocalDynamoDb::new(keyway::ports::ManualClock::at(0), Default::default());
        let schema = KeySchema {
            hash: CONSUMER.into(),
            range: Some(SUBSCRIPTION.into()),
        };
        let table = dynamodb.create_table(
            "policies",
            schema,
            None,
            Some(keyway_local::StreamView::NewAndOldImages),
        );
        policy_table_contract(table.as_ref()).await;
    }
}
