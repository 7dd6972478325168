//! Phase 5: each key's new state, with its watermarks advanced, committed conditional on the
//! version it was loaded at. Keys with records left unapplied report the first of them.

use tracing::warn;

use super::emit::{Emission, Tag};
use super::plan::Plan;
use super::process::{counts, KeyWork, Outcome};
use super::{BatchReport, Executor};
use crate::domain::{KeyState, Output, SourceRecord};
use crate::operator::{Delivery, InvalidInput, KeyedOperator};
use crate::ports::{Commit, Committed, LoadKey, StoreError};

/// A key committed with outputs in its outbox, still to be sent.
pub(super) struct PendingOutbox {
    pub group: usize,
    pub committed: Committed,
    pub outputs: Vec<Output>,
}

impl<O: KeyedOperator> Executor<O> {
    pub(super) async fn commit_all(
        &self,
        plan: &Plan<'_>,
        keys: &mut [KeyWork],
        now: i64,
        report: &mut BatchReport,
    ) -> Vec<PendingOutbox> {
        let mut commits = Vec::new();
        let mut pending: Vec<(usize, Vec<Output>)> = Vec::new();
        for (g, work) in keys.iter_mut().enumerate() {
            let records = plan.records_of(g);
            let key = plan.groups[g].key.as_str();
            report.panics += usize::from(work.run.panicked);
            if work.deferred || work.blocked {
                // Not started, or an earlier outbox still waits: later outputs must not overtake
                // it. The redelivery starts the key again.
                report.deferred_keys += usize::from(work.deferred);
                report.fail(&records[0].sequence);
                continue;
            }
            if work.keep < work.run.outcomes.len() {
                if let Err(reason) = self.replay(key, work, &records, now) {
                    warn!(operator = %self.namespace.operator, key, problem = %reason, "the key's shorter run does not encode; its records will be redelivered");
                    report.fail(&records[0].sequence);
                    continue;
                }
            }
            if work.keep < records.len() {
                report.fail(&records[work.keep].sequence);
            }
            match self.next_state(work, &records, now) {
                Some((state, outbox)) => {
                    commits.push(Commit {
                        key: key.to_owned(),
                        expected_version: state.version,
                        state,
                        redelivery_window: self.config.redelivery_window,
                    });
                    pending.push((g, outbox));
                }
                None => {
                    let (applied, replayed) = counts(&work.run.outcomes);
                    report.applied += applied;
                    report.replayed += replayed;
                }
            }
        }
        let results = self.store.commit(&self.namespace, commits).await;
        let mut outboxes = Vec::new();
        for ((g, outputs), result) in pending.into_iter().zip(results) {
            let records = plan.records_of(g);
            match result {
                Ok(committed) => {
                    report.commits += 1;
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
                Err(StoreError::Conflict) => {
                    report.conflicts += 1;
                    report.fail(&records[0].sequence);
                }
                Err(err) if err.is_retryable() => {
                    warn!(operator = %self.namespace.operator, key = %plan.groups[g].key, error = %err, "commit failed; the key's records will be redelivered");
                    report.fail(&records[0].sequence);
                }
                Err(err) => {
                    let outcomes = &keys[g].run.outcomes;
                    self.dead_letter_first(plan, g, outcomes, err, now, report)
                        .await
                }
            }
        }
        outboxes
    }

    /// The state to commit for a key, with the outputs to send after the commit (outbox
    /// delivery); `None` when nothing changed and nothing needs writing.
    fn next_state(
        &self,
        work: &mut KeyWork,
        records: &[&SourceRecord],
        now: i64,
    ) -> Option<(KeyState, Vec<Output>)> {
        let mut state = std::mem::take(&mut work.base);
        let mut changed = work.migrated || !state.outbox.is_empty();
        for (name, update) in std::mem::take(&mut work.updates) {
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
        state.expires_at = self
            .operator
            .state_ttl()
            .map(|ttl| now / 1000 + ttl.as_secs() as i64);
        Some((state, outbox))
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
        let ran: Vec<&SourceRecord> = outcomes
            .iter()
            .zip(records)
            .filter(|(o, _)| o.advances())
            .map(|(_, r)| *r)
            .collect();
        for (i, record) in ran.iter().enumerate() {
            let lineage = self.lineage_of(record);
            // Within a lineage a key's records come in order: only its last one matters.
            if ran[i + 1..].iter().any(|r| self.lineage_of(r) == lineage) {
                continue;
            }
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
            },
            letter.into_output(self.sinks.dead_letter_limit()),
        );
        if !self.send_all(emission, report).await.is_empty() {
            return false;
        }
        let request = LoadKey {
            key: key.clone(),
            lineages: records[..=p]
                .iter()
                .map(|r| self.lineage_of(r).clone())
                .collect(),
        };
        let Ok(mut loaded) = self.store.load_keys(&self.namespace, &[request]).await else {
            return false;
        };
        let mut state = loaded.remove(key).unwrap_or_default();
        // Its outbox went out in this invocation's first phase, or the key would not be here.
        state.outbox.clear();
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
