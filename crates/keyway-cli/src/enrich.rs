//! `keyway enrich`: CloudTrail records through the identity enricher of template.yaml on the
//! embedded runtime, its events and feedback streams of N shards each, its timers swept on the
//! template's schedule. Records go in by slices, as a live stream would bring them; after each
//! slice the stack runs until idle, and what came out is written and dropped. The virtual clock
//! starts at the first record's time and keeps up with the trail's, so the enricher forgets a
//! key as it would live: its identity once its credentials expired, any key once nothing used it
//! for the lateness (an hour by default: the streams are trimmed after each slice, so nothing
//! comes back later). Memory follows the access keys in use, not the length of the trail.
//!
//! Every input record comes out exactly once: the driver derives the output id each record will
//! go out under (the enricher sends a record under its event's id, whichever record or timer
//! releases it: copies of one event share it, each copy taking one output), waits for it, and
//! drops a repeat. A record the enricher dead-letters (it is no CloudTrail record) is reported
//! with why instead, found by where it was put.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::time::Duration;

use identity_enricher::cloudtrail::CloudTrailRecord;
use identity_enricher::enricher::enriched_id;
use identity_enricher::identity::CustomerMap;
use keyway::domain::{DeadLetter, Origin, OutputId, SequenceNumber};
use keyway_local::{FaultPlan, LocalRuntime, LocalServices};
use serde_json::Value;

use crate::error::CliError;
use crate::times;
use identity_enricher::log_files::Entry;
use keyway_stack as stack;

/// Records put on the stream between two runs of the stack.
const SLICE: usize = 2_000;
/// Where the virtual clock starts when the trail does not say.
const EPOCH: i64 = 1_767_225_600_000;
/// How late a record may come after its time, as `keyway enrich` runs the enricher.
pub(crate) const LATENESS: Duration = Duration::from_secs(3600);

/// How the enricher is deployed for a run.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// Shards of the events stream and of the feedback stream.
    pub shards: usize,
    /// The customer map, a JSON object of account id to customer id.
    pub customer_map: String,
    pub buffer_ttl: Duration,
    /// The most roles a chain is followed through (the template's MaxChainDepth).
    pub max_chain_depth: usize,
    /// How late a record may come after its time (the template's RecordMaxAgeSeconds).
    pub lateness: Duration,
    /// When the virtual clock starts (epoch milliseconds): the trail's first record's time.
    pub start_millis: i64,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub(crate) struct Summary {
    pub records: u64,
    pub resolved: u64,
    /// Unresolved records by reason.
    pub unresolved: BTreeMap<String, u64>,
    /// Records the enricher could not read, with the first few reasons.
    pub dead_letters: u64,
    pub dead_letter_reasons: Vec<String>,
    /// Repeats of an output already written (none without faults).
    pub repeats: u64,
    /// The most records one key had waiting at once, as seen between slices.
    pub largest_buffer: usize,
    pub resolutions: u64,
    /// Records per shard of the events stream.
    pub shard_load: Vec<u64>,
    /// Stream time from a record's arrival on the events stream to its enriched output's.
    pub resolved_latency: Latency,
    pub unresolved_latency: Latency,
    pub virtual_time: Duration,
    /// What the state table was asked, as DynamoDB would bill it: reads, writes and calls.
    pub state_table: keyway_local::MeterSnapshot,
    /// The items the state table holds at the end: what the run's memory follows.
    pub state_items: usize,
}

impl Summary {
    /// The largest shard's load over the mean.
    pub(crate) fn skew(&self) -> f64 {
        let total: u64 = self.shard_load.iter().sum();
        let max = self.shard_load.iter().copied().max().unwrap_or(0);
        if total == 0 {
            return 1.0;
        }
        max as f64 * self.shard_load.len() as f64 / total as f64
    }
}

/// Latencies in buckets of 100 ms: percentiles in bounded memory, however many records.
#[derive(Clone, Debug, Default)]
pub(crate) struct Latency {
    buckets: BTreeMap<i64, u64>,
    count: u64,
}

impl Latency {
    const BUCKET_MILLIS: i64 = 100;

