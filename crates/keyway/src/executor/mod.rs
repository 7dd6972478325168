//! The batch executor: runs one Lambda batch (one shard, or one lane of a shard) through a keyed
//! operator as a plan (DESIGN §3), one file per phase:
//!
//! 1. `plan`: decode each record (a record that does not decode is dead-lettered and does not fail
//!    the batch) and group records by key, keeping arrival order within a key;
//! 2. `load`: load the state of every key at once, with the watermarks of its records' lineages,
//!    and carry state over from older signatures;
//! 3. `process`: run each key's records in order; a failing record stops its key only;
//! 4. `emit`: send dead letters, outboxes left by earlier invocations and (emit-then-commit) the
//!    outputs, a key's outputs to a sink in order;
//! 5. `commit`: commit each key's state with its watermarks, conditional on the version read;
//! 6. `outbox`: send what outbox operators just committed, then clear it;
//! 7. `report`: the lowest sequence number that was not fully applied.
//!
//! A stateless operator (a filter, a router) skips phases 2, 5 and 6 (`stateless`).
//!
//! `timers` sweeps the keyed timers that came due through the same phases, as timer records.
//!
//! A key commits only the records that were processed *and* whose outputs were sent. When that is
//! fewer than were processed (a record failed, a send failed), the key's state is rebuilt by
//! replaying the records that stay, from the loaded state: operators are deterministic, so the
//! replay computes the same state and the same outputs.
//!
//! # Design notes
//!
//! **Lineages.** A watermark guards one lineage: the records Lambda keeps in order, of which a
//! retry redelivers a suffix. With ParallelizationFactor > 1 Lambda runs a shard's partition keys
//! in concurrent lanes, so a key whose records come from several partition keys gets them from
//! several lanes, and a watermark per shard would skip the records of a lane that commits later.
//! The executor therefore keeps a watermark per shard *and partition key* (`Lineage::PartitionKey`,
//! the default, right for every factor and every key); `Lineage::Shard` keeps one per shard, which
//! is right only with ParallelizationFactor 1 and is cheaper for keys fed by many partition keys.
//! DynamoDB Streams keep only an item's changes in order: there the lineage is always the item. The
//! store bounds what a key's head holds however many lineages feed it (see the store's notes).
//!
//! **How long watermarks live.** A watermark is needed as long as its source can redeliver the
//! record: the stream's retention or the mapping's MaximumRecordAgeInSeconds, whichever is shorter
//! (`ExecutorConfig::redelivery_window`, at most a year by default). Watermarks are never pruned
//! sooner, and a key's state TTL never takes them (nor its outbox) along.
//!
//! **Order of outputs.** A sink that keeps order (a FIFO queue, a stream) gets a key's outputs to
//! one partition key one after another (those to others beside them: a sink keeps order per
//! partition key); after one fails, none of that key's later outputs go to that sink in this
//! invocation, so that a redelivered output never lands behind a later one.
//!
//! **Errors no retry can fix** dead-letter the record with the reason and let the key go on: bad
//! input, state a record makes too large for the store, an output too large for its sink or the
//! outbox. A panicking operator fails its key only (retried, like any programming error).
//!
//! **Deadline.** Given the invocation's deadline, the executor stops starting keys once less than
//! `ExecutorConfig::deadline_reserve` remains, and its sinks start no more calls or retries once
//! less than `ExecutorConfig::commit_reserve` remains (a sink's first call of a send goes
//! whatever the time, so that every invocation gets something out). A send that has not answered
//! when half the commit reserve remains is given up (a sink's first round gets the whole reserve
//! to answer at least, but never past a tenth of it before the deadline), its messages left for
//! their records' retry (they may have gone out: they go again under the same ids), so that a
//! call that hangs does not run to its attempt timeout past the invocation's, where Lambda would
//! fail the whole batch with nothing committed. It commits the records whose outputs all went
//! out and reports the rest as batch item failures, instead of being stopped by the timeout with
//! nothing committed: a key whose records emit more than a shard takes in one invocation goes on
//! at its retry, from its first record not sent whole.
//!
//! **What went out of a record left unapplied.** An emit-then-commit operator with state commits,
//! with the key, which outputs of its unapplied records went out (`SentNotes`: ranges of places
//! among each record's outputs, each sink's counted apart), and the records' retry skips them: a
//! record whose outputs take more than one invocation to send (a join key's thousands of joined
//! rows on a busy shard) gets through a part at each, where it would otherwise be sent again whole
//! at every retry and never end. Skipping by place is right only if the retry computes the same
//! outputs in the same order, as it must to give them the same ids: so the notes hold only at the
//! key's version their commit wrote (any other commit retires them), not after a migration or an
//! expiry, under the same build (`build`: the executable and its own environment, the platform's variables left out), and when the retry
//! runs the same records up to the last noted one to the same outcomes (Lambda may drop a record,
//! aged out or discarded after its retries, and a changed trigger may bring one more). Otherwise
//! the records go again whole, under the same ids. Not for
//! outbox operators (their outputs are stored whole), with a sink that keeps the latest (the
//! output sent stands for several records), nor for operators that read broadcast state (it can
//! change between two attempts without the key's version showing it). An operator's outputs must
//! not depend on the clock in ways that change between two attempts of a record.

