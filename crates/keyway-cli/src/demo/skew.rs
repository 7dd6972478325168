//! `keyway demo`, skew section: a key turns hot in the keyed aggregation's stream, wired as
//! template.yaml wires KeyedAggregateFunction, under the demo's faults. The function's hot-key
//! registry lists the key and a producer that reads the registry salts it, all without a deploy.
//! When the key cools, the registry drops it and the producer sends it under its own key again.
//! Prints when each of those happened and the shard loads of each stretch, and checks each key's
//! count against the input (`keyway_stack::adaptive`).

use std::time::Duration;

use keyway::domain::skew::{coefficient_of_variation, max_over_mean};
use keyway_local::FaultPlan;
use keyway_stack::adaptive::{
    run as run_adaptive, Outcome, Phase, Second, Settings, Turns, HOT_KEY,
};

use crate::error::CliError;
use crate::skew::render::bar;

const BUCKETS: u32 = 8;
const PERIOD_SECONDS: u32 = 2;
const HOT_SHARE: f64 = 0.8;

pub(super) async fn run(rate: u32, faults: f64, seed: u64) -> Result<(), CliError> {
    let phases = vec![
        Phase {
            seconds: 10,
            hot_share: 0.0,
        },
        Phase {
            seconds: 30,
            hot_share: HOT_SHARE,
        },
        Phase {
            seconds: 30,
            hot_share: 0.0,
        },
    ];
    let settings = Settings {
        phases,
        rate,
        keys: 100,
        buckets: BUCKETS,
        period_seconds: PERIOD_SECONDS,
        refresh: Duration::from_secs(1),
        faults: FaultPlan::all(faults, seed),
        seed,
    };
    println!("\nSkew: the KeyedAggregateFunction of template.yaml, its hot-key registry (HotKeysTable) and a producer that salts the keys it lists");
    println!(
        "  {rate} events a second over 100 keys on 4 shards; from 10 s to 40 s, {:.0}% of them on one key, {HOT_KEY:?};",
        HOT_SHARE * 100.0
    );
    println!("  the registry decides every {PERIOD_SECONDS} s, the producer reads it every second and salts a listed key over {BUCKETS} buckets; same faults");
    let outcome = run_adaptive(&settings).await?;
    let Turns {
        hot,
        salted,
        cooled,
        back,
    } = outcome.turns(HOT_SHARE).ok_or("the key never turned hot")?;
    println!("  timeline");
    println!(
        "    {hot:>3} s  {HOT_KEY} turns hot: {:.0}% of the events",
        HOT_SHARE * 100.0
    );
    if let Some(s) = salted {
        println!("    {s:>3} s  the registry lists it; the producer salts it over {BUCKETS} buckets ({} s after it turned hot)", s - hot);
    }
    println!("    {cooled:>3} s  {HOT_KEY} cools");
    if let Some(b) = back {
        println!("    {b:>3} s  the registry drops it; the producer sends it under its own key again ({} s after it cooled)", b - cooled);
    }
    print_loads(&outcome, hot, salted, cooled);
    check(&outcome, salted, back)
}

/// Each stretch's mean records a second per shard, with a bar each.
fn print_loads(outcome: &Outcome, hot: usize, salted: Option<usize>, cooled: usize) {
    let salted_at = salted.unwrap_or(cooled);
    let stretches = [
        ("cool", 0, hot),
        ("hot, not yet salted", hot, salted_at),
        ("hot, salted", salted_at, cooled),
    ];
    println!("  records a second per shard, mean of each stretch");
    for (name, from, to) in stretches {
        let seconds = &outcome.seconds[from.min(to)..to];
        if seconds.is_empty() {
            continue;
        }
        let loads = mean_loads(seconds);
        let peak = loads.iter().copied().fold(0.0, f64::max);
        println!(
            "    {name:<20} ({from:>2}-{to:>2} s)  max/mean {:.2}  CoV {:.2}",
            max_over_mean(&loads),
            coefficient_of_variation(&loads)
        );
        for (shard, load) in loads.iter().enumerate() {
            println!(
                "      shard {shard}  {load:>6.0}  {}",
                bar(*load, peak.max(1.0), 40)
            );
        }
    }
}

fn mean_loads(seconds: &[Second]) -> Vec<f64> {
    let shards = seconds.first().map_or(0, |s| s.shard_records.len());
    (0..shards)
        .map(|i| {
            let total: u64 = seconds.iter().map(|s| s.shard_records[i]).sum();
            total as f64 / seconds.len() as f64
        })
        .collect()
}

fn check(outcome: &Outcome, salted: Option<usize>, back: Option<usize>) -> Result<(), CliError> {
    if salted.is_none() || back.is_none() {
        return Err(format!("skew: the hot key was not salted and unsalted in turn (salted at {salted:?}, back at {back:?})").into());
    }
    if outcome.counts != outcome.oracle {
        let differing = outcome
            .oracle
            .iter()
            .filter(|(k, n)| outcome.counts.get(*k) != Some(n))
            .count();
        return Err(format!(
            "skew: {differing} of {} keys' counts differ from the input",
            outcome.oracle.len()
        )
        .into());
    }
    println!(
        "  each of the {} keys' counts equals its events in the input, salted or not",
        outcome.oracle.len()
    );
    Ok(())
}
