//! Phase 2: every key's state in one load, with the watermarks of the lineages its records come
//! from; and, for keys with nothing stored under the current signature, state carried over from
//! an older one (a migration) or counted as left behind (a reset).

use std::collections::{HashMap, HashSet};

use tracing::warn;

use super::plan::Plan;
use super::process::KeyWork;
use super::{BatchReport, Executor};
use crate::domain::{KeyState, Origin, Retiring, SlotData};
use crate::operator::{KeyedOperator, OldState, BROADCAST_KEY};
use crate::ports::{LoadKey, Namespace, StoreError};

/// Reports every record of the batch for redelivery.
fn fail_all(plan: &Plan<'_>, report: &mut BatchReport) {
    for index in 0..plan.batch.len() {
        if let Some(seq) = plan.sequence_of(index) {
            report.fail(seq);
        }
    }
}

/// A key's state under the older signature a migration carried it over from: written empty,
/// expiring at once, when the carried state has landed (`Executor::retire_old_heads`), so that
/// it is not carried over again once the key's current state expired. Until a commit of the key
/// finds it so, the key's state notes it (`KeyState::retiring`, `Executor::retire_noted`).
pub(super) struct OldHead {
    pub signature: String,
    /// The version and the store's notes as loaded; nothing else.
    pub state: KeyState,
}

impl OldHead {
    /// The head of `loaded`, read under `signature`: what writing it empty needs.
    pub(super) fn of(signature: String, loaded: &KeyState) -> Self {
        let state = KeyState {
            version: loaded.version,
            memo: loaded.memo.clone(),
            ..KeyState::default()
        };
        Self { signature, state }
    }
}

/// How many keys are read at once when each is read alone.
const LOADS_ALONE: usize = 8;

impl<O: KeyedOperator> Executor<O> {
    /// Every key's work, with its loaded state; `None` when the state could not be read, and every
    /// record is then reported for redelivery.
    pub(super) async fn load(
        &self,
        plan: &Plan<'_>,
        answered: &[bool],
        now: i64,
        report: &mut BatchReport,
    ) -> Option<Vec<KeyWork>> {
        let requests: Vec<LoadKey<'_>> = plan
            .groups
            .iter()
            .zip(answered)
            .filter(|(_, answered)| !**answered)
            .map(|(group, _)| {
                let mut lineages: Vec<&Origin> = Vec::new();
                for &i in &group.records {
                    let lineage = self.lineage_of(plan.record(i));
                    if !lineages.contains(&lineage) {
                        lineages.push(lineage);
                    }
                }
                LoadKey {
                    key: &group.key,
                    lineages,
                }
            })
            .collect();
        // The broadcast states come with the batch's keys, in the same read.
        let broadcast_key = !self.broadcast_states.is_empty()
            && !plan.groups.iter().any(|g| g.key == BROADCAST_KEY);
        let mut reads = requests.clone();
        if broadcast_key {
            reads.push(LoadKey::from(BROADCAST_KEY));
        }
        let mut unreadable = HashSet::new();
        let (loaded, previous) = futures::join!(
            self.load_readable(&self.namespace, &reads, &mut unreadable),
            self.previous_signature(now)
        );
        let looked_back = match loaded {
            Ok(mut loaded) => self
                .look_back(&mut loaded, &requests, previous, &mut unreadable, report)
                .await
                .map(|migrated| (loaded, migrated)),
            Err(err) => Err(err),
        };
        let (mut loaded, mut migrated) = match looked_back {
            Ok(found) => found,
            Err(err) => {
                warn!(operator = %self.namespace.operator, error = %err, "state load failed; the batch will be redelivered");
                fail_all(plan, report);
                return None;
            }
        };
        let broadcast = (!self.broadcast_states.is_empty()).then(|| {
            let stored = loaded.get(BROADCAST_KEY).cloned().unwrap_or_default();
            if broadcast_key {
                loaded.remove(BROADCAST_KEY);
            }
            self.broadcast.refresh(&stored)
        });
        Some(
            plan.groups
                .iter()
                .zip(answered)
                .map(|(g, &without_state)| KeyWork {
                    base: loaded.remove(&g.key).unwrap_or_default(),
                    migrated_from: migrated.remove(&g.key),
                    broadcast: broadcast.clone(),
                    unreadable: unreadable.contains(&g.key),
                    without_state,
                    ..KeyWork::default()
                })
                .collect(),
        )
    }

    /// Which keys the operator answers without their state (`answer_without_state`): those
    /// whose every record it answers. A timer record, or a record whose input is not at hand,
    /// needs the key's state.
    pub(super) fn answered_without_state(
        &self,
        plan: &Plan<'_>,
        inputs: &mut [Option<O::Input>],
        now: i64,
    ) -> Vec<bool> {
        plan.groups
            .iter()
            .map(|group| {
                group.key != BROADCAST_KEY
                    && group.records.iter().all(|&i| match &mut inputs[i] {
                        Some(input) => {
                            let record = plan.record(i);
                            self.operator
                                .answer_without_state(&group.key, record, input, now)
                        }
                        None => false,
                    })
            })
            .collect()
    }

