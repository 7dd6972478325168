//! The event source mapping of an SQS queue, as the Lambda Developer Guide describes it ("Using
//! Lambda with Amazon SQS"): Lambda polls the queue and invokes the function with a batch of
//! messages, then deletes the messages the invocation succeeded for.
//!
//! - BatchSize (10 by default) and MaximumBatchingWindowInSeconds: a batch goes when it is full,
//!   when the window has passed since messages became visible, or at the 6 MB payload limit; with
//!   no window, with whatever is visible;
//! - a function error or timeout deletes nothing: the messages come back when the queue's
//!   visibility timeout passes, and the queue's redrive policy moves a message received
//!   maxReceiveCount times to its dead-letter queue;
//! - ReportBatchItemFailures: the messages named in `batchItemFailures` stay, the others are
//!   deleted; an empty or null identifier, or one that names no message of the batch, fails the
//!   whole batch;
//! - FIFO queues: no message of a group is delivered while another of the group is in flight, so
//!   a group's messages reach the function in order;
//! - FilterCriteria: a message that matches no pattern is deleted without an invocation.
//!
//! The mapping invokes one batch at a time, within any ScalingConfig's MaximumConcurrency.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{invoke, Event, Failed, MappingSettings, MappingStats, Spent, PAYLOAD_MAX_BYTES};
use crate::services::faults::{Fault, Faults};
use crate::services::sqs::{Delivery, LocalSqs};
use keyway::lambda::{Handler, Invocation};
use keyway::ports::Clock;

/// An event source mapping between a queue and a function.
pub struct QueueMapping {
    /// The mapping's name, which its invocations' request ids start with.
    pub name: String,
    /// The ARN of the function it invokes.
    pub function_arn: String,
    handler: Arc<dyn Handler>,
    sqs: Arc<LocalSqs>,
    queue_url: String,
    settings: MappingSettings,
    clock: Arc<dyn Clock>,
    faults: Arc<Faults>,
    stats: MappingStats,
    /// When messages became visible for the batch being gathered.
    window_opened: Option<i64>,
}

