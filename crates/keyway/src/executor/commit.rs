//! Phase 5: each key's new state, with its watermarks advanced, committed conditional on the
//! version it was loaded at. Keys with records left unapplied report the first of them.

use std::collections::{BTreeMap, HashSet};

use tracing::warn;

use super::emit::{Emission, Tag};
use super::expiry;
use super::load::OldHead;
use super::plan::Plan;
use super::process::{counts, KeyWork, Outcome};
use super::{BatchReport, Executor};
use crate::domain::{KeyState, Output, SourceRecord};
use crate::operator::{pending_timers, take_stored_timer, Delivery, InvalidInput, KeyedOperator};
use crate::ports::{Commit, Committed, LoadKey, Namespace, StoreError, TimerEntry};

/// A key committed with outputs in its outbox, still to be sent.
pub(super) struct PendingOutbox {
    pub group: usize,
    pub committed: Committed,
    pub outputs: Vec<Output>,
}

/// How often an outbox operator's key that lost a commit race is run again on the winner's state
/// within the invocation, before it is left to Lambda's redelivery.
const CONFLICT_RETRIES: usize = 2;

/// A commit ready to go, for the key of a group.
struct Ready {
    group: usize,
    commit: Commit,
    outputs: Vec<Output>,
    /// Timers the commit sets that the key did not have: indexed before it lands.
    timers: Vec<i64>,
}

impl<O: KeyedOperator> Executor<O> {
    pub(super) async fn commit_all(
        &self,
        plan: &Plan<'_>,
        keys: &mut [KeyWork],
        now: i64,
        report: &mut BatchReport,
    ) -> Vec<PendingOutbox> {
        let mut ready = Vec::new();
        for (g, work) in keys.iter_mut().enumerate() {
            report.panics += usize::from(work.run.panicked);
            if let Some(r) = self.ready(plan, g, work, now, report) {
                ready.push(r);
            }
        }
        self.retire_noted(keys, &mut ready, now).await;
        let mut outboxes = Vec::new();
        for round in 0..=CONFLICT_RETRIES {
            let conflicted = self
                .commit_round(plan, keys, ready, now, report, &mut outboxes)
                .await;
            report.conflicts += conflicted.len();
            // Outputs of emit-then-commit went out computed from the state that lost the race:
            // only the redelivery, on the winner's state, may compute them again.
            let again = round < CONFLICT_RETRIES && self.operator.delivery() == Delivery::Outbox;
            if !again {
                for g in conflicted {
                    report.fail(&plan.record(plan.groups[g].records[0]).sequence);
                }
                break;
            }
            ready = self.rerun(plan, keys, conflicted, now, report).await;
        }
        outboxes
    }

    /// A key's commit after its sends: its records that stay replayed if fewer than ran, its
    /// unapplied records reported; `None` when the key commits nothing.
    fn ready(
        &self,
        plan: &Plan<'_>,
        g: usize,
        work: &mut KeyWork,
        now: i64,
        report: &mut BatchReport,
    ) -> Option<Ready> {
        let records = plan.records_of(g);
        let key = plan.groups[g].key.as_str();
        if work.deferred || work.blocked || work.unreadable {
            // Not started, or an earlier outbox still waits (later outputs must not overtake
            // it), or its state could not be read. The redelivery starts the key again.
            report.deferred_keys += usize::from(work.deferred);
            report.fail(&records[0].sequence);
            return None;
        }
        if work.keep < work.run.outcomes.len() {
            if let Err(reason) = self.replay(key, work, &records, now) {
                warn!(operator = %self.namespace.operator, key, problem = %reason, "the key's shorter run does not encode; its records will be redelivered");
                report.fail(&records[0].sequence);
                return None;
            }
        }
        if work.keep < records.len() {
            report.fail(&records[work.keep].sequence);
        }
        match self.next_state(work, &records, now) {
            Some((state, outputs, timers)) => Some(Ready {
                group: g,
                commit: Commit {
                    key: key.to_owned(),
                    expected_version: state.version,
                    state,
                    redelivery_window: self.config.redelivery_window,
                },
                outputs,
                timers,
            }),
            None => {
                let (applied, replayed) = counts(&work.run.outcomes);
                report.applied += applied;
                report.replayed += replayed;
                None
            }
        }
    }

