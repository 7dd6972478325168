//! The CDC join on the executor: Debezium change events of two tables, put under their record
//! keys, through the re-key, its changelog spread over shards by join key and taken by the join
//! in random interleavings and batch sizes, the joined changes applied to a view. The view ends as
//! the join of the final tables, and the state of both operators holds exactly the live rows.
//! Then the same through both functions as their environment wires them, on the embedded
//! runtime's streams, mappings and tables.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use cdc_join::join::{Joined, JoinedId, Stamped};
use cdc_join::joiner::{Join, JOINED, VIEW};
use cdc_join::rekey::{Rekey, Step, CHANGELOG};
use cdc_join::spec::{JoinKind, JoinSpec};
use cdc_join::view::View;
use cdc_join::view_table::{joined_of, ViewTable};
use keyway::sources::kinesis::decode_event;
use keyway::Executor;
use keyway_local::LocalTable;
use keyway_stack::cdc::SourceEvent;
use keyway_tests::cdc::{folded, state_rows};
use keyway_tests::harness::{Shard, World};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The `keyway` command runs the embedded runtime on mimalloc; so does this test, whose chaos run
/// makes millions of small allocations.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Row = Map<String, Value>;

/// A Debezium event (PostgreSQL, no schema envelope) of `table` and its record key.
fn event(table: &str, op: &str, before: Option<&Row>, after: Option<&Row>) -> Value {
    json!({
        "before": before,
        "after": after,
        "source": {"connector": "postgresql", "db": "app", "schema": "public", "table": table, "snapshot": "false"},
        "op": op,
        "ts_ms": 1_767_225_600_000_i64
    })
}

/// Random changes of `domains` (id, user_id, name) and `users` (id, name): inserts, updates that
/// move a domain to another user or to none, updates that change a primary key (a delete, a
/// tombstone and a create, as Debezium sends them), deletes, and events sent twice. Returns the
/// records as put (table, record key, value or tombstone) and the final tables.
fn changes(rng: &mut StdRng, n: usize) -> (Vec<(String, String, Option<Value>)>, Tables) {
    let mut tables: Tables = BTreeMap::new();
    let mut records = Vec::new();
    for _ in 0..n {
        let table = if rng.random_bool(0.6) {
            "domains"
        } else {
            "users"
        };
        let id: u32 = rng.random_range(0..8);
        let rows = tables.entry(table.to_owned()).or_default();
        let key = json!({"id": id}).to_string();
        let fresh = |rng: &mut StdRng, id: u32| {
            let mut r = Row::new();
            r.insert("id".into(), json!(id));
            r.insert("name".into(), json!(rng.random_range(0..3)));
            if table == "domains" {
                let user = rng.random_range(0..5);
                r.insert(
                    "user_id".into(),
                    if user == 0 { Value::Null } else { json!(user) },
                );
            }
            r
        };
        // Sometimes sent twice, as a connector that restarted sends what it sent before.
        let put = |rng: &mut StdRng, records: &mut Vec<_>, key: &str, value: Option<Value>| {
            let times = if rng.random_bool(0.05) { 2 } else { 1 };
            for _ in 0..times {
                records.push((table.to_owned(), key.to_owned(), value.clone()));
            }
        };
        match rows.get(&id).cloned() {
            None => {
                let row = fresh(rng, id);
                put(
                    rng,
                    &mut records,
                    &key,
                    Some(event(table, "c", None, Some(&row))),
                );
                rows.insert(id, row);
            }
            Some(old) => match rng.random_range(0..4) {
                0 => {
                    put(
                        rng,
                        &mut records,
                        &key,
                        Some(event(table, "d", Some(&old), None)),
                    );
                    put(rng, &mut records, &key, None);
                    rows.remove(&id);
                }
                1 => {
                    // The primary key changes: a delete, a tombstone, a create under the new key.
                    let to: u32 = rng.random_range(8..16);
                    if rows.contains_key(&to) {
                        continue;
                    }
                    let mut new = fresh(rng, to);
                    new.insert("id".into(), json!(to));
                    put(
                        rng,
                        &mut records,
                        &key,
                        Some(event(table, "d", Some(&old), None)),
                    );
                    put(rng, &mut records, &key, None);
                    let to_key = json!({"id": to}).to_string();
                    put(
                        rng,
                        &mut records,
                        &to_key,
                        Some(event(table, "c", None, Some(&new))),
                    );
                    rows.remove(&id);
                    rows.insert(to, new);
                }
                _ => {
                    let new = fresh(rng, id);
                    put(
                        rng,
                        &mut records,
                        &key,
                        Some(event(table, "u", Some(&old), Some(&new))),
                    );
                    rows.insert(id, new);
                }
            },
        }
    }
    (records, tables)
}

type Tables = BTreeMap<String, BTreeMap<u32, Row>>;

/// The join of the final tables, written plainly.
fn oracle(kind: JoinKind, tables: &Tables) -> BTreeMap<JoinedId, Joined> {
    let empty = BTreeMap::new();
    let domains = tables.get("domains").unwrap_or(&empty);
    let users = tables.get("users").unwrap_or(&empty);
    let mut out = BTreeMap::new();
    for (id, domain) in domains {
        let partners: Vec<(&u32, &Row)> = users
            .iter()
            .filter(|(uid, _)| domain["user_id"] == json!(uid))
            .collect();
        let mut add = |right: Option<(&u32, &Row)>| {
            let joined = Joined {
                left_pk: id.to_string(),
                left: domain.clone(),
                right_pk: right.map(|(uid, _)| uid.to_string()),
                right: right.map(|(_, u)| u.clone()),
            };
            out.insert(joined.id(), joined);
        };
        if partners.is_empty() && kind == JoinKind::LeftOuter {
            add(None);
        }
        for partner in partners {
            add(Some(partner));
        }
    }
    out
}

