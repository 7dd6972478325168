//! What the CDC join's tests read back: the rows each operator keeps in the state table, and the
//! view a consumer of the joined changelog folds from it.

use std::collections::BTreeMap;

use cdc_join::join::{Joined, JoinedId, Stamped};
use cdc_join::view::View;
use keyway::domain::Item;
use serde_json::Value;

/// Rows `operator` keeps in the state table's `items`: the entries of its slots named `slots`
/// (inlined in each key's head: the tests' keys hold few rows).
pub fn state_rows(items: &[Item], operator: &str, slots: &[&str]) -> usize {
    let heads = items.iter().filter(|i| {
        i["sk"].as_s() == Some("head")
            && i["pk"]
                .as_s()
                .is_some_and(|pk| pk.starts_with(&format!("{operator}#")))
    });
    heads
        .map(|i| {
            let doc: Value = serde_json::from_str(i["doc"].as_s().unwrap()).unwrap();
            slots
                .iter()
                .map(|s| {
                    assert!(
                        doc["slots"][s].get("seg").is_none(),
                        "small enough to inline"
                    );
                    doc["slots"][s]["e"].as_array().map_or(0, Vec::len)
                })
                .sum::<usize>()
        })
        .sum()
}

/// The joined changelog folded into a view: what a consumer of it ends with.
pub fn folded(joined: &[Stamped]) -> BTreeMap<JoinedId, Joined> {
    let mut view = View::default();
    for stamped in joined {
        view.apply(stamped.clone());
    }
    view.rows().map(|j| (j.id(), j.clone())).collect()
}
