//! SQS as an event source on the embedded runtime, as the Lambda Developer Guide's "Using Lambda
//! with Amazon SQS" describes it; each test names the section it follows. The stacks are
//! templates, as users write them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use keyway::lambda::{FunctionError, Handler, Invocation, Response};
use keyway::ports::Clock;
use keyway_local::{Factory, FaultPlan, LocalRuntime, LocalServices};
use serde_json::{json, Value};

const EPOCH: i64 = 1_767_225_600_000;

/// A message as the function saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Message {
    id: String,
    body: String,
    receive_count: u32,
    group: Option<String>,
    /// When it was invoked with it (virtual milliseconds since the start).
    at: i64,
}

type Script = dyn Fn(usize, &[Message]) -> Result<Value, FunctionError> + Send + Sync;

/// A consumer whose answers the test scripts, remembering every batch.
struct Consumer {
    batches: Mutex<Vec<Vec<Message>>>,
    script: Box<Script>,
    clock: Mutex<Option<Arc<dyn Clock>>>,
}

impl Consumer {
    fn new(
        script: impl Fn(usize, &[Message]) -> Result<Value, FunctionError> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            batches: Mutex::default(),
            script: Box::new(script),
            clock: Mutex::default(),
        })
    }

    fn batches(&self) -> Vec<Vec<Message>> {
        self.batches.lock().unwrap().clone()
    }

    fn bodies(&self) -> Vec<Vec<String>> {
        let batches = self.batches();
        batches
            .iter()
            .map(|b| b.iter().map(|m| m.body.clone()).collect())
            .collect()
    }
}

#[async_trait]
impl Handler for Consumer {
    async fn handle(&self, event: &str, _: &Invocation) -> Result<Response, FunctionError> {
        let event: Value = serde_json::from_str(event).unwrap();
        let at = self.clock.lock().unwrap().as_ref().unwrap().now_millis() - EPOCH;
        let batch: Vec<Message> = event["Records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                assert_eq!(r["eventSource"], "aws:sqs");
                Message {
                    id: r["messageId"].as_str().unwrap().to_owned(),
                    body: r["body"].as_str().unwrap().to_owned(),
                    receive_count: r["attributes"]["ApproximateReceiveCount"]
                        .as_str()
                        .unwrap()
                        .parse()
                        .unwrap(),
                    group: r["attributes"]["MessageGroupId"]
                        .as_str()
                        .map(str::to_owned),
                    at,
                }
            })
            .collect();
        let call = {
            let mut batches = self.batches.lock().unwrap();
            batches.push(batch.clone());
            batches.len() - 1
        };
        // An SQS batch's partial batch response, as the script writes it.
        (self.script)(call, &batch).map(Response::Json)
    }
}

/// A stack of a queue `Work` (with `queue` properties), its dead-letter queue `Dead`, and a
/// function `Worker` (timeout 10 s) mapped to `Work` with `event` properties.
fn stack(queue: &str, event: &str) -> String {
    format!(
        r#"
Transform: AWS::Serverless-2016-10-31
Resources:
  Dead:
    Type: AWS::SQS::Queue
  Work:
    Type: AWS::SQS::Queue
    Properties:
{queue}
  Worker:
    Type: AWS::Serverless::Function
    Properties:
      Timeout: 10
      Events:
        Work:
          Type: SQS
          Properties:
            Queue: !GetAtt Work.Arn
{event}
"#
    )
}

/// Deploys `template` with `consumer` as its Worker.
fn deploy(
    template: &str,
    consumer: &Arc<Consumer>,
) -> Result<LocalRuntime, keyway_local::LocalError> {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    *consumer.clock.lock().unwrap() = Some(services.clock.clone());
    let handler: Arc<dyn Handler> = consumer.clone();
    let factory: Factory = Box::new(move |_, _| Ok(handler.clone()));
    let factories = BTreeMap::from([("Worker".to_owned(), factory)]);
    LocalRuntime::from_template(template, services, &factories)
}

fn send(runtime: &LocalRuntime, queue: &str, bodies: &[&str]) {
    let url = runtime.resource(queue).unwrap();
    for body in bodies {
        runtime
            .services
            .sqs
            .send_message(&url, (*body).to_owned())
            .unwrap();
    }
}

async fn run(runtime: &mut LocalRuntime) -> keyway_local::RunReport {
    runtime
        .run_until_idle(Duration::from_secs(24 * 3600))
        .await
        .unwrap()
}

const PLAIN: &str = "      VisibilityTimeout: 30";

