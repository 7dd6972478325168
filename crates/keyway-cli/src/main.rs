//! The `keyway` command. `main` only parses arguments and hands over to the subcommands.

mod aggregate;
mod bench;
mod bench_cdc;
mod bench_cost;
mod bench_filter;
mod bench_identity;
mod cdc;
mod chaos;
mod demo;
mod demo_cdc;
mod demo_filter;
mod demo_identity;
mod demo_skew;
mod enrich;
mod error;
mod filter;
mod generate;
mod ids;
mod local;
mod package;
mod signatures;
mod skew;
mod subscriptions;
mod trail;
mod workload;

use clap::{Parser, Subcommand};

/// Thousands of small allocations per batch (strings, JSON values): mimalloc serves them faster
/// than the system allocator to the embedded runtime's millions of records. (A function on Lambda
/// keeps the system's: its batches wait on the network, and mimalloc would weigh in its zip.)
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// mimalloc's options (mimalloc.h), from the library linked in as the allocator.
extern "C" {
    #[cfg(test)]
    fn mi_option_get(option: libc::c_int) -> libc::c_long;
    fn mi_option_set(option: libc::c_int, value: libc::c_long);
}

/// `mi_option_purge_delay` in mimalloc.h's `mi_option_t` (a test checks it against the default
/// mimalloc 3's options.c gives it, 1,000 ms).
const MI_OPTION_PURGE_DELAY: libc::c_int = 15;

