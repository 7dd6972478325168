//! Shards and their lineage, as Kinesis and DynamoDB Streams keep them. Each shard owns a range
//! of the 128-bit hash key space while it is open; resharding closes shards and opens children
//! that own the same keys, and a closed shard keeps its records (until the stream's retention
//! trims them) and names its parents. A key's records are therefore in order only along its
//! lineage: a reader reads a parent to its end before its children (Kinesis Data Streams
//! Developer Guide, "Consider data routing, data persistence, and shard state after a reshard";
//! DynamoDB Developer Guide, "Reading and processing a stream").
//!
//! Positions are indexes into a shard that stay where they were when records are trimmed; shards
//! are numbered in the order they were created, and a number never changes.

use std::sync::Arc;

/// A record a shard holds, with when it arrived.
pub trait Arrived {
    /// When the record arrived in its shard, in epoch milliseconds.
    fn arrival_millis(&self) -> i64;
}

/// Why a reshard is refused, as the service's ResourceNotFoundException,
/// InvalidArgumentException or ResourceInUseException says it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReshardError {
    /// The stream does not exist (or the table has none).
    #[error("ResourceNotFoundException: there is no stream {0}")]
    NoStream(String),
    /// The stream has no shard of that id or number.
    #[error("ResourceNotFoundException: there is no shard {0}")]
    NoShard(String),
    /// The shard owns a single hash key, which cannot be split.
    #[error("InvalidArgumentException: shard {0} owns a single hash key: it cannot split")]
    SingleKey(String),
    /// The shard is closed: only open shards are split or merged.
    #[error("ResourceInUseException: shard {0} is closed: only open shards can be resharded")]
    Closed(String),
    /// A split's new starting hash key is not inside the shard's range, above its first key.
    #[error("InvalidArgumentException: NewStartingHashKey {at} is not within the hash key range of shard {shard} above its starting hash key")]
    OutsideRange {
        /// The id of the shard to split.
        shard: String,
        /// The NewStartingHashKey asked for.
        at: u128,
    },
    /// The two shards to merge do not own adjacent hash key ranges.
    #[error("InvalidArgumentException: shards {0} and {1} are not adjacent: their hash key ranges do not meet")]
    NotAdjacent(String, String),
    /// UpdateShardCount's target is outside half to double the open shards.
    #[error("InvalidArgumentException: TargetShardCount {target} must be between half and double the {open} open shards")]
    TargetCount {
        /// The TargetShardCount asked for.
        target: usize,
        /// How many shards are open.
        open: usize,
    },
}

/// What a reader needs to know of a shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardInfo {
    /// The shard's id, as the service names it (`shardId-000000000000` on Kinesis).
    pub id: String,
    /// The shards (by number) this one took its hash keys from: one after a split or a rollover,
    /// two after a merge, none for a shard of the stream's creation.
    pub parents: Vec<usize>,
    /// An open shard takes writes; a closed one only keeps what it holds.
    pub open: bool,
    /// The position after its last record: how many records it ever held.
    pub len: usize,
}

struct Shard<T> {
    id: String,
    parents: Vec<usize>,
    /// The inclusive hash key range the shard owns (or owned, once closed).
    first: u128,
    last: u128,
    open: bool,
    /// Shared with the readers: a record is never copied once written.
    records: Vec<Arc<T>>,
    /// How many records were trimmed from the front.
    trimmed: usize,
}

/// Names a stream's `n`th shard, created at `millis`.
pub(crate) type ShardNamer = Box<dyn Fn(usize, i64) -> String + Send + Sync>;

/// The shards of one stream.
pub struct Shards<T> {
    shards: Vec<Shard<T>>,
    name: ShardNamer,
}

impl<T: Arrived> Shards<T> {
    /// `count` shards splitting the hash key space evenly, as CreateStream makes them: the
    /// ranges `domain::hash::shard_for_hash` assigns.
    pub fn even(count: usize, name: ShardNamer, millis: i64) -> Self {
        let mut shards = Self {
            shards: Vec::new(),
            name,
        };
        for (first, last) in even_ranges(count.max(1)) {
            shards.open_shard(Vec::new(), first, last, millis);
        }
        shards
    }

    fn open_shard(&mut self, parents: Vec<usize>, first: u128, last: u128, millis: i64) -> usize {
        let number = self.shards.len();
        self.shards.push(Shard {
            id: (self.name)(number, millis),
            parents,
            first,
            last,
            open: true,
            records: Vec::new(),
            trimmed: 0,
        });
        number
    }