/// "Using Lambda with Amazon SQS", batching behavior: a batch holds at most BatchSize messages;
/// without a batching window Lambda invokes with what one poll finds.
#[tokio::test(start_paused = true)]
async fn a_queue_is_read_in_batches_of_at_most_the_batch_size() {
    let f = Consumer::new(|_, _| Ok(Value::Null));
    let mut runtime = deploy(&stack(PLAIN, "            BatchSize: 4"), &f).unwrap();
    let bodies: Vec<String> = (0..10).map(|i| i.to_string()).collect();
    send(
        &runtime,
        "Work",
        &bodies.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let report = run(&mut runtime).await;
    assert_eq!(
        f.batches().iter().map(Vec::len).collect::<Vec<_>>(),
        [4, 4, 2]
    );
    assert_eq!(report.mappings[0].1.records_done, 10);
    let url = runtime.resource("Work").unwrap();
    assert_eq!(runtime.services.sqs.held(&url), 0, "every message deleted");
}

/// "Using Lambda with Amazon SQS", batching window: with MaximumBatchingWindowInSeconds, Lambda
/// gathers messages until the batch is full or the window has passed.
#[tokio::test(start_paused = true)]
async fn a_batching_window_gathers_messages_until_it_passes_or_the_batch_is_full() {
    let f = Consumer::new(|_, _| Ok(Value::Null));
    let event = "            BatchSize: 50\n            MaximumBatchingWindowInSeconds: 5";
    let mut runtime = deploy(&stack(PLAIN, event), &f).unwrap();
    send(&runtime, "Work", &["a", "b", "c"]);
    run(&mut runtime).await;
    let batches = f.batches();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].len(), 3);
    assert_eq!(batches[0][0].at, 5_000, "invoked when the window passed");
}

/// "Using Lambda with Amazon SQS", backoff and failures: a failed invocation deletes nothing; the
/// messages come back once the visibility timeout passes, and the queue's redrive policy moves a
/// message received maxReceiveCount times to the dead-letter queue.
#[tokio::test(start_paused = true)]
async fn a_failing_message_returns_after_the_visibility_timeout_until_the_redrive_policy_moves_it()
{
    let f = Consumer::new(|_, _| Err(FunctionError::Failed("always".into())));
    let queue = "      VisibilityTimeout: 40\n      RedrivePolicy:\n        deadLetterTargetArn: !GetAtt Dead.Arn\n        maxReceiveCount: 3";
    let mut runtime = deploy(&stack(queue, "            BatchSize: 10"), &f).unwrap();
    send(&runtime, "Work", &["poison"]);
    let report = run(&mut runtime).await;
    let seen: Vec<(u32, i64)> = f
        .batches()
        .iter()
        .map(|b| (b[0].receive_count, b[0].at))
        .collect();
    assert_eq!(seen, [(1, 0), (2, 40_000), (3, 80_000)]);
    assert_eq!(report.mappings[0].1.function_errors, 3);
    let dead = runtime
        .services
        .sqs
        .messages(&runtime.resource("Dead").unwrap());
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body, "poison");
}

/// "Handling errors for an SQS event source", reporting batch item failures: only the messages
/// the response names stay in the queue; the others are deleted and never seen again.
#[tokio::test(start_paused = true)]
async fn a_partial_batch_response_keeps_only_the_named_messages() {
    let f = Consumer::new(|call, batch| {
        Ok(match call {
            0 => json!({"batchItemFailures": [{"itemIdentifier": batch[1].id}]}),
            _ => json!({"batchItemFailures": []}),
        })
    });
    let event = "            FunctionResponseTypes: [ReportBatchItemFailures]";
    let mut runtime = deploy(&stack(PLAIN, event), &f).unwrap();
    send(&runtime, "Work", &["a", "b", "c"]);
    let report = run(&mut runtime).await;
    assert_eq!(f.bodies(), [vec!["a", "b", "c"], vec!["b"]]);
    assert_eq!(f.batches()[1][0].receive_count, 2);
    assert_eq!(
        f.batches()[1][0].at,
        30_000,
        "back after the visibility timeout"
    );
    assert_eq!(report.mappings[0].1.partial_failures, 1);
}

/// "Handling errors for an SQS event source": an identifier that names no message of the batch,
/// or an empty one, fails the whole batch; without ReportBatchItemFailures the response is not
/// read at all.
#[tokio::test(start_paused = true)]
async fn a_malformed_partial_batch_response_fails_the_whole_batch_and_is_read_only_when_reported() {
    for (event, expected) in [
        (
            "            FunctionResponseTypes: [ReportBatchItemFailures]",
            2,
        ),
        ("            BatchSize: 10", 1),
    ] {
        let f = Consumer::new(|call, _| {
            Ok(match call {
                0 => json!({"batchItemFailures": [{"itemIdentifier": "no-such-message"}]}),
                _ => Value::Null,
            })
        });
        let mut runtime = deploy(&stack(PLAIN, event), &f).unwrap();
        send(&runtime, "Work", &["a", "b"]);
        run(&mut runtime).await;
        assert_eq!(f.batches().len(), expected, "{event}");
        assert!(f.batches().iter().all(|b| b.len() == 2));
    }
}