mod build;
mod commit;
mod emit;
pub(crate) mod expiry;
mod history;
mod load;
mod observe;
mod outbox;
mod plan;
mod process;
mod report;
mod stateless;
#[cfg(test)]
pub(crate) mod testkit;
mod timers;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tracing::info;

pub use history::HISTORY as SIGNATURE_HISTORY;
pub use plan::KEY_MAX_BYTES;
pub use report::BatchReport;
pub use timers::{TimerSweep, TIMERS_PER_BATCH};

use emit::SendTimes;

use crate::domain::{stream_name_of, RejectedRecord, SourceRecord, DEAD_LETTER_SINK};
use crate::domain::{Dictionary, StateKind};
use crate::operator::{
    check_inputs, check_sinks, state_signature, BroadcastCache, Delivery, InputWiringError,
    KeyedOperator, Migration, SinkWiringError, StateDescriptor,
};
use crate::ports::{
    Clock, Deadline, HotKeyReports, MetricLog, Namespace, Sink, StateStore, StoreLimits,
    DEFAULT_REDELIVERY_WINDOW,
};

/// The sinks an operator emits to, by name, and the dead-letter sink.
#[derive(Clone)]
pub struct Sinks {
    sinks: HashMap<String, Arc<dyn Sink>>,
    /// Sinks that get only each key's latest output of an invocation (`keep_latest`).
    latest: HashSet<String>,
}

impl Sinks {
    /// Only the dead-letter sink, `dead_letter`: where records no retry can fix go, with why.
    pub fn new(dead_letter: Arc<dyn Sink>) -> Self {
        let mut sinks = HashMap::new();
        sinks.insert(DEAD_LETTER_SINK.to_owned(), dead_letter);
        Self {
            sinks,
            latest: HashSet::new(),
        }
    }

    /// Sends what the operator emits to the sink named `name` through `sink`: for wiring read
    /// from configuration. `Executor::new` checks the names against the operator's sinks.
    pub fn with_name(mut self, name: impl Into<String>, sink: Arc<dyn Sink>) -> Self {
        self.sinks.insert(name.into(), sink);
        self
    }

    /// Sends what the operator emits to `declared` through `sink`.
    pub fn with<T>(mut self, declared: &crate::operator::Sink<T>, sink: Arc<dyn Sink>) -> Self {
        self.sinks.insert(declared.name.to_owned(), sink);
        self
    }

