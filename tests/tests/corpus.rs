//! The published Lambda payloads in the shared sample corpus (documentation examples, runtime
//! fixtures, SAM CLI event templates): every Kinesis and DynamoDB Streams record decodes, or is
//! rejected naming its field; every recorded batch response has the shape keyway answers; and the
//! Kinesis events run through the keyed counter without failing their batch. And the published
//! Debezium events (MySQL and PostgreSQL, with and without the schema envelope) decode to the
//! changelog their operations say.
//!
//! The corpus lives outside the repository; `KEYWAY_SAMPLES` names its folder (.ci/run sets it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use keyed_counter::{KeyedCounter, COUNTS};
use keyway::domain::changelog::debezium_changes;
use keyway::domain::debezium::{self, DebeziumEvent, Row};
use keyway::domain::{RowChange, SequenceNumber};
use keyway::lambda::kinesis_response;
use keyway::sources::{dynamodb, kinesis};
use keyway::BatchReport;
use keyway::KeyedOperator as _;
use keyway_tests::harness::World;
use keyway_tests::samples::{self, corpus, json_files};
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
            "kinesis" => kinesis::decode_event(&event.to_string()).unwrap(),
            _ => dynamodb::decode_event(&event.to_string()).unwrap(),
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
                    let raw = r.raw.to_value();
                    let value = r.field.split('.').fold(&raw, |v, part| &v[part]);
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
        let decoded = kinesis::decode_event(&event.to_string()).unwrap();
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

/// The Debezium change events of the corpus, by file: each JSON value file (the repaired form of
/// what was published as invalid JSON), the NDJSON fixtures, and the Kinesis example's objects
/// written one after the other (its trailing "..." ends them). Key files are left out.
fn debezium_events(root: &Path) -> Vec<(PathBuf, Vec<Value>)> {
    let dir = root.join("debezium");
    let mut files = json_files(&dir);
    for sub in ["flink-fixtures", "docs-kinesis-example"] {
        for entry in std::fs::read_dir(dir.join(sub)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "txt") {
                files.push(path);
            }
        }
    }
    files
        .into_iter()
        .filter(|p| !p.to_string_lossy().contains("_key_"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let values: Vec<Value> = serde_json::Deserializer::from_str(&text)
                .into_iter::<Value>()
                .map_while(Result::ok)
                .collect();
            (path, values)
        })
        .collect()
}

/// The primary key (`id`) of each event, as its record key gives it.
fn keys_of(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|value| match debezium::decode(value).unwrap() {
            DebeziumEvent::Change(e) => {
                let row = e.after.as_ref().or(e.before.as_ref()).expect("a row");
                row["id"].to_string()
            }
            DebeziumEvent::Tombstone => String::new(),
        })
        .collect()
}

/// Applies `events` (of one table, each with its primary key) to a stored table through the
/// changelog, as a function keyed by primary key would; returns every step and the table at the
/// end.
fn replay_debezium(
    events: &[Value],
    keys: &[String],
) -> (Vec<RowChange<Row>>, BTreeMap<String, Row>) {
    let mut table: BTreeMap<String, Row> = BTreeMap::new();
    let mut steps = Vec::new();
    for (value, id) in events.iter().zip(keys) {
        let DebeziumEvent::Change(event) = debezium::decode(value).unwrap() else {
            continue;
        };
        let id = id.clone();
        let changes = debezium_changes(&event, table.get(&id));
        for change in &changes {
            match change {
                RowChange::Delete(_) => table.remove(&id),
                RowChange::Insert(row) => table.insert(id.clone(), row.clone()),
            };
        }
        steps.extend(changes);
    }
    (steps, table)
}

