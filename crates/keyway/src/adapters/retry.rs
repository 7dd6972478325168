//! Capped exponential backoff with full jitter (the AWS Architecture Blog's "Exponential Backoff
//! And Jitter"): the n-th wait is uniform in [0, min(cap, base * 2^n)]; and the one loop every
//! adapter retries its calls with, from a single put to the entries a batch call left unprocessed,
//! with how a sink's messages split into batch calls.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::ports::{Deadline, SinkError, StoreError};

/// Capped exponential backoff with full jitter, and how many attempts a call gets.
#[derive(Debug)]
pub struct Backoff {
    /// The ceiling of the first retry's wait, doubled for each retry after it.
    pub base: Duration,
    /// The most a wait's ceiling grows to.
    pub cap: Duration,
    /// Attempts in all, the first one included.
    pub max_attempts: u32,
    rng: Mutex<StdRng>,
}

impl Backoff {
    /// Waits from `base` doubling up to `cap`, over `max_attempts` attempts, jittered from the
    /// system's entropy (`seeded` for a fixed sequence).
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

    /// Gives `work` to `round` (one call, or calls at once over parts of it), then what the round
    /// asks to retry, after a backoff, until nothing is left to retry, the attempts run out, or
    /// the next retry would start past `deadline`. With a deadline, only rounds that leave all
    /// their work to retry use attempts up: a call larger than what a limit takes a second (a
    /// Kinesis shard's 1,000 records) goes through a part at a time, as long as the time allows.
    /// Without one, every round counts, which bounds the time a call takes. Returns the work that
    /// failed: for good, or still failing at the last attempt or the deadline, each with its last
    /// error. Successes are the round's own to keep.
    pub(crate) async fn retry_rounds<T, E, F, Fut>(
        &self,
        work: Vec<T>,
        deadline: Deadline,
        mut round: F,
    ) -> Vec<(T, E)>
    where
        F: FnMut(Vec<T>) -> Fut,
        Fut: Future<Output = Round<T, E>>,
    {
        let mut failed = Vec::new();
        let mut pending = work;
        // Retries so far, which set the next wait; rounds in a row that used an attempt up.
        let (mut retries, mut stalled) = (0, 0);
        while !pending.is_empty() {
            let asked = pending.len();
            let Round {
                retry,
                failed: lost,
            } = round(pending).await;
            failed.extend(lost);
            if retry.is_empty() {
                break;
            }
            let progressed = deadline.is_set() && retry.len() < asked;
            stalled = if progressed { 0 } else { stalled + 1 };
            if stalled >= self.max_attempts {
                failed.extend(retry);
                break;
            }
            let wait = self.delay(retries);
            if !deadline.allows(wait) {
                failed.extend(retry);
                break;
            }
            tokio::time::sleep(wait).await;
            retries += 1;
            pending = retry.into_iter().map(|(item, _)| item).collect();
        }
        failed
    }

    /// Sends a sink's `calls` (each the indexes of the messages one call takes), each call's
    /// `round` retried as `retry_rounds` does: one call after another where the sink keeps order,
    /// so that a later message goes only once the earlier ones went or failed, all at once where
    /// it does not. A call after the first is not started once `deadline` has passed: its
    /// messages come back `OutOfTime`, to go with their records' retry. Returns every message not
    /// sent.
    pub(crate) async fn send_calls<F, Fut>(
        &self,
        calls: Vec<Vec<usize>>,
        in_order: bool,
        deadline: Deadline,
        round: F,
    ) -> Vec<(usize, SinkError)>
    where
        F: Fn(Vec<usize>) -> Fut,
        Fut: Future<Output = Round<usize, SinkError>>,
    {
        let call = |indexes| self.retry_rounds(indexes, deadline, &round);
        let mut failed = Vec::new();
        if in_order {
            let mut calls = calls.into_iter();
            for indexes in calls.by_ref() {
                failed.extend(call(indexes).await);
                if deadline.passed() {
                    break;
                }
            }
            let late = || SinkError::OutOfTime("a later call of the same send".into());
            failed.extend(calls.flatten().map(|i| (i, late())));
        } else {
            let sends = calls.into_iter().map(call);
            failed.extend(futures::future::join_all(sends).await.into_iter().flatten());
        }
        failed
    }

