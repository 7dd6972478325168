//! Keyed aggregation under every fault: the stack of template.yaml aggregates a stream of keyed
//! values, one key turning hot halfway and salted over eight buckets from then on, with every
//! fault of the embedded runtime at 2%; each key's last result equals what adding its values up
//! one by one gives, as it does without faults, and the unreadable records are dead-lettered.
//!
//! `KEYWAY_AGGREGATE_CHAOS_EVENTS` sets the number of events (50,000 by default, enough
//! invocations for each fault of an invocation to fire; scripts/test runs 200,000).
//!
//! A second run has the producer salt the keys the hot-key registry lists, under faults: a key
//! turning hot is salted within seconds, without a deploy, and goes back once it cools.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use keyed_aggregate::aggregate::{Aggregate, Partial};
use keyed_aggregate::exact::Exact;
use keyed_aggregate::merge::result_line;
use keyway::domain::salt::{Partitioner, Salting};
use keyway::local::{FaultPlan, LocalRuntime, LocalServices};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

const EPOCH: i64 = 1_767_225_600_000;
/// The key that turns hot halfway through.
const SURGE: &str = "surge";

/// The events a test puts on the stream, with what they must add up to.
struct Workload {
    /// (partition key, data), in order.
    records: Vec<(String, Vec<u8>)>,
    /// Each key's values added up one by one.
    oracle: BTreeMap<String, Partial>,
    /// Records that are not JSON.
    bad: usize,
}

