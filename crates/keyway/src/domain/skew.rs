//! Skew: which keys are hot, and how unevenly load spreads over shards or partitions.
//!
//! `SpaceSaving` finds the heaviest keys of a stream in bounded memory (Metwally, Agrawal and El
//! Abbadi, "Efficient Computation of Frequent and Top-k Elements in Data Streams", 2005): it
//! watches at most `capacity` keys; a key it does not watch takes the place of the lightest one,
//! inheriting its count as the bound of its own error. Every key heavier than `total / capacity`
//! is watched, and each watched key's count is over its true weight by at most its `error`.
//! `coefficient_of_variation` is the spread of per-shard loads the skew alarms watch (above 0.5:
//! one shard carries much more than the others).

use std::collections::HashMap;
use std::hash::Hash;

/// A watched key: the weight counted for it, and by how much at most that overcounts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heavy<K> {
    pub key: K,
    pub count: u64,
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
}