    /// Sends `declared` only the last output of each of its partition keys that one key's records
    /// emit in an invocation: for outputs where a later one supersedes an earlier one (a running
    /// count, the latest state), which a consumer reads as an upsert. A batch of 10,000 records of
    /// 500 keys then sends 500 messages, not 10,000. The output kept has the id the last record
    /// gives it; if it cannot be sent, every record whose output it stands for is retried.
    /// Outputs of timers are all sent.
    ///
    /// A redelivery that Lambda cuts otherwise (it bisects a batch after a function error) may
    /// send an earlier output after a later one, under the earlier record's id: consumers keep,
    /// per key, the output of the latest record by a field the output carries (its sequence
    /// number; for a count, the highest count), not the one that arrived last.
    pub fn keep_latest<T>(mut self, declared: &crate::operator::Sink<T>) -> Self {
        self.latest.insert(declared.name.to_owned());
        self
    }

    fn get(&self, name: &str) -> Option<&Arc<dyn Sink>> {
        self.sinks.get(name)
    }

    fn keeps_latest(&self, name: &str) -> bool {
        self.latest.contains(name)
    }

    fn dead_letter_limit(&self) -> usize {
        self.sinks[DEAD_LETTER_SINK].max_message_bytes()
    }
}

/// The streams an operator's declared inputs read: a record of one of them is that input's.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    wired: Vec<(String, &'static str)>,
}

impl Inputs {
    /// No streams wired: for an operator of one input, which gets every record.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records of `stream` are `input`'s: a Kinesis stream, or a table for its DynamoDB stream,
    /// by name or by ARN (templates often pass `!GetAtt Stream.Arn`).
    pub fn with<T>(mut self, input: &crate::operator::Input<T>, stream: &str) -> Self {
        self.wired
            .push((stream_name_of(stream).to_owned(), input.name));
        self
    }
}

/// The largest output `process` may emit to each declared sink (all wired, checked before).
fn sink_limits(
    declared: &[crate::operator::SinkDescriptor],
    sinks: &Sinks,
    outbox: bool,
    limits: &StoreLimits,
) -> HashMap<String, usize> {
    declared
        .iter()
        .map(|sink| {
            let limit = sinks.sinks[sink.name].max_message_bytes();
            // An outbox output is stored with the state first: it must fit there too (an
            // output is stored as JSON, its body escaped, hence the margin).
            let limit = if outbox {
                limit.min(limits.max_entry_bytes.saturating_sub(1024))
            } else {
                limit
            };
            (sink.name.to_owned(), limit)
        })
        .collect()
}

/// Which records one watermark guards (see the module's notes on lineages).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Lineage {
    /// One watermark per shard and partition key: right whatever the ParallelizationFactor.
    #[default]
    PartitionKey,
    /// One watermark per shard: only for mappings with ParallelizationFactor 1.
    Shard,
}

/// Tuning that rarely needs changing.
#[derive(Clone, Debug)]
pub struct ExecutorConfig {
    /// How long after its arrival a record may still be redelivered: the source's retention, or
    /// the mapping's MaximumRecordAgeInSeconds if shorter. Watermarks live that long.
    pub redelivery_window: Duration,
    /// Which records one watermark guards.
    pub lineage: Lineage,
    /// After the operator's state signature changed, a key missing under the new signature is
    /// looked up under the previous one for this long, to count it as reset. (Migrations look up
    /// their signatures whenever a key is missing.)
    pub look_back: Duration,
    /// No key is started once less than this remains before the invocation's deadline: what was
    /// processed still has to be sent and committed.
    pub deadline_reserve: Duration,
    /// No sink call or retry is started once less than this remains before the invocation's
    /// deadline: what went out still has to be committed. Less than `deadline_reserve`, so that a
    /// batch whose processing took its time up still has time to send. A send that has not
    /// answered when half of it remains is given up (`emit::SendTimes`; a sink's first round
    /// gets all of it to answer at least, until a tenth of it remains), so that a call the
    /// service does not answer leaves the commit its time. Zero gives the commit no time of its
    /// own.
    pub commit_reserve: Duration,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            redelivery_window: DEFAULT_REDELIVERY_WINDOW,
            lineage: Lineage::default(),
            look_back: Duration::from_secs(7 * 24 * 3600),
            deadline_reserve: Duration::from_secs(2),
            commit_reserve: Duration::from_secs(1),
        }
    }
}

