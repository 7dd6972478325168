//! `Ctx`: what `process` sees of the current key — its state, the record, time — and how it emits.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::broadcast::{BroadcastSnapshot, BROADCAST_KEY};
use super::state::BroadcastState;
use super::state::{ListSlot, MapSlot, SlotType, TypedSlot, ValueSlot};
use super::timer::TIMERS;
use super::{
    InvalidInput, ListHandle, ListState, MapHandle, MapState, ProcessError, Sink, StateDescriptor,
    StateError, ValueHandle, ValueState,
};
use crate::domain::{KeyState, Origin, Output, OutputId, SequenceNumber, SlotData, SourceRecord};

static EMPTY_SLOT: SlotData = SlotData {
    entries: Vec::new(),
    kept: 0,
};

/// The context of one `process` call.
pub struct Ctx<'a> {
    pub(crate) key: &'a str,
    /// The operator's name: part of every output id.
    pub(crate) operator: &'a str,
    pub(crate) record: &'a SourceRecord,
    pub(crate) now_millis: i64,
    pub(crate) deadline_millis: Option<i64>,
    pub(crate) declared: &'a [StateDescriptor],
    pub(crate) base: &'a KeyState,
    pub(crate) slots: &'a mut BTreeMap<&'static str, Box<dyn TypedSlot>>,
    pub(crate) outputs: &'a mut Vec<Output>,
    /// Declared sink name to the largest body it accepts.
    pub(crate) sinks: &'a HashMap<String, usize>,
    /// The operator's broadcast states as the batch loaded them, if it declares any.
    pub(crate) broadcast: Option<&'a BroadcastSnapshot>,
    /// The key's state was not read: the operator answers its records without it
    /// (`KeyedOperator::answer_without_state`), and any state it touches is refused.
    pub(crate) without_state: bool,
    /// The operator delivers through an outbox: without its state a key can store none, and may
    /// emit settled outputs only.
    pub(crate) outbox: bool,
}

impl<'a> Ctx<'a> {
    /// The key being processed.
    pub fn key(&self) -> &str {
        self.key
    }

    /// The record being processed.
    pub fn record(&self) -> &SourceRecord {
        self.record
    }

    /// Whether outputs an earlier invocation committed to the key's outbox are still to go out
    /// (this invocation sends them before the key's new outputs). An operator that keeps facts
    /// of a key in memory to answer it without its state (`answer_without_state`) keeps none of
    /// a key whose outbox is pending: answered without its state, the key's new outputs would
    /// overtake them.
    pub fn outbox_pending(&self) -> bool {
        !self.base.outbox.is_empty()
    }

    /// When the key's state `name`, as loaded, goes (epoch milliseconds): at the state's own time
    /// (its TTL, or `set_expiring`) or the key's (`state_ttl` after its last commit), whichever
    /// comes first; `None` when it is kept. A later commit may keep it longer, never shorter: an
    /// operator that remembers a state in memory forgets it by then.
    pub fn loaded_expiry(&self, name: &str) -> Option<i64> {
        crate::executor::expiry::of(self.base, name).map(|secs| secs.saturating_mul(1000))
    }

    /// The invocation's time (epoch milliseconds): the same for every record of a batch, so a
    /// replay of the batch computes the same results.
    pub fn now_millis(&self) -> i64 {
        self.now_millis
    }

    /// The invocation's deadline (epoch milliseconds), when it has one: what it does is
    /// committed by then or not at all. A batch that read the clock at `now_millis` may still
    /// commit until its deadline, after a timer of a time past its clock fired: an operator
    /// whose timer closes what records add to sets it past the deadlines of batches that read
    /// the clock before (as `keyed-aggregate`'s windows do).
    pub fn deadline_millis(&self) -> Option<i64> {
        self.deadline_millis
    }

