//! Phase 3: each key's records through the operator, in order, from the key's loaded state.
//!
//! A record whose processing fails may have changed the typed state before failing, so the run
//! restarts from the loaded state without it; restarts are rare (one per failing record) and
//! replays are deterministic. A key's run ends with its state encoded and checked against what the
//! store can hold: a record that makes the state unstorable is found and dead-lettered.

use std::collections::{BTreeMap, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use tracing::{error, warn};

use super::load::OldHead;
use super::plan::Plan;
use super::Executor;
use crate::domain::{KeyState, Origin, Output, SentNotes, SlotUpdate, SourceRecord};
use crate::operator::{
    BroadcastSnapshot, Ctx, Delivery, InvalidInput, KeyedOperator, ProcessError, TypedSlot,
    BROADCAST_KEY,
};

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
    pub(super) fn advances(&self) -> bool {
        matches!(self, Outcome::Applied(_) | Outcome::Invalid(_))
    }
}

/// Why a record's input could not be had again.
enum DecodeAgain {
    Invalid(InvalidInput),
    /// The key was answered without its state, and the operator no longer can answer this record.
    Unanswered,
}

/// One key's records run from its loaded state.
#[derive(Default)]
pub(super) struct KeyRun {
    pub slots: BTreeMap<&'static str, Box<dyn TypedSlot>>,
    /// One per record that ran, in order; shorter than the key's records when one stopped it.
    pub outcomes: Vec<Outcome>,
    pub panicked: bool,
}

/// A slot's change, and when the state expires if the run said so (epoch milliseconds).
pub(super) struct Change {
    pub update: SlotUpdate,
    pub expires_at: Option<i64>,
}

/// A key through the phases.
#[derive(Default)]
pub(super) struct KeyWork {
    pub base: KeyState,
    /// The older signature's state this one was carried over from (a migration): the carried
    /// state is written even if nothing else changes, and the old retired once it lands.
    pub migrated_from: Option<OldHead>,
    pub run: KeyRun,
    /// The run's slot changes, encoded.
    pub updates: BTreeMap<&'static str, Change>,
    /// Records found invalid, by position in the key's records: dead-lettered by every run.
    pub invalid: HashMap<usize, InvalidInput>,
    /// How many of the key's records stay applied once their outputs went out.
    pub keep: usize,
    /// The outbox an earlier invocation left could not be sent: the key changes nothing now.
    pub blocked: bool,
    /// Not started: the invocation's deadline was near.
    pub deferred: bool,
    /// Its stored state could not be read: the key changes nothing now, and its records are
    /// redelivered.
    pub unreadable: bool,
    /// The operator's broadcast states as the batch loaded them.
    pub broadcast: Option<Arc<BroadcastSnapshot>>,
    /// States past their own TTL were dropped from `base`: the key is written even if nothing
    /// else changes.
    pub expired: bool,
    /// The operator answers the key's records without its state, which was not read: the key
    /// touches no state and commits nothing (`KeyedOperator::answer_without_state`).
    pub without_state: bool,
    /// What went out of the outputs of the records that stay unapplied: committed with the key,
    /// so that their retry sends only the rest.
    pub sent_so_far: Option<SentNotes>,
    /// The invocation's deadline, if it has one (`Ctx::deadline_millis`).
    pub deadline: Option<i64>,
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
            if work.unreadable {
                continue;
            }
            if deadline_millis.is_some_and(|d| self.clock.now_millis() >= d - reserve) {
                work.deferred = true;
                continue;
            }
            self.drop_expired_states(work, now);
            work.deadline = deadline_millis;
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

