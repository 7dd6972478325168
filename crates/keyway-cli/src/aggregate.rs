//! `keyway aggregate`: JSON Lines files (gzipped or not) through keyed aggregation's two functions
//! on the embedded runtime (`keyway_stack::aggregation`): each line a Kinesis record under its
//! key's partition key, a slice at a time, so that a long file runs in bounded memory. Results go
//! to stdout as JSON lines, `{"key": K, "window_start": MS, "count": N, ...}`, by key and window;
//! a summary with lines a second and the dead letters (late records apart) to stderr, with a
//! progress line while it runs.
//!
//! The stream's shards are split into shares, one per shard up to four per core: each share runs
//! on an embedded runtime and a thread of its own, and the reader sends each line to the share
//! that owns its shard. A key's lines all go to one share, so the shares' results only need
//! putting in order.
//!
//! With windows every share's virtual clock starts at the first line's event time and keeps up
//! with the lines' as they go in, so a recorded stream's windows close as they would have live.
//! Which lines are late can depend on where slices begin, and on the few seconds of virtual time
//! a share takes to run its part of a slice; without windows nothing depends on either.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufReader, Read as _, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;

use keyed_aggregate::aggregate::Aggregate;
use keyway::adapters::kinesis::RECORD_MAX_BYTES;
use keyway::domain::hash::{is_partition_key, shard_for_hash, xxh3_128_hex, HashKeys};
use keyway::domain::pointer::{string_of, Pointer};
use keyway_local::FaultPlan;
use keyway_stack::aggregation::{Aggregation, EventTimes, Finished, Settings, Windowing};

use crate::error::CliError;
use crate::times;

/// Lines put on the stream at a time, all shares together.
const SLICE: usize = 20_000;
/// The virtual clock's start when the lines carry no time to start from.
const EPOCH: i64 = 1_767_225_600_000;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
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
    /// Records per invocation at most: Lambda's largest for a Kinesis mapping by default, where
    /// the stack deploys 500; the 6 MB payload limit caps it for long lines.
    #[arg(long, default_value_t = 10_000)]
    pub batch_size: usize,
    /// JSON Lines files, gzipped or not. A plain file is mapped, not copied: it must not change
    /// during the run (one that may goes through a pipe: `cat f | keyway aggregate ...
    /// /dev/stdin`).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

pub(crate) fn run(options: Args) -> Result<(), CliError> {
    crate::allocator::keep_freed_memory();
    let settings = settings(&options)?;
    let key = Pointer::parse(&options.key).map_err(|e| CliError::option("--key", e))?;
    let time = match &settings.windows {
        Some(w) => Some(Pointer::parse(&w.time).map_err(|e| CliError::option("--time", e))?),
        None => None,
    };
    let progress = indicatif::ProgressBar::new_spinner();
    progress.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    progress.set_style(
        indicatif::ProgressStyle::with_template("  {spinner} {pos} lines aggregated, {per_sec}")
            .map_err(|e| e.to_string())?,
    );
    let started = Instant::now();
    let shares = shares(settings.shards);
    let (senders, workers): (Vec<_>, Vec<_>) = (0..shares)
        .map(|share| {
            let settings = share_settings(&settings, share, shares);
            spawn_share(settings, progress.clone())
        })
        .unzip();
    let reader = read_slices(options.paths.clone(), key, time, senders, settings.shards);
    let read = reader.join().map_err(|_| stopped("reading the files"))?;
    // Every share is joined before an error is reported: the reader's error comes first (the
    // shares end with its channels, having aggregated what it read), then the first share's.
    let finished: Vec<Result<Finished, CliError>> = workers
        .into_iter()
        .map(|w| w.join().map_err(|_| stopped("aggregating"))?)
        .collect();
    let read = read?;
    let finished = Finished::merge(finished.into_iter().collect::<Result<Vec<_>, _>>()?);
    progress.finish_and_clear();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in &finished.results {
        writeln!(out, "{line}").map_err(CliError::writing("the results"))?;
    }
    out.flush().map_err(CliError::writing("the results"))?;
    eprint!("{}", summary(&finished, &read, started.elapsed()));
    Ok(())
}

/// A thread that panicked: a bug, said as such.
fn stopped(what: &str) -> CliError {
    CliError::from(format!("the thread {what} stopped unexpectedly"))
}

