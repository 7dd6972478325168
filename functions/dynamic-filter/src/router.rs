//! The sink of the filter's deliveries: each message goes to the queue its partition key names,
//! the messages of one queue together (SendMessageBatch, ten a call, through the queue's own
//! sink), every queue at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::future::join_all;
use keyway::domain::Output;
use keyway::lambda::PortError;
use keyway::ports::{Deadline, Sink, SinkError};

/// SQS's largest message.
pub const SQS_MESSAGE_MAX_BYTES: usize = keyway::adapters::sqs::BATCH_MAX_BYTES;

/// Makes the sink of a queue, by name.
pub type QueueSinks = dyn Fn(&str) -> Result<Arc<dyn Sink>, PortError> + Send + Sync;

/// The sink of the filter's deliveries: sends each message to the queue its partition key names,
/// through that queue's own sink.
pub struct QueueRouter {
    make: Box<QueueSinks>,
    sinks: Mutex<HashMap<String, Arc<dyn Sink>>>,
}

impl QueueRouter {
    /// A router that makes a queue's sink with `make` the first time it sends there, and keeps it.
    pub fn new(make: Box<QueueSinks>) -> Self {
        Self {
            make,
            sinks: Mutex::default(),
        }
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
            sink.send(&batch, deadline)
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

    fn ordered(&self) -> bool {
        // Standard queues keep no order; the filter's deliveries need none.
        false
    }
}
