//! Truncates. A truncate names a table and no row, and comes on one shard while the table's rows
//! change on others; it must remove exactly the rows changed before it in the source's log. The
//! re-key notes each table's last truncate as a fence (`rekey::TRUNCATED`, broadcast state every
//! batch reads) and then:
//!
//! - on a row's next change, retracts the row stored from before the fence first;
//! - retracts the row a change from before the fence (late, on a shard behind the truncate's)
//!   leaves, right after that change's steps;
//! - and this sweep, which the re-key's function runs on its schedule, retracts the rows no change
//!   touches again: it lists the table's rows in the re-key's state, publishes the delete of each
//!   one stored from before the fence to the changelog (the step the re-key would make, the same
//!   stamp, so the join applies it once whoever sends it, and never over a later change of the
//!   row), then removes it from the re-key's state, conditional on the version it read.
//!
//! A batch that loaded its broadcast state before the fence was written may still store a row
//! from before it, after the sweep went by. Such a batch ends within the function's timeout: a
//! second sweep, `settle` after the first, catches what it left. Each sweep's progress is kept
//! in the re-key's state under `PROGRESS_KEY`, written only here; a sweep that the invocation's
//! deadline stops (a scan reads the whole state table) goes on from there at the next one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keyway::domain::debezium::Position;
use keyway::domain::hash::xxh3_128_hex;
use keyway::domain::{KeyState, Output, OutputId, SlotData};
use keyway::lambda::{is_scheduled, FunctionError, Handler, Invocation, Response, StreamHandler};
use keyway::operator::BROADCAST_KEY;
use keyway::ports::{Clock, Commit, Deadline, Namespace, Sink, SinkError, StateStore, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::rekey::{Rekey, Step, Stored, CHANGELOG, ROW, TRUNCATED};

/// The key of the sweeps' progress in the re-key's state: no row's key starts with `$`.
pub const PROGRESS_KEY: &str = "$truncate-sweeps";
/// Rows loaded at once: one BatchGetItem.
const LOAD_CHUNK: usize = 100;
/// Reads of a row that keeps changing under the sweep before it gives up until its next run.
const ATTEMPTS: usize = 5;

/// Each table's last truncate, by its name in the join (`rekey::TRUNCATED`).
type Fences = BTreeMap<String, Position>;

/// Whether `key` of the re-key's state is a row of `table`: the table's name, `#`, and the row's
/// primary key as one JSON value (`rekey::primary_key`), which no more `#…` follows.
fn is_row_of(table: &str, key: &str) -> bool {
    key.strip_prefix(table)
        .and_then(|rest| rest.strip_prefix('#'))
        .is_some_and(|pk| serde_json::from_str::<serde::de::IgnoredAny>(pk).is_ok())
}

/// How far the sweeps of one table's last truncate went.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The truncate swept for.
    pub at: Position,
    /// Sweeps done: 1 after the first, 2 once the settling one went by.
    pub sweeps: u8,
    /// When the first one ended (epoch milliseconds).
    pub first_millis: i64,
    /// Where the sweep under way stopped when its invocation ran out of time: the next one goes
    /// on from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

impl Progress {
    /// Whether a sweep is due at `now`: the first, one under way, or the settling one.
    fn due(&self, now: i64, settle: Duration) -> bool {
        match self.sweeps {
            0 => true,
            1 => self.cursor.is_some() || now >= self.first_millis + settle.as_millis() as i64,
            _ => false,
        }
    }
}

/// What one run of the sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Tables whose sweep this run finished.
    pub tables: usize,
    /// Rows the re-key held from before their table's truncate, retracted and removed.
    pub rows: usize,
    /// Whether the run stopped for its deadline, a sweep under way.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unfinished: bool,
}

/// How long before its deadline an invocation stops sweeping: a page of rows and the progress's
/// commit still fit.
const DEADLINE_MARGIN_MILLIS: i64 = 5_000;

/// A sweep that could not finish: the next one goes on from its start; what it did stays done.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The re-key's state could not be read or written.
    #[error("the state table: {0}")]
    Store(#[from] StoreError),
    /// A retraction could not be published to the changelog.
    #[error("the changelog: {0}")]
    Sink(SinkError),
    /// A value stored in the re-key's state could not be read back.
    #[error("a stored row of {key:?} does not decode: {problem}")]
    Decode {
        /// The state key whose value does not decode.
        key: String,
        /// The slot, and what is wrong with its value.
        problem: String,
    },
}

/// The sweep of truncated tables' rows.
pub struct Sweeper {
    /// The re-key whose rows are swept: it makes each retraction as it would itself.
    pub rekey: Rekey,
    /// The state table the re-key's state is kept in.
    pub store: Arc<dyn StateStore>,
    /// The re-key's state: its operator's name and state signature.
    pub namespace: Namespace,
    /// Where the re-key publishes its steps.
    pub changelog: Arc<dyn Sink>,
    /// Tells the time: whether a sweep is due, and how near the invocation's deadline is.
    pub clock: Arc<dyn Clock>,
    /// How long after its first sweep a truncate is swept again: longer than a re-key batch can
    /// run (the function's timeout).
    pub settle: Duration,
    /// The re-key's redelivery window: a removed row keeps its watermarks as long.
    pub redelivery_window: Duration,
}

