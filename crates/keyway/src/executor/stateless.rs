//! Operators that keep nothing per key (`KeyedOperator::stateless`): a filter, a router. Their
//! batches skip the load and the commit: no state is read, no watermark written. A record Lambda
//! delivers again is processed again and its outputs go out again under the same ids: outputs at
//! least once, as ever, and nothing that could be applied twice. Everything else is as for any
//! operator: records of a key in order, bad input dead-lettered, outputs sent in each key's order,
//! and the batch response naming the first record of each key not fully sent.

use std::sync::Arc;

use async_trait::async_trait;

use super::plan::Plan;
use super::process::{counts, KeyWork};
use super::{BatchReport, Executor, Sinks, WiringError};
use crate::operator::{Delivery, KeyedOperator};
use crate::ports::{
    Clock, Commit, Committed, DueTimer, LoadKey, Namespace, StateStore, StoreError, TimerEntry,
    TimerIndex,
};

impl<O: KeyedOperator> Executor<O> {
    /// An executor of a stateless operator, which needs no state store.
    pub fn stateless(
        operator: O,
        sinks: Sinks,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, WiringError> {
        if !operator.stateless() {
            return Err(WiringError::Stateless {
                operator: operator.name().to_owned(),
                problem: "it keeps state (stateless() is false): give it a state store".into(),
            });
        }
        Self::new(operator, Arc::new(NoState), sinks, clock)
    }

    /// What a stateless operator may not declare.
    pub(super) fn check_stateless(operator: &O) -> Result<(), WiringError> {
        let problem = if !operator.states().is_empty() {
            "it declares states"
        } else if operator.delivery() == Delivery::Outbox {
            "outbox delivery stores outputs with the state"
        } else {
            return Ok(());
        };
        Err(WiringError::Stateless {
            operator: operator.name().to_owned(),
            problem: problem.into(),
        })
    }

    /// Every key of the batch, with nothing loaded.
    pub(super) fn fresh_keys(&self, plan: &Plan<'_>) -> Vec<KeyWork> {
        plan.groups.iter().map(|_| KeyWork::default()).collect()
    }

    /// The batch's outcome without a commit: each key's records up to the first that failed, or
    /// whose outputs did not all go out, count as applied; from that one on, Lambda redelivers.
    pub(super) fn settle_stateless(
        &self,
        plan: &Plan<'_>,
        keys: &[KeyWork],
        report: &mut BatchReport,
    ) {
        for (g, work) in keys.iter().enumerate() {
            report.panics += usize::from(work.run.panicked);
            let records = plan.records_of(g);
            if work.deferred {
                report.deferred_keys += 1;
                report.fail(&records[0].sequence);
                continue;
            }
            let kept = work.keep.min(work.run.outcomes.len());
            let (applied, replayed) = counts(&work.run.outcomes[..kept]);
            report.applied += applied;
            report.replayed += replayed;
            if kept < records.len() {
                report.fail(&records[kept].sequence);
            }
        }
    }
}

/// The store of an executor that never reads or writes state.
struct NoState;

fn unused<T>() -> Result<T, StoreError> {
    Err(StoreError::Invalid(
        "a stateless operator's executor has no state store".into(),
    ))
}

#[async_trait]
impl StateStore for NoState {
    async fn load_keys(
        &self,
        _: &Namespace,
        _: &[LoadKey<'_>],
    ) -> Result<std::collections::HashMap<String, crate::domain::KeyState>, StoreError> {
        unused()
    }

    async fn commit(
        &self,
        _: &Namespace,
        commits: Vec<Commit>,
    ) -> Vec<Result<Committed, StoreError>> {
        commits.iter().map(|_| unused()).collect()
    }

    async fn clear_outbox(
        &self,
        _: &Namespace,
        keys: Vec<Committed>,
    ) -> Vec<Result<(), StoreError>> {
        keys.iter().map(|_| unused()).collect()
    }

    fn timers(&self) -> &dyn TimerIndex {
        self
    }
}

#[async_trait]
impl TimerIndex for NoState {
    async fn schedule_timers(&self, _: &str, _: &[TimerEntry], _: i64) -> Result<(), StoreError> {
        unused()
    }

    async fn due_timers(&self, _: &str, _: i64, _: usize) -> Result<Vec<DueTimer>, StoreError> {
        // Nothing is ever due: a sweep of a stateless operator finds no timers.
        Ok(Vec::new())
    }

    async fn forget_timers(&self, _: &str, _: &[DueTimer]) -> Result<(), StoreError> {
        unused()
    }

