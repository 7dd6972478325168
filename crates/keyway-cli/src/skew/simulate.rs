//! What the shards and the DynamoDB partitions are offered, and the report that sums it up.
//!
//! Shards. A shard is throttled on the records above 1,000 in a second or, when its bytes pass
//! 1 MiB, on the share of its records that carries the excess, whichever is more; the loads are
//! the ones the workload offers, before throttling.
//!
//! DynamoDB. The function reading a shard writes each key's state (each salted key's, when
//! salted) to the partition a stable hash of that key names (XXH3 over even ranges of the hash
//! space, `--partitions`, by default as many as shards). A shard is read in batches of
//! `--batch-size` records or once a second, whichever comes first. Without pre-aggregation
//! (`none`) each record is one write; `pre-aggregate`, and `salt`, `sidetrack` and `adaptive`
//! too (their first phase aggregates each bucket's records of a batch), write each key once a
//! batch. A state item is taken to be at most 1 KB: a write is 1 WCU; a partition takes 1,000
//! WCU a second.
//!
//! Report. Both strategies' shard and partition loads, CoV and max/mean of the shards' records,
//! and the heaviest keys of the workload (a Space-Saving sketch of the keys as produced, before
//! salting; `hot` when a key surely carries the heat share).

use std::collections::{HashMap, HashSet};

use keyway::domain::hash::{shard_for_hash, xxh3_128_hex};
use keyway::domain::skew::{coefficient_of_variation, max_over_mean, Hysteresis, SpaceSaving};
use serde::Serialize;

use super::adaptive::Episode;
use super::route::{route, seconds_of, Routed};
use super::source::{BadInput, Event, Workload};
use super::{
    Placement, Settings, Strategy, StrategyName, PARTITION_WCU_PER_SECOND, SHARD_BYTES_PER_SECOND,
    SHARD_RECORDS_PER_SECOND,
};
use crate::error::CliError;

/// Keys the report's sketch of the whole workload watches.
pub(super) const SKETCH_CAPACITY: usize = 64;
/// Keys the report lists.
const TOP_KEYS: usize = 5;

/// The DynamoDB partition `state_key` lives in: a stable hash, never std's `DefaultHasher`,
/// over even ranges of the hash space as DynamoDB splits a table's key space.
pub(crate) fn partition_of(state_key: &str, partitions: u32) -> u32 {
    let hex = xxh3_128_hex(&[state_key.as_bytes()]);
    let hash = u128::from_str_radix(&hex, 16).expect("32 hexadecimal digits");
    shard_for_hash(hash, partitions)
}

/// The records a shard loses in a second it is offered `records` of `bytes` in: those above the
/// record limit or the share of them that carries the bytes above the byte limit, whichever is
/// more.
pub(crate) fn throttled(records: u64, bytes: u64) -> u64 {
    let over_records = records.saturating_sub(SHARD_RECORDS_PER_SECOND);
    let over_bytes = bytes.saturating_sub(SHARD_BYTES_PER_SECOND);
    let by_bytes = if bytes == 0 {
        0
    } else {
        (u128::from(records) * u128::from(over_bytes)).div_ceil(u128::from(bytes)) as u64
    };
    over_records.max(by_bytes)
}

/// One shard's load over the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct ShardLoad {
    pub shard: u32,
    pub records: u64,
    pub records_per_second: f64,
    pub peak_records_per_second: u64,
    pub bytes_per_second: f64,
    pub peak_bytes_per_second: u64,
    pub throttled_records: u64,
    pub throttled_seconds: u64,
}