/// Into how many shares the stream's shards are split, each run on a thread of its own: one per
/// shard, up to four per core. Keys never cross shares, so each share's results are final. More
/// shares than cores let the system even out shards of uneven load: a Zipf stream's four shards
/// split over two cores by shard number gave one core 59% of the lines (a run took 2.1 to 3.3 s
/// against 2.1 to 2.3 s with a share per shard, in four alternating pairs).
fn shares(shards: usize) -> usize {
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    shards.min(4 * cores).max(1)
}

/// A share's settings: as many shards as it owns of the stream's (those whose number modulo
/// `shares` is `share`), on a stream of its own.
fn share_settings(settings: &Settings, share: usize, shares: usize) -> Settings {
    Settings {
        shards: (settings.shards - share).div_ceil(shares),
        ..settings.clone()
    }
}

/// Runs a share through the functions on a thread and an embedded runtime of its own, slice by
/// slice as they come, and hands back its results once the slices end.
fn spawn_share(
    settings: Settings,
    progress: indicatif::ProgressBar,
) -> (
    mpsc::SyncSender<Slice>,
    thread::JoinHandle<Result<Finished, CliError>>,
) {
    let (sender, slices) = mpsc::sync_channel::<Slice>(2);
    let worker = thread::spawn(move || {
        crate::job::runtime_builder(true).block_on(async {
            let mut aggregation: Option<Aggregation> = None;
            for slice in slices {
                let run = deployed(&mut aggregation, &settings, slice.times.first)?;
                run.put(&slice.records(), slice.times).await?;
                progress.inc(slice.lines.len() as u64);
            }
            // An empty input still deploys, and finishes with no results.
            deployed(&mut aggregation, &settings, None)?;
            let run = aggregation.take().expect("deployed above");
            Ok(run.finish().await?)
        })
    });
    (sender, worker)
}

/// What the reader read: lines, and those too large for a Kinesis record.
#[derive(Default)]
struct Read {
    lines: u64,
    too_large: u64,
    /// Lines stamped far ahead of their slice's (`times::far_ahead`).
    far_ahead: u64,
}

/// A share's lines of a slice, each with its partition key. The lines are slices of the blocks
/// the reader read (`Lines`), which the stream's records share: no line is copied.
#[derive(Default)]
struct Slice {
    /// The lines' partition keys, end to end.
    keys: String,
    /// Each line, and where its partition key ends in `keys`.
    lines: Vec<(usize, Bytes)>,
    times: EventTimes,
}

impl Slice {
    fn push(&mut self, partition_key: &str, line: Bytes) {
        self.keys.push_str(partition_key);
        self.lines.push((self.keys.len(), line));
    }

    /// The records to put: (partition key, line).
    fn records(&self) -> Vec<(&str, Bytes)> {
        let mut key_start = 0;
        self.lines
            .iter()
            .map(|(key_end, line)| {
                let record = (&self.keys[key_start..*key_end], line.clone());
                key_start = *key_end;
                record
            })
            .collect()
    }
}

/// Reads the files' lines on a thread of its own, each to the share that owns its shard (one of
/// `shards`, by the partition key's MD5, as Kinesis assigns it), `SLICE` lines at a time in all.
/// Every share's lines of a slice go at once, with the slice's event times: each share's clock
/// then follows the whole stream's, whatever the number of shares, as one clock does live. Ends
/// with the files, on an error, or when a share stops taking slices; answers how many lines were
/// read.
fn read_slices(
    paths: Vec<PathBuf>,
    key: Pointer,
    time: Option<Pointer>,
    shares: Vec<mpsc::SyncSender<Slice>>,
    shards: usize,
) -> thread::JoinHandle<Result<Read, CliError>> {
    thread::spawn(move || {
        let mut router = Router {
            key,
            shards,
            slices: shares.iter().map(|_| Slice::default()).collect(),
            hash_keys: HashKeys::default(),
            pending: Vec::with_capacity(SLICE),
            reference: times::Reference::default(),
            read: Read::default(),
        };
        for file in &paths {
            let mut lines = Lines::open(file)?;
            while let Some(line) = lines.next_line()? {
                router.read.lines += 1;
                let at = time.as_ref().and_then(|t| event_time(t, &line));
                router.pending.push(Pending {
                    line,
                    at,
                    file,
                    number: router.read.lines,
                });
                if router.pending.len() == SLICE {
                    let times = router.route();
                    if !send(&mut router.slices, times, &shares) {
                        return Ok(router.read);
                    }
                }
            }
        }
        let times = router.route();
        send(&mut router.slices, times, &shares);
        Ok(router.read)
    })
}

