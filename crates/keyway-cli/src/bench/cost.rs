//! `keyway bench cost`: what each application costs in dollars per million input events on AWS,
//! from a metered run of it on the embedded runtime, beside Managed Service for Apache Flink at
//! the KPU count the same rate needs.
//!
//! Each application runs its `keyway chaos` workload once without faults, on template.yaml's
//! stack, its functions' calls to DynamoDB, Kinesis and SQS waiting a latency per service on the
//! paused clock. The run's meters give AWS's billing units of the functions' calls (read and
//! write request units, PUT payload units, SQS requests) and what the invocations spent: time
//! waiting on services, and CPU time on one core of this machine, scaled to the share of a vCPU
//! Lambda gives the configured memory. What producers and clients do around the functions
//! (putting the input, changing subscriptions) is left out: it costs the same whatever consumes
//! the stream. Prices are named inputs whose defaults are AWS's list prices in us-east-1.

use std::time::Duration;

use serde::Serialize;

use cdc_join::rekey::BeforeImages;
use keyway_local::{Latencies, Spent, Usage};
use keyway_stack::chaos::{usage, App, Settings, Variable};
use keyway_stack::metering::{Batching, Metering};

use crate::error::CliError;

/// Lambda gives a function one vCPU at 1,769 MB and a share of one in proportion below ("Lambda
/// function memory": "At 1,769 MB, a function has the equivalent of one vCPU").
const ONE_VCPU_MB: f64 = 1769.0;
/// Managed Flink gives each KPU 50 GB of running application storage.
const FLINK_STORAGE_GB_PER_KPU: f64 = 50.0;
const HOURS_A_MONTH: f64 = 730.0;
/// The keyed counter's target: dollars per million events at BatchSize 10,000 with a window.
const COUNTER_TARGET_USD: f64 = 0.05;
/// The dynamic filter's BatchSize in template.yaml, kept in its run with a batching window.
const FILTER_BATCH_SIZE: usize = 500;

/// The arguments of `keyway bench cost`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Input records of each application's run.
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Shards of each application's input streams.
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Lanes each shard is read in: the mappings' ParallelizationFactor (template.yaml's is 2).
    #[arg(long, default_value_t = 2)]
    lanes: u32,
    /// The keyed counter's BatchSize in its second and third runs (the stack's is 500).
    #[arg(long, default_value_t = 10_000)]
    counter_batch_size: usize,
    /// The keyed counter's MaximumBatchingWindowInSeconds in its second and third runs (the stack's is 1).
    #[arg(long, default_value_t = 5)]
    counter_window_seconds: u64,
    /// The dynamic filter's MaximumBatchingWindowInSeconds in its second run, at the stack's
    /// BatchSize (the stack's window is 0: events go out as they come).
    #[arg(long, default_value_t = 1)]
    filter_window_seconds: u64,
    #[command(flatten)]
    prices: Prices,
    #[command(flatten)]
    assumptions: Assumptions,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Prices in US dollars; the defaults are AWS's list prices in us-east-1.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub(super) struct Prices {
    /// DynamoDB on-demand, per million write request units.
    #[arg(long, default_value_t = 0.625)]
    dynamodb_write_units_per_million: f64,
    /// DynamoDB on-demand, per million read request units.
    #[arg(long, default_value_t = 0.125)]
    dynamodb_read_units_per_million: f64,
    /// Lambda, per GB-second (arm64, template.yaml's default architecture; x86_64 costs
    /// 0.0000166667).
    #[arg(long, default_value_t = 0.000_013_333_4)]
    lambda_gb_second: f64,
    /// Lambda, per million requests.
    #[arg(long, default_value_t = 0.20)]
    lambda_requests_per_million: f64,
    /// Kinesis provisioned, per million PUT payload units (25 KB).
    #[arg(long, default_value_t = 0.014)]
    kinesis_put_payload_units_per_million: f64,
    /// SQS standard, per million requests (64 KB chunks; FIFO costs 0.50).
    #[arg(long, default_value_t = 0.40)]
    sqs_requests_per_million: f64,
    /// Managed Service for Apache Flink, per KPU-hour.
    #[arg(long, default_value_t = 0.11)]
    flink_kpu_hour: f64,
    /// Managed Service for Apache Flink running storage, per GB-month.
    #[arg(long, default_value_t = 0.10)]
    flink_storage_gb_month: f64,
}

