//! `keyway demo`, filtering section: consumers subscribing, changing and dropping subscriptions
//! while sheet events stream through the dynamic filtering of template.yaml, under the demo's
//! faults. Prints how many events matched no one, how long changes took to reach the filter
//! state, and checks each event reached exactly the consumers whose subscriptions matched it at
//! its time, once, whatever the faults repeated.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use keyway::domain::pattern::Pattern;
use keyway_local::FaultPlan;
use keyway_stack::filtering::{replay, Change, Op, Settings, TimedEvent};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::error::CliError;

const START: i64 = 1_767_225_600_000;
const CONSUMERS: usize = 20;
const KEYS: usize = 2_000;

/// Consumer `team-{c}`'s queue, named as its own (`QueueOwnership`).
fn queue_of(c: usize) -> String {
    format!("keyway-team-{c}_q")
}

/// Changes every second, events in between; a few subscriptions name a queue of another consumer.
fn workload(events: usize, seed: u64) -> (Vec<Change>, Vec<TimedEvent>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut changes = Vec::new();
    let ops = ["update", "create", "delete", "comment"];
    let seconds = (events / 500).max(10) as i64;
    for second in 0..seconds {
        let count = if second == 0 { 300 } else { 8 };
        for _ in 0..count {
            let c = rng.random_range(0..CONSUMERS);
            let consumer = format!("team-{c}");
            let key = format!("sheet-{}", rng.random_range(0..KEYS / 4));
            let queue = if rng.random_range(0..100) == 0 {
                queue_of((c + 1) % CONSUMERS)
            } else {
                queue_of(c)
            };
            let pattern = match rng.random_range(0..3) {
                0 => None,
                1 => Some(json!({"op": [ops[rng.random_range(0..4)], "delete"]})),
                _ => Some(json!({"cells": [{"numeric": [">=", rng.random_range(1..10)]}]})),
            };
            let op = match rng.random_range(0..20) {
                0 => Op::SubscribeAll {
                    consumer,
                    queue,
                    pattern: Some(json!({"op": ["delete"], "cells": [{"numeric": [">", 8]}]})),
                },
                1 => Op::UnsubscribeAll { consumer },
                2..=6 => Op::Unsubscribe { consumer, key },
                _ => Op::Subscribe {
                    consumer,
                    key,
                    queue,
                    pattern,
                },
            };
            let line = changes.len() + 1;
            changes.push(Change {
                at: START + second * 1_000,
                op,
                line,
            });
        }
    }
    let per_second = events.div_ceil(seconds as usize);
    let timed = (0..events)
        .map(|i| {
            let second = (i / per_second) as i64;
            let offset = 1 + ((i % per_second) as i64 * 998) / per_second as i64;
            let event = json!({
                "id": i,
                "key": format!("sheet-{}", rng.random_range(0..KEYS)),
                "op": ops[rng.random_range(0..4)],
                "cells": rng.random_range(0..10),
            });
            TimedEvent {
                at: START + second * 1_000 + offset,
                event,
            }
        })
        .collect();
    (changes, timed)
}