    /// How many shards there are, open and closed.
    pub fn count(&self) -> usize {
        self.shards.len()
    }

    /// What a reader needs to know of `shard` (by number), if it exists.
    pub fn info(&self, shard: usize) -> Option<ShardInfo> {
        self.shards.get(shard).map(|s| ShardInfo {
            id: s.id.clone(),
            parents: s.parents.clone(),
            open: s.open,
            len: s.trimmed + s.records.len(),
        })
    }

    /// Every shard, in the order they were created.
    pub(crate) fn infos(&self) -> Vec<ShardInfo> {
        (0..self.count()).filter_map(|i| self.info(i)).collect()
    }

    /// The inclusive hash key range the shard owns (or owned, once closed).
    pub fn range(&self, shard: usize) -> Option<(u128, u128)> {
        self.shards.get(shard).map(|s| (s.first, s.last))
    }

    /// The id of `shard` (by number), if it exists.
    pub fn id(&self, shard: usize) -> Option<&str> {
        self.shards.get(shard).map(|s| s.id.as_str())
    }

    /// The open shard that owns `hash`.
    pub fn route(&self, hash: u128) -> usize {
        self.shards
            .iter()
            .position(|s| s.open && s.first <= hash && hash <= s.last)
            .expect("the open shards cover the hash key space")
    }

    /// Appends `record` to `shard` (by number; see `route`) and returns it as the shard keeps
    /// it.
    pub fn push(&mut self, shard: usize, record: T) -> &Arc<T> {
        let records = &mut self.shards[shard].records;
        records.push(Arc::new(record));
        records.last().expect("pushed")
    }

    /// Up to `max` records of `shard` from position `from`, from the oldest kept when `from` was
    /// trimmed, and the position after them.
    pub fn read(&self, shard: usize, from: usize, max: usize) -> (Vec<Arc<T>>, usize) {
        let Some(s) = self.shards.get(shard) else {
            return (Vec::new(), from);
        };
        let skip = from.saturating_sub(s.trimmed);
        let records: Vec<Arc<T>> = s.records.iter().skip(skip).take(max).cloned().collect();
        let next = from.max(s.trimmed) + records.len();
        (records, next)
    }

    /// The position of the first record of `shard` that arrived at or after `millis`.
    pub(crate) fn position_at(&self, shard: usize, millis: i64) -> usize {
        self.shards.get(shard).map_or(0, |s| {
            s.trimmed + s.records.partition_point(|r| r.arrival_millis() < millis)
        })
    }

    /// Every record held, shard by shard, each shard in order.
    pub fn records(&self) -> impl Iterator<Item = &Arc<T>> {
        self.shards.iter().flat_map(|s| s.records.iter())
    }

    /// How many records are held.
    pub fn held(&self) -> usize {
        self.shards.iter().map(|s| s.records.len()).sum()
    }

    /// Drops the records that arrived before `cutoff`; returns how many went.
    pub fn expire(&mut self, cutoff: i64) -> usize {
        let mut expired = 0;
        for shard in &mut self.shards {
            let old = shard
                .records
                .partition_point(|r| r.arrival_millis() < cutoff);
            shard.records.drain(..old);
            shard.trimmed += old;
            expired += old;
        }
        expired
    }

    /// Takes every record out, shard by shard; positions stay where they were.
    pub(crate) fn take_all(&mut self) -> Vec<Arc<T>> {
        let mut taken = Vec::new();
        for shard in &mut self.shards {
            shard.trimmed += shard.records.len();
            taken.append(&mut shard.records);
        }
        taken
    }

    fn open(&self, shard: usize) -> Result<&Shard<T>, ReshardError> {
        let s = self
            .shards
            .get(shard)
            .ok_or_else(|| ReshardError::NoShard(format!("numbered {shard}")))?;
        if !s.open {
            return Err(ReshardError::Closed(s.id.clone()));
        }
        Ok(s)
    }

    /// The number of the shard named `id`.
    pub fn number(&self, id: &str) -> Result<usize, ReshardError> {
        self.shards
            .iter()
            .position(|s| s.id == id)
            .ok_or_else(|| ReshardError::NoShard(id.to_owned()))
    }