/// "Using Lambda with Amazon SQS", FIFO queues: Lambda keeps a message group's order by never
/// handing out a group's message while another of that group is in flight; other groups go on.
#[tokio::test(start_paused = true)]
async fn a_fifo_group_waits_while_its_failed_message_is_in_flight_and_other_groups_go_on() {
    let f = Consumer::new(|call, batch| match call {
        0 => Err(FunctionError::Failed(format!("{} failed", batch[0].body))),
        _ => Ok(Value::Null),
    });
    let queue =
        "      FifoQueue: true\n      ContentBasedDeduplication: true\n      VisibilityTimeout: 30";
    let mut runtime = deploy(&stack(queue, "            BatchSize: 1"), &f).unwrap();
    let url = runtime.resource("Work").unwrap();
    for (group, body) in [
        ("A", "a1"),
        ("A", "a2"),
        ("B", "b1"),
        ("B", "b2"),
        ("B", "b2"),
    ] {
        let entry = keyway::adapters::sqs::SqsEntry {
            id: "0",
            body,
            output_id: None,
            group_id: Some(group),
            deduplication_id: None,
        };
        use keyway::adapters::sqs::SqsApi as _;
        runtime
            .services
            .sqs
            .send_message_batch(&url, &[entry])
            .await
            .unwrap();
    }
    run(&mut runtime).await;
    let order: Vec<String> = f.bodies().into_iter().flatten().collect();
    // a1 fails and holds group A back for 30 s; B's messages go meanwhile; the second b2 was
    // the same content within five minutes, so the queue dropped it.
    assert_eq!(order, ["a1", "b1", "b2", "a1", "a2"]);
    assert!(f.batches().iter().flatten().all(|m| m.group.is_some()));
}

/// "Filtering events from an Amazon SQS event source": a message that matches no pattern is
/// deleted without invoking the function; a JSON body is filtered on as JSON.
#[tokio::test(start_paused = true)]
async fn messages_matching_no_filter_are_deleted_without_an_invocation() {
    let f = Consumer::new(|_, _| Ok(Value::Null));
    let event = "            FilterCriteria:\n              Filters:\n                - Pattern: '{\"body\": {\"kind\": [\"order\"]}}'";
    let mut runtime = deploy(&stack(PLAIN, event), &f).unwrap();
    send(
        &runtime,
        "Work",
        &[
            r#"{"kind":"order","n":1}"#,
            r#"{"kind":"ping"}"#,
            "not json",
        ],
    );
    let report = run(&mut runtime).await;
    assert_eq!(f.bodies(), [vec![r#"{"kind":"order","n":1}"#]]);
    assert_eq!(report.mappings[0].1.filtered_out, 2);
    let url = runtime.resource("Work").unwrap();
    assert_eq!(runtime.services.sqs.held(&url), 0, "nothing comes back");
}

/// CreateEventSourceMapping's checks of an SQS source, and the queue attributes the runtime does
/// not reproduce: each refused with its name and value.
#[test]
fn what_lambda_refuses_of_an_sqs_mapping_is_refused_by_name() {
    let cases = [
        (
            PLAIN,
            "            BatchSize: 11",
            "needs a MaximumBatchingWindowInSeconds of at least 1",
        ),
        (
            "      FifoQueue: true",
            "            BatchSize: 20\n            MaximumBatchingWindowInSeconds: 1",
            "more than a FIFO queue's 10",
        ),
        (
            PLAIN,
            "            StartingPosition: LATEST",
            "StartingPosition: a setting of stream event sources",
        ),
        (
            PLAIN,
            "            ScalingConfig:\n              MaximumConcurrency: 1",
            "MaximumConcurrency: 1 is outside",
        ),
        (
            "      VisibilityTimeout: 5",
            "            BatchSize: 1",
            "Queue visibility timeout: 5 seconds is less than Function timeout: 10 seconds",
        ),
        (
            "      DelaySeconds: 5",
            "            BatchSize: 1",
            "Work.DelaySeconds: delayed messages are not reproduced",
        ),
    ];
    for (queue, event, expected) in cases {
        let f = Consumer::new(|_, _| Ok(Value::Null));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let refused = runtime.block_on(async {
            deploy(&stack(queue, event), &f)
                .err()
                .map(|e| e.to_string())
        });
        let refused = refused.unwrap_or_else(|| panic!("{queue} / {event} was accepted"));
        assert!(refused.contains(expected), "{refused}");
    }
}
