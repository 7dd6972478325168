//! The embedded runtime running the stack's own template.yaml: the keyed counter wired as the
//! template says, a chaos run with every fault, and determinism under a seed; and the CDK app's
//! synthesized stack, which must wire exactly as template.yaml does.
//!
//! The CDK template is synthesized by the test command (`npx cdk synth` in infra/, after `npm ci`);
//! `KEYWAY_CDK_OUT` names its output folder.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use keyed_counter::CountUpdate;
use keyway::domain::{Origin, OutputId, SequenceNumber};
use keyway::lambda::Handler;
use keyway::local::{Factory, FaultPlan, LocalRuntime, LocalServices, RunReport, StartingPosition};
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

struct Run {
    counts: BTreeMap<String, Option<u64>>,
    /// Output id to the bodies sent under it.
    outputs: HashMap<String, HashSet<String>>,
    messages: usize,
    report: RunReport,
    expected_ids: HashSet<String>,
    dead_letters: usize,
    failed_batches: usize,
}

/// The stack's template with unlimited retries: under faults nothing may be discarded.
fn patient_template() -> String {
    template()
        .replace("MaximumRetryAttempts: 10", "MaximumRetryAttempts: -1")
        .replace(
            "MaximumRecordAgeInSeconds: 86400",
            "MaximumRecordAgeInSeconds: -1",
        )
}

async fn run(events: &[(String, u64)], faults: FaultPlan) -> Run {
    let services = LocalServices::new(EPOCH, faults);
    let mut runtime =
        LocalRuntime::from_template(&patient_template(), services.clone(), &factories()).unwrap();
    // Calls take a millisecond, so that a timeout can stop an invocation between two of them.
    services.set_latency(Some(Duration::from_millis(1)));
    let positions = produce(&runtime, events).await;
    let report = runtime
        .run_until_idle(Duration::from_secs(24 * 3600))
        .await
        .unwrap();
    let expected = expected_counts(events);
    let keys: Vec<String> = expected.keys().cloned().collect();
    let counts = stored_counts(&runtime, &keys).await;
    let queue = runtime.resource("CountsQueue").unwrap();
    let messages = services.sqs.messages(&queue);
    let mut outputs: HashMap<String, HashSet<String>> = HashMap::new();
    for m in &messages {
        outputs
            .entry(m.output_id.clone().expect("an output id"))
            .or_default()
            .insert(m.body.clone());
    }
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
        counts,
        outputs,
        messages: messages.len(),
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

#[tokio::test(start_paused = true)]
async fn a_hundred_thousand_events_with_every_fault_at_two_percent_end_as_without_faults() {
    let events = zipf_events(100_000, 1_000, 7);
    let clean = run(&events, FaultPlan::default()).await;
    let chaos = run(&events, FaultPlan::all(0.02, 7)).await;

    assert_eq!(
        clean.counts,
        expected_counts(&events),
        "the fault-free run counts every event"
    );
    assert_eq!(
        chaos.counts, clean.counts,
        "final state equals the fault-free run"
    );
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
    assert!(
        chaos.outputs.values().all(|bodies| bodies.len() == 1),
        "every duplicate repeats an output already sent, body and id"
    );
    for (id, bodies) in &chaos.outputs {
        let body: CountUpdate = serde_json::from_str(bodies.iter().next().unwrap()).unwrap();
        assert_eq!(
            clean.outputs[id].iter().next().map(String::as_str),
            Some(serde_json::to_string(&body).unwrap().as_str())
        );
    }
    assert_eq!((chaos.dead_letters, chaos.failed_batches), (0, 0));

    let stats = &chaos.report.mappings[0].1;
    println!(
        "chaos run: {stats:?}, virtual time {:?}",
        chaos.report.elapsed
    );
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
    let events = zipf_events(3_000, 100, 3);
    let a = run(&events, FaultPlan::all(0.05, 11)).await;
    let b = run(&events, FaultPlan::all(0.05, 11)).await;
    assert_eq!(a.report.mappings, b.report.mappings);
    assert_eq!(a.report.elapsed, b.report.elapsed);
    assert_eq!(a.messages, b.messages);
    assert_eq!(a.counts, b.counts);
    let c = run(&events, FaultPlan::all(0.05, 12)).await;
    assert_ne!(
        a.report.mappings, c.report.mappings,
        "another seed, other faults"
    );
}
