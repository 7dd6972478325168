//! `keyway bootstrap ID`: one of keyway's functions as its own process behind the Lambda Runtime
//! API, as its bootstrap binary runs on Lambda; `keyway local --function` runs it so.

use std::sync::Arc;

use keyway_stack as stack;

use crate::error::CliError;

/// `keyway bootstrap`'s arguments.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The function's logical id, e.g. KeyedCounter.
    pub function: String,
}

/// `keyway bootstrap ID`: keyway's function `id` served to the Lambda Runtime API at
/// `AWS_LAMBDA_RUNTIME_API`, built from this process's environment and the AWS SDK's.
pub(crate) fn run(args: Args) -> Result<(), CliError> {
    let id = &args.function;
    let factory = stack::functions().remove(id).ok_or_else(|| {
        format!(
            "{id}: not one of keyway's functions ({})",
            stack::functions()
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let env: keyway::lambda::Env = std::env::vars().collect();
        let platform = keyway::lambda::AwsClients::from_env().await;
        let handler = factory(&platform, &env)?;
        keyway::lambda::serve(Arc::clone(&handler))
            .await
            .map_err(|e| CliError::from(e.to_string()))
    })
}
