//! The second phase: a key's partials from all its sources (the key itself, and each bucket a
//! producer salted it over) merged into its result, per window. It keeps each source's newest
//! partial (by version) and emits the merge of them all whenever one changes, so a result is the
//! exact aggregate of every record its sources have flushed, whatever the order they arrive in,
//! and a partial delivered again changes nothing and emits nothing.
//!
//! Its input is partitioned by the original key: one writer per key, so emit-then-commit is safe.
//! A window's entry goes once the newest window the key has seen started `keep` later: its
//! partials all came within the allowed lateness and a flush of its close, long before. A key's
//! windows all go once it has had no partial for `keep`, or for `idle` if that is longer, so that
//! a key seen once is not kept for good; a running total is kept (its partials are each source's
//! total so far: without the others' a result would count too little).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use keyway::domain::json::{push_number, push_string};
use keyway::domain::SourceRecord;
use keyway::operator::{SinkDescriptor, StateDescriptor};
use keyway::{Ctx, InvalidInput, KeyedOperator, MapState, ProcessError, Sink};

use crate::aggregate::{Aggregate, Partial};
use crate::partials::{PartialUpdate, ALL};

/// The operator's name: part of its state keys and output ids.
pub const NAME: &str = "aggregate-merge";

/// A key's windows (`ALL` without windows), each with its sources' newest partials.
pub const MERGED: MapState<String, Sources> = MapState::with_shape(
    "merged",
    // Written out, as `partials::OPEN` is.
    "Sources(BTreeMap<String, (i64, Partial { count: u64, sum: Option<Exact>, min: \
     Option<Exact>, max: Option<Exact> })>), Exact as decimal text",
);

/// Results as JSON lines (`result_line`), partitioned by key.
pub const RESULTS: Sink<serde_json::Value> = Sink::new("results");

/// The newest partial of each source of a window: source to (version, partial).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sources(pub BTreeMap<String, (i64, Partial)>);

impl Sources {
    /// Takes `update` if it is newer than what its source sent before; says whether it was.
    pub fn take(&mut self, update: &PartialUpdate) -> bool {
        match self.0.get(&update.source) {
            Some((version, _)) if *version >= update.version => false,
            _ => {
                let newest = (update.version, update.partial.clone());
                self.0.insert(update.source.clone(), newest);
                true
            }
        }
    }

    /// Every source's partial merged.
    pub fn total(&self) -> Result<Partial, crate::exact::ExactError> {
        let mut total = Partial::default();
        for (_, partial) in self.0.values() {
            total.merge(partial)?;
        }
        Ok(total)
    }
}

/// The second phase of keyed aggregation.
#[derive(Clone, Debug)]
pub struct AggregateMerge {
    /// The aggregates each result reports (the count always).
    pub aggregates: Vec<Aggregate>,
    /// How long after a window a newer one's start drops it.
    pub keep: Duration,
    /// How long after its last partial a key's windows go (or after `keep`, if longer): at
    /// least as long as a window's last partial may come after its first, which is the
    /// redelivery window of the merge's stream (`KEYWAY_REDELIVERY_WINDOW_SECONDS`: Lambda gives
    /// a record up within it, and the sources flush within the redelivery grace of each other).
    /// A window dropped sooner would come back with the sources still to come alone, and its
    /// result count too little.
    pub idle: Duration,
}

impl KeyedOperator for AggregateMerge {
    type Input = PartialUpdate;

    fn name(&self) -> &str {
        NAME
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![MERGED.descriptor()]
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        vec![RESULTS.descriptor()]
    }

    fn decode(&self, record: &SourceRecord) -> Result<PartialUpdate, InvalidInput> {
        record.json()
    }

    fn key(&self, input: &PartialUpdate) -> String {
        input.key.clone()
    }