impl Sweeper {
    /// Sweeps each table whose truncate has a sweep due, and notes how far it went; stops short
    /// of `deadline_millis` (the invocation's), to go on next time.
    pub async fn sweep(&self, deadline_millis: Option<i64>) -> Result<SweepReport, SweepError> {
        let (fences, before, mut state) = self.load_progress().await?;
        let mut progress = before.clone();
        let mut report = SweepReport::default();
        for (table, at) in &fences {
            let mut swept = match progress.get(table) {
                Some(p) if p.at == *at => p.clone(),
                // A first truncate of the table, or a later one: its sweeps start over.
                _ => Progress {
                    at: at.clone(),
                    sweeps: 0,
                    first_millis: 0,
                    cursor: None,
                },
            };
            if !swept.due(self.clock.now_millis(), self.settle) {
                continue;
            }
            let (rows, cursor) = self
                .sweep_table(table, at, swept.cursor.take(), deadline_millis)
                .await?;
            report.rows += rows;
            swept.cursor = cursor;
            if swept.cursor.is_none() {
                swept.sweeps += 1;
                swept.first_millis = if swept.sweeps == 1 {
                    self.clock.now_millis()
                } else {
                    swept.first_millis
                };
                report.tables += 1;
            }
            report.unfinished = swept.cursor.is_some();
            progress.insert(table.clone(), swept);
            if report.unfinished {
                break;
            }
        }
        if progress != before {
            let entry = serde_json::to_string(&progress).expect("progress serializes");
            let raw = RawValue::from_string(entry).expect("JSON text");
            state
                .slots
                .insert(PROGRESS.into(), SlotData::fresh(vec![raw]));
            self.commit(PROGRESS_KEY, state).await?;
        }
        Ok(report)
    }

    /// Whether both sweeps of each table's last truncate are done.
    pub async fn all_swept(&self) -> Result<bool, SweepError> {
        let (fences, progress, _) = self.load_progress().await?;
        Ok(fences.iter().all(|(table, at)| {
            progress
                .get(table)
                .is_some_and(|p| p.at == *at && p.sweeps >= 2)
        }))
    }

    /// Each table's last truncate, the sweeps' progress, and the state that holds it.
    async fn load_progress(
        &self,
    ) -> Result<(Fences, BTreeMap<String, Progress>, KeyState), SweepError> {
        let keys = [BROADCAST_KEY.to_owned(), PROGRESS_KEY.to_owned()];
        let mut loaded = self.store.load(&self.namespace, &keys).await?;
        let fences: Fences =
            decode_slot(loaded.remove(BROADCAST_KEY), TRUNCATED.name, BROADCAST_KEY)?
                .unwrap_or_default();
        let state = loaded.remove(PROGRESS_KEY).unwrap_or_default();
        let progress =
            decode_slot(Some(state.clone()), PROGRESS, PROGRESS_KEY)?.unwrap_or_default();
        Ok((fences, progress, state))
    }

    /// Retracts and removes the rows of `table` the re-key holds from before the truncate at
    /// `at`, from `cursor` on; how many, and where it stopped when `deadline_millis` came near.
    async fn sweep_table(
        &self,
        table: &str,
        at: &Position,
        mut cursor: Option<String>,
        deadline_millis: Option<i64>,
    ) -> Result<(usize, Option<String>), SweepError> {
        let prefix = format!("{table}#");
        let mut removed = 0;
        loop {
            let page = self
                .store
                .list_keys(&self.namespace, &prefix, cursor.as_deref())
                .await?;
            // The prefix also lists the rows of a table whose name goes on past it (`a#b` for
            // `a`): a row's own key is its table's name and one JSON value, its primary key.
            let own: Vec<String> = page
                .keys
                .into_iter()
                .filter(|key| is_row_of(table, key))
                .collect();
            for chunk in own.chunks(LOAD_CHUNK) {
                removed += self.sweep_keys(table, at, chunk.to_vec()).await?;
            }
            let Some(next) = page.next else {
                return Ok((removed, None));
            };
            cursor = Some(next);
            let late = deadline_millis
                .is_some_and(|d| self.clock.now_millis() + DEADLINE_MARGIN_MILLIS >= d);
            if late {
                return Ok((removed, cursor));
            }
        }
    }

