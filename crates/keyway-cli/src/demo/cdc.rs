//! `keyway demo`, CDC section: generated changes of `domains` and `users` (join keys and primary
//! keys that move, deletes, events sent twice) through the CDC join's re-key and join, wired as
//! template.yaml wires CdcRekeyFunction and CdcJoinFunction, under the demo's faults. Prints what
//! the join made and checks the view table equals the join of the final tables.

use cdc_join::spec::{JoinKind, JoinSpec};
use keyway_local::FaultPlan;
use keyway_stack::cdc::{final_tables, interleave, replay, Settings};
use keyway_stack::cdc_changes::{generate, Workload, JOIN};

use crate::error::CliError;

pub(super) async fn run(changes: usize, faults: f64, seed: u64) -> Result<(), CliError> {
    let workload = Workload {
        changes,
        truncates: 1,
        seed,
        ..Workload::default()
    };
    // The oracle applies the changes in the order the database made them: the truncate removes
    // the rows changed before it there, wherever the interleaving puts it.
    let made = generate(&workload);
    let tables = final_tables(&made);
    let events = interleave(made, seed);
    let spec = JoinSpec::parse(JOIN, JoinKind::LeftOuter).map_err(|e| e.to_string())?;
    println!("\nCDC join: the CdcRekeyFunction and CdcJoinFunction of template.yaml, {JOIN} (left outer)");
    println!(
        "  {changes} changes of {} domains and {} users as Debezium change events ({} with tombstones and events sent twice):",
        workload.domains,
        workload.users,
        events.len()
    );
    println!(
        "  {:.0}% of domain updates move the domain to another user, 3% of changes move a row to a new primary key,",
        workload.join_key_updates * 100.0
    );
    println!("  and halfway through, domains is truncated (its rows from before go, its rows from after stay);");
    println!(
        "  each row's changes in order on 4 shards, the rest interleaved, under the same faults"
    );
    let settings = Settings {
        shards: 4,
        faults: FaultPlan::all(faults, seed),
        ..Settings::new(spec.clone())
    };
    let outcome = replay(&settings, &events).await?;
    let expected = tables.join(&spec);
    let units: f64 = outcome.meters.values().map(|m| m.capacity_units()).sum();
    let inserts = outcome
        .joined
        .iter()
        .filter(|s| s.change.is_insert())
        .count();
    println!(
        "  joined changelog: {} changes ({inserts} inserts, {} deletes); view table: {} rows",
        outcome.joined.len(),
        outcome.joined.len() - inserts,
        outcome.view.len()
    );
    println!(
        "  DynamoDB: {:.0} capacity units per 1,000 changes (state and view); {} dead letters",
        units * 1000.0 / changes.max(1) as f64,
        outcome.dead_letters.len()
    );
    if outcome.view == expected && outcome.dead_letters.is_empty() {
        println!(
            "  the view matches the oracle: the join of the final tables, {} rows",
            expected.len()
        );
        Ok(())
    } else {
        Err(format!(
            "CDC: the view ({} rows) differs from the join of the final tables ({} rows); {} dead letters",
            outcome.view.len(),
            expected.len(),
            outcome.dead_letters.len()
        )
        .into())
    }
}
