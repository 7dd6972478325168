//! A function as the event source mapping sees it: an event in, a partial batch response out.
//! `StreamHandler` decodes a Kinesis or DynamoDB Streams batch (`sources`), runs it through the
//! executor and answers which records to retry; a scheduled event sweeps due timers.

use async_trait::async_trait;
use aws_lambda_events::event::streams::{
    DynamoDbBatchItemFailure, DynamoDbEventResponse, KinesisEventResponse,
};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::domain::InvalidInput;
use crate::executor::{BatchReport, Executor, TimerSweep};
use crate::operator::KeyedOperator;
use crate::ports::StoreError;
use crate::sources::kinesis::KinesisBatch;
use crate::sources::{dynamodb, event_source, kinesis, records_of, DecodedBatch, Envelope};

/// An invocation failed as a whole: Lambda retries the batch (or bisects it).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum FunctionError {
    /// The event is not a batch the function runs, or a record of it could not be reported.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A table the invocation needs failed `during` its work (a timer sweep, reading a filter's
    /// state).
    #[error("{during} failed: {source}")]
    Store {
        /// What the invocation was doing (`the timer sweep`).
        during: &'static str,
        /// The table's error.
        source: StoreError,
    },
    /// The function failed for a reason of its own, in its words: an error response of a function
    /// behind the Runtime API, a handler that is not keyway's runtime.
    #[error("{0}")]
    Failed(String),
}

impl FunctionError {
    /// A failure of `source` during the invocation's `during`.
    pub fn store(during: &'static str) -> impl FnOnce(StoreError) -> Self {
        move |source| Self::Store { during, source }
    }
}

/// What Lambda says of one invocation besides its event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Invocation {
    /// Lambda's id of the invocation.
    pub request_id: String,
    /// When the invocation times out (epoch milliseconds), if it does.
    pub deadline_millis: Option<i64>,
}

/// What a function answers an invocation. Lambda reads it as JSON (`to_json`): for a stream
/// batch, the records to retry.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum Response {
    /// A Kinesis batch's partial batch response.
    Kinesis(KinesisEventResponse),
    /// A DynamoDB Streams batch's partial batch response.
    DynamoDb(DynamoDbEventResponse),
    /// What a sweep of due timers did, on the function's schedule.
    TimerSweep(TimerSweep),
    /// Any other answer, as JSON: a report of the function's own (the CDC join's truncate
    /// sweep), an SQS batch's response, what a function behind the Runtime API sent.
    Json(Value),
}

impl Response {
    /// The response as Lambda reads it.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("a response serializes")
    }

    /// The item identifiers its `batchItemFailures` names: the records (a stream's sequence
    /// numbers, SQS message ids) Lambda is asked to retry; none for a response without the list.
    pub fn batch_item_failures(&self) -> Vec<String> {
        match self {
            Self::Kinesis(r) => r
                .batch_item_failures
                .iter()
                .filter_map(|f| f.item_identifier.clone())
                .collect(),
            Self::DynamoDb(r) => r
                .batch_item_failures
                .iter()
                .filter_map(|f| f.item_identifier.clone())
                .collect(),
            Self::TimerSweep(_) => Vec::new(),
            Self::Json(value) => value["batchItemFailures"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|f| match &f["itemIdentifier"] {
                    Value::String(id) => id.clone(),
                    other => other.to_string(),
                })
                .collect(),
        }
    }
}

/// A Lambda function as the event source mapping sees it: an event's JSON text in, a response
/// out. Text, as Lambda hands the payload to the function's runtime, which parses it; a Kinesis
/// batch from the embedded runtime in this process may be taken as its records instead.
#[async_trait]
pub trait Handler: Send + Sync {
    /// Runs the event (its JSON text) and answers what Lambda gets back: for a stream batch,
    /// which records to retry.
    async fn handle(&self, event: &str, invocation: &Invocation)
        -> Result<Response, FunctionError>;

    /// A Kinesis batch, from an event source mapping of the embedded runtime in this process.
    /// By default its event's JSON text goes to `handle`, as Lambda sends it; a handler that
    /// decodes Kinesis records itself takes them as they are (`KinesisBatch::decode`).
    async fn handle_kinesis(
        &self,
        batch: &KinesisBatch,
        invocation: &Invocation,
    ) -> Result<Response, FunctionError> {
        self.handle(&batch.to_event_json(), invocation).await
    }
}

/// Runs Kinesis and DynamoDB Streams events through an executor and answers partial batch
/// responses (the source is told by the records' `eventSource`); a scheduled event sweeps the
/// operator's due timers.
pub struct StreamHandler<O: KeyedOperator> {
    executor: Executor<O>,
}