    async fn postpone_timers(&self, _: &str, _: &[DueTimer], _: i64) -> Result<(), StoreError> {
        unused()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{key_and_n, record, Recorder, Summer, OUT, START};
    use super::*;
    use crate::domain::SourceRecord;
    use crate::operator::{SinkDescriptor, StateDescriptor};
    use crate::ports::ManualClock;
    use crate::{Ctx, InvalidInput, ProcessError};

    /// Passes on every record's `n`, keeping nothing; `n` < 0 is bad input.
    struct Relay;

    impl KeyedOperator for Relay {
        type Input = (String, i64);

        fn name(&self) -> &str {
            "relay"
        }

        fn states(&self) -> Vec<StateDescriptor> {
            Vec::new()
        }

        fn sinks(&self) -> Vec<SinkDescriptor> {
            vec![OUT.descriptor()]
        }

        fn decode(&self, record: &SourceRecord) -> Result<(String, i64), InvalidInput> {
            key_and_n(record)
        }

        fn key(&self, input: &(String, i64)) -> String {
            input.0.clone()
        }

        fn process(&self, ctx: &mut Ctx<'_>, (key, n): (String, i64)) -> Result<(), ProcessError> {
            if n < 0 {
                return Err(InvalidInput::new("n", "negative").into());
            }
            ctx.emit(&OUT, key, &n)
        }

        fn stateless(&self) -> bool {
            true
        }
    }

    fn relay() -> (Executor<Relay>, Arc<Recorder>, Arc<Recorder>) {
        let out = Arc::new(Recorder::default());
        let dead = Arc::new(Recorder::default());
        let sinks = Sinks::new(dead.clone()).with(&OUT, out.clone());
        let executor = Executor::stateless(Relay, sinks, ManualClock::at(START)).unwrap();
        (executor, out, dead)
    }

    #[tokio::test]
    async fn a_stateless_batch_reads_and_writes_no_state_and_a_redelivery_sends_the_same_ids() {
        let (executor, out, dead) = relay();
        let batch = || {
            vec![
                record(1, "a", "a", 1),
                record(2, "b", "b", -1),
                record(3, "a", "a", 3),
            ]
        };
        let first = executor.run(batch()).await;
        assert_eq!(
            (first.applied, first.dead_lettered, first.failed_from),
            (2, 1, None)
        );
        assert_eq!(first.commits, 0);
        let again = executor.run(batch()).await;
        assert_eq!(again.applied, 2, "nothing remembers the first delivery");
        let calls = out.calls.lock().unwrap();
        let ids = |call: &Vec<crate::domain::Output>| -> Vec<String> {
            call.iter().map(|o| o.id.0.clone()).collect()
        };
        assert_eq!(ids(&calls[0]), ids(&calls[1]));
        assert_eq!(dead.calls.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_key_whose_output_was_not_sent_is_redelivered_from_that_record() {
        let (executor, out, _) = relay();
        out.fail("2");
        let report = executor
            .run(vec![
                record(1, "a", "a", 1),
                record(2, "a", "a", 2),
                record(3, "b", "b", 3),
            ])
            .await;
        assert_eq!(
            report.failed_from.map(|s| s.as_str().to_owned()),
            Some("2".into())
        );
        assert_eq!(report.applied, 2);
    }

    #[test]
    fn a_stateless_operator_that_declares_state_is_refused() {
        struct Confused;
        impl KeyedOperator for Confused {
            type Input = (String, i64);
            fn name(&self) -> &str {
                "confused"
            }
            fn states(&self) -> Vec<StateDescriptor> {
                Summer::default().states()
            }
            fn sinks(&self) -> Vec<SinkDescriptor> {
                vec![OUT.descriptor()]
            }
            fn decode(&self, record: &SourceRecord) -> Result<(String, i64), InvalidInput> {
                key_and_n(record)
            }
            fn key(&self, input: &(String, i64)) -> String {
                input.0.clone()
            }
            fn process(&self, _: &mut Ctx<'_>, _: (String, i64)) -> Result<(), ProcessError> {
                Ok(())
            }
            fn stateless(&self) -> bool {
                true
            }
        }
        let sinks =
            Sinks::new(Arc::new(Recorder::default())).with(&OUT, Arc::new(Recorder::default()));
        let err = Executor::stateless(Confused, sinks, ManualClock::at(START))
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("stateless but it declares states"),
            "{err}"
        );
        let sinks =
            Sinks::new(Arc::new(Recorder::default())).with(&OUT, Arc::new(Recorder::default()));
        let err = Executor::stateless(Summer::default(), sinks, ManualClock::at(START))
            .err()
            .unwrap();
        assert!(err.to_string().contains("give it a state store"), "{err}");
    }
}
