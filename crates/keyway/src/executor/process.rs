//! Phase 3: each key's records through the operator, in order, from the key's loaded state.
//!
//! A record whose processing fails may have changed the typed state before failing, so the run
//! restarts from the loaded state without it; restarts are rare (one per failing record) and
//! replays are deterministic. A key's run ends with its state encoded and checked against what the
//! store can hold: a record that makes the state unstorable is found and dead-lettered.

use std::collections::{BTreeMap, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};

use tracing::{error, warn};

use super::plan::Plan;
use super::Executor;
use crate::domain::{KeyState, Origin, Output, SlotUpdate, SourceRecord};
use crate::operator::{Ctx, InvalidInput, KeyedOperator, ProcessError, TypedSlot};

/// What happened to one record of a key.
#[derive(Clone, Debug)]
pub(super) enum Outcome {
    /// Already applied by an earlier invocation.
    Replayed,
    Applied(Vec<Output>),
    /// Dead-lettered.
    Invalid(InvalidInput),
    /// Stopped the key: this and every later record of the key stay unapplied.
    Failed,
    /// Not run in this invocation (the key reached its lineages per commit): this and every later
    /// record of the key are left for the redelivery, without an error.
    Deferred,
}

impl Outcome {
    /// Whether the record's lineage watermark moves past it.
    pub fn advances(&self) -> bool {
        matches!(self, Outcome::Applied(_) | Outcome::Invalid(_))
    }
}

/// One key's records run from its loaded state.
#[derive(Default)]
pub(super) struct KeyRun {
    pub slots: BTreeMap<&'static str, Box<dyn TypedSlot>>,
    /// One per record that ran, in order; shorter than the key's records when one stopped it.
    pub outcomes: Vec<Outcome>,
    pub panicked: bool,
}

/// A key through the phases.
#[derive(Default)]
pub(super) struct KeyWork {
    pub base: KeyState,
    /// State carried over from an older signature: written even if nothing else changes.
    pub migrated: bool,
    pub run: KeyRun,
    /// The run's slot changes, encoded.
    pub updates: BTreeMap<&'static str, SlotUpdate>,
    /// Records found invalid, by position in the key's records: dead-lettered by every run.
    pub invalid: HashMap<usize, InvalidInput>,
    /// How many of the key's records stay applied once their outputs went out.
    pub keep: usize,
    /// The outbox an earlier invocation left could not be sent: the key changes nothing now.
    pub blocked: bool,
    /// Not started: the invocation's deadline was near.
    pub deferred: bool,
}

impl<O: KeyedOperator> Executor<O> {
    pub(super) fn process(
        &self,
        plan: &Plan<'_>,
        inputs: &mut [Option<O::Input>],
        keys: &mut [KeyWork],
        now: i64,
        deadline_millis: Option<i64>,
    ) {
        let reserve = self.config.deadline_reserve.as_millis() as i64;
        for (g, work) in keys.iter_mut().enumerate() {
            if deadline_millis.is_some_and(|d| self.clock.now_millis() >= d - reserve) {
                work.deferred = true;
                continue;
            }
            let records = plan.records_of(g);
            let mut inputs: Vec<Option<O::Input>> = plan.groups[g]
                .records
                .iter()
                .map(|&i| inputs[i].take())
                .collect();
            let key = plan.groups[g].key.as_str();
            loop {
                let run = self.run_key(key, work, &records, usize::MAX, now, &mut inputs);
                match self.encode(&run) {
                    Ok(updates) => {
                        work.updates = updates;
                        work.run = run;
                        break;
                    }
                    Err(reason) => {
                        let culprit = self.find_culprit(key, work, &records, now);
                        warn!(operator = %self.namespace.operator, key, sequence = %records[culprit].sequence, problem = %reason, "a record makes the key's state unstorable; it is dead-lettered");
                        work.invalid.insert(culprit, reason);
                    }
                }
            }
        }
    }

