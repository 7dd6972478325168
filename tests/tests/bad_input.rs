//! Bad input through every function of the stack, as template.yaml wires them on the embedded
//! runtime: malformed JSON, wrong types, missing and null fields, invalid UTF-8, oversized and
//! deeply nested records, unknown Debezium operations, CloudTrail
//! callers of unknown identity types, events of the wrong shape for a function, and hostile
//! filter patterns. Each bad record reaches the dead-letter queue with a reason that names the
//! field and the problem; the records after it on the same shard and partition key are applied
//! (the batch goes on); the function's metric line counts the dead letter; no batch is given up
//! and nothing panics.

use std::collections::BTreeMap;
use std::time::Duration;

use dynamic_filter::subscription::{Identity, Subscription, Target};
use keyway::domain::{AttrValue, DeadLetter};
use keyway_local::{FaultPlan, LocalRuntime, LocalServices};
use serde_json::{json, Value};

const EPOCH: i64 = 1_767_225_600_000;

fn stack() -> LocalRuntime {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    LocalRuntime::from_template(keyway_stack::TEMPLATE, services, &keyway_stack::functions())
        .expect("the template runs")
}

/// A bad record: its data, and the field and a piece of the problem its dead letter must name.
struct Bad {
    what: &'static str,
    data: Vec<u8>,
    field: &'static str,
    problem: &'static str,
}

fn bad(
    what: &'static str,
    data: impl Into<Vec<u8>>,
    field: &'static str,
    problem: &'static str,
) -> Bad {
    Bad {
        what,
        data: data.into(),
        field,
        problem,
    }
}

/// A JSON object whose string holds bytes that are no UTF-8.
fn utf8_broken() -> Vec<u8> {
    [&br#"{"op": ""#[..], &[0xc3, 0x28, 0xff], &br#""}"#[..]].concat()
}

/// JSON nested `depth` arrays deep.
fn nested(depth: usize) -> Vec<u8> {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes()
}

/// The dead letters the stack sent, taken off its queue.
fn dead_letters(runtime: &LocalRuntime) -> Vec<DeadLetter> {
    let url = runtime.resource("DeadLetterQueue").unwrap();
    runtime
        .services
        .sqs
        .receive(&url, usize::MAX)
        .iter()
        .map(|m| serde_json::from_str(&m.body).expect("a dead letter"))
        .collect()
}

/// The dead letters the metric lines of `function`'s operator counted, taken.
fn counted_dead_letters(runtime: &LocalRuntime, operator: &str) -> u64 {
    runtime
        .services
        .metrics
        .take()
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["Operator"] == operator)
        .map(|m| m["DeadLetters"].as_f64().unwrap_or(0.0) as u64)
        .sum()
}

/// Where bad records go: a stream of the stack and the operator that reads it, what the stack
/// needs before (a subscription for the filter), and the good records around each bad one.
struct Stream<'a> {
    stream: &'a str,
    operator: &'a str,
    partition_key: &'a str,
    prepare: &'a dyn Fn(&LocalRuntime),
    good: &'a dyn Fn(usize) -> Vec<u8>,
    /// Whether the good record `n` was applied.
    applied: &'a dyn Fn(&LocalRuntime, usize) -> bool,
}

/// Nothing to prepare.
fn nothing(_: &LocalRuntime) {}

