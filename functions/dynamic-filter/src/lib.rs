//! Real-time dynamic filtering: consumers keep their subscriptions in DynamoDB policy tables, and
//! only the events a subscription matches reach the consumer's own SQS queue, within a second of
//! a subscription changing and with no lookup per event (DESIGN §1, and the article it comes
//! from).
//!
//! `subscription` is what a consumer asks for and the policy item that holds it; `client` is what
//! a consumer calls to change its subscriptions; `store` is the filter state in DynamoDB that
//! filter-policy-sync writes; `index` is the subscriptions as the filter holds them in memory,
//! built from the filter state once per execution environment and kept exact by one strongly
//! consistent read of the journal per batch; `filter` is the stateless operator that matches
//! events; `router` sends each match to its consumer's queue.
//!
//! Environment: `FILTER_STATE_TABLE`, `DEAD_LETTER_SINK` (`kinesis:<stream>` or
//! `sqs:<queue URL>`), `QUEUE_URL_PREFIX` (what a queue name is appended to for its URL, e.g.
//! `https://sqs.eu-west-1.amazonaws.com/123456789012/`); optionally `FILTER_KEY_POINTER` (where
//! an event holds its filter key, a JSON pointer, `/key` by default), `CONSUMER_QUEUE_PREFIX`
//! and `CONSUMER_QUEUES` (which queues each consumer owns: `subscription::QueueOwnership`),
//! `QUEUE_PATIENCE_SECONDS` (how long a queue may refuse every delivery before its deliveries
//! are dead-lettered: `router`), and the executor's variables (see
//! `keyway::lambda::executor_config`).

// Functions of one step each: clippy.toml sets the threshold (tests, which read as scenarios,
// are left out).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod client;
pub mod filter;
pub mod index;
#[cfg(feature = "local")]
pub mod local;
pub mod router;
pub mod store;
pub mod subscription;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use keyway::domain::metrics::Emf;
use keyway::lambda::{
    executor_config, observed, read_table_from, required, sink_from, whole_number, ConfigError,
    Env, FunctionError, Handler, Invocation, Platform, Response, SetupError, StreamHandler,
};
use keyway::ports::{Clock, MetricLog, StoreError};
use keyway::{Executor, Sinks};

use filter::{DynamicFilter, DEFAULT_KEY_POINTER, DELIVERIES};
use index::SubscriptionIndex;
use router::{QueueRouter, DEFAULT_PATIENCE};
use store::{journal_position, FilterState, JOURNAL_OVERLAP, JOURNAL_RETENTION};
use subscription::QueueOwnership;

/// Journal changes read a request while catching up.
const JOURNAL_PAGE: usize = 1_000;

/// What keeping the index exact has cost so far in this execution environment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refreshes {
    /// Snapshots read: the first batch's, and any after the journal no longer reached back to
    /// the index (a day without a batch).
    pub snapshots: u64,
    /// Journal reads (one a batch when nothing changed).
    pub journal_reads: u64,
    /// Changes that changed the index (an entry read again changes nothing).
    pub changes_applied: u64,
}

/// The function: before each batch the index catches up with the filter state, then the batch
/// runs through the filter; afterwards each consumer's delivered and dropped counts go out as
/// metric lines.
pub struct FilterHandler {
    inner: StreamHandler<DynamicFilter>,
    index: Arc<RwLock<SubscriptionIndex>>,
    ownership: QueueOwnership,
    state: FilterState,
    loaded: tokio::sync::Mutex<bool>,
    refreshes: Mutex<Refreshes>,
    metrics: Arc<dyn MetricLog>,
    clock: Arc<dyn Clock>,
}

impl FilterHandler {
    /// What keeping the index exact has cost so far in this execution environment.
    pub fn refreshes(&self) -> Refreshes {
        *self.refreshes.lock().expect("refreshes lock")
    }