    /// Drops the states of the key's loaded state whose own time (TTL or expiry) has passed.
    pub(super) fn drop_expired_states(&self, work: &mut KeyWork, now: i64) {
        work.expired |= super::expiry::drop_expired(&mut work.base, now.div_euclid(1000));
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
                let timer = record.as_timer().map(|(_, at)| at);
                match self.gate(record, work, &mut lineages) {
                    None => {}
                    Some(Outcome::Deferred) => {
                        run.outcomes.push(Outcome::Deferred);
                        run.panicked = panicked;
                        return run;
                    }
                    Some(outcome) => {
                        run.outcomes.push(outcome);
                        continue;
                    }
                }
                if let Some(reason) = work.invalid.get(&position) {
                    if let Some(at) = timer {
                        // A dead-lettered firing is the timer's one firing: left pending, it
                        // would never come due again, its index entry gone with the firing.
                        let mut outputs = Vec::new();
                        let mut ctx =
                            self.ctx(key, record, now, work, &mut run.slots, &mut outputs);
                        if let Err(e) = ctx.take_timer(at) {
                            warn!(operator = %self.namespace.operator, key, at, error = %e, "a dead-lettered firing's timer could not be taken off the key");
                        }
                    }
                    run.outcomes.push(Outcome::Invalid(reason.clone()));
                    continue;
                }
                let input = match (timer, inputs[position].take()) {
                    (Some(_), _) => None,
                    (None, Some(input)) => Some(input),
                    (None, None) => match self.decode_again(key, record, work.without_state, now) {
                        Ok(input) => Some(input),
                        // Decoding succeeded the first time; a decoder that is not deterministic
                        // still loses nothing: the record is dead-lettered.
                        Err(DecodeAgain::Invalid(reason)) => {
                            work.invalid.insert(position, reason);
                            continue 'restart;
                        }
                        Err(DecodeAgain::Unanswered) => {
                            warn!(operator = %self.namespace.operator, key, sequence = %record.sequence, "a key answered without its state can no longer be; its records will be redelivered");
                            failed = Some(position);
                            continue 'restart;
                        }
                    },
                };
                let mut outputs = Vec::new();
                let ctx = self.ctx(key, record, now, work, &mut run.slots, &mut outputs);
                match self.call(ctx, input, timer) {
                    Ok(Ok(true)) => run.outcomes.push(Outcome::Applied(outputs)),
                    // The timer fired already, or was cancelled.
                    Ok(Ok(false)) => run.outcomes.push(Outcome::Replayed),
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
            // A record stopped the key (one that ran, so within the limit).
            if failed.is_some() {
                run.outcomes.push(Outcome::Failed);
            }
            run.panicked = panicked;
            return run;
        }
    }

