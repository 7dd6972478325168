//! The ports the runtime depends on: keyed state, sinks and time. Narrow, async, `Send + Sync`.
//!
//! Every port has an in-memory implementation (the embedded runtime's, in the `keyway-local`
//! crate, and `adapters::dynamodb::MemoryTable` here) that passes the same contract suite
//! (`keyway_local::testing`) as its AWS implementation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use thiserror::Error;

use crate::domain::{Dictionary, KeyState, Origin, Output, StoreMemo};

/// A state store failure. `is_retryable` says whether the same request may succeed later.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum StoreError {
    /// The table refused the request for its rate: the same request may go through after a
    /// backoff.
    #[error("throttled by the state table: {0}")]
    Throttled(String),
    /// The table could not answer now (a timeout, a lost connection, a 5xx): the same request
    /// may succeed later.
    #[error("state table unavailable: {0}")]
    Unavailable(String),
    /// The key's version changed since it was read: another invocation committed first.
    #[error("conditional write failed: the key was changed by another writer since it was read")]
    Conflict,
    /// The request itself is wrong (an item too large, an unknown table, an operation the store
    /// cannot do): no retry helps.
    #[error("state request rejected: {0}")]
    Invalid(String),
    /// An item the key's state is stored in does not parse (or one it names is missing): no
    /// retry reads it, and the key waits until the item is repaired; other keys go on.
    #[error("stored state does not parse: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Whether the same request may succeed later: after throttling or a transient failure.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Throttled(_) | StoreError::Unavailable(_))
    }
}

/// A sink failure for one message.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum SinkError {
    /// The service refused the message for the caller's rate: resend it after a backoff.
    #[error("throttled by the sink: {0}")]
    Throttled(String),
    /// The service could not take the message now (a timeout, a 5xx, a KMS key being fixed):
    /// resend it later.
    #[error("sink unavailable: {0}")]
    Unavailable(String),
    /// The service refused the message itself (too large, invalid characters): resending it as is
    /// will never succeed.
    #[error("message rejected by the sink: {0}")]
    Rejected(String),
    /// The invocation's time to send ran out (`Deadline`): the message was not sent, or its call
    /// was given up unanswered and it may have gone out. Either way it goes again, under its id,
    /// with its record's retry. (A message whose call went out but was not retried for want of
    /// time keeps the error of its last try.)
    #[error("not sent, or not known to be: the invocation's time to send ran out ({0})")]
    OutOfTime(String),
}

impl SinkError {
    /// Whether resending the message as is may succeed: every failure but `Rejected`.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, SinkError::Rejected(_))
    }
}

/// When a sink stops calling: the invocation's deadline, less the time kept for what comes after
/// sending (the commit). A sink makes the first call of a `send` whatever the time, so that every
/// invocation gets something through; it starts no later call, and no retry, that would begin
/// past the deadline. Read on tokio's clock, which tests pause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deadline(Option<tokio::time::Instant>);

impl Deadline {
    /// No deadline: calls and retries go on until the sink's own attempts run out.
    pub const NONE: Deadline = Deadline(None);

    /// The deadline `remaining` from now.
    pub fn after(remaining: Duration) -> Self {
        Deadline(Some(tokio::time::Instant::now() + remaining))
    }

    /// Whether there is one.
    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Whether something that starts `wait` from now starts before the deadline.
    pub fn allows(&self, wait: Duration) -> bool {
        self.0
            .is_none_or(|at| tokio::time::Instant::now() + wait < at)
    }

    /// Whether the deadline has come.
    pub fn passed(&self) -> bool {
        !self.allows(Duration::ZERO)
    }
}

/// Where an operator's state lives: its name and the signature of its state structure. State
/// written under another signature is never read under this one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Namespace {
    /// The operator's name.
    pub operator: String,
    /// The signature of the operator's state structure.
    pub signature: String,
    /// The preset dictionaries the operator's state is deflated with, newest first: a store
    /// writes with the first and reads with any (`KeyedOperator::state_dictionaries`).
    pub dictionaries: Arc<[Dictionary]>,
}

