//! What each batch says of skew, as one CloudWatch Embedded Metric Format line (no API call)
//! with `Function`, `Operator` and `Shard` dimensions: the shard's records and bytes, its distinct
//! keys, the records of its heaviest key and the state of its largest key, with the heaviest keys
//! themselves (their records and their state's bytes) as a property. One shard carrying much more
//! than the others shows as a coefficient of variation of `Records` across shards (metric math
//! the stack alarms on); one key carrying most of a shard, as `HottestKeyRecords` near `Records`;
//! one key's state growing towards the item limit, as `LargestKeyStateBytes`.
//!
//! The line is written once the batch's keys have run, so that a key's state is measured as the
//! batch leaves it: the encoded entries of its slots, which is what the store writes.
//!
//! A second line, with `Function` and `Operator` dimensions only, says what came of the batch
//! once it is committed (`outcome_line`): what the stack's dashboard graphs.

use std::sync::Arc;

use serde_json::json;

use super::plan::Plan;
use super::process::KeyWork;
use super::report::BatchReport;
use crate::domain::item::item_size;
use crate::domain::metrics::Emf;
use crate::domain::skew::HeatReport;
use crate::domain::{Payload, SourceRecord};
use crate::ports::MetricLog;

/// Keys a line names, heaviest first.
const HOT_KEYS_NAMED: usize = 3;

/// Where an executor writes its batches' lines, and the function it runs in.
pub(super) struct Observer {
    pub log: Arc<dyn MetricLog>,
    pub function: String,
}

impl Observer {
    /// The line of the batch `plan` grouped, by `operator`, whose keys ran to `keys`, at `now`;
    /// none for an empty batch.
    pub(super) fn line(
        &self,
        operator: &str,
        plan: &Plan<'_>,
        keys: &[KeyWork],
        now: i64,
    ) -> Option<String> {
        let records: Vec<&SourceRecord> = plan.batch.iter().flatten().collect();
        let first = records.first()?;
        let shard = first.origin.as_str().rsplit('/').next().unwrap_or_default();
        let bytes: usize = records.iter().map(|r| payload_bytes(&r.payload)).sum();
        let mut heavy: Vec<(&str, usize, usize)> = plan
            .groups
            .iter()
            .zip(keys)
            .map(|(g, work)| (g.key.as_str(), g.records.len(), state_bytes(work)))
            .collect();
        let largest_state = heavy.iter().map(|h| h.2).max().unwrap_or(0);
        heavy.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let named: Vec<_> = heavy
            .iter()
            .take(HOT_KEYS_NAMED)
            .map(|(key, n, state)| json!({"key": key, "records": n, "state_bytes": state}))
            .collect();
        let line = Emf::new(now)
            .dimension("Function", self.function.as_str())
            .dimension("Operator", operator)
            .dimension("Shard", shard)
            .count("Records", plan.batch.len() as u64)
            .bytes("Bytes", bytes as u64)
            .count("DistinctKeys", plan.groups.len() as u64)
            .count("HottestKeyRecords", heavy.first().map_or(0, |h| h.1) as u64)
            .bytes("LargestKeyStateBytes", largest_state as u64)
            .property("HotKeys", json!(named))
            .to_line();
        Some(line)
    }
}

impl Observer {
    /// What came of a batch, once committed: its records, what was applied, skipped as applied
    /// already, dead-lettered, sent, lost to a concurrent writer and left for Lambda to retry; how
    /// long it took, and the age of its newest record when it started (Lambda's IteratorAge, as
    /// the function saw it). None for an empty batch.
    pub(super) fn outcome_line(
        &self,
        operator: &str,
        plan: &Plan<'_>,
        report: &BatchReport,
        now: i64,
        took: std::time::Duration,
    ) -> Option<String> {
        if report.records == 0 {
            return None;
        }
        let records = || {
            plan.batch
                .iter()
                .flatten()
                .filter(|r| r.as_timer().is_none())
        };
        let left = report
            .failed_from
            .as_ref()
            .map_or(0, |from| records().filter(|r| r.sequence >= *from).count());
        let mut line = Emf::new(now)
            .dimension("Function", self.function.as_str())
            .dimension("Operator", operator)
            .count("RecordsIn", report.records as u64)
            .count("Applied", report.applied as u64)
            .count("DuplicatesSkipped", report.replayed as u64)
            .count("DeadLetters", report.dead_lettered as u64)
            .count("Outputs", report.outputs_sent as u64)
            .count("CommitConflicts", report.conflicts as u64)
            .count("SentNotesUnused", report.notes_unused as u64)
            .count("RecordsLeftForRetry", left as u64)
            .milliseconds("BatchDuration", took.as_secs_f64() * 1000.0);
        if let Some(newest) = records().filter_map(|r| r.arrival_millis).max() {
            line = line.milliseconds("IteratorAge", (now - newest).max(0) as f64);
        }
        Some(line.to_line())
    }
}

/// What the batch `plan` grouped tells the hot-key registry at `now`: its records by the key
/// their producer salts. Timers are no records: a batch of timers only reports nothing, but still
/// lets the registry decide the periods that ended (traffic may have stopped). None for an
/// empty batch.
pub(super) fn heat(plan: &Plan<'_>, now: i64, floor_share: f64) -> Option<HeatReport> {
    if plan.groups.is_empty() {
        return None;
    }
    let arrival = |&i: &usize| plan.record(i).as_timer().is_none();
    let mut counts = Vec::with_capacity(plan.groups.len());
    for group in &plan.groups {
        let n = group.records.iter().filter(|i| arrival(i)).count() as u64;
        if n > 0 {
            let key = plan.hot_keys.get(&group.key).unwrap_or(&group.key);
            counts.push((key.clone(), n));
        }
    }
    let first = plan
        .groups
        .iter()
        .flat_map(|g| g.records.iter())
        .filter(|i| arrival(i))
        .min();
    let batch = first.map_or_else(String::new, |&i| {
        let first = plan.record(i);
        format!("{}/{}", first.origin.as_str(), first.sequence)
    });
    let records = counts.iter().map(|(_, n)| n).sum();
    Some(HeatReport::new(now, batch, records, counts, floor_share))
}

/// The bytes of a key's state as its run leaves it: each slot's entries as loaded, less what the
/// run dropped, plus what it added.
fn state_bytes(work: &KeyWork) -> usize {
    let size = |entries: &[Box<serde_json::value::RawValue>]| -> usize {
        entries.iter().map(|e| e.get().len()).sum()
    };
    let loaded: usize = work
        .base
        .slots
        .iter()
        .map(|(name, slot)| match work.updates.get(name.as_str()) {
            Some(change) => size(&slot.entries[..change.update.keep.min(slot.entries.len())]),
            None => size(&slot.entries),
        })
        .sum();
    let added: usize = work.updates.values().map(|c| size(&c.update.tail)).sum();
    loaded + added
}

/// A record's size: its data, or a DynamoDB change's item as DynamoDB sizes it (its new image,
/// or the old one for a removal).
fn payload_bytes(payload: &Payload) -> usize {
    match payload {
        Payload::Bytes(data) => data.len(),
        Payload::Change(change) => {
            let image = change.new_image.as_ref().or(change.old_image.as_ref());
            item_size(image.unwrap_or(&change.keys))
        }
        Payload::Timer { .. } => 0,
    }
}
