//! Metering of service calls: counts per operation, DynamoDB capacity units as AWS bills them, and
//! waves of requests.
//!
//! A wave is a set of requests that run concurrently. Given a simulated latency, every call sleeps
//! that long on tokio's clock; under a paused clock (`tokio::time::pause`) calls issued together
//! start at the same instant, so the number of distinct start instants is the number of waves.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Default)]
pub struct Meter {
    inner: Mutex<MeterSnapshot>,
    starts: Mutex<BTreeSet<Instant>>,
    latency: Mutex<Option<Duration>>,
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

    /// Records a call and waits the simulated latency.
    pub async fn call(&self, operation: &str, read_units: f64, write_units: f64) {
        {
            let mut inner = self.inner.lock().expect("meter lock");
            *inner.calls.entry(operation.to_owned()).or_default() += 1;
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
