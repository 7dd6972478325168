//! The workload `keyway skew` simulates. Generated (`--events` over `--keys` keys drawn from
//! Zipf(`--zipf`), and, from simulated second `--hot-from` on, an exact `--hot-share` of the
//! events on the one key `hot`), or read from a file: `--partition-keys FILE`, one key a line, or
//! `--json-lines FILE --key POINTER`, the key at a JSON pointer of each line (a string, or a
//! number's text), gzipped or not. A record's data is `--record-bytes` (a JSON line's own
//! length). A line that gives no key (not JSON, nothing or no string or number at the pointer, an
//! empty key or one longer than Kinesis's 256 characters) is left out, counted and the first one
//! reported.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use keyway::domain::pointer::{string_of, Pointer, SyntaxError};
use serde::Serialize;

use super::render::thousands;
use super::Args;
use crate::error::CliError;
use crate::workload::zipf_keys;
use keyway::domain::hash::{is_partition_key, PARTITION_KEY_MAX_CHARS};

/// The key a generated workload's hot share goes to.
pub(crate) const HOT_KEY: &str = "hot";

/// One event: its key and the bytes of its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Event {
    pub key: String,
    pub bytes: u64,
}

/// The first line that gave no key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Problem {
    pub line: u64,
    pub field: String,
    pub problem: String,
}

/// Lines that gave no key: how many, and the first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct BadInput {
    pub count: u64,
    pub first: Option<Problem>,
}

impl BadInput {
    fn add(&mut self, line: u64, field: &str, problem: &KeyProblem) {
        self.count += 1;
        self.first.get_or_insert_with(|| Problem {
            line,
            field: field.to_owned(),
            problem: problem.to_string(),
        });
    }
}

/// The events to simulate and where they came from.
#[derive(Clone, Debug)]
pub(crate) struct Workload {
    pub source: String,
    pub events: Vec<Event>,
    pub bad: BadInput,
}

pub(super) fn load(options: &Args) -> Result<Workload, CliError> {
    if let Some(path) = &options.partition_keys {
        let (events, bad) = read_partition_keys(open(path)?, options.record_bytes)
            .map_err(CliError::file(&path))?;
        return Ok(Workload {
            source: path.display().to_string(),
            events,
            bad,
        });
    }
    if let (Some(path), Some(key)) = (&options.json_lines, &options.key) {
        let pointer = Pointer::parse(key).map_err(|e| CliError::option("--key", e))?;
        let (events, bad) =
            read_json_lines(open(path)?, &pointer).map_err(CliError::file(&path))?;
        return Ok(Workload {
            source: path.display().to_string(),
            events,
            bad,
        });
    }
    if !(0.0..=1.0).contains(&options.hot_share) {
        return Err(CliError::option("--hot-share", "must be between 0 and 1"));
    }
    if options.keys == 0 || !(options.zipf >= 0.0 && options.zipf.is_finite()) {
        return Err(CliError::option(
            "--keys",
            "must be at least 1 and --zipf at least 0",
        ));
    }
    let hot_from_event = options.hot_from.saturating_mul(options.rate.max(1));
    let keys = generated_keys(
        options,
        usize::try_from(hot_from_event).unwrap_or(usize::MAX),
    );
    let hot = if options.hot_share > 0.0 {
        format!(
            ", {}% on `{HOT_KEY}` from second {}",
            options.hot_share * 100.0,
            options.hot_from
        )
    } else {
        String::new()
    };
    Ok(Workload {
        source: format!(
            "generated: {} keys, Zipf {}{hot}, seed {}",
            thousands(options.keys),
            options.zipf,
            options.seed
        ),
        events: keys
            .into_iter()
            .map(|key| Event {
                key,
                bytes: options.record_bytes,
            })
            .collect(),
        bad: BadInput::default(),
    })
}

