//! Chaos runs: each application of the stack driven with generated input (bad records among it)
//! on the embedded runtime twice, once without faults and once with every fault the runtime can
//! inject but outages (a service down for a while: `tests/tests/limits.rs`), and held to an oracle
//! written apart from the application: what `keyway chaos` runs and the chaos tests assert on.
//!
//! Every run ends in a `Report` that counts each record end to end: the outputs the oracle
//! expects (one per unit of the application's result: a key's count, a delivery, an enriched
//! record, a joined row, a key's aggregate), the bad records it expects dead-lettered, and
//! against both the oracle and the fault-free run what is `lost` (expected and missing),
//! `applied_twice` (a state effect counted again, or an output id sent with two bodies) and
//! `extra` (neither expected nor in the fault-free run). A run is clean when all three are zero,
//! every fault kind the plan names fired, and no batch was given up. The seed makes a run
//! repeatable: the same seed gives the same input and the same faults.

mod aggregate;
mod cdc;
mod counter;
mod filter;
mod identity;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use keyway::domain::DeadLetter;
use keyway_local::{Fault, FaultCounts, FaultPlan, LocalError, LocalRuntime, LocalServices, Usage};
use serde::Serialize;

use crate::metering::Metering;

/// The applications a chaos run drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum App {
    /// The keyed counter: clicks counted per user.
    Counter,
    /// Identity enrichment: generated CloudTrail role chains of thirty customers.
    Identity,
    /// Dynamic filtering, its consumers changing their subscriptions while events stream.
    Filter,
    /// The CDC join of two tables' Debezium changes.
    Cdc,
    /// Keyed aggregation, a key turning hot and salted halfway.
    Aggregate,
}

impl App {
    /// Every application, in the order `keyway chaos` runs them.
    pub const ALL: [App; 5] = [
        App::Counter,
        App::Identity,
        App::Filter,
        App::Cdc,
        App::Aggregate,
    ];

    /// Its name on the command line and in reports (`counter`, `cdc`...).
    pub fn name(self) -> &'static str {
        match self {
            App::Counter => "counter",
            App::Identity => "identity",
            App::Filter => "filter",
            App::Cdc => "cdc",
            App::Aggregate => "aggregate",
        }
    }

    /// The application named `text` (as `name` gives it); none for an unknown name.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|app| app.name() == text)
    }

    /// Whether its chaos run takes `variable` (`Settings::variables`): a run that deploys
    /// template.yaml takes any the template lists; the filter's and the CDC join's wire their
    /// functions themselves, and the CDC join's takes the re-key's `BEFORE_IMAGES` only.
    pub fn takes(self, variable: &Variable) -> bool {
        match self {
            App::Counter | App::Identity | App::Aggregate => true,
            App::Cdc => cdc::takes(variable),
            App::Filter => false,
        }
    }

    /// Whether the schedule named `name` (`function/event`) is of this application: the stack
    /// deploys every application's schedules, and a cost report bills each its own.
    fn owns_schedule(self, name: &str) -> bool {
        let functions: &[&str] = match self {
            App::Counter | App::Filter => &[],
            App::Identity => &["IdentityEnricherFunction/"],
            // The CDC replay wires the re-key itself, under its own name.
            App::Cdc => &["CdcRekeyFunction/", "cdc-rekey/"],
            App::Aggregate => &["KeyedAggregateFunction/"],
        };
        functions.iter().any(|f| name.starts_with(f))
    }
}

/// How a run is made.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Input records (events, changes, CloudTrail records).
    pub events: usize,
    /// The probability of each fault kind.
    pub fault_rate: f64,
    /// Seeds the input, the faults and the retries' waits alike: the same seed replays a run,
    /// fault for fault.
    pub seed: u64,
    /// Shards of the application's input streams (1-16).
    pub shards: usize,
    /// Lanes each shard is read in (the mappings' ParallelizationFactor, 1-10).
    pub lanes: u32,
    /// How the run is metered, for `usage`; the default changes nothing.
    pub metering: Metering,
    /// Environment variables set on the stack's functions before it is deployed: a variant of
    /// template.yaml (none: the stack as the template has it).
    pub variables: Vec<Variable>,
}

