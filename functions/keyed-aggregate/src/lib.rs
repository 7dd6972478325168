//! Keyed aggregation: count, sum, minimum, maximum and mean per key over any JSON stream (key,
//! value and event time found by JSON pointer), as running totals or in tumbling event-time
//! windows with allowed lateness, exactly, whichever keys a producer salts.
//!
//! `spec` says what to aggregate and reads a record; `exact` and `aggregate` hold the arithmetic
//! (decimals summed without rounding, partials that merge in any order); two operators run it:
//! `partials` aggregates each key, or each bucket of a salted key, and sends partials on the
//! key's timers; `merge` keeps each source's newest partial per key and window and emits their
//! merge as the key's result. `wiring` makes each a Lambda handler from its environment (the
//! binaries in `src/bin`).

// Functions of one step each: clippy.toml sets the threshold (tests, which read as scenarios,
// are left out).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod aggregate;
pub mod exact;
pub mod merge;
pub mod partials;
pub mod spec;
pub mod wiring;
