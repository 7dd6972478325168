//! The payloads in events/: each decodes as it should, survives a round trip through the event
//! builders and the aws_lambda_events types, and produces what its function must answer.

use std::path::PathBuf;

use keyed_counter::{KeyedCounter, COUNTS};
use keyway::domain::{ChangeKind, Payload, SourceRecord};
use keyway::sources::{dynamodb, kinesis};
use keyway_local::mapping::events::{kinesis_event, KinesisEventRecord};
use keyway_tests::harness::{stored_count, World};
use serde_json::Value;

fn fixture(path: &str) -> Value {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../events")
        .join(path);
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

fn decoded(records: Vec<Result<SourceRecord, keyway::RejectedRecord>>) -> Vec<SourceRecord> {
    records
        .into_iter()
        .map(|r| r.expect("every fixture record decodes"))
        .collect()
}

/// What a record is, without the JSON it came in.
fn essence(r: &SourceRecord) -> (String, String, String, Option<i64>, Payload) {
    (
        r.origin.to_string(),
        r.sequence.to_string(),
        r.partition_key.clone(),
        r.arrival_millis,
        r.payload.clone(),
    )
}

#[tokio::test]
async fn the_keyed_counter_batch_counts_good_records_dead_letters_bad_ones_and_answers_the_recorded_response(
) {
    let world = World::new(&[COUNTS.name]);
    let executor = world.executor(KeyedCounter);
    let response = keyway::lambda::run_kinesis(
        &executor,
        &fixture("keyed-counter/kinesis-batch.json").to_string(),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        serde_json::to_value(&response).unwrap(),
        fixture("keyed-counter/kinesis-batch.response.json")
    );
    assert_eq!(stored_count(&world, &executor, "user-1").await, Some(3));
    assert_eq!(stored_count(&world, &executor, "user-2").await, Some(6));
    assert_eq!(stored_count(&world, &executor, "user-3").await, None);
    let letters = world.dead_letters();
    assert_eq!(letters.len(), 2);
    assert!(
        letters
            .iter()
            .any(|l| l.problem.contains("unknown field `colour`")),
        "{letters:?}"
    );
    assert!(
        letters.iter().any(|l| l.problem.contains("expected ident")),
        "{letters:?}"
    );
}

#[test]
fn arrival_timestamps_keep_their_milliseconds_whatever_their_decimals() {
    let records = decoded(
        kinesis::decode_event(&fixture("kinesis/arrival-precision.json").to_string()).unwrap(),
    );
    let arrivals: Vec<Option<i64>> = records.iter().map(|r| r.arrival_millis).collect();
    assert_eq!(
        arrivals,
        [Some(1_767_225_600_123), Some(1_767_225_600_050), None]
    );
}

#[test]
fn kinesis_fixtures_survive_a_round_trip_through_the_event_builder() {
    for path in [
        "keyed-counter/kinesis-batch.json",
        "kinesis/arrival-precision.json",
        "cdc-rekey/debezium-batch.json",
        "cdc-rekey/truncate-batch.json",
        "cdc-join/changelog-batch.json",
    ] {
        let event = fixture(path);
        let arn = event["Records"][0]["eventSourceARN"]
            .as_str()
            .unwrap()
            .to_owned();
        let records = decoded(kinesis::decode_event(&event.to_string()).unwrap());
        let shard_ids: Vec<String> = records
            .iter()
            .map(|r| r.origin.as_str().rsplit('/').next().unwrap().to_owned())
            .collect();
        let datas: Vec<Vec<u8>> = records
            .iter()
            .map(|r| match &r.payload {
                Payload::Bytes(b) => b.to_vec(),
                other => unreachable!("{other:?}"),
            })
            .collect();
        let rebuilt = kinesis_event(
            &arn,
            records
                .iter()
                .zip(&shard_ids)
                .zip(&datas)
                .filter(|((r, _), _)| r.arrival_millis.is_some())
                .map(|((r, shard), data)| KinesisEventRecord {
                    shard_id: shard,
                    sequence_number: r.sequence.as_str(),
                    partition_key: &r.partition_key,
                    data,
                    arrival_millis: r.arrival_millis.unwrap(),
                }),
        );
        let again = decoded(kinesis::decode_event(&rebuilt.to_string()).unwrap());
        let with_arrival: Vec<_> = records
            .iter()
            .filter(|r| r.arrival_millis.is_some())
            .map(essence)
            .collect();
        assert_eq!(
            again.iter().map(essence).collect::<Vec<_>>(),
            with_arrival,
            "{path}"
        );
    }
}

#[test]
fn fixtures_round_trip_through_the_aws_lambda_events_types_unchanged() {
    for path in [
        "keyed-counter/kinesis-batch.json",
        "dynamic-filter/events-batch.json",
        // A tombstone's empty data, too.
        "cdc-rekey/debezium-batch.json",
        "cdc-join/changelog-batch.json",
    ] {
        let event = fixture(path);
        let typed: aws_lambda_events::event::kinesis::KinesisEvent =
            serde_json::from_value(event.clone()).unwrap();
        let back = serde_json::to_value(&typed).unwrap();
        let ours = decoded(kinesis::decode_event(&event.to_string()).unwrap());
        let theirs = decoded(kinesis::decode_event(&back.to_string()).unwrap());
        assert_eq!(
            ours.iter().map(essence).collect::<Vec<_>>(),
            theirs.iter().map(essence).collect::<Vec<_>>(),
            "{path}"
        );
    }

    for (path, records) in [
        ("dynamodb/insert-modify-remove.json", 3),
        ("filter-policy-sync/policy-changes.json", 6),
        ("filter-policy-sync/own-table-changes.json", 2),
        ("cdc-rekey/users-stream-batch.json", 3),
    ] {
        let event = fixture(path);
        let typed: aws_lambda_events::event::dynamodb::Event =
            serde_json::from_value(event.clone()).unwrap();
        assert_eq!(typed.records.len(), records, "{path}");
        let back = serde_json::to_value(&typed).unwrap();
        let ours = decoded(dynamodb::decode_event(&event.to_string()).unwrap());
        let theirs = decoded(dynamodb::decode_event(&back.to_string()).unwrap());
        // The typed form always writes a creation time (0 where none was sent); everything else
        // holds.
        let changes = |rs: &[SourceRecord]| {
            rs.iter()
                .map(|r| (r.sequence.to_string(), r.payload.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(changes(&ours), changes(&theirs), "{path}");
    }
}

#[test]
fn an_items_life_decodes_to_insert_modify_and_remove_with_their_images() {
    let records = decoded(
        dynamodb::decode_event(&fixture("dynamodb/insert-modify-remove.json").to_string()).unwrap(),
    );
    let kinds: Vec<(ChangeKind, bool, bool)> = records
        .iter()
        .map(|r| match &r.payload {
            Payload::Change(c) => (c.kind, c.old_image.is_some(), c.new_image.is_some()),
            other => unreachable!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (ChangeKind::Insert, false, true),
            (ChangeKind::Modify, true, true),
            (ChangeKind::Remove, true, false)
        ]
    );
    assert!(
        records.iter().all(|r| r.origin == records[0].origin),
        "one item, one origin"
    );
    assert_eq!(records[0].arrival_millis, Some(1_767_225_600_257));
    assert_eq!(records[2].arrival_millis, None);
}

#[test]
fn a_ttl_deletion_and_an_emulator_record_decode() {
    let ttl = decoded(
        dynamodb::decode_event(&fixture("dynamodb/ttl-deletion.json").to_string()).unwrap(),
    );
    assert!(
        matches!(&ttl[0].payload, Payload::Change(c) if c.ttl_deletion && c.kind == ChangeKind::Remove)
    );
    let emulator = decoded(
        dynamodb::decode_event(&fixture("dynamodb/emulator-shape.json").to_string()).unwrap(),
    );
    // The zero-padded sequence number is kept as sent: it names the record in a batch response.
    assert_eq!(
        emulator[0].sequence.as_str(),
        "000000176722560012300000000041"
    );
    assert_eq!(emulator[0].arrival_millis, Some(1_767_225_600_000));
}

/// The identity enricher on a world of queues, its inputs wired to the fixtures' streams.
fn identity_enricher(
    world: &World,
) -> keyway::lambda::StreamHandler<identity_enricher::enricher::IdentityEnricher> {
    use identity_enricher::enricher::{EnricherConfig, IdentityEnricher, EVENTS, FEEDBACK};
    let inputs = keyway::Inputs::new()
        .with(
            &EVENTS,
            "arn:aws:kinesis:eu-west-1:111111111111:stream/cloudtrail",
        )
        .with(&FEEDBACK, "feedback");
    let executor = keyway::Executor::with_inputs(
        IdentityEnricher::new(EnricherConfig::default()),
        inputs,
        world.store.clone(),
        world.sinks(),
        world.clock.clone(),
    )
    .unwrap();
    keyway::lambda::StreamHandler::new(executor)
}

#[tokio::test]
async fn the_identity_enricher_batches_resolve_alice_wait_for_her_session_and_dead_letter_a_cut_record(
) {
    use identity_enricher::enricher::{ENRICHED, RESOLUTIONS};
    use keyway::lambda::{Handler, Invocation};
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let handler = identity_enricher(&world);
    let invoke = |path: &str| {
        let handler = &handler;
        let event = fixture(path).to_string();
        async move {
            handler
                .handle(&event, &Invocation::default())
                .await
                .unwrap()
                .to_json()
        }
    };
    let enriched = |world: &World| -> Vec<Value> {
        world
            .outputs(ENRICHED.name)
            .iter()
            .map(|m| serde_json::from_str(&m.body).unwrap())
            .collect()
    };
    let response = invoke("identity-enricher/cloudtrail-batch.json").await;
    assert_eq!(response, fixture("identity-enricher/batch.response.json"));
    // Alice's AssumeRole and her denied one go out; the snapshot with her session's key waits.
    let out = enriched(&world);
    assert_eq!(out.len(), 2, "{out:#?}");
    assert!(out.iter().all(|e| e["enrichment"]["status"] == "resolved"
        && e["enrichment"]["originalActor"]["userName"] == "alice"));
    let resolutions = world.outputs(RESOLUTIONS.name);
    assert_eq!(resolutions.len(), 1, "the denied call issued nothing");
    let published: Value = serde_json::from_str(&resolutions[0].body).unwrap();
    let resolution = fixture("identity-enricher/feedback-batch.json")["Records"][0]["kinesis"]
        ["data"]
        .as_str()
        .map(|d| base64::Engine::decode(&base64::engine::general_purpose::STANDARD, d).unwrap())
        .unwrap();
    let recorded: Value = serde_json::from_slice(&resolution).unwrap();
    assert_eq!(
        published, recorded,
        "the feedback fixture is what the enricher publishes"
    );
    let letters = world.dead_letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].field, "data", "{letters:?}");

    let response = invoke("identity-enricher/feedback-batch.json").await;
    assert_eq!(response, fixture("identity-enricher/batch.response.json"));
    let out = enriched(&world);
    assert_eq!(out.len(), 3, "the snapshot is released");
    let snapshot = &out[2];
    assert_eq!(snapshot["eventName"], "CreateDBSnapshot");
    assert_eq!(snapshot["enrichment"]["originalActor"]["userName"], "alice");
    assert_eq!(
        snapshot["enrichment"]["roleChain"][0]["roleArn"],
        "arn:aws:iam::111111111111:role/deploy"
    );

    // The schedule's event sweeps timers: none is left, the snapshot's was cancelled.
    let sweep = invoke("identity-enricher/scheduled-event.json").await;
    assert_eq!(sweep["fired"], 0, "{sweep}");
}

/// The dynamic filtering functions on the embedded services, wired as events/README.md says.
struct Filtering {
    services: std::sync::Arc<keyway_local::LocalServices>,
    env: keyway::lambda::Env,
    dead_letters: String,
}

impl Filtering {
    fn new() -> Self {
        use keyway::adapters::dynamodb::TTL;
        use keyway_local::{FaultPlan, KeySchema, LocalServices};
        let services = LocalServices::new(1_767_225_600_000, FaultPlan::default());
        for table in ["keyway-state", "filter-state"] {
            let schema = KeySchema::state_table();
            services
                .dynamodb
                .create_table(table, schema, Some(TTL.into()), None);
        }
        for queue in [
            "keyway-live_events",
            "keyway-live_edits",
            "keyway-audit_trail",
        ] {
            services.sqs.create_queue(queue);
        }
        let dead = services.sqs.create_queue("dead-letters");
        let env = [
            ("STATE_TABLE", "keyway-state".to_owned()),
            ("FILTER_STATE_TABLE", "filter-state".to_owned()),
            ("DEAD_LETTER_SINK", format!("sqs:{dead}")),
            (
                "CONSUMER_QUEUES",
                r#"{"live": ["keyway-live_events", "keyway-live_edits"], "audit": ["keyway-audit_trail"]}"#.to_owned(),
            ),
            (
                "QUEUE_URL_PREFIX",
                keyway_local::LocalSqs::URL_PREFIX.to_owned(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        Self {
            services,
            env,
            dead_letters: dead,
        }
    }

    fn received(&self, queue: &str) -> Vec<String> {
        keyway_tests::received_ids(&self.services.sqs, queue)
    }
}

/// `handler`'s response to the event in `path`, as Lambda reads it.
async fn invoke_with(handler: &dyn keyway::lambda::Handler, path: &str) -> Value {
    let text = serde_json::to_string(&fixture(path)).unwrap();
    handler
        .handle(&text, &keyway::lambda::Invocation::default())
        .await
        .unwrap()
        .to_json()
}

#[tokio::test]
async fn the_policy_changes_and_the_events_batch_deliver_what_the_subscriptions_match_and_dead_letter_the_rest(
) {
    let f = Filtering::new();
    let sync = filter_policy_sync::handler(f.services.as_ref(), &f.env).unwrap();
    let response = invoke_with(&sync, "filter-policy-sync/policy-changes.json").await;
    assert_eq!(response, fixture("filter-policy-sync/batch.response.json"));
    let filter = dynamic_filter::handler(f.services.as_ref(), &f.env).unwrap();
    let response = invoke_with(&filter, "dynamic-filter/events-batch.json").await;
    assert_eq!(response, fixture("dynamic-filter/batch.response.json"));
    // live's sheet-1 subscription moved to keyway-live_edits, for updates and deletes; audit hears every
    // delete; live's sheet-3 subscription is gone, its sheet-2 one refused.
    assert_eq!(f.received("keyway-live_edits"), ["e1", "e3"]);
    assert_eq!(f.received("keyway-audit_trail"), ["e3", "e4"]);
    assert!(f.received("keyway-live_events").is_empty());
    let reasons = keyway_tests::dead_letter_reasons(&f.services.sqs, &f.dead_letters);
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(reasons[0].starts_with("data/key: missing"), "{reasons:?}");
    assert!(reasons[1].starts_with("data: not JSON"), "{reasons:?}");
    assert!(
        reasons[2].starts_with("pattern: pattern at /op/0/prefx"),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn a_consumers_own_table_subscribes_that_consumer_and_dead_letters_an_item_naming_another() {
    let mut f = Filtering::new();
    f.env
        .insert("POLICY_TABLE_PREFIX".into(), "keyway-policies-".into());
    let sync = filter_policy_sync::handler(f.services.as_ref(), &f.env).unwrap();
    let response = invoke_with(&sync, "filter-policy-sync/own-table-changes.json").await;
    assert_eq!(response, fixture("filter-policy-sync/batch.response.json"));
    let filter = dynamic_filter::handler(f.services.as_ref(), &f.env).unwrap();
    let response = invoke_with(&filter, "dynamic-filter/events-batch.json").await;
    assert_eq!(response, fixture("dynamic-filter/batch.response.json"));
    assert_eq!(f.received("keyway-live_events"), ["e4", "e5"]);
    assert!(
        f.received("keyway-audit_trail").is_empty(),
        "audit's item was refused"
    );
    let reasons = keyway_tests::dead_letter_reasons(&f.services.sqs, &f.dead_letters);
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(
        reasons[0].starts_with(
            "consumer: \"audit\" in the policy table \"keyway-policies-live\" of consumer \"live\""
        ),
        "{reasons:?}"
    );
}

/// The CDC join's two functions on the embedded services, wired as events/README.md says: the
/// streams and tables named as the stack names them, the users table as its payload's ARN does.
struct CdcJoin {
    services: std::sync::Arc<keyway_local::LocalServices>,
    env: keyway::lambda::Env,
    dead_letters: String,
}

const CDC_CHANGELOG: &str = "keyway-CdcChangelogStream-5NQ2R8XZ7T1M";
const CDC_JOINED: &str = "keyway-CdcJoinedStream-H6V3K9W2P4RA";
const CDC_VIEW: &str = "keyway-CdcViewTable-2F7G9J4K6L8M";

impl CdcJoin {
    fn new() -> Self {
        use keyway::adapters::dynamodb::TTL;
        use keyway_local::{FaultPlan, KeySchema, LocalServices};
        let services = LocalServices::new(1_767_225_600_000, FaultPlan::default());
        for table in ["keyway-StateTable-8QW3E5R7T9YU", CDC_VIEW] {
            let schema = KeySchema::state_table();
            services
                .dynamodb
                .create_table(table, schema, Some(TTL.into()), None);
        }
        // One shard each: the changelog fixture is one batch of one shard, in the order put.
        services.kinesis.create_stream(CDC_CHANGELOG, 1);
        services.kinesis.create_stream(CDC_JOINED, 1);
        let dead = services
            .sqs
            .create_queue("keyway-DeadLetterQueue-4T6Y8U0I2O4P");
        let env = [
            ("JOIN", "domains.user_id=users.id".to_owned()),
            ("JOIN_KIND", "inner".to_owned()),
            ("STATE_TABLE", "keyway-StateTable-8QW3E5R7T9YU".to_owned()),
            ("DEAD_LETTER_SINK", format!("sqs:{dead}")),
            ("CHANGELOG_SINK", format!("kinesis:{CDC_CHANGELOG}")),
            (
                "TABLE_NAMES",
                r#"{"keyway-CdcUsersTable-1A2B3C": "users"}"#.to_owned(),
            ),
            ("JOINED_SINK", format!("kinesis:{CDC_JOINED}")),
            ("VIEW_TABLE", CDC_VIEW.to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        Self {
            services,
            env,
            dead_letters: dead,
        }
    }

    /// The records put on `stream` since the last call, as (partition key, data).
    fn taken(&self, stream: &str) -> Vec<(String, Vec<u8>)> {
        self.services
            .kinesis
            .trim(stream)
            .iter()
            .map(|r| (r.partition_key.clone(), r.data.to_vec()))
            .collect()
    }
}

/// A source row's steps, by (group, table, primary key), each as (op, row, stamp): what the
/// re-key promises to keep in order is one row's steps under one join key, nothing across rows.
type StepsByRow =
    std::collections::BTreeMap<(String, String, String), Vec<(String, Value, String)>>;

/// Changelog records as the steps of each row; every record is put under its step's group.
fn steps_by_row(records: &[(String, Vec<u8>)]) -> StepsByRow {
    let mut rows = StepsByRow::new();
    for (partition_key, data) in records {
        let step: cdc_join::rekey::Step = serde_json::from_slice(data).expect("a step");
        assert_eq!(partition_key, &step.group, "a step goes under its join key");
        let side = match step.table.as_str() {
            "domains" => cdc_join::spec::Side::Left,
            _ => cdc_join::spec::Side::Right,
        };
        assert_eq!(step.side, side, "{} is on its side of the join", step.table);
        let (op, row) = match step.change {
            keyway::domain::RowChange::Delete(row) => ("delete", row),
            keyway::domain::RowChange::Insert(row) => ("insert", row),
        };
        rows.entry((step.group, step.table, step.pk))
            .or_default()
            .push((op.to_owned(), Value::Object(row), step.stamp.0));
    }
    rows
}

/// The Kinesis records of a fixture, as (partition key, data, sequence number).
fn kinesis_records(path: &str) -> Vec<(String, Vec<u8>, String)> {
    decoded(kinesis::decode_event(&fixture(path).to_string()).unwrap())
        .into_iter()
        .map(|r| match r.payload {
            Payload::Bytes(data) => (r.partition_key, data.to_vec(), r.sequence.to_string()),
            other => unreachable!("{other:?}"),
        })
        .collect()
}

/// One step as `steps_by_row` gives it: `op` of `row` at the stamp of the change at `sequence`.
fn step(op: &str, row: Value, sequence: &str) -> (String, Value, String) {
    use cdc_join::join::Stamp;
    let stamp = match op {
        "delete" => Stamp::delete(sequence),
        _ => Stamp::insert(sequence),
    };
    (op.to_owned(), row, stamp.0)
}

/// The key `steps_by_row` files a row's steps under.
fn row_key(group: &str, table: &str, pk: &str) -> (String, String, String) {
    (group.to_owned(), table.to_owned(), pk.to_owned())
}

#[tokio::test]
async fn after_the_truncate_payload_the_rekeys_schedule_retracts_the_truncated_rows_no_change_touched_again(
) {
    use serde_json::json;
    let f = CdcJoin::new();
    let rekey = cdc_join::wiring::rekey_handler(f.services.as_ref(), &f.env).unwrap();
    invoke_with(&rekey, "cdc-rekey/debezium-batch.json").await;
    let seq: Vec<String> = kinesis_records("cdc-rekey/debezium-batch.json")
        .into_iter()
        .map(|(_, _, sequence)| sequence)
        .collect();
    f.taken(CDC_CHANGELOG);
    // The truncate of domains, and domain 103 created again after it as it was before.
    let response = invoke_with(&rekey, "cdc-rekey/truncate-batch.json").await;
    assert_eq!(response, fixture("cdc-rekey/batch.response.json"));
    assert!(f.taken(CDC_CHANGELOG).is_empty(), "nothing changed yet");
    // The sweep retracts domain 101, under its join key, at its insert's stamp's truncate
    // step; 103 was created after the truncate and stays.
    let report = invoke_with(&rekey, "cdc-rekey/scheduled-event.json").await;
    assert_eq!(report, json!({"tables": 1, "rows": 1}));
    let moved = json!({"id": 101, "name": "ada.example.org", "user_id": 2});
    let stamp = cdc_join::join::Stamp::truncated(&seq[5]).0;
    let expected = StepsByRow::from([(
        row_key("2", "domains", "101"),
        vec![("delete".to_owned(), moved, stamp)],
    )]);
    assert_eq!(steps_by_row(&f.taken(CDC_CHANGELOG)), expected);
    // The second sweep comes only once the settle time has passed.
    let report = invoke_with(&rekey, "cdc-rekey/scheduled-event.json").await;
    assert_eq!(report, json!({"tables": 0, "rows": 0}));
}

#[tokio::test]
async fn the_rekey_publishes_each_rows_changes_as_deletes_and_inserts_by_join_key_and_the_changelog_fixture_is_what_it_published(
) {
    use serde_json::json;
    let f = CdcJoin::new();
    let rekey = cdc_join::wiring::rekey_handler(f.services.as_ref(), &f.env).unwrap();
    let response = invoke_with(&rekey, "cdc-rekey/debezium-batch.json").await;
    assert_eq!(response, fixture("cdc-rekey/batch.response.json"));
    let seq: Vec<String> = kinesis_records("cdc-rekey/debezium-batch.json")
        .into_iter()
        .map(|(_, _, sequence)| sequence)
        .collect();
    let debezium = f.taken(CDC_CHANGELOG);
    // Domain 101 moves from user 1 to user 2: a delete under 1 and an insert under 2, both at
    // the update's position. Domain 102's delete carries its key alone (REPLICA IDENTITY
    // DEFAULT): the re-key retracts the row it stored. The tombstone changes nothing.
    let ada = json!({"id": 101, "name": "ada.example.org", "user_id": 1});
    let moved = json!({"id": 101, "name": "ada.example.org", "user_id": 2});
    let grace = json!({"id": 102, "name": "grace.example.org", "user_id": 2});
    let katherine = json!({"id": 103, "name": "katherine.example.org", "user_id": 3});
    let expected = StepsByRow::from([
        (
            row_key("1", "users", "1"),
            vec![step("insert", json!({"id": 1, "name": "ada"}), &seq[0])],
        ),
        (
            row_key("2", "users", "2"),
            vec![step("insert", json!({"id": 2, "name": "grace"}), &seq[1])],
        ),
        (
            row_key("1", "domains", "101"),
            vec![
                step("insert", ada.clone(), &seq[2]),
                step("delete", ada, &seq[5]),
            ],
        ),
        (
            row_key("2", "domains", "102"),
            vec![
                step("insert", grace.clone(), &seq[3]),
                step("delete", grace, &seq[6]),
            ],
        ),
        (
            row_key("3", "domains", "103"),
            vec![step("insert", katherine, &seq[4])],
        ),
        (
            row_key("2", "domains", "101"),
            vec![step("insert", moved, &seq[5])],
        ),
    ]);
    assert_eq!(steps_by_row(&debezium), expected);
    // The record cut off mid-JSON goes to the dead letters; the batch does not fail for it.
    let reasons = keyway_tests::dead_letter_reasons(&f.services.sqs, &f.dead_letters);
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].starts_with("data: not JSON: EOF"), "{reasons:?}");

    // The users table's changes, under its name in the join (TABLE_NAMES): the MODIFY is a
    // delete and an insert at its position; the REMOVE of a user never seen retracts its old
    // image, which is whole.
    let response = invoke_with(&rekey, "cdc-rekey/users-stream-batch.json").await;
    assert_eq!(response, fixture("cdc-rekey/batch.response.json"));
    let users = f.taken(CDC_CHANGELOG);
    let katherine = json!({"id": 3, "name": "katherine"});
    let expected = StepsByRow::from([
        (
            row_key("3", "users", "3"),
            vec![
                step("insert", katherine.clone(), "800000000034512673201"),
                step("delete", katherine, "800000000034512681547"),
                step(
                    "insert",
                    json!({"id": 3, "name": "kate"}),
                    "800000000034512681547",
                ),
            ],
        ),
        (
            row_key("4", "users", "4"),
            vec![step(
                "delete",
                json!({"id": 4, "name": "margaret"}),
                "800000000034512693012",
            )],
        ),
    ]);
    assert_eq!(steps_by_row(&users), expected);
    let reasons = keyway_tests::dead_letter_reasons(&f.services.sqs, &f.dead_letters);
    assert!(reasons.is_empty(), "{reasons:?}");

    // The join's payload holds exactly what the re-key published for both batches, each row's
    // steps in order, besides its one record that is no step.
    let published: Vec<(String, Vec<u8>)> = debezium.into_iter().chain(users).collect();
    let recorded: Vec<(String, Vec<u8>)> = kinesis_records("cdc-join/changelog-batch.json")
        .into_iter()
        .filter(|(_, data, _)| serde_json::from_slice::<cdc_join::rekey::Step>(data).is_ok())
        .map(|(key, data, _)| (key, data))
        .collect();
    assert_eq!(recorded.len(), published.len());
    assert_eq!(steps_by_row(&recorded), steps_by_row(&published));
}

#[tokio::test]
async fn the_changelog_batch_builds_the_view_of_each_domain_with_its_users_current_row_and_dead_letters_a_record_that_is_no_step(
) {
    use cdc_join::view_table::joined_of;
    use serde_json::json;
    let f = CdcJoin::new();
    let join = cdc_join::wiring::join_handler(f.services.as_ref(), &f.env).unwrap();
    let response = invoke_with(&join, "cdc-join/changelog-batch.json").await;
    assert_eq!(response, fixture("cdc-join/batch.response.json"));
    // The record of op update, which the re-key would have decomposed into a delete and an
    // insert, is refused, naming the record's data; the batch does not fail for it.
    let reasons = keyway_tests::dead_letter_reasons(&f.services.sqs, &f.dead_letters);
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(
        reasons[0].starts_with("data: expected a changelog step"),
        "{reasons:?}"
    );

    // Domain 101 with its new user, domain 103 with its user's new name; 101's pair with user 1
    // and domain 102's are tombstones. User 4's delete retracted a row the join never held.
    let view = f.services.dynamodb.table(CDC_VIEW).unwrap();
    let (mut rows, mut tombstones) = (Vec::new(), Vec::new());
    for item in view.items() {
        match joined_of(&item).unwrap() {
            Some(joined) => rows.push(joined),
            None => tombstones.push((
                item["pk"].as_s().unwrap().to_owned(),
                item["sk"].as_s().unwrap().to_owned(),
            )),
        }
    }
    rows.sort_by_key(|j| j.id());
    tombstones.sort();
    let row = |v: Value| v.as_object().unwrap().clone();
    let expected = [
        cdc_join::join::Joined {
            left_pk: "101".into(),
            left: row(json!({"id": 101, "name": "ada.example.org", "user_id": 2})),
            right_pk: Some("2".into()),
            right: Some(row(json!({"id": 2, "name": "grace"}))),
        },
        cdc_join::join::Joined {
            left_pk: "103".into(),
            left: row(json!({"id": 103, "name": "katherine.example.org", "user_id": 3})),
            right_pk: Some("3".into()),
            right: Some(row(json!({"id": 3, "name": "kate"}))),
        },
    ];
    assert_eq!(rows, expected);
    assert_eq!(
        tombstones,
        [
            ("101".to_owned(), "1".to_owned()),
            ("102".to_owned(), "2".to_owned())
        ]
    );

    // The joined changelog, in no order across join keys: each pair inserted once both its rows
    // were there, and retracted when either changed or went.
    let mut joined: Vec<(String, String, &str)> = f
        .taken(CDC_JOINED)
        .iter()
        .map(|(_, data)| {
            let stamped: cdc_join::join::Stamped = serde_json::from_slice(data).unwrap();
            let op = if stamped.change.is_insert() { "+" } else { "-" };
            let j = stamped.change.row();
            let user = j.right.as_ref().expect("an inner join's pair")["name"].as_str();
            (j.left_pk.clone(), user.unwrap().to_owned(), op)
        })
        .collect();
    joined.sort();
    let pair = |domain: &str, user: &str, op| (domain.to_owned(), user.to_owned(), op);
    assert_eq!(
        joined,
        [
            pair("101", "ada", "+"),
            pair("101", "ada", "-"),
            pair("101", "grace", "+"),
            pair("102", "grace", "+"),
            pair("102", "grace", "-"),
            pair("103", "kate", "+"),
            pair("103", "katherine", "+"),
            pair("103", "katherine", "-"),
        ]
    );
}

/// Keyed aggregation's first phase with the payloads' settings: sums and counts of `/value` per
/// `/key`, running totals flushed a minute after their first change.
fn summing() -> keyed_aggregate::partials::KeyedAggregate {
    use keyed_aggregate::aggregate::Aggregate;
    let spec = keyed_aggregate::spec::Spec::new(
        "/key",
        Some("/value"),
        Aggregate::ALL.to_vec(),
        None,
        std::time::Duration::from_secs(60),
    )
    .unwrap();
    keyed_aggregate::partials::KeyedAggregate::new(std::sync::Arc::new(spec))
}

#[tokio::test]
async fn the_aggregation_batch_aggregates_plain_and_salted_records_and_dead_letters_the_unreadable_ones(
) {
    let world = World::new(&["partials"]);
    let executor = world.executor(summing());
    let response = keyway::lambda::run_kinesis(
        &executor,
        &fixture("keyed-aggregate/events-batch.json").to_string(),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        serde_json::to_value(&response).unwrap(),
        fixture("keyed-aggregate/batch.response.json")
    );
    let mut letters: Vec<(String, String)> = world
        .dead_letters()
        .into_iter()
        .map(|l| (l.field, l.problem))
        .collect();
    letters.sort();
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert_eq!(letters[0].0, "data");
    assert!(letters[0].1.starts_with("expected JSON"), "{letters:?}");
    assert_eq!(
        letters[1],
        ("data/value".into(), "expected a number".into())
    );

    // A minute on, the sweep sends each key's and each bucket's running total to the merge.
    assert!(world.outputs("partials").is_empty());
    world.clock.advance(61_000);
    executor.fire_timers(None).await.unwrap();
    let mut sources: Vec<(String, u64)> = world
        .outputs("partials")
        .iter()
        .map(|m| {
            let body: Value = serde_json::from_str(&m.body).unwrap();
            let count = body["partial"]["count"].as_u64().unwrap();
            (body["source"].as_str().unwrap().to_owned(), count)
        })
        .collect();
    sources.sort();
    assert_eq!(
        sources,
        [
            ("page-2".to_owned(), 1),
            ("page-7".to_owned(), 1),
            ("~3~page-7".to_owned(), 1),
            ("~4~page-7".to_owned(), 1)
        ]
    );
}

#[tokio::test]
async fn the_merge_batch_merges_a_keys_buckets_exactly_and_ignores_a_partial_sent_twice() {
    use keyed_aggregate::aggregate::Aggregate;
    use keyed_aggregate::merge::AggregateMerge;
    let world = World::new(&["results"]);
    let executor = world.executor(AggregateMerge {
        aggregates: Aggregate::ALL.to_vec(),
        keep: std::time::Duration::from_secs(86_400),
        idle: std::time::Duration::from_secs(90_000),
    });
    let response = keyway::lambda::run_kinesis(
        &executor,
        &fixture("aggregate-merge/partials-batch.json").to_string(),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        serde_json::to_value(&response).unwrap(),
        fixture("aggregate-merge/batch.response.json")
    );
    let results: Vec<String> = world
        .outputs("results")
        .into_iter()
        .map(|m| m.body)
        .collect();
    assert_eq!(
        results.len(),
        3,
        "the fourth partial is the second's again: {results:?}"
    );
    assert_eq!(
        results[2],
        r#"{"key":"page-7","count":3,"sum":15.75,"min":0.25,"max":12.5,"mean":5.25}"#
    );
    assert!(world.dead_letters().is_empty());
}
