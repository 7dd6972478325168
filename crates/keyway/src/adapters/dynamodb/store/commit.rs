//! Committing keys: new segments, garbage deletes and watermarks moved out of the head first
//! (wave 1), then every head conditional on the version read (wave 2); a head whose put failed is
//! settled by reading it back. And clearing a committed outbox.

use std::collections::{HashMap, HashSet};

use futures::future::join_all;

use super::super::{Expect, ItemKey, Table, WriteRequest, ITEM_MAX_BYTES, TTL, VERSION};
use super::head::{HeadDoc, Loaded, Written, TOKENS_KEPT};
use super::layout::lay_out;
use super::watermarks::{self, place};
use super::{
    outbox_segment_key, parse_head, partition_key, slot_segment_key, DynamoStateStore, DOC,
    HEAD_SK, KEY_MAX_BYTES,
};
use crate::domain::item::item_size;
use crate::domain::{AttrValue, Item, StoreMemo};
use crate::ports::{Commit, Committed, Namespace, StoreError};

/// A commit made ready: what wave 1 writes, then its head.
struct Prepared {
    key: String,
    pk: String,
    expected_version: u64,
    token: String,
    doc: HeadDoc,
    ttl: Option<i64>,
    ttl_without_outbox: Option<i64>,
    segment_puts: Vec<Item>,
    /// Garbage the loaded head listed: deleted now.
    garbage: Vec<String>,
    /// Watermark items for watermarks leaving the head.
    evicted: Vec<Item>,
}

impl Prepared {
    fn written_segments(&self) -> impl Iterator<Item = ItemKey> + '_ {
        self.segment_puts.iter().filter_map(ItemKey::of)
    }
}

/// The head item for `doc` at `version`.
fn head_item(pk: &str, version: u64, doc: &HeadDoc, ttl: Option<i64>) -> Result<Item, StoreError> {
    let mut item = ItemKey {
        pk: pk.to_owned(),
        sk: HEAD_SK.to_owned(),
    }
    .to_item();
    item.insert(VERSION.to_owned(), AttrValue::N(version.to_string()));
    let text = serde_json::to_string(doc).map_err(|e| StoreError::Invalid(e.to_string()))?;
    item.insert(DOC.to_owned(), AttrValue::S(text));
    if let Some(t) = ttl {
        item.insert(TTL.to_owned(), AttrValue::N(t.to_string()));
    }
    let size = item_size(&item);
    if size > ITEM_MAX_BYTES {
        return Err(StoreError::Invalid(format!(
            "the head of {pk} is {size} bytes even with every entry in segments ({} watermarks)",
            doc.wm.len()
        )));
    }
    Ok(item)
}

