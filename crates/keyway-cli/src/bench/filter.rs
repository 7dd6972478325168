//! `keyway bench filter`: the dynamic filter against the per-event lookup design it replaces, in
//! one run, on the same generated workload: 100,000 filter keys with subscriptions of 1,000
//! consumers (drawn from Zipf(1.2): a few consumers, like a live collaboration service, hold most
//! subscriptions), 10 all-events subscribers, and events of which about 95% match no one, in
//! batches of 500.
//!
//! - The filter: its Lambda handler on the embedded services, the filter state loaded with every
//!   subscription first, before the journal's overlap (the cold start's snapshot read is reported
//!   apart).
//! - The lookup design: a handler that reads the event's key from a table of subscriptions by key
//!   (one eventually consistent GetItem an event) and evaluates what it finds.
//!
//! Both send their matches through the same queue router. Reported: events per second per core of
//! handler CPU time (the in-memory services' own time left out), DynamoDB capacity units and calls
//! per 1,000 events, SQS calls per 1,000 deliveries, and the monthly cost at 100,000 events a
//! second of this design and of the article's brute-force design, from the request counts and the
//! list prices below.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dynamic_filter::index::{revision, Revised};
use dynamic_filter::router::QueueRouter;
use dynamic_filter::store::FilterState;
use dynamic_filter::subscription::{Identity, Subscription, Target};
use keyway::adapters::dynamodb::{ItemKey, Table, TTL};
use keyway::domain::pattern::Pattern;
use keyway::domain::{AttrValue, Output, OutputId, Payload};
use keyway::lambda::{Env, FunctionError, Handler, Invocation, Platform, Response};
use keyway::ports::{Deadline, Sink};
use keyway_local::mapping::events::{kinesis_event_json, KinesisEventRecord};
use keyway_local::{thread_cpu_time, FaultPlan, KeySchema, LocalServices, MeterSnapshot};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::Serialize;
use serde_json::{json, Value};

use crate::error::CliError;

const FILTER_KEYS: usize = 100_000;
const CONSUMERS: usize = 1_000;
const ALL_EVENTS_SUBSCRIBERS: usize = 10;
/// Records a batch by default: template.yaml's BatchSize for the filter.
const BATCH: usize = 500;
const EPOCH: i64 = 1_767_225_600_000;
const STREAM_ARN: &str = "arn:aws:kinesis:us-east-1:000000000000:stream/filter-events";
const QUEUE_PREFIX: &str = keyway_local::LocalSqs::URL_PREFIX;

/// AWS list prices, us-east-1, as published on the services' pricing pages on 2026-12-01.
mod price {
    /// SQS standard queue, per million requests (a request carries up to 64 KB).
    pub(super) const SQS_REQUEST: f64 = 0.40 / 1e6;
    /// DynamoDB on-demand, per million read request units.
    pub(super) const DYNAMODB_READ: f64 = 0.125 / 1e6;
    /// Lambda, per million requests, and per GB-second (arm64).
    pub(super) const LAMBDA_REQUEST: f64 = 0.20 / 1e6;
    pub(super) const LAMBDA_GB_SECOND: f64 = 0.000_013_333_4;
    /// SNS standard topic, per million publishes (deliveries to SQS are free).
    pub(super) const SNS_PUBLISH: f64 = 0.50 / 1e6;
    /// Kinesis Data Streams (provisioned), per shard hour and per million PUT payload units.
    pub(super) const KINESIS_SHARD_HOUR: f64 = 0.015;
    pub(super) const KINESIS_PUT_UNIT: f64 = 0.014 / 1e6;
}

/// The rate the monthly costs are for, and the month.
const COST_EVENTS_PER_SECOND: f64 = 100_000.0;
const SECONDS_PER_MONTH: f64 = 730.0 * 3600.0;
/// Function memory, as template.yaml gives it.
const FUNCTION_GB: f64 = 0.25;

