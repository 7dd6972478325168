//! Adaptive salting on the stack of template.yaml. A producer salts the keys that the keyed
//! aggregation's hot-key registry lists (`AdaptivePartitioner`). It puts a timed workload on the
//! aggregation's stream, one second of virtual time after another, while the functions run. A
//! key that turns hot gets listed, is salted from the producer's next read of the list, and goes
//! back to its own partition key once it cools. No deploy happens in between.
//!
//! What a run gives: each second's records per shard; when the key turned hot, went salted and
//! went back; whether each key's count equals the oracle's. `keyway demo` prints it, and a test
//! checks it under faults.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keyway::adapters::dynamodb::{AdaptivePartitioner, HotKeyRegistry};
use keyway::domain::skew::Hysteresis;
use keyway::ports::Clock;
use keyway_local::{Data, FaultPlan, LocalError, LocalRuntime, LocalServices};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::failed;

/// The key that turns hot.
pub const HOT_KEY: &str = "surge";
/// The keyed aggregation's operator: the scope of its registry.
const SCOPE: &str = "keyed-aggregate";
/// Long enough for any batch to run out, in virtual time: retries back off for minutes at most.
const SETTLE_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// A stretch of the workload: how long, and what share of its events carry the hot key.
#[derive(Clone, Copy, Debug)]
pub struct Phase {
    /// How long the phase lasts, in seconds of virtual time.
    pub seconds: u32,
    /// The share of events that carry the hot key, from 0 to 1.
    pub hot_share: f64,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The workload's stretches, run one after another.
    pub phases: Vec<Phase>,
    /// Events a second.
    pub rate: u32,
    /// Keys besides the hot one, evenly loaded.
    pub keys: u32,
    /// Buckets the producer spreads a hot key over.
    pub buckets: u32,
    /// The registry's period (the template's HotKeyPeriodSeconds).
    pub period_seconds: u32,
    /// How often the producer reads the registry's list.
    pub refresh: Duration,
    /// The faults the embedded services inject.
    pub faults: FaultPlan,
    /// Seeds the draw of each event's key, so that a run can be repeated.
    pub seed: u64,
}

/// One second of the run.
#[derive(Clone, Debug)]
pub struct Second {
    /// The share of this second's events that carried the hot key.
    pub hot_share: f64,
    /// Whether the producer salted the hot key in this second.
    pub salted: bool,
    /// Records put on each shard of the stream.
    pub shard_records: Vec<u64>,
}

/// What a run gave.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Every second of the run, in order.
    pub seconds: Vec<Second>,
    /// Each key's count as the results stream last gave it.
    pub counts: BTreeMap<String, u64>,
    /// Each key's count in the input.
    pub oracle: BTreeMap<String, u64>,
}

/// The seconds at which the hot key's run turned: it turned hot, the producer salted it, it
/// cooled, the producer sent it under its own key again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Turns {
    /// The first second it carried at least the share taken as hot.
    pub hot: usize,
    /// The first second the producer salted it; none when it never did.
    pub salted: Option<usize>,
    /// The first second after `hot` it carried less than the share it turned hot at; the run's
    /// length when it never did.
    pub cooled: usize,
    /// The first second after `salted` the producer no longer salted it.
    pub back: Option<usize>,
}

impl Outcome {
    /// When the hot key turned, taking it as hot in the seconds it carried at least `share`;
    /// none when it never did.
    pub fn turns(&self, share: f64) -> Option<Turns> {
        let hot = self.seconds.iter().position(|s| s.hot_share >= share)?;
        let after = |from: usize, wanted: &dyn Fn(&Second) -> bool| {
            (from..self.seconds.len()).find(|&s| wanted(&self.seconds[s]))
        };
        let salted = after(0, &|s| s.salted);
        let cooled = after(hot, &|s| s.hot_share < share).unwrap_or(self.seconds.len());
        let back = salted.and_then(|from| after(from, &|s| !s.salted));
        Some(Turns {
            hot,
            salted,
            cooled,
            back,
        })
    }
}

