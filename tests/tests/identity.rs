//! The identity enricher on the executor, its feedback stream looped back by hand: the article's
//! four records (Alice assumes role-1 and gets ASIA1; role-1 assumes role-2 and gets ASIA2; an
//! action with each key) come out enriched with Alice as their original actor in every one of
//! their 24 arrival orders, a record whose resolution never comes goes out unresolved when
//! its timer fires, a key's identity read with nothing waiting answers its next records without
//! a read, and a key's identity and items go once no record can need them.

use identity_enricher::enricher::{
    reason, EnricherConfig, IdentityEnricher, ENRICHED, EVENTS, FEEDBACK, RESOLUTIONS,
};
use keyway::ports::Clock;
use keyway::sources::kinesis::decode_event;
use keyway::{Executor, ExecutorConfig, Inputs};
use keyway_tests::harness::{Shard, World};
use keyway_tests::trails::{alice, article, record, session, ACCOUNT};
use serde_json::Value;

/// The enricher on `world`, its events and feedback streams wired.
fn enricher(world: &World, config: EnricherConfig) -> Executor<IdentityEnricher> {
    let inputs = Inputs::new()
        .with(&EVENTS, "cloudtrail")
        .with(&FEEDBACK, "feedback");
    Executor::with_inputs(
        IdentityEnricher::new(config),
        inputs,
        world.store.clone(),
        world.sinks(),
        world.clock.clone(),
    )
    .expect("the world wires every sink and input")
}

/// Runs `records` one batch each, in order, looping every resolution published back through
/// the feedback stream until none is left; returns the enriched records by event id.
async fn run(records: &[Value]) -> std::collections::BTreeMap<String, Value> {
    run_with(EnricherConfig::default(), records).await
}

/// `run` with the enricher configured so.
async fn run_with(
    config: EnricherConfig,
    records: &[Value],
) -> std::collections::BTreeMap<String, Value> {
    let (enriched, letters) = run_through(config, records).await;
    assert!(letters.is_empty(), "{letters:?}");
    enriched
}

/// Runs `records` one batch each, in order, looping every resolution published back through
/// the feedback stream until none is left; returns the enriched records by event id, and the
/// dead letters.
async fn run_through(
    config: EnricherConfig,
    records: &[Value],
) -> (
    std::collections::BTreeMap<String, Value>,
    Vec<keyway::domain::DeadLetter>,
) {
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let executor = enricher(&world, config);
    let mut events = Shard::new("cloudtrail", 0);
    let mut feedback = Shard::new("feedback", 0);
    let mut looped = 0;
    for record in records {
        let key = format!(
            "{ACCOUNT}#{}",
            record["userIdentity"]["accessKeyId"].as_str().unwrap()
        );
        let batch = events.batch(&[(key.as_str(), serde_json::to_vec(record).unwrap())]);
        let report = executor
            .run(decode_event(&batch.to_string()).unwrap())
            .await;
        assert_eq!(report.failed_from, None);
        while world.outputs(RESOLUTIONS.name).len() > looped {
            let message = world.outputs(RESOLUTIONS.name)[looped].clone();
            let resolution: Value = serde_json::from_str(&message.body).unwrap();
            let key = format!(
                "{}#{}",
                resolution["customer"].as_str().unwrap(),
                resolution["accessKeyId"].as_str().unwrap()
            );
            let batch = feedback.batch(&[(key.as_str(), message.body.clone().into_bytes())]);
            let report = executor
                .run(decode_event(&batch.to_string()).unwrap())
                .await;
            assert_eq!(report.failed_from, None);
            looped += 1;
        }
    }
    let enriched = world
        .outputs(ENRICHED.name)
        .iter()
        .map(|m| {
            let enriched: Value = serde_json::from_str(&m.body).unwrap();
            (enriched["eventID"].as_str().unwrap().to_owned(), enriched)
        })
        .collect();
    (enriched, world.dead_letters())
}

/// A world, the enricher on it with the default configuration and its buffer TTL, the events
/// shard, and the partition key of the key `ASIA9`, which no resolution resolves.
fn asia9() -> (World, Executor<IdentityEnricher>, i64, Shard, String) {
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let config = EnricherConfig::default();
    let ttl = config_ttl(&config);
    let executor = enricher(&world, config);
    let events = Shard::new("cloudtrail", 0);
    (world, executor, ttl, events, format!("{ACCOUNT}#ASIA9"))
}

/// Every permutation of `0..n`.
fn orders(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for rest in orders(n - 1) {
        for at in 0..=rest.len() {
            let mut order = rest.clone();
            order.insert(at, n - 1);
            all.push(order);
        }
    }
    all
}