/// An environment variable of one of the stack's functions, set to `value` before the stack is
/// deployed: `COUNTS_EMIT=latest` on `KeyedCounterFunction`, say. The template must list it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variable {
    /// The function's logical id in the template (`KeyedCounterFunction`).
    pub function: String,
    /// The variable's name (`COUNTS_EMIT`).
    pub name: String,
    /// What it is set to.
    pub value: String,
}

impl Variable {
    /// The variable `name` of `function`, set to `value`.
    pub fn new(function: &str, name: &str, value: &str) -> Self {
        Self {
            function: function.into(),
            name: name.into(),
            value: value.into(),
        }
    }

    /// `Function.NAME=value`, as `keyway chaos --set` takes it.
    pub fn parse(text: &str) -> Option<Self> {
        let (target, value) = text.split_once('=')?;
        let (function, name) = target.split_once('.')?;
        (!function.is_empty() && !name.is_empty()).then(|| Self::new(function, name, value))
    }
}

impl Settings {
    /// The fault plan of the faulty run.
    pub fn faults(&self) -> FaultPlan {
        FaultPlan::all(self.fault_rate, self.seed)
    }
}

/// One comparison of a run's result: units expected (keys, deliveries, output ids...), and
/// those lost (expected, missing or short), applied twice (a state effect counted again, or an
/// output id sent with another body) and extra (not expected at all).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Tally {
    /// Units expected.
    pub expected: u64,
    /// Units expected and missing, or short of their value.
    pub lost: u64,
    /// Units past their value (a state effect counted again), or output ids sent with another
    /// body.
    pub(crate) applied_twice: u64,
    /// Units not expected at all.
    pub extra: u64,
}

/// What a run found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// The application run; none until `run` fills in the settings.
    pub app: Option<App>,
    /// Input records put in, bad ones included.
    pub events: usize,
    /// The seed of the input and the faults.
    pub seed: u64,
    /// The probability of each fault kind in the faulty run.
    pub fault_rate: f64,
    /// Shards of the application's input streams.
    pub shards: usize,
    /// Lanes each shard was read in.
    pub lanes: u32,
    /// Faults injected in the faulty run, by kind.
    pub faults: BTreeMap<String, u64>,
    /// The chances each kind had in the faulty run: its draws, fired or not.
    pub faults_drawn: BTreeMap<String, u64>,
    /// Fault kinds the plan names that had chances and never fired.
    pub faults_missing: Vec<String>,
    /// Fault kinds the plan names that no call of the run gave a chance (a crash inside a
    /// commit, where no commit wrote several items): not counted as missing.
    pub faults_without_chance: Vec<String>,
    /// Fault kinds the application gives nothing to meet, with why (not counted as missing).
    pub faults_not_applicable: Vec<String>,
    /// What the oracle's units are ("keys' counts", "deliveries"...).
    pub unit: &'static str,
    /// The faulty run's result against the oracle's.
    pub oracle: Tally,
    /// The faulty run's outputs against the fault-free run's, by output id.
    pub fault_free: Tally,
    /// Outputs sent again under an id already sent, with the same body (at-least-once).
    pub repeats: u64,
    /// Bad records put in, which must each be dead-lettered with a reason.
    pub bad_records: u64,
    /// Dead letters the faulty run sent.
    pub dead_letters: u64,
    /// The distinct records among the dead letters: one sent again after a retry names the same
    /// record.
    pub dead_lettered_records: u64,
    /// Batches the mappings gave up on (described on the failed-batches queue).
    pub failed_batches: u64,
    /// A few of the differences, to start the search from.
    pub examples: Vec<String>,
    /// What else the application measured (how late its timers came, under faults).
    pub notes: Vec<String>,
}

impl Report {
    /// Units lost, against the oracle and the fault-free run together.
    pub fn lost(&self) -> u64 {
        self.oracle.lost + self.fault_free.lost
    }

    /// Units applied twice, against the oracle and the fault-free run together.
    pub(crate) fn applied_twice(&self) -> u64 {
        self.oracle.applied_twice + self.fault_free.applied_twice
    }

    /// Units extra, against the oracle and the fault-free run together.
    pub fn extra(&self) -> u64 {
        self.oracle.extra + self.fault_free.extra
    }

