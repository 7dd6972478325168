//! Outputs and their deterministic ids.
//!
//! An output's id is derived from the operator that emitted it, the sink it goes to, the record
//! that produced it (origin, sequence number) and its position among that record's outputs. A
//! retry that recomputes the same outputs therefore sends the same ids, and a consumer (or SQS FIFO
//! deduplication) can drop the duplicates; two operators reading one stream, or one record's
//! outputs to two sinks, never share an id.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::hash::xxh3_128_hex;
use super::record::{Origin, SequenceNumber};

/// 32 hexadecimal digits (XXH3-128): short enough for an SQS MessageDeduplicationId (at most 128
/// characters), long enough that ids never collide in practice.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OutputId(pub String);

impl OutputId {
    /// The id of the `index`-th output `operator` emitted to `sink` for the record at `sequence`
    /// in `origin`.
    pub fn derive(
        operator: &str,
        sink: &str,
        origin: &Origin,
        sequence: &SequenceNumber,
        index: u32,
    ) -> Self {
        Self(xxh3_128_hex(&[
            operator.as_bytes(),
            sink.as_bytes(),
            origin.as_str().as_bytes(),
            sequence.as_str().as_bytes(),
            &index.to_be_bytes(),
        ]))
    }

    /// The id of the dead letter for a record: distinct from every output id of the same record.
    pub fn dead_letter(origin: &str, sequence: &str, operator: &str) -> Self {
        Self(xxh3_128_hex(&[
            b"dead-letter",
            origin.as_bytes(),
            sequence.as_bytes(),
            operator.as_bytes(),
        ]))
    }

    /// The id's hexadecimal digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OutputId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A message for a named sink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// The output's deterministic id: the same on every retry that emits it again.
    pub id: OutputId,
    /// The name the operator emitted to; the runtime maps names to configured sinks.
    pub sink: String,
    /// Kinesis partition key or SQS FIFO message group: outputs of one key keep their order.
    pub partition_key: String,
    /// The message text the sink is sent.
    pub body: String,
    /// No retry can change it (see `Ctx::emit_settled_for`): an outbox operator sends it before
    /// its commit instead of storing it. Never stored: an output in an outbox is not settled.
    #[serde(skip)]
    pub settled: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const PINNED: &str = "ef2e0ebfd0284b769d34dc2b0c92fbd9";

    #[test]
    fn two_operators_or_two_sinks_never_share_an_id_for_the_same_record() {
        let origin = Origin("orders/shardId-000000000001".into());
        let seq = SequenceNumber::parse("7").unwrap();
        let ids = [
            OutputId::derive("counter", "counts", &origin, &seq, 0),
            OutputId::derive("enricher", "counts", &origin, &seq, 0),
            OutputId::derive("counter", "alerts", &origin, &seq, 0),
        ];
        assert_ne!(ids[0], ids[1]);
        assert_ne!(ids[0], ids[2]);
        assert_ne!(ids[1], ids[2]);
    }

    #[test]
    fn the_same_record_and_index_always_give_the_same_id() {
        let origin = Origin("orders/shardId-000000000001".into());
        let seq = SequenceNumber::parse("49590338271490256608559692538361571095921575989136588898")
            .unwrap();
        let a = OutputId::derive("counter", "counts", &origin, &seq, 0);
        assert_eq!(a, OutputId::derive("counter", "counts", &origin, &seq, 0));
        assert_ne!(a, OutputId::derive("counter", "counts", &origin, &seq, 1));
        assert_ne!(
            a,
            OutputId::derive(
                "counter",
                "counts",
                &Origin("orders/shardId-000000000002".into()),
                &seq,
                0
            )
        );
        assert_eq!(a.as_str().len(), 32);
        // Pinned: consumers persist ids to drop duplicates, so the derivation must never change.
        assert_eq!(a.as_str(), PINNED);
        assert_eq!(
            OutputId::dead_letter("o", "1", "op").as_str(),
            "affcd53559f30963934ccd34d1554258"
        );
    }
}
