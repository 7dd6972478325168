//! The embedded runtime running the stack's own template.yaml: the keyed counter wired as the
//! template says, a chaos run with every fault, and determinism under a seed; and the CDK app's
//! synthesized stack, which must wire exactly as template.yaml does.
//!
//! The CDK template is synthesized by the test command (`npx cdk synth` in infra/, after `npm ci`);
//! `KEYWAY_CDK_OUT` names its output folder.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use keyway::domain::{Origin, OutputId, SequenceNumber};
use keyway::lambda::{executor_config, Handler, StreamHandler};
use keyway::local::{Factory, FaultPlan, LocalRuntime, LocalServices, RunReport, StartingPosition};
use keyway::{Executor, Sinks};
use keyway_tests::operators::{GroupCounter, Tweaked};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const EPOCH: i64 = 1_767_225_600_000;

fn template() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml"))
        .expect("template.yaml")
}

fn factories() -> BTreeMap<String, Factory> {
    let mut factories: BTreeMap<String, Factory> = BTreeMap::new();
    factories.insert(
        "KeyedCounterFunction".into(),
        Box::new(|platform, env| {
            Ok(Arc::new(keyed_counter::handler(platform, env)?) as Arc<dyn Handler>)
        }),
    );
    factories
}

/// Puts `events` (key, amount) on the clicks stream; returns each one's (shard, sequence number).
async fn produce(runtime: &LocalRuntime, events: &[(String, u64)]) -> Vec<(String, String)> {
    let stream = runtime
        .resource("ClicksStream")
        .expect("the template's stream");
    let records: Vec<(String, Vec<u8>)> = events
        .iter()
        .map(|(k, a)| {
            (
                k.clone(),
                format!(r#"{{"key":"{k}","amount":{a}}}"#).into_bytes(),
            )
        })
        .collect();
    runtime
        .services
        .kinesis
        .put_in_order(&stream, &records)
        .await
        .expect("the stream takes every record")
}

fn zipf_events(n: usize, keys: usize, seed: u64) -> Vec<(String, u64)> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            // A skewed key choice: low keys far more often.
            let u: f64 = rng.random();
            let key = ((keys as f64).powf(u) as usize).min(keys);
            (format!("user-{key}"), rng.random_range(1..4))
        })
        .collect()
}

async fn stored_counts(runtime: &LocalRuntime, keys: &[String]) -> BTreeMap<String, Option<u64>> {
    let store = keyway::lambda::Platform::state_store(
        runtime.services.as_ref(),
        &runtime.resource("StateTable").unwrap(),
    )
    .unwrap();
    let namespace = keyway::ports::Namespace {
        operator: "keyed-counter".into(),
        signature: keyway::operator::state_signature(&keyway::KeyedOperator::states(
            &keyed_counter::KeyedCounter,
        )),
    };
    let loaded = store.load(&namespace, keys).await.unwrap();
    keys.iter()
        .map(|k| {
            let count = loaded[k]
                .slots
                .get("count")
                .and_then(|s| s.entries.first())
                .map(|e| e.get().parse().unwrap());
            (k.clone(), count)
        })
        .collect()
}

/// Puts `events` on the stream, runs until idle, and checks every key's stored count.
async fn counts_every_event(runtime: &mut LocalRuntime, events: &[(String, u64)]) {
    produce(runtime, events).await;
    runtime
        .run_until_idle(Duration::from_secs(600))
        .await
        .unwrap();
    let expected = expected_counts(events);
    let keys: Vec<String> = expected.keys().cloned().collect();
    assert_eq!(stored_counts(runtime, &keys).await, expected);
}

fn expected_counts(events: &[(String, u64)]) -> BTreeMap<String, Option<u64>> {
    let mut counts: BTreeMap<String, Option<u64>> = BTreeMap::new();
    for (key, amount) in events {
        *counts.entry(key.clone()).or_default().get_or_insert(0) += amount;
    }
    counts
}