/// The events (partition key, data) as a producer that salts `SURGE` once it is hot sends them,
/// and the oracle: each key's values added up one by one. Every thousandth record is not JSON.
fn workload(events: usize, seed: u64) -> Workload {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut partitioner = Partitioner::new(Salting::None);
    let mut oracle: BTreeMap<String, Partial> = BTreeMap::new();
    let mut records = Vec::with_capacity(events);
    let mut bad = 0;
    for i in 0..events {
        if i == events / 2 {
            let hot = BTreeSet::from([SURGE.to_owned()]);
            partitioner.set_salting(Salting::Listed { hot, buckets: 8 });
        }
        if i % 1000 == 999 {
            bad += 1;
            records.push((format!("k{i}"), b"{\"key\": \"cut".to_vec()));
            continue;
        }
        let key = if i >= events / 2 && rng.random_bool(0.5) {
            SURGE.to_owned()
        } else {
            // Skewed over 300 keys: the square of a uniform draw favours the first ones.
            let x: f64 = rng.random();
            format!("k{}", (x * x * 300.0) as u32)
        };
        let cents: i64 = rng.random_range(-5_000..100_000);
        let value = format!("{}.{:02}", cents / 100, (cents % 100).abs());
        let value = if cents < 0 && cents > -100 {
            format!("-{value}")
        } else {
            value
        };
        oracle
            .entry(key.clone())
            .or_default()
            .merge(&Partial::of(Some(Exact::parse(&value).unwrap())))
            .unwrap();
        let data = format!(r#"{{"key":"{key}","value":{value},"seq":{i}}}"#);
        records.push((partitioner.partition_key(&key), data.into_bytes()));
    }
    Workload {
        records,
        oracle,
        bad,
    }
}

/// Each key's last result (the one of the highest count: running totals only grow) and the
/// number of dead letters, after the stack ran the events.
async fn run(
    records: &[(String, Vec<u8>)],
    faults: FaultPlan,
) -> (BTreeMap<String, String>, usize) {
    let faulty = faults.throttle > 0.0;
    let services = LocalServices::new(EPOCH, faults);
    let parameters = BTreeMap::from([
        ("AggregateValuePointer".to_owned(), "/value".to_owned()),
        ("Aggregates".to_owned(), "count,sum,min,max,mean".to_owned()),
        ("AggregateFlushSeconds".to_owned(), "30".to_owned()),
    ]);
    let mut runtime = LocalRuntime::from_template_with(
        keyway_stack::TEMPLATE,
        &parameters,
        services.clone(),
        &keyway_stack::functions(),
    )
    .unwrap();
    let stream = runtime.resource("AggregateEventsStream").unwrap();
    services
        .kinesis
        .put_in_order(&stream, records)
        .await
        .unwrap();
    runtime
        .run_until_idle(Duration::from_secs(24 * 3600))
        .await
        .unwrap();
    // The last running totals flush half a minute on, at the next sweep; then the merge runs.
    runtime.run_for(Duration::from_secs(150)).await;
    runtime
        .run_until_idle(Duration::from_secs(24 * 3600))
        .await
        .unwrap();

    let results = runtime.resource("AggregateResultsStream").unwrap();
    let mut last: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for record in services.kinesis.records(&results) {
        let body: Value = serde_json::from_slice(&record.data).unwrap();
        let key = body["key"].as_str().unwrap().to_owned();
        let count = body["count"].as_u64().unwrap();
        let text = String::from_utf8(record.data.to_vec()).unwrap();
        let entry = last.entry(key).or_insert((0, String::new()));
        if count >= entry.0 {
            *entry = (count, text);
        }
    }
    let dead = runtime.resource("DeadLetterQueue").unwrap();
    let letters = services.sqs.messages(&dead).len();
    if faulty {
        // A crash inside a commit needs a commit of several writes (state beyond one item):
        // a key's partials are far smaller. Every other fault must have fired.
        let missing = services.faults_missing();
        assert!(
            missing
                .iter()
                .all(|f| *f == keyway::local::Fault::CrashInCommit),
            "faults that never fired: {missing:?}"
        );
    }
    (
        last.into_iter().map(|(k, (_, line))| (k, line)).collect(),
        letters,
    )
}

#[tokio::test(start_paused = true)]
async fn under_every_fault_at_two_percent_each_keys_result_equals_its_values_added_up_one_by_one() {
    let events: usize = std::env::var("KEYWAY_AGGREGATE_CHAOS_EVENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50_000);
    let Workload {
        records,
        oracle,
        bad,
    } = workload(events, 23);
    let aggregates = Aggregate::ALL;
    let expected: BTreeMap<String, String> = oracle
        .iter()
        .map(|(key, total)| (key.clone(), result_line(key, None, total, &aggregates)))
        .collect();
    assert!(
        oracle[SURGE].count as usize > events / 5,
        "the surge is hot"
    );

    let (clean, clean_letters) = run(&records, FaultPlan::default()).await;
    assert_eq!(clean, expected, "without faults");
    assert_eq!(clean_letters, bad);

    let (faulty, faulty_letters) = run(&records, FaultPlan::all(0.02, 7)).await;
    let differing: Vec<&String> = expected
        .keys()
        .filter(|k| faulty.get(*k) != expected.get(*k))
        .collect();
    assert!(
        differing.is_empty(),
        "{} keys differ under faults, e.g. {:?}: {:?} against {:?}",
        differing.len(),
        differing.first(),
        differing.first().map(|k| &faulty[*k]),
        differing.first().map(|k| &expected[*k])
    );
    assert_eq!(faulty.len(), expected.len());
    assert!(
        faulty_letters >= bad,
        "every unreadable record dead-lettered, some twice"
    );
    println!(
        "{events} events over {} keys, {bad} unreadable; {} dead letters under faults",
        expected.len(),
        faulty_letters
    );
}

/// The largest shard's load over the mean, averaged over `seconds`.
fn mean_max_over_mean(seconds: &[&keyway_stack::adaptive::Second]) -> f64 {
    let spreads: Vec<f64> = seconds
        .iter()
        .map(|s| {
            let loads: Vec<f64> = s.shard_records.iter().map(|&n| n as f64).collect();
            keyway::domain::skew::max_over_mean(&loads)
        })
        .collect();
    spreads.iter().sum::<f64>() / spreads.len().max(1) as f64
}

#[tokio::test(start_paused = true)]
async fn under_faults_a_key_turning_hot_is_salted_from_the_registry_without_a_deploy_and_goes_back_when_it_cools(
) {
    use keyway_stack::adaptive::{run, Phase, Settings};
    let settings = Settings {
        phases: vec![
            Phase {
                seconds: 10,
                hot_share: 0.0,
            },
            Phase {
                seconds: 25,
                hot_share: 0.8,
            },
            Phase {
                seconds: 30,
                hot_share: 0.0,
            },
        ],
        rate: 400,
        keys: 40,
        buckets: 8,
        period_seconds: 2,
        refresh: Duration::from_secs(1),
        faults: FaultPlan::all(0.02, 11),
        seed: 5,
    };
    let outcome = run(&settings).await.unwrap();
    assert_eq!(outcome.counts, outcome.oracle, "each key counted exactly");

    let turns = outcome.turns(0.5).unwrap();
    let hot = turns.hot;
    let salted = turns.salted.expect("the hot key is salted");
    assert!(salted >= hot, "salted at {salted} s, while still cool");
    // Its period ends, the next report decides it, and the producer reads the list: at most two
    // periods and a refresh, and a period more for reports that faults held back.
    assert!(
        salted - hot <= 7,
        "salted {} s after turning hot",
        salted - hot
    );
    let cooled_from = turns.cooled;
    assert_eq!(cooled_from, hot + 25, "the hot phase's 25 seconds");
    let back = turns.back.expect("the key goes back");
    assert!(back >= cooled_from, "unsalted at {back} s while still hot");
    // Five cool periods of two seconds, then a decision and a read.
    assert!(
        back - cooled_from <= 16,
        "unsalted {} s after cooling",
        back - cooled_from
    );

    let unsalted: Vec<_> = outcome.seconds[hot..salted].iter().collect();
    let salted_seconds: Vec<_> = outcome.seconds[salted..cooled_from].iter().collect();
    let before = mean_max_over_mean(&unsalted);
    let after = mean_max_over_mean(&salted_seconds);
    println!(
        "salted {} s after turning hot, back {} s after cooling; busiest shard over the mean {before:.2} before, {after:.2} salted",
        salted - hot,
        back - cooled_from
    );
    assert!(before > 2.5, "one shard takes the hot key: {before:.2}");
    assert!(after < 1.3, "the buckets spread it: {after:.2}");
}
