//! Keyed aggregation on the embedded runtime, as `keyway aggregate` runs it: the first phase and
//! the merge (functions/keyed-aggregate) on their streams and a state table, as the stack wires
//! them, with the shards and batch size asked for. Records go in slice by slice; the virtual clock
//! keeps up with the records' event times when aggregating in windows, so that windows of a
//! recorded stream close as they would have live; `finish` runs the clock past the newest record
//! and the timers out, and takes each key's last result.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use keyed_aggregate::aggregate::Aggregate;
use keyed_aggregate::wiring::{aggregate_handler, merge_handler};
use keyway::adapters::dynamodb::TTL;
use keyway::domain::DeadLetter;
use keyway::ports::Clock;
use keyway_local::{FaultPlan, KeySchema, LocalError, LocalRuntime, LocalServices, MappingSource};
use serde_json::Value;

use crate::{failed, stack_mapping};

const STATE_TABLE: &str = "aggregate-state";
const EVENTS: &str = "aggregate-events";
const PARTIALS: &str = "aggregate-partials";
const RESULTS: &str = "aggregate-results";
/// The timer sweep's schedule, as the stack's.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// How long a slice may take to run out, in virtual time: retries back off for minutes at most.
const SETTLE_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// Tumbling event-time windows.
#[derive(Clone, Debug)]
pub struct Windowing {
    /// How long each window lasts, in seconds.
    pub seconds: u64,
    /// The JSON pointer to a record's event time (epoch milliseconds), such as `/at`.
    pub time: String,
    /// How long after its end a window still takes late records, in seconds.
    pub lateness_seconds: u64,
}

/// What to aggregate and on what.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The JSON pointer to a record's key, such as `/key`.
    pub key: String,
    /// The JSON pointer to the value aggregated: every aggregate but the count needs one.
    pub value: Option<String>,
    /// The aggregates each result gives.
    pub aggregates: Vec<Aggregate>,
    /// Event-time windows to aggregate in; none for running totals by key.
    pub windows: Option<Windowing>,
    /// Shards of the events stream and of the partials stream alike.
    pub shards: usize,
    /// The mappings' batch size (the stack's is 500; the 6 MB payload limit may cap it).
    pub batch_size: usize,
    /// How long a running total waits before it goes to the merge.
    pub flush: Duration,
    /// The faults the embedded services inject.
    pub faults: FaultPlan,
}

/// The event times of a slice of records, for aggregating in windows.
#[derive(Clone, Copy, Debug, Default)]
pub struct EventTimes {
    /// The first record's time: the clock catches up with it before the slice goes in.
    pub first: Option<i64>,
    /// The newest time of the slice's records: `finish` runs the clock past the newest of every
    /// slice, so that every window a record went into closes.
    pub newest: Option<i64>,
}

/// The two functions running on their streams.
pub struct Aggregation {
    services: Arc<LocalServices>,
    runtime: LocalRuntime,
    dead_letters: String,
    windows: Option<Windowing>,
    /// The newest event time of the records put.
    newest: Option<i64>,
    flush: Duration,
    /// Each key's (and window's) result with the highest count so far: counts only grow.
    results: BTreeMap<(String, Option<i64>), (u64, String)>,
}

/// What a run leaves.
pub struct Finished {
    /// The results as JSON lines, by key and window.
    pub results: Vec<String>,
    /// The records the functions gave up on, from the dead-letter queue.
    pub dead_letters: Vec<DeadLetter>,
}

impl Finished {
    /// The results and dead letters of runs over disjoint sets of keys (each key's records all
    /// went to one run), the results by key and window again.
    pub fn merge(parts: Vec<Finished>) -> Finished {
        let slot = |line: &String| {
            let body: Value = serde_json::from_str(line).unwrap_or_default();
            let key = body["key"].as_str().unwrap_or_default().to_owned();
            (key, body["window_start"].as_i64())
        };
        let mut results = Vec::new();
        let mut dead_letters = Vec::new();
        for part in parts {
            results.extend(part.results);
            dead_letters.extend(part.dead_letters);
        }
        results.sort_by_cached_key(slot);
        Finished {
            results,
            dead_letters,
        }
    }
}

impl Aggregation {
    /// Deploys the functions with the virtual clock at `epoch_millis` (the first record's time,
    /// for a recorded stream aggregated in windows).
    pub fn deploy(settings: &Settings, epoch_millis: i64) -> Result<Self, LocalError> {
        let services = LocalServices::new(epoch_millis, settings.faults.clone());
        services.dynamodb.create_table(
            STATE_TABLE,
            KeySchema::state_table(),
            Some(TTL.to_owned()),
            None,
        );
        services
            .kinesis
            .create_stream(EVENTS, settings.shards.max(1));
        services
            .kinesis
            .create_stream(PARTIALS, settings.shards.max(1));
        services.kinesis.create_stream(RESULTS, 1);
        let dead_letters = services.sqs.create_queue("aggregate-dead-letters");
        let env = environment(settings, &dead_letters);
        let mut runtime = LocalRuntime::new(services.clone());
        let mapping = stack_mapping(settings.batch_size, 2);
        let source = |stream: &str| MappingSource::Kinesis {
            kinesis: services.kinesis.clone(),
            stream: stream.to_owned(),
        };
        let first =
            aggregate_handler(services.as_ref(), &env).map_err(failed("keyed-aggregate"))?;
        let first = Arc::new(first);
        runtime.add_schedule(
            "keyed-aggregate/sweep",
            first.clone(),
            SWEEP_EVERY,
            SWEEP_EVERY,
        );
        runtime.add_mapping("keyed-aggregate", first, source(EVENTS), mapping.clone());
        let merge = merge_handler(services.as_ref(), &env).map_err(failed("aggregate-merge"))?;
        runtime.add_mapping(
            "aggregate-merge",
            Arc::new(merge),
            source(PARTIALS),
            mapping,
        );
        Ok(Self {
            services,
            runtime,
            dead_letters,
            windows: settings.windows.clone(),
            newest: None,
            flush: settings.flush,
            results: BTreeMap::new(),
        })
    }