impl QueueMapping {
    /// A mapping from the queue at `queue_url` to `handler`; it receives nothing until it is
    /// run.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: String,
        function_arn: String,
        handler: Arc<dyn Handler>,
        sqs: Arc<LocalSqs>,
        queue_url: String,
        settings: MappingSettings,
        clock: Arc<dyn Clock>,
        faults: Arc<Faults>,
    ) -> Self {
        Self {
            name,
            function_arn,
            handler,
            sqs,
            queue_url,
            settings,
            clock,
            faults,
            stats: MappingStats::default(),
            window_opened: None,
        }
    }

    /// What the mapping did so far.
    pub fn stats(&self) -> &MappingStats {
        &self.stats
    }

    /// The mapping's settings.
    pub fn settings(&self) -> &MappingSettings {
        &self.settings
    }

    /// Enables or disables the mapping, as UpdateEventSourceMapping's `Enabled` does.
    pub fn set_enabled(&mut self, enabled: bool) {
        self.settings.enabled = enabled;
    }

    /// The messages still to be delivered or deleted.
    pub fn waiting(&self) -> usize {
        self.sqs.held(&self.queue_url)
    }

    /// When the mapping next has a batch to invoke: now, when its batching window closes, or
    /// when a message in flight becomes visible again; none when there is nothing to do.
    pub fn due(&mut self) -> Option<i64> {
        if !self.settings.enabled {
            return None;
        }
        let now = self.clock.now_millis();
        let visible = self.sqs.visible(&self.queue_url, now);
        if visible == 0 {
            self.window_opened = None;
            return self.sqs.next_visible_millis(&self.queue_url);
        }
        let opened = *self.window_opened.get_or_insert(now);
        let window = self.settings.maximum_batching_window.as_millis() as i64;
        match visible >= self.settings.batch_size {
            true => Some(now),
            false => Some(opened + window),
        }
    }

    /// Invokes the function with the next batch, if one is due; returns how many invocations
    /// ran.
    pub async fn step(&mut self) -> usize {
        let now = self.clock.now_millis();
        if self.due().is_none_or(|at| at > now) {
            return 0;
        }
        self.window_opened = None;
        let batch = self.sqs.receive_visible(
            &self.queue_url,
            self.settings.batch_size,
            PAYLOAD_MAX_BYTES,
            now,
        );
        let (batch, unmatched): (Vec<Delivery>, Vec<Delivery>) =
            batch.into_iter().partition(|d| self.matches(d));
        for delivery in &unmatched {
            self.sqs.delete(&self.queue_url, &delivery.receipt_handle);
        }
        self.stats.filtered_out += unmatched.len() as u64;
        if batch.is_empty() {
            return 0;
        }
        let (result, spent) = self.invoke(&batch, now).await;
        self.stats.invocations += 1;
        self.stats.spent += spent;
        self.stats.records_delivered += batch.len() as u64;
        let failed = self.failed(&batch, result);
        let mut done = batch.iter().filter(|d| !failed.contains(&d.receipt_handle));
        // A delete Lambda's poller never gets to make: the message comes back.
        let lost = done.clone().count() > 0 && self.faults.draw(Fault::DuplicateDelivery);
        if lost {
            self.stats.duplicate_deliveries += 1;
            done.next();
        }
        for delivery in done {
            self.sqs.delete(&self.queue_url, &delivery.receipt_handle);
            self.stats.records_done += 1;
        }
        1
    }

    async fn invoke(&self, batch: &[Delivery], now: i64) -> (Result<Value, Failed>, Spent) {
        let arn = LocalSqs::queue_arn(&self.queue_url);
        let records: Vec<Value> = batch.iter().map(|d| sqs_record(d, &arn)).collect();
        let event = json!({ "Records": records }).to_string();
        let invocation = Invocation {
            request_id: format!("{}-{}", self.name, self.stats.invocations),
            deadline_millis: Some(now + self.settings.function_timeout.as_millis() as i64),
        };
        let timeout = match self.faults.draw(Fault::Timeout) {
            // Stopped somewhere in the middle, wherever it is by then.
            true => std::time::Duration::from_micros(self.faults.pick(4_000)),
            false => self.settings.function_timeout,
        };
        invoke(
            self.handler.as_ref(),
            &Event::Json(event),
            &invocation,
            timeout,
        )
        .await
    }

    /// The receipt handles of the messages the invocation did not succeed for.
    fn failed(&mut self, batch: &[Delivery], result: Result<Value, Failed>) -> Vec<String> {
        let all = || batch.iter().map(|d| d.receipt_handle.clone()).collect();
        let response = match result {
            Ok(response) => response,
            Err(failed) => {
                self.stats.function_errors += 1;
                self.stats.timeouts += u64::from(failed == Failed::TimedOut);
                self.stats.crashes += u64::from(failed == Failed::Crashed);
                return all();
            }
        };
        if !self.settings.report_batch_item_failures {
            return Vec::new();
        }
        let failures = match response.get("batchItemFailures") {
            None | Some(Value::Null) => return Vec::new(),
            Some(Value::Array(items)) => items,
            Some(_) => return all(),
        };
        let mut failed = Vec::new();
        for item in failures {
            let id = item.get("itemIdentifier").and_then(Value::as_str);
            match batch
                .iter()
                .find(|d| Some(d.message.message_id.as_str()) == id)
            {
                Some(delivery) => failed.push(delivery.receipt_handle.clone()),
                // "Lambda treats a batch as a complete failure if your function returns ... an
                // itemIdentifier value with a message ID that doesn't exist" (or none at all).
                None => return all(),
            }
        }
        self.stats.partial_failures += u64::from(!failed.is_empty());
        failed
    }

    fn matches(&self, delivery: &Delivery) -> bool {
        if self.settings.filters.is_empty() {
            return true;
        }
        // Lambda filters on the body parsed as JSON; a body that is not JSON is a string.
        let mut view = sqs_record(delivery, "");
        view["body"] = serde_json::from_str(&delivery.message.body)
            .unwrap_or_else(|_| Value::String(delivery.message.body.clone()));
        self.settings.filters.iter().any(|p| p.matches(&view))
    }
}

/// A message as an SQS event carries it (shape of the Lambda Developer Guide's example events).
fn sqs_record(delivery: &Delivery, queue_arn: &str) -> Value {
    let message = &delivery.message;
    let mut attributes = json!({
        "ApproximateReceiveCount": delivery.receive_count.to_string(),
        "SentTimestamp": delivery.sent_millis.to_string(),
        "SenderId": "000000000000",
        "ApproximateFirstReceiveTimestamp": delivery.first_receive_millis.to_string(),
    });
    if let Some(group) = &message.group_id {
        attributes["MessageGroupId"] = json!(group);
        attributes["SequenceNumber"] = json!(format!("{:020}", delivery.sequence));
        attributes["MessageDeduplicationId"] = json!(message.deduplication_id);
    }
    let mut message_attributes = json!({});
    if let Some(id) = &message.output_id {
        message_attributes[keyway::adapters::sqs::OUTPUT_ID_ATTRIBUTE] = json!({
            "stringValue": id, "stringListValues": [], "binaryListValues": [], "dataType": "String",
        });
    }
    json!({
        "messageId": message.message_id,
        "receiptHandle": delivery.receipt_handle,
        "body": message.body,
        "attributes": attributes,
        "messageAttributes": message_attributes,
        "md5OfBody": keyway::domain::hash::md5_hex(message.body.as_bytes()),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": "us-east-1",
    })
}
