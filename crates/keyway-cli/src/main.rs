//! The `keyway` command. `main` only parses arguments and hands over to the subcommands.

mod bench;
mod demo;
mod error;
mod ids;
mod package;
mod signatures;
mod stack;
mod workload;

use clap::{Parser, Subcommand};

/// Thousands of small allocations per batch (strings, JSON values): mimalloc serves them faster
/// than the system allocator, in the functions and here alike.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    Demo {
        /// Clicks to send through the stack.
        #[arg(long, default_value_t = 50_000)]
        events: usize,
        /// Probability of each injected fault.
        #[arg(long, default_value_t = 0.01)]
        faults: f64,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
    /// The operators' state signatures: print them, check them against the lock file, or update it.
    Signatures {
        /// Exit non-zero, naming what changed, when the lock file differs.
        #[arg(long, conflicts_with = "update")]
        check: bool,
        /// Rewrite the lock file.
        #[arg(long)]
        update: bool,
        #[arg(long, default_value = keyway::operator::lock::LOCK_FILE)]
        lock: std::path::PathBuf,
    },
    /// The output ids keyway derives: JSON lines `{"operator", "sink", "origin", "sequence",
    /// "index"}` on standard input, one id a line on standard output.
    Ids,
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// The batch executor against a naive GetItem + PutItem per event design, in one run.
    Runtime {
        /// Batches of 500 events.
        #[arg(long, default_value_t = 40)]
        batches: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Events per second through the embedded runtime, with a no-op function and with the keyed
    /// counter, in one run.
    Local {
        #[arg(long, default_value_t = 50_000)]
        events: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A function's Lambda zip, built with the release profile and with the lambda-release
    /// profile in one run (minutes: two optimised builds).
    Package {
        /// The function crate.
        #[arg(long, default_value = "keyed-counter")]
        function: String,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KEYWAY_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo {
            events,
            faults,
            seed,
        } => demo::run(demo::DemoOptions {
            events,
            faults,
            seed,
        }),
        Command::Signatures {
            check,
            update,
            lock,
        } => {
            let mode = match (check, update) {
                (true, _) => signatures::Mode::Check,
                (_, true) => signatures::Mode::Update,
                _ => signatures::Mode::Print,
            };
            signatures::run(mode, &lock)
        }
        Command::Ids => ids::run(),
        Command::Bench { which } => match which {
            BenchCommand::Runtime {
                batches,
                seed,
                json,
            } => bench::runtime(batches, seed, json),
            BenchCommand::Local { events, seed, json } => bench::local(events, seed, json),
            BenchCommand::Package { function, json } => package::run(&function, json),
        },
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("keyway: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}
