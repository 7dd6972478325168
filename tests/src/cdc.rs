//! What the CDC join's tests read back: the rows each operator keeps in the state table, and the
//! view a consumer of the joined changelog folds from it.

use std::collections::BTreeMap;

use cdc_join::join::{Joined, JoinedId, Stamped};
use cdc_join::view::View;

pub use keyway_stack::cdc::state_rows;

/// The joined changelog folded into a view: what a consumer of it ends with.
pub fn folded(joined: &[Stamped]) -> BTreeMap<JoinedId, Joined> {
    let mut view = View::default();
    for stamped in joined {
        view.apply(stamped.clone());
    }
    view.rows().map(|j| (j.id(), j.clone())).collect()
}
