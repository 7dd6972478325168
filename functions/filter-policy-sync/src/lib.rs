//! filter-policy-sync: applies the changes of consumers' policy tables (their DynamoDB streams,
//! NEW_AND_OLD_IMAGES) to the dynamic filter's state, where the filter picks them up within a
//! second (`dynamic_filter::store`).
//!
//! Each change goes through the runtime's changelog model: a MODIFY is the delete of the old
//! image then the insert of the new. Both steps of one subscription (one policy item) are written
//! as the one change they come to, the subscription as it now is, so that no filter ever sees it
//! missing in between; the filter's index takes a subscription out of the filter key it was
//! under when it is written under another, so a changed filter key leaves nothing behind. Steps
//! of two different subscriptions (a table whose items changed which subscription they hold)
//! are written apart, the removal first.
//!
//! Keyed by policy item (its table and its key there), so one item's changes apply in stream
//! order and exactly once (the runtime's watermarks); the filter state refuses a change older
//! than the one it holds, so nothing a retry repeats goes backwards either. The filter state
//! keeps each table's subscriptions apart (`dynamic_filter::index`): a consumer moving its
//! subscriptions from one table to another at any speed loses none. A policy item that is not a
//! valid subscription (malformed pattern, a queue its consumer does not own, a consumer other
//! than its table's) is dead-lettered with the reason and changes nothing.
//!
//! A consumer's own policy table (consumer.yaml) is named `POLICY_TABLE_PREFIX` and the consumer's
//! id: its items may only name that consumer, so a consumer given its table alone can subscribe
//! for no one else. A table named otherwise (the shared one) may hold any consumer's items.
//!
//! Environment: `STATE_TABLE` (the runtime's state), `FILTER_STATE_TABLE`, `DEAD_LETTER_SINK`;
//! optionally `CONSUMER_QUEUE_PREFIX` and `CONSUMER_QUEUES` (which queues each consumer owns:
//! `dynamic_filter::subscription::QueueOwnership`), `POLICY_TABLE_PREFIX`, and the executor's
//! variables (see `keyway::lambda::executor_config`).

// Functions of one step each: clippy.toml sets the threshold (tests, which read as scenarios,
// are left out).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

use dynamic_filter::index::{stream_revision, Revised};
use dynamic_filter::queue_ownership;
use dynamic_filter::store::FilterState;
use dynamic_filter::subscription::{
    Identity, QueueOwnership, Subscription, CONSUMER, SUBSCRIPTION,
};
use keyway::domain::changelog::dynamodb_changes;
use keyway::domain::item::item_to_dynamodb_json;
use keyway::domain::{AttrValue, Item, Payload, RowChange, SourceRecord};
use keyway::lambda::{
    executor_config, observed, sink_from, state_store_from, table_from, ConfigError, Env, Platform,
    SetupError, StreamHandler,
};
use keyway::operator::{SinkDescriptor, StateDescriptor};
use keyway::sources::dynamodb::stream_label_of;
use keyway::{Ctx, Executor, InvalidInput, KeyedOperator, ProcessError, Sink, Sinks};

/// Where the subscription changes go: the filter state.
pub const FILTER_STATE: Sink<Revised> = Sink::new("filter-state");

/// One change of one policy item.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyChange {
    /// The policy table, when the stream names it.
    pub table: Option<String>,
    /// The item's key attributes.
    pub keys: Item,
    /// Its stream's label and its sequence number (`index::stream_revision`).
    pub revision: String,
    /// The change as deletes and inserts of the item's images: a MODIFY is the delete of the old
    /// image, then the insert of the new.
    pub steps: Vec<RowChange<Item>>,
}

/// The operator: turns each policy item's changes into the subscription changes the filter state
/// holds, checked as the filter checks them.
#[derive(Clone, Debug, Default)]
pub struct PolicySync {
    /// Which queues each consumer owns: a subscription to any other queue is dead-lettered.
    pub queues: QueueOwnership,
    /// What the names of consumers' own policy tables start with; the rest is the consumer.
    pub table_prefix: Option<String>,
}

impl KeyedOperator for PolicySync {
    type Input = PolicyChange;

    fn name(&self) -> &str {
        "filter-policy-sync"
    }

    fn states(&self) -> Vec<StateDescriptor> {
        Vec::new()
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        vec![FILTER_STATE.descriptor()]
    }

    fn decode(&self, record: &SourceRecord) -> Result<PolicyChange, InvalidInput> {
        let Payload::Change(change) = &record.payload else {
            return Err(InvalidInput::new(
                "record",
                "expected a DynamoDB Streams change of a policy table",
            ));
        };
        Ok(PolicyChange {
            table: change.table.clone(),
            keys: change.keys.clone(),
            // Ordered by the table's stream first: a table made again streams anew.
            revision: stream_revision(
                stream_label_of(&record.origin).unwrap_or_default(),
                record.sequence.as_str(),
            ),
            // The old image a stream did not carry is not needed: a removal names only the
            // subscription, which the item's keys give.
            steps: dynamodb_changes(change, None)?,
        })
    }

