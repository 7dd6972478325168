//! `keyway demo`: the stack of template.yaml on the embedded runtime. Generated clicks go into the
//! stack's Kinesis stream — a few malformed, every fault of the runtime injected at a low rate —
//! and the functions run as Lambda would run them; then every stored count is checked against the
//! input, and what each function did is printed. Further sections run generated CloudTrail
//! traffic through the identity enricher (`identity`), events through the dynamic filter
//! (`filter`), changes through the CDC join (`cdc`), and a key turning hot through the keyed
//! aggregation and its hot-key registry (`skew`).

mod cdc;
mod filter;
mod identity;
mod skew;

use crate::error::CliError;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use keyed_counter::KeyedCounter;
use keyway::adapters::dynamodb::{DynamoStateStore, ItemKey};
use keyway::domain::DeadLetter;
use keyway::executor::SIGNATURE_HISTORY;
use keyway::lambda::Platform;
use keyway::ports::Namespace;
use keyway::KeyedOperator;
use keyway_local::{
    FaultPlan, LocalRuntime, LocalServices, LocalTable, MappingStats, QueuedMessage,
};

use crate::workload::zipf_keys;
use keyway_stack as stack;

const EPOCH: i64 = 1_767_225_600_000;

/// `keyway demo`'s arguments.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Clicks to send through the stack.
    #[arg(long, default_value_t = 50_000)]
    pub events: usize,
    /// Probability of each injected fault.
    #[arg(long, default_value_t = 0.01)]
    pub faults: f64,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// CloudTrail records through the identity enricher (0 leaves the section out).
    #[arg(long, default_value_t = 20_000)]
    pub identity_records: usize,
    /// Events through the dynamic filter (0 leaves the section out).
    #[arg(long, default_value_t = 20_000)]
    pub filter_events: usize,
    /// Changes through the CDC join (0 leaves the section out).
    #[arg(long, default_value_t = 20_000)]
    pub cdc_changes: usize,
    /// Events a second through the keyed aggregation while a key turns hot, for 70 seconds
    /// (0 leaves the section out).
    #[arg(long, default_value_t = 1_000)]
    pub skew_rate: u32,
    /// Where the functions' log lines go, so that none comes between the lines of the
    /// summary (keyway-demo.log in the system's temporary directory if left out).
    #[arg(long)]
    pub log: Option<PathBuf>,
}

impl Args {
    /// The file the functions' log lines go to, named at the end.
    pub(crate) fn log_file(&self) -> PathBuf {
        self.log.clone().unwrap_or_else(default_log)
    }
}

/// Where the demo's log lines go unless `--log` says.
fn default_log() -> PathBuf {
    std::env::temp_dir().join("keyway-demo.log")
}

pub(crate) fn run(options: Args) -> Result<(), CliError> {
    if options.events == 0 {
        return Err(CliError::option("--events", "must be at least 1"));
    }
    // Virtual time: batching windows and retries pass instantly, and the seed fixes the run.
    let runtime = crate::job::runtime_builder(true);
    let identity_records = options.identity_records;
    let (filter_events, faults, seed) = (options.filter_events, options.faults, options.seed);
    let (cdc_changes, skew_rate) = (options.cdc_changes, options.skew_rate);
    let log = options.log_file();
    let outcome = runtime.block_on(async {
        demo(options).await?;
        if identity_records > 0 {
            identity::run(identity_records, seed).await?;
        }
        if filter_events > 0 {
            filter::run(filter_events, faults, seed).await?;
        }
        if cdc_changes > 0 {
            cdc::run(cdc_changes, faults, seed).await?;
        }
        if skew_rate > 0 {
            skew::run(skew_rate, faults, seed).await?;
        }
        Ok::<(), CliError>(())
    });
    // Named whether the run passed or not: the lines may say why it did not.
    let lines = std::fs::read_to_string(&log)
        .map(|text| text.lines().count())
        .unwrap_or(0);
    println!("\nlog: {lines} lines, in {}", log.display());
    outcome
}

