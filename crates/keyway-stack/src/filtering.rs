//! Dynamic filtering replayed on the embedded runtime: subscription changes and events, each at
//! its time, through the stack of template.yaml (filter-policy-sync, filter state, the dynamic
//! filter, consumers' queues) and each consumer's own stack of consumer.yaml (its policy table),
//! deployed with the outputs of the first as a consumer's is, when the consumer first subscribes;
//! or through the shared policy table. What `keyway filter`, its benchmark, the demo and the
//! tests share.
//!
//! The replay goes in time order on the virtual clock. Before a change is made, every earlier
//! event has been filtered; after it, the stack runs until the change has reached the filter
//! state, so every later event is filtered by it: a change is in effect for exactly the events
//! at or after its time, under any fault. (A deployed stack gives that for events a second after
//! the change; `propagation` says how long it took here.)

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamic_filter::client::{ClientError, SubscriptionClient};
use dynamic_filter::store::{journal_position, FilterState};
use dynamic_filter::subscription::QueueOwnership;
use dynamic_filter::{FilterHandler, Refreshes};
use keyway::adapters::kinesis::PutOutcome;
use keyway::lambda::{Handler, Platform};
use keyway::ports::Clock;
use keyway_local::{
    Factory, FaultPlan, LocalError, LocalRuntime, LocalServices, LocalSqs, MappingStats,
};
use serde::Deserialize;
use serde_json::Value;

use crate::metering::Metering;

/// Events put on the stream at a time, at most.
const CHUNK: usize = 500;
/// How long a producer waits before it writes again what the stream throttled.
const PRODUCER_BACKOFF: Duration = Duration::from_millis(100);
/// How long the stack may take to settle once (virtual time): retries under faults included.
const SETTLE_LIMIT: Duration = Duration::from_secs(3600);

/// A subscription change, as a line of `keyway filter --subscriptions` gives it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    /// Starts (or, subscribed already, changes) the delivery of one filter key's events.
    Subscribe {
        /// The consumer subscribing.
        consumer: String,
        /// The filter key whose events it wants.
        key: String,
        /// The queue the events go to.
        queue: String,
        /// The event pattern an event must match; every event of the key without one.
        #[serde(default)]
        pattern: Option<Value>,
    },
    /// Stops the delivery of one filter key's events.
    Unsubscribe {
        /// The consumer unsubscribing.
        consumer: String,
        /// The filter key it no longer wants.
        key: String,
    },
    /// Starts (or changes) the delivery of every event, whatever its key.
    SubscribeAll {
        /// The consumer subscribing.
        consumer: String,
        /// The queue the events go to.
        queue: String,
        /// The event pattern an event must match; every event without one.
        #[serde(default)]
        pattern: Option<Value>,
    },
    /// Stops the delivery of every event that `SubscribeAll` started.
    UnsubscribeAll {
        /// The consumer unsubscribing.
        consumer: String,
    },
}

impl Op {
    /// The consumer whose subscription it changes.
    pub fn consumer(&self) -> &str {
        match self {
            Op::Subscribe { consumer, .. }
            | Op::Unsubscribe { consumer, .. }
            | Op::SubscribeAll { consumer, .. }
            | Op::UnsubscribeAll { consumer } => consumer,
        }
    }
}

/// A change at its time (epoch milliseconds), with the line it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// When it is made, in epoch milliseconds.
    pub at: i64,
    /// What it changes.
    pub op: Op,
    /// Its line in the subscriptions file, from 1: a refusal names it.
    pub line: usize,
}

#[derive(Deserialize)]
struct ChangeLine {
    at: i64,
    #[serde(flatten)]
    op: Op,
}