async fn run(seed: u64, kind: JoinKind) {
    let mut rng = StdRng::seed_from_u64(seed);
    let spec = JoinSpec::parse("domains.user_id=users.id", kind).unwrap();
    let world = World::new(&[CHANGELOG.name, JOINED.name]);
    let rekey = world.executor(Rekey::new(spec.clone()));
    // The join's view sink writes a table of its own, as the function's does.
    let view_table = Arc::new(LocalTable::new());
    let sinks = world.sinks_named([JOINED.name].into_iter()).with(
        &VIEW,
        Arc::new(ViewTable::new(
            view_table.clone(),
            world.clock.clone(),
            std::time::Duration::from_secs(24 * 3600),
        )),
    );
    let join = Executor::new(
        Join {
            kind,
            replays_within: std::time::Duration::from_secs(24 * 3600),
        },
        world.store.clone(),
        sinks,
        world.clock.clone(),
    )
    .unwrap();
    let (records, tables) = changes(&mut rng, 250);

    // The re-key, in batches of random size, one shard per table (a key's events in order).
    let mut sources: BTreeMap<String, Shard> = BTreeMap::new();
    let mut at = 0;
    while at < records.len() {
        let end = (at + rng.random_range(1..20)).min(records.len());
        let mut by_table: BTreeMap<&str, Vec<(&str, Vec<u8>)>> = BTreeMap::new();
        for (table, key, value) in &records[at..end] {
            let data = value
                .as_ref()
                .map_or_else(Vec::new, |v| v.to_string().into_bytes());
            by_table.entry(table).or_default().push((key, data));
        }
        for (table, batch) in by_table {
            let shard = sources
                .entry(table.to_owned())
                .or_insert_with(|| Shard::new(&format!("app.public.{table}"), 0));
            let report = rekey
                .run(decode_event(&shard.batch(&batch).to_string()).unwrap())
                .await;
            assert_eq!((report.failed_from, report.dead_lettered), (None, 0));
        }
        at = end;
    }

    // The changelog, spread over 1-4 shards by group, each shard's steps in order.
    let shards = rng.random_range(1..=4);
    let mut queues: Vec<VecDeque<(String, Vec<u8>)>> = vec![VecDeque::new(); shards];
    for message in world.outputs(CHANGELOG.name) {
        let step: Step = serde_json::from_str(&message.body).unwrap();
        let shard = keyway::domain::hash::kinesis_shard_index(&step.group, shards as u32) as usize;
        queues[shard].push_back((step.group, message.body.into_bytes()));
    }
    let mut changelog: Vec<Shard> = (0..shards)
        .map(|i| Shard::new("changelog", i as u32))
        .collect();
    while queues.iter().any(|q| !q.is_empty()) {
        let i = rng.random_range(0..shards);
        let take = rng.random_range(1..10).min(queues[i].len());
        if take == 0 {
            continue;
        }
        let batch: Vec<(String, Vec<u8>)> = queues[i].drain(..take).collect();
        let batch: Vec<(&str, Vec<u8>)> =
            batch.iter().map(|(k, d)| (k.as_str(), d.clone())).collect();
        let report = join
            .run(decode_event(&changelog[i].batch(&batch).to_string()).unwrap())
            .await;
        assert_eq!((report.failed_from, report.dead_lettered), (None, 0));
    }

    // Joined changes reach the view in the order the join sent them across shards.
    let mut view = View::default();
    for message in world.outputs(JOINED.name) {
        let stamped: Stamped = serde_json::from_str(&message.body).unwrap();
        view.apply(stamped);
    }
    let got: BTreeMap<JoinedId, Joined> = view.rows().map(|j| (j.id(), j.clone())).collect();
    let expected = oracle(kind, &tables);
    assert_eq!(
        got.keys().collect::<BTreeSet<_>>(),
        expected.keys().collect::<BTreeSet<_>>(),
        "seed {seed} {kind:?}"
    );
    assert_eq!(got, expected, "seed {seed} {kind:?}: contents");
    // The view table, written as the join sent its changes, holds the same rows.
    let mut table: BTreeMap<JoinedId, Joined> = BTreeMap::new();
    for item in view_table.items() {
        if let Some(joined) = joined_of(&item).unwrap() {
            table.insert(joined.id(), joined);
        }
    }
    assert_eq!(table, expected, "seed {seed} {kind:?}: the view table");
    let live: usize = tables.values().map(BTreeMap::len).sum();
    assert_eq!(
        state_rows(&world.table.items(), "cdc-rekey", &["row"]),
        live,
        "seed {seed}: re-key"
    );
    assert_eq!(
        state_rows(&world.table.items(), "cdc-join", &["left", "right"]),
        live,
        "seed {seed}: join"
    );
    assert!(world.dead_letters().is_empty());
}

#[tokio::test]
async fn random_changes_through_rekey_and_join_on_several_shards_build_the_join_of_the_final_tables(
) {
    for seed in 0..12 {
        run(seed, JoinKind::Inner).await;
        run(seed, JoinKind::LeftOuter).await;
    }
}