/// The CDK app's synthesized template, when the test command made one.
fn cdk_template() -> Option<String> {
    match std::env::var("KEYWAY_CDK_OUT") {
        Ok(dir) => Some(
            std::fs::read_to_string(format!("{dir}/keyway.template.json"))
                .unwrap_or_else(|e| panic!("{dir}/keyway.template.json: {e}")),
        ),
        Err(_) if std::env::var("KEYWAY_REQUIRE_CDK").is_ok() => {
            panic!("KEYWAY_CDK_OUT is not set, but KEYWAY_REQUIRE_CDK says the CDK app must be checked")
        }
        Err(_) => {
            eprintln!(
                "KEYWAY_CDK_OUT is not set: the CDK app was not checked (./scripts/test checks it)"
            );
            None
        }
    }
}

/// Environment values resolved by naming what they reference.
struct Names;
impl keyway::local::template::Resolver for Names {
    fn reference(&self, id: &str) -> Option<String> {
        Some(format!("ref-of-{id}"))
    }
    fn attribute(&self, id: &str, attribute: &str) -> Option<String> {
        Some(format!("{attribute}-of-{id}"))
    }
}

#[tokio::test(start_paused = true)]
async fn the_cdk_app_builds_the_stack_that_template_yaml_describes() {
    use keyway::local::template::parse;
    let Some(cdk_text) = cdk_template() else {
        return;
    };
    let (sam, sam_template) = parse(&template()).unwrap();
    let (cdk, cdk_template) = parse(&cdk_text).unwrap();
    assert_eq!(cdk.resources, sam.resources, "tables, streams and queues");
    assert_eq!(cdk.functions.len(), sam.functions.len());
    for (c, s) in cdk.functions.iter().zip(&sam.functions) {
        assert_eq!(
            (&c.logical_id, &c.name, c.timeout, &c.events),
            (&s.logical_id, &s.name, s.timeout, &s.events),
            "{}: name, timeout and event source mappings",
            s.logical_id
        );
        assert_eq!(
            c.resolved_env(&cdk_template, &Names).unwrap(),
            s.resolved_env(&sam_template, &Names).unwrap(),
            "{}: environment",
            s.logical_id
        );
    }

    // And the embedded runtime runs the CDK stack as it runs template.yaml.
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let mut runtime = LocalRuntime::from_template(&cdk_text, services, &factories()).unwrap();
    let events = zipf_events(1_000, 30, 3);
    counts_every_event(&mut runtime, &events).await;
}

#[tokio::test(start_paused = true)]
async fn the_template_wires_the_keyed_counter_to_its_stream_queues_and_settings() {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let mut runtime = LocalRuntime::from_template(&template(), services, &factories()).unwrap();
    let mapping = &runtime.mappings()[0];
    assert_eq!(mapping.name, "KeyedCounterFunction/Clicks");
    let s = mapping.settings();
    assert_eq!(
        (s.batch_size, s.maximum_batching_window, s.starting_position),
        (500, Duration::from_secs(1), StartingPosition::TrimHorizon)
    );
    assert!(s.report_batch_item_failures && s.bisect_batch_on_function_error);
    assert_eq!(
        (
            s.maximum_retry_attempts,
            s.maximum_record_age,
            s.parallelization_factor
        ),
        (Some(10), Some(Duration::from_secs(86_400)), 2)
    );
    assert_eq!(s.function_timeout, Duration::from_secs(30));
    assert_eq!(s.on_failure, runtime.resource("FailedBatchesQueue"));

    let events = zipf_events(2_000, 50, 1);
    counts_every_event(&mut runtime, &events).await;
    let counts_queue = runtime.resource("CountsQueue").unwrap();
    assert_eq!(runtime.services.sqs.messages(&counts_queue).len(), 2_000);
}

/// What a chaos run left behind.
struct Run {
    /// The keyed counter's state.
    counts: BTreeMap<String, Option<u64>>,
    /// The outbox counter's state, and the DynamoDB-fed group counter's.
    spread: BTreeMap<String, Option<u64>>,
    groups: BTreeMap<String, Option<u64>>,
    /// Output id to the bodies sent under it, by counter.
    outputs: HashMap<String, HashSet<String>>,
    outbox_outputs: HashMap<String, HashSet<String>>,
    expiring_outputs: HashMap<String, HashSet<String>>,
    messages: usize,
    report: RunReport,
    expected_ids: HashSet<String>,
    dead_letters: usize,
    failed_batches: usize,
}

