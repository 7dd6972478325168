//! What one batch did, and the lowest sequence number Lambda must redeliver from.

use tracing::{debug, warn};

use crate::domain::SequenceNumber;
use crate::ports::Namespace;

/// What one batch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Records in the batch, rejected ones included.
    pub records: usize,
    /// Records whose state effects were committed (or that changed nothing) and outputs sent.
    pub applied: usize,
    /// Records skipped because the key had already applied them (a redelivery).
    pub replayed: usize,
    /// Dead letters sent: records no retry can fix, with the reason.
    pub dead_lettered: usize,
    /// Outputs sent to the operator's sinks.
    pub outputs_sent: usize,
    /// Keys the batch's records were grouped under.
    pub keys: usize,
    /// Key commits that landed; a key with nothing to commit makes none.
    pub commits: usize,
    /// Commits that lost to another writer of the key since it was read, retries included.
    pub conflicts: usize,
    /// Keys not started because the invocation's deadline was near.
    pub deferred_keys: usize,
    /// Keys whose operator panicked.
    pub panics: usize,
    /// Keys whose state under an older signature a migration carried over.
    pub migrated: usize,
    /// Keys whose state under the previous signature was left behind: they start afresh.
    pub reset: usize,
    /// Keys whose notes of what went out of their unapplied records no longer held (another
    /// commit, another build, other records): those records' outputs went again whole.
    pub notes_unused: usize,
    /// The lowest sequence number not fully applied: Lambda redelivers from there.
    pub failed_from: Option<SequenceNumber>,
    /// Set when a record that has no sequence number could not be dead-lettered: the only way to
    /// keep it is to fail the whole invocation.
    pub unreportable_failure: Option<String>,
}

impl BatchReport {
    /// An empty report of a batch of `records` records.
    pub fn new(records: usize) -> Self {
        Self {
            records,
            ..Self::default()
        }
    }

    /// Records `sequence` as not applied: the batch is reported failed from the lowest such.
    pub fn fail(&mut self, sequence: &SequenceNumber) {
        if self.failed_from.as_ref().is_none_or(|f| sequence < f) {
            self.failed_from = Some(sequence.clone());
        }
    }

    /// One DEBUG line per batch (a function's handler writes the invocation's INFO line), and
    /// one warning when state was migrated or reset.
    pub fn log(&self, namespace: &Namespace) {
        if self.migrated > 0 || self.reset > 0 {
            warn!(
                operator = %namespace.operator,
                signature = %namespace.signature,
                migrated = self.migrated,
                reset = self.reset,
                "state written under an older signature was migrated or left behind"
            );
        }
        debug!(
            operator = %namespace.operator,
            records = self.records,
            applied = self.applied,
            replayed = self.replayed,
            dead_lettered = self.dead_lettered,
            keys = self.keys,
            commits = self.commits,
            conflicts = self.conflicts,
            deferred_keys = self.deferred_keys,
            notes_unused = self.notes_unused,
            failed_from = self.failed_from.as_ref().map(|s| s.as_str()),
            "batch done"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_failed_sequence_number_wins() {
        let mut report = BatchReport::new(3);
        let seq = |s: &str| SequenceNumber::parse(s).unwrap();
        report.fail(&seq("20"));
        report.fail(&seq("9"));
        report.fail(&seq("100"));
        assert_eq!(report.failed_from, Some(seq("9")));
    }
}