/// The generated keys: Zipf draws, of which an exact `hot_share` from event `hot_from_event` on
/// are replaced by the hot key, spread evenly (the `j`-th event since then is hot when
/// `floor((j + 1) * share)` passes `floor(j * share)`), so the share holds in every second.
fn generated_keys(options: &Args, hot_from_event: usize) -> Vec<String> {
    let mut keys = zipf_keys(options.events, options.keys, options.zipf, options.seed);
    if options.hot_share > 0.0 {
        for (j, key) in keys.iter_mut().skip(hot_from_event).enumerate() {
            let (before, after) = (
                j as f64 * options.hot_share,
                (j + 1) as f64 * options.hot_share,
            );
            if after.floor() > before.floor() {
                *key = HOT_KEY.to_owned();
            }
        }
    }
    keys
}

/// The file's lines, decompressed when it is gzip (concatenated members read as one).
fn open(path: &Path) -> Result<Box<dyn BufRead>, CliError> {
    let failed = |e: std::io::Error| CliError::from(format!("{}: {e}", path.display()));
    let mut file = BufReader::new(File::open(path).map_err(failed)?);
    let gzip = file.fill_buf().map_err(failed)?.starts_with(&[0x1f, 0x8b]);
    Ok(if gzip {
        Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(file)))
    } else {
        Box::new(file)
    })
}

/// Each line of `reader` with its number, without its line ending; blank lines are skipped.
fn for_each_line(
    mut reader: impl BufRead,
    mut each: impl FnMut(u64, &[u8]),
) -> Result<(), std::io::Error> {
    let mut buf = Vec::new();
    let mut number = 0;
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            return Ok(());
        }
        number += 1;
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if !line.iter().all(u8::is_ascii_whitespace) {
            each(number, line);
        }
    }
}

/// Why a line gives no partition key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyProblem {
    NotUtf8 { valid_up_to: usize },
    NotJson(SyntaxError),
    Missing,
    NotStringOrNumber,
    Empty,
    TooLong { chars: usize },
}

impl std::fmt::Display for KeyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyProblem::NotUtf8 { valid_up_to } => write!(f, "not UTF-8 at byte {valid_up_to}"),
            KeyProblem::NotJson(e) => write!(f, "{e}"),
            KeyProblem::Missing => f.write_str("no value at the pointer"),
            KeyProblem::NotStringOrNumber => f.write_str("neither a string nor a number"),
            KeyProblem::Empty => f.write_str("empty partition key"),
            KeyProblem::TooLong { chars } => write!(
                f,
                "partition key of {chars} characters, more than Kinesis's {PARTITION_KEY_MAX_CHARS}"
            ),
        }
    }
}

/// `key` as a partition key, unless Kinesis would refuse it.
fn partition_key(key: &str) -> Result<&str, KeyProblem> {
    match key {
        "" => Err(KeyProblem::Empty),
        key if is_partition_key(key) => Ok(key),
        key => Err(KeyProblem::TooLong {
            chars: key.chars().count(),
        }),
    }
}

/// One partition key a line, each record of `record_bytes`.
pub(crate) fn read_partition_keys(
    reader: impl BufRead,
    record_bytes: u64,
) -> Result<(Vec<Event>, BadInput), std::io::Error> {
    let (mut events, mut bad) = (Vec::new(), BadInput::default());
    for_each_line(reader, |number, line| {
        let key = std::str::from_utf8(line)
            .map_err(|e| KeyProblem::NotUtf8 {
                valid_up_to: e.valid_up_to(),
            })
            .and_then(partition_key);
        match key {
            Ok(key) => events.push(Event {
                key: key.to_owned(),
                bytes: record_bytes,
            }),
            Err(why) => bad.add(number, "partition key", &why),
        }
    })?;
    Ok((events, bad))
}

/// A JSON event a line, keyed by the string or number at `pointer`, of the line's own length.
pub(crate) fn read_json_lines(
    reader: impl BufRead,
    pointer: &Pointer,
) -> Result<(Vec<Event>, BadInput), std::io::Error> {
    let (mut events, mut bad) = (Vec::new(), BadInput::default());
    for_each_line(reader, |number, line| match key_of_line(line, pointer) {
        Ok(key) => events.push(Event {
            key,
            bytes: line.len() as u64,
        }),
        Err(why) => bad.add(number, pointer.as_str(), &why),
    })?;
    Ok((events, bad))
}