/// The stack's template as the chaos run deploys it: unlimited retries (under faults nothing may
/// be discarded), each shard read in ten lanes, and more functions beside the keyed counter (whose
/// keys are its partition keys): on a stream whose keys are not its partition keys (so that a
/// key's records come from several lanes at once, and its writers race), a counter that delivers
/// through its outbox, and another with a 30-second state TTL, shorter than the outages of its
/// queue; and a counter of DynamoDB changes per group, each group fed by thousands of items.
fn chaos_template() -> String {
    let extra = r#"
  SpreadStream:
    Type: AWS::Kinesis::Stream
    Properties:
      ShardCount: 2
      RetentionPeriodHours: 24

  OutboxCountsQueue:
    Type: AWS::SQS::Queue

  ExpiringCountsQueue:
    Type: AWS::SQS::Queue

  OrdersTable:
    Type: AWS::DynamoDB::Table
    Properties:
      BillingMode: PAY_PER_REQUEST
      AttributeDefinitions:
        - AttributeName: id
          AttributeType: S
      KeySchema:
        - AttributeName: id
          KeyType: HASH
      StreamSpecification:
        StreamViewType: NEW_AND_OLD_IMAGES

  OutboxCounterFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: .
      Environment:
        Variables:
          STATE_TABLE: !Ref StateTable
          COUNTS_SINK: !Sub "sqs:${OutboxCountsQueue}"
          DEAD_LETTER_SINK: !Sub "sqs:${DeadLetterQueue}"
          KEYWAY_REDELIVERY_WINDOW_SECONDS: "90000"
      Events:
        Spread:
          Type: Kinesis
          Properties:
            Stream: !GetAtt SpreadStream.Arn
            StartingPosition: TRIM_HORIZON
            BatchSize: 200
            FunctionResponseTypes: [ReportBatchItemFailures]
            BisectBatchOnFunctionError: true
            ParallelizationFactor: 10

  ExpiringCounterFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: .
      Environment:
        Variables:
          STATE_TABLE: !Ref StateTable
          COUNTS_SINK: !Sub "sqs:${ExpiringCountsQueue}"
          DEAD_LETTER_SINK: !Sub "sqs:${DeadLetterQueue}"
          KEYWAY_REDELIVERY_WINDOW_SECONDS: "90000"
      Events:
        Spread:
          Type: Kinesis
          Properties:
            Stream: !GetAtt SpreadStream.Arn
            StartingPosition: TRIM_HORIZON
            BatchSize: 200
            FunctionResponseTypes: [ReportBatchItemFailures]
            BisectBatchOnFunctionError: true
            ParallelizationFactor: 10

  GroupCounterFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: .
      Environment:
        Variables:
          STATE_TABLE: !Ref StateTable
          DEAD_LETTER_SINK: !Sub "sqs:${DeadLetterQueue}"
      Events:
        Orders:
          Type: DynamoDB
          Properties:
            Stream: !GetAtt OrdersTable.StreamArn
            StartingPosition: TRIM_HORIZON
            BatchSize: 100
            FunctionResponseTypes: [ReportBatchItemFailures]
            BisectBatchOnFunctionError: true

Outputs:"#;
    template()
        .replace("MaximumRetryAttempts: 10", "MaximumRetryAttempts: -1")
        .replace(
            "MaximumRecordAgeInSeconds: 86400",
            "MaximumRecordAgeInSeconds: -1",
        )
        .replace("ParallelizationFactor: 2", "ParallelizationFactor: 10")
        .replacen("\nOutputs:", extra, 1)
}

