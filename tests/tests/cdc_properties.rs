//! The CDC join's promises as properties: for random sequences of changes to both tables
//! (inserts, renames, domains moved to another user or to none, primary keys changed as Debezium
//! sends it, deletes with their tombstones, truncates, events sent twice), random shard counts, batch sizes
//! and interleavings of the rows, with and without a filter on a column that updates change, with
//! and without every fault of the embedded runtime, the view table and the folded joined changelog
//! equal the join of the final tables, the re-key holds exactly the live source rows and the join
//! exactly those the filter lets through. The same without truncates with the re-key trusting
//! whole before images, when it holds no row.

use std::collections::BTreeMap;

use cdc_join::filter::Filter;
use cdc_join::rekey::BeforeImages;
use cdc_join::spec::{JoinKind, JoinSpec};
use keyway_local::FaultPlan;
use keyway_stack::cdc::{final_tables, interleave, replay, Settings, SourceEvent};
use keyway_tests::cdc::{folded, state_rows};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

type Row = Map<String, Value>;

/// One change a script asks for; what it does depends on the rows as they are then.
#[derive(Clone, Debug)]
struct Op {
    domains: bool,
    id: u32,
    /// 0: insert or rename, 1: move to another user, 2: change the primary key, 3: delete.
    kind: u8,
    /// A domain's user, 0 for none.
    user: u32,
    /// The primary key a row moves to.
    to: u32,
    twice: bool,
    /// Truncates the table instead.
    truncate: bool,
}

fn op() -> impl Strategy<Value = Op> {
    (
        any::<bool>(),
        0..6u32,
        0..4u8,
        0..4u32,
        6..10u32,
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.04),
    )
        .prop_map(|(domains, id, kind, user, to, twice, truncate)| Op {
            domains,
            id,
            kind,
            user,
            to,
            twice,
            truncate,
        })
}

/// The script as Debezium change events, under their record keys, in the order made.
fn events(script: &[Op]) -> Vec<SourceEvent> {
    let mut rows: BTreeMap<(bool, u32), Row> = BTreeMap::new();
    let mut out = Vec::new();
    let mut name = 0;
    // Each change's place in the source's log (PostgreSQL's lsn): what orders a truncate against
    // the rows' changes, which travel apart from it.
    let lsn = std::cell::Cell::new(0u64);
    for op in script {
        let table = if op.domains { "domains" } else { "users" };
        if op.truncate {
            lsn.set(lsn.get() + 1);
            // Debezium Server puts a truncate, which has no record key, under its null key.
            let event = SourceEvent {
                topic: format!("app.public.{table}"),
                key: json!("default"),
                value: Some(json!({"before": null, "after": null, "op": "t",
                    "source": {"connector": "postgresql", "table": table, "snapshot": "false",
                               "lsn": lsn.get()}})),
            };
            if op.twice {
                out.push(event.clone());
            }
            out.push(event);
            rows.retain(|(domains, _), _| *domains != op.domains);
            continue;
        }
        let mut put = |id: u32, value: Option<Value>| {
            let event = SourceEvent {
                topic: format!("app.public.{table}"),
                key: json!({ "id": id }),
                value,
            };
            if op.twice {
                out.push(event.clone());
            }
            out.push(event);
        };
        let change = |op: &str, before: Option<&Row>, after: Option<&Row>| {
            lsn.set(lsn.get() + 1);
            json!({"before": before, "after": after, "op": op,
                   "source": {"connector": "postgresql", "table": table, "snapshot": "false",
                              "lsn": lsn.get()}})
        };
        name += 1;
        let mut row = Row::new();
        row.insert("id".into(), json!(op.id));
        row.insert("name".into(), json!(name));
        if op.domains {
            let user = if op.user == 0 {
                Value::Null
            } else {
                json!(op.user)
            };
            row.insert("user_id".into(), user);
        }
        let key = (op.domains, op.id);
        match (rows.get(&key).cloned(), op.kind) {
            (None, _) => {
                // A row created again may be created as it was: a few names only, and the
                // domain's user as drawn.
                row.insert("name".into(), json!(op.to % 2));
                put(op.id, Some(change("c", None, Some(&row))));
                rows.insert(key, row);
            }
            (Some(old), 0 | 1) => {
                let mut new = old.clone();
                if op.kind == 0 || !op.domains {
                    new.insert("name".into(), json!(name));
                } else {
                    new.insert("user_id".into(), row["user_id"].clone());
                }
                put(op.id, Some(change("u", Some(&old), Some(&new))));
                rows.insert(key, new);
            }
            (Some(old), 2) if !rows.contains_key(&(op.domains, op.to)) => {
                put(op.id, Some(change("d", Some(&old), None)));
                put(op.id, None);
                let mut moved = old.clone();
                moved.insert("id".into(), json!(op.to));
                put(op.to, Some(change("c", None, Some(&moved))));
                rows.remove(&key);
                rows.insert((op.domains, op.to), moved);
            }
            (Some(old), _) => {
                put(op.id, Some(change("d", Some(&old), None)));
                put(op.id, None);
                rows.remove(&key);
            }
        }
    }
    out
}

