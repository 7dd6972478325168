//! The runtime's guarantees (DESIGN §3), each proved by its own test on the in-memory adapters.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use futures::FutureExt as _;
use keyed_counter::{CountUpdate, KeyedCounter, COUNTS};
use keyway::domain::SequenceNumber;
use keyway::sources::kinesis::decode_event;
use keyway_local::services::faults::Crash;
use keyway_local::CrashBeforeCommit;
use keyway_tests::harness::{count, redelivery, run_to_completion, stored_count, Shard, World};
use keyway_tests::operators::{BarrierStore, Poisoned, Resolved, Waker};
use serde_json::Value;
use std::panic::AssertUnwindSafe;

fn sequence_at(event: &Value, index: usize) -> SequenceNumber {
    SequenceNumber::parse(
        event["Records"][index]["kinesis"]["sequenceNumber"]
            .as_str()
            .unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn a_replayed_batch_applies_nothing_twice() {
    let world = World::new(&[COUNTS.name]);
    let executor = world.executor(KeyedCounter);
    let mut shard = Shard::new("counts-in", 0);
    let event = shard.batch(&[
        count("a", 1),
        count("b", 2),
        count("a", 3),
        count("c", 4),
        count("b", 5),
    ]);

    let first = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!((first.applied, first.failed_from.clone()), (5, None));
    // Lambda delivers the same batch again (a timeout after the commit, a duplicate delivery).
    let second = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!(second.applied, 0, "nothing is applied twice");
    assert_eq!(second.replayed, 5);
    assert_eq!(second.failed_from, None);

    assert_eq!(stored_count(&world, &executor, "a").await, Some(4));
    assert_eq!(stored_count(&world, &executor, "b").await, Some(7));
    assert_eq!(stored_count(&world, &executor, "c").await, Some(4));
    assert_eq!(
        world.outputs(COUNTS.name).len(),
        5,
        "a replayed record emits nothing again"
    );
}

#[tokio::test]
async fn a_poison_record_stops_only_its_own_key_and_is_reported_at_the_lowest_unapplied_sequence_number(
) {
    let world = World::new(&[COUNTS.name]);
    let operator = Poisoned::new(KeyedCounter);
    let poisoned = operator.poisoned.clone();
    let executor = world.executor(operator);
    let mut shard = Shard::new("counts-in", 0);
    let event = shard.batch(&[
        count("a", 1),
        count("b", 10),
        count("a", 2), // poisoned
        count("b", 20),
        count("a", 4), // waits behind the poisoned record of its key
        count("c", 100),
    ]);
    let poison = sequence_at(&event, 2);
    poisoned.lock().unwrap().insert(poison.to_string());

    let report = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!(
        report.failed_from,
        Some(poison.clone()),
        "reported at the poisoned record"
    );
    assert_eq!(
        stored_count(&world, &executor, "a").await,
        Some(1),
        "key a stops before the poison"
    );
    assert_eq!(
        stored_count(&world, &executor, "b").await,
        Some(30),
        "other keys go on past it"
    );
    assert_eq!(stored_count(&world, &executor, "c").await, Some(100));

    // Lambda redelivers from the reported record; while it stays poisoned nothing moves.
    let again = executor
        .run(decode_event(&redelivery(&event, &poison).to_string()).unwrap())
        .await;
    assert_eq!(again.failed_from, Some(poison.clone()));
    assert_eq!(again.applied, 0);
    assert_eq!(
        again.replayed, 2,
        "b's and c's later records are skipped by their watermarks"
    );

    // Once the dependency is back, the key catches up, in order, exactly once.
    poisoned.lock().unwrap().clear();
    let healed = executor
        .run(decode_event(&redelivery(&event, &poison).to_string()).unwrap())
        .await;
    assert_eq!(healed.failed_from, None);
    assert_eq!(stored_count(&world, &executor, "a").await, Some(7));
    assert_eq!(stored_count(&world, &executor, "b").await, Some(30));
    let a_counts: Vec<u64> = world
        .outputs(COUNTS.name)
        .iter()
        .map(|m| serde_json::from_str::<CountUpdate>(&m.body).unwrap())
        .filter(|u| u.key == "a")
        .map(|u| u.count)
        .collect();
    assert_eq!(
        a_counts,
        [1, 3, 7],
        "key a's outputs keep their order across the failure"
    );
}

#[tokio::test]
async fn two_concurrent_invocations_on_one_key_lose_no_update() {
    let world = World::new(&[COUNTS.name]);
    // Both invocations read the key before either commits.
    let racing = Arc::new(BarrierStore::new(world.store.clone(), 2));
    let left = world.executor_on(KeyedCounter, racing.clone());
    let right = world.executor_on(KeyedCounter, racing.clone());
    let (mut from_left, mut from_right) =
        (Shard::new("clicks-web", 0), Shard::new("clicks-app", 0));
    let left_event = from_left.batch(&[count("page", 1), count("page", 2)]);
    let right_event = from_right.batch(&[count("page", 10)]);

    let (l, r) = tokio::join!(
        left.run(decode_event(&left_event.to_string()).unwrap()),
        right.run(decode_event(&right_event.to_string()).unwrap())
    );
    assert_eq!(
        racing.versions_read("page"),
        [0, 0],
        "both invocations read the key before either committed"
    );
    assert_eq!(
        l.conflicts + r.conflicts,
        1,
        "exactly one of the two commits loses the race"
    );
    let loser = if l.conflicts == 1 {
        (&left, &left_event, l)
    } else {
        (&right, &right_event, r)
    };
    assert!(
        loser.2.failed_from.is_some(),
        "the losing invocation reports its records as not applied"
    );

    // Lambda redelivers the loser's batch; it reads the winner's commit and adds to it.
    let plain = world.executor(KeyedCounter);
    let reports = run_to_completion(
        &plain,
        &redelivery(loser.1, loser.2.failed_from.as_ref().unwrap()),
        3,
    )
    .await;
    assert_eq!(reports.last().unwrap().failed_from, None);
    assert_eq!(
        stored_count(&world, &plain, "page").await,
        Some(13),
        "no update is lost"
    );
}

#[tokio::test]
async fn two_concurrent_invocations_on_one_key_lose_no_wake_up() {
    let world = World::new(&["resolved"]);
    let racing = Arc::new(BarrierStore::new(world.store.clone(), 2));
    let events_side = world.executor_on(Waker, racing.clone());
    let resolutions_side = world.executor_on(Waker, racing.clone());
    let mut events = Shard::new("events", 0);
    let mut resolutions = Shard::new("resolutions", 0);
    let event_batch = events.batch(&[("k", br#"{"key":"k","event":"e1"}"#.to_vec())]);
    let resolution_batch = resolutions.batch(&[("k", br#"{"key":"k","actor":"alice"}"#.to_vec())]);

    // The event is buffered from a snapshot without the resolution; the resolution is stored from
    // a snapshot without the event. One of them must notice the other: the loser of the commit
    // race runs again on the winner's state, within its invocation (outbox delivery: nothing it
    // computed from the stale snapshot went out).
    let (a, b) = tokio::join!(
        events_side.run(decode_event(&event_batch.to_string()).unwrap()),
        resolutions_side.run(decode_event(&resolution_batch.to_string()).unwrap())
    );
    assert_eq!(
        racing.versions_read("k"),
        [0, 0],
        "both invocations read the key before either committed"
    );
    assert_eq!(a.conflicts + b.conflicts, 1, "{a:?} {b:?}");
    assert_eq!(
        (a.failed_from, b.failed_from),
        (None, None),
        "the loser committed on the winner's state"
    );
    let resolved: Vec<Resolved> = world
        .outputs("resolved")
        .iter()
        .map(|m| serde_json::from_str(&m.body).unwrap())
        .collect();
    assert_eq!(
        resolved,
        [Resolved {
            event: "e1".into(),
            actor: "alice".into()
        }],
        "the buffered event is woken up once"
    );
    let loaded = keyway::ports::StateStore::load(
        world.store.as_ref(),
        events_side.namespace(),
        &["k".into()],
    )
    .await
    .unwrap();
    assert!(
        !loaded["k"].slots.contains_key("pending"),
        "nothing stays buffered"
    );
}

#[tokio::test]
async fn a_record_that_cannot_be_decoded_reaches_the_dead_letter_sink_with_reason_and_payload_and_does_not_fail_the_batch(
) {
    let world = World::new(&[COUNTS.name]);
    let executor = world.executor(KeyedCounter);
    let mut shard = Shard::new("counts-in", 0);
    let mut event = shard.batch(&[
        count("a", 1),
        ("a", b"not json".to_vec()),
        count("a", 2),
        ("b", br#"{"key":"b","amount":-3}"#.to_vec()),
    ]);
    // And one the source itself rejects: its data is not base64.
    let mut broken = event["Records"][0].clone();
    broken["kinesis"]["data"] = Value::String("***".into());
    broken["kinesis"]["sequenceNumber"] = Value::String(format!("4959{:052}", 999_999));
    event["Records"].as_array_mut().unwrap().push(broken);

    let report = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!(report.failed_from, None, "bad input never fails the batch");
    assert_eq!(report.dead_lettered, 3);
    assert_eq!(
        stored_count(&world, &executor, "a").await,
        Some(3),
        "the good records around it are applied"
    );

    let letters = world.dead_letters();
    let by_field: BTreeMap<&str, _> = letters.iter().map(|l| (l.field.as_str(), l)).collect();
    assert_eq!(by_field.len(), 2, "{letters:?}");
    let data = letters
        .iter()
        .filter(|l| l.field == "data")
        .collect::<Vec<_>>();
    assert_eq!(data.len(), 2);
    assert!(
        data.iter()
            .any(|l| l.payload.contains(&base64_of(b"not json"))),
        "the raw record travels with it"
    );
    assert!(
        data.iter()
            .any(|l| l.problem.contains("invalid value: integer `-3`")),
        "{data:?}"
    );
    let source = by_field["kinesis.data"];
    assert!(source.problem.contains("base64"), "{}", source.problem);
    assert!(source.payload.contains("***"));
    assert_eq!(
        source.sequence_number.as_deref(),
        Some(format!("4959{:052}", 999_999).as_str())
    );
    assert!(letters
        .iter()
        .all(|l| l.operator == "keyed-counter" && l.origin.is_some()));
}

/// The dead letter holds the record's JSON, where data is base64.
fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test]
async fn a_crash_between_emit_and_commit_duplicates_outputs_with_the_same_ids_and_never_loses_one()
{
    let world = World::new(&[COUNTS.name]);
    let mut shard = Shard::new("counts-in", 0);
    let event = shard.batch(&[count("a", 1), count("b", 1), count("a", 1), count("c", 1)]);

    // The function has run before (its signature history is written)...
    world.executor(KeyedCounter).run(Vec::new()).await;
    // ...when an invocation emits, then dies before its commit finishes.
    let crashing = world.executor_on(
        KeyedCounter,
        Arc::new(CrashBeforeCommit::always(world.store.clone())),
    );
    let crashed = AssertUnwindSafe(crashing.run(decode_event(&event.to_string()).unwrap()))
        .catch_unwind()
        .await;
    assert!(
        crashed.is_err_and(|payload| payload.is::<Crash>()),
        "the invocation crashed"
    );
    let after_crash: Vec<_> = world.outputs(COUNTS.name);
    assert_eq!(after_crash.len(), 4, "outputs left before the crash");

    // Lambda retries the whole batch.
    let executor = world.executor(KeyedCounter);
    let retry = executor
        .run(decode_event(&event.to_string()).unwrap())
        .await;
    assert_eq!(retry.failed_from, None);
    let all = world.outputs(COUNTS.name);
    assert_eq!(all.len(), 8, "the retry sends every output again");
    let mut bodies_by_id: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
    for m in &all {
        bodies_by_id
            .entry(m.output_id.as_deref().expect("outputs carry their id"))
            .or_default()
            .insert(m.body.as_str());
    }
    assert_eq!(
        bodies_by_id.len(),
        4,
        "each output has one id, in both attempts"
    );
    assert!(
        bodies_by_id.values().all(|b| b.len() == 1),
        "a duplicate carries the same id and body"
    );
    assert_eq!(stored_count(&world, &executor, "a").await, Some(2));

    // The ids are the ones derived from each record, so any consumer can compute them.
    let expected: HashSet<String> = decode_event(&event.to_string())
        .unwrap()
        .iter()
        .map(|r| {
            let r = r.as_ref().unwrap();
            keyway::domain::OutputId::derive(
                "keyed-counter",
                COUNTS.name,
                &r.origin,
                &r.sequence,
                0,
            )
            .to_string()
        })
        .collect();
    assert_eq!(
        bodies_by_id
            .keys()
            .map(|k| k.to_string())
            .collect::<HashSet<_>>(),
        expected
    );
}
