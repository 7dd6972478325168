//! Dynamic filtering under every fault: generated subscriptions changing mid-stream and events
//! (some without a filter key) replayed through the stack of template.yaml on the embedded
//! runtime, once without faults and once with every fault at 2%. The deliveries of both runs are
//! the same (a delivery made again under faults carries the id it went out under before), and equal
//! those of an oracle written here: subscriptions applied in time order, patterns of the three
//! shapes the generator makes evaluated by hand, a change in effect from its time on (the
//! generator leaves the second after each change without events, where a deployed stack may
//! still be propagating it).
//!
//! `KEYWAY_FILTER_CHAOS_EVENTS` sets the number of events (50,000 by default; scripts/test runs
//! 200,000).

use std::collections::{BTreeMap, BTreeSet};

use keyway::local::FaultPlan;
use keyway_stack::filtering::{replay, Change, Delivered, Op, Outcome, Settings, TimedEvent};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const START: i64 = 1_767_225_600_000;
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
            Filter::OpIn(ops) => Some(json!({"op": ops})),
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
}

/// Whose subscription: a consumer's to a key, or to all events (`None`).
type Target = (String, Option<String>);
/// A subscription: its queue and its pattern.
type Subscription = (String, Filter);

/// A generated change: the line `keyway filter` would read, and what the oracle makes of it.
struct Generated {
    change: Change,
    /// The subscription the change leaves (`None`: removed); `None` for a change the client
    /// refuses.
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
    serde_json::to_string(&map).unwrap()
}

fn filter(rng: &mut StdRng) -> Filter {
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

fn generated_change(rng: &mut StdRng, at: i64, line: usize) -> Generated {
    let c = rng.random_range(0..CONSUMERS);
    let consumer = format!("c{c}");
    let key = format!("sheet-{}", rng.random_range(0..KEYS));
    let queue = queues_of(c)[rng.random_range(0..2)].clone();
    let made = |op: Op, effect| Generated {
        change: Change { at, op, line },
        effect,
    };
    match rng.random_range(0..100) {
        // A queue of another consumer, and a malformed pattern: both refused.
        0..=1 => made(
            Op::Subscribe {
                consumer: consumer.clone(),
                key,
                queue: queues_of((c + 1) % CONSUMERS)[0].clone(),
                pattern: None,
            },
            None,
        ),
        2..=3 => made(
            Op::Subscribe {
                consumer,
                key,
                queue,
                pattern: Some(json!({"op": [{"prefx": "up"}]})),
            },
            None,
        ),
        4..=5 => {
            let f = filter(rng);
            let op = Op::SubscribeAll {
                consumer: consumer.clone(),
                queue: queue.clone(),
                pattern: f.pattern(),
            };
            made(op, Some(((consumer, None), Some((queue, f)))))
        }
        6 => made(
            Op::UnsubscribeAll {
                consumer: consumer.clone(),
            },
            Some(((consumer, None), None)),
        ),
        7..=30 => made(
            Op::Unsubscribe {
                consumer: consumer.clone(),
                key: key.clone(),
            },
            Some(((consumer, Some(key)), None)),
        ),
        _ => {
            let f = filter(rng);
            let op = Op::Subscribe {
                consumer: consumer.clone(),
                key: key.clone(),
                queue: queue.clone(),
                pattern: f.pattern(),
            };
            made(op, Some(((consumer, Some(key)), Some((queue, f)))))
        }
    }
}

/// Changes and events of `rounds` rounds: many changes in the first, a few in each later one.
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
            let id = timed.len();
            let mut event = json!({
                "id": id,
                "key": format!("sheet-{}", rng.random_range(0..KEYS)),
                "op": OPS[rng.random_range(0..OPS.len())],
                "size": rng.random_range(0..120),
            });
            if rng.random_range(0..500) == 0 {
                event.as_object_mut().unwrap().remove("key");
            }
            timed.push(TimedEvent {
                at: at + offset,
                event,
            });
        }
    }
    (changes, timed)
}