/// Both functions wired from their environment on the embedded runtime: Debezium records on a
/// source stream of 2 shards, the changelog on 3, event source mappings as the stack has them.
async fn through_the_functions(seed: u64, kind: JoinKind) {
    use keyway_local::{
        FaultPlan, KeySchema, LocalRuntime, LocalServices, MappingSettings, MappingSource,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let services = LocalServices::new(1_767_225_600_000, FaultPlan::default());
    for table in ["cdc-state", "cdc-view"] {
        let ttl = Some(keyway::adapters::dynamodb::TTL.to_owned());
        services
            .dynamodb
            .create_table(table, KeySchema::state_table(), ttl, None);
    }
    services.kinesis.create_stream("app.public.changes", 2);
    services.kinesis.create_stream("changelog", 3);
    services.kinesis.create_stream("joined", 1);
    let dead_letters = services.sqs.create_queue("cdc-dead-letters");
    let kind_name = match kind {
        JoinKind::Inner => "inner",
        JoinKind::LeftOuter => "left",
    };
    let env: keyway::lambda::Env = [
        ("JOIN", "domains.user_id=users.id".to_owned()),
        ("JOIN_KIND", kind_name.to_owned()),
        ("STATE_TABLE", "cdc-state".to_owned()),
        ("VIEW_TABLE", "cdc-view".to_owned()),
        ("DEAD_LETTER_SINK", format!("sqs:{dead_letters}")),
        ("CHANGELOG_SINK", "kinesis:changelog".to_owned()),
        ("JOINED_SINK", "kinesis:joined".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let rekey = cdc_join::wiring::rekey_handler(services.as_ref(), &env).expect("wired");
    let join = cdc_join::wiring::join_handler(services.as_ref(), &env).expect("wired");
    let mut runtime = LocalRuntime::new(services.clone());
    let settings = MappingSettings {
        batch_size: 50,
        report_batch_item_failures: true,
        bisect_batch_on_function_error: true,
        ..Default::default()
    };
    let source = |stream: &str| MappingSource::Kinesis {
        kinesis: services.kinesis.clone(),
        stream: stream.to_owned(),
    };
    runtime.add_mapping(
        "rekey",
        Arc::new(rekey),
        source("app.public.changes"),
        settings.clone(),
    );
    runtime.add_mapping("join", Arc::new(join), source("changelog"), settings);
    let (records, tables) = changes(&mut rng, 250);
    let put: Vec<(String, Vec<u8>)> = records
        .into_iter()
        .map(|(_, key, value)| {
            let data = value.map_or_else(Vec::new, |v| v.to_string().into_bytes());
            (key, data)
        })
        .collect();
    services
        .kinesis
        .put_in_order("app.public.changes", &put)
        .await
        .unwrap();
    runtime
        .run_until_idle(std::time::Duration::from_secs(3600))
        .await
        .expect("the functions go idle");
    let view = services.dynamodb.table("cdc-view").unwrap();
    let mut got: BTreeMap<JoinedId, Joined> = BTreeMap::new();
    for item in view.items() {
        if let Some(joined) = joined_of(&item).unwrap() {
            got.insert(joined.id(), joined);
        }
    }
    assert_eq!(
        got,
        oracle(kind, &tables),
        "seed {seed} {kind:?}: the view table"
    );
    let letters = services.sqs.receive(&dead_letters, usize::MAX);
    assert!(letters.is_empty(), "{:?}", letters.first().map(|m| &m.body));
    assert!(
        !services.kinesis.trim("joined").is_empty(),
        "the joined changelog"
    );
}

#[tokio::test(start_paused = true)]
async fn both_functions_wired_from_their_environment_build_the_view_table_of_the_join() {
    for seed in 0..4 {
        through_the_functions(seed, JoinKind::Inner).await;
        through_the_functions(seed, JoinKind::LeftOuter).await;
    }
}

/// A user row as the stack's DynamoDB source table holds it.
fn user_item(row: &Row) -> keyway::domain::Item {
    use keyway::domain::AttrValue;
    row.iter()
        .map(|(column, value)| {
            let value = match value {
                Value::Number(n) => AttrValue::N(n.to_string()),
                Value::Null => AttrValue::Null,
                other => AttrValue::S(other.to_string()),
            };
            (column.clone(), value)
        })
        .collect()
}

/// The filter a stack test may set: a non-key column of each table, which updates change.
const NAME_FILTER: &str = "domains.name != 0 AND users.name < 2";

/// The stack as template.yaml deploys it, on the embedded runtime: `domains` from Debezium on
/// the changes stream, `users` written to the stack's DynamoDB table and re-keyed from its
/// stream; the view table ends as the join of the final tables (of the rows `NAME_FILTER` lets
/// through, when `filtered`), the re-key's `BEFORE_IMAGES` set to `before_images`.
async fn through_the_stack(seed: u64, kind: &str, filtered: bool, before_images: &str) {
    use keyway_local::{FaultPlan, LocalRuntime, LocalServices};
    let mut parameters = BTreeMap::from([("CdcJoinKind".to_owned(), kind.to_owned())]);
    if filtered {
        parameters.insert("CdcFilter".to_owned(), NAME_FILTER.to_owned());
    }
    let services = LocalServices::new(1_767_225_600_000, FaultPlan::default());
    let stored = "BEFORE_IMAGES: sometimes";
    assert_eq!(keyway_stack::TEMPLATE.matches(stored).count(), 1);
    let template =
        keyway_stack::TEMPLATE.replace(stored, &format!("BEFORE_IMAGES: {before_images}"));
    let mut runtime = LocalRuntime::from_template_with(
        &template,
        &parameters,
        services,
        &keyway_stack::functions(),
    )
    .expect("the template runs");
    let resources: BTreeMap<&str, String> = [
        "CdcChangesStream",
        "CdcUsersTable",
        "CdcViewTable",
        "DeadLetterQueue",
    ]
    .into_iter()
    .map(|id| (id, runtime.resource(id).unwrap()))
    .collect();
    let resource = |id: &str| resources[id].clone();
    let (changes_stream, users) = (resource("CdcChangesStream"), resource("CdcUsersTable"));
    let services = runtime.services.clone();
    let users = services.dynamodb.table(&users).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let (records, mut tables) = changes(&mut rng, 250);
    for (table, key, value) in records {
        match (table.as_str(), value) {
            ("users", Some(event)) if event["op"] == "d" => {
                let id: Row = serde_json::from_str(&key).unwrap();
                users.delete_item(&user_item(&id)).unwrap();
            }
            ("users", Some(event)) => {
                let row: Row = serde_json::from_value(event["after"].clone()).unwrap();
                users.put_item(user_item(&row)).unwrap();
            }
            ("users", None) => {}
            (_, value) => {
                let data = value.map_or_else(Vec::new, |v| v.to_string().into_bytes());
                services
                    .kinesis
                    .put_record(&changes_stream, &key, &data)
                    .unwrap();
            }
        }
    }
    runtime
        .run_until_idle(std::time::Duration::from_secs(3600))
        .await
        .expect("the stack goes idle");
    let view = services.dynamodb.table(&resource("CdcViewTable")).unwrap();
    let mut got: BTreeMap<JoinedId, Joined> = BTreeMap::new();
    for item in view.items() {
        if let Some(joined) = joined_of(&item).unwrap() {
            got.insert(joined.id(), joined);
        }
    }
    let kind = if kind == "left" {
        JoinKind::LeftOuter
    } else {
        JoinKind::Inner
    };
    if filtered {
        // What the filter lets through, written out plainly rather than through `Filter`.
        let passes = |table: &str, row: &Row| match table {
            "domains" => row["name"] != json!(0),
            _ => row["name"].as_i64().is_some_and(|n| n < 2),
        };
        let before: usize = tables.values().map(BTreeMap::len).sum();
        for (table, rows) in tables.iter_mut() {
            rows.retain(|_, row| passes(table, row));
        }
        let after: usize = tables.values().map(BTreeMap::len).sum();
        assert!(
            after < before,
            "seed {seed}: the filter let every row through"
        );
    }
    let joined_users = got.values().filter(|j| j.right.is_some()).count();
    assert!(joined_users > 0, "seed {seed}: no domain joined a user");
    assert_eq!(got, oracle(kind, &tables), "seed {seed} {kind:?}: the view");
    let dead_letters =
        keyway_tests::dead_letter_reasons(&services.sqs, &resource("DeadLetterQueue"));
    assert!(dead_letters.is_empty(), "{dead_letters:?}");
    let state = services
        .dynamodb
        .table(&runtime.resource("StateTable").unwrap())
        .unwrap();
    let rekey_rows = state_rows(&state.items(), "cdc-rekey", &["row"]);
    // Trusting whole before images it stores none; otherwise every source row.
    let stores = before_images != "always";
    assert_eq!(
        rekey_rows > 0,
        stores,
        "seed {seed}: {rekey_rows} rows the re-key holds"
    );
}

#[tokio::test(start_paused = true)]
async fn the_stack_joins_debezium_changes_with_a_dynamodb_tables_changes_into_its_view_table() {
    for seed in 0..3 {
        through_the_stack(seed, "inner", false, "sometimes").await;
        through_the_stack(seed, "left", false, "sometimes").await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_stack_whose_filter_names_non_key_columns_of_both_tables_ends_with_the_join_of_the_rows_it_lets_through(
) {
    for seed in 0..3 {
        through_the_stack(seed, "inner", true, "sometimes").await;
        through_the_stack(seed, "left", true, "sometimes").await;
    }
}

/// The users' changes come from a DynamoDB stream of new and old images (an item's removal
/// among them), the domains' from Debezium with whole before images: trusted, stored nowhere.
#[tokio::test(start_paused = true)]
async fn trusting_whole_before_images_the_stack_joins_debezium_and_dynamodb_changes_into_its_view_table(
) {
    for seed in 0..2 {
        through_the_stack(seed, "inner", true, "always").await;
        through_the_stack(seed, "left", false, "always").await;
    }
}

#[tokio::test(start_paused = true)]
async fn trusting_whole_before_images_with_parallelization_factor_ten_the_view_still_ends_as_the_join(
) {
    use cdc_join::rekey::BeforeImages;
    use keyway_local::FaultPlan;
    use keyway_stack::cdc::{final_tables, interleave, replay, Settings};
    use keyway_stack::cdc_changes::{generate, JOIN};
    let events = generate(&small_workload(3));
    let spec = JoinSpec::parse(JOIN, JoinKind::LeftOuter).unwrap();
    let expected = final_tables(&events).join(&spec);
    let settings = Settings {
        shards: 2,
        lanes: 10,
        faults: FaultPlan::all(0.05, 3),
        before_images: BeforeImages::Always,
        ..Settings::new(spec)
    };
    let outcome = replay(&settings, &interleave(events, 3)).await.unwrap();
    let joined = state_rows(&outcome.state_items, "cdc-join", &["left", "right"]);
    assert!(joined > 0, "the join holds rows");
    ends_as(&outcome, &expected, (0, joined), "ParallelizationFactor 10");
}

#[tokio::test(start_paused = true)]
async fn generated_changes_replayed_in_any_interleaving_on_any_shards_end_as_the_join_of_the_final_tables(
) {
    use keyway_stack::cdc::{final_tables, interleave, replay, Settings};
    use keyway_stack::cdc_changes::{generate, Workload, JOIN};
    for seed in 0..4 {
        let events = generate(&Workload {
            truncates: seed as usize % 3,
            ..small_workload(seed)
        });
        let kind = [JoinKind::Inner, JoinKind::LeftOuter][seed as usize % 2];
        let spec = JoinSpec::parse(JOIN, kind).unwrap();
        let expected = final_tables(&events).join(&spec);
        assert!(expected.len() > 20, "the workload joins rows");
        let settings = Settings {
            shards: 1 + seed as usize,
            batch_size: [7, 50, 100, 500][seed as usize],
            ..Settings::new(spec)
        };
        let outcome = replay(&settings, &interleave(events, seed)).await.unwrap();
        assert_eq!(outcome.view, expected, "seed {seed}: the view table");
        assert_eq!(
            folded(&outcome.joined),
            expected,
            "seed {seed}: the changelog"
        );
        assert!(
            outcome.dead_letters.is_empty(),
            "{:?}",
            outcome.dead_letters
        );
    }
}

/// 1,500 changes of 200 domains and 50 users, drawn from `seed`.
fn small_workload(seed: u64) -> keyway_stack::cdc_changes::Workload {
    keyway_stack::cdc_changes::Workload {
        changes: 1_500,
        domains: 200,
        users: 50,
        seed,
        ..Default::default()
    }
}

/// The rows two views differ in, a line each: empty when they are equal.
fn differences(got: &BTreeMap<JoinedId, Joined>, want: &BTreeMap<JoinedId, Joined>) -> String {
    let ids: BTreeSet<&JoinedId> = got.keys().chain(want.keys()).collect();
    let mut text = String::new();
    for id in ids.into_iter().filter(|id| got.get(*id) != want.get(*id)) {
        text += &format!("{id:?}: {:?}, expected {:?}\n", got.get(id), want.get(id));
    }
    text
}

/// Checks that a run ended with the view and the folded joined changelog `expected`, no dead
/// letter, and `rows` source rows held by the re-key and by the join.
fn ends_as(
    outcome: &keyway_stack::cdc::Outcome,
    expected: &BTreeMap<JoinedId, Joined>,
    rows: (usize, usize),
    run: &str,
) {
    assert!(
        outcome.dead_letters.is_empty(),
        "{run} {:?}",
        outcome.dead_letters
    );
    assert_eq!(differences(&outcome.view, expected), "", "{run}: the view");
    assert_eq!(
        &folded(&outcome.joined),
        expected,
        "{run}: the joined changelog"
    );
    let held = (
        state_rows(&outcome.state_items, "cdc-rekey", &["row"]),
        state_rows(&outcome.state_items, "cdc-join", &["left", "right"]),
    );
    assert_eq!(held, rows, "{run}: the rows the re-key and the join hold");
}

/// A change of `table` at `lsn` in the source's log, under its record key.
fn at_lsn(table: &str, key: Value, op: &str, row: Option<Value>, lsn: u64) -> SourceEvent {
    let (before, after) = match op {
        "d" => (row, None),
        _ => (None, row),
    };
    SourceEvent {
        topic: format!("app.public.{table}"),
        key,
        value: Some(json!({
            "before": before, "after": after, "op": op,
            "source": {"connector": "postgresql", "table": table, "snapshot": "false", "lsn": lsn},
        })),
    }
}

#[tokio::test(start_paused = true)]
async fn a_truncate_removes_the_rows_changed_before_it_and_keeps_those_changed_after_wherever_each_travels(
) {
    use keyway_stack::cdc::{final_tables, interleave, replay, Settings};
    let user = |id: u32, lsn: u64| {
        at_lsn(
            "users",
            json!({"id": id}),
            "c",
            Some(json!({"id": id, "name": "u"})),
            lsn,
        )
    };
    let domain = |id: u32, user: u32, op: &str, lsn: u64| {
        let row = json!({"id": id, "user_id": user});
        at_lsn("domains", json!({"id": id}), op, Some(row), lsn)
    };
    let mut events = vec![user(1, 1), user(2, 2)];
    // 40 domains before the truncate, some deleted again, some re-created after it.
    for id in 0..40 {
        events.push(domain(id, 1 + id % 2, "c", 10 + u64::from(id)));
    }
    events.push(domain(3, 2, "d", 60));
    // Debezium Server puts a truncate, which has no record key, under its null key.
    events.push(at_lsn("domains", json!("default"), "t", None, 100));
    for id in [5, 7, 50] {
        events.push(domain(id, 2, "c", 200 + u64::from(id)));
    }
    events.push(domain(7, 2, "d", 300));
    events.push(user(3, 301));
    let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::LeftOuter).unwrap();
    let expected = final_tables(&events).join(&spec);
    let kept: Vec<&str> = expected.keys().map(|(left, _)| left.as_str()).collect();
    assert_eq!(
        kept,
        ["5", "50"],
        "the oracle: only the domains created after the truncate"
    );
    for order in 0..6 {
        // The truncate travels on its own key: any interleaving may put it before or after the
        // changes around it, on another shard.
        let ordered = interleave(events.clone(), order);
        let settings = Settings {
            shards: 1 + order as usize % 3,
            batch_size: [1, 7, 100][order as usize % 3],
            ..Settings::new(spec.clone())
        };
        let outcome = replay(&settings, &ordered).await.unwrap();
        assert_eq!(outcome.failed_sweeps, 0, "order {order}");
        // The users, and the two domains that live on, and nothing of the truncated ones.
        ends_as(&outcome, &expected, (5, 5), &format!("order {order}"));
    }
}

#[tokio::test(start_paused = true)]
async fn a_change_in_a_truncates_own_millisecond_is_kept_in_six_arrival_orders_on_three_layouts() {
    use keyway_stack::cdc::{interleave, replay, Settings};
    // A connector that says only when the database made each change (ts_ms): a change in the
    // truncate's own millisecond cannot be told before or after it, and is taken as after it.
    let domain = |id: u32, ts: i64| SourceEvent {
        topic: "app.public.domains".into(),
        key: json!({ "id": id }),
        value: Some(json!({
            "before": null, "after": {"id": id, "user_id": 1}, "op": "c",
            "source": {"connector": "informix", "table": "domains", "ts_ms": ts},
        })),
    };
    let truncate = SourceEvent {
        topic: "app.public.domains".into(),
        key: json!("default"),
        value: Some(json!({"op": "t", "before": null, "after": null,
                           "source": {"connector": "informix", "table": "domains", "ts_ms": 1_000}})),
    };
    let user = SourceEvent {
        topic: "app.public.users".into(),
        key: json!({"id": 1}),
        value: Some(json!({"before": null, "after": {"id": 1}, "op": "c",
                           "source": {"connector": "informix", "table": "users", "ts_ms": 1}})),
    };
    let events = vec![
        user,
        domain(1, 999),
        domain(2, 1_000),
        truncate,
        domain(3, 1_000),
        domain(4, 1_001),
    ];
    let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::Inner).unwrap();
    for order in 0..6 {
        let settings = Settings {
            shards: 1 + order as usize % 3,
            batch_size: [1, 7, 100][order as usize % 3],
            ..Settings::new(spec.clone())
        };
        let outcome = replay(&settings, &interleave(events.clone(), order))
            .await
            .unwrap();
        assert_eq!(outcome.failed_sweeps, 0, "order {order}");
        let mut kept: Vec<String> = folded(&outcome.joined)
            .into_keys()
            .map(|(left, _)| left)
            .collect();
        kept.sort();
        assert_eq!(kept, ["2", "3", "4"], "order {order}");
    }
}

/// Keys past 64 bits (an Oracle `NUMBER(38)`, a PostgreSQL `NUMERIC(30)` sent as numbers) are
/// read as doubles, which cannot tell 18446744073709551617 from ...618: those changes are
/// dead-lettered, naming the column, rather than taken as one row or one join key.
#[tokio::test(start_paused = true)]
async fn a_key_or_join_column_past_what_a_number_holds_exactly_is_dead_lettered_not_merged() {
    use keyway_stack::cdc::{replay, Settings};
    let big = |digits: &str| serde_json::from_str::<Value>(digits).unwrap();
    let (a, b) = (big("18446744073709551617"), big("18446744073709551618"));
    let events = vec![
        at_lsn("users", json!({"id": 7}), "c", Some(json!({"id": 7})), 1),
        at_lsn(
            "domains",
            json!({ "id": a }),
            "c",
            Some(json!({"id": a, "user_id": 7})),
            2,
        ),
        at_lsn(
            "domains",
            json!({ "id": b }),
            "c",
            Some(json!({"id": b, "user_id": 7})),
            3,
        ),
        at_lsn(
            "domains",
            json!({"id": 1}),
            "c",
            Some(json!({"id": 1, "user_id": a})),
            4,
        ),
        at_lsn(
            "domains",
            json!({"id": 2}),
            "c",
            Some(json!({"id": 2, "user_id": 7})),
            5,
        ),
    ];
    let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::LeftOuter).unwrap();
    let outcome = replay(&Settings::new(spec), &events).await.unwrap();
    let mut letters = outcome.dead_letters.clone();
    letters.sort();
    assert_eq!(letters.len(), 3, "{letters:?}");
    assert!(
        letters[0].starts_with("after.user_id: column \"user_id\" holds 1.8446744073709552e+19"),
        "{letters:?}"
    );
    assert!(
        letters[1..]
            .iter()
            .all(|l| l.starts_with("partitionKey: column \"id\" holds 1.8446744073709552e+19")),
        "{letters:?}"
    );
    let rows: Vec<&str> = outcome.view.keys().map(|(left, _)| left.as_str()).collect();
    assert_eq!(rows, ["2"], "only the row whose keys are exact");
}

#[tokio::test(start_paused = true)]
async fn a_truncate_that_says_nothing_of_where_it_stands_is_dead_lettered_with_its_reason() {
    use keyway_stack::cdc::{replay, Settings};
    let events = vec![
        at_lsn("users", json!({"id": 1}), "c", Some(json!({"id": 1})), 1),
        SourceEvent {
            topic: "app.public.users".into(),
            key: json!("default"),
            value: Some(json!({"op": "t", "before": null, "after": null,
                               "source": {"connector": "postgresql", "table": "users"}})),
        },
    ];
    let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::Inner).unwrap();
    let outcome = replay(&Settings::new(spec), &events).await.unwrap();
    assert_eq!(outcome.dead_letters.len(), 1);
    assert!(
        outcome.dead_letters[0]
            .starts_with("source: a truncate of \"users\" says nothing of where it stands"),
        "{:?}",
        outcome.dead_letters
    );
    assert_eq!(
        state_rows(&outcome.state_items, "cdc-rekey", &["row"]),
        1,
        "the row stays"
    );
}

#[tokio::test(start_paused = true)]
async fn a_join_key_whose_rows_come_and_go_by_the_thousand_keeps_every_deletes_stamp_and_loses_no_change(
) {
    use keyway_stack::cdc::{final_tables, replay, Settings, SourceEvent};
    // Primary keys near Kinesis's 256-character partition key limit: the stamps of 1,600
    // deleted rows of one join key come to some 480 KB, more than one state entry holds.
    let long_id = |n: usize| format!("{n:0>200}");
    let user = json!({"id": 1, "name": "ada"});
    let as_row = |v: &Value| v.as_object().unwrap().clone();
    let mut events = vec![SourceEvent {
        topic: "app.public.users".into(),
        key: json!({"id": 1}),
        value: Some(event("users", "c", None, Some(&as_row(&user)))),
    }];
    for n in 0..1_600 {
        let domain = json!({"id": long_id(n), "user_id": 1});
        let key = json!({ "id": long_id(n) });
        let change = |op: &str, before: Option<&Row>, after: Option<&Row>| SourceEvent {
            topic: "app.public.domains".into(),
            key: key.clone(),
            value: Some(event("domains", op, before, after)),
        };
        events.push(change("c", None, Some(&as_row(&domain))));
        if n % 800 != 0 {
            events.push(change("d", Some(&as_row(&domain)), None));
        }
    }
    let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::Inner).unwrap();
    let expected = final_tables(&events).join(&spec);
    assert_eq!(expected.len(), 2, "two domains stay");
    let outcome = replay(&Settings::new(spec), &events).await.unwrap();
    assert!(
        outcome.dead_letters.is_empty(),
        "{:?}",
        outcome.dead_letters.first()
    );
    assert_eq!(differences(&outcome.view, &expected), "");
}

