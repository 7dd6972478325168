//! `keyway bench runtime`: the batch executor against a naive design (GetItem + PutItem per
//! event) on the same generated batches, in one run.
//!
//! DynamoDB cost is metered by the in-memory table as AWS bills it (read request units per 4 KB of
//! each item read strongly consistently, write request units per 1 KB of the larger of the old and
//! new item). Waves are sequential rounds of DynamoDB requests, measured with a simulated latency
//! on a paused clock. CPU time is the thread's CPU time, compared with decoding the same payloads
//! only: ratios, because the machine is shared and absolute figures are noisy. The executor's CPU
//! time is reported without the in-memory services' own work (on AWS that runs on AWS's servers)
//! and, separately, with it.

use crate::error::CliError;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use keyed_counter::{KeyedCounter, COUNTS};
use keyway::adapters::dynamodb::{DynamoStateStore, Expect, ItemKey, Table};
use keyway::adapters::sqs::SqsSink;
use keyway::domain::{AttrValue, Payload};
use keyway::ports::ManualClock;
use keyway::sources::kinesis::decode_event;
use keyway::{Executor, KeyedOperator, Sinks};
use keyway_local::{thread_cpu_time, LocalSqs, LocalTable, MeterSnapshot};

use crate::job::{report, runtime_builder};
use crate::workload::{zipf_batches, BATCH_SIZE, EXPONENT, KEYS};
/// Simulated DynamoDB latency per request while counting waves.
const LATENCY: Duration = Duration::from_millis(5);

#[derive(Serialize)]
struct DesignFigures {
    read_units_per_1000_events: f64,
    write_units_per_1000_events: f64,
    capacity_units_per_1000_events: f64,
    api_calls_per_1000_events: f64,
    waves_per_batch_mean: f64,
    waves_per_batch_max: u64,
}

#[derive(Serialize)]
struct Ratios {
    capacity_units_vs_naive: f64,
    api_calls_vs_naive: f64,
    /// The executor's own CPU time (adapters, operator and runtime) against decoding only.
    cpu_vs_decode_only: f64,
    /// The same, counting the in-memory services' work too.
    cpu_with_services_vs_decode_only: f64,
}

#[derive(Serialize)]
struct Targets {
    capacity_units_vs_naive_at_most: f64,
    waves_per_batch_at_most: u64,
    cpu_vs_decode_only_at_most: f64,
}

#[derive(Serialize)]
struct RuntimeBench {
    events: usize,
    batches: usize,
    batch_size: usize,
    distinct_keys: u64,
    zipf_exponent: f64,
    seed: u64,
    executor: DesignFigures,
    naive: DesignFigures,
    executor_cpu_us_per_event: f64,
    in_memory_services_cpu_us_per_event: f64,
    decode_only_cpu_us_per_event: f64,
    ratios: Ratios,
    targets: Targets,
    targets_met: bool,
}

fn executor_on(
    table: Arc<LocalTable>,
    sqs: Arc<LocalSqs>,
) -> Result<Executor<KeyedCounter>, CliError> {
    let clock = ManualClock::at(1_767_225_600_000);
    let counts = sqs.create_queue("counts");
    let dead = sqs.create_queue("dead-letter");
    let sinks = Sinks::new(Arc::new(SqsSink::new(sqs.clone(), dead)))
        .with(&COUNTS, Arc::new(SqsSink::new(sqs, counts)));
    Executor::new(
        KeyedCounter,
        Arc::new(DynamoStateStore::new(table, clock.clone())),
        sinks,
        clock,
    )
    .map_err(CliError::from)
}

fn figures(meter: &MeterSnapshot, waves: &[u64], events: usize) -> DesignFigures {
    let per_1000 = |x: f64| x * 1000.0 / events as f64;
    DesignFigures {
        read_units_per_1000_events: per_1000(meter.read_units),
        write_units_per_1000_events: per_1000(meter.write_units),
        capacity_units_per_1000_events: per_1000(meter.capacity_units()),
        api_calls_per_1000_events: per_1000(meter.total_calls() as f64),
        waves_per_batch_mean: waves.iter().sum::<u64>() as f64 / waves.len().max(1) as f64,
        waves_per_batch_max: waves.iter().copied().max().unwrap_or(0),
    }
}

