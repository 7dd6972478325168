//! What every sink that writes a table does with a batch of outputs: read each body as the change
//! it carries and apply it, one after another, each failure reported with whether a retry can
//! help. The filter state applies every change in order (`apply_each`); the CDC view, whose
//! writes are conditional on raising a row's rank, applies only the latest change of each row,
//! rows at once (`apply_latest`). Neither starts a write but its first past the send's deadline:
//! what is left comes back `OutOfTime`.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;

use futures::stream::{self, StreamExt};
use serde::de::DeserializeOwned;

use crate::domain::Output;
use crate::ports::{Deadline, SinkError, StoreError};

/// Applies the body of each of `messages`, read as a `T`, with `apply`. A body that is no `T` is
/// rejected as not `what`; a store error becomes the sink error that says whether to retry.
pub async fn apply_each<T, F, Fut>(
    messages: &[Output],
    what: &str,
    deadline: Deadline,
    mut apply: F,
) -> Vec<(usize, SinkError)>
where
    T: DeserializeOwned,
    F: FnMut(T) -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    let mut failed = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        if i > 0 && deadline.passed() {
            failed.extend((i..messages.len()).map(|i| (i, out_of_time())));
            break;
        }
        let outcome = match serde_json::from_str::<T>(&message.body) {
            Err(e) => Err(SinkError::Rejected(format!("not {what}: {e}"))),
            Ok(change) => apply(change).await.map_err(sink_error),
        };
        if let Err(e) = outcome {
            failed.push((i, e));
        }
    }
    failed
}

/// Applies, of the bodies of `messages` read as `T`, only the latest change of each row: `order`
/// says which row a change is of and its rank there, greater being later. For a table whose
/// writes are conditional on raising a row's rank, the row ends as if every change had been
/// applied, in any order, and costs one write instead of one a change (an update of a joined row
/// is a delete and an insert of it). Rows are written concurrently, in no order. A write that
/// may succeed later fails every message of its row: each is sent again with the one that stood
/// for them. A write the table refuses for good fails that message alone, and the row's other
/// changes are applied one by one, as `apply_each` would: none is lost for the sake of another.
pub async fn apply_latest<T, K, R, O, F, Fut>(
    messages: &[Output],
    what: &str,
    deadline: Deadline,
    order: O,
    apply: F,
) -> Vec<(usize, SinkError)>
where
    T: DeserializeOwned,
    K: Eq + Hash,
    R: Ord,
    O: Fn(&T) -> (K, R),
    F: Fn(T) -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    let mut failed = Vec::new();
    let mut rows: HashMap<K, usize> = HashMap::new();
    let mut latest: Vec<Row<T, R>> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let change = match serde_json::from_str::<T>(&message.body) {
            Ok(change) => change,
            Err(e) => {
                failed.push((i, SinkError::Rejected(format!("not {what}: {e}"))));
                continue;
            }
        };
        let (row, rank) = order(&change);
        match rows.get(&row) {
            Some(&at) => latest[at].add(i, change, rank),
            None => {
                rows.insert(row, latest.len());
                latest.push(Row {
                    changes: vec![(i, change)],
                    best: 0,
                    rank,
                });
            }
        }
    }
    // Each row is written once, so the writes may go at once: a batch's view changes take a few
    // round trips instead of one each.
    let apply = &apply;
    let first = std::sync::atomic::AtomicBool::new(true);
    let first = &first;
    let writes = latest.into_iter().map(|row| async move {
        // Looked at as the write starts, not as the batch does: rows go 16 at a time.
        let started = first.swap(false, std::sync::atomic::Ordering::Relaxed);
        if !started && deadline.passed() {
            return row
                .changes
                .iter()
                .map(|(i, _)| (*i, out_of_time()))
                .collect();
        }
        row.write(apply, deadline).await
    });
    let mut writes = stream::iter(writes).buffer_unordered(WRITES_IN_FLIGHT);
    while let Some(row_failed) = writes.next().await {
        failed.extend(row_failed);
    }
    failed.sort_by_key(|(i, _)| *i);
    failed
}

/// How many rows `apply_latest` writes at once.
const WRITES_IN_FLIGHT: usize = 16;

/// The changes of one row in a send, by message index, and which of them ranks highest.
struct Row<T, R> {
    changes: Vec<(usize, T)>,
    best: usize,
    rank: R,
}

impl<T, R: Ord> Row<T, R> {
    fn add(&mut self, message: usize, change: T, rank: R) {
        // Equal ranks are the same change sent twice: the first stands.
        if rank > self.rank {
            (self.best, self.rank) = (self.changes.len(), rank);
        }
        self.changes.push((message, change));
    }

    /// Writes the row's latest change; what failed, by message index.
    async fn write<F, Fut>(mut self, apply: &F, deadline: Deadline) -> Vec<(usize, SinkError)>
    where
        F: Fn(T) -> Fut,
        Fut: Future<Output = Result<(), StoreError>>,
    {
        let (message, change) = self.changes.remove(self.best);
        match apply(change).await.map_err(sink_error) {
            Ok(()) => Vec::new(),
            Err(e) if e.is_retryable() => std::iter::once(message)
                .chain(self.changes.iter().map(|(i, _)| *i))
                .map(|i| (i, e.clone()))
                .collect(),
            Err(refused) => {
                let mut failed = vec![(message, refused)];
                for (i, change) in self.changes {
                    if deadline.passed() {
                        failed.push((i, out_of_time()));
                        continue;
                    }
                    if let Err(e) = apply(change).await.map_err(sink_error) {
                        failed.push((i, e));
                    }
                }
                failed
            }
        }
    }
}

