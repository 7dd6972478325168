//! The batch executor: runs one Lambda batch (one shard) through a keyed operator as a plan
//! (DESIGN §3):
//!
//! 1. decode each record; a record that does not decode is dead-lettered and does not fail the batch;
//! 2. group records by key, keeping arrival order within a key;
//! 3. load the state of every key at once;
//! 4. process each key's records in order; a failing record stops its key only;
//! 5. emit outputs (and dead letters) with deterministic ids;
//! 6. commit each key's state with its watermarks, conditional on the version read;
//! 7. report the lowest sequence number that was not fully applied.
//!
//! A key commits only the records that were processed *and* whose outputs were sent. When that is
//! fewer than were processed (a record failed, a send failed), the key's state is rebuilt by
//! replaying the records that stay, from the loaded state: operators are deterministic, so the
//! replay computes the same state and the same outputs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tracing::{info, warn};

use crate::domain::{
    BatchPlan, DeadLetter, KeyState, Output, SequenceNumber, SlotData, SourceRecord,
    DEAD_LETTER_SINK,
};
use crate::operator::{
    state_signature, Ctx, Delivery, InvalidInput, KeyedOperator, Migration, OldState, ProcessError,
    StateDescriptor, TypedSlot,
};
use crate::ports::{Clock, Commit, Namespace, Sink, SinkError, StateStore, StoreError};

/// A record the source could not turn into a `SourceRecord` (malformed event JSON, no sequence
/// number...). It is dead-lettered as is.
#[derive(Clone, Debug, PartialEq)]
pub struct RejectedRecord {
    pub origin: Option<String>,
    pub sequence: Option<SequenceNumber>,
    pub field: String,
    pub problem: String,
    /// The record JSON as delivered.
    pub raw: serde_json::Value,
}

/// The sinks an operator emits to, by name, and the dead-letter sink.
#[derive(Clone)]
pub struct Sinks {
    sinks: HashMap<String, Arc<dyn Sink>>,
}

impl Sinks {
    pub fn new(dead_letter: Arc<dyn Sink>) -> Self {
        let mut sinks = HashMap::new();
        sinks.insert(DEAD_LETTER_SINK.to_owned(), dead_letter);
        Self { sinks }
    }

    pub fn with(mut self, name: impl Into<String>, sink: Arc<dyn Sink>) -> Self {
        self.sinks.insert(name.into(), sink);
        self
    }

    fn limits(&self) -> HashMap<String, usize> {
        self.sinks
            .iter()
            .map(|(name, sink)| (name.clone(), sink.max_message_bytes()))
            .collect()
    }

    fn dead_letter_limit(&self) -> usize {
        self.sinks[DEAD_LETTER_SINK].max_message_bytes()
    }
}

/// What one batch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchReport {
    pub records: usize,
    /// Records whose state effects were committed (or that changed nothing) and outputs sent.
    pub applied: usize,
    /// Records skipped because the key had already applied them (a redelivery).
    pub replayed: usize,
    pub dead_lettered: usize,
    pub outputs_sent: usize,
    pub keys: usize,
    pub commits: usize,
    pub conflicts: usize,
    /// Keys whose state under an older signature a migration carried over.
    pub migrated: usize,
    /// Keys whose state under the previous signature was left behind: they start afresh.
    pub reset: usize,
    /// The lowest sequence number not fully applied: Lambda redelivers from there.
    pub failed_from: Option<SequenceNumber>,
    /// Set when a record that has no sequence number could not be dead-lettered: the only way to
    /// keep it is to fail the whole invocation.
    pub unreportable_failure: Option<String>,
}

impl BatchReport {
    fn fail(&mut self, sequence: &SequenceNumber) {
        if self.failed_from.as_ref().is_none_or(|f| sequence < f) {
            self.failed_from = Some(sequence.clone());
        }
    }
}

