//! In-memory Kinesis: streams of N shards splitting the MD5 hash key space evenly, sequence
//! numbers growing per shard, PutRecords with ExplicitHashKey and the service's limits (1 MiB a
//! record, 500 records and 5 MiB a call), and optionally the per-shard write limit of 1,000
//! records or 1 MiB a second, answered with ProvisionedThroughputExceededException. Streams
//! reshard (SplitShard, MergeShards, UpdateShardCount) into shards that name their parents
//! (`shards`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::faults::{Fault, Faults};
use super::meter::{put_payload_units, Meter};
use super::shards::{Arrived, ReshardError, ShardInfo, Shards};
use keyway::adapters::kinesis::{
    KinesisApi, PutEntry, PutOutcome, PUT_RECORDS_MAX, PUT_RECORDS_MAX_BYTES, RECORD_MAX_BYTES,
};
use keyway::domain::hash::{is_partition_key, HashKeys};
use keyway::ports::{Clock, SinkError};

/// A record as a shard stores it: as a Kinesis event carries it, so that a batch goes to a
/// function of this process as it is (`KinesisBatch`).
pub use keyway::sources::kinesis::KinesisRecord as StoredRecord;

/// A stream keeps records 24 hours unless its RetentionPeriodHours says longer.
pub(crate) const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Kinesis's per-shard write limit in records: 1,000 a second.
pub const SHARD_RECORDS_PER_SECOND: u32 = 1_000;
/// Kinesis's per-shard write limit in bytes (data and partition keys): 1 MiB a second.
pub const SHARD_BYTES_PER_SECOND: usize = 1024 * 1024;

impl Arrived for StoredRecord {
    fn arrival_millis(&self) -> i64 {
        self.arrival_millis
    }
}

/// A record's data as a put takes it: borrowed, and copied into the stream; or in a buffer the
/// stream shares with the producer.
#[derive(Clone, Copy, Debug)]
pub enum Data<'a> {
    /// Copied into the stream's record.
    Borrowed(&'a [u8]),
    /// Kept by the stream's record as it is: the producer's buffer, shared.
    Shared(&'a Bytes),
}

impl Data<'_> {
    fn len(&self) -> usize {
        match self {
            Data::Borrowed(data) => data.len(),
            Data::Shared(data) => data.len(),
        }
    }

    /// The data as the stream keeps it.
    fn stored(&self) -> Bytes {
        match self {
            Data::Borrowed(data) => Bytes::copy_from_slice(data),
            Data::Shared(data) => Bytes::clone(data),
        }
    }
}

/// One record of a put: `PutEntry` with its data borrowed or shared.
struct Entry<'a> {
    partition_key: &'a str,
    data: Data<'a>,
    explicit_hash_key: Option<&'a str>,
}

impl<'a> From<&PutEntry<'a>> for Entry<'a> {
    fn from(entry: &PutEntry<'a>) -> Self {
        Entry {
            partition_key: entry.partition_key,
            data: Data::Borrowed(entry.data),
            explicit_hash_key: entry.explicit_hash_key,
        }
    }
}

/// What one shard took in one second, for the write limit.
#[derive(Clone, Copy, Default)]
struct Written {
    second: i64,
    records: u32,
    bytes: usize,
}

impl Written {
    /// Whether a record of `size` bytes at `now` stays within the shard's write limit.
    fn fits(&mut self, now: i64, size: usize) -> bool {
        if self.second != now.div_euclid(1000) {
            *self = Written {
                second: now.div_euclid(1000),
                ..Written::default()
            };
        }
        self.records < SHARD_RECORDS_PER_SECOND && self.bytes + size <= SHARD_BYTES_PER_SECOND
    }

    fn add(&mut self, size: usize) {
        self.records += 1;
        self.bytes += size;
    }
}

struct Stream {
    arn: String,
    shards: Shards<StoredRecord>,
    /// By shard number: what each took in its current second.
    written: Vec<Written>,
    /// The largest record the stream takes: 1 MiB unless it opted into more (MaxRecordSizeInKiB).
    max_record_bytes: usize,
    /// How long the stream keeps a record (RetentionPeriodHours, 24 by default).
    retention: Duration,
    /// Partition keys' hash keys, remembered: a stream's keys repeat, and MD5 took a tenth of a
    /// put's time.
    hash_keys: HashKeys,
}

