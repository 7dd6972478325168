//! The subscription client: what a consumer calls to start and stop receiving events, a thin
//! layer over its policy table. A subscription is checked before it is written, by the same code
//! filter-policy-sync checks it with: a malformed pattern or a queue the consumer does not own
//! is refused here, saying what is wrong and where, and never reaches the filter.
//!
//! `PolicyTable` is the narrow port: DynamoDB through the SDK (`SdkPolicyTable`), or the
//! embedded runtime's table.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use keyway::adapters::dynamodb::{item_from_sdk, item_to_sdk, sdk_store_error};
use keyway::domain::{AttrValue, InvalidInput, Item};
use keyway::ports::{Clock, StoreError};
use serde::Serialize;
use serde_json::Value;

use crate::index::ALL_EVENTS_PER_CONSUMER;
use crate::subscription::{Identity, QueueOwnership, Subscription, Target, CONSUMER, SUBSCRIPTION};

/// Why a call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The subscription is not valid: the same call will be refused again.
    #[error("subscription refused: {0}")]
    Refused(#[from] InvalidInput),
    /// The policy table could not be read or written.
    #[error("policy table: {0}")]
    Store(#[from] StoreError),
}

impl ClientError {
    /// Whether the same call may succeed later: the policy table's failure was transient
    /// (throttled, or unavailable for a moment).
    pub fn is_retryable(&self) -> bool {
        matches!(self, ClientError::Store(e) if e.is_retryable())
    }
}

/// A consumer's items in its policy table, as the filter takes them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Listing {
    /// The subscriptions the filter applies, by identity.
    pub subscriptions: Vec<Subscription>,
    /// The items the filter holds back, with why.
    pub held_back: Vec<HeldBack>,
}

/// An item the filter does not apply, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeldBack {
    /// The item's subscription id (its sort key).
    pub subscription: String,
    /// Why the filter does not apply it: what is wrong with the item.
    pub reason: String,
}

/// A policy table: items keyed by `consumer` and `subscription`.
#[async_trait]
pub trait PolicyTable: Send + Sync {
    /// Writes `item`, replacing any item with the same key.
    async fn put(&self, item: Item) -> Result<(), StoreError>;
    /// Deletes the item of `identity`; deleting an item that is not there is no error.
    async fn delete(&self, identity: &Identity) -> Result<(), StoreError>;
    /// Every item of `consumer`, by a strongly consistent read.
    async fn items_of(&self, consumer: &str) -> Result<Vec<Item>, StoreError>;
}

/// One consumer's subscriptions.
pub struct SubscriptionClient {
    table: Arc<dyn PolicyTable>,
    consumer: String,
    queues: QueueOwnership,
    clock: Arc<dyn Clock>,
}

