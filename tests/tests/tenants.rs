//! Dynamic filtering against what tenants do that its authors did not plan for, on the stack of
//! template.yaml on the embedded runtime: a hostile consumer writing policy items by hand (not
//! through the client, which checks them) that name another consumer's queue or the stack's own
//! failure queues; consumers moving their subscriptions between policy tables, at any speed and
//! in any order; and ids that only 64-bit integers tell apart.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dynamic_filter::index::SubscriptionIndex;
use dynamic_filter::store::FilterState;
use dynamic_filter::subscription::{
    Identity, QueueOwnership, Subscription, Target, CONSUMER, QUEUE, SUBSCRIPTION,
};
use keyway::domain::{AttrValue, Item};
use keyway_local::{FaultPlan, LocalRuntime, LocalServices, LocalTable};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const EPOCH: i64 = 1_767_225_600_000;

/// Queues named as the stack's ConsumerQueuePrefix and their consumers' ids say they are theirs.
const LIVE_QUEUE: &str = "keyway-live_events";
const AUDIT_QUEUE: &str = "keyway-audit_trail";

struct Stack {
    runtime: LocalRuntime,
}

impl Stack {
    fn new() -> Self {
        let parameters = BTreeMap::from([("FilterShards".to_owned(), "2".to_owned())]);
        let services = LocalServices::new(EPOCH, FaultPlan::default());
        for queue in [LIVE_QUEUE, AUDIT_QUEUE, "keyway-mallory_loot"] {
            services.sqs.create_queue(queue);
        }
        let runtime = LocalRuntime::from_template_with(
            keyway_stack::TEMPLATE,
            &parameters,
            services,
            &keyway_stack::functions(),
        )
        .expect("the template runs");
        Self { runtime }
    }

    fn table(&self, name: &str) -> Arc<LocalTable> {
        self.runtime.services.dynamodb.table(name).expect("a table")
    }

    fn shared_table(&self) -> Arc<LocalTable> {
        self.table(&self.runtime.resource("PolicyTable").unwrap())
    }

    /// The name of the stack's queue `logical_id`.
    fn queue_name(&self, logical_id: &str) -> String {
        let url = self.runtime.resource(logical_id).unwrap();
        url.rsplit('/').next().unwrap().to_owned()
    }

    fn send(&self, events: &[Value]) {
        let stream = self.runtime.resource("FilterEventsStream").unwrap();
        for event in events {
            let key = event["key"].as_str().unwrap();
            let data = serde_json::to_vec(event).unwrap();
            self.runtime
                .services
                .kinesis
                .put_record(&stream, key, &data)
                .unwrap();
        }
    }

    async fn run(&mut self) {
        self.runtime
            .run_until_idle(Duration::from_secs(600))
            .await
            .expect("the stack goes idle");
    }

    /// The ids of the events a queue received since the last call.
    fn received(&self, queue: &str) -> Vec<String> {
        let mut ids = keyway_tests::received_ids(&self.runtime.services.sqs, queue);
        ids.sort();
        ids
    }

    /// Every message the queue `logical_id` received since the last call, as JSON.
    fn messages(&self, logical_id: &str) -> Vec<Value> {
        let url = self.runtime.resource(logical_id).unwrap();
        self.runtime
            .services
            .sqs
            .receive(&url, usize::MAX)
            .iter()
            .map(|m| serde_json::from_str(&m.body).unwrap_or(Value::Null))
            .collect()
    }

    fn filter_state(&self) -> FilterState {
        let name = self.runtime.resource("FilterStateTable").unwrap();
        FilterState::new(self.table(&name), self.runtime.services.clock.clone())
    }

    /// The index a filter builds from the filter state now.
    async fn index(&self) -> SubscriptionIndex {
        let (version, rows) = self.filter_state().snapshot().await.unwrap();
        SubscriptionIndex::from_snapshot(QueueOwnership::default(), version, rows)
    }
}

/// A policy item as a tenant writes it with PutItem, bypassing the client's checks.
fn policy_item(consumer: &str, key: &str, queue: &str, pattern: Option<Value>) -> Item {
    Subscription {
        identity: Identity {
            consumer: consumer.into(),
            id: Target::Key(key.into()).subscription_id(),
        },
        target: Target::Key(key.into()),
        queue: queue.into(),
        pattern,
    }
    .to_item(EPOCH)
}

