//! Keyed aggregation under chaos: decimal values of 300 keys (the first ones far busier), one key
//! turning hot halfway and salted over eight buckets from then on, every thousandth record cut
//! off mid-JSON, through the stack's KeyedAggregateFunction and AggregateMergeFunction (count,
//! exact sum, min, max, mean). The oracle adds each key's values up one by one: each key's last
//! result must equal it, as it does without faults (a count short is lost, past it applied twice).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use keyed_aggregate::aggregate::{Aggregate, Partial};
use keyed_aggregate::exact::Exact;
use keyed_aggregate::merge::result_line;
use keyway::domain::salt::{Partitioner, Salting};
use keyway_local::{FaultPlan, LocalError, Usage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use super::{
    against_fault_free, against_oracle, deploy, side_by_side, Ending, Report, Sent, Settings,
};

/// The key that turns hot halfway through.
const SURGE: &str = "surge";

struct Workload {
    /// (partition key, data), in order.
    records: Vec<(String, Vec<u8>)>,
    /// Each key's values added up one by one.
    oracle: BTreeMap<String, Partial>,
    bad: u64,
}

fn workload(settings: &Settings) -> Workload {
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut partitioner = Partitioner::new(Salting::None);
    let mut oracle: BTreeMap<String, Partial> = BTreeMap::new();
    let mut records = Vec::with_capacity(settings.events);
    let mut bad = 0;
    for i in 0..settings.events {
        if i == settings.events / 2 {
            let hot = BTreeSet::from([SURGE.to_owned()]);
            partitioner.set_salting(Salting::Listed { hot, buckets: 8 });
        }
        if i % 1000 == 999 {
            bad += 1;
            records.push((format!("k{i}"), b"{\"key\": \"cut".to_vec()));
            continue;
        }
        let key = if i >= settings.events / 2 && rng.random_bool(0.5) {
            SURGE.to_owned()
        } else {
            // The square of a uniform draw favours the first keys.
            let x: f64 = rng.random();
            format!("k{}", (x * x * 300.0) as u32)
        };
        let cents: i64 = rng.random_range(-5_000..100_000);
        let sign = if cents < 0 { "-" } else { "" };
        let value = format!("{sign}{}.{:02}", (cents / 100).abs(), (cents % 100).abs());
        if let Ok(exact) = Exact::parse(&value) {
            oracle
                .entry(key.clone())
                .or_default()
                .merge(&Partial::of(Some(exact)))
                .expect("sums of cents stay far within 74 digits");
        }
        let data = format!(r#"{{"key":"{key}","value":{value},"seq":{i}}}"#);
        records.push((partitioner.partition_key(&key), data.into_bytes()));
    }
    Workload {
        records,
        oracle,
        bad,
    }
}

/// One run: each key's last result (the one of the highest count: running totals only grow),
/// and what else it left.
async fn run_once(
    settings: &Settings,
    records: &[(String, Vec<u8>)],
    faults: FaultPlan,
) -> Result<(BTreeMap<String, String>, Ending), LocalError> {
    let parameters = BTreeMap::from([
        ("AggregateValuePointer".to_owned(), "/value".to_owned()),
        ("Aggregates".to_owned(), "count,sum,min,max,mean".to_owned()),
        ("AggregateFlushSeconds".to_owned(), "30".to_owned()),
    ]);
    let mut runtime = deploy(
        &[("AggregateEventsStream", settings.shards)],
        &[
            ("KeyedAggregateFunction", settings.lanes),
            ("AggregateMergeFunction", settings.lanes),
        ],
        &parameters,
        faults,
        settings,
    )?;
    let stream = runtime
        .resource("AggregateEventsStream")
        .expect("the stream");
    runtime
        .services
        .kinesis
        .put_in_order(&stream, records)
        .await
        .map_err(crate::failed("the aggregation stream"))?;
    let day = Duration::from_secs(24 * 3600);
    runtime.run_until_idle(day).await?;
    // The last running totals flush half a minute on, at the next sweep; then the merge runs.
    runtime.run_for(Duration::from_secs(150)).await;
    runtime.run_until_idle(day).await?;
    let results = runtime
        .resource("AggregateResultsStream")
        .expect("the stream");
    let mut last: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for record in runtime.services.kinesis.records(&results) {
        let body: Value = serde_json::from_slice(&record.data).unwrap_or_default();
        let key = body["key"].as_str().unwrap_or_default().to_owned();
        let count = body["count"].as_u64().unwrap_or(0);
        let entry = last.entry(key).or_insert((0, String::new()));
        if count >= entry.0 {
            *entry = (count, String::from_utf8_lossy(&record.data).into_owned());
        }
    }
    let last = last.into_iter().map(|(k, (_, line))| (k, line)).collect();
    Ok((last, Ending::of(&runtime)))
}

/// What the functions of the fault-free run were billed for.
pub(super) async fn usage(settings: &Settings) -> Result<Usage, LocalError> {
    let workload = workload(settings);
    let (_, ending) = run_once(settings, &workload.records, FaultPlan::default()).await?;
    Ok(ending.usage)
}

pub(super) fn run(settings: &Settings) -> Result<Report, LocalError> {
    let workload = workload(settings);
    let ((clean, _), (faulty, ending)) = side_by_side(
        || run_once(settings, &workload.records, FaultPlan::default()),
        || run_once(settings, &workload.records, settings.faults()),
    )?;
    let expected: BTreeMap<String, String> = workload
        .oracle
        .iter()
        .map(|(key, total)| (key.clone(), result_line(key, None, total, &Aggregate::ALL)))
        .collect();
    let mut report = Report {
        unit: "keys' results",
        bad_records: workload.bad,
        ..Report::default()
    };
    let count = |line: &String| {
        serde_json::from_str::<Value>(line).map_or(0, |v| v["count"].as_u64().unwrap_or(0))
    };
    against_oracle(&mut report, &faulty, &expected, |got, want| {
        count(got) > count(want)
    });
    // Results go to a stream, whose records carry no id: each key's last result stands for its
    // outputs.
    let by_key = |results: &BTreeMap<String, String>| -> Sent {
        results
            .iter()
            .map(|(key, line)| (key.clone(), vec![line.clone()]))
            .collect()
    };
    against_fault_free(&mut report, &by_key(&faulty), &by_key(&clean));
    report.take_ending(&ending);
    Ok(report)
}
