//! `keyway chaos` as a user runs it: a variant of template.yaml made with `--set`, which runs
//! that wire their functions themselves refuse, but for the variable the CDC join's run sets on
//! the function it wires.

use std::process::{Command, Output};

fn keyway(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(args)
        .output()
        .expect("the keyway command runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn set_changes_a_variable_of_a_run_that_deploys_the_template_and_is_refused_elsewhere() {
    let latest = "KeyedCounterFunction.COUNTS_EMIT=latest";
    let out = keyway(&["chaos", "counter", "--events", "20000", "--set", latest]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(text.contains("latest counts only"), "{text}");

    let out = keyway(&["chaos", "filter", "--events", "100", "--set", latest]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--set"), "{}", stderr(&out));
    let out = keyway(&["chaos", "cdc", "--events", "100", "--set", latest]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("BEFORE_IMAGES only"),
        "{}",
        stderr(&out)
    );

    let out = keyway(&["chaos", "counter", "--set", "KeyedCounterFunction"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not Function.NAME=value"),
        "{}",
        stderr(&out)
    );

    let out = keyway(&[
        "chaos",
        "counter",
        "--events",
        "100",
        "--set",
        "KeyedCounterFunction.NOPE=1",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("NOPE"), "{}", stderr(&out));
}

#[test]
fn the_cdc_joins_run_takes_the_rekeys_before_images_and_holds_the_join_to_its_oracle_storing_no_row(
) {
    // Without faults: the chaos test of tests/ runs it under every fault, with enough changes
    // for each kind to fire.
    let always = "CdcRekeyFunction.BEFORE_IMAGES=always";
    let out = keyway(&[
        "chaos",
        "cdc",
        "--events",
        "3000",
        "--fault-rate",
        "0",
        "--set",
        always,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(text.contains("the re-key stores no row"), "{text}");

    let wrong = "CdcRekeyFunction.BEFORE_IMAGES=full";
    let out = keyway(&["chaos", "cdc", "--events", "100", "--set", wrong]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("BEFORE_IMAGES"), "{}", stderr(&out));
}
