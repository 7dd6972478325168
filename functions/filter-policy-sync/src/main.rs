//! Lambda bootstrap of filter-policy-sync: the AWS platform and the process environment, clients
//! built once, then the handler for every invocation.

use std::sync::Arc;

use keyway::lambda::{AwsClients, Env};
use lambda_runtime::Error;

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
    let handler = filter_policy_sync::handler(&AwsClients::from_env().await, &env)?;
    keyway::lambda::serve(Arc::new(handler)).await
}