/// How a script is run: the property's other arguments.
#[derive(Clone, Debug)]
struct Run {
    shards: usize,
    batch_size: usize,
    order: u64,
    faults: Option<u64>,
    left_outer: bool,
    filter: Option<(bool, bool, u32)>,
}

/// Any shard count, batch size, interleaving, faults or none, kind of join, and filter or none.
fn run() -> impl Strategy<Value = Run> {
    (
        1..5usize,
        prop::sample::select(vec![1usize, 3, 10, 100]),
        any::<u64>(),
        prop::option::of(any::<u64>()),
        any::<bool>(),
        prop::option::of((any::<bool>(), any::<bool>(), 0..60u32)),
    )
        .prop_map(
            |(shards, batch_size, order, faults, left_outer, filter)| Run {
                shards,
                batch_size,
                order,
                faults,
                left_outer,
                filter,
            },
        )
}

/// Runs `script` as `run` says, with the re-key's `before_images`, and checks the view, the
/// folded joined changelog and the rows each operator holds.
fn check(script: &[Op], run: Run, before_images: BeforeImages) -> Result<(), TestCaseError> {
    let kind = if run.left_outer {
        JoinKind::LeftOuter
    } else {
        JoinKind::Inner
    };
    // A filter on a column that updates change (renames only raise it): rows leave it (`<`)
    // or come into it (`>=`).
    let filter = run
        .filter
        .map_or_else(String::new, |(domains, below, name)| {
            let table = if domains { "domains" } else { "users" };
            format!("{table}.name {} {name}", if below { "<" } else { ">=" })
        });
    let spec = JoinSpec::parse("domains.user_id=users.id", kind)
        .unwrap()
        .with_filter(Filter::parse(&filter).unwrap())
        .unwrap();
    let events = events(script);
    let tables = final_tables(&events);
    let expected = tables.join(&spec);
    let settings = Settings {
        shards: run.shards,
        batch_size: run.batch_size,
        faults: run
            .faults
            .map_or_else(FaultPlan::default, |seed| FaultPlan::all(0.05, seed)),
        before_images,
        ..Settings::new(spec.clone())
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let outcome = runtime
        .block_on(replay(&settings, &interleave(events, run.order)))
        .unwrap();
    prop_assert_eq!(&outcome.view, &expected, "the view table");
    prop_assert_eq!(&folded(&outcome.joined), &expected, "the joined changelog");
    prop_assert!(
        outcome.dead_letters.is_empty(),
        "{:?}",
        outcome.dead_letters
    );
    let live = match before_images {
        BeforeImages::Sometimes => tables.len(),
        BeforeImages::Always => 0,
    };
    prop_assert_eq!(
        state_rows(&outcome.state_items, "cdc-rekey", &["row"]),
        live
    );
    // The join holds the rows the filter lets through, and no other.
    let taking_part = tables
        .rows
        .iter()
        .map(|(table, rows)| {
            rows.values()
                .filter(|row| spec.takes_part(table, row))
                .count()
        })
        .sum::<usize>();
    prop_assert_eq!(
        state_rows(&outcome.state_items, "cdc-join", &["left", "right"]),
        taking_part
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_changes_on_any_shards_in_any_interleaving_under_faults_leave_the_join_of_the_final_tables_and_no_stale_state(
        script in prop::collection::vec(op(), 1..80),
        run in run(),
    ) {
        check(&script, run, BeforeImages::Sometimes)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Every update and delete the script makes carries the whole row before it: the re-key
    /// trusts them, keeps no row, and takes no truncate (the script makes none).
    #[test]
    fn trusting_whole_before_images_any_changes_without_truncates_leave_the_join_of_the_final_tables(
        script in prop::collection::vec(op(), 1..80),
        run in run(),
    ) {
        let script: Vec<Op> = script.into_iter().map(|op| Op { truncate: false, ..op }).collect();
        check(&script, run, BeforeImages::Always)?;
    }
}
