//! The keyed counter under chaos: clicks of a thousand users (a few of them far busier than the
//! rest), amounts of 1 to 3, every thousandth record cut off mid-JSON, through the stack's
//! KeyedCounterFunction. The oracle adds each user's amounts up; each user's stored count must
//! equal it (less is lost, more is applied twice), and the counts queue must hold the same output
//! ids with the same bodies as without faults.
//!
//! With `COUNTS_EMIT=latest` (a variable of the settings) the counter sends each key's latest
//! count of an invocation, and which counts those are depends on how the runs cut their batches.
//! Then the latest count the queue holds for each user must equal the oracle's, as the stored
//! count must, and no output id may carry two counts.

use std::collections::BTreeMap;
use std::time::Duration;

use keyway::ports::Namespace;
use keyway_local::{Fault, FaultPlan, LocalError, LocalRuntime, Usage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{
    against_fault_free, against_oracle, deploy, sent, side_by_side, Ending, Report, Sent, Settings,
    Variable,
};

const USERS: u64 = 1_000;

struct Workload {
    records: Vec<(String, Vec<u8>)>,
    counts: BTreeMap<String, u64>,
    bad: u64,
}

fn workload(settings: &Settings) -> Workload {
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut counts = BTreeMap::new();
    let mut records = Vec::with_capacity(settings.events);
    let mut bad = 0;
    for i in 0..settings.events {
        // The square of a uniform draw: the first users are far busier than the last.
        let x: f64 = rng.random();
        let user = format!("user-{}", (x * x * USERS as f64) as u64);
        if i % 1000 == 999 {
            bad += 1;
            records.push((user, br#"{"key": "cut"#.to_vec()));
            continue;
        }
        let amount: u64 = rng.random_range(1..=3);
        *counts.entry(user.clone()).or_default() += amount;
        let data = format!(r#"{{"key":"{user}","amount":{amount}}}"#).into_bytes();
        records.push((user, data));
    }
    Workload {
        records,
        counts,
        bad,
    }
}

/// What one run left: the counts queue by output id, the stored counts, the runtime.
struct Run {
    sent: Sent,
    counts: BTreeMap<String, u64>,
    ending: Ending,
}

async fn run_once(
    settings: &Settings,
    workload: &Workload,
    faults: FaultPlan,
) -> Result<Run, LocalError> {
    let mut runtime = deploy(
        &[("ClicksStream", settings.shards)],
        &[("KeyedCounterFunction", settings.lanes)],
        &BTreeMap::new(),
        faults,
        settings,
    )?;
    let stream = runtime.resource("ClicksStream").expect("the clicks stream");
    runtime
        .services
        .kinesis
        .put_in_order(&stream, &workload.records)
        .await
        .map_err(crate::failed("the clicks stream"))?;
    runtime
        .run_until_idle(Duration::from_secs(24 * 3600))
        .await?;
    let queue = runtime.resource("CountsQueue").expect("the counts queue");
    let messages = runtime.services.sqs.messages(&queue);
    let sent = sent(
        messages
            .into_iter()
            .map(|m| (m.output_id.unwrap_or_default(), m.body)),
    );
    let counts = stored_counts(&runtime).await?;
    Ok(Run {
        sent,
        counts,
        ending: Ending::of(&runtime),
    })
}

/// The count of every key the state table holds for the counter, whichever keys they are.
async fn stored_counts(runtime: &LocalRuntime) -> Result<BTreeMap<String, u64>, LocalError> {
    let table = runtime.resource("StateTable").expect("the state table");
    let store = keyway::lambda::Platform::state_store(runtime.services.as_ref(), &table)
        .map_err(crate::failed("the state table"))?;
    let namespace = Namespace::new(
        "keyed-counter",
        keyway::operator::state_signature(&keyway::KeyedOperator::states(
            &keyed_counter::KeyedCounter,
        )),
    );
    let mut keys = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list_keys(&namespace, "", cursor.as_deref())
            .await
            .map_err(crate::failed("the state table"))?;
        keys.extend(page.keys);
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let loaded = store
        .load(&namespace, &keys)
        .await
        .map_err(crate::failed("the state table"))?;
    Ok(keys
        .iter()
        .filter_map(|k| {
            let count = loaded.get(k)?.slots.get("count")?.entries.first()?;
            Some((k.clone(), count.get().parse().ok()?))
        })
        .collect())
}

/// What the functions of the fault-free run were billed for.
pub(super) async fn usage(settings: &Settings) -> Result<Usage, LocalError> {
    let run = run_once(settings, &workload(settings), FaultPlan::default()).await?;
    Ok(run.ending.usage)
}

/// Whether the settings have the counter send each key's latest count only.
fn latest_only(settings: &Settings) -> bool {
    settings.variables.contains(&Variable::new(
        "KeyedCounterFunction",
        "COUNTS_EMIT",
        "latest",
    ))
}

/// Each user's highest count the queue holds: counts only grow, so it is the latest.
fn latest_sent(sent: &Sent) -> BTreeMap<String, u64> {
    let mut latest = BTreeMap::new();
    for body in sent.values().flatten() {
        if let Ok(update) = serde_json::from_str::<keyed_counter::CountUpdate>(body) {
            let count = latest.entry(update.key).or_insert(0);
            *count = update.count.max(*count);
        }
    }
    latest
}

/// An output id sent with two counts is a count applied twice.
fn one_body_an_id(report: &mut Report, sent: &Sent) {
    for (id, bodies) in sent {
        report.repeats += bodies.len() as u64 - 1;
        if bodies.iter().any(|b| b != &bodies[0]) {
            report.fault_free.applied_twice += 1;
            report.example(format!("output {id}: {bodies:?}"));
        }
    }
}

pub(super) fn run(settings: &Settings) -> Result<Report, LocalError> {
    let workload = workload(settings);
    let (clean, faulty) = side_by_side(
        || run_once(settings, &workload, FaultPlan::default()),
        || run_once(settings, &workload, settings.faults()),
    )?;
    let mut report = Report {
        unit: "users' counts",
        bad_records: workload.bad,
        ..Report::default()
    };
    let more = |got: &u64, want: &u64| got > want;
    against_oracle(&mut report, &faulty.counts, &workload.counts, more);
    if latest_only(settings) {
        // Sent and stored, each user's count must be the oracle's.
        against_oracle(
            &mut report,
            &latest_sent(&faulty.sent),
            &workload.counts,
            more,
        );
        one_body_an_id(&mut report, &faulty.sent);
        report.fault_free.expected = clean.sent.len() as u64;
        report.notes.push(format!(
            "latest counts only: {} messages without faults, {} with, for {} events",
            clean.sent.len(),
            faulty.sent.len(),
            settings.events
        ));
    } else {
        against_fault_free(&mut report, &faulty.sent, &clean.sent);
    }
    report.take_ending(&faulty.ending);
    report.not_applicable(
        Fault::CrashInCommit,
        "a key's state is one item: no commit writes several",
    );
    Ok(report)
}