#[test]
fn every_published_debezium_event_decodes_to_the_operation_its_file_names() {
    let Some(root) = corpus() else { return };
    let files = debezium_events(&root);
    let mut decoded = 0;
    for (path, values) in &files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!values.is_empty(), "{name}: no JSON value");
        for value in values {
            let event = debezium::decode(value)
                .unwrap_or_else(|e| panic!("{name}: {}: {}", e.field, e.problem));
            decoded += 1;
            match (&event, name.split_once("op-")) {
                (DebeziumEvent::Change(event), Some((_, rest))) => {
                    assert_eq!(event.op.code(), &rest[..1], "{name}")
                }
                (DebeziumEvent::Tombstone, _) => assert!(name.contains("tombstone"), "{name}"),
                (DebeziumEvent::Change(event), None) => {
                    assert!(event.source.table.is_some(), "{name}: a table")
                }
            }
        }
    }
    assert!(decoded >= 40, "{decoded} events in {} files", files.len());
    // The keys, with and without their schema, name the primary key's column.
    for path in json_files(&root.join("debezium")) {
        if path.to_string_lossy().contains("_key_") {
            let key = debezium::decode_key(&samples::read(&path)).unwrap();
            assert!(
                key.contains_key("id") || key.contains_key("order_number"),
                "{}: {key:?}",
                path.display()
            );
        }
    }
}

#[test]
fn a_postgres_stream_without_before_images_changes_the_same_rows_as_with_them() {
    let Some(root) = corpus() else { return };
    let dir = root.join("debezium/flink-fixtures");
    let read = |name: &str| {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .collect::<Vec<_>>()
    };
    let full = read("debezium-postgres-data-schema-exclude.txt");
    let without = read("debezium-postgres-data-replica-identity.txt");
    assert_eq!(full.len(), without.len());
    // The delete carries no row at all: its record key (here, the same event's in the other
    // file) says which row went.
    let keys = keys_of(&full);
    let (full_steps, full_table) = replay_debezium(&full, &keys);
    let (steps, table) = replay_debezium(&without, &keys);
    // Each before image missing is the row stored: the deletes retract exactly what was inserted.
    assert_eq!(steps, full_steps);
    assert_eq!(table, full_table);
    // Nine snapshot reads and two creates, one delete: ten rows, each once.
    assert_eq!(table.len(), 10);
    let deletes = steps.iter().filter(|s| !s.is_insert()).count();
    assert_eq!(deletes, 5, "four updates and a delete");
}

#[test]
fn the_tutorials_row_is_read_updated_deleted_and_its_tombstone_changes_nothing() {
    let Some(root) = corpus() else { return };
    let dir = root.join("debezium/docs-tutorial-mysql");
    let events: Vec<Value> = [
        "02_value_snapshot-read_op-r.json",
        "04_value_update_op-u.repaired.json",
        "06_value_delete_op-d.repaired.json",
        "08_value_tombstone.json",
    ]
    .iter()
    .map(|name| samples::read(&dir.join(name)))
    .collect();
    let (steps, table) = replay_debezium(&events, &keys_of(&events));
    let names: Vec<(bool, &Value)> = steps
        .iter()
        .map(|s| (s.is_insert(), &s.row()["first_name"]))
        .collect();
    assert_eq!(
        names,
        [
            (true, &json!("Anne")),
            (false, &json!("Anne")),
            (true, &json!("Anne Marie")),
            (false, &json!("Anne Marie")),
        ]
    );
    assert!(table.is_empty());

    // PostgreSQL's update under REPLICA IDENTITY DEFAULT: its before image holds the key only.
    let update = samples::read(&root.join(
        "debezium/docs-connectors/postgresql_value_update_op-u_replica-identity-default.repaired.json",
    ));
    let DebeziumEvent::Change(update) = debezium::decode(&update).unwrap() else {
        panic!("a change");
    };
    assert_eq!(update.source.connector.as_deref(), Some("postgresql"));
    let stored = json!({"id": 1, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"});
    let stored = stored.as_object().unwrap();
    assert_eq!(
        debezium_changes(&update, Some(stored)),
        [
            RowChange::Delete(stored.clone()),
            RowChange::Insert(update.after.clone().unwrap())
        ]
    );
    assert_eq!(
        debezium_changes(&update, None),
        [RowChange::Insert(update.after.clone().unwrap())],
        "nothing stored, nothing guessed"
    );
}