/// A line read, waiting for the rest of its slice: the slice's times judge its own.
struct Pending<'a> {
    line: Bytes,
    at: Option<i64>,
    file: &'a Path,
    number: u64,
}

/// Sends the lines of a slice to their shares.
struct Router<'a> {
    key: Pointer,
    shards: usize,
    slices: Vec<Slice>,
    hash_keys: HashKeys,
    pending: Vec<Pending<'a>>,
    /// The time each slice's lines are judged by.
    reference: times::Reference,
    read: Read,
}

impl Router<'_> {
    /// Puts the pending lines in their shares' slices, but those no stream or clock takes, and
    /// says the slice's event times.
    fn route(&mut self) -> EventTimes {
        let mut times = EventTimes::default();
        let timed: Vec<i64> = self.pending.iter().filter_map(|p| p.at).collect();
        let reference = self.reference.of(&timed);
        let shares = self.slices.len();
        for Pending {
            line,
            at,
            file,
            number,
        } in self.pending.drain(..)
        {
            if let (Some(at), Some(reference)) = (at, reference) {
                if times::far_ahead(at, reference) {
                    eprintln!(
                        "keyway aggregate: {}: the input's line {number} is stamped {at}, more than 366 days ahead of its neighbours' ({reference}): dead-lettered",
                        file.display(),
                    );
                    self.read.far_ahead += 1;
                    continue;
                }
                if times::near(at, reference) {
                    times.first = times.first.or(Some(at));
                    times.newest = times.newest.max(Some(at));
                }
            }
            let partition_key = partition_key(&self.key, &line);
            if line.len() + partition_key.len() > RECORD_MAX_BYTES {
                // No Kinesis stream takes it: dead-lettered here, not the end of the run.
                eprintln!(
                    "keyway aggregate: {}: the input's line {number} has {} bytes, over a Kinesis record's 1 MiB: dead-lettered",
                    file.display(),
                    line.len()
                );
                self.read.too_large += 1;
                continue;
            }
            let hash_key = self.hash_keys.of(&partition_key);
            let shard = shard_for_hash(hash_key, self.shards as u32) as usize;
            self.slices[shard % shares].push(&partition_key, line.clone());
        }
        times
    }
}

/// Sends each share its lines of the slice, if it has any, and starts the next; false when a
/// share has stopped.
fn send(slices: &mut [Slice], times: EventTimes, shares: &[mpsc::SyncSender<Slice>]) -> bool {
    for (slice, share) in slices.iter_mut().zip(shares) {
        if slice.lines.is_empty() {
            continue;
        }
        let mut full = std::mem::take(slice);
        full.times = times;
        if share.send(full).is_err() {
            return false;
        }
    }
    true
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

fn settings(options: &Args) -> Result<Settings, CliError> {
    let mut aggregates = vec![Aggregate::Count];
    for name in &options.agg {
        let aggregate = Aggregate::parse(name.trim()).ok_or_else(|| {
            CliError::option(
                format!("--agg {name}"),
                "expected count, sum, min, max or mean",
            )
        })?;
        if !aggregates.contains(&aggregate) {
            aggregates.push(aggregate);
        }
    }
    if options.value.is_none() {
        if let Some(needs) = aggregates.iter().find(|a| a.needs_values()) {
            return Err(CliError::option(
                format!("--agg {}", needs.name()),
                "needs --value",
            ));
        }
    }
    if options.shards == 0 {
        return Err(CliError::option("--shards", "must be at least 1"));
    }
    if !(1..=10_000).contains(&options.batch_size) {
        return Err(CliError::option(
            "--batch-size",
            "must be from 1 to 10000, as Lambda takes it",
        ));
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
        batch_size: options.batch_size,
        flush: Duration::from_secs(60),
        faults: FaultPlan::default(),
    })
}

/// A line's partition key: its key, as the function reads it; a line without one goes under
/// "-" and is dead-lettered by the function with the reason. A key longer than Kinesis takes
/// (256 characters) goes under its hash: the function reads the key from the line.
fn partition_key<'a>(key: &Pointer, line: &'a [u8]) -> Cow<'a, str> {
    let text = key_text(key, line);
    if !is_partition_key(&text) {
        return Cow::Owned(xxh3_128_hex(&[text.as_bytes()]));
    }
    text
}