/// In-memory Kinesis streams.
pub struct LocalKinesis {
    streams: Mutex<BTreeMap<String, Stream>>,
    next_sequence: Mutex<u128>,
    clock: Arc<dyn Clock>,
    meter: Meter,
    faults: Faults,
    write_limit: std::sync::atomic::AtomicBool,
}

impl LocalKinesis {
    /// No streams yet, on `clock` and injecting `faults`, without the per-shard write limit.
    pub fn new(clock: Arc<dyn Clock>, faults: Faults) -> Self {
        Self {
            streams: Mutex::new(BTreeMap::new()),
            next_sequence: Mutex::new(1),
            clock,
            meter: Meter::default(),
            faults,
            write_limit: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Enforces the per-shard write limit of 1,000 records or 1 MiB a second.
    pub fn with_write_limit(self) -> Self {
        self.set_write_limit(true);
        self
    }

    /// Turns the per-shard write limit on or off: with it, a producer that writes faster than a
    /// shard takes meets ProvisionedThroughputExceededException, as on AWS.
    pub fn set_write_limit(&self, on: bool) {
        self.write_limit
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Creates a stream and returns its ARN.
    pub fn create_stream(&self, name: &str, shards: usize) -> String {
        let arn = format!("arn:aws:kinesis:us-east-1:000000000000:stream/{name}");
        let shards = Shards::even(
            shards,
            Box::new(|n, _| format!("shardId-{n:012}")),
            self.clock.now_millis(),
        );
        self.streams.lock().expect("streams lock").insert(
            name.to_owned(),
            Stream {
                arn: arn.clone(),
                shards,
                written: Vec::new(),
                max_record_bytes: RECORD_MAX_BYTES,
                retention: DEFAULT_RETENTION,
                hash_keys: HashKeys::default(),
            },
        );
        arn
    }

    /// `f` of the named stream's shards, or ResourceNotFoundException.
    fn reshard<T>(
        &self,
        stream: &str,
        f: impl FnOnce(&mut Shards<StoredRecord>, i64) -> Result<T, ReshardError>,
    ) -> Result<T, ReshardError> {
        let now = self.clock.now_millis();
        let mut streams = self.streams.lock().expect("streams lock");
        let target = streams
            .get_mut(stream)
            .ok_or_else(|| ReshardError::NoStream(stream.to_owned()))?;
        f(&mut target.shards, now)
    }

    /// SplitShard: closes the shard and opens two children, the second owning the hash keys from
    /// `new_starting_hash_key` up. Returns the children's ids.
    pub fn split_shard(
        &self,
        stream: &str,
        shard_id: &str,
        new_starting_hash_key: u128,
    ) -> Result<(String, String), ReshardError> {
        self.reshard(stream, |shards, now| {
            let (low, high) = shards.split(shards.number(shard_id)?, new_starting_hash_key, now)?;
            Ok((id_of(shards, low), id_of(shards, high)))
        })
    }

    /// MergeShards: closes two adjacent shards and opens one child. Returns its id.
    pub fn merge_shards(
        &self,
        stream: &str,
        shard_id: &str,
        adjacent_shard_id: &str,
    ) -> Result<String, ReshardError> {
        self.reshard(stream, |shards, now| {
            let child = shards.merge(
                shards.number(shard_id)?,
                shards.number(adjacent_shard_id)?,
                now,
            )?;
            Ok(id_of(shards, child))
        })
    }

    /// UpdateShardCount (UNIFORM_SCALING): the open shards close and `target` even shards open.
    /// Returns the new shards' ids.
    pub fn update_shard_count(
        &self,
        stream: &str,
        target: usize,
    ) -> Result<Vec<String>, ReshardError> {
        self.reshard(stream, |shards, now| {
            let children = shards.rescale(target, now)?;
            Ok(children.into_iter().map(|c| id_of(shards, c)).collect())
        })
    }

    /// The id of the shard numbered `shard` of `stream`.
    pub fn shard_id(&self, stream: &str, shard: usize) -> Option<String> {
        self.with_shards(stream, |s| s.id(shard).map(str::to_owned))
            .flatten()
    }

    /// Every shard of `stream`, open and closed, numbered in the order they were created.
    pub fn shards(&self, stream: &str) -> Vec<ShardInfo> {
        let streams = self.streams.lock().expect("streams lock");
        streams
            .get(stream)
            .map(|s| s.shards.infos())
            .unwrap_or_default()
    }

    /// Sets how long the stream keeps a record (its RetentionPeriodHours).
    pub(crate) fn set_retention(&self, stream: &str, retention: Duration) {
        if let Some(stream) = self.streams.lock().expect("streams lock").get_mut(stream) {
            stream.retention = retention;
        }
    }

    /// How long the stream keeps a record.
    pub fn retention(&self, stream: &str) -> Duration {
        let streams = self.streams.lock().expect("streams lock");
        streams
            .get(stream)
            .map_or(DEFAULT_RETENTION, |s| s.retention)
    }

    /// Drops every record that has been in its stream longer than the stream's retention, as
    /// Kinesis does; positions stay where they were. Returns how many went.
    pub fn expire(&self) -> usize {
        let now = self.clock.now_millis();
        let mut streams = self.streams.lock().expect("streams lock");
        let mut expired = 0;
        for stream in streams.values_mut() {
            expired += stream
                .shards
                .expire(now - stream.retention.as_millis() as i64);
        }
        expired
    }

    /// UpdateMaxRecordSize: lets the stream take records of up to `kib` KiB (1,024 to 10,240;
    /// 1 MiB is every stream's default).
    pub(crate) fn set_max_record_size(&self, stream: &str, kib: usize) {
        if let Some(stream) = self.streams.lock().expect("streams lock").get_mut(stream) {
            stream.max_record_bytes = kib.clamp(1024, 10 * 1024) * 1024;
        }
    }

    /// The service's calls and billing units so far.
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// The faults this service injected so far.
    pub fn faults_fired(&self) -> super::faults::FaultCounts {
        self.faults.fired()
    }

    /// The chances each kind of fault had here (`Faults::drawn`).
    pub fn faults_drawn(&self) -> super::faults::FaultCounts {
        self.faults.drawn()
    }

    /// The ARN of the stream named `name`, if it exists.
    pub fn stream_arn(&self, name: &str) -> Option<String> {
        self.streams
            .lock()
            .expect("streams lock")
            .get(name)
            .map(|s| s.arn.clone())
    }

    /// The shard ids of `stream`, open and closed, in the order they were created (for a stream
    /// never resharded, in hash key order).
    pub fn shard_ids(&self, stream: &str) -> Vec<String> {
        self.shards(stream).into_iter().map(|s| s.id).collect()
    }

    /// Every record of `stream`, shard by shard, each shard in sequence order.
    pub fn records(&self, stream: &str) -> Vec<StoredRecord> {
        let streams = self.streams.lock().expect("streams lock");
        streams
            .get(stream)
            .map(|s| s.shards.records().map(|r| StoredRecord::clone(r)).collect())
            .unwrap_or_default()
    }

    /// Takes every record `stream` holds now out of it, shard by shard, as its retention would
    /// drop them later; positions stay where they were. For a driver that reads a stream no
    /// mapping reads, or knows no mapping will read these records again (every mapping idle): a
    /// long run's memory then stays bounded.
    pub fn trim(&self, stream: &str) -> Vec<Arc<StoredRecord>> {
        let mut streams = self.streams.lock().expect("streams lock");
        streams
            .get_mut(stream)
            .map(|s| s.shards.take_all())
            .unwrap_or_default()
    }

    /// Up to `max` records of one shard (by number) from position `from`, as a shard iterator
    /// returns them (from the oldest kept when `from` was trimmed), and the position after them.
    pub fn read(
        &self,
        stream: &str,
        shard: usize,
        from: usize,
        max: usize,
    ) -> (Vec<Arc<StoredRecord>>, usize) {
        self.with_shards(stream, |s| s.read(shard, from, max))
            .unwrap_or((Vec::new(), from))
    }

    /// The position after one shard's last record: how many it ever held.
    pub fn shard_len(&self, stream: &str, shard: usize) -> usize {
        self.with_shards(stream, |s| s.info(shard).map_or(0, |i| i.len))
            .unwrap_or(0)
    }

    /// The position of the first record that arrived at or after `millis` (AT_TIMESTAMP).
    pub(crate) fn position_at(&self, stream: &str, shard: usize, millis: i64) -> usize {
        self.with_shards(stream, |s| s.position_at(shard, millis))
            .unwrap_or(0)
    }

    fn with_shards<T>(
        &self,
        stream: &str,
        f: impl FnOnce(&Shards<StoredRecord>) -> T,
    ) -> Option<T> {
        let streams = self.streams.lock().expect("streams lock");
        streams.get(stream).map(|s| f(&s.shards))
    }

    /// Puts records as a careful producer does: one at a time, each retried until the stream takes
    /// it, so that throttling and injected failures never reorder a key's records. Returns each
    /// record's (shard id, sequence number).
    pub async fn put_in_order<K: AsRef<str>, D: AsRef<[u8]>>(
        &self,
        stream: &str,
        records: &[(K, D)],
    ) -> Result<Vec<(String, String)>, SinkError> {
        self.put_each_in_order(stream, records, |data| Data::Borrowed(data.as_ref()))
            .await
    }

    /// `put_in_order` for data the stream keeps as it is, sharing the caller's buffer: a
    /// producer that holds many records in one buffer puts them without copying each.
    pub async fn put_shared_in_order<K: AsRef<str>>(
        &self,
        stream: &str,
        records: &[(K, Bytes)],
    ) -> Result<Vec<(String, String)>, SinkError> {
        self.put_each_in_order(stream, records, Data::Shared).await
    }

    async fn put_each_in_order<'a, K: AsRef<str>, D>(
        &self,
        stream: &str,
        records: &'a [(K, D)],
        data: impl Fn(&'a D) -> Data<'a>,
    ) -> Result<Vec<(String, String)>, SinkError> {
        let routed: Vec<(&str, Option<u128>, Data)> = records
            .iter()
            .map(|(key, d)| (key.as_ref(), None, data(d)))
            .collect();
        self.put_routed_in_order(stream, &routed).await
    }

    /// `put_in_order` for records (partition key, explicit hash key, data) of which some are
    /// placed by an explicit hash key (`keyway::domain::salt::Partitioner::route`).
    pub async fn put_routed_in_order(
        &self,
        stream: &str,
        records: &[(&str, Option<u128>, Data<'_>)],
    ) -> Result<Vec<(String, String)>, SinkError> {
        let mut positions = Vec::with_capacity(records.len());
        for (key, hash, data) in records {
            let hash = hash.map(|h| h.to_string());
            loop {
                let entry = Entry {
                    partition_key: key,
                    data: *data,
                    explicit_hash_key: hash.as_deref(),
                };
                match self.put_metered(stream, std::slice::from_ref(&entry)).await {
                    Ok(mut outcomes) => match outcomes.remove(0) {
                        PutOutcome::Written {
                            shard_id,
                            sequence_number,
                        } => {
                            positions.push((shard_id, sequence_number));
                            break;
                        }
                        PutOutcome::Failed { .. } => {
                            tokio::time::sleep(std::time::Duration::from_millis(10)).await
                        }
                    },
                    Err(err) if err.is_retryable() => {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await
                    }
                    Err(err) => return Err(err),
                }
            }
        }
        Ok(positions)
    }

    /// PutRecord, for producers in tests and the demo.
    pub fn put_record(
        &self,
        stream: &str,
        partition_key: &str,
        data: &[u8],
    ) -> Result<PutOutcome, SinkError> {
        let mut outcomes = self.put(
            stream,
            &[Entry {
                partition_key,
                data: Data::Borrowed(data),
                explicit_hash_key: None,
            }],
        )?;
        Ok(outcomes.remove(0))
    }

    /// Refuses a call the service would: too many records or bytes, or a record whose key or
    /// size the stream does not take.
    fn check_call(&self, stream: &str, entries: &[Entry<'_>]) -> Result<(), SinkError> {
        let total: usize = entries
            .iter()
            .map(|e| e.data.len() + e.partition_key.len())
            .sum();
        let max_record = {
            let streams = self.streams.lock().expect("streams lock");
            streams
                .get(stream)
                .map_or(RECORD_MAX_BYTES, |s| s.max_record_bytes)
        };
        // A call may carry one record of the stream's largest size.
        let max_call = PUT_RECORDS_MAX_BYTES.max(max_record);
        if entries.is_empty() || entries.len() > PUT_RECORDS_MAX || total > max_call {
            return Err(SinkError::Rejected(format!(
                "ValidationException: PutRecords takes 1-{PUT_RECORDS_MAX} records and at most {max_call} bytes; got {} records, {total} bytes",
                entries.len()
            )));
        }
        if let Some(bad) = entries.iter().find(|e| {
            !is_partition_key(e.partition_key) || e.data.len() + e.partition_key.len() > max_record
        }) {
            return Err(SinkError::Rejected(format!(
                "ValidationException: a record with a partition key of {} characters and {} bytes of data",
                bad.partition_key.chars().count(),
                bad.data.len()
            )));
        }
        Ok(())
    }

    fn put(&self, stream: &str, entries: &[Entry<'_>]) -> Result<Vec<PutOutcome>, SinkError> {
        self.check_call(stream, entries)?;
        if self.faults.draw(Fault::Throttle) {
            return Err(SinkError::Throttled(
                "LimitExceededException: Rate exceeded for stream".into(),
            ));
        }
        let now = self.clock.now_millis();
        let mut streams = self.streams.lock().expect("streams lock");
        let target = streams.get_mut(stream).ok_or_else(|| {
            SinkError::Rejected(format!(
                "ResourceNotFoundException: Stream {stream} not found"
            ))
        })?;
        let mut next = self.next_sequence.lock().expect("sequence lock");
        let mut outcomes = Vec::with_capacity(entries.len());
        for entry in entries {
            let hash = match entry.explicit_hash_key {
                Some(text) => text.parse::<u128>().map_err(|_| {
                    SinkError::Rejected(format!(
                        "ValidationException: ExplicitHashKey {text:?} is not a 128-bit decimal"
                    ))
                })?,
                None => target.hash_keys.of(entry.partition_key),
            };
            let shard = target.shards.route(hash);
            let shard_id = id_of(&target.shards, shard);
            if target.written.len() <= shard {
                target.written.resize(shard + 1, Written::default());
            }
            let size = entry.data.len() + entry.partition_key.len();
            let limited = self.write_limit.load(std::sync::atomic::Ordering::Relaxed);
            let written = &mut target.written[shard];
            let over_limit = !written.fits(now, size) && limited;
            if over_limit || self.faults.draw(Fault::PartialFailure) {
                outcomes.push(PutOutcome::Failed {
                    code: "ProvisionedThroughputExceededException".into(),
                    message: format!("Rate exceeded for shard {shard_id} in stream {stream}"),
                });
                continue;
            }
            written.add(size);
            let sequence_number = sequence_number(*next);
            *next += 1;
            target.shards.push(
                shard,
                StoredRecord {
                    shard_id: shard_id.clone(),
                    sequence_number: sequence_number.clone(),
                    partition_key: entry.partition_key.to_owned(),
                    data: entry.data.stored(),
                    arrival_millis: now,
                },
            );
            outcomes.push(PutOutcome::Written {
                shard_id,
                sequence_number,
            });
        }
        Ok(outcomes)
    }

    /// PutRecords, metered. (`put_in_order` calls it a record at a time, without the boxed
    /// future of the trait's method.)
    async fn put_metered(
        &self,
        stream: &str,
        entries: &[Entry<'_>],
    ) -> Result<Vec<PutOutcome>, SinkError> {
        // Accounts the whole call, metering included (see `Meter::busy`).
        let _busy = self.meter.busy();
        let outcome = self.put(stream, entries);
        // Billed whether or not a record was taken: a throttled record is billed as well.
        let units = entries
            .iter()
            .map(|e| put_payload_units(e.data.len() + e.partition_key.len()))
            .sum();
        self.meter.billed_call("PutRecords", 0.0, 0.0, units).await;
        outcome
    }
}

/// The `n`th sequence number of the service: "49" and `n` in 54 digits, as long as real ones
/// and growing with `n`. Written without `format!`, which a put of a million records felt.
fn sequence_number(n: u128) -> String {
    let mut text = String::with_capacity(56);
    text.push_str("49");
    let digits = n.to_string();
    text.extend(std::iter::repeat_n(
        '0',
        54usize.saturating_sub(digits.len()),
    ));
    text.push_str(&digits);
    text
}

fn id_of<T: Arrived>(shards: &Shards<T>, shard: usize) -> String {
    shards.id(shard).expect("a shard of the stream").to_owned()
}

#[async_trait]
impl KinesisApi for LocalKinesis {
    async fn put_records(
        &self,
        stream: &str,
        entries: &[PutEntry<'_>],
    ) -> Result<Vec<PutOutcome>, SinkError> {
        let entries: Vec<Entry> = entries.iter().map(Entry::from).collect();
        self.put_metered(stream, &entries).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::clock::VirtualClock;

    #[test]
    fn sequence_numbers_have_56_digits_and_grow() {
        for n in [0, 7, 1_234_567_890, u128::from(u64::MAX)] {
            assert_eq!(sequence_number(n), format!("49{n:054}"));
        }
    }

    /// The stream remembers keys' hash keys, not their shards: a key put before a split goes
    /// after it to the child whose range holds its hash key, as on AWS.
    #[tokio::test(start_paused = true)]
    async fn a_key_put_before_a_split_goes_after_it_to_the_child_owning_its_hash_key() {
        use keyway::domain::hash::kinesis_hash_key;
        let kinesis = LocalKinesis::new(VirtualClock::starting_at(0), Faults::none());
        kinesis.create_stream("s", 1);
        let high = "k";
        let low = (0..)
            .map(|n| format!("j{n}"))
            .find(|key| kinesis_hash_key(key) < kinesis_hash_key(high))
            .unwrap();
        let before = kinesis
            .put_in_order("s", &[(high, "1"), (low.as_str(), "1")])
            .await
            .unwrap();
        assert!(before
            .iter()
            .all(|(shard, _)| shard == "shardId-000000000000"));
        let (low_child, high_child) = kinesis
            .split_shard("s", "shardId-000000000000", kinesis_hash_key(high))
            .unwrap();
        let after = kinesis
            .put_in_order("s", &[(high, "2"), (low.as_str(), "2")])
            .await
            .unwrap();
        assert_eq!(after[0].0, high_child);
        assert_eq!(after[1].0, low_child);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shared_put_keeps_the_producers_buffer_and_a_borrowed_one_copies_it() {
        let kinesis = LocalKinesis::new(VirtualClock::starting_at(0), Faults::none());
        kinesis.create_stream("s", 1);
        let buffer = Bytes::from_static(b"onetwo");
        let shared = [("k", buffer.slice(0..3)), ("k", buffer.slice(3..6))];
        kinesis.put_shared_in_order("s", &shared).await.unwrap();
        kinesis
            .put_in_order("s", &[("k", &buffer[..3])])
            .await
            .unwrap();
        let (read, _) = kinesis.read("s", 0, 0, 10);
        let data: Vec<&[u8]> = read.iter().map(|r| &r.data[..]).collect();
        assert_eq!(data, [&b"one"[..], b"two", b"one"]);
        assert_eq!(read[0].data.as_ptr(), buffer.as_ptr());
        assert_eq!(read[1].data.as_ptr(), buffer[3..].as_ptr());
        assert_ne!(read[2].data.as_ptr(), buffer.as_ptr());
    }

    /// "Handle large records" (Kinesis Data Streams Developer Guide): every stream takes records
    /// of up to 1 MiB; one that opted in with MaxRecordSizeInKiB takes up to that.
    #[tokio::test(start_paused = true)]
    async fn a_record_over_a_mebibyte_is_refused_unless_its_stream_opted_into_large_records() {
        let kinesis = LocalKinesis::new(VirtualClock::starting_at(0), Faults::none());
        kinesis.create_stream("s", 1);
        let two_mib = vec![b'x'; 2 * 1024 * 1024];
        let refused = kinesis.put_record("s", "k", &two_mib).unwrap_err();
        assert!(
            refused.to_string().contains("ValidationException"),
            "{refused}"
        );
        assert!(kinesis
            .put_record("s", "k", &two_mib[..1000 * 1024])
            .is_ok());
        kinesis.set_max_record_size("s", 4096);
        assert!(kinesis.put_record("s", "k", &two_mib).is_ok());
        let five_mib = vec![b'x'; 5 * 1024 * 1024];
        assert!(kinesis.put_record("s", "k", &five_mib).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_trimmed_stream_keeps_its_positions_and_reads_on_from_them() {
        let kinesis = LocalKinesis::new(VirtualClock::starting_at(0), Faults::none());
        kinesis.create_stream("s", 1);
        for i in 0..3 {
            kinesis.put_record("s", "k", &[i]).unwrap();
        }
        let taken: Vec<u8> = kinesis.trim("s").iter().map(|r| r.data[0]).collect();
        assert_eq!(taken, [0, 1, 2]);
        assert!(kinesis.records("s").is_empty());
        assert_eq!(kinesis.shard_len("s", 0), 3, "positions stay");
        kinesis.put_record("s", "k", &[3]).unwrap();
        let (read, _) = kinesis.read("s", 0, 3, 10);
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].data[..], [3]);
        assert_eq!(
            kinesis.read("s", 0, 0, 10).0.len(),
            1,
            "a trimmed position reads on from the oldest kept"
        );
        assert_eq!(kinesis.position_at("s", 0, 0), 3);
    }
}