fn chaos_factories() -> BTreeMap<String, Factory> {
    let mut factories = factories();
    let outbox_counter = |name: &'static str, ttl: Option<Duration>| -> Factory {
        Box::new(move |platform, env| {
            let sinks = Sinks::new(platform.sink(&env["DEAD_LETTER_SINK"])?)
                .with(keyed_counter::COUNTS, platform.sink(&env["COUNTS_SINK"])?);
            let mut operator = Tweaked::new(keyed_counter::KeyedCounter)
                .named(name)
                .through_outbox();
            operator.ttl = ttl;
            let store = platform.state_store(&env["STATE_TABLE"])?;
            let config = executor_config(env).map_err(|e| e.to_string())?;
            let executor =
                Executor::new(operator, store, sinks, platform.clock()).with_config(config);
            Ok(Arc::new(StreamHandler::new(executor)) as Arc<dyn Handler>)
        })
    };
    factories.insert(
        "OutboxCounterFunction".into(),
        outbox_counter("outbox-counter", None),
    );
    factories.insert(
        "ExpiringCounterFunction".into(),
        outbox_counter("expiring-counter", Some(Duration::from_secs(30))),
    );
    factories.insert(
        "GroupCounterFunction".into(),
        Box::new(|platform, env| {
            let sinks = Sinks::new(platform.sink(&env["DEAD_LETTER_SINK"])?);
            let store = platform.state_store(&env["STATE_TABLE"])?;
            let executor = Executor::new(GroupCounter, store, sinks, platform.clock());
            Ok(Arc::new(StreamHandler::new(executor)) as Arc<dyn Handler>)
        }),
    );
    factories
}

/// Clicks of `users` users spread over `devices` devices, partitioned by device: a key's records
/// come from many partition keys, and so from many lanes of a shard.
fn spread(n: usize, users: usize, devices: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let device = format!("device-{}", rng.random_range(0..devices));
            let user = rng.random_range(0..users);
            let data = format!(r#"{{"key":"user-{user}","amount":1}}"#).into_bytes();
            (device, data)
        })
        .collect()
}

/// The counts `spread` gives each user.
fn spread_counts(records: &[(String, Vec<u8>)]) -> BTreeMap<String, Option<u64>> {
    let events: Vec<(String, u64)> = records
        .iter()
        .map(|(_, data)| {
            let event: keyed_counter::CountEvent = serde_json::from_slice(data).unwrap();
            (event.key, event.amount)
        })
        .collect();
    expected_counts(&events)
}

/// Orders spread over ten groups.
fn orders(items: usize) -> Vec<keyway::domain::Item> {
    use keyway::domain::AttrValue;
    (0..items)
        .map(|i| {
            keyway::domain::Item::from([
                ("id".to_owned(), AttrValue::S(format!("order-{i}"))),
                ("group".to_owned(), AttrValue::S(format!("g{}", i % 10))),
            ])
        })
        .collect()
}

/// The `count` value of `keys` of `operator` (whose states are the keyed counter's).
async fn stored_values(
    runtime: &LocalRuntime,
    operator: &str,
    keys: &[String],
) -> BTreeMap<String, Option<u64>> {
    let store = keyway::lambda::Platform::state_store(
        runtime.services.as_ref(),
        &runtime.resource("StateTable").unwrap(),
    )
    .unwrap();
    let namespace = keyway::ports::Namespace {
        operator: operator.into(),
        signature: keyway::operator::state_signature(&keyway::KeyedOperator::states(&GroupCounter)),
    };
    let loaded = store.load(&namespace, keys).await.unwrap();
    keys.iter()
        .map(|k| {
            let count = loaded[k]
                .slots
                .get("count")
                .and_then(|s| s.entries.first())
                .map(|e| e.get().parse().unwrap());
            (k.clone(), count)
        })
        .collect()
}

/// Output id to the bodies the queue received under it.
fn bodies_by_id(services: &LocalServices, queue: &str) -> HashMap<String, HashSet<String>> {
    let mut outputs: HashMap<String, HashSet<String>> = HashMap::new();
    for m in services.sqs.messages(queue) {
        outputs
            .entry(m.output_id.clone().expect("an output id"))
            .or_default()
            .insert(m.body.clone());
    }
    outputs
}