/// Tuning that rarely needs changing.
#[derive(Clone, Debug)]
pub struct ExecutorConfig {
    /// Watermarks of origins with no record for this long are dropped (no stream redelivers
    /// records older than its retention; Kinesis keeps at most 365 days, 24 hours by default).
    pub watermark_retention: Duration,
    /// After the operator's state signature changed, a key missing under the new signature is
    /// looked up under the previous one for this long, to count it as reset. (Migrations look up
    /// their signatures whenever a key is missing.)
    pub look_back: Duration,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            watermark_retention: Duration::from_secs(8 * 24 * 3600),
            look_back: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// Where an operator's signature history is kept: a namespace and key of its own.
const HISTORY: &str = "signature-history";
const HISTORY_SLOT: &str = "signatures";

/// What happened to one record of a key.
#[derive(Clone, Debug)]
enum Outcome {
    /// Already applied by an earlier invocation.
    Replayed,
    Applied(Vec<Output>),
    /// Dead-lettered.
    Invalid(InvalidInput),
    /// Stopped the key; this and every later record of the key stay unapplied.
    Failed,
}

/// One key's records processed from its loaded state.
struct KeyRun {
    slots: BTreeMap<&'static str, Box<dyn TypedSlot>>,
    /// One per record that ran, in order; shorter than the key's records when a record failed.
    outcomes: Vec<Outcome>,
}

/// Which record a message was emitted for, to map send failures back.
#[derive(Clone, Copy, Debug)]
enum Tag {
    Record {
        group: usize,
        position: usize,
    },
    /// A message left in the key's outbox by an earlier invocation.
    Outbox {
        group: usize,
    },
    /// A record rejected before it had a key.
    Unkeyed {
        index: usize,
    },
}

pub struct Executor<O: KeyedOperator> {
    operator: O,
    namespace: Namespace,
    states: Vec<StateDescriptor>,
    store: Arc<dyn StateStore>,
    sinks: Sinks,
    sink_limits: HashMap<String, usize>,
    clock: Arc<dyn Clock>,
    config: ExecutorConfig,
    migrations: Vec<Migration>,
    /// The signature this one replaced, and since when, once read from the signature history.
    history: tokio::sync::OnceCell<Option<(String, i64)>>,
}

impl<O: KeyedOperator> Executor<O> {
    /// Panics when a state's structure cannot be traced: a programming error, caught by
    /// `keyway signatures --check` before anything is deployed.
    pub fn new(
        operator: O,
        store: Arc<dyn StateStore>,
        sinks: Sinks,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let states = operator.states();
        for state in &states {
            if let Err(err) = &state.shape {
                panic!(
                    "operator {}: the structure of state {:?} ({}) cannot be traced ({err}); declare it with_shape",
                    operator.name(),
                    state.name,
                    state.type_name
                );
            }
        }
        let namespace = Namespace {
            operator: operator.name().to_owned(),
            signature: state_signature(&states),
        };
        let sink_limits = sinks.limits();
        let migrations = operator.migrations();
        Self {
            operator,
            namespace,
            states,
            store,
            sinks,
            sink_limits,
            clock,
            config: ExecutorConfig::default(),
            migrations,
            history: tokio::sync::OnceCell::new(),
        }
    }

    pub fn with_config(mut self, config: ExecutorConfig) -> Self {
        self.config = config;
        self
    }

