//! Phase 1: decode every record into the operator's input and group the records by key, keeping
//! arrival order within a key. Records that do not decode become dead letters here.

use std::panic::{catch_unwind, AssertUnwindSafe};

use tracing::error;

use super::{Executor, RejectedRecord};
use crate::domain::{BatchPlan, DeadLetter, KeyGroup, SequenceNumber, SourceRecord};
use crate::operator::{InvalidInput, KeyedOperator};

/// A batch decoded and grouped. (The decoded inputs travel apart: they need not be `Sync`.)
pub(super) struct Plan<'b> {
    pub batch: &'b [Result<SourceRecord, RejectedRecord>],
    pub groups: Vec<KeyGroup>,
    /// Records rejected before they had a key, with their dead letters.
    pub unkeyed: Vec<(usize, DeadLetter)>,
    /// Records whose decoding panicked: a bug, so they are retried, not dead-lettered.
    pub panicked: Vec<usize>,
}

impl<'b> Plan<'b> {
    /// The record at `index`, which decoded.
    pub fn record(&self, index: usize) -> &'b SourceRecord {
        self.batch[index]
            .as_ref()
            .expect("keyed records are records")
    }

    pub fn sequence_of(&self, index: usize) -> Option<&'b SequenceNumber> {
        match &self.batch[index] {
            Ok(record) => Some(&record.sequence),
            Err(rejected) => rejected.sequence.as_ref(),
        }
    }

    /// The records of a key's group, in order.
    pub fn records_of(&self, group: usize) -> Vec<&'b SourceRecord> {
        self.groups[group]
            .records
            .iter()
            .map(|&i| self.record(i))
            .collect()
    }
}

impl<O: KeyedOperator> Executor<O> {
    /// The plan, and the decoded inputs by batch index (taken by the first run of their key).
    pub(super) fn plan<'b>(
        &self,
        batch: &'b [Result<SourceRecord, RejectedRecord>],
    ) -> (Plan<'b>, Vec<Option<O::Input>>) {
        let mut inputs = Vec::with_capacity(batch.len());
        let mut keyed: Vec<(usize, String)> = Vec::with_capacity(batch.len());
        let mut unkeyed = Vec::new();
        let mut panicked = Vec::new();
        for (index, item) in batch.iter().enumerate() {
            let record = match item {
                Ok(record) => record,
                Err(rejected) => {
                    unkeyed.push((index, self.rejected_letter(rejected)));
                    inputs.push(None);
                    continue;
                }
            };
            let decoded = catch_unwind(AssertUnwindSafe(|| {
                self.operator
                    .decode(record)
                    .map(|input| (self.operator.key(&input), input))
            }));
            match decoded {
                Ok(Ok((key, input))) => {
                    keyed.push((index, key));
                    inputs.push(Some(input));
                }
                Ok(Err(invalid)) => {
                    unkeyed.push((index, self.dead_letter(record, None, invalid)));
                    inputs.push(None);
                }
                Err(_) => {
                    error!(operator = %self.namespace.operator, sequence = %record.sequence, "decoding panicked; the record will be redelivered");
                    panicked.push(index);
                    inputs.push(None);
                }
            }
        }
        let groups = BatchPlan::group(keyed.iter().map(|(i, k)| (*i, k.as_str()))).groups;
        let plan = Plan {
            batch,
            groups,
            unkeyed,
            panicked,
        };
        (plan, inputs)
    }

    fn rejected_letter(&self, rejected: &RejectedRecord) -> DeadLetter {
        DeadLetter::new(
            self.operator.name(),
            rejected.origin.clone(),
            rejected.sequence.as_ref().map(|s| s.to_string()),
            rejected.field.clone(),
            rejected.problem.clone(),
            rejected.raw.to_string(),
        )
    }

    /// The dead letter for `record`, which cannot be processed for `invalid`.
    pub(super) fn dead_letter(
        &self,
        record: &SourceRecord,
        key: Option<&str>,
        invalid: InvalidInput,
    ) -> DeadLetter {
        let problem = match key {
            Some(key) => format!("{} (key {key:?})", invalid.problem),
            None => invalid.problem,
        };
        DeadLetter::new(
            self.operator.name(),
            Some(record.origin.to_string()),
            Some(record.sequence.to_string()),
            invalid.field,
            problem,
            record.raw.to_string(),
        )
    }
}
