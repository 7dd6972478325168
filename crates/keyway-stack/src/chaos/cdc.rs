//! The CDC join under chaos: Debezium changes of `domains` and `users` (inserts, updates that
//! move join keys and primary keys, deletes, events sent twice, a large customer whose join key
//! holds a quarter of the domains, a truncate of each table), interleaved as streams sharded by
//! record key deliver them, every thousandth change followed by a record that is no change
//! event, through the re-key and the join. The oracle applies the changes in the order the
//! database made them and joins the final tables: the view must equal that join row for row;
//! the joined changelog, folded by joined row, must equal the fault-free run's; and the re-key
//! must hold exactly the live rows.
//!
//! With `CdcRekeyFunction.BEFORE_IMAGES=always` set, the re-key keeps no rows and takes no
//! truncate: the changes then come without truncates (every one carries its whole before image),
//! and the re-key must hold no row.

use std::collections::BTreeMap;

use cdc_join::join::{Joined, JoinedId};
use cdc_join::oracle::Tables;
use cdc_join::rekey::{self, BeforeImages};
use cdc_join::spec::{JoinKind, JoinSpec};
use cdc_join::view::View;
use cdc_join::wiring::before_images_from;
use keyway_local::{Fault, FaultPlan, LocalError, Usage};

use super::{against_fault_free, against_oracle, side_by_side, Report, Sent, Settings, Variable};
use crate::cdc::{
    final_tables, interleave, replay, state_rows, Outcome, Settings as CdcSettings, SourceEvent,
};
use crate::cdc_changes::{generate, Workload, JOIN};

/// The joined changelog folded as a consumer folds it (`View`): each joined row as it ends.
fn folded(outcome: &Outcome) -> Sent {
    let mut view = View::default();
    for stamped in &outcome.joined {
        view.apply(stamped.clone());
    }
    view.rows()
        .map(|row| (format!("{:?}", row.id()), vec![format!("{row:?}")]))
        .collect()
}

/// The rows the re-key keeps in the state table's heads: what it holds of the source tables.
fn rekey_rows(outcome: &Outcome) -> usize {
    state_rows(&outcome.state_items, rekey::NAME, &[rekey::ROW.name])
}

/// The variables the CDC join's run takes, which it sets on the functions it wires itself.
pub(crate) fn takes(variable: &Variable) -> bool {
    variable.function == "CdcRekeyFunction" && variable.name == "BEFORE_IMAGES"
}

/// The re-key's `BEFORE_IMAGES` as the run's variables set it; template.yaml must list it.
fn before_images(settings: &Settings) -> Result<BeforeImages, LocalError> {
    let mut env = keyway::lambda::Env::new();
    for v in &settings.variables {
        if !takes(v) {
            return Err(LocalError::Function {
                path: format!("Resources/{}/Environment/{}", v.function, v.name),
                problem: "the CDC join's run sets CdcRekeyFunction's BEFORE_IMAGES only".into(),
            });
        }
        crate::set_in_resource(crate::TEMPLATE, &v.function, &v.name, &v.value)?;
        env.insert(v.name.clone(), v.value.clone());
    }
    before_images_from(&env).map_err(|e| LocalError::Function {
        path: format!("Resources/CdcRekeyFunction/Environment/{}", e.name),
        problem: e.problem,
    })
}

/// The changes of a run of `settings` (bad records among them), and the tables they leave, with
/// `truncates` among them.
fn changes(settings: &Settings, truncates: usize) -> (Vec<SourceEvent>, u64, Tables) {
    let workload = Workload {
        changes: settings.events,
        hot_user: 0.25,
        truncates,
        seed: settings.seed,
        ..Workload::default()
    };
    let made = generate(&workload);
    let tables = final_tables(&made);
    let mut events = interleave(made, settings.seed);
    let bad = add_bad_records(&mut events);
    (events, bad, tables)
}