    /// SplitShard: closes `shard` and opens two children, one owning its hash keys below `at`,
    /// the other `at` and above. Returns the children.
    pub fn split(
        &mut self,
        shard: usize,
        at: u128,
        millis: i64,
    ) -> Result<(usize, usize), ReshardError> {
        let parent = self.open(shard)?;
        let (first, last) = (parent.first, parent.last);
        if at <= first || at > last {
            return Err(ReshardError::OutsideRange {
                shard: parent.id.clone(),
                at,
            });
        }
        self.shards[shard].open = false;
        let low = self.open_shard(vec![shard], first, at - 1, millis);
        let high = self.open_shard(vec![shard], at, last, millis);
        Ok((low, high))
    }

    /// MergeShards: closes two adjacent shards and opens one child owning the hash keys of both.
    pub fn merge(
        &mut self,
        shard: usize,
        adjacent: usize,
        millis: i64,
    ) -> Result<usize, ReshardError> {
        let (a, b) = (self.open(shard)?, self.open(adjacent)?);
        let (low, high) = if a.first < b.first { (a, b) } else { (b, a) };
        if low.last.checked_add(1) != Some(high.first) {
            return Err(ReshardError::NotAdjacent(a.id.clone(), b.id.clone()));
        }
        let (first, last) = (low.first, high.last);
        self.shards[shard].open = false;
        self.shards[adjacent].open = false;
        Ok(self.open_shard(vec![shard, adjacent], first, last, millis))
    }

    /// UpdateShardCount with UNIFORM_SCALING: `target` shards splitting the hash key space
    /// evenly, between half and double the open shards. Kinesis gets there through splits and
    /// merges; here every open shard closes at once and each new shard names as parents the
    /// closed shards whose keys it takes, which gives a reader the same rule: a key's records
    /// in a new shard come after all of its records in the old ones.
    pub fn rescale(&mut self, target: usize, millis: i64) -> Result<Vec<usize>, ReshardError> {
        let open = self.open_numbers();
        if target == 0 || target * 2 < open.len() || target > open.len() * 2 {
            return Err(ReshardError::TargetCount {
                target,
                open: open.len(),
            });
        }
        for &i in &open {
            self.shards[i].open = false;
        }
        let mut children = Vec::new();
        for (first, last) in even_ranges(target) {
            let parents = open
                .iter()
                .copied()
                .filter(|&i| self.shards[i].first <= last && first <= self.shards[i].last)
                .collect();
            children.push(self.open_shard(parents, first, last, millis));
        }
        Ok(children)
    }

    /// The numbers of the open shards.
    fn open_numbers(&self) -> Vec<usize> {
        (0..self.count()).filter(|&i| self.shards[i].open).collect()
    }

    /// Splits an open shard in the middle of its hash keys (as a DynamoDB table's partition
    /// splits). Returns the children.
    pub fn halve(&mut self, shard: usize, millis: i64) -> Result<(usize, usize), ReshardError> {
        let parent = self.open(shard)?;
        if parent.first == parent.last {
            return Err(ReshardError::SingleKey(parent.id.clone()));
        }
        // first < last here: the middle plus one is at most last, and never overflows.
        let at = parent.first + (parent.last - parent.first) / 2 + 1;
        self.split(shard, at, millis)
    }

    /// Closes every open shard and opens one child with the same hash keys for each: what
    /// DynamoDB Streams does to every shard of a table every few hours.
    pub(crate) fn roll_over(&mut self, millis: i64) -> Vec<usize> {
        self.open_numbers()
            .into_iter()
            .map(|i| {
                self.shards[i].open = false;
                let (first, last) = (self.shards[i].first, self.shards[i].last);
                self.open_shard(vec![i], first, last, millis)
            })
            .collect()
    }
}

