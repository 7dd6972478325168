//! In-memory Kinesis: streams of N shards splitting the MD5 hash key space evenly, sequence
//! numbers growing per shard, PutRecords with ExplicitHashKey and the service's limits (1 MiB a
//! record, 500 records and 5 MiB a call), and optionally the per-shard write limit of 1,000
//! records or 1 MiB a second, answered with ProvisionedThroughputExceededException.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::faults::{Fault, Faults};
use super::meter::Meter;
use crate::adapters::kinesis::{
    KinesisApi, PutEntry, PutOutcome, PUT_RECORDS_MAX, PUT_RECORDS_MAX_BYTES, RECORD_MAX_BYTES,
};
use crate::domain::hash::{kinesis_hash_key, shard_for_hash};
use crate::ports::{Clock, SinkError};

/// A record as a shard stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    pub shard_id: String,
    pub sequence_number: String,
    pub partition_key: String,
    pub data: Vec<u8>,
    pub arrival_millis: i64,
}

/// A stream keeps records 24 hours unless its RetentionPeriodHours says longer.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Kinesis's per-shard write limit.
pub const SHARD_RECORDS_PER_SECOND: u32 = 1_000;
pub const SHARD_BYTES_PER_SECOND: usize = 1024 * 1024;

struct Shard {
    id: String,
    /// Shared with the readers: a record is never copied once written.
    records: Vec<Arc<StoredRecord>>,
    /// How many records were trimmed from the front: positions stay where they were.
    trimmed: usize,
    /// The second the write counters below are for, and what was written in it.
    second: i64,
    written_records: u32,
    written_bytes: usize,
}

