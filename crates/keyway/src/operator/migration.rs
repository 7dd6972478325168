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

use super::{state_signature, ListState, MapState, StateDescriptor, ValueState};
use crate::domain::SlotData;

/// A migration cannot carry a key's state over: the state it was reading or writing, and why.
/// The key starts afresh (and is counted as reset).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("state {state:?}: {problem}")]
pub struct MigrationError {
    /// The name of the state being read or written.
    pub state: String,
    /// Why it could not be.
    pub problem: String,
}

impl MigrationError {
    /// The error of the state named `state`, saying `problem`.
    pub fn new(state: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            state: state.into(),
            problem: problem.into(),
        }
    }
}

/// State read under an older signature, through the descriptors it was declared with.
pub struct OldState<'a> {
    pub(crate) slots: &'a BTreeMap<String, SlotData>,
}

fn decode<T: DeserializeOwned>(name: &str, raw: &RawValue) -> Result<T, MigrationError> {
    serde_json::from_str(raw.get()).map_err(|e| MigrationError::new(name, e.to_string()))
}

impl OldState<'_> {
    /// The old value state `state`; `None` when the key had none.
    pub fn value<T: DeserializeOwned>(
        &self,
        state: &ValueState<T>,
    ) -> Result<Option<T>, MigrationError> {
        self.slots
            .get(state.name)
            .and_then(|s| s.entries.first())
            .map(|raw| decode(state.name, raw))
            .transpose()
    }

    /// The old list state `state`'s elements, in order; empty when the key had none.
    pub fn list<T: DeserializeOwned>(
        &self,
        state: &ListState<T>,
    ) -> Result<Vec<T>, MigrationError> {
        self.slots.get(state.name).map_or(Ok(Vec::new()), |s| {
            s.entries
                .iter()
                .map(|raw| decode(state.name, raw))
                .collect()
        })
    }

    /// The old map state `state`; empty when the key had none.
    pub fn map<K: DeserializeOwned + Ord, V: DeserializeOwned>(
        &self,
        state: &MapState<K, V>,
    ) -> Result<BTreeMap<K, V>, MigrationError> {
        self.slots.get(state.name).map_or(Ok(BTreeMap::new()), |s| {
            s.entries
                .iter()
                .map(|raw| decode(state.name, raw))
                .collect()
        })
    }
}

/// State to write under the current signature.
#[derive(Default)]
pub struct NewState {
    pub(crate) slots: BTreeMap<String, Vec<Box<RawValue>>>,
}

fn encode<T: Serialize>(name: &str, value: &T) -> Result<Box<RawValue>, MigrationError> {
    serde_json::value::to_raw_value(value).map_err(|e| MigrationError::new(name, e.to_string()))
}

impl NewState {
    /// No states yet: each is added by the calls that follow.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the state `state` as the key held it before, unchanged (nothing where it held none):
    /// for a state whose structure stayed when another was added or changed. Timers carry over
    /// as `carry(old, &timers())`.
    pub fn carry(mut self, old: &OldState<'_>, state: &StateDescriptor) -> Self {
        if let Some(slot) = old.slots.get(state.name) {
            self.slots
                .insert(state.name.to_owned(), slot.entries.clone());
        }
        self
    }

    /// Adds the value state `state`, holding `value`.
    pub fn value<T: Serialize>(
        mut self,
        state: &ValueState<T>,
        value: T,
    ) -> Result<Self, MigrationError> {
        self.slots
            .insert(state.name.to_owned(), vec![encode(state.name, &value)?]);
        Ok(self)
    }

    /// Adds the list state `state`, holding `items` in order.
    pub fn list<T: Serialize>(
        mut self,
        state: &ListState<T>,
        items: impl IntoIterator<Item = T>,
    ) -> Result<Self, MigrationError> {
        let entries = items
            .into_iter()
            .map(|v| encode(state.name, &v))
            .collect::<Result<_, _>>()?;
        self.slots.insert(state.name.to_owned(), entries);
        Ok(self)
    }

    /// Adds the map state `state`, holding `entries`.
    pub fn map<K: Serialize, V: Serialize>(
        mut self,
        state: &MapState<K, V>,
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, MigrationError> {
        let entries = entries
            .into_iter()
            .map(|e| encode(state.name, &e))
            .collect::<Result<_, _>>()?;
        self.slots.insert(state.name.to_owned(), entries);
        Ok(self)
    }
}

/// A migration's conversion of one key's old state.
pub type MigrateFn = fn(&OldState<'_>) -> Result<NewState, MigrationError>;

/// A conversion of a key's state written under an older structure of the operator's states.
#[derive(Clone, Debug)]
pub struct Migration {
    /// The signature of the old structure, derived from its descriptors.
    pub from: String,
    /// Converts a key's old state; on an error the key starts afresh.
    pub migrate: MigrateFn,
}

impl Migration {
    /// A migration from the states the operator declared as `old` (its `states()` as they were),
    /// which `migrate` reads through the same descriptors.
    pub fn from_states(old: &[StateDescriptor], migrate: MigrateFn) -> Self {
        Self {
            from: state_signature(old),
            migrate,
        }
    }
}
