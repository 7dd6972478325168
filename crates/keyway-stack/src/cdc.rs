//! The CDC join replayed on the embedded runtime: Debezium change events through the re-key and
//! the join, wired from their environment as the stack wires them, the view built in a DynamoDB
//! table. What `keyway cdc`, its benchmark, the demo and the tests share.
//!
//! Each topic is a stream of its own, as Debezium Server's Kinesis sink makes it (a change
//! without a source block is of the table the topic names), its records under their record
//! keys: one row's changes stay in order, and `interleave` mixes everything else.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use cdc_join::join::{Joined, JoinedId, Stamped};
use cdc_join::oracle::Tables;
use cdc_join::rekey::{primary_key, BeforeImages};
use cdc_join::spec::{JoinKind, JoinSpec};
use cdc_join::truncate::RekeyHandler;
use cdc_join::view_table::{joined_of, omitted_from, NO_PARTNER};
use cdc_join::wiring::{join_handler, rekey_handler};
use keyway::adapters::dynamodb::TTL;
use keyway::domain::debezium::{decode_key, decode_record, DebeziumEvent, Op};
use keyway::domain::item::item_size;
use keyway::domain::{InvalidInput, Item};
use keyway_local::{
    Fault, FaultCounts, FaultPlan, KeySchema, LocalError, LocalRuntime, LocalServices,
    MappingSource, MeterSnapshot,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::filtering::dead_letter_reasons;
use crate::metering::Metering;
use crate::{failed, stack_mapping};

/// The virtual time the replay starts at.
const EPOCH: i64 = 1_767_225_600_000;
/// How long the functions may take to settle (virtual time): retries under faults included.
const SETTLE_LIMIT: Duration = Duration::from_secs(24 * 3600);
/// The re-key's schedule, which sweeps truncated tables, and how long a batch may run.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// How long after a truncate's first sweep the second runs, here.
const TRUNCATE_SETTLE: Duration = Duration::from_secs(5 * 60);
/// The streams' and the tables' names on the embedded services.
const CHANGELOG: &str = "cdc-changelog";
const JOINED: &str = "cdc-joined";
const STATE_TABLE: &str = "cdc-state";
const VIEW_TABLE: &str = "cdc-view";

/// One record of a topic: a Debezium change event (or a tombstone: no value) under its record key.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceEvent {
    /// The topic it is on (`prefix.schema.table`), which names its stream.
    pub topic: String,
    /// The record key as Debezium writes it (`{"id": 1001}`, or with its schema envelope).
    pub key: Value,
    /// The change event; none for a tombstone.
    pub value: Option<Value>,
}

/// How the join runs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The tables joined, on which columns, and the kind of join.
    pub spec: JoinSpec,
    /// Shards of every topic's stream and of the changelog.
    pub shards: usize,
    /// Lanes each shard is read in (the mappings' ParallelizationFactor; the stack's is 2).
    pub lanes: u32,
    /// Records a batch, for every stream mapping.
    pub batch_size: usize,
    /// The faults the embedded services inject.
    pub faults: FaultPlan,
    /// Events put on their streams only once every truncate was swept twice: a shard far
    /// behind the others.
    pub late: Vec<SourceEvent>,
    /// How the run is metered for a cost report (its batching replaces `batch_size`).
    pub metering: Metering,
    /// Whether the changes carry whole before images: the re-key's `BEFORE_IMAGES`.
    pub before_images: BeforeImages,
    /// Whether a shard takes at most 1,000 records or 1 MiB a second, as on AWS.
    pub write_limit: bool,
    /// Both functions' timeout (the stack's is 30 s).
    pub function_timeout: std::time::Duration,
}

impl Settings {
    /// The join `spec` on two shards read in two lanes each, 100 records a batch, no faults, no
    /// late events, no metering, no write limit and the stack's timeout.
    pub fn new(spec: JoinSpec) -> Self {
        Self {
            spec,
            shards: 2,
            lanes: 2,
            batch_size: 100,
            faults: FaultPlan::default(),
            late: Vec::new(),
            metering: Metering::default(),
            before_images: BeforeImages::Sometimes,
            write_limit: false,
            function_timeout: crate::stack_mapping(0, 1).function_timeout,
        }
    }
}