#[derive(Serialize)]
pub(super) struct Workload {
    pub events: usize,
    pub filter_keys: usize,
    pub consumers: usize,
    pub all_events_subscribers: usize,
    pub subscriptions: usize,
    pub batch_size: usize,
    pub matched_no_one_share: f64,
    pub deliveries: u64,
    /// The fewest SQS calls per 1,000 deliveries any sender could make in batches of this size:
    /// each batch's deliveries to each queue, ten a call.
    pub fewest_sqs_calls_per_1000_deliveries: f64,
}

#[derive(Serialize)]
pub(super) struct Design {
    pub events_per_second_per_core: f64,
    pub capacity_units_per_1000_events: f64,
    pub dynamodb_calls_per_1000_events: f64,
    pub sqs_calls_per_1000_deliveries: f64,
}

#[derive(Serialize)]
pub(super) struct ColdStart {
    /// The filter state's snapshot: subscriptions read at a cold start.
    pub subscriptions_read: usize,
    pub capacity_units: f64,
    pub dynamodb_calls: u64,
    pub cpu_millis: f64,
}

#[derive(Serialize)]
pub(super) struct MonthlyCost {
    pub events_per_second: f64,
    pub prices_as_of: &'static str,
    pub this_design_usd: f64,
    pub brute_force_usd: f64,
    pub brute_force_consumers: usize,
    pub ratio: f64,
}

#[derive(Serialize)]
pub(super) struct FilterBench {
    pub seed: u64,
    pub workload: Workload,
    pub filter: Design,
    pub lookup: Design,
    pub capacity_units_vs_lookup: f64,
    pub cold_start: ColdStart,
    pub monthly_cost: MonthlyCost,
    pub targets: Targets,
    pub targets_met: bool,
}

#[derive(Serialize)]
pub(super) struct Targets {
    pub capacity_units_vs_lookup_at_most: f64,
    pub sqs_calls_per_1000_deliveries_at_most: f64,
}

/// The generated subscriptions and events.
struct Generated {
    subscriptions: Vec<Subscription>,
    events: Vec<Value>,
    /// Records a batch.
    batch: usize,
}

fn generate(events: usize, batch: usize, seed: u64) -> Generated {
    let mut rng = StdRng::seed_from_u64(seed);
    let consumers = Zipf::new(CONSUMERS as f64, 1.2).expect("a Zipf distribution");
    let ops = ["update", "create", "delete", "share"];
    let mut subscriptions = Vec::new();
    for k in 0..FILTER_KEYS {
        let key = format!("sheet-{k}");
        let count = [1, 1, 1, 2, 3][rng.random_range(0..5)];
        for _ in 0..count {
            let consumer = consumers.sample(&mut rng) as usize - 1;
            let pattern = match rng.random_range(0..10) {
                0..=4 => None,
                5..=7 => Some(json!({"op": ["update", "delete"]})),
                _ => Some(json!({"size": [{"numeric": [">", 20]}]})),
            };
            subscriptions.push(subscription(consumer, Target::Key(key.clone()), pattern));
        }
    }
    for consumer in 0..ALL_EVENTS_SUBSCRIBERS {
        let pattern = json!({"op": ["share"], "size": [{"numeric": [">", 80 + consumer as i64]}]});
        subscriptions.push(subscription(consumer, Target::All, Some(pattern)));
    }
    let events = (0..events)
        .map(|i| {
            // 4% of events are of a key with subscriptions; the rest of sheets nobody watches.
            let key = if rng.random_bool(0.04) {
                format!("sheet-{}", rng.random_range(0..FILTER_KEYS))
            } else {
                format!("unwatched-{}", rng.random_range(0..2_000_000))
            };
            let op = ops[[0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3][rng.random_range(0..20)]];
            json!({"id": i, "key": key, "op": op, "size": rng.random_range(0..100), "row": rng.random_range(0..5_000)})
        })
        .collect();
    Generated {
        subscriptions,
        events,
        batch,
    }
}

fn subscription(consumer: usize, target: Target, pattern: Option<Value>) -> Subscription {
    Subscription {
        identity: Identity {
            consumer: format!("consumer-{consumer}"),
            id: target.subscription_id(),
        },
        target,
        queue: queue_of(consumer),
        pattern,
    }
}

