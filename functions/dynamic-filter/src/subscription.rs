//! Subscriptions: what a consumer asks for (events of one filter key, or all events, optionally
//! narrowed by a pattern, delivered to one of its queues), and the item of a policy table that
//! holds one.
//!
//! A policy table has the key `consumer` (S, hash) and `subscription` (S, range): the client
//! names a subscription to a filter key `key#<filter key>` and one to all events `all`, so that
//! subscribing again to the same (consumer, key) replaces it. The filter key itself is the
//! `filterKey` attribute, not the item's key: a table written by other means may move a
//! subscription to another filter key, and the changelog's delete-then-insert leaves nothing
//! behind at the old one.
//!
//! Attributes: `filterKey` (S; absent for all events), `allEvents` (BOOL true for all events),
//! `queue` (S, a queue name), `pattern` (S, an SNS filter policy as JSON text; absent matches
//! everything), `updatedAt` (N, epoch milliseconds, informational).

use std::collections::{BTreeMap, BTreeSet};

use keyway::domain::pattern::{Pattern, PatternError};
use keyway::domain::{AttrValue, InvalidInput, Item};
use serde::{Deserialize, Serialize};

/// The policy table's hash key (S): the consumer's id.
pub const CONSUMER: &str = "consumer";
/// The policy table's range key (S): the subscription's id, `key#<filter key>` or `all` for the
/// client's.
pub const SUBSCRIPTION: &str = "subscription";
/// The filter key whose events the subscription receives (S); absent for all events.
pub const FILTER_KEY: &str = "filterKey";
/// `true` (BOOL) for a subscription to all events.
pub const ALL_EVENTS: &str = "allEvents";
/// The name of the queue the events go to (S).
pub const QUEUE: &str = "queue";
/// The SNS filter policy events must match, as JSON text (S); absent matches every event.
pub const PATTERN: &str = "pattern";
/// When the item was last written (N, epoch milliseconds); informational.
pub const UPDATED_AT: &str = "updatedAt";
/// The largest pattern, as JSON text: SNS's limit on a filter policy. It also keeps a
/// subscription, and the journal entry carrying it, well inside DynamoDB's 400 KB items.
pub const MAX_PATTERN_BYTES: usize = 256 * 1024;

/// What a subscription receives.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Target {
    /// The events of one filter key.
    Key(String),
    /// Every event (the broadcast set).
    All,
}

impl Target {
    /// The `subscription` attribute the client gives a subscription to this target.
    pub fn subscription_id(&self) -> String {
        match self {
            Target::Key(key) => format!("key#{key}"),
            Target::All => "all".to_owned(),
        }
    }
}

/// Which subscription a change is about: the policy item it comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Identity {
    /// The consumer's id: the item's `consumer` attribute.
    pub consumer: String,
    /// The item's `subscription` attribute.
    pub id: String,
}

impl Identity {
    /// A string that names the identity unambiguously, whatever its parts contain.
    pub fn key(&self) -> String {
        format!("{}:{}{}", self.consumer.len(), self.consumer, self.id)
    }
}

/// A valid subscription.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Subscription {
    /// The policy item that holds the subscription.
    pub identity: Identity,
    /// The events it receives: one filter key's, or all.
    pub target: Target,
    /// The name of the consumer's queue the matching events go to.
    pub queue: String,
    /// The filter policy as written; `None` matches every event of the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<serde_json::Value>,
}

