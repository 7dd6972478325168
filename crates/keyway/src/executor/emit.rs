//! Phase 4: dead letters, outboxes left by earlier invocations and (emit-then-commit) outputs go
//! out, every sink at once; so do an outbox operator's settled outputs. A sink that keeps order
//! gets a key's messages to one partition key one after another: each round sends the next
//! message of every key and partition key, and a key whose message failed sends nothing more to
//! that sink. Rounds stop at the batch's send deadline (`Plan::sends`), the first one excepted,
//! and a send that has not answered by the end of the sends is given up. Which messages failed
//! decides how many of each key's records stay applied.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};

use futures::future::join_all;
use tracing::warn;

use super::plan::Plan;
use super::process::{KeyWork, Outcome};
use super::{BatchReport, Executor};
use crate::domain::{DeadLetter, KeyState, Output, SentNotes, SentSoFar, DEAD_LETTER_SINK};
use crate::operator::{Delivery, KeyedOperator};
use crate::ports::{Deadline, Sink, SinkError};

/// When a batch's sends stop. No call or retry starts past `until`, but a send's first call
/// (`Deadline`). A send that has not answered at `end` is given up as failed: what it took may
/// have gone out, and goes again, under the same ids, with its records' retry. A sink's first
/// round has `first_round` to answer at least, wherever `end` falls: a batch late to send still
/// gets something out whenever its sink answers in that time; but no send goes on past `last`,
/// just short of the invocation's deadline, where Lambda would stop the invocation with nothing
/// committed.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SendTimes {
    pub until: Deadline,
    pub end: Option<tokio::time::Instant>,
    pub first_round: std::time::Duration,
    pub last: Option<tokio::time::Instant>,
}

impl SendTimes {
    /// The deadline of a send starting now, and when it is given up: the sends' end, or for a
    /// sink's first round, no sooner than `first_round` from now; never past `last`.
    fn give_up_at(&self, first: bool) -> (Deadline, Option<tokio::time::Instant>) {
        let at = self.end.map(|end| match first {
            true => end.max(tokio::time::Instant::now() + self.first_round),
            false => end,
        });
        (
            self.until,
            at.map(|at| self.last.map_or(at, |last| at.min(last))),
        )
    }
}

/// Which record a message was emitted for, to map a send failure back to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tag {
    Record {
        group: usize,
        position: usize,
        /// The output's place among the record's outputs.
        output: u32,
    },
    /// A message in the key's outbox (left by an earlier invocation, or just committed).
    Outbox { group: usize },
    /// A record rejected before it had a key.
    Unkeyed { index: usize },
}

impl Tag {
    /// Messages with the same order key and partition key go to an ordered sink one after
    /// another.
    fn order_key(&self) -> (usize, usize) {
        self.rank().0
    }

    /// The order key, then where the message stands among its key's: an outbox left by an
    /// earlier invocation goes before the records' outputs, each record's before the next's.
    fn rank(&self) -> ((usize, usize), usize) {
        match *self {
            Tag::Outbox { group } => ((0, group), 0),
            Tag::Record {
                group, position, ..
            } => ((0, group), position + 1),
            Tag::Unkeyed { index } => ((1, index), 0),
        }
    }
}

/// Messages to send, by sink, each with its tag, in the order they must go out.
#[derive(Default)]
pub(super) struct Emission {
    by_sink: BTreeMap<String, Vec<(Tag, Output)>>,
    /// How many outputs each record emitted, as (group, position, count) in the order of groups
    /// and positions, where what went out of a record's outputs is noted with its key
    /// (`Executor::notes_sent`).
    emitted: Vec<(usize, usize, u32)>,
}

impl Emission {
    /// Pushes the outputs of the record at `position` of group `g`, each tagged with its place,
    /// but those `sent` says went out already. Places count each sink's outputs apart, sinks in
    /// name order: what went out to one sink is mostly its first outputs, one range a sink
    /// however the record's outputs to several sinks interleave.
    fn push_noted(
        &mut self,
        g: usize,
        position: usize,
        outputs: Vec<Output>,
        sent: Option<&SentSoFar>,
    ) {
        self.emitted.push((g, position, outputs.len() as u32));
        // Outputs already in sink order (a record's outputs to one sink) are their own places.
        let sorted = outputs.windows(2).all(|w| w[0].sink <= w[1].sink);
        let places = (!sorted).then(|| {
            let mut by_sink: Vec<usize> = (0..outputs.len()).collect();
            by_sink.sort_by(|&a, &b| outputs[a].sink.cmp(&outputs[b].sink));
            let mut places = vec![0u32; outputs.len()];
            for (place, &i) in by_sink.iter().enumerate() {
                places[i] = place as u32;
            }
            places
        });
        for (i, output) in outputs.into_iter().enumerate() {
            let place = places.as_ref().map_or(i as u32, |places| places[i]);
            if !sent.is_some_and(|sent| sent.contains(place)) {
                let tag = Tag::Record {
                    group: g,
                    position,
                    output: place,
                };
                self.push(tag, output);
            }
        }
    }

    pub(super) fn push(&mut self, tag: Tag, output: Output) {
        match self.by_sink.get_mut(&output.sink) {
            Some(messages) => messages.push((tag, output)),
            None => {
                self.by_sink
                    .insert(output.sink.clone(), vec![(tag, output)]);
            }
        }
    }
}

/// What sending to one sink came to.
#[derive(Default)]
struct Sent {
    count: usize,
    /// Messages that may go out later.
    failed: Vec<Tag>,
    /// Messages the sink refuses for good.
    refused: Vec<(Tag, Output, SinkError)>,
}

impl<O: KeyedOperator> Executor<O> {
    pub(super) async fn emit_all(
        &self,
        plan: &Plan<'_>,
        keys: &mut [KeyWork],
        report: &mut BatchReport,
    ) {
        let mut emission = self.collect(plan, keys, report);
        let emitted = std::mem::take(&mut emission.emitted);
        let failed = self.send_all(emission, plan.sends, report).await;
        for work in keys.iter_mut() {
            work.keep = work
                .run
                .outcomes
                .iter()
                .position(|o| matches!(o, Outcome::Failed | Outcome::Deferred))
                .unwrap_or(work.run.outcomes.len());
        }
        let emitted: HashMap<(usize, usize), u32> = match failed.is_empty() {
            // Nothing failed, nothing to note: skip hashing every record of the batch.
            true => HashMap::new(),
            false => emitted.into_iter().map(|(g, p, n)| ((g, p), n)).collect(),
        };
        let mut unsent: HashMap<(usize, usize), Vec<u32>> = HashMap::new();
        for tag in failed {
            match tag {
                Tag::Record {
                    group,
                    position,
                    output,
                } => {
                    keys[group].keep = keys[group].keep.min(position);
                    if emitted.contains_key(&(group, position)) {
                        unsent.entry((group, position)).or_default().push(output);
                    }
                }
                Tag::Outbox { group } => keys[group].blocked = true,
                Tag::Unkeyed { index } => match plan.sequence_of(index) {
                    Some(seq) => report.fail(seq),
                    None => {
                        report.unreportable_failure = Some(
                            "a record without a sequence number could not be dead-lettered".into(),
                        )
                    }
                },
            }
        }
        for &index in &plan.panicked {
            if let Some(seq) = plan.sequence_of(index) {
                report.fail(seq);
            }
        }
        if self.notes_sent() {
            for (g, work) in keys.iter_mut().enumerate() {
                work.sent_so_far = self.sent_so_far(plan, g, work, &emitted, &mut unsent);
            }
        }
    }

    /// Whether what went out of a record's outputs is noted with its key, for its retry to send
    /// only the rest: for an emit-then-commit operator with state, whose retry computes the same
    /// outputs in the same order. Not where a sink keeps only the latest output (the one sent
    /// stands for several records), nor for outbox operators (their outputs are stored whole),
    /// nor for operators that read broadcast state (which can change between two attempts
    /// without the key's version showing it).
    pub(super) fn notes_sent(&self) -> bool {
        self.operator.delivery() == Delivery::EmitThenCommit
            && !self.operator.stateless()
            && self.sinks.latest.is_empty()
            && self.broadcast_states.is_empty()
    }

    /// What went out of the outputs of the key's records left unapplied, in this invocation or
    /// (skipped as noted) before, record by record: a record's retry sends only the rest. Not
    /// only the first such record's: an ordered sink's round sends a later record's output to a
    /// partition key the first one's output went to already. `None` when nothing is noted.
    fn sent_so_far(
        &self,
        plan: &Plan<'_>,
        g: usize,
        work: &KeyWork,
        emitted: &HashMap<(usize, usize), u32>,
        unsent: &mut HashMap<(usize, usize), Vec<u32>>,
    ) -> Option<SentNotes> {
        let (mut records, mut ranges, mut last) = (Vec::new(), 0, work.keep);
        for (position, &index) in plan.groups[g].records.iter().enumerate().skip(work.keep) {
            // A record not run this time (failed, deferred) has its outputs computed again whole.
            let Some(&count) = emitted.get(&(g, position)) else {
                continue;
            };
            if records.len() == SentSoFar::MAX_RECORDS {
                break;
            }
            let record = plan.record(index);
            // Those skipped as sent before are not among the unsent: still noted.
            let unsent = unsent.remove(&(g, position)).unwrap_or_default();
            let lineage = self.lineage_of(record).clone();
            if let Some(mut sent) = SentSoFar::of(lineage, record.sequence.clone(), count, unsent) {
                sent.ranges.truncate(SentSoFar::MAX_RANGES - ranges);
                ranges += sent.ranges.len();
                if !sent.ranges.is_empty() {
                    records.push(sent);
                    last = position;
                }
            }
        }
        if records.is_empty() {
            return None;
        }
        let chain = self.chain(plan, g, &work.run.outcomes, work.keep, last + 1 - work.keep)?;
        Some(SentNotes {
            version: work.base.version + 1,
            build: super::build::fingerprint(),
            chain,
            records,
        })
    }

