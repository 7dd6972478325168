//! `keyway demo`, identity section: generated CloudTrail traffic of many customers through the
//! identity enricher of template.yaml, role chains arriving out of order (shuffled as records of
//! many partitions interleave), some chains missing their first AssumeRole. Prints the coverage,
//! the resolution latency and the load per shard, and checks that every record came out once,
//! resolved unless its chain was cut.

use std::time::Duration;

use identity_enricher::enricher::reason;
use identity_enricher::traffic::{Traffic, TrafficConfig};

use crate::enrich::{Run, Settings, Summary};
use crate::error::CliError;
use identity_enricher::log_files::{Entry, Shuffled};

pub(super) async fn run(records: usize, seed: u64) -> Result<(), CliError> {
    let config = TrafficConfig {
        customers: 10,
        orphan_share: 0.01,
        seed,
        ..TrafficConfig::default()
    };
    let settings = Settings {
        shards: 4,
        customer_map: Traffic::customer_map_json(&config),
        buffer_ttl: Duration::from_secs(900),
        max_chain_depth: 10,
        lateness: crate::enrich::LATENESS,
        start_millis: config.start_millis,
    };
    println!("\nidentity enrichment: the IdentityEnricherFunction of template.yaml");
    println!(
        "  {records} CloudTrail records of 10 customers (Zipf 1.2), role chains 1 to 6 deep across each customer's accounts,"
    );
    println!(
        "  shuffled within windows of 2,000 records; 1% of the chains miss their first AssumeRole; {} shards, buffer TTL {} s",
        settings.shards,
        settings.buffer_ttl.as_secs()
    );
    let mut traffic =
        Traffic::new(config, records).map_err(|e| format!("generated traffic: {e}"))?;
    let entries = traffic.by_ref().enumerate().map(|(i, value)| {
        Ok(Entry::Record {
            place: format!("generated#{i}"),
            value,
        })
    });
    let shuffled: Vec<Result<Entry, CliError>> = Shuffled::new(entries, seed, 2_000).collect();
    let orphaned = traffic.orphaned() as u64;
    let summary = Run::deploy(&settings)?
        .enrich(shuffled.into_iter(), &mut std::io::sink(), &|_| {})
        .await?;

    let cut = print(&summary);
    let unresolved: u64 = summary.unresolved.values().sum();
    if summary.records == records as u64
        && summary.resolved + unresolved == summary.records
        && cut == orphaned
        && unresolved == orphaned
        && summary.repeats == 0
    {
        println!("\n  every record came out once, traced to its original actor unless its chain was cut ({orphaned} records)");
        Ok(())
    } else {
        Err(format!(
            "identity: {} records in, {} resolved, {unresolved} unresolved ({cut} for the TTL), {orphaned} in cut chains, {} repeats",
            summary.records, summary.resolved, summary.repeats
        )
        .into())
    }
}

/// Prints what the run did; returns how many records went out unresolved for the buffer TTL.
fn print(summary: &Summary) -> u64 {
    let percent = |n: u64| 100.0 * n as f64 / summary.records.max(1) as f64;
    let cut = summary
        .unresolved
        .get(reason::BUFFER_TTL)
        .copied()
        .unwrap_or(0);
    println!(
        "  resolved            {:>8}  {:.2}% coverage",
        summary.resolved,
        percent(summary.resolved)
    );
    println!(
        "  unresolved          {:>8}  {:.2}% (their chain's first AssumeRole is not in the trail)",
        cut,
        percent(cut)
    );
    for (what, latency) in [
        ("resolved", &summary.resolved_latency),
        ("unresolved", &summary.unresolved_latency),
    ] {
        if let (Some(p50), Some(p99)) = (latency.percentile(50.0), latency.percentile(99.0)) {
            println!("  latency, {what:<10} p50 {p50:.1} s, p99 {p99:.1} s, arrival to output");
        }
    }
    println!(
        "  resolutions published {:>6}; largest buffer {} records; per-shard load max/mean {:.2}",
        summary.resolutions,
        summary.largest_buffer,
        summary.skew()
    );
    cut
}