fn key_text<'a>(key: &Pointer, line: &'a [u8]) -> Cow<'a, str> {
    match key.find(line) {
        Ok(Some(raw)) => match string_of(raw) {
            Some(text) if !text.is_empty() => text,
            Some(_) => Cow::Borrowed("-"),
            None => String::from_utf8_lossy(raw),
        },
        _ => Cow::Borrowed("-"),
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

/// How much a read takes at a time.
const BLOCK: usize = 1 << 20;

/// A file's lines, decompressed when it is gzip; blank lines left out. Each line handed out is a
/// slice of a block, so that lines go on the stream without a copy. A plain file's one block is
/// the file, mapped; a gzip file or a pipe is read a block at a time, and only a line that runs
/// past its block's end is copied, into the next block.
struct Lines {
    name: String,
    reader: Box<dyn std::io::Read>,
    block: Bytes,
    /// Where the next line starts in `block`.
    at: usize,
    /// Whether `block` is the file's last.
    ended: bool,
}

impl Lines {
    fn open(path: &Path) -> Result<Self, CliError> {
        let name = path.display().to_string();
        let failed = |e: std::io::Error| CliError::from(format!("{name}: {e}"));
        let mut file = File::open(path).map_err(failed)?;
        if let Some(block) = mapped(&file) {
            return Ok(Self {
                name,
                reader: Box::new(std::io::empty()),
                block,
                at: 0,
                ended: true,
            });
        }
        // The first two bytes say gzip or not; they are read again, from here, with the rest,
        // which a plain file's blocks take from the file directly (a pipe works too).
        let mut magic = Vec::with_capacity(2);
        (&mut file)
            .take(2)
            .read_to_end(&mut magic)
            .map_err(failed)?;
        let gzip = magic == [0x1f, 0x8b];
        let whole = std::io::Cursor::new(magic).chain(file);
        let reader: Box<dyn std::io::Read> = if gzip {
            let compressed = BufReader::with_capacity(BLOCK, whole);
            Box::new(flate2::bufread::MultiGzDecoder::new(compressed))
        } else {
            Box::new(whole)
        };
        Ok(Self {
            name,
            reader,
            block: Bytes::new(),
            at: 0,
            ended: false,
        })
    }

    /// The next line that is not blank, without its newline; none at the end of the file.
    fn next_line(&mut self) -> Result<Option<Bytes>, CliError> {
        loop {
            if let Some(end) = memchr::memchr(b'\n', &self.block[self.at..]) {
                let line = self.block.slice(self.at..self.at + end);
                self.at += end + 1;
                if blank(&line) {
                    continue;
                }
                return Ok(Some(line));
            }
            if self.ended {
                // What is left is the file's last line, without a newline.
                let line = self.block.slice(self.at..);
                self.at = self.block.len();
                return Ok((!blank(&line)).then_some(line));
            }
            self.read_block()?;
        }
    }

    /// Reads the next block. The current one's rest begins a line, so it begins the next block,
    /// which holds at least twice as much: a line longer than a block is read whole. A block
    /// is read whole unless the file ends in it (a pipe's reader waits for it), and the file's
    /// last block is cut to its size, so that a small file's lines do not hold a whole block.
    fn read_block(&mut self) -> Result<(), CliError> {
        let rest = &self.block[self.at..];
        let mut next = Vec::with_capacity(BLOCK.max(2 * rest.len()));
        next.extend_from_slice(rest);
        let room = (next.capacity() - next.len()) as u64;
        let read = (&mut self.reader)
            .take(room)
            .read_to_end(&mut next)
            .map_err(|e| CliError::from(format!("{}: {e}", self.name)))?;
        // `read_to_end` stops short of the room only at the end of the file.
        self.ended = (read as u64) < room;
        if self.ended {
            next.shrink_to_fit();
        }
        self.block = Bytes::from(next);
        self.at = 0;
        Ok(())
    }
}

/// A plain regular file, mapped whole: its lines are slices of the page cache. Read a block at
/// a time, the command spent a third of its CPU time copying the blocks out of the page cache
/// and a tenth clearing the fresh memory they went to. None for a gzip file, a pipe, an empty
/// file, or a file that cannot be mapped: those are read.
fn mapped(file: &File) -> Option<Bytes> {
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() < 2 {
        return None;
    }
    // SAFETY: the map is only read, as a byte slice, and lives as long as a line of it does.
    // What the mapping cannot rule out is another process writing the file during the run: the
    // bytes of a line already checked would change under it, and a file cut shorter ends the
    // run (SIGBUS). The command's inputs are files at rest, as for any tool that maps its
    // input; `--help` says so, and a pipe (`cat file |`) is read instead.
    let map = unsafe { memmap2::Mmap::map(file) }.ok()?;
    if map[..2] == [0x1f, 0x8b] {
        return None;
    }
    // Read once, front to back: the kernel reads ahead and may drop what was read.
    let _ = map.advise(memmap2::Advice::Sequential);
    Some(Bytes::from_owner(map))
}

fn blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

fn summary(finished: &Finished, read: &Read, took: Duration) -> String {
    let seconds = took.as_secs_f64();
    let late = finished
        .dead_letters
        .iter()
        .filter(|l| l.problem.starts_with("late:"))
        .count();
    format!(
        "keyway aggregate: {} lines in {seconds:.1} s ({:.0} lines/s), {} results, {} dead letters ({} late)\n",
        read.lines,
        read.lines as f64 / seconds.max(1e-9),
        finished.results.len(),
        finished.dead_letters.len() - late + (read.too_large + read.far_ahead) as usize,
        late
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(mut lines: Lines) -> Vec<Vec<u8>> {
        let mut read = Vec::new();
        while let Some(line) = lines.next_line().unwrap() {
            read.push(line.to_vec());
        }
        read
    }

    /// The lines of a file of `text`, which a plain file maps, and the same read a block at a
    /// time, as from a pipe: both ways must give the same lines.
    fn lines_of(text: &[u8], name: &str) -> Vec<Vec<u8>> {
        let path = std::env::temp_dir().join(format!("keyway-lines-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let opened = all(Lines::open(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
        let piped = all(Lines {
            name: name.into(),
            reader: Box::new(std::io::Cursor::new(text.to_vec())),
            block: Bytes::new(),
            at: 0,
            ended: false,
        });
        if text.starts_with(&[0x1f, 0x8b]) {
            return opened;
        }
        assert_eq!(opened, piped, "{name}: mapped and read alike");
        opened
    }

    #[test]
    fn lines_are_read_whole_across_blocks_without_blank_ones_or_newlines() {
        // Lines longer than a block and than two, between lines that fit in one.
        let long = vec![b'x'; BLOCK + 100];
        let longer = vec![b'y'; 2 * BLOCK + 7];
        let mut text = b"a\n\n  \nb\r\n".to_vec();
        text.extend_from_slice(&long);
        text.extend_from_slice(b"\n");
        text.extend_from_slice(&longer);
        text.extend_from_slice(b"\nc");
        let expected = [b"a".to_vec(), b"b\r".to_vec(), long, longer, b"c".to_vec()];
        assert_eq!(lines_of(&text, "mixed"), expected);
        assert!(lines_of(b"\n \n", "blank").is_empty());
        assert!(lines_of(b"", "empty").is_empty());
        assert_eq!(lines_of(b"z", "one byte"), [b"z".to_vec()]);
        // Line ends at a block's last byte and at the next block's first.
        let mut edges = vec![b'p'; BLOCK - 1];
        edges.extend_from_slice(b"\nq\n");
        edges.extend(vec![b'r'; BLOCK - 3]);
        edges.extend_from_slice(b"\r\ns");
        let expected_edges = [
            vec![b'p'; BLOCK - 1],
            b"q".to_vec(),
            {
                let mut r = vec![b'r'; BLOCK - 3];
                r.push(b'\r');
                r
            },
            b"s".to_vec(),
        ];
        assert_eq!(lines_of(&edges, "edges"), expected_edges);

        // Two gzip members, one after the other, as `cat a.gz b.gz` makes them.
        let gzip = |text: &[u8]| {
            let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gzip.write_all(text).unwrap();
            gzip.finish().unwrap()
        };
        let mut members = gzip(&text[..3]);
        members.extend(gzip(&text[3..]));
        assert_eq!(lines_of(&members, "gzip"), expected);
    }
}
