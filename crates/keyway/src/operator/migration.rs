//! Migrations: carrying a key's state from an older structure to the current one.
//!
//! When an operator's state structure changes, its state lives under a new signature and old
//! state is never read as the new type. An operator that registers a migration from the old
//! signature gets each key's old state converted the first time the key is seen under the new
//! one; the converted state, with the key's watermarks, is written under the new signature once.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;

use super::{ListState, MapState, ValueState};
use crate::domain::SlotData;

/// State read under an older signature, typed on demand.
pub struct OldState<'a> {
    pub(crate) slots: &'a BTreeMap<String, SlotData>,
}

fn decode<T: DeserializeOwned>(name: &str, raw: &RawValue) -> Result<T, String> {
    serde_json::from_str(raw.get()).map_err(|e| format!("old state {name:?}: {e}"))
}

impl OldState<'_> {
    pub fn value<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, String> {
        self.slots
            .get(name)
            .and_then(|s| s.entries.first())
            .map(|raw| decode(name, raw))
            .transpose()
    }

    pub fn list<T: DeserializeOwned>(&self, name: &str) -> Result<Vec<T>, String> {
        self.slots.get(name).map_or(Ok(Vec::new()), |s| {
            s.entries.iter().map(|raw| decode(name, raw)).collect()
        })
    }

    pub fn map<K: DeserializeOwned + Ord, V: DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<BTreeMap<K, V>, String> {
        self.slots.get(name).map_or(Ok(BTreeMap::new()), |s| {
            s.entries.iter().map(|raw| decode(name, raw)).collect()
        })
    }
}

/// State to write under the current signature.
#[derive(Default)]
pub struct NewState {
    pub(crate) slots: BTreeMap<String, Vec<Box<RawValue>>>,
}

fn encode<T: Serialize>(name: &str, value: &T) -> Result<Box<RawValue>, String> {
    serde_json::value::to_raw_value(value).map_err(|e| format!("new state {name:?}: {e}"))
}

impl NewState {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn value<T: Serialize>(mut self, state: &ValueState<T>, value: T) -> Result<Self, String> {
        self.slots
            .insert(state.name.to_owned(), vec![encode(state.name, &value)?]);
        Ok(self)
    }

    pub fn list<T: Serialize>(
        mut self,
        state: &ListState<T>,
        items: impl IntoIterator<Item = T>,
    ) -> Result<Self, String> {
        let entries = items
            .into_iter()
            .map(|v| encode(state.name, &v))
            .collect::<Result<_, _>>()?;
        self.slots.insert(state.name.to_owned(), entries);
        Ok(self)
    }

    pub fn map<K: Serialize, V: Serialize>(
        mut self,
        state: &MapState<K, V>,
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, String> {
        let entries = entries
            .into_iter()
            .map(|e| encode(state.name, &e))
            .collect::<Result<_, _>>()?;
        self.slots.insert(state.name.to_owned(), entries);
        Ok(self)
    }
}

/// A conversion of a key's state written under the operator signature `from`.
#[derive(Clone, Copy)]
pub struct Migration {
    pub from: &'static str,
    pub migrate: fn(&OldState<'_>) -> Result<NewState, String>,
}