impl Namespace {
    /// The state of `operator` under `signature`, deflated without a dictionary.
    pub fn new(operator: impl Into<String>, signature: impl Into<String>) -> Self {
        Self {
            operator: operator.into(),
            signature: signature.into(),
            dictionaries: Arc::new([]),
        }
    }

    /// The same namespace, its state deflated with `dictionaries` (newest first).
    pub fn with_dictionaries(mut self, dictionaries: impl IntoIterator<Item = Dictionary>) -> Self {
        self.dictionaries = dictionaries.into_iter().collect();
        self
    }
}

/// A key to load, with the lineages its records in the batch come from: a store that keeps some
/// watermarks apart from the key's other state reads the ones the batch needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadKey<'a> {
    /// The key to load.
    pub key: &'a str,
    /// The lineages of the key's records in the batch; none for a look-up outside a batch.
    pub lineages: Vec<&'a Origin>,
}

impl<'a> From<&'a str> for LoadKey<'a> {
    fn from(key: &'a str) -> Self {
        Self {
            key,
            lineages: Vec::new(),
        }
    }
}

/// One key's new state, to be written only if the key is still at `expected_version`.
#[derive(Clone, Debug)]
pub struct Commit {
    /// The key to write.
    pub key: String,
    /// The version the key was read at: the write lands only if the key is still at it.
    pub expected_version: u64,
    /// The key's whole new state.
    pub state: KeyState,
    /// How long after a record's arrival its source may still redeliver it: the watermarks must
    /// outlive that, whatever the state's own TTL.
    pub redelivery_window: Duration,
}

impl Commit {
    /// A commit whose watermarks are kept for `DEFAULT_REDELIVERY_WINDOW`.
    pub fn new(key: impl Into<String>, expected_version: u64, state: KeyState) -> Self {
        Self {
            key: key.into(),
            expected_version,
            state,
            redelivery_window: DEFAULT_REDELIVERY_WINDOW,
        }
    }
}

/// The longest any source keyway reads can redeliver a record: a Kinesis stream keeps records up
/// to 365 days; a day more covers a retention raised while records were in flight.
pub const DEFAULT_REDELIVERY_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// A key's timer, as the due-time index holds it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimerEntry {
    /// When the timer is due, epoch milliseconds.
    pub at_millis: i64,
    /// The key the timer belongs to.
    pub key: String,
}

/// An index entry come due, with what the store needs to remove or postpone it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueTimer {
    /// The timer the entry stands for.
    pub timer: TimerEntry,
    /// The store's own reference to the entry.
    pub handle: String,
}

/// A commit that landed: the version it wrote, and the store's notes to touch it again.
#[derive(Clone, Debug)]
pub struct Committed {
    /// The key committed.
    pub key: String,
    /// The version the commit wrote.
    pub version: u64,
    /// The store's notes on what it wrote, which `clear_outbox` reads back.
    pub memo: StoreMemo,
}

