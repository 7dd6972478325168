//! The head item's `doc`: its JSON form as written and as read, and the memo the store keeps of a
//! loaded head until the key's commit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::domain::json::{push_number, push_string};
use crate::domain::{Origin, Retiring, SentNotes, Watermark};

/// An immutable run of a slot's (or the outbox's) entries stored outside the head item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Segment {
    pub id: u64,
    /// How many entries it holds.
    pub len: usize,
    /// Its own TTL (epoch seconds): segments outlive the slots they belong to by one TTL period so
    /// that slots whose expiry moves forward never point at an expired segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
}

/// A list of entries as the head stores it: sealed segments first, then inline entries.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct ListDoc {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seg: Vec<Segment>,
    #[serde(default)]
    pub e: Vec<Box<RawValue>>,
}

impl ListDoc {
    pub(super) fn sealed_len(&self) -> usize {
        self.seg.iter().map(|s| s.len).sum()
    }
}

/// The head's `doc` attribute.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct HeadDoc {
    /// Watermarks kept in the head: those a recent commit advanced.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub wm: BTreeMap<Origin, Watermark>,
    /// True once watermarks were moved out of the head into watermark items.
    #[serde(default, skip_serializing_if = "is_false")]
    pub wx: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub slots: BTreeMap<String, ListDoc>,
    /// The outbox: outputs as JSON entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ob: Option<ListDoc>,
    /// Sort keys of segment items this head no longer references: the next commit deletes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gc: Vec<String>,
    /// When the slots expire (epoch seconds). The item's own `ttl` may be later: watermarks and
    /// the outbox outlive the slots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<i64>,
    /// The tokens of the latest commits, newest last: a writer whose response was lost finds its
    /// own token here and knows its write landed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tk: Vec<u64>,
    /// The key itself when the partition key holds its hash, for people reading the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// What went out already of the outputs of the key's records not yet applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sn: Option<SentNotes>,
    /// The older signature's state the key was carried over from, not yet known retired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mf: Option<Retiring>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A list as written: borrowed from the state being committed.
#[derive(Clone, Copy, Debug)]
pub(super) struct ListRef<'a> {
    pub seg: &'a [Segment],
    pub e: &'a [Box<RawValue>],
}

/// The head's `doc` as written, borrowed from the commit: the fields of `HeadDoc`, written by
/// hand into one buffer (it is written for every key of every batch).
#[derive(Clone, Debug)]
pub(super) struct HeadDocRef<'a> {
    pub wm: &'a BTreeMap<&'a Origin, &'a Watermark>,
    pub wx: bool,
    pub slots: &'a [(&'a str, ListRef<'a>)],
    pub ob: Option<ListRef<'a>>,
    pub gc: &'a [&'a str],
    pub exp: Option<i64>,
    pub tk: &'a [u64],
    pub key: Option<&'a str>,
    pub sn: Option<&'a SentNotes>,
    pub mf: Option<&'a Retiring>,
}

impl HeadDocRef<'_> {
    pub(super) fn to_json(&self) -> String {
        let mut out = String::with_capacity(256);
        out.push('{');
        let field = |out: &mut String, name: &str| {
            if out.len() > 1 {
                out.push(',');
            }
            out.push('"');
            out.push_str(name);
            out.push_str("\":");
        };
        if !self.wm.is_empty() {
            field(&mut out, "wm");
            push_watermarks(&mut out, self.wm);
        }
        if self.wx {
            field(&mut out, "wx");
            out.push_str("true");
        }
        if !self.slots.is_empty() {
            field(&mut out, "slots");
            out.push('{');
            for (i, (name, list)) in self.slots.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_string(&mut out, name);
                out.push(':');
                push_list(&mut out, list);
            }
            out.push('}');
        }
        if let Some(list) = &self.ob {
            field(&mut out, "ob");
            push_list(&mut out, list);
        }
        if !self.gc.is_empty() {
            field(&mut out, "gc");
            out.push('[');
            for (i, sk) in self.gc.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_string(&mut out, sk);
            }
            out.push(']');
        }
        if let Some(exp) = self.exp {
            field(&mut out, "exp");
            push_number(&mut out, exp);
        }
        if !self.tk.is_empty() {
            field(&mut out, "tk");
            out.push('[');
            for (i, token) in self.tk.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_number(&mut out, *token);
            }
            out.push(']');
        }
        if let Some(key) = self.key {
            field(&mut out, "key");
            push_string(&mut out, key);
        }
        if let Some(notes) = self.sn {
            // Written only when a key leaves records half sent: no need for a hand-written form.
            field(&mut out, "sn");
            out.push_str(&serde_json::to_string(notes).expect("notes always serialize"));
        }
        if let Some(retiring) = self.mf {
            // Written only after a migration: no need for a hand-written form.
            field(&mut out, "mf");
            out.push_str(
                &serde_json::to_string(retiring).expect("a signature and a version serialize"),
            );
        }
        out.push('}');
        out
    }
}