    /// The current key's value state `state`, decoded on first use in the batch.
    pub fn value<T>(&mut self, state: &ValueState<T>) -> Result<ValueHandle<'_, T>, StateError>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let slot = self.slot::<ValueSlot<T>>(state.name, std::any::type_name::<T>())?;
        Ok(ValueHandle { slot })
    }

    /// The current key's list state `state`; its stored elements are decoded only once something
    /// reads them.
    pub fn list<T>(&mut self, state: &ListState<T>) -> Result<ListHandle<'_, T>, StateError>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        if self.without_state {
            return Err(StateError::NotLoaded {
                slot: state.name.to_owned(),
            });
        }
        let base = self.base.slots.get(state.name).unwrap_or(&EMPTY_SLOT);
        let slot = Self::typed::<ListSlot<T>>(
            self.slots,
            self.declared,
            base,
            state.name,
            std::any::type_name::<T>(),
        )?;
        Ok(ListHandle {
            name: state.name,
            base,
            slot,
        })
    }

    /// The current key's map state `state`, decoded on first use in the batch.
    pub fn map<K, V>(&mut self, state: &MapState<K, V>) -> Result<MapHandle<'_, K, V>, StateError>
    where
        K: Serialize + DeserializeOwned + Ord + Send + 'static,
        V: Serialize + DeserializeOwned + Send + 'static,
    {
        let slot =
            self.slot::<MapSlot<K, V>>(state.name, std::any::type_name::<BTreeMap<K, V>>())?;
        Ok(MapHandle { slot })
    }

    /// The operator's broadcast state `state` as this batch loaded it; `None` while it was never
    /// written.
    pub fn broadcast<T>(&self, state: &BroadcastState<T>) -> Result<Option<Arc<T>>, StateError>
    where
        T: DeserializeOwned + Send + Sync + 'static,
    {
        if self.without_state {
            return Err(StateError::NotLoaded {
                slot: state.name.to_owned(),
            });
        }
        match self.broadcast {
            Some(snapshot) => snapshot.get(state),
            None => Err(StateError::Undeclared {
                slot: state.name.to_owned(),
            }),
        }
    }

    /// Writes the broadcast state `state`: only records keyed to `BROADCAST_KEY` may.
    pub fn broadcast_mut<T>(
        &mut self,
        state: &BroadcastState<T>,
    ) -> Result<ValueHandle<'_, T>, StateError>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        if self.key != BROADCAST_KEY {
            return Err(StateError::BroadcastFromKey {
                slot: state.name.to_owned(),
                key: self.key.to_owned(),
            });
        }
        self.value(&state.slot())
    }

    /// Sets a timer of the current key at `at_millis` (epoch milliseconds): the operator's
    /// `on_timer` runs for it once, when that time has come. Setting a timer already set does
    /// nothing; a time already past fires at the next sweep. The operator lists `timers()` in its
    /// `states()`.
    pub fn timer_at(&mut self, at_millis: i64) -> Result<(), ProcessError> {
        if at_millis < 0 {
            return Err(ProcessError::Invalid(InvalidInput::new(
                "timer",
                format!("{at_millis} is before 1970"),
            )));
        }
        let mut timers = self.timers()?;
        if !timers.get().is_some_and(|t| t.contains(&at_millis)) {
            timers.get_or_insert_with(BTreeSet::new).insert(at_millis);
        }
        Ok(())
    }

    /// Cancels the current key's timer at `at_millis`; says whether one was set.
    pub fn cancel_timer(&mut self, at_millis: i64) -> Result<bool, ProcessError> {
        let mut timers = self.timers()?;
        if !timers.get().is_some_and(|t| t.contains(&at_millis)) {
            return Ok(false);
        }
        let set = timers.get_mut().expect("checked above");
        set.remove(&at_millis);
        if set.is_empty() {
            timers.clear();
        }
        Ok(true)
    }

    /// The current key's pending timers, earliest first.
    pub fn pending_timers(&mut self) -> Result<Vec<i64>, ProcessError> {
        Ok(self
            .timers()?
            .get()
            .map(|t| t.iter().copied().collect())
            .unwrap_or_default())
    }

    /// Removes the key's timer at `at_millis` if it is pending, to fire it; false when it is not
    /// (fired or cancelled already, or timers are not declared any more).
    pub(crate) fn take_timer(&mut self, at_millis: i64) -> Result<bool, ProcessError> {
        if !self.declared.iter().any(|d| d.name == TIMERS.name) {
            return Ok(false);
        }
        self.cancel_timer(at_millis)
    }

    fn timers(&mut self) -> Result<ValueHandle<'_, BTreeSet<i64>>, ProcessError> {
        self.value(&TIMERS).map_err(|e| match e {
            StateError::Undeclared { .. } => ProcessError::Invalid(InvalidInput::new(
                format!("state.{}", TIMERS.name),
                "timers are not declared: list keyway::operator::timers() in the operator's states()",
            )),
            other => other.into(),
        })
    }

    /// The most bytes an output's body to `sink` may have (0 for a sink the operator does not
    /// declare): an operator that holds records to emit later checks they will fit while it can
    /// still refuse them, not when releasing them, where one too large would stop the others.
    /// An outbox operator's outputs that are not settled are measured as stored, their bodies
    /// escaped (`stored_bytes`).
    pub fn output_limit<T>(&self, sink: &Sink<T>) -> usize {
        self.sinks.get(sink.name).copied().unwrap_or(0)
    }

    /// Emits `body` as JSON to `sink`, in order with the key's other outputs.
    pub fn emit<T: Serialize>(
        &mut self,
        sink: &Sink<T>,
        partition_key: impl Into<String>,
        body: &T,
    ) -> Result<(), ProcessError> {
        let text = self.encode(sink, body)?;
        self.push(sink.name, partition_key.into(), text)
    }

    /// Emits `json`, the JSON of a `T` serialized by the caller: for hot paths that write a
    /// borrowed form of `T` rather than build one.
    pub fn emit_json<T>(
        &mut self,
        sink: &Sink<T>,
        partition_key: impl Into<String>,
        json: String,
    ) -> Result<(), ProcessError> {
        self.push(sink.name, partition_key.into(), json)
    }

    /// The id of the `index`-th output to `sink` answering the record at `sequence` of `origin`:
    /// what `emit_for` sends it under, for a body that carries its own id (a Kinesis record has no
    /// attributes to carry it in).
    pub fn output_id_for<T>(
        &self,
        sink: &Sink<T>,
        origin: &Origin,
        sequence: &SequenceNumber,
        index: u32,
    ) -> OutputId {
        OutputId::derive(self.operator, sink.name, origin, sequence, index)
    }

    /// Emits `body` to `sink` as the `index`-th output answering an earlier record of the key (at
    /// `sequence` of `origin`) rather than the one being processed. A record that waited in state
    /// until another record or a timer released it keeps the id it would have had going out at
    /// once: one id per input record, whatever the arrival order, retry or replay. An operator
    /// sends a sink's outputs either all with `emit_for` or all with `emit`, so ids never meet.
    /// The order it emits them in must still be the same at every attempt (see
    /// `crate::operator` on determinism).
    pub fn emit_for<T: Serialize>(
        &mut self,
        sink: &Sink<T>,
        (origin, sequence): (&Origin, &SequenceNumber),
        index: u32,
        partition_key: impl Into<String>,
        body: &T,
    ) -> Result<(), ProcessError> {
        let at = (origin, sequence);
        self.emit_answering(sink, at, index, partition_key.into(), body, false)
    }

    /// Emits as `emit_for` does an output that no retry can change: computed only from the
    /// record it answers and from facts that never change once written (an access key's
    /// identity), so that any invocation that recomputes it, on any state, sends the same body or
    /// nothing. An outbox operator sends it before its commit, as an emit-then-commit operator
    /// does, instead of storing it with the state: a write saved. It may go out before outputs
    /// the key emitted earlier through the outbox. Anything computed from state that changes
    /// (what waits in a buffer, whether a timer fired first) is not settled. It must still fit
    /// the state store as an outbox output does: a key run again after losing a commit race
    /// stores what it recomputes.
    pub fn emit_settled_for<T: Serialize>(
        &mut self,
        sink: &Sink<T>,
        (origin, sequence): (&Origin, &SequenceNumber),
        index: u32,
        partition_key: impl Into<String>,
        body: &T,
    ) -> Result<(), ProcessError> {
        let at = (origin, sequence);
        self.emit_answering(sink, at, index, partition_key.into(), body, true)
    }

    fn emit_answering<T: Serialize>(
        &mut self,
        sink: &Sink<T>,
        (origin, sequence): (&Origin, &SequenceNumber),
        index: u32,
        partition_key: String,
        body: &T,
        settled: bool,
    ) -> Result<(), ProcessError> {
        let text = self.encode(sink, body)?;
        let id = self.output_id_for(sink, origin, sequence, index);
        self.push_with_id(sink.name, id, partition_key, text, settled)
    }

    fn encode<T: Serialize>(&self, sink: &Sink<T>, body: &T) -> Result<String, ProcessError> {
        serde_json::to_string(body).map_err(|e| {
            ProcessError::Invalid(InvalidInput::new(
                format!("output.{}", sink.name),
                e.to_string(),
            ))
        })
    }

    fn push(
        &mut self,
        sink: &str,
        partition_key: String,
        body: String,
    ) -> Result<(), ProcessError> {
        let index = u32::try_from(self.outputs.len()).expect("fewer than 2^32 outputs per record");
        let id = OutputId::derive(
            self.operator,
            sink,
            &self.record.origin,
            &self.record.sequence,
            index,
        );
        self.push_with_id(sink, id, partition_key, body, false)
    }

    fn push_with_id(
        &mut self,
        sink: &str,
        id: OutputId,
        partition_key: String,
        body: String,
        settled: bool,
    ) -> Result<(), ProcessError> {
        if self.without_state && self.outbox && !settled {
            // It would have to be stored in the outbox of a state that was not read.
            return Err(ProcessError::Invalid(InvalidInput::new(
                format!("output.{sink}"),
                "an output that is not settled, from a key the operator answered without its \
                 state (answer_without_state)",
            )));
        }
        let Some(&limit) = self.sinks.get(sink) else {
            // A sink constant missing from the operator's sinks(): a programming error, which no
            // retry fixes, dead-lettered like an undeclared state (`From<StateError>`). Declared
            // sinks are checked against the wired ones when the executor is built.
            return Err(ProcessError::Invalid(InvalidInput::new(
                format!("output.{sink}"),
                format!("sink {sink:?} is not declared in the operator's sinks()"),
            )));
        };
        let body = crate::domain::json::escape_noncharacters(body);
        // An output stored in the outbox is stored as JSON text, its body escaped: quotes and
        // backslashes take a byte more there, and a body full of them (a policy document's JSON
        // in a string) fits the sink but not the state store.
        let stored = self.outbox && !settled;
        let bytes = if stored {
            stored_bytes(&body)
        } else {
            body.len()
        };
        if bytes > limit {
            let counted = if stored { " as stored, escaped" } else { "" };
            return Err(ProcessError::Invalid(InvalidInput::new(
                format!("output.{sink}"),
                format!("{bytes} bytes{counted} is more than the sink accepts ({limit} bytes)"),
            )));
        }
        self.outputs.push(Output {
            id,
            sink: sink.to_owned(),
            partition_key,
            body,
            settled,
        });
        Ok(())
    }

    fn slot<S: SlotType>(
        &mut self,
        name: &'static str,
        type_name: &str,
    ) -> Result<&mut S, StateError> {
        if self.without_state {
            return Err(StateError::NotLoaded {
                slot: name.to_owned(),
            });
        }
        let base = self.base.slots.get(name).unwrap_or(&EMPTY_SLOT);
        Self::typed::<S>(self.slots, self.declared, base, name, type_name)
    }

    /// The typed slot `name`, decoded from `base` on first use. Separate from `self` so that a
    /// handle can hold the slot and the base at once.
    fn typed<'s, S: SlotType>(
        slots: &'s mut BTreeMap<&'static str, Box<dyn TypedSlot>>,
        declared: &[StateDescriptor],
        base: &SlotData,
        name: &'static str,
        type_name: &str,
    ) -> Result<&'s mut S, StateError> {
        let descriptor =
            declared
                .iter()
                .find(|d| d.name == name)
                .ok_or_else(|| StateError::Undeclared {
                    slot: name.to_owned(),
                })?;
        if descriptor.kind != S::KIND || descriptor.type_name != type_name {
            return Err(StateError::KindMismatch {
                slot: name.to_owned(),
                declared: format!("{} of {}", descriptor.kind.as_str(), descriptor.type_name),
                used: format!("{} of {type_name}", S::KIND.as_str()),
            });
        }
        if !slots.contains_key(name) {
            slots.insert(name, Box::new(S::decode(name, base)?));
        }
        let slot = slots.get_mut(name).expect("inserted above");
        Ok(slot
            .as_any_mut()
            .downcast_mut::<S>()
            .expect("declared kind and type checked above"))
    }
}

/// The bytes `body` takes escaped in a JSON string, as an outbox stores it (or a head a key),
/// without its quotes: a byte more for each quote and backslash, five more for a control
/// character (at most: JSON writes some in two), which JSON text holds none of.
pub fn stored_bytes(body: &str) -> usize {
    escaped_len(body.as_bytes())
}

/// `stored_bytes` of `value`'s JSON text, counted as it is written rather than written out: for
/// an operator checking a large value it holds before it emits it.
pub fn stored_json_bytes<T: Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += escaped_len(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        // No value it could not write fits anywhere.
        Err(_) => usize::MAX,
    }
}

/// A byte more for each quote and backslash, five more for a control character.
fn escaped_len(text: &[u8]) -> usize {
    text.len()
        + text
            .iter()
            .map(|&b| match b {
                b'"' | b'\\' => 1,
                0..=0x1f => 5,
                _ => 0,
            })
            .sum::<usize>()
}