/// A line of a subscriptions file that is not a change.
#[derive(Debug, thiserror::Error)]
#[error("not a subscription change: {0}")]
pub struct NotAChange(#[from] serde_json::Error);

/// Why a change was not made: the consumer's stack could not be deployed, or the client refused
/// the change.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The consumer's own stack (consumer.yaml) could not be deployed.
    #[error("consumer {consumer:?}: its stack: {source}")]
    Stack {
        /// The consumer whose stack it is.
        consumer: String,
        /// Why the deploy failed.
        source: LocalError,
    },
    /// The subscription client refused the change.
    #[error(transparent)]
    Client(#[from] ClientError),
}

impl Change {
    /// A line of a subscriptions file, or what is wrong with it.
    pub fn parse(text: &str, line: usize) -> Result<Self, NotAChange> {
        let parsed: ChangeLine = serde_json::from_str(text)?;
        Ok(Self {
            at: parsed.at,
            op: parsed.op,
            line,
        })
    }
}

/// An event at its time.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct TimedEvent {
    /// When it is put on the stream, in epoch milliseconds.
    pub at: i64,
    /// The event, whose filter key `Settings::key_pointer` points at.
    pub event: Value,
}

/// How the stack is deployed for a replay.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Shards of the events stream (the template's FilterShards).
    pub shards: usize,
    /// Lanes each shard of the events stream is read in (the filter's ParallelizationFactor;
    /// the stack's is 2).
    pub lanes: u32,
    /// Where an event holds its filter key.
    pub key_pointer: String,
    /// The queues each consumer may deliver to, as a JSON object; `None` leaves each consumer
    /// every queue named as its own (`QueueOwnership`).
    pub registry: Option<String>,
    /// The faults the embedded services inject.
    pub faults: FaultPlan,
    /// How long every call to the embedded services takes (virtual time); none by default.
    pub latency: Option<Duration>,
    /// Subscriptions go to the stack's shared policy table rather than to each consumer's own.
    pub shared_table: bool,
    /// How the run is metered for a cost report.
    pub metering: Metering,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            shards: 4,
            lanes: 2,
            key_pointer: "/key".into(),
            registry: None,
            faults: FaultPlan::default(),
            latency: None,
            shared_table: false,
            metering: Metering::default(),
        }
    }
}

/// An event a consumer's queue received.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivered {
    /// The consumers who subscribed with the queue (one, unless consumers share it).
    pub consumer: String,
    /// The queue that received it.
    pub queue: String,
    /// The event, as the message's body holds it (null if that is not JSON).
    pub event: Value,
    /// The message's `outputId` attribute, if any: a delivery sent again carries the same id.
    pub output_id: Option<String>,
}

/// What a replay did.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Events put on the stream.
    pub events: u64,
    /// Events the filter read, as its metric lines count them (an event read again after a
    /// retry counts again).
    pub filtered: u64,
    /// Of the events the filter read, those no consumer received, counted the same way.
    pub unmatched: u64,
    /// Messages the consumers' queues received.
    pub delivered: u64,
    /// Deliveries by consumer.
    pub by_consumer: BTreeMap<String, u64>,
    /// Changes the client refused: their line and why.
    pub refused: Vec<(usize, String)>,
    /// Dead letters of the stack, as "field: problem".
    pub dead_letters: Vec<String>,
    /// Virtual milliseconds from each accepted change to its arrival in the filter state.
    pub propagation: Vec<i64>,
    /// What keeping the filter's index up to date with the filter state cost.
    pub refreshes: Refreshes,
    /// What each event source mapping did.
    pub mappings: Vec<(String, MappingStats)>,
    /// The faults, dead letters (their bodies) and batches given up, as a chaos run reads them.
    pub ending: crate::chaos::Ending,
}

/// The stack of template.yaml, and the filter function's handler for its counters.
pub(crate) struct FilterStack {
    /// The embedded runtime the stack runs on, with its services.
    pub runtime: LocalRuntime,
    filter: Arc<Mutex<Option<Arc<FilterHandler>>>>,
    registry: QueueOwnership,
    shared_table: bool,
    /// Each consumer's own policy table, once its stack is deployed.
    consumer_tables: BTreeMap<String, String>,
    /// Queue name to the consumers that subscribed with it.
    queues: BTreeMap<String, BTreeSet<String>>,
    /// The journal position read up to.
    journal_after: String,
}