/// (consumer, queue, event id) of every delivery the subscriptions call for: the changes the
/// client accepted, in time order, each in effect from its time on.
fn expected(
    changes: &[Change],
    refused: &BTreeSet<usize>,
    events: &[TimedEvent],
) -> BTreeSet<(String, String, u64)> {
    let mut subscriptions: BTreeMap<(String, Option<String>), (String, Pattern)> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut pending = changes
        .iter()
        .filter(|c| !refused.contains(&c.line))
        .peekable();
    let compile = |p: &Option<Value>| {
        p.as_ref().map_or_else(Pattern::everything, |p| {
            Pattern::parse(p).expect("the demo's patterns compile")
        })
    };
    for e in events {
        while let Some(change) = pending.next_if(|c| c.at <= e.at) {
            match &change.op {
                Op::Subscribe {
                    consumer,
                    key,
                    queue,
                    pattern,
                } => {
                    subscriptions.insert(
                        (consumer.clone(), Some(key.clone())),
                        (queue.clone(), compile(pattern)),
                    );
                }
                Op::SubscribeAll {
                    consumer,
                    queue,
                    pattern,
                } => {
                    subscriptions
                        .insert((consumer.clone(), None), (queue.clone(), compile(pattern)));
                }
                Op::Unsubscribe { consumer, key } => {
                    subscriptions.remove(&(consumer.clone(), Some(key.clone())));
                }
                Op::UnsubscribeAll { consumer } => {
                    subscriptions.remove(&(consumer.clone(), None));
                }
            }
        }
        let key = e.event["key"].as_str().unwrap_or_default().to_owned();
        for c in 0..CONSUMERS {
            let consumer = format!("team-{c}");
            let keyed = subscriptions.get(&(consumer.clone(), Some(key.clone())));
            let all = subscriptions.get(&(consumer.clone(), None));
            if let Some((queue, _)) = [keyed, all]
                .into_iter()
                .flatten()
                .find(|(_, p)| p.matches(&e.event))
            {
                out.insert((
                    consumer,
                    queue.clone(),
                    e.event["id"].as_u64().unwrap_or_default(),
                ));
            }
        }
    }
    out
}

pub(super) async fn run(events: usize, faults: f64, seed: u64) -> Result<(), CliError> {
    let (changes, timed) = workload(events, seed);
    println!("\ndynamic filtering: the FilterPolicySyncFunction and DynamicFilterFunction of template.yaml");
    println!(
        "  {} subscription changes of {CONSUMERS} consumers over {KEYS} sheets, made every second while {} sheet events stream through,",
        changes.len(),
        timed.len()
    );
    println!("  under the same faults; 1% of subscriptions name a queue of another consumer");
    let registry: BTreeMap<String, [String; 1]> = (0..CONSUMERS)
        .map(|c| (format!("team-{c}"), [queue_of(c)]))
        .collect();
    let settings = Settings {
        shards: 4,
        registry: Some(serde_json::to_string(&registry).expect("JSON")),
        faults: FaultPlan::all(faults, seed),
        latency: Some(Duration::from_millis(1)),
        ..Settings::default()
    };
    let mut delivered = BTreeSet::new();
    let mut messages = 0u64;
    let outcome = replay(&settings, &changes, timed.clone(), |d| {
        messages += 1;
        delivered.insert((
            d.consumer,
            d.queue,
            d.event["id"].as_u64().unwrap_or_default(),
        ));
    })
    .await?;
    let refused: BTreeSet<usize> = outcome.refused.iter().map(|(line, _)| *line).collect();
    let expected = expected(&changes, &refused, &timed);
    let reached: BTreeSet<u64> = delivered.iter().map(|(_, _, id)| *id).collect();
    let mut latency = outcome.propagation.clone();
    latency.sort_unstable();
    let at = |q: f64| {
        latency
            .get(((latency.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    println!(
        "  {} deliveries ({} repeated under faults, each under the id it went out under first); {:.1}% of events matched no one",
        delivered.len(),
        messages - delivered.len() as u64,
        100.0 * (1.0 - reached.len() as f64 / timed.len() as f64)
    );
    println!(
        "  propagation, policy write to the filter state (virtual time, 1 ms a service call): p50 {} ms, p95 {} ms, max {} ms",
        at(0.5),
        at(0.95),
        latency.last().copied().unwrap_or(0)
    );
    println!(
        "  {} subscriptions refused by the client, each with its reason",
        refused.len()
    );
    if delivered == expected {
        println!("  every event reached exactly the consumers whose subscriptions matched it at its time");
        Ok(())
    } else {
        Err(format!(
            "filtering: {} deliveries nobody subscribed to, {} missing",
            delivered.difference(&expected).count(),
            expected.difference(&delivered).count()
        )
        .into())
    }
}
