//! The `keyway` command. `main` only parses arguments and hands over to the commands, one
//! module each (`bench` and `demo` hold several files); what their jobs share is in `job`.

// Functions of one step each: clippy.toml sets the threshold (tests, which read as scenarios,
// are left out).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

mod aggregate;
mod allocator;
mod bench;
mod bootstrap;
mod cdc;
mod chaos;
mod demo;
mod enrich;
mod error;
mod filter;
mod generate;
mod ids;
mod job;
mod local;
mod signatures;
mod skew;
mod subscriptions;
mod times;
mod workload;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "keyway",
    version,
    about = "Keyed stream processing on AWS Lambda, Kinesis, DynamoDB and SQS"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the stack of template.yaml on the embedded runtime and prints what it did.
    Demo(demo::Args),
    /// Traces CloudTrail records to their original actors: the identity enricher of
    /// template.yaml on the embedded runtime. Enriched records go to standard output as JSON
    /// Lines, each input record exactly once; a summary goes to standard error.
    Enrich(enrich::Args),
    /// Replays subscription changes and events, in time order, through the dynamic filter of
    /// template.yaml on the embedded runtime. Each delivery goes to standard output as a JSON line
    /// {"consumer", "queue", "event"}; a summary goes to standard error. A change is in effect
    /// for every event at or after its time.
    Filter(filter::Args),
    /// Debezium change events through the CDC join's re-key and join on the embedded runtime:
    /// the joined changelog as JSON Lines on standard output ({"op", "<left table>", "<right
    /// table>"}), a summary on standard error.
    Cdc(cdc::Args),
    /// Runs a SAM or CDK-synthesized template on the embedded runtime: its streams, tables,
    /// queues and mappings in memory, keyway's functions in-process and any other as its
    /// bootstrap behind a local Lambda Runtime API; puts the given files' lines and runs until
    /// every mapping is idle.
    Local(local::Args),
    /// Serves one of keyway's functions (by its logical id in template.yaml) to the Lambda
    /// Runtime API at AWS_LAMBDA_RUNTIME_API, as its bootstrap binary does.
    Bootstrap(bootstrap::Args),
    /// Simulates the load a keyed workload puts on Kinesis shards and DynamoDB partitions,
    /// without skew mitigation and with a strategy (pre-aggregation, salting, sidetracking,
    /// adaptive salting): per-shard records/s, CoV, max/mean, hot keys and what AWS's limits
    /// would throttle.
    Skew(skew::Args),
    /// Counts, sums, minimums, maximums and means per key of JSON Lines files, through keyed
    /// aggregation on the embedded runtime.
    Aggregate(aggregate::Args),
    /// A consumer's subscriptions in a deployed stack's policy table (the AWS SDK's own
    /// configuration: AWS_REGION, AWS_PROFILE, AWS_ENDPOINT_URL ...).
    Subscriptions(subscriptions::Args),
    /// The operators' state signatures: print them, check them against the lock file, or update it.
    Signatures(signatures::Args),
    /// The output ids keyway derives: JSON lines `{"operator", "sink", "origin", "sequence",
    /// "index"}` on standard input, one id a line on standard output.
    Ids,
    /// Generated input for the other commands, on standard output.
    Generate {
        #[command(subcommand)]
        what: generate::What,
    },
    /// Runs applications of the stack under every injected fault, each against a run without
    /// faults and an oracle of its own, and prints what was lost, applied twice or extra; fails
    /// unless every run is clean. The same seed replays the same run, fault for fault.
    Chaos(chaos::Args),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
}

/// Log lines (warnings, unless `KEYWAY_LOG` says otherwise) go to standard error, or to `file`.
fn init_logging(file: Option<&std::path::Path>) -> Result<(), error::CliError> {
    let logs = tracing_subscriber::fmt().with_env_filter(
        tracing_subscriber::EnvFilter::try_from_env("KEYWAY_LOG").unwrap_or_else(|_| "warn".into()),
    );
    match file {
        Some(path) => {
            let file = std::fs::File::create(path).map_err(error::CliError::file(path))?;
            logs.with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .init();
        }
        None => logs.with_writer(std::io::stderr).init(),
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let log_file = match &cli.command {
        Command::Demo(args) => Some(args.log_file()),
        _ => None,
    };
    if let Err(err) = init_logging(log_file.as_deref()) {
        eprintln!("keyway: {err}");
        return std::process::ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Enrich(args) => enrich::run(args),
        Command::Filter(args) => filter::run(args),
        Command::Cdc(args) => cdc::run(args),
        Command::Local(args) => local::run(args),
        Command::Bootstrap(args) => bootstrap::run(args),
        Command::Skew(args) => skew::run(args),
        Command::Aggregate(args) => aggregate::run(args),
        Command::Subscriptions(args) => subscriptions::run(args),
        Command::Signatures(args) => signatures::run(args),
        Command::Ids => ids::run(),
        Command::Generate { what } => generate::run(what),
        Command::Chaos(args) => chaos::run(args),
        Command::Bench { which } => bench::run(which),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("keyway: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}