impl<O: KeyedOperator> StreamHandler<O> {
    /// A handler running events through `executor`.
    pub fn new(executor: Executor<O>) -> Self {
        Self { executor }
    }

    /// The executor the handler runs batches through.
    pub fn executor(&self) -> &Executor<O> {
        &self.executor
    }
}

#[async_trait]
impl<O: KeyedOperator> Handler for StreamHandler<O> {
    async fn handle(
        &self,
        event: &str,
        invocation: &Invocation,
    ) -> Result<Response, FunctionError> {
        let failed = |e: InvalidInput| FunctionError::Source(SourceError::Event(e));
        let Some(records) = Envelope::parse(event).map_err(failed)? else {
            // JSON, as the envelope read it; but a member the envelope skipped may nest past
            // what a tree can be built of.
            let event: Value = serde_json::from_str(event)
                .map_err(|e| failed(InvalidInput::new("event", format!("cannot be read: {e}"))))?;
            if !is_scheduled(&event) {
                let no_records = InvalidInput::new("Records", "the event has no Records array");
                return Err(failed(no_records));
            }
            // The function's schedule (a `Schedule` event in its template) sweeps due timers.
            let sweep = self
                .executor
                .fire_timers(invocation.deadline_millis)
                .await
                .map_err(FunctionError::store("the timer sweep"))?;
            return Ok(Response::TimerSweep(sweep));
        };
        let started = std::time::Instant::now();
        // The records were read once above: decoded here, not read from the text again.
        let dynamodb = from_dynamodb(&records);
        let batch = match dynamodb {
            true => dynamodb::decode_records(&records),
            false => kinesis::decode_records(&records),
        };
        self.run(batch, dynamodb, invocation, started).await
    }

    async fn handle_kinesis(
        &self,
        batch: &KinesisBatch,
        invocation: &Invocation,
    ) -> Result<Response, FunctionError> {
        let started = std::time::Instant::now();
        self.run(batch.decode(), false, invocation, started).await
    }
}

impl<O: KeyedOperator> StreamHandler<O> {
    /// Runs a batch decoded since `started` and answers its partial batch response.
    async fn run(
        &self,
        batch: DecodedBatch,
        dynamodb: bool,
        invocation: &Invocation,
        started: std::time::Instant,
    ) -> Result<Response, FunctionError> {
        let source = BatchSource::of(&batch, dynamodb);
        let report = self
            .executor
            .run_until(batch, invocation.deadline_millis)
            .await;
        // Logged before the verdict: an invocation that fails as a whole has its line too.
        source.log(self.executor.namespace(), &report, started.elapsed());
        let report = checked(report)?;
        Ok(match dynamodb {
            true => Response::DynamoDb(dynamodb_response(&report)),
            false => Response::Kinesis(kinesis_response(&report)),
        })
    }
}

/// Where a batch came from, as its invocation's log line tells it: no key, no payload.
struct BatchSource {
    source: &'static str,
    stream: Option<std::sync::Arc<str>>,
    /// A Kinesis batch's shard; a DynamoDB Streams event names none.
    shard: Option<String>,
    size: usize,
}

impl BatchSource {
    fn of(batch: &crate::sources::DecodedBatch, dynamodb: bool) -> Self {
        let first = batch.iter().find_map(|r| r.as_ref().ok());
        let shard = first.filter(|_| !dynamodb).and_then(|r| {
            // A Kinesis record's origin is `stream/shardId-...`.
            r.origin
                .0
                .rsplit_once('/')
                .map(|(_, shard)| shard.to_owned())
        });
        Self {
            source: if dynamodb {
                "aws:dynamodb"
            } else {
                "aws:kinesis"
            },
            stream: first.map(|r| r.stream.clone()),
            shard,
            size: batch.len(),
        }
    }

    /// The one INFO line of an invocation: what the batch was and what came of it. The request
    /// id and the function are the fields of the invocation's span (`serve`).
    fn log(
        &self,
        namespace: &crate::ports::Namespace,
        report: &BatchReport,
        took: std::time::Duration,
    ) {
        tracing::info!(
            operator = %namespace.operator,
            event_source = self.source,
            stream = self.stream.as_deref(),
            shard = self.shard.as_deref(),
            batch_size = self.size,
            applied = report.applied,
            skipped_as_applied = report.replayed,
            dead_lettered = report.dead_lettered,
            outputs = report.outputs_sent,
            commit_conflicts = report.conflicts,
            sent_notes_unused = report.notes_unused,
            failed_from = report.failed_from.as_ref().map(|s| s.as_str()),
            failed_whole = report.unreportable_failure.is_some(),
            duration_ms = took.as_secs_f64() * 1000.0,
            "invocation done"
        );
    }
}

