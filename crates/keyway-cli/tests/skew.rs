//! `keyway skew` as a user runs it: generated workloads and files of keys, the report as text
//! and as JSON, and the SVG chart.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The command's standard output, failing the test when it fails.
fn skew(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .arg("skew")
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "keyway skew {args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// The report as JSON.
fn report(args: &[&str]) -> Value {
    let text = skew(&[args, &["--json"]].concat());
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn number(value: &Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

fn shard_rates(outcome: &Value) -> Vec<f64> {
    outcome["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| number(&s["records_per_second"]))
        .collect()
}

/// A directory of the test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("keyway-skew-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const HOT_99: [&str; 4] = ["--shards", "8", "--hot-share", "0.99"];

#[test]
fn one_key_with_99_percent_of_the_events_loads_one_of_8_shards_and_is_named_hot() {
    let r = report(&HOT_99);
    let before = &r["before"];
    assert!(number(&before["cov"]) > 2.0, "{}", before["cov"]);
    let max_over_mean = number(&before["max_over_mean"]);
    assert!((7.8..=8.0).contains(&max_over_mean), "{max_over_mean}");
    assert_eq!(r["hot_keys"][0]["key"], "hot");
    assert_eq!(r["hot_keys"][0]["hot"], true);
    assert!(number(&r["hot_keys"][0]["share"]) > 0.98);
    assert_eq!(
        r["hot_keys"][1]["hot"], false,
        "no other key is near 5%: {}",
        r["hot_keys"]
    );
    let text = skew(&HOT_99);
    assert!(text.contains("  hot "), "{text}");
    assert!(
        text.contains(&format!("CoV {:.3}", number(&before["cov"]))),
        "{text}"
    );
    // The loaded shard's bar fills the width; the others barely show.
    assert!(text.contains(&"█".repeat(40)), "{text}");
}

#[test]
fn salting_every_key_over_32_buckets_spreads_the_99_percent_key_evenly_over_8_shards() {
    let r = report(&[&HOT_99[..], &["--strategy", "salt", "--buckets", "32"]].concat());
    let after = &r["after"];
    assert_eq!(after["strategy"], "salt");
    assert!(number(&after["max_over_mean"]) <= 1.15, "{after}");
    assert!(number(&after["cov"]) < 0.1, "{after}");
    assert!(number(&r["before"]["cov"]) > 2.0);
    // Hashing `hot#i` with MD5 instead places 32 buckets on 8 shards unevenly.
    let md5 = report(&[&HOT_99[..], &["--strategy", "salt", "--placement", "md5"]].concat());
    assert!(number(&md5["after"]["max_over_mean"]) > 1.15);
}

#[test]
fn sidetracking_the_hot_key_spreads_the_shards_as_salting_it_does() {
    let salt = report(&[&HOT_99[..], &["--strategy", "salt"]].concat());
    let sidetrack = report(&[&HOT_99[..], &["--strategy", "sidetrack", "--hot", "hot"]].concat());
    assert_eq!(sidetrack["after"]["label"], "sidetrack hot, 32 buckets");
    let (a, b) = (
        shard_rates(&salt["after"]),
        shard_rates(&sidetrack["after"]),
    );
    for (shard, (a, b)) in a.iter().zip(&b).enumerate() {
        assert!(
            (a - b).abs() / a < 0.02,
            "shard {shard}: {a} salted, {b} sidetracked"
        );
    }
    assert!(number(&sidetrack["after"]["cov"]) < 0.1);
    let spread = |r: &Value| number(&r["after"]["max_over_mean"]);
    assert!((spread(&salt) - spread(&sidetrack)).abs() < 0.02);
}

#[test]
fn adaptive_salting_takes_up_a_hot_key_within_two_simulated_seconds_of_its_arrival_and_says_when() {
    // Ten seconds at 20,000 events/s; from second 5 on, 99% of the events are `hot`.
    let args = [
        "--events",
        "200000",
        "--rate",
        "20000",
        "--hot-share",
        "0.99",
        "--hot-from",
        "5",
        "--strategy",
        "adaptive",
    ];
    let r = report(&args);
    let salted = r["after"]["salted"].as_array().unwrap();
    let hot = salted
        .iter()
        .find(|e| e["key"] == "hot")
        .unwrap_or_else(|| panic!("hot was never salted: {salted:?}"));
    let found = number(&hot["hot_in_second"]);
    let from = number(&hot["salted_from_second"]);
    assert!(found >= 5.0, "found hot before it came: {hot}");
    assert!(from <= 7.0, "salted from second {from}");
    assert!(
        number(&r["after"]["max_over_mean"]) < number(&r["before"]["max_over_mean"]) / 2.0,
        "{} against {}",
        r["after"]["max_over_mean"],
        r["before"]["max_over_mean"]
    );
    let text = skew(&args);
    let said = format!("`hot` turned hot in second {found}");
    assert!(text.contains(&said), "{text}");
    assert!(
        text.contains(&format!("salted from second {from}")),
        "{text}"
    );
}

#[test]
fn pre_aggregation_brings_the_hot_keys_partition_below_1000_wcu_a_second_where_a_write_a_record_exceeds_it(
) {
    let r = report(&[&HOT_99[..], &["--strategy", "pre-aggregate"]].concat());
    let (before, after) = (&r["before"], &r["after"]);
    assert!(number(&before["peak_wcu_per_second"]) > 1_000.0, "{before}");
    assert!(number(&before["partitions_over_limit"]) >= 1.0);
    assert!(number(&after["peak_wcu_per_second"]) < 1_000.0, "{after}");
    assert_eq!(after["partitions_over_limit"], 0);
    // Pre-aggregation is the reader's: the shards carry what they did.
    assert_eq!(shard_rates(before), shard_rates(after));
    let text = skew(&[&HOT_99[..], &["--strategy", "pre-aggregate"]].concat());
    assert!(
        text.contains("1 of 8 partitions over 1,000 WCU/s"),
        "{text}"
    );
    assert!(
        text.contains("0 of 8 partitions over 1,000 WCU/s"),
        "{text}"
    );
}

#[test]
fn a_shard_offered_more_than_1000_records_a_second_is_reported_throttled_and_the_others_are_not() {
    // 4,000 events/s, 90% on one key: about 3,600 a second on its shard, 50 on the others.
    let args = [
        "--events",
        "8000",
        "--rate",
        "4000",
        "--hot-share",
        "0.9",
        "--record-bytes",
        "100",
    ];
    let r = report(&args);
    let shards = r["before"]["shards"].as_array().unwrap();
    let throttled: Vec<&Value> = shards
        .iter()
        .filter(|s| number(&s["throttled_records"]) > 0.0)
        .collect();
    assert_eq!(throttled.len(), 1, "{shards:?}");
    assert!(number(&throttled[0]["records_per_second"]) > 1_000.0);
    let total = number(&r["before"]["throttled_records"]);
    let expected = 2.0 * (number(&throttled[0]["records_per_second"]) - 1_000.0);
    assert!(
        (total - expected).abs() <= 2.0,
        "{total} against {expected}"
    );
    let text = skew(&args);
    assert!(text.contains("on 1 of 8 shards"), "{text}");
    // Evenly spread, the same workload is throttled nowhere.
    let salted = report(&[&args[..], &["--strategy", "salt"]].concat());
    assert_eq!(salted["after"]["throttled_records"], 0);
}

#[test]
fn plot_writes_an_svg_with_a_series_of_bars_before_and_one_after_and_labelled_axes() {
    let dir = scratch("plot");
    let path = dir.join("shards.svg");
    let r = report(
        &[
            &HOT_99[..],
            &["--strategy", "salt", "--plot", path.to_str().unwrap()],
        ]
        .concat(),
    );
    assert_eq!(r["plot"], path.to_str().unwrap());
    let svg = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(svg.trim_start().starts_with("<svg"), "{svg:.200}");
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_balanced(&svg);
    for text in [
        "before: none",
        "after: salt, 32 buckets",
        "records/s",
        "shard",
        "keyway skew",
    ] {
        assert!(svg.contains(text), "no {text:?} in the SVG");
    }
    // The background, 8 bars a series, and a legend swatch for each series.
    assert!(svg.matches("<rect").count() >= 1 + 16 + 2, "{svg}");
}

/// Every element the SVG opens it closes, in order.
fn assert_balanced(svg: &str) {
    let mut open = Vec::new();
    for tag in svg.split('<').skip(1) {
        let tag = &tag[..tag.find('>').expect("a tag ends")];
        let name = |t: &str| {
            t.split(|c: char| c.is_whitespace() || c == '/')
                .next()
                .unwrap()
                .to_owned()
        };
        if let Some(closing) = tag.strip_prefix('/') {
            assert_eq!(open.pop(), Some(name(closing)), "at </{closing}>");
        } else if !tag.ends_with('/') && !tag.starts_with('?') && !tag.starts_with('!') {
            open.push(name(tag));
        }
    }
    assert!(open.is_empty(), "left open: {open:?}");
}

#[test]
fn a_json_lines_file_with_bad_lines_reports_how_many_and_the_first_with_its_line_and_field() {
    let dir = scratch("json");
    let path = dir.join("events.jsonl.gz");
    let lines = [
        r#"{"user": {"id": "alice"}, "n": 1}"#,
        r#"{"user": {"id": 42}, "n": 2}"#,
        r#"{"user": {"id": "alice"}, "n": 3"#,
        r#"{"user": {}, "n": 4}"#,
        "",
        r#"{"user": {"id": "bob"}, "n": 5}"#,
    ];
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(lines.join("\n").as_bytes()).unwrap();
    std::fs::write(&path, gz.finish().unwrap()).unwrap();
    let args = ["--json-lines", path.to_str().unwrap(), "--key", "/user/id"];
    let r = report(&args);
    let text = skew(&args);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(r["workload"]["events"], 3);
    assert_eq!(r["workload"]["distinct_keys"], 3, "alice, 42 and bob");
    assert_eq!(r["bad_input"]["count"], 2);
    let first = &r["bad_input"]["first"];
    assert_eq!(
        (&first["line"], &first["field"]),
        (&Value::from(3), &Value::from("/user/id"))
    );
    assert!(
        first["problem"].as_str().unwrap().starts_with("not JSON"),
        "{first}"
    );
    assert!(
        text.contains("bad input: 2 lines left out; the first, line 3: /user/id: not JSON"),
        "{text}"
    );
}

#[test]
fn a_file_of_partition_keys_is_simulated_key_by_key() {
    let dir = scratch("keys");
    let path = dir.join("keys.txt");
    let keys: String = (0..2_000).map(|i| format!("k{}\n", i % 2)).collect();
    std::fs::write(&path, keys).unwrap();
    let r = report(&["--partition-keys", path.to_str().unwrap(), "--rate", "1000"]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(r["workload"]["events"], 2_000);
    assert_eq!(r["workload"]["seconds"], 2);
    let records: f64 = r["before"]["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| number(&s["records"]))
        .sum();
    assert_eq!(records, 2_000.0);
    assert_eq!(r["hot_keys"][0]["share"], 0.5);
}
