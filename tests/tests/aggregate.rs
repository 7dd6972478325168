//! Keyed aggregation's two phases on the executor: records of plain and salted keys aggregated
//! per key or bucket, flushed on the keys' timers, merged per key into results that equal the
//! values added up one by one; batches and partials delivered twice change nothing; a record for
//! a window already closed is dead-lettered as late.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keyed_aggregate::aggregate::{Aggregate, Partial};
use keyed_aggregate::exact::Exact;
use keyed_aggregate::merge::{result_line, AggregateMerge};
use keyed_aggregate::partials::{KeyedAggregate, PartialUpdate, REDELIVERY_GRACE_MILLIS};
use keyed_aggregate::spec::{Spec, Windows};
use keyway::adapters::dynamodb::ItemKey;
use keyway::domain::pointer::Pointer;
use keyway::domain::AttrValue;
use keyway::ports::{Clock as _, Namespace, StateStore as _};
use keyway::sources::kinesis::decode_event;
use keyway::KeyedOperator as _;
use keyway_tests::harness::{run_to_completion, Shard, World};
use serde_json::Value;

const ALL: [Aggregate; 5] = Aggregate::ALL;

fn line(key: &str, value: &str, at: i64) -> Vec<u8> {
    format!(
        r#"{{"key":"{key}","value":{value},"at":{at},"pad":"{}"}}"#,
        "x".repeat(40)
    )
    .into_bytes()
}

/// Every output of the first phase's sink, fed to the merge as one stream's batch (twice, as a
/// redelivery would), and the last result of each key and window.
async fn merged(
    world: &World,
    merge: &keyway::Executor<AggregateMerge>,
) -> BTreeMap<String, String> {
    let partials: Vec<(String, Vec<u8>)> = world
        .outputs("partials")
        .into_iter()
        .map(|m| {
            let body: Value = serde_json::from_str(&m.body).unwrap();
            (
                body["key"].as_str().unwrap().to_owned(),
                m.body.into_bytes(),
            )
        })
        .collect();
    let records: Vec<(&str, Vec<u8>)> = partials
        .iter()
        .map(|(k, d)| (k.as_str(), d.clone()))
        .collect();
    let mut shard = Shard::new("partials", 0);
    let event = shard.batch(&records);
    run_to_completion(merge, &event, 3).await;
    run_to_completion(merge, &event, 3).await;
    // Sent again as new records (a retried flush): each source's partial is no newer than the
    // one taken, so nothing changes and nothing is emitted.
    let emitted = world.outputs("results").len();
    run_to_completion(merge, &shard.batch(&records), 3).await;
    assert_eq!(world.outputs("results").len(), emitted);
    let mut last = BTreeMap::new();
    for message in world.outputs("results") {
        let body: Value = serde_json::from_str(&message.body).unwrap();
        let slot = format!("{}@{}", body["key"].as_str().unwrap(), body["window_start"]);
        last.insert(slot, message.body);
    }
    last
}

