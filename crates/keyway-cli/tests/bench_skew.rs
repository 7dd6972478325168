//! `keyway bench skew` as CI runs it: the salted shard loads, the adaptive strategy (simulated
//! and through the hot-key registry) and the results through keyed aggregation against their
//! targets.

use std::process::Command;

#[test]
fn salting_a_key_with_most_of_the_events_meets_every_target_and_changes_no_result() {
    let output = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["bench", "skew", "--events", "20000", "--json"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(
        result["per_record"]["max_over_mean"].as_f64().unwrap() > 7.0,
        "{result}"
    );
    assert!(
        result["per_record"]["peak_wcu_per_second"]
            .as_u64()
            .unwrap()
            > 1_000,
        "{result}"
    );
    assert!(
        result["salted"]["max_over_mean"].as_f64().unwrap() <= 1.15,
        "{result}"
    );
    assert!(result["salted"]["cov"].as_f64().unwrap() < 0.1, "{result}");
    assert_eq!(result["results_equal_oracle"], true, "{result}");
    assert_eq!(result["adaptive_seconds_to_salt"], 1, "{result}");
    let registry = &result["registry"];
    assert_eq!(registry["counts_equal_oracle"], true, "{result}");
    // A period of 2 s to end, the next report to decide it, a second for the producer to read.
    assert!(
        registry["seconds_to_salt"].as_u64().unwrap() <= 5,
        "{result}"
    );
    assert!(registry["seconds_to_unsalt"].as_u64().is_some(), "{result}");
    assert_eq!(result["target_met"], true, "{result}");
}
