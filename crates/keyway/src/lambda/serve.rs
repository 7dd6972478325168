//! What a function's `main` is: JSON logs, the handler built once from the AWS platform and the
//! process environment, then the Lambda runtime loop, where each invocation's event, kept as text
//! until the handler parses it once, goes to the handler with its request id and deadline.

use std::sync::Arc;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::value::RawValue;

use super::handler::{Handler, Invocation};
use super::{AwsClients, Env, Platform, SetupError};

/// Runs the function whose handler `build` makes, until the execution environment ends.
pub async fn run<H, F>(build: F) -> Result<(), Error>
where
    H: Handler + 'static,
    F: FnOnce(&dyn Platform, &Env) -> Result<H, SetupError>,
{
    tracing_subscriber::fmt()
        .json()
        .with_target(false)
        .without_time()
        .init();
    let env: Env = std::env::vars().collect();
    let handler = build(&AwsClients::from_env().await, &env)?;
    serve(Arc::new(handler)).await
}

/// Serves `handler` to the Lambda runtime API until the execution environment ends.
pub async fn serve(handler: Arc<dyn Handler>) -> Result<(), Error> {
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