#[tokio::test]
async fn salted_and_plain_records_merge_into_exactly_what_adding_them_up_one_by_one_gives() {
    let world = World::new(&["partials", "results"]);
    let spec = Spec::new(
        "/key",
        Some("/value"),
        ALL.to_vec(),
        None,
        Duration::from_secs(60),
    )
    .unwrap();
    let phase1 = world.executor(KeyedAggregate::new(Arc::new(spec)));
    let merge = world.executor(AggregateMerge {
        aggregates: ALL.to_vec(),
        keep: Duration::from_secs(3600),
        idle: Duration::from_secs(90_000),
    });

    // The hot key under its own partition key and four buckets; two cold keys; values with
    // decimals whose double sums depend on their order.
    let mut records = Vec::new();
    let mut oracle: BTreeMap<String, Partial> = BTreeMap::new();
    for i in 0..200u32 {
        let (key, partition) = match i % 10 {
            0 => ("cold-a".to_owned(), "cold-a".to_owned()),
            1 => ("cold-b".to_owned(), "cold-b".to_owned()),
            2 => ("hot".to_owned(), "hot".to_owned()),
            n => ("hot".to_owned(), format!("hot#{}", n % 4)),
        };
        let value = format!("{}.{}", i % 7, i % 10);
        oracle
            .entry(key.clone())
            .or_default()
            .merge(&Partial::of(Some(Exact::parse(&value).unwrap())))
            .unwrap();
        records.push((partition, line(&key, &value, 0)));
    }
    let records: Vec<(&str, Vec<u8>)> = records
        .iter()
        .map(|(p, d)| (p.as_str(), d.clone()))
        .collect();
    let mut shard = Shard::new("events", 0);
    for chunk in records.chunks(50) {
        let event = shard.batch(chunk);
        run_to_completion(&phase1, &event, 3).await;
        // Delivered again: every record is below its key's watermark.
        let again = phase1.run(decode_event(&event.to_string()).unwrap()).await;
        assert_eq!(again.failed_from, None);
    }
    assert!(
        world.outputs("partials").is_empty(),
        "partials wait for their flush"
    );
    world.clock.advance(61_000);
    let sweep = phase1.fire_timers(None).await.unwrap();
    assert_eq!(
        sweep.fired, 7,
        "one flush for each key and bucket: {sweep:?}"
    );

    let results = merged(&world, &merge).await;
    let expected: BTreeMap<String, String> = oracle
        .iter()
        .map(|(key, total)| (format!("{key}@null"), result_line(key, None, total, &ALL)))
        .collect();
    assert_eq!(results, expected);
    assert!(world.dead_letters().is_empty());
}

/// The first phase counting each key's records as a running total, its key at `/key`.
fn counting() -> KeyedAggregate {
    let spec = Spec::new(
        "/key",
        None,
        vec![Aggregate::Count],
        None,
        Duration::from_secs(60),
    );
    KeyedAggregate::new(Arc::new(spec.unwrap()))
}

#[tokio::test]
async fn a_key_named_like_a_bucket_of_another_key_keeps_a_count_of_its_own() {
    let world = World::new(&["partials", "results"]);
    let phase1 = world.executor(counting());
    let merge = counting_merge(&world);
    // `hot` salted into its bucket 3; `hot#3`, a key of its own under its own partition key and
    // salted into its own bucket 0; `~3~hot`, the text of a bucket's state key.
    let mut shard = Shard::new("events", 0);
    let event = shard.batch(&[
        ("hot#3", line("hot", "1", 0)),
        ("hot#3", line("hot#3", "1", 0)),
        ("hot#3", line("hot", "1", 0)),
        ("hot#3#0", line("hot#3", "1", 0)),
        ("~3~hot", line("~3~hot", "1", 0)),
        ("hot#3", line("hot#3", "1", 0)),
    ]);
    run_to_completion(&phase1, &event, 3).await;
    world.clock.advance(61_000);
    phase1.fire_timers(None).await.unwrap();
    let results = merged(&world, &merge).await;
    let count = |key: &str| {
        let line = &results[&format!("{key}@null")];
        serde_json::from_str::<Value>(line).unwrap()["count"]
            .as_u64()
            .unwrap()
    };
    assert_eq!((count("hot"), count("hot#3"), count("~3~hot")), (2, 3, 1));
}

/// A world, the first phase counting per key in windows of `size_millis` taking records
/// `lateness_millis` late (the time at `/at`), and the world's time.
fn counting_windows(
    size_millis: i64,
    lateness_millis: i64,
) -> (World, keyway::Executor<KeyedAggregate>, i64) {
    let world = World::new(&["partials", "results"]);
    let now = keyway::ports::Clock::now_millis(world.clock.as_ref());
    let phase1 = counting_in(&world, size_millis, lateness_millis);
    (world, phase1, now)
}

