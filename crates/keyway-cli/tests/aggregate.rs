//! `keyway aggregate` as a user runs it: JSON Lines files (one gzipped) in, each key's results on
//! standard output by key and window, the summary with the late and unreadable lines on standard
//! error.

use std::io::Write;
use std::process::Command;

const LINES: &str = r#"{"key":"a","v":1.5,"t":1767225600000,"pad":"x"}
{"key":"b","v":2,"t":1767225601000}
{"key":"a","v":-0.25,"t":1767225700000}
not json
{"key":"a","v":3,"t":1767225000000}
"#;

const MORE: &str = r#"{"key":"b","v":0.1,"t":"2026-01-01T00:01:45Z"}
{"key":"b","v":0.2,"t":1767225706000}
"#;

/// A folder of `run`'s own (tests run at once).
fn folder(run: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("keyway-aggregate-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs the command on the two files, written to a folder of `run`'s own.
fn aggregate(run: &str, args: &[&str]) -> (Vec<String>, String) {
    let dir = folder(run);
    let plain = dir.join("lines.jsonl");
    std::fs::write(&plain, LINES).unwrap();
    let zipped = dir.join("more.jsonl.gz");
    let mut encoder = flate2::write::GzEncoder::new(
        std::fs::File::create(&zipped).unwrap(),
        flate2::Compression::default(),
    );
    encoder.write_all(MORE.as_bytes()).unwrap();
    encoder.finish().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .arg("aggregate")
        .args(args)
        .arg(&plain)
        .arg(&zipped)
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    (stdout.lines().map(str::to_owned).collect(), stderr)
}

#[test]
fn running_totals_per_key_are_exact_and_the_unreadable_line_is_counted() {
    let (results, summary) = aggregate(
        "totals",
        &["--key", "/key", "--value", "/v", "--agg", "sum,min,max"],
    );
    assert_eq!(
        results,
        [
            r#"{"key":"a","count":3,"sum":4.25,"min":-0.25,"max":3}"#,
            r#"{"key":"b","count":3,"sum":2.3,"min":0.1,"max":2}"#,
        ]
    );
    assert!(summary.contains("7 lines"), "{summary}");
    assert!(summary.contains("1 dead letters (0 late)"), "{summary}");
}

#[test]
fn windows_close_on_the_lines_own_clock_and_a_line_for_a_closed_window_is_late() {
    let (results, summary) = aggregate(
        "windows",
        &[
            "--key",
            "/key",
            "--value",
            "/v",
            "--agg",
            "sum",
            "--window",
            "60",
            "--time",
            "/t",
            "--lateness",
            "10",
        ],
    );
    assert_eq!(
        results,
        [
            r#"{"key":"a","window_start":1767225600000,"count":1,"sum":1.5}"#,
            r#"{"key":"a","window_start":1767225660000,"count":1,"sum":-0.25}"#,
            r#"{"key":"b","window_start":1767225600000,"count":1,"sum":2}"#,
            r#"{"key":"b","window_start":1767225660000,"count":2,"sum":0.3}"#,
        ]
    );
    // The line ten minutes behind the first is late; the one that is no JSON, unreadable.
    assert!(summary.contains("1 dead letters (1 late)"), "{summary}");
}

#[test]
fn an_aggregate_that_needs_values_without_a_value_pointer_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["aggregate", "--key", "/key", "--agg", "mean", "/dev/null"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--agg mean: needs --value"));
}

#[test]
fn a_stream_split_over_the_cores_gives_the_results_of_one_shard() {
    let path = folder("shares").join("many.jsonl");
    let lines: String = (0..3_000)
        .map(|i| format!("{{\"key\":\"k{}\",\"v\":{}}}\n", (i * i) % 97, i % 13))
        .collect();
    std::fs::write(&path, lines).unwrap();
    let run = |shards: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_keyway"))
            .args([
                "aggregate",
                "--key",
                "/key",
                "--value",
                "/v",
                "--agg",
                "sum,max",
            ])
            .args(["--shards", shards])
            .arg(&path)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let one = run("1");
    assert_eq!(one.lines().count(), 97 - 48, "the squares modulo 97");
    // Eight shards are split into one share per core, each with an embedded runtime of its own.
    assert_eq!(run("8"), one);
}

#[test]
fn every_window_of_a_long_recording_closes_though_the_lines_fit_in_one_slice() {
    let path = folder("hours").join("hours.jsonl");
    // Three hours of lines, one a minute on each of two keys: 180 windows of a minute per key.
    let lines: String = (0..360)
        .map(|i| {
            let at = 1_767_225_600_000i64 + (i / 2) * 60_000;
            format!("{{\"key\":\"k{}\",\"t\":{at}}}\n", i % 2)
        })
        .collect();
    std::fs::write(&path, lines).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args([
            "aggregate",
            "--key",
            "/key",
            "--window",
            "60",
            "--time",
            "/t",
        ])
        .args(["--shards", "8"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let results = String::from_utf8(output.stdout).unwrap();
    assert_eq!(results.lines().count(), 360, "{results}");
    assert!(
        results.lines().all(|l| l.contains("\"count\":1}")),
        "{results}"
    );
    let summary = String::from_utf8(output.stderr).unwrap();
    assert!(summary.contains("0 dead letters (0 late)"), "{summary}");
}

#[test]
fn a_line_too_large_for_kinesis_is_dead_lettered_and_a_key_too_long_for_one_still_counts() {
    let long_key = "k".repeat(300);
    let lines = format!(
        "{{\"key\":\"a\",\"pad\":\"{}\"}}\n{{\"key\":\"a\",\"pad\":\"{}\"}}\n{{\"key\":\"{long_key}\"}}\n{{\"key\":\"{long_key}\"}}\n",
        "x".repeat(2 * 1024 * 1024),
        "x".repeat(10_000),
    );
    let path = folder("large").join("large.jsonl");
    std::fs::write(&path, lines).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["aggregate", "--key", "/key"])
        .arg(&path)
        .output()
        .unwrap();
    let summary = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "{summary}");
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        format!("{{\"key\":\"a\",\"count\":1}}\n{{\"key\":\"{long_key}\",\"count\":2}}\n")
    );
    assert!(summary.contains("line 1 has 2097"), "{summary}");
    assert!(summary.contains("4 lines"), "{summary}");
    assert!(summary.contains("1 dead letters (0 late)"), "{summary}");
}

/// Runs `keyway aggregate` in windows of a minute on `lines`, written to a file of `run`'s own.
fn windowed(run: &str, lines: &str) -> (String, String) {
    let path = folder(run).join("lines.jsonl");
    std::fs::write(&path, lines).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args([
            "aggregate",
            "--key",
            "/key",
            "--window",
            "60",
            "--time",
            "/t",
        ])
        .arg(&path)
        .output()
        .unwrap();
    let summary = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "{summary}");
    (String::from_utf8(output.stdout).unwrap(), summary)
}