/// What the run made.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The joined changelog, in the order the join published it.
    pub joined: Vec<Stamped>,
    /// The view table at the end, tombstones left out.
    pub view: BTreeMap<JoinedId, Joined>,
    /// The view's pairs kept without their rows, too large for an item.
    pub omitted: Vec<JoinedId>,
    /// Records refused, as "field: problem".
    pub dead_letters: Vec<String>,
    /// Runs of the truncate sweep that failed (the next one goes on).
    pub failed_sweeps: u64,
    /// How long after the last change both sweeps of every truncate were done (virtual time).
    pub sweeps_took: Duration,
    /// What the functions asked of DynamoDB (state and view), per table.
    pub meters: BTreeMap<String, MeterSnapshot>,
    /// The largest item of either table at the end, in bytes.
    pub largest_item: usize,
    /// The state table's items at the end: what the functions keep.
    pub state_items: Vec<Item>,
    /// The faults injected, by service (`dynamodb`, `kinesis`, `sqs`, `invocations`).
    pub faults_fired: BTreeMap<&'static str, FaultCounts>,
    /// Kinds of fault the plan names that never fired.
    pub faults_missing: Vec<Fault>,
    /// The faults, dead letters (their bodies) and batches given up, as a chaos run reads them.
    pub ending: crate::chaos::Ending,
    /// Invocations of the re-key and the join that the function's timeout stopped.
    pub timeouts: u64,
}

/// `events` in an order that keeps each row's changes (one topic's record key) in order and
/// interleaves the rows at random, as streams sharded by record key deliver them.
pub fn interleave(events: Vec<SourceEvent>, seed: u64) -> Vec<SourceEvent> {
    let mut rows: BTreeMap<(String, String), VecDeque<SourceEvent>> = BTreeMap::new();
    for event in events {
        let row = (event.topic.clone(), event.key.to_string());
        rows.entry(row).or_default().push_back(event);
    }
    let mut queues: Vec<VecDeque<SourceEvent>> = rows.into_values().collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    while !queues.is_empty() {
        let i = rng.random_range(0..queues.len());
        out.extend(queues[i].pop_front());
        if queues[i].is_empty() {
            queues.swap_remove(i);
        }
    }
    out
}

/// The table a change is of: its `source.table`, or the table its topic names (the last part of
/// `prefix.schema.table`), as the re-key reads it.
fn table_of(topic: &str, table: Option<&String>) -> String {
    table
        .cloned()
        .unwrap_or_else(|| topic.rsplit('.').next().unwrap_or(topic).to_owned())
}

/// The tables as `events` leave them, each row's changes taken in their order; events that do
/// not decode change nothing, as the re-key dead-letters them.
pub fn final_tables(events: &[SourceEvent]) -> Tables {
    let mut tables = Tables::default();
    for event in events {
        let Some(value) = &event.value else { continue };
        let Ok(DebeziumEvent::Change(change)) = decode_record(value.to_string().as_bytes()) else {
            continue;
        };
        // A truncate has no record key: it names no row.
        let pk = match decode_key(&event.key) {
            Ok(key) => primary_key(&key),
            Err(_) if change.op == Op::Truncate => String::new(),
            Err(_) => continue,
        };
        let table = table_of(&event.topic, change.source.table.as_ref());
        tables.apply(&table, &pk, &change);
    }
    tables
}

