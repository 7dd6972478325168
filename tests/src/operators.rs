//! Operators and store wrappers that put the runtime in the situations its guarantees are about.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use keyway::domain::{KeyState, Output, Payload, SourceRecord};
use keyway::executor::SIGNATURE_HISTORY;
use keyway::operator::{SinkDescriptor, StateDescriptor};
use keyway::ports::{
    Commit, Committed, Deadline, LoadKey, ManualClock, Namespace, Sink as SinkPort, SinkError,
    StateStore, StoreError, StoreLimits, TimerIndex,
};
use keyway::{
    Ctx, Delivery, InvalidInput, KeyedOperator, ListState, ProcessError, Sink, ValueState,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Barrier;

/// Wraps an operator; records whose sequence numbers are poisoned fail with a retryable error,
/// as a record does while a dependency it needs is down.
pub struct Poisoned<O> {
    /// The operator wrapped.
    pub inner: O,
    /// The sequence numbers of the records that fail.
    pub poisoned: Arc<Mutex<HashSet<String>>>,
}

impl<O> Poisoned<O> {
    /// `inner`, no record poisoned yet.
    pub fn new(inner: O) -> Self {
        Self {
            inner,
            poisoned: Arc::default(),
        }
    }

    /// Makes the record with sequence number `sequence` fail, from its next try on.
    pub fn poison(&self, sequence: &str) {
        self.poisoned.lock().unwrap().insert(sequence.to_owned());
    }

    /// Lets every poisoned record through again, as when the dependency is back.
    pub fn heal(&self) {
        self.poisoned.lock().unwrap().clear();
    }
}

impl<O: KeyedOperator> KeyedOperator for Poisoned<O> {
    type Input = O::Input;

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn states(&self) -> Vec<StateDescriptor> {
        self.inner.states()
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        self.inner.sinks()
    }

    fn decode(&self, record: &SourceRecord) -> Result<O::Input, InvalidInput> {
        self.inner.decode(record)
    }

    fn key(&self, input: &O::Input) -> String {
        self.inner.key(input)
    }

    fn process(&self, ctx: &mut Ctx<'_>, input: O::Input) -> Result<(), ProcessError> {
        if self
            .poisoned
            .lock()
            .unwrap()
            .contains(ctx.record().sequence.as_str())
        {
            return Err(ProcessError::Retry("poisoned: a dependency is down".into()));
        }
        self.inner.process(ctx, input)
    }

    fn on_timer(&self, ctx: &mut Ctx<'_>, at_millis: i64) -> Result<(), ProcessError> {
        self.inner.on_timer(ctx, at_millis)
    }

    fn delivery(&self) -> Delivery {
        self.inner.delivery()
    }
}

/// The waker: events of a key wait in a buffer until the key's resolution arrives on another
/// stream; then they leave resolved, and later events leave at once. The shape of identity
/// enrichment: two input streams write one key, and outputs depend on state the other changes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Waker;

/// A key's actor, once its resolution arrived.
pub(crate) const ACTOR: ValueState<String> = ValueState::new("actor");
/// A key's events waiting for its resolution, in order.
pub const PENDING: ListState<String> = ListState::new("pending");
/// Where events leave with their key's actor.
pub const RESOLVED: Sink<Resolved> = Sink::new("resolved");

/// A record of either stream: a key's resolution, or an event of a key.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum WakerInput {
    /// A key's resolution, from the stream that resolves keys.
    Resolution {
        /// The key resolved.
        key: String,
        /// Who the key's events are of.
        actor: String,
    },
    /// An event, from the stream of events.
    Event {
        /// The key the event is of.
        key: String,
        /// The event's text.
        event: String,
    },
}

/// An event that left resolved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolved {
    /// The event's text.
    pub event: String,
    /// Who its key's events are of.
    pub actor: String,
}

impl KeyedOperator for Waker {
    type Input = WakerInput;

    fn name(&self) -> &str {
        "waker"
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![ACTOR.descriptor(), PENDING.descriptor()]
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        vec![RESOLVED.descriptor()]
    }