/// What the report assumes beyond the measured run.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub(super) struct Assumptions {
    /// The functions' MemorySize (template.yaml's Globals).
    #[arg(long, default_value_t = 256)]
    memory_mb: u32,
    /// How long a DynamoDB call from a function waits.
    #[arg(long, default_value_t = 5)]
    dynamodb_latency_ms: u64,
    /// How long a PutRecords call from a function waits.
    #[arg(long, default_value_t = 20)]
    kinesis_latency_ms: u64,
    /// How long a SendMessageBatch call from a function waits.
    #[arg(long, default_value_t = 15)]
    sqs_latency_ms: u64,
    /// The sustained input rate: what per-hour costs (schedules, Flink's KPUs) are spread over.
    #[arg(long, default_value_t = 1_000.0)]
    events_per_second: f64,
    /// Events of this kind of keyed job one Flink KPU (one vCPU) processes a second. The
    /// default is about Flink 2.3's net rate at parallelism 1 in `scripts/compare-flink` on a
    /// file source without checkpoints: generous to Flink.
    #[arg(long, default_value_t = 200_000.0)]
    flink_events_per_kpu_second: f64,
}

/// One application's run, per 1,000 input events.
#[derive(Debug, Default, Serialize)]
pub(super) struct Quantities {
    pub read_units: f64,
    pub write_units: f64,
    pub put_payload_units: f64,
    pub sqs_requests: f64,
    pub invocations: f64,
    pub lambda_gb_seconds: f64,
}

/// Dollars per million input events.
#[derive(Debug, Default, Serialize)]
pub(super) struct Dollars {
    pub dynamodb: f64,
    pub lambda: f64,
    pub kinesis: f64,
    pub sqs: f64,
    /// Scheduled functions (sweepers), a cost per hour spread over the assumed rate.
    pub schedules: f64,
    pub total: f64,
}

#[derive(Debug, Serialize)]
pub(super) struct AppCost {
    pub app: &'static str,
    /// The input mappings' batching (the stack's, or the one given), and the variables set on
    /// the functions, if any.
    pub batching: String,
    pub per_1000_events: Quantities,
    pub usd_per_million_events: Dollars,
    /// Managed Flink at the KPUs the assumed rate needs.
    pub flink_kpus: u64,
    pub flink_usd_per_million_events: f64,
    /// Above this rate Managed Flink costs less; none when it never does.
    pub flink_cheaper_above_events_per_second: Option<f64>,
}

#[derive(Debug, Serialize)]
pub(super) struct CostBench {
    pub events: usize,
    pub seed: u64,
    pub shards: usize,
    pub lanes: u32,
    pub prices: Prices,
    pub assumptions: Assumptions,
    pub apps: Vec<AppCost>,
    /// A naive Lambda's DynamoDB cost alone: one strongly consistent read and one write of
    /// up to 1 KB per event.
    pub naive_dynamodb_usd_per_million_events: f64,
    pub counter_target_usd_at_most: f64,
    /// Whether the counter meets its target at the given batching, sending every count and
    /// sending each key's latest count of a batch (`COUNTS_EMIT=latest`).
    pub counter_target_met: bool,
    pub counter_target_met_sending_every_count: bool,
}

impl Assumptions {
    fn latencies(&self) -> Latencies {
        Latencies {
            dynamodb: Duration::from_millis(self.dynamodb_latency_ms),
            kinesis: Duration::from_millis(self.kinesis_latency_ms),
            sqs: Duration::from_millis(self.sqs_latency_ms),
        }
    }

    /// Seconds Lambda bills for `spent` at the configured memory: the time waited, the CPU time
    /// stretched to the vCPU share the memory gets, and half a millisecond an invocation for
    /// Lambda's rounding up to the millisecond.
    fn billed_seconds(&self, spent: &Spent) -> f64 {
        let stretch = (ONE_VCPU_MB / f64::from(self.memory_mb)).max(1.0);
        spent.waited.as_secs_f64()
            + spent.cpu.as_secs_f64() * stretch
            + spent.invocations as f64 * 0.000_5
    }

    fn gb(&self) -> f64 {
        f64::from(self.memory_mb) / 1024.0
    }

    /// Million events an hour at the assumed rate.
    fn million_events_an_hour(&self) -> f64 {
        self.events_per_second * 3600.0 / 1e6
    }
}