#[tokio::test(start_paused = true)]
async fn a_pair_too_large_for_a_view_item_is_kept_without_its_rows_and_its_partners_changes_still_apply(
) {
    use keyway_stack::cdc::{final_tables, replay, Settings};
    let as_row = |v: Value| v.as_object().unwrap().clone();
    let user = |name: &str| as_row(json!({"id": 1, "name": name, "bio": "b".repeat(200_000)}));
    let domain =
        |id: u32, notes: usize| as_row(json!({"id": id, "user_id": 1, "notes": "n".repeat(notes)}));
    let put =
        |table: &str, id: u32, op: &str, before: Option<&Row>, after: Option<&Row>| SourceEvent {
            topic: format!("app.public.{table}"),
            key: json!({ "id": id }),
            value: Some(event(table, op, before, after)),
        };
    let (ada, grace) = (user("ada"), user("grace"));
    // Domain 12's notes and the user's bio pass DynamoDB's 400 KB item together; each of the
    // other domains fits beside the user.
    let events = vec![
        put("users", 1, "c", None, Some(&ada)),
        put("domains", 10, "c", None, Some(&domain(10, 10))),
        put("domains", 11, "c", None, Some(&domain(11, 10))),
        put("domains", 12, "c", None, Some(&domain(12, 220_000))),
        put("users", 1, "u", Some(&ada), Some(&grace)),
    ];
    let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::Inner).unwrap();
    let expected = final_tables(&events).join(&spec);
    assert_eq!(expected.len(), 3);
    let outcome = replay(&Settings::new(spec), &events).await.unwrap();
    assert!(
        outcome.dead_letters.is_empty(),
        "{:?}",
        outcome.dead_letters
    );
    assert_eq!(
        outcome.omitted,
        [("12".to_owned(), Some("1".to_owned()))],
        "the large pair is kept without its rows"
    );
    let names: Vec<(&str, &Value)> = outcome
        .view
        .values()
        .map(|j| (j.left_pk.as_str(), &j.right.as_ref().unwrap()["name"]))
        .collect();
    assert_eq!(
        names,
        [("10", &json!("grace")), ("11", &json!("grace"))],
        "the rename reached the pairs that fit"
    );
    let last = outcome
        .joined
        .iter()
        .rev()
        .find(|s| s.change.row().left_pk == "12");
    assert!(
        last.is_some_and(|s| matches!(&s.change, keyway::domain::RowChange::Insert(j)
            if j.right.as_ref().unwrap()["name"] == "grace")),
        "the joined changelog carries the large pair whole"
    );
}