impl FilterStack {
    /// Deploys the stack as `settings` say, the virtual clock at `epoch_millis`; each consumer's
    /// own stack comes later, with its first subscription.
    pub(crate) fn new(settings: &Settings, epoch_millis: i64) -> Result<Self, LocalError> {
        let mut parameters = BTreeMap::from([
            ("FilterShards".to_owned(), settings.shards.to_string()),
            ("FilterKeyPointer".to_owned(), settings.key_pointer.clone()),
        ]);
        if let Some(registry) = &settings.registry {
            parameters.insert("ConsumerQueues".to_owned(), registry.clone());
        }
        let registry = match &settings.registry {
            Some(text) => QueueOwnership::default().with_registry(text).map_err(|e| {
                LocalError::Template(keyway_local::template::TemplateError::at(
                    "ConsumerQueues",
                    e,
                ))
            })?,
            None => QueueOwnership::default(),
        };
        let services = LocalServices::new(epoch_millis, settings.faults.clone());
        let filter: Arc<Mutex<Option<Arc<FilterHandler>>>> = Arc::default();
        let mut functions = crate::functions();
        let slot = filter.clone();
        let factory: Factory = Box::new(move |platform, env| {
            let handler = Arc::new(dynamic_filter::handler(platform, env)?);
            *slot.lock().expect("filter slot") = Some(handler.clone());
            Ok(handler as Arc<dyn Handler>)
        });
        functions.insert("DynamicFilterFunction".into(), factory);
        let template = crate::template_with(&[], &[("DynamicFilterFunction", settings.lanes)])?;
        let template = settings
            .metering
            .batched(template, &["DynamicFilterFunction"])?;
        let runtime =
            LocalRuntime::from_template_with(&template, &parameters, services.clone(), &functions)?;
        // After the template made the tables: the latency is each table's.
        services.set_latency(settings.latency);
        settings.metering.apply(&services);
        Ok(Self {
            runtime,
            filter,
            registry,
            shared_table: settings.shared_table,
            consumer_tables: BTreeMap::new(),
            queues: BTreeMap::new(),
            journal_after: journal_position(0),
        })
    }

    fn now(&self) -> i64 {
        self.runtime.services.clock.now_millis()
    }

    /// The client of `consumer`'s subscriptions, in the table they go to.
    fn client(&mut self, consumer: &str) -> Result<SubscriptionClient, Refused> {
        let table = self.policy_table(consumer)?;
        let services = &self.runtime.services;
        let table = services.dynamodb.table(&table).expect("the policy table");
        Ok(SubscriptionClient::new(
            table,
            consumer,
            self.registry.clone(),
            services.clock.clone(),
        ))
    }

    /// The shared policy table, or `consumer`'s own, whose stack is deployed the first time.
    fn policy_table(&mut self, consumer: &str) -> Result<String, Refused> {
        if self.shared_table {
            return Ok(self
                .runtime
                .resource("PolicyTable")
                .expect("the policy table"));
        }
        if let Some(table) = self.consumer_tables.get(consumer) {
            return Ok(table.clone());
        }
        let table = crate::deploy_consumer(&mut self.runtime, consumer).map_err(|source| {
            Refused::Stack {
                consumer: consumer.to_owned(),
                source,
            }
        })?;
        self.consumer_tables
            .insert(consumer.to_owned(), table.clone());
        Ok(table)
    }

    fn filter_state(&self) -> FilterState {
        let services = &self.runtime.services;
        let name = self
            .runtime
            .resource("FilterStateTable")
            .expect("the filter state");
        FilterState::new(
            services.dynamodb.table(&name).expect("the filter state"),
            services.clock.clone(),
        )
        .with_backoff(services.backoff())
    }

    /// Runs the stack until `at` (virtual time), then until nothing waits.
    async fn settle_at(&mut self, at: i64) -> Result<(), LocalError> {
        let now = self.now();
        if at > now {
            self.runtime
                .run_for(Duration::from_millis((at - now) as u64))
                .await;
        }
        self.runtime.run_until_idle(SETTLE_LIMIT).await.map(|_| ())
    }

