//! Fault injection: each fault has a probability, drawn from a generator seeded per service, so
//! the same seed gives the same faults in the same run.

use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What can go wrong, and how often.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    /// A whole call is throttled (DynamoDB, Kinesis, SQS).
    pub throttle: f64,
    /// One entry of a batch call fails: an unprocessed key or item (BatchGetItem,
    /// BatchWriteItem), a failed record (PutRecords) or message (SendMessageBatch).
    pub partial_failure: f64,
    /// A conditional write meets the commit of a concurrent writer.
    pub conflict: f64,
    /// A write lands but its response is lost: the caller sees a timeout (PutItem).
    pub lost_response: f64,
    /// An invocation dies after emitting and before committing.
    pub crash_before_commit: f64,
    /// The event source mapping delivers a batch again after it succeeded.
    pub duplicate_delivery: f64,
    /// An invocation runs past the function's timeout and is stopped wherever it is.
    pub timeout: f64,
    /// A call to SQS starts an outage: every call fails as unavailable for `outage_millis` of
    /// virtual time. Left out of `all`: an outage per call at the rates of the other faults
    /// would leave the service down most of the time.
    pub outage: f64,
    pub outage_millis: i64,
    pub seed: u64,
}

impl FaultPlan {
    /// Every fault with the same probability.
    pub fn all(probability: f64, seed: u64) -> Self {
        Self {
            throttle: probability,
            partial_failure: probability,
            conflict: probability,
            lost_response: probability,
            crash_before_commit: probability,
            duplicate_delivery: probability,
            timeout: probability,
            seed,
            ..Self::default()
        }
    }
}

/// One service's draws from a plan.
#[derive(Debug)]
pub struct Faults {
    plan: FaultPlan,
    rng: Mutex<StdRng>,
    /// The end of the current outage (epoch milliseconds of the virtual clock).
    outage_until: Mutex<i64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self::none()
    }
}

impl Faults {
    /// Faults of `plan`, with a generator of its own: `salt` tells the services apart, so one
    /// service's draws do not depend on how often another one drew.
    pub fn new(plan: FaultPlan, salt: u64) -> Self {
        let rng = StdRng::seed_from_u64(plan.seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        Self {
            plan,
            rng: Mutex::new(rng),
            outage_until: Mutex::new(i64::MIN),
        }
    }

    pub fn none() -> Self {
        Self::new(FaultPlan::default(), 0)
    }

    pub fn plan(&self) -> &FaultPlan {
        &self.plan
    }

    pub fn draw(&self, probability: f64) -> bool {
        probability > 0.0
            && self
                .rng
                .lock()
                .expect("faults lock")
                .random_bool(probability.min(1.0))
    }

    pub fn draw_throttle(&self) -> bool {
        self.draw(self.plan.throttle)
    }

    pub fn draw_entry_failure(&self) -> bool {
        self.draw(self.plan.partial_failure)
    }

    pub fn draw_conflict(&self) -> bool {
        self.draw(self.plan.conflict)
    }

    pub fn draw_lost_response(&self) -> bool {
        self.draw(self.plan.lost_response)
    }

    /// Whether the service is down at `now`: in an outage, or starting one.
    pub fn in_outage(&self, now: i64) -> bool {
        let mut until = self.outage_until.lock().expect("faults lock");
        if now < *until {
            return true;
        }
        if self.draw(self.plan.outage) {
            *until = now + self.plan.outage_millis;
            return true;
        }
        false
    }

    /// A number in `0..bound`, from the same generator.
    pub fn pick(&self, bound: u64) -> u64 {
        self.rng
            .lock()
            .expect("faults lock")
            .random_range(0..bound.max(1))
    }
}