#[tokio::test(start_paused = true)]
async fn a_join_key_whose_rows_were_all_deleted_leaves_its_item_to_go_by_ttl_and_a_live_one_keeps_it(
) {
    use keyway_stack::cdc::{final_tables, replay, Settings};
    let user = |id: u32, op: &str, lsn: u64| {
        at_lsn(
            "users",
            json!({"id": id}),
            op,
            Some(json!({"id": id, "name": "ada"})),
            lsn,
        )
    };
    let domain = |id: u32, user_id: u32, op: &str, lsn: u64| {
        let row = json!({"id": id, "user_id": user_id});
        at_lsn("domains", json!({"id": id}), op, Some(row), lsn)
    };
    // User 1 and its domain come and go; user 2 keeps its domain.
    let events = vec![
        user(1, "c", 1),
        domain(10, 1, "c", 2),
        user(2, "c", 3),
        domain(20, 2, "c", 4),
        domain(10, 1, "d", 5),
        user(1, "d", 6),
    ];
    let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::Inner).unwrap();
    let expected = final_tables(&events).join(&spec);
    let outcome = replay(&Settings::new(spec), &events).await.unwrap();
    assert!(
        outcome.dead_letters.is_empty(),
        "{:?}",
        outcome.dead_letters
    );
    assert_eq!(differences(&outcome.view, &expected), "");
    let heads: Vec<_> = outcome
        .state_items
        .iter()
        .filter(|i| {
            i.get("sk").and_then(|v| v.as_s()) == Some("head")
                && i.get("pk").and_then(|v| v.as_s()).is_some_and(|pk| {
                    pk.starts_with("cdc-join#") && !pk.contains("#signature-history")
                })
        })
        .collect();
    assert_eq!(heads.len(), 2, "a group each");
    let expiring = heads.iter().filter(|i| i.contains_key("ttl")).count();
    assert_eq!(
        (
            expiring,
            state_rows(&outcome.state_items, "cdc-join", &["left", "right"])
        ),
        (1, 2),
        "the emptied group, holding only its deletes' stamps, goes after their window; the \
         group with its two rows stays"
    );
}