    /// Commits every ready key at once; returns the groups whose commit lost a race.
    async fn commit_round(
        &self,
        plan: &Plan<'_>,
        // Mutable only to be `Send` across the awaits: a run's typed state is not `Sync`.
        keys: &mut [KeyWork],
        ready: Vec<Ready>,
        now: i64,
        report: &mut BatchReport,
        outboxes: &mut Vec<PendingOutbox>,
    ) -> Vec<usize> {
        let ready = self.schedule_timers(plan, ready, now, report).await;
        let (groups, commits): (Vec<(usize, Vec<Output>)>, Vec<Commit>) = ready
            .into_iter()
            .map(|r| ((r.group, r.outputs), r.commit))
            .unzip();
        let results = self.store.commit(&self.namespace, commits).await;
        let mut conflicted = Vec::new();
        let mut retiring = Vec::new();
        for ((g, outputs), result) in groups.into_iter().zip(results) {
            match result {
                Ok(committed) => {
                    report.commits += 1;
                    if let Some(old) = keys[g].migrated_from.take() {
                        retiring.push((plan.groups[g].key.clone(), old));
                    }
                    let (applied, replayed) = counts(&keys[g].run.outcomes);
                    report.applied += applied;
                    report.replayed += replayed;
                    if !outputs.is_empty() {
                        outboxes.push(PendingOutbox {
                            group: g,
                            committed,
                            outputs,
                        });
                    }
                }
                Err(StoreError::Conflict) => conflicted.push(g),
                Err(err) if err.is_retryable() => {
                    warn!(operator = %self.namespace.operator, key = %plan.groups[g].key, error = %err, "commit failed; the key's records will be redelivered");
                    report.fail(&plan.record(plan.groups[g].records[0]).sequence);
                }
                Err(err) => {
                    let outcomes = &keys[g].run.outcomes;
                    self.dead_letter_first(plan, g, outcomes, err, now, report)
                        .await
                }
            }
        }
        self.retire_old_heads(retiring, now).await;
        conflicted
    }

    /// Writes the older signature's state each migrated key was carried over from empty and
    /// expiring at once, now that the carried state landed: a load that finds the key missing
    /// under the current signature (once its state there expired) must not carry it over again.
    /// The keys whose old state was retired; the others' notes stay for their next commit.
    async fn retire_old_heads(
        &self,
        retiring: Vec<(String, OldHead)>,
        now: i64,
    ) -> HashSet<String> {
        let mut retired = HashSet::new();
        let mut by_signature: BTreeMap<String, Vec<Commit>> = BTreeMap::new();
        for (key, old) in retiring {
            let mut state = old.state;
            state.expires_at = Some(now.div_euclid(1000));
            by_signature.entry(old.signature).or_default().push(Commit {
                key,
                expected_version: state.version,
                state,
                redelivery_window: self.config.redelivery_window,
            });
        }
        for (signature, commits) in by_signature {
            let namespace = Namespace {
                signature,
                ..self.namespace.clone()
            };
            let keys: Vec<String> = commits.iter().map(|c| c.key.clone()).collect();
            let results = self.store.commit(&namespace, commits).await;
            for (key, result) in keys.into_iter().zip(results) {
                match result {
                    Ok(_) => {
                        retired.insert(key);
                    }
                    Err(err) => {
                        warn!(operator = %namespace.operator, key, signature = %namespace.signature, error = %err, "the state the key was migrated from could not be retired: its next commit tries again");
                    }
                }
            }
        }
        retired
    }