/// Dollars an hour of `usage`'s schedules: each fires once a period, whatever the load.
fn schedules_an_hour(usage: &Usage, prices: &Prices, assumptions: &Assumptions) -> f64 {
    usage
        .schedules
        .iter()
        .map(|(_, every, spent)| {
            let an_hour = 3600.0 / every.as_secs_f64().max(1.0);
            // A schedule that never fired in the run is billed Lambda's least: a millisecond.
            let seconds = match spent.invocations {
                0 => 0.001,
                n => assumptions.billed_seconds(spent) / n as f64,
            };
            an_hour
                * (prices.lambda_requests_per_million / 1e6
                    + seconds * assumptions.gb() * prices.lambda_gb_second)
        })
        // From +0: an empty f64 sum is -0, which would print as "-0.0000".
        .fold(0.0, |sum, cost| sum + cost)
}

/// `usage` of a run of `events` input events, per 1,000 events and in dollars per million.
pub(super) fn priced(
    usage: &Usage,
    events: usize,
    prices: &Prices,
    assumptions: &Assumptions,
) -> (Quantities, Dollars) {
    let per_event = |x: f64| x / events.max(1) as f64;
    let gb_seconds = assumptions.billed_seconds(&usage.triggered) * assumptions.gb();
    let quantities = Quantities {
        read_units: per_event(usage.read_units) * 1000.0,
        write_units: per_event(usage.write_units) * 1000.0,
        put_payload_units: per_event(usage.put_payload_units) * 1000.0,
        sqs_requests: per_event(usage.sqs_requests) * 1000.0,
        invocations: per_event(usage.triggered.invocations as f64) * 1000.0,
        lambda_gb_seconds: per_event(gb_seconds) * 1000.0,
    };
    let million = |x: f64| per_event(x) * 1e6;
    let mut dollars = Dollars {
        dynamodb: million(usage.read_units) * prices.dynamodb_read_units_per_million / 1e6
            + million(usage.write_units) * prices.dynamodb_write_units_per_million / 1e6,
        lambda: million(usage.triggered.invocations as f64) * prices.lambda_requests_per_million
            / 1e6
            + million(gb_seconds) * prices.lambda_gb_second,
        kinesis: million(usage.put_payload_units) * prices.kinesis_put_payload_units_per_million
            / 1e6,
        sqs: million(usage.sqs_requests) * prices.sqs_requests_per_million / 1e6,
        schedules: schedules_an_hour(usage, prices, assumptions)
            / assumptions.million_events_an_hour(),
        total: 0.0,
    };
    dollars.total =
        dollars.dynamodb + dollars.lambda + dollars.kinesis + dollars.sqs + dollars.schedules;
    (quantities, dollars)
}

/// Dollars an hour of Managed Flink with `kpus` KPUs: one KPU more for orchestration, and each
/// KPU's running storage.
fn flink_an_hour(kpus: u64, prices: &Prices) -> f64 {
    (kpus + 1) as f64 * prices.flink_kpu_hour
        + kpus as f64 * FLINK_STORAGE_GB_PER_KPU * prices.flink_storage_gb_month / HOURS_A_MONTH
}

/// KPUs Managed Flink needs for `events_per_second`: at least one.
fn flink_kpus(events_per_second: f64, assumptions: &Assumptions) -> u64 {
    ((events_per_second / assumptions.flink_events_per_kpu_second).ceil() as u64).max(1)
}

/// The lowest rate above which Managed Flink costs less than an application whose cost is
/// `per_million` a million events plus `an_hour` an hour; none below ten million a second.
pub(super) fn flink_break_even(
    per_million: f64,
    an_hour: f64,
    prices: &Prices,
    assumptions: &Assumptions,
) -> Option<f64> {
    let per_kpu = assumptions.flink_events_per_kpu_second;
    (1..=(10_000_000.0 / per_kpu).ceil() as u64).find_map(|kpus| {
        // Equal costs an hour: per_million * rate * 3600 / 1e6 + an_hour = flink_an_hour(kpus).
        let rate = (flink_an_hour(kpus, prices) - an_hour) * 1e6 / (3600.0 * per_million);
        let within = (kpus - 1) as f64 * per_kpu < rate && rate <= kpus as f64 * per_kpu;
        within.then_some(rate)
    })
}