#[tokio::test(start_paused = true)]
async fn a_join_key_with_thousands_of_rows_sends_each_change_of_its_other_side_within_the_timeout_at_real_latencies(
) {
    // Each rename of the user retracts and inserts its 2,000 joined rows: 4,000 joined changes
    // to the changelog from one record, one PutRecords call each (20 ms) if they went one after
    // another, 80 s against the function's 30.
    let outcome = rename_a_user_of(2_000, false, Duration::from_secs(30)).await;
    assert_eq!(outcome.timeouts, 0, "no invocation ran out of time");
}

#[tokio::test(start_paused = true)]
async fn a_join_keys_changes_past_what_its_stream_takes_in_a_second_go_out_in_each_joined_rows_order(
) {
    // 12,000 joined changes a rename, on one shard that takes 1,000 records a second: most
    // PutRecords calls are throttled in part, and what failed is sent again without overtaking.
    // The three renames come in one batch, 36 s of sending: the join stops sending near its
    // timeout, commits the renames that went out and leaves the rest to the retry, which sends
    // only what did not go out.
    let outcome = rename_a_user_of(6_000, true, Duration::from_secs(30)).await;
    assert_eq!(outcome.timeouts, 0, "no invocation ran out of time");
    let sent_once = 6_000 + 3 * 12_000;
    assert_eq!(
        outcome.joined.len(),
        sent_once,
        "each joined change goes out once: what went out of a rename is not sent again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_change_whose_joined_changes_take_longer_to_send_than_the_joins_timeout_goes_out_over_several_invocations(
) {
    // A step of a rename joins 6,000 domains: 6 s of sending on a shard that takes 1,000
    // records a second, for a join of a 5 s timeout. Each invocation sends what it can of the
    // step and notes it with the key; the retry sends the rest.
    let outcome = rename_a_user_of(6_000, true, Duration::from_secs(5)).await;
    assert_eq!(outcome.timeouts, 0, "no invocation ran out of time");
    assert_eq!(
        outcome.joined.len(),
        6_000 + 3 * 12_000,
        "each joined change goes out once"
    );
}

/// A user with `domains` domains renamed three times, at real latencies, with the streams'
/// `write_limit` or not, by functions of `timeout`: the view and the folded joined changelog end
/// as the join, and the changelog keeps each joined row's changes in order.
async fn rename_a_user_of(
    domains: u64,
    write_limit: bool,
    timeout: Duration,
) -> keyway_stack::cdc::Outcome {
    use keyway_local::Latencies;
    use keyway_stack::cdc::{final_tables, replay, Settings, SourceEvent};
    use keyway_stack::metering::Metering;
    let user = |name: &str| json!({"id": 1, "name": name}).as_object().unwrap().clone();
    let user_change = |op: &str, before: Option<&Row>, after: Option<&Row>| SourceEvent {
        topic: "app.public.users".into(),
        key: json!({"id": 1}),
        value: Some(event("users", op, before, after)),
    };
    let mut events = vec![user_change("c", None, Some(&user("ada")))];
    for n in 0..domains {
        let domain = json!({"id": n, "user_id": 1}).as_object().unwrap().clone();
        events.push(SourceEvent {
            topic: "app.public.domains".into(),
            key: json!({ "id": n }),
            value: Some(event("domains", "c", None, Some(&domain))),
        });
    }
    // The renames come once every domain is joined.
    let names = ["ada", "grace", "edsger", "barbara"];
    let late: Vec<SourceEvent> = names
        .windows(2)
        .map(|pair| user_change("u", Some(&user(pair[0])), Some(&user(pair[1]))))
        .collect();
    let all: Vec<SourceEvent> = events.iter().chain(&late).cloned().collect();
    let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::Inner).unwrap();
    let expected = final_tables(&all).join(&spec);
    assert_eq!(expected.len(), domains as usize);
    let settings = Settings {
        metering: Metering {
            latencies: Some(Latencies {
                dynamodb: Duration::from_millis(5),
                kinesis: Duration::from_millis(20),
                sqs: Duration::from_millis(15),
            }),
            batching: None,
        },
        write_limit,
        late,
        function_timeout: timeout,
        ..Settings::new(spec)
    };
    let outcome = replay(&settings, &events).await.unwrap();
    assert!(
        outcome.dead_letters.is_empty(),
        "{:?}",
        outcome.dead_letters.first()
    );
    assert_eq!(differences(&outcome.view, &expected), "");
    assert_eq!(differences(&folded(&outcome.joined), &expected), "");
    // The joined changelog keeps each joined row's changes in order, a change sent again after
    // a retry aside (it has the same body).
    let mut seen = BTreeSet::new();
    let mut last: BTreeMap<JoinedId, (String, String)> = BTreeMap::new();
    for stamped in &outcome.joined {
        if !seen.insert(serde_json::to_string(stamped).unwrap()) {
            continue;
        }
        let pair = (stamped.stamp.0 .0.clone(), stamped.stamp.1 .0.clone());
        if let Some(before) = last.insert(stamped.change.row().id(), pair.clone()) {
            assert!(before < pair, "{before:?} then {pair:?}");
        }
    }
    outcome
}

#[tokio::test(start_paused = true)]
async fn a_row_that_an_update_takes_out_of_the_filter_leaves_no_phantom_row_in_the_view_or_the_state(
) {
    use keyway_stack::cdc::{final_tables, replay, Settings, SourceEvent};
    let as_row = |v: Value| v.as_object().unwrap().clone();
    let domains = |op: &str, id: u32, before: Option<Value>, after: Option<Value>| SourceEvent {
        topic: "app.public.domains".into(),
        key: json!({ "id": id }),
        value: Some(event(
            "domains",
            op,
            before.map(as_row).as_ref(),
            after.map(as_row).as_ref(),
        )),
    };
    let domain =
        |id: u32, user: u32, status: &str| json!({"id": id, "user_id": user, "status": status});
    let user = json!({"id": 1, "name": "ada"});
    let events = vec![
        SourceEvent {
            topic: "app.public.users".into(),
            key: json!({"id": 1}),
            value: Some(event("users", "c", None, Some(&as_row(user.clone())))),
        },
        // Matches, then stops matching, then moves to another user while not matching (Flink's
        // FLINK-38579 left the first joined row behind here), then matches again and goes.
        domains("c", 7, None, Some(domain(7, 1, "active"))),
        domains(
            "u",
            7,
            Some(domain(7, 1, "active")),
            Some(domain(7, 1, "parked")),
        ),
        domains(
            "u",
            7,
            Some(domain(7, 1, "parked")),
            Some(domain(7, 2, "parked")),
        ),
        domains(
            "u",
            7,
            Some(domain(7, 2, "parked")),
            Some(domain(7, 1, "active")),
        ),
        domains("d", 7, Some(domain(7, 1, "active")), None),
        // Never matches: nothing of it reaches the join.
        domains("c", 8, None, Some(domain(8, 1, "parked"))),
        // Comes into the filter by an update and stays.
        domains("c", 9, None, Some(domain(9, 1, "parked"))),
        domains(
            "u",
            9,
            Some(domain(9, 1, "parked")),
            Some(domain(9, 1, "active")),
        ),
    ];
    let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::Inner)
        .unwrap()
        .with_filter(cdc_join::filter::Filter::parse(r#"domains.status = "active""#).unwrap())
        .unwrap();
    let expected = final_tables(&events).join(&spec);
    let ids: Vec<_> = expected.keys().cloned().collect();
    assert_eq!(ids, [("9".to_owned(), Some("1".to_owned()))]);
    let outcome = replay(&Settings::new(spec), &events).await.unwrap();
    // The re-key stores every live row (8 and 9, and the user), the join only those that match.
    ends_as(&outcome, &expected, (3, 2), "");
}

#[tokio::test(start_paused = true)]
async fn a_change_from_before_a_truncate_that_comes_after_its_sweeps_leaves_no_row() {
    use keyway_stack::cdc::{final_tables, replay, Settings};
    let user = |id: u32, op: &str, lsn: u64| {
        let row = json!({"id": id, "name": "u"});
        at_lsn("users", json!({ "id": id }), op, Some(row), lsn)
    };
    let domain = |id: u32, user: u32, lsn: u64| {
        let row = json!({"id": id, "user_id": user});
        at_lsn("domains", json!({ "id": id }), "c", Some(row), lsn)
    };
    let events = vec![
        user(1, "c", 1),
        domain(10, 1, 2),
        domain(11, 2, 3),
        at_lsn("users", json!("default"), "t", None, 100),
        user(1, "c", 101),
    ];
    // Changes made before the truncate, on a shard that lags behind until both sweeps are done:
    // a user created and one deleted again, neither of which the truncate left.
    let late = vec![user(2, "c", 5), user(3, "c", 6), user(3, "d", 7)];
    let mut all = events.clone();
    all.splice(3..3, late.clone());
    let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::LeftOuter).unwrap();
    let expected = final_tables(&all).join(&spec);
    let partners: Vec<_> = expected.keys().cloned().collect();
    assert_eq!(
        partners,
        [
            ("10".to_owned(), Some("1".to_owned())),
            ("11".to_owned(), None)
        ]
    );
    let settings = Settings {
        late,
        ..Settings::new(spec)
    };
    let outcome = replay(&settings, &events).await.unwrap();
    ends_as(&outcome, &expected, (3, 3), "");
}