/// Consumer `consumer`'s queue, named as its own (`QueueOwnership`).
fn queue_of(consumer: usize) -> String {
    format!("keyway-consumer-{consumer}_events")
}

/// The Kinesis event of `events`, as a batch of one shard.
fn batch_json(events: &[Value], first_sequence: usize) -> String {
    let data: Vec<(String, Vec<u8>, String)> = events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let key = e["key"].as_str().unwrap_or("-").to_owned();
            (
                key,
                serde_json::to_vec(e).expect("JSON"),
                format!("{:021}", first_sequence + i),
            )
        })
        .collect();
    kinesis_event_json(
        STREAM_ARN,
        data.iter().map(|(key, bytes, seq)| KinesisEventRecord {
            shard_id: "shardId-000000000000",
            sequence_number: seq,
            partition_key: key,
            data: bytes,
            arrival_millis: EPOCH,
        }),
    )
}

fn services() -> Arc<LocalServices> {
    let services = LocalServices::new(EPOCH, FaultPlan::default());
    for consumer in 0..CONSUMERS {
        services.sqs.create_queue(&queue_of(consumer));
    }
    services.sqs.create_queue("dead-letters");
    services
}

/// Runs every batch through `handler`, returns the handler's CPU time less the services' own.
async fn drive(
    handler: &dyn Handler,
    generated: &Generated,
    services: &LocalServices,
) -> Result<Duration, CliError> {
    services.sqs.meter().set_cpu_accounting(true);
    for table in services.dynamodb.tables() {
        table.meter().set_cpu_accounting(true);
    }
    let service_before: Duration = services_cpu(services);
    let mut cpu = Duration::ZERO;
    let batch = generated.batch;
    for (n, chunk) in generated.events.chunks(batch).enumerate() {
        let text = batch_json(chunk, n * batch + 1);
        let start = thread_cpu_time();
        let response = handler
            .handle(&text, &Invocation::default())
            .await
            .map_err(|e: FunctionError| format!("a batch failed: {e}"))?;
        cpu += thread_cpu_time() - start;
        let failures = response.batch_item_failures();
        if !failures.is_empty() {
            return Err(format!("a batch reported failures: {failures:?}").into());
        }
    }
    Ok(cpu.saturating_sub(services_cpu(services) - service_before))
}

/// CPU time spent inside the in-memory services so far.
fn services_cpu(services: &LocalServices) -> Duration {
    let tables: Duration = services
        .dynamodb
        .tables()
        .iter()
        .map(|t| t.meter().snapshot().service_cpu)
        .sum();
    tables + services.sqs.meter().snapshot().service_cpu
}

fn table_meter(services: &LocalServices, name: &str) -> MeterSnapshot {
    services
        .dynamodb
        .table(name)
        .map(|t| t.meter().snapshot())
        .unwrap_or_default()
}

fn difference(after: &MeterSnapshot, before: &MeterSnapshot) -> (f64, u64) {
    (
        after.capacity_units() - before.capacity_units(),
        after.total_calls() - before.total_calls(),
    )
}

fn sqs_sends(services: &LocalServices) -> u64 {
    let calls = services.sqs.meter().snapshot().calls;
    calls.get("SendMessageBatch").copied().unwrap_or(0)
        + calls.get("SendMessage").copied().unwrap_or(0)
}

/// What the consumers' queues hold.
struct Delivered {
    messages: u64,
    /// Distinct events among them.
    events: u64,
    /// The fewest SendMessageBatch calls that could have sent them: each batch's messages to each
    /// queue, ten a call.
    fewest_calls: u64,
}

