//! Fuzzing on stable Rust: every decoder of untrusted input fed mutations of real-shaped seeds for
//! a bounded time, under `catch_unwind`. A decoder may refuse anything, saying why; it may not
//! panic. The decoders: Kinesis and DynamoDB Streams events (and a whole function's handler on
//! them), CloudTrail records, Debezium change events, filter patterns (parsed and matched),
//! subscriptions as policy items, JSON pointers, exact decimals, and the template reader of
//! `keyway local`.
//!
//! The seeds are the payloads in events/, the templates, and for CloudTrail and Debezium the
//! published samples (`KEYWAY_SAMPLES`) when the test command gives them. Mutations are byte
//! flips, insertions, deletions, repeats and splices, tokens that break parsers (deep nesting,
//! huge and odd numbers, NUL and lone surrogates, invalid UTF-8), and JSON-aware ones that swap a
//! value of the tree for one of another type. An input that panics is written to
//! `target/fuzz-crashes/` and the test fails naming it; each one found so far is kept as a
//! regression case below.
//!
//! `KEYWAY_FUZZ_SECONDS` is the time per decoder (2 s by default; the test command gives 10) and
//! `KEYWAY_FUZZ_SEED` the seed (a new one each run by default, printed so a failure can be
//! replayed).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The text of every file under `dir` with one of `endings`, recursively.
fn files(dir: &Path, endings: &[&str], out: &mut Vec<Vec<u8>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, endings, out);
        } else if endings.iter().any(|e| path.to_string_lossy().ends_with(e)) {
            if let Ok(bytes) = std::fs::read(&path) {
                out.push(bytes);
            }
        }
    }
}

/// The seeds under events/`subdirs` and, where the samples are given, `samples`/`sample_dirs`.
fn seeds(subdirs: &[&str], sample_dirs: &[&str]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for dir in subdirs {
        files(&root().join("events").join(dir), &[".json"], &mut out);
    }
    if let Ok(samples) = std::env::var("KEYWAY_SAMPLES") {
        for dir in sample_dirs {
            files(
                &Path::new(&samples).join(dir),
                &[".json", ".jsonl"],
                &mut out,
            );
        }
    }
    assert!(!out.is_empty(), "no seeds under {subdirs:?}");
    out
}

/// Tokens that break parsers.
const TOKENS: &[&[u8]] = &[
    b"null",
    b"[]",
    b"{}",
    b"\"\"",
    b"1e400",
    b"-0",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"0.0000000000000000000000001",
    b"\\u0000",
    b"\\ud800",
    b"\xff\xfe",
    b"\xc3\x28",
    b"\"Records\"",
    b"\"data\"",
    b"\"op\"",
    b"!Ref",
    b"Fn::GetAtt",
];

/// A random value of any JSON type, some of them hostile.
fn random_value(rng: &mut StdRng, depth: usize) -> Value {
    match rng.random_range(0..10) {
        0 => Value::Null,
        1 => Value::Bool(rng.random()),
        2 => json!(rng.random::<i64>()),
        3 => json!(rng.random::<u64>()),
        4 => json!(rng.random::<f64>() * 1e300),
        5 => Value::String("x".repeat(rng.random_range(0..64))),
        6 => Value::String(String::from_utf8_lossy(&[0xf0, 0x9f, 0x92, 0xa9]).into_owned()),
        7 if depth < 4 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        8 if depth < 4 => {
            let mut map = serde_json::Map::new();
            for _ in 0..rng.random_range(0..4) {
                map.insert(
                    format!("k{}", rng.random_range(0..5)),
                    random_value(rng, depth + 1),
                );
            }
            Value::Object(map)
        }
        _ => {
            // As deep as serde_json builds a value (it stops at 128): put anywhere inside a
            // document, the text is nested past that limit, which a decoder must refuse rather
            // than recurse into.
            let depth = rng.random_range(100..=127);
            serde_json::from_str(&format!("{}{}", "[".repeat(depth), "]".repeat(depth)))
                .expect("within serde_json's limit")
        }
    }
}

