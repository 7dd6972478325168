//! Skew: which keys are hot, and how unevenly load spreads over shards or partitions.
//!
//! `SpaceSaving` finds the heaviest keys of a stream in bounded memory (Metwally, Agrawal and El
//! Abbadi, "Efficient Computation of Frequent and Top-k Elements in Data Streams", 2005): it
//! watches at most `capacity` keys; a key it does not watch takes the place of the lightest one,
//! inheriting its count as the bound of its own error. Every key heavier than `total / capacity`
//! is watched, and each watched key's count is over its true weight by at most its `error`.
//! `coefficient_of_variation` is the spread of per-shard loads the skew alarms watch (above 0.5:
//! one shard carries much more than the others).
//!
//! `HotSet` decides, period after period, which keys are hot enough to salt: a key turns hot in
//! the period it carries at least `heat_share` of the records, and cools only after `cool_periods`
//! periods in a row below `cool_share`. The gap between the two shares and the run of cool periods
//! are hysteresis: a key hovering near one threshold would otherwise be salted and unsalted period
//! after period, and each change moves its state and its records to other partitions.
//! `HeatReport` is what one batch tells the registry that runs a `HotSet` over the whole stream
//! (`adapters::dynamodb::HotKeyRegistry`).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// A watched key: the weight counted for it, and by how much at most that overcounts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heavy<K> {
    /// The watched key.
    pub key: K,
    /// The weight counted for the key: its true weight, plus at most `error`.
    pub count: u64,
    /// How much at most `count` overcounts: the count inherited when the key took its place.
    pub error: u64,
}

impl<K> Heavy<K> {
    /// The weight the key surely has: its count less what it may have inherited.
    pub fn guaranteed(&self) -> u64 {
        self.count - self.error
    }
}

/// The Space-Saving sketch of the heaviest keys.
#[derive(Clone, Debug)]
pub struct SpaceSaving<K> {
    capacity: usize,
    watched: HashMap<K, (u64, u64)>,
    total: u64,
}

impl<K: Clone + Eq + Hash + Ord> SpaceSaving<K> {
    /// A sketch that watches at most `capacity` keys (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            watched: HashMap::with_capacity(capacity.max(1)),
            total: 0,
        }
    }

    /// Counts `weight` more for `key`.
    pub fn offer(&mut self, key: &K, weight: u64) {
        self.total += weight;
        if let Some((count, _)) = self.watched.get_mut(key) {
            *count += weight;
            return;
        }
        if self.watched.len() < self.capacity {
            self.watched.insert(key.clone(), (weight, 0));
            return;
        }
        // The lightest watched key gives its place up; ties go to the smallest key, so that
        // the sketch does not depend on the map's order.
        let (lightest, (min, _)) = self
            .watched
            .iter()
            .min_by(|a, b| (a.1 .0, a.0).cmp(&(b.1 .0, b.0)))
            .map(|(k, v)| (k.clone(), *v))
            .expect("a full sketch watches a key");
        self.watched.remove(&lightest);
        self.watched.insert(key.clone(), (min + weight, min));
    }

    /// Everything offered, watched or not.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The `n` heaviest watched keys, heaviest first (ties by key).
    pub fn top(&self, n: usize) -> Vec<Heavy<K>> {
        let mut heavy: Vec<Heavy<K>> = self
            .watched
            .iter()
            .map(|(key, (count, error))| Heavy {
                key: key.clone(),
                count: *count,
                error: *error,
            })
            .collect();
        heavy.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        heavy.truncate(n);
        heavy
    }

    /// The keys that surely carry at least `share` of everything offered.
    pub fn hot(&self, share: f64) -> Vec<Heavy<K>> {
        let floor = share * self.total as f64;
        self.top(self.capacity)
            .into_iter()
            .filter(|h| h.guaranteed() as f64 >= floor && h.guaranteed() > 0)
            .collect()
    }
}

/// The standard deviation of `loads` over their mean (0 for no load at all): 0 when every shard
/// carries the same, about `sqrt(n - 1)` when one of `n` carries everything.
pub fn coefficient_of_variation(loads: &[f64]) -> f64 {
    if loads.is_empty() {
        return 0.0;
    }
    let n = loads.len() as f64;
    let mean = loads.iter().sum::<f64>() / n;
    if mean == 0.0 {
        return 0.0;
    }
    let variance = loads.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / n;
    variance.sqrt() / mean
}

