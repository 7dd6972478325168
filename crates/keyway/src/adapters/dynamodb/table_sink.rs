//! What every sink that writes a table does with a batch of outputs: read each body as the change
//! it carries and apply it, one after another, each failure reported with whether a retry can
//! help. The filter state and the CDC view are such sinks.

use std::future::Future;

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
            Ok(change) => apply(change).await.map_err(|e| match e {
                StoreError::Invalid(why) => SinkError::Rejected(why),
                StoreError::Throttled(why) => SinkError::Throttled(why),
                other => SinkError::Unavailable(other.to_string()),
            }),
        };
        if let Err(e) = outcome {
            failed.push((i, e));
        }
    }
    failed
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
}