    pub fn operator(&self) -> &O {
        &self.operator
    }

    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// Runs one batch. Records must be in the order the stream delivered them.
    pub async fn run(&self, batch: Vec<Result<SourceRecord, RejectedRecord>>) -> BatchReport {
        let now = self.clock.now_millis();
        let mut report = BatchReport {
            records: batch.len(),
            ..Default::default()
        };

        // 1. Decode.
        let mut inputs: Vec<Option<O::Input>> = Vec::with_capacity(batch.len());
        let mut keyed: Vec<(usize, String)> = Vec::new();
        let mut unkeyed: Vec<(usize, DeadLetter)> = Vec::new();
        for (index, item) in batch.iter().enumerate() {
            match item {
                Ok(record) => match self.operator.decode(record) {
                    Ok(input) => {
                        keyed.push((index, self.operator.key(&input)));
                        inputs.push(Some(input));
                    }
                    Err(invalid) => {
                        unkeyed.push((index, self.dead_letter(Some(record), None, invalid)));
                        inputs.push(None);
                    }
                },
                Err(rejected) => {
                    let letter = DeadLetter::new(
                        self.operator.name(),
                        rejected.origin.clone(),
                        rejected.sequence.as_ref().map(|s| s.to_string()),
                        rejected.field.clone(),
                        rejected.problem.clone(),
                        rejected.raw.to_string(),
                    );
                    unkeyed.push((index, letter));
                    inputs.push(None);
                }
            }
        }
        let records: Vec<Option<&SourceRecord>> = batch.iter().map(|r| r.as_ref().ok()).collect();
        let sequence_of = |index: usize| -> Option<&SequenceNumber> {
            match &batch[index] {
                Ok(record) => Some(&record.sequence),
                Err(rejected) => rejected.sequence.as_ref(),
            }
        };

        // 2. Plan.
        let plan = BatchPlan::group(keyed.iter().map(|(i, k)| (*i, k.as_str())));
        report.keys = plan.groups.len();

        // 3. Load.
        let keys: Vec<String> = plan.keys().map(str::to_owned).collect();
        let (loaded, previous) = futures::join!(
            self.store.load(&self.namespace, &keys),
            self.previous_signature(now)
        );
        let mut loaded = match loaded {
            Ok(loaded) => loaded,
            Err(err) => {
                warn!(operator = %self.namespace.operator, error = %err, "state load failed; the batch will be redelivered");
                for index in 0..batch.len() {
                    if let Some(seq) = sequence_of(index) {
                        report.fail(seq);
                    }
                }
                return report;
            }
        };
        let migrated = match self.look_back(&mut loaded, previous, &mut report).await {
            Ok(migrated) => migrated,
            Err(err) => {
                warn!(operator = %self.namespace.operator, error = %err, "reading state under an older signature failed; the batch will be redelivered");
                for index in 0..batch.len() {
                    if let Some(seq) = sequence_of(index) {
                        report.fail(seq);
                    }
                }
                return report;
            }
        };
        let bases: Vec<KeyState> = plan
            .groups
            .iter()
            .map(|g| loaded.remove(&g.key).unwrap_or_default())
            .collect();

        // 4. Process.
        let mut runs: Vec<KeyRun> = Vec::with_capacity(plan.groups.len());
        for (group, base) in plan.groups.iter().zip(&bases) {
            let record_refs: Vec<&SourceRecord> = group
                .records
                .iter()
                .map(|&i| records[i].expect("keyed records decoded"))
                .collect();
            let mut pre_decoded: Vec<Option<O::Input>> =
                group.records.iter().map(|&i| inputs[i].take()).collect();
            runs.push(self.run_key(
                group.key.as_str(),
                base,
                &record_refs,
                usize::MAX,
                now,
                &mut pre_decoded,
            ));
        }

        // 5. Emit: dead letters, outboxes left by earlier invocations, and (emit-then-commit) outputs.
        let dlq_limit = self.sinks.dead_letter_limit();
        let mut emission = Emission::default();
        for (index, letter) in unkeyed {
            emission.push(Tag::Unkeyed { index }, letter.into_output(dlq_limit));
        }
        let emit_now = self.operator.delivery() == Delivery::EmitThenCommit;
        for (g, (group, run)) in plan.groups.iter().zip(runs.iter_mut()).enumerate() {
            for output in &bases[g].outbox {
                emission.push(Tag::Outbox { group: g }, output.clone());
            }
            for (position, outcome) in run.outcomes.iter_mut().enumerate() {
                let tag = Tag::Record { group: g, position };
                match outcome {
                    // Sent now, so no longer needed in the outcome.
                    Outcome::Applied(outputs) if emit_now => {
                        for output in std::mem::take(outputs) {
                            emission.push(tag, output);
                        }
                    }
                    Outcome::Invalid(invalid) => {
                        let record =
                            records[group.records[position]].expect("keyed records decoded");
                        let letter =
                            self.dead_letter(Some(record), Some(&group.key), invalid.clone());
                        emission.push(tag, letter.into_output(dlq_limit));
                    }
                    _ => {}
                }
            }
        }
        let failed_tags = self.emit(emission, &mut report).await;

        // Per key, how many records stay: up to the first that failed or whose messages did not
        // all go out. An outbox that could not be re-sent blocks its key, keeping output order.
        let mut keep: Vec<usize> = runs.iter().map(|r| r.outcomes.len()).collect();
        let mut outbox_blocked = vec![false; runs.len()];
        for (g, run) in runs.iter().enumerate() {
            if let Some(p) = run
                .outcomes
                .iter()
                .position(|o| matches!(o, Outcome::Failed))
            {
                keep[g] = keep[g].min(p);
            }
        }
        for tag in &failed_tags {
            match *tag {
                Tag::Record { group, position } => keep[group] = keep[group].min(position),
                Tag::Outbox { group } => outbox_blocked[group] = true,
                Tag::Unkeyed { index } => match sequence_of(index) {
                    Some(seq) => report.fail(seq),
                    None => {
                        report.unreportable_failure = Some(
                            "a record without a sequence number could not be dead-lettered".into(),
                        )
                    }
                },
            }
        }

        // 6. Commit.
        let mut commits: Vec<(usize, Commit)> = Vec::new();
        let mut pending_outbox: Vec<(usize, Vec<Output>)> = Vec::new();
        for (g, (group, base)) in plan.groups.iter().zip(bases).enumerate() {
            let record_refs: Vec<&SourceRecord> = group
                .records
                .iter()
                .map(|&i| records[i].expect("keyed records decoded"))
                .collect();
            if outbox_blocked[g] {
                // Later outputs must not overtake the ones still in the outbox: leave the key as
                // it is; the redelivery sends the outbox again first.
                report.fail(&record_refs[0].sequence);
                continue;
            }
            if keep[g] < runs[g].outcomes.len() {
                // Rebuild the state of the records that stay; their outcomes are the same.
                let mut none: Vec<Option<O::Input>> =
                    (0..record_refs.len()).map(|_| None).collect();
                runs[g] = self.run_key(&group.key, &base, &record_refs, keep[g], now, &mut none);
            }
            if keep[g] < record_refs.len() {
                report.fail(&record_refs[keep[g]].sequence);
            }
            let run = &runs[g];
            // A migrated key is written under the new signature even if nothing else changed.
            let force = migrated.contains(&group.key);
            match self.next_state(base, run, &record_refs, now, force) {
                Ok(Some((state, outbox))) => {
                    if !outbox.is_empty() {
                        pending_outbox.push((g, outbox));
                    }
                    commits.push((
                        g,
                        Commit {
                            key: group.key.clone(),
                            expected_version: state.version,
                            state,
                        },
                    ));
                }
                Ok(None) => {
                    report.applied += count_applied(&run.outcomes);
                    report.replayed += count_replayed(&run.outcomes);
                }
                Err(err) => {
                    warn!(operator = %self.namespace.operator, key = %group.key, error = %err, "state does not encode; the key's records will be redelivered");
                    report.fail(&record_refs[0].sequence);
                }
            }
        }
        let committed_groups: Vec<usize> = commits.iter().map(|(g, _)| *g).collect();
        let results = self
            .store
            .commit(
                &self.namespace,
                commits.into_iter().map(|(_, c)| c).collect(),
            )
            .await;
        let mut committed = vec![false; plan.groups.len()];
        for (g, result) in committed_groups.into_iter().zip(results) {
            let first = &batch_sequence(&plan.groups[g].records, &records);
            match result {
                Ok(()) => {
                    committed[g] = true;
                    report.commits += 1;
                    report.applied += count_applied(&runs[g].outcomes);
                    report.replayed += count_replayed(&runs[g].outcomes);
                }
                Err(err) => {
                    if err == crate::ports::StoreError::Conflict {
                        report.conflicts += 1;
                    } else {
                        warn!(operator = %self.namespace.operator, key = %plan.groups[g].key, error = %err, "commit failed; the key's records will be redelivered");
                    }
                    report.fail(first);
                }
            }
        }

        // Outbox delivery: send what was just committed. What fails stays in the outbox, and the
        // key's records are redelivered, which sends it again.
        let mut outbox = Emission::default();
        for (g, outputs) in pending_outbox {
            if committed[g] {
                for output in outputs {
                    outbox.push(Tag::Outbox { group: g }, output);
                }
            }
        }
        for tag in self.emit(outbox, &mut report).await {
            if let Tag::Outbox { group } = tag {
                report.fail(&batch_sequence(&plan.groups[group].records, &records));
            }
        }

        if report.migrated > 0 || report.reset > 0 {
            // Once per invocation, not once per key.
            warn!(
                operator = %self.namespace.operator,
                signature = %self.namespace.signature,
                migrated = report.migrated,
                reset = report.reset,
                "state written under an older signature was migrated or left behind"
            );
        }
        info!(
            operator = %self.namespace.operator,
            records = report.records,
            applied = report.applied,
            replayed = report.replayed,
            dead_lettered = report.dead_lettered,
            keys = report.keys,
            commits = report.commits,
            conflicts = report.conflicts,
            failed_from = report.failed_from.as_ref().map(|s| s.as_str()),
            "batch done"
        );
        report
    }