/// Keyed state with optimistic concurrency.
#[async_trait]
pub trait StateStore: Send + Sync {
    /// Loads every key with strongly consistent reads; a key with nothing stored comes back empty.
    /// A key whose TTL has passed comes back with empty slots, and keeps its version (so a commit
    /// can replace it), its watermarks and its outbox.
    async fn load_keys(
        &self,
        namespace: &Namespace,
        keys: &[LoadKey<'_>],
    ) -> Result<HashMap<String, KeyState>, StoreError>;

    /// `load_keys` for keys whose lineages do not matter (tools, tests, migrations' look-ups of
    /// state that is not written back as loaded).
    async fn load(
        &self,
        namespace: &Namespace,
        keys: &[String],
    ) -> Result<HashMap<String, KeyState>, StoreError> {
        let keys: Vec<LoadKey> = keys.iter().map(|k| LoadKey::from(k.as_str())).collect();
        self.load_keys(namespace, &keys).await
    }

    /// Writes each key's state if its version is still the one read; one result per commit, in
    /// order. A key that another writer changed fails with `StoreError::Conflict` and is unchanged.
    /// A write whose response was lost is found to have landed, never reported as a conflict.
    async fn commit(
        &self,
        namespace: &Namespace,
        commits: Vec<Commit>,
    ) -> Vec<Result<Committed, StoreError>>;

    /// Empties the outbox of keys just committed, once their outputs went out, unless a key
    /// changed since (whoever changed it saw the outbox and took care of it). One result per key.
    async fn clear_outbox(
        &self,
        namespace: &Namespace,
        committed: Vec<Committed>,
    ) -> Vec<Result<(), StoreError>>;

    /// The due-time index of the keys' timers, kept beside their state.
    fn timers(&self) -> &dyn TimerIndex;

    /// A page of the keys of `namespace` that start with `prefix` and have state stored, going
    /// on from `cursor` (a page's `next`). For sweeps that must reach keys no record names (a
    /// truncated table's rows): it scans the whole store, so never on a batch's path. A page may
    /// hold no key and still have a next one. A store that cannot list its keys says so.
    async fn list_keys(
        &self,
        namespace: &Namespace,
        prefix: &str,
        cursor: Option<&str>,
    ) -> Result<KeyPage, StoreError> {
        let _ = (namespace, prefix, cursor);
        Err(StoreError::Invalid(
            "this state store cannot list its keys".into(),
        ))
    }

    /// What the store can hold: state beyond these limits could never be committed, so the
    /// executor dead-letters the record that would need it rather than retry it forever.
    fn limits(&self) -> StoreLimits {
        StoreLimits::default()
    }
}

/// The due-time index of keyed timers (see `operator::timers`): which key has a timer at which
/// time, to find those due without reading every key. A store may keep several timers in one
/// entry (those one write sets for one time): a sweep gets such an entry whole, and must then
/// forget or postpone every timer it got, postponing first, since forgetting one removes its
/// entry's others.
#[async_trait]
pub trait TimerIndex: Send + Sync {
    /// Writes the due-time index entries of timers that commits of `operator`'s keys are about
    /// to set, before those commits (see `operator::timers`), at `now_millis` by the writer's
    /// clock. Writing an entry again does no harm.
    async fn schedule_timers(
        &self,
        operator: &str,
        timers: &[TimerEntry],
        now_millis: i64,
    ) -> Result<(), StoreError>;

    /// The timers of `operator` due at `now_millis`, earliest first: up to `limit`, or a few
    /// more when the last entry taken holds more (an entry comes whole).
    async fn due_timers(
        &self,
        operator: &str,
        now_millis: i64,
        limit: usize,
    ) -> Result<Vec<DueTimer>, StoreError>;

    /// Removes the index entries of timers that fired, or were found no longer pending, with
    /// every other timer those entries hold.
    async fn forget_timers(&self, operator: &str, due: &[DueTimer]) -> Result<(), StoreError>;

    /// Makes timers a sweep could not settle come due again at `until_millis`, behind the
    /// entries due before then: a timer that keeps failing never holds back the others. Their
    /// old entries are removed, with every other timer they hold.
    async fn postpone_timers(
        &self,
        operator: &str,
        due: &[DueTimer],
        until_millis: i64,
    ) -> Result<(), StoreError>;
}

/// A page of keys (`StateStore::list_keys`), and where the next page starts: none at the end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyPage {
    /// The page's keys: possibly none, even when a next page follows.
    pub keys: Vec<String>,
    /// Where the next page starts (the `cursor` to pass on); none at the end.
    pub next: Option<String>,
}

/// The limits of a state store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// The largest state entry (one value, list element or map entry), or outbox output as JSON.
    pub max_entry_bytes: usize,
    /// The most lineages one commit of a key may advance.
    pub lineages_per_commit: usize,
}

impl Default for StoreLimits {
    fn default() -> Self {
        Self {
            max_entry_bytes: usize::MAX,
            lineages_per_commit: usize::MAX,
        }
    }
}

