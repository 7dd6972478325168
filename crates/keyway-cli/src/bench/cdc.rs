//! `keyway bench cdc`: the CDC join against a design that keeps the whole joined row set of a
//! join key in one item, in one run, on the same generated changes (`domains.user_id=users.id`;
//! 10% of domain updates move the domain to another user; a large customer holds 2% of the
//! domains).
//!
//! - keyway: the re-key and the join on the embedded runtime, one shard, each row's state and
//!   each joined row an item of its own, the view in its table; and again with the re-key
//!   trusting the changes' whole before images (`BEFORE_IMAGES=always`), storing no row, as the
//!   whole-set design trusts them.
//! - whole set per join key: for each change, read the item of every join key it touches (the
//!   old and the new), put back the item with both sides' rows (the join key's joined rows, to
//!   whoever reads it). The change's before image says where the row was; nothing else is kept.
//!
//! Both designs' results are checked against the join of the final tables. Figures: DynamoDB
//! capacity units per 1,000 changes, as the in-memory table bills them (keyway's also by table:
//! its state, and the view, which the whole-set design does not keep), and changes per second
//! per core of CPU time. Ratios compare figures of the same run.

use std::collections::BTreeMap;
use std::time::Duration;

use cdc_join::join::{Joined, JoinedId};
use cdc_join::oracle::Tables;
use cdc_join::rekey::{primary_key, BeforeImages};
use cdc_join::spec::{JoinKey, JoinKind, JoinSpec, Side};
use keyway::adapters::dynamodb::{Expect, ItemKey, Table, WriteRequest};
use keyway::domain::changelog::debezium_changes;
use keyway::domain::debezium::{decode_key, decode_record, DebeziumEvent, Row};
use keyway::domain::{AttrValue, RowChange};
use keyway_local::{thread_cpu_time, LocalTable, MeterSnapshot};
use keyway_stack::cdc::{final_tables, interleave, replay, Settings, SourceEvent};
use keyway_stack::cdc_changes::{generate, Workload, JOIN};
use serde::Serialize;

use crate::error::CliError;

#[derive(Serialize)]
pub(super) struct Design {
    pub capacity_units_per_1000_changes: f64,
    pub read_units_per_1000_changes: f64,
    pub write_units_per_1000_changes: f64,
    pub changes_per_second_per_core: f64,
    /// The largest item the design wrote, in bytes.
    pub largest_item_bytes: usize,
}

/// One table's share of a design's capacity units.
#[derive(Serialize)]
pub(super) struct TableUnits {
    pub read_units_per_1000_changes: f64,
    pub write_units_per_1000_changes: f64,
}

#[derive(Serialize)]
pub(super) struct CdcBench {
    pub changes: usize,
    /// Change events, tombstones and events sent twice included.
    pub events: usize,
    pub join_key_updates: f64,
    pub seed: u64,
    pub view_rows: usize,
    pub keyway: Design,
    /// keyway's capacity units by table: the state (the re-key's rows and the join's groups)
    /// and the view, which the whole-set design does not keep.
    pub keyway_by_table: BTreeMap<String, TableUnits>,
    /// keyway with the re-key trusting whole before images: it stores no row.
    pub keyway_trusting_before_images: Design,
    pub keyway_trusting_before_images_by_table: BTreeMap<String, TableUnits>,
    pub whole_set_per_join_key: Design,
    pub capacity_units_vs_whole_set: f64,
    pub changes_per_second_vs_whole_set: f64,
    pub trusting_before_images_capacity_units_vs_whole_set: f64,
}