#[tokio::test]
async fn the_articles_four_records_trace_to_alice_in_all_24_arrival_orders() {
    let records = article();
    let all = orders(records.len());
    assert_eq!(all.len(), 24);
    for order in all {
        let arrived: Vec<Value> = order.iter().map(|&i| records[i].clone()).collect();
        let enriched = run(&arrived).await;
        assert_eq!(enriched.len(), 4, "{order:?}: {enriched:#?}");
        let chain = |id: &str| -> Vec<String> {
            let e = &enriched[id]["enrichment"];
            assert_eq!(e["status"], "resolved", "{order:?} {id}: {e}");
            assert_eq!(
                e["originalActor"]["arn"],
                format!("arn:aws:iam::{ACCOUNT}:user/alice"),
                "{order:?} {id}"
            );
            e["roleChain"]
                .as_array()
                .unwrap()
                .iter()
                .map(|link| link["accessKeyId"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(chain("1-alice-assumes-role-1"), Vec::<String>::new());
        assert_eq!(chain("2-action-with-asia1"), ["ASIA1"], "{order:?}");
        assert_eq!(chain("3-role-1-assumes-role-2"), ["ASIA1"], "{order:?}");
        assert_eq!(
            chain("4-snapshot-with-asia2"),
            ["ASIA1", "ASIA2"],
            "{order:?}"
        );
    }
}

#[tokio::test]
async fn a_record_whose_resolution_never_comes_goes_out_unresolved_when_its_timer_fires() {
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let config = EnricherConfig::default();
    let ttl = config.buffer_ttl.as_millis() as i64;
    let executor = enricher(&world, config);
    let mut events = Shard::new("cloudtrail", 0);
    let orphan = record("orphan", session("ASIA9", "role-9"), "ListBuckets", None);
    let key = format!("{ACCOUNT}#ASIA9");
    let batch = events.batch(&[(key.as_str(), serde_json::to_vec(&orphan).unwrap())]);
    executor
        .run(decode_event(&batch.to_string()).unwrap())
        .await;
    assert!(world.outputs(ENRICHED.name).is_empty(), "it waits");
    world.clock.advance(ttl - 1);
    executor.fire_timers(None).await.unwrap();
    assert!(
        world.outputs(ENRICHED.name).is_empty(),
        "not before the TTL"
    );
    world.clock.advance(1);
    let sweep = executor.fire_timers(None).await.unwrap();
    assert_eq!(sweep.fired, 1);
    let out = world.outputs(ENRICHED.name);
    assert_eq!(out.len(), 1);
    let enriched: Value = serde_json::from_str(&out[0].body).unwrap();
    assert_eq!(enriched["enrichment"]["status"], "unresolved");
    assert_eq!(enriched["enrichment"]["reason"], reason::BUFFER_TTL);
    assert_eq!(enriched["eventID"], "orphan");
    // As far as the trail leads: the session and the role that issued it.
    assert_eq!(
        enriched["enrichment"]["sessionArn"],
        format!("arn:aws:sts::{ACCOUNT}:assumed-role/role-9/role-9-session")
    );
    assert_eq!(
        enriched["enrichment"]["sessionIssuerArn"],
        format!("arn:aws:iam::{ACCOUNT}:role/role-9")
    );
}

#[tokio::test]
async fn a_key_fed_far_more_records_than_its_buffer_holds_sends_the_overflow_out_at_once_saying_why(
) {
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let config = EnricherConfig {
        max_buffered: 3,
        ..EnricherConfig::default()
    };
    let executor = enricher(&world, config);
    let mut events = Shard::new("cloudtrail", 0);
    let key = format!("{ACCOUNT}#ASIA9");
    let records: Vec<(&str, Vec<u8>)> = (0..10)
        .map(|i| {
            let r = record(
                &format!("r{i}"),
                session("ASIA9", "role-9"),
                "ListBuckets",
                None,
            );
            (key.as_str(), serde_json::to_vec(&r).unwrap())
        })
        .collect();
    let report = executor
        .run(decode_event(&events.batch(&records).to_string()).unwrap())
        .await;
    assert_eq!((report.failed_from, report.dead_lettered), (None, 0));
    let out: Vec<Value> = world
        .outputs(ENRICHED.name)
        .iter()
        .map(|m| serde_json::from_str(&m.body).unwrap())
        .collect();
    assert_eq!(out.len(), 7, "all but the three the buffer holds go out");
    assert!(out
        .iter()
        .all(|e| e["enrichment"]["reason"] == reason::BUFFER_FULL));
    assert_eq!(out[0]["eventID"], "r3", "the first three wait");
}

/// The resolution of a key reaches it while the key's buffer timer is firing: both invocations
/// read the state with the record still waiting, and the timer commits first. The waiting record
/// goes out under its one id with one body (unresolved, as the winner decided), never resolved
/// as well: what the loser computed from the state it lost with is never sent.
#[tokio::test(start_paused = true)]
async fn a_resolution_racing_the_buffer_timer_sends_the_waiting_record_one_way_only() {
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let latency = std::time::Duration::from_millis(10);
    let config = EnricherConfig::default();
    let ttl = config.buffer_ttl.as_millis() as i64;
    let executor = enricher(&world, config);
    let mut events = Shard::new("cloudtrail", 0);
    let mut feedback = Shard::new("feedback", 0);
    let key = format!("{ACCOUNT}#ASIA9");
    let waiting = record("waits", session("ASIA9", "role-9"), "ListBuckets", None);
    let batch = events.batch(&[(key.as_str(), serde_json::to_vec(&waiting).unwrap())]);
    executor
        .run(decode_event(&batch.to_string()).unwrap())
        .await;
    world.clock.advance(ttl);
    // Every table call takes 10 ms from now on. The sweep reads the timer index an hour bucket
    // at a time, then loads the key and commits, a call apart; the resolution arrives 175 ms in,
    // between that load and that commit. (The asserts below fail if the timing no longer makes
    // the two race.)
    world.table.meter().set_latency(Some(latency));
    let resolution = serde_json::json!({
        "customer": ACCOUNT,
        "accessKeyId": "ASIA9",
        "originalActor": {"type": "IAMUser", "arn": format!("arn:aws:iam::{ACCOUNT}:user/alice")},
        "roleChain": []
    });
    let batch = feedback.batch(&[(key.as_str(), serde_json::to_vec(&resolution).unwrap())]);
    let resolve = async {
        tokio::time::sleep(latency * 35 / 2).await;
        executor
            .run(decode_event(&batch.to_string()).unwrap())
            .await
    };
    let (swept, report) = tokio::join!(executor.fire_timers(None), resolve);
    assert_eq!(swept.unwrap().fired, 1, "the timer fired");
    assert!(
        report.conflicts >= 1,
        "the resolution lost the race: {report:?}"
    );
    let out: Vec<Value> = world
        .outputs(ENRICHED.name)
        .iter()
        .map(|m| serde_json::from_str(&m.body).unwrap())
        .collect();
    assert_eq!(out.len(), 1, "{out:#?}");
    assert_eq!(out[0]["enrichment"]["status"], "unresolved");
}

/// Runs `record` as one batch on `shard` under its caller's key, looping the resolution it
/// publishes, if any, back through `feedback`.
async fn deliver(
    world: &World,
    executor: &Executor<IdentityEnricher>,
    (events, feedback): (&mut Shard, &mut Shard),
    record: &Value,
) {
    let before = world.outputs(RESOLUTIONS.name).len();
    events.arrival_millis = world.clock.now_millis();
    feedback.arrival_millis = world.clock.now_millis();
    let key = format!(
        "{ACCOUNT}#{}",
        record["userIdentity"]["accessKeyId"].as_str().unwrap()
    );
    let batch = events.batch(&[(key.as_str(), serde_json::to_vec(record).unwrap())]);
    executor
        .run(decode_event(&batch.to_string()).unwrap())
        .await;
    for message in &world.outputs(RESOLUTIONS.name)[before..] {
        let resolution: Value = serde_json::from_str(&message.body).unwrap();
        let key = format!("{ACCOUNT}#{}", resolution["accessKeyId"].as_str().unwrap());
        let batch = feedback.batch(&[(key.as_str(), message.body.clone().into_bytes())]);
        executor
            .run(decode_event(&batch.to_string()).unwrap())
            .await;
    }
}

#[tokio::test]
async fn an_event_cloudtrail_delivers_twice_goes_out_under_one_id_whether_it_waited_or_not() {
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let executor = enricher(&world, EnricherConfig::default());
    let mut shards = (Shard::new("cloudtrail", 0), Shard::new("feedback", 0));
    let action = record("twice", session("ASIA1", "role-1"), "ListBuckets", None);
    let assume = record("assume", alice(), "AssumeRole", Some(("role-1", "ASIA1")));
    // The first copy waits for ASIA1's identity; the second, at a later position of the
    // stream, finds it. A third copy comes in the same batch as the second.
    deliver(&world, &executor, (&mut shards.0, &mut shards.1), &action).await;
    deliver(&world, &executor, (&mut shards.0, &mut shards.1), &assume).await;
    world.clock.advance(10_000);
    let key = format!("{ACCOUNT}#ASIA1");
    let body = serde_json::to_vec(&action).unwrap();
    let batch = shards
        .0
        .batch(&[(key.as_str(), body.clone()), (key.as_str(), body)]);
    executor
        .run(decode_event(&batch.to_string()).unwrap())
        .await;
    let copies: Vec<(String, Value)> = world
        .outputs(ENRICHED.name)
        .iter()
        .map(|m| {
            (
                m.output_id.clone().expect("an output id"),
                serde_json::from_str::<Value>(&m.body).unwrap(),
            )
        })
        .filter(|(_, e)| e["eventID"] == "twice")
        .collect();
    assert_eq!(copies.len(), 3, "{copies:#?}");
    for (id, enriched) in &copies {
        assert_eq!(enriched["enrichment"]["status"], "resolved");
        assert_eq!(
            (id, &enriched["enrichment"]["outputId"]),
            (&copies[0].0, &copies[0].1["enrichment"]["outputId"])
        );
    }
    // Another event of the key, at another position, keeps an id of its own.
    let other = record("other", session("ASIA1", "role-1"), "ListBuckets", None);
    deliver(&world, &executor, (&mut shards.0, &mut shards.1), &other).await;
    let last = world
        .outputs(ENRICHED.name)
        .last()
        .unwrap()
        .output_id
        .clone();
    assert_ne!(last.as_ref(), Some(&copies[0].0));
}

/// Capacity units the world's table has been read for.
fn reads(world: &World) -> f64 {
    world.table.meter().snapshot().read_units
}

#[tokio::test]
async fn a_keys_identity_read_with_nothing_waiting_answers_its_next_records_without_a_read() {
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let executor = enricher(&world, EnricherConfig::default());
    let mut shards = (Shard::new("cloudtrail", 0), Shard::new("feedback", 0));
    let assume = record("assume", alice(), "AssumeRole", Some(("role-1", "ASIA1")));
    deliver(&world, &executor, (&mut shards.0, &mut shards.1), &assume).await;
    let action = |key: &str, id: &str| record(id, session(key, "role-1"), "ListBuckets", None);
    // The first action with ASIA1 reads its identity; the next ones, which arrive after, are
    // answered from memory.
    deliver(
        &world,
        &executor,
        (&mut shards.0, &mut shards.1),
        &action("ASIA1", "a1"),
    )
    .await;
    let before = reads(&world);
    for id in ["a2", "a3"] {
        world.clock.advance(10_000);
        deliver(
            &world,
            &executor,
            (&mut shards.0, &mut shards.1),
            &action("ASIA1", id),
        )
        .await;
    }
    assert_eq!(reads(&world), before, "no read of ASIA1's state");
    let out = world.outputs(ENRICHED.name);
    let enriched: Vec<Value> = out
        .iter()
        .map(|m| serde_json::from_str(&m.body).unwrap())
        .collect();
    assert_eq!(enriched.len(), 4);
    for e in &enriched[1..] {
        assert_eq!(e["enrichment"]["status"], "resolved", "{e}");
        assert_eq!(e["enrichment"]["originalActor"]["userName"], "alice", "{e}");
    }
    // ASIA9's actions wait for a resolution that has not come: each reads the key's state.
    deliver(
        &world,
        &executor,
        (&mut shards.0, &mut shards.1),
        &action("ASIA9", "w1"),
    )
    .await;
    let before = reads(&world);
    deliver(
        &world,
        &executor,
        (&mut shards.0, &mut shards.1),
        &action("ASIA9", "w2"),
    )
    .await;
    assert!(reads(&world) > before, "a key with records waiting is read");
    assert_eq!(world.outputs(ENRICHED.name).len(), 4, "both wait");
}

/// A record that waited and went out unresolved, delivered again once its key's identity is
/// remembered, is skipped by its key's watermark as before: it arrived before the identity was
/// read, so it is not answered from memory (which would send it resolved, another body under
/// its id).
#[tokio::test]
async fn a_record_that_went_out_unresolved_and_comes_again_after_its_key_is_remembered_is_skipped()
{
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let config = EnricherConfig::default();
    let ttl = config.buffer_ttl.as_millis() as i64;
    let executor = enricher(&world, config);
    let mut shards = (Shard::new("cloudtrail", 0), Shard::new("feedback", 0));
    let action = |id: &str| record(id, session("ASIA1", "role-1"), "ListBuckets", None);
    let key = format!("{ACCOUNT}#ASIA1");
    shards.0.arrival_millis = world.clock.now_millis();
    let early = shards
        .0
        .batch(&[(key.as_str(), serde_json::to_vec(&action("early")).unwrap())]);
    executor
        .run(decode_event(&early.to_string()).unwrap())
        .await;
    world.clock.advance(ttl);
    executor.fire_timers(None).await.unwrap();
    // Alice's AssumeRole comes late; a later action reads ASIA1's identity, then remembered.
    let assume = record("assume", alice(), "AssumeRole", Some(("role-1", "ASIA1")));
    deliver(&world, &executor, (&mut shards.0, &mut shards.1), &assume).await;
    world.clock.advance(10_000);
    deliver(
        &world,
        &executor,
        (&mut shards.0, &mut shards.1),
        &action("later"),
    )
    .await;
    // Lambda delivers the early batch again (its retry, still failing for another key).
    world.clock.advance(10_000);
    executor
        .run(decode_event(&early.to_string()).unwrap())
        .await;
    let enriched = |id: &str| -> Vec<Value> {
        world
            .outputs(ENRICHED.name)
            .iter()
            .map(|m| serde_json::from_str::<Value>(&m.body).unwrap())
            .filter(|e| e["eventID"] == id)
            .collect()
    };
    let early = enriched("early");
    assert_eq!(early.len(), 1, "{early:#?}");
    assert_eq!(early[0]["enrichment"]["status"], "unresolved");
    assert_eq!(enriched("later")[0]["enrichment"]["status"], "resolved");
}

#[tokio::test]
async fn an_identity_is_kept_through_its_credentials_and_the_lateness_then_the_keys_items_go() {
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let lateness = std::time::Duration::from_secs(3600);
    let config = EnricherConfig {
        lateness,
        ..EnricherConfig::default()
    };
    let grace = config.grace.as_millis() as i64;
    let executor = enricher(&world, config).with_config(ExecutorConfig {
        redelivery_window: lateness,
        ..ExecutorConfig::default()
    });
    let mut shards = (Shard::new("cloudtrail", 0), Shard::new("feedback", 0));
    let start = world.clock.now_millis();
    // Alice's credentials for role-1 last an hour.
    let mut assume = record("assume", alice(), "AssumeRole", Some(("role-1", "ASIA1")));
    assume["responseElements"]["credentials"]["expiration"] = "Jan 1, 2026, 1:00:00 AM".into();
    deliver(&world, &executor, (&mut shards.0, &mut shards.1), &assume).await;
    let expired = start + 3_600_000 + grace;
    let late = |id: &str| {
        let mut r = record(id, session("ASIA1", "role-1"), "ListBuckets", None);
        r["eventTime"] = "2026-01-01T00:59:00Z".into();
        r
    };
    // A record of the credentials' last minute, delivered late: still traced to Alice.
    world
        .clock
        .advance(expired + lateness.as_millis() as i64 - start - 1_000);
    deliver(
        &world,
        &executor,
        (&mut shards.0, &mut shards.1),
        &late("late"),
    )
    .await;
    let out = world.outputs(ENRICHED.name);
    let last: Value = serde_json::from_str(&out.last().unwrap().body).unwrap();
    assert_eq!(last["eventID"], "late");
    assert_eq!(last["enrichment"]["status"], "resolved");
    assert_eq!(last["enrichment"]["originalActor"]["userName"], "alice");
    // Past the lateness the identity is gone, and so, once the table's TTL acts, is every item
    // of both keys: none outlives what a record could still need.
    world.clock.advance(2_000);
    deliver(
        &world,
        &executor,
        (&mut shards.0, &mut shards.1),
        &late("later"),
    )
    .await;
    assert_eq!(
        world.outputs(ENRICHED.name).len(),
        out.len(),
        "a record of expired credentials that comes later than the lateness waits"
    );
    world
        .clock
        .advance(config_ttl(&EnricherConfig::default()) + lateness.as_millis() as i64);
    executor.fire_timers(None).await.unwrap();
    world.clock.advance(lateness.as_millis() as i64 + 1_000);
    world.table.expire(world.clock.now_millis() / 1000 + 1);
    let items = world.table.items();
    let of_keys: Vec<_> = items
        .iter()
        .filter(|i| format!("{i:?}").contains("ASIA1") || format!("{i:?}").contains("AKIAALICE"))
        .collect();
    assert!(of_keys.is_empty(), "{of_keys:#?}");
    // The operator's own: its timer sweep's cursor (and its signature history, not counted).
    assert_eq!(world.state_items(), 1, "{items:#?}");
}

/// The buffer TTL of `config`, in milliseconds.
fn config_ttl(config: &EnricherConfig) -> i64 {
    config.buffer_ttl.as_millis() as i64
}

#[tokio::test]
async fn a_role_chain_deeper_than_the_limit_goes_out_at_once_saying_the_limit_was_reached() {
    // Alice, then role-1 to role-4 each assuming the next, an action with every key; at most two
    // roles are followed.
    let mut records = vec![record(
        "0-alice-assumes-role-1",
        alice(),
        "AssumeRole",
        Some(("role-1", "ASIA1")),
    )];
    for level in 1..=4 {
        let (key, role) = (format!("ASIA{level}"), format!("role-{level}"));
        records.push(record(
            &format!("{level}-action-with-{key}"),
            session(&key, &role),
            "ListBuckets",
            None,
        ));
        if level < 4 {
            let next = (format!("role-{}", level + 1), format!("ASIA{}", level + 1));
            records.push(record(
                &format!("{level}-{role}-assumes-{}", next.0),
                session(&key, &role),
                "AssumeRole",
                Some((next.0.as_str(), next.1.as_str())),
            ));
        }
    }
    let config = EnricherConfig {
        max_chain_depth: 2,
        ..EnricherConfig::default()
    };
    // Every record out at once, none left waiting for a timer.
    let enriched = run_with(config, &records).await;
    assert_eq!(enriched.len(), records.len(), "{enriched:#?}");
    for level in 1..=4 {
        let e = &enriched[&format!("{level}-action-with-ASIA{level}")]["enrichment"];
        assert_eq!(
            e["originalActor"]["userName"], "alice",
            "level {level}: {e}"
        );
        if level <= 2 {
            assert_eq!(e["status"], "resolved", "level {level}: {e}");
            assert_eq!(e["roleChain"].as_array().unwrap().len(), level);
        } else {
            assert_eq!(e["status"], "unresolved", "level {level}: {e}");
            assert_eq!(e["reason"], reason::DEPTH_LIMIT, "level {level}");
            assert_eq!(e["depthLimit"], 2);
            assert_eq!(
                e["roleChain"].as_array().unwrap().len(),
                3,
                "the chain up to the first role past the limit"
            );
        }
    }
}

#[tokio::test]
async fn a_customer_map_changed_while_a_resolution_is_in_flight_still_resolves_the_keys_records() {
    // Alice's AssumeRole is enriched under the old map, which publishes ASIA1's resolution; the
    // enricher is deployed again with the account moved to another customer before the
    // resolution is read back, and then ASIA1 is used.
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let with_map = |customer: &str| EnricherConfig {
        customers: identity_enricher::identity::CustomerMap::from_json(&format!(
            r#"{{"{ACCOUNT}": "{customer}"}}"#
        ))
        .unwrap(),
        ..EnricherConfig::default()
    };
    let before = enricher(&world, with_map("acme"));
    let after = enricher(&world, with_map("acme-holdings"));
    let records = article();
    let mut events = Shard::new("cloudtrail", 0);
    let assume = events.batch(&[("acme#AKIAALICE", serde_json::to_vec(&records[0]).unwrap())]);
    before.run(decode_event(&assume.to_string()).unwrap()).await;
    let resolution = world.outputs(RESOLUTIONS.name)[0].body.clone();
    let mut feedback = Shard::new("feedback", 0);
    let batch = feedback.batch(&[("acme#ASIA1", resolution.into_bytes())]);
    let report = after.run(decode_event(&batch.to_string()).unwrap()).await;
    assert_eq!((report.failed_from, report.dead_lettered), (None, 0));
    let action = events.batch(&[(
        "acme-holdings#ASIA1",
        serde_json::to_vec(&records[1]).unwrap(),
    )]);
    after.run(decode_event(&action.to_string()).unwrap()).await;
    let enriched: Vec<Value> = world
        .outputs(ENRICHED.name)
        .iter()
        .map(|m| serde_json::from_str(&m.body).unwrap())
        .collect();
    let action = enriched
        .iter()
        .find(|e| e["eventID"] == "2-action-with-asia1")
        .expect("the action with ASIA1 went out at once");
    assert_eq!(action["enrichment"]["status"], "resolved", "{action}");
}

/// A head's `doc` text: its stored text, inflated with `dictionaries`.
fn head_doc(item: &keyway::domain::Item, dictionaries: &[keyway::domain::Dictionary]) -> String {
    keyway::adapters::dynamodb::stored_text::read(item, "doc", "{}", "doc", dictionaries)
        .expect("the head reads")
        .into_owned()
}

#[tokio::test]
async fn a_key_waiting_with_a_few_records_is_deflated_with_the_enrichers_dictionary_into_fewer_bytes(
) {
    use identity_enricher::enricher::STATE_DICTIONARIES;
    use keyway::adapters::dynamodb::stored_text;
    use keyway::domain::{AttrValue, Dictionary};
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let executor = enricher(&world, EnricherConfig::default());
    let key = format!("{ACCOUNT}#ASIA9");
    let mut events = Shard::new("cloudtrail", 0);
    let records: Vec<(&str, Vec<u8>)> = (0..3)
        .map(|i| {
            let waiting = record(
                &format!("w{i}"),
                session("ASIA9", "role-9"),
                "GetObject",
                None,
            );
            (key.as_str(), serde_json::to_vec(&waiting).unwrap())
        })
        .collect();
    let batch = events.batch(&records);
    let report = executor
        .run(decode_event(&batch.to_string()).unwrap())
        .await;
    assert_eq!((report.failed_from, report.commits), (None, 1));
    let dictionaries: Vec<Dictionary> = STATE_DICTIONARIES
        .iter()
        .map(|t| Dictionary::new(t))
        .collect();
    let head = world
        .table
        .items()
        .into_iter()
        .find(|i| i["sk"].as_s() == Some("head") && i["pk"].as_s().unwrap().ends_with("ASIA9"))
        .expect("the waiting key's head");
    let named = format!("<deflated+{}>", dictionaries[0].id());
    assert_eq!(head["doc"], AttrValue::S(named));
    let doc = head_doc(&head, &dictionaries);
    assert_eq!(doc.matches("\"record\":").count(), 3, "{doc}");
    // The same text deflated alone: the dictionary saves the field names' first spelling.
    let mut alone = keyway::domain::Item::new();
    stored_text::store(&mut alone, "doc", doc.clone(), None);
    let bytes = |item: &keyway::domain::Item| match &item["docz"] {
        AttrValue::B(b) => b.len(),
        other => panic!("deflated: {other:?}"),
    };
    assert!(
        bytes(&head) * 10 < bytes(&alone) * 8,
        "{} bytes with the dictionary, {} alone",
        bytes(&head),
        bytes(&alone)
    );
}

/// Items name the dictionary they were deflated with by a hash of its text: an edited sample
/// would leave every key written with it unreadable.
#[test]
fn the_enrichers_state_dictionary_is_never_edited() {
    let ids: Vec<String> = identity_enricher::enricher::STATE_DICTIONARIES
        .iter()
        .map(|t| keyway::domain::Dictionary::new(t).id().to_owned())
        .collect();
    assert_eq!(
        ids,
        ["719ffb8f"],
        "add a new dictionary in front; never edit one"
    );
}

/// Records ten times the usual size (a policy document of 15 KB in each), waiting for their
/// key's identity: the key's state crosses the head's inline limit and the dictionary's window,
/// and every record still comes out once, resolved, as it came in.
#[tokio::test]
async fn records_ten_times_the_usual_size_wait_and_all_come_out_resolved_as_they_came_in() {
    let policy = |i: usize| -> String {
        // Text that deflates as documents do, not as one repeated byte.
        (0..470)
            .map(|n| keyway::domain::hash::xxh3_128_hex(&[format!("{i}/{n}").as_bytes()]))
            .collect()
    };
    let big: Vec<Value> = (0..3)
        .map(|i| {
            let mut waiting = record(&format!("big-{i}"), session("ASIA1", "role-1"), "Put", None);
            waiting["requestParameters"] = serde_json::json!({ "policy": policy(i) });
            waiting
        })
        .collect();
    let mut records = big.clone();
    records.push(record(
        "assume",
        alice(),
        "AssumeRole",
        Some(("role-1", "ASIA1")),
    ));
    let enriched = run(&records).await;
    assert_eq!(enriched.len(), 4, "{:?}", enriched.keys());
    for (i, sent) in big.iter().enumerate() {
        let out = &enriched[&format!("big-{i}")];
        assert_eq!(out["enrichment"]["status"], "resolved", "big-{i}");
        assert_eq!(
            out["requestParameters"], sent["requestParameters"],
            "big-{i}"
        );
    }
}

/// A record that fits its key's buffer but, enriched, would not fit the enriched sink (a policy
/// document near DynamoDB's item limit, or one of 300 KB whose quotes, escaped again where the
/// released record is stored, double it). Released with the others after the buffer TTL, it
/// would fail their release each time, and with it every record waiting beside it, until the
/// key's items aged out with them. It is refused when it comes, while its stream still holds it,
/// and the record waiting beside it goes out.
#[tokio::test]
async fn a_record_too_large_to_go_out_after_waiting_is_dead_lettered_at_once_and_holds_back_none_waiting(
) {
    // A few hundred bytes below the most a state entry holds: it fits the buffer.
    let near_the_limit = policy_of("ASIA9", 400);
    let mut quoted = near_the_limit.clone();
    quoted["requestParameters"]["policy"] = "\"".repeat(150_000).into();
    for big in [near_the_limit, quoted] {
        refused_when_it_comes(&big).await;
    }
}

/// A PutBucketPolicy record `big` of a session of `key`, its policy document as long as makes
/// the record `below` bytes less than the most a state entry holds.
fn policy_of(key: &str, below: usize) -> Value {
    use keyway::ports::StateStore;
    let mut big = record("big", session(key, "short"), "PutBucketPolicy", None);
    big["requestParameters"] = serde_json::json!({ "policy": "" });
    let room = World::new(&[]).store.limits().max_entry_bytes - below;
    let size = serde_json::to_vec(&big).unwrap().len();
    big["requestParameters"]["policy"] = "p".repeat(room - size).into();
    big
}

/// Sends a record that waits, then `big` (event id `big`) of the same key: `big` is refused,
/// and the other goes out after the buffer TTL.
async fn refused_when_it_comes(big: &Value) {
    let (world, executor, ttl, mut events, key) = asia9();
    let waiting = record("waiting", session("ASIA9", "role-9"), "ListBuckets", None);
    for (id, sent) in [("waiting", &waiting), ("big", big)] {
        let batch = events.batch(&[(key.as_str(), serde_json::to_vec(sent).unwrap())]);
        let report = executor
            .run(decode_event(&batch.to_string()).unwrap())
            .await;
        let refused = usize::from(id == "big");
        assert_eq!(
            (report.failed_from, report.dead_lettered),
            (None, refused),
            "{id}"
        );
    }
    let letters = world.dead_letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].field, "record");
    assert!(
        letters[0].problem.contains("too large to wait"),
        "{}",
        letters[0].problem
    );
    world.clock.advance(ttl);
    let sweep = executor.fire_timers(None).await.unwrap();
    assert_eq!((sweep.fired, sweep.dead_lettered), (1, 0));
    let out = world.outputs(ENRICHED.name);
    assert_eq!(out.len(), 1, "the record that waited went out");
    let enriched: Value = serde_json::from_str(&out[0].body).unwrap();
    assert_eq!(enriched["eventID"], "waiting");
    assert_eq!(enriched["enrichment"]["reason"], reason::BUFFER_TTL);
}

/// A record that waited goes out with its identity if it fits the enriched sink; one that does
/// not (a role chain of long names ahead of it) goes out unresolved, saying why, rather than
/// failing the resolution that releases it and every record waiting beside it.
#[tokio::test]
async fn a_waiting_record_too_large_with_its_role_chain_goes_out_unresolved_saying_why() {
    let long = "r".repeat(5_000);
    let big = policy_of("ASIA2", 2_000);
    let records = [
        big.clone(),
        record("small", session("ASIA2", "short"), "ListBuckets", None),
        record("assume-long", alice(), "AssumeRole", Some((&long, "ASIA1"))),
        record(
            "assume-short",
            session("ASIA1", &long),
            "AssumeRole",
            Some(("short", "ASIA2")),
        ),
    ];
    let enriched = run(&records).await;
    let out = &enriched["big"];
    assert_eq!(out["enrichment"]["status"], "unresolved");
    assert_eq!(out["enrichment"]["reason"], reason::TOO_LARGE);
    assert_eq!(out["requestParameters"], big["requestParameters"]);
    let small = &enriched["small"]["enrichment"];
    assert_eq!(small["status"], "resolved", "the record beside it resolves");
    assert_eq!(small["roleChain"].as_array().map(Vec::len), Some(2));
}

/// A second record claiming to have issued a key already resolved, naming another caller (a
/// forged record in a customer's trail): the key's records stay with the identity the first
/// gave, and the second resolution is dead-lettered saying why.
#[tokio::test]
async fn a_second_resolution_of_a_key_naming_another_identity_is_refused_and_the_first_stands() {
    let mallory =
        identity_enricher::traffic::iam_user(ACCOUNT, "mallory", "AIDAMALLORY", "AKIAMALLORY");
    let records = [
        record(
            "alice-assumes",
            alice(),
            "AssumeRole",
            Some(("role-1", "ASIA1")),
        ),
        record("before", session("ASIA1", "role-1"), "ListBuckets", None),
        record("forged", mallory, "AssumeRole", Some(("role-1", "ASIA1"))),
        record("after", session("ASIA1", "role-1"), "ListBuckets", None),
    ];
    let (enriched, letters) = run_through(EnricherConfig::default(), &records).await;
    for id in ["before", "after"] {
        let actor = &enriched[id]["enrichment"]["originalActor"]["arn"];
        assert_eq!(actor, &alice()["arn"], "{id}");
    }
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].field, "accessKeyId");
    assert!(
        letters[0].problem.contains("resolved already"),
        "{}",
        letters[0].problem
    );
}

