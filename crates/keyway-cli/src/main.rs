//! The `keyway` command. `main` only parses arguments and hands over to the subcommands.

mod bench;
mod demo;
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
    /// Runs the keyed counter over the embedded runtime and prints what it did.
    Demo {
        /// Batches of 500 events to run.
        #[arg(long, default_value_t = 20)]
        batches: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
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
        Command::Demo { batches, seed } => demo::run(batches, seed),
        Command::Bench {
            which:
                BenchCommand::Runtime {
                    batches,
                    seed,
                    json,
                },
        } => bench::runtime(batches, seed, json),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("keyway: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}