/// Runs Lambda batches through one keyed operator, on the ports it was built with.
pub struct Executor<O: KeyedOperator> {
    operator: O,
    /// Stream name to the declared input that reads it.
    routes: HashMap<String, &'static str>,
    namespace: Namespace,
    /// The keyed states, which every key but the broadcast key has.
    states: Vec<StateDescriptor>,
    /// The broadcast states, as the value slots `BROADCAST_KEY` holds them in.
    broadcast_states: Vec<StateDescriptor>,
    /// The broadcast states last loaded, decoded once per version.
    broadcast: BroadcastCache,
    store: Arc<dyn StateStore>,
    limits: StoreLimits,
    sinks: Sinks,
    /// Declared sink name to the largest output `process` may emit to it.
    sink_limits: HashMap<String, usize>,
    clock: Arc<dyn Clock>,
    config: ExecutorConfig,
    migrations: Vec<Migration>,
    /// The signature this one replaced, and since when, once read from the signature history.
    history: tokio::sync::OnceCell<Option<(String, i64)>>,
    /// Where each batch's skew line goes, if anywhere (`with_metrics`).
    observer: Option<observe::Observer>,
    /// Where each batch's heavy keys go, if anywhere (`with_hot_key_reports`).
    hot_key_reports: Option<Arc<dyn HotKeyReports>>,
}

