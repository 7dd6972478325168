//! What a function's `main` is: JSON logs at the level the environment asks for, the handler
//! built once from the AWS platform and the process environment, then the Lambda runtime loop,
//! where each invocation's event, kept as text until the handler parses it once, goes to the
//! handler with its request id and deadline, inside a span naming both the request and the
//! function, so that every line the invocation logs says which it belongs to.

use std::sync::Arc;

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::value::RawValue;
use tracing::{Instrument as _, Level};
use tracing_subscriber::filter::{ParseError, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

use super::handler::{Handler, Invocation};
use super::{AwsClients, Env, Platform, SetupError};
use crate::ports::{Clock as _, SystemClock};

/// Runs the function whose handler `build` makes, until the execution environment ends.
pub async fn run<H, F>(build: F) -> Result<(), Error>
where
    H: Handler + 'static,
    F: FnOnce(&dyn Platform, &Env) -> Result<H, SetupError>,
{
    let env: Env = std::env::vars().collect();
    let (filter, unread) = log_filter(&env);
    let lines = tracing_subscriber::fmt::layer()
        .json()
        .with_target(false)
        .without_time();
    tracing_subscriber::registry()
        .with(lines.with_filter(filter))
        .init();
    if let Some(problem) = unread {
        tracing::warn!(%problem, "RUST_LOG could not be read: logging at INFO");
    }
    let handler = build(&AwsClients::from_env().await, &env)?;
    serve(Arc::new(handler)).await
}

/// The log filter: `RUST_LOG` when set, else the level of the function's logging config
/// (`AWS_LAMBDA_LOG_LEVEL`, which Lambda sets from LoggingConfig.ApplicationLogLevel), else INFO.
pub fn log_level(env: &Env) -> String {
    if let Some(filter) = env.get("RUST_LOG").filter(|f| !f.trim().is_empty()) {
        return filter.clone();
    }
    match env
        .get("AWS_LAMBDA_LOG_LEVEL")
        .map(|l| l.to_ascii_uppercase())
    {
        Some(level) if level == "FATAL" => "error".into(),
        Some(level) if ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level.as_str()) => {
            level.to_ascii_lowercase()
        }
        _ => "info".into(),
    }
}

/// The filter of `log_level`, and the problem with `RUST_LOG` when it could not be read (the
/// filter is then INFO). It takes levels and targets (`info,keyway=debug`), as `RUST_LOG` does,
/// with no span or field filters: the regular expressions these need would weigh in every
/// function's package.
pub fn log_filter(env: &Env) -> (Targets, Option<ParseError>) {
    match log_level(env).parse::<Targets>() {
        Ok(filter) => (filter, None),
        Err(problem) => (Targets::new().with_default(Level::INFO), Some(problem)),
    }
}

/// Serves `handler` to the Lambda runtime API until the execution environment ends.
pub async fn serve(handler: Arc<dyn Handler>) -> Result<(), Error> {
    let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_default();
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Box<RawValue>>| {
        let handler = handler.clone();
        let span = tracing::info_span!(
            "invocation",
            request_id = %event.context.request_id,
            function = %function
        );
        async move {
            let invocation = Invocation {
                request_id: event.context.request_id.clone(),
                deadline_millis: deadline_of(event.context.deadline, SystemClock.now_millis()),
            };
            handler
                .handle(event.payload.get(), &invocation)
                .await
                .map_err(Error::from)
        }
        .instrument(span)
    }))
    .await
}

/// The invocation's deadline in epoch milliseconds, as Lambda's runtime API gives it; none when
/// it has passed before the invocation started, which Lambda never does (`cargo lambda watch`
/// sends its timeout, 600000, in the header instead). Without one the batch runs to its end; the
/// function's timeout still stops it.
fn deadline_of(header_millis: u64, now_millis: i64) -> Option<i64> {
    i64::try_from(header_millis)
        .ok()
        .filter(|deadline| *deadline > now_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_already_past_when_the_invocation_starts_is_no_deadline() {
        let now = 1_796_325_899_394;
        assert_eq!(deadline_of(1_796_325_929_394, now), Some(1_796_325_929_394));
        // What cargo lambda's runtime emulator sends.
        assert_eq!(deadline_of(600_000, now), None);
        assert_eq!(deadline_of(u64::MAX, now), None);
    }
    use crate::lambda::env_of;

    #[test]
    fn the_log_level_is_rust_logs_else_the_functions_logging_config_else_info() {
        assert_eq!(log_level(&env_of(&[])), "info");
        assert_eq!(
            log_level(&env_of(&[("AWS_LAMBDA_LOG_LEVEL", "DEBUG")])),
            "debug"
        );
        assert_eq!(
            log_level(&env_of(&[("AWS_LAMBDA_LOG_LEVEL", "FATAL")])),
            "error"
        );
        assert_eq!(
            log_level(&env_of(&[("AWS_LAMBDA_LOG_LEVEL", "LOUD")])),
            "info"
        );
        let both = env_of(&[
            ("AWS_LAMBDA_LOG_LEVEL", "WARN"),
            ("RUST_LOG", "keyway=trace"),
        ]);
        assert_eq!(log_level(&both), "keyway=trace");
    }

    #[test]
    fn a_rust_log_that_cannot_be_read_is_named_and_the_function_logs_at_info() {
        let (filter, problem) = log_filter(&env_of(&[("RUST_LOG", "info,keyway=debug")]));
        assert!(problem.is_none());
        assert!(filter.would_enable("keyway::executor", &Level::DEBUG));
        assert!(!filter.would_enable("hyper", &Level::DEBUG));
        assert!(filter.would_enable("hyper", &Level::INFO));

        let (filter, problem) = log_filter(&env_of(&[("RUST_LOG", "keyway=loud")]));
        assert!(problem.is_some(), "an unknown level is a problem");
        assert!(filter.would_enable("keyway::executor", &Level::INFO));
        assert!(!filter.would_enable("keyway::executor", &Level::DEBUG));
    }
}
