//! `keyway demo`: the keyed counter over the embedded runtime. It runs generated batches through
//! the executor, with malformed records mixed in and one batch delivered twice, then checks every
//! stored count against the counts computed from the input and prints what happened.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use keyed_counter::{KeyedCounter, COUNTS};
use keyway::adapters::dynamodb::DynamoStateStore;
use keyway::adapters::sqs::SqsSink;
use keyway::local::{LocalSqs, LocalTable};
use keyway::ports::{ManualClock, StateStore};
use keyway::sources::kinesis::decode_event;
use keyway::{BatchReport, Executor, Sinks};

use crate::workload::{zipf_batches, BATCH_SIZE};

/// Replaces one record's data with text that is not JSON, as a misbehaving producer would.
fn spoil_one_record(payload: &str, index: usize) -> String {
    use base64::Engine as _;
    let mut event: Value = serde_json::from_str(payload).expect("generated JSON");
    event["Records"][index]["kinesis"]["data"] =
        Value::String(base64::engine::general_purpose::STANDARD.encode("{not json"));
    event.to_string()
}

fn expected_counts(payloads: &[String]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for payload in payloads {
        let event: Value = serde_json::from_str(payload).expect("generated JSON");
        for record in decode_event(event)
            .expect("a Kinesis event")
            .into_iter()
            .flatten()
        {
            if let keyway::domain::Payload::Bytes(data) = &record.payload {
                if let Ok(input) = serde_json::from_slice::<keyed_counter::CountEvent>(data) {
                    *counts.entry(input.key).or_insert(0) += input.amount;
                }
            }
        }
    }
    counts
}

pub fn run(batches: usize, seed: u64) -> Result<(), String> {
    if batches == 0 {
        return Err("--batches must be at least 1".into());
    }
    let payloads: Vec<String> = zipf_batches(batches, 1_000, 1.1, seed)
        .iter()
        .enumerate()
        .map(|(i, p)| spoil_one_record(p, (i * 37) % BATCH_SIZE))
        .collect();

    let clock = ManualClock::at(1_767_225_600_000);
    let table = Arc::new(LocalTable::new());
    let store = Arc::new(DynamoStateStore::new(table.clone(), clock.clone()));
    let sqs = Arc::new(LocalSqs::default());
    let counts_queue = sqs.create_queue("counts");
    let dead_queue = sqs.create_queue("dead-letter");
    let sinks = Sinks::new(Arc::new(SqsSink::new(sqs.clone(), &dead_queue)))
        .with(COUNTS, Arc::new(SqsSink::new(sqs.clone(), &counts_queue)));
    let executor = Executor::new(KeyedCounter, store.clone(), sinks, clock);

    println!("keyway demo: the keyed counter on the embedded runtime");
    println!("  {batches} batches of {BATCH_SIZE} events from one Kinesis shard, keys Zipf(1.1) over 1,000 users, seed {seed}");
    println!("  one record per batch is not JSON; batch 1 is delivered twice\n");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| e.to_string())?;
    let mut total = BatchReport::default();
    runtime.block_on(async {
        let mut order: Vec<usize> = (0..payloads.len()).collect();
        order.insert(2.min(order.len()), 0);
        for (step, &i) in order.iter().enumerate() {
            let event: Value = serde_json::from_str(&payloads[i]).expect("generated JSON");
            let report = executor.run(decode_event(event).expect("a Kinesis event")).await;
            if step < 4 || step + 1 == order.len() {
                println!(
                    "  batch {:>3}{}: applied {:>3}, replayed {:>3}, dead-lettered {}, keys {:>3}, commits {:>3}{}",
                    i + 1,
                    if step == 2 { " (again)" } else { "        " },
                    report.applied,
                    report.replayed,
                    report.dead_lettered,
                    report.keys,
                    report.commits,
                    report.failed_from.as_ref().map(|s| format!(", retry from {s}")).unwrap_or_default()
                );
            } else if step == 4 {
                println!("  ...");
            }
            total.records += report.records;
            total.applied += report.applied;
            total.replayed += report.replayed;
            total.dead_lettered += report.dead_lettered;
            total.outputs_sent += report.outputs_sent;
            total.commits += report.commits;
        }
    });

    let expected = expected_counts(&payloads);
    let keys: Vec<String> = expected.keys().cloned().collect();
    let stored = runtime
        .block_on(store.load(executor.namespace(), &keys))
        .map_err(|e| e.to_string())?;
    let mut mismatches = 0;
    for (key, want) in &expected {
        let got = stored[key]
            .slots
            .get("count")
            .and_then(|s| s.entries.first())
            .and_then(|e| e.get().parse::<u64>().ok());
        if got != Some(*want) {
            mismatches += 1;
        }
    }
    let meter = table.meter().snapshot();
    let dead = sqs.messages(&dead_queue);
    let mut top: Vec<(&String, &u64)> = expected.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));

    println!("\nwhat it did");
    println!(
        "  records delivered   {:>7}  (including the duplicate batch)",
        total.records
    );
    println!("  applied             {:>7}", total.applied);
    println!(
        "  replayed, skipped   {:>7}  (the duplicate batch: nothing applied twice)",
        total.replayed
    );
    println!(
        "  dead-lettered       {:>7}  (first reason: {})",
        total.dead_lettered,
        dead.first().map(|m| reason(&m.body)).unwrap_or_default()
    );
    println!("  outputs sent        {:>7}  (one running count per applied event, with a deterministic id)", total.outputs_sent);
    println!("  keys                {:>7}", expected.len());
    println!(
        "  hottest keys        {}",
        top.iter()
            .take(5)
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("\nDynamoDB, as AWS would bill it");
    println!(
        "  API calls           {:>7}  ({})",
        meter.total_calls(),
        meter
            .calls
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("  read request units  {:>7.0}", meter.read_units);
    println!("  write request units {:>7.0}", meter.write_units);
    println!(
        "  per 1,000 events    {:>7.1} capacity units",
        meter.capacity_units() * 1000.0 / total.applied.max(1) as f64
    );
    if mismatches == 0 {
        println!("\nverified: every one of the {} stored counts equals the count computed from the input", expected.len());
        Ok(())
    } else {
        Err(format!("{mismatches} stored counts differ from the input"))
    }
}

fn reason(body: &str) -> String {
    serde_json::from_str::<keyway::domain::DeadLetter>(body)
        .map(|l| {
            format!(
                "{}: {}",
                l.field,
                l.problem.chars().take(60).collect::<String>()
            )
        })
        .unwrap_or_default()
}
