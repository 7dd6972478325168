//! Typed state: the descriptors an operator declares (one generic `State`, by kind), and the
//! handles `Ctx` gives out.
//!
//! A slot is decoded from its stored JSON entries on first access in a batch, used in typed form
//! for every record of the key, and encoded once at commit, and only if it changed. A list that
//! was only appended to is never decoded and keeps its stored segments.

use std::any::Any;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use thiserror::Error;

use super::signature::{Shape, Untraceable};
use crate::domain::{SlotData, SlotUpdate, StateKind};

/// Why a state could not be read, written or used as the operator asked.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum StateError {
    /// A stored entry is not JSON of the state's type.
    #[error("stored state {slot:?} does not decode: {error}")]
    Decode {
        /// The state's name.
        slot: String,
        /// serde's message.
        error: String,
    },
    /// A value does not serialize to JSON.
    #[error("state {slot:?} does not encode: {error}")]
    Encode {
        /// The state's name.
        slot: String,
        /// serde's message.
        error: String,
    },
    /// The operator used a state it does not list in `states()`.
    #[error("state {slot:?} is not declared in the operator's states()")]
    Undeclared {
        /// The state's name.
        slot: String,
    },
    /// A record of a key other than `BROADCAST_KEY` tried to write a broadcast state.
    #[error("broadcast state {slot:?} is written only by records keyed to BROADCAST_KEY, not by key {key:?}")]
    BroadcastFromKey {
        /// The state's name.
        slot: String,
        /// The key of the record that tried.
        key: String,
    },
    /// A key the operator answered without its state (`answer_without_state`) used a state,
    /// which was not read.
    #[error("state {slot:?} was used by a key the operator answered without its state (answer_without_state), which was not read")]
    NotLoaded {
        /// The state's name.
        slot: String,
    },
    /// A state was used as another kind or type than the one it is declared with.
    #[error("state {slot:?} is declared as {declared} but used as {used}")]
    KindMismatch {
        /// The state's name.
        slot: String,
        /// The kind and type it is declared with, as in `value of u64`.
        declared: String,
        /// The kind and type it was used as.
        used: String,
    },
}

/// What an operator declares about one of its states.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDescriptor {
    /// The state's name, as `State::name`.
    pub name: &'static str,
    /// Value, list, map or broadcast.
    pub kind: StateKind,
    /// The Rust type, for people reading the lock file and logs.
    pub type_name: &'static str,
    /// The structure of the type, or why it could not be traced.
    pub shape: Result<Shape, Untraceable>,
    /// How long the state lives after the commit that last changed it (`with_ttl`); the key's
    /// other states and its watermarks stay.
    pub ttl: Option<Duration>,
}

impl StateDescriptor {
    /// What the operator's state signature is computed from: name, kind and structure.
    pub fn describe(&self) -> String {
        let shape = match &self.shape {
            Ok(shape) => shape.text(),
            Err(e) => format!("UNTRACEABLE<{e}>"),
        };
        format!("{}:{}\n{shape}", self.name, self.kind.as_str())
    }
}

fn shape_of<T: DeserializeOwned>(
    root: &str,
    custom: Option<&'static str>,
) -> Result<Shape, Untraceable> {
    match custom {
        Some(text) => Ok(Shape::custom(root, text)),
        None => Shape::of::<T>(root),
    }
}

/// A state an operator declares, as a const: one value per key (`ValueState<T>`), an ordered list
/// per key (`ListState<T>`), a map per key (`MapState<K, V>`), or one value every key reads
/// (`BroadcastState<T>`). `K` is one of the kinds in [`kind`]; what is stored and how it is read
/// follow from it, the declaration is the same for all.
pub struct State<K> {
    /// The state's name, unique among the operator's states: the slot it is stored under.
    pub name: &'static str,
    custom: Option<&'static str>,
    ttl: Option<Duration>,
    _kind: PhantomData<fn() -> K>,
}