    /// `call`, again after a backoff while its error is retryable, up to the attempts.
    pub async fn retry_call<T, E, F, Fut>(&self, call: F) -> Result<T, E>
    where
        E: Retryable,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.retry_call_until(Deadline::NONE, call).await
    }

    /// `retry_call`, with no retry starting past `deadline`: a sink's write, which must be done
    /// before its invocation commits.
    pub async fn retry_call_until<T, E, F, Fut>(
        &self,
        deadline: Deadline,
        mut call: F,
    ) -> Result<T, E>
    where
        E: Retryable,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let done = Mutex::new(None);
        let done = &done;
        let failed = self
            .retry_rounds(vec![()], deadline, move |_| {
                let attempt = call();
                async move {
                    match attempt.await {
                        Ok(value) => {
                            *done.lock().expect("retried call's result") = Some(value);
                            Round::default()
                        }
                        Err(err) => Round::of_error((), err),
                    }
                }
            })
            .await;
        match failed.into_iter().next() {
            Some(((), err)) => Err(err),
            None => Ok(done
                .lock()
                .expect("retried call's result")
                .take()
                .expect("a round without an error has a result")),
        }
    }
}

/// What one batch call of a service takes (a PutRecords, a SendMessageBatch).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallLimits {
    /// Entries a call.
    pub entries: usize,
    /// Bytes a call, all entries together.
    pub bytes: usize,
    /// Bytes an entry.
    pub entry_bytes: usize,
}

/// Splits messages of `sizes` (as the service counts them), in order, into calls within
/// `limits`; a message larger than an entry may be is refused for good, `too_large` saying why.
/// Returns the calls (message indexes) and the refused.
pub(crate) fn split_calls(
    sizes: impl Iterator<Item = usize>,
    limits: CallLimits,
    too_large: impl Fn(usize) -> String,
) -> (Vec<Vec<usize>>, Vec<(usize, SinkError)>) {
    let (mut calls, mut refused) = (Vec::new(), Vec::new());
    let (mut call, mut call_bytes): (Vec<usize>, usize) = (Vec::new(), 0);
    for (i, size) in sizes.enumerate() {
        if size > limits.entry_bytes {
            refused.push((i, SinkError::Rejected(too_large(size))));
            continue;
        }
        if call.len() == limits.entries || call_bytes + size > limits.bytes {
            calls.push(std::mem::take(&mut call));
            call_bytes = 0;
        }
        call.push(i);
        call_bytes += size;
    }
    if !call.is_empty() {
        calls.push(call);
    }
    (calls, refused)
}

/// An error that says whether trying again can help.
pub trait Retryable {
    /// Whether the same call may succeed later.
    fn is_retryable(&self) -> bool;
}

impl Retryable for StoreError {
    fn is_retryable(&self) -> bool {
        StoreError::is_retryable(self)
    }
}

impl Retryable for SinkError {
    fn is_retryable(&self) -> bool {
        SinkError::is_retryable(self)
    }
}

/// What one round of calls left of the work it was given: what to try again and what failed for
/// good, each with its error. Work in neither succeeded.
#[derive(Debug)]
pub(crate) struct Round<T, E> {
    /// Work to try again, each with the error it failed with.
    pub retry: Vec<(T, E)>,
    /// Work that failed for good, each with its error.
    pub failed: Vec<(T, E)>,
}

impl<T, E> Default for Round<T, E> {
    fn default() -> Self {
        Self {
            retry: Vec::new(),
            failed: Vec::new(),
        }
    }
}

impl<T, E: Retryable> Round<T, E> {
    /// `item` failed with `err`: retried if the error says so, failed for good otherwise.
    pub(crate) fn add_error(&mut self, item: T, err: E) {
        if err.is_retryable() {
            self.retry.push((item, err));
        } else {
            self.failed.push((item, err));
        }
    }