    /// What `process` sees of `key` for `record`.
    fn ctx<'c>(
        &'c self,
        key: &'c str,
        record: &'c SourceRecord,
        now: i64,
        work: &'c KeyWork,
        slots: &'c mut BTreeMap<&'static str, Box<dyn TypedSlot>>,
        outputs: &'c mut Vec<Output>,
    ) -> Ctx<'c> {
        Ctx {
            key,
            operator: &self.namespace.operator,
            record,
            now_millis: now,
            deadline_millis: work.deadline,
            declared: if key == BROADCAST_KEY {
                &self.broadcast_states
            } else {
                &self.states
            },
            base: &work.base,
            slots,
            outputs,
            sinks: &self.sink_limits,
            broadcast: work.broadcast.as_deref(),
            without_state: work.without_state,
            outbox: self.operator.delivery() == Delivery::Outbox,
        }
    }

    /// A record's input decoded again, for a key run again from its first record. A key answered
    /// without its state asks the operator again, for this record alone, and stops (to be
    /// redelivered) if the operator no longer can: its state was not read.
    fn decode_again(
        &self,
        key: &str,
        record: &SourceRecord,
        without_state: bool,
        now: i64,
    ) -> Result<O::Input, DecodeAgain> {
        let mut input = self.operator.decode(record).map_err(DecodeAgain::Invalid)?;
        if without_state
            && !self
                .operator
                .answer_without_state(key, record, &mut input, now)
        {
            return Err(DecodeAgain::Unanswered);
        }
        Ok(input)
    }

    /// The outcome a record gets without running, or `None` when it runs: a record its key
    /// applied already is replayed, and one of a lineage beyond what a commit may advance is
    /// deferred. (A timer record guards itself: it fires only while its timer is pending.)
    fn gate<'r>(
        &self,
        record: &'r SourceRecord,
        work: &KeyWork,
        lineages: &mut Vec<&'r Origin>,
    ) -> Option<Outcome> {
        if record.as_timer().is_some() {
            return None;
        }
        let lineage = self.lineage_of(record);
        if work
            .base
            .watermarks
            .has_applied(lineage, &record.sequence, record.arrival_millis)
        {
            return Some(Outcome::Replayed);
        }
        // A key answered without its state commits nothing: no commit to keep small.
        if !work.without_state && !lineages.contains(&lineage) {
            if lineages.len() == self.limits.lineages_per_commit {
                return Some(Outcome::Deferred);
            }
            lineages.push(lineage);
        }
        None
    }

    /// `process` with the record's input, or `on_timer` for a timer record; says whether it
    /// ran (a timer no longer pending does not), and catches a panic.
    fn call(
        &self,
        mut ctx: Ctx<'_>,
        input: Option<O::Input>,
        timer: Option<i64>,
    ) -> std::thread::Result<Result<bool, ProcessError>> {
        catch_unwind(AssertUnwindSafe(|| match (input, timer) {
            (Some(input), _) => self.operator.process(&mut ctx, input).map(|()| true),
            (None, Some(at)) => self.fire(&mut ctx, at),
            (None, None) => unreachable!("a record runs with its input or as a timer"),
        }))
    }

    /// Fires the key's timer at `at` if it is still pending; says whether it was.
    fn fire(&self, ctx: &mut Ctx<'_>, at: i64) -> Result<bool, ProcessError> {
        if !ctx.take_timer(at)? {
            return Ok(false);
        }
        self.operator.on_timer(ctx, at)?;
        Ok(true)
    }

    /// The run's slot changes, encoded and checked against the store's limits.
    pub(super) fn encode(
        &self,
        run: &KeyRun,
    ) -> Result<BTreeMap<&'static str, Change>, InvalidInput> {
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
            let expires_at = slot.expires_at();
            updates.insert(*name, Change { update, expires_at });
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

#[cfg(test)]
mod tests {
    use super::super::testkit::{bench, record, Summer, START};
    use super::*;
    use crate::domain::SourceRecord;

    fn run(b: &super::super::testkit::Bench<Summer>, batch: &[SourceRecord]) -> KeyWork {
        let records: Vec<&SourceRecord> = batch.iter().collect();
        let mut work = KeyWork::default();
        let mut inputs: Vec<Option<(String, i64)>> = records.iter().map(|_| None).collect();
        work.run = b
            .executor
            .run_key("a", &mut work, &records, usize::MAX, START, &mut inputs);
        work
    }

    fn records(specs: &[(u64, &str, i64)]) -> Vec<SourceRecord> {
        specs
            .iter()
            .map(|(seq, pk, n)| record(*seq, pk, "a", *n).unwrap())
            .collect()
    }

