//! Metering of service calls: counts per operation, DynamoDB capacity units as AWS bills them, and
//! waves of requests.
//!
//! The CPU time spent inside the in-memory services can be accounted separately
//! (`set_cpu_accounting`): on AWS that work happens on AWS's servers, so a benchmark of the
//! runtime subtracts it.
//!
//! A wave is a set of requests that run concurrently. Given a simulated latency, every call sleeps
//! that long on tokio's clock; under a paused clock (`tokio::time::pause`) calls issued together
//! start at the same instant, so the number of distinct start instants is the number of waves.
//!
//! What a function invocation calls is metered apart too (`MeterSnapshot::functions`): the
//! embedded runtime runs every invocation inside `in_function`, so a cost report can bill the
//! functions' work and leave out what producers and clients did around it. A latency for calls
//! from functions only (`set_function_latency`) makes an invocation last as long on a paused
//! clock as it would wait on AWS, without slowing the producers that feed it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// One service's meter: the calls made to it and what they were billed, with the simulated
/// latency every call waits.
#[derive(Debug, Default)]
pub struct Meter {
    inner: Mutex<MeterSnapshot>,
    starts: Mutex<BTreeSet<Instant>>,
    latency: Mutex<Option<Duration>>,
    function_latency: Mutex<Option<Duration>>,
    cpu_accounting: AtomicBool,
}

tokio::task_local! {
    /// Set while a function invocation runs (`in_function`).
    static IN_FUNCTION: ();
}

/// Runs `call` as a function invocation: the meters count what it calls among the functions'
/// calls, and make it wait their function latency.
pub(crate) async fn in_function<F: std::future::Future>(call: F) -> F::Output {
    IN_FUNCTION.scope((), call).await
}

fn called_from_a_function() -> bool {
    IN_FUNCTION.try_with(|_| ()).is_ok()
}

/// What the calls made from function invocations were billed: AWS's billing units of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Billed {
    /// Calls made from function invocations.
    pub calls: u64,
    /// DynamoDB read request units, as `MeterSnapshot::read_units`.
    pub read_units: f64,
    /// DynamoDB write request units, as `MeterSnapshot::write_units`.
    pub write_units: f64,
    /// Kinesis PUT payload units (25 KB of a record, at least one a record) or SQS requests
    /// (64 KB of a call's messages, at least one a call).
    pub request_units: f64,
}

/// What was metered so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MeterSnapshot {
    /// Calls per API operation name.
    pub calls: BTreeMap<String, u64>,
    /// Read request units (strongly consistent: one per 4 KB of each item, at least one).
    pub read_units: f64,
    /// Write request units (one per 1 KB of the larger of the old and new item, at least one).
    pub write_units: f64,
    /// Distinct start instants of calls (see the module doc).
    pub waves: u64,
    /// Time spent inside the service's calls, when accounting is on (see `Meter::busy`).
    pub service_cpu: Duration,
    /// Kinesis PUT payload units or SQS requests, as `Billed::request_units`.
    pub request_units: f64,
    /// The calls of function invocations among all these (see the module doc).
    pub functions: Billed,
}

impl MeterSnapshot {
    /// Calls of every operation.
    pub fn total_calls(&self) -> u64 {
        self.calls.values().sum()
    }

    /// DynamoDB read and write request units together.
    pub fn capacity_units(&self) -> f64 {
        self.read_units + self.write_units
    }
}

impl Meter {
    /// Every call sleeps `latency` from now on (see the module doc).
    pub fn set_latency(&self, latency: Option<Duration>) {
        *self.latency.lock().expect("meter lock") = latency;
    }

    /// Every call made from a function invocation sleeps `latency` from now on (a latency set
    /// with `set_latency` goes first).
    pub fn set_function_latency(&self, latency: Option<Duration>) {
        *self.function_latency.lock().expect("meter lock") = latency;
    }

    /// Accounts the CPU time of the service's calls from now on; meant for runs without latency,
    /// where a call never yields.
    pub fn set_cpu_accounting(&self, on: bool) {
        self.cpu_accounting.store(on, Ordering::Relaxed);
    }