    /// `reads` under `namespace`, in one load. When it meets a stored item that does not parse,
    /// each key is read alone, a few at a time, so that one key's unreadable state holds back its
    /// own records only: the unreadable keys are added to `unreadable` and left out. Any other
    /// failure fails the load, as does the broadcast key's state, which every key's run reads.
    async fn load_readable(
        &self,
        namespace: &Namespace,
        reads: &[LoadKey<'_>],
        unreadable: &mut HashSet<String>,
    ) -> Result<HashMap<String, KeyState>, StoreError> {
        match self.store.load_keys(namespace, reads).await {
            Err(StoreError::Corrupt(_)) => {}
            loaded => return loaded,
        }
        let mut loaded = HashMap::with_capacity(reads.len());
        for chunk in reads.chunks(LOADS_ALONE) {
            let mut alone = Vec::with_capacity(chunk.len());
            for read in chunk {
                alone.push(self.store.load_keys(namespace, std::slice::from_ref(read)));
            }
            let answers = futures::future::join_all(alone).await;
            for (read, answer) in chunk.iter().zip(answers) {
                match answer {
                    Ok(state) => loaded.extend(state),
                    Err(err @ StoreError::Corrupt(_)) if read.key != BROADCAST_KEY => {
                        warn!(operator = %namespace.operator, signature = %namespace.signature, key = %read.key, error = %err, "the key's state cannot be read; its records will be redelivered");
                        unreadable.insert(read.key.to_owned());
                    }
                    Err(err) => return Err(err),
                }
            }
        }
        Ok(loaded)
    }

    /// For keys with no state under the current signature, reads their state under the
    /// signatures migrations come from, and the previous signature: migrated state becomes the
    /// key's loaded state; state left behind is counted as a reset. A key whose old state does
    /// not parse is added to `unreadable`: it neither starts afresh nor migrates. Returns the
    /// migrated keys, each with the state it was carried over from.
    async fn look_back(
        &self,
        loaded: &mut HashMap<String, KeyState>,
        requests: &[LoadKey<'_>],
        previous: Option<(String, i64)>,
        unreadable: &mut HashSet<String>,
        report: &mut BatchReport,
    ) -> Result<HashMap<String, OldHead>, StoreError> {
        let mut migrated = HashMap::new();
        // Broadcast state starts afresh after a change of signature: no migration reads it.
        let mut missing: Vec<LoadKey<'_>> = requests
            .iter()
            .filter(|r| r.key != BROADCAST_KEY && !unreadable.contains(r.key))
            .filter(|r| loaded.get(r.key).is_none_or(|s| s.version == 0))
            .cloned()
            .collect();
        if missing.is_empty() {
            return Ok(migrated);
        }
        let mut signatures: Vec<String> = self.migrations.iter().map(|m| m.from.clone()).collect();
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
                signature: signature.clone(),
                ..self.namespace.clone()
            };
            let old = self.load_readable(&namespace, &missing, unreadable).await?;
            let migration = self.migrations.iter().find(|m| m.from == *signature);
            missing.retain(|request| {
                let key = request.key;
                if unreadable.contains(key) {
                    return false;
                }
                // A key that was never written (version 0) has no slots either.
                let Some(state) = old.get(key).filter(|s| !s.slots.is_empty()) else {
                    return true;
                };
                match migration.map(|m| (m.migrate)(&OldState { slots: &state.slots })) {
                    Some(Ok(new)) => {
                        let old_head = OldHead::of(signature.clone(), state);
                        let slots = new
                            .slots
                            .into_iter()
                            .map(|(name, entries)| (name, SlotData::fresh(entries)))
                            .collect();
                        // The watermarks come along: what the old state applied stays applied.
                        let state = KeyState {
                            watermarks: state.watermarks.clone(),
                            outbox: state.outbox.clone(),
                            slots,
                            retiring: Some(Retiring {
                                signature: signature.clone(),
                                version: state.version,
                            }),
                            ..KeyState::default()
                        };
                        loaded.insert(key.to_owned(), state);
                        migrated.insert(key.to_owned(), old_head);
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
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::super::testkit::{record, Recorder, Summer, OUT};
    use super::super::{Executor, Sinks};
    use super::*;
    use crate::domain::KeyState;
    use crate::ports::{
        Commit, Committed, DueTimer, ManualClock, StateStore, TimerEntry, TimerIndex,
    };

    /// An index with no timers in it, that takes none.
    struct NoTimers;

    #[async_trait]
    impl TimerIndex for NoTimers {
        async fn schedule_timers(
            &self,
            _: &str,
            _: &[TimerEntry],
            _: i64,
        ) -> Result<(), StoreError> {
            Err(StoreError::Invalid("no timers here".into()))
        }

        async fn due_timers(&self, _: &str, _: i64, _: usize) -> Result<Vec<DueTimer>, StoreError> {
            Ok(Vec::new())
        }

        async fn forget_timers(&self, _: &str, _: &[DueTimer]) -> Result<(), StoreError> {
            Ok(())
        }

        async fn postpone_timers(&self, _: &str, _: &[DueTimer], _: i64) -> Result<(), StoreError> {
            Ok(())
        }
    }

    /// Answers every load with nothing stored, or fails it (for now, or for good), and remembers
    /// what it was asked.
    #[derive(Default)]
    struct Asked {
        keys: Mutex<Vec<(String, Vec<String>)>>,
        fail: bool,
        refuse: bool,
    }

    #[async_trait]
    impl StateStore for Asked {
        async fn load_keys(
            &self,
            namespace: &Namespace,
            keys: &[LoadKey<'_>],
        ) -> Result<HashMap<String, KeyState>, StoreError> {
            if namespace.signature != super::super::SIGNATURE_HISTORY {
                self.keys.lock().unwrap().extend(keys.iter().map(|k| {
                    let lineages = k.lineages.iter().map(|l| l.to_string()).collect();
                    (k.key.to_owned(), lineages)
                }));
                if self.fail {
                    return Err(StoreError::Unavailable("down".into()));
                }
                if self.refuse {
                    return Err(StoreError::Invalid("no such table".into()));
                }
            }
            Ok(keys
                .iter()
                .map(|k| (k.key.to_owned(), KeyState::default()))
                .collect())
        }

        async fn commit(
            &self,
            _: &Namespace,
            c: Vec<Commit>,
        ) -> Vec<Result<Committed, StoreError>> {
            c.iter()
                .map(|_| Err(StoreError::Unavailable("read only".into())))
                .collect()
        }

        async fn clear_outbox(
            &self,
            _: &Namespace,
            c: Vec<Committed>,
        ) -> Vec<Result<(), StoreError>> {
            c.iter().map(|_| Ok(())).collect()
        }

        fn timers(&self) -> &dyn TimerIndex {
            &NoTimers
        }
    }

    fn executor(store: std::sync::Arc<Asked>) -> Executor<Summer> {
        let sinks = Sinks::new(std::sync::Arc::new(Recorder::default()))
            .with(&OUT, std::sync::Arc::new(Recorder::default()));
        Executor::new(Summer::default(), store, sinks, ManualClock::at(0)).unwrap()
    }

    #[tokio::test]
    async fn each_key_is_loaded_once_with_the_distinct_lineages_of_its_records() {
        let store = std::sync::Arc::new(Asked::default());
        executor(store.clone())
            .run(vec![
                record(1, "p", "a", 1),
                record(2, "q", "a", 1),
                record(3, "p", "a", 1),
                record(4, "p", "b", 1),
            ])
            .await;
        let asked = store.keys.lock().unwrap().clone();
        assert_eq!(
            asked,
            [
                (
                    "a".to_owned(),
                    vec!["s/shardId-0/p".to_owned(), "s/shardId-0/q".to_owned()]
                ),
                ("b".to_owned(), vec!["s/shardId-0/p".to_owned()]),
            ]
        );
    }

    #[tokio::test]
    async fn a_key_whose_stored_state_does_not_parse_holds_back_its_own_records_only() {
        let bench = super::super::testkit::bench(Summer::default(), false);
        bench
            .executor
            .run(vec![record(1, "p", "a", 1), record(2, "q", "b", 1)])
            .await;
        super::super::testkit::corrupt_head(&bench.table, |pk| pk.ends_with("#b"));

        let report = bench
            .executor
            .run(vec![
                record(3, "p", "a", 2),
                record(4, "q", "b", 2),
                record(5, "r", "c", 3),
            ])
            .await;
        assert_eq!(report.failed_from.unwrap().as_str(), "4");
        assert_eq!(report.applied, 2, "a's and c's records");
        // The first run's two sums, then a's and c's: b sent nothing.
        assert_eq!(bench.out.bodies().concat().len(), 4);
    }

    #[tokio::test]
    async fn a_table_that_refuses_every_read_fails_the_batch_without_reading_each_key() {
        let store = std::sync::Arc::new(Asked {
            refuse: true,
            ..Asked::default()
        });
        let keys = ["a", "b", "c", "d", "e"];
        let records = (0..5)
            .map(|i| record(10 + i, "p", keys[i as usize], 1))
            .collect();
        let report = executor(store.clone()).run(records).await;
        assert_eq!(report.failed_from.unwrap().as_str(), "10");
        assert_eq!(report.applied, 0);
        let asked: Vec<String> = store
            .keys
            .lock()
            .unwrap()
            .iter()
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(asked, ["a", "b", "c", "d", "e"]);
    }

    #[tokio::test]
    async fn a_load_that_fails_reports_every_record_for_redelivery() {
        let store = std::sync::Arc::new(Asked {
            fail: true,
            ..Asked::default()
        });
        let report = executor(store)
            .run(vec![record(5, "p", "a", 1), record(3, "p", "b", 1)])
            .await;
        assert_eq!(report.failed_from.unwrap().as_str(), "3");
        assert_eq!(report.applied, 0);
    }
}

/// Keys the operator answers without their state (`KeyedOperator::answer_without_state`).
#[cfg(test)]
mod without_state {
    use super::super::testkit::{bench, record, Summer};

    fn facts(outbox: bool) -> Summer {
        Summer {
            facts: true,
            outbox,
            ..Summer::default()
        }
    }

    fn calls_of(b: &super::super::testkit::Bench<Summer>) -> u64 {
        b.table.usage().calls.values().sum::<u64>()
    }

    /// A bench whose executor ran once already: the calls an executor makes once, at its first
    /// batch (its signature history), are behind it.
    async fn warm(outbox: bool) -> (super::super::testkit::Bench<Summer>, u64) {
        let b = bench(facts(outbox), true);
        b.executor.run(vec![record(100, "w", "w", 1)]).await;
        b.out.calls.lock().unwrap().clear();
        let calls = calls_of(&b);
        (b, calls)
    }

    #[tokio::test]
    async fn a_key_whose_every_record_the_operator_answers_is_neither_read_nor_written() {
        let (b, before) = warm(false).await;
        let report = b
            .executor
            .run(vec![record(1, "p", "a", 1000), record(2, "p", "a", 1001)])
            .await;
        assert_eq!((report.failed_from, report.applied), (None, 2));
        assert_eq!(b.out.bodies(), [vec!["1000"], vec!["1001"]]);
        assert_eq!(
            calls_of(&b),
            before,
            "no call to the table: {:?}",
            b.table.usage()
        );
        // A redelivery answers them again: the same outputs under the same ids.
        let first: Vec<_> = b.out.calls.lock().unwrap().concat();
        b.executor
            .run(vec![record(1, "p", "a", 1000), record(2, "p", "a", 1001)])
            .await;
        let calls = b.out.calls.lock().unwrap();
        assert_eq!(calls[2..].concat(), first);
    }

    #[tokio::test]
    async fn a_key_with_one_record_the_operator_cannot_answer_is_read_and_committed_as_usual() {
        let (b, before) = warm(false).await;
        let report = b
            .executor
            .run(vec![
                record(1, "p", "a", 1000),
                record(2, "p", "a", 3),
                record(3, "q", "b", 1001),
            ])
            .await;
        assert_eq!((report.failed_from, report.commits), (None, 1));
        assert_eq!(b.out.bodies(), [vec!["1000", "1001"], vec!["3"]]);
        assert_eq!(calls_of(&b), before + 2, "a read and a write of key a");
        // Key a's sum was read and committed: its next record adds to it.
        b.executor.run(vec![record(4, "p", "a", 4)]).await;
        assert_eq!(b.out.bodies().last().unwrap(), &vec!["7"]);
    }

    #[tokio::test]
    async fn a_record_answered_without_state_that_touches_state_is_dead_lettered_naming_it() {
        let (b, before) = warm(false).await;
        let report = b
            .executor
            .run(vec![record(1, "p", "a", 1013), record(2, "p", "a", 1001)])
            .await;
        assert_eq!(report.failed_from, None, "the key goes on");
        assert_eq!(b.out.bodies(), [vec!["1001"]]);
        let letters = b.dead.bodies().concat();
        assert_eq!(letters.len(), 1);
        assert!(
            letters[0].contains("state.sum") && letters[0].contains("answer_without_state"),
            "{letters:?}"
        );
        assert_eq!(calls_of(&b), before);
    }

    #[tokio::test]
    async fn an_outbox_operator_answered_without_state_may_emit_only_settled_outputs() {
        let (b, before) = warm(true).await;
        let report = b
            .executor
            .run(vec![record(1, "p", "a", 1066), record(2, "p", "a", 1001)])
            .await;
        assert_eq!(report.failed_from, None);
        assert_eq!(
            b.out.bodies(),
            [vec!["1001"]],
            "the unsettled output is refused"
        );
        let letters = b.dead.bodies().concat();
        assert!(
            letters.len() == 1 && letters[0].contains("output.out"),
            "{letters:?}"
        );
        assert_eq!(
            calls_of(&b),
            before,
            "nothing stored in an outbox of a state never read"
        );
    }
}
