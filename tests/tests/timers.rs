//! Keyed timers on the embedded runtime: a stack whose function sets timers and whose schedule
//! sweeps them (SAM's `Schedule` event, or the `AWS::Events::Rule` the CDK synthesizes), run on
//! the virtual clock. A timer fires within a minute of its time though its key receives nothing
//! more, exactly once per (key, time) also under faults.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keyway::lambda::{sink_from, state_store_from, Handler, StreamHandler};
use keyway::{Executor, Sinks};
use keyway_local::{Factory, FaultPlan, LocalRuntime, LocalServices};
use keyway_tests::operators::{IdleNotice, IdleSessions, IDLE_MILLIS, NOTICES};

const EPOCH: i64 = 1_767_225_600_000;
const MINUTE: i64 = 60_000;

const SAM: &str = r#"
Transform: AWS::Serverless-2016-10-31
Resources:
  StateTable:
    Type: AWS::DynamoDB::Table
    Properties:
      AttributeDefinitions:
        - { AttributeName: pk, AttributeType: S }
        - { AttributeName: sk, AttributeType: S }
      KeySchema:
        - { AttributeName: pk, KeyType: HASH }
        - { AttributeName: sk, KeyType: RANGE }
  VisitsStream:
    Type: AWS::Kinesis::Stream
    Properties: { ShardCount: 2 }
  NoticesQueue:
    Type: AWS::SQS::Queue
  DeadLetterQueue:
    Type: AWS::SQS::Queue
  SessionsFunction:
    Type: AWS::Serverless::Function
    Properties:
      Timeout: 60
      Environment:
        Variables:
          STATE_TABLE: !Ref StateTable
          NOTICES_SINK: !Sub "sqs:${NoticesQueue}"
          DEAD_LETTER_SINK: !Sub "sqs:${DeadLetterQueue}"
      Events:
        Visits:
          Type: Kinesis
          Properties:
            Stream: !GetAtt VisitsStream.Arn
            StartingPosition: TRIM_HORIZON
            BatchSize: 100
            FunctionResponseTypes: [ReportBatchItemFailures]
        TimerSweep:
          Type: Schedule
          Properties:
            Schedule: rate(1 minute)
"#;

/// The same stack as the CDK synthesizes it: a plain function, a mapping, and a rule.
const SYNTHESIZED: &str = r#"{"Resources": {
  "StateTable": {"Type": "AWS::DynamoDB::Table", "Properties": {
    "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]}},
  "VisitsStream": {"Type": "AWS::Kinesis::Stream", "Properties": {"ShardCount": 2}},
  "NoticesQueue": {"Type": "AWS::SQS::Queue"},
  "DeadLetterQueue": {"Type": "AWS::SQS::Queue"},
  "SessionsFunction": {"Type": "AWS::Lambda::Function", "Properties": {
    "Timeout": 60,
    "Environment": {"Variables": {
      "STATE_TABLE": {"Ref": "StateTable"},
      "NOTICES_SINK": {"Fn::Join": ["", ["sqs:", {"Ref": "NoticesQueue"}]]},
      "DEAD_LETTER_SINK": {"Fn::Join": ["", ["sqs:", {"Ref": "DeadLetterQueue"}]]}}}}},
  "SessionsFunctionVisits": {"Type": "AWS::Lambda::EventSourceMapping", "Properties": {
    "FunctionName": {"Ref": "SessionsFunction"},
    "EventSourceArn": {"Fn::GetAtt": ["VisitsStream", "Arn"]},
    "StartingPosition": "TRIM_HORIZON", "BatchSize": 100,
    "FunctionResponseTypes": ["ReportBatchItemFailures"]}},
  "SessionsFunctionTimerSweep": {"Type": "AWS::Events::Rule", "Properties": {
    "ScheduleExpression": "rate(1 minute)", "State": "ENABLED",
    "Targets": [{"Arn": {"Fn::GetAtt": ["SessionsFunction", "Arn"]}, "Id": "Target0"}]}}
}}"#;

fn factories() -> BTreeMap<String, Factory> {
    let mut factories: BTreeMap<String, Factory> = BTreeMap::new();
    factories.insert(
        "SessionsFunction".into(),
        Box::new(|platform, env| {
            let sinks = Sinks::new(sink_from(platform, env, "DEAD_LETTER_SINK")?)
                .with(&NOTICES, sink_from(platform, env, "NOTICES_SINK")?);
            let store = state_store_from(platform, env, "STATE_TABLE")?;
            let executor = Executor::new(IdleSessions, store, sinks, platform.clock())?;
            Ok(Arc::new(StreamHandler::new(executor)) as Arc<dyn Handler>)
        }),
    );
    factories
}