    fn key(&self, change: &PolicyChange) -> String {
        let table = change.table.as_deref().unwrap_or("");
        format!("{table}/{}", item_to_dynamodb_json(&change.keys))
    }

    fn process(&self, ctx: &mut Ctx<'_>, change: PolicyChange) -> Result<(), ProcessError> {
        let key = ctx.key().to_owned();
        for revised in self.resolve(&change)? {
            ctx.emit(&FILTER_STATE, key.clone(), &revised)?;
        }
        Ok(())
    }
}

impl PolicySync {
    /// What a change comes to in the filter state: the subscription its item now holds, and the
    /// removal of the one it held before if that was another.
    pub fn resolve(&self, change: &PolicyChange) -> Result<Vec<Revised>, InvalidInput> {
        let table = change.table.clone().unwrap_or_default();
        let removal = |identity: Identity| Revised {
            table: table.clone(),
            identity,
            revision: change.revision.clone(),
            subscription: None,
        };
        let before = change
            .steps
            .iter()
            .find_map(|step| match step {
                RowChange::Delete(row) => Some(row),
                RowChange::Insert(_) => None,
            })
            .or(if change.steps.is_empty() {
                Some(&change.keys)
            } else {
                None
            });
        let before = before.map(identity_of).transpose()?;
        if let Some(identity) = &before {
            self.check_table(change, identity)?;
        }
        let Some(RowChange::Insert(row)) = change.steps.last() else {
            return Ok(before.map(removal).into_iter().collect());
        };
        let subscription = Subscription::from_item(row, &self.queues)?;
        self.check_table(change, &subscription.identity)?;
        let mut out: Vec<Revised> = before
            .filter(|identity| *identity != subscription.identity)
            .map(removal)
            .into_iter()
            .collect();
        out.push(Revised {
            table,
            identity: subscription.identity.clone(),
            revision: change.revision.clone(),
            subscription: Some(subscription),
        });
        Ok(out)
    }