/// The executor over every batch, with metered DynamoDB latency: capacity, calls, waves.
fn meter_executor(payloads: &[String]) -> Result<DesignFigures, CliError> {
    let table = Arc::new(LocalTable::new());
    table.meter().set_latency(Some(LATENCY));
    let executor = executor_on(table.clone(), Arc::new(LocalSqs::default()))?;
    let mut waves = Vec::with_capacity(payloads.len());
    runtime_builder(true).block_on(async {
        for payload in payloads {
            let before = table.meter().snapshot().waves;
            let report = executor
                .run(decode_event(payload).expect("a Kinesis event"))
                .await;
            assert_eq!(report.failed_from, None, "the benchmark batches all apply");
            waves.push(table.meter().snapshot().waves - before);
        }
    });
    Ok(figures(
        &table.meter().snapshot(),
        &waves,
        payloads.len() * BATCH_SIZE,
    ))
}

/// The naive design: per event, GetItem the key's count and PutItem it back plus one.
async fn naive_batch(table: &LocalTable, payload: &str) {
    for record in decode_event(payload)
        .expect("a Kinesis event")
        .into_iter()
        .flatten()
    {
        let input = KeyedCounter
            .decode(&record)
            .expect("generated events decode");
        let key = ItemKey {
            pk: format!("keyed-counter#{}", input.key),
            sk: "count".into(),
        };
        let current = table
            .get(&key)
            .await
            .expect("get")
            .and_then(|item| {
                item.get("count")
                    .and_then(|v| v.as_n()?.parse::<u64>().ok())
            })
            .unwrap_or(0);
        let mut item = key.to_item();
        item.insert(
            "count".into(),
            AttrValue::N((current + input.amount).to_string()),
        );
        table.put(&item, &Expect::Anything).await.expect("put");
    }
}

fn meter_naive(payloads: &[String]) -> DesignFigures {
    let table = LocalTable::new();
    table.meter().set_latency(Some(LATENCY));
    let mut waves = Vec::with_capacity(payloads.len());
    runtime_builder(true).block_on(async {
        for payload in payloads {
            let before = table.meter().snapshot().waves;
            naive_batch(&table, payload).await;
            waves.push(table.meter().snapshot().waves - before);
        }
    });
    figures(
        &table.meter().snapshot(),
        &waves,
        payloads.len() * BATCH_SIZE,
    )
}

/// CPU time to only decode the payloads: JSON, base64, the operator's input.
fn decode_only(payloads: &[String]) -> Duration {
    let start = thread_cpu_time();
    let mut decoded = 0usize;
    for payload in payloads {
        for record in decode_event(payload)
            .expect("a Kinesis event")
            .into_iter()
            .flatten()
        {
            if let Payload::Bytes(_) = &record.payload {
                decoded += usize::from(KeyedCounter.decode(&record).is_ok());
            }
        }
    }
    assert_eq!(decoded, payloads.len() * BATCH_SIZE);
    thread_cpu_time() - start
}

/// CPU time of the executor on the same payloads (without simulated latency), and the part of it
/// spent inside the in-memory services.
fn executor_cpu(payloads: &[String]) -> Result<(Duration, Duration), CliError> {
    let (table, sqs) = (Arc::new(LocalTable::new()), Arc::new(LocalSqs::default()));
    table.meter().set_cpu_accounting(true);
    sqs.meter().set_cpu_accounting(true);
    let executor = executor_on(table.clone(), sqs.clone())?;
    let total = runtime_builder(false).block_on(async {
        let start = thread_cpu_time();
        for payload in payloads {
            executor
                .run(decode_event(payload).expect("a Kinesis event"))
                .await;
        }
        thread_cpu_time() - start
    });
    Ok((
        total,
        table.meter().snapshot().service_cpu + sqs.meter().snapshot().service_cpu,
    ))
}