    /// Brings the index up to the filter state's journal: reads it from the index's cursor on,
    /// page by page, and then holds everything appended `JOURNAL_OVERLAP` before the read began.
    /// An index whose cursor the journal no longer reaches back to starts again from a snapshot.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let mut loaded = self.loaded.lock().await;
        let began = self.clock.now_millis();
        let kept_since = began - (JOURNAL_RETENTION - JOURNAL_OVERLAP).as_millis() as i64;
        if !*loaded || self.index.read().expect("index lock").cursor() < kept_since {
            self.reload().await?;
            *loaded = true;
        }
        let cursor = self.index.read().expect("index lock").cursor();
        let mut after = journal_position(cursor);
        loop {
            let changes = self.state.since(&after, JOURNAL_PAGE).await?;
            let applied = self.index.write().expect("index lock").catch_up(&changes);
            let mut refreshes = self.refreshes.lock().expect("refreshes lock");
            refreshes.journal_reads += 1;
            refreshes.changes_applied += applied as u64;
            match changes.last() {
                Some(last) if changes.len() == JOURNAL_PAGE => after = last.position.clone(),
                _ => break,
            }
        }
        let held = began - JOURNAL_OVERLAP.as_millis() as i64;
        self.index.write().expect("index lock").advance(held);
        Ok(())
    }

    async fn reload(&self) -> Result<(), StoreError> {
        let (cursor, rows) = self.state.snapshot().await?;
        let index = SubscriptionIndex::from_snapshot(self.ownership.clone(), cursor, rows);
        // Said once an environment: subscriptions written by other means, or before queues were
        // owned, that the filter holds back.
        for (item, why) in index.refused() {
            tracing::warn!(
                consumer = %item.identity.consumer,
                subscription = %item.identity.id,
                table = %item.table,
                "a subscription held back: {why}"
            );
        }
        // One line a consumer, however many it has.
        let mut held: BTreeMap<&str, Vec<&index::PolicyItem>> = BTreeMap::new();
        for item in index.held_back() {
            held.entry(&item.identity.consumer).or_default().push(item);
        }
        for (consumer, items) in held {
            tracing::warn!(
                consumer,
                held = items.len(),
                first = %items[0].identity.id,
                table = %items[0].table,
                "subscriptions to all events held back: a consumer's first {} are live",
                index::ALL_EVENTS_PER_CONSUMER
            );
        }
        *self.index.write().expect("index lock") = index;
        self.refreshes.lock().expect("refreshes lock").snapshots += 1;
        Ok(())
    }

    fn write_metrics(&self) {
        let tally = self.inner.executor().operator().take_tally();
        let now = self.clock.now_millis();
        let line = Emf::new(now)
            .dimension("function", "dynamic-filter")
            .count("events", tally.events)
            .count("unmatched", tally.unmatched);
        self.metrics.write(line.to_line());
        for (consumer, (delivered, dropped)) in tally.by_consumer {
            let line = Emf::new(now)
                .dimension("function", "dynamic-filter")
                .dimension("consumer", consumer)
                .count("delivered", delivered)
                .count("dropped", dropped);
            self.metrics.write(line.to_line());
        }
    }
}

#[async_trait]
impl Handler for FilterHandler {
    async fn handle(
        &self,
        event: &str,
        invocation: &Invocation,
    ) -> Result<Response, FunctionError> {
        self.refresh()
            .await
            .map_err(FunctionError::store("reading the filter state"))?;
        let response = self.inner.handle(event, invocation).await;
        self.write_metrics();
        response
    }
}

/// The function wired to the filter state, queues and dead-letter sink its environment names.
pub fn handler(platform: &dyn Platform, env: &Env) -> Result<FilterHandler, SetupError> {
    let state = FilterState::new(
        read_table_from(platform, env, "FILTER_STATE_TABLE")?,
        platform.clock(),
    )
    .with_backoff(platform.backoff());
    let prefix = required(env, "QUEUE_URL_PREFIX")?.to_owned();
    let queues = queue_sinks(platform, prefix);
    let patience =
        whole_number(env, router::PATIENCE)?.map_or(DEFAULT_PATIENCE, Duration::from_secs);
    let router = QueueRouter::new(queues, platform.clock()).with_patience(patience);
    let sinks = Sinks::new(sink_from(platform, env, "DEAD_LETTER_SINK")?)
        .with(&DELIVERIES, Arc::new(router));
    let ownership = queue_ownership(env)?;
    let index = Arc::new(RwLock::new(SubscriptionIndex::new(ownership.clone())));
    let pointer = env
        .get("FILTER_KEY_POINTER")
        .map_or(DEFAULT_KEY_POINTER, String::as_str);
    let operator = DynamicFilter::new(index.clone(), pointer);
    let executor = Executor::stateless(operator, sinks, platform.clock())?;
    Ok(FilterHandler {
        inner: StreamHandler::new(
            observed(executor, platform, env).with_config(executor_config(env)?),
        ),
        index,
        ownership,
        state,
        loaded: tokio::sync::Mutex::new(false),
        refreshes: Mutex::default(),
        metrics: platform.metrics(),
        clock: platform.clock(),
    })
}

/// Which queues each consumer owns, from `CONSUMER_QUEUE_PREFIX` (`keyway-` if unset) and
/// `CONSUMER_QUEUES` (none narrows them if unset or empty): what the policy sync checks
/// subscriptions against, and the filter again.
pub fn queue_ownership(env: &Env) -> Result<QueueOwnership, ConfigError> {
    let set = |name: &str| env.get(name).filter(|t| !t.trim().is_empty());
    let prefix = set("CONSUMER_QUEUE_PREFIX").map_or(subscription::DEFAULT_QUEUE_PREFIX, |p| p);
    let ownership = QueueOwnership::new(prefix);
    match set("CONSUMER_QUEUES") {
        None => Ok(ownership),
        Some(text) => ownership.with_registry(text).map_err(|e| ConfigError {
            name: "CONSUMER_QUEUES".into(),
            problem: e.to_string(),
        }),
    }
}

/// Queue sinks by name: the platform's SQS sink of the queue's URL.
fn queue_sinks(platform: &dyn Platform, prefix: String) -> Box<router::QueueSinks> {
    let make = platform.sink_maker();
    Box::new(move |queue| make(&format!("sqs:{prefix}{queue}")))
}
