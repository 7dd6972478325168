//! Lambda bootstrap of the keyed counter: configuration from the environment, clients built once.
//!
//! Environment: `STATE_TABLE` (the keyway state table), `COUNTS_SINK` and `DEAD_LETTER_SINK`
//! (`kinesis:<stream>` or `sqs:<queue URL>`).

use std::sync::Arc;

use keyed_counter::{KeyedCounter, COUNTS};
use keyway::adapters::aws::{required_env, AwsClients};
use keyway::ports::SystemClock;
use keyway::{Executor, Sinks};
use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::Value;

/// Batches make thousands of small allocations; mimalloc serves them faster than the system's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .json()
        .with_target(false)
        .without_time()
        .init();
    let aws = AwsClients::from_env().await;
    let clock = Arc::new(SystemClock);
    let sinks = Sinks::new(aws.sink(&required_env("DEAD_LETTER_SINK")?)?)
        .with(COUNTS, aws.sink(&required_env("COUNTS_SINK")?)?);
    let store = aws.state_store(&required_env("STATE_TABLE")?, clock.clone());
    let executor = Arc::new(Executor::new(KeyedCounter, store, sinks, clock));
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| {
        let executor = executor.clone();
        async move {
            keyway::sources::run_kinesis(&executor, event.payload)
                .await
                .map_err(Error::from)
        }
    }))
    .await
}