/// The keyed counter sending each key's latest count of an invocation only.
fn latest_counts() -> Variable {
    Variable::new("KeyedCounterFunction", "COUNTS_EMIT", "latest")
}

/// The CDC join's re-key trusting whole before images: a stateless re-key.
fn whole_before_images() -> Variable {
    Variable::new(
        "CdcRekeyFunction",
        "BEFORE_IMAGES",
        BeforeImages::Always.name(),
    )
}

/// One application's cost from its metered run, with `batching` and `variables` if any.
fn app_cost(
    app: App,
    batching: Option<Batching>,
    variables: Vec<Variable>,
    args: &Args,
) -> Result<AppCost, CliError> {
    let label = batching.as_ref().map_or("the stack's".into(), |b| {
        format!(
            "BatchSize {}, window {} s",
            b.batch_size,
            b.window.as_secs()
        )
    });
    let label = variables
        .iter()
        .fold(label, |label, v| format!("{label}, {}={}", v.name, v.value));
    let settings = Settings {
        events: args.events,
        fault_rate: 0.0,
        seed: args.seed,
        shards: args.shards,
        lanes: args.lanes,
        metering: Metering {
            latencies: Some(args.assumptions.latencies()),
            batching,
        },
        variables,
    };
    let usage = usage(app, &settings).map_err(|e| format!("{}: {e}", app.name()))?;
    let (per_1000_events, dollars) = priced(&usage, args.events, &args.prices, &args.assumptions);
    let a = &args.assumptions;
    let kpus = flink_kpus(a.events_per_second, a);
    // The schedules' cost an hour, which `priced` spread over the assumed rate.
    let an_hour = dollars.schedules * a.million_events_an_hour();
    let per_million = dollars.total - dollars.schedules;
    Ok(AppCost {
        app: app.name(),
        batching: label,
        per_1000_events,
        flink_kpus: kpus,
        flink_usd_per_million_events: flink_an_hour(kpus, &args.prices)
            / a.million_events_an_hour(),
        flink_cheaper_above_events_per_second: flink_break_even(
            per_million,
            an_hour,
            &args.prices,
            a,
        ),
        usd_per_million_events: dollars,
    })
}

pub(super) fn run(args: Args) -> Result<(), CliError> {
    if args.events == 0 || !(1..=16).contains(&args.shards) || !(1..=10).contains(&args.lanes) {
        return Err(CliError::option(
            "--events, --shards, --lanes",
            "must be at least 1, 1 to 16 and 1 to 10",
        ));
    }
    if !(1..=10_000).contains(&args.counter_batch_size)
        || args.counter_window_seconds > 300
        || args.filter_window_seconds > 300
    {
        return Err(
            "--counter-batch-size must be 1 to 10,000, and --counter-window-seconds and \
             --filter-window-seconds at most 300 (Lambda's limits for a Kinesis mapping)"
                .into(),
        );
    }
    if !(128..=10_240).contains(&args.assumptions.memory_mb)
        || args.assumptions.events_per_second <= 0.0
        || args.assumptions.flink_events_per_kpu_second <= 0.0
    {
        return Err(
            "--memory-mb must be 128 to 10,240 (Lambda's range), and the rates above 0".into(),
        );
    }
    crate::allocator::keep_freed_memory();
    let mut apps = Vec::new();
    for app in App::ALL {
        apps.push(app_cost(app, None, Vec::new(), &args)?);
    }
    // The filter's cost is mostly its SendMessageBatch calls, one per queue a batch: what a
    // batching window saves, for the latency it adds.
    let filter_batching = Batching {
        batch_size: FILTER_BATCH_SIZE,
        window: Duration::from_secs(args.filter_window_seconds),
    };
    apps.push(app_cost(
        App::Filter,
        Some(filter_batching),
        Vec::new(),
        &args,
    )?);
    // Sources whose changes carry whole before images need no rows kept by the re-key.
    apps.push(app_cost(
        App::Cdc,
        None,
        vec![whole_before_images()],
        &args,
    )?);
    let batching = Batching {
        batch_size: args.counter_batch_size,
        window: Duration::from_secs(args.counter_window_seconds),
    };
    let every = app_cost(App::Counter, Some(batching.clone()), Vec::new(), &args)?;
    let every_usd = every.usd_per_million_events.total;
    apps.push(every);
    let latest = app_cost(App::Counter, Some(batching), vec![latest_counts()], &args)?;
    let latest_usd = latest.usd_per_million_events.total;
    apps.push(latest);
    let prices = args.prices.clone();
    let result = CostBench {
        events: args.events,
        seed: args.seed,
        shards: args.shards,
        lanes: args.lanes,
        naive_dynamodb_usd_per_million_events: prices.dynamodb_read_units_per_million
            + prices.dynamodb_write_units_per_million,
        prices,
        assumptions: args.assumptions.clone(),
        apps,
        counter_target_usd_at_most: COUNTER_TARGET_USD,
        counter_target_met: latest_usd <= COUNTER_TARGET_USD,
        counter_target_met_sending_every_count: every_usd <= COUNTER_TARGET_USD,
    };
    crate::job::report(&result, args.json, print_table);
    Ok(())
}

