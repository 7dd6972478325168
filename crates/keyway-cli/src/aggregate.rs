//! `keyway aggregate`: JSON Lines files (gzipped or not) through keyed aggregation's two functions
//! on the embedded runtime (`keyway_stack::aggregation`): each line a Kinesis record under its
//! key's partition key, a slice at a time, so that a long file runs in bounded memory. Results go
//! to stdout as JSON lines, `{"key": K, "window_start": MS, "count": N, ...}`, by key and window;
//! a summary with lines a second and the dead letters (late records apart) to stderr, with a
//! progress line while it runs.
//!
//! With windows the virtual clock starts at the first line's event time and keeps up with the
//! lines' as they go in, so a recorded stream's windows close as they would have live.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use keyed_aggregate::aggregate::Aggregate;
use keyway::domain::pointer::{string_of, Pointer};
use keyway::local::FaultPlan;
use keyway_stack::aggregation::{Aggregation, Finished, Settings, Windowing};

use crate::error::CliError;

/// Lines put on the stream at a time.
const SLICE: usize = 20_000;
/// The virtual clock's start when the lines carry no time to start from.
const EPOCH: i64 = 1_767_225_600_000;

#[derive(clap::Args, Debug)]
pub struct AggregateOptions {
    /// Where each line holds its key (a JSON pointer).
    #[arg(long)]
    pub key: String,
    /// Where each line holds its value (a JSON pointer), for sum, min, max and mean.
    #[arg(long)]
    pub value: Option<String>,
    /// The aggregates to report (repeat or comma-separate); the count is always reported.
    #[arg(long, value_delimiter = ',', default_value = "count")]
    pub agg: Vec<String>,
    /// Tumbling event-time windows of this many seconds.
    #[arg(long, requires = "time")]
    pub window: Option<u64>,
    /// Where each line holds its event time: epoch milliseconds or an RFC 3339 string.
    #[arg(long)]
    pub time: Option<String>,
    /// How long after its end a window still takes lines (seconds); later ones are late.
    #[arg(long, default_value_t = 60)]
    pub lateness: u64,
    /// Shards of the stream the lines go on.
    #[arg(long, default_value_t = 4)]
    pub shards: usize,
    /// JSON Lines files, gzipped or not.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

/// What a run did, for the summary.
struct Tally {
    lines: u64,
    started: Instant,
}

pub fn run(options: AggregateOptions) -> Result<(), CliError> {
    let settings = settings(&options)?;
    let key = Pointer::parse(&options.key).map_err(|e| format!("--key: {e}"))?;
    let time = match &settings.windows {
        Some(w) => Some(Pointer::parse(&w.time).map_err(|e| format!("--time: {e}"))?),
        None => None,
    };
    let progress = indicatif::ProgressBar::new_spinner();
    progress.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    progress.set_style(
        indicatif::ProgressStyle::with_template("  {spinner} {pos} lines aggregated, {per_sec}")
            .map_err(|e| e.to_string())?,
    );
    let runtime = crate::bench::runtime_builder(true);
    let mut tally = Tally {
        lines: 0,
        started: Instant::now(),
    };
    // Lines are read and keyed on a thread of their own, a slice ahead of the functions.
    let (slices, reader) = read_slices(options.paths.clone(), key, time);
    let finished = runtime.block_on(async {
        let mut aggregation: Option<Aggregation> = None;
        for slice in slices {
            let Slice { records, from } = slice?;
            let run = deployed(&mut aggregation, &settings, from)?;
            run.put(&records, from).await?;
            tally.lines += records.len() as u64;
            progress.set_position(tally.lines);
        }
        // An empty input still deploys, and finishes with no results.
        deployed(&mut aggregation, &settings, None)?;
        let run = aggregation.take().expect("deployed above");
        Ok::<Finished, CliError>(run.finish().await?)
    });
    reader.join().map_err(|_| {
        CliError::from("the thread reading the files stopped unexpectedly".to_owned())
    })?;
    let finished = finished?;
    progress.finish_and_clear();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in &finished.results {
        writeln!(out, "{line}").map_err(|e| format!("writing the results: {e}"))?;
    }
    out.flush()
        .map_err(|e| format!("writing the results: {e}"))?;
    eprint!("{}", summary(&finished, &tally));
    Ok(())
}

/// Lines put on the stream together: (partition key, line), and the first line's event time.
struct Slice {
    records: Vec<(String, Vec<u8>)>,
    from: Option<i64>,
}

/// Reads the files' lines into slices on a thread of its own; the receiver ends after the last
/// slice, or after an error.
fn read_slices(
    paths: Vec<PathBuf>,
    key: Pointer,
    time: Option<Pointer>,
) -> (
    mpsc::Receiver<Result<Slice, CliError>>,
    thread::JoinHandle<()>,
) {
    let (sender, receiver) = mpsc::sync_channel(2);
    let reader = thread::spawn(move || {
        let read = || -> Result<(), CliError> {
            let mut slice = Slice {
                records: Vec::with_capacity(SLICE),
                from: None,
            };
            for file in &paths {
                for line in lines(file)? {
                    let line = line?;
                    if slice.from.is_none() {
                        slice.from = time.as_ref().and_then(|t| event_time(t, &line));
                    }
                    slice.records.push((partition_key(&key, &line), line));
                    if slice.records.len() == SLICE {
                        let full = std::mem::replace(&mut slice.records, Vec::with_capacity(SLICE));
                        let from = slice.from.take();
                        if sender
                            .send(Ok(Slice {
                                records: full,
                                from,
                            }))
                            .is_err()
                        {
                            return Ok(());
                        }
                    }
                }
            }
            if !slice.records.is_empty() {
                let _ = sender.send(Ok(slice));
            }
            Ok(())
        };
        if let Err(e) = read() {
            let _ = sender.send(Err(e));
        }
    });
    (receiver, reader)
}

/// The aggregation, deployed on first use with the clock at `first` (the first slice's time).
fn deployed<'a>(
    aggregation: &'a mut Option<Aggregation>,
    settings: &Settings,
    first: Option<i64>,
) -> Result<&'a mut Aggregation, CliError> {
    if aggregation.is_none() {
        let epoch = first
            .filter(|_| settings.windows.is_some())
            .unwrap_or(EPOCH);
        *aggregation = Some(Aggregation::deploy(settings, epoch)?);
    }
    Ok(aggregation.as_mut().expect("deployed above"))
}