/// Swaps one node of `tree` (chosen by walking down at random) for a random value, or drops a
/// member of an object.
fn mutate_tree(node: &mut Value, rng: &mut StdRng) {
    match node {
        Value::Object(map) if !map.is_empty() && rng.random_bool(0.7) => {
            let i = rng.random_range(0..map.len());
            let key = map.keys().nth(i).cloned().expect("in range");
            if rng.random_bool(0.1) {
                map.remove(&key);
            } else if let Some(child) = map.get_mut(&key) {
                mutate_tree(child, rng);
            }
        }
        Value::Array(items) if !items.is_empty() && rng.random_bool(0.7) => {
            let i = rng.random_range(0..items.len());
            mutate_tree(&mut items[i], rng);
        }
        _ => *node = random_value(rng, 0),
    }
}

/// A mutation of `seed` (spliced with `other` now and then).
fn mutate(seed: &[u8], other: &[u8], rng: &mut StdRng) -> Vec<u8> {
    if rng.random_bool(0.3) {
        if let Ok(mut tree) = serde_json::from_slice::<Value>(seed) {
            for _ in 0..rng.random_range(1..4) {
                mutate_tree(&mut tree, rng);
            }
            return serde_json::to_vec(&tree).expect("a tree serializes");
        }
    }
    let mut data = seed.to_vec();
    for _ in 0..rng.random_range(1..6) {
        let at = rng.random_range(0..=data.len());
        match rng.random_range(0..7) {
            0 if !data.is_empty() => {
                let i = rng.random_range(0..data.len());
                data[i] ^= 1 << rng.random_range(0..8);
            }
            1 => data.insert(at, rng.random()),
            2 if !data.is_empty() => {
                let end = (at + rng.random_range(1..32)).min(data.len());
                data.drain(at.min(end)..end);
            }
            3 => {
                let token = TOKENS[rng.random_range(0..TOKENS.len())];
                data.splice(at..at, token.iter().copied());
            }
            4 if !data.is_empty() => {
                let end = (at + rng.random_range(1..64)).min(data.len());
                let piece = data[at.min(end)..end].to_vec();
                data.splice(at..at, piece);
            }
            5 if !other.is_empty() => {
                let from = rng.random_range(0..other.len());
                let end = (from + rng.random_range(1..256)).min(other.len());
                data.splice(at..at, other[from..end].iter().copied());
            }
            _ => data.truncate(at),
        }
    }
    data
}

fn budget() -> Duration {
    let seconds = std::env::var("KEYWAY_FUZZ_SECONDS").map_or(2.0, |s| s.parse().expect("seconds"));
    Duration::from_secs_f64(seconds)
}

fn seed() -> u64 {
    std::env::var("KEYWAY_FUZZ_SEED")
        .map(|s| s.parse().expect("a seed"))
        .unwrap_or_else(|_| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        })
}

/// Feeds `target` mutations of `seeds` for the budget; fails naming the first input that
/// panicked, written under target/fuzz-crashes/. Returns how many inputs it tried.
fn fuzz(name: &str, seeds: &[Vec<u8>], target: impl Fn(&[u8])) -> u64 {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let mut tried = 0u64;
    // The seeds themselves first: a decoder that panics on a real payload fails at once.
    let mut inputs: Box<dyn Iterator<Item = Vec<u8>>> = Box::new(seeds.iter().cloned());
    while started.elapsed() < budget() {
        let input = match inputs.next() {
            Some(input) => input,
            None => {
                inputs = Box::new(std::iter::empty());
                let a = &seeds[rng.random_range(0..seeds.len())];
                let b = &seeds[rng.random_range(0..seeds.len())];
                mutate(a, b, &mut rng)
            }
        };
        tried += 1;
        if catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
            let dir = root().join("target/fuzz-crashes");
            std::fs::create_dir_all(&dir).expect("the crash folder");
            let file = dir.join(format!("{name}-{seed}-{tried}.bin"));
            std::fs::write(&file, &input).expect("the crash input");
            panic!("{name} panicked on {} (seed {seed})", file.display());
        }
    }
    println!(
        "{name}: {tried} inputs in {:?} (seed {seed})",
        started.elapsed()
    );
    tried
}