impl SubscriptionClient {
    /// The client of `consumer`'s subscriptions in `table`: each checked against the queues
    /// `queues` lets it own, and stamped with the time `clock` tells.
    pub fn new(
        table: Arc<dyn PolicyTable>,
        consumer: impl Into<String>,
        queues: QueueOwnership,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            table,
            consumer: consumer.into(),
            queues,
            clock,
        }
    }

    /// Starts (or, subscribed already, changes) the delivery of `key`'s events that match
    /// `pattern` (all of them without one) to `queue`.
    pub async fn subscribe(
        &self,
        key: &str,
        queue: &str,
        pattern: Option<Value>,
    ) -> Result<Subscription, ClientError> {
        if key.is_empty() {
            return Err(InvalidInput::new("key", "a filter key cannot be empty").into());
        }
        self.put(Target::Key(key.to_owned()), queue, pattern).await
    }

    /// Stops the delivery of `key`'s events; not subscribed to it, does nothing.
    pub async fn unsubscribe(&self, key: &str) -> Result<(), ClientError> {
        let id = Target::Key(key.to_owned()).subscription_id();
        Ok(self.table.delete(&self.identity(id)).await?)
    }

    /// Starts (or changes) the delivery of every event that matches `pattern` to `queue`.
    pub async fn listen_to_all_events(
        &self,
        queue: &str,
        pattern: Option<Value>,
    ) -> Result<Subscription, ClientError> {
        self.put(Target::All, queue, pattern).await
    }

    /// Stops the delivery of every event that `listen_to_all_events` started; not listening, does
    /// nothing.
    pub async fn stop_listening_to_all(&self) -> Result<(), ClientError> {
        let id = Target::All.subscription_id();
        Ok(self.table.delete(&self.identity(id)).await?)
    }

    /// The consumer's subscriptions the filter applies, as its table holds them (`listing` has
    /// the ones it holds back too).
    pub async fn list(&self) -> Result<Vec<Subscription>, ClientError> {
        Ok(self.listing().await?.subscriptions)
    }

    /// The consumer's items in its table: the subscriptions the filter applies, and the items it
    /// holds back (written by other means, or to a queue the consumer does not own), with why.
    pub async fn listing(&self) -> Result<Listing, ClientError> {
        let items = self.table.items_of(&self.consumer).await?;
        let mut listing = Listing::default();
        for item in &items {
            match Subscription::from_item(item, &self.queues) {
                Ok(subscription) => listing.subscriptions.push(subscription),
                Err(why) => listing.held_back.push(HeldBack {
                    subscription: match item.get(SUBSCRIPTION) {
                        Some(AttrValue::S(id)) => id.clone(),
                        other => format!("{other:?}"),
                    },
                    reason: why.to_string(),
                }),
            }
        }
        listing
            .subscriptions
            .sort_by(|a, b| a.identity.cmp(&b.identity));
        // As the filter holds them (`index::ALL_EVENTS_PER_CONSUMER`), counted in this table.
        let mut all_events = 0;
        let held_back = &mut listing.held_back;
        listing.subscriptions.retain(|s| {
            if s.target != Target::All {
                return true;
            }
            all_events += 1;
            if all_events <= ALL_EVENTS_PER_CONSUMER {
                return true;
            }
            held_back.push(HeldBack {
                subscription: s.identity.id.clone(),
                reason: format!(
                    "a subscription to all events after the consumer's first \
                     {ALL_EVENTS_PER_CONSUMER}, which alone the filter applies"
                ),
            });
            false
        });
        Ok(listing)
    }

    async fn put(
        &self,
        target: Target,
        queue: &str,
        pattern: Option<Value>,
    ) -> Result<Subscription, ClientError> {
        let subscription = Subscription {
            identity: self.identity(target.subscription_id()),
            target,
            queue: queue.to_owned(),
            pattern,
        };
        let item = subscription.to_item(self.clock.now_millis());
        // Checked as filter-policy-sync will check it.
        Subscription::from_item(&item, &self.queues)?;
        self.table.put(item).await?;
        Ok(subscription)
    }

    fn identity(&self, id: String) -> Identity {
        Identity {
            consumer: self.consumer.clone(),
            id,
        }
    }
}

/// A policy table in DynamoDB.
pub struct SdkPolicyTable {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl SdkPolicyTable {
    /// The policy table named `table`, reached through `client`.
    pub fn new(client: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }
}

fn key_of(identity: &Identity) -> Item {
    Item::from([
        (CONSUMER.to_owned(), AttrValue::S(identity.consumer.clone())),
        (SUBSCRIPTION.to_owned(), AttrValue::S(identity.id.clone())),
    ])
}

#[async_trait]
impl PolicyTable for SdkPolicyTable {
    async fn put(&self, item: Item) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item_to_sdk(&item)))
            .send()
            .await
            .map_err(|e| sdk_store_error(&e))?;
        Ok(())
    }

    async fn delete(&self, identity: &Identity) -> Result<(), StoreError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(item_to_sdk(&key_of(identity))))
            .send()
            .await
            .map_err(|e| sdk_store_error(&e))?;
        Ok(())
    }

    async fn items_of(&self, consumer: &str) -> Result<Vec<Item>, StoreError> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("#c = :c")
                .expression_attribute_names("#c", CONSUMER)
                .expression_attribute_values(":c", AttributeValue::S(consumer.to_owned()))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| sdk_store_error(&e))?;
            for item in page.items() {
                items.push(item_from_sdk(item)?);
            }
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => return Ok(items),
            }
        }
    }
}
