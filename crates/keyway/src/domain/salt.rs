//! Salting: spreading one hot key's records over several partition keys (`key#0` .. `key#N-1`),
//! so that several shards and several DynamoDB partitions share its load, and a second phase
//! merges the partials of its buckets back into the key's one result.
//!
//! A `Partitioner` is the producer's side: it picks each record's partition key. Which keys it
//! salts is its `Salting`: none, all of them, a listed few (sidetracking: only the hot keys take
//! the salted path, every other key keeps its one partition key and needs no merge), or the hot
//! keys a registry names at the time (adaptive). Buckets are taken in turn per key, so a hot key's
//! records spread evenly whatever their order.
//!
//! Placement. Salting only helps when the buckets land on different shards, and the MD5 of the
//! bucket names does not see to that: 32 hashes over 8 evenly split shards are 32 random draws,
//! and `hot#0` .. `hot#31` land [3, 2, 4, 4, 7, 6, 3, 3], one shard with over twice its share.
//! So a salted record carries an explicit hash key (Kinesis's `ExplicitHashKey`), which
//! `bucket_hash_key` puts in the middle of the bucket's own slice of `buckets` even slices of the
//! 128-bit hash key space: with a bucket count that is a multiple of the shard count, every shard
//! gets the same number of buckets. Each key's buckets start at a slice of its own (the key's MD5
//! picks it), so that the many keys with a few records do not all load the first slice.
//! `Partitioner::route` gives a record's partition key with that hash key.
//!
//! `unsalt` is the consumer's side: a partition key that is `key#i` for the record's own key and
//! a bucket `i` below the most buckets any key may have is that bucket; anything else is the key
//! itself. So a key whose name ends in `#3` of its own is not mistaken for a bucket of another.
//!
//! State. A bucket's state must not share a key with any key's own state: the partition key
//! `hot#3` names bucket 3 of `hot` and is also a key a user may have. `StateKey` keeps them
//! apart without reading anything out of user text: a bucket's state key starts with `~` and its
//! number (`~3~hot`), and a key's own is the key itself, with a `~` before it if it starts with
//! one (`~~x` for `~x`), so no key's own state key starts with `~` and a digit.

use std::collections::{BTreeSet, HashMap};

use super::hash::{kinesis_hash_key, PARTITION_KEY_MAX_CHARS};

/// The most buckets one key may be spread over: a shard count of this many is already far more
/// than one key ever needs.
pub const MAX_BUCKETS: u32 = 1024;

/// Which keys a producer salts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Salting {
    /// Every key keeps its own partition key.
    None,
    /// Every key is spread over `buckets`.
    All {
        /// How many buckets each key is spread over.
        buckets: u32,
    },
    /// Only the listed keys are spread over `buckets` (sidetracking).
    Listed {
        /// The keys that are salted.
        hot: BTreeSet<String>,
        /// How many buckets each listed key is spread over.
        buckets: u32,
    },
}

impl Salting {
    /// The buckets `key` is spread over: 1 when it is not salted.
    pub fn buckets_of(&self, key: &str) -> u32 {
        match self {
            Salting::None => 1,
            Salting::All { buckets } => *buckets,
            Salting::Listed { hot, buckets } if hot.contains(key) => *buckets,
            Salting::Listed { .. } => 1,
        }
    }
}

/// The producer's side: each record's partition key.
#[derive(Debug)]
pub struct Partitioner {
    salting: Salting,
    /// The bucket each salted key takes next.
    next: HashMap<String, u32>,
}

impl Partitioner {
    /// A partitioner that salts the keys `salting` names.
    pub fn new(salting: Salting) -> Self {
        Self {
            salting,
            next: HashMap::new(),
        }
    }

    /// Which keys are salted from now on (a registry's newest list): keys that cool down go
    /// back to their own partition key, keys that turn hot are spread from their next record.
    pub fn set_salting(&mut self, salting: Salting) {
        self.salting = salting;
    }

    /// Which keys are salted at present.
    pub fn salting(&self) -> &Salting {
        &self.salting
    }

    /// The partition key of the next record of `key`.
    pub fn partition_key(&mut self, key: &str) -> String {
        match self.next_bucket(key) {
            Some((bucket, _)) => salted(key, bucket),
            None => key.to_owned(),
        }
    }

    /// The partition key of the next record of `key` and, when `key` is salted, the explicit hash
    /// key its bucket is placed by (`bucket_hash_key`); an unsalted key goes where the MD5 of its
    /// partition key puts it, so it has none. Takes the next bucket as `partition_key` does.
    pub fn route(&mut self, key: &str) -> (String, Option<u128>) {
        match self.next_bucket(key) {
            Some((bucket, buckets)) => (
                salted(key, bucket),
                Some(bucket_hash_key(key, bucket, buckets)),
            ),
            None => (key.to_owned(), None),
        }
    }