    #[test]
    fn a_record_that_fails_stops_its_key_and_one_found_invalid_is_left_out() {
        let b = bench(Summer::default(), false);
        let batch = records(&[
            (1, "p", 1),
            (2, "p", -1),
            (3, "p", 2),
            (4, "p", 13),
            (5, "p", 4),
        ]);
        let work = run(&b, &batch);
        let kinds: Vec<&str> = work
            .run
            .outcomes
            .iter()
            .map(|o| match o {
                Outcome::Applied(_) => "applied",
                Outcome::Invalid(_) => "invalid",
                Outcome::Failed => "failed",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["applied", "invalid", "applied", "failed"]);
        let Outcome::Applied(outputs) = &work.run.outcomes[2] else {
            panic!()
        };
        assert_eq!(
            outputs[0].body, "3",
            "the run restarted without the invalid record"
        );
    }

    #[tokio::test]
    async fn state_a_sink_or_timers_the_operator_never_declared_dead_letter_the_record_naming_it_and_its_key_goes_on(
    ) {
        let b = bench(Summer::default(), false);
        let report = b
            .executor
            .run(vec![
                record(1, "p", "a", 21),
                record(2, "p", "a", 22),
                record(3, "p", "a", 23),
                record(4, "p", "a", 5),
            ])
            .await;
        assert_eq!((report.applied, report.dead_lettered), (1, 3));
        assert_eq!(report.failed_from, None, "no record is held for a retry");
        assert_eq!(b.out.bodies().concat(), ["5"]);
        let letters = b.dead.bodies().concat().join("\n");
        for (field, problem) in [
            ("state.forgotten", "state \\\"forgotten\\\" is not declared"),
            ("output.forgotten", "sink \\\"forgotten\\\" is not declared"),
            ("state.keyway.timers", "timers are not declared"),
        ] {
            assert!(letters.contains(field), "{field} in {letters}");
            assert!(letters.contains(problem), "{problem} in {letters}");
        }
    }

    #[test]
    fn a_panic_in_the_operator_fails_its_key_like_a_retryable_error() {
        let b = bench(Summer::default(), false);
        let work = run(&b, &records(&[(1, "p", 1), (2, "p", 66), (3, "p", 2)]));
        assert!(work.run.panicked);
        assert!(matches!(
            work.run.outcomes[..],
            [Outcome::Applied(_), Outcome::Failed]
        ));
    }

    #[test]
    fn a_key_that_reaches_its_lineages_per_commit_leaves_the_rest_for_the_redelivery() {
        let mut b = bench(Summer::default(), false);
        b.executor.limits.lineages_per_commit = 3;
        let batch = records(&[
            (1, "p1", 1),
            (2, "p2", 1),
            (3, "p1", 1),
            (4, "p3", 1),
            (5, "p4", 1),
        ]);
        let work = run(&b, &batch);
        assert_eq!(work.run.outcomes.len(), 5);
        assert!(matches!(work.run.outcomes[4], Outcome::Deferred));
    }

    #[tokio::test]
    async fn a_key_answered_without_its_state_is_not_held_to_the_lineages_a_commit_takes() {
        let mut b = bench(
            Summer {
                facts: true,
                ..Summer::default()
            },
            false,
        );
        b.executor.limits.lineages_per_commit = 3;
        let batch = (1..=5)
            .map(|i| record(i, &format!("p{i}"), "a", 1000 + i as i64))
            .collect();
        let report = b.executor.run(batch).await;
        assert_eq!((report.failed_from, report.applied), (None, 5));
        assert_eq!(b.out.bodies().concat().len(), 5);
    }

    #[tokio::test]
    async fn an_entry_of_exactly_the_stores_limit_is_kept() {
        let mut b = bench(Summer::default(), false);
        b.executor.limits.max_entry_bytes = 3;
        let report = b.executor.run(vec![record(1, "p", "a", 100)]).await;
        assert_eq!((report.applied, report.dead_lettered), (1, 0));
    }

    #[test]
    fn the_record_that_makes_the_state_too_large_is_found_among_the_others() {
        let mut b = bench(Summer::default(), false);
        // A sum of four digits or more is more than the store holds.
        b.executor.limits.max_entry_bytes = 3;
        let batch = records(&[(1, "p", 1), (2, "p", 5), (3, "p", 2000), (4, "p", 7)]);
        let refs: Vec<&SourceRecord> = batch.iter().collect();
        let mut work = KeyWork::default();
        assert_eq!(b.executor.find_culprit("a", &mut work, &refs, START), 2);
    }
}
