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
use keyway::lambda::{executor_config, sink_from, state_store_from, Handler, StreamHandler};
use keyway::{Executor, Sinks};
use keyway_local::{
    Factory, FaultPlan, Latencies, LocalError, LocalRuntime, LocalServices, RunReport,
    StartingPosition,
};
use keyway_tests::operators::{GroupCounter, History, Tweaked};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The chaos run makes millions of small allocations; the `keyway` command serves them to the
/// embedded runtime with mimalloc, and so does this test.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const EPOCH: i64 = 1_767_225_600_000;

fn template() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml"))
        .expect("template.yaml")
}

fn factories() -> BTreeMap<String, Factory> {
    keyway_stack::functions()
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
    let namespace = keyway::ports::Namespace::new(
        "keyed-counter",
        keyway::operator::state_signature(&keyway::KeyedOperator::states(
            &keyed_counter::KeyedCounter,
        )),
    );
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

/// The CDK app's synthesized template of `stack`, when the test command made one.
fn cdk_template(stack: &str) -> Option<String> {
    match std::env::var("KEYWAY_CDK_OUT") {
        Ok(dir) => Some(
            std::fs::read_to_string(format!("{dir}/{stack}.template.json"))
                .unwrap_or_else(|e| panic!("{dir}/{stack}.template.json: {e}")),
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
impl keyway_local::template::Resolver for Names {
    fn reference(&self, id: &str) -> Option<String> {
        Some(format!("ref-of-{id}"))
    }
    fn attribute(&self, id: &str, attribute: &str) -> Option<String> {
        Some(format!("{attribute}-of-{id}"))
    }
}

#[tokio::test(start_paused = true)]
async fn the_cdk_app_builds_the_stack_that_template_yaml_describes() {
    use keyway_local::template::parse;
    let Some(cdk_text) = cdk_template("keyway") else {
        return;
    };
    let (sam, sam_template) = parse(&template()).unwrap();
    let (cdk, cdk_template) = parse(&cdk_text).unwrap();
    assert_eq!(cdk.resources, sam.resources, "tables, streams and queues");
    assert_eq!(cdk.functions.len(), sam.functions.len());
    for (c, s) in cdk.functions.iter().zip(&sam.functions) {
        assert_eq!(
            (&c.logical_id, &c.name, c.timeout, &c.events, &c.schedules),
            (&s.logical_id, &s.name, s.timeout, &s.events, &s.schedules),
            "{}: name, timeout, event source mappings and schedules",
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

#[test]
fn the_cdk_app_raises_the_alarms_template_yaml_raises_with_the_same_parameters() {
    use keyway_local::template::{long_form, parse, resources_of_type};
    let Some(cdk_text) = cdk_template("keyway") else {
        return;
    };
    let (_, sam) = parse(&template()).unwrap();
    let (_, cdk) = parse(&cdk_text).unwrap();
    let alarms = resources_of_type(&sam, "AWS::CloudWatch::Alarm");
    assert!(
        alarms.contains_key("KeyedCounterSkewAlarm")
            && alarms.contains_key("CdcJoinIteratorAgeAlarm"),
        "{:?}",
        alarms.keys()
    );
    // Metric math lists its queries in any order: compared by id.
    let by_id = |mut alarms: std::collections::BTreeMap<String, serde_json::Value>| {
        for alarm in alarms.values_mut() {
            if let Some(metrics) = alarm["Properties"]["Metrics"].as_array_mut() {
                metrics.sort_by_key(|m| m["Id"].as_str().unwrap_or_default().to_owned());
            }
        }
        alarms
    };
    assert_eq!(
        by_id(resources_of_type(&cdk, "AWS::CloudWatch::Alarm")),
        by_id(alarms)
    );
    for parameter in ["IteratorAgeAlarmMillis", "MetricMathAlarms"] {
        assert_eq!(
            long_form(&cdk["Parameters"][parameter]),
            long_form(&sam["Parameters"][parameter]),
            "{parameter}"
        );
    }
    assert_eq!(
        long_form(&cdk["Conditions"]["WithMetricMathAlarms"]),
        long_form(&sam["Conditions"]["WithMetricMathAlarms"])
    );
}

#[test]
fn the_cdk_app_takes_every_parameter_template_yaml_takes_with_the_same_defaults_and_limits() {
    use keyway_local::template::{long_form, parse};
    let Some(cdk_text) = cdk_template("keyway") else {
        return;
    };
    // Numbers as text: the CDK writes a default of a parameter with allowed values as a string.
    let settings = |template: &str| -> BTreeMap<String, BTreeMap<String, String>> {
        let (_, yaml) = parse(template).unwrap();
        let parameters = long_form(&yaml)["Parameters"].clone();
        let mut parameters: BTreeMap<String, serde_json::Value> =
            serde_json::from_value(parameters).unwrap();
        // The CDK's own, which its bootstrap stack answers.
        parameters.remove("BootstrapVersion");
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(items) => items
                .iter()
                .map(|i| i.to_string().replace('"', ""))
                .collect::<Vec<_>>()
                .join(","),
            other => other.to_string(),
        };
        parameters
            .into_iter()
            .map(|(name, parameter)| {
                let kept = parameter
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), text(v)))
                    .map(|(k, v)| match k.as_str() {
                        "Description" => (k, v.split_whitespace().collect::<Vec<_>>().join(" ")),
                        _ => (k, v),
                    })
                    .collect();
                (name, kept)
            })
            .collect()
    };
    let sam = settings(&template());
    assert!(sam.contains_key("Architecture") && sam.contains_key("LogRetentionDays"));
    assert_eq!(settings(&cdk_text), sam);
}

/// The dashboard's body, a Fn::Sub string in both templates, compared as the JSON it is.
#[test]
fn the_cdk_app_builds_the_dashboard_template_yaml_describes_with_every_function_on_it() {
    use keyway_local::template::{parse, resources_of_type};
    let (_, sam) = parse(&template()).unwrap();
    let body = |dashboards: BTreeMap<String, serde_json::Value>| -> serde_json::Value {
        let text = dashboards["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
            .as_str()
            .expect("a Fn::Sub body")
            .to_owned();
        serde_json::from_str(&text).expect("the body is JSON")
    };
    let ours = body(resources_of_type(&sam, "AWS::CloudWatch::Dashboard"));
    let text = ours.to_string();
    for function in resources_of_type(&sam, "AWS::Serverless::Function").keys() {
        for metric in [
            "RecordsIn",
            "RecordsLeftForRetry",
            "IteratorAge",
            "Errors",
            "Throttles",
        ] {
            let on_it = ours["widgets"].as_array().unwrap().iter().any(|w| {
                let widget = w.to_string();
                widget.contains(&format!("${{{function}}}")) && widget.contains(metric)
            });
            assert!(on_it, "{function}'s {metric} is not on the dashboard");
        }
    }
    assert!(
        text.contains("${DeadLetterQueue.QueueName}")
            && text.contains("${FailedBatchesQueue.QueueName}")
    );
    let Some(cdk_text) = cdk_template("keyway") else {
        return;
    };
    let (_, cdk) = parse(&cdk_text).unwrap();
    assert_eq!(
        body(resources_of_type(&cdk, "AWS::CloudWatch::Dashboard")),
        ours
    );
}

#[test]
fn the_cdk_app_builds_the_consumer_stack_that_consumer_yaml_describes() {
    use keyway_local::template::parse_with;
    let Some(cdk_text) = cdk_template("keyway-consumer") else {
        return;
    };
    let parameters = BTreeMap::from([
        ("Consumer".to_owned(), "live".to_owned()),
        (
            "PolicyTablePrefix".to_owned(),
            "keyway-policies-".to_owned(),
        ),
        (
            "PolicySyncFunctionArn".to_owned(),
            "arn:aws:lambda:us-east-1:000000000000:function:sync".to_owned(),
        ),
        (
            "FailedBatchesQueueArn".to_owned(),
            "arn:aws:sqs:us-east-1:000000000000:failed".to_owned(),
        ),
    ]);
    let (sam, _) = parse_with(keyway_stack::CONSUMER_TEMPLATE, &parameters).unwrap();
    let (cdk, _) = parse_with(&cdk_text, &parameters).unwrap();
    assert_eq!(cdk.resources, sam.resources, "the policy table");
    assert_eq!(cdk.mappings, sam.mappings, "its mapping to the policy sync");
    assert_eq!(sam.mappings.len(), 1);
    assert_eq!(
        sam.mappings[0].function,
        parameters["PolicySyncFunctionArn"]
    );
    assert_eq!(
        sam.mappings[0].on_failure_arn.as_deref(),
        Some("arn:aws:sqs:us-east-1:000000000000:failed")
    );
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
        (None, Some(Duration::from_secs(86_400)), 2),
        "no retry limit: a batch retried until its records are a day old"
    );
    assert_eq!(s.function_timeout, Duration::from_secs(30));
    assert_eq!(s.on_failure, runtime.resource("FailedBatchesQueue"));

    let events = zipf_events(2_000, 50, 1);
    counts_every_event(&mut runtime, &events).await;
    let counts_queue = runtime.resource("CountsQueue").unwrap();
    assert_eq!(runtime.services.sqs.messages(&counts_queue).len(), 2_000);
}

/// `keyway bench cost` bills what the functions call, not what the producer puts, and an
/// invocation lasts the latency of its calls on the paused clock, as it would wait on AWS.
#[tokio::test(start_paused = true)]
async fn a_runs_usage_bills_the_functions_calls_and_their_invocations_wait_the_services_latency() {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let mut runtime = LocalRuntime::from_template(&template(), services, &factories()).unwrap();
    runtime.services.set_function_latency(&Latencies {
        dynamodb: Duration::from_millis(5),
        kinesis: Duration::from_millis(20),
        sqs: Duration::from_millis(15),
    });
    // 2,000 events of 50 keys; each count is one small message.
    let events = zipf_events(2_000, 50, 1);
    produce(&runtime, &events).await;
    assert_eq!(
        runtime.usage().put_payload_units,
        0.0,
        "the producer's 2,000 PUT units are not the functions'"
    );
    runtime
        .run_until_idle(Duration::from_secs(3600))
        .await
        .unwrap();
    let usage = runtime.usage();
    let counter = &runtime.mappings()[0];
    assert_eq!(usage.triggered, counter.stats().spent);
    let invocations = usage.triggered.invocations;
    assert_eq!(invocations, counter.stats().invocations);
    assert!(invocations >= 4, "2,000 events in batches of at most 500");
    // Each key of a batch is read and written once, a unit each (items under 1 KB).
    assert!(usage.read_units > 0.0 && usage.read_units == usage.write_units);
    assert!(usage.write_units <= 50.0 * invocations as f64);
    // A message a count, ten a SendMessageBatch call.
    assert!(usage.sqs_requests >= 200.0, "{}", usage.sqs_requests);
    // At least a DynamoDB read, a commit and a send, one after the other, each invocation.
    let waited = usage.triggered.waited;
    assert!(
        waited >= Duration::from_millis(25) * invocations as u32,
        "{waited:?}"
    );
    assert!(usage.triggered.cpu > Duration::ZERO);
    assert_eq!(usage.put_payload_units, 0.0, "the counter puts nothing");
}

/// CreateEventSourceMapping, `Enabled`: "When true, the event source mapping is active. When
/// false, Lambda pauses polling and invocation." UpdateEventSourceMapping turns it back on, and
/// the mapping goes on from where it stopped.
#[tokio::test(start_paused = true)]
async fn a_mapping_the_template_disables_delivers_nothing_until_it_is_enabled() {
    let disabled = template().replacen(
        "            Stream: !GetAtt ClicksStream.Arn\n            StartingPosition: TRIM_HORIZON\n",
        "            Stream: !GetAtt ClicksStream.Arn\n            StartingPosition: TRIM_HORIZON\n            Enabled: false\n",
        1,
    );
    assert_ne!(disabled, template(), "the clicks mapping is disabled");
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let mut runtime = LocalRuntime::from_template(&disabled, services, &factories()).unwrap();
    assert!(!runtime.mappings()[0].settings().enabled);
    let events = zipf_events(500, 20, 3);
    produce(&runtime, &events).await;
    runtime.run_for(Duration::from_secs(60)).await;
    assert_eq!(runtime.mappings()[0].stats().invocations, 0);
    let keys: Vec<String> = expected_counts(&events).keys().cloned().collect();
    let nothing: BTreeMap<String, Option<u64>> = keys.iter().map(|k| (k.clone(), None)).collect();
    assert_eq!(stored_counts(&runtime, &keys).await, nothing);

    runtime
        .set_enabled("KeyedCounterFunction/Clicks", true)
        .unwrap();
    let more = zipf_events(500, 20, 4);
    produce(&runtime, &more).await;
    runtime
        .run_until_idle(Duration::from_secs(600))
        .await
        .unwrap();
    let all: Vec<(String, u64)> = events.iter().chain(&more).cloned().collect();
    let expected = expected_counts(&all);
    let keys: Vec<String> = expected.keys().cloned().collect();
    assert_eq!(stored_counts(&runtime, &keys).await, expected);
    let unknown = runtime.set_enabled("NoSuchFunction/Clicks", false);
    assert!(unknown
        .unwrap_err()
        .to_string()
        .contains("no such event source mapping"));
}

/// What a chaos run left behind.
struct Run {
    /// The keyed counter's state.
    counts: BTreeMap<String, Option<u64>>,
    /// The state of the counters that read both streams, and the DynamoDB-fed group counter's.
    outbox_state: BTreeMap<String, Option<u64>>,
    merged_state: BTreeMap<String, Option<u64>>,
    groups: BTreeMap<String, Option<u64>>,
    /// Output id to the bodies sent under it, by counter.
    outputs: HashMap<String, HashSet<String>>,
    outbox_outputs: HashMap<String, HashSet<String>>,
    merged_outputs: HashMap<String, HashSet<String>>,
    expiring_outputs: HashMap<String, HashSet<String>>,
    /// Each key's clicks, as the history function keeps them (their sequence numbers).
    histories: BTreeMap<String, Vec<String>>,
    /// Segment items of the state table that no head references or lists.
    orphans: Vec<String>,
    /// The faults that fired, by service, and the configured kinds that never did.
    faults: BTreeMap<&'static str, keyway_local::services::faults::FaultCounts>,
    faults_missing: Vec<keyway_local::services::faults::Fault>,
    messages: usize,
    report: RunReport,
    /// The keyed counter's outputs for each click, in the order the clicks were written: what
    /// a run that reshards can be compared by with one that does not (an output's id names its
    /// record's shard).
    outputs_by_input: Vec<Vec<String>>,
    /// The ids each counter derives for the records it reads.
    expected_ids: HashSet<String>,
    outbox_ids: HashSet<String>,
    merged_ids: HashSet<String>,
    dead_letters: usize,
    failed_batches: usize,
}

impl Run {
    fn with_outputs_by_input(mut self, positions: &Positions) -> Self {
        self.outputs_by_input = ids_in_order("keyed-counter", positions, &["ClicksStream"])
            .map(|id| {
                let mut bodies: Vec<String> = self
                    .outputs
                    .get(&id)
                    .map(|b| b.iter().cloned().collect())
                    .unwrap_or_default();
                bodies.sort();
                bodies
            })
            .collect();
        self
    }
}

/// A Kinesis event source of a function in the chaos template: ten lanes a shard, partial batch
/// responses, bisection, unlimited retries.
fn kinesis_source(name: &str, stream: &str, batch: usize) -> String {
    format!(
        r#"
        {name}:
          Type: Kinesis
          Properties:
            Stream: !GetAtt {stream}.Arn
            StartingPosition: TRIM_HORIZON
            BatchSize: {batch}
            FunctionResponseTypes: [ReportBatchItemFailures]
            BisectBatchOnFunctionError: true
            ParallelizationFactor: 10"#
    )
}

/// A function of the chaos template with its counts queue (if any) and event sources.
fn chaos_function(id: &str, counts_queue: Option<&str>, sources: &[String]) -> String {
    let counts = counts_queue
        .map(|q| format!("\n          COUNTS_SINK: !Sub \"sqs:${{{q}}}\""))
        .unwrap_or_default();
    format!(
        r#"
  {id}:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: .
      Environment:
        Variables:
          STATE_TABLE: !Ref StateTable
          DEAD_LETTER_SINK: !Sub "sqs:${{DeadLetterQueue}}"
          KEYWAY_REDELIVERY_WINDOW_SECONDS: "90000"{counts}
      Events:{}
"#,
        sources.concat()
    )
}

/// The stack's template as the chaos run deploys it: unlimited retries (under faults nothing may
/// be discarded), each shard read in ten lanes, and more functions beside the keyed counter (whose
/// keys are its partition keys):
/// - on two streams writing the same keys, one of them partitioned by device (so that a key's
///   records come from several lanes and streams at once, and its writers race), a counter that
///   delivers through its outbox and one that emits before it commits;
/// - a counter whose state lives 30 seconds, shorter than the outages of its queue;
/// - a history of every click of a few hot keys, lists that outgrow their heads (so that a crash
///   can come between a commit's segments and its head);
/// - a counter of DynamoDB changes per group, each group fed by thousands of items.
fn chaos_template() -> String {
    let streams = ["SpreadStream", "OtherStream", "HotStream"]
        .map(|s| {
            format!(
                "\n  {s}:\n    Type: AWS::Kinesis::Stream\n    Properties:\n      ShardCount: 2\n"
            )
        })
        .concat();
    let queues = [
        "OutboxCountsQueue",
        "MergedCountsQueue",
        "ExpiringCountsQueue",
    ]
    .map(|q| format!("\n  {q}:\n    Type: AWS::SQS::Queue\n"))
    .concat();
    let both = [
        kinesis_source("Spread", "SpreadStream", 200),
        kinesis_source("Other", "OtherStream", 200),
    ];
    let functions = [
        chaos_function("OutboxCounterFunction", Some("OutboxCountsQueue"), &both),
        chaos_function("MergedCounterFunction", Some("MergedCountsQueue"), &both),
        chaos_function(
            "ExpiringCounterFunction",
            Some("ExpiringCountsQueue"),
            &[kinesis_source("Spread", "SpreadStream", 200)],
        ),
        chaos_function(
            "HistoryFunction",
            None,
            // Batches of about the head's size: most commits write a segment.
            &[kinesis_source("Hot", "HotStream", 40)],
        ),
    ]
    .concat();
    let orders = r#"
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
      # The group counter reads only what an order became: its stream carries no old images.
      StreamSpecification:
        StreamViewType: NEW_IMAGE

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
"#;
    template()
        .replace(
            "MaximumRecordAgeInSeconds: 86400",
            "MaximumRecordAgeInSeconds: -1",
        )
        .replace("ParallelizationFactor: 2", "ParallelizationFactor: 10")
        .replacen(
            "\nOutputs:",
            &format!("{streams}{queues}{functions}{orders}\nOutputs:"),
            1,
        )
}

fn chaos_factories() -> BTreeMap<String, Factory> {
    let mut factories = factories();
    let counter = |name: &'static str, outbox: bool, ttl: Option<Duration>| -> Factory {
        Box::new(move |platform, env| {
            let sinks = Sinks::new(sink_from(platform, env, "DEAD_LETTER_SINK")?).with(
                &keyed_counter::COUNTS,
                sink_from(platform, env, "COUNTS_SINK")?,
            );
            let mut operator = Tweaked::new(keyed_counter::KeyedCounter).named(name);
            if outbox {
                operator = operator.through_outbox();
            }
            operator.ttl = ttl;
            let store = state_store_from(platform, env, "STATE_TABLE")?;
            let config = executor_config(env)?;
            let executor =
                Executor::new(operator, store, sinks, platform.clock())?.with_config(config);
            Ok(Arc::new(StreamHandler::new(executor)) as Arc<dyn Handler>)
        })
    };
    factories.insert(
        "OutboxCounterFunction".into(),
        counter("outbox-counter", true, None),
    );
    factories.insert(
        "ExpiringCounterFunction".into(),
        counter("expiring-counter", true, Some(Duration::from_secs(30))),
    );
    factories.insert(
        "MergedCounterFunction".into(),
        counter("merged-counter", false, None),
    );
    factories.insert(
        "HistoryFunction".into(),
        Box::new(|platform, env| {
            let sinks = Sinks::new(sink_from(platform, env, "DEAD_LETTER_SINK")?);
            let store = state_store_from(platform, env, "STATE_TABLE")?;
            let config = executor_config(env)?;
            let executor =
                Executor::new(History, store, sinks, platform.clock())?.with_config(config);
            Ok(Arc::new(StreamHandler::new(executor)) as Arc<dyn Handler>)
        }),
    );
    factories.insert(
        "GroupCounterFunction".into(),
        Box::new(|platform, env| {
            let sinks = Sinks::new(sink_from(platform, env, "DEAD_LETTER_SINK")?);
            let store = state_store_from(platform, env, "STATE_TABLE")?;
            let executor = Executor::new(GroupCounter, store, sinks, platform.clock())?;
            Ok(Arc::new(StreamHandler::new(executor)) as Arc<dyn Handler>)
        }),
    );
    factories
}

/// Clicks of `users` users, partitioned by one of `devices` devices (a key's records then come
/// from many partition keys, and so from many lanes of a shard), or by user when `devices` is 0.
fn spread_records(n: usize, users: usize, devices: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let user = rng.random_range(0..users);
            let data = format!(r#"{{"key":"user-{user}","amount":1}}"#).into_bytes();
            let partition_key = if devices == 0 {
                format!("user-{user}")
            } else {
                format!("device-{}", rng.random_range(0..devices))
            };
            (partition_key, data)
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

/// The stored states of `keys` of `operator`, whose state descriptors are `states`.
async fn stored_states(
    runtime: &LocalRuntime,
    operator: &str,
    states: &[keyway::operator::StateDescriptor],
    keys: &[String],
) -> HashMap<String, keyway::domain::KeyState> {
    let store = keyway::lambda::Platform::state_store(
        runtime.services.as_ref(),
        &runtime.resource("StateTable").unwrap(),
    )
    .unwrap();
    let namespace =
        keyway::ports::Namespace::new(operator, keyway::operator::state_signature(states));
    store.load(&namespace, keys).await.unwrap()
}

/// The `count` value of `keys` of `operator` (whose states are the keyed counter's).
async fn stored_values(
    runtime: &LocalRuntime,
    operator: &str,
    keys: &[String],
) -> BTreeMap<String, Option<u64>> {
    let loaded = stored_states(
        runtime,
        operator,
        &keyway::KeyedOperator::states(&GroupCounter),
        keys,
    )
    .await;
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

/// Each key's clicks as the history function stored them: their sequence numbers, in order.
async fn stored_histories(
    runtime: &LocalRuntime,
    keys: &[String],
) -> BTreeMap<String, Vec<String>> {
    let loaded = stored_states(
        runtime,
        "history",
        &keyway::KeyedOperator::states(&History),
        keys,
    )
    .await;
    keys.iter()
        .map(|k| {
            let clicks = loaded[k]
                .slots
                .get("clicks")
                .map(|s| {
                    s.entries
                        .iter()
                        .map(|e| {
                            e.get()
                                .trim_matches('"')
                                .split(':')
                                .next()
                                .unwrap()
                                .to_owned()
                        })
                        .collect()
                })
                .unwrap_or_default();
            (k.clone(), clicks)
        })
        .collect()
}

/// The segment items of the state table no head references or lists as garbage or pending.
fn orphan_segments(runtime: &LocalRuntime) -> Vec<String> {
    use keyway::adapters::dynamodb::DynamoStateStore;
    let table = runtime
        .services
        .dynamodb
        .table(&runtime.resource("StateTable").unwrap())
        .unwrap();
    let mut by_pk: BTreeMap<String, Vec<keyway::domain::Item>> = BTreeMap::new();
    for item in table.items() {
        by_pk
            .entry(item["pk"].as_s().unwrap().to_owned())
            .or_default()
            .push(item);
    }
    // The stack's operators with a preset dictionary: the enricher alone.
    let dictionaries: Vec<keyway::domain::Dictionary> =
        identity_enricher::enricher::STATE_DICTIONARIES
            .iter()
            .map(|t| keyway::domain::Dictionary::new(t))
            .collect();
    let mut orphans = Vec::new();
    for (pk, items) in by_pk {
        let head = items.iter().find(|i| i["sk"].as_s() == Some("head"));
        let accounted = head
            .map(|h| DynamoStateStore::<keyway_local::LocalTable>::accounted_for(h, &dictionaries))
            .unwrap_or_default();
        for item in &items {
            let sk = item["sk"].as_s().unwrap();
            if sk != "head" && !sk.starts_with("wm#") && !accounted.contains(sk) {
                orphans.push(format!("{pk} {sk}"));
            }
        }
    }
    orphans
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
    /// Clicks of the same users on two more streams, partitioned by device and by user.
    spread: Vec<(String, Vec<u8>)>,
    other: Vec<(String, Vec<u8>)>,
    /// Clicks of a few hot users, whose histories outgrow their heads.
    hot: Vec<(String, Vec<u8>)>,
    items: usize,
}

impl Load {
    fn new(clicks: usize, spread: usize, items: usize, seed: u64) -> Self {
        Self {
            clicks: zipf_events(clicks, 1_000, seed),
            spread: spread_records(spread, spread / 2, 500, seed),
            other: spread_records(spread, spread / 2, 0, seed + 1),
            hot: spread_records(spread * 2, 20, 0, seed + 2),
            items,
        }
    }

    /// The counts of the counters that read both of the streams of the same users.
    fn both_counts(&self) -> BTreeMap<String, Option<u64>> {
        let mut counts = spread_counts(&self.spread);
        for (key, n) in spread_counts(&self.other) {
            *counts.entry(key).or_default().get_or_insert(0) += n.unwrap_or(0);
        }
        counts
    }
}

/// Where each record of a run landed: stream, shard and sequence number.
type Positions = Vec<(&'static str, String, String)>;

/// Puts one half (0 or 1) of the run's clicks on their streams and of its orders in their
/// table.
async fn produce_half(runtime: &LocalRuntime, load: &Load, half: usize) -> Positions {
    let services = &runtime.services;
    let part = |n: usize| if half == 0 { 0..n / 2 } else { n / 2..n };
    let clicks: Vec<(String, Vec<u8>)> = load.clicks[part(load.clicks.len())]
        .iter()
        .map(|(k, a)| {
            let data = format!(r#"{{"key":"{k}","amount":{a}}}"#).into_bytes();
            (k.clone(), data)
        })
        .collect();
    let mut positions = Positions::new();
    for (stream, records) in [
        ("ClicksStream", &clicks[..]),
        ("SpreadStream", &load.spread[part(load.spread.len())]),
        ("OtherStream", &load.other[part(load.other.len())]),
        ("HotStream", &load.hot[part(load.hot.len())]),
    ] {
        let put = services
            .kinesis
            .put_in_order(&runtime.resource(stream).unwrap(), records)
            .await
            .expect("the stream takes every record");
        positions.extend(put.into_iter().map(|(shard, seq)| (stream, shard, seq)));
    }
    let table = services
        .dynamodb
        .table(&runtime.resource("OrdersTable").unwrap())
        .unwrap();
    for item in orders(load.items).drain(part(load.items)) {
        table.put_item(item).unwrap();
    }
    positions
}

/// Reshards every stream the run reads, each its own way: UpdateShardCount up, a split, a
/// merge, UpdateShardCount down; the orders table's stream shard splits and then every shard
/// rolls over.
fn reshard(runtime: &LocalRuntime) {
    let kinesis = &runtime.services.kinesis;
    let stream = |id: &str| runtime.resource(id).unwrap();
    kinesis
        .update_shard_count(&stream("ClicksStream"), 3)
        .unwrap();
    kinesis
        .split_shard(&stream("SpreadStream"), "shardId-000000000000", 1 << 126)
        .unwrap();
    kinesis
        .merge_shards(
            &stream("OtherStream"),
            "shardId-000000000000",
            "shardId-000000000001",
        )
        .unwrap();
    kinesis.update_shard_count(&stream("HotStream"), 1).unwrap();
    let orders = runtime
        .services
        .dynamodb
        .table(&stream("OrdersTable"))
        .unwrap();
    orders.split_stream_shard(0).unwrap();
    orders.roll_over_stream();
}

/// The ids `operator` derives for the records of `streams`, in the order they were written.
fn ids_in_order<'p>(
    operator: &'p str,
    positions: &'p Positions,
    streams: &'p [&str],
) -> impl Iterator<Item = String> + 'p {
    positions
        .iter()
        .filter(|(stream, _, _)| streams.contains(stream))
        .map(move |(stream, shard, seq)| {
            OutputId::derive(
                operator,
                keyed_counter::COUNTS.name,
                &Origin(format!("{stream}/{shard}")),
                &SequenceNumber::parse(seq).unwrap(),
                0,
            )
            .to_string()
        })
}

/// The ids `operator` derives for the records of `streams`.
fn expected_ids(operator: &str, positions: &Positions, streams: &[&str]) -> HashSet<String> {
    ids_in_order(operator, positions, streams).collect()
}

/// A run of `load` under `faults`: half of it is written, the mappings run a while, the streams
/// reshard when `resharding` says so (while batches of their parents still wait), and the other
/// half is written to the shards there are then.
async fn run(load: &Load, faults: FaultPlan, resharding: bool) -> Run {
    let services = LocalServices::new(EPOCH, faults);
    let mut runtime =
        LocalRuntime::from_template(&chaos_template(), services.clone(), &chaos_factories())
            .unwrap();
    // Calls take a millisecond, so that a timeout can stop an invocation between two of them.
    services.set_latency(Some(Duration::from_millis(1)));
    // Producers meet each shard's write limit, as on AWS, and write again.
    services.kinesis.set_write_limit(true);
    // One of the outbox counter's two mappings is off for the first minute, as an operator
    // pausing it would leave it (UpdateEventSourceMapping Enabled: false), then on again: the
    // key's other writer runs ahead meanwhile.
    let paused = "OutboxCounterFunction/Spread";
    runtime.set_enabled(paused, false).unwrap();
    let mut positions = produce_half(&runtime, load, 0).await;
    runtime.run_for(Duration::from_secs(2)).await;
    if resharding {
        let waiting: usize = runtime.mappings().iter().map(|m| m.pending().0).sum();
        println!("records waiting at the reshard: {waiting}");
        assert!(
            waiting > 0,
            "the streams reshard while their parents' records still wait"
        );
        reshard(&runtime);
    }
    positions.extend(produce_half(&runtime, load, 1).await);
    let first = runtime.run_for(Duration::from_secs(60)).await;
    let invoked = |report: &RunReport| {
        let stats = report.mappings.iter().find(|(name, _)| name == paused);
        stats.map(|(_, s)| s.invocations)
    };
    assert_eq!(
        invoked(&first),
        Some(0),
        "nothing reaches a disabled mapping"
    );
    runtime.set_enabled(paused, true).unwrap();
    let report = runtime
        .run_until_idle(Duration::from_secs(24 * 3600))
        .await
        .unwrap();
    assert!(invoked(&report) > Some(0), "an enabled mapping reads on");
    let keys: Vec<String> = expected_counts(&load.clicks).keys().cloned().collect();
    let both_keys: Vec<String> = load.both_counts().keys().cloned().collect();
    let hot_keys: Vec<String> = spread_counts(&load.hot).keys().cloned().collect();
    let groups: Vec<String> = (0..10).map(|g| format!("g{g}")).collect();
    let queue = |id: &str| runtime.resource(id).unwrap();
    let both = ["SpreadStream", "OtherStream"];
    Run {
        counts: stored_counts(&runtime, &keys).await,
        outbox_state: stored_values(&runtime, "outbox-counter", &both_keys).await,
        merged_state: stored_values(&runtime, "merged-counter", &both_keys).await,
        groups: stored_values(&runtime, "group-counter", &groups).await,
        outputs: bodies_by_id(&services, &queue("CountsQueue")),
        outbox_outputs: bodies_by_id(&services, &queue("OutboxCountsQueue")),
        merged_outputs: bodies_by_id(&services, &queue("MergedCountsQueue")),
        expiring_outputs: bodies_by_id(&services, &queue("ExpiringCountsQueue")),
        histories: stored_histories(&runtime, &hot_keys).await,
        orphans: orphan_segments(&runtime),
        faults: services.faults_fired(),
        faults_missing: services.faults_missing(),
        messages: services.sqs.messages(&queue("CountsQueue")).len(),
        report,
        outputs_by_input: Vec::new(),
        expected_ids: expected_ids("keyed-counter", &positions, &["ClicksStream"]),
        outbox_ids: expected_ids("outbox-counter", &positions, &both),
        merged_ids: expected_ids("merged-counter", &positions, &both),
        dead_letters: services.sqs.messages(&queue("DeadLetterQueue")).len(),
        failed_batches: services.sqs.messages(&queue("FailedBatchesQueue")).len(),
    }
    .with_outputs_by_input(&positions)
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
async fn a_hundred_thousand_events_and_changes_under_every_fault_and_a_reshard_end_as_without_either(
) {
    let load = Load::new(100_000, 10_000, 100_000, 7);
    let clean = run(&load, FaultPlan::default(), false).await;
    let chaos = run(&load, chaos_faults(7), true).await;

    assert_eq!(
        clean.counts,
        expected_counts(&load.clicks),
        "the fault-free run counts every event"
    );
    assert_eq!(
        chaos.counts, clean.counts,
        "final state equals the fault-free run"
    );
    // Two streams write the same keys, each read in ten lanes: several writers a key.
    assert_eq!(
        clean.outbox_state,
        load.both_counts(),
        "keys fed by many writers too"
    );
    assert_eq!(chaos.outbox_state, clean.outbox_state);
    assert_eq!(chaos.merged_state, clean.outbox_state);
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
    assert!(clean.outputs_by_input.iter().all(|b| b.len() == 1));
    assert!(
        chaos.outputs_by_input == clean.outputs_by_input,
        "each click's output as without faults and without the reshard, one body an id"
    );
    // Where writers race, the outbox sends each output once computed, under its id: one body
    // an id. (Which body differs from the fault-free run: records of one key from different
    // lanes have no order between them.) Emit-then-commit sends every id too, but a writer that
    // lost a race may have sent one computed from the state it lost with: what the README says,
    // and why it asks keys with several writers to use the outbox.
    let one_body =
        |outputs: &HashMap<String, HashSet<String>>| outputs.values().all(|b| b.len() == 1);
    let ids = |outputs: &HashMap<String, HashSet<String>>| -> HashSet<String> {
        outputs.keys().cloned().collect()
    };
    assert_eq!(ids(&chaos.outbox_outputs), chaos.outbox_ids);
    assert_eq!(ids(&clean.outbox_outputs), clean.outbox_ids);
    assert!(one_body(&chaos.outbox_outputs) && one_body(&clean.outbox_outputs));
    assert_eq!(ids(&chaos.merged_outputs), chaos.merged_ids);
    assert_eq!(chaos.expiring_outputs.len(), load.spread.len());
    assert!(clean.outbox_ids.len() == load.spread.len() + load.other.len());
    assert!(one_body(&chaos.expiring_outputs));
    assert_eq!((chaos.dead_letters, chaos.failed_batches), (0, 0));
    // Lists that outgrow their heads, committed through crashes between segments and head.
    assert_eq!(
        chaos.histories, clean.histories,
        "every key's clicks, once each, in order"
    );
    assert_eq!(
        clean.histories.values().map(Vec::len).sum::<usize>(),
        load.hot.len()
    );
    assert_eq!(
        chaos.orphans,
        Vec::<String>::new(),
        "no segment left that nothing frees"
    );

    for (service, counts) in &chaos.faults {
        println!("chaos run, faults fired in {service}: {counts:?}");
    }
    for (name, stats) in &chaos.report.mappings {
        println!("chaos run, {name}: {stats:?}");
    }
    println!("virtual time {:?}", chaos.report.elapsed);
    assert_eq!(chaos.faults_missing, [], "every configured fault fired");
    // Against the fault-free run of the same input: more invocations, errors, timeouts and
    // crashes, partial failures and duplicate deliveries, for the same end state.
    for ((name, chaos), (_, clean)) in chaos.report.mappings.iter().zip(&clean.report.mappings) {
        if clean.records_delivered == 0 {
            // A function of the stack this load does not feed (the identity enricher: its chaos
            // run is tests/tests/identity_stack.rs) gets nothing in either run.
            assert_eq!(chaos.records_delivered, 0, "{name}");
            continue;
        }
        assert_eq!(
            (
                clean.function_errors,
                clean.timeouts,
                clean.crashes,
                clean.duplicate_deliveries
            ),
            (0, 0, 0, 0),
            "{name}: without faults nothing fails"
        );
        assert!(chaos.invocations > clean.invocations, "{name}");
        assert!(chaos.records_delivered > clean.records_delivered, "{name}");
    }
    let totals = chaos
        .report
        .mappings
        .iter()
        .fold((0, 0, 0, 0), |t, (_, s)| {
            (
                t.0 + s.timeouts,
                t.1 + s.crashes,
                t.2 + s.duplicate_deliveries,
                t.3 + s.partial_failures,
            )
        });
    assert!(
        totals.0 > 0 && totals.1 > 0 && totals.2 > 0 && totals.3 > 0,
        "timeouts, crashes, duplicate deliveries, partial failures: {totals:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_run() {
    let load = Load::new(3_000, 1_000, 2_000, 3);
    let a = run(&load, FaultPlan::all(0.05, 11), true).await;
    let b = run(&load, FaultPlan::all(0.05, 11), true).await;
    assert_eq!(a.report.mappings, b.report.mappings);
    assert_eq!(a.report.elapsed, b.report.elapsed);
    assert_eq!(a.messages, b.messages);
    assert_eq!(a.counts, b.counts);
    let c = run(&load, FaultPlan::all(0.05, 12), true).await;
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
    let LocalError::Function { path, problem } = err else {
        panic!("a function's error: {err}");
    };
    assert_eq!(
        path,
        "Resources/KeyedCounterFunction/Properties/Events/Clicks"
    );
    assert!(
        problem.starts_with("environment variable KEYWAY_REDELIVERY_WINDOW_SECONDS: "),
        "{problem}"
    );
    let per_shard = template().replace(
        "KEYWAY_REDELIVERY_WINDOW_SECONDS: \"90000\"",
        "KEYWAY_REDELIVERY_WINDOW_SECONDS: \"90000\"\n          KEYWAY_LINEAGE: shard",
    );
    let err = LocalRuntime::from_template(&per_shard, services, &factories())
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("KEYWAY_LINEAGE") && text.contains("ParallelizationFactor"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_function_whose_environment_names_no_sink_is_refused_at_the_variables_template_path() {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let bad = template().replacen(
        "COUNTS_SINK: !Sub",
        "COUNTS_SINK: sns:counts\n          UNUSED: !Sub",
        1,
    );
    assert_ne!(bad, template(), "the template names the counts sink");
    let err = LocalRuntime::from_template(&bad, services, &factories())
        .err()
        .expect("refused");
    assert_eq!(
        err,
        LocalError::Function {
            path: "Resources/KeyedCounterFunction/Properties/Environment/Variables/COUNTS_SINK"
                .into(),
            problem:
                "sink target \"sns:counts\": expected kinesis:<stream name> or sqs:<queue URL>"
                    .into(),
        }
    );
}

#[tokio::test(start_paused = true)]
async fn the_stacks_functions_write_a_skew_line_per_batch_that_names_the_hot_key_of_a_skewed_stream(
) {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let mut runtime = LocalRuntime::from_template(&template(), services, &factories()).unwrap();
    runtime.services.metrics.take();
    // 90% of the clicks are one user's.
    let events: Vec<(String, u64)> = (0..2_000)
        .map(|i| {
            let user = if i % 10 == 0 { i } else { 7 };
            (format!("user-{user}"), 1)
        })
        .collect();
    counts_every_event(&mut runtime, &events).await;
    let (lines, outcomes): (Vec<serde_json::Value>, Vec<serde_json::Value>) = runtime
        .services
        .metrics
        .take()
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .filter(|line: &serde_json::Value| line["Operator"] == "keyed-counter")
        .partition(|line| line.get("Shard").is_some());
    assert!(!lines.is_empty(), "no skew line");
    // Each batch's outcome line too: every click in, every click applied, nothing left.
    let total = |name: &str| -> f64 { outcomes.iter().map(|l| l[name].as_f64().unwrap()).sum() };
    assert_eq!(
        [
            total("RecordsIn"),
            total("Applied"),
            total("RecordsLeftForRetry")
        ],
        [2_000.0, 2_000.0, 0.0]
    );
    let records: f64 = lines.iter().map(|l| l["Records"].as_f64().unwrap()).sum();
    assert_eq!(
        records, 2_000.0,
        "every record counted once, in the line of its batch"
    );
    let shards: std::collections::BTreeSet<&str> =
        lines.iter().map(|l| l["Shard"].as_str().unwrap()).collect();
    assert!(
        shards.iter().all(|s| s.starts_with("shardId-")),
        "{shards:?}"
    );
    for line in &lines {
        assert_eq!(line["Function"], "KeyedCounterFunction", "{line}");
    }
    // The hot user leads the line of every batch it is in.
    let hot_lines = lines
        .iter()
        .filter(|l| l["HotKeys"][0]["key"].as_str() == Some("user-7"))
        .count();
    let with_hot = lines
        .iter()
        .filter(|l| {
            l["HotKeys"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["key"] == "user-7")
        })
        .count();
    assert!(
        with_hot > 0 && hot_lines == with_hot,
        "{hot_lines} of {with_hot}"
    );
}

/// Every DynamoDB table of `template` (YAML or JSON), by logical id, with what it lacks of
/// encryption at rest under a KMS key and point-in-time recovery.
fn unprotected_tables(template: &str) -> Vec<String> {
    use keyway_local::template::{parse_with, resources_of_type};
    // A consumer's stack takes parameters without defaults; the tables do not depend on them.
    let parameters = BTreeMap::from(
        [
            ("Consumer", "live"),
            ("PolicyTablePrefix", "keyway-policies-"),
            (
                "PolicySyncFunctionArn",
                "arn:aws:lambda:us-east-1:000000000000:function:sync",
            ),
            (
                "FailedBatchesQueueArn",
                "arn:aws:sqs:us-east-1:000000000000:failed",
            ),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    let consumer = template.contains("SubscriberPolicy");
    let none = BTreeMap::new();
    let (_, template) = parse_with(template, if consumer { &parameters } else { &none }).unwrap();
    let tables = resources_of_type(&template, "AWS::DynamoDB::Table");
    assert!(!tables.is_empty(), "the template makes tables");
    tables
        .iter()
        .flat_map(|(id, table)| {
            let props = &table["Properties"];
            let mut lacks = Vec::new();
            if props["SSESpecification"]["SSEEnabled"] != serde_json::json!(true) {
                lacks.push(format!("{id}: SSESpecification.SSEEnabled"));
            }
            let recovery = &props["PointInTimeRecoverySpecification"];
            if recovery["PointInTimeRecoveryEnabled"] != serde_json::json!(true) {
                lacks.push(format!("{id}: PointInTimeRecoverySpecification"));
            }
            lacks
        })
        .collect()
}

#[test]
fn every_table_of_both_templates_and_the_cdk_app_is_encrypted_and_recoverable_to_a_point_in_time() {
    let mut templates = vec![
        ("template.yaml", keyway_stack::TEMPLATE.to_owned()),
        ("consumer.yaml", keyway_stack::CONSUMER_TEMPLATE.to_owned()),
    ];
    for stack in ["keyway", "keyway-consumer"] {
        if let Some(text) = cdk_template(stack) {
            templates.push((stack, text));
        }
    }
    for (name, text) in templates {
        assert_eq!(unprotected_tables(&text), Vec::<String>::new(), "{name}");
    }
}
