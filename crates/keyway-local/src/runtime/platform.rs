//! The embedded services (Kinesis, DynamoDB, SQS on one virtual clock, with one fault plan) as
//! the `Platform` a function builds its ports from.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::crash::CrashBeforeCommit;
use crate::services::clock::VirtualClock;
use crate::services::dynamodb::LocalDynamoDb;
use crate::services::faults::{add_counts, Fault, FaultCounts, FaultPlan, Faults};
use crate::services::kinesis::LocalKinesis;
use crate::services::sqs::LocalSqs;
use keyway::adapters::dynamodb::{DynamoStateStore, ReadOnlyTable, Table};
use keyway::adapters::kinesis::KinesisSink;
use keyway::adapters::retry::Backoff;
use keyway::adapters::sqs::SqsSink;
use keyway::lambda::{Platform, PortError, SinkMaker, SinkTarget, TableAccess};
use keyway::ports::{Clock, MemoryMetrics, MetricLog, Sink, StateStore};

/// Kinesis, DynamoDB and SQS in memory, on one virtual clock, with one fault plan.
pub struct LocalServices {
    /// The virtual clock every service and function reads.
    pub clock: Arc<VirtualClock>,
    /// The DynamoDB tables, with their streams and TTL.
    pub dynamodb: Arc<LocalDynamoDb>,
    /// The Kinesis data streams.
    pub kinesis: Arc<LocalKinesis>,
    /// The SQS queues.
    pub sqs: Arc<LocalSqs>,
    /// The metric lines functions wrote.
    pub metrics: Arc<MemoryMetrics>,
    faults: FaultPlan,
    /// Draws for faults of invocations: crashes before commit, timeouts, duplicate deliveries.
    pub(super) invocation_faults: Arc<Faults>,
    /// Seeds the backoff jitter of every store and sink handed out, so that runs repeat.
    backoff_seeds: Arc<AtomicU64>,
}

impl LocalServices {
    /// Services whose clock starts at `epoch_millis`; call inside the tokio runtime they run on.
    pub fn new(epoch_millis: i64, faults: FaultPlan) -> Arc<Self> {
        let clock = VirtualClock::starting_at(epoch_millis);
        Arc::new(Self {
            dynamodb: Arc::new(LocalDynamoDb::new(clock.clone(), faults.clone())),
            kinesis: Arc::new(LocalKinesis::new(
                clock.clone(),
                Faults::new(faults.clone(), 0x6b1),
            )),
            sqs: Arc::new(LocalSqs::new(
                clock.clone(),
                Faults::new(faults.clone(), 0x5a5),
            )),
            metrics: Arc::default(),
            invocation_faults: Arc::new(Faults::new(faults.clone(), 0x1a4)),
            backoff_seeds: Arc::new(AtomicU64::new(faults.seed)),
            clock,
            faults,
        })
    }

    /// The faults injected so far, by service: `dynamodb`, `kinesis`, `sqs`, and `invocations`
    /// (crashes, timeouts and duplicate deliveries).
    pub fn faults_fired(&self) -> BTreeMap<&'static str, FaultCounts> {
        BTreeMap::from([
            ("dynamodb", self.dynamodb.faults_fired()),
            ("kinesis", self.kinesis.faults_fired()),
            ("sqs", self.sqs.faults_fired()),
            ("invocations", self.invocation_faults.fired()),
        ])
    }

    /// The chances each kind of fault had, at every service and invocation together: a kind
    /// that never fired may have had none (no commit of several writes for a crash inside one).
    pub fn faults_drawn(&self) -> FaultCounts {
        let mut all = self.dynamodb.faults_drawn();
        add_counts(&mut all, &self.kinesis.faults_drawn());
        add_counts(&mut all, &self.sqs.faults_drawn());
        add_counts(&mut all, &self.invocation_faults.drawn());
        all
    }

    /// Every kind of fault `plan` configured that never fired, anywhere.
    pub fn faults_missing(&self) -> Vec<Fault> {
        let mut all = FaultCounts::new();
        for counts in self.faults_fired().values() {
            add_counts(&mut all, counts);
        }
        self.faults
            .kinds()
            .into_iter()
            .filter(|kind| !all.contains_key(kind))
            .collect()
    }

    /// Calls from function invocations take these latencies of virtual time, and nothing else
    /// waits: an invocation lasts on the paused clock as long as it would wait on AWS.
    pub fn set_function_latency(&self, latency: &crate::usage::Latencies) {
        self.dynamodb.set_function_latency(Some(latency.dynamodb));
        self.kinesis
            .meter()
            .set_function_latency(Some(latency.kinesis));
        self.sqs.meter().set_function_latency(Some(latency.sqs));
    }

    /// Every service call takes `latency` of virtual time, so that a timeout can stop an
    /// invocation between two calls, as a real one would be stopped.
    pub fn set_latency(&self, latency: Option<Duration>) {
        self.kinesis.meter().set_latency(latency);
        self.sqs.meter().set_latency(latency);
        for table in self.dynamodb.tables() {
            table.meter().set_latency(latency);
        }
    }
}

impl Platform for LocalServices {
    fn state_store(&self, table: &str) -> Result<Arc<dyn StateStore>, PortError> {
        let table = self
            .dynamodb
            .table(table)
            .ok_or_else(|| PortError::NoTable {
                table: table.to_owned(),
            })?;
        let store: Arc<dyn StateStore> =
            Arc::new(DynamoStateStore::new(table, self.clock.clone()).with_backoff(self.backoff()));
        if self.faults.crash_before_commit > 0.0 {
            return Ok(Arc::new(CrashBeforeCommit::new(
                store,
                self.invocation_faults.clone(),
            )));
        }
        Ok(store)
    }

    /// A table asked for to read only refuses writes, as the function's role does on AWS.
    fn table(&self, table: &str, access: TableAccess) -> Result<Arc<dyn Table>, PortError> {
        let found = self
            .dynamodb
            .table(table)
            .ok_or_else(|| PortError::NoTable {
                table: table.to_owned(),
            })?;
        Ok(match access {
            TableAccess::ReadWrite => found,
            TableAccess::Read => Arc::new(ReadOnlyTable::new(found, table)),
        })
    }

    fn sink_maker(&self) -> SinkMaker {
        let (kinesis, sqs) = (self.kinesis.clone(), self.sqs.clone());
        let seeds = self.backoff_seeds.clone();
        Arc::new(move |target| {
            let backoff = Backoff::default().seeded(seeds.fetch_add(1, Ordering::SeqCst));
            Ok(match SinkTarget::parse(target)? {
                SinkTarget::Kinesis(stream) => {
                    Arc::new(KinesisSink::new(kinesis.clone(), stream).with_backoff(backoff))
                        as Arc<dyn Sink>
                }
                SinkTarget::Sqs(url) => {
                    Arc::new(SqsSink::new(sqs.clone(), url).with_backoff(backoff))
                }
            })
        })
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    fn metrics(&self) -> Arc<dyn MetricLog> {
        self.metrics.clone()
    }

    /// Seeded from the faults' seed, one after another: a retry's wait moves every later
    /// invocation on the virtual clock, and so which faults they draw.
    fn backoff(&self) -> Backoff {
        Backoff::default().seeded(self.backoff_seeds.fetch_add(1, Ordering::SeqCst))
    }
}