    /// Processes up to `limit` records of one key from its loaded state. A record whose processing
    /// fails may have changed the typed state before failing, so the run restarts from the loaded
    /// state without it; restarts are rare (one per failing record) and replays are deterministic.
    fn run_key(
        &self,
        key: &str,
        base: &KeyState,
        records: &[&SourceRecord],
        limit: usize,
        now: i64,
        pre_decoded: &mut [Option<O::Input>],
    ) -> KeyRun {
        let limit = limit.min(records.len());
        let mut invalid: HashMap<usize, InvalidInput> = HashMap::new();
        let mut failed: Option<usize> = None;
        'restart: loop {
            let mut slots: BTreeMap<&'static str, Box<dyn TypedSlot>> = BTreeMap::new();
            let mut outcomes = Vec::with_capacity(limit);
            let stop = failed.map_or(limit, |p| p.min(limit));
            for (position, record) in records.iter().enumerate().take(stop) {
                if base.has_applied(&record.origin, &record.sequence) {
                    outcomes.push(Outcome::Replayed);
                    continue;
                }
                if let Some(reason) = invalid.get(&position) {
                    outcomes.push(Outcome::Invalid(reason.clone()));
                    continue;
                }
                let input = match pre_decoded[position].take() {
                    Some(input) => input,
                    None => match self.operator.decode(record) {
                        Ok(input) => input,
                        // Decoding succeeded the first time; a decoder that is not deterministic
                        // still loses nothing: the record is dead-lettered.
                        Err(reason) => {
                            invalid.insert(position, reason);
                            continue 'restart;
                        }
                    },
                };
                let mut outputs = Vec::new();
                let mut ctx = Ctx {
                    key,
                    record,
                    now_millis: now,
                    declared: &self.states,
                    base,
                    slots: &mut slots,
                    outputs: &mut outputs,
                    sinks: &self.sink_limits,
                };
                match self.operator.process(&mut ctx, input) {
                    Ok(()) => outcomes.push(Outcome::Applied(outputs)),
                    Err(ProcessError::Invalid(reason)) => {
                        invalid.insert(position, reason);
                        continue 'restart;
                    }
                    Err(ProcessError::Retry(reason)) => {
                        warn!(operator = %self.namespace.operator, key, sequence = %record.sequence, error = %reason, "record failed; its key stops here");
                        failed = Some(position);
                        continue 'restart;
                    }
                }
            }
            if failed.is_some_and(|p| p < limit) {
                outcomes.push(Outcome::Failed);
            }
            return KeyRun { slots, outcomes };
        }
    }