fn delivered(services: &LocalServices, batch: usize) -> Delivered {
    let mut events = std::collections::HashSet::new();
    let (mut messages, mut fewest_calls) = (0, 0);
    for c in 0..CONSUMERS {
        let mut by_batch: BTreeMap<u64, u64> = BTreeMap::new();
        for message in services
            .sqs
            .messages(&format!("{QUEUE_PREFIX}{}", queue_of(c)))
        {
            messages += 1;
            let event: Value = serde_json::from_str(&message.body).unwrap_or_default();
            let id = event["id"].as_u64().unwrap_or(u64::MAX);
            events.insert(id);
            *by_batch.entry(id / batch as u64).or_default() += 1;
        }
        fewest_calls += by_batch.values().map(|n| n.div_ceil(10)).sum::<u64>();
    }
    Delivered {
        messages,
        events: events.len() as u64,
        fewest_calls,
    }
}

/// The filter: its state loaded, its cold start read, then every batch.
async fn run_filter(generated: &Generated) -> Result<(Design, ColdStart, Delivered), CliError> {
    let services = services();
    services.dynamodb.create_table(
        "filter-state",
        KeySchema::state_table(),
        Some(TTL.into()),
        None,
    );
    let state = FilterState::new(
        services.dynamodb.table("filter-state").expect("the table"),
        services.clock.clone(),
    );
    for (n, subscription) in generated.subscriptions.iter().enumerate() {
        let change = Revised {
            table: "policies".into(),
            identity: subscription.identity.clone(),
            revision: revision(&(n + 1).to_string()),
            subscription: Some(subscription.clone()),
        };
        state
            .apply(&change)
            .await
            .map_err(|e| format!("loading the filter state: {e}"))?;
    }
    // The subscriptions were made before the filter starts, as in the steady state measured
    // here: every read takes in the journal's last `JOURNAL_OVERLAP`, which a load of them all
    // at once would fill for that long.
    tokio::time::sleep(dynamic_filter::store::JOURNAL_OVERLAP * 2).await;
    let env: Env = [
        ("FILTER_STATE_TABLE", "filter-state".to_owned()),
        (
            "DEAD_LETTER_SINK",
            format!("sqs:{QUEUE_PREFIX}dead-letters"),
        ),
        ("QUEUE_URL_PREFIX", QUEUE_PREFIX.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let handler = dynamic_filter::handler(services.as_ref(), &env).map_err(|e| e.to_string())?;
    let before = table_meter(&services, "filter-state");
    let start = thread_cpu_time();
    handler
        .refresh()
        .await
        .map_err(|e| format!("the cold start: {e}"))?;
    let cold_cpu = thread_cpu_time() - start;
    let loaded = table_meter(&services, "filter-state");
    let (cold_units, cold_calls) = difference(&loaded, &before);
    let cold_start = ColdStart {
        subscriptions_read: generated.subscriptions.len(),
        capacity_units: cold_units,
        dynamodb_calls: cold_calls,
        cpu_millis: cold_cpu.as_secs_f64() * 1000.0,
    };
    let cpu = drive(&handler, generated, &services).await?;
    let (units, calls) = difference(&table_meter(&services, "filter-state"), &loaded);
    let delivered = delivered(&services, generated.batch);
    let sends = sqs_sends(&services);
    Ok((
        design(
            generated.events.len(),
            cpu,
            units,
            calls,
            sends,
            delivered.messages,
        ),
        cold_start,
        delivered,
    ))
}

fn design(
    events: usize,
    cpu: Duration,
    units: f64,
    calls: u64,
    sends: u64,
    delivered: u64,
) -> Design {
    Design {
        events_per_second_per_core: events as f64 / cpu.as_secs_f64().max(1e-9),
        capacity_units_per_1000_events: units * 1000.0 / events as f64,
        dynamodb_calls_per_1000_events: calls as f64 * 1000.0 / events as f64,
        sqs_calls_per_1000_deliveries: sends as f64 * 1000.0 / delivered.max(1) as f64,
    }
}

/// The design the article replaced: every event looks up its key's subscriptions.
struct Lookup {
    table: Arc<dyn Table>,
    router: QueueRouter,
    all: Vec<(Subscription, Pattern)>,
}

#[async_trait]
impl Handler for Lookup {
    async fn handle(&self, event: &str, _: &Invocation) -> Result<Response, FunctionError> {
        let records = keyway::sources::kinesis::decode_event(event)
            .map_err(|e| FunctionError::Failed(e.to_string()))?;
        let mut outputs = Vec::new();
        for record in records.into_iter().flatten() {
            let Payload::Bytes(data) = &record.payload else {
                continue;
            };
            let Ok(event) = serde_json::from_slice::<Value>(data) else {
                continue;
            };
            let key = event["key"].as_str().unwrap_or_default();
            let found = self
                .table
                .get(&ItemKey {
                    pk: key.to_owned(),
                    sk: "subscriptions".into(),
                })
                .await
                .map_err(|e| FunctionError::Failed(e.to_string()))?;
            let mut keyed: Vec<(Subscription, Pattern)> = Vec::new();
            if let Some(text) = found
                .as_ref()
                .and_then(|i| i.get("subs"))
                .and_then(AttrValue::as_s)
            {
                let subs: Vec<Subscription> =
                    serde_json::from_str(text).map_err(|e| FunctionError::Failed(e.to_string()))?;
                keyed = subs
                    .into_iter()
                    .map(|s| {
                        let p = s.compiled_pattern();
                        p.map(|p| (s, p))
                    })
                    .collect::<Result<_, _>>()
                    .map_err(|e| FunctionError::Failed(e.to_string()))?;
            }
            let mut consumers = Vec::new();
            for (s, pattern) in keyed.iter().chain(&self.all) {
                if !consumers.contains(&s.identity.consumer) && pattern.matches(&event) {
                    consumers.push(s.identity.consumer.clone());
                    outputs.push(Output {
                        id: OutputId::derive(
                            "lookup",
                            &s.identity.consumer,
                            &record.origin,
                            &record.sequence,
                            0,
                        ),
                        sink: "deliveries".into(),
                        partition_key: s.queue.clone(),
                        body: event.to_string(),
                        settled: false,
                    });
                }
            }
        }
        let failed = self.router.send(&outputs, Deadline::NONE).await;
        if !failed.is_empty() {
            return Err(FunctionError::Failed(format!(
                "{} deliveries failed",
                failed.len()
            )));
        }
        Ok(Response::Kinesis(Default::default()))
    }
}

async fn run_lookup(generated: &Generated) -> Result<Design, CliError> {
    let services = services();
    let table = services
        .dynamodb
        .create_table("lookup", KeySchema::state_table(), None, None);
    let mut by_key: BTreeMap<String, Vec<&Subscription>> = BTreeMap::new();
    let mut all = Vec::new();
    for s in &generated.subscriptions {
        match &s.target {
            Target::Key(key) => by_key.entry(key.clone()).or_default().push(s),
            Target::All => {
                let pattern = s.compiled_pattern().map_err(|e| e.to_string())?;
                all.push((s.clone(), pattern));
            }
        }
    }
    for (key, subs) in &by_key {
        let mut item = ItemKey {
            pk: key.clone(),
            sk: "subscriptions".into(),
        }
        .to_item();
        item.insert(
            "subs".into(),
            AttrValue::S(serde_json::to_string(subs).expect("JSON")),
        );
        table.put_item(item).map_err(|e| e.to_string())?;
    }
    let make = services.sink_maker();
    let router = QueueRouter::new(
        Box::new(move |queue| make(&format!("sqs:{QUEUE_PREFIX}{queue}"))),
        services.clock.clone(),
    );
    let before = table.meter().snapshot();
    let lookup = Lookup {
        table: table.clone(),
        router,
        all,
    };
    let cpu = drive(&lookup, generated, &services).await?;
    let after = table.meter().snapshot();
    let (strong_units, calls) = difference(&after, &before);
    // The lookup reads eventually consistent, at half the units of the strong reads metered.
    let delivered = delivered(&services, generated.batch).messages;
    Ok(design(
        generated.events.len(),
        cpu,
        strong_units / 2.0,
        calls,
        sqs_sends(&services),
        delivered,
    ))
}

/// The monthly cost of this design and of the article's brute force (every event published to
/// SNS and delivered to every consumer's queue, each consumer's function receiving, looking up,
/// and deleting every event), at `COST_EVENTS_PER_SECOND`.
fn monthly_cost(
    filter: &Design,
    lookup: &Design,
    deliveries_per_event: f64,
    batch: usize,
) -> MonthlyCost {
    let events = COST_EVENTS_PER_SECOND * SECONDS_PER_MONTH;
    let shards = (COST_EVENTS_PER_SECOND / 1000.0).ceil();
    let kinesis = shards * 730.0 * price::KINESIS_SHARD_HOUR + events * price::KINESIS_PUT_UNIT;
    let lambda = |invocations: f64, events: f64, rate: f64| {
        invocations * price::LAMBDA_REQUEST + events / rate * FUNCTION_GB * price::LAMBDA_GB_SECOND
    };
    let delivered = events * deliveries_per_event;
    let this_design = kinesis
        + lambda(events / batch as f64, events, filter.events_per_second_per_core)
        + events / 1000.0 * filter.capacity_units_per_1000_events * price::DYNAMODB_READ
        // Sends as measured; consumers receive and delete ten at a time.
        + (delivered / 1000.0 * filter.sqs_calls_per_1000_deliveries + delivered * 0.2) * price::SQS_REQUEST;
    let copies = events * CONSUMERS as f64;
    let brute_force = events * price::SNS_PUBLISH
        + copies * 0.2 * price::SQS_REQUEST
        + lambda(copies / 10.0, copies, lookup.events_per_second_per_core)
        + copies * 0.5 * price::DYNAMODB_READ;
    MonthlyCost {
        events_per_second: COST_EVENTS_PER_SECOND,
        prices_as_of: "2026-12-01, us-east-1 list prices",
        this_design_usd: this_design,
        brute_force_usd: brute_force,
        brute_force_consumers: CONSUMERS,
        ratio: this_design / brute_force,
    }
}

/// `keyway bench filter`'s arguments.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[arg(long, default_value_t = 1_000_000)]
    pub events: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Records a batch (the stack's BatchSize is 500): each queue gets at least one call a
    /// batch it has deliveries in, so larger batches need fewer calls.
    #[arg(long, default_value_t = BATCH)]
    pub batch_size: usize,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn run(args: Args) -> Result<(), CliError> {
    let Args {
        events,
        seed,
        batch_size,
        json,
    } = args;
    if !(1..=10_000).contains(&batch_size) {
        return Err(CliError::option(
            "--batch-size",
            "must be 1 to 10,000 (Lambda's limit for a Kinesis mapping)",
        ));
    }
    let generated = generate(events, batch_size, seed);
    let runtime = crate::job::runtime_builder(true);
    let (filter, cold_start, delivered) = runtime.block_on(run_filter(&generated))?;
    let (deliveries, events_delivered) = (delivered.messages, delivered.events);
    let lookup = runtime.block_on(run_lookup(&generated))?;
    let unmatched = 1.0 - events_delivered as f64 / events as f64;
    let targets = Targets {
        capacity_units_vs_lookup_at_most: 0.1,
        sqs_calls_per_1000_deliveries_at_most: 110.0,
    };
    let capacity_units_vs_lookup =
        filter.capacity_units_per_1000_events / lookup.capacity_units_per_1000_events;
    let targets_met = capacity_units_vs_lookup <= targets.capacity_units_vs_lookup_at_most
        && filter.sqs_calls_per_1000_deliveries <= targets.sqs_calls_per_1000_deliveries_at_most;
    let monthly_cost = monthly_cost(
        &filter,
        &lookup,
        deliveries as f64 / events as f64,
        batch_size,
    );
    let result = FilterBench {
        seed,
        workload: Workload {
            events,
            filter_keys: FILTER_KEYS,
            consumers: CONSUMERS,
            all_events_subscribers: ALL_EVENTS_SUBSCRIBERS,
            subscriptions: generated.subscriptions.len(),
            batch_size,
            matched_no_one_share: unmatched,
            deliveries,
            fewest_sqs_calls_per_1000_deliveries: delivered.fewest_calls as f64 * 1000.0
                / deliveries.max(1) as f64,
        },
        filter,
        lookup,
        capacity_units_vs_lookup,
        cold_start,
        monthly_cost,
        targets,
        targets_met,
    };
    crate::job::report(&result, json, |r| print!("{}", report(r)));
    Ok(())
}

fn report(r: &FilterBench) -> String {
    let w = &r.workload;
    let mut text = format!(
        "keyway bench filter: {} events in batches of {}, {} filter keys, {} consumers (Zipf 1.2), {} all-events subscribers, {} subscriptions, seed {}\n",
        w.events, w.batch_size, w.filter_keys, w.consumers, w.all_events_subscribers, w.subscriptions, r.seed
    );
    text.push_str(&format!(
        "{} deliveries; events that matched no one: {:.1}%\n\n",
        w.deliveries,
        w.matched_no_one_share * 100.0
    ));
    text.push_str(&format!(
        "{:<36} {:>12} {:>12} {:>8}\n",
        "", "filter", "lookup", "ratio"
    ));
    let row =
        |name: &str, f: f64, l: f64| format!("{name:<36} {f:>12.2} {l:>12.2} {:>8.3}\n", f / l);
    text.push_str(&row(
        "events / s / core",
        r.filter.events_per_second_per_core,
        r.lookup.events_per_second_per_core,
    ));
    text.push_str(&row(
        "capacity units / 1,000 events",
        r.filter.capacity_units_per_1000_events,
        r.lookup.capacity_units_per_1000_events,
    ));
    text.push_str(&row(
        "DynamoDB calls / 1,000 events",
        r.filter.dynamodb_calls_per_1000_events,
        r.lookup.dynamodb_calls_per_1000_events,
    ));
    text.push_str(&row(
        "SQS calls / 1,000 deliveries",
        r.filter.sqs_calls_per_1000_deliveries,
        r.lookup.sqs_calls_per_1000_deliveries,
    ));
    text.push_str(&format!(
        "{:<36} {:>12.2}   (each batch's deliveries to each queue, ten a call)\n",
        "  the fewest possible", w.fewest_sqs_calls_per_1000_deliveries
    ));
    let c = &r.cold_start;
    text.push_str(&format!(
        "\ncold start: {} subscriptions read, {:.0} capacity units, {} calls, {:.0} ms CPU\n",
        c.subscriptions_read, c.capacity_units, c.dynamodb_calls, c.cpu_millis
    ));
    let m = &r.monthly_cost;
    text.push_str(&format!(
        "monthly cost at {:.0} events/s ({}): this design ${:.0}, brute force to {} consumers ${:.0} ({:.5}x)\n",
        m.events_per_second, m.prices_as_of, m.this_design_usd, m.brute_force_consumers, m.brute_force_usd, m.ratio
    ));
    text.push_str(&format!(
        "targets: capacity units <= {}x the lookup design's ({:.4}x), SQS calls <= {} per 1,000 deliveries ({:.1}): {}\n",
        r.targets.capacity_units_vs_lookup_at_most,
        r.capacity_units_vs_lookup,
        r.targets.sqs_calls_per_1000_deliveries_at_most,
        r.filter.sqs_calls_per_1000_deliveries,
        if r.targets_met { "met" } else { "MISSED" }
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fewest_calls_count_each_batchs_deliveries_to_a_queue_apart() {
        let services = services();
        let url = format!("{QUEUE_PREFIX}{}", queue_of(7));
        for id in 0..12 {
            services
                .sqs
                .send_message(&url, json!({ "id": id }).to_string())
                .expect("sent");
        }
        // Batches of 4 events: three batches, a call each. One batch of 500: two calls of ten.
        let small = delivered(&services, 4);
        assert_eq!(
            (small.messages, small.events, small.fewest_calls),
            (12, 12, 3)
        );
        assert_eq!(delivered(&services, 500).fewest_calls, 2);
    }
}