fn text(input: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(input)
}

#[test]
fn kinesis_and_dynamodb_streams_events_never_panic_the_decoders() {
    let seeds = seeds(
        &[
            "keyed-counter",
            "kinesis",
            "dynamodb",
            "filter-policy-sync",
            "cdc-rekey",
        ],
        &["lambda"],
    );
    let tried = fuzz("stream-events", &seeds, |input| {
        let event = text(input);
        let _ = keyway::sources::kinesis::decode_event(&event);
        let _ = keyway::sources::dynamodb::decode_event(&event);
    });
    assert!(tried > 0);
}

/// The keyed counter's handler on embedded services, and a runtime to run it on.
fn counter() -> (
    keyway::lambda::StreamHandler<keyed_counter::KeyedCounter>,
    tokio::runtime::Runtime,
) {
    let services = keyway_local::LocalServices::new(1_767_225_600_000, Default::default());
    let (handler, _) = keyway_tests::keyed_counter_on(&services);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    (handler, runtime)
}

/// Runs `event` through `handler`, its answer or error dropped.
fn invoke(
    handler: &keyway::lambda::StreamHandler<keyed_counter::KeyedCounter>,
    runtime: &tokio::runtime::Runtime,
    event: &str,
) {
    use keyway::lambda::Handler;
    let invocation = keyway::lambda::Invocation {
        request_id: "fuzz".into(),
        deadline_millis: None,
    };
    let _ = runtime.block_on(handler.handle(event, &invocation));
}

#[test]
fn a_functions_handler_never_panics_on_any_event() {
    let seeds = seeds(&["keyed-counter", "kinesis", "dynamodb"], &["lambda"]);
    let (handler, runtime) = counter();
    fuzz("handler", &seeds, |input| {
        invoke(&handler, &runtime, &text(input))
    });
}

#[test]
fn cloudtrail_records_never_panic_the_reader() {
    let seeds = seeds(&["identity-enricher"], &["cloudtrail"]);
    let customers = identity_enricher::identity::CustomerMap::default();
    fuzz("cloudtrail", &seeds, |input| {
        if let Ok(value) = serde_json::from_slice::<Value>(input) {
            let records = match &value["Records"] {
                Value::Array(records) => records.clone(),
                _ => vec![value],
            };
            for record in records {
                if let Ok(read) = identity_enricher::cloudtrail::CloudTrailRecord::parse(record) {
                    let _ = read.partition_key(&customers);
                }
            }
        }
    });
}

#[test]
fn debezium_change_events_never_panic_the_decoder() {
    let seeds = seeds(&["cdc-rekey", "cdc-join"], &["debezium"]);
    fuzz("debezium", &seeds, |input| {
        let _ = keyway::domain::debezium::decode_record(input);
        if let Ok(value) = serde_json::from_slice::<Value>(input) {
            let _ = keyway::domain::debezium::decode(&value);
            let _ = cdc_join::spec::JoinSpec::parse(&text(input), cdc_join::spec::JoinKind::Inner);
            let _ = cdc_join::filter::Filter::parse(&text(input));
        }
    });
}