    /// Runs up to `limit` records of one key from its loaded state.
    pub(super) fn run_key(
        &self,
        key: &str,
        work: &mut KeyWork,
        records: &[&SourceRecord],
        limit: usize,
        now: i64,
        inputs: &mut [Option<O::Input>],
    ) -> KeyRun {
        let limit = limit.min(records.len());
        let mut failed: Option<usize> = None;
        let mut panicked = false;
        'restart: loop {
            let mut run = KeyRun::default();
            // Usually one or a few: a vector is cheaper than a set.
            let mut lineages: Vec<&Origin> = Vec::new();
            let stop = failed.map_or(limit, |p| p.min(limit));
            for (position, record) in records.iter().enumerate().take(stop) {
                let lineage = self.lineage_of(record);
                if work.base.watermarks.has_applied(
                    lineage,
                    &record.sequence,
                    record.arrival_millis,
                ) {
                    run.outcomes.push(Outcome::Replayed);
                    continue;
                }
                if !lineages.contains(&lineage) {
                    if lineages.len() == self.limits.lineages_per_commit {
                        run.outcomes.push(Outcome::Deferred);
                        run.panicked = panicked;
                        return run;
                    }
                    lineages.push(lineage);
                }
                if let Some(reason) = work.invalid.get(&position) {
                    run.outcomes.push(Outcome::Invalid(reason.clone()));
                    continue;
                }
                let input = match inputs[position].take() {
                    Some(input) => input,
                    None => match self.operator.decode(record) {
                        Ok(input) => input,
                        // Decoding succeeded the first time; a decoder that is not deterministic
                        // still loses nothing: the record is dead-lettered.
                        Err(reason) => {
                            work.invalid.insert(position, reason);
                            continue 'restart;
                        }
                    },
                };
                let mut outputs = Vec::new();
                let mut ctx = Ctx {
                    key,
                    operator: &self.namespace.operator,
                    record,
                    now_millis: now,
                    declared: &self.states,
                    base: &work.base,
                    slots: &mut run.slots,
                    outputs: &mut outputs,
                    sinks: &self.sink_limits,
                };
                match catch_unwind(AssertUnwindSafe(|| self.operator.process(&mut ctx, input))) {
                    Ok(Ok(())) => run.outcomes.push(Outcome::Applied(outputs)),
                    Ok(Err(ProcessError::Invalid(reason))) => {
                        work.invalid.insert(position, reason);
                        continue 'restart;
                    }
                    Ok(Err(ProcessError::Retry(reason))) => {
                        warn!(operator = %self.namespace.operator, key, sequence = %record.sequence, error = %reason, "record failed; its key stops here");
                        failed = Some(position);
                        continue 'restart;
                    }
                    Err(_) => {
                        error!(operator = %self.namespace.operator, key, sequence = %record.sequence, "the operator panicked; its key stops here");
                        panicked = true;
                        failed = Some(position);
                        continue 'restart;
                    }
                }
            }
            if failed.is_some_and(|p| p < limit) {
                run.outcomes.push(Outcome::Failed);
            }
            run.panicked = panicked;
            return run;
        }
    }

    /// The run's slot changes, encoded and checked against the store's limits.
    pub(super) fn encode(
        &self,
        run: &KeyRun,
    ) -> Result<BTreeMap<&'static str, SlotUpdate>, InvalidInput> {
        let mut updates = BTreeMap::new();
        for (name, slot) in &run.slots {
            let update = slot
                .encode(name)
                .map_err(|e| InvalidInput::new(format!("state.{name}"), e.to_string()))?;
            let Some(update) = update else { continue };
            if let Some(entry) = update
                .tail
                .iter()
                .find(|e| e.get().len() > self.limits.max_entry_bytes)
            {
                return Err(InvalidInput::new(
                    format!("state.{name}"),
                    format!(
                        "an entry of {} bytes is more than the state store holds ({} bytes)",
                        entry.get().len(),
                        self.limits.max_entry_bytes
                    ),
                ));
            }
            updates.insert(*name, update);
        }
        Ok(updates)
    }

    /// The record whose processing first makes the key's state fail to encode: the shortest run
    /// that fails ends with it.
    fn find_culprit(
        &self,
        key: &str,
        work: &mut KeyWork,
        records: &[&SourceRecord],
        now: i64,
    ) -> usize {
        let (mut good, mut bad) = (0, records.len());
        while bad - good > 1 {
            let mid = (good + bad) / 2;
            let mut inputs: Vec<Option<O::Input>> = records.iter().map(|_| None).collect();
            let run = self.run_key(key, work, records, mid, now, &mut inputs);
            if self.encode(&run).is_ok() {
                good = mid;
            } else {
                bad = mid;
            }
        }
        bad - 1
    }

    /// Runs a key again with only its first `keep` records, after some of its outputs could not be
    /// sent; the replay recomputes their state and outputs exactly.
    pub(super) fn replay(
        &self,
        key: &str,
        work: &mut KeyWork,
        records: &[&SourceRecord],
        now: i64,
    ) -> Result<(), InvalidInput> {
        let mut inputs: Vec<Option<O::Input>> = records.iter().map(|_| None).collect();
        let run = self.run_key(key, work, records, work.keep, now, &mut inputs);
        work.updates = self.encode(&run)?;
        work.run = run;
        Ok(())
    }
}

/// How many records of a run count as applied, and as replayed.
pub(super) fn counts(outcomes: &[Outcome]) -> (usize, usize) {
    outcomes.iter().fold((0, 0), |(a, r), o| match o {
        Outcome::Applied(_) => (a + 1, r),
        Outcome::Replayed => (a, r + 1),
        _ => (a, r),
    })
}