struct Stream {
    arn: String,
    shards: Vec<Shard>,
    /// The largest record the stream takes: 1 MiB unless it opted into more (MaxRecordSizeInKiB).
    max_record_bytes: usize,
    /// How long the stream keeps a record (RetentionPeriodHours, 24 by default).
    retention: Duration,
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
        let shards = (0..shards.max(1))
            .map(|i| Shard {
                id: format!("shardId-{i:012}"),
                records: Vec::new(),
                trimmed: 0,
                second: 0,
                written_records: 0,
                written_bytes: 0,
            })
            .collect();
        self.streams.lock().expect("streams lock").insert(
            name.to_owned(),
            Stream {
                arn: arn.clone(),
                shards,
                max_record_bytes: RECORD_MAX_BYTES,
                retention: DEFAULT_RETENTION,
            },
        );
        arn
    }

    /// Sets how long the stream keeps a record (its RetentionPeriodHours).
    pub fn set_retention(&self, stream: &str, retention: Duration) {
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
            let cutoff = now - stream.retention.as_millis() as i64;
            for shard in &mut stream.shards {
                let old = shard.records.partition_point(|r| r.arrival_millis < cutoff);
                shard.records.drain(..old);
                shard.trimmed += old;
                expired += old;
            }
        }
        expired
    }

    /// UpdateMaxRecordSize: lets the stream take records of up to `kib` KiB (1,024 to 10,240;
    /// 1 MiB is every stream's default).
    pub fn set_max_record_size(&self, stream: &str, kib: usize) {
        if let Some(stream) = self.streams.lock().expect("streams lock").get_mut(stream) {
            stream.max_record_bytes = kib.clamp(1024, 10 * 1024) * 1024;
        }
    }

    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// The faults this service injected so far.
    pub fn faults_fired(&self) -> super::faults::FaultCounts {
        self.faults.fired()
    }

    pub fn stream_arn(&self, name: &str) -> Option<String> {
        self.streams
            .lock()
            .expect("streams lock")
            .get(name)
            .map(|s| s.arn.clone())
    }

    /// The shard ids of `stream`, in hash key order.
    pub fn shard_ids(&self, stream: &str) -> Vec<String> {
        let streams = self.streams.lock().expect("streams lock");
        streams
            .get(stream)
            .map(|s| s.shards.iter().map(|sh| sh.id.clone()).collect())
            .unwrap_or_default()
    }

    /// Every record of `stream`, shard by shard, each shard in sequence order.
    pub fn records(&self, stream: &str) -> Vec<StoredRecord> {
        let streams = self.streams.lock().expect("streams lock");
        streams
            .get(stream)
            .map(|s| {
                s.shards
                    .iter()
                    .flat_map(|sh| sh.records.iter().map(|r| StoredRecord::clone(r)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Takes every record `stream` holds now out of it, shard by shard, as its retention would
    /// drop them later; positions stay where they were. For a driver that reads a stream no
    /// mapping reads, or knows no mapping will read these records again (every mapping idle): a
    /// long run's memory then stays bounded.
    pub fn trim(&self, stream: &str) -> Vec<Arc<StoredRecord>> {
        let mut streams = self.streams.lock().expect("streams lock");
        let Some(stream) = streams.get_mut(stream) else {
            return Vec::new();
        };
        let mut taken = Vec::new();
        for shard in &mut stream.shards {
            shard.trimmed += shard.records.len();
            taken.append(&mut shard.records);
        }
        taken
    }

    /// Up to `max` records of one shard from position `from` (an index into the shard), as a
    /// shard iterator would return them; from the oldest kept when `from` was trimmed.
    pub fn read(
        &self,
        stream: &str,
        shard: usize,
        from: usize,
        max: usize,
    ) -> Vec<Arc<StoredRecord>> {
        self.with_shard(stream, shard, |trimmed, records| {
            let from = from.saturating_sub(trimmed);
            records.iter().skip(from).take(max).cloned().collect()
        })
    }

    /// The position after one shard's last record: how many it ever held.
    pub fn shard_len(&self, stream: &str, shard: usize) -> usize {
        self.with_shard(stream, shard, |trimmed, records| trimmed + records.len())
    }

    /// The position of the first record that arrived at or after `millis` (AT_TIMESTAMP).
    pub fn position_at(&self, stream: &str, shard: usize, millis: i64) -> usize {
        self.with_shard(stream, shard, |trimmed, records| {
            trimmed + records.partition_point(|r| r.arrival_millis < millis)
        })
    }

    /// `f` of one shard's trimmed count and kept records; of none when there is no such shard.
    fn with_shard<T>(
        &self,
        stream: &str,
        shard: usize,
        f: impl FnOnce(usize, &[Arc<StoredRecord>]) -> T,
    ) -> T {
        let streams = self.streams.lock().expect("streams lock");
        match streams.get(stream).and_then(|s| s.shards.get(shard)) {
            Some(shard) => f(shard.trimmed, &shard.records),
            None => f(0, &[]),
        }
    }

    /// Puts records as a careful producer does: one at a time, each retried until the stream takes
    /// it, so that throttling and injected failures never reorder a key's records. Returns each
    /// record's (shard id, sequence number).
    pub async fn put_in_order(
        &self,
        stream: &str,
        records: &[(String, Vec<u8>)],
    ) -> Result<Vec<(String, String)>, SinkError> {
        let routed: Vec<(&str, Option<u128>, &[u8])> = records
            .iter()
            .map(|(key, data)| (key.as_str(), None, data.as_slice()))
            .collect();
        self.put_routed_in_order(stream, &routed).await
    }

    /// `put_in_order` for records (partition key, explicit hash key, data) of which some are
    /// placed by an explicit hash key (`keyway::domain::salt::Partitioner::route`).
    pub async fn put_routed_in_order(
        &self,
        stream: &str,
        records: &[(&str, Option<u128>, &[u8])],
    ) -> Result<Vec<(String, String)>, SinkError> {
        let mut positions = Vec::with_capacity(records.len());
        for (key, hash, data) in records {
            let hash = hash.map(|h| h.to_string());
            loop {
                let entry = PutEntry {
                    partition_key: key,
                    data,
                    explicit_hash_key: hash.as_deref(),
                };
                match self.put_records(stream, std::slice::from_ref(&entry)).await {
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
            &[PutEntry {
                partition_key,
                data,
                explicit_hash_key: None,
            }],
        )?;
        Ok(outcomes.remove(0))
    }

    fn put(&self, stream: &str, entries: &[PutEntry<'_>]) -> Result<Vec<PutOutcome>, SinkError> {
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
            e.partition_key.is_empty()
                || e.partition_key.chars().count() > 256
                || e.data.len() + e.partition_key.len() > max_record
        }) {
            return Err(SinkError::Rejected(format!(
                "ValidationException: a record with a partition key of {} characters and {} bytes of data",
                bad.partition_key.chars().count(),
                bad.data.len()
            )));
        }
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
        let shard_count = target.shards.len() as u32;
        let mut next = self.next_sequence.lock().expect("sequence lock");
        let mut outcomes = Vec::with_capacity(entries.len());
        for entry in entries {
            let hash = match entry.explicit_hash_key {
                Some(text) => text.parse::<u128>().map_err(|_| {
                    SinkError::Rejected(format!(
                        "ValidationException: ExplicitHashKey {text:?} is not a 128-bit decimal"
                    ))
                })?,
                None => kinesis_hash_key(entry.partition_key),
            };
            let shard = &mut target.shards[shard_for_hash(hash, shard_count) as usize];
            let size = entry.data.len() + entry.partition_key.len();
            if shard.second != now.div_euclid(1000) {
                shard.second = now.div_euclid(1000);
                shard.written_records = 0;
                shard.written_bytes = 0;
            }
            let over_limit = self.write_limit.load(std::sync::atomic::Ordering::Relaxed)
                && (shard.written_records >= SHARD_RECORDS_PER_SECOND
                    || shard.written_bytes + size > SHARD_BYTES_PER_SECOND);
            if over_limit || self.faults.draw(Fault::PartialFailure) {
                outcomes.push(PutOutcome::Failed {
                    code: "ProvisionedThroughputExceededException".into(),
                    message: format!("Rate exceeded for shard {} in stream {stream}", shard.id),
                });
                continue;
            }
            shard.written_records += 1;
            shard.written_bytes += size;
            let sequence_number = format!("49{:054}", *next);
            *next += 1;
            shard.records.push(Arc::new(StoredRecord {
                shard_id: shard.id.clone(),
                sequence_number: sequence_number.clone(),
                partition_key: entry.partition_key.to_owned(),
                data: entry.data.to_vec(),
                arrival_millis: now,
            }));
            outcomes.push(PutOutcome::Written {
                shard_id: shard.id.clone(),
                sequence_number,
            });
        }
        Ok(outcomes)
    }
}

#[async_trait]
impl KinesisApi for LocalKinesis {
    async fn put_records(
        &self,
        stream: &str,
        entries: &[PutEntry<'_>],
    ) -> Result<Vec<PutOutcome>, SinkError> {
        // Accounts the whole call, metering included (see `Meter::busy`).
        let _busy = self.meter.busy();
        let outcome = self.put(stream, entries);
        self.meter.call("PutRecords", 0.0, 0.0).await;
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::services::clock::VirtualClock;

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
        let read = kinesis.read("s", 0, 3, 10);
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].data, [3]);
        assert_eq!(
            kinesis.read("s", 0, 0, 10).len(),
            1,
            "a trimmed position reads on from the oldest kept"
        );
        assert_eq!(kinesis.position_at("s", 0, 0), 3);
    }
}
