//! The ports the runtime depends on: keyed state, sinks and time. Narrow, async, `Send + Sync`.
//!
//! Every port has an in-memory implementation in `local` that passes the same contract
//! suite (`testing`) as its AWS implementation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use thiserror::Error;

use crate::domain::{KeyState, Output};

/// A state store failure. `is_retryable` says whether the same request may succeed later.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum StoreError {
    #[error("throttled by the state table: {0}")]
    Throttled(String),
    #[error("state table unavailable: {0}")]
    Unavailable(String),
    /// The key's version changed since it was read: another invocation committed first.
    #[error("conditional write failed: the key was changed by another writer since it was read")]
    Conflict,
    #[error("state request rejected: {0}")]
    Invalid(String),
}

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Throttled(_) | StoreError::Unavailable(_))
    }
}

/// A sink failure for one message.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum SinkError {
    #[error("throttled by the sink: {0}")]
    Throttled(String),
    #[error("sink unavailable: {0}")]
    Unavailable(String),
    /// The service refused the message itself (too large, invalid characters): resending it as is
    /// will never succeed.
    #[error("message rejected by the sink: {0}")]
    Rejected(String),
}

impl SinkError {
    pub fn is_retryable(&self) -> bool {
        !matches!(self, SinkError::Rejected(_))
    }
}

/// Where an operator's state lives: its name and the signature of its state structure. State
/// written under another signature is never read under this one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Namespace {
    pub operator: String,
    pub signature: String,
}

/// One key's new state, to be written only if the key is still at `expected_version`.
#[derive(Clone, Debug)]
pub struct Commit {
    pub key: String,
    pub expected_version: u64,
    pub state: KeyState,
}

/// Keyed state with optimistic concurrency.
#[async_trait]
pub trait StateStore: Send + Sync {
    /// Loads every key with strongly consistent reads; a key with nothing stored, or whose TTL has
    /// passed, comes back empty (an expired key keeps its version so a commit can replace it).
    async fn load(
        &self,
        namespace: &Namespace,
        keys: &[String],
    ) -> Result<HashMap<String, KeyState>, StoreError>;

    /// Writes each key's state if its version is still the one read; one result per commit, in
    /// order. A key that another writer changed fails with `StoreError::Conflict` and is unchanged.
    async fn commit(
        &self,
        namespace: &Namespace,
        commits: Vec<Commit>,
    ) -> Vec<Result<(), StoreError>>;
}

/// A destination for outputs.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Sends the messages, retrying what the service lets us retry. Returns the messages that
    /// could still not be sent (by index into `messages`) with the reason; empty means all sent.
    async fn send(&self, messages: &[Output]) -> Vec<(usize, SinkError)>;

    /// The largest message body the sink accepts.
    fn max_message_bytes(&self) -> usize;
}

/// Wall-clock time. The runtime reads time only through this, so tests can control it.
pub trait Clock: Send + Sync {
    fn now_millis(&self) -> i64;
}

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
    pub fn at(millis: i64) -> Arc<Self> {
        Arc::new(Self(AtomicI64::new(millis)))
    }

    pub fn advance(&self, millis: i64) {
        self.0.fetch_add(millis, Ordering::SeqCst);
    }

    pub fn set(&self, millis: i64) {
        self.0.store(millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}