/// Who receives what: (consumer, queue, event id), by the oracle's own reckoning.
fn oracle(changes: &[Generated], events: &[TimedEvent]) -> BTreeSet<(String, String, u64)> {
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
        let Some(key) = event.event["key"].as_str() else {
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
                let id = event.event["id"].as_u64().unwrap();
                expected.insert((consumer, queue.clone(), id));
            }
        }
    }
    expected
}

async fn run(
    changes: &[Change],
    events: &[TimedEvent],
    faults: FaultPlan,
) -> (Vec<Delivered>, Outcome) {
    let settings = Settings {
        shards: 4,
        registry: Some(registry()),
        faults,
        ..Settings::default()
    };
    let mut delivered = Vec::new();
    let outcome = replay(&settings, changes, events.iter().cloned(), |d| {
        delivered.push(d)
    })
    .await
    .expect("the replay runs");
    (delivered, outcome)
}

fn triple(d: &Delivered) -> (String, String, u64) {
    (
        d.consumer.clone(),
        d.queue.clone(),
        d.event["id"].as_u64().unwrap(),
    )
}

#[tokio::test(start_paused = true)]
async fn deliveries_under_every_fault_equal_a_fault_free_run_and_the_oracle() {
    let events: usize = std::env::var("KEYWAY_FILTER_CHAOS_EVENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50_000);
    let (generated, timed) = workload(events, 17);
    let changes: Vec<Change> = generated.iter().map(|g| g.change.clone()).collect();

    let (clean, clean_outcome) = run(&changes, &timed, FaultPlan::default()).await;
    let expected = oracle(&generated, &timed);
    let got: BTreeSet<_> = clean.iter().map(triple).collect();
    assert_eq!(
        got.len(),
        clean.len(),
        "without faults, every delivery once"
    );
    assert!(
        expected.len() > events / 20,
        "the workload delivers: {}",
        expected.len()
    );
    assert_eq!(
        got.difference(&expected).count() + expected.difference(&got).count(),
        0,
        "deliveries differ from the oracle's: {} unexpected, {} missing",
        got.difference(&expected).count(),
        expected.difference(&got).count()
    );
    let refused = generated.iter().filter(|g| g.effect.is_none()).count();
    assert_eq!(clean_outcome.refused.len(), refused);
    let keyless = timed
        .iter()
        .filter(|e| e.event.get("key").is_none())
        .count();
    assert_eq!(clean_outcome.dead_letters.len(), keyless);

    let (faulty, faulty_outcome) = run(&changes, &timed, FaultPlan::all(0.02, 5)).await;
    // A delivery made again carries the id it went out under before.
    let mut ids: BTreeMap<(String, String, u64), String> = BTreeMap::new();
    for d in &faulty {
        let id = d.output_id.clone().expect("an id");
        let first = ids.entry(triple(d)).or_insert_with(|| id.clone());
        assert_eq!(*first, id, "{:?} went out under two ids", triple(d));
    }
    let faulty_set: BTreeSet<_> = ids.into_keys().collect();
    assert!(
        faulty_set == got,
        "deliveries under faults differ: {} unexpected, {} missing",
        faulty_set.difference(&got).count(),
        got.difference(&faulty_set).count()
    );
    assert!(
        faulty.len() > clean.len(),
        "faults made some deliveries twice"
    );
    assert_eq!(faulty_outcome.refused.len(), refused);
    let distinct: BTreeSet<&String> = faulty_outcome.dead_letters.iter().collect();
    assert!(distinct.len() <= 1 && faulty_outcome.dead_letters.len() >= keyless);
    println!(
        "{} events, {} deliveries ({} repeats under faults), {} changes ({} refused)",
        timed.len(),
        clean.len(),
        faulty.len() - clean.len(),
        changes.len(),
        refused
    );
}