    /// The `length` records of key `g` from `position` on as a chain (`SentNotes::chain`): `None`
    /// when the run did not get that far.
    fn chain(
        &self,
        plan: &Plan<'_>,
        g: usize,
        outcomes: &[Outcome],
        position: usize,
        length: usize,
    ) -> Option<(u32, u64)> {
        let ran = outcomes.get(position..position + length)?;
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        for (outcome, &index) in ran.iter().zip(&plan.groups[g].records[position..]) {
            let record = plan.record(index);
            let kind: &[u8] = match outcome {
                Outcome::Replayed => b"r",
                Outcome::Applied(_) => b"a",
                Outcome::Invalid(_) => b"i",
                Outcome::Failed => b"f",
                Outcome::Deferred => b"d",
            };
            for part in [self.lineage_of(record).as_str().as_bytes(), b"\0"] {
                hasher.update(part);
            }
            for part in [record.sequence.as_str().as_bytes(), b"\0", kind] {
                hasher.update(part);
            }
        }
        Some((length as u32, hasher.digest()))
    }

    /// Everything phase 4 sends. Outputs sent now are taken out of their outcomes.
    fn collect(&self, plan: &Plan<'_>, keys: &mut [KeyWork], report: &mut BatchReport) -> Emission {
        let dlq_limit = self.sinks.dead_letter_limit();
        let mut emission = Emission::default();
        for (index, letter) in &plan.unkeyed {
            emission.push(
                Tag::Unkeyed { index: *index },
                letter.clone().into_output(dlq_limit),
            );
        }
        let emit_now = self.operator.delivery() == Delivery::EmitThenCommit;
        let notes_sent = self.notes_sent();
        for (g, work) in keys.iter_mut().enumerate() {
            let timer = |position: usize| {
                let index = plan.groups[g].records[position];
                plan.record(index).as_timer().is_some()
            };
            keep_latest(
                &mut work.run.outcomes,
                |sink| self.sinks.keeps_latest(sink),
                timer,
            );
            for output in &work.base.outbox {
                emission.push(Tag::Outbox { group: g }, output.clone());
            }
            let notes = match notes_sent {
                // Field by field, beside the outcomes taken below.
                true => self.notes_of(plan, g, &work.base, work, report),
                false => None,
            };
            for (position, outcome) in work.run.outcomes.iter_mut().enumerate() {
                let tag = Tag::Record {
                    group: g,
                    position,
                    output: 0,
                };
                let record = plan.record(plan.groups[g].records[position]);
                match outcome {
                    Outcome::Applied(outputs) if emit_now => {
                        let outputs = std::mem::take(outputs);
                        if !notes_sent {
                            for output in outputs {
                                emission.push(tag, output);
                            }
                            continue;
                        }
                        let lineage = self.lineage_of(record);
                        let sent = notes.and_then(|n| n.of_record(lineage, &record.sequence));
                        emission.push_noted(g, position, outputs, sent);
                    }
                    // An outbox operator's settled outputs go now; the rest into its outbox.
                    Outcome::Applied(outputs) => {
                        let (settled, stored) =
                            std::mem::take(outputs).into_iter().partition(|o| o.settled);
                        *outputs = stored;
                        for output in settled {
                            emission.push(tag, output);
                        }
                    }
                    Outcome::Invalid(invalid) => {
                        let letter =
                            self.dead_letter(record, Some(&plan.groups[g].key), invalid.clone());
                        emission.push(tag, letter.into_output(dlq_limit));
                    }
                    _ => {}
                }
            }
        }
        emission
    }

    /// The notes key `g` was loaded with (`base`, its work's, borrowed apart from the outcomes
    /// the caller takes), if they hold for its run. Notes that no longer do are
    /// counted and logged where the key's records ran: a key deferred, or whose records were all
    /// applied before (a redelivery), commits nothing and keeps its notes for the next attempt.
    fn notes_of<'w>(
        &self,
        plan: &Plan<'_>,
        g: usize,
        base: &'w KeyState,
        work: &KeyWork,
        report: &mut BatchReport,
    ) -> Option<&'w SentNotes> {
        // Most keys have none: nothing to look through.
        base.sent_so_far.as_ref()?;
        let outcomes = &work.run.outcomes;
        let first = outcomes
            .iter()
            .position(|o| !matches!(o, Outcome::Replayed));
        let changed = work.migrated_from.is_some() || work.expired;
        let chain = |length| self.chain(plan, g, outcomes, first?, length);
        match notes_holding(base, changed, chain) {
            Ok(notes) => notes,
            Err(_) if work.deferred || first.is_none() => None,
            Err(why) => {
                let key = &plan.groups[g].key;
                warn!(operator = %self.namespace.operator, key, why, "the notes of what went out of the key's records no longer hold: their outputs go again whole");
                report.notes_unused += 1;
                None
            }
        }
    }

    /// Sends every message; a message a sink refuses for good (too large, a name the service
    /// rejects) is dead-lettered instead: retrying could never deliver it, and nothing may block
    /// a key forever. Returns the tags of the messages that may go out later. Sinks start no call
    /// after `times.until` but their first.
    pub(super) async fn send_all(
        &self,
        emission: Emission,
        times: SendTimes,
        report: &mut BatchReport,
    ) -> Vec<Tag> {
        let (mut failed, refused) = self.send_round(emission, times, report).await;
        if refused.is_empty() {
            return failed;
        }
        let limit = self.sinks.dead_letter_limit();
        let mut letters = Emission::default();
        for (tag, output, err) in refused {
            let letter = DeadLetter::new(
                self.operator.name(),
                None,
                None,
                format!("output.{}", output.sink),
                err.to_string(),
                serde_json::to_string(&output).expect("an output always serializes"),
            );
            letters.push(tag, letter.into_output(limit));
        }
        let (failed_letters, refused_letters) = self.send_round(letters, times, report).await;
        failed.extend(failed_letters);
        failed.extend(refused_letters.into_iter().map(|(tag, _, _)| tag));
        failed
    }

    /// Every sink at once.
    async fn send_round(
        &self,
        emission: Emission,
        times: SendTimes,
        report: &mut BatchReport,
    ) -> (Vec<Tag>, Vec<(Tag, Output, SinkError)>) {
        let sends = emission
            .by_sink
            .into_iter()
            .map(|(name, messages)| async move {
                let sent = self.send_to(&name, messages, times).await;
                (name, sent)
            });
        let (mut failed, mut refused) = (Vec::new(), Vec::new());
        for (name, sent) in join_all(sends).await {
            if name == DEAD_LETTER_SINK {
                report.dead_lettered += sent.count;
                // A dead letter refused has nowhere else to go: keep its record.
                failed.extend(sent.refused.into_iter().map(|(tag, _, _)| tag));
            } else {
                report.outputs_sent += sent.count;
                refused.extend(sent.refused);
            }
            failed.extend(sent.failed);
        }
        (failed, refused)
    }

    /// Sends one sink's messages: all at once to a sink without order, in rounds to one that
    /// keeps order (`OrderedQueues`), no round after `times.until` but the first.
    async fn send_to(&self, name: &str, messages: Vec<(Tag, Output)>, times: SendTimes) -> Sent {
        let Some(sink) = self.sinks.get(name) else {
            // Ctx refuses unknown sinks; an outbox written under an older configuration may
            // still name one. Keep it until the sink is configured again.
            warn!(sink = %name, "no sink of that name is configured; its outputs wait");
            return Sent {
                failed: messages.into_iter().map(|(tag, _)| tag).collect(),
                ..Sent::default()
            };
        };
        let mut sent = Sent::default();
        if !sink.ordered() {
            let (tags, outputs): (Vec<Tag>, Vec<Output>) = messages.into_iter().unzip();
            send_once(
                sink.as_ref(),
                name,
                &tags,
                &outputs,
                times.give_up_at(true),
                &mut sent,
            )
            .await;
            return sent;
        }
        let mut queues = OrderedQueues::default();
        for (tag, output) in messages {
            if sink.keeps_order_of(&output.partition_key) {
                let partition = queues.partition(&sink.order_of(&output.partition_key));
                queues.push(tag, partition, output);
            } else {
                queues.push_alone(tag, output);
            }
        }
        let mut first = true;
        loop {
            let (tags, outputs) = queues.next_round();
            if outputs.is_empty() {
                return sent;
            }
            let give_up = times.give_up_at(std::mem::take(&mut first));
            let failed = send_once(sink.as_ref(), name, &tags, &outputs, give_up, &mut sent).await;
            // Nothing of a key's records from its first failed one on may go out after it.
            let mut first: HashMap<(usize, usize), Tag> = HashMap::new();
            for tag in failed.into_iter().map(|i| tags[i]) {
                first
                    .entry(tag.order_key())
                    .and_modify(|f| *f = std::cmp::min_by_key(*f, tag, Tag::rank))
                    .or_insert(tag);
            }
            for tag in first.into_values() {
                sent.failed.extend(queues.stop_key_from(tag));
            }
            if times.until.passed() {
                // Too late for another round: what waits goes with its records' retry.
                sent.failed.extend(queues.stop_all());
                return sent;
            }
        }
    }
}

