//! The first phase: each key's records aggregated into a partial per window, under the key's own
//! state, or under one bucket's state when a producer salted the key (partition key `key#3`,
//! state key `~3~key`: a namespace no key's own state reaches, `keyway::domain::salt`). A batch
//! touches a key's state once however many of its records it holds (the executor loads, runs and
//! commits per key): the mini-batch pre-aggregation that keeps a hot key's writes to one a batch.
//!
//! Partials go to the merge (`merge`) only on the key's timers: a window's once it has closed (its
//! end plus the allowed lateness, on the runtime's clock) and every batch that read the clock
//! before then has ended (`settle`), a running total's a `flush` after its first change since the
//! last one. A record for a window already closed is late: dead-lettered with the reason and
//! counted nowhere; unless it reached the stream before the close and Lambda delivered it again
//! after (a failed batch retried), while its window waits in the key's state or, for a window
//! the key had not opened, within `REDELIVERY_GRACE_MILLIS` (`Window::late`). A window sent takes
//! nothing more: the key keeps the newest one's start (`SENT`).
//!
//! A timer fires in a sweep, a second writer of the key beside the stream's batches, and what it
//! sends depends on state those batches change: the partials go through the outbox (DESIGN §3),
//! sent after the commit that took them out of the state. Each carries its source (the key or
//! bucket) and a version (the time of its flush), newer for a later flush of the same source:
//! the merge keeps each source's newest and ignores a partial it has seen, so a partial sent
//! twice changes nothing.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use keyway::domain::salt::{state_key, unsalt};
use keyway::domain::{Payload, SourceRecord};
use keyway::operator::{
    timers, Delivery, Migration, MigrationError, NewState, OldState, SinkDescriptor,
    StateDescriptor,
};
use keyway::{Ctx, InvalidInput, KeyedOperator, MapState, ProcessError, Sink, ValueState};

use crate::aggregate::{window_start, Partial};
use crate::spec::{Reading, Spec, Windows};

/// The operator's name: part of its state keys and output ids.
pub const NAME: &str = "keyed-aggregate";

/// The slot of a running total, when not aggregating in windows.
pub const ALL: &str = "all";

/// A key's open partials, by window start (`ALL` without windows).
pub const OPEN: MapState<String, Open> = MapState::with_shape(
    "open",
    // Written out: an `Exact` is stored as its decimal text, which the tracer of state
    // structures cannot sample. It must change whenever the stored form does. The sum, a `Sum`
    // since sums outgrew 38 digits, is stored as the same decimal text (longer only past 38
    // digits), so what was stored before reads back unchanged and the signature stands.
    "Open { key: String, partial: Partial { count: u64, sum: Option<Exact>, min: Option<Exact>, \
     max: Option<Exact> }, flush_at: Option<i64> }, Exact as decimal text",
);

/// The start of the newest window the key sent to the merge: a record for it or an earlier
/// window is late, since a second partial of a window sent would be taken for the first or
/// replace it. It lives a day past the key's last flush, long past any redelivery's grace: a key
/// whose windows have all gone keeps nothing for good.
pub const SENT: ValueState<i64> = ValueState::new("sent").with_ttl(Duration::from_secs(86_400));

/// Partials on their way to the merge, partitioned by the original key.
pub const PARTIALS: Sink<PartialUpdate> = Sink::new("partials");

/// A partial being aggregated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    /// The records' own key (the state's key may be one of its buckets).
    pub key: String,
    /// The aggregate of the key's records in the window (or, for a running total, of all its
    /// records) under this state.
    pub partial: Partial,
    /// When it goes to the merge; none for a running total sent and unchanged since.
    pub flush_at: Option<i64>,
}

/// A source's partial of a key's window, as the merge receives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialUpdate {
    /// The records' own key, unsalted: what the merge keeps its results by.
    pub key: String,
    /// The window's start, epoch milliseconds; none for a running total.
    pub window_start: Option<i64>,
    /// The key or the bucket it was aggregated under.
    pub source: String,
    /// The time of its flush: a later partial of the same source and window has a higher one.
    pub version: i64,
    /// The source's aggregate of the key's records in the window so far: the merge keeps each
    /// source's newest and merges them.
    pub partial: Partial,
}

/// A record read, with the state it goes to.
#[derive(Clone, Debug)]
pub struct Input {
    /// The record's key, value and event time.
    pub reading: Reading,
    /// The bucket of its key the record's partition key names, if any.
    pub bucket: Option<u32>,
    /// The state it aggregates under: the key's own, or its bucket's (`salt::state_key`).
    pub state_key: String,
}

/// How long after its window closed a record that reached the stream before the close still
/// opens the window when Lambda delivers it only then (a batch failed at the close and retried:
/// seconds to minutes), if its key has not sent that window or a later one. Past it, the records
/// of a shard that stalled are late. The merge keeps a window far longer (a day unless set).
pub const REDELIVERY_GRACE_MILLIS: i64 = 15 * 60_000;