fn settings(options: &AggregateOptions) -> Result<Settings, CliError> {
    let mut aggregates = vec![Aggregate::Count];
    for name in &options.agg {
        let aggregate = Aggregate::parse(name.trim())
            .ok_or_else(|| format!("--agg {name}: expected count, sum, min, max or mean"))?;
        if !aggregates.contains(&aggregate) {
            aggregates.push(aggregate);
        }
    }
    if options.value.is_none() {
        if let Some(needs) = aggregates.iter().find(|a| a.needs_values()) {
            return Err(format!("--agg {}: needs --value", needs.name()).into());
        }
    }
    if options.shards == 0 {
        return Err("--shards must be at least 1".into());
    }
    let windows = options.window.map(|seconds| Windowing {
        seconds,
        time: options.time.clone().unwrap_or_default(),
        lateness_seconds: options.lateness,
    });
    Ok(Settings {
        key: options.key.clone(),
        value: options.value.clone(),
        aggregates,
        windows,
        shards: options.shards,
        flush: Duration::from_secs(60),
        faults: FaultPlan::default(),
    })
}

/// A line's partition key: its key, as the function reads it; a line without one goes under
/// "-" and is dead-lettered by the function with the reason.
fn partition_key(key: &Pointer, line: &[u8]) -> String {
    match key.find(line) {
        Ok(Some(raw)) => match string_of(raw) {
            Some(text) if !text.is_empty() => text.into_owned(),
            Some(_) => "-".to_owned(),
            None => String::from_utf8_lossy(raw).into_owned(),
        },
        _ => "-".to_owned(),
    }
}

/// A line's event time, when it has one the function can read.
fn event_time(time: &Pointer, line: &[u8]) -> Option<i64> {
    let raw = time.find(line).ok()??;
    match string_of(raw) {
        Some(text) => chrono::DateTime::parse_from_rfc3339(&text)
            .ok()
            .map(|t| t.timestamp_millis()),
        None => std::str::from_utf8(raw).ok()?.parse().ok(),
    }
}

/// A file's lines, decompressed when it is gzip; blank lines left out.
fn lines(path: &Path) -> Result<impl Iterator<Item = Result<Vec<u8>, CliError>>, CliError> {
    let name = path.display().to_string();
    let failed = move |e: std::io::Error| CliError::from(format!("{name}: {e}"));
    let mut file = BufReader::new(File::open(path).map_err(&failed)?);
    let gzip = file.fill_buf().map_err(&failed)?.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn BufRead> = if gzip {
        Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(file)))
    } else {
        Box::new(file)
    };
    Ok(reader
        .split(b'\n')
        .map(move |line| line.map_err(&failed))
        .filter(|line| !matches!(line, Ok(l) if l.iter().all(u8::is_ascii_whitespace))))
}

fn summary(finished: &Finished, tally: &Tally) -> String {
    let seconds = tally.started.elapsed().as_secs_f64();
    let late = finished
        .dead_letters
        .iter()
        .filter(|l| l.problem.starts_with("late:"))
        .count();
    format!(
        "keyway aggregate: {} lines in {seconds:.1} s ({:.0} lines/s), {} results, {} dead letters ({} late)\n",
        tally.lines,
        tally.lines as f64 / seconds.max(1e-9),
        finished.results.len(),
        finished.dead_letters.len() - late,
        late
    )
}
