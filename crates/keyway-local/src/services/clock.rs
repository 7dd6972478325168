//! Virtual time for the embedded runtime.
//!
//! The clock reads tokio's clock: under a paused runtime (`start_paused`, as the tests and the
//! demo run) time moves only when every task waits, straight to the next timer. Batching windows,
//! record ages, backoffs and TTLs then pass instantly, and the same seed gives the same run.

use std::sync::Arc;

use tokio::time::Instant;

use keyway::ports::Clock;

/// A `Clock` on tokio's time: epoch milliseconds that advance as the runtime's clock does.
#[derive(Debug)]
pub struct VirtualClock {
    epoch_millis: i64,
    start: Instant,
}

impl VirtualClock {
    /// A clock that reads `epoch_millis` now. Create it inside the runtime whose clock it follows.
    pub fn starting_at(epoch_millis: i64) -> Arc<Self> {
        Arc::new(Self {
            epoch_millis,
            start: Instant::now(),
        })
    }
}

impl Clock for VirtualClock {
    fn now_millis(&self) -> i64 {
        self.epoch_millis + self.start.elapsed().as_millis() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_paused_runtime_moves_the_clock_only_by_what_tasks_wait() {
        let clock = VirtualClock::starting_at(1_000);
        assert_eq!(clock.now_millis(), 1_000);
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        assert_eq!(clock.now_millis(), 1_000 + 3_600_000);
    }
}