    /// Something expected, nothing lost, nothing applied twice, nothing extra, every bad record
    /// dead-lettered, every configured fault fired that had the chances to, and no batch given
    /// up. (Dead letters are counted, not matched to the bad records: a good record
    /// dead-lettered would be lost to the oracle, so the counts agree only when the dead letters
    /// are the bad records.)
    pub fn clean(&self) -> bool {
        self.oracle.expected > 0
            && self.lost() == 0
            && self.applied_twice() == 0
            && self.extra() == 0
            && self.dead_lettered_records == self.bad_records
            && !self
                .faults_missing
                .iter()
                .any(|kind| self.bound_to_fire(kind))
            && self.failed_batches == 0
    }

    /// How many chances `kind` had, and whether so many draws at the run's rate fire it in all
    /// but one run in twenty. A kind that had fewer and never fired (a crash inside a commit of
    /// several writes, which a key of the aggregation makes a few times a run) is shown, and
    /// not held against the run.
    fn bound_to_fire(&self, kind: &str) -> bool {
        let chances = self.faults_drawn.get(kind).copied().unwrap_or(0);
        1.0 - (1.0 - self.fault_rate).powf(chances as f64) >= 0.95
    }

    /// Takes `fault`, if it never fired, off the missing kinds (and those without a chance):
    /// the application gives it nothing to meet, for `why`.
    fn not_applicable(&mut self, fault: Fault, why: &str) {
        let name = fault.name();
        let listed = |kinds: &[String]| kinds.iter().any(|f| f == name);
        if listed(&self.faults_missing) || listed(&self.faults_without_chance) {
            self.faults_missing.retain(|f| f != name);
            self.faults_without_chance.retain(|f| f != name);
            self.faults_not_applicable.push(format!("{name} ({why})"));
        }
    }

    /// The faults lines: those injected, those that never fired, those with nothing to meet.
    fn write_faults(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect();
        writeln!(f, "  faults injected: {}", faults.join(", "))?;
        if !self.faults_missing.is_empty() {
            let missing: Vec<String> = self
                .faults_missing
                .iter()
                .map(|kind| {
                    let chances = self.faults_drawn.get(kind).copied().unwrap_or(0);
                    match self.bound_to_fire(kind) {
                        true => format!("{kind} ({chances} chances)"),
                        false => {
                            let none = (1.0 - self.fault_rate).powf(chances as f64) * 100.0;
                            format!(
                                "{kind} ({chances} chances: {none:.0}% of runs at this rate see \
                                 none; not held against the run)"
                            )
                        }
                    }
                })
                .collect();
            writeln!(f, "  faults never fired: {}", missing.join(", "))?;
        }
        let without_chance = self
            .faults_without_chance
            .iter()
            .map(|kind| format!("{kind} (no call of the run gave it a chance)"));
        let unmet: Vec<String> = self
            .faults_not_applicable
            .iter()
            .cloned()
            .chain(without_chance)
            .collect();
        if !unmet.is_empty() {
            writeln!(f, "  faults with nothing to meet: {}", unmet.join(", "))?;
        }
        Ok(())
    }