/// The first phase of keyed aggregation.
#[derive(Clone, Debug)]
pub struct KeyedAggregate {
    spec: Arc<Spec>,
}

impl KeyedAggregate {
    /// The first phase of the aggregation `spec` describes.
    pub fn new(spec: Arc<Spec>) -> Self {
        Self { spec }
    }

    /// Where a reading goes, or why it is too far ahead of the clock. Whether it is late depends
    /// on the key's windows too (`Window::late`).
    fn target(&self, reading: &Reading, now: i64, settle: i64) -> Result<Target, InvalidInput> {
        let (Some(windows), Some(time)) = (&self.spec.windows, reading.time) else {
            return Ok(Target {
                slot: ALL.to_owned(),
                window: None,
                flush_at: now + self.spec.flush.as_millis() as i64,
            });
        };
        if time > now.saturating_add(windows.ahead_millis) {
            return Err(InvalidInput::new(
                time_field(windows),
                format!(
                    "{time} is more than {} s ahead of the clock ({now}): its window would \
                     wait that long in its key's state",
                    windows.ahead_millis / 1000
                ),
            ));
        }
        let start = window_start(time, windows.size_millis);
        // Saturating: a time near i64's least (a JSON number can give it) is late.
        let end = start.saturating_add(windows.size_millis);
        let closes = end.saturating_add(windows.lateness_millis);
        Ok(Target {
            slot: start.to_string(),
            window: Some(Window { start, end, closes }),
            // A window opened after its close (by a record delivered again) goes as if it had
            // opened then.
            flush_at: closes.max(now).saturating_add(settle),
        })
    }
}

/// The field a record holds its event time in.
fn time_field(windows: &Windows) -> String {
    format!("data{}", windows.time.as_str())
}

/// A reading's slot, its window if any, and when the slot goes to the merge if the reading
/// opens it.
struct Target {
    slot: String,
    window: Option<Window>,
    flush_at: i64,
}

/// A window of a reading: its bounds and when it closes (its end plus the allowed lateness).
struct Window {
    start: i64,
    end: i64,
    closes: i64,
}

impl Window {
    /// Why a reading that reached the stream at `arrival` and is applied at `now` is late for
    /// this window, if it is, where the key `held` the window open or not, and had sent windows
    /// to the merge up to the one from `sent`. A window takes records until it closes and, from
    /// records that reached the stream before, also later (a batch Lambda delivers again after
    /// the close counts as it would have): while it waits in the key's state, or, opening it,
    /// within the grace and only after a window the key sent, which shows this one has not gone
    /// (a key without that mark may have sent it under an earlier release). A window the key
    /// sent, or one before it, takes nothing more.
    fn late(
        &self,
        held: bool,
        sent: Option<i64>,
        now: i64,
        arrival: i64,
        lateness_millis: i64,
    ) -> Option<String> {
        let Window { start, end, closes } = *self;
        let bounds = || {
            format!("late: its window [{start}, {end}) closed at {closes} (allowed lateness {lateness_millis} ms)")
        };
        let clock = || format!("the record arrived at {arrival}, the clock says {now}");
        if !held {
            if let Some(sent) = sent.filter(|&sent| start <= sent) {
                return Some(format!(
                    "{}, and its key's windows up to the one from {sent} have gone to the merge; {}",
                    bounds(),
                    clock()
                ));
            }
        }
        if now < closes {
            return None;
        }
        if arrival >= closes {
            return Some(format!("{}; {}", bounds(), clock()));
        }
        if held {
            return None;
        }
        if sent.is_none() {
            return Some(format!(
                "{}; {}: in time, but its key holds no open window for it and no mark of the \
                 windows it sent",
                bounds(),
                clock()
            ));
        }
        if now >= closes.saturating_add(REDELIVERY_GRACE_MILLIS) {
            return Some(format!(
                "{}; {}: in time, but more than {} s after the close, too late to open its \
                 window again",
                bounds(),
                clock(),
                REDELIVERY_GRACE_MILLIS / 1000
            ));
        }
        None
    }
}

/// The states before `SENT` was added: a key's windows and timers carry over unchanged.
fn before_sent() -> Vec<StateDescriptor> {
    vec![OPEN.descriptor(), timers()]
}

fn from_before_sent(old: &OldState<'_>) -> Result<NewState, MigrationError> {
    Ok(NewState::new()
        .carry(old, &OPEN.descriptor())
        .carry(old, &timers()))
}

/// How long after a window closes its partial goes to the merge: until every batch that read the
/// clock before it closed has ended (the invocation's deadline, and a tenth more for what its
/// function does before reading the clock). A batch that read the clock before the close takes
/// records into the window however late it loads the key; had the window gone by then, they
/// would open it again, and its second partial, of those records alone, would be taken for the
/// first's (the same version) or replace it. Without a deadline (a run outside Lambda) none.
fn settle(ctx: &Ctx<'_>) -> i64 {
    ctx.deadline_millis().map_or(0, |deadline| {
        let left = deadline.saturating_sub(ctx.now_millis()).max(0);
        left.saturating_add(left / 10).saturating_add(1_000)
    })
}

