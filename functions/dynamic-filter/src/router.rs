//! The sink of the filter's deliveries: each message goes to the queue its partition key names,
//! the messages of one queue together (SendMessageBatch, ten a call, through the queue's own
//! sink), every queue at once.
//!
//! A consumer's queue is the consumer's to break (its KMS key disabled or deleted), and a
//! delivery that fails retryably keeps its event, and so the events after it on its shard, from
//! being checkpointed: every consumer reading that shard would wait with it, for the day Lambda
//! retries a record. So a queue that has refused every delivery for longer than the filter's
//! patience while other queues took theirs (or for twice as long, whatever they did) has its
//! deliveries refused for good, which dead-letters them with why (nothing is lost), until it
//! takes one again. (A queue deleted, or
//! whose policy denies the filter, refuses for good at once.)

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use keyway::domain::Output;
use keyway::lambda::PortError;
use keyway::ports::{Clock, Deadline, Sink, SinkError};

/// SQS's largest message.
pub const SQS_MESSAGE_MAX_BYTES: usize = keyway::adapters::sqs::BATCH_MAX_BYTES;

/// The filter's setting of its patience with a queue that refuses every delivery, in seconds.
pub const PATIENCE: &str = "QUEUE_PATIENCE_SECONDS";

/// Makes the sink of a queue, by name.
pub type QueueSinks = dyn Fn(&str) -> Result<Arc<dyn Sink>, PortError> + Send + Sync;

/// How long a queue may refuse every delivery, retryably, before its deliveries are
/// dead-lettered: long enough for an outage of SQS or a throttled burst to pass, short against
/// the day Lambda retries a shard's records for.
pub const DEFAULT_PATIENCE: Duration = Duration::from_secs(600);

/// How far apart two refusals of a queue may come and still be one streak: a refused delivery's
/// record is retried within seconds, so a queue that keeps refusing is tried again well within it.
const STREAK_GAP_MILLIS: i64 = 60_000;

/// The sink of the filter's deliveries: sends each message to the queue its partition key names,
/// through that queue's own sink.
pub struct QueueRouter {
    make: Box<QueueSinks>,
    sinks: Mutex<HashMap<String, Arc<dyn Sink>>>,
    clock: Arc<dyn Clock>,
    patience: Duration,
    refusals: Mutex<Refusals>,
}

impl QueueRouter {
    /// A router that makes a queue's sink with `make` the first time it sends there, and keeps it;
    /// `clock` times how long a queue refuses (`DEFAULT_PATIENCE` at most).
    pub fn new(make: Box<QueueSinks>, clock: Arc<dyn Clock>) -> Self {
        Self {
            make,
            sinks: Mutex::default(),
            clock,
            patience: DEFAULT_PATIENCE,
            refusals: Mutex::default(),
        }
    }

    /// With `patience` for a queue that refuses every delivery, instead of the default.
    pub fn with_patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// Sends `batch` to `queue`; the deliveries that failed, as the filter answers them.
    async fn send_to(
        &self,
        queue: &str,
        sink: &dyn Sink,
        batch: &[Output],
        deadline: Deadline,
    ) -> Vec<(usize, SinkError)> {
        let patience = self.patience.as_millis() as i64;
        let past = |refusals: &Refusals| refusals.past(queue, self.clock.now_millis(), patience);
        // Past the patience, one call and no retry: enough to see the queue take deliveries again.
        let deadline = match past(&self.refusals.lock().expect("refusals lock")) {
            true => Deadline::after(Duration::ZERO),
            false => deadline,
        };
        let failed = sink.send(batch, deadline).await;
        let mut refusals = self.refusals.lock().expect("refusals lock");
        let refused = refusals.note(queue, self.clock.now_millis(), batch.len(), &failed);
        if !refused || !past(&refusals) {
            return failed;
        }
        let why = |e: SinkError| {
            SinkError::Rejected(format!(
                "queue {queue:?} has refused every delivery, retryably, for longer than the filter's patience of {} s ({PATIENCE}); its last refusal: {e}",
                self.patience.as_secs()
            ))
        };
        failed.into_iter().map(|(i, e)| (i, why(e))).collect()
    }

    fn sink(&self, queue: &str) -> Result<Arc<dyn Sink>, PortError> {
        let mut sinks = self.sinks.lock().expect("sinks lock");
        if let Some(sink) = sinks.get(queue) {
            return Ok(sink.clone());
        }
        let sink = (self.make)(queue)?;
        sinks.insert(queue.to_owned(), sink.clone());
        Ok(sink)
    }
}

/// What this instance of the function saw of its queues' refusals, on its clock's milliseconds.
#[derive(Default)]
struct Refusals {
    /// Each refusing queue's streak: its first refusal and its latest.
    streaks: HashMap<String, (i64, i64)>,
    /// When a queue last took a delivery.
    last_taken: Option<i64>,
}

