//! Lambda bootstrap of the identity enricher: its handler built once from the AWS platform
//! and the process environment, then served for every invocation.

use lambda_runtime::Error;

// One invocation at a time, each batch one task: a scheduler thread per core would only idle.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    keyway::lambda::run(identity_enricher::handler).await
}
