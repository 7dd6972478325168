//! The CDC join: two tables' changes, decomposed into deletes and inserts by the runtime's
//! changelog model (`keyway::domain::changelog`) and re-keyed by join key, joined per join key
//! into a joined changelog whose inserts and deletes keep a view equal to the join of the current
//! source rows.
//!
//! `spec` says which columns join and how, and `filter` which rows take part; `join` holds the rows of both sides under one join key
//! and says what each change does to the join, stamped so that `view` builds the join of the
//! current rows from changes that reach it in any order between join keys. Two operators run
//! them: `rekey` (Debezium events by primary key to steps by join key) and `joiner` (steps to
//! stamped joined changes), whose view sink `view_table` keeps the view in DynamoDB; `wiring`
//! makes each a Lambda handler from its environment (the binaries in `src/bin`); `truncate` removes a truncated table's rows. `oracle` joins the
//! tables as their changes leave them: what the view must equal.

// Functions of one step each: clippy.toml sets the threshold (tests, which read as scenarios,
// are left out).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod filter;
pub mod join;
pub mod joiner;
pub mod oracle;
pub mod rekey;
pub mod spec;
pub mod truncate;
pub mod view;
pub mod view_table;
pub mod wiring;