/// What the functions of the fault-free run were billed for.
pub(super) async fn usage(settings: &Settings) -> Result<Usage, LocalError> {
    let images = before_images(settings)?;
    // Without truncates, which the re-key trusting before images refuses: both modes price the
    // same changes, and a truncate, rare in a real database, empties tables a run then joins.
    let (events, _, _) = changes(settings, 0);
    let spec = JoinSpec::parse(JOIN, JoinKind::LeftOuter).expect("the join");
    let cdc = CdcSettings {
        shards: settings.shards,
        lanes: settings.lanes,
        metering: settings.metering.clone(),
        before_images: images,
        ..CdcSettings::new(spec)
    };
    Ok(replay(&cdc, &events).await?.ending.usage)
}

pub(super) fn run(settings: &Settings) -> Result<Report, LocalError> {
    let images = before_images(settings)?;
    // Two truncates, unless the re-key trusting before images takes none.
    let truncates = if images == BeforeImages::Always { 0 } else { 2 };
    let (events, bad, tables) = changes(settings, truncates);
    let spec = JoinSpec::parse(JOIN, JoinKind::LeftOuter).expect("the join");
    let expected: BTreeMap<JoinedId, Joined> = tables.join(&spec);
    let cdc = |faults: FaultPlan| CdcSettings {
        shards: settings.shards,
        lanes: settings.lanes,
        faults,
        before_images: images,
        ..CdcSettings::new(spec.clone())
    };
    let (clean_settings, faulty_settings) = (cdc(FaultPlan::default()), cdc(settings.faults()));
    let (clean, faulty) = side_by_side(
        || replay(&clean_settings, &events),
        || replay(&faulty_settings, &events),
    )?;
    let mut report = Report {
        unit: "rows of the view",
        bad_records: bad,
        ..Report::default()
    };
    against_oracle(&mut report, &faulty.view, &expected, |_, _| false);
    against_fault_free(&mut report, &folded(&faulty), &folded(&clean));
    // The joined changelog carries no ids: its changes are compared folded, and the ones a
    // retry sent again counted apart.
    report.notes.push(format!(
        "the joined changelog: {} changes, {} without faults (a retry sends steps again; a \
         consumer folds both to the same rows)",
        faulty.joined.len(),
        clean.joined.len()
    ));
    if images == BeforeImages::Sometimes {
        report.notes.push(format!(
            "the truncates' two sweeps were done {} min after the last change ({} runs of the \
             sweep failed and the next went on)",
            faulty.sweeps_took.as_secs() / 60,
            faulty.failed_sweeps
        ));
    }
    let live = match images {
        BeforeImages::Sometimes => tables.len(),
        BeforeImages::Always => {
            report.notes.push(
                "BEFORE_IMAGES=always: the re-key stores no row, and the changes hold no truncate"
                    .into(),
            );
            0
        }
    };
    let held = rekey_rows(&faulty);
    if held != live {
        report.oracle.extra += held.saturating_sub(live) as u64;
        report.oracle.lost += live.saturating_sub(held) as u64;
        report.example(format!("the re-key holds {held} rows, the tables {live}"));
    }
    report.take_ending(&faulty.ending);
    if images == BeforeImages::Always {
        // Only a commit that writes segments can crash part way: one of a join key whose rows,
        // or the stamps of the deletes a truncate makes, outgrow its head. Taken off the missing
        // kinds only when it never fired.
        report.not_applicable(
            Fault::CrashInCommit,
            "the re-key commits nothing, and without truncates no join key of this run outgrew \
             its head",
        );
    }
    Ok(report)
}

/// Adds, after every thousandth change, a record of its topic that is no change event (a JSON
/// array); returns how many.
fn add_bad_records(events: &mut Vec<SourceEvent>) -> u64 {
    let mut bad = 0;
    let mut out = Vec::with_capacity(events.len() + events.len() / 1000);
    for (i, event) in events.drain(..).enumerate() {
        if i % 1000 == 999 {
            bad += 1;
            out.push(SourceEvent {
                topic: event.topic.clone(),
                key: event.key.clone(),
                value: Some(serde_json::json!(["no", "change", "event"])),
            });
        }
        out.push(event);
    }
    *events = out;
    bad
}