    fn process(&self, ctx: &mut Ctx<'_>, update: PartialUpdate) -> Result<(), ProcessError> {
        let slot = update
            .window_start
            .map_or_else(|| ALL.to_owned(), |s| s.to_string());
        let expires = ctx
            .now_millis()
            .saturating_add(self.keep.max(self.idle).as_millis() as i64);
        let mut merged = ctx.map(&MERGED)?;
        let mut sources = merged.get(&slot).cloned().unwrap_or_default();
        if !sources.take(&update) {
            return Ok(());
        }
        let total = sources
            .total()
            .map_err(|e| InvalidInput::new("data.partial", e.to_string()))?;
        merged.insert(slot, sources);
        if let Some(start) = update.window_start {
            let oldest = start - self.keep.as_millis() as i64;
            let stale: Vec<String> = merged
                .iter()
                .map(|(slot, _)| slot)
                .filter(|slot| slot.parse::<i64>().is_ok_and(|s| s < oldest))
                .cloned()
                .collect();
            for slot in stale {
                merged.remove(&slot);
            }
        }
        if !merged.contains_key(&ALL.to_owned()) {
            merged.expire_at(expires);
        }
        let line = result_line(&update.key, update.window_start, &total, &self.aggregates);
        ctx.emit_json(&RESULTS, update.key, line)
    }
}

/// A result as a JSON line: `{"key": K, "window_start": MS, "count": N, ...}` with the chosen
/// aggregates (the count always), sums, minimums and maximums as exact decimal numbers, and no
/// `window_start` for a running total.
pub fn result_line(
    key: &str,
    window_start: Option<i64>,
    total: &Partial,
    aggregates: &[Aggregate],
) -> String {
    let mut line = String::with_capacity(96);
    line.push_str("{\"key\":");
    push_string(&mut line, key);
    if let Some(start) = window_start {
        line.push_str(",\"window_start\":");
        push_number(&mut line, start);
    }
    line.push_str(",\"count\":");
    push_number(&mut line, total.count);
    for aggregate in aggregates {
        let value = match aggregate {
            Aggregate::Count => continue,
            Aggregate::Sum => total.sum.map(|v| v.to_string()),
            Aggregate::Min => total.min.map(|v| v.to_string()),
            Aggregate::Max => total.max.map(|v| v.to_string()),
            Aggregate::Mean => total
                .mean()
                .map(|m| serde_json::Number::from_f64(m).map_or("null".into(), |n| n.to_string())),
        };
        line.push_str(",\"");
        line.push_str(aggregate.name());
        line.push_str("\":");
        line.push_str(value.as_deref().unwrap_or("null"));
    }
    line.push('}');
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exact::Exact;

    fn update(source: &str, version: i64, values: &[&str]) -> PartialUpdate {
        let mut partial = Partial::default();
        for v in values {
            partial
                .merge(&Partial::of(Some(Exact::parse(v).unwrap())))
                .unwrap();
        }
        PartialUpdate {
            key: "k".into(),
            window_start: Some(60_000),
            source: source.into(),
            version,
            partial,
        }
    }

    #[test]
    fn each_source_counts_with_its_newest_partial_and_an_old_or_repeated_one_changes_nothing() {
        let mut sources = Sources::default();
        assert!(sources.take(&update("k#0", 10, &["1", "2"])));
        assert!(sources.take(&update("k#1", 10, &["5"])));
        assert!(!sources.take(&update("k#0", 10, &["1", "2"])));
        assert!(!sources.take(&update("k#0", 9, &["1"])));
        assert!(sources.take(&update("k#0", 11, &["1", "2", "3.5"])));
        let total = sources.total().unwrap();
        assert_eq!(total.count, 4);
        assert_eq!(total.sum, Some(Exact::parse("11.5").unwrap().into()));
        assert_eq!(total.min, Some(Exact::parse("1").unwrap()));
    }

    #[test]
    fn a_result_line_has_the_key_the_window_the_count_and_the_chosen_aggregates_exactly() {
        let mut total = update("k", 1, &["0.1", "0.2", "-3"]).partial;
        total
            .merge(&Partial::of(Some(Exact::parse("1e2").unwrap())))
            .unwrap();
        let line = result_line(
            "k\"1",
            Some(60_000),
            &total,
            &[
                Aggregate::Sum,
                Aggregate::Min,
                Aggregate::Max,
                Aggregate::Mean,
            ],
        );
        assert_eq!(
            line,
            r#"{"key":"k\"1","window_start":60000,"count":4,"sum":97.3,"min":-3,"max":100,"mean":24.325}"#
        );
        let counted = Partial::of(None);
        assert_eq!(
            result_line("k", None, &counted, &[Aggregate::Count]),
            r#"{"key":"k","count":1}"#
        );
    }
}
