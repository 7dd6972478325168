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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Default)]
pub struct Meter {
    inner: Mutex<MeterSnapshot>,
    starts: Mutex<BTreeSet<Instant>>,
    latency: Mutex<Option<Duration>>,
    cpu_accounting: AtomicBool,
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
}

impl MeterSnapshot {
    pub fn total_calls(&self) -> u64 {
        self.calls.values().sum()
    }

    pub fn capacity_units(&self) -> f64 {
        self.read_units + self.write_units
    }
}

impl Meter {
    /// Every call sleeps `latency` from now on (see the module doc).
    pub fn set_latency(&self, latency: Option<Duration>) {
        *self.latency.lock().expect("meter lock") = latency;
    }

    /// Accounts the CPU time of the service's calls from now on; meant for runs without latency,
    /// where a call never yields.
    pub fn set_cpu_accounting(&self, on: bool) {
        self.cpu_accounting.store(on, Ordering::Relaxed);
    }

    /// A guard that accounts the time until it drops, when accounting is on. It reads the
    /// monotonic clock (a few nanoseconds, where the thread CPU clock is a system call that would
    /// weigh on what it measures): inside a call that never yields, on one thread, that is CPU time.
    pub fn busy(&self) -> Busy<'_> {
        let start = self
            .cpu_accounting
            .load(Ordering::Relaxed)
            .then(std::time::Instant::now);
        Busy { meter: self, start }
    }

    /// Records a call and waits the simulated latency.
    pub async fn call(&self, operation: &str, read_units: f64, write_units: f64) {
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
        }
        let latency = *self.latency.lock().expect("meter lock");
        if let Some(latency) = latency {
            self.starts
                .lock()
                .expect("meter lock")
                .insert(Instant::now());
            tokio::time::sleep(latency).await;
        }
    }

    pub fn snapshot(&self) -> MeterSnapshot {
        let mut snapshot = self.inner.lock().expect("meter lock").clone();
        snapshot.waves = self.starts.lock().expect("meter lock").len() as u64;
        snapshot
    }

    pub fn reset(&self) {
        *self.inner.lock().expect("meter lock") = MeterSnapshot::default();
        self.starts.lock().expect("meter lock").clear();
    }
}

/// Accounts service CPU time on drop (see `Meter::busy`).
pub struct Busy<'a> {
    meter: &'a Meter,
    start: Option<std::time::Instant>,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            self.meter.inner.lock().expect("meter lock").service_cpu += start.elapsed();
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

/// Read units of one strongly consistent read of an item of `size` bytes.
pub fn read_units(size: usize) -> f64 {
    size.div_ceil(4096).max(1) as f64
}

/// Write units of one write of an item of `size` bytes.
pub fn write_units(size: usize) -> f64 {
    size.div_ceil(1024).max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_round_each_item_up_to_the_next_block() {
        assert_eq!(read_units(0), 1.0);
        assert_eq!(read_units(4096), 1.0);
        assert_eq!(read_units(4097), 2.0);
        assert_eq!(write_units(1), 1.0);
        assert_eq!(write_units(1025), 2.0);
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
}