    /// Makes `change` through the client; says why if the client refused it.
    async fn change(&mut self, change: &Change) -> Result<(), Refused> {
        let client = self.client(change.op.consumer())?;
        let queue = match &change.op {
            Op::Subscribe {
                key,
                queue,
                pattern,
                ..
            } => client
                .subscribe(key, queue, pattern.clone())
                .await
                .map(|_| Some(queue)),
            Op::SubscribeAll { queue, pattern, .. } => client
                .listen_to_all_events(queue, pattern.clone())
                .await
                .map(|_| Some(queue)),
            Op::Unsubscribe { key, .. } => client.unsubscribe(key).await.map(|_| None),
            Op::UnsubscribeAll { .. } => client.stop_listening_to_all().await.map(|_| None),
        }?;
        if let Some(queue) = queue {
            let sqs = &self.runtime.services.sqs;
            if !self.queues.contains_key(queue) {
                sqs.create_queue(queue);
            }
            self.queues
                .entry(queue.clone())
                .or_default()
                .insert(change.op.consumer().to_owned());
        }
        Ok(())
    }

    /// Makes `changes` (all of one time) through the client, then runs the stack until they reached
    /// the filter state; notes what the client refused and how long the rest took.
    async fn make(&mut self, changes: &[&Change], outcome: &mut Outcome) -> Result<(), LocalError> {
        let mut made = 0;
        for change in changes {
            match self.change(change).await {
                Err(why) => outcome.refused.push((change.line, why.to_string())),
                Ok(()) => made += 1,
            }
        }
        if made > 0 {
            let written = self.now();
            self.settle_at(written).await?;
            outcome
                .propagation
                .extend(self.journaled_since(written).await);
        }
        Ok(())
    }

    /// Puts `events` on the stream as a producer does: a write the stream throttles is tried
    /// again a moment later.
    async fn put(&mut self, events: &[TimedEvent], pointer: &str) {
        let stream = self
            .runtime
            .resource("FilterEventsStream")
            .expect("the stream");
        for e in events {
            let key = match e.event.pointer(pointer) {
                Some(Value::String(s)) if !s.is_empty() => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                // The filter dead-letters an event without a key; any partition does.
                _ => "-".to_owned(),
            };
            let data = serde_json::to_vec(&e.event).expect("JSON");
            while !matches!(
                self.runtime
                    .services
                    .kinesis
                    .put_record(&stream, &key, &data),
                Ok(PutOutcome::Written { .. })
            ) {
                self.runtime.run_for(PRODUCER_BACKOFF).await;
            }
        }
    }

    /// What the queues received since the last call, each message once.
    fn drain(&self) -> Vec<Delivered> {
        let sqs = &self.runtime.services.sqs;
        let mut delivered = Vec::new();
        for (queue, consumers) in &self.queues {
            let url = format!("{}{queue}", LocalSqs::URL_PREFIX);
            let consumer = consumers.iter().cloned().collect::<Vec<_>>().join("|");
            for message in sqs.receive(&url, usize::MAX) {
                delivered.push(Delivered {
                    consumer: consumer.clone(),
                    queue: queue.clone(),
                    event: serde_json::from_str(&message.body).unwrap_or(Value::Null),
                    output_id: message.output_id.clone(),
                });
            }
        }
        delivered
    }

    /// Virtual milliseconds from `written_at` to each change the filter state's journal took in
    /// since the last call.
    async fn journaled_since(&mut self, written_at: i64) -> Vec<i64> {
        let journal = self
            .filter_state()
            .since(&self.journal_after, usize::MAX)
            .await
            .unwrap_or_default();
        if let Some(last) = journal.last() {
            self.journal_after = last.position.clone();
        }
        journal.iter().map(|j| j.appended_at - written_at).collect()
    }

