//! Dynamic filtering as template.yaml deploys it, on the embedded runtime: consumers subscribe
//! through the client (in the shared policy table, or in a table of their own that consumer.yaml
//! deploys), events go on the events stream partitioned by filter key, and each consumer's queue
//! receives the events its subscriptions match, once each, and nothing else.

use std::collections::BTreeMap;
use std::time::Duration;

use dynamic_filter::client::{ClientError, SubscriptionClient};
use dynamic_filter::subscription::QueueOwnership;
use keyway_local::{FaultPlan, LocalRuntime, LocalServices};
use serde_json::{json, Value};

const EPOCH: i64 = 1_767_225_600_000;

struct Stack {
    runtime: LocalRuntime,
}

impl Stack {
    fn new(registry: &str) -> Self {
        Self::with_faults(registry, FaultPlan::default())
    }

    /// The stack, its services injecting `faults`.
    fn with_faults(registry: &str, faults: FaultPlan) -> Self {
        let parameters = BTreeMap::from([
            ("ConsumerQueues".to_owned(), registry.to_owned()),
            ("FilterShards".to_owned(), "2".to_owned()),
        ]);
        let services = LocalServices::new(EPOCH, faults);
        for queue in ["keyway-live_1", "keyway-live_2", FIFO, AUDIT] {
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

    fn client(&self, consumer: &str, registry: &str) -> SubscriptionClient {
        self.client_with(
            consumer,
            QueueOwnership::default().with_registry(registry).unwrap(),
        )
    }

    /// A client that accepts any queue named as the consumer's, as a stack without a registry
    /// does.
    fn client_open(&self, consumer: &str) -> SubscriptionClient {
        self.client_with(consumer, QueueOwnership::default())
    }

    fn client_with(&self, consumer: &str, registry: QueueOwnership) -> SubscriptionClient {
        self.client_in(
            &self.runtime.resource("PolicyTable").unwrap(),
            consumer,
            registry,
        )
    }

    /// A client of `consumer`'s subscriptions in `table`.
    fn client_in(
        &self,
        table: &str,
        consumer: &str,
        registry: QueueOwnership,
    ) -> SubscriptionClient {
        let services = &self.runtime.services;
        let table = services.dynamodb.table(table).unwrap();
        SubscriptionClient::new(table, consumer, registry, services.clock.clone())
    }

    fn send(&self, events: &[Value]) {
        let stream = self.runtime.resource("FilterEventsStream").unwrap();
        for event in events {
            let key = event["key"].as_str().unwrap_or("none");
            let data = serde_json::to_vec(event).unwrap();
            // As a producer does, a record the stream failed (an injected fault) goes again.
            while matches!(
                self.runtime
                    .services
                    .kinesis
                    .put_record(&stream, key, &data)
                    .unwrap(),
                keyway::adapters::kinesis::PutOutcome::Failed { .. }
            ) {}
        }
    }

    fn send_raw(&self, key: &str, data: &[u8]) {
        let stream = self.runtime.resource("FilterEventsStream").unwrap();
        self.runtime
            .services
            .kinesis
            .put_record(&stream, key, data)
            .unwrap();
    }

    /// Sends `events` and runs the stack until they are through.
    async fn deliver(&mut self, events: &[Value]) {
        self.send(events);
        self.run().await;
    }

    async fn run(&mut self) {
        self.runtime
            .run_until_idle(Duration::from_secs(600))
            .await
            .expect("the stack goes idle");
    }

    /// The bodies a queue received since the last call, by event id.
    fn received(&self, queue: &str) -> Vec<String> {
        let mut ids = keyway_tests::received_ids(&self.runtime.services.sqs, queue);
        ids.sort();
        ids
    }

    fn dead_letters(&self) -> Vec<String> {
        let url = self.runtime.resource("DeadLetterQueue").unwrap();
        keyway_tests::dead_letter_reasons(&self.runtime.services.sqs, &url)
    }
}

const AUDIT: &str = "keyway-audit_trail";
const FIFO: &str = "keyway-live_in_order.fifo";
const REGISTRY: &str =
    r#"{"live": ["keyway-live_1", "keyway-live_2"], "audit": ["keyway-audit_trail"]}"#;

fn event(id: &str, key: &str, op: &str) -> Value {
    json!({"id": id, "key": key, "op": op})
}

#[tokio::test(start_paused = true)]
async fn each_consumer_receives_the_events_its_subscriptions_match_once_and_nothing_else() {
    let mut stack = Stack::new(REGISTRY);
    let live = stack.client("live", REGISTRY);
    let audit = stack.client("audit", REGISTRY);
    live.subscribe("sheet-1", "keyway-live_1", None)
        .await
        .unwrap();
    live.listen_to_all_events("keyway-live_2", Some(json!({"op": ["delete"]})))
        .await
        .unwrap();
    audit
        .subscribe("sheet-2", AUDIT, Some(json!({"op": [{"prefix": "up"}]})))
        .await
        .unwrap();
    stack.run().await;
    stack.send(&[
        event("a", "sheet-1", "update"),
        event("b", "sheet-1", "delete"),
        event("c", "sheet-2", "update"),
        event("d", "sheet-2", "delete"),
        event("e", "sheet-3", "create"),
    ]);
    stack.run().await;
    // "b" matches both of live's subscriptions: it arrives once, on the first one's queue.
    assert_eq!(stack.received("keyway-live_1"), ["a", "b"]);
    assert_eq!(stack.received("keyway-live_2"), ["d"]);
    assert_eq!(stack.received(AUDIT), ["c"]);

    live.unsubscribe("sheet-1").await.unwrap();
    live.stop_listening_to_all().await.unwrap();
    stack.run().await;
    stack.send(&[
        event("f", "sheet-1", "update"),
        event("g", "sheet-2", "upsert"),
    ]);
    stack.run().await;
    assert!(stack.received("keyway-live_1").is_empty());
    assert!(stack.received("keyway-live_2").is_empty());
    assert_eq!(stack.received(AUDIT), ["g"]);
    assert_eq!(live.list().await.unwrap(), []);
    assert_eq!(audit.list().await.unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_bad_subscription_is_refused_by_the_client_saying_what_is_wrong_and_where() {
    let stack = Stack::new(REGISTRY);
    let live = stack.client("live", REGISTRY);
    let refused = live
        .subscribe(
            "sheet-1",
            "keyway-live_1",
            Some(json!({"op": [{"numeric": [">", "5"]}]})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ClientError::Refused(e) if e.field == "pattern" && e.problem.contains("/op/0/numeric/1")),
        "{refused}"
    );
    assert!(!refused.is_retryable());
    let refused = live.subscribe("sheet-1", AUDIT, None).await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("\"keyway-audit_trail\" is not a queue of consumer \"live\""),
        "{refused}"
    );
    let refused = live
        .subscribe("sheet-1", "keyway-live_3", None)
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("\"keyway-live_3\" is not registered to consumer \"live\""),
        "{refused}"
    );
    assert_eq!(live.list().await.unwrap(), [], "nothing was written");
}

#[tokio::test(start_paused = true)]
async fn bad_events_and_deliveries_to_a_missing_queue_reach_the_dead_letter_queue_with_the_reason()
{
    let mut stack = Stack::new("");
    let live = stack.client_open("live");
    live.subscribe("sheet-1", "keyway-live_nowhere", None)
        .await
        .unwrap();
    live.subscribe("sheet-2", "keyway-live_1", None)
        .await
        .unwrap();
    stack.run().await;
    stack.send_raw("sheet-1", b"not json");
    stack.send_raw("sheet-1", br#"{"id": "no-key"}"#);
    stack.send(&[
        event("a", "sheet-1", "update"),
        event("b", "sheet-2", "update"),
    ]);
    stack.run().await;
    assert_eq!(stack.received("keyway-live_1"), ["b"]);
    let reasons = stack.dead_letters();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(reasons[0].starts_with("data/key: missing"), "{reasons:?}");
    assert!(reasons[1].starts_with("data: not JSON"), "{reasons:?}");
    assert!(
        reasons[2].starts_with("output.deliveries") && reasons[2].contains("NonExistentQueue"),
        "{reasons:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_consumer_with_a_table_of_its_own_subscribes_there_and_for_no_one_else() {
    let mut stack = Stack::new(REGISTRY);
    let registry = || QueueOwnership::default().with_registry(REGISTRY).unwrap();
    let live_table = keyway_stack::deploy_consumer(&mut stack.runtime, "live").unwrap();
    let audit_table = keyway_stack::deploy_consumer(&mut stack.runtime, "audit").unwrap();
    assert_eq!(live_table, "keyway-local-policies-live");
    let live = stack.client_in(&live_table, "live", registry());
    let audit = stack.client_in(&audit_table, "audit", registry());
    live.subscribe("sheet-1", "keyway-live_1", None)
        .await
        .unwrap();
    audit.subscribe("sheet-1", AUDIT, None).await.unwrap();
    stack.run().await;

    // Writing in live's table as audit: made and removed, neither reaches the filter.
    let intruder = stack.client_in(&live_table, "audit", registry());
    intruder
        .subscribe("sheet-1", AUDIT, Some(json!({"op": ["never"]})))
        .await
        .unwrap();
    stack.run().await;
    intruder.unsubscribe("sheet-1").await.unwrap();
    stack.run().await;
    stack.send(&[
        event("a", "sheet-1", "update"),
        event("b", "sheet-2", "update"),
    ]);
    stack.run().await;
    assert_eq!(stack.received("keyway-live_1"), ["a"]);
    assert_eq!(
        stack.received(AUDIT),
        ["a"],
        "audit's own subscription stands, unchanged"
    );
    let reasons = stack.dead_letters();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    for reason in &reasons {
        assert!(
            reason.starts_with(
                "consumer: \"audit\" in the policy table \"keyway-local-policies-live\" of consumer \"live\""
            ),
            "{reason}"
        );
    }
    assert_eq!(live.list().await.unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_consumer_stack_mapped_to_a_function_not_deployed_is_refused_naming_the_mapping() {
    let mut stack = Stack::new(REGISTRY);
    let parameters = BTreeMap::from([
        ("Consumer".to_owned(), "live".to_owned()),
        ("PolicyTablePrefix".to_owned(), "p-".to_owned()),
        (
            "PolicySyncFunctionArn".to_owned(),
            "arn:aws:lambda:us-east-1:000000000000:function:missing".to_owned(),
        ),
        (
            "FailedBatchesQueueArn".to_owned(),
            stack.runtime.output("FailedBatchesQueueArn").unwrap(),
        ),
    ]);
    let e = stack
        .runtime
        .deploy(
            keyway_stack::CONSUMER_TEMPLATE,
            &parameters,
            &BTreeMap::new(),
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "Resources/PolicySync: FunctionName \"arn:aws:lambda:us-east-1:000000000000:function:missing\": no such function is deployed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_consumer_moving_from_the_shared_table_to_its_own_keeps_its_newest_subscription() {
    // The shared table's stream has numbered many changes; the consumer's new table numbers
    // afresh, from 1: its changes are newer all the same.
    let mut stack = Stack::new(REGISTRY);
    let shared = stack.client("live", REGISTRY);
    for queue in [
        "keyway-live_1",
        "keyway-live_2",
        "keyway-live_1",
        "keyway-live_2",
    ] {
        shared.subscribe("sheet-1", queue, None).await.unwrap();
        stack.run().await;
    }
    shared.unsubscribe("sheet-1").await.unwrap();
    stack.run().await;
    stack.runtime.run_for(Duration::from_secs(2)).await;
    let own = keyway_stack::deploy_consumer(&mut stack.runtime, "live").unwrap();
    let registry = QueueOwnership::default().with_registry(REGISTRY).unwrap();
    let live = stack.client_in(&own, "live", registry);
    live.subscribe("sheet-1", "keyway-live_1", None)
        .await
        .unwrap();
    stack.run().await;
    stack.deliver(&[event("a", "sheet-1", "update")]).await;
    assert_eq!(stack.received("keyway-live_1"), ["a"]);
    assert!(stack.dead_letters().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_filter_that_ran_no_batch_for_over_a_day_delivers_to_what_was_subscribed_meanwhile() {
    use dynamic_filter::store::{journal_position, FilterState};
    let mut stack = Stack::new(REGISTRY);
    stack
        .client("live", REGISTRY)
        .subscribe("sheet-1", "keyway-live_1", None)
        .await
        .unwrap();
    stack.run().await;
    stack.deliver(&[event("a", "sheet-1", "update")]).await;
    assert_eq!(stack.received("keyway-live_1"), ["a"]);
    // An hour later the audit subscribes; no event comes for a day and more, and its change's
    // journal entry expires and is deleted.
    stack.runtime.run_for(Duration::from_secs(3600)).await;
    stack
        .client("audit", REGISTRY)
        .subscribe("sheet-2", AUDIT, None)
        .await
        .unwrap();
    stack.run().await;
    let quiet = Duration::from_secs(26 * 3600) + keyway_local::DEFAULT_TTL_DELAY;
    stack.runtime.run_for(quiet).await;
    stack.runtime.services.dynamodb.expire();
    let state = FilterState::new(
        stack
            .runtime
            .services
            .dynamodb
            .table(&stack.runtime.resource("FilterStateTable").unwrap())
            .unwrap(),
        stack.runtime.services.clock.clone(),
    );
    let journal = state.since(&journal_position(0), 100).await.unwrap();
    assert!(journal.is_empty(), "the journal expired: {journal:?}");
    stack
        .deliver(&[
            event("b", "sheet-2", "update"),
            event("c", "sheet-1", "update"),
        ])
        .await;
    assert_eq!(stack.received(AUDIT), ["b"]);
    assert_eq!(stack.received("keyway-live_1"), ["c"]);
}

/// A FIFO queue keeps a filter key's events in their order: a delivery that failed goes again
/// with its batch, and none after it of the same key went before it (the queue would drop the
/// later one, sent again, as a duplicate, leaving it first for good).
#[tokio::test(start_paused = true)]
async fn a_fifo_queue_receives_a_filter_keys_events_in_their_order_though_sends_fail_now_and_then()
{
    let registry = format!(r#"{{"live": ["keyway-live_1", "{FIFO}"]}}"#);
    let faults = FaultPlan {
        partial_failure: 0.2,
        seed: 11,
        ..FaultPlan::default()
    };
    let mut stack = Stack::with_faults(&registry, faults);
    let live = stack.client("live", &registry);
    live.subscribe("sheet-1", FIFO, None).await.unwrap();
    // A standard queue beside it, which keeps no order and needs none.
    live.subscribe("sheet-2", "keyway-live_1", None)
        .await
        .unwrap();
    stack.run().await;
    let ids: Vec<String> = (0..60).map(|i| format!("e{i:02}")).collect();
    let events: Vec<Value> = ids
        .iter()
        .flat_map(|id| {
            [
                event(id, "sheet-1", "update"),
                event(id, "sheet-2", "update"),
            ]
        })
        .collect();
    stack.deliver(&events).await;
    assert!(
        stack.runtime.services.sqs.faults_fired()[&keyway_local::Fault::PartialFailure] > 0,
        "some deliveries failed and went again"
    );
    assert!(
        stack.dead_letters().is_empty(),
        "{:?}",
        stack.dead_letters()
    );
    // A delivery sent again is dropped by the queue's deduplication; what is left of a retry
    // that failed in part is taken at its first arrival.
    let mut seen = std::collections::HashSet::new();
    let order: Vec<String> = keyway_tests::received_ids(&stack.runtime.services.sqs, FIFO)
        .into_iter()
        .filter(|id| seen.insert(id.clone()))
        .collect();
    assert_eq!(
        order, ids,
        "sheet-1's events reach the FIFO queue in their order"
    );
    assert_eq!(
        stack.received("keyway-live_1"),
        ids,
        "and sheet-2's all reach theirs"
    );
}

/// A consumer's queue that refuses every delivery (its owner disabled the queue's KMS key) holds
/// back the other consumers of its shard no longer than the filter's patience: their events keep
/// coming, its own deliveries reach the dead-letter queue with why, none lost, and once its
/// queue takes messages again it receives the events after.
#[tokio::test(start_paused = true)]
async fn a_consumer_whose_queue_refuses_every_delivery_holds_the_others_back_no_longer_than_the_filters_patience(
) {
    refused_for_an_hour("keyway-live_1").await;
}

/// The same of a FIFO queue, whose deliveries keep their order until the patience runs out.
#[tokio::test(start_paused = true)]
async fn a_consumer_whose_fifo_queue_refuses_every_delivery_holds_the_others_back_no_longer_than_the_filters_patience(
) {
    refused_for_an_hour(FIFO).await;
}

/// `queue` of consumer `live` refuses every delivery for forty minutes, then takes them again.
async fn refused_for_an_hour(queue: &str) {
    use dynamic_filter::router::DEFAULT_PATIENCE;
    let registry = format!(r#"{{"live": ["{queue}"], "audit": ["{AUDIT}"]}}"#);
    let mut stack = Stack::new(&registry);
    let (live, audit) = (
        stack.client("live", &registry),
        stack.client("audit", &registry),
    );
    live.subscribe("sheet-1", queue, None).await.unwrap();
    audit.subscribe("sheet-1", AUDIT, None).await.unwrap();
    stack.run().await;
    let broken = format!("{}{queue}", keyway_local::LocalSqs::URL_PREFIX);
    stack.runtime.services.sqs.set_key_disabled(&broken, true);
    // An event a minute for forty minutes, all of one filter key: one shard, one lane.
    // (A retry sends the audit queue's deliveries again, under their ids: counted once.)
    let (mut audited, mut most_waiting) = (std::collections::BTreeSet::new(), 0);
    for minute in 0..40 {
        stack.send(&[event(&format!("e{minute:02}"), "sheet-1", "update")]);
        stack.runtime.run_for(Duration::from_secs(60)).await;
        audited.extend(stack.received(AUDIT));
        most_waiting = most_waiting.max(minute + 1 - audited.len());
    }
    let patience = (DEFAULT_PATIENCE.as_secs() / 60) as usize;
    assert_eq!(audited.len(), 40, "every event reached the audit queue");
    assert!(
        most_waiting <= patience + 1,
        "the audit queue waited {most_waiting} minutes for the broken queue"
    );
    // The broken queue's deliveries are dead-lettered with why, each event at least once.
    let dead = keyway_tests::dead_letters_on(
        &stack.runtime.services.sqs,
        &stack.runtime.resource("DeadLetterQueue").unwrap(),
    );
    assert!(
        dead.iter().all(|d| d.field == "output.deliveries"
            && d.problem.contains(queue)
            && d.problem.contains("patience")
            && d.problem.contains("KmsDisabled")),
        "{dead:?}"
    );
    let events: std::collections::BTreeSet<String> = dead
        .iter()
        .map(|d| {
            let output: Value = serde_json::from_str(&d.payload).unwrap();
            let body: Value = serde_json::from_str(output["body"].as_str().unwrap()).unwrap();
            body["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(events.len(), 40, "{events:?}");
    // Its owner enables the key again: the queue receives what comes next.
    stack.runtime.services.sqs.set_key_disabled(&broken, false);
    stack.deliver(&[event("after", "sheet-1", "update")]).await;
    assert_eq!(stack.received(queue), ["after"]);
    assert_eq!(stack.received(AUDIT), ["after"]);
}