/// A write not started: the send's time ran out.
fn out_of_time() -> SinkError {
    SinkError::OutOfTime("a later write of the same send".into())
}

/// A store error as the sink error that says whether to retry.
fn sink_error(e: StoreError) -> SinkError {
    match e {
        StoreError::Invalid(why) => SinkError::Rejected(why),
        StoreError::Throttled(why) => SinkError::Throttled(why),
        other => SinkError::Unavailable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::OutputId;

    fn output(body: &str) -> Output {
        Output {
            id: OutputId("id".into()),
            sink: "s".into(),
            partition_key: "p".into(),
            body: body.into(),
            settled: false,
        }
    }

    #[tokio::test]
    async fn each_body_is_applied_and_a_failure_says_whether_a_retry_can_help() {
        let messages = [
            output("1"),
            output("x"),
            output("2"),
            output("3"),
            output("4"),
        ];
        let mut seen = Vec::new();
        let failed = apply_each(&messages, "a number", Deadline::NONE, |n: u32| {
            seen.push(n);
            async move {
                match n {
                    2 => Err(StoreError::Throttled("slow down".into())),
                    3 => Err(StoreError::Invalid("too large".into())),
                    _ => Ok(()),
                }
            }
        })
        .await;
        assert_eq!(seen, [1, 2, 3, 4]);
        let failures: Vec<(usize, bool)> =
            failed.iter().map(|(i, e)| (*i, e.is_retryable())).collect();
        assert_eq!(failures, [(1, false), (2, true), (3, false)]);
        assert!(failed[0].1.to_string().contains("not a number"));
    }

    /// Bodies "row:rank": the latest of each row stands for the others.
    fn row_and_rank(body: &str) -> (String, u32) {
        let (row, rank) = body.split_once(':').expect("row:rank");
        (row.to_owned(), rank.parse().expect("a rank"))
    }

    /// `apply_latest` over `bodies`, the table failing the changes `fails` names: what failed
    /// (index, whether a retry can help), and the changes written, in the order written.
    async fn apply_latest_failing(
        bodies: &[&str],
        fails: &[(&str, StoreError)],
    ) -> (Vec<(usize, bool)>, Vec<String>) {
        apply_latest_until(bodies, fails, Deadline::NONE).await
    }

    /// `apply_latest_failing` with a `deadline`.
    async fn apply_latest_until(
        bodies: &[&str],
        fails: &[(&str, StoreError)],
        deadline: Deadline,
    ) -> (Vec<(usize, bool)>, Vec<String>) {
        let messages: Vec<Output> = bodies.iter().map(|b| output(b)).collect();
        let applied = std::sync::Mutex::new(Vec::new());
        let failed = apply_latest(
            &messages,
            "a change",
            deadline,
            |b: &String| row_and_rank(b),
            |body: String| {
                applied.lock().unwrap().push(body.clone());
                let outcome = match fails.iter().find(|(change, _)| *change == body) {
                    Some((_, e)) => Err(e.clone()),
                    None => Ok(()),
                };
                async move { outcome }
            },
        )
        .await;
        let failures = failed.iter().map(|(i, e)| (*i, e.is_retryable()));
        (failures.collect(), applied.into_inner().unwrap())
    }

    #[tokio::test]
    async fn only_the_highest_ranked_change_of_each_row_is_applied() {
        let bodies = [r#""a:1""#, r#""b:5""#, r#""a:3""#, r#""a:2""#, r#""c:1""#];
        let (failed, mut applied) = apply_latest_failing(&bodies, &[]).await;
        assert!(failed.is_empty());
        applied.sort();
        assert_eq!(applied, ["a:3", "b:5", "c:1"]);
    }

    #[tokio::test]
    async fn a_failed_write_fails_every_message_of_its_row_and_an_unreadable_body_fails_alone() {
        let bodies = [r#""a:1""#, r#""b:1""#, "not json", r#""a:2""#];
        let slow = StoreError::Throttled("slow down".into());
        let (failed, _) = apply_latest_failing(&bodies, &[("a:2", slow)]).await;
        assert_eq!(failed, [(0, true), (2, false), (3, true)]);
    }

    #[tokio::test]
    async fn a_latest_change_the_table_refuses_for_good_fails_alone_and_the_rows_others_are_applied(
    ) {
        let bodies = [r#""a:1""#, r#""a:2""#, r#""a:3""#];
        let refused = StoreError::Invalid("too large".into());
        let (failed, applied) = apply_latest_failing(&bodies, &[("a:3", refused)]).await;
        assert_eq!(failed, [(2, false)]);
        assert_eq!(applied, ["a:3", "a:1", "a:2"]);
    }

    #[tokio::test]
    async fn past_the_deadline_only_the_first_row_is_written_and_the_others_wait_for_the_retry() {
        let bodies = [r#""a:1""#, r#""b:1""#, r#""a:2""#, r#""c:1""#];
        let passed = Deadline::after(std::time::Duration::ZERO);
        let (failed, applied) = apply_latest_until(&bodies, &[], passed).await;
        assert_eq!(applied, ["a:2"], "a's latest, its first row");
        assert_eq!(failed, [(1, true), (3, true)], "b's and c's");
    }

    #[tokio::test]
    async fn past_the_deadline_only_the_first_change_is_applied_in_order() {
        let messages = [output("1"), output("2"), output("3")];
        let mut seen = Vec::new();
        let passed = Deadline::after(std::time::Duration::ZERO);
        let failed = apply_each(&messages, "a number", passed, |n: u32| {
            seen.push(n);
            async { Ok(()) }
        })
        .await;
        assert_eq!(seen, [1]);
        let failed: Vec<usize> = failed.iter().map(|(i, _)| *i).collect();
        assert_eq!(failed, [1, 2]);
    }
}