/// `keyway bench runtime`'s arguments.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Batches of 500 events.
    #[arg(long, default_value_t = 40)]
    pub batches: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn run(args: Args) -> Result<(), CliError> {
    let Args {
        batches,
        seed,
        json,
    } = args;
    if batches == 0 {
        return Err(CliError::option("--batches", "must be at least 1"));
    }
    let payloads = zipf_batches(batches, KEYS, EXPONENT, seed);
    let events = batches * BATCH_SIZE;
    let executor = meter_executor(&payloads)?;
    let naive = meter_naive(&payloads);

    // Alternate the two CPU measurements and keep each one's best of five: noise from other
    // processes only ever adds time. The executor's best run is the one of least CPU time in
    // all, split into its own and the services': the least of its own alone would pick the run
    // whose split erred most toward the services.
    let (mut decode, mut best, mut services) = (Duration::MAX, Duration::MAX, Duration::ZERO);
    for _ in 0..5 {
        decode = decode.min(decode_only(&payloads));
        let (total, in_services) = executor_cpu(&payloads)?;
        if total < best {
            (best, services) = (total, in_services);
        }
    }
    let run = best.saturating_sub(services);
    let per_event_us = |d: Duration| d.as_secs_f64() * 1e6 / events as f64;

    let ratios = Ratios {
        capacity_units_vs_naive: executor.capacity_units_per_1000_events
            / naive.capacity_units_per_1000_events,
        api_calls_vs_naive: executor.api_calls_per_1000_events / naive.api_calls_per_1000_events,
        cpu_vs_decode_only: run.as_secs_f64() / decode.as_secs_f64(),
        cpu_with_services_vs_decode_only: (run + services).as_secs_f64() / decode.as_secs_f64(),
    };
    let targets = Targets {
        capacity_units_vs_naive_at_most: 0.5,
        waves_per_batch_at_most: 4,
        cpu_vs_decode_only_at_most: 1.5,
    };
    let targets_met = ratios.capacity_units_vs_naive <= targets.capacity_units_vs_naive_at_most
        && executor.waves_per_batch_max <= targets.waves_per_batch_at_most
        && ratios.cpu_vs_decode_only <= targets.cpu_vs_decode_only_at_most;
    let result = RuntimeBench {
        events,
        batches,
        batch_size: BATCH_SIZE,
        distinct_keys: KEYS,
        zipf_exponent: EXPONENT,
        seed,
        executor_cpu_us_per_event: per_event_us(run),
        in_memory_services_cpu_us_per_event: per_event_us(services),
        decode_only_cpu_us_per_event: per_event_us(decode),
        executor,
        naive,
        ratios,
        targets,
        targets_met,
    };
    report(&result, json, print_table);
    Ok(())
}

fn print_table(r: &RuntimeBench) {
    println!(
        "keyway bench runtime: {} events in {} batches of {}, Zipf({}) over {} keys, seed {}",
        r.events, r.batches, r.batch_size, r.zipf_exponent, r.distinct_keys, r.seed
    );
    println!();
    println!(
        "{:<34} {:>12} {:>12} {:>10}",
        "per 1,000 events", "executor", "naive", "ratio"
    );
    let row =
        |name: &str, e: f64, n: f64| println!("{name:<34} {e:>12.1} {n:>12.1} {:>10.3}", e / n);
    row(
        "read request units",
        r.executor.read_units_per_1000_events,
        r.naive.read_units_per_1000_events,
    );
    row(
        "write request units",
        r.executor.write_units_per_1000_events,
        r.naive.write_units_per_1000_events,
    );
    row(
        "capacity units (read + write)",
        r.executor.capacity_units_per_1000_events,
        r.naive.capacity_units_per_1000_events,
    );
    row(
        "DynamoDB API calls",
        r.executor.api_calls_per_1000_events,
        r.naive.api_calls_per_1000_events,
    );
    println!();
    println!(
        "{:<34} {:>12} {:>12}",
        "waves of DynamoDB requests", "executor", "naive"
    );
    println!(
        "{:<34} {:>12.2} {:>12.2}",
        "  per batch, mean", r.executor.waves_per_batch_mean, r.naive.waves_per_batch_mean
    );
    println!(
        "{:<34} {:>12} {:>12}",
        "  per batch, max", r.executor.waves_per_batch_max, r.naive.waves_per_batch_max
    );
    println!();
    println!(
        "CPU per event: executor {:.2} us (+ {:.2} us inside the in-memory services), decode only {:.2} us",
        r.executor_cpu_us_per_event, r.in_memory_services_cpu_us_per_event, r.decode_only_cpu_us_per_event
    );
    println!(
        "  ratio to decode only: {:.2} ({:.2} with the services' work)",
        r.ratios.cpu_vs_decode_only, r.ratios.cpu_with_services_vs_decode_only
    );
    println!();
    println!(
        "targets: capacity <= {}x naive ({:.3}), waves <= {} per batch ({}), CPU <= {}x decode ({:.2}): {}",
        r.targets.capacity_units_vs_naive_at_most,
        r.ratios.capacity_units_vs_naive,
        r.targets.waves_per_batch_at_most,
        r.executor.waves_per_batch_max,
        r.targets.cpu_vs_decode_only_at_most,
        r.ratios.cpu_vs_decode_only,
        if r.targets_met { "met" } else { "NOT met" }
    );
}