/// The first phase counting per key in `world`, in windows of `size_millis` taking records
/// `lateness_millis` late.
fn counting_in(
    world: &World,
    size_millis: i64,
    lateness_millis: i64,
) -> keyway::Executor<KeyedAggregate> {
    let windows = Windows {
        size_millis,
        lateness_millis,
        time: Pointer::parse("/at").unwrap(),
        ahead_millis: Windows::AHEAD_MILLIS,
    };
    let spec = Spec::new(
        "/key",
        None,
        vec![Aggregate::Count],
        Some(windows),
        Duration::from_secs(60),
    )
    .unwrap();
    world.executor(KeyedAggregate::new(Arc::new(spec)))
}

/// The merge of the counts `counting_windows` sends, keeping an hour of windows, and a key's
/// windows 25 hours past its last partial (the stack's redelivery window).
fn counting_merge(world: &World) -> keyway::Executor<AggregateMerge> {
    counting_merge_keeping(world, Duration::from_secs(3600))
}

fn counting_merge_keeping(world: &World, keep: Duration) -> keyway::Executor<AggregateMerge> {
    world.executor(AggregateMerge {
        aggregates: vec![Aggregate::Count],
        keep,
        idle: Duration::from_secs(90_000),
    })
}

#[tokio::test]
async fn a_record_for_a_window_already_closed_is_dead_lettered_as_late_and_counted_nowhere() {
    let (world, phase1, now) = counting_windows(60_000, 5_000);
    let merge = counting_merge(&world);
    let open = now - now.rem_euclid(60_000);
    // Two records in the open window, one in the window before it (closed: its end and the
    // five seconds of lateness are past unless the clock just turned a minute).
    let closed = open - 120_000;
    let mut shard = Shard::new("events", 0);
    let event = shard.batch(&[
        ("k", line("k", "1", open + 1)),
        ("k", line("k", "1", closed)),
        ("k", line("k", "1", open + 2)),
    ]);
    run_to_completion(&phase1, &event, 3).await;
    let late = world.dead_letters();
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(late[0].field, "data/at");
    assert!(
        late[0].problem.starts_with("late: its window"),
        "{}",
        late[0].problem
    );

    world.clock.advance(70_000);
    phase1.fire_timers(None).await.unwrap();
    let results = merged(&world, &merge).await;
    assert_eq!(
        results.into_values().collect::<Vec<_>>(),
        [format!(r#"{{"key":"k","window_start":{open},"count":2}}"#)]
    );
}

#[tokio::test]
async fn a_record_stamped_far_ahead_of_the_clock_or_at_the_ends_of_time_opens_no_window_and_is_dead_lettered_naming_its_time(
) {
    let (world, phase1, now) = counting_windows(10_000, 0);
    let year = 365 * 24 * 3_600_000_i64;
    let mut shard = Shard::new("events", 0);
    // A minute ahead is a producer's clock running fast: taken. The rest are not.
    let records: Vec<(&str, Vec<u8>)> = [
        now + 60_000,
        now + 2 * 3_600_000,
        now + year,
        i64::MAX,
        i64::MIN,
    ]
    .into_iter()
    .map(|at| ("k", line("k", "1", at)))
    .collect();
    run_to_completion(&phase1, &shard.batch(&records), 3).await;
    let letters = world.dead_letters();
    let problems: Vec<(&str, bool)> = letters
        .iter()
        .map(|l| (l.field.as_str(), l.problem.contains("ahead of the clock")))
        .collect();
    assert_eq!(
        problems,
        [
            ("data/at", true),
            ("data/at", true),
            ("data/at", true),
            ("data/at", false)
        ],
        "{letters:?}"
    );
    assert!(
        letters[3].problem.starts_with("late: "),
        "{}",
        letters[3].problem
    );
    world.clock.advance(120_000);
    phase1.fire_timers(None).await.unwrap();
    let partials = world.outputs("partials");
    assert_eq!(
        partials.len(),
        1,
        "the one window a minute ahead: {partials:?}"
    );
    let timers: usize = world
        .table
        .items()
        .iter()
        .filter(|i| {
            i.get("pk")
                .and_then(|v| v.as_s())
                .is_some_and(|pk| pk.contains("#timers#"))
        })
        .count();
    assert_eq!(timers, 0, "no window is left waiting");
}

#[tokio::test]
async fn a_batch_that_read_the_clock_before_its_window_closed_and_runs_past_the_close_still_counts_in_it(
) {
    let (world, phase1, now) = counting_windows(60_000, 0);
    let merge = counting_merge(&world);
    let close = now - now.rem_euclid(60_000) + 60_000;
    let mut shard = Shard::new("events", 0);
    // Each batch read the clock at `at` and may run for the function's 30 s.
    let mut run_at = |at: i64, times: &[i64]| {
        world.clock.set(at);
        let records: Vec<(&str, Vec<u8>)> =
            times.iter().map(|&t| ("k", line("k", "1", t))).collect();
        let batch = decode_event(&shard.batch(&records).to_string()).unwrap();
        phase1.run_until(batch, Some(at + 30_000))
    };
    run_at(close - 2_000, &[close - 2_500, close - 2_400]).await;
    // The sweep after the close, while a batch that read the clock a second before it is
    // still loading its keys.
    world.clock.set(close + 1_000);
    phase1.fire_timers(None).await.unwrap();
    run_at(close - 1_000, &[close - 1_500]).await;
    world.clock.set(close + 120_000);
    phase1.fire_timers(None).await.unwrap();
    let results = merged(&world, &merge).await;
    let start = close - 60_000;
    assert_eq!(
        results.into_values().collect::<Vec<_>>(),
        [format!(r#"{{"key":"k","window_start":{start},"count":3}}"#)],
        "every record of the window, the late-running batch's too"
    );
    assert!(world.dead_letters().is_empty());
}

/// The first phase counting per key in minute windows taking nothing late, a shard feeding it,
/// the merge, and when the window of the world's minute closes.
struct Minutes {
    world: World,
    phase1: keyway::Executor<KeyedAggregate>,
    merge: keyway::Executor<AggregateMerge>,
    shard: Shard,
    close: i64,
}

impl Minutes {
    fn new() -> Self {
        let (world, phase1, now) = counting_windows(60_000, 0);
        let merge = counting_merge(&world);
        let close = now - now.rem_euclid(60_000) + 60_000;
        let shard = Shard::new("events", 0);
        Self {
            world,
            phase1,
            merge,
            shard,
            close,
        }
    }

    /// Applies `records` (key, event time) that reached the stream at `arrived`, at `at` with
    /// the function's 30 s from then.
    async fn apply(&mut self, at: i64, arrived: i64, records: &[(&str, i64)]) {
        self.world.clock.set(at);
        self.shard.arrival_millis = arrived;
        let records: Vec<(&str, Vec<u8>)> =
            records.iter().map(|&(k, t)| (k, line(k, "1", t))).collect();
        let batch = decode_event(&self.shard.batch(&records).to_string()).unwrap();
        self.phase1.run_until(batch, Some(at + 30_000)).await;
    }

    /// Fires the timers due at `at`.
    async fn sweep(&self, at: i64) {
        self.world.clock.set(at);
        self.phase1.fire_timers(None).await.unwrap();
    }

    /// Each key's last result per window, as `key@window` to the result's line.
    async fn results(&self) -> Vec<String> {
        merged(&self.world, &self.merge)
            .await
            .into_values()
            .collect()
    }
}

fn result(key: &str, window: i64, count: u32) -> String {
    format!(r#"{{"key":"{key}","window_start":{window},"count":{count}}}"#)
}

#[tokio::test]
async fn a_batch_delivered_again_after_its_window_closed_counts_what_arrived_in_time_unless_its_key_sent_the_window(
) {
    let mut w = Minutes::new();
    let close = w.close;
    let (start, before) = (close - 60_000, close - 120_000);
    // k, j and m each send the window before: their marks.
    let keys = [
        ("k", start - 5_500),
        ("j", start - 5_400),
        ("m", start - 5_300),
    ];
    w.apply(start - 5_000, start - 5_000, &keys).await;
    w.sweep(start + 40_000).await;
    w.apply(close - 5_000, close - 5_000, &[("k", close - 5_500)])
        .await;
    // Reached the stream two seconds before the close; its first delivery failed (a throttled
    // commit applies nothing), and Lambda delivers it again ten seconds after: k's record joins
    // k's window, which waits in its state; j's opens j's, after the one j sent; n has sent no
    // window, so nothing tells whether it sent this one.
    let again = [
        ("k", close - 2_500),
        ("j", close - 2_400),
        ("n", close - 2_300),
    ];
    w.apply(close + 10_000, close - 2_000, &again).await;
    // Reached the stream after the close.
    w.apply(close + 11_000, close + 500, &[("k", close - 100)])
        .await;
    w.sweep(close + 120_000).await;
    // In time, but applied after k's window went to the merge.
    w.apply(close + 121_000, close - 1_000, &[("k", close - 1_500)])
        .await;
    // In time, but applied past the grace: m never opened the window.
    let past_grace = close + REDELIVERY_GRACE_MILLIS + 1_000;
    w.apply(past_grace, close - 1_000, &[("m", close - 1_500)])
        .await;
    // The lateness raised to ten minutes: k's window, sent, stays closed.
    w.phase1 = counting_in(&w.world, 60_000, 600_000);
    w.apply(close + 200_000, close + 200_000, &[("k", close - 1_000)])
        .await;
    w.sweep(past_grace + 120_000).await;

    assert_eq!(
        w.results().await,
        [
            result("j", before, 1),
            result("j", start, 1),
            result("k", before, 1),
            result("k", start, 2),
            result("m", before, 1),
        ],
        "what reached the stream in time counts while its window waits, or opens it after one its \
         key sent"
    );
    let letters = w.world.dead_letters();
    let reasons: Vec<(&str, &str)> = letters
        .iter()
        .map(|l| {
            let problem = l.problem.as_str();
            assert!(problem.starts_with("late: its window"), "{problem}");
            let why = ["no mark", "gone to the merge", "too late to open"]
                .into_iter()
                .find(|why| problem.contains(why))
                .unwrap_or("arrived after the close");
            (l.field.as_str(), why)
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("data/at", "no mark"),
            ("data/at", "arrived after the close"),
            ("data/at", "gone to the merge"),
            ("data/at", "too late to open"),
            ("data/at", "gone to the merge"),
        ],
        "{letters:?}"
    );
}

/// The merge's items of keys named `prefix`...
fn merge_items(world: &World, prefix: &str) -> usize {
    world
        .table
        .items()
        .iter()
        .filter_map(|i| i.get("pk").and_then(|v| v.as_s()))
        .filter(|pk| pk.starts_with("aggregate-merge#") && pk.contains(prefix))
        .count()
}

/// A key seen once (a session, a request) left its windows in the merge's state for good: a
/// million new keys a day kept a million more items every day. Its windows now go once it has
/// had no partial for the redelivery window (25 hours here), or `keep` if longer: a partial of a
/// source still to come within it finds the others' there; after it the key reads as new, and
/// DynamoDB deletes its item once its watermarks are past use too. A running total, which the
/// sources' next partials need whole, stays.
#[tokio::test]
async fn a_keys_windows_leave_the_merges_state_once_no_partial_can_come_and_a_running_total_stays()
{
    const HOUR: i64 = 3_600_000;
    for (keep_hours, idle_hours) in [(1, 25), (48, 48)] {
        let world = World::new(&["results"]);
        let merge = counting_merge_keeping(&world, Duration::from_secs(keep_hours * 3600));
        let now = world.clock.now_millis();
        let partial = |key: &str, source: &str, window_start: Option<i64>| {
            let update = PartialUpdate {
                key: key.to_owned(),
                window_start,
                source: source.to_owned(),
                version: 1,
                partial: Partial::of(None),
            };
            (key.to_owned(), serde_json::to_vec(&update).unwrap())
        };
        let mut shard = Shard::new("partials", 0);
        let mut send = |records: Vec<(String, Vec<u8>)>| {
            let records: Vec<(&str, Vec<u8>)> = records
                .iter()
                .map(|(k, d)| (k.as_str(), d.clone()))
                .collect();
            shard.arrival_millis = world.clock.now_millis();
            shard.batch(&records)
        };
        let window = Some(now - 60_000);
        let first = send(vec![
            partial("session-1", "session-1", window),
            partial("session-2", "session-2", window),
            partial("total-1", "total-1", None),
        ]);
        run_to_completion(&merge, &first, 3).await;
        // A bucket's partial of session-1's window, just within the idle time: the window holds.
        world.clock.advance(idle_hours * HOUR - 1_000);
        let within = send(vec![partial("session-1", "~1~session-1", window)]);
        run_to_completion(&merge, &within, 3).await;
        let results = world.outputs("results");
        let last = results.last().unwrap();
        assert!(last.body.contains("\"count\":2"), "{}", last.body);
        // Past it, session-2's window is gone: a partial of it now counts alone.
        world.clock.advance(2_000);
        let past = send(vec![partial("session-2", "~1~session-2", window)]);
        run_to_completion(&merge, &past, 3).await;
        let results = world.outputs("results");
        let last = results.last().unwrap();
        assert!(last.body.contains("\"count\":1"), "{}", last.body);
        // Past the watermarks' horizon too (the redelivery window: a year unless set), nothing of
        // the sessions is left.
        world.clock.advance(400 * 24 * HOUR);
        world.table.expire(world.clock.now_millis() / 1000);
        assert_eq!(merge_items(&world, "session-"), 0);
        assert_eq!(merge_items(&world, "total-1"), 1, "a running total stays");
    }
}

/// The items of the partition key `pk`.
fn items_of(world: &World, pk: &str) -> Vec<keyway::domain::Item> {
    world
        .table
        .items()
        .into_iter()
        .filter(|i| i.get("pk").and_then(|v| v.as_s()) == Some(pk))
        .collect()
}

/// Moves the first phase's items under `signature` to the signature `to`, as a release that
/// wrote them there would have left them.
fn move_state(world: &World, signature: &str, to: &str) {
    for mut item in world.table.items() {
        let Some(pk) = item.get("pk").and_then(|v| v.as_s()).map(str::to_owned) else {
            continue;
        };
        if pk.starts_with("keyed-aggregate#") && pk.contains(signature) {
            let sk = item["sk"].as_s().unwrap().to_owned();
            let key = ItemKey { pk: pk.clone(), sk };
            world.table.delete_item(&key.to_item()).unwrap();
            item.insert("pk".into(), AttrValue::S(pk.replace(signature, to)));
            world.table.put_item(item).unwrap();
        }
    }
}

#[tokio::test]
async fn windows_the_release_before_the_sent_mark_left_open_carry_over_and_go_to_the_merge_whole() {
    let mut w = Minutes::new();
    let close = w.close;
    let before_mark = "6ae4d86bfd442e9e";
    assert_eq!(
        w.phase1.operator().migrations()[0].from,
        before_mark,
        "the migration reads the states the lock file recorded before the mark"
    );
    let keys = [
        ("k", close - 5_500),
        ("j", close - 5_400),
        ("k", close - 5_300),
    ];
    w.apply(close - 5_000, close - 5_000, &keys).await;
    move_state(&w.world, &w.phase1.namespace().signature, before_mark);
    let k_before = format!("keyed-aggregate#{before_mark}#k");
    let k_items = items_of(&w.world, &k_before);
    // k takes one more record after the upgrade; j's window goes on its timer alone.
    w.apply(close - 1_000, close - 1_000, &[("k", close - 1_500)])
        .await;
    // As if the write retiring k's old state had not landed (a crash after k's commit): k's
    // next commit retires it.
    for item in items_of(&w.world, &k_before) {
        let sk = item["sk"].as_s().unwrap().to_owned();
        let key = ItemKey {
            pk: k_before.clone(),
            sk,
        };
        w.world.table.delete_item(&key.to_item()).unwrap();
    }
    for item in k_items {
        w.world.table.put_item(item).unwrap();
    }
    w.sweep(close + 120_000).await;
    let start = close - 60_000;
    assert_eq!(
        w.results().await,
        [result("j", start, 1), result("k", start, 3)]
    );
    assert!(
        w.world.dead_letters().is_empty(),
        "{:?}",
        w.world.dead_letters()
    );
    // What the release before left is retired once carried over: a load that finds a key
    // missing once its current state expired carries nothing over again.
    let keys = ["k".to_owned(), "j".to_owned()];
    let old = Namespace::new("keyed-aggregate", before_mark);
    let left = w.world.store.load(&old, &keys).await.unwrap();
    let current = w
        .world
        .store
        .load(w.phase1.namespace(), &keys)
        .await
        .unwrap();
    assert_eq!(
        (current["k"].retiring.as_ref(), current["j"].retiring.is_some()),
        (None, true),
        "k's commit that retired its old state dropped its note; j's note waits for its next commit"
    );
    assert!(
        left.values().all(|state| state.slots.is_empty()),
        "{:?}",
        left.values()
            .map(|s| s.slots.keys().collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_key_starting_with_a_tilde_is_judged_hot_under_its_own_name_as_its_buckets_are() {
    use keyway::KeyedOperator;
    let operator = counting();
    let mut shard = Shard::new("events", 0);
    let event = shard.batch(&[
        ("~x", line("~x", "1", 0)),
        ("~x#3", line("~x", "1", 0)),
        ("k", line("k", "1", 0)),
        ("k#3", line("k", "1", 0)),
    ]);
    let judged: Vec<String> = decode_event(&event.to_string())
        .unwrap()
        .into_iter()
        .map(|record| {
            let input = operator.decode(&record.unwrap()).unwrap();
            operator
                .hot_key(&input)
                .unwrap_or_else(|| operator.key(&input))
        })
        .collect();
    assert_eq!(judged, ["~x", "~x", "k", "k"]);
}

#[tokio::test(start_paused = true)]
async fn the_stacks_aggregation_counts_plain_and_salted_keys_exactly_as_the_oracle_does() {
    use keyway::domain::salt::{Partitioner, Salting};
    use keyway_local::{FaultPlan, LocalRuntime, LocalServices};

    let services = LocalServices::new(1_767_225_600_000, FaultPlan::default());
    let mut runtime = LocalRuntime::from_template(
        keyway_stack::TEMPLATE,
        services.clone(),
        &keyway_stack::functions(),
    )
    .unwrap();
    // A key on half the events, salted over eight buckets; forty others.
    let hot = std::collections::BTreeSet::from(["hot".to_owned()]);
    let mut partitioner = Partitioner::new(Salting::Listed { hot, buckets: 8 });
    let mut oracle: BTreeMap<String, u64> = BTreeMap::new();
    let records: Vec<(String, Vec<u8>)> = (0..4_000u32)
        .map(|i| {
            let key = if i % 2 == 0 {
                "hot".to_owned()
            } else {
                format!("k{}", i % 41)
            };
            *oracle.entry(key.clone()).or_default() += 1;
            (partitioner.partition_key(&key), line(&key, "1", 0))
        })
        .collect();
    let stream = runtime.resource("AggregateEventsStream").unwrap();
    services
        .kinesis
        .put_in_order(&stream, &records)
        .await
        .unwrap();
    runtime
        .run_until_idle(Duration::from_secs(600))
        .await
        .unwrap();
    // The running totals go to the merge a minute after their first change, on the schedule's
    // sweep of the keys' timers; the merge then runs.
    runtime.run_for(Duration::from_secs(130)).await;

    let results = runtime.resource("AggregateResultsStream").unwrap();
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    for record in services.kinesis.records(&results) {
        let body: Value = serde_json::from_slice(&record.data).unwrap();
        last.insert(
            body["key"].as_str().unwrap().to_owned(),
            String::from_utf8(record.data.to_vec()).unwrap(),
        );
    }
    let expected: BTreeMap<String, String> = oracle
        .iter()
        .map(|(key, count)| (key.clone(), format!(r#"{{"key":"{key}","count":{count}}}"#)))
        .collect();
    assert_eq!(last, expected);
    let dead = runtime.resource("DeadLetterQueue").unwrap();
    assert!(services.sqs.messages(&dead).is_empty());
}
