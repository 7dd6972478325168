//! Fault injection: each fault has a probability, drawn from a generator seeded per service, so
//! the same seed gives the same faults in the same run. Every fault that fires is counted, per
//! kind, so that a test can require the faults it configured to have happened.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// An invocation dies inside a commit: after writing the state's new segments, before the
    /// head that would reference them.
    pub crash_in_commit: f64,
    /// The event source mapping delivers a batch again after it succeeded.
    pub duplicate_delivery: f64,
    /// An invocation runs past the function's timeout and is stopped wherever it is.
    pub timeout: f64,
    /// A call to SQS starts an outage: every call fails as unavailable for `outage_millis` of
    /// virtual time. Left out of `all`: an outage per call at the rates of the other faults
    /// would leave the service down most of the time.
    pub outage: f64,
    /// How long each drawn outage lasts, in milliseconds of virtual time.
    pub outage_millis: i64,
    /// SQS down for a stretch of virtual time (epoch milliseconds, start to end), whatever the
    /// probabilities say: a sink down for an hour.
    pub outage_window: Option<(i64, i64)>,
    /// Seeds every service's draws: the same seed gives the same faults.
    pub seed: u64,
}

impl FaultPlan {
    /// Every fault but outages with the same probability.
    pub fn all(probability: f64, seed: u64) -> Self {
        Self {
            throttle: probability,
            partial_failure: probability,
            conflict: probability,
            lost_response: probability,
            crash_before_commit: probability,
            crash_in_commit: probability,
            duplicate_delivery: probability,
            timeout: probability,
            seed,
            ..Self::default()
        }
    }

    /// The kinds this plan gives a chance to.
    pub fn kinds(&self) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|kind| kind.probability(self) > 0.0)
            .collect()
    }
}

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// A whole call throttled (`FaultPlan::throttle`).
    Throttle,
    /// One entry of a batch call failed (`FaultPlan::partial_failure`).
    PartialFailure,
    /// A conditional write met a concurrent writer's commit (`FaultPlan::conflict`).
    Conflict,
    /// A write landed but its response was lost (`FaultPlan::lost_response`).
    LostResponse,
    /// An invocation died between emitting and committing (`FaultPlan::crash_before_commit`).
    CrashBeforeCommit,
    /// An invocation died inside a commit (`FaultPlan::crash_in_commit`).
    CrashInCommit,
    /// A batch delivered again after it succeeded (`FaultPlan::duplicate_delivery`).
    DuplicateDelivery,
    /// An invocation stopped by the function's timeout (`FaultPlan::timeout`).
    Timeout,
    /// An SQS outage started, drawn or in the plan's outage window (`FaultPlan::outage`).
    Outage,
}

impl Fault {
    /// Every kind, in the order they are declared.
    pub const ALL: [Fault; 9] = [
        Fault::Throttle,
        Fault::PartialFailure,
        Fault::Conflict,
        Fault::LostResponse,
        Fault::CrashBeforeCommit,
        Fault::CrashInCommit,
        Fault::DuplicateDelivery,
        Fault::Timeout,
        Fault::Outage,
    ];

    /// The kind in words, as reports print it (`"lost response"`).
    pub fn name(self) -> &'static str {
        match self {
            Fault::Throttle => "throttle",
            Fault::PartialFailure => "partial failure",
            Fault::Conflict => "conflict",
            Fault::LostResponse => "lost response",
            Fault::CrashBeforeCommit => "crash before commit",
            Fault::CrashInCommit => "crash in commit",
            Fault::DuplicateDelivery => "duplicate delivery",
            Fault::Timeout => "timeout",
            Fault::Outage => "outage",
        }
    }

    fn probability(self, plan: &FaultPlan) -> f64 {
        match self {
            Fault::Throttle => plan.throttle,
            Fault::PartialFailure => plan.partial_failure,
            Fault::Conflict => plan.conflict,
            Fault::LostResponse => plan.lost_response,
            Fault::CrashBeforeCommit => plan.crash_before_commit,
            Fault::CrashInCommit => plan.crash_in_commit,
            Fault::DuplicateDelivery => plan.duplicate_delivery,
            Fault::Timeout => plan.timeout,
            Fault::Outage => plan.outage,
        }
    }
}

/// The payload of a crash: the invocation's process dies where it is. The event source mapping
/// emulator catches it and reports the invocation as crashed, as Lambda reports a runtime that
/// exited.
#[derive(Debug)]
pub struct Crash;

/// Crashes the invocation now (unwinding without the panic hook: a crash is no bug).
pub fn crash() -> ! {
    std::panic::resume_unwind(Box::new(Crash))
}

/// How many faults of each kind fired.
pub type FaultCounts = BTreeMap<Fault, u64>;

