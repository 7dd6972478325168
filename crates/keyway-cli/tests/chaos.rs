//! `keyway chaos` as a user runs it: a variant of template.yaml made with `--set`, which runs
//! that wire their functions themselves refuse.

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
