//! Resharding during a run: Kinesis SplitShard, MergeShards and UpdateShardCount, DynamoDB
//! Streams' shard splits and rollovers. Lambda reads a parent shard to its end, and finishes
//! with its records, before it reads its children ("Using Lambda with Kinesis Data Streams",
//! polling and batching; Kinesis Data Streams Developer Guide, "Consider data routing, data
//! persistence, and shard state after a reshard"; DynamoDB Developer Guide, "Reading and
//! processing a stream"), so every key's records reach the function in the order they were
//! written, however long its parent's batches keep failing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keyway::domain::{AttrValue, Item};
use keyway::lambda::FunctionError;
use keyway_local::{
    FaultPlan, KeySchema, LocalRuntime, LocalServices, MappingSettings, MappingSource,
    StartingPosition, StreamView,
};
use keyway_tests::scripted::{Scripted, Seen};
use serde_json::json;
use serde_json::Value;

const EPOCH: i64 = 1_767_225_600_000;

/// A function whose first `failing` invocations fail, so that a parent shard still holds
/// records it has not finished with when its children get theirs.
fn failing_first(failing: usize) -> Arc<Scripted> {
    Scripted::taking(Duration::from_millis(50), move |call, _| {
        if call < failing {
            Err(FunctionError::Failed("not yet".into()))
        } else {
            Ok(json!({}))
        }
    })
}

/// Each key's records, in the order the function took them in batches that succeeded.
fn delivered(f: &Scripted, failing: usize) -> BTreeMap<String, Vec<String>> {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for batch in f.batches().into_iter().skip(failing) {
        for Seen { sequence, key } in batch {
            seen.entry(key).or_default().push(sequence);
        }
    }
    seen
}

/// A stream `in` of `shards` shards with `f` mapped to it.
fn kinesis_setup(shards: usize, f: Arc<Scripted>, settings: MappingSettings) -> LocalRuntime {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    services.kinesis.create_stream("in", shards);
    let mut runtime = LocalRuntime::new(services.clone());
    let source = MappingSource::Kinesis {
        kinesis: services.kinesis.clone(),
        stream: "in".into(),
    };
    runtime.add_mapping("f", f, source, settings);
    runtime
}

/// Puts `rounds` records of each of `keys` keys; returns each key's sequence numbers.
fn put_keys(runtime: &LocalRuntime, keys: usize, rounds: usize) -> BTreeMap<String, Vec<String>> {
    let mut written: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for round in 0..rounds {
        for k in 0..keys {
            let key = format!("k{k}");
            let data = format!("{key}-{round}");
            let outcome = runtime
                .services
                .kinesis
                .put_record("in", &key, data.as_bytes())
                .unwrap();
            let keyway::adapters::kinesis::PutOutcome::Written {
                sequence_number, ..
            } = outcome
            else {
                panic!("{outcome:?}")
            };
            written.entry(key).or_default().push(sequence_number);
        }
    }
    written
}

