//! `keyway filter` as a user runs it: subscription changes and events in files, deliveries on
//! standard output, refused subscriptions and the summary on standard error.

use std::process::Command;

use serde_json::Value;

const SUBSCRIPTIONS: &str = r#"{"at": 1767225600000, "op": "subscribe", "consumer": "live", "key": "sheet-1", "queue": "keyway-live_q"}
{"at": 1767225600000, "op": "subscribe_all", "consumer": "audit", "queue": "keyway-audit_q", "pattern": {"op": ["delete"]}}
{"at": 1767225605000, "op": "subscribe", "consumer": "live", "key": "sheet-2", "queue": "keyway-live_q", "pattern": {"op": [{"prefix": "up"}]}}
{"at": 1767225606000, "op": "subscribe", "consumer": "live", "key": "sheet-3", "queue": "keyway-live_other"}
{"at": 1767225607000, "op": "unsubscribe", "consumer": "live", "key": "sheet-1"}
not json
"#;

const EVENTS: &str = r#"{"at": 1767225601000, "event": {"id": 1, "key": "sheet-1", "op": "update"}}
{"at": 1767225601100, "event": {"id": 2, "key": "sheet-2", "op": "update"}}
{"at": 1767225601200, "event": {"id": 3, "key": "sheet-2", "op": "delete"}}
{"at": 1767225606500, "event": {"id": 4, "key": "sheet-2", "op": "update"}}
{"at": 1767225606600, "event": {"id": 5, "key": "sheet-1", "op": "upsert"}}
{"at": 1767225607000, "event": {"id": 6, "key": "sheet-1", "op": "update"}}
{"at": 1767225608000, "event": {"id": 7}}
"#;

#[test]
fn changes_take_effect_at_their_time_refusals_are_reported_by_line_and_deliveries_go_to_standard_output(
) {
    // In consumers' own policy tables (the default) and in the shared one alike.
    for mode in [None, Some("--shared-table")] {
        filters_the_files(mode);
    }
}

fn filters_the_files(mode: Option<&str>) {
    let dir = std::env::temp_dir().join(format!(
        "keyway-filter-{}-{}",
        std::process::id(),
        mode.is_some()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let subscriptions = write("subs.jsonl", SUBSCRIPTIONS);
    let events = write("events.jsonl", EVENTS);
    let queues = write(
        "queues.json",
        r#"{"live": ["keyway-live_q"], "audit": ["keyway-audit_q"]}"#,
    );
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .arg("filter")
        .arg("--subscriptions")
        .arg(&subscriptions)
        .arg("--events")
        .arg(&events)
        .arg("--queues")
        .arg(&queues)
        .args(mode)
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    let mut deliveries: Vec<(String, String, u64)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let d: Value = serde_json::from_str(line).unwrap();
            let text = |k: &str| d[k].as_str().unwrap().to_owned();
            (
                text("consumer"),
                text("queue"),
                d["event"]["id"].as_u64().unwrap(),
            )
        })
        .collect();
    deliveries.sort();
    // Event 2 came before live subscribed to sheet-2; event 6 at the time of the unsubscription.
    let expected = [
        ("audit", "keyway-audit_q", 3),
        ("live", "keyway-live_q", 1),
        ("live", "keyway-live_q", 4),
        ("live", "keyway-live_q", 5),
    ];
    let expected: Vec<(String, String, u64)> = expected
        .iter()
        .map(|(c, q, id)| (c.to_string(), q.to_string(), *id))
        .collect();
    assert_eq!(deliveries, expected);
    assert!(
        stderr.contains("subs.jsonl line 6: not a subscription change"),
        "{stderr}"
    );
    assert!(
        stderr.contains("line 4: subscription refused: queue: \"keyway-live_other\" is not registered to consumer \"live\""),
        "{stderr}"
    );
    assert!(stderr.contains("events 7  delivered 4"), "{stderr}");
    assert!(stderr.contains("data/key: missing"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