    /// The bucket the next record of `key` takes, with the buckets it is spread over; `None`
    /// when `key` is not salted.
    fn next_bucket(&mut self, key: &str) -> Option<(u32, u32)> {
        let buckets = self.salting.buckets_of(key).clamp(1, MAX_BUCKETS);
        // A key too long to take its buckets' suffix keeps its own partition key: salted, its
        // records would be refused by the stream the moment it turned hot.
        if buckets == 1 || !fits_salted(key, buckets) {
            return None;
        }
        let next = self.next.entry(key.to_owned()).or_insert(0);
        let bucket = *next % buckets;
        *next = next.wrapping_add(1);
        Some((bucket, buckets))
    }
}

/// Whether a producer can salt `key` over any number of buckets: its last bucket's partition key
/// is one Kinesis takes. (Under fewer buckets a few characters longer may do.)
pub fn can_salt(key: &str) -> bool {
    fits_salted(key, MAX_BUCKETS)
}

/// Whether `key`'s bucket partition keys, `#` and up to `buckets - 1` after it, are short enough
/// for Kinesis.
fn fits_salted(key: &str, buckets: u32) -> bool {
    let suffix = 1 + (buckets.max(2) - 1).ilog10() as usize + 1;
    // Most keys need no count of their characters.
    key.len() + suffix <= PARTITION_KEY_MAX_CHARS
        || key.chars().count() + suffix <= PARTITION_KEY_MAX_CHARS
}

/// The partition key of `key`'s bucket `bucket`.
pub fn salted(key: &str, bucket: u32) -> String {
    format!("{key}#{bucket}")
}

/// The explicit hash key that places bucket `bucket` of `key`, spread over `buckets` buckets: the
/// middle of slice `(bucket + offset) % buckets` of `buckets` even slices of the 128-bit hash key
/// space, the offset being `key`'s own MD5 hash key modulo `buckets` (see the module's notes).
/// `buckets` of 0 is taken as 1.
pub fn bucket_hash_key(key: &str, bucket: u32, buckets: u32) -> u128 {
    let n = u128::from(buckets.max(1));
    let slice = (u128::from(bucket) + kinesis_hash_key(key) % n) % n;
    let width = u128::MAX / n;
    slice * width + width / 2
}

/// The state key of a key's own records (`bucket` none) or of one of its buckets, each in a
/// namespace of its own (see the module's notes).
pub fn state_key(key: &str, bucket: Option<u32>) -> String {
    match bucket {
        Some(bucket) => format!("{BUCKET_MARK}{bucket}{BUCKET_MARK}{key}"),
        None if key.starts_with(BUCKET_MARK) => format!("{BUCKET_MARK}{key}"),
        None => key.to_owned(),
    }
}

/// What starts a bucket's state key, and is doubled at the start of a key's own.
const BUCKET_MARK: char = '~';

/// The bucket of `key` that `partition_key` names, if it names one (see the module's notes).
pub fn unsalt(partition_key: &str, key: &str) -> Option<u32> {
    let suffix = partition_key.strip_prefix(key)?.strip_prefix('#')?;
    let canonical = suffix == "0" || !suffix.starts_with('0');
    let bucket: u32 = suffix
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| suffix.parse().ok())
        .flatten()?;
    (canonical && bucket < MAX_BUCKETS).then_some(bucket)
}

#[cfg(test)]
mod tests {
    use super::super::hash::{kinesis_shard_index, shard_for_hash};
    use super::*;

    /// How many of 32 buckets each of 8 evenly split shards holds, bucket `i` going to shard
    /// `place(i)`.
    fn buckets_per_shard(place: impl Fn(u32) -> u32) -> [u32; 8] {
        let mut counts = [0u32; 8];
        for bucket in 0..32 {
            counts[place(bucket) as usize] += 1;
        }
        counts
    }

    #[test]
    fn a_salted_key_takes_its_buckets_in_turn_and_other_keys_keep_their_own() {
        let hot = BTreeSet::from(["hot".to_owned()]);
        let mut partitioner = Partitioner::new(Salting::Listed { hot, buckets: 3 });
        let keys: Vec<String> = (0..7).map(|_| partitioner.partition_key("hot")).collect();
        assert_eq!(
            keys,
            ["hot#0", "hot#1", "hot#2", "hot#0", "hot#1", "hot#2", "hot#0"]
        );
        assert_eq!(partitioner.partition_key("cold"), "cold");
        partitioner.set_salting(Salting::None);
        assert_eq!(partitioner.partition_key("hot"), "hot");
        partitioner.set_salting(Salting::All { buckets: 2 });
        assert_eq!(partitioner.partition_key("cold"), "cold#0");
    }

