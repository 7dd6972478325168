//! What every sink that writes a table does with a batch of outputs: read each body as the change
//! it carries and apply it, one after another, each failure reported with whether a retry can
//! help. The filter state applies every change in order (`apply_each`); the CDC view, whose
//! writes are conditional on raising a row's rank, applies only the latest change of each row,
//! rows at once (`apply_latest`).

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;

use futures::stream::{self, StreamExt};
use serde::de::DeserializeOwned;

use crate::domain::Output;
use crate::ports::{SinkError, StoreError};

/// Applies the body of each of `messages`, read as a `T`, with `apply`. A body that is no `T` is
/// rejected as not `what`; a store error becomes the sink error that says whether to retry.
pub async fn apply_each<T, F, Fut>(
    messages: &[Output],
    what: &str,
    mut apply: F,
) -> Vec<(usize, SinkError)>
where
    T: DeserializeOwned,
    F: FnMut(T) -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    let mut failed = Vec::new();
    for (i, message) in messages.iter().enumerate() {
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
/// is a delete and an insert of it). Rows are written concurrently, in no order. A failure fails
/// every message of its row: each is sent again, or dead-lettered, with the one that stood for
/// them.
pub async fn apply_latest<T, K, R, O, F, Fut>(
    messages: &[Output],
    what: &str,
    order: O,
    mut apply: F,
) -> Vec<(usize, SinkError)>
where
    T: DeserializeOwned,
    K: Eq + Hash,
    R: Ord,
    O: Fn(&T) -> (K, R),
    F: FnMut(T) -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    struct Latest<T, R> {
        change: T,
        rank: R,
        messages: Vec<usize>,
    }
    let mut failed = Vec::new();
    let mut rows: HashMap<K, usize> = HashMap::new();
    let mut latest: Vec<Latest<T, R>> = Vec::new();
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
            Some(&at) => {
                let held = &mut latest[at];
                held.messages.push(i);
                if rank > held.rank {
                    (held.change, held.rank) = (change, rank);
                }
            }
            None => {
                rows.insert(row, latest.len());
                latest.push(Latest {
                    change,
                    rank,
                    messages: vec![i],
                });
            }
        }
    }
    // Each row is written once, so the writes may go at once: a batch's view changes take a few
    // round trips instead of one each.
    let mut writes = stream::iter(latest.into_iter().map(|held| {
        let write = apply(held.change);
        async move { (held.messages, write.await) }
    }))
    .buffer_unordered(WRITES_IN_FLIGHT);
    while let Some((messages, outcome)) = writes.next().await {
        if let Err(e) = outcome.map_err(sink_error) {
            failed.extend(messages.into_iter().map(|i| (i, e.clone())));
        }
    }
    failed.sort_by_key(|(i, _)| *i);
    failed
}

/// How many rows `apply_latest` writes at once.
const WRITES_IN_FLIGHT: usize = 16;

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
        let failed = apply_each(&messages, "a number", |n: u32| {
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

    #[tokio::test]
    async fn only_the_highest_ranked_change_of_each_row_is_applied() {
        let messages = [
            output("\"a:1\""),
            output("\"b:5\""),
            output("\"a:3\""),
            output("\"a:2\""),
            output("\"c:1\""),
        ];
        let mut applied = Vec::new();
        let failed = apply_latest(
            &messages,
            "a change",
            |b: &String| row_and_rank(b),
            |body: String| {
                applied.push(body);
                async { Ok(()) }
            },
        )
        .await;
        assert!(failed.is_empty());
        applied.sort();
        assert_eq!(applied, ["a:3", "b:5", "c:1"]);
    }

    #[tokio::test]
    async fn a_failed_write_fails_every_message_of_its_row_and_an_unreadable_body_fails_alone() {
        let messages = [
            output("\"a:1\""),
            output("\"b:1\""),
            output("not json"),
            output("\"a:2\""),
        ];
        let failed = apply_latest(
            &messages,
            "a change",
            |b: &String| row_and_rank(b),
            |body: String| async move {
                match body.as_str() {
                    "a:2" => Err(StoreError::Throttled("slow down".into())),
                    _ => Ok(()),
                }
            },
        )
        .await;
        let failures: Vec<(usize, bool)> =
            failed.iter().map(|(i, e)| (*i, e.is_retryable())).collect();
        assert_eq!(failures, [(0, true), (2, false), (3, true)]);
        assert!(failed[1].1.to_string().contains("not a change"));
    }
}