    fn of_error(item: T, err: E) -> Self {
        let mut round = Self::default();
        round.add_error(item, err);
        round
    }
}

impl Default for Backoff {
    /// 25 ms doubling up to 2 s, 8 attempts: at most 3.2 s of waits (half that on average), well
    /// inside a Lambda timeout, and past the short throttling bursts DynamoDB and Kinesis answer
    /// with. (A sink's call given a deadline goes on while it gets work through, until then.)
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

    /// A round that fails items 0 and 1 for `throttled` rounds (retryable), item 2 for good, and
    /// lets the others through; it records what it was given.
    fn round(
        given: &Mutex<Vec<Vec<u32>>>,
        throttled: usize,
    ) -> impl FnMut(Vec<u32>) -> std::future::Ready<Round<u32, StoreError>> + '_ {
        move |pending| {
            let mut given = given.lock().unwrap();
            given.push(pending.clone());
            let mut round = Round::default();
            for item in pending {
                match item {
                    0 | 1 if given.len() <= throttled => {
                        round.add_error(item, StoreError::Throttled("slow down".into()))
                    }
                    2 => round.add_error(item, StoreError::Invalid("no such item".into())),
                    _ => {}
                }
            }
            std::future::ready(round)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_retry_only_what_failed_for_now_until_it_succeeds() {
        let backoff = || Backoff::new(Duration::from_millis(10), Duration::from_secs(1), 8);
        let twin = backoff().seeded(3);
        let waits = twin.delay(0) + twin.delay(1);
        assert!(waits > Duration::ZERO);
        let given = Mutex::new(Vec::new());
        let start = tokio::time::Instant::now();
        let failed = backoff()
            .seeded(3)
            .retry_rounds(vec![0, 1, 2, 3], Deadline::NONE, round(&given, 2))
            .await;
        // A backoff wait before each retry (tokio's timer counts whole milliseconds).
        let waited = start.elapsed();
        assert!(
            waited >= waits && waited <= waits + Duration::from_millis(2),
            "waited {waited:?} for {waits:?}"
        );
        assert_eq!(
            failed,
            vec![(2, StoreError::Invalid("no such item".into()))]
        );
        let given = given.into_inner().unwrap();
        assert_eq!(given, vec![vec![0, 1, 2, 3], vec![0, 1], vec![0, 1]]);
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_give_up_after_the_attempts_with_the_last_errors() {
        let backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1), 3);
        let given = Mutex::new(Vec::new());
        let failed = backoff
            .retry_rounds(vec![0, 1, 3], Deadline::NONE, round(&given, 10))
            .await;
        let throttled = StoreError::Throttled("slow down".into());
        assert_eq!(failed, vec![(0, throttled.clone()), (1, throttled)]);
        assert_eq!(
            given.into_inner().unwrap().len(),
            3,
            "without a deadline, the first round counts although it got item 3 through"
        );
    }