/// Keeps freed memory from going back to the operating system for the rest of the run. A job
/// that streams a million records frees and takes back megabytes every batch: returned after
/// mimalloc's second, each came back as fresh pages the kernel had to clear (a fifth of `keyway
/// aggregate`'s time in a profile, 3.1 s against 2.6 s a run). The memory held is the run's
/// largest at once.
pub fn keep_freed_memory() {
    // SAFETY: mi_option_set takes any option number and value (it checks the number). It writes
    // the option without a lock: a run calls this before it starts its threads.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

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
        /// CloudTrail records through the identity enricher (0 leaves the section out).
        #[arg(long, default_value_t = 20_000)]
        identity_records: usize,
        /// Events through the dynamic filter (0 leaves the section out).
        #[arg(long, default_value_t = 20_000)]
        filter_events: usize,
        /// Changes through the CDC join (0 leaves the section out).
        #[arg(long, default_value_t = 20_000)]
        cdc_changes: usize,
        /// Events a second through the keyed aggregation while a key turns hot, for 70 seconds
        /// (0 leaves the section out).
        #[arg(long, default_value_t = 1_000)]
        skew_rate: u32,
        /// Where the functions' log lines go, so that none comes between the lines of the
        /// summary (keyway-demo.log in the system's temporary directory if left out).
        #[arg(long)]
        log: Option<std::path::PathBuf>,
    },
    /// Traces CloudTrail records to their original actors: the identity enricher of
    /// template.yaml on the embedded runtime. Enriched records go to standard output as JSON
    /// Lines, each input record exactly once; a summary goes to standard error.
    Enrich {
        /// A JSON object of account id to customer id (each account is its own customer if
        /// left out).
        #[arg(long)]
        customer_map: Option<std::path::PathBuf>,
        /// Shards of the events stream and of the feedback stream.
        #[arg(long, default_value_t = 4)]
        shards: usize,
        /// Randomises the arrival order (within windows of 10,000 records) with this seed.
        #[arg(long)]
        shuffle: Option<u64>,
        /// Seconds a record waits for its caller's identity before it goes out unresolved.
        #[arg(long, default_value_t = 900)]
        buffer_ttl: u64,
        /// The most roles a role chain is followed through: the records of a key issued deeper
        /// go out unresolved, saying the limit was reached.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100))]
        max_chain_depth: u64,
        /// Seconds a record may come after its time (the trail's disorder): the enricher keeps
        /// an identity that long past its credentials' expiration, and an unused key that long.
        #[arg(long, default_value_t = 3600)]
        lateness: u64,
        /// CloudTrail log files (gzipped or not), JSON Lines of records, single records, or
        /// directories of them.
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
    },
    /// Replays subscription changes and events, in time order, through the dynamic filter of
    /// template.yaml on the embedded runtime. Each delivery goes to standard output as a JSON line
    /// {"consumer", "queue", "event"}; a summary goes to standard error. A change is in effect
    /// for every event at or after its time.
    Filter {
        /// JSON Lines of changes: {"at": MS, "op": "subscribe", "consumer", "key", "queue",
        /// "pattern"?}, {"at", "op": "unsubscribe", "consumer", "key"}, {"at", "op":
        /// "subscribe_all", "consumer", "queue", "pattern"?}, {"at", "op": "unsubscribe_all",
        /// "consumer"}.
        #[arg(long)]
        subscriptions: std::path::PathBuf,
        /// JSON Lines {"at": MS, "event": {...}}.
        #[arg(long)]
        events: std::path::PathBuf,
        /// A JSON object of consumer id to the queue names it owns; without it any queue is
        /// accepted.
        #[arg(long)]
        queues: Option<std::path::PathBuf>,
        /// Where an event holds its filter key (a JSON pointer).
        #[arg(long, default_value = "/key")]
        key: String,
        /// Shards of the events stream.
        #[arg(long, default_value_t = 4)]
        shards: usize,
        /// Subscriptions go to the stack's shared policy table, not to a table of each consumer's
        /// own (consumer.yaml, deployed when the consumer first subscribes).
        #[arg(long)]
        shared_table: bool,
    },
    /// Debezium change events through the CDC join's re-key and join on the embedded runtime:
    /// the joined changelog as JSON Lines on standard output ({"op", "<left table>", "<right
    /// table>"}), a summary on standard error.
    Cdc(cdc::CdcOptions),
    /// Runs a SAM or CDK-synthesized template on the embedded runtime: its streams, tables,
    /// queues and mappings in memory, keyway's functions in-process and any other as its
    /// bootstrap behind a local Lambda Runtime API; puts the given files' lines and runs until
    /// every mapping is idle.
    Local(local::LocalOptions),
    /// Serves one of keyway's functions (by its logical id in template.yaml) to the Lambda
    /// Runtime API at AWS_LAMBDA_RUNTIME_API, as its bootstrap binary does.
    Bootstrap {
        /// The function's logical id, e.g. KeyedCounter.
        function: String,
    },
    /// Simulates the load a keyed workload puts on Kinesis shards and DynamoDB partitions,
    /// without skew mitigation and with a strategy (pre-aggregation, salting, sidetracking,
    /// adaptive salting): per-shard records/s, CoV, max/mean, hot keys and what AWS's limits
    /// would throttle.
    Skew(skew::SkewOptions),
    /// Counts, sums, minimums, maximums and means per key of JSON Lines files, through keyed
    /// aggregation on the embedded runtime.
    Aggregate(aggregate::AggregateOptions),
    /// A consumer's subscriptions in a deployed stack's policy table (the AWS SDK's own
    /// configuration: AWS_REGION, AWS_PROFILE, AWS_ENDPOINT_URL ...).
    Subscriptions {
        /// The policy table (the stack's PolicyTableName output, or a consumer's own table).
        #[arg(long)]
        table: String,
        #[arg(long)]
        consumer: String,
        /// The stack's ConsumerQueuePrefix: a queue not named as the consumer's (this prefix,
        /// its id, '_' and a name) is refused here, before anything is written.
        #[arg(long, default_value = dynamic_filter::subscription::DEFAULT_QUEUE_PREFIX)]
        queue_prefix: String,
        /// The stack's ConsumerQueues as a file: a queue not registered to the consumer is then
        /// refused here too.
        #[arg(long)]
        queues: Option<std::path::PathBuf>,
        #[command(subcommand)]
        action: SubscriptionCommand,
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
    /// Generated input for the other commands, on standard output.
    Generate {
        #[command(subcommand)]
        what: GenerateCommand,
    },
    /// Runs applications of the stack under every injected fault, each against a run without
    /// faults and an oracle of its own, and prints what was lost, applied twice or extra; fails
    /// unless every run is clean. The same seed replays the same input and the same faults.
    Chaos(chaos::ChaosArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

#[derive(Subcommand)]
enum SubscriptionCommand {
    /// Delivers the events of a filter key that match the pattern (all, without one) to a queue.
    Subscribe {
        #[arg(long)]
        key: String,
        #[arg(long)]
        queue: String,
        /// An SNS filter policy, as JSON.
        #[arg(long)]
        pattern: Option<String>,
    },
    Unsubscribe {
        #[arg(long)]
        key: String,
    },
    /// Delivers every event that matches the pattern to a queue.
    ListenToAll {
        #[arg(long)]
        queue: String,
        #[arg(long)]
        pattern: Option<String>,
    },
    StopListeningToAll,
    /// The consumer's subscriptions, one JSON line each.
    List,
}

impl From<SubscriptionCommand> for subscriptions::Action {
    fn from(command: SubscriptionCommand) -> Self {
        use subscriptions::Action;
        match command {
            SubscriptionCommand::Subscribe {
                key,
                queue,
                pattern,
            } => Action::Subscribe {
                key,
                queue,
                pattern,
            },
            SubscriptionCommand::Unsubscribe { key } => Action::Unsubscribe { key },
            SubscriptionCommand::ListenToAll { queue, pattern } => {
                Action::ListenToAll { queue, pattern }
            }
            SubscriptionCommand::StopListeningToAll => Action::StopListeningToAll,
            SubscriptionCommand::List => Action::List,
        }
    }
}

#[derive(Subcommand)]
enum GenerateCommand {
    /// CloudTrail records as JSON Lines, for `keyway enrich`: customers drawn from Zipf(1.2), role
    /// chains of up to six sessions across each customer's accounts, interleaved, some missing
    /// their first AssumeRole; records 10 ms apart.
    Trail {
        #[arg(long, default_value_t = 1_000_000)]
        records: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Writes the generated accounts' customer map here, for `keyway enrich --customer-map`.
        #[arg(long)]
        customer_map: Option<std::path::PathBuf>,
    },
    /// Debezium change events of `domains` (id, name, user_id) and `users` (id, name) as JSON
    /// Lines of records {"topic", "key", "value"}, for `keyway cdc --join
    /// domains.user_id=users.id`: inserts, updates (a share of them moving a domain to another
    /// user), primary-key changes, deletes with their tombstones, events sent twice, and
    /// `--truncates` truncates.
    Cdc {
        #[arg(long, default_value_t = 10_000)]
        changes: usize,
        /// Of the updates of a domain, the share that moves it to another user.
        #[arg(long, default_value_t = 0.1)]
        join_key_updates: f64,
        /// Truncates among the changes, evenly spread, of domains and users in turn.
        #[arg(long, default_value_t = 0)]
        truncates: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
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
    /// The identity enricher against partitioning by customer (skew on 8 shards) and against a
    /// naive lookup-and-write per record (DynamoDB capacity, CPU), and `keyway enrich` over a
    /// million records, in one run.
    Identity {
        /// Generated CloudTrail records for the skew and cost comparisons.
        #[arg(long, default_value_t = 100_000)]
        records: usize,
        /// Generated records for the `keyway enrich` throughput.
        #[arg(long, default_value_t = 1_000_000)]
        enrich_records: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The CDC join against a design that keeps the whole joined row set of a join key in one
    /// item (DynamoDB capacity units per 1,000 changes, changes per second per core), in one run.
    Cdc {
        #[arg(long, default_value_t = 20_000)]
        changes: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The dynamic filter against the per-event lookup design it replaces (DynamoDB capacity,
    /// CPU, SQS calls) and the monthly cost against the article's brute force, in one run.
    Filter {
        #[arg(long, default_value_t = 1_000_000)]
        events: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Salting against its targets: shard loads of 8 shards with 99% of the events on one key,
    /// unsalted and over 32 buckets; the adaptive strategy's time to salt a key turned hot; and
    /// the events through keyed aggregation, whose counts must equal the oracle's.
    Skew {
        #[arg(long, default_value_t = 100_000)]
        events: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Each function's Lambda zip, as `cargo lambda build --release` or `sam build` left it,
    /// its architecture, and its cold start on the embedded runtime where this machine runs it.
    Package(package::PackageOptions),
    /// Each application's cost in dollars per million events on AWS, from a metered run on the
    /// embedded runtime, beside Managed Service for Apache Flink at the KPUs the same rate needs;
    /// prices are inputs, AWS's us-east-1 list prices by default.
    Cost(bench_cost::CostArgs),
}

fn bench(which: BenchCommand) -> Result<(), error::CliError> {
    match which {
        BenchCommand::Runtime {
            batches,
            seed,
            json,
        } => bench::runtime(batches, seed, json),
        BenchCommand::Local { events, seed, json } => bench::local(events, seed, json),
        BenchCommand::Package(options) => package::run(options),
        BenchCommand::Cost(args) => bench_cost::run(args),
        BenchCommand::Skew { events, seed, json } => skew::bench::run(events, seed, json),
        BenchCommand::Filter { events, seed, json } => bench_filter::run(events, seed, json),
        BenchCommand::Cdc {
            changes,
            seed,
            json,
        } => bench_cdc::run(changes, seed, json),
        BenchCommand::Identity {
            records,
            enrich_records,
            seed,
            json,
        } => bench_identity::run(records, enrich_records, seed, json),
    }
}

/// Log lines (warnings, unless `KEYWAY_LOG` says otherwise) go to standard error, or to `file`.
fn init_logging(file: Option<&std::path::Path>) -> Result<(), error::CliError> {
    let logs = tracing_subscriber::fmt().with_env_filter(
        tracing_subscriber::EnvFilter::try_from_env("KEYWAY_LOG").unwrap_or_else(|_| "warn".into()),
    );
    match file {
        Some(path) => {
            let file = std::fs::File::create(path)
                .map_err(|e| format!("--log {}: {e}", path.display()))?;
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
        Command::Demo { log, .. } => Some(log.clone().unwrap_or_else(demo::default_log)),
        _ => None,
    };
    if let Err(err) = init_logging(log_file.as_deref()) {
        eprintln!("keyway: {err}");
        return std::process::ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Demo {
            events,
            faults,
            seed,
            identity_records,
            filter_events,
            cdc_changes,
            skew_rate,
            log: _,
        } => demo::run(demo::DemoOptions {
            events,
            faults,
            seed,
            identity_records,
            filter_events,
            cdc_changes,
            skew_rate,
            log: log_file.unwrap_or_else(demo::default_log),
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
        Command::Enrich {
            customer_map,
            shards,
            shuffle,
            buffer_ttl,
            max_chain_depth,
            lateness,
            paths,
        } => enrich::run(enrich::EnrichOptions {
            customer_map,
            shards,
            shuffle,
            buffer_ttl: std::time::Duration::from_secs(buffer_ttl),
            max_chain_depth: max_chain_depth as usize,
            lateness: std::time::Duration::from_secs(lateness),
            paths,
        }),
        Command::Filter {
            subscriptions,
            events,
            queues,
            key,
            shards,
            shared_table,
        } => filter::run(filter::FilterOptions {
            subscriptions,
            events,
            queues,
            key,
            shards,
            shared_table,
        }),
        Command::Cdc(options) => cdc::run(options),
        Command::Local(options) => local::run(options),
        Command::Bootstrap { function } => local::bootstrap(&function),
        Command::Skew(options) => skew::run(options),
        Command::Aggregate(options) => aggregate::run(options),
        Command::Subscriptions {
            table,
            consumer,
            queue_prefix,
            queues,
            action,
        } => subscriptions::run(subscriptions::SubscriptionsOptions {
            table,
            consumer,
            queue_prefix,
            queues,
            action: action.into(),
        }),
        Command::Ids => ids::run(),
        Command::Generate {
            what:
                GenerateCommand::Trail {
                    records,
                    seed,
                    customer_map,
                },
        } => generate::trail(
            &generate::TrailOptions {
                records,
                seed,
                customer_map,
            },
            &mut std::io::BufWriter::new(std::io::stdout().lock()),
        ),
        Command::Generate {
            what:
                GenerateCommand::Cdc {
                    changes,
                    join_key_updates,
                    truncates,
                    seed,
                },
        } => generate::cdc(
            &keyway_stack::cdc_changes::Workload {
                changes,
                join_key_updates,
                truncates,
                seed,
                ..Default::default()
            },
            &mut std::io::BufWriter::new(std::io::stdout().lock()),
        ),
        Command::Chaos(args) => chaos::run(args),
        Command::Bench { which } => bench(which),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("keyway: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod allocator_tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_the_one_mimalloc_documents() {
        // SAFETY: reading an option by its number.
        let delay = unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
        // Its default, unless the environment set it.
        let set = |name| std::env::var_os(name).is_some();
        if !set("MIMALLOC_PURGE_DELAY") && !set("MIMALLOC_RESET_DELAY") {
            assert_eq!(delay, 1000);
        }
        keep_freed_memory();
        assert_eq!(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }, -1);
    }
}