/// The clock ran a day past `a`'s window in one go, and the results stream, which keeps a
/// record a day as Kinesis does, had dropped `a`'s result by the time it was read: the run
/// printed `b` alone, and said nothing of `a`.
#[test]
fn a_window_closed_more_than_a_day_before_the_newest_line_still_gives_its_result() {
    let (results, summary) = windowed(
        "days",
        "{\"key\":\"a\",\"t\":1767225600000}\n{\"key\":\"b\",\"t\":1767398400000}\n{\"key\":\"a\",\"t\":1767225601000}\n",
    );
    assert_eq!(
        results,
        "{\"key\":\"a\",\"window_start\":1767225600000,\"count\":2}\n\
         {\"key\":\"b\",\"window_start\":1767398400000,\"count\":1}\n",
        "{summary}"
    );
}

/// A line stamped in microseconds, or with a far-future sentinel, ran the clock toward it a
/// minute's sweep at a time, for ever; first in the file, it started the clock there, and every
/// other line was late. It is dead-lettered, and the others count.
#[test]
fn a_line_stamped_far_ahead_of_the_others_is_dead_lettered_and_the_others_count() {
    for (run, far) in [
        ("micros", "1767225600123000".to_owned()),
        ("sentinel", "\"9999-12-31T23:59:59Z\"".to_owned()),
    ] {
        let far_line = format!("{{\"key\":\"far\",\"t\":{far}}}\n");
        let one = "{\"key\":\"a\",\"t\":1767225600000}\n";
        let two = "{\"key\":\"a\",\"t\":1767225600000}\n{\"key\":\"a\",\"t\":1767225601000}\n";
        // The last of 20,001 lines is a slice of its own: the slice before judges it.
        let slice = "{\"key\":\"a\",\"t\":1767225601000}\n".repeat(19_999);
        for (lines, count) in [
            (format!("{far_line}{two}"), 2),
            (format!("{two}{far_line}"), 2),
            (format!("{one}{far_line}"), 1),
            (format!("{far_line}{one}"), 1),
            (format!("{one}{slice}{far_line}"), 20_000),
        ] {
            let started = std::time::Instant::now();
            let (results, summary) = windowed(run, &lines);
            assert_eq!(
                results,
                format!("{{\"key\":\"a\",\"window_start\":1767225600000,\"count\":{count}}}\n"),
                "{summary}"
            );
            assert!(summary.contains("1 dead letters (0 late)"), "{summary}");
            assert!(summary.contains("ahead"), "{summary}");
            assert!(started.elapsed() < std::time::Duration::from_secs(60));
        }
    }
}
