//! The adaptive hot-key registry under faults: the producer salts the keys the registry lists,
//! so a key turning hot is salted within seconds, without a deploy, and goes back once it cools,
//! each key counted exactly. (Keyed aggregation's run under every fault is `keyway_stack::chaos`'s,
//! in chaos.rs.)

use std::time::Duration;

use keyway_local::FaultPlan;

/// The largest shard's load over the mean, averaged over `seconds`.
fn mean_max_over_mean(seconds: &[&keyway_stack::adaptive::Second]) -> f64 {
    let spreads: Vec<f64> = seconds
        .iter()
        .map(|s| {
            let loads: Vec<f64> = s.shard_records.iter().map(|&n| n as f64).collect();
            keyway::domain::skew::max_over_mean(&loads)
        })
        .collect();
    spreads.iter().sum::<f64>() / spreads.len().max(1) as f64
}

#[tokio::test(start_paused = true)]
async fn under_faults_a_key_turning_hot_is_salted_from_the_registry_without_a_deploy_and_goes_back_when_it_cools(
) {
    use keyway_stack::adaptive::{run, Phase, Settings};
    let settings = Settings {
        phases: vec![
            Phase {
                seconds: 10,
                hot_share: 0.0,
            },
            Phase {
                seconds: 25,
                hot_share: 0.8,
            },
            Phase {
                seconds: 30,
                hot_share: 0.0,
            },
        ],
        rate: 400,
        keys: 40,
        buckets: 8,
        period_seconds: 2,
        refresh: Duration::from_secs(1),
        faults: FaultPlan::all(0.02, 11),
        seed: 5,
    };
    let outcome = run(&settings).await.unwrap();
    assert_eq!(outcome.counts, outcome.oracle, "each key counted exactly");

    let turns = outcome.turns(0.5).unwrap();
    let hot = turns.hot;
    let salted = turns.salted.expect("the hot key is salted");
    assert!(salted >= hot, "salted at {salted} s, while still cool");
    // Its period ends, the next report decides it, and the producer reads the list: at most two
    // periods and a refresh, and a period more for reports that faults held back.
    assert!(
        salted - hot <= 7,
        "salted {} s after turning hot",
        salted - hot
    );
    let cooled_from = turns.cooled;
    assert_eq!(cooled_from, hot + 25, "the hot phase's 25 seconds");
    let back = turns.back.expect("the key goes back");
    assert!(back >= cooled_from, "unsalted at {back} s while still hot");
    // Five cool periods of two seconds, then a decision and a read.
    assert!(
        back - cooled_from <= 16,
        "unsalted {} s after cooling",
        back - cooled_from
    );

    let unsalted: Vec<_> = outcome.seconds[hot..salted].iter().collect();
    let salted_seconds: Vec<_> = outcome.seconds[salted..cooled_from].iter().collect();
    let before = mean_max_over_mean(&unsalted);
    let after = mean_max_over_mean(&salted_seconds);
    println!(
        "salted {} s after turning hot, back {} s after cooling; busiest shard over the mean {before:.2} before, {after:.2} salted",
        salted - hot,
        back - cooled_from
    );
    assert!(before > 2.5, "one shard takes the hot key: {before:.2}");
    assert!(after < 1.3, "the buckets spread it: {after:.2}");
}
