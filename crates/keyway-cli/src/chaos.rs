//! `keyway chaos APP`: an application of the stack under every injected fault, against a run
//! without faults and an oracle (`keyway_stack::chaos`). Prints what was lost, applied twice or
//! extra (JSON with `--json`), and fails unless the run is clean; the seed replays a failure.

use keyway_stack::chaos::{run as run_app, App, Settings, Variable};

use crate::error::CliError;

/// The arguments of `keyway chaos`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// counter, identity, filter, cdc, aggregate, or all.
    app: String,
    /// Input records of each run.
    #[arg(long, default_value_t = 200_000)]
    events: usize,
    /// The probability of each kind of fault (outages aside: see tests/tests/limits.rs).
    #[arg(long, default_value_t = 0.03)]
    fault_rate: f64,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Shards of the application's input streams (1-16).
    #[arg(long, default_value_t = 4)]
    shards: usize,
    /// Lanes each shard is read in: the mappings' ParallelizationFactor (1-10).
    #[arg(long, default_value_t = 2)]
    lanes: u32,
    /// An environment variable of a function of the stack, `Function.NAME=value`, set before
    /// it is deployed (repeatable): `--set KeyedCounterFunction.COUNTS_EMIT=latest`.
    #[arg(long = "set", value_name = "FUNCTION.NAME=VALUE", value_parser = parse_variable)]
    variables: Vec<Variable>,
    /// A JSON line a run instead of the text report.
    #[arg(long)]
    json: bool,
}

/// A `--set` value that does not read as `Function.NAME=value`.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not Function.NAME=value")]
struct NotAVariable(String);

fn parse_variable(text: &str) -> Result<Variable, NotAVariable> {
    Variable::parse(text).ok_or_else(|| NotAVariable(text.to_owned()))
}

/// The applications `name` names.
fn apps(name: &str) -> Result<Vec<App>, CliError> {
    if name == "all" {
        return Ok(App::ALL.to_vec());
    }
    App::parse(name).map(|app| vec![app]).ok_or_else(|| {
        format!("no application {name:?}: counter, identity, filter, cdc, aggregate or all").into()
    })
}

pub(crate) fn run(args: Args) -> Result<(), CliError> {
    let settings = Settings {
        events: args.events,
        fault_rate: args.fault_rate,
        seed: args.seed,
        shards: args.shards,
        lanes: args.lanes,
        metering: Default::default(),
        variables: args.variables,
    };
    if !(1..=16).contains(&settings.shards) {
        return Err(CliError::option("--shards", "must be 1 to 16"));
    }
    if !(1..=10).contains(&settings.lanes) {
        return Err(CliError::option(
            "--lanes",
            "must be 1 to 10 (Lambda's ParallelizationFactor)",
        ));
    }
    if !(0.0..=0.5).contains(&settings.fault_rate) {
        return Err(CliError::option(
            "--fault-rate",
            "must be a probability of at most 0.5",
        ));
    }
    let apps = apps(&args.app)?;
    let refused = |app: &App| settings.variables.iter().any(|v| !app.takes(v));
    if apps.iter().any(refused) {
        return Err(CliError::option(
            "--set",
            "applies to the runs that deploy template.yaml: counter, identity and aggregate; \
             the CDC join's takes CdcRekeyFunction.BEFORE_IMAGES only, the filter's none (they \
             wire their functions themselves)",
        ));
    }
    crate::allocator::keep_freed_memory();
    let mut dirty = Vec::new();
    for app in apps {
        let report = run_app(app, &settings)?;
        if args.json {
            let line = serde_json::to_string(&report).map_err(|e| e.to_string())?;
            println!("{line}");
        } else {
            println!("{report}");
        }
        if !report.clean() {
            dirty.push(app.name());
        }
    }
    if dirty.is_empty() {
        Ok(())
    } else {
        Err(format!("not clean: {} (seed {})", dirty.join(", "), settings.seed).into())
    }
}
