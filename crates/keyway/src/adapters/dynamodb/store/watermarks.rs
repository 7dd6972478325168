//! Watermarks in two tiers: the head holds those a commit advanced and the `WATERMARKS_INLINE`
//! most recent others; the rest live in one item per lineage (see the store's design notes).

use std::collections::BTreeMap;

use super::super::{ItemKey, TTL};
use super::head::Loaded;
use super::{LINEAGES_PER_COMMIT, WATERMARKS_INLINE};
use crate::domain::{AttrValue, Item, Origin, SequenceNumber, Watermark, Watermarks};
use crate::ports::StoreError;

/// The attribute holding a watermark item's sequence number, zero-padded to `SEQUENCE_WIDTH`
/// digits so that DynamoDB's string order is numeric order (conditions compare it).
pub(super) const SEQUENCE: &str = "s";
const ARRIVAL: &str = "t";
/// Kinesis and DynamoDB Streams sequence numbers have at most 128 digits.
const SEQUENCE_WIDTH: usize = 128;

pub(super) fn item_key(pk: &str, lineage: &Origin) -> ItemKey {
    ItemKey {
        pk: pk.to_owned(),
        sk: format!("wm#{lineage}"),
    }
}

pub(super) fn padded(sequence: &SequenceNumber) -> String {
    format!("{:0>SEQUENCE_WIDTH$}", sequence.as_str())
}

pub(super) fn parse_item(item: &Item) -> Option<Watermark> {
    let sequence = SequenceNumber::parse(item.get(SEQUENCE)?.as_s()?).ok()?;
    let at_millis = item.get(ARRIVAL)?.as_n()?.parse().ok()?;
    Some(Watermark {
        sequence,
        at_millis,
    })
}

/// The item for a watermark moved out of the head, expiring once no redelivery can reach it.
pub(super) fn make_item(pk: &str, lineage: &Origin, mark: &Watermark, retention_secs: i64) -> Item {
    let mut item = item_key(pk, lineage).to_item();
    item.insert(SEQUENCE.into(), AttrValue::S(padded(&mark.sequence)));
    item.insert(ARRIVAL.into(), AttrValue::N(mark.at_millis.to_string()));
    let expires = mark.at_millis.div_euclid(1000) + retention_secs + 1;
    item.insert(TTL.into(), AttrValue::N(expires.to_string()));
    item
}

/// Where a commit puts each watermark.
#[derive(Debug, Default)]
pub(super) struct Placement<'a> {
    pub inline: BTreeMap<&'a Origin, &'a Watermark>,
    /// Watermarks leaving the head for items.
    pub evicted: Vec<(&'a Origin, &'a Watermark)>,
    /// Whether any watermark of the key lives in an item.
    pub spilled: bool,
}

/// Places `marks` for a commit of a key loaded as `loaded`: every watermark the commit changed
/// stays in the head (no item may hold a value before a commit made it), and the head's
/// `WATERMARKS_INLINE` most recent others; those left over move to items. Watermarks read from
/// items and not changed stay where they are.
pub(super) fn place<'a>(
    marks: &'a Watermarks,
    loaded: &Loaded,
) -> Result<Placement<'a>, StoreError> {
    let mut changed = BTreeMap::new();
    let mut old_inline = Vec::new();
    for (lineage, mark) in marks.iter() {
        if loaded.inline.get(lineage) == Some(mark) {
            old_inline.push((lineage, mark));
        } else if loaded.fetched.get(lineage) != Some(mark) {
            changed.insert(lineage, mark);
        }
    }
    if changed.len() > LINEAGES_PER_COMMIT {
        return Err(StoreError::Invalid(format!(
            "one commit advanced {} lineages of a key; a head holds {LINEAGES_PER_COMMIT}",
            changed.len()
        )));
    }
    old_inline.sort_by(|a, b| b.1.at_millis.cmp(&a.1.at_millis).then(a.0.cmp(b.0)));
    let evicted = old_inline.split_off(WATERMARKS_INLINE.min(old_inline.len()));
    let mut inline = changed;
    inline.extend(old_inline);
    Ok(Placement {
        spilled: loaded.spilled || !evicted.is_empty(),
        inline,
        evicted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(seq: u64, at: i64) -> Watermark {
        Watermark {
            sequence: SequenceNumber::parse(&seq.to_string()).unwrap(),
            at_millis: at,
        }
    }

    #[test]
    fn padded_sequence_numbers_order_as_numbers() {
        let a = padded(&SequenceNumber::parse("99").unwrap());
        let b = padded(&SequenceNumber::parse("100").unwrap());
        assert!(a < b);
        assert_eq!(a.len(), 128);
        let item = make_item("pk", &Origin("l".into()), &mark(42, 1_000), 60);
        assert_eq!(parse_item(&item), Some(mark(42, 1_000)));
        assert_eq!(item[TTL], AttrValue::N("62".into()));
    }

    #[test]
    fn changed_watermarks_stay_in_the_head_and_the_oldest_others_move_out() {
        let mut loaded = Loaded::default();
        let mut marks = Watermarks::default();
        for i in 0..WATERMARKS_INLINE as i64 + 2 {
            let lineage = Origin(format!("old-{i:04}"));
            loaded.inline.insert(lineage.clone(), mark(1, i));
            marks.insert(lineage, mark(1, i));
        }
        // Two lineages advanced by this commit: one new, one that lived in an item.
        marks.insert(Origin("new".into()), mark(5, 0));
        loaded.fetched.insert(Origin("fetched".into()), mark(1, 0));
        marks.insert(Origin("fetched".into()), mark(2, 0));
        // And one read from an item and left alone.
        loaded.fetched.insert(Origin("still".into()), mark(1, 0));
        marks.insert(Origin("still".into()), mark(1, 0));

        let placement = place(&marks, &loaded).unwrap();
        assert_eq!(placement.inline.len(), WATERMARKS_INLINE + 2);
        assert!(placement.inline.contains_key(&Origin("new".into())));
        assert!(placement.inline.contains_key(&Origin("fetched".into())));
        assert!(!placement.inline.contains_key(&Origin("still".into())));
        let evicted: Vec<&str> = placement.evicted.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(evicted.len(), 2, "the least recent leave");
        assert_eq!(evicted, ["old-0001", "old-0000"]);
        assert!(placement.spilled);
    }

    #[test]
    fn a_commit_advancing_more_lineages_than_a_head_holds_is_refused() {
        let mut marks = Watermarks::default();
        for i in 0..=LINEAGES_PER_COMMIT {
            marks.insert(Origin(format!("l{i}")), mark(1, 0));
        }
        assert!(matches!(
            place(&marks, &Loaded::default()),
            Err(StoreError::Invalid(_))
        ));
    }
}