fn merge(
    mut a: BTreeMap<String, Vec<String>>,
    b: BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, Vec<String>> {
    for (key, sequences) in b {
        a.entry(key).or_default().extend(sequences);
    }
    a
}

/// The sequence numbers the failing invocations held: none of them may be a child's.
fn failed_sequences(f: &Scripted, failing: usize) -> Vec<String> {
    f.batches()
        .into_iter()
        .take(failing)
        .flatten()
        .map(|s| s.sequence)
        .collect()
}

async fn run_until_idle(runtime: &mut LocalRuntime) {
    runtime
        .run_until_idle(Duration::from_secs(3600))
        .await
        .expect("the run ends");
}

/// SplitShard while the parent's batch keeps failing: the children wait until the parent is
/// done, and every key's records arrive once and in order.
#[tokio::test(start_paused = true)]
async fn a_split_shard_is_finished_before_its_children_are_read() {
    let f = failing_first(6);
    let mut runtime = kinesis_setup(1, f.clone(), MappingSettings::default());
    let before = put_keys(&runtime, 8, 3);
    runtime.run_for(Duration::from_millis(100)).await;
    let kinesis = &runtime.services.kinesis;
    let (low, high) = kinesis
        .split_shard("in", "shardId-000000000000", 1u128 << 127)
        .unwrap();
    assert_eq!(
        (low.as_str(), high.as_str()),
        ("shardId-000000000001", "shardId-000000000002")
    );
    let after = put_keys(&runtime, 8, 3);
    let children: Vec<&String> = after.values().flatten().collect();
    assert!(
        kinesis.records("in").iter().any(|r| r.shard_id == high),
        "both children take records"
    );
    run_until_idle(&mut runtime).await;

    let failed = failed_sequences(&f, 6);
    assert!(!failed.is_empty());
    assert!(
        failed.iter().all(|s| !children.contains(&s)),
        "no child record was delivered while its parent was unfinished"
    );
    assert_eq!(
        delivered(&f, 6),
        merge(before, after),
        "each key in order, once"
    );
}

/// MergeShards: the child is read once both parents are done, the slower one included.
#[tokio::test(start_paused = true)]
async fn a_merged_shard_waits_for_both_of_its_parents() {
    let f = failing_first(4);
    let mut runtime = kinesis_setup(2, f.clone(), MappingSettings::default());
    let before = put_keys(&runtime, 10, 2);
    runtime.run_for(Duration::from_millis(100)).await;
    let child = runtime
        .services
        .kinesis
        .merge_shards("in", "shardId-000000000001", "shardId-000000000000")
        .unwrap();
    assert_eq!(child, "shardId-000000000002");
    let after = put_keys(&runtime, 10, 2);
    run_until_idle(&mut runtime).await;
    let children: Vec<&String> = after.values().flatten().collect();
    assert!(failed_sequences(&f, 4)
        .iter()
        .all(|s| !children.contains(&s)));
    assert_eq!(delivered(&f, 4), merge(before, after));
    let shards = runtime.services.kinesis.shards("in");
    assert_eq!(shards[2].parents, [1, 0]);
    assert!(!shards[0].open && !shards[1].open && shards[2].open);
}

/// UpdateShardCount up and then down again, read in three lanes a shard
/// (ParallelizationFactor): every key's records in order across both reshards.
#[tokio::test(start_paused = true)]
async fn update_shard_count_up_and_down_keeps_every_keys_order_in_concurrent_lanes() {
    let f = failing_first(5);
    let settings = MappingSettings {
        parallelization_factor: 3,
        batch_size: 7,
        ..Default::default()
    };
    let mut runtime = kinesis_setup(2, f.clone(), settings);
    let mut written = put_keys(&runtime, 30, 2);
    runtime.run_for(Duration::from_millis(100)).await;
    let grown = runtime
        .services
        .kinesis
        .update_shard_count("in", 3)
        .unwrap();
    assert_eq!(grown.len(), 3);
    written = merge(written, put_keys(&runtime, 30, 2));
    runtime.run_for(Duration::from_millis(700)).await;
    let shrunk = runtime
        .services
        .kinesis
        .update_shard_count("in", 2)
        .unwrap();
    written = merge(written, put_keys(&runtime, 30, 2));
    run_until_idle(&mut runtime).await;
    assert_eq!(delivered(&f, 5), written);
    assert!(f.max_concurrency() > 1, "lanes ran at once");
    let shards = runtime.services.kinesis.shards("in");
    assert_eq!(shards.len(), 2 + 3 + 2);
    assert_eq!(shards.iter().filter(|s| s.open).count(), 2);
    assert_eq!(
        shards
            .iter()
            .map(|s| s.id.clone())
            .skip(5)
            .collect::<Vec<_>>(),
        shrunk
    );
    let refused = runtime
        .services
        .kinesis
        .update_shard_count("in", 5)
        .unwrap_err();
    assert!(
        refused.to_string().contains("TargetShardCount 5"),
        "{refused}"
    );
}

/// "Using Lambda with Kinesis Data Streams", error handling: a parent whose records are too old
/// is done with once they are discarded, and its children are read then, in the same run.
#[tokio::test(start_paused = true)]
async fn a_parent_whose_last_records_expire_lets_its_children_be_read_in_the_same_run() {
    let f = Scripted::new(
        |_, batch| match batch.iter().any(|r| r.key.starts_with("old")) {
            true => Err(FunctionError::Failed("cannot read it".into())),
            false => Ok(Value::Null),
        },
    );
    let settings = MappingSettings {
        maximum_record_age: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    let mut runtime = kinesis_setup(1, f.clone(), settings);
    for i in 0..5 {
        runtime
            .services
            .kinesis
            .put_record("in", &format!("old-{i}"), b"{}")
            .unwrap();
    }
    runtime
        .services
        .kinesis
        .split_shard("in", "shardId-000000000000", 1 << 127)
        .unwrap();
    // Half a minute on, while the parent's records still fail.
    runtime.run_for(Duration::from_secs(30)).await;
    for i in 0..5 {
        runtime
            .services
            .kinesis
            .put_record("in", &format!("new-{i}"), b"{}")
            .unwrap();
    }
    let report = runtime
        .run_until_idle(Duration::from_secs(3600))
        .await
        .expect("the run ends");
    let stats = &report.mappings[0].1;
    assert_eq!((stats.discarded_for_age, stats.records_done), (5, 5));
    let delivered: usize = f
        .batches()
        .iter()
        .flatten()
        .filter(|r| r.key.starts_with("new"))
        .count();
    assert_eq!(delivered, 5, "the children's records, once each");
}

/// A mapping created after a reshard at LATEST reads only what the open shards take from now
/// on; one at TRIM_HORIZON reads the closed parent first, then its children.
#[tokio::test(start_paused = true)]
async fn a_mapping_created_after_a_reshard_starts_in_the_lineage_where_its_position_says() {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    services.kinesis.create_stream("in", 1);
    let mut runtime = LocalRuntime::new(services.clone());
    let old = put_keys(&runtime, 4, 2);
    services
        .kinesis
        .split_shard("in", "shardId-000000000000", 1u128 << 126)
        .unwrap();
    let middle = put_keys(&runtime, 4, 1);
    let latest = Scripted::succeeding();
    // Its first batches fail, so that its children are ready long before its parent is done.
    let horizon = failing_first(3);
    for (name, f, at) in [
        ("latest", &latest, StartingPosition::Latest),
        ("horizon", &horizon, StartingPosition::TrimHorizon),
    ] {
        let source = MappingSource::Kinesis {
            kinesis: services.kinesis.clone(),
            stream: "in".into(),
        };
        let settings = MappingSettings {
            starting_position: at,
            // The parent takes several batches, its children one or two each.
            batch_size: 3,
            ..Default::default()
        };
        runtime.add_mapping(name, f.clone(), source, settings);
    }
    let new = put_keys(&runtime, 4, 1);
    run_until_idle(&mut runtime).await;
    assert_eq!(delivered(&latest, 0), new);
    assert_eq!(delivered(&horizon, 3), merge(merge(old, middle), new));
}

/// DynamoDB Streams: a partition's shard splits, then every shard rolls over, while the first
/// batches fail. Each item's changes stay in its shard's lineage and arrive in order, so a
/// consumer that skips what it has applied (by the item's sequence numbers) loses nothing.
#[tokio::test(start_paused = true)]
async fn dynamodb_stream_shards_that_split_and_roll_over_keep_each_items_changes_in_order() {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let schema = KeySchema {
        hash: "id".into(),
        range: None,
    };
    let table =
        services
            .dynamodb
            .create_table("t", schema, None, Some(StreamView::NewAndOldImages));
    let f = failing_first(5);
    let mut runtime = LocalRuntime::new(services.clone());
    let settings = MappingSettings {
        batch_size: 10,
        parallelization_factor: 2,
        ..Default::default()
    };
    let source = MappingSource::DynamoDb {
        table: table.clone(),
    };
    runtime.add_mapping("f", f.clone(), source, settings);
    let change = |round: usize| {
        for id in 0..12 {
            let item = Item::from([
                ("id".to_owned(), AttrValue::S(format!("item-{id}"))),
                ("n".to_owned(), AttrValue::N(round.to_string())),
            ]);
            table.put_item(item).unwrap();
        }
    };
    change(0);
    runtime.run_for(Duration::from_millis(100)).await;
    let (a, b) = table.split_stream_shard(0).unwrap();
    change(1);
    runtime.run_for(Duration::from_millis(300)).await;
    let rolled = table.roll_over_stream();
    assert_eq!(rolled.len(), 2);
    change(2);
    run_until_idle(&mut runtime).await;

    let shards = table.stream_shards();
    assert_eq!(
        (shards[a].parents.clone(), shards[b].parents.clone()),
        (vec![0], vec![0])
    );
    assert!(
        shards[a].len > 0 && shards[b].len > 0,
        "both halves took changes"
    );
    assert_ne!(shards[a].id, shards[b].id);
    assert!(shards[a].id.starts_with("shardId-000000017672256"));
    let mut written: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in table.stream_records() {
        let keys = keyway::domain::item::item_to_dynamodb_json(&r.keys).to_string();
        written
            .entry(keys)
            .or_default()
            .push(r.sequence_number.clone());
    }
    assert_eq!(written.len(), 12);
    assert_eq!(
        delivered(&f, 5),
        written,
        "each item's changes once, in order"
    );
}