/// The largest load over the mean (1 when even; 0 for no load at all).
pub fn max_over_mean(loads: &[f64]) -> f64 {
    let mean = loads.iter().sum::<f64>() / loads.len().max(1) as f64;
    if mean == 0.0 {
        return 0.0;
    }
    loads.iter().copied().fold(0.0, f64::max) / mean
}

/// The thresholds of a `HotSet`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hysteresis {
    /// A key carrying at least this share of a period's records turns hot.
    pub heat_share: f64,
    /// A hot key carrying less than this share of a period's records is cool in that period.
    pub cool_share: f64,
    /// Cool periods in a row after which a hot key is no longer hot (at least 1).
    pub cool_periods: u32,
}

impl Default for Hysteresis {
    fn default() -> Self {
        Self {
            heat_share: 0.05,
            cool_share: 0.01,
            cool_periods: 5,
        }
    }
}

/// What one period changed: keys that turned hot and keys that cooled, each in key order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HotChanges<K> {
    /// Keys that turned hot, in key order.
    pub heated: Vec<K>,
    /// Keys that cooled, in key order.
    pub cooled: Vec<K>,
}

impl<K> HotChanges<K> {
    /// True when no key turned hot or cooled.
    pub fn is_empty(&self) -> bool {
        self.heated.is_empty() && self.cooled.is_empty()
    }
}

/// The keys hot at present, with hysteresis (see the module's notes). Deterministic: the same
/// observations give the same changes in the same order.
#[derive(Clone, Debug)]
pub struct HotSet<K> {
    thresholds: Hysteresis,
    /// Each hot key and the cool periods in a row it has had.
    hot: BTreeMap<K, u32>,
}

impl<K: Clone + Ord> HotSet<K> {
    /// A set with no key hot yet, deciding by `thresholds`.
    pub fn new(thresholds: Hysteresis) -> Self {
        Self {
            thresholds,
            hot: BTreeMap::new(),
        }
    }

    /// Takes one period's heaviest keys (a `SpaceSaving` sketch's `top`) and everything the
    /// period carried. A key turns hot on its guaranteed weight and stays warm on its count, so
    /// an estimate's error never heats a key nor cools one too early. A key missing from `heavy`
    /// counts as cool: a sketch of capacity at least `1 / cool_share` watches every key that
    /// carries more than that share. A period with no records at all is cool for every key.
    pub fn observe(&mut self, heavy: &[Heavy<K>], total: u64) -> HotChanges<K> {
        let share = |weight: u64| {
            if total == 0 {
                0.0
            } else {
                weight as f64 / total as f64
            }
        };
        let mut weights: BTreeMap<&K, &Heavy<K>> = BTreeMap::new();
        for h in heavy {
            weights.insert(&h.key, h);
        }
        let mut cooled = Vec::new();
        for (key, cool_run) in self.hot.iter_mut() {
            let count = weights.get(key).map_or(0, |h| h.count);
            if share(count) >= self.thresholds.cool_share {
                *cool_run = 0;
                continue;
            }
            *cool_run += 1;
            if *cool_run >= self.thresholds.cool_periods.max(1) {
                cooled.push(key.clone());
            }
        }
        for key in &cooled {
            self.hot.remove(key);
        }
        let heated: Vec<K> = weights
            .values()
            .filter(|h| h.guaranteed() > 0 && share(h.guaranteed()) >= self.thresholds.heat_share)
            .filter(|h| !self.hot.contains_key(&h.key) && !cooled.contains(&h.key))
            .map(|h| h.key.clone())
            .collect();
        for key in &heated {
            self.hot.insert(key.clone(), 0);
        }
        HotChanges { heated, cooled }
    }

    /// A set carried over from an earlier one: each hot key with the cool periods in a row it
    /// has had (`cool_runs`), as a registry stores them between periods.
    pub fn restore(thresholds: Hysteresis, cool_runs: BTreeMap<K, u32>) -> Self {
        Self {
            thresholds,
            hot: cool_runs,
        }
    }

    /// Each hot key with the cool periods in a row it has had.
    pub fn cool_runs(&self) -> &BTreeMap<K, u32> {
        &self.hot
    }