/// The key of one JSON line, or what keeps it from having one.
pub(crate) fn key_of_line(line: &[u8], pointer: &Pointer) -> Result<String, KeyProblem> {
    let raw = pointer
        .find(line)
        .map_err(KeyProblem::NotJson)?
        .ok_or(KeyProblem::Missing)?;
    let key = match string_of(raw) {
        Some(text) => text,
        None if matches!(raw.first(), Some(b'-' | b'0'..=b'9')) => String::from_utf8_lossy(raw),
        None => return Err(KeyProblem::NotStringOrNumber),
    };
    partition_key(&key).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skew::{Placement, StrategyName};

    #[test]
    fn the_exact_hot_share_goes_to_the_hot_key_from_its_second_on() {
        let options = Args {
            events: 4_000,
            hot_share: 0.25,
            rate: 1_000,
            ..options()
        };
        let keys = generated_keys(&options, 2_000);
        assert!(keys[..2_000].iter().all(|k| k != HOT_KEY));
        for second in keys[2_000..].chunks(1_000) {
            assert_eq!(second.iter().filter(|k| *k == HOT_KEY).count(), 250);
        }
    }

    fn options() -> Args {
        Args {
            events: 100_000,
            keys: 1_000,
            zipf: 1.0,
            hot_share: 0.0,
            hot_from: 0,
            seed: 42,
            rate: 50_000,
            record_bytes: 1_024,
            partition_keys: None,
            json_lines: None,
            key: None,
            shards: 8,
            partitions: None,
            strategy: StrategyName::None,
            buckets: 32,
            hot: Vec::new(),
            placement: Placement::Spread,
            heat_share: 0.05,
            cool_share: 0.01,
            cool_seconds: 5,
            batch_size: 500,
            plot: None,
            json: false,
        }
    }

    #[test]
    fn a_json_line_is_keyed_by_a_string_or_a_number_and_anything_else_is_a_problem() {
        let pointer = Pointer::parse("/user/id").unwrap();
        let key = |line: &str| key_of_line(line.as_bytes(), &pointer);
        assert_eq!(key(r#"{"user": {"id": "u-1"}}"#), Ok("u-1".into()));
        assert_eq!(key(r#"{"user": {"id": 42}}"#), Ok("42".into()));
        assert_eq!(key(r#"{"user": {"id": "a\"b"}}"#), Ok("a\"b".into()));
        assert_eq!(key(r#"{"user": {}}"#), Err(KeyProblem::Missing));
        assert_eq!(
            key(r#"{"user": {"id": [1]}}"#),
            Err(KeyProblem::NotStringOrNumber)
        );
        assert_eq!(key(r#"{"user": {"id": ""}}"#), Err(KeyProblem::Empty));
        let broken = key("{\"user\": ").unwrap_err();
        assert!(matches!(broken, KeyProblem::NotJson(_)), "{broken:?}");
        assert!(
            broken.to_string().starts_with("not JSON at byte"),
            "{broken}"
        );
        let long = format!(r#"{{"user": {{"id": "{}"}}}}"#, "x".repeat(257));
        assert_eq!(key(&long), Err(KeyProblem::TooLong { chars: 257 }));
    }

    #[test]
    fn bad_lines_are_counted_and_the_first_is_kept_with_its_number() {
        let text = "{\"k\": \"a\"}\n\n{\"k\": true}\nnot json\n{\"k\": \"b\"}\n";
        let pointer = Pointer::parse("/k").unwrap();
        let (events, bad) = read_json_lines(text.as_bytes(), &pointer).unwrap();
        let keys: Vec<&str> = events.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(events[0].bytes, 10, "a JSON line's record is the line");
        assert_eq!(bad.count, 2);
        let first = bad.first.unwrap();
        assert_eq!((first.line, first.field.as_str()), (3, "/k"));
        assert_eq!(first.problem, "neither a string nor a number");
        let long = "x".repeat(257);
        let (events, bad) = read_partition_keys(format!("a\r\n{long}\nb\n").as_bytes(), 7).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!((bad.count, bad.first.unwrap().line), (1, 2));
    }
}