    /// The state to commit for a key after `run`, with the outputs to send after the commit
    /// (outbox delivery); `None` when nothing changed and nothing needs writing.
    #[allow(clippy::type_complexity)]
    fn next_state(
        &self,
        base: KeyState,
        run: &KeyRun,
        records: &[&SourceRecord],
        now: i64,
        force: bool,
    ) -> Result<Option<(KeyState, Vec<Output>)>, crate::operator::StateError> {
        let mut state = base;
        let mut changed = force || !state.outbox.is_empty();
        for (name, slot) in &run.slots {
            if let Some(update) = slot.encode(name)? {
                let data = state.slots.entry((*name).to_owned()).or_default();
                let dropped = data.apply(update);
                state
                    .retired
                    .extend(dropped.into_iter().map(|id| ((*name).to_owned(), id)));
                if data.entries.is_empty() {
                    state.slots.remove(*name);
                }
                changed = true;
            }
        }
        let mut outbox = Vec::new();
        if self.operator.delivery() == Delivery::Outbox {
            for outcome in &run.outcomes {
                if let Outcome::Applied(outputs) = outcome {
                    outbox.extend(outputs.iter().cloned());
                }
            }
            changed |= !outbox.is_empty();
        }
        if !changed {
            // Nothing to store: a redelivery recomputes the same outputs with the same ids.
            return Ok(None);
        }
        // Within an origin a key's records come in sequence order: the last one applied is the
        // watermark, so each origin is advanced once.
        let mut last: BTreeMap<&crate::domain::Origin, &SourceRecord> = BTreeMap::new();
        for (outcome, record) in run.outcomes.iter().zip(records) {
            if matches!(outcome, Outcome::Applied(_) | Outcome::Invalid(_)) {
                last.insert(&record.origin, record);
            }
        }
        for (origin, record) in last {
            state.advance(
                origin,
                &record.sequence,
                record.arrival_millis.unwrap_or(now),
            );
        }
        state.prune_watermarks(now, self.config.watermark_retention.as_millis() as i64);
        state.outbox = outbox.clone();
        state.expires_at = self
            .operator
            .state_ttl()
            .map(|ttl| now / 1000 + ttl.as_secs() as i64);
        Ok(Some((state, outbox)))
    }

