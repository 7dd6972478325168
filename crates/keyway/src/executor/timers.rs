//! The timer sweep: keyed timers that came due, fired through the same phases as a batch.
//!
//! The sweep reads the due entries of the store's due-time index, makes each a timer record
//! (`SourceRecord::timer`) and runs them as a batch: every key's timers are fired in time order
//! with its state, committed conditionally, their outputs sent as any record's. A timer fires only
//! while it is pending in its key's state, and firing removes it in the same commit, so an entry
//! swept twice, or an entry whose commit never landed, fires nothing more. Entries are removed
//! once the batch settled them; those it left (a commit lost a race, a sink was down, the
//! operator failed) come due again a minute later, behind the entries due by then.

use serde::Serialize;

use super::{BatchReport, Executor};
use crate::domain::SourceRecord;
use crate::operator::KeyedOperator;
use crate::ports::{DueTimer, StoreError};

/// How many due timers one batch of a sweep fires.
pub const TIMERS_PER_BATCH: usize = 500;
/// How long after a sweep the timers it could not settle come due again.
const RETRY_AFTER_MILLIS: i64 = 60_000;

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimerSweep {
    /// Timers found due in the index.
    pub due: usize,
    /// Timers whose `on_timer` ran and was committed.
    pub fired: usize,
    /// Timers no longer pending: fired or cancelled already, or never committed.
    pub skipped: usize,
    /// Timers whose record was dead-lettered.
    pub dead_lettered: usize,
    /// Timers left for the next sweep.
    pub left: usize,
}

impl<O: KeyedOperator> Executor<O> {
    /// Fires every timer of the operator due by the executor's clock, a batch at a time, until
    /// none is due or `deadline_millis` (the invocation's) is near; what a batch leaves comes due
    /// again a minute later. Fails only when the index cannot be read or its entries removed;
    /// the next sweep starts over.
    pub async fn fire_timers(
        &self,
        deadline_millis: Option<i64>,
    ) -> Result<TimerSweep, StoreError> {
        let operator = &self.namespace.operator;
        let reserve = self.config.deadline_reserve.as_millis() as i64;
        let mut sweep = TimerSweep::default();
        loop {
            let now = self.clock.now_millis();
            if deadline_millis.is_some_and(|d| now >= d - reserve) {
                return Ok(sweep);
            }
            let due = self
                .store
                .timers()
                .due_timers(operator, now, TIMERS_PER_BATCH)
                .await?;
            let full = due.len() >= TIMERS_PER_BATCH;
            if due.is_empty() {
                return Ok(sweep);
            }
            // A key's timers fire in time order, whatever order they came due in.
            let mut due = due;
            due.sort_by(|a, b| a.timer.cmp(&b.timer));
            let records: Vec<SourceRecord> = due
                .iter()
                .map(|d| SourceRecord::timer(&d.timer.key, d.timer.at_millis))
                .collect();
            let report = self
                .run_until(records.iter().cloned().map(Ok).collect(), deadline_millis)
                .await;
            let (done, left) = settled(due, &records, &report);
            let index = self.store.timers();
            // Behind the entries due until then, so that they are not held back by these. Before
            // forgetting the rest: an entry may hold timers of both.
            index
                .postpone_timers(operator, &left, now + RETRY_AFTER_MILLIS)
                .await?;
            index.forget_timers(operator, &done).await?;
            sweep.due += done.len() + left.len();
            sweep.fired += report.applied;
            sweep.skipped += report.replayed;
            sweep.dead_lettered += report.dead_lettered;
            sweep.left += left.len();
            // The entries left are due again only later: the next batch holds others, so one
            // key that failed does not hold back the timers of every key due after it.
            if !full {
                return Ok(sweep);
            }
        }
    }
}

