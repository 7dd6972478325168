//! Phase 1: decode every record into the operator's input and group the records by key, keeping
//! arrival order within a key. Records that do not decode become dead letters here.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use tracing::error;

use super::emit::SendTimes;
use super::Executor;
use crate::domain::json::prefix;
use crate::domain::RejectedRecord;
use crate::domain::{BatchPlan, DeadLetter, KeyGroup, SequenceNumber, SourceRecord};
use crate::operator::{stored_bytes, InvalidInput, KeyedOperator};

/// The longest key a record may have, in bytes written as a JSON string (a control character
/// takes six). A key's state is stored under its hash past 1 KB, but its head and its timers'
/// index entries hold it whole, as JSON, in items of at most 400 KB; keys from records run to
/// some hundred bytes (a DynamoDB key is at most 2 KB), so one past this is hostile or a bug, and
/// its record is dead-lettered (field `key`).
pub const KEY_MAX_BYTES: usize = 64 * 1024;

/// How much of a key a dead letter quotes.
const KEY_QUOTED_BYTES: usize = 200;

/// A batch decoded and grouped. (The decoded inputs travel apart: they need not be `Sync`.)
pub(super) struct Plan<'b> {
    pub batch: &'b [Result<SourceRecord, RejectedRecord>],
    pub groups: Vec<KeyGroup>,
    /// Records rejected before they had a key, with their dead letters.
    pub unkeyed: Vec<(usize, DeadLetter)>,
    /// Records whose decoding panicked: a bug, so they are retried, not dead-lettered.
    pub panicked: Vec<usize>,
    /// The key skew detection counts a group under, where it is not the group's key
    /// (`KeyedOperator::hot_key`).
    pub hot_keys: HashMap<String, String>,
    /// When the batch's sinks stop calling, and when a send that has not answered is given up
    /// (`ExecutorConfig::commit_reserve`).
    pub sends: SendTimes,
}

