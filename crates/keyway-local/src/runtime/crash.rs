//! A state store that dies between emitting and committing: the crash a fault plan injects.

use std::sync::Arc;

use async_trait::async_trait;

use crate::services::faults::{crash, Fault, FaultPlan, Faults};
use keyway::domain::KeyState;
use keyway::ports::{
    Commit, Committed, KeyPage, LoadKey, Namespace, StateStore, StoreError, StoreLimits, TimerIndex,
};

/// A state store whose process may die between emitting and committing: the commit never
/// happens, and the invocation crashes (`services::faults::crash`).
pub struct CrashBeforeCommit {
    inner: Arc<dyn StateStore>,
    faults: Arc<Faults>,
}

impl CrashBeforeCommit {
    /// Crashes with the plan's `crash_before_commit` probability.
    pub fn new(inner: Arc<dyn StateStore>, faults: Arc<Faults>) -> Self {
        Self { inner, faults }
    }

    /// Crashes at every commit.
    pub fn always(inner: Arc<dyn StateStore>) -> Self {
        Self::new(
            inner,
            Arc::new(Faults::new(
                FaultPlan {
                    crash_before_commit: 1.0,
                    ..FaultPlan::default()
                },
                0,
            )),
        )
    }
}

#[async_trait]
impl StateStore for CrashBeforeCommit {
    async fn load_keys(
        &self,
        namespace: &Namespace,
        keys: &[LoadKey<'_>],
    ) -> Result<std::collections::HashMap<String, KeyState>, StoreError> {
        self.inner.load_keys(namespace, keys).await
    }

    async fn commit(
        &self,
        namespace: &Namespace,
        commits: Vec<Commit>,
    ) -> Vec<Result<Committed, StoreError>> {
        if self.faults.draw(Fault::CrashBeforeCommit) {
            crash();
        }
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

    async fn list_keys(
        &self,
        namespace: &Namespace,
        prefix: &str,
        cursor: Option<&str>,
    ) -> Result<KeyPage, StoreError> {
        self.inner.list_keys(namespace, prefix, cursor).await
    }

    fn limits(&self) -> StoreLimits {
        self.inner.limits()
    }
}