/// Each shard's load, from per-second counts.
pub(crate) fn shard_loads(routed: &[Routed], shards: u32, seconds: usize) -> Vec<ShardLoad> {
    let mut records = vec![vec![0u64; seconds]; shards as usize];
    let mut bytes = vec![vec![0u64; seconds]; shards as usize];
    for r in routed {
        records[r.shard as usize][r.second] += 1;
        bytes[r.shard as usize][r.second] += r.bytes;
    }
    (0..shards as usize)
        .map(|shard| {
            let per_second: Vec<u64> = records[shard]
                .iter()
                .zip(&bytes[shard])
                .map(|(&n, &b)| throttled(n, b))
                .collect();
            ShardLoad {
                shard: shard as u32,
                records: records[shard].iter().sum(),
                records_per_second: records[shard].iter().sum::<u64>() as f64 / seconds as f64,
                peak_records_per_second: records[shard].iter().copied().max().unwrap_or(0),
                bytes_per_second: bytes[shard].iter().sum::<u64>() as f64 / seconds as f64,
                peak_bytes_per_second: bytes[shard].iter().copied().max().unwrap_or(0),
                throttled_records: per_second.iter().sum(),
                throttled_seconds: per_second.iter().filter(|&&t| t > 0).count() as u64,
            }
        })
        .collect()
}

/// One DynamoDB partition's writes over the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct PartitionLoad {
    pub partition: u32,
    pub writes: u64,
    pub wcu_per_second: f64,
    pub peak_wcu_per_second: u64,
    /// Writes above 1,000 WCU in a second, summed over the seconds.
    pub over_limit_writes: u64,
    pub over_limit_seconds: u64,
}

/// The batch a shard's function is reading: its second, records, and the keys it writes.
struct Batch<'a> {
    second: usize,
    records: usize,
    keys: HashSet<&'a str>,
}

/// State writes per partition per second, with each key's partition worked out once.
struct Writes<'a> {
    partitions: u32,
    partition: HashMap<&'a str, u32>,
    per_second: Vec<Vec<u64>>,
}

impl<'a> Writes<'a> {
    fn add(&mut self, key: &'a str, second: usize) {
        let partitions = self.partitions;
        let p = *self
            .partition
            .entry(key)
            .or_insert_with(|| partition_of(key, partitions));
        self.per_second[p as usize][second] += 1;
    }

    fn add_batch(&mut self, batch: Batch<'a>) {
        for key in batch.keys {
            self.add(key, batch.second);
        }
    }
}

/// Each partition's state writes: one a record, or with `pre_aggregate` one a key a batch, where
/// a batch closes at `batch_size` records or at the end of its second.
pub(crate) fn partition_loads(
    routed: &[Routed],
    settings: &Settings,
    pre_aggregate: bool,
    seconds: usize,
) -> Vec<PartitionLoad> {
    let mut writes = Writes {
        partitions: settings.partitions,
        partition: HashMap::new(),
        per_second: vec![vec![0u64; seconds]; settings.partitions as usize],
    };
    let mut open: Vec<Option<Batch>> = (0..settings.shards).map(|_| None).collect();
    for r in routed {
        if !pre_aggregate {
            writes.add(&r.partition_key, r.second);
            continue;
        }
        let slot = &mut open[r.shard as usize];
        if slot
            .as_ref()
            .is_some_and(|b| b.second != r.second || b.records == settings.batch_size)
        {
            writes.add_batch(slot.take().expect("checked"));
        }
        let batch = slot.get_or_insert_with(|| Batch {
            second: r.second,
            records: 0,
            keys: HashSet::new(),
        });
        batch.records += 1;
        batch.keys.insert(&r.partition_key);
    }
    for batch in open.into_iter().flatten() {
        writes.add_batch(batch);
    }
    writes
        .per_second
        .iter()
        .enumerate()
        .map(|(p, per_second)| PartitionLoad {
            partition: p as u32,
            writes: per_second.iter().sum(),
            wcu_per_second: per_second.iter().sum::<u64>() as f64 / seconds as f64,
            peak_wcu_per_second: per_second.iter().copied().max().unwrap_or(0),
            over_limit_writes: per_second
                .iter()
                .map(|w| w.saturating_sub(PARTITION_WCU_PER_SECOND))
                .sum(),
            over_limit_seconds: per_second
                .iter()
                .filter(|&&w| w > PARTITION_WCU_PER_SECOND)
                .count() as u64,
        })
        .collect()
}