/// A destination for outputs.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Sends the messages, retrying what the service lets us retry, until `deadline` (its first
    /// call whatever the time). Returns the messages that could still not be sent (by index into
    /// `messages`) with the reason; empty means all sent. A sink whose calls go one after another
    /// sends a later message only once the earlier ones went or failed. The executor drops a
    /// send that has not answered near the invocation's end and sends its messages again later:
    /// dropping the future at any await must leave nothing half done that a resend cannot mend.
    async fn send(&self, messages: &[Output], deadline: Deadline) -> Vec<(usize, SinkError)>;

    /// The largest message body the sink accepts.
    fn max_message_bytes(&self) -> usize;

    /// Whether the sink keeps the order of a partition key's messages (a FIFO queue, a Kinesis
    /// stream). The executor then sends a key's messages to one partition key one after another
    /// and stops the key at its first failure, so that nothing overtakes a message that has to
    /// be sent again.
    fn ordered(&self) -> bool {
        true
    }

    /// For an ordered sink, whether the messages to `partition_key` keep their order: a sink
    /// that sends each message on to one of several destinations may keep it for some only
    /// (the filter's FIFO queues among standard ones). The executor sends the messages to one
    /// that keeps none all at once, as to a sink without order.
    fn keeps_order_of(&self, partition_key: &str) -> bool {
        let _ = partition_key;
        true
    }

    /// What an ordered sink keeps order by for an output's partition key: the key it sends
    /// (a stream's partition key, a FIFO queue's message group), which a sink may derive from a
    /// partition key it cannot take as it is.
    fn order_of<'a>(&self, partition_key: &'a str) -> std::borrow::Cow<'a, str> {
        std::borrow::Cow::Borrowed(partition_key)
    }
}

/// Where metric lines (CloudWatch Embedded Metric Format, `domain::metrics`) go: on Lambda the
/// function's log, which CloudWatch reads them from.
pub trait MetricLog: Send + Sync {
    /// Writes one metric line.
    fn write(&self, line: String);
}

/// Metric lines to standard output, the log of a Lambda function.
#[derive(Clone, Copy, Debug, Default)]
pub struct StdoutMetrics;

impl MetricLog for StdoutMetrics {
    fn write(&self, line: String) {
        println!("{line}");
    }
}

/// Metric lines kept in memory, for the embedded runtime and tests to read.
#[derive(Debug, Default)]
pub struct MemoryMetrics(std::sync::Mutex<Vec<String>>);

impl MemoryMetrics {
    /// The lines written since the last call.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().expect("metrics lock"))
    }
}

impl MetricLog for MemoryMetrics {
    fn write(&self, line: String) {
        self.0.lock().expect("metrics lock").push(line);
    }
}

/// Where each batch's heavy keys go to be judged hot or cool across the whole stream: the
/// adaptive hot-key registry (`adapters::dynamodb::HotKeyRegistry`), which producers read to
/// salt the keys it names. A report that fails costs the registry one batch's view of the stream,
/// never a record: the executor logs it and goes on.
#[async_trait]
pub trait HotKeyReports: Send + Sync {
    /// Adds one batch's report to the registry; a retried batch's report replaces the one it
    /// made before.
    async fn report(&self, report: &crate::domain::skew::HeatReport) -> Result<(), StoreError>;

    /// The smallest share of a batch a key needs to be worth reporting (`HeatReport::new`).
    fn floor_share(&self) -> f64;
}

/// Wall-clock time. The runtime reads time only through this, so tests can control it.
pub trait Clock: Send + Sync {
    /// The time now, epoch milliseconds.
    fn now_millis(&self) -> i64;
}

/// The system's wall clock, the one the runtime reads on Lambda.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> i64 {
        chrono::Utc::now().timestamp_millis()
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock standing at `millis` (epoch milliseconds), to share.
    pub fn at(millis: i64) -> Arc<Self> {
        Arc::new(Self(AtomicI64::new(millis)))
    }

    /// Moves the clock `millis` milliseconds forward.
    pub fn advance(&self, millis: i64) {
        self.0.fetch_add(millis, Ordering::SeqCst);
    }

    /// Sets the clock to `millis` (epoch milliseconds), backwards too.
    pub fn set(&self, millis: i64) {
        self.0.store(millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}