/// One service's draws from a plan.
#[derive(Debug)]
pub struct Faults {
    plan: FaultPlan,
    rng: Mutex<StdRng>,
    /// The end of the current outage (epoch milliseconds of the virtual clock).
    outage_until: Mutex<i64>,
    fired: [AtomicU64; Fault::ALL.len()],
    /// Draws made, fired or not: the chances each kind had.
    drawn: [AtomicU64; Fault::ALL.len()],
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
            fired: Default::default(),
            drawn: Default::default(),
        }
    }

    /// Draws that never fire: the empty plan.
    pub fn none() -> Self {
        Self::new(FaultPlan::default(), 0)
    }

    /// The plan the draws are made from.
    pub fn plan(&self) -> &FaultPlan {
        &self.plan
    }

    /// Whether a fault of `kind` fires now; counted when it does, and as a chance when the plan
    /// gives the kind one.
    pub fn draw(&self, kind: Fault) -> bool {
        let probability = kind.probability(&self.plan);
        if probability > 0.0 {
            self.drawn[kind as usize].fetch_add(1, Ordering::Relaxed);
        }
        let fires = probability > 0.0
            && self
                .rng
                .lock()
                .expect("faults lock")
                .random_bool(probability.min(1.0));
        if fires {
            self.fired[kind as usize].fetch_add(1, Ordering::Relaxed);
        }
        fires
    }

    /// Whether the service is down at `now`: in an outage, or starting one (counted once).
    pub(crate) fn in_outage(&self, now: i64) -> bool {
        let mut until = self.outage_until.lock().expect("faults lock");
        if now < *until {
            return true;
        }
        if let Some((start, end)) = self.plan.outage_window {
            if (start..end).contains(&now) {
                *until = end;
                self.fired[Fault::Outage as usize].fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        if self.draw(Fault::Outage) {
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

    /// The faults that fired so far, by kind (kinds that never fired are left out).
    pub fn fired(&self) -> FaultCounts {
        counts(&self.fired)
    }

    /// The chances each kind had so far: draws, fired or not (kinds never drawn are left out).
    pub fn drawn(&self) -> FaultCounts {
        counts(&self.drawn)
    }
}

/// The kinds counted above zero in `counters`.
fn counts(counters: &[AtomicU64; Fault::ALL.len()]) -> FaultCounts {
    Fault::ALL
        .into_iter()
        .filter_map(|kind| {
            let n = counters[kind as usize].load(Ordering::Relaxed);
            (n > 0).then_some((kind, n))
        })
        .collect()
}

/// Adds `more` into `counts`.
pub fn add_counts(counts: &mut FaultCounts, more: &FaultCounts) {
    for (kind, n) in more {
        *counts.entry(*kind).or_default() += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_that_fires_is_counted_by_kind() {
        let faults = Faults::new(
            FaultPlan {
                throttle: 0.5,
                conflict: 1.0,
                seed: 3,
                ..FaultPlan::default()
            },
            0,
        );
        let throttles = (0..1000).filter(|_| faults.draw(Fault::Throttle)).count() as u64;
        assert!(faults.draw(Fault::Conflict));
        assert!(
            !faults.draw(Fault::Timeout),
            "a kind with no chance never fires"
        );
        let fired = faults.fired();
        assert_eq!(fired[&Fault::Throttle], throttles);
        assert!((400..600).contains(&throttles), "{throttles}");
        assert_eq!(fired[&Fault::Conflict], 1);
        assert!(!fired.contains_key(&Fault::Timeout));
        let drawn = faults.drawn();
        assert_eq!(
            (drawn[&Fault::Throttle], drawn[&Fault::Conflict]),
            (1000, 1),
            "every draw a chance, fired or not"
        );
        assert!(
            !drawn.contains_key(&Fault::Timeout),
            "no chance in the plan"
        );
    }

    #[test]
    fn a_scheduled_outage_holds_from_its_start_to_its_end_and_is_counted_once() {
        let faults = Faults::new(
            FaultPlan {
                outage_window: Some((1_000, 2_000)),
                ..FaultPlan::default()
            },
            0,
        );
        assert!(!faults.in_outage(999));
        assert!(faults.in_outage(1_000));
        assert!(faults.in_outage(1_999));
        assert!(!faults.in_outage(2_000));
        assert_eq!(faults.fired()[&Fault::Outage], 1);
    }

    #[test]
    fn an_outage_is_counted_once_and_lasts_its_time() {
        let faults = Faults::new(
            FaultPlan {
                outage: 1.0,
                outage_millis: 100,
                ..FaultPlan::default()
            },
            0,
        );
        assert!(faults.in_outage(0));
        assert!(faults.in_outage(99));
        assert_eq!(faults.fired()[&Fault::Outage], 1);
        assert!(faults.in_outage(100), "a new one starts");
        assert_eq!(faults.fired()[&Fault::Outage], 2);
    }
}
