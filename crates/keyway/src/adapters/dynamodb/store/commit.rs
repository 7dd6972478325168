//! Committing keys: new segments, garbage deletes and watermarks moved out of the head first
//! (wave 1), then every head conditional on the version read (wave 2); a head whose put failed is
//! settled by reading it back. And clearing a committed outbox.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::future::join_all;

use super::super::{Expect, ItemKey, Table, WriteRequest, ITEM_MAX_BYTES, TTL, VERSION};
use super::head::{HeadDoc, HeadDocRef, ListRef, Loaded, Written, NOTHING_LOADED, TOKENS_KEPT};
use super::layout::{lay_out, Layout};
use super::watermarks::{self, place, Placement};
use super::{
    outbox_segment_key, parse_head, partition_key, slot_segment_key, DynamoStateStore, DOC,
    HEAD_SK, KEY_HASHED_PAST_BYTES, PENDING,
};
use crate::domain::item::item_size;
use crate::domain::json::number;
use crate::domain::{AttrValue, Dictionary, Item, StoreMemo};
use crate::ports::{Commit, Committed, Namespace, StoreError};

/// A commit made ready, borrowing from it: what wave 1 writes, then its head.
struct Prepared<'c> {
    commit: &'c Commit,
    pk: String,
    token: u64,
    tokens: Vec<u64>,
    layout: Layout<'c>,
    placement: Placement<'c>,
    ttl: Option<i64>,
    ttl_without_outbox: Option<i64>,
    /// Garbage the loaded head listed: deleted in wave 1; what could not be stays listed.
    garbage: &'c [String],
    /// Segments an unfinished commit left (the loaded head's `pd`): garbage once this commit
    /// lands.
    abandoned: &'c [String],
    undeleted: Vec<String>,
    /// Watermark items for watermarks leaving the head.
    evicted: Vec<Item>,
    /// The operator's preset dictionaries: the head is deflated with the first.
    dictionaries: Arc<[Dictionary]>,
}

impl Prepared<'_> {
    fn written_segments(&self) -> impl Iterator<Item = ItemKey> + '_ {
        self.layout.segment_puts.iter().filter_map(ItemKey::of)
    }

    /// The head's doc, with or without its outbox.
    fn doc(&self, with_outbox: bool) -> Result<String, StoreError> {
        let outbox = ListRef {
            seg: &self.layout.outbox_segments,
            e: &self.layout.outbox_inline,
        };
        let mut gc: Vec<&str> = self
            .layout
            .retired
            .iter()
            .chain(&self.undeleted)
            .chain(self.abandoned)
            .map(String::as_str)
            .collect();
        let outbox_gc: Vec<String>;
        if !with_outbox {
            outbox_gc = self
                .layout
                .outbox_segments
                .iter()
                .map(|s| outbox_segment_key(&self.pk, s.id).sk)
                .collect();
            gc.extend(outbox_gc.iter().map(String::as_str));
        }
        let key = &self.commit.key;
        let slots: Vec<(&str, ListRef<'_>)> = self
            .layout
            .slots
            .iter()
            .map(|(name, laid)| (*name, laid.as_ref()))
            .collect();
        let doc = HeadDocRef {
            wm: &self.placement.inline,
            wx: self.placement.spilled,
            slots: &slots,
            ob: (with_outbox && self.layout.has_outbox).then_some(outbox),
            gc: &gc,
            exp: self.commit.state.expires_at,
            tk: &self.tokens,
            key: (key.len() > KEY_HASHED_PAST_BYTES).then_some(key.as_str()),
            sn: self.commit.state.sent_so_far.as_ref(),
            mf: self.commit.state.retiring.as_ref(),
        };
        Ok(doc.to_json())
    }
}

/// The head item for the doc `text` at `version`.
fn head_item(
    pk: &str,
    version: u64,
    text: String,
    ttl: Option<i64>,
    dictionary: Option<&Dictionary>,
) -> Result<Item, StoreError> {
    let mut item = ItemKey {
        pk: pk.to_owned(),
        sk: HEAD_SK.to_owned(),
    }
    .to_item();
    item.insert(VERSION.to_owned(), AttrValue::N(number(version)));
    item.insert(DOC.to_owned(), AttrValue::S(text));
    if let Some(t) = ttl {
        item.insert(TTL.to_owned(), AttrValue::N(number(t)));
    }
    // Measured as text, as segments are (`layout::make_segment`).
    let size = item_size(&item);
    if size > ITEM_MAX_BYTES {
        return Err(StoreError::Invalid(format!(
            "the head of {pk} is {size} bytes even with every entry in segments"
        )));
    }
    if let Some(AttrValue::S(text)) = item.remove(DOC) {
        super::text::store(&mut item, DOC, text, dictionary);
    }
    Ok(item)
}

