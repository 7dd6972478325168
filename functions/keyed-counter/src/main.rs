//! Lambda bootstrap of the keyed counter: the AWS platform and the process environment, clients
//! built once, then the handler for every invocation.

use std::sync::Arc;

use keyway::lambda::AwsClients;
use keyway::lambda::{Env, Handler, Invocation};
use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::value::RawValue;

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
    let env: Env = std::env::vars().collect();
    let handler = Arc::new(keyed_counter::handler(&AwsClients::from_env().await, &env)?);
    // The payload stays text until the handler parses it, once.
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Box<RawValue>>| {
        let handler = handler.clone();
        async move {
            let invocation = Invocation {
                request_id: event.context.request_id.clone(),
                deadline_millis: i64::try_from(event.context.deadline).ok(),
            };
            handler
                .handle(event.payload.get(), &invocation)
                .await
                .map_err(Error::from)
        }
    }))
    .await
}
