//! The sink of the filter's deliveries: each message goes to the queue its partition key names,
//! the messages of one queue together (SendMessageBatch, ten a call, through the queue's own
//! sink), every queue at once.
//!
//! A consumer's queue is the consumer's to break (its KMS key disabled, its policy turned
//! against the filter), and a delivery that fails retryably keeps its event, and so the events
//! after it on its shard, from being checkpointed: every consumer reading that shard would wait
//! with it. So a queue that has refused every delivery for longer than the filter's patience has
//! its deliveries refused for good, which dead-letters them with why (nothing is lost), until
//! it takes one again.

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

/// The sink of the filter's deliveries: sends each message to the queue its partition key names,
/// through that queue's own sink.
pub struct QueueRouter {
    make: Box<QueueSinks>,
    sinks: Mutex<HashMap<String, Arc<dyn Sink>>>,
    clock: Arc<dyn Clock>,
    patience: Duration,
    /// Since when (`clock`'s milliseconds) each queue that is refusing has refused every delivery
    /// sent to it, as this instance of the function saw it.
    refusing_since: Mutex<HashMap<String, i64>>,
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
            refusing_since: Mutex::default(),
        }
    }

    /// With `patience` for a queue that refuses every delivery, instead of the default.
    pub fn with_patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// The failures of `sent` deliveries to `queue`, as the filter answers them: a queue that
    /// took one is well again; one that has refused every delivery, retryably, for the patience
    /// or longer has them refused for good, with why.
    fn judge(
        &self,
        queue: &str,
        sent: usize,
        failed: Vec<(usize, SinkError)>,
    ) -> Vec<(usize, SinkError)> {
        let refusing = failed.len() == sent
            && failed
                .iter()
                .all(|(_, e)| matches!(e, SinkError::Throttled(_) | SinkError::Unavailable(_)));
        let mut since = self.refusing_since.lock().expect("refusals lock");
        if !refusing {
            // A send cut short for time says nothing of the queue.
            if failed.len() < sent {
                since.remove(queue);
            }
            return failed;
        }
        let now = self.clock.now_millis();
        let refused_for = now - *since.entry(queue.to_owned()).or_insert(now);
        if refused_for < self.patience.as_millis() as i64 {
            return failed;
        }
        let why = |e: SinkError| {
            SinkError::Rejected(format!(
                "queue {queue:?} has refused every delivery for {} s, past the filter's patience of {} s ({PATIENCE}); the last refusal: {e}",
                refused_for / 1000,
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
            let failed = sink.send(&batch, deadline).await;
            self.judge(queue, batch.len(), failed)
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

    fn ordered(&self) -> bool {
        // Standard queues keep no order; the filter's deliveries need none.
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway::ports::ManualClock;

    /// A queue's sink that answers each send with the next scripted answer: `None` takes every
    /// message, `Some(error)` fails each with it, `Some` of the first only fails that one.
    struct Scripted(Mutex<Vec<(Option<SinkError>, bool)>>);

    #[async_trait]
    impl Sink for Scripted {
        async fn send(&self, messages: &[Output], _: Deadline) -> Vec<(usize, SinkError)> {
            let (answer, first_only) = self.0.lock().unwrap().remove(0);
            let failing = if first_only { 1 } else { messages.len() };
            answer.map_or_else(Vec::new, |e| (0..failing).map(|i| (i, e.clone())).collect())
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

    /// A router of one queue whose sends answer `script` in turn, a minute apart on its clock.
    fn router(script: Vec<(Option<SinkError>, bool)>) -> (QueueRouter, Arc<ManualClock>) {
        let clock = ManualClock::at(0);
        let sink: Arc<dyn Sink> = Arc::new(Scripted(Mutex::new(script)));
        let router = QueueRouter::new(Box::new(move |_| Ok(sink.clone())), clock.clone())
            .with_patience(Duration::from_secs(600));
        (router, clock)
    }

    /// Sends two deliveries to queue `q` a minute after the last send: the errors they got.
    async fn send(router: &QueueRouter, clock: &ManualClock) -> Vec<SinkError> {
        clock.advance(60_000);
        let sent = router
            .send(&[delivery("q"), delivery("q")], Deadline::NONE)
            .await;
        sent.into_iter().map(|(_, e)| e).collect()
    }

    fn down() -> Option<SinkError> {
        Some(SinkError::Unavailable(
            "KmsDisabled: the key is disabled".into(),
        ))
    }

    #[tokio::test]
    async fn a_queue_that_refuses_every_delivery_past_the_patience_has_them_refused_for_good_with_why(
    ) {
        let (router, clock) = router(vec![(down(), false); 12]);
        for minute in 1..=10 {
            let errors = send(&router, &clock).await;
            assert!(
                errors.iter().all(SinkError::is_retryable),
                "minute {minute}: {errors:?}"
            );
        }
        // Ten minutes after its first refusal, the eleventh.
        let errors = send(&router, &clock).await;
        assert_eq!(errors.len(), 2);
        for error in errors {
            assert!(!error.is_retryable());
            let why = error.to_string();
            assert!(
                why.contains("\"q\" has refused every delivery for 600 s")
                    && why.contains("patience of 600 s")
                    && why.contains("KmsDisabled"),
                "{why}"
            );
        }
    }

    #[tokio::test]
    async fn a_queue_that_takes_one_delivery_starts_its_patience_again() {
        let mut script = vec![(down(), false); 9];
        script.push((down(), true));
        script.extend(vec![(down(), false); 10]);
        let (router, clock) = router(script);
        // Nine minutes refusing, one taking one of two, then ten refusing: never ten in a row.
        for minute in 1..=20 {
            let errors = send(&router, &clock).await;
            assert!(
                errors.iter().all(SinkError::is_retryable),
                "minute {minute}: {errors:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_send_cut_short_for_time_does_not_end_a_queues_refusal() {
        let out_of_time = Some(SinkError::OutOfTime("the deadline".into()));
        let mut script = vec![(down(), false)];
        script.extend(vec![(out_of_time, false); 8]);
        script.extend(vec![(down(), false); 3]);
        let (router, clock) = router(script);
        // Refusing from minute 1; the cut sends do not end it: at minute 11, ten
        // minutes on, the patience has run out.
        for _ in 1..=10 {
            let errors = send(&router, &clock).await;
            assert!(errors.iter().all(SinkError::is_retryable), "{errors:?}");
        }
        let errors = send(&router, &clock).await;
        assert!(errors.iter().all(|e| !e.is_retryable()), "{errors:?}");
    }
}