fn push_watermarks(out: &mut String, wm: &BTreeMap<&Origin, &Watermark>) {
    out.push('{');
    for (i, (lineage, mark)) in wm.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_string(out, lineage.as_str());
        out.push_str(":{\"s\":");
        push_string(out, mark.sequence.as_str());
        out.push_str(",\"t\":");
        push_number(out, mark.at_millis);
        out.push('}');
    }
    out.push('}');
}

fn push_list(out: &mut String, list: &ListRef<'_>) {
    out.push('{');
    if !list.seg.is_empty() {
        out.push_str("\"seg\":[");
        for (i, s) in list.seg.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"id\":");
            push_number(out, s.id);
            out.push_str(",\"len\":");
            push_number(out, s.len as u64);
            if let Some(t) = s.expires_at {
                out.push_str(",\"expires_at\":");
                push_number(out, t);
            }
            out.push('}');
        }
        out.push_str("],");
    }
    out.push_str("\"e\":[");
    for (i, entry) in list.e.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(entry.get());
    }
    out.push_str("]}");
}

/// How many commit tokens a head remembers. A writer whose response was lost reads the head right
/// after; for it to miss its own token, this many other commits of the key must land in between.
pub const TOKENS_KEPT: usize = 4;

/// What the store remembers of a key it loaded, for the commit that follows.
#[derive(Clone, Debug, Default)]
pub(super) struct Loaded {
    /// The head as read (entries left out).
    pub slots: BTreeMap<String, Vec<Segment>>,
    pub outbox: Vec<Segment>,
    pub garbage: Vec<String>,
    /// Watermarks as the head held them.
    pub inline: BTreeMap<Origin, Watermark>,
    /// Watermarks read from watermark items.
    pub fetched: BTreeMap<Origin, Watermark>,
    pub spilled: bool,
    pub tokens: Vec<u64>,
    /// Segments a commit that did not finish wrote (the head's `pd`): none of them is
    /// referenced, and the next commit collects them.
    pub pending: Vec<String>,
}

/// What the store remembers of a head it just wrote with an outbox, to clear the outbox after
/// the sends: the head's doc without it, the item's `ttl` then, and the outbox's segments, which
/// nothing references once it is cleared.
#[derive(Clone, Debug)]
pub(super) struct Written {
    pub pk: String,
    pub doc_without_outbox: String,
    pub ttl: Option<i64>,
    pub outbox_segments: Vec<super::super::ItemKey>,
}

/// What a store keeps of a key it loaded: empty for a key it never stored.
pub(super) static NOTHING_LOADED: Loaded = Loaded {
    slots: BTreeMap::new(),
    outbox: Vec::new(),
    garbage: Vec::new(),
    inline: BTreeMap::new(),
    fetched: BTreeMap::new(),
    spilled: false,
    tokens: Vec::new(),
    pending: Vec::new(),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_doc_written_by_reference_reads_back_as_written() {
        let lineage = Origin("s/shardId-0/k".into());
        let mark = Watermark {
            sequence: crate::domain::SequenceNumber::parse("42").unwrap(),
            at_millis: 7,
        };
        let wm = BTreeMap::from([(&lineage, &mark)]);
        let record = crate::domain::SentSoFar::of(lineage.clone(), mark.sequence.clone(), 9, [4]);
        let sent = SentNotes {
            version: 3,
            build: 11,
            chain: (1, 12),
            records: vec![record.unwrap()],
        };
        let entries = vec![RawValue::from_string("1".into()).unwrap()];
        let retiring = Retiring {
            signature: "6ae4d86bfd442e9e".into(),
            version: 41,
        };
        let segments = vec![Segment {
            id: 9,
            len: 3,
            expires_at: None,
        }];
        let slots = [(
            "count",
            ListRef {
                seg: &segments,
                e: &entries,
            },
        )];
        let written = HeadDocRef {
            wm: &wm,
            wx: true,
            slots: &slots,
            ob: Some(ListRef {
                seg: &[],
                e: &entries,
            }),
            gc: &["seg#x#1"],
            exp: Some(5),
            tk: &[3, u64::MAX],
            key: Some("a \"quoted\" key"),
            sn: Some(&sent),
            mf: Some(&retiring),
        };
        let doc: HeadDoc = serde_json::from_str(&written.to_json()).unwrap();
        assert_eq!(doc.key.as_deref(), Some("a \"quoted\" key"));
        assert_eq!(doc.sn, Some(sent));
        assert_eq!(doc.mf, Some(retiring));
        assert_eq!(doc.ob.unwrap().e[0].get(), "1");
        assert_eq!(doc.wm[&lineage], mark);
        assert!(doc.wx);
        assert_eq!(doc.slots["count"].seg, segments);
        assert_eq!(doc.slots["count"].e[0].get(), "1");
        assert_eq!(
            (doc.gc, doc.exp, doc.tk),
            (vec!["seg#x#1".to_owned()], Some(5), vec![3, u64::MAX])
        );
    }

    #[test]
    fn an_empty_head_doc_is_an_empty_object_and_reads_back() {
        let text = serde_json::to_string(&HeadDoc::default()).unwrap();
        assert_eq!(text, "{}");
        let doc: HeadDoc = serde_json::from_str(&text).unwrap();
        assert!(doc.slots.is_empty() && doc.ob.is_none() && !doc.wx);
    }
}