    pub(crate) fn add(&mut self, millis: i64) {
        *self
            .buckets
            .entry(millis.max(0) / Self::BUCKET_MILLIS)
            .or_default() += 1;
        self.count += 1;
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// The `p`-th percentile in seconds (the upper edge of its bucket), if any was added.
    pub(crate) fn percentile(&self, p: f64) -> Option<f64> {
        let rank = ((self.count as f64) * p / 100.0).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return Some(((bucket + 1) * Self::BUCKET_MILLIS) as f64 / 1000.0);
            }
        }
        None
    }
}

/// Where a record was put: its origin (`stream/shard`) and sequence number, as its dead letter
/// names them.
type At = (String, String);

/// A record put on the stream and not yet out.
struct Pending {
    key: String,
    /// The id it goes out under: its event's, shared by a copy of the event elsewhere in the trail.
    id: OutputId,
    since: i64,
    /// Where it was read from.
    place: String,
}

/// The stack and the bookkeeping of one run.
pub(crate) struct Run {
    runtime: LocalRuntime,
    services: std::sync::Arc<LocalServices>,
    events: String,
    feedback: String,
    state_table: String,
    enriched: String,
    dead_letters: String,
    pending: HashMap<At, Pending>,
    /// The records not yet out under each output id, first put first: an event the trail holds
    /// twice goes out twice under one id.
    by_id: HashMap<OutputId, VecDeque<At>>,
    /// Records waiting, by key.
    waiting: HashMap<String, usize>,
    shards: BTreeMap<String, u64>,
    summary: Summary,
    customers: CustomerMap,
    buffer_ttl: Duration,
    start_millis: i64,
    /// The time each slice's records are judged by: one far from it moves no clock.
    reference: times::Reference,
}