async fn demo(options: Args) -> Result<(), CliError> {
    let faults = FaultPlan::all(options.faults, options.seed);
    let services = LocalServices::new(EPOCH, faults);
    let mut runtime =
        LocalRuntime::from_template(stack::TEMPLATE, services.clone(), &stack::functions())?;
    services.set_latency(Some(Duration::from_millis(1)));
    // The producer meets each shard's write limit of 1,000 records a second, as on AWS.
    services.kinesis.set_write_limit(true);
    let stream = runtime
        .resource("ClicksStream")
        .ok_or("the template has no ClicksStream")?;

    println!("keyway demo: the stack of template.yaml on the embedded runtime");
    println!(
        "  {} clicks of users drawn from Zipf(1.1) over 1,000 users into {stream}; one in 10,000 is malformed",
        options.events
    );
    println!("  faults: throttling, partial failures, write conflicts, lost responses, crashes before commit, timeouts and duplicate deliveries, each at {}%, seed {}\n", options.faults * 100.0, options.seed);

    let (records, expected) = clicks(options.events, options.seed);
    produce(&mut runtime, &services, &stream, &records).await?;
    let virtual_time = Duration::from_millis(
        (keyway::ports::Clock::now_millis(services.clock.as_ref()) - EPOCH) as u64,
    );
    let table = runtime.resource("StateTable").ok_or("no StateTable")?;
    let namespace = Namespace::new(
        "keyed-counter",
        keyway::operator::state_signature(&KeyedCounter.states()),
    );
    let mismatches = mismatched_counts(&services, &table, &namespace, &expected).await?;
    let out = CounterOutputs::of(&runtime, &services);

    print_functions(&runtime, virtual_time);
    out.print();
    println!(
        "  StateTable          {}",
        state_items(&services, &table, &namespace, &expected)
    );
    out.verify(mismatches, records.len(), &expected)
}

/// Records as a producer puts them: partition key and data.
type Records = Vec<(String, Vec<u8>)>;

/// `events` clicks of users drawn from Zipf(1.1), one in 10,000 malformed, and each user's
/// count of valid clicks.
fn clicks(events: usize, seed: u64) -> (Records, BTreeMap<String, u64>) {
    let keys = zipf_keys(events, 1_000, 1.1, seed);
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    let records = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            if i % 10_000 == 9_999 {
                (key.clone(), b"{\"key\": 42}".to_vec())
            } else {
                *expected.entry(key.clone()).or_default() += 1;
                (key.clone(), format!(r#"{{"key":"{key}"}}"#).into_bytes())
            }
        })
        .collect();
    (records, expected)
}

/// Puts `records` on `stream` and runs the stack until it is idle, in slices, as a live stream
/// would be produced and processed.
async fn produce(
    runtime: &mut LocalRuntime,
    services: &LocalServices,
    stream: &str,
    records: &[(String, Vec<u8>)],
) -> Result<(), CliError> {
    let progress = ProgressBar::new(records.len() as u64);
    progress.set_style(
        ProgressStyle::with_template("  {bar:40} {pos}/{len} events {msg}")
            .map_err(|e| e.to_string())?,
    );
    for slice in records.chunks(5_000) {
        services
            .kinesis
            .put_in_order(stream, slice)
            .await
            .map_err(|e| e.to_string())?;
        runtime
            .run_until_idle(Duration::from_secs(24 * 3600))
            .await?;
        progress.inc(slice.len() as u64);
    }
    progress.finish_and_clear();
    runtime.run_until_idle(Duration::from_secs(3600)).await?;
    Ok(())
}

/// How many users' stored counts differ from their valid clicks.
async fn mismatched_counts(
    services: &LocalServices,
    table: &str,
    namespace: &Namespace,
    expected: &BTreeMap<String, u64>,
) -> Result<usize, CliError> {
    let store = services.state_store(table)?;
    let key_list: Vec<String> = expected.keys().cloned().collect();
    let stored = store
        .load(namespace, &key_list)
        .await
        .map_err(|e| e.to_string())?;
    Ok(expected
        .iter()
        .filter(|(key, want)| {
            stored[*key]
                .slots
                .get("count")
                .and_then(|s| s.entries.first())
                .and_then(|e| e.get().parse::<u64>().ok())
                != Some(**want)
        })
        .count())
}

/// What each mapping that ran did; the counter's section drives only its own stream, the stack's
/// other functions run in the sections after it.
fn print_functions(runtime: &LocalRuntime, virtual_time: Duration) {
    println!(
        "what each function did, in {:.0} s of virtual time",
        virtual_time.as_secs_f64()
    );
    let (ran, idle): (Vec<_>, Vec<_>) = runtime
        .mappings()
        .iter()
        .partition(|m| m.stats().invocations > 0);
    for mapping in ran {
        print_mapping(&mapping.name, mapping.stats());
    }
    if !idle.is_empty() {
        println!(
            "  (the stack's {} other stream and table sources had nothing to read in this section)",
            idle.len()
        );
    }
}

/// The counter section's queues.
struct CounterOutputs {
    counts: Vec<QueuedMessage>,
    dead: Vec<QueuedMessage>,
    failed: Vec<QueuedMessage>,
}