impl Refusals {
    /// Whether `queue` has refused every delivery, with no gap, for `patience` or longer while
    /// another queue took one, or for twice as long whatever the others did. SQS or KMS down
    /// for every queue is no consumer's doing, and a dead-letter queue would take the deliveries
    /// of consumers that did nothing wrong; but the refused queue's events may fill every retry
    /// of their shard (a hot filter key of one consumer), so that no other queue is sent
    /// anything, and that must not hold the others back for good either.
    fn past(&self, queue: &str, now: i64, patience: i64) -> bool {
        self.streaks.get(queue).is_some_and(|&(since, last)| {
            let others_took = self.last_taken.is_some_and(|taken| taken > since);
            now - last <= STREAK_GAP_MILLIS
                && now - since >= if others_took { patience } else { 2 * patience }
        })
    }

    /// Notes what a send of `sent` deliveries to `queue` got back (`failed`): whether the queue
    /// refused them all, retryably. One taken ends its streak, one cut short for time keeps it
    /// going; one refused for good says nothing of it. Streaks that ended without a word (no
    /// send for a minute) are forgotten.
    fn note(&mut self, queue: &str, now: i64, sent: usize, failed: &[(usize, SinkError)]) -> bool {
        self.streaks
            .retain(|_, &mut (_, last)| now - last <= STREAK_GAP_MILLIS);
        if failed.len() < sent {
            self.last_taken = Some(now);
            self.streaks.remove(queue);
            return false;
        }
        let all = |f: fn(&SinkError) -> bool| failed.iter().all(|(_, e)| f(e));
        let refused = all(|e| matches!(e, SinkError::Throttled(_) | SinkError::Unavailable(_)));
        if refused {
            self.streaks.entry(queue.to_owned()).or_insert((now, now)).1 = now;
        } else if all(|e| matches!(e, SinkError::OutOfTime(_))) {
            // Tried, and not known to be well: a streak goes on.
            if let Some(streak) = self.streaks.get_mut(queue) {
                streak.1 = now;
            }
        }
        refused
    }
}