impl KeyedOperator for KeyedAggregate {
    type Input = Input;

    fn name(&self) -> &str {
        NAME
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![OPEN.descriptor(), SENT.descriptor(), timers()]
    }

    fn migrations(&self) -> Vec<Migration> {
        vec![Migration::from_states(&before_sent(), from_before_sent)]
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        vec![PARTIALS.descriptor()]
    }

    fn delivery(&self) -> Delivery {
        Delivery::Outbox
    }

    fn decode(&self, record: &SourceRecord) -> Result<Input, InvalidInput> {
        let Payload::Bytes(data) = &record.payload else {
            return Err(InvalidInput::new("record", "expected a Kinesis record"));
        };
        let reading = self.spec.read(data)?;
        // A partition key that is a bucket of the record's own key keeps the bucket's state;
        // any other aggregates under the key.
        let bucket = unsalt(&record.partition_key, &reading.key);
        let state_key = state_key(&reading.key, bucket);
        Ok(Input {
            reading,
            bucket,
            state_key,
        })
    }

    fn key(&self, input: &Input) -> String {
        input.state_key.clone()
    }

    /// A bucket's records count for their own key, the one the producer salts; so do a key's
    /// own records whose state key is escaped (`~x`'s is `~~x`, which no producer salts).
    fn hot_key(&self, input: &Input) -> Option<String> {
        (input.state_key != input.reading.key).then(|| input.reading.key.clone())
    }

    fn process(&self, ctx: &mut Ctx<'_>, input: Input) -> Result<(), ProcessError> {
        let now = ctx.now_millis();
        // A record the source gives no arrival time is taken to have arrived now.
        let arrival = ctx.record().arrival_millis.unwrap_or(now);
        let Target {
            slot,
            window,
            flush_at,
        } = self.target(&input.reading, now, settle(ctx))?;
        if let (Some(window), Some(windows)) = (&window, &self.spec.windows) {
            let held = ctx
                .map(&OPEN)?
                .get(&slot)
                .is_some_and(|o| o.flush_at.is_some());
            // Read only for a window the key does not hold yet: once a window and key.
            let sent = if held {
                None
            } else {
                ctx.value(&SENT)?.get().copied()
            };
            if let Some(problem) = window.late(held, sent, now, arrival, windows.lateness_millis) {
                return Err(InvalidInput::new(time_field(windows), problem).into());
            }
        }
        let one = Partial::of(input.reading.value);
        let mut open = ctx.map(&OPEN)?;
        let timer = match open.get_mut(&slot) {
            Some(entry) => {
                entry.partial.merge(&one).map_err(|e| {
                    let field = self
                        .spec
                        .value
                        .as_ref()
                        .map_or("data".to_owned(), |p| format!("data{}", p.as_str()));
                    InvalidInput::new(field, format!("{e} for key {:?}", entry.key))
                })?;
                let unset = entry.flush_at.is_none();
                entry.flush_at.get_or_insert(flush_at);
                unset
            }
            None => {
                let entry = Open {
                    key: input.reading.key,
                    partial: one,
                    flush_at: Some(flush_at),
                };
                open.insert(slot, entry);
                true
            }
        };
        if timer {
            ctx.timer_at(flush_at)?;
        }
        Ok(())
    }

    fn on_timer(&self, ctx: &mut Ctx<'_>, at_millis: i64) -> Result<(), ProcessError> {
        let source = ctx.key().to_owned();
        let mut open = ctx.map(&OPEN)?;
        let due: Vec<String> = open
            .iter()
            .filter(|(_, entry)| entry.flush_at.is_some_and(|t| t <= at_millis))
            .map(|(slot, _)| slot.clone())
            .collect();
        let mut updates = Vec::with_capacity(due.len());
        for slot in due {
            let window_start = (slot != ALL).then(|| slot.parse::<i64>().ok()).flatten();
            let entry = if window_start.is_some() {
                // A closed window takes nothing more: its partial leaves the state.
                open.remove(&slot).expect("due slots are open")
            } else {
                let entry = open.get_mut(&slot).expect("due slots are open");
                entry.flush_at = None;
                entry.clone()
            };
            updates.push(PartialUpdate {
                key: entry.key,
                window_start,
                source: source.clone(),
                version: at_millis,
                partial: entry.partial,
            });
        }
        if let Some(newest) = updates.iter().filter_map(|u| u.window_start).max() {
            let mut sent = ctx.value(&SENT)?;
            let through = sent.get().map_or(newest, |&sent| sent.max(newest));
            sent.set(through);
        }
        for update in updates {
            ctx.emit(&PARTIALS, update.key.clone(), &update)?;
        }
        Ok(())
    }
}
