//! Stable hashing for everything that is persisted or compared across processes.
//!
//! `std`'s `DefaultHasher` may change between Rust releases and is seeded per process, so it must
//! never decide anything that outlives a process: output ids, origins, partitions. SHA-256, MD5
//! and XXH3 are fixed by their specifications. XXH3-128 serves ids computed for every output, where
//! SHA-256 would cost more than the rest of emitting; its inputs (stream positions) are not chosen
//! by anyone who could aim for a collision.

use std::collections::HashMap;

use md5::{Digest as _, Md5};
use sha2::Sha256;

/// The first `hex_chars` hexadecimal digits of the SHA-256 of `parts` joined by a 0 byte, which can
/// appear in none of the parts we hash (strings from JSON), so distinct part lists never collide by
/// concatenation.
pub fn sha256_hex(parts: &[&[u8]], hex_chars: usize) -> String {
    let mut hasher = Sha256::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            hasher.update([0u8]);
        }
        hasher.update(part);
    }
    let mut out = hex(&hasher.finalize());
    out.truncate(hex_chars.min(64));
    out
}

/// The MD5 of `bytes` as 32 hexadecimal digits: what SQS answers as a message body's
/// `MD5OfMessageBody` and Lambda passes as `md5OfBody`.
pub fn md5_hex(bytes: &[u8]) -> String {
    hex(&Md5::digest(bytes))
}

/// XXH3-128 (seed 0) of `parts` joined by a 0 byte, as 32 hexadecimal digits. The parts are
/// joined in a buffer on the stack and hashed at once: the same digest as hashing them as a
/// stream, at a fraction of the cost (this runs for every output).
pub fn xxh3_128_hex(parts: &[&[u8]]) -> String {
    let len = parts.iter().map(|p| p.len() + 1).sum::<usize>();
    let mut stack = [0u8; 512];
    let mut heap = Vec::new();
    let buf: &mut [u8] = if len <= stack.len() {
        &mut stack[..len]
    } else {
        heap.resize(len, 0);
        &mut heap
    };
    let mut at = 0;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            at += 1; // the 0 byte, already there
        }
        buf[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    hex(&xxhash_rust::xxh3::xxh3_128(&buf[..at]).to_be_bytes())
}

fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    out
}

/// The longest partition key Kinesis takes, in Unicode characters.
pub const PARTITION_KEY_MAX_CHARS: usize = 256;

/// Whether Kinesis takes `key` as a partition key: 1 to 256 characters.
pub fn is_partition_key(key: &str) -> bool {
    !key.is_empty()
        && (key.len() <= PARTITION_KEY_MAX_CHARS || key.chars().count() <= PARTITION_KEY_MAX_CHARS)
}

/// The 128-bit hash key Kinesis assigns to a partition key: MD5 of its UTF-8 bytes, read as an
/// unsigned big-endian integer. A record goes to the shard whose hash key range contains it.
pub fn kinesis_hash_key(partition_key: &str) -> u128 {
    let digest = Md5::digest(partition_key.as_bytes());
    u128::from_be_bytes(digest.into())
}

/// Partition keys' MD5 hash keys, remembered: a stream's keys repeat, and MD5 is the most of a
/// record's hashing. Up to `HashKeys::MAX` keys, forgotten all at once when full. It keeps hash
/// keys, not shards, so that it stays right when a stream reshards.
#[derive(Default)]
pub struct HashKeys(HashMap<String, u128>);

impl HashKeys {
    /// The most keys remembered; once full, all are forgotten.
    pub const MAX: usize = 1 << 16;

    /// `kinesis_hash_key(partition_key)`.
    pub fn of(&mut self, partition_key: &str) -> u128 {
        if let Some(&hash) = self.0.get(partition_key) {
            return hash;
        }
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        let hash = kinesis_hash_key(partition_key);
        self.0.insert(partition_key.to_owned(), hash);
        hash
    }
}

/// The shard, among `shards` shards that split the hash key space evenly (as CreateStream does),
/// that owns `partition_key`.
pub fn kinesis_shard_index(partition_key: &str, shards: u32) -> u32 {
    shard_for_hash(kinesis_hash_key(partition_key), shards)
}

/// The shard owning hash key `hash` among `shards` even ranges of the 2^128 hash key space; the
/// last shard also takes the remainder.
pub fn shard_for_hash(hash: u128, shards: u32) -> u32 {
    assert!(shards > 0, "a stream has at least one shard");
    if shards == 1 {
        return 0;
    }
    let n = u128::from(shards);
    // floor(2^128 / n), computed without overflowing u128.
    let width = u128::MAX / n + (u128::MAX % n + 1) / n;
    (hash / width).min(n - 1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_hash_key_is_the_md5_one_also_after_the_memory_fills() {
        let mut hash_keys = HashKeys::default();
        for round in 0..2 {
            for n in 0..HashKeys::MAX + 10 {
                let key = format!("key-{n}");
                assert_eq!(hash_keys.of(&key), kinesis_hash_key(&key), "{key}, {round}");
            }
        }
        assert!(hash_keys.0.len() <= HashKeys::MAX);
    }

    #[test]
    fn parts_hashed_at_once_give_the_digest_of_the_stream_of_them() {
        let parts: [&[u8]; 3] = [b"operator", b"", &[7u8; 600]];
        let mut stream = xxhash_rust::xxh3::Xxh3::new();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                stream.update(&[0u8]);
            }
            stream.update(part);
        }
        let expected = hex(&stream.digest128().to_be_bytes());
        assert_eq!(xxh3_128_hex(&parts), expected, "beyond the stack buffer");
        assert_eq!(
            xxh3_128_hex(&parts[..2]),
            hex(&xxhash_rust::xxh3::xxh3_128(b"operator\0").to_be_bytes())
        );
    }

    #[test]
    fn sha256_of_known_input_matches_the_published_digest() {
        // SHA-256("abc") from FIPS 180-2, appendix B.1.
        assert_eq!(
            sha256_hex(&[b"abc"], 64),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn xxh3_of_known_input_matches_the_reference_implementation() {
        // XXH3_128bits("", 0) from the xxHash reference (xxhsum -H2 of an empty file).
        assert_eq!(xxh3_128_hex(&[b""]), "99aa06d3014798d86001c324468d497f");
    }

    #[test]
    fn joining_parts_with_a_separator_keeps_different_splits_apart() {
        assert_ne!(
            sha256_hex(&[b"ab", b"c"], 32),
            sha256_hex(&[b"a", b"bc"], 32)
        );
    }

    #[test]
    fn kinesis_hash_key_is_the_md5_of_the_partition_key() {
        // MD5("") = d41d8cd98f00b204e9800998ecf8427e (RFC 1321 test suite).
        assert_eq!(kinesis_hash_key(""), 0xd41d8cd98f00b204e9800998ecf8427e);
    }

    #[test]
    fn shard_index_splits_the_hash_space_evenly() {
        // MD5("") starts with 0xd4, which is in the last quarter of the space.
        assert_eq!(kinesis_shard_index("", 4), 3);
        assert_eq!(kinesis_shard_index("", 1), 0);
        assert_eq!(shard_for_hash(u128::MAX, 3), 2);
        assert_eq!(shard_for_hash(1u128 << 127, 2), 1);
        assert_eq!(shard_for_hash((1u128 << 127) - 1, 2), 0);
        let mut counts = [0u32; 4];
        for i in 0..4000 {
            counts[kinesis_shard_index(&format!("key-{i}"), 4) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (850..1150).contains(&c)),
            "{counts:?}"
        );
    }
}