/// A single value per key.
pub type ValueState<T> = State<kind::Value<T>>;
/// An ordered list per key; appending never reads or rewrites what is stored.
pub type ListState<T> = State<kind::List<T>>;
/// A map per key, ordered by its keys.
pub type MapState<K, V> = State<kind::Map<K, V>>;
/// A value shared by every key of an operator (see `operator::broadcast`).
pub type BroadcastState<T> = State<kind::Broadcast<T>>;

/// The kinds of state, as type parameters of [`State`]: each says how its type is traced for the
/// state signature.
pub mod kind {
    use std::marker::PhantomData;

    /// One value per key (`ValueState<T>`).
    pub struct Value<T>(PhantomData<fn() -> T>);
    /// An ordered list per key (`ListState<T>`).
    pub struct List<T>(PhantomData<fn() -> T>);
    /// A map per key (`MapState<K, V>`).
    pub struct Map<K, V>(PhantomData<fn() -> (K, V)>);
    /// One value every key of the operator reads (`BroadcastState<T>`).
    pub struct Broadcast<T>(PhantomData<fn() -> T>);
}

/// What a kind of state contributes to its descriptor.
pub trait Kind {
    /// The kind the descriptor records.
    const KIND: StateKind;
    /// The Rust type stored.
    fn type_name() -> &'static str;
    /// The structure of the stored type, or `custom` standing for it (`State::with_shape`).
    fn shape(custom: Option<&'static str>) -> Result<Shape, Untraceable>;
}

/// A kind whose state belongs to one key, and can expire on its own (`State::with_ttl`).
pub trait Keyed: Kind {}

impl<T: DeserializeOwned> Kind for kind::Value<T> {
    const KIND: StateKind = StateKind::Value;
    fn type_name() -> &'static str {
        std::any::type_name::<T>()
    }
    fn shape(custom: Option<&'static str>) -> Result<Shape, Untraceable> {
        shape_of::<T>("$", custom)
    }
}

impl<T: DeserializeOwned> Kind for kind::List<T> {
    const KIND: StateKind = StateKind::List;
    fn type_name() -> &'static str {
        std::any::type_name::<T>()
    }
    /// `custom` stands for the element type.
    fn shape(custom: Option<&'static str>) -> Result<Shape, Untraceable> {
        shape_of::<T>("$item", custom)
    }
}

impl<K: DeserializeOwned, V: DeserializeOwned> Kind for kind::Map<K, V> {
    const KIND: StateKind = StateKind::Map;
    fn type_name() -> &'static str {
        std::any::type_name::<BTreeMap<K, V>>()
    }
    /// `custom` stands for the key and value types.
    fn shape(custom: Option<&'static str>) -> Result<Shape, Untraceable> {
        match custom {
            Some(text) => Ok(Shape::custom("$entry", text)),
            None => Shape::of::<K>("$key").and_then(|k| Ok(k.merge(Shape::of::<V>("$value")?))),
        }
    }
}

impl<T: DeserializeOwned> Kind for kind::Broadcast<T> {
    const KIND: StateKind = StateKind::Broadcast;
    fn type_name() -> &'static str {
        std::any::type_name::<T>()
    }
    fn shape(custom: Option<&'static str>) -> Result<Shape, Untraceable> {
        shape_of::<T>("$", custom)
    }
}

impl<T: DeserializeOwned> Keyed for kind::Value<T> {}
impl<T: DeserializeOwned> Keyed for kind::List<T> {}
impl<K: DeserializeOwned, V: DeserializeOwned> Keyed for kind::Map<K, V> {}

impl<K> State<K> {
    /// A state named `name`, whose type's structure is traced for the state signature.
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            custom: None,
            ttl: None,
            _kind: PhantomData,
        }
    }

    /// For a type whose structure cannot be traced: `shape` stands for it (for a list, its
    /// element type; for a map, its key and value types), and must change whenever the
    /// serialized form does.
    pub const fn with_shape(name: &'static str, shape: &'static str) -> Self {
        Self {
            name,
            custom: Some(shape),
            ttl: None,
            _kind: PhantomData,
        }
    }
}