    fn example(&mut self, text: impl Into<String>) {
        if self.examples.len() < 5 {
            self.examples.push(text.into());
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let app = self.app.map_or("?", App::name);
        writeln!(
            f,
            "{app}: {} records ({} bad) on {} shards of {} lanes, every fault at {} (seed {})",
            self.events, self.bad_records, self.shards, self.lanes, self.fault_rate, self.seed
        )?;
        self.write_faults(f)?;
        let tally = |t: &Tally| {
            format!(
                "lost {}, applied twice {}, extra {}",
                t.lost, t.applied_twice, t.extra
            )
        };
        writeln!(
            f,
            "  against the oracle, {} {}: {}",
            self.oracle.expected,
            self.unit,
            tally(&self.oracle)
        )?;
        writeln!(
            f,
            "  against the fault-free run, {} output ids ({} sent again under their id): {}",
            self.fault_free.expected,
            self.repeats,
            tally(&self.fault_free)
        )?;
        writeln!(
            f,
            "  dead letters: {} of {} bad records ({} sent); batches given up: {}",
            self.dead_lettered_records, self.bad_records, self.dead_letters, self.failed_batches
        )?;
        for note in &self.notes {
            writeln!(f, "  {note}")?;
        }
        for example in &self.examples {
            writeln!(f, "  e.g. {example}")?;
        }
        write!(
            f,
            "  lost {}, applied twice {}, extra {}: {}",
            self.lost(),
            self.applied_twice(),
            self.extra(),
            if self.clean() {
                "clean"
            } else {
                "NOT CLEAN (the same --seed replays it)"
            }
        )
    }
}

/// Runs `app` with `settings`: its fault-free run and its faulty run side by side, each on a
/// thread and a runtime of its own with virtual time, both held to its oracle.
pub fn run(app: App, settings: &Settings) -> Result<Report, LocalError> {
    let mut report = match app {
        App::Counter => counter::run(settings)?,
        App::Identity => identity::run(settings)?,
        App::Filter => filter::run(settings)?,
        App::Cdc => cdc::run(settings)?,
        App::Aggregate => aggregate::run(settings)?,
    };
    report.app = Some(app);
    report.events = settings.events;
    report.seed = settings.seed;
    report.fault_rate = settings.fault_rate;
    report.shards = settings.shards;
    report.lanes = settings.lanes;
    Ok(report)
}

/// The results of `clean()` and `faulty()`, two runs made at once, each on a thread and a
/// current-thread runtime of its own whose time passes only when it waits (the embedded
/// services' clock is virtual): two cores halve a chaos run.
pub(crate) fn side_by_side<T, C, F>(
    clean: impl FnOnce() -> C + Send,
    faulty: impl FnOnce() -> F + Send,
) -> Result<(T, T), LocalError>
where
    T: Send,
    C: std::future::Future<Output = Result<T, LocalError>>,
    F: std::future::Future<Output = Result<T, LocalError>>,
{
    let panicked = |which: &str| LocalError::Function {
        path: format!("the {which} run"),
        problem: "panicked".into(),
    };
    std::thread::scope(|scope| {
        let clean = scope.spawn(|| on_a_runtime_of_its_own(clean()));
        let faulty = scope.spawn(|| on_a_runtime_of_its_own(faulty()));
        let clean = clean.join().map_err(|_| panicked("fault-free"))?;
        let faulty = faulty.join().map_err(|_| panicked("faulty"))?;
        Ok((clean?, faulty?))
    })
}

/// `run` on a current-thread runtime of its own whose time passes only when it waits.
fn on_a_runtime_of_its_own<O>(run: impl std::future::Future<Output = O>) -> O {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
        .block_on(run)
}

/// What the functions of `app`'s fault-free run were billed for, metered as
/// `settings.metering` says: `keyway bench cost`.
pub fn usage(app: App, settings: &Settings) -> Result<Usage, LocalError> {
    let mut usage = on_a_runtime_of_its_own(async {
        match app {
            App::Counter => counter::usage(settings).await,
            App::Identity => identity::usage(settings).await,
            App::Filter => filter::usage(settings).await,
            App::Cdc => cdc::usage(settings).await,
            App::Aggregate => aggregate::usage(settings).await,
        }
    })?;
    usage
        .schedules
        .retain(|(name, _, _)| app.owns_schedule(name));
    Ok(usage)
}

/// Outputs as sent: each output id with every body sent under it.
pub(crate) type Sent = BTreeMap<String, Vec<String>>;

/// `outputs` (output id, body) as sent, in the order sent.
pub(crate) fn sent(outputs: impl IntoIterator<Item = (String, String)>) -> Sent {
    let mut sent = Sent::new();
    for (id, body) in outputs {
        sent.entry(id).or_default().push(body);
    }
    sent
}

/// Compares the outputs of the faulty run with those of the fault-free one, by id: an id missing
/// is lost, an id the fault-free run never sent is extra, an id sent with another body applied
/// twice; the same body again is a repeat.
pub(crate) fn against_fault_free(report: &mut Report, faulty: &Sent, clean: &Sent) {
    report.fault_free.expected = clean.len() as u64;
    for (id, bodies) in faulty {
        report.repeats += bodies.len() as u64 - 1;
        match clean.get(id) {
            None => {
                report.fault_free.extra += 1;
                report.example(format!(
                    "output {id} not sent without faults: {}",
                    bodies[0]
                ));
            }
            Some(want) if bodies.iter().any(|b| b != &want[0]) => {
                report.fault_free.applied_twice += 1;
                report.example(format!("output {id}: {bodies:?} against {}", want[0]));
            }
            Some(_) => {}
        }
    }
    for (id, bodies) in clean {
        if !faulty.contains_key(id) {
            report.fault_free.lost += 1;
            report.example(format!("output {id} lost: {}", bodies[0]));
        }
    }
}

/// Compares a result with the oracle's, unit by unit (a key's count, a delivery, a joined row):
/// a unit missing is lost, one not expected extra, and one with another value applied twice
/// where `more` says it went past the expected value (a count counted twice), else lost.
pub(crate) fn against_oracle<K: Ord + fmt::Debug, V: PartialEq + fmt::Debug>(
    report: &mut Report,
    got: &BTreeMap<K, V>,
    want: &BTreeMap<K, V>,
    more: impl Fn(&V, &V) -> bool,
) {
    report.oracle.expected = want.len() as u64;
    for (unit, value) in want {
        match got.get(unit) {
            None => {
                report.oracle.lost += 1;
                report.example(format!("{unit:?} missing, expected {value:?}"));
            }
            Some(v) if v != value => {
                if more(v, value) {
                    report.oracle.applied_twice += 1;
                } else {
                    report.oracle.lost += 1;
                }
                report.example(format!("{unit:?}: {v:?}, expected {value:?}"));
            }
            Some(_) => {}
        }
    }
    for (unit, value) in got {
        if !want.contains_key(unit) {
            report.oracle.extra += 1;
            report.example(format!("{unit:?} not expected: {value:?}"));
        }
    }
}

/// What a run leaves besides its outputs: the faults it injected (and the kinds its plan names
/// that never fired), its dead letters' bodies, and the batches its mappings gave up on.
#[derive(Clone, Debug, Default)]
pub struct Ending {
    /// The faults injected, by service (`dynamodb`, `kinesis`, `sqs`, `invocations`).
    pub faults_fired: BTreeMap<&'static str, FaultCounts>,
    /// Kinds of fault the plan names that never fired.
    pub faults_missing: Vec<Fault>,
    /// The chances each kind of fault had (`LocalServices::faults_drawn`).
    pub faults_drawn: FaultCounts,
    /// The bodies of the messages on the dead-letter queue.
    pub dead_letters: Vec<String>,
    /// Messages on the failed-batches queue: one for each batch given up.
    pub failed_batches: usize,
    /// What the run's functions were billed for.
    pub usage: Usage,
}

impl Ending {
    /// What `runtime`, running template.yaml, has left: its `DeadLetterQueue` and
    /// `FailedBatchesQueue` read without taking their messages.
    pub fn of(runtime: &LocalRuntime) -> Self {
        let url = |id: &str| runtime.resource(id).unwrap_or_default();
        Self {
            usage: runtime.usage(),
            ..Self::read(
                &runtime.services,
                &url("DeadLetterQueue"),
                Some(&url("FailedBatchesQueue")),
            )
        }
    }