    /// The signature this one replaced, and when this one took over. The first call records
    /// this signature in the operator's history; a failure to read or write the history only
    /// means resets are not counted, so it is logged and passed over.
    async fn previous_signature(&self, now: i64) -> Option<(String, i64)> {
        self.history
            .get_or_init(|| async {
                self.record_signature(now).await.unwrap_or_else(|err| {
                    warn!(operator = %self.namespace.operator, error = %err, "signature history unavailable");
                    None
                })
            })
            .await
            .clone()
    }

    async fn record_signature(&self, now: i64) -> Result<Option<(String, i64)>, StoreError> {
        let namespace = Namespace {
            operator: self.namespace.operator.clone(),
            signature: HISTORY.into(),
        };
        let key = [HISTORY.to_owned()];
        for _ in 0..3 {
            let mut state = self
                .store
                .load(&namespace, &key)
                .await?
                .remove(HISTORY)
                .unwrap_or_default();
            let mut entries: Vec<(String, i64)> = state
                .slots
                .get(HISTORY_SLOT)
                .map(|s| {
                    s.entries
                        .iter()
                        .filter_map(|e| serde_json::from_str(e.get()).ok())
                        .collect()
                })
                .unwrap_or_default();
            if let Some(at) = entries
                .iter()
                .rposition(|(sig, _)| *sig == self.namespace.signature)
            {
                return Ok(at
                    .checked_sub(1)
                    .map(|before| (entries[before].0.clone(), entries[at].1)));
            }
            let previous = entries.last().map(|(sig, _)| (sig.clone(), now));
            entries.push((self.namespace.signature.clone(), now));
            let raw = entries
                .iter()
                .map(|e| serde_json::value::to_raw_value(e).expect("a pair serializes"))
                .collect();
            state.slots.insert(
                HISTORY_SLOT.into(),
                SlotData {
                    segments: Vec::new(),
                    entries: raw,
                },
            );
            let commit = Commit {
                key: HISTORY.into(),
                expected_version: state.version,
                state,
            };
            match self.store.commit(&namespace, vec![commit]).await.remove(0) {
                Ok(()) => return Ok(previous),
                // Another invocation recorded it first: read again.
                Err(StoreError::Conflict) => continue,
                Err(err) => return Err(err),
            }
        }
        Err(StoreError::Conflict)
    }

