//! A redeploy with a changed state structure on the embedded runtime's services: without a
//! migration the operator neither crashes nor reads old state, and counts the keys it resets;
//! with one, every key's state is carried over, watermarks included, and written once.

use keyed_counter::{CountEvent, KeyedCounter, COUNTS};
use keyway::domain::{KeyState, Origin, Output, OutputId, SequenceNumber, SourceRecord};
use keyway::operator::{
    state_signature, MigrateFn, Migration, MigrationError, NewState, OldState, StateDescriptor,
};
use keyway::ports::{Clock, Commit, Namespace, StateStore};
use keyway::sources::kinesis::decode_event;
use keyway::ExecutorConfig;
use keyway::{Ctx, InvalidInput, KeyedOperator, ProcessError, ValueState};
use keyway_tests::harness::{count, Shard, World};
use serde::{Deserialize, Serialize};

/// The keyed counter's state as the lock file records it before the change.
const V1_SIGNATURE: &str = "32b0588cf5747cbc";

/// The counter's next version: the same operator, a richer state under the same name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Tally {
    total: u64,
    events: u64,
}

const TALLY: ValueState<Tally> = ValueState::new("count");

/// The counter's state as version 1 declared it: what a migration from it reads.
const V1_COUNT: ValueState<u64> = ValueState::new("count");

struct CounterV2 {
    /// The migration from version 1 it registers, if any.
    migrate: Option<MigrateFn>,
}

fn from_v1(old: &OldState<'_>) -> Result<NewState, MigrationError> {
    let count = old.value(&V1_COUNT)?.unwrap_or(0);
    NewState::new().value(
        &TALLY,
        Tally {
            total: count,
            events: 0,
        },
    )
}

impl KeyedOperator for CounterV2 {
    type Input = CountEvent;

    fn name(&self) -> &str {
        "keyed-counter"
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![TALLY.descriptor()]
    }

    /// Emits nothing itself, but still delivers what version 1 left in its outboxes.
    fn sinks(&self) -> Vec<keyway::operator::SinkDescriptor> {
        vec![COUNTS.descriptor()]
    }

    fn decode(&self, record: &SourceRecord) -> Result<CountEvent, InvalidInput> {
        KeyedCounter.decode(record)
    }

    fn key(&self, input: &CountEvent) -> String {
        input.key.clone()
    }

    fn process(&self, ctx: &mut Ctx<'_>, input: CountEvent) -> Result<(), ProcessError> {
        let mut tally = ctx.value(&TALLY)?;
        let t = tally.get_or_insert_with(|| Tally {
            total: 0,
            events: 0,
        });
        t.total += input.amount;
        t.events += 1;
        Ok(())
    }

    fn migrations(&self) -> Vec<Migration> {
        self.migrate
            .map(|migrate| Migration::from_states(&[V1_COUNT.descriptor()], migrate))
            .into_iter()
            .collect()
    }
}

async fn tally(world: &World, key: &str) -> Option<Tally> {
    let executor = world.executor(CounterV2 { migrate: None });
    let loaded = keyway::ports::StateStore::load(
        world.store.as_ref(),
        executor.namespace(),
        &[key.to_owned()],
    )
    .await
    .unwrap();
    loaded[key]
        .slots
        .get("count")
        .and_then(|s| s.entries.first())
        .map(|e| serde_json::from_str(e.get()).unwrap())
}

/// Writes `key` under version 1's signature as a key whose state was cleared: a version, a
/// watermark, no slots.
async fn commit_watermarks_only(world: &World, key: &str) {
    let mut state = KeyState::default();
    state.watermarks.advance(
        &Origin("clicks/shardId-000000000009".into()),
        &SequenceNumber::parse("7").unwrap(),
        world.clock.now_millis(),
    );
    commit_under_v1(world, key, state).await;
}

/// Writes `key` with `state` as version 1 left it.
async fn commit_under_v1(world: &World, key: &str, state: KeyState) {
    let namespace = Namespace::new("keyed-counter", V1_SIGNATURE);
    let committed = world
        .store
        .commit(&namespace, vec![Commit::new(key, 0, state)])
        .await;
    assert!(committed[0].is_ok());
}

