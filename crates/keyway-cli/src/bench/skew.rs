//! `keyway bench skew`: the salting figures against their targets, in one run. Eight shards,
//! 99% of the events on one key, 32 buckets, 50,000 events a second. It gives the shard loads
//! without mitigation (a state write per record, then per key a batch) and salted (targets:
//! max/mean at most 1.15 and CoV below 0.1, the hot key's partition under 1,000 WCU a second). It
//! gives the adaptive strategy's time from a key turning hot to its being salted, simulated and
//! through the hot-key registry on the stack of template.yaml. And it runs the events through
//! keyed aggregation on the embedded runtime with the hot key salted: each key's count must
//! equal the oracle's.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use keyed_aggregate::aggregate::Aggregate;
use keyway::domain::salt::{Partitioner, Salting};
use keyway::domain::skew::Hysteresis;
use keyway_local::FaultPlan;
use keyway_stack::adaptive;
use keyway_stack::aggregation::{Aggregation, EventTimes, Settings as Run};
use serde::Serialize;

use crate::error::CliError;
use crate::skew::simulate::outcome;
use crate::skew::source::{Event, HOT_KEY};
use crate::skew::{Placement, Settings, Strategy};

const SHARDS: u32 = 8;
const BUCKETS: u32 = 32;
const RATE: u64 = 50_000;
const HOT_SHARE: f64 = 0.99;

#[derive(Serialize)]
struct Spread {
    cov: f64,
    max_over_mean: f64,
    peak_wcu_per_second: u64,
}

#[derive(Serialize)]
struct Registry {
    seconds_to_salt: Option<usize>,
    seconds_to_unsalt: Option<usize>,
    counts_equal_oracle: bool,
}

#[derive(Serialize)]
struct SkewBench {
    events: usize,
    shards: u32,
    buckets: u32,
    events_per_second: u64,
    hot_share: f64,
    /// Unsalted, a state write per record.
    per_record: Spread,
    /// Unsalted, a state write per key a batch.
    unsalted: Spread,
    salted: Spread,
    /// Simulated seconds from the second the key turned hot to the first it went salted.
    adaptive_seconds_to_salt: Option<usize>,
    /// On the stack of template.yaml (embedded runtime, virtual seconds): from the key turning
    /// hot to the producer salting it by the hot-key registry's list, and from its cooling to the
    /// producer sending it under its own key again.
    registry: Registry,
    results_equal_oracle: bool,
    target_max_over_mean: f64,
    target_cov: f64,
    target_partition_wcu_per_second: u64,
    target_met: bool,
}

/// `keyway bench skew`'s arguments.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[arg(long, default_value_t = 100_000)]
    pub events: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn run(args: Args) -> Result<(), CliError> {
    let Args { events, seed, json } = args;
    if events < 2 {
        return Err(CliError::option("--events", "must be at least 2"));
    }
    let workload = workload(events, seed);
    let settings = Settings {
        shards: SHARDS,
        partitions: SHARDS,
        buckets: BUCKETS,
        placement: Placement::Spread,
        rate: RATE,
        batch_size: 500,
    };
    let per_record = outcome(&workload, &Strategy::None, &settings);
    let unsalted = outcome(&workload, &Strategy::PreAggregate, &settings);
    let salted = outcome(&workload, &Strategy::Salt, &settings);
    // The key turns hot a second in: the adaptive strategy must find and salt it.
    let mut turning: Vec<Event> = (0..RATE as usize)
        .map(|i| event(format!("k{}", i % 1000)))
        .collect();
    turning.extend(workload.iter().cloned());
    let adaptive = outcome(
        &turning,
        &Strategy::Adaptive(Hysteresis {
            heat_share: 0.05,
            cool_share: 0.01,
            cool_periods: 5,
        }),
        &settings,
    );
    let to_salt = adaptive
        .salted
        .iter()
        .find(|e| e.key == HOT_KEY)
        .map(|e| e.salted_from_second - e.hot_in_second);
    let equal = aggregated_exactly(&workload)?;
    let registry = through_registry(seed)?;
    let spread = |o: &crate::skew::simulate::Outcome| Spread {
        cov: o.cov,
        max_over_mean: o.max_over_mean,
        peak_wcu_per_second: o.peak_wcu_per_second,
    };
    let result = SkewBench {
        events,
        shards: SHARDS,
        buckets: BUCKETS,
        events_per_second: RATE,
        hot_share: HOT_SHARE,
        target_met: salted.max_over_mean <= 1.15
            && salted.cov < 0.1
            && salted.peak_wcu_per_second < 1_000
            && equal
            && to_salt.is_some()
            && registry.seconds_to_salt.is_some()
            && registry.counts_equal_oracle,
        per_record: spread(&per_record),
        unsalted: spread(&unsalted),
        salted: spread(&salted),
        adaptive_seconds_to_salt: to_salt,
        registry,
        results_equal_oracle: equal,
        target_max_over_mean: 1.15,
        target_cov: 0.1,
        target_partition_wcu_per_second: 1_000,
    };
    crate::job::report(&result, json, print);
    Ok(())
}