/// keyway's run over `events` (of `changes` changes), with the re-key's `before_images`: its
/// design, and its capacity units by table; an error unless its view ends as `expected`.
fn keyway_run(
    runtime: &tokio::runtime::Runtime,
    (spec, events, changes): (&JoinSpec, &[SourceEvent], usize),
    before_images: BeforeImages,
    expected: &BTreeMap<JoinedId, Joined>,
) -> Result<(Design, BTreeMap<String, TableUnits>), CliError> {
    let settings = Settings {
        shards: 1,
        before_images,
        ..Settings::new(spec.clone())
    };
    let start = thread_cpu_time();
    let outcome = runtime.block_on(replay(&settings, events))?;
    let cpu = thread_cpu_time() - start;
    if outcome.view != *expected {
        return Err("keyway's view did not end as the join of the final tables".into());
    }
    let mut meter = MeterSnapshot::default();
    let mut by_table = BTreeMap::new();
    let per_1000 = |units: f64| units * 1000.0 / changes.max(1) as f64;
    for (table, snapshot) in &outcome.meters {
        meter.read_units += snapshot.read_units;
        meter.write_units += snapshot.write_units;
        let units = TableUnits {
            read_units_per_1000_changes: per_1000(snapshot.read_units),
            write_units_per_1000_changes: per_1000(snapshot.write_units),
        };
        by_table.insert(table.clone(), units);
    }
    Ok((design(&meter, cpu, changes, outcome.largest_item), by_table))
}

/// The rows of one join key as the whole-set design keeps them: both sides by primary key.
#[derive(Default, Serialize, serde::Deserialize)]
struct Group {
    left: BTreeMap<String, Row>,
    right: BTreeMap<String, Row>,
}

/// The whole-set design over `events`, in their order; its table and its join of the final rows.
async fn whole_set(
    spec: &JoinSpec,
    events: &[SourceEvent],
) -> Result<(LocalTable, BTreeMap<JoinedId, Joined>), CliError> {
    let table = LocalTable::new();
    let failed = |e: keyway::ports::StoreError| CliError::from(format!("whole-set design: {e}"));
    for event in events {
        let Some(value) = &event.value else { continue };
        // Decoded here, as the re-key decodes each record: both designs' CPU includes it.
        let (Ok(DebeziumEvent::Change(change)), Ok(key)) = (
            decode_record(value.to_string().as_bytes()),
            decode_key(&event.key),
        ) else {
            continue;
        };
        let Some(table_name) = change.source.table.as_deref() else {
            continue;
        };
        let Some(side) = spec.side(table_name) else {
            continue;
        };
        let pk = primary_key(&key);
        // Every join key the change touches, with what it does there.
        let mut touched: BTreeMap<String, Vec<RowChange<Row>>> = BTreeMap::new();
        for step in debezium_changes(&change, None) {
            if let JoinKey::Value(group) = spec.join_key(side, step.row()) {
                touched.entry(group).or_default().push(step);
            }
        }
        for (group, steps) in touched {
            let item_key = ItemKey {
                pk: group,
                sk: "-".into(),
            };
            let stored = table.get(&item_key).await.map_err(failed)?;
            let mut rows: Group = stored
                .as_ref()
                .and_then(|item| item.get("rows")?.as_s().map(serde_json::from_str))
                .transpose()
                .map_err(|e| format!("whole-set design: {e}"))?
                .unwrap_or_default();
            let side_rows = match side {
                Side::Left => &mut rows.left,
                Side::Right => &mut rows.right,
            };
            for step in steps {
                match step {
                    RowChange::Delete(_) => side_rows.remove(&pk),
                    RowChange::Insert(row) => side_rows.insert(pk.clone(), row),
                };
            }
            if rows.left.is_empty() && rows.right.is_empty() {
                let delete = vec![WriteRequest::Delete(item_key)];
                table.batch_write(delete).await.map_err(failed)?;
                continue;
            }
            let mut item = item_key.to_item();
            let text = serde_json::to_string(&rows).map_err(|e| e.to_string())?;
            item.insert("rows".into(), AttrValue::S(text));
            table.put(&item, &Expect::Anything).await.map_err(failed)?;
        }
    }
    let joined = joined_of_groups(spec, &table)?;
    Ok((table, joined))
}