    /// A consumer's own table holds its subscriptions only: neither made nor removed through it
    /// is any other consumer's.
    fn check_table(&self, change: &PolicyChange, identity: &Identity) -> Result<(), InvalidInput> {
        let owner = match (&change.table, &self.table_prefix) {
            (Some(table), Some(prefix)) => table.strip_prefix(prefix.as_str()),
            _ => None,
        };
        match owner {
            Some(owner) if owner != identity.consumer => Err(InvalidInput::new(
                CONSUMER,
                format!(
                    "{:?} in the policy table {:?} of consumer {owner:?}: a table's \
                     subscriptions are its consumer's",
                    identity.consumer,
                    change.table.as_deref().unwrap_or_default()
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// The subscription a policy item or its keys name.
fn identity_of(row: &Item) -> Result<Identity, InvalidInput> {
    let text = |name: &str| match row.get(name) {
        Some(AttrValue::S(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err(InvalidInput::new(
            name,
            "missing, empty or not a string (S)",
        )),
    };
    Ok(Identity {
        consumer: text(CONSUMER)?,
        id: text(SUBSCRIPTION)?,
    })
}

/// The function: the policy changes of every table mapped to it, into the filter state its
/// environment names.
pub fn handler(
    platform: &dyn Platform,
    env: &Env,
) -> Result<StreamHandler<PolicySync>, SetupError> {
    let filter_state = FilterState::new(
        table_from(platform, env, "FILTER_STATE_TABLE")?,
        platform.clock(),
    )
    .with_backoff(platform.backoff());
    let sinks = Sinks::new(sink_from(platform, env, "DEAD_LETTER_SINK")?)
        .with(&FILTER_STATE, std::sync::Arc::new(filter_state));
    let store = state_store_from(platform, env, "STATE_TABLE")?;
    let operator = sync_config(env)?;
    let executor = Executor::new(operator, store, sinks, platform.clock())?;
    Ok(StreamHandler::new(
        observed(executor, platform, env).with_config(executor_config(env)?),
    ))
}

/// The operator's settings from the environment.
pub fn sync_config(env: &Env) -> Result<PolicySync, ConfigError> {
    let set = |name: &str| env.get(name).filter(|t| !t.trim().is_empty());
    Ok(PolicySync {
        queues: queue_ownership(env)?,
        table_prefix: set("POLICY_TABLE_PREFIX").cloned(),
    })
}

#[cfg(test)]
mod tests {
    use dynamic_filter::index::revision;
    use dynamic_filter::subscription::Target;
    use keyway::domain::{Change, ChangeKind};

    use super::*;

    fn subscription(consumer: &str, filter_key: &str, queue: &str) -> Subscription {
        Subscription {
            identity: Identity {
                consumer: consumer.into(),
                id: format!("key#{filter_key}"),
            },
            target: Target::Key(filter_key.into()),
            queue: format!("keyway-{consumer}_{queue}"),
            pattern: None,
        }
    }

    fn change(
        kind: ChangeKind,
        old: Option<&Subscription>,
        new: Option<&Subscription>,
    ) -> PolicyChange {
        let some = old.or(new).unwrap();
        let keys = Item::from([
            (
                CONSUMER.to_owned(),
                AttrValue::S(some.identity.consumer.clone()),
            ),
            (
                SUBSCRIPTION.to_owned(),
                AttrValue::S(some.identity.id.clone()),
            ),
        ]);
        let change = Change {
            kind,
            table: Some("policies-live".into()),
            keys: keys.clone(),
            old_image: old.map(|s| s.to_item(1)),
            new_image: new.map(|s| s.to_item(2)),
            ttl_deletion: false,
        };
        PolicyChange {
            table: change.table.clone(),
            keys,
            revision: revision("7"),
            steps: dynamodb_changes(&change, None).unwrap(),
        }
    }

    fn live(out: &[Revised]) -> Vec<Option<String>> {
        out.iter()
            .map(|r| {
                let queue = |s: &Subscription| {
                    let prefix = format!("keyway-{}_", s.identity.consumer);
                    s.queue.strip_prefix(&prefix).unwrap_or(&s.queue).to_owned()
                };
                r.subscription.as_ref().map(queue)
            })
            .collect()
    }

    #[test]
    fn a_modification_of_one_subscription_is_written_as_the_subscription_it_now_is() {
        let old = subscription("live", "s1", "q1");
        let mut new = old.clone();
        new.queue = "keyway-live_q2".into();
        new.target = Target::Key("s2".into());
        let out = PolicySync::default()
            .resolve(&change(ChangeKind::Modify, Some(&old), Some(&new)))
            .unwrap();
        assert_eq!(live(&out), [Some("q2".to_owned())]);
        assert_eq!(out[0].revision, revision("7"));
    }

    #[test]
    fn a_removal_names_the_subscription_even_without_an_old_image() {
        let old = subscription("live", "s1", "q1");
        let mut keys_only = change(ChangeKind::Remove, Some(&old), None);
        keys_only.steps.clear();
        for removed in [change(ChangeKind::Remove, Some(&old), None), keys_only] {
            let out = PolicySync::default().resolve(&removed).unwrap();
            assert_eq!(live(&out), [None]);
            assert_eq!(out[0].identity, old.identity);
        }
    }

    #[test]
    fn an_item_that_changed_which_subscription_it_holds_removes_the_old_one_first() {
        let old = subscription("live", "s1", "q1");
        let mut new = subscription("live", "s1", "q2");
        new.identity.id = "renamed".into();
        let out = PolicySync::default()
            .resolve(&change(ChangeKind::Modify, Some(&old), Some(&new)))
            .unwrap();
        assert_eq!(live(&out), [None, Some("q2".to_owned())]);
        assert_eq!(out[0].identity, old.identity);
    }

    #[test]
    fn a_subscription_naming_another_consumer_than_its_table_is_refused_made_or_removed() {
        let sync = PolicySync {
            table_prefix: Some("policies-".into()),
            ..Default::default()
        };
        let stranger = subscription("audit", "s1", "q1");
        let e = sync
            .resolve(&change(ChangeKind::Insert, None, Some(&stranger)))
            .unwrap_err();
        assert_eq!(e.field, CONSUMER);
        assert!(e.problem.contains("of consumer \"live\""), "{e}");
        let e = sync
            .resolve(&change(ChangeKind::Remove, Some(&stranger), None))
            .unwrap_err();
        assert_eq!(e.field, CONSUMER, "nor is a removal of another's");
        let own = subscription("live", "s1", "q1");
        assert!(sync
            .resolve(&change(ChangeKind::Insert, None, Some(&own)))
            .is_ok());
    }

    #[test]
    fn a_table_not_named_by_the_prefix_holds_any_consumers_subscriptions() {
        let sync = PolicySync {
            table_prefix: Some("keyway-policies-".into()),
            ..Default::default()
        };
        let any = subscription("audit", "s1", "q1");
        assert!(sync
            .resolve(&change(ChangeKind::Insert, None, Some(&any)))
            .is_ok());
    }

    #[test]
    fn the_environment_names_a_malformed_registry() {
        let env: Env = [("CONSUMER_QUEUES".to_owned(), "[1]".to_owned())].into();
        let e = sync_config(&env).unwrap_err();
        assert_eq!(e.name, "CONSUMER_QUEUES");
    }
}