/// How much a chaos run reads: clicks keyed by their partition keys, clicks spread over
/// partition keys, and changes of DynamoDB items.
struct Load {
    clicks: Vec<(String, u64)>,
    spread: Vec<(String, Vec<u8>)>,
    items: usize,
}

async fn run(load: &Load, faults: FaultPlan) -> Run {
    let services = LocalServices::new(EPOCH, faults);
    let mut runtime =
        LocalRuntime::from_template(&chaos_template(), services.clone(), &chaos_factories())
            .unwrap();
    // Calls take a millisecond, so that a timeout can stop an invocation between two of them.
    services.set_latency(Some(Duration::from_millis(1)));
    let stream = runtime.resource("ClicksStream").unwrap();
    let records: Vec<(String, Vec<u8>)> = load
        .clicks
        .iter()
        .map(|(k, a)| {
            (
                k.clone(),
                format!(r#"{{"key":"{k}","amount":{a}}}"#).into_bytes(),
            )
        })
        .collect();
    let positions = services
        .kinesis
        .put_in_order(&stream, &records)
        .await
        .expect("the stream takes every record");
    services
        .kinesis
        .put_in_order(&runtime.resource("SpreadStream").unwrap(), &load.spread)
        .await
        .expect("the stream takes every record");
    let table = services
        .dynamodb
        .table(&runtime.resource("OrdersTable").unwrap())
        .unwrap();
    for item in orders(load.items) {
        table.put_item(item).unwrap();
    }
    let report = runtime
        .run_until_idle(Duration::from_secs(24 * 3600))
        .await
        .unwrap();
    let keys: Vec<String> = expected_counts(&load.clicks).keys().cloned().collect();
    let spread_keys: Vec<String> = spread_counts(&load.spread).keys().cloned().collect();
    let groups: Vec<String> = (0..10).map(|g| format!("g{g}")).collect();
    let queue = runtime.resource("CountsQueue").unwrap();
    let expected_ids = positions
        .iter()
        .map(|(shard, seq)| {
            OutputId::derive(
                "keyed-counter",
                keyed_counter::COUNTS,
                &Origin(format!("ClicksStream/{shard}")),
                &SequenceNumber::parse(seq).unwrap(),
                0,
            )
            .to_string()
        })
        .collect();
    Run {
        counts: stored_counts(&runtime, &keys).await,
        spread: stored_values(&runtime, "outbox-counter", &spread_keys).await,
        groups: stored_values(&runtime, "group-counter", &groups).await,
        outputs: bodies_by_id(&services, &queue),
        outbox_outputs: bodies_by_id(&services, &runtime.resource("OutboxCountsQueue").unwrap()),
        expiring_outputs: bodies_by_id(
            &services,
            &runtime.resource("ExpiringCountsQueue").unwrap(),
        ),
        messages: services.sqs.messages(&queue).len(),
        report,
        expected_ids,
        dead_letters: services
            .sqs
            .messages(&runtime.resource("DeadLetterQueue").unwrap())
            .len(),
        failed_batches: services
            .sqs
            .messages(&runtime.resource("FailedBatchesQueue").unwrap())
            .len(),
    }
}

/// Every fault at 2%, and now and then an SQS outage longer than the outbox counter's state TTL.
fn chaos_faults(seed: u64) -> FaultPlan {
    FaultPlan {
        outage: 0.000_5,
        outage_millis: 90_000,
        ..FaultPlan::all(0.02, seed)
    }
}

#[tokio::test(start_paused = true)]
async fn a_hundred_thousand_events_and_a_hundred_thousand_changes_under_every_fault_end_as_without_faults(
) {
    let load = Load {
        clicks: zipf_events(100_000, 1_000, 7),
        spread: spread(10_000, 5_000, 500, 5),
        items: 100_000,
    };
    let clean = run(&load, FaultPlan::default()).await;
    let chaos = run(&load, chaos_faults(7)).await;

    assert_eq!(
        clean.counts,
        expected_counts(&load.clicks),
        "the fault-free run counts every event"
    );
    assert_eq!(
        chaos.counts, clean.counts,
        "final state equals the fault-free run"
    );
    assert_eq!(
        clean.spread,
        spread_counts(&load.spread),
        "keys fed by many lanes too"
    );
    assert_eq!(chaos.spread, clean.spread);
    let groups: BTreeMap<String, Option<u64>> =
        (0..10).map(|g| (format!("g{g}"), Some(10_000))).collect();
    assert_eq!(clean.groups, groups, "every change counted once per group");
    assert_eq!(chaos.groups, groups, "also under faults");
    assert_eq!(clean.messages, 100_000);

    let ids: HashSet<String> = chaos.outputs.keys().cloned().collect();
    assert_eq!(ids.len(), 100_000);
    assert!(
        ids == chaos.expected_ids,
        "no output id missing, none unknown"
    );
    assert!(
        chaos.messages > 100_000,
        "faults caused duplicates: {}",
        chaos.messages
    );
    for (id, bodies) in &chaos.outputs {
        assert_eq!(
            &clean.outputs[id], bodies,
            "the same output as without faults, once an id"
        );
    }
    // Outbox delivery where writers race: the same ids as without faults, one body each. (Which
    // body differs from the fault-free run: a key's records from different lanes have no order
    // between them, so a record's count depends on which lane came first.)
    for (chaos, clean) in [
        (&chaos.outbox_outputs, &clean.outbox_outputs),
        (&chaos.expiring_outputs, &clean.expiring_outputs),
    ] {
        assert_eq!(chaos.len(), load.spread.len());
        assert!(chaos.keys().all(|id| clean.contains_key(id)));
        assert!(chaos.values().all(|bodies| bodies.len() == 1));
    }
    assert_eq!((chaos.dead_letters, chaos.failed_batches), (0, 0));

    for (name, stats) in &chaos.report.mappings {
        println!("chaos run, {name}: {stats:?}");
    }
    println!("virtual time {:?}", chaos.report.elapsed);
    let stats = &chaos.report.mappings[0].1;
    assert!(
        stats.function_errors > 0
            && stats.timeouts > 0
            && stats.duplicate_deliveries > 0
            && stats.partial_failures > 0,
        "{stats:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_run() {
    let load = Load {
        clicks: zipf_events(3_000, 100, 3),
        spread: spread(1_000, 100, 50, 3),
        items: 2_000,
    };
    let a = run(&load, FaultPlan::all(0.05, 11)).await;
    let b = run(&load, FaultPlan::all(0.05, 11)).await;
    assert_eq!(a.report.mappings, b.report.mappings);
    assert_eq!(a.report.elapsed, b.report.elapsed);
    assert_eq!(a.messages, b.messages);
    assert_eq!(a.counts, b.counts);
    let c = run(&load, FaultPlan::all(0.05, 12)).await;
    assert_ne!(
        a.report.mappings, c.report.mappings,
        "another seed, other faults"
    );
}

#[tokio::test(start_paused = true)]
async fn a_template_whose_watermarks_would_not_outlive_its_redeliveries_is_refused() {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let short = template().replace(
        "KEYWAY_REDELIVERY_WINDOW_SECONDS: \"90000\"",
        "KEYWAY_REDELIVERY_WINDOW_SECONDS: \"3600\"",
    );
    let err = LocalRuntime::from_template(&short, services.clone(), &factories())
        .err()
        .expect("refused");
    assert!(
        err.contains("KeyedCounterFunction/Clicks")
            && err.contains("KEYWAY_REDELIVERY_WINDOW_SECONDS"),
        "{err}"
    );
    let per_shard = template().replace(
        "KEYWAY_REDELIVERY_WINDOW_SECONDS: \"90000\"",
        "KEYWAY_REDELIVERY_WINDOW_SECONDS: \"90000\"\n          KEYWAY_LINEAGE: shard",
    );
    let err = LocalRuntime::from_template(&per_shard, services, &factories())
        .err()
        .expect("refused");
    assert!(
        err.contains("KEYWAY_LINEAGE") && err.contains("ParallelizationFactor"),
        "{err}"
    );
}