/// The entries a batch settled (every timer record below the lowest it left), and the rest.
fn settled(
    due: Vec<DueTimer>,
    records: &[SourceRecord],
    report: &BatchReport,
) -> (Vec<DueTimer>, Vec<DueTimer>) {
    let mut done = Vec::new();
    let mut left = Vec::new();
    for (entry, record) in due.into_iter().zip(records) {
        match &report.failed_from {
            Some(from) if record.sequence >= *from => left.push(entry),
            _ => done.push(entry),
        }
    }
    (done, left)
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{bench, key_and_n, record, Bench, OUT, START, SUM};
    use super::*;
    use crate::operator::StateDescriptor;
    use crate::operator::{timers, Ctx, InvalidInput, ProcessError, SinkDescriptor};
    use crate::ports::{StateStore, TimerEntry, TimerIndex};

    const IDLE: i64 = 60_000;

    /// Sums `n` per key and emits the sum; a key that receives nothing for a minute emits the
    /// negated sum and starts over. On a timer, a sum of 13 fails (retryably) and a sum of 66 is
    /// refused (dead-lettered); a negative `n` sets the key's timer in the past.
    struct Sessions;

    impl KeyedOperator for Sessions {
        type Input = (String, i64);

        fn name(&self) -> &str {
            "sessions"
        }

        fn states(&self) -> Vec<StateDescriptor> {
            vec![SUM.descriptor(), timers()]
        }

        fn sinks(&self) -> Vec<SinkDescriptor> {
            vec![OUT.descriptor()]
        }

        fn decode(
            &self,
            record: &crate::domain::SourceRecord,
        ) -> Result<(String, i64), InvalidInput> {
            key_and_n(record)
        }

        fn key(&self, input: &(String, i64)) -> String {
            input.0.clone()
        }

        fn process(&self, ctx: &mut Ctx<'_>, (key, n): (String, i64)) -> Result<(), ProcessError> {
            for at in ctx.pending_timers()? {
                ctx.cancel_timer(at)?;
            }
            // A negative n sets the timer that many seconds in the past.
            let at = ctx.now_millis() + if n < 0 { n * 1000 } else { IDLE };
            ctx.timer_at(at)?;
            let mut sum = ctx.value(&SUM)?;
            let total = sum.get().copied().unwrap_or(0) + n;
            sum.set(total);
            ctx.emit(&OUT, key, &total)
        }

        fn on_timer(&self, ctx: &mut Ctx<'_>, _at: i64) -> Result<(), ProcessError> {
            let total = ctx.value(&SUM)?.take().unwrap_or(0);
            if total == 13 {
                return Err(ProcessError::Retry("unlucky".into()));
            }
            if total == 66 {
                return Err(ProcessError::Invalid(InvalidInput::new(
                    "sum",
                    "66 is refused",
                )));
            }
            let key = ctx.key().to_owned();
            ctx.emit(&OUT, key, &-total)
        }
    }

    fn sessions() -> Bench<Sessions> {
        bench(Sessions, false)
    }

    fn sent(b: &Bench<Sessions>) -> Vec<String> {
        b.out.bodies().concat()
    }

    async fn sum_of(b: &Bench<Sessions>, key: &str) -> Option<i64> {
        let store = DynamoStateStore::new(b.table.clone(), b.clock.clone());
        let state = store
            .load(b.executor.namespace(), &[key.to_owned()])
            .await
            .unwrap();
        state[key]
            .slots
            .get("sum")
            .map(|s| serde_json::from_str(s.entries[0].get()).unwrap())
    }

    use crate::adapters::dynamodb::DynamoStateStore;

    #[tokio::test]
    async fn a_timer_fires_once_after_its_time_even_when_its_key_receives_nothing_more() {
        let b = sessions();
        b.executor.run(vec![record(1, "p", "a", 5)]).await;
        let early = b.executor.fire_timers(None).await.unwrap();
        assert_eq!(early, TimerSweep::default(), "nothing is due yet");
        b.clock.advance(IDLE);
        let sweep = b.executor.fire_timers(None).await.unwrap();
        assert_eq!((sweep.due, sweep.fired, sweep.left), (1, 1, 0));
        assert_eq!(sent(&b), ["5", "-5"]);
        assert_eq!(sum_of(&b, "a").await, None, "on_timer cleared the key");
        b.clock.advance(IDLE);
        let again = b.executor.fire_timers(None).await.unwrap();
        assert_eq!(again.due, 0, "a fired timer's entry is gone");
        assert_eq!(sent(&b).len(), 2);
    }

    #[tokio::test]
    async fn a_firing_leaves_no_watermark_behind_only_the_records_of_streams_do() {
        let b = sessions();
        b.executor.run(vec![record(1, "p", "a", 5)]).await;
        b.clock.advance(IDLE);
        b.executor.fire_timers(None).await.unwrap();
        assert_eq!(sent(&b), ["5", "-5"]);
        let store = DynamoStateStore::new(b.table.clone(), b.clock.clone());
        let state = store
            .load(b.executor.namespace(), &["a".to_owned()])
            .await
            .unwrap();
        let lineages: Vec<String> = state["a"]
            .watermarks
            .iter()
            .map(|(lineage, _)| lineage.0.clone())
            .collect();
        assert_eq!(lineages.len(), 1, "{lineages:?}");
        assert!(
            !lineages[0].starts_with(crate::domain::record::TIMER_STREAM),
            "{lineages:?}"
        );
    }

    #[tokio::test]
    async fn a_timer_swept_twice_fires_once_and_its_second_firing_is_skipped() {
        let b = sessions();
        b.executor.run(vec![record(1, "p", "a", 5)]).await;
        b.clock.advance(IDLE);
        let records = vec![
            Ok(SourceRecord::timer("a", START + IDLE)),
            Ok(SourceRecord::timer("a", START + IDLE)),
        ];
        let report = b.executor.run(records).await;
        assert_eq!((report.applied, report.replayed), (1, 1));
        let redelivered = b
            .executor
            .run(vec![Ok(SourceRecord::timer("a", START + IDLE))])
            .await;
        assert_eq!((redelivered.applied, redelivered.replayed), (0, 1));
        assert_eq!(sent(&b), ["5", "-5"]);
    }

    #[tokio::test]
    async fn a_cancelled_timer_and_an_entry_whose_commit_never_landed_fire_nothing() {
        let b = sessions();
        b.executor.run(vec![record(1, "p", "a", 5)]).await;
        b.clock.advance(10_000);
        // Cancels the timer at START + IDLE and sets one ten seconds later.
        b.executor.run(vec![record(2, "p", "a", 2)]).await;
        // An entry written by a commit that then lost its race: key b never had the timer.
        let store = DynamoStateStore::new(b.table.clone(), b.clock.clone());
        let orphan = TimerEntry {
            at_millis: START,
            key: "b".into(),
        };
        store
            .schedule_timers("sessions", &[orphan], START)
            .await
            .unwrap();
        b.clock.set(START + IDLE);
        let sweep = b.executor.fire_timers(None).await.unwrap();
        assert_eq!((sweep.due, sweep.fired, sweep.skipped), (2, 0, 2));
        assert_eq!(sent(&b), ["5", "7"]);
        b.clock.set(START + 10_000 + IDLE);
        let sweep = b.executor.fire_timers(None).await.unwrap();
        assert_eq!((sweep.due, sweep.fired), (1, 1));
        assert_eq!(sent(&b), ["5", "7", "-7"]);
    }

    #[tokio::test]
    async fn a_firing_whose_outputs_could_not_go_out_is_fired_again_with_the_same_output_ids() {
        let b = sessions();
        b.executor.run(vec![record(1, "p", "a", 5)]).await;
        b.clock.advance(IDLE);
        b.out.fail("-5");
        let sweep = b.executor.fire_timers(None).await.unwrap();
        assert_eq!((sweep.fired, sweep.left), (0, 1));
        assert_eq!(
            sum_of(&b, "a").await,
            Some(5),
            "the failed firing is not committed"
        );
        b.out.failing.lock().unwrap().clear();
        b.clock.advance(IDLE);
        let sweep = b.executor.fire_timers(None).await.unwrap();
        assert_eq!((sweep.fired, sweep.left), (1, 0));
        let calls = b.out.calls.lock().unwrap();
        let ids: Vec<&str> = calls
            .iter()
            .flatten()
            .filter(|o| o.body == "-5")
            .map(|o| o.id.as_str())
            .collect();
        assert!(ids.len() >= 2, "{ids:?}");
        assert!(
            ids.iter().all(|id| *id == ids[0]),
            "every firing sent one id: {ids:?}"
        );
        assert_ne!(ids[0], calls[0][0].id.as_str());
    }

    #[tokio::test]
    async fn keys_that_share_a_timer_entry_fire_once_each_and_one_that_fails_comes_due_again() {
        let b = sessions();
        b.executor
            .run(vec![
                record(1, "p", "a", 5),
                record(2, "p", "b", 4),
                record(3, "p", "c", 13),
            ])
            .await;
        let entries = || {
            let items = b.table.items();
            let of_timers = |i: &&crate::domain::Item| {
                i.get("pk")
                    .and_then(|pk| pk.as_s())
                    .is_some_and(|pk| pk.contains("#timers#"))
            };
            items.iter().filter(of_timers).count()
        };
        assert_eq!(entries(), 1, "the batch's three timers share one entry");
        b.clock.advance(IDLE);
        let sweep = b.executor.fire_timers(None).await.unwrap();
        // The batch reports the lowest time not applied: the timers of that time are left.
        assert_eq!((sweep.due, sweep.fired, sweep.left), (3, 2, 3));
        assert_eq!(sent(&b), ["5", "4", "13", "-5", "-4"]);
        b.clock.advance(IDLE);
        let sweep = b.executor.fire_timers(None).await.unwrap();
        assert_eq!(
            (sweep.due, sweep.fired, sweep.skipped, sweep.left),
            (3, 0, 2, 3),
            "a and b fired already; c fails again"
        );
        assert_eq!(sent(&b).len(), 5, "none fired twice");
        assert_eq!(entries(), 1, "postponed together, as one entry");
    }

    #[tokio::test]
    async fn a_firing_that_fails_stays_due_and_a_timer_set_in_the_past_fires_at_the_next_sweep() {
        let b = sessions();
        b.executor
            .run(vec![record(1, "p", "a", 6), record(2, "p", "a", 7)])
            .await;
        b.clock.advance(IDLE);
        let sweep = b.executor.fire_timers(None).await.unwrap();
        assert_eq!(
            (sweep.fired, sweep.left),
            (0, 1),
            "a sum of 13 fails on a timer"
        );
        assert_eq!(sum_of(&b, "a").await, Some(13));
        b.executor.run(vec![record(3, "q", "b", -5)]).await;
        let sweep = b.executor.fire_timers(None).await.unwrap();
        assert_eq!(
            (sweep.due, sweep.fired, sweep.left),
            (1, 1, 0),
            "b's timer, five seconds past when it was set, fired; a's waits its retry"
        );
        assert_eq!(sent(&b), ["6", "13", "-5", "5"]);
        b.clock.advance(RETRY_AFTER_MILLIS);
        let sweep = b.executor.fire_timers(None).await.unwrap();
        assert_eq!(
            (sweep.due, sweep.fired, sweep.left),
            (1, 0, 1),
            "a's timer is due again a minute later, and fails again"
        );
    }

    #[tokio::test]
    async fn a_dead_lettered_firing_takes_its_timer_off_the_key_as_a_firing_does() {
        let b = sessions();
        b.executor.run(vec![record(1, "p", "a", 66)]).await;
        b.clock.advance(IDLE);
        let sweep = b.executor.fire_timers(None).await.unwrap();
        assert_eq!((sweep.fired, sweep.dead_lettered, sweep.left), (0, 1, 0));
        let store = DynamoStateStore::new(b.table.clone(), b.clock.clone());
        let state = store
            .load(b.executor.namespace(), &["a".to_owned()])
            .await
            .unwrap();
        // Left pending, its index entry gone, it would never come due again: an operator that
        // sets a timer only when none is pending would wait for it for good.
        let pending: Vec<i64> = state["a"]
            .slots
            .get("keyway.timers")
            .and_then(|slot| slot.entries.first())
            .map(|raw| serde_json::from_str(raw.get()).unwrap())
            .unwrap_or_default();
        assert_eq!(pending, Vec::<i64>::new());
        assert_eq!(
            sum_of(&b, "a").await,
            Some(66),
            "the firing's work is not applied"
        );
    }

    #[tokio::test]
    async fn one_sweep_fires_every_timer_due_however_many_batches_they_take() {
        let b = sessions();
        let keys = TIMERS_PER_BATCH + 1;
        let mut batch = Vec::new();
        for i in 0..keys {
            batch.push(record(1 + i as u64, "p", &format!("k{i:03}"), 1));
        }
        b.executor.run(batch).await;
        b.clock.advance(IDLE);
        let sweep = b.executor.fire_timers(None).await.unwrap();
        assert_eq!((sweep.due, sweep.fired, sweep.left), (keys, keys, 0));
    }

    #[tokio::test]
    async fn one_sweep_goes_on_past_a_batch_that_left_a_failed_timer() {
        let b = sessions();
        // Key a's timer fails; more keys than one sweep batch holds are due with it.
        let mut batch = vec![record(1, "p", "a", 6), record(2, "p", "a", 7)];
        let others = TIMERS_PER_BATCH + 10;
        for i in 0..others {
            batch.push(record(3 + i as u64, "p", &format!("k{i:03}"), 1));
        }
        b.executor.run(batch).await;
        b.clock.advance(IDLE);
        let sweep = b.executor.fire_timers(None).await.unwrap();
        let notices = sent(&b).iter().filter(|body| *body == "-1").count();
        assert_eq!(
            notices, others,
            "every other key's timer fired in this sweep"
        );
        assert!(sweep.left >= 1, "{sweep:?}");
    }

    #[tokio::test]
    async fn a_timer_that_keeps_failing_does_not_hold_back_the_timers_due_after_it() {
        let b = sessions();
        // Key a's timer fails whenever it fires (a sum of 13); more keys than a sweep batch
        // holds have timers at the same time, ordered after a's.
        let mut batch = vec![record(1, "p", "a", 6), record(2, "p", "a", 7)];
        let others = TIMERS_PER_BATCH;
        for i in 0..others {
            batch.push(record(3 + i as u64, "p", &format!("k{i:03}"), 1));
        }
        b.executor.run(batch).await;
        for _ in 0..4 {
            b.clock.advance(IDLE);
            b.executor.fire_timers(None).await.unwrap();
        }
        let notices = sent(&b).iter().filter(|body| *body == "-1").count();
        assert_eq!(notices, others, "every other key's timer fired, once");
        assert_eq!(sum_of(&b, "a").await, Some(13), "a's timer still waits");
    }
}