/// The environment the stack gives both functions, here.
fn environment(settings: &Settings, dead_letters: &str) -> keyway::lambda::Env {
    let spec = &settings.spec;
    let kind = match spec.kind {
        JoinKind::Inner => "inner",
        JoinKind::LeftOuter => "left",
    };
    [
        ("JOIN", spec.expression()),
        ("JOIN_KIND", kind.to_owned()),
        ("FILTER", spec.filter.expression()),
        ("STATE_TABLE", STATE_TABLE.to_owned()),
        ("VIEW_TABLE", VIEW_TABLE.to_owned()),
        ("DEAD_LETTER_SINK", format!("sqs:{dead_letters}")),
        ("CHANGELOG_SINK", format!("kinesis:{CHANGELOG}")),
        ("JOINED_SINK", format!("kinesis:{JOINED}")),
        ("BEFORE_IMAGES", settings.before_images.name().to_owned()),
        ("KEYWAY_REDELIVERY_WINDOW_SECONDS", "90000".to_owned()),
        (
            "TRUNCATE_SETTLE_SECONDS",
            TRUNCATE_SETTLE.as_secs().to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Runs `events`, in their order (see `interleave`), through the re-key and the join.
pub async fn replay(settings: &Settings, events: &[SourceEvent]) -> Result<Outcome, LocalError> {
    let services = LocalServices::new(EPOCH, settings.faults.clone());
    services.kinesis.set_write_limit(settings.write_limit);
    for table in [STATE_TABLE, VIEW_TABLE] {
        let schema = KeySchema::state_table();
        services
            .dynamodb
            .create_table(table, schema, Some(TTL.to_owned()), None);
    }
    let mut topics: Vec<&str> = events
        .iter()
        .chain(&settings.late)
        .map(|e| e.topic.as_str())
        .collect();
    topics.sort_unstable();
    topics.dedup();
    for topic in &topics {
        services.kinesis.create_stream(topic, settings.shards);
    }
    services.kinesis.create_stream(CHANGELOG, settings.shards);
    services.kinesis.create_stream(JOINED, 1);
    let dead_letters = services.sqs.create_queue("cdc-dead-letters");
    let env = environment(settings, &dead_letters);
    let mut runtime = LocalRuntime::new(services.clone());
    let mapping = keyway_local::MappingSettings {
        function_timeout: settings.function_timeout,
        ..stack_mapping(settings.batch_size, settings.lanes)
    };
    let mapping = settings.metering.mapping(mapping);
    settings.metering.apply(&services);
    let source = |stream: &str| MappingSource::Kinesis {
        kinesis: services.kinesis.clone(),
        stream: stream.to_owned(),
    };
    let rekey = Arc::new(rekey_handler(services.as_ref(), &env).map_err(failed("cdc-rekey"))?);
    runtime.add_schedule("cdc-rekey/sweep", rekey.clone(), SWEEP_EVERY, SWEEP_EVERY);
    for topic in &topics {
        runtime.add_mapping(
            &format!("rekey-{topic}"),
            rekey.clone(),
            source(topic),
            mapping.clone(),
        );
    }
    let join = join_handler(services.as_ref(), &env).map_err(failed("cdc-join"))?;
    runtime.add_mapping("join", Arc::new(join), source(CHANGELOG), mapping);
    put_all(&services, events).await?;
    runtime.run_until_idle(SETTLE_LIMIT).await?;
    let sweeps_took = match events.iter().any(is_truncate) {
        true => sweep_truncates(&mut runtime, &rekey).await?,
        false => Duration::ZERO,
    };
    if !settings.late.is_empty() {
        put_all(&services, &settings.late).await?;
        runtime.run_until_idle(SETTLE_LIMIT).await?;
    }
    let mut outcome = outcome(&services, &dead_letters)?;
    outcome.failed_sweeps = runtime.schedules().iter().map(|(_, s)| s.errors).sum();
    outcome.sweeps_took = sweeps_took;
    outcome.ending.usage = runtime.usage();
    outcome.timeouts = runtime.mappings().iter().map(|m| m.stats().timeouts).sum();
    Ok(outcome)
}

/// Runs the stack until both sweeps of every truncate, and the changes they make, are done: a
/// sweep that a crash stopped goes on at the next minute's. Returns how long that took.
async fn sweep_truncates(
    runtime: &mut LocalRuntime,
    rekey: &RekeyHandler,
) -> Result<Duration, LocalError> {
    let unswept = |problem: String| LocalError::Function {
        path: "cdc-rekey/sweep".into(),
        problem,
    };
    runtime.run_for(TRUNCATE_SETTLE).await;
    let mut took = Duration::ZERO;
    while !rekey
        .sweeper
        .all_swept()
        .await
        .map_err(|e| unswept(e.to_string()))?
    {
        if took >= SETTLE_LIMIT {
            let problem = format!("the truncates are not swept twice after {SETTLE_LIMIT:?}");
            return Err(unswept(problem));
        }
        runtime.run_for(SWEEP_EVERY).await;
        took += SWEEP_EVERY;
    }
    runtime.run_until_idle(SETTLE_LIMIT).await?;
    Ok(took + TRUNCATE_SETTLE)
}

/// Rows `operator` keeps in the state table's `items`: the entries of its slots named `slots`,
/// inlined in each key's head (a key of the CDC join's operators holds one row, or a few).
pub fn state_rows(items: &[Item], operator: &str, slots: &[&str]) -> usize {
    let heads = items.iter().filter(|i| {
        i.get("sk").and_then(|v| v.as_s()) == Some("head")
            && i.get("pk")
                .and_then(|v| v.as_s())
                .is_some_and(|pk| pk.starts_with(&format!("{operator}#")))
    });
    heads
        .map(|i| {
            // The CDC join's operators declare no preset dictionary.
            let doc = keyway::adapters::dynamodb::stored_text::read(i, "doc", "{}", "doc", &[]);
            let doc: Value = doc
                .ok()
                .and_then(|text| serde_json::from_str(&text).ok())
                .unwrap_or_default();
            slots
                .iter()
                .map(|s| {
                    assert!(
                        doc["slots"][s].get("seg").is_none(),
                        "a key of {operator} holds its {s} in segments"
                    );
                    doc["slots"][s]["e"].as_array().map_or(0, Vec::len)
                })
                .sum::<usize>()
        })
        .sum()
}

/// Puts `events` on their topics' streams, in their order.
async fn put_all(services: &LocalServices, events: &[SourceEvent]) -> Result<(), LocalError> {
    for event in events {
        let data = event
            .value
            .as_ref()
            .map_or_else(Vec::new, |v| v.to_string().into_bytes());
        let record = [(event.key.to_string(), data)];
        services
            .kinesis
            .put_in_order(&event.topic, &record)
            .await
            .map_err(failed(&event.topic))?;
    }
    Ok(())
}

/// Whether `event` is a truncate.
fn is_truncate(event: &SourceEvent) -> bool {
    event
        .value
        .as_ref()
        .is_some_and(|v| v["op"] == "t" || v["payload"]["op"] == "t")
}

fn outcome(services: &LocalServices, dead_letters: &str) -> Result<Outcome, LocalError> {
    let joined = services
        .kinesis
        .trim(JOINED)
        .iter()
        .map(|r| serde_json::from_slice::<Stamped>(&r.data))
        .collect::<Result<Vec<_>, _>>()
        .map_err(failed(JOINED))?;
    let mut view = BTreeMap::new();
    let mut meters = BTreeMap::new();
    let mut largest_item = 0;
    for table in services.dynamodb.tables() {
        meters.insert(table.name().to_owned(), table.meter().snapshot());
        let largest = table.items().iter().map(item_size).max().unwrap_or(0);
        largest_item = largest_item.max(largest);
    }
    let table = services
        .dynamodb
        .table(VIEW_TABLE)
        .expect("the view table was made");
    let mut omitted = Vec::new();
    for item in table.items() {
        if let Some(row) = joined_of(&item).map_err(failed(VIEW_TABLE))? {
            view.insert(row.id(), row);
        }
        if omitted_from(&item).is_some() {
            let text = |name: &str| item.get(name).and_then(|v| v.as_s()).map(str::to_owned);
            let right = text("sk").filter(|sk| sk != NO_PARTNER);
            omitted.push((text("pk").unwrap_or_default(), right));
        }
    }
    Ok(Outcome {
        joined,
        view,
        omitted,
        dead_letters: dead_letter_reasons(&services.sqs, dead_letters),
        meters,
        largest_item,
        state_items: services
            .dynamodb
            .table(STATE_TABLE)
            .expect("the state table was made")
            .items(),
        faults_fired: services.faults_fired(),
        faults_missing: services.faults_missing(),
        failed_sweeps: 0,
        sweeps_took: Duration::ZERO,
        ending: crate::chaos::Ending::read(services, dead_letters, None),
        timeouts: 0,
    })
}

/// A record key for a change that came without one: the row's `column`, from the row after the
/// change or, for a delete, before it. Refused, naming the field, when the row has no such column.
pub fn key_of(value: &Value, column: &str) -> Result<Value, InvalidInput> {
    let DebeziumEvent::Change(change) = decode_record(value.to_string().as_bytes())? else {
        return Err(InvalidInput::new(
            "value",
            "a tombstone without its record key names no row",
        ));
    };
    if change.op == Op::Truncate {
        // A truncate has no record key; the re-key refuses it for what it is.
        return Ok(Value::Null);
    }
    let row = change.after.as_ref().or(change.before.as_ref());
    match row.and_then(|r| r.get(column)) {
        Some(id) => Ok(serde_json::json!({ column: id })),
        None => Err(InvalidInput::new(
            column,
            "missing from the row: give the record key, or the key column with --key",
        )),
    }
}
