//! `keyway bench identity`: the identity enricher's design against the two it replaces, in one
//! run, on the same generated CloudTrail traffic (customers drawn from Zipf(1.2); the largest
//! makes about 40% of the records).
//!
//! Records arrive as many partitions deliver them: shuffled within a sliding window of 2,000.
//!
//! - Skew: the records' load on 8 shards when partitioned by customer (the design the article
//!   left) and by customer#accessKeyId (this one), as Kinesis hashes partition keys.
//! - Cost: the enricher on the embedded runtime, feedback loop included, against a naive design
//!   that looks up the caller's identity and writes it back for every record (and writes the
//!   identity of every key a call issues): DynamoDB capacity units per 1,000 records, as the
//!   in-memory table bills them, and records per second per core of CPU time. The embedded
//!   runtime runs one instance of the function for every lane, so the identities it remembers
//!   serve each lane as a warm Lambda instance serving that lane again would.
//! - Throughput: `keyway enrich` over a million records on one core.
//!
//! Ratios compare figures of the same run: the machine is shared and absolute times are noisy.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use identity_enricher::cloudtrail::{Caller, CloudTrailRecord};
use identity_enricher::identity::CustomerMap;
use identity_enricher::traffic::{Traffic, TrafficConfig};
use keyway::adapters::dynamodb::{Expect, ItemKey, Table};
use keyway::domain::hash::{kinesis_hash_key, shard_for_hash};
use keyway::domain::AttrValue;
use keyway_local::{thread_cpu_time, LocalTable};

use crate::enrich::{Run, Settings};
use crate::error::CliError;
use identity_enricher::log_files::Entry;

const SHARDS: u32 = 8;

#[derive(Serialize)]
pub(super) struct Skew {
    pub shards: u32,
    pub largest_customer_share: f64,
    pub by_customer: Vec<u64>,
    pub by_customer_max_over_mean: f64,
    pub by_customer_and_key: Vec<u64>,
    pub by_customer_and_key_max_over_mean: f64,
}

#[derive(Serialize)]
pub(super) struct Design {
    pub capacity_units_per_1000_records: f64,
    pub read_units_per_1000_records: f64,
    pub write_units_per_1000_records: f64,
    pub records_per_second_per_core: f64,
    /// Records that went out with their original actor.
    pub resolved_share: f64,
}

#[derive(Serialize)]
pub(super) struct IdentityBench {
    pub records: usize,
    pub seed: u64,
    pub skew: Skew,
    pub enricher: Design,
    pub naive: Design,
    pub capacity_units_vs_naive: f64,
    pub enrich_records: usize,
    pub enrich_records_per_second_one_core: f64,
    /// The process's peak memory after `keyway enrich` ran alone.
    pub enrich_peak_memory_mib: f64,
    pub targets: Targets,
    pub targets_met: bool,
}

#[derive(Serialize)]
pub(super) struct Targets {
    pub by_customer_and_key_max_over_mean_at_most: f64,
    pub capacity_units_vs_naive_at_most: f64,
}

/// Generated records, in the order many partitions deliver them (see `entries`), kept for both
/// designs to run.
fn traffic(records: usize, seed: u64) -> Result<(TrafficConfig, Vec<Value>), CliError> {
    let config = TrafficConfig {
        seed,
        ..TrafficConfig::default()
    };
    let values = entries(config.clone(), records)?
        .map(|entry| match entry? {
            Entry::Record { value, .. } => Ok(value),
            Entry::Unreadable { place, .. } => Err(format!("{place}: not generated JSON").into()),
        })
        .collect::<Result<_, CliError>>()?;
    Ok((config, values))
}

/// Load per shard of `keys`, as Kinesis hashes partition keys.
fn load(keys: impl Iterator<Item = String>) -> Vec<u64> {
    let mut load = vec![0; SHARDS as usize];
    for key in keys {
        load[shard_for_hash(kinesis_hash_key(&key), SHARDS) as usize] += 1;
    }
    load
}

fn max_over_mean(load: &[u64]) -> f64 {
    let total: u64 = load.iter().sum();
    let max = load.iter().copied().max().unwrap_or(0);
    max as f64 * load.len() as f64 / total.max(1) as f64
}

fn skew(records: &[CloudTrailRecord], customers: &CustomerMap) -> Skew {
    let by_customer = load(
        records
            .iter()
            .map(|r| customers.customer_of(&r.account).to_owned()),
    );
    let by_customer_and_key = load(records.iter().map(|r| r.partition_key(customers)));
    let mut per_customer: BTreeMap<&str, u64> = BTreeMap::new();
    for r in records {
        *per_customer
            .entry(customers.customer_of(&r.account))
            .or_default() += 1;
    }
    let largest = per_customer.values().copied().max().unwrap_or(0);
    Skew {
        shards: SHARDS,
        largest_customer_share: largest as f64 / records.len().max(1) as f64,
        by_customer_max_over_mean: max_over_mean(&by_customer),
        by_customer,
        by_customer_and_key_max_over_mean: max_over_mean(&by_customer_and_key),
        by_customer_and_key,
    }
}