/// Version 1 counts a: 3, b: 2.
async fn deploy_v1(world: &World, shard: &mut Shard) -> serde_json::Value {
    assert_eq!(
        state_signature(&KeyedCounter.states()),
        V1_SIGNATURE,
        "the lock file's signature of version 1"
    );
    assert_eq!(
        Migration::from_states(&[V1_COUNT.descriptor()], from_v1).from,
        V1_SIGNATURE,
        "a migration from version 1's descriptors names version 1's signature"
    );
    let v1 = world.executor(KeyedCounter);
    let event = shard.batch(&[count("a", 1), count("b", 2), count("a", 2)]);
    assert_eq!(
        v1.run(decode_event(&event.to_string()).unwrap())
            .await
            .failed_from,
        None
    );
    event
}

#[tokio::test]
async fn a_redeploy_with_a_changed_state_type_neither_crashes_nor_reads_old_state() {
    let world = World::new(&[COUNTS.name]);
    let mut shard = Shard::new("clicks", 0);
    deploy_v1(&world, &mut shard).await;

    // Version 1 also had a key whose state was cleared: only its watermarks were left.
    commit_watermarks_only(&world, "e").await;

    let v2 = world.executor(CounterV2 { migrate: None });
    assert_ne!(v2.namespace().signature, V1_SIGNATURE);
    let batch = [count("a", 10), count("b", 10), count("d", 1), count("e", 1)];
    let report = v2
        .run(decode_event(&shard.batch(&batch).to_string()).unwrap())
        .await;
    assert_eq!(report.failed_from, None, "no crash, no failure");
    assert_eq!(
        (report.reset, report.migrated),
        (2, 0),
        "a and b left their old state behind; d is new, and e had nothing to leave"
    );
    assert_eq!(
        tally(&world, "a").await,
        Some(Tally {
            total: 10,
            events: 1
        }),
        "the old count is never read as a tally"
    );
    assert_eq!(
        tally(&world, "d").await,
        Some(Tally {
            total: 1,
            events: 1
        })
    );

    // The next invocation finds the keys under the new signature: nothing more to count.
    let again = v2
        .run(decode_event(&shard.batch(&[count("a", 1)]).to_string()).unwrap())
        .await;
    assert_eq!((again.reset, again.migrated), (0, 0));
}

#[tokio::test]
async fn a_registered_migration_carries_every_keys_state_over_once_with_its_watermarks() {
    let world = World::new(&[COUNTS.name]);
    let mut shard = Shard::new("clicks", 0);
    let v1_batch = deploy_v1(&world, &mut shard).await;

    let v2 = world.executor(CounterV2 {
        migrate: Some(from_v1),
    });
    // Lambda redelivers version 1's last batch to version 2 (say the deployment cut in):
    // the migrated watermarks skip it, and the migrated state is written even though nothing
    // else changed.
    let replay = v2.run(decode_event(&v1_batch.to_string()).unwrap()).await;
    assert_eq!(
        (replay.migrated, replay.replayed, replay.applied),
        (2, 3, 0)
    );
    assert_eq!(
        tally(&world, "a").await,
        Some(Tally {
            total: 3,
            events: 0
        })
    );
    assert_eq!(
        tally(&world, "b").await,
        Some(Tally {
            total: 2,
            events: 0
        })
    );

    let report = v2
        .run(
            decode_event(
                &shard
                    .batch(&[count("a", 10), count("b", 10), count("d", 1)])
                    .to_string(),
            )
            .unwrap(),
        )
        .await;
    assert_eq!(
        (report.migrated, report.reset),
        (0, 0),
        "each key is migrated once"
    );
    assert_eq!(
        tally(&world, "a").await,
        Some(Tally {
            total: 13,
            events: 1
        })
    );
    assert_eq!(
        tally(&world, "b").await,
        Some(Tally {
            total: 12,
            events: 1
        })
    );
    assert_eq!(
        tally(&world, "d").await,
        Some(Tally {
            total: 1,
            events: 1
        })
    );
}

#[tokio::test]
async fn keys_left_behind_by_a_change_older_than_the_look_back_are_not_counted_as_reset() {
    let world = World::new(&[COUNTS.name]);
    let mut shard = Shard::new("clicks", 0);
    deploy_v1(&world, &mut shard).await;
    let config = ExecutorConfig {
        look_back: std::time::Duration::from_secs(60),
        ..ExecutorConfig::default()
    };
    // Version 2 takes over with a key of its own, and runs on past the look-back.
    let v2 = world
        .executor(CounterV2 { migrate: None })
        .with_config(config.clone());
    let first = v2
        .run(decode_event(&shard.batch(&[count("d", 1)]).to_string()).unwrap())
        .await;
    assert_eq!(first.reset, 0);
    world.clock.advance(61_000);
    let later = world
        .executor(CounterV2 { migrate: None })
        .with_config(config);
    let report = later
        .run(decode_event(&shard.batch(&[count("a", 10), count("b", 10)]).to_string()).unwrap())
        .await;
    assert_eq!(
        (report.reset, report.migrated, report.applied),
        (0, 0, 2),
        "a and b are new keys now: the change is too long ago to look for them"
    );
}