    /// A round that lets two items through and throttles the rest, as a shard's second of
    /// capacity would; it counts its rounds.
    fn two_a_round(
        rounds: &std::sync::atomic::AtomicU32,
    ) -> impl FnMut(Vec<u32>) -> std::future::Ready<Round<u32, StoreError>> + '_ {
        move |pending| {
            rounds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut round = Round::default();
            for item in pending.into_iter().skip(2) {
                round.add_error(item, StoreError::Throttled("slow down".into()));
            }
            std::future::ready(round)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_deadline_work_a_limit_lets_through_a_part_a_round_all_goes_through_however_many_rounds(
    ) {
        let backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(100), 3);
        let rounds = std::sync::atomic::AtomicU32::new(0);
        let deadline = Deadline::after(Duration::from_secs(60));
        let failed = backoff
            .retry_rounds((0..20).collect(), deadline, two_a_round(&rounds))
            .await;
        assert_eq!(failed, Vec::new());
        assert_eq!(rounds.load(std::sync::atomic::Ordering::SeqCst), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn no_retry_starts_past_the_deadline_and_what_is_left_fails_with_its_last_error() {
        let backoff =
            Backoff::new(Duration::from_millis(400), Duration::from_millis(400), 3).seeded(7);
        let rounds = std::sync::atomic::AtomicU32::new(0);
        let start = tokio::time::Instant::now();
        let deadline = Deadline::after(Duration::from_secs(2));
        let failed = backoff
            .retry_rounds((0..100).collect(), deadline, two_a_round(&rounds))
            .await;
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        let rounds = rounds.load(std::sync::atomic::Ordering::SeqCst) as usize;
        // Waits of 400 ms at most: five rounds at least fit in two seconds, far from the 50 the
        // work needs.
        assert!((5..50).contains(&rounds), "{rounds} rounds");
        let left: Vec<u32> = failed.iter().map(|(item, _)| *item).collect();
        assert_eq!(left, (2 * rounds as u32..100).collect::<Vec<_>>());
        assert!(failed
            .iter()
            .all(|(_, err)| *err == StoreError::Throttled("slow down".into())));
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_deadline_rounds_that_get_nothing_through_still_stop_after_the_attempts() {
        let backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(100), 3);
        let given = Mutex::new(Vec::new());
        let deadline = Deadline::after(Duration::from_secs(3600));
        let failed = backoff
            .retry_rounds(vec![0, 1], deadline, round(&given, 100))
            .await;
        assert_eq!(failed.len(), 2);
        assert_eq!(
            given.into_inner().unwrap().len(),
            3,
            "three attempts, an hour to spare"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_retried_until_a_deadline_is_not_retried_past_it() {
        let backoff =
            Backoff::new(Duration::from_millis(400), Duration::from_millis(400), 100).seeded(3);
        let calls = std::sync::atomic::AtomicU32::new(0);
        let start = tokio::time::Instant::now();
        let result = backoff
            .retry_call_until(Deadline::after(Duration::from_secs(1)), || {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                std::future::ready(Err::<(), _>(StoreError::Throttled("slow down".into())))
            })
            .await;
        assert_eq!(result, Err(StoreError::Throttled("slow down".into())));
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        let calls = calls.load(std::sync::atomic::Ordering::SeqCst);
        assert!((3..100).contains(&calls), "{calls} calls");
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_already_passed_still_lets_the_first_round_go_and_no_retry() {
        let backoff = Backoff::default();
        let rounds = std::sync::atomic::AtomicU32::new(0);
        let deadline = Deadline::after(Duration::ZERO);
        assert!(deadline.passed());
        let failed = backoff
            .retry_rounds((0..5).collect(), deadline, two_a_round(&rounds))
            .await;
        assert_eq!(rounds.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(failed.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_is_retried_while_its_error_is_retryable_and_returns_its_value() {
        let backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1), 8);
        let calls = std::sync::atomic::AtomicU32::new(0);
        let result = backoff
            .retry_call(|| {
                let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                std::future::ready(match n {
                    0 | 1 => Err(StoreError::Throttled("slow down".into())),
                    n => Ok(n),
                })
            })
            .await;
        assert_eq!(result, Ok(2));
        let refused = backoff
            .retry_call(|| {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                std::future::ready(Err::<u32, _>(StoreError::Conflict))
            })
            .await;
        assert_eq!(refused, Err(StoreError::Conflict));
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 4);
    }

    #[test]
    fn an_error_is_retried_only_if_it_says_a_retry_can_help() {
        let mut round = Round::default();
        round.add_error(0, SinkError::Throttled("slow down".into()));
        round.add_error(1, SinkError::Rejected("too large".into()));
        round.add_error(2, SinkError::Unavailable("try later".into()));
        let items = |v: &[(u32, SinkError)]| v.iter().map(|(i, _)| *i).collect::<Vec<_>>();
        assert_eq!(items(&round.retry), [0, 2]);
        assert_eq!(items(&round.failed), [1]);
        let mut round = Round::default();
        round.add_error(0, StoreError::Conflict);
        round.add_error(1, StoreError::Unavailable("try later".into()));
        assert_eq!((round.retry.len(), round.failed.len()), (1, 1));
        assert_eq!(round.failed[0].1, StoreError::Conflict);
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