/// The notes `base` was loaded with, if they hold: the key unchanged since they were committed
/// (its version, and not `changed_since`: a migration, an expired state), the same build, and
/// `chain` of the run's records, given how many the notes cover, the one they were made on.
/// `Ok(None)` when there are none; why they do not hold when they do not.
fn notes_holding(
    base: &KeyState,
    changed_since: bool,
    chain: impl FnOnce(usize) -> Option<(u32, u64)>,
) -> Result<Option<&SentNotes>, &'static str> {
    let Some(notes) = base.sent_so_far.as_ref() else {
        return Ok(None);
    };
    if changed_since {
        Err("the key's state was migrated or expired since")
    } else if notes.version != base.version {
        Err("another commit changed the key since")
    } else if notes.build != super::build::fingerprint() {
        Err("another build (executable or environment) wrote them")
    } else if chain(notes.chain.0 as usize) != Some(notes.chain) {
        Err("the records run are not the ones they were made on")
    } else {
        Ok(Some(notes))
    }
}

/// An ordered sink's messages, one queue per key and partition key (as the sink orders them:
/// `Sink::order_of`): each round takes every queue's next message, so a key's messages to one
/// partition key go out one after another while those to other partition keys go beside them.
/// The sink keeps order per partition key (a Kinesis shard holds many, and a consumer with
/// ParallelizationFactor above 1 reads each alone; a FIFO queue per message group), so that is
/// all the order a consumer can see; and a key that emits thousands of outputs, each to its own
/// partition key (a join key's joined rows), sends them in a few calls instead of thousands.
#[derive(Default)]
struct OrderedQueues {
    queues: Vec<VecDeque<(Tag, Output)>>,
    /// The queues that still hold messages, in the order they were made.
    waiting: Vec<usize>,
    /// A queue by its key and the hash of its partition key, which saves copying each key: two
    /// partition keys of one hash share a queue, and so go one after another, more order than
    /// they need, never less.
    by_partition: HashMap<((usize, usize), u64), usize>,
    hasher: std::hash::RandomState,
    /// Each key's queues (`Tag::order_key`).
    by_key: HashMap<(usize, usize), Vec<usize>>,
}

impl OrderedQueues {
    /// What names the queue of a partition key: its hash.
    fn partition(&self, partition_key: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, partition_key)
    }

    fn push(&mut self, tag: Tag, partition: u64, output: Output) {
        let key = tag.order_key();
        let at = match self.by_partition.entry((key, partition)) {
            Entry::Occupied(at) => *at.get(),
            Entry::Vacant(slot) => {
                let at = self.queues.len();
                self.queues.push(VecDeque::new());
                self.waiting.push(at);
                self.by_key.entry(key).or_default().push(at);
                *slot.insert(at)
            }
        };
        self.queues[at].push_back((tag, output));
    }

    /// A message that keeps no order in a queue of its own: it goes in the first round.
    fn push_alone(&mut self, tag: Tag, output: Output) {
        let at = self.queues.len();
        self.queues.push(VecDeque::from([(tag, output)]));
        self.waiting.push(at);
        self.by_key.entry(tag.order_key()).or_default().push(at);
    }

    /// Every waiting queue's next message, with its tag.
    fn next_round(&mut self) -> (Vec<Tag>, Vec<Output>) {
        let (mut tags, mut outputs) = (Vec::new(), Vec::new());
        for &q in &self.waiting {
            if let Some((tag, output)) = self.queues[q].pop_front() {
                tags.push(tag);
                outputs.push(output);
            }
        }
        let queues = &self.queues;
        self.waiting.retain(|&q| !queues[q].is_empty());
        (tags, outputs)
    }

    /// Takes every message out, returning their tags.
    fn stop_all(&mut self) -> Vec<Tag> {
        self.waiting.clear();
        self.queues
            .iter_mut()
            .flat_map(|queue| queue.drain(..).map(|(tag, _)| tag))
            .collect()
    }

    /// After the message tagged `failed`, takes out of every queue of its key the messages from
    /// the failed one's record on, and returns their tags: those records stay unapplied, and
    /// their outputs go out again when they are. Earlier records' messages to other partition
    /// keys still go: their records may be committed.
    fn stop_key_from(&mut self, failed: Tag) -> Vec<Tag> {
        let (key, _) = failed.rank();
        let mut stopped = Vec::new();
        for &at in &self.by_key[&key] {
            let queue = &mut self.queues[at];
            // A queue holds its messages in the order of their records.
            let from = queue
                .iter()
                .position(|(tag, _)| tag.rank() >= failed.rank())
                .unwrap_or(queue.len());
            stopped.extend(queue.drain(from..).map(|(tag, _)| tag));
        }
        stopped
    }
}

/// Leaves, of one key's outputs to a sink that keeps the latest, only the last of each partition
/// key, moved to the first record that emitted one: if it cannot be sent, the key stops there,
/// and no record whose output it stands for is committed without it. Timers' outputs are all
/// kept: a timer not committed fires again, on state that other records may have changed, and
/// must not send another body under an id that already went out.
fn keep_latest(
    outcomes: &mut [Outcome],
    keeps_latest: impl Fn(&str) -> bool,
    timer: impl Fn(usize) -> bool,
) {
    // (sink, partition key) -> (the first position that emitted to it, the last output).
    let mut latest: HashMap<(String, String), (usize, Output)> = HashMap::new();
    for (position, outcome) in outcomes.iter_mut().enumerate() {
        let Outcome::Applied(outputs) = outcome else {
            continue;
        };
        if timer(position) {
            continue;
        }
        if !outputs.iter().any(|o| keeps_latest(&o.sink)) {
            continue;
        }
        let (superseded, kept): (Vec<Output>, Vec<Output>) = std::mem::take(outputs)
            .into_iter()
            .partition(|o| keeps_latest(&o.sink));
        *outputs = kept;
        for output in superseded {
            let key = (output.sink.clone(), output.partition_key.clone());
            match latest.entry(key) {
                Entry::Occupied(mut kept) => kept.get_mut().1 = output,
                Entry::Vacant(first) => {
                    first.insert((position, output));
                }
            }
        }
    }
    let mut kept: Vec<(usize, Output)> = latest.into_values().collect();
    // In the order of their first records: the same order on every run of the same records.
    kept.sort_by(|a, b| {
        (a.0, &a.1.sink, &a.1.partition_key).cmp(&(b.0, &b.1.sink, &b.1.partition_key))
    });
    for (position, output) in kept {
        if let Outcome::Applied(outputs) = &mut outcomes[position] {
            outputs.push(output);
        }
    }
}