    #[test]
    fn a_bucket_is_read_back_only_from_the_records_own_key() {
        assert_eq!(unsalt("hot#7", "hot"), Some(7));
        assert_eq!(unsalt(&salted("a#b", 3), "a#b"), Some(3));
        assert_eq!(unsalt("hot", "hot"), None);
        assert_eq!(unsalt("hot#07", "hot"), None);
        assert_eq!(unsalt("hot#", "hot"), None);
        assert_eq!(unsalt("hot#x", "hot"), None);
        assert_eq!(unsalt("hot#1024", "hot"), None);
        assert_eq!(unsalt("other#1", "hot"), None);
        // A key that ends in `#3` of its own is its own key, not a bucket of `k`.
        assert_eq!(unsalt("k#3", "k#3"), None);
    }

    #[test]
    fn no_key_of_a_user_shares_its_state_key_with_a_bucket_of_another() {
        let keys = [
            "hot", "hot#3", "~3~hot", "~~3~hot", "~", "~~", "", "3", "~3",
        ];
        let mut seen = std::collections::BTreeMap::new();
        for key in keys {
            for bucket in [None, Some(0), Some(3), Some(MAX_BUCKETS - 1)] {
                let state = state_key(key, bucket);
                if let Some(before) = seen.insert(state.clone(), (key, bucket)) {
                    panic!("{state:?} is both {before:?} and {:?}", (key, bucket));
                }
            }
        }
        assert_eq!(
            state_key("hot", None),
            "hot",
            "a plain key's state stays where it was"
        );
        assert_eq!(state_key("hot", Some(3)), "~3~hot");
        assert_eq!(state_key("~x", None), "~~x");
    }

    #[test]
    fn buckets_placed_by_hash_key_fall_evenly_on_evenly_split_shards_where_md5_does_not() {
        for key in ["hot", "another", ""] {
            let spread =
                buckets_per_shard(|bucket| shard_for_hash(bucket_hash_key(key, bucket, 32), 8));
            assert_eq!(spread, [4; 8], "{key}");
        }
        let md5 = buckets_per_shard(|bucket| kinesis_shard_index(&salted("hot", bucket), 8));
        assert_eq!(
            md5,
            [3, 2, 4, 4, 7, 6, 3, 3],
            "the reason for explicit hash keys"
        );
    }

    #[test]
    fn the_hash_key_of_each_bucket_is_inside_its_own_slice() {
        for buckets in [1, 2, 3, 7, 32, MAX_BUCKETS] {
            let width = u128::MAX / u128::from(buckets);
            let offset = kinesis_hash_key("hot") % u128::from(buckets);
            for bucket in 0..buckets {
                let slice = (u128::from(bucket) + offset) % u128::from(buckets);
                let hash = bucket_hash_key("hot", bucket, buckets);
                assert!(
                    (slice * width..(slice + 1) * width).contains(&hash),
                    "bucket {bucket} of {buckets}"
                );
            }
        }
        assert_eq!(bucket_hash_key("hot", 0, 0), bucket_hash_key("hot", 0, 1));
    }

    #[test]
    fn routing_gives_a_salted_record_its_buckets_hash_key_and_an_unsalted_one_none() {
        let hot = BTreeSet::from(["hot".to_owned()]);
        let mut partitioner = Partitioner::new(Salting::Listed { hot, buckets: 3 });
        let routes: Vec<(String, Option<u128>)> =
            (0..4).map(|_| partitioner.route("hot")).collect();
        let expected: Vec<(String, Option<u128>)> = [0, 1, 2, 0]
            .into_iter()
            .map(|b| (salted("hot", b), Some(bucket_hash_key("hot", b, 3))))
            .collect();
        assert_eq!(routes, expected);
        assert_eq!(
            partitioner.partition_key("hot"),
            "hot#1",
            "route and partition_key take buckets from the same turn"
        );
        assert_eq!(partitioner.route("cold"), ("cold".to_owned(), None));
    }

    /// A key of 254 characters is a partition key Kinesis takes; `#31` after it is not.
    #[test]
    fn a_hot_key_too_long_for_its_buckets_suffix_keeps_its_own_partition_key() {
        for (key, buckets) in [
            ("k".repeat(254), 32),
            ("é".repeat(255), 10),
            ("k".repeat(256), 2),
        ] {
            let mut partitioner = Partitioner::new(Salting::All { buckets });
            for _ in 0..buckets {
                assert_eq!(partitioner.route(&key), (key.clone(), None));
            }
        }
        for (key, buckets, last) in [("k".repeat(253), 32, "#31"), ("é".repeat(254), 2, "#1")] {
            let mut partitioner = Partitioner::new(Salting::All { buckets });
            let keys: Vec<String> = (0..buckets)
                .map(|_| partitioner.partition_key(&key))
                .collect();
            assert!(keys
                .iter()
                .all(|k| k.chars().count() <= PARTITION_KEY_MAX_CHARS));
            assert!(keys.last().is_some_and(|k| k.ends_with(last)), "{buckets}");
        }
    }
}
