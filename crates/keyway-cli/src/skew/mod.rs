//! `keyway skew`: a simulator of the load a keyed workload puts on Kinesis shards and on the
//! DynamoDB partitions of the state table, without a mitigation (`none`, "before") and with the
//! chosen one ("after").
//!
//! Strategies, on the producer's side (`keyway::domain::salt`): `none` and `pre-aggregate` keep
//! every key's own partition key; `salt` spreads every key over `--buckets` partition keys
//! `key#0..key#N-1` taken in turn; `sidetrack` only the `--hot` keys; `adaptive` starts with
//! none and salts the keys it finds hot in a second from the next second on, until they cool.
//!
//! The parts, in the order a run takes them: `source` generates or reads the workload; `route`
//! gives each event its partition key and shard under a strategy, `adaptive` finding the hot keys
//! for the adaptive one; `simulate` counts what the shards and the DynamoDB partitions are
//! offered and sums both strategies up in a `Report`; `render` prints it as text (as JSON it is
//! serialized as it is) and `plot` draws it as SVG. This module holds the options, the
//! strategies they name and the checks of both.

mod adaptive;
mod plot;
pub(crate) mod render;
mod route;
pub(crate) mod simulate;
pub(crate) mod source;

use std::collections::BTreeSet;
use std::path::PathBuf;

use keyway::domain::salt::{Salting, MAX_BUCKETS};
use keyway::domain::skew::Hysteresis;
use serde::Serialize;

use crate::error::CliError;

use plot::plot;
use render::render;
use simulate::simulate;
use source::load;

/// Records a Kinesis shard takes a second.
pub(crate) const SHARD_RECORDS_PER_SECOND: u64 = 1_000;
/// Bytes (data and partition key) a Kinesis shard takes a second: 1 MiB.
pub(crate) const SHARD_BYTES_PER_SECOND: u64 = 1 << 20;
/// Write capacity units a DynamoDB partition serves a second.
pub(crate) const PARTITION_WCU_PER_SECOND: u64 = 1_000;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Generated events.
    #[arg(long, default_value_t = 100_000)]
    pub events: usize,
    /// Distinct keys of the generated events (`user-1` ...).
    #[arg(long, default_value_t = 1_000)]
    pub keys: u64,
    /// The Zipf exponent the generated keys are drawn with (0: uniform).
    #[arg(long, default_value_t = 1.0)]
    pub zipf: f64,
    /// The share (0 to 1) of the generated events that go to the one key `hot`.
    #[arg(long, default_value_t = 0.0)]
    pub hot_share: f64,
    /// The simulated second from which the hot key takes its share (all Zipf before).
    #[arg(long, default_value_t = 0)]
    pub hot_from: u64,
    /// Seed of the generated keys.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Events a second the workload arrives at.
    #[arg(long, default_value_t = 50_000)]
    pub rate: u64,
    /// Bytes of each record's data (a JSON line's own length instead).
    #[arg(long, default_value_t = 1_024)]
    pub record_bytes: u64,
    /// A file of partition keys, one a line (gzipped or not), instead of generated events.
    #[arg(long, conflicts_with_all = ["events", "keys", "zipf", "hot_share", "hot_from", "seed"])]
    pub partition_keys: Option<PathBuf>,
    /// A file of JSON lines (gzipped or not), each an event keyed by `--key`.
    #[arg(long, requires = "key", conflicts_with_all = ["partition_keys", "events", "keys", "zipf", "hot_share", "hot_from", "seed", "record_bytes"])]
    pub json_lines: Option<PathBuf>,
    /// The JSON pointer of a line's key (`/user/id`), with `--json-lines`.
    #[arg(long, requires = "json_lines")]
    pub key: Option<String>,
    /// Shards of the stream (its hash key space split evenly).
    #[arg(long, default_value_t = 8)]
    pub shards: u32,
    /// DynamoDB partitions of the state table [default: as many as shards].
    #[arg(long)]
    pub partitions: Option<u32>,
    /// The skew mitigation, compared with none.
    #[arg(long, value_enum, default_value_t = StrategyName::None)]
    pub strategy: StrategyName,
    /// Buckets a salted key is spread over (salt, sidetrack, adaptive).
    #[arg(long, default_value_t = 32)]
    pub buckets: u32,
    /// The keys sidetrack salts, KEY[,KEY...].
    #[arg(long, value_delimiter = ',')]
    pub hot: Vec<String>,
    /// How salted buckets are placed on shards.
    #[arg(long, value_enum, default_value_t = Placement::Spread)]
    pub placement: Placement,
    /// adaptive: a key carrying this share of a second's events turns hot.
    #[arg(long, default_value_t = 0.05)]
    pub heat_share: f64,
    /// adaptive: a hot key below this share of a second's events is cool in that second.
    #[arg(long, default_value_t = 0.01)]
    pub cool_share: f64,
    /// adaptive: cool seconds in a row after which a key is no longer salted.
    #[arg(long, default_value_t = 5)]
    pub cool_seconds: u32,
    /// Records a batch of the function reading a shard holds at most.
    #[arg(long, default_value_t = 500)]
    pub batch_size: usize,
    /// Draws the shard loads before and after as an SVG bar chart to this file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum StrategyName {
    /// Each key its own partition key, a state write a record.
    None,
    /// As none, but the reading function writes each key once a batch.
    PreAggregate,
    /// Every key over `--buckets` partition keys, pre-aggregated.
    Salt,
    /// Only the `--hot` keys salted, pre-aggregated.
    Sidetrack,
    /// The keys found hot in a second salted from the next, pre-aggregated.
    Adaptive,
}