    fn decode(&self, record: &SourceRecord) -> Result<WakerInput, InvalidInput> {
        record.json()
    }

    fn key(&self, input: &WakerInput) -> String {
        match input {
            WakerInput::Resolution { key, .. } | WakerInput::Event { key, .. } => key.clone(),
        }
    }

    fn process(&self, ctx: &mut Ctx<'_>, input: WakerInput) -> Result<(), ProcessError> {
        match input {
            WakerInput::Event { key, event } => {
                let actor = ctx.value(&ACTOR)?.get().cloned();
                match actor {
                    Some(actor) => ctx.emit(&RESOLVED, key, &Resolved { event, actor })?,
                    None => ctx.list(&PENDING)?.push(event),
                }
            }
            WakerInput::Resolution { key, actor } => {
                ctx.value(&ACTOR)?.set(actor.clone());
                for event in ctx.list(&PENDING)?.take()? {
                    ctx.emit(
                        &RESOLVED,
                        key.clone(),
                        &Resolved {
                            event,
                            actor: actor.clone(),
                        },
                    )?;
                }
            }
        }
        Ok(())
    }

    fn delivery(&self) -> Delivery {
        Delivery::Outbox
    }
}

/// A store where the first load of an operator's keys by each of `parties` invocations waits for
/// the others: concurrent invocations all read the same version before any of them commits.
/// (Loads of the operator's signature history pass: they are not the invocation's; so do loads
/// after the race, such as a loser reading the winner's state.)
pub struct BarrierStore {
    /// The store every load and commit goes to.
    pub inner: Arc<dyn StateStore>,
    /// Where the held loads wait for each other.
    pub barrier: Barrier,
    /// Set once the held loads went on: later loads pass.
    pub released: AtomicBool,
    /// The versions the held loads read, key by key.
    pub read: Mutex<Vec<(String, u64)>>,
}

impl BarrierStore {
    /// A store over `inner` whose first loads, one by each of `parties` invocations, wait for
    /// each other.
    pub fn new(inner: Arc<dyn StateStore>, parties: usize) -> Self {
        Self {
            inner,
            barrier: Barrier::new(parties),
            released: AtomicBool::new(false),
            read: Mutex::default(),
        }
    }

    /// The versions of `key` the held loads read.
    pub fn versions_read(&self, key: &str) -> Vec<u64> {
        let read = self.read.lock().unwrap();
        read.iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| *v)
            .collect()
    }
}

#[async_trait]
impl StateStore for BarrierStore {
    async fn load_keys(
        &self,
        namespace: &Namespace,
        keys: &[LoadKey<'_>],
    ) -> Result<HashMap<String, KeyState>, StoreError> {
        let loaded = self.inner.load_keys(namespace, keys).await;
        if namespace.signature != SIGNATURE_HISTORY && !self.released.load(Ordering::SeqCst) {
            if let Ok(states) = &loaded {
                let mut read = self.read.lock().unwrap();
                read.extend(states.iter().map(|(k, s)| (k.clone(), s.version)));
            }
            self.barrier.wait().await;
            self.released.store(true, Ordering::SeqCst);
        }
        loaded
    }

    async fn commit(
        &self,
        namespace: &Namespace,
        commits: Vec<Commit>,
    ) -> Vec<Result<Committed, StoreError>> {
        self.inner.commit(namespace, commits).await
    }

    async fn clear_outbox(
        &self,
        namespace: &Namespace,
        committed: Vec<Committed>,
    ) -> Vec<Result<(), StoreError>> {
        self.inner.clear_outbox(namespace, committed).await
    }

    fn timers(&self) -> &dyn TimerIndex {
        self.inner.timers()
    }

    fn limits(&self) -> StoreLimits {
        self.inner.limits()
    }
}

/// A sink that fails every message while it is down.
pub struct FlakySink {
    /// The sink messages go to while it is up.
    pub inner: Arc<dyn SinkPort>,
    /// Whether it is down.
    pub down: AtomicBool,
}

impl FlakySink {
    /// A sink over `inner`, up until a test takes it down.
    pub fn new(inner: Arc<dyn SinkPort>) -> Self {
        Self {
            inner,
            down: AtomicBool::new(false),
        }
    }

