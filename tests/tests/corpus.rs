//! The published Lambda payloads in the shared sample corpus (documentation examples, runtime
//! fixtures, SAM CLI event templates): every Kinesis and DynamoDB Streams record decodes, or is
//! rejected naming its field; every recorded batch response has the shape keyway answers; and the
//! Kinesis events run through the keyed counter without failing their batch.
//!
//! The corpus lives outside the repository; `KEYWAY_SAMPLES` names its folder (.ci/run sets it).

use std::path::{Path, PathBuf};

use keyed_counter::{KeyedCounter, COUNTS};
use keyway::domain::SequenceNumber;
use keyway::lambda::kinesis_response;
use keyway::sources::{dynamodb, kinesis};
use keyway::BatchReport;
use keyway::KeyedOperator as _;
use keyway_tests::harness::World;
use keyway_tests::samples::{corpus, json_files};
use serde_json::{json, Value};

/// Events keyed by their source, single records wrapped as a one-record event.
fn stream_events(root: &Path) -> Vec<(PathBuf, &'static str, Value)> {
    let mut events = Vec::new();
    for path in json_files(&root.join("lambda")) {
        let value: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let source = value["Records"][0]["eventSource"]
            .as_str()
            .or_else(|| value["eventSource"].as_str());
        let event = if value.get("Records").is_some() {
            value.clone()
        } else {
            json!({ "Records": [value.clone()] })
        };
        match source {
            Some("aws:kinesis") => events.push((path, "kinesis", event)),
            Some("aws:dynamodb") => events.push((path, "dynamodb", event)),
            _ => {}
        }
    }
    events
}

/// SAM CLI event templates hold `{{{placeholders}}}`.
fn is_template(path: &Path) -> bool {
    path.to_string_lossy().ends_with(".template.json")
}

#[test]
fn every_published_stream_record_decodes_or_is_rejected_naming_its_field() {
    let Some(root) = corpus() else { return };
    let events = stream_events(&root);
    let (mut kinesis_records, mut dynamodb_records, mut rejected) = (0, 0, 0);
    for (path, source, event) in &events {
        let batch = match *source {
            "kinesis" => kinesis::decode_event(event.clone()).unwrap(),
            _ => dynamodb::decode_event(event.clone()).unwrap(),
        };
        for record in batch {
            match record {
                Ok(_) => {
                    if *source == "kinesis" {
                        kinesis_records += 1
                    } else {
                        dynamodb_records += 1
                    }
                }
                Err(r) => {
                    rejected += 1;
                    // A template's placeholder where a sequence number must be, or a record
                    // published without one.
                    let value = r.field.split('.').fold(&r.raw, |v, part| &v[part]);
                    let expected = (is_template(path)
                        && value.as_str().is_some_and(|s| s.contains("{{{")))
                        || (path
                            .ends_with("example-dynamodb-event-record-with-optional-fields.json")
                            && r.field == "dynamodb.SequenceNumber");
                    assert!(
                        expected,
                        "{}: unexpectedly rejected: {}: {}",
                        path.display(),
                        r.field,
                        r.problem
                    );
                    assert!(!r.field.is_empty() && !r.problem.is_empty());
                }
            }
        }
    }
    assert!(
        kinesis_records >= 8,
        "the corpus holds Kinesis records: {kinesis_records}"
    );
    assert!(
        dynamodb_records >= 12,
        "the corpus holds DynamoDB records: {dynamodb_records}"
    );
    assert!(
        rejected >= 2,
        "the Kinesis template and the record without a sequence number are rejected: {rejected}"
    );
}

#[test]
fn every_recorded_batch_response_has_the_shape_keyway_answers() {
    let Some(root) = corpus() else { return };
    let mut checked = 0;
    for path in json_files(&root.join("lambda")) {
        let value: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let Some(failures) = value.get("batchItemFailures").and_then(Value::as_array) else {
            continue;
        };
        let Some(id) = failures.first().and_then(|f| f["itemIdentifier"].as_str()) else {
            continue;
        };
        let Ok(sequence) = SequenceNumber::parse(id) else {
            continue;
        }; // SQS message ids, placeholders
        let ours = kinesis_response(&BatchReport {
            failed_from: Some(sequence),
            ..Default::default()
        });
        assert_eq!(
            serde_json::to_value(ours).unwrap()["batchItemFailures"],
            json!([{ "itemIdentifier": id }]),
            "{}",
            path.display()
        );
        checked += 1;
    }
    assert!(
        checked >= 2,
        "responses naming a sequence number were checked: {checked}"
    );
}

#[tokio::test]
async fn published_kinesis_events_never_fail_a_batch_of_the_keyed_counter() {
    let Some(root) = corpus() else { return };
    for (path, source, event) in stream_events(&root) {
        if source != "kinesis" || is_template(&path) {
            continue;
        }
        let world = World::new(&[COUNTS.name]);
        let executor = world.executor(KeyedCounter);
        // What each record must come to, from the record alone: counted if it decodes into the
        // counter's input, dead-lettered otherwise.
        let decoded = kinesis::decode_event(event.clone()).unwrap();
        let counted = decoded
            .iter()
            .filter(|r| r.as_ref().is_ok_and(|r| KeyedCounter.decode(r).is_ok()))
            .count();
        let report = executor.run(decoded).await;
        assert_eq!(report.failed_from, None, "{}", path.display());
        assert_eq!(
            (report.applied, report.dead_lettered),
            (counted, report.records - counted),
            "{}",
            path.display()
        );
        assert_eq!(world.dead_letters().len(), report.records - counted);
    }
}
