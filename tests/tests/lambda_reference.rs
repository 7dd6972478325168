//! The event source mapping emulator compared with what Lambda is published to send and accept,
//! rather than with one reading of the documentation: the Kinesis and DynamoDB Streams payloads in
//! the shared sample corpus (Lambda Developer Guide, aws-lambda-rust-runtime, Powertools, SAM CLI),
//! the documented on-failure destination records, and the published partial batch responses.
//!
//! Fields are compared by path and JSON type; the user data inside `Keys`, `NewImage` and
//! `OldImage` counts as one field. The corpus lives outside the repository (see
//! `keyway_tests::samples`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keyway::adapters::kinesis::PutOutcome;
use keyway::domain::{AttrValue, Item};
use keyway::lambda::{FunctionError, Handler, Invocation, Response};
use keyway_local::{
    FaultPlan, KeySchema, LocalRuntime, LocalServices, MappingSettings, MappingSource,
};
use keyway_tests::samples::{corpus, json_files, read};
use serde_json::{json, Value};

const EPOCH: i64 = 1_767_225_600_000;

type Fields = BTreeMap<String, &'static str>;

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Each field of a payload, by path, with its JSON type.
fn fields(v: &Value) -> Fields {
    fn walk(v: &Value, path: &str, out: &mut Fields) {
        out.insert(path.to_owned(), kind(v));
        let user_data = ["Keys", "NewImage", "OldImage"]
            .iter()
            .any(|k| path.ends_with(&format!(".{k}")));
        match v {
            Value::Object(map) if !user_data => {
                for (k, child) in map {
                    walk(child, &format!("{path}.{k}"), out);
                }
            }
            Value::Array(items) => {
                for child in items {
                    walk(child, &format!("{path}[]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Fields::new();
    walk(v, "", &mut out);
    out
}

/// The published records of one event source, with the file each came from.
fn published_records(root: &Path, source: &str) -> Vec<(String, Value)> {
    let mut records = Vec::new();
    for path in json_files(&root.join("lambda")) {
        let value = read(&path);
        let Some(items) = value["Records"].as_array() else {
            continue;
        };
        let name = path.strip_prefix(root).unwrap().display().to_string();
        records.extend(
            items
                .iter()
                .filter(|r| r["eventSource"] == source)
                .map(|r| (name.clone(), r.clone())),
        );
    }
    assert!(
        records.len() >= 3,
        "the corpus holds published {source} records"
    );
    records
}

/// The emulator's record must send only fields some published record has, with the type they
/// have there, and every field that all published records of its kind have.
fn assert_fields_match(ours: &Value, published: &[&(String, Value)], what: &str) {
    let ours = fields(ours);
    let mut known: BTreeMap<String, BTreeSet<&'static str>> = BTreeMap::new();
    for (_, record) in published {
        for (path, kind) in fields(record) {
            known.entry(path).or_default().insert(kind);
        }
    }
    for (path, kind) in &ours {
        let types = known.get(path).unwrap_or_else(|| {
            panic!("{what}: the emulator sends {path}, which no published record has")
        });
        assert!(
            types.contains(kind),
            "{what}: the emulator sends {path} as {kind}, published records as {types:?}"
        );
    }
    let everywhere: BTreeSet<String> = known
        .keys()
        .filter(|path| published.iter().all(|(_, r)| fields(r).contains_key(*path)))
        .cloned()
        .collect();
    for path in everywhere {
        assert!(
            ours.contains_key(&path),
            "{what}: every published record has {path}, the emulator's has not"
        );
    }
}

type Answer = dyn Fn(usize, &Value) -> Result<Value, FunctionError> + Send + Sync;

/// A handler that records each event and answers with `answer(invocation, event)`.
struct Recorder {
    events: Mutex<Vec<Value>>,
    answer: Box<Answer>,
}

impl Recorder {
    fn new(
        answer: impl Fn(usize, &Value) -> Result<Value, FunctionError> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            events: Mutex::default(),
            answer: Box::new(answer),
        })
    }

    fn events(&self) -> Vec<Value> {
        self.events.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Handler for Recorder {
    async fn handle(&self, event: &str, _: &Invocation) -> Result<Response, FunctionError> {
        let event: Value = serde_json::from_str(event).expect("the event is JSON");
        let index = {
            let mut events = self.events.lock().unwrap();
            events.push(event.clone());
            events.len() - 1
        };
        // Answers as Lambda's published responses are written: JSON.
        (self.answer)(index, &event).map(Response::Json)
    }
}

/// A Kinesis stream of one shard with `records` records, mapped to `handler`, failed batches
/// described to a queue. Returns the runtime, the records' sequence numbers and the queue.
fn kinesis_mapping(
    handler: Arc<Recorder>,
    records: usize,
    settings: MappingSettings,
) -> (LocalRuntime, Vec<String>, String) {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    services.kinesis.create_stream("lambda-stream", 1);
    let failures = services.sqs.create_queue("failed-batches");
    let sequences = (0..records)
        .map(|i| {
            let data = json!({"user": "u1", "n": i}).to_string();
            match services
                .kinesis
                .put_record("lambda-stream", "1", data.as_bytes())
                .unwrap()
            {
                PutOutcome::Written {
                    sequence_number, ..
                } => sequence_number,
                failed => panic!("{failed:?}"),
            }
        })
        .collect();
    let mut runtime = LocalRuntime::new(services.clone());
    let source = MappingSource::Kinesis {
        kinesis: services.kinesis.clone(),
        stream: "lambda-stream".into(),
    };
    let settings = MappingSettings {
        on_failure: Some(failures.clone()),
        ..settings
    };
    runtime.add_mapping("myfunction", handler, source, settings);
    (runtime, sequences, failures)
}

/// A table with a stream that saw an insert, a modify and a remove, mapped to `handler`.
fn dynamodb_mapping(
    handler: Arc<Recorder>,
    settings: MappingSettings,
) -> (LocalRuntime, Vec<String>, String) {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let schema = KeySchema {
        hash: "Id".into(),
        range: None,
    };
    let table = services.dynamodb.create_table(
        "TestTable",
        schema,
        None,
        Some(keyway_local::StreamView::NewAndOldImages),
    );
    let failures = services.sqs.create_queue("failed-batches");
    let item = |message: &str| {
        Item::from([
            ("Id".to_owned(), AttrValue::N("101".into())),
            ("Message".to_owned(), AttrValue::S(message.into())),
        ])
    };
    table.put_item(item("New item!")).unwrap();
    table.put_item(item("This item has changed")).unwrap();
    table
        .delete_item(&Item::from([("Id".to_owned(), AttrValue::N("101".into()))]))
        .unwrap();
    let sequences = table
        .stream_records()
        .iter()
        .map(|r| r.sequence_number.clone())
        .collect();
    let mut runtime = LocalRuntime::new(services.clone());
    let settings = MappingSettings {
        on_failure: Some(failures.clone()),
        ..settings
    };
    runtime.add_mapping(
        "myfunction",
        handler,
        MappingSource::DynamoDb { table },
        settings,
    );
    (runtime, sequences, failures)
}

async fn run(runtime: &mut LocalRuntime) {
    runtime
        .run_until_idle(Duration::from_secs(3600))
        .await
        .expect("the run ends");
}

fn queue_bodies(runtime: &LocalRuntime, queue: &str) -> Vec<Value> {
    runtime
        .services
        .sqs
        .messages(queue)
        .iter()
        .map(|m| serde_json::from_str(&m.body).expect("an on-failure record is JSON"))
        .collect()
}

/// "Using Lambda with Kinesis", sample event; aws-lambda-rust-runtime and SAM CLI fixtures.
#[tokio::test(start_paused = true)]
async fn the_emulators_kinesis_records_have_the_fields_of_published_ones() {
    let Some(root) = corpus() else { return };
    let published = published_records(&root, "aws:kinesis");
    let f = Recorder::new(|_, _| Ok(json!({})));
    let (mut runtime, sequences, _) = kinesis_mapping(f.clone(), 2, MappingSettings::default());
    run(&mut runtime).await;
    let events = f.events();
    assert_eq!(events.len(), 1);
    let ours = events[0]["Records"].as_array().unwrap();
    assert_eq!(ours.len(), 2);
    let all: Vec<&(String, Value)> = published.iter().collect();
    for (record, sequence) in ours.iter().zip(&sequences) {
        assert_fields_match(record, &all, "a Kinesis record");
        assert_eq!(record["kinesis"]["sequenceNumber"], *sequence);
        // eventID is "<shard id>:<sequence number>" in every published record, as in ours.
        for r in std::iter::once(record).chain(published.iter().map(|(_, r)| r)) {
            let id = r["eventID"].as_str().unwrap();
            let (shard, sequence) = id.split_once(':').expect("shard:sequence");
            assert!(shard.starts_with("shardId-"), "{id}");
            assert_eq!(sequence, r["kinesis"]["sequenceNumber"].as_str().unwrap());
        }
        // Sequence numbers are decimal strings past the range of u64, as published.
        let sequence = record["kinesis"]["sequenceNumber"].as_str().unwrap();
        assert!(sequence.len() > 20 && sequence.bytes().all(|b| b.is_ascii_digit()));
    }
    // The records are in one stream's order and name it as the mapping's source.
    assert!(ours.iter().all(|r| r["eventSourceARN"]
        .as_str()
        .unwrap()
        .ends_with(":stream/lambda-stream")));
}

/// "Using Lambda with DynamoDB", sample event; rust-runtime, Powertools and SAM CLI fixtures: an
/// INSERT has no OldImage, a REMOVE no NewImage, a MODIFY both.
#[tokio::test(start_paused = true)]
async fn the_emulators_dynamodb_records_have_the_fields_of_published_ones() {
    let Some(root) = corpus() else { return };
    let published = published_records(&root, "aws:dynamodb");
    let f = Recorder::new(|_, _| Ok(json!({})));
    let (mut runtime, sequences, _) = dynamodb_mapping(f.clone(), MappingSettings::default());
    run(&mut runtime).await;
    let events = f.events();
    let ours: Vec<&Value> = events
        .iter()
        .flat_map(|e| e["Records"].as_array().unwrap())
        .collect();
    let names: Vec<&str> = ours
        .iter()
        .map(|r| r["eventName"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["INSERT", "MODIFY", "REMOVE"]);
    for (record, sequence) in ours.iter().zip(&sequences) {
        let name = record["eventName"].as_str().unwrap();
        let same_name: Vec<&(String, Value)> = published
            .iter()
            .filter(|(_, r)| r["eventName"] == name)
            .collect();
        assert!(!same_name.is_empty(), "the corpus has a published {name}");
        assert_fields_match(record, &same_name, &format!("a DynamoDB {name}"));
        assert_eq!(record["dynamodb"]["SequenceNumber"], *sequence);
        // Images and keys are typed attribute values, one type name each, as published.
        for image in ["Keys", "NewImage", "OldImage"] {
            let Some(map) = record["dynamodb"][image].as_object() else {
                continue;
            };
            for (attr, value) in map {
                let typed = value.as_object().expect("a typed value");
                assert_eq!(typed.len(), 1, "{name} {image}.{attr}");
                let kind = typed.keys().next().unwrap();
                let published_kinds: BTreeSet<&str> = published
                    .iter()
                    .filter_map(|(_, r)| r["dynamodb"][image].as_object())
                    .flat_map(|m| m.values().filter_map(|v| v.as_object()?.keys().next()))
                    .map(String::as_str)
                    .collect();
                assert!(
                    published_kinds.contains(kind.as_str()),
                    "{kind} is published"
                );
            }
        }
    }
    assert_eq!(
        ours[0]["dynamodb"]["NewImage"]["Message"],
        json!({"S": "New item!"})
    );
    assert_eq!(
        ours[1]["dynamodb"]["OldImage"]["Message"],
        json!({"S": "New item!"})
    );
    assert_eq!(ours[2]["dynamodb"]["Keys"], json!({"Id": {"N": "101"}}));
}

/// The documented on-failure record's fields, by path and type, and the emulator's.
fn assert_on_failure_record_matches(ours: &Value, documented: &Value, info: &str) {
    assert_eq!(
        fields(ours),
        fields(documented),
        "the on-failure record has the documented fields"
    );
    assert_eq!(ours["version"], documented["version"]);
    assert_eq!(
        ours["requestContext"]["condition"],
        documented["requestContext"]["condition"]
    );
    assert_eq!(ours["responseContext"], documented["responseContext"]);
    // Timestamps are ISO-8601 in UTC, as documented.
    for ts in [
        &ours["timestamp"],
        &ours[info]["approximateArrivalOfFirstRecord"],
        &ours[info]["approximateArrivalOfLastRecord"],
    ] {
        let ts = ts.as_str().unwrap();
        assert!(ts.ends_with('Z'), "{ts}");
        chrono::DateTime::parse_from_rfc3339(ts).unwrap_or_else(|e| panic!("{ts}: {e}"));
    }
}

/// "Using Lambda with Kinesis", on-failure destinations: after its retries a batch is described
/// by its shard, its first and last sequence numbers, its size and its stream.
#[tokio::test(start_paused = true)]
async fn a_discarded_kinesis_batch_is_described_as_the_documented_record() {
    let Some(root) = corpus() else { return };
    let documented = read(&root.join("lambda/docs/kinesis-on-failure-destination-record.json"));
    let f = Recorder::new(|_, _| Err(FunctionError::Failed("Unhandled".into())));
    let settings = MappingSettings {
        maximum_retry_attempts: Some(0),
        ..Default::default()
    };
    let (mut runtime, sequences, failures) = kinesis_mapping(f.clone(), 3, settings);
    run(&mut runtime).await;
    let bodies = queue_bodies(&runtime, &failures);
    assert_eq!(bodies.len(), 1, "one batch was discarded");
    let ours = &bodies[0];
    assert_on_failure_record_matches(ours, &documented, "KinesisBatchInfo");
    let info = &ours["KinesisBatchInfo"];
    assert_eq!(info["startSequenceNumber"], sequences[0]);
    assert_eq!(info["endSequenceNumber"], sequences[2]);
    assert_eq!(info["batchSize"], 3);
    assert_eq!(info["shardId"], "shardId-000000000000");
    assert_eq!(ours["requestContext"]["approximateInvokeCount"], 1);
    assert!(info["streamArn"]
        .as_str()
        .unwrap()
        .ends_with(":stream/lambda-stream"));
}

/// "Using Lambda with DynamoDB", on-failure destinations: the record names the stream's shard in
/// DynamoDB Streams' form and the discarded changes' sequence numbers.
#[tokio::test(start_paused = true)]
async fn a_discarded_dynamodb_batch_is_described_as_the_documented_record() {
    let Some(root) = corpus() else { return };
    let documented = read(&root.join("lambda/docs/dynamodb-on-failure-destination-record.json"));
    let f = Recorder::new(|_, _| Err(FunctionError::Failed("Unhandled".into())));
    let settings = MappingSettings {
        maximum_retry_attempts: Some(0),
        ..Default::default()
    };
    let (mut runtime, sequences, failures) = dynamodb_mapping(f.clone(), settings);
    run(&mut runtime).await;
    let bodies = queue_bodies(&runtime, &failures);
    assert_eq!(bodies.len(), 1);
    let ours = &bodies[0];
    assert_on_failure_record_matches(ours, &documented, "DDBStreamBatchInfo");
    let info = &ours["DDBStreamBatchInfo"];
    assert_eq!(info["startSequenceNumber"], sequences[0]);
    assert_eq!(info["endSequenceNumber"], sequences[2]);
    assert_eq!(info["batchSize"], 3);
    // shardId-<20 digits>-<8 hex>, like the documented shardId-00000001573689847184-864758bb.
    for shard in [
        &info["shardId"],
        &documented["DDBStreamBatchInfo"]["shardId"],
    ] {
        let parts: Vec<&str> = shard.as_str().unwrap().split('-').collect();
        assert_eq!(parts.len(), 3, "{shard}");
        assert_eq!(parts[0], "shardId");
        assert!(parts[1].len() == 20 && parts[1].bytes().all(|b| b.is_ascii_digit()));
        assert!(parts[2].len() == 8 && parts[2].bytes().all(|b| b.is_ascii_hexdigit()));
    }
    let arn = info["streamArn"].as_str().unwrap();
    assert!(arn.contains(":table/TestTable/stream/"), "{arn}");
}

/// A published response, its identifiers moved onto the emulator's records: each published
/// identifier names the record at some position of its published event (or, for the syntax
/// examples' `<id>`, of `fallback`); the answer names the emulator's record at that position.
fn translate(
    response: &Value,
    published_sequences: &[String],
    ours: &[String],
    fallback: usize,
) -> (Value, Vec<usize>) {
    let mut answer = response.clone();
    let mut positions = Vec::new();
    for item in answer["batchItemFailures"].as_array_mut().unwrap() {
        let id = item["itemIdentifier"].as_str().unwrap();
        let position = published_sequences
            .iter()
            .position(|s| s == id)
            .unwrap_or(fallback);
        positions.push(position);
        item["itemIdentifier"] = json!(ours[position]);
    }
    (answer, positions)
}

/// The sequence numbers of an event's records, in order.
fn event_sequences(event: &Value) -> Vec<String> {
    event["Records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["kinesis"]["sequenceNumber"]
                .as_str()
                .or_else(|| r["dynamodb"]["SequenceNumber"].as_str())
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// "Configuring partial batch response": the published responses (Powertools' answer to its
/// example event, the Developer Guide's syntax) make the emulator checkpoint before the failed
/// record and redeliver from it, never the records before it.
#[tokio::test(start_paused = true)]
async fn published_partial_batch_responses_redeliver_from_the_failed_record() {
    let Some(root) = corpus() else { return };
    let lambda = root.join("lambda");
    let cases = [
        (
            "kinesis",
            "powertools/getting_started_kinesis_event.json",
            "powertools/getting_started_kinesis_response.json",
        ),
        (
            "kinesis",
            "",
            "docs/kinesis-partial-batch-response_syntax.json",
        ),
        (
            "dynamodb",
            "powertools/getting_started_dynamodb_event.json",
            "powertools/getting_started_dynamodb_response.json",
        ),
        (
            "dynamodb",
            "",
            "docs/dynamodb-partial-batch-response_syntax.json",
        ),
    ];
    for (source, event, response) in cases {
        let response = read(&lambda.join(response));
        let published = if event.is_empty() {
            Vec::new()
        } else {
            event_sequences(&read(&lambda.join(event)))
        };
        let answer: Arc<Mutex<Option<Value>>> = Arc::default();
        let given = answer.clone();
        let f = Recorder::new(move |call, _| {
            Ok(if call == 0 {
                given
                    .lock()
                    .unwrap()
                    .clone()
                    .expect("the answer is set before the run")
            } else {
                json!({"batchItemFailures": []})
            })
        });
        let settings = MappingSettings {
            report_batch_item_failures: true,
            ..Default::default()
        };
        let (mut runtime, ours, _) = match source {
            "kinesis" => kinesis_mapping(f.clone(), 3, settings),
            _ => dynamodb_mapping(f.clone(), settings),
        };
        let (translated, positions) = translate(&response, &published, &ours, 1);
        *answer.lock().unwrap() = Some(translated);
        run(&mut runtime).await;
        let events = f.events();
        let from = *positions.iter().min().unwrap();
        assert!(
            from > 0,
            "the published response fails a record after the first"
        );
        let delivered: Vec<Vec<String>> = events.iter().map(event_sequences).collect();
        assert_eq!(delivered[0], ours, "{source}: the whole batch first");
        assert_eq!(
            delivered[1],
            ours[from..].to_vec(),
            "{source}: redelivered from the failed record, the ones before it checkpointed"
        );
        assert_eq!(delivered.len(), 2, "{source}: the redelivery succeeded");
    }
}

/// "Configuring partial batch response", success and failure conditions: an empty or null list,
/// or an empty or null response, succeed; an empty or null identifier, or one under another key
/// name, fail the whole batch. The shapes are the published response's with one part changed.
#[tokio::test(start_paused = true)]
async fn the_documented_success_and_failure_conditions_of_a_response_hold() {
    let Some(root) = corpus() else { return };
    let published = read(&root.join("lambda/docs/kinesis-partial-batch-response_syntax.json"));
    let with_item = |item: Value| {
        let mut r = published.clone();
        r["batchItemFailures"][0] = item;
        r
    };
    let cases: [(Value, bool); 7] = [
        (json!({"batchItemFailures": []}), true),
        (json!({"batchItemFailures": null}), true),
        (json!({}), true),
        (Value::Null, true),
        (with_item(json!({"itemIdentifier": ""})), false),
        (with_item(json!({"itemIdentifier": null})), false),
        (
            with_item(
                json!({"itemIdentifiers": "49590338271490256608559692538361571095921575989136588898"}),
            ),
            false,
        ),
    ];
    for (response, succeeds) in cases {
        let answer = response.clone();
        let f =
            Recorder::new(move |call, _| Ok(if call == 0 { answer.clone() } else { json!({}) }));
        let settings = MappingSettings {
            report_batch_item_failures: true,
            ..Default::default()
        };
        let (mut runtime, ours, _) = kinesis_mapping(f.clone(), 3, settings);
        run(&mut runtime).await;
        let delivered: Vec<Vec<String>> = f.events().iter().map(event_sequences).collect();
        if succeeds {
            assert_eq!(
                delivered,
                std::slice::from_ref(&ours),
                "{response} succeeds"
            );
        } else {
            assert_eq!(
                delivered,
                [ours.clone(), ours.clone()],
                "{response} fails the batch"
            );
        }
    }
}