impl<K: Keyed> State<K> {
    /// The state expires `ttl` after the commit that last changed it: the key reads it as
    /// absent from then on, and its next commit drops it. (`KeyedOperator::state_ttl` expires a
    /// key's states together.)
    pub const fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
}

impl<K: Kind> State<K> {
    /// What the operator lists in `states()` for this state.
    pub fn descriptor(&self) -> StateDescriptor {
        StateDescriptor {
            name: self.name,
            kind: K::KIND,
            type_name: K::type_name(),
            shape: K::shape(self.custom),
            ttl: self.ttl,
        }
    }
}

impl<T> BroadcastState<T> {
    /// The value slot it is stored in, under `BROADCAST_KEY`.
    pub(crate) const fn slot(&self) -> ValueState<T> {
        State {
            name: self.name,
            custom: self.custom,
            ttl: None,
            _kind: PhantomData,
        }
    }
}

/// A slot in typed form, as the executor holds it between records of one key.
pub(crate) trait TypedSlot: Send {
    /// How the slot changed since it was loaded, or `None` when it did not.
    fn encode(&self, name: &str) -> Result<Option<SlotUpdate>, StateError>;
    /// When the state expires, if this run said so (`ValueHandle::set_expiring`), in epoch
    /// milliseconds; otherwise its TTL decides.
    fn expires_at(&self) -> Option<i64> {
        None
    }
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

pub(crate) trait SlotType: TypedSlot + Sized + 'static {
    const KIND: StateKind;
    fn decode(name: &str, base: &SlotData) -> Result<Self, StateError>;
}

fn decode_entry<T: DeserializeOwned>(name: &str, raw: &RawValue) -> Result<T, StateError> {
    serde_json::from_str(raw.get()).map_err(|e| StateError::Decode {
        slot: name.to_owned(),
        error: e.to_string(),
    })
}

fn encode_entry<T: Serialize>(name: &str, value: &T) -> Result<Box<RawValue>, StateError> {
    serde_json::value::to_raw_value(value).map_err(|e| StateError::Encode {
        slot: name.to_owned(),
        error: e.to_string(),
    })
}

pub(crate) struct ValueSlot<T> {
    value: Option<T>,
    dirty: bool,
    expires_at: Option<i64>,
}

impl<T: Serialize + DeserializeOwned + Send + 'static> TypedSlot for ValueSlot<T> {
    fn encode(&self, name: &str) -> Result<Option<SlotUpdate>, StateError> {
        if !self.dirty {
            return Ok(None);
        }
        let tail = match &self.value {
            Some(v) => vec![encode_entry(name, v)?],
            None => Vec::new(),
        };
        Ok(Some(SlotUpdate { keep: 0, tail }))
    }

    fn expires_at(&self) -> Option<i64> {
        self.expires_at.filter(|_| self.dirty)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl<T: Serialize + DeserializeOwned + Send + 'static> SlotType for ValueSlot<T> {
    const KIND: StateKind = StateKind::Value;
    fn decode(name: &str, base: &SlotData) -> Result<Self, StateError> {
        let value = base
            .entries
            .first()
            .map(|raw| decode_entry(name, raw))
            .transpose()?;
        Ok(Self {
            value,
            dirty: false,
            expires_at: None,
        })
    }
}

/// Reads and writes a value state of the current key.
pub struct ValueHandle<'a, T> {
    pub(crate) slot: &'a mut ValueSlot<T>,
}