/// Puts each bad record between two good ones on the target's stream under its partition key,
/// runs the stack, and checks each bad one's dead letter, the metric, that no batch was given up
/// and that the good record after it was applied.
async fn each_dead_lettered(target: &Stream<'_>, cases: &[Bad]) {
    let Stream {
        stream,
        operator,
        partition_key,
        good,
        applied,
        ..
    } = target;
    for (n, case) in cases.iter().enumerate() {
        let mut runtime = stack();
        (target.prepare)(&runtime);
        runtime
            .run_until_idle(Duration::from_secs(600))
            .await
            .unwrap();
        let stream = runtime.resource(stream).unwrap();
        let records = [
            (partition_key.to_string(), good(0)),
            (partition_key.to_string(), case.data.clone()),
            (partition_key.to_string(), good(1)),
        ];
        runtime
            .services
            .kinesis
            .put_in_order(&stream, &records)
            .await
            .unwrap_or_else(|e| panic!("{}: the stream refused it: {e}", case.what));
        runtime
            .run_until_idle(Duration::from_secs(600))
            .await
            .unwrap();
        runtime.run_for(Duration::from_secs(180)).await;
        let letters = dead_letters(&runtime);
        assert_eq!(letters.len(), 1, "{} ({n}): {letters:?}", case.what);
        let letter = &letters[0];
        assert_eq!(letter.field, case.field, "{}: {letter:?}", case.what);
        assert!(
            letter.problem.contains(case.problem),
            "{}: the problem {:?} does not say {:?}",
            case.what,
            letter.problem,
            case.problem
        );
        assert_eq!(letter.operator, *operator, "{}", case.what);
        assert_eq!(
            counted_dead_letters(&runtime, operator),
            1,
            "{}: the metric",
            case.what
        );
        let failed = runtime.resource("FailedBatchesQueue").unwrap();
        assert!(
            runtime.services.sqs.messages(&failed).is_empty(),
            "{}",
            case.what
        );
        assert!(
            applied(&runtime, 1),
            "{}: the record after it was applied",
            case.what
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_keyed_counter_dead_letters_each_bad_click_and_counts_the_rest() {
    let click = |_: usize| br#"{"key":"user-1","amount":1}"#.to_vec();
    let cases = [
        bad(
            "cut JSON",
            &br#"{"key": "user-1", "amo"#[..],
            "data",
            "expected",
        ),
        bad(
            "a string amount",
            &br#"{"key":"user-1","amount":"3"}"#[..],
            "data",
            "invalid type",
        ),
        bad(
            "a negative amount",
            &br#"{"key":"user-1","amount":-3}"#[..],
            "data",
            "invalid value",
        ),
        bad(
            "no key",
            &br#"{"amount":3}"#[..],
            "data",
            "missing field `key`",
        ),
        bad(
            "a null key",
            &br#"{"key":null}"#[..],
            "data",
            "invalid type: null",
        ),
        bad(
            "an empty key",
            &br#"{"key":""}"#[..],
            "data.key",
            "must not be empty",
        ),
        bad(
            "invalid UTF-8",
            vec![b'{', 0xff, 0xfe, b'}'],
            "data",
            "expected",
        ),
        bad(
            "nested 10,000 deep",
            nested(10_000),
            "data",
            "invalid type: sequence",
        ),
        bad("a JSON array", &b"[1, 2]"[..], "data", "invalid type"),
        bad(
            "an unknown field",
            &br#"{"key":"u","colour":1}"#[..],
            "data",
            "unknown field",
        ),
        bad(
            "an amount past u64",
            &br#"{"key":"u","amount":18446744073709551616}"#[..],
            "data",
            "invalid",
        ),
    ];
    let counted = |runtime: &LocalRuntime, _: usize| {
        let queue = runtime.resource("CountsQueue").unwrap();
        let counts = runtime.services.sqs.messages(&queue);
        counts.iter().any(|m| m.body.contains(r#""count":2"#))
    };
    let target = Stream {
        stream: "ClicksStream",
        operator: "keyed-counter",
        partition_key: "user-1",
        prepare: &nothing,
        good: &click,
        applied: &counted,
    };
    each_dead_lettered(&target, &cases).await;
}

#[tokio::test(start_paused = true)]
async fn the_identity_enricher_dead_letters_each_bad_cloudtrail_record_and_enriches_the_rest() {
    use keyway_tests::trails::{alice, record};
    let good = |n: usize| {
        serde_json::to_vec(&record(&format!("good-{n}"), alice(), "ListBuckets", None)).unwrap()
    };
    let mut no_identity = record("x", alice(), "ListBuckets", None);
    no_identity.as_object_mut().unwrap().remove("userIdentity");
    let mut null_identity = record("x", alice(), "ListBuckets", None);
    null_identity["userIdentity"] = Value::Null;
    let mut numeric_name = record("x", alice(), "ListBuckets", None);
    numeric_name["eventName"] = json!(7);
    let mut no_account = record("x", alice(), "ListBuckets", None);
    no_account
        .as_object_mut()
        .unwrap()
        .remove("recipientAccountId");
    no_account["userIdentity"]
        .as_object_mut()
        .unwrap()
        .remove("accountId");
    let text = |v: Value| serde_json::to_vec(&v).unwrap();
    let cases = [
        bad(
            "cut JSON",
            &br#"{"eventVersion": "1.08", "userId"#[..],
            "data",
            "not JSON",
        ),
        bad(
            "a JSON array",
            &b"[]"[..],
            "userIdentity",
            "missing, or not an object",
        ),
        bad(
            "no userIdentity",
            text(no_identity),
            "userIdentity",
            "missing",
        ),
        bad(
            "a null userIdentity",
            text(null_identity),
            "userIdentity",
            "not an object",
        ),
        bad(
            "a numeric eventName",
            text(numeric_name),
            "eventName",
            "not a string",
        ),
        bad(
            "no account",
            text(no_account),
            "recipientAccountId",
            "missing",
        ),
        bad("invalid UTF-8", utf8_broken(), "data", "invalid unicode"),
        bad(
            "nested 10,000 deep",
            nested(10_000),
            "data",
            "recursion limit",
        ),
    ];
    let enriched = |runtime: &LocalRuntime, n: usize| {
        let stream = runtime.resource("EnrichedStream").unwrap();
        runtime.services.kinesis.records(&stream).iter().any(|r| {
            serde_json::from_slice::<Value>(&r.data).unwrap()["eventID"] == format!("good-{n}")
        })
    };
    let target = Stream {
        stream: "CloudTrailStream",
        operator: "identity-enricher",
        partition_key: "111111111111#AKIAALICE",
        prepare: &nothing,
        good: &good,
        applied: &enriched,
    };
    each_dead_lettered(&target, &cases).await;
}

#[tokio::test(start_paused = true)]
async fn the_dynamic_filter_dead_letters_each_bad_event_and_delivers_the_rest() {
    let good = |n: usize| {
        json!({"id": format!("good-{n}"), "key": "sheet-1"})
            .to_string()
            .into_bytes()
    };
    let cases = [
        bad("cut JSON", &br#"{"id": "x", "ke"#[..], "data", "not JSON"),
        bad(
            "no filter key",
            &br#"{"id": "x"}"#[..],
            "data/key",
            "missing",
        ),
        bad(
            "a null filter key",
            &br#"{"key": null}"#[..],
            "data/key",
            "must be a string or a number",
        ),
        bad(
            "an object filter key",
            &br#"{"key": {"a": 1}}"#[..],
            "data/key",
            "must be a string or a number",
        ),
        bad("invalid UTF-8", vec![b'{', 0xff, b'}'], "data", "not UTF-8"),
        bad(
            "nested 10,000 deep",
            nested(10_000),
            "data",
            "recursion limit",
        ),
    ];
    let delivered = |runtime: &LocalRuntime, n: usize| {
        keyway_tests::received_ids(&runtime.services.sqs, "keyway-live_events")
            .contains(&format!("good-{n}"))
    };
    // live subscribed to sheet-1 first.
    let subscribe = |runtime: &LocalRuntime| {
        runtime.services.sqs.create_queue("keyway-live_events");
        let table = runtime.resource("PolicyTable").unwrap();
        let subscription = Subscription {
            identity: Identity {
                consumer: "live".into(),
                id: "key#sheet-1".into(),
            },
            target: Target::Key("sheet-1".into()),
            queue: "keyway-live_events".into(),
            pattern: None,
        };
        let policies = runtime.services.dynamodb.table(&table).unwrap();
        policies.put_item(subscription.to_item(EPOCH)).unwrap();
    };
    let target = Stream {
        stream: "FilterEventsStream",
        operator: "dynamic-filter",
        partition_key: "sheet-1",
        prepare: &subscribe,
        good: &good,
        applied: &delivered,
    };
    each_dead_lettered(&target, &cases).await;
}

#[tokio::test(start_paused = true)]
async fn the_cdc_rekey_dead_letters_each_bad_change_and_rekeys_the_rest() {
    let change = |op: &str, after: Value| {
        json!({"before": null, "after": after, "op": op,
               "source": {"connector": "postgresql", "table": "domains", "lsn": 5, "ts_ms": 1}})
    };
    let good = |n: usize| {
        change("c", json!({"id": n, "user_id": 1}))
            .to_string()
            .into_bytes()
    };
    let text = |v: Value| v.to_string().into_bytes();
    let cases = [
        bad(
            "cut JSON",
            &br#"{"before": null, "aft"#[..],
            "data",
            "not JSON",
        ),
        bad(
            "an unknown op",
            text(change("x", json!({"id": 9}))),
            "op",
            "\"x\"",
        ),
        bad(
            "an update without its row",
            text(change("u", Value::Null)),
            "after",
            "missing",
        ),
        bad(
            "a row that is a string",
            text(change("c", json!("id=9"))),
            "after",
            "object",
        ),
        bad("invalid UTF-8", utf8_broken(), "data", "invalid unicode"),
        bad(
            "nested 10,000 deep",
            nested(10_000),
            "data",
            "recursion limit",
        ),
    ];
    let rekeyed = |runtime: &LocalRuntime, _: usize| {
        let stream = runtime.resource("CdcChangelogStream").unwrap();
        runtime.services.kinesis.records(&stream).len() >= 2
    };
    let target = Stream {
        stream: "CdcChangesStream",
        operator: "cdc-rekey",
        partition_key: "{\"id\":1}",
        prepare: &nothing,
        good: &good,
        applied: &rekeyed,
    };
    each_dead_lettered(&target, &cases).await;
}

#[tokio::test(start_paused = true)]
async fn the_keyed_aggregation_dead_letters_each_bad_value_and_aggregates_the_rest() {
    let good = |n: usize| json!({"key": "k", "value": n}).to_string().into_bytes();
    let cases = [
        bad("cut JSON", &br#"{"key": "k", "va"#[..], "data", "expected"),
        bad("no key", &br#"{"value": 1}"#[..], "data/key", "missing"),
        bad("invalid UTF-8", vec![b'{', 0xff, b'}'], "data", "UTF-8"),
        bad(
            "nested 10,000 deep",
            nested(10_000),
            "data",
            "nested too deep",
        ),
    ];
    let counted = |runtime: &LocalRuntime, _: usize| {
        let stream = runtime.resource("AggregateResultsStream").unwrap();
        runtime
            .services
            .kinesis
            .records(&stream)
            .iter()
            .any(|r| String::from_utf8_lossy(&r.data).contains(r#""count":2"#))
    };
    let target = Stream {
        stream: "AggregateEventsStream",
        operator: "keyed-aggregate",
        partition_key: "k",
        prepare: &nothing,
        good: &good,
        applied: &counted,
    };
    each_dead_lettered(&target, &cases).await;
}

/// A policy item of `consumer`'s subscription to sheet-1 delivered to `queue`, its pattern as
/// written.
fn policy_item(consumer: &str, queue: &str, pattern: Option<String>) -> keyway::domain::Item {
    let mut item = Subscription {
        identity: Identity {
            consumer: consumer.into(),
            id: "key#sheet-1".into(),
        },
        target: Target::Key("sheet-1".into()),
        queue: queue.into(),
        pattern: None,
    }
    .to_item(EPOCH);
    if let Some(pattern) = pattern {
        item.insert("pattern".into(), AttrValue::S(pattern));
    }
    item
}

/// Writes `hostile`, then a good subscription of live, in the shared policy table of a fresh
/// stack: the hostile one is dead-lettered saying `field` and `problem`, counted, and only live's
/// reaches the filter state.
async fn refused_by_the_policy_sync(
    what: &str,
    hostile: keyway::domain::Item,
    field: &str,
    problem: &str,
) {
    let mut runtime = stack();
    let table = runtime.resource("PolicyTable").unwrap();
    let policies = runtime.services.dynamodb.table(&table).unwrap();
    policies.put_item(hostile).unwrap();
    let mut good = policy_item("live", "keyway-live_events", None);
    good.insert("subscription".into(), AttrValue::S("key#sheet-2".into()));
    good.insert("filterKey".into(), AttrValue::S("sheet-2".into()));
    policies.put_item(good).unwrap();
    runtime
        .run_until_idle(Duration::from_secs(600))
        .await
        .unwrap();
    let letters = dead_letters(&runtime);
    assert_eq!(letters.len(), 1, "{what}: {letters:?}");
    assert_eq!(letters[0].field, field, "{what}: {letters:?}");
    assert!(letters[0].problem.contains(problem), "{what}: {letters:?}");
    let counted = counted_dead_letters(&runtime, "filter-policy-sync");
    assert_eq!(counted, 1, "{what}");
    let state = runtime.resource("FilterStateTable").unwrap();
    let state = dynamic_filter::store::FilterState::new(
        runtime.services.dynamodb.table(&state).unwrap(),
        runtime.services.clock.clone(),
    );
    let (_, rows) = state.snapshot().await.unwrap();
    assert_eq!(rows.len(), 1, "{what}: only live's subscription applied");
    assert_eq!(rows[0].identity.consumer, "live", "{what}");
}

#[tokio::test(start_paused = true)]
async fn the_policy_sync_dead_letters_each_hostile_subscription_and_applies_the_rest() {
    let mallory = |pattern: String| policy_item("mallory", "keyway-mallory_q", Some(pattern));
    let deep = format!("{}[1]{}", r#"{"a":"#.repeat(200), "}".repeat(200));
    let many_keys: BTreeMap<String, Value> =
        (0..6).map(|i| (format!("k{i}"), json!([i]))).collect();
    let combinations = json!({"a": (0..20).collect::<Vec<_>>(), "b": (0..20).collect::<Vec<_>>()});
    let huge = json!({"a": ["x".repeat(300_000)]});
    let cases = [
        ("not JSON", mallory("{".into()), "pattern", "not JSON"),
        (
            "nested 200 deep",
            mallory(deep),
            "pattern",
            "recursion limit",
        ),
        (
            "a regex-like operator",
            mallory(r#"{"a": [{"wildcard": "*.*"}]}"#.into()),
            "pattern",
            "unknown operator",
        ),
        (
            "six keys",
            mallory(serde_json::to_string(&many_keys).unwrap()),
            "pattern",
            "at most 5",
        ),
        (
            "400 combinations",
            mallory(combinations.to_string()),
            "pattern",
            "150",
        ),
        (
            "300 KB",
            mallory(huge.to_string()),
            "pattern",
            "at most 262144",
        ),
        (
            "a queue of another consumer",
            policy_item("mallory", "keyway-live_events", None),
            "queue",
            "not a queue of consumer",
        ),
    ];
    for (what, hostile, field, problem) in cases {
        refused_by_the_policy_sync(what, hostile, field, problem).await;
    }
}

/// The keyed counter's function on embedded services, with its dead-letter queue's URL.
fn counter() -> (
    std::sync::Arc<LocalServices>,
    keyway::lambda::StreamHandler<keyed_counter::KeyedCounter>,
    String,
) {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    let (handler, dead) = keyway_tests::keyed_counter_on(&services);
    (services, handler, dead)
}

fn invocation() -> keyway::lambda::Invocation {
    keyway::lambda::Invocation {
        request_id: "r-1".into(),
        deadline_millis: None,
    }
}

/// A Kinesis event record of the counter's stream with `data` as its (base64) data field.
fn kinesis_record(sequence: &str, data: &str) -> Value {
    json!({
        "kinesis": {"kinesisSchemaVersion": "1.0", "partitionKey": "user-1",
                    "sequenceNumber": sequence, "data": data,
                    "approximateArrivalTimestamp": 1767225600.0},
        "eventSource": "aws:kinesis", "eventVersion": "1.0",
        "eventID": format!("shardId-000000000000:{sequence}"),
        "eventName": "aws:kinesis:record", "awsRegion": "us-east-1",
        "invokeIdentityArn": "arn:aws:iam::000000000000:role/r",
        "eventSourceARN": "arn:aws:kinesis:us-east-1:000000000000:stream/clicks"
    })
}

#[tokio::test]
async fn a_record_whose_data_is_not_base64_is_dead_lettered_and_its_batch_goes_on() {
    use keyway::lambda::Handler;
    let (services, handler, dead) = counter();
    let click = "eyJrZXkiOiJ1c2VyLTEifQ=="; // {"key":"user-1"}
    let event = json!({"Records": [
        kinesis_record("1", click),
        kinesis_record("2", "!!! not base64 !!!"),
        kinesis_record("3", click),
    ]});
    let response = handler
        .handle(&event.to_string(), &invocation())
        .await
        .unwrap();
    assert_eq!(response.to_json(), json!({"batchItemFailures": []}));
    let letters = keyway_tests::dead_letters_on(&services.sqs, &dead);
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].field, "kinesis.data");
    assert!(letters[0].problem.contains("base64"), "{letters:?}");
    assert_eq!(letters[0].sequence_number.as_deref(), Some("2"));
}

/// SQS refuses a body holding U+FFFE or U+FFFF (outside XML's characters), which JSON writes as
/// they are: such a count, and such a record's dead letter, went nowhere and held their record
/// back until Lambda gave it up a day later.
#[tokio::test]
async fn a_key_holding_characters_sqs_refuses_is_counted_and_a_bad_record_holding_them_dead_lettered(
) {
    use base64::Engine;
    use keyway::lambda::Handler;
    let (services, handler, dead) = counter();
    let data = |json: &str| base64::engine::general_purpose::STANDARD.encode(json);
    let event = json!({"Records": [
        kinesis_record("1", &data("{\"key\":\"a\u{ffff}b\u{fffe}\"}")),
        kinesis_record("2", &data("{\"key\":\"\u{ffff}\",\"colour\":1}")),
        kinesis_record("3", &data("{\"key\":\"a\u{ffff}b\u{fffe}\"}")),
    ]});
    let response = handler
        .handle(&event.to_string(), &invocation())
        .await
        .unwrap();
    assert_eq!(response.to_json(), json!({"batchItemFailures": []}));
    let counts: Vec<keyed_counter::CountUpdate> = services
        .sqs
        .messages(&format!("{}counts", keyway_local::LocalSqs::URL_PREFIX))
        .iter()
        .map(|m| serde_json::from_str(&m.body).unwrap())
        .collect();
    let keys_and_counts: Vec<(&str, u64)> =
        counts.iter().map(|c| (c.key.as_str(), c.count)).collect();
    assert_eq!(
        keys_and_counts,
        [("a\u{ffff}b\u{fffe}", 1), ("a\u{ffff}b\u{fffe}", 2)],
        "the counts go out, their key whole once the JSON is read"
    );
    let letters = keyway_tests::dead_letters_on(&services.sqs, &dead);
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(letters[0].problem.contains("unknown field"), "{letters:?}");
    assert_eq!(letters[0].sequence_number.as_deref(), Some("2"));
}

#[tokio::test]
async fn a_dynamodb_streams_event_given_to_a_kinesis_function_is_dead_lettered_record_by_record() {
    use keyway::lambda::Handler;
    let (services, handler, dead) = counter();
    let change = |sequence: &str| {
        json!({"eventID": sequence, "eventName": "INSERT", "eventSource": "aws:dynamodb",
               "eventSourceARN": "arn:aws:dynamodb:us-east-1:000000000000:table/t/stream/2026-01-01T00:00:00.000",
               "dynamodb": {"Keys": {"id": {"S": "a"}}, "NewImage": {"id": {"S": "a"}},
                            "SequenceNumber": sequence, "StreamViewType": "NEW_IMAGE"}})
    };
    let event = json!({ "Records": [change("100"), change("200")] });
    let response = handler
        .handle(&event.to_string(), &invocation())
        .await
        .unwrap();
    assert_eq!(response.to_json(), json!({"batchItemFailures": []}));
    let letters = keyway_tests::dead_letters_on(&services.sqs, &dead);
    assert_eq!(letters.len(), 2, "{letters:?}");
    for letter in &letters {
        assert_eq!(letter.field, "record", "{letter:?}");
        assert!(
            letter.problem.contains("expected a Kinesis record"),
            "{letter:?}"
        );
    }
}

#[tokio::test]
async fn an_event_that_is_no_batch_at_all_fails_its_invocation_saying_why_and_panics_nowhere() {
    use keyway::lambda::Handler;
    let (_, handler, _) = counter();
    for (event, says) in [
        ("not json", "not JSON"),
        (r#"{"Records": 7}"#, "Records"),
        (r#"{"Records": [7]}"#, "record"),
        (
            &format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)),
            "recursion limit",
        ),
    ] {
        match handler.handle(event, &invocation()).await {
            Err(e) => assert!(e.to_string().contains(says), "{event:.40}: {e}"),
            Ok(response) => assert!(
                response.to_json().to_string().contains("batchItemFailures"),
                "{event:.40}: {response:?}"
            ),
        }
    }
}