    /// What `services` have left, with the dead-letter queue at `dead_letters` and the
    /// failed-batches queue, if any, at `failed_batches`.
    pub fn read(
        services: &LocalServices,
        dead_letters: &str,
        failed_batches: Option<&str>,
    ) -> Self {
        Self {
            faults_fired: services.faults_fired(),
            faults_missing: services.faults_missing(),
            faults_drawn: services.faults_drawn(),
            dead_letters: services
                .sqs
                .messages(dead_letters)
                .into_iter()
                .map(|m| m.body)
                .collect(),
            failed_batches: failed_batches.map_or(0, |url| services.sqs.messages(url).len()),
            usage: Usage::default(),
        }
    }
}

impl Report {
    /// Takes in what the faulty run left: its faults, its dead letters (and the distinct
    /// records they name) and the batches given up.
    fn take_ending(&mut self, ending: &Ending) {
        for counts in ending.faults_fired.values() {
            for (kind, n) in counts {
                *self.faults.entry(kind.name().to_owned()).or_default() += n;
            }
        }
        let (missing, without_chance): (Vec<Fault>, Vec<Fault>) = ending
            .faults_missing
            .iter()
            .partition(|f| ending.faults_drawn.contains_key(f));
        for (kind, n) in &ending.faults_drawn {
            *self.faults_drawn.entry(kind.name().to_owned()).or_default() += n;
        }
        let names = |kinds: Vec<Fault>| kinds.iter().map(|f| f.name().to_owned()).collect();
        self.faults_missing = names(missing);
        self.faults_without_chance = names(without_chance);
        let mut records = BTreeSet::new();
        for body in &ending.dead_letters {
            self.dead_letters += 1;
            if let Ok(letter) = serde_json::from_str::<DeadLetter>(body) {
                records.insert((letter.origin, letter.sequence_number));
            }
        }
        self.dead_lettered_records = records.len() as u64;
        self.failed_batches = ending.failed_batches as u64;
    }
}

/// template.yaml on a fresh embedded runtime, with `shards` shards for the streams named and
/// `lanes` lanes for the functions named (`crate::template_with`), its `parameters`, `faults`,
/// and the `settings`' metering and variables.
pub(crate) fn deploy(
    shards: &[(&str, usize)],
    lanes: &[(&str, u32)],
    parameters: &BTreeMap<String, String>,
    faults: FaultPlan,
    settings: &Settings,
) -> Result<LocalRuntime, LocalError> {
    let metering = &settings.metering;
    let functions: Vec<&str> = lanes.iter().map(|(function, _)| *function).collect();
    let mut template = metering.batched(crate::template_with(shards, lanes)?, &functions)?;
    for v in &settings.variables {
        template = crate::set_in_resource(&template, &v.function, &v.name, &v.value)?;
    }
    let services = LocalServices::new(EPOCH, faults);
    let runtime =
        LocalRuntime::from_template_with(&template, parameters, services, &crate::functions())?;
    metering.apply(&runtime.services);
    Ok(runtime)
}

/// When every chaos run's clock starts: 2026-01-01.
pub(crate) const EPOCH: i64 = 1_767_225_600_000;

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(entries: &[(&str, &[&str])]) -> Sent {
        entries
            .iter()
            .map(|(id, bodies)| {
                (
                    id.to_string(),
                    bodies.iter().map(|b| b.to_string()).collect(),
                )
            })
            .collect()
    }

