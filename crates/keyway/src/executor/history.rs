//! The operator's signature history: which state signatures it ran under, and since when. It
//! tells a key missing under the current signature whether it was left behind by a change.

use tracing::warn;

use super::Executor;
use crate::domain::SlotData;
use crate::operator::KeyedOperator;
use crate::ports::{Commit, Namespace, StoreError};

/// Where an operator's signature history is kept: a namespace and key of its own (stores and
/// tests that stand between the executor and its state tell its requests apart by it).
pub const HISTORY: &str = "signature-history";
const HISTORY_SLOT: &str = "signatures";

impl<O: KeyedOperator> Executor<O> {
    /// The signature this one replaced, and when this one took over. The first call records
    /// this signature in the operator's history; a failure to read or write the history only
    /// means resets are not counted, so it is logged and passed over.
    pub(super) async fn previous_signature(&self, now: i64) -> Option<(String, i64)> {
        self.history
            .get_or_init(|| async {
                self.record_signature(now).await.unwrap_or_else(|err| {
                    warn!(operator = %self.namespace.operator, error = %err, "signature history unavailable");
                    None
                })
            })
            .await
            .clone()
    }

    async fn record_signature(&self, now: i64) -> Result<Option<(String, i64)>, StoreError> {
        let namespace = Namespace {
            signature: HISTORY.into(),
            ..self.namespace.clone()
        };
        let key = [HISTORY.to_owned()];
        for _ in 0..3 {
            let mut state = self
                .store
                .load(&namespace, &key)
                .await?
                .remove(HISTORY)
                .unwrap_or_default();
            let mut entries: Vec<(String, i64)> = state
                .slots
                .get(HISTORY_SLOT)
                .map(|s| {
                    s.entries
                        .iter()
                        .filter_map(|e| serde_json::from_str(e.get()).ok())
                        .collect()
                })
                .unwrap_or_default();
            if let Some(at) = entries
                .iter()
                .rposition(|(sig, _)| *sig == self.namespace.signature)
            {
                return Ok(at
                    .checked_sub(1)
                    .map(|before| (entries[before].0.clone(), entries[at].1)));
            }
            let previous = entries.last().map(|(sig, _)| (sig.clone(), now));
            entries.push((self.namespace.signature.clone(), now));
            let raw = entries
                .iter()
                .map(|e| serde_json::value::to_raw_value(e).expect("a pair serializes"))
                .collect();
            state
                .slots
                .insert(HISTORY_SLOT.into(), SlotData::fresh(raw));
            let commit = Commit::new(HISTORY, state.version, state);
            match self.store.commit(&namespace, vec![commit]).await.remove(0) {
                Ok(_) => return Ok(previous),
                // Another invocation recorded it first: read again.
                Err(StoreError::Conflict) => continue,
                Err(err) => return Err(err),
            }
        }
        Err(StoreError::Conflict)
    }
}