/// The segment sort keys a head references.
fn referenced(pk: &str, doc: &HeadDoc) -> HashSet<String> {
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
    fn prepare(
        &self,
        namespace: &Namespace,
        commit: Commit,
        now_secs: i64,
    ) -> Result<Prepared, StoreError> {
        let pk = partition_key(namespace, &commit.key);
        let state = commit.state;
        let loaded = state.memo.get::<Loaded>().cloned().unwrap_or_default();
        let exp = state.expires_at;
        let layout = lay_out(&pk, &state.slots, &state.outbox, &loaded, exp, now_secs)?;
        let placement = place(&state.watermarks, &loaded)?;
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
        let ttl_without_outbox = exp.map(|e| horizon.map_or(e, |h| e.max(h)));
        let ttl = if state.outbox.is_empty() {
            ttl_without_outbox
        } else {
            None
        };
        let token = format!("{:016x}", rand::random::<u64>());
        let mut tokens = loaded.tokens.clone();
        tokens.push(token.clone());
        if tokens.len() > TOKENS_KEPT {
            tokens.drain(..tokens.len() - TOKENS_KEPT);
        }
        let doc = HeadDoc {
            wm: placement.inline,
            wx: placement.spilled,
            slots: layout.slots,
            ob: layout.outbox,
            gc: layout.retired,
            exp,
            tk: tokens,
            key: (commit.key.len() > KEY_MAX_BYTES).then(|| commit.key.clone()),
        };
        Ok(Prepared {
            key: commit.key,
            pk,
            expected_version: commit.expected_version,
            token,
            doc,
            ttl,
            ttl_without_outbox,
            segment_puts: layout.segment_puts,
            garbage: loaded.garbage,
            evicted,
        })
    }

    pub(super) async fn commit_all(
        &self,
        namespace: &Namespace,
        commits: Vec<Commit>,
    ) -> Vec<Result<Committed, StoreError>> {
        let now_secs = self.now_secs();
        let mut prepared: Vec<Result<Prepared, StoreError>> = commits
            .into_iter()
            .map(|c| self.prepare(namespace, c, now_secs))
            .collect();
        self.write_first(&mut prepared).await;
        let puts = prepared.into_iter().map(|p| async move {
            let p = p?;
            let item = match head_item(&p.pk, p.expected_version + 1, &p.doc, p.ttl) {
                Ok(item) => item,
                Err(err) => return self.settle(p, err).await,
            };
            let expect = if p.expected_version == 0 {
                Expect::Absent
            } else {
                Expect::Version(p.expected_version)
            };
            match self.put_retrying(&item, &expect).await {
                Ok(()) => Ok(committed(p)),
                Err(err) => self.settle(p, err).await,
            }
        });
        join_all(puts).await
    }

    /// Wave 1: every key's new segments, garbage deletes and watermark items at once. A key whose
    /// segments or watermarks could not be written fails; garbage left undeleted stays listed.
    async fn write_first(&self, prepared: &mut [Result<Prepared, StoreError>]) {
        let mut requests = Vec::new();
        let mut owner: HashMap<ItemKey, usize> = HashMap::new();
        for (i, p) in prepared.iter().enumerate() {
            let Ok(p) = p else { continue };
            for item in &p.segment_puts {
                owner.insert(ItemKey::of(item).expect("segment items have keys"), i);
                requests.push(WriteRequest::Put(item.clone()));
            }
            for sk in &p.garbage {
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
                        p.doc.gc.push(key.sk);
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
    async fn settle(&self, p: Prepared, err: StoreError) -> Result<Committed, StoreError> {
        if matches!(err, StoreError::Invalid(_)) {
            self.delete_orphans(&p, &HashSet::new()).await;
            return Err(err);
        }
        let head_key = ItemKey {
            pk: p.pk.clone(),
            sk: HEAD_SK.to_owned(),
        };
        let Ok(current) = self.table.get(&head_key).await else {
            return Err(err);
        };
        let (version, doc) = match current.as_ref().map(parse_head).transpose() {
            Ok(head) => head.unwrap_or((0, HeadDoc::default())),
            Err(_) => return Err(err),
        };
        if doc.tk.contains(&p.token) {
            return Ok(committed(p));
        }
        if version == p.expected_version {
            return Err(err);
        }
        self.delete_orphans(&p, &referenced(&p.pk, &doc)).await;
        Err(StoreError::Conflict)
    }

    async fn delete_orphans(&self, p: &Prepared, referenced: &HashSet<String>) {
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
        _namespace: &Namespace,
        committed: Vec<Committed>,
    ) -> Vec<Result<(), StoreError>> {
        let clears = committed.into_iter().map(|c| async move {
            let Some(written) = c.memo.get::<WrittenHead>() else {
                return Err(StoreError::Invalid(format!(
                    "key {:?} was not committed by this store",
                    c.key
                )));
            };
            let mut doc = written.written.doc.clone();
            if let Some(outbox) = doc.ob.take() {
                doc.gc.extend(
                    outbox
                        .seg
                        .iter()
                        .map(|s| outbox_segment_key(&written.pk, s.id).sk),
                );
            }
            let item = head_item(
                &written.pk,
                c.version,
                &doc,
                written.written.ttl_without_outbox,
            )?;
            match self.put_retrying(&item, &Expect::Version(c.version)).await {
                // The key changed since: its new head took the outbox over.
                Ok(()) | Err(StoreError::Conflict) => Ok(()),
                Err(err) => Err(err),
            }
        });
        join_all(clears).await
    }
}

/// The memo of a head this store wrote.
#[derive(Clone, Debug)]
struct WrittenHead {
    pk: String,
    written: Written,
}

fn committed(p: Prepared) -> Committed {
    Committed {
        key: p.key,
        version: p.expected_version + 1,
        memo: StoreMemo::new(WrittenHead {
            pk: p.pk,
            written: Written {
                doc: p.doc,
                ttl_without_outbox: p.ttl_without_outbox,
            },
        }),
    }
}