/// `count` inclusive ranges splitting the 2^128 hash key space evenly, the last taking the
/// remainder (the ranges CreateStream gives its shards).
fn even_ranges(count: usize) -> Vec<(u128, u128)> {
    if count == 1 {
        return vec![(0, u128::MAX)];
    }
    let n = count as u128;
    // floor(2^128 / n), computed without overflowing u128.
    let width = u128::MAX / n + (u128::MAX % n + 1) / n;
    (0..n)
        .map(|i| {
            let first = i * width;
            let last = if i + 1 == n {
                u128::MAX
            } else {
                first + width - 1
            };
            (first, last)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway::domain::hash::shard_for_hash;

    struct At(i64);

    impl Arrived for At {
        fn arrival_millis(&self) -> i64 {
            self.0
        }
    }

    fn shards(count: usize) -> Shards<At> {
        Shards::even(count, Box::new(|n, _| format!("shardId-{n:012}")), 0)
    }

    #[test]
    fn even_shards_own_the_hash_keys_that_shard_for_hash_gives_them() {
        for count in [1, 2, 3, 4, 7] {
            let s = shards(count);
            for hash in [
                0,
                1,
                u128::MAX / 3,
                u128::MAX / 2,
                1 << 127,
                u128::MAX - 1,
                u128::MAX,
            ] {
                assert_eq!(s.route(hash) as u32, shard_for_hash(hash, count as u32));
            }
        }
    }

    #[test]
    fn a_split_closes_its_shard_and_its_children_take_its_keys_on_either_side_of_the_split() {
        let mut s = shards(1);
        s.push(0, At(1));
        let at = 1u128 << 100;
        let (low, high) = s.split(0, at, 5).unwrap();
        assert_eq!((low, high), (1, 2));
        assert_eq!((s.route(at - 1), s.route(at), s.route(0)), (1, 2, 1));
        let parent = s.info(0).unwrap();
        assert!(
            !parent.open && parent.len == 1,
            "the parent keeps its record"
        );
        assert_eq!(s.info(2).unwrap().parents, [0]);
        assert_eq!(
            s.split(0, at, 6),
            Err(ReshardError::Closed("shardId-000000000000".into()))
        );
        assert!(matches!(
            s.split(1, 0, 6),
            Err(ReshardError::OutsideRange { .. })
        ));
        // The low child owns [0, at - 1]: a split at its first key is refused, as is one past its
        // last; one at its last key is taken.
        assert!(matches!(
            s.split(1, at, 7),
            Err(ReshardError::OutsideRange { .. })
        ));
        let (a, b) = s.split(1, at - 1, 7).unwrap();
        assert_eq!(
            (s.range(a), s.range(b)),
            (Some((0, at - 2)), Some((at - 1, at - 1)))
        );
        let (c, _) = s.split(a, 1, 8).unwrap();
        assert_eq!(
            s.range(c),
            Some((0, 0)),
            "a split one key above the first is taken"
        );
    }

    #[test]
    fn halving_stops_at_a_shard_of_one_hash_key() {
        let mut s = shards(1);
        let mut top = 0;
        for _ in 0..128 {
            top = s.halve(top, 1).unwrap().1;
        }
        assert_eq!(s.range(top), Some((u128::MAX, u128::MAX)));
        assert!(matches!(s.halve(top, 1), Err(ReshardError::SingleKey(_))));
    }

    #[test]
    fn a_merge_takes_two_adjacent_shards_and_refuses_two_that_do_not_meet() {
        let mut s = shards(3);
        assert!(matches!(
            s.merge(0, 2, 1),
            Err(ReshardError::NotAdjacent(..))
        ));
        let child = s.merge(2, 1, 1).unwrap();
        assert_eq!(s.info(child).unwrap().parents, [2, 1]);
        assert_eq!(s.route(u128::MAX), child);
        assert_eq!(s.route(u128::MAX / 2), child);
        assert_eq!(s.route(0), 0);
    }

    #[test]
    fn a_rescale_names_as_parents_every_closed_shard_whose_keys_a_new_shard_takes() {
        let mut s = shards(3);
        assert!(s.rescale(7, 1).is_err(), "more than double");
        assert!(s.rescale(1, 1).is_err(), "less than half");
        let children = s.rescale(2, 1).unwrap();
        assert_eq!(children, [3, 4]);
        assert_eq!(s.info(3).unwrap().parents, [0, 1]);
        assert_eq!(s.info(4).unwrap().parents, [1, 2]);
        assert_eq!(s.infos().iter().filter(|i| i.open).count(), 2);
    }

    #[test]
    fn a_read_from_a_trimmed_position_goes_on_from_the_oldest_record_kept() {
        let mut s = shards(1);
        for t in 0..4 {
            s.push(0, At(t));
        }
        assert_eq!(s.expire(2), 2);
        let (records, next) = s.read(0, 0, 10);
        assert_eq!(records.len(), 2);
        assert_eq!(next, 4, "the position after the last record, not 0 + 2");
        assert_eq!(s.read(0, 4, 10).1, 4);
        assert_eq!(s.position_at(0, 3), 3);
        let rolled = s.roll_over(9);
        assert_eq!(s.info(rolled[0]).unwrap().parents, [0]);
    }
}