/// An executor cannot be built: the operator and the function's wiring do not fit together.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum WiringError {
    /// The declared sinks are not the wired ones.
    #[error(transparent)]
    Sinks(#[from] SinkWiringError),
    /// The declared inputs are not the wired ones.
    #[error(transparent)]
    Inputs(#[from] InputWiringError),
    /// Caught by `keyway signatures --check` before anything is deployed.
    #[error("operator {operator}: the structure of state {state:?} ({type_name}) cannot be traced ({problem}); declare it with_shape")]
    UntraceableState {
        /// The operator's name.
        operator: String,
        /// The state's name.
        state: String,
        /// The Rust type stored.
        type_name: String,
        /// Why its structure cannot be traced.
        problem: String,
    },
    /// Two of an operator's preset dictionaries have one name: an item naming it could be
    /// inflated with the wrong one.
    #[error("operator {operator}: state_dictionaries {first} and {second} are both named {id}; change neither (items name them), add one of other text")]
    DictionaryNames {
        /// The operator's name.
        operator: String,
        /// The name both have.
        id: String,
        /// Their places in `state_dictionaries`.
        first: usize,
        /// The second's place.
        second: usize,
    },
    /// An operator that says it is stateless declares states or outbox delivery.
    #[error("operator {operator} is stateless but {problem}")]
    Stateless {
        /// The operator's name.
        operator: String,
        /// What it declares that a stateless operator cannot have.
        problem: String,
    },
}

/// Where `operator`'s state lives, with its preset dictionaries, each of a name of its own.
fn namespace_of<O: KeyedOperator>(
    operator: &O,
    states: &[StateDescriptor],
) -> Result<Namespace, WiringError> {
    let texts = operator.state_dictionaries();
    let dictionaries: Vec<Dictionary> = texts.iter().map(|text| Dictionary::new(text)).collect();
    for (second, d) in dictionaries.iter().enumerate() {
        let same = dictionaries[..second].iter().position(|o| o.id() == d.id());
        if let Some(first) = same.filter(|&first| texts[first] != texts[second]) {
            return Err(WiringError::DictionaryNames {
                operator: operator.name().to_owned(),
                id: d.id().to_owned(),
                first,
                second,
            });
        }
    }
    Ok(Namespace::new(operator.name(), state_signature(states)).with_dictionaries(dictionaries))
}

impl<O: KeyedOperator> Executor<O> {
    /// An executor of `operator` on the given ports, once its states are traceable and its
    /// declared sinks are exactly the ones `sinks` wires. An operator that declares inputs needs
    /// `with_inputs`.
    pub fn new(
        operator: O,
        store: Arc<dyn StateStore>,
        sinks: Sinks,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, WiringError> {
        Self::with_inputs(operator, Inputs::new(), store, sinks, clock)
    }

    /// An executor of an operator that reads several streams, each wired to one of its declared
    /// inputs by `inputs`.
    pub fn with_inputs(
        operator: O,
        inputs: Inputs,
        store: Arc<dyn StateStore>,
        sinks: Sinks,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, WiringError> {
        let states = operator.states();
        for state in &states {
            if let Err(problem) = &state.shape {
                return Err(WiringError::UntraceableState {
                    operator: operator.name().to_owned(),
                    state: state.name.to_owned(),
                    type_name: state.type_name.to_owned(),
                    problem: problem.to_string(),
                });
            }
        }
        if operator.stateless() {
            Self::check_stateless(&operator)?;
        }
        check_inputs(operator.name(), &operator.inputs(), &inputs.wired)?;
        let routes = inputs.wired.into_iter().collect();
        let declared = operator.sinks();
        check_sinks(
            operator.name(),
            &declared,
            sinks.sinks.keys().map(String::as_str),
        )?;
        let namespace = namespace_of(&operator, &states)?;
        let (broadcast_states, states): (Vec<_>, Vec<_>) = states
            .into_iter()
            .partition(|s| s.kind == StateKind::Broadcast);
        let broadcast = BroadcastCache::new(&broadcast_states);
        let broadcast_states = broadcast_states
            .into_iter()
            .map(|s| StateDescriptor {
                kind: StateKind::Value,
                ..s
            })
            .collect();
        let limits = store.limits();
        let outbox = operator.delivery() == Delivery::Outbox;
        let sink_limits = sink_limits(&declared, &sinks, outbox, &limits);
        let migrations = operator.migrations();
        let executor = Self {
            operator,
            routes,
            namespace,
            states,
            broadcast_states,
            broadcast,
            store,
            limits,
            sinks,
            sink_limits,
            clock,
            config: ExecutorConfig::default(),
            migrations,
            history: tokio::sync::OnceCell::new(),
            observer: None,
            hot_key_reports: None,
        };
        if executor.notes_sent() {
            build::prepare();
        }
        Ok(executor)
    }

    /// Tunes the executor with `config` rather than `ExecutorConfig::default()`.
    pub fn with_config(mut self, config: ExecutorConfig) -> Self {
        self.config = config;
        self
    }

    /// Writes one skew line per batch to `log` (see `observe`), under the name of `function`.
    pub fn with_metrics(mut self, log: Arc<dyn MetricLog>, function: impl Into<String>) -> Self {
        self.observer = Some(observe::Observer {
            log,
            function: function.into(),
        });
        self
    }

    /// Reports each batch's heavy keys to `reports` (the adaptive hot-key registry).
    pub fn with_hot_key_reports(mut self, reports: Arc<dyn HotKeyReports>) -> Self {
        self.hot_key_reports = Some(reports);
        self
    }

    /// The operator it runs.
    pub fn operator(&self) -> &O {
        &self.operator
    }

    /// Where the operator's state lives: its name and state signature.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// Runs one batch with no deadline. Records must be in the order the stream delivered them.
    pub async fn run(&self, batch: Vec<Result<SourceRecord, RejectedRecord>>) -> BatchReport {
        self.run_until(batch, None).await
    }

    /// Runs one batch that must be done by `deadline_millis` (epoch milliseconds on the
    /// executor's clock), the invocation's deadline.
    pub async fn run_until(
        &self,
        mut batch: Vec<Result<SourceRecord, RejectedRecord>>,
        deadline_millis: Option<i64>,
    ) -> BatchReport {
        if !self.routes.is_empty() {
            for record in batch.iter_mut().flatten() {
                record.input = self.routes.get(&*record.stream).copied();
            }
        }
        let now = self.clock.now_millis();
        let started = std::time::Instant::now();
        let mut report = BatchReport::new(batch.len());
        let (mut plan, mut inputs) = self.plan(&batch);
        plan.sends = self.send_times(deadline_millis);
        report.keys = plan.groups.len();
        let stateless = self.operator.stateless();
        let loaded = if stateless {
            Some(self.fresh_keys(&plan))
        } else {
            let answered = self.answered_without_state(&plan, &mut inputs, now);
            self.load(&plan, &answered, now, &mut report).await
        };
        let Some(mut keys) = loaded else {
            // The state could not be read: the whole batch is left for Lambda to retry.
            self.observe_outcome(&plan, &report, now, started);
            return report;
        };
        self.process(&plan, &mut inputs, &mut keys, now, deadline_millis);
        if let Some(observer) = &self.observer {
            if let Some(line) = observer.line(&self.namespace.operator, &plan, &keys, now) {
                observer.log.write(line);
            }
        }
        self.emit_all(&plan, &mut keys, &mut report).await;
        if stateless {
            self.settle_stateless(&plan, &keys, &mut report);
        } else {
            let committed = self.commit_all(&plan, &mut keys, now, &mut report).await;
            self.deliver_outboxes(&plan, committed, &mut report).await;
        }
        // After the batch's own work, so that outputs never wait on the registry.
        self.report_heat(&plan, now).await;
        self.observe_outcome(&plan, &report, now, started);
        report.log(&self.namespace);
        report
    }

    /// When sinks stop calling, for a batch that must be done by `deadline_millis`: the commit
    /// reserve before it; and when a send that has not answered is given up: half the reserve
    /// before it, so that what did go out is still committed before Lambda stops the invocation
    /// (a sink's first round a tenth of the reserve before it at the latest).
    fn send_times(&self, deadline_millis: Option<i64>) -> SendTimes {
        let Some(deadline) = deadline_millis else {
            return SendTimes::default();
        };
        let reserve = self.config.commit_reserve;
        let now = self.clock.now_millis();
        let left = |reserve: Duration| {
            let millis = deadline - reserve.as_millis() as i64 - now;
            Duration::from_millis(millis.max(0) as u64)
        };
        SendTimes {
            until: Deadline::after(left(reserve)),
            end: Some(tokio::time::Instant::now() + left(reserve / 2)),
            first_round: reserve,
            last: Some(tokio::time::Instant::now() + left(reserve / 10)),
        }
    }

    /// Writes the batch's outcome line, where the executor writes metric lines.
    fn observe_outcome(
        &self,
        plan: &plan::Plan<'_>,
        report: &BatchReport,
        now: i64,
        started: std::time::Instant,
    ) {
        let Some(observer) = &self.observer else {
            return;
        };
        let operator = &self.namespace.operator;
        if let Some(line) = observer.outcome_line(operator, plan, report, now, started.elapsed()) {
            observer.log.write(line);
        }
    }

    /// Tells the hot-key registry, if there is one, which keys the batch carried. A failed
    /// report is logged and costs nothing else: the registry is a heuristic, and the records'
    /// results never depend on which keys were salted.
    async fn report_heat(&self, plan: &plan::Plan<'_>, now: i64) {
        let Some(reports) = &self.hot_key_reports else {
            return;
        };
        let Some(heat) = observe::heat(plan, now, reports.floor_share()) else {
            return;
        };
        if let Err(err) = reports.report(&heat).await {
            info!(operator = %self.namespace.operator, error = %err, "the hot-key registry missed a batch's report");
        }
    }

    /// The watermark a record advances.
    fn lineage_of<'r>(&self, record: &'r SourceRecord) -> &'r crate::domain::Origin {
        match self.config.lineage {
            Lineage::PartitionKey => &record.lineage,
            Lineage::Shard => &record.origin,
        }
    }
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::testkit::{Recorder, Summer, OUT};
    use super::*;
    use crate::adapters::dynamodb::DynamoStateStore;
    use crate::adapters::dynamodb::MemoryTable;
    use crate::domain::Output;
    use crate::operator::{Ctx, InvalidInput, ProcessError};
    use crate::ports::{ManualClock, SinkError};

    /// A sink that takes messages of up to 1 MiB, as a Kinesis stream does.
    struct Wide;

    #[async_trait]
    impl Sink for Wide {
        async fn send(&self, _: &[Output], _: Deadline) -> Vec<(usize, SinkError)> {
            Vec::new()
        }
        fn max_message_bytes(&self) -> usize {
            1024 * 1024
        }
    }

    fn limit_of(outbox: bool) -> usize {
        let clock = ManualClock::at(0);
        let store = Arc::new(DynamoStateStore::new(
            Arc::new(MemoryTable::new()),
            clock.clone(),
        ));
        let sinks = Sinks::new(Arc::new(Recorder::default())).with(&OUT, Arc::new(Wide));
        let operator = Summer {
            outbox,
            ..Summer::default()
        };
        let executor = Executor::new(operator, store.clone(), sinks, clock).unwrap();
        executor.sink_limits["out"]
    }

    #[tokio::test]
    async fn each_batch_writes_a_skew_line_naming_its_shard_its_load_and_its_heaviest_keys() {
        use super::testkit::{record, START};
        use crate::ports::MemoryMetrics;
        // Five seconds after the records arrived.
        let clock = ManualClock::at(START + 5_000);
        let store = Arc::new(DynamoStateStore::new(
            Arc::new(MemoryTable::new()),
            clock.clone(),
        ));
        let sinks = Sinks::new(Arc::new(Recorder::default())).with(&OUT, Arc::new(Wide));
        let metrics = Arc::new(MemoryMetrics::default());
        let executor = Executor::new(Summer::default(), store, sinks, clock)
            .unwrap()
            .with_metrics(metrics.clone(), "keyway-Summer-1A2B");
        let keys = [
            "hot", "a", "hot", "hot", "b", "hot", "hot", "hot", "hot", "hot",
        ];
        let mut batch = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            // Key b's one record makes its state the largest: a sum of ten digits.
            let n = if *key == "b" { 1_234_567_890 } else { 1 };
            batch.push(record(i as u64 + 1, key, key, n));
        }
        executor.run(batch).await;
        let lines = metrics.take();
        assert_eq!(lines.len(), 2, "a skew line and an outcome line: {lines:?}");
        let line: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        let dimensions = &line["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0];
        assert_eq!(
            dimensions,
            &serde_json::json!(["Function", "Operator", "Shard"])
        );
        assert_eq!(
            (line["Function"].as_str(), line["Shard"].as_str()),
            (Some("keyway-Summer-1A2B"), Some("shardId-0"))
        );
        assert_eq!(line["Operator"], executor.namespace().operator.as_str());
        assert_eq!(line["Records"], 10.0);
        assert_eq!(line["DistinctKeys"], 3.0);
        assert_eq!(line["HottestKeyRecords"], 8.0);
        // Summer keeps each key's sum as a JSON number: `8` for the hot key.
        assert_eq!(
            line["HotKeys"][0],
            serde_json::json!({"key": "hot", "records": 8, "state_bytes": 1})
        );
        assert_eq!(line["LargestKeyStateBytes"], 10.0);
        let bytes = line["Bytes"].as_f64().unwrap();
        assert!(bytes > 150.0, "{bytes}");

        let outcome: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(
            outcome["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0],
            serde_json::json!(["Function", "Operator"])
        );
        let counts = [
            "RecordsIn",
            "Applied",
            "DuplicatesSkipped",
            "DeadLetters",
            "CommitConflicts",
            "SentNotesUnused",
            "RecordsLeftForRetry",
            "IteratorAge",
        ]
        .map(|name| outcome[name].as_f64());
        assert_eq!(
            counts,
            [10.0, 10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5_000.0].map(Some),
            "{outcome}"
        );
        assert!(outcome["BatchDuration"].as_f64().is_some());
        // The same batch again: every record is a redelivery the watermarks skip.
        let again: Vec<_> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| record(i as u64 + 1, key, key, 1))
            .collect();
        executor.run(again).await;
        let lines = metrics.take();
        let outcome: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(
            (
                outcome["Applied"].as_f64(),
                outcome["DuplicatesSkipped"].as_f64()
            ),
            (Some(0.0), Some(10.0))
        );
        // An empty batch writes no line.
        executor.run(Vec::new()).await;
        assert!(metrics.take().is_empty());
    }

    #[tokio::test]
    async fn a_batch_whose_outputs_cannot_be_sent_counts_its_records_left_for_retry() {
        use super::testkit::{bench, record};
        use crate::ports::MemoryMetrics;
        let b = bench(Summer::default(), false);
        let metrics = Arc::new(MemoryMetrics::default());
        let executor = b.executor.with_metrics(metrics.clone(), "f");
        b.out.down.store(true, std::sync::atomic::Ordering::SeqCst);
        let batch = vec![
            record(1, "a", "a", 1),
            record(2, "b", "b", 1),
            record(3, "a", "a", 1),
        ];
        let report = executor.run(batch).await;
        assert!(report.failed_from.is_some());
        let lines = metrics.take();
        let outcome: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
        assert_eq!(outcome["RecordsIn"].as_f64(), Some(3.0));
        assert_eq!(outcome["Applied"].as_f64(), Some(0.0));
        assert_eq!(
            outcome["RecordsLeftForRetry"].as_f64(),
            Some(3.0),
            "{outcome}"
        );
    }

    #[test]
    fn an_outbox_operators_outputs_must_fit_the_state_store_and_others_only_their_sink() {
        assert_eq!(limit_of(false), 1024 * 1024);
        let entry = crate::adapters::dynamodb::DynamoStateStore::<MemoryTable>::new(
            Arc::new(MemoryTable::new()),
            ManualClock::at(0),
        )
        .limits()
        .max_entry_bytes;
        assert_eq!(limit_of(true), entry - 1024);
    }

    /// Declares `dictionaries`; a summer otherwise.
    struct Declaring(&'static [&'static str]);

    impl KeyedOperator for Declaring {
        type Input = (String, i64);

        fn name(&self) -> &str {
            "declaring"
        }

        fn states(&self) -> Vec<StateDescriptor> {
            vec![super::testkit::SUM.descriptor()]
        }

        fn sinks(&self) -> Vec<crate::operator::SinkDescriptor> {
            Vec::new()
        }

        fn decode(&self, record: &SourceRecord) -> Result<(String, i64), InvalidInput> {
            super::testkit::key_and_n(record)
        }

        fn key(&self, input: &(String, i64)) -> String {
            input.0.clone()
        }

        fn process(&self, _: &mut Ctx<'_>, _: (String, i64)) -> Result<(), ProcessError> {
            Ok(())
        }

        fn state_dictionaries(&self) -> &'static [&'static str] {
            self.0
        }
    }

    #[test]
    fn an_operator_whose_two_dictionaries_share_a_name_is_refused_when_it_is_built() {
        // Two texts whose names agree: found among texts of the 32-bit name's birthday bound.
        let mut seen = HashMap::new();
        let (a, b) = (0u32..)
            .find_map(|n| {
                let text = format!("sample {n}");
                let id = Dictionary::new(Box::leak(text.clone().into_boxed_str()))
                    .id()
                    .to_owned();
                seen.insert(id, text.clone()).map(|earlier| (earlier, text))
            })
            .expect("two texts of one name");
        let texts: &'static [&'static str] = Box::leak(Box::new([
            &*Box::leak(a.into_boxed_str()),
            &*Box::leak(b.into_boxed_str()),
        ]));
        let build = |texts| {
            let table = Arc::new(MemoryTable::new());
            let clock = ManualClock::at(0);
            let store = Arc::new(DynamoStateStore::new(table, clock.clone()));
            Executor::new(Declaring(texts), store, Sinks::new(Arc::new(Wide)), clock)
        };
        assert!(matches!(
            build(texts),
            Err(WiringError::DictionaryNames {
                first: 0,
                second: 1,
                ..
            })
        ));
        // One text twice is the same dictionary.
        let twice: &'static [&'static str] = Box::leak(Box::new([texts[0], texts[0]]));
        let built = build(twice).expect("one dictionary, named once");
        assert_eq!(built.namespace().dictionaries.len(), 2);
    }
}