    /// For keys with no state under the current signature, reads their state under the
    /// signatures migrations come from, and the previous signature: migrated state becomes the
    /// key's loaded state; state left behind is counted as a reset. Returns the migrated keys.
    async fn look_back(
        &self,
        loaded: &mut HashMap<String, KeyState>,
        previous: Option<(String, i64)>,
        report: &mut BatchReport,
    ) -> Result<HashSet<String>, StoreError> {
        let mut migrated = HashSet::new();
        let mut missing: Vec<String> = loaded
            .iter()
            .filter(|(_, s)| s.version == 0)
            .map(|(k, _)| k.clone())
            .collect();
        if missing.is_empty() {
            return Ok(migrated);
        }
        missing.sort();
        let mut signatures: Vec<String> =
            self.migrations.iter().map(|m| m.from.to_owned()).collect();
        if let Some((signature, since)) = previous {
            let recent =
                self.clock.now_millis() - since <= self.config.look_back.as_millis() as i64;
            if recent && !signatures.contains(&signature) {
                signatures.push(signature);
            }
        }
        for signature in signatures {
            if missing.is_empty() {
                break;
            }
            let namespace = Namespace {
                operator: self.namespace.operator.clone(),
                signature: signature.clone(),
            };
            let old = self.store.load(&namespace, &missing).await?;
            let migration = self.migrations.iter().find(|m| m.from == signature);
            missing.retain(|key| {
                let Some(state) = old.get(key).filter(|s| s.version > 0 && !s.slots.is_empty()) else {
                    return true;
                };
                match migration.map(|m| (m.migrate)(&OldState { slots: &state.slots })) {
                    Some(Ok(new)) => {
                        let slots = new
                            .slots
                            .into_iter()
                            .map(|(name, entries)| (name, SlotData { segments: Vec::new(), entries }))
                            .collect();
                        // The watermarks come along: what the old state applied stays applied.
                        let state = KeyState {
                            watermarks: state.watermarks.clone(),
                            outbox: state.outbox.clone(),
                            slots,
                            ..KeyState::default()
                        };
                        loaded.insert(key.clone(), state);
                        migrated.insert(key.clone());
                        report.migrated += 1;
                    }
                    Some(Err(err)) => {
                        warn!(operator = %self.namespace.operator, key, error = %err, "migration failed; the key starts afresh");
                        report.reset += 1;
                    }
                    None => report.reset += 1,
                }
                false
            });
        }
        Ok(migrated)
    }

    fn dead_letter(
        &self,
        record: Option<&SourceRecord>,
        key: Option<&str>,
        invalid: InvalidInput,
    ) -> DeadLetter {
        let problem = match key {
            Some(key) => format!("{} (key {key:?})", invalid.problem),
            None => invalid.problem,
        };
        DeadLetter::new(
            self.operator.name(),
            record.map(|r| r.origin.to_string()),
            record.map(|r| r.sequence.to_string()),
            invalid.field,
            problem,
            record.map(|r| r.raw.to_string()).unwrap_or_default(),
        )
    }