#[async_trait]
impl Sink for QueueRouter {
    async fn send(&self, messages: &[Output], deadline: Deadline) -> Vec<(usize, SinkError)> {
        let mut by_queue: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, message) in messages.iter().enumerate() {
            by_queue.entry(&message.partition_key).or_default().push(i);
        }
        let sends = by_queue.into_iter().map(|(queue, indices)| async move {
            let sink = match self.sink(queue) {
                Ok(sink) => sink,
                Err(why) => {
                    let refused = SinkError::Rejected(format!("queue {queue:?}: {why}"));
                    return indices.into_iter().map(|i| (i, refused.clone())).collect();
                }
            };
            let batch: Vec<Output> = indices.iter().map(|&i| messages[i].clone()).collect();
            self.send_to(queue, sink.as_ref(), &batch, deadline)
                .await
                .into_iter()
                .map(|(j, e)| (indices[j], e))
                .collect::<Vec<_>>()
        });
        let mut failed: Vec<(usize, SinkError)> =
            join_all(sends).await.into_iter().flatten().collect();
        failed.sort_by_key(|(i, _)| *i);
        failed
    }

    fn max_message_bytes(&self) -> usize {
        SQS_MESSAGE_MAX_BYTES
    }

    /// A FIFO queue keeps the order of a filter key's events (its message group is the queue);
    /// a standard queue keeps none, and its deliveries all go at once.
    fn ordered(&self) -> bool {
        true
    }

    /// Not for a queue past the filter's patience: its deliveries are dead-lettered, one call
    /// a batch, which one a round would spend the batch's time on.
    fn keeps_order_of(&self, queue: &str) -> bool {
        let patience = self.patience.as_millis() as i64;
        queue.ends_with(".fifo")
            && !(self.refusals.lock().expect("refusals lock")).past(
                queue,
                self.clock.now_millis(),
                patience,
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway::ports::ManualClock;

    /// Queue "q" answers each send with the next scripted answer (`None` takes every message,
    /// `Some((error, all))` fails every message with it, or only the first), and notes whether
    /// the send could still retry; every other queue takes all.
    #[derive(Default)]
    struct Scripted {
        script: Mutex<Vec<Option<(SinkError, bool)>>>,
        retries_allowed: Mutex<Vec<bool>>,
    }

    #[async_trait]
    impl Sink for Scripted {
        async fn send(&self, messages: &[Output], deadline: Deadline) -> Vec<(usize, SinkError)> {
            if messages[0].partition_key != "q" {
                return Vec::new();
            }
            self.retries_allowed
                .lock()
                .unwrap()
                .push(!deadline.passed());
            match self.script.lock().unwrap().remove(0) {
                None => Vec::new(),
                Some((e, all)) => {
                    let failing = if all { messages.len() } else { 1 };
                    (0..failing).map(|i| (i, e.clone())).collect()
                }
            }
        }
        fn max_message_bytes(&self) -> usize {
            SQS_MESSAGE_MAX_BYTES
        }
        fn ordered(&self) -> bool {
            false
        }
    }

    fn delivery(queue: &str) -> Output {
        Output {
            id: keyway::domain::OutputId("id".into()),
            sink: "deliveries".into(),
            partition_key: queue.into(),
            body: "{}".into(),
            settled: false,
        }
    }

    /// A router of queue "q", answering `script` in turn, and other queues, with a patience of
    /// ten minutes.
    fn router(
        script: Vec<Option<(SinkError, bool)>>,
    ) -> (QueueRouter, Arc<ManualClock>, Arc<Scripted>) {
        let clock = ManualClock::at(0);
        let sink = Arc::new(Scripted {
            script: Mutex::new(script),
            ..Scripted::default()
        });
        let made: Arc<dyn Sink> = sink.clone();
        let router = QueueRouter::new(Box::new(move |_| Ok(made.clone())), clock.clone())
            .with_patience(Duration::from_secs(600));
        (router, clock, sink)
    }

    /// A minute after the last send, two deliveries to "q" and, if `others`, one to another
    /// queue: the errors of q's.
    async fn send(router: &QueueRouter, clock: &ManualClock, others: bool) -> Vec<SinkError> {
        clock.advance(60_000);
        let mut deliveries = vec![delivery("q"), delivery("q")];
        if others {
            deliveries.push(delivery("other"));
        }
        let sent = router.send(&deliveries, Deadline::NONE).await;
        sent.into_iter().map(|(_, e)| e).collect()
    }

    fn down() -> Option<(SinkError, bool)> {
        Some((
            SinkError::Unavailable("KmsDisabled: the key is disabled".into()),
            true,
        ))
    }

    fn retryable(errors: &[SinkError]) -> bool {
        errors.iter().all(SinkError::is_retryable)
    }

    /// Sends a minute apart `minutes` times, each failure retryable.
    async fn retried_for(minutes: usize, router: &QueueRouter, clock: &ManualClock, others: bool) {
        for minute in 1..=minutes {
            let errors = send(router, clock, others).await;
            assert!(retryable(&errors), "minute {minute}: {errors:?}");
        }
    }

    #[tokio::test]
    async fn a_queue_that_refuses_every_delivery_past_the_patience_has_them_refused_for_good_with_why(
    ) {
        let (router, clock, sink) = router(vec![down(); 12]);
        retried_for(10, &router, &clock, true).await;
        // Ten minutes after its first refusal, the eleventh: one call, no retry.
        let errors = send(&router, &clock, true).await;
        assert_eq!(errors.len(), 2);
        for error in errors {
            assert!(!error.is_retryable());
            let why = error.to_string();
            assert!(
                why.contains("queue \"q\" has refused every delivery, retryably, for longer than the filter's patience of 600 s")
                    && why.contains("KmsDisabled"),
                "{why}"
            );
        }
        let allowed = sink.retries_allowed.lock().unwrap().clone();
        assert_eq!(allowed, [vec![true; 10], vec![false]].concat());
    }

    #[tokio::test]
    async fn a_queue_that_takes_one_delivery_starts_its_patience_again() {
        let mut script = vec![down(); 9];
        script.push(Some((SinkError::Unavailable("KmsDisabled".into()), false)));
        script.extend(vec![down(); 10]);
        let (router, clock, _) = router(script);
        // Nine minutes refusing, one taking one of two, then ten refusing: never ten in a row.
        retried_for(20, &router, &clock, true).await;
    }

    #[tokio::test]
    async fn a_queue_refusing_while_no_other_queue_takes_a_delivery_is_waited_for_twice_the_patience(
    ) {
        // SQS (or KMS) down for every queue, or one consumer's events filling every retry of
        // their shard: twenty minutes of retries, then refused for good.
        let (router, clock, _) = router(vec![down(); 21]);
        retried_for(20, &router, &clock, false).await;
        let errors = send(&router, &clock, false).await;
        assert!(errors.iter().all(|e| !e.is_retryable()), "{errors:?}");
    }

    #[tokio::test]
    async fn a_refusal_long_past_does_not_count_toward_the_next() {
        let (router, clock, _) = router(vec![down(); 2]);
        assert!(retryable(&send(&router, &clock, true).await));
        // Two hours of deliveries to other queues only, then q refuses again: a new streak.
        clock.advance(2 * 3_600_000);
        assert!(router
            .send(&[delivery("other")], Deadline::NONE)
            .await
            .is_empty());
        assert!(retryable(&send(&router, &clock, true).await));
    }

    #[tokio::test]
    async fn a_send_cut_short_for_time_does_not_end_a_queues_refusal() {
        let out_of_time = Some((SinkError::OutOfTime("the deadline".into()), true));
        let mut script = vec![down()];
        script.extend(vec![out_of_time; 8]);
        script.extend(vec![down(); 3]);
        let (router, clock, _) = router(script);
        // Refusing from minute 1; the cut sends do not end it: at minute 11, ten minutes on, the
        // patience has run out.
        retried_for(10, &router, &clock, true).await;
        let errors = send(&router, &clock, true).await;
        assert!(errors.iter().all(|e| !e.is_retryable()), "{errors:?}");
    }
}