#[tokio::test(start_paused = true)]
async fn the_stacks_schedule_sweeps_the_rows_of_a_truncated_table_out_of_its_view_table() {
    use keyway_local::{FaultPlan, LocalRuntime, LocalServices};
    let services = LocalServices::new(1_767_225_600_000, FaultPlan::default());
    let mut runtime = LocalRuntime::from_template_with(
        keyway_stack::TEMPLATE,
        &BTreeMap::from([("CdcJoinKind".to_owned(), "left".to_owned())]),
        services,
        &keyway_stack::functions(),
    )
    .expect("the template runs");
    let changes = runtime.resource("CdcChangesStream").unwrap();
    let (view, dead_letter_queue) = (
        runtime.resource("CdcViewTable").unwrap(),
        runtime.resource("DeadLetterQueue").unwrap(),
    );
    let services = runtime.services.clone();
    let domain = |id: u32, op: &str, lsn: u64| {
        let row = json!({"id": id, "user_id": 1});
        at_lsn("domains", json!({ "id": id }), op, Some(row), lsn)
    };
    let mut events: Vec<SourceEvent> = (0..30)
        .map(|id| domain(id, "c", 1 + u64::from(id)))
        .collect();
    events.push(at_lsn("domains", json!("default"), "t", None, 100));
    events.push(domain(7, "c", 101));
    for event in &events {
        let data = event.value.as_ref().unwrap().to_string().into_bytes();
        services
            .kinesis
            .put_record(&changes, &event.key.to_string(), &data)
            .unwrap();
    }
    runtime
        .run_until_idle(std::time::Duration::from_secs(3600))
        .await
        .expect("the stack goes idle");
    // The stack's settle time (30 minutes) and a few sweeps more.
    runtime
        .run_for(std::time::Duration::from_secs(40 * 60))
        .await;
    runtime
        .run_until_idle(std::time::Duration::from_secs(3600))
        .await
        .expect("the stack goes idle");
    let rows: Vec<JoinedId> = services
        .dynamodb
        .table(&view)
        .unwrap()
        .items()
        .iter()
        .filter_map(|item| joined_of(item).unwrap())
        .map(|joined| joined.id())
        .collect();
    assert_eq!(
        rows,
        [("7".to_owned(), None)],
        "only the domain created after the truncate"
    );
    let sweeps: Vec<_> = runtime
        .schedules()
        .into_iter()
        .filter(|(name, _)| name.starts_with("CdcRekeyFunction/"))
        .collect();
    assert_eq!(sweeps.len(), 1, "{sweeps:?}");
    assert!(
        sweeps[0].1.invocations >= 40 && sweeps[0].1.errors == 0,
        "{sweeps:?}"
    );
    let dead_letters = keyway_tests::dead_letter_reasons(&services.sqs, &dead_letter_queue);
    assert!(dead_letters.is_empty(), "{dead_letters:?}");
}

/// A re-key's state holding 2,500 domains stored before a truncate at lsn 10,000 and 10 after
/// it (pages of the scan hold 1,000 items), and the sweeper of that state.
async fn truncated_domains(services: &keyway_local::LocalServices) -> cdc_join::truncate::Sweeper {
    use keyway::domain::{KeyState, SlotData};
    use keyway::operator::BROADCAST_KEY;
    use keyway::ports::Commit;
    use keyway_local::KeySchema;
    use serde_json::value::RawValue;
    services
        .dynamodb
        .create_table("state", KeySchema::state_table(), None, None);
    services.kinesis.create_stream("changelog", 1);
    let dead = services.sqs.create_queue("dead");
    let env = keyway::lambda::env_of(&[
        ("JOIN", "domains.user_id=users.id"),
        ("STATE_TABLE", "state"),
        ("CHANGELOG_SINK", "kinesis:changelog"),
        ("DEAD_LETTER_SINK", &format!("sqs:{dead}")),
    ]);
    let sweeper = cdc_join::wiring::rekey_handler(services, &env)
        .unwrap()
        .sweeper;
    let state = |slot: &str, value: Value| {
        let mut state = KeyState::default();
        let raw = RawValue::from_string(value.to_string()).unwrap();
        state.slots.insert(slot.into(), SlotData::fresh(vec![raw]));
        state
    };
    let mut commits: Vec<Commit> = (0..2_510u64)
        .map(|id| {
            let lsn = if id < 2_500 { id } else { 20_000 + id };
            let stored = json!({"row": {"id": id, "user_id": 1}, "at": {"lsn": lsn}, "seq": "7"});
            Commit::new(format!("domains#{id}"), 0, state("row", stored))
        })
        .collect();
    let fence = json!({"domains": {"lsn": 10_000}});
    commits.push(Commit::new(BROADCAST_KEY, 0, state("truncated", fence)));
    for result in sweeper.store.commit(&sweeper.namespace, commits).await {
        result.unwrap();
    }
    sweeper
}

#[tokio::test]
async fn a_sweep_its_deadline_stops_goes_on_where_it_stopped_at_the_next_run_and_sweeps_each_row_once(
) {
    use keyway::ports::Clock;
    use keyway_local::{FaultPlan, LocalServices};
    let services = LocalServices::new(1_767_225_600_000, FaultPlan::default());
    let sweeper = truncated_domains(&services).await;
    // Each run's deadline is already near: it sweeps a page and stops.
    let (mut runs, mut rows) = (0, 0);
    loop {
        let report = sweeper
            .sweep(Some(services.clock.now_millis()))
            .await
            .unwrap();
        runs += 1;
        rows += report.rows;
        if !report.unfinished {
            assert_eq!(report.tables, 1);
            break;
        }
        assert!(runs < 100, "the sweep never ends");
    }
    assert!(runs > 2, "the sweep went in {runs} runs");
    assert_eq!(rows, 2_500);
    assert_eq!(
        services.kinesis.trim("changelog").len(),
        2_500,
        "one delete a row"
    );
    let items = services.dynamodb.table("state").unwrap().items();
    assert_eq!(state_rows(&items, "cdc-rekey", &["row"]), 10);
}