    /// Sends every message to its sink, all sinks at once; returns the tags of messages not sent.
    /// A message a sink refuses for good (too large, a name the service rejects) is dead-lettered
    /// instead: retrying could never deliver it, and nothing may block a key forever.
    async fn emit(&self, emission: Emission, report: &mut BatchReport) -> Vec<Tag> {
        let (mut failed, refused) = self.send_all(emission, report).await;
        if refused.is_empty() {
            return failed;
        }
        let limit = self.sinks.dead_letter_limit();
        let mut letters = Emission::default();
        for (tag, output, err) in refused {
            let letter = DeadLetter::new(
                self.operator.name(),
                None,
                None,
                format!("output.{}", output.sink),
                err.to_string(),
                serde_json::to_string(&output).expect("an output always serializes"),
            );
            letters.push(tag, letter.into_output(limit));
        }
        let (failed_letters, refused_letters) = self.send_all(letters, report).await;
        failed.extend(failed_letters);
        failed.extend(refused_letters.into_iter().map(|(tag, _, _)| tag));
        failed
    }

    /// One round of sends: the tags that failed and may succeed later, and the messages refused
    /// for good (outside the dead-letter sink).
    #[allow(clippy::type_complexity)]
    async fn send_all(
        &self,
        emission: Emission,
        report: &mut BatchReport,
    ) -> (Vec<Tag>, Vec<(Tag, Output, SinkError)>) {
        let by_sink = emission.by_sink;
        let sends = by_sink.iter().map(|(name, (_, outputs))| async move {
            match self.sinks.sinks.get(name) {
                Some(sink) => sink.send(outputs).await,
                // Ctx refuses unknown sinks; an outbox written under an older configuration
                // may still name one. Keep it until the sink is configured again.
                None => (0..outputs.len())
                    .map(|i| (i, SinkError::Unavailable(format!("no sink named {name:?}"))))
                    .collect(),
            }
        });
        let results = join_all(sends).await;
        let (mut failed, mut refused) = (Vec::new(), Vec::new());
        for ((name, (tags, outputs)), failures) in by_sink.into_iter().zip(results) {
            let sent = outputs.len() - failures.len();
            if name == DEAD_LETTER_SINK {
                report.dead_lettered += sent;
            } else {
                report.outputs_sent += sent;
            }
            for (i, err) in failures {
                warn!(sink = %name, id = %outputs[i].id, error = %err, "output not sent");
                if err.is_retryable() || name == DEAD_LETTER_SINK {
                    failed.push(tags[i]);
                } else {
                    refused.push((tags[i], outputs[i].clone(), err));
                }
            }
        }
        (failed, refused)
    }
}

/// Messages to send, grouped by sink, each with the tag that maps a failure back to its record.
#[derive(Default)]
struct Emission {
    by_sink: BTreeMap<String, (Vec<Tag>, Vec<Output>)>,
}

impl Emission {
    fn push(&mut self, tag: Tag, output: Output) {
        let entry = match self.by_sink.get_mut(&output.sink) {
            Some(entry) => entry,
            None => self.by_sink.entry(output.sink.clone()).or_default(),
        };
        entry.0.push(tag);
        entry.1.push(output);
    }
}

fn count_applied(outcomes: &[Outcome]) -> usize {
    outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Applied(_)))
        .count()
}

fn count_replayed(outcomes: &[Outcome]) -> usize {
    outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Replayed))
        .count()
}

/// The sequence number of a key's first record in the batch.
fn batch_sequence(group_records: &[usize], records: &[Option<&SourceRecord>]) -> SequenceNumber {
    records[group_records[0]]
        .expect("keyed records decoded")
        .sequence
        .clone()
}
