//! The producer's side: each event's partition key, under a strategy, and the shard it goes to.
//!
//! Events arrive evenly at `--rate` a second, so a run spans `ceil(events / rate)` simulated
//! seconds; a record's bytes are its data plus its partition key, as Kinesis counts them. A key's
//! own partition key goes to the shard whose hash key range holds its MD5
//! (`kinesis_shard_index`). Salted buckets are placed by `--placement`: `spread` (the default)
//! sets each bucket's ExplicitHashKey to the one `Partitioner::route` gives with it
//! (`keyway::domain::salt::bucket_hash_key`: the middle of the bucket's own slice of `buckets`
//! even slices of the hash key space, so 32 buckets on 8 evenly split shards are exactly 4 a
//! shard); `md5` hashes `key#i` like any key, and 32 random draws over 8 shards are far from even
//! (some shard gets twice its share).

use keyway::domain::hash::{kinesis_shard_index, shard_for_hash};
use keyway::domain::salt::Partitioner;

use super::adaptive::{Adaptive, Episode};
use super::source::Event;
use super::{Placement, Settings, Strategy};

/// The simulated second event `index` arrives in.
fn second_of(index: usize, rate: u64) -> usize {
    (index as u64 / rate) as usize
}

/// Simulated seconds `events` events span at `rate` a second (at least one).
pub(super) fn seconds_of(events: usize, rate: u64) -> usize {
    (events as u64).div_ceil(rate).max(1) as usize
}

/// The shard a record goes to: the one its explicit hash key names, when it has one and salted
/// buckets are spread by hash key, else the one the MD5 of its partition key names.
fn shard_of(partition_key: &str, hash_key: Option<u128>, settings: &Settings) -> u32 {
    match hash_key {
        Some(hash) if settings.placement == Placement::Spread => {
            shard_for_hash(hash, settings.shards)
        }
        _ => kinesis_shard_index(partition_key, settings.shards),
    }
}

/// An event as a strategy sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Routed {
    pub second: usize,
    pub shard: u32,
    pub partition_key: String,
    pub bytes: u64,
}

/// Each event's partition key and shard under `strategy`, and the adaptive strategy's episodes.
pub(super) fn route(
    events: &[Event],
    strategy: &Strategy,
    settings: &Settings,
) -> (Vec<Routed>, Vec<Episode>) {
    let mut partitioner = Partitioner::new(strategy.salting(settings.buckets));
    let mut adaptive = match strategy {
        Strategy::Adaptive(thresholds) => Some(Adaptive::new(*thresholds)),
        _ => None,
    };
    let mut routed = Vec::with_capacity(events.len());
    let mut open_second = 0;
    for (index, event) in events.iter().enumerate() {
        let second = second_of(index, settings.rate);
        if let Some(detector) = adaptive.as_mut() {
            for ended in open_second..second {
                if let Some(salting) = detector.close(ended, settings.buckets) {
                    partitioner.set_salting(salting);
                }
            }
            open_second = second;
            detector.offer(event);
        }
        let (partition_key, hash_key) = partitioner.route(&event.key);
        let shard = shard_of(&partition_key, hash_key, settings);
        routed.push(Routed {
            second,
            shard,
            bytes: event.bytes + partition_key.len() as u64,
            partition_key,
        });
    }
    let episodes = adaptive.map_or_else(Vec::new, |detector| {
        detector.finish(open_second, settings.buckets)
    });
    (routed, episodes)
}

#[cfg(test)]
mod tests {
    use keyway::domain::salt::{bucket_hash_key, unsalt};

    use super::*;
    use crate::skew::testing::{events, settings};

    #[test]
    fn a_salted_record_goes_where_its_buckets_hash_key_or_with_md5_its_partition_key_puts_it() {
        let spread = settings(8);
        let md5 = Settings {
            placement: Placement::Md5,
            ..spread
        };
        let workload = events(&["hot", "cold"], 64);
        for s in [spread, md5] {
            let (routed, _) = route(&workload, &Strategy::Sidetrack(["hot".into()].into()), &s);
            for r in &routed {
                let expected = match unsalt(&r.partition_key, "hot") {
                    Some(bucket) if s.placement == Placement::Spread => {
                        shard_for_hash(bucket_hash_key("hot", bucket, s.buckets), s.shards)
                    }
                    _ => kinesis_shard_index(&r.partition_key, s.shards),
                };
                assert_eq!(
                    r.shard, expected,
                    "{} placed by {:?}",
                    r.partition_key, s.placement
                );
            }
            assert!(routed.iter().any(|r| r.partition_key == "cold"));
        }
    }
}