/// The join the whole-set items hold: each item's rows joined, as a reader of them would.
fn joined_of_groups(
    spec: &JoinSpec,
    table: &LocalTable,
) -> Result<BTreeMap<JoinedId, Joined>, CliError> {
    let mut tables = Tables::default();
    for item in table.items() {
        let text = item.get("rows").and_then(AttrValue::as_s).unwrap_or("{}");
        let rows: Group = serde_json::from_str(text).map_err(|e| e.to_string())?;
        for (side, rows) in [(Side::Left, rows.left), (Side::Right, rows.right)] {
            let held = tables.rows.entry(spec.table(side).to_owned()).or_default();
            held.extend(rows);
        }
    }
    Ok(tables.join(spec))
}

fn design(meter: &MeterSnapshot, cpu: Duration, changes: usize, largest: usize) -> Design {
    let per_1000 = |units: f64| units * 1000.0 / changes.max(1) as f64;
    Design {
        capacity_units_per_1000_changes: per_1000(meter.capacity_units()),
        read_units_per_1000_changes: per_1000(meter.read_units),
        write_units_per_1000_changes: per_1000(meter.write_units),
        changes_per_second_per_core: changes as f64 / cpu.as_secs_f64().max(1e-9),
        largest_item_bytes: largest,
    }
}

fn largest_item(table: &LocalTable) -> usize {
    table
        .items()
        .iter()
        .map(keyway::domain::item::item_size)
        .max()
        .unwrap_or(0)
}

/// `keyway bench cdc`'s arguments.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[arg(long, default_value_t = 20_000)]
    pub changes: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn run(args: Args) -> Result<(), CliError> {
    let Args {
        changes,
        seed,
        json,
    } = args;
    if changes == 0 {
        return Err(CliError::option("--changes", "must be at least 1"));
    }
    let workload = Workload {
        changes,
        seed,
        ..Workload::default()
    };
    let events = interleave(generate(&workload), seed);
    let spec = JoinSpec::parse(JOIN, JoinKind::Inner).map_err(|e| e.to_string())?;
    let expected = final_tables(&events).join(&spec);
    let runtime = crate::job::runtime_builder(true);

    let start = thread_cpu_time();
    let (table, whole_view) = runtime.block_on(whole_set(&spec, &events))?;
    let whole_cpu = thread_cpu_time() - start;
    if whole_view != expected {
        return Err("the whole-set design did not end with the join of the final tables".into());
    }
    let whole = design(
        &table.meter().snapshot(),
        whole_cpu,
        changes,
        largest_item(&table),
    );

    let run = |images| keyway_run(&runtime, (&spec, &events, changes), images, &expected);
    let (keyway, keyway_by_table) = run(BeforeImages::Sometimes)?;
    let (trusting, trusting_by_table) = run(BeforeImages::Always)?;
    let bench = CdcBench {
        changes,
        events: events.len(),
        join_key_updates: workload.join_key_updates,
        seed,
        view_rows: expected.len(),
        capacity_units_vs_whole_set: keyway.capacity_units_per_1000_changes
            / whole.capacity_units_per_1000_changes,
        changes_per_second_vs_whole_set: keyway.changes_per_second_per_core
            / whole.changes_per_second_per_core,
        trusting_before_images_capacity_units_vs_whole_set: trusting
            .capacity_units_per_1000_changes
            / whole.capacity_units_per_1000_changes,
        keyway,
        keyway_by_table,
        keyway_trusting_before_images: trusting,
        keyway_trusting_before_images_by_table: trusting_by_table,
        whole_set_per_join_key: whole,
    };
    if json {
        let text = serde_json::to_string_pretty(&bench).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        print!("{}", report(&bench));
    }
    Ok(())
}