#[test]
fn filter_patterns_never_panic_parsing_or_matching() {
    use keyway::domain::pattern::{Dialect, Pattern};
    let seeds: Vec<Vec<u8>> = [
        r#"{"op": ["update", "delete"], "size": [{"numeric": [">", 0, "<=", 5]}]}"#,
        r#"{"$or": [{"a": [{"prefix": "x"}]}, {"b": [{"anything-but": [1, 2]}]}]}"#,
        r#"{"a": {"b": [{"exists": true}], "c": [{"suffix": {"equals-ignore-case": "Z"}}]}}"#,
        r#"{"tenant": [1600000000000000001], "x": [{"anything-but": {"prefix": "p"}}]}"#,
        r#"{"key": "sheet-1", "op": "update", "size": 7, "tags": ["a", {"b": 1}]}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let event = json!({"op": "update", "size": 3, "a": {"b": 1, "c": "xz"}, "tenant": 1});
    fuzz("patterns", &seeds, |input| {
        if let Ok(value) = serde_json::from_slice::<Value>(input) {
            for dialect in [Dialect::Sns, Dialect::EventBridge] {
                if let Ok(pattern) = Pattern::parse_in(&value, dialect) {
                    let _ = pattern.matches(&event);
                    let _ = pattern.matches(&value);
                }
            }
        }
    });
}

#[test]
fn policy_items_never_panic_the_subscription_reader() {
    use dynamic_filter::subscription::{QueueOwnership, Subscription};
    use keyway::domain::item::item_from_dynamodb_json;
    let seeds: Vec<Vec<u8>> = vec![json!({
        "consumer": {"S": "live"}, "subscription": {"S": "key#sheet-1"},
        "filterKey": {"S": "sheet-1"}, "queue": {"S": "keyway-live_events"},
        "pattern": {"S": "{\"op\": [\"update\"]}"}, "updatedAt": {"N": "1"}
    })
    .to_string()
    .into_bytes()];
    let ownership = QueueOwnership::default();
    fuzz("policy-items", &seeds, |input| {
        if let Ok(value) = serde_json::from_slice::<Value>(input) {
            if let Ok(item) = item_from_dynamodb_json(&value, "item") {
                let _ = Subscription::from_item(&item, &ownership);
            }
        }
    });
}

#[test]
fn json_pointers_and_exact_numbers_never_panic_on_any_text() {
    use keyway::domain::pointer::Pointer;
    let seeds = seeds(
        &["keyed-aggregate", "aggregate-merge", "keyed-counter"],
        &[],
    );
    let pointers: Vec<Pointer> = ["/key", "/a/0/b", "/value", "", "/~0~1"]
        .iter()
        .map(|p| Pointer::parse(p).unwrap())
        .collect();
    fuzz("pointers-and-numbers", &seeds, |input| {
        for pointer in &pointers {
            let _ = pointer.find(input);
        }
        let text = text(input);
        let _ = keyed_aggregate::exact::Exact::parse(&text);
        let _ = keyed_aggregate::exact::Sum::parse(&text);
        let _ = Pointer::parse(&text);
    });
}

#[test]
fn templates_never_panic_the_reader_of_keyway_local() {
    let mut seeds = Vec::new();
    for file in ["template.yaml", "consumer.yaml"] {
        seeds.push(std::fs::read(root().join(file)).unwrap());
    }
    fuzz("templates", &seeds, |input| {
        let _ = keyway_local::template::parse(&text(input));
    });
}

/// Inputs that panicked a decoder once: each must now be refused (or read) without a panic.
#[test]
fn the_inputs_that_once_panicked_a_decoder_no_longer_do() {
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    // A record nested past serde_json's depth, which the envelope took as raw text.
    for event in [deep.clone(), format!(r#"{{"Records": [{deep}]}}"#)] {
        let _ = keyway::sources::kinesis::decode_event(&event);
        let _ = keyway::sources::dynamodb::decode_event(&event);
    }
    let (handler, runtime) = counter();
    // A member the envelope skipped, nested past the depth a tree is built to.
    invoke(
        &handler,
        &runtime,
        &format!(r#"{{"batchItemFailures": {deep}}}"#),
    );
    // An arrival time past any clock, then one in time, for one key: its watermark's arrival
    // overflowed when added to.
    let record = |sequence: &str, arrival: &str| {
        format!(
            r#"{{"kinesis": {{"partitionKey": "user-1", "sequenceNumber": "{sequence}",
                "data": "eyJrZXkiOiJ1c2VyLTEifQ==", "approximateArrivalTimestamp": {arrival}}},
                "eventSource": "aws:kinesis", "eventID": "shardId-000000000000:{sequence}",
                "eventSourceARN": "arn:aws:kinesis:us-east-1:000000000000:stream/clicks"}}"#
        )
    };
    for arrival in ["1e300", "9223372036854775.807", "253402300800"] {
        let event = format!(
            r#"{{"Records": [{}, {}]}}"#,
            record("1", arrival),
            record("2", "1767225600.5")
        );
        invoke(&handler, &runtime, &event);
    }
}