fn item_key(consumer: &str, key: &str) -> Item {
    Item::from([
        (CONSUMER.to_owned(), AttrValue::S(consumer.into())),
        (
            SUBSCRIPTION.to_owned(),
            AttrValue::S(Target::Key(key.into()).subscription_id()),
        ),
    ])
}

fn event(id: &str, key: &str) -> Value {
    json!({"id": id, "key": key, "op": "update"})
}

/// Whether a message is a dead letter (and not an application event).
fn is_dead_letter(message: &Value) -> bool {
    message.get("field").is_some() && message.get("problem").is_some()
}

#[tokio::test(start_paused = true)]
async fn a_consumer_cannot_route_events_into_another_consumers_queue() {
    let mut stack = Stack::new();
    let shared = stack.shared_table();
    shared
        .put_item(policy_item("live", "sheet-1", LIVE_QUEUE, None))
        .unwrap();
    // Mallory writes in the shared table, where any consumer's items may be, naming live's and
    // audit's queues for the sheets it wants to flood them with.
    shared
        .put_item(policy_item("mallory", "sheet-2", LIVE_QUEUE, None))
        .unwrap();
    shared
        .put_item(policy_item("mallory", "sheet-3", AUDIT_QUEUE, None))
        .unwrap();
    stack.run().await;
    stack.send(&[
        event("a", "sheet-1"),
        event("b", "sheet-2"),
        event("c", "sheet-3"),
    ]);
    stack.run().await;
    assert_eq!(stack.received(LIVE_QUEUE), ["a"]);
    assert!(stack.received(AUDIT_QUEUE).is_empty());
    let letters = stack.messages("DeadLetterQueue");
    let refused: Vec<&Value> = letters
        .iter()
        .filter(|l| l["field"] == QUEUE && l["problem"].as_str().unwrap().contains("mallory"))
        .collect();
    assert_eq!(
        refused.len(),
        2,
        "each refused with its reason: {letters:?}"
    );
    assert!(
        refused[0]["problem"]
            .as_str()
            .unwrap()
            .contains("keyway-mallory_"),
        "the reason says how mallory's queues are named: {}",
        refused[0]["problem"]
    );
}