impl<T> ValueHandle<'_, T> {
    /// The stored value; `None` when there is none.
    pub fn get(&self) -> Option<&T> {
        self.slot.value.as_ref()
    }

    /// The stored value, to change in place: the state is written at commit whether or not it
    /// changes.
    pub fn get_mut(&mut self) -> Option<&mut T> {
        self.slot.dirty = true;
        self.slot.value.as_mut()
    }

    /// Stores `value`, to live for the state's TTL whatever an earlier `set_expiring` said.
    pub fn set(&mut self, value: T) {
        self.slot.value = Some(value);
        self.slot.dirty = true;
        self.slot.expires_at = None;
    }

    /// Stores `value` until `at_millis` (epoch milliseconds) rather than for the state's TTL:
    /// for a value that says itself how long it holds. The key's state lives at least as long
    /// (see `KeyedOperator::state_ttl`), and reads it as absent from then on.
    pub fn set_expiring(&mut self, value: T, at_millis: i64) {
        self.set(value);
        self.slot.expires_at = Some(at_millis);
    }

    /// Removes and gives back the stored value.
    pub fn take(&mut self) -> Option<T> {
        self.slot.dirty |= self.slot.value.is_some();
        self.slot.value.take()
    }

    /// Removes the stored value.
    pub fn clear(&mut self) {
        self.take();
    }

    /// The stored value, or `default()` stored first.
    pub fn get_or_insert_with(&mut self, default: impl FnOnce() -> T) -> &mut T {
        self.slot.dirty = true;
        self.slot.value.get_or_insert_with(default)
    }
}

pub(crate) struct ListSlot<T> {
    /// How many entries were loaded.
    base_len: usize,
    /// The loaded entries in typed form, once something needed to read them; appended items are
    /// merged in from then on.
    items: Option<Vec<T>>,
    /// Items appended while `items` is not decoded.
    appended: Vec<T>,
    /// Loaded entries before this index are unchanged.
    unchanged: usize,
}

impl<T: Serialize + DeserializeOwned + Send + 'static> TypedSlot for ListSlot<T> {
    fn encode(&self, name: &str) -> Result<Option<SlotUpdate>, StateError> {
        let changed: &[T] = match &self.items {
            Some(items) if self.unchanged == self.base_len && items.len() == self.base_len => {
                return Ok(None)
            }
            Some(items) => &items[self.unchanged..],
            None if self.appended.is_empty() => return Ok(None),
            None => &self.appended,
        };
        let tail = changed
            .iter()
            .map(|v| encode_entry(name, v))
            .collect::<Result<_, _>>()?;
        Ok(Some(SlotUpdate {
            keep: self.unchanged,
            tail,
        }))
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl<T: Serialize + DeserializeOwned + Send + 'static> SlotType for ListSlot<T> {
    const KIND: StateKind = StateKind::List;
    fn decode(_name: &str, base: &SlotData) -> Result<Self, StateError> {
        // Entries are decoded only when something reads them: appending needs none of them.
        let base_len = base.entries.len();
        Ok(Self {
            base_len,
            items: None,
            appended: Vec::new(),
            unchanged: base_len,
        })
    }
}

/// Reads and writes a list state of the current key.
pub struct ListHandle<'a, T> {
    pub(crate) name: &'a str,
    pub(crate) base: &'a SlotData,
    pub(crate) slot: &'a mut ListSlot<T>,
}

impl<T: DeserializeOwned> ListHandle<'_, T> {
    fn items(&mut self) -> Result<&mut Vec<T>, StateError> {
        if self.slot.items.is_none() {
            let mut items: Vec<T> = self
                .base
                .entries
                .iter()
                .map(|raw| decode_entry(self.name, raw))
                .collect::<Result<_, _>>()?;
            items.append(&mut self.slot.appended);
            self.slot.items = Some(items);
        }
        Ok(self.slot.items.as_mut().expect("decoded above"))
    }

    /// Appends without reading what is stored.
    pub fn push(&mut self, value: T) {
        match &mut self.slot.items {
            Some(items) => items.push(value),
            None => self.slot.appended.push(value),
        }
    }

    /// How many elements the list has, appended ones included; decodes nothing stored.
    pub fn len(&self) -> usize {
        match &self.slot.items {
            Some(items) => items.len(),
            None => self.slot.base_len + self.slot.appended.len(),
        }
    }

    /// Whether the list has no elements; decodes nothing stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element, in order.
    pub fn read(&mut self) -> Result<&[T], StateError> {
        Ok(self.items()?.as_slice())
    }

    /// Removes and returns every element.
    pub fn take(&mut self) -> Result<Vec<T>, StateError> {
        let items = std::mem::take(self.items()?);
        self.slot.unchanged = 0;
        Ok(items)
    }

    /// Removes every element without reading them.
    pub fn clear(&mut self) {
        self.slot.items = Some(Vec::new());
        self.slot.appended.clear();
        self.slot.unchanged = 0;
    }

    /// Keeps the elements for which `keep` is true.
    pub fn retain(&mut self, keep: impl FnMut(&T) -> bool) -> Result<(), StateError> {
        let items = self.items()?;
        let before = items.len();
        items.retain(keep);
        if items.len() != before {
            self.slot.unchanged = 0;
        }
        Ok(())
    }
}