/// Whether a batch's records come from DynamoDB Streams, by the first record that names its source:
/// a malformed first record must not turn a DynamoDB batch into a Kinesis one, whose decoder would
/// dead-letter every good change after it.
fn from_dynamodb(records: &[&RawValue]) -> bool {
    records.iter().find_map(|r| event_source(r)).as_deref() == Some("aws:dynamodb")
}

/// Whether `event` is a schedule's (an EventBridge rule's "Scheduled Event", or EventBridge
/// Scheduler's) rather than a stream batch.
pub fn is_scheduled(event: &Value) -> bool {
    event.get("Records").is_none()
        && (event["detail-type"] == "Scheduled Event"
            || matches!(
                event["source"].as_str(),
                Some("aws.events" | "aws.scheduler")
            ))
}

/// A stream event that could not be run: Lambda retries the whole batch.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum SourceError {
    /// The event is not a stream batch.
    #[error("the event's {0}")]
    Event(#[from] InvalidInput),
    /// A record without a sequence number could not be dead-lettered: failing the invocation is
    /// the only way to keep it.
    #[error("{0}")]
    Unreportable(String),
}

/// The partial batch response for a Kinesis batch: the lowest sequence number not applied, or no
/// failure at all. Lambda retries from that record; an empty identifier would fail the batch, so
/// one is never sent.
pub fn kinesis_response(report: &BatchReport) -> KinesisEventResponse {
    let mut response = KinesisEventResponse::default();
    if let Some(seq) = &report.failed_from {
        response.add_failure(seq.as_str());
    }
    response
}

/// The partial batch response for a DynamoDB Streams batch (same rules as Kinesis).
pub fn dynamodb_response(report: &BatchReport) -> DynamoDbEventResponse {
    let mut response = DynamoDbEventResponse::default();
    if let Some(seq) = &report.failed_from {
        let mut failure = DynamoDbBatchItemFailure::default();
        failure.item_identifier = Some(seq.to_string());
        response.batch_item_failures.push(failure);
    }
    response
}

/// Runs a Kinesis event (its JSON text) through `executor` and answers the partial batch
/// response. An error (the event has no records array, or a record without a sequence number could
/// not be dead-lettered) fails the invocation, so that Lambda retries the whole batch.
pub async fn run_kinesis<O: KeyedOperator>(
    executor: &Executor<O>,
    event: &str,
    deadline_millis: Option<i64>,
) -> Result<KinesisEventResponse, SourceError> {
    let batch = kinesis::decode_records(&records_of(event)?);
    let report = run_batch(executor, batch, deadline_millis).await?;
    Ok(kinesis_response(&report))
}

/// Runs a DynamoDB Streams event through `executor`; see `run_kinesis`.
pub async fn run_dynamodb<O: KeyedOperator>(
    executor: &Executor<O>,
    event: &str,
    deadline_millis: Option<i64>,
) -> Result<DynamoDbEventResponse, SourceError> {
    let batch = dynamodb::decode_records(&records_of(event)?);
    let report = run_batch(executor, batch, deadline_millis).await?;
    Ok(dynamodb_response(&report))
}

/// Runs a decoded batch; a record that could not be dead-lettered fails it.
async fn run_batch<O: KeyedOperator>(
    executor: &Executor<O>,
    batch: DecodedBatch,
    deadline_millis: Option<i64>,
) -> Result<BatchReport, SourceError> {
    checked(executor.run_until(batch, deadline_millis).await)
}