impl Run {
    /// Deploys template.yaml with `settings` on a fresh embedded runtime (no faults).
    pub(crate) fn deploy(settings: &Settings) -> Result<Self, CliError> {
        let customers = CustomerMap::from_json(&settings.customer_map).map_err(|e| {
            format!("the customer map: expected a JSON object of account id to customer id: {e}")
        })?;
        let parameters: BTreeMap<String, String> = [
            ("CloudTrailShards", settings.shards.to_string()),
            ("FeedbackShards", settings.shards.to_string()),
            ("CustomerMap", settings.customer_map.clone()),
            (
                "BufferTtlSeconds",
                settings.buffer_ttl.as_secs().to_string(),
            ),
            ("MaxChainDepth", settings.max_chain_depth.to_string()),
            (
                "RecordMaxAgeSeconds",
                settings.lateness.as_secs().to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let services = LocalServices::new(settings.start_millis, FaultPlan::default());
        let runtime = LocalRuntime::from_template_with(
            stack::TEMPLATE,
            &parameters,
            services.clone(),
            &stack::functions(),
        )?;
        let resource = |id: &str| {
            runtime
                .resource(id)
                .ok_or_else(|| CliError::from(format!("template.yaml has no {id}")))
        };
        Ok(Self {
            events: resource("CloudTrailStream")?,
            state_table: resource("StateTable")?,
            feedback: resource("FeedbackStream")?,
            enriched: resource("EnrichedStream")?,
            dead_letters: resource("DeadLetterQueue")?,
            runtime,
            services,
            pending: HashMap::new(),
            by_id: HashMap::new(),
            waiting: HashMap::new(),
            shards: BTreeMap::new(),
            summary: Summary::default(),
            customers,
            buffer_ttl: settings.buffer_ttl,
            start_millis: settings.start_millis,
            reference: times::Reference::default(),
        })
    }

    /// Runs every entry of `entries` through the stack, writing each enriched record as a line
    /// of `out`; `progress` hears how many records went in so far.
    pub(crate) async fn enrich(
        mut self,
        entries: impl Iterator<Item = Result<Entry, CliError>>,
        out: &mut dyn Write,
        progress: &dyn Fn(u64),
    ) -> Result<Summary, CliError> {
        let mut slice = Vec::with_capacity(SLICE);
        for entry in entries {
            slice.push(entry?);
            if slice.len() == SLICE {
                self.slice(std::mem::take(&mut slice), out).await?;
                progress(self.summary.records);
            }
        }
        self.slice(slice, out).await?;
        progress(self.summary.records);
        self.drain_timers(out).await?;
        let now = keyway::ports::Clock::now_millis(self.services.clock.as_ref());
        self.summary.virtual_time = Duration::from_millis((now - self.start_millis) as u64);
        self.summary.shard_load = self.shards.values().copied().collect();
        if let Some(table) = self.services.dynamodb.table(&self.state_table) {
            self.summary.state_table = table.meter().snapshot();
            self.summary.state_items = table.len();
        }
        Ok(self.summary)
    }

    /// Puts one slice on the events stream, runs the stack until idle, and writes what came out.
    async fn slice(&mut self, entries: Vec<Entry>, out: &mut dyn Write) -> Result<(), CliError> {
        if entries.is_empty() {
            return Ok(());
        }
        let times: Vec<i64> = entries.iter().filter_map(event_time).collect();
        let newest = self.reference.of(&times).and_then(|reference| {
            let near = times
                .iter()
                .copied()
                .filter(|&at| times::near(at, reference));
            near.max()
        });
        self.keep_up_with(newest, out).await?;
        let places: Vec<String> = entries.iter().map(|e| e.place().to_owned()).collect();
        let (records, events): (Vec<_>, Vec<_>) = entries
            .into_iter()
            .map(|entry| partitioned(entry, &self.customers))
            .unzip();
        let positions = self
            .services
            .kinesis
            .put_in_order(&self.events, &records)
            .await
            .map_err(|e| e.to_string())?;
        let now = keyway::ports::Clock::now_millis(self.services.clock.as_ref());
        let put = records.into_iter().zip(events).zip(positions).zip(places);
        for ((((key, _), event), (shard, sequence)), place) in put {
            let at = (format!("{}/{shard}", self.events), sequence);
            let sequence = SequenceNumber::parse(&at.1).map_err(|e| e.to_string())?;
            let origin = Origin(at.0.clone());
            let id = enriched_id(event.as_ref(), &origin, &sequence);
            *self.shards.entry(shard).or_default() += 1;
            *self.waiting.entry(key.clone()).or_default() += 1;
            self.by_id
                .entry(id.clone())
                .or_default()
                .push_back(at.clone());
            let pending = Pending {
                key,
                id,
                since: now,
                place,
            };
            self.pending.insert(at, pending);
            self.summary.records += 1;
        }
        self.runtime
            .run_until_idle(Duration::from_secs(24 * 3600))
            .await?;
        self.collect(out)?;
        if let Some(most) = self.waiting.values().copied().max() {
            self.summary.largest_buffer = self.summary.largest_buffer.max(most);
        }
        Ok(())
    }

    /// Runs the stack on until the virtual clock reads `newest`, a slice's newest record's time
    /// near its others' (`times::near`), writing what comes out: the trail's time passes
    /// for the enricher's state as it would live.
    async fn keep_up_with(
        &mut self,
        newest: Option<i64>,
        out: &mut dyn Write,
    ) -> Result<(), CliError> {
        let now = keyway::ports::Clock::now_millis(self.services.clock.as_ref());
        let behind = newest.map_or(0, |t| t.saturating_sub(now).max(0));
        // A step at a time: a trail quiet for days would have the records its timers sent
        // meanwhile dropped from the enriched stream unread.
        for step in stack::clock_steps(Duration::from_millis(behind as u64)) {
            self.runtime.run_for(step).await;
            self.collect(out)?;
        }
        Ok(())
    }

    /// After the last slice: the stack runs on, a minute at a time, until the timers of the
    /// records still waiting have sent them out.
    async fn drain_timers(&mut self, out: &mut dyn Write) -> Result<(), CliError> {
        let give_up = self.buffer_ttl + Duration::from_secs(15 * 60);
        let mut waited = Duration::ZERO;
        while !self.pending.is_empty() {
            if waited > give_up {
                return Err(format!(
                    "{} records still wait {} s after the last one went in: the enricher's timers did not send them out",
                    self.pending.len(),
                    waited.as_secs()
                )
                .into());
            }
            self.runtime.run_for(Duration::from_secs(60)).await;
            waited += Duration::from_secs(60);
            self.collect(out)?;
        }
        Ok(())
    }

    /// Writes the enriched records that came out, accounts the dead letters and resolutions,
    /// and drops what the streams hold (every mapping is idle: nothing reads them again).
    fn collect(&mut self, out: &mut dyn Write) -> Result<(), CliError> {
        let services = self.services.clone();
        let kinesis = &services.kinesis;
        kinesis.trim(&self.events);
        self.summary.resolutions += kinesis.trim(&self.feedback).len() as u64;
        // Dead letters first: they name where their record was put, while an output's id may
        // stand for several copies of an event, of which it takes the first still waiting.
        self.collect_dead_letters()?;
        for record in kinesis.trim(&self.enriched) {
            let body: Value = serde_json::from_slice(&record.data).map_err(|e| e.to_string())?;
            let id = OutputId(
                body["enrichment"]["outputId"]
                    .as_str()
                    .ok_or("an enriched record without enrichment.outputId")?
                    .to_owned(),
            );
            let Some(pending) = self.out_under(&id) else {
                self.summary.repeats += 1;
                continue;
            };
            let enrichment = &body["enrichment"];
            let latency = record.arrival_millis - pending.since;
            match enrichment["status"].as_str() {
                Some("resolved") => {
                    self.summary.resolved += 1;
                    self.summary.resolved_latency.add(latency);
                }
                _ => {
                    let reason = enrichment["reason"].as_str().unwrap_or("").to_owned();
                    *self.summary.unresolved.entry(reason).or_default() += 1;
                    self.summary.unresolved_latency.add(latency);
                }
            }
            out.write_all(&record.data)
                .and_then(|()| out.write_all(b"\n"))
                .map_err(CliError::writing("the enriched records"))?;
        }
        Ok(())
    }

    /// Accounts the dead letters, each for the record put where it names.
    fn collect_dead_letters(&mut self) -> Result<(), CliError> {
        let services = self.services.clone();
        for message in services.sqs.receive(&self.dead_letters, usize::MAX) {
            let letter: DeadLetter =
                serde_json::from_str(&message.body).map_err(|e| e.to_string())?;
            let (Some(origin), Some(sequence)) = (&letter.origin, &letter.sequence_number) else {
                return Err(format!(
                    "a dead letter without its record's position: {}",
                    message.body
                )
                .into());
            };
            if let Some(pending) = self.done(&(origin.clone(), sequence.clone())) {
                self.summary.dead_letters += 1;
                if self.summary.dead_letter_reasons.len() < 5 {
                    let reason = format!("{}: {}: {}", pending.place, letter.field, letter.problem);
                    self.summary.dead_letter_reasons.push(reason);
                }
            }
        }
        Ok(())
    }

    /// The first pending record going out under `id`, now out; `None` for a repeat.
    fn out_under(&mut self, id: &OutputId) -> Option<Pending> {
        let at = self.by_id.get(id)?.front()?.clone();
        self.done(&at)
    }

    /// The pending record put `at`, now out; `None` for a repeat.
    fn done(&mut self, at: &At) -> Option<Pending> {
        let pending = self.pending.remove(at)?;
        if let Some(ats) = self.by_id.get_mut(&pending.id) {
            ats.retain(|a| a != at);
            if ats.is_empty() {
                self.by_id.remove(&pending.id);
            }
        }
        if let Some(count) = self.waiting.get_mut(&pending.key) {
            *count -= 1;
            if *count == 0 {
                self.waiting.remove(&pending.key);
            }
        }
        Some(pending)
    }
}

/// When the entry's record happened (epoch milliseconds), if it is a record that says.
pub(crate) fn event_time(entry: &Entry) -> Option<i64> {
    let Entry::Record { value, .. } = entry else {
        return None;
    };
    let record = value
        .get("detail")
        .filter(|d| d.is_object())
        .unwrap_or(value);
    let text = record.get("eventTime")?.as_str()?;
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// An entry as a producer puts it on the events stream: under its caller's partition key, or,
/// for what is no CloudTrail record, under a key of its own (the enricher dead-letters it).
fn partitioned(
    entry: Entry,
    customers: &CustomerMap,
) -> ((String, Vec<u8>), Option<CloudTrailRecord>) {
    match entry {
        Entry::Record { value, .. } => {
            let data = serde_json::to_vec(&value).expect("a JSON value serializes");
            match CloudTrailRecord::parse(value) {
                Ok(record) => ((record.partition_key(customers), data), Some(record)),
                Err(_) => (("unreadable".to_owned(), data), None),
            }
        }
        Entry::Unreadable { text, .. } => (("unreadable".to_owned(), text.into_bytes()), None),
    }
}

/// `keyway enrich`'s arguments.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// A JSON object of account id to customer id (each account is its own customer if
    /// left out).
    #[arg(long)]
    pub customer_map: Option<std::path::PathBuf>,
    /// Shards of the events stream and of the feedback stream.
    #[arg(long, default_value_t = 4)]
    pub shards: usize,
    /// Randomises the arrival order (within windows of 10,000 records) with this seed.
    #[arg(long)]
    pub shuffle: Option<u64>,
    /// Seconds a record waits for its caller's identity before it goes out unresolved.
    #[arg(long, default_value_t = 900)]
    pub buffer_ttl: u64,
    /// The most roles a role chain is followed through: the records of a key issued deeper
    /// go out unresolved, saying the limit was reached.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub max_chain_depth: u64,
    /// Seconds a record may come after its time (the trail's disorder): the enricher keeps
    /// an identity that long past its credentials' expiration, and an unused key that long.
    #[arg(long, default_value_t = 3600)]
    pub lateness: u64,
    /// CloudTrail log files (gzipped or not), JSON Lines of records, single records, or
    /// directories of them.
    #[arg(required = true)]
    pub paths: Vec<std::path::PathBuf>,
}

/// Enriches the records under `options.paths` to standard output, a progress bar and the summary
/// to standard error.
pub(crate) fn run(options: Args) -> Result<(), CliError> {
    if options.shards == 0 {
        return Err(CliError::option("--shards", "must be at least 1"));
    }
    let lateness = Duration::from_secs(options.lateness);
    if lateness < Duration::from_secs(60) {
        return Err(CliError::option(
            "--lateness",
            "must be at least 60 seconds, as a mapping's record age",
        ));
    }
    let customer_map = match &options.customer_map {
        Some(path) => std::fs::read_to_string(path).map_err(CliError::file(path))?,
        None => "{}".to_owned(),
    };
    let trail = identity_enricher::log_files::Trail::open(&options.paths)?
        .map(|entry| entry.map_err(CliError::from));
    let entries: Box<dyn Iterator<Item = Result<Entry, CliError>>> = match options.shuffle {
        Some(seed) => Box::new(identity_enricher::log_files::Shuffled::new(
            trail, seed, 10_000,
        )),
        None => Box::new(trail),
    };
    let mut entries = entries.peekable();
    let start_millis = match entries.peek() {
        Some(Ok(entry)) => event_time(entry).unwrap_or(EPOCH),
        _ => EPOCH,
    };
    let settings = Settings {
        shards: options.shards,
        customer_map,
        buffer_ttl: Duration::from_secs(options.buffer_ttl),
        max_chain_depth: options.max_chain_depth as usize,
        lateness,
        start_millis,
    };
    let progress = indicatif::ProgressBar::new_spinner();
    progress.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    progress.set_style(
        indicatif::ProgressStyle::with_template("  {spinner} {pos} records enriched, {per_sec}")
            .map_err(|e| e.to_string())?,
    );
    // Virtual time: batching windows and the buffer TTL pass instantly.
    let runtime = crate::job::runtime_builder(true);
    let started = std::time::Instant::now();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let summary = runtime.block_on(async {
        let run = Run::deploy(&settings)?;
        run.enrich(entries, &mut out, &|n| progress.set_position(n))
            .await
    })?;
    out.flush()
        .map_err(CliError::writing("the enriched records"))?;
    progress.finish_and_clear();
    eprint!("{}", report(&summary, &settings, started.elapsed()));
    Ok(())
}

/// The summary as `keyway enrich` prints it.
pub(crate) fn report(summary: &Summary, settings: &Settings, wall: Duration) -> String {
    let percent = |n: u64| 100.0 * n as f64 / summary.records.max(1) as f64;
    let mut text = format!(
        "keyway enrich: {} records in {:.1} s ({:.0} records/s), {} shards, buffer TTL {} s\n",
        summary.records,
        wall.as_secs_f64(),
        summary.records as f64 / wall.as_secs_f64().max(1e-9),
        settings.shards,
        settings.buffer_ttl.as_secs()
    );
    text += &format!(
        "  resolved             {:>10}  {:.2}%\n",
        summary.resolved,
        percent(summary.resolved)
    );
    for (reason, n) in &summary.unresolved {
        text += &format!(
            "  unresolved           {n:>10}  {:.2}%  {reason}\n",
            percent(*n)
        );
    }
    text += &format!("  dead letters         {:>10}\n", summary.dead_letters);
    for reason in &summary.dead_letter_reasons {
        text += &format!("                                   {reason}\n");
    }
    text += &format!(
        "  resolutions published{:>10}\n  largest buffer       {:>10}  records of one key waiting at once\n",
        summary.resolutions, summary.largest_buffer
    );
    let loads: Vec<String> = summary.shard_load.iter().map(u64::to_string).collect();
    text += &format!(
        "  per-shard load       {}  (max/mean {:.2})\n",
        loads.join(" "),
        summary.skew()
    );
    for (what, latency) in [
        ("resolved", &summary.resolved_latency),
        ("unresolved", &summary.unresolved_latency),
    ] {
        if let (Some(p50), Some(p99), Some(max)) = (
            latency.percentile(50.0),
            latency.percentile(99.0),
            latency.percentile(100.0),
        ) {
            text += &format!(
                "  latency, {what:<10}   {:>10}  p50 {p50:.1} s, p99 {p99:.1} s, max {max:.1} s (stream time, arrival to output)\n",
                latency.count()
            );
        }
    }
    let per_1000 = |x: f64| x * 1000.0 / summary.records.max(1) as f64;
    text += &format!(
        "  DynamoDB             {:>10.1}  capacity units per 1,000 records ({:.1} read, {:.1} write)\n",
        per_1000(summary.state_table.capacity_units()),
        per_1000(summary.state_table.read_units),
        per_1000(summary.state_table.write_units)
    );
    text += &format!("  state items at end   {:>10}\n", summary.state_items);
    if summary.repeats > 0 {
        text += &format!("  repeats dropped      {:>10}\n", summary.repeats);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use identity_enricher::traffic::{Traffic, TrafficConfig};

    fn entries(values: Vec<Value>) -> impl Iterator<Item = Result<Entry, CliError>> {
        values.into_iter().enumerate().map(|(i, value)| {
            Ok(Entry::Record {
                place: format!("generated#{i}"),
                value,
            })
        })
    }

    #[test]
    fn latency_percentiles_are_the_upper_edges_of_their_tenth_of_a_second() {
        let mut latency = Latency::default();
        assert_eq!(latency.percentile(50.0), None);
        for millis in [50, 120, 130, 990, 61_000] {
            latency.add(millis);
        }
        assert_eq!(latency.count(), 5);
        assert_eq!(latency.percentile(0.0), Some(0.1));
        assert_eq!(latency.percentile(50.0), Some(0.2));
        assert_eq!(latency.percentile(80.0), Some(1.0));
        assert_eq!(latency.percentile(100.0), Some(61.1));
    }

    /// The clock ran over the trail's two quiet days in one go, and the records whose timers sent
    /// them out meanwhile had left the enriched stream, which keeps a record a day, before they
    /// were read: the run waited for them, and failed. A record stamped 9999-12-31 would have run
    /// the clock toward it a minute's sweep at a time, for ever; it moves no clock.
    #[tokio::test(start_paused = true)]
    async fn a_trail_quiet_for_days_or_stamped_far_ahead_still_gives_every_record_once() {
        let config = TrafficConfig {
            orphan_share: 0.05,
            ..TrafficConfig::default()
        };
        let settings = Settings {
            shards: 2,
            customer_map: Traffic::customer_map_json(&config),
            buffer_ttl: Duration::from_secs(300),
            max_chain_depth: 10,
            lateness: LATENESS,
            start_millis: EPOCH,
        };
        let mut records: Vec<Value> = Traffic::new(config, 3 * SLICE).unwrap().collect();
        let later = |record: &mut Value, by: chrono::Duration| {
            let at = chrono::DateTime::parse_from_rfc3339(record["eventTime"].as_str().unwrap())
                .unwrap();
            record["eventTime"] =
                Value::from((at + by).to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
        };
        for record in &mut records[SLICE + SLICE / 2..] {
            later(record, chrono::Duration::days(2));
        }
        let far = records.len() - 10;
        records[far]["eventTime"] = Value::from("9999-12-31T23:59:59Z");
        // The last slice, one record stamped far ahead: the slice before judges it.
        let mut last = records[far].clone();
        last["eventID"] = Value::from("far-and-last");
        records.push(last);
        let mut out = Vec::new();
        let summary = Run::deploy(&settings)
            .unwrap()
            .enrich(entries(records.clone()), &mut out, &|_| {})
            .await
            .unwrap();
        let mut ids: Vec<String> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["eventID"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        ids.sort_unstable();
        let mut expected: Vec<String> = records
            .iter()
            .map(|r| r["eventID"].as_str().unwrap().to_owned())
            .collect();
        expected.sort_unstable();
        assert_eq!(ids, expected, "every record once");
        assert!(summary.unresolved.values().sum::<u64>() > 0, "{summary:?}");
        assert!(
            summary.virtual_time < Duration::from_secs(4 * 86_400),
            "{summary:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn every_record_comes_out_once_and_the_summary_accounts_for_each_an_events_copy_too() {
        let config = TrafficConfig {
            orphan_share: 0.05,
            ..TrafficConfig::default()
        };
        let settings = Settings {
            shards: 3,
            customer_map: Traffic::customer_map_json(&config),
            buffer_ttl: Duration::from_secs(300),
            max_chain_depth: 10,
            lateness: LATENESS,
            start_millis: EPOCH,
        };
        let mut records: Vec<Value> = Traffic::new(config, 6_000).unwrap().collect();
        // A trail holding an event twice (CloudTrail delivers some more than once): it goes out
        // twice, under one id.
        records.push(records[10].clone());
        let mut input: Vec<Result<Entry, CliError>> = entries(records.clone()).collect();
        input.push(Ok(Entry::Unreadable {
            place: "trail.jsonl:7".into(),
            text: "{not json".into(),
        }));
        let mut out = Vec::new();
        let summary = Run::deploy(&settings)
            .unwrap()
            .enrich(input.into_iter(), &mut out, &|_| {})
            .await
            .unwrap();
        let lines: Vec<Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let mut ids: Vec<&str> = lines
            .iter()
            .map(|l| l["eventID"].as_str().unwrap())
            .collect();
        ids.sort_unstable();
        let mut expected: Vec<&str> = records
            .iter()
            .map(|r| r["eventID"].as_str().unwrap())
            .collect();
        expected.sort_unstable();
        assert_eq!(ids, expected, "every record once");
        assert_eq!(summary.records, 6_002);
        let unresolved: u64 = summary.unresolved.values().sum();
        assert_eq!(summary.resolved + unresolved, 6_001);
        assert!(unresolved > 0 && summary.largest_buffer > 0, "{summary:?}");
        assert_eq!(summary.resolved_latency.count(), summary.resolved);
        assert!(summary.resolved_latency.percentile(50.0).unwrap() < 10.0);
        let waited = summary.unresolved_latency.percentile(50.0).unwrap();
        assert!(
            (300.0..=361.0).contains(&waited),
            "TTL and a sweep: {waited}"
        );
        assert_eq!(summary.dead_letters, 1);
        assert!(summary.dead_letter_reasons[0].starts_with("trail.jsonl:7: data: "));
        assert_eq!(summary.shard_load.iter().sum::<u64>(), 6_002);
        assert!(summary.resolutions > 0);
        assert_eq!(summary.repeats, 0);
    }
}