/// The naive design: for every record, GetItem the caller's identity (strongly consistent) and
/// PutItem it back with the record's time; for a call that issues a key, PutItem the issued key's
/// identity too. A caller whose identity was not written yet (its chain arrived out of order)
/// stays unresolved: the naive design has no buffer, and no feedback loop.
async fn naive(values: &[Value], customers: &CustomerMap) -> Result<(LocalTable, u64), CliError> {
    let table = LocalTable::new();
    let mut resolved = 0;
    for value in values {
        // Decoded here, as the enricher decodes each record: both designs' CPU includes it.
        let record = &CloudTrailRecord::parse(value.clone()).map_err(|e| e.to_string())?;
        let key = |access_key: &str| ItemKey {
            pk: format!("identity#{}", access_key),
            sk: customers.customer_of(&record.account).to_owned(),
        };
        let caller = key(record.caller_key());
        let stored = table.get(&caller).await.map_err(|e| e.to_string())?;
        let known = stored.and_then(|item| {
            item.get("identity")
                .and_then(|v| v.as_s().map(str::to_owned))
        });
        let identity = match (&record.caller, known) {
            (Caller::Identified(actor), _) => Some(serde_json::to_string(actor).expect("json")),
            (_, known) => known,
        };
        // The caller's item is written back whether its identity is known or not: when it was
        // last seen, and the identity once known.
        let mut item = caller.to_item();
        if let Some(identity) = &identity {
            item.insert("identity".into(), AttrValue::S(identity.clone()));
        }
        let seen = record.record["eventTime"].to_string();
        item.insert("seen".into(), AttrValue::S(seen));
        let written = table.put(&item, &Expect::Anything).await;
        written.map_err(|e| e.to_string())?;
        let Some(identity) = identity else {
            continue;
        };
        resolved += 1;
        if let Some(issued) = &record.issued {
            let mut item = key(&issued.access_key_id).to_item();
            item.insert("identity".into(), AttrValue::S(identity));
            let written = table.put(&item, &Expect::Anything).await;
            written.map_err(|e| e.to_string())?;
        }
    }
    Ok((table, resolved))
}

fn per_1000(x: f64, records: usize) -> f64 {
    x * 1000.0 / records.max(1) as f64
}

/// Generated records as `keyway enrich` reads entries, streamed and in the order many partitions
/// deliver them: shuffled within windows of 2,000, so a chain's calls can arrive before the call
/// that issued their key; none kept beyond the window.
fn entries(
    config: TrafficConfig,
    records: usize,
) -> Result<impl Iterator<Item = Result<Entry, CliError>>, CliError> {
    let seed = config.seed;
    let generated = Traffic::new(config, records)
        .map_err(|e| format!("generated traffic: {e}"))?
        .enumerate()
        .map(|(i, value)| {
            Ok(Entry::Record {
                place: format!("generated#{i}"),
                value,
            })
        });
    Ok(identity_enricher::log_files::Shuffled::new(
        generated, seed, 2_000,
    ))
}

/// The enricher over `entries` on the embedded runtime: its summary and the CPU time it took.
async fn run_enricher(
    entries: impl Iterator<Item = Result<Entry, CliError>>,
    customer_map: String,
) -> Result<(crate::enrich::Summary, Duration), CliError> {
    let settings = Settings {
        shards: SHARDS as usize,
        customer_map,
        buffer_ttl: Duration::from_secs(900),
        max_chain_depth: 10,
        lateness: crate::enrich::LATENESS,
        start_millis: TrafficConfig::default().start_millis,
    };
    let start = thread_cpu_time();
    let summary = Run::deploy(&settings)?
        .enrich(entries, &mut std::io::sink(), &|_| {})
        .await?;
    Ok((summary, thread_cpu_time() - start))
}

/// `keyway enrich` over `records` generated records on this one-threaded runtime: records per
/// second of wall time, and the process's peak memory in MiB (measured first, so nothing else
/// this run keeps counts in it).
fn throughput(
    runtime: &tokio::runtime::Runtime,
    records: usize,
    seed: u64,
) -> Result<(f64, f64), CliError> {
    let config = TrafficConfig {
        seed,
        ..TrafficConfig::default()
    };
    let map = Traffic::customer_map_json(&config);
    let started = Instant::now();
    let (summary, _) = runtime.block_on(run_enricher(entries(config, records)?, map))?;
    let wall = started.elapsed();
    if summary.records != records as u64 {
        return Err(format!("{} of {records} records went through", summary.records).into());
    }
    Ok((records as f64 / wall.as_secs_f64(), peak_memory_mib()))
}

/// The process's peak resident memory, in MiB.
fn peak_memory_mib() -> f64 {
    // SAFETY: getrusage writes into the struct it is given and reads nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    // Linux reports kilobytes.
    usage.ru_maxrss as f64 / 1024.0
}