/// An issuing record whose expiration is a number past any time (the largest 64-bit integer):
/// dead-lettered naming the field, where adding the grace to it overflowed.
#[tokio::test]
async fn an_expiration_past_any_time_is_dead_lettered_naming_the_field() {
    let mut assume = record("assume", alice(), "AssumeRole", Some(("role-1", "ASIA1")));
    assume["responseElements"]["credentials"]["expiration"] = i64::MAX.into();
    let records = [
        assume,
        record("action", session("ASIA1", "role-1"), "ListBuckets", None),
    ];
    let (enriched, letters) = run_through(EnricherConfig::default(), &records).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].field, "responseElements.credentials.expiration");
    assert!(
        !enriched.contains_key("assume"),
        "the issuing record is the dead letter"
    );
}

/// A record without an event time is judged by its arrival in the stream, not by the clock: a
/// retry of it, past its key's identity's expiration, answers it as the first attempt did (which
/// sent it resolved, before its commit failed), not as a record that waits and goes out
/// unresolved under the same id.
#[tokio::test]
async fn a_record_without_an_event_time_is_judged_by_its_arrival_whenever_it_is_retried() {
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let executor = enricher(&world, EnricherConfig::default());
    let mut events = Shard::new("cloudtrail", 0);
    let mut feedback = Shard::new("feedback", 0);
    let mut assume = record("assume", alice(), "AssumeRole", Some(("role-1", "ASIA1")));
    assume["responseElements"]["credentials"]["expiration"] = "2026-01-01T01:00:00Z".into();
    let batch = events.batch(&[("alice", serde_json::to_vec(&assume).unwrap())]);
    executor
        .run(decode_event(&batch.to_string()).unwrap())
        .await;
    let resolution = world.outputs(RESOLUTIONS.name)[0].body.clone();
    let batch = feedback.batch(&[(&format!("{ACCOUNT}#ASIA1"), resolution.into_bytes())]);
    executor
        .run(decode_event(&batch.to_string()).unwrap())
        .await;
    let mut action = record("action", session("ASIA1", "role-1"), "ListBuckets", None);
    action.as_object_mut().unwrap().remove("eventTime");
    // It arrived while the credentials held, and is run two hours later (a retry).
    let batch = events.batch(&[(
        &format!("{ACCOUNT}#ASIA1"),
        serde_json::to_vec(&action).unwrap(),
    )]);
    world.clock.advance(2 * 3600 * 1000);
    let report = executor
        .run(decode_event(&batch.to_string()).unwrap())
        .await;
    assert_eq!((report.failed_from, report.dead_lettered), (None, 0));
    let enriched: Vec<Value> = world
        .outputs(ENRICHED.name)
        .iter()
        .map(|m| serde_json::from_str(&m.body).unwrap())
        .filter(|e: &Value| e["eventID"] == "action")
        .collect();
    assert_eq!(enriched.len(), 1, "it went out at once");
    assert_eq!(enriched[0]["enrichment"]["status"], "resolved");
}