    /// Takes the sink down (`true`) or brings it back up (`false`).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
}

#[async_trait]
impl SinkPort for FlakySink {
    async fn send(&self, messages: &[Output], deadline: Deadline) -> Vec<(usize, SinkError)> {
        if self.down.load(Ordering::SeqCst) {
            return (0..messages.len())
                .map(|i| (i, SinkError::Unavailable("the sink is down".into())))
                .collect();
        }
        self.inner.send(messages, deadline).await
    }

    fn max_message_bytes(&self) -> usize {
        self.inner.max_message_bytes()
    }
}

/// Buffers every record's text in a list; a record `FLUSH` empties it and emits how many there were.
#[derive(Clone, Copy, Debug, Default)]
pub struct Buffer;

/// The texts buffered since the last flush, in order.
pub(crate) const BUFFERED: ListState<String> = ListState::new("buffered");
/// How many entries a flush took, and whether they were in order.
pub(crate) const FLUSHED: Sink<serde_json::Value> = Sink::new("flushed");

impl KeyedOperator for Buffer {
    type Input = String;

    fn name(&self) -> &str {
        "buffer"
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![BUFFERED.descriptor()]
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        vec![FLUSHED.descriptor()]
    }

    fn decode(&self, record: &SourceRecord) -> Result<String, InvalidInput> {
        let Payload::Bytes(data) = &record.payload else {
            return Err(InvalidInput::new("record", "not Kinesis"));
        };
        String::from_utf8(data.to_vec()).map_err(|e| InvalidInput::new("data", e.to_string()))
    }

    fn key(&self, _: &String) -> String {
        "the-key".into()
    }

    fn process(&self, ctx: &mut Ctx<'_>, input: String) -> Result<(), ProcessError> {
        let mut list = ctx.list(&BUFFERED)?;
        if input == "FLUSH" {
            let all = list.take()?;
            let first_ok = all
                .iter()
                .enumerate()
                .all(|(i, e)| e.starts_with(&format!("{i:05}")));
            ctx.emit(
                &FLUSHED,
                "the-key",
                &serde_json::json!({"count": all.len(), "in_order": first_ok}),
            )?;
        } else {
            list.push(input);
        }
        Ok(())
    }
}

/// Another operator around `inner`: under its own name, with its own state TTL, panicking on a
/// key, or taking virtual time per record. Everything else is `inner`'s.
pub struct Tweaked<O> {
    /// The operator wrapped.
    pub inner: O,
    /// Its name instead of `inner`'s.
    pub name: Option<&'static str>,
    /// Its state TTL instead of `inner`'s.
    pub ttl: Option<Duration>,
    /// The key whose records make it panic, as a bug would.
    pub panic_on: Option<&'static str>,
    /// The clock each record advances, and by how much.
    pub slow: Option<(Arc<ManualClock>, i64)>,
    /// How its outputs are delivered, instead of as `inner`'s are.
    pub delivery: Option<Delivery>,
}

impl<O> Tweaked<O> {
    /// `inner` with nothing tweaked yet.
    pub fn new(inner: O) -> Self {
        Self {
            inner,
            name: None,
            ttl: None,
            panic_on: None,
            slow: None,
            delivery: None,
        }
    }

    /// Outputs go through the outbox: committed with the state, sent after.
    pub fn through_outbox(mut self) -> Self {
        self.delivery = Some(Delivery::Outbox);
        self
    }

    /// Under the name `name`, so that its state is apart from `inner`'s.
    pub fn named(mut self, name: &'static str) -> Self {
        self.name = Some(name);
        self
    }

    /// With the state TTL `ttl`.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Panicking on every record of `key`.
    pub fn panicking_on(mut self, key: &'static str) -> Self {
        self.panic_on = Some(key);
        self
    }

