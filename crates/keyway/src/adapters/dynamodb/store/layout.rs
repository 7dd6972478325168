//! Where a commit puts a key's entries: which stored segments it keeps, which it retires, and
//! which entries move out of the head into new segments until the head fits.

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use super::super::{ItemKey, ITEM_MAX_BYTES, TTL};
use super::head::{ListRef, Loaded, Segment};
use super::{outbox_segment_key, slot_segment_key, ENTRIES, HEAD_INLINE_LIMIT, SEGMENT_TARGET};
use crate::domain::item::item_size;
use crate::domain::{AttrValue, Item, Output, SlotData};
use crate::ports::StoreError;

/// Which list of the head a segment belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ListName<'a> {
    Slot(&'a str),
    Outbox,
}

/// A list laid out: its segments, and its entries left in the head.
#[derive(Debug, Default)]
pub(super) struct Laid<'a> {
    pub segments: Vec<Segment>,
    pub inline: &'a [Box<RawValue>],
}

impl<'a> Laid<'a> {
    pub(super) fn as_ref(&'a self) -> ListRef<'a> {
        ListRef {
            seg: &self.segments,
            e: self.inline,
        }
    }
}

/// The lists of a commit laid out: slots (borrowed from the state), the outbox (whose entries it
/// made), the segment items to write first, and the sort keys of stored segments the new head no
/// longer references.
#[derive(Default)]
pub(super) struct Layout<'a> {
    pub slots: BTreeMap<&'a str, Laid<'a>>,
    pub outbox_segments: Vec<Segment>,
    pub outbox_inline: Vec<Box<RawValue>>,
    pub has_outbox: bool,
    pub segment_puts: Vec<Item>,
    pub retired: Vec<String>,
    /// Those of `retired` with no TTL of their own: should the new head expire before a later
    /// commit deletes them, they need one (`DynamoStateStore::expire_retired`).
    pub unexpiring: Vec<String>,
}

impl Layout<'_> {
    fn retire(&mut self, sk: String, expires_at: Option<i64>) {
        if expires_at.is_none() {
            self.unexpiring.push(sk.clone());
        }
        self.retired.push(sk);
    }
}

/// A list being laid out.
struct Draft<'a> {
    segments: Vec<Segment>,
    entries: &'a [Box<RawValue>],
    /// Entries before this index are in `segments`.
    sealed: usize,
}

impl Draft<'_> {
    fn inline_bytes(&self) -> usize {
        self.entries[self.sealed..]
            .iter()
            .map(|e| e.get().len() + 1)
            .sum()
    }
}

