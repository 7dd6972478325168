//! `keyway ids` derives the ids the runtime gives outputs, so a consumer (or a test of a deployed
//! stack) can check them.

use std::io::Write;
use std::process::{Command, Stdio};

use keyway::domain::{Origin, OutputId, SequenceNumber};

#[test]
fn the_ids_command_derives_the_runtimes_output_ids_line_by_line() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .arg("ids")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input = concat!(
        r#"{"operator":"keyed-counter","sink":"counts","origin":"clicks/shardId-000000000001","sequence":"4959","index":0}"#,
        "\n",
        r#"{"operator":"keyed-counter","sink":"counts","origin":"clicks/shardId-000000000001","sequence":"4960"}"#,
        "\n"
    );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let ids: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let expected = |seq: &str| {
        OutputId::derive(
            "keyed-counter",
            "counts",
            &Origin("clicks/shardId-000000000001".into()),
            &SequenceNumber::parse(seq).unwrap(),
            0,
        )
        .to_string()
    };
    assert_eq!(ids, [expected("4959"), expected("4960")]);
}

#[test]
fn a_line_that_is_not_a_position_is_an_error_naming_it() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .arg("ids")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"operator\":\"x\"}\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("line 1"), "{err}");
}