/// A table whose name goes on past a truncated table's and `#` (`domains#old` beside
/// `domains`): its rows share the truncated table's key prefix in the re-key's state, and the
/// sweep took them as its own, retracting and removing rows no truncate touched.
#[tokio::test]
async fn a_truncates_sweep_leaves_the_rows_of_a_table_whose_name_only_starts_with_its_tables() {
    use keyway::domain::{KeyState, SlotData};
    use keyway::ports::Commit;
    use keyway_local::{FaultPlan, LocalServices};
    use serde_json::value::RawValue;
    let services = LocalServices::new(1_767_225_600_000, FaultPlan::default());
    let sweeper = truncated_domains(&services).await;
    let stored = json!({"row": {"id": 5, "user_id": 1}, "at": {"lsn": 3}, "seq": "7"});
    let mut state = KeyState::default();
    let raw = RawValue::from_string(stored.to_string()).unwrap();
    state.slots.insert("row".into(), SlotData::fresh(vec![raw]));
    let other = "domains#old#5".to_owned();
    let commit = Commit::new(other.clone(), 0, state);
    for result in sweeper.store.commit(&sweeper.namespace, vec![commit]).await {
        result.unwrap();
    }
    for _ in 0..100 {
        let report = sweeper.sweep(None).await.unwrap();
        if !report.unfinished {
            break;
        }
    }
    let kept = sweeper
        .store
        .load(&sweeper.namespace, std::slice::from_ref(&other))
        .await
        .unwrap();
    assert!(
        kept[&other].slots.contains_key("row"),
        "the other table's row stays"
    );
    assert_eq!(
        services.kinesis.trim("changelog").len(),
        2_500,
        "one delete a row of domains, none for the other table"
    );
}

#[tokio::test]
async fn a_sweep_that_crashes_part_way_keeps_what_it_removed_and_a_few_runs_end_it() {
    use cdc_join::truncate::Sweeper;
    use keyway_local::{CrashBeforeCommit, FaultPlan, Faults, LocalServices};
    let services = LocalServices::new(1_767_225_600_000, FaultPlan::default());
    let sweeper = truncated_domains(&services).await;
    // The process dies at 5% of its commits, as the chaos runs make it: a sweep that made a
    // commit a row would remove some twenty rows a run.
    let crashing = Faults::new(
        FaultPlan {
            crash_before_commit: 0.05,
            seed: 3,
            ..FaultPlan::default()
        },
        0,
    );
    let sweeper = Arc::new(Sweeper {
        store: Arc::new(CrashBeforeCommit::new(
            sweeper.store.clone(),
            Arc::new(crashing),
        )),
        ..sweeper
    });
    let (mut runs, mut crashed) = (0, 0);
    loop {
        runs += 1;
        let run = sweeper.clone();
        match tokio::spawn(async move { run.sweep(None).await }).await {
            Ok(report) if !report.as_ref().unwrap().unfinished => break,
            Ok(_) => {}
            Err(died) if died.is_panic() => crashed += 1,
            Err(other) => panic!("{other}"),
        }
        assert!(
            runs < 10,
            "{runs} runs, {crashed} crashed, and the sweep goes on"
        );
    }
    let items = services.dynamodb.table("state").unwrap().items();
    assert_eq!(state_rows(&items, "cdc-rekey", &["row"]), 10);
    let deletes: BTreeSet<String> = services
        .kinesis
        .trim("changelog")
        .iter()
        .map(|r| String::from_utf8_lossy(&r.data).into_owned())
        .collect();
    assert_eq!(deletes.len(), 2_500, "one delete a row, whoever sent it");
}

#[tokio::test(start_paused = true)]
async fn trusting_whole_before_images_the_rekey_stores_no_row_reads_half_the_state_and_the_view_still_ends_as_the_join_under_faults(
) {
    use cdc_join::rekey::BeforeImages;
    use keyway_local::FaultPlan;
    use keyway_stack::cdc::{final_tables, interleave, replay, Settings};
    use keyway_stack::cdc_changes::{generate, JOIN};
    for seed in 0..2u64 {
        let events = generate(&small_workload(seed));
        let kind = [JoinKind::Inner, JoinKind::LeftOuter][seed as usize % 2];
        let spec = JoinSpec::parse(JOIN, kind).unwrap();
        let expected = final_tables(&events).join(&spec);
        let ordered = interleave(events, seed);
        let settings = |before_images, faults| Settings {
            shards: 1 + seed as usize,
            batch_size: [7, 100][seed as usize],
            faults,
            before_images,
            ..Settings::new(spec.clone())
        };
        let run = |before_images, faults| {
            let settings = settings(before_images, faults);
            let ordered = ordered.clone();
            async move { replay(&settings, &ordered).await.unwrap() }
        };
        let stored = run(BeforeImages::Sometimes, FaultPlan::default()).await;
        let trusted = run(BeforeImages::Always, FaultPlan::default()).await;
        let joined_rows = state_rows(&stored.state_items, "cdc-join", &["left", "right"]);
        ends_as(
            &trusted,
            &expected,
            (0, joined_rows),
            &format!("seed {seed}"),
        );
        let state = |outcome: &keyway_stack::cdc::Outcome| outcome.meters["cdc-state"].clone();
        let (before, after) = (state(&stored), state(&trusted));
        // The join's reads and writes are left: about one of each a change, as the re-key's were.
        assert!(
            after.read_units < 0.6 * before.read_units
                && after.write_units < 0.6 * before.write_units,
            "seed {seed}: the state's units {} read, {} written against {} and {}",
            after.read_units,
            after.write_units,
            before.read_units,
            before.write_units
        );
        let faulty = run(BeforeImages::Always, FaultPlan::all(0.05, seed)).await;
        ends_as(
            &faulty,
            &expected,
            (0, joined_rows),
            &format!("seed {seed}, every fault at 5%"),
        );
    }
}

#[tokio::test(start_paused = true)]
async fn trusting_whole_before_images_a_change_without_one_and_a_truncate_are_dead_lettered_with_their_reasons(
) {
    use cdc_join::rekey::BeforeImages;
    use keyway_stack::cdc::{replay, Settings};
    let user = |op: &str, before: Option<Value>, after: Option<Value>, lsn: u64| SourceEvent {
        topic: "app.public.users".into(),
        key: json!({"id": 1}),
        value: Some(json!({
            "before": before, "after": after, "op": op,
            "source": {"connector": "postgresql", "table": "users", "snapshot": "false", "lsn": lsn},
        })),
    };
    let events = vec![
        user("c", None, Some(json!({"id": 1, "name": "a"})), 1),
        // REPLICA IDENTITY DEFAULT: the key columns only, or nothing.
        user(
            "u",
            Some(json!({"id": 1})),
            Some(json!({"id": 1, "name": "b"})),
            2,
        ),
        user("d", None, None, 3),
        at_lsn("users", json!("default"), "t", None, 4),
    ];
    let spec = JoinSpec::parse("domains.user_id=users.id", JoinKind::LeftOuter).unwrap();
    let settings = Settings {
        shards: 1,
        before_images: BeforeImages::Always,
        ..Settings::new(spec)
    };
    let outcome = replay(&settings, &events).await.unwrap();
    let mut reasons = outcome.dead_letters.clone();
    reasons.sort();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(
        reasons[0].starts_with("before: missing: with BEFORE_IMAGES=always"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].starts_with("before: without the column \"name\""),
        "{reasons:?}"
    );
    assert!(
        reasons[2].starts_with("op: a truncate of \"users\""),
        "{reasons:?}"
    );
    assert_eq!(state_rows(&outcome.state_items, "cdc-rekey", &["row"]), 0);
}