    /// A cost report bills each application its own schedules, found by their functions'
    /// names: a schedule the template adds must belong to one application.
    #[tokio::test(start_paused = true)]
    async fn every_schedule_of_the_stack_is_billed_to_exactly_one_application() {
        let runtime = deploy(
            &[],
            &[],
            &BTreeMap::new(),
            FaultPlan::default(),
            &Settings {
                events: 0,
                fault_rate: 0.0,
                seed: 0,
                shards: 1,
                lanes: 1,
                metering: Metering::default(),
                variables: Vec::new(),
            },
        )
        .expect("the stack deploys");
        let schedules = runtime.schedules();
        assert!(!schedules.is_empty());
        for (name, _) in schedules {
            let owners: Vec<App> = App::ALL
                .into_iter()
                .filter(|app| app.owns_schedule(&name))
                .collect();
            assert_eq!(owners.len(), 1, "{name}: {owners:?}");
        }
    }

    #[test]
    fn a_variable_names_a_function_a_variable_and_a_value_or_is_refused() {
        assert_eq!(
            Variable::parse("KeyedCounterFunction.COUNTS_EMIT=latest"),
            Some(Variable::new(
                "KeyedCounterFunction",
                "COUNTS_EMIT",
                "latest"
            ))
        );
        assert_eq!(Variable::parse("F.V="), Some(Variable::new("F", "V", "")));
        for bad in ["COUNTS_EMIT=latest", ".V=x", "F.=x", "F.V"] {
            assert_eq!(Variable::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_output_missing_sent_with_another_body_or_unknown_is_lost_applied_twice_or_extra() {
        let clean = sent(&[("a", &["1"]), ("b", &["2"]), ("c", &["3"])]);
        let faulty = sent(&[("a", &["1", "1"]), ("b", &["2", "9"]), ("d", &["4"])]);
        let mut report = Report::default();
        against_fault_free(&mut report, &faulty, &clean);
        let t = &report.fault_free;
        assert_eq!((t.expected, t.lost, t.applied_twice, t.extra), (3, 1, 1, 1));
        assert_eq!(report.repeats, 2);
        assert!(!report.clean());
        let mut same = Report::default();
        against_fault_free(&mut same, &clean, &clean);
        assert!(
            !same.clean(),
            "nothing expected of the oracle: no run at all"
        );
        same.oracle.expected = 1;
        assert!(same.clean() && same.examples.is_empty());
    }

    #[test]
    fn a_count_short_of_the_oracles_is_lost_and_one_past_it_applied_twice() {
        let want = BTreeMap::from([("a", 3), ("b", 5), ("c", 1)]);
        let got = BTreeMap::from([("a", 3), ("b", 6), ("c", 0), ("d", 2)]);
        let mut report = Report::default();
        against_oracle(&mut report, &got, &want, |got, want| got > want);
        let t = &report.oracle;
        assert_eq!((t.expected, t.lost, t.applied_twice, t.extra), (3, 1, 1, 1));
        assert_eq!(report.examples.len(), 3);
    }

    #[test]
    fn a_bad_record_not_dead_lettered_or_a_batch_given_up_is_not_clean() {
        let letter = |sequence: &str| {
            serde_json::json!({"operator": "op", "origin": "s/0", "sequenceNumber": sequence,
                               "field": "data", "problem": "not JSON", "payload": "",
                               "payloadTruncated": false, "payloadBytes": 0, "payloadSha256": ""})
            .to_string()
        };
        let mut report = Report {
            bad_records: 2,
            oracle: Tally {
                expected: 1,
                ..Tally::default()
            },
            ..Report::default()
        };
        let ending = Ending {
            dead_letters: vec![letter("1"), letter("1"), letter("2")],
            ..Ending::default()
        };
        report.take_ending(&ending);
        assert_eq!((report.dead_letters, report.dead_lettered_records), (3, 2));
        assert!(report.clean());
        report.bad_records = 3;
        assert!(!report.clean(), "a bad record went nowhere");
        report.bad_records = 2;
        report.failed_batches = 1;
        assert!(!report.clean());
    }

    #[test]
    fn a_fault_that_never_fired_is_held_against_the_run_only_when_its_chances_fire_one_in_nineteen_runs_of_twenty(
    ) {
        let expected = || Report {
            oracle: Tally {
                expected: 1,
                ..Tally::default()
            },
            fault_rate: 0.03,
            ..Report::default()
        };
        let ending = Ending {
            faults_missing: vec![Fault::CrashInCommit, Fault::Timeout],
            faults_drawn: BTreeMap::from([(Fault::Timeout, 100), (Fault::Throttle, 900)]),
            ..Ending::default()
        };
        let mut report = expected();
        report.take_ending(&ending);
        assert_eq!(report.faults_missing, ["timeout"]);
        assert_eq!(report.faults_without_chance, ["crash in commit"]);
        assert!(
            !report.clean(),
            "100 chances at 3%, no timeout: 95% of runs see one"
        );
        let text = report.to_string();
        assert!(
            text.contains("faults never fired: timeout (100 chances)"),
            "{text}"
        );
        assert!(
            text.contains("faults with nothing to meet: crash in commit (no call of the run gave it a chance)"),
            "{text}"
        );
        // An application's own reason replaces the generic one.
        report.not_applicable(Fault::CrashInCommit, "one item a key");
        assert!(report.faults_without_chance.is_empty());
        assert_eq!(
            report.faults_not_applicable,
            ["crash in commit (one item a key)"]
        );

        let mut few = expected();
        few.take_ending(&Ending {
            faults_missing: vec![Fault::CrashInCommit],
            faults_drawn: BTreeMap::from([(Fault::CrashInCommit, 19)]),
            ..Ending::default()
        });
        assert!(few.clean(), "19 chances at 3%: 56% of runs see none");
        let text = few.to_string();
        assert!(
            text.contains("crash in commit (19 chances: 56% of runs at this rate see none; not held against the run)"),
            "{text}"
        );
        let mut none = expected();
        none.take_ending(&Ending {
            faults_missing: vec![Fault::CrashInCommit],
            ..Ending::default()
        });
        assert!(none.clean());
    }
}