impl Subscription {
    /// The subscription a policy item holds, checked: its pattern compiles and its consumer owns
    /// its queue. What is wrong is named by attribute.
    pub fn from_item(item: &Item, queues: &QueueOwnership) -> Result<Self, InvalidInput> {
        let text = |name: &str| -> Result<Option<&str>, InvalidInput> {
            match item.get(name) {
                None => Ok(None),
                Some(AttrValue::S(s)) => Ok(Some(s.as_str())),
                Some(_) => Err(InvalidInput::new(name, "expected a string (S)")),
            }
        };
        let required = |name: &str| {
            text(name)?
                .filter(|s| !s.is_empty())
                .ok_or_else(|| InvalidInput::new(name, "missing or empty"))
        };
        let identity = Identity {
            consumer: required(CONSUMER)?.to_owned(),
            id: required(SUBSCRIPTION)?.to_owned(),
        };
        let all = match item.get(ALL_EVENTS) {
            None | Some(AttrValue::Bool(false)) => false,
            Some(AttrValue::Bool(true)) => true,
            Some(_) => return Err(InvalidInput::new(ALL_EVENTS, "expected a boolean (BOOL)")),
        };
        let target = match (all, text(FILTER_KEY)?) {
            (true, None) => Target::All,
            (false, Some(key)) if !key.is_empty() => Target::Key(key.to_owned()),
            (true, Some(_)) => {
                return Err(InvalidInput::new(
                    FILTER_KEY,
                    "a subscription to all events has no filter key",
                ))
            }
            (false, _) => {
                return Err(InvalidInput::new(
                    FILTER_KEY,
                    "missing: name a filter key, or set allEvents to true",
                ))
            }
        };
        let queue = required(QUEUE)?.to_owned();
        let pattern = text(PATTERN)?
            .map(|text| {
                if text.len() > MAX_PATTERN_BYTES {
                    return Err(InvalidInput::new(
                        PATTERN,
                        format!(
                            "{} bytes; a filter policy may have at most {MAX_PATTERN_BYTES}",
                            text.len()
                        ),
                    ));
                }
                let value: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| InvalidInput::new(PATTERN, format!("not JSON: {e}")))?;
                Pattern::parse(&value).map_err(|e| InvalidInput::new(PATTERN, e.to_string()))?;
                Ok(value)
            })
            .transpose()?;
        let subscription = Self {
            identity,
            target,
            queue,
            pattern,
        };
        queues.check(&subscription.identity.consumer, &subscription.queue)?;
        Ok(subscription)
    }

    /// The policy item that holds this subscription.
    pub fn to_item(&self, updated_at_millis: i64) -> Item {
        let mut item = Item::new();
        let mut put = |name: &str, value: AttrValue| item.insert(name.to_owned(), value);
        put(CONSUMER, AttrValue::S(self.identity.consumer.clone()));
        put(SUBSCRIPTION, AttrValue::S(self.identity.id.clone()));
        match &self.target {
            Target::Key(key) => put(FILTER_KEY, AttrValue::S(key.clone())),
            Target::All => put(ALL_EVENTS, AttrValue::Bool(true)),
        };
        put(QUEUE, AttrValue::S(self.queue.clone()));
        if let Some(pattern) = &self.pattern {
            put(PATTERN, AttrValue::S(pattern.to_string()));
        }
        put(UPDATED_AT, AttrValue::N(updated_at_millis.to_string()));
        item
    }

    /// The compiled pattern (everything without one). A subscription is made only from a
    /// pattern that compiles, but one read back from storage is not trusted to.
    pub fn compiled_pattern(&self) -> Result<Pattern, PatternError> {
        self.pattern
            .as_ref()
            .map_or_else(|| Ok(Pattern::everything()), Pattern::parse)
    }
}

/// Which queues a consumer may deliver to, checked for every subscription by the client, by
/// filter-policy-sync and again by the filter: a consumer owns the queues named with the stack's
/// `ConsumerQueuePrefix`, its id and an underscore (`keyway-live_events`, `keyway-live_alerts.fifo`
/// for consumer `live`), and only those of them the stack's `ConsumerQueues` lists for it where
/// that registry is given.
///
/// Consumer ids are letters, digits and hyphens, so the underscore ends the id unambiguously: no
/// consumer can claim another's queue (`live` cannot name `keyway-live-x_events`, which is
/// `live-x`'s). Who the consumer is, the policy table says: a consumer's own table proves it;
/// the shared table holds its writers' word, and only writers trusted with every consumer should
/// have it. And no queue CloudFormation names for a stack ever holds an underscore (stack
/// names, logical ids and its random suffixes have none): the stack's dead-letter and
/// failed-batches queues are no consumer's, and the filter's role, which grants
/// `ConsumerQueuePrefix*_*`, cannot reach them through a consumer's subscription either.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueOwnership {
    prefix: String,
    registry: Option<BTreeMap<String, BTreeSet<String>>>,
}

/// The stack's `ConsumerQueuePrefix` by default.
pub const DEFAULT_QUEUE_PREFIX: &str = "keyway-";
/// The longest consumer id: with the prefix, the underscore and a name, a queue name still fits
/// SQS's 80 characters.
pub const MAX_CONSUMER_LEN: usize = 40;
/// SQS's longest queue name.
const MAX_QUEUE_LEN: usize = 80;

impl Default for QueueOwnership {
    fn default() -> Self {
        Self::new(DEFAULT_QUEUE_PREFIX)
    }
}

/// A registry that names a queue its consumer cannot own.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipError {
    /// The registry is not a JSON object of consumer id to queue names: the parser's error.
    #[error("expected a JSON object of consumer id to a list of queue names: {0}")]
    NotARegistry(String),
    /// The registry names a consumer id that is not valid, or a queue its consumer cannot own.
    #[error("{0}")]
    NotOwned(InvalidInput),
}