    /// Adds up the filter's metric lines written since the last call, and lets them go.
    fn count_metrics(&self, outcome: &mut Outcome) {
        for line in self.runtime.services.metrics.take() {
            let Ok(metric) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if metric["function"] == "dynamic-filter" && metric.get("consumer").is_none() {
                outcome.filtered += metric["events"].as_f64().unwrap_or(0.0) as u64;
                outcome.unmatched += metric["unmatched"].as_f64().unwrap_or(0.0) as u64;
            }
        }
    }

    fn refreshes(&self) -> Refreshes {
        self.filter
            .lock()
            .expect("filter slot")
            .as_ref()
            .map(|f| f.refreshes())
            .unwrap_or_default()
    }
}

/// Replays `changes` and `events` (each in time order) through the stack; every delivery goes to
/// `on_delivery` as its queue receives it.
pub async fn replay(
    settings: &Settings,
    changes: &[Change],
    events: impl IntoIterator<Item = TimedEvent>,
    mut on_delivery: impl FnMut(Delivered),
) -> Result<Outcome, LocalError> {
    let mut deliver = |outcome: &mut Outcome, stack: &FilterStack| {
        stack.count_metrics(outcome);
        let delivered = stack.drain();
        for d in delivered {
            outcome.delivered += 1;
            *outcome.by_consumer.entry(d.consumer.clone()).or_default() += 1;
            on_delivery(d);
        }
    };
    let mut events = events.into_iter().peekable();
    let first = [changes.first().map(|c| c.at), events.peek().map(|e| e.at)]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(0);
    let mut stack = FilterStack::new(settings, first)?;
    let mut outcome = Outcome::default();
    let mut changes = changes.iter().peekable();
    let mut chunk = Vec::with_capacity(CHUNK);
    loop {
        // Events before the next change (a change at the same time goes first), a chunk at a time.
        let next_change = changes.peek().map(|c| c.at);
        chunk.clear();
        while chunk.len() < CHUNK {
            match events.peek() {
                Some(e) if next_change.is_none_or(|c| e.at < c) => {
                    chunk.push(events.next().expect("peeked"))
                }
                _ => break,
            }
        }
        if !chunk.is_empty() {
            let now = stack.now();
            if chunk[0].at > now {
                let wait = Duration::from_millis((chunk[0].at - now) as u64);
                stack.runtime.run_for(wait).await;
            }
            stack.put(&chunk, &settings.key_pointer).await;
            outcome.events += chunk.len() as u64;
            deliver(&mut outcome, &stack);
            continue;
        }
        let Some(change) = changes.next() else {
            break;
        };
        // Every change of one time is made, then the stack settles once.
        stack.settle_at(change.at).await?;
        deliver(&mut outcome, &stack);
        let same_time = std::iter::from_fn(|| changes.next_if(|c| c.at == change.at));
        let batch: Vec<&Change> = std::iter::once(change).chain(same_time).collect();
        stack.make(&batch, &mut outcome).await?;
    }
    let now = stack.now();
    stack.settle_at(now).await?;
    deliver(&mut outcome, &stack);
    outcome.mappings = stack.runtime.run_for(Duration::ZERO).await.mappings;
    outcome.refreshes = stack.refreshes();
    let dead = stack
        .runtime
        .resource("DeadLetterQueue")
        .expect("dead letters");
    outcome.ending = crate::chaos::Ending::of(&stack.runtime);
    outcome.dead_letters = dead_letter_reasons(&stack.runtime.services.sqs, &dead);
    Ok(outcome)
}

/// The reasons of the dead letters the queue at `url` holds (taking them), each as
/// "field: problem", sorted.
pub fn dead_letter_reasons(sqs: &LocalSqs, url: &str) -> Vec<String> {
    let mut reasons: Vec<String> = sqs
        .receive(url, usize::MAX)
        .iter()
        .map(|m| {
            let letter: Value = serde_json::from_str(&m.body).unwrap_or(Value::Null);
            let text = |name: &str| letter[name].as_str().unwrap_or_default().to_owned();
            format!("{}: {}", text("field"), text("problem"))
        })
        .collect();
    reasons.sort();
    reasons
}
