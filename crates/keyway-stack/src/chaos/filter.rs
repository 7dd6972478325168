//! Dynamic filtering under chaos: twelve consumers changing their subscriptions every five
//! seconds (to keys, to all events, patterns of three shapes, and now and then one naming another
//! consumer's queue or a malformed pattern, both refused) while events stream through, one in
//! five hundred without a filter key. The oracle applies the subscriptions in time order and
//! evaluates the patterns itself: each (consumer, queue, event) it expects must be delivered
//! once, under one id, and nothing else; the generator leaves the second after each change
//! without events, where a deployed stack may still be propagating it.

use std::collections::{BTreeMap, BTreeSet};

use keyway_local::{Fault, FaultPlan, LocalError, Usage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::{against_fault_free, against_oracle, sent, side_by_side, Report, Sent, Settings};
use crate::filtering::{replay, Change, Op, Outcome, Settings as FilterSettings, TimedEvent};

const START: i64 = super::EPOCH;
/// A round of changes every this many milliseconds; events fill the rest of the round after the
/// second that follows the changes.
const ROUND: i64 = 5_000;
const CONSUMERS: usize = 12;
const KEYS: usize = 150;
const OPS: [&str; 4] = ["create", "update", "delete", "share"];

/// The patterns the generator makes, which the oracle evaluates itself.
#[derive(Clone, Debug, PartialEq)]
enum Filter {
    Everything,
    OpIn(Vec<&'static str>),
    SizeAbove(i64),
}

impl Filter {
    fn pattern(&self) -> Option<Value> {
        match self {
            Filter::Everything => None,
            Filter::OpIn(ops) => Some(json!({ "op": ops })),
            Filter::SizeAbove(n) => Some(json!({"size": [{"numeric": [">", n]}]})),
        }
    }

    fn matches(&self, event: &Value) -> bool {
        match self {
            Filter::Everything => true,
            Filter::OpIn(ops) => ops.iter().any(|op| event["op"] == *op),
            Filter::SizeAbove(n) => event["size"].as_i64().is_some_and(|s| s > *n),
        }
    }

    fn random(rng: &mut StdRng) -> Filter {
        match rng.random_range(0..3) {
            0 => Filter::Everything,
            1 => {
                let mut ops: Vec<&str> = OPS
                    .iter()
                    .copied()
                    .filter(|_| rng.random_bool(0.4))
                    .collect();
                if ops.is_empty() {
                    ops.push(OPS[rng.random_range(0..OPS.len())]);
                }
                Filter::OpIn(ops)
            }
            _ => Filter::SizeAbove(rng.random_range(0..100)),
        }
    }
}

/// Whose subscription: a consumer's to a key, or to all events (`None`).
type Target = (String, Option<String>);
/// A subscription: its queue and its pattern.
type Subscription = (String, Filter);

/// A generated change, and what the oracle makes of it: the subscription it leaves (`None`:
/// removed), or `None` for a change the client refuses.
struct Generated {
    change: Change,
    effect: Option<(Target, Option<Subscription>)>,
}

fn queues_of(consumer: usize) -> [String; 2] {
    [
        format!("keyway-c{consumer}_a"),
        format!("keyway-c{consumer}_b"),
    ]
}

fn registry() -> String {
    let map: BTreeMap<String, [String; 2]> = (0..CONSUMERS)
        .map(|c| (format!("c{c}"), queues_of(c)))
        .collect();
    serde_json::to_string(&map).expect("JSON")
}

fn generated_change(rng: &mut StdRng, at: i64, line: usize) -> Generated {
    let c = rng.random_range(0..CONSUMERS);
    let consumer = format!("c{c}");
    let key = format!("sheet-{}", rng.random_range(0..KEYS));
    let queue = queues_of(c)[rng.random_range(0..2)].clone();
    let made = |op: Op, effect| Generated {
        change: Change { at, op, line },
        effect,
    };
    let subscribe = |key: Option<String>, queue: String, pattern| match key {
        Some(key) => Op::Subscribe {
            consumer: consumer.clone(),
            key,
            queue,
            pattern,
        },
        None => Op::SubscribeAll {
            consumer: consumer.clone(),
            queue,
            pattern,
        },
    };
    match rng.random_range(0..100) {
        // A queue of another consumer, and a malformed pattern: both refused.
        0..=1 => made(
            subscribe(Some(key), queues_of((c + 1) % CONSUMERS)[0].clone(), None),
            None,
        ),
        2..=3 => made(
            subscribe(Some(key), queue, Some(json!({"op": [{"prefx": "up"}]}))),
            None,
        ),
        4..=5 => {
            let f = Filter::random(rng);
            let op = subscribe(None, queue.clone(), f.pattern());
            made(op, Some(((consumer.clone(), None), Some((queue, f)))))
        }
        6 => made(
            Op::UnsubscribeAll {
                consumer: consumer.clone(),
            },
            Some(((consumer.clone(), None), None)),
        ),
        7..=30 => {
            let op = Op::Unsubscribe {
                consumer: consumer.clone(),
                key: key.clone(),
            };
            made(op, Some(((consumer.clone(), Some(key)), None)))
        }
        _ => {
            let f = Filter::random(rng);
            let op = subscribe(Some(key.clone()), queue.clone(), f.pattern());
            made(op, Some(((consumer.clone(), Some(key)), Some((queue, f)))))
        }
    }
}

/// Changes and events of forty rounds: many changes in the first, a few in each later one.
fn workload(events: usize, seed: u64) -> (Vec<Generated>, Vec<TimedEvent>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let rounds = 40usize;
    let per_round = events.div_ceil(rounds);
    let mut changes = Vec::new();
    let mut timed = Vec::new();
    for round in 0..rounds as i64 {
        let at = START + round * ROUND;
        let count = if round == 0 { 400 } else { 12 };
        for _ in 0..count {
            let line = changes.len() + 1;
            changes.push(generated_change(&mut rng, at, line));
        }
        // Events in the rest of the round, after the second that follows its changes.
        for i in 0..per_round.min(events - timed.len()) {
            let offset = 1_000 + (i as i64 * (ROUND - 1_000)) / per_round as i64;
            let mut event = json!({
                "id": timed.len(),
                "key": format!("sheet-{}", rng.random_range(0..KEYS)),
                "op": OPS[rng.random_range(0..OPS.len())],
                "size": rng.random_range(0..120),
            });
            if rng.random_range(0..500) == 0 {
                event.as_object_mut().expect("an object").remove("key");
            }
            timed.push(TimedEvent {
                at: at + offset,
                event,
            });
        }
    }
    (changes, timed)
}

/// A delivery: consumer, queue, event id.
type Delivery = (String, String, u64);

/// Who receives what, by the oracle's own reckoning.
fn oracle(changes: &[Generated], events: &[TimedEvent]) -> BTreeSet<Delivery> {
    let mut subscriptions: BTreeMap<Target, Subscription> = BTreeMap::new();
    let mut expected = BTreeSet::new();
    let mut changes = changes.iter().peekable();
    for event in events {
        while let Some(g) = changes.next_if(|g| g.change.at <= event.at) {
            match &g.effect {
                Some((target, Some(subscription))) => {
                    subscriptions.insert(target.clone(), subscription.clone());
                }
                Some((target, None)) => {
                    subscriptions.remove(target);
                }
                None => {}
            }
        }
        let (Some(key), Some(id)) = (event.event["key"].as_str(), event.event["id"].as_u64())
        else {
            continue;
        };
        for c in 0..CONSUMERS {
            let consumer = format!("c{c}");
            let keyed = subscriptions.get(&(consumer.clone(), Some(key.to_owned())));
            let all = subscriptions.get(&(consumer.clone(), None));
            let matched = [keyed, all]
                .into_iter()
                .flatten()
                .find(|(_, f)| f.matches(&event.event));
            if let Some((queue, _)) = matched {
                expected.insert((consumer, queue.clone(), id));
            }
        }
    }
    expected
}

/// One replay: every delivery by output id, and what the replay saw.
async fn run_once(
    settings: &Settings,
    changes: &[Change],
    events: &[TimedEvent],
    faults: FaultPlan,
) -> Result<(Sent, BTreeMap<Delivery, BTreeSet<String>>, Outcome), LocalError> {
    let filter_settings = FilterSettings {
        shards: settings.shards,
        lanes: settings.lanes,
        registry: Some(registry()),
        faults,
        metering: settings.metering.clone(),
        ..FilterSettings::default()
    };
    let mut outputs = Vec::new();
    let mut deliveries: BTreeMap<Delivery, BTreeSet<String>> = BTreeMap::new();
    let outcome = replay(&filter_settings, changes, events.iter().cloned(), |d| {
        let id = d.event["id"].as_u64().unwrap_or(u64::MAX);
        let output_id = d.output_id.clone().unwrap_or_default();
        let body = format!("{}>{}: {}", d.consumer, d.queue, d.event);
        deliveries
            .entry((d.consumer, d.queue, id))
            .or_default()
            .insert(output_id.clone());
        outputs.push((output_id, body));
    })
    .await?;
    Ok((sent(outputs), deliveries, outcome))
}

/// What the functions of the fault-free run were billed for.
pub(super) async fn usage(settings: &Settings) -> Result<Usage, LocalError> {
    let (generated, timed) = workload(settings.events, settings.seed);
    let changes: Vec<Change> = generated.iter().map(|g| g.change.clone()).collect();
    let (_, _, outcome) = run_once(settings, &changes, &timed, FaultPlan::default()).await?;
    Ok(outcome.ending.usage)
}

pub(super) fn run(settings: &Settings) -> Result<Report, LocalError> {
    let (generated, timed) = workload(settings.events, settings.seed);
    let changes: Vec<Change> = generated.iter().map(|g| g.change.clone()).collect();
    let ((clean, _, _), (faulty, deliveries, outcome)) = side_by_side(
        || run_once(settings, &changes, &timed, FaultPlan::default()),
        || run_once(settings, &changes, &timed, settings.faults()),
    )?;
    let keyless = timed
        .iter()
        .filter(|e| e.event.get("key").is_none())
        .count();
    let mut report = Report {
        unit: "deliveries",
        bad_records: keyless as u64,
        ..Report::default()
    };
    // A delivery counts once however often faults repeated it, under one id: one sent under
    // two ids is applied twice. The fault-free comparison holds each repeat to its id and body.
    let got: BTreeMap<Delivery, usize> = deliveries
        .into_iter()
        .map(|(d, ids)| (d, ids.len()))
        .collect();
    let want: BTreeMap<Delivery, usize> = oracle(&generated, &timed)
        .into_iter()
        .map(|d| (d, 1))
        .collect();
    against_oracle(&mut report, &got, &want, |got, want| got > want);
    against_fault_free(&mut report, &faulty, &clean);
    let refused = generated.iter().filter(|g| g.effect.is_none()).count();
    if outcome.refused.len() != refused {
        report.oracle.lost += 1;
        report.example(format!(
            "{} subscriptions refused by the client, {refused} expected",
            outcome.refused.len()
        ));
    }
    report.take_ending(&outcome.ending);
    // The filter keeps no keyed state; the policy sync commits a key's watermarks in one item,
    // with no other writer.
    let commits = "the filter commits nothing, the policy sync one item a key with one writer";
    report.not_applicable(Fault::Conflict, commits);
    report.not_applicable(Fault::CrashInCommit, commits);
    Ok(report)
}