fn print(r: &SkewBench) {
    println!(
        "keyway bench skew: {} events at {} a second on {} shards, {:.0}% on one key, {} buckets",
        r.events,
        r.events_per_second,
        r.shards,
        r.hot_share * 100.0,
        r.buckets
    );
    println!();
    println!(
        "{:<12} {:>8} {:>10} {:>22}",
        "", "CoV", "max/mean", "peak partition WCU/s"
    );
    let rows = [
        ("per record", &r.per_record),
        ("per batch", &r.unsalted),
        ("salted", &r.salted),
    ];
    for (name, s) in rows {
        println!(
            "{name:<12} {:>8.3} {:>10.3} {:>22}",
            s.cov, s.max_over_mean, s.peak_wcu_per_second
        );
    }
    println!();
    match r.adaptive_seconds_to_salt {
        Some(s) => println!("adaptive: the key turned hot and was salted {s} s later"),
        None => println!("adaptive: the key was never salted"),
    }
    let seconds = |s: Option<usize>| s.map_or("never".to_owned(), |s| format!("{s} s"));
    println!(
        "hot-key registry on the stack: salted {} after the key turned hot, unsalted {} after it cooled; counts {}",
        seconds(r.registry.seconds_to_salt),
        seconds(r.registry.seconds_to_unsalt),
        if r.registry.counts_equal_oracle { "equal to the oracle" } else { "DIFFER from the oracle" }
    );
    println!(
        "results through keyed aggregation, the hot key salted: {}",
        if r.results_equal_oracle {
            "equal to the oracle"
        } else {
            "DIFFER from the oracle"
        }
    );
    println!(
        "targets (salted max/mean <= {}, CoV < {}, partition < {} WCU/s): {}",
        r.target_max_over_mean,
        r.target_cov,
        r.target_partition_wcu_per_second,
        if r.target_met { "met" } else { "NOT met" }
    );
}

/// A key turning hot and cooling on the stack, its producer salting what the registry lists:
/// 1,000 events a second over 100 keys on 4 shards, 80% on one key from the 10th second to the
/// 40th, periods of 2 s, the producer reading every second.
fn through_registry(seed: u64) -> Result<Registry, CliError> {
    let phase = |seconds, hot_share| adaptive::Phase { seconds, hot_share };
    let settings = adaptive::Settings {
        phases: vec![phase(10, 0.0), phase(30, 0.8), phase(30, 0.0)],
        rate: 1_000,
        keys: 100,
        buckets: 8,
        period_seconds: 2,
        refresh: Duration::from_secs(1),
        faults: FaultPlan::default(),
        seed,
    };
    let runtime = crate::job::runtime_builder(true);
    let outcome = runtime.block_on(adaptive::run(&settings))?;
    let turns = outcome.turns(0.8).ok_or("the key never turned hot")?;
    Ok(Registry {
        seconds_to_salt: turns.salted.map(|s| s.saturating_sub(turns.hot)),
        seconds_to_unsalt: turns.back.map(|b| b.saturating_sub(turns.cooled)),
        counts_equal_oracle: outcome.counts == outcome.oracle,
    })
}

fn event(key: String) -> Event {
    Event { key, bytes: 100 }
}

/// `events` events, `HOT_SHARE` of them on the hot key at random, the rest over 1,000 keys.
fn workload(events: usize, seed: u64) -> Vec<Event> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..events)
        .map(|i| match rng.random_bool(HOT_SHARE) {
            true => event(HOT_KEY.to_owned()),
            false => event(format!("k{}", i % 1000)),
        })
        .collect()
}

/// Runs the events through keyed aggregation with the hot key salted over the buckets, and
/// compares each key's count with the events'.
fn aggregated_exactly(events: &[Event]) -> Result<bool, CliError> {
    let mut oracle: BTreeMap<String, u64> = BTreeMap::new();
    let hot = BTreeSet::from([HOT_KEY.to_owned()]);
    let mut partitioner = Partitioner::new(Salting::Listed {
        hot,
        buckets: BUCKETS,
    });
    let records: Vec<(String, bytes::Bytes)> = events
        .iter()
        .map(|e| {
            *oracle.entry(e.key.clone()).or_default() += 1;
            let data = format!(r#"{{"key":"{}"}}"#, e.key).into_bytes();
            (partitioner.partition_key(&e.key), data.into())
        })
        .collect();
    let settings = Run {
        key: "/key".into(),
        value: None,
        aggregates: vec![Aggregate::Count],
        windows: None,
        shards: SHARDS as usize,
        batch_size: 500,
        flush: Duration::from_secs(60),
        faults: FaultPlan::default(),
    };
    let runtime = crate::job::runtime_builder(true);
    let finished = runtime.block_on(async {
        let mut run = Aggregation::deploy(&settings, 1_767_225_600_000)?;
        run.put(&records, EventTimes::default()).await?;
        run.finish().await
    })?;
    let mut counted: BTreeMap<String, u64> = BTreeMap::new();
    for line in &finished.results {
        let body: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("a result: {e}"))?;
        let key = body["key"].as_str().unwrap_or_default().to_owned();
        counted.insert(key, body["count"].as_u64().unwrap_or(0));
    }
    Ok(counted == oracle && finished.dead_letters.is_empty())
}