/// Runs the workload through the stack's keyed aggregation with an adaptive producer.
pub async fn run(settings: &Settings) -> Result<Outcome, LocalError> {
    let (services, mut runtime) = deploy(settings)?;
    let resource = |name: &str| {
        runtime.resource(name).ok_or_else(|| LocalError::Function {
            path: format!("Resources/{name}"),
            problem: "the keyed aggregation needs this resource".into(),
        })
    };
    let stream = resource("AggregateEventsStream")?;
    let results = resource("AggregateResultsStream")?;
    let table = services
        .dynamodb
        .table(&resource("HotKeysTable")?)
        .ok_or_else(|| failed("HotKeysTable")("the table was not created"))?;
    let registry = HotKeyRegistry::new(
        table,
        SCOPE,
        Duration::from_secs(u64::from(settings.period_seconds)),
        Hysteresis::default(),
    );
    let mut producer = AdaptivePartitioner::new(registry, settings.buckets, settings.refresh);
    let shards = services.kinesis.shard_ids(&stream);
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut oracle: BTreeMap<String, u64> = BTreeMap::new();
    let mut seconds = Vec::new();
    for phase in &settings.phases {
        for _ in 0..phase.seconds {
            let now = services.clock.now_millis();
            let mut routed = Vec::with_capacity(settings.rate as usize);
            for key in draw_keys(&mut rng, phase.hot_share, settings) {
                *oracle.entry(key.clone()).or_default() += 1;
                let (partition_key, hash) = producer.route(&key, now).await;
                routed.push((partition_key, hash, format!(r#"{{"key":"{key}"}}"#)));
            }
            let records: Vec<(&str, Option<u128>, Data)> = routed
                .iter()
                .map(|(k, h, d)| (k.as_str(), *h, Data::Borrowed(d.as_bytes())))
                .collect();
            let positions = services
                .kinesis
                .put_routed_in_order(&stream, &records)
                .await
                .map_err(failed("AggregateEventsStream"))?;
            seconds.push(Second {
                hot_share: phase.hot_share,
                salted: producer.salted().contains(HOT_KEY),
                shard_records: per_shard(&shards, positions.into_iter().map(|(shard, _)| shard)),
            });
            runtime.run_for(Duration::from_secs(1)).await;
        }
    }
    // The last running totals flush half a minute on, at the next sweep; then the merge runs.
    runtime.run_until_idle(SETTLE_LIMIT).await?;
    runtime.run_for(Duration::from_secs(150)).await;
    runtime.run_until_idle(SETTLE_LIMIT).await?;
    Ok(Outcome {
        seconds,
        counts: last_counts(&services, &results)?,
        oracle,
    })
}

/// A second's keys: the hot key with the phase's share, the others uniform over the rest.
fn draw_keys(rng: &mut StdRng, hot_share: f64, settings: &Settings) -> Vec<String> {
    (0..settings.rate)
        .map(|_| {
            if rng.random_bool(hot_share) {
                HOT_KEY.to_owned()
            } else {
                format!("k{}", rng.random_range(0..settings.keys.max(1)))
            }
        })
        .collect()
}

/// How many of the records put went to each of `shards`.
fn per_shard(shards: &[String], put_to: impl Iterator<Item = String>) -> Vec<u64> {
    let mut counts = vec![0u64; shards.len()];
    for shard in put_to {
        if let Some(i) = shards.iter().position(|s| *s == shard) {
            counts[i] += 1;
        }
    }
    counts
}

/// The stack, with the keyed aggregation counting and the hot-key period of `settings`.
fn deploy(settings: &Settings) -> Result<(Arc<LocalServices>, LocalRuntime), LocalError> {
    let services = LocalServices::new(1_767_225_600_000, settings.faults.clone());
    let parameters = BTreeMap::from([
        ("Aggregates".to_owned(), "count".to_owned()),
        ("AggregateFlushSeconds".to_owned(), "30".to_owned()),
        (
            "HotKeyPeriodSeconds".to_owned(),
            settings.period_seconds.to_string(),
        ),
    ]);
    let runtime = LocalRuntime::from_template_with(
        crate::TEMPLATE,
        &parameters,
        services.clone(),
        &crate::functions(),
    )?;
    Ok((services, runtime))
}

/// Each key's count as the results stream last gave it: the highest, as counts only grow.
fn last_counts(
    services: &Arc<LocalServices>,
    results: &str,
) -> Result<BTreeMap<String, u64>, LocalError> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for record in services.kinesis.records(results) {
        let body: Value =
            serde_json::from_slice(&record.data).map_err(failed("AggregateResultsStream"))?;
        let key = body["key"].as_str().unwrap_or_default().to_owned();
        let count = body["count"].as_u64().unwrap_or(0);
        let entry = counts.entry(key).or_default();
        *entry = (*entry).max(count);
    }
    Ok(counts)
}