#[tokio::test]
async fn a_key_whose_migration_fails_starts_afresh_and_is_counted_as_reset() {
    let world = World::new(&[COUNTS.name]);
    let mut shard = Shard::new("clicks", 0);
    deploy_v1(&world, &mut shard).await;
    let v2 = world.executor(CounterV2 {
        migrate: Some(|_| Err(MigrationError::new("count", "the old count is unreadable"))),
    });
    let report = v2
        .run(decode_event(&shard.batch(&[count("a", 10), count("d", 1)]).to_string()).unwrap())
        .await;
    assert_eq!(
        (
            report.reset,
            report.migrated,
            report.applied,
            report.failed_from
        ),
        (1, 0, 2, None)
    );
    assert_eq!(
        tally(&world, "a").await,
        Some(Tally {
            total: 10,
            events: 1
        })
    );
}

#[tokio::test]
async fn a_migrated_key_keeps_the_outbox_its_old_state_had_not_sent() {
    let world = World::new(&[COUNTS.name]);
    let mut shard = Shard::new("clicks", 0);
    deploy_v1(&world, &mut shard).await;
    // Version 1 left key o with a count and an output still to send.
    let mut state = KeyState::default();
    let stored = serde_json::value::to_raw_value(&4u64).unwrap();
    state.slots.insert(
        "count".into(),
        keyway::domain::SlotData::fresh(vec![stored]),
    );
    state.outbox.push(Output {
        id: OutputId("pending-output".into()),
        sink: COUNTS.name.into(),
        partition_key: "o".into(),
        body: "{\"key\":\"o\",\"count\":4}".into(),
        settled: false,
    });
    commit_under_v1(&world, "o", state).await;

    let v2 = world.executor(CounterV2 {
        migrate: Some(from_v1),
    });
    let report = v2
        .run(decode_event(&shard.batch(&[count("o", 1)]).to_string()).unwrap())
        .await;
    assert_eq!((report.migrated, report.failed_from), (1, None));
    let sent: Vec<Option<String>> = world
        .outputs(COUNTS.name)
        .into_iter()
        .filter(|m| m.body.contains("\"o\""))
        .map(|m| m.output_id)
        .collect();
    assert_eq!(sent, [Some("pending-output".to_owned())]);
    assert_eq!(
        tally(&world, "o").await,
        Some(Tally {
            total: 5,
            events: 1
        })
    );
}

/// A key whose state under the old signature does not parse holds back its own records only:
/// it neither starts afresh (its state would be lost) nor stops the keys beside it.
#[tokio::test]
async fn a_key_whose_old_state_does_not_parse_waits_while_the_others_migrate() {
    let world = World::new(&[COUNTS.name]);
    let mut shard = Shard::new("clicks", 0);
    deploy_v1(&world, &mut shard).await;
    let b_under_v1 = format!("keyed-counter#{V1_SIGNATURE}#b");
    keyway_local::testing::corrupt_head(&world.table, |pk| pk == b_under_v1);

    let v2 = world.executor(CounterV2 {
        migrate: Some(from_v1),
    });
    let batch = shard.batch(&[count("a", 10), count("b", 10), count("d", 1)]);
    let b_first = batch["Records"][1]["kinesis"]["sequenceNumber"]
        .as_str()
        .unwrap()
        .to_owned();
    let report = v2.run(decode_event(&batch.to_string()).unwrap()).await;
    assert_eq!(
        (report.migrated, report.reset, report.applied),
        (1, 0, 2),
        "a migrates, d starts, b waits"
    );
    assert_eq!(
        report.failed_from.map(|s| s.as_str().to_owned()),
        Some(b_first)
    );
    assert_eq!(tally(&world, "b").await, None, "b wrote nothing");
    assert_eq!(
        tally(&world, "a").await,
        Some(Tally {
            total: 13,
            events: 1
        })
    );
}