impl CounterOutputs {
    fn of(runtime: &LocalRuntime, services: &LocalServices) -> Self {
        let queue = |id: &str| {
            runtime
                .resource(id)
                .map(|url| services.sqs.messages(&url))
                .unwrap_or_default()
        };
        Self {
            counts: queue("CountsQueue"),
            dead: queue("DeadLetterQueue"),
            failed: queue("FailedBatchesQueue"),
        }
    }

    fn distinct(messages: &[QueuedMessage]) -> HashSet<&str> {
        messages
            .iter()
            .filter_map(|m| m.output_id.as_deref())
            .collect()
    }

    fn print(&self) {
        let (counts, dead) = (&self.counts, &self.dead);
        println!("\nwhat came out");
        println!("  CountsQueue         {:>8} messages, {} distinct output ids (a retry repeats an id, never a count)", counts.len(), Self::distinct(counts).len());
        println!(
            "  DeadLetterQueue     {:>8} messages, {} distinct ids (a batch retried after a fault sends its dead letters again, under the same ids)",
            dead.len(),
            Self::distinct(dead).len()
        );
        if let Some(first) = dead.first() {
            println!("                      first: {}", reason(&first.body));
        }
        println!(
            "  FailedBatchesQueue  {:>8} messages (batches given up: none while retries last)",
            self.failed.len()
        );
    }

    /// Every user's count equals its clicks, every valid click left one output id and every
    /// malformed one one dead letter; or what differs.
    fn verify(
        &self,
        mismatches: usize,
        clicks: usize,
        expected: &BTreeMap<String, u64>,
    ) -> Result<(), CliError> {
        println!("\nverification");
        let malformed = clicks - expected.values().sum::<u64>() as usize;
        let distinct = Self::distinct(&self.counts).len();
        let dead_ids = Self::distinct(&self.dead).len();
        if mismatches == 0 && distinct == clicks - malformed && dead_ids == malformed {
            println!("  every one of the {} users' counts equals its clicks in the input; every valid click left", expected.len());
            println!("  exactly one output id and each of the {malformed} malformed ones exactly one dead letter");
            Ok(())
        } else {
            Err(format!(
                "{mismatches} stored counts differ from the input; {distinct} distinct outputs for {} valid clicks; {dead_ids} dead letters for {malformed} malformed clicks",
                clicks - malformed,
            ).into())
        }
    }
}

/// The state table's items, counted as what they are: the head of each user the counter stored,
/// the operator's signature history (which says what state structures it has used), and any
/// other item, named as such.
fn state_items(
    services: &LocalServices,
    table: &str,
    namespace: &Namespace,
    users: &BTreeMap<String, u64>,
) -> String {
    let items = services
        .dynamodb
        .table(table)
        .map(|t| t.items())
        .unwrap_or_default();
    let heads: HashSet<ItemKey> = users
        .keys()
        .map(|user| DynamoStateStore::<LocalTable>::head_key(namespace, user))
        .collect();
    let history_namespace = Namespace {
        signature: SIGNATURE_HISTORY.to_owned(),
        ..namespace.clone()
    };
    let history_pk =
        DynamoStateStore::<LocalTable>::head_key(&history_namespace, SIGNATURE_HISTORY).pk;
    let (mut of_users, mut history) = (0, 0);
    for key in items.iter().filter_map(ItemKey::of) {
        if key.pk == history_pk {
            history += 1;
        } else if heads.contains(&key) {
            of_users += 1;
        }
    }
    let others = items.len() - of_users - history;
    let mut said = format!(
        "{:>8} items: the heads of {of_users} users, and {history} signature history (the state structures the operator has used)",
        items.len()
    );
    if others > 0 {
        said.push_str(&format!(", and {others} others"));
    }
    said
}

pub(crate) fn print_mapping(name: &str, s: &MappingStats) {
    println!("  {name}");
    println!(
        "    invocations        {:>8}  ({} duplicate deliveries)",
        s.invocations, s.duplicate_deliveries
    );
    println!(
        "    records delivered  {:>8}  ({} done; the rest were retries)",
        s.records_delivered, s.records_done
    );
    println!(
        "    function errors    {:>8}  ({} timeouts; crashes before commit end as timeouts)",
        s.function_errors, s.timeouts
    );
    println!("    partial failures   {:>8}  (write conflicts, sinks that failed: retried from the lowest record)", s.partial_failures);
    println!("    bisections         {:>8}", s.bisections);
    println!(
        "    records discarded  {:>8}",
        s.discarded_for_age + s.discarded_for_retries
    );
}

fn reason(body: &str) -> String {
    serde_json::from_str::<DeadLetter>(body)
        .map(|l| {
            format!(
                "{}: {}",
                l.field,
                l.problem.chars().take(100).collect::<String>()
            )
        })
        .unwrap_or_default()
}
