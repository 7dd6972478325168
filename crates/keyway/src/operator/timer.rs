//! Keyed timers (Flink's `TimerService` of a keyed process function): `process` sets a timer of
//! its key with `Ctx::timer_at`, and the operator's `on_timer` runs once for it, with the key's
//! state, when its time has come, even if the key receives nothing more.
//!
//! A key's pending timers are part of its state (the `keyway.timers` slot, declared by listing
//! `timers()` in `states()`), committed with it under the same condition: firing a timer removes
//! it in the commit that applies what `on_timer` did, so a timer fires exactly once however often
//! its firing is retried. Which timers are due is found in a due-time index the state store keeps
//! beside the state (`StateStore::schedule_timers`): an index entry is written before the commit
//! that sets its timer, and is only a hint — a timer that is no longer in its key's state when the
//! entry comes due (cancelled, fired, or its commit lost) is skipped.

use std::collections::{BTreeMap, BTreeSet};

use super::state::{StateDescriptor, ValueState};
use crate::domain::SlotData;

/// The slot holding a key's pending timers (epoch milliseconds).
pub(crate) const TIMERS: ValueState<BTreeSet<i64>> = ValueState::new("keyway.timers");

/// The state an operator that sets timers lists in its `states()`.
pub fn timers() -> StateDescriptor {
    TIMERS.descriptor()
}

/// The pending timers of stored slots (none when the slot is absent or does not decode: timers
/// that cannot be read cannot fire, and the key's next commit rewrites the slot).
pub(crate) fn pending_in(slots: &BTreeMap<String, SlotData>) -> BTreeSet<i64> {
    slots
        .get(TIMERS.name)
        .and_then(|slot| slot.entries.first())
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
        .unwrap_or_default()
}

/// Takes the timer at `at_millis` off stored slots, as a firing does; says whether it was
/// pending. For a firing dead-lettered outside `on_timer`'s run (its commit refused), whose
/// state is written as loaded.
pub(crate) fn take_stored(slots: &mut BTreeMap<String, SlotData>, at_millis: i64) -> bool {
    let mut pending = pending_in(slots);
    if !pending.remove(&at_millis) {
        return false;
    }
    if pending.is_empty() {
        slots.remove(TIMERS.name);
        return true;
    }
    let text = serde_json::to_string(&pending).expect("a set of integers serializes");
    let raw = serde_json::value::RawValue::from_string(text).expect("JSON text");
    slots.insert(TIMERS.name.to_owned(), SlotData::fresh(vec![raw]));
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    #[test]
    fn pending_timers_are_read_from_the_timer_slot_and_absent_or_unreadable_ones_are_none() {
        let mut slots = BTreeMap::new();
        assert!(pending_in(&slots).is_empty());
        slots.insert(
            TIMERS.name.to_owned(),
            SlotData::loaded(vec![RawValue::from_string("[5,70]".into()).unwrap()]),
        );
        assert_eq!(pending_in(&slots), BTreeSet::from([5, 70]));
        slots.insert(
            TIMERS.name.to_owned(),
            SlotData::loaded(vec![RawValue::from_string("\"x\"".into()).unwrap()]),
        );
        assert!(pending_in(&slots).is_empty());
    }
}