/// `report`, unless a record could not be dead-lettered: then the batch fails as a whole.
fn checked(report: BatchReport) -> Result<BatchReport, SourceError> {
    match report.unreportable_failure {
        Some(reason) => Err(SourceError::Unreportable(reason)),
        None => Ok(report),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::SequenceNumber;

    #[test]
    fn a_scheduled_event_is_told_from_a_stream_batch() {
        // The documented EventBridge "Scheduled Event".
        let scheduled = serde_json::json!({
            "version": "0",
            "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
            "detail-type": "Scheduled Event",
            "source": "aws.events",
            "account": "123456789012",
            "time": "2015-10-08T16:53:06Z",
            "region": "us-east-1",
            "resources": ["arn:aws:events:us-east-1:123456789012:rule/my-scheduled-rule"],
            "detail": {}
        });
        assert!(is_scheduled(&scheduled));
        assert!(is_scheduled(
            &serde_json::json!({"source": "aws.scheduler"})
        ));
        let batch = serde_json::json!({"Records": [{"eventSource": "aws:kinesis"}]});
        assert!(!is_scheduled(&batch));
        assert!(!is_scheduled(
            &serde_json::json!({"detail-type": "Object Created"})
        ));
    }

    #[test]
    fn a_batch_is_told_by_the_first_record_naming_its_source_not_by_a_malformed_first_one() {
        let text = r#"{"Records": [42, {"eventID": "x"}, {"eventSource": "aws:dynamodb"}]}"#;
        let records = Envelope::parse(text).unwrap().unwrap();
        assert!(from_dynamodb(&records));
        let text =
            r#"{"Records": [{"eventSource": "aws:kinesis"}, {"eventSource": "aws:dynamodb"}]}"#;
        assert!(!from_dynamodb(&Envelope::parse(text).unwrap().unwrap()));
        // A batch none of whose records says is read as Kinesis, as before.
        assert!(!from_dynamodb(
            &Envelope::parse(r#"{"Records": [1]}"#).unwrap().unwrap()
        ));
    }

    /// Held by the tests that run the handler: tracing decides once, for every thread, whether
    /// a log line's callsite is on; a handler run on a thread without a subscriber at the moment
    /// another test installs one could leave that test's lines unwritten.
    static HANDLER_RUNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    #[tokio::test]
    async fn an_event_that_is_neither_a_batch_nor_a_schedule_fails_naming_what_is_wrong() {
        let _alone = HANDLER_RUNS.lock().await;
        use crate::executor::testkit::{bench, Summer};
        let handler = StreamHandler::new(bench(Summer::default(), false).executor);
        let invocation = Invocation::default();
        let call = |event: &'static str| handler.handle(event, &invocation);
        let not_json = call("{\"Records\": [").await.unwrap_err();
        assert!(
            matches!(not_json, FunctionError::Source(SourceError::Event(_))),
            "{not_json:?}"
        );
        assert!(
            not_json
                .to_string()
                .starts_with("the event's Records: the event is not JSON"),
            "{not_json}"
        );
        let no_records = call("{\"detail-type\": \"Object Created\"}")
            .await
            .unwrap_err();
        assert_eq!(
            no_records,
            FunctionError::Source(SourceError::Event(InvalidInput::new(
                "Records",
                "the event has no Records array"
            )))
        );
        assert_eq!(
            no_records.to_string(),
            "the event's Records: the event has no Records array"
        );
        let empty = call("{\"Records\": []}").await.unwrap();
        assert_eq!(
            empty.to_json(),
            serde_json::json!({"batchItemFailures": []})
        );
    }

    /// Log lines written while a test runs, as a function's JSON subscriber writes them.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        /// A JSON subscriber for this thread while the guard lives, writing to what it returns.
        fn on_this_thread() -> (Self, tracing::subscriber::DefaultGuard) {
            let captured = Captured::default();
            let writer = captured.clone();
            let subscriber = tracing_subscriber::fmt()
                .json()
                .with_max_level(tracing::Level::INFO)
                .with_writer(move || writer.clone())
                .finish();
            let guard = tracing::subscriber::set_default(subscriber);
            // Callsites another thread registered without a subscriber are asked again.
            tracing::callsite::rebuild_interest_cache();
            (captured, guard)
        }

        /// The invocation's one `invocation done` line among `lines`.
        fn done(lines: &[Value]) -> Vec<&Value> {
            let done: Vec<&Value> = lines
                .iter()
                .filter(|l| l["fields"]["message"] == "invocation done")
                .collect();
            assert_eq!(done.len(), 1, "{lines:?}");
            done
        }

        fn lines(&self) -> Vec<Value> {
            let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        }
    }

    #[tokio::test]
    async fn an_invocation_logs_one_info_line_of_counts_and_no_key_or_payload() {
        use crate::executor::testkit::{bench, Summer};
        use crate::sources::kinesis::{kinesis_event_json, KinesisEventRecord};
        use tracing::Instrument as _;
        let _alone = HANDLER_RUNS.lock().await;
        let (captured, _default) = Captured::on_this_thread();

        let handler = StreamHandler::new(bench(Summer::default(), false).executor);
        let good = br#"{"key":"customer-secret-7c1d","n":5}"#;
        let bad = br#"{"key":"customer-secret-7c1d","n":"payload-marker"}"#;
        let record = |seq: &'static str, data: &'static [u8]| KinesisEventRecord {
            shard_id: "shardId-000000000003",
            sequence_number: seq,
            partition_key: "customer-secret-7c1d",
            data,
            arrival_millis: 1_767_225_600_000,
        };
        let event = kinesis_event_json(
            "arn:aws:kinesis:us-east-1:123456789012:stream/clicks",
            [record("49001", good), record("49002", bad)],
        );
        let span = tracing::info_span!("invocation", request_id = "req-1", function = "counter");
        let invocation = Invocation::default();
        let response = handler.handle(&event, &invocation).instrument(span).await;
        assert_eq!(
            response.unwrap().to_json(),
            serde_json::json!({"batchItemFailures": []})
        );

        let lines = captured.lines();
        let done = Captured::done(&lines);
        let fields = &done[0]["fields"];
        assert_eq!(fields["event_source"], "aws:kinesis");
        assert_eq!(fields["stream"], "clicks");
        assert_eq!(fields["shard"], "shardId-000000000003");
        assert_eq!(
            (
                &fields["batch_size"],
                &fields["applied"],
                &fields["dead_lettered"]
            ),
            (
                &serde_json::json!(2),
                &serde_json::json!(1),
                &serde_json::json!(1)
            )
        );
        assert!(fields["duration_ms"].is_number());
        assert_eq!(fields["failed_whole"], false);
        assert_eq!(done[0]["span"]["request_id"], "req-1");
        assert_eq!(done[0]["span"]["function"], "counter");
        for line in lines.iter().filter(|l| l["level"] == "INFO") {
            let text = line.to_string();
            assert!(!text.contains("customer-secret"), "a key at INFO: {text}");
            assert!(
                !text.contains("payload-marker"),
                "a payload at INFO: {text}"
            );
        }
    }

    #[tokio::test]
    async fn an_invocation_that_fails_as_a_whole_still_logs_its_line_saying_so() {
        use crate::executor::testkit::{bench, Summer};
        let _alone = HANDLER_RUNS.lock().await;
        let (captured, _default) = Captured::on_this_thread();

        let bench = bench(Summer::default(), false);
        bench
            .dead
            .down
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let handler = StreamHandler::new(bench.executor);
        // A record without a sequence number, which no partial batch response can name: with the
        // dead-letter sink down, only failing the invocation keeps it.
        let event = r#"{"Records": [{"eventSource": "aws:kinesis", "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/clicks", "kinesis": {"partitionKey": "k", "data": "e30="}}]}"#;
        let failed = handler.handle(event, &Invocation::default()).await;
        assert!(failed.is_err(), "{failed:?}");

        let lines = captured.lines();
        let done = Captured::done(&lines);
        assert_eq!(done[0]["fields"]["failed_whole"], true);
        assert_eq!(done[0]["fields"]["batch_size"], 1);
    }

    #[test]
    fn a_batch_without_failures_answers_an_empty_failure_list() {
        let response = kinesis_response(&BatchReport::default());
        assert_eq!(
            serde_json::to_value(&response).unwrap(),
            serde_json::json!({"batchItemFailures": []})
        );
    }

    #[test]
    fn a_failed_batch_names_exactly_the_lowest_unapplied_sequence_number() {
        let report = BatchReport {
            failed_from: Some(SequenceNumber::parse("4959").unwrap()),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(kinesis_response(&report)).unwrap(),
            serde_json::json!({"batchItemFailures": [{"itemIdentifier": "4959"}]})
        );
        assert_eq!(
            serde_json::to_value(dynamodb_response(&report)).unwrap(),
            serde_json::json!({"batchItemFailures": [{"itemIdentifier": "4959"}]})
        );
    }

    #[test]
    fn a_response_names_the_records_to_retry_whichever_its_kind() {
        let report = BatchReport {
            failed_from: Some(SequenceNumber::parse("49007").unwrap()),
            ..BatchReport::default()
        };
        let kinesis = Response::Kinesis(kinesis_response(&report));
        let dynamodb = Response::DynamoDb(dynamodb_response(&report));
        for response in [&kinesis, &dynamodb] {
            assert_eq!(response.batch_item_failures(), ["49007"]);
            assert_eq!(
                response.to_json(),
                serde_json::json!({"batchItemFailures": [{"itemIdentifier": "49007"}]})
            );
        }
        let sqs = Response::Json(serde_json::json!({
            "batchItemFailures": [{"itemIdentifier": "m-1"}, {"itemIdentifier": 2}]
        }));
        assert_eq!(sqs.batch_item_failures(), ["m-1", "2"]);
        assert!(Response::Json(serde_json::json!({"ok": true}))
            .batch_item_failures()
            .is_empty());
        let sweep = Response::TimerSweep(TimerSweep::default());
        assert!(sweep.batch_item_failures().is_empty());
        assert_eq!(
            sweep.to_json(),
            serde_json::to_value(TimerSweep::default()).unwrap()
        );
    }
}
