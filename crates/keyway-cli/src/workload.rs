//! Generated workloads: batches of keyed-counter events over Zipf-distributed keys, as the
//! Kinesis event source mapping would deliver them (Lambda event JSON text).

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};

use keyway_local::mapping::events::{kinesis_event, KinesisEventRecord};

pub(crate) const BATCH_SIZE: usize = 500;
/// The keyed counter's benchmarks: 1,000 users, drawn from Zipf(1.1).
pub(crate) const KEYS: u64 = 1_000;
pub(crate) const EXPONENT: f64 = 1.1;
pub(crate) const STREAM_ARN: &str = "arn:aws:kinesis:us-east-1:123456789012:stream/clicks";
pub(crate) const SHARD_ID: &str = "shardId-000000000000";

/// `n` keys `user-1` ... drawn from Zipf(`exponent`) over `keys` distinct keys.
pub(crate) fn zipf_keys(n: usize, keys: u64, exponent: f64, seed: u64) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let zipf = Zipf::new(keys as f64, exponent).expect("valid Zipf parameters");
    (0..n)
        .map(|_| format!("user-{}", zipf.sample(&mut rng) as u64))
        .collect()
}

/// `batches` Lambda Kinesis events of `BATCH_SIZE` records, keys drawn from Zipf(`exponent`) over
/// `keys` distinct keys, with sequence numbers growing across batches.
pub(crate) fn zipf_batches(batches: usize, keys: u64, exponent: f64, seed: u64) -> Vec<String> {
    let mut keys = zipf_keys(batches * BATCH_SIZE, keys, exponent, seed).into_iter();
    let mut sequence: u64 = 0;
    (0..batches)
        .map(|_| {
            let records: Vec<(String, String, Vec<u8>)> = (0..BATCH_SIZE)
                .map(|_| {
                    let key = keys.next().expect("enough keys");
                    sequence += 1;
                    let data = format!(r#"{{"key":"{key}","amount":1}}"#).into_bytes();
                    (format!("4959{sequence:052}"), key, data)
                })
                .collect();
            let event = kinesis_event(
                STREAM_ARN,
                records.iter().map(|(seq, key, data)| KinesisEventRecord {
                    shard_id: SHARD_ID,
                    sequence_number: seq,
                    partition_key: key,
                    data,
                    arrival_millis: 1_767_225_600_000,
                }),
            );
            event.to_string()
        })
        .collect()
}