impl QueueOwnership {
    /// Queues named `prefix`, the consumer's id, `_` and a name.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            registry: None,
        }
    }

    /// Narrowed to the queues a JSON object of consumer id to queue names lists, each of which
    /// must be named as its consumer's.
    pub fn with_registry(mut self, json: &str) -> Result<Self, OwnershipError> {
        let registry: BTreeMap<String, BTreeSet<String>> =
            serde_json::from_str(json).map_err(|e| OwnershipError::NotARegistry(e.to_string()))?;
        for (consumer, queues) in &registry {
            check_consumer(consumer).map_err(OwnershipError::NotOwned)?;
            for queue in queues {
                self.named_for(consumer, queue)
                    .map_err(OwnershipError::NotOwned)?;
            }
        }
        self.registry = Some(registry);
        Ok(self)
    }

    /// The prefix of every consumer's queue names: the stack's `ConsumerQueuePrefix`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether `consumer` may deliver to `queue`, or why not.
    pub fn check(&self, consumer: &str, queue: &str) -> Result<(), InvalidInput> {
        check_consumer(consumer)?;
        self.named_for(consumer, queue)?;
        let Some(registry) = &self.registry else {
            return Ok(());
        };
        match registry.get(consumer) {
            Some(queues) if queues.contains(queue) => Ok(()),
            Some(queues) => Err(InvalidInput::new(
                QUEUE,
                format!(
                    "{queue:?} is not registered to consumer {consumer:?} (its queues: {})",
                    queues.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            )),
            None => Err(InvalidInput::new(
                CONSUMER,
                format!("{consumer:?} has no queues registered"),
            )),
        }
    }

    /// Whether `queue` is named as one of `consumer`'s.
    fn named_for(&self, consumer: &str, queue: &str) -> Result<(), InvalidInput> {
        let name = queue
            .strip_prefix(self.prefix.as_str())
            .and_then(|rest| rest.strip_prefix(consumer))
            .and_then(|rest| rest.strip_prefix('_'))
            .map(|rest| rest.strip_suffix(".fifo").unwrap_or(rest));
        let valid = |name: &str| {
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        match name {
            Some(name) if valid(name) && queue.len() <= MAX_QUEUE_LEN => Ok(()),
            _ => Err(InvalidInput::new(
                QUEUE,
                format!(
                    "{queue:?} is not a queue of consumer {consumer:?}: its queues are named \
                     \"{}{consumer}_<name>\" (letters, digits, '-' and '_', optionally .fifo; \
                     {MAX_QUEUE_LEN} characters in all)",
                    self.prefix
                ),
            )),
        }
    }
}

/// A consumer id: 1 to `MAX_CONSUMER_LEN` letters, digits and hyphens (see `QueueOwnership`).
pub fn check_consumer(consumer: &str) -> Result<(), InvalidInput> {
    let valid = !consumer.is_empty()
        && consumer.len() <= MAX_CONSUMER_LEN
        && consumer
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(InvalidInput::new(
            CONSUMER,
            format!(
                "{consumer:?}: a consumer id is 1 to {MAX_CONSUMER_LEN} letters, digits and hyphens"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn keyed(pattern: Option<serde_json::Value>) -> Subscription {
        Subscription {
            identity: Identity {
                consumer: "live".into(),
                id: "key#sheet-1".into(),
            },
            target: Target::Key("sheet-1".into()),
            queue: "keyway-live_events".into(),
            pattern,
        }
    }

    #[test]
    fn a_subscription_reads_back_from_the_item_it_writes() {
        let open = QueueOwnership::default();
        for subscription in [
            keyed(None),
            keyed(Some(json!({"type": [{"prefix": "row."}]}))),
            Subscription {
                target: Target::All,
                ..keyed(None)
            },
        ] {
            let item = subscription.to_item(1);
            assert_eq!(Subscription::from_item(&item, &open).unwrap(), subscription);
        }
    }

    #[test]
    fn a_malformed_pattern_is_refused_naming_the_attribute_and_the_place_in_it() {
        let mut item = keyed(None).to_item(1);
        item.insert(
            PATTERN.into(),
            AttrValue::S(r#"{"type": [{"prefx": "row."}]}"#.into()),
        );
        let e = Subscription::from_item(&item, &QueueOwnership::default()).unwrap_err();
        assert_eq!(e.field, PATTERN);
        assert!(e.problem.contains("/type/0/prefx"), "{e}");
        item.insert(PATTERN.into(), AttrValue::S("{".into()));
        let e = Subscription::from_item(&item, &QueueOwnership::default()).unwrap_err();
        assert!(e.problem.starts_with("not JSON"), "{e}");
        // Ten times a large policy: refused before it could outgrow an item.
        let huge = json!({"op": ["x".repeat(MAX_PATTERN_BYTES)]}).to_string();
        item.insert(PATTERN.into(), AttrValue::S(huge));
        let e = Subscription::from_item(&item, &QueueOwnership::default()).unwrap_err();
        assert!(e.problem.contains("at most 262144"), "{e}");
    }

    #[test]
    fn a_queue_not_named_as_the_consumers_or_not_in_its_registry_is_refused() {
        let default = QueueOwnership::default();
        let item = keyed(None).to_item(1);
        assert!(Subscription::from_item(&item, &default).is_ok());
        let refused = |consumer: &str, queue: &str, queues: &QueueOwnership| {
            let mut other = keyed(None);
            other.identity.consumer = consumer.into();
            other.queue = queue.into();
            Subscription::from_item(&other.to_item(1), queues).unwrap_err()
        };
        for queue in [
            "keyway-audit_trail",
            "keyway-live-x_events",
            "keyway-live",
            "keyway-live_",
            "keyway-DeadLetterQueue-1X2Y3Z4W5V6U",
            "live_events",
            "keyway-live_a.b",
            &format!("keyway-live_{}", "x".repeat(80)),
        ] {
            let e = refused("live", queue, &default);
            assert_eq!(e.field, QUEUE, "{queue}");
            assert!(
                e.problem
                    .contains("its queues are named \"keyway-live_<name>\""),
                "{e}"
            );
        }
        for queue in ["keyway-live_events.fifo", "keyway-live_a-b_c"] {
            let mut mine = keyed(None);
            mine.queue = queue.into();
            assert!(
                Subscription::from_item(&mine.to_item(1), &default).is_ok(),
                "{queue}"
            );
        }
        for consumer in ["live_x", "a.b", "", &"x".repeat(MAX_CONSUMER_LEN + 1)] {
            let e = refused(consumer, "keyway-live_events", &default);
            assert_eq!(e.field, CONSUMER, "{consumer:?}");
        }

        let registry = QueueOwnership::default()
            .with_registry(r#"{"live": ["keyway-live_events"], "audit": ["keyway-audit_trail"]}"#)
            .unwrap();
        assert!(Subscription::from_item(&item, &registry).is_ok());
        let e = refused("live", "keyway-live_other", &registry);
        assert!(
            e.problem
                .contains("\"keyway-live_other\" is not registered to consumer \"live\""),
            "{e}"
        );
        let e = refused("stranger", "keyway-stranger_q", &registry);
        assert_eq!(e.field, CONSUMER);
    }

    #[test]
    fn a_registry_that_gives_a_consumer_a_queue_named_as_anothers_is_refused() {
        let e = QueueOwnership::default()
            .with_registry(r#"{"live": ["keyway-audit_trail"]}"#)
            .unwrap_err();
        assert!(
            e.to_string().contains("not a queue of consumer \"live\""),
            "{e}"
        );
        let e = QueueOwnership::default()
            .with_registry(r#"{"live_x": ["keyway-live_x_q"]}"#)
            .unwrap_err();
        assert!(e.to_string().contains("a consumer id is"), "{e}");
        let e = QueueOwnership::default().with_registry("[1]").unwrap_err();
        assert!(matches!(e, OwnershipError::NotARegistry(_)), "{e}");
    }

    #[test]
    fn an_item_without_a_target_or_with_two_is_refused() {
        let mut item = keyed(None).to_item(1);
        item.remove(FILTER_KEY);
        let e = Subscription::from_item(&item, &QueueOwnership::default()).unwrap_err();
        assert_eq!(e.field, FILTER_KEY);
        item.insert(FILTER_KEY.into(), AttrValue::S("sheet-1".into()));
        item.insert(ALL_EVENTS.into(), AttrValue::Bool(true));
        let e = Subscription::from_item(&item, &QueueOwnership::default()).unwrap_err();
        assert!(e.problem.contains("no filter key"), "{e}");
    }

    #[test]
    fn identities_name_consumer_and_id_unambiguously() {
        let a = Identity {
            consumer: "a#".into(),
            id: "b".into(),
        };
        let b = Identity {
            consumer: "a".into(),
            id: "#b".into(),
        };
        assert_ne!(a.key(), b.key());
    }
}