/// The segment sort keys a head references.
pub(super) fn referenced(pk: &str, doc: &HeadDoc) -> HashSet<String> {
    let mut keys: HashSet<String> = doc
        .slots
        .iter()
        .flat_map(|(name, list)| {
            list.seg
                .iter()
                .map(move |s| slot_segment_key(pk, name, s.id).sk)
        })
        .collect();
    if let Some(outbox) = &doc.ob {
        keys.extend(outbox.seg.iter().map(|s| outbox_segment_key(pk, s.id).sk));
    }
    keys
}

impl<T: Table> DynamoStateStore<T> {
    fn prepare<'c>(
        &self,
        namespace: &Namespace,
        commit: &'c Commit,
        now_secs: i64,
    ) -> Result<Prepared<'c>, StoreError> {
        let pk = partition_key(namespace, &commit.key);
        let state = &commit.state;
        let loaded = state.memo.get::<Loaded>().unwrap_or(&NOTHING_LOADED);
        let exp = state.expires_at;
        let layout = lay_out(&pk, &state.slots, &state.outbox, loaded, exp, now_secs)?;
        let placement = place(&state.watermarks, loaded)?;
        let window = commit.redelivery_window.as_secs() as i64;
        let evicted = placement
            .evicted
            .iter()
            .map(|(lineage, mark)| watermarks::make_item(&pk, lineage, mark, window))
            .collect();
        // The head outlives its slots while a redelivery could still reach its watermarks, and
        // never expires while it holds an outbox.
        let horizon = state
            .watermarks
            .latest_arrival()
            .map(|at| at.div_euclid(1000) + window + 1);
        let ttl_without_outbox = match exp {
            Some(e) => Some(horizon.map_or(e, |h| e.max(h))),
            // A key that holds nothing but watermarks goes once no redelivery can reach them.
            None if state.slots.is_empty() => horizon,
            None => None,
        };
        let ttl = if state.outbox.is_empty() {
            ttl_without_outbox
        } else {
            None
        };
        let token = rand::random::<u64>();
        let mut tokens = loaded.tokens.clone();
        tokens.push(token);
        if tokens.len() > TOKENS_KEPT {
            tokens.drain(..tokens.len() - TOKENS_KEPT);
        }
        Ok(Prepared {
            commit,
            pk,
            token,
            tokens,
            layout,
            placement,
            ttl,
            ttl_without_outbox,
            garbage: &loaded.garbage,
            abandoned: &loaded.pending,
            undeleted: Vec::new(),
            evicted,
            dictionaries: namespace.dictionaries.clone(),
        })
    }

    pub(super) async fn commit_all(
        &self,
        namespace: &Namespace,
        commits: Vec<Commit>,
    ) -> Vec<Result<Committed, StoreError>> {
        let now_secs = self.now_secs();
        let mut prepared: Vec<Result<Prepared<'_>, StoreError>> = commits
            .iter()
            .map(|c| self.prepare(namespace, c, now_secs))
            .collect();
        self.list_pending(&mut prepared).await;
        self.write_first(&mut prepared).await;
        let puts = prepared.into_iter().map(|p| async move {
            let p = p?;
            let version = p.commit.expected_version;
            let item = match p
                .doc(true)
                .and_then(|text| head_item(&p.pk, version + 1, text, p.ttl, p.dictionaries.first()))
            {
                Ok(item) => item,
                Err(err) => return self.settle(&p, err).await,
            };
            let expect = if version == 0 {
                Expect::Absent
            } else {
                Expect::Version(version)
            };
            match self.put_retrying(&item, &expect).await {
                Ok(()) => self.landed(&p).await,
                Err(err) => self.settle(&p, err).await,
            }
        });
        join_all(puts).await
    }

    /// Wave 0: a commit about to write segments first lists them, with those an unfinished
    /// commit left, in the head's `pd`, at the version it read: should it never write its head,
    /// the next commit of the key finds them there.
    async fn list_pending(&self, prepared: &mut [Result<Prepared<'_>, StoreError>]) {
        let updates = prepared.iter().enumerate().filter_map(|(i, p)| {
            let p = p
                .as_ref()
                .ok()
                .filter(|p| !p.layout.segment_puts.is_empty())?;
            let listed: Vec<AttrValue> = p
                .abandoned
                .iter()
                .cloned()
                .chain(p.written_segments().map(|k| k.sk))
                .map(AttrValue::S)
                .collect();
            let attributes = Item::from([(PENDING.to_owned(), AttrValue::L(listed))]);
            let key = ItemKey {
                pk: p.pk.clone(),
                sk: HEAD_SK.to_owned(),
            };
            let expect = match p.commit.expected_version {
                0 => Expect::Absent,
                v => Expect::Version(v),
            };
            Some(async move { (i, self.update_retrying(&key, &attributes, &expect).await) })
        });
        for (i, result) in join_all(updates).await {
            if let Err(err) = result {
                prepared[i] = Err(err);
            }
        }
    }

    /// Wave 1: every key's new segments, garbage deletes and watermark items at once. A key whose
    /// segments or watermarks could not be written fails; garbage left undeleted stays listed.
    async fn write_first(&self, prepared: &mut [Result<Prepared<'_>, StoreError>]) {
        let mut requests = Vec::new();
        let mut owner: HashMap<ItemKey, usize> = HashMap::new();
        for (i, p) in prepared.iter().enumerate() {
            let Ok(p) = p else { continue };
            for item in &p.layout.segment_puts {
                owner.insert(ItemKey::of(item).expect("segment items have keys"), i);
                requests.push(WriteRequest::Put(item.clone()));
            }
            for sk in p.garbage {
                let key = ItemKey {
                    pk: p.pk.clone(),
                    sk: sk.clone(),
                };
                owner.insert(key.clone(), i);
                requests.push(WriteRequest::Delete(key));
            }
        }
        let evictions = prepared.iter().enumerate().flat_map(|(i, p)| {
            let items = p.as_ref().map(|p| p.evicted.as_slice()).unwrap_or(&[]);
            items.iter().map(move |item| async move {
                let expect = Expect::Raise {
                    attribute: watermarks::SEQUENCE,
                    value: item[watermarks::SEQUENCE]
                        .as_s()
                        .expect("watermark items carry their sequence")
                        .to_owned(),
                };
                match self.put_retrying(item, &expect).await {
                    // The item already holds this watermark or a later one.
                    Ok(()) | Err(StoreError::Conflict) => (i, Ok(())),
                    Err(err) => (i, Err(err)),
                }
            })
        });
        let (written, evicted) = futures::join!(self.write_all(requests), join_all(evictions));
        let (left, error) = written;
        for request in left {
            match request {
                WriteRequest::Put(item) => {
                    let i = owner[&ItemKey::of(&item).expect("segment items have keys")];
                    let err = error
                        .clone()
                        .unwrap_or(StoreError::Unavailable("segment not written".into()));
                    prepared[i] = Err(err);
                }
                WriteRequest::Delete(key) => {
                    // Still garbage: the next commit tries again.
                    if let Ok(p) = &mut prepared[owner[&key]] {
                        p.undeleted.push(key.sk);
                    }
                }
            }
        }
        for (i, result) in evicted {
            if let (Err(err), Ok(_)) = (result, &prepared[i]) {
                prepared[i] = Err(err);
            }
        }
    }

    /// A head put failed: reads the head back. Finding its own token, the commit landed (its
    /// response was lost). Otherwise, once the head moved past the version the commit expected,
    /// its put can never land later, and the segments it wrote that the head does not reference
    /// are deleted; while the head still is at that version (a put that timed out may yet land),
    /// they are left for their TTL.
    async fn settle(&self, p: &Prepared<'_>, err: StoreError) -> Result<Committed, StoreError> {
        if matches!(err, StoreError::Invalid(_)) {
            self.delete_orphans(p, &HashSet::new()).await;
            return Err(err);
        }
        let head_key = ItemKey {
            pk: p.pk.clone(),
            sk: HEAD_SK.to_owned(),
        };
        let Ok(current) = self.table.get(&head_key).await else {
            return Err(err);
        };
        let (version, doc) = match current
            .as_ref()
            .map(|head| parse_head(head, &p.dictionaries))
            .transpose()
        {
            Ok(head) => head.unwrap_or((0, HeadDoc::default())),
            Err(_) => return Err(err),
        };
        if doc.tk.contains(&p.token) {
            return self.landed(p).await;
        }
        if version == p.commit.expected_version {
            return Err(err);
        }
        self.delete_orphans(p, &referenced(&p.pk, &doc)).await;
        Err(StoreError::Conflict)
    }

    async fn delete_orphans(&self, p: &Prepared<'_>, referenced: &HashSet<String>) {
        let orphans: Vec<WriteRequest> = p
            .written_segments()
            .filter(|k| !referenced.contains(&k.sk))
            .map(WriteRequest::Delete)
            .collect();
        if !orphans.is_empty() {
            // What is left stays for its TTL.
            let _ = self.write_all(orphans).await;
        }
    }

    /// Rewrites each committed head without its outbox, at the same version and conditional on
    /// it; the outbox's segments become garbage.
    pub(super) async fn clear_outboxes(
        &self,
        namespace: &Namespace,
        committed: Vec<Committed>,
    ) -> Vec<Result<(), StoreError>> {
        let clears = committed.into_iter().map(|c| async move {
            let Some(written) = c.memo.get::<Written>() else {
                // Nothing was in the outbox, or another store committed it.
                return Ok(());
            };
            let item = head_item(
                &written.pk,
                c.version,
                written.doc_without_outbox.clone(),
                written.ttl,
                namespace.dictionaries.first(),
            )?;
            match self.put_retrying(&item, &Expect::Version(c.version)).await {
                Ok(()) => self.expire_cleared(&written.outbox_segments).await,
                // The key changed since: its new head took the outbox over, and its next commit
                // deletes the segments.
                Err(StoreError::Conflict) => Ok(()),
                Err(err) => Err(err),
            }
        });
        join_all(clears).await
    }
}

impl<T: Table> DynamoStateStore<T> {
    /// Gives the segments of a cleared outbox a TTL: no head references them, and no commit will
    /// delete them (a key may never commit again).
    async fn expire_cleared(&self, segments: &[ItemKey]) -> Result<(), StoreError> {
        let at = self.now_secs() + CLEARED_OUTBOX_SECONDS;
        self.expire_segments(segments.iter().cloned(), at).await
    }

    /// The commit of `p`, its head written: its garbage is given a TTL first if the head expires.
    async fn landed(&self, p: &Prepared<'_>) -> Result<Committed, StoreError> {
        self.expire_retired(p).await;
        committed(p)
    }

    /// Gives the segments the head's `gc` lists a TTL, when the head expires (now, or once its
    /// outbox is cleared): the key's next commit would delete them, and a key whose head goes
    /// by TTL has none. Those it retired without a TTL of their own, and those earlier commits
    /// left (deletes not done, segments of a commit that never wrote its head). A failure leaves
    /// them listed in the head (the commit stands).
    async fn expire_retired(&self, p: &Prepared<'_>) {
        let Some(head_ttl) = p.ttl.or(p.ttl_without_outbox) else {
            return;
        };
        let garbage = p
            .layout
            .unexpiring
            .iter()
            .chain(&p.undeleted)
            .chain(p.abandoned);
        let keys = garbage.map(|sk| ItemKey {
            pk: p.pk.clone(),
            sk: sk.clone(),
        });
        let at = head_ttl.max(self.now_secs() + CLEARED_OUTBOX_SECONDS);
        if let Err(e) = self.expire_segments(keys, at).await {
            tracing::warn!(pk = %p.pk, "a retired segment kept without a TTL: {e}");
        }
    }

    /// Gives the segments `keys` the TTL `at`, all at once. Not deleted at once: a load that read
    /// a head listing them may still be reading them.
    async fn expire_segments(
        &self,
        keys: impl Iterator<Item = ItemKey>,
        at: i64,
    ) -> Result<(), StoreError> {
        let ttl: Item = [(TTL.to_owned(), AttrValue::N(at.to_string()))].into();
        let updates = keys.map(|key| {
            let ttl = &ttl;
            async move { self.update_retrying(&key, ttl, &Expect::Anything).await }
        });
        join_all(updates).await.into_iter().collect()
    }
}

/// How long the segments of a cleared outbox stay for loads that read the head before.
const CLEARED_OUTBOX_SECONDS: i64 = 3600;

/// The commit of `p`, with what clearing its outbox takes, if it has one.
fn committed(p: &Prepared<'_>) -> Result<Committed, StoreError> {
    let memo = if p.layout.has_outbox {
        StoreMemo::new(Written {
            pk: p.pk.clone(),
            doc_without_outbox: p.doc(false)?,
            ttl: p.ttl_without_outbox,
            outbox_segments: p
                .layout
                .outbox_segments
                .iter()
                .map(|s| outbox_segment_key(&p.pk, s.id))
                .collect(),
        })
    } else {
        StoreMemo::default()
    };
    Ok(Committed {
        key: p.commit.key.clone(),
        version: p.commit.expected_version + 1,
        memo,
    })
}