fn print_table(r: &CostBench) {
    print_assumptions(r);
    print_dollars(r);
    print_quantities(r);
    print_verdict(r);
}

fn print_assumptions(r: &CostBench) {
    let a = &r.assumptions;
    println!(
        "keyway bench cost: {} input events an application, seed {}, {} shard(s) of {} lanes; \
         list prices of us-east-1",
        r.events, r.seed, r.shards, r.lanes
    );
    println!(
        "assumed: {} MB functions (CPU time of one core stretched {:.1}x), calls wait DynamoDB {} ms, \
         Kinesis {} ms, SQS {} ms; {} events/s sustained; a Flink KPU does {} events/s",
        a.memory_mb,
        (ONE_VCPU_MB / f64::from(a.memory_mb)).max(1.0),
        a.dynamodb_latency_ms,
        a.kinesis_latency_ms,
        a.sqs_latency_ms,
        a.events_per_second,
        a.flink_events_per_kpu_second
    );
}

/// Each application's dollars per million events, by service, beside Managed Flink.
fn print_dollars(r: &CostBench) {
    println!();
    println!(
        "{:<10} {:<48} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}   {:>9} {:>14}",
        "USD per M",
        "batching",
        "DynamoDB",
        "Lambda",
        "Kinesis",
        "SQS",
        "schedules",
        "total",
        "Flink",
        "Flink cheaper"
    );
    for app in &r.apps {
        let d = &app.usd_per_million_events;
        let above = app
            .flink_cheaper_above_events_per_second
            .map_or("never".into(), |rate| format!("> {rate:.0}/s"));
        println!(
            "{:<10} {:<48} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>9.4}   {:>9.4} {:>14}",
            app.app,
            app.batching,
            d.dynamodb,
            d.lambda,
            d.kinesis,
            d.sqs,
            d.schedules,
            d.total,
            app.flink_usd_per_million_events,
            above
        );
    }
}

/// What each application used per 1,000 events, the quantities the dollars come from.
fn print_quantities(r: &CostBench) {
    println!();
    println!(
        "{:<10} {:<48} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9}",
        "per 1,000", "batching", "RRU", "WRU", "PUT units", "SQS req", "invocations", "GB-s"
    );
    for app in &r.apps {
        let q = &app.per_1000_events;
        println!(
            "{:<10} {:<48} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>11.2} {:>9.3}",
            app.app,
            app.batching,
            q.read_units,
            q.write_units,
            q.put_payload_units,
            q.sqs_requests,
            q.invocations,
            q.lambda_gb_seconds
        );
    }
}