/// One call of a sink, given up at `give_up` if it has not answered: counts what went out and
/// keeps what did not; returns the indexes of the messages that may go out later.
async fn send_once(
    sink: &dyn Sink,
    name: &str,
    tags: &[Tag],
    outputs: &[Output],
    (until, give_up): (Deadline, Option<tokio::time::Instant>),
    sent: &mut Sent,
) -> Vec<usize> {
    let send = sink.send(outputs, until);
    let failures = match give_up {
        Some(at) => tokio::time::timeout_at(at, send).await.unwrap_or_else(|_| {
            let unanswered = "the sink did not answer before the invocation's end; what it took \
                              may have gone out";
            let late = || SinkError::OutOfTime(unanswered.into());
            (0..outputs.len()).map(|i| (i, late())).collect()
        }),
        None => send.await,
    };
    sent.count += outputs.len() - failures.len();
    let mut retryable = Vec::new();
    // What may go later can be thousands of outputs when a batch outruns its sink: one line
    // says how many, with the first one's reason. Each refused output is named: it is
    // dead-lettered.
    let (mut first_retryable, mut out_of_time) = (None, 0);
    for (i, err) in failures {
        if err.is_retryable() {
            sent.failed.push(tags[i]);
            retryable.push(i);
            out_of_time += usize::from(matches!(err, SinkError::OutOfTime(_)));
            first_retryable.get_or_insert((i, err));
        } else {
            warn!(sink = %name, id = %outputs[i].id, error = %err, "output refused");
            sent.refused.push((tags[i], outputs[i].clone(), err));
        }
    }
    if let Some((i, err)) = first_retryable {
        let id = &outputs[i].id;
        warn!(sink = %name, outputs = retryable.len(), out_of_time, first = %id, error = %err, "outputs not sent; they go with their records' retry");
    }
    retryable
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::super::testkit::Summer;
    use super::super::testkit::{bench, bench_with, key_and_n, record, Recorder, OUT, START, SUM};
    use super::super::{Executor, Sinks};
    use super::{OrderedQueues, Tag};
    use crate::adapters::dynamodb::DynamoStateStore;
    use crate::domain::{Output, Payload, RejectedRecord, SourceRecord};
    use crate::operator::{
        Ctx, InvalidInput, KeyedOperator, ProcessError, SinkDescriptor, StateDescriptor,
    };
    use crate::ports::{Clock, Deadline, ManualClock, Sink, SinkError};

    #[tokio::test]
    async fn an_outbox_for_a_sink_no_longer_configured_waits_and_blocks_its_key() {
        let b = bench(
            Summer {
                outbox: true,
                ..Summer::default()
            },
            false,
        );
        b.out.down.store(true, Ordering::SeqCst);
        b.executor.run(vec![record(1, "p", "a", 5)]).await;
        // Redeployed without the sink: the key's outbox keeps it, and the key waits.
        let clock = ManualClock::at(START);
        let store = Arc::new(DynamoStateStore::new(b.table.clone(), clock.clone()));
        let redeployed = Summer {
            outbox: true,
            without_out: true,
            ..Summer::default()
        };
        let without = Executor::new(
            redeployed,
            store,
            Sinks::new(Arc::new(Recorder::default())),
            clock,
        )
        .unwrap();
        let report = without.run(vec![record(2, "p", "a", 0)]).await;
        assert_eq!(report.failed_from.unwrap().as_str(), "2");
        // The sink is back: the output goes out.
        b.out.down.store(false, Ordering::SeqCst);
        let report = b.executor.run(vec![record(2, "p", "a", 0)]).await;
        assert_eq!(report.failed_from, None);
        assert_eq!(
            b.out.bodies(),
            [vec!["5"], vec!["5"]],
            "the call that failed, then the one that went out"
        );
    }

    #[tokio::test]
    async fn an_ordered_sink_gets_a_keys_outputs_one_call_each_and_none_after_one_fails() {
        let b = bench(Summer::default(), true);
        b.out.fail("3");
        let batch = vec![
            record(1, "p", "a", 1),
            record(2, "p", "a", 2),
            record(3, "p", "a", 3),
            record(4, "q", "b", 1),
        ];
        let report = b.executor.run(batch).await;
        assert_eq!(
            b.out.bodies(),
            [vec!["1", "1"], vec!["3"]],
            "a's third output waits behind the second, which failed"
        );
        assert_eq!(report.failed_from.unwrap().as_str(), "2");
    }

    /// A sink that keeps order for FIFO queues only, as the filter's router does.
    struct FifoOnly(Arc<Recorder>);

    #[async_trait::async_trait]
    impl Sink for FifoOnly {
        async fn send(&self, messages: &[Output], deadline: Deadline) -> Vec<(usize, SinkError)> {
            self.0.send(messages, deadline).await
        }
        fn max_message_bytes(&self) -> usize {
            self.0.max_message_bytes()
        }
        fn keeps_order_of(&self, partition_key: &str) -> bool {
            partition_key.ends_with(".fifo")
        }
    }

    #[tokio::test]
    async fn a_sink_keeping_order_for_some_partition_keys_sends_the_others_all_in_the_first_round()
    {
        let recorder = Arc::new(Recorder::default());
        let sink: Arc<dyn Sink> = Arc::new(FifoOnly(recorder.clone()));
        let b = bench_with(Summer::default(), true, |sinks| sinks.with(&OUT, sink));
        recorder.fail("3");
        let batch = vec![
            record(1, "p", "a.fifo", 1),
            record(2, "p", "b", 10),
            record(3, "p", "a.fifo", 2),
            record(4, "p", "b", 10),
            record(5, "p", "a.fifo", 3),
            record(6, "p", "b", 10),
        ];
        let report = b.executor.run(batch).await;
        assert_eq!(
            recorder.bodies(),
            [vec!["1", "10", "20", "30"], vec!["3"]],
            "b's outputs all go at once; a's one a round, none after the one that failed"
        );
        assert_eq!(report.failed_from.unwrap().as_str(), "3");
        assert_eq!(report.applied, 4, "a's first record and b's three");
    }

    /// Emits, for a record `(key, n)` at sequence number `s`, `n % 10` outputs: the `i`th is
    /// `10 s + i`, to partition key `p{n / 10 + i}`; keeps the last `n` as state. A negative `n`
    /// sets the key's timer a second in the past instead, whose firing emits 3,000 outputs, the
    /// `i`th with body `i`, to 250 partition keys in turn.
    struct Fanner;

    impl KeyedOperator for Fanner {
        type Input = (String, i64);

        fn name(&self) -> &str {
            "fanner"
        }

        fn states(&self) -> Vec<StateDescriptor> {
            vec![SUM.descriptor(), crate::operator::timers()]
        }

        fn sinks(&self) -> Vec<SinkDescriptor> {
            vec![OUT.descriptor()]
        }

        fn decode(&self, record: &SourceRecord) -> Result<(String, i64), InvalidInput> {
            key_and_n(record)
        }

        fn key(&self, input: &(String, i64)) -> String {
            input.0.clone()
        }

        fn process(&self, ctx: &mut Ctx<'_>, (_, n): (String, i64)) -> Result<(), ProcessError> {
            if n < 0 {
                return ctx.timer_at(ctx.now_millis() - 1_000);
            }
            ctx.value(&SUM)?.set(n);
            let s: i64 = ctx.record().sequence.as_str().parse().unwrap();
            for i in 0..n % 10 {
                ctx.emit(&OUT, format!("p{}", n / 10 + i), &(10 * s + i))?;
            }
            Ok(())
        }

        fn on_timer(&self, ctx: &mut Ctx<'_>, _at: i64) -> Result<(), ProcessError> {
            for i in 0..3_000 {
                ctx.emit(&OUT, format!("p{}", i % 250), &i)?;
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn an_ordered_sink_gets_a_keys_outputs_to_other_partition_keys_in_one_call_and_to_one_partition_key_one_call_each(
    ) {
        let b = bench(Fanner, true);
        let batch = vec![
            record(1, "p", "a", 3),
            record(2, "p", "a", 2),
            record(3, "q", "b", 1),
        ];
        let report = b.executor.run(batch).await;
        assert_eq!(report.failed_from, None);
        assert_eq!(
            b.out.bodies(),
            [vec!["10", "11", "12", "30"], vec!["20", "21"]],
            "a's second record's outputs follow its first's to p0 and p1"
        );
    }

    #[tokio::test]
    async fn a_failed_output_stops_its_key_at_every_partition_key_and_no_other_key() {
        let b = bench(Fanner, true);
        b.out.fail("11");
        let batch = || {
            vec![
                record(1, "p", "a", 3),
                record(2, "p", "a", 2),
                record(3, "q", "b", 1),
            ]
        };
        let report = b.executor.run(batch()).await;
        assert_eq!(
            report.failed_from.unwrap().as_str(),
            "1",
            "a's first record stays unapplied"
        );
        assert_eq!(
            b.out.bodies(),
            [vec!["10", "11", "12", "30"]],
            "a's second record sends nothing, to p1 or to p0, which its first reached"
        );
        b.out.failing.lock().unwrap().clear();
        let report = b.executor.run(batch()).await;
        assert_eq!(report.failed_from, None);
        assert_eq!(
            b.out.bodies()[1..],
            [vec!["11", "20"], vec!["21"]],
            "a goes on from its first record's output that failed; b's is not applied twice"
        );
    }

    #[tokio::test]
    async fn a_later_records_outputs_that_went_out_are_not_sent_again_unless_the_retry_starts_after_an_earlier_record(
    ) {
        let b = bench(Fanner, true);
        // a's first record sends to p0, its second to p1 and p2, all in the first round.
        b.out.fail("10");
        let first = || record(1, "p", "a", 1);
        let second = || record(2, "p", "a", 12);
        let report = b.executor.run(vec![first(), second()]).await;
        assert_eq!(report.failed_from.unwrap().as_str(), "1");
        assert_eq!(b.out.bodies(), [vec!["10", "20", "21"]]);
        b.out.failing.lock().unwrap().clear();
        // Lambda drops the first record (aged out, say): the second runs on another state than
        // the one its outputs were computed on, and goes again whole.
        let report = b.executor.run(vec![second()]).await;
        assert_eq!(report.failed_from, None);
        assert_eq!(b.out.bodies()[1..], [vec!["20", "21"]]);

        let b = bench(Fanner, true);
        b.out.fail("10");
        b.executor.run(vec![first(), second()]).await;
        b.out.failing.lock().unwrap().clear();
        // The retry from the first record sends only its output.
        let report = b.executor.run(vec![first(), second()]).await;
        assert_eq!(report.failed_from, None);
        assert_eq!(b.out.bodies()[1..], [vec!["10"]]);
    }

    #[tokio::test]
    async fn an_earlier_records_output_waiting_behind_another_still_goes_when_a_later_records_fails(
    ) {
        let b = bench(Fanner, true);
        // Records 1 and 2 send to p0, one after the other; record 3 to p1, beside record 1.
        b.out.fail("30");
        let batch = || {
            vec![
                record(1, "p", "a", 1),
                record(2, "p", "a", 1),
                record(3, "p", "a", 11),
            ]
        };
        let report = b.executor.run(batch()).await;
        assert_eq!(report.failed_from.unwrap().as_str(), "3");
        assert_eq!(
            b.out.bodies(),
            [vec!["10", "30"], vec!["20"]],
            "record 2 is committed: its output went"
        );
        b.out.failing.lock().unwrap().clear();
        let report = b.executor.run(batch()).await;
        assert_eq!(report.failed_from, None);
        assert_eq!(b.out.bodies()[2..], [vec!["30"]], "only record 3 again");
    }

    #[test]
    fn a_failed_outbox_message_stops_every_message_of_its_key_and_each_is_counted_failed() {
        let output = |partition: &str| Output {
            id: crate::domain::OutputId(String::new()),
            sink: "out".into(),
            partition_key: partition.into(),
            body: String::new(),
            settled: false,
        };
        let mut queues = OrderedQueues::default();
        let outbox = Tag::Outbox { group: 0 };
        let first = Tag::Record {
            group: 0,
            position: 0,
            output: 0,
        };
        let other = Tag::Record {
            group: 1,
            position: 0,
            output: 0,
        };
        queues.push(outbox, 1, output("P"));
        queues.push(outbox, 1, output("P"));
        queues.push(outbox, 2, output("Q"));
        queues.push(first, 2, output("Q"));
        queues.push(other, 1, output("P"));
        let (tags, _) = queues.next_round();
        assert_eq!(tags, [outbox, outbox, other]);
        let stopped = queues.stop_key_from(outbox);
        assert_eq!(
            stopped,
            [outbox, first],
            "the outbox's second to P, the record's to Q"
        );
        assert!(queues.next_round().0.is_empty());
    }

    /// Emits, for a record `{"key", "to": [..]}` at sequence number `s`, an output to each
    /// partition key of `to` in turn, the `i`th with body `100 s + i`; counts its records.
    struct Router;

    impl KeyedOperator for Router {
        type Input = (String, Vec<u8>);

        fn name(&self) -> &str {
            "router"
        }

        fn states(&self) -> Vec<StateDescriptor> {
            vec![SUM.descriptor()]
        }

        fn sinks(&self) -> Vec<SinkDescriptor> {
            vec![OUT.descriptor()]
        }

        fn decode(&self, record: &SourceRecord) -> Result<(String, Vec<u8>), InvalidInput> {
            let Payload::Bytes(data) = &record.payload else {
                return Err(InvalidInput::new("record", "not Kinesis"));
            };
            serde_json::from_slice(data).map_err(|e| InvalidInput::new("data", e.to_string()))
        }

        fn key(&self, input: &(String, Vec<u8>)) -> String {
            input.0.clone()
        }

        fn process(
            &self,
            ctx: &mut Ctx<'_>,
            (_, to): (String, Vec<u8>),
        ) -> Result<(), ProcessError> {
            let mut count = ctx.value(&SUM)?;
            let n = count.get().copied().unwrap_or(0) + 1;
            count.set(n);
            let s: i64 = ctx.record().sequence.as_str().parse().unwrap();
            for (i, partition) in to.into_iter().enumerate() {
                ctx.emit(&OUT, format!("p{partition}"), &(100 * s + i as i64))?;
            }
            Ok(())
        }
    }

    /// An ordered sink that fails each message at `rate`, and keeps those it took, in order.
    struct Flaky {
        rng: std::sync::Mutex<rand::rngs::StdRng>,
        rate: f64,
        took: std::sync::Mutex<Vec<Output>>,
    }

    #[async_trait::async_trait]
    impl Sink for Flaky {
        async fn send(&self, messages: &[Output], _: Deadline) -> Vec<(usize, SinkError)> {
            use rand::Rng;
            let mut rng = self.rng.lock().unwrap();
            let mut failed = Vec::new();
            for (i, message) in messages.iter().enumerate() {
                if rng.random_bool(self.rate) {
                    failed.push((i, SinkError::Unavailable("flaky".into())));
                } else {
                    self.took.lock().unwrap().push(message.clone());
                }
            }
            failed
        }

        fn max_message_bytes(&self) -> usize {
            1024
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Records of three keys, each emitting to some of four partition keys, a sink failing
        /// messages at random, and Lambda's retries from the lowest failed record: every output
        /// arrives, and each key's outputs to one partition key arrive first in the order emitted.
        #[test]
        fn outputs_to_flaky_ordered_sinks_all_arrive_first_in_each_keys_order_per_partition_key(
            records in proptest::collection::vec(
                (0u8..3, proptest::collection::vec(0u8..4, 0..4)),
                1..24,
            ),
            rate in 0.0f64..0.4,
            seed in 0u64..1_000,
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let (executor, flaky, _) = flaky_router(seed, rate);
            let batch: Vec<_> = records
                .iter()
                .enumerate()
                .map(|(i, (key, to))| {
                    let mut r = record(i as u64 + 1, "p", "", 0).unwrap();
                    let body = serde_json::json!([format!("k{key}"), to]).to_string();
                    r.payload = Payload::Bytes(body.into_bytes().into());
                    Ok(r)
                })
                .collect();
            let mut from = 0;
            for _ in 0..500 {
                let report = runtime.block_on(executor.run(batch[from..].to_vec()));
                match report.failed_from {
                    None => {
                        from = batch.len();
                        break;
                    }
                    Some(seq) => from = seq.as_str().parse::<usize>().unwrap() - 1,
                }
            }
            proptest::prop_assert_eq!(from, batch.len(), "the batch ends applied");
            // What each key emitted to each partition key, in order.
            let mut emitted: HashMap<(u8, u8), Vec<String>> = HashMap::new();
            for (s, (key, to)) in records.iter().enumerate() {
                for (i, partition) in to.iter().enumerate() {
                    let body = (100 * (s as i64 + 1) + i as i64).to_string();
                    emitted.entry((*key, *partition)).or_default().push(body);
                }
            }
            let took = flaky.took.lock().unwrap();
            for ((key, partition), bodies) in emitted {
                let mut first = Vec::new();
                for output in took.iter() {
                    if output.partition_key == format!("p{partition}")
                        && bodies.contains(&output.body)
                        && !first.contains(&output.body)
                    {
                        first.push(output.body.clone());
                    }
                }
                proptest::prop_assert_eq!(&first, &bodies, "key k{} to p{}", key, partition);
            }
        }
    }

    /// Key a's one record at sequence number 1, with an output to each of `to`'s partition keys.
    fn one_record_to(to: &[u8]) -> Result<SourceRecord, RejectedRecord> {
        let mut r = record(1, "p", "", 0).unwrap();
        r.payload = Payload::Bytes(serde_json::json!(["a", to]).to_string().into_bytes().into());
        Ok(r)
    }

    /// A `Router` whose sink fails messages at `rate` (seeded with `seed`), on a store of its own.
    fn flaky_router(
        seed: u64,
        rate: f64,
    ) -> (
        Executor<Router>,
        Arc<Flaky>,
        Arc<DynamoStateStore<crate::adapters::dynamodb::MemoryTable>>,
    ) {
        flaky_executor(Router, seed, rate)
    }

    /// `operator` with a sink that fails messages at `rate` (seeded with `seed`), on a store of
    /// its own.
    fn flaky_executor<O: KeyedOperator>(
        operator: O,
        seed: u64,
        rate: f64,
    ) -> (
        Executor<O>,
        Arc<Flaky>,
        Arc<DynamoStateStore<crate::adapters::dynamodb::MemoryTable>>,
    ) {
        use rand::SeedableRng;
        let clock = ManualClock::at(START);
        let table = Arc::new(crate::adapters::dynamodb::MemoryTable::new());
        let store = Arc::new(DynamoStateStore::new(table, clock.clone()));
        let flaky = Arc::new(Flaky {
            rng: std::sync::Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
            rate,
            took: std::sync::Mutex::new(Vec::new()),
        });
        let sinks = Sinks::new(Arc::new(Recorder::default())).with(&OUT, flaky.clone());
        let executor = Executor::new(operator, store.clone(), sinks, clock).unwrap();
        (executor, flaky, store)
    }

    /// Runs key a's record to `to` until it is applied, at most `most` times; returns how many
    /// runs it took and the bodies the sink took, sorted.
    async fn until_applied(
        executor: &Executor<Router>,
        flaky: &Flaky,
        to: &[u8],
        most: usize,
    ) -> (usize, Vec<i64>) {
        let mut runs = 0;
        loop {
            runs += 1;
            assert!(runs <= most, "a part of the record goes out at each retry");
            if executor
                .run(vec![one_record_to(to)])
                .await
                .failed_from
                .is_none()
            {
                break;
            }
        }
        let took = flaky.took.lock().unwrap();
        let mut bodies: Vec<i64> = took.iter().map(|o| o.body.parse().unwrap()).collect();
        bodies.sort_unstable();
        (runs, bodies)
    }

    #[tokio::test]
    async fn a_record_whose_outputs_a_sink_takes_only_in_part_sends_at_each_retry_only_those_not_yet_sent(
    ) {
        // Three in ten messages fail, wherever they fall: a record of 3,000 outputs never has
        // all of them go out in one invocation.
        let (executor, flaky, _) = flaky_router(7, 0.3);
        let to: Vec<u8> = (0..3_000).map(|i| (i % 250) as u8).collect();
        let (runs, bodies) = until_applied(&executor, &flaky, &to, 40).await;
        let expected: Vec<i64> = (0..3_000).map(|i| 100 + i).collect();
        assert_eq!(bodies, expected, "each output once: none sent again");
        assert!(runs > 2, "{runs}: the record did take several");
    }

    #[tokio::test]
    async fn a_retry_that_sends_nothing_more_of_a_record_writes_nothing_and_keeps_its_notes() {
        use crate::ports::StateStore;
        let b = bench(Fanner, true);
        let store = DynamoStateStore::new(b.table.clone(), b.clock.clone());
        let version = || async {
            let ns = b.executor.namespace();
            store.load(ns, &["a".to_owned()]).await.unwrap()["a"].version
        };
        // Record 1 of n = 5: bodies 10 to 14, to p0 to p4; 12 cannot go out.
        b.out.fail("12");
        let first = b.executor.run(vec![record(1, "p", "a", 5)]).await;
        assert!(first.failed_from.is_some());
        let noted = version().await;
        assert_eq!(noted, 1, "the notes' commit");
        for _ in 0..3 {
            let again = b.executor.run(vec![record(1, "p", "a", 5)]).await;
            assert!(again.failed_from.is_some());
            assert_eq!(again.notes_unused, 0);
        }
        // Each such write would retire the notes of the key's other records, and a timer that
        // keeps failing would write its key every minute for good.
        assert_eq!(
            version().await,
            noted,
            "nothing more went out: nothing written"
        );
        b.out.failing.lock().unwrap().clear();
        let last = b.executor.run(vec![record(1, "p", "a", 5)]).await;
        assert_eq!(last.failed_from, None);
        let mut sent: Vec<String> = b.out.bodies().concat();
        sent.sort();
        sent.dedup();
        assert_eq!(sent, ["10", "11", "12", "13", "14"]);
        let twelve = b
            .out
            .bodies()
            .concat()
            .iter()
            .filter(|x| *x == "12")
            .count();
        let others = b.out.bodies().concat().len() - twelve;
        assert_eq!(others, 4, "the others went out once");
    }

    #[tokio::test]
    async fn a_timer_whose_sink_refuses_one_output_for_an_hour_writes_its_key_only_as_more_goes_out_and_sends_each_other_once(
    ) {
        use crate::ports::StateStore;
        let b = bench(Fanner, true);
        let store = DynamoStateStore::new(b.table.clone(), b.clock.clone());
        let version = || async {
            let ns = b.executor.namespace();
            store.load(ns, &["a".to_owned()]).await.unwrap()["a"].version
        };
        b.executor.run(vec![record(1, "p", "a", -1)]).await;
        // Output 1,500 (to p0) cannot go out; those after it to p0 wait behind it.
        b.out.fail("1500");
        // A firing writes the key only when more went out than its notes say: each round that
        // went beside the failed output, then nothing for the rest of the hour.
        let delivered = || {
            let sent = b.out.bodies().concat();
            sent.iter().filter(|body| *body != "1500").count()
        };
        let (mut written, mut last) = (0, version().await);
        for minute in 0..60 {
            let before = delivered();
            let sweep = b.executor.fire_timers(None).await.unwrap();
            assert_eq!((sweep.fired, sweep.left), (0, 1));
            let now = version().await;
            let progressed = delivered() > before;
            assert_eq!(
                now > last,
                progressed,
                "minute {minute}: written iff more went out"
            );
            written += usize::from(now > last);
            last = now;
            b.clock.advance(60_000);
        }
        assert!(written < 10, "{written} writes in an hour");
        b.out.failing.lock().unwrap().clear();
        let sweep = b.executor.fire_timers(None).await.unwrap();
        assert_eq!((sweep.fired, sweep.left), (1, 0));
        let sent = b.out.bodies().concat();
        let mut once: Vec<&String> = sent.iter().filter(|body| *body != "1500").collect();
        assert_eq!(once.len(), 2_999, "every other output went once");
        once.sort();
        once.dedup();
        assert_eq!(once.len(), 2_999);
        assert_eq!(sent.iter().filter(|body| *body == "1500").count(), 61);
    }

    #[tokio::test]
    async fn a_timer_whose_outputs_a_sink_takes_only_in_part_sends_at_each_firing_only_those_not_yet_sent(
    ) {
        // As for a record: sent whole at each firing, 3,000 outputs with three in ten failing
        // would never all go out, and the timer would come due again for good.
        let (executor, flaky, _) = flaky_executor(Fanner, 7, 0.3);
        let set = executor.run(vec![record(1, "p", "a", -1)]).await;
        assert_eq!(set.applied, 1);
        let mut firings = 0;
        loop {
            firings += 1;
            assert!(
                firings <= 40,
                "a part of the timer's outputs goes out at each firing"
            );
            let timer = SourceRecord::timer("a", START - 1_000);
            if executor.run(vec![Ok(timer)]).await.failed_from.is_none() {
                break;
            }
        }
        let again = executor
            .run(vec![Ok(SourceRecord::timer("a", START - 1_000))])
            .await;
        assert_eq!((again.applied, again.replayed), (0, 1), "fired once");
        let took = flaky.took.lock().unwrap();
        let mut bodies: Vec<i64> = took.iter().map(|o| o.body.parse().unwrap()).collect();
        bodies.sort_unstable();
        let expected: Vec<i64> = (0..3_000).collect();
        assert_eq!(bodies, expected, "each output once: none sent again");
        assert!(firings > 2, "{firings}: the timer did take several");
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_whose_outputs_to_one_partition_key_take_longer_than_an_invocation_goes_out_over_several_in_order(
    ) {
        let (executor, timed, clock) = timed_router();
        // 2,000 outputs to p0: a round of 10 ms each, 20 s of sending for a function of 6 s.
        let to = vec![0u8; 2_000];
        let mut invocations = 0;
        loop {
            invocations += 1;
            assert!(invocations <= 5, "five seconds of sending an invocation");
            let deadline = clock.now_millis() + 6_000;
            let report = executor
                .run_until(vec![one_record_to(&to)], Some(deadline))
                .await;
            if report.failed_from.is_none() {
                break;
            }
        }
        let bodies = timed.bodies();
        let expected: Vec<String> = (0..2_000).map(|i: i64| (100 + i).to_string()).collect();
        assert_eq!(bodies, expected, "each output once, in order");
    }

    /// Runs key a's record of 200 outputs once (half of them fail), rewrites the key as loaded
    /// with `rewrite`, and runs it until applied: says how many of its outputs went out again,
    /// and how many keys the first retry reported notes unused for.
    async fn sent_again_after(
        rewrite: impl FnOnce(&mut crate::domain::KeyState),
    ) -> (usize, usize) {
        use crate::ports::{Commit, StateStore};
        let (executor, flaky, store) = flaky_router(3, 0.5);
        let to: Vec<u8> = (0..200).collect();
        let first = executor.run(vec![one_record_to(&to)]).await;
        assert!(first.failed_from.is_some());
        let ns = executor.namespace().clone();
        let mut loaded = store.load(&ns, &["a".to_owned()]).await.unwrap();
        let mut state = loaded.remove("a").unwrap();
        let notes = state.sent_so_far.as_ref().expect("the record's note");
        assert_eq!(notes.records.len(), 1);
        let version = state.version;
        rewrite(&mut state);
        let committed = store
            .commit(&ns, vec![Commit::new("a", version, state)])
            .await;
        assert!(committed[0].is_ok());
        flaky.took.lock().unwrap().clear();
        let unused = executor.run(vec![one_record_to(&to)]).await.notes_unused;
        let (_, mut bodies) = until_applied(&executor, &flaky, &to, 50).await;
        bodies.dedup();
        (bodies.len(), unused)
    }

    #[tokio::test]
    async fn what_went_out_of_a_record_is_sent_again_after_a_commit_from_outside_that_kept_the_note(
    ) {
        // A tool (a sweep, a migration) rewrites the key as loaded, the note with it: the state
        // it leaves may not be the one the record ran on.
        let again = sent_again_after(|state| state.clear_slots()).await;
        assert_eq!(again, (200, 1), "every output sent again, the key counted");
        // The same note at the version it lands at, as if the code that wrote it had written
        // it: only the outputs that did not go out go.
        let (again, unused) = sent_again_after(|state| {
            let notes = state.sent_so_far.as_mut().unwrap();
            notes.version += 1;
        })
        .await;
        assert!(again < 200, "{again}");
        assert_eq!(unused, 0);
    }

    #[tokio::test]
    async fn what_went_out_of_a_record_is_sent_again_under_another_build() {
        let again = sent_again_after(|state| {
            let notes = state.sent_so_far.as_mut().unwrap();
            notes.version += 1;
            notes.build ^= 1;
        })
        .await;
        assert_eq!(again, (200, 1), "every output sent again, the key counted");
    }

    #[tokio::test]
    async fn notes_kept_through_a_redelivery_of_records_applied_before_are_not_counted_unused() {
        let (executor, flaky, _) = flaky_router(5, 0.5);
        let routed = |seq: u64, to: &[u8]| {
            let mut r = record(seq, "p", "", 0).unwrap();
            r.payload =
                Payload::Bytes(serde_json::json!(["a", to]).to_string().into_bytes().into());
            Ok(r)
        };
        let to: Vec<u8> = (0..200).collect();
        let first = executor.run(vec![routed(1, &[]), routed(2, &to)]).await;
        assert_eq!(
            first.failed_from.unwrap().as_str(),
            "2",
            "record 2 went out in part"
        );
        // Record 1 again alone (a duplicate delivery): nothing runs, the notes stay.
        let again = executor.run(vec![routed(1, &[])]).await;
        assert_eq!((again.replayed, again.notes_unused), (1, 0));
        // Record 2's retry uses them.
        let sent_first = flaky.took.lock().unwrap().len();
        flaky.took.lock().unwrap().clear();
        let retry = executor.run(vec![routed(2, &to)]).await;
        assert_eq!(retry.notes_unused, 0);
        assert!(flaky.took.lock().unwrap().len() <= 200 - sent_first);
    }

    /// A `Router` that reads a broadcast state before it routes, as the CDC re-key does.
    struct Broadcasting;

    const ROUTES: crate::operator::BroadcastState<Vec<u8>> =
        crate::operator::BroadcastState::new("routes");

    impl KeyedOperator for Broadcasting {
        type Input = (String, Vec<u8>);

        fn name(&self) -> &str {
            "broadcasting"
        }

        fn states(&self) -> Vec<StateDescriptor> {
            vec![SUM.descriptor(), ROUTES.descriptor()]
        }

        fn sinks(&self) -> Vec<SinkDescriptor> {
            Router.sinks()
        }

        fn decode(&self, record: &SourceRecord) -> Result<(String, Vec<u8>), InvalidInput> {
            Router.decode(record)
        }

        fn key(&self, input: &(String, Vec<u8>)) -> String {
            Router.key(input)
        }

        fn process(&self, ctx: &mut Ctx<'_>, input: (String, Vec<u8>)) -> Result<(), ProcessError> {
            assert!(ctx.broadcast(&ROUTES)?.is_none(), "no routes were set");
            Router.process(ctx, input)
        }
    }

    #[tokio::test]
    async fn an_operator_that_reads_broadcast_state_notes_nothing_of_what_went_out_and_sends_a_retried_record_whole(
    ) {
        // A broadcast state can change between two attempts without the key's version showing
        // it, and the outputs with it: a note would skip outputs the retry no longer computes.
        use crate::ports::StateStore;
        let (executor, flaky, store) = flaky_executor(Broadcasting, 3, 0.5);
        let to: Vec<u8> = (0..200).collect();
        assert!(executor
            .run(vec![one_record_to(&to)])
            .await
            .failed_from
            .is_some());
        let first: Vec<Output> = std::mem::take(&mut *flaky.took.lock().unwrap());
        assert!(!first.is_empty(), "some outputs went out");
        let ns = executor.namespace().clone();
        let mut loaded = store.load(&ns, &["a".to_owned()]).await.unwrap();
        let state = loaded.remove("a").expect("the key's state");
        assert!(
            state.sent_so_far.is_none(),
            "no note: {:?}",
            state.sent_so_far
        );
        executor.run(vec![one_record_to(&to)]).await;
        let again = flaky.took.lock().unwrap();
        assert!(
            first
                .iter()
                .any(|sent| again.iter().any(|o| o.body == sent.body)),
            "the retry sends outputs that went out before"
        );
    }

    #[tokio::test]
    async fn what_went_out_of_a_record_is_not_skipped_once_another_commit_changed_its_key() {
        let (executor, flaky, _) = flaky_router(1, 0.5);
        let to: Vec<u8> = (0..200).collect();
        let report = executor.run(vec![one_record_to(&to)]).await;
        assert!(report.failed_from.is_some(), "half of the outputs failed");
        let sent_first = flaky.took.lock().unwrap().len();
        // Another lineage's record of key a commits before the retry: the state the record ran
        // on is gone, and so is what its outputs were.
        let mut other = record(9, "q", "", 0).unwrap();
        other.payload = Payload::Bytes(br#"["a", []]"#.to_vec().into());
        other.lineage = crate::domain::Origin("stream/shardId-1/q".into());
        assert_eq!(executor.run(vec![Ok(other)]).await.failed_from, None);
        flaky.took.lock().unwrap().clear();
        let (_, mut bodies) = until_applied(&executor, &flaky, &to, 50).await;
        bodies.dedup();
        let left = 200 - sent_first;
        assert_eq!(
            bodies.len(),
            200,
            "every output sent again, not only the {left} left"
        );
    }

    /// An ordered sink whose every call takes ten seconds, on tokio's clock and on `clock`; it
    /// keeps the number of messages of each call.
    struct Slow {
        clock: Arc<ManualClock>,
        calls: std::sync::Mutex<Vec<usize>>,
    }

    #[async_trait::async_trait]
    impl Sink for Slow {
        async fn send(&self, messages: &[Output], _: Deadline) -> Vec<(usize, SinkError)> {
            self.calls.lock().unwrap().push(messages.len());
            tokio::time::sleep(std::time::Duration::from_secs(10)).await;
            self.clock.advance(10_000);
            Vec::new()
        }

        fn max_message_bytes(&self) -> usize {
            1024
        }
    }

    /// An executor of `Router` onto a `Slow` sink, with `config`; and a batch of two records:
    /// key a's, with six outputs to partition key p0 (six rounds), and key b's, with one to p1.
    fn slow_router(
        config: super::super::ExecutorConfig,
    ) -> (
        Executor<Router>,
        Arc<Slow>,
        Vec<Result<SourceRecord, RejectedRecord>>,
    ) {
        let clock = ManualClock::at(START);
        let table = Arc::new(crate::adapters::dynamodb::MemoryTable::new());
        let store = Arc::new(DynamoStateStore::new(table, clock.clone()));
        let slow = Arc::new(Slow {
            clock: clock.clone(),
            calls: std::sync::Mutex::new(Vec::new()),
        });
        let sinks = Sinks::new(Arc::new(Recorder::default())).with(&OUT, slow.clone());
        let executor = Executor::new(Router, store, sinks, clock)
            .unwrap()
            .with_config(config);
        let routed = |seq: u64, key: &str, to: Vec<u8>| {
            let mut r = record(seq, "p", "", 0).unwrap();
            let body = serde_json::json!([key, to]).to_string();
            r.payload = Payload::Bytes(body.into_bytes().into());
            Ok(r)
        };
        let batch = vec![routed(1, "a", vec![0; 6]), routed(2, "b", vec![1])];
        (executor, slow, batch)
    }

    #[tokio::test(start_paused = true)]
    async fn near_the_deadline_an_ordered_sink_gets_no_more_rounds_and_the_records_left_are_retried(
    ) {
        let (executor, slow, batch) = slow_router(Default::default());
        // Sends stop a second before the deadline, at 20 s: rounds start at 0 and 10 s.
        let report = executor
            .run_until(batch.clone(), Some(START + 21_000))
            .await;
        assert_eq!(
            *slow.calls.lock().unwrap(),
            [2, 1],
            "a's first two, b's one"
        );
        assert_eq!(
            report.failed_from.unwrap().as_str(),
            "1",
            "a's record is retried"
        );
        let report = executor.run_until(batch, None).await;
        assert_eq!(report.failed_from, None);
        assert_eq!(
            *slow.calls.lock().unwrap(),
            [2, 1, 1, 1, 1, 1],
            "b's record was applied, and is skipped; a's sends the four outputs not sent"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_that_has_not_answered_when_half_the_commit_reserve_is_left_is_given_up_and_its_records_retried(
    ) {
        let (executor, slow, batch) = slow_router(Default::default());
        // A function of 15 s: sends stop at 14 s, the second round (started at 10 s, before
        // then) would answer at 20 s, past the invocation's end.
        let start = tokio::time::Instant::now();
        let report = executor
            .run_until(batch.clone(), Some(START + 15_000))
            .await;
        let took = start.elapsed();
        assert!(
            took <= std::time::Duration::from_millis(14_500),
            "the batch must be done within the invocation's 15 s, not at {took:?}"
        );
        assert_eq!(
            *slow.calls.lock().unwrap(),
            [2, 1],
            "the second round began"
        );
        assert_eq!(
            report.failed_from.unwrap().as_str(),
            "1",
            "a's record is retried, b's applied"
        );
        assert_eq!(report.outputs_sent, 2);
        let report = executor.run_until(batch, None).await;
        assert_eq!(report.failed_from, None);
        assert_eq!(
            *slow.calls.lock().unwrap(),
            [2, 1, 1, 1, 1, 1, 1],
            "a's retry sends its five outputs after the first, the one given up among them"
        );
    }

    /// Runs `slow_router`'s batch with keys started until a second before a deadline
    /// `left_millis` away and sends stopped `commit_reserve` before it, at or before they begin
    /// when the reserve is as long (as when processing takes the time up): the report, the sink,
    /// and how long the batch took.
    async fn late_to_send(
        commit_reserve: std::time::Duration,
        left_millis: i64,
    ) -> (super::super::BatchReport, Arc<Slow>, std::time::Duration) {
        let config = super::super::ExecutorConfig {
            deadline_reserve: std::time::Duration::from_secs(1),
            commit_reserve,
            ..Default::default()
        };
        let (executor, slow, batch) = slow_router(config);
        let start = tokio::time::Instant::now();
        let report = executor.run_until(batch, Some(START + left_millis)).await;
        (report, slow, start.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_that_starts_sending_past_its_send_deadline_still_sends_its_first_round() {
        // The sink's calls take 10 s; 12 s from the deadline with a reserve of 12 s, no call may
        // start but a first, the sends end in 6 s, and the first round has until 1.2 s before
        // the deadline to answer.
        let (report, slow, _) = late_to_send(std::time::Duration::from_secs(12), 12_000).await;
        assert_eq!(
            *slow.calls.lock().unwrap(),
            [2],
            "one round: a's first, b's one"
        );
        assert_eq!(report.outputs_sent, 2, "the round went out");
        assert_eq!(
            report.failed_from.unwrap().as_str(),
            "1",
            "b's record is applied"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_round_that_has_not_answered_within_the_commit_reserve_is_given_up() {
        // Begun 4 s from the deadline with a reserve of 3 s, the sends' end 2.5 s away: a first
        // round has the reserve, and is given up after 3 s, not 10.
        let (report, slow, took) = late_to_send(std::time::Duration::from_secs(3), 4_000).await;
        assert_eq!(*slow.calls.lock().unwrap(), [2]);
        assert_eq!(took, std::time::Duration::from_secs(3));
        assert_eq!(report.outputs_sent, 0);
        assert_eq!(report.failed_from.unwrap().as_str(), "1", "both retried");
        // Begun at once, in a function of 10.2 s: given up at 9.7 s, half the reserve before
        // its end, though the round has more than the reserve's second by then.
        let (executor, slow, batch) = slow_router(Default::default());
        let start = tokio::time::Instant::now();
        let report = executor.run_until(batch, Some(START + 10_200)).await;
        assert_eq!(start.elapsed(), std::time::Duration::from_millis(9_700));
        assert_eq!(*slow.calls.lock().unwrap(), [2]);
        assert_eq!(report.outputs_sent, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_round_begun_past_the_send_deadline_is_given_up_before_the_invocations_deadline(
    ) {
        // 2 s from the deadline with a reserve of 3 s: the reserve would run 1 s past the
        // deadline, where Lambda stops the invocation with nothing committed; given up at a
        // tenth of the reserve before it instead, and the records retried.
        let (report, slow, took) = late_to_send(std::time::Duration::from_secs(3), 2_000).await;
        assert_eq!(*slow.calls.lock().unwrap(), [2]);
        assert_eq!(took, std::time::Duration::from_millis(1_700));
        assert_eq!(report.outputs_sent, 0);
        assert_eq!(report.failed_from.unwrap().as_str(), "1", "both retried");
    }

    /// An ordered sink that takes nothing and never answers while `down`, as a partitioned
    /// network makes a call hang; it keeps the bodies it took once back.
    #[derive(Default)]
    struct Hanging {
        down: std::sync::atomic::AtomicBool,
        took: std::sync::Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl Sink for Hanging {
        async fn send(&self, messages: &[Output], _: Deadline) -> Vec<(usize, SinkError)> {
            if self.down.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            let mut took = self.took.lock().unwrap();
            took.extend(messages.iter().map(|m| m.body.clone()));
            Vec::new()
        }

        fn max_message_bytes(&self) -> usize {
            1024
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_sink_that_does_not_answer_for_an_hour_costs_each_invocation_its_time_and_then_gets_every_output_once(
    ) {
        let clock = ManualClock::at(START);
        let table = Arc::new(crate::adapters::dynamodb::MemoryTable::new());
        let store = Arc::new(DynamoStateStore::new(table, clock.clone()));
        let hanging = Arc::new(Hanging::default());
        hanging.down.store(true, Ordering::SeqCst);
        let sinks = Sinks::new(Arc::new(Recorder::default())).with(&OUT, hanging.clone());
        let executor = Executor::new(Router, store, sinks, clock.clone()).unwrap();
        let routed = |seq: u64, key: &str, to: Vec<u8>| {
            let mut r = record(seq, "p", "", 0).unwrap();
            let body = serde_json::json!([key, to]).to_string();
            r.payload = Payload::Bytes(body.into_bytes().into());
            Ok(r)
        };
        let batch = vec![routed(1, "a", vec![0, 0, 1]), routed(2, "b", vec![2])];
        // Six invocations of a function of ten minutes: each ends half a second before its
        // deadline, with nothing applied, instead of hanging to Lambda's timeout.
        for _ in 0..6 {
            let deadline = clock.now_millis() + 600_000;
            let start = tokio::time::Instant::now();
            let report = executor.run_until(batch.clone(), Some(deadline)).await;
            let took = start.elapsed();
            assert_eq!(took, std::time::Duration::from_millis(599_500));
            assert_eq!((report.outputs_sent, report.applied), (0, 0));
            assert_eq!(report.failed_from.unwrap().as_str(), "1");
            clock.advance(600_000);
        }
        hanging.down.store(false, Ordering::SeqCst);
        let report = executor
            .run_until(batch, Some(clock.now_millis() + 600_000))
            .await;
        assert_eq!(report.failed_from, None);
        assert_eq!(
            *hanging.took.lock().unwrap(),
            ["100", "102", "200", "101"],
            "each output once: a round of a's first to p0, its one to p1 and b's, then a's second \
             to p0"
        );
    }

    /// An ordered sink whose every call takes `per_call`, on tokio's clock and on `clock`; it
    /// keeps what it took, in order.
    struct Timed {
        clock: Arc<ManualClock>,
        per_call: std::time::Duration,
        took: std::sync::Mutex<Vec<Output>>,
    }

    impl Timed {
        fn bodies(&self) -> Vec<String> {
            let took = self.took.lock().unwrap();
            took.iter().map(|o| o.body.clone()).collect()
        }
    }

    #[async_trait::async_trait]
    impl Sink for Timed {
        async fn send(&self, messages: &[Output], _: Deadline) -> Vec<(usize, SinkError)> {
            tokio::time::sleep(self.per_call).await;
            self.clock.advance(self.per_call.as_millis() as i64);
            self.took.lock().unwrap().extend(messages.iter().cloned());
            Vec::new()
        }

        fn max_message_bytes(&self) -> usize {
            1024
        }
    }

    /// A `Router` whose sink's every call takes 10 ms, on the clock it returns.
    fn timed_router() -> (Executor<Router>, Arc<Timed>, Arc<ManualClock>) {
        let clock = ManualClock::at(START);
        let table = Arc::new(crate::adapters::dynamodb::MemoryTable::new());
        let store = Arc::new(DynamoStateStore::new(table, clock.clone()));
        let timed = Arc::new(Timed {
            clock: clock.clone(),
            per_call: std::time::Duration::from_millis(10),
            took: std::sync::Mutex::new(Vec::new()),
        });
        let sinks = Sinks::new(Arc::new(Recorder::default())).with(&OUT, timed.clone());
        let executor = Executor::new(Router, store, sinks, clock.clone()).unwrap();
        (executor, timed, clock)
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_fed_by_thousands_of_records_to_one_partition_key_sends_a_part_each_invocation_in_order_within_its_time(
    ) {
        let (executor, timed, clock) = timed_router();
        // Key a's 2,000 records, an output each to p0: 2,000 rounds of 10 ms, 20 s of sending.
        let batch: Vec<_> = (1..=2_000u64)
            .map(|seq| {
                let mut r = record(seq, "p", "", 0).unwrap();
                let body = serde_json::json!(["a", [0]]).to_string();
                r.payload = Payload::Bytes(body.into_bytes().into());
                Ok(r)
            })
            .collect();
        let (mut from, mut invocations) = (0, 0);
        while from < batch.len() {
            invocations += 1;
            assert!(invocations <= 6, "five seconds of sending an invocation");
            // A function of 6 s: sends stop a second before its deadline.
            let deadline = clock.now_millis() + 6_000;
            let report = executor
                .run_until(batch[from..].to_vec(), Some(deadline))
                .await;
            assert!(
                clock.now_millis() <= deadline - 1_000 + 10,
                "invocation {invocations} sent until {} ms before its deadline",
                deadline - clock.now_millis()
            );
            let next = match report.failed_from {
                None => batch.len(),
                Some(seq) => seq.as_str().parse::<usize>().unwrap() - 1,
            };
            assert!(next > from, "invocation {invocations} commits some records");
            from = next;
        }
        // Each record's output went once, in the key's order: a record is committed once its
        // output went, and the rest wait for the retry.
        let bodies = timed.bodies();
        let expected: Vec<String> = (1..=2_000).map(|s: i64| (100 * s).to_string()).collect();
        assert_eq!(bodies, expected);
    }

    #[tokio::test]
    async fn a_sink_without_order_gets_every_output_in_one_call() {
        let b = bench(Summer::default(), false);
        b.out.fail("3");
        let batch = vec![
            record(1, "p", "a", 1),
            record(2, "p", "a", 2),
            record(3, "p", "a", 3),
        ];
        let report = b.executor.run(batch).await;
        assert_eq!(b.out.bodies(), [vec!["1", "3", "6"]]);
        assert_eq!(report.outputs_sent, 2, "the failed output is not counted");
    }

    #[tokio::test]
    async fn an_output_the_sink_refuses_is_dead_lettered_and_its_key_goes_on() {
        let b = bench(Summer::default(), true);
        b.out.refusing.lock().unwrap().insert("1".into());
        let report = b
            .executor
            .run(vec![record(1, "p", "a", 1), record(2, "p", "a", 2)])
            .await;
        assert_eq!(report.failed_from, None);
        assert_eq!(b.out.bodies(), [vec!["1"], vec!["3"]]);
        assert_eq!((report.outputs_sent, report.dead_lettered), (1, 1));
        let letters = b.dead.bodies();
        assert_eq!(letters.len(), 1);
        assert!(letters[0][0].contains("output.out"), "{letters:?}");
    }

    #[tokio::test]
    async fn a_sink_that_keeps_the_latest_gets_only_each_keys_last_output_of_an_invocation() {
        let b = bench_with(Summer::default(), true, |sinks| sinks.keep_latest(&OUT));
        let batch = vec![
            record(1, "p", "a", 1),
            record(2, "q", "b", 5),
            record(3, "p", "a", 2),
            record(4, "p", "a", 3),
        ];
        let report = b.executor.run(batch).await;
        assert_eq!(report.failed_from, None);
        assert_eq!(
            b.out.bodies(),
            [vec!["6", "5"]],
            "a's 1 and 3 are superseded by 6"
        );
        assert_eq!(report.outputs_sent, 2);
        // The output kept has the id of the record that emitted it last.
        let last = crate::domain::OutputId::derive(
            "summer",
            "out",
            &crate::domain::Origin("s/shardId-0".into()),
            &crate::domain::SequenceNumber::parse("4").unwrap(),
            0,
        );
        assert_eq!(b.out.calls.lock().unwrap()[0][0].id, last);
    }

    #[tokio::test]
    async fn a_latest_output_that_fails_retries_every_record_it_stands_for_and_none_twice() {
        let b = bench_with(Summer::default(), true, |sinks| sinks.keep_latest(&OUT));
        b.out.fail("6");
        let batch = || {
            vec![
                record(1, "p", "a", 1),
                record(2, "p", "a", 2),
                record(3, "p", "a", 3),
                record(4, "q", "b", 5),
            ]
        };
        let report = b.executor.run(batch()).await;
        assert_eq!(
            report.failed_from.unwrap().as_str(),
            "1",
            "a's first record waits: none of a's records is committed without its count"
        );
        b.out.failing.lock().unwrap().clear();
        // Lambda retries from the first failed record; b's record is skipped as applied.
        let report = b.executor.run(batch()).await;
        assert_eq!(report.failed_from, None);
        assert_eq!(b.out.bodies(), [vec!["6", "5"], vec!["6"]]);
    }
}