/// Where a salted bucket's records go (see the module's notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Placement {
    /// Each bucket's ExplicitHashKey in the middle of its own even slice of the hash key space.
    Spread,
    /// The MD5 of the salted partition key, as for any key.
    Md5,
}

/// A mitigation, with what it needs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Strategy {
    None,
    PreAggregate,
    Salt,
    Sidetrack(BTreeSet<String>),
    Adaptive(Hysteresis),
}

impl Strategy {
    pub(crate) fn name(&self) -> StrategyName {
        match self {
            Strategy::None => StrategyName::None,
            Strategy::PreAggregate => StrategyName::PreAggregate,
            Strategy::Salt => StrategyName::Salt,
            Strategy::Sidetrack(_) => StrategyName::Sidetrack,
            Strategy::Adaptive(_) => StrategyName::Adaptive,
        }
    }

    /// Whether the function reading a shard writes a key once a batch rather than once a record.
    pub(crate) fn pre_aggregates(&self) -> bool {
        !matches!(self, Strategy::None)
    }

    /// The keys salted from the start.
    fn salting(&self, buckets: u32) -> Salting {
        match self {
            Strategy::None | Strategy::PreAggregate | Strategy::Adaptive(_) => Salting::None,
            Strategy::Salt => Salting::All { buckets },
            Strategy::Sidetrack(hot) => Salting::Listed {
                hot: hot.clone(),
                buckets,
            },
        }
    }

    fn label(&self, buckets: u32) -> String {
        match self {
            Strategy::None => "none".into(),
            Strategy::PreAggregate => "pre-aggregate".into(),
            Strategy::Salt => format!("salt, {buckets} buckets"),
            Strategy::Sidetrack(hot) => {
                let hot: Vec<&str> = hot.iter().map(String::as_str).collect();
                format!("sidetrack {}, {buckets} buckets", hot.join(","))
            }
            Strategy::Adaptive(_) => format!("adaptive, {buckets} buckets"),
        }
    }
}

/// The stream, the table and the reading function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    pub shards: u32,
    pub partitions: u32,
    pub buckets: u32,
    pub placement: Placement,
    pub rate: u64,
    pub batch_size: usize,
}

pub(crate) fn run(options: Args) -> Result<(), CliError> {
    let settings = settings(&options)?;
    let strategy = strategy(&options)?;
    let workload = load(&options)?;
    if workload.events.is_empty() {
        let first = workload.bad.first.as_ref().map_or(String::new(), |p| {
            format!(" (line {}: {}: {})", p.line, p.field, p.problem)
        });
        return Err(format!("{}: no events to simulate{first}", workload.source).into());
    }
    let mut report = simulate(&workload, &strategy, &settings)?;
    if let Some(path) = &options.plot {
        plot(path, &report)?;
        report.plot = Some(path.display().to_string());
    }
    crate::job::report(&report, options.json, |r| print!("{}", render(r)));
    Ok(())
}

fn settings(options: &Args) -> Result<Settings, CliError> {
    let settings = Settings {
        shards: options.shards,
        partitions: options.partitions.unwrap_or(options.shards),
        buckets: options.buckets,
        placement: options.placement,
        rate: options.rate,
        batch_size: options.batch_size,
    };
    let positive = [
        ("--shards", u64::from(settings.shards)),
        ("--partitions", u64::from(settings.partitions)),
        ("--buckets", u64::from(settings.buckets)),
        ("--rate", settings.rate),
        ("--batch-size", settings.batch_size as u64),
    ];
    if let Some((name, _)) = positive.iter().find(|(_, value)| *value == 0) {
        return Err(format!("{name} must be at least 1").into());
    }
    if settings.buckets > MAX_BUCKETS {
        return Err(CliError::option(
            "--buckets",
            format!("must be at most {MAX_BUCKETS}"),
        ));
    }
    Ok(settings)
}

fn strategy(options: &Args) -> Result<Strategy, CliError> {
    if !options.hot.is_empty() && options.strategy != StrategyName::Sidetrack {
        return Err(CliError::option(
            "--hot",
            "names the keys of --strategy sidetrack",
        ));
    }
    Ok(match options.strategy {
        StrategyName::None => Strategy::None,
        StrategyName::PreAggregate => Strategy::PreAggregate,
        StrategyName::Salt => Strategy::Salt,
        StrategyName::Sidetrack if options.hot.is_empty() => {
            return Err(CliError::option(
                "--strategy",
                "sidetrack needs --hot KEY[,KEY...]",
            ))
        }
        StrategyName::Sidetrack => Strategy::Sidetrack(options.hot.iter().cloned().collect()),
        StrategyName::Adaptive => {
            let (heat, cool) = (options.heat_share, options.cool_share);
            if !(0.0 < cool && cool <= heat && heat <= 1.0) {
                return Err("need 0 < --cool-share <= --heat-share <= 1".into());
            }
            Strategy::Adaptive(Hysteresis {
                heat_share: heat,
                cool_share: cool,
                cool_periods: options.cool_seconds.max(1),
            })
        }
    })
}

#[cfg(test)]
mod testing {
    //! What the tests of several parts build their runs from.

    use super::source::Event;
    use super::{Placement, Settings};

    pub(super) fn settings(shards: u32) -> Settings {
        Settings {
            shards,
            partitions: shards,
            buckets: 32,
            placement: Placement::Spread,
            rate: 50_000,
            batch_size: 500,
        }
    }

    pub(super) fn events(keys: &[&str], n: usize) -> Vec<Event> {
        (0..n)
            .map(|i| Event {
                key: keys[i % keys.len()].to_owned(),
                bytes: 100,
            })
            .collect()
    }
}
