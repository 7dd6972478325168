//! The adaptive strategy's detector: at the end of each simulated second it feeds that second's
//! Space-Saving sketch to a `HotSet` (`keyway::domain::skew`), and the keys the set reports hot
//! are salted from the next second on, until they cool (hysteresis: `--heat-share`,
//! `--cool-share`, `--cool-seconds`). It keeps when each key turned hot and cooled, for the
//! report.

use keyway::domain::salt::Salting;
use keyway::domain::skew::{HotSet, Hysteresis, SpaceSaving};
use serde::Serialize;

use super::source::Event;

/// A key the adaptive strategy salted: the second it was found hot in (with its share of that
/// second), and when it cooled.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Episode {
    pub key: String,
    pub hot_in_second: usize,
    pub share: f64,
    pub salted_from_second: usize,
    pub cooled_in_second: Option<usize>,
    pub unsalted_from_second: Option<usize>,
}

/// The adaptive strategy's detector: a sketch of the current second and the hot set.
pub(super) struct Adaptive {
    hot: HotSet<String>,
    capacity: usize,
    sketch: SpaceSaving<String>,
    episodes: Vec<Episode>,
}

impl Adaptive {
    pub(super) fn new(thresholds: Hysteresis) -> Self {
        // Capacity 2 / cool share: every key above the cool share is watched (`HotSet`).
        let capacity = ((2.0 / thresholds.cool_share).ceil() as usize).clamp(64, 10_000);
        Self {
            hot: HotSet::new(thresholds),
            capacity,
            sketch: SpaceSaving::new(capacity),
            episodes: Vec::new(),
        }
    }

    /// Ends `second`: the salting from the next second on, when the hot keys changed.
    pub(super) fn close(&mut self, second: usize, buckets: u32) -> Option<Salting> {
        let sketch = std::mem::replace(&mut self.sketch, SpaceSaving::new(self.capacity));
        let heavy = sketch.top(self.capacity);
        let changes = self.hot.observe(&heavy, sketch.total());
        for key in &changes.heated {
            let weight = heavy
                .iter()
                .find(|h| &h.key == key)
                .map_or(0, |h| h.guaranteed());
            self.episodes.push(Episode {
                key: key.clone(),
                hot_in_second: second,
                share: weight as f64 / sketch.total().max(1) as f64,
                salted_from_second: second + 1,
                cooled_in_second: None,
                unsalted_from_second: None,
            });
        }
        for key in &changes.cooled {
            let open = self.episodes.iter_mut().rev().find(|e| &e.key == key);
            if let Some(episode) = open {
                episode.cooled_in_second = Some(second);
                episode.unsalted_from_second = Some(second + 1);
            }
        }
        (!changes.is_empty()).then(|| Salting::Listed {
            hot: self.hot.hot().cloned().collect(),
            buckets,
        })
    }

    /// Counts `event` in the current second.
    pub(super) fn offer(&mut self, event: &Event) {
        self.sketch.offer(&event.key, 1);
    }

    /// Ends the last second too, whose findings say what the next second would salt, and gives
    /// the keys salted over the run.
    pub(super) fn finish(mut self, second: usize, buckets: u32) -> Vec<Episode> {
        self.close(second, buckets);
        self.episodes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skew::route::route;
    use crate::skew::testing::{events, settings};
    use crate::skew::{Settings, Strategy};

    #[test]
    fn adaptive_salts_a_key_from_the_second_after_it_turns_hot_and_unsalts_it_once_cool() {
        let s = Settings {
            rate: 1_000,
            ..settings(8)
        };
        let mut workload = events(&["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"], 3_000);
        workload.extend(events(&["hot"], 2_000));
        workload.extend(events(
            &["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"],
            3_000,
        ));
        let thresholds = Hysteresis {
            heat_share: 0.5,
            cool_share: 0.01,
            cool_periods: 2,
        };
        let (routed, episodes) = route(&workload, &Strategy::Adaptive(thresholds), &s);
        assert_eq!(episodes.len(), 1, "{episodes:?}");
        let e = &episodes[0];
        assert_eq!(
            (e.key.as_str(), e.hot_in_second, e.salted_from_second),
            ("hot", 3, 4)
        );
        assert_eq!(
            (e.cooled_in_second, e.unsalted_from_second),
            (Some(6), Some(7))
        );
        assert_eq!(routed[3_000].partition_key, "hot");
        assert!(routed[4_000].partition_key.starts_with("hot#"));
        // Every key of the first seconds carries 10%, below the heat share of 50%.
        assert!(routed[..3_000]
            .iter()
            .all(|r| !r.partition_key.contains('#')));
    }
}