/// What one strategy does to the shards and the partitions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Outcome {
    pub strategy: StrategyName,
    pub label: String,
    pub pre_aggregates: bool,
    pub shards: Vec<ShardLoad>,
    pub cov: f64,
    pub max_over_mean: f64,
    pub throttled_records: u64,
    pub throttled_share: f64,
    pub throttled_shards: u64,
    pub partitions: Vec<PartitionLoad>,
    pub peak_wcu_per_second: u64,
    pub partitions_over_limit: u64,
    /// The keys the adaptive strategy salted, and when.
    pub salted: Vec<Episode>,
}

/// One strategy over the events.
pub(crate) fn outcome(events: &[Event], strategy: &Strategy, settings: &Settings) -> Outcome {
    let seconds = seconds_of(events.len(), settings.rate);
    let (routed, salted) = route(events, strategy, settings);
    let shards = shard_loads(&routed, settings.shards, seconds);
    let partitions = partition_loads(&routed, settings, strategy.pre_aggregates(), seconds);
    let loads: Vec<f64> = shards.iter().map(|s| s.records as f64).collect();
    let throttled_records: u64 = shards.iter().map(|s| s.throttled_records).sum();
    Outcome {
        strategy: strategy.name(),
        label: strategy.label(settings.buckets),
        pre_aggregates: strategy.pre_aggregates(),
        cov: coefficient_of_variation(&loads),
        max_over_mean: max_over_mean(&loads),
        throttled_records,
        throttled_share: throttled_records as f64 / events.len().max(1) as f64,
        throttled_shards: shards.iter().filter(|s| s.throttled_records > 0).count() as u64,
        peak_wcu_per_second: partitions
            .iter()
            .map(|p| p.peak_wcu_per_second)
            .max()
            .unwrap_or(0),
        partitions_over_limit: partitions
            .iter()
            .filter(|p| p.over_limit_writes > 0)
            .count() as u64,
        shards,
        partitions,
        salted,
    }
}

/// A heavy key of the workload as the sketch found it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct HotKey {
    pub key: String,
    pub records: u64,
    /// By how much at most `records` overcounts.
    pub error: u64,
    pub share: f64,
    /// Whether it surely carries at least the heat share.
    pub hot: bool,
}