#[tokio::test(start_paused = true)]
async fn no_consumer_can_send_application_events_to_the_stacks_failure_queues() {
    let mut stack = Stack::new();
    let dead_letters = stack.queue_name("DeadLetterQueue");
    let failed_batches = stack.queue_name("FailedBatchesQueue");
    let shared = stack.shared_table();
    shared
        .put_item(policy_item("mallory", "sheet-1", &dead_letters, None))
        .unwrap();
    // In a consumer's own table too.
    let own = keyway_stack::deploy_consumer(&mut stack.runtime, "mallory").unwrap();
    stack
        .table(&own)
        .put_item(policy_item("mallory", "sheet-2", &failed_batches, None))
        .unwrap();
    stack.run().await;
    stack.send(&[event("a", "sheet-1"), event("b", "sheet-2")]);
    stack.run().await;
    let letters = stack.messages("DeadLetterQueue");
    assert!(
        letters.iter().all(is_dead_letter),
        "only dead letters on the dead-letter queue: {letters:?}"
    );
    assert_eq!(
        letters.iter().filter(|l| l["field"] == QUEUE).count(),
        2,
        "{letters:?}"
    );
    assert!(stack.messages("FailedBatchesQueue").is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_filter_delivers_to_no_queue_its_consumer_does_not_own_whatever_its_state_holds() {
    // The filter state written by other means than the policy sync (a hand edit, an old
    // release): the filter checks ownership again itself.
    let mut stack = Stack::new();
    let state = stack.filter_state();
    let hostile = dynamic_filter::index::Revised {
        table: "keyway-local-PolicyTable".into(),
        identity: Identity {
            consumer: "mallory".into(),
            id: "key#sheet-1".into(),
        },
        revision: dynamic_filter::index::revision("1"),
        subscription: Some(Subscription {
            identity: Identity {
                consumer: "mallory".into(),
                id: "key#sheet-1".into(),
            },
            target: Target::Key("sheet-1".into()),
            queue: LIVE_QUEUE.into(),
            pattern: None,
        }),
    };
    state.apply(&hostile).await.unwrap();
    // Beside it, live's own subscription, written the same way: the filter is running.
    let own = dynamic_filter::index::Revised {
        identity: Identity {
            consumer: "live".into(),
            id: "key#sheet-2".into(),
        },
        subscription: Some(Subscription {
            identity: Identity {
                consumer: "live".into(),
                id: "key#sheet-2".into(),
            },
            target: Target::Key("sheet-2".into()),
            queue: LIVE_QUEUE.into(),
            pattern: None,
        }),
        ..hostile.clone()
    };
    state.apply(&own).await.unwrap();
    stack.run().await;
    stack.send(&[event("a", "sheet-1"), event("b", "sheet-2")]);
    stack.run().await;
    assert_eq!(stack.received(LIVE_QUEUE), ["b"]);
}

/// `consumer`'s items in `table` as its client lists them, under the stack's queue prefix.
async fn listing_of(
    stack: &Stack,
    table: Arc<LocalTable>,
    consumer: &str,
) -> dynamic_filter::client::Listing {
    dynamic_filter::client::SubscriptionClient::new(
        table,
        consumer,
        QueueOwnership::new("keyway-"),
        stack.runtime.services.clock.clone(),
    )
    .listing()
    .await
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_consumer_lists_the_subscriptions_the_filter_holds_back_with_why() {
    let stack = Stack::new();
    let shared = stack.shared_table();
    shared
        .put_item(policy_item("mallory", "sheet-1", LIVE_QUEUE, None))
        .unwrap();
    shared
        .put_item(policy_item("mallory", "sheet-2", "keyway-mallory_q", None))
        .unwrap();
    let listing = listing_of(&stack, shared, "mallory").await;
    let applied: Vec<&str> = listing
        .subscriptions
        .iter()
        .map(|s| s.queue.as_str())
        .collect();
    assert_eq!(applied, ["keyway-mallory_q"]);
    assert_eq!(listing.held_back.len(), 1, "{listing:?}");
    assert_eq!(listing.held_back[0].subscription, "key#sheet-1");
    assert!(
        listing.held_back[0].reason.contains("keyway-mallory_"),
        "{listing:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_consumer_lists_its_subscriptions_to_all_events_past_those_the_filter_applies_as_held_back(
) {
    use dynamic_filter::index::ALL_EVENTS_PER_CONSUMER;
    let stack = Stack::new();
    let shared = stack.shared_table();
    for n in 0..ALL_EVENTS_PER_CONSUMER + 2 {
        let item = Subscription {
            identity: Identity {
                consumer: "mallory".into(),
                id: format!("all-{n:02}"),
            },
            target: Target::All,
            queue: "keyway-mallory_q".into(),
            pattern: None,
        }
        .to_item(EPOCH);
        shared.put_item(item).unwrap();
    }
    let listing = listing_of(&stack, shared, "mallory").await;
    assert_eq!(listing.subscriptions.len(), ALL_EVENTS_PER_CONSUMER);
    let held: Vec<&str> = listing
        .held_back
        .iter()
        .map(|h| h.subscription.as_str())
        .collect();
    assert_eq!(held, ["all-25", "all-26"]);
    assert!(
        listing.held_back[0].reason.contains("first 25"),
        "{listing:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_subscription_moved_to_the_consumers_own_table_survives_the_delete_of_the_old_one() {
    // The consumer moves: it subscribes in its own table, and a moment later (or in the same
    // second, in either order) deletes what it had in the shared one.
    for (gap_ms, delete_first) in [
        (2_000, false),
        (0, false),
        (300, false),
        (0, true),
        (300, true),
    ] {
        let mut stack = Stack::new();
        let shared = stack.shared_table();
        shared
            .put_item(policy_item("live", "sheet-1", LIVE_QUEUE, None))
            .unwrap();
        stack.run().await;
        let own = keyway_stack::deploy_consumer(&mut stack.runtime, "live").unwrap();
        let own = stack.table(&own);
        let create = || {
            own.put_item(policy_item("live", "sheet-1", LIVE_QUEUE, None))
                .unwrap()
        };
        let delete = || shared.delete_item(&item_key("live", "sheet-1")).unwrap();
        if delete_first {
            delete();
        } else {
            create();
        }
        stack.runtime.run_for(Duration::from_millis(gap_ms)).await;
        if delete_first {
            create();
        } else {
            delete();
        }
        stack.run().await;
        stack.send(&[event("a", "sheet-1")]);
        stack.run().await;
        assert_eq!(
            stack.received(LIVE_QUEUE),
            ["a"],
            "moved {gap_ms} ms apart, deleting first: {delete_first}"
        );
    }
}

/// The live subscriptions, as (consumer, filter key, queue), sorted.
fn live(index: &SubscriptionIndex) -> Vec<(String, String, String)> {
    let mut live: Vec<(String, String, String)> = index
        .subscriptions()
        .iter()
        .map(|s| {
            let key = match &s.target {
                Target::Key(key) => key.clone(),
                Target::All => "*".into(),
            };
            (s.identity.consumer.clone(), key, s.queue.clone())
        })
        .collect();
    live.sort();
    live.dedup();
    live
}

#[tokio::test(start_paused = true)]
async fn subscriptions_made_moved_and_deleted_across_tables_at_any_speed_end_as_the_tables_hold_them(
) {
    for seed in 0..12 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut stack = Stack::new();
        let shared = stack.shared_table();
        let own_name = keyway_stack::deploy_consumer(&mut stack.runtime, "live").unwrap();
        let own = stack.table(&own_name);
        let tables = [shared.clone(), own.clone()];
        let queues = ["keyway-live_a", "keyway-live_b"];
        for queue in queues {
            stack.runtime.services.sqs.create_queue(queue);
        }
        for _ in 0..30 {
            let table = &tables[rng.random_range(0..2)];
            let key = ["sheet-1", "sheet-2"][rng.random_range(0..2)];
            if rng.random_bool(0.6) {
                let queue = queues[rng.random_range(0..2)];
                table
                    .put_item(policy_item("live", key, queue, None))
                    .unwrap();
            } else {
                table.delete_item(&item_key("live", key)).unwrap();
            }
            let gap = [0, 1, 400, 999, 1_000, 1_500][rng.random_range(0..6)];
            stack.runtime.run_for(Duration::from_millis(gap)).await;
        }
        stack.run().await;
        let mut held: Vec<(String, String, String)> = tables
            .iter()
            .flat_map(|t| t.items())
            .map(|item| {
                let text = |name: &str| item[name].as_s().unwrap().to_owned();
                (text(CONSUMER), text("filterKey"), text(QUEUE))
            })
            .collect();
        held.sort();
        held.dedup();
        assert_eq!(live(&stack.index().await), held, "seed {seed}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_id_that_only_a_64_bit_integer_tells_apart_reaches_only_its_own_subscriber() {
    let mut stack = Stack::new();
    let shared = stack.shared_table();
    let tenant = |id: u64| Some(json!({ "tenant": [id] }));
    shared
        .put_item(policy_item(
            "live",
            "sheet-1",
            LIVE_QUEUE,
            tenant(1_600_000_000_000_000_001),
        ))
        .unwrap();
    shared
        .put_item(policy_item(
            "audit",
            "sheet-1",
            AUDIT_QUEUE,
            tenant(1_600_000_000_000_000_000),
        ))
        .unwrap();
    stack.run().await;
    stack.send(&[
        json!({"id": "of-live", "key": "sheet-1", "tenant": 1_600_000_000_000_000_001u64}),
        json!({"id": "of-audit", "key": "sheet-1", "tenant": 1_600_000_000_000_000_000u64}),
        json!({"id": "of-max", "key": "sheet-1", "tenant": u64::MAX}),
    ]);
    stack.run().await;
    assert_eq!(stack.received(LIVE_QUEUE), ["of-live"]);
    assert_eq!(stack.received(AUDIT_QUEUE), ["of-audit"]);
}
