//! The CDC join: two tables' changes, decomposed into deletes and inserts by the runtime's
//! changelog model (`keyway::domain::changelog`) and re-keyed by join key, joined per join key
//! into a joined changelog whose inserts and deletes keep a view equal to the join of the current
//! source rows.
//!
//! `spec` says which columns join and how; `join` holds the rows of both sides under one join key
//! and says what each change does to the join. The functions that run them on the stack come next
//! (re-key by join key, then the join with its view table).

pub mod join;
pub mod spec;