    /// Advancing `clock` by `millis` for every record, as a slow operator's records take time.
    pub fn taking(mut self, clock: Arc<ManualClock>, millis: i64) -> Self {
        self.slow = Some((clock, millis));
        self
    }
}

impl<O: KeyedOperator> KeyedOperator for Tweaked<O> {
    type Input = O::Input;

    fn name(&self) -> &str {
        self.name.unwrap_or(self.inner.name())
    }

    fn states(&self) -> Vec<StateDescriptor> {
        self.inner.states()
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        self.inner.sinks()
    }

    fn decode(&self, record: &SourceRecord) -> Result<O::Input, InvalidInput> {
        self.inner.decode(record)
    }

    fn key(&self, input: &O::Input) -> String {
        self.inner.key(input)
    }

    fn process(&self, ctx: &mut Ctx<'_>, input: O::Input) -> Result<(), ProcessError> {
        if self.panic_on == Some(ctx.key()) {
            panic!("a bug met key {}", ctx.key());
        }
        if let Some((clock, millis)) = &self.slow {
            clock.advance(*millis);
        }
        self.inner.process(ctx, input)
    }

    fn on_timer(&self, ctx: &mut Ctx<'_>, at_millis: i64) -> Result<(), ProcessError> {
        self.inner.on_timer(ctx, at_millis)
    }

    fn delivery(&self) -> Delivery {
        self.delivery.unwrap_or(self.inner.delivery())
    }

    fn state_ttl(&self) -> Option<Duration> {
        self.ttl.or(self.inner.state_ttl())
    }
}

/// Counts DynamoDB stream changes per `group` attribute of the item: a key fed by many items.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupCounter;

/// The changes counted for a group.
pub(crate) const GROUP_COUNT: ValueState<u64> = ValueState::new("count");

impl KeyedOperator for GroupCounter {
    type Input = String;

    fn name(&self) -> &str {
        "group-counter"
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![GROUP_COUNT.descriptor()]
    }

    fn decode(&self, record: &SourceRecord) -> Result<String, InvalidInput> {
        let Payload::Change(change) = &record.payload else {
            return Err(InvalidInput::new("record", "expected a DynamoDB change"));
        };
        change
            .new_image
            .as_ref()
            .or(change.old_image.as_ref())
            .and_then(|image| image.get("group"))
            .and_then(|g| g.as_s())
            .map(str::to_owned)
            .ok_or_else(|| InvalidInput::new("dynamodb.NewImage.group", "missing"))
    }

    fn key(&self, group: &String) -> String {
        group.clone()
    }

    fn process(&self, ctx: &mut Ctx<'_>, _: String) -> Result<(), ProcessError> {
        let mut count = ctx.value(&GROUP_COUNT)?;
        let next = count.get().copied().unwrap_or(0) + 1;
        count.set(next);
        Ok(())
    }
}

/// Stores each record's text as the key's value, whatever its size.
#[derive(Clone, Copy, Debug, Default)]
pub struct Keeper;

/// The text of the key's latest record.
pub(crate) const KEPT: ValueState<String> = ValueState::new("kept");

impl KeyedOperator for Keeper {
    type Input = String;

    fn name(&self) -> &str {
        "keeper"
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![KEPT.descriptor()]
    }

    fn decode(&self, record: &SourceRecord) -> Result<String, InvalidInput> {
        Buffer.decode(record)
    }

    fn key(&self, _: &String) -> String {
        "the-key".into()
    }

    fn process(&self, ctx: &mut Ctx<'_>, input: String) -> Result<(), ProcessError> {
        ctx.value(&KEPT)?.set(input);
        Ok(())
    }
}

/// Keeps every click of a key, in order: a list that soon outgrows its head, so that commits
/// write segments (and a crash can come between them and the head).
#[derive(Clone, Copy, Debug, Default)]
pub struct History;

/// Every click of the key, in order: its sequence number padded to about a kilobyte.
pub const CLICKS: ListState<String> = ListState::new("clicks");

impl KeyedOperator for History {
    type Input = keyed_counter::CountEvent;

