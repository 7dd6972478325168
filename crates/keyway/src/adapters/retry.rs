//! Capped exponential backoff with full jitter (the AWS Architecture Blog's "Exponential Backoff
//! And Jitter"): the n-th wait is uniform in [0, min(cap, base * 2^n)].

use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
    /// Attempts in all, the first one included.
    pub max_attempts: u32,
    rng: Mutex<StdRng>,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration, max_attempts: u32) -> Self {
        Self {
            base,
            cap,
            max_attempts,
            rng: Mutex::new(StdRng::from_os_rng()),
        }
    }

    /// The same jitter sequence for the same seed: deterministic tests and benchmarks.
    pub fn seeded(mut self, seed: u64) -> Self {
        self.rng = Mutex::new(StdRng::seed_from_u64(seed));
        self
    }

    /// The wait before retry number `retry` (0 for the first retry).
    pub fn delay(&self, retry: u32) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(1u32 << retry.min(20))
            .min(self.cap);
        let nanos = ceiling.as_nanos() as u64;
        let jitter = self
            .rng
            .lock()
            .expect("backoff rng lock")
            .random_range(0..=nanos);
        Duration::from_nanos(jitter)
    }

    pub async fn wait(&self, retry: u32) {
        tokio::time::sleep(self.delay(retry)).await;
    }
}

impl Default for Backoff {
    /// 25 ms doubling up to 2 s, 8 attempts: about 5 s of trying in the worst case, well inside a
    /// Lambda timeout, and past the short throttling bursts DynamoDB and Kinesis answer with.
    fn default() -> Self {
        Self::new(Duration::from_millis(25), Duration::from_secs(2), 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_spread_up_to_a_doubling_ceiling_and_stop_growing_at_the_cap() {
        let backoff =
            Backoff::new(Duration::from_millis(10), Duration::from_millis(100), 8).seeded(1);
        let mut means = Vec::new();
        for retry in 0..8 {
            let ceiling = Duration::from_millis(10 * (1 << retry)).min(Duration::from_millis(100));
            let delays: Vec<Duration> = (0..400).map(|_| backoff.delay(retry)).collect();
            assert!(delays.iter().all(|d| *d <= ceiling));
            // Full jitter: uniform below the ceiling, so about half of it on average.
            let mean = delays.iter().sum::<Duration>() / 400;
            assert!(
                mean > ceiling * 2 / 5 && mean < ceiling * 3 / 5,
                "retry {retry}: mean {mean:?} under a ceiling of {ceiling:?}"
            );
            means.push(mean);
        }
        assert!(means[0] < means[1] && means[1] < means[2] && means[2] < means[3]);
    }

    #[test]
    fn the_same_seed_gives_the_same_delays() {
        let a = Backoff::default().seeded(7);
        let b = Backoff::default().seeded(7);
        let da: Vec<_> = (0..5).map(|r| a.delay(r)).collect();
        let db: Vec<_> = (0..5).map(|r| b.delay(r)).collect();
        assert_eq!(da, db);
    }
}