/// As for a resolved record, one whose key was issued past the depth limit (its enrichment cut,
/// but carrying the chain up to the first role beyond it) goes out unresolved saying it is too
/// large, when the chain's long names push it over, rather than failing the resolution.
#[tokio::test]
async fn a_waiting_record_too_large_with_its_chain_cut_at_the_depth_limit_goes_out_saying_why() {
    let long = "r".repeat(5_000);
    let big = policy_of("ASIA2", 2_000);
    let records = [
        big.clone(),
        record("assume-1", alice(), "AssumeRole", Some(("role-1", "ASIA1"))),
        record(
            "assume-long",
            session("ASIA1", "role-1"),
            "AssumeRole",
            Some((&long, "ASIA2")),
        ),
    ];
    let config = EnricherConfig {
        max_chain_depth: 1,
        ..EnricherConfig::default()
    };
    let (enriched, letters) = run_through(config, &records).await;
    assert!(letters.is_empty(), "{letters:?}");
    let out = &enriched["big"];
    assert_eq!(out["enrichment"]["reason"], reason::TOO_LARGE);
    assert_eq!(out["requestParameters"], big["requestParameters"]);
}

/// A key whose buffer's timer no sweep will find (a firing dead-lettered by a build that left
/// the timer pending and forgot its index entry): its next waiting record sets a new one, and
/// both records go out after the buffer TTL.
#[tokio::test]
async fn a_key_whose_buffer_timer_no_sweep_finds_gets_a_new_one_with_its_next_waiting_record() {
    use keyway::ports::StateStore;
    let (world, executor, ttl, mut events, key) = asia9();
    let send = |events: &mut Shard, id: &str| {
        let waiting = record(id, session("ASIA9", "role-9"), "ListBuckets", None);
        events.batch(&[(key.as_str(), serde_json::to_vec(&waiting).unwrap())])
    };
    let first = send(&mut events, "first");
    executor
        .run(decode_event(&first.to_string()).unwrap())
        .await;
    world.clock.advance(ttl + 20 * 60 * 1000);
    let index = world.store.timers();
    let operator = executor.namespace().operator.clone();
    let due = index
        .due_timers(&operator, world.clock.now_millis(), 10)
        .await
        .unwrap();
    assert_eq!(due.len(), 1);
    index.forget_timers(&operator, &due).await.unwrap();
    let second = send(&mut events, "second");
    executor
        .run(decode_event(&second.to_string()).unwrap())
        .await;
    world.clock.advance(ttl);
    executor.fire_timers(None).await.unwrap();
    let mut out: Vec<String> = world
        .outputs(ENRICHED.name)
        .iter()
        .map(|m| serde_json::from_str::<Value>(&m.body).unwrap()["eventID"].to_string())
        .collect();
    out.sort();
    assert_eq!(out, ["\"first\"", "\"second\""]);
}
