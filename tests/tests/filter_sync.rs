//! filter-policy-sync on the embedded runtime: a policy table's stream through the function into
//! the filter state, from which a filter's index is built. Whatever the policy table went
//! through (subscriptions made, moved to another filter key, given another queue, removed, made
//! again), and whatever faults the runtime injects on the way, the index ends holding exactly the
//! valid subscriptions the table holds; an invalid one is dead-lettered with its reason.

use std::sync::Arc;
use std::time::Duration;

use dynamic_filter::index::SubscriptionIndex;
use dynamic_filter::store::{journal_position, FilterState};
use dynamic_filter::subscription::{
    Identity, QueueOwnership, Subscription, Target, CONSUMER, PATTERN, SUBSCRIPTION,
};
use keyway::adapters::dynamodb::TTL;
use keyway::domain::{AttrValue, Item};
use keyway::lambda::Env;
use keyway::ports::Clock;
use keyway_local::{
    FaultPlan, KeySchema, LocalRuntime, LocalServices, LocalTable, MappingSettings, MappingSource,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const EPOCH: i64 = 1_767_225_600_000;

struct Setup {
    runtime: LocalRuntime,
    policies: Arc<LocalTable>,
    filter_state: FilterState,
    dead_letters: String,
}

fn setup(faults: FaultPlan, registry: &str) -> Setup {
    let services = LocalServices::new(EPOCH, faults);
    for name in ["keyway-state", "filter-state"] {
        services
            .dynamodb
            .create_table(name, KeySchema::state_table(), Some(TTL.into()), None);
    }
    let schema = KeySchema {
        hash: CONSUMER.into(),
        range: Some(SUBSCRIPTION.into()),
    };
    let policies = services.dynamodb.create_table(
        "policies",
        schema,
        None,
        Some(keyway_local::StreamView::NewAndOldImages),
    );
    let dead_letters = services.sqs.create_queue("sync-dead-letters");
    let env: Env = [
        ("STATE_TABLE", "keyway-state".to_owned()),
        ("FILTER_STATE_TABLE", "filter-state".to_owned()),
        ("DEAD_LETTER_SINK", format!("sqs:{dead_letters}")),
        ("CONSUMER_QUEUES", registry.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let handler = filter_policy_sync::handler(services.as_ref(), &env).expect("wired");
    let mut runtime = LocalRuntime::new(services.clone());
    let settings = MappingSettings {
        report_batch_item_failures: true,
        bisect_batch_on_function_error: true,
        ..Default::default()
    };
    let source = MappingSource::DynamoDb {
        table: policies.clone(),
    };
    runtime.add_mapping("sync", Arc::new(handler), source, settings);
    let filter_state = FilterState::new(
        services.dynamodb.table("filter-state").unwrap(),
        services.clock.clone(),
    );
    Setup {
        runtime,
        policies,
        filter_state,
        dead_letters,
    }
}

impl Setup {
    fn now(&self) -> i64 {
        self.runtime.services.clock.now_millis()
    }

    fn subscribe(&self, subscription: &Subscription) {
        let item = subscription.to_item(self.now());
        self.policies.put_item(item).unwrap();
    }

    fn unsubscribe(&self, identity: &Identity) {
        let keys = Item::from([
            (CONSUMER.to_owned(), AttrValue::S(identity.consumer.clone())),
            (SUBSCRIPTION.to_owned(), AttrValue::S(identity.id.clone())),
        ]);
        self.policies.delete_item(&keys).unwrap();
    }

    async fn run(&mut self) {
        self.runtime
            .run_until_idle(Duration::from_secs(3600))
            .await
            .expect("the runtime goes idle");
    }

    /// The index a filter builds from the filter state now.
    async fn index(&self) -> SubscriptionIndex {
        let (cursor, rows) = self.filter_state.snapshot().await.unwrap();
        let index = SubscriptionIndex::from_snapshot(QueueOwnership::default(), cursor, rows);
        let journal = self
            .filter_state
            .since(&journal_position(0), usize::MAX)
            .await
            .unwrap();
        let mut replayed = SubscriptionIndex::default();
        replayed.catch_up(&journal);
        assert_eq!(
            replayed.subscriptions(),
            index.subscriptions(),
            "the journal replayed from its start gives what the snapshot gives"
        );
        index
    }

    /// The valid subscriptions the policy table holds.
    fn held(&self, registry: &QueueOwnership) -> Vec<Subscription> {
        let mut held: Vec<Subscription> = self
            .policies
            .items()
            .iter()
            .filter_map(|item| Subscription::from_item(item, registry).ok())
            .collect();
        held.sort_by(|a, b| a.identity.cmp(&b.identity));
        held
    }

    fn dead_letters(&self) -> Vec<String> {
        keyway_tests::dead_letter_reasons(&self.runtime.services.sqs, &self.dead_letters)
    }
}

fn keyed(consumer: &str, key: &str, queue: &str) -> Subscription {
    let target = Target::Key(key.into());
    Subscription {
        identity: Identity {
            consumer: consumer.into(),
            id: target.subscription_id(),
        },
        target,
        queue: queue.into(),
        pattern: None,
    }
}

const LIVE_1: &str = "keyway-live_1";
const LIVE_2: &str = "keyway-live_2";
const AUDIT: &str = "keyway-audit_trail";
const REGISTRY: &str =
    r#"{"live": ["keyway-live_1", "keyway-live_2"], "audit": ["keyway-audit_trail"]}"#;

#[tokio::test(start_paused = true)]
async fn a_subscription_moved_changed_and_removed_leaves_the_index_as_the_table_is() {
    let mut s = setup(FaultPlan::default(), REGISTRY);
    let sheet = keyed("live", "sheet-1", LIVE_1);
    s.subscribe(&sheet);
    s.subscribe(&keyed("audit", "sheet-1", AUDIT));
    let all = Subscription {
        identity: Identity {
            consumer: "audit".into(),
            id: "all".into(),
        },
        target: Target::All,
        queue: AUDIT.into(),
        pattern: Some(json!({"op": ["delete"]})),
    };
    s.subscribe(&all);
    s.run().await;
    // The same item moved to another sheet and another queue, as a writer of its own may do.
    let mut moved = sheet.clone();
    moved.target = Target::Key("sheet-2".into());
    moved.queue = LIVE_2.into();
    s.subscribe(&moved);
    s.unsubscribe(&keyed("audit", "sheet-1", AUDIT).identity);
    s.run().await;
    let index = s.index().await;
    let held = s.held(&QueueOwnership::default().with_registry(REGISTRY).unwrap());
    assert_eq!(held.len(), 2);
    assert_eq!(index.subscriptions(), held.iter().collect::<Vec<_>>());
    let delivered = |key: &str, op: &str| -> Vec<String> {
        index
            .deliveries(key, &json!({"op": op}))
            .iter()
            .map(|d| d.queue.to_owned())
            .collect()
    };
    assert!(
        delivered("sheet-1", "update").is_empty(),
        "nothing left at the old sheet"
    );
    assert_eq!(delivered("sheet-2", "update"), [LIVE_2]);
    assert_eq!(delivered("sheet-1", "delete"), [AUDIT]);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_subscription_is_dead_lettered_with_its_reason_and_changes_nothing() {
    let mut s = setup(FaultPlan::default(), REGISTRY);
    let good = keyed("live", "sheet-1", LIVE_1);
    s.subscribe(&good);
    s.run().await;
    // A malformed pattern written over the good subscription, and a queue of another consumer.
    let mut broken = good.to_item(s.now());
    broken.insert(
        PATTERN.into(),
        AttrValue::S(r#"{"op": [{"prefx": "d"}]}"#.into()),
    );
    s.policies.put_item(broken).unwrap();
    s.subscribe(&keyed("live", "sheet-2", "keyway-live_3"));
    s.run().await;
    let reasons = s.dead_letters();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("pattern") && r.contains("/op/0/prefx")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("\"keyway-live_3\" is not registered to consumer \"live\"")),
        "{reasons:?}"
    );
    let index = s.index().await;
    assert_eq!(
        index.subscriptions(),
        [&good],
        "the last valid subscription stays"
    );
}

#[tokio::test(start_paused = true)]
async fn under_every_fault_the_index_ends_as_the_valid_subscriptions_the_table_holds() {
    // Each consumer's two queues; one subscription in ten names another consumer's queue.
    let registry = r#"{"c0": ["keyway-c0_q0", "keyway-c0_q1"], "c1": ["keyway-c1_q0", "keyway-c1_q1"], "c2": ["keyway-c2_q0", "keyway-c2_q1"]}"#;
    let mut s = setup(FaultPlan::all(0.05, 11), registry);
    let mut rng = StdRng::seed_from_u64(7);
    for round in 0..40 {
        for _ in 0..25 {
            let consumer = format!("c{}", rng.random_range(0..3));
            let key = format!("sheet-{}", rng.random_range(0..6));
            let owner = match rng.random_range(0..10) {
                0 => format!("c{}", rng.random_range(0..3)),
                _ => consumer.clone(),
            };
            let queue = format!("keyway-{owner}_q{}", rng.random_range(0..2));
            let subscription = keyed(&consumer, &key, &queue);
            match rng.random_range(0..4) {
                0 => s.unsubscribe(&subscription.identity),
                _ => s.subscribe(&subscription),
            }
        }
        if round % 4 == 3 {
            s.run().await;
        }
    }
    s.run().await;
    let index = s.index().await;
    let registry = QueueOwnership::default().with_registry(registry).unwrap();
    let held = s.held(&registry);
    assert!(
        held.len() > 5,
        "the run leaves subscriptions: {}",
        held.len()
    );
    assert_eq!(index.subscriptions(), held.iter().collect::<Vec<_>>());
}