fn print_verdict(r: &CostBench) {
    println!();
    println!(
        "a naive Lambda's DynamoDB alone (a read and a write per event): {:.4} USD per M",
        r.naive_dynamodb_usd_per_million_events
    );
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    // The counter's two runs with its batching are the last rows (`run`).
    let runs = &r.apps[r.apps.len() - 2..];
    for (run, met) in runs.iter().zip([
        r.counter_target_met_sending_every_count,
        r.counter_target_met,
    ]) {
        println!(
            "target: the keyed counter at {} <= {} USD per M ({:.4}): {}",
            run.batching,
            r.counter_target_usd_at_most,
            run.usd_per_million_events.total,
            verdict(met)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> (Prices, Assumptions) {
        use clap::Parser;
        #[derive(Parser)]
        struct Both {
            #[command(flatten)]
            prices: Prices,
            #[command(flatten)]
            assumptions: Assumptions,
        }
        let both = Both::parse_from(["cost"]);
        (both.prices, both.assumptions)
    }

    #[test]
    fn a_million_events_costs_their_units_at_list_prices_and_cpu_stretched_to_the_memorys_share() {
        let (prices, assumptions) = defaults();
        // A million events: 100,000 writes and reads, a million PUT units, 1,000 SQS requests,
        // 100 invocations that waited 10 s and ran 1 s of CPU in all.
        let usage = Usage {
            read_units: 100_000.0,
            write_units: 100_000.0,
            put_payload_units: 1_000_000.0,
            sqs_requests: 1_000.0,
            triggered: Spent {
                invocations: 100,
                waited: Duration::from_secs(10),
                cpu: Duration::from_secs(1),
            },
            schedules: Vec::new(),
        };
        let (per_1000, dollars) = priced(&usage, 1_000_000, &prices, &assumptions);
        assert!((dollars.dynamodb - (0.0125 + 0.0625)).abs() < 1e-12);
        assert!((dollars.kinesis - 0.014).abs() < 1e-12);
        assert!((dollars.sqs - 0.0004).abs() < 1e-12);
        // 10 s + 1 s x 1769/256 + 100 x 0.5 ms, at a quarter of a GB.
        let seconds = 10.0 + 1769.0 / 256.0 + 0.05;
        let lambda = 100.0 * 0.2 / 1e6 + seconds * 0.25 * 0.000_013_333_4;
        assert!((dollars.lambda - lambda).abs() < 1e-12);
        assert_eq!(dollars.schedules, 0.0);
        let sum = dollars.dynamodb + dollars.lambda + dollars.kinesis + dollars.sqs;
        assert!((dollars.total - sum).abs() < 1e-12);
        assert!((per_1000.write_units - 100.0).abs() < 1e-9);
        assert!((per_1000.invocations - 0.1).abs() < 1e-12);
    }

    #[test]
    fn a_schedule_costs_the_same_an_hour_so_less_an_event_the_faster_events_come() {
        let (prices, mut assumptions) = defaults();
        let usage = Usage {
            schedules: vec![(
                "sweep".into(),
                Duration::from_secs(60),
                Spent {
                    invocations: 2,
                    waited: Duration::from_millis(20),
                    cpu: Duration::ZERO,
                },
            )],
            ..Usage::default()
        };
        let (_, slow) = priced(&usage, 1000, &prices, &assumptions);
        assumptions.events_per_second *= 10.0;
        let (_, fast) = priced(&usage, 1000, &prices, &assumptions);
        assert!(slow.schedules > 0.0);
        assert!((slow.schedules / fast.schedules - 10.0).abs() < 1e-9);
    }

    #[test]
    fn the_memory_assumed_by_default_is_what_template_yaml_gives_every_function() {
        let (_, assumptions) = defaults();
        let template = keyway_stack::TEMPLATE;
        let globals = template.split("\nResources:").next().expect("globals");
        assert!(globals.contains(&format!("MemorySize: {}", assumptions.memory_mb)));
        assert_eq!(
            template.matches("MemorySize:").count(),
            1,
            "no function sets its own"
        );
    }

    #[test]
    fn the_filters_batch_size_is_what_template_yaml_gives_its_mapping() {
        let template = keyway_stack::TEMPLATE;
        let function = template
            .split("\n  DynamicFilterFunction:\n")
            .nth(1)
            .and_then(|rest| rest.split("\n  DynamicFilterFunctionLogGroup:").next())
            .expect("the dynamic filter's resource");
        assert!(function.contains(&format!("BatchSize: {FILTER_BATCH_SIZE}\n")));
    }

    #[test]
    fn flink_costs_less_above_the_rate_where_its_kpus_cost_what_the_functions_do() {
        let (prices, assumptions) = defaults();
        // Two KPUs an hour (one and its orchestration) and one KPU's storage.
        let hour = 2.0 * 0.11 + 50.0 * 0.10 / 730.0;
        assert!((flink_an_hour(1, &prices) - hour).abs() < 1e-12);
        let rate = flink_break_even(0.05, 0.0, &prices, &assumptions).expect("a rate");
        assert!((rate * 3600.0 / 1e6 * 0.05 - hour).abs() < 1e-9);
        assert_eq!(flink_kpus(rate, &assumptions), 1);
        assert_eq!(
            flink_break_even(1e-9, 0.0, &prices, &assumptions),
            None,
            "functions that cost next to nothing an event stay cheaper"
        );
    }
}