pub(crate) struct MapSlot<K, V> {
    map: BTreeMap<K, V>,
    dirty: bool,
    expires_at: Option<i64>,
}

impl<K, V> TypedSlot for MapSlot<K, V>
where
    K: Serialize + DeserializeOwned + Ord + Send + 'static,
    V: Serialize + DeserializeOwned + Send + 'static,
{
    fn encode(&self, name: &str) -> Result<Option<SlotUpdate>, StateError> {
        if !self.dirty {
            return Ok(None);
        }
        let tail = self
            .map
            .iter()
            .map(|entry| encode_entry(name, &entry))
            .collect::<Result<_, _>>()?;
        Ok(Some(SlotUpdate { keep: 0, tail }))
    }

    fn expires_at(&self) -> Option<i64> {
        self.expires_at.filter(|_| self.dirty)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl<K, V> SlotType for MapSlot<K, V>
where
    K: Serialize + DeserializeOwned + Ord + Send + 'static,
    V: Serialize + DeserializeOwned + Send + 'static,
{
    const KIND: StateKind = StateKind::Map;
    fn decode(name: &str, base: &SlotData) -> Result<Self, StateError> {
        let map = base
            .entries
            .iter()
            .map(|raw| decode_entry::<(K, V)>(name, raw))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            map,
            dirty: false,
            expires_at: None,
        })
    }
}

/// Reads and writes a map state of the current key.
pub struct MapHandle<'a, K, V> {
    pub(crate) slot: &'a mut MapSlot<K, V>,
}

impl<K: Ord, V> MapHandle<'_, K, V> {
    /// The value at `key`.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.slot.map.get(key)
    }

    /// The value at `key`, to change in place: the map is written at commit whether or not it
    /// changes.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.changed();
        self.slot.map.get_mut(key)
    }

    /// Sets `key` to `value`, giving back the value it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.changed();
        self.slot.map.insert(key, value)
    }

    /// Removes `key`, giving back its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let removed = self.slot.map.remove(key);
        if removed.is_some() {
            self.changed();
        }
        removed
    }

    /// The map changed: it is written at commit, and kept for the state's TTL unless
    /// `expire_at` says otherwise after this change (as `ValueHandle::set` does).
    fn changed(&mut self) {
        self.slot.dirty = true;
        self.slot.expires_at = None;
    }

    /// Whether the map has an entry at `key`.
    pub fn contains_key(&self, key: &K) -> bool {
        self.slot.map.contains_key(key)
    }

    /// How many entries the map has.
    pub fn len(&self) -> usize {
        self.slot.map.len()
    }

    /// Whether the map has no entries.
    pub fn is_empty(&self) -> bool {
        self.slot.map.is_empty()
    }

    /// The entries, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.slot.map.iter()
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        if !self.slot.map.is_empty() {
            self.changed();
        }
        self.slot.map.clear();
    }

    /// Keeps the whole map, as this run leaves it, until `at_millis` (epoch milliseconds) rather
    /// than for the state's TTL: for entries that say themselves how long they matter. The
    /// key's state lives at least as long, and reads the map as empty from then on. A change
    /// after it (in this run, for a later record of the batch, or in a later run) that does not
    /// say so again keeps the map for the state's TTL.
    pub fn expire_at(&mut self, at_millis: i64) {
        self.slot.dirty = true;
        self.slot.expires_at = Some(at_millis);
    }
}
