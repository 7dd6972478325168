//! The limits of AWS the stack must live with, on the embedded runtime as template.yaml wires
//! it: a sink down for an hour loses nothing (the mappings retry a failing batch until its
//! records are a day old, and keyway dead-letters what no retry can fix, so only an outage makes
//! them retry); a key with a hundred thousand records waiting for its identity holds them in
//! state past DynamoDB's item size and releases every one.

use std::collections::BTreeMap;
use std::time::Duration;

use keyway::ports::Clock;
use keyway_local::{FaultPlan, LocalRuntime, LocalServices};
use serde_json::Value;

const EPOCH: i64 = 1_767_225_600_000;
const MINUTE: i64 = 60_000;

#[tokio::test(start_paused = true)]
async fn a_queue_down_for_an_hour_loses_no_count_and_no_output() {
    // The counts queue (and every queue) is down from the tenth minute to the seventieth, while
    // clicks keep coming for eighty minutes.
    let faults = FaultPlan {
        outage_window: Some((EPOCH + 10 * MINUTE, EPOCH + 70 * MINUTE)),
        ..FaultPlan::default()
    };
    let services = LocalServices::new(EPOCH, faults);
    let mut runtime =
        LocalRuntime::from_template(keyway_stack::TEMPLATE, services, &keyway_stack::functions())
            .expect("the template runs");
    let stream = runtime.resource("ClicksStream").unwrap();
    let queue = runtime.resource("CountsQueue").unwrap();
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    // How many messages the queue holds, by the time the loop reads it.
    let mut queued_at = BTreeMap::new();
    for minute in 0..80 {
        let now = runtime.services.clock.now_millis();
        queued_at.insert(now, runtime.services.sqs.messages(&queue).len());
        let records: Vec<(String, Vec<u8>)> = (0..50)
            .map(|i| {
                let user = format!("user-{}", (minute * 50 + i) % 37);
                *expected.entry(user.clone()).or_default() += 1;
                let data = format!(r#"{{"key":"{user}"}}"#).into_bytes();
                (user, data)
            })
            .collect();
        runtime
            .services
            .kinesis
            .put_in_order(&stream, &records)
            .await
            .unwrap();
        runtime.run_for(Duration::from_secs(60)).await;
    }
    runtime
        .run_until_idle(Duration::from_secs(3 * 3600))
        .await
        .expect("every record applied once the queue is back");
    let outages = runtime.services.faults_fired()["sqs"][&keyway_local::Fault::Outage];
    assert_eq!(outages, 1, "one outage, of the whole window");
    let during: Vec<usize> = queued_at
        .range(EPOCH + 11 * MINUTE..EPOCH + 70 * MINUTE)
        .map(|(_, &n)| n)
        .collect();
    assert!(
        during.len() > 50 && during[0] > 0,
        "counts went out before the outage"
    );
    assert!(
        during.iter().all(|&n| n == during[0]),
        "nothing went out while it lasted: {during:?}"
    );
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    let mut ids = std::collections::BTreeSet::new();
    for message in runtime.services.sqs.messages(&queue) {
        ids.insert(message.output_id.clone().unwrap());
        let body: Value = serde_json::from_str(&message.body).unwrap();
        let count = body["count"].as_u64().unwrap();
        let entry = last
            .entry(body["key"].as_str().unwrap().to_owned())
            .or_default();
        *entry = (*entry).max(count);
    }
    assert_eq!(last, expected, "every key's last count");
    assert_eq!(ids.len(), 80 * 50, "an output for every click");
    let failed = runtime.resource("FailedBatchesQueue").unwrap();
    assert!(
        runtime.services.sqs.messages(&failed).is_empty(),
        "no batch given up"
    );
    let dead = runtime.resource("DeadLetterQueue").unwrap();
    assert!(runtime.services.sqs.messages(&dead).is_empty());
}

#[tokio::test]
async fn a_key_with_a_hundred_thousand_records_waiting_holds_them_and_releases_every_one() {
    use identity_enricher::enricher::{EnricherConfig, IdentityEnricher, ENRICHED, EVENTS};
    use identity_enricher::enricher::{FEEDBACK, RESOLUTIONS};
    use keyway::sources::kinesis::decode_event;
    use keyway_tests::harness::{Shard, World};
    use keyway_tests::trails::{record, session, ACCOUNT};
    let world = World::new(&[ENRICHED.name, RESOLUTIONS.name]);
    let inputs = keyway::Inputs::new()
        .with(&EVENTS, "cloudtrail")
        .with(&FEEDBACK, "feedback");
    let config = EnricherConfig {
        max_buffered: 100_000,
        ..EnricherConfig::default()
    };
    let executor = keyway::Executor::with_inputs(
        IdentityEnricher::new(config),
        inputs,
        world.store.clone(),
        world.sinks(),
        world.clock.clone(),
    )
    .unwrap();
    // A hundred thousand calls with one session's key, whose issuing call has not come: ten
    // batches of ten thousand, Lambda's largest.
    let key = format!("{ACCOUNT}#ASIA9");
    let mut events = Shard::new("cloudtrail", 0);
    for batch in 0..10 {
        let records: Vec<(&str, Vec<u8>)> = (0..10_000)
            .map(|i| {
                let id = format!("call-{}", batch * 10_000 + i);
                let call = record(&id, session("ASIA9", "role-9"), "GetObject", None);
                (key.as_str(), serde_json::to_vec(&call).unwrap())
            })
            .collect();
        let report = executor
            .run(decode_event(&events.batch(&records).to_string()).unwrap())
            .await;
        assert_eq!((report.applied, report.failed_from), (10_000, None));
    }
    assert!(world.outputs(ENRICHED.name).is_empty(), "all waiting");
    let largest = world.largest_item();
    assert!(largest <= 400 * 1024, "every item fits DynamoDB: {largest}");
    // The resolution comes: every record goes out, once, resolved.
    let resolution = serde_json::json!({
        "customer": ACCOUNT, "account": ACCOUNT, "accessKeyId": "ASIA9",
        "originalActor": {"type": "IAMUser", "arn": format!("arn:aws:iam::{ACCOUNT}:user/alice")},
        "roleChain": [{"roleArn": format!("arn:aws:iam::{ACCOUNT}:role/role-9"),
                       "sessionName": "role-9-session", "accessKeyId": "ASIA9"}]
    });
    let mut feedback = Shard::new("feedback", 0);
    let batch = feedback.batch(&[(key.as_str(), resolution.to_string().into_bytes())]);
    let report = executor
        .run(decode_event(&batch.to_string()).unwrap())
        .await;
    assert_eq!(report.failed_from, None);
    let out = world.outputs(ENRICHED.name);
    let ids: std::collections::BTreeSet<String> = out
        .iter()
        .map(|m| {
            let body: Value = serde_json::from_str(&m.body).unwrap();
            assert_eq!(body["enrichment"]["status"], "resolved");
            body["eventID"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!((out.len(), ids.len()), (100_000, 100_000));
}