/// The heaviest keys of the workload, from a Space-Saving sketch of the keys as produced.
pub(crate) fn hot_keys(events: &[Event], heat_share: f64) -> Vec<HotKey> {
    let mut sketch = SpaceSaving::new(SKETCH_CAPACITY);
    for event in events {
        sketch.offer(&event.key, 1);
    }
    let total = sketch.total().max(1) as f64;
    sketch
        .top(TOP_KEYS)
        .into_iter()
        .map(|h| HotKey {
            share: h.count as f64 / total,
            hot: h.guaranteed() as f64 >= heat_share * total,
            records: h.count,
            error: h.error,
            key: h.key,
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct WorkloadSummary {
    pub source: String,
    pub events: usize,
    pub distinct_keys: usize,
    pub rate: u64,
    pub seconds: usize,
    pub mean_record_bytes: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Limits {
    pub shard_records_per_second: u64,
    pub shard_bytes_per_second: u64,
    pub partition_wcu_per_second: u64,
}

/// Everything `keyway skew` prints.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Report {
    pub workload: WorkloadSummary,
    pub bad_input: BadInput,
    pub shards: u32,
    pub partitions: u32,
    pub buckets: u32,
    pub placement: Placement,
    pub batch_size: usize,
    pub limits: Limits,
    pub hot_keys: Vec<HotKey>,
    pub before: Outcome,
    pub after: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plot: Option<String>,
}

/// Sizes past which the per-second tables would not fit in memory.
const MAX_CELLS: usize = 10_000_000;

/// The workload without mitigation and with `strategy`.
pub(crate) fn simulate(
    workload: &Workload,
    strategy: &Strategy,
    settings: &Settings,
) -> Result<Report, CliError> {
    let events = &workload.events;
    let seconds = seconds_of(events.len(), settings.rate);
    if seconds.saturating_mul(settings.shards.max(settings.partitions) as usize) > MAX_CELLS {
        return Err(format!(
            "{seconds} simulated seconds over {} shards or partitions is too much: raise --rate",
            settings.shards.max(settings.partitions)
        )
        .into());
    }
    let heat_share = match strategy {
        Strategy::Adaptive(thresholds) => thresholds.heat_share,
        _ => Hysteresis::default().heat_share,
    };
    let distinct: HashSet<&str> = events.iter().map(|e| e.key.as_str()).collect();
    Ok(Report {
        workload: WorkloadSummary {
            source: workload.source.clone(),
            events: events.len(),
            distinct_keys: distinct.len(),
            rate: settings.rate,
            seconds,
            mean_record_bytes: events.iter().map(|e| e.bytes).sum::<u64>() as f64
                / events.len().max(1) as f64,
        },
        bad_input: workload.bad.clone(),
        shards: settings.shards,
        partitions: settings.partitions,
        buckets: settings.buckets,
        placement: settings.placement,
        batch_size: settings.batch_size,
        limits: Limits {
            shard_records_per_second: SHARD_RECORDS_PER_SECOND,
            shard_bytes_per_second: SHARD_BYTES_PER_SECOND,
            partition_wcu_per_second: PARTITION_WCU_PER_SECOND,
        },
        hot_keys: hot_keys(events, heat_share),
        before: outcome(events, &Strategy::None, settings),
        after: outcome(events, strategy, settings),
        plot: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skew::testing::{events, settings};

    #[test]
    fn a_shard_is_throttled_on_records_over_a_thousand_or_bytes_over_a_mebibyte() {
        assert_eq!(throttled(1_000, 1_000_000), 0);
        assert_eq!(throttled(1_500, 1_000), 500);
        // 1,000 records of 2 KiB: half of them carry the bytes over 1 MiB.
        assert_eq!(throttled(1_000, 2 * SHARD_BYTES_PER_SECOND), 500);
        assert_eq!(throttled(0, 0), 0);
    }

    #[test]
    fn without_pre_aggregation_each_record_is_a_write_and_with_it_each_key_once_a_batch() {
        // One key, 1,200 records in one second on one shard: batches of 500, 500 and 200.
        let s = Settings {
            partitions: 1,
            ..settings(1)
        };
        let (routed, _) = route(&events(&["k"], 1_200), &Strategy::None, &s);
        let per_record = partition_loads(&routed, &s, false, 1);
        assert_eq!(per_record[0].writes, 1_200);
        assert_eq!(per_record[0].over_limit_writes, 200);
        let batched = partition_loads(&routed, &s, true, 1);
        assert_eq!(batched[0].writes, 3);
        // A batch also closes at the end of its second: 600 records over two seconds of 300.
        let slow = Settings { rate: 300, ..s };
        let (routed, _) = route(&events(&["k", "j"], 600), &Strategy::None, &slow);
        assert_eq!(partition_loads(&routed, &slow, true, 2)[0].writes, 4);
    }

    #[test]
    fn salting_spreads_a_hot_key_over_every_shard_and_its_partitions() {
        // 8,000 records of one key in one second.
        let s = Settings {
            rate: 8_000,
            ..settings(8)
        };
        let hot = outcome(&events(&["hot"], 8_000), &Strategy::None, &s);
        assert!(
            (hot.max_over_mean - 8.0).abs() < 1e-9,
            "{}",
            hot.max_over_mean
        );
        assert_eq!((hot.throttled_shards, hot.throttled_records), (1, 7_000));
        let salted = outcome(&events(&["hot"], 8_000), &Strategy::Salt, &s);
        assert!(salted.cov < 1e-9, "{}", salted.cov);
        assert_eq!(
            salted.throttled_records, 0,
            "1,000 records/s a shard is within the limit"
        );
        // 1,000 records a shard: 2 batches a shard, 4 buckets a batch.
        let writes: u64 = salted.partitions.iter().map(|p| p.writes).sum();
        assert_eq!(writes, 8 * 2 * 4);
    }

    #[test]
    fn a_state_key_always_lives_in_the_same_partition() {
        assert_eq!(partition_of("hot#3", 8), partition_of("hot#3", 8));
        let mut counts = [0u32; 4];
        for i in 0..4_000 {
            counts[partition_of(&format!("key-{i}"), 4) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (850..1_150).contains(&c)),
            "{counts:?}"
        );
    }
}
