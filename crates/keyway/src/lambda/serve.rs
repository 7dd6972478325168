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
        tracing::warn!(%problem, "RUST_LOG not taken: logging at the logging config's level");
    }
    let handler = build(&AwsClients::from_env().await, &env)?;
    serve(Arc::new(handler)).await
}

/// The level of the function's logging config (`AWS_LAMBDA_LOG_LEVEL`, which Lambda sets from
/// LoggingConfig.ApplicationLogLevel), else INFO.
fn config_level(env: &Env) -> Level {
    match env
        .get("AWS_LAMBDA_LOG_LEVEL")
        .map(|l| l.to_ascii_uppercase())
        .as_deref()
    {
        Some("TRACE") => Level::TRACE,
        Some("DEBUG") => Level::DEBUG,
        Some("WARN") => Level::WARN,
        Some("ERROR" | "FATAL") => Level::ERROR,
        _ => Level::INFO,
    }
}

/// Why a function did not take its `RUST_LOG`.
#[derive(Debug, thiserror::Error)]
pub(super) enum LogFilterError {
    #[error("`{0}`: span and field filters are not taken, only levels and targets")]
    SpanOrField(String),
    #[error("`{directive}` is neither a level, a target nor target=level: {source}")]
    Unreadable {
        directive: String,
        source: ParseError,
    },
}

/// The log filter: `RUST_LOG` when set, else the level of the function's logging config; and why
/// `RUST_LOG` was not taken when it was not (the filter is then the logging config's level). It
/// takes levels and targets (`info, keyway=debug`), as `RUST_LOG` does, with no span or field
/// filters: the regular expressions these need would weigh in every function's package, and
/// taken as a target name such a filter would match nothing and silence the function.
pub(super) fn log_filter(env: &Env) -> (Targets, Option<LogFilterError>) {
    let fallback = || Targets::new().with_default(config_level(env));
    match env.get("RUST_LOG").map(|value| targets(value)) {
        Some(Ok(Some(filter))) => (filter, None),
        Some(Err(problem)) => (fallback(), Some(problem)),
        Some(Ok(None)) | None => (fallback(), None),
    }
}

/// `value`'s directives, each trimmed, empty ones left out; `None` when none is left.
fn targets(value: &str) -> Result<Option<Targets>, LogFilterError> {
    let directives: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    for directive in &directives {
        if directive.contains(|c: char| c == '[' || c == '{' || c.is_whitespace()) {
            return Err(LogFilterError::SpanOrField(directive.to_string()));
        }
        if let Err(source) = directive.parse::<Targets>() {
            let directive = directive.to_string();
            return Err(LogFilterError::Unreadable { directive, source });
        }
    }
    if directives.is_empty() {
        return Ok(None);
    }
    let filter = directives.join(",").parse::<Targets>();
    filter
        .map(Some)
        .map_err(|source| LogFilterError::Unreadable {
            directive: value.to_string(),
            source,
        })
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
        assert_eq!(config_level(&env_of(&[])), Level::INFO);
        let level = |l| config_level(&env_of(&[("AWS_LAMBDA_LOG_LEVEL", l)]));
        assert_eq!(level("DEBUG"), Level::DEBUG);
        assert_eq!(level("FATAL"), Level::ERROR);
        assert_eq!(level("LOUD"), Level::INFO);
        let (filter, problem) = log_filter(&env_of(&[
            ("AWS_LAMBDA_LOG_LEVEL", "WARN"),
            ("RUST_LOG", "keyway=trace"),
        ]));
        assert!(problem.is_none());
        assert!(filter.would_enable("keyway::executor", &Level::TRACE));
        assert!(!filter.would_enable("hyper", &Level::ERROR));
    }

    #[test]
    fn a_rust_log_that_cannot_be_read_is_named_and_the_function_logs_at_its_config_level() {
        let (filter, problem) = log_filter(&env_of(&[("RUST_LOG", "info,keyway=debug")]));
        assert!(problem.is_none());
        assert!(filter.would_enable("keyway::executor", &Level::DEBUG));
        assert!(!filter.would_enable("hyper", &Level::DEBUG));
        assert!(filter.would_enable("hyper", &Level::INFO));

        // Spaces after commas and a trailing comma are how people write lists.
        let (filter, problem) = log_filter(&env_of(&[("RUST_LOG", " info, keyway=debug,")]));
        assert!(problem.is_none(), "{problem:?}");
        assert!(filter.would_enable("keyway::executor", &Level::DEBUG));
        assert!(filter.would_enable("hyper", &Level::INFO));
        assert!(!filter.would_enable("hyper", &Level::DEBUG));

        let with_config = |rust_log| {
            log_filter(&env_of(&[
                ("RUST_LOG", rust_log),
                ("AWS_LAMBDA_LOG_LEVEL", "WARN"),
            ]))
        };
        for unreadable in [
            "keyway=loud",
            "keyway[invocation]=debug",
            "keyway[{request_id}]=debug",
            "keyway =debug",
        ] {
            let (filter, problem) = with_config(unreadable);
            let problem = problem.unwrap_or_else(|| panic!("{unreadable} taken"));
            assert!(problem
                .to_string()
                .contains(unreadable.split('=').next().unwrap()));
            assert!(
                filter.would_enable("keyway::executor", &Level::WARN),
                "{unreadable}"
            );
            assert!(
                !filter.would_enable("keyway::executor", &Level::INFO),
                "{unreadable}"
            );
        }

        let (filter, problem) = with_config(" , ");
        assert!(problem.is_none());
        assert!(filter.would_enable("keyway::executor", &Level::WARN));
        assert!(!filter.would_enable("keyway::executor", &Level::INFO));
    }
}
