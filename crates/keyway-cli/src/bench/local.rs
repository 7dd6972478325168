//! `keyway bench local`: events a second through the embedded runtime, with a function that does
//! nothing and with the keyed counter, in one run: the emulator's own share of a run.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use keyway_local::thread_cpu_time;

use crate::error::CliError;
use crate::job::{report, runtime_builder};
use crate::workload::{EXPONENT, KEYS};

/// A function that does nothing: what is left of an invocation is the emulator's own work.
struct NoOp;

#[async_trait::async_trait]
impl keyway::lambda::Handler for NoOp {
    async fn handle(
        &self,
        _event: &str,
        _: &keyway::lambda::Invocation,
    ) -> Result<keyway::lambda::Response, keyway::lambda::FunctionError> {
        Ok(keyway::lambda::Response::Kinesis(Default::default()))
    }

    /// Takes a Kinesis batch as the keyed counter's handler does, without its JSON.
    async fn handle_kinesis(
        &self,
        _batch: &keyway::sources::kinesis::KinesisBatch,
        _: &keyway::lambda::Invocation,
    ) -> Result<keyway::lambda::Response, keyway::lambda::FunctionError> {
        Ok(keyway::lambda::Response::Kinesis(Default::default()))
    }
}

#[derive(Serialize)]
struct LocalBench {
    events: usize,
    seed: u64,
    noop_events_per_second: f64,
    keyed_counter_events_per_second: f64,
    noop_cpu_us_per_event: f64,
    keyed_counter_cpu_us_per_event: f64,
    /// The emulator's own time (the no-op run) as a share of the keyed counter's run.
    emulator_overhead_share: f64,
    emulator_overhead_share_at_most: f64,
    target_met: bool,
}

/// CPU time of running `events` through the template's stack with the function `noop` or the
/// keyed counter, on the embedded runtime under virtual time.
fn local_run(records: &[(String, Vec<u8>)], noop: bool) -> Result<Duration, CliError> {
    let runtime = runtime_builder(true);
    runtime.block_on(async {
        let services =
            keyway_local::LocalServices::new(1_767_225_600_000, keyway_local::FaultPlan::default());
        let mut functions = keyway_stack::functions();
        if noop {
            functions.insert(
                "KeyedCounterFunction".into(),
                Box::new(|_, _| Ok(Arc::new(NoOp) as Arc<dyn keyway::lambda::Handler>)),
            );
        }
        let mut runtime = keyway_local::LocalRuntime::from_template(
            keyway_stack::TEMPLATE,
            services.clone(),
            &functions,
        )?;
        let stream = runtime.resource("ClicksStream").ok_or("no ClicksStream")?;
        services
            .kinesis
            .put_in_order(&stream, records)
            .await
            .map_err(|e| e.to_string())?;
        let start = thread_cpu_time();
        let report = runtime
            .run_until_idle(Duration::from_secs(24 * 3600))
            .await?;
        let spent = thread_cpu_time() - start;
        let done: u64 = report.mappings.iter().map(|(_, s)| s.records_done).sum();
        if done != records.len() as u64 {
            let unfinished = format!("{done} of {} records processed", records.len());
            return Err(CliError::Job(unfinished));
        }
        Ok(spent)
    })
}

/// `keyway bench local`'s arguments.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[arg(long, default_value_t = 50_000)]
    pub events: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn run(args: Args) -> Result<(), CliError> {
    let Args { events, seed, json } = args;
    if events == 0 {
        return Err(CliError::option("--events", "must be at least 1"));
    }
    let records: Vec<(String, Vec<u8>)> = crate::workload::zipf_keys(events, KEYS, EXPONENT, seed)
        .into_iter()
        .map(|key| {
            let data = format!(r#"{{"key":"{key}"}}"#).into_bytes();
            (key, data)
        })
        .collect();
    // Alternate the runs and keep each one's best of five: noise only ever adds time.
    let (mut noop, mut counter) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        noop = noop.min(local_run(&records, true)?);
        counter = counter.min(local_run(&records, false)?);
    }
    let share = noop.as_secs_f64() / counter.as_secs_f64();
    let result = LocalBench {
        events,
        seed,
        noop_events_per_second: events as f64 / noop.as_secs_f64(),
        keyed_counter_events_per_second: events as f64 / counter.as_secs_f64(),
        noop_cpu_us_per_event: noop.as_secs_f64() * 1e6 / events as f64,
        keyed_counter_cpu_us_per_event: counter.as_secs_f64() * 1e6 / events as f64,
        emulator_overhead_share: share,
        emulator_overhead_share_at_most: 0.2,
        target_met: share < 0.2,
    };
    report(&result, json, |result| {
        println!("keyway bench local: {} events through template.yaml's stack on the embedded runtime, seed {}", events, seed);
        println!();
        println!(
            "{:<28} {:>14} {:>16}",
            "function", "events/s", "CPU us/event"
        );
        println!(
            "{:<28} {:>14.0} {:>16.2}",
            "no-op", result.noop_events_per_second, result.noop_cpu_us_per_event
        );
        println!(
            "{:<28} {:>14.0} {:>16.2}",
            "keyed counter",
            result.keyed_counter_events_per_second,
            result.keyed_counter_cpu_us_per_event
        );
        println!();
        println!(
            "emulator overhead: {:.1}% of the keyed counter's time (target below {:.0}%): {}",
            share * 100.0,
            result.emulator_overhead_share_at_most * 100.0,
            if result.target_met { "met" } else { "NOT met" }
        );
    });
    Ok(())
}
