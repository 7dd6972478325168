//! A function whose answers a test scripts, and that remembers every batch it was given.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use keyway::lambda::{FunctionError, Handler, Invocation, Response};
use serde_json::Value;

/// One record as the function saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Its sequence number (a Kinesis record's, or a DynamoDB stream record's).
    pub sequence: String,
    /// Its partition key; for a DynamoDB stream record, its item's keys as JSON.
    pub key: String,
}

type Script = dyn Fn(usize, &[Seen]) -> Result<Value, FunctionError> + Send + Sync;

/// A stream function that answers each invocation as its script says, taking as long as it is
/// told, and remembers what it was given.
pub struct Scripted {
    /// The records of every batch it was given, in order.
    pub batches: Mutex<Vec<Vec<Seen>>>,
    script: Box<Script>,
    /// How long each invocation takes (virtual time).
    pub duration: Duration,
    /// Invocations running now, and the most that ever ran at once.
    pub in_flight: Mutex<(usize, usize)>,
    /// The deadline each invocation was given, in order.
    pub deadlines: Mutex<Vec<Option<i64>>>,
}

impl Scripted {
    /// `script(invocation index, records)` answers each invocation.
    pub fn new(
        script: impl Fn(usize, &[Seen]) -> Result<Value, FunctionError> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Self::taking(Duration::ZERO, script)
    }

    /// As `new`, each invocation taking `duration` (virtual time) before it answers.
    pub fn taking(
        duration: Duration,
        script: impl Fn(usize, &[Seen]) -> Result<Value, FunctionError> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            batches: Mutex::default(),
            script: Box::new(script),
            duration,
            in_flight: Mutex::default(),
            deadlines: Mutex::default(),
        })
    }

    /// A function that always succeeds.
    pub fn succeeding() -> Arc<Self> {
        Self::new(|_, _| Ok(serde_json::json!({"batchItemFailures": []})))
    }

    /// The records of every batch it was given so far, in order.
    pub fn batches(&self) -> Vec<Vec<Seen>> {
        self.batches.lock().unwrap().clone()
    }

    /// How many records each batch so far held, in order.
    pub fn sizes(&self) -> Vec<usize> {
        self.batches().iter().map(Vec::len).collect()
    }

    /// The most invocations that were running at once.
    pub fn max_concurrency(&self) -> usize {
        self.in_flight.lock().unwrap().1
    }
}

#[async_trait]
impl Handler for Scripted {
    async fn handle(
        &self,
        event: &str,
        invocation: &Invocation,
    ) -> Result<Response, FunctionError> {
        self.deadlines
            .lock()
            .unwrap()
            .push(invocation.deadline_millis);
        let event: Value = serde_json::from_str(event).expect("the event is JSON");
        let records: Vec<Seen> = event["Records"]
            .as_array()
            .expect("a stream event")
            .iter()
            .map(|r| match r["eventSource"].as_str() {
                Some("aws:dynamodb") => Seen {
                    sequence: r["dynamodb"]["SequenceNumber"].as_str().unwrap().to_owned(),
                    key: r["dynamodb"]["Keys"].to_string(),
                },
                _ => Seen {
                    sequence: r["kinesis"]["sequenceNumber"].as_str().unwrap().to_owned(),
                    key: r["kinesis"]["partitionKey"].as_str().unwrap().to_owned(),
                },
            })
            .collect();
        let index = {
            let mut batches = self.batches.lock().unwrap();
            batches.push(records.clone());
            batches.len() - 1
        };
        {
            let mut flight = self.in_flight.lock().unwrap();
            flight.0 += 1;
            flight.1 = flight.1.max(flight.0);
        }
        if !self.duration.is_zero() {
            tokio::time::sleep(self.duration).await;
        }
        self.in_flight.lock().unwrap().0 -= 1;
        // A script answers as any function may, malformed responses included.
        (self.script)(index, &records).map(Response::Json)
    }
}
