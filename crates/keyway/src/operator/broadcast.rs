//! Broadcast state (Flink's broadcast state of a `KeyedBroadcastProcessFunction`): one value per
//! operator that `process` reads for every key, written only by the records the operator keys to
//! `BROADCAST_KEY` (those of its broadcast input: rules, subscriptions, configuration).
//!
//! It is stored as the state of that key, so its writes follow keyed state's rules: watermarks,
//! conditional commits, exactly once. Each invocation loads it with the batch's keys (one more key
//! of the same read) and reads the copy it decoded before when the version has not moved: an
//! execution environment decodes each version once, however many invocations it serves. Records
//! of other keys read the value as it was when their batch was loaded.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;

use super::state::{BroadcastState, StateDescriptor, StateError};
use crate::domain::{KeyState, SlotData};

/// The key whose records write the operator's broadcast states.
pub const BROADCAST_KEY: &str = "$broadcast";

/// The broadcast states as one load found them, with the typed values decoded from them.
pub(crate) struct BroadcastSnapshot {
    version: u64,
    slots: BTreeMap<String, SlotData>,
    typed: Mutex<HashMap<&'static str, Arc<dyn Any + Send + Sync>>>,
    /// The broadcast states the operator declares: only those are read, each as its own type.
    declared: Arc<[StateDescriptor]>,
}

impl BroadcastSnapshot {
    fn of(state: &KeyState, declared: Arc<[StateDescriptor]>) -> Self {
        Self {
            version: state.version,
            slots: state.slots.clone(),
            typed: Mutex::default(),
            declared,
        }
    }

    /// Whether `state` is what this snapshot was taken of: the same version, and the same slots
    /// (a TTL that passed empties them without a new version).
    fn is_of(&self, state: &KeyState) -> bool {
        self.version == state.version && self.slots.keys().eq(state.slots.keys())
    }

    /// The value of `state`, decoded once.
    pub(crate) fn get<T>(&self, state: &BroadcastState<T>) -> Result<Option<Arc<T>>, StateError>
    where
        T: DeserializeOwned + Send + Sync + 'static,
    {
        let declared = self
            .declared
            .iter()
            .find(|d| d.name == state.name)
            .ok_or_else(|| StateError::Undeclared {
                slot: state.name.to_owned(),
            })?;
        let used = std::any::type_name::<T>();
        if declared.type_name != used {
            return Err(StateError::KindMismatch {
                slot: state.name.to_owned(),
                declared: format!("broadcast of {}", declared.type_name),
                used: format!("broadcast of {used}"),
            });
        }
        let mut typed = self.typed.lock().expect("broadcast decodes");
        if let Some(value) = typed.get(state.name) {
            return Ok(Some(
                value
                    .clone()
                    .downcast::<T>()
                    .expect("the declared type, checked above"),
            ));
        }
        let Some(raw) = self.slots.get(state.name).and_then(|s| s.entries.first()) else {
            return Ok(None);
        };
        let value: Arc<T> =
            Arc::new(
                serde_json::from_str(raw.get()).map_err(|e| StateError::Decode {
                    slot: state.name.to_owned(),
                    error: e.to_string(),
                })?,
            );
        typed.insert(state.name, value.clone());
        Ok(Some(value))
    }
}

/// The snapshot an execution environment keeps between invocations.
pub(crate) struct BroadcastCache {
    kept: Mutex<Option<Arc<BroadcastSnapshot>>>,
    declared: Arc<[StateDescriptor]>,
}

impl BroadcastCache {
    /// A cache of the broadcast states `declared`.
    pub(crate) fn new(declared: &[StateDescriptor]) -> Self {
        Self {
            kept: Mutex::default(),
            declared: declared.into(),
        }
    }

    /// The snapshot of `state` as just loaded: the kept one when nothing changed since.
    pub(crate) fn refresh(&self, state: &KeyState) -> Arc<BroadcastSnapshot> {
        let mut kept = self.kept.lock().expect("broadcast cache");
        match kept.as_ref() {
            Some(snapshot) if snapshot.is_of(state) => snapshot.clone(),
            _ => {
                let snapshot = Arc::new(BroadcastSnapshot::of(state, self.declared.clone()));
                *kept = Some(snapshot.clone());
                snapshot
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    const RULES: BroadcastState<Vec<String>> = BroadcastState::new("rules");

    fn stored(version: u64, json: &str) -> KeyState {
        let mut state = KeyState {
            version,
            ..KeyState::default()
        };
        state.slots.insert(
            "rules".into(),
            SlotData::loaded(vec![RawValue::from_string(json.into()).unwrap()]),
        );
        state
    }

    #[test]
    fn a_version_already_decoded_is_served_from_the_cache_and_a_new_one_replaces_it() {
        let cache = BroadcastCache::new(&[RULES.descriptor()]);
        let first = cache.refresh(&stored(3, r#"["a"]"#));
        let value = first.get(&RULES).unwrap().unwrap();
        assert_eq!(*value, ["a"]);
        let again = cache.refresh(&stored(3, r#"["a"]"#));
        assert!(Arc::ptr_eq(&first, &again));
        assert!(Arc::ptr_eq(&value, &again.get(&RULES).unwrap().unwrap()));
        let newer = cache.refresh(&stored(4, r#"["a","b"]"#));
        assert_eq!(*newer.get(&RULES).unwrap().unwrap(), ["a", "b"]);
        let expired = KeyState {
            version: 4,
            ..KeyState::default()
        };
        assert_eq!(cache.refresh(&expired).get(&RULES).unwrap(), None);
    }

    #[test]
    fn an_undeclared_broadcast_state_or_one_read_as_another_type_is_an_error_naming_it() {
        let cache = BroadcastCache::new(&[RULES.descriptor()]);
        let snapshot = cache.refresh(&stored(1, r#"["a"]"#));
        const OTHER: BroadcastState<Vec<String>> = BroadcastState::new("other");
        assert!(matches!(
            snapshot.get(&OTHER),
            Err(StateError::Undeclared { slot }) if slot == "other"
        ));
        const MISREAD: BroadcastState<Vec<u8>> = BroadcastState::new("rules");
        let err = snapshot.get(&MISREAD).unwrap_err();
        assert!(matches!(err, StateError::KindMismatch { .. }), "{err}");
    }
}