/// Lays out the slots and outbox of a commit of the key at `pk`, loaded as `loaded`.
pub(super) fn lay_out<'a>(
    pk: &str,
    slots: &'a BTreeMap<String, SlotData>,
    outbox: &[Output],
    loaded: &Loaded,
    expires_at: Option<i64>,
    now_secs: i64,
) -> Result<Layout<'a>, StoreError> {
    // Segments outlive the slots they belong to by one TTL period (see `Segment::expires_at`);
    // the outbox's never expire: it holds outputs already promised.
    let segment_ttl = expires_at.map(|h| h + (h - now_secs).max(0));
    let mut layout = Layout::default();
    let mut drafts = slot_drafts(pk, slots, loaded, &mut layout);
    for segment in &loaded.outbox {
        layout.retire(outbox_segment_key(pk, segment.id).sk, segment.expires_at);
    }
    let outbox_entries = outbox
        .iter()
        .map(|o| {
            serde_json::value::to_raw_value(o)
                .map_err(|e| StoreError::Invalid(format!("an outbox output: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if !outbox_entries.is_empty() {
        drafts.insert(
            ListName::Outbox,
            Draft {
                segments: Vec::new(),
                entries: &outbox_entries,
                sealed: 0,
            },
        );
    }

    refresh_expiring(pk, &mut drafts, (expires_at, segment_ttl), &mut layout)?;
    spill(pk, &mut drafts, segment_ttl, &mut layout)?;

    for (name, draft) in drafts {
        match name {
            ListName::Slot(name) => {
                let laid = Laid {
                    inline: &slots[name].entries[draft.sealed..],
                    segments: draft.segments,
                };
                layout.slots.insert(name, laid);
            }
            ListName::Outbox => {
                layout.has_outbox = true;
                layout.outbox_inline = outbox_entries[draft.sealed..].to_vec();
                layout.outbox_segments = draft.segments;
            }
        }
    }
    Ok(layout)
}

/// Each slot's draft: the stored segments that stay (those whose entries are all still as
/// loaded) and its entries; the segments that go, and those of slots no longer written, retired
/// in `layout`.
fn slot_drafts<'a>(
    pk: &str,
    slots: &'a BTreeMap<String, SlotData>,
    loaded: &Loaded,
    layout: &mut Layout<'_>,
) -> BTreeMap<ListName<'a>, Draft<'a>> {
    let mut drafts: BTreeMap<ListName<'a>, Draft<'a>> = BTreeMap::new();
    for (name, stored) in &loaded.slots {
        let Some((name, slot)) = slots.get_key_value(name) else {
            for segment in stored {
                layout.retire(
                    slot_segment_key(pk, name, segment.id).sk,
                    segment.expires_at,
                );
            }
            continue;
        };
        // A stored segment stays only if every entry it holds is still as loaded (segments come
        // first, so those that stay are a prefix).
        let mut kept = Vec::new();
        let mut offset = 0;
        for segment in stored {
            if offset + segment.len <= slot.kept {
                kept.push(segment.clone());
            } else {
                layout.retire(
                    slot_segment_key(pk, name, segment.id).sk,
                    segment.expires_at,
                );
            }
            offset += segment.len;
        }
        drafts.insert(
            ListName::Slot(name.as_str()),
            Draft {
                sealed: kept.iter().map(|s| s.len).sum(),
                segments: kept,
                entries: &slot.entries,
            },
        );
    }
    for (name, slot) in slots {
        drafts
            .entry(ListName::Slot(name.as_str()))
            .or_insert_with(|| Draft {
                segments: Vec::new(),
                entries: &slot.entries,
                sealed: 0,
            });
    }
    drafts
}

/// Rewrites the slots' segments whose TTL would end before the slots' (`expires_at`), with the
/// TTL of new segments (`segment_ttl`, a TTL period later): a segment is written again at most
/// once a period, not at every commit that moves the slots' time on.
fn refresh_expiring(
    pk: &str,
    drafts: &mut BTreeMap<ListName<'_>, Draft<'_>>,
    (expires_at, segment_ttl): (Option<i64>, Option<i64>),
    layout: &mut Layout,
) -> Result<(), StoreError> {
    for (name, draft) in drafts.iter_mut() {
        let ListName::Slot(slot) = name else { continue };
        let mut offset = 0;
        for i in 0..draft.segments.len() {
            let segment = draft.segments[i].clone();
            let range = offset..offset + segment.len;
            offset += segment.len;
            if covers(segment.expires_at, expires_at) {
                continue;
            }
            layout.retire(
                slot_segment_key(pk, slot, segment.id).sk,
                segment.expires_at,
            );
            draft.segments[i] = make_segment(pk, name, &draft.entries[range], segment_ttl, layout)?;
        }
    }
    Ok(())
}

/// Moves the largest inline tail into segments until the head's inline entries fit.
fn spill(
    pk: &str,
    drafts: &mut BTreeMap<ListName<'_>, Draft<'_>>,
    segment_ttl: Option<i64>,
    layout: &mut Layout,
) -> Result<(), StoreError> {
    loop {
        let total: usize = drafts.values().map(Draft::inline_bytes).sum();
        if total <= HEAD_INLINE_LIMIT {
            return Ok(());
        }
        let (name, draft) = drafts
            .iter_mut()
            .max_by_key(|(_, d)| d.inline_bytes())
            .expect("some list has inline entries");
        let ttl = match name {
            ListName::Slot(_) => segment_ttl,
            ListName::Outbox => None,
        };
        let mut start = draft.sealed;
        let mut bytes = 0;
        for i in draft.sealed..draft.entries.len() {
            let size = draft.entries[i].get().len() + 1;
            if bytes > 0 && bytes + size > SEGMENT_TARGET {
                let segment = make_segment(pk, name, &draft.entries[start..i], ttl, layout)?;
                draft.segments.push(segment);
                start = i;
                bytes = 0;
            }
            bytes += size;
        }
        let segment = make_segment(pk, name, &draft.entries[start..], ttl, layout)?;
        draft.segments.push(segment);
        draft.sealed = draft.entries.len();
    }
}

/// A new segment of `entries`, whose item joins the layout's puts.
fn make_segment(
    pk: &str,
    name: &ListName<'_>,
    entries: &[Box<RawValue>],
    ttl: Option<i64>,
    layout: &mut Layout,
) -> Result<Segment, StoreError> {
    let id: u64 = rand::random();
    let key: ItemKey = match name {
        ListName::Slot(slot) => slot_segment_key(pk, slot, id),
        ListName::Outbox => outbox_segment_key(pk, id),
    };
    let mut item = key.to_item();
    let mut text =
        String::with_capacity(entries.iter().map(|e| e.get().len() + 1).sum::<usize>() + 2);
    text.push('[');
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(entry.get());
    }
    text.push(']');
    item.insert(ENTRIES.to_owned(), AttrValue::S(text));
    if let Some(ttl) = ttl {
        item.insert(TTL.to_owned(), AttrValue::N(ttl.to_string()));
    }
    // Measured as text: whether an entry fits does not depend on how well it deflates.
    if item_size(&item) > ITEM_MAX_BYTES {
        let what = match name {
            ListName::Slot(slot) => format!("state.{slot}"),
            ListName::Outbox => "output".to_owned(),
        };
        return Err(StoreError::Invalid(format!(
            "{what}: an entry is larger than DynamoDB's 400 KB item limit"
        )));
    }
    if let Some(AttrValue::S(text)) = item.remove(ENTRIES) {
        super::text::store(&mut item, ENTRIES, text, None);
    }
    layout.segment_puts.push(item);
    Ok(Segment {
        id,
        len: entries.len(),
        expires_at: ttl,
    })
}

/// Whether a segment expiring at `segment` lives as long as slots that expire at `wanted`, and
/// no longer than it must: one kept for good by a key that now expires would be left behind by
/// the key's head.
fn covers(segment: Option<i64>, wanted: Option<i64>) -> bool {
    match (segment, wanted) {
        (None, None) => true,
        (None, Some(_)) | (Some(_), None) => false,
        (Some(s), Some(w)) => s >= w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn a_segment_item_of_exactly_the_item_limit_is_made_and_one_byte_more_is_refused() {
        let name = ListName::Slot("list");
        let entry = |len: usize| raw(&format!("\"{}\"", "x".repeat(len - 2)));
        // The item's size around its entry: keys, attribute names, the brackets.
        let mut probe = Layout::default();
        make_segment("pk", &name, &[entry(10)], None, &mut probe).unwrap();
        let overhead = item_size(&probe.segment_puts[0]) - 10;
        let exact = ITEM_MAX_BYTES - overhead;
        let mut layout = Layout::default();
        make_segment("pk", &name, &[entry(exact)], None, &mut layout).expect("exactly the limit");
        // Measured as text; stored deflated.
        let stored = &layout.segment_puts[0];
        assert!(item_size(stored) < ITEM_MAX_BYTES / 100);
        let text = super::super::text::read(stored, ENTRIES, "[]", "e", &[]).unwrap();
        assert_eq!(text.len(), exact + 2, "the entry, in brackets");
        let over = make_segment("pk", &name, &[entry(exact + 1)], None, &mut layout);
        assert!(matches!(over, Err(StoreError::Invalid(_))), "{over:?}");
    }

    #[test]
    fn a_segment_covers_slots_kept_as_long_and_no_longer_unless_they_expire_later() {
        assert!(
            !covers(None, Some(10)),
            "a key that now expires gives its kept segments its time"
        );
        assert!(covers(None, None));
        assert!(!covers(Some(10), None));
        assert!(covers(Some(10), Some(10)));
        assert!(!covers(Some(9), Some(10)));
    }

    #[test]
    fn an_appended_list_keeps_its_segments_and_a_rewritten_one_retires_them() {
        let big = |i: usize| raw(&format!("\"{i:05}{}\"", "x".repeat(2000)));
        let entries: Vec<_> = (0..100).map(big).collect();
        let mut slots = BTreeMap::new();
        slots.insert("list".to_owned(), SlotData::fresh(entries.clone()));
        let first = lay_out("pk", &slots, &[], &Loaded::default(), None, 0).unwrap();
        let stored = first.slots["list"].segments.clone();
        assert!(!stored.is_empty() && first.retired.is_empty());

        let loaded = Loaded {
            slots: [("list".to_owned(), stored.clone())].into(),
            ..Loaded::default()
        };
        let mut grown = SlotData::loaded(entries.clone());
        grown.entries.push(big(100));
        slots.insert("list".to_owned(), grown);
        let appended = lay_out("pk", &slots, &[], &loaded, None, 0).unwrap();
        assert_eq!(
            appended.slots["list"].segments, stored,
            "appending keeps them"
        );
        assert!(appended.retired.is_empty());

        let mut rewritten = SlotData::loaded(entries);
        rewritten.apply(crate::domain::SlotUpdate {
            keep: 0,
            tail: vec![raw("1")],
        });
        slots.insert("list".to_owned(), rewritten);
        let replaced = lay_out("pk", &slots, &[], &loaded, None, 0).unwrap();
        assert!(replaced.slots["list"].segments.is_empty());
        assert_eq!(
            replaced.retired.len(),
            stored.len(),
            "rewriting retires them"
        );
    }
}