    /// Retires, before their commits, the older signature's state that keys' notes name (a
    /// migration whose own retirement did not land, or landed unseen by the key's state): the
    /// commit then drops the note. Now that the key's state under the current signature exists,
    /// the old one is never needed again. A note whose state cannot be read or retired stays for
    /// the key's next commit.
    async fn retire_noted(
        &self,
        // Mutable only to be `Send` across the awaits: a run's typed state is not `Sync`.
        keys: &mut [KeyWork],
        ready: &mut [Ready],
        now: i64,
    ) {
        let mut by_signature: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, r) in ready.iter().enumerate() {
            // A key migrated in this batch is retired once its commit lands.
            if keys[r.group].migrated_from.is_some() {
                continue;
            }
            if let Some(retiring) = &r.commit.state.retiring {
                by_signature
                    .entry(retiring.signature.clone())
                    .or_default()
                    .push(i);
            }
        }
        for (signature, noted) in by_signature {
            let namespace = Namespace {
                signature: signature.clone(),
                ..self.namespace.clone()
            };
            let requests: Vec<LoadKey<'_>> = noted
                .iter()
                .map(|&i| LoadKey::from(ready[i].commit.key.as_str()))
                .collect();
            let Ok(mut old) = self.store.load_keys(&namespace, &requests).await else {
                continue;
            };
            let mut retiring = Vec::new();
            for &i in &noted {
                let key = &ready[i].commit.key;
                match old.remove(key) {
                    Some(state) if !state.slots.is_empty() => {
                        let read = ready[i].commit.state.retiring.as_ref();
                        if read.is_some_and(|r| r.version != state.version) {
                            warn!(operator = %namespace.operator, key, signature = %namespace.signature, "the state the key was migrated from was written after the migration (by the release before, still running?): what that wrote is not carried over");
                        }
                        retiring.push((key.clone(), OldHead::of(signature.clone(), &state)));
                    }
                    // Retired, or gone.
                    _ => ready[i].commit.state.retiring = None,
                }
            }
            let retired = self.retire_old_heads(retiring, now).await;
            for &i in &noted {
                if retired.contains(&ready[i].commit.key) {
                    ready[i].commit.state.retiring = None;
                }
            }
        }
    }

    /// Writes the due-time index entries of the timers the commits set, before the commits: an
    /// entry whose commit then fails is skipped when it comes due. Keys whose entries could not
    /// be written do not commit; their records are redelivered.
    async fn schedule_timers(
        &self,
        plan: &Plan<'_>,
        ready: Vec<Ready>,
        now: i64,
        report: &mut BatchReport,
    ) -> Vec<Ready> {
        let entries: Vec<TimerEntry> = ready
            .iter()
            .flat_map(|r| {
                r.timers.iter().map(|&at_millis| TimerEntry {
                    at_millis,
                    key: r.commit.key.clone(),
                })
            })
            .collect();
        if entries.is_empty() {
            return ready;
        }
        let operator = &self.namespace.operator;
        let Err(err) = self
            .store
            .timers()
            .schedule_timers(operator, &entries, now)
            .await
        else {
            return ready;
        };
        warn!(operator = %operator, error = %err, "timers could not be indexed; the keys that set them will be redelivered");
        let (setting, rest): (Vec<Ready>, Vec<Ready>) =
            ready.into_iter().partition(|r| !r.timers.is_empty());
        for r in setting {
            report.fail(&plan.record(plan.groups[r.group].records[0]).sequence);
        }
        rest
    }

    /// Runs keys that lost a commit race again, on the state the winner committed. A key the
    /// winner left an unsent outbox in, or whose run now dead-letters a record it did not before,
    /// is left to the redelivery (the outbox and the dead letter must go out first).
    async fn rerun(
        &self,
        plan: &Plan<'_>,
        keys: &mut [KeyWork],
        conflicted: Vec<usize>,
        now: i64,
        report: &mut BatchReport,
    ) -> Vec<Ready> {
        let requests: Vec<LoadKey<'_>> = conflicted
            .iter()
            .map(|&g| LoadKey {
                key: &plan.groups[g].key,
                lineages: plan
                    .records_of(g)
                    .into_iter()
                    .map(|r| self.lineage_of(r))
                    .collect(),
            })
            .collect();
        // A key that cannot be read again is left to the redelivery.
        let mut loaded = self
            .store
            .load_keys(&self.namespace, &requests)
            .await
            .unwrap_or_default();
        let mut ready = Vec::new();
        for g in conflicted {
            let records = plan.records_of(g);
            let key = plan.groups[g].key.as_str();
            let fresh = loaded.remove(key).filter(|s| s.outbox.is_empty());
            let work = &mut keys[g];
            let rerun = fresh.and_then(|base| {
                let invalid = work.invalid.len();
                work.base = base;
                // The winner wrote the key under the current signature: a migration of its own
                // retires what it carried over.
                work.migrated_from = None;
                self.drop_expired_states(work, now);
                let mut inputs: Vec<Option<O::Input>> = records.iter().map(|_| None).collect();
                let run = self.run_key(key, work, &records, usize::MAX, now, &mut inputs);
                let updates = self.encode(&run).ok()?;
                (work.invalid.len() == invalid).then_some((run, updates))
            });
            let Some((run, updates)) = rerun else {
                report.fail(&records[0].sequence);
                continue;
            };
            // Never past where the first run stopped: a record whose dead letter did not go out
            // stays unapplied, and its redelivery sends it.
            let stopped = run
                .outcomes
                .iter()
                .position(|o| matches!(o, Outcome::Failed | Outcome::Deferred))
                .unwrap_or(run.outcomes.len());
            work.keep = work.keep.min(stopped);
            work.run = run;
            work.updates = updates;
            if let Some(r) = self.ready(plan, g, work, now, report) {
                ready.push(r);
            }
        }
        ready
    }

    /// The state to commit for a key, with the outputs to send after the commit (outbox
    /// delivery) and the timers it sets anew; `None` when nothing changed and nothing needs
    /// writing.
    fn next_state(
        &self,
        work: &mut KeyWork,
        records: &[&SourceRecord],
        now: i64,
    ) -> Option<(KeyState, Vec<Output>, Vec<i64>)> {
        if work.without_state {
            // Its state was not read, and the run could touch none of it: nothing to write.
            return None;
        }
        let mut state = std::mem::take(&mut work.base);
        let timers_before = pending_timers(&state.slots);
        let sent_so_far = work.sent_so_far.take();
        // Notes that add nothing to those that hold at the key's version write nothing: a record
        // or a timer whose retries send nothing more (a sink down) would otherwise write its key
        // at every retry, and each write retires the notes of the key's other records.
        let noted_anew = sent_so_far
            .as_ref()
            .is_some_and(|notes| !notes.same_as(state.sent_so_far.as_ref(), state.version));
        let mut changed =
            work.migrated_from.is_some() || work.expired || !state.outbox.is_empty() || noted_anew;
        let updates = std::mem::take(&mut work.updates);
        let updated: Vec<(&'static str, Option<i64>)> = updates
            .iter()
            .map(|(name, change)| (*name, change.expires_at))
            .collect();
        for (name, super::process::Change { update, .. }) in updates {
            let slot = state.slots.entry(name.to_owned()).or_default();
            slot.apply(update);
            if slot.entries.is_empty() {
                state.slots.remove(name);
            }
            changed = true;
        }
        let mut outbox = Vec::new();
        if self.operator.delivery() == Delivery::Outbox {
            for outcome in &mut work.run.outcomes {
                if let Outcome::Applied(outputs) = outcome {
                    outbox.append(outputs);
                }
            }
            changed |= !outbox.is_empty();
        }
        if !changed {
            // Nothing to store: a redelivery recomputes the same outputs with the same ids.
            return None;
        }
        self.advance(&mut state, &work.run.outcomes, records, now);
        state.outbox = outbox.clone();
        state.sent_so_far = sent_so_far;
        let timers = pending_timers(&state.slots);
        let states_expire = expiry::stamp(
            &mut state,
            &self.states,
            updated.into_iter(),
            now.div_euclid(1000),
        );
        // A key's state lives its TTL past its last pending timer, so the timer finds it, and
        // at least as long as a state that expires later.
        let last = timers.last().map_or(now, |&t| t.max(now));
        state.expires_at = match self.operator.state_ttl() {
            Some(ttl) => {
                let key_expires = last.div_euclid(1000) + ttl.as_secs() as i64;
                Some(
                    states_expire
                        .latest
                        .map_or(key_expires, |l| l.max(key_expires)),
                )
            }
            None => states_expire.latest.filter(|_| states_expire.all),
        };
        let added = timers.difference(&timers_before).copied().collect();
        Some((state, outbox, added))
    }

    /// Moves the watermarks past every record that ran to an effect, and forgets those no
    /// redelivery can reach any more.
    fn advance(
        &self,
        state: &mut KeyState,
        outcomes: &[Outcome],
        records: &[&SourceRecord],
        now: i64,
    ) {
        // Within a lineage a key's records come in order: only its last one matters.
        let mut done: Vec<&crate::domain::Origin> = Vec::new();
        for (outcome, record) in outcomes.iter().zip(records).rev() {
            let lineage = self.lineage_of(record);
            // A timer's firing is recorded by its removal from the state, not by a watermark.
            if !outcome.advances() || done.contains(&lineage) || record.as_timer().is_some() {
                continue;
            }
            done.push(lineage);
            state.watermarks.advance(
                lineage,
                &record.sequence,
                record.arrival_millis.unwrap_or(now),
            );
        }
        state
            .watermarks
            .prune(now, self.config.redelivery_window.as_millis() as i64);
    }

    /// A commit failed in a way no retry fixes, which the checks before it should have caught: so
    /// that the key is not stuck, its first record with an effect is dead-lettered with the
    /// reason and the key's watermark moves past it; the redelivery goes on after it.
    async fn dead_letter_first(
        &self,
        plan: &Plan<'_>,
        g: usize,
        outcomes: &[Outcome],
        err: StoreError,
        now: i64,
        report: &mut BatchReport,
    ) {
        let records = plan.records_of(g);
        warn!(operator = %self.namespace.operator, key = %plan.groups[g].key, error = %err, "commit refused; the key's first record is dead-lettered");
        let first = outcomes
            .iter()
            .position(|o| matches!(o, Outcome::Applied(_)));
        let skipped = match first {
            Some(p) => {
                self.skip_record(plan, g, outcomes, p, &err, now, report)
                    .await
            }
            None => false,
        };
        match first {
            Some(p) if skipped => {
                if let Some(next) = records.get(p + 1) {
                    report.fail(&next.sequence);
                }
            }
            _ => report.fail(&records[0].sequence),
        }
    }

    /// Dead-letters the key's record at `p` and commits its watermark past it; says whether both
    /// happened.
    #[allow(clippy::too_many_arguments)]
    async fn skip_record(
        &self,
        plan: &Plan<'_>,
        g: usize,
        outcomes: &[Outcome],
        p: usize,
        err: &StoreError,
        now: i64,
        report: &mut BatchReport,
    ) -> bool {
        let records = plan.records_of(g);
        let key = &plan.groups[g].key;
        let reason = InvalidInput::new(
            "state",
            format!("the state store refused the commit: {err}"),
        );
        let letter = self.dead_letter(records[p], Some(key), reason.clone());
        let mut emission = Emission::default();
        emission.push(
            Tag::Record {
                group: g,
                position: p,
                output: 0,
            },
            letter.into_output(self.sinks.dead_letter_limit()),
        );
        if !self.send_all(emission, plan.sends, report).await.is_empty() {
            return false;
        }
        let request = LoadKey {
            key,
            lineages: records[..=p].iter().map(|r| self.lineage_of(r)).collect(),
        };
        let Ok(mut loaded) = self.store.load_keys(&self.namespace, &[request]).await else {
            return false;
        };
        let mut state = loaded.remove(key).unwrap_or_default();
        // Its outbox went out in this invocation's first phase, or the key would not be here.
        state.outbox.clear();
        // A timer's firing dead-lettered is its one firing: left pending, with its index entry
        // forgotten by the sweep, it would never come due again.
        if let Some((_, at)) = records[p].as_timer() {
            take_stored_timer(&mut state.slots, at);
        }
        let mut outcomes = outcomes[..=p].to_vec();
        outcomes[p] = Outcome::Invalid(reason);
        self.advance(&mut state, &outcomes, &records, now);
        let commit = Commit {
            key: key.clone(),
            expected_version: state.version,
            state,
            redelivery_window: self.config.redelivery_window,
        };
        self.store
            .commit(&self.namespace, vec![commit])
            .await
            .remove(0)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, VecDeque};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;

    use super::super::testkit::{bench, record, Recorder, Summer, OUT, START};
    use super::super::{Executor, Sinks};
    use super::*;
    use crate::adapters::dynamodb::DynamoStateStore;
    use crate::adapters::dynamodb::MemoryTable;
    use crate::domain::Origin;
    use crate::ports::{ManualClock, Namespace, StateStore, TimerIndex};

    /// The in-memory store, except that its next key commits fail with the errors given; it
    /// counts the key commits it is asked for.
    struct Scripted {
        inner: DynamoStateStore<MemoryTable>,
        errors: Mutex<VecDeque<StoreError>>,
        key_commits: AtomicUsize,
    }

    #[async_trait]
    impl StateStore for Scripted {
        async fn load_keys(
            &self,
            namespace: &Namespace,
            keys: &[LoadKey<'_>],
        ) -> Result<HashMap<String, KeyState>, StoreError> {
            self.inner.load_keys(namespace, keys).await
        }

        async fn commit(
            &self,
            namespace: &Namespace,
            commits: Vec<Commit>,
        ) -> Vec<Result<Committed, StoreError>> {
            if namespace.signature == super::super::SIGNATURE_HISTORY {
                return self.inner.commit(namespace, commits).await;
            }
            self.key_commits.fetch_add(commits.len(), Ordering::SeqCst);
            let failure = self.errors.lock().unwrap().pop_front();
            match failure {
                Some(err) => commits.iter().map(|_| Err(err.clone())).collect(),
                None => self.inner.commit(namespace, commits).await,
            }
        }

        async fn clear_outbox(
            &self,
            namespace: &Namespace,
            committed: Vec<Committed>,
        ) -> Vec<Result<(), StoreError>> {
            self.inner.clear_outbox(namespace, committed).await
        }

        fn timers(&self) -> &dyn TimerIndex {
            self.inner.timers()
        }
    }

    struct Scene {
        executor: Executor<Summer>,
        store: Arc<Scripted>,
        dead: Arc<Recorder>,
    }

    impl Scene {
        /// Key a's state as stored.
        async fn key_a(&self) -> HashMap<String, KeyState> {
            let ns = &self.executor.namespace;
            self.store.inner.load(ns, &["a".to_owned()]).await.unwrap()
        }
    }

    fn scene(outbox: bool, errors: Vec<StoreError>) -> Scene {
        let summer = Summer {
            outbox,
            ..Summer::default()
        };
        scene_of(summer, errors)
    }

    fn scene_of(summer: Summer, errors: Vec<StoreError>) -> Scene {
        let clock = ManualClock::at(START);
        let store = Arc::new(Scripted {
            inner: DynamoStateStore::new(Arc::new(MemoryTable::new()), clock.clone()),
            errors: Mutex::new(errors.into()),
            key_commits: AtomicUsize::new(0),
        });
        let dead = Arc::new(Recorder::default());
        let sinks = Sinks::new(dead.clone()).with(&OUT, Arc::new(Recorder::default()));
        let executor = Executor::new(summer, store.clone(), sinks, clock).unwrap();
        Scene {
            executor,
            store,
            dead,
        }
    }

    async fn always_beaten(outbox: bool) -> (BatchReport, usize) {
        let s = scene(outbox, vec![StoreError::Conflict; 10]);
        let report = s
            .executor
            .run(vec![record(4, "p", "a", 1), record(5, "p", "a", 2)])
            .await;
        (report, s.store.key_commits.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn an_outbox_key_that_keeps_losing_commit_races_is_run_again_twice_then_redelivered() {
        let (report, commits) = always_beaten(true).await;
        assert_eq!(commits, 1 + CONFLICT_RETRIES);
        assert_eq!(report.conflicts, 1 + CONFLICT_RETRIES);
        assert_eq!(report.failed_from.unwrap().as_str(), "4");
        assert_eq!((report.applied, report.commits), (0, 0));
    }

    #[tokio::test]
    async fn an_outbox_key_run_again_after_a_lost_race_commits_no_record_whose_dead_letter_did_not_go(
    ) {
        let s = scene(true, vec![StoreError::Conflict]);
        s.dead.down.store(true, Ordering::SeqCst);
        let batch = || {
            vec![
                record(4, "p", "a", 1),
                record(5, "p", "a", -1),
                record(6, "p", "a", 2),
            ]
        };
        let report = s.executor.run(batch()).await;
        assert_eq!(report.conflicts, 1, "{report:?}");
        assert_eq!(
            report.failed_from.as_ref().map(|f| f.as_str()),
            Some("5"),
            "the invalid record waits for its dead letter"
        );
        s.dead.down.store(false, Ordering::SeqCst);
        let again = s.executor.run(batch()[1..].to_vec()).await;
        assert_eq!(again.failed_from, None, "{again:?}");
        let letters: Vec<serde_json::Value> = s.dead.calls.lock().unwrap().concat()[1..]
            .iter()
            .map(|l| serde_json::from_str(&l.body).unwrap())
            .collect();
        assert_eq!(letters.len(), 1, "{letters:?}");
        assert_eq!(letters[0]["sequenceNumber"], "5");
        let state = s.key_a().await;
        assert_eq!(state["a"].slots["sum"].entries[0].get(), "3");
    }

    #[tokio::test]
    async fn an_emit_then_commit_key_that_loses_a_commit_race_is_left_to_the_redelivery_at_once() {
        let (report, commits) = always_beaten(false).await;
        assert_eq!((commits, report.conflicts), (1, 1));
        assert_eq!(report.failed_from.unwrap().as_str(), "4");
    }

    #[test]
    fn watermarks_move_to_each_lineages_last_applied_record_and_expire_with_the_window() {
        let mut b = bench(Summer::default(), false);
        b.executor.config.redelivery_window = std::time::Duration::from_secs(60);
        let batch: Vec<SourceRecord> = [(1, "p"), (2, "q"), (3, "p"), (4, "q")]
            .iter()
            .map(|(seq, pk)| record(*seq, pk, "a", 1).unwrap())
            .collect();
        let records: Vec<&SourceRecord> = batch.iter().collect();
        let outcomes = vec![
            Outcome::Applied(Vec::new()),
            Outcome::Applied(Vec::new()),
            Outcome::Invalid(InvalidInput::new("x", "y")),
            Outcome::Replayed,
        ];
        let mut state = KeyState::default();
        let old = Origin("s/shardId-0/old".into());
        state
            .watermarks
            .advance(&old, &batch[0].sequence, START - 61_000);
        b.executor.advance(&mut state, &outcomes, &records, START);
        let marks: Vec<(&str, &str)> = state
            .watermarks
            .iter()
            .map(|(l, w)| (l.as_str(), w.sequence.as_str()))
            .collect();
        assert_eq!(
            marks,
            [("s/shardId-0/p", "3"), ("s/shardId-0/q", "2")],
            "a replayed record moves nothing, and the old lineage is past the window"
        );
    }

    #[tokio::test]
    async fn a_key_whose_record_stopped_it_commits_the_records_before_and_reports_the_rest() {
        let b = bench(Summer::default(), false);
        let report = b
            .executor
            .run(vec![
                record(1, "p", "a", 1),
                record(2, "p", "a", 13),
                record(3, "p", "a", 2),
            ])
            .await;
        assert_eq!((report.applied, report.commits), (1, 1));
        assert_eq!(report.failed_from.unwrap().as_str(), "2");
        let again = b.executor.run(vec![record(1, "p", "a", 1)]).await;
        assert_eq!(again.replayed, 1);
    }

    #[tokio::test]
    async fn a_commit_refused_for_good_dead_letters_the_first_record_and_goes_on_after_it() {
        let s = scene(false, vec![StoreError::Invalid("too large".into())]);
        let batch = || {
            vec![
                record(4, "p", "a", 1),
                record(5, "p", "a", 2),
                record(6, "p", "a", 3),
            ]
        };
        let report = s.executor.run(batch()).await;
        assert_eq!(
            report.failed_from.unwrap().as_str(),
            "5",
            "the redelivery starts after the dead-lettered record"
        );
        let letters = s.dead.calls.lock().unwrap().concat();
        assert_eq!(letters.len(), 1);
        let letter: serde_json::Value = serde_json::from_str(&letters[0].body).unwrap();
        assert_eq!(
            (&letter["sequenceNumber"], &letter["field"]),
            (&serde_json::json!("4"), &serde_json::json!("state"))
        );
        assert!(letter["problem"].as_str().unwrap().contains("too large"));
        // The redelivery: record 4 is past the watermark, 5 and 6 apply on a state without it.
        let again = s.executor.run(batch()).await;
        assert_eq!(
            (again.replayed, again.applied, again.failed_from),
            (1, 2, None)
        );
        let state = s.key_a().await;
        let sum = &state["a"].slots["sum"].entries[0];
        assert_eq!(sum.get(), "5");
    }

    #[tokio::test]
    async fn a_commit_refused_for_good_whose_dead_letter_cannot_go_out_redelivers_the_key() {
        let s = scene(false, vec![StoreError::Invalid("too large".into())]);
        s.dead.down.store(true, Ordering::SeqCst);
        let report = s
            .executor
            .run(vec![record(4, "p", "a", 1), record(5, "p", "a", 2)])
            .await;
        assert_eq!(report.failed_from.unwrap().as_str(), "4");
        assert_eq!(s.store.key_commits.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_timers_firing_whose_commit_is_refused_for_good_is_dead_lettered_and_taken_off_the_key(
    ) {
        let summer = Summer {
            timers: true,
            ..Summer::default()
        };
        let s = scene_of(summer, Vec::new());
        let set = s.executor.run(vec![record(1, "p", "a", 23)]).await;
        assert_eq!(set.failed_from, None);
        s.store
            .errors
            .lock()
            .unwrap()
            .push_back(StoreError::Invalid("too large".into()));
        let firing = SourceRecord::timer("a", START + 60_000);
        let report = s.executor.run(vec![Ok(firing)]).await;
        assert_eq!(report.failed_from, None, "settled: dead-lettered");
        assert_eq!(s.dead.calls.lock().unwrap().concat().len(), 1);
        let state = s.key_a().await;
        // Left pending, its index entry forgotten by the sweep, it would never come due again.
        assert!(
            !state["a"].slots.contains_key("keyway.timers"),
            "{:?}",
            state["a"].slots.keys()
        );
    }

    #[tokio::test]
    async fn records_that_change_nothing_count_as_applied_and_write_nothing() {
        let b = bench(Summer::default(), false);
        let report = b
            .executor
            .run(vec![record(1, "p", "a", 0), record(2, "p", "a", 0)])
            .await;
        assert_eq!(
            (report.applied, report.commits, report.failed_from),
            (2, 0, None),
            "nothing committed"
        );
    }

    #[tokio::test]
    #[allow(clippy::result_large_err)]
    async fn watermarks_moved_to_items_still_stop_redeliveries_after_later_commits_move_none() {
        // One key fed by 80 partition keys (a reshard, a high ParallelizationFactor): most of its
        // watermarks leave the head for items.
        let b = bench(Summer::default(), false);
        let mut seq = 0;
        let mut next = |pk: String| {
            seq += 1;
            record(seq, &pk, "a", 1)
        };
        let firsts: Vec<_> = (0..80).map(|i| next(format!("p{i}"))).collect();
        for batch in firsts.chunks(20) {
            b.executor.run(batch.to_vec()).await;
        }
        // Two commits of one lineage: the second moves no watermark out of the head, and must
        // keep saying that some live in items.
        for _ in 0..2 {
            let report = b.executor.run(vec![next("p79".into())]).await;
            assert_eq!(report.applied, 1);
        }
        // Every lineage's first record again: those whose watermark lives in an item as much as
        // those still in the head.
        let again = b.executor.run(firsts).await;
        assert_eq!((again.replayed, again.applied), (80, 0));
    }
}
