//! `keyway filter`: subscription changes and events replayed in time order through the dynamic
//! filtering of template.yaml on the embedded runtime (`keyway_stack::filtering`). Each delivery
//! goes to standard output as a JSON line `{"consumer", "queue", "event"}`; a summary, and every
//! refused subscription with its line and reason, go to standard error.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use keyway_stack::filtering::{replay, Change, Delivered, Outcome, Settings, TimedEvent};
use serde_json::json;

use crate::error::CliError;

/// `keyway filter`'s arguments.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// JSON Lines of changes: {"at": MS, "op": "subscribe", "consumer", "key", "queue",
    /// "pattern"?}, {"at", "op": "unsubscribe", "consumer", "key"}, {"at", "op":
    /// "subscribe_all", "consumer", "queue", "pattern"?}, {"at", "op": "unsubscribe_all",
    /// "consumer"}.
    #[arg(long)]
    pub subscriptions: PathBuf,
    /// JSON Lines {"at": MS, "event": {...}}.
    #[arg(long)]
    pub events: PathBuf,
    /// A JSON object of consumer id to the queue names it owns; without it any queue is
    /// accepted.
    #[arg(long)]
    pub queues: Option<PathBuf>,
    /// Where an event holds its filter key (a JSON pointer).
    #[arg(long, default_value = "/key")]
    pub key: String,
    /// Shards of the events stream.
    #[arg(long, default_value_t = 4)]
    pub shards: usize,
    /// Subscriptions go to the stack's shared policy table, not to a table of each consumer's
    /// own (consumer.yaml, deployed when the consumer first subscribes).
    #[arg(long)]
    pub shared_table: bool,
}

pub(crate) fn run(options: Args) -> Result<(), CliError> {
    let mut problems = Vec::new();
    let mut changes = read_lines(&options.subscriptions, Change::parse, &mut problems)?;
    changes.sort_by_key(|c| c.at);
    let mut events = read_lines(
        &options.events,
        |text, _| serde_json::from_str::<TimedEvent>(text),
        &mut problems,
    )?;
    events.sort_by_key(|e| e.at);
    for problem in &problems {
        eprintln!("keyway filter: {problem}");
    }
    let registry = options
        .queues
        .as_ref()
        .map(|path| {
            std::fs::read_to_string(path)
                .map_err(|e| CliError::from(format!("{}: {e}", path.display())))
        })
        .transpose()?;
    let settings = Settings {
        shards: options.shards,
        key_pointer: options.key,
        registry,
        // Each service call takes a millisecond of virtual time, so propagation has a cost.
        latency: Some(std::time::Duration::from_millis(1)),
        shared_table: options.shared_table,
        ..Settings::default()
    };
    let started = std::time::Instant::now();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut write_failed = None;
    let outcome = crate::job::runtime_builder(true).block_on(replay(
        &settings,
        &changes,
        events,
        |d: Delivered| {
            let line = json!({"consumer": d.consumer, "queue": d.queue, "event": d.event});
            if let Err(e) = writeln!(out, "{line}") {
                write_failed.get_or_insert(e);
            }
        },
    ))?;
    out.flush().map_err(CliError::writing("standard output"))?;
    if let Some(e) = write_failed {
        return Err(CliError::writing("standard output")(e));
    }
    eprint!("{}", summary(&outcome, started.elapsed()));
    Ok(())
}

/// Each line of `path` read by `parse`; lines that do not parse are reported in `problems` and
/// left out, so that the run goes on.
fn read_lines<T, E: std::fmt::Display>(
    path: &Path,
    parse: impl Fn(&str, usize) -> Result<T, E>,
    problems: &mut Vec<String>,
) -> Result<Vec<T>, CliError> {
    let file = std::fs::File::open(path).map_err(CliError::file(&path))?;
    let mut parsed = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(CliError::file(&path))?;
        if line.trim().is_empty() {
            continue;
        }
        match parse(&line, i + 1) {
            Ok(item) => parsed.push(item),
            Err(why) => problems.push(format!("{} line {}: {why}", path.display(), i + 1)),
        }
    }
    Ok(parsed)
}

fn summary(outcome: &Outcome, took: std::time::Duration) -> String {
    let mut text = String::new();
    let percent = |part: u64, whole: u64| {
        if whole == 0 {
            0.0
        } else {
            100.0 * part as f64 / whole as f64
        }
    };
    text.push_str(&format!(
        "events {}  delivered {}  matched no one {:.1}%  ({:.0} events/s)\n",
        outcome.events,
        outcome.delivered,
        percent(outcome.unmatched, outcome.filtered),
        outcome.events as f64 / took.as_secs_f64().max(1e-9),
    ));
    for (consumer, count) in &outcome.by_consumer {
        text.push_str(&format!("  {consumer}: {count}\n"));
    }
    text.push_str(&format!(
        "refused subscriptions {}\n",
        outcome.refused.len()
    ));
    for (line, why) in &outcome.refused {
        text.push_str(&format!("  line {line}: {why}\n"));
    }
    let mut latency = outcome.propagation.clone();
    latency.sort_unstable();
    let at = |q: f64| {
        latency
            .get(((latency.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    text.push_str(&format!(
        "propagation, policy write to the filter state (virtual ms, 1 ms a service call)  p50 {}  p95 {}  max {}  over {} changes\n",
        at(0.5),
        at(0.95),
        latency.last().copied().unwrap_or(0),
        latency.len()
    ));
    text.push_str(&dead_letter_summary(&outcome.dead_letters));
    text
}

/// Dead letters counted, and the first ten reasons with their counts: nothing when there are none.
pub(crate) fn dead_letter_summary(reasons: &[String]) -> String {
    if reasons.is_empty() {
        return String::new();
    }
    let mut text = format!("dead letters {}\n", reasons.len());
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for reason in reasons {
        *counts.entry(reason.as_str()).or_default() += 1;
    }
    for (reason, count) in counts.iter().take(10) {
        text.push_str(&format!("  {count} × {reason}\n"));
    }
    text
}