    /// Puts a slice of records (partition key, data) on the events stream, which shares their
    /// data rather than copying it, and runs the functions until they are idle; with windows,
    /// first lets the virtual clock reach the slice's first event time, as a live stream's
    /// would have when that record came. (Not its newest: the slice's earlier records would be
    /// judged late by a clock they never saw.)
    pub async fn put<K: AsRef<str>>(
        &mut self,
        records: &[(K, Bytes)],
        times: EventTimes,
    ) -> Result<(), LocalError> {
        if self.windows.is_some() {
            self.newest = self.newest.max(times.newest);
            if let Some(first) = times.first {
                self.run_clock_to(first).await?;
            }
        }
        self.services
            .kinesis
            .put_shared_in_order(EVENTS, records)
            .await
            .map_err(failed(EVENTS))?;
        self.runtime.run_until_idle(SETTLE_LIMIT).await?;
        // Records read are dropped: a long file's run holds one slice at a time.
        self.services.kinesis.trim(EVENTS);
        self.take_results()
    }

    /// Runs the timers out (every window closed, every running total flushed and merged) and
    /// hands back each key's last result and the dead letters.
    pub async fn finish(mut self) -> Result<Finished, LocalError> {
        let last_close = match &self.windows {
            Some(w) => Duration::from_secs(w.seconds + w.lateness_seconds),
            None => self.flush,
        };
        // A slice's records after its first can be far ahead of the clock: their windows close
        // only once the clock has passed them too.
        if let Some(newest) = self.newest {
            self.run_clock_to(newest).await?;
        }
        self.run_clock_for(last_close + SWEEP_EVERY * 2).await?;
        self.runtime.run_until_idle(SETTLE_LIMIT).await?;
        self.take_results()?;
        let dead_letters = self
            .services
            .sqs
            .messages(&self.dead_letters)
            .iter()
            .map(|m| serde_json::from_str(&m.body))
            .collect::<Result<Vec<DeadLetter>, _>>()
            .map_err(failed("aggregate-dead-letters"))?;
        Ok(Finished {
            results: self.results.into_values().map(|(_, line)| line).collect(),
            dead_letters,
        })
    }

    /// Lets the virtual clock run, the functions with it, until `millis` if it is behind.
    async fn run_clock_to(&mut self, millis: i64) -> Result<(), LocalError> {
        let behind = millis.saturating_sub(self.services.clock.now_millis());
        if behind > 0 {
            self.run_clock_for(Duration::from_millis(behind as u64))
                .await?;
        }
        Ok(())
    }

    /// Lets the virtual clock run for `span`, taking the results a step at a time.
    async fn run_clock_for(&mut self, span: Duration) -> Result<(), LocalError> {
        for step in crate::clock_steps(span) {
            self.runtime.run_for(step).await;
            self.take_results()?;
        }
        Ok(())
    }

    fn take_results(&mut self) -> Result<(), LocalError> {
        for record in self.services.kinesis.trim(RESULTS) {
            let body: Value = serde_json::from_slice(&record.data).map_err(failed(RESULTS))?;
            let key = body["key"].as_str().unwrap_or_default().to_owned();
            let slot = (key, body["window_start"].as_i64());
            let count = body["count"].as_u64().unwrap_or(0);
            let entry = self.results.entry(slot).or_insert((0, String::new()));
            if count >= entry.0 {
                let line = String::from_utf8_lossy(&record.data).into_owned();
                *entry = (count, line);
            }
        }
        Ok(())
    }
}

/// Both functions' environment, as the stack's parameters make it.
fn environment(settings: &Settings, dead_letters: &str) -> keyway::lambda::Env {
    let aggregates: Vec<&str> = settings.aggregates.iter().map(|a| a.name()).collect();
    let mut env = vec![
        ("STATE_TABLE", STATE_TABLE.to_owned()),
        ("PARTIALS_SINK", format!("kinesis:{PARTIALS}")),
        ("RESULTS_SINK", format!("kinesis:{RESULTS}")),
        ("DEAD_LETTER_SINK", format!("sqs:{dead_letters}")),
        ("KEY_POINTER", settings.key.clone()),
        ("VALUE_POINTER", settings.value.clone().unwrap_or_default()),
        ("AGGREGATES", aggregates.join(",")),
        ("FLUSH_SECONDS", settings.flush.as_secs().max(1).to_string()),
        ("KEYWAY_REDELIVERY_WINDOW_SECONDS", "90000".to_owned()),
    ];
    if let Some(w) = &settings.windows {
        env.push(("WINDOW_SECONDS", w.seconds.to_string()));
        env.push(("TIME_POINTER", w.time.clone()));
        env.push(("ALLOWED_LATENESS_SECONDS", w.lateness_seconds.to_string()));
        // A recording's slice holds lines far ahead of the clock, which keeps up with them
        // only between slices.
        env.push(("MAX_AHEAD_SECONDS", i64::MAX.to_string()));
    }
    env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}