    fn name(&self) -> &str {
        "history"
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![CLICKS.descriptor()]
    }

    fn decode(&self, record: &SourceRecord) -> Result<Self::Input, InvalidInput> {
        keyed_counter::KeyedCounter.decode(record)
    }

    fn key(&self, input: &Self::Input) -> String {
        input.key.clone()
    }

    fn process(&self, ctx: &mut Ctx<'_>, _: Self::Input) -> Result<(), ProcessError> {
        // A kilobyte a click: a few dozen clicks outgrow the head.
        let entry = format!("{}:{}", ctx.record().sequence, "h".repeat(960));
        ctx.list(&CLICKS)?.push(entry);
        Ok(())
    }
}

/// Idle sessions: counts each user's visits, and once a user has made none for `IDLE_MILLIS`
/// emits a notice with the session's visits and starts over. One timer per session, not per
/// visit: when it fires for a user seen since, it is set again for the new idle time.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdleSessions;

/// How long a user goes without a visit before the session is idle: five minutes.
pub const IDLE_MILLIS: i64 = 5 * 60_000;
/// The visits of the user's current session.
pub(crate) const SESSION_VISITS: ValueState<u64> = ValueState::new("visits");
/// When the user last visited, in epoch milliseconds.
pub(crate) const LAST_SEEN: ValueState<i64> = ValueState::new("last_seen");
/// Where the notices of idle sessions go.
pub const NOTICES: Sink<IdleNotice> = Sink::new("notices");

/// A visit of a user.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Visit {
    /// The user visiting: the key.
    pub user: String,
}

/// The notice of a session gone idle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdleNotice {
    /// The user whose session it was.
    pub user: String,
    /// The session's visits.
    pub visits: u64,
    /// When the session's last visit was, in epoch milliseconds.
    pub last_seen: i64,
    /// When the notice was made: within a minute of `last_seen + IDLE_MILLIS`.
    pub noticed_at: i64,
}

impl KeyedOperator for IdleSessions {
    type Input = Visit;

    fn name(&self) -> &str {
        "idle-sessions"
    }

    fn states(&self) -> Vec<StateDescriptor> {
        vec![
            SESSION_VISITS.descriptor(),
            LAST_SEEN.descriptor(),
            keyway::operator::timers(),
        ]
    }

    fn sinks(&self) -> Vec<SinkDescriptor> {
        vec![NOTICES.descriptor()]
    }

    fn decode(&self, record: &SourceRecord) -> Result<Visit, InvalidInput> {
        record.json()
    }

    fn key(&self, visit: &Visit) -> String {
        visit.user.clone()
    }

    fn process(&self, ctx: &mut Ctx<'_>, _visit: Visit) -> Result<(), ProcessError> {
        let now = ctx.now_millis();
        *ctx.value(&SESSION_VISITS)?.get_or_insert_with(|| 0) += 1;
        ctx.value(&LAST_SEEN)?.set(now);
        if ctx.pending_timers()?.is_empty() {
            ctx.timer_at(now + IDLE_MILLIS)?;
        }
        Ok(())
    }

    fn on_timer(&self, ctx: &mut Ctx<'_>, at_millis: i64) -> Result<(), ProcessError> {
        let last_seen = ctx.value(&LAST_SEEN)?.get().copied().unwrap_or(0);
        if last_seen + IDLE_MILLIS > at_millis {
            // Seen since the timer was set: idle only later.
            return ctx.timer_at(last_seen + IDLE_MILLIS);
        }
        let visits = ctx.value(&SESSION_VISITS)?.take().unwrap_or(0);
        ctx.value(&LAST_SEEN)?.clear();
        let notice = IdleNotice {
            user: ctx.key().to_owned(),
            visits,
            last_seen,
            noticed_at: ctx.now_millis(),
        };
        ctx.emit(&NOTICES, notice.user.clone(), &notice)
    }
}