fn report(b: &CdcBench) -> String {
    let design = |name: &str, d: &Design| {
        format!(
            "  {name:<30} {:>8.1} capacity units / 1,000 changes ({:.1} read, {:.1} write), {:>8.0} changes/s/core, largest item {} bytes\n",
            d.capacity_units_per_1000_changes,
            d.read_units_per_1000_changes,
            d.write_units_per_1000_changes,
            d.changes_per_second_per_core,
            d.largest_item_bytes
        )
    };
    let mut text = format!(
        "keyway bench cdc: {} changes ({} events) of domains and users, {JOIN}, {:.0}% of domain updates moving the join key, seed {}; the view ends with {} rows in both designs\n\n",
        b.changes,
        b.events,
        b.join_key_updates * 100.0,
        b.seed,
        b.view_rows
    );
    let tables = |by_table: &BTreeMap<String, TableUnits>| {
        by_table
            .iter()
            .map(|(table, units)| {
                format!(
                    "    of which table {table:<15} {:.1} read, {:.1} write\n",
                    units.read_units_per_1000_changes, units.write_units_per_1000_changes
                )
            })
            .collect::<String>()
    };
    text += &design("keyway", &b.keyway);
    text += &tables(&b.keyway_by_table);
    text += &design(
        "keyway, BEFORE_IMAGES=always",
        &b.keyway_trusting_before_images,
    );
    text += &tables(&b.keyway_trusting_before_images_by_table);
    text += &design("whole set per join key", &b.whole_set_per_join_key);
    text += &format!(
        "  ratio                          {:.2}x capacity units ({:.2}x with BEFORE_IMAGES=always), {:.2}x changes/s/core\n",
        b.capacity_units_vs_whole_set,
        b.trusting_before_images_capacity_units_vs_whole_set,
        b.changes_per_second_vs_whole_set
    );
    text += "  (the whole-set design keeps no view: a reader joins a join key's rows itself)\n";
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn design(read: f64, write: f64) -> Design {
        Design {
            capacity_units_per_1000_changes: read + write,
            read_units_per_1000_changes: read,
            write_units_per_1000_changes: write,
            changes_per_second_per_core: 1000.0,
            largest_item_bytes: 500,
        }
    }

    #[test]
    fn the_report_gives_each_tables_units_and_says_the_whole_set_design_keeps_no_view() {
        let units = |read, write| TableUnits {
            read_units_per_1000_changes: read,
            write_units_per_1000_changes: write,
        };
        let bench = CdcBench {
            changes: 10,
            events: 11,
            join_key_updates: 0.1,
            seed: 1,
            view_rows: 3,
            keyway: design(2000.0, 3500.0),
            keyway_by_table: BTreeMap::from([
                ("cdc-state".to_owned(), units(2000.0, 2000.0)),
                ("cdc-view".to_owned(), units(0.0, 1500.0)),
            ]),
            keyway_trusting_before_images: design(1000.0, 2500.0),
            keyway_trusting_before_images_by_table: BTreeMap::from([
                ("cdc-state".to_owned(), units(1000.0, 1000.0)),
                ("cdc-view".to_owned(), units(0.0, 1500.0)),
            ]),
            whole_set_per_join_key: design(1000.0, 1000.0),
            capacity_units_vs_whole_set: 2.75,
            changes_per_second_vs_whole_set: 1.0,
            trusting_before_images_capacity_units_vs_whole_set: 1.75,
        };
        let text = report(&bench);
        assert!(
            text.contains("of which table cdc-state       2000.0 read, 2000.0 write"),
            "{text}"
        );
        assert!(
            text.contains("of which table cdc-view        0.0 read, 1500.0 write"),
            "{text}"
        );
        assert!(
            text.contains("of which table cdc-state       1000.0 read, 1000.0 write"),
            "{text}"
        );
        assert!(text.contains("(1.75x with BEFORE_IMAGES=always)"), "{text}");
        assert!(text.contains("keeps no view"), "{text}");
    }
}