impl<'b> Plan<'b> {
    /// The record at `index`, which decoded.
    pub(super) fn record(&self, index: usize) -> &'b SourceRecord {
        self.batch[index]
            .as_ref()
            .expect("keyed records are records")
    }

    pub(super) fn sequence_of(&self, index: usize) -> Option<&'b SequenceNumber> {
        match &self.batch[index] {
            Ok(record) => Some(&record.sequence),
            Err(rejected) => rejected.sequence.as_ref(),
        }
    }

    /// The records of a key's group, in order.
    pub(super) fn records_of(&self, group: usize) -> Vec<&'b SourceRecord> {
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
        let mut hot_keys = HashMap::new();
        for (index, item) in batch.iter().enumerate() {
            let record = match item {
                Ok(record) => record,
                Err(rejected) => {
                    unkeyed.push((index, self.rejected_letter(rejected)));
                    inputs.push(None);
                    continue;
                }
            };
            if let Some((key, _)) = record.as_timer() {
                // A timer fires with its key's state; `on_timer` takes no input.
                keyed.push((index, key.to_owned()));
                inputs.push(None);
                continue;
            }
            let decoded = catch_unwind(AssertUnwindSafe(|| {
                self.operator
                    .decode(record)
                    .map(|input| (self.operator.key(&input), input))
            }));
            match decoded {
                Ok(Ok((key, input))) => {
                    if let Some(invalid) = key_too_long(&key) {
                        unkeyed.push((index, self.dead_letter(record, None, invalid)));
                        inputs.push(None);
                        continue;
                    }
                    if let Some(hot) = self.operator.hot_key(&input) {
                        hot_keys.entry(key.clone()).or_insert(hot);
                    }
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
            hot_keys,
            sends: SendTimes::default(),
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
            Some(key) => format!("{} (key {})", invalid.problem, quoted(key)),
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

/// Why a record's key cannot be kept, if it cannot: it takes more than `KEY_MAX_BYTES` as JSON.
fn key_too_long(key: &str) -> Option<InvalidInput> {
    // Written as JSON a byte takes six at most: a shorter key is not measured.
    if key.len() <= KEY_MAX_BYTES / 6 {
        return None;
    }
    let bytes = stored_bytes(key);
    (bytes > KEY_MAX_BYTES).then(|| {
        InvalidInput::new(
            "key",
            format!(
                "the record's key takes {bytes} bytes written as JSON, more than the \
                 {KEY_MAX_BYTES} a key may take: {}",
                quoted(key)
            ),
        )
    })
}

/// `key` as a dead letter quotes it: whole if short, else its start and its length.
fn quoted(key: &str) -> String {
    match prefix(key, KEY_QUOTED_BYTES) {
        start if start.len() == key.len() => format!("{key:?}"),
        start => format!("{start:?}… ({} bytes)", key.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{bench, record, Summer};
    use super::*;
    use crate::domain::Payload;

    #[test]
    fn records_are_grouped_by_key_in_order_and_those_that_do_not_decode_become_dead_letters() {
        let b = bench(Summer::default(), false);
        let mut bad = record(3, "p", "x", 0).unwrap();
        bad.payload = Payload::Bytes(b"not json".to_vec().into());
        let rejected = RejectedRecord {
            origin: None,
            sequence: None,
            field: "kinesis.data".into(),
            problem: "not base64".into(),
            raw: crate::domain::RawJson::from_value(&serde_json::json!({})),
        };
        let batch = vec![
            record(1, "p", "a", 1),
            record(2, "p", "b", 1),
            Ok(bad),
            record(4, "q", "a", 2),
            record(5, "p", "z", 77),
            Err(rejected),
        ];
        let (plan, inputs) = b.executor.plan(&batch);
        let groups: Vec<(&str, &[usize])> = plan
            .groups
            .iter()
            .map(|g| (g.key.as_str(), g.records.as_slice()))
            .collect();
        assert_eq!(groups, [("a", &[0, 3][..]), ("b", &[1][..])]);
        let letters: Vec<(usize, &str)> = plan
            .unkeyed
            .iter()
            .map(|(i, l)| (*i, l.field.as_str()))
            .collect();
        assert_eq!(letters, [(2, "data"), (5, "kinesis.data")]);
        assert_eq!(
            plan.panicked,
            [4],
            "a decoder's bug is retried, not dead-lettered"
        );
        assert_eq!(inputs[3], Some(("a".to_owned(), 2)));
        assert_eq!(plan.records_of(0)[1].sequence.as_str(), "4");
    }

    /// A key is kept whole in its head and its timers' index: one of 410 KB passed DynamoDB's
    /// item limit, and its record, refused at each commit, held its lane back for a day.
    #[tokio::test]
    async fn a_record_whose_key_is_longer_than_a_key_may_be_is_dead_lettered_and_the_longest_key_is_kept(
    ) {
        let summer = Summer {
            timers: true,
            ..Summer::default()
        };
        let b = bench(summer, false);
        let (longest, too_long) = ("k".repeat(KEY_MAX_BYTES), "x".repeat(410_000));
        // Twenty thousand control characters: 120,000 bytes in the head.
        let escaped = "\u{1}".repeat(20_000);
        let report = b
            .executor
            .run(vec![
                record(1, "p", &too_long, 1),
                record(2, "p", &longest, 1),
                record(3, "p", &longest, 23),
                record(4, "p", &longest, 2),
                record(5, "p", &escaped, 1),
            ])
            .await;
        assert_eq!(report.failed_from, None, "{report:?}");
        let letters: Vec<crate::domain::DeadLetter> = b
            .dead
            .bodies()
            .concat()
            .iter()
            .map(|body| serde_json::from_str(body).unwrap())
            .collect();
        assert_eq!(letters.len(), 2, "{letters:?}");
        assert!(letters.iter().all(|l| l.field == "key"), "{letters:?}");
        assert!(
            letters[0].problem.contains("410000 bytes") && letters[0].problem.len() < 400,
            "{}",
            letters[0].problem
        );
        assert!(
            letters[1].problem.contains("120000 bytes"),
            "{}",
            letters[1].problem
        );
        let sequences: Vec<_> = letters.iter().map(|l| l.sequence_number.clone()).collect();
        assert_eq!(sequences, [Some("1".to_owned()), Some("5".to_owned())]);
        let sums: Vec<String> = b.out.bodies().concat();
        assert_eq!(
            sums,
            ["1", "3"],
            "the longest key's records apply, a timer set"
        );
    }
}