    /// The keys hot now, in key order.
    pub fn hot(&self) -> impl Iterator<Item = &K> {
        self.hot.keys()
    }

    /// True when `key` is hot now.
    pub fn is_hot(&self, key: &K) -> bool {
        self.hot.contains_key(key)
    }
}

/// What one batch tells the hot-key registry: its records, and the keys that carry at least a
/// share of them, each under the key its producer salts (a bucket counts for its key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeatReport {
    /// When the batch ran, epoch milliseconds: the period it counts in.
    pub at_millis: i64,
    /// The batch, as its shard and first record name it: a retry of the batch reports under the
    /// same name, so that it replaces the first report rather than adding to it.
    pub batch: String,
    /// How many records the batch had.
    pub records: u64,
    /// The keys carrying at least `floor_share` of the batch's records, in key order.
    pub keys: Vec<(String, u64)>,
}

impl HeatReport {
    /// The report of a batch of `records` whose keys carried `counts`. Keys under `floor_share`
    /// of the batch are left out: a key under that share in every batch is under it in the whole
    /// period (the period's share is a weighted mean of the batches'), so the registry still
    /// decides exactly for every threshold at or above `floor_share`.
    pub fn new(
        at_millis: i64,
        batch: String,
        records: u64,
        counts: impl IntoIterator<Item = (String, u64)>,
        floor_share: f64,
    ) -> Self {
        let floor = floor_share * records as f64;
        let mut keys: BTreeMap<String, u64> = BTreeMap::new();
        for (key, n) in counts {
            *keys.entry(key).or_default() += n;
        }
        Self {
            at_millis,
            batch,
            records,
            keys: keys
                .into_iter()
                .filter(|(_, n)| *n as f64 >= floor)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream of `n` keys whose weights follow Zipf(1): key i weighs `scale / (i + 1)`.
    fn zipf(n: u64, scale: u64) -> Vec<(u64, u64)> {
        (0..n).map(|i| (i, scale / (i + 1))).collect()
    }

    #[test]
    fn every_key_heavier_than_the_total_over_the_capacity_is_watched_and_counted_within_its_error()
    {
        let mut sketch = SpaceSaving::new(50);
        let weights = zipf(2_000, 20_000);
        // Interleaved, one unit at a time, as records come.
        let mut left: Vec<(u64, u64)> = weights.clone();
        while left.iter().any(|(_, w)| *w > 0) {
            for (key, weight) in left.iter_mut().filter(|(_, w)| *w > 0) {
                sketch.offer(key, 1);
                *weight -= 1;
            }
        }
        let total: u64 = weights.iter().map(|(_, w)| w).sum();
        assert_eq!(sketch.total(), total);
        let top = sketch.top(50);
        for (key, weight) in &weights {
            let found = top.iter().find(|h| h.key == *key);
            if *weight > total / 50 {
                let found = found.unwrap_or_else(|| panic!("key {key} ({weight}) is not watched"));
                assert!(
                    found.count >= *weight && found.guaranteed() <= *weight,
                    "{found:?}"
                );
            }
        }
        assert_eq!(top[0].key, 0, "the heaviest key leads");
    }

    #[test]
    fn a_key_carrying_most_of_the_stream_is_hot_and_an_even_stream_has_no_hot_key() {
        let mut skewed = SpaceSaving::new(16);
        let mut even = SpaceSaving::new(16);
        for i in 0..10_000u64 {
            let key = if i % 100 == 0 { i } else { 7 };
            skewed.offer(&key, 1);
            even.offer(&(i % 1_000), 1);
        }
        let hot: Vec<u64> = skewed.hot(0.1).into_iter().map(|h| h.key).collect();
        assert_eq!(hot, [7]);
        assert!(even.hot(0.01).is_empty(), "{:?}", even.hot(0.01));
    }

    #[test]
    fn the_spread_of_loads_is_zero_when_even_and_about_root_n_minus_one_when_one_shard_takes_all() {
        assert_eq!(coefficient_of_variation(&[5.0; 8]), 0.0);
        assert_eq!(max_over_mean(&[5.0; 8]), 1.0);
        let one = [8.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        assert!((coefficient_of_variation(&one) - 7f64.sqrt()).abs() < 1e-9);
        assert_eq!(max_over_mean(&one), 8.0);
        assert_eq!(coefficient_of_variation(&[]), 0.0);
        assert_eq!(coefficient_of_variation(&[0.0, 0.0]), 0.0);
    }

    /// One period's sketch of `counts` (key, records), as the runtime would feed it.
    fn period(counts: &[(&str, u64)]) -> (Vec<Heavy<String>>, u64) {
        let mut sketch = SpaceSaving::new(128);
        for (key, n) in counts {
            sketch.offer(&key.to_string(), *n);
        }
        (sketch.top(128), sketch.total())
    }

    fn observe(set: &mut HotSet<String>, counts: &[(&str, u64)]) -> HotChanges<String> {
        let (heavy, total) = period(counts);
        set.observe(&heavy, total)
    }

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn a_key_turns_hot_in_the_period_it_reaches_the_heat_share_and_is_reported_once() {
        let mut set = HotSet::new(Hysteresis::default());
        let changes = observe(&mut set, &[("a", 4), ("b", 96)]);
        assert_eq!(changes.heated, keys(&["b"]), "4% is below 5%");
        let changes = observe(&mut set, &[("a", 4), ("b", 96)]);
        assert!(changes.is_empty(), "{changes:?}");
        let changes = observe(&mut set, &[("c", 10), ("b", 85), ("a", 5)]);
        assert_eq!(changes.heated, keys(&["a", "c"]), "in key order");
        assert_eq!(
            set.hot().cloned().collect::<Vec<_>>(),
            keys(&["a", "b", "c"])
        );
    }

    #[test]
    fn a_hot_key_cools_only_after_the_cool_periods_in_a_row_below_the_cool_share() {
        let thresholds = Hysteresis {
            heat_share: 0.1,
            cool_share: 0.02,
            cool_periods: 3,
        };
        let mut set = HotSet::new(thresholds);
        observe(&mut set, &[("hot", 50), ("rest", 50)]);
        assert!(set.is_hot(&"hot".to_string()));
        // Between the shares: still hot, and the run of cool periods starts again.
        observe(&mut set, &[("hot", 1), ("rest", 99)]);
        observe(&mut set, &[("hot", 1), ("rest", 99)]);
        observe(&mut set, &[("hot", 5), ("rest", 95)]);
        assert!(set.is_hot(&"hot".to_string()), "5% is above the cool share");
        for _ in 0..2 {
            let changes = observe(&mut set, &[("hot", 1), ("rest", 99)]);
            assert!(changes.cooled.is_empty(), "{changes:?}");
        }
        let changes = observe(&mut set, &[("rest", 100)]);
        assert_eq!(changes.cooled, keys(&["hot"]));
        assert!(!set.is_hot(&"hot".to_string()));
        assert!(set.is_hot(&"rest".to_string()));
    }

    #[test]
    fn a_heat_report_adds_a_keys_groups_up_and_leaves_out_keys_under_the_floor() {
        let counts = [("b#1", 3), ("a", 2), ("b", 4), ("c", 1)]
            .map(|(k, n)| (k.split('#').next().unwrap().to_string(), n));
        let report = HeatReport::new(5, "shard/1".into(), 10, counts, 0.2);
        assert_eq!(report.keys, [("a".to_string(), 2), ("b".to_string(), 7)]);
        assert_eq!((report.records, report.at_millis), (10, 5));
    }

    #[test]
    fn an_estimate_error_neither_heats_a_key_nor_cools_one() {
        let thresholds = Hysteresis {
            heat_share: 0.5,
            cool_share: 0.3,
            cool_periods: 1,
        };
        let mut set = HotSet::new(thresholds);
        let inherited = Heavy {
            key: "k".to_string(),
            count: 60,
            error: 20,
        };
        let changes = set.observe(std::slice::from_ref(&inherited), 100);
        assert!(changes.heated.is_empty(), "only 40 are certain");
        let certain = Heavy {
            error: 0,
            ..inherited.clone()
        };
        assert_eq!(set.observe(&[certain], 100).heated, keys(&["k"]));
        let changes = set.observe(
            &[Heavy {
                count: 35,
                ..inherited
            }],
            100,
        );
        assert!(
            changes.cooled.is_empty(),
            "its count may be 35% of the period"
        );
        assert_eq!(
            set.observe(&[], 0).cooled,
            keys(&["k"]),
            "an empty period is cool"
        );
    }
}