    /// Retracts and removes those of `keys` (rows of `table`) stored from before the truncate at
    /// `at`. A key whose removal finds it changed since it was read is read and decided again: a
    /// row the re-key changed meanwhile may be one it stored again from before the truncate.
    async fn sweep_keys(
        &self,
        table: &str,
        at: &Position,
        mut keys: Vec<String>,
    ) -> Result<usize, SweepError> {
        let side = self.rekey.spec.side(table);
        let mut removed = 0;
        for _ in 0..ATTEMPTS {
            if keys.is_empty() {
                return Ok(removed);
            }
            let mut states = self.store.load(&self.namespace, &keys).await?;
            let (mut outputs, mut gone) = (Vec::new(), Vec::new());
            // In the page's order, not the map's: the outputs' order and the commits' must not
            // vary from one process to the next (a chaos run's seed replays them).
            for key in keys.drain(..) {
                let Some(state) = states.remove(&key) else {
                    continue;
                };
                let Some(stored) = decode_slot::<Stored>(Some(state.clone()), ROW.name, &key)?
                else {
                    continue;
                };
                if !stored.truncated_by(Some(at)) {
                    continue;
                }
                let pk = &key[table.len() + 1..];
                let step = side.and_then(|side| self.rekey.retraction(side, table, pk, &stored));
                outputs.extend(step.map(|step| retraction_output(&key, &stored, &step)));
                gone.push((key, state));
            }
            // The deletes go out before the rows go: a sweep that stops between the two sends
            // them again next time, which the join's stamps make harmless.
            if let Some((_, error)) = self
                .changelog
                .send(&outputs, Deadline::NONE)
                .await
                .into_iter()
                .next()
            {
                return Err(SweepError::Sink(error));
            }
            // The chunk's rows go in one commit call: a sweep of a large table makes few round
            // trips, and an invocation that dies part way loses at most one chunk's work.
            let commits = gone
                .into_iter()
                .map(|(key, mut state)| {
                    state.clear_slots();
                    self.commit_of(&key, state)
                })
                .collect::<Vec<_>>();
            let tried: Vec<String> = commits.iter().map(|c| c.key.clone()).collect();
            let results = self.store.commit(&self.namespace, commits).await;
            if results.len() != tried.len() {
                return Err(SweepError::Store(StoreError::Invalid(format!(
                    "{} results for {} commits",
                    results.len(),
                    tried.len()
                ))));
            }
            keys.clear();
            for (key, result) in tried.into_iter().zip(results) {
                match result {
                    Ok(_) => removed += 1,
                    Err(StoreError::Conflict) => keys.push(key),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Err(SweepError::Store(StoreError::Conflict))
    }

    fn commit_of(&self, key: &str, state: KeyState) -> Commit {
        Commit {
            redelivery_window: self.redelivery_window,
            ..Commit::new(key, state.version, state)
        }
    }

    async fn commit(&self, key: &str, state: KeyState) -> Result<(), StoreError> {
        let commit = self.commit_of(key, state);
        let mut results = self.store.commit(&self.namespace, vec![commit]).await;
        results.remove(0).map(|_| ())
    }
}

/// The retraction `step` of the row `stored` under `key` as the changelog takes it: its id the
/// same whichever sweep sends it.
fn retraction_output(key: &str, stored: &Stored, step: &Step) -> Output {
    Output {
        id: OutputId(xxh3_128_hex(&[
            b"truncate",
            key.as_bytes(),
            stored.seq.as_bytes(),
        ])),
        sink: CHANGELOG.name.to_owned(),
        partition_key: step.group.clone(),
        body: serde_json::to_string(step).expect("a step serializes"),
        settled: false,
    }
}

/// The slot of the progress in `PROGRESS_KEY`'s state.
const PROGRESS: &str = "progress";

/// The value in slot `slot` of `state`, if any.
fn decode_slot<T: serde::de::DeserializeOwned>(
    state: Option<KeyState>,
    slot: &str,
    key: &str,
) -> Result<Option<T>, SweepError> {
    let Some(raw) = state
        .as_ref()
        .and_then(|s| s.slots.get(slot))
        .and_then(|s| s.entries.first())
    else {
        return Ok(None);
    };
    serde_json::from_str(raw.get())
        .map(Some)
        .map_err(|e| SweepError::Decode {
            key: key.to_owned(),
            problem: format!("{slot}: {e}"),
        })
}

/// The re-key's function: stream batches through the re-key, its schedule through the sweep.
pub struct RekeyHandler {
    /// The re-key, over the function's stream batches.
    pub stream: StreamHandler<Rekey>,
    /// The truncate sweep, run on the function's schedule.
    pub sweeper: Sweeper,
}

#[async_trait]
impl Handler for RekeyHandler {
    async fn handle(
        &self,
        event: &str,
        invocation: &Invocation,
    ) -> Result<Response, FunctionError> {
        let scheduled = serde_json::from_str::<Value>(event).is_ok_and(|e| is_scheduled(&e));
        if !scheduled {
            return self.stream.handle(event, invocation).await;
        }
        let report = self
            .sweeper
            .sweep(invocation.deadline_millis)
            .await
            .map_err(|e| FunctionError::Failed(format!("the truncate sweep failed: {e}")))?;
        Ok(Response::Json(
            serde_json::to_value(report).expect("a report serializes"),
        ))
    }
}