async fn visit(runtime: &LocalRuntime, users: &[&str]) {
    let stream = runtime.resource("VisitsStream").unwrap();
    let records: Vec<(String, Vec<u8>)> = users
        .iter()
        .map(|u| (u.to_string(), format!(r#"{{"user":"{u}"}}"#).into_bytes()))
        .collect();
    runtime
        .services
        .kinesis
        .put_in_order(&stream, &records)
        .await
        .unwrap();
}

/// The notices sent, by output id, each with every body sent under that id.
fn notices(runtime: &LocalRuntime) -> BTreeMap<String, Vec<IdleNotice>> {
    let queue = runtime.resource("NoticesQueue").unwrap();
    let mut by_id: BTreeMap<String, Vec<IdleNotice>> = BTreeMap::new();
    for message in runtime.services.sqs.messages(&queue) {
        let id = message.output_id.expect("outputs carry their id");
        by_id
            .entry(id)
            .or_default()
            .push(serde_json::from_str(&message.body).unwrap());
    }
    by_id
}

/// Visits of two users, one of whom comes back half a minute later, then the stack left alone
/// for the idle time and some minutes more.
async fn two_sessions(template: &str, faults: FaultPlan) -> LocalRuntime {
    let services = LocalServices::new(EPOCH, faults);
    let mut runtime = LocalRuntime::from_template(template, services, &factories()).unwrap();
    visit(&runtime, &["u1", "u1", "u2", "u1"]).await;
    runtime
        .run_until_idle(Duration::from_secs(600))
        .await
        .unwrap();
    runtime.run_for(Duration::from_secs(30)).await;
    visit(&runtime, &["u1"]).await;
    runtime
        .run_until_idle(Duration::from_secs(600))
        .await
        .unwrap();
    runtime
        .run_for(Duration::from_millis((IDLE_MILLIS + 5 * MINUTE) as u64))
        .await;
    runtime
}

/// Every notice once by id, and what each id carried (its duplicates carry the same session).
fn sessions_noticed(runtime: &LocalRuntime) -> BTreeMap<String, (u64, IdleNotice)> {
    notices(runtime)
        .into_values()
        .map(|sent| {
            let first = sent[0].clone();
            for again in &sent[1..] {
                assert_eq!(
                    (&again.user, again.visits, again.last_seen),
                    (&first.user, first.visits, first.last_seen),
                    "an output id stands for one notice"
                );
            }
            (first.user.clone(), (sent.len() as u64, first))
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_key_that_receives_nothing_more_gets_its_timer_within_a_minute_of_its_time() {
    let runtime = two_sessions(SAM, FaultPlan::default()).await;
    let noticed = sessions_noticed(&runtime);
    let users: Vec<(&str, u64, u64)> = noticed
        .iter()
        .map(|(u, (copies, n))| (u.as_str(), n.visits, *copies))
        .collect();
    assert_eq!(users, [("u1", 4, 1), ("u2", 1, 1)], "one notice a session");
    for (_, notice) in noticed.values() {
        let due = notice.last_seen + IDLE_MILLIS;
        let late = notice.noticed_at - due;
        assert!(
            (0..=MINUTE).contains(&late),
            "{} was noticed {late} ms after its timer",
            notice.user
        );
    }
    assert!(
        noticed["u1"].1.last_seen >= EPOCH + 30_000,
        "u1's timer moved with its last visit"
    );
    let schedules = runtime.schedules();
    assert_eq!(schedules.len(), 1);
    let (name, stats) = &schedules[0];
    assert_eq!(name, "SessionsFunction/TimerSweep");
    assert!(stats.invocations >= 5 && stats.errors == 0, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn the_synthesized_stack_sweeps_its_timers_as_the_sam_stack_does() {
    let sam = two_sessions(SAM, FaultPlan::default()).await;
    let synthesized = two_sessions(SYNTHESIZED, FaultPlan::default()).await;
    assert_eq!(sessions_noticed(&synthesized), sessions_noticed(&sam));
    assert_eq!(synthesized.schedules(), sam.schedules());
}

#[tokio::test(start_paused = true)]
async fn under_faults_every_timer_fires_exactly_once_for_its_session() {
    let mut all = keyway_local::services::faults::FaultCounts::new();
    for seed in 1..=8 {
        let runtime = two_sessions(SAM, FaultPlan::all(0.2, seed)).await;
        let noticed = sessions_noticed(&runtime);
        let sessions: Vec<(&str, u64)> = noticed
            .iter()
            .map(|(u, (_, n))| (u.as_str(), n.visits))
            .collect();
        assert_eq!(sessions, [("u1", 4), ("u2", 1)], "seed {seed}");
        for (service, counts) in runtime.services.faults_fired() {
            println!("seed {seed}: {service} {counts:?}");
            keyway_local::services::faults::add_counts(&mut all, &counts);
        }
    }
    use keyway_local::services::faults::Fault;
    for kind in [
        Fault::Conflict,
        Fault::LostResponse,
        Fault::CrashBeforeCommit,
        Fault::CrashInCommit,
        Fault::Throttle,
    ] {
        assert!(all.contains_key(&kind), "{kind:?} never fired: {all:?}");
    }
}