/// The enricher and the naive design over the same `values`.
fn designs(
    runtime: &tokio::runtime::Runtime,
    values: Vec<Value>,
    config: &TrafficConfig,
) -> Result<(Design, Design), CliError> {
    let records = values.len();
    let customers = Traffic::customer_map(config);
    let naive_start = thread_cpu_time();
    let (table, naive_resolved) = runtime.block_on(naive(&values, &customers))?;
    let naive_cpu = thread_cpu_time() - naive_start;
    let entries = values.into_iter().enumerate().map(|(i, value)| {
        Ok(Entry::Record {
            place: format!("generated#{i}"),
            value,
        })
    });
    let map = Traffic::customer_map_json(config);
    let (summary, enricher_cpu) = runtime.block_on(run_enricher(entries, map))?;
    let rate = |cpu: Duration| records as f64 / cpu.as_secs_f64().max(1e-9);
    let design = |meter: &keyway_local::MeterSnapshot, cpu, resolved: u64| Design {
        capacity_units_per_1000_records: per_1000(meter.capacity_units(), records),
        read_units_per_1000_records: per_1000(meter.read_units, records),
        write_units_per_1000_records: per_1000(meter.write_units, records),
        records_per_second_per_core: rate(cpu),
        resolved_share: resolved as f64 / records as f64,
    };
    Ok((
        design(&summary.state_table, enricher_cpu, summary.resolved),
        design(&table.meter().snapshot(), naive_cpu, naive_resolved),
    ))
}

/// `keyway bench identity`'s arguments.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Generated CloudTrail records for the skew and cost comparisons.
    #[arg(long, default_value_t = 100_000)]
    pub records: usize,
    /// Generated records for the `keyway enrich` throughput.
    #[arg(long, default_value_t = 1_000_000)]
    pub enrich_records: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn run(args: Args) -> Result<(), CliError> {
    let Args {
        records,
        enrich_records,
        seed,
        json,
    } = args;
    if records == 0 || enrich_records == 0 {
        return Err(CliError::option(
            "--records, --enrich-records",
            "each must be at least 1",
        ));
    }
    let runtime = crate::job::runtime_builder(true);
    let (enrich_rate, enrich_peak) = throughput(&runtime, enrich_records, seed + 1)?;
    let (config, values) = traffic(records, seed)?;
    let customers = Traffic::customer_map(&config);
    let parsed: Vec<CloudTrailRecord> = values
        .iter()
        .map(|v| CloudTrailRecord::parse(v.clone()).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let skew = skew(&parsed, &customers);
    drop(parsed);
    let (enricher, naive) = designs(&runtime, values, &config)?;

    let targets = Targets {
        by_customer_and_key_max_over_mean_at_most: 1.3,
        capacity_units_vs_naive_at_most: 0.6,
    };
    let capacity_units_vs_naive =
        enricher.capacity_units_per_1000_records / naive.capacity_units_per_1000_records;
    let targets_met = skew.by_customer_and_key_max_over_mean
        <= targets.by_customer_and_key_max_over_mean_at_most
        && capacity_units_vs_naive <= targets.capacity_units_vs_naive_at_most;
    let bench = IdentityBench {
        records,
        seed,
        skew,
        enricher,
        naive,
        capacity_units_vs_naive,
        enrich_records,
        enrich_records_per_second_one_core: enrich_rate,
        enrich_peak_memory_mib: enrich_peak,
        targets,
        targets_met,
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&bench).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", report(&bench));
    }
    Ok(())
}

fn report(b: &IdentityBench) -> String {
    let loads = |l: &[u64]| l.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
    let design = |name: &str, d: &Design| {
        format!(
            "  {name:<28} {:>7.1} capacity units / 1,000 records ({:.1} read, {:.1} write), {:>8.0} records/s/core, {:.1}% resolved\n",
            d.capacity_units_per_1000_records,
            d.read_units_per_1000_records,
            d.write_units_per_1000_records,
            d.records_per_second_per_core,
            d.resolved_share * 100.0
        )
    };
    let mut text = format!(
        "keyway bench identity: {} generated CloudTrail records, customers from Zipf(1.2), the largest {:.0}% of them, seed {}\n\nskew on {} shards (max/mean; target <= {} by customer#accessKeyId)\n",
        b.records,
        b.skew.largest_customer_share * 100.0,
        b.seed,
        b.skew.shards,
        b.targets.by_customer_and_key_max_over_mean_at_most
    );
    text += &format!(
        "  by customer                  {:.2}   [{}]\n  by customer#accessKeyId      {:.2}   [{}]\n\n",
        b.skew.by_customer_max_over_mean,
        loads(&b.skew.by_customer),
        b.skew.by_customer_and_key_max_over_mean,
        loads(&b.skew.by_customer_and_key)
    );
    text += &format!(
        "cost, feedback loop included (target <= {}x the naive design's capacity units)\n",
        b.targets.capacity_units_vs_naive_at_most
    );
    text += &design("enricher", &b.enricher);
    text += &design("naive (lookup + write/record)", &b.naive);
    text += &format!(
        "  ratio                        {:.2}x\n\nkeyway enrich: {} records at {:.0} records/s on one core, peak memory {:.0} MiB\n\ntargets {}\n",
        b.capacity_units_vs_naive,
        b.enrich_records,
        b.enrich_records_per_second_one_core,
        b.enrich_peak_memory_mib,
        if b.targets_met { "met" } else { "missed" }
    );
    text
}