    /// A guard that accounts the thread's CPU time until it drops, when accounting is on. Not
    /// the monotonic clock, though the thread CPU clock is a system call (a fraction of a
    /// microsecond): on a busy machine a thread is descheduled inside calls too, and counting
    /// that time as the services' took it from the caller's.
    pub fn busy(&self) -> Busy<'_> {
        let start = self
            .cpu_accounting
            .load(Ordering::Relaxed)
            .then(thread_cpu_time);
        Busy { meter: self, start }
    }

    /// Records a call and waits the simulated latency.
    pub async fn call(&self, operation: &str, read_units: f64, write_units: f64) {
        self.billed_call(operation, read_units, write_units, 0.0)
            .await
    }

    /// Records a call billed `request_units` (see `Billed`) and waits the simulated latency.
    pub(crate) async fn billed_call(
        &self,
        operation: &str,
        read_units: f64,
        write_units: f64,
        request_units: f64,
    ) {
        let from_function = called_from_a_function();
        {
            let mut inner = self.inner.lock().expect("meter lock");
            // Counted without allocating the name once it has a count.
            match inner.calls.get_mut(operation) {
                Some(calls) => *calls += 1,
                None => {
                    inner.calls.insert(operation.to_owned(), 1);
                }
            }
            inner.read_units += read_units;
            inner.write_units += write_units;
            inner.request_units += request_units;
            if from_function {
                let functions = &mut inner.functions;
                functions.calls += 1;
                functions.read_units += read_units;
                functions.write_units += write_units;
                functions.request_units += request_units;
            }
        }
        let mut latency = *self.latency.lock().expect("meter lock");
        if from_function && latency.is_none() {
            latency = *self.function_latency.lock().expect("meter lock");
        }
        if let Some(latency) = latency {
            self.starts
                .lock()
                .expect("meter lock")
                .insert(Instant::now());
            tokio::time::sleep(latency).await;
        }
    }

    /// What was metered since the meter was created or last reset.
    pub fn snapshot(&self) -> MeterSnapshot {
        let mut snapshot = self.inner.lock().expect("meter lock").clone();
        snapshot.waves = self.starts.lock().expect("meter lock").len() as u64;
        snapshot
    }

    /// Forgets what was metered so far; the latencies and CPU accounting stay as set.
    pub fn reset(&self) {
        *self.inner.lock().expect("meter lock") = MeterSnapshot::default();
        self.starts.lock().expect("meter lock").clear();
    }
}

/// Accounts service CPU time on drop (see `Meter::busy`).
pub struct Busy<'a> {
    meter: &'a Meter,
    /// The thread's CPU time when the call began.
    start: Option<Duration>,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            let spent = thread_cpu_time().saturating_sub(start);
            self.meter.inner.lock().expect("meter lock").service_cpu += spent;
        }
    }
}

/// The CPU time the calling thread has used.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes into the timespec we own; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Kinesis PUT payload units of a record of `size` bytes (data and partition key): one per
/// 25 KB, at least one.
pub fn put_payload_units(size: usize) -> f64 {
    size.div_ceil(25 * 1024).max(1) as f64
}

/// SQS requests billed for one call carrying `size` bytes of messages: one per 64 KB chunk, at
/// least one.
pub fn sqs_requests(size: usize) -> f64 {
    size.div_ceil(64 * 1024).max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_accounts_the_cpu_time_it_used_not_the_time_its_thread_was_off_the_cpu() {
        let meter = Meter::default();
        meter.set_cpu_accounting(true);
        {
            let _busy = meter.busy();
            // As if the machine descheduled the thread in the middle of a call.
            std::thread::sleep(Duration::from_millis(50));
        }
        let spent = meter.snapshot().service_cpu;
        assert!(spent < Duration::from_millis(10), "{spent:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_calls_count_as_one_wave_and_sequential_ones_as_two() {
        let meter = Meter::default();
        meter.set_latency(Some(Duration::from_millis(5)));
        futures::join!(meter.call("A", 1.0, 0.0), meter.call("B", 0.0, 1.0));
        meter.call("A", 1.0, 0.0).await;
        let snapshot = meter.snapshot();
        assert_eq!(snapshot.waves, 2);
        assert_eq!(snapshot.calls["A"], 2);
        assert_eq!(snapshot.capacity_units(), 3.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_from_a_function_is_billed_among_the_functions_and_waits_their_latency() {
        let meter = Meter::default();
        meter.set_function_latency(Some(Duration::from_millis(7)));
        let start = Instant::now();
        meter.billed_call("PutRecords", 0.0, 0.0, 2.0).await;
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a producer's call waits nothing"
        );
        in_function(meter.billed_call("PutRecords", 0.0, 0.0, 3.0)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(7));
        let snapshot = meter.snapshot();
        assert_eq!(snapshot.request_units, 5.0);
        assert_eq!(snapshot.functions.calls, 1);
        assert_eq!(snapshot.functions.request_units, 3.0);
    }

    #[test]
    fn kinesis_bills_25_kb_a_record_and_sqs_64_kb_a_call() {
        assert_eq!(put_payload_units(0), 1.0);
        assert_eq!(put_payload_units(25 * 1024), 1.0);
        assert_eq!(put_payload_units(25 * 1024 + 1), 2.0);
        assert_eq!(sqs_requests(64 * 1024), 1.0);
        assert_eq!(sqs_requests(256 * 1024), 4.0);
    }
}
